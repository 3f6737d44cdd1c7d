# The test internet's extra servers, for TLS inspection, HTTP rules and secrets; started inside the
# test internet's namespace by `scripts/testnet.sh extras` (and `up`), with $DIR/extras as argv[1].
#
# HTTP on 8088 and TLS on 4443, on every address of the namespace (the first servers hold 80, 443,
# 8080 and 8443); keep-alive HTTP/1.1; by Host:
#   pypi.test  a package index (/simple/, /simple/tinypkg/, /packages/tinypkg-1.0-py3-none-any.whl)
#   git.test   a bare repository over smart HTTP (`git http-backend`): /repo.git
#   api.test   anything: answers with what arrived (method, path, body size), never a credential;
#              /bytes/N sends N bytes; /reflect answers with the Authorization it got in a header
#   anything else (badcert.test): the same as api.test, with a certificate that does not name it
# Every request is a JSON line in events.log, with its Authorization and X-Token headers, so that a
# test can see what reached the server (and that a refused request never did).
import base64, hashlib, io, json, os, signal, socket, ssl, subprocess, sys, threading, time, zipfile
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


def wheel():
    """A small valid wheel: tinypkg 1.0."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\nSummary: palisade test package\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: palisade-testnet\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for n, d in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={h},{len(d)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
    return b.getvalue()


WHEEL_NAME = "tinypkg-1.0-py3-none-any.whl"
WHEEL = wheel()
WHEEL_SHA = hashlib.sha256(WHEEL).hexdigest()
GIT_ROOT = os.path.join(DIR, "git")


def make_repo():
    work = os.path.join(DIR, "git-work")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", HOME=DIR)
    subprocess.run(["git", "init", "-q", "-b", "main", work], check=True, env=env)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("palisade test repository\n")
    subprocess.run(["git", "-C", work, "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", work, "commit", "-q", "-m", "first"], check=True, env=env)
    os.makedirs(GIT_ROOT, exist_ok=True)
    subprocess.run(["git", "clone", "-q", "--bare", work, os.path.join(GIT_ROOT, "repo.git")],
                   check=True, env=env)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        self.sni = None
        self.tls = isinstance(self.request, ssl.SSLSocket)
        if self.tls:
            self.request.settimeout(10)
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError) as e:
                log(srv="extras", event="handshake-failed", error=str(e))
                raise
            self.sni = getattr(self.request, "sni", None)
            log(srv="extras", event="handshake", sni=self.sni)
        super().setup()

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, code, body, ctype="text/plain", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        host = (self.headers.get("Host") or "").split(":")[0]
        data = self.body()
        log(srv="extras", event="request", method=self.command, path=self.path, host=host,
            sni=self.sni, tls=self.tls, auth=self.headers.get("Authorization"),
            x_token=self.headers.get("X-Token"), body_len=len(data),
            peer=self.client_address[0].removeprefix("::ffff:"))
        path = self.path.split("?")[0]
        if host == "git.test":
            return self.git(data)
        if host == "pypi.test":
            if path in ("/simple/", "/simple"):
                return self.reply(200, b'<html><body><a href="/simple/tinypkg/">tinypkg</a></body></html>', "text/html")
            if path in ("/simple/tinypkg/", "/simple/tinypkg"):
                page = f'<html><body><a href="/packages/{WHEEL_NAME}#sha256={WHEEL_SHA}">{WHEEL_NAME}</a></body></html>'
                return self.reply(200, page.encode(), "text/html")
            if path == "/packages/" + WHEEL_NAME:
                return self.reply(200, WHEEL, "application/octet-stream")
            return self.reply(404, b"not found\n")
        if path.startswith("/bytes/"):
            return self.reply(200, b"x" * int(path[7:] or 0))
        if path.startswith("/reflect"):
            return self.reply(200, b"ok\n", extra=[("X-Seen-Authorization", self.headers.get("Authorization") or "-")])
        msg = f"srv=extras host={host} method={self.command} path={self.path} sni={self.sni} body={len(data)}\n"
        return self.reply(200, msg.encode())

    def git(self, data):
        path, _, query = self.path.partition("?")
        env = {"GIT_PROJECT_ROOT": GIT_ROOT, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": self.command,
               "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(data)),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
               "REMOTE_ADDR": self.client_address[0]}
        out = subprocess.run(["git", "http-backend"], input=data, env=env, capture_output=True).stdout
        head, _, body = out.partition(b"\r\n\r\n")
        code, extra, ctype = 200, [], "text/plain"
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            v = v.strip()
            if k.lower() == "status":
                code = int(v.split()[0])
            elif k.lower() == "content-type":
                ctype = v
            elif k:
                extra.append((k, v))
        self.reply(code, body, ctype, extra)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = handle_any

    def log_message(self, *a):
        pass


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port, ctx=None):
        self.ctx = ctx
        super().__init__(("::", port), Handler)

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self):
        s, a = self.socket.accept()
        # The head and the body are two writes: without this each response waits for the
        # client's delayed acknowledgment of its head (40 ms).
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ctx:
            # The handshake happens in the handler's thread, so a silent client stalls no one.
            s = self.ctx.wrap_socket(s, server_side=True, do_handshake_on_connect=False)
        return s, a

    def handle_error(self, request, client_address):
        pass


def sni_cb(sock, name, ctx):
    sock.sni = name


make_repo()
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(os.path.join(DIR, "server.pem"), os.path.join(DIR, "server.key"))
ctx.sni_callback = sni_cb
for s in (Server(8088), Server(4443, ctx)):
    threading.Thread(target=s.serve_forever, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
with open(os.path.join(DIR, "servers.pid"), "w") as f:
    f.write(f"{os.getpid()}\n")
log(srv="control", event="ready")
while True:
    time.sleep(3600)
