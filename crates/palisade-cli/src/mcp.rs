//! `palisade mcp`: the service core as a Model Context Protocol server (docs/mcp.md), over the
//! official Rust SDK (`rmcp`). stdio by default (newline-delimited JSON-RPC on stdin/stdout, logs
//! on stderr, exit at end of input), Streamable HTTP with `--listen`.
//!
//! Thin, like `palisade serve`: the tools decode their arguments (a bad one is a tool error
//! naming the field), call the [`Service`], and shape its answers for a model: one result shape,
//! output cut to its head and tail with the whole kept as a resource, a tool error that says what
//! to change. No call waits longer than `--max-call`: a longer command runs in the background and
//! is polled.
// Errors carry the field, the value and what is accepted, on the cold path (see the service).
#![allow(clippy::result_large_err)]

use anyhow::Context;
use palisade_service::api::{self, Content, ExecEvent, Stage};
use palisade_service::{Class, Config, Service, ServiceError};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `palisade mcp`.
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// Serve Streamable HTTP at HOST:PORT (path /mcp) instead of stdio. Anything but a loopback
    /// address needs --token-file.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// The server's policy (TOML, the schema of `palisade run --policy`): every call's defaults
    /// and ceiling. A call may narrow it, never widen it.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Apply a built-in profile to the server's policy (repeatable): default, python, pypi, node,
    /// npm, shell, build.
    #[arg(long = "profile", value_name = "NAME")]
    profile: Vec<String>,
    /// With --listen: a file holding the bearer token every request must send
    /// (`Authorization: Bearer TOKEN`). Required on a non-loopback address.
    #[arg(long = "token-file", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// With --listen: a browser origin allowed besides loopback ones (repeatable), e.g.
    /// https://app.example.com:443. Requests with any other Origin header are refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    /// With --listen: a client that takes none of its answer for this long is disconnected, and
    /// what the answer held is given back.
    #[arg(long = "send-timeout", value_name = "DURATION", default_value = "30s")]
    send_timeout: String,
    /// Sandboxes that run at once (default: twice the CPUs).
    #[arg(long = "max-concurrency", value_name = "N")]
    max_concurrency: Option<usize>,
    /// Longest a tool call waits, e.g. 50s: a run or exec asking for a longer timeout is refused
    /// (run it with sandbox_exec's `background` and poll it). Hosts time tool calls out at ~60 s.
    #[arg(long = "max-call", value_name = "DURATION", default_value = "50s")]
    max_call: String,
    /// Output (stdout, stderr, a file read) shown per stream in a result, e.g. 8KiB: its head and
    /// tail, the cut marked; the whole stays readable as a resource.
    #[arg(long = "output-shown", value_name = "SIZE", default_value = "8KiB")]
    output_shown: String,
    /// Default output kept per run or exec (stdout plus stderr; a call may ask more, up to the
    /// policy's output limit).
    #[arg(long = "output-kept", value_name = "SIZE", default_value = "512KiB")]
    output_kept: String,
    /// Most bytes read back from a sandbox: the files of a run together, or one file.
    #[arg(long = "max-fetch", value_name = "SIZE", default_value = "16MiB")]
    max_fetch: String,
    /// Most bytes held for calls' answers at once, e.g. 512MiB: programs' output as it is
    /// captured, files read back, and answers (and resource reads) while they are made. While it
    /// is full, new runs, execs and reads are refused (`busy`), and output past it is cut
    /// (output-limit). Whole outputs kept as resources are 64 MiB more, in all.
    #[arg(long = "max-held", value_name = "SIZE", default_value = "512MiB")]
    max_held: String,
    /// Longest (and default) sandbox TTL, e.g. 1h.
    #[arg(long = "session-ttl", value_name = "DURATION", default_value = "1h")]
    session_ttl: String,
    /// Default idle timeout of a sandbox, e.g. 10m.
    #[arg(long = "session-idle", value_name = "DURATION", default_value = "10m")]
    session_idle: String,
    /// Sandboxes (sessions) alive at once.
    #[arg(long = "max-sessions", value_name = "N", default_value_t = 16)]
    max_sessions: usize,
}

/// Total bytes of whole outputs kept as resources (the oldest go first).
const KEPT_TOTAL: usize = 64 << 20;
/// How often a running call reports progress (when the client sent a progress token).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Runs `palisade mcp`; returns the exit code.
pub fn main(a: McpArgs) -> anyhow::Result<i32> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let ceiling = crate::serve::ceiling(a.policy.as_deref(), &a.profile)?;
    let egress = !ceiling_allow(&ceiling).is_empty();
    let exe =
        std::env::current_exe().context("cannot find palisade's own executable (the agent)")?;
    let mut config = Config::new(ceiling, exe);
    if let Some(n) = a.max_concurrency {
        anyhow::ensure!(n >= 1, "--max-concurrency {n}: at least 1");
        config.max_concurrency = n;
    }
    config.max_fetch_bytes = palisade::policy::parse_size("--max-fetch", &a.max_fetch)?;
    config.max_held_bytes = palisade::policy::parse_size("--max-held", &a.max_held)?;
    anyhow::ensure!(
        config.max_held_bytes >= 64 << 10,
        "--max-held {}: at least 64KiB (the bytes held for answers at once, across all calls)",
        a.max_held
    );
    config.session_ttl = palisade::policy::parse_duration("--session-ttl", &a.session_ttl)?;
    config.session_idle = palisade::policy::parse_duration("--session-idle", &a.session_idle)?;
    anyhow::ensure!(
        (1..=10_000).contains(&a.max_sessions),
        "--max-sessions {}: from 1 to 10000 (each sandbox holds processes and a cgroup)",
        a.max_sessions
    );
    config.max_sessions = a.max_sessions;
    // Nobody reads what runs after the client went away.
    config.shutdown_grace = Duration::ZERO;
    let max_call = palisade::policy::parse_duration("--max-call", &a.max_call)?;
    anyhow::ensure!(
        max_call >= Duration::from_secs(1),
        "--max-call {}: at least 1s",
        a.max_call
    );
    let shown = palisade::policy::parse_size("--output-shown", &a.output_shown)?;
    let send_timeout = palisade::policy::parse_duration("--send-timeout", &a.send_timeout)?;
    anyhow::ensure!(
        send_timeout >= std::time::Duration::from_secs(1),
        "--send-timeout {}: at least 1s",
        a.send_timeout
    );
    anyhow::ensure!(
        (256..=1 << 20).contains(&shown),
        "--output-shown {}: between 256B and 1MiB",
        a.output_shown
    );
    let kept = palisade::policy::parse_size("--output-kept", &a.output_kept)?;
    anyhow::ensure!(kept >= 1, "--output-kept {}: at least 1B", a.output_kept);
    let listen = match &a.listen {
        None => None,
        Some(s) => Some(s.parse::<std::net::SocketAddr>().with_context(|| {
            format!("--listen {s}: expected HOST:PORT (e.g. 127.0.0.1:8765, [::1]:8765)")
        })?),
    };
    let token = match &a.token_file {
        Some(p) => {
            anyhow::ensure!(
                listen.is_some(),
                "--token-file: only with --listen (stdio has no one else to keep out)"
            );
            Some(crate::serve::read_token(p)?)
        }
        None => None,
    };
    if let Some(addr) = &listen {
        anyhow::ensure!(
            addr.ip().is_loopback() || token.is_some(),
            "--listen {addr}: not a loopback address, so anyone who can reach it could run code here; give --token-file (or listen on 127.0.0.1)"
        );
    }
    for o in &a.allow_origin {
        // An Origin header is scheme://host[:port] and nothing more: a value with a path, query,
        // user or blank would never match one, so it is a mistake worth naming.
        let rest = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        anyhow::ensure!(
            rest.is_some_and(|r| !r.is_empty()
                && !r.contains(['/', '?', '#', '@'])
                && !r.chars().any(|c| c.is_whitespace() || c.is_control())),
            "--allow-origin {}: expected an origin, scheme://host[:port] with nothing after it, e.g. https://app.example.com:443",
            palisade::policy::untrusted::escape(o, 200)
        );
    }
    palisade_service::raise_open_files();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let opts = Opts {
        max_call,
        shown: shown as usize,
        kept,
        egress,
    };
    rt.block_on(async move {
        // No pool: the handshake is answered at once; sandboxes start when a call asks.
        let svc = Service::new(config);
        let server = Server::new(svc.clone(), opts);
        let r = match listen {
            None => serve_stdio(server).await,
            Some(addr) => serve_http(server, addr, token, a.allow_origin, send_timeout).await,
        };
        svc.shutdown().await;
        r
    })?;
    Ok(0)
}

