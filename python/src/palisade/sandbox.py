"""Sessions in E2B's shape: :class:`Sandbox` and :class:`AsyncSandbox`, with ``commands``,
``files`` and ``run_code``. A sandbox is one ``palisade serve`` session: one boundary and one
cgroup for all its commands, its files kept between calls, destroyed on ``kill()``, at its
``timeout`` (TTL), or when the ``with`` block ends, whatever ends it (KeyboardInterrupt too)."""

from __future__ import annotations

import asyncio
import io
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from .client import AsyncClient, Client, Limits, content, merged_limits, policy_file
from .errors import ChangesNotReadyError, InvalidRequestError, NotFoundError
from .results import Applied, ChangeSet, Context, Diff, EntryInfo, Execution, Listing, Stage
from .server import workspace_server

Command = Union[str, Sequence[str]]
OutputHandler = Callable[[str], None]


def _argv(cmd: Command) -> list[str]:
    """A string runs through ``sh -c`` (as E2B's does); a sequence is the argv itself."""
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _exec_body(
    cmd: Command,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: str | bytes | None,
    mode: str,
) -> dict[str, Any]:
    body: dict[str, Any] = {"command": _argv(cmd), "mode": mode}
    if env:
        body["env"] = dict(env)
    if cwd is not None and _rel(cwd) != ".":
        body["cwd"] = _rel(cwd)
    if timeout is not None:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    if stdin is not None:
        body["stdin"] = content(stdin)
    return body


#: The sandbox's working directory, where relative paths start.
WORKDIR = "/workspace"


def _rel(path: str) -> str:
    """A path for the server: relative to the working directory (``/workspace/a`` -> ``a``)."""
    if path == WORKDIR or path == WORKDIR + "/":
        return "."
    if path.startswith(WORKDIR + "/"):
        return path[len(WORKDIR) + 1 :]
    return path


def _url_path(path: str) -> str:
    """``path`` for a URL, each component escaped (``.`` and ``..`` too, so that the client does
    not resolve them away: the server sees the path as given, and refuses what it must)."""
    from urllib.parse import quote

    parts = _rel(path).split("/")
    return "/".join(p.replace(".", "%2E") if set(p) == {"."} else quote(p, safe="") for p in parts)


