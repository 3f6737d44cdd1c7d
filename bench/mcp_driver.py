"""Round-trip latency of `palisade mcp` tool calls through the Python MCP SDK's client: run_code with
`print(1)` in Python and sandbox_exec with `true`, over stdio and Streamable HTTP; p50/p99. Beside
pydantic's mcp-run-python (its run_python_code tool) when it can run here (it needs deno, which
fetches Pyodide on first use). Driven by bench/mcp.sh; results in docs/benchmarks/mcp.{json,md}."""

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROOT = benchlib.ROOT


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def timed(session, n, name, args):
    for _ in range(3):  # warm-up
        r = await session.call_tool(name, args)
        assert not r.is_error, r.content[0].text
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await session.call_tool(name, args)
        lat.append((time.perf_counter() - t0) * 1000)
        assert not r.is_error, r.content[0].text
    return {"n": n, "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2), "mean_ms": round(statistics.mean(lat), 2)}


async def palisade_cases(session, n):
    out = {}
    out["run_code python print(1)"] = await timed(session, n, "run_code", {"language": "python", "code": "print(1)"})
    sid = (await session.call_tool("sandbox_create", {})).structured_content["sandbox_id"]
    out["sandbox_exec true"] = await timed(session, n, "sandbox_exec", {"sandbox_id": sid, "command": ["true"]})
    await session.call_tool("sandbox_kill", {"sandbox_id": sid})
    return out


async def over_stdio(cmd, args, n, cases):
    async with stdio_client(StdioServerParameters(command=cmd, args=args)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            return await cases(s, n)


async def over_http(binary, n):
    p = subprocess.Popen([binary, "mcp", "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in p.stderr:
            m = re.search(r"http://\S+", line)
            if m:
                url = m.group(0)
                break
        assert url, "palisade mcp did not print its address"
        async with streamable_http_client(url) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                return await palisade_cases(s, n)
    finally:
        p.terminate()
        p.wait()


async def run_python_cases(session, n):
    return {"run_python_code print(1)": await timed(session, n, "run_python_code", {"python_code": "print(1)"})}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--bin", default=benchlib.PALISADE)
    a = ap.parse_args()
    benchlib.check_profile(a.quick)
    n = 20 if a.quick else 300
    res = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load_at_start": os.getloadavg()[0]},
        "build": benchlib.PROFILE,
        "calls_per_case": n,
        "palisade": {},
    }
    res["palisade"]["stdio"] = await over_stdio(a.bin, ["mcp"], n, palisade_cases)
    res["palisade"]["http"] = await over_http(a.bin, n)
    mrp = shutil.which("mcp-run-python") or os.path.join(os.path.dirname(sys.executable), "mcp-run-python")
    if shutil.which("deno") and os.path.exists(mrp):
        res["mcp-run-python"] = {"stdio": await over_stdio(mrp, ["stdio"], n, run_python_cases)}
    else:
        res["mcp-run-python"] = {
            "not_run": "it runs Python in Pyodide under deno, and fetches Pyodide and its packages from the network on first use; deno is not installed on this machine and the machine has no route to those downloads"
        }
    print(json.dumps(res, indent=2))
    if a.quick:
        return
    with open(os.path.join(a.out, "mcp.json"), "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    rows = []
    for tr in ("stdio", "http"):
        for case, v in res["palisade"][tr].items():
            rows.append(f"| palisade mcp, {tr} | `{case}` | {v['p50_ms']} | {v['p99_ms']} | {v['n']} |")
    if "stdio" in res["mcp-run-python"]:
        for case, v in res["mcp-run-python"]["stdio"].items():
            rows.append(f"| mcp-run-python, stdio | `{case}` | {v['p50_ms']} | {v['p99_ms']} | {v['n']} |")
    md = f"""# `palisade mcp` round trips

`bench/mcp.sh` (driver `bench/mcp_driver.py`): one client of the Python MCP SDK calls each tool {n} times in
a row (after 3 warm-up calls) and times the round trip from the call to its result. Release build,
{res['machine']['cpus']} CPUs, Linux {res['machine']['kernel']}, load average
{res['machine']['load_at_start']:.1f} at the start (the machine is shared with other builds).

| server, transport | call | p50 ms | p99 ms | calls |
|---|---|---|---|---|
{chr(10).join(rows)}

mcp-run-python: {res['mcp-run-python'].get('not_run', 'run beside it, above')}.
"""
    with open(os.path.join(a.out, "mcp.md"), "w") as f:
        f.write(md)


anyio.run(main)