/// The ceiling's allow rules (empty: the server allows no egress).
fn ceiling_allow(c: &palisade_service::Ceiling) -> Vec<String> {
    c.policy()
        .network
        .allow
        .iter()
        .map(|r| r.to_string())
        .collect()
}

async fn serve_stdio(server: Server) -> anyhow::Result<()> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP handshake on stdio")?;
    tokio::select! {
        r = running.waiting() => { r.context("serving MCP on stdio")?; }
        _ = terminated() => { tracing::info!("signalled: stopping"); }
    }
    Ok(())
}

async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn serve_http(
    server: Server,
    addr: std::net::SocketAddr,
    token: Option<Arc<str>>,
    origins: Vec<String>,
    send_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let ct = tokio_util_token();
    let mut allowed: Vec<String> = vec![
        "http://localhost:*".into(),
        "http://127.0.0.1:*".into(),
        "http://[::1]:*".into(),
    ];
    allowed.extend(origins);
    let mut cfg = StreamableHttpServerConfig::default()
        .with_allowed_origins(allowed)
        .enforce_origin_validation()
        .with_max_request_body_bytes(16 << 20)
        .with_cancellation_token(ct.clone());
    if !addr.ip().is_loopback() {
        // Off loopback the bearer token keeps others out (a DNS-rebinding page cannot send it).
        cfg = cfg.disable_allowed_hosts();
    }
    let svc = StreamableHttpService::new(
        move || Ok(server.for_session()),
        Arc::new(LocalSessionManager::default()),
        cfg,
    );
    let router = axum::Router::new()
        .nest_service("/mcp", svc)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let token = token.clone();
                async move {
                    if let Some(t) = token {
                        let ok = req
                            .headers()
                            .get(axum::http::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Bearer "))
                            .is_some_and(|v| ct_eq(v.as_bytes(), t.as_bytes()));
                        if !ok {
                            return axum::response::IntoResponse::into_response((
                                axum::http::StatusCode::UNAUTHORIZED,
                                [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                                "a bearer token is required (Authorization: Bearer TOKEN)\n",
                            ));
                        }
                    }
                    next.run(req).await
                }
            },
        ));
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--listen {addr}"))?;
    // The address on stderr, for whoever started us on port 0.
    eprintln!("palisade mcp: listening on http://{}/mcp", l.local_addr()?);
    let l = crate::stall::Stall {
        inner: l,
        timeout: send_timeout,
    };
    let stop = ct.clone();
    let shutdown = async move {
        terminated().await;
        stop.cancel();
    };
    crate::stall::serve(l, router, shutdown, send_timeout).await;
    Ok(())
}

fn tokio_util_token() -> tokio_util::sync::CancellationToken {
    tokio_util::sync::CancellationToken::new()
}

/// Compares in time independent of where they differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[derive(Clone, Copy)]
struct Opts {
    max_call: Duration,
    shown: usize,
    kept: u64,
    egress: bool,
}

/// The MCP server: the tools over one [`Service`]. Cheap to clone (HTTP makes one per session).
#[derive(Clone)]
struct Server {
    svc: Service,
    opts: Opts,
    tools: Arc<Vec<Tool>>,
    kept: Arc<Mutex<Kept>>,
    /// The MCP session this handler serves (each Streamable HTTP session gets its own): a kept
    /// output is readable only by the session whose call made it, whoever knows its URI.
    owner: u64,
    /// Made for one Streamable HTTP session or request (not the standard-I/O server's one).
    http: bool,
    /// Whether this call's whole outputs are kept: not for a call of a revision without
    /// sessions over HTTP (2026-07-28), whose handler serves that one request, so that no later
    /// request could read them back.
    keep: bool,
}

/// Whole outputs kept as resources, newest last, at most [`KEPT_TOTAL`] bytes together (for all
/// sessions: one bound for the server), each with the session that may read it back.
#[derive(Default)]
struct Kept {
    next: u64,
    bytes: usize,
    items: VecDeque<KeptOutput>,
}

/// One whole output kept: its number (in its URI), URI, what it is, session, bytes, and whether
/// they are UTF-8 (found once, when kept).
struct KeptOutput {
    seq: u64,
    uri: String,
    what: String,
    owner: u64,
    bytes: Arc<Vec<u8>>,
    text: bool,
}

/// Kept outputs listed per `resources/list` page (a session may have thousands).
const LIST_PAGE: usize = 100;

