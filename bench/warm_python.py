"""Python `print(1)` runs per second (issue 19, item 5): loops of bare `python3 -c`, cold
`palisade run`, and the library's template and warm-Python template, with 1 and nproc callers,
in rotated rounds. The bare loops and the library rows are started the same way, by the
startup_bench example (`--engine none`: posix_spawn and wait, no sandbox), and every row is
divided by the bare loop with as many callers. A measurement, not a test."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PALISADE, STARTUP_BENCH as EXAMPLE, check_profile  # noqa: E402

CODE = ["python3", "-c", "print(1)"]


def library(engine, threads, seconds, command=CODE):
    out = subprocess.run([EXAMPLE, "--engine", engine, "--init", PALISADE, "--threads", str(threads),
                          "--seconds", str(seconds), "--"] + command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["runs_per_s"]


def main():
    # The build's name is checked here; whether a debug build may run is bench/startup.sh's to
    # say (it runs this script, and refuses one without --quick).
    check_profile(quick=True)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    nproc = os.cpu_count() or 1
    # (name, callers, measure)
    rows = [
        ("bare /usr/bin/python3 -c", 1, lambda: library("none", 1, seconds, ["/usr/bin/python3"] + CODE[1:])),
        ("bare /usr/bin/python3 -c", nproc, lambda: library("none", nproc, seconds, ["/usr/bin/python3"] + CODE[1:])),
        ("palisade run, cold (CLI)", 1, lambda: library("none", 1, seconds, [PALISADE, "run", "-q", "--no-tty", "--"] + CODE)),
        ("palisade template (library)", 1, lambda: library("template", 1, seconds)),
        ("palisade template (library)", nproc, lambda: library("template", nproc, seconds)),
        ("palisade warm Python (library)", 1, lambda: library("warm", 1, seconds)),
        ("palisade warm Python (library)", nproc, lambda: library("warm", nproc, seconds)),
    ]
    got = {i: [] for i in range(len(rows))}
    for r in range(rounds):
        for i in list(range(len(rows)))[r % len(rows):] + list(range(len(rows)))[:r % len(rows)]:
            got[i].append(rows[i][2]())
    bare = {c: sum(got[i]) / rounds for i, (n, c, _) in enumerate(rows) if n.startswith("bare")}
    print("| python `print(1)` | callers | runs/s | / bare loops, as many callers |\n|---|---|---|---|")
    warm = {}
    for i, (n, c, _) in enumerate(rows):
        v = sum(got[i]) / rounds
        print(f"| {n} | {c} | {v:.1f} | {v / bare[c]:.2f} |")
        if n.startswith("palisade warm Python"):
            warm[c] = v / bare[c]
    # The goal is a ratio to a loop of bare python3 -c; with more callers than one, the
    # bare loops use every CPU too, so the row is divided by as many loops (the stricter reading).
    print("\n### Targets (issue 19), from this run\n\n| target | value | met |\n|---|---|---|")
    for c, ratio in sorted(warm.items()):
        loops = "a loop" if c == 1 else f"{c} loops"
        print(f"| warm Python `print(1)` runs/s >= 3x {loops} of bare `python3 -c` ({c} caller{'s' if c > 1 else ''}) "
              f"| {ratio:.2f} | {'yes' if ratio >= 3 else '**no**'} |")


if __name__ == "__main__":
    main()
