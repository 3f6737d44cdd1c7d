"""Sandboxes on a copy-on-write workspace through the SDK (docs/workspace.md): the host directory
is untouched until ``sbx.workspace.apply()``, which makes exactly the sandbox's changes; what the
code planted and what the host changed meanwhile are held back with typed errors. The SDK starts
its own server for the directory (``--workspace-root``); a server without roots refuses."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

import palisade
from palisade import AsyncSandbox, Sandbox


def tree(d: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = f"link -> {os.readlink(p)}"
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = f"dir {stat.S_IMODE(st.st_mode):o}"
        else:
            out[rel] = f"file {stat.S_IMODE(st.st_mode):o} {p.read_bytes()!r}"
    return out


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The SDK's server for the directory inherits this: its change sets are kept here.
    monkeypatch.setenv("PALISADE_CHANGES_DIR", str(tmp_path / "store"))
    p = tmp_path / "proj"
    (p / "src").mkdir(parents=True)
    (p / "README").write_text("one\ntwo\n")
    (p / "src" / "main.py").write_text("print('a')\n")
    (p / "gone.txt").write_text("bye\n")
    return p


def test_a_workspace_sandbox_changes_nothing_until_apply(project: Path) -> None:
    before = tree(project)
    with Sandbox(workspace=project) as sbx:
        r = sbx.commands.run("set -e; pwd; echo three >> README; mkdir pkg; echo new > pkg/mod.py; rm gone.txt")
        assert r.ok and r.stdout == "/workspace\n", r
        sbx.files.write("notes.txt", "through the file API\n")
        # A later command sees the earlier writes.
        assert sbx.commands.run("cat README pkg/mod.py").stdout == "one\ntwo\nthree\nnew\n"
        assert tree(project) == before
        with pytest.raises(palisade.ChangesNotReadyError):
            sbx.workspace.changes()
    assert tree(project) == before
    cs = sbx.workspace.changes()
    assert isinstance(cs, palisade.ChangeSet) and cs.id == sbx.workspace.change_set_id
    assert cs.dir == os.path.realpath(project)
    got = {(e.path, e.change) for e in cs.entries}
    assert got == {
        ("README", "modified"),
        ("gone.txt", "deleted"),
        ("notes.txt", "added"),
        ("pkg", "added"),
        ("pkg/mod.py", "added"),
    }, got
    assert cs.summary["entries"] == 5
    d = sbx.workspace.diff()
    assert "+three" in d.text and "deleted file mode" in d.text and d.files == 4, d.text
    assert sbx.workspace.diff(paths=["README"]).files == 1
    assert tree(project) == before
    a = sbx.workspace.apply()
    assert isinstance(a, palisade.Applied) and a.entries == 5
    assert (project / "README").read_text() == "one\ntwo\nthree\n"
    assert (project / "pkg" / "mod.py").read_text() == "new\n"
    assert (project / "notes.txt").read_text() == "through the file API\n"
    assert not (project / "gone.txt").exists()
    sbx.workspace.discard()
    with pytest.raises(palisade.NotFoundError) as e:
        sbx.workspace.changes()
    assert e.value.field == "change_set"


def test_conflicts_and_planted_entries_are_held_back_with_the_list(project: Path) -> None:
    with Sandbox(workspace=project) as sbx:
        sbx.commands.run("echo mine > README; ln -s /etc/passwd evil; mkfifo fifo; echo ok > fine.txt")
        (project / "README").write_text("the host's\n")
    before = tree(project)
    with pytest.raises(palisade.WorkspaceConflictError) as e:
        sbx.workspace.apply()
    err = e.value
    assert err.status_code == 409 and err.code == "held"
    kinds = {h.path: h.kind for h in err.held}
    assert kinds == {"README": "conflict", "evil": "refused", "fifo": "refused"}, err.held
    assert [h.path for h in err.conflicts] == ["README"]
    assert err.held_count == 3
    assert tree(project) == before
    # force overrides a conflict, never a refusal.
    with pytest.raises(palisade.WorkspaceConflictError) as e:
        sbx.workspace.apply(force=True, include_risky=True)
    assert {h.kind for h in e.value.held} == {"refused"}
    assert tree(project) == before
    a = sbx.workspace.apply(["README", "fine.txt"], force=True)
    assert a.entries == 2
    assert (project / "README").read_text() == "mine\n"
    assert (project / "fine.txt").read_text() == "ok\n"
    assert not (project / "evil").exists() and not (project / "fifo").exists()


def test_a_server_without_roots_refuses_a_workspace(client: palisade.Client, project: Path) -> None:
    with pytest.raises(palisade.PolicyError) as e:
        Sandbox(workspace=project, client=client)
    assert e.value.field == "workspace" and "--workspace-root" in str(e.value)
    with pytest.raises(palisade.PalisadeError):
        Sandbox(client=client).workspace


def test_async_workspace_cycle(project: Path) -> None:
    async def main() -> None:
        sbx = await AsyncSandbox.create(workspace=project)
        async with sbx:
            r = await sbx.commands.run("echo async > a.txt")
            assert r.ok
        assert not (project / "a.txt").exists()
        cs = await sbx.workspace.changes()
        assert [(e.path, e.change) for e in cs.entries] == [("a.txt", "added")]
        assert "+async" in (await sbx.workspace.diff()).text
        a = await sbx.workspace.apply()
        assert a.entries == 1 and (project / "a.txt").read_text() == "async\n"

    asyncio.run(main())
