//! Network egress rules: which hosts and ports a sandbox may reach through palisade's proxy, and the
//! decisions made from them.
//!
//! A rule is a host pattern with an optional port: an exact name (`pypi.org`), a wildcard for
//! subdomains only (`*.example.org`, not `example.org` itself), an IP address or a CIDR block
//! (`127.0.0.1`, `10.0.0.0/8`, `[2001:db8::/32]`). Names are normalized before they are stored or
//! compared: IDNA to ASCII, lower case, one trailing dot removed. Anything that the C library would
//! read as an IPv4 address (`3325256714`, `0xC6336402`, `0306.0063.0144.02`) is an IP literal, never
//! a name, so it cannot slip past the IP rules.
//!
//! Decisions: deny rules first (they win), then allow rules. An allow rule without a port means
//! ports 80 and 443; a deny rule without a port means every port. The addresses a name resolves to
//! must be globally reachable ([`is_global`]) unless an IP allow rule names them.

use crate::http::{HttpRule, Secret, MAX_HTTP_RULES, MAX_SECRETS};
use crate::PolicyError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// The ports an allow rule without a port opens.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Where the proxy listens on the sandbox's own loopback (127.0.0.1): HTTP (CONNECT and
/// absolute-form requests), SOCKS5, and the DNS stub (UDP).
pub const HTTP_PROXY_PORT: u16 = 3128;
pub const SOCKS_PORT: u16 = 1080;
pub const DNS_PORT: u16 = 53;

/// The stub hands out addresses from 127.77.0.0/16 for allowed names: loopback inside the
/// sandbox, where palisade's transparent listeners take the connections and map them back.
pub const TRANSPARENT_NET: [u8; 2] = [127, 77];

/// The system CA bundles a host may have, most common first: Debian, Ubuntu, Alpine, Arch and
/// Gentoo; Fedora, RHEL and CentOS; openSUSE; others. With TLS inspection the sandbox sees each
/// that exists with the run's CA appended, and the proxy verifies upstream servers against the
/// first that exists (unless `network.upstream_ca` names another).
pub const TRUST_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
    "/etc/ca-certificates/extracted/tls-ca-bundle.pem",
];

/// At most this many rules of each kind, and names pinned with `network.resolve`.
pub const MAX_RULES: usize = 256;
/// At most this many `network.local_ports` (each is a Landlock rule).
pub const MAX_LOCAL_PORTS: usize = 64;

/// A destination as a connection names it: a normalized host name or an IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lower-case ASCII (IDNA), no trailing dot, valid labels.
    Name(String),
    /// An IP literal, in any of the notations the C library accepts.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Ip(a) => write!(f, "{a}"),
        }
    }
}

impl Host {
    /// Parses a host as a client sends it (CONNECT, SOCKS, `Host:`, the TLS server name): IPv6 in
    /// brackets or bare, IPv4 in every `inet_aton` notation, or a name (normalized).
    ///
    /// ```
    /// use palisade_policy::net::Host;
    /// assert_eq!(Host::parse("Example.ORG.").unwrap(), Host::Name("example.org".into()));
    /// assert_eq!(Host::parse("3325256714").unwrap().to_string(), "198.51.100.10");
    /// assert!(Host::parse("exa mple.org").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Host, &'static str> {
        let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
        if let Some(v6) = bare {
            return v6
                .parse::<Ipv6Addr>()
                .map(|a| Host::Ip(IpAddr::V6(a)))
                .map_err(|_| "an IPv6 address inside the brackets");
        }
        if s.contains(':') {
            return s
                .parse::<Ipv6Addr>()
                .map(|a| Host::Ip(IpAddr::V6(a)))
                .map_err(|_| "a host name or an IP address");
        }
        let name = s.strip_suffix('.').unwrap_or(s);
        if name.is_empty() || name.len() > 253 {
            return Err("a host name of 1 to 253 characters");
        }
        let last = name.rsplit('.').next().unwrap_or(name);
        if looks_numeric(last) {
            return inet_aton(name)
                .map(|a| Host::Ip(IpAddr::V4(a)))
                .ok_or("a host name or an IP address (a name's last label cannot be a number)");
        }
        let ascii = idna::domain_to_ascii(name).map_err(|_| "a valid (IDNA) host name")?;
        // Normalization can make a number of a label (`₀` and `０` are `0`; `①②⑦.⓪.⓪.①` is
        // `127.0.0.1`). What ends in a number after it is an address, as URL parsers read it too,
        // never a name that a rule for names would match.
        let last = ascii.rsplit('.').next().unwrap_or(&ascii);
        if looks_numeric(last) {
            return inet_aton(&ascii)
                .map(|a| Host::Ip(IpAddr::V4(a)))
                .ok_or("a host name or an IP address (a name's last label cannot be a number)");
        }
        if ascii.is_empty()
            || ascii.len() > 253
            || !ascii.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
        {
            return Err("a host name: letters, digits, `-` in labels of at most 63 characters");
        }
        Ok(Host::Name(ascii))
    }
}

/// Whether a label is something `inet_aton` would take a number from: all digits, or `0x` hex.
fn looks_numeric(label: &str) -> bool {
    let l = label.to_ascii_lowercase();
    let hex = l.strip_prefix("0x");
    !l.is_empty()
        && match hex {
            Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
            None => l.bytes().all(|b| b.is_ascii_digit()),
        }
}

