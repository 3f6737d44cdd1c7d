//! Messages with descriptors (`SCM_RIGHTS`) on unix sockets.

use super::{errno, SysResult};
use libc::{c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};

/// Most descriptors [`send_fds`] and [`recv_fds`] carry in one message.
pub const MAX_FDS: usize = 4;

/// A control-message buffer of `B` bytes, aligned for `cmsghdr`: 64 bytes hold [`MAX_FDS`]
/// descriptors, 320 hold [`MAX_MSG_FDS`].
#[repr(C, align(8))]
struct Cmsg<const B: usize>([u8; B]);

/// Sends `data` with `fds` as `SCM_RIGHTS` (the control message built in `buf`), never raising
/// `SIGPIPE`; the bytes sent. No allocation: the sandbox's init calls it after its clone.
#[inline]
fn send_with<const B: usize>(
    sock: c_int,
    data: &[u8],
    fds: &[c_int],
    buf: &mut Cmsg<B>,
) -> SysResult<usize> {
    let len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    if unsafe { libc::CMSG_SPACE(len) } as usize > B {
        return Err(libc::EINVAL);
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr points at live buffers; the kernel only reads the data; the cmsg is written
    // inside `buf`, which holds CMSG_SPACE(len) bytes (checked above).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
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
                return Ok(n as usize);
            }
            if errno() != libc::EINTR {
                return Err(errno());
            }
        }
    }
}

/// Receives one message into `data` (close-on-exec descriptors into `fds`, any past `N`
/// closed); the bytes received, whether descriptors were closed, and the message's flags.
#[inline]
fn recv_with<const B: usize, const N: usize>(
    sock: c_int,
    data: &mut [u8],
    fds: &mut Fds<N>,
    buf: &mut Cmsg<B>,
) -> SysResult<(usize, bool, c_int)> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr points at live buffers of the sizes given; take_rights reads only the
    // cmsgs the kernel filled.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.0.as_mut_ptr().cast();
        msg.msg_controllen = B as _;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || errno() != libc::EINTR {
                break n;
            }
        };
        if n < 0 {
            return Err(errno());
        }
        let dropped = take_rights(&msg, fds);
        Ok((n as usize, dropped, msg.msg_flags))
    }
}

/// Sends one byte and, as `SCM_RIGHTS`, up to [`MAX_FDS`] descriptors on a unix socket.
pub fn send_fds(sock: c_int, byte: u8, fds: &[c_int]) -> SysResult<()> {
    if fds.len() > MAX_FDS {
        return Err(libc::EINVAL);
    }
    send_with(sock, &[byte], fds, &mut Cmsg([0; 64])).map(|_| ())
}

/// Descriptors received with one message: at most `N`, in the order they came, each owned
/// (closed when dropped). No allocation: a fixed array.
pub struct Fds<const N: usize> {
    pub(super) fds: [Option<OwnedFd>; N],
    len: usize,
}

impl<const N: usize> Fds<N> {
    #[inline]
    fn new() -> Fds<N> {
        Fds {
            fds: [const { None }; N],
            len: 0,
        }
    }

    /// Keeps `fd`, or closes it when `N` are kept already; whether it was kept.
    #[inline]
    fn push(&mut self, fd: OwnedFd) -> bool {
        if self.len == N {
            return false;
        }
        self.fds[self.len] = Some(fd);
        self.len += 1;
        true
    }

    /// How many came (and were kept).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
}

impl<const N: usize> IntoIterator for Fds<N> {
    type Item = OwnedFd;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<OwnedFd>, N>>;

    /// The descriptors, in the order they came.
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.fds.into_iter().flatten()
    }
}

/// Takes every `SCM_RIGHTS` descriptor of a message `recvmsg` filled into `out`: the first
/// `N` are kept, any past them closed at once (the kernel installs all a peer sends that fit
/// the control buffer; none may stay open unowned). Whether some were closed.
///
/// # Safety
/// `msg` is the header `recvmsg` just filled, its control buffer still alive.
#[inline]
unsafe fn take_rights<const N: usize>(msg: &libc::msghdr, out: &mut Fds<N>) -> bool {
    let mut dropped = false;
    // SAFETY: the caller passes a header the kernel filled; CMSG_FIRSTHDR/NXTHDR stay within
    // its control buffer, and each cmsg's data holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors,
    // read unaligned one by one; each is a new entry of our table that nobody else owns.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(msg);
        while !cm.is_null() {
            if (*cm).cmsg_level == libc::SOL_SOCKET && (*cm).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cm).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cm).cast::<c_int>();
                for i in 0..data_len / std::mem::size_of::<c_int>() {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    dropped |= !out.push(fd);
                }
            }
            cm = libc::CMSG_NXTHDR(msg, cm);
        }
    }
    dropped
}

/// Receives one byte and up to [`MAX_FDS`] descriptors (close-on-exec); returns the byte and
/// the descriptors (any past [`MAX_FDS`] are closed). End of file is `EPIPE`.
#[inline]
pub fn recv_fds(sock: c_int) -> SysResult<(u8, Fds<MAX_FDS>)> {
    let mut b = [0u8];
    let mut fds = Fds::new();
    match recv_with(sock, &mut b, &mut fds, &mut Cmsg([0; 64]))? {
        (0, ..) => Err(libc::EPIPE),
        _ => Ok((b[0], fds)),
    }
}

/// Most descriptors [`send_msg`] and [`recv_msg`] carry in one message.
pub const MAX_MSG_FDS: usize = 64;

/// Sends `data` as one message (a `SOCK_SEQPACKET` record) with up to [`MAX_MSG_FDS`]
/// descriptors; a peer that is gone is `EPIPE`, never a `SIGPIPE`.
pub fn send_msg(sock: c_int, data: &[u8], fds: &[c_int]) -> SysResult<()> {
    if fds.len() > MAX_MSG_FDS || data.is_empty() {
        return Err(libc::EINVAL);
    }
    match send_with(sock, data, fds, &mut Cmsg([0; 320]))? {
        n if n == data.len() => Ok(()),
        _ => Err(libc::EMSGSIZE),
    }
}

/// What [`recv_msg`] received.
pub struct Received {
    /// Bytes of the message (0: end of file).
    pub len: usize,
    /// Descriptors received (close-on-exec).
    pub fds: Fds<MAX_MSG_FDS>,
    /// The message or its descriptors did not fit and were cut (whatever came is still owned;
    /// descriptors past [`MAX_MSG_FDS`] were closed).
    pub truncated: bool,
}

/// Receives one message into `buf` with up to [`MAX_MSG_FDS`] descriptors.
pub fn recv_msg(sock: c_int, buf: &mut [u8]) -> SysResult<Received> {
    let mut fds = Fds::new();
    let (len, dropped, flags) = recv_with(sock, buf, &mut fds, &mut Cmsg([0; 320]))?;
    Ok(Received {
        len,
        fds,
        truncated: dropped || flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    })
}
