//! Applying a change set to the project directory.
//!
//! Two passes over the entries. The first changes nothing: it checks every selected entry again
//! (its path, kind, mode and link target, where that link leads over the project as the apply
//! will leave it, its contents against their hash, protected and risky paths, and the project's
//! entry at that path against the state recorded when the change set was made) and refuses the whole apply if anything is held back. The second writes: each file or
//! link is made under a temporary name in its directory and renamed over its path (`renameat2`,
//! `RENAME_NOREPLACE` for a new path, `RENAME_EXCHANGE` where a directory is replaced), so a crash
//! leaves every path old or new; a new directory is filled under a temporary name and renamed into
//! place whole. Every directory is opened from the project's root one component at a time without
//! following links, so nothing is ever written outside the project.

use super::capture::changed_under;
use super::*;
use palisade_linux::fs::Rename;
use sha2::Digest;
use std::io::Write;

/// What to apply, and what to allow.
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Apply only these paths and what is under them (relative to the project; none: all).
    /// Naming a protected or risky path is what allows it.
    pub paths: Vec<String>,
    /// Leave these paths and what is under them out.
    pub exclude: Vec<String>,
    /// Overwrite what changed in the project since the run began.
    pub force: bool,
    /// Apply risky paths (files host tools run or load later) without naming each.
    pub include_risky: bool,
}

/// What an apply did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Applied {
    /// Entries applied.
    pub entries: u64,
    /// Bytes written.
    pub bytes: u64,
    /// The first paths applied (at most [`FIRST_PATHS`]).
    pub first_paths: Vec<String>,
}

/// Whether the options take an entry.
enum Pick {
    No,
    Yes,
    /// A new directory on the way to a named path: made, with only what is picked in it.
    Parent,
    /// On the way to a named path, but replaced as a whole: cannot be taken in part.
    Held(String),
}

fn pick(e: &Entry, o: &ApplyOptions) -> Pick {
    if o.exclude.iter().any(|x| is_under(&e.path, x)) {
        return Pick::No;
    }
    if o.paths.is_empty() || o.paths.iter().any(|p| is_under(&e.path, p)) {
        return Pick::Yes;
    }
    if e.kind == EntryKind::Dir && o.paths.iter().any(|p| is_under(p, &e.path)) {
        return match e.change {
            Change::Added => Pick::Parent,
            Change::Replaced => Pick::Held(format!(
                "the run replaced `{}` as a whole: name it to apply what is under it",
                e.path
            )),
            _ => Pick::No,
        };
    }
    Pick::No
}

/// Why `e` is held back under `o` (beyond conflicts), if it is.
fn hold(e: &Entry, o: &ApplyOptions, protected: &[String], parent: bool) -> Option<String> {
    let target = e.target.as_deref().map(decode_path);
    if let Some(None) = target {
        return Some("a link target that palisade did not write".into());
    }
    let why = refusal(
        &e.path,
        e.kind,
        e.mode.unwrap_or(0),
        target.clone().flatten().as_deref(),
    )
    .or_else(|| e.refused.clone());
    if let Some(r) = why {
        return Some(format!("refused: {r}"));
    }
    match (e.kind, e.change.clone()) {
        (EntryKind::File, c) if c != Change::Mode && (e.sha256.is_none() || e.offset.is_none()) => {
            return Some("refused: a file without contents in the change set".into());
        }
        (EntryKind::Symlink, _) if target.is_none() => {
            return Some("refused: a link without a target".into())
        }
        (EntryKind::None, Change::Deleted) => {}
        (EntryKind::None, _) => return Some("refused: an entry of no kind".into()),
        _ => {}
    }
    // Named: a path given is this entry or holds it, and lies in the zone itself; for a new
    // directory on the way to a named path, that path.
    let named_within = |zone: &dyn Fn(&str) -> bool| {
        o.paths.iter().any(|a| {
            let covers = is_under(&e.path, a) || (parent && is_under(a, &e.path));
            covers && zone(a.as_str())
        })
    };
    if let Some(p) = protected_by(&e.path, protected) {
        if !named_within(&|a| is_under(a, p)) {
            return Some(format!(
                "protected (`{p}`): applied only when named, e.g. `palisade apply ID {p}`"
            ));
        }
    }
    if let Some(r) = risky(&e.path) {
        if !o.include_risky && !named_within(&|a| risky(a).is_some()) {
            return Some(format!(
                "risky ({r}): applied with --include-risky, or when named"
            ));
        }
    }
    None
}

