//! Who owns a run cgroup, and when a left-over one may be removed.
//!
//! A supervisor that is killed (`SIGKILL`, OOM, a crash) cannot remove its run cgroups; a later
//! supervisor must, and it must never remove the cgroup of a run that is still going. The owner may
//! be in another pid namespace (a container and the host, two containers) sharing one cgroupfs, so
//! "is its pid in `/proc`" proves nothing: the pid may not be visible here, or may belong to
//! someone else, and a pid namespace's inode number is reused once the namespace is gone.
//!
//! What survives namespaces is a lock the kernel drops for us. Each directory of a run is
//! `flock`ed (exclusive) through a descriptor its supervisor keeps open, close-on-exec, until the
//! directory is removed. `flock` belongs to the open file, not to a pid: it holds across pid, mount
//! and cgroup namespaces (the same kernfs inode behind every mount of the hierarchy), and the
//! kernel releases it when the last descriptor closes, so when the supervisor dies however it dies.
//! A cleaner that takes the lock without waiting has proof that no live process holds it; one that
//! cannot take it leaves the directory alone. The cleaner then kills what is left (v2
//! `cgroup.kill`) and removes the directory while it holds the lock.
//!
//! Creation is not atomic with locking (`mkdir`, then `open` and `flock`), so:
//! - run directories are made with mode 0700: another user cannot open one to take its lock first
//!   (a local denial of service against root's runs otherwise);
//! - after locking, the supervisor checks that the path still names the directory it locked. A
//!   cleaner of the same user that took the lock in between has removed it or is about to; the
//!   supervisor then starts over with a new name (at most [`ATTEMPTS`] times), so a race costs a
//!   retry, never a run without a cgroup.
//!
//! Names are `run-PID-TOKEN-SEQ`: `TOKEN` is 64 random bits drawn once per process, so two
//! supervisors with the same pid in different pid namespaces cannot pick the same name; the pid
//! is only there for people reading the tree. Directories named otherwise (`run-PID-SEQ` from
//! earlier palisade versions, which judged liveness by pid) are never touched.
//!
//! Stale cleanup is run once per process and parent ([`once`]), not before every run: it reads the
//! whole parent directory. A finished run's directory that the kernel still reports busy is not
//! waited for in the run's thread beyond a few milliseconds ([`remove`]): it is kept, locked, on a
//! list that the process's next run retries; if the process exits first, the lock goes with it and
//! the next supervisor's cleanup removes the directory.

use crate::{io_at, CgroupError};
use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How many names a supervisor tries when a concurrent cleanup removes the directory it just made.
pub(crate) const ATTEMPTS: usize = 3;

/// The pauses between attempts to remove a finished run's directory that the kernel reports busy:
/// 6.3 ms in all, after which the directory is left for later ([`PENDING`]).
pub(crate) const REMOVE_PAUSES_US: [u64; 6] = [100, 200, 400, 800, 1600, 3200];

/// At most this many busy directories wait for removal in one process; beyond it the oldest is
/// let go (its lock released, so the next supervisor's cleanup removes it).
const MAX_PENDING: usize = 256;

/// This process's random token, drawn once.
fn token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut b = [0u8; 8];
        match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
            Ok(8) => u64::from_ne_bytes(b),
            // getrandom(2) exists since Linux 3.17 and blocks rather than fail; this is for form.
            _ => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
            }
        }
    })
}

