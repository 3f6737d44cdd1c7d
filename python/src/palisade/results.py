"""What the server answers, as typed objects. Each keeps the server's JSON in ``raw``; a run's
``report`` is palisade's full report (docs/report.md), unchanged."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Iterable


def _data(d: Any) -> tuple[bytes, bool]:
    if not isinstance(d, dict):
        return b"", False
    text = str(d.get("data", ""))
    raw = base64.b64decode(text) if d.get("encoding") == "base64" else text.encode()
    return raw, bool(d.get("truncated", False))


@dataclass(frozen=True)
class Stage:
    """One stage of a run (compile, or a session's command)."""

    status: str
    exit_code: int | None
    signal: int | None
    wall_time_ms: float
    stdout_bytes: bytes
    stderr_bytes: bytes
    truncated: bool
    #: The output was cut (``output-limit``) because the server held its budget of bytes for
    #: replies (``--max-held``), not at the stage's own cap: try again later.
    cut_by_server: bool
    raw: dict[str, Any] = field(repr=False)

    @property
    def stdout(self) -> str:
        """stdout as text (bytes that are not UTF-8 replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr as text."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """It exited 0."""
        return self.status == "ok"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stage:
        out, t1 = _data(d.get("stdout"))
        err, t2 = _data(d.get("stderr"))
        return cls(
            status=str(d.get("status")),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            wall_time_ms=float(d.get("wall_time_ms") or 0.0),
            stdout_bytes=out,
            stderr_bytes=err,
            truncated=t1 or t2,
            cut_by_server=bool(d.get("cut_by_server", False)),
            raw=d,
        )


#: E2B's name for a session command's result.
CommandResult = Stage


@dataclass(frozen=True)
class RunResult:
    """The result of a one-shot run (``palisade.run``, a line of ``run_batch``).

    ``status`` is one of ``ok``, ``exit``, ``signal``, ``timeout``, ``cpu-timeout``, ``oom``,
    ``output-limit``, ``policy-denied``, ``sandbox-error``; ``sandbox-error`` is never the
    program's own result (``error`` says what failed)."""

    status: str
    exit_code: int | None
    signal: int | None
    wall_time_ms: float
    stdout_bytes: bytes
    stderr_bytes: bytes
    truncated: bool
    #: The output was cut (``output-limit``) because the server held its budget of bytes for
    #: replies (``--max-held``), not at the run's own cap: try again later.
    cut_by_server: bool
    compile: Stage | None
    files: dict[str, bytes]
    file_errors: dict[str, str]
    error: dict[str, Any] | None
    report: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def limits_hit(self) -> list[str]:
        """The limits that ended the run (``timeout``, ``cpu-timeout``, ``oom``,
        ``output-limit``), from the status and the report."""
        hit = []
        if self.status in ("timeout", "cpu-timeout", "oom", "output-limit"):
            hit.append(self.status)
        if self.report.get("oom_kills") and "oom" not in hit:
            hit.append("oom")
        if self.report.get("output_truncated") and "output-limit" not in hit:
            hit.append("output-limit")
        return hit

    @property
    def denied_egress(self) -> list[dict[str, Any]]:
        """Connections the egress proxy refused: the report's ``network.events`` whose
        ``decision`` is not ``allowed``."""
        net = self.report.get("network") or {}
        return [
            e
            for e in net.get("events") or []
            if isinstance(e, dict) and e.get("decision") != "allowed"
        ]

    @property
    def refused_calls(self) -> list[dict[str, Any]]:
        """System calls the seccomp filter refused (the report's ``denied_syscalls``)."""
        return [c for c in self.report.get("denied_syscalls") or [] if isinstance(c, dict)]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunResult:
        out, t1 = _data(d.get("stdout"))
        err, t2 = _data(d.get("stderr"))
        comp = d.get("compile")
        return cls(
            status=str(d.get("status")),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            wall_time_ms=float(d.get("wall_time_ms") or 0.0),
            stdout_bytes=out,
            stderr_bytes=err,
            truncated=t1 or t2,
            cut_by_server=bool(d.get("cut_by_server", False)),
            compile=Stage.from_json(comp) if isinstance(comp, dict) else None,
            files={k: _data(v)[0] for k, v in (d.get("files") or {}).items()},
            file_errors=dict(d.get("file_errors") or {}),
            error=d.get("error"),
            report=d.get("report") or {},
            raw=d,
        )


@dataclass(frozen=True)
class ExecutionError:
    """An error a cell raised: its type's name, its message, its traceback."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Execution:
    """The result of ``run_code``: a cell evaluated in a persistent interpreter.

    ``status``: ``ok``, ``error`` (see ``error``), ``timeout`` or ``exited`` (the interpreter
    was killed or ended; the context's variables are lost)."""

    context: str
    execution_count: int
    status: str
    stdout: str
    stderr: str
    text: str | None
    error: ExecutionError | None
    wall_time_ms: float
    restarted: bool
    truncated: bool
    raw: dict[str, Any] = field(repr=False)

    @property
    def value(self) -> str | None:
        """``repr()`` of the cell's last expression (E2B calls it ``text``)."""
        return self.text

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Execution:
        out, t1 = _data(d.get("stdout"))
        err, t2 = _data(d.get("stderr"))
        e = d.get("error")
        return cls(
            context=str(d.get("context")),
            execution_count=int(d.get("execution_count") or 0),
            status=str(d.get("status")),
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            text=d.get("value"),
            error=ExecutionError(str(e.get("name")), str(e.get("value")), str(e.get("traceback")))
            if isinstance(e, dict)
            else None,
            wall_time_ms=float(d.get("wall_time_ms") or 0.0),
            restarted=bool(d.get("restarted")),
            truncated=t1 or t2,
            raw=d,
        )


@dataclass(frozen=True)
class EntryInfo:
    """An entry of a directory listing."""

    name: str
    type: str
    size: int | None
    raw: dict[str, Any] = field(repr=False)


class Listing(list[EntryInfo]):
    """A directory listing: the entries, and ``truncated`` when the directory held more names than
    one answer carries (the server returns the first ones in name order)."""

    def __init__(self, entries: Iterable[EntryInfo] = (), truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated


@dataclass(frozen=True)
class Context:
    """A context of the code interpreter."""

    id: str
    language: str
    cwd: str


@dataclass(frozen=True)
class Change:
    """One changed path of a workspace's change set (docs/workspace.md).

    ``change``: ``added``, ``modified``, ``mode`` (permission bits only), ``deleted`` or
    ``replaced`` (a directory removed and recreated, or a file where a directory was); ``kind``:
    ``file``, ``dir``, ``symlink``, ``fifo``, ``socket``, ``device`` or ``none`` (deleted).
    ``refused``, ``conflict``, ``protected`` and ``risky`` say why an apply would hold it back.
    ``path`` is in palisade's form: UTF-8 as is, ``\\\\`` for a backslash, ``\\xNN`` for other
    bytes; give it back as it is to ``diff``/``apply``."""

    path: str
    change: str
    kind: str
    mode: int | None
    size: int
    target: str | None
    refused: str | None
    conflict: str | None
    protected: str | None
    risky: str | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Change:
        return cls(
            path=str(d.get("path")),
            change=str(d.get("change")),
            kind=str(d.get("kind")),
            mode=d.get("mode"),
            size=int(d.get("size") or 0),
            target=d.get("target"),
            refused=d.get("refused"),
            conflict=d.get("conflict"),
            protected=d.get("protected"),
            risky=d.get("risky"),
            raw=d,
        )


@dataclass(frozen=True)
class ChangeSet:
    """What a workspace session changed, kept when it ended: ``sbx.workspace.changes()``.

    ``summary`` has the counts (``entries``, ``added``, ``modified``, ``deleted``, ``mode``,
    ``replaced``, ``renamed``, ``symlinks``, ``refused``, ``conflicts``, ``protected``,
    ``risky``, ``bytes``) and ``first_paths``; ``renames`` pairs (from, to) found by contents;
    ``incomplete`` says why it cannot be applied, when the capture stopped at a bound."""

    id: str
    dir: str
    status: str
    entries: list[Change]
    summary: dict[str, Any]
    renames: list[tuple[str, str]]
    incomplete: str | None
    applied: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @property
    def paths(self) -> list[str]:
        """Every changed path, in tree order."""
        return [e.path for e in self.entries]

    def entry(self, path: str) -> Change | None:
        """The entry at ``path``, if it changed."""
        return next((e for e in self.entries if e.path == path), None)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChangeSet:
        m = d.get("change_set") or {}
        return cls(
            id=str(m.get("id")),
            dir=str(m.get("dir")),
            status=str((m.get("run") or {}).get("status")),
            entries=[Change.from_json(e) for e in d.get("entries") or [] if isinstance(e, dict)],
            summary=dict(m.get("summary") or {}),
            renames=[(str(r.get("from")), str(r.get("to"))) for r in m.get("renames") or [] if isinstance(r, dict)],
            incomplete=m.get("incomplete"),
            applied=m.get("applied"),
            raw=d,
        )


@dataclass(frozen=True)
class Diff:
    """A change set's unified diff in git's format (``git apply`` takes ``diff_bytes``).
    Binary files are summarized (``binary`` counts them); ``warnings`` names what a diff cannot
    show (refused entries, special files) and entries in conflict."""

    diff_bytes: bytes
    files: int
    binary: int
    warnings: list[str]
    raw: dict[str, Any] = field(repr=False)

    @property
    def text(self) -> str:
        """The diff as text (bytes that are not UTF-8 replaced)."""
        return self.diff_bytes.decode("utf-8", "replace")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Diff:
        b, _ = _data(d.get("diff"))
        return cls(
            diff_bytes=b,
            files=int(d.get("files") or 0),
            binary=int(d.get("binary") or 0),
            warnings=[str(w) for w in d.get("warnings") or []],
            raw=d,
        )


@dataclass(frozen=True)
class Applied:
    """What an apply did: entries applied, bytes written, the first paths, and where."""

    id: str
    dir: str
    entries: int
    bytes: int
    first_paths: list[str]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Applied:
        return cls(
            id=str(d.get("id")),
            dir=str(d.get("dir")),
            entries=int(d.get("entries") or 0),
            bytes=int(d.get("bytes") or 0),
            first_paths=[str(p) for p in d.get("first_paths") or []],
            raw=d,
        )
