"""Egress benchmark: a transfer and time to first byte through palisade's proxy versus direct.

A local HTTP server on the host's loopback streams N bytes. curl fetches it directly on the host,
then inside a sandbox through the HTTP proxy (HTTP_PROXY) and through transparent capture (the DNS
stub's address), with the upstream name pinned to the server (`--resolve`) and allowed by an IP rule.
curl's own timings are used (speed, time to first byte), so the sandbox's start-up is not counted.
Runs alternate between the three paths; medians of all runs. No timing is asserted.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PALISADE = os.path.join(ROOT, "target", "release", "palisade")
CHUNK = b"\0" * (1 << 20)


class Bytes(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        n = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/bytes/") else 1
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        while n > 0:
            k = min(n, len(CHUNK))
            self.wfile.write(CHUNK[:k])
            n -= k

    def log_message(self, *a):
        pass


def curl(prefix, url, extra=()):
    fmt = "%{speed_download} %{time_starttransfer} %{time_connect} %{size_download}"
    out = subprocess.run(prefix + ["curl", "-sS", "-o", "/dev/null", "-w", fmt, *extra, url],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"bytes_per_s": float(out[0]), "ttfb_ms": float(out[1]) * 1000, "size": int(out[3])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    a = ap.parse_args()
    if a.quick:
        a.size, a.runs = 8 << 20, 2
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Bytes)
    port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    name = "bench.test"
    sandbox = [PALISADE, "run", "-q", "--no-tty", "--timeout", "10m",
               "--allow-net", f"{name}:{port}", "--allow-net", f"127.0.0.1:{port}",
               "--resolve", f"{name}=127.0.0.1", "--"]
    paths = {
        "direct": ([], f"http://127.0.0.1:{port}/bytes/{{n}}", ()),
        "proxy": (sandbox, f"http://{name}:{port}/bytes/{{n}}", ()),
        "transparent": (sandbox, f"http://{name}:{port}/bytes/{{n}}", ("--noproxy", "*")),
    }
    cmds = {k: " ".join(p + ["curl", "-o", "/dev/null", *e, u.format(n=a.size)]) for k, (p, u, e) in paths.items()}
    res = {k: {"bytes_per_s": [], "ttfb_ms": []} for k in paths}
    for r in range(a.runs):
        for k, (prefix, url, extra) in paths.items():
            big = curl(prefix, url.format(n=a.size), extra)
            assert big["size"] == a.size, (k, big)
            small = curl(prefix, url.format(n=1), extra)
            res[k]["bytes_per_s"].append(big["bytes_per_s"])
            res[k]["ttfb_ms"].append(small["ttfb_ms"])
    d = res["direct"]
    summary = {}
    for k, v in res.items():
        summary[k] = {
            "throughput_mib_s": statistics.median(v["bytes_per_s"]) / (1 << 20),
            "ttfb_ms": statistics.median(v["ttfb_ms"]),
            "throughput_vs_direct": statistics.median(v["bytes_per_s"]) / statistics.median(d["bytes_per_s"]),
            "ttfb_added_ms": statistics.median(v["ttfb_ms"]) - statistics.median(d["ttfb_ms"]),
            "command": cmds[k],
        }
    doc = {"date": datetime.date.today().isoformat(), "kernel": platform.release(),
           "size_bytes": a.size, "runs": a.runs, "quick": a.quick, "results": summary, "raw": res}
    lines = [f"# Egress: proxy versus direct ({doc['date']}, kernel {doc['kernel']})", "",
             f"{a.size} bytes from a local HTTP server, {a.runs} runs per path, medians; time to first "
             "byte from a 1-byte request. curl's own timings (sandbox start-up not included).", "",
             "| path | MiB/s | vs direct | time to first byte (ms) | added (ms) |", "|---|---|---|---|---|"]
    for k, s in summary.items():
        lines.append(f"| {k} | {s['throughput_mib_s']:.0f} | {s['throughput_vs_direct']:.2f} | "
                     f"{s['ttfb_ms']:.2f} | {s['ttfb_added_ms']:+.2f} |")
    lines += ["", "Commands:", ""] + [f"- {k}: `{c}`" for k, c in cmds.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.quick:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "egress.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(a.out, "egress.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