/// IPv4 as the C library's `inet_aton` reads it: one to four parts, each decimal, octal (leading
/// 0) or hex (0x); the last part fills the remaining bytes.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(4);
    for p in &parts {
        let lower = p.to_ascii_lowercase();
        let v = if let Some(h) = lower.strip_prefix("0x") {
            if h.is_empty() {
                0
            } else {
                u64::from_str_radix(h, 16).ok()?
            }
        } else if lower.len() > 1 && lower.starts_with('0') {
            u64::from_str_radix(&lower[1..], 8).ok()?
        } else {
            lower.parse::<u64>().ok()?
        };
        nums.push(v);
    }
    let (head, last) = nums.split_at(nums.len() - 1);
    if head.iter().any(|&v| v > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - head.len()) as u32;
    if last[0] >= 1u64 << rest_bits {
        return None;
    }
    let mut v: u32 = 0;
    for (i, &h) in head.iter().enumerate() {
        v |= (h as u32) << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(v | last[0] as u32))
}

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// One host name.
    Exact(String),
    /// Every name below this domain (`*.example.org`: `a.example.org`, not `example.org`).
    Subdomains(String),
    /// Addresses in a block; a single address is a /32 or /128.
    Net { addr: IpAddr, prefix: u8 },
}

/// One `network.allow` or `network.deny` rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NetRule {
    pub pattern: Pattern,
    /// None: ports 80 and 443 for an allow rule, every port for a deny rule.
    pub port: Option<u16>,
}

impl NetRule {
    /// Parses `PATTERN[:PORT]`; `field` names the option in errors.
    ///
    /// ```
    /// use palisade_policy::net::NetRule;
    /// assert!(NetRule::parse("network.allow", "*.example.org:8443").is_ok());
    /// assert!(NetRule::parse("network.allow", "*.com").is_err());
    /// assert!(NetRule::parse("network.allow", "*").is_err());
    /// assert!(NetRule::parse("network.allow", "example.org:+443").is_err());
    /// ```
    pub fn parse(field: &'static str, s: &str) -> Result<NetRule, PolicyError> {
        const EXPECTED: &str = "HOST, *.DOMAIN (subdomains only, not on a public suffix), an IP address, [IPv6] or a CIDR block (10.0.0.0/8, [2001:db8::/32]), each optionally followed by :PORT (1-65535)";
        let bad = |why: &'static str| PolicyError::Invalid {
            field,
            value: s.to_owned(),
            expected: why,
        };
        let (host, port) = split_port(s).ok_or_else(|| bad(EXPECTED))?;
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => return Err(bad("a port from 1 to 65535 after the `:`")),
            },
        };
        let pattern = if let Some(rest) = host.strip_prefix("*.") {
            let d = match Host::parse(rest) {
                Ok(Host::Name(d)) => d,
                _ => return Err(bad(EXPECTED)),
            };
            if psl::suffix_str(&d).is_none() || psl::suffix_str(&d) == Some(d.as_str()) {
                return Err(bad("a wildcard below a registrable domain (`*.example.org`); `*.com`, `*.co.uk` and other public suffixes would allow most of the internet"));
            }
            Pattern::Subdomains(d)
        } else if host.contains('*') {
            return Err(bad("a host without `*`, or `*.DOMAIN` for subdomains; a bare `*` would allow everything, so it is refused"));
        } else if let Some((a, len)) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split_once('/')
        {
            let addr: IpAddr = a.parse().map_err(|_| bad(EXPECTED))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = match len.parse() {
                Ok(n) if n >= 1 && n <= max => n,
                _ => return Err(bad("a CIDR prefix length from 1 to 32 (IPv4) or 128 (IPv6); /0 would allow every address")),
            };
            Pattern::Net {
                addr: mask(addr, prefix),
                prefix,
            }
        } else {
            match Host::parse(host).map_err(|_| bad(EXPECTED))? {
                Host::Name(n) => Pattern::Exact(n),
                Host::Ip(a) => Pattern::Net {
                    addr: a,
                    prefix: if a.is_ipv4() { 32 } else { 128 },
                },
            }
        };
        Ok(NetRule { pattern, port })
    }

    /// Whether the rule's pattern matches `host` (whatever the port).
    pub fn matches(&self, host: &Host) -> bool {
        match host {
            Host::Name(n) => self.matches_name(n),
            Host::Ip(a) => self.matches_addr(*a),
        }
    }

    /// Whether the rule's pattern matches `host` and its port (none: every port) is `port`: how
    /// `inspect`, `no_inspect` and HTTP rules name a destination.
    pub fn names(&self, host: &Host, port: u16) -> bool {
        self.matches(host) && self.port.is_none_or(|p| p == port)
    }

    fn matches_name(&self, name: &str) -> bool {
        match &self.pattern {
            Pattern::Exact(n) => n == name,
            Pattern::Subdomains(d) => name
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Pattern::Net { .. } => false,
        }
    }

    fn matches_addr(&self, a: IpAddr) -> bool {
        match self.pattern {
            Pattern::Net { addr, prefix } => {
                addr.is_ipv4() == a.is_ipv4() && mask(a, prefix) == addr
            }
            _ => false,
        }
    }

    pub(crate) fn allows_port(&self, port: u16) -> bool {
        self.port
            .map_or(DEFAULT_PORTS.contains(&port), |p| p == port)
    }

    fn denies_port(&self, port: u16) -> bool {
        self.port.is_none() || self.port == Some(port)
    }
}

/// Splits `HOST[:PORT]`, `[V6][:PORT]`, `[V6/LEN][:PORT]`; a bare IPv6 takes no port.
fn split_port(s: &str) -> Option<(&str, Option<&str>)> {
    if s.is_empty() {
        return None;
    }
    if s.starts_with('[') {
        let end = s.find(']')?;
        let (h, rest) = s.split_at(end + 1);
        return match rest {
            "" => Some((h, None)),
            r => Some((h, Some(r.strip_prefix(':')?))),
        };
    }
    match s.matches(':').count() {
        0 => Some((s, None)),
        1 => {
            let (h, p) = s.split_once(':')?;
            Some((h, Some(p)))
        }
        _ => Some((s, None)),
    }
}

