//! A DNS stub client: how the supervisor resolves allow-listed names through the server the user
//! names (`--dns-server IP[:PORT]`) instead of the libc resolver.
//!
//! It asks for A and AAAA over UDP on a socket connected to the server (so the kernel drops
//! datagrams from anyone else), with a fresh id per query, and accepts a reply only when its id,
//! flags and question echo the query exactly. Of the answers it takes A and AAAA records of class
//! IN whose owner is the queried name or a name in the CNAME chain from it (at most
//! [`MAX_CHAIN`] links, found in the same answer). Parsing never panics and never reads out of
//! bounds; compression pointers are followed at most [`MAX_JUMPS`] times per name.
//!
//! It does not: fall back to TCP (a truncated reply yields the records that arrived whole),
//! send EDNS, validate DNSSEC, or search domains. It cannot stop a forged reply from an on-path
//! attacker, or an off-path one who guesses both the source port and the 16-bit id; the names
//! are still checked against the rules, and connections against the addresses, by the caller.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io::{
    self,
    ErrorKind::{Interrupted, TimedOut, WouldBlock},
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
/// Most compression pointers followed while reading one name.
pub const MAX_JUMPS: usize = 64;
/// Most CNAME links followed from the queried name.
pub const MAX_CHAIN: usize = 8;

/// Why a name could not be resolved.
#[derive(Debug)]
pub enum DnsError {
    /// The socket could not be set up, or sending or receiving failed.
    Io { source: io::Error },
    /// No acceptable reply arrived before the deadline.
    Timeout { server: SocketAddr },
    /// The server says the name does not exist (RCODE 3).
    NxDomain { name: String },
    /// The server answered with another non-zero RCODE.
    ServerFailure { name: String, rcode: u8 },
    /// A reply to our query that does not parse.
    Malformed { detail: String },
    /// The name cannot be put in a query.
    BadName { name: String, why: &'static str },
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnsError::Io { source } => write!(
                f,
                "querying the DNS server failed: {source}; check that --dns-server names a reachable server"
            ),
            DnsError::Timeout { server } => write!(
                f,
                "DNS server {server} did not answer in time; check --dns-server and the network"
            ),
            DnsError::NxDomain { name } => write!(
                f,
                "`{name}` does not exist (NXDOMAIN); check its spelling in the rules"
            ),
            DnsError::ServerFailure { name, rcode } => write!(
                f,
                "the DNS server could not resolve `{name}` (rcode {rcode}); retry, or name another --dns-server"
            ),
            DnsError::Malformed { detail } => write!(
                f,
                "the DNS server sent a malformed reply ({detail}); check that --dns-server is a DNS server"
            ),
            DnsError::BadName { name, why } => {
                write!(f, "`{name}` is not a valid DNS name: {why}")
            }
        }
    }
}

impl std::error::Error for DnsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DnsError::Io { source } => Some(source),
            _ => None,
        }
    }
}

impl From<io::Error> for DnsError {
    fn from(source: io::Error) -> Self {
        DnsError::Io { source }
    }
}

fn malformed(detail: &str) -> DnsError {
    DnsError::Malformed {
        detail: detail.to_owned(),
    }
}

/// Resolves `name` (already normalized: lower-case ASCII/punycode, no trailing dot) to its IPv4
/// and IPv6 addresses by asking `server` over UDP, within about `timeout`.
///
/// Returns IPv4 addresses first, then IPv6, each in answer order, without duplicates; an empty
/// list when the name exists but has no address. Each query is sent again once if it has no
/// reply by half the timeout. (The blocking form, for tests; the proxy's waits also end when it
/// stops: [`resolve_waiting`].)
#[cfg(test)]
pub fn resolve(server: SocketAddr, name: &str, timeout: Duration) -> Result<Vec<IpAddr>, DnsError> {
    resolve_waiting(server, name, timeout, &mut |sock, until| {
        let wait = until.saturating_duration_since(Instant::now());
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [rustix::event::PollFd::new(
            sock,
            rustix::event::PollFlags::IN,
        )];
        let t = rustix::event::Timespec {
            tv_sec: i64::from(ms / 1000),
            tv_nsec: i64::from(ms % 1000) * 1_000_000,
        };
        let _ = rustix::event::poll(&mut fds, Some(&t));
        true
    })
}

