//! The stateful code interpreter of a session: contexts, each a persistent Python process inside
//! the session's sandbox (an exec of the session, under its boundary and its cgroup), that
//! evaluates cells one at a time and keeps its variables between them. A cell answers its stdout,
//! stderr, the value of its last expression and its error as `name`/`value`/`traceback`.
//!
//! Everything a context spends is bounded: the size of a cell ([`MAX_CELL_BYTES`]), its output
//! (the request's `output_bytes`, at most the ceiling's output limit), its wall time (the
//! request's `timeout_ms`, at most the ceiling's timeout; past it the interpreter is killed and
//! the context starts afresh at its next cell), the contexts of a session ([`MAX_CONTEXTS`]), and
//! the line the interpreter answers with (read with a cap, checked as JSON).
//!
//! The driver runs in the cell's own interpreter, so the cell can write on the driver's answer
//! pipe: its answer is the code's own word, never trusted further than that. Two things hold
//! whatever it writes. The server holds every field of an answer to the cell's `output_bytes`
//! itself (the value first, then stdout and stderr share what is left; the error's value and
//! traceback each at most the cap). And answers cannot be put out of step: each cell's request
//! carries a fresh random nonce that its answer must repeat; the server skips the answers of
//! earlier cells and takes the first with this cell's nonce. A cell can read its own nonce (it
//! runs in the driver's process) and forge its own answer, but not a later cell's, whose nonce
//! does not exist yet.

use super::Session;
use crate::api::{
    CellError, CellRequest, CellResult, CellStatus, ContextInfo, ContextRequest, Data,
};
use crate::client::Exit;
use crate::proto;
use crate::{Service, ServiceError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// The driver the interpreter runs (`python3 -u -c DRIVER`).
const DRIVER: &str = include_str!("interp.py");
/// Largest cell, in bytes of source.
pub const MAX_CELL_BYTES: usize = 1 << 20;
/// Most contexts a session holds at once.
pub const MAX_CONTEXTS: usize = 8;
/// Default output kept per cell (stdout and stderr together), when the ceiling allows it.
const DEFAULT_CELL_OUTPUT: u64 = 1 << 20;
/// The languages a context may be of.
const LANGUAGES: &str = "python";
/// The id of the context a cell runs in when it names none.
const DEFAULT_CONTEXT: &str = "default";
/// How much of the interpreter's own stderr (outside cells: its start-up) is kept for messages.
const STDERR_KEPT: usize = 4 << 10;
/// Most answers of earlier cells skipped before this cell's (more: the interpreter is broken).
const STALE_MAX: usize = 16;
/// Longest error name kept (a class name).
const ERROR_NAME_MAX: usize = 256;

/// The contexts of one session.
#[derive(Default)]
pub(crate) struct Contexts {
    map: Mutex<HashMap<String, Arc<Context>>>,
    next: AtomicU64,
}

struct Context {
    id: String,
    cwd: String,
    env: Vec<(String, String)>,
    /// The interpreter, when one is running; held for the length of a cell (one at a time).
    proc: tokio::sync::Mutex<Option<Proc>>,
    /// Cells evaluated by the current interpreter.
    count: AtomicU64,
    /// Cells evaluated in all.
    total: AtomicU64,
    /// The interpreter's exec id while one runs (0: none), for a delete during a cell.
    exec: AtomicU64,
}

/// A running interpreter.
struct Proc {
    exec: u64,
    stdin: tokio::net::unix::pipe::Sender,
    stdout: tokio::io::BufReader<tokio::net::unix::pipe::Receiver>,
    /// What it wrote to its own stderr outside cells (start-up errors), the first few KiB.
    stderr: Arc<Mutex<Vec<u8>>>,
    exit: tokio::sync::oneshot::Receiver<Exit>,
    /// Its exec cgroup (under the session's `execs`, with their ceiling), held while it runs.
    _cgroup: Option<CgroupHeld>,
}

/// An interpreter's exec cgroup, handed back (on a blocking thread: cgroup files) when the
/// interpreter is gone.
struct CgroupHeld(Option<palisade::ExecCgroup>);

impl Drop for CgroupHeld {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            super::let_go(c);
        }
    }
}

