//! Raw system calls that `libc` does not wrap, and small helpers around the ones it does.
//!
//! Every function here is async-signal-safe: a system call and nothing else, no allocation, no
//! lock. The sandbox's child side (after `clone3`) uses only these. Errors come back as the raw
//! `errno` value so the child can send them to the supervisor in a fixed-size record.

use libc::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

/// A raw `errno` value.
pub type Errno = i32;

/// The result of a raw call.
pub type SysResult<T> = Result<T, Errno>;

pub const CLONE_NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
pub const CLONE_NEWNS: u64 = libc::CLONE_NEWNS as u64;
pub const CLONE_NEWPID: u64 = libc::CLONE_NEWPID as u64;
pub const CLONE_NEWNET: u64 = libc::CLONE_NEWNET as u64;
pub const CLONE_NEWIPC: u64 = libc::CLONE_NEWIPC as u64;
pub const CLONE_NEWUTS: u64 = libc::CLONE_NEWUTS as u64;
pub const CLONE_PIDFD: u64 = 0x1000;

pub const OPEN_TREE_CLONE: c_uint = 1;
pub const OPEN_TREE_CLOEXEC: c_uint = libc::O_CLOEXEC as c_uint;
pub const MOVE_MOUNT_F_EMPTY_PATH: c_uint = 0x4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;

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

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn errno() -> Errno {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid to read.
    unsafe { *libc::__errno_location() }
}

fn check(r: c_long) -> SysResult<c_long> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn check_int(r: c_int) -> SysResult<c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
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

/// `openat2(AT_FDCWD, path, O_PATH|O_CLOEXEC, resolve)`.
pub fn open_path_noresolve(path: &std::ffi::CStr, resolve: u64) -> SysResult<c_int> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    check(r).map(|fd| fd as c_int)
}

/// `open_tree(dirfd, path, flags)`; use `c""` with `AT_EMPTY_PATH` for the fd itself.
pub fn open_tree(dirfd: c_int, path: &std::ffi::CStr, flags: c_uint) -> SysResult<c_int> {
    // SAFETY: `path` is NUL-terminated; the call only reads it.
    let r = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    check(r).map(|fd| fd as c_int)
}

/// `mount_setattr(dirfd, path, flags, {attr_set, attr_clr, userns_fd})`.
pub fn mount_setattr(
    dirfd: c_int,
    path: &std::ffi::CStr,
    flags: c_uint,
    set: u64,
    clr: u64,
    userns: c_int,
) -> SysResult<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: userns.max(0) as u64,
    };
    // SAFETY: `path` is NUL-terminated and `attr` is a valid mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(r).map(drop)
}

/// `move_mount(from_fd, "", to_dirfd, to_path, MOVE_MOUNT_F_EMPTY_PATH)`.
pub fn move_mount_fd(from: c_int, to_dirfd: c_int, to: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            c"".as_ptr(),
            to_dirfd,
            to.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(r).map(drop)
}

/// `mount(2)`. `None` passes NULL.
pub fn mount(
    src: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: c_ulong,
    data: Option<&std::ffi::CStr>,
) -> SysResult<()> {
    let p = |c: Option<&std::ffi::CStr>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            p(src),
            target.as_ptr(),
            p(fstype),
            flags,
            p(data).cast::<c_void>(),
        )
    };
    check_int(r).map(drop)
}

/// `pivot_root(new, old)`.
pub fn pivot_root(new: &std::ffi::CStr, old: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, new.as_ptr(), old.as_ptr()) };
    check(r).map(drop)
}

/// `umount2(path, flags)`.
pub fn umount2(path: &std::ffi::CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::umount2(path.as_ptr(), flags) }).map(drop)
}

/// `close_range(first, last, flags)`.
pub fn close_range(first: c_uint, last: c_uint, flags: c_uint) -> SysResult<()> {
    // SAFETY: closes descriptors only; the caller decides which.
    check(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }).map(drop)
}

/// `close(fd)`, ignoring the result (nothing useful can be done about it).
pub fn close(fd: c_int) {
    if fd >= 0 {
        // SAFETY: closing a descriptor the caller owns.
        unsafe { libc::close(fd) };
    }
}

