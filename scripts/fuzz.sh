#!/usr/bin/env bash
# Fuzzes the parsers the supervisor runs on untrusted input (fuzz/fuzz_targets/: the policy file,
# and the egress proxy's first-bytes sniffer, proxy request head, DNS stub query and DNS client
# reply, and what its reading of each request parses: bodies, heads with secrets, HTTP rules)
# with cargo-fuzz and libFuzzer, starting from the committed seeds (fuzz/seeds/TARGET) and every
# input a run ever found (fuzz/regressions/TARGET).
#
# Only a stable toolchain is needed: cargo-fuzz's unstable rustc flags are allowed with
# RUSTC_BOOTSTRAP=1, and cargo-fuzz itself is installed from crates.io when it is missing. No
# sanitizer by default (the fuzzed crates forbid unsafe code; FUZZ_SANITIZER=address adds ASan).
# Overflow checks and debug assertions are on.
#
# Usage: scripts/fuzz.sh [--quick] [--build-only] [--time SECONDS] [TARGET...]
#   --quick      a short run for CI: an unoptimized build (it compiles faster), 15 s per target
#   --build-only build the targets (and install cargo-fuzz if missing), run none: CI builds them
#                beside the tests (.ci/run)
#   --time N     seconds per target (default 300; --quick: 15)
#   TARGET...    some targets only (default: all of them)
# The targets run side by side, one per CPU (FUZZ_JOBS=N to change that).
# A crash fails the script and leaves the input in fuzz/artifacts/TARGET/: fix the bug, then copy
# the input into fuzz/regressions/TARGET/ and name it in the replay test
# (crates/palisade-net/src/tests.rs, `the_fuzz_targets_hold_on_...`), which runs in every
# `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0 build_only=0
time_per=
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --build-only) build_only=1 ;;
        --time)
            [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || { echo "scripts/fuzz.sh: --time needs a number of seconds, got '${2:-}'" >&2; exit 2; }
            time_per=$2
            shift
            ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        -*) echo "scripts/fuzz.sh: unknown option '$1' (accepted: --quick, --build-only, --time SECONDS, target names)" >&2; exit 2 ;;
        *) targets+=("$1") ;;
    esac
    shift
done
if [ -z "$time_per" ]; then
    if [ $quick = 1 ]; then time_per=15; else time_per=300; fi
fi

all=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^palisade-fuzz$')
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets <<<"$all"
fi
# Once each: two runs of one target would share its corpus and its log.
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | awk '!seen[$0]++')
for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$all" || { echo "scripts/fuzz.sh: no fuzz target '$t'; the targets are:" $all >&2; exit 2; }
done

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked --quiet
fi

export RUSTC_BOOTSTRAP=1
flags=(-s "${FUZZ_SANITIZER:-none}" -a)
[ $quick = 1 ] && flags+=(-D)

echo "== building the fuzz targets (${flags[*]})"
cargo fuzz build "${flags[@]}"
[ $build_only = 0 ] || exit 0

# One target: its libFuzzer run's output in $logs/TARGET.log, its status in $logs/TARGET.rc.
fuzz_one() {
    local t=$1 d rc=0 corpus
    corpus=(fuzz/corpus/"$t")
    mkdir -p "${corpus[0]}"
    for d in fuzz/seeds/"$t" fuzz/regressions/"$t"; do
        [ -d "$d" ] && corpus+=("$d")
    done
    echo "== $t: ${time_per}s from ${corpus[*]}" > "$logs/$t.log"
    # -max_len: the proxy reads at most 64 KiB before it decides; shorter inputs find the same
    # paths faster. -timeout: one input may take a second at most (a hang is a failure).
    cargo fuzz run "${flags[@]}" "$t" "${corpus[@]}" -- \
        -max_total_time="$time_per" -max_len=8192 -timeout=1 -rss_limit_mb=1024 \
        -print_final_stats=1 >>"$logs/$t.log" 2>&1 || rc=$?
    echo "$rc" > "$logs/$t.rc"
}

# The targets run side by side, FUZZ_JOBS at a time (default: one per CPU; libFuzzer's run is one
# thread), each for its full time; their reports are shown in order when all are done.
jobs_max=${FUZZ_JOBS:-$(nproc)}
[[ "$jobs_max" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/fuzz.sh: FUZZ_JOBS must be a whole number, 1 or more, not '$jobs_max'" >&2; exit 2; }
logs=$(mktemp -d)
# Stopped early (a signal): no run goes on writing into the logs it removes.
# (No job left is the common case: `kill` with no pid would fail, and under `set -e` fail the run.)
trap 'left=$(jobs -p); [ -z "$left" ] || kill $left 2>/dev/null || true; rm -rf "$logs"' EXIT
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs_max" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait || true
failed=0
for t in "${targets[@]}"; do
    head -n 1 "$logs/$t.log"
    grep -E '^(Done |stat::number_of_executed_units|stat::peak_rss_mb)' "$logs/$t.log" || true
    rc=$(cat "$logs/$t.rc" 2>/dev/null || echo "none (the run did not finish)")
    if [ "$rc" != 0 ]; then
        tail -n 40 "$logs/$t.log" >&2
        echo "scripts/fuzz.sh: $t failed (exit $rc); the input is in fuzz/artifacts/$t/ (see the top of this script)" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
echo "== fuzz: ${#targets[@]} targets, ${time_per}s each, no crash"
