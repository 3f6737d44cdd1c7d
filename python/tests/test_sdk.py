from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import palisade
from palisade import Sandbox


def test_run_python_and_command(client: palisade.Client) -> None:
    r = palisade.run("import sys\nprint(6*7)\nprint('e', file=sys.stderr)")
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 0, "42\n", "e\n")
    assert r.report["status"] == "ok" and r.report["layers"], r.report
    r = palisade.run(command=["sh", "-c", "exit 3"])
    assert (r.status, r.exit_code) == ("exit", 3)
    r = palisade.run("print(open('in.txt').read() + input())", files={"in.txt": "a"}, stdin="b", fetch=["in.txt"])
    assert r.stdout == "ab\n" and r.files == {"in.txt": b"a"}


def test_run_limits_are_reported(client: palisade.Client) -> None:
    r = palisade.run("import time; time.sleep(30)", timeout=0.5)
    assert r.status == "timeout" and r.limits_hit == ["timeout"]
    r = palisade.run("print('x' * 100000)", limits={"output_bytes": 1000})
    assert r.status == "output-limit" and "output-limit" in r.limits_hit


def test_denied_egress_is_reported(client: palisade.Client) -> None:
    code = textwrap.dedent(
        """
        import urllib.request
        try:
            urllib.request.urlopen("http://other.test/", timeout=10)
        except Exception as e:
            print("refused:", e)
        """
    )
    r = palisade.run(code, allow_net=["allowed.test"])
    assert "refused" in r.stdout
    assert [(e["host"], e["reason"]) for e in r.denied_egress] == [("other.test", "not-allowed")]


def test_policy_errors_pass_through(client: palisade.Client, tmp_path: Path) -> None:
    with pytest.raises(palisade.PolicyError) as e:
        palisade.run("print(1)", limits={"memory_bytes": 1 << 40})
    assert e.value.code == "ceiling" and e.value.field == "limits.memory_bytes" and e.value.status_code == 403
    assert "above the server's ceiling" in str(e.value)
    with pytest.raises(palisade.PolicyError) as e:
        palisade.run("print(1)", allow_net=["evil.test"])
    assert e.value.code == "not-allowed" and e.value.field is not None and "allow_net" in e.value.field
    with pytest.raises(palisade.InvalidRequestError) as e:
        palisade.run("print(1)", limits={"memroy_bytes": 1})
    assert e.value.code == "unknown-field" and "memroy_bytes" in str(e.value)
    with pytest.raises(palisade.UnknownLanguageError):
        palisade.run("x", language="cobol")
    # A TOML file: its values go to the server, which refuses what is above its ceiling.
    p = tmp_path / "p.toml"
    p.write_text('allow_net = ["allowed.test"]\n[limits]\npids = 100000000\n')
    with pytest.raises(palisade.PolicyError) as e:
        palisade.run("print(1)", policy=p)
    assert e.value.field == "limits.pids"
    p.write_text('[limits]\ntimeout_ms = 300\n')
    assert palisade.run("import time; time.sleep(5)", policy=p).status == "timeout"


