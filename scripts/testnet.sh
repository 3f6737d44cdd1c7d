#!/usr/bin/env bash
# The test internet for crates/palisade-cli/tests/egress_netns.rs: a network namespace `palisade-tn`
# behind a veth pair, with documentation and benchmarking addresses only (198.51.100.0/24,
# 198.18.0.0/24, 2001:db8:5::/64; not 203.0.113.0/24, where the package registries of the
# machines this project is built on live, nor 192.0.2.0/24, their own LAN), HTTP and TLS servers (one test CA, names like allowed.test and example.org) and
# a DNS server. It stays up so that the unprivileged test run, which cannot create namespaces,
# uses it too. As root.
#
#   host  ptn-host  198.51.100.1/24  2001:db8:5::1/64   route 198.18.0.0/24 via 198.51.100.2
#   netns ptn-ns    198.51.100.2  .10 (web)  .20 (second web host)  .53 (dns)  198.18.0.10 (far)
#                   2001:db8:5::2  ::10 (web)  ::20  ::53 (dns)
#   web: HTTP on 80 and 8080, TLS on 443 and 8443, every address; dns: UDP 53
#
# Every request, TLS handshake and DNS query is a JSON line in $DIR/events.log, which the tests
# read to check that a refused connection never reached a server. $DIR/ca.pem is the test CA.
#
# The extras (scripts/testnet-extras.py: TLS inspection, HTTP rules, secrets): pypi.test (a package
# index), git.test (a repository over smart HTTP), api.test, and badcert.test (a name its
# certificate does not carry), all at 198.51.100.30, HTTP on 8088 and TLS on 4443, with a CA of
# their own ($DIR/extras/ca.pem; $DIR/extras/upstream-ca.pem holds both CAs) and a log of their
# own ($DIR/extras/events.log). `up` starts them; `extras` adds them to a test internet that is up
# without them, and does nothing if they run. Usage: scripts/testnet.sh up | extras | down | status
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

NS=palisade-tn
DIR=${PALISADE_TESTNET_DIR:-/run/palisade-testnet}
HOST_IF=ptn-host
NS_IF=ptn-ns
PY=/usr/bin/python3
in_ns() { ip netns exec "$NS" "$@"; }

die() {
    echo "scripts/testnet.sh: $*" >&2
    exit 1
}

status() {
    if [ -f "$DIR/ready" ] && ip netns list | grep -qw "$NS" && pid_alive; then
        echo "test internet up: netns $NS, state in $DIR, servers pid $(cat "$DIR/servers.pid")"
        if extras_alive; then
            echo "extras up: pid $(cat "$DIR/extras/servers.pid")"
        else
            echo "extras down (scripts/testnet.sh extras)"
        fi
        return 0
    fi
    echo "test internet down (scripts/testnet.sh up, as root)"
    return 1
}

