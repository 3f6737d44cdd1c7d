#!/usr/bin/env bash
# Egress benchmark: throughput and time to first byte through palisade's proxy versus direct, on a
# local HTTP server. Usage: bench/egress.sh [--quick] [--size BYTES] [--runs N]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin palisade
exec python3 bench/egress.py "$@"
