//! palisade's service core: what `palisade serve` (HTTP), and later the MCP server and the Python
//! SDK, stand on. Async on tokio, no HTTP here.
//!
//! A [`Service`] holds the server's policy as a [`Ceiling`] that every request may only narrow,
//! a bounded queue (at most `max_concurrency` sandboxes at once and `max_queue` requests waiting;
//! past that a typed `busy` error), the registry of sessions, the metrics, and the operations:
//! one-shot runs ([`Service::run`]), batches ([`Service::run_batch`]), sessions (on a workspace
//! too, with the change sets they leave: [`workspace`]), and shutdown.
//!
//! Files move in and out of a sandbox through the agent (`palisade __agent`, see [`agent`]),
//! which runs inside the boundary as the sandbox's payload: the server never follows a path the
//! code controls. A run without files starts its command directly.
#![forbid(unsafe_code)]
// A ServiceError carries the field, the value and what is accepted: built once per refused
// request, on the cold path, where its size costs nothing.
#![allow(clippy::result_large_err)]

pub mod agent;
pub mod api;
pub mod archive;
pub mod budget;
pub mod ceiling;
pub mod client;
mod error;
pub mod fusion;
pub mod lang;
mod metrics;
mod pool;
pub mod proto;
mod run;
mod session;
pub mod workspace;

pub use ceiling::Ceiling;
pub use error::{Class, ServiceError};
pub use metrics::Gauges;
pub use session::{ArchiveStream, ExecStream, FileRange, FileStream, STREAM_PIECE};
pub use workspace::Workspaces;

use palisade::RunKiller;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How the service is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server's policy.
    pub ceiling: Ceiling,
    /// Sandboxes that run at once.
    pub max_concurrency: usize,
    /// Requests that may wait for a slot; past that, `busy`.
    pub max_queue: usize,
    /// The executable bound into sandboxes as the agent (the server's own: `current_exe`).
    pub agent_exe: PathBuf,
    /// Largest file read back from a sandbox.
    pub max_fetch_bytes: u64,
    /// Most bytes held for replies at once, across all requests ([`budget`]).
    pub max_held_bytes: u64,
    /// Longest session TTL (and the default).
    pub session_ttl: Duration,
    /// Default idle timeout of a session.
    pub session_idle: Duration,
    /// Sessions alive at once.
    pub max_sessions: usize,
    /// At shutdown, how long running work may finish before it is killed.
    pub shutdown_grace: Duration,
    /// Sandboxes kept started ahead for runs with the default policy (0: no pool).
    pub pool_size: usize,
    /// How long a pooled sandbox may wait before it is replaced.
    pub pool_max_age: Duration,
    /// Prepared templates kept, one per effective policy (least recently used dropped first;
    /// 0: every run starts cold).
    pub templates: usize,
    /// Warm Python (`None`: off): the modules its interpreter imports. Runs of `python` code
    /// without files to write or fetch then run as `python3 -c CODE`, forked from it.
    pub warm_python: Option<Vec<String>>,
}

impl Config {
    /// Defaults for `ceiling`.
    pub fn new(ceiling: Ceiling, agent_exe: PathBuf) -> Config {
        Config {
            ceiling,
            max_concurrency: 2 * palisade_cpus().max(1),
            max_queue: 64,
            agent_exe,
            max_fetch_bytes: 16 << 20,
            max_held_bytes: 512 << 20,
            session_ttl: Duration::from_secs(3600),
            session_idle: Duration::from_secs(600),
            max_sessions: 64,
            shutdown_grace: Duration::from_secs(10),
            pool_size: 0,
            pool_max_age: Duration::from_secs(60),
            templates: 8,
            warm_python: None,
        }
    }
}

fn palisade_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The service; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    langs: Vec<lang::Lang>,
    slots: Arc<Semaphore>,
    /// Requests admitted and not finished (running or waiting).
    admitted: AtomicUsize,
    metrics: metrics::Metrics,
    /// Killers of the sandboxes running now, for shutdown.
    live: Mutex<HashMap<u64, RunKiller>>,
    next: AtomicU64,
    /// Notified when work ends (for shutdown's wait).
    quiet: tokio::sync::Notify,
    stopping: AtomicBool,
    sessions: session::Registry,
    /// The change sets this server's workspace sessions left.
    change_sets: workspace::Registry,
    pool: pool::Pool,
    templates: pool::Templates,
    /// Bytes held for replies (`--max-held`).
    held: budget::Budget,
}

/// A place in the queue; dropping it gives the place back.
pub struct Ticket {
    inner: Arc<Inner>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Ticket {
    /// Waits for a slot.
    pub async fn ready(&mut self) -> Result<(), ServiceError> {
        if self.permit.is_none() {
            let p = self
                .inner
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ServiceError::shutting_down())?;
            self.permit = Some(p);
        }
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(ServiceError::shutting_down());
        }
        // Again now that it runs: a request that waited in the queue while replies filled the
        // budget starts no more output than one admitted at once would (`busy` otherwise; the
        // slot goes back with the ticket).
        self.inner.held.admit()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.permit = None;
        self.inner.admitted.fetch_sub(1, Ordering::SeqCst);
        self.inner.quiet.notify_waiters();
    }
}

