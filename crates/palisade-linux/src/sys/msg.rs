//! Messages with descriptors (`SCM_RIGHTS`) on unix sockets.

use super::{errno, SysResult};
use libc::{c_int, c_void};

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
