"""veRL's SandboxFusion reward path, scored by palisade on a Ray cluster.

Each node runs its own ``palisade serve`` (``palisade.ray.NodePool(listen="tcp")``) with a
SandboxFusion-compatible ``/run_code`` on loopback. A reward task placed on a node points veRL's
``compute_score`` at that node's URL, unchanged, with veRL's own rate limiting (the
``concurrent_semaphore`` its reward manager builds from ``sandbox_fusion.max_concurrent``) kept
at or below the node's ``concurrency_per_node``, so no request meets a full server.

In a veRL config the same thing is::

    reward_model.sandbox_fusion.url = <the node's run_code_url>
    reward_model.sandbox_fusion.max_concurrent = <concurrency_per_node>

Run (on a Ray cluster, with veRL installed where the reward tasks run)::

    python ray_verl_reward.py
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def _verl_sandbox_fusion(path=None):
    """veRL's ``verl.utils.reward_score.sandbox_fusion.utils`` (``path`` may name its file, for
    an environment where veRL's package cannot be imported whole: it pulls in torch)."""
    if not path:
        from verl.utils.reward_score import sandbox_fusion
        return sandbox_fusion.utils
    import importlib.util
    spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@ray.remote(num_cpus=0)
def score(url, completions, test_cases, max_concurrent, threads=16, memory_limit_mb=1024,
          verl_module=None):
    """Scores each completion against ``test_cases`` through veRL's client, ``threads`` at a
    time, veRL's semaphore allowing ``max_concurrent`` requests at once (``None``: no limit)."""
    sf = _verl_sandbox_fusion(verl_module)
    sem = threading.Semaphore(max_concurrent) if max_concurrent else None

    def one(code):
        results, _meta = sf.check_correctness(url, test_cases, code, timeout=10,
                                              concurrent_semaphore=sem,
                                              memory_limit_mb=memory_limit_mb, language="python")
        return results

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(one, completions))


def score_on_node(pool, node_id, completions, test_cases, max_concurrent, **kw):
    """Runs :func:`score` on ``node_id`` against that node's own ``/run_code``."""
    url = pool.run_code_url(node_id)
    task = score.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return ray.get(task.remote(url, completions, test_cases, max_concurrent, **kw))


if __name__ == "__main__":
    import palisade.ray as pr
    ray.init()
    policy = "[bounds.limits]\nmemory = \"1GiB\"\n"
    with pr.NodePool(4, listen="tcp", server_policy=policy) as pool:
        node = pool.nodes()[0]["node_id"]
        tests = {"inputs": ["1 2", "3 4"], "outputs": ["3", "7"]}
        good = "a, b = map(int, input().split())\nprint(a + b)\n"
        print(score_on_node(pool, node, [good, "print(0)"], tests, max_concurrent=4))
