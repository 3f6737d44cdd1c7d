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
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PAYLOADS = {
    "true": {"command": ["true"]},
    "true (files)": {"command": ["true"], "files": {"a.txt": "x"}},
    "true (agent)": {"command": ["true"], "files": {"a.txt": "x"}, "fetch": ["a.txt"]},
    "python -c": {"command": ["python3", "-c", "print(sum(range(1000)))"]},
    "python code": {"language": "python", "code": "print(sum(range(1000)))"},
    "python code (agent)": {"language": "python", "code": "print(sum(range(1000)))", "fetch": ["main.py"]},
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


HTTP_LOAD = os.path.join(os.path.dirname(benchlib.PALISADE), "examples", "http_load")


def load(port, body, clients, total, max_seconds, path="/v1/run", host="127.0.0.1", expect=None, cpu=None):
    """`clients` closed-loop clients share `total` requests (at most `max_seconds`); returns
    latencies (s), wall time and outcomes. The clients are native threads (http_load, built from
    crates/palisade-cli/examples): a Python client's threads would queue for the interpreter's lock
    and add that wait to every latency. A request counts under the answer's `status`, or its HTTP
    status when not 200; with `expect` (SandboxFusion's /run_code answer), under "ok" when its
    status is Success and its stdout is `expect`, else "wrong-output" or the status. A refused or
    broken connection counts as "connection". With `cpu` (a list), the generator's own CPU seconds
    are appended to it."""
    with tempfile.NamedTemporaryFile("wb", suffix=".json") as f:
        f.write(json.dumps(body).encode())
        f.flush()
        cmd = [HTTP_LOAD, "--host", host, "--port", str(port), "--path", path, "--body-file", f.name,
               "--clients", str(clients), "--total", str(total), "--seconds", str(max_seconds)]
        if expect is not None:
            cmd += ["--expect-stdout", expect]
        out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"http_load failed ({out.returncode}): {out.stderr.strip()}")
    r = json.loads(out.stdout)
    if cpu is not None:
        cpu.append(r["cpu_s"])
    return r["latencies_s"], r["wall_s"], r["statuses"]


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
    meta = benchlib.host_meta()  # the load average before the run, not after it
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
    meta.update({"date": benchlib.now_utc(), "max_concurrency": 2 * cpus})
    with open(os.path.join(a.out, "server-engines.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    lines = ["# `palisade serve`: cold, template and warm-Python runs", "",
             f"{meta['date']}; {cpus} CPUs, load average {' '.join(meta['loadavg_at_start'])} at the start; "
             "Python `print(1)` as `language`+`code`, closed-loop clients on loopback (bench/server.sh --engines). "
             "cold: `--templates 0` (the exec engine; the sandbox's init writes the code to `main.py`); template: "
             "the default (`--templates 8`: the same from a template); warm-python: `--warm-python` "
             "(`python3 -c`, forked from the warm interpreter).", "",
             "| engine | via | clients | requests | req/s | p50 ms | p99 ms |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['via']} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    with open(os.path.join(a.out, "server-engines.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# --- POST /run_code beside SandboxFusion (issue #20's "10x SandboxFusion" goal) ---------------

CPU_LOOP = "x = 0\nfor i in range(300000):\n    x += i * i % 7\nprint(x)\n"
# (name, body, expected stdout): the body of the third is exactly what veRL's reward path sends for
# one test case (verl.utils.reward_score.sandbox_fusion: check_correctness -> call_sandbox_api,
# its default timeout of 10 s and memory of 1024 MB), with a solution that reads stdin.
RUN_CODE_PAYLOADS = [
    ("python print(1)", {"language": "python", "code": "print(1)"}, "1"),
    ("python CPU loop", {"language": "python", "code": CPU_LOOP},
     str(sum(i * i % 7 for i in range(300000)))),
    ("test case (veRL)", {"compile_timeout": 10, "run_timeout": 10,
                          "code": "a, b = map(int, input().split())\nprint(a + b)\n", "stdin": "3 4\n",
                          "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}, "7"),
]

PALISADE_BOUNDARY = ("per run: own user (root launch: host uid 2147000000, no capabilities), pid, mount, "
                     "network (only `lo`), IPC and UTS namespaces; a fresh tmpfs root with read-only system "
                     "binds and a private scratch; Landlock; seccomp; a cgroup (memory, pids, CPU time) and "
                     "rlimits; no network; a report")
# (name, `palisade serve` arguments, short isolation, long isolation)
RUN_CODE_PALISADE = [
    ("palisade (templates, default)", [], "ns+Landlock+seccomp+cgroup, no net",
     PALISADE_BOUNDARY + "; the sandbox is forked from a prepared template (docs/engine.md)"),
    ("palisade --warm-python", ["--warm-python"], "ns+Landlock+seccomp+cgroup, no net",
     PALISADE_BOUNDARY + "; the sandbox is forked from a template whose zygote has started Python "
     "(`python3 -c CODE`; what warm runs share: docs/engine.md, \"Warm Python\")"),
    ("palisade --templates 0 (cold)", ["--templates", "0"], "ns+Landlock+seccomp+cgroup, no net",
     PALISADE_BOUNDARY + "; every sandbox started from scratch (the exec engine)"),
]
# What SandboxFusion's `sandbox.isolation` modes do (sandbox/runners/base.py, run_commands, and
# sandbox/runners/isolation.py at the commit in docs/benchmarks.md).
SANDBOXFUSION_ISOLATION = {
    "lite": ("chroot+overlay, pid+net ns, cgroup; root, egress open",
             "`isolation: lite`: per run an overlayfs over the host's `/` (writes copy-on-write, every host "
             "file readable) + chroot, the host's `/dev` bind-mounted, `/proc` and `/sys` mounted; its own pid "
             "namespace (`unshare --pid`); a network namespace with a veth to the host and NAT out of the "
             "host's default route (egress open; `ip netns exec` also gives it a mount namespace); cgroup v1 "
             "memory 4 GiB (`memory_limit_MB` ignored) and a 1-CPU quota, kept and reused across runs; the "
             "code runs as root in the host's user namespace with root's capabilities, no seccomp, no "
             "Landlock, no limit on processes"),
    "none": ("none: a host process (root here)",
             "`isolation: none` (its default `local.yaml`, what its server image runs): the code is a child "
             "of the server on the host, same user, files, network and processes; only RLIMIT_AS/DATA/STACK "
             "from `memory_limit_MB`"),
}


def cpu_seconds():
    """CPU seconds the whole machine has spent (user, nice, system, irq, softirq; guest is in user)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root):
    """CPU seconds of process `root` and every live descendant, each with its reaped children's
    (`cutime`/`cstime`): a server with its sandboxes, which it (or a process under it) waits for.
    Not counted: kernel work done in kernel threads (e.g. a network namespace's teardown)."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        v = st[st.rindex(")") + 2:].split()
        procs[int(d)] = (int(v[1]), sum(int(x) for x in v[11:15]))
    kids = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            total += procs[pid][1]
            todo += kids.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def pid_listening(port):
    """The process that has a TCP socket listening on `port` (needs to see other users' /proc/*/fd)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    v = line.split()
                    if v[3] == "0A" and int(v[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{v[9]}]")
        except OSError:
            pass
    for d in sorted(os.listdir("/proc"), key=lambda x: (not x.isdigit(), x)):
        if not d.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                if os.readlink(f"/proc/{d}/fd/{fd}") in inodes:
                    return int(d)
        except OSError:
            continue
    return None


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def parse_peer(spec):
    """`[LABEL=]URL` -> (label, host, port, path); LABEL names SandboxFusion's isolation mode."""
    label, _, url = spec.partition("=") if "=" in spec.split("://")[0] else ("", "", spec)
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname or not u.port:
        raise SystemExit(f"--peer-sandboxfusion: {spec!r} is not [LABEL=]http://HOST:PORT[/run_code]")
    path = u.path.rstrip("/")
    path = path if path.endswith("/run_code") else path + "/run_code"
    return (label or "lite"), u.hostname, u.port, path


def run_code_compare(a):
    """The same /run_code payloads through palisade's three engines and each SandboxFusion peer,
    interleaved (each row of one payload and client count runs the targets in a rotated order)."""
    cpus = os.cpu_count() or 1
    concurrency = 2 * cpus
    clients_list = [1, 4] if a.quick else [1, 4, 16, 32]
    cap = 10 if a.quick else a.row_seconds
    meta = benchlib.host_meta()
    meta.update({"date": benchlib.now_utc(), "max_concurrency": concurrency, "row_seconds": cap,
                 "palisade_commit": subprocess.run(["git", "-C", benchlib.ROOT, "rev-parse", "--short", "HEAD"],
                                                   capture_output=True, text=True).stdout.strip()})
    targets, servers = [], []
    try:
        for name, extra, short, long in RUN_CODE_PALISADE:
            port = free_port()
            servers.append(start_server(port, concurrency, 0, extra))
            targets.append({"server": name, "host": "127.0.0.1", "port": port, "path": "/run_code",
                            "pid": servers[-1].pid,
                            "isolation": short, "isolation_long": long})
        meta["peers"] = []
        for spec in a.peer_sandboxfusion:
            label, host, port, path = parse_peer(spec)
            short, long = SANDBOXFUSION_ISOLATION.get(label, (f"as configured ({label})", f"as configured ({label})"))
            pid = pid_listening(port) if host in ("127.0.0.1", "localhost", "::1") else None
            if pid is None:
                print(f"SandboxFusion ({label}): no local process listens on {port}; its CPU per request "
                      "is not measured", flush=True)
            targets.append({"server": f"SandboxFusion ({label})", "host": host, "port": port, "path": path,
                            "pid": pid,
                            "isolation": short, "isolation_long": long})
            meta["peers"].append({"label": label, "url": f"http://{host}:{port}{path}"})
        for t in targets:
            # Warm up: each payload (a request's limits pick palisade's template), then one request per
            # client at the highest concurrency (SandboxFusion keeps a cgroup and a netns per concurrent run).
            warm = [(body, expected, 2, 4) for _, body, expected in RUN_CODE_PAYLOADS]
            warm.append((RUN_CODE_PAYLOADS[0][1], RUN_CODE_PAYLOADS[0][2], max(clients_list), max(clients_list)))
            for body, expected, c, n in warm:
                _, _, st = load(t["port"], body, c, n, 180, t["path"], t["host"], expected)
                if set(st) != {"ok"}:
                    print(f"warm-up of {t['server']}: {st}", flush=True)
        rows = []
        k = 0
        for pname, body, expected in RUN_CODE_PAYLOADS:
            for c in clients_list:
                for t in targets[k % len(targets):] + targets[:k % len(targets)]:
                    la = loadavg()[0]
                    total = 4 if a.quick else max(40, 20 * c)
                    c0, s0 = cpu_seconds(), tree_cpu_seconds(t["pid"]) if t["pid"] else None
                    gen = []
                    lat, wall, st = load(t["port"], body, c, total, cap, t["path"], t["host"], expected, gen)
                    cpu, s1 = cpu_seconds() - c0, tree_cpu_seconds(t["pid"]) if t["pid"] else None
                    n = max(1, len(lat))
                    r = row(pname, c, lat, wall, st) if lat else {"payload": pname, "clients": c, "requests": 0,
                                                                  "rps": 0.0, "p50_ms": 0, "p99_ms": 0, "statuses": st}
                    r.update({"server": t["server"], "isolation": t["isolation"],
                              "errors": sum(v for key, v in st.items() if key != "ok"),
                              "cpu_ms_per_req": cpu / n * 1000,
                              "client_cpu_ms_per_req": gen[0] / n * 1000,
                              "server_cpu_ms_per_req": (s1 - s0) / n * 1000 if s0 is not None else None,
                              "machine_busy_cpus": cpu / wall, "loadavg_1m": la})
                    rows.append(r)
                    print(f"{t['server']:<32} {pname:<17} clients {c:>2}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                          f"p99 {r['p99_ms']:7.1f} ms  cpu/req {r['cpu_ms_per_req']:6.1f} ms, server's {r['server_cpu_ms_per_req'] or 0:6.1f} ms  "
                          f"busy {cpu / wall:.2f} CPUs  load {la}  {st}", flush=True)
                k += 1
    finally:
        for s in servers:
            s.terminate()
            s.wait()
    meta["loadavg_at_end"] = loadavg()
    meta["targets"] = [{k: t[k] for k in ("server", "isolation", "isolation_long")} for t in targets]
    if a.quick:
        return
    write_results(a.out, run_code={"meta": meta, "rows": rows})


def render_main(doc):
    meta, rows = doc["meta"], doc["rows"]
    lines = ["# `palisade serve` throughput and latency", "",
             f"{meta['date']}; {meta['cpus']} CPUs, load average {' '.join(meta['loadavg_at_start'])} at the start; "
             f"`--max-concurrency {meta['max_concurrency']}`; closed-loop clients on loopback, native "
             "threads (bench/server.sh; client CPU: the load generator's own CPU per request, part of what "
             "the 2 CPUs spent). `(files)` and `python code`: the sandbox's init writes the files (the code "
             "to `main.py`) before the program starts, which is the sandbox's payload; `(agent)`: the same "
             "with a file to fetch back, which goes through the in-sandbox agent; the others start the "
             "command directly. `+pool`: with `--pool 8`. "
             + (f"Each row ran for {meta['row_seconds']:g} s. "
                if meta.get("row_seconds") else "")
             + "Compare rows of one run: the load average says how busy the machine was.", "",
             "| via | payload | clients | requests | req/s | p50 ms | p99 ms | client CPU ms/req |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gen = r.get("client_cpu_ms_per_req")
        lines.append(f"| {r.get('via', 'POST /v1/run')} | {r['payload']} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     + (f"{gen:.2f} |" if gen is not None else "— |"))
    return lines


def render_run_code(doc):
    meta, rows = doc["meta"], doc["rows"]
    peers = ", ".join(f"`{p['label']}` at {p['url']}" for p in meta.get("peers", [])) or "none given"
    lines = ["## `POST /run_code` beside SandboxFusion", "",
             f"{meta['date']}; {meta['cpus']} CPUs, kernel {meta['kernel']}, as {meta['user']}; palisade "
             f"{meta.get('palisade_commit', '?')} with `--max-concurrency {meta['max_concurrency']}`; SandboxFusion "
             f"peers: {peers} (how they were set up: docs/benchmarks.md, \"SandboxFusion\"). Load average "
             f"{' '.join(meta['loadavg_at_start'])} at the start, {' '.join(meta['loadavg_at_end'])} at the end. "
             "`bench/server.sh --run-code --peer-sandboxfusion [LABEL=]URL`: the same SandboxFusion-shaped "
             "requests to every server, closed-loop clients on loopback, each row at most "
             f"{meta.get('row_seconds', '?')} s, the servers of one payload and client count measured one "
             "after the other in a rotated order. errors: any answer but `Success` with the expected stdout. "
             "CPU ms/req, machine: CPU seconds the whole machine spent during the row (user+system of every "
             "process: the servers, their sandboxes, the load generator (native threads, `client_cpu_ms_per_req` "
             "in the JSON), and the other work on this shared VM; "
             "and kernel threads) / requests; where the VM is saturated by other work this is about "
             "2 CPUs × the row's length / requests and says little. server: CPU seconds of the server's "
             "process tree (the server, its sandboxes and every process they waited for) / requests; it "
             "leaves out work the kernel does in its own threads, e.g. tearing down a run's network "
             "namespace (SandboxFusion reuses its network namespaces; palisade's templates without egress "
             "reuse one no earlier run made a socket in, since 2026-12-04 13:00).", "",
             "| server | isolation | payload | clients | requests | req/s | p50 ms | p99 ms | errors | CPU ms/req, machine | server |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['isolation']} | {r['payload']} | {r['clients']} | {r['requests']} | "
                     f"{r['rps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | "
                     f"{r['cpu_ms_per_req']:.1f} | "
                     + (f"{r['server_cpu_ms_per_req']:.1f} |" if r.get("server_cpu_ms_per_req") is not None else "— |"))
    peers_ = [t["server"] for t in meta["targets"] if t["server"].startswith("SandboxFusion")]
    ours = [t["server"] for t in meta["targets"] if not t["server"].startswith("SandboxFusion")]
    if peers_:
        by = {(r["server"], r["payload"], r["clients"]): r for r in rows}
        lines += ["", "### Throughput ratios, palisade / SandboxFusion (req/s of the same row)", "",
                  "| payload | clients | " + " | ".join(f"{o} / {p}" for p in peers_ for o in ours) + " |",
                  "|---|---:|" + "---:|" * (len(peers_) * len(ours))]
        keys = sorted({(r["payload"], r["clients"]) for r in rows},
                      key=lambda k: ([p for p, _, _ in RUN_CODE_PAYLOADS].index(k[0]), k[1]))
        for pl, c in keys:
            cells = []
            for p in peers_:
                for o in ours:
                    a, b = by.get((o, pl, c)), by.get((p, pl, c))
                    cells.append(f"{a['rps'] / b['rps']:.1f}×" if a and b and b["rps"] > 0 else "—")
            lines.append(f"| {pl} | {c} | " + " | ".join(cells) + " |")
        lines += ["", "### Server CPU per request, SandboxFusion / palisade (the `server` column of the same row)", "",
                  "Less sensitive to the other work on the machine than req/s.", "",
                  "| payload | clients | " + " | ".join(f"{p} / {o}" for p in peers_ for o in ours) + " |",
                  "|---|---:|" + "---:|" * (len(peers_) * len(ours))]
        for pl, c in keys:
            cells = []
            for p in peers_:
                for o in ours:
                    a, b = by.get((o, pl, c)), by.get((p, pl, c))
                    ok = a and b and a.get("server_cpu_ms_per_req") and b.get("server_cpu_ms_per_req") is not None
                    cells.append(f"{b['server_cpu_ms_per_req'] / a['server_cpu_ms_per_req']:.1f}×" if ok else "—")
            lines.append(f"| {pl} | {c} | " + " | ".join(cells) + " |")
    lines += ["", "### What each server isolates", "", "| server | per run |", "|---|---|"]
    for t in meta["targets"]:
        lines.append(f"| {t['server']} | {t['isolation_long']} |")
    return lines


def write_results(out, main=None, run_code=None):
    """server.json holds both parts; a run replaces the part it measured and keeps the other."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "server.json")
    doc = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    if main is not None:
        doc.update(main)
    if run_code is not None:
        doc["run_code"] = run_code
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    lines = render_main(doc) if "rows" in doc else ["# `palisade serve` throughput and latency"]
    if "run_code" in doc:
        lines += [""] + render_run_code(doc["run_code"])
    with open(os.path.join(out, "server.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few requests per row, no files written")
    ap.add_argument("--engines", action="store_true",
                    help="only cold vs template vs warm Python (docs/benchmarks/server-engines.*)")
    ap.add_argument("--run-code", action="store_true",
                    help="only POST /run_code through palisade's engines and each --peer-sandboxfusion")
    ap.add_argument("--peer-sandboxfusion", action="append", metavar="[LABEL=]URL",
                    default=os.environ.get("PALISADE_BENCH_SANDBOXFUSION", "").split(),
                    help="a running SandboxFusion server to measure beside palisade on /run_code; LABEL is its "
                         "isolation mode (lite, none; default lite); repeatable; default from "
                         "$PALISADE_BENCH_SANDBOXFUSION (space-separated)")
    ap.add_argument("--row-seconds", type=float, default=15.0, help="longest a /run_code row may take")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="how long each row of the main table runs")
    ap.add_argument("--out", default=os.path.join(benchlib.ROOT, "docs", "benchmarks"))
    a = ap.parse_args()
    if not a.seconds > 0 or not a.row_seconds > 0:
        ap.error("--seconds and --row-seconds: a number of seconds above 0")
    benchlib.check_profile(a.quick)
    if a.engines:
        engines(a)
        return
    if a.run_code:
        run_code_compare(a)
        return
    clients_list = [1, 4] if a.quick else [1, 4, 16, 32, 64]
    per_client = 3 if a.quick else 60
    cap = 20 if a.quick else 60
    # A full row runs for `--seconds`: a fixed count of requests was
    # 60 requests with one client, a tenth of a second of `true`, short enough for one slow
    # moment of the machine to set the row's rate.
    seconds = None if a.quick else a.seconds
    cpus = os.cpu_count() or 1
    concurrency = 2 * cpus
    meta = benchlib.host_meta()  # the load average before the run, not after it
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
                gen = []
                if seconds is None:
                    lat, wall, st = load(port, body, c, total, cap, cpu=gen)
                else:
                    lat, wall, st = load(port, body, c, 10**9, seconds, cpu=gen)
                r = row(name, c, lat, wall, st)
                r["client_cpu_ms_per_req"] = gen[0] / max(1, len(lat)) * 1000
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
    if not a.quick:
        meta.update({"date": benchlib.now_utc(), "max_concurrency": concurrency, "row_seconds": seconds})
        write_results(a.out, main={"meta": meta, "rows": rows})
    # With a peer, the /run_code comparison runs in the same invocation; without one, as before.
    if a.peer_sandboxfusion:
        run_code_compare(a)


if __name__ == "__main__":
    main()
