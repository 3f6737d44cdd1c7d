//! The sandbox side: init (pid 1 of the new pid namespace) and the payload it forks.
//!
//! With the in-process engine this code runs right after `clone3` in a copy of the supervisor,
//! which may have had other threads. It therefore calls only async-signal-safe code until
//! `execve` or `_exit`: raw system calls over the precomputed [`Plan`], no allocation, no locks,
//! no formatting, no panics on any path a well-formed plan can take. Errors travel to the
//! supervisor as fixed-size [`Msg`] records. The exec engine's init (palisade's own program,
//! which read the plan from its socket) and a template's per-run inits (`zygote`) run the same
//! steps; there the constraint is not needed, but the code is the same.
//!
//! The order below is the one in `docs/setup-order.md`; each step says why it is where it is.

use crate::plan::{Op, Plan};
use crate::sys::{self, SysResult};
use libc::c_int;
use std::os::fd::{AsRawFd, IntoRawFd};

/// A record on the init → supervisor pipe. Writes of this size are atomic (< `PIPE_BUF`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Msg {
    pub kind: u32,
    pub step: u32,
    pub index: u32,
    pub value: i32,
}

pub const MSG_SETUP_ERROR: u32 = 1;
pub const MSG_EXEC_ERROR: u32 = 2;
pub const MSG_STARTED: u32 = 3;
pub const MSG_EXITED: u32 = 4;
/// From a template's zygote: the run's init exists; `value` is its pid.
pub const MSG_SPAWNED: u32 = 5;

impl Msg {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.kind.to_ne_bytes());
        b[4..8].copy_from_slice(&self.step.to_ne_bytes());
        b[8..12].copy_from_slice(&self.index.to_ne_bytes());
        b[12..16].copy_from_slice(&self.value.to_ne_bytes());
        b
    }
    pub fn from_bytes(b: &[u8; 16]) -> Msg {
        let w = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        Msg {
            kind: u32::from_ne_bytes(w(0)),
            step: u32::from_ne_bytes(w(4)),
            index: u32::from_ne_bytes(w(8)),
            value: i32::from_ne_bytes(w(12)),
        }
    }
}

/// Setup steps, as reported in a `MSG_SETUP_ERROR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    DeathSignal = 1,
    Ids,
    Stdio,
    CloseFds,
    MountsPrivate,
    OpenSource,
    SourceChanged,
    RootTmpfs,
    Op,
    PivotRoot,
    DetachOldRoot,
    RootReadOnly,
    Hostname,
    Loopback,
    Pty,
    Signals,
    Fork,
    DropInitPrivileges,
    CgroupNamespace,
    CgroupJoin,
    LandlockRuleset,
    LandlockRule,
    LandlockRestrict,
    EgressSocket,
    Dumpable,
    PreparePayload,
    Engine,
    TemplateProc,
    WarmPython,
    WarmImport,
    WarmThreads,
    FilesIn,
}

impl Step {
    const ALL: [Step; 32] = [
        Step::DeathSignal,
        Step::Ids,
        Step::Stdio,
        Step::CloseFds,
        Step::MountsPrivate,
        Step::OpenSource,
        Step::SourceChanged,
        Step::RootTmpfs,
        Step::Op,
        Step::PivotRoot,
        Step::DetachOldRoot,
        Step::RootReadOnly,
        Step::Hostname,
        Step::Loopback,
        Step::Pty,
        Step::Signals,
        Step::Fork,
        Step::DropInitPrivileges,
        Step::CgroupNamespace,
        Step::CgroupJoin,
        Step::LandlockRuleset,
        Step::LandlockRule,
        Step::LandlockRestrict,
        Step::EgressSocket,
        Step::Dumpable,
        Step::PreparePayload,
        Step::Engine,
        Step::TemplateProc,
        Step::WarmPython,
        Step::WarmImport,
        Step::WarmThreads,
        Step::FilesIn,
    ];

    /// The step of a `MSG_SETUP_ERROR` record.
    pub fn from_u32(v: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == v)
    }

    /// A stable name for reports and API clients (`pivot-root`, `landlock-restrict`, …).
    pub fn code(self) -> &'static str {
        match self {
            Step::DeathSignal => "death-signal",
            Step::Ids => "ids",
            Step::Stdio => "stdio",
            Step::CloseFds => "close-fds",
            Step::MountsPrivate => "mounts-private",
            Step::OpenSource => "open-source",
            Step::SourceChanged => "source-changed",
            Step::RootTmpfs => "root-tmpfs",
            Step::Op => "mount-view",
            Step::PivotRoot => "pivot-root",
            Step::DetachOldRoot => "detach-old-root",
            Step::RootReadOnly => "root-read-only",
            Step::Hostname => "hostname",
            Step::Loopback => "loopback",
            Step::Pty => "pty",
            Step::Signals => "signals",
            Step::Fork => "fork",
            Step::DropInitPrivileges => "drop-init-privileges",
            Step::CgroupNamespace => "cgroup-namespace",
            Step::CgroupJoin => "cgroup-join",
            Step::LandlockRuleset => "landlock-ruleset",
            Step::LandlockRule => "landlock-rule",
            Step::LandlockRestrict => "landlock-restrict",
            Step::EgressSocket => "egress-socket",
            Step::Dumpable => "dumpable",
            Step::PreparePayload => "prepare-payload",
            Step::Engine => "engine",
            Step::TemplateProc => "template-proc",
            Step::WarmPython => "warm-python",
            Step::WarmImport => "warm-import",
            Step::WarmThreads => "warm-threads",
            Step::FilesIn => "files-in",
        }
    }
}

