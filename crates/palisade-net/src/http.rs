//! Requests the proxy reads, one at a time, on a connection it holds both ends of: plain HTTP,
//! and TLS it terminated (inspection). Each request is checked before any of it goes upstream:
//! its host must be the connection's (so a keep-alive connection cannot switch hosts, and a
//! `Host` inside TLS must be the TLS name), the HTTP rules must allow its method and path, its
//! body must fit `network.max_body`, and a secret's placeholder must be going to that secret's
//! host, where the proxy puts the value in. A refusal is a `403` (or `400`, `502`) with the reason,
//! and the connection closes. Every request is an event with its method, path (the query left
//! out), status, bytes and the rule that allowed it.
//!
//! What it can make the supervisor spend: one request head of at most [`MAX_HEAD`] bytes, one
//! response head as large, a 16 KiB copy buffer, and rustls's bounded buffers; a head must be
//! complete within [`crate::FIRST_BYTES`] of its first byte; bodies stream through, chunked ones
//! decoded and encoded again in one canonical form so that the server finds the end of a
//! request exactly where the proxy did. Between requests the connection waits like a relay, until
//! either side closes it or the run ends.

use crate::relay::{self, CpuMeter, Wake};
use crate::secrets::Elsewhere;
use crate::tls::{HandshakeError, Peer};
use crate::wire::{self, BodyError, BodyReader, Head, HostError};
use crate::{Decision, Event, Protocol, Reason, Request, Shared, Via, CONNECT_TIMEOUT, MAX_HEAD};
use palisade_policy::net::Host;
use palisade_policy::untrusted::Untrusted;
use rustix::event::PollFd;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes moved per read.
const CHUNK: usize = 32 * 1024;
/// Most characters of a request's method and path that an event shows.
const SHOWN_METHOD: usize = 32;
const SHOWN_PATH: usize = 256;

/// The upstream end.
pub(crate) enum Upstream {
    /// Ready for requests.
    Ready(Peer),
    /// Connected; TLS to the host is set up when the first request has been checked, so that a
    /// certificate that does not verify can be answered with a `502` saying so.
    Tls {
        sock: TcpStream,
        name: rustls::pki_types::ServerName<'static>,
    },
    Gone,
}

/// One connection's requests.
pub(crate) struct Exchange<'a> {
    pub(crate) sh: &'a Shared,
    pub(crate) via: Via,
    pub(crate) host: Host,
    pub(crate) port: u16,
    pub(crate) address: Option<String>,
    /// The sandbox's side is TLS the proxy terminated.
    pub(crate) tls: bool,
    /// A request from the HTTP proxy listener in absolute form (its URL's `host[:port]` and
    /// path): it goes upstream in origin form, without `Proxy-*` headers, and is the
    /// connection's only request.
    pub(crate) forward: Option<(String, String)>,
    /// The connection's counters: every request's bytes.
    pub(crate) out: Arc<AtomicU64>,
    pub(crate) inn: Arc<AtomicU64>,
}

/// A refusal of one request: the status, the code and the text.
struct Refusal {
    status: &'static str,
    reason: Reason,
    detail: String,
}

fn refuse(status: &'static str, reason: Reason, detail: impl Into<String>) -> Refusal {
    Refusal {
        status,
        reason,
        detail: detail.into(),
    }
}

/// How one request ended for the connection.
enum Next {
    /// The connection may carry another request.
    More,
    /// The connection is done (closed, refused, or the run is ending).
    End,
}

/// The event of one request, filled in as it goes.
struct Req {
    ev: Event,
    out: u64,
    inn: u64,
}

