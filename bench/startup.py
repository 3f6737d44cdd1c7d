"""Side-by-side start-up benchmark.

Every tool runs the same payload with the closest equivalent of palisade's default policy. The
commands run in rounds, each round one hyperfine invocation over all of them in a rotated order,
so that drift of the machine hits all tools alike. Medians and spread come from all rounds pooled;
ratios are tool / palisade. Then throughput (issue 19): runs of `/bin/true` per second with 1,
nproc and twice nproc callers, and CPU per run, for the command-line tools (a launcher starting the next run
as soon as the last one ended) and for the rows measured inside one long-running process
(palisade's warm engine and exec engine as a library, sandlock's Python and fork APIs), in
rounds with a rotated order too. No timing is asserted: this is a measurement, not a test.
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
from benchlib import (  # noqa: E402
    LIBRARY_ROWS, PALISADE, PEERS_DIR, ROOT, bwrap_cmd, library_loop, check_profile, library_skip, quote)
from peers import build_launcher, launch_loop  # noqa: E402

SANDLOCK = os.path.join(PEERS_DIR, "cargo", "bin", "sandlock")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few runs, to prove the harness works (CI)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=100, help="runs per command per round")
    ap.add_argument("--out", default=None, help="results directory (default: docs/benchmarks, or a temp dir with --quick)")
    ap.add_argument("--seconds", type=float, default=2.5, help="seconds per throughput window (default 2.5)")
    ap.add_argument("--throughput-rounds", type=int, default=2)
    ap.add_argument("--no-throughput", action="store_true", help="start-up only")
    a = ap.parse_args()
    check_profile(a.quick)
    if a.quick:
        a.rounds, a.runs, a.seconds, a.throughput_rounds = 2, 5, 0.4, 1
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
        if os.access(SANDLOCK, os.X_OK):
            tools["sandlock (CLI)"] = sandlock_cmd(scratch, payload)
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
    throughput = {} if a.no_throughput else measure_throughput(a, scratch, commands_true=cases["/bin/true"])
    shutil.rmtree(scratch, ignore_errors=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "build": os.environ.get("PALISADE_BENCH_PROFILE") or "release",
        "rounds": a.rounds,
        "runs_per_round": a.runs,
        "user": "root",
        "bwrap": subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip(),
    }
    targets = compute_targets(results, throughput)
    json.dump({"meta": meta, "results": results, "commands": commands, "throughput": throughput, "targets": targets},
              open(os.path.join(out, "startup.json"), "w"), indent=2)
    lines = [f"Start-up, {meta['date']}, kernel {meta['kernel']}, {meta['cpus']} CPUs, {meta['bwrap']}, "
             f"{a.rounds} rounds x {a.runs} runs, as root.", ""]
    for case, rs in results.items():
        lines += [f"### `{case}`", "", "| tool | median ms | p10 ms | p90 ms | tool / palisade |", "|---|---|---|---|---|"]
        for n, r in rs.items():
            lines.append(f"| {n} | {r['median_ms']:.2f} | {r['p10_ms']:.2f} | {r['p90_ms']:.2f} | {r['ratio_to_palisade']:.2f} |")
        lines += ["", "Commands:", ""] + [f"- {n}: `{c}`" for n, c in commands[case].items()] + [""]
    lines += render_throughput(throughput, targets)
    open(os.path.join(out, "startup.md"), "w").write("\n".join(lines))
    print("\n".join(lines))
    print(f"results in {out}/startup.json and {out}/startup.md")


def sandlock_cmd(scratch, payload):
    """sandlock's command line with the closest it has to palisade's default policy."""
    read = [x for d in ("/usr", "/lib", "/lib64", "/bin", "/etc") if os.path.exists(d) for x in ("-r", d)]
    return [SANDLOCK, "run"] + read + ["-w", scratch, "--clean-env", "--cwd", scratch, "--"] + payload


def measure_throughput(a, scratch, commands_true):
    """Runs/s with 1, nproc and twice nproc callers and CPU per run, for every row, in rotated rounds.
    Twice nproc: a caller's run waits on its own processes (init, payload) between its steps, so
    with only nproc callers the CPUs are idle part of the time; a server has more callers than CPUs."""
    nproc = os.cpu_count() or 1
    callers = sorted({1, nproc, 2 * nproc})
    state = tempfile.mkdtemp(prefix="palisade-bench-state-")
    launcher = build_launcher(state)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    rows = [(n, "cli", cmd) for n, cmd in [
        ("unshare (all namespaces)", ["unshare", "-Ufirpmnuc", "--map-root-user", "--"] + commands_true),
        ("bwrap", bwrap_cmd(scratch, commands_true)),
        ("palisade (CLI)", [PALISADE, "run", "-q", "--no-tty", "--"] + commands_true),
    ]]
    if os.access(SANDLOCK, os.X_OK):
        rows.append(("sandlock (CLI)", "cli", sandlock_cmd(scratch, commands_true)))
    skipped = {}
    for name, kind, arg, _ in LIBRARY_ROWS:
        why = library_skip(kind)
        if why:
            skipped[name] = why
        else:
            rows.append((name, kind, arg))
    res = {n: {**{str(k): [0, 0.0] for k in callers}, "cpu_s": 0.0, "cpu_runs": 0} for n, *_ in rows}
    for r in range(a.throughput_rounds):
        for name, kind, arg in rows[r % len(rows):] + rows[:r % len(rows)]:
            if name in skipped:
                continue
            for par in callers:
                try:
                    if kind == "cli":
                        ok, wall, fail, usages = launch_loop(arg, a.seconds, par, env, launcher)
                        cpu = sum(u[1] for u in usages)
                    else:
                        ok, wall, cpu, _ = library_loop(kind, arg, a.seconds, par, scratch)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                    skipped[name] = f"failed while timed: {e}"
                    break
                e = res[name][str(par)]
                e[0] += ok
                e[1] += wall
                if par == 1:
                    res[name]["cpu_s"] += cpu
                    res[name]["cpu_runs"] += ok
        print(f"bench: throughput round {r + 1}/{a.throughput_rounds} done", flush=True)
    shutil.rmtree(state, ignore_errors=True)
    out = {"callers": callers, "window_s": a.seconds, "rounds": a.throughput_rounds, "rows": {}, "skipped": skipped,
           "cpu_note": "CPU per run: for command-line tools the launched process tree as wait4 reports it; for "
                       "library rows the measuring process and its reaped children (a template's zygote "
                       "included); neither counts the kernel's own threads (a network namespace's teardown)"}
    for n, d in res.items():
        if n in skipped:
            continue
        out["rows"][n] = {f"runs_per_s_{k}": d[str(k)][0] / d[str(k)][1] if d[str(k)][1] else 0.0 for k in callers}
        out["rows"][n]["cpu_ms_per_run"] = d["cpu_s"] * 1000 / d["cpu_runs"] if d["cpu_runs"] else None
    return out


def compute_targets(results, throughput):
    """Issue 19's goals, as ratios from this run; reported, never asserted."""
    t = []
    st = results.get("/bin/true", {})
    if "palisade" in st:
        p = st["palisade"]["median_ms"]
        if "bwrap" in st:
            v = p / st["bwrap"]["median_ms"]
            t.append({"target": "cold `palisade run -- /bin/true` <= 0.6x bubblewrap", "value": v, "met": v <= 0.6})
        if "unshare (all namespaces)" in st:
            v = p / st["unshare (all namespaces)"]["median_ms"]
            t.append({"target": "cold `palisade run -- /bin/true` <= 1.5x unshare", "value": v, "met": v <= 1.5})
    rows = throughput.get("rows", {}) if throughput else {}
    if "palisade template (library)" in rows:
        for k in throughput["callers"][1:]:
            v = rows["palisade template (library)"][f"runs_per_s_{k}"]
            t.append({"target": f">= 1000 isolated /bin/true runs/s from the warm engine ({k} callers)", "value": v,
                      "met": v >= 1000})
    return t