/// The project's directories along the entries' paths, opened from the root without following
/// links, the chain kept for the next entry (entries come in tree order).
struct Cursor {
    root: Dir,
    /// (path, directory or `None` where the project has none), root excluded.
    chain: Vec<(Vec<u8>, Option<Dir>)>,
}

impl Cursor {
    fn new(root: &Dir) -> io::Result<Cursor> {
        Ok(Cursor {
            root: root.reopen()?,
            chain: Vec::new(),
        })
    }

    /// The project's directory `comps` (parent components of an entry), if it has one.
    fn dir(&mut self, comps: &[Vec<u8>]) -> io::Result<Option<&Dir>> {
        let mut keep = 0;
        while keep < self.chain.len() && keep < comps.len() && self.chain[keep].0 == comps[keep] {
            keep += 1;
        }
        self.chain.truncate(keep);
        while self.chain.len() < comps.len() {
            let i = self.chain.len();
            let parent = if i == 0 {
                Some(&self.root)
            } else {
                self.chain[i - 1].1.as_ref()
            };
            let d = match parent {
                Some(p) => match p.open_dir(&comps[i]) {
                    Ok(d) => Some(d),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => None,
                    Err(e) => return Err(e),
                },
                None => None,
            };
            self.chain.push((comps[i].clone(), d));
        }
        Ok(match comps.len() {
            0 => Some(&self.root),
            n => self.chain[n - 1].1.as_ref(),
        })
    }
}

/// Whether the project's entry now is the one the change set recorded. Directories are compared
/// by identity and mode only (their times change with what is in them).
fn same_state(now: &palisade_linux::fs::Stat, was: &BaseState) -> bool {
    let n = BaseState::of(now);
    if n.kind != was.kind || n.dev != was.dev || n.ino != was.ino {
        return false;
    }
    if n.kind == EntryKind::Dir {
        return n.mode == was.mode;
    }
    n == *was
}

/// The conflict at `e`'s path, if any.
fn conflict(
    e: &Entry,
    parent: Option<&Dir>,
    name: &[u8],
    started: i128,
) -> io::Result<Option<String>> {
    let now = match parent {
        Some(p) => p.stat(name)?,
        None => None,
    };
    let Some(was) = &e.base else {
        // A new directory already there (an earlier apply of part of this change set made it):
        // what goes in it is checked entry by entry.
        if e.kind == EntryKind::Dir && now.is_some_and(|n| n.kind == Kind::Dir) {
            return Ok(None);
        }
        return Ok(
            now.map(|_| "exists in the project now: the run's version would replace it".into())
        );
    };
    if was.ctime_ns as i128 >= started {
        return Ok(Some("changed in the project during the run".into()));
    }
    let Some(now) = now else {
        return Ok(Some("no longer in the project".into()));
    };
    if !same_state(&now, was) {
        return Ok(Some(
            "changed in the project since the change set was made".into(),
        ));
    }
    if now.kind == Kind::Dir && matches!(e.change, Change::Deleted | Change::Replaced) {
        let mut seen = 0;
        match changed_under(parent.expect("a parent"), name, started, &mut seen, 0) {
            Ok(None) => {}
            Ok(Some(p)) => {
                return Ok(Some(format!(
                    "`{}` in it changed in the project during or after the run",
                    palisade_policy::untrusted::escape(&p, 200)
                )))
            }
            Err(e) => return Ok(Some(format!("could not be checked: {e}"))),
        }
    }
    Ok(None)
}

