#!/usr/bin/env bash
# Installs the sandboxes that bench/peers.py compares palisade with, from the package registries:
# Debian's bubblewrap, firejail, runsc (gVisor), podman with crun and runc, and the npm packages
# @anthropic-ai/sandbox-runtime (srt) and @openai/codex, sandlock (crates.io `sandlock-cli` for its
# command line, PyPI `sandlock` in a virtual environment for its Python and fork APIs), plus
# hyperfine and (from PyPI, into a directory of its own) matplotlib for the harness itself. Idempotent and non-interactive (CI
# runs it as root with no stdin). A peer that cannot be installed is reported with the reason and
# left out; it never fails the script, and bench/peers.py then records that peer as skipped.
# Usage: bench/setup-peers.sh   (root; PALISADE_BENCH_PEERS=DIR moves the npm and matplotlib prefix)
# On a fresh machine the Debian packages take about a minute (podman brings its container stack),
# matplotlib about 15 s and the npm packages about 20 s (codex is ~170 MiB packed).
set -uo pipefail
PEERS_DIR=${PALISADE_BENCH_PEERS:-/opt/palisade-bench-peers}
# Versions are pinned so that runs compare like with like; raise them deliberately.
SRT_VERSION=0.0.83
CODEX_VERSION=0.171.0
MATPLOTLIB_VERSION=3.9.4
SANDLOCK_VERSION=0.9.0
export DEBIAN_FRONTEND=noninteractive
exec </dev/null

say() { echo "setup-peers: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    say "not root: nothing installed (run as root, as CI does); bench/peers.py skips what is missing"
    exit 0
fi

# --- Debian packages -----------------------------------------------------------------------------
# socat and ripgrep are srt's run-time dependencies; uidmap is podman's.
pkgs=(bubblewrap hyperfine firejail runsc podman crun runc uidmap socat ripgrep)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing from Debian: ${missing[*]}"
    apt-get update -q >/dev/null || say "apt-get update failed; trying with the lists there are"
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/palisade-setup-peers-apt.log 2>&1; then
        # One at a time, so that one package that cannot be had does not keep the others out.
        for p in "${missing[@]}"; do
            apt-get install -y -q --no-install-recommends "$p" >>/tmp/palisade-setup-peers-apt.log 2>&1 \
                || say "SKIP $p: apt-get install failed (see /tmp/palisade-setup-peers-apt.log); its peer is skipped"
        done
    fi
else
    say "Debian packages already installed"
fi

# --- gVisor ---------------------------------------------------------------------------------------
# Debian 12 packages runsc; where the release does not, there is no other registry that ships it.
command -v runsc >/dev/null 2>&1 || say "SKIP runsc: no Debian package in this release; its peer is skipped"

# --- matplotlib, for the chart ------------------------------------------------------------------
# From PyPI into $PEERS_DIR/py, which only bench/peers.py puts on its path. Not Debian's
# python3-matplotlib: that one installs an mpl_toolkits .pth file that every start of the system
# python3 then runs, adding ~5 ms to the `python3 -c pass` payload of every benchmark here.
if PYTHONPATH="$PEERS_DIR/py" /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
    say "matplotlib already installed"
else
    say "installing matplotlib $MATPLOTLIB_VERSION from PyPI into $PEERS_DIR/py"
    /usr/bin/python3 -m pip install -q --no-cache-dir --disable-pip-version-check --only-binary=:all: \
        --target "$PEERS_DIR/py" "matplotlib==$MATPLOTLIB_VERSION" >/tmp/palisade-setup-peers-pip.log 2>&1 \
        || say "SKIP chart: pip install matplotlib failed (see /tmp/palisade-setup-peers-pip.log)"
fi

# --- sandlock ------------------------------------------------------------------------------------
# Its command line from crates.io (compiled: ~5 minutes on 2 cores) into $PEERS_DIR/cargo, and its
# Python package (the Python API and the fork API) into a virtual environment of its own.
if [ "$("$PEERS_DIR/cargo/bin/sandlock" --version 2>/dev/null)" = "sandlock $SANDLOCK_VERSION" ]; then
    say "sandlock-cli $SANDLOCK_VERSION already installed"
elif command -v cargo >/dev/null 2>&1; then
    say "installing sandlock-cli $SANDLOCK_VERSION from crates.io into $PEERS_DIR/cargo (compiles)"
    cargo install --quiet --locked --root "$PEERS_DIR/cargo" sandlock-cli --version "$SANDLOCK_VERSION" \
        >/tmp/palisade-setup-peers-cargo.log 2>&1 \
        || say "SKIP sandlock (CLI): cargo install failed (see /tmp/palisade-setup-peers-cargo.log)"
else
    say "SKIP sandlock (CLI): no cargo to build it with"
fi
if "$PEERS_DIR/sandlock-venv/bin/python" -c "import sandlock, sys; sys.exit(sandlock.__version__ != '$SANDLOCK_VERSION')" 2>/dev/null; then
    say "sandlock $SANDLOCK_VERSION (PyPI) already installed"
else
    say "installing sandlock $SANDLOCK_VERSION from PyPI into $PEERS_DIR/sandlock-venv"
    { /usr/bin/python3 -m venv "$PEERS_DIR/sandlock-venv" \
        && "$PEERS_DIR/sandlock-venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check \
            "sandlock==$SANDLOCK_VERSION"; } >/tmp/palisade-setup-peers-sandlock.log 2>&1 \
        || say "SKIP sandlock (Python): pip install failed (see /tmp/palisade-setup-peers-sandlock.log)"
fi

# --- npm packages --------------------------------------------------------------------------------
npm_version() {  # installed version of npm package $1 under the prefix, or nothing
    local f="$PEERS_DIR/npm/node_modules/$1/package.json"
    [ -f "$f" ] && python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$f" 2>/dev/null
}
if ! command -v npm >/dev/null 2>&1; then
    say "npm missing: installing Debian's nodejs and npm"
    apt-get update -q >/dev/null || true
    apt-get install -y -q --no-install-recommends nodejs npm >>/tmp/palisade-setup-peers-apt.log 2>&1 \
        || say "SKIP srt, codex: nodejs/npm could not be installed"
fi
if command -v npm >/dev/null 2>&1; then
    want=()
    [ "$(npm_version @anthropic-ai/sandbox-runtime)" = "$SRT_VERSION" ] || want+=("@anthropic-ai/sandbox-runtime@$SRT_VERSION")
    [ "$(npm_version @openai/codex)" = "$CODEX_VERSION" ] || want+=("@openai/codex@$CODEX_VERSION")
    if [ "${#want[@]}" -gt 0 ]; then
        say "installing from npm into $PEERS_DIR/npm: ${want[*]}"
        mkdir -p "$PEERS_DIR/npm"
        for w in "${want[@]}"; do
            npm install --prefix "$PEERS_DIR/npm" --no-audit --no-fund --loglevel=error "$w" \
                >>/tmp/palisade-setup-peers-npm.log 2>&1 \
                || say "SKIP ${w%@*}: npm install failed (see /tmp/palisade-setup-peers-npm.log); its peer is skipped"
        done
    else
        say "npm packages already installed (srt $SRT_VERSION, codex $CODEX_VERSION)"
    fi
fi
exit 0
