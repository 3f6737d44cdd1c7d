#!/usr/bin/env bash
# Runs the whole suite: formatting, lints, unit tests, and the boundary tests twice, as root and as
# an unprivileged user (the sandbox takes different paths for each). Needs root (it switches to the
# test user); `.ci/setup` creates that user. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TEST_USER=${PALISADE_TEST_USER:-palisade-test}
if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: run as root (it also runs the suite as $TEST_USER); run .ci/setup first" >&2
    exit 1
fi
id "$TEST_USER" >/dev/null 2>&1 || { echo "scripts/test.sh: user $TEST_USER is missing; run .ci/setup" >&2; exit 1; }

# Each phase's start, in minutes and seconds since this script began.
t0=$SECONDS
phase() { printf '== [%02d:%02d] %s\n' $(((SECONDS - t0) / 60)) $(((SECONDS - t0) % 60)) "$*"; }
phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

# The test internet (network namespaces with HTTP, TLS and DNS test servers) for the egress tests;
# both runs use it, and it comes down at the end whatever happens, unless it was up and serving
# before (another run on this machine is using it). A namespace left behind without its servers (a
# killed run, a restored machine) is rebuilt: `up` takes the remains down first.
if scripts/testnet.sh status >/dev/null 2>&1; then
    scripts/testnet.sh extras
    testnet_down=true
else
    scripts/testnet.sh up
    testnet_down='scripts/testnet.sh down'
fi
trap "$testnet_down" EXIT

phase "tests as root"
cargo build --workspace --quiet  # the binaries the tests spawn: palisade and palisade-probe
phase "cargo test as root (built)"
# Tests that need root are #[ignore]d with the reason (an unprivileged run lists them as ignored);
# this pass includes them.
cargo test --workspace --quiet -- --include-ignored 2>&1 | tee /tmp/palisade-root-tests.log

phase "tests as $TEST_USER (unprivileged)"
# The one-time delegation root gives a user so that their sandboxes get cgroup ceilings.
target/debug/palisade cgroup-delegate --user "$TEST_USER"
# Build once as root, then run the same test binaries as the test user from a directory it can read.
stage=$(mktemp -d /tmp/palisade-stage.XXXXXX)
trap 'rm -rf "$stage"; '"$testnet_down" EXIT
chmod 755 "$stage"
cargo test --workspace --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' > "$stage/tests.txt"
cp target/debug/palisade target/debug/palisade-probe "$stage/"
n=0
while read -r exe; do
    cp "$exe" "$stage/"
    n=$((n + 1))
done < "$stage/tests.txt"
chmod -R a+rX "$stage"
[ "$n" -gt 0 ] || { echo "no test binaries found" >&2; exit 1; }
home=$(getent passwd "$TEST_USER" | cut -d: -f6)
phase "cargo test as $TEST_USER ($n test programs staged)"
status=0
while read -r exe; do
    b="$stage/$(basename "$exe")"
    echo "-- $(basename "$exe") as $TEST_USER"
    (cd "$stage" && runuser -u "$TEST_USER" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" TMPDIR=/tmp \
        PALISADE_BIN="$stage/palisade" PALISADE_PROBE="$stage/palisade-probe" "$b" --quiet) || status=1
done < "$stage/tests.txt"

# The Python SDK and its executors (python/tests) against the real server, as root and as the
# test user, in the venv scripts/python-venv.sh makes (.ci/setup); mypy --strict on the package
# (with python/pyproject.toml's [tool.mypy]: mypy looks for one from the working directory up).
venv=${PALISADE_PYTHON_VENV:-/opt/palisade-ci/python-venv}
[ -x "$venv/bin/pytest" ] || { echo "no $venv/bin/pytest: run scripts/python-venv.sh (.ci/setup does)" >&2; exit 1; }
scripts/python-venv.sh "$venv"
phase "mypy --strict python/src/palisade"
"$venv/bin/mypy" --strict --config-file python/pyproject.toml --cache-dir "$stage/mypy-cache" \
    python/src/palisade || status=1
phase "python/tests as root"
PALISADE_BIN="$PWD/target/debug/palisade" "$venv/bin/pytest" -q -p no:cacheprovider python/tests --rootdir python \
    --ignore=python/tests/ray || status=1
cp -r python/tests "$stage/python-tests"
cp -r python/src "$stage/python-src"
# python/tests/ray finds python/src and python/examples from its own path: laid out as here.
mkdir -p "$stage/python"
cp -r python/src python/tests python/examples "$stage/python/"
chmod -R a+rX "$stage/python-tests" "$stage/python-src" "$stage/python"
phase "python/tests as $TEST_USER"
(cd "$stage" && runuser -u "$TEST_USER" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" TMPDIR=/tmp \
    PALISADE_BIN="$stage/palisade" "$venv/bin/pytest" -q -p no:cacheprovider "$stage/python-tests" --rootdir "$stage/python-tests" \
    --ignore="$stage/python-tests/ray") || status=1

# palisade.ray on a real local Ray cluster (python/tests/ray), in the venv scripts/ray-venv.sh
# makes (.ci/setup), with this checkout's python/src on the path, as root and as the test user.
ray_venv=${PALISADE_RAY_VENV:-/opt/palisade-ci/ray-venv}
[ -x "$ray_venv/bin/python" ] || { echo "no $ray_venv/bin/python: run scripts/ray-venv.sh (.ci/setup does)" >&2; exit 1; }
phase "python/tests/ray as root"
PALISADE_BIN="$PWD/target/debug/palisade" PYTHONPATH="$PWD/python/src" "$ray_venv/bin/python" -m pytest -q \
    -p no:cacheprovider python/tests/ray --rootdir python || status=1
phase "python/tests/ray as $TEST_USER"
(cd "$stage" && runuser -u "$TEST_USER" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" TMPDIR=/tmp \
    PALISADE_BIN="$stage/palisade" PYTHONPATH="$stage/python/src" "$ray_venv/bin/python" -m pytest -q \
    -p no:cacheprovider "$stage/python/tests/ray" --rootdir "$stage/python") || status=1
exit $status