impl Kept {
    fn put(&mut self, what: &str, owner: u64, b: Vec<u8>) -> String {
        self.next += 1;
        let uri = format!("palisade://output/{}/{what}", self.next);
        if b.len() > KEPT_TOTAL {
            return uri;
        }
        self.bytes += b.len();
        self.items.push_back(KeptOutput {
            seq: self.next,
            uri: uri.clone(),
            what: what.to_owned(),
            owner,
            text: std::str::from_utf8(&b).is_ok(),
            bytes: Arc::new(b),
        });
        while self.bytes > KEPT_TOTAL {
            match self.items.pop_front() {
                Some(old) => self.bytes -= old.bytes.len(),
                None => break,
            }
        }
        uri
    }

    /// The output at `uri` if `owner`'s session made it (another session's is as unknown).
    fn get(&self, uri: &str, owner: u64) -> Option<Arc<Vec<u8>>> {
        self.items
            .iter()
            .find(|k| k.uri == uri && k.owner == owner)
            .map(|k| k.bytes.clone())
    }

    /// `owner`'s kept outputs numbered after `after`, oldest first, at most [`LIST_PAGE`], and
    /// the number to go on after if there are more: their URI, what they are, size and whether
    /// they are text. The items are in the order of their numbers, so a page starts with a
    /// binary search; its `Resource`s are made by the caller, after the lock is let go.
    fn list(&self, owner: u64, after: u64) -> (Vec<Listed>, Option<u64>) {
        let from = self.items.partition_point(|k| k.seq <= after);
        let mut mine = self.items.range(from..).filter(|k| k.owner == owner);
        let page: Vec<&KeptOutput> = mine.by_ref().take(LIST_PAGE).collect();
        let more = mine.next().is_some();
        let next = page.last().filter(|_| more).map(|k| k.seq);
        let page = page
            .into_iter()
            .map(|k| Listed {
                uri: k.uri.clone(),
                seq: k.seq,
                what: k.what.clone(),
                size: k.bytes.len(),
                text: k.text,
            })
            .collect();
        (page, next)
    }
}

/// What `resources/list` shows of a kept output, copied out of [`Kept`] under its lock.
struct Listed {
    uri: String,
    seq: u64,
    what: String,
    size: usize,
    text: bool,
}

/// A `resources/list` entry for a kept output.
fn kept_resource(l: Listed) -> Resource {
    Resource::new(l.uri, format!("output {} ({})", l.seq, l.what))
        .with_description(format!(
            "The whole {} of a call of this session ({} bytes), cut in the call's result; \
             kept up to {} MiB for all sessions, the oldest dropped first",
            l.what,
            l.size,
            KEPT_TOTAL >> 20
        ))
        .with_mime_type(if l.text {
            "text/plain"
        } else {
            "application/octet-stream"
        })
        .with_size(l.size as u64)
}

// ---------------------------------------------------------------------------------------------
// The tools' arguments.

/// `run_code`: one program in a fresh sandbox, destroyed after.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunCodeArgs {
    /// The language of `code` (the tool's description lists those this server has). Either this
    /// and `code`, or `command`.
    #[serde(default)]
    language: Option<String>,
    /// Source code, written to the language's main file in the working directory and run.
    #[serde(default)]
    code: Option<String>,
    /// A program and its arguments, looked up in the sandbox's PATH (e.g. ["sh", "-c", "ls"]).
    #[serde(default)]
    command: Option<Vec<String>>,
    /// Extra arguments for the program built from `code`.
    #[serde(default)]
    args: Vec<String>,
    /// Standard input: text, or {"base64": "..."} for bytes.
    #[serde(default)]
    stdin: Option<Content>,
    /// Files written into the working directory first: relative path → text or {"base64": "..."}.
    #[serde(default)]
    files: BTreeMap<String, Content>,
    /// Files to read back after the run (relative paths).
    #[serde(default)]
    return_files: Vec<String>,
    /// Environment variables inside (name → value).
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Wall-clock limit in milliseconds (at most the server's ceiling and its longest call).
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// Hosts the code may reach (e.g. "pypi.org", "*.pythonhosted.org"), each within the
    /// server's allow-list. None: no network.
    #[serde(default)]
    allow_net: Vec<String>,
    /// More limits, each at most the server's ceiling.
    #[serde(default)]
    limits: api::Limits,
}

/// `sandbox_create`: a sandbox that lives across calls.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateArgs {
    /// Seconds it lives at most (at most the server's TTL, which is also the default).
    #[serde(default)]
    ttl_s: Option<u64>,
    /// Seconds without a call after which it is destroyed.
    #[serde(default)]
    idle_timeout_s: Option<u64>,
    /// Hosts its programs may reach, each within the server's allow-list. None: no network.
    #[serde(default)]
    allow_net: Vec<String>,
    /// Environment variables for every exec.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Limits of the whole sandbox (memory, processes, CPU time… shared by all its execs).
    #[serde(default)]
    limits: api::Limits,
}

/// `sandbox_exec`: a command in a sandbox, or the state of a background one.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    /// The sandbox, from sandbox_create.
    sandbox_id: String,
    /// A program and its arguments (e.g. ["python3", "main.py"], ["sh", "-c", "make && ./a"]).
    /// Not with `exec_id`.
    #[serde(default)]
    command: Option<Vec<String>>,
    /// Standard input: text, or {"base64": "..."}.
    #[serde(default)]
    stdin: Option<Content>,
    /// Environment variables for this exec, on top of the sandbox's.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Working directory, relative to the sandbox's.
    #[serde(default)]
    cwd: Option<String>,
    /// Wall-clock limit in milliseconds. Without `background`, at most the server's longest call.
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// Start it and answer at once with its `exec_id`; poll with `exec_id` for the result.
    #[serde(default)]
    background: bool,
    /// Poll a background exec instead of starting one.
    #[serde(default)]
    exec_id: Option<u64>,
    /// When polling: milliseconds to wait for it to end before answering `running` (default 0,
    /// at most the server's longest call).
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// `sandbox_write_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// The sandbox.
    sandbox_id: String,
    /// Relative path → text or {"base64": "..."}. Parent directories are made.
    files: BTreeMap<String, Content>,
}

/// `sandbox_read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// The sandbox.
    sandbox_id: String,
    /// A regular file, relative to the working directory.
    path: String,
}

/// `sandbox_list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    /// The sandbox.
    sandbox_id: String,
    /// A directory relative to the working directory (default: the working directory).
    #[serde(default)]
    path: Option<String>,
}

/// `sandbox_kill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct KillArgs {
    /// The sandbox to destroy with everything in it.
    sandbox_id: String,
}

// ---------------------------------------------------------------------------------------------
// The one result shape.

