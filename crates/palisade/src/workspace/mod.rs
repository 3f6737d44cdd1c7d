//! Copy-on-write workspaces: the code edits a copy of a project; a person reviews what changed
//! and applies all or part of it (docs/workspace.md).
//!
//! During the run the project directory is the lower layer of an overlay whose upper layer lives
//! on a private tmpfs of the sandbox, capped like the scratch tmpfs (`limits.scratch_size`) and
//! charged to the sandbox's memory: the project itself is never written, and nothing the code
//! writes reaches the host's disk while it runs. After the run, once nothing of the sandbox is
//! left, the supervisor reads the upper layer (`capture`) and keeps it as a *change set* in a
//! [`Store`] on the host: `meta.json` (what the run was, a summary), `entries.jsonl` (one
//! [`Entry`] per changed path, in tree order) and `data` (the new contents, one after another).
//! The change set is bounded by the tmpfs it came from: at most the cap in bytes and
//! [`palisade_linux::plan::WORKSPACE_MAX_INODES`] entries; its size on disk is the cap at most.
//!
//! Nothing that came from the sandbox is trusted: the upper layer is walked one `openat` at a
//! time without following links ([`palisade_linux::fs`]), every count and size is bounded, and
//! what cannot be applied safely is recorded as refused (devices, fifos, sockets, set-id modes,
//! hard links, links out of the tree). The stored change set is not trusted either when it is
//! read back: [`ChangeSet::apply`] checks every path, kind, mode and hash again, and writes into
//! the project with temporary names and `renameat2`, never through a link (see `apply.rs`).
//!
//! A server holds a [`Store`] and calls the same functions the command line does:
//! [`Store::list`], [`Store::get`], [`ChangeSet::entries`], [`ChangeSet::diff`],
//! [`ChangeSet::apply`], [`Store::discard`], [`Store::prune`].

mod apply;
pub(crate) mod capture;
mod diff;
mod links;

pub use apply::{Applied, ApplyOptions};
pub(crate) use capture::capture;
pub use diff::DiffOutput;

use palisade_linux::fs::{Dir, Kind};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// What happens to a workspace's change set once the run is over (`run --apply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    /// Keep it for review: nothing reaches the project until someone applies it.
    #[default]
    Never,
    /// Apply it when the run succeeded (exit 0) and nothing in it is held back (refused,
    /// protected, risky or conflicting entries hold all of it back).
    OnSuccess,
    /// Apply it whatever the run's result, with the same holds.
    Always,
}

impl ApplyMode {
    /// Parses `never`, `on-success`, `always`.
    pub fn parse(s: &str) -> Result<ApplyMode, palisade_policy::PolicyError> {
        match s {
            "never" => Ok(ApplyMode::Never),
            "on-success" => Ok(ApplyMode::OnSuccess),
            "always" => Ok(ApplyMode::Always),
            _ => Err(palisade_policy::PolicyError::Invalid {
                field: "apply",
                value: s.to_owned(),
                expected: "one of: never, on-success, always",
            }),
        }
    }
}

/// How many change sets a store keeps, how old and how large (oldest removed first, each time a
/// run adds one). Unapplied change sets are removed like the others: the limits are the user's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // The three limits, named for what they limit.
pub struct Retention {
    pub max_count: usize,
    pub max_age: std::time::Duration,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_count: 50,
            max_age: std::time::Duration::from_secs(30 * 24 * 3600),
            max_bytes: 20 << 30,
        }
    }
}

/// Why a change-set operation failed. Nothing in the project changed unless the variant says so.
#[derive(Debug, Error)]
#[allow(missing_docs)] // Each variant's message says what it is.
pub enum WorkspaceError {
    #[error("no change set `{id}` in {}; `palisade changes --list` lists them", store.display())]
    Unknown { id: String, store: PathBuf },
    #[error(
        "`{id}` is not a change-set id (letters, digits and `-`, as `changes --list` shows them)"
    )]
    BadId { id: String },
    #[error("the change set store {}: {source}", path.display())]
    Store {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("change set `{id}` is damaged ({what}); discard it")]
    Damaged { id: String, what: String },
    #[error("change set `{id}` is being applied or discarded by another palisade; try again when it is done")]
    Busy { id: String },
    #[error("the project directory {} is not the one the run used ({why}); nothing was changed", dir.display())]
    BaseMoved { dir: PathBuf, why: String },
    #[error("nothing was applied: {count} change(s) held back:\n{list}")]
    Held {
        count: usize,
        list: String,
        /// The first entries held back (at most 50, as in `list`), each with why.
        held: Vec<HeldBack>,
    },
    #[error("`{path}` names no change in change set `{id}`")]
    NoSuchPath { id: String, path: String },
    #[error("applying {path}: {source}; the files listed before it were applied, it and the rest were not (each file is whole, old or new)")]
    Partial {
        path: String,
        applied: usize,
        #[source]
        source: io::Error,
    },
    #[error("the workspace's changes could not be kept: {0}")]
    Capture(String),
}

