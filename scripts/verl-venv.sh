#!/usr/bin/env bash
# Creates the Python environment with veRL's SandboxFusion client that the server tests call
# (crates/palisade-cli/tests/server.rs, verls_sandboxfusion_client_scores_through_run_code): veRL from
# PyPI without its heavy dependencies (the client module needs only `requests`; the test loads it by
# path, so veRL's package __init__ and its Ray/torch imports never run). Idempotent; readable by the
# unprivileged test user. Usage: scripts/verl-venv.sh [DIR] (default /opt/palisade-ci/verl-venv)
set -euo pipefail
dir=${1:-${PALISADE_VERL_VENV:-/opt/palisade-ci/verl-venv}}
VERL_VERSION=0.9.1
# The system interpreter, not a per-user one (pyenv under /root is not readable by the test user).
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import requests" 2>/dev/null \
    && [ -f "$(echo "$dir"/lib/python3*/site-packages/verl/utils/reward_score/sandbox_fusion/utils.py)" ]; then
    exit 0
fi
if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q python3-venv
fi
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
"$py" -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check --no-deps "verl==$VERL_VERSION"
"$dir/bin/pip" install -q --disable-pip-version-check requests
chmod -R a+rX "$dir"
echo "veRL $VERL_VERSION's client is in $dir"