/// Every tool's result (fields that do not apply are left out).
#[derive(Debug, Default, Serialize, JsonSchema)]
struct ToolResult {
    /// `ok`, `exit` (non-zero exit code), `signal`, `timeout`, `cpu-timeout`, `oom`,
    /// `output-limit`, `policy-denied`, `sandbox-error`; `running` for a background exec not yet
    /// ended; `error` when the call was refused (see `error`).
    status: String,
    /// The exit code, when it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    /// The signal that killed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    /// Wall-clock time, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<f64>,
    /// Standard output.
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout: Option<Shown>,
    /// Standard error.
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr: Option<Shown>,
    /// The compile stage, for compiled languages.
    #[serde(skip_serializing_if = "Option::is_none")]
    compile: Option<Compile>,
    /// Files read back (run_code's `return_files`, sandbox_read_file): path → content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    files: BTreeMap<String, Shown>,
    /// Files that could not be read back: path → why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    file_errors: BTreeMap<String, String>,
    /// Connections and look-ups refused by the egress policy (`host:port (reason)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    denied_egress: Vec<String>,
    /// System calls the sandbox refused (`name ×count (errno)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    refused_calls: Vec<String>,
    /// The sandbox (sandbox_create, sandbox_exec…).
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<String>,
    /// Seconds until the sandbox's TTL (sandbox_create).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_in_s: Option<f64>,
    /// A background exec's id, to poll with sandbox_exec's `exec_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    exec_id: Option<u64>,
    /// A directory's entries (sandbox_list_files).
    #[serde(skip_serializing_if = "Option::is_none")]
    entries: Option<Vec<palisade_service::proto::Entry>>,
    /// `true` when the directory has more entries than one listing holds (the first by name are
    /// in `entries`): list a subdirectory for the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    entries_truncated: Option<bool>,
    /// Files written (sandbox_write_files).
    #[serde(skip_serializing_if = "Option::is_none")]
    written: Option<Vec<String>>,
    /// Why the call was refused, and what to change.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ToolError>,
}

/// A compile stage.
#[derive(Debug, Default, Serialize, JsonSchema)]
struct Compile {
    /// As a run's `status`.
    status: String,
    /// The compiler's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    /// The signal that killed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    /// Wall-clock time, in milliseconds.
    duration_ms: f64,
    /// The compiler's standard output.
    stdout: Shown,
    /// The compiler's standard error.
    stderr: Shown,
}

/// Output or a file's content as shown: its head and tail when it is long.
#[derive(Debug, Default, Serialize, JsonSchema)]
struct Shown {
    /// The text (invalid UTF-8 replaced), or base64 for a binary file; when `omitted_bytes` is
    /// not zero, the head and tail with a marked cut between them.
    text: String,
    /// `utf-8`, `utf-8-lossy` (bytes that are not UTF-8 were replaced) or `base64`.
    encoding: String,
    /// Bytes kept in all.
    bytes: u64,
    /// The program wrote more than the output limit: bytes past it were discarded.
    truncated: bool,
    /// Bytes of the middle not shown here.
    omitted_bytes: u64,
    /// Where the whole kept output is (`resources/read`), when a part was not shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    full: Option<String>,
}

/// A refused call.
#[derive(Debug, Serialize, JsonSchema)]
struct ToolError {
    /// A stable code: `invalid`, `unknown-field`, `unknown-language`, `ceiling`, `not-allowed`,
    /// `not-found`, `gone`, `conflict`, `too-large`, `busy`, `file`, `internal`, `unknown-tool`.
    code: String,
    /// The argument it is about (`limits.memory_bytes`, `files["../x"]`, `sandbox_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    /// What was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    /// What is accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted: Option<String>,
    /// What went wrong and what to change.
    message: String,
}

fn schema_of<T: JsonSchema>() -> Arc<serde_json::Map<String, serde_json::Value>> {
    let gen = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut v = gen.into_root_schema_for::<T>().to_value();
    strip_formats(&mut v);
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    match v {
        serde_json::Value::Object(o) => Arc::new(o),
        _ => Arc::new(serde_json::Map::new()),
    }
}