pub(crate) fn mask(a: IpAddr, prefix: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix as u32)
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(v) & m))
        }
        IpAddr::V6(v) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix as u32)
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(v) & m))
        }
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Exact(n) => f.write_str(n)?,
            Pattern::Subdomains(d) => write!(f, "*.{d}")?,
            Pattern::Net {
                addr: IpAddr::V4(a),
                prefix: 32,
            } => write!(f, "{a}")?,
            Pattern::Net {
                addr: IpAddr::V6(a),
                prefix: 128,
            } => write!(f, "[{a}]")?,
            Pattern::Net {
                addr: IpAddr::V4(a),
                prefix,
            } => write!(f, "{a}/{prefix}")?,
            Pattern::Net {
                addr: IpAddr::V6(a),
                prefix,
            } => write!(f, "[{a}/{prefix}]")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for NetRule {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        NetRule::parse("network rule", &s)
    }
}

impl From<NetRule> for String {
    fn from(r: NetRule) -> String {
        r.to_string()
    }
}

/// A name the supervisor resolves to a fixed address (`network.resolve`, `HOST=IP`), for tests and special
/// setups; its address is still checked like any other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    pub host: String,
    pub addr: IpAddr,
}

impl Pin {
    /// Parses `HOST=IP`.
    pub fn parse(s: &str) -> Result<Pin, PolicyError> {
        let bad = || PolicyError::Invalid {
            field: "network.resolve",
            value: s.to_owned(),
            expected: "HOST=IP, e.g. example.org=198.51.100.10 or example.org=[2001:db8::10]",
        };
        let (h, a) = s.split_once('=').ok_or_else(bad)?;
        let host = match Host::parse(h) {
            Ok(Host::Name(n)) => n,
            _ => return Err(bad()),
        };
        let a = a.trim_start_matches('[').trim_end_matches(']');
        Ok(Pin {
            host,
            addr: a.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.host, self.addr)
    }
}

/// The DNS server the supervisor asks for the addresses of allowed names (`network.dns_server`,
/// `IP[:PORT]`, port 53 by default) instead of the system resolver: a test network's own server,
/// or a resolver the host's `/etc/resolv.conf` does not name. The answers are checked like any
/// other addresses; the server itself is reached by the supervisor, outside the sandbox.
pub fn parse_dns_server(s: &str) -> Result<std::net::SocketAddr, PolicyError> {
    let bad = || {
        PolicyError::Invalid {
        field: "network.dns_server",
        value: s.to_owned(),
        expected: "an IP address with an optional port (default 53), e.g. 198.51.100.53, 198.51.100.53:5353, 2001:db8::53 or [2001:db8::53]:5353",
    }
    };
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return if a.port() == 0 { Err(bad()) } else { Ok(a) };
    }
    let ip = match s.strip_prefix('[') {
        Some(rest) => rest.strip_suffix(']').ok_or_else(bad)?,
        None => s,
    };
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    if ip.is_unspecified() {
        return Err(bad());
    }
    Ok(std::net::SocketAddr::new(ip, 53))
}

/// The sandbox's network: nothing unless `allow` has rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub allow: Vec<NetRule>,
    #[serde(default)]
    pub deny: Vec<NetRule>,
    #[serde(default)]
    pub resolve: Vec<Pin>,
    /// The DNS server for the supervisor's own lookups (see [`parse_dns_server`]); `None`: the
    /// system resolver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_server: Option<std::net::SocketAddr>,
    /// TCP ports the payload may listen on and connect to inside its own network namespace
    /// (`network.local_ports`): a test server and its client, both inside. Landlock refuses every
    /// other TCP bind, and every other connect but the proxy's own ports (docs/layers/landlock.md).
    #[serde(default)]
    pub local_ports: Vec<u16>,
    /// Inspect the TLS of every allowed host (`network.inspect = true`); `inspect` is then empty.
    #[serde(default, skip_serializing_if = "is_false")]
    pub inspect_all: bool,
    /// Hosts whose TLS the proxy inspects (`network.inspect = [...]`): names or `*.DOMAIN`, with
    /// an optional port. Hosts that HTTP rules or secrets name are inspected as well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inspect: Vec<NetRule>,
    /// Hosts never inspected (certificate pinning, mutual TLS); not one that HTTP rules or
    /// secrets need.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_inspect: Vec<NetRule>,
    /// Which requests an allowed host gets ([`HttpRule`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpRule>,
    /// The largest request body the proxy forwards, in bytes, on the requests it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<u64>,
    /// Credentials the proxy adds to requests for the code ([`Secret`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Secret>,
    /// A CA file (PEM, a host path) that inspected hosts' certificates are verified against
    /// instead of the host's trust store: a test network's CA, or a company's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_ca: Option<PathBuf>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Whether some destination matches both name patterns (addresses and blocks never overlap
/// names); `None` is every host.
pub(crate) fn overlaps(a: Option<&NetRule>, b: Option<&NetRule>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    if a.port.is_some() && b.port.is_some() && a.port != b.port {
        return false;
    }
    let below = |n: &str, d: &str| {
        n.strip_suffix(d)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    };
    match (&a.pattern, &b.pattern) {
        (Pattern::Exact(x), Pattern::Exact(y)) => x == y,
        (Pattern::Exact(x), Pattern::Subdomains(d))
        | (Pattern::Subdomains(d), Pattern::Exact(x)) => below(x, d),
        (Pattern::Subdomains(x), Pattern::Subdomains(y)) => x == y || below(x, y) || below(y, x),
        (
            Pattern::Net {
                addr: a1,
                prefix: p1,
            },
            Pattern::Net {
                addr: a2,
                prefix: p2,
            },
        ) => {
            let p = (*p1).min(*p2);
            a1.is_ipv4() == a2.is_ipv4() && mask(*a1, p) == mask(*a2, p)
        }
        _ => false,
    }
}

