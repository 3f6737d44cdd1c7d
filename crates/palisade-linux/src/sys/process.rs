//! Processes: `clone3`, `execve`, `_exit`, pidfds, ids, capabilities, `prctl`.

use super::{check, check_int, errno, owned, Errno, SysResult};
use libc::{c_char, c_int, c_ulong};
use std::ffi::{CStr, CString};
use std::os::fd::{FromRawFd, OwnedFd};

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
    Parent { pid: i32, pidfd: OwnedFd },
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
            // SAFETY: with CLONE_PIDFD the kernel made this descriptor for us.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// `pidfd_open(pid, 0)`: a pidfd for `pid` (race-free for an unreaped child of ours).
pub fn pidfd_open(pid: i32) -> SysResult<OwnedFd> {
    // SAFETY: integer arguments; returns a new descriptor.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })
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

/// Strings as `execve` takes them: the strings, and a NULL-terminated array of pointers to
/// them, built once (the child side of a clone cannot allocate).
pub struct CStrArray {
    strings: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

// SAFETY: the pointers point into the heap buffers of `strings`, owned by the same value, which
// never move or change while it lives (no `&mut` access is given out); they are only read, by
// execve. Sending or sharing the value therefore shares nothing but immutable strings.
unsafe impl Send for CStrArray {}
// SAFETY: as for Send.
unsafe impl Sync for CStrArray {}

impl CStrArray {
    /// The array over `strings`, in their order.
    pub fn new(strings: Vec<CString>) -> CStrArray {
        let ptrs = strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        CStrArray { strings, ptrs }
    }

    /// The pointer array, ending with NULL.
    pub fn as_ptrs(&self) -> &[*const c_char] {
        &self.ptrs
    }

    /// The strings back.
    pub fn into_strings(self) -> Vec<CString> {
        self.strings
    }
}

impl std::ops::Deref for CStrArray {
    type Target = [CString];
    fn deref(&self) -> &[CString] {
        &self.strings
    }
}

impl std::fmt::Debug for CStrArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.strings).finish()
    }
}

/// `execveat(dirfd, "", argv, envp, AT_EMPTY_PATH)`: executes the file `dirfd` is open on (an
/// `O_PATH` descriptor is enough), so no path is looked up again. Returns only on failure.
#[inline]
pub fn execveat_fd(dirfd: c_int, argv: &CStrArray, envp: &CStrArray) -> Errno {
    // SAFETY: the path is an empty NUL-terminated string; both arrays are NULL-terminated and
    // point at strings they own, alive across the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            dirfd,
            c"".as_ptr(),
            argv.ptrs.as_ptr(),
            envp.ptrs.as_ptr(),
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

/// The calling thread's real, effective and saved user and group ids (raw system calls: the
/// thread's own, which a thread may have changed for itself).
pub fn thread_ids() -> [u32; 6] {
    let (mut r, mut e, mut s) = (0, 0, 0);
    let (mut gr, mut ge, mut gs) = (0, 0, 0);
    // SAFETY: each call writes three ids to valid locations.
    unsafe {
        libc::syscall(
            libc::SYS_getresuid,
            &mut r as *mut u32,
            &mut e as *mut u32,
            &mut s as *mut u32,
        );
        libc::syscall(
            libc::SYS_getresgid,
            &mut gr as *mut u32,
            &mut ge as *mut u32,
            &mut gs as *mut u32,
        );
    }
    [r, e, s, gr, ge, gs]
}

/// Names the calling thread (`PR_SET_NAME`: at most 15 bytes kept).
pub fn set_thread_name(name: &std::ffi::CStr) {
    // SAFETY: a valid NUL-terminated string, which the kernel copies.
    unsafe {
        libc::prctl(
            libc::PR_SET_NAME,
            name.as_ptr() as c_ulong,
            0 as c_ulong,
            0 as c_ulong,
            0 as c_ulong,
        )
    };
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
#[inline]
pub fn execve(path: &CStr, argv: &CStrArray, envp: &CStrArray) -> Errno {
    // SAFETY: `path` is NUL-terminated; both arrays are NULL-terminated and point at strings
    // they own, alive across the call.
    unsafe { libc::execve(path.as_ptr(), argv.ptrs.as_ptr(), envp.ptrs.as_ptr()) };
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

/// The effective uid of this process.
pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective gid of this process.
pub fn getegid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getegid() }
}

/// CPUs the host has configured (`sysconf(_SC_NPROCESSORS_CONF)`), at least 1.
pub fn cpus_configured() -> usize {
    // SAFETY: an integer argument only.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as usize
}

/// Whether this process may create a user namespace: a child is cloned into a new one
/// (`clone(CLONE_NEWUSER | SIGCHLD)`, fork-like) and exits at once, then is reaped.
pub fn try_user_namespace() -> SysResult<()> {
    // SAFETY: a raw clone without CLONE_VM and without a stack behaves like fork; the child
    // calls only _exit, which is async-signal-safe, so the caller's other threads cannot matter.
    let pid = check(unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    })?;
    if pid == 0 {
        exit(0);
    }
    let _ = waitpid(pid as libc::pid_t, 0);
    Ok(())
}

