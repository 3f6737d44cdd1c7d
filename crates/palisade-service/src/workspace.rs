//! Workspaces over the API (docs/workspace.md, "A server and the SDK"): a session opened on a host
//! directory sees it at `/workspace` through palisade's copy-on-write overlay; when the session
//! ends its changes are kept as a change set, which the client reviews and applies through the
//! API.
//!
//! **What a client may name.** Only directories at or under the roots the operator gave
//! (`palisade serve --workspace-root DIR`, [`Workspaces::new`]); with none, every request that
//! names a workspace is refused. A root is made canonical and opened once at start-up; a requested
//! path must be absolute, without `.`, `..` or empty components, lexically under a root, and is
//! then walked from the root's descriptor one component at a time without following a symbolic
//! link (`O_NOFOLLOW`, each step checked to be a directory): a link anywhere on the way, a
//! missing component or a file is refused, and nothing is started. A root may not hold the
//! change-set store (a client could then see every change set), nor overlap a writable bind of
//! the server's policy (a sandbox could then plant links under it).
//!
//! **What a client may touch.** Change sets made by this server's sessions, and only those: the
//! service keeps a registry of them (id → session, root, directory with its device and inode),
//! and an id it does not hold is `not-found`, whatever the store holds (the store may be the
//! user's own, shared with `palisade run`). A change set is registered only if it was made from
//! the directory admitted for its session (same path, device and inode); an apply re-walks that
//! directory from its root's descriptor and checks it is still the same directory before the
//! library applies (which checks it once more, and everything else: `ChangeSet::apply`).
//!
//! **What it does not do.** The registry lives in memory: after a restart the server knows none
//! of the change sets its sessions left (they are still in the store, for `palisade changes`).
//! The sandbox's backend resolves the admitted path again when it mounts the overlay; a root in
//! which someone other than the operator can create links could swap a directory for a link in
//! between (the change set is then not registered, but the session saw the other directory, read
//! only): give roots that only the operator writes.

use crate::api;
use crate::error::ServiceError;
use crate::Service;
use palisade::policy::Policy;
use palisade::workspace::{
    decode_path, encode_path, ApplyOptions, ChangeSet, Store, WorkspaceError,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A directory under which clients may open workspaces, opened at start-up.
#[derive(Debug)]
struct Root {
    /// Canonical.
    path: PathBuf,
    fd: OwnedFd,
}

/// The roots clients may open workspaces under, and where their change sets are kept.
#[derive(Debug, Clone)]
pub struct Workspaces {
    roots: Arc<Vec<Root>>,
    store: Store,
}

/// A workspace directory a request named, checked to be a real directory under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// Canonical: the root's path and the components walked.
    pub path: PathBuf,
    /// Index of its root.
    root: usize,
    dev: u64,
    ino: u64,
}

fn is_dir(st: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}

fn dev_ino(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// `p` with its longest existing ancestor made canonical and the rest appended.
fn full_canonical(p: &Path) -> PathBuf {
    let mut at = p.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(c) = at.canonicalize() {
            return rest.iter().rev().fold(c, |acc, r| acc.join(r));
        }
        match at.file_name() {
            Some(n) => rest.push(n.to_owned()),
            None => return p.to_path_buf(),
        }
        if !at.pop() {
            return p.to_path_buf();
        }
    }
}

