#!/usr/bin/env bash
# Creates the Python environment the SDK's tests run in (python/tests, run by scripts/test.sh as
# root and as the unprivileged test user): the SDK from ./python with every executor's extra, the
# real agent frameworks from PyPI at pinned versions, pytest and mypy. Idempotent (a venv whose
# pins and SDK source match is kept); readable by the test user.
# Usage: scripts/python-venv.sh [DIR] (default /opt/palisade-ci/python-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${PALISADE_PYTHON_VENV:-/opt/palisade-ci/python-venv}}
# The frameworks' versions: bump together with python/pyproject.toml's extras.
pins=(
    "httpx==0.28.1"
    "smolagents==1.26.0"
    "deepagents==0.7.32"
    "openai-agents==0.24.0"
    "autogen-core==0.7.5"
    "pytest==9.2.0"
    "mypy==2.4.1"
)
# The system interpreter, not a per-user one (pyenv under /root is not readable by the test user).
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
# What this venv was made from: the pins and the SDK's source. Same stamp: nothing to do.
stamp=$( { printf '%s\n' "${pins[@]}"; find python/pyproject.toml python/src -type f -not -path '*/__pycache__/*' | sort | xargs sha256sum; } | sha256sum | cut -d' ' -f1)
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.palisade-stamp" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi
if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q python3-venv
fi
mkdir -p "$(dirname "$dir")"
if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    rm -rf "$dir"
    "$py" -m venv "$dir"
fi
"$dir/bin/pip" install -q --disable-pip-version-check "${pins[@]}"
# The SDK itself, not editable (the test user reads it from the venv), with every extra.
"$dir/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./python
"$dir/bin/pip" install -q --disable-pip-version-check "./python[all]" "${pins[@]}"
echo "$stamp" > "$dir/.palisade-stamp"
chmod -R a+rX "$dir"
echo "the Python SDK's test environment is in $dir"