/// Writes all of `buf`, retrying on `EINTR` and short writes.
pub fn write_all(fd: c_int, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid slice for its length.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        buf = &buf[r as usize..];
    }
    Ok(())
}

/// Sends all of `buf` on a socket, retrying on `EINTR` and short sends; a peer that is gone is
/// `EPIPE`, never a `SIGPIPE`.
pub fn send_all(fd: c_int, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid slice for its length.
        let r = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        buf = &buf[r as usize..];
    }
    Ok(())
}

/// Reads into `buf` until it is full or end of file; returns the bytes read.
pub fn read_full(fd: c_int, buf: &mut [u8]) -> SysResult<usize> {
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let r = unsafe { libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            break;
        }
        n += r as usize;
    }
    Ok(n)
}

/// Whether the other end of pipe `fd` (a read end) is closed.
pub fn hung_up(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polling one valid pollfd without waiting.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & libc::POLLHUP != 0
}

/// Whether `fd` becomes readable (data, end of file or an error) within `ms` milliseconds.
pub fn readable_within(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: polling one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r >= 0 || errno() != libc::EINTR {
            return r > 0;
        }
    }
}

/// `struct sock_fprog`.
#[repr(C)]
pub struct SockFprog {
    pub len: u16,
    pub filter: *const crate::seccomp::SockFilter,
}

/// Installs a seccomp filter on the calling thread (no_new_privs must be set) and returns its
/// user-notification listener (close-on-exec), through which another process answers the calls
/// the filter sends to it (`SECCOMP_RET_USER_NOTIF`). Async-signal-safe: one system call.
pub fn install_seccomp_listener(prog: &SockFprog) -> SysResult<c_int> {
    // SAFETY: `prog` points at `len` valid instructions that outlive the call (the kernel copies
    // them); the flag asks for a new descriptor, which becomes ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            prog as *const SockFprog,
        )
    };
    check_int(r as c_int)
}

/// One system call a seccomp filter handed to its listener.
#[derive(Debug, Clone, Copy)]
pub struct SeccompNotice {
    pub id: u64,
    /// The calling thread, in the listener's pid namespace.
    pub pid: u32,
    pub nr: i32,
    pub arch: u32,
    pub args: [u64; 6],
}

/// Takes the next notification from a seccomp listener (blocks if there is none; poll first).
pub fn seccomp_notif_recv(listener: c_int) -> SysResult<SeccompNotice> {
    // SAFETY: the kernel requires a zeroed struct, which an all-zero seccomp_notif is; it fills
    // it in on success.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl with the request's own struct type, which outlives the call.
    let r = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n) };
    check_int(r)?;
    Ok(SeccompNotice {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr,
        arch: n.data.arch,
        args: n.data.args,
    })
}

/// Answers notification `id`: the call fails with `errno` and never runs.
pub fn seccomp_notif_fail(listener: c_int, id: u64, errno: i32) -> SysResult<()> {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: ioctl with the request's own struct type, which outlives the call.
    check_int(unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) }).map(drop)
}

/// Answers notification `id`: the kernel runs the call as if the filter had allowed it. Only for
/// calls the supervisor watches without deciding (`connect` without egress, recorded for the
/// report): what the caller changes in its memory after the supervisor looked cannot change
/// the call's outcome, which the kernel's own checks (Landlock, the empty namespace) decide.
pub fn seccomp_notif_continue(listener: c_int, id: u64) -> SysResult<()> {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: 0,
        flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    };
    // SAFETY: ioctl with the request's own struct type, which outlives the call.
    check_int(unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) }).map(drop)
}

/// Whether notification `id` is still pending: its caller has not died (so a pid read from it
/// still names that caller).
pub fn seccomp_notif_valid(listener: c_int, id: u64) -> bool {
    let mut id = id;
    // SAFETY: ioctl with a pointer to a u64, which outlives the call.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id) == 0 }
}

/// Reads `buf.len()` bytes at `addr` in process `pid`'s memory (the caller must be allowed to
/// trace it); the number read.
pub fn read_process_memory(pid: u32, addr: u64, buf: &mut [u8]) -> SysResult<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes our own buffer, valid for `buf.len()` bytes of writing; `remote`
    // is only an address in the other process, which the kernel checks (EFAULT), never ours.
    let r = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if r < 0 {
        return Err(errno());
    }
    Ok(r as usize)
}

