//! `palisade serve`: the HTTP front end of the service core (docs/server.md). Thin: it reads
//! bodies (bounded), turns JSON into requests (a bad one is a 4xx naming the field), calls the
//! [`Service`], and turns its answers and errors into HTTP.
// Errors carry the field, the value and what is accepted, on the cold path (see the service).
#![allow(clippy::result_large_err)]

use anyhow::Context;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use palisade_service::api::{self, ErrorBody};
use palisade_service::budget::{Charge, Charged};
use palisade_service::{fusion, Ceiling, Class, Config, Service, ServiceError};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Options of `palisade serve`.
/// The largest `--max-queue` accepted.
const MAX_QUEUE: usize = 100_000;
/// The largest `--max-sessions` accepted.
const MAX_SESSIONS: usize = 10_000;
/// The largest `--pool` accepted.
const MAX_POOL: usize = 256;
/// The largest `--templates` accepted.
const MAX_TEMPLATES: usize = 256;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to listen: HOST:PORT, or unix:PATH for a unix socket (created, mode 0600, removed at
    /// exit). Anything but a loopback address needs --token-file.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    /// The server's policy (TOML, the schema of `palisade run --policy`): every request's
    /// defaults and ceiling. A request may narrow it, never widen it.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// A file holding the bearer token that every request but /healthz and /readyz must send
    /// (`Authorization: Bearer TOKEN`). Required on a non-loopback address.
    #[arg(long = "token-file", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Sandboxes that run at once (default: twice the CPUs).
    #[arg(long = "max-concurrency", value_name = "N")]
    max_concurrency: Option<usize>,
    /// Requests that may wait for a slot; past that, 429 with Retry-After (at most 100000).
    #[arg(long = "max-queue", value_name = "N", default_value_t = 64)]
    max_queue: usize,
    /// Largest request body, e.g. 16MiB.
    #[arg(long = "max-body", value_name = "SIZE", default_value = "16MiB")]
    max_body: String,
    /// Most bytes read back whole from a sandbox, e.g. 16MiB: all the files of a run together, one
    /// archive. A session's file streams out in pieces of at most this (1MiB at most), any size.
    #[arg(long = "max-fetch", value_name = "SIZE", default_value = "16MiB")]
    max_fetch: String,
    /// Most bytes the server holds for requests and replies at once, e.g. 512MiB: request bodies
    /// as they come, programs' output as it is captured, files and archives read back, and
    /// replies until their clients have taken them. While it is full, new runs, execs and reads
    /// are refused 429 with Retry-After, and output past it is cut (output-limit,
    /// `cut_by_server`).
    #[arg(long = "max-held", value_name = "SIZE", default_value = "512MiB")]
    max_held: String,
    /// A client that takes none of its reply for this long, or that takes a reply (or sends a
    /// body) more slowly than 64 KiB/s past it, is disconnected, and what it held is given back.
    #[arg(long = "send-timeout", value_name = "DURATION", default_value = "30s")]
    send_timeout: String,
    /// Longest (and default) session TTL, e.g. 1h.
    #[arg(long = "session-ttl", value_name = "DURATION", default_value = "1h")]
    session_ttl: String,
    /// Default idle timeout of a session, e.g. 10m.
    #[arg(long = "session-idle", value_name = "DURATION", default_value = "10m")]
    session_idle: String,
    /// Sessions alive at once (1 to 10000).
    #[arg(long = "max-sessions", value_name = "N", default_value_t = 64)]
    max_sessions: usize,
    /// Connections open at once through the egress proxies of all runs and sessions together
    /// (1 to 65536; each holds a server thread). When all are open, a sandbox that holds fewer
    /// takes a place from the one that holds the most (its longest-idle connection is cut);
    /// past that, a connection is closed at once.
    #[arg(long = "max-proxy-connections", value_name = "N", default_value_t = palisade::MAX_CONNECTIONS_IN_PROCESS)]
    max_proxy_connections: usize,
    /// Keep N sandboxes started ahead for runs with the default policy (the ceiling's limits, no
    /// egress, no variables of their own), each used by one run; at most 256 (default: no
    /// pool).
    #[arg(long = "pool", value_name = "N", default_value_t = 0)]
    pool: usize,
    /// How long a pooled sandbox may wait before it is replaced.
    #[arg(long = "pool-max-age", value_name = "DURATION", default_value = "60s")]
    pool_max_age: String,
    /// Keep at most N prepared templates, one per effective policy (least recently used dropped
    /// first; each holds a zygote process): runs start from them instead of cold. 0: every run
    /// starts cold; at most 256.
    #[arg(long = "templates", value_name = "N", default_value_t = 8)]
    templates: usize,
    /// Run Python code without files to write or fetch as `python3 -c CODE`, forked from a
    /// started interpreter inside each run's own boundary (docs/engine.md, "Warm Python": what
    /// every run then shares). Off by default.
    #[arg(long = "warm-python")]
    warm_python: bool,
    /// Modules the warm interpreter imports before its first run, e.g. json,re (import nothing
    /// that reads a secret: every run inherits their state).
    #[arg(
        long = "warm-python-modules",
        value_name = "A,B",
        value_delimiter = ',',
        requires = "warm_python"
    )]
    warm_python_modules: Vec<String>,
    /// A host directory under which clients may open sessions on a workspace (repeatable): a
    /// session's `workspace` must be a real directory at or under one of these (no symbolic link
    /// on the way). None (the default): every workspace is refused. Give roots that only you
    /// write. The change sets are kept in PALISADE_CHANGES_DIR, else the user's store
    /// (docs/workspace.md).
    #[arg(long = "workspace-root", value_name = "DIR")]
    workspace_roots: Vec<PathBuf>,
    /// At SIGTERM, how long running work may finish before it is killed.
    #[arg(
        long = "shutdown-grace",
        value_name = "DURATION",
        default_value = "10s"
    )]
    shutdown_grace: String,
}

#[derive(Clone)]
struct App {
    svc: Service,
    token: Option<Arc<str>>,
    max_body: usize,
    openapi: Arc<String>,
    /// `--send-timeout`.
    send_timeout: Duration,
}

/// An answer that is an error.
struct ApiError(ServiceError);

/// The URL path's parameters (`{id}`, `{path}`), as axum's `Path`, except that a path it
/// cannot decode (a segment that is not UTF-8 once percent-decoded) answers as every other
/// error does: JSON naming the field, not axum's plain text.
struct Path<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError(ServiceError::invalid(
                "path",
                parts.uri.path(),
                format!(
                    "a URL path whose segments are UTF-8 once percent-decoded ({})",
                    e.body_text()
                ),
            ))),
        }
    }
}

/// The query string, as axum's `Query`, with its rejection (a parameter given twice, say) an
/// error in JSON naming the field.
struct Query<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(ApiError(ServiceError::invalid(
                "query",
                parts.uri.query().unwrap_or_default(),
                format!(
                    "the documented parameters, each at most once ({})",
                    e.body_text()
                ),
            ))),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let code = match e.class() {
            Class::BadRequest => StatusCode::BAD_REQUEST,
            Class::Denied => StatusCode::FORBIDDEN,
            Class::NotFound => StatusCode::NOT_FOUND,
            Class::Gone => StatusCode::GONE,
            Class::Conflict => StatusCode::CONFLICT,
            Class::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Class::Busy => StatusCode::TOO_MANY_REQUESTS,
            Class::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Class::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut body = serde_json::to_value(ErrorBody { error: e.clone() }).unwrap_or_default();
        if e.class() == Class::Denied {
            body["status"] = "policy-denied".into();
        }
        let mut r = (code, axum::Json(body)).into_response();
        if let Some(s) = e.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

type Res<T> = Result<T, ApiError>;

/// Reads the body (at most `max_body`) and decodes it; errors name the field.
async fn decode<T: DeserializeOwned>(app: &App, body: Body) -> Res<T> {
    let bytes = read_body(app, body).await?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError(ServiceError::json(&path, e.inner()))
    })
}

