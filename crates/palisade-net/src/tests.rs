//! The proxy's bounds, on real sockets on the host's loopback: the event store, escaping, the
//! notify cap, the connection cap, the first-bytes deadline, stopping, the relay and its CPU
//! meter. Waits in these tests end in a failure after a generous time, never in a pass.

use super::*;
use palisade_policy::net::{Host, NetRule, Pin};
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::Instant;

/// Long enough for anything that should happen to happen on a busy machine.
const PATIENCE: Duration = Duration::from_secs(60);

fn network(allow: &[String], pins: &[&str]) -> Network {
    Network {
        allow: allow
            .iter()
            .map(|r| NetRule::parse("--allow-net", r).unwrap())
            .collect(),
        resolve: pins.iter().map(|p| Pin::parse(p).unwrap()).collect(),
        ..Network::default()
    }
}

/// Nothing prepared: no inspection, no secrets.
fn none() -> Prepared {
    Prepared::new(&Network::default()).unwrap()
}

fn quiet() -> Egress {
    let net = network(&["example.org".into()], &[]);
    Egress::start_with(net, Vec::new(), None, Limits::default(), none()).unwrap()
}

/// An HTTP proxy listener on the host's loopback, served by a new Egress.
fn proxy(net: Network, limits: Limits, notify: Option<Notify>) -> (Egress, SocketAddr) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let prepared = Prepared::new(&net).unwrap();
    let e = Egress::start_with(
        net,
        vec![(Role::HttpProxy, OwnedFd::from(l))],
        notify,
        limits,
        prepared,
    )
    .unwrap();
    (e, addr)
}

/// A server on the host's loopback that keeps every byte each connection sent, and answers
/// each connection, once its client is done sending, with `reply` bytes.
struct Server {
    port: u16,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Server {
    fn start(reply: usize) -> Server {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let g = g.clone();
                std::thread::spawn(move || {
                    let _ = c.set_read_timeout(Some(PATIENCE));
                    let mut all = Vec::new();
                    let _ = c.read_to_end(&mut all);
                    g.lock().unwrap().push(all);
                    let _ = c.write_all(&vec![b'x'; reply]);
                });
            }
        });
        Server { port, got }
    }

    /// Everything the server was sent, over all connections.
    fn all(&self) -> Vec<u8> {
        self.got.lock().unwrap().concat()
    }
}

/// `example.org` pinned to the server, which an IP rule also allows (it is loopback).
fn to(srv: &Server) -> Network {
    let p = srv.port;
    network(
        &[format!("example.org:{p}"), format!("127.0.0.1:{p}")],
        &["example.org=127.0.0.1"],
    )
}

fn client(addr: SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c
}

