//! Helpers for a front end's own terminal and signals: the CLI uses them; a server, which has no
//! terminal and must not touch process-wide signal state, does not.

use crate::sys;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// The calling thread's CPU time so far (user and system).
pub fn thread_cpu_time() -> std::time::Duration {
    sys::thread_cpu_time()
}

/// Bytes written to a stream socket that its peer has not taken yet (`SIOCOUTQ`); `None` when
/// the descriptor is not one.
pub fn unsent_bytes(fd: impl AsFd) -> Option<u64> {
    sys::unsent_bytes(fd.as_fd().as_raw_fd())
        .ok()
        .map(|n| n.max(0) as u64)
}

/// The effective uid of this process.
pub fn euid() -> u32 {
    sys::geteuid()
}

/// The uid the host's files know this process by, for finding its delegated cgroups: the effective
/// uid, except for root of a user namespace (a rootless container, `unshare -r`), which is the
/// outside uid its `uid_map` maps 0 to (the owner of the cgroups delegated to it).
pub fn cgroup_uid() -> u32 {
    let euid = euid();
    if euid != 0 {
        return euid;
    }
    // Read once per process: a process's own user namespace and its maps do not change.
    static ROOT_OUTSIDE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ROOT_OUTSIDE.get_or_init(|| {
        std::fs::read_to_string("/proc/self/uid_map")
            .ok()
            .and_then(|m| {
                m.lines().find_map(|l| {
                    let f: Vec<u32> = l
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    (f.len() == 3 && f[0] == 0).then_some(f[1])
                })
            })
            .unwrap_or(0)
    })
}

/// Whether this process may create a user namespace: a child is cloned into a new one and exits
/// at once. `Err(errno)` says why not (`EPERM`/`EACCES`: refused by policy, e.g. a container's
/// seccomp profile or `kernel.unprivileged_userns_clone=0`; `ENOSPC`: `user.max_user_namespaces`
/// reached or 0; `EINVAL`/`ENOSYS`: the kernel has none).
pub fn try_user_namespace() -> Result<(), i32> {
    sys::try_user_namespace()
}

/// CPUs the host has (configured, online or not): an upper bound on how many a sandbox can keep
/// busy at once, whatever affinity its code gives itself (`sched_setaffinity` may widen the mask
/// it inherited). At least 1.
pub fn cpus() -> usize {
    // Fixed at boot (glibc reads /sys/devices/system/cpu/possible for it): read once.
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(sys::cpus_configured)
}

/// The caller's terminal in raw mode, restored on drop, so that keys reach the sandbox's pty as
/// typed (Ctrl-C becomes a byte that the sandbox's own line discipline turns into SIGINT).
pub struct RawTerminal {
    fd: RawFd,
    saved: libc::termios,
}

