//! `palisade-probe`: attacks the sandbox from inside and prints one line per attempt.
//!
//! Every line has the form `probe <what>: <result>` where `<result>` is `ok [detail]`,
//! `denied <ERRNO>` or `absent` (ENOENT). Tests parse these lines; a user can run the probe to see
//! the wall: `palisade run --ro $(which palisade-probe):/probe -- /probe all`.
//!
//! This is test tooling, not part of the boundary, so it calls libc directly: an attack has to
//! use the raw system calls the kernel offers.

use std::ffi::CString;
use std::io::Write;

fn errno_name(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::ENOSPC => "ENOSPC",
        libc::EINVAL => "EINVAL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::ENOTTY => "ENOTTY",
        libc::EBADF => "EBADF",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::EXDEV => "EXDEV",
        libc::EAGAIN => "EAGAIN",
        libc::EFBIG => "EFBIG",
        libc::EMFILE => "EMFILE",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESOCKTNOSUPPORT => "ESOCKTNOSUPPORT",
        libc::ENODEV => "ENODEV",
        _ => return format!("errno{e}"),
    };
    n.to_owned()
}

fn line(what: &str, r: Result<String, i32>) {
    let s = match r {
        Ok(d) if d.is_empty() => format!("probe {what}: ok"),
        Ok(d) => format!("probe {what}: ok {d}"),
        Err(libc::ENOENT) => format!("probe {what}: absent"),
        Err(e) => format!("probe {what}: denied {}", errno_name(e)),
    };
    println!("{s}");
    let _ = std::io::stdout().flush();
}

fn ioerr(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn last() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn read(path: &str) -> Result<String, i32> {
    std::fs::read(path)
        .map(|b| {
            format!(
                "{} bytes {}",
                b.len(),
                String::from_utf8_lossy(&b[..b.len().min(200)])
                    .replace('\n', "\\n")
                    .replace('\0', "\\0")
            )
        })
        .map_err(ioerr)
}

fn write(path: &str) -> Result<String, i32> {
    std::fs::write(path, b"written by palisade-probe\n")
        .map(|_| String::new())
        .map_err(ioerr)
}

fn caps() -> Result<String, i32> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(ioerr)?;
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_owned())
            .unwrap_or_default()
    };
    Ok(format!(
        "CapEff={} CapPrm={} CapBnd={} CapAmb={} NoNewPrivs={} Seccomp={}",
        get("CapEff:"),
        get("CapPrm:"),
        get("CapBnd:"),
        get("CapAmb:"),
        get("NoNewPrivs:"),
        get("Seccomp:")
    ))
}

fn pids() -> Result<String, i32> {
    let mut v: Vec<u32> = std::fs::read_dir("/proc")
        .map_err(ioerr)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    Ok(v.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(","))
}

fn fds() -> Result<String, i32> {
    // read_dir holds one descriptor open for the listing itself; leave it out.
    let dir = std::fs::read_dir("/proc/self/fd").map_err(ioerr)?;
    let mut v: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    let mut out = Vec::new();
    for fd in v {
        if let Ok(t) = std::fs::read_link(format!("/proc/self/fd/{fd}")) {
            if t.to_string_lossy().starts_with("/proc/") && t.to_string_lossy().ends_with("/fd") {
                continue;
            }
            out.push(format!("{fd}->{}", t.display()));
        }
    }
    Ok(out.join(","))
}

fn kill(pid: i32) -> Result<String, i32> {
    // SAFETY: kill(2) with a pid and SIGKILL; the attack under test.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        Ok(String::new())
    } else {
        Err(last())
    }
}

fn unshare_user() -> Result<String, i32> {
    // SAFETY: unshare(2) of this process only.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 {
        Ok(String::new())
    } else {
        Err(last())
    }
}

fn tiocsti() -> Result<String, i32> {
    let c: libc::c_char = b'#' as _;
    // SAFETY: TIOCSTI takes a pointer to one char.
    if unsafe { libc::ioctl(0, libc::TIOCSTI, &c) } == 0 {
        Ok(String::new())
    } else {
        Err(last())
    }
}

fn isatty() -> Result<String, i32> {
    // SAFETY: isatty and ttyname on fd 0.
    unsafe {
        if libc::isatty(0) == 1 {
            let n = libc::ttyname(0);
            let name = if n.is_null() {
                "?".into()
            } else {
                std::ffi::CStr::from_ptr(n).to_string_lossy().into_owned()
            };
            Ok(name)
        } else {
            Err(last())
        }
    }
}