def test_server_policy_file_error_is_raised_unchanged(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text('[limits]\nmemory = "lots"\n')
    with pytest.raises(palisade.ServerStartError) as e:
        palisade.Client(policy=p)
    assert "memory" in str(e.value) and e.value.exit_code not in (0, None)


def test_run_batch_keeps_order(client: palisade.Client) -> None:
    items: list[palisade.RunItem] = [f"print({i})" for i in range(20)]
    items.append(palisade.RunRequest(command=["sh", "-c", "exit 4"]))
    items.append({"command": ["echo", "dict"]})
    rs = palisade.run_batch(items, concurrency=4)
    assert [r.stdout.strip() for r in rs[:20]] == [str(i) for i in range(20)]
    assert rs[20].exit_code == 4 and rs[21].stdout == "dict\n"
    with pytest.raises(palisade.InvalidRequestError) as e:
        palisade.run_batch(["print(1)", {"command": []}])
    assert e.value.field is not None and e.value.field.startswith("runs[1]")


def test_sandbox_commands(client: palisade.Client) -> None:
    with Sandbox(timeout=120, env={"A": "1"}) as sbx:
        r = sbx.commands.run("echo $A $B; pwd; echo err >&2; exit 5", env={"B": "2"})
        assert (r.stdout, r.stderr, r.exit_code, r.status) == ("1 2\n/workspace\n", "err\n", 5, "exit")
        sbx.commands.run("mkdir -p sub")
        assert sbx.commands.run("pwd", cwd="sub").stdout == "/workspace/sub\n"
        assert sbx.commands.run(["cat"], stdin="in").stdout == "in"
        out: list[str] = []
        err: list[str] = []
        r = sbx.commands.run("echo a; echo b >&2; echo c", on_stdout=out.append, on_stderr=err.append)
        assert "".join(out) == "a\nc\n" and "".join(err) == "b\n" and r.stdout == "a\nc\n" and r.exit_code == 0
        r = sbx.commands.run("sleep 30", timeout=0.3)
        assert r.status == "timeout"
        h = sbx.commands.run("read x; echo got $x", background=True)
        assert h.poll() is None
        h.send_stdin("hello\n", close=True)
        assert h.wait(timeout=30).stdout == "got hello\n"
        h = sbx.commands.run("sleep 60", background=True)
        h.kill()
        assert h.wait(timeout=30).signal == 9
        assert sbx.get_info()["id"] == sbx.sandbox_id
    assert sbx.report is not None and sbx.report["status"] == "cancelled" and sbx.report["layers"]
    with pytest.raises(palisade.SandboxGoneError):
        sbx.commands.run("true")


def test_a_listing_too_large_for_one_answer_says_so(client: palisade.Client) -> None:
    with Sandbox() as sbx:
        r = sbx.commands.run("mkdir big && cd big && for i in $(seq -w 1 3000); do : > f$i; done && mkdir zz")
        assert r.exit_code == 0, r.stderr
        listing = sbx.files.list("big")
        assert isinstance(listing, palisade.Listing)
        assert listing.truncated and 0 < len(listing) < 3001
        names = [e.name for e in listing]
        assert names == sorted(names) and names[0] == "f0001"
        # Past the cut, exists() asks about the path itself.
        assert "zz" not in names and "f3000" not in names
        assert sbx.files.exists("big/f3000") and sbx.files.exists("big/zz")
        assert not sbx.files.exists("big/f3001")
        small = sbx.files.list(".")
        assert not small.truncated


def test_sandbox_files(client: palisade.Client) -> None:
    with Sandbox() as sbx:
        sbx.files.write("d/a.txt", "hello")
        sbx.files.write("/workspace/d/b.bin", b"\x00\xff")
        assert sbx.files.read("d/a.txt") == "hello"
        assert sbx.files.read("d/b.bin", format="bytes") == b"\x00\xff"
        assert sorted((e.name, e.type, e.size) for e in sbx.files.list("d")) == [("a.txt", "file", 5), ("b.bin", "file", 2)]
        assert sbx.files.exists("d/a.txt") and not sbx.files.exists("d/zzz")
        sbx.files.remove("d/a.txt")
        with pytest.raises(palisade.ServerError) as e:
            sbx.files.read("d/a.txt")
        assert "not-found" in (e.value.value or "") + e.value.message
        # A link planted inside to a file of the sandbox is refused, never followed.
        sbx.commands.run("ln -s /etc/passwd link")
        with pytest.raises(palisade.ServerError) as e:
            sbx.files.read("link")
        assert "symlink" in (e.value.value or "") + e.value.message
        with pytest.raises(palisade.InvalidRequestError):
            sbx.files.read("../etc/passwd")


def test_sandbox_download_streams_a_file_of_any_size(client: palisade.Client, tmp_path: Path) -> None:
    want = "".join(f"{i}\n" for i in range(1, 3_000_001)).encode()
    with Sandbox() as sbx:
        # 23 MB: past the server's --max-fetch (16 MiB), which bounds only what is read whole.
        sbx.commands.run("seq 1 3000000 > big")
        dest = tmp_path / "big"
        assert sbx.files.download("big", dest) == len(want)
        assert dest.read_bytes() == want
        # A file that cannot be read raises, and leaves nothing under the name or beside it.
        with pytest.raises(palisade.ServerError) as e:
            sbx.files.download("missing", tmp_path / "missing")
        assert "not-found" in (e.value.value or "") + e.value.message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]


