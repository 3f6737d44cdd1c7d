"""The HTTP clients (sync and async) and the request shapes they send.

A client talks to ``url`` (``http://HOST:PORT``, or ``unix:/path/to.sock``), else
``$PALISADE_URL``, else a private server this process starts (see :mod:`palisade.server`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Union

import httpx

from .errors import (
    PalisadeError,
    RequestTimeoutError,
    ServerUnavailableError,
    error_from_response,
)
from .results import RunResult
from .server import EmbeddedServer, shared_server

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Limits a request may ask for, named as the server names them (``timeout_ms``,
#: ``memory_bytes``, ``cpu_time_ms``, ``pids``, ``output_bytes``, ``open_files``,
#: ``file_size_bytes``, ``tmp_bytes``, ``scratch_bytes``, ``cpus``). Unknown names are refused by
#: the server (``unknown-field``).
Limits = Mapping[str, Union[int, float]]


@dataclass
class RunRequest:
    """One run: ``code`` in ``language``, or ``command`` (argv). Fields as in ``POST /v1/run``."""

    code: str | None = None
    language: str | None = "python"
    command: Sequence[str] | None = None
    args: Sequence[str] = ()
    stdin: str | bytes | None = None
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    fetch: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=dict)
    timeout: float | None = None
    allow_net: Sequence[str] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.command is not None:
            d["command"] = list(self.command)
        else:
            d["language"] = self.language
            d["code"] = self.code if self.code is not None else ""
        if self.args:
            d["args"] = list(self.args)
        if self.stdin is not None:
            d["stdin"] = content(self.stdin)
        if self.files:
            d["files"] = {k: content(v) for k, v in self.files.items()}
        if self.fetch:
            d["fetch"] = list(self.fetch)
        if self.env:
            d["env"] = dict(self.env)
        lim = merged_limits(self.limits, self.timeout)
        if lim:
            d["limits"] = lim
        if self.allow_net:
            d["allow_net"] = list(self.allow_net)
        return d


def content(v: str | bytes) -> Any:
    """File or stdin content on the wire: text as is, bytes as ``{"base64": ...}``."""
    if isinstance(v, bytes):
        import base64

        return {"base64": base64.b64encode(v).decode()}
    return v


def merged_limits(limits: Limits | None, timeout: float | None) -> dict[str, Any]:
    d: dict[str, Any] = dict(limits or {})
    if timeout is not None:
        d["timeout_ms"] = max(1, int(timeout * 1000))
    return d


def policy_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A request's policy from a TOML file: its ``[limits]`` table (the server's names,
    ``timeout_ms``, ``memory_bytes``…), ``allow_net`` and ``[env]``. The values go to the
    server as they are; the server checks them against its ceiling and its error comes back
    unchanged. (A whole ``palisade run`` policy file is the server's: ``Client(policy=...)``.)"""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return dict(data)


RunItem = Union[str, RunRequest, Mapping[str, Any]]


def item_json(item: RunItem) -> dict[str, Any]:
    if isinstance(item, str):
        return RunRequest(code=item).to_json()
    if isinstance(item, RunRequest):
        return item.to_json()
    return dict(item)


def _base(url: str | None) -> tuple[str, str | None]:
    """(base URL, unix socket path or None)."""
    if url is None:
        url = os.environ.get("PALISADE_URL") or None
    if url is None:
        srv = shared_server()
        return "http://palisade", srv.socket
    if url.startswith("unix:"):
        return "http://palisade", url[len("unix:") :]
    return url.rstrip("/"), None


def _raise_for(r: httpx.Response) -> None:
    if r.status_code >= 400:
        try:
            payload = r.json()
        except ValueError:
            payload = None
        raise error_from_response(r.status_code, payload, r.text)


