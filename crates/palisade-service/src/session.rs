//! Sessions: a sandbox that lives across calls, whose payload is the agent. Every exec runs
//! inside the same boundary and cgroup, so the session's ceilings (memory, processes, CPU time,
//! disk) hold across all its execs together; each exec has its own deadline and output cap, kept
//! by the server, which kills the exec's process group through the agent, and the whole session
//! if the agent does not answer. A session past its TTL or idle timeout is destroyed with
//! everything in it.

use crate::api::{self, Data, ExecEvent, ExecInfo, SessionInfo, SessionRequest, Stage};
use crate::budget::{Budget, Charge, Charged, Kept};
use crate::client::{AgentConn, Reply};
use crate::proto::{self, Request};
use crate::run::{capture, exec_error, stage_of, Held};
use crate::{Service, ServiceError};
use palisade::{Io, Sandbox, Stdin};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

mod interp;

/// Events of a streamed exec, each holding its output's bytes against the server's budget until
/// the front end has handed it over.
pub type ExecStream = tokio::sync::mpsc::Receiver<Charged<ExecEvent>>;

#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<String, Arc<Session>>>,
    keys: Mutex<HashMap<String, String>>,
    /// Sessions that ended, and why (the latest [`ENDED_KEPT`]): a call for one is 410, not 404.
    ended: Mutex<std::collections::VecDeque<(String, String)>>,
}

/// How many ended sessions are remembered.
const ENDED_KEPT: usize = 4096;
/// Most results of finished background execs a session keeps (the oldest dropped first).
pub const KEPT_RESULTS: usize = 64;
/// Most bytes of output (stdout and stderr) the kept results of a session's finished background
/// execs hold together (the oldest dropped first; the newest is always kept, at most its own
/// output cap).
pub const KEPT_RESULT_BYTES: u64 = 32 << 20;
/// How many dropped results are remembered (a poll of one is 410, not 404).
const DROPPED_KEPT: usize = 4096;

impl Registry {
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

pub(crate) struct Session {
    id: String,
    labels: BTreeMap<String, String>,
    key: Option<String>,
    created: Instant,
    ttl: Duration,
    idle: Duration,
    last: Mutex<Instant>,
    env: Vec<(String, String)>,
    conn: AgentConn,
    held: tokio::sync::Mutex<Option<Held>>,
    execs: Mutex<Execs>,
    count: AtomicU64,
    /// Execs running now (all modes).
    running: Mutex<Vec<u64>>,
    /// Most execs running at once ([`crate::run::max_running_execs`]), and those being started.
    max_running: usize,
    starting: std::sync::atomic::AtomicUsize,
    wake: tokio::sync::Notify,
    /// The code interpreter's contexts.
    contexts: interp::Contexts,
    /// The workspace it was opened on.
    workspace: Option<crate::workspace::Admitted>,
}

/// A background exec.
struct Bg {
    stdin: Option<Arc<tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>>>,
    /// Its result once it ended, its output counted against the server's budget of bytes
    /// held, which may drop it (oldest first) when it needs the room.
    result: Option<Kept<Stage>>,
}

/// A session's background execs: running ones, and the results of finished ones within
/// [`KEPT_RESULTS`] and [`KEPT_RESULT_BYTES`], the oldest dropped first.
#[derive(Default)]
struct Execs {
    map: HashMap<u64, Bg>,
    /// Finished ones whose results are kept, oldest first, with their output's size.
    done: std::collections::VecDeque<(u64, u64)>,
    bytes: u64,
    /// Finished ones whose results were dropped (the latest [`DROPPED_KEPT`]).
    dropped: std::collections::VecDeque<u64>,
}

impl Execs {
    /// Keeps `result` as exec `eid`'s, then drops the oldest results past the bounds.
    fn finish(&mut self, eid: u64, mut result: Stage, mut held: Charge, budget: &Budget) {
        let Some(bg) = self.map.get_mut(&eid) else {
            return;
        };
        // Held as long as the session may keep it: no spare capacity.
        result.stdout.data.shrink_to_fit();
        result.stderr.data.shrink_to_fit();
        let size = result.stdout.data.len() as u64 + result.stderr.data.len() as u64;
        // What is kept now (base64 of output that is not UTF-8 is a third larger).
        held.set(size);
        bg.result = Some(budget.keep(result, held));
        bg.stdin = None;
        self.done.push_back((eid, size));
        self.bytes += size;
        while self.done.len() > KEPT_RESULTS
            || (self.bytes > KEPT_RESULT_BYTES && self.done.len() > 1)
        {
            let Some((old, n)) = self.done.pop_front() else {
                break;
            };
            self.bytes -= n;
            self.map.remove(&old);
            if self.dropped.len() >= DROPPED_KEPT {
                self.dropped.pop_front();
            }
            self.dropped.push_back(old);
        }
    }

    /// Exec `eid`, or why not: 410 for a dropped result, 404 for an unknown id.
    fn get(&self, eid: u64) -> Result<&Bg, ServiceError> {
        if let Some(bg) = self.map.get(&eid) {
            return Ok(bg);
        }
        if self.dropped.contains(&eid) {
            return Err(ServiceError::result_dropped(
                eid,
                &format!(
                    "a session keeps the results of its last {KEPT_RESULTS} finished background execs, at most {} MiB of output together (the newest always), the oldest dropped first",
                    KEPT_RESULT_BYTES >> 20
                ),
            ));
        }
        Err(ServiceError::not_found("exec", &eid.to_string()))
    }
}

/// Hands an exec's cgroup back to its run on a blocking thread: that can remove a directory and,
/// past the host's mark of held memory cgroups, give back the pages charged to it (palisade-cgroup's
/// `held`), which takes as long as writing back what is dirty; not on the server's async workers.
fn let_go(cg: palisade::ExecCgroup) {
    // Off a runtime (one shutting down drops what it held), dropped here.
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(move || drop(cg))),
        Err(_) => drop(cg),
    }
}

/// How an exec's OOM kills are counted.
enum OomCount {
    /// In a cgroup of its own, which its process entered before the program started: exact.
    Own(palisade::ExecCgroup),
    /// From the session's cgroup, whose count at the exec's start this is (`None`: no cgroup):
    /// with other execs at the same time, a kill counted meanwhile may have been another's.
    Session(Option<u64>),
}

impl Session {
    /// The OOM kills the session's cgroup has counted so far.
    async fn oom_kills(&self) -> Option<u64> {
        self.held.lock().await.as_ref().and_then(|h| h.oom_kills())
    }