impl Service {
    /// A service for `config`.
    pub fn new(config: Config) -> Service {
        let langs = lang::available();
        let slots = Arc::new(Semaphore::new(config.max_concurrency.max(1)));
        let held = budget::Budget::new(config.max_held_bytes);
        Service {
            inner: Arc::new(Inner {
                config,
                langs,
                slots,
                admitted: AtomicUsize::new(0),
                metrics: metrics::Metrics::default(),
                live: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                quiet: tokio::sync::Notify::new(),
                stopping: AtomicBool::new(false),
                sessions: session::Registry::default(),
                change_sets: workspace::Registry::default(),
                pool: pool::Pool::default(),
                templates: pool::Templates::default(),
                held,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The budget of bytes held for replies (`--max-held`): a front end keeps a reply's
    /// [`budget::Charge`] until the client has taken the reply.
    pub fn held(&self) -> &budget::Budget {
        &self.inner.held
    }

    /// The languages this server runs.
    pub fn languages(&self) -> Vec<api::Language> {
        lang::describe(&self.inner.langs)
    }

    /// A place in the queue, or `busy` when `max_concurrency + max_queue` requests are already
    /// running or waiting (nothing is started for a refused request).
    pub fn admit(&self) -> Result<Ticket, ServiceError> {
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(ServiceError::shutting_down());
        }
        self.inner.held.admit()?;
        let cap = self.inner.config.max_concurrency + self.inner.config.max_queue;
        let mut cur = self.inner.admitted.load(Ordering::SeqCst);
        loop {
            if cur >= cap {
                self.inner.metrics.busy();
                return Err(ServiceError::busy(cur));
            }
            match self.inner.admitted.compare_exchange(
                cur,
                cur + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        Ok(Ticket {
            inner: self.inner.clone(),
            permit: None,
        })
    }

    /// Fills the warm pool (with `pool_size` set); call once from inside the runtime.
    pub fn start_pool(&self) {
        self.refill();
    }

    /// Whether the service takes work (`/readyz`).
    pub fn ready(&self) -> bool {
        !self.inner.stopping.load(Ordering::SeqCst)
    }

    /// The Prometheus text of the metrics.
    pub fn metrics(&self) -> String {
        let c = &self.inner.config;
        let running =
            c.max_concurrency - self.inner.slots.available_permits().min(c.max_concurrency);
        let admitted = self.inner.admitted.load(Ordering::SeqCst);
        self.inner.metrics.render(&Gauges {
            running,
            queued: admitted.saturating_sub(running),
            sessions: self.inner.sessions.len(),
            max_concurrency: c.max_concurrency,
            max_queue: c.max_queue,
            pool_size: c.pool_size,
            pool_ready: self.inner.pool.len(),
            pool_hits: self.inner.pool.hits.load(Ordering::Relaxed),
            pool_misses: self.inner.pool.misses.load(Ordering::Relaxed),
            pool_started: self.inner.pool.started.load(Ordering::Relaxed),
            templates_max: c.templates,
            templates: self.inner.templates.len(),
            template_hits: self.inner.templates.hits.load(Ordering::Relaxed),
            template_misses: self.inner.templates.misses.load(Ordering::Relaxed),
            templates_built: self.inner.templates.built.load(Ordering::Relaxed),
            templates_evicted: self.inner.templates.evicted.load(Ordering::Relaxed),
            templates_died: self.inner.templates.died.load(Ordering::Relaxed),
            held_bytes: self.inner.held.held(),
            held_limit: self.inner.held.limit(),
            held_refused: self.inner.held.refused(),
            held_cut: self.inner.held.cut(),
            held_evicted: self.inner.held.evicted(),
        })
    }

    /// Stops taking work, lets running work finish for the grace period, then kills what is
    /// left, destroys every session, and returns once no sandbox of this service is alive.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.pool.drain();
        self.destroy_all_sessions().await;
        let deadline = tokio::time::Instant::now() + self.inner.config.shutdown_grace;
        while self.inner.admitted.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            let n = self.inner.quiet.notified();
            let _ = tokio::time::timeout(Duration::from_millis(100), n).await;
        }
        loop {
            let killers: Vec<RunKiller> = self
                .inner
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned()
                .collect();
            for k in &killers {
                k.kill();
            }
            if self.inner.admitted.load(Ordering::SeqCst) == 0
                && self
                    .inner
                    .live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_empty()
            {
                break;
            }
            let n = self.inner.quiet.notified();
            let _ = tokio::time::timeout(Duration::from_millis(100), n).await;
        }
        self.destroy_all_sessions().await;
        self.inner.pool.drain();
        // The templates' zygotes last: every run of them is over by now.
        let svc = self.clone();
        let _ = tokio::task::spawn_blocking(move || svc.inner.templates.clear()).await;
        self.inner.slots.close();
    }

    fn register(&self, k: Option<RunKiller>) -> u64 {
        let key = self.inner.next.fetch_add(1, Ordering::Relaxed);
        if let Some(k) = k {
            self.inner
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, k);
            // A shutdown that began while this run started must still kill it.
            if self.inner.stopping.load(Ordering::SeqCst) {
                if let Some(k) = self
                    .inner
                    .live
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    k.kill();
                }
            }
        }
        key
    }

    fn unregister(&self, key: u64) {
        self.inner
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        self.inner.quiet.notify_waiters();
    }
}

/// `s` cut to at most `max` characters, with `…` when cut, and escaped for logs and messages.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out.escape_debug().to_string()
}