def _session_body(
    timeout: float | None,
    idle_timeout: float | None,
    limits: Limits | None,
    allow_net: Sequence[str],
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    idempotency_key: str | None,
    policy: str | os.PathLike[str] | None,
    workspace: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if workspace is not None:
        body["workspace"] = workspace
    if policy is not None:
        p = policy_file(policy)
        body.update({k: v for k, v in p.items() if k in ("limits", "allow_net", "env")})
    if timeout is not None:
        body["ttl_s"] = max(1, int(timeout))
    if idle_timeout is not None:
        body["idle_timeout_s"] = max(1, int(idle_timeout))
    lim = merged_limits(limits, None)
    if lim:
        body["limits"] = {**body.get("limits", {}), **lim}
    if allow_net:
        body["allow_net"] = list(allow_net)
    if env:
        body["env"] = {**body.get("env", {}), **dict(env)}
    if labels:
        body["labels"] = dict(labels)
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    return body


def _finish(res: Stage, on_stdout: OutputHandler | None, on_stderr: OutputHandler | None) -> Stage:
    if on_stdout and res.stdout:
        on_stdout(res.stdout)
    if on_stderr and res.stderr:
        on_stderr(res.stderr)
    return res



def _listing(d: dict[str, Any]) -> Listing:
    return Listing(
        (EntryInfo(e["name"], e["kind"], e.get("size"), e) for e in d["entries"]),
        bool(d.get("truncated", False)),
    )

class CommandHandle:
    """A command started with ``background=True``."""

    def __init__(self, sandbox: Sandbox, exec_id: int) -> None:
        self.sandbox = sandbox
        self.pid = exec_id

    def poll(self) -> Stage | None:
        """Its result once it ended, else None."""
        info = self.sandbox._client.request("GET", f"{self.sandbox._path}/exec/{self.pid}").json()
        return None if info.get("running") else Stage.from_json(info["result"])

    def wait(
        self,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        timeout: float | None = None,
    ) -> Stage:
        """Waits for its end (polling); the handlers get its whole output then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            r = self.poll()
            if r is not None:
                return _finish(r, on_stdout, on_stderr)
            if deadline is not None and time.monotonic() > deadline:
                from .errors import RequestTimeoutError

                raise RequestTimeoutError(f"command {self.pid} still runs after {timeout} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def send_stdin(self, data: str | bytes, close: bool = False) -> None:
        b = data.encode() if isinstance(data, str) else data
        self.sandbox._client.request(
            "POST",
            f"{self.sandbox._path}/exec/{self.pid}/stdin",
            content=b,
            params={"close": "true"} if close else None,
        )

    def kill(self, signal: int | str = 9) -> None:
        self.sandbox._client.request(
            "POST", f"{self.sandbox._path}/exec/{self.pid}/signal", json_body={"signal": signal}
        )


class Commands:
    """``sbx.commands``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def run(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        background: bool = False,
        stdin: str | bytes | None = None,
    ) -> Any:
        """Runs ``cmd`` (a string through ``sh -c``, or an argv) in the sandbox: a
        :class:`~palisade.results.Stage` (``stdout``, ``stderr``, ``exit_code``, ``status``), or
        with ``background=True`` a :class:`CommandHandle`. ``on_stdout``/``on_stderr`` get the
        output as it comes (streamed). A non-zero exit is a result, not an exception."""
        c = self._s._client
        path = f"{self._s._path}/exec"
        http_timeout = None if timeout is None else timeout + 30
        if background:
            body = _exec_body(cmd, env, cwd, timeout, stdin, "background")
            info = c.request("POST", path, json_body=body).json()
            return CommandHandle(self._s, int(info["id"]))
        if on_stdout is None and on_stderr is None:
            body = _exec_body(cmd, env, cwd, timeout, stdin, "sync")
            return Stage.from_json(c.request("POST", path, json_body=body, timeout=http_timeout).json())
        body = _exec_body(cmd, env, cwd, timeout, stdin, "stream")
        out, err = bytearray(), bytearray()
        for ev in c.stream_lines("POST", path, body, timeout=http_timeout):
            kind = ev.get("event")
            if kind in ("stdout", "stderr"):
                from .results import _data

                b, _ = _data(ev.get("data"))
                (out if kind == "stdout" else err).extend(b)
                h = on_stdout if kind == "stdout" else on_stderr
                if h is not None:
                    h(b.decode("utf-8", "replace"))
            elif kind == "exit":
                res = dict(ev["result"])
                res["stdout"] = {"data": out.decode("utf-8", "replace"), "encoding": "utf-8", "bytes": len(out)}
                res["stderr"] = {"data": err.decode("utf-8", "replace"), "encoding": "utf-8", "bytes": len(err)}
                return Stage.from_json(res)
        from .errors import PalisadeError

        raise PalisadeError("the command's stream ended without its exit")


class Files:
    """``sbx.files``: paths relative to the working directory (``/workspace``), or absolute
    under it. Moved by palisade's agent inside the boundary; a symlink is never followed."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._s = sandbox

    def read(self, path: str, format: str = "text") -> Any:
        """The file's content: ``str`` (``format="text"``) or ``bytes`` (``"bytes"``)."""
        b = self._s._client.request("GET", f"{self._s._path}/files/{_url_path(path)}").content
        return b if format == "bytes" else b.decode("utf-8", "replace")

    def write(self, path: str, data: str | bytes) -> None:
        b = data.encode() if isinstance(data, str) else data
        self._s._client.request("PUT", f"{self._s._path}/files/{_url_path(path)}", content=b)

    def download(self, path: str, dest: str | os.PathLike[str]) -> int:
        """Streams the file into the local file ``dest``, whatever its size (the server reads it
        a piece at a time); the bytes written. ``dest`` is replaced only once the whole file has
        come; a file replaced, written or shrunk inside while it is read raises ``PalisadeError``."""
        with _Landing(dest) as out:
            n = self._s._client.stream_to(f"{self._s._path}/files/{_url_path(path)}", out)
            out.done()
        return n

    def list(self, path: str = ".") -> Listing:
        """The directory's entries; ``.truncated`` when it held more than one answer carries."""
        d = self._s._client.request("GET", f"{self._s._path}/files", params={"path": _rel(path)}).json()
        return _listing(d)

    def exists(self, path: str) -> bool:
        parent, _, name = _rel(path).rstrip("/").rpartition("/")
        try:
            listing = self.list(parent or ".")
        except NotFoundError:
            return False
        if any(e.name == name for e in listing):
            return True
        if not listing.truncated:
            return False
        # A directory too large to list whole: ask about the path itself.
        try:
            self.list(path)
        except NotFoundError:
            return False
        except InvalidRequestError as e:
            # The agent's reason is the error's value: a file is `not-directory`.
            if e.value == "not-found":
                return False
            if e.value == "not-directory":
                return True
            raise
        return True

    def remove(self, path: str, recursive: bool = True) -> None:
        self._s._client.request(
            "DELETE", f"{self._s._path}/files/{_url_path(path)}", params={"recursive": "true" if recursive else "false"}
        )

    def write_archive(self, tar: bytes, path: str = ".") -> None:
        self._s._client.request("PUT", f"{self._s._path}/archive", content=tar, params={"path": _rel(path)})

    def read_archive(self, path: str = ".", max_bytes: int | None = None) -> bytes:
        """A tar of the directory, in memory: at most ``max_bytes`` (the server's ``--max-fetch``
        when not given), else a ``ServerError`` whose ``value`` is ``too-large``; see :meth:`download_archive` for a large one."""
        params: dict[str, str] = {"path": _rel(path)}
        if max_bytes is not None:
            params["max_bytes"] = str(max_bytes)
        return self._s._client.request("GET", f"{self._s._path}/archive", params=params).content

    def download_archive(
        self, path: str, dest: str | os.PathLike[str], strict: bool = False, max_bytes: int = 1 << 30
    ) -> int:
        """Streams a tar of the directory into the local file ``dest`` (the server makes it a
        piece at a time); the bytes written. The code inside decides how large an archive is (a
        sparse file counts whole, a hard link once per name), so it may have ``max_bytes`` at
        most (1 GiB by default), else this raises. ``strict``: an entry the archive cannot carry
        (a symbolic link, fifo, socket or device) raises rather than being left out. ``dest`` is
        replaced only once the whole archive has come."""
        params = {"path": _rel(path), "strict": "true" if strict else "false", "max_bytes": str(max_bytes)}
        with _Landing(dest) as out:
            n = self._s._client.stream_to(f"{self._s._path}/archive", out, params=params)
            out.done()
        return n


class _Landing(io.FileIO):
    """A temporary file beside ``dest`` that becomes ``dest`` once :meth:`done`, and is removed
    otherwise: a download that fails leaves no partial file under the name."""

    def __init__(self, dest: str | os.PathLike[str]) -> None:
        self._dest = os.fspath(dest)
        fd, self._tmp = tempfile.mkstemp(prefix=".palisade-", dir=os.path.dirname(os.path.abspath(self._dest)))
        super().__init__(fd, "wb", closefd=True)
        self._done = False

    def done(self) -> None:
        self._done = True

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._done and exc[0] is None:
            os.replace(self._tmp, self._dest)
        else:
            os.unlink(self._tmp)


def _workspace_path(workspace: str | os.PathLike[str], own_server: bool) -> str:
    """The directory as the request names it: absolute; for the SDK's own server, canonical
    (that server's root is the canonical path, and it follows no link on the way)."""
    p = os.fspath(workspace)
    return os.path.realpath(p) if own_server else os.path.abspath(p)


def _uses_own_server(url: str | None, client: object | None) -> bool:
    return client is None and url is None and not os.environ.get("PALISADE_URL")


_workspace_clients: dict[str, Client] = {}
_workspace_async_clients: dict[tuple[int, str], AsyncClient] = {}


def workspace_client(directory: str) -> Client:
    """The client of the private server for ``directory`` (see
    :func:`palisade.server.workspace_server`)."""
    srv = workspace_server(directory)
    c = _workspace_clients.get(directory)
    if c is None or c.socket != srv.socket:
        c = _workspace_clients[directory] = Client(f"unix:{srv.socket}")
    return c


def workspace_async_client(directory: str) -> AsyncClient:
    """The async client of the private server for ``directory``, for the running event loop."""
    srv = workspace_server(directory)
    key = (id(asyncio.get_running_loop()), directory)
    c = _workspace_async_clients.get(key)
    if c is None or c.socket != srv.socket:
        c = _workspace_async_clients[key] = AsyncClient(f"unix:{srv.socket}")
    return c


def _paths(paths: Sequence[str] | str | None) -> list[str]:
    if paths is None:
        return []
    return [paths] if isinstance(paths, str) else list(paths)


def _find_change_set(listing: Any, sandbox_id: str) -> str | None:
    for c in listing if isinstance(listing, list) else []:
        if isinstance(c, dict) and c.get("session") == sandbox_id:
            return str(c["id"])
    return None


def _not_ready(sandbox_id: str) -> ChangesNotReadyError:
    return ChangesNotReadyError(
        f"sandbox {sandbox_id} still runs: its workspace's changes are kept when it ends "
        "(kill() it, or leave its `with` block)"
    )


class Workspace:
    """``sbx.workspace`` of a sandbox opened on a host directory (``Sandbox(workspace=DIR)``).

    The code sees ``DIR`` at ``/workspace``, writable; ``DIR`` itself is not written. When the
    sandbox ends its changes are kept as a change set: ``changes()``, ``diff()``, then
    ``apply()`` all or some of it, or ``discard()`` it. Asked for while the sandbox still runs,
    each raises :class:`~palisade.errors.ChangesNotReadyError`."""

    def __init__(self, sandbox: Sandbox, directory: str) -> None:
        self._s = sandbox
        self.directory = directory
        self.change_set_id: str | None = None

    def _id(self) -> str:
        if self.change_set_id is None:
            c = self._s._client
            found = _find_change_set(c.request("GET", "/v1/changes").json(), self._s.sandbox_id)
            if found is None:
                if self._s.is_running():
                    raise _not_ready(self._s.sandbox_id)
                from .errors import PalisadeError

                raise PalisadeError(f"sandbox {self._s.sandbox_id} ended without a change set (nothing changed, or it could not be kept: see its report)")
            self.change_set_id = found
        return self.change_set_id

    def changes(self) -> ChangeSet:
        """Every changed path (``palisade changes ID --json``)."""
        return ChangeSet.from_json(self._s._client.request("GET", f"/v1/changes/{self._id()}").json())

    def diff(self, paths: Sequence[str] | str | None = None) -> Diff:
        """The unified diff, of all of it or of ``paths`` and what is under them."""
        body = {"paths": _paths(paths)}
        return Diff.from_json(self._s._client.request("POST", f"/v1/changes/{self._id()}/diff", json_body=body).json())

    def apply(
        self,
        paths: Sequence[str] | str | None = None,
        *,
        force: bool = False,
        include_risky: bool = False,
        exclude: Sequence[str] | str | None = None,
    ) -> Applied:
        """Applies all of it (or ``paths`` and what is under them) to the directory: all or
        nothing. Anything held back (refused, protected or risky and not named, in conflict
        without ``force``) raises :class:`~palisade.errors.WorkspaceConflictError` with the list,
        and nothing is applied."""
        body = {"paths": _paths(paths), "exclude": _paths(exclude), "force": force, "include_risky": include_risky}
        return Applied.from_json(self._s._client.request("POST", f"/v1/changes/{self._id()}/apply", json_body=body).json())

    def discard(self) -> None:
        """Removes the change set."""
        self._s._client.request("DELETE", f"/v1/changes/{self._id()}")


class AsyncWorkspace:
    """The asynchronous :class:`Workspace`."""

    def __init__(self, sandbox: AsyncSandbox, directory: str) -> None:
        self._s = sandbox
        self.directory = directory
        self.change_set_id: str | None = None

    async def _id(self) -> str:
        if self.change_set_id is None:
            c = self._s._client
            found = _find_change_set((await c.request("GET", "/v1/changes")).json(), self._s.sandbox_id)
            if found is None:
                try:
                    await c.request("GET", self._s._path)
                    alive = True
                except Exception:
                    alive = False
                if alive:
                    raise _not_ready(self._s.sandbox_id)
                from .errors import PalisadeError

                raise PalisadeError(f"sandbox {self._s.sandbox_id} ended without a change set (nothing changed, or it could not be kept: see its report)")
            self.change_set_id = found
        return self.change_set_id

    async def changes(self) -> ChangeSet:
        r = await self._s._client.request("GET", f"/v1/changes/{await self._id()}")
        return ChangeSet.from_json(r.json())

    async def diff(self, paths: Sequence[str] | str | None = None) -> Diff:
        r = await self._s._client.request("POST", f"/v1/changes/{await self._id()}/diff", json_body={"paths": _paths(paths)})
        return Diff.from_json(r.json())

    async def apply(
        self,
        paths: Sequence[str] | str | None = None,
        *,
        force: bool = False,
        include_risky: bool = False,
        exclude: Sequence[str] | str | None = None,
    ) -> Applied:
        body = {"paths": _paths(paths), "exclude": _paths(exclude), "force": force, "include_risky": include_risky}
        r = await self._s._client.request("POST", f"/v1/changes/{await self._id()}/apply", json_body=body)
        return Applied.from_json(r.json())

    async def discard(self) -> None:
        await self._s._client.request("DELETE", f"/v1/changes/{await self._id()}")


def _change_set_of(report: dict[str, Any] | None) -> str | None:
    ws = (report or {}).get("workspace")
    cs = ws.get("change_set") if isinstance(ws, dict) else None
    return str(cs) if cs else None


class Sandbox:
    """A palisade session, E2B-style.

    ``Sandbox()`` / ``Sandbox.create()`` make one; ``Sandbox.connect(id)`` attaches to a live
    one. ``timeout`` is its TTL in seconds (the server's ``--session-ttl`` at most);
    ``limits`` (server names: ``memory_bytes``, ``pids``…), ``allow_net``, ``env`` narrow the
    server's policy, or ``policy="file.toml"`` gives them from a file's ``limits``,
    ``allow_net`` and ``env``; the server checks them and its refusal is raised unchanged
    (:class:`~palisade.errors.PolicyError`, :class:`~palisade.errors.InvalidRequestError`)."""

    def __init__(
        self,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        limits: Limits | None = None,
        allow_net: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        policy: str | os.PathLike[str] | None = None,
        url: str | None = None,
        client: Client | None = None,
        sandbox_id: str | None = None,
        workspace: str | os.PathLike[str] | None = None,
    ) -> None:
        ws: str | None = None
        if workspace is not None:
            own = _uses_own_server(url, client)
            ws = _workspace_path(workspace, own)
            if own:
                client = workspace_client(ws)
        self._client = client if client is not None else Client(url) if url is not None else default_client()
        if sandbox_id is None:
            body = _session_body(timeout, idle_timeout, limits, allow_net, env, labels, idempotency_key, policy, ws)
            info = self._client.request("POST", "/v1/sandboxes", json_body=body).json()
            sandbox_id = str(info["id"])
            ws = info.get("workspace") or ws
        self.sandbox_id: str = sandbox_id
        self._path = f"/v1/sandboxes/{sandbox_id}"
        self.commands = Commands(self)
        self.files = Files(self)
        self.report: dict[str, Any] | None = None
        self._workspace = Workspace(self, ws) if ws is not None else None

    @property
    def workspace(self) -> Workspace:
        """The workspace's changes (a sandbox made with ``workspace=``)."""
        if self._workspace is None:
            from .errors import PalisadeError

            raise PalisadeError(f"sandbox {self.sandbox_id} was not made on a workspace (Sandbox(workspace=DIR))")
        return self._workspace

    @classmethod
    def create(cls, **kwargs: Any) -> Sandbox:
        return cls(**kwargs)

    @classmethod
    def connect(cls, sandbox_id: str, *, url: str | None = None, client: Client | None = None) -> Sandbox:
        """Attaches to a live sandbox by id (:class:`~palisade.errors.NotFoundError` or
        :class:`~palisade.errors.SandboxGoneError` if there is none)."""
        c = client if client is not None else Client(url) if url is not None else default_client()
        info = c.request("GET", f"/v1/sandboxes/{sandbox_id}").json()
        sbx = cls(client=c, sandbox_id=sandbox_id)
        if info.get("workspace"):
            sbx._workspace = Workspace(sbx, str(info["workspace"]))
        return sbx

    def get_info(self) -> dict[str, Any]:
        r: dict[str, Any] = self._client.request("GET", self._path).json()
        return r

    def is_running(self) -> bool:
        try:
            self.get_info()
            return True
        except (NotFoundError, Exception):
            return False

    def kill(self) -> dict[str, Any] | None:
        """Destroys the sandbox; returns its final report (also kept in ``self.report``). On a
        workspace, the report's ``workspace`` section names the change set its changes became."""
        r = self._client.request("DELETE", self._path).json()
        self.report = r.get("report")
        if self._workspace is not None:
            self._workspace.change_set_id = _change_set_of(self.report) or self._workspace.change_set_id
        return self.report

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        context: Context | str | None = None,
        timeout: float | None = None,
        output_bytes: int | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
    ) -> Execution:
        """Evaluates ``code`` in a persistent interpreter (the sandbox's default context, or
        ``context``): variables live on between calls; ``.text`` is the last expression's
        ``repr``, ``.error`` the exception (name, value, traceback)."""
        body: dict[str, Any] = {"code": code, "language": language}
        if context is not None:
            body["context"] = context.id if isinstance(context, Context) else context
        if timeout is not None:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        if output_bytes is not None:
            body["output_bytes"] = output_bytes
        http_timeout = None if timeout is None else timeout + 30
        ex = Execution.from_json(
            self._client.request("POST", f"{self._path}/run_code", json_body=body, timeout=http_timeout).json()
        )
        if on_stdout and ex.stdout:
            on_stdout(ex.stdout)
        if on_stderr and ex.stderr:
            on_stderr(ex.stderr)
        return ex

    def create_code_context(
        self, cwd: str | None = None, language: str = "python", env: Mapping[str, str] | None = None
    ) -> Context:
        body: dict[str, Any] = {"language": language}
        if cwd is not None and _rel(cwd) != ".":
            body["cwd"] = _rel(cwd)
        if env:
            body["env"] = dict(env)
        d = self._client.request("POST", f"{self._path}/contexts", json_body=body).json()
        return Context(d["id"], d["language"], d["cwd"])

    def list_code_contexts(self) -> list[Context]:
        return [Context(d["id"], d["language"], d["cwd"]) for d in self._client.request("GET", f"{self._path}/contexts").json()]

    def remove_code_context(self, context: Context | str) -> None:
        cid = context.id if isinstance(context, Context) else context
        self._client.request("DELETE", f"{self._path}/contexts/{cid}")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        except NotFoundError:
            pass
        except Exception:
            # Already gone (410) or the server is down: nothing left to kill.
            if exc[0] is None:
                raise