/// `waitpid(pid, options)`: the pid reaped (0 with `WNOHANG` and none ready) and its status.
#[inline]
pub fn waitpid(pid: libc::pid_t, options: c_int) -> SysResult<(libc::pid_t, c_int)> {
    let mut st: c_int = 0;
    // SAFETY: a valid out-pointer for the status.
    let r = check_int(unsafe { libc::waitpid(pid, &mut st, options) })?;
    Ok((r, st))
}

/// `waitpid(pid, NULL, 0)`: reaps `pid`, its status not wanted.
#[inline]
pub fn reap(pid: libc::pid_t) {
    // SAFETY: a NULL status pointer is allowed.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
}

/// `wait4(pid, 0)`: reaps `pid`; its status and the resources it and every child it reaped used.
pub fn wait4(pid: libc::pid_t) -> SysResult<(c_int, libc::rusage)> {
    let mut st: c_int = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers for the status and the rusage.
    check_int(unsafe { libc::wait4(pid, &mut st, 0, &mut ru) })?;
    Ok((st, ru))
}

/// `umask(mask)`: the process's file-creation mask; the old one.
#[inline]
pub fn umask(mask: libc::mode_t) -> libc::mode_t {
    // SAFETY: an integer argument; cannot fail.
    unsafe { libc::umask(mask) }
}

/// `chdir(path)`.
#[inline]
pub fn chdir(path: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// `sethostname(name)` (of the calling process's UTS namespace).
#[inline]
pub fn sethostname(name: &[u8]) -> SysResult<()> {
    // SAFETY: the pointer and length describe `name`.
    check_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// `setsid()`: a new session (and process group) led by the caller.
#[inline]
pub fn setsid() -> SysResult<()> {
    // SAFETY: no arguments.
    check_int(unsafe { libc::setsid() }).map(drop)
}

/// `setrlimit(resource, {soft, hard})`.
#[inline]
pub fn setrlimit(resource: u32, soft: u64, hard: u64) -> SysResult<()> {
    let l = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: reads a valid rlimit.
    check_int(unsafe { libc::setrlimit(resource as _, &l) }).map(drop)
}

/// `access(path, mode)` with the real ids.
pub fn access(path: &std::ffi::CStr, mode: c_int) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::access(path.as_ptr(), mode) }).map(drop)
}

/// `faccessat(AT_FDCWD, path, mode, AT_EACCESS)`: with the effective ids.
pub fn access_effective(path: &std::ffi::CStr, mode: c_int) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mode, libc::AT_EACCESS) })
        .map(drop)
}

/// `getrandom(buf, GRND_NONBLOCK)` once: how many bytes it filled (0 on any failure, the rest
/// of `buf` left as it was).
pub fn getrandom_nonblock(buf: &mut [u8]) -> usize {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    n.max(0) as usize
}

/// `fork()` (glibc's: it runs the fork handlers and gives the child a correct thread id):
/// `Ok(0)` in the child, the child's pid in the parent.
///
/// # Safety
/// The calling process must be single-threaded, or the child must keep to async-signal-safe
/// code until `exec` or `_exit` (a lock another thread held stays held in the child).
#[inline]
pub unsafe fn fork() -> SysResult<libc::pid_t> {
    // SAFETY: upheld by the caller, see above.
    check_int(unsafe { libc::fork() })
}

