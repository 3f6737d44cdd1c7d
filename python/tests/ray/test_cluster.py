"""palisade.ray on a real local Ray cluster (conftest.py): every run is a real sandbox made by
the node's own ``palisade serve``; nothing of palisade or of Ray is mocked."""

import os
import signal
import stat
import tempfile
import threading
import time
from collections import Counter

import pytest
import ray

import palisade.ray as pr
from conftest import SERVER_POLICY, add_node

CONCURRENCY = 2
N_MIXED = 2000

EGRESS = ("import urllib.request\n"
          "try:\n"
          "    urllib.request.urlopen('http://denied.example/', timeout=5)\n"
          "    print('reached')\n"
          "except Exception as e:\n"
          "    print('refused', type(e).__name__)\n")
OOM = "x = bytearray(400 << 20)\nx[::4096] = b'x' * len(x[::4096])\n"


def mixed(i):
    """Item ``i`` of the mixed batch and what its result must be."""
    k = i % 100
    if k < 3:
        return {"command": ["sleep", "30"], "limits": {"timeout_ms": 300}}, ("timeout", None, None)
    if k < 6:
        return ({"language": "python", "code": OOM, "limits": {"memory_bytes": 64 << 20}},
                ("oom", None, None))
    if k < 9:
        # Egress the node's proxy refuses: a name outside the allow list (never resolved).
        return ({"language": "python", "code": EGRESS, "allow_net": ["pypi.org"]},
                ("ok", 0, "refused "))
    if k < 11:
        # An allow rule above the node's ceiling: refused by the node before anything runs.
        return {"command": ["true"], "allow_net": ["example.com"]}, ("policy-denied", None, None)
    if k < 13:
        return {"command": ["sh", "-c", "kill -KILL $$"]}, ("signal", None, None)
    if k < 45:
        code = 1 + i % 120
        return {"command": ["sh", "-c", f"echo e{i}; exit {code}"]}, ("exit", code, f"e{i}\n")
    return {"command": ["sh", "-c", f"echo r{i}"]}, ("ok", 0, f"r{i}\n")


def check(r, want):
    status, code, out = want
    assert r.status == status, (r.index, r.response)
    if code is not None:
        assert r.exit_code == code, (r.index, r.response)
    if out is not None:
        if out.endswith(" "):
            assert r.stdout.startswith(out), (r.index, r.response)
        else:
            assert r.stdout == out, (r.index, r.response)
    if status == "ok" and out == "refused ":
        assert r.report["network"]["mode"] == "allow-list", r.report["network"]
        assert r.report["network"]["denied"] >= 1, r.report["network"]
    if status == "policy-denied":
        assert r.error["code"] == "not-allowed", r.error
        assert r.error["field"] == "allow_net[0]", r.error


@pytest.fixture(scope="module")
def pool(cluster):
    p = pr.NodePool(CONCURRENCY, server_policy=SERVER_POLICY)
    yield p
    p.shutdown()


def test_every_node_gets_an_actor_and_a_ready_server(pool):
    nodes = pool.nodes()
    assert len(nodes) == 3, nodes
    assert {n["state"] for n in nodes} == {"ready"}, nodes
    assert len({n["node_id"] for n in nodes}) == 3


def test_2000_mixed_runs_come_back_correct_and_in_order(pool):
    policy = pr.Policy(limits={"cpus": 1.0}, env={"BATCH": "mixed"})
    seen = []
    per_node = Counter()
    for r in pool.run_batch((mixed(i)[0] for i in range(N_MIXED)), policy=policy):
        assert r.index == len(seen), "out of order"
        check(r, mixed(r.index)[1])
        assert r.attempts == 1
        seen.append(r.index)
        per_node[r.node_id] += 1
    assert seen == list(range(N_MIXED))
    # Spread over all three nodes (each took a real share).
    assert len(per_node) == 3 and min(per_node.values()) > N_MIXED // 10, per_node


