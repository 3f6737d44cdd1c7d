//! Parsers for what a client sends first: the TLS ClientHello's server name, an HTTP request head,
//! and DNS queries (with the stub's answers). Pure functions over bytes, no I/O.
//!
//! Every function here runs on bytes the sandbox chose: none may panic, read out of bounds or
//! allocate more than a small multiple of its input (the fuzz targets in `fuzz/` hold them to it).
//! Text they return for messages (`HostError`) is already escaped and cut, so it can go into an
//! [`Event`](crate::Event) as it is.

use palisade_policy::net::Host;
use palisade_policy::untrusted::Untrusted;
use std::fmt;

/// Most characters of a client's text quoted in a message.
const QUOTED: usize = 128;
/// Most header lines in a request head; a head with more is refused.
pub(crate) const MAX_HEADERS: usize = 100;
/// Most characters of an HTTP method: a longer word is not taken for one.
const MAX_METHOD: usize = 32;

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// A TLS ClientHello, with its server name if it has one.
    Tls(Option<String>),
    /// An HTTP request head: its host as [`http_host`] reads it.
    Http(Result<Option<String>, HostError>),
    /// Something else.
    Other,
}

/// Why the host of an HTTP request cannot be told, or is not one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostError {
    /// More than one `Host` header (their values, escaped): servers differ on which one they use.
    Several(String),
    /// An absolute-form target naming another host than `Host` (both escaped): a server uses the
    /// target's (RFC 9112 §3.2.2), so checking `Host` alone would be fooled.
    TargetDiffers { target: String, host: String },
    /// The head does not parse as HTTP/1.x (httparse's reason): a lenient server might read it
    /// some other way than we would.
    Malformed(String),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Several(v) => write!(f, "more than one Host header ({v})"),
            HostError::TargetDiffers { target, host } => {
                write!(
                    f,
                    "request target `{target}` names another host than Host `{host}`"
                )
            }
            HostError::Malformed(why) => write!(f, "a malformed HTTP request head ({why})"),
        }
    }
}

impl Sniffed {
    pub(crate) fn protocol(&self) -> crate::Protocol {
        match self {
            Sniffed::Tls(_) => crate::Protocol::Tls,
            Sniffed::Http(_) => crate::Protocol::Http,
            Sniffed::Other => crate::Protocol::Other,
        }
    }
}

/// Whether `buf` holds enough to classify it: `None` means read more.
///
/// An HTTP request is anything that starts (after empty lines, which servers skip: RFC 9112 §2.2)
/// with a method-like word (letters, `-`, `_`: `GET`, `get`, `VERSION-CONTROL`) and then
/// whitespace: servers may split the request line on any whitespace (§3), and any method is
/// still routed by its `Host`. Such bytes must then be one well-formed HTTP/1.x head, or
/// [`Sniffed::Http`] holds [`HostError::Malformed`]. Digits and dots end the word, so an SSH
/// banner (`SSH-2.0-…`) is not a request.
pub(crate) fn sniff(buf: &[u8]) -> Option<Sniffed> {
    let blank = buf
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count();
    let rest = &buf[blank..];
    let first = *rest.first()?;
    if blank == 0 && first == 0x16 {
        return tls_server_name(buf).map(Sniffed::Tls);
    }
    let letters = rest
        .iter()
        .take_while(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'_'))
        .count();
    if letters > MAX_METHOD {
        return Some(Sniffed::Other);
    }
    if letters == rest.len() {
        return None;
    }
    if letters == 0 || !matches!(rest[letters], b' ' | b'\t' | 0x0b | 0x0c) {
        return Some(Sniffed::Other);
    }
    match parse_head(buf) {
        Ok(None) => None,
        Ok(Some(head)) => Some(Sniffed::Http(http_host(&head))),
        Err(why) => Some(Sniffed::Http(Err(HostError::Malformed(why)))),
    }
}

/// An HTTP/1.x request head, as httparse read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    /// The minor version: `HTTP/1.0` or `HTTP/1.1`.
    pub version: u8,
    /// Names as sent, values as bytes (they may hold any byte but control characters).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The head's length in bytes, blank line included; what follows is the body or the stream.
    pub len: usize,
}

impl Head {
    /// Every value of a header (case-insensitive name), in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Parses a request head with httparse: `Ok(None)` while incomplete, an error (httparse's reason,
/// or too many headers) when it is not an HTTP/1.x head. Like lenient servers, it takes a bare LF
/// as a line end, so a `Host` after one is seen as the server would see it.
pub(crate) fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    parse_head_in(buf, &mut [httparse::EMPTY_HEADER; MAX_HEADERS])
}