/// Whether `a` is `b` or under it, by whole components.
fn within(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

impl Workspaces {
    /// Opens each root (an absolute path of an existing directory, made canonical; not `/`), and
    /// checks that none holds `store` or lies in it, nor overlaps a writable bind of `policy` (the
    /// server's): a sandbox that can write under a root could plant links there.
    pub fn new(roots: &[PathBuf], store: Store, policy: &Policy) -> Result<Workspaces, String> {
        let mut out: Vec<Root> = Vec::new();
        for r in roots {
            let shown = r.display();
            if !r.is_absolute() {
                return Err(format!(
                    "--workspace-root {shown}: give an absolute path of a directory"
                ));
            }
            let path = r
                .canonicalize()
                .map_err(|e| format!("--workspace-root {shown}: {e}"))?;
            if path == Path::new("/") {
                return Err(format!("--workspace-root {shown}: not the whole file system; name the directories the projects are in"));
            }
            let fd = rustix::fs::open(
                &path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("--workspace-root {shown}: {}", std::io::Error::from(e)))?;
            let store_canon = full_canonical(store.path());
            if within(&store_canon, &path) || within(&path, &store_canon) {
                return Err(format!(
                    "--workspace-root {shown}: the change-set store {} is at or under it (a client could open a workspace that shows every change set); keep the store elsewhere (PALISADE_CHANGES_DIR)",
                    store.path().display()
                ));
            }
            for b in policy.binds.iter().filter(|b| b.writable) {
                let src = b.source.canonicalize().unwrap_or_else(|_| b.source.clone());
                if within(&src, &path) || within(&path, &src) {
                    return Err(format!(
                        "--workspace-root {shown}: the server policy's writable bind {} overlaps it, so a sandbox could plant links under it; give a root no sandbox can write",
                        b.source.display()
                    ));
                }
            }
            if !out.iter().any(|o| o.path == path) {
                out.push(Root { path, fd });
            }
        }
        Ok(Workspaces {
            roots: Arc::new(out),
            store,
        })
    }

    /// The roots, canonical.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.roots.iter().map(|r| r.path.clone()).collect()
    }

    /// Where change sets are kept.
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn roots_shown(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks the workspace a request names (`field`): see the module documentation.
    pub(crate) fn admit(&self, ask: &str, field: &str) -> Result<Admitted, ServiceError> {
        let form = || {
            ServiceError::invalid(
                field,
                ask,
                "an absolute path of a host directory, without `.`, `..` or empty components",
            )
        };
        let rest = ask.strip_prefix('/').ok_or_else(form)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if ask.contains('\0') {
            return Err(form());
        }
        let comps: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        if comps
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == "..")
        {
            return Err(form());
        }
        let asked = Path::new(ask);
        // The deepest root it is under, and the components below that root.
        let (ri, root) = self
            .roots
            .iter()
            .enumerate()
            .filter(|(_, r)| within(asked, &r.path))
            .max_by_key(|(_, r)| r.path.as_os_str().len())
            .ok_or_else(|| {
                ServiceError::not_allowed(
                    field,
                    ask,
                    format!(
                        "a directory at or under one of the server's workspace roots: {}",
                        self.roots_shown()
                    ),
                )
            })?;
        let below = root.path.components().count() - 1;
        let mut cur: OwnedFd = rustix::fs::openat(
            root.fd.as_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ServiceError::internal(format!("the workspace root: {e}")))?;
        let mut path = root.path.clone();
        for c in comps.iter().skip(below) {
            path.push(c);
            let st = rustix::fs::statat(cur.as_fd(), *c, AtFlags::SYMLINK_NOFOLLOW).map_err(
                |e| match e {
                    rustix::io::Errno::NOENT => ServiceError::invalid(
                        field,
                        ask,
                        format!(
                            "an existing directory (`{}` does not exist)",
                            path.display()
                        ),
                    ),
                    rustix::io::Errno::ACCESS => ServiceError::not_allowed(
                        field,
                        ask,
                        format!(
                            "a directory the server can open (`{}`: permission denied)",
                            path.display()
                        ),
                    ),
                    e => ServiceError::internal(format!("{}: {e}", path.display())),
                },
            )?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {}
                FileType::Symlink => {
                    return Err(ServiceError::not_allowed(
                        field,
                        ask,
                        format!(
                            "a real directory under {}: `{}` is a symbolic link, which is never followed",
                            root.path.display(),
                            path.display()
                        ),
                    ))
                }
                _ => {
                    return Err(ServiceError::invalid(
                        field,
                        ask,
                        format!("a directory (`{}` is not one)", path.display()),
                    ))
                }
            }
            let next = rustix::fs::openat(
                cur.as_fd(),
                *c,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                ServiceError::conflict(
                    field,
                    format!("{} changed while it was checked: {e}", path.display()),
                )
            })?;
            let now = rustix::fs::fstat(next.as_fd())
                .map_err(|e| ServiceError::internal(format!("{}: {e}", path.display())))?;
            if !is_dir(&now) || dev_ino(&now) != dev_ino(&st) {
                return Err(ServiceError::conflict(
                    field,
                    format!("{} changed while it was checked", path.display()),
                ));
            }
            cur = next;
        }
        let st = rustix::fs::fstat(cur.as_fd())
            .map_err(|e| ServiceError::internal(format!("{}: {e}", path.display())))?;
        let (dev, ino) = dev_ino(&st);
        Ok(Admitted {
            path,
            root: ri,
            dev,
            ino,
        })
    }

    /// Whether `a` is still the directory admitted: walked again from its root.
    fn still(&self, a: &Admitted) -> Result<(), String> {
        let again = self
            .admit(&a.path.display().to_string(), "workspace")
            .map_err(|e| e.message)?;
        if again.root != a.root || (again.dev, again.ino) != (a.dev, a.ino) {
            return Err(format!(
                "{} is no longer the directory the session was opened on",
                a.path.display()
            ));
        }
        Ok(())
    }
}