/// An entry an apply held back, and why (for a caller that shows them one by one: a server's
/// structured answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldBack {
    /// The entry's path ([`encode_path`]'s form; empty for the change set as a whole).
    pub path: String,
    /// What holds it: `refused` (never applied), `conflict` (`force` overrides), `protected`
    /// (applied only when named), `risky` (`include_risky`, or named), `other`.
    pub kind: HoldKind,
    /// Why, for people.
    pub reason: String,
}

/// What holds an entry back ([`HeldBack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)] // As HeldBack::kind says.
pub enum HoldKind {
    Refused,
    Conflict,
    Protected,
    Risky,
    Other,
}

impl HoldKind {
    /// The kind of a reason `apply` gave (each starts with its kind).
    pub(crate) fn of(reason: &str) -> HoldKind {
        if reason.starts_with("refused") {
            HoldKind::Refused
        } else if reason.starts_with("conflict") {
            HoldKind::Conflict
        } else if reason.starts_with("protected") {
            HoldKind::Protected
        } else if reason.starts_with("risky") {
            HoldKind::Risky
        } else {
            HoldKind::Other
        }
    }
}

/// What the run changed at one path. Paths are relative to the project directory, `/`-separated,
/// in [`encode_path`]'s form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Nothing was there.
    Added,
    /// The same kind of file, other contents (and maybe another mode), or a file became a
    /// symbolic link or the other way round.
    Modified,
    /// Only the permission bits changed.
    Mode,
    /// Removed (with everything under it, for a directory).
    Deleted,
    /// A directory removed and recreated, or a directory put where a file was or the other way
    /// round: what was there goes as a whole, the new entry and what follows under it come in.
    Replaced,
}

/// The kind of the new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)] // Kinds of files, named as `stat` names them.
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Device,
    /// For `deleted`: nothing.
    None,
}

impl EntryKind {
    fn of(k: Kind) -> EntryKind {
        match k {
            Kind::File => EntryKind::File,
            Kind::Dir => EntryKind::Dir,
            Kind::Symlink => EntryKind::Symlink,
            Kind::Fifo => EntryKind::Fifo,
            Kind::Socket => EntryKind::Socket,
            Kind::CharDevice | Kind::BlockDevice => EntryKind::Device,
        }
    }
}

