"""Side-by-side start-up benchmark.

Every tool runs the same payload with the closest equivalent of palisade's default policy. The
commands run in rounds, each round one hyperfine invocation over all of them in a rotated order,
so that drift of the machine hits all tools alike. Medians and spread come from all rounds pooled;
ratios are tool / palisade. No timing is asserted: this is a measurement, not a test.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PALISADE, ROOT, bwrap_cmd, quote  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few runs, to prove the harness works (CI)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=100, help="runs per command per round")
    ap.add_argument("--out", default=None, help="results directory (default: docs/benchmarks, or a temp dir with --quick)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.runs = 2, 5
    out = a.out or (tempfile.mkdtemp(prefix="palisade-bench-") if a.quick else os.path.join(ROOT, "docs", "benchmarks"))
    os.makedirs(out, exist_ok=True)
    for tool in ("hyperfine", "bwrap", "unshare"):
        if not shutil.which(tool):
            sys.exit(f"bench: `{tool}` is missing; run .ci/setup")
    if os.geteuid() != 0:
        sys.exit("bench: run as root (unshare --map-root-user and bwrap are compared as root)")
    scratch = tempfile.mkdtemp(prefix="palisade-bench-scratch-")
    py = shutil.which("python3", path="/usr/bin:/bin")
    cases = {
        "/bin/true": ["/bin/true"],
        "python3 -c pass": [py or "/usr/bin/python3", "-c", "pass"],
    }
    results = {}
    commands = {}
    for case, payload in cases.items():
        if not os.path.exists(payload[0]):
            print(f"bench: skipping `{case}`: {payload[0]} is missing")
            continue
        tools = {
            "bare": payload,
            "unshare (all namespaces)": ["unshare", "-Ufirpmnuc", "--map-root-user", "--"] + payload,
            "bwrap": bwrap_cmd(scratch, payload),
            "palisade": [PALISADE, "run", "-q", "--no-tty", "--"] + payload,
            "palisade --scratch DIR": [PALISADE, "run", "-q", "--no-tty", "--scratch", scratch, "--"] + payload,
        }
        if case != "/bin/true":
            tools.pop("unshare (all namespaces)")
            tools.pop("palisade --scratch DIR")
        names = list(tools)
        times = {n: [] for n in names}
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = ["hyperfine", "-N", "--style", "none", "-w", "5", "-r", str(a.runs), "--export-json", f.name]
                cmd += [quote(tools[n]) for n in order]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
                data = json.load(open(f.name))
            for n, res in zip(order, data["results"]):
                times[n].extend(res["times"])
        results[case] = {}
        for n in names:
            t = sorted(times[n])
            q = statistics.quantiles(t, n=10) if len(t) >= 10 else [t[0]] * 9
            results[case][n] = {"median_ms": statistics.median(t) * 1000, "p10_ms": q[0] * 1000,
                                "p90_ms": q[-1] * 1000, "runs": len(t)}
        base = results[case]["palisade"]["median_ms"]
        for n in names:
            results[case][n]["ratio_to_palisade"] = results[case][n]["median_ms"] / base
        commands[case] = {n: quote(tools[n]) for n in names}
    shutil.rmtree(scratch, ignore_errors=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "rounds": a.rounds,
        "runs_per_round": a.runs,
        "user": "root",
        "bwrap": subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip(),
    }
    json.dump({"meta": meta, "results": results, "commands": commands}, open(os.path.join(out, "startup.json"), "w"), indent=2)
    lines = [f"Start-up, {meta['date']}, kernel {meta['kernel']}, {meta['cpus']} CPUs, {meta['bwrap']}, "
             f"{a.rounds} rounds x {a.runs} runs, as root.", ""]
    for case, rs in results.items():
        lines += [f"### `{case}`", "", "| tool | median ms | p10 ms | p90 ms | tool / palisade |", "|---|---|---|---|---|"]
        for n, r in rs.items():
            lines.append(f"| {n} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} | {r['p90_ms']:.2f} | {r['ratio_to_palisade']:.2f} |")
        lines += ["", "Commands:", ""] + [f"- {n}: `{c}`" for n, c in commands[case].items()] + [""]
    open(os.path.join(out, "startup.md"), "w").write("\n".join(lines))
    print("\n".join(lines))
    print(f"results in {out}/startup.json and {out}/startup.md")


if __name__ == "__main__":
    main()