async fn read_body(app: &App, body: Body) -> Res<Bytes> {
    Ok(read_body_held(app, body).await?.0)
}

/// Reads the body (at most `max_body`), counting its bytes against the server's budget of bytes
/// held as they come (`busy` when they do not fit: the budget counts requests being read as well
/// as replies), within a deadline: `--send-timeout` plus its size at [`MIN_SEND_RATE`]. A client
/// that sends most of a body and stops held it for as long as it liked. The charge is the
/// caller's to keep while it holds the bytes.
async fn read_body_held(app: &App, body: Body) -> Res<(Bytes, Charge)> {
    use axum::body::HttpBody;
    use futures_util::StreamExt;
    let max = app.max_body as u64;
    let expected = body.size_hint().upper().unwrap_or(max).min(max);
    let deadline = tokio::time::Instant::now()
        + app.send_timeout
        + Duration::from_secs(expected / MIN_SEND_RATE);
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let mut charge = app.svc.held().charge();
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| {
                ApiError(ServiceError::invalid(
                    "body",
                    format!(
                        "{} bytes in {} s",
                        buf.len(),
                        (deadline - tokio::time::Instant::now()).as_secs()
                    ),
                    format!(
                        "a body sent within --send-timeout ({} s) plus its size at 64 KiB/s",
                        app.send_timeout.as_secs()
                    ),
                ))
            })?;
        let chunk = match next {
            None => break,
            Some(Ok(c)) => c,
            // A body cut short, or over the limit hyper was told (Content-Length).
            Some(Err(_)) => return Err(ApiError(ServiceError::too_large(app.max_body))),
        };
        if buf.len() + chunk.len() > app.max_body {
            return Err(ApiError(ServiceError::too_large(app.max_body)));
        }
        if !charge.try_grow(chunk.len() as u64) {
            return Err(ApiError(app.svc.held().refuse()));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((buf.freeze(), charge))
}

/// A reply in JSON. One past a piece ([`PIECE`]) is counted against the server's budget of bytes
/// held for replies until its client has taken it, and refused `busy` while the budget is full
/// (a list of sessions with long labels, asked for by many clients that do not read).
fn json<T: serde::Serialize>(app: &App, v: &T) -> Response {
    let b = match serde_json::to_vec(v) {
        Ok(b) => b,
        Err(e) => {
            return ApiError(ServiceError::internal(format!("the reply: {e}"))).into_response()
        }
    };
    if b.len() <= PIECE {
        return ([(header::CONTENT_TYPE, "application/json")], b).into_response();
    }
    match app.svc.held().admit_charge(b.len() as u64) {
        Ok(c) => held_body(app, "application/json", b, c),
        Err(e) => ApiError(e).into_response(),
    }
}

/// [`json`] for the answer to work already done (a session deleted, a change set applied): it is
/// counted, never refused.
fn json_done<T: serde::Serialize>(app: &App, v: &T) -> Response {
    match serde_json::to_vec(v) {
        Ok(b) => {
            let c = app.svc.held().force(b.len() as u64);
            held_body(app, "application/json", b, c)
        }
        Err(e) => ApiError(ServiceError::internal(format!("the reply: {e}"))).into_response(),
    }
}

/// Reads a bearer token from `--token-file` (of `serve` and `mcp`): one line of at least 16
/// characters without spaces, read through a bound so that a wrong path (a device, a large file)
/// is an error rather than a hang.
pub fn read_token(p: &std::path::Path) -> anyhow::Result<Arc<str>> {
    use std::io::Read;
    let mut raw = Vec::new();
    std::fs::File::open(p)
        .and_then(|f| f.take(4097).read_to_end(&mut raw))
        .with_context(|| format!("--token-file {}", p.display()))?;
    let t = std::str::from_utf8(&raw).unwrap_or("").trim();
    anyhow::ensure!(
        raw.len() <= 4096
            && t.len() >= 16
            && !t.chars().any(|c| c.is_whitespace() || c.is_control()),
        "--token-file {}: the token must be one line of 16 to 4096 characters without spaces",
        p.display()
    );
    Ok(Arc::from(t))
}

/// What to say when the server's sandboxes, each at its process ceiling, could hold more
/// processes than the host's `kernel.pid_max`: then they could leave the host (and each other)
/// unable to start one. `None` when they fit, or the host's value is unknown.
fn pid_share(sandboxes: u64, pids: u64, pid_max: Option<u64>) -> Option<String> {
    let pid_max = pid_max?;
    let most = sandboxes.saturating_mul(pids);
    (most > pid_max).then(|| {
        format!(
            "{sandboxes} sandboxes at once (--max-sessions, --max-concurrency, --pool, --templates) of up to {pids} processes each (the policy's limits.pids) could hold {most} processes, past this host's kernel.pid_max of {pid_max}: past it no process can start on the host; lower them, or raise kernel.pid_max"
        )
    })
}

