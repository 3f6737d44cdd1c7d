//! Every raw system call of palisade-linux, behind small safe wrappers, by theme: descriptors
//! (`fd`), files (`file`), mounts and namespaces (`mount`), messages with descriptors (`msg`),
//! the sandbox's network (`net`), processes and ids (`process`), CPython's C API for warm
//! Python (`python`), seccomp, Landlock, signals and terminals. No other module of the crate
//! may hold `unsafe` code (`lib.rs` denies or forbids it per module).
//!
//! Conventions. Errors come back as the raw `errno` value ([`SysResult`]) so the child can send
//! them to the supervisor in a fixed-size record. A call that creates a descriptor returns an
//! [`OwnedFd`](std::os::fd::OwnedFd) (received ones come as an owned, bounded [`Fds`] batch);
//! parameters take descriptor numbers (`c_int`), because the child side works on the numbers
//! its plan holds. The wrappers the child side uses between `clone`/`fork` and `execve` are
//! async-signal-safe: a system call and nothing else, no allocation, no lock, no formatting
//! (the supervisor-only ones, e.g. [`EffectiveIds`], [`CStrArray::new`], say so or allocate
//! visibly). The child side closes with [`close`]/[`close_owned`], never by dropping an
//! `OwnedFd`: a debug build's standard library checks a descriptor with an extra `fcntl` on drop.
//!
//! Exceptions: `unsafe` outside this module, each a single statement marked `EXCEPTION` with
//! its `SAFETY` comment, allowed where it stands (`#[allow(unsafe_code)]`) in a module that
//! otherwise denies it. These calls are unsafe by nature: what makes them sound is what the
//! code the new process runs does, which no signature here can check.
//! - `spawn.rs`: [`clone3`] of the sandbox's init (the child runs `child::init`, async-signal-safe).
//! - `zygote.rs`: [`clone3`] of a run's init and of the proc helper (the zygote is single-threaded).
//! - `child.rs`: [`clone_vm_vfork`] of the cold payload (it shares init's memory until `execve`),
//!   and [`fork`] of a warm payload (init is single-threaded).
//! - `engine.rs`: [`clone_vm_vfork`] of an engine process (exec of palisade's init program).
//! - `warm.rs`: [`Python::start`], which loads and starts CPython in the single-threaded zygote.

use libc::{c_int, c_long};
use std::os::fd::{FromRawFd, OwnedFd};

mod fd;
mod file;
mod landlock;
mod mount;
mod msg;
mod net;
mod process;
mod python;
mod seccomp;
mod signal;
mod term;

pub use fd::*;
pub use file::*;
pub use landlock::*;
pub use mount::*;
pub use msg::*;
pub use net::*;
pub use process::*;
pub use python::*;
pub use seccomp::*;
pub use signal::*;
pub use term::*;

/// A raw `errno` value.
pub type Errno = i32;

/// The result of a raw call.
pub type SysResult<T> = Result<T, Errno>;

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

/// Takes ownership of the descriptor a raw call just returned (or its `errno`).
fn owned(r: c_long) -> SysResult<OwnedFd> {
    let fd = check(r)?;
    // SAFETY: only called on the result of a call that creates a descriptor: a non-negative
    // result is a new entry of our table, referenced by nothing else yet.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as c_int) })
}

