//! Landlock: the filesystem's second wall, beneath the mount view.
//!
//! The mount view (see `plan`) decides what exists inside the sandbox. Landlock decides, in the
//! kernel and independently of the mounts, what the payload may do with what exists: read and
//! execute only under the paths the policy makes visible read-only, write only where the policy
//! makes things writable (`/workspace`, `/tmp`, `/dev/shm`, `--rw` binds, and the device nodes
//! that must be writable). If the view were ever wrong — a host directory mounted by mistake, a
//! read-only flag lost — files under it still could not be read, executed or written, as long as
//! the mistake lies outside every path that has a rule: a rule belongs to its directory's inode
//! and covers everything beneath it, so a mistaken mount under `/usr` would be readable, one under
//! `/workspace` writable, and a `--ro` bind inside a writable place is read-only by its mount flag
//! alone. Names can be listed anywhere (`/` has the list right), contents only under rules.
//!
//! What it guarantees, once the payload has called `landlock_restrict_self` (setup step 16):
//! - opening a file for reading, writing or execution, listing a directory, creating, removing,
//!   linking, renaming, truncating (ABI 3) and device `ioctl`s (ABI 5) are refused with `EACCES`
//!   outside the plan's rules, for the payload and everything it starts, whatever its
//!   capabilities or file modes; no process can leave the domain;
//! - with ABI 4 or newer, TCP `bind` is refused (`EACCES`) but on the `--allow-local-port`
//!   ports, and TCP `connect` but to those and to the egress proxy's TCP ports: if the network
//!   namespace were ever shared by mistake, the payload still could not reach a host service or
//!   listen where the host could reach it;
//! - with ABI 6 or newer, the payload cannot signal processes outside its domain (the sandbox's
//!   init) nor connect to abstract unix sockets created outside it;
//! - only the rights the running kernel knows are handled: see [`handled_fs`] for what each ABI
//!   adds; a newer kernel is used at the newest ABI this code knows.
//!
//! What it does not:
//! - `stat`, `readlink`, `chdir` and path lookup are not access rights: a path that exists in the
//!   view is visible as such even where its contents are refused; listing directory entries is
//!   allowed everywhere (`/` carries `READ_DIR`, so `ls /` works), reading what they hold is not;
//! - rights add up along a path: a `--ro` bind inside a writable place (say `--ro X:/tmp/x`) gets
//!   the writable place's rights from Landlock, and only its read-only mount flag keeps it so;
//! - descriptors opened before the restriction keep their access (stdin, stdout, stderr);
//! - TCP rights (ABI 4) go by port, not by address: a connect to an allowed port is allowed to
//!   any address the network namespace routes, which is only its own loopback (the proxy's
//!   listeners, or the payload's own `--allow-local-port` server); UDP, and unix sockets other
//!   than abstract ones, are not Landlock's (the seccomp socket filter and the empty namespace
//!   are their walls);
//! - with ABI 1, renaming or linking a file into another directory always fails (`EXDEV`): only
//!   ABI 2 lets a ruleset grant it (`REFER`); with ABI 1 or 2 truncation is not handled, with
//!   ABI 4 or lower device `ioctl`s are not.
//!
//! The plan holds the rules, computed on the supervisor side ([`Ruleset::add`]); init creates the
//! ruleset once the view is complete (setup step 10) and the payload enters it (step 16). Both
//! child-side steps only walk precomputed values with raw system calls.

use std::ffi::CString;

/// Execute a file (ABI 1).
pub const EXECUTE: u64 = 1 << 0;
/// Open a file for writing (ABI 1).
pub const WRITE_FILE: u64 = 1 << 1;
/// Open a file for reading (ABI 1).
pub const READ_FILE: u64 = 1 << 2;
/// Open a directory to list it (ABI 1).
pub const READ_DIR: u64 = 1 << 3;
/// Remove an empty directory, or rename one away (ABI 1).
pub const REMOVE_DIR: u64 = 1 << 4;
/// Unlink a file, or rename one away (ABI 1).
pub const REMOVE_FILE: u64 = 1 << 5;
/// Create a character device (ABI 1).
pub const MAKE_CHAR: u64 = 1 << 6;
/// Create a directory (ABI 1).
pub const MAKE_DIR: u64 = 1 << 7;
/// Create a regular file (ABI 1).
pub const MAKE_REG: u64 = 1 << 8;
/// Create a unix socket (ABI 1).
pub const MAKE_SOCK: u64 = 1 << 9;
/// Create a named pipe (ABI 1).
pub const MAKE_FIFO: u64 = 1 << 10;
/// Create a block device (ABI 1).
pub const MAKE_BLOCK: u64 = 1 << 11;
/// Create a symbolic link (ABI 1).
pub const MAKE_SYM: u64 = 1 << 12;
/// Link or rename a file into another directory (ABI 2).
pub const REFER: u64 = 1 << 13;
/// Truncate a file (`truncate`, `ftruncate`, `O_TRUNC`) (ABI 3).
pub const TRUNCATE: u64 = 1 << 14;
/// `ioctl` on a character or block device (ABI 5).
pub const IOCTL_DEV: u64 = 1 << 15;