    /// A cgroup of its own for the next exec, or `None` (the reason logged): the exec's kills
    /// are then counted from the session's cgroup.
    /// The cgroup work (a `mkdir`; before a v2 session's first exec, freezing it and moving its
    /// processes) runs on a blocking thread, not the server's async workers.
    async fn exec_cgroup(self: &Arc<Self>) -> Option<palisade::ExecCgroup> {
        let s = self.clone();
        let r = tokio::task::spawn_blocking(move || match s.held.blocking_lock().as_ref() {
            Some(h) => h.exec_cgroup(),
            None => Ok(None),
        })
        .await
        .unwrap_or_else(|e| Err(format!("the cgroup's thread failed: {e}")));
        r.unwrap_or_else(|why| {
            tracing::warn!(session = %self.id, why, "execs get no cgroup of their own");
            None
        })
    }

    /// Holds `bytes` of the session's memory for a file or an archive the agent is about to write
    /// into scratch, until the returned value is dropped ([`palisade::Run::reserve_memory`]); a
    /// session without that much left is refused, naming `field`, rather than have the file
    /// charged past its ceiling, where the kernel killed the agent, its largest process. The
    /// cgroup work runs on a blocking thread.
    async fn reserve_memory(
        self: &Arc<Self>,
        bytes: u64,
        field: &str,
    ) -> Result<palisade::MemoryReservation, ServiceError> {
        let s = self.clone();
        let r = tokio::task::spawn_blocking(move || match s.held.blocking_lock().as_ref() {
            Some(h) => h.reserve_memory(bytes),
            None => Ok(palisade::MemoryReservation::none()),
        })
        .await;
        match r {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(palisade::ReserveError::Full { left })) => Err(ServiceError::file(
                field,
                "no-space",
                &format!(
                    "the session has {left} bytes of memory left for files, and this needs {bytes}: its memory ceiling, less room for its agent, less what its processes and files hold (remove files, or ask for more memory when making the session)"
                ),
            )),
            Ok(Err(palisade::ReserveError::Cgroup(e))) => Err(ServiceError::internal(format!(
                "the session's memory could not be held for the file: {e}"
            ))),
            Err(e) => Err(ServiceError::internal(format!(
                "the cgroup's thread failed: {e}"
            ))),
        }
    }

    /// [`Session::exec_cgroup`] with the files its process writes into to enter it (none when
    /// there is no cgroup, or its files cannot be opened: the reason logged).
    async fn exec_cgroup_to_join(
        self: &Arc<Self>,
    ) -> (Option<palisade::ExecCgroup>, Vec<std::fs::File>) {
        let own = self.exec_cgroup().await;
        let join = match own.as_ref().map(|c| c.join_files()) {
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                tracing::warn!(session = %self.id, error = %e, "an exec's cgroup cannot be joined");
                Vec::new()
            }
            None => Vec::new(),
        };
        (own, join)
    }

    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn info(&self) -> SessionInfo {
        let age = self.created.elapsed();
        SessionInfo {
            id: self.id.clone(),
            labels: self.labels.clone(),
            age_s: age.as_secs_f64(),
            expires_in_s: self.ttl.saturating_sub(age).as_secs_f64(),
            idle_timeout_s: self.idle.as_secs(),
            execs: self.count.load(Ordering::Relaxed),
            running: self
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            idempotency_key: self.key.clone(),
            workspace: self
                .workspace
                .as_ref()
                .map(|w| w.path.display().to_string()),
        }
    }

    /// When it must end, and why.
    fn due(&self) -> (Instant, &'static str) {
        let ttl = self.created + self.ttl;
        let idle = *self.last.lock().unwrap_or_else(|p| p.into_inner()) + self.idle;
        // An exec running keeps the session from going idle.
        if !self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            || idle >= ttl
        {
            (ttl, "its TTL passed")
        } else {
            (idle, "it was idle past its idle timeout")
        }
    }
}

fn new_id() -> String {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b.copy_from_slice(&t.to_le_bytes());
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("sb-{hex}")
}