/// Drops schemars' `format`s of numbers (`uint64`, `int32`, `double`): not JSON Schema's
/// vocabulary, and validators in hosts warn about each.
fn strip_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            if o.get("format").and_then(|f| f.as_str()).is_some_and(|f| {
                matches!(
                    f,
                    "uint64" | "int64" | "uint32" | "int32" | "uint" | "double" | "float"
                )
            }) {
                o.remove("format");
            }
            o.values_mut().for_each(strip_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

impl Server {
    fn new(svc: Service, opts: Opts) -> Server {
        let langs: Vec<String> = svc.languages().into_iter().map(|l| l.name).collect();
        let out = schema_of::<ToolResult>();
        let tool = |name: &'static str, desc: String, input, ann: ToolAnnotations| {
            let mut t = Tool::new(name, desc, input);
            t.output_schema = Some(out.clone());
            t.annotations = Some(ann);
            t
        };
        let net = opts.egress;
        let tools = vec![
            tool(
                "run_code",
                format!(
                    "Run code once in a fresh sandbox (no host files, no network unless allow_net names hosts the server allows; destroyed after). Languages here: {}. Returns status, exit code, stdout/stderr (long output cut to head and tail; the whole as a resource), duration, denied egress and refused system calls. A non-zero exit is a normal result.",
                    langs.join(", ")
                ),
                schema_of::<RunCodeArgs>(),
                ToolAnnotations::with_title("Run code in a sandbox")
                    .read_only(false)
                    .destructive(false)
                    .idempotent(false)
                    .open_world(net),
            ),
            tool(
                "sandbox_create",
                "Create a sandbox that lives across calls (files and processes persist until sandbox_kill, its TTL or its idle timeout). Returns its sandbox_id.".into(),
                schema_of::<CreateArgs>(),
                ToolAnnotations::with_title("Create a sandbox")
                    .read_only(false)
                    .destructive(false)
                    .idempotent(false)
                    .open_world(net),
            ),
            tool(
                "sandbox_exec",
                format!(
                    "Run a command in a sandbox and wait for it (at most {} s). For longer work set background: true and poll with exec_id (and wait_ms).",
                    opts.max_call.as_secs()
                ),
                schema_of::<ExecArgs>(),
                ToolAnnotations::with_title("Run a command in a sandbox")
                    .read_only(false)
                    .destructive(true)
                    .idempotent(false)
                    .open_world(net),
            ),
            tool(
                "sandbox_write_files",
                "Write files into a sandbox's working directory (relative paths; existing files are replaced).".into(),
                schema_of::<WriteArgs>(),
                ToolAnnotations::with_title("Write files into a sandbox")
                    .read_only(false)
                    .destructive(true)
                    .idempotent(true)
                    .open_world(false),
            ),
            tool(
                "sandbox_read_file",
                "Read a file from a sandbox's working directory (long files cut to head and tail; the whole as a resource).".into(),
                schema_of::<ReadArgs>(),
                ToolAnnotations::with_title("Read a file from a sandbox")
                    .read_only(true)
                    .destructive(false)
                    .idempotent(true)
                    .open_world(false),
            ),
            tool(
                "sandbox_list_files",
                "List a directory of a sandbox's working directory: name, kind and size of each entry.".into(),
                schema_of::<ListArgs>(),
                ToolAnnotations::with_title("List files in a sandbox")
                    .read_only(true)
                    .destructive(false)
                    .idempotent(true)
                    .open_world(false),
            ),
            tool(
                "sandbox_kill",
                "Destroy a sandbox with every process and file in it. Returns what it was refused over its life (denied egress, refused system calls).".into(),
                schema_of::<KillArgs>(),
                ToolAnnotations::with_title("Destroy a sandbox")
                    .read_only(false)
                    .destructive(true)
                    .idempotent(false)
                    .open_world(false),
            ),
        ];
        Server {
            svc,
            opts,
            tools: Arc::new(tools),
            kept: Arc::new(Mutex::new(Kept::default())),
            owner: 0,
            http: false,
            keep: true,
        }
    }

    /// The handler of a new MCP session: the same service and tools, and a session of its own
    /// for the outputs it keeps (their URIs are numbered for the whole server, so a number alone
    /// must not give another session's output).
    fn for_session(&self) -> Server {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Server {
            owner: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            http: true,
            ..self.clone()
        }
    }

    /// Keeps `b` as a resource for this session, if this call's outputs are kept: its URI.
    fn keep(&self, what: &str, b: Vec<u8>) -> Option<String> {
        self.keep.then(|| {
            self.kept
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .put(what, self.owner, b)
        })
    }

    /// Shows `b`: its head and tail past `--output-shown`, the whole kept as a resource (where
    /// this call's outputs are kept).
    fn shown(&self, b: Vec<u8>, truncated: bool, what: &str, binary_as_base64: bool) -> Shown {
        let n = self.opts.shown;
        let bytes = b.len() as u64;
        let utf8 = std::str::from_utf8(&b).is_ok();
        if !utf8 && binary_as_base64 {
            use base64::Engine;
            let (part, omitted, full) = if b.len() > n {
                let full = self.keep(what, b.clone());
                (&b[..n], (b.len() - n) as u64, full)
            } else {
                (&b[..], 0, None)
            };
            return Shown {
                text: base64::engine::general_purpose::STANDARD.encode(part),
                encoding: "base64".into(),
                bytes,
                truncated,
                omitted_bytes: omitted,
                full,
            };
        }
        let encoding = if utf8 { "utf-8" } else { "utf-8-lossy" }.to_owned();
        if b.len() <= n {
            return Shown {
                text: String::from_utf8_lossy(&b).into_owned(),
                encoding,
                bytes,
                truncated,
                omitted_bytes: 0,
                full: None,
            };
        }
        let head = n / 2;
        let tail_at = b.len() - (n - head);
        let omitted = (tail_at - head) as u64;
        let text = format!(
            "{}\n[… {omitted} bytes cut by palisade …]\n{}",
            String::from_utf8_lossy(&b[..head]),
            String::from_utf8_lossy(&b[tail_at..])
        );
        let full = self.keep(what, b);
        Shown {
            text,
            encoding,
            bytes,
            truncated,
            omitted_bytes: omitted,
            full,
        }
    }

    fn stage(&self, s: &Stage, out: Vec<u8>, err: Vec<u8>) -> ToolResult {
        ToolResult {
            status: s.status.name().into(),
            exit_code: s.exit_code,
            signal: s.signal,
            duration_ms: Some(s.wall_time_ms),
            stdout: Some(self.shown(out, s.stdout.truncated, "stdout", false)),
            stderr: Some(self.shown(err, s.stderr.truncated, "stderr", false)),
            ..ToolResult::default()
        }
    }

    async fn run_code(&self, a: RunCodeArgs, ctx: &RequestContext<RoleServer>) -> Outcome {
        let c = self.svc.config().ceiling.policy().limits;
        let mut limits = a.limits;
        if a.timeout_ms.is_some() && limits.timeout_ms.is_some() {
            return Err(ServiceError::invalid(
                "limits.timeout_ms",
                "given with timeout_ms",
                "one of timeout_ms and limits.timeout_ms",
            ));
        }
        let max = self.max_call_ms();
        let timeout = a
            .timeout_ms
            .or(limits.timeout_ms)
            .unwrap_or(c.timeout_ms.min(max));
        if timeout > max && timeout <= c.timeout_ms {
            return Err(long_call("timeout_ms", timeout, max));
        }
        limits.timeout_ms = Some(timeout);
        if limits.output_bytes.is_none() {
            limits.output_bytes = Some(self.opts.kept.min(c.output_bytes));
        }
        let req = api::RunRequest {
            command: a.command,
            language: a.language,
            code: a.code,
            args: a.args,
            stdin: a.stdin,
            files: a.files,
            fetch: a.return_files,
            env: a.env,
            limits,
            compile: None,
            allow_net: a.allow_net,
        };
        // Checked before anything is queued or started.
        let top = a.timeout_ms.is_some();
        let named = |mut e: ServiceError| {
            if top && e.field.as_deref() == Some("limits.timeout_ms") {
                e.field = Some("timeout_ms".into());
                e.message = e.message.replace("limits.timeout_ms", "timeout_ms");
            }
            e
        };
        self.svc.check_run(&req).map_err(named)?;
        let run = self.svc.run(req);
        // The reply is counted against --max-held until it is made into the tool's answer
        // (`_held`, dropped at the end of this call).
        let (r, _held) = tokio::select! {
            r = with_progress(run, ctx) => r.map_err(named)?.into_parts(),
            // Dropping the run kills its sandbox.
            _ = ctx.ct.cancelled() => return Err(cancelled()),
        };
        let mut t = ToolResult {
            status: r.status.name().into(),
            exit_code: r.exit_code,
            signal: r.signal,
            duration_ms: Some(r.wall_time_ms),
            stdout: Some(self.shown(r.stdout.decode(), r.stdout.truncated, "stdout", false)),
            stderr: Some(self.shown(r.stderr.decode(), r.stderr.truncated, "stderr", false)),
            file_errors: r.file_errors,
            ..ToolResult::default()
        };
        if let Some(cs) = &r.compile {
            t.compile = Some(Compile {
                status: cs.status.name().into(),
                exit_code: cs.exit_code,
                signal: cs.signal,
                duration_ms: cs.wall_time_ms,
                stdout: self.shown(cs.stdout.decode(), cs.stdout.truncated, "stdout", false),
                stderr: self.shown(cs.stderr.decode(), cs.stderr.truncated, "stderr", false),
            });
        }
        for (p, d) in r.files {
            let s = self.shown(d.decode(), d.truncated, "file", true);
            t.files.insert(p, s);
        }
        if let Some(rep) = &r.report {
            report_summary(&rep.to_value(), &mut t);
        }
        if let Some(e) = r.error {
            t.error = Some(tool_error(&e));
        }
        Ok(t)
    }

    fn max_call_ms(&self) -> u64 {
        self.opts.max_call.as_millis() as u64
    }

    async fn create(&self, a: CreateArgs) -> Outcome {
        let info = self
            .svc
            .create_session(api::SessionRequest {
                ttl_s: a.ttl_s,
                idle_timeout_s: a.idle_timeout_s,
                limits: a.limits,
                allow_net: a.allow_net,
                env: a.env,
                labels: BTreeMap::new(),
                idempotency_key: None,
                workspace: None,
            })
            .await?;
        Ok(ToolResult {
            status: "ok".into(),
            sandbox_id: Some(info.id),
            expires_in_s: Some(info.expires_in_s),
            ..ToolResult::default()
        })
    }

    async fn exec(&self, a: ExecArgs, ctx: &RequestContext<RoleServer>) -> Outcome {
        let max = self.max_call_ms();
        let id = a.sandbox_id.clone();
        if let Some(eid) = a.exec_id {
            if a.command.is_some() || a.stdin.is_some() || a.background {
                return Err(ServiceError::invalid(
                    "exec_id",
                    eid.to_string(),
                    "exec_id alone (with wait_ms) to poll; command without exec_id to start",
                ));
            }
            let wait = a.wait_ms.unwrap_or(0);
            if wait > max {
                return Err(ServiceError::ceiling("wait_ms", wait, max));
            }
            return self.poll(&id, eid, Duration::from_millis(wait), ctx).await;
        }
        if a.wait_ms.is_some() {
            return Err(ServiceError::invalid(
                "wait_ms",
                "given without exec_id",
                "wait_ms only when polling with exec_id",
            ));
        }
        let Some(command) = a.command else {
            return Err(ServiceError::invalid(
                "command",
                "missing",
                "a program and its arguments, e.g. [\"sh\", \"-c\", \"ls\"] (or exec_id to poll)",
            ));
        };
        let c = self.svc.config().ceiling.policy().limits;
        let timeout = a.timeout_ms.unwrap_or(if a.background {
            c.timeout_ms
        } else {
            c.timeout_ms.min(max)
        });
        if !a.background && timeout > max && timeout <= c.timeout_ms {
            return Err(long_call("timeout_ms", timeout, max));
        }
        let req = api::ExecRequest {
            command,
            stdin: a.stdin,
            env: a.env,
            cwd: a.cwd,
            timeout_ms: Some(timeout),
            output_bytes: Some(self.opts.kept.min(c.output_bytes)),
            mode: None,
        };
        if a.background {
            let info = self.svc.exec_background(&id, req).await?;
            return Ok(ToolResult {
                status: "running".into(),
                sandbox_id: Some(id),
                exec_id: Some(info.id),
                ..ToolResult::default()
            });
        }
        let mut rx = self.svc.exec_stream(&id, req).await?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // What the output holds stays counted until the tool's answer is made.
        let mut held = palisade_service::budget::Charge::default();
        let t0 = Instant::now();
        let token = ctx.meta.get_progress_token();
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        let mut eid = None;
        loop {
            tokio::select! {
                ev = rx.recv() => match ev.map(|e| {
                    let (e, c) = e.into_parts();
                    held.merge(c);
                    e
                }) {
                    Some(ExecEvent::Start { id }) => eid = Some(id),
                    Some(ExecEvent::Stdout { data }) => out.extend(data.decode()),
                    Some(ExecEvent::Stderr { data }) => err.extend(data.decode()),
                    Some(ExecEvent::Exit { result }) => {
                        let mut t = self.stage(&result, out, err);
                        t.sandbox_id = Some(id);
                        return Ok(t);
                    }
                    None => return Err(ServiceError::internal(format!(
                        "exec {} in {id} ended without a result", eid.unwrap_or(0)
                    ))),
                },
                // Dropping the stream kills the exec.
                _ = ctx.ct.cancelled() => return Err(cancelled()),
                _ = tick.tick(), if token.is_some() => {
                    if let Some(tok) = &token {
                        progress(ctx, tok, t0, out.len() + err.len()).await;
                    }
                }
            }
        }
    }

    async fn poll(
        &self,
        id: &str,
        eid: u64,
        wait: Duration,
        ctx: &RequestContext<RoleServer>,
    ) -> Outcome {
        let t0 = Instant::now();
        let token = ctx.meta.get_progress_token();
        let mut last = Instant::now();
        loop {
            let (info, _held) = self.svc.exec_info(id, eid)?.into_parts();
            if let Some(s) = info.result {
                let mut t = self.stage(&s, s.stdout.decode(), s.stderr.decode());
                t.sandbox_id = Some(id.into());
                t.exec_id = Some(eid);
                return Ok(t);
            }
            if t0.elapsed() >= wait || ctx.ct.is_cancelled() {
                return Ok(ToolResult {
                    status: "running".into(),
                    sandbox_id: Some(id.into()),
                    exec_id: Some(eid),
                    duration_ms: None,
                    ..ToolResult::default()
                });
            }
            if let Some(tok) = &token {
                if last.elapsed() >= PROGRESS_EVERY {
                    last = Instant::now();
                    progress(ctx, tok, t0, 0).await;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = ctx.ct.cancelled() => {}
            }
        }
    }

    async fn write(&self, a: WriteArgs) -> Outcome {
        if a.files.is_empty() {
            return Err(ServiceError::invalid(
                "files",
                "{}",
                "at least one path → content",
            ));
        }
        // Every content decoded and every path checked before the first is written.
        let mut all = Vec::new();
        for (p, c) in &a.files {
            let f = format!("files[{p:?}]");
            palisade_service::proto::check_path(p)
                .map_err(|e| ServiceError::invalid(&f, p.as_str(), e))?;
            all.push((p.clone(), c.bytes(&f)?));
        }
        let mut written = Vec::new();
        for (p, b) in all {
            self.svc
                .put_file(
                    &a.sandbox_id,
                    &p,
                    b.into(),
                    palisade_service::budget::Charge::default(),
                )
                .await
                .map_err(|mut e| {
                    if e.field.as_deref() == Some("path") {
                        e.field = Some(format!("files[{p:?}]"));
                    }
                    e
                })?;
            written.push(p);
        }
        Ok(ToolResult {
            status: "ok".into(),
            sandbox_id: Some(a.sandbox_id),
            written: Some(written),
            ..ToolResult::default()
        })
    }

    async fn read(&self, a: ReadArgs) -> Outcome {
        let (b, _held) = self
            .svc
            .get_file(&a.sandbox_id, &a.path)
            .await?
            .into_parts();
        let s = self.shown(b, false, "file", true);
        let mut files = BTreeMap::new();
        files.insert(a.path, s);
        Ok(ToolResult {
            status: "ok".into(),
            sandbox_id: Some(a.sandbox_id),
            files,
            ..ToolResult::default()
        })
    }

    async fn list(&self, a: ListArgs) -> Outcome {
        let l = self
            .svc
            .list_files(&a.sandbox_id, a.path.as_deref().unwrap_or(""))
            .await?;
        Ok(ToolResult {
            status: "ok".into(),
            sandbox_id: Some(a.sandbox_id),
            entries: Some(l.entries),
            entries_truncated: l.truncated.then_some(true),
            ..ToolResult::default()
        })
    }

    async fn kill(&self, a: KillArgs) -> Outcome {
        let report = self.svc.delete_session(&a.sandbox_id).await?;
        let mut t = ToolResult {
            status: "ok".into(),
            sandbox_id: Some(a.sandbox_id),
            ..ToolResult::default()
        };
        report_summary(&report, &mut t);
        Ok(t)
    }

    async fn call(&self, p: CallToolRequestParams, ctx: RequestContext<RoleServer>) -> Outcome {
        // A request that carries its revision itself has no session over HTTP: nothing it
        // keeps could be read back by a later request.
        let stateless = self.http && ctx.meta.protocol_version().is_some();
        let this = Server {
            keep: !stateless,
            ..self.clone()
        };
        this.call_as(p, ctx).await
    }

    async fn call_as(&self, p: CallToolRequestParams, ctx: RequestContext<RoleServer>) -> Outcome {
        let args = serde_json::Value::Object(p.arguments.unwrap_or_default());
        match &*p.name {
            "run_code" => self.run_code(decode(args)?, &ctx).await,
            "sandbox_create" => self.create(decode(args)?).await,
            "sandbox_exec" => self.exec(decode(args)?, &ctx).await,
            "sandbox_write_files" => self.write(decode(args)?).await,
            "sandbox_read_file" => self.read(decode(args)?).await,
            "sandbox_list_files" => self.list(decode(args)?).await,
            "sandbox_kill" => self.kill(decode(args)?).await,
            other => {
                let names: Vec<&str> = self.tools.iter().map(|t| &*t.name).collect();
                Err(ServiceError {
                    code: "unknown-tool",
                    ..ServiceError::invalid(
                        "name",
                        other,
                        format!("one of the tools: {}", names.join(", ")),
                    )
                })
            }
        }
    }
}

type Outcome = Result<ToolResult, ServiceError>;

fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ServiceError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        ServiceError::json(&path, e.inner())
    })
}