def render_throughput(tp, targets):
    L = []
    if tp:
        ks = tp["callers"]
        heads = " | ".join(f"runs/s, {k} caller{'s' if k > 1 else ''}" for k in ks)
        L += [f"### Throughput, `/bin/true`", "",
              f"Runs per second with {', '.join(map(str, ks))} callers, {tp['rounds']} rounds of {tp['window_s']} s "
              f"per window; CPU per run with 1 caller. {tp['cpu_note']}.", "",
              f"| tool | {heads} | CPU ms per run |", "|---|" + "---|" * (len(ks) + 1)]
        for n, r in sorted(tp["rows"].items(), key=lambda kv: -kv[1][f"runs_per_s_{ks[-1]}"]):
            cpu = "—" if r["cpu_ms_per_run"] is None else f"{r['cpu_ms_per_run']:.2f}"
            L.append(f"| {n} | " + " | ".join(f"{r[f'runs_per_s_{k}']:.1f}" for k in ks) + f" | {cpu} |")
        L += [""] + [f"- skipped {n}: {why}" for n, why in tp["skipped"].items()] + [""]
    if targets:
        L += ["### Targets (issue 19), from this run", "", "| target | value | met |", "|---|---|---|"]
        L += [f"| {x['target']} | {x['value']:.2f} | {'yes' if x['met'] else '**no**'} |" for x in targets]
        L.append("")
    return L


if __name__ == "__main__":
    main()
