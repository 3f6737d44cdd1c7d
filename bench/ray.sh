#!/usr/bin/env bash
# Ray benchmark: palisade.ray's run_batch throughput and p50/p99 latency on 1 vs 3 local Ray nodes,
# and the Ray overhead per run against calling a node's palisade serve directly. The core count is
# written with the figures (every node of a local cluster shares this machine's cores).
# Usage: bench/ray.sh [--quick] [--out DIR]   Results: docs/benchmarks/ray.{json,md} (not with --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
bench_build --bin palisade
scripts/ray-venv.sh >/dev/null
PYTHONPATH="$PWD/python/src${PYTHONPATH:+:$PYTHONPATH}" exec /opt/palisade-ci/ray-venv/bin/python bench/ray_bench.py "$@"
