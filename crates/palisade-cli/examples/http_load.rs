//! The load generator of `bench/server.sh`: closed-loop HTTP/1.1 clients on keep-alive connections,
//! each sending one request at a time, until `--total` requests are taken or `--seconds` pass.
//! Native threads, so that the measuring side costs the 2-CPU machine little and adds no queueing
//! of its own to the latencies (a Python client's threads wait for one interpreter lock).
//!
//! ```text
//! http_load --port P [--host H] [--path /v1/run] --body-file F --clients C --total N --seconds S
//!           [--expect-stdout TEXT]
//! ```
//!
//! Prints one JSON object: `latencies_s` (one per answered request, in seconds), `wall_s`,
//! `statuses` (counts by outcome) and `cpu_s` (this process's own CPU time, user and system). An
//! answer counts under its HTTP status when that is not 200; otherwise under the body's `status`
//! field, or with `--expect-stdout` (SandboxFusion's `/run_code` answer) under `ok` when its
//! `status` is `Success` and `run_result.stdout` is TEXT once trimmed, `wrong-output` when the
//! output differs, and the `status` otherwise. A refused or broken connection counts as
//! `connection` and the client connects again.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Args {
    host: String,
    port: u16,
    path: String,
    body: Vec<u8>,
    clients: usize,
    total: usize,
    seconds: f64,
    expect_stdout: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 0,
        path: "/v1/run".into(),
        body: Vec::new(),
        clients: 1,
        total: 1,
        seconds: 60.0,
        expect_stdout: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let bad = |v: &str| format!("{flag}: {v:?} is not a number");
        match flag.as_str() {
            "--host" => a.host = value()?,
            "--port" => {
                let v = value()?;
                a.port = v.parse().map_err(|_| bad(&v))?;
            }
            "--path" => a.path = value()?,
            "--body-file" => {
                let v = value()?;
                a.body = std::fs::read(&v).map_err(|e| format!("--body-file {v}: {e}"))?;
            }
            "--clients" => {
                let v = value()?;
                a.clients = v.parse().map_err(|_| bad(&v))?;
            }
            "--total" => {
                let v = value()?;
                a.total = v.parse().map_err(|_| bad(&v))?;
            }
            "--seconds" => {
                let v = value()?;
                a.seconds = v.parse().map_err(|_| bad(&v))?;
            }
            "--expect-stdout" => a.expect_stdout = Some(value()?),
            _ => {
                return Err(format!(
                    "unknown argument {flag:?}; accepted: --host, --port, --path, --body-file, \
                     --clients, --total, --seconds, --expect-stdout"
                ))
            }
        }
    }
    if a.port == 0 || a.clients == 0 {
        return Err("--port and --clients (at least 1) are required".into());
    }
    Ok(a)
}

/// One answer: the HTTP status and the body.
fn exchange(
    conn: &mut BufReader<TcpStream>,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let s = conn.get_mut();
    s.write_all(head)?;
    s.write_all(body)?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "connection" => close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            line.clear();
            conn.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            let start = out.len();
            out.resize(start + size, 0);
            conn.read_exact(&mut out[start..])?;
            line.clear();
            conn.read_line(&mut line)?; // the chunk's CRLF (or the end's)
            if size == 0 {
                break;
            }
        }
    } else if let Some(n) = length {
        out.resize(n, 0);
        conn.read_exact(&mut out)?;
    } else {
        conn.read_to_end(&mut out)?;
        close = true;
    }
    Ok((code, out, close))
}

/// What an answer counts as (see the module doc).
fn outcome(code: u16, body: &[u8], expect: Option<&str>) -> String {
    if code != 200 {
        return code.to_string();
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return "bad-json".into();
    };
    let status = v
        .get("status")
        .and_then(|s| s.as_str())
        .unwrap_or("200")
        .to_owned();
    match expect {
        None => status,
        Some(_) if status != "Success" => status,
        Some(want) => {
            let got = v
                .pointer("/run_result/stdout")
                .and_then(|s| s.as_str())
                .unwrap_or("");
            if got.trim() == want {
                "ok".into()
            } else {
                "wrong-output".into()
            }
        }
    }
}

fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the buffer it is given, which has that size.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn main() {
    let a = match args() {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("http_load: {e}");
            std::process::exit(2);
        }
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        a.path,
        a.host,
        a.port,
        a.body.len()
    )
    .into_bytes();
    let left = Arc::new(AtomicUsize::new(a.total));
    let results = Arc::new(Mutex::new((
        Vec::<f64>::new(),
        BTreeMap::<String, u64>::new(),
    )));
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let deadline = t0 + Duration::from_secs_f64(a.seconds);
    let threads: Vec<_> = (0..a.clients)
        .map(|_| {
            let (a, head, left, results) = (a.clone(), head.clone(), left.clone(), results.clone());
            std::thread::spawn(move || {
                let connect = || -> Option<BufReader<TcpStream>> {
                    let s = TcpStream::connect((a.host.as_str(), a.port)).ok()?;
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
                    Some(BufReader::new(s))
                };
                let mut conn = connect();
                let count = |key: String| {
                    let mut r = results.lock().unwrap();
                    *r.1.entry(key).or_default() += 1;
                };
                loop {
                    if Instant::now() > deadline
                        || left
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_err()
                    {
                        return;
                    }
                    let Some(c) = conn.as_mut() else {
                        count("connection".into());
                        std::thread::sleep(Duration::from_millis(10));
                        conn = connect();
                        continue;
                    };
                    let t = Instant::now();
                    match exchange(c, &head, &a.body) {
                        Ok((code, body, close)) => {
                            let dt = t.elapsed().as_secs_f64();
                            let key = outcome(code, &body, a.expect_stdout.as_deref());
                            {
                                let mut r = results.lock().unwrap();
                                r.0.push(dt);
                                *r.1.entry(key).or_default() += 1;
                            }
                            if close {
                                conn = connect();
                            }
                        }
                        Err(_) => {
                            count("connection".into());
                            conn = connect();
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let (lat, statuses) = std::mem::take(&mut *results.lock().unwrap());
    let out = serde_json::json!({
        "latencies_s": lat,
        "wall_s": wall,
        "statuses": statuses,
        "cpu_s": cpu,
    });
    println!("{out}");
}
