"""bench/ray.sh (named ray_bench.py: a ray.py here would shadow Ray itself): run_batch over a local Ray cluster vs the node's server called directly.

Rows, each `true` started directly by the server (POST /v1/run {"command": ["true"]}), the same
number of slots (C sandboxes at once per node):
- direct: C client threads in a closed loop against one `palisade serve` on a unix socket;
- run_batch, 1 node: palisade.ray on a pool of the head node only;
- run_batch, 3 nodes: the same on the three nodes of the local cluster;
- sequential, concurrency 1: one run at a time, direct and through palisade.ray (NodePool.run),
  whose difference is Ray's overhead per run.
A run's latency is from the moment it is sent (run_batch reads an item just before it sends
it) to the moment its result reaches the caller.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import palisade.ray as pr  # noqa: E402
from palisade.ray._http import Client  # noqa: E402
from palisade.ray._node import _Server  # noqa: E402

REQ = {"command": ["true"]}


def pct(values, q):
    t = sorted(values)
    return t[min(len(t) - 1, int(round(q / 100 * (len(t) - 1))))]


def row(name, n, wall, lat):
    return {"row": name, "runs": n, "wall_s": wall, "runs_per_s": n / wall,
            "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "mean_ms": statistics.mean(lat) * 1e3}


def direct(binary, slots, n, threads):
    d = tempfile.mkdtemp(prefix="prb-")
    sock = os.path.join(d, "s.sock")
    srv = _Server([binary, "serve", "--listen", f"unix:{sock}", "--max-concurrency", str(slots)],
                  dict(os.environ))
    try:
        while not os.path.exists(sock):
            time.sleep(0.02)
        c = Client(f"unix:{sock}")
        lat, lock, left = [], threading.Lock(), [n]

        def work():
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                t = time.monotonic()
                r = c.post_json("/v1/run", REQ)
                assert r.status == 200 and r.json()["status"] == "ok", r.body[:300]
                with lock:
                    lat.append(time.monotonic() - t)

        t0 = time.monotonic()
        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.monotonic() - t0, lat
    finally:
        srv.stop(5)
        shutil.rmtree(d, ignore_errors=True)


def batch(pool, n):
    sent = {}

    def items():
        for i in range(n):
            sent[i] = time.monotonic()
            yield REQ

    lat = []
    t0 = time.monotonic()
    for r in pool.run_batch(items(), ordered=False):
        assert r.status == "ok", r.response
        lat.append(time.monotonic() - sent[r.index])
    return time.monotonic() - t0, lat


def sequential_ray(pool, n):
    lat = []
    t0 = time.monotonic()
    for _ in range(n):
        t = time.monotonic()
        r = pool.run(REQ)
        assert r.status == "ok", r.response
        lat.append(time.monotonic() - t)
    return time.monotonic() - t0, lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few runs: checks the harness, no figures written")
    ap.add_argument("--out", default=os.path.join(benchlib.ROOT, "docs", "benchmarks"))
    ap.add_argument("--slots", type=int, default=2, help="sandboxes at once per node")
    a = ap.parse_args()
    benchlib.check_profile(a.quick)
    binary = os.environ.get("PALISADE_BIN") or benchlib.PALISADE
    os.environ["PALISADE_BIN"] = binary
    n = 40 if a.quick else 600
    nseq = 10 if a.quick else 200
    meta = benchlib.host_meta()
    rows = []
    rows.append(row(f"direct, {a.slots} client threads", n, *direct(binary, a.slots, n, a.slots)))
    rows.append(row("direct, sequential", nseq, *direct(binary, 1, nseq, 1)))

    tmp = tempfile.mkdtemp(prefix="prb-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp
    os.environ["PYTHONPATH"] = os.path.join(benchlib.ROOT, "python", "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
        head = c.head_node.node_id
        with pr.NodePool(a.slots, nodes=[head]) as one:
            batch(one, 10)  # warm: the actor's first calls
            rows.append(row("run_batch, 1 node", n, *batch(one, n)))
            rows.append(row("NodePool.run, sequential (1 node)", nseq, *sequential_ray(one, nseq)))
        with pr.NodePool(a.slots) as three:
            batch(three, 10)
            rows.append(row("run_batch, 3 nodes", n, *batch(three, n)))
        ray.shutdown()
    finally:
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    by = {r["row"]: r for r in rows}
    overhead_ms = by["NodePool.run, sequential (1 node)"]["mean_ms"] - by["direct, sequential"]["mean_ms"]
    res = {"meta": meta, "slots_per_node": a.slots, "rows": rows,
           "ray_overhead_per_run_ms": overhead_ms, "ray_version": ray.__version__}
    lines = [f"{r['row']:<36} {r['runs']:>5} runs  {r['runs_per_s']:7.1f} runs/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms"
             for r in rows]
    print("\n".join(lines))
    print(f"Ray overhead per run (sequential, mean): {overhead_ms:.1f} ms; {meta['cpus']} CPUs; load at start {meta['loadavg_at_start']}")
    if a.quick:
        return
    with open(os.path.join(a.out, "ray.json"), "w") as f:
        json.dump(res, f, indent=2)
    md = [
        "# palisade.ray: run_batch on a local Ray cluster",
        "",
        f"Measured {meta['date']} by `bench/ray.sh` on a machine with **{meta['cpus']} CPUs**, Linux "
        f"{meta['kernel']}, as {meta['user']}, load average {' '.join(meta['loadavg_at_start'])} at the start; "
        f"Ray {ray.__version__}. Every run is `true` started directly by a node's `palisade serve` (release "
        f"build), {a.slots} sandboxes at once per node. The three nodes of the local cluster are three raylets "
        "on this one machine, sharing its cores: the 1 vs 3 node rows show what the spreading costs here, not "
        "a cluster's scaling, which is the machine count times the 1-node row (re-run on a real cluster).",
        "",
        "| row | runs | runs/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(f"| {r['row']} | {r['runs']} | {r['runs_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    md += ["", f"Ray's overhead per run (one at a time, mean through `NodePool.run` minus mean direct): "
           f"**{overhead_ms:.1f} ms**.", ""]
    with open(os.path.join(a.out, "ray.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