/// Descriptors the child works with; all of them are ≥ 3 and listed in `keep`, sorted.
pub struct ChildFds {
    /// Become the payload's 0, 1, 2 (ignored with a terminal: the pty replaces them).
    pub stdio: [c_int; 3],
    /// Write end of the init → supervisor pipe.
    pub msg: c_int,
    /// Init's end of the supervisor ↔ init socket: "g" (maps written; cold runs), or a template
    /// run's program and streams ("p", its record, "x"), then "j" (cgroup ready, with the files to
    /// join it through); the other way, the egress listeners ("n") and the payload's seccomp
    /// listener ("s").
    pub go: c_int,
    /// Socket on which init sends the pty master to the supervisor, or -1.
    pub pty_sock: c_int,
    /// The bytes of the run's files (`plan.exec.files`), a sealed memfd, or -1 without files.
    pub files: c_int,
    /// Every descriptor init keeps; all others are closed. Sorted ascending.
    pub keep: Vec<c_int>,
}

pub(crate) type Fail = (Step, u32, i32);

pub(crate) fn at(step: Step) -> impl Fn(sys::Errno) -> Fail {
    move |e| (step, 0, e)
}

pub(crate) fn send(fd: c_int, m: Msg) {
    let _ = sys::write_all(fd, &m.to_bytes());
}

/// What init's setup leaves for the payload: descriptors, or -1.
pub(crate) struct Prepared {
    /// The pty slave (with a terminal).
    pub slave: c_int,
    /// The Landlock ruleset the payload enters.
    pub ruleset: c_int,
}

/// Entry point of the child after `clone3`. Never returns.
pub fn init(plan: &mut Plan, fds: &ChildFds) -> ! {
    let mut ready = Prepared {
        slave: -1,
        ruleset: -1,
    };
    if let Err((step, index, errno)) = setup(plan, fds, &mut ready) {
        send(
            fds.msg,
            Msg {
                kind: MSG_SETUP_ERROR,
                step: step as u32,
                index,
                value: errno,
            },
        );
        sys::exit(1);
    }
    let stack_top = plan.payload_stack.as_mut_ptr_range().end;
    supervise(plan, fds, ready, stack_top, None)
}

fn setup(plan: &mut Plan, fds: &ChildFds, ready: &mut Prepared) -> Result<(), Fail> {
    // 1. Die with the supervisor. Set before waiting for "go": if the supervisor is already
    //    gone, the read below sees end-of-file instead, so there is no window.
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _).map_err(at(Step::DeathSignal))?;
    // 2. Only stdin/stdout/stderr cross the boundary: put ours in place, close everything else
    //    inherited (clone3 copied the whole descriptor table, close-on-exec or not). Before the
    //    wait below: our copy of the supervisor's end of the "go" socket must be gone, or the
    //    supervisor's death would never show here as end-of-file.
    for (target, src) in fds.stdio.iter().enumerate() {
        if *src != target as c_int {
            sys::dup2(*src, target as c_int).map_err(|e| (Step::Stdio, target as u32, e))?;
        }
    }
    let mut next: u32 = 3;
    for &fd in &fds.keep {
        if fd as u32 > next {
            sys::close_range(next, fd as u32 - 1, 0).map_err(at(Step::CloseFds))?;
        }
        next = fd as u32 + 1;
    }
    sys::close_range(next, u32::MAX, 0).map_err(at(Step::CloseFds))?;

    let mut b = [0u8; 1];
    if sys::read_full(fds.go, &mut b) != Ok(1) {
        sys::exit(1); // The supervisor gave up (its own error is reported there).
    }
    // 0 here so that the modes in the plan (1777 on /tmp) are exact; the payload gets 022 back.
    sys::umask(0);

    // 3. Become the mapped ids. For a root-launched sandbox this is what moves the process off
    //    host uid 0 (until now its kernel uid was still 0, unmapped here: files owned by host root
    //    would pass the owner check). Supplementary groups go first, while we may still drop them.
    let ids = plan.ids;
    // Raw system calls, not glibc's wrappers: in a multi-threaded process glibc's set*id broadcast
    // the change to every thread it knows of and wait for them, and the threads it knows of were
    // left behind in the supervisor. That wait would never end.
    if ids.privileged {
        sys::setgroups_empty().map_err(|e| (Step::Ids, 0, e))?;
    }
    sys::setresgid(ids.gid).map_err(|e| (Step::Ids, 1, e))?;
    sys::setresuid(ids.uid).map_err(|e| (Step::Ids, 2, e))?;
    // A change of credentials clears the parent-death signal and resets dumpability (the kernel's
    // commit_creds), so both are set again now. The supervisor holds its end of the "go" pipe open
    // until the payload has started: if it is gone already, the pipe has hung up and we leave.
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _).map_err(at(Step::DeathSignal))?;
    if sys::hung_up(fds.go) {
        sys::exit(1);
    }
    // Not dumpable: the payload (same uid) cannot ptrace init or read its /proc/1/{mem,environ,fd},
    // which hold a copy of the supervisor's memory, environment included. Only after "go": until
    // the maps are written, an unprivileged supervisor needs to open our /proc files, which
    // non-dumpable makes root's.
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(at(Step::Dumpable))?;

    // 4. No mount event crosses between host and sandbox, in either direction.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(at(Step::MountsPrivate))?;

    // 5. Open every bind source now, before anything is mounted over them (a source may live in
    //    the host's /tmp). openat2 with no symlink resolution at all: a path swapped for a symlink
    //    since the supervisor checked it fails here, and the device/inode check catches a swapped
    //    directory. The mount later uses the descriptor, not the path.
    for (i, s) in plan.sources.iter_mut().enumerate() {
        if s.tree < 0 {
            open_source(s, i)?;
        }
    }

    // 6. The new root is a fresh tmpfs (on the host's /tmp mount point, inside our namespace
    //    only); everything below is built relative to it.
    new_root()?;

    // 7. The view: binds read-only, recursive, nosuid, nodev; /proc (needs the old root still
    //    attached: the kernel only allows a new procfs where one is already fully visible); /dev;
    //    /tmp; scratch; the policy's binds.
    //    A workspace's tmpfs goes to the supervisor here (Op::SendDir), before the payload exists.
    for (i, op) in plan.ops.iter().enumerate() {
        let r = match op {
            Op::SendDir { path, tag } => send_dir(fds.go, path, *tag),
            _ => run_op(plan, op),
        };
        r.map_err(|e| (Step::Op, i as u32, e))?;
    }

    // 8. pivot_root onto the new root with the old one stacked beneath, then detach the old one:
    //    no path leads back to the host's tree, and no scaffolding directory remains.
    sys::pivot_root(c".", c".").map_err(at(Step::PivotRoot))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(at(Step::DetachOldRoot))?;
    let _ = sys::chdir(c"/");
    // 9. The root itself read-only: only /tmp, /dev/shm, scratch and --rw binds stay writable.
    sys::mount_setattr(libc::AT_FDCWD, c"/", 0, sys::MOUNT_ATTR_RDONLY, 0, -1)
        .map_err(at(Step::RootReadOnly))?;

    // 10. The Landlock ruleset, now that the view is final (a rule holds the inode its path names
    //     now, so not before pivot_root), and in init rather than in the payload: init's steps
    //     overlap the supervisor's cgroup work (step h). The payload enters it at step 16.
    if let Some(ll) = plan.landlock.ruleset() {
        ready.ruleset = landlock_ruleset(ll)?;
    }

    finish_view(plan, fds, ready, None)
}

