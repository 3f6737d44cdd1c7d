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
//!
//! **What the sandbox can make the supervisor spend**, whatever it sends, per [`Egress`]:
//! - threads: one per listener (taken from a pool of waiting ones where it can:
//!   `palisade_linux::pool`), plus one per
//!   open connection, at most [`MAX_CONNECTIONS`]; a
//!   connection past that is closed at once (the HTTP listener answers `503`) and only counted;
//!   all the proxies of a process together hold at most [`MAX_CONNECTIONS_IN_PROCESS`], shared
//!   out fairly between their sandboxes when full (`share`);
//! - time: a client has [`FIRST_BYTES`] in all (not per read) to send its request head, SOCKS
//!   handshake or first bytes, and an upstream connection [`CONNECT_TIMEOUT`] for all of its
//!   name's addresses together;
//! - memory: at most [`MAX_HEAD`] bytes read before a decision per connection, at most
//!   [`MAX_EVENTS`] events of bounded size and [`MAX_EVENT_BYTES`] in all, and the DNS stub's
//!   table of at most [`MAX_NAMES`] names;
//! - output: the notify callback gets at most [`MAX_NOTIFY`] allowed and as many denied events,
//!   and only events the log keeps; every string in an event that the sandbox could shape is
//!   escaped and cut ([`palisade_policy::untrusted`]);
//! - CPU: not bounded here, but measured ([`Egress::cpu_used`]) so that the caller can stop a
//!   sandbox whose proxy work goes past a budget.
//!
//! Every thread is joined by [`Egress::finish`], or by dropping the [`Egress`]: every wait in the
//! proxy (a lookup through the policy's DNS server too) also waits for the stop signal, so
//! stopping takes no longer than a lookup by the system's resolver in progress, by its own
//! timeouts.
#![forbid(unsafe_code)]

mod ca;
mod dns;
mod http;
mod relay;
mod secrets;
mod serve;
mod share;
mod tls;
mod wire;

pub use ca::{CaError, MAX_LEAVES};

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;

use palisade_linux::pool::Pool;
use palisade_policy::net::{Network, Refusal};
use palisade_policy::untrusted::Untrusted;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a listener is for (mirrors the backend's socket roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    HttpProxy,
    Socks,
    Dns,
    Transparent,
}

/// How a connection or a query reached the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Via {
    /// `CONNECT` on the HTTP proxy.
    HttpConnect,
    /// An absolute-form plain HTTP request on the HTTP proxy.
    HttpForward,
    Socks5,
    /// A connection to an address the DNS stub handed out.
    Transparent,
    /// A query to the DNS stub.
    Dns,
}

/// Whether the proxy let it through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    Allowed,
    Denied,
}

/// Why, as a stable code (the report's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    Allowed,
    /// No allow rule names the host (or the DNS stub has no address left to hand out).
    NotAllowed,
    /// An allow rule names the host, for other ports.
    PortNotAllowed,
    DeniedByRule,
    /// An IP address that no IP rule allows.
    IpLiteral,
    /// The name resolved to an address that is not globally reachable.
    SpecialAddress,
    ResolveFailed,
    ConnectFailed,
    TlsNoServerName,
    /// The TLS server name is not the connection's host.
    TlsNameMismatch,
    /// The HTTP `Host` is not the connection's host, is missing, or is ambiguous.
    HostHeaderMismatch,
    BadRequest,
    /// The client started a request (a ClientHello, an HTTP head) and did not finish it within
    /// [`FIRST_BYTES`] or [`MAX_HEAD`] bytes.
    IncompleteRequest,
    /// A SOCKS5 command other than CONNECT.
    Unsupported,
    /// A connection to a 127.77.x.y address the DNS stub never handed out.
    UnknownAddress,
    /// No HTTP rule for the host allows the request's method and path.
    HttpRule,
    /// The request's body is larger than `network.max_body`.
    BodyTooLarge,
    /// The request carries the placeholder of a secret that goes to another destination.
    SecretElsewhere,
    /// The inspected host's certificate does not verify.
    UpstreamCertificate,
    /// TLS to the inspected host failed otherwise.
    UpstreamTls,
    /// The sandbox's client did not complete TLS with the proxy's certificate (it does not trust
    /// the run's CA, pins another certificate, or wants a protocol the proxy does not speak).
    TlsHandshake,
    /// Inside inspected TLS, something that is not an HTTP/1.x request.
    NotHttp,
    /// All the connections of the process's proxies are open, and this sandbox may take none
    /// from another (see [`set_max_connections_in_process`]).
    ProxiesFull,
}

