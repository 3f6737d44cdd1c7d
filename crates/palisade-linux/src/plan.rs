//! The filesystem view and the exec plan, computed on the supervisor side before `clone3`.
//!
//! Everything the child will need is built here, with allocation allowed: C strings, pointer
//! arrays, the list of mount operations. The child then only walks this plan with raw system calls
//! (see `child`), which keeps it async-signal-safe even when the supervisor has other threads.
//!
//! The view is a fresh tmpfs root holding: read-only binds of the system directories (`/usr`, the
//! merged-`/usr` links, `/lib*`, `/bin`, `/sbin`, `/opt`); a short list of `/etc` entries; generated
//! `passwd`, `group`, `hosts`, `resolv.conf` and `hostname`; a fresh `/proc`, read-only; a minimal `/dev`; `/tmp` on its own tmpfs; the scratch directory
//! at [`SCRATCH_DIR`]; and the policy's extra binds. Nothing else of the host exists inside.
//!
//! The same calls that add a mount to the view add its Landlock rule (see `landlock`): read and
//! execute on read-only binds, read on palisade's own read-only scaffolding, every right on the
//! writable places, so that the two walls are derived from one description of the view.

use crate::error::SetupError;
use crate::landlock::{LandlockPlan, Ruleset, DEVICE, FULL, LIST, READ, READ_EXEC};
use libc::{c_int, c_ulong};
use palisade_policy::{Degradable, Policy, Scratch, DEFAULT_PATH, SCRATCH_DIR};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Host directories made visible read-only when they exist (a symlink is recreated as one).
pub const SYSTEM_DIRS: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt",
];

/// `/etc` entries made visible read-only when they exist: the loader, certificates, time zone,
/// name-service switch, alternatives, and protocol tables. Never the whole of `/etc`.
pub const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "alternatives",
    "protocols",
    "services",
    "host.conf",
    "gai.conf",
    "mime.types",
    "os-release",
    "debian_version",
];

/// Device nodes bound from the host's `/dev`.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// One host path the child opens (or the supervisor pre-opens) and binds.
#[derive(Debug, Clone)]
pub struct Source {
    /// Canonical host path, opened by the child with no symlink resolution at all.
    pub path: CString,
    /// Device and inode seen by the supervisor; the child refuses a different file.
    pub dev: u64,
    pub ino: u64,
    /// A detached mount tree prepared by the supervisor (root only), or -1.
    pub tree: c_int,
    /// Map ownership through the sandbox's user namespace (root-launched writable binds).
    pub idmap: bool,
    /// Filled by the child once opened.
    pub fd: c_int,
    /// Opened by the supervisor as a detached tree before `clone3` (root only: it can read paths
    /// the mapped sandbox uid cannot, and only it may set an idmap).
    pub in_supervisor: bool,
}

/// One step of building the new root. Paths are relative to the new root (the child's cwd).
#[derive(Debug, Clone)]
pub enum Op {
    Mkdir {
        path: CString,
        mode: u32,
    },
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    Write {
        path: CString,
        data: Vec<u8>,
    },
    Tmpfs {
        path: CString,
        flags: c_ulong,
        data: CString,
    },
    Proc {
        path: CString,
    },
    Devpts {
        path: CString,
    },
    Bind {
        source: usize,
        path: CString,
        attrs: u64,
    },
    /// Make the mount whose root `path` is read-only in place (a mount init made itself, such as
    /// its `proc`; never a path inside a mount, whose whole mount would change); `optional` paths
    /// may be missing.
    ReadOnly {
        path: CString,
        optional: bool,
    },
    /// An overlay file system on `path`; `data` holds its options (layers relative to the new
    /// root, which is init's working directory).
    Overlay {
        path: CString,
        data: CString,
    },
    /// Fails unless the file system at `path` keeps `user.*` extended attributes (overlayfs
    /// mounted in a user namespace records opaque directories in them).
    UserXattr {
        path: CString,
    },
    /// Opens the directory `path` and sends it to the supervisor, tagged `tag`, over init's
    /// socket; init keeps no copy.
    SendDir {
        path: CString,
        tag: u8,
    },
    /// Detaches the mount on `path` (`MNT_DETACH`): what still uses it (an overlay's private
    /// clone of a layer, the supervisor's descriptor) keeps it alive; the view no longer shows it.
    Detach {
        path: CString,
    },
    /// Removes the empty directory `path`.
    Rmdir {
        path: CString,
    },
    /// Bind a file palisade wrote into the new root (`from`, on its tmpfs) over another inside
    /// path, read-only: a host file shown changed inside without touching the host (the system
    /// CA bundles with the run's CA appended).
    BindFile {
        from: CString,
        path: CString,
    },
    /// This user namespace's own ceilings (`/proc/sys/user/*`): no nested namespaces, few
    /// inotify instances and watches, no fanotify. The kernel charges these counts to the
    /// namespace's owner too (the invoking user, or the run's host id for root launches): the
    /// sandbox's share of the owner's quota is bounded here.
    UserNsLimits,
}

/// Where a template's per-run init mounts something afresh for every run (relative to the new
/// root): everything a run can write or that shows its own processes. The rest of the view (the
/// system directories, `/etc`, `/dev`'s nodes) is the template's, built once and read-only.
pub const PER_RUN_MOUNTS: &[&str] = &["proc", "dev/pts", "dev/shm", "tmp", "workspace"];

/// Whether the relative `path` is a per-run mount point (`or_equal`) or lies beneath one.
fn in_per_run(path: &[u8], or_equal: bool) -> bool {
    PER_RUN_MOUNTS.iter().any(|m| {
        let m = m.as_bytes();
        path.starts_with(m)
            && ((or_equal && path.len() == m.len())
                || (path.len() > m.len() && path[m.len()] == b'/'))
    })
}

/// Whether `op` is done again for every run of a template (`true`) or once for the template's
/// prepared view (`false`): mounts on or beneath a per-run mount point, and what is created
/// beneath one, are per run; the mount points themselves, like the rest of the scaffolding, are
/// the template's. A new kind of operation must say which it is.
pub fn is_per_run(op: &Op) -> bool {
    match op {
        Op::Mkdir { path, .. }
        | Op::Touch { path }
        | Op::Symlink { path, .. }
        | Op::Write { path, .. } => in_per_run(path.as_bytes(), false),
        Op::Tmpfs { path, .. }
        | Op::Proc { path }
        | Op::Devpts { path }
        | Op::Bind { path, .. }
        | Op::ReadOnly { path, .. }
        | Op::BindFile { path, .. } => in_per_run(path.as_bytes(), true),
        // A workspace is per run whole (templates refuse one: see zygote.rs).
        Op::Overlay { .. }
        | Op::UserXattr { .. }
        | Op::SendDir { .. }
        | Op::Detach { .. }
        | Op::Rmdir { .. } => true,
        Op::UserNsLimits => true,
    }
}

/// Whether the absolute path `inside` (a Landlock rule's) names something a template mounts
/// afresh for every run, whose inode therefore changes from run to run.
pub fn is_per_run_path(inside: &[u8]) -> bool {
    in_per_run(inside.strip_prefix(b"/").unwrap_or(inside), true)
}

/// The per-run part of a plan: its per-run operations, and the sources their binds take (the
/// operations' `source` indexes this list).
#[derive(Debug, Clone, Default)]
pub struct RunPart {
    pub sources: Vec<Source>,
    pub ops: Vec<Op>,
}

/// The operations of `plan` done for every run of a template, in order, with their sources.
pub fn run_part(plan: &Plan) -> RunPart {
    let mut part = RunPart::default();
    for op in plan.ops.iter().filter(|o| is_per_run(o)) {
        let mut op = op.clone();
        if let Op::Bind { source, .. } = &mut op {
            part.sources.push(plan.sources[*source].clone());
            *source = part.sources.len() - 1;
        }
        part.ops.push(op);
    }
    part
}

/// What a run adds to its view beyond its policy, made by the supervisor for this run alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// A CA certificate (PEM) the sandbox's clients trust besides the host's (TLS inspection):
    /// each system CA bundle the host has is shown inside with it appended (the host's file is
    /// not touched), [`CA_FILE`] holds it alone and [`BUNDLE_FILE`] with the host's first bundle,
    /// and the usual variables point at them ([`TRUST_VARIABLES`]).
    pub trust: Option<String>,
    /// Variables set last, over the policy's (the placeholders of secrets).
    pub env: Vec<(String, String)>,
    /// Files the sandbox's init writes under the payload's working directory before the payload
    /// starts (see [`FileIn`]).
    pub files: Vec<FileIn>,
}

/// A file given to one run: written by the sandbox's init, inside the boundary (its user, its
/// mounts), under the payload's working directory, after the view is built and before the payload
/// starts; the payload finds it there as if it had been in the directory all along. Directories on
/// its way are made (mode 0755); an existing file is replaced. No symbolic link is followed and no
/// mount crossed on the way, so with a host scratch directory a link left there by an earlier run
/// fails the run rather than redirect the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIn {
    /// Relative to the working directory: `name` or `dir/name`, without `.` or `..` components,
    /// empty components or NUL bytes.
    pub path: String,
    pub data: Vec<u8>,
    /// Permission bits (at most 0o777).
    pub mode: u32,
}

/// Most files one run may be given.
pub const MAX_FILES_IN: usize = 4096;
/// Most bytes the files' names and records may take in a run's request (`in_files_size`): they
/// travel with the program in a template's request, which is bounded (160 KiB in all).
pub const MAX_FILES_IN_BYTES: usize = 64 << 10;

/// What the record of a file at `path` takes in a run's request: its path's bytes and 20 bytes of
/// framing, and 4 more per directory on its way.
pub fn in_file_size(path: &str) -> usize {
    path.len() + 20 + 4 * path.matches('/').count()
}

/// Whether files at `paths` fit in one run: at most [`MAX_FILES_IN`] of them, their records at
/// most [`MAX_FILES_IN_BYTES`].
pub fn in_files_fit<'a>(paths: impl IntoIterator<Item = &'a str>) -> bool {
    let (mut n, mut bytes) = (0usize, 0usize);
    for p in paths {
        n += 1;
        bytes += in_file_size(p);
    }
    n <= MAX_FILES_IN && bytes <= MAX_FILES_IN_BYTES
}

/// A run's file as its init writes it: the directories on its way and its name (each one path
/// component), its mode, and how many bytes of the run's files descriptor are its own (the files'
/// bytes follow one another there, in this order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFile {
    pub dirs: Vec<CString>,
    pub name: CString,
    pub mode: u32,
    pub len: u64,
}

/// Where palisade's generated trust files are inside.
pub const CA_FILE: &str = "/etc/palisade/ca.pem";
pub const BUNDLE_FILE: &str = "/etc/palisade/ca-bundle.pem";

