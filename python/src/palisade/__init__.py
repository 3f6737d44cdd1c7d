"""palisade's Python SDK: run code nobody has read behind a kernel-enforced boundary.

``palisade.run(code)`` and ``palisade.run_batch(items, concurrency=...)`` for one-shot runs;
:class:`Sandbox` / :class:`AsyncSandbox` for sessions (E2B's shape: ``commands.run``,
``files``, ``run_code`` with a persistent interpreter). With no ``url`` and no
``$PALISADE_URL``, a private ``palisade serve`` is started on a unix socket for this process
and stopped at exit. See python/README.md."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .client import AsyncClient, Client, Limits, RunItem, RunRequest, policy_file
from .errors import (
    AuthError,
    BinaryNotFoundError,
    BusyError,
    ChangesNotReadyError,
    ConflictError,
    HeldChange,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PalisadeError,
    PolicyError,
    RequestTimeoutError,
    SandboxGoneError,
    ServerError,
    ServerStartError,
    ServerUnavailableError,
    ShuttingDownError,
    TooLargeError,
    UnknownLanguageError,
    WorkspaceConflictError,
)
from .results import (
    Applied,
    Change,
    ChangeSet,
    CommandResult,
    Context,
    Diff,
    EntryInfo,
    Listing,
    Execution,
    ExecutionError,
    RunResult,
    Stage,
)
from .sandbox import (
    AsyncCommandHandle,
    AsyncSandbox,
    AsyncWorkspace,
    CommandHandle,
    Sandbox,
    Workspace,
    default_async_client,
    default_client,
)
from .server import EmbeddedServer, find_binary

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncCommandHandle",
    "Applied",
    "AsyncSandbox",
    "AsyncWorkspace",
    "AuthError",
    "BinaryNotFoundError",
    "BusyError",
    "Change",
    "ChangeSet",
    "ChangesNotReadyError",
    "Client",
    "CommandHandle",
    "CommandResult",
    "ConflictError",
    "Context",
    "Diff",
    "EmbeddedServer",
    "EntryInfo",
    "Listing",
    "Execution",
    "ExecutionError",
    "HeldChange",
    "InternalServerError",
    "InvalidRequestError",
    "Limits",
    "NotFoundError",
    "PalisadeError",
    "PolicyError",
    "RequestTimeoutError",
    "RunItem",
    "RunRequest",
    "RunResult",
    "Sandbox",
    "SandboxGoneError",
    "ServerError",
    "ServerStartError",
    "ServerUnavailableError",
    "ShuttingDownError",
    "Stage",
    "TooLargeError",
    "UnknownLanguageError",
    "Workspace",
    "WorkspaceConflictError",
    "arun",
    "arun_batch",
    "find_binary",
    "run",
    "run_batch",
]


def _request(
    code: str | None,
    language: str,
    command: Sequence[str] | None,
    stdin: str | bytes | None,
    files: Mapping[str, str | bytes] | None,
    fetch: Sequence[str],
    env: Mapping[str, str] | None,
    limits: Limits | None,
    timeout: float | None,
    allow_net: Sequence[str],
    policy: str | os.PathLike[str] | None,
) -> RunRequest:
    p: dict[str, Any] = policy_file(policy) if policy is not None else {}
    return RunRequest(
        code=code,
        language=language,
        command=command,
        stdin=stdin,
        files=dict(files or {}),
        fetch=fetch,
        env={**p.get("env", {}), **dict(env or {})},
        limits={**p.get("limits", {}), **dict(limits or {})},
        timeout=timeout,
        allow_net=list(allow_net) or list(p.get("allow_net", [])),
    )


def run(
    code: str | None = None,
    language: str = "python",
    *,
    command: Sequence[str] | None = None,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    fetch: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    timeout: float | None = None,
    allow_net: Sequence[str] = (),
    policy: str | os.PathLike[str] | None = None,
    client: Client | None = None,
) -> RunResult:
    """Runs ``code`` in ``language`` (or ``command``, an argv) in a fresh sandbox and returns
    its :class:`RunResult` with palisade's full report. ``timeout`` is seconds; ``limits`` use
    the server's names; ``policy`` is a TOML file with ``[limits]``, ``allow_net``, ``[env]``.
    The server checks them all against its ceiling; its refusal is raised unchanged."""
    req = _request(code, language, command, stdin, files, fetch, env, limits, timeout, allow_net, policy)
    return (client or default_client()).run(req)


def run_batch(
    items: Iterable[RunItem], concurrency: int | None = None, *, client: Client | None = None
) -> list[RunResult]:
    """Runs every item (Python source as ``str``, a :class:`RunRequest`, or a dict of
    ``POST /v1/run`` fields) in its own sandbox, at most ``concurrency`` at once (within the
    server's own bound); the results in the items' order."""
    return (client or default_client()).run_batch(items, concurrency)


async def arun(
    code: str | None = None,
    language: str = "python",
    *,
    command: Sequence[str] | None = None,
    stdin: str | bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    fetch: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    timeout: float | None = None,
    allow_net: Sequence[str] = (),
    policy: str | os.PathLike[str] | None = None,
    client: AsyncClient | None = None,
) -> RunResult:
    """The async :func:`run`."""
    req = _request(code, language, command, stdin, files, fetch, env, limits, timeout, allow_net, policy)
    return await (client or default_async_client()).run(req)


async def arun_batch(
    items: Iterable[RunItem], concurrency: int | None = None, *, client: AsyncClient | None = None
) -> list[RunResult]:
    """The async :func:`run_batch`."""
    return await (client or default_async_client()).run_batch(items, concurrency)