/// Opens bind source `i` (step 5) with no symbolic link resolved at all, and checks it is
/// still the device and inode the supervisor saw: a path swapped for a link fails, a swapped
/// directory is `SourceChanged`. The descriptor stays in the plan until its tree is mounted.
pub(crate) fn open_source(s: &mut crate::plan::Source, i: usize) -> Result<(), Fail> {
    let fd = sys::open_path_noresolve(
        &s.path,
        sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| (Step::OpenSource, i as u32, e))?
    .into_raw_fd();
    match sys::dev_ino(fd) {
        Ok((d, n)) if d == s.dev && n == s.ino => {
            s.fd = fd;
            Ok(())
        }
        Ok(_) => {
            sys::close(fd);
            Err((Step::SourceChanged, i as u32, libc::ESTALE))
        }
        Err(e) => {
            sys::close(fd);
            Err((Step::OpenSource, i as u32, e))
        }
    }
}

/// Step 6: a fresh tmpfs on the host's /tmp mount point (in this mount namespace only) becomes
/// the working directory, the root everything of the view is built relative to.
pub(crate) fn new_root() -> Result<(), Fail> {
    sys::mount(
        Some(c"palisade"),
        c"/tmp",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"mode=0755,size=4m"),
    )
    .map_err(at(Step::RootTmpfs))?;
    sys::chdir(c"/tmp").map_err(|e| (Step::RootTmpfs, 1, e))
}

/// Steps 11 and 12, the last of init's setup (the per-run init of a template runs them too):
/// host name, loopback, the egress proxy's listeners, the pty.
///
/// `lent_dns`: the run is in a network namespace of a template's pool, where `lo` is up and the
/// DNS stub's socket (the plan's one listener) is this one, bound by the zygote.
pub(crate) fn finish_view(
    plan: &Plan,
    fds: &ChildFds,
    ready: &mut Prepared,
    lent_dns: Option<c_int>,
) -> Result<(), Fail> {
    // 11. Host name, then loopback up (the only interface of the new network namespace).
    sys::sethostname(plan.hostname.as_bytes()).map_err(at(Step::Hostname))?;
    if let Some(sock) = lent_dns {
        // A namespace of the pool: `lo` is up, the DNS stub bound; sent on as below.
        let r = sys::send_fds(fds.go, b'n', &[sock]);
        sys::close(sock);
        r.map_err(|e| (Step::EgressSocket, 0, e))?;
    } else {
        sys::loopback_up().map_err(at(Step::Loopback))?;
        egress_sockets(plan, fds)?;
    }

    // 12. With a terminal: a pty from the sandbox's own devpts; the master goes to the supervisor.
    if plan.tty {
        ready.slave = open_pty(fds.pty_sock).map_err(at(Step::Pty))?;
    }
    // 13. The run's files, written here, inside the boundary, before the payload exists.
    if fds.files >= 0 {
        let r = write_files(plan, fds.files);
        sys::close(fds.files);
        r?;
    }
    Ok(())
}

/// Step 13: writes the run's files under the working directory from `src` (their bytes one after
/// the other). Each directory on the way and each file is opened with `openat2` beneath the one
/// before, following no symbolic link and crossing no mount: the working directory may be a host
/// scratch directory where an earlier run left links. A missing directory is made (0755); a file
/// is created or replaced, and must be a regular file. Async-signal-safe: no allocation.
pub(crate) fn write_files(plan: &Plan, src: c_int) -> Result<(), Fail> {
    const RESOLVE: u64 = sys::RESOLVE_BENEATH
        | sys::RESOLVE_NO_SYMLINKS
        | sys::RESOLVE_NO_MAGICLINKS
        | sys::RESOLVE_NO_XDEV;
    let dir_flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let top = sys::openat(libc::AT_FDCWD, &plan.workdir, dir_flags, 0)
        .map_err(|e| (Step::FilesIn, 0, e))?;
    let mut offset: u64 = 0;
    let mut result = Ok(());
    for (i, f) in plan.exec.files.iter().enumerate() {
        let fail = |e| (Step::FilesIn, i as u32, e);
        let mut dir: Option<std::os::fd::OwnedFd> = None;
        let mut step = || -> Result<(), Fail> {
            for d in &f.dirs {
                let at = dir.as_ref().unwrap_or(&top).as_raw_fd();
                let next = match sys::openat2(at, d, dir_flags, 0, RESOLVE) {
                    Err(libc::ENOENT) => {
                        match sys::mkdirat(at, d, 0o755) {
                            Ok(()) | Err(libc::EEXIST) => {}
                            Err(e) => return Err(fail(e)),
                        }
                        sys::openat2(at, d, dir_flags, 0, RESOLVE).map_err(fail)?
                    }
                    r => r.map_err(fail)?,
                };
                if let Some(old) = dir.replace(next) {
                    sys::close_owned(old);
                }
            }
            let at = dir.as_ref().unwrap_or(&top).as_raw_fd();
            // Non-blocking: a fifo left in a host scratch directory fails (ENXIO) instead of
            // waiting for a reader.
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK;
            let out = sys::openat2(at, &f.name, flags, f.mode, RESOLVE).map_err(fail)?;
            let r = (|| {
                if sys::file_type(out.as_raw_fd())? != libc::S_IFREG {
                    return Err(libc::EINVAL);
                }
                sys::ftruncate(out.as_raw_fd())?;
                sys::fchmod(out.as_raw_fd(), f.mode)?;
                sys::sendfile_all(out.as_raw_fd(), src, offset, f.len)
            })();
            sys::close_owned(out);
            r.map_err(fail)
        };
        let r = step();
        if let Some(d) = dir.take() {
            sys::close_owned(d);
        }
        if r.is_err() {
            result = r;
            break;
        }
        offset += f.len;
    }
    sys::close_owned(top);
    result
}

