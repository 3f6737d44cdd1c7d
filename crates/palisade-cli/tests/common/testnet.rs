//! The test internet that `scripts/testnet.sh up` builds (as root, once, before the suite; the
//! unprivileged run cannot create network namespaces): a namespace `palisade-tn` behind a veth
//! pair, with documentation addresses only, HTTP and TLS servers for names like `allowed.test`
//! and `example.org` (one test CA), and a DNS server that answers for them. Every request, TLS
//! handshake and DNS query the servers get is a JSON line in `events.log`, so a test can check
//! from the servers' side that a refused connection never arrived.
//!
//! Nothing here is ever sent to an address outside these ranges. The supervisor resolves names
//! through `--resolve` pins taken from the test DNS server's answers ([`pins`]): palisade has no
//! option to point its resolver at a DNS server, so an allowed name without a pin would be looked
//! up by the host's resolver, which is outside. Every allowed name a test connects to is pinned.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Where `scripts/testnet.sh` keeps the CA, the servers' log and its state.
pub const DIR: &str = "/run/palisade-testnet";
/// The host's end of the veth pair.
pub const HOST_SIDE: &str = "198.51.100.1";
/// The web server of allowed.test, example.org and the other allowed names.
pub const WEB: &str = "198.51.100.10";
pub const WEB6: &str = "2001:db8:5::10";
/// A second web server (second.test, evilexample.org): as real as the first, never allowed.
pub const SECOND: &str = "198.51.100.20";
pub const SECOND6: &str = "2001:db8:5::20";
/// A web server on the other documentation network, routed through the namespace (other.test).
pub const FAR: &str = "198.18.0.10";
/// The test DNS server.
pub const DNS: &str = "198.51.100.53";
pub const DNS6: &str = "2001:db8:5::53";

const HOW: &str = "the test internet is not up: run `scripts/testnet.sh up` as root first \
     (scripts/test.sh does it before both runs, and `scripts/testnet.sh down` after)";

/// The test CA's certificate on the host; the tests bind it into the sandbox at [`CA_INSIDE`].
pub fn ca() -> PathBuf {
    PathBuf::from(DIR).join("ca.pem")
}
pub const CA_INSIDE: &str = "/testnet-ca.pem";

/// `--ro CA:/testnet-ca.pem`.
pub fn ca_bind() -> Vec<String> {
    vec!["--ro".into(), format!("{}:{CA_INSIDE}", ca().display())]
}

/// Fails the test, with what to do, unless the test internet is up and its servers answer the
/// host. Never a skip: without the test internet these tests prove nothing.
pub fn require() {
    let ready = PathBuf::from(DIR).join("ready");
    assert!(ready.exists(), "{HOW} ({} is missing)", ready.display());
    assert!(ca().exists(), "{HOW} ({} is missing)", ca().display());
    for (addr, port) in [(WEB, 80), (WEB6, 443), (FAR, 80)] {
        let sa = SocketAddr::new(addr.parse().unwrap(), port);
        if let Err(e) = TcpStream::connect_timeout(&sa, Duration::from_secs(3)) {
            panic!("{HOW} (the host cannot reach {sa}: {e})");
        }
    }
    let (rcode, addrs) = dns_query(DNS, "allowed.test", 1)
        .unwrap_or_else(|e| panic!("{HOW} (the test DNS server at {DNS} does not answer: {e})"));
    assert!(
        rcode == 0 && addrs == [WEB.parse::<IpAddr>().unwrap()],
        "{HOW} (the test DNS server answered allowed.test with rcode {rcode} {addrs:?})"
    );
}