/// Variables that point clients at the bundle with the run's CA (the whole trust set: curl,
/// OpenSSL and Python's `ssl`, requests and pip, git, Go, Cargo, the AWS SDKs), and Node's,
/// which adds to its own roots.
pub const TRUST_VARIABLES: &[(&str, &str)] = &[
    ("SSL_CERT_FILE", BUNDLE_FILE),
    ("CURL_CA_BUNDLE", BUNDLE_FILE),
    ("REQUESTS_CA_BUNDLE", BUNDLE_FILE),
    ("PIP_CERT", BUNDLE_FILE),
    ("GIT_SSL_CAINFO", BUNDLE_FILE),
    ("CARGO_HTTP_CAINFO", BUNDLE_FILE),
    ("AWS_CA_BUNDLE", BUNDLE_FILE),
    ("NODE_EXTRA_CA_CERTS", CA_FILE),
];

/// Longest host CA bundle copied into a view.
const MAX_BUNDLE: usize = 8 << 20;

/// Signals the whole sandbox may have queued at once (`RLIMIT_SIGPENDING`).
pub const SIGPENDING: u64 = 1024;

/// Identity of the payload inside, and how it maps to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// uid/gid inside the sandbox.
    pub uid: u32,
    pub gid: u32,
    /// Host uid/gid the inside ids map to.
    pub host_uid: u32,
    pub host_gid: u32,
    /// Launched by root: the map is written with privilege and supplementary groups are cleared.
    pub privileged: bool,
}

/// The program to run: candidate paths in `PATH` order, argv and envp as C arrays.
#[derive(Debug)]
pub struct Exec {
    pub candidates: Vec<CString>,
    pub argv: crate::sys::CStrArray,
    pub envp: crate::sys::CStrArray,
    /// Files init writes before the payload starts; their bytes come on a descriptor of their own
    /// (`ChildFds::files`).
    pub files: Vec<InFile>,
}

impl Exec {
    /// The program's candidate paths, arguments and environment, with the NULL-terminated pointer
    /// arrays `execve` takes built over them.
    pub fn new(candidates: Vec<CString>, argv: Vec<CString>, envp: Vec<CString>) -> Exec {
        Exec {
            candidates,
            argv: crate::sys::CStrArray::new(argv),
            envp: crate::sys::CStrArray::new(envp),
            files: Vec::new(),
        }
    }
}

/// Everything the child needs.
#[derive(Debug)]
pub struct Plan {
    pub sources: Vec<Source>,
    pub ops: Vec<Op>,
    pub hostname: CString,
    pub ids: Ids,
    pub exec: Exec,
    pub tty: bool,
    pub workdir: CString,
    /// The stack the payload starts on (see `child::supervise`), allocated here so that the child
    /// never allocates.
    pub payload_stack: Vec<u8>,
    /// Index in `sources` of a host scratch directory.
    pub scratch_source: Option<usize>,
    /// The seccomp filter the payload installs last (see `seccomp`).
    pub seccomp: Vec<crate::seccomp::SockFilter>,
    /// Resource limits the payload sets on itself before exec: (resource, soft, hard).
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// The Landlock rules init loads once the view is built and the payload enters (see
    /// `landlock`), or why they were waived.
    pub landlock: LandlockPlan,
    /// Sockets init creates in the sandbox's network namespace and hands to the supervisor (the
    /// egress proxy's listeners), in this order; empty without network rules.
    pub sockets: Vec<SockSpec>,
    /// The protected paths under a host scratch directory.
    pub protection: Protection,
    /// With a workspace: the directory its changes are made against, as the plan opened it.
    pub workspace: Option<WorkspaceBase>,
}

/// The host directory under a copy-on-write workspace (see [`WORKSPACE_TAG`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceBase {
    /// Canonical host path.
    pub path: PathBuf,
    /// Device and inode seen when the plan was made (the child checks the same).
    pub dev: u64,
    pub ino: u64,
}

/// The tag with which init sends the supervisor the root of a workspace's private tmpfs (the
/// overlay's upper and work directories live there): the supervisor reads the changes from it
/// after the run, when nothing of the sandbox is left to write it.
pub const WORKSPACE_TAG: u8 = b'w';

/// Scaffolding of a workspace in the new root, removed from the view before the payload starts.
const WS_DIR: &str = ".palisade-workspace";

/// Most files and directories a workspace's changes may hold (the upper layer's `nr_inodes`): a
/// bound on what the supervisor walks after the run.
pub const WORKSPACE_MAX_INODES: u64 = 1_000_000;

/// What became of the policy's protected paths under a host scratch directory (relative paths).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// The scratch directory's canonical host path; `None` with an ephemeral scratch.
    pub scratch: Option<PathBuf>,
    /// Existing files and directories mounted read-only over themselves.
    pub read_only: Vec<String>,
    /// Directories on the way to a protected path, bound onto themselves so that they are mount
    /// points: a mount point cannot be renamed or removed (`EBUSY`), so the code cannot move a
    /// protected path aside and put its own in its place.
    pub pinned: Vec<String>,
    /// The first missing component of each protected path that does not exist (the path itself,
    /// or a directory on the way: a `.git` the code creates is a repository even without a
    /// `.git/config`): a mount needs something to cover, so these can be created inside; the
    /// supervisor looks after the run and moves whatever appeared there aside (see
    /// `host::disarm_all`).
    pub watched: Vec<String>,
    /// Protected too because the repository's own files point there (`core.hooksPath`, a
    /// `gitdir:` or `commondir` inside the scratch, an included config, a script a configured
    /// command names), with where each was named.
    pub derived: Vec<Derived>,
    /// What the repository's files point at that palisade did not follow, and why (outside the
    /// scratch directory: not visible inside unless a bind shows it, and not protected here).
    pub not_followed: Vec<String>,
}

/// A protected path found in a repository's own files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// Relative to the scratch directory.
    pub path: String,
    /// Where it was named, e.g. `core.hooksPath in .git/config`.
    pub from: String,
}

/// One socket of the egress proxy, made inside the sandbox's network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockSpec {
    /// What it is for.
    pub role: SockRole,
    /// IPv4 address (host byte order) and port it is bound to.
    pub addr: u32,
    pub port: u16,
}

/// The listeners of the egress proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockRole {
    /// HTTP proxy (CONNECT and absolute-form requests), TCP on 127.0.0.1.
    HttpProxy,
    /// SOCKS5, TCP on 127.0.0.1.
    Socks,
    /// The DNS stub, UDP on 127.0.0.1:53.
    Dns,
    /// Transparent capture of one allowed port, TCP on 0.0.0.0.
    Transparent,
}

impl SockSpec {
    pub fn udp(&self) -> bool {
        self.role == SockRole::Dns
    }
}

/// The egress listeners for a policy: without allow rules, only the DNS stub (which refuses).
pub fn sockets(policy: &Policy) -> Vec<SockSpec> {
    use palisade_policy::net::{DNS_PORT, HTTP_PROXY_PORT, SOCKS_PORT};
    const LO: u32 = 0x7f00_0001;
    if !policy.network.enabled() {
        // No egress: the DNS stub alone, which refuses every name and counts it for the
        // report's attempts.
        return vec![SockSpec {
            role: SockRole::Dns,
            addr: LO,
            port: DNS_PORT,
        }];
    }
    let mut v = vec![
        SockSpec {
            role: SockRole::HttpProxy,
            addr: LO,
            port: HTTP_PROXY_PORT,
        },
        SockSpec {
            role: SockRole::Socks,
            addr: LO,
            port: SOCKS_PORT,
        },
        SockSpec {
            role: SockRole::Dns,
            addr: LO,
            port: DNS_PORT,
        },
    ];
    for port in policy.network.ports() {
        if ![HTTP_PROXY_PORT, SOCKS_PORT, DNS_PORT].contains(&port) {
            v.push(SockSpec {
                role: SockRole::Transparent,
                addr: 0,
                port,
            });
        }
    }
    v
}

/// Size of the payload's start-up stack: it only runs until exec.
pub const PAYLOAD_STACK: usize = 256 * 1024;

/// What the plan needs to know of the host; a trait so that tests can describe a host.
pub trait HostFs {
    /// `lstat`: `None` if absent.
    fn lstat(&self, p: &Path) -> Option<std::fs::Metadata>;
    fn readlink(&self, p: &Path) -> Option<PathBuf>;
    /// The kernel's Landlock ABI version, or the `errno` of the query.
    fn landlock_abi(&self) -> Result<u32, i32>;
    /// The content of the regular file `rel` under the directory `root`, at most `max` bytes;
    /// `Ok(None)` if it does not exist. No link is followed, on the way or at the end, and a
    /// special file is refused without being opened for reading.
    fn read_beneath(&self, root: &Path, rel: &str, max: usize) -> std::io::Result<Option<Vec<u8>>> {
        read_beneath(root, rel, max)
    }
    /// The host's own canonical path of `p` (its links followed): for system files, never for a
    /// path a sandbox could change.
    fn canonical(&self, p: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(p).ok()
    }
    /// A host system file, at most `max` bytes.
    fn read_system(&self, p: &Path, max: usize) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let mut buf = Vec::new();
        std::fs::File::open(p)?
            .take(max as u64 + 1)
            .read_to_end(&mut buf)?;
        if buf.len() > max {
            return Err(std::io::Error::other(format!("larger than {max} bytes")));
        }
        Ok(buf)
    }
}

/// [`HostFs::read_beneath`] on the real host: each directory opened from the last with
/// `O_NOFOLLOW` (the first with no symlink resolution at all), the file looked at with `lstat`
/// before it is opened.
fn read_beneath(root: &Path, rel: &str, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{Error, Read};
    use std::os::fd::AsRawFd;
    let cstr = |b: &[u8]| CString::new(b).map_err(Error::other);
    let fd = crate::sys::open_path_noresolve(
        &cstr(root.as_os_str().as_bytes())?,
        crate::sys::RESOLVE_NO_SYMLINKS,
    )
    .map_err(Error::from_raw_os_error)?;
    let mut dir = fd;
    let comps: Vec<&str> = rel.split('/').collect();
    let (name, parents) = comps.split_last().expect("split yields one item at least");
    for comp in parents {
        let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY;
        match crate::sys::openat(dir.as_raw_fd(), &cstr(comp.as_bytes())?, flags, 0) {
            Ok(fd) => dir = fd,
            Err(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::from_raw_os_error(e)),
        }
    }
    let cname = cstr(name.as_bytes())?;
    match crate::sys::entry_kind(dir.as_raw_fd(), &cname).map_err(Error::from_raw_os_error)? {
        None => return Ok(None),
        Some(libc::S_IFREG) => {}
        Some(libc::S_IFLNK) => return Err(Error::other("a symbolic link, not followed")),
        Some(_) => return Err(Error::other("not a regular file")),
    }
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd =
        crate::sys::openat(dir.as_raw_fd(), &cname, flags, 0).map_err(Error::from_raw_os_error)?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(Error::other("not a regular file"));
    }
    let mut buf = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > max {
        return Err(Error::other(format!(
            "longer than {max} bytes, more than palisade reads to find where it points"
        )));
    }
    Ok(Some(buf))
}

/// The real host.
pub struct RealHost;

