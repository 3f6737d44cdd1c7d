#!/usr/bin/env bash
# palisade side by side with bubblewrap, firejail, gVisor, podman (crun, runc), srt, the Codex
# sandbox and sandlock (its command line, its Python API and its fork API), and palisade's own
# warm engine (a template) and exec engine as a library, in one run: installs the peers it can (bench/setup-peers.sh), builds palisade, measures,
# and writes docs/benchmarks/peers.{json,md} and peers-startup.png (--quick: a temp dir). A peer that
# cannot be installed or cannot run here is skipped with the reason, which the results record.
# Nothing is asserted. Usage: bench/peers.sh [--quick] [--out DIR] [bench/peers.py options]
# (root; full run ~5 min on 2 cores; --quick ~45 s once the peers are installed, ~2.5 min before).
# Honors CARGO_TARGET_DIR (default target/), for cargo and for the palisade binary it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
bash bench/setup-peers.sh
bench_build --bin palisade
# The library rows (a template, the exec engine) are measured by this example program.
bench_build -p palisade --example startup_bench
# Debian's python3: the interpreter bench/setup-peers.sh installs matplotlib for (the chart).
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
exec "$py" bench/peers.py "$@"
