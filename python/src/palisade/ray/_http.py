"""A small HTTP client for one node's own ``palisade serve``, over its unix socket or loopback TCP.

Private to ``palisade.ray``: the standard library only, one connection per call (the server is
on the same host, so a connection costs a few microseconds), bodies bounded by the server's own
``--max-body``/``--max-fetch`` and by ``max_response`` here.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any, Optional


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """Calls one server at ``address``: ``unix:/path`` or ``HOST:PORT`` (loopback)."""

    def __init__(self, address: str, token: Optional[str] = None,
                 max_response: int = 64 << 20):
        if address.startswith("unix:"):
            self._unix: Optional[str] = address[len("unix:"):]
            self._host, self._port = "", 0
        else:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"address {address!r}: give unix:PATH or HOST:PORT")
            self._unix, self._host, self._port = None, host, int(port)
        self._token = token
        self._max = max_response
        self.address = address

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                timeout: float = 600.0, headers: Optional[dict[str, str]] = None) -> Response:
        if self._unix is not None:
            conn: http.client.HTTPConnection = _UnixConnection(self._unix, timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if self._token:
            h["Authorization"] = f"Bearer {self._token}"
        h.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read(self._max + 1)
            if len(data) > self._max:
                raise ValueError(f"{method} {path}: the answer is larger than {self._max} bytes")
            return Response(r.status, data, {k.lower(): v for k, v in r.getheaders()})
        finally:
            conn.close()

    def post_json(self, path: str, obj: Any, timeout: float = 600.0) -> Response:
        return self.request("POST", path, json.dumps(obj).encode(), timeout=timeout)

    def get(self, path: str, timeout: float = 30.0) -> Response:
        return self.request("GET", path, timeout=timeout)