class AsyncCommands:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def run(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        background: bool = False,
        stdin: str | bytes | None = None,
    ) -> Any:
        """As :meth:`Commands.run`; ``background=True`` gives an :class:`AsyncCommandHandle`."""
        c = self._s._client
        path = f"{self._s._path}/exec"
        http_timeout = None if timeout is None else timeout + 30
        if background:
            info = (await c.request("POST", path, json_body=_exec_body(cmd, env, cwd, timeout, stdin, "background"))).json()
            return AsyncCommandHandle(self._s, int(info["id"]))
        if on_stdout is None and on_stderr is None:
            r = await c.request("POST", path, json_body=_exec_body(cmd, env, cwd, timeout, stdin, "sync"), timeout=http_timeout)
            return Stage.from_json(r.json())
        out, err = bytearray(), bytearray()
        async for ev in c.stream_lines("POST", path, _exec_body(cmd, env, cwd, timeout, stdin, "stream"), timeout=http_timeout):
            kind = ev.get("event")
            if kind in ("stdout", "stderr"):
                from .results import _data

                b, _ = _data(ev.get("data"))
                (out if kind == "stdout" else err).extend(b)
                h = on_stdout if kind == "stdout" else on_stderr
                if h is not None:
                    h(b.decode("utf-8", "replace"))
            elif kind == "exit":
                res = dict(ev["result"])
                res["stdout"] = {"data": out.decode("utf-8", "replace"), "encoding": "utf-8", "bytes": len(out)}
                res["stderr"] = {"data": err.decode("utf-8", "replace"), "encoding": "utf-8", "bytes": len(err)}
                return Stage.from_json(res)
        from .errors import PalisadeError

        raise PalisadeError("the command's stream ended without its exit")