fn long_call(field: &str, asked: u64, max: u64) -> ServiceError {
    ServiceError {
        message: format!(
            "{field} {asked} is longer than a tool call may wait ({max} ms): use sandbox_create, then sandbox_exec with background: true and poll it with exec_id"
        ),
        ..ServiceError::ceiling(field, asked, max)
    }
}

fn cancelled() -> ServiceError {
    ServiceError::conflict("request", "cancelled by the client: the run was killed")
}

/// Awaits `f`, reporting progress every second when the request carries a progress token.
async fn with_progress<F: std::future::Future>(
    f: F,
    ctx: &RequestContext<RoleServer>,
) -> F::Output {
    let Some(tok) = ctx.meta.get_progress_token() else {
        return f.await;
    };
    let t0 = Instant::now();
    tokio::pin!(f);
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            r = &mut f => return r,
            _ = tick.tick() => progress(ctx, &tok, t0, 0).await,
        }
    }
}

async fn progress(
    ctx: &RequestContext<RoleServer>,
    tok: &ProgressToken,
    t0: Instant,
    bytes: usize,
) {
    let secs = t0.elapsed().as_secs_f64();
    let mut msg = format!("running for {secs:.0} s");
    if bytes > 0 {
        msg.push_str(&format!(", {bytes} bytes of output"));
    }
    let p = ProgressNotificationParam::new(tok.clone(), secs.floor()).with_message(msg);
    let _ = ctx.peer.notify_progress(p).await;
}