/// Runs `palisade serve`; returns the exit code.
pub fn main(a: ServeArgs) -> anyhow::Result<i32> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PALISADE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut ceiling = ceiling(a.policy.as_deref(), &[])?;
    if !a.workspace_roots.is_empty() {
        let store = crate::changes::store()?;
        store
            .check()
            .map_err(|e| anyhow::anyhow!("the change-set store: {e}"))?;
        let w = palisade_service::Workspaces::new(&a.workspace_roots, store, ceiling.policy())
            .map_err(|e| anyhow::anyhow!(e))?;
        tracing::info!(roots = ?w.roots(), store = %w.store().path().display(), "workspaces");
        ceiling = ceiling.with_workspaces(w);
    }
    let listen = Listen::parse(&a.listen)?;
    let token = a.token_file.as_deref().map(read_token).transpose()?;
    if let Listen::Tcp(addr) = &listen {
        anyhow::ensure!(
            addr.ip().is_loopback() || token.is_some(),
            "--listen {addr}: not a loopback address, so anyone who can reach it could run code here; give --token-file (or listen on 127.0.0.1 or a unix socket)"
        );
    }
    let exe =
        std::env::current_exe().context("cannot find palisade's own executable (the agent)")?;
    let mut config = Config::new(ceiling, exe);
    if let Some(n) = a.max_concurrency {
        anyhow::ensure!(n >= 1, "--max-concurrency {n}: at least 1");
        config.max_concurrency = n;
    }
    // Each of these is memory, processes or cgroups the server holds on its clients' behalf: a
    // value past its bound is refused here rather than found when the host runs out.
    anyhow::ensure!(
        a.max_queue <= MAX_QUEUE,
        "--max-queue {}: at most {MAX_QUEUE} (each waiting request holds its body in memory)",
        a.max_queue
    );
    config.max_queue = a.max_queue;
    config.max_fetch_bytes = palisade::policy::parse_size("--max-fetch", &a.max_fetch)?;
    config.max_held_bytes = palisade::policy::parse_size("--max-held", &a.max_held)?;
    anyhow::ensure!(
        config.max_held_bytes >= 64 << 10,
        "--max-held {}: at least 64KiB (the bytes held for replies at once, across all requests)",
        a.max_held
    );
    if config.max_held_bytes < config.max_fetch_bytes {
        tracing::warn!(
            "--max-held {} is less than --max-fetch {}: a run's files or an archive larger than --max-held are never read back",
            a.max_held,
            a.max_fetch
        );
    }
    let send_timeout = palisade::policy::parse_duration("--send-timeout", &a.send_timeout)?;
    anyhow::ensure!(
        send_timeout >= Duration::from_secs(1),
        "--send-timeout {}: at least 1s",
        a.send_timeout
    );
    config.session_ttl = palisade::policy::parse_duration("--session-ttl", &a.session_ttl)?;
    config.session_idle = palisade::policy::parse_duration("--session-idle", &a.session_idle)?;
    anyhow::ensure!(
        (1..=MAX_SESSIONS).contains(&a.max_sessions),
        "--max-sessions {}: from 1 to {MAX_SESSIONS} (each session holds a sandbox: processes and a cgroup)",
        a.max_sessions
    );
    config.max_sessions = a.max_sessions;
    anyhow::ensure!(
        (1..=65_536).contains(&a.max_proxy_connections),
        "--max-proxy-connections {}: from 1 to 65536 (each open connection holds a server thread)",
        a.max_proxy_connections
    );
    palisade::set_max_connections_in_process(a.max_proxy_connections);
    config.shutdown_grace =
        palisade::policy::parse_duration("--shutdown-grace", &a.shutdown_grace)?;
    anyhow::ensure!(
        a.pool <= MAX_POOL,
        "--pool {}: from 0 (off) to {MAX_POOL} (each pooled sandbox holds processes and a cgroup while it waits)",
        a.pool
    );
    config.pool_size = a.pool;
    config.pool_max_age = palisade::policy::parse_duration("--pool-max-age", &a.pool_max_age)?;
    anyhow::ensure!(
        a.templates <= MAX_TEMPLATES,
        "--templates {}: from 0 (off) to {MAX_TEMPLATES} (each template holds a zygote process, and clients choose the policies that make new ones)",
        a.templates
    );
    config.templates = a.templates;
    if a.warm_python {
        anyhow::ensure!(
            a.templates > 0,
            "--warm-python needs templates: --templates 0 turns them off"
        );
        for m in &a.warm_python_modules {
            let ok = !m.is_empty()
                && m.split('.').all(|p| {
                    p.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            anyhow::ensure!(
                ok,
                "--warm-python-modules: {:?} is not a module name (dotted Python identifiers, e.g. json,os.path)",
                m
            );
        }
        // Checked now: a Python without its shared library cannot be warm.
        palisade::WarmPython::find(
            &palisade_service::lang::python_path(),
            &a.warm_python_modules,
        )
        .map_err(|e| anyhow::anyhow!("--warm-python: {e}"))?;
        config.warm_python = Some(a.warm_python_modules.clone());
    }
    let sandboxes = config.max_sessions + config.max_concurrency + config.pool_size + a.templates;
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    if let Some(w) = pid_share(sandboxes as u64, config.ceiling.max_pids(), pid_max) {
        tracing::warn!("{w}");
    }
    let max_body = palisade::policy::parse_size("--max-body", &a.max_body)?;
    anyhow::ensure!(
        max_body <= 1 << 30,
        "--max-body {}: at most 1GiB",
        a.max_body
    );
    palisade_service::raise_open_files();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(serve(
        config,
        listen,
        token,
        max_body as usize,
        send_timeout,
    ))?;
    Ok(0)
}

/// The server's ceiling from `--policy` and `--profile` (shared with `palisade mcp`): the built-in
/// profiles, then the file; the file's values are each request's defaults, its `[bounds]` table,
/// or without one the values themselves, the ceiling.
pub(crate) fn ceiling(
    policy: Option<&std::path::Path>,
    profiles: &[String],
) -> anyhow::Result<Ceiling> {
    let mut bounds = None;
    let policy = {
        let mut b = palisade::Sandbox::builder().command(["true"]);
        for p in profiles {
            b = b.profile(p);
        }
        if let Some(p) = policy {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("--policy {}", p.display()))?;
            let f = palisade::policy::file::PolicyFile::parse(&p.display().to_string(), &text)?;
            if f.bounds.is_some() {
                bounds = Some(
                    f.ceiling()
                        .with_context(|| format!("--policy {}: [bounds]", p.display()))?,
                );
            }
            b = b.policy_file(&f);
        }
        b.build()?.policy().clone()
    };
    match bounds {
        Some(bounds) => Ceiling::with_bounds(policy, bounds),
        None => Ceiling::new(policy),
    }
    .map_err(|e| anyhow::anyhow!("--policy: {e}"))
}

enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Listen {
    fn parse(s: &str) -> anyhow::Result<Listen> {
        if let Some(p) = s.strip_prefix("unix:") {
            anyhow::ensure!(
                p.starts_with('/'),
                "--listen {s}: unix:PATH takes an absolute path"
            );
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        let addr: SocketAddr = s.parse().with_context(|| {
            format!(
                "--listen {s}: expected HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080) or unix:PATH"
            )
        })?;
        Ok(Listen::Tcp(addr))
    }
}

async fn serve(
    config: Config,
    listen: Listen,
    token: Option<Arc<str>>,
    max_body: usize,
    send_timeout: Duration,
) -> anyhow::Result<()> {
    let svc = Service::new(config);
    svc.start_pool();
    svc.prepare_templates()
        .await
        .map_err(|e| anyhow::anyhow!("{}: {}", e.message, e.accepted.unwrap_or_default()))?;
    let app = App {
        svc: svc.clone(),
        token,
        max_body,
        openapi: Arc::new(openapi()),
        send_timeout,
    };
    let router = router(app);
    let shutdown = {
        let svc = svc.clone();
        async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .expect("SIGINT handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!(
                "shutting down: no new work; running work has its grace, then is killed"
            );
            // Stop taking work and wind down in the background while the listener closes.
            tokio::spawn(async move { svc.shutdown().await });
        }
    };
    match listen {
        Listen::Tcp(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--listen {addr}"))?;
            tracing::info!(listen = %l.local_addr()?, "palisade serve");
            let l = crate::stall::Stall {
                inner: l,
                timeout: send_timeout,
            };
            crate::stall::serve(l, router, shutdown, send_timeout).await;
        }
        Listen::Unix(path) => {
            let l = palisade_service::bind_private_unix(&path)
                .and_then(tokio::net::UnixListener::from_std)
                .with_context(|| format!("--listen unix:{}", path.display()))?;
            tracing::info!(listen = %path.display(), "palisade serve");
            let l = crate::stall::Stall {
                inner: l,
                timeout: send_timeout,
            };
            crate::stall::serve(l, router, shutdown, send_timeout).await;
            let _ = std::fs::remove_file(&path);
        }
    }
    // Connections are closed; make sure nothing of ours is left alive.
    svc.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn router(app: App) -> Router {
    let api = Router::new()
        .route("/v1/run", post(run))
        .route("/v1/run/batch", post(batch))
        .route("/run_code", post(run_code))
        .route("/v1/languages", get(languages))
        .route("/v1/sandboxes", post(create_session).get(list_sessions))
        .route(
            "/v1/sandboxes/{id}",
            get(get_session).delete(delete_session),
        )
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/{exec}", get(exec_info))
        .route("/v1/sandboxes/{id}/exec/{exec}/stdin", post(exec_stdin))
        .route("/v1/sandboxes/{id}/exec/{exec}/signal", post(exec_signal))
        .route("/v1/sandboxes/{id}/files", get(list_files))
        .route(
            "/v1/sandboxes/{id}/archive",
            get(get_archive).put(put_archive),
        )
        .route(
            "/v1/sandboxes/{id}/files/{*path}",
            get(get_file).put(put_file).delete(remove_file),
        )
        .route(
            "/v1/sandboxes/{id}/contexts",
            post(create_context).get(list_contexts),
        )
        .route(
            "/v1/sandboxes/{id}/contexts/{ctx}",
            axum::routing::delete(delete_context),
        )
        .route("/v1/sandboxes/{id}/run_code", post(run_cell))
        .route("/v1/changes", get(list_changes))
        .route("/v1/changes/{id}", get(get_changes).delete(discard_changes))
        .route("/v1/changes/{id}/diff", post(diff_changes))
        .route("/v1/changes/{id}/apply", post(apply_changes))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_doc))
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), auth));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(api)
        .fallback(|| async { ApiError(ServiceError::not_found("endpoint", "(see /openapi.json)")) })
        .with_state(app)
}

