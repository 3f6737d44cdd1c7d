#!/usr/bin/env bash
# Leak soak: 1,000 consecutive sandboxes from one process (the library, as a server would use it),
# checking that descriptors, memory, cgroups and temporary directories stay flat.
# Usage: bench/soak.sh [RUNS]   (default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
PALISADE_SOAK_RUNS=${1:-1000} cargo test --release -q -p palisade --test library many_runs_leave_nothing_behind -- --nocapture
