"""A real local Ray cluster for palisade.ray's tests: a head node (the driver's) and two worker
nodes, each with its own raylet on this machine; more nodes are added by the tests that need
them (a node to kill, a node whose host cannot enforce a policy).

Needs: Ray (scripts/ray-venv.sh makes /opt/palisade-ci/ray-venv) and the palisade binary
(``PALISADE_BIN``, as scripts/test.sh sets it, else ``target/debug/palisade``). A missing one fails
the tests, never skips them.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def palisade_bin() -> str:
    b = os.environ.get("PALISADE_BIN") or str(ROOT / "target/debug/palisade")
    assert os.access(b, os.X_OK), f"{b}: no palisade binary; cargo build --workspace, or set PALISADE_BIN"
    return b


# The nodes' servers: egress only to pypi.org (never contacted: the tests' runs only try names the
# proxy refuses by rule), memory up to 512MiB.
SERVER_POLICY = """
[network]
allow = ["pypi.org"]
[bounds.limits]
memory = "512MiB"
timeout = "60s"
[limits]
memory = "256MiB"
timeout = "30s"
"""


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ["PALISADE_BIN"] = palisade_bin()
    # The nodes' workers import palisade.ray (and the examples the tests run) from this checkout.
    src = str(ROOT / "python/src") + os.pathsep + str(ROOT / "python/examples")
    os.environ["PYTHONPATH"] = src + os.pathsep + os.environ.get("PYTHONPATH", "")
    # Ray's own directory: per run (root's and the test user's runs must not share /tmp/ray),
    # short (Ray's unix sockets live there).
    tmp = tempfile.mkdtemp(prefix="prt-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            # Notice a dead raylet within seconds, not the default ~30 s.
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 500,
                "health_check_timeout_ms": 500,
                "health_check_failure_threshold": 4,
            },
        },
    )
    for _ in range(2):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def add_node(cluster, env=None):
    """Adds a node whose raylet (and so its workers) has ``env`` on top of this process's."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        node = cluster.add_node(num_cpus=1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    cluster.wait_for_nodes()
    return node