/// What the client sent first, once seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    Tls,
    Http,
    Other,
}

macro_rules! codes {
    ($($t:ty { $($v:ident => $c:literal),* $(,)? })*) => {$(
        impl $t {
            /// The code as the report shows it.
            pub fn code(self) -> &'static str {
                match self { $(Self::$v => $c),* }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.code())
            }
        }
    )*};
}

codes! {
    Via {
        HttpConnect => "http-connect",
        HttpForward => "http-forward",
        Socks5 => "socks5",
        Transparent => "transparent",
        Dns => "dns",
    }
    Decision { Allowed => "allowed", Denied => "denied" }
    Reason {
        Allowed => "allowed",
        NotAllowed => "not-allowed",
        PortNotAllowed => "port-not-allowed",
        DeniedByRule => "denied-by-rule",
        IpLiteral => "ip-literal",
        SpecialAddress => "special-address",
        ResolveFailed => "resolve-failed",
        ConnectFailed => "connect-failed",
        TlsNoServerName => "tls-no-server-name",
        TlsNameMismatch => "tls-name-mismatch",
        HostHeaderMismatch => "host-header-mismatch",
        BadRequest => "bad-request",
        IncompleteRequest => "incomplete-request",
        Unsupported => "unsupported",
        UnknownAddress => "unknown-address",
        HttpRule => "http-rule",
        BodyTooLarge => "body-too-large",
        SecretElsewhere => "secret-elsewhere",
        UpstreamCertificate => "upstream-certificate",
        UpstreamTls => "upstream-tls",
        TlsHandshake => "tls-handshake",
        NotHttp => "not-http",
        ProxiesFull => "proxies-full",
    }
    Protocol { Tls => "tls", Http => "http", Other => "other" }
}

impl From<Refusal> for Reason {
    fn from(r: Refusal) -> Reason {
        match r {
            Refusal::NotAllowed => Reason::NotAllowed,
            Refusal::PortNotAllowed => Reason::PortNotAllowed,
            Refusal::DeniedByRule => Reason::DeniedByRule,
            Refusal::IpLiteral => Reason::IpLiteral,
            Refusal::SpecialAddress => Reason::SpecialAddress,
        }
    }
}

/// One decision, as the report lists it.
///
/// `host` and `detail` are safe to print as they are: whatever part of them the sandbox sent is
/// escaped ([`palisade_policy::untrusted`]) and cut, `host` at [`MAX_HOST_CHARS`] characters of
/// what was sent and `detail` at [`MAX_DETAIL_CHARS`]. [`Display`](fmt::Display) gives the line a front
/// end prints: `denied http-connect other.test:443 (not-allowed: other.test is not on the
/// allow-list)`.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub via: Via,
    /// The host as the client named it (normalized when it parsed as a host).
    pub host: String,
    pub port: u16,
    /// The upstream address connected to.
    pub address: Option<String>,
    pub decision: Decision,
    pub reason: Reason,
    pub detail: String,
    /// What the client sent first, once seen.
    pub protocol: Option<Protocol>,
    /// Bytes from the sandbox to the host, and back.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The proxy terminated the sandbox's TLS and read what went through it.
    #[serde(skip_serializing_if = "is_false")]
    pub inspected: bool,
    /// For one HTTP request the proxy read (plain HTTP, or inspected TLS): what it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<Box<Request>>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One HTTP request, as the report lists it. `method` and `path` are what the sandbox sent,
/// escaped and cut; the query is never shown (`?[redacted]`), nor any header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The response's status (or the proxy's own, for a refusal); none if there was none.
    pub status: Option<u16>,
    /// The HTTP rule that allowed it, if rules name the host.
    pub rule: Option<String>,
    /// The secrets the proxy put in, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}:{} ({}: {})",
            self.decision, self.via, self.host, self.port, self.reason, self.detail
        )
    }
}

