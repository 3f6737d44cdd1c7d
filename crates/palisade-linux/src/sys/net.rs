//! The sandbox's network namespace from inside: loopback up, the egress proxy's listeners.
//! Async-signal-safe (init runs them between `clone3` and `execve`).

use super::{close, errno, SysResult};
use libc::c_int;

/// Brings `lo` up (`SIOCSIFFLAGS` with `IFF_UP | IFF_RUNNING` on a throwaway socket).
#[inline]
pub fn loopback_up() -> SysResult<()> {
    // SAFETY: socket/ioctl on a zeroed ifreq whose name is set to "lo"; the fd is closed after.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno());
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[0] = b'l' as libc::c_char;
        ifr.ifr_name[1] = b'o' as libc::c_char;
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        let r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr);
        let e = errno();
        close(fd);
        if r < 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// An IPv4 socket (close-on-exec) bound to `addr:port` with `SO_REUSEADDR`: UDP, or TCP and
/// listening (backlog 1024). The descriptor, a number the caller owns.
#[inline]
pub fn bound_inet_socket(udp: bool, addr: u32, port: u16) -> SysResult<c_int> {
    let kind = if udp {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    // SAFETY: socket/setsockopt/bind/listen on a descriptor we own, with a local sockaddr_in
    // (all-zero is valid; the fields set below) and an int option, both alive across the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno());
        }
        let one: c_int = 1;
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = port.to_be();
        sa.sin_addr.s_addr = addr.to_be();
        let ok = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const c_int).cast(),
            std::mem::size_of::<c_int>() as u32,
        ) == 0
            && libc::bind(
                fd,
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            ) == 0
            && (udp || libc::listen(fd, 1024) == 0);
        if !ok {
            let e = errno();
            close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

/// Bytes written to the stream socket `fd` that its peer has not taken yet (`SIOCOUTQ`: TCP's
/// unsent and unacknowledged bytes, a unix socket's queued ones).
pub fn unsent_bytes(fd: c_int) -> SysResult<c_int> {
    let mut n: c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, to a local that outlives the call.
    super::check_int(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) })?;
    Ok(n)
}
