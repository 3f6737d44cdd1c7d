"""smolagents: ``CodeAgent(..., executor=PalisadeExecutor())`` runs every code step in a palisade
sandbox's persistent interpreter (one session per executor), with ``final_answer`` detection and
``send_variables`` / ``send_tools`` from smolagents' own :class:`RemotePythonExecutor`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ..sandbox import Sandbox


class PalisadeExecutor(RemotePythonExecutor):  # type: ignore[misc]
    """Runs the agent's code in a palisade sandbox. ``sandbox`` reuses one; otherwise one is
    created with ``sandbox_kwargs`` (``timeout``, ``limits``, ``allow_net``…; see
    :class:`palisade.Sandbox`). ``cell_timeout``: seconds per code step."""

    def __init__(
        self,
        additional_imports: Sequence[str] = (),
        logger: AgentLogger | None = None,
        *,
        sandbox: Sandbox | None = None,
        cell_timeout: float | None = 60.0,
        allow_pickle: bool = False,
        **sandbox_kwargs: Any,
    ) -> None:
        super().__init__(list(additional_imports), logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self._own = sandbox is None
        self.sandbox = sandbox if sandbox is not None else Sandbox(**sandbox_kwargs)
        self.cell_timeout = cell_timeout
        self.installed_packages = self.install_packages(list(additional_imports))

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        if additional_imports:
            r = self.sandbox.commands.run(
                ["python3", "-m", "pip", "install", "--user", *additional_imports], timeout=300
            )
            if r.exit_code != 0:
                raise AgentError(f"installing {additional_imports} failed:\n{r.stderr}", self.logger)
        return list(additional_imports)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        ex = self.sandbox.run_code(code, timeout=self.cell_timeout)
        logs = ex.stdout + (ex.stderr if ex.stderr else "")
        if ex.error is not None:
            if ex.error.name == RemotePythonExecutor.FINAL_ANSWER_EXCEPTION:
                value = self._deserialize_final_answer(ex.error.value, self.allow_pickle)
                return CodeOutput(output=value, logs=logs, is_final_answer=True)
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{ex.error.name}\n{ex.error.value}\n{ex.error.traceback}",
                self.logger,
            )
        return CodeOutput(output=ex.text, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Kills the sandbox (when this executor made it)."""
        if self._own:
            try:
                self.sandbox.kill()
            except Exception:
                pass

    def __enter__(self) -> PalisadeExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def delete(self) -> None:
        self.cleanup()


__all__ = ["PalisadeExecutor", "Mapping"]