impl RawTerminal {
    /// Enters raw mode on `fd`; `None` if it is not a terminal.
    pub fn enter(fd: RawFd) -> Option<RawTerminal> {
        let saved = sys::tcgetattr(fd)?;
        let _ = sys::tcsetattr(fd, &sys::raw_mode(&saved));
        Some(RawTerminal { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = sys::tcsetattr(self.fd, &self.saved);
    }
}

/// Copies the window size of terminal `from` to the pty `to`.
pub fn copy_winsize(from: RawFd, to: &File) {
    sys::copy_winsize(from, to.as_fd());
}

/// Signals taken from the calling thread and delivered through a descriptor, so that
/// [`crate::Running::wait`] can forward them to the sandbox from its poll loop. No handler, no
/// thread. The calling thread's mask is restored on drop.
pub struct ForwardedSignals {
    fd: OwnedFd,
    old: sys::SigSet,
}

impl ForwardedSignals {
    /// Blocks `signals` in the calling thread and opens a signalfd for them.
    pub fn new(signals: &[i32]) -> io::Result<ForwardedSignals> {
        let set = sys::SigSet::of(signals);
        let old = sys::thread_block(&set).map_err(io::Error::from_raw_os_error)?;
        match sys::signalfd(&set) {
            Ok(fd) => Ok(ForwardedSignals { fd, old }),
            Err(e) => {
                sys::thread_set_mask(&old);
                Err(io::Error::from_raw_os_error(e))
            }
        }
    }

    /// The signals as something another thread can read (the thread that runs the sandbox's
    /// loop): the signals stay blocked in this thread, and process-directed ones are delivered to
    /// whichever signalfd reads them. Threads started after [`ForwardedSignals::new`] inherit the
    /// mask, so none of them takes the signals with their usual effect.
    pub fn source(&self) -> io::Result<SignalSource> {
        Ok(SignalSource {
            fd: self.fd.try_clone()?,
        })
    }
}

/// A signalfd to read forwarded signals from; see [`ForwardedSignals::source`].
pub struct SignalSource {
    fd: OwnedFd,
}

impl SignalSource {
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The next pending signal, if any.
    pub(crate) fn next(&self) -> Option<i32> {
        sys::signalfd_next(self.fd.as_fd())
    }
}

impl Drop for ForwardedSignals {
    fn drop(&mut self) {
        // Back to the mask saved in `new`. Signals that arrived meanwhile stay pending until
        // then and are delivered with their usual effect.
        sys::thread_set_mask(&self.old);
    }
}

/// What became of one watched protected path that the code created (see [`disarm_all`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disarmed {
    /// The watched path, relative to the scratch directory.
    pub path: String,
    /// Where it is now, relative to the scratch directory; `None` if it could not be moved, and
    /// then `error` says why and it is still in place.
    pub moved_to: Option<String>,
    pub error: Option<String>,
}

/// Name of palisade's own directories for what it took out of the way: this and a random suffix.
pub const BLOCKED_DIR_PREFIX: &str = ".palisade-blocked-";

/// After a run, once nothing of the sandbox is left to race it: moves whatever the code created
/// at a watched protected path (see `plan::Protection`) into a directory of palisade's own, and
/// returns one entry per path it found, moved or not.
///
/// The directory is made at the root of the scratch directory with `mkdir` (which fails on any
/// existing name, a link included), a random name `.palisade-blocked-XXXXXXXX`, mode 0700, and
/// the scratch directory's owner (a root supervisor hands it over, so that the user can look
/// inside and remove it). Nothing the code did beforehand can take its name or stand in its way.
/// Each path goes in under a name no tool looks for: `.git` becomes `.git.blocked`, and a path
/// in a directory keeps its directory as `%2F` (`.config%2Ffish.blocked`).
///
/// Each directory is opened from the one before without following a link, so a link the code left
/// where a directory of the path should be is itself what gets moved. The code runs as the owner
/// of the scratch directory's files, so an unprivileged supervisor (the same user) may find
/// directories it cannot search or write (`chmod 555` on the way): it adds the owner's `rwx` to
/// each directory it owns that lacks them, and puts the mode back afterwards. If the move into the
/// root's directory fails (another filesystem mounted inside the scratch), a directory of its own
/// is made beside the path instead. If that fails too, the entry says why: the caller must then
/// fail the run (the path is still armed).
pub fn disarm_all(p: &crate::plan::Protection) -> Vec<Disarmed> {
    let Some(scratch) = &p.scratch else {
        return Vec::new();
    };
    let mut root_dir: Option<BlockedDir> = None;
    p.watched
        .iter()
        .filter_map(|w| match disarm(scratch, w, &mut root_dir) {
            Ok(None) => None,
            Ok(Some(to)) => Some(Disarmed {
                path: w.clone(),
                moved_to: Some(to),
                error: None,
            }),
            Err(e) => Some(Disarmed {
                path: w.clone(),
                moved_to: None,
                error: Some(e.to_string()),
            }),
        })
        .collect()
}

type Cname = std::ffi::CString;

fn cname(s: impl AsRef<[u8]>) -> io::Result<Cname> {
    Cname::new(s.as_ref()).map_err(io::Error::other)
}

fn os(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// `openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY)`.
fn open_dir(dir: &OwnedFd, name: &Cname) -> io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY;
    crate::sys::openat(dir.as_raw_fd(), name, flags, 0).map_err(os)
}

/// Directory modes changed to get through, put back when dropped (last changed, first restored).
#[derive(Default)]
struct Modes(Vec<(OwnedFd, Cname, libc::mode_t)>);

impl Modes {
    /// Gives the owner `rwx` on the directory `name` in `dir` if this process owns it and the
    /// mode lacks them. Best effort: if it cannot, the step that needed it says why.
    fn open_up(&mut self, dir: &OwnedFd, name: &Cname) {
        let Ok(st) = crate::sys::stat_nofollow(dir.as_raw_fd(), name) else {
            return;
        };
        let mode = st.st_mode & 0o7777;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR
            || st.st_uid != euid()
            || mode & 0o700 == 0o700
        {
            return;
        }
        let Ok(keep) = dir.try_clone() else {
            return;
        };
        if crate::sys::chmod_nofollow(dir.as_raw_fd(), name, mode | 0o700).is_ok() {
            self.0.push((keep, name.clone(), mode));
        }
    }
}

impl Drop for Modes {
    fn drop(&mut self) {
        while let Some((dir, name, mode)) = self.0.pop() {
            // Gone if it was the path moved away: nothing to put back.
            let _ = crate::sys::chmod_nofollow(dir.as_raw_fd(), &name, mode);
        }
    }
}

/// A directory palisade made for what it takes out of the way.
struct BlockedDir {
    fd: OwnedFd,
    /// Relative to the scratch directory.
    rel: String,
}

impl BlockedDir {
    /// Makes `.palisade-blocked-XXXXXXXX` in `dir` (`dir_rel` relative to the scratch).
    fn make(dir: &OwnedFd, dir_rel: &str) -> io::Result<BlockedDir> {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        for _ in 0..16 {
            let mut r = [0u8; 8];
            crate::sys::getrandom(&mut r).map_err(os)?;
            let suffix: String = r
                .iter()
                .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
                .collect();
            let name = format!("{BLOCKED_DIR_PREFIX}{suffix}");
            let c = cname(&name)?;
            match crate::sys::mkdirat(dir.as_raw_fd(), &c, 0o700) {
                Ok(()) => {}
                Err(libc::EEXIST) => continue,
                Err(e) => return Err(os(e)),
            }
            if euid() == 0 {
                let owner = crate::sys::stat_nofollow(dir.as_raw_fd(), c"").map_err(os)?;
                if owner.st_uid != 0 {
                    crate::sys::chown_nofollow(dir.as_raw_fd(), &c, owner.st_uid, owner.st_gid)
                        .map_err(os)?;
                }
            }
            return Ok(BlockedDir {
                fd: open_dir(dir, &c)?,
                rel: join(dir_rel, &name),
            });
        }
        Err(io::Error::other("no free name for palisade's directory"))
    }