/// 11b. The egress proxy's listeners, made here so that they belong to this network namespace,
/// then sent to the supervisor, which serves them from outside. Init keeps no copy, so the
/// payload never holds them.
fn egress_sockets(plan: &Plan, fds: &ChildFds) -> Result<(), Fail> {
    for (c, chunk) in plan.sockets.chunks(sys::MAX_FDS).enumerate() {
        let mut made = [-1 as c_int; sys::MAX_FDS];
        for (i, spec) in chunk.iter().enumerate() {
            match egress_socket(spec) {
                Ok(fd) => made[i] = fd,
                Err(e) => {
                    made[..i].iter().for_each(|&fd| sys::close(fd));
                    return Err((Step::EgressSocket, (c * sys::MAX_FDS + i) as u32, e));
                }
            }
        }
        let r = sys::send_fds(fds.go, b'n', &made[..chunk.len()]);
        made[..chunk.len()].iter().for_each(|&fd| sys::close(fd));
        r.map_err(|e| (Step::EgressSocket, (c * sys::MAX_FDS) as u32, e))?;
    }
    Ok(())
}

/// Creates the ruleset and adds every rule: each path opened `O_PATH` (no read permission
/// needed), added, closed. A path missing inside is skipped only if the plan says it may be.
fn landlock_ruleset(ll: &crate::landlock::Ruleset) -> Result<c_int, Fail> {
    landlock_ruleset_with(ll, &[])
}

/// [`landlock_ruleset`], where `opened[i]`, when it is a descriptor (≥ 0), is rule `i`'s path
/// already open (a template's zygote opens the paths of its prepared view once); those are used
/// as they are and left open.
pub(crate) fn landlock_ruleset_with(
    ll: &crate::landlock::Ruleset,
    opened: &[c_int],
) -> Result<c_int, Fail> {
    let attr = sys::LandlockRulesetAttr {
        handled_access_fs: ll.handled_fs,
        handled_access_net: ll.handled_net,
        scoped: ll.scoped,
    };
    let rs = sys::landlock_create_ruleset(&attr)
        .map_err(at(Step::LandlockRuleset))?
        .into_raw_fd(); // the payload enters it at step 16, then closes it
    for (i, r) in ll.rules.iter().enumerate() {
        if let Some(&fd) = opened.get(i).filter(|&&fd| fd >= 0) {
            sys::landlock_add_path_rule(rs, fd, r.access)
                .map_err(|e| (Step::LandlockRule, i as u32, e))?;
            continue;
        }
        let fd = match sys::openat(libc::AT_FDCWD, &r.path, libc::O_PATH, 0) {
            Ok(fd) => fd.into_raw_fd(),
            Err(libc::ENOENT) if r.optional => continue,
            Err(e) => return Err((Step::LandlockRule, i as u32, e)),
        };
        let added = sys::landlock_add_path_rule(rs, fd, r.access);
        sys::close(fd);
        added.map_err(|e| (Step::LandlockRule, i as u32, e))?;
    }
    for (i, &(port, access)) in ll.ports.iter().enumerate() {
        sys::landlock_add_port_rule(rs, port, access)
            .map_err(|e| (Step::LandlockRule, (ll.rules.len() + i) as u32, e))?;
    }
    Ok(rs)
}

/// Opens the directory `path` and sends it on `sock` with `tag`; init's copy is closed at once.
fn send_dir(sock: c_int, path: &std::ffi::CStr, tag: u8) -> SysResult<()> {
    let fd = sys::openat(
        libc::AT_FDCWD,
        path,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )?
    .into_raw_fd();
    let r = sys::send_fds(sock, tag, &[fd]);
    sys::close(fd);
    r
}

/// Runs one operation of the view, relative to the working directory (the new root). A `Bind`
/// takes its source from `plan.sources`: its detached tree if it has one, else the descriptor
/// opened at step 5.
pub(crate) fn run_op(plan: &Plan, op: &Op) -> SysResult<()> {
    run_op_with(&plan.sources, op)
}

