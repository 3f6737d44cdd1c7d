"""veRL's own SandboxFusion client (veRL 0.9.1 from /opt/palisade-ci/verl-venv, made by
scripts/verl-venv.sh; loaded by path, so veRL's torch imports never run) scoring through a Ray
node's palisade ``/run_code``, with veRL's rate limiting (its ``concurrent_semaphore``) kept."""

import glob
import os
import sys
from pathlib import Path

import ray

import palisade.ray as pr

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import ray_verl_reward  # noqa: E402

VENV = os.environ.get("PALISADE_VERL_VENV", "/opt/palisade-ci/verl-venv")
SLOTS = 2


def _metric(pool, node_id, name, **labels):
    """The sum of the metric `name` over its lines that carry every one of `labels` (a counter
    is split by more labels than a test names, e.g. runs by status and engine)."""
    out = ray.get(pool.actor(node_id).call.remote("GET", "/metrics"))
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found, total = False, 0.0
    for line in out["body"].decode().splitlines():
        if not (line.startswith(name + " ") or line.startswith(name + "{")):
            continue
        head = line.rsplit(" ", 1)[0]
        if all(w in head for w in want):
            found = True
            total += float(line.rsplit(" ", 1)[1])
    if not found:
        raise AssertionError(f"{name} {labels} not in the metrics")
    return total


def test_verls_reward_path_scores_through_a_nodes_run_code_within_its_rate_limit(cluster):
    found = glob.glob(VENV + "/lib/python3*/site-packages/verl/utils/reward_score/sandbox_fusion/utils.py")
    assert found, f"veRL's client is missing in {VENV}: run scripts/verl-venv.sh"
    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"])
    # No queue: a request past the node's slots is refused at once (429), so a client that
    # exceeded its rate limit could not go unnoticed.
    policy = "[bounds.limits]\nmemory = \"1GiB\"\n"
    with pr.NodePool(SLOTS, listen="tcp", server_policy=policy, max_queue=0,
                     nodes=[node]) as pool:
        url = pool.run_code_url(node)  # what a veRL config's sandbox_fusion.url would be
        assert url.startswith("http://127.0.0.1:") and url.endswith("/run_code"), url
        tests = {"inputs": ["1 2", "3 4", "10 -4"], "outputs": ["3", "7", "6"]}
        good = "a, b = map(int, input().split())\nprint(a + b)\n"
        wrong = "a, b = map(int, input().split())\nprint(a - b)\n"
        crash = "raise SystemExit(3)\n"
        completions = [good, wrong, crash] * 4
        got = ray_verl_reward.score_on_node(pool, node, completions, tests, SLOTS, threads=12,
                                            verl_module=found[0])
        assert got == [[True, True, True], [False, False, False], [-2, -2, -2]] * 4, got
        # veRL's semaphore held its requests to the node's slots: none met a full server.
        assert _metric(pool, node, "palisade_rejected_busy_total") == 0
        assert _metric(pool, node, "palisade_runs_total", status="ok") >= 4 * 3 * 2
        # Control: without veRL's limit the same client oversubscribes the node and gets 429s
        # (veRL's client reports them as API errors, -1), so the check above can fail.
        slow = "import time\ntime.sleep(2)\nprint(3)\n"
        got = ray_verl_reward.score_on_node(pool, node, [slow] * 12,
                                            {"inputs": ["1 2"], "outputs": ["3"]}, None,
                                            threads=12, verl_module=found[0])
        assert _metric(pool, node, "palisade_rejected_busy_total") > 0
        assert [-1] in got and [True] in got, got