/// A change set this server's session left.
#[derive(Debug, Clone)]
struct Record {
    session: String,
    ws: Admitted,
}

/// The change sets of this server's sessions (the latest [`KEPT`]).
#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<String, Record>>,
    order: Mutex<VecDeque<String>>,
    /// Workspace sessions that ended and whose change set is being kept.
    pending: Mutex<std::collections::HashSet<String>>,
    kept: tokio::sync::Notify,
}

/// How many change sets the registry remembers (the store's retention removes them sooner by
/// default: 50).
const KEPT: usize = 4096;

impl Registry {
    /// The workspace session `id` ended: its change set is on its way.
    pub(crate) fn ending(&self, id: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned());
    }

    /// Its change set is kept (or there is none).
    pub(crate) fn ended(&self, id: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.kept.notify_waiters();
    }

    /// Waits until the change sets of the sessions that had ended by now are kept.
    async fn settled(&self) {
        let waiting: Vec<String> = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        loop {
            let n = self.kept.notified();
            let left = {
                let p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                waiting.iter().any(|w| p.contains(w))
            };
            if !left {
                return;
            }
            // A missed wake-up costs a second at most.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), n).await;
        }
    }

    fn get(&self, id: &str) -> Option<Record> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn forget(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| x != id);
    }
}

fn error(id: &str, e: WorkspaceError) -> ServiceError {
    match e {
        WorkspaceError::Unknown { .. } | WorkspaceError::BadId { .. } => {
            let mut err = ServiceError::not_found("change_set", id);
            err.message = format!(
                "no change set `{}`: it was discarded, or removed by the store's retention limits",
                crate::shorten(id, 80)
            );
            err
        }
        WorkspaceError::Busy { .. } | WorkspaceError::BaseMoved { .. } => {
            ServiceError::conflict("change_set", e.to_string())
        }
        WorkspaceError::Held { count, held, .. } => {
            let mut err = ServiceError::conflict(
                "change_set",
                format!(
                    "nothing was applied: {count} change(s) held back (see `held`): refused ones never apply; name protected and risky paths (or include_risky); force for conflicts"
                ),
            );
            err.code = "held";
            err.held_count = Some(count as u64);
            err.held = held
                .into_iter()
                .map(|h| api::HeldChange {
                    path: h.path,
                    kind: serde_json::to_value(h.kind)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    reason: h.reason,
                })
                .collect();
            err
        }
        WorkspaceError::NoSuchPath { path, .. } => ServiceError::invalid(
            "paths",
            path,
            "paths the change set changes, or directories above them, in the form `changes` shows",
        ),
        other => ServiceError::internal(other.to_string()),
    }
}

/// A path given to diff or apply, in the change set's form: relative, no `./`, no trailing `/`.
fn arg_path(p: &str, field: &str) -> Result<String, ServiceError> {
    let t = p.trim_start_matches("./").trim_end_matches('/');
    if decode_path(t).is_none() {
        return Err(ServiceError::invalid(
            field,
            p,
            "a relative path in the form `changes` shows (`\\\\` for a backslash, `\\xNN` for a byte that is not UTF-8)",
        ));
    }
    Ok(t.to_owned())
}

fn arg_paths(ps: &[String], field: &str) -> Result<Vec<String>, ServiceError> {
    ps.iter()
        .enumerate()
        .map(|(i, p)| arg_path(p, &format!("{field}[{i}]")))
        .collect()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, ServiceError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ServiceError::internal(format!("a change-set task: {e}"))))
}