/// The project's entry at a path as it was when the change set was made: an apply refuses to
/// replace it if it is no longer exactly this (`--force` overrides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // `lstat` fields; times in nanoseconds since the epoch.
pub struct BaseState {
    pub kind: EntryKind,
    pub mode: u32,
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl BaseState {
    fn of(st: &palisade_linux::fs::Stat) -> BaseState {
        BaseState {
            kind: EntryKind::of(st.kind),
            mode: st.mode,
            size: st.size,
            dev: st.dev,
            ino: st.ino,
            mtime_ns: st.mtime_ns as i64,
            ctime_ns: st.ctime_ns as i64,
        }
    }
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the project directory ([`encode_path`]'s form).
    pub path: String,
    /// What happened at the path.
    pub change: Change,
    /// What is there now (`none` when deleted).
    pub kind: EntryKind,
    /// Permission bits of the new entry (with set-id and sticky bits, which are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Bytes of a new file's contents.
    #[serde(default)]
    pub size: u64,
    /// Where the contents start in the change set's `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// SHA-256 of the contents, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A symbolic link's target ([`encode_path`]'s form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What the project had there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseState>,
    /// Why palisade never applies this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The project changed here during the run: applying would overwrite that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// The protected path it is at or under: applied only when a path given to apply names it
    /// or something in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protected: Option<String>,
    /// What host tools do with it later without asking: applied only with `--include-risky` or
    /// when named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risky: Option<String>,
}

/// Counts over a change set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // Counts of entries, named for what they count.
pub struct Summary {
    pub entries: u64,
    pub added: u64,
    pub modified: u64,
    pub deleted: u64,
    pub mode: u64,
    pub replaced: u64,
    /// Deleted and added files with the same contents, shown as renames (`renames`).
    pub renamed: u64,
    pub symlinks: u64,
    pub refused: u64,
    pub conflicts: u64,
    pub protected: u64,
    pub risky: u64,
    /// Bytes of new contents.
    pub bytes: u64,
    /// The first paths, in tree order (at most [`FIRST_PATHS`]).
    pub first_paths: Vec<String>,
}

/// How many paths a summary names.
pub const FIRST_PATHS: usize = 20;

impl Summary {
    fn count(&mut self, e: &Entry) {
        self.entries += 1;
        match e.change {
            Change::Added => self.added += 1,
            Change::Modified => self.modified += 1,
            Change::Deleted => self.deleted += 1,
            Change::Mode => self.mode += 1,
            Change::Replaced => self.replaced += 1,
        }
        self.symlinks += u64::from(e.kind == EntryKind::Symlink);
        self.refused += u64::from(e.refused.is_some());
        self.conflicts += u64::from(e.conflict.is_some());
        self.protected += u64::from(e.protected.is_some());
        self.risky += u64::from(e.risky.is_some());
        self.bytes += e.size;
        if self.first_paths.len() < FIRST_PATHS {
            self.first_paths.push(e.path.clone());
        }
    }
}

/// A rename found by contents (`renamed where detectable`): the deletion of `from` and the
/// addition of `to` are both in the entries, and applied as such.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // The two paths.
pub struct Renamed {
    pub from: String,
    pub to: String,
}

/// How the run that made a change set ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // As in the report.
pub struct RunResult {
    /// The report's status (`ok`, `exit`, `timeout`, …).
    pub status: String,
    pub exit_code: Option<i32>,
}

/// When and how much of a change set was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRecord {
    /// Seconds since the epoch.
    pub at: u64,
    /// Entries applied.
    pub entries: u64,
    /// Paths given to apply (none: all of it).
    pub paths: Vec<String>,
}

/// `meta.json` of a change set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // Fields not documented below are named for what they hold.
pub struct Meta {
    pub version: u32,
    pub id: String,
    /// The project directory (canonical, [`encode_path`]'s form), its device and inode.
    pub dir: String,
    pub dir_dev: u64,
    pub dir_ino: u64,
    /// When the run began (the file-system clock, ns since the epoch): a project file changed at
    /// or after it was changed during the run.
    pub started_ns: i64,
    /// When the change set was made, seconds since the epoch.
    pub created: u64,
    pub run: RunResult,
    /// The run's protected paths.
    pub protected: Vec<String>,
    pub summary: Summary,
    pub renames: Vec<Renamed>,
    /// Bytes of `data`.
    pub data_bytes: u64,
    /// Set when the capture stopped at a bound: the entries are not the whole change, and the
    /// change set cannot be applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// Set once it was applied (or partly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedRecord>,
}

const META_VERSION: u32 = 1;
/// Most bytes of `meta.json` read back (its paths are bounded; the rest is counts).
const MAX_META: u64 = 4 << 20;
/// Most bytes of one line of `entries.jsonl` (a path and a link target of at most 4 KiB each,
/// escaped).
const MAX_LINE: usize = 64 * 1024;
/// Longest path palisade keeps in a change set, in bytes (the kernel's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// Encodes path bytes as a string that decodes back to the same bytes: UTF-8 as it is, `\` as
/// `\\`, every byte of invalid UTF-8 as `\xNN`.
///
/// ```
/// use palisade::workspace::{decode_path, encode_path};
/// assert_eq!(encode_path(b"src/ma\\in.rs"), "src/ma\\\\in.rs");
/// assert_eq!(encode_path(b"bad\xff"), "bad\\xff");
/// assert_eq!(decode_path("bad\\xff").unwrap(), b"bad\xff");
/// ```
pub fn encode_path(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut rest = b;
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, 0),
            Err(e) => (
                std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default(),
                e.error_len().unwrap_or(rest.len() - e.valid_up_to()),
            ),
        };
        for ch in valid.chars() {
            if ch == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(ch);
            }
        }
        let at = valid.len();
        for &x in &rest[at..at + bad] {
            out.push_str(&format!("\\x{x:02x}"));
        }
        rest = &rest[at + bad..];
    }
    out
}

