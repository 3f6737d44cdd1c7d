#!/usr/bin/env bash
# Where a cold start's CPU goes: `perf record -g` (software clock, so it works in a VM without
# hardware counters) over RUNS runs of `palisade run -- /bin/true`, then the samples grouped by
# what they were doing (bench/profile.py). Kernel threads' later work (a network namespace's
# cleanup) is not counted. Usage: bench/profile.sh [RUNS] [-- command to profile instead]
# (root; needs perf).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-300}
shift || true
[ "${1:-}" = "--" ] && shift
cargo build --release --quiet --bin palisade
if [ $# -eq 0 ]; then
    set -- "$PWD/target/release/palisade" run -q --no-tty -- /bin/true
fi
data=$(mktemp /tmp/palisade-profile-XXXXXX.data)
trap 'rm -f "$data"' EXIT
cmd=$(printf '%q ' "$@")
perf record -q -o "$data" -e cpu-clock -F 20000 -g -- sh -c "for i in \$(seq $runs); do $cmd >/dev/null; done"
perf script -i "$data" -F comm,ip,sym,dso 2>/dev/null | python3 bench/profile.py "$runs" 20000
