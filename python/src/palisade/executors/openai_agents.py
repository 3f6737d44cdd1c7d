"""The OpenAI Agents SDK: ``RunConfig(sandbox=SandboxRunConfig(client=PalisadeSandboxClient()))``
runs a ``SandboxAgent``'s shell, file and patch tools inside a palisade session.

:class:`PalisadeSandboxClient` is a ``BaseSandboxClient``; its sessions
(:class:`PalisadeSandboxSession`, a ``BaseSandboxSession``) are palisade sessions: ``create``
makes one, ``delete`` kills it (its final report is kept in ``session.report``), ``resume``
reattaches by id (or, if it is gone, makes a new one that the SDK restores from the snapshot),
``exec`` is ``commands.run`` with the timeout mapped, ``read``/``write`` go through palisade's
file API (never through a symlink), ``persist_workspace``/``hydrate_workspace`` through its tar
archive endpoints, and ``running`` asks the server. The SDK's own helpers (ls, mkdir, rm,
apply_patch, the manifest, snapshots) are built on these and so run inside too.

Not supported, each refused with the SDK's ``ConfigurationError`` saying so: another user than
the sandbox's one (``user=``, ``run_as``, manifest users and groups: there is no sudo inside), a
workspace root outside ``/workspace``, remote storage mounts and host-path grants (nothing of
the host is mounted into a palisade sandbox), and symbolic links in a workspace archive (palisade
archives carry regular files and directories only). PTY sessions are not offered
(``supports_pty()`` is False: the SDK's shell tool then runs one-shot commands), nor exposed
ports."""

from __future__ import annotations

import asyncio
import io
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Literal, NoReturn

from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    OpName,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_types import PtyExecUpdate
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, should_skip_tar_member, validate_tarfile
from pydantic import Field

from ..client import Client
from ..errors import NotFoundError, PalisadeError, RequestTimeoutError, SandboxGoneError, ServerError
from ..sandbox import WORKDIR, Sandbox, _rel

#: The backend's name in the SDK's session state and options (``type``).
BACKEND_ID = "palisade"


def _unsupported(what: str, op: OpName, **context: object) -> NoReturn:
    raise ConfigurationError(
        message=f"palisade sandbox: {what}",
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op=op,
        context={"backend": BACKEND_ID, **context},
    )


def _check_user(user: str | User | None, op: OpName) -> None:
    if user is not None:
        name = user.name if isinstance(user, User) else user
        _unsupported(
            f"running as another user ({name!r}) is not supported: every command of a palisade "
            "session runs as the sandbox's one unprivileged user (there is no sudo inside)",
            op,
            user=name,
        )


def _check_manifest(manifest: Manifest) -> None:
    """Refuses what a palisade session cannot give, before anything is created."""
    root = PurePosixPath(manifest.root)
    if not root.is_absolute() or ".." in root.parts or not (root == PurePosixPath(WORKDIR) or PurePosixPath(WORKDIR) in root.parents):
        _unsupported(
            f"manifest.root {manifest.root!r} is not supported: it must be {WORKDIR} or a directory under it "
            "(palisade's working directory, where its file and archive API works)",
            "start",
            root=manifest.root,
        )
    if manifest.users or manifest.groups:
        _unsupported(
            "manifest users and groups are not supported: a palisade sandbox has one unprivileged user "
            "and cannot create accounts",
            "start",
        )
    for grant in manifest.extra_path_grants:
        if grant.host_path is not None:
            _unsupported(
                f"the path grant {grant.path!r} with host_path {grant.host_path!r} is not supported: "
                "nothing of the host is mounted into a palisade sandbox",
                "start",
                path=grant.path,
            )
    mounts = manifest.mount_targets()
    if mounts:
        _unsupported(
            "manifest mounts are not supported: palisade does not mount storage into a sandbox "
            f"(mount at {mounts[0][1].as_posix()!r}); copy the files in with manifest entries instead",
            "start",
            mount_path=mounts[0][1].as_posix(),
        )