/// The interpreter's answer for one cell (checked against this shape; unknown fields refused).
/// Its texts come base64-encoded (their bytes), so that a line is at most 4/3 of what it holds
/// whatever the bytes, and the server reads at most that ([`max_answer_line`]); they are held
/// to the cap as bytes before they become text ([`hold`]).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    /// The nonce of the cell it answers.
    nonce: String,
    #[serde(deserialize_with = "b64")]
    stdout: Vec<u8>,
    stdout_truncated: bool,
    #[serde(deserialize_with = "b64")]
    stderr: Vec<u8>,
    stderr_truncated: bool,
    #[serde(default, deserialize_with = "b64_opt")]
    value: Option<Vec<u8>>,
    error: Option<WireError>,
}

/// A cell's error as the driver sends it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WireError {
    name: String,
    #[serde(deserialize_with = "b64")]
    value: Vec<u8>,
    #[serde(deserialize_with = "b64")]
    traceback: Vec<u8>,
}

/// Bytes sent as base64, decoded straight from the line (a base64 string has no escape to
/// copy).
fn b64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    use base64::Engine;
    let s = <&str as serde::Deserialize>::deserialize(d)?;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(serde::de::Error::custom)
}

fn b64_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    #[derive(serde::Deserialize)]
    struct W(#[serde(deserialize_with = "b64")] Vec<u8>);
    Ok(<Option<W> as serde::Deserialize>::deserialize(d)?.map(|w| w.0))
}

/// An answer held to its cell's cap, as text.
struct Held {
    stdout: String,
    stdout_truncated: bool,
    stderr: String,
    stderr_truncated: bool,
    value: Option<String>,
    error: Option<CellError>,
}

/// At most `max` bytes of `b` as text (UTF-8, invalid sequences replaced), and whether it was
/// cut. The bytes are cut first, so a replaced sequence never makes more than `max` of it.
fn text(mut b: Vec<u8>, max: usize) -> (String, bool) {
    let over = b.len() > max;
    b.truncate(max);
    let s = match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    let (s, cut_more) = cut(s, max);
    (s, over || cut_more)
}

/// [`text`], its end marked `…` when cut (and `max` leaves room).
fn text_marked(b: Vec<u8>, max: usize) -> String {
    let (s, was_cut) = text(b, max);
    let mark = '…'.len_utf8();
    if !was_cut || max < mark {
        return s;
    }
    let (mut s, _) = cut(s, max - mark);
    s.push('…');
    s
}

/// The longest answer line the server reads for a cell whose output cap is `cap`: the driver
/// holds the value, stdout and stderr to `cap` together and the error's message and traceback to
/// `cap` each, all base64 (4/3), and a little more for the rest.
fn max_answer_line(cap: u64) -> u64 {
    cap.saturating_mul(4).saturating_add(64 << 10)
}

impl Context {
    fn info(&self, alive: bool) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: LANGUAGES.into(),
            cwd: self.cwd.clone(),
            cells: self.total.load(Ordering::Relaxed),
            alive,
        }
    }
}

fn check_language(l: Option<&str>, field: &str) -> Result<(), ServiceError> {
    match l {
        None | Some("python") | Some("python3") | Some("py") => Ok(()),
        Some(other) => Err(ServiceError {
            code: "unknown-language",
            ..ServiceError::invalid(field, other, LANGUAGES)
        }),
    }
}

impl Service {
    /// `POST /v1/sandboxes/{id}/contexts`: a new context (an interpreter starts at its first cell).
    pub async fn create_context(
        &self,
        id: &str,
        req: ContextRequest,
    ) -> Result<ContextInfo, ServiceError> {
        let s = self.session(id)?;
        s.touch();
        check_language(req.language.as_deref(), "language")?;
        let ctx = new_context(&s, None, &req)?;
        Ok(ctx.info(false))
    }

    /// `GET /v1/sandboxes/{id}/contexts`.
    pub async fn list_contexts(&self, id: &str) -> Result<Vec<ContextInfo>, ServiceError> {
        let s = self.session(id)?;
        s.touch();
        let all: Vec<Arc<Context>> = s
            .contexts
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let mut v = Vec::new();
        for c in all {
            let alive = match c.proc.try_lock() {
                Ok(g) => g.is_some(),
                // A cell is running in it.
                Err(_) => true,
            };
            v.push(c.info(alive));
        }
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }

    /// `DELETE /v1/sandboxes/{id}/contexts/{ctx}`: ends its interpreter (a running cell with it).
    pub async fn delete_context(&self, id: &str, ctx: &str) -> Result<(), ServiceError> {
        let s = self.session(id)?;
        s.touch();
        let c = s
            .contexts
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(ctx)
            .ok_or_else(|| ServiceError::not_found("context", ctx))?;
        // A cell running in it holds the lock: its interpreter is killed by its exec id, and
        // the cell, seeing its context gone from the map, drops what is left.
        let exec = c.exec.swap(0, Ordering::SeqCst);
        if exec != 0 {
            let _ = s.conn.signal(exec, 9).await;
        }
        if let Ok(mut g) = c.proc.try_lock() {
            g.take();
        }
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/run_code`: evaluates one cell in a context (the `default` one
    /// when the request names none), starting its interpreter first when none runs.
    /// The answer holds its bytes against the server's budget (see [`crate::budget`]): a cell
    /// starts only while the budget is not full.
    pub async fn run_cell(
        &self,
        id: &str,
        req: CellRequest,
    ) -> Result<crate::budget::Charged<CellResult>, ServiceError> {
        let s = self.session(id)?;
        s.touch();
        check_language(req.language.as_deref(), "language")?;
        if req.code.len() > MAX_CELL_BYTES {
            return Err(ServiceError::invalid(
                "code",
                format!("{} bytes", req.code.len()),
                format!("at most {MAX_CELL_BYTES} bytes of source"),
            ));
        }
        let c = self.inner.config.ceiling.policy().limits;
        let timeout = req.timeout_ms.unwrap_or(c.timeout_ms);
        if timeout == 0 {
            return Err(ServiceError::invalid(
                "timeout_ms",
                "0",
                format!("between 1 and {}", c.timeout_ms),
            ));
        }
        if timeout > c.timeout_ms {
            return Err(ServiceError::ceiling("timeout_ms", timeout, c.timeout_ms));
        }
        let cap = req
            .output_bytes
            .unwrap_or(DEFAULT_CELL_OUTPUT.min(c.output_bytes));
        if cap == 0 || cap > c.output_bytes {
            return Err(ServiceError::ceiling("output_bytes", cap, c.output_bytes));
        }
        let ctx = match req.context.as_deref() {
            None => {
                let known = s
                    .contexts
                    .map
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(DEFAULT_CONTEXT)
                    .cloned();
                match known {
                    Some(c) => c,
                    None => new_context(&s, Some(DEFAULT_CONTEXT), &ContextRequest::default())?,
                }
            }
            Some(name) => s
                .contexts
                .map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .cloned()
                .ok_or_else(|| ServiceError::not_found("context", name))?,
        };
        // The cell is kept (its timeout, its end) by a task of its own, not by the request: a
        // client that goes away leaves it to end at its timeout and to leave the session's
        // running list.
        let svc = self.clone();
        let code = req.code;
        // Room for the largest answer the cell may give (the line read from the interpreter),
        // held by the cell's own task for as long as it runs: cells at once, in many contexts
        // and sessions, cannot make more than the budget.
        let limit = self.inner.held.limit();
        if max_answer_line(cap) > limit {
            // It could never fit: not `busy` (retrying would not help), but the most it may ask.
            let most = limit.saturating_sub(64 << 10) / 4;
            return Err(ServiceError::ceiling("output_bytes", cap, most));
        }
        let held = self.inner.held.reserve(max_answer_line(cap))?;
        let (r, mut held) = super::own_task("a cell", async move {
            let r = svc.cell(s, ctx, code, cap, timeout).await?;
            Ok((r, held))
        })
        .await?;
        let size = r.stdout.data.len()
            + r.stderr.data.len()
            + r.value.as_ref().map_or(0, String::len)
            + r.error
                .as_ref()
                .map_or(0, |e| e.value.len() + e.traceback.len());
        held.set(size as u64);
        Ok(crate::budget::Charged::new(r, held))
    }

    /// Runs one cell in `ctx` (see [`Service::run_cell`]).
    async fn cell(
        &self,
        s: Arc<Session>,
        ctx: Arc<Context>,
        code: String,
        cap: u64,
        timeout: u64,
    ) -> Result<CellResult, ServiceError> {
        let Ok(mut guard) = ctx.proc.try_lock() else {
            return Err(ServiceError::conflict(
                "context",
                format!(
                    "a cell is running in context {}; contexts run one cell at a time",
                    ctx.id
                ),
            ));
        };
        let restarted = guard.is_none();
        if guard.is_none() {
            let p = self.start_interpreter(&s, &ctx).await?;
            ctx.exec.store(p.exec, Ordering::SeqCst);
            *guard = Some(p);
            ctx.count.store(0, Ordering::Relaxed);
        }
        let exec = guard.as_ref().map(|p| p.exec).unwrap_or_default();
        // A running cell keeps the session from going idle, like a running exec.
        s.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(exec);
        let nonce = match new_nonce() {
            Ok(n) => n,
            Err(e) => {
                s.running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|x| *x != exec);
                return Err(e);
            }
        };
        let t0 = Instant::now();
        let line = {
            let p = guard.as_mut().expect("started above");
            let mut req_line = serde_json::to_vec(
                &serde_json::json!({"code": code, "output": cap, "nonce": nonce}),
            )
            .map_err(|e| ServiceError::internal(format!("encoding a cell: {e}")))?;
            req_line.push(b'\n');
            let max_line = max_answer_line(cap);
            tokio::time::timeout(
                Duration::from_millis(timeout),
                exchange(p, &req_line, max_line, &nonce),
            )
            .await
        };
        s.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| *x != exec);
        s.touch();
        s.wake.notify_waiters();
        let wall_time_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let n = ctx.count.fetch_add(1, Ordering::Relaxed) + 1;
        ctx.total.fetch_add(1, Ordering::Relaxed);
        let base = CellResult {
            context: ctx.id.clone(),
            execution_count: n,
            status: CellStatus::Ok,
            stdout: Data::new(Vec::new(), false),
            stderr: Data::new(Vec::new(), false),
            value: None,
            error: None,
            wall_time_ms,
            restarted,
        };
        let deleted = !s
            .contexts
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&ctx.id);
        let out = match line {
            Ok(Ok(a)) => {
                let a = hold(a, cap as usize);
                let status = if a.error.is_some() {
                    CellStatus::Error
                } else {
                    CellStatus::Ok
                };
                CellResult {
                    status,
                    stdout: Data::new(a.stdout.into_bytes(), a.stdout_truncated),
                    stderr: Data::new(a.stderr.into_bytes(), a.stderr_truncated),
                    value: a.value,
                    error: a.error,
                    ..base
                }
            }
            Ok(Err(why)) => {
                // The interpreter ended (os._exit, a signal, the OOM killer) or broke the
                // protocol: the context's state is gone; its next cell starts afresh.
                let p = guard.take().expect("started above");
                let _ = s.conn.signal(p.exec, 9).await;
                let detail = end_detail(p).await;
                CellResult {
                    status: CellStatus::Exited,
                    error: Some(CellError {
                        name: "InterpreterExited".into(),
                        value: format!("{why}{detail}; the context's state is lost and its next cell starts a new interpreter"),
                        traceback: String::new(),
                    }),
                    ..base
                }
            }
            Err(_) => {
                let p = guard.take().expect("started above");
                let _ = s.conn.signal(p.exec, 9).await;
                CellResult {
                    status: CellStatus::Timeout,
                    error: Some(CellError {
                        name: "TimeoutError".into(),
                        value: format!("the cell ran past its timeout of {timeout} ms and its interpreter was killed; the context's state is lost and its next cell starts a new interpreter"),
                        traceback: String::new(),
                    }),
                    ..base
                }
            }
        };
        if deleted {
            if let Some(p) = guard.take() {
                let _ = s.conn.signal(p.exec, 9).await;
            }
        }
        Ok(out)
    }

    async fn start_interpreter(
        &self,
        s: &Arc<Session>,
        ctx: &Context,
    ) -> Result<Proc, ServiceError> {
        let argv = vec![
            "python3".to_string(),
            "-u".into(),
            "-c".into(),
            DRIVER.into(),
        ];
        let mut env = s.env.clone();
        for (k, v) in &ctx.env {
            env.retain(|(n, _)| n != k);
            env.push((k.clone(), v.clone()));
        }
        // An exec cgroup of its own, as an exec's, so that what a cell writes meets the execs'
        // ceiling, never the session's: started beside the agent, a cell that wrote 400 MiB
        // into scratch had the kernel kill the agent (found by an independent attack).
        let (own, join) = s.exec_cgroup_to_join().await;
        let cgroup = Some(CgroupHeld(own));
        let e = match s.conn.exec(argv, env, ctx.cwd.clone(), &join).await {
            Ok(Ok(e)) => e,
            Ok(Err((code, message))) => return Err(crate::run::exec_error(&code, &message)),
            Err(e) => {
                return Err(ServiceError::gone(
                    &s.id,
                    &format!("its agent is gone ({})", e.0),
                ))
            }
        };
        s.count.fetch_add(1, Ordering::Relaxed);
        self.inner.metrics.exec();
        let crate::client::Exec {
            id,
            stdin,
            stdout,
            mut stderr,
            exit,
            ..
        } = e;
        let kept = Arc::new(Mutex::new(Vec::new()));
        let k2 = kept.clone();
        // Drains the interpreter's own stderr (so it never blocks on it), keeping the first KiB.
        tokio::spawn(async move {
            let mut b = vec![0u8; 8 << 10];
            while let Ok(n) = stderr.read(&mut b).await {
                if n == 0 {
                    break;
                }
                let mut k = k2.lock().unwrap_or_else(|p| p.into_inner());
                let room = STDERR_KEPT.saturating_sub(k.len());
                k.extend_from_slice(&b[..n.min(room)]);
            }
        });
        let Some(stdin) = stdin else {
            return Err(ServiceError::internal("the interpreter has no stdin"));
        };
        Ok(Proc {
            exec: id,
            stdin,
            stdout: tokio::io::BufReader::with_capacity(64 << 10, stdout),
            stderr: kept,
            exit,
            _cgroup: cgroup,
        })
    }
}

fn new_context(
    s: &Arc<Session>,
    name: Option<&str>,
    req: &ContextRequest,
) -> Result<Arc<Context>, ServiceError> {
    let cwd = match &req.cwd {
        None => String::new(),
        Some(p) => {
            proto::check_path(p).map_err(|e| ServiceError::invalid("cwd", p.as_str(), e))?;
            p.clone()
        }
    };
    let mut env = Vec::new();
    for (k, v) in &req.env {
        palisade::policy::EnvVar::new(k, v)
            .map_err(|e| ServiceError::invalid(format!("env.{k}"), k.as_str(), e.to_string()))?;
        env.push((k.clone(), v.clone()));
    }
    let mut map = s.contexts.map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = name {
        if let Some(c) = map.get(n) {
            return Ok(c.clone());
        }
    }
    if map.len() >= MAX_CONTEXTS {
        return Err(ServiceError::conflict(
            "contexts",
            format!(
                "the session already holds its maximum of {MAX_CONTEXTS} contexts; delete one first"
            ),
        ));
    }
    let id = match name {
        Some(n) => n.to_owned(),
        None => format!(
            "ctx-{}",
            s.contexts.next.fetch_add(1, Ordering::Relaxed) + 1
        ),
    };
    let c = Arc::new(Context {
        id: id.clone(),
        cwd,
        env,
        proc: tokio::sync::Mutex::new(None),
        count: AtomicU64::new(0),
        total: AtomicU64::new(0),
        exec: AtomicU64::new(0),
    });
    map.insert(id, c.clone());
    Ok(c)
}

/// A fresh nonce for a cell: 128 random bits, in hex.
fn new_nonce() -> Result<String, ServiceError> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .map_err(|e| ServiceError::internal(format!("a cell's nonce from /dev/urandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// `s` cut to at most `max` bytes at a character's boundary; whether it was cut.
fn cut(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (s, true)
}

/// `s` cut to at most `max` bytes, its end marked `…` when it was cut (and `max` leaves room).
fn cut_marked(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mark = '…'.len_utf8();
    if max < mark {
        return cut(s, max).0;
    }
    let (mut s, _) = cut(s, max - mark);
    s.push('…');
    s
}

/// The answer held to the cell's cap, whatever the interpreter wrote: the value first, then
/// stdout and stderr share what is left (each marked truncated when cut); the error's value and
/// traceback each at most the cap, its name at most [`ERROR_NAME_MAX`].
fn hold(a: Answer, cap: usize) -> Held {
    let value = a.value.map(|v| text_marked(v, cap));
    let room = cap - value.as_ref().map_or(0, |v| v.len());
    let (stdout, out_cut) = text(a.stdout, room);
    let room = room - stdout.len();
    let (stderr, err_cut) = text(a.stderr, room);
    let error = a.error.map(|e| CellError {
        name: cut_marked(e.name, ERROR_NAME_MAX),
        value: text_marked(e.value, cap),
        traceback: text_marked(e.traceback, cap),
    });
    Held {
        stdout,
        stdout_truncated: a.stdout_truncated || out_cut,
        stderr,
        stderr_truncated: a.stderr_truncated || err_cut,
        value,
        error,
    }
}

/// Sends one cell and reads its answer: the first line with the cell's `nonce` (answers of
/// earlier cells, which a cell that wrote on the answer pipe left behind, are skipped, at most
/// [`STALE_MAX`]), each line at most `max_line` bytes, JSON of the answer's shape. An error
/// says why the interpreter is no longer usable.
async fn exchange(p: &mut Proc, req: &[u8], max_line: u64, nonce: &str) -> Result<Answer, String> {
    p.stdin
        .write_all(req)
        .await
        .map_err(|e| format!("the interpreter does not read its input ({e})"))?;
    for _ in 0..=STALE_MAX {
        let a = read_answer(p, max_line).await?;
        if a.nonce == nonce {
            return Ok(a);
        }
    }
    Err(format!(
        "the interpreter answered more than {STALE_MAX} times with another cell's nonce"
    ))
}

/// One answer line.
async fn read_answer(p: &mut Proc, max_line: u64) -> Result<Answer, String> {
    let line = read_line_upto(&mut p.stdout, max_line)
        .await
        .map_err(|e| format!("reading the interpreter's answer: {e}"))?;
    let n = line.len();
    if n == 0 {
        return Err("the interpreter exited".into());
    }
    if line.last() != Some(&b'\n') {
        return Err(if n as u64 > max_line {
            format!("the interpreter's answer is longer than {max_line} bytes")
        } else {
            "the interpreter exited".into()
        });
    }
    let a: Answer = serde_json::from_slice(&line)
        .map_err(|e| format!("the interpreter's answer is not of the protocol ({e})"))?;
    Ok(a)
}

/// A line (with its `\n`) read from `r`, or what came before the end of the stream or before
/// `max + 1` bytes. The buffer grows by doubling but never past `max + 1` bytes, so a line of
/// the longest kind costs about that, not twice.
async fn read_line_upto<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    max: u64,
) -> std::io::Result<Vec<u8>> {
    let limit = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(line);
        }
        let (end, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let take = end.min(limit - line.len());
        if line.capacity() - line.len() < take {
            let want = (line.len() + take).max(line.capacity() * 2).min(limit);
            line.reserve_exact(want - line.len());
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if (done && take == end) || line.len() >= limit {
            return Ok(line);
        }
    }
}

/// How the interpreter ended, for the message: its exit code or signal and its first stderr.
async fn end_detail(p: Proc) -> String {
    let exit = tokio::time::timeout(Duration::from_secs(2), p.exit).await;
    let mut s = match exit {
        Ok(Ok(Exit { code: Some(c), .. })) => format!(" (exit code {c})"),
        Ok(Ok(Exit {
            signal: Some(g), ..
        })) => format!(" (killed by signal {g})"),
        _ => String::new(),
    };
    let kept = p.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if !kept.is_empty() {
        s.push_str(": ");
        s.push_str(&crate::shorten(&String::from_utf8_lossy(&kept), 1000));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes become text only once cut to the cap: invalid bytes (each replaced by three) never
    /// make more than the cap, and a cut is said.
    #[test]
    fn answer_texts_are_cut_as_bytes_before_they_become_text() {
        let (t, cut) = text(vec![0xff; 1000], 10);
        assert!(t.len() <= 10 && cut, "{} bytes, cut {cut}", t.len());
        assert_eq!(text(b"hello".to_vec(), 10), ("hello".to_owned(), false));
        let (t, cut) = text("é".repeat(10).into_bytes(), 5);
        assert_eq!((t.as_str(), cut), ("éé", true));
        assert_eq!(text_marked(b"abcdefgh".to_vec(), 6), "abc…");
        assert_eq!(text_marked(b"abc".to_vec(), 6), "abc");
    }

    /// A line is read up to its bound and no further, whatever follows; a line within it whole.
    #[tokio::test]
    async fn an_answer_line_is_read_up_to_its_bound() {
        let data = [vec![b'a'; 100], b"\nnext\n".to_vec()].concat();
        let mut r = tokio::io::BufReader::with_capacity(7, &data[..]);
        let l = read_line_upto(&mut r, 10).await.unwrap();
        assert_eq!(l.len(), 11);
        assert!(l.capacity() <= 11, "{}", l.capacity());
        let mut r = tokio::io::BufReader::with_capacity(7, &b"short\nrest"[..]);
        assert_eq!(read_line_upto(&mut r, 10).await.unwrap(), b"short\n");
        assert_eq!(read_line_upto(&mut r, 10).await.unwrap(), b"rest");
    }
}
