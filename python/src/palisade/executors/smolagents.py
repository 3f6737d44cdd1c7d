"""smolagents: ``CodeAgent(..., executor=PalisadeExecutor())`` runs every code step in a palisade
sandbox's persistent interpreter (one session per executor), with ``final_answer`` detection and
``send_variables`` / ``send_tools`` from smolagents' own :class:`RemotePythonExecutor`."""

from __future__ import annotations

import re

from collections.abc import Mapping, Sequence
from typing import Any

from smolagents.local_python_executor import CodeOutput  # type: ignore[import-untyped]
from smolagents.monitoring import AgentLogger, LogLevel  # type: ignore[import-untyped]
from smolagents.remote_executors import RemotePythonExecutor  # type: ignore[import-untyped]
from smolagents.tools import get_tools_definition_code  # type: ignore[import-untyped]
from smolagents.utils import AgentError  # type: ignore[import-untyped]

from ..sandbox import Sandbox

_IMPORT = re.compile(r"^(import [\w.]+( as \w+)?|from [\w.]+ import [\w, ]+)$")


def _guard_imports(code: str) -> str:
    out = []
    for line in code.splitlines():
        if _IMPORT.match(line):
            out += ["try:", "    " + line, "except ImportError:", "    pass"]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


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
        # What the caller asks for must be there; tools' requirements are best effort.
        self._strict_install = True
        self.installed_packages = self.install_packages(list(additional_imports))
        self._strict_install = False

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Installs what the sandbox lacks with pip (``--user``). Tools' requirements that the
        sandbox cannot install (no egress to an index: the default) are logged and skipped;
        code that needs them gets its ImportError inside, as the agent's own error."""
        missing = [p for p in additional_imports if not self._importable(p)]
        if missing:
            r = self.sandbox.commands.run(
                ["python3", "-m", "pip", "install", "--user", "--break-system-packages", "--retries", "0", "--timeout", "10", *missing]
            )
            if r.exit_code != 0:
                self.logger.log(f"palisade: could not install {missing} in the sandbox:\n{r.stdout}{r.stderr}")
                if getattr(self, "_strict_install", False):
                    raise AgentError(f"installing {missing} failed:\n{r.stderr}", self.logger)
        return list(additional_imports)

    def send_tools(self, tools: dict[str, Any]) -> None:
        """As smolagents' own, but a tool's module-level import of a package the sandbox lacks
        (smolagents hoists the imports of a tool's methods, optional ones included, to the top)
        does not fail the definitions: the method that needs it fails when called."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        reqs = sorted({p for t in tools.values() for p in t.to_dict()["requirements"]} - {"smolagents"} - set(self.installed_packages))
        if reqs:
            self.installed_packages += self.install_packages(reqs)
        code = get_tools_definition_code(tools)
        if code:
            self.logger.log(self.run_code_raise_errors(_guard_imports(code)).logs)

    def _importable(self, package: str) -> bool:
        module = {"pillow": "PIL", "scikit-learn": "sklearn"}.get(package.lower(), package).replace("-", "_")
        r = self.sandbox.commands.run(
            ["python3", "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)", module]
        )
        return bool(r.exit_code == 0)

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