/// [`run_op`] with the sources given apart (a template's per-run operations have their own).
pub(crate) fn run_op_with(sources: &[crate::plan::Source], op: &Op) -> SysResult<()> {
    use crate::sys::*;
    match op {
        Op::Mkdir { path, mode } => mkdir_p1(path, *mode),
        // A file mount point. Under a bind of a host directory (`--ro /opt/tool/bin/x`, with `/opt`
        // mirrored) it exists already and belongs to a host user the sandbox may not write as, so
        // it is used as it is rather than opened; a symlink there would aim the bind elsewhere.
        // Made with one mknod in the common case (a fresh tmpfs), looked at only if something is
        // there already.
        Op::Touch { path } => match mknod_file(path, 0o644) {
            Err(libc::EEXIST) => match entry_kind(libc::AT_FDCWD, path)? {
                Some(libc::S_IFLNK) => Err(libc::ELOOP),
                Some(libc::S_IFDIR) => Err(libc::EISDIR),
                Some(_) => Ok(()),
                None => Err(libc::ENOENT),
            },
            r => r,
        },
        Op::Symlink { target, path } => symlink(target, path),
        Op::Write { path, data } => {
            let fd = openat(
                libc::AT_FDCWD,
                path,
                libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC | libc::O_NOFOLLOW,
                0o644,
            )?
            .into_raw_fd();
            let r = write_all(fd, data);
            close(fd);
            r
        }
        Op::Tmpfs { path, flags, data } => {
            mount(Some(c"tmpfs"), path, Some(c"tmpfs"), *flags, Some(data))
        }
        Op::Proc { path } => mount(
            Some(c"proc"),
            path,
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ),
        Op::Devpts { path } => mount(
            Some(c"devpts"),
            path,
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            // `max`: an instance's own ceiling on terminals. Without it every non-initial instance
            // draws on one host-wide pool (`kernel.pty.max` less `kernel.pty.reserve`, 3,072 by
            // default), which one payload could empty for every container and sandbox on the host.
            Some(c"newinstance,ptmxmode=0666,mode=0620,max=64"),
        ),
        Op::Bind {
            source,
            path,
            attrs,
        } => {
            let s = &sources[*source];
            let tree = if s.tree >= 0 {
                s.tree
            } else {
                let t = open_tree(
                    s.fd,
                    c"",
                    OPEN_TREE_CLONE
                        | OPEN_TREE_CLOEXEC
                        | libc::AT_EMPTY_PATH as u32
                        | libc::AT_RECURSIVE as u32,
                )
                .map(IntoRawFd::into_raw_fd);
                // The host path's descriptor is not needed past this point; init must not hold
                // handles to host directories for the rest of the run.
                close(s.fd);
                t?
            };
            let flags = libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32;
            mount_setattr(tree, c"", flags, *attrs, 0, -1)?;
            move_mount_fd(tree, libc::AT_FDCWD, path)?;
            close(tree);
            Ok(())
        }
        // In place, on the mount whose root `path` is (init's own /proc, mounted by an earlier
        // op): that mount itself becomes read-only, with no writable mount left beneath a
        // read-only one, and nothing stacked to copy and tear down at every run.
        Op::ReadOnly { path, optional } => {
            let attrs =
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
            let flags = libc::AT_RECURSIVE as u32
                | libc::AT_SYMLINK_NOFOLLOW as u32
                | libc::AT_NO_AUTOMOUNT as u32;
            match mount_setattr(libc::AT_FDCWD, path, flags, attrs, 0, -1) {
                Err(libc::ENOENT) if *optional => Ok(()),
                r => r,
            }
        }
        Op::Overlay { path, data } => mount(
            Some(c"overlay"),
            path,
            Some(c"overlay"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(data),
        ),
        Op::UserXattr { path } => xattr_roundtrip(path, c"user.palisade-check"),
        // Handled by the caller, which holds the supervisor's socket.
        Op::SendDir { .. } => Err(libc::EINVAL),
        Op::Detach { path } => umount2(path, libc::MNT_DETACH),
        Op::Rmdir { path } => rmdir(path),
        Op::BindFile { from, path } => {
            let tree =
                open_tree(libc::AT_FDCWD, from, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)?.into_raw_fd();
            let attrs =
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
            let r = mount_setattr(tree, c"", libc::AT_EMPTY_PATH as u32, attrs, 0, -1)
                .and_then(|()| move_mount_fd(tree, libc::AT_FDCWD, path));
            close(tree);
            r
        }
        Op::UserNsLimits => {
            // Each file opened from the directory: one path walk through /proc, not ten.
            let dir = openat(
                libc::AT_FDCWD,
                c"proc/sys/user",
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )?
            .into_raw_fd();
            let mut r = Ok(());
            for &(file, value, required) in USERNS_LIMITS {
                let fd = match openat(dir, file, libc::O_WRONLY, 0) {
                    Ok(fd) => fd.into_raw_fd(),
                    // An older kernel without this ceiling (fanotify's before 5.13).
                    Err(libc::ENOENT) if !required => continue,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                };
                r = write_all(fd, value);
                close(fd);
                if r.is_err() {
                    break;
                }
            }
            close(dir);
            r
        }
    }
}

/// The sandbox's user-namespace ceilings, written while init still holds its capabilities there:
/// the file (in the new root's `proc/sys/user`), the value, and whether a kernel must have it. No nested
/// namespace of any kind but two that setup itself still needs: the cgroup one, which init creates
/// at step 13, and mount namespaces, of which every `open_tree` clone in the steps after this one
/// makes an anonymous one (seccomp refuses namespace creation and the mount API to the payload;
/// this is the second wall for the rest). inotify and fanotify counts are also charged to
/// the namespace's owner, so the sandbox keeps to a small part of the owner's quota (default 128
/// instances per user).
const USERNS_LIMITS: &[(&std::ffi::CStr, &[u8], bool)] = &[
    (c"max_user_namespaces", b"0\n", true),
    (c"max_pid_namespaces", b"0\n", false),
    (c"max_net_namespaces", b"0\n", false),
    (c"max_ipc_namespaces", b"0\n", false),
    (c"max_uts_namespaces", b"0\n", false),
    (c"max_time_namespaces", b"0\n", false),
    (c"max_inotify_instances", b"32\n", false),
    (c"max_inotify_watches", b"16384\n", false),
    (c"max_fanotify_groups", b"0\n", false),
    (c"max_fanotify_marks", b"0\n", false),
];

/// A bound socket for one egress listener (TCP listening, or the DNS stub's UDP).
fn egress_socket(spec: &crate::plan::SockSpec) -> SysResult<c_int> {
    sys::bound_inet_socket(spec.udp(), spec.addr, spec.port)
}

fn open_pty(sock: c_int) -> SysResult<c_int> {
    let master = sys::openat(
        libc::AT_FDCWD,
        c"/dev/ptmx",
        libc::O_RDWR | libc::O_NOCTTY,
        0,
    )?
    .into_raw_fd();
    let slave = sys::pty_open_peer(master)?;
    sys::send_fds(sock, 0, &[master])?;
    sys::close(master);
    sys::close(sock);
    Ok(slave)
}

/// After setup: fork the payload, report whether its exec worked, then reap and forward signals
/// until it exits. Init's own exit then makes the kernel kill everything left in the namespace.
/// A warm payload (docs/engine.md, "Warm Python"): the zygote's interpreter, and the pipe the
/// run's code comes on.
#[derive(Clone, Copy)]
pub(crate) struct WarmPayload {
    pub py: crate::sys::Python,
    pub code: c_int,
}

pub(crate) fn supervise(
    plan: &Plan,
    fds: &ChildFds,
    ready: Prepared,
    stack_top: *mut u8,
    warm: Option<WarmPayload>,
) -> ! {
    let fail = |step: Step, e: i32| -> ! {
        send(
            fds.msg,
            Msg {
                kind: MSG_SETUP_ERROR,
                step: step as u32,
                index: 0,
                value: e,
            },
        );
        sys::exit(1)
    };
    // 13. Block every signal: init takes them with sigwaitinfo (a pid-namespace init ignores signals
    // it has no handler for, but blocked signals are queued and can be taken).
    let all = sys::SigSet::full();
    if let Err(e) = sys::sigprocmask(libc::SIG_BLOCK, &all) {
        fail(Step::Signals, e);
    }
    // The supervisor's "j": whatever it did in parallel with our setup (moving us into the run's
    // cgroup) is done, so the payload and all its descendants start inside.
    // With "j" may come the run's cgroup v1 `tasks` files: init moves itself in by writing "0".
    // A thread that moves itself spares the kernel the global threadgroup lock (and its RCU grace
    // period) that moving another process takes; the supervisor opened the files, so the
    // permission check is its own.
    match sys::recv_fds(fds.go) {
        Ok((b'j', files)) => {
            for fd in files {
                if let Err(e) = sys::write_all(fd.as_raw_fd(), b"0") {
                    fail(Step::CgroupJoin, e);
                }
                sys::close_owned(fd);
            }
        }
        _ => sys::exit(1),
    }
    // Now the cgroup namespace, rooted at the run's cgroup: the payload sees `/` as its cgroup and
    // nothing of the host's cgroup tree.
    if let Err(e) = sys::unshare(libc::CLONE_NEWCGROUP) {
        fail(Step::CgroupNamespace, e);
    }
    // 14. The payload is started like posix_spawn does it: CLONE_VM|CLONE_VFORK on a stack the plan
    // allocated, so init's memory is not copied and init resumes only once the payload has
    // exec'd (or failed to, writing the error into `args`, which the two share until then).
    // A warm payload is a fork instead (a copy of init, which holds the zygote's interpreter).
    let (pid, step, index, value) = match warm {
        Some(w) => fork_warm(plan, &ready, fds.go, w),
        None => spawn_cold(plan, &ready, fds.go, stack_top),
    };
    if pid < 0 {
        fail(Step::Fork, -pid);
    }
    sys::close(ready.slave);
    sys::close(ready.ruleset);
    // Init needs no privilege from here on: kill() of its own child with the same uid suffices.
    // Checked, not assumed: an init that kept its capabilities in the sandbox's namespace would be
    // a process the payload could target, so a failure ends the run before the payload is
    // reported as started.
    let dropped = sys::capset_empty().and_then(|()| sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1));
    if let Err(e) = dropped {
        let _ = sys::kill(pid, libc::SIGKILL);
        sys::reap(pid);
        fail(Step::DropInitPrivileges, e);
    }
    if value != 0 {
        let _ = sys::waitpid(pid, 0);
        // A setup step of the payload's own (e.g. Landlock) is reported as one of init's.
        let kind = if step != 0 {
            MSG_SETUP_ERROR
        } else {
            MSG_EXEC_ERROR
        };
        send(
            fds.msg,
            Msg {
                kind,
                step,
                index,
                value,
            },
        );
        sys::exit(1);
    }
    send(
        fds.msg,
        Msg {
            kind: MSG_STARTED,
            step: 0,
            index: 0,
            value: pid,
        },
    );
    loop {
        let Ok(sig) = sys::sigwaitinfo(&all) else {
            continue;
        };
        if sig == libc::SIGCHLD {
            loop {
                let (r, st) = sys::waitpid(-1, libc::WNOHANG).unwrap_or((-1, 0));
                if r == pid {
                    send(
                        fds.msg,
                        Msg {
                            kind: MSG_EXITED,
                            step: 0,
                            index: 0,
                            value: st,
                        },
                    );
                    hand_over_mount_ns(plan, fds.go);
                    sys::exit(0);
                }
                if r <= 0 {
                    break;
                }
            }
        } else {
            let _ = sys::kill(pid, sig);
        }
    }
}