fn connect(addr: &str) -> Result<String, i32> {
    let a: std::net::SocketAddr = addr.parse().map_err(|_| libc::EINVAL)?;
    std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3))
        .map(|_| String::new())
        .map_err(ioerr)
}

/// Connects to the abstract unix socket `name` (no path: the kernel keeps abstract names per
/// network namespace, and Landlock ABI 6 scopes them to the domain).
fn unix_abstract(name: &str) -> Result<String, i32> {
    use std::os::linux::net::SocketAddrExt;
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name).map_err(ioerr)?;
    std::os::unix::net::UnixStream::connect_addr(&a)
        .map(|_| String::new())
        .map_err(ioerr)
}

/// Listens on `addr`, connects to it and passes one byte through: a server and its client,
/// both inside.
fn listen(addr: &str) -> Result<String, i32> {
    use std::io::{Read, Write};
    let a: std::net::SocketAddr = addr.parse().map_err(|_| libc::EINVAL)?;
    let l = std::net::TcpListener::bind(a).map_err(ioerr)?;
    let mut c = std::net::TcpStream::connect(a).map_err(ioerr)?;
    let (mut s, _) = l.accept().map_err(ioerr)?;
    c.write_all(b"x").map_err(ioerr)?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(ioerr)?;
    Ok("served".into())
}

