//! Files by descriptor and name: `openat`/`openat2`, directories, links, modes, xattrs.

use super::{check, check_int, owned, owned_int, SysResult};
use libc::{c_int, c_long, c_uint};
use std::os::fd::OwnedFd;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Bytes and inodes in use on the file system holding `path` (`statfs`).
pub fn fs_used(path: &std::ffi::CStr) -> SysResult<(u64, u64)> {
    // SAFETY: `path` is NUL-terminated; `s` is a valid out-pointer, read only on success.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        check_int(libc::statfs(path.as_ptr(), &mut s))?;
        let blocks = (s.f_blocks as u64).saturating_sub(s.f_bfree as u64);
        Ok((
            blocks.saturating_mul(s.f_bsize as u64),
            (s.f_files as u64).saturating_sub(s.f_ffree as u64),
        ))
    }
}

/// `openat2(AT_FDCWD, path, O_PATH|O_CLOEXEC, resolve)`.
pub fn open_path_noresolve(path: &std::ffi::CStr, resolve: u64) -> SysResult<OwnedFd> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(r)
}

/// `openat(dirfd, path, flags, mode)`.
pub fn openat(
    dirfd: c_int,
    path: &std::ffi::CStr,
    flags: c_int,
    mode: libc::mode_t,
) -> SysResult<OwnedFd> {
    // SAFETY: `path` is NUL-terminated.
    owned_int(unsafe { libc::openat(dirfd, path.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

/// `mkdirat(AT_FDCWD, path, mode)`; an existing entry is not an error.
pub fn mkdir_p1(path: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    match check_int(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Ok(_) | Err(libc::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `mknodat(AT_FDCWD, path, S_IFREG | mode, 0)`: an empty regular file, `EEXIST` on any existing
/// entry (a symlink included, never followed).
pub fn mknod_file(path: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::mknodat(libc::AT_FDCWD, path.as_ptr(), libc::S_IFREG | mode, 0) })
        .map(drop)
}

/// `symlink(target, path)`.
pub fn symlink(target: &std::ffi::CStr, path: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both paths are NUL-terminated.
    check_int(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }).map(drop)
}

/// The file type (`S_IFDIR`, `S_IFLNK`, …) of `name` in the directory `dirfd`, or `None` if there
/// is no such entry (`fstatat` with `AT_SYMLINK_NOFOLLOW`: a symlink is an entry, never followed).
pub fn entry_kind(dirfd: c_int, name: &std::ffi::CStr) -> SysResult<Option<libc::mode_t>> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` a valid out-pointer.
    match check_int(unsafe {
        libc::fstatat(dirfd, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
    }) {
        Ok(_) => Ok(Some(st.st_mode & libc::S_IFMT)),
        Err(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `renameat2(from_dir, from, to_dir, to, RENAME_NOREPLACE)`: [`rename_noreplace`] between two
/// directories.
pub fn rename_noreplace_between(
    from_dir: c_int,
    from: &std::ffi::CStr,
    to_dir: c_int,
    to: &std::ffi::CStr,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated; renameat2 does not follow a symlink in either.
    check(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
    .map(drop)
}

/// `mkdirat(dirfd, name, mode)`: fails with `EEXIST` on any existing entry, a symlink included.
pub fn mkdirat(dirfd: c_int, name: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::mkdirat(dirfd, name.as_ptr(), mode) }).map(drop)
}

/// `unlinkat(AT_FDCWD, path, AT_REMOVEDIR)`: removes an empty directory.
pub fn rmdir(path: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: `path` is NUL-terminated.
    check_int(unsafe { libc::unlinkat(libc::AT_FDCWD, path.as_ptr(), libc::AT_REMOVEDIR) })
        .map(drop)
}

/// `lsetxattr(path, name, value, 0)` then `lremovexattr(path, name)`: whether the file system at
/// `path` takes extended attributes of `name`'s namespace, leaving none behind.
pub fn xattr_roundtrip(path: &std::ffi::CStr, name: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated and the value is a live one-byte buffer.
    check_int(unsafe {
        libc::lsetxattr(path.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0)
    })?;
    // SAFETY: both strings are NUL-terminated.
    check_int(unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `openat2(dirfd, path, flags | O_CLOEXEC, resolve)` with a mode for `O_CREAT`.
pub fn openat2(
    dirfd: c_int,
    path: &std::ffi::CStr,
    flags: c_int,
    mode: u32,
    resolve: u64,
) -> SysResult<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve,
    };
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(r)
}

/// `getdents64(fd, buf)`: fills `buf` with directory records; returns the bytes filled, 0 at the
/// end of the directory.
pub fn getdents64(fd: c_int, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    check(r).map(|n| n as usize)
}

/// `readlinkat(dirfd, name, buf)`: the link's target, at most `buf.len()` bytes (a longer one
/// fills the buffer exactly; the caller treats that as too long).
pub fn readlinkat(dirfd: c_int, name: &std::ffi::CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::readlinkat(dirfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check(r as c_long).map(|n| n as usize)
}

/// `fgetxattr(fd, name, buf)`: the value's length; `ENODATA` when the attribute is absent.
pub fn fgetxattr(fd: c_int, name: &std::ffi::CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    check(r as c_long).map(|n| n as usize)
}

/// `renameat2(from_dir, from, to_dir, to, flags)`: no link is followed in either name.
pub fn renameat2(
    from_dir: c_int,
    from: &std::ffi::CStr,
    to_dir: c_int,
    to: &std::ffi::CStr,
    flags: c_uint,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated.
    check(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `renameat(from_dir, from, to_dir, to)`: replaces `to` if it exists; no link is followed in
/// either name.
pub fn renameat(
    from_dir: c_int,
    from: &std::ffi::CStr,
    to_dir: c_int,
    to: &std::ffi::CStr,
) -> SysResult<()> {
    // SAFETY: both names are NUL-terminated.
    check_int(unsafe { libc::renameat(from_dir, from.as_ptr(), to_dir, to.as_ptr()) }).map(drop)
}

/// `unlinkat(dirfd, name, flags)` (`AT_REMOVEDIR` for a directory).
pub fn unlinkat(dirfd: c_int, name: &std::ffi::CStr, flags: c_int) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::unlinkat(dirfd, name.as_ptr(), flags) }).map(drop)
}

/// `symlinkat(target, dirfd, name)`.
pub fn symlinkat(target: &std::ffi::CStr, dirfd: c_int, name: &std::ffi::CStr) -> SysResult<()> {
    // SAFETY: both strings are NUL-terminated.
    check_int(unsafe { libc::symlinkat(target.as_ptr(), dirfd, name.as_ptr()) }).map(drop)
}

/// `syncfs(fd)`: flushes the whole file system `fd` is on.
pub fn syncfs(fd: c_int) -> SysResult<()> {
    // SAFETY: integer argument only.
    check_int(unsafe { libc::syncfs(fd) }).map(drop)
}

/// `fchmod(fd, mode)` on an open file or directory.
pub fn fchmod(fd: c_int, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: changes the mode of the file `fd` is open on.
    check_int(unsafe { libc::fchmod(fd, mode) }).map(drop)
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `EWOULDBLOCK` when another open file description holds it.
pub fn flock_exclusive(fd: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// `clock_gettime(CLOCK_REALTIME_COARSE)` in nanoseconds since the epoch: the clock file systems
/// take their timestamps from, so a change made after this moment never carries an earlier one.
pub fn realtime_coarse_ns() -> i128 {
    // SAFETY: an all-zero timespec is valid to be overwritten.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the timespec, which is valid for writes.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty `name` is `dirfd` itself
/// (`AT_EMPTY_PATH`, which works on an `O_PATH` descriptor).
pub fn stat_nofollow(dirfd: c_int, name: &std::ffi::CStr) -> SysResult<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH;
    // SAFETY: `name` is NUL-terminated and `st` a valid out-pointer.
    check_int(unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `fchmodat(dirfd, name, mode, AT_SYMLINK_NOFOLLOW)`: a symlink is refused, never followed.
pub fn chmod_nofollow(dirfd: c_int, name: &std::ffi::CStr, mode: libc::mode_t) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::fchmodat(dirfd, name.as_ptr(), mode, libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
}

/// `fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub fn chown_nofollow(dirfd: c_int, name: &std::ffi::CStr, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: `name` is NUL-terminated.
    check_int(unsafe { libc::fchownat(dirfd, name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
}

/// `fstat(fd)` → `(st_dev, st_ino)`.
pub fn dev_ino(fd: c_int) -> SysResult<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    check_int(unsafe { libc::fstat(fd, &mut st) })?;
    Ok((st.st_dev, st.st_ino))
}

/// `fstat(fd)`'s file type (`st_mode & S_IFMT`).
pub fn file_type(fd: c_int) -> SysResult<libc::mode_t> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    check_int(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st.st_mode & libc::S_IFMT)
}

/// Copies `len` bytes from `offset` of `src` to `out` with `sendfile` (the kernel copies; `src`'s
/// own file offset is left alone). A source shorter than `offset + len` is `EIO`.
pub fn sendfile_all(out: c_int, src: c_int, offset: u64, len: u64) -> SysResult<()> {
    let (mut at, mut left) = (offset, len);
    while left > 0 {
        let mut off = at as libc::off_t;
        // At most what one call moves (0x7ffff000 bytes), the rest in the next.
        let chunk = left.min(0x7fff_f000) as usize;
        // SAFETY: `off` is a valid in/out pointer; the descriptors are integers.
        let r = unsafe { libc::sendfile(out, src, &mut off, chunk) };
        match r {
            -1 => match super::errno() {
                libc::EINTR => continue,
                e => return Err(e),
            },
            0 => return Err(libc::EIO),
            n => {
                at += n as u64;
                left -= n as u64;
            }
        }
    }
    Ok(())
}

/// A memfd (close-on-exec) holding `data`, sealed against any change of its bytes or size and
/// against further seals: whoever receives it reads exactly these bytes.
pub fn sealed_memfd(name: &std::ffi::CStr, data: &[u8]) -> SysResult<OwnedFd> {
    // SAFETY: `name` is NUL-terminated.
    let fd = owned_int(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    use std::os::fd::AsRawFd;
    super::write_all(fd.as_raw_fd(), data)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(fd)
}

/// `ftruncate(fd, 0)`.
pub fn ftruncate(fd: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only.
    check_int(unsafe { libc::ftruncate(fd, 0) }).map(drop)
}
