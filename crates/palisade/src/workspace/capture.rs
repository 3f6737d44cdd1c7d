//! Reading a workspace's upper layer after the run into a change set.
//!
//! The upper layer is sandbox-written state: it is walked one `openat` at a time from the tmpfs
//! descriptor init handed over, links never followed, each directory's names bounded, depth and
//! path length bounded. An overlay upper layer mounted with `userxattr` and without
//! `redirect_dir` or `metacopy` holds only whole files, directories (opaque ones marked with
//! `user.overlay.opaque=y`), symbolic links, whiteouts (character devices 0/0) and whatever
//! special files the code made; nothing in it points elsewhere. Each entry is compared with the
//! project's own entry at the same path, so that a file the overlay copied up without changing it
//! (opened for writing, touched, chowned) is no change.

use super::*;
use sha2::Digest;
use std::io::Write;
use std::os::fd::OwnedFd;

/// Deepest directory nesting kept; deeper entries are recorded as refused, not walked.
const MAX_DEPTH: usize = 256;
/// Deleted and added files considered for rename detection (by size, then contents).
const MAX_RENAME_CANDIDATES: usize = 10_000;
/// Entries of a removed project directory looked at for changes made during the run.
const MAX_CONFLICT_SCAN: u64 = 1_000_000;

/// What the supervisor knows of the run when it captures its changes.
pub(crate) struct CaptureInput<'a> {
    pub store: &'a Store,
    /// The root of the workspace's tmpfs (its `upper` directory is the layer).
    pub tmpfs: OwnedFd,
    pub base: &'a palisade_linux::plan::WorkspaceBase,
    /// The file-system clock when the run began.
    pub started_ns: i128,
    pub run: RunResult,
    pub protected: &'a [String],
    /// The cap of the layer in bytes (`limits.scratch_size`): `data` never grows past it.
    pub cap: u64,
}