/// Raises this process's soft limit on open files to its hard limit: a server holds a few
/// descriptors per running sandbox and per connection.
pub fn raise_open_files() {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if l.current < l.maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: l.maximum,
                maximum: l.maximum,
            },
        );
    }
}

/// Binds a unix socket at `path` that only this user can connect to: created with mode 0600
/// (never group- or world-accessible, not even between bind and a chmod). A socket left there
/// by a server that died (nobody accepts on it) is replaced; any other file is an error.
///
/// The socket appears at `path` only once it listens: it is bound and listening under a
/// temporary name in the same directory, then renamed into place (without replacing anything
/// that appeared there meanwhile). Bound at `path` directly, there is a moment between `bind`
/// and `listen` when the file exists but a connection is refused, which a client that waits for
/// the file takes for a dead server (12 of 300 starts on a loaded 2-CPU machine).
pub fn bind_private_unix(
    path: &std::path::Path,
) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        let stale = m.file_type().is_socket()
            && matches!(
                std::os::unix::net::UnixStream::connect(path),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
            );
        if !stale {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "something is there already (a live server, or not a socket): not replaced",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path has no file name",
        )
    })?;
    // Short (a socket's path is at most 107 bytes), and this process's own; a socket of that
    // name is one a server of this pid left (removed); anything else there is left alone and the
    // socket is bound at `path` directly.
    let tmp_name = format!(".{:x}.tmp", std::process::id());
    let tmp = path.with_file_name(&tmp_name);
    let mut direct = tmp.as_os_str().len() > 107 || name == tmp_name.as_str();
    if !direct {
        if let Ok(m) = std::fs::symlink_metadata(&tmp) {
            if m.file_type().is_socket() {
                std::fs::remove_file(&tmp)?;
            } else {
                direct = true;
            }
        }
    }
    // The socket's mode is set on the socket itself before bind, which the kernel takes for the
    // file it creates (less the umask): never group- or world-accessible, and without changing
    // the process-wide umask under the other threads' feet.
    let l = {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(if direct { path } else { &tmp })?)?;
        rustix::net::listen(&fd, 1024)?;
        std::os::unix::net::UnixListener::from(fd)
    };
    if !direct {
        if let Err(e) = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::time::Duration;

    /// A batch whose runs wait for room in the server's budget stops waiting at shutdown, and
    /// gives its place in the queue back: shutdown ends at once, not at the end of its grace
    /// period (which it waited out, the batch counted as running work).
    #[tokio::test]
    async fn a_batch_waiting_for_room_does_not_hold_shutdown_up() {
        let policy = palisade::policy::Policy::new(["true"]).unwrap();
        let ceiling = super::Ceiling::new(policy).unwrap();
        let mut config = super::Config::new(ceiling, "/nonexistent/agent".into());
        config.max_held_bytes = 1 << 20;
        config.shutdown_grace = Duration::from_secs(120);
        config.templates = 0;
        let svc = super::Service::new(config);
        let req: super::api::BatchRequest = serde_json::from_value(serde_json::json!(
            {"runs": [{"command": ["true"]}, {"command": ["true"]}]}
        ))
        .unwrap();
        let mut rx = svc.run_batch(req).unwrap();
        // Full once the batch is admitted (its task runs at this test's first wait).
        let full = svc.held().force(1 << 20);
        // Nothing comes while the budget is full: the batch's runs wait for room.
        assert!(tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err());
        tokio::time::timeout(Duration::from_secs(60), svc.shutdown())
            .await
            .expect("shutdown waited for the batch");
        assert!(rx.recv().await.is_none(), "a run started during shutdown");
        drop(full);
    }

    fn names(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_private_socket_appears_listening_and_leaves_nothing_else() {
        let d = std::env::temp_dir().join(format!("palisade-bind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        let p = d.join("s.sock");
        let l = super::bind_private_unix(&p).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(names(&d), vec!["s.sock".to_string()]);
        std::os::unix::net::UnixStream::connect(&p).expect("it listens");
        // A file of the temporary name that is not a socket is left alone.
        drop(l);
        let tmp = d.join(format!(".{:x}.tmp", std::process::id()));
        std::fs::write(&tmp, "mine").unwrap();
        let _l = super::bind_private_unix(&p).expect("a dead server's socket is replaced");
        assert_eq!(std::fs::read_to_string(&tmp).unwrap(), "mine");
        std::os::unix::net::UnixStream::connect(&p).expect("it listens");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
