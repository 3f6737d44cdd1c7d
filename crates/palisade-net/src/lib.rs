//! The egress proxy: served by the supervisor, outside the sandbox, on listeners that sandbox init
//! created inside the sandbox's network namespace (so nothing of palisade's runs inside).
//!
//! Four kinds of listener, all on the sandbox's own loopback: an HTTP proxy (CONNECT, and
//! absolute-form plain HTTP), SOCKS5, a DNS stub, and one transparent listener per allowed port.
//! The stub answers allowed names with an address of its own from 127.77.0.0/16 and refuses the
//! rest with NXDOMAIN, never asking anyone upstream, so DNS carries nothing out. A connection to
//! one of those addresses reaches a transparent listener, whose local address maps back to the
//! name. Every path then makes the same checks: the rules, the resolved addresses (globally
//! reachable unless an IP rule names them), and the first bytes (the TLS server name or the HTTP
//! `Host` must be the connection's name). Every decision becomes an [`Event`].
#![forbid(unsafe_code)]

pub mod dns;
pub mod wire;

use palisade_policy::net::{Host, Network, Refusal, TRANSPARENT_NET};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use wire::Sniffed;

/// What a listener is for (mirrors the backend's socket roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    HttpProxy,
    Socks,
    Dns,
    Transparent,
}

/// One decision, as the report lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `http-connect`, `http-forward`, `socks5`, `transparent` or `dns`.
    pub via: &'static str,
    pub host: String,
    pub port: u16,
    /// The upstream address connected to.
    pub address: Option<String>,
    /// `allowed` or `denied`.
    pub decision: &'static str,
    /// A stable code: `allowed`, `not-allowed`, `tls-name-mismatch`, ….
    pub reason: &'static str,
    pub detail: String,
    /// `tls`, `http` or `other`, once the first bytes were seen.
    pub protocol: Option<&'static str>,
    /// Bytes from the sandbox to the host, and back.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// The network part of the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetLog {
    pub events: Vec<Event>,
    pub allowed: u64,
    pub denied: u64,
    /// Events past [`MAX_EVENTS`], counted but not listed.
    pub dropped: u64,
}

/// At most this many events are kept per run, so a payload cannot grow the supervisor's memory.
pub const MAX_EVENTS: usize = 10_000;
/// How long the proxy waits for a client's first bytes (request head, ClientHello).
const FIRST_BYTES: Duration = Duration::from_secs(10);
/// How long it waits for an upstream connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `--dns-server` lookup may take, both record types and one retry included.
const DNS_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a request head or ClientHello it reads before deciding.
const MAX_HEAD: usize = 64 * 1024;
/// Most names the stub hands addresses out for.
const MAX_NAMES: usize = 65_000;

/// Called with each event as it happens (e.g. to print denials).
pub type Notify = Box<dyn Fn(&Event) + Send + Sync>;

struct Entry {
    event: Event,
    out: Arc<AtomicU64>,
    inn: Arc<AtomicU64>,
}

struct Shared {
    net: Network,
    names: Mutex<Names>,
    log: Mutex<(Vec<Entry>, u64, u64, u64)>,
    /// Open connections (client side and upstream) by id, to cut them at the end.
    conns: Mutex<HashMap<u64, Vec<TcpStream>>>,
    next_id: AtomicU64,
    stopping: AtomicBool,
    notify: Option<Notify>,
}

#[derive(Default)]
struct Names {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// Names refused once: logged the first time only (resolvers ask for A and AAAA, and retry).
    refused: std::collections::HashSet<String>,
}

/// A running proxy for one sandbox; [`Egress::finish`] stops it and returns the log.
pub struct Egress {
    shared: Arc<Shared>,
    listeners: Vec<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
}