/// The type (`SOCK_STREAM`, `SOCK_DGRAM`, …) of descriptor `fd` of process `pid`, if it is a
/// socket the caller may look at: a copy of the descriptor taken for one `getsockopt`, then
/// closed.
pub fn socket_type_of(pid: u32, fd: c_int) -> Option<c_int> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor, which we own.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return None;
    }
    let pidfd = pidfd as c_int;
    // SAFETY: pidfd_getfd duplicates the target's descriptor into this process; we own the copy.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
    close(pidfd);
    if copy < 0 {
        return None;
    }
    let copy = copy as c_int;
    let mut ty: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `ty`, which outlives the call.
    let r = unsafe {
        libc::getsockopt(
            copy,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut c_int).cast(),
            &mut len,
        )
    };
    close(copy);
    (r == 0).then_some(ty)
}

/// `struct landlock_ruleset_attr` as of Landlock ABI 6 (the kernel accepts a larger struct than
/// it knows as long as the fields it does not know are zero, so one layout serves every ABI).
#[repr(C)]
pub struct LandlockRulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header too: 12 bytes).
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct landlock_net_port_attr` (16 bytes, not packed).
#[repr(C)]
struct LandlockNetPortAttr {
    allowed_access: u64,
    port: u64,
}

const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;
const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;
const LANDLOCK_RULE_NET_PORT: c_int = 2;

/// The kernel's Landlock ABI version: `landlock_create_ruleset(NULL, 0, VERSION)`. `ENOSYS` when
/// the kernel was built without Landlock, `EOPNOTSUPP` when it is built in but not enabled at boot.
pub fn landlock_abi() -> SysResult<u32> {
    // SAFETY: with the VERSION flag the kernel requires a NULL attribute and size 0, and reads
    // nothing; it only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    check(r).map(|v| v as u32)
}

/// `landlock_create_ruleset(attr, sizeof attr, 0)`: a new ruleset descriptor (close-on-exec).
pub fn landlock_create_ruleset(attr: &LandlockRulesetAttr) -> SysResult<c_int> {
    // SAFETY: `attr` is a live, fully initialized struct and the size passed is its own, so the
    // kernel reads exactly the bytes we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const LandlockRulesetAttr,
            std::mem::size_of::<LandlockRulesetAttr>(),
            0 as c_uint,
        )
    };
    check(r).map(|fd| fd as c_int)
}

/// `landlock_add_rule(ruleset, PATH_BENEATH, {access, parent}, 0)`: `access` under the file or
/// directory `parent` is open on (an `O_PATH` descriptor is enough).
pub fn landlock_add_path_rule(ruleset: c_int, parent: c_int, access: u64) -> SysResult<()> {
    let attr = LandlockPathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: `attr` lives on this stack frame for the whole call and has the packed layout the
    // kernel copies for PATH_BENEATH rules; the kernel does not keep the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0 as c_uint,
        )
    };
    check(r).map(drop)
}

/// `landlock_add_rule(ruleset, NET_PORT, {access, port}, 0)`: `access` (TCP bind, connect) on
/// `port`, whatever the address (Landlock ABI 4).
pub fn landlock_add_port_rule(ruleset: c_int, port: u16, access: u64) -> SysResult<()> {
    let attr = LandlockNetPortAttr {
        allowed_access: access,
        port: u64::from(port),
    };
    // SAFETY: `attr` lives on this stack frame for the whole call and has the layout the kernel
    // copies for NET_PORT rules; the kernel does not keep the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_NET_PORT,
            &attr as *const LandlockNetPortAttr,
            0 as c_uint,
        )
    };
    check(r).map(drop)
}

/// `landlock_restrict_self(ruleset, 0)`: the calling thread (and everything it starts from now on)
/// enters the ruleset's domain, for good. Needs no_new_privs or `CAP_SYS_ADMIN` in its user
/// namespace.
pub fn landlock_restrict_self(ruleset: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only; the call changes this thread's own credentials.
    check(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as c_uint) })
        .map(drop)
}

/// Most descriptors [`send_fds`] and [`recv_fds`] carry in one message.
pub const MAX_FDS: usize = 4;

/// A control-message buffer for up to [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends one byte and, as `SCM_RIGHTS`, up to [`MAX_FDS`] descriptors on a unix socket.
pub fn send_fds(sock: c_int, byte: u8, fds: &[c_int]) -> SysResult<()> {
    if fds.len() > MAX_FDS {
        return Err(libc::EINVAL);
    }
    let mut buf = CmsgBuf([0; 64]);
    let mut b = [byte];
    let mut iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: msghdr points at live stack buffers; the cmsg is written inside `buf`, which holds
    // CMSG_SPACE(4 * sizeof(int)) = 32 bytes and more.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let len = std::mem::size_of_val(fds) as u32;
            msg.msg_control = buf.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(len) as _;
            let cm = libc::CMSG_FIRSTHDR(&msg);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cm).cast::<c_int>(),
                fds.len(),
            );
        }
        loop {
            if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) >= 0 {
                return Ok(());
            }
            if errno() != libc::EINTR {
                return Err(errno());
            }
        }
    }
}

/// Receives one byte and up to [`MAX_FDS`] descriptors (close-on-exec) into `out`; returns the
/// byte and how many descriptors came. End of file is `EPIPE`.
pub fn recv_fds(sock: c_int, out: &mut [c_int; MAX_FDS]) -> SysResult<(u8, usize)> {
    let mut buf = CmsgBuf([0; 64]);
    let mut b = [0u8];
    let mut iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: msghdr points at live stack buffers; we read only a cmsg the kernel filled, after
    // checking its level, type and length, and copy at most MAX_FDS descriptors.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.0.as_mut_ptr().cast();
        msg.msg_controllen = buf.0.len() as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || errno() != libc::EINTR {
                break n;
            }
        };
        if n < 0 {
            return Err(errno());
        }
        if n == 0 {
            return Err(libc::EPIPE);
        }
        let mut count = 0;
        let cm = libc::CMSG_FIRSTHDR(&msg);
        if !cm.is_null()
            && (*cm).cmsg_level == libc::SOL_SOCKET
            && (*cm).cmsg_type == libc::SCM_RIGHTS
        {
            let data_len = (*cm).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
            count = (data_len / std::mem::size_of::<c_int>()).min(MAX_FDS);
            std::ptr::copy_nonoverlapping(
                libc::CMSG_DATA(cm).cast::<c_int>(),
                out.as_mut_ptr(),
                count,
            );
        }
        Ok((b[0], count))
    }
}

/// Most descriptors [`send_msg`] and [`recv_msg`] carry in one message.
pub const MAX_MSG_FDS: usize = 64;

/// A control-message buffer for up to [`MAX_MSG_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct BigCmsgBuf([u8; 320]);

