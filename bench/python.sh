#!/usr/bin/env bash
# The Python SDK's costs: its overhead over raw HTTP per call (the same POST /v1/run of `true`
# with httpx directly, and through palisade.run), and run_batch throughput for N Python snippets
# beside E2B-style sequential use (one Sandbox, run_code per snippet) and beside a local
# subprocess loop without a sandbox. Needs `cargo build` and scripts/python-venv.sh.
# Usage: bench/python.sh [--quick]   (N = 1000, or 100 with --quick)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PALISADE_PYTHON_VENV:-/opt/palisade-ci/python-venv}
n=1000 calls=200
[ "${1:-}" = "--quick" ] && n=100 calls=50
PALISADE_BIN=${PALISADE_BIN:-$PWD/target/debug/palisade} N=$n CALLS=$calls "$venv/bin/python" - <<'PY'
import os, subprocess, sys, time, statistics
import httpx, palisade
n, calls = int(os.environ["N"]), int(os.environ["CALLS"])
c = palisade.Client(server_args=["--max-concurrency", "4", "--max-queue", "4096"])
raw = httpx.Client(transport=httpx.HTTPTransport(uds=c.socket), base_url="http://palisade")
def timed(f, k):
    t = []
    for _ in range(k):
        t0 = time.perf_counter(); f(); t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1000
body = {"command": ["true"]}
timed(lambda: raw.post("/v1/run", json=body).json(), 10)
h = timed(lambda: raw.post("/v1/run", json=body).json(), calls)
s = timed(lambda: palisade.run(command=["true"], client=c), calls)
print(f"per call, median of {calls}: raw HTTP {h:.2f} ms, SDK {s:.2f} ms, overhead {s - h:+.2f} ms")
snips = [f"print({i} * {i})" for i in range(n)]
t0 = time.perf_counter(); rs = c.run_batch(snips, concurrency=4); tb = time.perf_counter() - t0
assert all(r.stdout == f"{i*i}\n" for i, r in enumerate(rs))
with palisade.Sandbox(client=c) as sbx:
    t0 = time.perf_counter()
    for code in snips:
        sbx.run_code(code)
    te = time.perf_counter() - t0
t0 = time.perf_counter()
for code in snips:
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
tl = time.perf_counter() - t0
print(f"{n} snippets: run_batch (a sandbox each, concurrency 4) {n/tb:.1f}/s; "
      f"E2B-style sequential run_code in one sandbox {n/te:.1f}/s; local subprocess loop, no sandbox {n/tl:.1f}/s")
c.close()
PY
