"""The SDK's tests run against a real `palisade serve` (the binary named by PALISADE_BIN, e.g.
target/debug/palisade): a missing binary fails the run, it never skips."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import palisade
import palisade.sandbox

#: The server's policy for the tests: one host the sandboxes may reach (through the egress
#: proxy; nothing answers there, which is fine: what matters is what is refused).
POLICY = """
[limits]
timeout = "60s"
[network]
allow = ["allowed.test"]
"""


def pytest_configure(config: pytest.Config) -> None:
    b = os.environ.get("PALISADE_BIN")
    if not b or not os.access(b, os.X_OK):
        raise pytest.UsageError(f"PALISADE_BIN must name the palisade binary (got {b!r})")


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[palisade.Client]:
    p = tmp_path_factory.mktemp("policy") / "server.toml"
    p.write_text(POLICY)
    c = palisade.Client(policy=p, server_args=["--max-concurrency", "4", "--max-queue", "256"])
    # The module-level functions and Sandbox() use this one.
    palisade.sandbox._default = c
    yield c
    c.close()


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A host file the sandboxed code must not read."""
    s = tmp_path / "host-secret.txt"
    s.write_text("TOP-SECRET-4711")
    return s