class PalisadeSandboxClientOptions(BaseSandboxClientOptions):
    """A new session's settings, as :class:`palisade.Sandbox`'s: ``timeout`` (its TTL, seconds),
    ``idle_timeout``, ``limits`` (the server's names: ``memory_bytes``, ``pids``…),
    ``allow_net`` (hosts it may reach through the egress proxy), ``env`` and ``labels``. The
    server checks them against its ceiling; what it refuses is raised unchanged
    (:class:`palisade.PolicyError`, :class:`palisade.InvalidRequestError`)."""

    type: Literal["palisade"] = "palisade"
    timeout: float | None = None
    idle_timeout: float | None = None
    limits: dict[str, int | float] | None = None
    allow_net: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)


class PalisadeSandboxSessionState(SandboxSessionState):
    """The SDK's session state plus the palisade session's id and the options a replacement
    (when that session is gone at ``resume``) is made with."""

    type: Literal["palisade"] = "palisade"
    sandbox_id: str
    options: PalisadeSandboxClientOptions = Field(default_factory=PalisadeSandboxClientOptions)


def _new_sandbox(options: PalisadeSandboxClientOptions, url: str | None, client: Client | None) -> Sandbox:
    return Sandbox(
        timeout=options.timeout,
        idle_timeout=options.idle_timeout,
        limits=options.limits,
        allow_net=options.allow_net,
        env=options.env or None,
        labels=options.labels or None,
        url=url,
        client=client,
    )


