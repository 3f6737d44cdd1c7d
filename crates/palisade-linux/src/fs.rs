//! Descriptor-relative file operations that never follow a link, for the supervisor's work on
//! trees the sandbox wrote (a workspace's upper layer) and on the user's own tree it writes into
//! (applying a change set).
//!
//! Every operation takes a [`Dir`] and one name: a single path component, checked (no `/`, not
//! empty, not `.` or `..`, no NUL), so a walk is one `openat` per component from a descriptor the
//! caller already holds, never a path resolved anew. Directories are opened with `O_NOFOLLOW` and
//! `O_DIRECTORY`, files with `O_NOFOLLOW`, `O_NONBLOCK` and `O_NOCTTY` after `fstatat` said they
//! are regular files (and checked again on the descriptor), links are read with `readlinkat`,
//! never followed. Renames are `renameat2` between two held directories. What this module does
//! not do: decide what is safe to create. Callers refuse devices, fifos, set-id modes and the
//! rest before they get here.

use crate::sys;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// What kind of file an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    fn of(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            _ => Kind::BlockDevice,
        }
    }
}

/// `lstat` of one entry, the fields palisade uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits with set-id and sticky (`st_mode & 07777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub dev: u64,
    pub ino: u64,
    /// Device number of a device file (a whiteout is a character device 0/0).
    pub rdev: u64,
    /// Modification and status-change times, in nanoseconds since the epoch.
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stat {
    fn from(st: &libc::stat) -> Stat {
        Stat {
            kind: Kind::of(st.st_mode),
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            nlink: st.st_nlink,
            dev: st.st_dev,
            ino: st.st_ino,
            rdev: st.st_rdev,
            mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            ctime_ns: st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        }
    }

    /// An overlayfs whiteout: a character device with device number 0/0.
    pub fn is_whiteout(&self) -> bool {
        self.kind == Kind::CharDevice && self.rdev == 0
    }
}

fn os(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// A checked single path component.
fn component(name: &[u8]) -> io::Result<CString> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a single path component",
        ));
    }
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

/// An open directory (`O_RDONLY | O_DIRECTORY`), the base of every operation here.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// How [`Dir::rename`] treats an entry at the new name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rename {
    /// Replace it (a file or an empty directory), atomically.
    Replace,
    /// Fail with `EEXIST` if there is one.
    NoReplace,
    /// Swap the two entries, atomically (both must exist).
    Exchange,
}

