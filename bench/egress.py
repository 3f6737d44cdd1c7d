"""Egress benchmark: a transfer and time to first byte through palisade's proxy versus direct.

A local HTTP server on the host's loopback streams N bytes. curl fetches it directly on the host,
then inside a sandbox through the HTTP proxy (HTTP_PROXY) and through transparent capture (the DNS
stub's address), with the upstream name pinned to the server (`--resolve`) and allowed by an IP rule.
curl's own timings are used (speed, time to first byte), so the sandbox's start-up is not counted.
Runs alternate between the three paths; medians of all runs. No timing is asserted.

Then over TLS (https), the same server behind a certificate of a CA made for the benchmark: curl
directly, through the plain CONNECT tunnel (the TLS is curl's and the server's end to end), and
through TLS inspection (`--inspect`: the proxy ends curl's TLS with a leaf of the run's CA, checks
each request, and makes its own TLS to the server), by proxy and transparently. Time to first byte
is taken twice per run: the first connection of the sandbox (the proxy signs the host's leaf) and
a second one (the leaf is kept per host and run).

Then the same over a link (as root): the server in a network namespace of its own behind a veth pair
shaped with tbf to each rate of --links. On loopback only the CPUs bound a transfer, and the relay's
second pass through TCP competes with curl and the server for them; over a link, as upstreams are
reached in use, the question is whether the proxy keeps up with the link. Beside palisade's paths:
a plain socat relay with no sandbox (the floor for any proxy: one more TCP connection) and srt's
proxy, the one peer that filters egress by host.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import PALISADE, PROFILE, ROOT, check_profile  # noqa: E402

CHUNK = b"\0" * (1 << 20)
# Anthropic's sandbox-runtime, the one peer that filters egress by host (bench/setup-peers.sh).
SRT = os.path.join(os.environ.get("PALISADE_BENCH_PEERS", "/opt/palisade-bench-peers"), "npm", "node_modules",
                   ".bin", "srt")
SRT_SKIP = None if os.access(SRT, os.X_OK) else f"not installed ({SRT}; bench/setup-peers.sh installs it)"


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
    """One transfer; curl's own speed and time to first byte, and the CPU time of everything the
    command ran (curl, and for sandboxed paths palisade's supervisor with its relay threads, and
    init), from the rusage of reaped children."""
    fmt = "%{speed_download} %{time_starttransfer} %{time_connect} %{size_download}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(prefix + ["curl", "-sS", "-o", "/dev/null", "-w", fmt, *extra, url],
                         capture_output=True, text=True, check=True).stdout.split()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"bytes_per_s": float(out[0]), "ttfb_ms": float(out[1]) * 1000, "size": int(out[3]), "cpu_s": cpu}


def serve(addr, port, certdir=None):
    """The byte server alone (for the link rows, started inside the link's network namespace);
    with `certdir`, over TLS."""
    srv = TlsServer((addr, port), certdir) if certdir else ThreadingHTTPServer((addr, port), Bytes)
    srv.serve_forever()


class TlsServer(ThreadingHTTPServer):
    """The byte server over TLS, each response leaving as written (TCP_NODELAY): without it the
    handshake's last flight and a small response wait for the client's delayed acknowledgment
    (40 ms), which would swamp what is measured."""

    def __init__(self, addr, certdir):
        super().__init__(addr, Bytes)
        self.socket = tls_context(certdir).wrap_socket(self.socket, server_side=True,
                                                       do_handshake_on_connect=False)

    def get_request(self):
        s, a = self.socket.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s, a


def make_certs(d, name):
    """A CA for the benchmark and a certificate for `name` it signs, in `d`."""
    def run(*cmd):
        subprocess.run(cmd, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-subj", "/CN=palisade bench CA", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", f"/CN={name}", "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr")
    with open(f"{d}/server.ext", "w") as f:
        f.write(f"subjectAltName=DNS:{name}\nextendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\n")
    run("openssl", "x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{d}/server.ext", "-out", f"{d}/server.pem")
    os.chmod(d, 0o755)
    for f in ("ca.pem", "server.pem", "server.key"):
        os.chmod(f"{d}/{f}", 0o644)


def tls_context(d):
    import ssl
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(f"{d}/server.pem", f"{d}/server.key")
    return ctx


def wait_port(addr, port, proc):
    """Until something accepts on addr:port; exits if proc ends first or after 5 s."""
    for _ in range(100):
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise SystemExit(f"bench/egress.py: {proc.args[0]} did not start listening on {addr}:{port}")


def sh(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


class Link:
    """A test host behind a veth pair, its sending side shaped by tbf: a network namespace with
    198.19.0.2 (the benchmarking range, RFC 2544), the host side 198.19.0.1. Made and removed here."""

    NS, HOST_IF, NS_IF = "palisade-bench-eg", "pbe-h", "pbe-n"
    ADDR = "198.19.0.2"

    def __enter__(self):
        self.srv = None
        self.remove()  # what an interrupted earlier run left
        try:
            return self.make()
        except BaseException:
            self.remove()
            raise

    def make(self):
        sh("ip", "netns", "add", self.NS)
        sh("ip", "link", "add", self.HOST_IF, "type", "veth", "peer", "name", self.NS_IF)
        sh("ip", "link", "set", self.NS_IF, "netns", self.NS)
        sh("ip", "addr", "add", "198.19.0.1/24", "dev", self.HOST_IF)
        sh("ip", "link", "set", self.HOST_IF, "up")
        sh("ip", "-n", self.NS, "addr", "add", f"{self.ADDR}/24", "dev", self.NS_IF)
        sh("ip", "-n", self.NS, "link", "set", self.NS_IF, "up")
        sh("ip", "-n", self.NS, "link", "set", "lo", "up")
        self.port = 18089
        self.srv = subprocess.Popen(["ip", "netns", "exec", self.NS, sys.executable, os.path.abspath(__file__),
                                     "--serve", f"{self.ADDR}:{self.port}"])
        wait_port(self.ADDR, self.port, self.srv)
        return self

    def rate(self, r):
        # A burst of 4 MB holds the rate at any of these speeds (rate / HZ is 1.25 MB at 10 Gbit/s).
        sh("tc", "-n", self.NS, "qdisc", "replace", "dev", self.NS_IF, "root", "tbf", "rate", r,
           "burst", "4mb", "latency", "50ms")

    def __exit__(self, *exc):
        self.remove()

    def remove(self):
        if self.srv:
            self.srv.kill()
            self.srv.wait()
        # Deleting one end of the veth pair deletes both, even while something holds the namespace.
        for cmd in (["ip", "link", "del", self.HOST_IF], ["ip", "netns", "del", self.NS]):
            subprocess.run(cmd, stderr=subprocess.DEVNULL)


def measure(addr, port, a, name="bench.test"):
    """Direct, proxy and transparent transfers from addr:port, interleaved; medians."""
    sandbox = [PALISADE, "run", "-q", "--no-tty", "--timeout", "10m",
               "--allow-net", f"{name}:{port}", "--allow-net", f"{addr}:{port}",
               "--resolve", f"{name}={addr}", "--"]
    paths = {
        "direct": ([], f"http://{addr}:{port}/bytes/{{n}}", ()),
        "proxy": (sandbox, f"http://{name}:{port}/bytes/{{n}}", ()),
        "transparent": (sandbox, f"http://{name}:{port}/bytes/{{n}}", ("--noproxy", "*")),
    }
    relay = None
    if shutil.which("socat"):
        # The floor for any proxy: a plain relay, no sandbox, no checks, copying through a 1 MiB
        # buffer, with curl on the host. What separates it from direct is the second TCP connection.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            rport = probe.getsockname()[1]
        relay = subprocess.Popen(["socat", "-b", str(1 << 20), f"TCP-LISTEN:{rport},bind=127.0.0.1,reuseaddr,fork",
                                  f"TCP:{addr}:{port}"])
        wait_port("127.0.0.1", rport, relay)
        paths["socat relay (reference)"] = ([], f"http://127.0.0.1:{rport}/bytes/{{n}}", ())
    if SRT_SKIP is None:
        # srt's own proxy (Node, on the host) with the address as its one allowed domain; its
        # NO_PROXY names loopback, so curl is told to ignore it and go through the proxy, as it
        # would for a remote allowed host.
        settings = os.path.join(a.state, f"srt-{addr}.json")
        with open(settings, "w") as f:
            json.dump({"network": {"allowedDomains": [addr], "deniedDomains": []},
                       "filesystem": {"denyRead": [], "allowWrite": [a.state], "denyWrite": []}}, f)
        paths["srt (peer)"] = ([SRT, "-s", settings, "--"], f"http://{addr}:{port}/bytes/{{n}}",
                               ("--noproxy", ""))
    cmds = {k: shlex.join(p + ["curl", "-o", "/dev/null", *e, u.format(n=a.size)]) for k, (p, u, e) in paths.items()}
    res = {k: {"bytes_per_s": [], "ttfb_ms": [], "cpu_s_per_gib": []} for k in paths}
    for r in range(a.runs):
        for k, (prefix, url, extra) in paths.items():
            big = curl(prefix, url.format(n=a.size), extra)
            assert big["size"] == a.size, (k, big)
            small = curl(prefix, url.format(n=1), extra)
            res[k]["bytes_per_s"].append(big["bytes_per_s"])
            res[k]["ttfb_ms"].append(small["ttfb_ms"])
            # The small request's CPU is mostly start-up; taken off so that what is left is per byte.
            res[k]["cpu_s_per_gib"].append(max(big["cpu_s"] - small["cpu_s"], 0) * (1 << 30) / a.size)
    if relay:
        # socat (forking per connection) is reaped only now: its CPU, spread over its transfers.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        relay.terminate()
        relay.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        per_gib = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * (1 << 30) / (a.size * a.runs)
        res["socat relay (reference)"]["cpu_s_per_gib"] = [c + per_gib for c in res["socat relay (reference)"]["cpu_s_per_gib"]]
    d = res["direct"]
    summary = {}
    for k, v in res.items():
        summary[k] = {
            "throughput_mib_s": statistics.median(v["bytes_per_s"]) / (1 << 20),
            "ttfb_ms": statistics.median(v["ttfb_ms"]),
            "throughput_vs_direct": statistics.median(v["bytes_per_s"]) / statistics.median(d["bytes_per_s"]),
            "ttfb_added_ms": statistics.median(v["ttfb_ms"]) - statistics.median(d["ttfb_ms"]),
            "cpu_s_per_gib": statistics.median(v["cpu_s_per_gib"]),
            "command": cmds[k],
        }
    return summary, res


def measure_tls(addr, port, a, name="bench.test"):
    """Direct, CONNECT tunnel, and inspected (proxy and transparent) HTTPS transfers from
    addr:port, interleaved; medians. Time to first byte of a sandbox's first connection (the
    proxy signs the host's leaf) and of its second (the leaf is kept)."""
    ca = os.path.join(a.certs, "ca.pem")
    # Every path's curl reads a whole system bundle, as clients do (with OpenSSL 3.0 that alone
    # takes about 20 ms): the host's with the benchmark's CA for direct and the tunnel, the one
    # palisade shows inside (the same with the run's CA) for inspection.
    bundle = os.path.join(a.certs, "bundle.pem")
    with open(bundle, "wb") as out:
        for f in [b for b in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
                  if os.path.exists(b)][:1] + [ca]:
            out.write(open(f, "rb").read())
    os.chmod(bundle, 0o644)
    base = [PALISADE, "run", "-q", "--no-tty", "--timeout", "10m",
            "--allow-net", f"{name}:{port}", "--allow-net", f"{addr}:{port}", "--resolve", f"{name}={addr}"]
    tunnel = base + ["--ro", f"{bundle}:/bench-bundle.pem", "--"]
    inspected = base + ["--inspect", "--upstream-ca", ca, "--"]
    url = f"https://{name}:{port}/bytes/{{n}}"
    paths = {
        "direct": ([], ("--cacert", bundle, "--resolve", f"{name}:{port}:{addr}")),
        "CONNECT tunnel": (tunnel, ("--cacert", "/bench-bundle.pem")),
        "inspected, proxy": (inspected, ()),
        "inspected, transparent": (inspected, ("--noproxy", "*")),
    }
    cmds = {k: shlex.join(p + ["curl", "-o", "/dev/null", *e, url.format(n=a.size)]) for k, (p, e) in paths.items()}
    res = {k: {"bytes_per_s": [], "ttfb_ms": [], "ttfb_first_ms": [], "cpu_s_per_gib": []} for k in paths}
    fmt = "%{speed_download} %{time_starttransfer} %{size_download}\\n"
    for r in range(a.runs):
        for k, (prefix, extra) in paths.items():
            big = curl(prefix, url.format(n=a.size), extra)
            assert big["size"] == a.size, (k, big)
            # Two connections in one sandbox: the first and the second time to first byte.
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            one = shlex.join(["curl", "-sS", "-o", "/dev/null", "-w", fmt, *extra, url.format(n=1)])
            out = subprocess.run(prefix + ["sh", "-c", f"{one}; {one}"] if prefix else ["sh", "-c", f"{one}; {one}"],
                                 capture_output=True, text=True, check=True).stdout.split()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            small_cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / 2
            res[k]["bytes_per_s"].append(big["bytes_per_s"])
            res[k]["ttfb_first_ms"].append(float(out[1]) * 1000)
            res[k]["ttfb_ms"].append(float(out[4]) * 1000)
            res[k]["cpu_s_per_gib"].append(max(big["cpu_s"] - small_cpu, 0) * (1 << 30) / a.size)
    d, t = res["direct"], res["CONNECT tunnel"]
    med = statistics.median
    return {k: {
        "throughput_mib_s": med(v["bytes_per_s"]) / (1 << 20),
        "throughput_vs_direct": med(v["bytes_per_s"]) / med(d["bytes_per_s"]),
        "throughput_vs_tunnel": med(v["bytes_per_s"]) / med(t["bytes_per_s"]),
        "ttfb_first_ms": med(v["ttfb_first_ms"]),
        "ttfb_ms": med(v["ttfb_ms"]),
        "ttfb_added_vs_tunnel_ms": med(v["ttfb_ms"]) - med(t["ttfb_ms"]),
        "cpu_s_per_gib": med(v["cpu_s_per_gib"]),
        "command": cmds[k],
    } for k, v in res.items()}, res


# Time to first byte of N new connections from one client process, whose TLS context (and its
# bundle) is made once, so that what is timed is the connection: TCP (through CONNECT when
# asked), the TLS handshake, a 1-byte request, its first byte. argv: mode (connect|direct), name,
# port, address to connect to, CA file ('' for the default trust), N. Prints the times in ms.
TTFB = r"""
import socket, ssl, sys, time
mode, name, port, addr, cafile, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
ctx = ssl.create_default_context(cafile=cafile or None)
out = []
for i in range(n):
    t = time.perf_counter()
    if mode == "connect":
        s = socket.create_connection(("127.0.0.1", 3128))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
        h = b""
        while b"\r\n\r\n" not in h:
            h += s.recv(1)
    else:
        s = socket.create_connection((addr, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t_ = ctx.wrap_socket(s, server_hostname=name)
    t_.sendall(f"GET /bytes/1 HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
    t_.recv(1)
    out.append((time.perf_counter() - t) * 1000)
    t_.close()
print(" ".join(f"{x:.3f}" for x in out))
"""


def measure_ttfb(addr, port, a, name="bench.test", n=30):
    """Time to first byte of new connections from one client process (its trust loaded once):
    the first connection of a run (the proxy signs the host's leaf) and the median of the others
    (the leaf kept), direct, through the CONNECT tunnel, and inspected by proxy and transparently."""
    ca = os.path.join(a.certs, "ca.pem")
    base = [PALISADE, "run", "-q", "--no-tty", "--timeout", "10m",
            "--allow-net", f"{name}:{port}", "--allow-net", f"{addr}:{port}", "--resolve", f"{name}={addr}"]
    paths = {
        "direct": ([], "direct", addr, ca),
        "CONNECT tunnel": (base + ["--ro", f"{ca}:/bench-ca.pem", "--"], "connect", addr, "/bench-ca.pem"),
        "inspected, proxy": (base + ["--inspect", "--upstream-ca", ca, "--"], "connect", addr, ""),
        "inspected, transparent": (base + ["--inspect", "--upstream-ca", ca, "--"], "direct", name, ""),
    }
    res = {k: {"first_ms": [], "kept_ms": []} for k in paths}
    for _ in range(a.runs):
        for k, (prefix, mode, target, cafile) in paths.items():
            out = subprocess.run(prefix + [sys.executable if not prefix else "python3", "-c", TTFB, mode, name,
                                           str(port), target, cafile, str(n)],
                                 capture_output=True, text=True, check=True).stdout.split()
            t = [float(x) for x in out]
            res[k]["first_ms"].append(t[0])
            res[k]["kept_ms"].append(statistics.median(t[1:]))
    med = statistics.median
    tunnel = med(res["CONNECT tunnel"]["kept_ms"])
    return {k: {"first_ms": med(v["first_ms"]), "kept_ms": med(v["kept_ms"]),
                "added_vs_tunnel_ms": med(v["kept_ms"]) - tunnel} for k, v in res.items()}


def measure_attempts(a):
    """What recording a run's attempts without egress costs: `connect` calls to an address the
    sandbox cannot reach, timed inside (each goes past the supervisor and back), against the same
    calls in a sandbox with egress (where the filter does not watch them)."""
    code = ("import socket, time\n"
            "t = time.perf_counter()\n"
            "for i in range(2000):\n"
            "    s = socket.socket()\n"
            "    try:\n        s.connect(('198.51.100.1', 9))\n    except OSError:\n        pass\n"
            "    s.close()\n"
            "print((time.perf_counter() - t) / 2000 * 1e6)\n")
    out = {"watched": [], "not watched": []}
    for _ in range(max(a.runs, 3)):
        for k, opts in (("watched", []), ("not watched", ["--allow-net", "bench.test"])):
            o = subprocess.run([PALISADE, "run", "-q", "--no-tty", *opts, "--", "python3", "-c", code],
                               capture_output=True, text=True, check=True).stdout
            out[k].append(float(o.split()[-1]))
    return {k: statistics.median(v) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--links", default="1gbit,4gbit",
                    help="comma-separated tc rates for the rows over a shaped veth link (needs root), "
                         "or 'none' (default: 1gbit,4gbit)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--tls-only", action="store_true",
                    help="only the HTTPS rows (inspection) and the cost of recording attempts")
    ap.add_argument("--serve", metavar="ADDR:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--serve-tls", metavar="CERTDIR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        addr, port = a.serve.rsplit(":", 1)
        return serve(addr, int(port), a.serve_tls)
    check_profile(a.quick)
    if a.quick:
        a.size, a.runs = 8 << 20, 2
        if a.links == ap.get_default("links"):
            a.links = "1gbit"
    links = [] if a.links == "none" else [r for r in a.links.split(",") if r]
    for r in links:
        if not re.fullmatch(r"[1-9][0-9]*(kbit|mbit|gbit)", r):
            raise SystemExit(f"bench/egress.py: --links: `{r}` is not a rate; give tc rates such as 100mbit, "
                             "1gbit, 4gbit (a number, then kbit, mbit or gbit), comma-separated, or none")
    if links and os.geteuid() != 0:
        raise SystemExit("bench/egress.py: the link rows (--links) need root for a network namespace and tc; "
                         "run as root, or pass --links none for the loopback rows alone")
    a.state = tempfile.mkdtemp(prefix="palisade-bench-egress-")
    a.certs = os.path.join(a.state, "certs")
    os.makedirs(a.certs)
    make_certs(a.certs, "bench.test")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Bytes)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tsrv = TlsServer(("127.0.0.1", 0), a.certs)
    threading.Thread(target=tsrv.serve_forever, daemon=True).start()
    try:
        summary, raw = ({}, {}) if a.tls_only else measure("127.0.0.1", srv.server_address[1], a)
        tls_summary, tls_raw = measure_tls("127.0.0.1", tsrv.server_address[1], a)
        ttfb = {"loopback": measure_ttfb("127.0.0.1", tsrv.server_address[1], a)}
        attempts = measure_attempts(a)
        link_rows = {}
        tls_links = {}
        if links:
            with Link() as link:
                tls_port = 18443
                tls_srv = subprocess.Popen(["ip", "netns", "exec", link.NS, sys.executable, os.path.abspath(__file__),
                                            "--serve", f"{link.ADDR}:{tls_port}", "--serve-tls", a.certs])
                try:
                    wait_port(link.ADDR, tls_port, tls_srv)
                    for r in links:
                        link.rate(r)
                        if not a.tls_only:
                            s, rw = measure(link.ADDR, link.port, a)
                            link_rows[r] = {"results": s, "raw": rw}
                        s, rw = measure_tls(link.ADDR, tls_port, a)
                        tls_links[r] = {"results": s, "raw": rw}
                        ttfb[f"link {r}"] = measure_ttfb(link.ADDR, tls_port, a)
                finally:
                    tls_srv.kill()
                    tls_srv.wait()
    finally:
        shutil.rmtree(a.state, ignore_errors=True)
    doc = {"date": datetime.date.today().isoformat(), "kernel": platform.release(), "cpus": os.cpu_count(),
           "build": PROFILE,
           "size_bytes": a.size, "runs": a.runs, "quick": a.quick, "results": summary, "raw": raw,
           "links": link_rows, "srt": SRT_SKIP or "measured",
           "tls": {"results": tls_summary, "raw": tls_raw, "links": tls_links, "ttfb": ttfb},
           "attempts_connect_us": attempts}
    lines = [f"# Egress: proxy versus direct ({doc['date']}, kernel {doc['kernel']}, {doc['cpus']} CPUs)", "",
             f"{a.size} bytes from an HTTP server, {a.runs} runs per path interleaved, medians; time to first "
             "byte from a 1-byte request. curl's own timings (sandbox start-up not included). CPU: user and "
             "system seconds per GiB of everything the path ran (curl; for the sandboxed paths also "
             "palisade's supervisor, its relay threads and init), the server's not counted.", "",
             "Loopback: the server on the host's 127.0.0.1, so nothing but the CPUs bounds the transfer. "
             "Link rows: the server in a network namespace behind a veth pair whose sending side tbf "
             "shapes to the rate named, as a real upstream is bounded by its link. socat relay (reference): a "
             "plain relay with no sandbox and no checks (socat, 1 MiB buffer, curl on the host), the floor for "
             "any proxy; srt (peer): sandbox-runtime's own proxy with the address as its allowed domain.", "",
             "| where | path | MiB/s | vs direct | time to first byte (ms) | added (ms) | CPU s/GiB |",
             "|---|---|---|---|---|---|---|"]
    for where, rows in ([("loopback", summary)] if summary else []) + [(f"link {r}", v["results"]) for r, v in link_rows.items()]:
        for k, s in rows.items():
            lines.append(f"| {where} | {k} | {s['throughput_mib_s']:.0f} | {s['throughput_vs_direct']:.2f} | "
                         f"{s['ttfb_ms']:.2f} | {s['ttfb_added_ms']:+.2f} | {s['cpu_s_per_gib']:.2f} |")
    if SRT_SKIP:
        lines += ["", f"Skipped: srt (peer), {SRT_SKIP}."]
    if not shutil.which("socat"):
        lines += ["", "Skipped: socat relay (reference), socat is not installed (apt-get install socat)."]
    lines += ["", "Commands (loopback; the link rows are the same against 198.19.0.2):", ""]
    lines += [f"- {k}: `{s['command']}`" for k, s in summary.items()]
    lines += ["", "## HTTPS: TLS inspection versus the CONNECT tunnel and direct", "",
              "The same server over TLS (a certificate of a CA made for the benchmark). Time to first byte of a "
              "1-byte request: the sandbox's first connection (the proxy signs the host's leaf) and its second "
              "(the leaf kept); added: the second's, over the tunnel's.", "",
              "| where | path | MiB/s | vs tunnel | vs direct | first byte, 1st conn. (ms) | 2nd conn. (ms) | added vs tunnel (ms) | CPU s/GiB |",
              "|---|---|---|---|---|---|---|---|---|"]
    for where, rows in [("loopback", tls_summary)] + [(f"link {r}", v["results"]) for r, v in tls_links.items()]:
        for k, s in rows.items():
            lines.append(f"| {where} | {k} | {s['throughput_mib_s']:.0f} | {s['throughput_vs_tunnel']:.2f} | "
                         f"{s['throughput_vs_direct']:.2f} | {s['ttfb_first_ms']:.2f} | {s['ttfb_ms']:.2f} | "
                         f"{s['ttfb_added_vs_tunnel_ms']:+.2f} | {s['cpu_s_per_gib']:.2f} |")
    lines += ["", "Commands (loopback):", ""]
    lines += [f"- {k}: `{s['command']}`" for k, s in tls_summary.items()]
    lines += ["", "Time to first byte of a new connection from one Python client whose trust is loaded once "
              "(curl reads a whole bundle each time it starts, about 20 ms that varies from run to run): "
              "TCP (through CONNECT for the proxy paths), the TLS handshake, a 1-byte request. First: "
              "the run's first connection (the proxy signs the host's leaf); kept: the median of the 29 "
              "after it. Medians over runs.", "",
              "| where | path | first (ms) | kept (ms) | added vs tunnel (ms) |", "|---|---|---|---|---|"]
    for where, rows in ttfb.items():
        for k, v in rows.items():
            lines.append(f"| {where} | {k} | {v['first_ms']:.2f} | {v['kept_ms']:.2f} | {v['added_vs_tunnel_ms']:+.2f} |")
    lines += ["", "## Recording attempts without egress", "",
              f"A `connect` to an unreachable address inside a sandbox without egress (the filter hands it to the "
              f"supervisor, which records it): {attempts['watched']:.1f} µs; with egress (not watched): "
              f"{attempts['not watched']:.1f} µs; medians of the mean of 2000 calls."]
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