impl HostFs for RealHost {
    fn lstat(&self, p: &Path) -> Option<std::fs::Metadata> {
        std::fs::symlink_metadata(p).ok()
    }
    fn readlink(&self, p: &Path) -> Option<PathBuf> {
        std::fs::read_link(p).ok()
    }
    /// Asked once per process: the kernel's ABI does not change while it runs.
    fn landlock_abi(&self) -> Result<u32, i32> {
        static ABI: std::sync::OnceLock<Result<u32, i32>> = std::sync::OnceLock::new();
        *ABI.get_or_init(crate::sys::landlock_abi)
    }
}

fn c(s: impl AsRef<[u8]>) -> CString {
    // Policy values are validated to contain no NUL byte; host paths from the kernel cannot.
    CString::new(s.as_ref()).expect("no NUL byte in a validated value")
}

fn rel(inside: &str) -> CString {
    c(inside.trim_start_matches('/'))
}

struct Builder<'h> {
    host: &'h dyn HostFs,
    sources: Vec<Source>,
    ops: Vec<Op>,
    /// The Landlock rules, `None` when Landlock is waived.
    landlock: Option<Ruleset>,
}

impl Builder<'_> {
    /// The Landlock rule for what the view puts at `inside` (absolute).
    fn rule(&mut self, inside: &str, access: u64, dir: bool) {
        if let Some(r) = &mut self.landlock {
            r.add(inside, access, dir);
        }
    }

    fn source(&mut self, path: &Path, meta: &std::fs::Metadata, idmap: bool) -> usize {
        self.user_source(path, meta, idmap, false)
    }

    fn user_source(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        idmap: bool,
        in_supervisor: bool,
    ) -> usize {
        self.sources.push(Source {
            path: c(path.as_os_str().as_bytes()),
            dev: meta.dev(),
            ino: meta.ino(),
            tree: -1,
            idmap,
            fd: -1,
            in_supervisor,
        });
        self.sources.len() - 1
    }

    /// Creates `inside` and its missing ancestors (directories), then the mount point itself.
    fn mount_point(&mut self, inside: &str, dir: bool) {
        let mut acc = String::new();
        let comps: Vec<&str> = inside.trim_start_matches('/').split('/').collect();
        for (i, comp) in comps.iter().enumerate() {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(comp);
            let last = i + 1 == comps.len();
            if last && !dir {
                self.ops.push(Op::Touch { path: c(&acc) });
            } else if !self
                .ops
                .iter()
                .any(|o| matches!(o, Op::Mkdir { path, .. } if path.as_bytes() == acc.as_bytes()))
            {
                self.ops.push(Op::Mkdir {
                    path: c(&acc),
                    mode: 0o755,
                });
            }
        }
    }

    /// Mirrors host `/name` (a symlink stays a symlink) read-only with `attrs`; a bind gets the
    /// Landlock rights `access` (`None`: covered by a rule on a parent).
    fn mirror(&mut self, host_path: &Path, inside: &str, attrs: u64, access: Option<u64>) {
        let Some(meta) = self.host.lstat(host_path) else {
            return;
        };
        if meta.file_type().is_symlink() {
            if let Some(t) = self.host.readlink(host_path) {
                self.ops.push(Op::Symlink {
                    target: c(t.as_os_str().as_bytes()),
                    path: rel(inside),
                });
            }
            return;
        }
        let s = self.source(host_path, &meta, false);
        self.mount_point(inside, meta.is_dir());
        self.ops.push(Op::Bind {
            source: s,
            path: rel(inside),
            attrs,
        });
        if let Some(a) = access {
            self.rule(inside, a, meta.is_dir());
        }
    }
}

/// Resolves a user-given host path: canonical (symlinks the user wrote are followed once, here),
/// then described by `lstat` so the child can check it opened the same file.
pub fn resolve_host(
    field: &'static str,
    p: &Path,
) -> Result<(PathBuf, std::fs::Metadata), SetupError> {
    let canon = std::fs::canonicalize(p).map_err(|e| SetupError::HostPath {
        field,
        path: p.to_owned(),
        source: e,
    })?;
    let meta = std::fs::symlink_metadata(&canon).map_err(|e| SetupError::HostPath {
        field,
        path: p.to_owned(),
        source: e,
    })?;
    Ok((canon, meta))
}

/// Builds the plan for `policy` on `host`, for a payload with identity `ids`.
pub fn build(policy: &Policy, ids: Ids, host: &dyn HostFs) -> Result<Plan, SetupError> {
    build_with(policy, ids, host, &Extras::default())
}

/// The host's system CA bundles as the view shows them (their canonical paths, each once, in a
/// directory the view mirrors), with their content.
fn host_bundles(host: &dyn HostFs) -> Vec<(String, Vec<u8>)> {
    let mut found: Vec<(String, Vec<u8>)> = Vec::new();
    for p in palisade_policy::net::TRUST_BUNDLES {
        let Some(canon) = host.canonical(Path::new(p)) else {
            continue;
        };
        let Some(text) = canon.to_str().map(str::to_owned) else {
            continue;
        };
        let mut comps = text.trim_start_matches('/').split('/');
        let shown = match (comps.next(), comps.next()) {
            (Some("etc"), Some(e)) => ETC_ENTRIES.contains(&e),
            (Some(d), Some(_)) => SYSTEM_DIRS.contains(&d),
            _ => false,
        };
        if !shown || found.iter().any(|(f, _)| *f == text) {
            continue;
        }
        match host.lstat(&canon) {
            Some(m) if m.is_file() => {}
            _ => continue,
        }
        if let Ok(content) = host.read_system(&canon, MAX_BUNDLE) {
            found.push((text, content));
        }
    }
    found
}

/// `a` then `b` on a line of its own.
fn joined(a: &[u8], b: &str) -> Vec<u8> {
    let mut v = a.to_vec();
    if !v.is_empty() && !v.ends_with(b"\n") {
        v.push(b'\n');
    }
    v.extend_from_slice(b.as_bytes());
    if !v.ends_with(b"\n") {
        v.push(b'\n');
    }
    v
}