fn daemon(marker: &str) -> Result<String, i32> {
    // Double fork: the grandchild is reparented to the sandbox's init and lingers.
    let exe = std::env::current_exe().map_err(ioerr)?;
    let exe = CString::new(exe.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
    let args = [
        exe.clone(),
        CString::new("linger").unwrap(),
        CString::new(marker).map_err(|_| libc::EINVAL)?,
    ];
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: fork/setsid/execv in a single-threaded probe; the child only execs or exits.
    unsafe {
        match libc::fork() {
            -1 => return Err(last()),
            0 => {
                libc::setsid();
                if libc::fork() == 0 {
                    libc::execv(exe.as_ptr(), argv.as_ptr());
                }
                libc::_exit(0);
            }
            pid => {
                let mut st = 0;
                libc::waitpid(pid, &mut st, 0);
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    Ok(String::new())
}

/// Forks up to `n` children that wait (bounded: never more than asked), reports how many forks
/// worked and the error of the first that failed, then ends them all.
fn forks(n: usize) -> Result<String, i32> {
    let mut kids = Vec::new();
    let mut fail = 0;
    for _ in 0..n {
        // SAFETY: the child only pauses until killed; no Rust code runs in it.
        match unsafe { libc::fork() } {
            -1 => {
                fail = last();
                break;
            }
            0 => loop {
                // SAFETY: pause() in a child that only waits to be killed.
                unsafe { libc::pause() };
            },
            pid => kids.push(pid),
        }
    }
    for &k in &kids {
        // SAFETY: killing and reaping our own children.
        unsafe {
            libc::kill(k, libc::SIGKILL);
            libc::waitpid(k, std::ptr::null_mut(), 0);
        }
    }
    let err = if fail == 0 {
        "none".to_owned()
    } else {
        errno_name(fail)
    };
    Ok(format!("spawned={} error={err}", kids.len()))
}

/// Writes `bytes` to `path` in 1 MiB blocks; reports how far it got.
fn fill(path: &str, bytes: u64) -> Result<String, i32> {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).map_err(ioerr)?;
    let block = vec![b'x'; 1 << 20];
    let mut done = 0u64;
    while done < bytes {
        let n = block.len().min((bytes - done) as usize);
        if let Err(e) = f.write_all(&block[..n]) {
            return Err(ioerr(e));
        }
        done += n as u64;
    }
    f.sync_all().map_err(ioerr)?;
    Ok(format!("{done} bytes"))
}

/// Allocates and touches `mib` MiB, one MiB at a time; reports how much it held.
fn alloc(mib: usize) -> Result<String, i32> {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut v = vec![0u8; 1 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        held.push(v);
    }
    Ok(format!("{} MiB", held.len()))
}

/// Opens `/dev/ptmx` until it fails (at most 10,000 times): `N then ERRNO`, the terminals held
/// until the process exits.
fn ptys() -> Result<String, i32> {
    let mut n = 0;
    while n < 10_000 {
        // SAFETY: a constant, NUL-terminated path; the descriptor is kept until exit.
        let fd = unsafe { libc::open(c"/dev/ptmx".as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
        if fd < 0 {
            return Ok(format!("{n} then {}", errno_name(last())));
        }
        n += 1;
    }
    Ok(format!("{n} then none"))
}

fn raw(r: libc::c_long) -> Result<String, i32> {
    if r < 0 {
        Err(last())
    } else {
        Ok(String::new())
    }
}

/// `open_tree_attr` (Linux 6.15) and `lsm_set_self_attr` (6.8): the same number on every
/// architecture, newer than the `libc` crate's tables.
const OPEN_TREE_ATTR: libc::c_long = 467;
const LSM_SET_SELF_ATTR: libc::c_long = 460;

/// Tries the system calls the seccomp filter refuses; one line each. Integer arguments are
/// passed as `c_long`: `syscall` is variadic, and a 32-bit value would leave the upper half of
/// the register undefined.
// `libc`'s ioctl request type differs between targets (u64 with glibc, i32 with musl).
#[allow(clippy::unnecessary_cast)]
fn syscalls() {
    type L = libc::c_long;
    // SAFETY: each call gets valid (zeroed or self-referring) arguments; descriptors that a call
    // returns are left to the process's exit; a child that a successful clone creates exits at once.
    unsafe {
        let mut params = [0u8; 120];
        line(
            "sys io_uring_setup",
            raw(libc::syscall(
                libc::SYS_io_uring_setup,
                1 as L,
                params.as_mut_ptr(),
            )),
        );
        let mut attr = [0u8; 128];
        line(
            "sys bpf",
            raw(libc::syscall(
                libc::SYS_bpf,
                0 as L,
                attr.as_mut_ptr(),
                128 as L,
            )),
        );
        line(
            "sys userfaultfd",
            raw(libc::syscall(
                libc::SYS_userfaultfd,
                1 as L, /* UFFD_USER_MODE_ONLY */
            )),
        );
        line(
            "sys keyctl",
            raw(libc::syscall(
                libc::SYS_keyctl,
                0 as L,  /* GET_KEYRING_ID */
                -3 as L, /* session */
                0 as L,
            )),
        );
        let mut buf = [0u8; 8];
        let src = [7u8; 8];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: src.as_ptr() as *mut _,
            iov_len: 8,
        };
        line(
            "sys process_vm_readv",
            raw(libc::syscall(
                libc::SYS_process_vm_readv,
                libc::getpid() as L,
                &local,
                1 as L,
                &remote,
                1 as L,
                0 as L,
            )),
        );
        line(
            "sys socket-netlink",
            raw(libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) as L),
        );
        line(
            "sys socket-packet",
            raw(libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) as L),
        );
        // socketpair runs the family's own socket creation before it finds out that the family
        // has no pairs: outside, the answer comes from the family's code (EOPNOTSUPP, ENODEV, or
        // EPERM for a raw socket without CAP_NET_RAW).
        for (what, family, kind) in [
            ("netlink", libc::AF_NETLINK, libc::SOCK_RAW),
            ("packet", libc::AF_PACKET, libc::SOCK_RAW),
            ("vsock", libc::AF_VSOCK, libc::SOCK_STREAM),
            ("xdp", libc::AF_XDP, libc::SOCK_RAW),
            ("unix", libc::AF_UNIX, libc::SOCK_STREAM),
        ] {
            let mut pair = [-1 as libc::c_int; 2];
            line(
                &format!("sys socketpair-{what}"),
                raw(libc::socketpair(family, kind, 0, pair.as_mut_ptr()) as L),
            );
        }
        // Without OPEN_TREE_CLONE, a descriptor for the mount at "/" (no privilege needed).
        line(
            "sys open_tree_attr",
            raw(libc::syscall(
                OPEN_TREE_ATTR,
                libc::AT_FDCWD as L,
                c"/".as_ptr(),
                0 as L,
                std::ptr::null::<u8>(),
                0 as L,
            )),
        );
        line(
            "sys fanotify_init",
            raw(libc::syscall(
                libc::SYS_fanotify_init,
                (libc::FAN_CLASS_NOTIF | libc::FAN_REPORT_FID) as L,
                libc::O_RDONLY as L,
            )),
        );
        line(
            "sys memfd_secret",
            raw(libc::syscall(libc::SYS_memfd_secret, 0 as L)),
        );
        let mut aio: libc::c_ulong = 0;
        let got = libc::syscall(libc::SYS_io_setup, 1 as L, &mut aio as *mut libc::c_ulong);
        if got == 0 {
            libc::syscall(libc::SYS_io_destroy, aio as L);
        }
        line("sys io_setup", raw(got));
        // Namespace-creating calls run in a throwaway child, so that a success (outside a sandbox)
        // does not change the rest of the probe.
        let in_child = |f: &dyn Fn() -> L| -> Result<String, i32> {
            let mut p = [0 as libc::c_int; 2];
            libc::pipe(p.as_mut_ptr());
            match libc::fork() {
                -1 => Err(last()),
                0 => {
                    let r = f();
                    let e: i32 = if r < 0 { last() } else { 0 };
                    libc::write(p[1], (&e as *const i32).cast(), 4);
                    libc::_exit(0);
                }
                pid => {
                    let mut e = 0i32;
                    libc::read(p[0], (&mut e as *mut i32).cast(), 4);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                    libc::close(p[0]);
                    libc::close(p[1]);
                    if e == 0 {
                        Ok(String::new())
                    } else {
                        Err(e)
                    }
                }
            }
        };
        line(
            "sys unshare-user",
            in_child(&|| libc::unshare(libc::CLONE_NEWUSER) as L),
        );
        let clone_flags = |flags: L| -> L {
            let r = libc::syscall(
                libc::SYS_clone,
                flags | libc::SIGCHLD as L,
                0 as L,
                0 as L,
                0 as L,
                0 as L,
            );
            if r == 0 {
                libc::_exit(0);
            }
            if r > 0 {
                libc::waitpid(r as i32, std::ptr::null_mut(), 0);
            }
            r
        };
        line(
            "sys clone-newnet",
            in_child(&|| clone_flags(libc::CLONE_NEWNET as L)),
        );
        let mut cargs = [0u64; 11];
        cargs[0] = libc::CLONE_NEWUSER as u64;
        cargs[4] = libc::SIGCHLD as u64;
        line(
            "sys clone3",
            in_child(&|| {
                let r = libc::syscall(libc::SYS_clone3, cargs.as_ptr(), 88 as L);
                if r == 0 {
                    libc::_exit(0);
                }
                r
            }),
        );
        let c: libc::c_char = b'#' as _;
        line(
            "sys tiocsti-high-bits",
            raw(libc::syscall(
                libc::SYS_ioctl,
                0 as L,
                ((1u64 << 32) | libc::TIOCSTI as u64) as L,
                &c,
            )),
        );
        #[cfg(target_arch = "x86_64")]
        line(
            "sys x32-getpid",
            raw(libc::syscall(libc::SYS_getpid | 0x4000_0000)),
        );
        line(
            "sys ptrace-traceme",
            in_child(&|| libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) as L),
        );
    }
}

/// The seccomp filter's whole refused list (docs/layers/seccomp.md), written out here rather than
/// taken from the filter, so that a call dropped from the filter shows up as `ok` or another errno.
/// Every argument is -1 (a bad descriptor, pointer, pid and flag word at once), so that outside a
/// sandbox each call fails harmlessly in the kernel's own checks; inside, the filter answers first.
/// One line each: `refused NAME: denied EPERM`; then `refused-family CALL-FAMILY: denied
/// EAFNOSUPPORT` for the socket families.
// `libc`'s ioctl request type differs between targets (u64 with glibc, i32 with musl).
#[allow(clippy::unnecessary_cast)]
fn refused() {
    type L = libc::c_long;
    let mut calls: Vec<(&str, L)> = vec![
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("open_tree_attr", OPEN_TREE_ATTR),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("quotactl_fd", libc::SYS_quotactl_fd),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("syslog", libc::SYS_syslog),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("fanotify_init", libc::SYS_fanotify_init),
        ("memfd_secret", libc::SYS_memfd_secret),
        ("io_setup", libc::SYS_io_setup),
        ("lsm_set_self_attr", LSM_SET_SELF_ATTR),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        ("iopl", libc::SYS_iopl),
        ("ioperm", libc::SYS_ioperm),
        ("uselib", libc::SYS_uselib),
    ]);
    for (name, nr) in calls {
        // SAFETY: every argument is invalid (-1), so no call the kernel runs can succeed or touch
        // this process's memory; the filter's answer comes before any of it.
        let r = unsafe { libc::syscall(nr, -1 as L, -1 as L, -1 as L, -1 as L, -1 as L, -1 as L) };
        line(&format!("refused {name}"), raw(r));
    }
    for (name, cmd) in [
        ("ioctl-TIOCSTI", libc::TIOCSTI as u64),
        ("ioctl-TIOCSETD", libc::TIOCSETD as u64),
        ("ioctl-TIOCLINUX", libc::TIOCLINUX as u64),
        (
            "ioctl-TIOCLINUX-high-bits",
            (1u64 << 32) | libc::TIOCLINUX as u64,
        ),
    ] {
        // SAFETY: descriptor -1 is never open; the kernel fails the call with EBADF at the latest.
        let r = unsafe { libc::syscall(libc::SYS_ioctl, -1 as L, cmd as L, -1 as L) };
        line(&format!("refused {name}"), raw(r));
    }
    // Socket families the filter refuses, for both calls that create sockets; answered
    // EAFNOSUPPORT inside. Outside, a type of -1 fails the kernel's flag check (EINVAL) before
    // any family's code runs.
    let mut pair = [-1 as libc::c_int; 2];
    for (family, f) in [
        ("netlink", libc::AF_NETLINK),
        ("packet", libc::AF_PACKET),
        ("vsock", libc::AF_VSOCK),
        ("xdp", libc::AF_XDP),
    ] {
        // SAFETY: socket and socketpair with an invalid type; socketpair's result array is ours.
        let (s, p) = unsafe {
            (
                libc::syscall(libc::SYS_socket, f as L, -1 as L, -1 as L),
                libc::syscall(
                    libc::SYS_socketpair,
                    f as L,
                    -1 as L,
                    -1 as L,
                    pair.as_mut_ptr(),
                ),
            )
        };
        line(&format!("refused-family socket-{family}"), raw(s));
        line(&format!("refused-family socketpair-{family}"), raw(p));
    }
}

