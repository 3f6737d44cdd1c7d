"""AutoGen: :class:`PalisadeCodeExecutor` is an ``autogen_core`` ``CodeExecutor`` whose code
blocks run in a palisade sandbox (python in the sandbox's persistent interpreter; sh and bash
as commands)."""

from __future__ import annotations

import asyncio
from typing import Any

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult

from ..sandbox import Sandbox


class PalisadeCodeExecutor(CodeExecutor):
    """Runs AutoGen code blocks in a palisade sandbox, made at ``start()`` (or given)."""

    def __init__(self, *, sandbox: Sandbox | None = None, timeout: float = 60.0, **sandbox_kwargs: Any) -> None:
        self._given = sandbox
        self.sandbox: Sandbox | None = sandbox
        self.timeout = timeout
        self._kwargs = sandbox_kwargs

    async def start(self) -> None:
        if self.sandbox is None:
            self.sandbox = await asyncio.to_thread(lambda: Sandbox(**self._kwargs))

    async def stop(self) -> None:
        if self.sandbox is not None and self._given is None:
            s = self.sandbox
            self.sandbox = None
            await asyncio.to_thread(s.kill)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> CodeResult:
        if self.sandbox is None:
            await self.start()
        sbx = self.sandbox
        assert sbx is not None
        logs: list[str] = []
        for b in code_blocks:
            lang = b.language.lower()
            if lang in ("python", "py", "python3"):
                ex = await asyncio.to_thread(sbx.run_code, b.code, timeout=self.timeout)
                logs.append(ex.stdout + ex.stderr)
                if ex.error is not None:
                    logs.append(ex.error.traceback or f"{ex.error.name}: {ex.error.value}")
                    return CodeResult(exit_code=1, output="".join(logs))
            elif lang in ("sh", "bash", "shell"):
                r = await asyncio.to_thread(sbx.commands.run, [lang if lang != "shell" else "sh", "-c", b.code], timeout=self.timeout)
                logs.append(r.stdout + r.stderr)
                if r.exit_code != 0:
                    return CodeResult(exit_code=r.exit_code if r.exit_code is not None else 1, output="".join(logs))
            else:
                return CodeResult(exit_code=1, output=f"unsupported language {b.language!r}: python, sh, bash")
        return CodeResult(exit_code=0, output="".join(logs))
