"""The per-node actor: owns this node's ``palisade serve`` and refuses work when the host cannot
enforce a policy.

At start the actor runs ``palisade doctor --json`` with the binary the node was given
(``PALISADE_BIN``, else ``palisade`` on ``PATH``). A doctor that is not healthy (user namespaces,
cgroups, Landlock, seccomp or the trial run missing) makes the node *refuse*: no server is
started and every call answers with the doctor's failing rows as the reason, so that no run is
ever made degraded. Otherwise it starts ``palisade serve`` on a unix socket in a private
directory (mode 0700) or on a loopback port, and waits for ``/readyz``. The server is a child of
a thread that lives as long as it does, with the parent-death signal set, so a worker that dies
(its raylet killed) takes its server with it; ``stop`` ends it with SIGTERM (the server winds its
sandboxes down itself).

Each method answers with a plain dict (``outcome`` plus data) and never raises for a run's own
failure, so the driver can tell "never started" (``retry``) from "ran" (``done``) from "may have
run" (``lost``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any, Optional

from ._http import Client

_PR_SET_PDEATHSIG = 1
# Stderr of the server kept for error messages (the tail only: it is the server's log).
_LOG_TAIL = 64 << 10


def find_binary() -> Optional[str]:
    """The palisade binary this node uses: ``PALISADE_BIN``, else ``palisade`` on ``PATH``."""
    b = os.environ.get("PALISADE_BIN")
    if b:
        return b
    return shutil.which("palisade")


def doctor_refusal(binary: str, timeout: float = 120.0) -> tuple[Optional[str], Any]:
    """Runs ``palisade doctor --json``: ``(None, report)`` when the host enforces everything, else
    ``(reason, report)`` with the failing rows (name, what the doctor found, its fix)."""
    try:
        p = subprocess.run([binary, "doctor", "--json"], capture_output=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"palisade doctor could not run ({binary}): {e}", None
    try:
        report = json.loads(p.stdout)
        checks = report["checks"]
        healthy = report["healthy"]
    except (ValueError, KeyError, TypeError):
        tail = p.stderr.decode("utf-8", "replace")[-2000:]
        return (f"palisade doctor ({binary}) exited {p.returncode} without its JSON report: "
                f"{tail.strip()}"), None
    if healthy is True and p.returncode == 0:
        return None, report
    rows = []
    for c in checks:
        if c.get("verdict") == "fail":
            row = f"{c.get('name')}: {c.get('detail')}"
            if c.get("fix"):
                row += f" (fix: {c['fix']})"
            rows.append(row)
    if not rows:
        rows.append(f"doctor exited {p.returncode} with healthy={healthy!r}")
    return "palisade doctor says this host cannot enforce a policy: " + "; ".join(rows), report


def _set_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(126)


class _Server:
    """One ``palisade serve`` child, its log tail and its address."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self._argv = argv
        self._env = env
        self._log = bytearray()
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._exited = threading.Event()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._keep, name="palisade-serve", daemon=True)
        self._thread.start()
        self._started.wait()
        if self.error:
            raise self.error

    def _keep(self) -> None:
        # This thread is the server's parent for the parent-death signal: it lives until the
        # server's stderr closes, so the signal fires only when the whole worker dies.
        try:
            self.proc = subprocess.Popen(self._argv, env=self._env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         preexec_fn=_set_pdeathsig)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor
            self.error = e
            self._started.set()
            return
        self._started.set()
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self._log += line
                if len(self._log) > _LOG_TAIL:
                    del self._log[: len(self._log) - _LOG_TAIL]
        self.proc.wait()
        self._exited.set()

    def log(self) -> str:
        with self._lock:
            return self._log.decode("utf-8", "replace")

    def exited(self) -> bool:
        return self._exited.is_set() or (self.proc is not None and self.proc.poll() is not None)

    def stop(self, grace: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace + 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class PalisadeNode:
    """Ray actor body (``palisade.ray`` wraps it with ``ray.remote``): one per node."""

    def __init__(self, concurrency: int, max_queue: int, server_policy: Optional[str],
                 listen: str, server_args: list[str], ready_timeout: float, shutdown_grace: float):
        import ray  # the actor runs inside a Ray worker

        self.node_id = ray.get_runtime_context().get_node_id()
        # The worker's parent is the node's raylet: when it dies the worker is re-parented but
        # lives on, still reachable by the driver; the watchdog then stops taking work.
        self._parent = os.getppid()
        self.hostname = socket.gethostname()
        self.concurrency = concurrency
        self._grace = shutdown_grace
        self.refusal: Optional[str] = None
        self.doctor: Any = None
        self.address: Optional[str] = None
        self._server: Optional[_Server] = None
        self._dir: Optional[str] = None
        self._client: Optional[Client] = None
        binary = find_binary()
        self.binary = binary
        if not binary:
            self.refusal = "no palisade binary on this node: set PALISADE_BIN or put palisade on PATH"
            return
        self.refusal, self.doctor = doctor_refusal(binary)
        if self.refusal:
            return
        self._dir = tempfile.mkdtemp(prefix="palisade-ray-")
        os.chmod(self._dir, 0o700)
        argv = [binary, "serve", "--max-concurrency", str(concurrency),
                "--max-queue", str(max_queue), "--shutdown-grace", f"{int(shutdown_grace * 1000)}ms"]
        if server_policy is not None:
            pf = os.path.join(self._dir, "policy.toml")
            with open(pf, "w") as f:
                f.write(server_policy)
            argv += ["--policy", pf]
        if listen == "unix":
            sock = os.path.join(self._dir, "palisade.sock")
            argv += ["--listen", f"unix:{sock}"]
        elif listen == "tcp":
            argv += ["--listen", "127.0.0.1:0"]
        else:
            raise ValueError(f"listen {listen!r}: give 'unix' or 'tcp'")
        argv += list(server_args)
        env = {k: v for k, v in os.environ.items()}
        try:
            self._server = _Server(argv, env)
        except OSError as e:
            self.refusal = f"palisade serve could not start ({binary}): {e}"
            return
        deadline = time.monotonic() + ready_timeout
        while True:
            if self._server.exited():
                self.refusal = ("palisade serve exited at start: "
                                + self._server.log()[-2000:].strip())
                return
            if listen == "unix" and os.path.exists(sock):
                self.address = f"unix:{sock}"
            elif listen == "tcp":
                addr = _listen_address(self._server.log())
                if addr:
                    self.address = addr
            if self.address:
                try:
                    client = Client(self.address)
                    if client.get("/readyz", timeout=5).status == 200:
                        self._client = client
                        threading.Thread(target=self._watch, name="palisade-raylet-watch",
                                         daemon=True).start()
                        break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self._server.stop(1)
                self.refusal = (f"palisade serve was not ready after {ready_timeout:.0f} s: "
                                + self._server.log()[-2000:].strip())
                return
            time.sleep(0.05)

    def _watch(self) -> None:
        while self._server is not None and not self._server.exited():
            if os.getppid() != self._parent:
                # The raylet is gone: this node is no longer part of the cluster. Take no new
                # run, and let the server wind down the running ones itself (its shutdown grace).
                self.refusal = (f"this node's raylet (pid {self._parent}) is gone; "
                                "its palisade serve was stopped")
                self._server.stop(self._grace)
                return
            time.sleep(0.2)

    def info(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "binary": self.binary,
            "state": "refusing" if self.refusal else "ready",
            "reason": self.refusal,
            "doctor": self.doctor,
            "address": self.address,
            "concurrency": self.concurrency,
            "pid": os.getpid(),
            "parent_pid": self._parent,
            "server_pid": self._server.proc.pid if self._server and self._server.proc else None,
        }

    def _gone(self) -> Optional[str]:
        if self.refusal:
            return self.refusal
        if self._server is None or self._server.exited():
            self.refusal = ("this node's palisade serve has exited: "
                            + (self._server.log()[-2000:].strip() if self._server else ""))
            return self.refusal
        return None

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One ``POST /v1/run``. ``outcome``: ``done`` (the server answered: a result or a refusal
        of this request), ``retry`` (nothing was started: busy, shutting down, or the node
        refuses), ``lost`` (the exchange broke after the request was sent: it may have run)."""
        reason = self._gone()
        if reason:
            return {"outcome": "retry", "refused": True, "reason": reason}
        assert self._client is not None
        body = json.dumps(request).encode()
        try:
            r = self._client.request("POST", "/v1/run", body, timeout=24 * 3600)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            # Refused at connect: nothing reached the server.
            reason = self._gone() or f"cannot reach this node's palisade serve: {e}"
            return {"outcome": "retry", "refused": True, "reason": reason}
        except (OSError, ValueError) as e:
            return {"outcome": "lost", "reason": f"the exchange with palisade serve broke: {e}"}
        return _classify(r.status, r.body, r.headers)

    def call(self, method: str, path: str, body: Optional[bytes] = None,
             timeout: float = 24 * 3600) -> dict[str, Any]:
        """Any other call (sessions, languages, metrics): the HTTP status and body as they are."""
        reason = self._gone()
        if reason:
            return {"outcome": "refused", "reason": reason}
        assert self._client is not None
        try:
            r = self._client.request(method, path, body, timeout=timeout)
        except (OSError, ValueError) as e:
            return {"outcome": "lost", "reason": f"the exchange with palisade serve broke: {e}"}
        return {"outcome": "done", "status": r.status, "body": r.body,
                "content_type": r.headers.get("content-type", "")}

    def stop(self) -> bool:
        if self._server is not None:
            self._server.stop(self._grace)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self.refusal = self.refusal or "stopped"
        return True


def _listen_address(log: str) -> Optional[str]:
    i = log.find("listen=")
    if i < 0:
        return None
    rest = log[i + len("listen="):]
    end = 0
    while end < len(rest) and not rest[end].isspace():
        end += 1
    if end == len(rest):
        return None
    return rest[:end].strip('"')


def _classify(status: int, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    try:
        j = json.loads(body) if body else {}
    except ValueError:
        j = {"error": {"code": "internal", "message": body[:2000].decode("utf-8", "replace")}}
    if status == 200:
        return {"outcome": "done", "response": j}
    if status in (429, 503):
        # Busy (the queue is full) or shutting down: the server started nothing.
        return {"outcome": "retry", "refused": status == 503, "busy": status == 429,
                "reason": json.dumps(j.get("error", j))}
    if status == 403 and j.get("status") == "policy-denied":
        return {"outcome": "done", "response": {"status": "policy-denied", "error": j.get("error")}}
    if 400 <= status < 500:
        return {"outcome": "done", "response": {"status": "invalid", "http_status": status,
                                                "error": j.get("error", j)}}
    return {"outcome": "done", "response": {"status": "sandbox-error", "http_status": status,
                                            "error": j.get("error", j)}}