impl Dir {
    /// Opens the directory at the absolute `path` without following any symbolic link on the
    /// way (`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`): the caller passes a
    /// canonical path it resolved itself, and a link swapped in since fails here.
    pub fn open_path(path: &Path) -> io::Result<Dir> {
        use std::os::unix::ffi::OsStrExt;
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))?;
        let fd = sys::openat2(
            libc::AT_FDCWD,
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
        )
        .map_err(os)?;
        Ok(Dir { fd })
    }

    /// A directory descriptor received from elsewhere (e.g. from the sandbox's init). It is
    /// reopened `O_RDONLY | O_DIRECTORY` through itself, so an `O_PATH` descriptor works too.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Dir> {
        let d = sys::openat(
            fd.as_raw_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(os)?;
        Ok(Dir { fd: d })
    }

    /// The same directory opened again: a descriptor of its own (its own file offset, its own
    /// `flock`).
    pub fn reopen(&self) -> io::Result<Dir> {
        let fd = sys::openat(
            self.fd.as_raw_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(os)?;
        Ok(Dir { fd })
    }

    /// The subdirectory `name`; a symbolic link or any other kind of file there fails
    /// (`ELOOP`, `ENOTDIR`).
    pub fn open_dir(&self, name: &[u8]) -> io::Result<Dir> {
        let c = component(name)?;
        let fd = sys::openat(
            self.fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(os)?;
        Ok(Dir { fd })
    }

    /// `lstat` of the entry `name`: `None` if there is none.
    pub fn stat(&self, name: &[u8]) -> io::Result<Option<Stat>> {
        let c = component(name)?;
        match sys::stat_nofollow(self.fd.as_raw_fd(), &c) {
            Ok(st) => Ok(Some(Stat::from(&st))),
            Err(libc::ENOENT) => Ok(None),
            Err(e) => Err(os(e)),
        }
    }

    /// `fstat` of the directory itself.
    pub fn stat_self(&self) -> io::Result<Stat> {
        sys::stat_nofollow(self.fd.as_raw_fd(), c"")
            .map(|st| Stat::from(&st))
            .map_err(os)
    }

    /// The names in the directory (without `.` and `..`), in the order the file system gives
    /// them. More than `max` entries is an error (`EFBIG`): the caller's bound on what it reads
    /// of a tree it does not trust.
    pub fn names(&self, max: usize) -> io::Result<Vec<Vec<u8>>> {
        // A fresh descriptor: getdents64 reads from the file offset, which this one shares with
        // nobody, and starts at 0.
        let fd = sys::openat(
            self.fd.as_raw_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(os)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = sys::getdents64(fd.as_raw_fd(), &mut buf).map_err(os)?;
            if n == 0 {
                return Ok(out);
            }
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let mut at = 0;
            while at + 19 <= n {
                let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                if reclen < 19 || at + reclen > n {
                    return Err(io::Error::other("a malformed directory record"));
                }
                let raw = &buf[at + 19..at + reclen];
                let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                if name != b"." && name != b".." {
                    if out.len() >= max {
                        return Err(os(libc::EFBIG));
                    }
                    out.push(name.to_vec());
                }
                at += reclen;
            }
        }
    }

    /// Opens the regular file `name` for reading. Anything else (a link, a fifo, a device) is
    /// refused without being opened for reading: `ELOOP` for a link, `EINVAL` otherwise.
    pub fn open_file(&self, name: &[u8]) -> io::Result<File> {
        let c = component(name)?;
        let st = sys::stat_nofollow(self.fd.as_raw_fd(), &c).map_err(os)?;
        match Kind::of(st.st_mode) {
            Kind::File => {}
            Kind::Symlink => return Err(os(libc::ELOOP)),
            _ => return Err(os(libc::EINVAL)),
        }
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let f = File::from(sys::openat(self.fd.as_raw_fd(), &c, flags, 0).map_err(os)?);
        if !f.metadata()?.is_file() {
            return Err(os(libc::EINVAL));
        }
        Ok(f)
    }

    /// The target of the symbolic link `name`, at most `max` bytes (`ENAMETOOLONG` past it).
    pub fn readlink(&self, name: &[u8], max: usize) -> io::Result<Vec<u8>> {
        let c = component(name)?;
        let mut buf = vec![0u8; max + 1];
        let n = sys::readlinkat(self.fd.as_raw_fd(), &c, &mut buf).map_err(os)?;
        if n > max {
            return Err(os(libc::ENAMETOOLONG));
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// The extended attribute `attr` of the directory itself, at most `max` bytes; `None` if
    /// it has none of that name (or the file system keeps none).
    pub fn xattr(&self, attr: &CStr, max: usize) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; max];
        match sys::fgetxattr(self.fd.as_raw_fd(), attr, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            Err(libc::ENODATA) | Err(libc::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(os(e)),
        }
    }

    /// Creates the regular file `name` (`O_CREAT | O_EXCL | O_NOFOLLOW`: an existing entry, a
    /// link included, fails with `EEXIST`), for writing, with `mode` (less the umask).
    pub fn create_file(&self, name: &[u8], mode: u32) -> io::Result<File> {
        let c = component(name)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW;
        let fd = sys::openat(self.fd.as_raw_fd(), &c, flags, mode as libc::mode_t).map_err(os)?;
        Ok(File::from(fd))
    }

    /// Creates the directory `name` (`EEXIST` on any existing entry).
    pub fn mkdir(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let c = component(name)?;
        sys::mkdirat(self.fd.as_raw_fd(), &c, mode as libc::mode_t).map_err(os)
    }

    /// Creates the symbolic link `name` pointing at `target` (`EEXIST` on any existing entry).
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        let c = component(name)?;
        let t = CString::new(target)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))?;
        sys::symlinkat(&t, self.fd.as_raw_fd(), &c).map_err(os)
    }

    /// Renames `from` here to `to` in `to_dir`.
    pub fn rename(&self, from: &[u8], to_dir: &Dir, to: &[u8], how: Rename) -> io::Result<()> {
        let (f, t) = (component(from)?, component(to)?);
        let flags = match how {
            Rename::Replace => 0,
            Rename::NoReplace => libc::RENAME_NOREPLACE,
            Rename::Exchange => libc::RENAME_EXCHANGE,
        };
        sys::renameat2(self.fd.as_raw_fd(), &f, to_dir.fd.as_raw_fd(), &t, flags).map_err(os)
    }

    /// Removes the entry `name`: a directory (which must be empty) with `dir`, any other kind
    /// of entry without.
    pub fn unlink(&self, name: &[u8], dir: bool) -> io::Result<()> {
        let c = component(name)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        sys::unlinkat(self.fd.as_raw_fd(), &c, flags).map_err(os)
    }

    /// Sets the mode of the entry `name` (`fchmodat` with `AT_SYMLINK_NOFOLLOW`: a link is
    /// refused, never followed).
    pub fn chmod(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let c = component(name)?;
        sys::chmod_nofollow(self.fd.as_raw_fd(), &c, mode as libc::mode_t).map_err(os)
    }

    /// Sets the owner of the entry `name` (a link itself, never what it points at).
    pub fn chown(&self, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
        let c = component(name)?;
        sys::chown_nofollow(self.fd.as_raw_fd(), &c, uid, gid).map_err(os)
    }

    /// Sets the directory's own mode.
    pub fn chmod_self(&self, mode: u32) -> io::Result<()> {
        sys::fchmod(self.fd.as_raw_fd(), mode as libc::mode_t).map_err(os)
    }

    /// Sets the directory's own owner.
    pub fn chown_self(&self, uid: u32, gid: u32) -> io::Result<()> {
        std::os::unix::fs::fchown(&self.fd, Some(uid), Some(gid))
    }

    /// Flushes the directory's entries to disk.
    pub fn sync(&self) -> io::Result<()> {
        // fsync on a duplicate: the same open directory, and a File that may close it.
        File::from(self.fd.try_clone()?).sync_all()
    }

    /// Flushes the whole file system the directory is on (`syncfs`): one call for many files
    /// written, where an `fsync` each would cost a disk flush each.
    pub fn sync_fs(&self) -> io::Result<()> {
        sys::syncfs(self.fd.as_raw_fd()).map_err(os)
    }

    /// Takes an exclusive `flock` on the directory for as long as this descriptor lives;
    /// `WouldBlock` when someone else holds it.
    pub fn lock(&self) -> io::Result<()> {
        sys::flock_exclusive(self.fd.as_raw_fd()).map_err(os)
    }
}

