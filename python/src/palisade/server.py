"""Finding the ``palisade`` binary and running a private ``palisade serve`` for this process.

With no URL, the SDK starts ``palisade serve --listen unix:SOCKET`` in a fresh directory of its
own (``mkdtemp``: owned by this user, mode 0700; the socket itself is 0600), waits until it
answers, and stops it at exit: ``atexit``, a finalizer when the :class:`EmbeddedServer` is
collected, and ``stop()``. SIGTERM lets the server destroy its sandboxes itself; after
``grace`` seconds it is killed."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from .errors import BinaryNotFoundError, ServerStartError


def find_binary(path: str | os.PathLike[str] | None = None) -> str:
    """The ``palisade`` binary: ``path``, else ``$PALISADE_BIN``, else ``palisade`` on ``PATH``."""
    for candidate, origin in ((path, "binary="), (os.environ.get("PALISADE_BIN"), "PALISADE_BIN")):
        if candidate:
            p = os.fspath(candidate)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
            raise BinaryNotFoundError(f"{origin} names {p!r}, which is not an executable file")
    found = shutil.which("palisade")
    if found is None:
        raise BinaryNotFoundError(
            "no `palisade` binary: put it on PATH (cargo install --path crates/palisade-cli, or "
            "a release build), or set PALISADE_BIN to its path, or pass url= / PALISADE_URL to "
            "use a running `palisade serve`"
        )
    return found


def _stop(proc: subprocess.Popen[bytes], directory: str, grace: float) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except (ProcessLookupError, OSError):
            pass
    shutil.rmtree(directory, ignore_errors=True)


class EmbeddedServer:
    """A private ``palisade serve`` on a unix socket, stopped at exit."""

    def __init__(
        self,
        *,
        binary: str | os.PathLike[str] | None = None,
        policy: str | os.PathLike[str] | None = None,
        args: list[str] | None = None,
        start_timeout: float = 30.0,
        grace: float = 15.0,
    ) -> None:
        exe = find_binary(binary)
        self.directory = tempfile.mkdtemp(prefix="palisade-sdk-")
        os.chmod(self.directory, 0o700)
        self.socket = str(Path(self.directory) / "palisade.sock")
        log_path = Path(self.directory) / "serve.log"
        cmd = [exe, "serve", "--listen", f"unix:{self.socket}"]
        if policy is not None:
            cmd += ["--policy", os.fspath(policy)]
        cmd += list(args or [])
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # Its own process group: a Ctrl-C at the terminal reaches Python, which stops the
                # server in order (atexit), not both at once.
                start_new_session=True,
            )
        self._finalizer = weakref.finalize(self, _stop, self._proc, self.directory, grace)
        atexit.register(self._finalizer)
        deadline = time.monotonic() + start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                text = log_path.read_text(errors="replace").strip()
                self._finalizer()
                raise ServerStartError(text or f"palisade serve exited with {code}", exit_code=code)
            if os.path.exists(self.socket) and self._answers():
                break
            if time.monotonic() > deadline:
                self._finalizer()
                raise ServerStartError(f"palisade serve did not answer within {start_timeout} s")
            time.sleep(0.02)
        self.pid = self._proc.pid

    def _answers(self) -> bool:
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(2)
            s.connect(self.socket)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: palisade\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False
        finally:
            s.close()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        """Stops the server (its sandboxes are destroyed) and removes its directory."""
        self._finalizer()


_lock = threading.Lock()
_shared: EmbeddedServer | None = None


def shared_server() -> EmbeddedServer:
    """The process's shared embedded server, started on first use (again if it died)."""
    global _shared
    with _lock:
        if _shared is None or not _shared.alive:
            _shared = EmbeddedServer()
        return _shared


_workspace_servers: dict[str, EmbeddedServer] = {}


def workspace_server(directory: str) -> EmbeddedServer:
    """A private server that may open ``directory`` (canonical) as a workspace: ``palisade serve
    --workspace-root DIRECTORY``, one per directory, started on first use (again if it died) and
    kept until the process exits, so that a sandbox's change set can be reviewed and applied
    after the sandbox ended. The process that starts the server is its owner and names its own
    directories; a server started with roots could not be given more without a restart, which
    would end every sandbox on it: hence one per directory."""
    with _lock:
        srv = _workspace_servers.get(directory)
        if srv is None or not srv.alive:
            srv = _workspace_servers[directory] = EmbeddedServer(args=["--workspace-root", directory])
        return srv
