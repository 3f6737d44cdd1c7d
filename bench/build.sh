# Sourced by the bench/*.sh scripts: which build of palisade a benchmark runs, and building it.
#
# PALISADE_BENCH_PROFILE=release (the default) builds and runs the release binaries: the only
# build whose figures mean anything. PALISADE_BENCH_PROFILE=debug runs the debug binaries that
# `cargo build` (and scripts/test.sh) already made, which saves CI the release build; it is
# accepted only with --quick, whose few iterations check that the harness works and publish
# nothing. The Python side (benchlib.py and the scripts without it) reads the same variable.
PALISADE_BENCH_PROFILE=${PALISADE_BENCH_PROFILE:-release}
case "$PALISADE_BENCH_PROFILE" in
release) bench_cargo=(cargo build --release --quiet) ;;
debug)
    case " $* " in
    *" --quick "*) ;;
    *) echo "$0: PALISADE_BENCH_PROFILE=debug is accepted only with --quick (a debug build's figures are not palisade's); unset it, or set it to release" >&2; exit 2 ;;
    esac
    bench_cargo=(cargo build --quiet)
    echo "== $(basename "$0"): the DEBUG build (PALISADE_BENCH_PROFILE=debug): this checks the harness; its figures are not palisade's" ;;
*) echo "$0: PALISADE_BENCH_PROFILE must be release or debug, not '$PALISADE_BENCH_PROFILE'" >&2; exit 2 ;;
esac
export PALISADE_BENCH_PROFILE
# Where the chosen build's binaries are (cargo's rule: CARGO_TARGET_DIR, relative to the root).
bench_bin_dir=$PWD/${CARGO_TARGET_DIR:-target}/$PALISADE_BENCH_PROFILE
case "${CARGO_TARGET_DIR:-}" in /*) bench_bin_dir=$CARGO_TARGET_DIR/$PALISADE_BENCH_PROFILE ;; esac
# bench_build CARGO-BUILD-ARGS...: build these targets in the chosen profile.
bench_build() { "${bench_cargo[@]}" "$@"; }
