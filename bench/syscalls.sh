#!/usr/bin/env bash
# Syscall-heavy benchmark: what the seccomp filter costs a busy program. The probe times a loop of
# two cheap system calls (getppid, a one-byte read of /dev/zero) bare, under bubblewrap without a
# filter, under bubblewrap with an allow-everything filter (the kernel's own cost of having any
# filter), and under palisade with its full filter; rounds interleaved so drift hits all alike.
# Usage: bench/syscalls.sh [--quick] [--out DIR]   (root; .ci/setup installs bwrap)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
bench_build --bin palisade --bin palisade-probe
BENCH_BIN_DIR=$bench_bin_dir exec python3 - "$@" <<'PY'
import argparse, datetime, json, os, platform, shlex, statistics, subprocess, sys, tempfile
ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true")
ap.add_argument("--out", default=None)
a = ap.parse_args()
rounds, n = (2, 100_000) if a.quick else (7, 2_000_000)
out = a.out or (tempfile.mkdtemp(prefix="palisade-bench-") if a.quick else "docs/benchmarks")
root = os.getcwd()
probe = os.path.join(os.environ["BENCH_BIN_DIR"], "palisade-probe")
pal = os.path.join(os.environ["BENCH_BIN_DIR"], "palisade")
# An allow-everything classic BPF program: one `ret SECCOMP_RET_ALLOW`.
allow = tempfile.NamedTemporaryFile(suffix=".bpf", delete=False)
allow.write((0x06).to_bytes(2, "little") + b"\0\0" + (0x7fff0000).to_bytes(4, "little"))
allow.close()
bw = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "--die-with-parent"]
tools = {
    "bare": [probe, "syscall-loop", str(n)],
    "bwrap (no filter)": bw + [probe, "syscall-loop", str(n)],
    "bwrap + allow-all filter": ["sh", "-c", " ".join(shlex.quote(x) for x in bw + ["--seccomp", "3", probe, "syscall-loop", str(n)]) + " 3<" + shlex.quote(allow.name)],
    "palisade (full filter)": [pal, "run", "-q", "--no-tty", "--ro", f"{probe}:/probe", "--", "/probe", "syscall-loop", str(n)],
}
res = {k: [] for k in tools}
for r in range(rounds):
    for name, cmd in tools.items():
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        line = [l for l in p.stdout.splitlines() if l.startswith("probe syscall-loop: ok")]
        if not line:
            sys.exit(f"bench: {name} failed: {p.stdout}{p.stderr}")
        res[name].append(float(line[0].split("ns_per_call=")[1]))
os.unlink(allow.name)
# The allow-all file is temporary: show its role rather than its path in the commands.
tools["bwrap + allow-all filter"] = bw + ["--seccomp", "3", probe, "syscall-loop", str(n), "3<allow-all.bpf"]
med = {k: statistics.median(v) for k, v in res.items()}
base = med["palisade (full filter)"]
meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "kernel": platform.release(), "cpus": os.cpu_count(), "rounds": rounds, "calls_per_run": 2 * n,
        "build": os.environ.get("PALISADE_BENCH_PROFILE") or "release"}
os.makedirs(out, exist_ok=True)
json.dump({"meta": meta, "ns_per_call": res, "median_ns": med,
           "commands": {k: " ".join(v) for k, v in tools.items()}},
          open(os.path.join(out, "syscalls.json"), "w"), indent=2)
lines = [f"System-call cost, {meta['date']}, kernel {meta['kernel']}, {meta['cpus']} CPUs, {rounds} rounds of {2*n} calls, as root.",
         "", "| where | median ns per call | tool / palisade |", "|---|---|---|"]
lines += [f"| {k} | {v:.1f} | {v / base:.2f} |" for k, v in med.items()]
lines += ["", "Commands:", ""] + [f"- {k}: `{' '.join(v)}`" for k, v in tools.items()]
open(os.path.join(out, "syscalls.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:len(med) + 4]))
print(f"results in {out}/syscalls.json and {out}/syscalls.md")
PY