/// [`parse_head`] with room for `headers.len()` header lines.
pub(crate) fn parse_head_in<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
) -> Result<Option<Head>, String> {
    let max = headers.len();
    let mut req = httparse::Request::new(headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(format!("more than {max} header lines"))
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(Some(Head {
        method: req.method.unwrap_or_default().to_owned(),
        target: req.path.unwrap_or_default().to_owned(),
        version: req.version.unwrap_or_default(),
        headers: req
            .headers
            .iter()
            .map(|h| (h.name.to_owned(), h.value.to_vec()))
            .collect(),
        len,
    }))
}

/// The host an HTTP request head is for (port removed, as sent): its one `Host` header, checked
/// against an absolute-form request target if there is one (the target's host alone when there
/// is no `Host`). An error says why the host is ambiguous: servers differ on which of several
/// `Host` headers they use, and use an absolute target's host over `Host` (RFC 9112 §3.2, §3.2.2).
pub(crate) fn http_host(head: &Head) -> Result<Option<String>, HostError> {
    let hosts: Vec<&[u8]> = head.values("host").collect();
    if hosts.len() > 1 {
        let shown: Vec<String> = hosts
            .iter()
            .map(|h| Untrusted::new(h).max(QUOTED).to_string())
            .collect();
        return Err(HostError::Several(shown.join(", ")));
    }
    let host = match hosts.first() {
        None => None,
        Some(h) => match std::str::from_utf8(h) {
            Ok(s) => Some(strip_port(s.trim())),
            Err(_) => {
                return Err(HostError::Malformed(format!(
                    "a Host header that is not text: {}",
                    Untrusted::new(h).max(QUOTED)
                )))
            }
        },
    };
    let lower = head.target.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return Ok(host);
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let target_host = strip_port(authority);
    match host {
        None => Ok(Some(target_host)),
        Some(h) if same_host(&h, &target_host) => Ok(Some(h)),
        Some(h) => Err(HostError::TargetDiffers {
            target: Untrusted::new(&head.target).max(QUOTED).to_string(),
            host: Untrusted::new(&h).max(QUOTED).to_string(),
        }),
    }
}

/// Whether two hosts as sent are the same host: equal once normalized (IDNA, case, a trailing
/// dot, IPv4 notations), or equal ignoring case when either does not parse.
pub(crate) fn same_host(a: &str, b: &str) -> bool {
    match (Host::parse(a), Host::parse(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// A `Host` value without its port.
pub(crate) fn strip_port(h: &str) -> String {
    if h.starts_with('[') {
        return h
            .split_once(']')
            .map_or(h.to_owned(), |(a, _)| format!("{a}]"));
    }
    match h.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => a.to_owned(),
        _ => h.to_owned(),
    }
}

/// The head as it goes on: the request line and each header as parsed, lines ending in CRLF,
/// so that the next hop reads exactly what was checked (a bare LF or blank lines before the
/// request line do not survive).
pub(crate) fn serialize_head(head: &Head) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.{}\r\n",
        head.method, head.target, head.version
    )
    .into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// An HTTP/1.x response head, as httparse read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Response {
    pub version: u8,
    pub code: u16,
    pub reason: String,
    pub headers: Vec<(String, Vec<u8>)>,
    /// The head's length in bytes, blank line included.
    pub len: usize,
}

impl Response {
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The head as it goes on to the client, lines ending in CRLF.
    pub fn serialize(&self) -> Vec<u8> {
        let mut out =
            format!("HTTP/1.{} {} {}\r\n", self.version, self.code, self.reason).into_bytes();
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// Parses a response head: `Ok(None)` while incomplete.
pub(crate) fn parse_response(buf: &[u8]) -> Result<Option<Response>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(n)) => n,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(format!("more than {MAX_HEADERS} header lines"))
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(Some(Response {
        version: r.version.unwrap_or_default(),
        code: r.code.unwrap_or_default(),
        reason: r.reason.unwrap_or_default().to_owned(),
        headers: r
            .headers
            .iter()
            .map(|h| (h.name.to_owned(), h.value.to_vec()))
            .collect(),
        len,
    }))
}

/// How a message's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

/// The single value of a message's `Content-Length` headers, if any: several that differ, or one
/// that is not a number, is an error (servers differ on which they would use).
fn content_length<'a>(values: impl Iterator<Item = &'a [u8]>) -> Result<Option<u64>, &'static str> {
    let mut found: Option<u64> = None;
    for v in values {
        for part in v.split(|&b| b == b',') {
            let t = part.trim_ascii();
            if t.is_empty() || t.len() > 19 || !t.iter().all(u8::is_ascii_digit) {
                return Err("a Content-Length that is not one decimal number");
            }
            let n: u64 = std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("a Content-Length that is not one decimal number")?;
            match found {
                Some(m) if m != n => return Err("Content-Length headers that differ"),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

/// The codings of a message's `Transfer-Encoding` headers, in order, lower case.
fn codings<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|c| String::from_utf8_lossy(c.trim_ascii()).to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect()
}

/// A request's body: none, a length, or chunked; anything a server might read another way (both
/// `Transfer-Encoding` and `Content-Length`, a coding other than `chunked` alone, lengths that
/// differ) is an error, so that the proxy and the server never disagree on where a request ends.
pub(crate) fn request_framing(head: &Head) -> Result<Framing, &'static str> {
    let te: Vec<&[u8]> = head.values("transfer-encoding").collect();
    let cl = content_length(head.values("content-length"))?;
    if !te.is_empty() {
        if cl.is_some() {
            return Err("both Transfer-Encoding and Content-Length");
        }
        if codings(te.into_iter()) != ["chunked"] {
            return Err("a Transfer-Encoding other than `chunked` alone");
        }
        return Ok(Framing::Chunked);
    }
    Ok(match cl {
        None | Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
    })
}

/// A response's body, for a request with `method`.
pub(crate) fn response_framing(method: &str, r: &Response) -> Result<Framing, &'static str> {
    if method == "HEAD" || r.code < 200 || r.code == 204 || r.code == 304 {
        return Ok(Framing::Empty);
    }
    let te = codings(r.values("transfer-encoding"));
    if !te.is_empty() {
        return Ok(if te.last().map(String::as_str) == Some("chunked") {
            Framing::Chunked
        } else {
            Framing::UntilClose
        });
    }
    Ok(match content_length(r.values("content-length"))? {
        None => Framing::UntilClose,
        Some(0) => Framing::Empty,
        Some(n) => Framing::Length(n),
    })
}

