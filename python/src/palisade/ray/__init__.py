"""palisade on a Ray cluster: one ``palisade serve`` per node, runs spread with back-pressure.

The model (docs/scale-out.md): a :class:`NodePool` places one actor on every alive node
(node-affinity scheduling, never soft); each actor checks its host with ``palisade doctor`` and
either refuses work with the doctor's reason or starts the node's own ``palisade serve``. A run
is a request to one node's server, carrying its :class:`Policy` (limits, egress allow rules,
variables); that node's server checks it against its own ceiling and its sandbox enforces it, so
no node trusts the driver. :meth:`NodePool.run_batch` keeps at most ``concurrency`` runs in
flight on each node (the node's slots), reads the items lazily, and yields results in order, or
as they finish with ``ordered=False``.

Faults, as the driver sees them:

- a run the driver had not sent, or that a node refused before starting it (busy, shutting down,
  a host the doctor failed), is sent to another node;
- a run sent to a node that went away before answering (its raylet or worker died) *may have
  run*: it is reported as ``status == "lost"`` — never as a program result — unless the caller
  said ``idempotent=True``, in which case it is run again elsewhere;
- each item gets exactly one result.

Example::

    import ray, palisade.ray as pr
    ray.init()
    pool = pr.NodePool(concurrency_per_node=4)
    items = [{"command": ["sh", "-c", f"exit {i % 3}"]} for i in range(100)]
    for r in pool.run_batch(items, policy=pr.Policy(limits={"timeout_ms": 5000})):
        print(r.index, r.status, r.exit_code, r.node_id)
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._node import PalisadeNode

__all__ = ["NodePool", "Policy", "Result", "Session", "NoNodeAvailable", "NodeRefused",
           "SessionLost", "run_batch", "default_pool"]

# The request-level limits a server accepts (docs/server.md, `limits`).
_LIMITS = ("timeout_ms", "cpu_time_ms", "memory_bytes", "pids", "output_bytes", "open_files",
           "file_size_bytes", "tmp_bytes", "scratch_bytes", "cpus")
# Ray errors that mean the actor (its worker, its node) is gone or unreachable.
_GONE = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
         ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)


class NoNodeAvailable(RuntimeError):
    """Every node is gone or refuses work; the message holds each node's reason."""


class NodeRefused(RuntimeError):
    """The node cannot take this call (its host cannot enforce a policy, or it stopped)."""


class SessionLost(RuntimeError):
    """The node holding the session went away; the session and its files are gone with it."""