    /// Moves `name` of `dir` in here as `to`; returns its new path relative to the scratch.
    fn take(&self, dir: &OwnedFd, name: &Cname, to: &str) -> io::Result<String> {
        crate::sys::rename_noreplace_between(
            dir.as_raw_fd(),
            name,
            self.fd.as_raw_fd(),
            &cname(to)?,
        )
        .map_err(os)?;
        Ok(join(&self.rel, to))
    }
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_owned()
    } else {
        format!("{a}/{b}")
    }
}

/// The name a path gets in palisade's directory: one component, `%` and `/` escaped, ending in
/// `.blocked` (so that a `.git`, `.envrc` or `.vscode` in there is none of those).
fn blocked_name(rel: &str) -> String {
    let flat = rel.replace('%', "%25").replace('/', "%2F");
    // Within NAME_MAX: a long path keeps its end.
    let mut cut = flat.len().saturating_sub(200);
    while !flat.is_char_boundary(cut) {
        cut += 1;
    }
    format!("{}.blocked", &flat[cut..])
}

/// One watched path: `Ok(None)` if nothing is there.
fn disarm(
    scratch: &std::path::Path,
    rel: &str,
    root_dir: &mut Option<BlockedDir>,
) -> io::Result<Option<String>> {
    use std::os::unix::ffi::OsStrExt;
    let mut modes = Modes::default();
    // The scratch directory, through its parent: the user's own path, canonical, outside the
    // sandbox's view.
    let (parent, name) = match (scratch.parent(), scratch.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => return Err(io::Error::other("the scratch directory has no parent")),
    };
    let fd = crate::sys::open_path_noresolve(
        &cname(parent.as_os_str().as_bytes())?,
        crate::sys::RESOLVE_NO_SYMLINKS,
    )
    .map_err(os)?;
    let up = fd;
    let root_name = cname(name.as_bytes())?;
    modes.open_up(&up, &root_name);
    let root = open_dir(&up, &root_name)?;
    let mut dir = root.try_clone()?;
    let mut dir_rel = String::new();
    let comps: Vec<&str> = rel.split('/').collect();
    for (i, comp) in comps.iter().enumerate() {
        let c = cname(comp)?;
        let last = i + 1 == comps.len();
        match crate::sys::entry_kind(dir.as_raw_fd(), &c).map_err(os)? {
            None => return Ok(None),
            Some(libc::S_IFDIR) if !last => {
                modes.open_up(&dir, &c);
                dir = open_dir(&dir, &c)?;
                dir_rel = join(&dir_rel, comp);
            }
            Some(_) => {
                // This entry goes: the watched path, or what stands where a directory of it
                // should be. Renaming a directory rewrites its `..`, which takes write access.
                modes.open_up(&dir, &c);
                let to = blocked_name(&join(&dir_rel, comp));
                let first = match root_dir {
                    Some(b) => b.take(&dir, &c, &to),
                    None => BlockedDir::make(&root, "").and_then(|b| {
                        let r = b.take(&dir, &c, &to);
                        *root_dir = Some(b);
                        r
                    }),
                };
                return match first {
                    Ok(to) => Ok(Some(to)),
                    Err(e) => BlockedDir::make(&dir, &dir_rel)
                        .and_then(|b| b.take(&dir, &c, &to))
                        .map(Some)
                        .map_err(|e2| {
                            io::Error::other(format!("{e}; into a directory beside it: {e2}"))
                        }),
                };
            }
        }
    }
    Ok(None)
}