impl Egress {
    /// Starts serving `sockets` (bound inside the sandbox's network namespace) for `net`.
    pub fn start(
        net: Network,
        sockets: Vec<(Role, OwnedFd)>,
        notify: Option<Notify>,
    ) -> io::Result<Egress> {
        let shared = Arc::new(Shared {
            net,
            names: Mutex::new(Names::default()),
            log: Mutex::new((Vec::new(), 0, 0, 0)),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            notify,
        });
        let mut listeners = Vec::new();
        let mut threads = Vec::new();
        for (role, fd) in sockets {
            listeners.push(fd.try_clone()?);
            let sh = shared.clone();
            let t = if role == Role::Dns {
                let sock = UdpSocket::from(fd);
                std::thread::Builder::new()
                    .name("palisade-dns".into())
                    .spawn(move || dns_loop(&sh, &sock))?
            } else {
                let l = TcpListener::from(fd);
                std::thread::Builder::new()
                    .name("palisade-proxy".into())
                    .spawn(move || accept_loop(&sh, &l, role))?
            };
            threads.push(t);
        }
        Ok(Egress {
            shared,
            listeners,
            threads,
        })
    }

    /// Stops accepting, cuts every open connection, and returns the decisions with their byte
    /// counts.
    pub fn finish(self) -> NetLog {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for l in &self.listeners {
            // Wakes the blocked accept/recv (the error is ENOTCONN on unconnected UDP, harmless).
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
        }
        for t in self.threads {
            let _ = t.join();
        }
        for c in self
            .shared
            .conns
            .lock()
            .unwrap()
            .drain()
            .flat_map(|(_, v)| v)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        let mut log = self.shared.log.lock().unwrap();
        let (entries, allowed, denied, dropped) = std::mem::take(&mut *log);
        NetLog {
            events: entries
                .into_iter()
                .map(|e| Event {
                    bytes_out: e.out.load(Ordering::Relaxed),
                    bytes_in: e.inn.load(Ordering::Relaxed),
                    ..e.event
                })
                .collect(),
            allowed,
            denied,
            dropped,
        }
    }
}

impl Shared {
    /// Records an event; returns its byte counters.
    fn record(&self, event: Event) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        if let Some(n) = &self.notify {
            n(&event);
        }
        let (out, inn) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut log = self.log.lock().unwrap();
        if event.decision == "allowed" {
            log.1 += 1;
        } else {
            log.2 += 1;
        }
        if log.0.len() < MAX_EVENTS {
            log.0.push(Entry {
                event,
                out: out.clone(),
                inn: inn.clone(),
            });
        } else {
            log.3 += 1;
        }
        (out, inn)
    }

    /// Whether the stub answers `name`: some allow rule names it and no port-less deny rule does.
    fn name_allowed(&self, name: &str) -> Result<(), (Refusal, String)> {
        let h = Host::Name(name.to_owned());
        let mut last = None;
        for p in self.net.ports() {
            match self.net.decide(&h, p) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or((
            Refusal::NotAllowed,
            format!("{name} is not on the allow-list"),
        )))
    }
}

fn event(via: &'static str, host: &str, port: u16) -> Event {
    Event {
        via,
        host: host.to_owned(),
        port,
        address: None,
        decision: "denied",
        reason: "",
        detail: String::new(),
        protocol: None,
        bytes_out: 0,
        bytes_in: 0,
    }
}

fn dns_loop(sh: &Shared, sock: &UdpSocket) {
    let mut buf = [0u8; 1500];
    while !sh.stopping.load(Ordering::SeqCst) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok((0, _)) if sh.stopping.load(Ordering::SeqCst) => return,
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let Some(q) = wire::dns_question(&buf[..n]) else {
            continue;
        };
        let reply = answer(sh, &q);
        let _ = sock.send_to(&reply, from);
    }
}

