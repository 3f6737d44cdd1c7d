//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, not part of the library's
//! API): each runs one parser the proxy applies to bytes the sandbox sends, and panics if a
//! property the proxy relies on does not hold. A panic in the supervisor (built with
//! `panic = "abort"`) would end every sandbox it runs, so "never panics" is the first property.

use crate::dns;
use crate::wire::{self, ProxyRequest, Sniffed};

/// Panics if `text` holds a character a terminal would act on.
fn assert_printable(what: &str, text: &str) {
    assert!(
        !text.chars().any(char::is_control),
        "{what} holds a control character: {text:?}"
    );
}

/// A connection's first bytes, as the transparent, CONNECT and SOCKS paths read them: the
/// classification of a prefix, once made, is the classification of every longer input (the proxy
/// decides on the first prefix that classifies), and messages are escaped.
pub fn first_bytes(data: &[u8]) {
    let whole = wire::sniff(data);
    if let Some(Sniffed::Http(Err(e))) = &whole {
        assert_printable("an ambiguity message", &e.to_string());
    }
    for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        if let Some(early) = wire::sniff(&data[..cut]) {
            assert_eq!(
                Some(&early),
                whole.as_ref(),
                "the first {cut} bytes classify differently from all {}",
                data.len()
            );
        }
    }
    if data.first() == Some(&0x16) {
        let _ = wire::tls_server_name(data);
    }
}

/// A request head on the HTTP proxy listener: what goes upstream for a forwarded request reads
/// back as one complete HTTP/1.x head, in origin form, with one host: the one that was checked.
pub fn proxy_request(data: &[u8]) {
    let Ok(Some(head)) = wire::parse_head(data) else {
        return;
    };
    assert!(head.len <= data.len());
    let Ok(ask) = wire::proxy_request(&head) else {
        return;
    };
    let ProxyRequest::Forward {
        host,
        authority,
        path,
        ..
    } = ask
    else {
        return;
    };
    if palisade_policy::net::Host::parse(&host).is_err() {
        return; // refused as a bad request
    }
    let Ok(Some(checked)) = wire::http_host(&head) else {
        return; // refused before anything goes upstream
    };
    assert!(wire::same_host(&checked, &host), "{checked} / {host}");
    let sent = wire::forward_head(&head, &authority, &path);
    // Room for the two lines the proxy may add (`Host`, `Connection: close`).
    let mut room = vec![httparse::EMPTY_HEADER; wire::MAX_HEADERS + 2];
    let again = wire::parse_head_in(&sent, &mut room)
        .unwrap_or_else(|e| panic!("the forwarded head does not parse ({e}): {sent:?}"))
        .unwrap_or_else(|| panic!("the forwarded head is incomplete: {sent:?}"));
    assert_eq!(again.len, sent.len(), "{sent:?}");
    assert_eq!((&again.method, &again.target), (&head.method, &path));
    let upstream = wire::http_host(&again)
        .unwrap_or_else(|e| panic!("the forwarded head's host is ambiguous ({e}): {sent:?}"));
    let upstream = upstream.unwrap_or_else(|| panic!("no Host went upstream: {sent:?}"));
    assert!(
        wire::same_host(&upstream, &host),
        "upstream got Host {upstream}, the check was for {host}: {sent:?}"
    );
    assert_eq!(again.values("connection").collect::<Vec<_>>(), [b"close"]);
}

/// A query to the DNS stub: the answer echoes its id and question.
pub fn dns_query(data: &[u8]) {
    let Some(q) = wire::dns_question(data) else {
        return;
    };
    for (rcode, a) in [(0, Some([127, 77, 0, 1])), (3, None)] {
        let answer = wire::dns_answer(&q, rcode, a);
        assert_eq!(answer[..2], q.id.to_be_bytes());
        assert_eq!(answer[2] & 0x80, 0x80, "a response");
        assert_eq!(answer[3] & 0x0f, rcode);
        assert_eq!(&answer[12..12 + q.raw.len()], &q.raw[..]);
    }
}

/// A reply to the supervisor's own lookup (`--dns-server`): the first two bytes are taken as the
/// query id and the third picks A or AAAA, so the fuzzer can reach past the header checks.
pub fn dns_reply(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let id = u16::from_be_bytes([data[0], data[1]]);
    let qtype = if data[2] & 1 == 0 { 1 } else { 28 };
    let mut msg = data.to_vec();
    msg[2] = 0x81; // a response to a standard query: let the fuzzer spend its bytes past it
    if let Ok(Some(reply)) = dns::parse_reply(&msg, id, "www.example", qtype) {
        let addrs = reply.addrs;
        assert!(
            addrs.iter().all(|a| a.is_ipv4() == (qtype == 1)),
            "{addrs:?}"
        );
    }
}

