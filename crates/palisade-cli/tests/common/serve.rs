//! The harness of the front-end tests (server.rs, server_workspace.rs, attack2.rs, mcp.rs): a real
//! `palisade serve` on a unix socket in a temporary directory, HTTP/1.1 requests to it and their
//! answers (chunked bodies decoded), what the server process holds that a leak would leave, a
//! `palisade mcp` on loopback TCP, and waiting for things to happen without hanging for good.
//!
//! Requests are written by hand (`Connection: close`, one request a connection) so that a test can
//! send what no client library would, and walk away from a request half way.

use super::{palisade_bin, unique, TempDir};
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The ceiling most servers of the tests run under.
pub const POLICY: &str = "[limits]\nmemory = \"512MiB\"\ntimeout = \"60s\"\n";

/// How long a request may wait for the next bytes of its answer before the test fails (instead of
/// hanging): far beyond any run a test asks for.
const ANSWER: Duration = Duration::from_secs(300);

/// How long a server may take to answer its first health check.
const COME_UP: Duration = Duration::from_secs(60);

/// A running `palisade serve` on a unix socket, killed when dropped.
pub struct Server {
    child: Option<Child>,
    /// Its own directory: the policy, the socket, its log (its stderr).
    pub dir: TempDir,
    pub sock: PathBuf,
}