class PalisadeSandboxSession(BaseSandboxSession):
    """One palisade session behind the SDK's session API (see the module's docstring)."""

    state: PalisadeSandboxSessionState

    def __init__(self, *, state: PalisadeSandboxSessionState, sandbox: Sandbox) -> None:
        self.state = state
        self.sandbox = sandbox
        #: The session's final report, once :meth:`PalisadeSandboxClient.delete` killed it.
        self.report: dict[str, object] | None = None
        self._env: dict[str, str] | None = None

    # Paths and environment.

    def _root_rel(self) -> str:
        return _rel(self.state.manifest.root)

    def _in_workdir(self, path: Path) -> bool:
        p = PurePosixPath(path.as_posix())
        return PurePosixPath(WORKDIR) in p.parents

    async def _exec_env(self) -> dict[str, str]:
        if self._env is None:
            self._env = dict(await self.state.manifest.environment.resolve())
        return self._env

    # Lifecycle.

    async def _prepare_backend_workspace(self) -> None:
        rel = self._root_rel()
        if rel == ".":
            return
        r = await asyncio.to_thread(self.sandbox.commands.run, ["mkdir", "-p", "--", self.state.manifest.root])
        if r.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=Path(self.state.manifest.root), context={"reason": "mkdir_root", "stderr": r.stderr}
            )

    def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str], user: str | User | None) -> list[str]:
        _check_user(user, "exec")
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(c) for c in command]
        env = await self._exec_env()
        cwd = None if self._root_rel() == "." else self.state.manifest.root
        try:
            r = await asyncio.to_thread(self.sandbox.commands.run, argv, env=env or None, cwd=cwd, timeout=timeout)
        except RequestTimeoutError as e:
            raise ExecTimeoutError(command=argv, timeout_s=timeout, cause=e) from e
        except PalisadeError as e:
            raise ExecTransportError(command=argv, cause=e, message=f"palisade: {e}") from e
        if r.status in ("timeout", "cpu-timeout"):
            raise ExecTimeoutError(command=argv, timeout_s=timeout, context={"palisade_status": r.status})
        if r.status in ("ok", "exit"):
            code = r.exit_code if r.exit_code is not None else 0
        elif r.status == "signal" and r.signal is not None:
            code = 128 + r.signal
        else:
            # output-limit, oom, policy-denied, sandbox-error: not the program's own result.
            err = r.raw.get("error")
            raise ExecTransportError(
                command=argv,
                message=f"palisade: the command ended with status {r.status!r}" + (f": {err}" if err else ""),
                context={"palisade_status": r.status, "stderr": r.stderr[-4096:]},
                retryable=False,
            )
        return ExecResult(stdout=r.stdout_bytes, stderr=r.stderr_bytes, exit_code=code)

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        _unsupported(
            "PTY sessions are not supported (supports_pty() is False): palisade runs one-shot "
            "commands; use exec()",
            "exec",
            command=[str(c) for c in command],
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        _unsupported("PTY sessions are not supported (supports_pty() is False)", "exec", session_id=session_id)

    async def running(self) -> bool:
        try:
            await asyncio.to_thread(self.sandbox.get_info)
            return True
        except (NotFoundError, SandboxGoneError):
            return False

    # Files.

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        _check_user(user, "read")
        target = self.normalize_path(path)
        if not self._in_workdir(target):
            # A granted path outside /workspace (e.g. /tmp): read by a command inside.
            res = await self.exec("cat", "--", target.as_posix(), shell=False)
            if res.exit_code != 0:
                await self._raise_read_error_from_exec(
                    path=path, workspace_path=target, command=("cat", "--", target.as_posix()), result=res
                )
            return io.BytesIO(res.stdout)
        try:
            data = await asyncio.to_thread(self.sandbox.files.read, target.as_posix(), "bytes")
        except ServerError as e:
            if isinstance(e, NotFoundError) or "not-found" in str(e.value or ""):
                raise WorkspaceReadNotFoundError(path=path, cause=e) from e
            raise WorkspaceArchiveReadError(
                path=path, context={"reason": e.code or "palisade", "message": e.message}, cause=e
            ) from e
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        _check_user(user, "write")
        payload = coerce_write_payload(path=path, data=data)
        target = self.normalize_path(path, for_write=True)
        body = payload.stream.read()
        if not self._in_workdir(target):
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
            try:
                r = await asyncio.to_thread(
                    self.sandbox.commands.run, ["sh", "-c", script, "write", target.as_posix()], stdin=body
                )
            except PalisadeError as e:
                raise WorkspaceArchiveWriteError(path=target, cause=e) from e
            if r.exit_code != 0:
                raise WorkspaceArchiveWriteError(path=target, context={"stderr": r.stderr[-4096:]})
            return
        try:
            await asyncio.to_thread(self.sandbox.files.write, target.as_posix(), body)
        except ServerError as e:
            raise WorkspaceArchiveWriteError(
                path=target, context={"reason": e.code or "palisade", "message": e.message}, cause=e
            ) from e

    # The workspace as a tar archive.

    async def persist_workspace(self) -> io.IOBase:
        root = Path(self.state.manifest.root)
        try:
            resp = await asyncio.to_thread(
                self.sandbox._client.request,
                "GET",
                f"{self.sandbox._path}/archive",
                # Strict: an entry the archive cannot carry fails it, also past --max-fetch, where
                # the count of skipped entries comes only as a trailer this client does not read.
                params={"path": self._root_rel(), "strict": "true"},
            )
        except ServerError as e:
            if e.value == "not-regular":
                # Symbolic links, fifos, sockets, devices: a snapshot without them would not be
                # the workspace. Refused rather than lost.
                raise WorkspaceArchiveReadError(
                    path=root,
                    context={
                        "reason": "palisade_archive_skipped_entries",
                        "message": f"the workspace holds an entry that is not a regular file or directory "
                        f"(symbolic link, fifo, socket, device): {e.message}; palisade archives do not "
                        "carry them, so the workspace cannot be persisted whole",
                    },
                    cause=e,
                    retryable=False,
                ) from e
            raise WorkspaceArchiveReadError(path=root, context={"message": e.message}, cause=e) from e
        except PalisadeError as e:
            # A large archive streams: one cut short (an entry it cannot carry past its first
            # piece, a file that shrank) ends the download with an error.
            raise WorkspaceArchiveReadError(path=root, context={"message": str(e)}, cause=e) from e
        skipped = int(resp.headers.get("X-Palisade-Skipped", "0") or 0)
        if skipped:
            # Symbolic links, fifos, sockets, devices: a snapshot without them would not be the
            # workspace. Refused rather than lost.
            raise WorkspaceArchiveReadError(
                path=root,
                context={
                    "reason": "palisade_archive_skipped_entries",
                    "skipped": skipped,
                    "message": f"the workspace holds {skipped} entries that are not regular files or "
                    "directories (symbolic links, fifos, sockets, devices); palisade archives do not "
                    "carry them, so the workspace cannot be persisted whole",
                },
                retryable=False,
            )
        data: bytes = resp.content
        skip = self._persist_workspace_skip_relpaths()
        if skip:
            data = _without(data, skip)
        return io.BytesIO(data)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = Path(self.state.manifest.root)
        raw = data.read()
        if isinstance(raw, str):
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "non_bytes_tar_payload"})
        blob = bytes(raw)
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": e.reason, "member": e.member}, cause=e) from e
        except (tarfile.TarError, OSError) as e:
            raise WorkspaceArchiveWriteError(path=root, cause=e) from e
        try:
            await asyncio.to_thread(self.sandbox.files.write_archive, blob, self._root_rel())
        except ServerError as e:
            # palisade refuses a link, a hard link or a device entry, and writes nothing of it.
            raise WorkspaceArchiveWriteError(
                path=root,
                context={"reason": e.code or "palisade", "message": e.message},
                cause=e,
                message=f"palisade refused the workspace archive: {e.message}",
            ) from e