/// The bytes [`encode_path`] encoded; `None` for a string it cannot have made.
pub fn decode_path(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            Some(b'x') => {
                let hex = std::str::from_utf8(b.get(i + 2..i + 4)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The components of a change set's path, checked: relative, no empty, `.` or `..` component,
/// no NUL, at most [`MAX_PATH`] bytes. `None` for anything else (a stored entry that is not one
/// palisade wrote).
pub fn path_components(path: &str) -> Option<Vec<Vec<u8>>> {
    let b = decode_path(path)?;
    if b.is_empty() || b.len() > MAX_PATH || b.contains(&0) || b[0] == b'/' {
        return None;
    }
    let comps: Vec<Vec<u8>> = b.split(|&c| c == b'/').map(<[u8]>::to_vec).collect();
    if comps
        .iter()
        .any(|c| c.is_empty() || c == b"." || c == b".." || c.len() > 255)
    {
        return None;
    }
    Some(comps)
}

/// Whether `path` is `prefix` or under it (both in [`encode_path`]'s form).
pub fn is_under(path: &str, prefix: &str) -> bool {
    path == prefix
        || (path.len() > prefix.len()
            && path.starts_with(prefix)
            && path.as_bytes()[prefix.len()] == b'/')
}

/// Files host tools run or load later without asking, beyond the protected paths (which are all
/// risky too): how each is matched, the pattern, and what it would run.
#[derive(Clone, Copy)]
enum Pattern {
    /// The path itself or anything under it, from the project's root.
    Root(&'static str),
    /// A file or directory of this name anywhere.
    Name(&'static str),
    /// A name ending so, anywhere.
    Suffix(&'static str),
}

const RISKY: &[(Pattern, &str)] = &[
    (
        Pattern::Root(".github/workflows"),
        "CI runs these workflows on the next push",
    ),
    (
        Pattern::Root(".gitlab-ci.yml"),
        "CI runs it on the next push",
    ),
    (
        Pattern::Root(".gitattributes"),
        "selects the filter and diff commands git runs",
    ),
    (
        Pattern::Root(".gitmodules"),
        "submodule URLs and update commands git follows",
    ),
    (
        Pattern::Root(".cargo/config.toml"),
        "cargo runs its runner and build settings",
    ),
    (
        Pattern::Root(".cargo/config"),
        "cargo runs its runner and build settings",
    ),
    (
        Pattern::Root("rust-toolchain.toml"),
        "the toolchain rustup runs for cargo here",
    ),
    (
        Pattern::Root("rust-toolchain"),
        "the toolchain rustup runs for cargo here",
    ),
    (
        Pattern::Root(".tool-versions"),
        "the tool versions asdf or mise switch to",
    ),
    (
        Pattern::Root(".mise.toml"),
        "mise runs its hooks and env scripts on entering",
    ),
    (
        Pattern::Root(".python-version"),
        "the Python pyenv switches to",
    ),
    (Pattern::Root(".nvmrc"), "the Node nvm switches to"),
    (
        Pattern::Name(".git"),
        "a repository: its config and hooks run on git commands",
    ),
    (
        Pattern::Name(".envrc"),
        "direnv runs it on entering the directory",
    ),
    (
        Pattern::Name(".venv"),
        "a virtual environment: editors start its python on their own",
    ),
    (
        Pattern::Name("site-packages"),
        "installed Python packages, loaded at every start",
    ),
    (
        Pattern::Name("dist-packages"),
        "installed Python packages, loaded at every start",
    ),
    (
        Pattern::Name("pyvenv.cfg"),
        "marks a virtual environment whose python editors start",
    ),
    (
        Pattern::Name("sitecustomize.py"),
        "imported at every Python start",
    ),
    (
        Pattern::Name("usercustomize.py"),
        "imported at every Python start",
    ),
    (
        Pattern::Suffix(".pth"),
        "Python runs its import lines at every start",
    ),
    (
        Pattern::Name(".npmrc"),
        "npm's script-shell, node-options and registry",
    ),
    (Pattern::Name(".yarnrc"), "yarn's settings"),
    (
        Pattern::Name(".yarnrc.yml"),
        "the script yarn runs in place of itself",
    ),
    (
        Pattern::Name(".pnpmfile.cjs"),
        "pnpm runs its hooks on install",
    ),
    (Pattern::Name(".gdbinit"), "gdb runs it"),
    (Pattern::Name(".lldbinit"), "lldb runs it"),
    (Pattern::Name(".pdbrc"), "pdb runs its commands"),
    (
        Pattern::Name(".exrc"),
        "Vim and Neovim run it with 'exrc' set",
    ),
    (Pattern::Name(".nvim.lua"), "Neovim runs it with 'exrc' set"),
];

/// Why host tools would run or load `path` later without asking, if they would: the protected
/// defaults (whatever the run unprotected) and the patterns above.
pub fn risky(path: &str) -> Option<String> {
    for (p, why) in palisade_policy::protect::DEFAULT_PROTECTED {
        if is_under(path, p) {
            return Some(format!("{p}: {why}"));
        }
    }
    let last = path.rsplit('/').next().unwrap_or(path);
    for (pat, why) in RISKY {
        let hit = match pat {
            Pattern::Root(r) => is_under(path, r),
            Pattern::Name(n) => path.split('/').any(|c| c == *n),
            Pattern::Suffix(s) => last.ends_with(s),
        };
        if hit {
            let what = match pat {
                Pattern::Root(x) | Pattern::Name(x) => *x,
                Pattern::Suffix(x) => *x,
            };
            return Some(format!("{what}: {why}"));
        }
    }
    None
}

/// The protected path `path` is at or under, if any.
pub fn protected_by<'a>(path: &str, protected: &'a [String]) -> Option<&'a str> {
    protected
        .iter()
        .filter(|p| is_under(path, p))
        .max_by_key(|p| p.len())
        .map(String::as_str)
}

/// Why a new entry of this kind, mode and link target is never applied.
pub fn refusal(path: &str, kind: EntryKind, mode: u32, target: Option<&[u8]>) -> Option<String> {
    match kind {
        EntryKind::Fifo => return Some("a fifo: palisade never creates one".into()),
        EntryKind::Socket => return Some("a socket: palisade never creates one".into()),
        EntryKind::Device => return Some("a device node: palisade never creates one".into()),
        _ => {}
    }
    if mode & 0o6000 != 0 {
        return Some(format!(
            "mode {mode:o} is set-user-ID or set-group-ID: palisade never creates such a file"
        ));
    }
    if mode & 0o1000 != 0 && kind != EntryKind::Dir {
        return Some(format!("mode {mode:o} has the sticky bit on a file"));
    }
    if let Some(t) = target {
        if let Some(why) = link_escapes(path, t) {
            return Some(why);
        }
    }
    None
}

/// Why a symbolic link at `path` with target `t` is refused by its words: empty, absolute, or
/// with a `..` after a name or above the project's root ([`links::words`]; where it leads
/// through other links is [`links::Judge`]'s to say).
fn link_escapes(path: &str, t: &[u8]) -> Option<String> {
    links::words(path.matches('/').count(), t)
        .err()
        .map(|f| f.own(t))
}

/// Hex of a SHA-256 digest.
fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A change-set id: what [`new_id`] makes.
fn check_id(id: &str) -> Result<(), WorkspaceError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(WorkspaceError::BadId { id: id.to_owned() })
    }
}

/// `YYYYMMDD-HHMMSS-xxxxxx` (UTC, six random letters and digits).
fn new_id(now: u64) -> io::Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut r = [0u8; 6];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut r)?;
    let suffix: String = r
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    let (y, mo, d, h, mi, s) = civil(now);
    Ok(format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}-{suffix}"))
}