/// Reads the upper layer into a new change set in `input.store`. `Ok(None)` when the run changed
/// nothing.
pub(crate) fn capture(input: CaptureInput<'_>) -> Result<Option<Meta>, WorkspaceError> {
    let fail = |what: &str, e: io::Error| WorkspaceError::Capture(format!("{what}: {e}"));
    let tmpfs = Dir::from_fd(input.tmpfs).map_err(|e| fail("open the upper layer", e))?;
    let upper = tmpfs
        .open_dir(b"upper")
        .map_err(|e| fail("open the upper layer", e))?;
    let base = Dir::open_path(&input.base.path).map_err(|e| {
        fail(
            &format!("open the project directory {}", input.base.path.display()),
            e,
        )
    })?;
    let st = base
        .stat_self()
        .map_err(|e| fail("look at the project directory", e))?;
    let mut incomplete = None;
    if (st.dev, st.ino) != (input.base.dev, input.base.ino) {
        incomplete = Some(format!(
            "the project directory {} was replaced during the run",
            input.base.path.display()
        ));
    }
    // A quick look first: an untouched upper layer means no change set at all.
    let empty = match upper.names(1) {
        Ok(n) => n.is_empty(),
        Err(e) if e.raw_os_error() == Some(libc::EFBIG) => false,
        Err(e) => return Err(fail("read the upper layer", e)),
    };
    if empty && incomplete.is_none() {
        return Ok(None);
    }

    let store_dir = input.store.open_dir(true)?;
    let now = now_secs();
    let id = new_id(now).map_err(|e| fail("make an id", e))?;
    let partial = format!("{PARTIAL}{id}");
    store_dir
        .mkdir(partial.as_bytes(), 0o700)
        .map_err(|e| input.store.err(e))?;
    let dir = store_dir
        .open_dir(partial.as_bytes())
        .map_err(|e| input.store.err(e))?;
    let result = (|| {
        let mut w = Walker {
            entries: io::BufWriter::new(
                dir.create_file(b"entries.jsonl", 0o600)
                    .map_err(|e| input.store.err(e))?,
            ),
            data: io::BufWriter::new(
                dir.create_file(b"data", 0o600)
                    .map_err(|e| input.store.err(e))?,
            ),
            data_len: 0,
            cap: input.cap,
            started_ns: input.started_ns,
            protected: input.protected,
            summary: Summary::default(),
            incomplete,
            budget: palisade_linux::plan::WORKSPACE_MAX_INODES + 16,
            deleted_files: Vec::new(),
            added_files: Vec::new(),
            links: super::links::Tree::default(),
        };
        w.walk(&upper, Some(&base), b"", 0)
            .map_err(|e| w.io_error(e, input.store))?;
        let renames = w.renames(&base);
        w.summary.renamed = renames.len() as u64;
        let (mut entries, mut data) = (w.entries, w.data);
        entries.flush().map_err(|e| input.store.err(e))?;
        data.flush().map_err(|e| input.store.err(e))?;
        let entries = entries
            .into_inner()
            .map_err(|e| input.store.err(e.into_error()))?;
        let data = data
            .into_inner()
            .map_err(|e| input.store.err(e.into_error()))?;
        entries.sync_all().map_err(|e| input.store.err(e))?;
        data.sync_all().map_err(|e| input.store.err(e))?;
        drop(entries);
        w.summary.refused += refuse_links(&dir, &base, &w.links).map_err(|e| input.store.err(e))?;
        use std::os::unix::ffi::OsStrExt;
        let meta = Meta {
            version: META_VERSION,
            id: id.clone(),
            dir: encode_path(input.base.path.as_os_str().as_bytes()),
            dir_dev: input.base.dev,
            dir_ino: input.base.ino,
            started_ns: input.started_ns as i64,
            created: now,
            run: input.run.clone(),
            protected: input.protected.to_vec(),
            summary: w.summary,
            renames,
            data_bytes: w.data_len,
            incomplete: w.incomplete,
            applied: None,
        };
        write_meta(&dir, &meta).map_err(|e| input.store.err(e))?;
        Ok(meta)
    })();
    let meta = match result {
        Ok(m) if m.summary.entries == 0 && m.incomplete.is_none() => {
            let _ = remove_tree(&store_dir, partial.as_bytes(), 0);
            return Ok(None);
        }
        Ok(m) => m,
        Err(e) => {
            let _ = remove_tree(&store_dir, partial.as_bytes(), 0);
            return Err(e);
        }
    };
    store_dir
        .rename(
            partial.as_bytes(),
            &store_dir,
            id.as_bytes(),
            Rename::NoReplace,
        )
        .map_err(|e| input.store.err(e))?;
    let _ = store_dir.sync();
    Ok(Some(meta))
}

use palisade_linux::fs::Rename;

/// Follows each link of the change set (not refused yet) over the project as a whole apply would
/// leave it (`tree` over `base`), and records those that lead out as refused, rewriting
/// `entries.jsonl` through a temporary name; returns how many. `changes` then shows them as an
/// apply would judge them (an apply judges again, against the project of the moment and the
/// part it applies). A link that cannot be followed (a bound) is left to the apply.
fn refuse_links(dir: &Dir, base: &Dir, tree: &super::links::Tree) -> io::Result<u64> {
    if !tree.has_links() {
        return Ok(0);
    }
    let tmp = b"entries.jsonl.tmp";
    let mut judge = super::links::Judge::new(base, tree);
    let lines = io::BufReader::new(dir.open_file(b"entries.jsonl")?);
    let _ = dir.unlink(tmp, false);
    let mut out = io::BufWriter::new(dir.create_file(tmp, 0o600)?);
    let mut newly = 0;
    for line in lines.split(b'\n') {
        let mut e: Entry = serde_json::from_slice(&line?).map_err(io::Error::other)?;
        if let (EntryKind::Symlink, None, Some(path), Some(target)) = (
            e.kind,
            &e.refused,
            decode_path(&e.path),
            e.target.as_deref().and_then(decode_path),
        ) {
            if let super::links::Verdict::Out(why) = judge.judge(&path, &target) {
                e.refused = Some(why);
                newly += 1;
            }
        }
        let mut l = serde_json::to_vec(&e).map_err(io::Error::other)?;
        l.push(b'\n');
        out.write_all(&l)?;
    }
    if newly == 0 {
        drop(out);
        dir.unlink(tmp, false)?;
        return Ok(0);
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    dir.rename(tmp, dir, b"entries.jsonl", Rename::Replace)?;
    Ok(newly)
}

/// Writes `meta.json` in `dir` through a temporary name and a rename.
pub(super) fn write_meta(dir: &Dir, meta: &Meta) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(meta).map_err(io::Error::other)?;
    let tmp = b"meta.json.tmp";
    let _ = dir.unlink(tmp, false);
    let mut f = dir.create_file(tmp, 0o600)?;
    f.write_all(&text)?;
    f.sync_all()?;
    dir.rename(tmp, dir, b"meta.json", Rename::Replace)
}

