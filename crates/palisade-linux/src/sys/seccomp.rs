//! The seccomp filter and its user-notification listener.

use super::{check_int, errno, owned_int, SysResult};
use libc::c_int;
use std::os::fd::OwnedFd;

/// `struct sock_fprog`.
#[repr(C)]
pub struct SockFprog {
    pub len: u16,
    pub filter: *const crate::seccomp::SockFilter,
}

/// Installs a seccomp filter on the calling thread (no_new_privs must be set) and returns its
/// user-notification listener (close-on-exec), through which another process answers the calls
/// the filter sends to it (`SECCOMP_RET_USER_NOTIF`). Async-signal-safe: one system call.
pub fn install_seccomp_listener(prog: &SockFprog) -> SysResult<OwnedFd> {
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
    owned_int(r as c_int)
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
    super::close(pidfd);
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
    super::close(copy);
    (r == 0).then_some(ty)
}