/// The next run cgroup name of this process: `run-PID-TOKEN-SEQ`.
pub(crate) fn next_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "run-{}-{:016x}-{}",
        std::process::id(),
        token(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether `name` is a run cgroup of this protocol (`run-PID-TOKEN-SEQ`, the token 16 hex digits).
pub(crate) fn is_run_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("run-") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    matches!(parts.as_slice(), [pid, tok, seq]
        if digits(pid) && digits(seq) && tok.len() == 16 && tok.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A run directory this process made and holds locked. Dropping it releases the lock (and leaves
/// the directory: use [`remove`]).
#[derive(Debug)]
pub(crate) struct Owned {
    pub(crate) path: PathBuf,
    _lock: File,
}

impl Owned {
    /// Opens control file `name` of this directory through the descriptor held, as `std::fs`
    /// would (for writing: created if missing, truncated, which a cgroupfs file ignores): one
    /// lookup instead of a walk of the whole path on each of a run's dozen reads and writes, and
    /// always in the directory made, whatever its path names now.
    pub(crate) fn open(&self, name: &str, write: bool) -> std::io::Result<File> {
        use rustix::fs::{Mode, OFlags};
        let flags = if write {
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::openat(
            &self._lock,
            name,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o666),
        )?;
        Ok(File::from(fd))
    }

    /// The directory's descriptor (the one its lock is taken through).
    pub(crate) fn dir_fd(&self) -> &File {
        &self._lock
    }

    /// Whether this directory has an entry `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        rustix::fs::statat(&self._lock, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }
}

/// Why a run directory could not be made and locked.
pub(crate) enum MakeError {
    /// A concurrent cleanup took the directory between `mkdir` and the lock: try another name.
    Raced,
    Failed(CgroupError),
}

impl From<CgroupError> for MakeError {
    fn from(e: CgroupError) -> Self {
        MakeError::Failed(e)
    }
}

fn open_dir(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECTORY.bits() as i32)
        .open(path)
}

fn try_lock(f: &File) -> Result<bool, Errno> {
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes run directory `path` (mode 0700) and locks it, checking that it is still there once
/// locked.
pub(crate) fn make(path: &Path) -> Result<Owned, MakeError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(io_at("create", path))?;
    match open_dir(path) {
        Ok(f) => lock_opened(path, f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(MakeError::Raced),
        Err(e) => Err(io_at("open", path)(e).into()),
    }
}

/// Takes the lock of the directory just made at `path` and opened as `f`, and checks that the path
/// still names it: a cleaner may have locked and removed it in between.
fn lock_opened(path: &Path, f: File) -> Result<Owned, MakeError> {
    match try_lock(&f) {
        Ok(true) => {}
        Ok(false) => return Err(MakeError::Raced),
        Err(e) => return Err(io_at("lock", path)(e.into()).into()),
    }
    // Locked: no cleaner can remove it from now on. Was it removed before?
    let ours = f.metadata().map_err(io_at("inspect", path))?;
    match std::fs::metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (ours.dev(), ours.ino()) => Ok(Owned {
            path: path.to_owned(),
            _lock: f,
        }),
        _ => Err(MakeError::Raced),
    }
}

fn is_busy(e: &std::io::Error) -> bool {
    Errno::from_io_error(e) == Some(Errno::BUSY)
}

/// Removes a run's directory; if the kernel says it is busy, removes its child cgroups (a
/// session's exec cgroups, a v2 run's leaf: `crate::exec`) and tries once more. A run without
/// children costs one `rmdir`, as before.
fn remove_run_dir(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(path) {
        Err(e) if is_busy(&e) => {
            crate::exec::remove_children(path);
            std::fs::remove_dir(path)
        }
        r => r,
    }
}

/// [`remove_run_dir`] for a directory left busy earlier, or a dead supervisor's: past the mark of
/// held memory cgroups, what is still charged to it is given back first (`crate::held`).
fn remove_late(path: &Path) -> std::io::Result<()> {
    crate::held::before_late_removal(path);
    remove_run_dir(path)
}

/// Removes a run directory (its processes gone). While the kernel reports it busy, retries for a
/// few milliseconds if `wait`, then keeps it locked on a list the process's next run retries.
/// Returns whether it is gone (`false`: kept for later).
pub(crate) fn remove(o: Owned, wait: bool) -> Result<bool, CgroupError> {
    let pauses = if wait { &REMOVE_PAUSES_US[..] } else { &[] };
    for &pause in std::iter::once(&0).chain(pauses) {
        if pause > 0 {
            std::thread::sleep(Duration::from_micros(pause));
        }
        match remove_run_dir(&o.path) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) if is_busy(&e) => {}
            Err(e) => return Err(io_at("remove", &o.path)(e)),
        }
    }
    defer(o);
    Ok(false)
}

/// Busy directories this process still owns and will remove later.
static PENDING: Mutex<Vec<Owned>> = Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<Owned>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

fn defer(o: Owned) {
    let mut p = pending();
    if p.len() >= MAX_PENDING {
        p.remove(0);
    }
    p.push(o);
}

/// One removal attempt for each directory left busy earlier; called as a run starts. Returns how
/// many are still waiting.
pub(crate) fn retry_pending() -> usize {
    let mut p = pending();
    p.retain(|o| match remove_late(&o.path) {
        Ok(()) => false,
        Err(e) => is_busy(&e),
    });
    p.len()
}