/// [`owned`] for calls that return an `int`.
fn owned_int(r: c_int) -> SysResult<OwnedFd> {
    owned(c_long::from(r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::AsRawFd;

    /// The descriptor flags of `fd`, or `None` if it is not open.
    fn fd_flags(fd: c_int) -> Option<c_int> {
        let r = check_int(
            // SAFETY: F_GETFD only inspects a descriptor number.
            unsafe { libc::fcntl(fd, libc::F_GETFD) },
        );
        r.ok()
    }

    #[test]
    fn pipe_ends_are_close_on_exec_and_connected() {
        let (r, w) = pipe().unwrap();
        for fd in [&r, &w] {
            assert_eq!(fd_flags(fd.as_raw_fd()), Some(libc::FD_CLOEXEC));
        }
        assert_eq!(write(w.as_raw_fd(), b"ab"), Ok(2));
        let mut b = [0u8; 4];
        assert_eq!(read(r.as_raw_fd(), &mut b), Ok(2));
        assert_eq!(&b[..2], b"ab");
        drop(w);
        assert_eq!(read(r.as_raw_fd(), &mut b), Ok(0));
    }

    #[test]
    fn dup_above2_numbers_the_copy_3_or_more_and_sets_cloexec() {
        // Without close-on-exec on the original, so the copy's flag is dup_above2's doing.
        let (r, _w) = pipe().unwrap();
        clear_cloexec(r.as_raw_fd()).unwrap();
        let copy = dup_above2(r.as_raw_fd()).unwrap();
        assert!(copy.as_raw_fd() >= 3);
        assert_ne!(copy.as_raw_fd(), r.as_raw_fd());
        assert_eq!(fd_flags(copy.as_raw_fd()), Some(libc::FD_CLOEXEC));
        assert_eq!(dup_above2(-1).err(), Some(libc::EBADF));
    }

    #[test]
    fn socketpair_ends_are_close_on_exec() {
        let (a, b) = socketpair(libc::SOCK_SEQPACKET).unwrap();
        for fd in [&a, &b] {
            assert_eq!(fd_flags(fd.as_raw_fd()), Some(libc::FD_CLOEXEC));
        }
    }

    #[test]
    fn recv_fds_keeps_at_most_max_fds_and_closes_the_rest() {
        let (a, b) = socketpair(libc::SOCK_STREAM).unwrap();
        // The write ends of eight pipes in one SCM_RIGHTS message, twice what recv_fds keeps
        // (send_fds itself refuses more than MAX_FDS, so the message is built here).
        let pipes: Vec<(OwnedFd, OwnedFd)> = (0..8).map(|_| pipe().unwrap()).collect();
        let raw: Vec<c_int> = pipes.iter().map(|(_, w)| w.as_raw_fd()).collect();
        let mut cbuf = [0u64; 16];
        let mut byte = [b'x'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let len = std::mem::size_of_val(&raw[..]) as u32;
        // SAFETY: a msghdr over live local buffers; the cmsg fits the 128-byte control buffer.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(len) as _;
            let cm = libc::CMSG_FIRSTHDR(&msg);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(len) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(cm).cast(), raw.len());
            libc::sendmsg(a.as_raw_fd(), &msg, 0)
        };
        assert_eq!(n, 1);
        // Only the read ends stay here: a pipe whose received write end is closed hangs up.
        let reads: Vec<OwnedFd> = pipes.into_iter().map(|(r, _)| r).collect();
        let (tag, got) = recv_fds(b.as_raw_fd()).unwrap();
        assert_eq!((tag, got.len()), (b'x', MAX_FDS));
        let hung: Vec<bool> = reads.iter().map(|r| hung_up(r.as_raw_fd())).collect();
        assert_eq!(hung, [false, false, false, false, true, true, true, true]);
        for fd in &got.fds[..MAX_FDS] {
            let fd = fd.as_ref().unwrap().as_raw_fd();
            assert_eq!(
                fd_flags(fd),
                Some(libc::FD_CLOEXEC),
                "received close-on-exec"
            );
        }
        drop(got);
        assert!(reads.iter().all(|r| hung_up(r.as_raw_fd())));
    }

    #[test]
    fn recv_fds_takes_what_send_fds_sends_and_sees_end_of_file() {
        let (a, b) = socketpair(libc::SOCK_STREAM).unwrap();
        let e = eventfd().unwrap();
        send_fds(a.as_raw_fd(), b'j', &[e.as_raw_fd(), e.as_raw_fd()]).unwrap();
        let (tag, got) = recv_fds(b.as_raw_fd()).unwrap();
        assert_eq!((tag, got.len()), (b'j', 2));
        drop(a);
        assert_eq!(recv_fds(b.as_raw_fd()).err(), Some(libc::EPIPE));
        assert_eq!(
            send_fds(b.as_raw_fd(), 0, &[0; MAX_FDS + 1]),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn recv_msg_counts_and_bounds_what_came() {
        let (a, b) = socketpair(libc::SOCK_SEQPACKET).unwrap();
        let e = eventfd().unwrap();
        send_msg(a.as_raw_fd(), b"hello", &[e.as_raw_fd(); 3]).unwrap();
        let mut buf = [0u8; 8];
        let got = recv_msg(b.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((got.len, got.fds.len(), got.truncated), (5, 3, false));
        assert_eq!(&buf[..5], b"hello");
        // A message longer than the buffer is cut and says so.
        send_msg(a.as_raw_fd(), b"0123456789", &[]).unwrap();
        let got = recv_msg(b.as_raw_fd(), &mut buf).unwrap();
        assert!(got.truncated);
        assert_eq!(got.fds.len(), 0);
    }

    #[test]
    fn cstr_array_is_null_terminated_over_its_strings() {
        let a = CStrArray::new(vec![
            CString::new("a").unwrap(),
            CString::new("bc").unwrap(),
        ]);
        assert_eq!(a.as_ptrs().len(), 3);
        assert_eq!(a.as_ptrs()[1], a[1].as_ptr());
        assert!(a.as_ptrs()[2].is_null());
        assert_eq!(format!("{a:?}"), r#"["a", "bc"]"#);
    }

    #[test]
    fn wait4_reaps_with_rusage_and_status() {
        // SAFETY: the child calls only _exit.
        let pid = unsafe { fork() }.unwrap();
        if pid == 0 {
            exit(7);
        }
        let (st, ru) = wait4(pid).unwrap();
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 7);
        assert!(ru.ru_maxrss > 0);
        assert_eq!(wait4(pid).err(), Some(libc::ECHILD));
    }

    #[test]
    fn a_sigset_blocks_and_a_pending_signal_is_taken() {
        // Run on a thread of its own: the mask is per thread.
        std::thread::spawn(|| {
            let old = thread_block(&SigSet::of(&[libc::SIGUSR2])).unwrap();
            // SAFETY: pthread_kill to this very thread, where SIGUSR2 is blocked.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
            let fd = signalfd(&SigSet::of(&[libc::SIGUSR2])).unwrap();
            // A signalfd sees only process-directed and its own thread's signals: this one.
            use std::os::fd::AsFd;
            assert_eq!(signalfd_next(fd.as_fd()), Some(libc::SIGUSR2));
            assert_eq!(signalfd_next(fd.as_fd()), None);
            // SAFETY: as above.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
            take_pending(libc::SIGUSR2);
            assert_eq!(signalfd_next(fd.as_fd()), None);
            thread_set_mask(&old);
        })
        .join()
        .unwrap();
    }
}
