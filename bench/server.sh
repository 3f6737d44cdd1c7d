#!/usr/bin/env bash
# Server benchmark: requests/s and p50/p99 latency of `palisade serve` for `true` and a small Python
# snippet (started directly, and through the in-sandbox agent), 1 to 64 concurrent clients on
# loopback, beside a loop of `palisade run`. Usage: bench/server.sh [--quick] [--engines] [--out DIR]
# Results: docs/benchmarks/server.{json,md} (not with --quick); with --engines, cold vs template vs
# warm Python for Python print(1) on /v1/run and /run_code: docs/benchmarks/server-engines.{json,md}.
# With --peer-sandboxfusion [LABEL=]URL (repeatable; or $PALISADE_BENCH_SANDBOXFUSION), a running
# SandboxFusion server (LABEL: its isolation mode, lite or none) is measured beside palisade's
# /run_code on the same requests in the same run (--run-code: only that part); results go into
# server.{json,md} too. How the peer is set up by hand: docs/benchmarks.md, "SandboxFusion".
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
bench_build --bin palisade
bench_build -p palisade-cli --example http_load
exec python3 bench/server.py "$@"