/// Sends `data` as one message (a `SOCK_SEQPACKET` record) with up to [`MAX_MSG_FDS`]
/// descriptors; a peer that is gone is `EPIPE`, never a `SIGPIPE`.
pub fn send_msg(sock: c_int, data: &[u8], fds: &[c_int]) -> SysResult<()> {
    if fds.len() > MAX_MSG_FDS || data.is_empty() {
        return Err(libc::EINVAL);
    }
    let mut buf = BigCmsgBuf([0; 320]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr points at live buffers; the kernel only reads the data; the cmsg is written
    // inside `buf`, which holds CMSG_SPACE(64 * sizeof(int)) = 272 bytes.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let len = std::mem::size_of_val(fds) as u32;
            msg.msg_control = buf.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(len) as _;
            let cm = libc::CMSG_FIRSTHDR(&msg);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cm).cast::<c_int>(),
                fds.len(),
            );
        }
        loop {
            let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                return if n as usize == data.len() {
                    Ok(())
                } else {
                    Err(libc::EMSGSIZE)
                };
            }
            if errno() != libc::EINTR {
                return Err(errno());
            }
        }
    }
}

/// What [`recv_msg`] received.
pub struct Received {
    /// Bytes of the message (0: end of file).
    pub len: usize,
    /// Descriptors received (close-on-exec), in `fds[..nfds]`; the caller owns them.
    pub nfds: usize,
    /// The message or its descriptors did not fit and were cut (whatever came is still owned).
    pub truncated: bool,
}