/// [`build`] with what the supervisor made for this run ([`Extras`]).
pub fn build_with(
    policy: &Policy,
    ids: Ids,
    host: &dyn HostFs,
    extras: &Extras,
) -> Result<Plan, SetupError> {
    policy.validate()?;
    let ro = crate::sys::MOUNT_ATTR_RDONLY
        | crate::sys::MOUNT_ATTR_NOSUID
        | crate::sys::MOUNT_ATTR_NODEV;
    let rw = crate::sys::MOUNT_ATTR_NOSUID | crate::sys::MOUNT_ATTR_NODEV;
    // Landlock: the ABI is asked once, here. Fail closed: a kernel without it is refused unless
    // the user waived the layer by name.
    let (landlock, waived) = match host.landlock_abi() {
        Ok(abi) => (Some(Ruleset::for_abi(abi)), None),
        Err(e) if policy.allow_degraded.contains(&Degradable::Landlock) => (
            None,
            Some(format!(
                "{}; {}",
                std::io::Error::from_raw_os_error(e),
                crate::landlock::unavailable_hint(e)
            )),
        ),
        Err(e) => {
            return Err(SetupError::LandlockUnavailable {
                source: std::io::Error::from_raw_os_error(e),
                hint: crate::landlock::unavailable_hint(e),
            })
        }
    };
    let mut b = Builder {
        host,
        sources: Vec::new(),
        ops: Vec::new(),
        landlock,
    };

    // Directory listings everywhere (`ls /`), and nothing else through the root.
    b.rule("/", LIST, true);
    for d in SYSTEM_DIRS {
        b.mirror(
            &Path::new("/").join(d),
            &format!("/{d}"),
            ro,
            Some(READ_EXEC),
        );
    }
    b.ops.push(Op::Mkdir {
        path: c("etc"),
        mode: 0o755,
    });
    // All of /etc inside is the short list and the generated files: read, never execute.
    b.rule("/etc", READ, true);
    for e in ETC_ENTRIES {
        b.mirror(&Path::new("/etc").join(e), &format!("/etc/{e}"), ro, None);
    }
    let (uid, gid) = (ids.uid, ids.gid);
    let passwd = if uid == 0 {
        format!("root:x:0:0:root:{SCRATCH_DIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    } else {
        format!("root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{gid}:sandbox:{SCRATCH_DIR}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    };
    let group = if gid == 0 {
        "root:x:0:\nnogroup:x:65534:\n".to_owned()
    } else {
        format!("root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n")
    };
    let h = &policy.hostname;
    let files: [(&str, String); 5] = [
        ("etc/passwd", passwd),
        ("etc/group", group),
        (
            "etc/hosts",
            format!(
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{h}\n"
            ),
        ),
        (
            "etc/resolv.conf",
            "# palisade: the sandbox has no network\nnameserver 127.0.0.1\n".to_owned(),
        ),
        ("etc/hostname", format!("{h}\n")),
    ];
    for (p, d) in files {
        b.ops.push(Op::Write {
            path: c(p),
            data: d.into_bytes(),
        });
    }
    // The run's CA, trusted inside without touching the host: palisade's own files on the new
    // root, and a copy of each host bundle with the CA appended bound over it (the /etc and
    // system-directory mirrors above are in place by now).
    if let Some(ca) = &extras.trust {
        b.ops.push(Op::Mkdir {
            path: rel("/etc/palisade"),
            mode: 0o755,
        });
        let bundles = host_bundles(host);
        let primary = bundles.first().map_or(&[][..], |(_, d)| d.as_slice());
        b.ops.push(Op::Write {
            path: rel(CA_FILE),
            data: joined(&[], ca),
        });
        b.ops.push(Op::Write {
            path: rel(BUNDLE_FILE),
            data: joined(primary, ca),
        });
        for (i, (inside, content)) in bundles.iter().enumerate() {
            let copy = format!("/etc/palisade/system-{i}.pem");
            b.ops.push(Op::Write {
                path: rel(&copy),
                data: joined(content, ca),
            });
            b.ops.push(Op::BindFile {
                from: rel(&copy),
                path: rel(inside),
            });
        }
    }

    // /proc: a new instance for the new pid namespace, read-only as a whole once the user
    // namespace's ceilings are written: its sysctl tree and sysrq, and the attributes of its
    // entries. Landlock already refuses writing its files, but not `chmod`, `chown` or times,
    // which an owner may change; and the entries of `/proc/net` are the network namespace's,
    // which a template may hand to a later run (docs/engine.md, "The network namespace").
    b.ops.push(Op::Mkdir {
        path: c("proc"),
        mode: 0o555,
    });
    b.ops.push(Op::Proc { path: c("proc") });
    b.rule("/proc", READ, true);
    b.ops.push(Op::UserNsLimits);
    b.ops.push(Op::ReadOnly {
        path: c("proc"),
        optional: false,
    });

    // /dev: a small tmpfs with bound device nodes, a private devpts and /dev/shm.
    let (nosuid, nodev, noexec) = (libc::MS_NOSUID, libc::MS_NODEV, libc::MS_NOEXEC);
    b.ops.push(Op::Mkdir {
        path: c("dev"),
        mode: 0o755,
    });
    b.ops.push(Op::Tmpfs {
        path: c("dev"),
        flags: nosuid | noexec,
        data: c("mode=0755,size=1m,nr_inodes=64"),
    });
    // /dev itself is read-only to Landlock (its tmpfs is not): nothing new appears in it.
    b.rule("/dev", READ, true);
    for n in DEV_NODES {
        let hp = Path::new("/dev").join(n);
        let Some(meta) = host.lstat(&hp) else {
            return Err(SetupError::MissingHostDevice { path: hp });
        };
        let s = b.source(&hp, &meta, false);
        b.ops.push(Op::Touch {
            path: c(format!("dev/{n}")),
        });
        b.ops.push(Op::Bind {
            source: s,
            path: c(format!("dev/{n}")),
            attrs: crate::sys::MOUNT_ATTR_NOSUID | crate::sys::MOUNT_ATTR_NOEXEC,
        });
        b.rule(&format!("/dev/{n}"), DEVICE, false);
    }
    b.ops.push(Op::Mkdir {
        path: c("dev/pts"),
        mode: 0o755,
    });
    b.ops.push(Op::Devpts { path: c("dev/pts") });
    b.rule("/dev/pts", DEVICE, true);
    b.ops.push(Op::Symlink {
        target: c("pts/ptmx"),
        path: c("dev/ptmx"),
    });
    b.ops.push(Op::Mkdir {
        path: c("dev/shm"),
        mode: 0o1777,
    });
    b.ops.push(Op::Tmpfs {
        path: c("dev/shm"),
        flags: nosuid | nodev | noexec,
        data: c("mode=1777,size=64m"),
    });
    b.rule("/dev/shm", FULL, true);
    for (l, t) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        b.ops.push(Op::Symlink {
            target: c(t),
            path: c(format!("dev/{l}")),
        });
    }

    b.ops.push(Op::Mkdir {
        path: c("tmp"),
        mode: 0o1777,
    });
    b.ops.push(Op::Tmpfs {
        path: c("tmp"),
        flags: nosuid | nodev,
        data: c(format!("mode=1777,size={}", policy.limits.tmp_bytes)),
    });
    b.rule("/tmp", FULL, true);

    b.ops.push(Op::Mkdir {
        path: rel(SCRATCH_DIR),
        mode: 0o755,
    });
    let mut scratch_source = None;
    let mut protection = Protection::default();
    let mut workspace_base = None;
    match &policy.scratch {
        Scratch::Ephemeral => b.ops.push(Op::Tmpfs {
            path: rel(SCRATCH_DIR),
            flags: nosuid | nodev,
            data: c(format!("mode=0755,size={}", policy.limits.scratch_bytes)),
        }),
        Scratch::Host { path } => {
            let (canon, meta) = resolve_host("filesystem.scratch", path)?;
            if !meta.is_dir() {
                return Err(SetupError::NotADirectory {
                    field: "filesystem.scratch",
                    path: canon,
                });
            }
            let s = b.user_source(&canon, &meta, ids.privileged, ids.privileged);
            scratch_source = Some(s);
            b.ops.push(Op::Bind {
                source: s,
                path: rel(SCRATCH_DIR),
                attrs: rw,
            });
            protection = protect(&mut b, &canon, &policy.protected, ids, ro, rw)?;
        }
        Scratch::Workspace { path } => {
            let (canon, meta) = resolve_host("filesystem.workspace", path)?;
            if !meta.is_dir() {
                return Err(SetupError::NotADirectory {
                    field: "filesystem.workspace",
                    path: canon,
                });
            }
            workspace(&mut b, &canon, &meta, ids, policy.limits.scratch_bytes, ro);
            workspace_base = Some(WorkspaceBase {
                path: canon,
                dev: meta.dev(),
                ino: meta.ino(),
            });
        }
    }
    b.rule(SCRATCH_DIR, FULL, true);

    // The policy's binds, parents before children; the test-only one gets no Landlock rule.
    let mut binds: Vec<(&palisade_policy::Bind, bool)> = policy
        .binds
        .iter()
        .map(|b| (b, true))
        .chain(policy.debug_unlandlocked_bind.iter().map(|b| (b, false)))
        .collect();
    binds.sort_by_key(|(b, _)| b.target.as_str().matches('/').count());
    for (bind, landlocked) in binds {
        let (canon, meta) =
            resolve_host(palisade_policy::Bind::field(bind.writable), &bind.source)?;
        let s = b.user_source(
            &canon,
            &meta,
            bind.writable && ids.privileged,
            ids.privileged,
        );
        b.mount_point(bind.target.as_str(), meta.is_dir());
        b.ops.push(Op::Bind {
            source: s,
            path: rel(bind.target.as_str()),
            attrs: if bind.writable { rw } else { ro },
        });
        let access = if bind.writable { FULL } else { READ_EXEC };
        if landlocked {
            b.rule(bind.target.as_str(), access, meta.is_dir());
        } else if let Some(r) = &mut b.landlock {
            r.debug_unlandlocked = Some(bind.target.to_string());
        }
    }
    // TCP: connect only to the egress proxy's listeners, bind and connect on the ports the policy
    // names for a server of the payload's own. Everything else is refused, so a shared network
    // namespace (a mistake of the first wall) still would not reach host services.
    if let Some(r) = &mut b.landlock {
        for p in policy.network.proxy_ports() {
            r.allow_port(p, crate::landlock::CONNECT_TCP);
        }
        for &p in &policy.network.local_ports {
            r.allow_port(p, crate::landlock::BIND_TCP | crate::landlock::CONNECT_TCP);
        }
    }
    let landlock = match (b.landlock, waived) {
        (Some(r), _) => LandlockPlan::Enforce(r),
        (None, why) => LandlockPlan::Waived(why.unwrap_or_default()),
    };

    let exec = exec_plan(policy, extras)?;
    Ok(Plan {
        sources: b.sources,
        ops: b.ops,
        hostname: c(&policy.hostname),
        ids,
        exec,
        tty: policy.tty,
        workdir: c(SCRATCH_DIR),
        payload_stack: vec![0; PAYLOAD_STACK],
        scratch_source,
        // Without egress, every connect also goes past the supervisor, which records where it
        // was going (the report's attempts) and lets the kernel refuse it.
        seccomp: seccomp_program(policy.allow_ptrace, !policy.network.enabled()),
        rlimits: vec![
            // 1, not 0: no core file, and no host core_pattern helper either (see the constant).
            (
                libc::RLIMIT_CORE,
                crate::seccomp::CORE_LIMIT,
                crate::seccomp::CORE_LIMIT,
            ),
            // Queued signals are counted per user up the namespace chain (the invoking user's
            // quota too, unprivileged); a sandbox keeps to a small share of it.
            (libc::RLIMIT_SIGPENDING, SIGPENDING, SIGPENDING),
            (libc::RLIMIT_NPROC, policy.limits.pids, policy.limits.pids),
            (
                libc::RLIMIT_NOFILE,
                policy.limits.open_files,
                policy.limits.open_files,
            ),
            (
                libc::RLIMIT_FSIZE,
                policy.limits.file_size_bytes,
                policy.limits.file_size_bytes,
            ),
            // SIGXCPU at the soft limit (a kill that says what it was), SIGKILL a second later for
            // code that catches it.
            (
                libc::RLIMIT_CPU,
                rlimit_cpu_secs(policy.limits.cpu_time()),
                rlimit_cpu_secs(policy.limits.cpu_time()) + 1,
            ),
        ],
        landlock,
        sockets: sockets(policy),
        protection,
        workspace: workspace_base,
    })
}

/// The steps of a copy-on-write workspace on [`SCRATCH_DIR`] (docs/workspace.md): a private tmpfs
/// of `cap` bytes holds the overlay's upper and work directories; the host directory `canon` is
/// bound read-only (idmapped for a root launch, like a host scratch) as the lower layer; the
/// overlay is mounted with `userxattr` (the only way a user namespace may mount it; it also
/// turns off `redirect_dir` and `metacopy`, so the upper layer holds whole files and plain
/// whiteouts, nothing that points elsewhere), `index=off`. The tmpfs goes to the supervisor, then
/// the scaffolding leaves the view: the payload sees the merged tree and nothing else, and the
/// host directory is never written.
fn workspace(
    b: &mut Builder<'_>,
    canon: &Path,
    meta: &std::fs::Metadata,
    ids: Ids,
    cap: u64,
    ro: u64,
) {
    let at = |x: &str| c(format!("{WS_DIR}/{x}"));
    b.ops.push(Op::Mkdir {
        path: c(WS_DIR),
        mode: 0o700,
    });
    b.ops.push(Op::Tmpfs {
        path: c(WS_DIR),
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: c(format!(
            "mode=0700,size={cap},nr_inodes={WORKSPACE_MAX_INODES}"
        )),
    });
    // The upper directory is the merged root: it takes the host directory's mode.
    b.ops.push(Op::Mkdir {
        path: at("upper"),
        mode: meta.mode() & 0o777,
    });
    for d in ["work", "lower"] {
        b.ops.push(Op::Mkdir {
            path: at(d),
            mode: 0o700,
        });
    }
    b.ops.push(Op::UserXattr { path: at("work") });
    let s = b.user_source(canon, meta, ids.privileged, ids.privileged);
    b.ops.push(Op::Bind {
        source: s,
        path: at("lower"),
        attrs: ro,
    });
    b.ops.push(Op::Overlay {
        path: rel(SCRATCH_DIR),
        data: c(format!(
            "lowerdir={WS_DIR}/lower,upperdir={WS_DIR}/upper,workdir={WS_DIR}/work,userxattr,index=off,metacopy=off"
        )),
    });
    b.ops.push(Op::SendDir {
        path: c(WS_DIR),
        tag: WORKSPACE_TAG,
    });
    b.ops.push(Op::Detach { path: at("lower") });
    b.ops.push(Op::Detach { path: c(WS_DIR) });
    b.ops.push(Op::Rmdir { path: c(WS_DIR) });
}

/// The seccomp program, assembled once per process for each value of `allow_ptrace` and
/// `notify_connect` (it depends on nothing else).
fn seccomp_program(allow_ptrace: bool, notify_connect: bool) -> Vec<crate::seccomp::SockFilter> {
    static PROGRAMS: [std::sync::OnceLock<Vec<crate::seccomp::SockFilter>>; 4] = [
        std::sync::OnceLock::new(),
        std::sync::OnceLock::new(),
        std::sync::OnceLock::new(),
        std::sync::OnceLock::new(),
    ];
    PROGRAMS[allow_ptrace as usize * 2 + notify_connect as usize]
        .get_or_init(|| crate::seccomp::program_with(allow_ptrace, notify_connect))
        .clone()
}

/// Plans the protected paths under the host scratch `canon` (docs/policy.md, "Protected
/// paths"): the policy's list, and what the repository's own files point at (see [`Git`]). Each
/// component is looked at with `lstat`, never followed. Directories on the way are pinned; an
/// existing file or directory is mounted read-only over itself (a regular file on the way, such as
/// a worktree's `.git` file, is covered the same way, as it stands where the protected path would
/// be); for a path with a missing component, the first missing one is watched. What lies under a
/// read-only path needs nothing more. A symlink or a special file is refused: a mount over it
/// would follow it, and renaming it after the run could not tell the user's from the code's.
fn protect(
    b: &mut Builder<'_>,
    canon: &Path,
    paths: &[String],
    ids: Ids,
    ro: u64,
    rw: u64,
) -> Result<Protection, SetupError> {
    let mut git = Git {
        host: b.host,
        canon,
        wanted: paths.iter().map(|x| (x.clone(), None)).collect(),
        derived: Vec::new(),
        not_followed: Vec::new(),
    };
    git.find(paths)?;
    let mut p = Protection {
        scratch: Some(canon.to_owned()),
        derived: git.derived,
        not_followed: git.not_followed,
        ..Protection::default()
    };
    let mut binds: Vec<(String, bool)> = Vec::new();
    for (path, from) in &git.wanted {
        let comps: Vec<&str> = path.split('/').collect();
        for i in 0..comps.len() {
            let prefix = comps[..=i].join("/");
            let last = i + 1 == comps.len();
            let Some(meta) = b.host.lstat(&canon.join(&prefix)) else {
                if !p.watched.contains(&prefix) {
                    p.watched.push(prefix);
                }
                break;
            };
            let ft = meta.file_type();
            if ft.is_dir() && !last {
                if !binds.iter().any(|(x, _)| *x == prefix) {
                    binds.push((prefix, true));
                }
                continue;
            }
            if ft.is_dir() || ft.is_file() {
                // A path already pinned as a directory on the way is made read-only instead.
                binds.retain(|(x, _)| *x != prefix);
                binds.push((prefix, false));
                break;
            }
            let kind = if ft.is_symlink() {
                "symbolic link"
            } else {
                "special file"
            };
            return Err(match from {
                None => SetupError::ProtectedUnsupported { path: prefix, kind },
                Some(from) => SetupError::HostPath {
                    field: "protect",
                    path: canon.join(&prefix),
                    source: std::io::Error::other(format!(
                        "a {kind} on the way to `{path}`, which {from} names: palisade does not \
                         follow links in what it protects; name the real path there, or unprotect \
                         the repository (--unprotect .git and each .git/… path of the list)"
                    )),
                },
            });
        }
    }
    // Under a read-only path nothing can be created or changed, and under a watched one the
    // whole is moved: such paths need nothing of their own.
    let under = |x: &str, set: &[String]| {
        set.iter().any(|r| {
            x.len() > r.len() && x.starts_with(r.as_str()) && x.as_bytes()[r.len()] == b'/'
        })
    };
    let read_only: Vec<String> = binds
        .iter()
        .filter(|(_, pin)| !pin)
        .map(|(x, _)| x.clone())
        .collect();
    binds.retain(|(x, _)| !under(x, &read_only));
    let watched = p.watched.clone();
    p.watched
        .retain(|x| !under(x, &read_only) && !under(x, &watched));
    // Parents first, so that a read-only mount is never covered by a later pin of its parent.
    binds.sort_by_key(|(x, _)| x.matches('/').count());
    for (path, pin) in binds {
        let host = canon.join(&path);
        let meta = b.host.lstat(&host).ok_or_else(|| SetupError::HostPath {
            field: "protect",
            path: host.clone(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        })?;
        let s = b.user_source(&host, &meta, ids.privileged, ids.privileged);
        b.ops.push(Op::Bind {
            source: s,
            path: rel(&format!("{SCRATCH_DIR}/{path}")),
            attrs: if pin { rw } else { ro },
        });
        if pin {
            p.pinned.push(path);
        } else {
            p.read_only.push(path);
        }
    }
    Ok(p)
}

/// Most protected paths a repository's files may add (submodules, includes, scripts).
const MAX_DERIVED: usize = 1024;

/// What a repository at the root of the scratch directory makes git read or run beyond the
/// listed `.git` paths: a `.git` file's `gitdir:` and a `commondir` moving the repository into
/// another directory of the scratch, `core.hooksPath`, included config files, scripts of the
/// project that configured commands name (`core.fsmonitor = tools/fsmon.sh`), and submodules'
/// `.git` files. Read at the start, when the project is still the user's own, and read
/// defensively all the same: bounded sizes and counts, no link followed, a place outside the
/// scratch directory reported rather than followed. Only when the list protects `.git` or a
/// path under it.
struct Git<'a> {
    host: &'a dyn HostFs,
    canon: &'a Path,
    /// The paths to protect, each with where it was named (`None`: the policy's list).
    wanted: Vec<(String, Option<String>)>,
    derived: Vec<Derived>,
    not_followed: Vec<String>,
}

impl Git<'_> {
    fn find(&mut self, paths: &[String]) -> Result<(), SetupError> {
        use palisade_policy::protect::git::{self, Place};
        let whole = paths.iter().any(|x| x == ".git");
        let parts: Vec<String> = paths
            .iter()
            .filter_map(|x| x.strip_prefix(".git/").map(str::to_owned))
            .collect();
        if !whole && parts.is_empty() {
            return Ok(());
        }
        let hooks = whole || parts.iter().any(|x| x == "hooks");
        let config = whole
            || parts
                .iter()
                .any(|x| x == "config" || x == "config.worktree");
        // Where the repository's files are: `.git`, or where a `.git` file sends git.
        let gitdir = match self.host.lstat(&self.canon.join(".git")) {
            Some(m) if m.is_dir() => Some(".git".to_owned()),
            Some(m) if m.is_file() => {
                let b = self.read(".git", git::MAX_POINTER)?.unwrap_or_default();
                match git::gitfile_target(&b) {
                    Some(t) => self.dir(&t, "", "`.git` (gitdir:)", whole, &parts)?,
                    None => None,
                }
            }
            _ => None,
        };
        let Some(gitdir) = gitdir else {
            return Ok(());
        };
        let commondir = format!("{gitdir}/commondir");
        let common = match self.read(&commondir, git::MAX_POINTER)? {
            Some(b) => match git::commondir_target(&b) {
                Some(t) => self.dir(&t, &gitdir, &format!("`{commondir}`"), whole, &parts)?,
                None => None,
            },
            None => Some(gitdir.clone()),
        };
        let mut queue = vec![format!("{gitdir}/config.worktree")];
        if let Some(c) = &common {
            queue.insert(0, format!("{c}/config"));
        }
        let mut seen: Vec<String> = Vec::new();
        while let Some(file) = queue.pop() {
            if seen.contains(&file) {
                continue;
            }
            if seen.len() == git::MAX_CONFIGS {
                return Err(self.error(
                    &file,
                    format!(
                        "more than {} config files include one another",
                        git::MAX_CONFIGS
                    ),
                ));
            }
            seen.push(file.clone());
            let Some(b) = self.read(&file, git::MAX_CONFIG)? else {
                continue;
            };
            let refs = git::config_refs(&String::from_utf8_lossy(&b));
            let base = file.rsplit_once('/').map_or("", |(d, _)| d);
            for h in refs.hooks_paths {
                let from = format!("core.hooksPath in `{file}`");
                match git::place(self.canon, "", &h) {
                    Place::Inside(x) if hooks => self.add(x, from)?,
                    Place::Inside(_) => {}
                    Place::NotFollowed(why) => self.skip(&h, &from, why),
                }
            }
            for inc in refs.includes {
                let from = format!("include.path in `{file}`");
                match git::place(self.canon, base, &inc) {
                    Place::Inside(x) => {
                        if config {
                            self.add(x.clone(), from)?;
                        }
                        queue.push(x);
                    }
                    Place::NotFollowed(why) => self.skip(&inc, &from, why),
                }
            }
            for cmd in refs.commands {
                // A command elsewhere (`/usr/bin/less`) is the host's own program.
                if let (true, Place::Inside(x)) = (config, git::place(self.canon, "", &cmd)) {
                    self.add(x, format!("a command in `{file}`"))?;
                }
            }
        }
        if let Some(b) = self.read(".gitmodules", git::MAX_CONFIG)? {
            for sub in git::submodule_paths(&String::from_utf8_lossy(&b)) {
                let from = "`.gitmodules` (a submodule's repository)";
                match git::place(self.canon, "", &sub) {
                    Place::Inside(x) => self.add(format!("{x}/.git"), from.to_owned())?,
                    Place::NotFollowed(why) => self.skip(&sub, from, why),
                }
            }
        }
        Ok(())
    }

    /// A git directory `target` named in `base`: protected like `.git` (as a whole, or the
    /// listed parts of it) and returned if it is in the scratch directory.
    fn dir(
        &mut self,
        target: &str,
        base: &str,
        from: &str,
        whole: bool,
        parts: &[String],
    ) -> Result<Option<String>, SetupError> {
        use palisade_policy::protect::git::{place, Place};
        match place(self.canon, base, target) {
            Place::Inside(d) => {
                if d != ".git" {
                    let wanted: Vec<String> = if whole {
                        vec![d.clone()]
                    } else {
                        parts.iter().map(|x| format!("{d}/{x}")).collect()
                    };
                    for w in wanted {
                        self.add(w, from.to_owned())?;
                    }
                }
                Ok(Some(d))
            }
            Place::NotFollowed(why) => {
                self.skip(target, from, why);
                Ok(None)
            }
        }
    }

    fn add(&mut self, path: String, from: String) -> Result<(), SetupError> {
        if palisade_policy::protect::ProtectedPath::new(&path).is_err() {
            self.skip(
                &path,
                &from,
                "not a path palisade can protect (at most 16 deep)",
            );
            return Ok(());
        }
        if self.wanted.iter().any(|(x, _)| *x == path) {
            return Ok(());
        }
        if self.derived.len() == MAX_DERIVED {
            return Err(self.error(
                &path,
                format!("the repository's files name more than {MAX_DERIVED} places to protect"),
            ));
        }
        self.derived.push(Derived {
            path: path.clone(),
            from: from.clone(),
        });
        self.wanted.push((path, Some(from)));
        Ok(())
    }

    fn skip(&mut self, target: &str, from: &str, why: &str) {
        let t = palisade_policy::untrusted::escape(target.as_bytes(), 256);
        let note = format!("`{t}` ({from}): {why}; not protected by palisade");
        if !self.not_followed.contains(&note) {
            self.not_followed.push(note);
        }
    }

    fn read(&self, rel: &str, max: usize) -> Result<Option<Vec<u8>>, SetupError> {
        self.host
            .read_beneath(self.canon, rel, max)
            .map_err(|e| self.error(rel, e.to_string()))
    }

    fn error(&self, rel: &str, why: String) -> SetupError {
        SetupError::HostPath {
            field: "protect",
            path: self.canon.join(rel),
            source: std::io::Error::other(format!(
                "{why}; palisade reads the repository's files to protect what they point at \
                 (docs/policy.md#protected-paths)"
            )),
        }
    }
}

/// The soft `RLIMIT_CPU` for the payload: the CPU-time limit rounded up to whole seconds, plus
/// one. It is the second wall (per process, where the supervisor's watch covers the whole
/// sandbox), and the only one when the cgroup is waived; the second of slack lets the
/// supervisor's precise kill come first. Reaching it is a `SIGXCPU`, which tells the report what
/// happened (a bare SIGKILL would not); the hard limit, one second more, is a SIGKILL for code
/// that catches `SIGXCPU`.
pub fn rlimit_cpu_secs(limit: Duration) -> u64 {
    limit.as_millis().div_ceil(1000) as u64 + 1
}

/// The environment the payload starts with: `PATH`, `HOME`, `LANG` (and `TERM` with a terminal),
/// then the policy's variables, which may override these.
pub fn environment(policy: &Policy) -> Vec<(String, String)> {
    environment_with(policy, &Extras::default())
}

/// [`environment`] for a run with [`Extras`]: the trust variables before the policy's (which may
/// point them elsewhere), the extra variables last.
pub fn environment_with(policy: &Policy, extras: &Extras) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), SCRATCH_DIR.into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    if policy.tty {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    if policy.network.enabled() {
        use palisade_policy::net::{HTTP_PROXY_PORT, SOCKS_PORT};
        let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
        let socks = format!("socks5h://127.0.0.1:{SOCKS_PORT}");
        let no = "localhost,127.0.0.1,::1".to_string();
        for (n, v) in [
            ("HTTP_PROXY", &http),
            ("HTTPS_PROXY", &http),
            ("ALL_PROXY", &socks),
            ("NO_PROXY", &no),
        ] {
            env.push((n.into(), v.clone()));
            env.push((n.to_ascii_lowercase(), v.clone()));
        }
    }
    if extras.trust.is_some() {
        for (n, v) in TRUST_VARIABLES {
            env.push((n.to_string(), v.to_string()));
        }
    }
    let set = policy
        .env
        .iter()
        .map(|v| (v.name.as_str(), v.value.as_str()))
        .chain(extras.env.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    for (n, v) in set {
        match env.iter_mut().find(|(x, _)| x == n) {
            Some(slot) => slot.1 = v.to_owned(),
            None => env.push((n.to_owned(), v.to_owned())),
        }
    }
    env
}

/// The program of `policy`: its candidate paths in the sandbox's `PATH`, its arguments and its
/// environment, with what the supervisor adds for this run.
pub fn exec_plan(policy: &Policy, extras: &Extras) -> Result<Exec, SetupError> {
    let env = environment_with(policy, extras);
    let prog = &policy.command[0];
    let candidates: Vec<CString> = if prog.contains('/') {
        vec![c(prog)]
    } else {
        let path = env
            .iter()
            .find(|(n, _)| n == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or(DEFAULT_PATH);
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| c(format!("{}/{prog}", d.trim_end_matches('/'))))
            .collect()
    };
    if candidates.is_empty() {
        return Err(SetupError::NoSearchPath {
            program: prog.clone(),
        });
    }
    let argv: Vec<CString> = policy.command.iter().map(c).collect();
    let envp: Vec<CString> = env.iter().map(|(n, v)| c(format!("{n}={v}"))).collect();
    let mut exec = Exec::new(candidates, argv, envp);
    exec.files = in_files(&extras.files)?;
    Ok(exec)
}

/// The files of a run as its init writes them, each path checked: relative, at most 4096 bytes,
/// components of at most 255 bytes that are neither empty, `.` nor `..`, no NUL; each path once,
/// and none the directory of another; permission bits only.
pub fn in_files(files: &[FileIn]) -> Result<Vec<InFile>, SetupError> {
    let bad = |field: &'static str, value: String, expected: &'static str| {
        SetupError::Policy(palisade_policy::PolicyError::Invalid {
            field,
            value,
            expected,
        })
    };
    const EXPECTED: &str = "a relative path under the working directory (`name` or `dir/name`; no leading `/`, no empty, `.` or `..` components, no NUL; at most 4096 bytes, 255 per component)";
    if files.len() > MAX_FILES_IN {
        return Err(bad(
            "files",
            format!("{} files", files.len()),
            "at most 4096 files",
        ));
    }
    let size: usize = files.iter().map(|f| in_file_size(&f.path)).sum();
    if size > MAX_FILES_IN_BYTES {
        return Err(bad(
            "files",
            format!("{} files whose paths and records take {size} bytes", files.len()),
            "paths and records of at most 65536 bytes in all (each file: its path, 20 bytes, and 4 per directory on its way)",
        ));
    }
    let paths: std::collections::BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    if paths.len() != files.len() {
        let mut seen = std::collections::BTreeSet::new();
        let twice = files.iter().find(|f| !seen.insert(f.path.as_str()));
        return Err(bad(
            "files",
            twice.map_or(String::new(), |f| f.path.clone()),
            "each path once",
        ));
    }
    files
        .iter()
        .map(|f| {
            let p = f.path.as_str();
            let comps: Vec<&str> = p.split('/').collect();
            let ok = !p.is_empty()
                && p.len() <= 4096
                && !p.contains('\0')
                && comps
                    .iter()
                    .all(|c| !c.is_empty() && *c != "." && *c != ".." && c.len() <= 255);
            if !ok {
                return Err(bad("files", p.to_owned(), EXPECTED));
            }
            if f.mode & !0o777 != 0 {
                return Err(bad(
                    "files.mode",
                    format!("{:o} ({p})", f.mode),
                    "permission bits only, 0 to 0777",
                ));
            }
            let (name, dirs) = comps.split_last().expect("split gives at least one");
            // A file where another file's directory would be: refused here rather than fail the
            // run in its init.
            for i in 1..comps.len() {
                let dir = comps[..i].join("/");
                if paths.contains(dir.as_str()) {
                    return Err(bad(
                        "files",
                        dir,
                        "a path that is not also a directory of another file",
                    ));
                }
            }
            Ok(InFile {
                dirs: dirs.iter().map(c).collect(),
                name: c(name),
                mode: f.mode,
                len: f.data.len() as u64,
            })
        })
        .collect()
}

/// The bytes of a run's files, one after the other, in a sealed memfd for its init; `None`
/// without files.
pub fn files_fd(files: &[FileIn]) -> Result<Option<std::os::fd::OwnedFd>, SetupError> {
    if files.is_empty() {
        return Ok(None);
    }
    let total: usize = files.iter().map(|f| f.data.len()).sum();
    let mut all = Vec::with_capacity(total);
    files.iter().for_each(|f| all.extend_from_slice(&f.data));
    crate::sys::sealed_memfd(c"palisade-files", &all)
        .map(Some)
        .map_err(|e| SetupError::Supervisor {
            op: "hold the run's files for its init (memfd)",
            source: std::io::Error::from_raw_os_error(e),
        })
}

/// A human description of op `i`, for error messages.
pub fn describe(plan: &Plan, i: usize) -> String {
    describe_op(&plan.ops, &plan.sources, i)
}

/// [`describe`] for a list of operations and the sources they bind (a plan's, or a run's part).
pub fn describe_op(ops: &[Op], sources: &[Source], i: usize) -> String {
    let show = |p: &CString| format!("/{}", p.to_string_lossy());
    match ops.get(i) {
        Some(Op::Mkdir { path, .. }) => format!("create directory {}", show(path)),
        Some(Op::Touch { path }) => format!("create mount point {}", show(path)),
        Some(Op::Symlink { path, .. }) => format!("create symlink {}", show(path)),
        Some(Op::Write { path, .. }) => format!("write {}", show(path)),
        Some(Op::Tmpfs { path, .. }) => format!("mount a tmpfs on {}", show(path)),
        Some(Op::Proc { .. }) => "mount a fresh /proc (a host /proc with masked or over-mounted entries, as in some containers, prevents this)".into(),
        Some(Op::Devpts { .. }) => "mount a private devpts on /dev/pts".into(),
        Some(Op::Bind { source, path, .. }) => format!(
            "bind host {} on {}",
            sources.get(*source).map_or(String::new(), |s| s.path.to_string_lossy().into_owned()),
            show(path)
        ),
        Some(Op::ReadOnly { path, .. }) => format!("make {} read-only", show(path)),
        Some(Op::BindFile { from, path }) => {
            format!("bind the generated {} over {}", show(from), show(path))
        }
        Some(Op::UserNsLimits) => "set the sandbox user namespace's ceilings (/proc/sys/user/*)".into(),
        Some(Op::Overlay { .. }) => "mount the workspace's overlay on /workspace (overlayfs in a user namespace needs Linux 5.11 or later, and a host directory on a file system overlayfs takes as a lower layer: not another overlay's upper layer, not NFS without its options, not FUSE before 5.11)".into(),
        Some(Op::UserXattr { .. }) => "check that the workspace's tmpfs keeps user.* extended attributes, which overlayfs needs in a user namespace (tmpfs has them from Linux 6.6 on)".into(),
        Some(Op::SendDir { .. }) => "hand the workspace's upper layer to the supervisor".into(),
        Some(Op::Detach { path }) => format!("detach the scaffolding mount {}", show(path)),
        Some(Op::Rmdir { path }) => format!("remove the scaffolding directory {}", show(path)),
        None => format!("step {i}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::landlock::{self, Rule};
    use palisade_policy::net::NetRule;
    use palisade_policy::Bind;

    /// The real host's files, with a Landlock ABI of the test's choosing.
    struct RealWithAbi(Result<u32, i32>);

    impl HostFs for RealWithAbi {
        fn lstat(&self, p: &Path) -> Option<std::fs::Metadata> {
            RealHost.lstat(p)
        }
        fn readlink(&self, p: &Path) -> Option<PathBuf> {
            RealHost.readlink(p)
        }
        fn landlock_abi(&self) -> Result<u32, i32> {
            self.0
        }
    }

    /// A described host: `/usr` and `/etc/ssl` directories, `/etc/ld.so.cache`, merged-`/usr`
    /// links for `/bin` and `/lib`, nothing else (device nodes are the real ones).
    struct FakeHost {
        root: PathBuf,
        abi: Result<u32, i32>,
    }

    impl FakeHost {
        fn new(tag: &str, abi: Result<u32, i32>) -> FakeHost {
            let root = std::env::temp_dir().join(format!(
                "palisade-plan-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&root);
            for d in ["usr/bin", "usr/lib", "etc/ssl", "data", "out", "exposed"] {
                std::fs::create_dir_all(root.join(d)).unwrap();
            }
            std::fs::write(root.join("etc/ld.so.cache"), b"").unwrap();
            std::fs::write(root.join("tool"), b"").unwrap();
            std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
            std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
            FakeHost { root, abi }
        }
        fn here(&self, p: &Path) -> PathBuf {
            if p.starts_with("/dev") {
                p.to_owned()
            } else {
                self.root.join(p.strip_prefix("/").unwrap())
            }
        }
        /// A bind from this host's `name` to `inside`.
        fn bind(&self, name: &str, inside: &str, writable: bool) -> Bind {
            let spec = format!("{}:{inside}", self.root.join(name).display());
            Bind::parse(&spec, writable).unwrap()
        }
    }

    impl HostFs for FakeHost {
        fn lstat(&self, p: &Path) -> Option<std::fs::Metadata> {
            std::fs::symlink_metadata(self.here(p)).ok()
        }
        fn readlink(&self, p: &Path) -> Option<PathBuf> {
            std::fs::read_link(self.here(p)).ok()
        }
        fn landlock_abi(&self) -> Result<u32, i32> {
            self.abi
        }
    }

    impl Drop for FakeHost {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn rule(path: &str, access: u64) -> Rule {
        Rule {
            path: CString::new(path).unwrap(),
            access,
            optional: false,
        }
    }

    /// A policy with a read-only directory, a read-only file, a writable directory and the
    /// test-only bind without a rule.
    fn policy_with_binds(h: &FakeHost) -> Policy {
        let mut p = Policy::new(["true"]).unwrap();
        p.binds = vec![
            h.bind("data", "/data", false),
            h.bind("tool", "/tool", false),
            h.bind("out", "/out", true),
        ];
        p.debug_unlandlocked_bind = Some(h.bind("exposed", "/exposed", true));
        p.network
            .allow
            .push(NetRule::parse("network.allow", "example.org:8443").unwrap());
        p.network.local_ports = vec![8000];
        p
    }

    /// Protected paths under a host scratch: existing ones read-only, directories on the way
    /// pinned (parents first), the first missing component of missing ones watched, a symlink
    /// refused.
    #[test]
    fn protected_paths_are_covered_pinned_or_watched() {
        let dir =
            std::env::temp_dir().join(format!("palisade-plan-protect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".git/hooks")).unwrap();
        std::fs::write(dir.join(".git/config"), b"").unwrap();
        std::fs::write(dir.join(".claude"), b"").unwrap();
        let mut p = Policy::new(["true"]).unwrap();
        p.scratch = Scratch::Host { path: dir.clone() };
        p.protected = [
            ".git/hooks",
            ".git/config",
            ".envrc",
            ".config/fish",
            ".claude",
        ]
        .map(String::from)
        .to_vec();
        let host = RealWithAbi(Ok(7));
        let plan = build(&p, ids(), &host).unwrap();
        let canon = std::fs::canonicalize(&dir).unwrap();
        assert_eq!(
            plan.protection,
            Protection {
                scratch: Some(canon.clone()),
                read_only: [".claude", ".git/hooks", ".git/config"]
                    .map(String::from)
                    .to_vec(),
                pinned: vec![".git".to_owned()],
                // `.config` is missing: what the code makes there goes as a whole.
                watched: [".envrc", ".config"].map(String::from).to_vec(),
                derived: Vec::new(),
                not_followed: Vec::new(),
            }
        );
        // The binds after the scratch's own, each of the host path itself, pins writable.
        let binds: Vec<(String, String, bool)> = plan
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::Bind {
                    source,
                    path,
                    attrs,
                } => Some((
                    plan.sources[*source].path.to_str().unwrap().to_owned(),
                    path.to_str().unwrap().to_owned(),
                    attrs & crate::sys::MOUNT_ATTR_RDONLY != 0,
                )),
                _ => None,
            })
            .skip_while(|(_, path, _)| path != "workspace")
            .collect();
        let c = canon.display();
        assert_eq!(
            binds,
            vec![
                (format!("{c}"), "workspace".to_owned(), false),
                (format!("{c}/.git"), "workspace/.git".to_owned(), false),
                (format!("{c}/.claude"), "workspace/.claude".to_owned(), true),
                (
                    format!("{c}/.git/hooks"),
                    "workspace/.git/hooks".to_owned(),
                    true
                ),
                (
                    format!("{c}/.git/config"),
                    "workspace/.git/config".to_owned(),
                    true
                ),
            ]
        );
        // A symlink cannot be covered: a mount over it would follow it.
        std::os::unix::fs::symlink("/etc/passwd", dir.join(".envrc")).unwrap();
        let e = build(&p, ids(), &host).unwrap_err().to_string();
        assert!(
            e.contains(".envrc")
                && e.contains("symbolic link")
                && e.contains("add `.envrc` to filesystem.unprotect"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scratch directory with `files` (a trailing `/` makes a directory; `->` a symlink),
    /// planned with the protected `list`.
    fn plan_protection(tag: &str, files: &[&str], list: &[&str]) -> Result<Protection, String> {
        let dir =
            std::env::temp_dir().join(format!("palisade-plan-git-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in files {
            if let Some((link, target)) = f.split_once(" -> ") {
                std::os::unix::fs::symlink(target, dir.join(link)).unwrap();
            } else if let Some((path, text)) = f.split_once(": ") {
                std::fs::create_dir_all(dir.join(path).parent().unwrap()).unwrap();
                std::fs::write(dir.join(path), text).unwrap();
            } else {
                std::fs::create_dir_all(dir.join(f)).unwrap();
            }
        }
        let mut p = Policy::new(["true"]).unwrap();
        p.scratch = Scratch::Host { path: dir.clone() };
        p.protected = list.iter().map(|x| x.to_string()).collect();
        let r = build(&p, ids(), &RealWithAbi(Ok(7)))
            .map(|plan| plan.protection)
            .map_err(|e| e.to_string());
        std::fs::remove_dir_all(&dir).unwrap();
        r.map(|mut p| {
            p.scratch = None;
            p
        })
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn derived(v: &[(&str, &str)]) -> Vec<Derived> {
        v.iter()
            .map(|(path, from)| Derived {
                path: path.to_string(),
                from: from.to_string(),
            })
            .collect()
    }

    /// The repository's own files add what they point at: `core.hooksPath`, includes (and what
    /// they name in turn), scripts named by commands, submodules' `.git`; a place in a home
    /// directory is reported, not followed. What lies under the read-only `.git` needs nothing.
    #[test]
    fn a_repositorys_indirections_are_protected_too() {
        let config = "[core]\n\thooksPath = .githooks\n\tfsmonitor = \"sh tools/fsmon.sh\"\n\
                      [include]\n\tpath = ../conf/git.inc\n\tpath = ~/.gitconfig-work\n\
                      [alias]\n\tup = !/usr/bin/git push\n";
        let files = [
            &format!(".git/config: {config}")[..],
            ".git/hooks/",
            "conf/git.inc: [core]\n\tsshCommand = ./bin/ssh-wrap\n",
            "tools/fsmon.sh: true",
            ".gitmodules: [submodule \"a\"]\n\tpath = libs/a\n",
            "libs/a/.git: gitdir: ../../.git/modules/a",
        ];
        let got = plan_protection(
            "ind",
            &files,
            &[".git", ".git/config", ".git/hooks", ".envrc"],
        );
        assert_eq!(
            got,
            Ok(Protection {
                scratch: None,
                read_only: strings(&[".git", "conf/git.inc", "tools/fsmon.sh", "libs/a/.git"]),
                pinned: strings(&["conf", "tools", "libs", "libs/a"]),
                watched: strings(&[".envrc", ".githooks", "bin"]),
                derived: derived(&[
                    (".githooks", "core.hooksPath in `.git/config`"),
                    ("conf/git.inc", "include.path in `.git/config`"),
                    ("tools/fsmon.sh", "a command in `.git/config`"),
                    ("bin/ssh-wrap", "a command in `conf/git.inc`"),
                    ("libs/a/.git", "`.gitmodules` (a submodule's repository)"),
                ]),
                not_followed: strings(&[
                    "`~/.gitconfig-work` (include.path in `.git/config`): in a home directory or git's installation; not protected by palisade",
                ]),
            })
        );
    }

    /// A `.git` file and a `commondir` that move the repository elsewhere in the scratch: the
    /// place they name is protected like `.git` (as a whole, or the listed parts of it when `.git`
    /// itself is unprotected); a place outside the scratch is reported.
    #[test]
    fn gitdir_and_commondir_are_followed_inside_the_scratch_only() {
        let files = [
            ".git: gitdir: .repo/wt\n",
            ".repo/wt/commondir: ../main\n",
            ".repo/main/config: [core]\n\thooksPath = hooks2\n",
            ".repo/main/hooks/",
        ];
        let got = plan_protection("wt", &files, &[".git", ".git/config", ".git/hooks"]);
        assert_eq!(
            got,
            Ok(Protection {
                scratch: None,
                read_only: strings(&[".git", ".repo/wt", ".repo/main"]),
                pinned: strings(&[".repo"]),
                watched: strings(&["hooks2"]),
                derived: derived(&[
                    (".repo/wt", "`.git` (gitdir:)"),
                    (".repo/main", "`.repo/wt/commondir`"),
                    ("hooks2", "core.hooksPath in `.repo/main/config`"),
                ]),
                not_followed: Vec::new(),
            })
        );
        // `.git` unprotected: its listed parts, wherever the repository is.
        let got = plan_protection("wt-parts", &files, &[".git/config", ".git/hooks"]);
        let p = got.unwrap();
        assert_eq!(
            p.read_only,
            strings(&[".git", ".repo/main/config", ".repo/main/hooks"])
        );
        assert_eq!(
            p.watched,
            strings(&[".repo/wt/config", ".repo/wt/hooks", "hooks2"])
        );
        let got = plan_protection(
            "out",
            &[".git: gitdir: /srv/repo/.git/worktrees/w"],
            &[".git"],
        );
        assert_eq!(
            got.unwrap().not_followed,
            strings(&["`/srv/repo/.git/worktrees/w` (`.git` (gitdir:)): outside the scratch directory; not protected by palisade"])
        );
    }

    /// Read defensively: a link on the way to a place a repository's file names is refused (it
    /// would be followed by a mount), and so is a config too long to read whole.
    #[test]
    fn a_repositorys_files_are_read_without_following_links() {
        let files = [
            ".git/config: [core]\n\thooksPath = link/hooks\n",
            "link -> /tmp",
        ];
        let e = plan_protection("link", &files, &[".git"]).unwrap_err();
        assert!(
            e.contains("link`")
                && e.contains("symbolic link on the way to `link/hooks`")
                && e.contains("core.hooksPath in `.git/config`")
                && e.contains("--unprotect .git and each .git/… path"),
            "{e}"
        );
        let files = [".git/", ".git/config -> /etc/passwd"];
        let e = plan_protection("cfglink", &files, &[".git"]).unwrap_err();
        assert!(
            e.contains(".git/config") && e.contains("symbolic link, not followed"),
            "{e}"
        );
        let big = format!(".git/config: [core]\n#{}\n", "x".repeat(1 << 20));
        let e = plan_protection("big", &[&big], &[".git"]).unwrap_err();
        assert!(e.contains("longer than 1048576 bytes"), "{e}");
    }

    #[test]
    fn landlock_rules_follow_the_view() {
        use landlock::*;
        let h = FakeHost::new("ll7", Ok(7));
        let plan = build(&policy_with_binds(&h), ids(), &h).unwrap();
        let dev_file = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV;
        let expected = Ruleset {
            abi: 7,
            handled_fs: ALL_FS,
            handled_net: BIND_TCP | CONNECT_TCP,
            scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
            // The SOCKS and HTTP proxies, the payload's own server, the transparent listener.
            ports: vec![
                (1080, CONNECT_TCP),
                (3128, CONNECT_TCP),
                (8000, BIND_TCP | CONNECT_TCP),
                (8443, CONNECT_TCP),
            ],
            rules: vec![
                rule("/", READ_DIR),
                rule("/usr", EXECUTE | READ_FILE | READ_DIR),
                rule("/etc", READ_FILE | READ_DIR),
                rule("/proc", READ_FILE | READ_DIR),
                rule("/dev", READ_FILE | READ_DIR),
                rule("/dev/null", dev_file),
                rule("/dev/zero", dev_file),
                rule("/dev/full", dev_file),
                rule("/dev/random", dev_file),
                rule("/dev/urandom", dev_file),
                rule("/dev/tty", dev_file),
                rule("/dev/pts", dev_file | READ_DIR),
                rule("/dev/shm", FULL),
                rule("/tmp", FULL),
                rule("/workspace", FULL),
                rule("/data", EXECUTE | READ_FILE | READ_DIR),
                rule("/tool", EXECUTE | READ_FILE),
                rule("/out", FULL),
            ],
            debug_unlandlocked: Some("/exposed".into()),
        };
        assert_eq!(plan.landlock, LandlockPlan::Enforce(expected));
        // The test-only bind is in the mount view all the same.
        assert!(plan
            .ops
            .iter()
            .any(|o| matches!(o, Op::Bind { path, .. } if path.as_bytes() == b"exposed")));
    }

    #[test]
    fn landlock_rules_keep_what_an_old_abi_handles() {
        use landlock::*;
        let h = FakeHost::new("ll1", Ok(1));
        let mut p = policy_with_binds(&h);
        p.debug_unlandlocked_bind = None;
        let plan = build(&p, ids(), &h).unwrap();
        let base = (1 << 13) - 1;
        let rules: Vec<(String, u64)> = plan
            .landlock
            .ruleset()
            .unwrap()
            .rules
            .iter()
            .map(|r| (r.path.to_str().unwrap().to_owned(), r.access))
            .collect();
        let rw = READ_FILE | WRITE_FILE;
        let want: Vec<(String, u64)> = [
            ("/", READ_DIR),
            ("/usr", EXECUTE | READ_FILE | READ_DIR),
            ("/etc", READ_FILE | READ_DIR),
            ("/proc", READ_FILE | READ_DIR),
            ("/dev", READ_FILE | READ_DIR),
            ("/dev/null", rw),
            ("/dev/zero", rw),
            ("/dev/full", rw),
            ("/dev/random", rw),
            ("/dev/urandom", rw),
            ("/dev/tty", rw),
            ("/dev/pts", rw | READ_DIR),
            ("/dev/shm", base & FULL),
            ("/tmp", base & FULL),
            ("/workspace", base & FULL),
            ("/data", EXECUTE | READ_FILE | READ_DIR),
            ("/tool", EXECUTE | READ_FILE),
            ("/out", base & FULL),
        ]
        .into_iter()
        .map(|(p, a)| (p.to_owned(), a))
        .collect();
        assert_eq!(rules, want);
        let r = plan.landlock.ruleset().unwrap();
        assert_eq!((r.abi, r.handled_fs, r.scoped), (1, base, 0));
        assert_eq!(r.debug_unlandlocked, None);
    }

    #[test]
    fn a_kernel_without_landlock_is_refused_unless_waived() {
        let h = FakeHost::new("nolandlock", Err(libc::EOPNOTSUPP));
        let p = Policy::new(["true"]).unwrap();
        let e = build(&p, ids(), &h).unwrap_err().to_string();
        assert!(
            e.contains("Landlock")
                && e.contains("lsm=")
                && e.contains("add `landlock` to layers.allow_degraded"),
            "{e}"
        );
        let h = FakeHost::new("nolandlock-sys", Err(libc::ENOSYS));
        let e = build(&p, ids(), &h).unwrap_err().to_string();
        assert!(e.contains("CONFIG_SECURITY_LANDLOCK"), "{e}");
        // Waived: the view is the same, without a ruleset, and the reason is kept for the report.
        let mut p = p;
        p.allow_degraded.push(palisade_policy::Degradable::Landlock);
        let plan = build(&p, ids(), &h).unwrap();
        let LandlockPlan::Waived(why) = &plan.landlock else {
            panic!("not waived: {:?}", plan.landlock);
        };
        assert!(why.contains("CONFIG_SECURITY_LANDLOCK"), "{why}");
        assert!(plan.ops.iter().any(|o| matches!(o, Op::Proc { .. })));
    }

    fn ids() -> Ids {
        Ids {
            uid: 1000,
            gid: 1000,
            host_uid: 1000,
            host_gid: 1000,
            privileged: false,
        }
    }

    #[test]
    fn environment_is_minimal_and_overridable() {
        let mut p = Policy::new(["true"]).unwrap();
        p.env
            .push(palisade_policy::EnvVar::parse("LANG=de_DE.UTF-8").unwrap());
        p.env
            .push(palisade_policy::EnvVar::parse("MODE=x").unwrap());
        let env = environment(&p);
        assert_eq!(
            env,
            vec![
                ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
                ("HOME".to_owned(), SCRATCH_DIR.to_owned()),
                ("LANG".to_owned(), "de_DE.UTF-8".to_owned()),
                ("MODE".to_owned(), "x".to_owned()),
            ]
        );
    }

    #[test]
    fn program_is_searched_in_the_sandbox_path() {
        let mut p = Policy::new(["python3", "-c", "pass"]).unwrap();
        p.env
            .push(palisade_policy::EnvVar::parse("PATH=/opt/bin:relative:/usr/bin/").unwrap());
        let e = exec_plan(&p, &Extras::default()).unwrap();
        let cands: Vec<_> = e.candidates.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(cands, ["/opt/bin/python3", "/usr/bin/python3"]);
        assert_eq!(e.argv.as_ptrs().len(), 4);
        assert!(e.argv.as_ptrs()[3].is_null());
        let p = Policy::new(["./run.sh"]).unwrap();
        assert_eq!(
            exec_plan(&p, &Extras::default()).unwrap().candidates,
            vec![c("./run.sh")]
        );
    }

    /// A template builds the system part of the view once; every run mounts what it may write
    /// or what shows its processes, and creates nothing in the shared part.
    #[test]
    fn a_templates_view_splits_into_the_prepared_part_and_the_per_run_part() {
        let h = FakeHost::new("split", Ok(6));
        let mut p = Policy::new(["true"]).unwrap();
        p.binds.push(h.bind("data", "/data", false));
        p.binds.push(h.bind("out", "/tmp/out", true));
        let plan = build(&p, ids(), &h).unwrap();
        let show = |o: &Op| match o {
            Op::Mkdir { path, .. } => format!("mkdir {}", path.to_string_lossy()),
            Op::Touch { path } => format!("touch {}", path.to_string_lossy()),
            Op::Symlink { path, .. } => format!("symlink {}", path.to_string_lossy()),
            Op::Write { path, .. } => format!("write {}", path.to_string_lossy()),
            Op::Tmpfs { path, .. } => format!("tmpfs {}", path.to_string_lossy()),
            Op::Proc { path } => format!("proc {}", path.to_string_lossy()),
            Op::Devpts { path } => format!("devpts {}", path.to_string_lossy()),
            Op::Bind { path, .. } => format!("bind {}", path.to_string_lossy()),
            Op::ReadOnly { path, .. } => format!("read-only {}", path.to_string_lossy()),
            Op::UserNsLimits => "user-ns-limits".into(),
            other => panic!("a workspace's operation in a template's plan: {other:?}"),
        };
        let per_run: Vec<String> = plan
            .ops
            .iter()
            .filter(|o| is_per_run(o))
            .map(show)
            .collect();
        assert_eq!(
            per_run,
            [
                "proc proc",
                "user-ns-limits",
                "read-only proc",
                "devpts dev/pts",
                "tmpfs dev/shm",
                "tmpfs tmp",
                "tmpfs workspace",
                "mkdir tmp/out",
                "bind tmp/out",
            ]
        );
        // Mount points are the template's; /data is a bind of the prepared view.
        let prepared: Vec<String> = plan
            .ops
            .iter()
            .filter(|o| !is_per_run(o))
            .map(show)
            .collect();
        for x in [
            "mkdir proc",
            "mkdir dev/shm",
            "mkdir tmp",
            "mkdir workspace",
            "bind data",
            "tmpfs dev",
        ] {
            assert!(prepared.iter().any(|p| p == x), "{x} not in {prepared:?}");
        }
        // The per-run part carries its own sources: the bind under /tmp, re-indexed.
        let part = run_part(&plan);
        assert_eq!(part.ops.len(), per_run.len());
        assert_eq!(part.sources.len(), 1);
        assert!(part.sources[0].path.to_bytes().ends_with(b"/out"));
        assert!(matches!(part.ops[8], Op::Bind { source: 0, .. }));
        // Landlock rules on per-run mounts are opened per run.
        assert!(is_per_run_path(b"/tmp") && is_per_run_path(b"/workspace/x"));
        assert!(!is_per_run_path(b"/dev") && !is_per_run_path(b"/data") && !is_per_run_path(b"/"));
        assert!(!is_per_run_path(b"/tmpx") && !is_per_run_path(b"/procfs"));
    }

    #[test]
    fn view_has_no_whole_etc_and_binds_after_mount_points() {
        let mut p = Policy::new(["true"]).unwrap();
        p.binds
            .push(Bind::parse("/usr/share:/data/deep/share", false).unwrap());
        let plan = build(&p, ids(), &RealWithAbi(Ok(7))).unwrap();
        // No bind of /etc itself, only entries under it.
        assert!(!plan.sources.iter().any(|s| s.path.as_bytes() == b"/etc"));
        assert!(!plan
            .sources
            .iter()
            .any(|s| s.path.as_bytes().starts_with(b"/home")));
        // Every bind's mount point is created before the bind.
        for (i, op) in plan.ops.iter().enumerate() {
            if let Op::Bind { path, .. } = op {
                let made = plan.ops[..i].iter().any(|o| match o {
                    Op::Mkdir { path: p, .. } | Op::Touch { path: p } => p == path,
                    _ => false,
                });
                assert!(made, "no mount point before binding {path:?}");
            }
        }
        let mkdirs: Vec<_> = plan
            .ops
            .iter()
            .filter_map(|o| match o {
                Op::Mkdir { path, .. } if path.to_bytes().starts_with(b"data") => {
                    Some(path.to_str().unwrap())
                }
                _ => None,
            })
            .collect();
        assert_eq!(mkdirs, ["data", "data/deep", "data/deep/share"]);
    }

    #[test]
    fn missing_bind_source_names_the_field() {
        let mut p = Policy::new(["true"]).unwrap();
        p.binds
            .push(Bind::parse("/nonexistent/palisade-test", true).unwrap());
        let e = build(&p, ids(), &RealWithAbi(Ok(7)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("filesystem.rw `/nonexistent/palisade-test`"),
            "{e}"
        );
    }
}