impl Exchange<'_> {
    /// Serves requests on the connection until either side closes, a request is refused, or the
    /// proxy stops. `pending`: what the client sent that was read already (plaintext).
    pub(crate) fn run(
        &self,
        client: &mut Peer,
        mut up: Upstream,
        mut pending: Vec<u8>,
        meter: &mut CpuMeter<'_>,
    ) {
        // Heads and bodies go out as separate writes: without this, each waits for the peer's
        // delayed acknowledgment of the one before (40 ms a request on Linux).
        let _ = client.sock.set_nodelay(true);
        match &up {
            Upstream::Ready(u) => {
                let _ = u.sock.set_nodelay(true);
            }
            Upstream::Tls { sock, .. } => {
                let _ = sock.set_nodelay(true);
            }
            Upstream::Gone => {}
        }
        let mut first = true;
        loop {
            let head = match self.read_head(client, &up, &mut pending, first, meter) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(r) => {
                    let ev = self.event(None);
                    self.answer(client, Req { ev, out: 0, inn: 0 }, r);
                    break;
                }
            };
            first = false;
            pending.drain(..head.len);
            match self.one(client, &mut up, head, &mut pending, meter) {
                Next::More if self.forward.is_none() => {}
                _ => break,
            }
        }
        client.close();
        if let Upstream::Ready(u) = &mut up {
            u.close();
        }
    }

    /// A new event for this connection, for a request `head` (or none yet).
    fn event(&self, head: Option<&Head>) -> Event {
        let mut ev = crate::event(self.via, "", self.port);
        ev.host = self.host.to_string();
        ev.address.clone_from(&self.address);
        ev.protocol = Some(if self.tls {
            Protocol::Tls
        } else {
            Protocol::Http
        });
        ev.inspected = self.tls;
        if let Some(h) = head {
            let (_, shown) = wire::target_path(&h.target);
            ev.request = Some(Box::new(Request {
                method: Untrusted::new(&h.method).max(SHOWN_METHOD).to_string(),
                path: Untrusted::new(&shown).max(SHOWN_PATH).to_string(),
                status: None,
                rule: None,
                secrets: Vec::new(),
            }));
        }
        ev
    }

    /// Records a refused request and answers it; the connection then closes.
    fn answer(&self, client: &mut Peer, mut r: Req, why: Refusal) {
        r.ev.decision = Decision::Denied;
        r.ev.reason = why.reason;
        r.ev.detail = self.detail(&r.ev, &why.detail);
        let body = format!(
            "palisade: {}: {}\n",
            why.reason,
            crate::bounded(&r.ev.detail, crate::MAX_DETAIL_CHARS)
        );
        let msg = format!(
            "HTTP/1.1 {}\r\nX-Palisade-Denied: {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            why.status,
            why.reason,
            body.len()
        );
        if let Some(q) = r.ev.request.as_mut() {
            q.status = why.status.split(' ').next().and_then(|c| c.parse().ok());
        }
        r.ev.bytes_out = r.out;
        r.ev.bytes_in = r.inn + msg.len() as u64;
        self.sh.record(r.ev);
        let _ = client.write_all(self.sh, msg.as_bytes());
    }

    /// `text` with the request it is about in front.
    fn detail(&self, ev: &Event, text: &str) -> String {
        match &ev.request {
            Some(q) => format!("{} {}: {text}", q.method, q.path),
            None => text.to_owned(),
        }
    }

    /// Reads the next request head (appending to `buf`): `None` when the client closed between
    /// requests, the server closed the idle connection, or the proxy stops. A head must be
    /// complete within the first-bytes time of its first byte (the first request's, of the
    /// connection), and within [`MAX_HEAD`].
    fn read_head(
        &self,
        c: &mut Peer,
        up: &Upstream,
        buf: &mut Vec<u8>,
        first: bool,
        meter: &mut CpuMeter<'_>,
    ) -> Result<Option<Head>, Refusal> {
        let sh = self.sh;
        let incomplete = |why: &str, buf: &[u8]| {
            refuse(
                "400 Bad Request",
                Reason::IncompleteRequest,
                format!("{why}: {}", Untrusted::new(buf).max(48)),
            )
        };
        let mut deadline =
            (first || !buf.is_empty()).then(|| Instant::now() + sh.limits.first_bytes);
        let mut chunk = [0u8; 4096];
        loop {
            if buf.iter().any(|b| !matches!(b, b'\r' | b'\n')) {
                match wire::parse_head(buf) {
                    Ok(Some(h)) => return Ok(Some(h)),
                    Ok(None) => {}
                    Err(why) => {
                        return Err(refuse(
                            "400 Bad Request",
                            Reason::BadRequest,
                            format!("a malformed request head ({why})"),
                        ))
                    }
                }
            }
            if buf.len() >= MAX_HEAD {
                return Err(incomplete("a request head larger than 64 KiB", buf));
            }
            let want = chunk.len().min(MAX_HEAD - buf.len());
            match c.read_now(&mut chunk[..want]) {
                Ok(Some(0)) if buf.iter().all(|b| matches!(b, b'\r' | b'\n')) => return Ok(None),
                Ok(Some(0)) => {
                    return Err(incomplete(
                        "the client closed before its request head was complete",
                        buf,
                    ))
                }
                Ok(Some(n)) => {
                    buf.extend_from_slice(&chunk[..n]);
                    deadline.get_or_insert_with(|| Instant::now() + sh.limits.first_bytes);
                    continue;
                }
                Ok(None) => {}
                Err(_) => return Ok(None),
            }
            let mut fds = vec![c.poll_fd(c.interest(true, false))];
            // An idle server that closes its end: the client's connection closes too, as it
            // would without the proxy (a client retries a request on a fresh connection then).
            if let Upstream::Ready(u) = up {
                fds.push(u.poll_fd(rustix::event::PollFlags::IN));
            }
            let (woke, seen) = relay::wait_seen(sh, &fds, deadline);
            let upstream_said = seen & 2 != 0;
            drop(fds);
            meter.tick();
            match woke {
                Wake::Stop => return Ok(None),
                Wake::Deadline => {
                    return Err(incomplete(
                        "no complete request head within the time allowed",
                        buf,
                    ))
                }
                Wake::Ready if upstream_said && buf.is_empty() => return Ok(None),
                Wake::Ready => {}
            }
        }
    }

    /// Checks a request: the host, the HTTP rules, the body's framing and size, the secrets
    /// (put in place when they go here). `Ok`: the rule that allowed it, the secrets used, the
    /// body reader.
    fn check(&self, head: &mut Head) -> Result<(Option<String>, Vec<String>, BodyReader), Refusal> {
        let sh = self.sh;
        let forbidden = |reason, detail: String| refuse("403 Forbidden", reason, detail);
        if head.method == "CONNECT" {
            return Err(forbidden(
                Reason::BadRequest,
                "CONNECT inside a connection the proxy reads (open another connection to the proxy)".into(),
            ));
        }
        check_host(
            &self.host,
            &wire::http_host(head),
            self.forward.is_some(),
            self.tls,
        )
        .map_err(|(reason, detail)| forbidden(reason, detail))?;
        let (path, _) = wire::target_path(&head.target);
        let rule = sh
            .net
            .http_decide(&self.host, self.port, &head.method, &path)
            .map_err(|why| forbidden(Reason::HttpRule, why))?
            .map(|r| r.to_string());
        let framing = wire::request_framing(head).map_err(|why| {
            refuse(
                "400 Bad Request",
                Reason::BadRequest,
                format!("an ambiguous request body ({why})"),
            )
        })?;
        let body = BodyReader::new(framing, sh.net.max_body)
            .map_err(|e| forbidden(Reason::BodyTooLarge, e.to_string()))?;
        let used = sh
            .secrets
            .apply(head, &self.host, self.port, self.tls)
            .map_err(|Elsewhere { name, belongs }| {
                forbidden(
                    Reason::SecretElsewhere,
                    format!(
                        "the request carries the placeholder of secret {name}, which goes to {belongs} only, not to {}:{}{}",
                        self.host,
                        self.port,
                        if self.tls { "" } else { " in plain HTTP" }
                    ),
                )
            })?;
        Ok((rule, used, body))
    }

    /// One request and its response.
    fn one(
        &self,
        c: &mut Peer,
        up: &mut Upstream,
        mut head: Head,
        pending: &mut Vec<u8>,
        meter: &mut CpuMeter<'_>,
    ) -> Next {
        let sh = self.sh;
        let mut r = Req {
            ev: self.event(Some(&head)),
            out: 0,
            inn: 0,
        };
        let (rule, used, mut body) = match self.check(&mut head) {
            Ok(x) => x,
            Err(why) => {
                self.answer(c, r, why);
                return Next::End;
            }
        };
        if let Some(q) = r.ev.request.as_mut() {
            q.rule.clone_from(&rule);
            q.secrets.clone_from(&used);
        }
        let close_asked = wants_close(head.version, head.values("connection"));
        let method = head.method.clone();
        let head_bytes = match &self.forward {
            Some((authority, path)) => wire::forward_head(&head, authority, path),
            None => wire::serialize_head(&head),
        };
        // The upstream end, TLS set up now that the request may go.
        if let Upstream::Tls { .. } = up {
            let Upstream::Tls { sock, name } = std::mem::replace(up, Upstream::Gone) else {
                unreachable!("matched above")
            };
            let cfg = match &sh.inspection {
                Some(i) => i.upstream.clone(),
                None => {
                    self.answer(
                        c,
                        r,
                        refuse(
                            "502 Bad Gateway",
                            Reason::UpstreamTls,
                            "no TLS configuration",
                        ),
                    );
                    return Next::End;
                }
            };
            match Peer::connect(sh, sock, cfg, name, Instant::now() + CONNECT_TIMEOUT) {
                Ok(p) => *up = Upstream::Ready(p),
                Err(HandshakeError::Stopping) => return Next::End,
                Err(HandshakeError::Certificate(why)) => {
                    let detail = format!(
                        "the server's certificate for {} does not verify: {why}",
                        self.host
                    );
                    self.answer(
                        c,
                        r,
                        refuse("502 Bad Gateway", Reason::UpstreamCertificate, detail),
                    );
                    return Next::End;
                }
                Err(HandshakeError::Other(why)) => {
                    let detail = format!("TLS to {} failed: {why}", self.host);
                    self.answer(c, r, refuse("502 Bad Gateway", Reason::UpstreamTls, detail));
                    return Next::End;
                }
            }
        }
        let Upstream::Ready(u) = up else {
            return Next::End;
        };
        let count_out = |r: &mut Req, n: usize| {
            r.out += n as u64;
            self.out.fetch_add(n as u64, Ordering::Relaxed);
        };
        let count_in = |r: &mut Req, n: usize| {
            r.inn += n as u64;
            self.inn.fetch_add(n as u64, Ordering::Relaxed);
        };

        // The request goes up while the response head is awaited: a server may answer early
        // (`100 Continue`, or a final status before the body is all in).
        let mut to_up = head_bytes;
        let mut sent = 0usize;
        let took = match body.feed(pending, &mut to_up) {
            Ok(n) => n,
            Err(e) => return self.body_failed(c, r, e),
        };
        pending.drain(..took);
        let mut resp: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; CHUNK];
        let response = loop {
            let mut moved = false;
            if sent < to_up.len() {
                match u.write_now(&to_up[sent..]) {
                    Ok(n) => {
                        sent += n;
                        count_out(&mut r, n);
                        moved |= n > 0;
                        if sent == to_up.len() {
                            to_up.clear();
                            sent = 0;
                        }
                    }
                    Err(e) => {
                        return self.upstream_failed(c, r, &format!("sending the request: {e}"))
                    }
                }
            } else if !u.flush_now().unwrap_or(true) {
                // rustls still holds part of it.
            }
            if to_up.is_empty() && !body.done() {
                match c.read_now(&mut chunk) {
                    Ok(Some(0)) => return self.body_failed(c, r, BodyError::Truncated),
                    Ok(Some(n)) => {
                        moved = true;
                        let took = match body.feed(&chunk[..n], &mut to_up) {
                            Ok(t) => t,
                            Err(e) => return self.body_failed(c, r, e),
                        };
                        // What follows the body is the next request (pipelined).
                        pending.extend_from_slice(&chunk[took..n]);
                    }
                    Ok(None) => {}
                    Err(_) => return Next::End,
                }
            }
            match u.read_now(&mut chunk) {
                Ok(Some(0)) => {
                    return self.upstream_failed(
                        c,
                        r,
                        "the server closed the connection without answering",
                    )
                }
                Ok(Some(n)) => {
                    moved = true;
                    if resp.len() + n > MAX_HEAD {
                        return self.upstream_failed(c, r, "a response head larger than 64 KiB");
                    }
                    resp.extend_from_slice(&chunk[..n]);
                    match wire::parse_response(&resp) {
                        Ok(None) => {}
                        Err(why) => {
                            return self.upstream_failed(
                                c,
                                r,
                                &format!("a malformed response head ({why})"),
                            )
                        }
                        Ok(Some(h)) if (100..200).contains(&h.code) && h.code != 101 => {
                            // An interim answer (100 Continue): on to the client.
                            let bytes = h.serialize();
                            if c.write_all(sh, &bytes).is_err() {
                                return Next::End;
                            }
                            count_in(&mut r, bytes.len());
                            resp.drain(..h.len);
                        }
                        Ok(Some(h)) => break h,
                    }
                }
                Ok(None) => {}
                Err(e) => return self.upstream_failed(c, r, &format!("reading the response: {e}")),
            }
            if moved {
                continue;
            }
            let reading_client = to_up.is_empty() && !body.done();
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2);
            let ci = c.interest(reading_client, false);
            if !ci.is_empty() {
                fds.push(c.poll_fd(ci));
            }
            fds.push(u.poll_fd(u.interest(true, sent < to_up.len())));
            let woke = relay::wait(sh, &fds, None);
            drop(fds);
            meter.tick();
            if woke == Wake::Stop {
                self.finish(r, None, crate::share::why_stopped());
                return Next::End;
            }
        };
        let request_done = body.done() && to_up.is_empty();
        // The response.
        let mut leftover = resp.split_off(response.len);
        let framing = match wire::response_framing(&method, &response) {
            Ok(f) => f,
            Err(why) => {
                return self.upstream_failed(c, r, &format!("an ambiguous response ({why})"))
            }
        };
        let mut shown = response.clone();
        if !sh.secrets.is_empty() {
            for (_, v) in shown.headers.iter_mut() {
                *v = sh.secrets.mask(v);
            }
        }
        if let Some(q) = r.ev.request.as_mut() {
            q.status = Some(response.code);
        }
        let head_out = shown.serialize();
        if c.write_all(sh, &head_out).is_err() {
            self.finish(r, Some(response.code), "the client went away");
            return Next::End;
        }
        count_in(&mut r, head_out.len());
        if response.code == 101 {
            // Switched protocols (a WebSocket): the rest is relayed as it is, both ways.
            self.finish(r, Some(101), "switched protocols; relayed from here on");
            let _ = c.write_all(sh, &leftover);
            self.inn.fetch_add(leftover.len() as u64, Ordering::Relaxed);
            let pending = std::mem::take(pending);
            self.pump(c, u, pending, meter);
            return Next::End;
        }
        let mut rb = match BodyReader::new(framing, None) {
            Ok(b) => b,
            Err(_) => return Next::End,
        };
        let mut out = Vec::with_capacity(CHUNK + 64);
        loop {
            if !leftover.is_empty() {
                out.clear();
                let took = match rb.feed(&leftover, &mut out) {
                    Ok(t) => t,
                    Err(e) => {
                        self.finish(r, Some(response.code), &format!("the response: {e}"));
                        return Next::End;
                    }
                };
                leftover.drain(..took);
                if c.write_all(sh, &out).is_err() {
                    self.finish(r, Some(response.code), "the client went away");
                    return Next::End;
                }
                count_in(&mut r, out.len());
                if rb.done() {
                    break;
                }
                if !leftover.is_empty() {
                    continue;
                }
            }
            if rb.done() {
                break;
            }
            match u.read_now(&mut chunk) {
                Ok(Some(0)) | Err(_) => {
                    let ok = rb.eof().is_ok();
                    self.finish(
                        r,
                        Some(response.code),
                        if ok {
                            ""
                        } else {
                            "the server closed before the end of the response"
                        },
                    );
                    return Next::End;
                }
                Ok(Some(n)) => leftover.extend_from_slice(&chunk[..n]),
                Ok(None) => {
                    let fds = [u.poll_fd(u.interest(true, false))];
                    let woke = relay::wait(sh, &fds, None);
                    meter.tick();
                    if woke == Wake::Stop {
                        self.finish(r, Some(response.code), crate::share::why_stopped());
                        return Next::End;
                    }
                }
            }
        }
        let close = close_asked
            || !request_done
            || !leftover.is_empty()
            || wants_close(response.version, response.values("connection"));
        self.finish(r, Some(response.code), "");
        if close {
            Next::End
        } else {
            Next::More
        }
    }

    /// Records an allowed request that was answered (or cut: `note` says how).
    fn finish(&self, mut r: Req, status: Option<u16>, note: &str) {
        r.ev.decision = Decision::Allowed;
        r.ev.reason = Reason::Allowed;
        let q = r.ev.request.clone().unwrap_or_else(|| {
            Box::new(Request {
                method: String::new(),
                path: String::new(),
                status: None,
                rule: None,
                secrets: Vec::new(),
            })
        });
        let mut d = match status {
            Some(s) => format!("{} {} -> {s}", q.method, q.path),
            None => format!("{} {}", q.method, q.path),
        };
        match &q.rule {
            Some(rule) => d.push_str(&format!(" (rule `{rule}`)")),
            None if self.sh.net.http.is_empty() => {}
            None => d.push_str(" (no HTTP rule names this host)"),
        }
        if !q.secrets.is_empty() {
            d.push_str(&format!("; secrets: {}", q.secrets.join(", ")));
        }
        if !note.is_empty() {
            d.push_str(&format!("; {note}"));
        }
        r.ev.detail = d;
        if let Some(q) = r.ev.request.as_mut() {
            q.status = status;
        }
        r.ev.bytes_out = r.out;
        r.ev.bytes_in = r.inn;
        self.sh.record(r.ev);
    }

    /// The request's body could not go on: refused (too large, malformed) or cut.
    fn body_failed(&self, c: &mut Peer, r: Req, e: BodyError) -> Next {
        match e {
            BodyError::TooLarge(_) => self.answer(
                c,
                r,
                refuse("403 Forbidden", Reason::BodyTooLarge, e.to_string()),
            ),
            BodyError::Malformed(_) => self.answer(
                c,
                r,
                refuse("400 Bad Request", Reason::BadRequest, e.to_string()),
            ),
            BodyError::Truncated => self.finish(
                r,
                None,
                "the client closed before the end of its request body",
            ),
        }
        Next::End
    }

    /// The server failed this request: `502` with why.
    fn upstream_failed(&self, c: &mut Peer, r: Req, why: &str) -> Next {
        let detail = format!("{}: {why}", self.host);
        self.answer(
            c,
            r,
            refuse("502 Bad Gateway", Reason::ConnectFailed, detail),
        );
        Next::End
    }

    /// Relays both ways as they are (after `101 Switching Protocols`), until both are done or
    /// the proxy stops.
    fn pump(&self, c: &mut Peer, u: &mut Peer, first: Vec<u8>, meter: &mut CpuMeter<'_>) {
        let sh = self.sh;
        let mut up_buf = first;
        let mut down_buf: Vec<u8> = Vec::new();
        let (mut c_eof, mut u_eof) = (false, false);
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let mut moved = false;
            if !up_buf.is_empty() {
                match u.write_now(&up_buf) {
                    Ok(n) => {
                        up_buf.drain(..n);
                        self.out.fetch_add(n as u64, Ordering::Relaxed);
                        moved |= n > 0;
                    }
                    Err(_) => return,
                }
            }
            if !down_buf.is_empty() {
                match c.write_now(&down_buf) {
                    Ok(n) => {
                        down_buf.drain(..n);
                        self.inn.fetch_add(n as u64, Ordering::Relaxed);
                        moved |= n > 0;
                    }
                    Err(_) => return,
                }
            }
            if up_buf.is_empty() && !c_eof {
                match c.read_now(&mut chunk) {
                    Ok(Some(0)) | Err(_) => {
                        c_eof = true;
                        u.close();
                    }
                    Ok(Some(n)) => {
                        up_buf.extend_from_slice(&chunk[..n]);
                        moved = true;
                    }
                    Ok(None) => {}
                }
            }
            if down_buf.is_empty() && !u_eof {
                match u.read_now(&mut chunk) {
                    Ok(Some(0)) | Err(_) => {
                        u_eof = true;
                        c.close();
                    }
                    Ok(Some(n)) => {
                        down_buf.extend_from_slice(&chunk[..n]);
                        moved = true;
                    }
                    Ok(None) => {}
                }
            }
            if c_eof && u_eof && up_buf.is_empty() && down_buf.is_empty() {
                return;
            }
            if moved {
                continue;
            }
            let fds = [
                c.poll_fd(c.interest(up_buf.is_empty() && !c_eof, !down_buf.is_empty())),
                u.poll_fd(u.interest(down_buf.is_empty() && !u_eof, !up_buf.is_empty())),
            ];
            let woke = relay::wait(sh, &fds, None);
            meter.tick();
            if woke == Wake::Stop {
                return;
            }
        }
    }
}