/// Reads until the proxy closes the connection (a reset counts as closed).
fn read_to_close(c: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the proxy did not close the connection: {e}"),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// `CONNECT host:port`, and the proxy's answer's status line.
fn connect(addr: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut c = client(addr);
    write!(c, "CONNECT {target} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match c.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or("")
        .to_owned();
    (c, line)
}

/// Runs `f` on another thread; panics if it has not returned within [`PATIENCE`].
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("{what} did not return"))
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_event_store_is_bounded_in_count_and_in_bytes() {
    // In bytes: hosts of 60 KB and details of 100 KB, as a payload can send them.
    let e = quiet();
    let huge_host = "\x01".repeat(60_000);
    for _ in 0..20_000 {
        let mut ev = event(Via::HttpConnect, &huge_host, 443);
        ev.detail = format!("{}{}", "d".repeat(100_000), huge_host);
        e.shared.record(ev);
    }
    let log = e.finish();
    assert_eq!(log.denied, 20_000);
    assert_eq!(log.events.len() as u64 + log.dropped, 20_000);
    let kept: usize = log.events.iter().map(Log::cost).sum();
    assert!(kept <= MAX_EVENT_BYTES, "{kept}");
    assert!(log.events.len() > 100, "{}", log.events.len());
    for ev in &log.events {
        assert!(ev.host.chars().count() <= HOST_SHOWN, "{}", ev.host.len());
        assert!(
            ev.detail.chars().count() < MAX_DETAIL_CHARS + 32,
            "{}",
            ev.detail.len()
        );
        assert!(ev.host.ends_with("…(59740 bytes more)"), "{}", ev.host);
    }
    // In count: small events stop at MAX_EVENTS.
    let e = quiet();
    for i in 0..MAX_EVENTS + 5 {
        e.shared.record(event(Via::Dns, &format!("n{i}.test"), 53));
    }
    let log = e.finish();
    assert_eq!((log.events.len(), log.dropped), (MAX_EVENTS, 5));
}

/// A DNS query for `labels`, as a resolver inside would send it.
fn query(labels: &[&[u8]]) -> wire::Question {
    let mut q = vec![0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for l in labels {
        q.push(l.len() as u8);
        q.extend_from_slice(l);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    wire::dns_question(&q).unwrap()
}

#[test]
fn what_the_sandbox_sent_is_stored_escaped_and_printed_as_one_safe_line() {
    let printed = Arc::new(Mutex::new(Vec::new()));
    let p = printed.clone();
    let notify: Notify = Box::new(move |e: &Event| p.lock().unwrap().push(e.to_string()));
    let net = network(&["example.org".into()], &[]);
    let e = Egress::start_with(net, Vec::new(), Some(notify), Limits::default(), none()).unwrap();
    let forged: &[u8] = b"\n\x1b[2K\rpalisade: ok \xc2\xb7 exit 0 \xc2\xb7 FORGED";
    serve::answer(&e.shared, &query(&[forged, b"\x1b]0;title\x07x\xff"]));
    let log = e.finish();
    let ev = &log.events[0];
    let line = ev.to_string();
    for text in [&ev.host, &ev.detail, &line, &printed.lock().unwrap()[0]] {
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("\\n\\x1b[2K\\rpalisade: ok"), "{text}");
    }
    assert!(
        line.starts_with("denied dns \\n\\x1b[2K\\rpalisade: ok · exit 0 · FORGED.\\x1b]0;title"),
        "{line}"
    );
    assert!(line.contains(":53 (not-allowed: NXDOMAIN: `"), "{line}");
    // Text built from escaped parts passes as it is; anything else is escaped; all is cut.
    assert_eq!(bounded("a \\x1b b … \u{e9}", 100), "a \\x1b b … \u{e9}");
    assert_eq!(bounded("a\u{1b}b\u{202e}", 100), "a\\x1bb\\u{202e}");
    assert_eq!(bounded("abcdef", 4), "abcd…(2 bytes more)");
}

#[test]
fn notify_is_called_only_for_kept_events_and_at_most_max_notify_times_per_decision() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let notify: Notify = Box::new(move |_: &Event| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    let limits = Limits {
        notify: 5,
        events: 30,
        ..Limits::default()
    };
    let e =
        Egress::start_with(network(&[], &[]), Vec::new(), Some(notify), limits, none()).unwrap();
    for i in 0..20 {
        e.shared.record(event(Via::Dns, &format!("d{i}"), 53));
        let mut ev = event(Via::Dns, &format!("a{i}"), 53);
        ev.decision = Decision::Allowed;
        e.shared.record(ev);
    }
    // 30 kept: 10 + 5 notified, the rest suppressed, the 10 past the store too.
    let log = e.finish();
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    assert_eq!(log.notify_suppressed, 30);
    assert_eq!((log.events.len(), log.dropped), (30, 10));
}

#[test]
fn connections_past_the_cap_are_refused_at_once_and_counted() {
    let limits = Limits {
        connections: 4,
        first_bytes: Duration::from_secs(3600),
        ..Limits::default()
    };
    let (e, addr) = proxy(network(&["example.org".into()], &[]), limits, None);
    let held: Vec<TcpStream> = (0..4).map(|_| client(addr)).collect();
    wait_until("4 connections are open", || {
        e.shared.open.load(Ordering::SeqCst) == 4
    });
    for _ in 0..6 {
        let mut c = client(addr);
        let _ = c.write_all(b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");
        let answer = read_to_close(&mut c);
        assert!(
            answer.starts_with("HTTP/1.1 503 ") && answer.contains("too-many-connections"),
            "{answer}"
        );
    }
    assert_eq!(e.shared.open.load(Ordering::SeqCst), 4);
    // Stopping cuts the held connections at once, though their deadline is an hour away.
    let log = returns("finish", move || e.finish());
    assert_eq!(log.refused_connections, 6);
    assert_eq!(log.events.len(), 0, "refusals are counted, not logged");
    for mut c in held {
        assert_eq!(read_to_close(&mut c), "");
    }
}

/// A listener on `addr` whose accept queue is full and never taken from: the kernel drops each
/// further SYN, so a connection to it neither succeeds nor fails (as to a host that does not
/// answer). Returns what must stay open for that.
fn unanswering(addr: SocketAddr) -> (OwnedFd, Vec<OwnedFd>) {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let l = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    rustix::net::sockopt::set_socket_reuseaddr(&l, true).unwrap();
    rustix::net::bind(&l, &addr).unwrap();
    rustix::net::listen(&l, 0).unwrap();
    // Backlog 0 holds one connection: fill it (and one more SYN, which waits).
    let filler: Vec<OwnedFd> = (0..2)
        .map(|_| {
            let c = rustix::net::socket_with(
                AddressFamily::INET,
                SocketType::STREAM,
                SocketFlags::NONBLOCK,
                None,
            )
            .unwrap();
            let _ = rustix::net::connect(&c, &addr);
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    (l, filler)
}

/// A name with many addresses that do not answer holds its connection for one connect deadline
/// in all, not one per address (eight addresses at 1 s each took 8 s): each address gets a share
/// of what is left, and those left when it is spent are named, not tried.
#[test]
fn a_name_whose_addresses_do_not_answer_gets_one_connect_deadline_in_all() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addrs: Vec<SocketAddr> = (2..10)
        .map(|k| SocketAddr::from(([127, 0, 0, k], port)))
        .collect();
    let _held: Vec<_> = addrs.iter().map(|a| unanswering(*a)).collect();
    let mut allow = vec![format!("example.org:{port}")];
    allow.extend(addrs.iter().map(|a| a.to_string()));
    let pins: Vec<String> = addrs
        .iter()
        .map(|a| format!("example.org={}", a.ip()))
        .collect();
    let pins: Vec<&str> = pins.iter().map(|p| p.as_str()).collect();
    let limits = Limits {
        connect: Duration::from_secs(1),
        ..Limits::default()
    };
    let (e, addr) = proxy(network(&allow, &pins), limits, None);
    let t0 = Instant::now();
    let (_c, line) = returns("the CONNECT", move || {
        connect(addr, &format!("example.org:{port}"))
    });
    let took = t0.elapsed();
    assert!(line.starts_with("HTTP/1.1 502 "), "{line}");
    assert!(
        took < Duration::from_secs(4),
        "eight addresses that do not answer held the connection {took:?} (1 s in all allowed)"
    );
    let log = returns("finish", move || e.finish());
    let detail = &log.events[0].detail;
    assert!(
        detail.contains("not tried: 1s in all to connect"),
        "{detail}"
    );
}

#[test]
fn a_names_addresses_take_turns_by_family_the_first_ones_first() {
    let a = |s: &str| -> IpAddr { s.parse().unwrap() };
    let got = crate::serve::interleave(vec![
        a("2001:db8::1"),
        a("2001:db8::2"),
        a("2001:db8::3"),
        a("198.51.100.1"),
        a("198.51.100.2"),
    ]);
    let want = [
        "2001:db8::1",
        "198.51.100.1",
        "2001:db8::2",
        "198.51.100.2",
        "2001:db8::3",
    ];
    assert_eq!(got, want.map(a).to_vec());
    assert_eq!(
        crate::serve::interleave(vec![a("198.51.100.1"), a("2001:db8::1")]),
        vec![a("198.51.100.1"), a("2001:db8::1")]
    );
    assert!(crate::serve::interleave(Vec::new()).is_empty());
}

#[test]
fn the_pace_gives_a_burst_then_one_turn_per_period_in_order() {
    let t0 = Instant::now();
    let mut p = Pace::new(10);
    // A burst of ten at once, then each taker waits a tenth of a second longer than the one
    // before it.
    for _ in 0..10 {
        assert_eq!(p.take(t0), Duration::ZERO);
    }
    let waits: Vec<Duration> = (0..3).map(|_| p.take(t0)).collect();
    for (i, w) in waits.iter().enumerate() {
        let want = 0.1 * (i + 1) as f64;
        assert!((w.as_secs_f64() - want).abs() < 1e-6, "{waits:?}");
    }
    // Two seconds later the turns taken ahead are paid back and the bucket is full again, no
    // more than full.
    let later = t0 + Duration::from_secs(2);
    for _ in 0..10 {
        assert_eq!(p.take(later), Duration::ZERO);
    }
    assert!(p.take(later) > Duration::ZERO);
}

/// Upstream connections past the proxy's pace wait for their turn: 60 in a row at 20 a second
/// take at least two seconds, all of them connect, and those that waited are counted.
#[test]
fn upstream_connections_past_the_pace_wait_their_turn_and_are_counted() {
    let srv = Server::start(0);
    let limits = Limits {
        connects_per_s: 20,
        ..Limits::default()
    };
    let (e, addr) = proxy(to(&srv), limits, None);
    let target = format!("example.org:{}", srv.port);
    let t0 = Instant::now();
    for _ in 0..60 {
        let (c, line) = connect(addr, &target);
        assert!(line.starts_with("HTTP/1.1 200 "), "{line}");
        drop(c);
    }
    let took = t0.elapsed();
    // Every connection's thread done (the last one's may still be reading after its client
    // went), so that finishing does not cut one.
    wait_until("the connections end", || {
        e.shared.open.load(Ordering::SeqCst) == 0
    });
    let log = returns("finish", move || e.finish());
    assert!(
        took >= Duration::from_millis(1900),
        "60 connections at 20 a second (a burst of 20) in {took:?}"
    );
    assert!(
        log.paced_connections >= 35,
        "{} paced",
        log.paced_connections
    );
    assert_eq!(log.allowed, 60);
}

#[test]
fn a_client_trickling_its_request_head_is_cut_at_the_total_deadline() {
    let limits = Limits {
        first_bytes: Duration::from_millis(500),
        ..Limits::default()
    };
    let (e, addr) = proxy(network(&["example.org".into()], &[]), limits, None);
    let mut c = client(addr);
    c.write_all(b"GET http://example.org/ HTTP/1.1\r\nX-Slow: ")
        .unwrap();
    let mut w = c.try_clone().unwrap();
    std::thread::spawn(move || {
        // One byte every 100 ms: each read comes well within any per-read timeout.
        let start = Instant::now();
        while start.elapsed() < PATIENCE && w.write_all(b"a").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let answer = read_to_close(&mut c);
    assert!(
        answer.starts_with("HTTP/1.1 400 ") && answer.contains("incomplete-request"),
        "{answer}"
    );
    let log = e.finish();
    assert_eq!(
        log.events[0].reason,
        Reason::IncompleteRequest,
        "{:?}",
        log.events
    );
}

#[test]
fn dropping_an_egress_stops_its_threads_and_closes_its_listeners() {
    let (e, addr) = proxy(
        network(&["example.org".into()], &[]),
        Limits::default(),
        None,
    );
    let mut c = client(addr);
    c.write_all(b"GET http://example.org/ HTTP/1.1\r\n")
        .unwrap();
    wait_until("the connection is open", || {
        e.shared.open.load(Ordering::SeqCst) == 1
    });
    let shared = Arc::downgrade(&e.shared);
    returns("drop", move || drop(e));
    assert!(shared.upgrade().is_none(), "a thread still holds the proxy");
    assert_eq!(read_to_close(&mut c), "");
    let again = TcpStream::connect(addr);
    assert_eq!(
        again.map_err(|e| e.kind()).err(),
        Some(io::ErrorKind::ConnectionRefused),
        "the listener is still open"
    );
}

#[test]
fn a_relay_runs_both_ways_in_the_connection_s_thread_and_its_cpu_is_counted() {
    const SIZE: usize = 8 << 20;
    let srv = Server::start(SIZE);
    let (e, addr) = proxy(to(&srv), Limits::default(), None);
    let (mut c, status) = connect(addr, &format!("127.0.0.1:{}", srv.port));
    assert_eq!(status, "HTTP/1.1 200 Connection established");
    let mut w = c.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        w.write_all(&vec![b'y'; SIZE]).unwrap();
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    c.read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    assert_eq!(back.len(), SIZE);
    assert_eq!(srv.all().len(), SIZE);
    assert!(e.cpu_used() > Duration::ZERO);
    let log = e.finish();
    let ev = &log.events[0];
    assert_eq!(
        (ev.decision, ev.bytes_out, ev.bytes_in),
        (Decision::Allowed, SIZE as u64, SIZE as u64)
    );
}

/// The size of a new pipe of this process's user.
fn new_pipe_size() -> usize {
    let (_r, w) = rustix::pipe::pipe().unwrap();
    rustix::pipe::fcntl_getpipe_size(&w).unwrap()
}

/// Many relays at once leave the pipes of the supervisor's user their size. The kernel counts
/// pipe buffers per user, and a non-root user past `pipe-user-pages-soft` gets pipes of 2 pages
/// (8 KiB here) instead of 16, in every process of theirs: 48 relays of two 1 MiB pipes each took
/// it there. Root is exempt from the limit, so this holds trivially in the root pass; it is the
/// unprivileged pass (`palisade-test`) that checks the budget.
#[test]
fn relays_at_once_leave_the_users_new_pipes_their_size() {
    let before = new_pipe_size();
    // An upstream that echoes each byte at once.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let _ = std::io::copy(&mut &c, &mut w);
            });
        }
    });
    let net = network(&[format!("127.0.0.1:{port}")], &[]);
    let (e, addr) = proxy(net, Limits::default(), None);
    let mut held = Vec::new();
    for _ in 0..48 {
        let (mut c, status) = connect(addr, &format!("127.0.0.1:{port}"));
        assert_eq!(status, "HTTP/1.1 200 Connection established");
        // Back through the relay: its two directions (and their pipes) exist. (A byte that
        // starts neither a request nor a ClientHello, so it is relayed at once.)
        c.write_all(b"\0").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        held.push(c);
    }
    let during = new_pipe_size();
    for c in &held {
        let _ = c.shutdown(Shutdown::Both);
    }
    drop(held);
    e.finish();
    assert_eq!(
        during, before,
        "a new pipe's size with 48 relays running (it was {before} before)"
    );
}

#[test]
fn first_bytes_that_a_lenient_server_would_read_as_another_host_never_reach_it() {
    let srv = Server::start(0);
    let limits = Limits {
        first_bytes: Duration::from_millis(500),
        ..Limits::default()
    };
    let (e, addr) = proxy(to(&srv), limits, None);
    let target = format!("example.org:{}", srv.port);
    let other = "GET / HTTP/1.1\r\nHost: other.test\r\n";
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // A second Host after a bare LF.
        (
            b"GET / HTTP/1.1\r\nHost: example.org\r\nX: a\nHost: other.test\r\n\r\n".to_vec(),
            "more than one Host header",
        ),
        // A head larger than the proxy reads.
        (
            format!("{other}X: {}\r\n\r\n", "p".repeat(MAX_HEAD)).into_bytes(),
            "still incomplete",
        ),
        // A head left unfinished past the deadline.
        (
            other.as_bytes().to_vec(),
            "nothing more within the time allowed",
        ),
        // Empty lines before the request line.
        (
            format!("\r\n{other}\r\n").into_bytes(),
            "is not the connection's host",
        ),
    ];
    for (bytes, why) in &cases {
        let (mut c, status) = connect(addr, &target);
        assert_eq!(status, "HTTP/1.1 200 Connection established");
        let _ = c.write_all(bytes);
        read_to_close(&mut c);
        let _ = why;
    }
    let log = e.finish();
    let denied: Vec<&Event> = log
        .events
        .iter()
        .filter(|e| e.decision == Decision::Denied)
        .collect();
    assert_eq!(denied.len(), cases.len(), "{:#?}", log.events);
    for ((_, why), ev) in cases.iter().zip(&denied) {
        assert!(ev.detail.contains(why), "{why}: {ev}");
    }
    assert!(
        srv.all().is_empty(),
        "{}",
        String::from_utf8_lossy(&srv.all())
    );
}