async fn auth(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(t) = &app.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|g| constant_time_eq(g.as_bytes(), t.as_bytes()));
        if !ok {
            let body = serde_json::json!({"error": {"code": "unauthorized", "message": "this server needs `Authorization: Bearer TOKEN` (the token of its --token-file)"}});
            let mut r = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn readyz(State(app): State<App>) -> Response {
    if app.svc.ready() {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    }
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.svc.metrics(),
    )
        .into_response()
}

async fn openapi_doc(State(app): State<App>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        app.openapi.as_str().to_owned(),
    )
        .into_response()
}

async fn languages(State(app): State<App>) -> Response {
    json(&app, &app.svc.languages())
}

async fn run(State(app): State<App>, body: Body) -> Res<Response> {
    let req: api::RunRequest = decode(&app, body).await?;
    let r = app.svc.run(req).await?;
    tracing::info!(status = r.status.name(), wall_ms = r.wall_time_ms, "run");
    Ok(held_json(&app, r))
}

async fn run_code(State(app): State<App>, body: Body) -> Res<Response> {
    let req: fusion::RunCodeRequest = decode(&app, body).await?;
    let r = app.svc.run_code(req).await?;
    Ok(held_json(&app, r))
}

/// The slowest a client may take a reply once its `--send-timeout` has passed, in bytes per
/// second.
const MIN_SEND_RATE: u64 = 64 << 10;
/// The pieces a reply is handed to hyper in.
const PIECE: usize = 64 << 10;

/// A reply on its way to its client: its bytes and what they hold against the server's budget
/// (`--max-held`), until the last piece is handed over. Each piece is a copy, so what hyper
/// still holds of a reply once it is handed over is at most its own buffer, not the whole
/// reply; and the reply must be taken by its deadline (`--send-timeout`, plus its size at
/// [`MIN_SEND_RATE`]), else the connection is closed.
struct Pieces {
    bytes: Vec<u8>,
    pos: usize,
    _charge: Charge,
    deadline: tokio::time::Instant,
}

impl Pieces {
    fn new(bytes: Vec<u8>, mut charge: Charge, send_timeout: Duration) -> Pieces {
        charge.set(bytes.len() as u64);
        let deadline = tokio::time::Instant::now()
            + send_timeout
            + Duration::from_secs(bytes.len() as u64 / MIN_SEND_RATE);
        Pieces {
            bytes,
            pos: 0,
            _charge: charge,
            deadline,
        }
    }

    /// The next piece, and what is left (`None`: all handed over, memory and charge given
    /// back).
    fn next(mut self) -> (std::io::Result<Bytes>, Option<Pieces>) {
        if tokio::time::Instant::now() > self.deadline {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took its reply more slowly than --send-timeout allows",
            );
            return (Err(e), None);
        }
        if self.pos == 0 && self.bytes.len() <= PIECE {
            return (Ok(Bytes::from(std::mem::take(&mut self.bytes))), None);
        }
        let end = (self.pos + PIECE).min(self.bytes.len());
        let piece = Bytes::copy_from_slice(&self.bytes[self.pos..end]);
        self.pos = end;
        (Ok(piece), (end < self.bytes.len()).then_some(self))
    }
}