/// Copies `e`'s contents from `data` to `out`, checking their hash; a mismatch is an error.
fn copy_contents(
    cs: &ChangeSet,
    data: &std::fs::File,
    e: &Entry,
    out: &mut dyn Write,
) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::FileExt;
    let off = e.offset.unwrap_or(0);
    if off
        .checked_add(e.size)
        .is_none_or(|end| end > cs.meta.data_bytes)
    {
        return Err(cs.damaged(format!("{}: contents out of range", e.path)));
    }
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut done = 0u64;
    while done < e.size {
        let k = (e.size - done).min(buf.len() as u64) as usize;
        data.read_exact_at(&mut buf[..k], off + done)
            .map_err(|x| cs.damaged(format!("{}: {x}", e.path)))?;
        h.update(&buf[..k]);
        out.write_all(&buf[..k])
            .map_err(|x| cs.damaged(format!("{}: {x}", e.path)))?;
        done += k as u64;
    }
    if Some(&hex(&h.finalize())) != e.sha256.as_ref() {
        return Err(cs.damaged(format!("{}: contents do not match their hash", e.path)));
    }
    Ok(())
}

/// A random name for palisade's own temporary entries in the project.
fn temp_name(what: &str) -> io::Result<Vec<u8>> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut r = [0u8; 10];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut r)?;
    let s: String = r
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    Ok(format!(".palisade-{what}-{s}").into_bytes())
}

impl ChangeSet {
    /// Applies the change set (or the part `o` selects) to the project directory: all of it or,
    /// when anything selected is held back (refused, protected or risky and not named, in
    /// conflict without `force`), nothing, with the list of what was held and why.
    pub fn apply(&self, o: &ApplyOptions) -> Result<Applied, WorkspaceError> {
        let _lock = self.lock()?;
        if let Some(why) = &self.meta.incomplete {
            let reason = format!("the change set is incomplete ({why}): it cannot be applied");
            return Err(WorkspaceError::Held {
                count: 1,
                list: format!("  {reason}"),
                held: vec![HeldBack {
                    path: String::new(),
                    kind: HoldKind::Other,
                    reason,
                }],
            });
        }
        for p in o.paths.iter().chain(&o.exclude) {
            if path_components(p).is_none() {
                return Err(WorkspaceError::NoSuchPath {
                    id: self.id.clone(),
                    path: palisade_policy::untrusted::escape(p.as_bytes(), 200),
                });
            }
        }
        let project = self.project_dir();
        let root = Dir::open_path(&project).map_err(|e| WorkspaceError::BaseMoved {
            dir: project.clone(),
            why: e.to_string(),
        })?;
        let st = root.stat_self().map_err(|e| WorkspaceError::BaseMoved {
            dir: project.clone(),
            why: e.to_string(),
        })?;
        if (st.dev, st.ino) != (self.meta.dir_dev, self.meta.dir_ino) {
            return Err(WorkspaceError::BaseMoved {
                dir: project,
                why: "another directory is at its path now".into(),
            });
        }
        let data = self.data()?;
        self.check(&root, &data, o)?;
        self.write(&root, &data, o)
    }