/// The report's denied egress and refused calls, for a model to read.
fn report_summary(rep: &serde_json::Value, t: &mut ToolResult) {
    let net = &rep["network"];
    if let Some(ev) = net["events"].as_array() {
        for e in ev.iter().filter(|e| e["decision"] == "denied") {
            t.denied_egress.push(format!(
                "{}:{} ({}: {})",
                e["host"].as_str().unwrap_or("?"),
                e["port"].as_u64().unwrap_or(0),
                e["reason"].as_str().unwrap_or("denied"),
                e["detail"].as_str().unwrap_or("")
            ));
        }
    }
    if let Some(at) = net["attempts"].as_array() {
        for a in at {
            let what = match (a["name"].as_str(), a["address"].as_str()) {
                (Some(n), _) => format!("{} {n}", a["protocol"].as_str().unwrap_or("dns")),
                (None, Some(ad)) => format!(
                    "{} {ad}:{}",
                    a["protocol"].as_str().unwrap_or("tcp"),
                    a["port"].as_u64().unwrap_or(0)
                ),
                _ => a["protocol"].as_str().unwrap_or("?").to_owned(),
            };
            t.denied_egress.push(format!(
                "{what} ×{} (no egress allowed)",
                a["count"].as_u64().unwrap_or(1)
            ));
        }
    }
    if let Some(calls) = rep["denied_syscalls"].as_array() {
        for c in calls {
            t.refused_calls.push(format!(
                "{} ×{} ({})",
                c["name"].as_str().unwrap_or("?"),
                c["count"].as_u64().unwrap_or(1),
                c["errno"].as_str().unwrap_or("EPERM")
            ));
        }
    }
}