def test_the_policy_travels_with_each_run_and_the_node_enforces_it(pool):
    # The limit reaches the sandbox: its report says so, and the program is killed by it.
    r = pool.run({"command": ["sleep", "30"]}, policy={"limits": {"timeout_ms": 200}})
    assert r.status == "timeout" and r.report["limits"]["timeout_ms"] == 200, r.response
    # Above the node's ceiling: the node refuses it, naming the field.
    r = pool.run(["true"], policy={"limits": {"memory_bytes": 1 << 30}})
    assert r.status == "policy-denied" and r.error["field"] == "limits.memory_bytes", r.response
    # Variables arrive; nothing of the node's own environment does.
    r = pool.run(["sh", "-c", "echo $MODE; echo ${PALISADE_BIN:-unset}"], policy={"env": {"MODE": "m1"}})
    assert r.stdout == "m1\nunset\n", r.response
    # An item may not override what the policy sets.
    with pytest.raises(ValueError, match=r"items\[0\].limits.timeout_ms"):
        next(pool.run_batch([{"command": ["true"], "limits": {"timeout_ms": 5}}],
                            policy={"limits": {"timeout_ms": 100}}))
    with pytest.raises(ValueError, match=r"policy.limits.memory"):
        pr.Policy(limits={"memory": 5})


def test_results_as_they_finish(pool):
    items = [["sleep", "2"]] + [["sh", "-c", f"echo {i}"] for i in range(1, 12)]
    order = [r.index for r in pool.run_batch(items, ordered=False)]
    assert sorted(order) == list(range(12))
    # The slow first run finishes after the quick ones that were sent beside it.
    assert order[0] != 0 and order.index(0) > 0, order


def test_a_session_stays_on_its_node(pool):
    with pool.session(ttl_s=120) as s:
        s.write_file("data.txt", b"kept")
        for _ in range(4):
            st = s.exec(["sh", "-c", "cat data.txt; echo more >> log; wc -l < log"])
            assert st["exit_code"] == 0, st
        assert st["stdout"]["data"] == "kept4\n", st
        assert s.read_file("log") == b"more\n" * 4
        # It is on exactly one node: another node's server does not know it.
        other = next(n["node_id"] for n in pool.nodes() if n["node_id"] != s.node_id)
        out = ray.get(pool.actor(other).call.remote("GET", f"/v1/sandboxes/{s.id}"))
        assert out["status"] == 404, out
        out = ray.get(pool.actor(s.node_id).call.remote("GET", f"/v1/sandboxes/{s.id}"))
        assert out["status"] == 200, out


