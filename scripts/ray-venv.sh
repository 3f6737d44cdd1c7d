#!/usr/bin/env bash
# Creates the Python environment the Ray tests and benchmark run in (python/tests/ray,
# bench/ray.sh): Ray from PyPI at a pinned version, and pytest. palisade.ray itself is not
# installed: the tests and the benchmark put this checkout's python/src on PYTHONPATH (the Ray
# workers inherit it), and it talks to each node's server with the standard library only (httpx is there for the
# package's own __init__, the SDK).
# Idempotent; readable by the unprivileged test user.
# Usage: scripts/ray-venv.sh [DIR] (default /opt/palisade-ci/ray-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${PALISADE_RAY_VENV:-/opt/palisade-ci/ray-venv}}
RAY_VERSION=2.60.0
PYTEST_VERSION=8.4.2
# The SDK's one dependency (palisade's package __init__ imports it).
HTTPX_VERSION=0.28.1
# The system interpreter, not a per-user one (pyenv under /root is not readable by the test user).
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if [ -x "$dir/bin/python" ] \
    && [ "$("$dir/bin/python" -c 'import ray; print(ray.__version__)' 2>/dev/null)" = "$RAY_VERSION" ] \
    && "$dir/bin/python" -c "import pytest, httpx" 2>/dev/null; then
    exit 0
fi
if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q python3-venv
fi
mkdir -p "$(dirname "$dir")"
rm -rf "$dir"
"$py" -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check "ray==$RAY_VERSION" "pytest==$PYTEST_VERSION" \
    "httpx==$HTTPX_VERSION"
chmod -R a+rX "$dir"
echo "Ray $RAY_VERSION and pytest are in $dir"