/// Why a connection was refused; `code()` is the stable name the report uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotAllowed,
    PortNotAllowed,
    DeniedByRule,
    IpLiteral,
    SpecialAddress,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not-allowed",
            Refusal::PortNotAllowed => "port-not-allowed",
            Refusal::DeniedByRule => "denied-by-rule",
            Refusal::IpLiteral => "ip-literal",
            Refusal::SpecialAddress => "special-address",
        }
    }
}

impl Network {
    /// Whether egress is on at all.
    pub fn enabled(&self) -> bool {
        !self.allow.is_empty()
    }

    /// The TCP ports the egress proxy listens on inside the sandbox (HTTP proxy, SOCKS, and one
    /// transparent listener per allowed port), sorted; none without allow rules. The DNS stub is
    /// UDP and not among them.
    pub fn proxy_ports(&self) -> Vec<u16> {
        if !self.enabled() {
            return Vec::new();
        }
        let mut v = self.ports();
        v.extend([HTTP_PROXY_PORT, SOCKS_PORT]);
        v.retain(|&p| p != DNS_PORT);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every port some allow rule opens, sorted.
    pub fn ports(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self
            .allow
            .iter()
            .flat_map(|r| match r.port {
                Some(p) => vec![p],
                None => DEFAULT_PORTS.to_vec(),
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Checks a destination as the client named it. Ok holds the allow rule that matched.
    pub fn decide(&self, host: &Host, port: u16) -> Result<&NetRule, (Refusal, String)> {
        let deny = self.deny.iter().find(|r| {
            r.denies_port(port)
                && match host {
                    Host::Name(n) => r.matches_name(n),
                    Host::Ip(a) => r.matches_addr(*a),
                }
        });
        if let Some(r) = deny {
            return Err((
                Refusal::DeniedByRule,
                format!("{host}:{port} is denied by `{r}`"),
            ));
        }
        let mut matched_host = false;
        for r in &self.allow {
            let m = match host {
                Host::Name(n) => r.matches_name(n),
                Host::Ip(a) => r.matches_addr(*a),
            };
            if m {
                matched_host = true;
                if r.allows_port(port) {
                    return Ok(r);
                }
            }
        }
        Err(match (matched_host, host) {
            (true, _) => (
                Refusal::PortNotAllowed,
                format!("{host} is allowed, but not on port {port}"),
            ),
            (false, Host::Ip(_)) => (
                Refusal::IpLiteral,
                format!(
                    "{host} is an IP address and no IP rule allows it; allow-list the host name"
                ),
            ),
            (false, Host::Name(_)) => (
                Refusal::NotAllowed,
                format!("{host} is not on the allow-list"),
            ),
        })
    }

    /// Checks one address that an allowed name resolved to: deny rules for it, then it must be
    /// globally reachable or named by an IP allow rule for this port.
    pub fn address_ok(&self, a: IpAddr, port: u16) -> Result<(), (Refusal, String)> {
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.denies_port(port) && r.matches_addr(a))
        {
            return Err((Refusal::DeniedByRule, format!("{a} is denied by `{r}`")));
        }
        if is_global(a)
            || self
                .allow
                .iter()
                .any(|r| r.matches_addr(a) && r.allows_port(port))
        {
            return Ok(());
        }
        Err((
            Refusal::SpecialAddress,
            format!("{a} is not a globally reachable address (loopback, private, link-local, documentation, …); an IP rule must allow it"),
        ))
    }

    /// Whether any host may be inspected: egress is on and inspection, HTTP rules or secrets are
    /// given (a run then needs its own CA, trusted inside).
    pub fn inspects_any(&self) -> bool {
        self.enabled()
            && (self.inspect_all
                || !self.inspect.is_empty()
                || !self.http.is_empty()
                || !self.secrets.is_empty())
    }

    /// Whether the proxy inspects TLS to `host` on `port`: every host with `inspect_all`, the
    /// hosts `inspect` names, and those that HTTP rules or secrets name, unless `no_inspect`
    /// exempts it.
    ///
    /// ```
    /// use palisade_policy::http::HttpRule;
    /// use palisade_policy::net::{Host, NetRule, Network};
    /// let mut n = Network::default();
    /// n.allow.push(NetRule::parse("t", "*.example.org").unwrap());
    /// n.http.push(HttpRule::parse("t", "read-only api.example.org").unwrap());
    /// let h = |s: &str| Host::parse(s).unwrap();
    /// assert!(n.inspects(&h("api.example.org"), 443));
    /// assert!(!n.inspects(&h("www.example.org"), 443));
    /// ```
    pub fn inspects(&self, host: &Host, port: u16) -> bool {
        if self.no_inspect.iter().any(|r| r.names(host, port)) {
            return false;
        }
        self.inspect_all
            || self.inspect.iter().any(|r| r.names(host, port))
            || self.http.iter().any(|r| r.names(host, port))
            || self
                .secrets
                .iter()
                .any(|s| matches!(host, Host::Name(n) if s.for_host(n, port)))
    }

    /// Checks one request against the HTTP rules: `Ok(None)` when no rule names the host (any
    /// request goes), `Ok(Some(rule))` with the rule that allows it, or why it is refused. `path`
    /// is the request's path without its query, as sent.
    pub fn http_decide(
        &self,
        host: &Host,
        port: u16,
        method: &str,
        path: &str,
    ) -> Result<Option<&HttpRule>, String> {
        let mut about = self.http.iter().filter(|r| r.names(host, port)).peekable();
        if about.peek().is_none() {
            return Ok(None);
        }
        if let Some(why) = crate::http::ambiguous_path(path) {
            return Err(format!(
                "{why}: servers differ on what it names, so HTTP rules cannot be checked against it"
            ));
        }
        let mut named = Vec::new();
        for r in about {
            if r.allows(method, path) {
                return Ok(Some(r));
            }
            if named.len() < 4 {
                named.push(format!("`{r}`"));
            }
        }
        Err(format!(
            "no HTTP rule for {host}:{port} allows this request (rules: {})",
            named.join(", ")
        ))
    }

    /// The pinned address of a name, if any.
    pub fn pinned(&self, name: &str) -> Vec<IpAddr> {
        self.resolve
            .iter()
            .filter(|p| p.host == name)
            .map(|p| p.addr)
            .collect()
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        for (field, n) in [
            ("network.allow", self.allow.len()),
            ("network.deny", self.deny.len()),
            ("network.resolve", self.resolve.len()),
        ] {
            if n > MAX_RULES {
                return Err(PolicyError::Invalid {
                    field,
                    value: n.to_string(),
                    expected: "at most 256 entries",
                });
            }
        }
        if self.local_ports.len() > MAX_LOCAL_PORTS {
            return Err(PolicyError::Invalid {
                field: "network.local_ports",
                value: self.local_ports.len().to_string(),
                expected: "at most 64 ports",
            });
        }
        let taken = self.proxy_ports();
        for &p in &self.local_ports {
            if p == 0 || taken.contains(&p) {
                return Err(PolicyError::Invalid {
                    field: "network.local_ports",
                    value: p.to_string(),
                    expected: if p == 0 {
                        "a TCP port from 1 to 65535"
                    } else {
                        "a port the egress proxy does not listen on inside (it takes 3128, 1080, 53 and each port that network.allow rules open)"
                    },
                });
            }
        }
        self.validate_beyond_names()?;
        if self.allow.is_empty()
            && !(self.deny.is_empty() && self.resolve.is_empty() && self.dns_server.is_none())
        {
            return Err(PolicyError::Invalid {
                field: "network.deny/network.resolve/network.dns_server",
                value: "(given)".into(),
                expected:
                    "network.allow rules as well: without one the sandbox has no network at all",
            });
        }
        Ok(())
    }
}

impl Network {
    /// The checks of inspection, HTTP rules, the body cap and secrets.
    fn validate_beyond_names(&self) -> Result<(), PolicyError> {
        let invalid = |field: &'static str, value: String, expected: &'static str| {
            Err(PolicyError::Invalid {
                field,
                value,
                expected,
            })
        };
        for (field, n, max) in [
            ("network.inspect", self.inspect.len(), MAX_HTTP_RULES),
            ("network.no_inspect", self.no_inspect.len(), MAX_HTTP_RULES),
            ("network.http", self.http.len(), MAX_HTTP_RULES),
            ("network.secrets", self.secrets.len(), MAX_SECRETS),
        ] {
            if n > max {
                return invalid(
                    field,
                    n.to_string(),
                    "at most 256 entries (64 for network.secrets)",
                );
            }
        }
        let used = [
            (
                "network.inspect",
                self.inspect_all || !self.inspect.is_empty(),
            ),
            ("network.no_inspect", !self.no_inspect.is_empty()),
            ("network.http", !self.http.is_empty()),
            ("network.max_body", self.max_body.is_some()),
            ("network.secrets", !self.secrets.is_empty()),
            ("network.upstream_ca", self.upstream_ca.is_some()),
        ];
        if let (false, Some((field, _))) = (self.enabled(), used.iter().find(|(_, u)| *u)) {
            return invalid(
                field,
                "(given)".into(),
                "network.allow rules as well: without one the sandbox has no network at all",
            );
        }
        for (field, list) in [
            ("network.inspect", &self.inspect),
            ("network.no_inspect", &self.no_inspect),
        ] {
            for r in list {
                crate::http::parse_inspect(field, &r.to_string())?;
            }
        }
        if self.inspect_all && !self.inspect.is_empty() {
            return invalid(
                "network.inspect",
                "true and a list".into(),
                "either true (every host) or a list of hosts",
            );
        }
        for r in &self.http {
            if let Some(x) = self
                .no_inspect
                .iter()
                .find(|x| overlaps(Some(x), r.host.as_ref()))
            {
                return invalid(
                    "network.no_inspect",
                    x.to_string(),
                    "a host no network.http rule names: a host with rules is inspected, or its requests over TLS could not be checked",
                );
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for s in &self.secrets {
            if names.contains(&s.name.as_str()) {
                return invalid(
                    "network.secrets",
                    s.to_string(),
                    "each variable named once: one secret for one host",
                );
            }
            names.push(s.name.as_str());
            let h = Host::Name(s.host.clone());
            if self.decide(&h, s.port).is_err() {
                return invalid(
                    "network.secrets",
                    s.to_string(),
                    "a host (and port, 443 by default) that network.allow lets through",
                );
            }
            if self.no_inspect.iter().any(|x| x.names(&h, s.port)) {
                return invalid(
                    "network.secrets",
                    s.to_string(),
                    "a host network.no_inspect does not exempt: the value is added inside inspected TLS",
                );
            }
        }
        if let Some(p) = &self.upstream_ca {
            if !p.is_absolute() {
                return invalid(
                    "network.upstream_ca",
                    p.display().to_string(),
                    "an absolute path of a PEM file on the host",
                );
            }
        }
        Ok(())
    }
}

/// Whether an address is globally reachable: not loopback, private, shared (CGNAT), link-local,
/// documentation, benchmarking, multicast, reserved, unspecified or broadcast; IPv6 also not
/// unique-local, discard, and not a form that embeds IPv4 (mapped, compatible, NAT64, 6to4,
/// Teredo), whose IPv4 part would need the same check. Follows the IANA special-purpose registries.
pub fn is_global(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => v4_global(v),
        IpAddr::V6(v) => {
            let s = v.segments();
            let x = u128::from(v);
            let in_net = |net: u128, len: u32| (x >> (128 - len)) == (net >> (128 - len));
            !(v.is_unspecified()
                || v.is_loopback()
                || in_net(0, 96) // IPv4-compatible (deprecated) and ::
                || in_net(0xffff << 32, 96) // IPv4-mapped
                || in_net(0x64_ff9b << 96, 96) // NAT64, well known
                || in_net(0x64_ff9b_0001 << 80, 48) // NAT64, local use
                || in_net(0x0100 << 112, 64) // discard
                || in_net(0x2001 << 112, 23) // IETF protocol assignments, Teredo
                || in_net(0x2001_0db8 << 96, 32) // documentation
                || in_net(0x3fff << 112, 20) // documentation (RFC 9637)
                || in_net(0x2002 << 112, 16) // 6to4
                || in_net(0x5f00 << 112, 16) // segment routing
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] & 0xff00) == 0xff00) // multicast
        }
    }
}

fn v4_global(v: Ipv4Addr) -> bool {
    let o = v.octets();
    let x = u32::from(v);
    let in_net =
        |net: [u8; 4], len: u32| (x >> (32 - len)) == (u32::from_be_bytes(net) >> (32 - len));
    !(in_net([0, 0, 0, 0], 8)
        || in_net([10, 0, 0, 0], 8)
        || in_net([100, 64, 0, 0], 10)
        || in_net([127, 0, 0, 0], 8)
        || in_net([169, 254, 0, 0], 16)
        || in_net([172, 16, 0, 0], 12)
        || in_net([192, 0, 0, 0], 24)
        || in_net([192, 0, 2, 0], 24)
        || in_net([192, 88, 99, 0], 24)
        || in_net([192, 168, 0, 0], 16)
        || in_net([198, 18, 0, 0], 15)
        || in_net([198, 51, 100, 0], 24)
        || in_net([203, 0, 113, 0], 24)
        || o[0] >= 224)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dns_servers_are_an_address_with_an_optional_port() {
        for (given, want) in [
            ("198.51.100.53", "198.51.100.53:53"),
            ("198.51.100.53:5353", "198.51.100.53:5353"),
            ("2001:db8::53", "[2001:db8::53]:53"),
            ("[2001:db8::53]", "[2001:db8::53]:53"),
            ("[2001:db8::53]:5353", "[2001:db8::53]:5353"),
            ("127.0.0.53", "127.0.0.53:53"),
        ] {
            assert_eq!(
                parse_dns_server(given).unwrap().to_string(),
                want,
                "{given}"
            );
        }
        for bad in [
            "",
            "dns.example",
            "198.51.100.53:0",
            "198.51.100.53:99999",
            "0.0.0.0",
            "::",
            "1.2.3",
            "[::1",
        ] {
            let e = parse_dns_server(bad).unwrap_err().to_string();
            assert!(
                e.contains("network.dns_server") && e.contains("default 53"),
                "{bad}: {e}"
            );
        }
    }

    use super::*;

    fn rule(s: &str) -> NetRule {
        NetRule::parse("network.allow", s).unwrap()
    }

    fn net(allow: &[&str], deny: &[&str]) -> Network {
        Network {
            allow: allow.iter().map(|s| rule(s)).collect(),
            deny: deny.iter().map(|s| rule(s)).collect(),
            resolve: Vec::new(),
            dns_server: None,
            local_ports: Vec::new(),
            ..Network::default()
        }
    }

    fn name(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn names_are_normalized() {
        assert_eq!(name("EXAMPLE.org."), Host::Name("example.org".into()));
        assert_eq!(
            name("bücher.example"),
            Host::Name("xn--bcher-kva.example".into())
        );
        for bad in [
            "",
            ".",
            "exa mple.org",
            "a..b",
            "-a.org",
            "a-.org",
            "a/b",
            "x\0y",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_ipv4_notation_is_an_ip_literal() {
        for s in [
            "198.51.100.10",
            "3325256714",
            "0xC633640A",
            "0xc6.0x33.0x64.0x0a",
            "0306.0063.0144.012",
            "198.51.25610",
            "198.3367946",
        ] {
            assert_eq!(
                Host::parse(s).unwrap(),
                Host::Ip("198.51.100.10".parse().unwrap()),
                "{s}"
            );
        }
        assert!(Host::parse("1.2.3.256").is_err());
        assert!(Host::parse("example.123").is_err());
        // What normalization turns into a number is an address too, never a name: full-width
        // and circled digits, subscripts, a full-width dot.
        for (s, ip) in [
            ("₀", "0.0.0.0"),
            ("１２７．０．０．１", "127.0.0.1"),
            ("①②⑦.⓪.⓪.①", "127.0.0.1"),
            ("198.51.100.１０", "198.51.100.10"),
            ("０ｘＣ６３３６４０Ａ", "198.51.100.10"),
        ] {
            assert_eq!(Host::parse(s), Ok(Host::Ip(ip.parse().unwrap())), "{s}");
            let r = rule(s);
            assert_eq!(r.to_string(), ip, "{s}");
            assert_eq!(rule(&r.to_string()), r, "{s}");
        }
        assert!(Host::parse("example.１２３").is_err());
        assert!(Host::parse("１.２.３.２５６").is_err());
        assert_eq!(
            name("[2001:db8::1]"),
            Host::Ip("2001:db8::1".parse().unwrap())
        );
        assert_eq!(name("::1"), Host::Ip("::1".parse().unwrap()));
    }

    #[test]
    fn rules_parse_and_print() {
        for (s, shown) in [
            ("Example.ORG", "example.org"),
            ("*.example.org:8443", "*.example.org:8443"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("[2001:db8::/32]:443", "[2001:db8::/32]:443"),
            ("[::1]:3000", "[::1]:3000"),
            ("2001:db8::1", "[2001:db8::1]"),
        ] {
            assert_eq!(rule(s).to_string(), shown);
        }
        for bad in [
            "*",
            "*.com",
            "*.co.uk",
            "*.github.io",
            "a.*.org",
            "*example.org",
            "example.org:0",
            "example.org:99999",
            "example.org:x",
            "10.0.0.0/0",
            "10.0.0.0/33",
            "[::1",
            "",
            ":80",
            "exa mple.org",
        ] {
            let e = NetRule::parse("network.allow", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("network.allow") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn wildcards_cover_subdomains_only_and_not_lookalikes() {
        let n = net(&["*.example.org"], &[]);
        assert!(n.decide(&name("a.example.org"), 443).is_ok());
        assert!(n.decide(&name("deep.a.example.org"), 80).is_ok());
        assert_eq!(
            n.decide(&name("example.org"), 443).unwrap_err().0,
            Refusal::NotAllowed
        );
        assert_eq!(
            n.decide(&name("evilexample.org"), 443).unwrap_err().0,
            Refusal::NotAllowed
        );
        assert_eq!(
            n.decide(&name("a.example.org.evil"), 443).unwrap_err().0,
            Refusal::NotAllowed
        );
        let n = net(&["example.org"], &[]);
        assert!(n.decide(&name("EXAMPLE.org."), 443).is_ok());
        assert_eq!(
            n.decide(&name("evilexample.org"), 443).unwrap_err().0,
            Refusal::NotAllowed
        );
        assert_eq!(
            n.decide(&name("a.example.org"), 443).unwrap_err().0,
            Refusal::NotAllowed
        );
    }

    #[test]
    fn ports_default_to_web_for_allow_and_to_all_for_deny() {
        let n = net(&["example.org", "example.org:8080"], &["*.example.org"]);
        assert!(n.decide(&name("example.org"), 80).is_ok());
        assert!(n.decide(&name("example.org"), 8080).is_ok());
        assert_eq!(
            n.decide(&name("example.org"), 22).unwrap_err().0,
            Refusal::PortNotAllowed
        );
        let n = net(&["*.example.org"], &["a.example.org"]);
        assert_eq!(
            n.decide(&name("a.example.org"), 443).unwrap_err().0,
            Refusal::DeniedByRule
        );
        assert!(n.decide(&name("b.example.org"), 443).is_ok());
        assert_eq!(n.ports(), vec![80, 443]);
    }

    #[test]
    fn ip_literals_need_ip_rules_and_addresses_must_be_global() {
        let n = net(&["example.org", "198.51.100.10", "10.0.0.0/8:5432"], &[]);
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert!(n.decide(&ip("198.51.100.10"), 443).is_ok());
        assert_eq!(
            n.decide(&ip("198.51.100.11"), 443).unwrap_err().0,
            Refusal::IpLiteral
        );
        assert!(n.decide(&ip("10.9.9.9"), 5432).is_ok());
        assert_eq!(
            n.decide(&ip("10.9.9.9"), 443).unwrap_err().0,
            Refusal::PortNotAllowed
        );
        assert!(n.address_ok("198.51.100.10".parse().unwrap(), 443).is_ok());
        assert!(n.address_ok("93.184.215.14".parse().unwrap(), 443).is_ok());
        for special in [
            "127.0.0.1",
            "10.1.1.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "198.51.100.11",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:93.184.215.14",
            "64:ff9b::5db8:d70e",
            "2002:5db8:d70e::1",
            "2001:db8::1",
            "2001::1",
            "ff02::1",
        ] {
            let a: IpAddr = special.parse().unwrap();
            assert!(!is_global(a), "{special}");
            assert_eq!(
                n.address_ok(a, 443).unwrap_err().0,
                Refusal::SpecialAddress,
                "{special}"
            );
        }
        assert!(is_global("2606:4700::1".parse().unwrap()));
        let n = net(&["example.org"], &["93.184.0.0/16"]);
        assert_eq!(
            n.address_ok("93.184.215.14".parse().unwrap(), 443)
                .unwrap_err()
                .0,
            Refusal::DeniedByRule
        );
    }

    #[test]
    fn pins_and_validation() {
        let p = Pin::parse("Example.org=198.51.100.10").unwrap();
        assert_eq!(p.host, "example.org");
        assert!(Pin::parse("example.org=[2001:db8::10]").is_ok());
        for bad in [
            "nonsense",
            "example.org=",
            "=1.2.3.4",
            "1.2.3.4=1.2.3.4",
            "a=b",
        ] {
            let e = Pin::parse(bad).unwrap_err().to_string();
            assert!(e.contains("network.resolve"), "{e}");
        }
        let mut n = Network::default();
        n.deny.push(rule("example.org"));
        assert!(n
            .validate()
            .unwrap_err()
            .to_string()
            .contains("network.allow rules as well"));
    }

    #[test]
    fn local_ports_stay_clear_of_the_proxys_listeners() {
        // Without egress any port but 0 is free; with it, the proxy's TCP ports are taken, the
        // DNS stub's UDP port 53 is not.
        let mut n = Network {
            local_ports: vec![8000, 3128, 53],
            ..Network::default()
        };
        assert!(n.validate().is_ok());
        n.allow.push(rule("example.org:8443"));
        assert_eq!(n.proxy_ports(), [1080, 3128, 8443]);
        for (ports, bad) in [
            (vec![8000, 3128], "3128"),
            (vec![8443], "8443"),
            (vec![0], "0"),
        ] {
            n.local_ports = ports;
            let e = n.validate().unwrap_err().to_string();
            assert!(e.contains("network.local_ports") && e.contains(bad), "{e}");
        }
        n.local_ports = vec![53, 8000];
        assert!(n.validate().is_ok());
        n.local_ports = (1..=65).collect();
        assert!(n.validate().unwrap_err().to_string().contains("at most 64"));
    }

    #[test]
    fn inspection_rules_and_secrets_are_validated_and_decided() {
        use crate::http::{HttpRule, Secret};
        let http = |s: &str| HttpRule::parse("t", s).unwrap();
        let secret = |s: &str| Secret::parse("t", s).unwrap();
        let base = || net(&["*.example.org", "pypi.org", "pinned.test"], &[]);
        let err = |n: &Network| n.validate().unwrap_err().to_string();
        // Without allow rules, each of them is refused by name.
        let mut n = Network {
            http: vec![http("read-only *")],
            ..Network::default()
        };
        assert!(err(&n).starts_with("invalid network.http"), "{}", err(&n));
        n.http.clear();
        n.max_body = Some(1);
        assert!(
            err(&n).starts_with("invalid network.max_body"),
            "{}",
            err(&n)
        );
        // Exemptions cannot take a host that rules or secrets need.
        let mut n = base();
        n.http.push(http("read-only *.example.org"));
        n.no_inspect.push(rule("a.example.org"));
        assert!(
            err(&n).contains("network.no_inspect `a.example.org`"),
            "{}",
            err(&n)
        );
        n.no_inspect = vec![rule("pinned.test")];
        n.validate().unwrap();
        n.http.push(http("GET *"));
        assert!(
            err(&n).contains("network.no_inspect `pinned.test`"),
            "{}",
            err(&n)
        );
        let mut n = base();
        n.secrets.push(secret("T@api.example.org"));
        n.validate().unwrap();
        n.no_inspect.push(rule("api.example.org:443"));
        assert!(
            err(&n).contains("network.secrets `T@api.example.org`"),
            "{}",
            err(&n)
        );
        let mut n = base();
        n.secrets = vec![secret("T@elsewhere.test")];
        assert!(err(&n).contains("lets through"), "{}", err(&n));
        n.secrets = vec![secret("T@a.example.org"), secret("T@b.example.org")];
        assert!(err(&n).contains("each variable named once"), "{}", err(&n));
        let mut n = base();
        n.inspect.push(rule("10.0.0.0/8"));
        assert!(
            err(&n).contains("network.inspect `10.0.0.0/8`"),
            "{}",
            err(&n)
        );
        n.inspect = vec![rule("pypi.org:80")];
        assert!(
            err(&n).contains("port 80 carries plain HTTP"),
            "{}",
            err(&n)
        );
        let mut n = base();
        n.upstream_ca = Some("ca.pem".into());
        assert!(
            err(&n).contains("network.upstream_ca `ca.pem`"),
            "{}",
            err(&n)
        );

        // Who is inspected.
        let mut n = base();
        n.http.push(http("GET,HEAD pypi.org/simple/**"));
        n.secrets.push(secret("T@api.example.org"));
        n.inspect.push(rule("*.example.org:8443"));
        n.no_inspect.push(rule("pinned.test"));
        n.validate().unwrap();
        for (h, port, want) in [
            ("pypi.org", 443, true),
            ("api.example.org", 443, true),
            ("api.example.org", 8443, true),
            ("www.example.org", 443, false),
            ("www.example.org", 8443, true),
            ("pinned.test", 443, false),
        ] {
            assert_eq!(n.inspects(&name(h), port), want, "{h}:{port}");
        }
        n.inspect.clear();
        n.inspect_all = true;
        assert!(n.inspects(&name("www.example.org"), 443));
        assert!(n.inspects(&Host::Ip("198.51.100.7".parse().unwrap()), 443));
        assert!(!n.inspects(&name("pinned.test"), 443));

        // Which requests go: hosts without rules get any; others only what a rule allows, and
        // never a path servers could read another way.
        let d = |h: &str, m: &str, p: &str| n.http_decide(&name(h), 443, m, p);
        assert_eq!(d("www.example.org", "DELETE", "/x"), Ok(None));
        assert_eq!(
            d("pypi.org", "GET", "/simple/requests/")
                .unwrap()
                .unwrap()
                .to_string(),
            "GET,HEAD pypi.org/simple/**"
        );
        let e = d("pypi.org", "POST", "/simple/x").unwrap_err();
        assert!(
            e.contains("no HTTP rule for pypi.org:443 allows")
                && e.contains("`GET,HEAD pypi.org/simple/**`"),
            "{e}"
        );
        assert!(d("pypi.org", "GET", "/legacy/").is_err());
        let e = d("pypi.org", "GET", "/simple/../legacy/").unwrap_err();
        assert!(e.contains("`..` segment"), "{e}");
    }

    #[test]
    fn rules_round_trip_through_json() {
        let n = net(
            &["*.example.org:8443", "[2001:db8::/32]"],
            &["a.example.org"],
        );
        let j = serde_json::to_string(&n).unwrap();
        assert_eq!(serde_json::from_str::<Network>(&j).unwrap(), n);
        assert!(serde_json::from_str::<Network>(r#"{"allow":["*"]}"#).is_err());
    }
}