/// No connecting to abstract unix sockets created outside the domain (ABI 6).
pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// No signals to processes outside the domain (ABI 6).
pub const SCOPE_SIGNAL: u64 = 1 << 1;

/// Bind a TCP socket to a port (ABI 4).
pub const BIND_TCP: u64 = 1 << 0;
/// Connect a TCP socket to a port (ABI 4).
pub const CONNECT_TCP: u64 = 1 << 1;

/// The newest ABI whose rights this code knows; newer kernels are used at this level.
pub const NEWEST_KNOWN_ABI: u32 = 7;

/// Rights that apply to a file (not a directory); a rule on a file may carry only these.
pub const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

/// `/`: directory listings only, so that `ls /` works; no file under it is readable through this.
pub const LIST: u64 = READ_DIR;
/// Palisade's own read-only scaffolding (`/etc`, `/proc`, `/dev`): read files, list directories.
pub const READ: u64 = READ_FILE | READ_DIR;
/// Read-only binds (system directories, `--ro`): read, list, execute.
pub const READ_EXEC: u64 = EXECUTE | READ_FILE | READ_DIR;
/// Device nodes and `/dev/pts`: read, write, truncate (`> /dev/null` opens with `O_TRUNC`),
/// terminal and device `ioctl`s; no execution, nothing created.
pub const DEVICE: u64 = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV | READ_DIR;
/// Every filesystem right of ABI 7.
pub const ALL_FS: u64 = (1 << 16) - 1;
/// Writable places (`/workspace`, `/tmp`, `/dev/shm`, `--rw`): every right but making device
/// nodes (no payload needs them, and a second wall should not grant what only the first —
/// no `CAP_MKNOD`, `nodev` mounts — happens to stop).
pub const FULL: u64 = ALL_FS & !(MAKE_CHAR | MAKE_BLOCK);

/// The filesystem rights `abi` can handle: ABI 1 the thirteen base rights, ABI 2 adds
/// [`REFER`], ABI 3 [`TRUNCATE`], ABI 5 [`IOCTL_DEV`] (ABI 4, 6 and 7 add none).
///
/// ```
/// use palisade_linux::landlock::{handled_fs, IOCTL_DEV, REFER, TRUNCATE};
/// assert_eq!(handled_fs(1), 0x1fff);
/// assert_eq!(handled_fs(3), 0x1fff | REFER | TRUNCATE);
/// assert_eq!(handled_fs(7), 0x1fff | REFER | TRUNCATE | IOCTL_DEV);
/// ```
pub const fn handled_fs(abi: u32) -> u64 {
    let mut m = (1 << 13) - 1;
    if abi >= 2 {
        m |= REFER;
    }
    if abi >= 3 {
        m |= TRUNCATE;
    }
    if abi >= 5 {
        m |= IOCTL_DEV;
    }
    m
}

/// The network rights `abi` can handle: TCP bind and connect from ABI 4.
pub const fn handled_net(abi: u32) -> u64 {
    if abi >= 4 {
        BIND_TCP | CONNECT_TCP
    } else {
        0
    }
}

/// The scopes `abi` can restrict: from ABI 6, abstract unix sockets and signals.
pub const fn scoped(abi: u32) -> u64 {
    if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    }
}

/// One rule: `access` on the file or directory at `path` inside the sandbox, and beneath it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Absolute path inside the sandbox, opened by init with `O_PATH` once the view is built.
    pub path: CString,
    pub access: u64,
    /// The path may be missing inside, and the rule is then skipped. Every path the planner
    /// emits today is one the view itself creates, so none is; a missing one is a setup error.
    pub optional: bool,
}

/// The rules for one run, for the kernel's ABI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// The kernel's ABI as queried (may be newer than [`NEWEST_KNOWN_ABI`]).
    pub abi: u32,
    /// Filesystem rights handled: anything in here and not granted by a rule is refused.
    pub handled_fs: u64,
    /// Network rights handled: TCP binds and connects to ports without a rule are refused.
    pub handled_net: u64,
    /// Scopes restricted.
    pub scoped: u64,
    pub rules: Vec<Rule>,
    /// TCP ports and the network rights granted on each, sorted by port, one entry a port.
    pub ports: Vec<(u16, u64)>,
    /// Inside path of the policy's test-only bind that has no rule (`debug_unlandlocked_bind`),
    /// so that the report can say so; the child never reads this.
    pub debug_unlandlocked: Option<String>,
}

