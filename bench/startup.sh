#!/usr/bin/env bash
# Start-up benchmark: palisade against bubblewrap, `unshare` with all namespaces, sandlock (when
# bench/setup-peers.sh installed it) and bare exec, side by side in one run; then throughput with
# 1, nproc and 2x nproc callers, palisade's warm engine (a template) among the rows; then Python
# `print(1)` runs/s: a bare loop, cold palisade, a template and a warm-Python template (bench/warm_python.py).
# Usage: bench/startup.sh [--quick] [--out DIR] [--no-throughput]
# Needs root (for `unshare --map-root-user` parity) and hyperfine + bwrap (.ci/setup installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
bench_build --bin palisade
# The library rows (palisade's warm engine and exec engine) are measured by this example program.
bench_build -p palisade --example startup_bench
python3 bench/startup.py "$@"
# Python print(1): bare loop, cold, template, warm Python (docs/engine.md); with --quick, one round
# of half a second a row (the harness works; the figures mean little).
case " $* " in
*" --quick "*) python3 bench/warm_python.py 0.5 1 ;;
*) python3 bench/warm_python.py ;;
esac
