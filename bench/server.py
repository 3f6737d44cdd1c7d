"""Load generator for bench/server.sh: closed-loop clients (each sends its next request when the
last one is answered) against `palisade serve` on a loopback port, and a loop of `palisade run`
for comparison. Only loopback traffic; every loop is bounded in count and time."""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PAYLOADS = {
    "true": {"command": ["true"]},
    "true (agent)": {"command": ["true"], "files": {"a.txt": "x"}},
    "python -c": {"command": ["python3", "-c", "print(sum(range(1000)))"]},
    "python code (agent)": {"language": "python", "code": "print(sum(range(1000)))"},
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_server(port, concurrency, pool=0, extra=()):
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([benchlib.PALISADE, "serve", "--listen", f"127.0.0.1:{port}",
                          "--max-concurrency", str(concurrency), "--max-queue", "4096", "--pool", str(pool),
                          *extra],
                         stdout=subprocess.DEVNULL, stderr=log)
    t0 = time.time()
    while time.time() - t0 < 30:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    log.seek(0)
    raise SystemExit("palisade serve did not start: " + log.read().decode(errors="replace"))


def load(port, body, clients, total, max_seconds, path="/v1/run"):
    """`clients` threads share `total` requests; returns latencies (s), wall time, statuses."""
    data = json.dumps(body).encode()
    lat, statuses, lock = [], {}, threading.Lock()
    left = [total]
    deadline = time.time() + max_seconds

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                if left[0] <= 0 or time.time() > deadline:
                    return
                left[0] -= 1
            t = time.perf_counter()
            c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            out = json.loads(r.read())
            dt = time.perf_counter() - t
            key = out.get("status", str(r.status)) if r.status == 200 else str(r.status)
            with lock:
                lat.append(dt)
                statuses[key] = statuses.get(key, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, time.perf_counter() - t0, statuses


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def cli_loop(n, args):
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([benchlib.PALISADE, "run", "-q", "--no-tty", "--"] + args,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0


def row(name, clients, lat, wall, statuses):
    return {"payload": name, "clients": clients, "requests": len(lat), "rps": len(lat) / wall,
            "p50_ms": pct(lat, 50) * 1000, "p99_ms": pct(lat, 99) * 1000,
            "mean_ms": statistics.mean(lat) * 1000, "statuses": statuses}


ENGINES = [("cold", ["--templates", "0"]), ("template", []), ("warm-python", ["--warm-python"])]
ENGINE_PAYLOADS = [("/v1/run", {"language": "python", "code": "print(1)"}),
                   ("/run_code", {"language": "python", "code": "print(1)"})]


def engines(a):
    """Cold vs template vs warm Python for Python print(1), 1 and 2 clients."""
    cpus = os.cpu_count() or 1
    rows = []
    n = 10 if a.quick else 200
    for engine, extra in ENGINES:
        port = free_port()
        server = start_server(port, 2 * cpus, 0, extra)
        try:
            for path, body in ENGINE_PAYLOADS:
                load(port, body, 2, 6, 60, path)  # warm up
                for c in (1, 2):
                    lat, wall, st = load(port, body, c, n, 120, path)
                    r = row("python print(1)", c, lat, wall, st)
                    r.update({"via": path, "engine": engine})
                    rows.append(r)
                    print(f"{engine:<12} {path:<9} clients {c}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:6.1f} ms  {st}", flush=True)
        finally:
            server.terminate()
            server.wait()
    if a.quick:
        return
    meta = benchlib.host_meta()
    meta.update({"date": benchlib.now_utc(), "max_concurrency": 2 * cpus})
    with open(os.path.join(a.out, "server-engines.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    lines = ["# `palisade serve`: cold, template and warm-Python runs", "",
             f"{meta['date']}; {cpus} CPUs, load average {' '.join(meta['loadavg_at_start'])} at the start; "
             "Python `print(1)` as `language`+`code`, closed-loop clients on loopback (bench/server.sh --engines). "
             "cold: `--templates 0` (the exec engine, through the agent); template: the default (`--templates 8`: "
             "the agent in a sandbox from a template); warm-python: `--warm-python` (`python3 -c`, forked from "
             "the warm interpreter, no agent).", "",
             "| engine | via | clients | requests | req/s | p50 ms | p99 ms |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['via']} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    with open(os.path.join(a.out, "server-engines.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few requests per row, no files written")
    ap.add_argument("--engines", action="store_true",
                    help="only cold vs template vs warm Python (docs/benchmarks/server-engines.*)")
    ap.add_argument("--out", default=os.path.join(benchlib.ROOT, "docs", "benchmarks"))
    a = ap.parse_args()
    if a.engines:
        engines(a)
        return
    clients_list = [1, 4] if a.quick else [1, 4, 16, 32, 64]
    per_client = 3 if a.quick else 60
    cap = 20 if a.quick else 60
    cpus = os.cpu_count() or 1
    concurrency = 2 * cpus
    rows = []
    runs = [(name, body, 0) for name, body in PAYLOADS.items()]
    # The warm pool serves runs through the agent with the default policy.
    runs += [(name + " +pool", body, 8) for name, body in PAYLOADS.items() if "agent" in name]
    for name, body, pool in runs:
        port = free_port()
        server = start_server(port, concurrency, pool)
        try:
            load(port, body, 2, 4, cap)  # warm up
            for c in clients_list:
                total = max(30 if not a.quick else 4, per_client * c if c < 16 else 20 * c)
                lat, wall, st = load(port, body, c, total, cap)
                r = row(name, c, lat, wall, st)
                rows.append(r)
                print(f"serve  {name:<26} clients {c:>2}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  {st}", flush=True)
        finally:
            server.terminate()
            server.wait()
    n = 5 if a.quick else 100
    for name, args in [("true", ["true"]), ("python -c", ["python3", "-c", "print(sum(range(1000)))"])]:
        lat, wall = cli_loop(n, args)
        r = row(name, 1, lat, wall, {"ok": n})
        r["via"] = "palisade run (loop)"
        rows.append(r)
        print(f"run    {name:<20} sequential : {r['rps']:7.1f} runs/s p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms", flush=True)
    if a.quick:
        return
    meta = benchlib.host_meta()
    meta.update({"date": benchlib.now_utc(), "max_concurrency": concurrency})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "server.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    lines = ["# `palisade serve` throughput and latency", "",
             f"{meta['date']}; {cpus} CPUs, load average {' '.join(meta['loadavg_at_start'])} at the start; "
             f"`--max-concurrency {concurrency}`; closed-loop clients on loopback "
             "(bench/server.sh). `(agent)`: the run goes through the in-sandbox agent (files in), as code in a "
             "language does; the others start the command directly. `+pool`: with `--pool 8`. Compare rows of one run: the load average "
             "says how busy the machine was.", "",
             "| via | payload | clients | requests | req/s | p50 ms | p99 ms |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.get('via', 'POST /v1/run')} | {r['payload']} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    with open(os.path.join(a.out, "server.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
