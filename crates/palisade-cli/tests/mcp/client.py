"""Drives `palisade mcp` with the Python MCP SDK's own client (crates/palisade-cli/tests/mcp.rs).

Usage: client.py stdio PALISADE [CASE...]   (the SDK starts `PALISADE mcp` itself)
       client.py http URL [CASE...]         (a server already listening)

Each case prints `PASS name` or raises; any failure exits non-zero with the traceback. The
environment gives what the cases attack: PALISADE_SECRET (a host file with a secret in it).
"""

import json
import os
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {
    "run_code",
    "sandbox_create",
    "sandbox_exec",
    "sandbox_write_files",
    "sandbox_read_file",
    "sandbox_list_files",
    "sandbox_kill",
}


def sc(res):
    """The structured content, checked against the text mirror."""
    assert res.structured_content is not None, res
    assert res.content and res.content[0].type == "text", res.content
    if not res.is_error:
        assert json.loads(res.content[0].text) == res.structured_content
    return res.structured_content


def ok(res):
    assert not res.is_error, res.content[0].text
    return sc(res)


def err(res, field=None, code=None):
    assert res.is_error, f"expected a tool error, got {res.structured_content}"
    s = sc(res)
    e = s["error"]
    assert e["message"], s
    if field is not None:
        assert e.get("field") == field, f"field {e.get('field')!r} != {field!r}: {e}"
        assert field in e["message"] or field.split("[")[0] in e["message"], e
    if code is not None:
        assert e["code"] == code, e
    return s