@dataclass(frozen=True)
class Policy:
    """What every run of a batch gets, sent with each request and enforced by the node's own
    server within its ceiling (a request above it is ``policy-denied`` there, not here).

    ``limits``: any of ``timeout_ms``, ``cpu_time_ms``, ``memory_bytes``, ``pids``,
    ``output_bytes``, ``open_files``, ``file_size_bytes``, ``tmp_bytes``, ``scratch_bytes``,
    ``cpus``. ``allow_net``: egress allow rules (each one of the servers' own). ``env``:
    variables set inside."""

    limits: dict[str, float] = field(default_factory=dict)
    allow_net: Sequence[str] = ()  # kept as a tuple
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.limits, dict):
            raise TypeError(f"policy.limits: {self.limits!r}: give a dict")
        for k, v in self.limits.items():
            if k not in _LIMITS:
                raise ValueError(f"policy.limits.{k}: unknown limit; accepted: {', '.join(_LIMITS)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"policy.limits.{k}: {v!r}: give a non-negative number")
        if isinstance(self.allow_net, str) or not all(isinstance(a, str) for a in self.allow_net):
            raise ValueError(f"policy.allow_net: {self.allow_net!r}: give a list of host rules")
        object.__setattr__(self, "allow_net", tuple(self.allow_net))
        for name, value in self.env.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(f"policy.env.{name}: {value!r}: give string names and values")

    @classmethod
    def of(cls, p: Any) -> "Policy":
        if p is None:
            return cls()
        if isinstance(p, Policy):
            return p
        if isinstance(p, dict):
            unknown = set(p) - {"limits", "allow_net", "env"}
            if unknown:
                raise ValueError(f"policy.{sorted(unknown)[0]}: unknown field; accepted: limits, allow_net, env")
            return cls(**p)
        raise TypeError(f"policy: {p!r}: give a palisade.ray.Policy or a dict")

    def request(self, item: Any, where: str) -> dict[str, Any]:
        """The request for ``item`` (a request dict, or an argv list) with this policy on it. An
        item may add limits the policy leaves open, never change one it sets."""
        if isinstance(item, (list, tuple)):
            if not item or not all(isinstance(a, str) for a in item):
                raise ValueError(f"{where}: {item!r}: give a non-empty argv of strings or a request dict")
            req: dict[str, Any] = {"command": list(item)}
        elif isinstance(item, dict):
            req = json.loads(json.dumps(item))  # a copy, and only JSON in it
        else:
            raise TypeError(f"{where}: {item!r}: give a request dict or an argv list")
        if self.limits:
            limits = req.setdefault("limits", {})
            for k, v in self.limits.items():
                if k in limits and limits[k] != v:
                    raise ValueError(f"{where}.limits.{k}: {limits[k]!r}: the policy sets it to {v!r}")
                limits[k] = v
        if self.allow_net:
            if "allow_net" in req and list(req["allow_net"]) != list(self.allow_net):
                raise ValueError(f"{where}.allow_net: {req['allow_net']!r}: the policy sets it to {list(self.allow_net)!r}")
            req["allow_net"] = list(self.allow_net)
        if self.env:
            env = req.setdefault("env", {})
            for name, value in self.env.items():
                if name in env and env[name] != value:
                    raise ValueError(f"{where}.env.{name}: {env[name]!r}: the policy sets it to {value!r}")
                env[name] = value
        return req


@dataclass
class Result:
    """One item's result. ``status`` is the server's (``ok``, ``exit``, ``signal``, ``timeout``,
    ``cpu-timeout``, ``oom``, ``output-limit``, ``policy-denied``, ``sandbox-error``), or
    ``invalid`` (the node refused the request as malformed: see ``error``), or ``lost`` (the
    node went away while the run was on it: whether it ran is unknown)."""

    index: int
    status: str
    node_id: Optional[str]
    attempts: int
    response: dict[str, Any]

    @property
    def exit_code(self) -> Optional[int]:
        return self.response.get("exit_code")

    @property
    def stdout(self) -> str:
        return _text(self.response.get("stdout"))

    @property
    def stderr(self) -> str:
        return _text(self.response.get("stderr"))

    @property
    def error(self) -> Optional[dict[str, Any]]:
        return self.response.get("error")

    @property
    def report(self) -> Optional[dict[str, Any]]:
        return self.response.get("report")


def _text(d: Any) -> str:
    if not d:
        return ""
    if d.get("encoding") == "utf-8":
        data = d["data"]
        if not isinstance(data, str):
            raise ValueError(f"output data: {data!r}: the server gave no string for utf-8 text")
        return data
    import base64
    return base64.b64decode(d["data"]).decode("utf-8", "replace")


_Actor = ray.remote(PalisadeNode)


@dataclass
class _Node:
    node_id: str
    actor: Any
    info: dict[str, Any]
    cap: int
    load: int = 0
    usable: bool = True
    reason: Optional[str] = None
    busy_until: float = 0.0


class NodePool:
    """One palisade actor on each alive node of the connected Ray cluster.

    ``concurrency_per_node``: sandboxes each node runs at once (its server's
    ``--max-concurrency``, and the runs the driver keeps in flight there). ``server_policy``: the
    TOML of the servers' policy (each request's defaults and ceiling, docs/server.md).
    ``listen``: ``"unix"`` (a private socket) or ``"tcp"`` (a loopback port, for clients on the
    node such as veRL's SandboxFusion reward path: see :meth:`run_code_url`). ``nodes``: node ids
    to use (default: every alive node). ``shutdown_grace``: how long running sandboxes may
    finish when a node's server is stopped (the pool shut down, or the node's raylet gone). The
    servers use ``PALISADE_BIN`` as each node's
    environment has it, else ``palisade`` on its ``PATH``."""

    def __init__(self, concurrency_per_node: int = 4, *, server_policy: Optional[str] = None,
                 listen: str = "unix", server_args: Iterable[str] = (), max_queue: int = 64,
                 nodes: Optional[Iterable[str]] = None, ready_timeout: float = 120.0,
                 shutdown_grace: float = 10.0):
        if not isinstance(concurrency_per_node, int) or concurrency_per_node < 1:
            raise ValueError(f"concurrency_per_node: {concurrency_per_node!r}: give an integer >= 1")
        if listen not in ("unix", "tcp"):
            raise ValueError(f"listen: {listen!r}: give 'unix' or 'tcp'")
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        if nodes is not None:
            wanted = list(nodes)
            missing = [n for n in wanted if n not in alive]
            if missing:
                raise ValueError(f"nodes: {missing[0]!r} is not an alive node of this cluster")
            alive = wanted
        if not alive:
            raise NoNodeAvailable("the Ray cluster has no alive node")
        # Ray's annotations give a handle's methods no ``.remote``: the handles are Any here.
        actors: dict[str, Any] = {}
        for node_id in alive:
            actors[node_id] = _Actor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                # The sandboxes are the node's own (its cgroup ceilings), not Ray CPU tasks.
                num_cpus=0,
                # Runs, plus room for session calls and info/stop beside them.
                max_concurrency=concurrency_per_node + 16,
                max_restarts=0,
                max_task_retries=0,
            ).remote(concurrency_per_node, max_queue, server_policy, listen, list(server_args),
                     ready_timeout, shutdown_grace)
        self._nodes: dict[str, _Node] = {}
        for node_id, actor in actors.items():
            try:
                info: dict[str, Any] = ray.get(actor.info.remote(), timeout=ready_timeout + 60)
            except _GONE as e:
                info = {"state": "gone", "reason": f"its actor died at start: {e}"}
            node = _Node(node_id, actor, info, concurrency_per_node)
            if info.get("state") != "ready":
                node.usable = False
                node.reason = info.get("reason")
            self._nodes[node_id] = node

    def nodes(self) -> list[dict[str, Any]]:
        """Each node: ``node_id``, ``state`` (``ready``, ``refusing``, ``gone``), ``reason``."""
        out: list[dict[str, Any]] = []
        for n in self._nodes.values():
            state = n.info.get("state", "gone") if n.usable else (
                "refusing" if n.info.get("state") == "refusing" else "gone")
            out.append({"node_id": n.node_id, "state": state,
                        "reason": n.reason, "hostname": n.info.get("hostname"),
                        "address": n.info.get("address")})
        return out

    def actor(self, node_id: str) -> Any:
        """The actor of ``node_id`` (for calls of your own: ``call`` takes method, path, body)."""
        return self._nodes[node_id].actor

    def run_code_url(self, node_id: str) -> str:
        """The SandboxFusion-compatible ``/run_code`` URL of ``node_id``'s server (loopback: for
        clients on that node; ``listen="tcp"`` only)."""
        n = self._nodes[node_id]
        addr = n.info.get("address") or ""
        if not n.usable or addr.startswith("unix:") or not addr:
            raise NodeRefused(f"node {node_id}: no loopback server ({n.reason or addr}); "
                              "make the pool with listen='tcp'")
        return f"http://{addr}/run_code"

    def run(self, item: Any, policy: Any = None, idempotent: bool = False) -> Result:
        """One run; see :meth:`run_batch`."""
        return next(iter(self.run_batch([item], policy=policy, idempotent=idempotent)))

    def run_batch(self, items: Iterable[Any], policy: Any = None, *, idempotent: bool = False,
                  ordered: bool = True, window: Optional[int] = None) -> Iterator[Result]:
        """Runs every item (a request dict as ``POST /v1/run`` takes it, or an argv list) with
        ``policy`` on it, at most ``concurrency_per_node`` at once on each usable node, and
        yields one :class:`Result` per item: in the items' order (``ordered=True``), or as they
        finish. Items are read as slots free up; with ``ordered=True`` at most ``window`` results
        (default 8 × the cluster's slots, at least 256) wait for an earlier one.

        ``idempotent``: a run whose node was lost while it was there is run again elsewhere
        instead of being reported as ``lost``."""
        pol = Policy.of(policy)
        return _Batch(self, iter(items), pol, idempotent, ordered, window).results()

    def session(self, node_id: Optional[str] = None, **create: Any) -> "Session":
        """A session (``POST /v1/sandboxes`` with ``create``'s fields) on ``node_id``, or on the
        least loaded usable node; every call of it goes to that node."""
        cands = [n for n in self._nodes.values() if n.usable]
        if node_id is not None:
            cands = [n for n in cands if n.node_id == node_id]
            if not cands:
                n = self._nodes.get(node_id)
                raise NodeRefused(f"node {node_id}: " + (
                    (n.reason or "it takes no work") if n else "not in this pool"))
        if not cands:
            raise NoNodeAvailable(self._reasons())
        node = min(cands, key=lambda n: n.load)
        out = _call(node, "POST", "/v1/sandboxes", json.dumps(create).encode())
        if out["status"] != 201:
            raise RuntimeError(f"creating a session on node {node.node_id}: HTTP {out['status']}: "
                               f"{out['body'][:2000].decode('utf-8', 'replace')}")
        return Session(node, json.loads(out["body"]))

    def shutdown(self) -> None:
        """Stops every node's server and its actor."""
        refs = []
        for n in self._nodes.values():
            try:
                refs.append(n.actor.stop.remote())
            except _GONE:
                pass
        for r in refs:
            try:
                ray.get(r, timeout=60)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                pass
        for n in self._nodes.values():
            try:
                ray.kill(n.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
            n.usable = False
            n.reason = n.reason or "the pool was shut down"

    def _reasons(self) -> str:
        return "no node can take work: " + "; ".join(
            f"{n.node_id[:12]}: {n.reason or 'no free slot'}" for n in self._nodes.values())

    def __enter__(self) -> "NodePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _call(node: _Node, method: str, path: str,
          body: Optional[bytes] = None) -> dict[str, Any]:
    try:
        out: dict[str, Any] = ray.get(node.actor.call.remote(method, path, body))
    except _GONE as e:
        node.usable = False
        node.reason = f"its actor is gone: {type(e).__name__}"
        raise SessionLost(f"node {node.node_id} went away: {e}") from None
    if out["outcome"] == "refused":
        raise NodeRefused(f"node {node.node_id}: {out['reason']}")
    if out["outcome"] == "lost":
        raise SessionLost(f"node {node.node_id}: {out['reason']}")
    return out