/// Tries every way of lowering this process's `RLIMIT_CORE` to 0 (with 0, a `core_pattern` pipe
/// helper on the host would receive its memory when it crashes; palisade keeps it at 1), one line
/// each, then prints the limit it ended with. With `crash NAME`, it then names itself NAME (the
/// `comm` a core helper sees) and dies of SIGSEGV.
fn core_limit(crash: bool, name: &str) {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let mut old = libc::rlimit {
        rlim_cur: 7,
        rlim_max: 7,
    };
    // SAFETY: setrlimit/prlimit64/getrlimit of this process with pointers to our own structs.
    unsafe {
        line(
            "core-limit setrlimit",
            raw(libc::setrlimit(libc::RLIMIT_CORE, &zero) as libc::c_long),
        );
        line(
            "core-limit prlimit64",
            raw(libc::syscall(
                libc::SYS_prlimit64,
                0 as libc::c_long,
                libc::RLIMIT_CORE as libc::c_long,
                &zero,
                std::ptr::null::<libc::rlimit>(),
            )),
        );
        line(
            "core-limit prlimit64-with-old",
            raw(libc::syscall(
                libc::SYS_prlimit64,
                0 as libc::c_long,
                libc::RLIMIT_CORE as libc::c_long,
                &zero,
                &mut old,
            )),
        );
        let mut now = old;
        let r = libc::getrlimit(libc::RLIMIT_CORE, &mut now);
        line(
            "core-limit now",
            if r == 0 {
                Ok(format!("soft={} hard={}", now.rlim_cur, now.rlim_max))
            } else {
                Err(last())
            },
        );
    }
    if crash {
        let name = CString::new(name).unwrap_or_default();
        // SAFETY: PR_SET_NAME copies at most 16 bytes of our NUL-terminated string; the write
        // through a null pointer is the crash asked for.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
            std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1);
        }
    }
}