def procs(marker):
    """Host processes whose command line holds `marker`."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(p))
        except OSError:
            pass
    return found


async def wait_procs(marker, present, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bool(procs(marker)) == present:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"processes with {marker!r} {'never started' if present else 'survived'}: {procs(marker)}")


# --- cases -------------------------------------------------------------------------------------


async def case_tools(s):
    tools = (await s.list_tools()).tools
    assert {t.name for t in tools} == TOOLS, [t.name for t in tools]
    for t in tools:
        assert t.input_schema["type"] == "object", t
        assert t.output_schema and t.output_schema["type"] == "object", t
        assert "status" in t.output_schema["required"], t.output_schema
        a = t.annotations
        assert a is not None and a.read_only_hint is not None and a.destructive_hint is not None, t
        # The default policy allows no egress: no tool reaches an open world.
        assert a.open_world_hint is False, t
    by = {t.name: t for t in tools}
    assert by["sandbox_read_file"].annotations.read_only_hint is True
    assert by["sandbox_kill"].annotations.destructive_hint is True
    assert "python" in by["run_code"].description


async def case_run_code(s):
    r = ok(await s.call_tool("run_code", {"language": "python", "code": "print(1)"}))
    assert r["status"] == "ok" and r["exit_code"] == 0, r
    assert r["stdout"]["text"] == "1\n" and r["stdout"]["truncated"] is False, r
    assert r["duration_ms"] > 0
    # Files in, stdin, files back, a non-zero exit as a normal result.
    r = ok(
        await s.call_tool(
            "run_code",
            {
                "language": "python",
                "code": "import sys\nd=open('in/data.txt').read()\nopen('out.txt','w').write(d.upper()+sys.stdin.read())\nsys.exit(3)",
                "stdin": "!",
                "files": {"in/data.txt": "hello", "blob.bin": {"base64": "AP8="}},
                "return_files": ["out.txt", "missing.txt"],
            },
        )
    )
    assert r["status"] == "exit" and r["exit_code"] == 3, r
    assert r["files"]["out.txt"]["text"] == "HELLO!", r
    assert r["file_errors"]["missing.txt"] == "not-found", r
    r = ok(await s.call_tool("run_code", {"command": ["sh", "-c", "echo out; echo err >&2"]}))
    assert r["stdout"]["text"] == "out\n" and r["stderr"]["text"] == "err\n", r


async def case_session(s):
    r = ok(await s.call_tool("sandbox_create", {"ttl_s": 300}))
    sid = r["sandbox_id"]
    assert sid.startswith("sb-") and r["expires_in_s"] > 0, r
    r = ok(await s.call_tool("sandbox_write_files", {"sandbox_id": sid, "files": {"src/a.py": "print('from a')", "b.txt": "bee"}}))
    assert sorted(r["written"]) == ["b.txt", "src/a.py"], r
    r = ok(await s.call_tool("sandbox_list_files", {"sandbox_id": sid}))
    names = {e["name"]: e["kind"] for e in r["entries"]}
    assert names.get("src") == "dir" and names.get("b.txt") == "file", r
    r = ok(await s.call_tool("sandbox_list_files", {"sandbox_id": sid, "path": "src"}))
    assert [e["name"] for e in r["entries"]] == ["a.py"], r
    r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["python3", "src/a.py"]}))
    assert r["status"] == "ok" and r["stdout"]["text"] == "from a\n", r
    r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["sh", "-c", "cat > c.txt; exit 4"], "stdin": "sea"}))
    assert r["status"] == "exit" and r["exit_code"] == 4, r
    r = ok(await s.call_tool("sandbox_read_file", {"sandbox_id": sid, "path": "c.txt"}))
    assert r["files"]["c.txt"]["text"] == "sea", r
    # Background: an id at once, polled to its end.
    r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["sh", "-c", "sleep 0.5; echo late"], "background": True}))
    assert r["status"] == "running" and isinstance(r["exec_id"], int), r
    eid = r["exec_id"]
    r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "exec_id": eid, "wait_ms": 20000}))
    assert r["status"] == "ok" and r["stdout"]["text"] == "late\n" and r["exec_id"] == eid, r
    r = ok(await s.call_tool("sandbox_kill", {"sandbox_id": sid}))
    assert r["status"] == "ok", r
    err(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["true"]}), "sandbox_id", "gone")
    err(await s.call_tool("sandbox_kill", {"sandbox_id": "sb-nope"}), "sandbox_id", "not-found")


async def case_bad_input(s):
    r = await s.call_tool("no_such_tool", {})
    err(r, "name", "unknown-tool")
    err(await s.call_tool("run_code", {"language": "python", "code": "1", "timeout_ms": "soon"}), "timeout_ms")
    err(await s.call_tool("run_code", {"language": "python", "code": "1", "colour": "red"}), None, "unknown-field")
    err(await s.call_tool("run_code", {"language": "cobol", "code": "1"}), "language", "unknown-language")
    r = err(await s.call_tool("run_code", {"language": "python", "code": "1", "limits": {"memory_bytes": 1 << 50}}), "limits.memory_bytes", "ceiling")
    assert r["status"] == "policy-denied", r
    r = err(await s.call_tool("run_code", {"language": "python", "code": "1", "allow_net": ["example.com"]}), "allow_net[0]", "not-allowed")
    assert r["status"] == "policy-denied", r
    err(await s.call_tool("run_code", {"language": "python", "code": "1", "files": {"../escape.txt": "x"}}), 'files["../escape.txt"]', "invalid")
    err(await s.call_tool("run_code", {"language": "python", "code": "1", "return_files": ["/etc/passwd"]}), "return_files[0]", "invalid")
    err(await s.call_tool("run_code", {"language": "python", "code": "1", "timeout_ms": 3_600_000}), "timeout_ms", "ceiling")
    err(await s.call_tool("sandbox_exec", {"sandbox_id": "sb-0000", "command": ["true"]}), "sandbox_id", "not-found")
    sid = ok(await s.call_tool("sandbox_create", {}))["sandbox_id"]
    try:
        err(await s.call_tool("sandbox_read_file", {"sandbox_id": sid, "path": "../../etc/passwd"}), "path", "invalid")
        err(await s.call_tool("sandbox_read_file", {"sandbox_id": sid, "path": "nothing-here"}), "path", "file")
        err(await s.call_tool("sandbox_write_files", {"sandbox_id": sid, "files": {"ok.txt": "x", "/abs": "y"}}), 'files["/abs"]', "invalid")
        # Nothing of a refused write was written, not even its valid part.
        r = ok(await s.call_tool("sandbox_list_files", {"sandbox_id": sid}))
        assert "ok.txt" not in {e["name"] for e in r["entries"]}, r
        err(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": []}), "command", "invalid")
        err(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "exec_id": 999}), "exec", "not-found")
    finally:
        ok(await s.call_tool("sandbox_kill", {"sandbox_id": sid}))
    # Still serving.
    assert ok(await s.call_tool("run_code", {"command": ["echo", "alive"]}))["stdout"]["text"] == "alive\n"


async def case_attacks(s):
    secret_path = os.environ["PALISADE_SECRET"]
    with open(secret_path) as f:
        secret = f.read().strip()
    code = f"""