/// Why a body cannot be passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyError {
    Malformed(&'static str),
    /// More than the limit, in bytes of payload.
    TooLarge(u64),
    /// The sender closed before the body's end.
    Truncated,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Malformed(why) => write!(f, "a malformed chunked body ({why})"),
            BodyError::TooLarge(n) => write!(f, "a body larger than {n} bytes (network.max_body)"),
            BodyError::Truncated => f.write_str("the sender closed before the end of the body"),
        }
    }
}

/// Most bytes of one chunk-size line's extensions, and of all trailer lines.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size {
        value: u64,
        digits: u8,
    },
    Ext {
        value: u64,
        len: usize,
    },
    SizeLf {
        value: u64,
    },
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (`empty`) or in one; `seen`: trailer bytes so far.
    Trailer {
        empty: bool,
        seen: usize,
    },
    TrailerLf {
        empty: bool,
        seen: usize,
    },
    Done,
}

/// A body read off a stream, one piece at a time as it arrives: what belongs to it is passed on
/// (chunked bodies decoded and encoded again in one canonical form, without extensions or
/// trailers, so that the next hop finds its end exactly where the proxy did), and its end is
/// found. Its memory is a few words whatever the body.
#[derive(Debug, Clone)]
pub(crate) struct BodyReader {
    framing: Framing,
    left: u64,
    chunk: Chunk,
    /// Payload bytes so far.
    pub payload: u64,
    limit: Option<u64>,
}

impl BodyReader {
    /// A reader for a body framed so, whose payload may not pass `limit` bytes. A length past
    /// the limit is refused at once.
    pub(crate) fn new(framing: Framing, limit: Option<u64>) -> Result<BodyReader, BodyError> {
        if let (Framing::Length(n), Some(l)) = (framing, limit) {
            if n > l {
                return Err(BodyError::TooLarge(l));
            }
        }
        Ok(BodyReader {
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunk: Chunk::Size {
                value: 0,
                digits: 0,
            },
            payload: 0,
            limit,
        })
    }

    pub(crate) fn done(&self) -> bool {
        match self.framing {
            Framing::Empty => true,
            Framing::Length(_) => self.left == 0,
            Framing::Chunked => self.chunk == Chunk::Done,
            Framing::UntilClose => false,
        }
    }