/// Tries to leave a set-uid file at `path`: by chmod of a file it wrote, and by creating one with
/// the bits in its mode.
fn setuid(path: &str) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let _ = std::fs::write(path, b"#!/bin/sh\n");
    line(
        &format!("chmod-setuid {path}"),
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o4755))
            .map(|_| String::new())
            .map_err(ioerr),
    );
    let created = format!("{path}.created");
    line(
        &format!("create-setuid {created}"),
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o4755)
            .open(&created)
            .map(|_| String::new())
            .map_err(ioerr),
    );
}

/// Creates a SysV shared memory segment of `mib` MiB and touches every page of it.
fn sysv_shm(mib: usize) -> Result<String, i32> {
    let size = mib << 20;
    // SAFETY: a private segment of `size` bytes, attached at an address the kernel picks; every
    // write stays inside it.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, size, libc::IPC_CREAT | 0o600);
        if id < 0 {
            return Err(last());
        }
        let p = libc::shmat(id, std::ptr::null(), 0);
        if p as isize == -1 {
            return Err(last());
        }
        let base = p.cast::<u8>();
        for off in (0..size).step_by(4096) {
            std::ptr::write_volatile(base.add(off), 1);
        }
    }
    Ok(format!("{mib} MiB"))
}

/// Spins `threads` threads for `secs` seconds of wall time, then reports the CPU time this
/// process used (all its threads), from getrusage.
fn burn(secs: f64, threads: usize) -> Result<String, i32> {
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut x = 0u64;
                while std::time::Instant::now() < end {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    // SAFETY: getrusage fills the struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    Ok(format!("cpu_ms={}", ms(ru.ru_utime) + ms(ru.ru_stime)))
}

/// `n` rounds of two cheap system calls (`getppid`, and a one-byte `read` of /dev/zero), timed:
/// how much the seccomp filter adds to every call a busy program makes.
fn syscall_loop(n: u64) -> Result<String, i32> {
    let zero = std::fs::File::open("/dev/zero").map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&zero);
    let mut b = [0u8; 1];
    let t = std::time::Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no arguments; read fills our one-byte buffer from our own descriptor.
        unsafe {
            libc::getppid();
            libc::read(fd, b.as_mut_ptr().cast(), 1);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / (2 * n) as f64;
    Ok(format!("ns_per_call={ns:.1}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    match a(0) {
        "read" => line(&format!("read {}", a(1)), read(a(1))),
        "write" => line(&format!("write {}", a(1)), write(a(1))),
        "env" => {
            for (k, v) in std::env::vars_os() {
                println!("probe env: {}={}", k.to_string_lossy(), v.to_string_lossy());
            }
        }
        "caps" => line("caps", caps()),
        "pids" => line("pids", pids()),
        "fds" => line("fds", fds()),
        "kill" => line(&format!("kill {}", a(1)), kill(a(1).parse().unwrap_or(-1))),
        "unshare-user" => line("unshare-user", unshare_user()),
        "tiocsti" => line("tiocsti", tiocsti()),
        "isatty" => line("isatty", isatty()),
        "connect" => line(&format!("connect {}", a(1)), connect(a(1))),
        "unix-abstract" => line(&format!("unix-abstract {}", a(1)), unix_abstract(a(1))),
        "listen" => line(&format!("listen {}", a(1)), listen(a(1))),
        "daemon" => line("daemon", daemon(a(1))),
        "forks" => line(&format!("forks {}", a(1)), forks(a(1).parse().unwrap_or(0))),
        "fill" => line(
            &format!("fill {}", a(1)),
            fill(a(1), a(2).parse().unwrap_or(0)),
        ),
        "alloc" => line(&format!("alloc {}", a(1)), alloc(a(1).parse().unwrap_or(0))),
        "ptys" => line("ptys", ptys()),
        "syscalls" => syscalls(),
        "refused" => refused(),
        "burn" => line(
            "burn",
            burn(a(1).parse().unwrap_or(1.0), a(2).parse().unwrap_or(1)),
        ),
        "sysv-shm" => line(
            &format!("sysv-shm {}", a(1)),
            sysv_shm(a(1).parse().unwrap_or(0)),
        ),
        "setuid" => setuid(a(1)),
        "core-limit" => core_limit(a(1) == "crash", a(2)),
        "syscall-loop" => line(
            "syscall-loop",
            syscall_loop(a(1).parse().unwrap_or(1_000_000)),
        ),
        "linger" => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        "exit" => std::process::exit(a(1).parse().unwrap_or(1)),
        "segv" => {
            // SAFETY: deliberately raises SIGSEGV by writing through a null pointer.
            unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1) };
        }
        "whoami" => {
            // SAFETY: trivially safe id queries.
            let (u, g) = unsafe { (libc::getuid(), libc::getgid()) };
            line(
                "whoami",
                Ok(format!("uid={u} gid={g} pid={}", std::process::id())),
            );
        }
        other => {
            eprintln!("palisade-probe: unknown probe `{other}`; one of: read write env caps pids fds kill unshare-user tiocsti isatty connect daemon forks fill alloc syscalls refused setuid core-limit sysv-shm burn syscall-loop linger exit segv whoami");
            std::process::exit(2);
        }
    }
}