def _wrapper_without_user_namespaces(real: str) -> str:
    """A palisade binary for a node whose host has user namespaces off: the real binary, in a
    throwaway user namespace whose own ``user.max_user_namespaces`` is 0 (the machine's setting
    is untouched)."""
    d = tempfile.mkdtemp(prefix="prt-nouserns-")
    os.chmod(d, 0o755)
    w = os.path.join(d, "palisade")
    with open(w, "w") as f:
        f.write("#!/bin/sh\n"
                f"exec /usr/bin/unshare -Ur sh -c 'echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"' {real} \"$@\"\n")
    os.chmod(w, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return w


def test_a_node_that_cannot_enforce_the_policy_refuses_with_the_doctors_reason(cluster, pool):
    assert os.path.exists("/usr/bin/unshare"), "unshare (util-linux) is missing: run .ci/setup"
    wrapper = _wrapper_without_user_namespaces(os.environ["PALISADE_BIN"])
    bad = add_node(cluster, {"PALISADE_BIN": wrapper})
    try:
        p = pr.NodePool(CONCURRENCY, server_policy=SERVER_POLICY)
        try:
            states = {n["node_id"]: n for n in p.nodes()}
            refusing = [n for n in states.values() if n["state"] == "refusing"]
            assert len(refusing) == 1 and refusing[0]["node_id"] == bad.node_id, states
            reason = refusing[0]["reason"]
            # The doctor's own row and fix, from the real doctor on that node.
            assert "user-namespaces" in reason and "user.max_user_namespaces" in reason, reason
            assert "trial-run" in reason, reason
            # No server was started there; a batch runs on the other three only.
            results = list(p.run_batch([["sh", "-c", f"echo {i}"] for i in range(40)]))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(40)]
            assert bad.node_id not in {r.node_id for r in results}
            assert len({r.node_id for r in results}) == 3
            # Asked directly, the node refuses with the same reason.
            out = ray.get(p.actor(bad.node_id).run.remote({"command": ["true"]}))
            assert out["outcome"] == "retry" and out["reason"] == reason, out
            with pytest.raises(pr.NodeRefused, match="max_user_namespaces"):
                p.session(bad.node_id)
        finally:
            p.shutdown()
        # A pool on that node alone has no node to run on.
        p = pr.NodePool(CONCURRENCY, nodes=[bad.node_id])
        try:
            with pytest.raises(pr.NoNodeAvailable, match="max_user_namespaces"):
                list(p.run_batch([["true"]]))
        finally:
            p.shutdown()
    finally:
        cluster.remove_node(bad)


def _raylet(node):
    from ray._private import ray_constants
    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process


def _kill_mid_batch(cluster, idempotent):
    victim = add_node(cluster)
    p = pr.NodePool(CONCURRENCY, server_policy=SERVER_POLICY)
    server_pid = ray.get(p.actor(victim.node_id).info.remote())["server_pid"]
    n = 20
    # Every run lasts until 8 s after the batch starts, so the victim's runs are still running
    # when the cluster declares the node dead (a few seconds after its raylet dies: conftest's
    # health checks); runs started after that moment (the rest of the batch, and reruns) end at
    # once. (The wall clock: a sandbox's time namespace shifts only the monotonic clocks.)
    deadline = time.time() + 8
    wait = f"import time; time.sleep(max(0.0, {deadline!r} - time.time()))"
    items = [["python3", "-c", f"{wait}; print({i})"] for i in range(n)]
    # The victim's raylet, killed outright (as when its machine goes away), while the first runs
    # (two on each node) are running.
    killer = threading.Timer(1.5, lambda: _raylet(victim).send_signal(signal.SIGKILL))
    killer.start()
    try:
        results = list(p.run_batch(items, idempotent=idempotent))
    finally:
        killer.cancel()
        p.shutdown()
    # Exactly one result per item, in order.
    assert [r.index for r in results] == list(range(n))
    lost = [r for r in results if r.status == "lost"]
    for r in results:
        if r.status == "lost":
            # Never a program result: no exit code, no output; where it was.
            assert r.exit_code is None and r.stdout == "" and r.node_id == victim.node_id, r
            assert r.error["code"] == "node-lost", r.error
        else:
            assert r.status == "ok" and r.stdout == f"{r.index}\n", r
            assert r.node_id != victim.node_id, r
    # The victim's worker outlives its raylet, but its server does not: the actor stops it.
    for _ in range(600):
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the dead node's palisade serve (pid {server_pid}) is still running")
    cluster.remove_node(victim, allow_graceful=False)
    return results, lost, victim


def test_a_node_killed_mid_batch_reports_its_running_runs_as_lost(cluster):
    results, lost, victim = _kill_mid_batch(cluster, idempotent=False)
    # The runs in flight on the victim (at most its slots) are lost, and not rerun: none of them
    # has a second attempt.
    assert len(lost) == CONCURRENCY, [(r.index, r.status) for r in lost]
    # Runs that never started there were run elsewhere: everything else is a real result.
    assert sum(r.status == "ok" for r in results) == len(results) - len(lost)
    assert all(r.attempts == 1 for r in results)


def test_a_node_killed_mid_batch_with_idempotent_runs_loses_nothing(cluster):
    results, lost, victim = _kill_mid_batch(cluster, idempotent=True)
    assert not lost
    rerun = [r for r in results if r.attempts > 1]
    assert len(rerun) == CONCURRENCY and all(r.attempts == 2 for r in rerun), \
        [(r.index, r.attempts) for r in rerun]
    assert all(r.node_id != victim.node_id for r in rerun)
