//! Helpers for a front end's own terminal and signals: the CLI uses them; a server, which has no
//! terminal and must not touch process-wide signal state, does not.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// The uid the host's files know this process by, for finding its delegated cgroups: the effective
/// uid, except for root of a user namespace (a rootless container, `unshare -r`), which is the
/// outside uid its `uid_map` maps 0 to (the owner of the cgroups delegated to it).
pub fn cgroup_uid() -> u32 {
    let euid = euid();
    if euid != 0 {
        return euid;
    }
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
}

/// Whether this process may create a user namespace: a child is cloned into a new one and exits
/// at once. `Err(errno)` says why not (`EPERM`/`EACCES`: refused by policy, e.g. a container's
/// seccomp profile or `kernel.unprivileged_userns_clone=0`; `ENOSPC`: `user.max_user_namespaces`
/// reached or 0; `EINVAL`/`ENOSYS`: the kernel has none).
pub fn try_user_namespace() -> Result<(), i32> {
    // SAFETY: a raw clone without CLONE_VM and without a stack behaves like fork; the child only
    // calls _exit, which is async-signal-safe, so the caller's other threads cannot matter.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    if pid == 0 {
        // SAFETY: the child ends at once without running any of the parent's code.
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: waiting for the child just created.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut st, 0) };
    Ok(())
}

/// CPUs the host has (configured, online or not): an upper bound on how many a sandbox can keep
/// busy at once, whatever affinity its code gives itself (`sched_setaffinity` may widen the mask
/// it inherited). At least 1.
pub fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
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
        let mut t = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills `t` on success, and only then is it read.
        let saved = unsafe {
            if libc::tcgetattr(fd, t.as_mut_ptr()) != 0 {
                return None;
            }
            t.assume_init()
        };
        let mut raw = saved;
        // SAFETY: cfmakeraw edits a valid termios; tcsetattr applies it to our terminal.
        unsafe {
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(fd, libc::TCSANOW, &raw);
        }
        Some(RawTerminal { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the termios saved from this same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// Copies the window size of terminal `from` to the pty `to`.
pub fn copy_winsize(from: RawFd, to: &File) {
    // SAFETY: TIOCGWINSZ fills a winsize, TIOCSWINSZ reads one; both descriptors are open.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(from, libc::TIOCGWINSZ, &mut ws) == 0 {
            libc::ioctl(to.as_raw_fd(), libc::TIOCSWINSZ, &ws);
        }
    }
}

/// Signals taken from the calling thread and delivered through a descriptor, so that
/// [`crate::Running::wait`] can forward them to the sandbox from its poll loop. No handler, no
/// thread. The calling thread's mask is restored on drop.
pub struct ForwardedSignals {
    fd: OwnedFd,
    old: libc::sigset_t,
}

impl ForwardedSignals {
    /// Blocks `signals` in the calling thread and opens a signalfd for them.
    pub fn new(signals: &[i32]) -> io::Result<ForwardedSignals> {
        // SAFETY: building a signal set, blocking it in this thread (saving the old mask), and
        // opening a signalfd on it; the new descriptor is owned below.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in signals {
                libc::sigaddset(&mut set, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                let e = io::Error::last_os_error();
                libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                return Err(e);
            }
            Ok(ForwardedSignals {
                fd: OwnedFd::from_raw_fd(fd),
                old,
            })
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
        let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::uninit();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading one signalfd_siginfo into a buffer of exactly its size.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), info.as_mut_ptr().cast(), size) };
        if n as usize != size {
            return None;
        }
        // SAFETY: the kernel filled the whole struct.
        Some(unsafe { info.assume_init() }.ssi_signo as i32)
    }
}