class Session:
    """A session on one node (docs/server.md, sessions): every call goes to the node that holds
    it. If that node goes away the session is gone (:class:`SessionLost`), never re-created
    elsewhere behind the caller's back."""

    def __init__(self, node: _Node, created: dict[str, Any]):
        self._node = node
        self.id: str = created["id"]
        self.created = created
        self.node_id = node.node_id

    def _json(self, method: str, path: str, obj: Any = None,
              ok: tuple[int, ...] = (200,)) -> Any:
        body = None if obj is None else json.dumps(obj).encode()
        out = _call(self._node, method, f"/v1/sandboxes/{self.id}{path}", body)
        if out["status"] not in ok:
            raise RuntimeError(f"session {self.id}{path}: HTTP {out['status']}: "
                               f"{out['body'][:2000].decode('utf-8', 'replace')}")
        return json.loads(out["body"]) if out["body"] else None

    def exec(self, command: Sequence[str], **fields: Any) -> dict[str, Any]:
        """Runs ``command`` in the session and waits: the stage (``exit_code``, ``stdout``...)."""
        stage = self._json("POST", "/exec", dict(fields, command=list(command)))
        if not isinstance(stage, dict):
            raise RuntimeError(f"session {self.id}/exec: the answer is not a JSON object: {stage!r:.2000}")
        return stage

    def write_file(self, path: str, data: bytes) -> None:
        out = _call(self._node, "PUT", f"/v1/sandboxes/{self.id}/files/{path}", data)
        if out["status"] not in (200, 201, 204):
            raise RuntimeError(f"session {self.id}: writing {path}: HTTP {out['status']}: "
                               f"{out['body'][:2000].decode('utf-8', 'replace')}")

    def read_file(self, path: str) -> bytes:
        out = _call(self._node, "GET", f"/v1/sandboxes/{self.id}/files/{path}")
        if out["status"] != 200:
            raise RuntimeError(f"session {self.id}: reading {path}: HTTP {out['status']}: "
                               f"{out['body'][:2000].decode('utf-8', 'replace')}")
        body = out["body"]
        if not isinstance(body, bytes):
            raise RuntimeError(f"session {self.id}: reading {path}: the node gave {type(body).__name__}, not bytes")
        return body

    def close(self) -> Any:
        """Destroys the session: its final report."""
        return self._json("DELETE", "")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except (SessionLost, NodeRefused, RuntimeError):
            pass


