#!/usr/bin/env bash
# Property-based tests of `palisade serve` against its own /openapi.json with schemathesis (PyPI):
# generated requests to every operation, checked for server errors (5xx) and status codes the
# document does not list. Starts a server of the debug build on a loopback port and stops it.
# Usage: scripts/schemathesis.sh [MAX_EXAMPLES] (default 50). Needs `cargo build` first.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PALISADE_SCHEMATHESIS_VENV:-/opt/palisade-ci/schemathesis-venv}
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if [ ! -x "$venv/bin/st" ]; then
    "$py" -c "import ensurepip, venv" 2>/dev/null || { apt-get update -q && apt-get install -y -q python3-venv; }
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==4.32.5"
fi
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$dir"' EXIT
printf '[limits]\ntimeout = "5s"\nmemory = "256MiB"\n' > "$dir/policy.toml"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
target/debug/palisade serve --policy "$dir/policy.toml" --listen "127.0.0.1:$port" \
    --max-sessions 8 --session-ttl 20s 2>"$dir/log" &
server=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.1
done
"$venv/bin/st" run "http://127.0.0.1:$port/openapi.json" --max-examples "${1:-50}" \
    --request-timeout 30 --checks not_a_server_error,status_code_conformance \
    --exclude-path /v1/sandboxes/{id}/archive