struct Walker<'a> {
    entries: io::BufWriter<std::fs::File>,
    data: io::BufWriter<std::fs::File>,
    data_len: u64,
    cap: u64,
    started_ns: i128,
    protected: &'a [String],
    summary: Summary,
    incomplete: Option<String>,
    /// Entries still to be read before the capture stops.
    budget: u64,
    deleted_files: Vec<(String, u64)>,
    added_files: Vec<(String, u64, String)>,
    /// What decides where the change set's links lead ([`refuse_links`]).
    links: super::links::Tree,
}

/// An error of the walk: the store's (fatal) or the layer's (the change set is kept, incomplete).
enum WalkError {
    Store(io::Error),
    Layer(String),
}

impl From<io::Error> for WalkError {
    fn from(e: io::Error) -> Self {
        WalkError::Store(e)
    }
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return name.to_vec();
    }
    let mut p = rel.to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

impl Walker<'_> {
    fn io_error(&mut self, e: WalkError, store: &Store) -> WorkspaceError {
        match e {
            WalkError::Store(e) => store.err(e),
            WalkError::Layer(e) => WorkspaceError::Capture(e),
        }
    }

    fn conflict_of(&self, b: &BaseState) -> Option<String> {
        (b.ctime_ns as i128 >= self.started_ns)
            .then(|| "changed in the project during the run".to_owned())
    }

    /// A conflict anywhere in a project directory the change removes.
    fn subtree_conflict(&self, base: &Dir, name: &[u8]) -> Option<String> {
        let mut seen = 0u64;
        match changed_under(base, name, self.started_ns, &mut seen, 0) {
            Ok(None) => None,
            Ok(Some(p)) => Some(format!(
                "`{}` in it changed in the project during the run",
                palisade_policy::untrusted::escape(&p, 200)
            )),
            Err(e) => Some(format!(
                "could not be checked for changes during the run: {e}"
            )),
        }
    }

    fn emit(&mut self, mut e: Entry) -> Result<(), WalkError> {
        if e.refused.is_none() {
            e.refused = refusal(
                &e.path,
                e.kind,
                e.mode.unwrap_or(0),
                e.target.as_deref().and_then(decode_path).as_deref(),
            );
        }
        e.protected = protected_by(&e.path, self.protected).map(str::to_owned);
        e.risky = risky(&e.path);
        self.links.add(&e);
        self.summary.count(&e);
        let mut line = serde_json::to_vec(&e).map_err(io::Error::other)?;
        if line.len() >= MAX_LINE {
            return Err(WalkError::Layer(format!(
                "an entry too long to keep: {}",
                palisade_policy::untrusted::escape(e.path.as_bytes(), 200)
            )));
        }
        line.push(b'\n');
        self.entries.write_all(&line)?;
        Ok(())
    }

    /// Copies the regular file `name` of `dir` into `data`: offset, size, hash.
    fn store(&mut self, dir: &Dir, name: &[u8], size: u64) -> Result<(u64, String), WalkError> {
        if self.data_len + size > self.cap {
            return Err(WalkError::Layer(format!(
                "the upper layer holds more than its cap of {} bytes",
                self.cap
            )));
        }
        let f = dir
            .open_file(name)
            .map_err(|e| WalkError::Layer(e.to_string()))?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut n = 0u64;
        let mut r = f.take(size + 1);
        loop {
            let k = r
                .read(&mut buf)
                .map_err(|e| WalkError::Layer(e.to_string()))?;
            if k == 0 {
                break;
            }
            n += k as u64;
            if n > size {
                return Err(WalkError::Layer("a file grew while it was read".into()));
            }
            h.update(&buf[..k]);
            self.data.write_all(&buf[..k])?;
        }
        if n != size {
            return Err(WalkError::Layer("a file shrank while it was read".into()));
        }
        let off = self.data_len;
        self.data_len += size;
        Ok((off, hex(&h.finalize())))
    }

    fn walk(
        &mut self,
        upper: &Dir,
        base: Option<&Dir>,
        rel: &[u8],
        depth: usize,
    ) -> Result<(), WalkError> {
        let mut names = match upper.names(self.budget as usize) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EFBIG) => {
                self.incomplete = Some(format!(
                    "more than {} entries",
                    palisade_linux::plan::WORKSPACE_MAX_INODES
                ));
                return Ok(());
            }
            Err(e) => return Err(WalkError::Layer(format!("read the upper layer: {e}"))),
        };
        self.budget -= names.len() as u64;
        names.sort();
        for name in names {
            if self.incomplete.is_some() && self.budget == 0 {
                break;
            }
            // What cannot be read of one entry makes the change set incomplete (kept, shown, not
            // applicable), never lost.
            match self.one(upper, base, rel, &name, depth) {
                Ok(()) => {}
                Err(WalkError::Layer(m)) => {
                    let p = palisade_policy::untrusted::escape(join(rel, &name), 200);
                    self.incomplete.get_or_insert(format!("{p}: {m}"));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One entry of the upper layer (and what is under it).
    fn one(
        &mut self,
        upper: &Dir,
        base: Option<&Dir>,
        rel: &[u8],
        name: &[u8],
        depth: usize,
    ) -> Result<(), WalkError> {
        let name = name.to_vec();
        {
            let path_b = join(rel, &name);
            let path = encode_path(&path_b);
            let Some(us) = upper
                .stat(&name)
                .map_err(|e| WalkError::Layer(e.to_string()))?
            else {
                return Ok(());
            };
            let bs = match base {
                Some(b) => b
                    .stat(&name)
                    .map_err(|e| WalkError::Layer(format!("look at the project: {e}")))?,
                None => None,
            };
            let bstate = bs.as_ref().map(BaseState::of);
            let mut e = Entry {
                path: path.clone(),
                change: Change::Added,
                kind: EntryKind::of(us.kind),
                mode: Some(us.mode),
                size: 0,
                offset: None,
                sha256: None,
                target: None,
                base: bstate,
                refused: None,
                conflict: bstate.as_ref().and_then(|b| self.conflict_of(b)),
                protected: None,
                risky: None,
            };
            if path_b.len() > MAX_PATH || depth >= MAX_DEPTH {
                e.refused = Some(format!(
                    "deeper than {MAX_DEPTH} directories or longer than {MAX_PATH} bytes"
                ));
                e.change = if bs.is_some() {
                    Change::Modified
                } else {
                    Change::Added
                };
                self.emit(e)?;
                return Ok(());
            }
            if us.is_whiteout() {
                let Some(b) = bs else {
                    return Ok(()); // Nothing of the project's to delete.
                };
                e.change = Change::Deleted;
                e.kind = EntryKind::None;
                e.mode = None;
                if b.kind == Kind::Dir {
                    e.conflict = e
                        .conflict
                        .or_else(|| self.subtree_conflict(base.expect("base"), &name));
                } else if b.kind == Kind::File && self.deleted_files.len() < MAX_RENAME_CANDIDATES {
                    self.deleted_files.push((path.clone(), b.size));
                }
                self.emit(e)?;
                return Ok(());
            }
            // An entry the code made unreadable to its owner (chmod 000) is opened up: the
            // layer is the sandbox's own tmpfs, dead now; its recorded mode stays the code's.
            readable(upper, &name, &us);
            match us.kind {
                Kind::Dir => {
                    let sub = upper
                        .open_dir(&name)
                        .map_err(|e| WalkError::Layer(e.to_string()))?;
                    let opaque = base.is_some()
                        && sub
                            .xattr(c"user.overlay.opaque", 16)
                            .map_err(|e| WalkError::Layer(e.to_string()))?
                            .as_deref()
                            == Some(b"y");
                    match &bs {
                        Some(b) if b.kind == Kind::Dir && !opaque => {
                            let bsub = base.expect("base").open_dir(&name).map_err(|e| {
                                WalkError::Layer(format!("open the project's {path}: {e}"))
                            })?;
                            if b.mode != us.mode {
                                e.change = Change::Mode;
                                self.emit(e)?;
                            }
                            self.walk(&sub, Some(&bsub), &path_b, depth + 1)?;
                        }
                        Some(b) => {
                            e.change = Change::Replaced;
                            if b.kind == Kind::Dir {
                                e.conflict = e
                                    .conflict
                                    .or_else(|| self.subtree_conflict(base.expect("base"), &name));
                            }
                            self.emit(e)?;
                            self.walk(&sub, None, &path_b, depth + 1)?;
                        }
                        None => {
                            self.emit(e)?;
                            self.walk(&sub, None, &path_b, depth + 1)?;
                        }
                    }
                }
                Kind::File => {
                    if us.nlink > 1 {
                        e.refused = Some(format!(
                            "one of {} names of the same file (a hard link): palisade applies files with one name only",
                            us.nlink
                        ));
                    }
                    match &bs {
                        Some(b) if b.kind == Kind::File => {
                            // A project file that cannot be read counts as different.
                            let same = b.size == us.size
                                && same_contents(upper, base.expect("base"), &name)
                                    .unwrap_or(false);
                            if same && b.mode == us.mode && e.refused.is_none() {
                                return Ok(());
                            }
                            e.change = if same { Change::Mode } else { Change::Modified };
                            if same && e.refused.is_none() {
                                self.emit(e)?;
                                return Ok(());
                            }
                        }
                        Some(b) if b.kind == Kind::Dir => {
                            e.change = Change::Replaced;
                            e.conflict = e
                                .conflict
                                .or_else(|| self.subtree_conflict(base.expect("base"), &name));
                        }
                        Some(_) => e.change = Change::Modified,
                        None => {}
                    }
                    let (off, sum) = self.store(upper, &name, us.size)?;
                    e.size = us.size;
                    e.offset = Some(off);
                    if e.change == Change::Added
                        && e.refused.is_none()
                        && self.added_files.len() < MAX_RENAME_CANDIDATES
                    {
                        self.added_files.push((path.clone(), us.size, sum.clone()));
                    }
                    e.sha256 = Some(sum);
                    self.emit(e)?;
                }
                Kind::Symlink => {
                    let t = upper
                        .readlink(&name, MAX_PATH)
                        .map_err(|e| WalkError::Layer(e.to_string()))?;
                    match &bs {
                        Some(b) if b.kind == Kind::Symlink => {
                            let bt = base
                                .expect("base")
                                .readlink(&name, MAX_PATH)
                                .map_err(|e| WalkError::Layer(e.to_string()))?;
                            if bt == t {
                                return Ok(());
                            }
                            e.change = Change::Modified;
                        }
                        Some(b) if b.kind == Kind::Dir => {
                            e.change = Change::Replaced;
                            e.conflict = e
                                .conflict
                                .or_else(|| self.subtree_conflict(base.expect("base"), &name));
                        }
                        Some(_) => e.change = Change::Modified,
                        None => {}
                    }
                    e.target = Some(encode_path(&t));
                    self.emit(e)?;
                }
                // Fifos, sockets, devices: listed, refused.
                _ => {
                    e.change = match &bs {
                        Some(b) if b.kind == Kind::Dir => Change::Replaced,
                        Some(_) => Change::Modified,
                        None => Change::Added,
                    };
                    self.emit(e)?;
                }
            }
        }
        Ok(())
    }

    /// Deleted and added files with the same size and contents: renames. Each deleted file is
    /// read at most once, and only when an added file has its size (the first time one does):
    /// the work is bounded by the deleted files' bytes, not by their count times the added
    /// files' count (10 000 added files of the size of 10 000 deleted ones would otherwise read
    /// project files 10^8 times, after the run, outside its limits).
    fn renames(&self, base: &Dir) -> Vec<Renamed> {
        use std::collections::{HashMap, VecDeque};
        let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, (_, size)) in self.deleted_files.iter().enumerate() {
            by_size.entry(*size).or_default().push(i);
        }
        // For each size looked up: the unused deleted files by hash, first deleted first.
        let mut by_hash: HashMap<u64, HashMap<String, VecDeque<usize>>> = HashMap::new();
        let mut out = Vec::new();
        for (to, size, sum) in &self.added_files {
            let Some(candidates) = by_size.get(size) else {
                continue;
            };
            let table = by_hash.entry(*size).or_insert_with(|| {
                let mut t: HashMap<String, VecDeque<usize>> = HashMap::new();
                for &i in candidates {
                    if let Ok(h) = hash_file(base, &self.deleted_files[i].0) {
                        t.entry(h).or_default().push_back(i);
                    }
                }
                t
            });
            if let Some(i) = table.get_mut(sum).and_then(VecDeque::pop_front) {
                out.push(Renamed {
                    from: self.deleted_files[i].0.clone(),
                    to: to.clone(),
                });
            }
        }
        out
    }
}

/// Gives the owner read (and search, for a directory) on an entry of the upper layer that lacks
/// them, so that an unprivileged supervisor can read what the code made unreadable.
fn readable(upper: &Dir, name: &[u8], st: &palisade_linux::fs::Stat) {
    let need = match st.kind {
        Kind::Dir => 0o500,
        Kind::File => 0o400,
        _ => return,
    };
    if st.mode & need != need {
        let _ = upper.chmod(name, st.mode | need);
    }
}

/// SHA-256 of the project file at `path` (no link followed on the way).
fn hash_file(base: &Dir, path: &str) -> io::Result<String> {
    let comps = path_components(path).ok_or_else(|| io::Error::other("bad path"))?;
    let (last, parents) = comps
        .split_last()
        .ok_or_else(|| io::Error::other("bad path"))?;
    let mut d = base.reopen()?;
    for c in parents {
        d = d.open_dir(c)?;
    }
    let mut f = d.open_file(last)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&buf[..k]);
    }
}