/// A request body read off a stream: the first byte picks the framing (a length, or chunked)
/// and how the stream is cut into reads. Properties: the same bytes taken and passed on however
/// the stream is cut; never more taken than given; and what is passed on for a chunked body
/// reads back, whole, as the same payload (so the next hop finds its end where the proxy did).
pub fn http_body(data: &[u8]) {
    use crate::wire::{BodyReader, Framing};
    let Some((&ctl, input)) = data.split_first() else {
        return;
    };
    let framing = if ctl & 1 == 0 {
        Framing::Chunked
    } else {
        Framing::Length(u64::from(ctl >> 1) * 37)
    };
    let limit = (ctl & 0x80 != 0).then_some(u64::from(ctl & 0x7f) * 13);
    let step = usize::from(ctl >> 4) + 1;
    let run = |step: usize| {
        let Ok(mut r) = BodyReader::new(framing, limit) else {
            return (None, Vec::new(), 0, 0);
        };
        let (mut out, mut took) = (Vec::new(), 0usize);
        for piece in input.chunks(step) {
            match r.feed(piece, &mut out) {
                Ok(n) => {
                    assert!(n <= piece.len());
                    took += n;
                    if n < piece.len() {
                        break;
                    }
                }
                Err(e) => return (Some(e), out, took, r.payload),
            }
        }
        (None, out, took, r.payload)
    };
    let (e1, out1, took1, pay1) = run(input.len().max(1));
    let (e2, out2, took2, pay2) = run(step);
    assert_eq!(e1, e2, "an error depends on how the stream was cut");
    if e1.is_none() {
        assert_eq!((took1, pay1), (took2, pay2), "cut at {step}");
        assert!(took1 <= input.len());
        if framing == Framing::Chunked {
            let mut again = BodyReader::new(Framing::Chunked, None).expect("no limit");
            let mut twice = Vec::new();
            let n = again
                .feed(&out1, &mut twice)
                .unwrap_or_else(|e| panic!("what the proxy passed on does not read back: {e}"));
            assert_eq!(n, out1.len());
            assert_eq!(again.payload, pay1);
        } else {
            assert_eq!(out1, out2);
            assert_eq!(out1.len() as u64, pay1);
        }
    }
}

/// A request head on a connection the proxy reads: never a panic; what goes on reads back as
/// the same request; a secret's placeholder goes nowhere but its host, and its value nowhere
/// else; HTTP rules decide without panicking.
pub fn http_request(data: &[u8]) {
    use palisade_policy::http::{HttpRule, Secret, SecretValue};
    use palisade_policy::net::{Host, NetRule, Network};
    let Ok(Some(mut head)) = wire::parse_head(data) else {
        return;
    };
    let _ = wire::request_framing(&head);
    let (path, shown) = wire::target_path(&head.target);
    assert!(
        !shown.contains('?') || shown.ends_with("?[redacted]"),
        "{shown}"
    );
    assert_printable("a shown path", &crate::bounded(&shown, 256));
    let host = Host::parse("api.example.org").expect("a name");
    let mut net = Network::default();
    net.allow
        .push(NetRule::parse("t", "*.example.org").expect("a rule"));
    net.http
        .push(HttpRule::parse("t", "GET,HEAD api.example.org/v1/**").expect("a rule"));
    let _ = net.http_decide(&host, 443, &head.method, &path);
    let _ = crate::http::check_host(&host, &wire::http_host(&head), false, true);
    let mut s = Secret::parse("t", "TOKEN@api.example.org").expect("a secret");
    s.value = Some(SecretValue::new("the-real-value").expect("a value"));
    let secrets = crate::secrets::Secrets::new(&[s]).expect("randomness");
    // The fuzzer cannot guess the placeholder: put it where the input has `PH`.
    let ph = secrets.placeholders()[0].1.clone();
    for (_, v) in head.headers.iter_mut() {
        if let Some(i) = v.windows(2).position(|w| w == b"PH") {
            v.splice(i..i + 2, ph.bytes());
        }
    }
    let other = Host::parse("other.example.org").expect("a name");
    let before = head.clone();
    let mut elsewhere = head.clone();
    if secrets.apply(&mut elsewhere, &other, 443, true).is_ok() {
        let sent = wire::serialize_head(&elsewhere);
        assert!(
            !sent.windows(14).any(|w| w == b"the-real-value")
                || data.windows(14).any(|w| w == b"the-real-value")
        );
    } else {
        assert_eq!(elsewhere, before, "a refused head is left as it was");
    }
    let _ = secrets.apply(&mut head, &host, 443, true);
    let sent = wire::serialize_head(&head);
    let mut room = vec![httparse::EMPTY_HEADER; wire::MAX_HEADERS];
    if let Ok(Some(again)) = wire::parse_head_in(&sent, &mut room) {
        assert_eq!(again.len, sent.len());
        assert_eq!((&again.method, &again.target), (&head.method, &head.target));
        assert_eq!(again.headers.len(), head.headers.len());
    }
}

/// HTTP rules and secrets as written: never a panic; what parses prints as text that parses
/// back to the same value; matching any path never panics and takes time in proportion.
pub fn http_rules(data: &[u8]) {
    use palisade_policy::http::{HttpRule, Secret};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (rule, path) = text.split_once('\n').unwrap_or((text, "/"));
    if let Ok(r) = HttpRule::parse("fuzz", rule) {
        let shown = r.to_string();
        assert_eq!(HttpRule::parse("fuzz", &shown).as_ref(), Ok(&r), "{shown}");
        let _ = r.allows("GET", path);
        let _ = palisade_policy::http::ambiguous_path(path);
    }
    if let Ok(s) = Secret::parse("fuzz", rule) {
        let shown = s.to_string();
        assert_eq!(Secret::parse("fuzz", &shown).as_ref(), Ok(&s), "{shown}");
    }
}
