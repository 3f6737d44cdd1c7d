"""The OpenAI Agents SDK's sandbox client on palisade, with the real `openai-agents` package:
every session call (create, exec, write, read, persist then hydrate into a new session, resume
by id and after the session is gone, delete), what it does not support refused with the SDK's
own error, a host secret and a host the policy does not allow refused (and in the report), and a
`SandboxAgent` run by the SDK's `Runner` with a scripted model (no LLM) whose shell tool runs
inside."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents.sandbox.errors import (
    ConfigurationError,
    ExecTimeoutError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshotSpec

import palisade
from palisade.executors.openai_agents import (
    PalisadeSandboxClient,
    PalisadeSandboxClientOptions,
    PalisadeSandboxSession,
)

from test_executors import REACH, _denied

OPTIONS = PalisadeSandboxClientOptions(allow_net=("allowed.test",), timeout=300)


def _inner(s: SandboxSession) -> PalisadeSandboxSession:
    inner = s._inner
    assert isinstance(inner, PalisadeSandboxSession)
    return inner


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            t.addfile(info)
    return buf.getvalue()


def test_session_calls(client: palisade.Client, secret: Path) -> None:
    async def main() -> dict[str, Any] | None:
        c = PalisadeSandboxClient(client=client)
        s = await c.create(options=OPTIONS)
        await s.start()
        assert await s.running()
        sid = _inner(s).sandbox.sandbox_id
        # exec: through `sh -lc`, in the workspace; a non-zero exit is a result; the timeout.
        r = await s.exec("echo hi; pwd")
        assert (r.exit_code, r.stdout, r.stderr) == (0, b"hi\n/workspace\n", b"")
        r = await s.exec("echo oops >&2; exit 3")
        assert (r.exit_code, r.stderr) == (3, b"oops\n")
        r = await s.exec("sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "c", shell=False)
        assert r.stdout == b"a b|c|"
        with pytest.raises(ExecTimeoutError):
            await s.exec("sleep 30", timeout=0.5)
        # write / read, relative to the workspace root or absolute under it.
        await s.write(Path("src/main.py"), io.BytesIO(b"print('hi')\n"))
        assert (await s.read(Path("/workspace/src/main.py"))).read() == b"print('hi')\n"
        assert (await s.exec("python3 src/main.py")).stdout == b"hi\n"
        with pytest.raises(WorkspaceReadNotFoundError):
            await s.read(Path("src/nope.py"))
        # The SDK's own helpers, built on exec.
        assert {e.path.rsplit("/", 1)[-1] for e in await s.ls("src")} >= {"main.py"}
        # persist: a tar with workspace-relative names.
        archive = await s.persist_workspace()
        with tarfile.open(fileobj=archive) as t:
            assert set(t.getnames()) == {"src", "src/main.py"}
        archive.seek(0)
        # hydrate into a new session.
        s2 = await c.create(options=OPTIONS)
        await s2.start()
        await s2.hydrate_workspace(archive)
        assert (await s2.exec("python3 src/main.py")).stdout == b"hi\n"
        assert _inner(s2).sandbox.sandbox_id != sid
        await c.delete(s2)
        assert not await s2.running()
        # resume by id, from the serialized state, in another client: the same live session.
        payload = json.loads(json.dumps(c.serialize_session_state(s.state)))
        c2 = PalisadeSandboxClient(client=client)
        s3 = await c2.resume(c2.deserialize_session_state(payload))
        await s3.start()
        assert _inner(s3).sandbox.sandbox_id == sid
        assert (await s3.read(Path("src/main.py"))).read() == b"print('hi')\n"
        # A host secret: outside the workspace for the SDK's file API, absent for a command.
        with pytest.raises(InvalidManifestPathError):
            await s3.read(secret)
        r = await s3.exec(f"cat {secret}; python3 -c '{REACH.strip()}\nprint(reach)'")
        out = (r.stdout + r.stderr).decode()
        assert "TOP-SECRET" not in out and "No such file" in out and "refused" in out, out
        # delete: the session is gone, its report kept; deleting again is fine.
        await c2.delete(s3)
        assert not await s.running()
        await c.delete(s)
        return _inner(s3).report

    report = asyncio.run(main())
    assert ("other.test", "not-allowed") in _denied(report)


def test_resume_after_the_session_is_gone_restores_the_snapshot(client: palisade.Client, tmp_path: Path) -> None:
    async def main() -> None:
        c = PalisadeSandboxClient(client=client)
        s = await c.create(options=OPTIONS, snapshot=LocalSnapshotSpec(base_path=tmp_path))
        async with s:
            await s.write(Path("notes/a.txt"), io.BytesIO(b"kept"))
        # Leaving `async with` persisted the workspace to the local snapshot.
        assert list(tmp_path.glob("*.tar"))
        old = _inner(s).sandbox.sandbox_id
        await c.delete(s)
        s2 = await c.resume(c.deserialize_session_state(c.serialize_session_state(s.state)))
        await s2.start()
        assert _inner(s2).sandbox.sandbox_id != old
        assert (await s2.read(Path("notes/a.txt"))).read() == b"kept"
        await c.delete(s2)

    asyncio.run(main())


def test_what_palisade_does_not_support_is_refused(client: palisade.Client) -> None:
    async def main() -> None:
        c = PalisadeSandboxClient(client=client)
        with pytest.raises(ConfigurationError, match="manifest.root '/srv/app' is not supported"):
            await c.create(manifest=Manifest(root="/srv/app"), options=OPTIONS)
        s = await c.create(manifest=Manifest(root="/workspace/app"), options=OPTIONS)
        try:
            await s.start()
            # A root under /workspace works: the commands' working directory, the files' root.
            assert (await s.exec("pwd")).stdout == b"/workspace/app\n"
            await s.write(Path("x.txt"), io.BytesIO(b"x"))
            assert _inner(s).sandbox.files.read("app/x.txt") == "x"
            with pytest.raises(ConfigurationError, match="another user"):
                await s.exec("id", user="nobody")
            with pytest.raises(ConfigurationError, match="another user"):
                await s.read(Path("x.txt"), user="nobody")
            assert not s.supports_pty()
            with pytest.raises(ConfigurationError, match="PTY sessions are not supported"):
                await s.pty_exec_start("sh")
            # A symbolic link cannot go into a palisade archive: refused, not lost.
            assert (await s.exec("ln -s x.txt link")).exit_code == 0
            with pytest.raises(WorkspaceArchiveReadError) as e:
                await s.persist_workspace()
            assert e.value.context["reason"] == "palisade_archive_skipped_entries"
            assert "`link`" in e.value.context["message"]
            with pytest.raises(WorkspaceArchiveWriteError, match="palisade refused"):
                await s.hydrate_workspace(io.BytesIO(_tar({"y.txt": b"y"}, links={"l": "y.txt"})))
            # ... and nothing of the refused archive was written.
            assert (await s.exec("test -e y.txt")).exit_code == 1
            # An archive that would escape: the SDK's own check refuses it first.
            with pytest.raises(WorkspaceArchiveWriteError):
                await s.hydrate_workspace(io.BytesIO(_tar({"../escape.txt": b"e"})))
        finally:
            await c.delete(s)

    asyncio.run(main())


def test_runner_drives_a_sandbox_agent(client: palisade.Client, secret: Path) -> None:
    """The SDK's Runner with a scripted model: its shell tool (`exec_command`) runs inside."""
    from agents import RunConfig, Runner
    from agents.items import ModelResponse, TResponseStreamEvent
    from agents.models.interface import Model
    from agents.run_config import SandboxRunConfig
    from agents.sandbox.capabilities import Shell
    from agents.sandbox.sandbox_agent import SandboxAgent
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    cmds = [
        "echo from-the-agent > out.txt && tr a-z A-Z < out.txt",
        f"cat {secret} || echo no-secret; python3 -c '{REACH.strip()}\nprint(reach)'",
    ]

    class Scripted(Model):
        """Fixed tool calls, then a final message: no LLM, no network."""

        def __init__(self) -> None:
            self.n = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            self.n += 1
            if self.n <= len(cmds):
                call = ResponseFunctionToolCall(
                    type="function_call",
                    name="exec_command",
                    arguments=json.dumps({"cmd": cmds[self.n - 1]}),
                    call_id=f"call-{self.n}",
                    id=f"fc-{self.n}",
                    status="completed",
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            msg = ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
            return ModelResponse(output=[msg], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
            raise NotImplementedError("the scripted model does not stream")

    async def main() -> tuple[list[str], dict[str, Any] | None]:
        c = PalisadeSandboxClient(client=client)
        s = await c.create(options=OPTIONS)
        try:
            agent = SandboxAgent(name="t", instructions="run it", model=Scripted(), capabilities=[Shell()])
            cfg = RunConfig(sandbox=SandboxRunConfig(client=c, session=s), tracing_disabled=True)
            res = await Runner.run(agent, "go", run_config=cfg, max_turns=5)
            assert res.final_output == "done"
            outs = [str(i.output) for i in res.new_items if i.type == "tool_call_output_item"]
            assert (await s.read(Path("out.txt"))).read() == b"from-the-agent\n"
        finally:
            await c.delete(s)
        return outs, _inner(s).report

    outs, report = asyncio.run(main())
    assert len(outs) == 2, outs
    assert "FROM-THE-AGENT" in outs[0]
    assert "TOP-SECRET" not in outs[1] and "no-secret" in outs[1] and "refused" in outs[1], outs[1]
    assert ("other.test", "not-allowed") in _denied(report)
