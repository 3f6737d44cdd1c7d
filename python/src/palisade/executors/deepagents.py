"""LangChain deepagents: ``create_deep_agent(..., backend=PalisadeSandbox())`` runs the agent's
shell (``execute``) and its file tools (ls, read, write, edit, grep, glob — deepagents builds
them on ``execute``, ``upload_files`` and ``download_files``) inside a palisade sandbox."""

from __future__ import annotations

import base64
from typing import Any

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from ..errors import InvalidRequestError, NotFoundError, ServerError
from ..sandbox import WORKDIR, Sandbox


def _file_error(e: ServerError) -> str:
    if isinstance(e, NotFoundError) or "not-found" in str(e.value or ""):
        return "file_not_found"
    if "not-regular" in str(e.value or "") or "directory" in e.message.lower():
        return "is_directory"
    if isinstance(e, InvalidRequestError):
        return "invalid_path"
    return "permission_denied"


class PalisadeSandbox(BaseSandbox):
    """A deepagents sandbox backend on a palisade session. ``sandbox`` reuses one; otherwise
    one is created with ``sandbox_kwargs`` (see :class:`palisade.Sandbox`). Files under
    ``/workspace`` move through palisade's file API (never through a symlink); files elsewhere
    in the sandbox's own tree (``/tmp``…) through a command inside it. ``timeout``: default
    seconds per command (default: the server's)."""

    def __init__(self, *, sandbox: Sandbox | None = None, timeout: float | None = None, **sandbox_kwargs: Any) -> None:
        self.sandbox = sandbox if sandbox is not None else Sandbox(**sandbox_kwargs)
        self.default_timeout = timeout

    @property
    def id(self) -> str:
        return self.sandbox.sandbox_id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        r = self.sandbox.commands.run(
            ["sh", "-c", command + " 2>&1"], timeout=float(timeout) if timeout is not None else self.default_timeout
        )
        out = r.stdout + r.stderr
        if r.status == "timeout":
            out += f"\n[palisade: the command ran past its timeout and was killed]"
        return ExecuteResponse(output=out, exit_code=r.exit_code, truncated=r.truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, data in files:
            try:
                if path.startswith(WORKDIR + "/") or not path.startswith("/"):
                    self.sandbox.files.write(path, data)
                else:
                    r = self.sandbox.commands.run(
                        ["sh", "-c", 'mkdir -p "$(dirname "$1")" && base64 -d > "$1"', "upload", path],
                        stdin=base64.b64encode(data),
                        timeout=self.default_timeout,
                    )
                    if r.exit_code != 0:
                        out.append(FileUploadResponse(path=path, error="permission_denied"))
                        continue
                out.append(FileUploadResponse(path=path, error=None))
            except ServerError as e:
                out.append(FileUploadResponse(path=path, error=_file_error(e)))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            try:
                if path.startswith(WORKDIR + "/") or not path.startswith("/"):
                    data = self.sandbox.files.read(path, format="bytes")
                else:
                    r = self.sandbox.commands.run(
                        ["sh", "-c", 'test -d "$1" && exit 3; test -f "$1" || exit 2; base64 < "$1"', "download", path],
                        timeout=self.default_timeout,
                    )
                    if r.exit_code != 0:
                        err = {2: "file_not_found", 3: "is_directory"}.get(r.exit_code or 0, "permission_denied")
                        out.append(FileDownloadResponse(path=path, content=None, error=err))
                        continue
                    data = base64.b64decode(r.stdout)
                out.append(FileDownloadResponse(path=path, content=data, error=None))
            except ServerError as e:
                out.append(FileDownloadResponse(path=path, content=None, error=_file_error(e)))
        return out

    def close(self) -> None:
        """Kills the sandbox."""
        self.sandbox.kill()