/// The network part of the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetLog {
    pub events: Vec<Event>,
    pub allowed: u64,
    pub denied: u64,
    /// Events past [`MAX_EVENTS`] or [`MAX_EVENT_BYTES`], counted but not listed.
    pub dropped: u64,
    /// Connections closed at once because [`MAX_CONNECTIONS`] were open, or because all the
    /// process's were and this sandbox held its share of them.
    pub refused_connections: u64,
    /// Open connections cut to give another sandbox its share of the process's connections
    /// ([`set_max_connections_in_process`]), each the longest idle of this sandbox's.
    pub cut_connections: u64,
    /// Places this sandbox's connections took from other sandboxes (each cut one of theirs).
    pub took_connections: u64,
    /// Upstream connections that waited for their turn ([`MAX_CONNECTS_PER_S`]).
    pub paced_connections: u64,
    /// Events the notify callback was not called for: past [`MAX_NOTIFY`], or not kept.
    pub notify_suppressed: u64,
    /// CPU time the proxy's threads spent (user and system), in milliseconds.
    pub supervisor_cpu_ms: u64,
    /// Names the DNS stub refused, each with how many queries asked for it, in the order first
    /// asked (at most [`MAX_LOOKUPS`]).
    pub lookups: Vec<Lookup>,
    /// Queries for refused names past [`MAX_LOOKUPS`].
    pub lookups_dropped: u64,
}

/// A name the DNS stub refused, and how often it was asked for. `name` is what the sandbox sent,
/// escaped and cut like an event's `host`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lookup {
    pub name: String,
    pub count: u64,
}

/// Most connections open at once per [`Egress`] (each holds one supervisor thread).
pub const MAX_CONNECTIONS: usize = 128;

/// Most connections open at once through all the proxies of one process (a server's runs and
/// sessions together), unless [`set_max_connections_in_process`] says otherwise: each holds a
/// supervisor thread, up to seven descriptors and its relay's buffers, which no sandbox's cgroup
/// is charged for, so that 64 sessions at [`MAX_CONNECTIONS`] each would hold 8,192 threads.
pub const MAX_CONNECTIONS_IN_PROCESS: usize = 1024;

/// The places of all the proxies of this process.
static PROCESS: share::Share = share::Share::new(MAX_CONNECTIONS_IN_PROCESS);

/// Sets the most connections open at once through all the proxies of this process (at least
/// 1). When they are all open, a sandbox that holds fewer than another takes a place from the
/// sandbox that holds the most, whose longest-idle connection is cut (counted in its
/// [`NetLog::cut_connections`]), so that each of `n` sandboxes can hold at least `n`th of them
/// however long the others keep theirs open; a connection past that is closed at once, as one
/// past [`MAX_CONNECTIONS`], and counted in [`NetLog::refused_connections`].
pub fn set_max_connections_in_process(n: usize) {
    PROCESS.set_cap(n);
}

/// Each [`Egress`]'s number among the process's.
static PROXY_IDS: AtomicU64 = AtomicU64::new(1);