# An item waiting to be sent: (index, request, attempts so far).
_Job = tuple[int, dict[str, Any], int]


class _Batch:
    def __init__(self, pool: NodePool, items: Iterator[Any], policy: Policy, idempotent: bool,
                 ordered: bool, window: Optional[int]):
        self.pool = pool
        self.items = items
        self.policy = policy
        self.idempotent = idempotent
        self.ordered = ordered
        slots = sum(n.cap for n in pool._nodes.values() if n.usable)
        self.window = window if window is not None else max(256, 8 * slots)
        self.next_index = 0          # the next item to read
        self.exhausted = False
        self.retry: collections.deque[_Job] = collections.deque()
        self.inflight: dict[Any, tuple[int, dict[str, Any], int, _Node]] = {}  # by object ref
        self.done: dict[int, Result] = {}  # ordered mode's buffer
        self.next_out = 0

    def _take(self) -> Optional[_Job]:
        if self.retry:
            return self.retry.popleft()
        if self.exhausted:
            return None
        if self.ordered and self.next_index >= self.next_out + self.window:
            return None
        try:
            item = next(self.items)
        except StopIteration:
            self.exhausted = True
            return None
        i = self.next_index
        self.next_index += 1
        return (i, self.policy.request(item, f"items[{i}]"), 0)

    def _dispatch(self) -> None:
        now = time.monotonic()
        nodes = [n for n in self.pool._nodes.values() if n.usable and n.busy_until <= now]
        # Fill the least loaded nodes first, one run at a time, so work spreads evenly.
        while True:
            free = [n for n in nodes if n.load < n.cap and n.usable]
            if not free:
                return
            job = self._take()
            if job is None:
                return
            node = min(free, key=lambda n: n.load)
            i, req, attempts = job
            ref = node.actor.run.remote(req)
            node.load += 1
            self.inflight[ref] = (i, req, attempts + 1, node)

    def _finish(self, r: Result) -> list[Result]:
        if not self.ordered:
            return [r]
        self.done[r.index] = r
        out: list[Result] = []
        while self.next_out in self.done:
            out.append(self.done.pop(self.next_out))
            self.next_out += 1
        return out

    def results(self) -> Iterator[Result]:
        emitted = 0
        while True:
            self._dispatch()
            if not self.inflight:
                if not self.retry and self.exhausted:
                    break
                pending = [n for n in self.pool._nodes.values() if n.usable]
                if not pending:
                    raise NoNodeAvailable(self.pool._reasons())
                # Every usable node is cooling down after a 429: wait for the first.
                time.sleep(max(0.0, min(n.busy_until for n in pending) - time.monotonic()))
                continue
            ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                i, req, attempts, node = self.inflight.pop(ref)
                node.load -= 1
                try:
                    out = ray.get(ref)
                except _GONE as e:
                    node.usable = False
                    node.reason = f"it went away during the batch ({type(e).__name__})"
                    out = {"outcome": "lost", "reason": f"node {node.node_id} went away: {e}"}
                if out["outcome"] == "done":
                    resp = out["response"]
                    for r in self._finish(Result(i, resp.get("status", "sandbox-error"),
                                                 node.node_id, attempts, resp)):
                        emitted += 1
                        yield r
                elif out["outcome"] == "retry":
                    if out.get("busy"):
                        node.busy_until = time.monotonic() + 1.0
                    else:
                        node.usable = False
                        node.reason = out.get("reason")
                    self.retry.appendleft((i, req, attempts))
                elif out["outcome"] == "lost":
                    if self.idempotent:
                        self.retry.appendleft((i, req, attempts))
                    else:
                        lost = {"status": "lost", "error": {"code": "node-lost",
                                                            "message": out["reason"]}}
                        for r in self._finish(Result(i, "lost", node.node_id, attempts, lost)):
                            emitted += 1
                            yield r
                else:
                    raise RuntimeError(f"unknown outcome from node {node.node_id}: {out!r}")
        assert not self.done, f"results left unyielded: {sorted(self.done)[:5]}"
        assert emitted == self.next_index, (emitted, self.next_index)


_default: Optional[NodePool] = None


def default_pool(**kwargs: Any) -> NodePool:
    """The pool :func:`run_batch` uses without one: made on first use with ``kwargs``."""
    global _default
    if _default is None:
        _default = NodePool(**kwargs)
    return _default


def run_batch(items: Iterable[Any], policy: Any = None, *, pool: Optional[NodePool] = None,
              idempotent: bool = False, ordered: bool = True) -> Iterator[Result]:
    """:meth:`NodePool.run_batch` on ``pool``, or on :func:`default_pool`."""
    return (pool or default_pool()).run_batch(items, policy=policy, idempotent=idempotent,
                                              ordered=ordered)