/// What a run may leave in its own file systems (every tmpfs of its view together) for its
/// mount namespace to end after its report, off its path (see [`hand_over_mount_ns`]).
const HAND_OVER_MAX_BYTES: u64 = 8 << 20;
const HAND_OVER_MAX_FILES: u64 = 4096;

/// Step 21, init's last, once the payload has ended. The last reference to a mount namespace waits
/// for an expedited RCU grace period (every CPU interrupted) and tears its mounts down, and the
/// supervisor sees the run end (init's pidfd) only after init's exit has done so. When init is
/// the sandbox's last process and its file systems hold little, it sends a descriptor of its
/// mount namespace on its `go` socket, which the supervisor keeps open until the run's report
/// is out: the namespace then ends after it, off the run's path. Otherwise (processes left,
/// which init's exit kills; more than a few files), nothing is sent and the namespace ends with
/// init, inside the run's cgroup, as the work a run left is its own to pay for.
fn hand_over_mount_ns(plan: &Plan, go: c_int) {
    loop {
        match sys::waitpid(-1, libc::WNOHANG) {
            Ok((r, _)) if r > 0 => continue,
            Err(libc::ECHILD) => break,
            _ => return,
        }
    }
    let (mut bytes, mut files) = (0u64, 0u64);
    for op in &plan.ops {
        let Op::Tmpfs { path, .. } = op else {
            continue;
        };
        // On the stack, not the heap: in the in-process engine init is a clone of a process
        // that may have had other threads, one of which may have held the allocator's lock.
        let p = path.as_bytes();
        let mut buf = [0u8; libc::PATH_MAX as usize + 2];
        let lead = usize::from(!p.starts_with(b"/"));
        let end = lead + p.len();
        if end >= buf.len() {
            return;
        }
        buf[0] = b'/';
        buf[lead..end].copy_from_slice(p);
        let Ok(abs) = std::ffi::CStr::from_bytes_with_nul(&buf[..=end]) else {
            return;
        };
        match sys::fs_used(abs) {
            Ok((b, f)) => {
                bytes = bytes.saturating_add(b);
                files = files.saturating_add(f);
            }
            Err(_) => return,
        }
    }
    if bytes > HAND_OVER_MAX_BYTES || files > HAND_OVER_MAX_FILES {
        return;
    }
    if let Ok(ns) = sys::openat(libc::AT_FDCWD, c"/proc/self/ns/mnt", libc::O_RDONLY, 0) {
        let _ = sys::send_fds(go, b'm', &[ns.as_raw_fd()]);
        sys::close_owned(ns);
    }
}

