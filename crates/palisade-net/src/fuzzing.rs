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