/// The threads of every [`Egress`]'s DNS stub, and of its other listeners, kept for the next
/// sandbox's (see `palisade_linux::pool`).
static DNS_THREADS: Pool = Pool::new(c"palisade-dns");
static PROXY_THREADS: Pool = Pool::new(c"palisade-proxy");
/// At most this many events are kept per run, so a payload cannot grow the supervisor's memory.
pub const MAX_EVENTS: usize = 10_000;
/// At most this many bytes of events are kept per run (strings and bookkeeping).
pub const MAX_EVENT_BYTES: usize = 4 << 20;
/// Most characters of what the client sent that an event's `host` shows (escaped; longer ones
/// are cut and say how many bytes were left out).
pub const MAX_HOST_CHARS: usize = 260;
/// Most characters of an event's `host`, escapes included: [`MAX_HOST_CHARS`] characters of what
/// the client sent, each shown as at most a four-character escape, and the note of what was cut.
const HOST_SHOWN: usize = 4 * MAX_HOST_CHARS + 32;
/// Most characters of an event's `detail`, escapes included.
pub const MAX_DETAIL_CHARS: usize = 512;
/// The notify callback is called for at most this many allowed events, and as many denied ones.
pub const MAX_NOTIFY: u64 = 100;
/// How long a client has, in all, for its first bytes (request head, SOCKS handshake,
/// ClientHello). A client that sends nothing in that time is taken for a server-first protocol.
pub const FIRST_BYTES: Duration = Duration::from_secs(10);
/// How long the proxy waits for an upstream connection, for all of the name's addresses together
/// (each tries with its share of what is left).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most upstream connections (each with its name lookup) one proxy opens a second, sustained;
/// up to as many more at once after a quiet second. One past it waits for its turn (the client
/// waits with it, its connection slot held), so that code inside cannot have the host open
/// connections or send lookups toward allowed destinations as fast as it can make them (128 at
/// once to a host 1 ms away would be ~100,000 a second).
pub const MAX_CONNECTS_PER_S: u32 = 256;
/// Most bytes of a request head or ClientHello the proxy reads before deciding.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most refused names the DNS stub counts queries for ([`NetLog::lookups`]).
pub const MAX_LOOKUPS: usize = 1024;
/// Most names the DNS stub hands addresses out for (and refused names it logs once).
pub const MAX_NAMES: usize = 16_384;
/// How long a `--dns-server` lookup may take, both record types and one retry included.
const DNS_TIMEOUT: Duration = Duration::from_secs(5);

/// Called with each event the log keeps, as it happens (e.g. to print denials), at most
/// [`MAX_NOTIFY`] times per decision.
pub type Notify = Box<dyn Fn(&Event) + Send + Sync>;

/// The bounds one proxy works within (the constants above; smaller in unit tests).
#[derive(Debug, Clone, Copy)]
struct Limits {
    connections: usize,
    first_bytes: Duration,
    /// For an upstream connection, all of a name's addresses together.
    connect: Duration,
    /// Upstream connections a second, sustained (and the burst).
    connects_per_s: u32,
    events: usize,
    event_bytes: usize,
    notify: u64,
    /// The places this proxy's connections take ([`PROCESS`], or a unit test's own).
    share: &'static share::Share,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: MAX_CONNECTIONS,
            first_bytes: FIRST_BYTES,
            connect: CONNECT_TIMEOUT,
            connects_per_s: MAX_CONNECTS_PER_S,
            events: MAX_EVENTS,
            event_bytes: MAX_EVENT_BYTES,
            notify: MAX_NOTIFY,
            share: &PROCESS,
        }
    }
}

struct Entry {
    event: Event,
    out: Arc<AtomicU64>,
    inn: Arc<AtomicU64>,
}

/// What the proxy decided so far.
#[derive(Default)]
struct Log {
    entries: Vec<Entry>,
    /// What `entries` cost, as [`Log::cost`] counts it.
    bytes: usize,
    allowed: u64,
    denied: u64,
    dropped: u64,
    notified_allowed: u64,
    notified_denied: u64,
    notify_suppressed: u64,
}

impl Log {
    /// What keeping `e` costs: its strings and the bookkeeping around them.
    fn cost(e: &Event) -> usize {
        std::mem::size_of::<Entry>()
            + 2 * 32
            + e.host.len()
            + e.detail.len()
            + e.address.as_ref().map_or(0, String::len)
            + e.request.as_ref().map_or(0, |r| {
                std::mem::size_of::<Request>()
                    + r.method.len()
                    + r.path.len()
                    + r.rule.as_ref().map_or(0, String::len)
                    + r.secrets.iter().map(|s| s.len() + 24).sum::<usize>()
            })
    }
}

/// What TLS inspection needs for one run: the CA, and how upstream servers are verified.
struct Inspection {
    ca: ca::Ca,
    upstream: Arc<rustls::ClientConfig>,
}