    /// Takes from `input` what belongs to the body, appending what to send on to `out`; returns
    /// how many bytes of `input` it took (the rest is the next message).
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        match self.framing {
            Framing::Empty => Ok(0),
            Framing::Length(_) => {
                let n = (self.left.min(input.len() as u64)) as usize;
                out.extend_from_slice(&input[..n]);
                self.left -= n as u64;
                self.payload += n as u64;
                Ok(n)
            }
            Framing::UntilClose => {
                out.extend_from_slice(input);
                self.payload += input.len() as u64;
                Ok(input.len())
            }
            Framing::Chunked => self.feed_chunked(input, out),
        }
    }

    fn feed_chunked(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        let bad = |why| Err(BodyError::Malformed(why));
        let mut at = 0;
        while at < input.len() {
            let b = input[at];
            self.chunk = match self.chunk {
                Chunk::Done => return Ok(at),
                Chunk::Data { left } => {
                    let n = left.min((input.len() - at) as u64) as usize;
                    out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    out.extend_from_slice(&input[at..at + n]);
                    out.extend_from_slice(b"\r\n");
                    self.payload += n as u64;
                    at += n;
                    self.chunk = if left == n as u64 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data {
                            left: left - n as u64,
                        }
                    };
                    continue;
                }
                Chunk::Size { value, digits } => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if digits >= 16 {
                            return bad("a chunk size of more than 16 hex digits");
                        }
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        Chunk::Size {
                            value: value << 4 | d,
                            digits: digits + 1,
                        }
                    }
                    b';' | b' ' | b'\t' if digits > 0 => Chunk::Ext { value, len: 0 },
                    b'\r' if digits > 0 => Chunk::SizeLf { value },
                    _ => return bad("a chunk size that is not hexadecimal"),
                },
                Chunk::Ext { value, len } => match b {
                    b'\r' => Chunk::SizeLf { value },
                    b'\n' | 0..=8 | 0x0a..=0x1f | 0x7f => {
                        return bad("a control character in a chunk extension")
                    }
                    _ if len >= MAX_CHUNK_LINE => {
                        return bad("a chunk extension longer than 4 KiB")
                    }
                    _ => Chunk::Ext {
                        value,
                        len: len + 1,
                    },
                },
                Chunk::SizeLf { value } => {
                    if b != b'\n' {
                        return bad("a chunk-size line not ended by CRLF");
                    }
                    if value == 0 {
                        Chunk::Trailer {
                            empty: true,
                            seen: 0,
                        }
                    } else {
                        if let Some(l) = self.limit {
                            if self.payload.saturating_add(value) > l {
                                return Err(BodyError::TooLarge(l));
                            }
                        }
                        Chunk::Data { left: value }
                    }
                }
                Chunk::DataCr if b == b'\r' => Chunk::DataLf,
                Chunk::DataLf if b == b'\n' => Chunk::Size {
                    value: 0,
                    digits: 0,
                },
                Chunk::DataCr | Chunk::DataLf => return bad("chunk data not followed by CRLF"),
                Chunk::Trailer { empty, seen } => {
                    if seen >= MAX_TRAILERS {
                        return bad("trailers longer than 64 KiB");
                    }
                    match b {
                        b'\r' => Chunk::TrailerLf {
                            empty,
                            seen: seen + 1,
                        },
                        b'\n' => return bad("a trailer line not ended by CRLF"),
                        _ => Chunk::Trailer {
                            empty: false,
                            seen: seen + 1,
                        },
                    }
                }
                Chunk::TrailerLf { empty, seen } => {
                    if b != b'\n' {
                        return bad("a trailer line not ended by CRLF");
                    }
                    if empty {
                        out.extend_from_slice(b"0\r\n\r\n");
                        at += 1;
                        self.chunk = Chunk::Done;
                        return Ok(at);
                    }
                    Chunk::Trailer {
                        empty: true,
                        seen: seen + 1,
                    }
                }
            };
            at += 1;
        }
        Ok(at)
    }

    /// The sender closed: fine where the body ends with the connection, an error otherwise.
    pub(crate) fn eof(&self) -> Result<(), BodyError> {
        if self.framing == Framing::UntilClose || self.done() {
            Ok(())
        } else {
            Err(BodyError::Truncated)
        }
    }
}

/// The path of a request target (origin or absolute form, without the query and fragment), and
/// the target with its query shown as `?[redacted]` for the report.
pub(crate) fn target_path(target: &str) -> (String, String) {
    let lower = target
        .get(..8)
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    let rest = if lower.starts_with("http://") {
        &target[7..]
    } else if lower.starts_with("https://") {
        &target[8..]
    } else {
        ""
    };
    let origin = if lower.starts_with("http") && !rest.is_empty() {
        match rest.find(['/', '?', '#']) {
            Some(i) if rest.as_bytes()[i] == b'/' => &rest[i..],
            Some(i) => &rest[i..],
            None => "/",
        }
    } else {
        target
    };
    let end = origin.find(['?', '#']).unwrap_or(origin.len());
    let mut path = origin[..end].to_owned();
    if path.is_empty() {
        path = "/".into();
    }
    let shown = if end < origin.len() && origin.as_bytes()[end] == b'?' {
        format!("{path}?[redacted]")
    } else {
        path.clone()
    };
    (path, shown)
}

/// What a client asks the HTTP proxy listener for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProxyRequest {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: String, port: u16 },
    /// `GET http://host[:port]/path`: one request, forwarded in origin form.
    Forward {
        host: String,
        port: u16,
        /// `host[:port]` as sent, for a `Host` header when the request has none.
        authority: String,
        /// The path and query, `/` at least.
        path: String,
    },
}