/// [`resolve`], each wait for a reply done by `wait(socket, until)`, which returns `false` to
/// give up (the proxy stopped, or the connection was cut: the lookup ends with that error).
pub(crate) fn resolve_waiting(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
    wait: &mut dyn FnMut(&UdpSocket, Instant) -> bool,
) -> Result<Vec<IpAddr>, DnsError> {
    let start = Instant::now();
    let (deadline, retry_at) = (start + timeout, start + timeout / 2);
    let id_a = random_id();
    let id_aaaa = match random_id() {
        id if id == id_a => !id,
        id => id,
    };
    let queries = [(TYPE_A, id_a), (TYPE_AAAA, id_aaaa)];
    let packets = [
        build_query(id_a, name, TYPE_A)?,
        build_query(id_aaaa, name, TYPE_AAAA)?,
    ];
    let local: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(local)?;
    sock.connect(server)?;
    sock.set_nonblocking(true)?;
    for p in &packets {
        sock.send(p)?;
    }
    let mut answers: [Option<Vec<IpAddr>>; 2] = [None, None];
    let mut bad_reply = None;
    let mut retried = false;
    let mut buf = vec![0u8; 65_536];
    while answers.iter().any(Option::is_none) {
        let now = Instant::now();
        if now >= deadline {
            return Err(bad_reply.unwrap_or(DnsError::Timeout { server }));
        }
        if !retried && now >= retry_at {
            for (p, a) in packets.iter().zip(&answers) {
                if a.is_none() {
                    sock.send(p)?;
                }
            }
            retried = true;
        }
        let until = if retried { deadline } else { retry_at };
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut | Interrupted) => {
                if !wait(&sock, until) {
                    return Err(DnsError::Io {
                        source: crate::relay::stopping(),
                    });
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for ((qtype, id), answer) in queries.iter().zip(answers.iter_mut()) {
            if answer.is_some() {
                continue;
            }
            match parse_reply(&buf[..n], *id, name, *qtype) {
                Ok(Some(reply)) => {
                    *answer = Some(reply.addrs);
                    break;
                }
                Ok(None) => {}
                // Keep waiting: a garbled datagram must not end the lookup early.
                Err(e @ DnsError::Malformed { .. }) => bad_reply = Some(e),
                Err(e) => return Err(e),
            }
        }
    }
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in answers.into_iter().flatten().flatten() {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// A query id no one else can predict (RandomState is keyed randomly per process).
fn random_id() -> u16 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = RandomState::new().build_hasher();
    h.write_u128(nanos);
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    let x = h.finish();
    (x ^ (x >> 16) ^ (x >> 32) ^ (x >> 48)) as u16
}

/// `name` in wire form (length-prefixed labels, lower-cased, ending in the root's 0).
fn encode_name(name: &str) -> Result<Vec<u8>, DnsError> {
    let bad = |why| DnsError::BadName {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > 253 {
        return Err(bad("it is longer than 253 bytes"));
    }
    if !name.is_ascii() {
        return Err(bad("it is not ASCII; give its punycode (xn--) form"));
    }
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.split('.') {
        if label.is_empty() {
            return Err(bad("it has an empty label"));
        }
        if label.len() > 63 {
            return Err(bad("it has a label longer than 63 bytes"));
        }
        out.push(label.len() as u8);
        out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
    }
    out.push(0);
    Ok(out)
}

/// A recursive (RD) query for `name` of type `qtype`, class IN.
pub(crate) fn build_query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, DnsError> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(&encode_name(name)?);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(q)
}

/// A reply that answers our query.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Addresses of the queried type for the name (or its CNAME chain), in answer order.
    pub(crate) addrs: Vec<IpAddr>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The name at `at`, lower-cased in uncompressed wire form, and the offset just past it.
fn read_name(msg: &[u8], mut at: usize) -> Result<(Vec<u8>, usize), DnsError> {
    let mut out = Vec::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg
            .get(at)
            .ok_or_else(|| malformed("a name runs past the end"))?;
        match len & 0xc0 {
            0 if len == 0 => {
                out.push(0);
                return Ok((out, end.unwrap_or(at + 1)));
            }
            0 => {
                let label = msg
                    .get(at + 1..at + 1 + len as usize)
                    .ok_or_else(|| malformed("a label runs past the end"))?;
                if out.len() + label.len() + 2 > 255 {
                    return Err(malformed("a name is longer than 255 bytes"));
                }
                out.push(len);
                out.extend(label.iter().map(u8::to_ascii_lowercase));
                at += 1 + len as usize;
            }
            0xc0 => {
                let low = *msg
                    .get(at + 1)
                    .ok_or_else(|| malformed("a pointer runs past the end"))?;
                jumps += 1;
                if jumps > MAX_JUMPS {
                    return Err(malformed("a name's compression pointers loop"));
                }
                end.get_or_insert(at + 2);
                at = (usize::from(len & 0x3f) << 8) | usize::from(low);
            }
            _ => return Err(malformed("a name uses an unknown label type")),
        }
    }
}

struct Record {
    owner: Vec<u8>,
    rtype: u16,
    class: u16,
    rdata: Range<usize>,
}

/// The resource record at `at`, and the offset just past it.
fn read_record(msg: &[u8], at: usize) -> Result<(Record, usize), DnsError> {
    let (owner, at) = read_name(msg, at)?;
    let fixed = msg
        .get(at..at + 10)
        .ok_or_else(|| malformed("a record runs past the end"))?;
    let rdata = at + 10..at + 10 + usize::from(be16(fixed, 8));
    if rdata.end > msg.len() {
        return Err(malformed("a record's data runs past the end"));
    }
    let (rtype, class) = (be16(fixed, 0), be16(fixed, 2));
    let end = rdata.end;
    Ok((
        Record {
            owner,
            rtype,
            class,
            rdata,
        },
        end,
    ))
}

/// Parses `buf` as the reply to query `id` for `name` and `qtype`: `None` when it is not that
/// reply (other id, not a response, other opcode or question), an error for NXDOMAIN, another
/// non-zero RCODE, or a reply that does not parse.
pub(crate) fn parse_reply(
    buf: &[u8],
    id: u16,
    name: &str,
    qtype: u16,
) -> Result<Option<Reply>, DnsError> {
    let qname = encode_name(name)?;
    let h = buf
        .get(..12)
        .ok_or_else(|| malformed("it is shorter than a DNS header"))?;
    if be16(h, 0) != id || h[2] & 0x80 == 0 || h[2] & 0x78 != 0 || be16(h, 4) != 1 {
        return Ok(None);
    }
    let (echoed, at) = read_name(buf, 12)?;
    let tail = buf
        .get(at..at + 4)
        .ok_or_else(|| malformed("the question runs past the end"))?;
    if echoed != qname || be16(tail, 0) != qtype || be16(tail, 2) != CLASS_IN {
        return Ok(None);
    }
    match h[3] & 0x0f {
        0 => {}
        3 => return Err(DnsError::NxDomain { name: name.into() }),
        rcode => {
            return Err(DnsError::ServerFailure {
                name: name.into(),
                rcode,
            })
        }
    }
    let truncated = h[2] & 0x02 != 0;
    let mut at = at + 4;
    let mut records = Vec::new();
    for _ in 0..be16(h, 6) {
        match read_record(buf, at) {
            Ok((r, next)) => {
                records.push(r);
                at = next;
            }
            Err(_) if truncated => break, // keep the records that arrived whole
            Err(e) => return Err(e),
        }
    }
    let mut chain = vec![qname];
    while chain.len() <= MAX_CHAIN {
        let Some(last) = chain.last() else { break };
        let Some(r) = records
            .iter()
            .find(|r| r.rtype == TYPE_CNAME && r.class == CLASS_IN && r.owner == *last)
        else {
            break;
        };
        let (target, end) = read_name(buf, r.rdata.start)?;
        if end != r.rdata.end {
            return Err(malformed("a CNAME's data is not one name"));
        }
        if chain.contains(&target) {
            break;
        }
        chain.push(target);
    }
    let mut addrs = Vec::new();
    for r in records
        .iter()
        .filter(|r| r.rtype == qtype && r.class == CLASS_IN)
    {
        if !chain.contains(&r.owner) {
            continue;
        }
        let data = &buf[r.rdata.clone()];
        let ip = match (<[u8; 4]>::try_from(data), <[u8; 16]>::try_from(data)) {
            (Ok(v4), _) if qtype == TYPE_A => IpAddr::from(v4),
            (_, Ok(v6)) if qtype == TYPE_AAAA => IpAddr::from(v6),
            _ => return Err(malformed("an address record has the wrong length")),
        };
        addrs.push(ip);
    }
    Ok(Some(Reply { addrs }))
}

/// The name to give the system's resolver (`getaddrinfo`) for `name` (normalized, as
/// [`resolve`] takes it), so that it is looked up as written and never under the host's search
/// domains.
///
/// glibc tries a name with a dot as written first, and when that does not exist, again with each
/// of `resolv.conf`'s `search` domains appended: with a wildcard rule the code chooses the name,
/// and `<anything>.example.org`, which does not exist, became
/// `<anything>.example.org.corp.example`, an address of the host's own domain that no rule names.
/// A trailing dot makes the name absolute, and glibc then asks for it alone. But glibc's
/// `/etc/hosts` lookup does not match a name with a trailing dot, so a name the hosts file lists
/// is given as it is ([`hosts_lists`]): with `hosts: files dns`, the usual order, the file
/// answers it before any DNS query. A name without a dot (`localhost`, a host the user's rule
/// names on its own) is given as it is: that is the host's resolver's own meaning of it, and a
/// wildcard rule cannot make one.
pub fn system_name(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains('.') || name.ends_with('.') || hosts_lists(name) {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(format!("{name}."))
    }
}

/// Most of `/etc/hosts` read (glibc reads all of it). A larger file is not read, and every name
/// is then given to the system's resolver as it is (the search domains may apply to it).
pub const MAX_HOSTS_FILE: u64 = 64 << 20;

/// The names one hosts file lists, lower-cased.
type HostsNames = std::collections::HashSet<Box<[u8]>>;

/// `/etc/hosts`'s names, kept while the file is the same (device, inode, size, modification
/// time), so that a connection costs a `stat`, not a read and a parse; `None` for a file past
/// [`MAX_HOSTS_FILE`].
static HOSTS: std::sync::Mutex<Option<(FileKey, Option<std::sync::Arc<HostsNames>>)>> =
    std::sync::Mutex::new(None);

/// What tells one version of a file from another: device, inode, size, modification time.
type FileKey = (u64, u64, i64, i64, i64);

/// Whether `/etc/hosts` lists `name` (as an entry's name or alias, whatever the case); `true`
/// also when the file is past [`MAX_HOSTS_FILE`] (unknown: the name is then left as it is).
pub fn hosts_lists(name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let path = "/etc/hosts";
    let Ok(meta) = std::fs::metadata(path) else {
        return false; // no file: nothing it could answer
    };
    let key = (
        meta.dev(),
        meta.ino(),
        meta.size() as i64,
        meta.mtime(),
        meta.mtime_nsec(),
    );
    let names = {
        let mut cached = HOSTS.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some((k, names)) if *k == key => names.clone(),
            _ => {
                // Past the bound, unknown; unreadable, nothing glibc could read either.
                let names = (meta.len() <= MAX_HOSTS_FILE).then(|| {
                    let mut bytes = Vec::new();
                    let read = std::fs::File::open(path).and_then(|f| {
                        std::io::Read::read_to_end(
                            &mut std::io::Read::take(f, MAX_HOSTS_FILE),
                            &mut bytes,
                        )
                    });
                    std::sync::Arc::new(if read.is_ok() {
                        hosts_names(&bytes)
                    } else {
                        HostsNames::new()
                    })
                });
                *cached = Some((key, names.clone()));
                names
            }
        }
    };
    match names {
        Some(n) => n.contains(name.to_ascii_lowercase().as_bytes()),
        None => true,
    }
}

