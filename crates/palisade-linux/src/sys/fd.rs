//! Descriptors: reading, writing, polling, duplicating, closing, flags, eventfds, locks.

use super::{check, check_int, errno, owned_int, SysResult};
use libc::{c_int, c_uint};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

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

/// A pair of connected unix sockets of `kind` (`SOCK_STREAM`, `SOCK_SEQPACKET`), close-on-exec.
pub fn socketpair(kind: c_int) -> SysResult<(OwnedFd, OwnedFd)> {
    let mut p = [0 as c_int; 2];
    // SAFETY: socketpair fills the array with two new descriptors.
    check_int(unsafe {
        libc::socketpair(libc::AF_UNIX, kind | libc::SOCK_CLOEXEC, 0, p.as_mut_ptr())
    })?;
    // SAFETY: both were just created and are referenced by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

/// `pipe2(O_CLOEXEC)`: (read end, write end).
#[inline]
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut p = [-1 as c_int; 2];
    // SAFETY: pipe2 fills the array with two new descriptors.
    check_int(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both were just created and are referenced by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 3)`: a close-on-exec copy of `fd` numbered 3 or more, so that it
/// is never one of the standard streams a child puts in place with `dup2`.
pub fn dup_above2(fd: c_int) -> SysResult<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` and returns a new descriptor or -1.
    owned_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) })
}

/// `fcntl(fd, F_SETPIPE_SZ, size)`: the pipe's capacity, at least `size` bytes.
pub fn set_pipe_size(fd: c_int, size: c_int) -> SysResult<()> {
    // SAFETY: F_SETPIPE_SZ with an integer argument on a descriptor of this process.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, size) }).map(drop)
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

/// An eventfd (close-on-exec, non-blocking): a counter one side adds to and the other polls.
pub fn eventfd() -> SysResult<OwnedFd> {
    // SAFETY: eventfd returns a new descriptor or -1.
    owned_int(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
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

/// `poll(fds, ms)` once: how many entries have events (`EINTR` is the caller's to retry).
pub fn poll(fds: &mut [libc::pollfd], ms: c_int) -> SysResult<usize> {
    // SAFETY: `fds` is a valid array of pollfd of the length given; poll only reads the
    // descriptor numbers and writes `revents`.
    check_int(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) })
        .map(|n| n as usize)
}

/// `read(fd, buf)` once: the bytes read (0: end of file).
pub fn read(fd: c_int, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    check(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } as libc::c_long)
        .map(|n| n as usize)
}

/// `write(fd, buf)` once: the bytes written.
pub fn write(fd: c_int, buf: &[u8]) -> SysResult<usize> {
    // SAFETY: the kernel reads at most `buf.len()` bytes from the buffer.
    check(unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) } as libc::c_long)
        .map(|n| n as usize)
}

/// `shutdown(fd, SHUT_RDWR)`: both directions of a socket end, for every holder of it.
pub fn shutdown(fd: c_int) {
    // SAFETY: integer arguments only.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Closes an owned descriptor with `close` alone. Dropping an `OwnedFd` does the same in a
/// release build, but a debug build's standard library first checks the descriptor with an
/// extra `fcntl(F_GETFD)`; the child side uses this so that its calls are the raw ones in
/// every build.
#[inline]
pub fn close_owned(fd: OwnedFd) {
    close(fd.into_raw_fd());
}