class AsyncCommandHandle:
    def __init__(self, sandbox: AsyncSandbox, exec_id: int) -> None:
        self.sandbox = sandbox
        self.pid = exec_id

    async def poll(self) -> Stage | None:
        info = (await self.sandbox._client.request("GET", f"{self.sandbox._path}/exec/{self.pid}")).json()
        return None if info.get("running") else Stage.from_json(info["result"])

    async def wait(self, on_stdout: OutputHandler | None = None, on_stderr: OutputHandler | None = None) -> Stage:
        delay = 0.01
        while True:
            r = await self.poll()
            if r is not None:
                return _finish(r, on_stdout, on_stderr)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def kill(self, signal: int | str = 9) -> None:
        await self.sandbox._client.request("POST", f"{self.sandbox._path}/exec/{self.pid}/signal", json_body={"signal": signal})


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._s = sandbox

    async def read(self, path: str, format: str = "text") -> Any:
        b = (await self._s._client.request("GET", f"{self._s._path}/files/{_url_path(path)}")).content
        return b if format == "bytes" else b.decode("utf-8", "replace")

    async def write(self, path: str, data: str | bytes) -> None:
        b = data.encode() if isinstance(data, str) else data
        await self._s._client.request("PUT", f"{self._s._path}/files/{_url_path(path)}", content=b)

    async def download(self, path: str, dest: str | os.PathLike[str]) -> int:
        """As :meth:`Files.download`."""
        with _Landing(dest) as out:
            n = await self._s._client.stream_to(f"{self._s._path}/files/{_url_path(path)}", out)
            out.done()
        return n

    async def download_archive(
        self, path: str, dest: str | os.PathLike[str], strict: bool = False, max_bytes: int = 1 << 30
    ) -> int:
        """As :meth:`Files.download_archive`."""
        params = {"path": _rel(path), "strict": "true" if strict else "false", "max_bytes": str(max_bytes)}
        with _Landing(dest) as out:
            n = await self._s._client.stream_to(f"{self._s._path}/archive", out, params=params)
            out.done()
        return n

    async def list(self, path: str = ".") -> Listing:
        """The directory's entries; ``.truncated`` when it held more than one answer carries."""
        d = (await self._s._client.request("GET", f"{self._s._path}/files", params={"path": _rel(path)})).json()
        return _listing(d)

    async def remove(self, path: str, recursive: bool = True) -> None:
        await self._s._client.request(
            "DELETE", f"{self._s._path}/files/{_url_path(path)}", params={"recursive": "true" if recursive else "false"}
        )