/// The names a hosts file's bytes list (each line's fields after the address, up to a `#`),
/// lower-cased. Bytes, not text: a comment in another encoding does not hide the entries.
fn hosts_names(text: &[u8]) -> HostsNames {
    let mut names = HostsNames::new();
    for line in text.split(|b| *b == b'\n') {
        let line = line.split(|b| *b == b'#').next().unwrap_or_default();
        for field in line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .skip(1)
        {
            names.insert(field.to_ascii_lowercase().into_boxed_slice());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    type Answer<'a> = (&'a [u8], u16, &'a [u8]);
    const PTR_Q: &[u8] = &[0xc0, 12];
    const OK: u16 = 0x8180;

    fn wire(name: &str) -> Vec<u8> {
        encode_name(name).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A reply echoing the question `q`/`qtype` with `answers` (owner in wire form, type, data).
    fn reply(id: u16, flags: u16, q: &str, qtype: u16, answers: &[Answer]) -> Vec<u8> {
        let mut m = [id, flags, 1, answers.len() as u16, 0, 0]
            .map(u16::to_be_bytes)
            .concat();
        m.extend_from_slice(&wire(q));
        m.extend_from_slice(&[qtype.to_be_bytes(), [0, 1]].concat());
        for (owner, t, data) in answers {
            m.extend_from_slice(owner);
            m.extend_from_slice(&[t.to_be_bytes(), [0, 1], [0, 0], [0, 60]].concat());
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
        m
    }

    /// `parse_reply` for `svc.test`.
    fn parse(m: &[u8], id: u16, qtype: u16) -> Result<Option<Reply>, DnsError> {
        parse_reply(m, id, "svc.test", qtype)
    }

    fn addrs(r: Result<Option<Reply>, DnsError>) -> Vec<IpAddr> {
        r.unwrap().unwrap().addrs
    }

    #[test]
    fn a_and_aaaa_answers_parse() {
        let m = reply(
            7,
            OK,
            "svc.test",
            TYPE_A,
            &[(PTR_Q, TYPE_A, &[192, 0, 2, 1])],
        );
        assert_eq!(addrs(parse(&m, 7, TYPE_A)), [ip("192.0.2.1")]);
        let mut upper = m.clone();
        upper[13..16].copy_from_slice(b"SVC"); // the echo may differ in case
        assert_eq!(addrs(parse(&upper, 7, TYPE_A)), [ip("192.0.2.1")]);
        let v6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        let m = reply(8, OK, "svc.test", TYPE_AAAA, &[(PTR_Q, TYPE_AAAA, &v6)]);
        assert_eq!(addrs(parse(&m, 8, TYPE_AAAA)), [ip("2001:db8::7")]);
        let bad = reply(9, OK, "svc.test", TYPE_A, &[(PTR_Q, TYPE_A, &[1; 5])]);
        assert!(matches!(
            parse(&bad, 9, TYPE_A),
            Err(DnsError::Malformed { .. })
        ));
        let empty = reply(9, OK, "svc.test", TYPE_A, &[]);
        assert!(addrs(parse(&empty, 9, TYPE_A)).is_empty());
    }

    #[test]
    fn only_the_cname_chain_from_the_queried_name_counts() {
        let q = "www.example";
        // The CNAME's data starts after header, question, pointer owner and fixed fields.
        let target = [0xc0, (12 + wire(q).len() + 4 + 2 + 10) as u8];
        let answers: &[Answer] = &[
            (PTR_Q, TYPE_CNAME, &wire("edge.cdn.example")),
            (&wire("evil.example"), TYPE_A, &[203, 0, 113, 66]),
            (&target, TYPE_A, &[192, 0, 2, 9]),
        ];
        let m = reply(1, OK, q, TYPE_A, answers);
        assert_eq!(addrs(parse_reply(&m, 1, q, TYPE_A)), [ip("192.0.2.9")]);
    }

    #[test]
    fn error_rcodes_and_replies_to_other_queries() {
        let nx = reply(2, OK | 3, "svc.test", TYPE_A, &[]);
        assert!(
            matches!(parse(&nx, 2, TYPE_A), Err(DnsError::NxDomain { name }) if name == "svc.test")
        );
        let sf = reply(2, OK | 2, "svc.test", TYPE_A, &[]);
        let r = parse(&sf, 2, TYPE_A);
        assert!(matches!(r, Err(DnsError::ServerFailure { rcode: 2, .. })));
        let ok = reply(
            2,
            OK,
            "svc.test",
            TYPE_A,
            &[(PTR_Q, TYPE_A, &[192, 0, 2, 1])],
        );
        assert!(parse(&ok, 3, TYPE_A).unwrap().is_none(), "other id");
        assert!(parse(&ok, 2, TYPE_AAAA).unwrap().is_none(), "other type");
        let other = parse_reply(&ok, 2, "other.test", TYPE_A);
        assert!(other.unwrap().is_none(), "other name");
        let query = reply(2, 0x0100, "svc.test", TYPE_A, &[]);
        assert!(
            parse(&query, 2, TYPE_A).unwrap().is_none(),
            "not a response"
        );
    }

    #[test]
    fn pointer_loops_and_cut_replies_are_malformed_unless_truncated() {
        let is_malformed =
            |m: &[u8]| matches!(parse(m, 5, TYPE_A), Err(DnsError::Malformed { .. }));
        let owner_at = 12 + wire("svc.test").len() as u8 + 4;
        let looped: &[Answer] = &[(&[0xc0, owner_at], TYPE_A, &[1; 4])];
        assert!(is_malformed(&reply(5, OK, "svc.test", TYPE_A, looped)));
        let two: &[Answer] = &[(PTR_Q, TYPE_A, &[1; 4]), (PTR_Q, TYPE_A, &[2; 4])];
        let full = reply(5, OK, "svc.test", TYPE_A, two);
        for cut in 0..full.len() {
            assert!(is_malformed(&full[..cut]), "cut at {cut}");
        }
        let mut tc = full[..full.len() - 3].to_vec();
        tc[2] |= 0x02;
        assert_eq!(addrs(parse(&tc, 5, TYPE_A)), [ip("1.1.1.1")]);
        let mut garbage = full[..12].to_vec();
        garbage.extend_from_slice(&[0x7f; 30]); // a reserved label type
        assert!(is_malformed(&garbage));
    }

    #[test]
    fn bad_names_are_refused() {
        let q = build_query(0xabcd, "a.Example", TYPE_AAAA).unwrap();
        let want = b"\xab\xcd\x01\x00\0\x01\0\0\0\0\0\0\x01a\x07example\0\0\x1c\0\x01";
        assert_eq!(q, want);
        let long = "x".repeat(64);
        let too_long = ["a"; 127].join(".") + ".bb";
        for name in ["", "a..b", ".a", "a.", &long, &too_long, "é.test"] {
            let r = build_query(1, name, TYPE_A);
            assert!(matches!(r, Err(DnsError::BadName { .. })), "{name}");
        }
    }

    #[test]
    fn random_and_mutated_replies_never_panic() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let cdn = [3, b'c', b'd', b'n', 0xc0, 16]; // cdn.example, by a pointer
        let answers: &[Answer] = &[(PTR_Q, TYPE_CNAME, &cdn), (&cdn, TYPE_A, &[1; 4])];
        let valid = reply(5, OK, "www.example", TYPE_A, answers);
        assert_eq!(
            addrs(parse_reply(&valid, 5, "www.example", TYPE_A)),
            [ip("1.1.1.1")]
        );
        for i in 0..20_000 {
            let mut m: Vec<u8> = if i % 2 == 0 {
                (0..next() % 600).map(|_| next() as u8).collect()
            } else {
                valid.clone()
            };
            if !m.is_empty() {
                for _ in 0..=next() % 4 {
                    let at = (next() as usize) % m.len();
                    m[at] = next() as u8;
                }
                m.truncate(1 + (next() as usize) % (m.len() + 8));
            }
            if m.len() >= 6 && i % 4 == 0 {
                m[..6].copy_from_slice(&[0, 5, 0x81, 0x80, 0, 1]); // reach past the header
            }
            let _ = parse_reply(&m, 5, "www.example", TYPE_A);
        }
    }

    /// A responder that drops the first query it gets, then answers `svc.test` and NXDOMAIN.
    fn responder() -> (SocketAddr, Arc<AtomicUsize>) {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let (addr, count) = (sock.local_addr().unwrap(), seen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let Some(q) = crate::wire::dns_question(&buf[..n]) else {
                    continue;
                };
                if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    continue;
                }
                let data: &[u8] = match (q.name.as_str(), q.qtype) {
                    ("svc.test", TYPE_A) => &[192, 0, 2, 7],
                    ("svc.test", TYPE_AAAA) => {
                        &[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]
                    }
                    _ => &[],
                };
                let m = if data.is_empty() {
                    reply(q.id, OK | 3, &q.name, q.qtype, &[])
                } else {
                    reply(q.id, OK, &q.name, q.qtype, &[(PTR_Q, q.qtype, data)])
                };
                let _ = sock.send_to(&m, from);
            }
        });
        (addr, seen)
    }

    #[test]
    fn resolve_asks_a_real_server_and_retries_once() {
        let (server, seen) = responder();
        let got = resolve(server, "svc.test", Duration::from_secs(2)).unwrap();
        assert_eq!(got, [ip("192.0.2.7"), ip("2001:db8::7")]);
        assert_eq!(
            seen.load(Ordering::SeqCst),
            3,
            "the dropped query is sent again"
        );
        let nx = resolve(server, "nope.test", Duration::from_secs(2));
        assert!(matches!(nx, Err(DnsError::NxDomain { .. })), "{nx:?}");
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = resolve(
            silent.local_addr().unwrap(),
            "svc.test",
            Duration::from_millis(300),
        );
        assert!(matches!(r, Err(DnsError::Timeout { .. })), "{r:?}");
    }

    #[test]
    fn a_hosts_files_names_are_read_as_bytes_with_aliases_and_comments() {
        let text = b"127.0.0.1\tlocalhost\n::1 localhost ip6-localhost\n\
                     # 10.0.0.1 commented.example.org\n\
                     # caf\xe9 box (Latin-1)\n\
                     198.51.100.7 Dev.Example.org dev # the dev box\n\
                     0.0.0.0 ads.example.org";
        let names = hosts_names(text);
        for (name, listed) in [
            ("dev.example.org", true),
            ("dev", true),
            ("ip6-localhost", true),
            ("ads.example.org", true),
            ("commented.example.org", false),
            ("box", false),
            ("198.51.100.7", false),
        ] {
            assert_eq!(names.contains(name.as_bytes()), listed, "{name}");
        }
    }

    #[test]
    fn a_name_without_a_dot_or_with_a_trailing_one_is_given_as_it_is() {
        for name in ["localhost", "devbox", "example.org."] {
            assert_eq!(system_name(name), name);
        }
    }
}
