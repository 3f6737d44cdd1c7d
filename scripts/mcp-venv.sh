#!/usr/bin/env bash
# Creates the MCP clients the `palisade mcp` tests and benchmark drive (crates/palisade-cli/tests/mcp.rs,
# bench/mcp.sh): the Python `mcp` SDK (its stdio and Streamable HTTP clients) in a venv, and the
# MCP Inspector CLI from npm. (The conformance runner, @modelcontextprotocol/conformance 0.1.16,
# needs Node 22's fs.globSync and its server scenarios call the tools of its own test server: it is
# not installed; docs/mcp.md says why.) Pinned versions; idempotent; readable by
# the unprivileged test user.
# Usage: scripts/mcp-venv.sh [VENV_DIR [NPM_DIR]]
#   (defaults /opt/palisade-ci/mcp-venv and /opt/palisade-ci/mcp-npm)
set -euo pipefail
dir=${1:-${PALISADE_MCP_VENV:-/opt/palisade-ci/mcp-venv}}
npm_dir=${2:-${PALISADE_MCP_NPM:-/opt/palisade-ci/mcp-npm}}
MCP_VERSION=2.3.0
# pydantic's Pyodide-based server, for the benchmark's comparison (it needs deno at run time).
MCP_RUN_PYTHON_VERSION=0.0.22
INSPECTOR_VERSION=2.12.0
# The system interpreter, not a per-user one (pyenv under /root is not readable by the test user).
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)

venv_ok() {
    [ -x "$dir/bin/python" ] && "$dir/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m
assert m.version("mcp") == "$MCP_VERSION"
assert m.version("mcp-run-python") == "$MCP_RUN_PYTHON_VERSION"
PY
}
if ! venv_ok; then
    if ! "$py" -c "import ensurepip, venv" 2>/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q && apt-get install -y -q python3-venv
    fi
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "mcp==$MCP_VERSION" \
        "mcp-run-python==$MCP_RUN_PYTHON_VERSION"
    chmod -R a+rX "$dir"
    echo "the Python MCP SDK $MCP_VERSION is in $dir"
fi

npm_ok() {
    [ -f "$npm_dir/node_modules/@modelcontextprotocol/inspector/package.json" ] \
        && grep -q "\"version\": \"$INSPECTOR_VERSION\"" "$npm_dir/node_modules/@modelcontextprotocol/inspector/package.json"
}
if ! npm_ok; then
    command -v npm >/dev/null || { echo "npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
    rm -rf "$npm_dir"
    mkdir -p "$npm_dir"
    (cd "$npm_dir" && printf '{"name":"palisade-mcp-clients","private":true}\n' > package.json \
        && npm install --silent --no-audit --no-fund --save-exact \
            "@modelcontextprotocol/inspector@$INSPECTOR_VERSION")
    chmod -R a+rX "$npm_dir"
    echo "the MCP Inspector $INSPECTOR_VERSION is in $npm_dir"
fi