impl Ruleset {
    /// An empty ruleset that handles everything `abi` knows (capped at [`NEWEST_KNOWN_ABI`]).
    pub fn for_abi(abi: u32) -> Ruleset {
        let known = abi.min(NEWEST_KNOWN_ABI);
        Ruleset {
            abi,
            handled_fs: handled_fs(known),
            handled_net: handled_net(known),
            scoped: scoped(known),
            rules: Vec::new(),
            ports: Vec::new(),
            debug_unlandlocked: None,
        }
    }

    /// Adds a rule for `path` (absolute, inside), keeping of `access` what the ABI handles and,
    /// for a file (`dir` false), what applies to files. A rule left with no right is not added.
    ///
    /// ```
    /// use palisade_linux::landlock::*;
    /// let mut r = Ruleset::for_abi(1);
    /// r.add("/usr", READ_EXEC, true);
    /// r.add("/dev/null", DEVICE, false);
    /// r.add("/workspace", FULL, true);
    /// // ABI 1 handles neither truncation nor device ioctls; a file gets no directory rights.
    /// assert_eq!(r.rules[1].access, READ_FILE | WRITE_FILE);
    /// assert_eq!(r.rules[2].access, handled_fs(1) & FULL);
    /// ```
    pub fn add(&mut self, path: &str, access: u64, dir: bool) {
        let mut a = access & self.handled_fs;
        if !dir {
            a &= FILE_RIGHTS;
        }
        if a == 0 {
            return;
        }
        self.rules.push(Rule {
            path: CString::new(path).expect("no NUL byte in a validated path"),
            access: a,
            optional: false,
        });
    }

    /// Grants `access` (of [`BIND_TCP`], [`CONNECT_TCP`]) on TCP `port`, keeping what the ABI
    /// handles; nothing is added on an ABI without network rights.
    ///
    /// ```
    /// use palisade_linux::landlock::*;
    /// let mut r = Ruleset::for_abi(4);
    /// r.allow_port(8000, BIND_TCP | CONNECT_TCP);
    /// r.allow_port(3128, CONNECT_TCP);
    /// r.allow_port(8000, CONNECT_TCP);
    /// assert_eq!(r.ports, [(3128, CONNECT_TCP), (8000, BIND_TCP | CONNECT_TCP)]);
    /// let mut old = Ruleset::for_abi(3);
    /// old.allow_port(3128, CONNECT_TCP);
    /// assert!(old.ports.is_empty());
    /// ```
    pub fn allow_port(&mut self, port: u16, access: u64) {
        let a = access & self.handled_net;
        if a == 0 {
            return;
        }
        match self.ports.binary_search_by_key(&port, |&(p, _)| p) {
            Ok(i) => self.ports[i].1 |= a,
            Err(i) => self.ports.insert(i, (port, a)),
        }
    }
}

/// What the plan does about Landlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LandlockPlan {
    /// Enforce this ruleset.
    Enforce(Ruleset),
    /// The kernel cannot enforce Landlock and the user waived it (`--allow-degraded landlock`);
    /// why, for the report.
    Waived(String),
}

impl LandlockPlan {
    /// The ruleset to enforce, if any.
    pub fn ruleset(&self) -> Option<&Ruleset> {
        match self {
            LandlockPlan::Enforce(r) => Some(r),
            LandlockPlan::Waived(_) => None,
        }
    }

    /// What the report says about this layer.
    pub fn state(&self) -> LandlockState {
        match self {
            LandlockPlan::Enforce(r) => LandlockState::Enforced {
                abi: r.abi,
                handled_fs: r.handled_fs,
                handled_net: r.handled_net,
                scoped: r.scoped,
                rules: r.rules.len(),
                ports: r.ports.clone(),
                debug_unlandlocked: r.debug_unlandlocked.clone(),
            },
            LandlockPlan::Waived(why) => LandlockState::Waived {
                reason: why.clone(),
            },
        }
    }
}

/// Whether Landlock held for a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LandlockState {
    Enforced {
        abi: u32,
        handled_fs: u64,
        handled_net: u64,
        scoped: u64,
        rules: usize,
        /// TCP ports with network rights, as in [`Ruleset::ports`].
        ports: Vec<(u16, u64)>,
        /// A test-only path in the view without a rule.
        debug_unlandlocked: Option<String>,
    },
    Waived {
        reason: String,
    },
}

const FS_NAMES: [&str; 16] = [
    "execute",
    "write-file",
    "read-file",
    "read-dir",
    "remove-dir",
    "remove-file",
    "make-char",
    "make-dir",
    "make-reg",
    "make-sock",
    "make-fifo",
    "make-block",
    "make-sym",
    "refer",
    "truncate",
    "ioctl-dev",
];

