//! Signals: sets, masks, waiting for one, a signalfd, sending one (`kill`, a pidfd), and
//! dispositions. The set and mask calls are async-signal-safe (the child side uses them).

use super::{check, check_int, owned_int, SysResult};
use libc::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// A `sigset_t`.
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl SigSet {
    /// No signal.
    #[inline]
    pub fn empty() -> SigSet {
        // SAFETY: an all-zero sigset_t is a valid value, which sigemptyset then initializes.
        let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `s` is a valid set for the call to write.
        unsafe { libc::sigemptyset(&mut s) };
        SigSet(s)
    }

    /// Every signal.
    #[inline]
    pub fn full() -> SigSet {
        // SAFETY: an all-zero sigset_t is a valid value, which sigfillset then initializes.
        let mut s: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `s` is a valid set for the call to write.
        unsafe { libc::sigfillset(&mut s) };
        SigSet(s)
    }

    /// The set of `signals`.
    #[inline]
    pub fn of(signals: &[c_int]) -> SigSet {
        let mut s = SigSet::empty();
        for &sig in signals {
            // SAFETY: `s.0` is an initialized set; an invalid number only fails (EINVAL).
            unsafe { libc::sigaddset(&mut s.0, sig) };
        }
        s
    }
}

/// `pthread_sigmask(SIG_BLOCK, set)`: blocks `set` in the calling thread; the old mask.
pub fn thread_block(set: &SigSet) -> SysResult<SigSet> {
    let mut old = SigSet::empty();
    // SAFETY: both sets are valid; pthread_sigmask returns an errno value, not -1.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, &mut old.0) } {
        0 => Ok(old),
        e => Err(e),
    }
}

/// `pthread_sigmask(SIG_SETMASK, mask)`: the calling thread's mask becomes `mask`.
pub fn thread_set_mask(mask: &SigSet) {
    // SAFETY: a valid set; nothing is written back. It fails only for an invalid `how`.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask.0, std::ptr::null_mut()) };
}

/// The calling thread's signal mask.
pub fn thread_mask() -> SigSet {
    let mut old = SigSet::empty();
    // SAFETY: a null set changes nothing; the old mask is written to a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut old.0) };
    old
}

/// `sigprocmask(how, set)` (`SIG_BLOCK`, `SIG_SETMASK`): the process's mask, on the child side
/// where it is the only thread.
#[inline]
pub fn sigprocmask(how: c_int, set: &SigSet) -> SysResult<()> {
    // SAFETY: a valid set; nothing is written back.
    check_int(unsafe { libc::sigprocmask(how, &set.0, std::ptr::null_mut()) }).map(drop)
}

/// `sigwaitinfo(set)`: the next of the (blocked) signals in `set`, waiting for one.
#[inline]
pub fn sigwaitinfo(set: &SigSet) -> SysResult<c_int> {
    // SAFETY: an all-zero siginfo_t is a valid value for the kernel to overwrite.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid set and a valid out-pointer.
    check_int(unsafe { libc::sigwaitinfo(&set.0, &mut info) })
}

/// Takes every pending `sig` (blocked in this thread) without waiting, and drops it.
pub fn take_pending(sig: c_int) {
    let set = SigSet::of(&[sig]);
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid set and timeout; no siginfo is asked for.
    while unsafe { libc::sigtimedwait(&set.0, std::ptr::null_mut(), &zero) } == sig {}
}

/// `signalfd(-1, set, SFD_CLOEXEC | SFD_NONBLOCK)`: the (blocked) signals of `set`, to read.
pub fn signalfd(set: &SigSet) -> SysResult<OwnedFd> {
    // SAFETY: a valid set; the call returns a new descriptor or -1.
    owned_int(unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })
}

/// Reads one record from a signalfd: the signal's number, `None` when none is pending.
pub fn signalfd_next(fd: BorrowedFd<'_>) -> Option<c_int> {
    let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::uninit();
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: reading at most one signalfd_siginfo into a buffer of exactly its size.
    let n = unsafe { libc::read(fd.as_raw_fd(), info.as_mut_ptr().cast(), size) };
    if n < 0 || n as usize != size {
        return None;
    }
    // SAFETY: the kernel filled the whole struct.
    Some(unsafe { info.assume_init() }.ssi_signo as c_int)
}

/// `signal(sig, SIG_DFL)`: the default disposition.
#[inline]
pub fn signal_default(sig: c_int) {
    // SAFETY: restoring the default disposition installs no handler.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// `kill(pid, sig)`.
#[inline]
pub fn kill(pid: libc::pid_t, sig: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`: the process the pidfd is open on, never one that
/// reused its pid.
pub fn pidfd_send_signal(pidfd: c_int, sig: c_int) -> SysResult<()> {
    // SAFETY: integer arguments and no siginfo.
    check(unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd, sig, 0usize, 0u32) }).map(drop)
}