import os, socket, sys
try:
    print("READ", open({secret_path!r}).read())
except OSError as e:
    print("read refused:", type(e).__name__)
for p in ("/etc/palisade-mcp-escape", "/usr/palisade-mcp-escape", {secret_path!r} + ".escape"):
    try:
        open(p, "w").write("x"); print("WROTE", p)
    except OSError as e:
        print("write refused:", p, type(e).__name__)
try:
    socket.create_connection(("198.51.100.7", 80), timeout=2); print("CONNECTED")
except OSError as e:
    print("connect refused:", type(e).__name__)
try:
    socket.getaddrinfo("exfil.example.net", 443); print("RESOLVED")
except OSError as e:
    print("resolve refused:", type(e).__name__)
"""
    r = ok(await s.call_tool("run_code", {"language": "python", "code": code}))
    out = r["stdout"]["text"]
    assert secret not in json.dumps(r), "the host secret leaked"
    assert "WROTE /etc" not in out and "WROTE /usr" not in out and "CONNECTED" not in out and "RESOLVED" not in out, out
    assert "READ" not in out and "read refused" in out, out
    # /etc and /usr are read-only inside; /tmp is the sandbox's own: whatever it wrote there, the
    # host's /tmp never sees it.
    assert "write refused: /etc/" in out and "write refused: /usr/" in out, out
    for p in ("/etc/palisade-mcp-escape", "/usr/palisade-mcp-escape", secret_path + ".escape"):
        assert not os.path.exists(p), p
    denied = " ".join(r["denied_egress"])
    assert "198.51.100.7" in denied and "exfil.example.net" in denied, r["denied_egress"]
    # A refused system call is reported.
    r = ok(await s.call_tool("run_code", {"language": "python", "code": "import ctypes\nprint(ctypes.CDLL(None).syscall(321, 0, 0, 0))"}))
    assert any(c.startswith("bpf") for c in r["refused_calls"]), r


async def case_bounded(s):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = ok(await s.call_tool("run_code", {"language": "python", "code": bomb, "timeout_ms": 3000, "limits": {"pids": 64}}))
    assert r["status"] in ("timeout", "cpu-timeout", "oom"), r
    r = ok(await s.call_tool("run_code", {"language": "python", "code": "while True: pass", "timeout_ms": 1000}))
    assert r["status"] == "timeout", r
    sid = ok(await s.call_tool("sandbox_create", {}))["sandbox_id"]
    try:
        r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["sh", "-c", "while :; do :; done"], "timeout_ms": 1000}))
        assert r["status"] == "timeout", r
    finally:
        ok(await s.call_tool("sandbox_kill", {"sandbox_id": sid}))


async def case_big_output(s):
    code = "import sys\nb = b'x' * (1 << 20)\nsys.stdout.buffer.write(b'HEAD')\nfor _ in range(100): sys.stdout.buffer.write(b)\nsys.stdout.buffer.write(b'TAIL')\n"
    r = ok(await s.call_tool("run_code", {"language": "python", "code": code}))
    o = r["stdout"]
    assert r["status"] == "output-limit" and o["truncated"] is True, r["status"]
    assert o["omitted_bytes"] > 0 and "bytes cut by palisade" in o["text"], o["omitted_bytes"]
    assert o["text"].startswith("HEAD") and len(o["text"]) < 64 << 10, len(o["text"])
    assert o["full"].startswith("palisade://output/"), o
    full = await s.read_resource(o["full"])
    assert len(full.contents[0].text) == o["bytes"], (len(full.contents[0].text), o["bytes"])
    # Listed among this session's resources, with its size (every page read).
    listed, cursor = [], None
    while True:
        page = await s.list_resources(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        listed += page.resources
        cursor = page.next_cursor
        if not cursor:
            break
    mine = [x for x in listed if str(x.uri) == o["full"]]
    assert len(mine) == 1 and mine[0].size == o["bytes"], (o["full"], [str(x.uri) for x in listed][-5:])
    # A session's exec, cut the same way, and whole output under the cap shown whole.
    sid = ok(await s.call_tool("sandbox_create", {}))["sandbox_id"]
    try:
        r = ok(await s.call_tool("sandbox_exec", {"sandbox_id": sid, "command": ["sh", "-c", "seq 1 50000"]}))
        o = r["stdout"]
        assert r["status"] == "ok" and o["truncated"] is False and o["omitted_bytes"] > 0, (r["status"], o["bytes"], o["truncated"])
        assert o["text"].startswith("1\n2\n") and o["text"].endswith("49999\n50000\n"), o["text"][-40:]
        full = await s.read_resource(o["full"])
        assert full.contents[0].text == "".join(f"{i}\n" for i in range(1, 50001))
    finally:
        ok(await s.call_tool("sandbox_kill", {"sandbox_id": sid}))


async def case_cancel(s):
    for tool, marker in (("run_code", "987654321"), ("sandbox_exec", "987654322")):
        sid = None
        if tool == "run_code":
            args = {"command": ["sh", "-c", f"sleep {marker}"], "timeout_ms": 40000}
        else:
            sid = ok(await s.call_tool("sandbox_create", {}))["sandbox_id"]
            args = {"sandbox_id": sid, "command": ["sh", "-c", f"sleep {marker}"], "timeout_ms": 40000}
        async with anyio.create_task_group() as tg:

            async def call():
                await s.call_tool(tool, args)

            tg.start_soon(call)
            await wait_procs(marker, True)
            tg.cancel_scope.cancel()
        # The client's cancellation reached the server, which killed the run.
        await wait_procs(marker, False)
        if sid:
            ok(await s.call_tool("sandbox_kill", {"sandbox_id": sid}))
    assert ok(await s.call_tool("run_code", {"command": ["echo", "after"]}))["stdout"]["text"] == "after\n"


async def case_progress(s):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    r = ok(await s.call_tool("run_code", {"command": ["sh", "-c", "sleep 2.5; echo done"]}, progress_callback=on_progress))
    assert r["stdout"]["text"] == "done\n", r
    assert len(seen) >= 1 and "running for" in seen[0][1], seen


async def case_concurrent(s):
    results = [None] * 20

    async def one(i):
        results[i] = await s.call_tool("run_code", {"language": "python", "code": f"print({i} * 2)"})

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    for i, r in enumerate(results):
        assert ok(r)["stdout"]["text"] == f"{i * 2}\n", (i, r)


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


async def run(session, names):
    await session.initialize()
    for n in names:
        t0 = time.monotonic()
        await CASES[n](session)
        print(f"PASS {n} ({time.monotonic() - t0:.1f}s)", flush=True)


async def main():
    mode, target, *names = sys.argv[1:]
    names = names or list(CASES)
    unknown = [n for n in names if n not in CASES]
    assert not unknown, f"unknown cases {unknown}; known: {list(CASES)}"
    if mode == "stdio":
        params = StdioServerParameters(command=target, args=["mcp", *json.loads(os.environ.get("PALISADE_MCP_ARGS", "[]"))])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await run(s, names)
    elif mode == "http":
        async with streamable_http_client(target) as streams:
            r, w = streams[0], streams[1]
            async with ClientSession(r, w) as s:
                await run(s, names)
    else:
        raise SystemExit(f"unknown mode {mode}")


anyio.run(main)
