//! Raw system calls that `libc` does not wrap, and small helpers around the ones it does.
//!
//! Every function here is async-signal-safe: a system call and nothing else, no allocation, no
//! lock. The sandbox's child side (after `clone3`) uses only these. Errors come back as the raw
//! `errno` value so the child can send them to the supervisor in a fixed-size record.

use libc::{c_int, c_long};
use std::os::fd::{FromRawFd, OwnedFd};

mod fd;
mod file;
mod landlock;
mod mount;
mod msg;
mod net;
mod process;
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
