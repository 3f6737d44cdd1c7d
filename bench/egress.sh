#!/usr/bin/env bash
# Egress benchmark: throughput, time to first byte and CPU per GiB through palisade's proxy versus
# direct and versus srt's proxy (when bench/setup-peers.sh has installed it), from an HTTP server on
# the host's loopback and behind a shaped veth link (root). Writes docs/benchmarks/egress.{json,md}
# (--quick: prints only). Usage: bench/egress.sh [--quick] [--size BYTES] [--runs N] [--links RATES|none]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
bench_build --bin palisade
exec python3 bench/egress.py "$@"
