//! The listeners' loops and the three ways in (HTTP proxy, SOCKS5, transparent), each reading the
//! client's request within the first-bytes deadline, deciding, and relaying what is allowed.

use crate::http::{Exchange, Upstream};
use crate::relay::{self, read_by, read_exact_by, write_all, CpuMeter, Wake};
use crate::share::Place;
use crate::tls::{HandshakeError, Peer};
use crate::wire::{self, HostError, ProxyRequest, Sniffed};
use crate::{
    dns, event, Decision, Event, Lookup, Protocol, Reason, Role, Shared, Via, DNS_TIMEOUT,
    MAX_HEAD, MAX_LOOKUPS, MAX_NAMES,
};
use palisade_policy::net::{Host, Refusal, TRANSPARENT_NET};
use palisade_policy::untrusted::Untrusted;
use rustix::event::PollFlags;
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most characters of a client's text quoted in a detail.
const QUOTED: usize = 128;

pub(crate) fn dns_loop(sh: &Shared, sock: &UdpSocket) {
    let mut meter = CpuMeter::new(&sh.cpu_ns);
    let mut buf = [0u8; 1500];
    loop {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                if let Some(q) = wire::dns_question(&buf[..n]) {
                    let reply = answer(sh, &q);
                    // A full send buffer drops the answer: the client asks again.
                    let _ = sock.send_to(&reply, from);
                }
                meter.tick();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if relay::wait_one(sh, sock.as_fd(), PollFlags::IN, None) != Wake::Ready {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

pub(crate) fn answer(sh: &Shared, q: &wire::Question) -> Vec<u8> {
    let mut ev = event(Via::Dns, &q.name, 53);
    let verdict = match Host::parse(&q.name) {
        Ok(Host::Name(n)) => {
            ev.host = n.clone();
            sh.name_allowed(&n).map(|()| n)
        }
        Ok(Host::Ip(_)) | Err(_) => Err((
            Refusal::NotAllowed,
            format!(
                "`{}` is not a host name on the allow-list",
                Untrusted::new(&q.name).max(QUOTED)
            ),
        )),
    };
    match verdict {
        Ok(name) => {
            let mut names = sh.names.lock().unwrap_or_else(|e| e.into_inner());
            let known = names.by_name.get(name.as_str()).copied();
            let addr = match known {
                Some(a) => a,
                None if names.by_name.len() >= MAX_NAMES => {
                    drop(names);
                    ev.reason = Reason::NotAllowed;
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
                    let shared: Arc<str> = name.as_str().into();
                    names.by_name.insert(shared.clone(), a);
                    names.by_addr.insert(a, shared);
                    a
                }
            };
            drop(names);
            if known.is_none() {
                ev.decision = Decision::Allowed;
                ev.reason = Reason::Allowed;
                ev.address = Some(addr.to_string());
                ev.detail = format!("{name} answered with {addr}, which leads to the proxy");
                sh.record(ev);
            }
            wire::dns_answer(q, 0, (q.qtype == wire::TYPE_A).then(|| addr.octets()))
        }
        Err((r, detail)) => {
            let mut names = sh.names.lock().unwrap_or_else(|e| e.into_inner());
            let key = names.keys.hash_one(q.name.as_bytes());
            let first = match names.refused.get(&key).copied() {
                Some(Some(i)) => {
                    names.lookups[i].count += 1;
                    false
                }
                Some(None) => {
                    names.lookups_dropped += 1;
                    false
                }
                None if names.refused.len() >= MAX_NAMES => {
                    names.lookups_dropped += 1;
                    false
                }
                None => {
                    let at = (names.lookups.len() < MAX_LOOKUPS).then_some(names.lookups.len());
                    match at {
                        Some(_) => names.lookups.push(Lookup {
                            name: crate::bounded(
                                &Untrusted::new(&q.name)
                                    .max(crate::MAX_HOST_CHARS)
                                    .to_string(),
                                crate::HOST_SHOWN,
                            ),
                            count: 1,
                        }),
                        None => names.lookups_dropped += 1,
                    }
                    names.refused.insert(key, at);
                    true
                }
            };
            drop(names);
            if first {
                ev.reason = r.into();
                ev.detail = format!("NXDOMAIN: {detail}");
                sh.record(ev);
            }
            wire::dns_answer(q, 3, None)
        }
    }
}

impl Shared {
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

/// Serves one TCP listener until the proxy stops, then joins its connections' threads.
pub(crate) fn accept_loop(sh: &Arc<Shared>, l: &TcpListener, role: Role) {
    let mut meter = CpuMeter::new(&sh.cpu_ns);
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    loop {
        meter.tick();
        let s = match l.accept() {
            // The answers' pieces leave as written (see `relay::connect`).
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                s
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if relay::wait_one(sh, l.as_fd(), PollFlags::IN, None) != Wake::Ready {
                    break;
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::CONNABORTED.raw_os_error()) => {
                continue
            }
            Err(e) if is_out_of_resources(&e) => {
                // The connection stays queued; try again in a while rather than spin on it.
                let pause = Instant::now() + Duration::from_millis(100);
                if relay::wait(sh, &[], Some(pause)) == Wake::Stop {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        // Join the threads of connections that ended, so that the list stays short.
        let (ended, open): (Vec<_>, Vec<_>) = threads.drain(..).partition(|t| t.is_finished());
        threads = open;
        for t in ended {
            let _ = t.join();
        }
        let place = match Place::take(sh) {
            Ok(p) => p,
            Err(why) => {
                refuse(&s, role, why);
                sh.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let sh2 = sh.clone();
        let spawned = std::thread::Builder::new()
            .name("palisade-conn".into())
            .spawn(move || {
                // Its waits end when the connection is cut, too; given back when it ends.
                place.enter();
                let _place = place;
                let mut meter = CpuMeter::new(&sh2.cpu_ns);
                let accepted = Instant::now();
                if s.set_nonblocking(true).is_err() {
                    return;
                }
                let _ = match role {
                    Role::HttpProxy => http_proxy(&sh2, &s, &mut meter),
                    Role::Socks => socks(&sh2, &s, &mut meter),
                    Role::Transparent => transparent(&sh2, &s, accepted, &mut meter),
                    Role::Dns => Ok(()),
                };
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(_) => {
                // No thread to be had: the connection and its place went with the closure.
                sh.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

fn is_out_of_resources(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
        .iter()
        .any(|x| e.raw_os_error() == Some(x.raw_os_error()))
}

/// Closes a connection past the cap at once: the HTTP proxy first says why, if the client's
/// socket takes the answer without waiting.
fn refuse(s: &TcpStream, role: Role, why: &str) {
    if role == Role::HttpProxy && s.set_nonblocking(true).is_ok() {
        let body = format!("palisade: too-many-connections: {why}\n");
        let msg = format!(
            "HTTP/1.1 503 Service Unavailable\r\nX-Palisade-Denied: too-many-connections\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut w = s;
        let _ = w.write(msg.as_bytes());
        // Read what the client sent already, so that the close does not reset the connection
        // and discard the answer.
        let mut r = s;
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            if !matches!(r.read(&mut sink), Ok(n) if n > 0) {
                break;
            }
        }
    }
}

/// A refusal: the code and the text for the log and the client.
struct Denial {
    reason: Reason,
    detail: String,
}

impl Denial {
    fn new(reason: impl Into<Reason>, detail: impl Into<String>) -> Denial {
        Denial {
            reason: reason.into(),
            detail: detail.into(),
        }
    }
}

/// `addrs` with the two address families taking turns, the first address's first (as RFC 8305
/// orders them): a family whose addresses do not answer (IPv6 on a host without a route that
/// drops packets) then costs one share of the connect deadline before the other is tried.
pub(crate) fn interleave(addrs: Vec<IpAddr>) -> Vec<IpAddr> {
    let Some(v6_first) = addrs.first().map(IpAddr::is_ipv6) else {
        return addrs;
    };
    let n = addrs.len();
    let (first, other): (Vec<IpAddr>, Vec<IpAddr>) =
        addrs.into_iter().partition(|a| a.is_ipv6() == v6_first);
    let (mut first, mut other) = (first.into_iter(), other.into_iter());
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.extend(first.next());
        out.extend(other.next());
    }
    out
}

/// A connection being decided.
struct Pending<'a> {
    sh: &'a Shared,
    ev: Event,
    host: Host,
}

impl<'a> Pending<'a> {
    /// `host` as the client sent it; `Err` (already answered and logged by `bad`) if it is not a
    /// host name or an IP address.
    fn new(sh: &'a Shared, via: Via, host: &str, port: u16) -> Result<Pending<'a>, Event> {
        let mut ev = event(via, host, port);
        match Host::parse(host) {
            Ok(h) => {
                ev.host = h.to_string();
                Ok(Pending { sh, ev, host: h })
            }
            Err(_) => Err(ev),
        }
    }

    fn deny(mut self, d: Denial) -> Denial {
        self.ev.reason = d.reason;
        self.ev.detail = d.detail.clone();
        self.sh.record(self.ev);
        d
    }

    /// The rules for the destination as named, then resolution, then the connection.
    fn connect(&mut self) -> Result<TcpStream, Denial> {
        let port = self.ev.port;
        let net = &self.sh.net;
        net.decide(&self.host, port)
            .map_err(|(r, d)| Denial::new(r, d))?;
        // Its turn among the proxy's upstream connections (`MAX_CONNECTS_PER_S`).
        let wait = self
            .sh
            .pace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        if !wait.is_zero() {
            self.sh.paced.fetch_add(1, Ordering::Relaxed);
            if relay::wait(self.sh, &[], Some(Instant::now() + wait)) == Wake::Stop {
                return Err(Denial::new(
                    Reason::ConnectFailed,
                    format!(
                        "stopped waiting for its turn: {}",
                        crate::share::why_stopped()
                    ),
                ));
            }
        }
        let addrs: Vec<IpAddr> = match &self.host {
            Host::Ip(a) => vec![*a],
            Host::Name(n) => {
                let pinned = net.pinned(n);
                if !pinned.is_empty() {
                    pinned
                } else if let Some(server) = net.dns_server {
                    // Its waits end when the proxy stops or the connection is cut.
                    let sh = self.sh;
                    let mut wait = |sock: &UdpSocket, until: Instant| {
                        relay::wait_one(sh, sock.as_fd(), PollFlags::IN, Some(until)) != Wake::Stop
                    };
                    dns::resolve_waiting(server, n, DNS_TIMEOUT, &mut wait).map_err(|e| {
                        Denial::new(Reason::ResolveFailed, format!("{n} (asked {server}): {e}"))
                    })?
                } else {
                    let q = dns::system_name(n.as_str());
                    (q.as_ref(), port)
                        .to_socket_addrs()
                        .map_err(|e| Denial::new(Reason::ResolveFailed, format!("{n}: {e}")))?
                        .map(|s| s.ip())
                        .collect()
                }
            }
        };
        let mut refusal = None;
        let ok: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|a| match net.address_ok(*a, port) {
                Ok(()) => true,
                Err(e) => {
                    refusal.get_or_insert(e);
                    false
                }
            })
            .collect();
        if ok.is_empty() {
            return Err(match refusal {
                None => Denial::new(
                    Reason::ResolveFailed,
                    format!("{} has no address", self.host),
                ),
                Some((r, d)) => Denial::new(r, format!("{}: {d}", self.host)),
            });
        }
        let ok = interleave(ok);
        // One deadline for all the name's addresses: each tries with its share of what is left
        // (at least a quarter of the whole, or all that is left), so a name with many addresses
        // that do not answer holds the connection's thread no longer than one that has one.
        let limit = self.sh.limits.connect;
        let deadline = Instant::now() + limit;
        let n = ok.len();
        let mut last = None;
        for (i, a) in ok.into_iter().enumerate() {
            let sa = SocketAddr::new(a, port);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let untried = n - i;
                let why = format!(
                    "{untried} more address{} not tried: {limit:?} in all to connect",
                    if untried == 1 { "" } else { "es" },
                );
                last = Some(match last {
                    Some(l) => format!("{l}; {why}"),
                    None => why,
                });
                break;
            }
            let share = (left / (n - i) as u32).max(left.min(limit / 4));
            match relay::connect(self.sh, sa, share) {
                Ok(s) => {
                    self.ev.address = Some(sa.to_string());
                    // A connection that found the process's proxies full has earned a place
                    // now (`share`), or is refused.
                    crate::share::settle(self.sh)
                        .map_err(|why| Denial::new(Reason::ProxiesFull, why))?;
                    return Ok(s);
                }
                Err(e) => last = Some(format!("{sa}: {e}")),
            }
        }
        Err(Denial::new(Reason::ConnectFailed, last.unwrap_or_default()))
    }

    /// [`Pending::connect`] for the HTTP paths: on a refusal, answers the client with `502` (the
    /// upstream could not be resolved or reached) or `403` (a rule or a check refused it).
    fn connect_or_answer(mut self, c: &TcpStream) -> Option<(Self, TcpStream)> {
        match self.connect() {
            Ok(u) => Some((self, u)),
            Err(d) => {
                let status = match d.reason {
                    Reason::ConnectFailed | Reason::ResolveFailed => "502 Bad Gateway",
                    Reason::ProxiesFull => "503 Service Unavailable",
                    _ => "403 Forbidden",
                };
                let sh = self.sh;
                let d = self.deny(d);
                http_error(sh, c, status, d.reason, &d.detail);
                None
            }
        }
    }

    /// Reads the client's first bytes (appending to `buf`) until they can be told apart, by
    /// `deadline`, and checks them against the name. A client that sends nothing by then (a
    /// server-first protocol) passes; one that started a ClientHello or a request head and did
    /// not finish it does not.
    fn check_first_bytes(
        &mut self,
        c: &TcpStream,
        buf: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<(), Denial> {
        let incomplete = |why: &str, buf: &[u8]| {
            Denial::new(
                Reason::IncompleteRequest,
                format!(
                    "{why} after {} bytes that start a TLS ClientHello or an HTTP request: {}",
                    buf.len(),
                    Untrusted::new(buf).max(48)
                ),
            )
        };
        let sniffed = loop {
            if let Some(s) = wire::sniff(buf) {
                break s;
            }
            if buf.len() >= MAX_HEAD {
                return Err(incomplete("still incomplete", buf));
            }
            let mut chunk = [0u8; 4096];
            let want = chunk.len().min(MAX_HEAD.saturating_sub(buf.len()));
            match read_by(self.sh, c, &mut chunk[..want], deadline) {
                Ok(Some(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                Err(e) if relay::is_stopping(&e) => return Err(incomplete(&e.to_string(), buf)),
                _ if buf.is_empty() => break Sniffed::Other, // nothing sent: server-first
                Ok(Some(_)) => return Err(incomplete("the client closed", buf)),
                Ok(None) => return Err(incomplete("nothing more within the time allowed", buf)),
                Err(e) => return Err(incomplete(&e.to_string(), buf)),
            }
        };
        self.ev.protocol = Some(sniffed.protocol());
        self.check(&sniffed, false)
    }

    /// The one check of what a client sent against the connection's host: the TLS server name
    /// or the HTTP host must be that name. An IP host (an IP rule allowed the address itself) is
    /// not compared with names, but an ambiguous HTTP host is refused whatever the host.
    /// `forward`: an absolute-form request on the HTTP proxy, whose URL is the host.
    fn check(&self, sniffed: &Sniffed, forward: bool) -> Result<(), Denial> {
        let want = &self.host;
        let named = matches!(want, Host::Name(_));
        let same = |got: &str| matches!(Host::parse(got), Ok(g) if g == *want);
        let quote = |s: &str| Untrusted::new(s).max(QUOTED).to_string();
        let whose = if forward {
            "the URL's"
        } else {
            "the connection's"
        };
        let mismatch = |got: &str| {
            Denial::new(
                Reason::HostHeaderMismatch,
                format!("HTTP Host `{}` is not {whose} host {want}", quote(got)),
            )
        };
        match sniffed {
            Sniffed::Tls(None) if named => Err(Denial::new(
                Reason::TlsNoServerName,
                format!("TLS to {want} without a server name (SNI)"),
            )),
            Sniffed::Tls(Some(sni)) if named && !same(sni) => Err(Denial::new(
                Reason::TlsNameMismatch,
                format!(
                    "TLS server name `{}` is not the connection's host {want}",
                    quote(sni)
                ),
            )),
            Sniffed::Http(Ok(Some(h))) if named && !same(h) => Err(mismatch(h)),
            Sniffed::Http(Ok(None)) if named => Err(Denial::new(
                Reason::HostHeaderMismatch,
                format!("HTTP request to {want} without a Host header"),
            )),
            // The URL is the host a forwarded request names; a Host naming another is the
            // ordinary mismatch there, not an ambiguity.
            Sniffed::Http(Err(HostError::TargetDiffers { host, .. })) if forward => {
                Err(mismatch(host))
            }
            Sniffed::Http(Err(why)) => Err(Denial::new(
                Reason::HostHeaderMismatch,
                format!("HTTP request to {want} with an ambiguous host: {why}"),
            )),
            _ => Ok(()),
        }
    }

    /// Serves an allowed connection whose first bytes were checked: HTTP through the proxy's
    /// reading of each request, TLS to an inspected host through inspection, the rest relayed
    /// as it is.
    fn serve(self, c: &TcpStream, upstream: TcpStream, first: Vec<u8>, meter: &mut CpuMeter) {
        match self.ev.protocol {
            Some(Protocol::Http) => self.serve_http(c, upstream, first, None, meter),
            Some(Protocol::Tls) if self.sh.net.inspects(&self.host, self.ev.port) => {
                self.inspect(c, upstream, first, meter)
            }
            _ => self.relay(c, upstream, first, meter),
        }
    }

    /// Records the allowed connection, then the exchange of its requests.
    fn exchange(
        mut self,
        tls: bool,
        detail: String,
        forward: Option<(String, String)>,
    ) -> Exchange<'a> {
        self.ev.decision = Decision::Allowed;
        self.ev.reason = Reason::Allowed;
        self.ev.detail = detail;
        self.ev.inspected = tls;
        let (via, port, address) = (self.ev.via, self.ev.port, self.ev.address.clone());
        let (out, inn) = self.sh.record(self.ev);
        Exchange {
            sh: self.sh,
            via,
            host: self.host,
            port,
            address,
            tls,
            forward,
            out,
            inn,
        }
    }

    /// Plain HTTP: each request read and checked ([`Exchange`]).
    fn serve_http(
        self,
        c: &TcpStream,
        upstream: TcpStream,
        first: Vec<u8>,
        forward: Option<(String, String)>,
        meter: &mut CpuMeter,
    ) {
        let Ok(sock) = c.try_clone() else { return };
        let detail = format!(
            "{}:{} via {}: HTTP, each request checked",
            self.host, self.ev.port, self.ev.via
        );
        let ex = self.exchange(false, detail, forward);
        ex.run(
            &mut Peer::plain(sock),
            Upstream::Ready(Peer::plain(upstream)),
            first,
            meter,
        );
    }

    /// TLS to an inspected host: the proxy completes the sandbox's handshake with a leaf of the
    /// run's CA, checks the server name rustls read, and serves each request, with its own TLS
    /// upstream (verified) once the first request passed.
    fn inspect(mut self, c: &TcpStream, upstream: TcpStream, first: Vec<u8>, meter: &mut CpuMeter) {
        let sh = self.sh;
        self.ev.inspected = true;
        let Some(ins) = &sh.inspection else {
            self.deny(Denial::new(
                Reason::TlsHandshake,
                "inspection is asked for, but the proxy was started without a CA (Egress::start_prepared)",
            ));
            return;
        };
        let cfg = match ins.ca.server_config(&self.host) {
            Ok(c) => c,
            Err(e) => {
                self.deny(Denial::new(Reason::TlsHandshake, e.to_string()));
                return;
            }
        };
        let Ok(sock) = c.try_clone() else { return };
        let deadline = Instant::now() + sh.limits.first_bytes;
        let mut peer = match Peer::accept(sh, sock, cfg, &first, deadline) {
            Ok(p) => p,
            Err(HandshakeError::Stopping) => return,
            Err(HandshakeError::Certificate(w) | HandshakeError::Other(w)) => {
                let detail = format!(
                    "the client's TLS handshake with the proxy failed ({w}): it must trust the run's CA (palisade points SSL_CERT_FILE and the system bundle at it); a client that pins its own certificates needs network.no_inspect for {}",
                    self.host
                );
                self.deny(Denial::new(Reason::TlsHandshake, detail));
                return;
            }
        };
        // The server name as rustls read it must be the host, as the sniffer's reading was.
        let name = peer.server_name();
        let check = match &name {
            Some(n) => self.check(&Sniffed::Tls(Some(n.clone())), false),
            None => self.check(&Sniffed::Tls(None), false),
        };
        if let Err(d) = check {
            self.deny(d);
            return;
        }
        let server = match &self.host {
            Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone()),
            Host::Ip(a) => Ok(rustls::pki_types::ServerName::IpAddress((*a).into())),
        };
        let Ok(server) = server else {
            let detail = format!("{} is not a name TLS can verify", self.host);
            self.deny(Denial::new(Reason::TlsHandshake, detail));
            return;
        };
        let detail = format!(
            "{}:{} via {}: TLS inspected, each request checked",
            self.host, self.ev.port, self.ev.via
        );
        let ex = self.exchange(true, detail, None);
        ex.run(
            &mut peer,
            Upstream::Tls {
                sock: upstream,
                name: server,
            },
            Vec::new(),
            meter,
        );
    }

    /// Records the allowed connection and relays until both sides are done.
    fn relay(mut self, c: &TcpStream, upstream: TcpStream, first: Vec<u8>, meter: &mut CpuMeter) {
        self.ev.decision = Decision::Allowed;
        self.ev.reason = Reason::Allowed;
        self.ev.detail = format!("{}:{} via {}", self.host, self.ev.port, self.ev.via);
        let (out, inn) = self.sh.record(self.ev);
        relay::relay(self.sh, c, &upstream, first, (&out, &inn), meter);
    }
}

fn http_error(sh: &Shared, c: &TcpStream, status: &str, code: Reason, detail: &str) {
    let body = format!("palisade: {code}: {detail}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nX-Palisade-Denied: {code}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = write_all(sh, c, msg.as_bytes());
}

/// Logs a request the HTTP proxy cannot serve and answers it with `400`.
fn bad(sh: &Shared, c: &TcpStream, ev: Event, reason: Reason, why: &str) {
    let mut ev = ev;
    ev.reason = reason;
    ev.detail = why.to_owned();
    let detail = crate::bounded(&ev.detail, crate::MAX_DETAIL_CHARS);
    sh.record(ev);
    http_error(sh, c, "400 Bad Request", reason, &detail);
}

fn http_proxy(sh: &Shared, c: &TcpStream, meter: &mut CpuMeter) -> io::Result<()> {
    let deadline = Instant::now() + sh.limits.first_bytes;
    let mut buf = Vec::new();
    let via = |buf: &[u8]| {
        if buf.starts_with(b"CONNECT ") {
            Via::HttpConnect
        } else {
            Via::HttpForward
        }
    };
    let head = loop {
        match wire::parse_head(&buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(why) => {
                let why = format!("a malformed request head ({why})");
                bad(sh, c, event(via(&buf), "", 0), Reason::BadRequest, &why);
                return Ok(());
            }
        }
        let mut chunk = [0u8; 4096];
        let want = chunk.len().min(MAX_HEAD - buf.len());
        let why = match read_by(sh, c, &mut chunk[..want], deadline)? {
            Some(0) if buf.is_empty() => return Ok(()),
            None if buf.is_empty() => return Ok(()),
            Some(n) if n > 0 => {
                buf.extend_from_slice(&chunk[..n]);
                continue;
            }
            _ if want == 0 => "a request head larger than 64 KiB".to_owned(),
            Some(_) => "the client closed before its request head was complete".to_owned(),
            None => "no complete request head within the time allowed".to_owned(),
        };
        let why = format!("{why}: {}", Untrusted::new(&buf).max(48));
        bad(
            sh,
            c,
            event(via(&buf), "", 0),
            Reason::IncompleteRequest,
            &why,
        );
        return Ok(());
    };
    let ask = match wire::proxy_request(&head) {
        Ok(r) => r,
        Err(why) => {
            let via = if head.method == "CONNECT" {
                Via::HttpConnect
            } else {
                Via::HttpForward
            };
            bad(sh, c, event(via, &head.target, 0), Reason::BadRequest, why);
            return Ok(());
        }
    };
    match ask {
        ProxyRequest::Connect { host, port } => {
            let p = match Pending::new(sh, Via::HttpConnect, &host, port) {
                Ok(p) => p,
                Err(ev) => {
                    let why = "CONNECT to something that is not a host name or an IP address";
                    bad(sh, c, ev, Reason::BadRequest, why);
                    return Ok(());
                }
            };
            let Some((mut p, up)) = p.connect_or_answer(c) else {
                return Ok(());
            };
            write_all(sh, c, b"HTTP/1.1 200 Connection established\r\n\r\n")?;
            let mut first = buf[head.len..].to_vec();
            let deadline = Instant::now() + sh.limits.first_bytes;
            if let Err(d) = p.check_first_bytes(c, &mut first, deadline) {
                p.deny(d);
                return Ok(());
            }
            p.serve(c, up, first, meter);
        }
        ProxyRequest::Forward {
            host,
            port,
            authority,
            path,
        } => {
            let mut p = match Pending::new(sh, Via::HttpForward, &host, port) {
                Ok(p) => p,
                Err(ev) => {
                    let why = "the URL's host is not a host name or an IP address";
                    bad(sh, c, ev, Reason::BadRequest, why);
                    return Ok(());
                }
            };
            p.ev.protocol = Some(Protocol::Http);
            if let Err(d) = p.check(&Sniffed::Http(wire::http_host(&head)), true) {
                let d = p.deny(d);
                http_error(sh, c, "403 Forbidden", d.reason, &d.detail);
                return Ok(());
            }
            let Some((p, up)) = p.connect_or_answer(c) else {
                return Ok(());
            };
            // The request, read again and checked like any other, goes upstream in origin form.
            p.serve_http(c, up, buf, Some((authority, path)), meter);
        }
    }
    Ok(())
}

fn socks(sh: &Shared, c: &TcpStream, meter: &mut CpuMeter) -> io::Result<()> {
    let deadline = Instant::now() + sh.limits.first_bytes;
    let read = |buf: &mut [u8]| read_exact_by(sh, c, buf, deadline);
    let mut hdr = [0u8; 2];
    read(&mut hdr)?;
    let mut methods = vec![0u8; hdr[1] as usize];
    read(&mut methods)?;
    if hdr[0] != 5 || !methods.contains(&0) {
        let _ = write_all(sh, c, &[5, 0xff]);
        return Ok(());
    }
    write_all(sh, c, &[5, 0])?;
    let mut req = [0u8; 4];
    read(&mut req)?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            read(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            read(&mut a)?;
            format!("[{}]", std::net::Ipv6Addr::from(a))
        }
        3 => {
            let mut n = [0u8; 1];
            read(&mut n)?;
            let mut name = vec![0u8; n[0] as usize];
            read(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        _ => String::new(),
    };
    let mut pb = [0u8; 2];
    read(&mut pb)?;
    let port = u16::from_be_bytes(pb);
    let reply = |code: u8| write_all(sh, c, &[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
    if req[1] != 1 {
        let mut ev = event(Via::Socks5, &host, port);
        ev.reason = Reason::Unsupported;
        ev.detail = format!("SOCKS5 command {} (only CONNECT is served)", req[1]);
        sh.record(ev);
        return reply(7);
    }
    let mut p = match Pending::new(sh, Via::Socks5, &host, port) {
        Ok(p) => p,
        Err(mut ev) => {
            ev.reason = Reason::BadRequest;
            ev.detail = format!(
                "`{}` is not a host name or an IP address",
                Untrusted::new(&host).max(QUOTED)
            );
            sh.record(ev);
            return reply(2);
        }
    };
    let up = match p.connect() {
        Ok(u) => u,
        Err(d) => {
            let code = match d.reason {
                Reason::ResolveFailed => 4,
                Reason::ConnectFailed => 5,
                _ => 2,
            };
            p.deny(d);
            return reply(code);
        }
    };
    reply(0)?;
    let mut first = Vec::new();
    let deadline = Instant::now() + sh.limits.first_bytes;
    if let Err(d) = p.check_first_bytes(c, &mut first, deadline) {
        p.deny(d);
        return Ok(());
    }
    p.serve(c, up, first, meter);
    Ok(())
}

fn transparent(
    sh: &Shared,
    c: &TcpStream,
    accepted: Instant,
    meter: &mut CpuMeter,
) -> io::Result<()> {
    let local = c.local_addr()?;
    let name = match local.ip() {
        IpAddr::V4(a) => sh
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_addr
            .get(&a)
            .cloned(),
        IpAddr::V6(_) => None,
    };
    let Some(name) = name else {
        let mut ev = event(Via::Transparent, &local.ip().to_string(), local.port());
        ev.reason = Reason::UnknownAddress;
        ev.detail = format!(
            "{local} was not handed out by palisade's DNS stub; connect by an allowed name"
        );
        sh.record(ev);
        return Ok(());
    };
    let mut p = Pending {
        sh,
        ev: event(Via::Transparent, &name, local.port()),
        host: Host::Name(name.to_string()),
    };
    let mut first = Vec::new();
    if let Err(d) = p.check_first_bytes(c, &mut first, accepted + sh.limits.first_bytes) {
        p.deny(d);
        return Ok(());
    }
    match p.connect() {
        Ok(up) => p.serve(c, up, first, meter),
        Err(d) => {
            p.deny(d);
        }
    }
    Ok(())
}