/// The payload as `clone(CLONE_VM | CLONE_VFORK)` + `execve`: its pid (or minus the errno),
/// and the error it wrote before exiting, if any (step, index, errno).
fn spawn_cold(
    plan: &Plan,
    ready: &Prepared,
    notify_sock: c_int,
    stack_top: *mut u8,
) -> (i32, u32, u32, i32) {
    let mut args = PayloadArgs {
        plan,
        slave: ready.slave,
        ruleset: ready.ruleset,
        notify_sock,
        err_step: 0,
        err_index: 0,
        err_errno: 0,
    };
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the clone of the payload itself.
    // SAFETY: `stack_top` is the end of the plan's payload stack, live and used by nothing else
    // (init is suspended until the child execs or exits: CLONE_VFORK); `payload` runs only
    // async-signal-safe code, touches nothing of init's but `args`, and ends in execve or _exit.
    let cloned = unsafe { sys::clone_vm_vfork(stack_top, libc::SIGCHLD, &mut args, payload) };
    match cloned {
        // The child wrote these (if at all) before exec or exit.
        Ok((pid, _)) => (
            pid,
            sys::read_volatile(&args.err_step),
            sys::read_volatile(&args.err_index),
            sys::read_volatile(&args.err_errno),
        ),
        Err(e) => (-e, 0, 0, 0),
    }
}

/// A warm payload: a fork of init (single-threaded: the zygote was, and init is its clone), so
/// that it holds the zygote's started interpreter. It runs the same payload steps as every
/// payload, then hands the run's code to the interpreter. Its errors come back on a pipe, which
/// it closes unwritten once it has started.
fn fork_warm(
    plan: &Plan,
    ready: &Prepared,
    notify_sock: c_int,
    w: WarmPayload,
) -> (i32, u32, u32, i32) {
    let (status_r, status_w) = match sys::pipe() {
        Ok((r, w)) => (r.into_raw_fd(), w.into_raw_fd()),
        Err(e) => return (-e, 0, 0, 0),
    };
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the fork of a warm payload itself.
    // SAFETY: init is single-threaded (the zygote was, and init is its clone), so the child may
    // run ordinary code; glibc's fork gives it a correct thread id (the interpreter's locks and
    // OpenSSL's fork detection rely on it) and runs its fork handlers.
    let forked = unsafe { sys::fork() };
    if forked == Ok(0) {
        sys::close(status_r);
        if let Err((step, index, e)) = payload_steps(
            plan,
            ready.slave,
            ready.ruleset,
            notify_sock,
            Some([w.code, status_w]),
        ) {
            send(
                status_w,
                Msg {
                    kind: if step != 0 {
                        MSG_SETUP_ERROR
                    } else {
                        MSG_EXEC_ERROR
                    },
                    step,
                    index,
                    value: if e == 0 { libc::EIO } else { e },
                },
            );
            sys::exit(127);
        }
        crate::warm::run(&w.py, w.code, status_w)
    }
    sys::close(status_w);
    sys::close(w.code);
    let pid = match forked {
        Ok(pid) => pid,
        Err(e) => {
            sys::close(status_r);
            return (-e, 0, 0, 0);
        }
    };
    let mut b = [0u8; 16];
    let got = sys::read_full(status_r, &mut b);
    sys::close(status_r);
    match got {
        Ok(0) => (pid, 0, 0, 0),
        Ok(16) => {
            let m = Msg::from_bytes(&b);
            (pid, m.step, m.index, m.value)
        }
        _ => (pid, 0, u32::MAX, libc::EIO),
    }
}

/// What init and the payload share until the payload execs.
struct PayloadArgs<'a> {
    plan: &'a Plan,
    slave: c_int,
    /// The Landlock ruleset to enter, or -1 (waived).
    ruleset: c_int,
    /// Init's end of the supervisor socket, on which the payload sends its seccomp listener.
    notify_sock: c_int,
    /// A failed setup step (`Step as u32`), or 0 for an exec error / the generic payload step.
    err_step: u32,
    err_index: u32,
    err_errno: i32,
}