fn answer(sh: &Shared, q: &wire::Question) -> Vec<u8> {
    let mut ev = event("dns", &q.name, 53);
    let verdict = match Host::parse(&q.name) {
        Ok(Host::Name(n)) => {
            ev.host = n.clone();
            sh.name_allowed(&n).map(|()| n)
        }
        Ok(Host::Ip(_)) | Err(_) => Err((
            Refusal::NotAllowed,
            format!("`{}` is not a host name on the allow-list", q.name),
        )),
    };
    match verdict {
        Ok(name) => {
            let mut names = sh.names.lock().unwrap();
            let known = names.by_name.get(&name).copied();
            let addr = match known {
                Some(a) => a,
                None if names.by_name.len() >= MAX_NAMES => {
                    drop(names);
                    ev.reason = "not-allowed";
                    ev.detail = "the stub has handed out all its addresses".into();
                    sh.record(ev);
                    return wire::dns_answer(q, 2, None);
                }
                None => {
                    let i = names.by_name.len() as u32 + 1;
                    let a = Ipv4Addr::new(
                        TRANSPARENT_NET[0],
                        TRANSPARENT_NET[1],
                        (i >> 8) as u8,
                        i as u8,
                    );
                    names.by_name.insert(name.clone(), a);
                    names.by_addr.insert(a, name.clone());
                    a
                }
            };
            drop(names);
            if known.is_none() {
                ev.decision = "allowed";
                ev.reason = "allowed";
                ev.address = Some(addr.to_string());
                ev.detail = format!("{name} answered with {addr}, which leads to the proxy");
                sh.record(ev);
            }
            wire::dns_answer(q, 0, (q.qtype == wire::TYPE_A).then(|| addr.octets()))
        }
        Err((r, detail)) => {
            let mut names = sh.names.lock().unwrap();
            let first = names.refused.len() < MAX_NAMES && names.refused.insert(ev.host.clone());
            drop(names);
            if !first {
                return wire::dns_answer(q, 3, None);
            }
            ev.reason = r.code();
            ev.detail = format!("NXDOMAIN: {detail}");
            sh.record(ev);
            wire::dns_answer(q, 3, None)
        }
    }
}

fn accept_loop(sh: &Arc<Shared>, l: &TcpListener, role: Role) {
    loop {
        let s = match l.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = s.try_clone() {
            sh.conns.lock().unwrap().insert(id, vec![c]);
        }
        let sh = sh.clone();
        let _ = std::thread::Builder::new()
            .name("palisade-conn".into())
            .spawn(move || {
                let _ = match role {
                    Role::HttpProxy => http_proxy(&sh, s, id),
                    Role::Socks => socks(&sh, s, id),
                    Role::Transparent => transparent(&sh, s, id),
                    Role::Dns => Ok(()),
                };
                // Done, allowed or not: close both sides now, not at the end of the run.
                let open = sh.conns.lock().unwrap().remove(&id);
                for c in open.into_iter().flatten() {
                    let _ = c.shutdown(Shutdown::Both);
                }
            });
    }
}

/// A connection being decided.
struct Pending<'a> {
    sh: &'a Shared,
    id: u64,
    ev: Event,
    host: Host,
}

