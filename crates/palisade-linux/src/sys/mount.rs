//! The mount API and namespaces: `open_tree`, `mount_setattr`, `move_mount`, `mount`,
//! `pivot_root`, `umount2`, `setns`, `unshare`.

use super::{check, check_int, owned, SysResult};
use libc::{c_int, c_uint, c_ulong, c_void};
use std::os::fd::OwnedFd;

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
pub const RESOLVE_NO_XDEV: u64 = 0x01;
pub const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `open_tree(dirfd, path, flags)`; use `c""` with `AT_EMPTY_PATH` for the fd itself.
pub fn open_tree(dirfd: c_int, path: &std::ffi::CStr, flags: c_uint) -> SysResult<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; the call only reads it.
    let r = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    owned(r)
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
