//! Processes: `clone3`, `execve`, `_exit`, pidfds, ids, capabilities, `prctl`.

use super::{check, check_int, errno, Errno, SysResult};
use libc::{c_char, c_int, c_ulong};

pub const CLONE_NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
pub const CLONE_NEWNS: u64 = libc::CLONE_NEWNS as u64;
pub const CLONE_NEWPID: u64 = libc::CLONE_NEWPID as u64;
pub const CLONE_NEWNET: u64 = libc::CLONE_NEWNET as u64;
pub const CLONE_NEWIPC: u64 = libc::CLONE_NEWIPC as u64;
pub const CLONE_NEWUTS: u64 = libc::CLONE_NEWUTS as u64;
pub const CLONE_PIDFD: u64 = 0x1000;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What `clone3` returned.
pub enum Forked {
    /// In the parent: the child's pid and a pidfd for it.
    Parent { pid: i32, pidfd: c_int },
    /// In the child.
    Child,
}

/// `clone3` without a new stack (fork-like), with namespace `flags` and a pidfd.
///
/// # Safety
/// In the child, only async-signal-safe code may run until `exec` or `_exit`: if the parent has
/// other threads, any lock they held (the allocator's included) stays held forever in the child.
pub unsafe fn clone3(flags: u64) -> SysResult<Forked> {
    let mut pidfd: c_int = -1;
    // With CLONE_PARENT the kernel takes the exit signal from the parent's own (and refuses one
    // given here).
    let parent = flags & libc::CLONE_PARENT as u64 != 0;
    let mut args = CloneArgs {
        flags: flags | CLONE_PIDFD,
        pidfd: &mut pidfd as *mut c_int as u64,
        exit_signal: if parent { 0 } else { libc::SIGCHLD as u64 },
        ..Default::default()
    };
    // SAFETY: `args` is a valid, fully initialized clone_args of the size passed; with stack 0
    // the child continues on a copy of this stack, like fork(). The caller upholds the
    // async-signal-safety contract above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match check(r)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: pid as i32,
            pidfd,
        }),
    }
}

/// `pidfd_open(pid, 0)`: a pidfd for `pid` (race-free for an unreaped child of ours).
pub fn pidfd_open(pid: i32) -> SysResult<c_int> {
    // SAFETY: integer arguments; returns a new descriptor.
    check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) }).map(|fd| fd as c_int)
}

/// `getrandom(buf, 0)`, the whole buffer.
pub fn getrandom(buf: &mut [u8]) -> SysResult<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unfilled part of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        done += check(n as libc::c_long)? as usize;
    }
    Ok(())
}

/// `prctl(option, arg2, 0, 0, 0)`.
pub fn prctl(option: c_int, arg2: c_ulong) -> SysResult<c_int> {
    // SAFETY: the options used here take integer arguments only.
    check_int(unsafe { libc::prctl(option, arg2, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) })
}

/// `prctl(option, arg2, arg3, 0, 0)`.
pub fn prctl3(option: c_int, arg2: c_ulong, arg3: c_ulong) -> SysResult<c_int> {
    // SAFETY: the options used here take integer arguments only.
    check_int(unsafe { libc::prctl(option, arg2, arg3, 0 as c_ulong, 0 as c_ulong) })
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Empties the effective, permitted and inheritable capability sets of the calling thread.
pub fn capset_empty() -> SysResult<()> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: version 3 takes a header and two data records, both valid for the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) })
        .map(drop)
}

/// The calling thread's capability sets: (effective, permitted, inheritable), 64 bits each.
pub fn capget() -> SysResult<(u64, u64, u64)> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: version 3 takes a header and two data records, which the kernel fills in.
    check(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &hdr as *const CapHeader,
            data.as_mut_ptr(),
        )
    })?;
    let join = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | u64::from(f(&data[1])) << 32;
    Ok((
        join(|d| d.effective),
        join(|d| d.permitted),
        join(|d| d.inheritable),
    ))
}

/// Sets the calling thread's capability sets (effective, permitted, inheritable).
pub fn capset(effective: u64, permitted: u64, inheritable: u64) -> SysResult<()> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let half = |v: u64, hi: bool| if hi { (v >> 32) as u32 } else { v as u32 };
    let data = [false, true].map(|hi| CapData {
        effective: half(effective, hi),
        permitted: half(permitted, hi),
        inheritable: half(inheritable, hi),
    });
    // SAFETY: version 3 takes a header and two data records, both valid for the call.
    check(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) })
        .map(drop)
}

/// The capabilities of the calling thread's bounding set, as a mask.
pub fn bounding_set() -> u64 {
    let mut m = 0u64;
    for cap in 0..64 {
        match prctl(libc::PR_CAPBSET_READ, cap) {
            Ok(1) => m |= 1 << cap,
            Ok(_) => {}
            Err(_) => break, // EINVAL past the kernel's last capability
        }
    }
    m
}

/// Makes every capability the thread holds (and its bounding set allows) ambient, so that it
/// survives an `execve` of a program without file capabilities: inheritable first (the kernel
/// requires a capability there before it can be ambient), then each one raised. Returns the
/// ambient set. Raw system calls only (used between `clone` and `execve`).
pub fn raise_ambient_all() -> SysResult<u64> {
    let (eff, perm, _) = capget()?;
    let want = perm & bounding_set();
    capset(eff, perm, want)?;
    for cap in 0..64 {
        if want & (1 << cap) != 0 {
            prctl3(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE as _, cap)?;
        }
    }
    Ok(want)
}