# The servers' pid, if it is still our python3 serving $DIR.
pid_alive() {
    [ -f "$DIR/servers.pid" ] || return 1
    local pid
    pid=$(cat "$DIR/servers.pid")
    { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q "$DIR/servers.py"
}

# The extras' pid, if it is still our python3 serving $DIR/extras.
extras_alive() {
    [ -f "$DIR/extras/servers.pid" ] || return 1
    local pid
    pid=$(cat "$DIR/extras/servers.pid")
    { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q "$DIR/extras/extras.py"
}

down() {
    if extras_alive; then
        kill "$(cat "$DIR/extras/servers.pid")" 2>/dev/null || true
    fi
    if pid_alive; then
        local pid
        pid=$(cat "$DIR/servers.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
    fi
    if ip netns list | grep -qw "$NS"; then
        # Anything else still running in the namespace was started by `up` as well.
        for pid in $(ip netns pids "$NS" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
        ip netns del "$NS"
    fi
    # Deleting the namespace destroys its end of the pair, and with it ours, but not at once: ours
    # may still show and then be gone before `ip link del` reaches it. A half-made setup may have
    # left ours alone.
    for _ in $(seq 50); do
        ip link show "$HOST_IF" >/dev/null 2>&1 || break
        ip link del "$HOST_IF" 2>/dev/null || sleep 0.1
    done
    if ip link show "$HOST_IF" >/dev/null 2>&1; then die "could not remove $HOST_IF"; fi
    rm -rf "$DIR"
}

certs() {
    local d=$DIR
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
        -subj "/CN=palisade test CA" -keyout "$d/ca.key" -out "$d/ca.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=allowed.test" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    cat >"$d/server.ext" <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:allowed.test,DNS:*.allowed.test,DNS:example.org,DNS:*.example.org,DNS:v6.test,DNS:other.test,DNS:evilexample.org
EOF
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 7 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
    rm -f "$d/ca.key" "$d/server.csr" "$d/ca.srl"
    chmod 600 "$d/server.key"
    chmod 644 "$d/ca.pem" "$d/server.pem"
}

servers_py() {
    cat <<'EOF'
# The test internet's servers, run inside the netns by scripts/testnet.sh.
import json, os, signal, socket, ssl, struct, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

DIR = sys.argv[1]
lock = threading.Lock()
log_file = open(os.path.join(DIR, "events.log"), "a")
os.chmod(os.path.join(DIR, "events.log"), 0o644)

def log(**kv):
    kv["t"] = round(time.time(), 3)
    with lock:
        log_file.write(json.dumps(kv) + "\n")
        log_file.flush()

# name -> {qtype: [address]}; qtype 1 = A, 28 = AAAA.
ZONE = {
    "allowed.test": {1: ["198.51.100.10"], 28: ["2001:db8:5::10"]},
    "www.allowed.test": {1: ["198.51.100.10"]},
    "example.org": {1: ["198.51.100.10"]},
    "www.example.org": {1: ["198.51.100.10"]},
    "evilexample.org": {1: ["198.51.100.20"]},
    "other.test": {1: ["198.18.0.10"]},
    "second.test": {1: ["198.51.100.20"], 28: ["2001:db8:5::20"]},
    "v6.test": {28: ["2001:db8:5::10"]},
    "private.test": {1: ["10.0.0.10"]},
    "metadata.test": {1: ["169.254.169.254"]},
    "loopback.test": {1: ["127.0.0.1"]},
    "mapped.test": {28: ["::ffff:198.51.100.10"]},
}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        self.sni = None
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError) as e:
                log(srv=self.server.name, event="handshake-failed", sni=getattr(self.request, "sni", None),
                    local=self.local(), error=str(e))
                raise
            self.sni = getattr(self.request, "sni", None)
            log(srv=self.server.name, event="handshake", sni=self.sni, local=self.local())
        super().setup()

    def local(self):
        try:
            a = self.request.getsockname()
            ip = a[0].removeprefix("::ffff:")
            return f"[{ip}]:{a[1]}" if ":" in ip else f"{ip}:{a[1]}"
        except OSError:
            return None

    def do_GET(self):
        host = self.headers.get("Host", "")
        log(srv=self.server.name, event="request", method="GET", path=self.path, host=host,
            sni=self.sni, local=self.local(), peer=self.client_address[0].removeprefix("::ffff:"))
        if self.path.startswith("/bytes/"):
            body = b"x" * int(self.path[7:] or 0)
        else:
            body = (f"srv={self.server.name} host={host} path={self.path} sni={self.sni} "
                    f"local={self.local()}\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *a):
        pass

class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name, port, ctx=None):
        self.name, self.ctx = name, ctx
        super().__init__(("::", port), Handler)

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self):
        s, a = self.socket.accept()
        if self.ctx:
            # The handshake happens in the handler's thread, so a silent client stalls no one.
            s = self.ctx.wrap_socket(s, server_side=True, do_handshake_on_connect=False)
        return s, a

    def handle_error(self, request, client_address):
        pass

def sni_cb(sock, name, ctx):
    sock.sni = name

ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(os.path.join(DIR, "server.pem"), os.path.join(DIR, "server.key"))
ctx.sni_callback = sni_cb

def dns_name(msg, off):
    labels = []
    while True:
        n = msg[off]
        off += 1
        if n == 0:
            return labels, off
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(msg[off:off + n].decode("ascii", "replace"))
        off += n

def dns_serve(sock):
    while True:
        msg, peer = sock.recvfrom(4096)
        try:
            qid, flags, qd = struct.unpack("!HHH", msg[:6])
            labels, off = dns_name(msg, 12)
            qtype, qclass = struct.unpack("!HH", msg[off:off + 4])
        except (ValueError, IndexError, struct.error):
            log(srv="dns", event="bad-query", peer=peer[0].removeprefix("::ffff:"), size=len(msg))
            continue
        name = ".".join(labels)
        key = name.lower().rstrip(".")
        log(srv="dns", event="query", name=name, qtype=qtype, peer=peer[0].removeprefix("::ffff:"),
            local=sock.getsockname()[0])
        question = msg[12:off + 4]
        answers = []
        rcode = 3
        # Names under search.test: what a host's resolv.conf search domain would hold (one test
        # lists it as the supervisor's search domain), every one of them the web host.
        zone = ZONE.get(key) or ({1: ["198.51.100.10"]} if key.endswith(".search.test") else None)
        if zone is not None:
            rcode = 0
            for a in zone.get(qtype, []):
                fam = socket.AF_INET if qtype == 1 else socket.AF_INET6
                rd = socket.inet_pton(fam, a)
                answers.append(b"\xc0\x0c" + struct.pack("!HHIH", qtype, 1, 60, len(rd)) + rd)
        rflags = 0x8400 | (flags & 0x0100) | rcode  # response, authoritative, RD copied
        head = struct.pack("!HHHHHH", qid, rflags, 1, len(answers), 0, 0)
        sock.sendto(head + question + b"".join(answers), peer)

servers = [Server("http", 80), Server("http", 8080), Server("https", 443, ctx), Server("https", 8443, ctx)]
for s in servers:
    threading.Thread(target=s.serve_forever, daemon=True).start()
# One socket per address, so that each answer leaves from the address it was asked at (a socket
# bound to :: would answer from whichever address the route picks, which a resolver that
# connects its socket, as palisade's --dns-server client does, rightly drops).
for fam, addr in ((socket.AF_INET, "198.51.100.53"), (socket.AF_INET6, "2001:db8:5::53")):
    dns = socket.socket(fam, socket.SOCK_DGRAM)
    dns.bind((addr, 53))
    threading.Thread(target=dns_serve, args=(dns,), daemon=True).start()
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
with open(os.path.join(DIR, "servers.pid"), "w") as f:
    f.write(f"{os.getpid()}\n")
log(srv="control", event="ready")
while True:
    time.sleep(3600)
EOF
}

up() {
    command -v ip >/dev/null || die "ip (iproute2) is missing; run .ci/setup"
    command -v openssl >/dev/null || die "openssl is missing; run .ci/setup"
    [ -x "$PY" ] || die "$PY is missing; run .ci/setup"
    down
    mkdir -m 755 "$DIR"
    certs
    servers_py >"$DIR/servers.py"

    ip netns add "$NS"
    ip link add "$HOST_IF" type veth peer name "$NS_IF" netns "$NS"
    ip addr add 198.51.100.1/24 dev "$HOST_IF"
    ip -6 addr add 2001:db8:5::1/64 dev "$HOST_IF" nodad
    ip link set "$HOST_IF" up
    ip route add 198.18.0.0/24 via 198.51.100.2 dev "$HOST_IF"

    in_ns ip link set lo up
    for a in 198.51.100.2 198.51.100.10 198.51.100.20 198.51.100.53; do
        in_ns ip addr add "$a/24" dev "$NS_IF"
    done
    in_ns ip addr add 198.18.0.10/24 dev "$NS_IF"
    for a in 2 10 20 53; do
        in_ns ip -6 addr add "2001:db8:5::$a/64" dev "$NS_IF" nodad
    done
    in_ns ip link set "$NS_IF" up

    in_ns setsid "$PY" "$DIR/servers.py" "$DIR" </dev/null >"$DIR/servers.out" 2>&1 &
    for _ in $(seq 100); do
        if pid_alive && curl -sf --max-time 2 -o /dev/null http://198.51.100.10/ready 2>/dev/null \
            && curl -sf --max-time 2 -o /dev/null --cacert "$DIR/ca.pem" \
                --resolve "allowed.test:443:198.51.100.10" https://allowed.test/ready \
            && curl -sf --max-time 2 -o /dev/null -g 'http://[2001:db8:5::10]/ready' \
            && curl -sf --max-time 2 -o /dev/null http://198.18.0.10:8080/ready; then
            date -u +%FT%TZ >"$DIR/ready"
            chmod 644 "$DIR/ready" "$DIR/servers.pid"
            status
            return 0
        fi
        sleep 0.1
    done
    cat "$DIR/servers.out" >&2 || true
    down
    die "the servers did not come up"
}

extras_certs() {
    local d=$DIR/extras
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 7 \
        -subj "/CN=palisade test extras CA" -keyout "$d/ca.key" -out "$d/ca.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=pypi.test" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    cat >"$d/server.ext" <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:pypi.test,DNS:git.test,DNS:api.test
authorityKeyIdentifier=keyid
EOF
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 7 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null
    rm -f "$d/ca.key" "$d/server.csr" "$d/ca.srl"
    chmod 600 "$d/server.key"
    cat "$DIR/ca.pem" "$d/ca.pem" >"$d/upstream-ca.pem"
    chmod 644 "$d/ca.pem" "$d/server.pem" "$d/upstream-ca.pem"
}

# The extras, added to a test internet that is up; nothing is done if they run already.
extras() {
    ip netns list | grep -qw "$NS" && pid_alive || die "the test internet is not up (scripts/testnet.sh up)"
    if extras_alive; then
        status
        return 0
    fi
    command -v git >/dev/null || die "git is missing; run .ci/setup"
    rm -rf "$DIR/extras"
    mkdir -m 755 "$DIR/extras"
    extras_certs
    cp "$HERE/testnet-extras.py" "$DIR/extras/extras.py"
    in_ns ip addr add 198.51.100.30/24 dev "$NS_IF" 2>/dev/null || true
    in_ns setsid "$PY" "$DIR/extras/extras.py" "$DIR/extras" </dev/null >"$DIR/extras/servers.out" 2>&1 &
    for _ in $(seq 100); do
        if extras_alive && curl -sf --max-time 2 -o /dev/null --cacert "$DIR/extras/ca.pem" \
            --resolve "pypi.test:4443:198.51.100.30" https://pypi.test:4443/simple/; then
            date -u +%FT%TZ >"$DIR/extras/ready"
            chmod 644 "$DIR/extras/ready" "$DIR/extras/servers.pid"
            chmod -R a+rX "$DIR/extras/git"
            status
            return 0
        fi
        sleep 0.1
    done
    cat "$DIR/extras/servers.out" >&2 || true
    die "the extra servers did not come up"
}

[ "$(id -u)" = 0 ] || die "run as root (it creates a network namespace)"
case "${1:-}" in
up) up && extras ;;
extras) extras ;;
down) down ;;
status) status ;;
*) die "usage: scripts/testnet.sh up | extras | down | status" ;;
esac