/// A bounded writer: past `max` bytes, an error.
struct Capped {
    buf: Vec<u8>,
    max: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "the diff is over the server's --max-fetch",
            ));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Service {
    fn workspaces(&self) -> Option<&Workspaces> {
        self.inner.config.ceiling.workspaces()
    }

    /// Records the change set a workspace session left (its id from the session's final
    /// report), if it was made from the directory admitted for the session. Returns the id.
    pub(crate) async fn register_change_set(
        &self,
        session: &str,
        ws: &Admitted,
        report: Option<&serde_json::Value>,
    ) -> Option<String> {
        let w = report?.get("workspace")?;
        if let Some(e) = w.get("error").and_then(|e| e.as_str()) {
            tracing::warn!(session, error = %crate::shorten(e, 300), "the workspace's changes could not be kept");
        }
        let id = w.get("change_set")?.as_str()?.to_owned();
        let wss = self.workspaces()?.clone();
        let (id2, ws2) = (id.clone(), ws.clone());
        let ok = blocking(move || {
            let cs = wss.store.get(&id2).map_err(|e| error(&id2, e))?;
            let m = cs.meta();
            let same = decode_path(&m.dir).as_deref() == Some(ws2.path.as_os_str().as_bytes())
                && (m.dir_dev, m.dir_ino) == (ws2.dev, ws2.ino);
            Ok(same)
        })
        .await;
        match ok {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(session, change_set = %id, "the change set is not of the directory admitted for the session; not registered");
                return None;
            }
            Err(e) => {
                tracing::warn!(session, change_set = %id, error = %e.message, "the change set cannot be read; not registered");
                return None;
            }
        }
        let reg = &self.inner.change_sets;
        reg.map.lock().unwrap_or_else(|p| p.into_inner()).insert(
            id.clone(),
            Record {
                session: session.to_owned(),
                ws: ws.clone(),
            },
        );
        let mut order = reg.order.lock().unwrap_or_else(|p| p.into_inner());
        order.push_back(id.clone());
        while order.len() > KEPT {
            if let Some(old) = order.pop_front() {
                reg.map
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&old);
            }
        }
        tracing::info!(session, change_set = %id, "workspace change set kept");
        Some(id)
    }

    /// The registered change set `id`, opened.
    fn open_change_set(&self, id: &str) -> Result<(Workspaces, Record, ChangeSet), ServiceError> {
        let rec = self
            .inner
            .change_sets
            .get(id)
            .ok_or_else(|| {
                let mut e = ServiceError::not_found("change_set", id);
                e.message = format!(
                    "no change set `{}` of this server (only those its own sessions left, since it started)",
                    crate::shorten(id, 80)
                );
                e
            })?;
        let wss = self
            .workspaces()
            .cloned()
            .ok_or_else(|| ServiceError::internal("no workspace store"))?;
        let cs = wss.store.get(id).map_err(|e| error(id, e))?;
        Ok((wss, rec, cs))
    }

    fn change_set_info(rec: &Record, cs: &ChangeSet) -> api::ChangeSetInfo {
        let m = cs.meta();
        api::ChangeSetInfo {
            id: m.id.clone(),
            session: rec.session.clone(),
            dir: m.dir.clone(),
            created: m.created,
            bytes: m.data_bytes,
            run: serde_json::to_value(&m.run).unwrap_or_default(),
            summary: serde_json::to_value(&m.summary).unwrap_or_default(),
            incomplete: m.incomplete.clone(),
            applied: m
                .applied
                .as_ref()
                .and_then(|a| serde_json::to_value(a).ok()),
        }
    }

    /// `GET /v1/changes`: the change sets this server's sessions left, oldest first (those the
    /// store still holds). Sessions that ended before the call are in it: it waits while their
    /// change sets are being kept.
    pub async fn list_change_sets(&self) -> Result<Vec<api::ChangeSetInfo>, ServiceError> {
        self.inner.change_sets.settled().await;
        let ids: Vec<String> = self
            .inner
            .change_sets
            .order
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let svc = self.clone();
        blocking(move || {
            Ok(ids
                .iter()
                .filter_map(|id| svc.open_change_set(id).ok())
                .map(|(_, rec, cs)| Service::change_set_info(&rec, &cs))
                .collect())
        })
        .await
    }

    /// `GET /v1/changes/{id}`: what `palisade changes ID --json` prints, in chunks (the entries
    /// are read one at a time: memory stays flat whatever the change set's size). An error past
    /// the first chunk ends the stream early.
    pub async fn change_set_json(
        &self,
        id: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>, ServiceError>>, ServiceError> {
        let svc = self.clone();
        let id = id.to_owned();
        let (wss, rec, cs) = {
            let id = id.clone();
            blocking(move || svc.open_change_set(&id)).await?
        };
        let _ = (wss, rec);
        let head = format!(
            "{{\"change_set\":{},\"entries\":[",
            serde_json::to_string(cs.meta()).map_err(|e| ServiceError::internal(e.to_string()))?
        );
        let entries = cs.entries().map_err(|e| error(&id, e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::task::spawn_blocking(move || {
            if tx.blocking_send(Ok(head.into_bytes())).is_err() {
                return;
            }
            let mut chunk = Vec::with_capacity(64 << 10);
            for (i, e) in entries.enumerate() {
                let e = match e {
                    Ok(e) => e,
                    Err(x) => {
                        let _ = tx.blocking_send(Err(error(&id, x)));
                        return;
                    }
                };
                if i > 0 {
                    chunk.push(b',');
                }
                if serde_json::to_writer(&mut chunk, &e).is_err() {
                    return;
                }
                if chunk.len() >= 60 << 10
                    && tx.blocking_send(Ok(std::mem::take(&mut chunk))).is_err()
                {
                    return;
                }
            }
            chunk.extend_from_slice(b"]}\n");
            let _ = tx.blocking_send(Ok(chunk));
        });
        Ok(rx)
    }

    /// `POST /v1/changes/{id}/diff`: the unified diff (git's format), at most `--max-fetch` bytes.
    pub async fn change_set_diff(
        &self,
        id: &str,
        req: api::DiffRequest,
    ) -> Result<crate::budget::Charged<api::DiffResult>, ServiceError> {
        let paths = arg_paths(&req.paths, "paths")?;
        let max = self.inner.config.max_fetch_bytes as usize;
        // Room for the largest diff first: diffs at once cannot make more than the budget.
        let mut held = self
            .inner
            .held
            .reserve((max as u64).min(self.inner.held.limit()))?;
        let svc = self.clone();
        let id = id.to_owned();
        let r = blocking(move || {
            let (_, _, cs) = svc.open_change_set(&id)?;
            let mut w = Capped {
                buf: Vec::new(),
                max,
            };
            let out = cs.diff(&paths, &mut w).map_err(|e| {
                if w.buf.len() + 1 >= max || matches!(&e, WorkspaceError::Damaged { what, .. } if what.contains("--max-fetch"))
                {
                    ServiceError::invalid(
                        "paths",
                        format!("{} path(s)", paths.len()),
                        format!("a diff of at most {max} bytes (the server's --max-fetch): name fewer paths"),
                    )
                } else {
                    error(&id, e)
                }
            })?;
            Ok(api::DiffResult {
                diff: api::Data::new(w.buf, false),
                files: out.files,
                binary: out.binary,
                warnings: out.warnings,
            })
        })
        .await?;
        held.set(r.diff.data.len() as u64);
        Ok(crate::budget::Charged::new(r, held))
    }

    /// `POST /v1/changes/{id}/apply`: applies all of it or the paths named, into the directory the
    /// session was opened on, once that is checked to be the same directory under its root.
    pub async fn apply_change_set(
        &self,
        id: &str,
        req: api::ApplyRequest,
    ) -> Result<api::AppliedResult, ServiceError> {
        let o = ApplyOptions {
            paths: arg_paths(&req.paths, "paths")?,
            exclude: arg_paths(&req.exclude, "exclude")?,
            force: req.force,
            include_risky: req.include_risky,
        };
        let svc = self.clone();
        let id = id.to_owned();
        blocking(move || {
            let (wss, rec, cs) = svc.open_change_set(&id)?;
            wss.still(&rec.ws)
                .map_err(|why| ServiceError::conflict("change_set", format!("nothing was applied: {why}")))?;
            let a = cs.apply(&o).map_err(|e| error(&id, e))?;
            tracing::info!(change_set = %id, entries = a.entries, bytes = a.bytes, "change set applied");
            Ok(api::AppliedResult {
                id: id.clone(),
                dir: encode_path(rec.ws.path.as_os_str().as_bytes()),
                entries: a.entries,
                bytes: a.bytes,
                first_paths: a.first_paths,
            })
        })
        .await
    }

    /// `DELETE /v1/changes/{id}`: removes the change set from the store.
    pub async fn discard_change_set(&self, id: &str) -> Result<(), ServiceError> {
        let svc = self.clone();
        let id = id.to_owned();
        blocking(move || {
            let (wss, _, _) = svc.open_change_set(&id)?;
            wss.store.discard(&id).map_err(|e| error(&id, e))?;
            svc.inner.change_sets.forget(&id);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "palisade-svc-ws-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn a_request_names_only_real_directories_under_a_root() {
        let base = tmp("admit");
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("proj/sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link-out")).unwrap();
        std::os::unix::fs::symlink("proj", root.join("link-in")).unwrap();
        let store = Store::new(base.join("store"));
        let policy = Policy::new(["true"]).unwrap();
        let w = Workspaces::new(std::slice::from_ref(&root), store, &policy).unwrap();
        let ok = w
            .admit(&format!("{}/proj/sub", root.display()), "workspace")
            .unwrap();
        assert_eq!(ok.path, root.join("proj/sub"));
        assert!(w.admit(&root.display().to_string(), "workspace").is_ok());
        let cases: Vec<(String, &str, &str)> = vec![
            (
                outside.display().to_string(),
                "not-allowed",
                "workspace roots",
            ),
            (
                format!("{}/link-out", root.display()),
                "not-allowed",
                "symbolic link",
            ),
            (
                format!("{}/link-in/sub", root.display()),
                "not-allowed",
                "symbolic link",
            ),
            (
                format!("{}/proj/../proj", root.display()),
                "invalid",
                "`..`",
            ),
            (format!("{}/./proj", root.display()), "invalid", "`..`"),
            (format!("{}//proj", root.display()), "invalid", "empty"),
            ("relative/path".into(), "invalid", "absolute"),
            (format!("{}/file", root.display()), "invalid", "not one"),
            (
                format!("{}/missing", root.display()),
                "invalid",
                "does not exist",
            ),
            (
                format!("{}x", root.display()),
                "not-allowed",
                "workspace roots",
            ),
        ];
        for (ask, code, says) in cases {
            let e = w.admit(&ask, "workspace").unwrap_err();
            assert_eq!(
                (e.code, e.field.as_deref()),
                (code, Some("workspace")),
                "{ask}: {e:?}"
            );
            assert!(
                e.message.contains(says) || e.accepted.as_deref().unwrap_or("").contains(says),
                "{ask}: {e:?}"
            );
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_root_may_not_hold_the_store_nor_a_writable_bind() {
        let base = tmp("roots");
        let policy = Policy::new(["true"]).unwrap();
        let e = Workspaces::new(
            std::slice::from_ref(&base),
            Store::new(base.join("s")),
            &policy,
        )
        .unwrap_err();
        assert!(e.contains("change-set store"), "{e}");
        let e = Workspaces::new(&[base.join("nope")], Store::new("/nonexistent/s"), &policy)
            .unwrap_err();
        assert!(e.contains("--workspace-root"), "{e}");
        let e = Workspaces::new(&["/".into()], Store::new("/nonexistent/s"), &policy).unwrap_err();
        assert!(e.contains("whole file system"), "{e}");
        std::fs::create_dir_all(base.join("w/rw")).unwrap();
        let mut p = Policy::new(["true"]).unwrap();
        p.binds.push(
            palisade::policy::Bind::parse(&format!("{}:/data", base.join("w/rw").display()), true)
                .unwrap(),
        );
        let e = Workspaces::new(&[base.join("w")], Store::new("/nonexistent/s"), &p).unwrap_err();
        assert!(e.contains("writable bind"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