/// Reads what a proxy request head asks for; the error is the client's answer (`400`).
pub(crate) fn proxy_request(head: &Head) -> Result<ProxyRequest, &'static str> {
    if head.method == "CONNECT" {
        let (host, port) = split_authority(&head.target, 443).ok_or("CONNECT needs HOST:PORT")?;
        return Ok(ProxyRequest::Connect {
            host: host.to_owned(),
            port,
        });
    }
    let t = &head.target;
    let rest = t
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &t[7..])
        .ok_or("a proxy request needs an absolute http:// URL (use CONNECT for TLS)")?;
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    let (host, port) =
        split_authority(authority, 80).ok_or("the URL's host[:port] does not parse")?;
    Ok(ProxyRequest::Forward {
        host: host.to_owned(),
        port,
        authority: authority.to_owned(),
        path,
    })
}

/// The head sent upstream for a forwarded request: origin form, the client's headers but
/// `Proxy-*`, `Connection` and `Keep-Alive`, a `Host` if it had none, and `Connection: close`, so
/// that the connection carries exactly this one request. Lines end in CRLF whatever the client
/// used.
pub(crate) fn forward_head(head: &Head, authority: &str, path: &str) -> Vec<u8> {
    let mut out = format!("{} {path} HTTP/1.{}\r\n", head.method, head.version).into_bytes();
    let mut has_host = false;
    for (name, value) in &head.headers {
        let n = name.to_ascii_lowercase();
        if n.starts_with("proxy-") || n == "connection" || n == "keep-alive" {
            continue;
        }
        has_host |= n == "host";
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// `host:port` or `[v6]:port` (or without the port: `default`); `None` if the port is not digits
/// (RFC 3986's `port = *DIGIT`: Rust's own parse takes `+43` for 43, while [`strip_port`], which
/// finds the host a `Host` header names, keeps `:+43` as part of the host; found by the fuzzer)
/// or does not fit, or an IPv6 address lacks its brackets.
pub(crate) fn split_authority(a: &str, default: u16) -> Option<(&str, u16)> {
    fn port(p: &str) -> Option<u16> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    }
    if a.starts_with('[') {
        let end = a.find(']')?;
        let port = match &a[end + 1..] {
            "" => default,
            p => port(p.strip_prefix(':')?)?,
        };
        return Some((&a[..end + 1], port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h, port(p)?)),
        Some(_) => None,
        None => Some((a, default)),
    }
}

/// Parses a TLS ClientHello from the start of a connection; `None` while incomplete, `Some(None)`
/// when complete without a server name (or not a ClientHello at all).
pub(crate) fn tls_server_name(buf: &[u8]) -> Option<Option<String>> {
    // Gather the handshake bytes across records (a ClientHello may span several).
    let mut hs = Vec::new();
    let mut at = 0;
    loop {
        if buf.len() < at + 5 {
            return None;
        }
        if buf[at] != 0x16 {
            return Some(None);
        }
        let len = u16::from_be_bytes([buf[at + 3], buf[at + 4]]) as usize;
        if buf.len() < at + 5 + len {
            return None;
        }
        hs.extend_from_slice(&buf[at + 5..at + 5 + len]);
        at += 5 + len;
        if hs.len() >= 4 {
            if hs[0] != 1 {
                return Some(None);
            }
            let body = u32::from_be_bytes([0, hs[1], hs[2], hs[3]]) as usize;
            if hs.len() >= 4 + body {
                return Some(client_hello_sni(&hs[4..4 + body]));
            }
            if body > 1 << 16 {
                return Some(None);
            }
        }
    }
}

fn client_hello_sni(b: &[u8]) -> Option<String> {
    let mut r = Reader(b);
    r.take(2 + 32)?; // version, random
    let sid = r.u8()? as usize;
    r.take(sid)?;
    let cs = r.u16()? as usize;
    r.take(cs)?;
    let cm = r.u8()? as usize;
    r.take(cm)?;
    let ext_len = r.u16()? as usize;
    let mut ext = Reader(r.take(ext_len)?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let len = ext.u16()? as usize;
        let data = ext.take(len)?;
        if kind == 0 {
            let mut s = Reader(data);
            let list = s.u16()? as usize;
            let mut l = Reader(s.take(list)?);
            while !l.0.is_empty() {
                let t = l.u8()?;
                let n = l.u16()? as usize;
                let name = l.take(n)?;
                if t == 0 {
                    return std::str::from_utf8(name).ok().map(str::to_owned);
                }
            }
        }
    }
    None
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

/// A DNS question: the query's id, name (as sent, without the root dot), type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Question {
    pub(crate) id: u16,
    pub(crate) rd: bool,
    pub(crate) name: String,
    pub(crate) qtype: u16,
    /// The question section's bytes, echoed in the answer.
    pub(crate) raw: Vec<u8>,
}

pub(crate) const TYPE_A: u16 = 1;

/// Parses a standard query with one question; `None` for anything else.
pub(crate) fn dns_question(msg: &[u8]) -> Option<Question> {
    if msg.len() < 12 || msg[2] & 0xf8 != 0 || u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None; // a response, an opcode other than QUERY, or not exactly one question
    }
    let mut at = 12;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let n = *msg.get(at)? as usize;
        at += 1;
        if n == 0 {
            break;
        }
        if n > 63 {
            return None; // compression pointers do not belong in a question
        }
        let l = msg.get(at..at + n)?;
        labels.push(String::from_utf8_lossy(l).into_owned());
        at += n;
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    msg.get(at + 2..at + 4)?;
    Some(Question {
        id: u16::from_be_bytes([msg[0], msg[1]]),
        rd: msg[2] & 1 != 0,
        name: labels.join("."),
        qtype,
        raw: msg[12..at + 4].to_vec(),
    })
}