/// Removes the run directories under `parents` whose owner is provably gone (their lock can be
/// taken), after writing `1` to their `kill_file` where there is one (v2 `cgroup.kill`: the owner
/// is gone, so whatever still runs there is an orphan). One attempt each, no waiting: a directory
/// still busy after the kill is kept locked and retried with this process's next run. Returns the
/// directories removed.
pub(crate) fn clean(parents: &[&Path], kill_file: Option<&str>) -> Vec<PathBuf> {
    retry_pending();
    let mut removed = Vec::new();
    for parent in parents {
        let Ok(rd) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_name().to_str().is_some_and(is_run_name) {
                continue;
            }
            let path = e.path();
            let Ok(f) = open_dir(&path) else {
                continue;
            };
            if try_lock(&f) != Ok(true) {
                continue; // its supervisor is alive (or another cleaner is at it)
            }
            if let Some(k) = kill_file {
                // Opened, never created: the kernel makes the file, where it has one.
                let kill = std::fs::OpenOptions::new().write(true).open(path.join(k));
                let _ = kill.and_then(|mut f| std::io::Write::write_all(&mut f, b"1"));
            }
            match remove_late(&path) {
                Ok(()) => removed.push(path),
                Err(e) if is_busy(&e) => defer(Owned { path, _lock: f }),
                Err(_) => {}
            }
        }
    }
    removed
}

/// True the first time it is called for `key` in this process.
pub(crate) fn once(key: &Path) -> bool {
    static DONE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if done.iter().any(|d| d == key) {
        return false;
    }
    done.push(key.to_owned());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("palisade-owner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_carry_pid_token_and_sequence() {
        let (a, b) = (next_name(), next_name());
        assert_ne!(a, b);
        assert!(is_run_name(&a) && is_run_name(&b), "{a} {b}");
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2], format!("{:016x}", token()));
        // Earlier versions' names, palisade's own directories and near misses are not run names.
        for n in [
            "run-12-3",
            "user-1000",
            "palisade-procs",
            "run-1-0123456789abcdef",
            "run-1-0123456789abcdeg-2",
            "run-1-0123456789abcde-2",
            "run-x-0123456789abcdef-2",
            "run-1-0123456789abcdef-2-3",
        ] {
            assert!(!is_run_name(n), "{n}");
        }
        assert!(is_run_name("run-1-0123456789abcdef-2"));
    }

    #[test]
    fn cleanup_removes_only_directories_nobody_holds() {
        let parent = temp("clean");
        let live = parent.join("run-7-00000000000000aa-0");
        let dead = parent.join("run-7-00000000000000bb-0");
        let old = parent.join("run-7-1"); // an earlier version's: not ours to judge
        let other = parent.join("user-1000");
        let held = match make(&live) {
            Ok(o) => o,
            Err(_) => panic!("could not make {}", live.display()),
        };
        for d in [&dead, &old, &other] {
            std::fs::create_dir(d).unwrap();
        }
        // A lock is per open file, so a second open in this process stands for another process.
        let removed = clean(&[&parent], None);
        assert_eq!(removed, vec![dead.clone()]);
        assert!(live.is_dir() && old.is_dir() && other.is_dir() && !dead.exists());
        // Once the owner lets go (it died), the next cleanup takes it.
        drop(held);
        assert_eq!(clean(&[&parent], None), vec![live.clone()]);
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn a_directory_a_cleaner_took_first_is_a_race_not_a_run() {
        let parent = temp("race");
        let raced = |r: Result<Owned, MakeError>| matches!(r, Err(MakeError::Raced));
        // The cleaner holds the lock of the directory just made (it is about to remove it).
        let p = parent.join("run-7-00000000000000cc-0");
        std::fs::create_dir(&p).unwrap();
        let cleaner = open_dir(&p).unwrap();
        assert_eq!(try_lock(&cleaner), Ok(true));
        assert!(raced(lock_opened(&p, open_dir(&p).unwrap())));
        drop(cleaner);
        // The cleaner locked and removed it after the maker opened it, before the maker's lock: the
        // lock is then on a directory that no longer exists.
        let q = parent.join("run-7-00000000000000cc-1");
        std::fs::create_dir(&q).unwrap();
        let f = open_dir(&q).unwrap();
        std::fs::remove_dir(&q).unwrap();
        assert!(raced(lock_opened(&q, f)));
        // Undisturbed, the maker gets its directory, locked.
        let s = parent.join("run-7-00000000000000cc-3");
        let o = match make(&s) {
            Ok(o) => o,
            Err(_) => panic!("could not make {}", s.display()),
        };
        assert_eq!(try_lock(&open_dir(&s).unwrap()), Ok(false));
        assert!(remove(o, true).unwrap());
        assert!(!s.exists());
        std::fs::remove_dir_all(&parent).unwrap();
    }

    #[test]
    fn once_is_once_per_key() {
        let a = temp("once-a");
        let b = temp("once-b");
        assert!(once(&a));
        assert!(!once(&a));
        assert!(once(&b));
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }
}