/// The payload's steps 15–19, the same for every payload: a failure is (step or 0, index or
/// `NO_CAND`, errno). `warm`: a warm payload's code and status pipes, kept open past step 18.
/// Async-signal-safe (the cold payload runs it between `clone(CLONE_VM)` and `execve`).
pub(crate) fn payload_steps(
    plan: &Plan,
    slave: c_int,
    ruleset: c_int,
    notify_sock: c_int,
    warm: Option<[c_int; 2]>,
) -> Result<(), (u32, u32, i32)> {
    // 15. Signals back to defaults (the supervisor may ignore SIGPIPE, as Rust does, and an
    //     ignored disposition survives exec), then a new session, the pty as controlling terminal,
    //     the scratch directory as working directory, umask 022, the rlimits (core dumps off,
    //     processes, open files, file size, CPU time, queued signals).
    let generic = |e| (0, NO_CAND, e);
    for sig in 1..=libc::SIGRTMAX() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            sys::signal_default(sig);
        }
    }
    let _ = sys::sigprocmask(libc::SIG_SETMASK, &sys::SigSet::empty());
    // A new session: no controlling terminal shared with the caller, so TIOCSTI cannot push
    // keystrokes into it (CVE-2017-5226).
    sys::setsid().map_err(generic)?;
    if slave >= 0 {
        sys::set_controlling_terminal(slave).map_err(generic)?;
        for t in 0..3 {
            let _ = sys::dup2(slave, t);
        }
        sys::close(slave);
    }
    sys::chdir(&plan.workdir).map_err(generic)?;
    sys::umask(0o022);
    // Limits: core dumps off, processes/threads, open files, file size. RLIMIT_NPROC is
    // counted per user namespace, so it bounds this sandbox alone.
    for &(res, soft, hard) in &plan.rlimits {
        sys::setrlimit(res, soft, hard).map_err(generic)?;
    }
    // 16. Landlock: from here on the payload and everything it starts read, execute and write
    //     only where the plan's rules allow, whatever the mount view shows. After the rlimits and
    //     before no_new_privs (the design's order), which the kernel otherwise requires: until
    //     step 17 the payload holds CAP_SYS_ADMIN in its own user namespace, which the kernel
    //     accepts instead. No capability bypasses Landlock, so dropping them later loses nothing.
    //     A plan that holds a ruleset and no descriptor for it is a bug, refused rather than run
    //     without the layer the report would claim.
    if plan.landlock.ruleset().is_some() && ruleset < 0 {
        return Err((Step::LandlockRestrict as u32, 0, libc::EBADF));
    }
    if ruleset >= 0 {
        if let Err(e) = sys::landlock_restrict_self(ruleset) {
            return Err((Step::LandlockRestrict as u32, 0, e));
        }
        sys::close(ruleset);
    }
    // 17. Capabilities: lock the securebits first (needs CAP_SETPCAP) so that no exec, not even of a
    // uid-0 process inside, grants capabilities again; then empty the bounding and ambient sets and
    // the thread's own sets; then no_new_privs.
    const SECBITS: libc::c_ulong = 0xEF; // NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, all locked; KEEP_CAPS off and locked
    if let Err(e) = sys::prctl(libc::PR_SET_SECUREBITS, SECBITS) {
        return Err((0, NO_CAND, e));
    }
    for cap in 0..64 {
        if sys::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
            break; // EINVAL past the kernel's last capability
        }
    }
    if let Err(e) = sys::prctl3(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as _, 0) {
        return Err((0, NO_CAND, e));
    }
    if let Err(e) = sys::capset_empty() {
        return Err((0, NO_CAND, e));
    }
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) {
        return Err((0, NO_CAND, e));
    }
    // 18. Everything but 0, 1, 2 closes at exec. A warm payload does not exec: it closes every
    //     other descriptor now but the supervisor socket (for the listener, closed after it), its
    //     code pipe and its status pipe.
    match warm {
        None => {
            let _ = sys::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
        }
        Some([code, status]) => {
            let mut keep = [notify_sock, code, status];
            keep.sort_unstable();
            sys::close_all_but(&keep).map_err(|e| (0, NO_CAND, e))?;
            // As an exec'd program would be (the init stays not dumpable).
            sys::prctl(libc::PR_SET_DUMPABLE, 1).map_err(|e| (0, NO_CAND, e))?;
        }
    }
    // 19. seccomp, last: after it, only the calls the filter allows are possible, and none of
    //     palisade's own setup needs to be.
    let prog = sys::SockFprog {
        len: plan.seccomp.len() as u16,
        filter: plan.seccomp.as_ptr(),
    };
    //     The listener it returns goes to the supervisor, which answers (and records) every call
    //     the filter refuses; our copy closes at exec. Sending is allowed by the filter.
    match sys::install_seccomp_listener(&prog) {
        Ok(listener) => {
            // A cold payload's copy stays open until the exec closes it.
            let listener = listener.into_raw_fd();
            if let Err(e) = sys::send_fds(notify_sock, b's', &[listener]) {
                return Err((0, NO_CAND, e));
            }
            if warm.is_some() {
                sys::close(listener);
                sys::close(notify_sock);
            }
        }
        Err(e) => return Err((0, NO_CAND, e)),
    }
    Ok(())
}

const NO_CAND: u32 = u32::MAX;

/// The cold payload, between `clone(CLONE_VM | CLONE_VFORK)` and `execve`: async-signal-safe.
fn payload(args: &mut PayloadArgs) -> ! {
    let (plan, slave, ruleset, notify_sock) =
        (args.plan, args.slave, args.ruleset, args.notify_sock);
    if let Err((step, index, e)) = payload_steps(plan, slave, ruleset, notify_sock, None) {
        payload_failed(args, step, index, e);
    }
    // 20. exec, searching the sandbox's PATH like execvp; an error goes back to init.
    let ex = &plan.exec;
    let mut result: (u32, i32) = (NO_CAND, libc::ENOENT);
    for (i, cand) in ex.candidates.iter().enumerate() {
        let e = sys::execve(cand, &ex.argv, &ex.envp);
        match e {
            // Like execvp: keep searching past missing entries; remember a permission error.
            libc::ENOENT | libc::ENOTDIR => {
                if result.0 == NO_CAND {
                    result = (i as u32, e);
                }
            }
            libc::EACCES => result = (i as u32, e),
            _ => payload_failed(args, 0, i as u32, e),
        }
    }
    payload_failed(args, 0, result.0, result.1)
}

/// The payload's error, written into init's `args` (shared memory until the exit), then exit.
fn payload_failed(args: &mut PayloadArgs, step: u32, index: u32, e: i32) -> ! {
    sys::write_volatile(&mut args.err_step, step);
    sys::write_volatile(&mut args.err_index, index);
    sys::write_volatile(&mut args.err_errno, if e == 0 { libc::EIO } else { e });
    sys::exit(127)
}
