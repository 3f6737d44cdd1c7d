"""Each executor, driven by its real framework from PyPI, runs inside palisade: state across
steps, files, and an attempt to read a host secret and to reach a host the policy does not
allow, refused (and the egress attempt in the report)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import palisade

REACH = textwrap.dedent(
    """
    import urllib.request
    try:
        urllib.request.urlopen("http://other.test/", timeout=10)
        reach = "reached"
    except Exception as e:
        reach = "refused: %s" % e
    """
)


def _read(path: Path) -> str:
    return textwrap.dedent(
        f"""
        try:
            secret = open({str(path)!r}).read()
        except Exception as e:
            secret = "refused: %s" % type(e).__name__
        """
    )


def _denied(report: dict[str, Any] | None) -> list[tuple[str, str]]:
    assert report is not None
    return [(e["host"], e["reason"]) for e in report["network"]["events"] if e["decision"] == "denied"]


def test_smolagents_code_agent(client: palisade.Client, secret: Path) -> None:
    from smolagents import CodeAgent
    from smolagents.models import ChatMessage, MessageRole, Model

    from palisade.executors.smolagents import PalisadeExecutor

    steps = [
        "x = 20\nprint('x is', x)",
        _read(secret) + REACH + "y = x + 22\nprint(secret, '|', reach)",
        "final_answer({'y': y, 'secret': secret, 'reach': reach})",
    ]

    class Scripted(Model):  # type: ignore[misc]
        """A model that answers fixed code steps: no LLM."""

        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.n = 0

        def generate(self, messages: Any, **kwargs: Any) -> ChatMessage:
            code = steps[self.n]
            self.n += 1
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: step {self.n}\n<code>\n{code}\n</code>")

    ex = PalisadeExecutor(allow_net=["allowed.test"])
    agent = CodeAgent(tools=[], model=Scripted(), executor=ex, max_steps=5, code_block_tags=("<code>", "</code>"))
    answer = agent.run("compute y")
    assert answer["y"] == 42
    assert answer["secret"].startswith("refused: ") and "TOP-SECRET" not in str(answer)
    assert answer["reach"].startswith("refused: ")
    # send_variables: the agent's state arrives in the sandbox's interpreter.
    ex.send_variables({"sent": [1, 2, 3]})
    assert ex.sandbox.run_code("sum(sent)").text == "6"
    report = ex.sandbox.kill()
    assert ("other.test", "not-allowed") in _denied(report)


def test_deepagents_file_tools_and_shell(client: palisade.Client, secret: Path) -> None:
    from palisade.executors.deepagents import PalisadeSandbox

    be = PalisadeSandbox(allow_net=["allowed.test"])
    try:
        # deepagents' own file operations, built on our execute/upload/download.
        w = be.write("/workspace/notes/a.txt", "alpha\nbeta\n")
        assert w.error is None, w
        r = be.read("/workspace/notes/a.txt")
        assert "alpha" in str(r) and "beta" in str(r)
        e = be.edit("/workspace/notes/a.txt", "beta", "gamma")
        assert e.error is None, e
        assert be.download_files(["/workspace/notes/a.txt"])[0].content == b"alpha\ngamma\n"
        ls = be.ls("/workspace/notes")
        assert "a.txt" in str(ls)
        g = be.grep("gamma", "/workspace")
        assert "a.txt" in str(g)
        gl = be.glob("**/*.txt", "/workspace")
        assert "a.txt" in str(gl)
        # Outside /workspace, through a command inside the sandbox.
        assert be.upload_files([("/tmp/x/y.txt", b"tmp")])[0].error is None
        assert be.download_files(["/tmp/x/y.txt"])[0].content == b"tmp"
        assert be.download_files(["/workspace/nope"])[0].error == "file_not_found"
        # The host's secret and a host not on the allow-list: refused.
        d = be.download_files([str(secret)])[0]
        assert d.content is None and d.error == "file_not_found"
        out = be.execute(f"cat {secret}; python3 -c '{REACH.strip()}\nprint(reach)'")
        assert "TOP-SECRET" not in out.output and "No such file" in out.output and "refused" in out.output
        assert be.execute("exit 7").exit_code == 7
    finally:
        report = be.sandbox.kill()
    assert ("other.test", "not-allowed") in _denied(report)


def test_deepagents_agent_uses_the_backend(client: palisade.Client) -> None:
    """deepagents' agent graph with our backend: its file tools run in the sandbox."""
    from deepagents import create_deep_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from palisade.executors.deepagents import PalisadeSandbox

    class Fake(GenericFakeChatModel):  # type: ignore[misc]
        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    msgs = iter(
        [
            AIMessage(content="", tool_calls=[{"name": "write_file", "args": {"file_path": "/workspace/out.txt", "content": "from the agent"}, "id": "1"}]),
            AIMessage(content="", tool_calls=[{"name": "execute", "args": {"command": "cat /workspace/out.txt | tr a-z A-Z"}, "id": "2"}]),
            AIMessage(content="done"),
        ]
    )
    be = PalisadeSandbox()
    try:
        agent = create_deep_agent(model=Fake(messages=msgs), backend=be)
        res = agent.invoke({"messages": [{"role": "user", "content": "write it"}]})
        tool_out = [m.content for m in res["messages"] if getattr(m, "type", "") == "tool"]
        assert any("FROM THE AGENT" in str(t) for t in tool_out), tool_out
        assert be.sandbox.files.read("out.txt") == "from the agent"
    finally:
        be.sandbox.kill()


def test_autogen_code_executor(client: palisade.Client, secret: Path) -> None:
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock

    from palisade.executors.autogen import PalisadeCodeExecutor

    async def main() -> dict[str, Any] | None:
        ex = PalisadeCodeExecutor(allow_net=["allowed.test"])
        await ex.start()
        tok = CancellationToken()
        r = await ex.execute_code_blocks([CodeBlock(code="n = 6", language="python"), CodeBlock(code="print(n * 7)", language="python")], tok)
        assert (r.exit_code, r.output) == (0, "42\n")
        r = await ex.execute_code_blocks([CodeBlock(code="echo sh; exit 2", language="sh")], tok)
        assert (r.exit_code, r.output) == (2, "sh\n")
        r = await ex.execute_code_blocks([CodeBlock(code=_read(secret) + REACH + "print(secret, reach)", language="python")], tok)
        assert "TOP-SECRET" not in r.output and r.output.count("refused") == 2, r.output
        r = await ex.execute_code_blocks([CodeBlock(code="1/0", language="python")], tok)
        assert r.exit_code == 1 and "ZeroDivisionError" in r.output
        assert ex.sandbox is not None
        report = await asyncio.to_thread(ex.sandbox.kill)
        ex.sandbox = None
        return report

    assert ("other.test", "not-allowed") in _denied(asyncio.run(main()))