/// `execveat(dirfd, "", argv, envp, AT_EMPTY_PATH)`: executes the file `dirfd` is open on (an
/// `O_PATH` descriptor is enough), so no path is looked up again. Returns only on failure.
///
/// # Safety
/// `argv` and `envp` must be NULL-terminated arrays of NUL-terminated strings, alive until the
/// call returns.
pub unsafe fn execveat_fd(
    dirfd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> Errno {
    // SAFETY: the path is an empty NUL-terminated string; the arrays are upheld by the caller.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            dirfd,
            c"".as_ptr(),
            argv,
            envp,
            libc::AT_EMPTY_PATH,
        )
    };
    errno()
}

/// `setgroups(0, NULL)` as a raw system call (see `setresuid`).
pub fn setgroups_empty() -> SysResult<()> {
    // SAFETY: an empty group list.
    check(unsafe { libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) })
        .map(drop)
}

/// `setresuid(id, id, id)` as a raw system call: glibc's wrapper would try to synchronize with
/// threads that do not exist in a child of `clone3`.
pub fn setresuid(id: u32) -> SysResult<()> {
    // SAFETY: changes this thread's ids only.
    check(unsafe { libc::syscall(libc::SYS_setresuid, id, id, id) }).map(drop)
}

/// `setresgid(id, id, id)` as a raw system call (see `setresuid`).
pub fn setresgid(id: u32) -> SysResult<()> {
    // SAFETY: changes this thread's ids only.
    check(unsafe { libc::syscall(libc::SYS_setresgid, id, id, id) }).map(drop)
}

/// `execve(path, argv, envp)`; returns only on failure.
///
/// # Safety
/// `path` must be a NUL-terminated string, `argv` and `envp` NULL-terminated arrays of
/// NUL-terminated strings, all alive until the call returns.
pub unsafe fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> Errno {
    // SAFETY: upheld by the caller, see above.
    unsafe { libc::execve(path, argv, envp) };
    errno()
}

/// `_exit(code)`: leaves without running atexit handlers or destructors (the parent's).
pub fn exit(code: c_int) -> ! {
    // SAFETY: `_exit` is async-signal-safe and never returns.
    unsafe { libc::_exit(code) }
}

// ---- Supervisor side: called from ordinary threads, never from the child after clone3. ----

/// The calling thread's effective uid and gid changed for the length of one `clone3`, so that the
/// user namespace it creates is owned by `uid` (the kernel charges the namespace's per-user counts
/// — inotify instances, queued signals, processes — up to its owner, see `spawn.rs`). Only this
/// thread changes: raw system calls, not glibc's, which would change every thread of the process.
/// Dropping it restores the ids, and the dumpable flag and parent-death signal that a change of
/// effective id resets (`commit_creds`).
pub struct EffectiveIds {
    uid: u32,
    gid: u32,
    dumpable: c_ulong,
    pdeath: c_int,
}

impl EffectiveIds {
    /// Switches the calling thread's real and effective uid and gid to `uid`/`gid`. Needs them
    /// to be 0 before; the saved ids stay 0, so the switch back is allowed. The real ids change
    /// too: a child that execs at once (the exec engine) must not carry a real id that differs
    /// from its effective one, which older kernels (6.1, 6.12) treat as a privilege change and
    /// answer by leaving the exec'd init without capabilities in its namespace.
    pub fn switch(uid: u32, gid: u32) -> SysResult<EffectiveIds> {
        // SAFETY: id queries have no preconditions.
        let (old_uid, old_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let dumpable = prctl(libc::PR_GET_DUMPABLE, 0)? as c_ulong;
        let mut pdeath: c_int = 0;
        // SAFETY: PR_GET_PDEATHSIG writes one int through the pointer, which is valid.
        check_int(unsafe { libc::prctl(libc::PR_GET_PDEATHSIG, &mut pdeath as *mut c_int) })?;
        let keep = u32::MAX; // -1: leave this id as it is
                             // The gid first: once the effective uid is not 0 the thread has no CAP_SETGID.
                             // SAFETY: changes this thread's effective gid only.
        check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, keep) })?;
        let saved = EffectiveIds {
            uid: old_uid,
            gid: old_gid,
            dumpable,
            pdeath,
        };
        // SAFETY: changes this thread's real and effective uid only; on failure `saved` restores
        // the gid.
        check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, keep) })?;
        Ok(saved)
    }
}

impl Drop for EffectiveIds {
    fn drop(&mut self) {
        let keep = u32::MAX;
        // SAFETY: back to the saved ids (allowed: the saved uid is still the old one); the uid
        // first, which gives back CAP_SETGID for the gid.
        unsafe {
            libc::syscall(libc::SYS_setresuid, self.uid, self.uid, keep);
            libc::syscall(libc::SYS_setresgid, self.gid, self.gid, keep);
        }
        let _ = prctl(libc::PR_SET_DUMPABLE, self.dumpable);
        if self.pdeath != 0 {
            let _ = prctl(libc::PR_SET_PDEATHSIG, self.pdeath as c_ulong);
        }
    }
}

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> std::time::Duration {
    // SAFETY: an all-zero timespec is valid to be overwritten.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the timespec, which is valid for writes.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