/// The outcome of a refused step: the code and the text for the client.
type Denial = (&'static str, String);

impl Pending<'_> {
    fn deny(mut self, (code, detail): Denial) -> Denial {
        self.ev.reason = code;
        self.ev.detail = detail.clone();
        self.sh.record(self.ev);
        (code, detail)
    }

    /// The rules for the destination as named, then resolution, then the connection.
    fn connect(&mut self) -> Result<TcpStream, Denial> {
        let port = self.ev.port;
        self.sh
            .net
            .decide(&self.host, port)
            .map_err(|(r, d)| (r.code(), d))?;
        let addrs: Vec<IpAddr> = match &self.host {
            Host::Ip(a) => vec![*a],
            Host::Name(n) => {
                let pinned = self.sh.net.pinned(n);
                if !pinned.is_empty() {
                    pinned
                } else if let Some(server) = self.sh.net.dns_server {
                    dns::resolve(server, n, DNS_TIMEOUT)
                        .map_err(|e| ("resolve-failed", format!("{n} (asked {server}): {e}")))?
                } else {
                    (n.as_str(), port)
                        .to_socket_addrs()
                        .map_err(|e| ("resolve-failed", format!("{n}: {e}")))?
                        .map(|s| s.ip())
                        .collect()
                }
            }
        };
        let mut refusal = None;
        let ok: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|a| match self.sh.net.address_ok(*a, port) {
                Ok(()) => true,
                Err(e) => {
                    refusal.get_or_insert(e);
                    false
                }
            })
            .collect();
        if ok.is_empty() {
            return Err(refusal.map_or(
                ("resolve-failed", format!("{} has no address", self.host)),
                |(r, d)| (r.code(), format!("{}: {d}", self.host)),
            ));
        }
        let mut last = None;
        for a in ok {
            let sa = SocketAddr::new(a, port);
            match TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT) {
                Ok(s) => {
                    self.ev.address = Some(sa.to_string());
                    return Ok(s);
                }
                Err(e) => last = Some(format!("{sa}: {e}")),
            }
        }
        Err(("connect-failed", last.unwrap_or_default()))
    }

    /// [`Pending::connect`] for the HTTP paths: on a refusal, answers the client with `502` (the
    /// upstream could not be resolved or reached) or `403` (a rule or a check refused it).
    fn connect_or_answer(mut self, c: &mut TcpStream) -> Option<(Self, TcpStream)> {
        match self.connect() {
            Ok(u) => Some((self, u)),
            Err(d) => {
                let status = if d.0 == "connect-failed" || d.0 == "resolve-failed" {
                    "502 Bad Gateway"
                } else {
                    "403 Forbidden"
                };
                let (code, detail) = self.deny(d);
                http_error(c, status, code, &detail);
                None
            }
        }
    }

    /// Reads the client's first bytes (appending to `buf`) and checks them against the name.
    fn check_first_bytes(&mut self, c: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), Denial> {
        let _ = c.set_read_timeout(Some(FIRST_BYTES));
        let sniffed = loop {
            if let Some(s) = wire::sniff(buf) {
                break s;
            }
            if buf.len() >= MAX_HEAD {
                break Sniffed::Other;
            }
            let mut chunk = [0u8; 4096];
            match c.read(&mut chunk) {
                Ok(0) => break Sniffed::Other,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Sniffed::Other, // nothing within the wait: a server-first protocol
            }
        };
        let _ = c.set_read_timeout(None);
        self.ev.protocol = Some(sniffed.protocol());
        let Host::Name(want) = &self.host else {
            return Ok(()); // an IP rule allowed the address itself; names are not compared
        };
        let same = |got: &str| matches!(Host::parse(got), Ok(Host::Name(g)) if &g == want);
        match sniffed {
            Sniffed::Tls(None) => Err((
                "tls-no-server-name",
                format!("TLS to {want} without a server name (SNI)"),
            )),
            Sniffed::Tls(Some(sni)) if !same(&sni) => Err((
                "tls-name-mismatch",
                format!("TLS server name `{sni}` is not the connection's host {want}"),
            )),
            Sniffed::Http(Some(h)) if !same(&h) => Err((
                "host-header-mismatch",
                format!("HTTP Host `{h}` is not the connection's host {want}"),
            )),
            Sniffed::Http(None) => Err((
                "host-header-mismatch",
                format!("HTTP request to {want} without a Host header"),
            )),
            Sniffed::HttpAmbiguous(why) => Err((
                "host-header-mismatch",
                format!("HTTP request to {want} with an ambiguous host: {why}"),
            )),
            _ => Ok(()),
        }
    }

    /// Records the allowed connection and relays until both sides are done.
    fn relay(mut self, client: TcpStream, upstream: TcpStream, first: &[u8]) -> io::Result<()> {
        self.ev.decision = "allowed";
        self.ev.reason = "allowed";
        self.ev.detail = format!("{}:{} via {}", self.host, self.ev.port, self.ev.via);
        let (out, inn) = self.sh.record(self.ev);
        if let Ok(u) = upstream.try_clone() {
            if let Some(v) = self.sh.conns.lock().unwrap().get_mut(&self.id) {
                v.push(u);
            }
        }
        let mut up_w = upstream.try_clone()?;
        up_w.write_all(first)?;
        out.fetch_add(first.len() as u64, Ordering::Relaxed);
        let (c2, u2) = (client.try_clone()?, upstream.try_clone()?);
        let back = std::thread::Builder::new()
            .name("palisade-relay".into())
            .spawn(move || pump(u2, c2, &inn))?;
        pump(client, up_w, &out);
        let _ = back.join();
        Ok(())
    }
}