/// What a run's proxy is made with before the sandbox exists: the CA whose certificate the
/// sandbox trusts, and the placeholders its environment holds ([`Prepared::new`]).
pub struct Prepared {
    inspection: Option<Inspection>,
    secrets: secrets::Secrets,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("inspection", &self.inspection.is_some())
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Makes what `net` needs: a new CA in this process's memory when any host may be
    /// inspected, the upstream trust (`net.upstream_ca`, or the host's bundle), and a random
    /// placeholder for each secret whose value `net` holds. Nothing is written anywhere.
    pub fn new(net: &Network) -> Result<Prepared, CaError> {
        let inspection = if net.inspects_any() {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let roots = match &net.upstream_ca {
                Some(p) => ca::roots_from(p)?,
                None => ca::host_roots()?,
            };
            let upstream = tls::client_config(provider.clone(), roots)
                .map_err(|e| CaError::Generate(e.to_string()))?;
            Some(Inspection {
                ca: ca::Ca::new(provider)?,
                upstream,
            })
        } else {
            None
        };
        Ok(Prepared {
            inspection,
            secrets: secrets::Secrets::new(&net.secrets)?,
        })
    }

    /// The run's CA certificate (PEM), for the sandbox to trust; `None` without inspection.
    pub fn ca_pem(&self) -> Option<&str> {
        self.inspection.as_ref().map(|i| i.ca.cert_pem())
    }

    /// `(variable, placeholder)` for each secret: what the sandbox's environment holds.
    pub fn placeholders(&self) -> Vec<(String, String)> {
        self.secrets.placeholders()
    }
}

struct Shared {
    net: Network,
    inspection: Option<Inspection>,
    secrets: secrets::Secrets,
    limits: Limits,
    names: Mutex<Names>,
    log: Mutex<Log>,
    /// Signalled once, by [`Egress::stop`]; every wait in the proxy also waits for it.
    stop: OwnedFd,
    /// This proxy's number among the process's ([`share`]).
    id: u64,
    /// Connections open now, refused for being past a cap, and cut to make room for another
    /// proxy's ([`share`]).
    open: AtomicUsize,
    refused: AtomicU64,
    cut: AtomicU64,
    /// Places taken from other proxies, and the turns to take more ([`share::Cuts`]).
    took: AtomicU64,
    cuts: Mutex<share::Cuts>,
    /// The pace of upstream connections ([`MAX_CONNECTS_PER_S`]), and how many waited for it.
    pace: Mutex<Pace>,
    paced: AtomicU64,
    /// CPU time of the proxy's threads, in nanoseconds.
    cpu_ns: AtomicU64,
    notify: Option<Notify>,
}

/// A token bucket for upstream connections: `rate` a second, as many at once at most. A taker
/// when none is left takes one ahead (the count goes below zero) and waits until it would have
/// come, so that waiting takers go in turn; with at most [`MAX_CONNECTIONS`] takers at once, the
/// longest wait is [`MAX_CONNECTIONS`] / `rate`.
struct Pace {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Pace {
    fn new(rate: u32) -> Pace {
        let rate = f64::from(rate.max(1));
        Pace {
            rate,
            tokens: rate,
            at: Instant::now(),
        }
    }