class AsyncSandbox:
    """The asynchronous :class:`Sandbox`: ``sbx = await AsyncSandbox.create(...)``, or
    ``async with AsyncSandbox.create(...) as sbx`` (awaiting is done by ``async with``)."""

    def __init__(self, client: AsyncClient, sandbox_id: str, workspace: str | None = None) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self._path = f"/v1/sandboxes/{sandbox_id}"
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.report: dict[str, Any] | None = None
        self._workspace = AsyncWorkspace(self, workspace) if workspace is not None else None

    @property
    def workspace(self) -> AsyncWorkspace:
        """The workspace's changes (a sandbox made with ``workspace=``)."""
        if self._workspace is None:
            from .errors import PalisadeError

            raise PalisadeError(f"sandbox {self.sandbox_id} was not made on a workspace (AsyncSandbox.create(workspace=DIR))")
        return self._workspace

    @classmethod
    async def create(
        cls,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        limits: Limits | None = None,
        allow_net: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        policy: str | os.PathLike[str] | None = None,
        url: str | None = None,
        client: AsyncClient | None = None,
        workspace: str | os.PathLike[str] | None = None,
    ) -> AsyncSandbox:
        """As :class:`Sandbox`, ``workspace=`` included."""
        ws: str | None = None
        if workspace is not None:
            own = _uses_own_server(url, client)
            ws = _workspace_path(workspace, own)
            if own:
                client = workspace_async_client(ws)
        c = client if client is not None else AsyncClient(url) if url is not None else default_async_client()
        body = _session_body(timeout, idle_timeout, limits, allow_net, env, labels, idempotency_key, policy, ws)
        info = (await c.request("POST", "/v1/sandboxes", json_body=body)).json()
        return cls(c, str(info["id"]), info.get("workspace") or ws)

    @classmethod
    async def connect(cls, sandbox_id: str, *, url: str | None = None, client: AsyncClient | None = None) -> AsyncSandbox:
        c = client if client is not None else AsyncClient(url) if url is not None else default_async_client()
        info = (await c.request("GET", f"/v1/sandboxes/{sandbox_id}")).json()
        return cls(c, sandbox_id, info.get("workspace"))

    async def kill(self) -> dict[str, Any] | None:
        r = (await self._client.request("DELETE", self._path)).json()
        self.report = r.get("report")
        if self._workspace is not None:
            self._workspace.change_set_id = _change_set_of(self.report) or self._workspace.change_set_id
        return self.report

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        context: Context | str | None = None,
        timeout: float | None = None,
        output_bytes: int | None = None,
    ) -> Execution:
        body: dict[str, Any] = {"code": code, "language": language}
        if context is not None:
            body["context"] = context.id if isinstance(context, Context) else context
        if timeout is not None:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        if output_bytes is not None:
            body["output_bytes"] = output_bytes
        r = await self._client.request(
            "POST", f"{self._path}/run_code", json_body=body, timeout=None if timeout is None else timeout + 30
        )
        return Execution.from_json(r.json())

    async def create_code_context(self, cwd: str | None = None, language: str = "python") -> Context:
        body: dict[str, Any] = {"language": language}
        if cwd is not None and _rel(cwd) != ".":
            body["cwd"] = _rel(cwd)
        d = (await self._client.request("POST", f"{self._path}/contexts", json_body=body)).json()
        return Context(d["id"], d["language"], d["cwd"])

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.kill()
        except NotFoundError:
            pass
        except Exception:
            if exc[0] is None:
                raise


_default: Client | None = None
_default_async: dict[int, AsyncClient] = {}


def default_client() -> Client:
    """The process's shared client (``$PALISADE_URL``, else the embedded server)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


def default_async_client() -> AsyncClient:
    """The shared async client of the running event loop (an httpx.AsyncClient is bound to
    one loop)."""
    loop = id(asyncio.get_running_loop())
    c = _default_async.get(loop)
    if c is None:
        c = _default_async[loop] = AsyncClient()
    return c


def _quote(argv: Sequence[str]) -> str:
    return shlex.join(argv)
