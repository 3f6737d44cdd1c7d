//! Terminals: the caller's (raw mode, window size) and the sandbox's pty.

use super::{check_int, SysResult};
use libc::c_int;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A terminal's settings (`struct termios`).
pub type Termios = libc::termios;

/// `tcgetattr(fd)`: `None` when `fd` is no terminal.
pub fn tcgetattr(fd: c_int) -> Option<Termios> {
    let mut t = std::mem::MaybeUninit::<Termios>::uninit();
    // SAFETY: tcgetattr fills `t` on success, and only then is it read.
    unsafe {
        if libc::tcgetattr(fd, t.as_mut_ptr()) != 0 {
            return None;
        }
        Some(t.assume_init())
    }
}

/// `cfmakeraw` of a copy of `t`: no echo, no line editing, no signals from keys.
pub fn raw_mode(t: &Termios) -> Termios {
    let mut raw = *t;
    // SAFETY: edits a valid termios in place.
    unsafe { libc::cfmakeraw(&mut raw) };
    raw
}

/// `tcsetattr(fd, TCSANOW, t)`.
pub fn tcsetattr(fd: c_int, t: &Termios) -> SysResult<()> {
    // SAFETY: reads a valid termios.
    check_int(unsafe { libc::tcsetattr(fd, libc::TCSANOW, t) }).map(drop)
}

/// Copies the window size of terminal `from` to terminal `to` (`TIOCGWINSZ`, `TIOCSWINSZ`); a
/// `from` that is no terminal changes nothing.
pub fn copy_winsize(from: c_int, to: BorrowedFd<'_>) {
    // SAFETY: TIOCGWINSZ fills a winsize (all-zero is valid), TIOCSWINSZ reads one.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(from, libc::TIOCGWINSZ, &mut ws) == 0 {
            libc::ioctl(to.as_raw_fd(), libc::TIOCSWINSZ, &ws);
        }
    }
}

/// `ioctl(master, TIOCSPTLCK, 0)`: unlocks a pty's peer, then `ioctl(master, TIOCGPTPEER)`:
/// opens it (`O_RDWR | O_NOCTTY | O_CLOEXEC`) without a path lookup. The peer's descriptor,
/// a number the caller owns (the child side keeps it raw until the payload's `dup2`).
#[inline]
pub fn pty_open_peer(master: c_int) -> SysResult<c_int> {
    let unlock: c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int, which lives across the call.
    check_int(unsafe { libc::ioctl(master, libc::TIOCSPTLCK, &unlock) })?;
    // SAFETY: TIOCGPTPEER takes open flags as an integer and returns a new descriptor.
    check_int(unsafe {
        libc::ioctl(
            master,
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })
}

/// `ioctl(fd, TIOCSCTTY, 0)`: the terminal `fd` becomes the calling session's controlling one.
#[inline]
pub fn set_controlling_terminal(fd: c_int) -> SysResult<()> {
    // SAFETY: an integer argument only.
    check_int(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) }).map(drop)
}
