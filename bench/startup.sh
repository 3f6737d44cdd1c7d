#!/usr/bin/env bash
# Start-up benchmark: palisade against bubblewrap, `unshare` with all namespaces, and bare exec,
# side by side in one run. Usage: bench/startup.sh [--quick] [--out DIR]
# Needs root (for `unshare --map-root-user` parity) and hyperfine + bwrap (.ci/setup installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin palisade
exec python3 bench/startup.py "$@"