class _Base:
    def __init__(
        self,
        url: str | None,
        token: str | None,
        timeout: float,
        policy: str | os.PathLike[str] | None,
        server_args: list[str] | None,
    ) -> None:
        self.embedded: EmbeddedServer | None = None
        self.socket: str | None
        if policy is not None or server_args:
            if url is not None or os.environ.get("PALISADE_URL"):
                raise PalisadeError("policy= and server_args= configure the SDK's own server: not with url= / PALISADE_URL")
            self.embedded = EmbeddedServer(policy=policy, args=server_args)
            self.base, self.socket = "http://palisade", self.embedded.socket
        else:
            self.base, self.socket = _base(url)
        self.token = token if token is not None else os.environ.get("PALISADE_TOKEN")
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _timeout(self, seconds: float | None) -> httpx.Timeout:
        t = self.timeout if seconds is None else seconds
        return httpx.Timeout(t, connect=10.0)


class Client(_Base):
    """A synchronous client of ``palisade serve``.

    ``url``: ``http://HOST:PORT`` or ``unix:/path``; default ``$PALISADE_URL``, else a private
    server started for this process. ``policy``: a policy file for a private server of this
    client's own (``palisade serve --policy``; the server checks it and its error is raised
    unchanged as :class:`~palisade.errors.ServerStartError`). ``timeout``: the HTTP deadline,
    seconds, for calls that name none."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 660.0,
        policy: str | os.PathLike[str] | None = None,
        server_args: list[str] | None = None,
    ) -> None:
        super().__init__(url, token, timeout, policy, server_args)
        transport = httpx.HTTPTransport(uds=self.socket) if self.socket else None
        self.http = httpx.Client(
            base_url=self.base, transport=transport, headers=self._headers(), timeout=self._timeout(None)
        )

    def close(self) -> None:
        self.http.close()
        if self.embedded is not None:
            self.embedded.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            r = self.http.request(
                method, path, json=json_body, content=content, params=params, timeout=self._timeout(timeout)
            )
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"{method} {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise ServerUnavailableError(f"{method} {path}: the server cannot be reached ({e})") from e
        _raise_for(r)
        return r

    def stream_to(
        self, path: str, out: BinaryIO, timeout: float | None = None, params: dict[str, str] | None = None
    ) -> int:
        """A GET whose body goes into ``out`` piece by piece; the bytes written. A body that ends
        short of its ``Content-Length`` (the file changed while the server read it), or a chunked
        one without its last chunk (an archive cut short), raises."""
        n, want, started = 0, None, False
        try:
            with self.http.stream("GET", path, params=params, timeout=self._timeout(timeout)) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                want, started = r.headers.get("content-length"), True
                for piece in r.iter_raw():
                    out.write(piece)
                    n += len(piece)
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"GET {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise _short(path, n, want, e, started) from e
        return n

    def stream_lines(
        self, method: str, path: str, json_body: Any, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """NDJSON lines of a streamed answer (keep-alive blank lines skipped)."""
        try:
            with self.http.stream(method, path, json=json_body, timeout=self._timeout(timeout)) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"{method} {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise ServerUnavailableError(f"{method} {path}: the server cannot be reached ({e})") from e

    def run(self, item: RunItem, timeout: float | None = None) -> RunResult:
        return RunResult.from_json(self.request("POST", "/v1/run", json_body=item_json(item), timeout=timeout).json())

    def iter_batch(
        self, items: Iterable[RunItem], concurrency: int | None = None, timeout: float | None = None
    ) -> Iterator[tuple[int, RunResult]]:
        body: dict[str, Any] = {"runs": [item_json(i) for i in items]}
        if concurrency is not None:
            body["concurrency"] = concurrency
        for line in self.stream_lines("POST", "/v1/run/batch", body, timeout=timeout):
            yield int(line["index"]), RunResult.from_json(line["result"])

    def run_batch(
        self, items: Iterable[RunItem], concurrency: int | None = None, timeout: float | None = None
    ) -> list[RunResult]:
        runs = list(items)
        out: list[RunResult | None] = [None] * len(runs)
        for i, r in self.iter_batch(runs, concurrency, timeout):
            out[i] = r
        missing = [i for i, r in enumerate(out) if r is None]
        if missing:
            raise PalisadeError(f"the batch's answer ended without runs {missing[:10]}")
        return [r for r in out if r is not None]


class AsyncClient(_Base):
    """The asynchronous client (httpx.AsyncClient); the same arguments as :class:`Client`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 660.0,
        policy: str | os.PathLike[str] | None = None,
        server_args: list[str] | None = None,
        max_connections: int = 100,
    ) -> None:
        super().__init__(url, token, timeout, policy, server_args)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        transport = (
            httpx.AsyncHTTPTransport(uds=self.socket, limits=limits)
            if self.socket
            else httpx.AsyncHTTPTransport(limits=limits)
        )
        self.http = httpx.AsyncClient(
            base_url=self.base, transport=transport, headers=self._headers(), timeout=self._timeout(None)
        )

    async def aclose(self) -> None:
        await self.http.aclose()
        if self.embedded is not None:
            self.embedded.stop()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            r = await self.http.request(
                method, path, json=json_body, content=content, params=params, timeout=self._timeout(timeout)
            )
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"{method} {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise ServerUnavailableError(f"{method} {path}: the server cannot be reached ({e})") from e
        _raise_for(r)
        return r

    async def stream_to(
        self, path: str, out: BinaryIO, timeout: float | None = None, params: dict[str, str] | None = None
    ) -> int:
        n, want, started = 0, None, False
        try:
            async with self.http.stream("GET", path, params=params, timeout=self._timeout(timeout)) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for(r)
                want, started = r.headers.get("content-length"), True
                async for piece in r.aiter_raw():
                    out.write(piece)
                    n += len(piece)
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"GET {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise _short(path, n, want, e, started) from e
        return n

    async def stream_lines(
        self, method: str, path: str, json_body: Any, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self.http.stream(method, path, json=json_body, timeout=self._timeout(timeout)) as r:
                if r.status_code >= 400:
                    await r.aread()
                    _raise_for(r)
                async for line in r.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TimeoutException as e:
            raise RequestTimeoutError(f"{method} {path}: no answer within the client's deadline ({e})") from e
        except httpx.TransportError as e:
            raise ServerUnavailableError(f"{method} {path}: the server cannot be reached ({e})") from e

    async def run(self, item: RunItem, timeout: float | None = None) -> RunResult:
        r = await self.request("POST", "/v1/run", json_body=item_json(item), timeout=timeout)
        return RunResult.from_json(r.json())

    async def iter_batch(
        self, items: Iterable[RunItem], concurrency: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[tuple[int, RunResult]]:
        body: dict[str, Any] = {"runs": [item_json(i) for i in items]}
        if concurrency is not None:
            body["concurrency"] = concurrency
        async for line in self.stream_lines("POST", "/v1/run/batch", body, timeout=timeout):
            yield int(line["index"]), RunResult.from_json(line["result"])

    async def run_batch(
        self, items: Iterable[RunItem], concurrency: int | None = None, timeout: float | None = None
    ) -> list[RunResult]:
        runs = list(items)
        out: list[RunResult | None] = [None] * len(runs)
        async for i, r in self.iter_batch(runs, concurrency, timeout):
            out[i] = r
        missing = [i for i, r in enumerate(out) if r is None]
        if missing:
            raise PalisadeError(f"the batch's answer ended without runs {missing[:10]}")
        return [r for r in out if r is not None]


def _short(path: str, got: int, want: str | None, e: Exception, started: bool = True) -> PalisadeError:
    """A download that stopped: short of its length (the server cut it: the file was replaced,
    written or shrunk while read, or the session ended), an archive cut short, or the server
    unreachable before it began."""
    if want is not None:
        return PalisadeError(
            f"GET {path}: the download stopped after {got} of {want} bytes (the file was replaced, "
            f"written or shrunk while it was read, the session ended, or the connection broke: {e})"
        )
    if started:
        return PalisadeError(
            f"GET {path}: the download stopped after {got} bytes, before its end (a file shrank while "
            f"it was archived, an entry a strict archive cannot carry, the session ended, or the "
            f"connection broke: {e})"
        )
    return ServerUnavailableError(f"GET {path}: the server cannot be reached ({e})")