impl Service {
    /// `POST /v1/sandboxes`: a new session (or, for a known idempotency key, the existing one).
    pub async fn create_session(&self, req: SessionRequest) -> Result<SessionInfo, ServiceError> {
        let c = &self.inner.config;
        if self.inner.stopping.load(Ordering::SeqCst) {
            return Err(ServiceError::shutting_down());
        }
        if let Some(k) = &req.idempotency_key {
            if k.is_empty() || k.len() > 200 {
                return Err(ServiceError::invalid(
                    "idempotency_key",
                    k.as_str(),
                    "1 to 200 characters",
                ));
            }
            let known = self
                .inner
                .sessions
                .keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(k)
                .cloned();
            if let Some(id) = known {
                if let Ok(s) = self.session(&id) {
                    return Ok(s.info());
                }
            }
        }
        if req.labels.len() > 64
            || req
                .labels
                .iter()
                .any(|(k, v)| k.len() > 128 || v.len() > 1024)
        {
            return Err(ServiceError::invalid(
                "labels",
                format!("{} labels", req.labels.len()),
                "at most 64 labels, keys up to 128 and values up to 1024 bytes",
            ));
        }
        let max_ttl = c.session_ttl.as_secs();
        let ttl = match req.ttl_s {
            None => max_ttl,
            Some(0) => {
                return Err(ServiceError::invalid(
                    "ttl_s",
                    "0",
                    format!("between 1 and {max_ttl}"),
                ))
            }
            Some(t) if t > max_ttl => return Err(ServiceError::ceiling("ttl_s", t, max_ttl)),
            Some(t) => t,
        };
        let idle = match req.idle_timeout_s {
            None => c.session_idle.as_secs().min(ttl),
            Some(0) => {
                return Err(ServiceError::invalid(
                    "idle_timeout_s",
                    "0",
                    format!("between 1 and {ttl} (the TTL)"),
                ))
            }
            Some(t) if t > ttl => {
                return Err(ServiceError::invalid(
                    "idle_timeout_s",
                    t.to_string(),
                    format!("at most the TTL, {ttl}"),
                ))
            }
            Some(t) => t,
        };
        // A workspace: checked against the server's roots before anything else is spent.
        let workspace = match &req.workspace {
            Some(w) => Some(c.ceiling.workspace(w, "workspace")?),
            None => None,
        };
        let mut limits = c.ceiling.limits(&req.limits, "limits")?;
        if limits.open_files < crate::run::AGENT_MIN_FILES {
            return Err(ServiceError::invalid(
                "limits.open_files",
                limits.open_files.to_string(),
                format!(
                    "at least {}: what the sandbox's setup and its agent need",
                    crate::run::AGENT_MIN_FILES
                ),
            ));
        }
        if limits.memory_bytes < crate::run::SESSION_MIN_MEMORY {
            return Err(ServiceError::invalid(
                "limits.memory_bytes",
                limits.memory_bytes.to_string(),
                format!(
                    "at least {} (16 MiB) for a session: its sandbox's init and agent take ~2.5 MiB, and its execs need room beside them",
                    crate::run::SESSION_MIN_MEMORY
                ),
            ));
        }
        if limits.pids < crate::run::AGENT_MIN_PIDS {
            return Err(ServiceError::invalid(
                "limits.pids",
                limits.pids.to_string(),
                format!("at least {}: the sandbox's init, the agent, a thread that waits for an exec, and the program", crate::run::AGENT_MIN_PIDS),
            ));
        }
        let network = c.ceiling.network(&req.allow_net, "allow_net")?;
        let env = c.ceiling.env(&req.env, "env")?;
        let env_pairs: Vec<(String, String)> = req
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // The sandbox's own deadline is the TTL (with room for the teardown); its CPU budget is
        // the session's whole (the ceiling's, unless asked for less).
        limits.timeout_ms =
            (ttl * 1000 + 30_000).min(palisade::policy::MAX_TIMEOUT.as_millis() as u64);
        limits.output_bytes = 1 << 20;
        let memory_bytes = limits.memory_bytes;
        let mut policy = c.ceiling.policy_for(
            vec![proto::AGENT_PATH.into(), proto::AGENT_ARG.into()],
            limits,
            network,
            env,
        )?;
        policy.binds.push(crate::run::agent_bind(&c.agent_exe)?);
        // The workspace is not a bound of the policy's (its roots are the ceiling): set after
        // the policy was checked against the bounds.
        if let Some(w) = &workspace {
            policy.scratch = palisade::policy::Scratch::Workspace {
                path: w.path.clone(),
            };
        }
        if self.inner.sessions.len() >= c.max_sessions {
            self.inner.metrics.busy();
            let mut e = ServiceError::busy(self.inner.sessions.len());
            e.message = format!(
                "the server already holds its maximum of {} sessions; delete one or retry later",
                c.max_sessions
            );
            return Err(e);
        }
        let mut sandbox = Sandbox::from_policy(policy)
            .map_err(|e| ServiceError::internal(format!("policy: {e}")))?;
        if workspace.is_some() {
            let store = c
                .ceiling
                .workspaces()
                .map(|w| w.store().clone())
                .ok_or_else(|| ServiceError::internal("a workspace without a store"))?;
            // Kept for review: never applied by the server on its own.
            sandbox = sandbox.with_workspace(palisade::WorkspaceOptions {
                store: Some(store),
                ..Default::default()
            });
        }
        let mut held = Held::start(
            self,
            sandbox,
            Io {
                stdin: Some(Stdin::Socket),
                stream_buffer: None,
                ..Io::default()
            },
        )
        .await;
        let Some(sock) = held.run_mut().take_stdin() else {
            let out = held.finish().await;
            return Err(ServiceError::internal(format!(
                "the session's sandbox did not start: {}",
                out.report.error.unwrap_or_else(|| "unknown".into())
            )));
        };
        let conn = AgentConn::new(
            sock,
            c.max_fetch_bytes as usize + 1,
            self.inner.held.clone(),
        )
        .map_err(|e| ServiceError::internal(format!("agent socket: {e}")))?;
        let s = Arc::new(Session {
            id: new_id(),
            labels: req.labels.clone(),
            key: req.idempotency_key.clone(),
            created: Instant::now(),
            ttl: Duration::from_secs(ttl),
            idle: Duration::from_secs(idle),
            last: Mutex::new(Instant::now()),
            env: env_pairs,
            conn,
            held: tokio::sync::Mutex::new(Some(held)),
            execs: Mutex::new(Execs::default()),
            count: AtomicU64::new(0),
            running: Mutex::new(Vec::new()),
            max_running: crate::run::max_running_execs(memory_bytes),
            starting: std::sync::atomic::AtomicUsize::new(0),
            wake: tokio::sync::Notify::new(),
            contexts: interp::Contexts::default(),
            workspace,
        });
        {
            let mut keys = self
                .inner
                .sessions
                .keys
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(k) = &req.idempotency_key {
                // Two creates with one key at once: the first to register wins, the other's
                // sandbox is destroyed.
                if let Some(id) = keys.get(k).cloned() {
                    drop(keys);
                    let s2 = s.clone();
                    tokio::spawn(async move { teardown(&s2).await });
                    return self.session(&id).map(|x| x.info());
                }
                keys.insert(k.clone(), s.id.clone());
            }
            self.inner
                .sessions
                .map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(s.id.clone(), s.clone());
        }
        self.inner.metrics.session_created();
        tracing::info!(session = %s.id, ttl_s = ttl, idle_s = idle, "session created");
        // The reaper: destroys the session at its TTL or idle timeout, or when its agent dies.
        let svc = self.clone();
        let s2 = s.clone();
        tokio::spawn(async move {
            loop {
                let (due, why) = s2.due();
                let wake = s2.wake.notified();
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {
                        if Instant::now() >= s2.due().0 {
                            svc.inner.metrics.session_expired();
                            tracing::info!(session = %s2.id, why, "session expired");
                            svc.remove_session(&s2.id, why).await;
                            return;
                        }
                    }
                    _ = s2.conn.gone() => {
                        let why = format!("its agent ended (the sandbox was killed, or a limit of the whole session was reached, or the agent was stopped: {})", s2.conn.why());
                        svc.remove_session(&s2.id, &why).await;
                        return;
                    }
                    _ = wake => {
                        if s2.held.lock().await.is_none() { return; }
                    }
                }
            }
        });
        Ok(s.info())
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, ServiceError> {
        let found = self
            .inner
            .sessions
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        found.ok_or_else(|| {
            let ended = self
                .inner
                .sessions
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match ended.iter().find(|(e, _)| e == id) {
                Some((_, why)) => ServiceError::gone(id, why),
                None => ServiceError::not_found("session", id),
            }
        })
    }

    /// `GET /v1/sandboxes/{id}`.
    pub fn get_session(&self, id: &str) -> Result<SessionInfo, ServiceError> {
        Ok(self.session(id)?.info())
    }

    /// `GET /v1/sandboxes`.
    pub fn list_sessions(&self) -> Vec<SessionInfo> {
        let mut v: Vec<SessionInfo> = self
            .inner
            .sessions
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|s| s.info())
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// `DELETE /v1/sandboxes/{id}`: destroys it; returns its final report.
    pub async fn delete_session(&self, id: &str) -> Result<serde_json::Value, ServiceError> {
        self.session(id)?;
        Ok(self
            .remove_session(id, "deleted")
            .await
            .unwrap_or(serde_json::Value::Null))
    }