/// A new eventfd (close-on-exec, non-blocking), for "something happened" between threads that an
/// event loop can poll.
pub fn event_fd() -> io::Result<OwnedFd> {
    crate::sys::eventfd().map_err(io::Error::from_raw_os_error)
}

/// Makes an eventfd readable.
pub fn signal_event(fd: &OwnedFd) {
    crate::sys::eventfd_signal(fd.as_raw_fd());
}

/// A duplicate (close-on-exec) of the caller's descriptor `fd`, e.g. one a shell opened for the
/// report (`3>report.json`).
pub fn dup_fd(fd: RawFd) -> io::Result<File> {
    sys::dup_above2(fd)
        .map(File::from)
        .map_err(io::Error::from_raw_os_error)
}

/// Opens a directory (following links now, once) to create files in it later by name only.
pub fn open_directory(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
}

/// Writes `data` as the file `name` in `dir`: into a new file created beside it (`O_EXCL`, no
/// link followed), then renamed over `name`. Whatever stood at `name` (a symbolic link included) is
/// replaced, never followed or truncated.
pub fn replace_file_at(dir: &File, name: &std::ffi::OsStr, data: &[u8]) -> io::Result<()> {
    use std::ffi::CString;
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let target = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    for _ in 0..100 {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = CString::new(format!(".palisade-{}-{n}.tmp", std::process::id()))
            .map_err(io::Error::other)?;
        let fd = match crate::sys::openat(
            dir.as_raw_fd(),
            &tmp,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o666,
        ) {
            Ok(fd) => fd,
            Err(libc::EEXIST) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e)),
        };
        let mut f = File::from(fd);
        let written = f.write_all(data);
        drop(f);
        let renamed = written.and_then(|()| {
            crate::sys::renameat(dir.as_raw_fd(), &tmp, dir.as_raw_fd(), &target)
                .map_err(io::Error::from_raw_os_error)
        });
        if renamed.is_err() {
            let _ = crate::sys::unlinkat(dir.as_raw_fd(), &tmp, 0);
        }
        return renamed;
    }
    Err(io::Error::other("no free temporary name for the report"))
}

