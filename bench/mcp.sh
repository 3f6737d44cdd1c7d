#!/usr/bin/env bash
# MCP benchmark: round-trip p50/p99 of `palisade mcp` tool calls (run_code `print(1)` in Python,
# sandbox_exec `true`) over stdio and Streamable HTTP, through the Python MCP SDK's client, beside
# pydantic's mcp-run-python where it can run. Usage: bench/mcp.sh [--quick] [--out DIR]
# Needs scripts/mcp-venv.sh. Results: docs/benchmarks/mcp.{json,md} (not with --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/build.sh
venv=${PALISADE_MCP_VENV:-/opt/palisade-ci/mcp-venv}
[ -x "$venv/bin/python" ] || { echo "$venv is missing: run scripts/mcp-venv.sh" >&2; exit 1; }
bench_build --bin palisade
exec "$venv/bin/python" bench/mcp_driver.py "$@"