impl Drop for ForwardedSignals {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in `new`. Signals that arrived meanwhile stay pending
        // until then and are delivered with their usual effect.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// After a run: if the code created the protected path `rel` (one the plan watched, see
/// `plan::Protection`) under the scratch directory `scratch`, moves it aside to
/// `NAME.palisade-blocked` (or `-2`, `-3`, …: nothing is ever replaced) and returns the new
/// relative name. It walks `rel` from the top one component at a time, each parent opened with no
/// symlink resolution at all: a symbolic link or a file standing where a directory of `rel` should
/// be is itself what gets moved, so a link the code left cannot redirect the look or the move
/// (e.g. `.git -> elsewhere` with hooks under it). The sandbox is gone by then: nothing races it.
pub fn disarm(scratch: &std::path::Path, rel: &str) -> io::Result<Option<String>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let comps: Vec<&str> = rel.split('/').collect();
    for i in 0..comps.len() {
        let parent = comps[..i].join("/");
        let name = comps[i];
        let dir = scratch.join(&parent);
        let cdir = CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let fd = crate::sys::open_path_noresolve(&cdir, crate::sys::RESOLVE_NO_SYMLINKS)
            .map_err(io::Error::from_raw_os_error)?;
        // SAFETY: `fd` was just returned by openat2 and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cname = CString::new(name).map_err(io::Error::other)?;
        let kind =
            crate::sys::entry_kind(fd.as_raw_fd(), &cname).map_err(io::Error::from_raw_os_error)?;
        let last = i + 1 == comps.len();
        match kind {
            None => return Ok(None),
            Some(libc::S_IFDIR) if !last => continue,
            Some(_) => {
                let to = move_aside(fd.as_raw_fd(), name)?;
                return Ok(Some(if parent.is_empty() {
                    to
                } else {
                    format!("{parent}/{to}")
                }));
            }
        }
    }
    Ok(None)
}

fn move_aside(dirfd: RawFd, name: &str) -> io::Result<String> {
    use std::ffi::CString;
    let cname = CString::new(name).map_err(io::Error::other)?;
    for n in 1..1000 {
        let to = if n == 1 {
            format!("{name}.palisade-blocked")
        } else {
            format!("{name}.palisade-blocked-{n}")
        };
        let cto = CString::new(to.as_str()).map_err(io::Error::other)?;
        match crate::sys::rename_noreplace(dirfd, &cname, &cto) {
            Ok(()) => return Ok(to),
            Err(libc::EEXIST) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e)),
        }
    }
    Err(io::Error::other("no free .palisade-blocked name"))
}

/// A new eventfd (close-on-exec, non-blocking), for "something happened" between threads that an
/// event loop can poll.
pub fn event_fd() -> io::Result<OwnedFd> {
    let fd = crate::sys::eventfd().map_err(io::Error::from_raw_os_error)?;
    // SAFETY: eventfd just returned this descriptor; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes an eventfd readable.
pub fn signal_event(fd: &OwnedFd) {
    crate::sys::eventfd_signal(fd.as_raw_fd());
}

/// A duplicate (close-on-exec) of the caller's descriptor `fd`, e.g. one a shell opened for the
/// report (`3>report.json`).
pub fn dup_fd(fd: RawFd) -> io::Result<File> {
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` and returns a new descriptor or -1.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` is a new descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(n) })
}

/// Opens a directory (following links now, once) to create files in it later by name only.
pub fn open_dir(path: &std::path::Path) -> io::Result<File> {
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
        // SAFETY: `fd` was just created by openat and is owned by nobody else.
        let mut f = unsafe { File::from_raw_fd(fd) };
        let written = f.write_all(data);
        drop(f);
        let renamed = written.and_then(|()| {
            // SAFETY: renameat with the same directory descriptor and two NUL-terminated names.
            let r = unsafe {
                libc::renameat(
                    dir.as_raw_fd(),
                    tmp.as_ptr(),
                    dir.as_raw_fd(),
                    target.as_ptr(),
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
        if renamed.is_err() {
            // SAFETY: unlinkat of the name we created, relative to the same directory.
            unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
        return renamed;
    }
    Err(io::Error::other("no free temporary name for the report"))
}