/// Whether the child of a [`join_cgroups_before_exec`] command entered its cgroups.
#[derive(Debug)]
pub struct Joined {
    /// Read end of a pipe into which the child writes a byte for a cgroup it could not enter.
    failures: OwnedFd,
}

impl Joined {
    /// After the spawn returned (the child has exec'd its program, or failed to): whether it
    /// entered every cgroup. A child writes before its exec, so the answer is there by then.
    pub fn all(&self) -> bool {
        let mut b = [0u8; 1];
        // Non-blocking: no byte (and the write end still open in the command) is success too.
        !matches!(sys::read(self.failures.as_raw_fd(), &mut b), Ok(1))
    }
}

/// For a program that lives in a sandbox and moves large buffers (a session's agent, whose
/// memory is the session's): buffers of 256 KiB or more are mapped on their own and given back
/// to the kernel when freed, rather than kept by the allocator for later (glibc raises its
/// threshold to the largest buffer freed: an agent that had read a 16 MiB file back held ~32 MiB
/// for the session's life). Call it first, before any thread starts.
pub fn give_large_buffers_back() {
    crate::sys::set_mmap_threshold(256 << 10);
}

/// Has `cmd`'s child move itself into the cgroups of `files` before it execs its program: it
/// writes `0` into each, as a cgroup's `tasks` (v1) or `cgroup.procs` (v2) file, which the
/// supervisor opened and whose opener's credentials the kernel checks, not the child's. Everything
/// the program starts is then in them from the start. The descriptors are close-on-exec, so the
/// program never holds them. A write that fails leaves the child where it was (its program still
/// runs) and [`Joined::all`] says so.
pub fn join_cgroups_before_exec(
    cmd: &mut std::process::Command,
    files: Vec<OwnedFd>,
) -> io::Result<Joined> {
    let (r, w) = sys::pipe().map_err(io::Error::from_raw_os_error)?;
    sys::set_nonblocking(r.as_raw_fd()).map_err(io::Error::from_raw_os_error)?;
    sys::write_zero_before_exec(cmd, files, w);
    Ok(Joined { failures: r })
}

#[cfg(test)]
mod tests {
    /// One component, ending in `.blocked`, and distinct for distinct paths.
    #[test]
    fn blocked_names_are_one_component_and_distinct() {
        let names: Vec<String> = [".git", ".config/fish", ".config%2Ffish", "a/b/c"]
            .iter()
            .map(|p| super::blocked_name(p))
            .collect();
        assert_eq!(
            names,
            [
                ".git.blocked",
                ".config%2Ffish.blocked",
                ".config%252Ffish.blocked",
                "a%2Fb%2Fc.blocked"
            ]
        );
        let long = "d/".repeat(150) + "x";
        let n = super::blocked_name(&long);
        assert!(
            n.len() <= 255 && !n.contains('/') && n.ends_with("x.blocked"),
            "{n}"
        );
    }
}