/// The fuzz targets' entry points on their seeds, on every input a fuzz run found, and on
/// mutations of both: what `scripts/fuzz.sh` does with libFuzzer, in every `cargo test` (no
/// cargo-fuzz or nightly needed), deterministically.
#[test]
fn the_fuzz_targets_hold_on_their_seeds_regressions_and_mutations() {
    macro_rules! files {
        ($($p:literal),* $(,)?) => {
            vec![$(&include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/", $p))[..]),*]
        };
    }
    type Target = fn(&[u8]);
    let targets: [(&str, Target, Vec<&[u8]>); 7] = [
        (
            "first_bytes",
            fuzzing::first_bytes,
            files![
                "seeds/first_bytes/tls-sni",
                "seeds/first_bytes/tls-no-sni",
                "seeds/first_bytes/http-get",
                "seeds/first_bytes/http-absolute",
                "seeds/first_bytes/http-bare-lf",
                "seeds/first_bytes/ssh",
                "regressions/first_bytes/long-method-then-space",
            ],
        ),
        (
            "proxy_request",
            fuzzing::proxy_request,
            files![
                "seeds/proxy_request/connect",
                "seeds/proxy_request/forward",
                "seeds/proxy_request/forward-no-host",
                "regressions/proxy_request/userinfo-in-v6-authority",
                "regressions/proxy_request/a-hundred-headers-and-connection-close",
            ],
        ),
        (
            "dns_query",
            fuzzing::dns_query,
            files!["seeds/dns_query/a", "seeds/dns_query/aaaa"],
        ),
        (
            "dns_reply",
            fuzzing::dns_reply,
            files![
                "seeds/dns_reply/a-via-cname",
                "seeds/dns_reply/aaaa-via-cname"
            ],
        ),
        (
            "http_body",
            fuzzing::http_body,
            files!["seeds/http_body/chunked", "seeds/http_body/length"],
        ),
        (
            "http_request",
            fuzzing::http_request,
            files![
                "seeds/http_request/secret-chunked",
                "seeds/http_request/absolute-basic"
            ],
        ),
        (
            "http_rules",
            fuzzing::http_rules,
            files![
                "seeds/http_rules/rule",
                "seeds/http_rules/secret",
                "seeds/http_rules/block"
            ],
        ),
    ];
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for (name, run, seeds) in targets {
        for seed in &seeds {
            run(seed);
        }
        for _ in 0..20_000 {
            let mut m = seeds[next() as usize % seeds.len()].to_vec();
            for _ in 0..=next() % 4 {
                let at = next() as usize % (m.len() + 1);
                match next() % 4 {
                    0 if at < m.len() => m[at] = next() as u8,
                    1 => m.insert(at, next() as u8),
                    2 => m.truncate(at),
                    _ => {
                        let other = seeds[next() as usize % seeds.len()];
                        m.splice(at..at, other.iter().copied().take(next() as usize % 64));
                    }
                }
            }
            let shown = m.clone();
            let caught = std::panic::catch_unwind(|| run(&m));
            assert!(caught.is_ok(), "{name} on {:?}", Untrusted::new(&shown));
        }
    }
}

#[test]
fn stopping_ends_a_relay_that_never_runs_dry() {
    let srv = Server::start(0);
    let (e, addr) = proxy(to(&srv), Limits::default(), None);
    let (c, status) = connect(addr, &format!("127.0.0.1:{}", srv.port));
    assert_eq!(status, "HTTP/1.1 200 Connection established");
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'z'; 1 << 16];
        let mut sent = 0u64;
        while w.write_all(&chunk).is_ok() {
            sent += chunk.len() as u64;
        }
        sent
    });
    wait_until("the relay runs", || {
        e.shared.log.lock().unwrap().allowed == 1
    });
    let log = returns("finish", move || e.finish());
    let sent = writer.join().unwrap();
    assert!(sent > 0);
    assert_eq!(log.events[0].decision, Decision::Allowed);
}

