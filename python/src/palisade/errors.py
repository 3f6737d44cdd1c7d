"""The SDK's exceptions. Every error the server answers becomes a :class:`ServerError` subclass
carrying the server's own body unchanged (``code``, ``field``, ``value``, ``accepted``,
``message``); ``str(e)`` is the server's message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PalisadeError(Exception):
    """Base of every error this SDK raises."""


class BinaryNotFoundError(PalisadeError):
    """No ``palisade`` binary: neither ``PALISADE_BIN`` nor one on ``PATH``."""


class ServerStartError(PalisadeError):
    """The embedded ``palisade serve`` did not start; ``message`` is what it printed (a policy
    file it refused, a cgroup it could not use) unchanged."""

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class ServerUnavailableError(PalisadeError):
    """The server cannot be reached (dead, never started, wrong URL or socket)."""


class RequestTimeoutError(PalisadeError, TimeoutError):
    """The server did not answer within the client's own deadline."""


class ServerError(PalisadeError):
    """A 4xx/5xx answer of the server, with its error body passed through unchanged."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.body = body
        self.code: str = str(body.get("code", ""))
        self.field: str | None = body.get("field")
        self.value: str | None = body.get("value")
        self.accepted: str | None = body.get("accepted")
        self.message: str = str(body.get("message", ""))
        self.retry_after: int | None = body.get("retry_after")
        super().__init__(self.message)


class InvalidRequestError(ServerError):
    """400: a malformed request; ``field`` names it and ``accepted`` says what is."""


class UnknownLanguageError(InvalidRequestError):
    """400 ``unknown-language``: this server has no such language."""


class AuthError(ServerError):
    """401: a missing or wrong token."""


class PolicyError(ServerError):
    """403: the request asks for more than the server's policy (its ceiling) allows."""


class NotFoundError(ServerError):
    """404: no such sandbox, exec, context, file or endpoint."""


class ConflictError(ServerError):
    """409: in conflict with the sandbox's state (an exec that ended, a busy context)."""


@dataclass(frozen=True)
class HeldChange:
    """An entry of a change set that an apply held back: its path, what holds it (``refused``:
    never applied; ``conflict``: changed on the host since the session began, ``force=True``
    overrides; ``protected``: applied only when named in ``paths``; ``risky``:
    ``include_risky=True`` or named; ``other``), and why."""

    path: str
    kind: str
    reason: str


class WorkspaceConflictError(ConflictError):
    """409 ``held``: an apply was refused as a whole, nothing was applied. ``held`` lists the
    first entries held back (at most 50; ``held_count`` counts them all), ``conflicts`` those
    that changed on the host since the session began."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        super().__init__(status_code, body)
        self.held: list[HeldChange] = [
            HeldChange(str(h.get("path", "")), str(h.get("kind", "")), str(h.get("reason", "")))
            for h in body.get("held") or []
            if isinstance(h, dict)
        ]
        self.held_count: int = int(body.get("held_count") or len(self.held))

    @property
    def conflicts(self) -> list[HeldChange]:
        return [h for h in self.held if h.kind == "conflict"]


class ChangesNotReadyError(PalisadeError):
    """A workspace sandbox's changes were asked for while it still runs: they are kept when it
    ends (``kill()``, the end of its ``with`` block, its timeout)."""


class SandboxGoneError(ServerError):
    """410: the sandbox ended (TTL, idle timeout, deleted, a session-wide limit)."""


class TooLargeError(ServerError):
    """413: the request body is larger than the server accepts."""


class BusyError(ServerError):
    """429: the server's queue is full, or it holds its budget of bytes for replies (``field``
    is then ``--max-held``); ``retry_after`` says when to try again."""


class ShuttingDownError(ServerError):
    """503: the server is shutting down."""


class InternalServerError(ServerError):
    """500: palisade failed on the server's side."""


_BY_CODE: dict[str, type[ServerError]] = {
    "unknown-language": UnknownLanguageError,
    "ceiling": PolicyError,
    "not-allowed": PolicyError,
    "held": WorkspaceConflictError,
}
_BY_STATUS: dict[int, type[ServerError]] = {
    400: InvalidRequestError,
    401: AuthError,
    403: PolicyError,
    404: NotFoundError,
    409: ConflictError,
    410: SandboxGoneError,
    413: TooLargeError,
    429: BusyError,
    503: ShuttingDownError,
}


def error_from_response(status_code: int, payload: Any, text: str) -> ServerError:
    """The exception for an error answer: the server's body when it has one, else its text."""
    body: dict[str, Any]
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        body = payload["error"]
    else:
        body = {"code": "http", "message": f"HTTP {status_code}: {text[:500]}"}
    cls = _BY_CODE.get(str(body.get("code")), _BY_STATUS.get(status_code, InternalServerError))
    return cls(status_code, body)