def test_sandbox_download_archive_streams_a_directory_of_any_size(client: palisade.Client, tmp_path: Path) -> None:
    import tarfile

    want = "".join(f"{i}\n" for i in range(1, 3_000_001)).encode()
    with Sandbox() as sbx:
        # 23 MB: past the server's --max-fetch (16 MiB), so the archive streams.
        sbx.commands.run("mkdir -p d/sub && seq 1 3000000 > d/sub/big && ln -s sub/big d/link")
        dest = tmp_path / "d.tar"
        n = sbx.files.download_archive("d", dest)
        assert n == dest.stat().st_size > len(want)
        with tarfile.open(dest) as t:
            assert sorted(t.getnames()) == ["sub", "sub/big"]
            f = t.extractfile("sub/big")
            assert f is not None and f.read() == want
        # Larger than max_bytes: refused (the file's size counts, sparse or not), nothing left.
        sbx.commands.run("mkdir sp && truncate -s 1G sp/f")
        for call in (
            lambda: sbx.files.download_archive("sp", tmp_path / "sp.tar", max_bytes=100 << 20),
            lambda: sbx.files.read_archive("d"),
        ):
            with pytest.raises(palisade.ServerError) as e:
                call()
            assert e.value.value == "too-large", e.value.message
        # Strict: the link fails the archive (whole or cut short), and nothing is left behind.
        with pytest.raises(palisade.PalisadeError):
            sbx.files.download_archive("d", tmp_path / "strict.tar", strict=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.tar"]


def test_run_code_keeps_state_and_reports_errors(client: palisade.Client) -> None:
    with Sandbox() as sbx:
        ex = sbx.run_code("x = 41\nprint('hi')\nx + 1")
        assert (ex.text, ex.stdout, ex.error, ex.status, ex.execution_count) == ("42", "hi\n", None, "ok", 1)
        assert sbx.run_code("x").text == "41"
        ex = sbx.run_code("def f():\n    return 1/0\nf()")
        assert ex.status == "error" and ex.error is not None
        assert (ex.error.name, ex.error.value) == ("ZeroDivisionError", "division by zero")
        assert "<cell-" in ex.error.traceback and "in f" in ex.error.traceback and "interp" not in ex.error.traceback
        ex = sbx.run_code("import subprocess; subprocess.run(['echo', 'child']); None")
        assert ex.stdout == "child\n" and ex.text is None
        ex = sbx.run_code("import time; time.sleep(30)", timeout=0.5)
        assert ex.status == "timeout" and ex.error is not None and ex.error.name == "TimeoutError"
        ex = sbx.run_code("'x' in dir()")
        assert ex.restarted and ex.text == "False" and ex.execution_count == 1
        ctx = sbx.create_code_context(cwd="/workspace")
        sbx.run_code("y = 'other'", context=ctx)
        assert sbx.run_code("y", context=ctx).text == "'other'"
        assert sbx.run_code("'y' in dir()").text == "False"
        assert {c.id for c in sbx.list_code_contexts()} == {"default", ctx.id}
        sbx.remove_code_context(ctx)
        with pytest.raises(palisade.NotFoundError):
            sbx.run_code("1", context=ctx)
        with pytest.raises(palisade.UnknownLanguageError):
            sbx.run_code("1", language="ruby")
        with pytest.raises(palisade.InvalidRequestError) as e:
            sbx.run_code("#" * (1 << 20 + 1))
        assert e.value.field == "code"
        ex = sbx.run_code("print('y' * 5000)", output_bytes=100)
        assert ex.truncated and len(ex.stdout) == 100
        for _ in range(7):
            sbx.create_code_context()
        with pytest.raises(palisade.ConflictError) as e:
            sbx.create_code_context()
        assert "maximum of 8 contexts" in str(e.value)


def test_connect_and_unknown_ids(client: palisade.Client) -> None:
    sbx = Sandbox()
    other = Sandbox.connect(sbx.sandbox_id)
    other.files.write("f", "x")
    assert sbx.files.read("f") == "x"
    other.kill()
    with pytest.raises(palisade.SandboxGoneError):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(palisade.NotFoundError):
        Sandbox.connect("sb-does-not-exist")


def test_with_kills_on_keyboard_interrupt(client: palisade.Client) -> None:
    ids = []
    with pytest.raises(KeyboardInterrupt):
        with Sandbox() as sbx:
            ids.append(sbx.sandbox_id)
            raise KeyboardInterrupt
    with pytest.raises(palisade.SandboxGoneError):
        Sandbox.connect(ids[0])


def test_dead_server_and_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(palisade.ServerUnavailableError):
        palisade.run("print(1)", client=palisade.Client(f"unix:{tmp_path}/nothing.sock"))
    with pytest.raises(palisade.ServerUnavailableError):
        palisade.Client("http://127.0.0.1:9").run("print(1)")
    with pytest.raises(palisade.BinaryNotFoundError) as e:
        palisade.find_binary(tmp_path / "no-such-palisade")
    assert "not an executable file" in str(e.value)
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-c", "import palisade\ntry:\n    palisade.run('1')\nexcept palisade.BinaryNotFoundError as e:\n    print('BNF', e)"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert p.stdout.startswith("BNF no `palisade` binary"), p.stdout + p.stderr


EMBEDDED = """
import os, sys, palisade, palisade.server
r = palisade.run("print('embedded')")
srv = palisade.server._shared
st = os.stat(srv.directory)
print(r.stdout.strip(), srv.directory, srv.socket, srv.pid, oct(st.st_mode & 0o777), st.st_uid == os.getuid(), flush=True)
if sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_embedded_server_is_private_and_stops_at_exit(how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PALISADE_URL"}
    p = subprocess.run([sys.executable, "-c", EMBEDDED, how], env=env, capture_output=True, text=True, timeout=120)
    out, directory, sock, pid, mode, own = p.stdout.split()
    assert (out, mode, own) == ("embedded", "0o700", "True"), p.stderr
    assert stat.S_IMODE(0o700) == 0o700 and sock.startswith(directory)
    if how == "interrupt":
        assert "KeyboardInterrupt" in p.stderr
    # The server is gone and its directory removed once the process has exited.
    for _ in range(100):
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(int(pid), signal.SIGKILL)
        raise AssertionError("the embedded server outlived its process")
    assert not os.path.exists(directory)


def test_output_past_the_servers_budget_is_cut_and_says_so() -> None:
    """A server's budget of bytes for replies (``--max-held``): output past it is cut, and the
    result says the server cut it (``cut_by_server``), not the command's own cap."""
    with palisade.Client(server_args=["--max-held", "1MiB"]) as c:
        with Sandbox(timeout=120, client=c) as sbx:
            r = sbx.commands.run("head -c 4000000 /dev/zero | tr '\\0' a")
            assert (r.status, r.cut_by_server, r.truncated) == ("output-limit", True, True)
            assert len(r.stdout_bytes) <= 1 << 20
            r = sbx.commands.run("echo fits")
            assert (r.status, r.stdout, r.cut_by_server) == ("ok", "fits\n", False)