/// A TLS server on the host's loopback for `example.org`, signed by a test CA: HTTP/1.1
/// keep-alive, answering each request with its method and path; every request it got is kept.
struct TlsServer {
    port: u16,
    ca_file: std::path::PathBuf,
    got: Arc<Mutex<Vec<String>>>,
}

impl TlsServer {
    fn start() -> TlsServer {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["example.org".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let ca_file = std::env::temp_dir().join(format!(
            "palisade-net-test-ca-{}-{:?}.pem",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let cfg = Arc::new(cfg);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (cfg, g) = (cfg.clone(), g.clone());
                std::thread::spawn(move || {
                    let _ = c.set_read_timeout(Some(PATIENCE));
                    let conn = rustls::ServerConnection::new(cfg).unwrap();
                    let mut s = rustls::StreamOwned::new(conn, c);
                    let mut buf = Vec::new();
                    let mut b = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut b) {
                                Ok(n) if n > 0 => buf.extend_from_slice(&b[..n]),
                                _ => return,
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        let line = head.lines().next().unwrap_or("").to_owned();
                        g.lock().unwrap().push(line.clone());
                        let body = format!("{line}\n");
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        TlsServer { port, ca_file, got }
    }

    /// The proxy's policy: example.org on the server's port, pinned to it, inspected, verified
    /// against the test CA.
    fn network(&self) -> Network {
        let p = self.port;
        let mut n = network(
            &[format!("example.org:{p}"), format!("127.0.0.1:{p}")],
            &["example.org=127.0.0.1"],
        );
        n.inspect_all = true;
        n.upstream_ca = Some(self.ca_file.clone());
        n
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

/// An inspecting proxy for `srv` with `limits`, and the run's CA.
fn inspecting(srv: &TlsServer, limits: Limits) -> (Egress, SocketAddr, String) {
    let net = srv.network();
    let prepared = Prepared::new(&net).unwrap();
    let ca = prepared.ca_pem().unwrap().to_owned();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let e = Egress::start_with(
        net,
        vec![(Role::HttpProxy, OwnedFd::from(l))],
        None,
        limits,
        prepared,
    )
    .unwrap();
    (e, addr, ca)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// `CONNECT example.org:PORT`, then TLS trusting `ca` alone (the run's CA), as a client inside.
fn tls_through(addr: SocketAddr, port: u16, ca: &str) -> Tls {
    let (c, line) = connect(addr, &format!("example.org:{port}"));
    assert!(line.contains("200"), "{line}");
    // As clients do (curl, Python): each request's pieces leave at once.
    c.set_nodelay(true).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(ca::pem_certs(ca.as_bytes()));
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("example.org").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    rustls::StreamOwned::new(conn, c)
}

/// One request on `s`; the status line and the body, or `closed`.
fn ask(s: &mut Tls, host: &str, path: &str) -> String {
    if write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").is_err() {
        return "closed".into();
    }
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return "closed".into(),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    if s.read_exact(&mut body).is_err() {
        return "closed".into();
    }
    format!(
        "{} {}",
        head.lines().next().unwrap_or(""),
        String::from_utf8_lossy(&body).trim()
    )
}

#[test]
fn an_inspected_connection_checks_every_request_and_records_each() {
    let srv = TlsServer::start();
    let (e, addr, ca) = inspecting(&srv, Limits::default());
    let mut s = tls_through(addr, srv.port, &ca);
    for i in 0..3 {
        assert_eq!(
            ask(&mut s, "example.org", &format!("/r{i}?secret=1")),
            format!("HTTP/1.1 200 OK GET /r{i}?secret=1 HTTP/1.1")
        );
    }
    let switched = ask(&mut s, "other.test", "/switch");
    assert!(switched.starts_with("HTTP/1.1 403"), "{switched}");
    assert_eq!(ask(&mut s, "example.org", "/after"), "closed");
    let log = returns("finish", move || e.finish());
    assert_eq!(srv.got.lock().unwrap().len(), 3, "the switch never arrived");
    let reqs: Vec<&Event> = log.events.iter().filter(|e| e.request.is_some()).collect();
    assert_eq!(reqs.len(), 4);
    for (i, r) in reqs[..3].iter().enumerate() {
        let q = r.request.as_ref().unwrap();
        assert_eq!((q.method.as_str(), q.status), ("GET", Some(200)));
        assert_eq!(q.path, format!("/r{i}?[redacted]"));
        assert!(r.inspected && r.bytes_in > 0 && r.bytes_out > 0);
    }
    assert_eq!(reqs[3].reason, Reason::HostHeaderMismatch);
    assert_eq!(reqs[3].request.as_ref().unwrap().status, Some(403));
}

#[test]
fn endless_requests_on_one_connection_keep_the_log_bounded() {
    let srv = TlsServer::start();
    let limits = Limits {
        events: 50,
        ..Limits::default()
    };
    let (e, addr, ca) = inspecting(&srv, limits);
    let mut s = tls_through(addr, srv.port, &ca);
    for i in 0..2000 {
        let got = ask(&mut s, "example.org", &format!("/{i}"));
        assert!(got.starts_with("HTTP/1.1 200"), "{i}: {got}");
    }
    drop(s);
    let log = returns("finish", move || e.finish());
    assert_eq!(log.events.len(), 50);
    assert_eq!(
        log.allowed + log.denied,
        2001,
        "the connection and each request"
    );
    assert_eq!(log.dropped, 2001 - 50);
}

#[test]
fn slow_and_huge_heads_in_tls_are_cut_and_connections_past_the_cap_refused() {
    let srv = TlsServer::start();
    let limits = Limits {
        connections: 4,
        first_bytes: Duration::from_millis(1500),
        ..Limits::default()
    };
    let (e, addr, ca) = inspecting(&srv, limits);
    // Four connections that complete TLS, then send half a head and nothing more.
    let mut slow: Vec<Tls> = (0..4).map(|_| tls_through(addr, srv.port, &ca)).collect();
    for s in &mut slow {
        s.write_all(b"GET / HTTP/1.1\r\nHost: exa").unwrap();
        s.flush().unwrap();
    }
    // A fifth is closed at once (the HTTP proxy answers 503 first).
    let mut fifth = client(addr);
    assert!(read_to_close(&mut fifth).contains("503"));
    // Each slow one is answered 400 at the deadline, and closed.
    for mut s in slow {
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        let all = String::from_utf8_lossy(&all);
        assert!(
            all.starts_with("HTTP/1.1 400") && all.contains("incomplete-request"),
            "{all}"
        );
    }
    // A head past 64 KiB, sent at once: refused without reading further.
    let mut big = tls_through(addr, srv.port, &ca);
    let head = format!(
        "GET / HTTP/1.1\r\nHost: example.org\r\nX: {}\r\n\r\n",
        "y".repeat(70_000)
    );
    let _ = big.write_all(head.as_bytes());
    let mut all = Vec::new();
    let _ = big.read_to_end(&mut all);
    assert!(String::from_utf8_lossy(&all).starts_with("HTTP/1.1 400"));
    let shared = e.shared.clone();
    wait_until("every connection's thread ended", || {
        shared.open.load(Ordering::SeqCst) == 0
    });
    let log = returns("finish", move || e.finish());
    assert!(log.refused_connections >= 1);
    assert!(
        srv.got.lock().unwrap().is_empty(),
        "no head reached the server"
    );
    let incomplete = log
        .events
        .iter()
        .filter(|e| e.reason == Reason::IncompleteRequest)
        .count();
    assert_eq!(incomplete, 5);
}

#[test]
fn leaves_are_kept_per_host_up_to_the_cap() {
    let ca = ca::Ca::new(Arc::new(rustls::crypto::ring::default_provider())).unwrap();
    let a = ca
        .server_config(&Host::parse("a.example.org").unwrap())
        .unwrap();
    let b = ca
        .server_config(&Host::parse("a.example.org").unwrap())
        .unwrap();
    assert!(Arc::ptr_eq(&a, &b), "the second handshake reuses the leaf");
    for i in 0..MAX_LEAVES + 10 {
        ca.server_config(&Host::parse(&format!("h{i}.example.org")).unwrap())
            .unwrap();
    }
    assert_eq!(ca.leaves(), MAX_LEAVES);
    assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(!ca.cert_pem().contains("PRIVATE"));
}

/// The connections of all a process's proxies together: when they are all open, a sandbox that
/// holds fewer takes places from the one that holds the most, whose longest-idle connections
/// (relays or not) are cut and counted, down to one more than the taker holds; past that the
/// taker's connections are refused. A place is taken only for a connection that has earned it
/// (allowed, its upstream connected): bare connections wait without one, a few at most, and
/// cut nobody however many come and go (an independent attack cut 2,000 connections in 5 s
/// with them). (A private share of 9 places, as the process's 1,024 would be for 8 sandboxes
/// at their cap.)
#[test]
fn a_full_process_gives_a_sandbox_with_fewer_connections_the_longest_idle_of_the_largest() {
    let share: &'static share::Share = Box::leak(Box::new(share::Share::new(9)));
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let _ = std::io::copy(&mut &c, &mut w);
            });
        }
    });
    let limits = Limits {
        first_bytes: Duration::from_secs(3600),
        share,
        ..Limits::default()
    };
    let net = || network(&[format!("127.0.0.1:{port}")], &[]);
    let (a, a_addr) = proxy(net(), limits, None);
    let (b, b_addr) = proxy(net(), limits, None);
    let through = |c: &mut TcpStream| {
        c.write_all(b"\0").unwrap();
        let mut byte = [1u8; 1];
        c.read_exact(&mut byte).unwrap();
        assert_eq!(byte, [0]);
    };
    let relay = |addr: SocketAddr| {
        let (mut c, status) = connect(addr, &format!("127.0.0.1:{port}"));
        assert_eq!(status, "HTTP/1.1 200 Connection established");
        through(&mut c);
        c
    };
    // A: three relays, then four connections that have sent nothing; then the first relay
    // moves a byte again, so that the other two relays have been idle longest.
    let mut relays: Vec<TcpStream> = (0..3).map(|_| relay(a_addr)).collect();
    std::thread::sleep(Duration::from_millis(20));
    let silent: Vec<TcpStream> = (0..4).map(|_| client(a_addr)).collect();
    wait_until("A holds 7 places", || share.total() == 7);
    std::thread::sleep(Duration::from_millis(20));
    through(&mut relays[0]);
    // B: two relays take the free places.
    let mut b_relays: Vec<TcpStream> = (0..2).map(|_| relay(b_addr)).collect();
    assert_eq!(share.total(), 9);
    // Bare connections of B, now that all are held: a few wait without a place, one more is
    // refused at once, and none cuts anything, however many come and go.
    let bare: Vec<TcpStream> = (0..share::MAX_PENDING).map(|_| client(b_addr)).collect();
    wait_until("B's bare connections wait", || {
        b.shared.open.load(Ordering::SeqCst) == 2 + share::MAX_PENDING
    });
    let mut one_more = client(b_addr);
    assert!(read_to_close(&mut one_more).contains("too-many-connections"));
    drop(bare);
    for _ in 0..50 {
        drop(client(b_addr));
    }
    wait_until("B's bare connections end", || {
        b.shared.open.load(Ordering::SeqCst) == 2
    });
    assert_eq!(
        (a.shared.open.load(Ordering::SeqCst), share.total()),
        (7, 9),
        "bare connections cut nothing"
    );
    // B's relays: 2 taken from A (7 → 5, B 4), then refused with 503: A holds one more than B,
    // which is no reason to take a place from it (they would take it back and forth).
    for _ in 0..2 {
        b_relays.push(relay(b_addr));
    }
    for _ in 0..2 {
        let (_, status) = connect(b_addr, &format!("127.0.0.1:{port}"));
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    }
    assert_eq!(share.total(), 9);
    // The two idle relays were cut; the relay that moved a byte last, and the four newer
    // connections, are A's five.
    for c in &mut relays[1..] {
        assert_eq!(read_to_close(c), "");
    }
    wait_until("A's cut connections' threads end", || {
        a.shared.open.load(Ordering::SeqCst) == 5
    });
    through(&mut relays[0]);
    for c in &mut b_relays {
        through(c);
    }
    for mut c in silent {
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut byte = [0u8; 1];
        let e = c
            .read(&mut byte)
            .expect_err("a connection A still holds is open");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
    }
    let (la, lb) = (a.finish(), b.finish());
    assert_eq!(
        (
            la.cut_connections,
            la.took_connections,
            la.refused_connections
        ),
        (2, 0, 0)
    );
    assert_eq!((lb.cut_connections, lb.took_connections), (0, 2));
    // (The one past the bare ones waiting, and those of the 50 that came while 4 still waited.)
    assert!(lb.refused_connections >= 1);
    let full: Vec<&Event> = lb
        .events
        .iter()
        .filter(|e| e.reason == Reason::ProxiesFull)
        .collect();
    assert_eq!(full.len(), 2, "{:?}", lb.events);
    assert_eq!(share.total(), 0, "every place is given back");
}

/// A sandbox takes at most `CUT_BURST` places from others at once, then `CUTS_PER_S` a second:
/// one that opens and closes allowed connections as fast as it can does not keep another's cut.
#[test]
fn a_sandbox_takes_places_from_others_at_a_bounded_rate() {
    let mut cuts = share::Cuts::new();
    let burst = (0..1000).take_while(|_| cuts.try_take()).count();
    assert_eq!(burst as f64, share::CUT_BURST);
    std::thread::sleep(Duration::from_millis(500));
    let more = (0..1000).take_while(|_| cuts.try_take()).count();
    // Half a second at 8 a second is 4 (a busy machine's longer sleep gives a few more).
    assert!(
        (4..=share::CUT_BURST as usize).contains(&more),
        "{more} after half a second"
    );
}

/// A lookup through `--dns-server` waits like everything else in the proxy: stopping (or a cut)
/// ends it at once, not when the server's 5 s are up (found by an independent attack: a cut
/// connection kept its thread for the whole lookup).
#[test]
fn stopping_ends_a_lookup_the_dns_server_never_answers() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    silent.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut net = network(&["slow.test".into()], &[]);
    net.dns_server = Some(silent.local_addr().unwrap());
    let (e, addr) = proxy(net, Limits::default(), None);
    let mut c = client(addr);
    c.write_all(b"CONNECT slow.test:80 HTTP/1.1\r\n\r\n")
        .unwrap();
    let mut q = [0u8; 512];
    silent.recv_from(&mut q).expect("the lookup's query");
    let log = returns("finish", move || e.finish());
    let ev = log
        .events
        .iter()
        .find(|e| e.reason == Reason::ResolveFailed)
        .unwrap_or_else(|| panic!("{:?}", log.events));
    assert!(ev.detail.contains("the run ended"), "{}", ev.detail);
}