/// A moment on the file-system clock that splits what happened before this call from what
/// happens after it returns: every change made before the call has a status-change time before
/// the value, every change made after the return one at or after it.
///
/// File systems stamp changes with the coarse clock (`CLOCK_REALTIME_COARSE`, one tick of 1 to
/// 10 ms), or since Linux 6.13 sometimes with a finer time within the tick; either way a change
/// made just before the call can carry the current tick's time or more. The next tick's time is
/// after the call began and before any change made after it is seen, so the call waits for the
/// tick to turn (at most one tick; 100 ms if the clock stands still, then the current tick's
/// time, which errs towards calling a change a conflict).
pub fn next_tick_ns() -> i128 {
    let first = sys::realtime_coarse_ns();
    let give_up = std::time::Instant::now() + std::time::Duration::from_millis(100);
    loop {
        let now = sys::realtime_coarse_ns();
        if now != first || std::time::Instant::now() >= give_up {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_micros(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_components_and_links_are_never_followed() {
        let base = std::env::temp_dir().join(format!("palisade-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("d")).unwrap();
        std::fs::write(base.join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", base.join("l")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", base.join("lf")).unwrap();
        let d = Dir::open_path(&base).unwrap();
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert_eq!(d.stat(bad).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        }
        let e = d.open_dir(b"l").unwrap_err().raw_os_error();
        assert!(e == Some(libc::ELOOP) || e == Some(libc::ENOTDIR), "{e:?}");
        assert_eq!(
            d.open_file(b"lf").unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert_eq!(d.stat(b"l").unwrap().unwrap().kind, Kind::Symlink);
        assert_eq!(d.readlink(b"l", 64).unwrap(), b"/etc");
        assert_eq!(
            d.readlink(b"lf", 4).unwrap_err().raw_os_error(),
            Some(libc::ENAMETOOLONG)
        );
        let mut names = d.names(10).unwrap();
        names.sort();
        assert_eq!(
            names,
            [b"d".to_vec(), b"f".to_vec(), b"l".to_vec(), b"lf".to_vec()]
        );
        assert_eq!(d.names(3).unwrap_err().raw_os_error(), Some(libc::EFBIG));
        // A path through a link is refused as a whole.
        assert_eq!(
            Dir::open_path(&base.join("l")).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert!(d.create_file(b"l", 0o644).is_err());
        d.rename(b"f", &d, b"d", Rename::NoReplace).unwrap_err();
        std::fs::remove_dir_all(&base).unwrap();
    }
}