/// Receives one message into `buf` with up to [`MAX_MSG_FDS`] descriptors into `fds`.
pub fn recv_msg(
    sock: c_int,
    buf: &mut [u8],
    fds: &mut [c_int; MAX_MSG_FDS],
) -> SysResult<Received> {
    let mut cbuf = BigCmsgBuf([0; 320]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr points at live buffers; we read only cmsgs the kernel filled, after
    // checking their level, type and length, and copy at most MAX_MSG_FDS descriptors.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || errno() != libc::EINTR {
                break n;
            }
        };
        if n < 0 {
            return Err(errno());
        }
        let mut nfds = 0;
        let mut cm = libc::CMSG_FIRSTHDR(&msg);
        while !cm.is_null() {
            if (*cm).cmsg_level == libc::SOL_SOCKET && (*cm).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cm).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = data_len / std::mem::size_of::<c_int>();
                let take = count.min(MAX_MSG_FDS - nfds);
                std::ptr::copy_nonoverlapping(
                    libc::CMSG_DATA(cm).cast::<c_int>(),
                    fds[nfds..].as_mut_ptr(),
                    take,
                );
                nfds += take;
            }
            cm = libc::CMSG_NXTHDR(&msg, cm);
        }
        let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
        Ok(Received {
            len: n as usize,
            nfds,
            truncated,
        })
    }
}

/// `setns(fd, nstype)`: the calling thread enters the namespace `fd` is open on.
pub fn setns(fd: c_int, nstype: c_int) -> SysResult<()> {
    // SAFETY: integer arguments; changes this thread's namespaces only.
    check_int(unsafe { libc::setns(fd, nstype) }).map(drop)
}

/// `unshare(flags)`: new namespaces for the calling thread.
pub fn unshare(flags: c_int) -> SysResult<()> {
    // SAFETY: integer argument; changes this thread's namespaces only.
    check_int(unsafe { libc::unshare(flags) }).map(drop)
}

/// `pidfd_open(pid, 0)`: a pidfd for `pid` (race-free for an unreaped child of ours).
pub fn pidfd_open(pid: i32) -> SysResult<c_int> {
    // SAFETY: integer arguments; returns a new descriptor.
    check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) }).map(|fd| fd as c_int)
}

/// A pair of connected unix sockets of `kind` (`SOCK_STREAM`, `SOCK_SEQPACKET`), close-on-exec.
pub fn socketpair(kind: c_int) -> SysResult<(c_int, c_int)> {
    let mut p = [0 as c_int; 2];
    // SAFETY: socketpair fills the array with two new descriptors.
    check_int(unsafe {
        libc::socketpair(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0, p.as_mut_ptr())
    })?;
    Ok((p[0], p[1]))
}