    /// The first pass: nothing is written.
    fn check(
        &self,
        root: &Dir,
        data: &std::fs::File,
        o: &ApplyOptions,
    ) -> Result<(), WorkspaceError> {
        let started = self.meta.started_ns as i128;
        let mut held: Vec<(String, String)> = Vec::new();
        let mut count = 0usize;
        let mut matched = vec![false; o.paths.len()];
        // Directories this apply makes, so that what goes in them needs no project directory.
        let mut coming: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut cursor = Cursor::new(root).map_err(|e| self.damaged(e.to_string()))?;
        // Where each link leads is judged over the project as it will be once every selected
        // entry is in place (if one is held back, nothing is applied).
        let mut tree = super::links::Tree::default();
        for e in self.entries()? {
            let e = e?;
            if matches!(pick(&e, o), Pick::Yes | Pick::Parent) {
                tree.add(&e);
            }
        }
        let mut judge = super::links::Judge::new(root, &tree);
        let mut hold_it = |path: &str, why: String, count: &mut usize| {
            *count += 1;
            if held.len() < 50 {
                held.push((path.to_owned(), why));
            }
        };
        for e in self.entries()? {
            let e = e?;
            for (i, p) in o.paths.iter().enumerate() {
                matched[i] |= is_under(&e.path, p) || is_under(p, &e.path);
            }
            let picked = pick(&e, o);
            match &picked {
                Pick::No => continue,
                Pick::Held(why) => {
                    hold_it(&e.path, why.clone(), &mut count);
                    continue;
                }
                Pick::Yes | Pick::Parent => {}
            }
            if let Some(why) = hold(&e, o, &self.meta.protected, matches!(picked, Pick::Parent)) {
                hold_it(&e.path, why, &mut count);
                continue;
            }
            if let (EntryKind::Symlink, Some(path), Some(target)) = (
                e.kind,
                decode_path(&e.path),
                e.target.as_deref().and_then(decode_path),
            ) {
                match judge.judge(&path, &target) {
                    super::links::Verdict::Inside => {}
                    super::links::Verdict::Out(why) => {
                        hold_it(&e.path, format!("refused: {why}"), &mut count);
                        continue;
                    }
                    super::links::Verdict::Unchecked(why) => {
                        hold_it(&e.path, format!("cannot be checked: {why}"), &mut count);
                        continue;
                    }
                }
            }
            let comps = path_components(&e.path).expect("checked when read");
            let (name, parents) = comps.split_last().expect("one component at least");
            let parent_path = e.path.rsplit_once('/').map(|(p, _)| p.to_owned());
            let parent = cursor
                .dir(parents)
                .map_err(|x| self.damaged(format!("{}: {x}", e.path)))?;
            if parent.is_none() && !parent_path.as_ref().is_some_and(|p| coming.contains(p)) {
                hold_it(
                    &e.path,
                    "its directory is not in the project, and not part of what is applied".into(),
                    &mut count,
                );
                continue;
            }
            let in_new = parent.is_none();
            if !o.force && !in_new {
                match conflict(&e, parent, name, started) {
                    Ok(None) => {}
                    Ok(Some(c)) => {
                        hold_it(
                            &e.path,
                            format!("conflict: {c} (--force applies it anyway)"),
                            &mut count,
                        );
                        continue;
                    }
                    Err(x) => {
                        hold_it(&e.path, format!("cannot be checked: {x}"), &mut count);
                        continue;
                    }
                }
            }
            if e.kind == EntryKind::Dir && matches!(e.change, Change::Added | Change::Replaced) {
                coming.insert(e.path.clone());
            }
            if e.kind == EntryKind::File && e.change != Change::Mode {
                copy_contents(self, data, &e, &mut io::sink())?;
            }
        }
        if let Some(i) = matched.iter().position(|m| !m) {
            return Err(WorkspaceError::NoSuchPath {
                id: self.id.clone(),
                path: palisade_policy::untrusted::escape(o.paths[i].as_bytes(), 200),
            });
        }
        if count > 0 {
            let mut list: Vec<String> = held
                .iter()
                .map(|(p, why)| {
                    format!(
                        "  {}: {why}",
                        palisade_policy::untrusted::escape(decode_path(p).unwrap_or_default(), 300)
                    )
                })
                .collect();
            if count > held.len() {
                list.push(format!("  … and {} more", count - held.len()));
            }
            return Err(WorkspaceError::Held {
                count,
                list: list.join("\n"),
                held: held
                    .into_iter()
                    .map(|(path, reason)| HeldBack {
                        path,
                        kind: HoldKind::of(&reason),
                        reason,
                    })
                    .collect(),
            });
        }
        Ok(())
    }