impl Server {
    /// `palisade serve --listen unix:DIR/s.sock --policy DIR/policy.toml OPTS`, with `policy`
    /// (TOML) as its ceiling; up once it answers `/healthz`.
    pub fn start(policy: &str, opts: &[&str]) -> Server {
        Server::try_start(policy, opts, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::start`] with `env` added to its environment; `Err` with its exit status and its
    /// log when it exits instead of coming up (a refused configuration).
    pub fn try_start(
        policy: &str,
        opts: &[&str],
        env: &[(&str, &OsStr)],
    ) -> Result<Server, String> {
        // A name of its own: a directory of an earlier server is never reused. Short, without
        // dashes: a socket's path has at most 107 bytes.
        let dir = TempDir::new(&unique("serve").replace('-', ""));
        std::fs::write(dir.path().join("policy.toml"), policy).unwrap();
        let sock = dir.path().join("s.sock");
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = serve_on(&sock)
            .arg("--policy")
            .arg(dir.path().join("policy.toml"))
            .args(opts)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("palisade serve starts");
        let mut s = Server {
            child: Some(child),
            dir,
            sock,
        };
        let t0 = Instant::now();
        loop {
            if s.sock.exists() && s.try_get("/healthz").is_some_and(|r| r.status == 200) {
                return Ok(s);
            }
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                s.child = None;
                return Err(format!("palisade serve exited {st}: {}", s.log()));
            }
            assert!(
                t0.elapsed() < COME_UP,
                "palisade serve did not come up: {}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// What it wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Sends a request and leaves the connection open (for a test that reads a stream, or walks
    /// away from the request).
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> UnixStream {
        send(&self.sock, method, path, &[], body)
    }

    /// One request; `None` when no complete answer came within `wait`. Fails the test with the
    /// server's log when the server is gone.
    pub fn req_within(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        wait: Duration,
    ) -> Option<Resp> {
        if let Err(e) = UnixStream::connect(&self.sock) {
            panic!(
                "the server is gone ({e}; socket there: {}): {}",
                self.sock.exists(),
                self.log()
            );
        }
        request_within(&self.sock, method, path, &[], body, wait)
    }

    pub fn req(&self, method: &str, path: &str, body: &[u8]) -> Resp {
        self.req_within(method, path, body, ANSWER)
            .unwrap_or_else(|| panic!("no answer to {method} {path}: {}", self.log()))
    }

    /// A GET while the server may not listen yet: `None` when it does not.
    pub fn try_get(&self, path: &str) -> Option<Resp> {
        UnixStream::connect(&self.sock).ok()?;
        request_within(&self.sock, "GET", path, &[], b"", Duration::from_secs(30))
    }

    pub fn get(&self, path: &str) -> Resp {
        self.req("GET", path, b"")
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        self.req("POST", path, body.to_string().as_bytes())
    }

    pub fn delete(&self, path: &str) -> Resp {
        self.req("DELETE", path, b"")
    }

    /// SIGTERM, then waits for the exit; returns its status code.
    pub fn stop(&mut self) -> i32 {
        let mut c = self.child.take().expect("running");
        terminate(&mut c).code().unwrap_or(-1)
    }

    /// A gauge or counter from /metrics.
    pub fn metric(&self, name: &str) -> u64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `palisade serve --listen unix:SOCK`, for the rest of its flags.
pub fn serve_on(sock: &Path) -> Command {
    let mut c = Command::new(palisade_bin());
    c.arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()));
    c
}

/// A process a test started itself, killed if the test fails before it stops it.
pub struct Reap(pub Child);

impl Reap {
    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        terminate(&mut self.0)
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `c` (the way a service manager stops it) and waits for its exit.
pub fn terminate(c: &mut Child) -> ExitStatus {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    c.wait().unwrap()
}

/// An HTTP answer, its body whole (chunks decoded).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body's lines, each a JSON value (NDJSON).
    pub fn lines(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Writes one HTTP/1.1 request (`Connection: close`) on `s`. A server may answer (401, 413) and
/// close before it reads the whole body: a failed write is not an error, the answer is still
/// there to read.
fn write_request(
    s: &mut impl Write,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut all = head.into_bytes();
    all.extend_from_slice(body);
    let _ = s.write_all(&all);
}

/// Sends one request over the unix socket `sock` and leaves the connection open.
pub fn send(
    sock: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> UnixStream {
    let mut s = UnixStream::connect(sock).expect("connect to the server");
    write_request(&mut s, "palisade", method, path, headers, body);
    s
}

/// One request over the unix socket `sock`; `None` when no complete answer came within `wait`.
pub fn request_within(
    sock: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    wait: Duration,
) -> Option<Resp> {
    let mut s = send(sock, method, path, headers, body);
    s.set_read_timeout(Some(wait)).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    Some(parse(&raw))
}

/// One request over the unix socket `sock`.
pub fn request(
    sock: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    request_within(sock, method, path, headers, body, ANSWER)
        .unwrap_or_else(|| panic!("no answer to {method} {path} within {ANSWER:?}"))
}

/// An HTTP/1.1 answer: its status, headers and body (chunked bodies decoded).
pub fn parse(raw: &[u8]) -> Resp {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

/// A chunked body decoded; it must end with its last (empty) chunk.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let n = usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
        rest = &rest[nl + 2 + n + 2..];
    }
}

/// What a server process holds that a leak would leave: child processes, its runs' cgroups,
/// its temporary directories.
#[derive(Debug, PartialEq, Eq)]
pub struct Held {
    pub children: usize,
    pub cgroups: Vec<String>,
    pub temp_dirs: usize,
}

/// The processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The parent is the second field after the command's name, which may hold anything.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if after
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse::<u32>().ok())
            == Some(pid)
        {
            v.push(p);
        }
    }
    v
}

/// Whether `pid`'s command line is a template's zygote's, and it is the zygote itself (in the
/// host's pid namespace), not a run's init cloned from it.
fn is_zygote(pid: u32) -> bool {
    zygote_copy(pid) && ns_pids(pid).len() == 1
}

/// Whether `pid` runs the zygote's program (the zygote, or a run's init cloned from it).
fn zygote_copy(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"palisade-zygote\0"))
}

/// `pid`'s pid in each pid namespace it is in, outermost first (`NSpid`).
fn ns_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("NSpid:")).map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// A template's next run's init, made ahead and waiting for its run: a copy of the zygote, pid 1
/// of a pid namespace of its own, with no process under it and in no run's cgroup.
fn is_ahead(pid: u32) -> bool {
    zygote_copy(pid)
        && ns_pids(pid).last() == Some(&1)
        && children_of(pid).is_empty()
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| !c.contains("/run-"))
}

/// Whether the cgroup directory `dir` holds no process.
fn cgroup_empty(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty())
}

/// The zygotes of `pid`'s templates: its children whose command line is a zygote's.
pub fn zygotes_of(pid: u32) -> Vec<u32> {
    children_of(pid)
        .into_iter()
        .filter(|&p| is_zygote(p))
        .collect()
}

/// The run cgroups of the server `pid` (`run-PID-*`), in every hierarchy.
pub fn run_cgroups(pid: u32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&format!("run-{pid}-")) {
                    found.push(e.path());
                }
                if d.components().count() < 8 {
                    stack.push(e.path());
                }
            }
        }
    }
    found
}

pub fn held(pid: u32) -> Held {
    // A template's zygote is held on purpose (at most --templates of them, each checked by the
    // template tests), and so is its next run's init made ahead and that run's cgroup, empty (at
    // most one each per zygote); a sandbox is anything else.
    let kids = children_of(pid);
    let zygotes = kids.iter().filter(|&&p| is_zygote(p)).count();
    let ahead = kids.iter().filter(|&&p| is_ahead(p)).count();
    let mut children = kids.iter().filter(|&&p| !zygote_copy(p)).count();
    children += kids
        .iter()
        .filter(|&&p| zygote_copy(p) && !is_zygote(p) && !is_ahead(p))
        .count();
    if ahead > zygotes {
        children += ahead;
    }
    let mut cgroups: Vec<String> = run_cgroups(pid)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // Empty run cgroups (one name in each hierarchy) up to one per zygote are made ahead.
    let mut spare: Vec<String> = cgroups
        .iter()
        .filter(|c| cgroup_empty(std::path::Path::new(c)))
        .filter_map(|c| c.rsplit('/').next().map(str::to_owned))
        .collect();
    spare.sort();
    spare.dedup();
    if spare.len() <= zygotes {
        cgroups.retain(|c| {
            !c.rsplit('/')
                .next()
                .is_some_and(|n| spare.iter().any(|s| s == n))
        });
    }
    let temp_dirs = std::fs::read_dir(std::env::temp_dir())
        .map(|r| {
            r.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("palisade-{pid}-"))
                })
                .count()
        })
        .unwrap_or(0);
    Held {
        children,
        cgroups,
        temp_dirs,
    }
}

/// Waits until `pid` holds no sandbox any more (or fails with what is left).
pub fn assert_nothing_held(pid: u32) {
    let t0 = Instant::now();
    loop {
        let h = held(pid);
        if h == (Held {
            children: 0,
            cgroups: Vec::new(),
            temp_dirs: 0,
        }) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "left behind by the server: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `f` until it holds or `limit` has passed; whether it held (when not, says `what` on
/// stderr, for the test's own failure message to follow).
pub fn within(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("not within {limit:?}: {what}");
    false
}

/// Polls `f` until it holds; fails the test naming `what` after a minute.
pub fn wait_until(what: &str, f: impl FnMut() -> bool) {
    assert!(
        within(what, Duration::from_secs(60), f),
        "never happened: {what}"
    );
}

/// A `palisade mcp --listen 127.0.0.1:0 ARGS`, killed when dropped.
pub struct McpHttp {
    pub child: Reap,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The endpoint's URL, as the server printed it.
    pub url: String,
}

impl McpHttp {
    pub fn start(args: &[&str]) -> McpHttp {
        let mut child = Reap(
            Command::new(palisade_bin())
                .args(["mcp", "--listen", "127.0.0.1:0"])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("palisade mcp starts"),
        );
        // The URL, from the line that says where it listens.
        let mut err = BufReader::new(child.0.stderr.take().unwrap());
        let mut line = String::new();
        let url = loop {
            line.clear();
            assert!(
                err.read_line(&mut line).unwrap() > 0,
                "palisade mcp exited before listening"
            );
            if let Some(i) = line.find("http://") {
                break line[i..].trim().to_owned();
            }
        };
        let addr = url["http://".len()..]
            .split('/')
            .next()
            .unwrap_or_else(|| panic!("no address in {url:?}"))
            .to_owned();
        // Keep draining its stderr so that it never blocks on it.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::sink());
        });
        McpHttp { child, addr, url }
    }

    /// One POST to its endpoint, as a Streamable HTTP client sends it, with `headers` added; the
    /// answer as far as it came (a server may close the connection after answering a request it
    /// did not read whole).
    pub fn post(&self, headers: &[(&str, &str)], body: &str) -> Resp {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut all = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        all.extend_from_slice(headers);
        write_request(&mut s, &self.addr, "POST", "/mcp", &all, body.as_bytes());
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        parse(&raw)
    }
}