/// `openat(dirfd, path, flags, mode)`.
pub fn openat(
    dirfd: c_int,
    path: &std::ffi::CStr,
    flags: c_int,
    mode: libc::mode_t,
) -> SysResult<c_int> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::openat(dirfd, path.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

/// `mkdirat(AT_FDCWD, path, mode)`; an existing entry is not an error.
pub fn mkdir_p1(path: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    match check_int(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Ok(_) | Err(libc::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `mknodat(AT_FDCWD, path, S_IFREG | mode, 0)`: an empty regular file, `EEXIST` on any existing
/// entry (a symlink included, never followed).
pub fn mknod_file(path: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::mknodat(libc::AT_FDCWD, path.as_ptr(), libc::S_IFREG | mode, 0) })
        .map(drop)
}

/// `symlink(target, path)`.
pub fn symlink(target: &std::ffi::CStr, path: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    check_int(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }).map(drop)
}

/// The file type (`S_IFDIR`, `S_IFLNK`, …) of `name` in the directory `dirfd`, or `None` if there
/// is no such entry (`fstatat` with `AT_SYMLINK_NOFOLLOW`: a symlink is an entry, never followed).
pub fn entry_kind(dirfd: c_int, name: &std::ffi::CStr) -> SysResult<Option<libc::mode_t>> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` a valid out-pointer.
    match check_int(unsafe {
        libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
    }) {
        Ok(_) => Ok(Some(st.st_mode & libc::S_IFMT)),
        Err(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `renameat2(from_dir, from, to_dir, to, RENAME_NOREPLACE)`: [`rename_noreplace`] between two
/// directories.
pub fn rename_noreplace_between(
    from_dir: c_int,
    from: &std::ffi::CStr,
    to_dir: c_int,
    to: &std::ffi::CStr,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated; renameat2 does not follow a symlink in either.
    check(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
    .map(drop)
}

/// `mkdirat(dirfd, name, mode)`: fails with `EEXIST` on any existing entry, a symlink included.
pub fn mkdirat(dirfd: c_int, name: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::mkdirat(dirfd, name.as_ptr(), mode) }).map(drop)
}

/// `unlinkat(AT_FDCWD, path, AT_REMOVEDIR)`: removes an empty directory.
pub fn rmdir(path: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::unlinkat(libc::AT_FDCWD, path.as_ptr(), libc::AT_REMOVEDIR) })
        .map(drop)
}

/// `lsetxattr(path, name, value, 0)` then `lremovexattr(path, name)`: whether the file system at
/// `path` takes extended attributes of `name`'s namespace, leaving none behind.
pub fn xattr_roundtrip(path: &std::ffi::CStr, name: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated and the value is a live one-byte buffer.
    check_int(unsafe {
        libc::lsetxattr(path.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0)
    })?;
    // SAFETY: both strings are NUL-terminated.
    check_int(unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `openat2(dirfd, path, flags | O_CLOEXEC, resolve)` with a mode for `O_CREAT`.
pub fn openat2(
    dirfd: c_int,
    path: &std::ffi::CStr,
    flags: c_int,
    mode: u32,
    resolve: u64,
) -> SysResult<c_int> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    check(r).map(|fd| fd as c_int)
}

/// `getdents64(fd, buf)`: fills `buf` with directory records; returns the bytes filled, 0 at the
/// end of the directory.
pub fn getdents64(fd: c_int, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    check(r).map(|n| n as usize)
}

/// `readlinkat(dirfd, name, buf)`: the link's target, at most `buf.len()` bytes (a longer one
/// fills the buffer exactly; the caller treats that as too long).
pub fn readlinkat(dirfd: c_int, name: &std::ffi::CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::readlinkat(dirfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check(r as c_long).map(|n| n as usize)
}

/// `fgetxattr(fd, name, buf)`: the value's length; `ENODATA` when the attribute is absent.
pub fn fgetxattr(fd: c_int, name: &std::ffi::CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check(r as c_long).map(|n| n as usize)
}

/// `renameat2(from_dir, from, to_dir, to, flags)`: no link is followed in either name.
pub fn renameat2(
    from_dir: c_int,
    from: &std::ffi::CStr,
    to_dir: c_int,
    to: &std::ffi::CStr,
    flags: c_uint,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated.
    check(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `unlinkat(dirfd, name, flags)` (`AT_REMOVEDIR` for a directory).
pub fn unlinkat(dirfd: c_int, name: &std::ffi::CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::unlinkat(dirfd, name.as_ptr(), flags) }).map(drop)
}

/// `symlinkat(target, dirfd, name)`.
pub fn symlinkat(target: &std::ffi::CStr, dirfd: c_int, name: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated.
    check_int(unsafe { libc::symlinkat(target.as_ptr(), dirfd, name.as_ptr()) }).map(drop)
}

/// `syncfs(fd)`: flushes the whole file system `fd` is on.
pub fn syncfs(fd: c_int) -> SysResult<()> {
    // SAFETY: integer argument only.
    check_int(unsafe { libc::syncfs(fd) }).map(drop)
}

/// `fchmod(fd, mode)` on an open file or directory.
pub fn fchmod(fd: c_int, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: changes the mode of the file `fd` is open on.
    check_int(unsafe { libc::fchmod(fd, mode) }).map(drop)
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `EWOULDBLOCK` when another open file description holds it.
pub fn flock_exclusive(fd: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// `clock_gettime(CLOCK_REALTIME_COARSE)` in nanoseconds since the epoch: the clock file systems
/// take their timestamps from, so a change made after this moment never carries an earlier one.
pub fn realtime_coarse_ns() -> i128 {
    // SAFETY: an all-zero timespec is valid to be overwritten.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the timespec, which is valid for writes.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty `name` is `dirfd` itself
/// (`AT_EMPTY_PATH`, which works on an `O_PATH` descriptor).
pub fn stat_nofollow(dirfd: c_int, name: &std::ffi::CStr) -> SysResult<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH;
    // SAFETY: `name` is NUL-terminated and `st` a valid out-pointer.
    check_int(unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `fchmodat(dirfd, name, mode, AT_SYMLINK_NOFOLLOW)`: a symlink is refused, never followed.
pub fn chmod_nofollow(dirfd: c_int, name: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::fchmodat(dirfd, name.as_ptr(), mode, libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
}

/// `fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub fn chown_nofollow(dirfd: c_int, name: &std::ffi::CStr, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::fchownat(dirfd, name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
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

/// `fstat(fd)` → `(st_dev, st_ino)`.
pub fn dev_ino(fd: c_int) -> SysResult<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    check_int(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_dev, st.st_ino))
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

/// `fcntl(fd, F_SETFD, 0)`: the descriptor stays open across `execve`.
pub fn clear_cloexec(fd: c_int) -> SysResult<()> {
    // SAFETY: F_SETFD with an integer argument on a descriptor of this process.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// `dup2(from, to)`.
pub fn dup2(from: c_int, to: c_int) -> SysResult<()> {
    // SAFETY: duplicates one descriptor of this process onto another number.
    check_int(unsafe { libc::dup2(from, to) }).map(drop)
}

/// Closes every descriptor from 3 up that is not in `keep` (sorted ascending, each ≥ 3).
pub fn close_all_but(keep: &[c_int]) -> SysResult<()> {
    let mut next: u32 = 3;
    for &fd in keep {
        if fd as u32 > next {
            close_range(next, fd as u32 - 1, 0)?;
        }
        next = next.max(fd as u32 + 1);
    }
    close_range(next, u32::MAX, 0)
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

/// An eventfd (close-on-exec, non-blocking): a counter one side adds to and the other polls.
pub fn eventfd() -> SysResult<c_int> {
    // SAFETY: eventfd returns a new descriptor or -1.
    check_int(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
}

/// Adds 1 to an eventfd, waking its pollers.
pub fn eventfd_signal(fd: c_int) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an eventfd takes exactly 8 bytes; a full counter (EAGAIN) is already readable.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

/// Resets an eventfd's counter (after it polled readable).
pub fn eventfd_clear(fd: c_int) {
    let mut b = [0u8; 8];
    // SAFETY: reading the 8-byte counter into a buffer of that size; EAGAIN when already zero.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Sets `O_NONBLOCK` on a descriptor the caller owns alone (never on one it shares, such as an
/// inherited terminal: the flag belongs to the open file description).
pub fn set_nonblocking(fd: c_int) -> SysResult<()> {
    // SAFETY: F_GETFL/F_SETFL on an open descriptor with integer arguments.
    unsafe {
        let fl = check_int(libc::fcntl(fd, libc::F_GETFL))?;
        check_int(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK)).map(drop)
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

/// Takes a non-blocking exclusive open-file-description lock on byte `at` of `fd`: held until the
/// descriptor (this open of the file) is closed, and released by the kernel when the holder dies.
/// `Err(EAGAIN)` (or `EACCES`) when someone else holds it.
pub fn ofd_lock_byte(fd: c_int, at: u64) -> SysResult<()> {
    // SAFETY: an all-zero flock is valid; the fields are set below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = at as libc::off_t;
    l.l_len = 1;
    // SAFETY: F_OFD_SETLK reads the flock, which is valid, and l_pid is 0 as the call requires.
    check_int(unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &l as *const libc::flock) }).map(drop)
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: c_int) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}