    /// The second pass: writes.
    fn write(
        &self,
        root: &Dir,
        data: &std::fs::File,
        o: &ApplyOptions,
    ) -> Result<Applied, WorkspaceError> {
        let mut w = Writer {
            root: root.reopen().map_err(|e| self.damaged(e.to_string()))?,
            frames: Vec::new(),
            pending: Vec::new(),
            modes: Vec::new(),
            applied: Applied::default(),
            root_owner: (palisade_linux::host::euid() == 0)
                .then(|| root.stat_self().map(|s| (s.uid, s.gid)).ok())
                .flatten(),
            force: o.force,
            started: self.meta.started_ns as i128,
        };
        let mut result = Ok(());
        for e in self.entries()? {
            let e = match e {
                Ok(e) => e,
                Err(x) => {
                    result = Err(x);
                    break;
                }
            };
            if matches!(pick(&e, o), Pick::No | Pick::Held(_)) {
                continue;
            }
            if let Err(x) = w.entry(self, data, &e) {
                result = Err(match x {
                    WorkspaceError::Damaged { .. } => x,
                    other => WorkspaceError::Partial {
                        path: palisade_policy::untrusted::escape(
                            decode_path(&e.path).unwrap_or_default(),
                            300,
                        ),
                        applied: w.applied.entries as usize,
                        source: io::Error::other(other.to_string()),
                    },
                });
                break;
            }
        }
        let finished = w.finish(result.is_ok());
        let result = result.and(finished.map_err(|x| WorkspaceError::Partial {
            path: "(finishing)".into(),
            applied: w.applied.entries as usize,
            source: x,
        }));
        // Recorded even after a partial apply: what was applied is in the project now.
        let mut meta = self.meta.clone();
        meta.applied = Some(AppliedRecord {
            at: now_secs(),
            entries: w.applied.entries,
            paths: o.paths.clone(),
        });
        let _ = super::capture::write_meta(&self.dir, &meta);
        result.map(|()| w.applied)
    }
}

/// One directory being written: the project's, or a new one filled under a temporary name.
struct Frame {
    path: Vec<u8>,
    dir: Dir,
    /// For a new directory: its temporary name in the frame below, its name, whether it replaces
    /// what is there (exchange, then the old one is removed), its mode.
    place: Option<(Vec<u8>, Vec<u8>, bool, u32)>,
}

/// A file or link written under its temporary name, to be renamed over its path once the batch
/// it is in is on disk.
struct Pending {
    dir: Dir,
    temp: Vec<u8>,
    name: Vec<u8>,
    entry: Entry,
    /// Checked for a conflict once more right before the rename (not inside a new directory,
    /// not with `force`).
    check: bool,
    replaces_dir: bool,
}

/// Files written before one `syncfs` and their renames: a flush per batch instead of an `fsync`
/// per file (on a slow disk, most of an apply's time), each file still on disk before its rename.
const BATCH: usize = 256;

struct Writer {
    root: Dir,
    frames: Vec<Frame>,
    pending: Vec<Pending>,
    /// Directories whose mode changes, set at the end (a mode without write permission would
    /// stop what goes in them).
    modes: Vec<(Vec<Vec<u8>>, u32)>,
    applied: Applied,
    /// Root applying: new entries get the owner of the directory they are made in.
    root_owner: Option<(u32, u32)>,
    force: bool,
    started: i128,
}

impl Writer {
    fn top(&self) -> &Dir {
        self.frames.last().map_or(&self.root, |f| &f.dir)
    }

    /// Pops frames down to the longest prefix of `parents`, then opens the rest from the
    /// project (no link followed).
    fn enter(&mut self, parents: &[Vec<u8>]) -> io::Result<()> {
        let mut keep = 0;
        while keep < self.frames.len()
            && keep < parents.len()
            && self.frames[keep].path == parents[keep]
        {
            keep += 1;
        }
        while self.frames.len() > keep {
            self.pop()?;
        }
        while self.frames.len() < parents.len() {
            let i = self.frames.len();
            let d = self.top().open_dir(&parents[i])?;
            self.frames.push(Frame {
                path: parents[i].clone(),
                dir: d,
                place: None,
            });
        }
        Ok(())
    }

    /// Leaves the top frame: a new directory is moved into place, with all that goes in it.
    fn pop(&mut self) -> io::Result<()> {
        if self.frames.last().is_some_and(|f| f.place.is_some()) {
            self.flush()?;
        }
        let f = self.frames.pop().expect("a frame");
        let Some((temp, name, replace, mode)) = f.place else {
            return Ok(());
        };
        f.dir.chmod_self(mode)?;
        drop(f.dir);
        let parent = self.top();
        if replace {
            parent.rename(&temp, parent, &name, Rename::Exchange)?;
            remove_tree(parent, &temp, 0)?;
        } else {
            parent.rename(&temp, parent, &name, Rename::NoReplace)?;
        }
        Ok(())
    }

