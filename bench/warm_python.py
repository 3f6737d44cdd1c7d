"""Python `print(1)` runs per second (issue 19, item 5): a loop of bare `python3 -c`, cold
`palisade run`, and the library's template and warm-Python template (startup_bench example),
with 1 and nproc callers for the library rows, in rotated rounds. A measurement, not a test."""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PALISADE = os.path.join(ROOT, "target", "release", "palisade")
EXAMPLE = os.path.join(ROOT, "target", "release", "examples", "startup_bench")
CODE = ["python3", "-c", "print(1)"]


def loop(cmd, seconds):
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        n += 1
    return n / (time.time() - t0)


def library(engine, threads, seconds):
    out = subprocess.run([EXAMPLE, "--engine", engine, "--init", PALISADE, "--threads", str(threads),
                          "--seconds", str(seconds), "--"] + CODE, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["runs_per_s"]


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    nproc = os.cpu_count() or 1
    rows = {
        "bare /usr/bin/python3 -c (1 caller)": lambda: loop(["/usr/bin/python3"] + CODE[1:], seconds),
        "palisade run, cold (CLI, 1 caller)": lambda: loop([PALISADE, "run", "-q", "--no-tty", "--"] + CODE, seconds),
        "palisade template (library, 1 caller)": lambda: library("template", 1, seconds),
        f"palisade template (library, {nproc} callers)": lambda: library("template", nproc, seconds),
        "palisade warm Python (library, 1 caller)": lambda: library("warm", 1, seconds),
        f"palisade warm Python (library, {nproc} callers)": lambda: library("warm", nproc, seconds),
    }
    got = {n: [] for n in rows}
    names = list(rows)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            got[n].append(rows[n]())
    bare = sum(got[names[0]]) / rounds
    print("| python `print(1)` | runs/s | / bare loop |\n|---|---|---|")
    for n in names:
        v = sum(got[n]) / rounds
        print(f"| {n} | {v:.1f} | {v / bare:.2f} |")


if __name__ == "__main__":
    main()