/// Whether the file `name` has the same bytes in both directories.
fn same_contents(a: &Dir, b: &Dir, name: &[u8]) -> io::Result<bool> {
    let (mut fa, mut fb) = (a.open_file(name)?, b.open_file(name)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let ka = read_full(&mut fa, &mut ba)?;
        let kb = read_full(&mut fb, &mut bb)?;
        if ka != kb || ba[..ka] != bb[..kb] {
            return Ok(false);
        }
        if ka == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let k = f.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

/// The first entry under `name` in `dir` (itself included) whose status changed at or after
/// `since`, as a path relative to `dir`.
pub(super) fn changed_under(
    dir: &Dir,
    name: &[u8],
    since: i128,
    seen: &mut u64,
    depth: usize,
) -> io::Result<Option<Vec<u8>>> {
    let Some(st) = dir.stat(name)? else {
        return Ok(None);
    };
    *seen += 1;
    if *seen > MAX_CONFLICT_SCAN || depth > 4096 {
        return Err(io::Error::other("too large to check"));
    }
    if st.ctime_ns >= since {
        return Ok(Some(name.to_vec()));
    }
    if st.kind != Kind::Dir {
        return Ok(None);
    }
    let sub = dir.open_dir(name)?;
    for n in sub.names(usize::MAX)? {
        if let Some(p) = changed_under(&sub, &n, since, seen, depth + 1)? {
            return Ok(Some(join(name, &p)));
        }
    }
    Ok(None)
}