/// Whether a message asks to close the connection after it: `Connection: close`, or HTTP/1.0
/// without `keep-alive` (the proxy closes HTTP/1.0 connections after one exchange either way).
fn wants_close<'a>(version: u8, connection: impl Iterator<Item = &'a [u8]>) -> bool {
    let tokens: Vec<String> = connection
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .collect();
    version == 0 || tokens.iter().any(|t| t == "close")
}

/// The one check of an HTTP request's host against the connection's: the `Host` (and an
/// absolute-form target) must name it, with no ambiguity. `forward`: a request on the HTTP proxy
/// listener, whose URL is the host; `tls`: inside TLS the proxy terminated, where the host is the
/// TLS name (a different `Host` there is fronting).
pub(crate) fn check_host(
    want: &Host,
    got: &Result<Option<String>, HostError>,
    forward: bool,
    tls: bool,
) -> Result<(), (Reason, String)> {
    let named = matches!(want, Host::Name(_));
    let same = |g: &str| matches!(Host::parse(g), Ok(h) if h == *want);
    let quote = |s: &str| Untrusted::new(s).max(128).to_string();
    let whose = if forward {
        "the URL's"
    } else if tls {
        "the TLS server name's"
    } else {
        "the connection's"
    };
    match got {
        Ok(Some(h)) if named && !same(h) => Err((
            Reason::HostHeaderMismatch,
            format!("HTTP Host `{}` is not {whose} host {want}", quote(h)),
        )),
        Ok(None) if named => Err((
            Reason::HostHeaderMismatch,
            format!("HTTP request to {want} without a Host header"),
        )),
        Err(HostError::TargetDiffers { host, .. }) if forward => Err((
            Reason::HostHeaderMismatch,
            format!("HTTP Host `{host}` is not {whose} host {want}"),
        )),
        Err(why) => Err((
            Reason::HostHeaderMismatch,
            format!("HTTP request to {want} with an ambiguous host: {why}"),
        )),
        _ => Ok(()),
    }
}