/// Seconds since the epoch as UTC year, month, day, hour, minute, second.
fn civil(t: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (t / 86400) as i64;
    let rem = t % 86400;
    // Howard Hinnant's days-from-civil, inverted.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Where change sets are kept: one directory per change set, named by its id.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// One change set as [`Store::list`] shows it.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)] // As in the change set's `Meta`.
pub struct Listing {
    pub id: String,
    /// The project directory.
    pub dir: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// Bytes on disk.
    pub bytes: u64,
    pub run: RunResult,
    pub summary: Summary,
    pub applied: Option<AppliedRecord>,
}

/// Prefix of a change set being written; renamed to its id once complete.
const PARTIAL: &str = ".partial-";

impl Store {
    /// The store at `dir` (made when the first change set is kept).
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// The default place: `/var/lib/palisade/changes` for root, else
    /// `$XDG_STATE_HOME/palisade/changes` or `~/.local/state/palisade/changes` (`HOME` from the
    /// environment, else the password database). The library calls this only when its caller
    /// gave no store.
    pub fn default_dir() -> Option<PathBuf> {
        if palisade_linux::host::euid() == 0 {
            return Some(PathBuf::from("/var/lib/palisade/changes"));
        }
        let abs = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        if let Some(x) = std::env::var_os("XDG_STATE_HOME").and_then(abs) {
            return Some(x.join("palisade/changes"));
        }
        let home = std::env::var_os("HOME").and_then(abs)?;
        Some(home.join(".local/state/palisade/changes"))
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn err(&self, source: io::Error) -> WorkspaceError {
        WorkspaceError::Store {
            path: self.dir.clone(),
            source,
        }
    }

    /// The store directory, made (mode 0700) if missing, opened without following links past
    /// its canonical path.
    fn open_dir(&self, create: bool) -> Result<Dir, WorkspaceError> {
        if create {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| self.err(e))?;
        }
        let canon = self.dir.canonicalize().map_err(|e| self.err(e))?;
        let d = Dir::open_path(&canon).map_err(|e| self.err(e))?;
        // Only its owner may put a change set there: `apply` writes where a change set says.
        let st = d.stat_self().map_err(|e| self.err(e))?;
        if st.uid != palisade_linux::host::euid() || st.mode & 0o022 != 0 {
            return Err(self.err(io::Error::other(format!(
                "owned by uid {} with mode {:o}: a store must be this user's own and writable by no one else (another user could plant change sets in it)",
                st.uid, st.mode
            ))));
        }
        Ok(d)
    }

    /// Checks an existing store the way every use of it does (this user's own, writable by no
    /// one else); a store not made yet passes.
    pub fn check(&self) -> Result<(), WorkspaceError> {
        match self.open_dir(false) {
            Err(WorkspaceError::Store { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            r => r.map(drop),
        }
    }

    /// The change set `id`.
    pub fn get(&self, id: &str) -> Result<ChangeSet, WorkspaceError> {
        check_id(id)?;
        let unknown = || WorkspaceError::Unknown {
            id: id.to_owned(),
            store: self.dir.clone(),
        };
        let store = match self.open_dir(false) {
            Ok(d) => d,
            Err(WorkspaceError::Store { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                return Err(unknown())
            }
            Err(e) => return Err(e),
        };
        let dir = match store.open_dir(id.as_bytes()) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(unknown()),
            Err(e) => return Err(self.err(e)),
        };
        ChangeSet::open(id, dir)
    }

    /// Every complete change set, oldest first. One that cannot be read is listed with what is
    /// known (its id).
    pub fn list(&self) -> Result<Vec<Listing>, WorkspaceError> {
        let store = match self.open_dir(false) {
            Ok(d) => d,
            Err(WorkspaceError::Store { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for name in store.names(100_000).map_err(|e| self.err(e))? {
            let Ok(id) = String::from_utf8(name) else {
                continue;
            };
            if check_id(&id).is_err() {
                continue;
            }
            let Ok(cs) = self.get(&id) else {
                continue;
            };
            out.push(Listing {
                id: id.clone(),
                dir: cs.meta.dir.clone(),
                created: cs.meta.created,
                bytes: cs.disk_bytes(),
                run: cs.meta.run.clone(),
                summary: cs.meta.summary.clone(),
                applied: cs.meta.applied.clone(),
            });
        }
        out.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(out)
    }

    /// Removes the change set `id`.
    pub fn discard(&self, id: &str) -> Result<(), WorkspaceError> {
        let cs = self.get(id)?;
        cs.lock()?;
        let store = self.open_dir(false)?;
        remove_tree(&store, id.as_bytes(), 0).map_err(|e| self.err(e))
    }

    /// Removes change sets past `r` (oldest first), never `keep`; returns the ids removed.
    pub fn prune(&self, r: &Retention, keep: Option<&str>) -> Result<Vec<String>, WorkspaceError> {
        let list = self.list()?;
        let now = now_secs();
        let mut total: u64 = list.iter().map(|l| l.bytes).sum();
        let mut count = list.len();
        let mut removed = Vec::new();
        for l in &list {
            if Some(l.id.as_str()) == keep {
                continue;
            }
            let old = now.saturating_sub(l.created) > r.max_age.as_secs();
            if !(old || count > r.max_count || total > r.max_bytes) {
                continue;
            }
            match self.discard(&l.id) {
                Ok(()) => {
                    total = total.saturating_sub(l.bytes);
                    count -= 1;
                    removed.push(l.id.clone());
                }
                Err(WorkspaceError::Busy { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }
}

/// Removes `name` in `dir` and everything under it, never following a link (a link is removed
/// as itself). Depth is bounded: deeper than 4096 directories is an error.
fn remove_tree(dir: &Dir, name: &[u8], depth: usize) -> io::Result<()> {
    let Some(st) = dir.stat(name)? else {
        return Ok(());
    };
    if st.kind != Kind::Dir {
        return dir.unlink(name, false);
    }
    if depth > 4096 {
        return Err(io::Error::other("a directory tree deeper than 4096"));
    }
    let sub = dir.open_dir(name)?;
    // A directory without write or search permission for its owner (chmod 555 inside the run)
    // is opened up first: it is about to go.
    if st.mode & 0o700 != 0o700 {
        let _ = sub.chmod_self(st.mode | 0o700);
    }
    for n in sub.names(usize::MAX)? {
        remove_tree(&sub, &n, depth + 1)?;
    }
    dir.unlink(name, true)
}

/// A kept change set, opened.
#[derive(Debug)]
pub struct ChangeSet {
    id: String,
    dir: Dir,
    meta: Meta,
}

impl ChangeSet {
    fn open(id: &str, dir: Dir) -> Result<ChangeSet, WorkspaceError> {
        let damaged = |what: String| WorkspaceError::Damaged {
            id: id.to_owned(),
            what,
        };
        let f = dir
            .open_file(b"meta.json")
            .map_err(|e| damaged(format!("meta.json: {e}")))?;
        let mut text = Vec::new();
        f.take(MAX_META + 1)
            .read_to_end(&mut text)
            .map_err(|e| damaged(format!("meta.json: {e}")))?;
        if text.len() as u64 > MAX_META {
            return Err(damaged("meta.json is too large".into()));
        }
        let meta: Meta =
            serde_json::from_slice(&text).map_err(|e| damaged(format!("meta.json: {e}")))?;
        if meta.version != META_VERSION || meta.id != id {
            return Err(damaged("meta.json is not this change set's".into()));
        }
        Ok(ChangeSet {
            id: id.to_owned(),
            dir,
            meta,
        })
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// What the run was and what it changed, in counts.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The project directory, decoded.
    pub fn project_dir(&self) -> PathBuf {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(
            decode_path(&self.meta.dir).unwrap_or_default(),
        ))
    }

    fn damaged(&self, what: impl Into<String>) -> WorkspaceError {
        WorkspaceError::Damaged {
            id: self.id.clone(),
            what: what.into(),
        }
    }

    /// Bytes on disk (its three files).
    fn disk_bytes(&self) -> u64 {
        [&b"meta.json"[..], b"entries.jsonl", b"data"]
            .iter()
            .filter_map(|n| self.dir.stat(n).ok().flatten())
            .map(|s| s.size)
            .sum()
    }

    /// Holds the change set's lock for as long as it lives; `Busy` when another process holds it.
    fn lock(&self) -> Result<Dir, WorkspaceError> {
        let d = self.dir.reopen().map_err(|e| self.damaged(e.to_string()))?;
        match d.lock() {
            Ok(()) => Ok(d),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(WorkspaceError::Busy {
                id: self.id.clone(),
            }),
            Err(e) => Err(self.damaged(e.to_string())),
        }
    }

    /// The entries, in tree order (a directory before what is in it), read one line at a time:
    /// memory stays flat whatever the change set's size.
    pub fn entries(&self) -> Result<Entries, WorkspaceError> {
        let f = self
            .dir
            .open_file(b"entries.jsonl")
            .map_err(|e| self.damaged(format!("entries.jsonl: {e}")))?;
        Ok(Entries {
            id: self.id.clone(),
            lines: io::BufReader::new(f),
            buf: Vec::new(),
        })
    }

    /// The change set's `data`, checked to be a regular file with one name.
    fn data(&self) -> Result<std::fs::File, WorkspaceError> {
        let f = self
            .dir
            .open_file(b"data")
            .map_err(|e| self.damaged(format!("data: {e}")))?;
        let m = f.metadata().map_err(|e| self.damaged(e.to_string()))?;
        use std::os::unix::fs::MetadataExt;
        if m.nlink() != 1 || m.mode() & 0o6000 != 0 {
            return Err(self.damaged("data has more than one name, or a set-id mode"));
        }
        if m.len() != self.meta.data_bytes {
            return Err(self.damaged(format!(
                "data holds {} bytes, meta.json says {}",
                m.len(),
                self.meta.data_bytes
            )));
        }
        Ok(f)
    }

    /// The new contents of `e`, read from `data` and checked against its hash (at most
    /// `max` bytes: `None` past it).
    fn contents(
        &self,
        data: &std::fs::File,
        e: &Entry,
        max: u64,
    ) -> Result<Option<Vec<u8>>, WorkspaceError> {
        if e.size > max {
            return Ok(None);
        }
        let mut buf = vec![0u8; e.size as usize];
        let off = e.offset.unwrap_or(0);
        if off
            .checked_add(e.size)
            .is_none_or(|end| end > self.meta.data_bytes)
        {
            return Err(self.damaged(format!("{}: contents out of range", e.path)));
        }
        use std::os::unix::fs::FileExt;
        data.read_exact_at(&mut buf, off)
            .map_err(|x| self.damaged(format!("{}: {x}", e.path)))?;
        let sum = {
            use sha2::Digest;
            hex(&sha2::Sha256::digest(&buf))
        };
        if Some(&sum) != e.sha256.as_ref() {
            return Err(self.damaged(format!("{}: contents do not match their hash", e.path)));
        }
        Ok(Some(buf))
    }
}

/// The entries of a change set, one at a time ([`ChangeSet::entries`]).
pub struct Entries {
    id: String,
    lines: io::BufReader<std::fs::File>,
    buf: Vec<u8>,
}

impl Iterator for Entries {
    type Item = Result<Entry, WorkspaceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.buf.clear();
        let damaged = |what: String| WorkspaceError::Damaged {
            id: self.id.clone(),
            what,
        };
        let r = (&mut self.lines)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buf);
        match r {
            Ok(0) => None,
            Ok(_) if self.buf.len() > MAX_LINE => Some(Err(damaged(
                "entries.jsonl has a line longer than palisade writes".into(),
            ))),
            Ok(_) => Some(
                serde_json::from_slice::<Entry>(&self.buf)
                    .map_err(|e| damaged(format!("entries.jsonl: {e}")))
                    .and_then(|e| match path_components(&e.path) {
                        Some(_) => Ok(e),
                        None => Err(damaged(format!(
                            "entries.jsonl names `{}`, not a path inside the project",
                            palisade_policy::untrusted::escape(e.path.as_bytes(), 200)
                        ))),
                    }),
            ),
            Err(e) => Some(Err(damaged(format!("entries.jsonl: {e}")))),
        }
    }
}

/// What the report says of a workspace run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkspaceReport {
    /// The project directory.
    pub dir: String,
    /// The change set's id (`palisade changes ID`); `None` when there was nothing to keep
    /// (no change) or it could not be kept (`error`).
    pub change_set: Option<String>,
    /// Where it is kept.
    pub store: Option<String>,
    /// What it holds, in counts, with the first paths.
    pub summary: Summary,
    /// Deletions and additions of the same contents.
    pub renames: Vec<Renamed>,
    /// The capture stopped at a bound (see `Meta::incomplete`).
    pub incomplete: Option<String>,
    /// `run --apply`: what was asked, and what became of it.
    pub apply: ApplyMode,
    /// What was applied.
    pub applied: Option<Applied>,
    /// Why it was not applied, when asked to.
    pub apply_error: Option<String>,
    /// Why the changes could not be kept.
    pub error: Option<String>,
    /// Change sets removed by the store's retention limits.
    pub pruned: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_encode_and_decode_losslessly() {
        for b in [
            &b"plain/path.txt"[..],
            b"back\\slash",
            b"\xff\xfe/ok",
            b"caf\xc3\xa9",
            b"tab\tand\nnewline",
        ] {
            assert_eq!(decode_path(&encode_path(b)).unwrap(), b);
        }
        assert_eq!(decode_path("bad\\q"), None);
        assert_eq!(decode_path("bad\\x4"), None);
        assert_eq!(
            path_components("a/b").unwrap(),
            [b"a".to_vec(), b"b".to_vec()]
        );
        for bad in ["", "/etc", "a//b", "a/../b", "./a", "a/.", "a\\x00b"] {
            assert_eq!(path_components(bad), None, "{bad}");
        }
    }

    #[test]
    fn refusals_and_risks_name_their_reason() {
        let r = |p: &str, k, m, t: Option<&[u8]>| refusal(p, k, m, t);
        assert!(r("a", EntryKind::File, 0o644, None).is_none());
        assert!(r("a", EntryKind::File, 0o4755, None)
            .unwrap()
            .contains("set-user-ID"));
        assert!(r("a", EntryKind::Fifo, 0o644, None)
            .unwrap()
            .contains("fifo"));
        assert!(r("d/l", EntryKind::Symlink, 0o777, Some(b"../x")).is_none());
        assert!(r("d/l", EntryKind::Symlink, 0o777, Some(b"../../x"))
            .unwrap()
            .contains("above its root"));
        assert!(r("l", EntryKind::Symlink, 0o777, Some(b"/etc/passwd"))
            .unwrap()
            .contains("absolute"));
        assert!(r("l", EntryKind::Symlink, 0o777, Some(b"a/../../b")).is_some());
        assert!(r("l", EntryKind::Symlink, 0o777, Some(b"a/b/../c"))
            .unwrap()
            .contains("after a name"));
        assert!(r("d/e/l", EntryKind::Symlink, 0o777, Some(b"../../a/b")).is_none());
        assert!(risky(".git/hooks/pre-commit").unwrap().starts_with(".git"));
        assert!(risky("lib/python3/site-packages/evil.pth").is_some());
        assert!(risky("src/x.pth").unwrap().contains(".pth"));
        assert!(risky("sub/.envrc").is_some());
        assert!(risky(".github/workflows/ci.yml").is_some());
        assert!(risky("src/main.rs").is_none());
        assert!(risky(".gitignore").is_none());
        let prot = vec![".git".to_owned(), ".git/hooks".to_owned()];
        assert_eq!(protected_by(".git/hooks/x", &prot), Some(".git/hooks"));
        assert_eq!(protected_by(".gitx", &prot), None);
    }

    #[test]
    fn ids_are_dated_and_checked() {
        let id = new_id(1_764_806_400).unwrap(); // 2025-12-04 00:00:00 UTC
        assert!(id.starts_with("20251204-000000-"), "{id}");
        check_id(&id).unwrap();
        for bad in ["", "../x", "A", "a/b", "-x", &"x".repeat(65)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(951_782_400), (2000, 2, 29, 0, 0, 0));
    }
}