fn tool_error(e: &ServiceError) -> ToolError {
    let field = e.field.clone().map(|f| match f.as_str() {
        "session" => "sandbox_id".to_owned(),
        "fetch" => "return_files".to_owned(),
        _ => f
            .strip_prefix("fetch")
            .map_or(f.clone(), |rest| format!("return_files{rest}")),
    });
    let mut message = match &field {
        Some(f) if !e.message.contains(f.as_str()) => format!("{f}: {}", e.message),
        _ => e.message.clone(),
    };
    if let Some(a) = &e.accepted {
        if !message.contains(a.as_str()) {
            message.push_str(&format!(" (accepted: {a})"));
        }
    }
    if e.code == "busy" {
        message.push_str(": try again in a moment");
    }
    ToolError {
        code: e.code.into(),
        field,
        value: e.value.clone(),
        accepted: e.accepted.clone(),
        message,
    }
}

fn refused(e: &ServiceError) -> CallToolResult {
    let err = tool_error(e);
    let status = match e.class() {
        Class::Denied => "policy-denied",
        Class::Internal => "sandbox-error",
        _ => "error",
    };
    let text = err.message.clone();
    let t = ToolResult {
        status: status.into(),
        error: Some(err),
        ..ToolResult::default()
    };
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(&t).ok();
    r
}

/// A result's text mirror: the structured content as JSON.
fn answer(t: ToolResult) -> CallToolResult {
    let v = serde_json::to_value(&t).unwrap_or_default();
    let mut r = CallToolResult::structured(v);
    // A run that palisade itself failed is not the program's result: say so as an error.
    if t.status == "sandbox-error" {
        r.is_error = Some(true);
    }
    r
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("palisade", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Runs code in palisade sandboxes (a kernel-enforced boundary: no host files, no network but the allowed hosts, resource ceilings). Use run_code for one-shot runs; sandbox_create and sandbox_exec for work across calls. Long output is cut to its head and tail; read the whole with resources/read on the `full` URI.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.clone();
        let t0 = Instant::now();
        let r = match self.call(request, context).await {
            Ok(t) => answer(t),
            Err(e) => refused(&e),
        };
        tracing::debug!(
            tool = %palisade_service_escape(&name),
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            error = r.is_error.unwrap_or(false),
            "call"
        );
        Ok(r.into())
    }

    /// The kept outputs of this session (another session's are not listed), by pages.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let after = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(c) => c.parse::<u64>().map_err(|_| {
                ErrorData::invalid_params(
                    format!(
                        "cursor: `{}` is not a number; give the `nextCursor` of an earlier \
                         resources/list",
                        palisade_service_escape(&c)
                    ),
                    None,
                )
            })?,
        };
        let (page, next) = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .list(self.owner, after);
        let resources = page.into_iter().map(kept_resource).collect();
        let mut r = ListResourcesResult::with_all_items(resources);
        r.next_cursor = next.map(|n| n.to_string());
        Ok(r)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let Some(b) = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&uri, self.owner)
        else {
            return Err(ErrorData::resource_not_found(
                format!(
                    "no kept output `{}` (outputs are kept up to {} MiB in all, the oldest dropped first)",
                    palisade_service_escape(&uri),
                    KEPT_TOTAL >> 20
                ),
                None,
            ));
        };
        // The answer is counted against the budget while it is made (a copy of the output, and
        // its JSON): many reads of one large output at once each made theirs, with nothing to
        // bound them. Text that JSON would escape to more than twice its size (control bytes)
        // goes as base64, as a server's output does.
        let text = std::str::from_utf8(&b)
            .ok()
            .filter(|_| palisade_service::api::json_escaped_len(&b) <= 2 * b.len());
        let size = match text {
            Some(_) => 2 * palisade_service::api::json_escaped_len(&b),
            None => 2 * b.len().div_ceil(3) * 4,
        } as u64;
        let Some(_held) = self.svc.held().try_charge(size) else {
            let held = self.svc.held();
            let _ = held.refuse();
            let uri = palisade_service_escape(&uri);
            let why = if size > held.limit() {
                // Waiting would not help: the server must be started with more.
                format!(
                    "reading `{uri}` takes {size} bytes while it is answered, more than the server's --max-held {} allows at all",
                    held.limit()
                )
            } else {
                format!(
                    "the server's memory for answers is full ({} of its --max-held {} bytes held): read `{uri}` again in a moment",
                    held.held(),
                    held.limit()
                )
            };
            return Err(ErrorData::internal_error(why, None));
        };
        let c = match text {
            Some(s) => ResourceContents::text(s, uri).with_mime_type("text/plain"),
            None => {
                use base64::Engine;
                ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(&*b), uri)
                    .with_mime_type("application/octet-stream")
            }
        };
        Ok(ReadResourceResult::new(vec![c]).into())
    }
}

fn palisade_service_escape(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if s.chars().count() > 200 {
        out.push('…');
    }
    out.escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `resources/list` shows a session its own kept outputs only, by pages, each with its size
    /// and type, and none that was dropped to keep the bound.
    #[test]
    fn a_session_lists_its_own_kept_outputs_by_pages() {
        let mut k = Kept::default();
        let mut mine = Vec::new();
        for i in 0..(2 * LIST_PAGE + 7) {
            mine.push(k.put("stdout", 1, vec![b'a'; 10 + i]));
            k.put("stderr", 2, vec![0xff; 3]);
        }
        let (mut seen, mut after) = (Vec::new(), 0);
        loop {
            let (page, next) = k.list(1, after);
            assert!(page.len() <= LIST_PAGE);
            seen.extend(page.into_iter().map(kept_resource));
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
        let uris: Vec<&str> = seen.iter().map(|r| r.uri.as_str()).collect();
        assert_eq!(uris, mine.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(seen[3].size, Some(13));
        assert_eq!(seen[3].mime_type.as_deref(), Some("text/plain"));
        let (other, next) = k.list(2, 0);
        let other: Vec<Resource> = other.into_iter().map(kept_resource).collect();
        assert_eq!(
            (other.len(), next.is_some()),
            (LIST_PAGE, true),
            "session 2's own"
        );
        assert_eq!(
            other[0].mime_type.as_deref(),
            Some("application/octet-stream")
        );
        assert!(k.list(3, 0).0.is_empty(), "a session with nothing kept");
        // Past the bound the oldest go, from the list too.
        k.put("stdout", 1, vec![b'b'; KEPT_TOTAL - 1000]);
        let (left, _) = k.list(1, 0);
        assert!(
            !left.iter().any(|r| r.uri == mine[0]),
            "a dropped output listed"
        );
    }
}