    /// Puts the batch on disk, then renames each of its files over its path.
    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.root.sync_fs()?;
        let batch = std::mem::take(&mut self.pending);
        let mut it = batch.into_iter();
        while let Some(p) = it.next() {
            let done = (|| {
                if p.check {
                    if let Some(c) = conflict(&p.entry, Some(&p.dir), &p.name, self.started)? {
                        return Err(io::Error::other(format!("conflict: {c}")));
                    }
                }
                if p.replaces_dir {
                    p.dir.rename(&p.temp, &p.dir, &p.name, Rename::Exchange)?;
                    remove_tree(&p.dir, &p.temp, 0)
                } else if p.entry.base.is_none() {
                    p.dir.rename(&p.temp, &p.dir, &p.name, Rename::NoReplace)
                } else {
                    p.dir.rename(&p.temp, &p.dir, &p.name, Rename::Replace)
                }
            })();
            if let Err(e) = done {
                let _ = p.dir.unlink(&p.temp, false);
                for rest in it {
                    let _ = rest.dir.unlink(&rest.temp, false);
                }
                return Err(io::Error::other(format!(
                    "{}: {e}",
                    palisade_policy::untrusted::escape(
                        decode_path(&p.entry.path).unwrap_or_default(),
                        300
                    )
                )));
            }
            self.count(&p.entry);
        }
        Ok(())
    }

    fn count(&mut self, e: &Entry) {
        self.applied.entries += 1;
        if self.applied.first_paths.len() < FIRST_PATHS {
            self.applied.first_paths.push(e.path.clone());
        }
    }

    /// Queues the finished temporary entry `temp` of the top directory for its rename.
    fn defer(
        &mut self,
        temp: Vec<u8>,
        name: &[u8],
        e: &Entry,
        replaces_dir: bool,
    ) -> io::Result<()> {
        let in_new = self.frames.iter().any(|f| f.place.is_some());
        let p = Pending {
            dir: self.top().reopen()?,
            temp,
            name: name.to_vec(),
            entry: e.clone(),
            check: !self.force && !in_new,
            replaces_dir,
        };
        self.pending.push(p);
        if self.pending.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn owner_for(&self, dir: &Dir) -> Option<(u32, u32)> {
        self.root_owner?;
        dir.stat_self().ok().map(|s| (s.uid, s.gid))
    }

    fn entry(
        &mut self,
        cs: &ChangeSet,
        data: &std::fs::File,
        e: &Entry,
    ) -> Result<(), WorkspaceError> {
        let io = |x: io::Error| WorkspaceError::Capture(x.to_string());
        let comps = path_components(&e.path).expect("checked when read");
        let (name, parents) = comps.split_last().expect("one component at least");
        self.enter(parents).map_err(io)?;
        // Checked again right before the change: the first pass was a while ago.
        let in_new = self.frames.iter().any(|f| f.place.is_some());
        if !self.force && !in_new && e.change != Change::Mode {
            if let Some(c) = conflict(e, Some(self.top()), name, self.started).map_err(io)? {
                return Err(WorkspaceError::Capture(format!("conflict: {c}")));
            }
        }
        let mode = e.mode.unwrap_or(0o644) & 0o777;
        let owner = {
            let top = self.top();
            match (&e.base, self.root_owner) {
                (Some(_), Some(_)) => top
                    .stat(name)
                    .ok()
                    .flatten()
                    .map(|s| (s.uid, s.gid))
                    .or_else(|| self.owner_for(top)),
                (None, Some(_)) => self.owner_for(top),
                _ => None,
            }
        };
        let replaces_dir = e.base.is_some_and(|b| b.kind == EntryKind::Dir);
        match (e.change.clone(), e.kind) {
            (Change::Mode, EntryKind::Dir) => {
                self.modes.push((comps.clone(), mode));
            }
            (Change::Mode, _) => {
                let top = self.top();
                let f = top.open_file(name).map_err(io)?;
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(io)?;
            }
            (Change::Deleted, _) => {
                let top = self.top();
                if replaces_dir {
                    let temp = temp_name("old").map_err(io)?;
                    top.rename(name, top, &temp, Rename::NoReplace)
                        .map_err(io)?;
                    remove_tree(top, &temp, 0).map_err(io)?;
                } else {
                    top.unlink(name, false).map_err(io)?;
                }
            }
            (Change::Added, EntryKind::Dir)
                if self
                    .top()
                    .stat(name)
                    .map_err(io)?
                    .is_some_and(|s| s.kind == Kind::Dir) =>
            {
                // Already there (see `conflict`): filled in place.
                let d = self.top().open_dir(name).map_err(io)?;
                self.frames.push(Frame {
                    path: name.clone(),
                    dir: d,
                    place: None,
                });
            }
            (Change::Added | Change::Replaced, EntryKind::Dir) => {
                let top = self.top();
                let temp = temp_name("new").map_err(io)?;
                top.mkdir(&temp, 0o700).map_err(io)?;
                let d = top.open_dir(&temp).map_err(io)?;
                if let Some((u, g)) = owner {
                    d.chown_self(u, g).map_err(io)?;
                }
                let replace = e.change == Change::Replaced;
                self.frames.push(Frame {
                    path: name.clone(),
                    dir: d,
                    place: Some((temp, name.clone(), replace, mode)),
                });
            }
            (_, EntryKind::File) => {
                let top = self.top();
                let temp = temp_name("tmp").map_err(io)?;
                let mut f = top.create_file(&temp, 0o600).map_err(io)?;
                let written = (|| {
                    let mut w = io::BufWriter::new(&mut f);
                    copy_contents(cs, data, e, &mut w)?;
                    w.flush().map_err(io)?;
                    drop(w);
                    use std::os::unix::fs::PermissionsExt;
                    f.set_permissions(std::fs::Permissions::from_mode(mode))
                        .map_err(io)?;
                    if let Some((u, g)) = owner {
                        std::os::unix::fs::fchown(&f, Some(u), Some(g)).map_err(io)?;
                    }
                    Ok(())
                })();
                if written.is_err() {
                    let _ = self.top().unlink(&temp, false);
                }
                written?;
                self.applied.bytes += e.size;
                return self.defer(temp, name, e, replaces_dir).map_err(io);
            }
            (_, EntryKind::Symlink) => {
                let top = self.top();
                let temp = temp_name("tmp").map_err(io)?;
                let target = e
                    .target
                    .as_deref()
                    .and_then(decode_path)
                    .unwrap_or_default();
                top.symlink(&target, &temp).map_err(io)?;
                if let Some((u, g)) = owner {
                    if let Err(x) = self.top().chown(&temp, u, g) {
                        let _ = self.top().unlink(&temp, false);
                        return Err(io(x));
                    }
                }
                return self.defer(temp, name, e, replaces_dir).map_err(io);
            }
            _ => return Err(WorkspaceError::Capture("an entry of no kind".into())),
        }
        self.count(e);
        Ok(())
    }

    /// Moves every new directory into place (or, after an error, removes the unfinished ones),
    /// then sets the directory modes that changed.
    fn finish(&mut self, ok: bool) -> io::Result<()> {
        if !ok {
            for p in std::mem::take(&mut self.pending) {
                let _ = p.dir.unlink(&p.temp, false);
            }
            while let Some(f) = self.frames.pop() {
                if let Some((temp, ..)) = f.place {
                    drop(f.dir);
                    let _ = remove_tree(self.top(), &temp, 0);
                }
            }
            return Ok(());
        }
        self.flush()?;
        while !self.frames.is_empty() {
            self.pop()?;
        }
        for (comps, mode) in std::mem::take(&mut self.modes) {
            let mut d = self.root.reopen()?;
            for c in &comps {
                d = d.open_dir(c)?;
            }
            d.chmod_self(mode)?;
        }
        self.root.sync_fs()
    }
}