/// A DNS query from the host to the test DNS server (at `server`, port 53): the rcode and the
/// A (`qtype` 1) or AAAA (28) addresses of the answer.
pub fn dns_query(server: &str, name: &str, qtype: u16) -> std::io::Result<(u8, Vec<IpAddr>)> {
    let server: IpAddr = server.parse().unwrap();
    let sock = UdpSocket::bind(if server.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    // Connected, as a stub resolver's is: an answer from any other address is dropped.
    sock.connect((server, 53))?;
    sock.set_read_timeout(Some(Duration::from_secs(3)))?;
    let id = (std::process::id() as u16) ^ (qtype << 3);
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for l in name.split('.') {
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    sock.send(&q)?;
    let mut buf = [0u8; 1500];
    let n = loop {
        let (n, _) = sock.recv_from(&mut buf)?;
        if n >= 12 && buf[..2] == id.to_be_bytes() {
            break n;
        }
    };
    let m = &buf[..n];
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a malformed DNS answer");
    let rcode = m[3] & 0xf;
    let answers = u16::from_be_bytes([m[6], m[7]]);
    // The answer echoes the question; the records follow it.
    let mut at = q.len();
    let mut addrs = Vec::new();
    for _ in 0..answers {
        let head = m.get(at..at + 12).ok_or_else(bad)?;
        let (t, len) = (
            u16::from_be_bytes([head[2], head[3]]),
            u16::from_be_bytes([head[10], head[11]]) as usize,
        );
        let rd = m.get(at + 12..at + 12 + len).ok_or_else(bad)?;
        match (t, len) {
            (1, 4) => addrs.push(IpAddr::from(<[u8; 4]>::try_from(rd).unwrap())),
            (28, 16) => addrs.push(IpAddr::from(<[u8; 16]>::try_from(rd).unwrap())),
            _ => {}
        }
        at += 12 + len;
    }
    Ok((rcode, addrs))
}

/// `--resolve NAME=ADDR` for every A and AAAA record the test DNS server has for each name, so
/// the supervisor connects where the test internet's DNS says. Panics on a name it does not know.
pub fn pins(names: &[&str]) -> Vec<String> {
    let mut v = Vec::new();
    for n in names {
        let mut found = false;
        for qtype in [1, 28] {
            let (_, addrs) = dns_query(DNS, n, qtype)
                .unwrap_or_else(|e| panic!("{HOW} (no answer from {DNS} for {n}: {e})"));
            for a in addrs {
                found = true;
                v.push("--resolve".into());
                v.push(match a {
                    IpAddr::V4(a) => format!("{n}={a}"),
                    IpAddr::V6(a) => format!("{n}=[{a}]"),
                });
            }
        }
        assert!(found, "the test DNS server has no address for {n}");
    }
    v
}

/// Every line of the servers' log.
pub fn log() -> Vec<Value> {
    let p = PathBuf::from(DIR).join("events.log");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{HOW} (cannot read {}: {e})", p.display()))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The log lines of the servers (`http`, `https`, `dns`) that mention `needle` anywhere.
pub fn seen(needle: &str) -> Vec<Value> {
    log()
        .into_iter()
        .filter(|e| e.to_string().contains(needle))
        .collect()
}

/// A plain HTTP GET from the host (not from a sandbox) to `addr:port`, with `host` as the Host
/// header: the control that shows the server is there for anyone with a route to it.
pub fn host_get(addr: &str, port: u16, host: &str, path: &str) -> String {
    let sa = SocketAddr::new(addr.parse().unwrap(), port);
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{HOW} (the host cannot reach {sa}: {e})"));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned()
}

/// `curl` on the host over TLS, verifying the test CA, with `name` pinned to `addr`: the control
/// for TLS (the test process has no TLS library of its own).
pub fn host_curl_tls(name: &str, addr: &str, path: &str) -> String {
    let pin = if addr.contains(':') {
        format!("{name}:443:[{addr}]")
    } else {
        format!("{name}:443:{addr}")
    };
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--noproxy", "*", "--cacert"])
        .arg(ca())
        .args(["--resolve", &pin, &format!("https://{name}{path}")])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("curl could not be started on the host: install it (.ci/setup)");
    assert!(
        o.status.success(),
        "curl on the host to {name} at {addr}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The extra servers of the test internet (`scripts/testnet.sh extras`): pypi.test, git.test,
/// api.test and badcert.test, all at [`EXTRAS`], TLS on [`EXTRAS_TLS`] and HTTP on
/// [`EXTRAS_HTTP`], with a CA of their own.
pub const EXTRAS: &str = "198.51.100.30";
pub const EXTRAS_TLS: u16 = 4443;
pub const EXTRAS_HTTP: u16 = 8088;
/// Both test CAs, which the proxy verifies inspected hosts against (`--upstream-ca`).
pub fn upstream_ca() -> PathBuf {
    PathBuf::from(DIR).join("extras/upstream-ca.pem")
}

const HOW_EXTRAS: &str = "the test internet's extra servers are not up: run `scripts/testnet.sh \
     extras` as root (`scripts/testnet.sh up` starts them too)";

/// Fails the test, with what to do, unless the extra servers are up and answer the host.
pub fn require_extras() {
    require();
    let ready = PathBuf::from(DIR).join("extras/ready");
    assert!(
        ready.exists(),
        "{HOW_EXTRAS} ({} is missing)",
        ready.display()
    );
    for port in [EXTRAS_TLS, EXTRAS_HTTP] {
        let sa = SocketAddr::new(EXTRAS.parse().unwrap(), port);
        if let Err(e) = TcpStream::connect_timeout(&sa, Duration::from_secs(3)) {
            panic!("{HOW_EXTRAS} (the host cannot reach {sa}: {e})");
        }
    }
}

/// The extra servers' log lines that mention `needle` anywhere.
pub fn extras_seen(needle: &str) -> Vec<Value> {
    let p = PathBuf::from(DIR).join("extras/events.log");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{HOW_EXTRAS} (cannot read {}: {e})", p.display()))
        .lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
