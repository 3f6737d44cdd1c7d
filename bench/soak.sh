#!/usr/bin/env bash
# Leak soak: consecutive sandboxes from one process (the library, as a server would use it),
# checking that descriptors, memory, cgroups and temporary directories stay flat.
# Usage: bench/soak.sh [RUNS]              (default 1000, cold runs)
#        bench/soak.sh --template [RUNS]   (default 10000, runs of one prepared template; also
#                                           mounts, threads, children, and the zygote's end)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--template" ]; then
    runs=${2:-10000}
    cargo build --release -q --bin palisade --bin palisade-probe
    PALISADE_SOAK_RUNS=$runs PALISADE_BIN=$PWD/target/release/palisade PALISADE_PROBE=$PWD/target/release/palisade-probe \
        cargo test --release -q -p palisade-cli --test engine many_template_runs_leave_nothing_behind -- --nocapture
    exit
fi
PALISADE_SOAK_RUNS=${1:-1000} cargo test --release -q -p palisade --test library many_runs_leave_nothing_behind -- --nocapture