/// The names of the filesystem rights in `mask`, e.g. `["execute", "read-file"]`.
///
/// ```
/// use palisade_linux::landlock::{fs_names, READ_EXEC};
/// assert_eq!(fs_names(READ_EXEC), ["execute", "read-file", "read-dir"]);
/// ```
pub fn fs_names(mask: u64) -> Vec<&'static str> {
    (0..16)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| FS_NAMES[i])
        .collect()
}

/// The names of the scopes in `mask`.
pub fn scope_names(mask: u64) -> Vec<&'static str> {
    let mut v = Vec::new();
    if mask & SCOPE_ABSTRACT_UNIX_SOCKET != 0 {
        v.push("abstract-unix-socket");
    }
    if mask & SCOPE_SIGNAL != 0 {
        v.push("signal");
    }
    v
}

/// The names of the network rights in `mask`.
pub fn net_names(mask: u64) -> Vec<&'static str> {
    let mut v = Vec::new();
    if mask & BIND_TCP != 0 {
        v.push("bind-tcp");
    }
    if mask & CONNECT_TCP != 0 {
        v.push("connect-tcp");
    }
    v
}

/// Why the kernel cannot enforce Landlock, and what to do, for the `errno` of the ABI query.
pub fn unavailable_hint(errno: i32) -> &'static str {
    match errno {
        libc::ENOSYS => "this kernel was built without Landlock: Linux 5.13 or newer with CONFIG_SECURITY_LANDLOCK=y is needed",
        libc::EOPNOTSUPP => "Landlock is built in but not enabled at boot: add `landlock` to the kernel's `lsm=` list (e.g. `lsm=landlock,lockdown,yama,integrity,apparmor,bpf` in GRUB_CMDLINE_LINUX, then update-grub and reboot)",
        libc::EPERM | libc::EACCES => "the Landlock system calls are refused here (a container's seccomp profile may block `landlock_create_ruleset`; allow it, or run palisade outside the container)",
        _ => "the Landlock ABI query failed unexpectedly",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_abi_handles_what_it_knows() {
        let base = (1u64 << 13) - 1;
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7].map(|a| (handled_fs(a), scoped(a))),
            [
                (base, 0),
                (base | REFER, 0),
                (base | REFER | TRUNCATE, 0),
                (base | REFER | TRUNCATE, 0),
                (base | REFER | TRUNCATE | IOCTL_DEV, 0),
                (ALL_FS, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL),
                (ALL_FS, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL),
            ]
        );
        assert_eq!([3, 4, 7].map(handled_net), [0, BIND_TCP | CONNECT_TCP, 3]);
        // A newer kernel is used at the newest ABI known here, and reported as what it is.
        let r = Ruleset::for_abi(9);
        assert_eq!(
            (r.abi, r.handled_fs, r.handled_net, r.scoped),
            (9, ALL_FS, 3, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
        );
    }

    #[test]
    fn rules_keep_only_what_the_abi_and_the_file_type_allow() {
        let mut r = Ruleset::for_abi(2);
        r.add("/", LIST, true);
        r.add("/dev/tty", DEVICE, false);
        r.add("/tmp", FULL, true);
        r.add("/probe", READ_EXEC, false);
        assert_eq!(
            r.rules,
            vec![
                Rule {
                    path: c"/".into(),
                    access: READ_DIR,
                    optional: false
                },
                Rule {
                    path: c"/dev/tty".into(),
                    access: READ_FILE | WRITE_FILE,
                    optional: false
                },
                Rule {
                    path: c"/tmp".into(),
                    access: (((1 << 13) - 1) | REFER) & !(MAKE_CHAR | MAKE_BLOCK),
                    optional: false
                },
                Rule {
                    path: c"/probe".into(),
                    access: EXECUTE | READ_FILE,
                    optional: false
                },
            ]
        );
        // A right set that leaves nothing for a file is dropped rather than sent as 0 (the kernel
        // refuses an empty rule with ENOMSG).
        r.add("/etc/passwd", LIST, false);
        assert_eq!(r.rules.len(), 4);
    }

    #[test]
    fn names_for_the_report() {
        assert_eq!(
            fs_names(DEVICE),
            [
                "write-file",
                "read-file",
                "read-dir",
                "truncate",
                "ioctl-dev"
            ]
        );
        assert_eq!(fs_names(ALL_FS).len(), 16);
        assert_eq!(
            fs_names(FULL).len(),
            14,
            "no device nodes made in writable places"
        );
        assert_eq!(scope_names(scoped(7)), ["abstract-unix-socket", "signal"]);
        assert_eq!(net_names(handled_net(4)), ["bind-tcp", "connect-tcp"]);
        assert!(unavailable_hint(libc::EOPNOTSUPP).contains("lsm="));
    }
}