    /// Takes a turn at `now`: how long to wait for it (zero if it is now).
    fn take(&mut self, now: Instant) -> Duration {
        let since = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now.max(self.at);
        self.tokens = (self.tokens + since * self.rate).min(self.rate) - 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[derive(Default)]
struct Names {
    by_name: HashMap<Arc<str>, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, Arc<str>>,
    /// Names refused once, by a keyed hash: logged the first time only (resolvers ask for A and
    /// AAAA, and retry). A hash, not the name, so that the set costs 8 bytes a name; the value
    /// is the name's place in `lookups`, if it has one.
    refused: HashMap<u64, Option<usize>>,
    /// Refused names with how often each was asked for, the first [`MAX_LOOKUPS`].
    lookups: Vec<Lookup>,
    /// Queries for refused names past [`MAX_LOOKUPS`].
    lookups_dropped: u64,
    keys: std::collections::hash_map::RandomState,
}

/// A running proxy for one sandbox; [`Egress::finish`] stops it and returns the log. Dropping it
/// without `finish` stops it too: its threads are joined and its listeners closed (they keep the
/// sandbox's network namespace alive).
///
/// ```
/// use palisade_net::{Decision, Egress, Role};
/// use palisade_policy::net::{NetRule, Network};
/// use std::io::{Read, Write};
///
/// // palisade binds its listeners inside the sandbox's network namespace; any will do here.
/// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let addr = listener.local_addr()?;
/// let allow = vec![NetRule::parse("--allow-net", "example.org")?];
/// let net = Network { allow, ..Network::default() };
/// let egress = Egress::start(net, vec![(Role::HttpProxy, listener.into())], None)?;
///
/// let mut client = std::net::TcpStream::connect(addr)?;
/// client.write_all(b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")?;
/// let mut answer = String::new();
/// client.read_to_string(&mut answer)?;
/// assert!(answer.starts_with("HTTP/1.1 403 Forbidden"));
///
/// let log = egress.finish();
/// assert_eq!(log.events[0].decision, Decision::Denied);
/// assert_eq!(
///     log.events[0].to_string(),
///     "denied http-connect other.test:443 (not-allowed: other.test is not on the allow-list)"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Egress {
    shared: Arc<Shared>,
    threads: Vec<palisade_linux::pool::Handle>,
}

impl Egress {
    /// Starts serving `sockets` (bound inside the sandbox's network namespace) for `net`,
    /// preparing what inspection and secrets need ([`Prepared::new`]) itself: for a caller that
    /// gives the sandbox no CA and no placeholders, which then cannot use either.
    pub fn start(
        net: Network,
        sockets: Vec<(Role, OwnedFd)>,
        notify: Option<Notify>,
    ) -> io::Result<Egress> {
        let prepared = Prepared::new(&net).map_err(io::Error::other)?;
        Egress::start_with(net, sockets, notify, Limits::default(), prepared)
    }

    /// Starts serving `sockets` for `net` with what [`Prepared::new`] made for it, whose CA
    /// certificate and placeholders the sandbox was given.
    pub fn start_prepared(
        net: Network,
        sockets: Vec<(Role, OwnedFd)>,
        notify: Option<Notify>,
        prepared: Prepared,
    ) -> io::Result<Egress> {
        Egress::start_with(net, sockets, notify, Limits::default(), prepared)
    }

    fn start_with(
        net: Network,
        sockets: Vec<(Role, OwnedFd)>,
        notify: Option<Notify>,
        limits: Limits,
        prepared: Prepared,
    ) -> io::Result<Egress> {
        use rustix::event::{eventfd, EventfdFlags};
        let limits_rate = limits.connects_per_s;
        let shared = Arc::new(Shared {
            net,
            inspection: prepared.inspection,
            secrets: prepared.secrets,
            limits,
            names: Mutex::new(Names::default()),
            log: Mutex::new(Log::default()),
            stop: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            id: PROXY_IDS.fetch_add(1, Ordering::Relaxed),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            cut: AtomicU64::new(0),
            took: AtomicU64::new(0),
            cuts: Mutex::new(share::Cuts::new()),
            pace: Mutex::new(Pace::new(limits_rate)),
            paced: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            notify,
        });
        let mut egress = Egress {
            shared,
            threads: Vec::new(),
        };
        for (role, fd) in sockets {
            let sh = egress.shared.clone();
            let t = if role == Role::Dns {
                let sock = UdpSocket::from(fd);
                sock.set_nonblocking(true)?;
                DNS_THREADS.spawn(move || serve::dns_loop(&sh, &sock))?
            } else {
                let l = TcpListener::from(fd);
                l.set_nonblocking(true)?;
                PROXY_THREADS.spawn(move || serve::accept_loop(&sh, &l, role))?
            };
            // On an error above, dropping `egress` stops the threads started so far.
            egress.threads.push(t);
        }
        Ok(egress)
    }

    /// CPU time the proxy's threads have spent so far (user and system): accepting, deciding,
    /// resolving, relaying. Threads add to it as they go (a relay at least every time it wakes),
    /// so a caller can watch it during the run.
    pub fn cpu_used(&self) -> Duration {
        Duration::from_nanos(self.shared.cpu_ns.load(Ordering::Relaxed))
    }