/// Copies until end of file, then half-closes the destination. Through a pipe with splice, so
/// the bytes stay in the kernel; with read and write where splice is refused.
fn pump(mut from: TcpStream, mut to: TcpStream, count: &AtomicU64) {
    use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
    const STEP: usize = 1 << 20;
    let mut spliced = false;
    if let Ok((r, w)) = pipe_with(PipeFlags::CLOEXEC) {
        let _ = rustix::pipe::fcntl_setpipe_size(&w, STEP);
        spliced = true;
        loop {
            let n = match splice(&from, None, &w, None, STEP, SpliceFlags::MOVE) {
                Ok(0) => break,
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::INVAL) if count.load(Ordering::Relaxed) == 0 => {
                    spliced = false;
                    break;
                }
                Err(_) => break,
            };
            let mut left = n;
            while left > 0 {
                match splice(&r, None, &to, None, left, SpliceFlags::MOVE) {
                    Ok(0) => break,
                    Ok(k) => left -= k,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                }
            }
            count.fetch_add((n - left) as u64, Ordering::Relaxed);
            if left > 0 {
                break;
            }
        }
    }
    if !spliced {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

fn split_authority(a: &str, default: u16) -> Option<(&str, u16)> {
    if a.starts_with('[') {
        let end = a.find(']')?;
        let port = match &a[end + 1..] {
            "" => default,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((&a[..end + 1], port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h, p.parse().ok()?)),
        Some(_) => None,
        None => Some((a, default)),
    }
}

fn http_error(c: &mut TcpStream, status: &str, code: &str, detail: &str) {
    let body = format!("palisade: {code}: {detail}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nX-Palisade-Denied: {code}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = c.write_all(msg.as_bytes());
}

fn http_proxy(sh: &Shared, mut c: TcpStream, id: u64) -> io::Result<()> {
    let _ = c.set_read_timeout(Some(FIRST_BYTES));
    let mut buf = Vec::new();
    let end = loop {
        if let Some(e) = wire::head_end(&buf) {
            break e;
        }
        let mut chunk = [0u8; 4096];
        let n = c.read(&mut chunk)?;
        if n == 0 || buf.len() > MAX_HEAD {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let _ = c.set_read_timeout(None);
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let line = head.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let bad = |c: &mut TcpStream, why: &str| {
        let mut ev = event("http-forward", target, 0);
        ev.reason = "bad-request";
        ev.detail = why.to_owned();
        sh.record(ev);
        http_error(c, "400 Bad Request", "bad-request", why);
        Ok(())
    };
    if method == "CONNECT" {
        let Some((h, port)) = split_authority(target, 443) else {
            return bad(&mut c, "CONNECT needs HOST:PORT");
        };
        let mut p = Pending {
            sh,
            id,
            ev: event("http-connect", h, port),
            host: match Host::parse(h) {
                Ok(x) => x,
                Err(_) => {
                    return bad(
                        &mut c,
                        "CONNECT to something that is not a host name or an IP address",
                    )
                }
            },
        };
        p.ev.host = p.host.to_string();
        let Some((mut p, up)) = p.connect_or_answer(&mut c) else {
            return Ok(());
        };
        c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
        let mut first = buf[end..].to_vec();
        if let Err(d) = p.check_first_bytes(&mut c, &mut first) {
            p.deny(d);
            return Ok(());
        }
        return p.relay(c, up, &first);
    }
    // Absolute-form plain HTTP: `GET http://host[:port]/path HTTP/1.1`.
    let Some(rest) = target.strip_prefix("http://") else {
        return bad(
            &mut c,
            "a proxy request needs an absolute http:// URL (use CONNECT for TLS)",
        );
    };
    let (auth, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let Some((h, port)) = split_authority(auth, 80) else {
        return bad(&mut c, "the URL's host[:port] does not parse");
    };
    let mut p = Pending {
        sh,
        id,
        ev: event("http-forward", h, port),
        host: match Host::parse(h) {
            Ok(x) => x,
            Err(_) => return bad(&mut c, "the URL's host is not a host name or an IP address"),
        },
    };
    p.ev.host = p.host.to_string();
    p.ev.protocol = Some("http");
    let hosts = wire::headers(&buf[..end], "host");
    if hosts.len() > 1 {
        let (code, detail) = p.deny((
            "host-header-mismatch",
            format!("more than one Host header ({})", hosts.join(", ")),
        ));
        http_error(&mut c, "403 Forbidden", code, &detail);
        return Ok(());
    }
    if let (Host::Name(want), Some(hh)) = (p.host.clone(), hosts.into_iter().next()) {
        if !matches!(Host::parse(&wire::strip_port(hh.clone())), Ok(Host::Name(g)) if g == want) {
            let (code, detail) = p.deny((
                "host-header-mismatch",
                format!("HTTP Host `{hh}` is not the URL's host {want}"),
            ));
            http_error(&mut c, "403 Forbidden", code, &detail);
            return Ok(());
        }
    }
    let Some((p, up)) = p.connect_or_answer(&mut c) else {
        return Ok(());
    };
    // Origin-form to the server, one request per connection, no proxy headers passed on.
    let mut out = format!("{method} {path} {}\r\n", parts.next().unwrap_or("HTTP/1.1"));
    let mut has_host = false;
    for l in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let name = l
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        has_host |= name == "host";
        out.push_str(l);
        out.push_str("\r\n");
    }
    if !has_host {
        out.push_str(&format!("Host: {auth}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut first = out.into_bytes();
    first.extend_from_slice(&buf[end..]);
    p.relay(c, up, &first)
}

fn socks(sh: &Shared, mut c: TcpStream, id: u64) -> io::Result<()> {
    let _ = c.set_read_timeout(Some(FIRST_BYTES));
    let mut hdr = [0u8; 2];
    c.read_exact(&mut hdr)?;
    let mut methods = vec![0u8; hdr[1] as usize];
    c.read_exact(&mut methods)?;
    if hdr[0] != 5 || !methods.contains(&0) {
        let _ = c.write_all(&[5, 0xff]);
        return Ok(());
    }
    c.write_all(&[5, 0])?;
    let mut req = [0u8; 4];
    c.read_exact(&mut req)?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            c.read_exact(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            c.read_exact(&mut a)?;
            format!("[{}]", std::net::Ipv6Addr::from(a))
        }
        3 => {
            let mut n = [0u8; 1];
            c.read_exact(&mut n)?;
            let mut name = vec![0u8; n[0] as usize];
            c.read_exact(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        _ => String::new(),
    };
    let mut pb = [0u8; 2];
    c.read_exact(&mut pb)?;
    let port = u16::from_be_bytes(pb);
    let _ = c.set_read_timeout(None);
    let reply = |c: &mut TcpStream, code: u8| c.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
    let mut ev = event("socks5", &host, port);
    if req[1] != 1 {
        ev.reason = "unsupported";
        ev.detail = format!("SOCKS5 command {} (only CONNECT is served)", req[1]);
        sh.record(ev);
        return reply(&mut c, 7);
    }
    let Ok(h) = Host::parse(&host) else {
        ev.reason = "bad-request";
        ev.detail = format!("`{host}` is not a host name or an IP address");
        sh.record(ev);
        return reply(&mut c, 2);
    };
    ev.host = h.to_string();
    let mut p = Pending {
        sh,
        id,
        ev,
        host: h,
    };
    let up = match p.connect() {
        Ok(u) => u,
        Err(d) => {
            let code = match d.0 {
                "resolve-failed" => 4,
                "connect-failed" => 5,
                _ => 2,
            };
            p.deny(d);
            return reply(&mut c, code);
        }
    };
    reply(&mut c, 0)?;
    let mut first = Vec::new();
    if let Err(d) = p.check_first_bytes(&mut c, &mut first) {
        p.deny(d);
        return Ok(());
    }
    p.relay(c, up, &first)
}

fn transparent(sh: &Shared, mut c: TcpStream, id: u64) -> io::Result<()> {
    let local = c.local_addr()?;
    let name = match local.ip() {
        IpAddr::V4(a) => sh.names.lock().unwrap().by_addr.get(&a).cloned(),
        IpAddr::V6(_) => None,
    };
    let Some(name) = name else {
        let mut ev = event("transparent", &local.ip().to_string(), local.port());
        ev.reason = "unknown-address";
        ev.detail = format!(
            "{local} was not handed out by palisade's DNS stub; connect by an allowed name"
        );
        sh.record(ev);
        return Ok(());
    };
    let mut p = Pending {
        sh,
        id,
        ev: event("transparent", &name, local.port()),
        host: Host::Name(name),
    };
    let mut first = Vec::new();
    if let Err(d) = p.check_first_bytes(&mut c, &mut first) {
        p.deny(d);
        return Ok(());
    }
    match p.connect() {
        Ok(up) => p.relay(c, up, &first),
        Err(d) => {
            p.deny(d);
            Ok(())
        }
    }
}
