"""The copy-on-write workspace, timed (bench/workspace.sh runs this).

- start-up: `palisade run --workspace DIR -- true` on an empty directory and on a 50,000-file tree,
  beside a run without a workspace and a plain `cp -a` of the tree (what copying the project
  for the code would cost instead);
- a run that changes 1,000 files of the tree (the capture of its change set included), then
  `palisade changes ID`, `palisade diff ID` and `palisade apply ID`;
- sandlock's overlay `workdir` beside it where its PyPI package installs and runs (a virtual
  environment made in the scratch directory, removed at the end: nothing of it is kept).

Medians of RUNS runs each, in milliseconds, written as JSON and Markdown.
"""

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = int(os.environ.get("RUNS", "15"))
FILES = 50_000
CHANGED = 1_000


def timed(cmd, env=None, cwd=None, check=True):
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t) * 1000
    if check and r.returncode != 0:
        sys.exit(f"{cmd}: exit {r.returncode}\n{r.stderr.decode(errors='replace')}")
    return ms, r


def median(f, n=RUNS):
    return statistics.median(f() for _ in range(n))


def make_tree(root):
    # 500 directories of 100 files of 200 bytes: the shape of a checkout with its dependencies.
    for d in range(FILES // 100):
        p = os.path.join(root, f"pkg{d:03}")
        os.makedirs(p)
        for f in range(100):
            with open(os.path.join(p, f"m{f:03}.py"), "w") as fh:
                fh.write(f"# module {d}/{f}\n" + "x = 1\n" * 30)


def sandlock_rows(work, big, empty):
    """sandlock's workdir on the same trees, if it installs and runs here; else why not."""
    venv = os.path.join(work, "sandlock-venv")
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "sandlock"],
                       check=True, capture_output=True, timeout=300)
    except Exception as e:  # noqa: BLE001 - a peer that does not install is reported, not fatal
        return {"error": f"pip install sandlock failed: {e}"}
    py = os.path.join(venv, "bin", "python")
    script = r"""
import sys, time, json
from sandlock import Sandbox
wd, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ro = ["/usr", "/lib", "/lib64", "/bin", "/etc", wd]
cmd = ["/bin/true"] if mode == "true" else ["/bin/sh", "-c",
      "for d in $(seq 0 9); do for f in $(seq 0 99); do echo y >> pkg00$d/m$(printf %03d $f).py; done; done"]
times = []
for _ in range(n):
    sb = Sandbox(workdir=wd, fs_readable=ro, fs_writable=[wd], on_exit="abort")
    t = time.perf_counter(); r = sb.run(cmd); times.append((time.perf_counter() - t) * 1000)
    assert r.success, r
print(json.dumps(sorted(times)[len(times) // 2]))
"""
    out = {}
    try:
        for name, wd, mode in [("start-up, empty", empty, "true"), ("start-up, 50,000 files", big, "true"),
                               ("run changing 1,000 files (discarded)", big, "change")]:
            r = subprocess.run([py, "-c", script, wd, mode, str(RUNS)], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                return {"error": f"sandlock does not run here: {r.stderr.strip().splitlines()[-1:]}"}
            out[name] = json.loads(r.stdout)
        out["version"] = subprocess.run([py, "-c", "import sandlock; print(sandlock.__version__)"],
                                        capture_output=True, text=True).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return {"error": f"sandlock does not run here: {e}"}
    return out


def main():
    palisade = sys.argv[1]
    out_dir = sys.argv[2]
    work = tempfile.mkdtemp(prefix="palisade-bench-ws-")
    try:
        big, empty, store = (os.path.join(work, n) for n in ("big", "empty", "store"))
        os.makedirs(empty)
        make_tree(big)
        env = dict(os.environ, PALISADE_CHANGES_DIR=store)
        run = [palisade, "run", "-q", "--no-tty"]
        res = {}
        res["start-up, no workspace (tmpfs scratch)"] = median(lambda: timed(run + ["--", "/bin/true"], env)[0])
        res["start-up, --workspace empty directory"] = median(
            lambda: timed(run + ["--workspace", empty, "--", "/bin/true"], env)[0])
        res["start-up, --workspace 50,000 files"] = median(
            lambda: timed(run + ["--workspace", big, "--", "/bin/true"], env)[0])

        def cp():
            dst = os.path.join(work, "copy")
            shutil.rmtree(dst, ignore_errors=True)
            ms = timed(["cp", "-a", big, dst])[0]
            return ms
        res["cp -a of the 50,000 files"] = median(cp, max(3, RUNS // 3))
        change = ("for d in $(seq 0 9); do for f in $(seq 0 99); do "
                  "echo y >> pkg00$d/m$(printf %03d $f).py; done; done")
        runs, changes, diffs, applies = [], [], [], []
        for _ in range(max(3, RUNS // 3)):
            ms, r = timed(run + ["--json", "-", "--workspace", big, "--", "/bin/sh", "-c", change], env)
            report = json.loads(r.stdout[r.stdout.rfind(b"\n{") + 1:])
            cs = report["workspace"]["change_set"]
            assert report["workspace"]["summary"]["modified"] == CHANGED, report["workspace"]
            runs.append(ms)
            changes.append(timed([palisade, "changes", cs], env)[0])
            diffs.append(timed([palisade, "diff", cs], env)[0])
            applies.append(timed([palisade, "apply", cs], env)[0])
        res["run changing 1,000 files, change set kept"] = statistics.median(runs)
        res["palisade changes (1,000 entries)"] = statistics.median(changes)
        res["palisade diff (1,000 files)"] = statistics.median(diffs)
        res["palisade apply (1,000 files)"] = statistics.median(applies)
        peer = sandlock_rows(work, big, empty)
        doc = {
            "date": time.strftime("%Y-%m-%d"),
            "host": f"{platform.release()}, {os.cpu_count()} CPUs",
            "runs": RUNS,
            "palisade_ms": res,
            "sandlock": peer,
        }
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "workspace.json"), "w") as f:
            json.dump(doc, f, indent=2)
        lines = [
            "# Workspace benchmark",
            "",
            f"`bench/workspace.sh`, {doc['date']}, Linux {doc['host']}, medians of {RUNS} runs "
            "(3 or more for the slow rows).",
            "",
            "| what | ms |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.1f} |" for k, v in res.items()]
        lines += ["", "sandlock's overlay `workdir` (PyPI `sandlock`, "
                  + (f"{peer.get('version')}):" if "error" not in peer else "not measured):"), ""]
        if "error" in peer:
            lines.append(peer["error"])
        else:
            lines += ["| what | ms |", "|---|---|"]
            lines += [f"| {k} | {v:.1f} |" for k, v in peer.items() if k != "version"]
        with open(os.path.join(out_dir, "workspace.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
