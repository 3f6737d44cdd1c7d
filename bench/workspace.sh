#!/usr/bin/env bash
# The copy-on-write workspace, timed: start-up with --workspace on a 50,000-file tree against an
# empty one, a run changing 1,000 files and `changes`/`diff`/`apply` on its change set, beside a
# plain `cp -a` of the tree and, where its PyPI package installs and runs, sandlock's overlay
# workdir (installed into a scratch virtual environment, removed afterwards).
# Usage: bench/workspace.sh [--out DIR]   (RUNS=N for the number of runs; default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
out=docs/benchmarks
if [ "${1:-}" = "--out" ]; then out=$2; fi
bench_build --bin palisade
exec python3 bench/workspace.py "$bench_bin_dir/palisade" "$out"