/// A body of `bytes` that holds `charge` until the client has taken it (see [`Pieces`]), with
/// its `Content-Length`.
fn held_body(app: &App, content_type: &'static str, bytes: Vec<u8>, charge: Charge) -> Response {
    let len = bytes.len();
    if len <= PIECE {
        // One piece, sent whole (what is left of a small reply in hyper is its own buffer).
        drop(charge);
        return ([(header::CONTENT_TYPE, content_type)], bytes).into_response();
    }
    let first = Pieces::new(bytes, charge, app.send_timeout);
    let stream = futures_util::stream::unfold(Some(first), |p| async move {
        let (piece, rest) = p?.next();
        Some((piece, rest))
    });
    let mut r = (
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// A reply in JSON that holds its bytes until its client has taken it.
fn held_json<T: serde::Serialize>(app: &App, v: Charged<T>) -> Response {
    let (v, charge) = v.into_parts();
    match serde_json::to_vec(&v) {
        Ok(b) => held_body(app, "application/json", b, charge),
        Err(e) => ApiError(ServiceError::internal(format!("the reply: {e}"))).into_response(),
    }
}

/// A streamed body from a channel, with a keep-alive chunk after each second of silence: a
/// client that went away is noticed at the next write, which drops the receiver, which kills
/// the work behind it (a batch's runs, an exec). Each item is rendered with what it holds, and
/// handed over as a held reply is ([`Pieces`]).
fn stream_body<T, F>(
    app: &App,
    rx: tokio::sync::mpsc::Receiver<T>,
    render: F,
    beat: &'static [u8],
) -> Body
where
    T: Send + 'static,
    F: Fn(T) -> (Vec<u8>, Charge) + Send + Sync + 'static,
{
    let send_timeout = app.send_timeout;
    let stream = futures_util::stream::unfold(
        (rx, render, None::<Pieces>),
        move |(mut rx, render, cur)| async move {
            if let Some(p) = cur {
                let (piece, rest) = p.next();
                return Some((piece, (rx, render, rest)));
            }
            let (bytes, charge) = match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
                Ok(Some(item)) => render(item),
                Ok(None) => return None,
                Err(_) => return Some((Ok(Bytes::from_static(beat)), (rx, render, None))),
            };
            let (piece, rest) = Pieces::new(bytes, charge, send_timeout).next();
            Some((piece, (rx, render, rest)))
        },
    );
    Body::from_stream(stream)
}

/// Silence after which a streamed answer gets a keep-alive chunk.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// NDJSON lines from a channel; blank lines are keep-alives. A line holds what its item held
/// until it is handed over.
fn ndjson<T: serde::Serialize + Send + 'static>(
    app: &App,
    rx: tokio::sync::mpsc::Receiver<Charged<T>>,
) -> Response {
    let body = stream_body(
        app,
        rx,
        |item| {
            let (item, charge) = item.into_parts();
            let mut line = serde_json::to_vec(&item).unwrap_or_default();
            line.push(b'\n');
            (line, charge)
        },
        b"\n",
    );
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

async fn batch(State(app): State<App>, body: Body) -> Res<Response> {
    let req: api::BatchRequest = decode(&app, body).await?;
    let rx = app.svc.run_batch(req)?;
    Ok(ndjson(&app, rx))
}

async fn create_session(State(app): State<App>, body: Body) -> Res<Response> {
    let req: api::SessionRequest = decode(&app, body).await?;
    let s = app.svc.create_session(req).await?;
    Ok((StatusCode::CREATED, axum::Json(s)).into_response())
}

async fn list_sessions(State(app): State<App>) -> Response {
    json(&app, &app.svc.list_sessions())
}

async fn get_session(State(app): State<App>, Path(id): Path<String>) -> Res<Response> {
    Ok(json(&app, &app.svc.get_session(&id)?))
}

async fn delete_session(State(app): State<App>, Path(id): Path<String>) -> Res<Response> {
    let report = app.svc.delete_session(&id).await?;
    Ok(json_done(
        &app,
        &serde_json::json!({ "id": id, "report": report }),
    ))
}

async fn exec(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Res<Response> {
    let req: api::ExecRequest = decode(&app, body).await?;
    let accept_sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let mode = req.mode.clone().unwrap_or_else(|| {
        if accept_sse {
            "sse".into()
        } else {
            "sync".into()
        }
    });
    match mode.as_str() {
        "sync" => Ok(held_json(&app, app.svc.exec(&id, req).await?)),
        "background" => Ok((
            StatusCode::ACCEPTED,
            axum::Json(app.svc.exec_background(&id, req).await?),
        )
            .into_response()),
        "stream" => {
            let rx = app.svc.exec_stream(&id, req).await?;
            Ok(ndjson(&app, rx))
        }
        "sse" => {
            let rx = app.svc.exec_stream(&id, req).await?;
            let body = stream_body(
                &app,
                rx,
                |ev| {
                    let (ev, charge) = ev.into_parts();
                    let name = match &ev {
                        api::ExecEvent::Start { .. } => "start",
                        api::ExecEvent::Stdout { .. } => "stdout",
                        api::ExecEvent::Stderr { .. } => "stderr",
                        api::ExecEvent::Exit { .. } => "exit",
                    };
                    let data = serde_json::to_string(&ev).unwrap_or_default();
                    let frame = format!("event: {name}\ndata: {data}\n\n").into_bytes();
                    (frame, charge)
                },
                b": keep-alive\n\n",
            );
            Ok((
                [
                    (header::CONTENT_TYPE, "text/event-stream"),
                    (header::CACHE_CONTROL, "no-cache"),
                ],
                body,
            )
                .into_response())
        }
        other => Err(ApiError(ServiceError::invalid(
            "mode",
            other,
            "one of: sync, stream, sse, background",
        ))),
    }
}

fn exec_id(s: &str) -> Res<u64> {
    s.parse()
        .map_err(|_| ApiError(ServiceError::invalid("exec", s, "an exec id (a number)")))
}

async fn exec_info(State(app): State<App>, Path((id, e)): Path<(String, String)>) -> Res<Response> {
    Ok(held_json(&app, app.svc.exec_info(&id, exec_id(&e)?)?))
}

async fn exec_stdin(
    State(app): State<App>,
    Path((id, e)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> Res<Response> {
    // Counted until the program has it (or the write is refused).
    let (data, _held) = read_body_held(&app, body).await?;
    let close = match q.get("close").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => return Err(ApiError(ServiceError::invalid("close", v, "true or false"))),
    };
    app.svc.exec_stdin(&id, exec_id(&e)?, data, close).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn exec_signal(
    State(app): State<App>,
    Path((id, e)): Path<(String, String)>,
    body: Body,
) -> Res<Response> {
    let req: api::SignalRequest = decode(&app, body).await?;
    let sig = parse_signal(&req.signal)?;
    app.svc.exec_signal(&id, exec_id(&e)?, sig).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_signal(v: &serde_json::Value) -> Res<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
    ];
    let bad = || {
        ApiError(ServiceError::invalid("signal", v.to_string(), "a signal number from 1 to 64 or a name: HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT, STOP"))
    };
    match v {
        serde_json::Value::Number(n) => n
            .as_i64()
            .filter(|n| (1..=64).contains(n))
            .map(|n| n as i32)
            .ok_or_else(bad),
        serde_json::Value::String(s) => {
            let s = s.strip_prefix("SIG").unwrap_or(s);
            NAMES
                .iter()
                .find(|(n, _)| *n == s)
                .map(|(_, v)| *v)
                .ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

#[derive(serde::Deserialize)]
struct ListQuery {
    #[serde(default)]
    path: String,
}

#[derive(serde::Deserialize)]
struct ArchiveQuery {
    #[serde(default)]
    path: String,
    /// Fail the archive at an entry that would be skipped.
    #[serde(default)]
    strict: bool,
    /// The most bytes the archive may have (else `too-large`); `--max-fetch` by default.
    max_bytes: Option<u64>,
}

async fn list_files(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Res<Response> {
    Ok(json(&app, &app.svc.list_files(&id, &q.path).await?))
}

/// What a streamed download's pieces come from: a session's file or archive, read a piece at a
/// time from its agent.
trait Download: Send + 'static {
    /// What the log names when a download is cut short.
    const WHAT: &'static str;
    /// The next piece, `None` after the last.
    fn piece(
        &mut self,
    ) -> impl std::future::Future<Output = Option<Result<Charged<Vec<u8>>, ServiceError>>> + Send;
    /// What follows the last piece as trailers, if anything does.
    fn trailers(&self) -> Option<HeaderMap> {
        None
    }
}

impl Download for palisade_service::FileStream {
    const WHAT: &'static str = "a file's download";
    fn piece(
        &mut self,
    ) -> impl std::future::Future<Output = Option<Result<Charged<Vec<u8>>, ServiceError>>> + Send
    {
        self.next()
    }
}

impl Download for palisade_service::ArchiveStream {
    const WHAT: &'static str = "an archive's download";
    fn piece(
        &mut self,
    ) -> impl std::future::Future<Output = Option<Result<Charged<Vec<u8>>, ServiceError>>> + Send
    {
        self.next()
    }
    /// The count of entries skipped, known only at the end.
    fn trailers(&self) -> Option<HeaderMap> {
        let mut t = HeaderMap::new();
        t.insert(
            "x-palisade-skipped",
            HeaderValue::from(self.skipped().unwrap_or(0)),
        );
        Some(t)
    }
}

/// A download's body. Each piece from the agent is asked for once the client has taken the one
/// before, and cut into the pieces of a held reply ([`Pieces`]), counted until handed over. An
/// error after the headers are out ends the body short (of its `Content-Length`, or without its
/// last chunk): the only way left to say it.
fn download_body<D: Download>(source: D, id: String, send_timeout: Duration) -> Body {
    use http_body::Frame;
    let stream = futures_util::stream::unfold(
        (Some(source), None::<Pieces>),
        move |(source, pieces)| {
            let id = id.clone();
            async move {
                let mut source = source?;
                if let Some(p) = pieces {
                    let (piece, rest) = p.next();
                    let source = piece.is_ok().then_some(source);
                    return Some((piece.map(Frame::data), (source, rest)));
                }
                loop {
                    match source.piece().await {
                        None => {
                            let t = source.trailers()?;
                            return Some((Ok(Frame::trailers(t)), (None, None)));
                        }
                        Some(Ok(data)) if data.is_empty() => continue,
                        Some(Ok(data)) => {
                            let (data, charge) = data.into_parts();
                            let (piece, rest) = Pieces::new(data, charge, send_timeout).next();
                            let source = piece.is_ok().then_some(source);
                            return Some((piece.map(Frame::data), (source, rest)));
                        }
                        Some(Err(e)) => {
                            tracing::warn!(session = %id, error = %e.message.escape_debug(), "{} cut short", D::WHAT);
                            return Some((Err(std::io::Error::other(e.message)), (None, None)));
                        }
                    }
                }
            }
        },
    );
    Body::new(http_body_util::StreamBody::new(stream))
}

/// A session's file, streamed ([`Service::open_file`]): one piece read by the agent at a time,
/// the next when the client has taken the one before; `Range: bytes=A-B` (one range, `A-`,
/// `-N`) answers `206` with those bytes, or `416` when the file has none of them.
async fn get_file(
    State(app): State<App>,
    Path((id, path)): Path<(String, String)>,
    headers: HeaderMap,
) -> Res<Response> {
    let mut range = match headers.get(header::RANGE) {
        None => palisade_service::FileRange::All,
        Some(v) => parse_range(v)?,
    };
    let mut file = app.svc.open_file(&id, &path, range).await?;
    // `If-Range: ETAG`: the range only if the file is still the one of that tag, else all of it
    // (a resumed download of a file changed meanwhile would join pieces of two files).
    if let Some(tag) = headers.get(header::IF_RANGE) {
        if range != palisade_service::FileRange::All && tag.as_bytes() != file.etag().as_bytes() {
            drop(file);
            range = palisade_service::FileRange::All;
            file = app.svc.open_file(&id, &path, range).await?;
        }
    }
    let (size, (start, end)) = (file.size(), file.span());
    // (An empty file has no byte of any range.)
    if range != palisade_service::FileRange::All && start >= size {
        let mut r = ApiError(ServiceError::invalid(
            "Range",
            headers
                .get(header::RANGE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default(),
            format!("a range that starts within the file's {size} bytes"),
        ))
        .into_response();
        *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
        if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
            r.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        return Ok(r);
    }
    let etag = HeaderValue::from_str(&file.etag()).ok();
    let status = if range == palisade_service::FileRange::All {
        StatusCode::OK
    } else {
        StatusCode::PARTIAL_CONTENT
    };
    let mut r = (
        status,
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (header::ACCEPT_RANGES, "bytes"),
        ],
        download_body(file, id, app.send_timeout),
    )
        .into_response();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    if let Some(tag) = etag {
        r.headers_mut().insert(header::ETAG, tag);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        let v = format!("bytes {start}-{}/{size}", end.saturating_sub(1));
        if let Ok(v) = HeaderValue::from_str(&v) {
            r.headers_mut().insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(r)
}

/// One byte range of `Range` (RFC 9110, 14.1.2): `bytes=A-B`, `bytes=A-`, `bytes=-N`.
fn parse_range(v: &HeaderValue) -> Result<palisade_service::FileRange, ApiError> {
    use palisade_service::FileRange;
    const ACCEPTED: &str = "one byte range: `bytes=A-B` (A to B included), `bytes=A-` (from A to the end) or `bytes=-N` (the last N bytes), A <= B";
    let shown = String::from_utf8_lossy(v.as_bytes()).into_owned();
    let bad = || ApiError(ServiceError::invalid("Range", shown.clone(), ACCEPTED));
    let spec = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().strip_prefix("bytes="))
        .ok_or_else(bad)?;
    let (a, b) = spec.trim().split_once('-').ok_or_else(bad)?;
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.trim(), b.trim()) {
        ("", n) => match num(n) {
            Some(n) if n > 0 => Ok(FileRange::Last(n)),
            _ => Err(bad()),
        },
        (a, "") => Ok(FileRange::From {
            start: num(a).ok_or_else(bad)?,
            last: None,
        }),
        (a, b) => {
            let (start, last) = (num(a).ok_or_else(bad)?, num(b).ok_or_else(bad)?);
            if last < start {
                return Err(bad());
            }
            Ok(FileRange::From {
                start,
                last: Some(last),
            })
        }
    }
}

async fn put_file(
    State(app): State<App>,
    Path((id, path)): Path<(String, String)>,
    body: Body,
) -> Res<Response> {
    // The body's bytes stay counted until the agent has them.
    let (data, held) = read_body_held(&app, body).await?;
    app.svc.put_file(&id, &path, data, held).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A session's directory as a tar, made inside a piece at a time ([`Service::open_archive`]),
/// of at most `max_bytes` (`--max-fetch` by default: the sandbox decides how large an archive
/// is, sparse files and hard links included, and the client how much it takes).
/// One of at most `--max-fetch` is answered whole, with `Content-Length` and the count of
/// entries skipped in `X-Palisade-Skipped`; a larger one streams (chunked), each piece made when
/// the client has taken the one before, and the count comes as a trailer of the same name (to
/// a client that says it takes trailers, `TE: trailers`: HTTP/1.1 sends none to others).
/// `strict=true` fails the archive at an entry that would be skipped.
async fn get_archive(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<ArchiveQuery>,
) -> Res<Response> {
    if q.max_bytes == Some(0) {
        return Err(ApiError(ServiceError::invalid(
            "max_bytes",
            "0",
            "the most bytes the archive may have, headers included: at least 1 (--max-fetch when not given)",
        )));
    }
    let mut tar = app
        .svc
        .open_archive(&id, &q.path, q.strict, q.max_bytes)
        .await?;
    if tar.whole() {
        let skipped = tar.skipped().unwrap_or(0);
        let (bytes, charge) = match tar.next().await {
            Some(Ok(c)) => c.into_parts(),
            Some(Err(e)) => return Err(e.into()),
            None => (Vec::new(), Charge::default()),
        };
        let mut r = held_body(&app, "application/x-tar", bytes, charge);
        r.headers_mut()
            .insert("x-palisade-skipped", HeaderValue::from(skipped));
        return Ok(r);
    }
    let mut r = (
        [(header::CONTENT_TYPE, "application/x-tar")],
        download_body(tar, id, app.send_timeout),
    )
        .into_response();
    r.headers_mut().insert(
        header::TRAILER,
        HeaderValue::from_static("x-palisade-skipped"),
    );
    Ok(r)
}

async fn put_archive(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
    body: Body,
) -> Res<Response> {
    let (data, held) = read_body_held(&app, body).await?;
    app.svc.put_archive(&id, &q.path, data, held).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn remove_file(
    State(app): State<App>,
    Path((id, path)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Res<Response> {
    let recursive = q.get("recursive").is_some_and(|v| v == "true");
    app.svc.remove_file(&id, &path, recursive).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn create_context(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Body,
) -> Res<Response> {
    let req: api::ContextRequest = decode(&app, body).await?;
    let c = app.svc.create_context(&id, req).await?;
    Ok((StatusCode::CREATED, axum::Json(c)).into_response())
}

async fn list_contexts(State(app): State<App>, Path(id): Path<String>) -> Res<Response> {
    Ok(json(&app, &app.svc.list_contexts(&id).await?))
}

async fn delete_context(
    State(app): State<App>,
    Path((id, ctx)): Path<(String, String)>,
) -> Res<Response> {
    app.svc.delete_context(&id, &ctx).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn run_cell(State(app): State<App>, Path(id): Path<String>, body: Body) -> Res<Response> {
    let req: api::CellRequest = decode(&app, body).await?;
    Ok(held_json(&app, app.svc.run_cell(&id, req).await?))
}

async fn list_changes(State(app): State<App>) -> Res<Response> {
    Ok(json(&app, &app.svc.list_change_sets().await?))
}

async fn get_changes(State(app): State<App>, Path(id): Path<String>) -> Res<Response> {
    let mut rx = app.svc.change_set_json(&id).await?;
    // The first chunk decides the status; an error after it ends the body early (the client sees
    // JSON that does not parse).
    let first = match rx.recv().await {
        Some(Ok(b)) => b,
        Some(Err(e)) => return Err(ApiError(e)),
        None => {
            return Err(ApiError(ServiceError::internal(
                "the change set could not be read",
            )))
        }
    };
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Some(Ok(b)) => Some((Ok::<_, std::io::Error>(Bytes::from(b)), rx)),
            Some(Err(e)) => {
                tracing::warn!(error = %e.message, "a change set's entries ended early");
                Some((Err(std::io::Error::other(e.message)), rx))
            }
            None => None,
        }
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::once(async move { Ok(Bytes::from(first)) }),
        rest,
    );
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response())
}

/// A JSON body, or the type's defaults for an empty one.
async fn decode_or_default<T: DeserializeOwned + Default>(app: &App, body: Body) -> Res<T> {
    let bytes = read_body(app, body).await?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError(ServiceError::json(&path, e.inner()))
    })
}

async fn diff_changes(State(app): State<App>, Path(id): Path<String>, body: Body) -> Res<Response> {
    let req: api::DiffRequest = decode_or_default(&app, body).await?;
    Ok(held_json(&app, app.svc.change_set_diff(&id, req).await?))
}

async fn apply_changes(
    State(app): State<App>,
    Path(id): Path<String>,
    body: Body,
) -> Res<Response> {
    let req: api::ApplyRequest = decode_or_default(&app, body).await?;
    Ok(json_done(&app, &app.svc.apply_change_set(&id, req).await?))
}

async fn discard_changes(State(app): State<App>, Path(id): Path<String>) -> Res<Response> {
    app.svc.discard_change_set(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The OpenAPI 3.1 document, generated from the request and response types.
pub fn openapi() -> String {
    use schemars::JsonSchema;
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    let mut g = settings.into_generator();
    let r = |s: schemars::Schema| s.to_value();
    let run_req = r(g.subschema_for::<api::RunRequest>());
    let run_res = r(g.subschema_for::<api::RunResult>());
    let batch_req = r(g.subschema_for::<api::BatchRequest>());
    let batch_line = r(g.subschema_for::<api::BatchLine>());
    let fusion_req = r(g.subschema_for::<fusion::RunCodeRequest>());
    let fusion_res = r(g.subschema_for::<fusion::RunCodeResponse>());
    let langs = r(g.subschema_for::<Vec<api::Language>>());
    let sess_req = r(g.subschema_for::<api::SessionRequest>());
    let sess = r(g.subschema_for::<api::SessionInfo>());
    let sessions = r(g.subschema_for::<Vec<api::SessionInfo>>());
    let exec_req = r(g.subschema_for::<api::ExecRequest>());
    let stage = r(g.subschema_for::<api::Stage>());
    let exec_info = r(g.subschema_for::<api::ExecInfo>());
    let exec_ev = r(g.subschema_for::<api::ExecEvent>());
    let sig = r(g.subschema_for::<api::SignalRequest>());
    let listing = r(g.subschema_for::<api::Listing>());
    let ctx_req = r(g.subschema_for::<api::ContextRequest>());
    let ctx_info = r(g.subschema_for::<api::ContextInfo>());
    let ctx_list = r(g.subschema_for::<Vec<api::ContextInfo>>());
    let cell_req = r(g.subschema_for::<api::CellRequest>());
    let cell_res = r(g.subschema_for::<api::CellResult>());
    let cs_list = r(g.subschema_for::<Vec<api::ChangeSetInfo>>());
    let cs_doc = r(g.subschema_for::<api::ChangeSetDoc>());
    let diff_req = r(g.subschema_for::<api::DiffRequest>());
    let diff_res = r(g.subschema_for::<api::DiffResult>());
    let apply_req = r(g.subschema_for::<api::ApplyRequest>());
    let apply_res = r(g.subschema_for::<api::AppliedResult>());
    let err = r(g.subschema_for::<ErrorBody>());
    let _ = api::Content::schema_name();
    let defs = g.take_definitions(true);
    let body = |s: &serde_json::Value| serde_json::json!({"required": true, "content": {"application/json": {"schema": s}}});
    let ok = |s: &serde_json::Value, ct: &str| serde_json::json!({"description": "OK", "content": {ct: {"schema": s}}});
    let errors = serde_json::json!({
        "400": {"description": "Malformed request: the error names the field and what is accepted", "content": {"application/json": {"schema": err}}},
        "401": {"description": "Missing or wrong bearer token"},
        "403": {"description": "Above the server's ceiling, or not permitted by its policy (status policy-denied)", "content": {"application/json": {"schema": err}}},
        "404": {"description": "No such session, exec, file, or change set of this server", "content": {"application/json": {"schema": err}}},
        "409": {"description": "In conflict with the exec's state (its stdin is closed, it has ended), or an apply held back (code held: the entries in `held`, each with its kind and reason; nothing was applied)", "content": {"application/json": {"schema": err}}},
        "410": {"description": "The session is gone: past its TTL or idle timeout, deleted, or killed by a session-wide limit", "content": {"application/json": {"schema": err}}},
        "413": {"description": "Body over --max-body", "content": {"application/json": {"schema": err}}},
        "429": {"description": "Queue full: retry after Retry-After seconds", "content": {"application/json": {"schema": err}}},
        "503": {"description": "Shutting down", "content": {"application/json": {"schema": err}}},
        "500": {"description": "palisade failed on the server's side", "content": {"application/json": {"schema": err}}},
    });
    let with = |mut ok: serde_json::Value| {
        if let (Some(o), Some(e)) = (ok.as_object_mut(), errors.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        ok
    };
    let id = serde_json::json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}});
    let exec = serde_json::json!({"name": "exec", "in": "path", "required": true, "schema": {"type": "integer"}});
    let path = serde_json::json!({"name": "path", "in": "path", "required": true, "schema": {"type": "string"}});
    let ctx = serde_json::json!({"name": "ctx", "in": "path", "required": true, "schema": {"type": "string"}});
    let doc = serde_json::json!({
        "openapi": "3.1.0",
        "info": {"title": "palisade serve", "version": env!("CARGO_PKG_VERSION"), "description": "Run code nobody has read behind a kernel-enforced boundary (docs/server.md)."},
        "components": {
            "schemas": defs,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/run": {"post": {"summary": "Run one program in a fresh sandbox", "requestBody": body(&run_req), "responses": with(serde_json::json!({"200": ok(&run_res, "application/json")}))}},
            "/v1/run/batch": {"post": {"summary": "Run many; results as NDJSON lines in order of completion, each with its index", "requestBody": body(&batch_req), "responses": with(serde_json::json!({"200": ok(&batch_line, "application/x-ndjson")}))}},
            "/run_code": {"post": {"summary": "SandboxFusion-compatible run", "requestBody": body(&fusion_req), "responses": with(serde_json::json!({"200": ok(&fusion_res, "application/json")}))}},
            "/v1/languages": {"get": {"summary": "Languages this server runs", "responses": {"200": ok(&langs, "application/json")}}},
            "/v1/sandboxes": {
                "post": {"summary": "Create a session", "requestBody": body(&sess_req), "responses": with(serde_json::json!({"201": ok(&sess, "application/json")}))},
                "get": {"summary": "List sessions", "responses": {"200": ok(&sessions, "application/json")}}
            },
            "/v1/sandboxes/{id}": {
                "parameters": [id],
                "get": {"summary": "A session", "responses": with(serde_json::json!({"200": ok(&sess, "application/json")}))},
                "delete": {"summary": "Destroy a session; answers its final report", "responses": with(serde_json::json!({"200": {"description": "Destroyed"}}))}
            },
            "/v1/sandboxes/{id}/exec": {
                "parameters": [id],
                "post": {"summary": "Run a command in the session: mode sync (a Stage), stream (NDJSON ExecEvents), sse (events stdout, stderr, exit), background (202, an ExecInfo)", "requestBody": body(&exec_req),
                    "responses": with(serde_json::json!({"200": {"description": "OK", "content": {"application/json": {"schema": stage}, "application/x-ndjson": {"schema": exec_ev}, "text/event-stream": {"schema": {"type": "string"}}}}, "202": ok(&exec_info, "application/json")}))}
            },
            "/v1/sandboxes/{id}/exec/{exec}": {"parameters": [id, exec], "get": {"summary": "A background exec's state", "responses": with(serde_json::json!({"200": ok(&exec_info, "application/json")}))}},
            "/v1/sandboxes/{id}/exec/{exec}/stdin": {"parameters": [id, exec], "post": {"summary": "Bytes for a background exec's stdin (?close=true ends it)", "requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}, "responses": with(serde_json::json!({"204": {"description": "Written"}}))}},
            "/v1/sandboxes/{id}/exec/{exec}/signal": {"parameters": [id, exec], "post": {"summary": "Signal a running exec's process group", "requestBody": body(&sig), "responses": with(serde_json::json!({"204": {"description": "Sent"}}))}},
            "/v1/sandboxes/{id}/files": {"parameters": [id, {"name": "path", "in": "query", "schema": {"type": "string"}}], "get": {"summary": "List a directory", "responses": with(serde_json::json!({"200": ok(&listing, "application/json")}))}},
            "/v1/sandboxes/{id}/files/{path}": {
                "parameters": [id, path],
                "get": {"summary": "Read a regular file (never through a symlink), streamed; one byte range with Range", "parameters": [{"name": "Range", "in": "header", "required": false, "schema": {"type": "string", "pattern": "^bytes=([0-9]+-[0-9]*|-[0-9]+)$"}, "description": "One byte range: bytes=A-B, bytes=A- or bytes=-N"}, {"name": "If-Range", "in": "header", "required": false, "schema": {"type": "string"}, "description": "The ETag of an earlier answer: the range only if the file is unchanged since, else the whole file (200)"}],
                    "responses": with(serde_json::json!({"200": {"description": "The bytes", "content": {"application/octet-stream": {"schema": {"type": "string"}}}}, "206": {"description": "The bytes of the range asked for (Content-Range)", "content": {"application/octet-stream": {"schema": {"type": "string"}}}}, "416": {"description": "The file has none of the bytes of the range asked for (Content-Range: bytes */SIZE)", "content": {"application/json": {"schema": err}}}}))},
                "put": {"summary": "Write a file (parents created; never through a symlink)", "requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}, "responses": with(serde_json::json!({"204": {"description": "Written"}}))},
                "delete": {"summary": "Remove a file (?recursive=true for a directory)", "responses": with(serde_json::json!({"204": {"description": "Removed"}}))}
            },
            "/v1/sandboxes/{id}/archive": {
                "parameters": [id, {"name": "path", "in": "query", "schema": {"type": "string"}}],
                "get": {"summary": "A tar of a directory, made inside a piece at a time: regular files and directories; X-Palisade-Skipped counts the rest (links are never followed), as a header on an archive of at most --max-fetch (answered whole), as a trailer on a larger one (streamed)", "parameters": [{"name": "strict", "in": "query", "required": false, "schema": {"type": "boolean"}, "description": "Fail the archive at an entry that would be skipped"}, {"name": "max_bytes", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1}, "description": "The most bytes the archive may have, headers included (--max-fetch when not given); a larger one is refused too-large, or cut short past its first piece"}], "responses": with(serde_json::json!({"200": {"description": "The archive", "headers": {"X-Palisade-Skipped": {"description": "Entries left out (an archive answered whole)", "schema": {"type": "integer"}}}, "content": {"application/x-tar": {"schema": {"type": "string"}}}}}))},
                "put": {"summary": "Unpack a tar under a directory, inside: regular files and directories with relative names only, checked whole first", "requestBody": {"content": {"application/x-tar": {"schema": {"type": "string"}}}}, "responses": with(serde_json::json!({"204": {"description": "Unpacked"}}))}
            },
            "/v1/sandboxes/{id}/contexts": {
                "parameters": [id],
                "post": {"summary": "A new context of the code interpreter (a persistent interpreter, started at its first cell)", "requestBody": body(&ctx_req), "responses": with(serde_json::json!({"201": ok(&ctx_info, "application/json")}))},
                "get": {"summary": "The session's contexts", "responses": with(serde_json::json!({"200": ok(&ctx_list, "application/json")}))}
            },
            "/v1/sandboxes/{id}/contexts/{ctx}": {"parameters": [id, ctx], "delete": {"summary": "End a context and its interpreter", "responses": with(serde_json::json!({"204": {"description": "Ended"}}))}},
            "/v1/sandboxes/{id}/run_code": {"parameters": [id], "post": {"summary": "Evaluate a cell in a context: stdout, stderr, the last expression's value, the error as name/value/traceback", "requestBody": body(&cell_req), "responses": with(serde_json::json!({"200": ok(&cell_res, "application/json")}))}},
            "/v1/changes": {"get": {"summary": "The change sets this server's workspace sessions left (kept when a session ends), oldest first", "responses": with(serde_json::json!({"200": ok(&cs_list, "application/json")}))}},
            "/v1/changes/{id}": {
                "parameters": [id],
                "get": {"summary": "A change set and every entry (as `palisade changes ID --json`)", "responses": with(serde_json::json!({"200": ok(&cs_doc, "application/json")}))},
                "delete": {"summary": "Discard a change set", "responses": with(serde_json::json!({"204": {"description": "Discarded"}}))}
            },
            "/v1/changes/{id}/diff": {"parameters": [id], "post": {"summary": "The unified diff (git's format) of a change set, or of some paths (at most --max-fetch bytes)", "requestBody": body(&diff_req), "responses": with(serde_json::json!({"200": ok(&diff_res, "application/json")}))}},
            "/v1/changes/{id}/apply": {"parameters": [id], "post": {"summary": "Apply a change set (or some paths) to the directory its session was opened on: all or nothing, with the command line's refusals; 409 `held` lists what held it back", "requestBody": body(&apply_req), "responses": with(serde_json::json!({"200": ok(&apply_res, "application/json")}))}},
            "/healthz": {"get": {"summary": "Alive", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Taking work", "security": [], "responses": {"200": {"description": "ready"}, "503": {"description": "shutting down"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        }
    });
    serde_json::to_string_pretty(&doc).expect("the document serializes")
}

#[cfg(test)]
mod tests {
    use super::pid_share;

    #[test]
    fn a_server_whose_sandboxes_could_take_the_hosts_pids_is_told() {
        // The defaults on a 2-CPU host with pid_max 32,768: 64 sessions, 2 at once, no pool.
        let w = pid_share(66, 1024, Some(32_768)).expect("a warning");
        assert!(
            w.contains("67584 processes") && w.contains("kernel.pid_max of 32768"),
            "{w}"
        );
        assert_eq!(
            pid_share(32, 1024, Some(32_768)),
            None,
            "exactly at it fits"
        );
        assert_eq!(pid_share(66, 1024, Some(4_194_304)), None);
        assert_eq!(
            pid_share(u64::MAX, 2, Some(1)).map(|w| w.contains(&u64::MAX.to_string())),
            Some(true)
        );
        assert_eq!(pid_share(66, 1024, None), None, "unknown: nothing to say");
    }
}