    /// Stops accepting, cuts every open connection, joins every thread, and returns the
    /// decisions with their byte counts.
    pub fn finish(mut self) -> NetLog {
        self.stop();
        let sh = &self.shared;
        let mut log = std::mem::take(&mut *sh.log.lock().unwrap_or_else(|e| e.into_inner()));
        let (lookups, lookups_dropped) = {
            let mut names = sh.names.lock().unwrap_or_else(|e| e.into_inner());
            (std::mem::take(&mut names.lookups), names.lookups_dropped)
        };
        NetLog {
            events: std::mem::take(&mut log.entries)
                .into_iter()
                .map(|e| Event {
                    bytes_out: e.out.load(Ordering::Relaxed),
                    bytes_in: e.inn.load(Ordering::Relaxed),
                    ..e.event
                })
                .collect(),
            allowed: log.allowed,
            denied: log.denied,
            dropped: log.dropped,
            refused_connections: sh.refused.load(Ordering::Relaxed),
            cut_connections: sh.cut.load(Ordering::Relaxed),
            took_connections: sh.took.load(Ordering::Relaxed),
            paced_connections: sh.paced.load(Ordering::Relaxed),
            notify_suppressed: log.notify_suppressed,
            supervisor_cpu_ms: sh.cpu_ns.load(Ordering::Relaxed) / 1_000_000,
            lookups,
            lookups_dropped,
        }
    }

    /// Signals every thread to stop and joins them; the listeners close with their threads.
    fn stop(&mut self) {
        let _ = rustix::io::write(&self.shared.stop, &1u64.to_ne_bytes());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// Records an event, and passes it on to the notify callback within its bounds; returns the
    /// event's byte counters.
    fn record(&self, mut event: Event) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        // Hosts were escaped and cut when the event was made (`event`): this only guards.
        event.host = bounded(&event.host, HOST_SHOWN);
        event.detail = bounded(&event.detail, MAX_DETAIL_CHARS);
        // Counted from what the event holds already (a request's event comes in whole).
        let (out, inn) = (
            Arc::new(AtomicU64::new(event.bytes_out)),
            Arc::new(AtomicU64::new(event.bytes_in)),
        );
        let lim = &self.limits;
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let allowed = event.decision == Decision::Allowed;
        if allowed {
            log.allowed += 1;
        } else {
            log.denied += 1;
        }
        let cost = Log::cost(&event);
        let kept = log.entries.len() < lim.events && log.bytes + cost <= lim.event_bytes;
        let notified = if allowed {
            &mut log.notified_allowed
        } else {
            &mut log.notified_denied
        };
        let tell = self.notify.is_some() && kept && *notified < lim.notify;
        if tell {
            *notified += 1;
        } else if self.notify.is_some() {
            log.notify_suppressed += 1;
        }
        let told = tell.then(|| event.clone());
        if kept {
            log.bytes += cost;
            log.entries.push(Entry {
                event,
                out: out.clone(),
                inn: inn.clone(),
            });
        } else {
            log.dropped += 1;
        }
        drop(log);
        if let (Some(n), Some(e)) = (&self.notify, told) {
            n(&e);
        }
        (out, inn)
    }
}

/// `text` with every character a terminal could act on escaped (text already escaped by
/// [`Untrusted`] passes as it is), cut at `max` characters.
fn bounded(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 2));
    for (shown, (i, c)) in text.char_indices().enumerate() {
        if shown >= max {
            out.push_str(&format!("…({} bytes more)", text.len() - i));
            break;
        }
        if c.is_ascii() && !c.is_ascii_control() || c == '…' {
            out.push(c);
        } else {
            out.push_str(&Untrusted::new(c.encode_utf8(&mut [0; 4])).to_string());
        }
    }
    out
}

/// A new event, denied until decided; `host` is what the client sent, escaped and cut.
fn event(via: Via, host: &str, port: u16) -> Event {
    Event {
        via,
        host: Untrusted::new(host).max(MAX_HOST_CHARS).to_string(),
        port,
        address: None,
        decision: Decision::Denied,
        reason: Reason::NotAllowed,
        detail: String::new(),
        protocol: None,
        bytes_out: 0,
        bytes_in: 0,
        inspected: false,
        request: None,
    }
}

#[cfg(test)]
mod tests;
