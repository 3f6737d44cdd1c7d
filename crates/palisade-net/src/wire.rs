//! Parsers for what a client sends first: the TLS ClientHello's server name, an HTTP request head,
//! and DNS queries (with the stub's answers). Pure functions over bytes, no I/O.

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello, with its server name if it has one.
    Tls(Option<String>),
    /// An HTTP request, with its `Host` header (port removed) if it has one, or the host of an
    /// absolute-form request target when there is no `Host`.
    Http(Option<String>),
    /// An HTTP request whose host is ambiguous, with why: more than one `Host` header, or an
    /// absolute-form target naming another host than `Host` (RFC 9112 §3.2: a server then uses
    /// the target's, so checking `Host` alone would be fooled).
    HttpAmbiguous(String),
    /// Something else, or nothing within the wait.
    Other,
}

impl Sniffed {
    pub fn protocol(&self) -> &'static str {
        match self {
            Sniffed::Tls(_) => "tls",
            Sniffed::Http(_) | Sniffed::HttpAmbiguous(_) => "http",
            Sniffed::Other => "other",
        }
    }
}

/// Whether `buf` holds enough to classify it: `None` means read more.
pub fn sniff(buf: &[u8]) -> Option<Sniffed> {
    if buf.is_empty() {
        return None;
    }
    if buf[0] == 0x16 {
        return tls_server_name(buf).map(Sniffed::Tls);
    }
    let method = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if method > 0 && method < buf.len() {
        if buf[method] != b' ' {
            return Some(Sniffed::Other);
        }
        return head_end(buf).map(|end| match http_host(&buf[..end]) {
            Ok(h) => Sniffed::Http(h),
            Err(why) => Sniffed::HttpAmbiguous(why),
        });
    }
    if method == buf.len() && method < 16 {
        return None;
    }
    Some(Sniffed::Other)
}

/// The end of an HTTP head (index after the blank line), if complete.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Every value of a header (case-insensitive name) in an HTTP head, in order.
pub fn headers(head: &[u8], name: &str) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(head) else {
        return Vec::new();
    };
    text.split("\r\n")
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
        .collect()
}

/// The host an HTTP request head is for (port removed): its one `Host` header, checked against
/// an absolute-form request target if there is one (the target's host alone when there is no
/// `Host`). An error says why the host is ambiguous: servers differ on which of several `Host`
/// headers they use, and use an absolute target's host over `Host` (RFC 9112 §3.2, §3.2.2).
///
/// ```
/// use palisade_net::wire::http_host;
/// let h = |s: &str| http_host(s.as_bytes());
/// assert_eq!(h("GET / HTTP/1.1\r\nHost: a.example:80\r\n\r\n"), Ok(Some("a.example".into())));
/// assert!(h("GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n").is_err());
/// assert!(h("GET http://b.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n").is_err());
/// assert_eq!(h("GET http://A.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n"), Ok(Some("a.example".into())));
/// ```
pub fn http_host(head: &[u8]) -> Result<Option<String>, String> {
    let hosts = headers(head, "host");
    if hosts.len() > 1 {
        return Err(format!("more than one Host header ({})", hosts.join(", ")));
    }
    let host = hosts.into_iter().next().map(strip_port);
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let target = String::from_utf8_lossy(line)
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let lower = target.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return Ok(host);
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let target_host = strip_port(authority.to_owned());
    match host {
        None => Ok(Some(target_host)),
        Some(h) if h.eq_ignore_ascii_case(&target_host) => Ok(Some(h)),
        Some(h) => Err(format!(
            "request target `{target}` names another host than Host `{h}`"
        )),
    }
}

/// A `Host` value without its port.
pub fn strip_port(h: String) -> String {
    if h.starts_with('[') {
        return h
            .split_once(']')
            .map_or(h.clone(), |(a, _)| format!("{a}]"));
    }
    match h.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => a.to_owned(),
        _ => h,
    }
}

/// Parses a TLS ClientHello from the start of a connection; `None` while incomplete, `Some(None)`
/// when complete without a server name (or not a ClientHello at all).
pub fn tls_server_name(buf: &[u8]) -> Option<Option<String>> {
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
pub struct Question {
    pub id: u16,
    pub rd: bool,
    pub name: String,
    pub qtype: u16,
    /// The question section's bytes, echoed in the answer.
    pub raw: Vec<u8>,
}

pub const TYPE_A: u16 = 1;

/// Parses a standard query with one question; `None` for anything else.
pub fn dns_question(msg: &[u8]) -> Option<Question> {
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
pub fn dns_answer(q: &Question, rcode: u8, a: Option<[u8; 4]>) -> Vec<u8> {
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

    #[test]
    fn an_ambiguous_http_host_is_told_apart() {
        let s = |t: &str| sniff(t.as_bytes());
        assert_eq!(
            s("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Some(Sniffed::Http(Some("a.example".into())))
        );
        assert!(matches!(
            s("GET / HTTP/1.1\r\nHost: a.example\r\nhost: b.example\r\n\r\n"),
            Some(Sniffed::HttpAmbiguous(w)) if w.contains("more than one Host")
        ));
        assert!(matches!(
            s("GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Some(Sniffed::HttpAmbiguous(w)) if w.contains("names another host")
        ));
        assert!(matches!(
            s("GET HTTPS://user@b.example:8443/x HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Some(Sniffed::HttpAmbiguous(_))
        ));
        assert_eq!(
            s("GET http://a.example:80/x HTTP/1.1\r\nHost: A.example\r\n\r\n"),
            Some(Sniffed::Http(Some("A.example".into())))
        );
        assert_eq!(
            s("GET http://a.example/x HTTP/1.1\r\n\r\n"),
            Some(Sniffed::Http(Some("a.example".into())))
        );
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
        assert_eq!(sniff(r), Some(Sniffed::Http(Some("Example.org".into()))));
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