    async fn remove_session(&self, id: &str, why: &str) -> Option<serde_json::Value> {
        let s = self
            .inner
            .sessions
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)?;
        if s.workspace.is_some() {
            // Its change set is being kept: `GET /v1/changes` waits for it (a client that saw
            // the session gone finds its change set there).
            self.inner.change_sets.ending(id);
        }
        if let Some(k) = &s.key {
            self.inner
                .sessions
                .keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(k);
        }
        {
            let mut ended = self
                .inner
                .sessions
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if ended.len() >= ENDED_KEPT {
                ended.pop_front();
            }
            ended.push_back((id.to_owned(), why.to_owned()));
        }
        tracing::info!(session = %id, why, "session destroyed");
        let report = teardown(&s).await;
        if let Some(ws) = &s.workspace {
            // The change set is known once the sandbox is gone: said in the session's end, so
            // that a call for the session after it (410) names it.
            let cs = self.register_change_set(id, ws, report.as_ref()).await;
            let mut ended = self
                .inner
                .sessions
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(e) = ended.iter_mut().rev().find(|(e, _)| e == id) {
                match cs {
                    Some(cs) => e.1.push_str(&format!(
                        "; its workspace's changes are change set {cs} (GET /v1/changes/{cs})"
                    )),
                    None => e.1.push_str("; its workspace left no change set"),
                }
            }
            drop(ended);
            self.inner.change_sets.ended(id);
        }
        s.wake.notify_waiters();
        if let Some(r) = &report {
            self.inner.metrics.report(r);
        }
        report
    }

    pub(crate) async fn destroy_all_sessions(&self) {
        let ids: Vec<String> = self
            .inner
            .sessions
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for id in ids {
            self.remove_session(&id, "the server is shutting down")
                .await;
        }
    }

    /// `POST /v1/sandboxes/{id}/exec` in `sync` mode: runs and answers when it ends. The exec
    /// is kept (its deadline, its output cap, its end) by a task of its own, not by the
    /// request: a client that goes away does not take the exec's deadline with it, and the
    /// exec still leaves the session's running list when it ends.
    /// The result holds its output against the server's budget (see [`crate::budget`]).
    pub async fn exec(
        &self,
        id: &str,
        req: api::ExecRequest,
    ) -> Result<Charged<Stage>, ServiceError> {
        let (s, argv, env, cwd, timeout, cap, stdin) = self.exec_plan(id, &req)?;
        // The stdin is held (one copy: the request's goes now) until the program has it.
        drop(req);
        let stdin_held = self.inner.held.admit_charge(stdin.len() as u64)?;
        let (e, oom) = self.start_exec(&s, argv, env, cwd).await?;
        let eid = e.id;
        let (svc, s2) = (self.clone(), s.clone());
        let kept = tokio::spawn(async move {
            let mut c = capture(&s2.conn, e, stdin, stdin_held, timeout, cap, None).await;
            let stage = svc.exec_ended(&s2, eid, &mut c, oom).await;
            (c, stage)
        });
        let (mut c, stage) = kept
            .await
            .map_err(|e| ServiceError::internal(format!("exec {eid}: {e}")))?;
        let held = std::mem::take(&mut c.held);
        if c.exit.is_none() && s.conn.is_dead() {
            // The agent stopped answering (or died) during the exec: the session is destroyed
            // with everything in it, the exec with it.
            return Err(ServiceError::gone(
                &s.id,
                &format!(
                    "exec {eid} ({:?} after {} ms) did not end through its agent, and the session was destroyed: {}",
                    stage.status,
                    c.wall.as_millis(),
                    s.conn.why()
                ),
            ));
        }
        Ok(Charged::new(stage, held))
    }

    /// `stream` and `sse` modes: the exec's events as they come. Dropping the stream kills the exec.
    pub async fn exec_stream(
        &self,
        id: &str,
        req: api::ExecRequest,
    ) -> Result<ExecStream, ServiceError> {
        let (s, argv, env, cwd, timeout, cap, stdin) = self.exec_plan(id, &req)?;
        drop(req);
        let stdin_held = self.inner.held.admit_charge(stdin.len() as u64)?;
        let (e, oom) = self.start_exec(&s, argv, env, cwd).await?;
        let eid = e.id;
        let (tx, rx) = tokio::sync::mpsc::channel::<Charged<ExecEvent>>(16);
        let (ctx, mut crx) = tokio::sync::mpsc::channel::<crate::run::Chunk>(16);
        let svc = self.clone();
        let none = |ev| Charged::new(ev, Charge::default());
        let _ = tx.send(none(ExecEvent::Start { id: eid })).await;
        let tx2 = tx.clone();
        let fwd = tokio::spawn(async move {
            loop {
                let (err, b, held) = tokio::select! {
                    m = crx.recv() => match m {
                        Some(m) => m,
                        None => break,
                    },
                    // The client went away: dropping `crx` tells the exec's capture.
                    _ = tx2.closed() => break,
                };
                let data = Data::new(b, false);
                let ev = if err {
                    ExecEvent::Stderr { data }
                } else {
                    ExecEvent::Stdout { data }
                };
                if tx2.send(Charged::new(ev, held)).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            let mut c = capture(&s.conn, e, stdin, stdin_held, timeout, cap, Some(&ctx)).await;
            drop(ctx);
            // The exec is over (its process is gone) whether or not the client reads: it leaves
            // the session's running list now, and its exit follows what is still to send.
            let result = svc.exec_ended(&s, eid, &mut c, oom).await;
            let _ = fwd.await;
            let _ = tx.send(none(ExecEvent::Exit { result })).await;
        });
        Ok(rx)
    }

    /// `background` mode: starts it and answers with its id at once.
    pub async fn exec_background(
        &self,
        id: &str,
        req: api::ExecRequest,
    ) -> Result<ExecInfo, ServiceError> {
        let (s, argv, env, cwd, timeout, cap, stdin) = self.exec_plan(id, &req)?;
        drop(req);
        let stdin_held = self.inner.held.admit_charge(stdin.len() as u64)?;
        let (mut e, oom) = self.start_exec(&s, argv, env, cwd).await?;
        let eid = e.id;
        let pipe = Arc::new(tokio::sync::Mutex::new(e.stdin.take()));
        // Nothing from here on waits on the request: the exec is registered and kept by its own
        // task at once, and its first stdin goes by a task of its own (a client that went away
        // while the program did not read its stdin left the exec running past its deadline,
        // unknown to the session and counted among its running ones for good).
        if !stdin.is_empty() {
            let pipe = pipe.clone();
            tokio::spawn(async move {
                if let Some(w) = pipe.lock().await.as_mut() {
                    let _ = w.write_all(&stdin).await;
                }
                drop(stdin_held);
            });
        }
        s.execs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .insert(
                eid,
                Bg {
                    stdin: Some(pipe),
                    result: None,
                },
            );
        let svc = self.clone();
        let s2 = s.clone();
        tokio::spawn(async move {
            let mut c = capture(
                &s2.conn,
                e,
                Vec::new(),
                Charge::default(),
                timeout,
                cap,
                None,
            )
            .await;
            let result = svc.exec_ended(&s2, eid, &mut c, oom).await;
            let held = std::mem::take(&mut c.held);
            drop(c);
            s2.execs.lock().unwrap_or_else(|p| p.into_inner()).finish(
                eid,
                result,
                held,
                &svc.inner.held,
            );
        });
        Ok(ExecInfo {
            id: eid,
            running: true,
            result: None,
        })
    }

    /// `GET /v1/sandboxes/{id}/exec/{exec}`: a background exec's state. A copy of its result is
    /// made for each call, and held against the server's budget until sent (`busy` while the
    /// budget is full: slow clients polling a large result cannot pile copies up).
    pub fn exec_info(&self, id: &str, exec: u64) -> Result<Charged<ExecInfo>, ServiceError> {
        let s = self.session(id)?;
        s.touch();
        let kept = {
            let execs = s.execs.lock().unwrap_or_else(|p| p.into_inner());
            execs.get(exec)?.result.clone()
        };
        let Some(kept) = kept else {
            let info = ExecInfo {
                id: exec,
                running: true,
                result: None,
            };
            return Ok(Charged::new(info, Charge::default()));
        };
        // Room for the copy first (which may drop this very result, the oldest kept).
        let held = self.inner.held.admit_charge(kept.bytes())?;
        let Some(result) = kept.with(Stage::clone) else {
            return Err(ServiceError::result_dropped(
                exec,
                "the server needed its room for replies (--max-held), and dropped the oldest results kept",
            ));
        };
        Ok(Charged::new(
            ExecInfo {
                id: exec,
                running: false,
                result: Some(result),
            },
            held,
        ))
    }

    /// `POST /v1/sandboxes/{id}/exec/{exec}/stdin`: more input for a background exec; `close`
    /// ends it (end of file).
    pub async fn exec_stdin(
        &self,
        id: &str,
        exec: u64,
        data: bytes::Bytes,
        close: bool,
    ) -> Result<(), ServiceError> {
        let s = self.session(id)?;
        s.touch();
        let pipe = {
            let execs = s.execs.lock().unwrap_or_else(|p| p.into_inner());
            let bg = execs.get(exec)?;
            bg.stdin
                .clone()
                .ok_or_else(|| ServiceError::conflict("exec", format!("exec {exec} has ended")))?
        };
        // One write at a time: a second is refused rather than queued behind one the program
        // does not read (each held its body for as long as the program did not read).
        let Ok(mut g) = pipe.try_lock() else {
            return Err(ServiceError::conflict(
                "stdin",
                format!(
                    "a write to the stdin of exec {exec} is in progress; send more once it is done"
                ),
            ));
        };
        let Some(w) = g.as_mut() else {
            return Err(ServiceError::conflict(
                "stdin",
                format!("the stdin of exec {exec} is closed"),
            ));
        };
        if !data.is_empty() {
            // The program must take it within the agent's time for a file of its size.
            let within = crate::client::FILE_DEADLINE
                + Duration::from_secs(data.len() as u64 / crate::client::TRANSFER_FLOOR);
            match tokio::time::timeout(within, w.write_all(&data)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(ServiceError::conflict(
                        "stdin",
                        format!("exec {exec} does not read its stdin any more: {e}"),
                    ))
                }
                Err(_) => {
                    return Err(ServiceError::conflict(
                        "stdin",
                        format!(
                            "exec {exec} did not read its stdin within {} s (part of it may have been written)",
                            within.as_secs()
                        ),
                    ))
                }
            }
        }
        if close {
            *g = None;
        }
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/exec/{exec}/signal`.
    pub async fn exec_signal(&self, id: &str, exec: u64, signal: i32) -> Result<(), ServiceError> {
        let s = self.session(id)?;
        s.touch();
        if !s
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&exec)
        {
            return Err(ServiceError::not_found("running exec", &exec.to_string()));
        }
        match s.conn.signal(exec, signal).await {
            Ok(Reply::Ok { .. }) => Ok(()),
            Ok(Reply::Err { code, message }) => Err(ServiceError::file("signal", &code, &message)),
            Ok(Reply::Full) => Err(ServiceError::internal(
                "the agent answered a signal in pieces",
            )),
            Err(e) => Err(ServiceError::internal(format!("the agent: {}", e.0))),
        }
    }

    #[allow(clippy::type_complexity)]
    fn exec_plan(
        &self,
        id: &str,
        req: &api::ExecRequest,
    ) -> Result<
        (
            Arc<Session>,
            Vec<String>,
            Vec<(String, String)>,
            String,
            Duration,
            u64,
            Vec<u8>,
        ),
        ServiceError,
    > {
        let s = self.session(id)?;
        s.touch();
        let c = self.inner.config.ceiling.policy().limits;
        if req.command.is_empty()
            || req.command[0].is_empty()
            || req.command.iter().any(|a| a.contains('\0'))
        {
            return Err(ServiceError::invalid(
                "command",
                format!("{:?}", req.command),
                "a program and its arguments, without NUL bytes",
            ));
        }
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
        let cap = req.output_bytes.unwrap_or(c.output_bytes.min(64 << 20));
        if cap == 0 || cap > c.output_bytes {
            return Err(ServiceError::ceiling("output_bytes", cap, c.output_bytes));
        }
        let mut env = s.env.clone();
        for (k, v) in &req.env {
            palisade::policy::EnvVar::new(k, v).map_err(|e| {
                ServiceError::invalid(format!("env.{k}"), k.as_str(), e.to_string())
            })?;
            env.retain(|(n, _)| n != k);
            env.push((k.clone(), v.clone()));
        }
        let cwd = match &req.cwd {
            None => String::new(),
            Some(p) => {
                proto::check_path(p).map_err(|e| ServiceError::invalid("cwd", p.as_str(), e))?;
                p.clone()
            }
        };
        let stdin = match &req.stdin {
            Some(c) => c.bytes("stdin")?,
            None => Vec::new(),
        };
        Ok((
            s,
            req.command.clone(),
            env,
            cwd,
            Duration::from_millis(timeout),
            cap,
            stdin,
        ))
    }

    async fn start_exec(
        &self,
        s: &Arc<Session>,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
    ) -> Result<(crate::client::Exec, OomCount), ServiceError> {
        // The agent's memory for each exec running is charged beside the execs' cgroups: as
        // many as half its room holds, those being started counted too.
        {
            let running = s.running.lock().unwrap_or_else(|p| p.into_inner());
            let now = running.len() + s.starting.load(Ordering::Acquire);
            if now >= s.max_running {
                return Err(ServiceError::conflict(
                    "exec",
                    format!(
                        "the session runs {now} execs already, the most its memory allows at once ({}); wait for one to end, or ask for more memory when making the session",
                        s.max_running
                    ),
                ));
            }
            s.starting.fetch_add(1, Ordering::AcqRel);
        }
        struct Starting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Starting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _starting = Starting(&s.starting);
        // The exec's own cgroup, which its process enters before the program starts; failing
        // that, the session cgroup's OOM kills before the exec, for the exec's count.
        let (own, join) = s.exec_cgroup_to_join().await;
        let oom0 = s.oom_kills().await;
        match s.conn.exec(argv, env, cwd, &join).await {
            Ok(Ok(e)) => {
                let oom = match own {
                    Some(c) if e.joined => OomCount::Own(c),
                    other => {
                        if let Some(c) = other {
                            let_go(c);
                        }
                        OomCount::Session(oom0)
                    }
                };
                s.count.fetch_add(1, Ordering::Relaxed);
                s.running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(e.id);
                self.inner.metrics.exec();
                Ok((e, oom))
            }
            Ok(Err((code, message))) => {
                if let Some(c) = own {
                    let_go(c);
                }
                Err(exec_error(&code, &message))
            }
            Err(e) => {
                if let Some(c) = own {
                    let_go(c);
                }
                Err(ServiceError::gone(
                    &s.id,
                    &format!("its agent is gone ({})", e.0),
                ))
            }
        }
    }

    /// An exec ended: its result, with its OOM kills: those its own cgroup counted, or, where
    /// it has none, those the session's cgroup counted since it started. A program killed by
    /// `SIGKILL` that the server did not send (not its deadline, nor its output cap) while its
    /// count rose died of memory: `oom`. The OOM killer counts its kill as it sends it, before
    /// the program can be seen to end, so the count read after the end holds it.
    async fn exec_ended(
        &self,
        s: &Arc<Session>,
        eid: u64,
        c: &mut crate::run::Captured,
        oom: OomCount,
    ) -> Stage {
        let mut stage = stage_of(c);
        let n = match oom {
            // Read, then let go (for a later exec to take, or removed).
            OomCount::Own(cg) => {
                let n = cg.oom_kills();
                let_go(cg);
                Some(n)
            }
            OomCount::Session(a) => a.zip(s.oom_kills().await).map(|(a, b)| b.saturating_sub(a)),
        };
        if let Some(n) = n {
            stage.oom_kills = Some(n);
            if n > 0 && stage.status == api::RunStatus::Signal && stage.signal == Some(9) {
                stage.status = api::RunStatus::Oom;
            }
        }
        s.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| *x != eid);
        s.touch();
        s.wake.notify_waiters();
        // A killed exec that never ended: the agent does not answer; the session goes.
        if c.exit.is_none() && !s.conn.is_dead() {
            self.remove_session(&s.id, "an exec could not be stopped through its agent")
                .await;
        }
        stage
    }

    /// A file operation on session `id`: the session touched, `path` checked (a directory may
    /// also be empty or `.`, the working directory), `request` (given its id) sent with `body`
    /// to the agent, and its answer judged, a refusal naming `field`.
    async fn file_op(
        &self,
        id: &str,
        path: &str,
        dir: bool,
        field: &str,
        request: impl FnOnce(u64) -> Request,
        body: bytes::Bytes,
    ) -> Result<Reply, ServiceError> {
        let s = self.session(id)?;
        s.touch();
        if !(dir && (path.is_empty() || path == ".")) {
            proto::check_path(path).map_err(|e| ServiceError::invalid("path", path, e))?;
        }
        let rid = s.conn.id();
        file_reply(&s, field, s.conn.call(request(rid), body).await)
    }

    /// `PUT /v1/sandboxes/{id}/files/{path}`. The write, and the memory held for it, are a
    /// task's of their own: a client that walks away leaves the write to finish with its room
    /// held (dropped with the request, the room went back while the agent still wrote, and an
    /// exec started meanwhile was given it; found by an independent attack).
    pub async fn put_file(
        &self,
        id: &str,
        path: &str,
        data: bytes::Bytes,
        held: Charge,
    ) -> Result<(), ServiceError> {
        let (svc, id, path) = (self.clone(), id.to_owned(), path.to_owned());
        // The bytes stay counted (`held`, the body's) until the agent has them, with the task.
        own_task("a file's write", async move {
            let r = svc.put_file_held(&id, &path, data).await;
            drop(held);
            r
        })
        .await
    }

    async fn put_file_held(
        &self,
        id: &str,
        path: &str,
        data: bytes::Bytes,
    ) -> Result<(), ServiceError> {
        let write = |id| Request::Write {
            id,
            path: path.into(),
            mode: 0o644,
        };
        let cost = crate::archive::file_cost(path, data.len() as u64);
        let _room = self.session(id)?.reserve_memory(cost, "path").await?;
        self.file_op(id, path, false, "path", write, data)
            .await
            .map(|_| ())
    }

    /// `GET /v1/sandboxes/{id}/files/{path}`.
    /// The file holds its bytes against the server's budget (see [`crate::budget`]).
    pub async fn get_file(&self, id: &str, path: &str) -> Result<Charged<Vec<u8>>, ServiceError> {
        self.inner.held.admit()?;
        let max = self.inner.config.max_fetch_bytes;
        let read = |id| Request::Read {
            id,
            path: path.into(),
            max,
            offset: 0,
            len: None,
        };
        self.file_op(id, path, false, "path", read, bytes::Bytes::new())
            .await
            .map(|r| match r {
                Reply::Ok { data, held, .. } => Charged::new(data, held),
                Reply::Err { .. } | Reply::Full => Charged::new(Vec::new(), Charge::default()),
            })
    }

    /// `GET /v1/sandboxes/{id}/files/{path}`, streamed: the file's bytes in `range` (all of them
    /// by default), read by the agent a piece at a time ([`FileStream`]), each piece asked for
    /// when the one before it has been taken, so that a download of any size holds one piece.
    /// The first piece is read here: a file that cannot be read (missing, a link, not a regular
    /// file) is this call's error, before anything is sent.
    pub async fn open_file(
        &self,
        id: &str,
        path: &str,
        range: FileRange,
    ) -> Result<FileStream, ServiceError> {
        self.inner.held.admit()?;
        let piece = self.inner.config.max_fetch_bytes.clamp(1, STREAM_PIECE);
        let (offset, len) = match range {
            FileRange::All => (0, piece),
            FileRange::From { start, last } => (
                start,
                last.map_or(piece, |l| {
                    (l.saturating_sub(start).saturating_add(1)).min(piece)
                }),
            ),
            // The size first, to know where the suffix starts.
            FileRange::Last(_) => (0, 0),
        };
        let (data, held, file) = self.read_piece(id, path, offset, len).await?;
        let size = file.size;
        let (start, end) = match range {
            FileRange::All => (0, size),
            FileRange::From { start, last } => {
                (start, last.map_or(size, |l| l.saturating_add(1).min(size)))
            }
            FileRange::Last(n) => (size - n.min(size), size),
        };
        let first = (!matches!(range, FileRange::Last(_)))
            .then(|| Charged::new(data, held))
            .filter(|_| start < size);
        Ok(FileStream {
            svc: self.clone(),
            id: id.to_owned(),
            path: path.to_owned(),
            file,
            start,
            end: end.max(start),
            pos: start,
            piece,
            first,
        })
    }

    /// One piece of a streamed read: at most `len` bytes of `path` from `offset`, and which file
    /// it was.
    async fn read_piece(
        &self,
        id: &str,
        path: &str,
        offset: u64,
        len: u64,
    ) -> Result<(Vec<u8>, Charge, proto::FileId), ServiceError> {
        let read = |id| Request::Read {
            id,
            path: path.into(),
            max: u64::MAX,
            offset,
            len: Some(len),
        };
        match self
            .file_op(id, path, false, "path", read, bytes::Bytes::new())
            .await?
        {
            Reply::Ok {
                data,
                held,
                file: Some(file),
                ..
            } if data.len() as u64 <= len => Ok((data, held, file)),
            _ => Err(ServiceError::internal(format!(
                "the agent of {id} answered a read of `{}` out of protocol",
                crate::shorten(path, 200)
            ))),
        }
    }

    /// `GET /v1/sandboxes/{id}/files?path=DIR`.
    pub async fn list_files(&self, id: &str, path: &str) -> Result<api::Listing, ServiceError> {
        let list = |id| Request::List {
            id,
            path: path.into(),
        };
        self.file_op(id, path, true, "path", list, bytes::Bytes::new())
            .await
            .map(|r| match r {
                Reply::Ok {
                    entries, truncated, ..
                } => api::Listing {
                    path: path.into(),
                    entries,
                    truncated,
                },
                Reply::Err { .. } | Reply::Full => api::Listing {
                    path: path.into(),
                    entries: Vec::new(),
                    truncated: false,
                },
            })
    }

    /// `DELETE /v1/sandboxes/{id}/files/{path}`.
    pub async fn remove_file(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), ServiceError> {
        let remove = |id| Request::Remove {
            id,
            path: path.into(),
            recursive,
        };
        // Nothing held; as it is dropped, after the removal, the execs' ceiling is set again
        // for what the removed files gave back.
        let _refresh = self.session(id)?.reserve_memory(0, "path").await?;
        self.file_op(id, path, false, "path", remove, bytes::Bytes::new())
            .await
            .map(|_| ())
    }

    /// `GET /v1/sandboxes/{id}/archive?path=DIR`: a tar of the directory's regular files and
    /// directories, made inside a piece at a time ([`ArchiveStream`]); the count of entries
    /// skipped (links, fifos, sockets, devices) comes with its last piece. The first piece, up to
    /// `--max-fetch` bytes, is made here: a directory that cannot be archived is this call's
    /// error, and an archive no larger than that is whole before anything is sent.
    ///
    /// `strict`: an entry that would be skipped fails the archive instead (`400` `not-regular`
    /// before anything is sent, else the body cut short), for a caller to whom an archive
    /// without them would be a silent loss.
    pub async fn open_archive(
        &self,
        id: &str,
        path: &str,
        strict: bool,
        max_bytes: Option<u64>,
    ) -> Result<ArchiveStream, ServiceError> {
        self.inner.held.admit()?;
        let len = self.inner.config.max_fetch_bytes.max(1);
        // Closed in the agent if this ends before the archive does, here or later: the walk
        // holds descriptors of the session's.
        let mut walk = Walk {
            svc: self.clone(),
            id: id.to_owned(),
            cursor: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            open: true,
        };
        let cursor = walk.cursor.clone();
        let tar_out = |rid| {
            cursor.store(rid, std::sync::atomic::Ordering::Relaxed);
            Request::TarOut {
                id: rid,
                path: path.into(),
                len,
                strict,
                max: max_bytes.unwrap_or(len),
            }
        };
        let (data, skipped, held) = match self
            .file_op(id, path, true, "path", tar_out, bytes::Bytes::new())
            .await?
        {
            Reply::Ok {
                data,
                skipped,
                held,
                ..
            } if data.len() as u64 <= len && (skipped.is_some() || !data.is_empty()) => {
                (data, skipped, held)
            }
            _ => {
                return Err(ServiceError::internal(format!(
                    "the agent of {id} answered an archive of `{}` out of protocol",
                    crate::shorten(path, 200)
                )))
            }
        };
        walk.open = skipped.is_none();
        Ok(ArchiveStream {
            walk,
            piece: len.min(STREAM_PIECE),
            first: Some(Charged::new(data, held)),
            skipped,
            failed: false,
        })
    }

    /// `PUT /v1/sandboxes/{id}/archive?path=DIR`: unpacks a tar under the directory, inside;
    /// only regular files and directories, with relative names (checked whole here first,
    /// [`crate::archive`]; the agent unpacks it as it reads it). A task's of its own, as
    /// [`Service::put_file`].
    pub async fn put_archive(
        &self,
        id: &str,
        path: &str,
        tar: bytes::Bytes,
        held: Charge,
    ) -> Result<(), ServiceError> {
        let (svc, id, path) = (self.clone(), id.to_owned(), path.to_owned());
        own_task("an archive's write", async move {
            let r = svc.put_archive_held(&id, &path, tar).await;
            drop(held);
            r
        })
        .await
    }

    async fn put_archive_held(
        &self,
        id: &str,
        path: &str,
        tar: bytes::Bytes,
    ) -> Result<(), ServiceError> {
        let s = self.session(id)?;
        let content =
            crate::archive::check(&tar).map_err(|r| ServiceError::file("archive", r.0, &r.1))?;
        let _room = s.reserve_memory(content, "archive").await?;
        let tar_in = |id| Request::TarIn {
            id,
            path: path.into(),
        };
        self.file_op(id, path, true, "archive", tar_in, tar)
            .await
            .map(|_| ())
    }
}

/// Runs `work` in a task of its own, which a caller that is gone does not cancel.
async fn own_task<T: Send + 'static>(
    what: &str,
    work: impl std::future::Future<Output = Result<T, ServiceError>> + Send + 'static,
) -> Result<T, ServiceError> {
    tokio::spawn(work)
        .await
        .map_err(|e| ServiceError::internal(format!("{what}: {e}")))?
}

fn file_reply(
    s: &Session,
    field: &str,
    r: Result<Reply, crate::client::Lost>,
) -> Result<Reply, ServiceError> {
    match r {
        // Its pieces did not fit in the server's budget of bytes held (`AgentConn`).
        Ok(Reply::Full) => {
            let b = s.conn.held();
            Err(ServiceError::held_full(b.held(), b.limit()))
        }
        Ok(Reply::Err { code, message }) => Err(ServiceError::file(field, &code, &message)),
        Ok(ok) => Ok(ok),
        Err(e) => Err(ServiceError::gone(
            &s.id,
            &format!("its agent is gone ({})", e.0),
        )),
    }
}

/// Kills the sandbox and closes the agent; returns its report. The kill comes first: closing
/// waits for the connection's writer, which a call to an agent that stopped reading may hold
/// until the sandbox is gone.
async fn teardown(s: &Session) -> Option<serde_json::Value> {
    let held = s.held.lock().await.take()?;
    held.kill();
    s.conn.close().await;
    let out = held.finish().await;
    serde_json::to_value(&out.report).ok()
}

/// Most bytes of a streamed file read by the agent at once (fewer when `--max-fetch` is less).
pub const STREAM_PIECE: u64 = 1 << 20;

/// The agent's walk of an archive ([`Service::open_archive`]), closed there when dropped
/// before the agent said the archive ended, whatever ended it here: its client gone (also while
/// the first piece was made), a piece refused for the budget, an error. (Closing one the agent
/// has let go already does nothing.)
struct Walk {
    svc: Service,
    id: String,
    /// The id of the request that opened it, once sent.
    cursor: Arc<std::sync::atomic::AtomicU64>,
    open: bool,
}

impl Drop for Walk {
    fn drop(&mut self) {
        let cursor = self.cursor.load(std::sync::atomic::Ordering::Relaxed);
        if !self.open || cursor == 0 {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (svc, id) = (self.svc.clone(), std::mem::take(&mut self.id));
        rt.spawn(async move {
            let close = |rid| Request::TarDrop { id: rid, cursor };
            let _ = svc
                .file_op(&id, "", true, "path", close, bytes::Bytes::new())
                .await;
        });
    }
}

/// A session's directory on its way out as a tar archive ([`Service::open_archive`]): the agent
/// keeps the walk between pieces, and makes the next when the one before it has been taken.
pub struct ArchiveStream {
    walk: Walk,
    piece: u64,
    first: Option<Charged<Vec<u8>>>,
    /// Set once the agent has said the archive ended: the entries skipped.
    skipped: Option<u64>,
    /// A piece failed: nothing more comes.
    failed: bool,
}

impl ArchiveStream {
    /// Whether the first piece is the whole archive (its end came with it).
    pub fn whole(&self) -> bool {
        self.skipped.is_some()
    }

    /// The entries skipped (links, fifos, sockets, devices, names that are not UTF-8), once the
    /// archive's end has come.
    pub fn skipped(&self) -> Option<u64> {
        self.skipped
    }

    /// The next piece, counted against the server's budget; `None` after the last. A file that
    /// shrank while it was read is an error (its header promised more), as are an archive past
    /// its `max_bytes` and the walk dropped by the agent (see [`proto::Request::TarOut`]).
    pub async fn next(&mut self) -> Option<Result<Charged<Vec<u8>>, ServiceError>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        if self.skipped.is_some() || self.failed {
            return None;
        }
        let (cursor, len) = (
            self.walk.cursor.load(std::sync::atomic::Ordering::Relaxed),
            self.piece,
        );
        let more = |rid| Request::TarMore {
            id: rid,
            cursor,
            len,
        };
        let r = self
            .walk
            .svc
            .file_op(&self.walk.id, "", true, "path", more, bytes::Bytes::new())
            .await;
        Some(match r {
            // A piece is never empty before the end: the agent makes at least a byte or ends.
            Ok(Reply::Ok {
                data,
                skipped,
                held,
                ..
            }) if data.len() as u64 <= len && (skipped.is_some() || !data.is_empty()) => {
                self.skipped = skipped;
                self.walk.open = skipped.is_none();
                Ok(Charged::new(data, held))
            }
            Ok(_) => {
                self.failed = true;
                Err(ServiceError::internal(format!(
                    "the agent of {} answered a piece of an archive out of protocol",
                    self.walk.id
                )))
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        })
    }
}

/// Which bytes of a file to stream (HTTP's `Range: bytes=...`, one range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRange {
    /// The whole file.
    All,
    /// From `start`, to `last` included (to the end: `None`).
    From { start: u64, last: Option<u64> },
    /// The last `n` bytes.
    Last(u64),
}

/// A file of a session on its way out ([`Service::open_file`]).
pub struct FileStream {
    svc: Service,
    id: String,
    path: String,
    file: proto::FileId,
    start: u64,
    end: u64,
    pos: u64,
    piece: u64,
    first: Option<Charged<Vec<u8>>>,
}

impl FileStream {
    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.file.size
    }

    /// The bytes that will be sent, `start..end`; `start >= size()` when a range asked for
    /// none that the file has (and nothing will be sent).
    pub fn span(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// The next piece, each counted against the server's budget; `None` after the last. A file
    /// replaced by another, written in place, or shrunk below what was promised is an error: the
    /// bytes still to send would not be of the file the first ones came from.
    pub async fn next(&mut self) -> Option<Result<Charged<Vec<u8>>, ServiceError>> {
        if let Some(first) = self.first.take() {
            let n = (first.len() as u64).min(self.end - self.pos);
            let (mut data, held) = first.into_parts();
            data.truncate(n as usize);
            self.pos += n;
            return Some(Ok(Charged::new(data, held)));
        }
        if self.pos >= self.end {
            return None;
        }
        let len = (self.end - self.pos).min(self.piece);
        let r = self
            .svc
            .read_piece(&self.id, &self.path, self.pos, len)
            .await;
        Some(r.and_then(|(data, held, file)| {
            let shown = crate::shorten(&self.path, 200);
            let changed = |how: String| {
                Err(ServiceError::conflict(
                    "path",
                    format!("`{shown}` {how} while it was read"),
                ))
            };
            if (file.dev, file.ino) != (self.file.dev, self.file.ino) {
                return changed("was replaced by another file".into());
            }
            if data.is_empty() || file.size < self.end {
                return changed(format!(
                    "shrank to {} bytes ({} promised)",
                    file.size, self.file.size
                ));
            }
            // Written in place (`> f` truncates and writes the same inode): what is left to
            // send is not of the file the first pieces came from.
            if file != self.file {
                return changed("was written".into());
            }
            self.pos += data.len() as u64;
            Ok(Charged::new(data, held))
        }))
    }

    /// A strong entity tag of the file as it was opened (device, inode, size, modification and
    /// change times): another for any change a later piece would notice, so that a client that
    /// resumes with `If-Range` gets the whole file again rather than pieces of two.
    pub fn etag(&self) -> String {
        let f = &self.file;
        format!(
            "\"{:x}-{:x}-{:x}-{:x}.{:x}-{:x}.{:x}\"",
            f.dev, f.ino, f.size, f.mtime[0], f.mtime[1], f.ctime[0], f.ctime[1]
        )
    }
}