/// The stub's answer: `rcode` 0 (with `a` as the A record, if any) or 3 (NXDOMAIN).
pub(crate) fn dns_answer(q: &Question, rcode: u8, a: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&q.id.to_be_bytes());
    out.push(0x84 | q.rd as u8); // response, authoritative
    out.push(0x80 | rcode); // recursion available
    out.extend_from_slice(&[0, 1, 0, a.is_some() as u8, 0, 0, 0, 0]);
    out.extend_from_slice(&q.raw);
    if let Some(a) = a {
        out.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        out.extend_from_slice(&a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> Option<Sniffed> {
        sniff(t.as_bytes())
    }

    fn host(h: &str) -> Option<Sniffed> {
        Some(Sniffed::Http(Ok(Some(h.into()))))
    }

    #[test]
    fn an_ambiguous_http_host_is_told_apart() {
        assert_eq!(
            s("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            host("a.example")
        );
        assert_eq!(
            s("GET / HTTP/1.1\r\nHost: a.example\r\nhost: b.example\r\n\r\n"),
            Some(Sniffed::Http(Err(HostError::Several(
                "a.example, b.example".into()
            ))))
        );
        assert!(matches!(
            s("GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Some(Sniffed::Http(Err(HostError::TargetDiffers { .. })))
        ));
        assert!(matches!(
            s("GET HTTPS://user@b.example:8443/x HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Some(Sniffed::Http(Err(HostError::TargetDiffers { .. })))
        ));
        assert_eq!(
            s("GET http://a.example:80/x HTTP/1.1\r\nHost: A.example\r\n\r\n"),
            host("A.example")
        );
        assert_eq!(
            s("GET http://a.example./x HTTP/1.1\r\nHost: A.EXAMPLE\r\n\r\n"),
            host("A.EXAMPLE"),
            "the same host once normalized"
        );
        assert_eq!(
            s("GET http://a.example/x HTTP/1.1\r\n\r\n"),
            host("a.example")
        );
        assert_eq!(s("GET / HTTP/1.0\r\n\r\n"), Some(Sniffed::Http(Ok(None))));
    }

    #[test]
    fn a_head_is_read_the_way_a_lenient_server_reads_it() {
        // A bare LF ends a line (RFC 9112 §2.2): the second Host is a header of its own.
        assert!(matches!(
            s("GET / HTTP/1.1\r\nHost: a.example\r\nX: a\nHost: b.example\r\n\r\n"),
            Some(Sniffed::Http(Err(HostError::Several(_))))
        ));
        // ... and two bare LFs end the head.
        assert_eq!(s("GET / HTTP/1.1\nHost: b.example\n\n"), host("b.example"));
        // Empty lines before the request line are skipped, as servers do.
        assert_eq!(
            s("\r\n\r\nGET / HTTP/1.1\r\nHost: b.example\r\n\r\n"),
            host("b.example")
        );
        assert_eq!(s("\r\n"), None);
        // A lower-case method, or one with a dash, is a request too.
        assert_eq!(
            s("get / HTTP/1.1\r\nHost: b.example\r\n\r\n"),
            host("b.example")
        );
        assert_eq!(
            s("VERSION-CONTROL / HTTP/1.1\r\nHost: b.example\r\n\r\n"),
            host("b.example")
        );
        // Whatever a lenient server might take for a request, and we cannot parse, is refused.
        for bad in [
            "GET\t/ HTTP/1.1\r\nHost: b.example\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: b.example\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.example\r\n b.example\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : b.example\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: b.example\r\n\r\n",
        ] {
            assert!(
                matches!(s(bad), Some(Sniffed::Http(Err(HostError::Malformed(_))))),
                "{bad:?}: {:?}",
                s(bad)
            );
        }
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n"),
            Some(Sniffed::Http(Err(HostError::Malformed(_))))
        ));
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(
            s(&many),
            Some(Sniffed::Http(Err(HostError::Malformed(_))))
        ));
        // Not HTTP: other protocols pass on as they are.
        assert_eq!(
            s("SSH-2.0-OpenSSH_9.6p1 Ubuntu-3\r\n"),
            Some(Sniffed::Other)
        );
        assert_eq!(s(&"A".repeat(MAX_METHOD + 1)), Some(Sniffed::Other));
        // ... and stays other whatever follows (the fuzz target found a head that did not).
        let long = format!("{} / HTTP/1.1\r\n\r\n", "A".repeat(MAX_METHOD + 1));
        assert_eq!(s(&long), Some(Sniffed::Other));
        assert_eq!(s("GET"), None);
        assert_eq!(s("GET / HTTP/1.1\r\nHost: b.example\r\n"), None);
    }

    #[test]
    fn ambiguity_messages_are_escaped_and_cut() {
        let head = format!(
            "GET / HTTP/1.1\r\nHost: a\u{202e}b\u{85}\r\nHost: {}\r\n\r\n",
            "b".repeat(1000)
        );
        let Some(Sniffed::Http(Err(e))) = s(&head) else {
            panic!("{:?}", s(&head))
        };
        let shown = e.to_string();
        assert!(shown.contains("a\\u{202e}b\\u{85}"), "{shown}");
        assert!(
            !shown.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{shown}"
        );
        assert!(shown.len() < 400, "{}", shown.len());
    }

    #[test]
    fn proxy_requests_and_what_goes_upstream() {
        let head = |t: &str| parse_head(t.as_bytes()).unwrap().unwrap();
        let h = head("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n");
        assert_eq!(
            proxy_request(&h),
            Ok(ProxyRequest::Connect {
                host: "[2001:db8::1]".into(),
                port: 8443
            })
        );
        assert!(proxy_request(&head("CONNECT a:b:c HTTP/1.1\r\n\r\n")).is_err());
        // A port is digits only: `+43` would be checked as port 43 while the host a `Host`
        // check finds keeps `:+43` (the fuzzer's proxy_request regression).
        for bad in [
            "CONNECT example.org:+443 HTTP/1.1\r\n\r\n",
            "CONNECT [2001:db8::1]:+443 HTTP/1.1\r\n\r\n",
            "GET http://example.org:+43/ HTTP/1.1\r\n\r\n",
            "GET http://example.org:/ HTTP/1.1\r\n\r\n",
            "GET http://example.org:99999/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(proxy_request(&head(bad)).is_err(), "{bad}");
        }
        assert!(proxy_request(&head("GET /x HTTP/1.1\r\n\r\n")).is_err());
        let h = head(
            "GET HTTP://a.example:8080?q=1 HTTP/1.1\nProxy-Authorization: x\nConnection: keep-alive\nX-A: b\n\n",
        );
        let r = proxy_request(&h).unwrap();
        assert_eq!(
            r,
            ProxyRequest::Forward {
                host: "a.example".into(),
                port: 8080,
                authority: "a.example:8080".into(),
                path: "/?q=1".into()
            }
        );
        assert_eq!(
            String::from_utf8(forward_head(&h, "a.example:8080", "/?q=1")).unwrap(),
            "GET /?q=1 HTTP/1.1\r\nX-A: b\r\nHost: a.example:8080\r\nConnection: close\r\n\r\n"
        );
    }

    /// Feeds `input` to a reader in pieces of `step` bytes; the bytes passed on and taken.
    fn feed_in(
        r: &mut BodyReader,
        input: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, usize), BodyError> {
        let (mut out, mut took) = (Vec::new(), 0);
        for piece in input.chunks(step.max(1)) {
            let n = r.feed(piece, &mut out)?;
            took += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((out, took))
    }

    #[test]
    fn chunked_bodies_are_found_whole_and_passed_on_in_one_form() {
        let body = b"4;ext=1\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: t\r\n\r\nGET /next";
        let end = body.len() - b"GET /next".len();
        for step in [1, 2, 3, 7, 64] {
            let mut r = BodyReader::new(Framing::Chunked, None).unwrap();
            let (out, took) = feed_in(&mut r, body, step).unwrap();
            assert!(r.done(), "step {step}");
            assert_eq!(took, end, "step {step}: the next request is left");
            assert_eq!(r.payload, 23);
            // What goes on is canonical chunks, without the extension or the trailer.
            let mut again = BodyReader::new(Framing::Chunked, None).unwrap();
            let mut twice = Vec::new();
            assert_eq!(again.feed(&out, &mut twice).unwrap(), out.len());
            assert!(again.done() && again.payload == 23);
            assert!(
                !out.windows(3).any(|w| w == b"ext") && !out.windows(7).any(|w| w == b"Trailer")
            );
            assert!(out.ends_with(b"\r\n0\r\n\r\n"));
        }
        for bad in [
            &b"4\nWiki\r\n0\r\n\r\n"[..],
            b"g\r\n",
            b"4\r\nWikiX\r\n",
            b"11111111111111111\r\n",
            b"0\r\nX: y\n\r\n",
            b"4;\x01\r\n",
        ] {
            let mut r = BodyReader::new(Framing::Chunked, None).unwrap();
            assert!(
                matches!(feed_in(&mut r, bad, 1), Err(BodyError::Malformed(_))),
                "{bad:?}"
            );
        }
        // The limit, before the chunk's data is passed on.
        let mut r = BodyReader::new(Framing::Chunked, Some(8)).unwrap();
        assert_eq!(
            feed_in(&mut r, b"5\r\nhello\r\n5\r\nworld\r\n", 64),
            Err(BodyError::TooLarge(8))
        );
        assert_eq!(r.payload, 5);
        assert!(matches!(
            BodyReader::new(Framing::Length(9), Some(8)),
            Err(BodyError::TooLarge(8))
        ));
        let mut r = BodyReader::new(Framing::Length(3), None).unwrap();
        assert_eq!(feed_in(&mut r, b"abcdef", 2).unwrap(), (b"abc".to_vec(), 3));
        assert!(r.done() && r.eof().is_ok());
        let r = BodyReader::new(Framing::Length(3), None).unwrap();
        assert_eq!(r.eof(), Err(BodyError::Truncated));
    }

    #[test]
    fn framing_that_servers_could_read_another_way_is_refused() {
        let h = |t: &str| parse_head(t.as_bytes()).unwrap().unwrap();
        let f = |t: &str| request_framing(&h(t));
        assert_eq!(
            f("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Ok(Framing::Length(5))
        );
        assert_eq!(
            f("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"),
            Ok(Framing::Length(5))
        );
        assert_eq!(
            f("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(f("GET / HTTP/1.1\r\n\r\n"), Ok(Framing::Empty));
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(f(bad).is_err(), "{bad}");
        }
        let resp = |t: &str| parse_response(t.as_bytes()).unwrap().unwrap();
        assert_eq!(
            response_framing(
                "HEAD",
                &resp("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
            ),
            Ok(Framing::Empty)
        );
        assert_eq!(
            response_framing("GET", &resp("HTTP/1.1 304 Not Modified\r\n\r\n")),
            Ok(Framing::Empty)
        );
        assert_eq!(
            response_framing("GET", &resp("HTTP/1.1 200 OK\r\n\r\n")),
            Ok(Framing::UntilClose)
        );
        assert_eq!(
            response_framing(
                "GET",
                &resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
            ),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            target_path("/a/b?q=1#f"),
            ("/a/b".into(), "/a/b?[redacted]".into())
        );
        assert_eq!(
            target_path("HTTPS://h.example:8443/x?y"),
            ("/x".into(), "/x?[redacted]".into())
        );
        assert_eq!(target_path("http://h.example"), ("/".into(), "/".into()));
        assert_eq!(target_path("*"), ("*".into(), "*".into()));
    }

    fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(n) = sni {
            let mut list = vec![0];
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n.as_bytes());
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(&data);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 1, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn tls_server_name_is_found_and_waits_for_the_whole_hello() {
        let h = client_hello(Some("example.org"));
        assert_eq!(sniff(&h), Some(Sniffed::Tls(Some("example.org".into()))));
        assert_eq!(sniff(&h[..h.len() - 1]), None);
        assert_eq!(sniff(&client_hello(None)), Some(Sniffed::Tls(None)));
    }

    #[test]
    fn http_heads_and_other_protocols() {
        let r = b"GET / HTTP/1.1\r\nHost: Example.org:80\r\n\r\n";
        assert_eq!(sniff(r), host("Example.org"));
        assert_eq!(sniff(&r[..20]), None);
        assert_eq!(sniff(b"SSH-2.0-x\r\n"), Some(Sniffed::Other));
        assert_eq!(sniff(b"\x00\x01"), Some(Sniffed::Other));
    }

    #[test]
    fn dns_queries_parse_and_answers_echo_the_question() {
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in ["a", "example", "org"] {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let p = dns_question(&q).unwrap();
        assert_eq!(
            (p.id, p.name.as_str(), p.qtype),
            (0x1234, "a.example.org", 1)
        );
        let a = dns_answer(&p, 0, Some([127, 77, 0, 1]));
        assert_eq!(&a[..2], &[0x12, 0x34]);
        assert_eq!(&a[a.len() - 4..], &[127, 77, 0, 1]);
        assert_eq!(dns_answer(&p, 3, None)[3] & 0xf, 3);
        let mut resp = q.clone();
        resp[2] |= 0x80;
        assert!(dns_question(&resp).is_none());
    }
}