/// `clone(CLONE_VM | CLONE_VFORK | flags)` with `entry(arg)` as the child, on the stack that ends
/// at `stack_top`: like `posix_spawn`, the child shares this process's memory and the calling
/// thread stays suspended until the child has exec'd or exited, so `arg` lives (and is the
/// parent's again) when this returns. `flags` may hold namespace flags, `CLONE_PIDFD` (then
/// the pidfd is returned) and the exit signal. The child's pid.
///
/// # Safety
/// `stack_top` is the end of a live, writable buffer that nothing else uses until this returns,
/// large enough for `entry`. `entry` runs in the child between `clone` and `exec`: it must be
/// async-signal-safe (no allocation, no lock: the parent's memory, locks included, is shared
/// and frozen mid-use) and must end in `execve` or `_exit`, never return into the parent's
/// frames.
pub unsafe fn clone_vm_vfork<T>(
    stack_top: *mut u8,
    flags: c_int,
    arg: &mut T,
    entry: fn(&mut T) -> !,
) -> SysResult<(libc::pid_t, Option<OwnedFd>)> {
    struct Call<T> {
        arg: *mut T,
        entry: fn(&mut T) -> !,
    }
    extern "C" fn trampoline<T>(p: *mut libc::c_void) -> c_int {
        // SAFETY: `p` is the Call below, alive on the parent's suspended stack (CLONE_VFORK),
        // and its `arg` is the caller's exclusive borrow, which only the child uses meanwhile.
        let call = unsafe { &*p.cast::<Call<T>>() };
        // SAFETY: as above.
        (call.entry)(unsafe { &mut *call.arg })
    }
    let mut call = Call {
        arg: arg as *mut T,
        entry,
    };
    // Aligned down to 16 bytes, as the ABI wants at a call.
    let top = (stack_top as usize & !15) as *mut libc::c_void;
    let mut pidfd: c_int = -1;
    // SAFETY: the caller upholds the stack and child contracts; `call` outlives the child's use
    // of it (CLONE_VFORK). With CLONE_PIDFD the kernel stores the pidfd through parent_tid.
    let pid = unsafe {
        libc::clone(
            trampoline::<T>,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | flags,
            (&mut call as *mut Call<T>).cast(),
            &mut pidfd as *mut c_int,
        )
    };
    let pid = check_int(pid)?;
    let pidfd = (flags & libc::CLONE_PIDFD != 0).then(|| {
        // SAFETY: with CLONE_PIDFD the kernel made this descriptor for us.
        unsafe { OwnedFd::from_raw_fd(pidfd) }
    });
    Ok((pid, pidfd))
}

/// Writes `v` to `*r` with a volatile store: for a value another task reads through shared
/// memory (a `CLONE_VM` child reporting to its parent before `_exit`), so the store is kept.
#[inline]
pub fn write_volatile<T: Copy>(r: &mut T, v: T) {
    // SAFETY: `r` is a valid, aligned, exclusive reference.
    unsafe { std::ptr::write_volatile(r, v) }
}

/// Reads `*r` with a volatile load: for a value another task wrote through shared memory (a
/// `CLONE_VM` child), so the read is not folded with an earlier one.
#[inline]
pub fn read_volatile<T: Copy>(r: &T) -> T {
    // SAFETY: `r` is a valid, aligned reference to an initialized `T`.
    unsafe { std::ptr::read_volatile(r) }
}

/// Overwrites `b` with zeros through volatile stores, which the compiler keeps even when the
/// buffer is freed right after (wiping a secret before it goes back to the allocator).
pub fn volatile_zero(b: &mut [u8]) {
    for x in b.iter_mut() {
        // SAFETY: a write through a valid, exclusive reference.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
}

/// Has `cmd`'s child, after its fork and before its exec, write one byte `0` into each of `fds`,
/// and a byte into `failed` for each write that fails. The command holds the descriptors until it
/// is dropped.
pub fn write_zero_before_exec(
    cmd: &mut std::process::Command,
    fds: Vec<std::os::fd::OwnedFd>,
    failed: std::os::fd::OwnedFd,
) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let raw: Vec<c_int> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fail = failed.as_raw_fd();
    let held = (fds, failed);
    // SAFETY: the closure runs in the forked child before its exec and only calls write(2) on
    // descriptors the closure itself keeps open: it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            let _ = &held;
            for &fd in &raw {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    libc::write(fail, b"x".as_ptr().cast(), 1);
                }
            }
            Ok(())
        });
    }
}

/// Sets glibc's mapping threshold to `bytes`, fixed: allocations as large or larger are mapped on
/// their own and unmapped when freed, and the threshold is no longer raised to the largest such
/// buffer freed (which kept later ones of that size in the heap, never given back). Nothing
/// elsewhere than glibc.
pub fn set_mmap_threshold(bytes: c_int) {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of the allocator, whatever the value.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = bytes;
}