def _without(data: bytes, skip: set[Path]) -> bytes:
    """The tar ``data`` without the members under the workspace-relative paths ``skip``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            if should_skip_tar_member(m.name, skip_rel_paths=skip, root_name=None):
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out.getvalue()


class PalisadeSandboxClient(BaseSandboxClient[PalisadeSandboxClientOptions | None]):
    """Makes the SDK's sandbox sessions palisade sessions. ``url`` / ``client``: the palisade
    server (default: ``$PALISADE_URL``, else the process's embedded server, as for
    :class:`palisade.Sandbox`)."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        *,
        url: str | None = None,
        client: Client | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._url = url
        self._client = client
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: PalisadeSandboxClientOptions | None = None,
    ) -> SandboxSession:
        opts = options if options is not None else PalisadeSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        _check_manifest(manifest)
        sbx = await asyncio.to_thread(_new_sandbox, opts, self._url, self._client)
        session_id = uuid.uuid4()
        state = PalisadeSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id=sbx.sandbox_id,
            options=opts,
        )
        return self._wrap_session(PalisadeSandboxSession(state=state, sandbox=sbx), instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Kills the palisade session (already gone: nothing to do); its final report is in
        ``session._inner.report``."""
        inner = session._inner
        if not isinstance(inner, PalisadeSandboxSession):
            raise TypeError("PalisadeSandboxClient.delete expects a session it made")
        try:
            inner.report = await asyncio.to_thread(inner.sandbox.kill)
        except (NotFoundError, SandboxGoneError):
            pass
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattaches to the palisade session ``state.sandbox_id``; if it is gone (killed, past
        its TTL, the server restarted), makes a new one with the same options, which the SDK
        then restores from ``state.snapshot`` (or builds from the manifest) at ``start()``."""
        if not isinstance(state, PalisadeSandboxSessionState):
            raise TypeError("PalisadeSandboxClient.resume expects a PalisadeSandboxSessionState")
        state.assert_path_grants_rebound()
        _check_manifest(state.manifest)
        preserved = True
        try:
            sbx = await asyncio.to_thread(Sandbox.connect, state.sandbox_id, url=self._url, client=self._client)
        except (NotFoundError, SandboxGoneError):
            preserved = False
            sbx = await asyncio.to_thread(_new_sandbox, state.options, self._url, self._client)
            state.sandbox_id = sbx.sandbox_id
            state.workspace_root_ready = False
        inner = PalisadeSandboxSession(state=state, sandbox=sbx)
        inner._set_start_state_preserved(preserved)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, PalisadeSandboxSessionState)


__all__ = [
    "PalisadeSandboxClient",
    "PalisadeSandboxClientOptions",
    "PalisadeSandboxSession",
    "PalisadeSandboxSessionState",
]
