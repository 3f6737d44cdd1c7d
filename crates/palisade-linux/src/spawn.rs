//! The supervisor side: prepare the plan, start the sandbox's init in new namespaces (a fork-like
//! `clone3`, or palisade's init program exec'd: see `engine`), write its id maps, relay its
//! output, and collect how it ended. A template's runs (`zygote`) share the parts after the init
//! exists (`Running::complete` and the loop).
//!
//! A [`Running`] sandbox owns every resource of one run (pidfd, pipes, pty master); dropping it
//! kills the sandbox. Nothing here is global: one process can hold many of them at once.

use crate::child::{self, ChildFds, Msg, Step};
use crate::engine::Engine;
use crate::error::SetupError;
use crate::landlock::LandlockState;
use crate::output::{OutputQueue, Stream};
use crate::plan::{self, Ids};
use crate::sys;
use libc::c_int;
use palisade_policy::{Policy, Scratch};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First of the host uids (and gids) that root-launched sandboxes map to: never host root, and
/// not ids a normal system hands out (outside the ranges of `login.defs`, `/etc/subuid` and
/// systemd's container ranges, below 2^31 so signed-int tools cope). Each run claims one of the
/// [`ROOT_MAPPED_IDS`] ids from here on for itself (see [`IdLease`]).
pub const ROOT_MAPPED_ID: u32 = 2_147_000_000;

/// How many host ids root-launched runs are spread over: runs at the same time get different
/// ones, so they share no per-user kernel quota (pipe buffers, epoll watches, inotify, signals).
pub const ROOT_MAPPED_IDS: u32 = 65_536;

/// The lock file through which concurrent supervisors on one host claim ids: one byte per id,
/// held with an open-file-description lock for the length of the run (the kernel drops it when the
/// holder dies, so a crashed supervisor leaks nothing).
const ID_LOCK_FILE: &str = "/run/palisade/ids.lock";

/// Namespaces the sandbox's init is cloned into. The cgroup namespace comes later: init unshares
/// it once it has been moved into the run's cgroup, so that this cgroup is the root it sees.
pub const NAMESPACES: u64 = sys::CLONE_NEWUSER
    | sys::CLONE_NEWNS
    | sys::CLONE_NEWPID
    | sys::CLONE_NEWNET
    | sys::CLONE_NEWIPC
    | sys::CLONE_NEWUTS;

/// What the payload's standard input is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Stdin {
    /// `/dev/null`: the default, so that a library caller never hands its own standard input to
    /// untrusted code by accident.
    #[default]
    Null,
    /// These bytes, then end of file. The supervisor writes them as the payload reads, never
    /// blocking on a payload that does not.
    Bytes(Vec<u8>),
    /// A pipe whose write end the caller takes with [`Running::take_stdin`].
    Pipe,
    /// A unix stream socket: the payload's fd 0, whose other end the caller takes with
    /// [`Running::take_stdin`], both ways (a control channel to an agent of the caller's inside,
    /// which can pass descriptors back over it).
    Socket,
    /// The supervisor's own standard input (a front end's, e.g. the CLI's). A terminal is never
    /// handed over as it is: its input is relayed through a pipe, so the payload can neither write
    /// to the caller's terminal nor change its modes (give it a pty of its own for that).
    Inherit,
}

/// A ceiling that made the supervisor kill the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// The wall-clock timeout passed.
    Timeout,
    /// stdout plus stderr reached the output cap.
    Output,
    /// The sandbox's processes together used up their CPU time.
    CpuTime,
}

/// How the supervisor watches the sandbox's CPU time, for the CPU-time limit.
pub struct CpuWatch<'a> {
    /// CPU time of every process of the sandbox so far (the run cgroup's accounting); `None` once
    /// it cannot be read.
    pub used: &'a dyn Fn() -> Option<Duration>,
    /// CPU the supervisor's other threads spent for this sandbox so far (the egress proxy's),
    /// charged to the same budget.
    pub supervisor: Option<&'a dyn Fn() -> Duration>,
    /// The most CPUs the sandbox can keep busy at once (the host's, or its quota): the fastest the
    /// budget can drain, which sets when to look next.
    pub cpus: f64,
}

/// Shortest wait between two looks at the CPU time: bounds the overshoot past the limit to about
/// this much per CPU, and the cost of watching to one small file read per interval at worst.
const CPU_CHECK_MIN: Duration = Duration::from_millis(5);

/// When to look at the CPU time next: not before the rest of the budget could be spent at full
/// speed on every CPU, so an idle or single-threaded payload costs almost no wake-ups.
fn next_cpu_check(limit: Duration, used: Duration, cpus: f64) -> Duration {
    limit
        .saturating_sub(used)
        .div_f64(cpus.max(0.01))
        .max(CPU_CHECK_MIN)
}

/// How the payload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
    /// Init vanished without reporting (killed from outside).
    Vanished,
}

/// What the supervisor observed of one run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub termination: Termination,
    /// Set when the supervisor killed the sandbox for a limit; `termination` is then what the
    /// kill did (usually `Vanished`, as init dies first).
    pub limit_hit: Option<LimitHit>,
    /// Output beyond the cap was discarded.
    pub output_truncated: bool,
    pub wall: Duration,
    pub user_cpu: Duration,
    pub system_cpu: Duration,
    /// Peak resident set size of the largest process, in bytes.
    pub max_rss: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The CPU-time watch stopped because the accounting could not be read: for the rest of the
    /// run only the per-process RLIMIT_CPU held.
    pub cpu_watch_lost: bool,
    /// System calls the seccomp filter refused, in the order first seen.
    pub denied: Vec<DeniedCall>,
    /// The caller killed the run ([`Killer::kill`]) before it ended by itself.
    pub cancelled: bool,
    /// CPU the waiting thread spent for this sandbox (setting it up, relaying output and input,
    /// answering refused calls). The part spent on refused calls is charged to the CPU-time limit
    /// with the sandbox's own.
    pub supervisor_cpu: Duration,
    /// Times answering refused calls was paused because it had used the sandbox's CPU share.
    pub refusals_throttled: u64,
    /// Without egress: where `connect` calls were going (TCP and UDP, IPv4 and IPv6; at most
    /// `MAX_ATTEMPTS` destinations), in the order first seen.
    pub attempts: Vec<Attempt>,
    /// Attempts to destinations past `MAX_ATTEMPTS`, counted only.
    pub attempts_dropped: u64,
    /// The filter showed the supervisor every `socket` and `socketpair` of the run (a sandbox
    /// without egress), and there was none: the run left its network namespace as it found it.
    pub made_no_socket: bool,
}

/// Most destinations of `connect` attempts listed for a run without egress.
pub const MAX_ATTEMPTS: usize = 256;

/// Where a `connect` was going, in a run without egress, and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub address: std::net::IpAddr,
    pub port: u16,
    /// `tcp`, `udp`, or `unknown` when the socket could not be looked at.
    pub protocol: &'static str,
    pub count: u64,
}

/// The destination of a `connect(fd, addr, len)` the filter handed over: read from the caller's
/// memory (an IPv4 or IPv6 address; other families are not egress), the socket's type from a
/// copy of its descriptor. `None` when it is not an internet address or cannot be read.
fn read_attempt(n: &sys::SeccompNotice) -> Option<Attempt> {
    let len = (n.args[2] as usize).min(128);
    if len < 8 {
        return None;
    }
    let mut buf = [0u8; 128];
    let got = sys::read_process_memory(n.pid, n.args[1], &mut buf[..len]).ok()?;
    let b = &buf[..got];
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    let address = match u16::from_ne_bytes([b[0], b[1]]) as i32 {
        libc::AF_INET => std::net::IpAddr::from(<[u8; 4]>::try_from(b.get(4..8)?).ok()?),
        libc::AF_INET6 => std::net::IpAddr::from(<[u8; 16]>::try_from(b.get(8..24)?).ok()?),
        _ => return None,
    };
    // Descriptors belong to the process: its leader's pidfd reaches them from any thread.
    let leader = std::fs::read_to_string(format!("/proc/{}/status", n.pid))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(n.pid);
    let protocol = match sys::socket_type_of(leader, n.args[0] as i32) {
        Some(libc::SOCK_STREAM) => "tcp",
        Some(libc::SOCK_DGRAM) => "udp",
        _ => "unknown",
    };
    Some(Attempt {
        address,
        port,
        protocol,
        count: 1,
    })
}

/// A host pid as the sandbox knows it: the last `NSpid` entry of `/proc/PID/status` (the pid in
/// the innermost namespace), or the host pid if the process is already gone.
fn inner_pid(host: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{host}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last()?.parse().ok())
        })
        .unwrap_or(host)
}

/// A started sandbox.
pub struct Running {
    pid: i32,
    pidfd: Arc<OwnedFd>,
    msg: File,
    /// The supervisor's end of the init's socket, until the payload has started.
    go_w: Option<OwnedFd>,
    /// Where the init sends the pty master (with a terminal), until it has.
    pty_parent: Option<OwnedFd>,
    stdout: Option<File>,
    stderr: Option<File>,
    pty: Option<File>,
    /// The write end of the payload's stdin pipe (`Stdin::Bytes`, `Stdin::Pipe`, a relayed
    /// terminal).
    stdin_w: Option<File>,
    /// What is still to be written to `stdin_w` (`Stdin::Bytes`).
    stdin_bytes: Vec<u8>,
    /// The caller's terminal whose input is relayed into `stdin_w` (`Stdin::Inherit` on a tty).
    relay_from: Option<RawFd>,
    /// The loop writes `stdin_w` (bytes, a relayed terminal) and closes it when done; otherwise
    /// it is the caller's (`Stdin::Pipe`).
    loop_feeds_stdin: bool,
    started: Instant,
    ids: Ids,
    /// The host id this run claimed (root launches), released when the run is over.
    _lease: Option<IdLease>,
    limits: palisade_policy::Limits,
    landlock: LandlockState,
    protection: crate::plan::Protection,
    /// The payload's seccomp listener: refused calls arrive here to be answered and recorded.
    notify: Option<OwnedFd>,
    denied: Vec<DeniedCall>,
    attempts: Vec<Attempt>,
    attempts_dropped: u64,
    cancelled: Arc<AtomicBool>,
    done: bool,
    /// The egress proxy's listeners, made inside the sandbox's network namespace.
    egress: Vec<(plan::SockSpec, OwnedFd)>,
    /// CPU the spawning thread spent setting the sandbox up.
    setup_cpu: Duration,
    /// Which engine started it (`in-process`, `exec`, `template`).
    engine: &'static str,
    /// With a workspace: the root of its private tmpfs (see [`plan::WORKSPACE_TAG`]), and the
    /// host directory under it.
    workspace: Option<(OwnedFd, plan::WorkspaceBase)>,
    /// The filter shows the supervisor every `socket` and `socketpair` (no egress).
    watch_sockets: bool,
    /// Sockets the run made, as the filter showed them.
    sockets_made: u64,
    /// A network namespace lent by a template's pool, given back when the caller drops it.
    net_lease: Option<crate::zygote::NetLease>,
    /// The socket on which init may send the run's mount namespace (see
    /// [`Running::take_mount_ns`]).
    mount_ns: Option<OwnedFd>,
}

/// Kills a running sandbox from any thread; see [`Running::killer`].
#[derive(Clone)]
pub struct Killer {
    pidfd: Arc<OwnedFd>,
    cancelled: Arc<AtomicBool>,
}

impl Killer {
    /// Kills every process of the sandbox at once (its init, and with it the pid namespace). The
    /// run then ends as cancelled. Harmless once the run is over: the pidfd names only that init,
    /// never a process that reused its pid.
    pub fn kill(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let _ = pidfd_signal(self.pidfd.as_raw_fd(), libc::SIGKILL);
    }
}

fn pidfd_signal(pidfd: RawFd, sig: i32) -> io::Result<()> {
    sys::pidfd_send_signal(pidfd, sig).map_err(io::Error::from_raw_os_error)
}

/// A host id claimed for one root-launched run: a byte of `ID_LOCK_FILE` locked for as long
/// as this lives.
pub struct IdLease {
    _lock: OwnedFd,
}

/// Claims a host id for one root-launched run: the first free one from a random start in the
/// range. `None` where the lock file cannot be made (a read-only `/run`): all runs then share
/// [`ROOT_MAPPED_ID`], which still owns their namespaces instead of host root.
fn claim_root_id() -> Option<(u32, IdLease)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = std::path::Path::new(ID_LOCK_FILE);
    let dir = path.parent()?;
    let _ = std::fs::DirBuilder::new().mode(0o755).create(dir);
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    // Only a file root owns: no other user can have planted it to make runs share ids.
    if f.metadata().ok()?.uid() != 0 {
        return None;
    }
    let fd = OwnedFd::from(f);
    let mut r = [0u8; 4];
    // A short or failed read leaves zeros, which only means starting at the first id.
    sys::getrandom_nonblock(&mut r);
    let start = u32::from_ne_bytes(r) % ROOT_MAPPED_IDS;
    for i in 0..ROOT_MAPPED_IDS {
        let k = (start + i) % ROOT_MAPPED_IDS;
        match sys::ofd_lock_byte(fd.as_raw_fd(), k as u64) {
            Ok(()) => return Some((ROOT_MAPPED_ID + k, IdLease { _lock: fd })),
            Err(libc::EAGAIN) | Err(libc::EACCES) => continue,
            Err(_) => return None,
        }
    }
    None
}

/// A system call the seccomp filter refused, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedCall {
    /// The call's name (`ptrace`, `socket (netlink)`, `ioctl TIOCSTI`, …).
    pub name: String,
    /// How many times it was attempted.
    pub count: u64,
    /// The process that tried first, as a pid inside the sandbox where the host can tell.
    pub first_pid: u32,
    /// The errno the calls failed with.
    pub errno: i32,
}

/// Refused calls are named by the call and, for some, a detail the payload chooses (`socket
/// (family 67)`): each call keeps at most this many details; further ones are counted under
/// `CALL (other)`. So every refused call is named, and the list stays bounded by the number of
/// calls whatever the payload tries.
const MAX_DETAILS_PER_CALL: usize = 16;

/// Answering refused calls is paused for the rest of a window once the supervisor has spent the
/// sandbox's CPU share of it on them: the refusing processes wait in the call, the supervisor
/// does not work for them past the sandbox's own share.
const REFUSAL_WINDOW: Duration = Duration::from_millis(100);

/// Most input bytes held for a payload that does not read (a pty or a stdin pipe).
const INPUT_BUFFER: usize = 64 * 1024;

/// Once init is gone, how long the supervisor keeps draining output it had not read yet.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

pub(crate) fn io_err(op: &'static str) -> impl Fn(io::Error) -> SetupError {
    move |source| SetupError::Supervisor { op, source }
}

/// A pipe whose ends are close-on-exec and numbered ≥ 3 (so the child can dup2 onto 0..2 freely).
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), SetupError> {
    let (r, w) = sys::pipe().map_err(|e| os_err("pipe2", e))?;
    Ok((above2(r)?, above2(w)?))
}

pub(crate) fn above2(fd: OwnedFd) -> Result<OwnedFd, SetupError> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    sys::dup_above2(fd.as_raw_fd()).map_err(|e| os_err("fcntl(F_DUPFD_CLOEXEC)", e))
}

fn os_err(op: &'static str, e: sys::Errno) -> SetupError {
    SetupError::Supervisor {
        op,
        source: io::Error::from_raw_os_error(e),
    }
}

pub(crate) fn devnull() -> Result<OwnedFd, SetupError> {
    let f = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(io_err("open /dev/null"))?;
    above2(f.into())
}

/// The ids the payload gets, what they map to on the host, and (root only) the device and inode
/// of the scratch directory they were read from, which the plan must then mount.
#[allow(clippy::type_complexity)]
pub(crate) fn choose_ids(
    policy: &Policy,
) -> Result<(Ids, Option<(u64, u64)>, Option<IdLease>), SetupError> {
    let (mut ids, seen) = inside_ids(policy)?;
    if !ids.privileged {
        return Ok((ids, seen, None));
    }
    let (host, lease) = match claim_root_id() {
        Some((id, lease)) => (id, Some(lease)),
        None => (ROOT_MAPPED_ID, None),
    };
    ids.host_uid = host;
    ids.host_gid = host;
    Ok((ids, seen, lease))
}

/// [`choose_ids`] without claiming a host id: for a root launch the host ids are left at
/// [`ROOT_MAPPED_ID`]. Checks an unprivileged caller can write the scratch directory.
pub(crate) fn inside_ids(policy: &Policy) -> Result<(Ids, Option<(u64, u64)>), SetupError> {
    let (euid, egid) = (sys::geteuid(), sys::getegid());
    // Root in a user namespace that lacks ROOT_MAPPED_ID (a rootless container, `unshare -r`)
    // cannot map the payload there; it takes the unprivileged path, mapping only itself.
    if euid != 0 || !root_mapped_id_exists() {
        if let Scratch::Host { path } = &policy.scratch {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
                SetupError::NotWritable {
                    field: "filesystem.scratch",
                    path: path.clone(),
                    uid: euid,
                }
            })?;
            if sys::access(&c, libc::W_OK | libc::X_OK).is_err() {
                return Err(SetupError::NotWritable {
                    field: "filesystem.scratch",
                    path: path.clone(),
                    uid: euid,
                });
            }
        }
        let ids = Ids {
            uid: euid,
            gid: egid,
            host_uid: euid,
            host_gid: egid,
            privileged: false,
        };
        return Ok((ids, None));
    }
    // Root: the payload is the scratch directory's owner inside (root for an ephemeral scratch),
    // mapped to ROOT_MAPPED_ID outside. The scratch is then idmapped through the same namespace,
    // so files written there land on disk owned by that owner, never by ROOT_MAPPED_ID.
    let (uid, gid, seen) = match &policy.scratch {
        Scratch::Ephemeral => (0, 0, None),
        Scratch::Host { path } | Scratch::Workspace { path } => {
            let (_, meta) = plan::resolve_host(policy.scratch.field(), path)?;
            (meta.uid(), meta.gid(), Some((meta.dev(), meta.ino())))
        }
    };
    let ids = Ids {
        uid,
        gid,
        host_uid: ROOT_MAPPED_ID,
        host_gid: ROOT_MAPPED_ID,
        privileged: true,
    };
    Ok((ids, seen))
}

/// Whether the ROOT_MAPPED_ID range exists as uids and gids in this process's user namespace
/// (always in the initial one, whose maps cover every id).
fn root_mapped_id_exists() -> bool {
    // Once per process: a process's own user namespace and its maps do not change.
    static EXISTS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EXISTS.get_or_init(root_mapped_id_in_maps)
}

fn root_mapped_id_in_maps() -> bool {
    let last = ROOT_MAPPED_ID + (ROOT_MAPPED_IDS - 1);
    let has = |file: &str| {
        std::fs::read_to_string(file)
            .is_ok_and(|m| id_in_map(&m, ROOT_MAPPED_ID) && id_in_map(&m, last))
    };
    has("/proc/self/uid_map") && has("/proc/self/gid_map")
}

/// Whether `id` is inside one of the ranges of a `uid_map`/`gid_map` text ("inside outside
/// count" lines).
fn id_in_map(map: &str, id: u32) -> bool {
    map.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        f.len() == 3 && (f[0]..f[0] + f[2]).contains(&(id as u64))
    })
}

pub(crate) fn write_proc(pid: i32, file: &'static str, data: &str) -> Result<(), SetupError> {
    std::fs::write(format!("/proc/{pid}/{file}"), data)
        .map_err(|source| SetupError::IdMap { file, source })
}

/// Called with the sandbox init's host pid after its namespaces exist, while init builds the
/// filesystem view, before the payload starts: it prepares the run's cgroup and either moves init
/// in itself (cgroup v2) or returns up to `sys::MAX_FDS` files (cgroup v1 `tasks`) through which
/// init moves itself in, which is much cheaper. Every process of the sandbox then starts inside.
pub type BeforeStart<'a> = &'a dyn Fn(i32) -> io::Result<Vec<File>>;

/// Starts `policy`'s command in a new sandbox and returns once it has been exec'd (or failed to).
pub fn spawn(
    policy: &Policy,
    stdin: Stdin,
    before_start: Option<BeforeStart<'_>>,
) -> Result<Running, SetupError> {
    spawn_with(
        policy,
        stdin,
        before_start,
        &Engine::InProcess,
        &plan::Extras::default(),
    )
}

/// [`spawn`] with the sandbox's init started by `engine`, and what the supervisor made for this
/// run ([`plan::Extras`]: the CA of TLS inspection to trust, the placeholders of secrets).
pub fn spawn_with(
    policy: &Policy,
    stdin: Stdin,
    before_start: Option<BeforeStart<'_>>,
    engine: &Engine,
    extras: &plan::Extras,
) -> Result<Running, SetupError> {
    let setup_cpu0 = sys::thread_cpu_time();
    let (ids, scratch_seen, lease) = choose_ids(policy)?;
    // a. The plan: every path resolved and checked, every string converted; nothing on the host
    //    touched before it passes, and the child never allocates after it.
    let mut plan = plan::build_with(policy, ids, &plan::RealHost, extras)?;
    check_scratch(&plan, scratch_seen)?;

    // b. Pipes and sockets for messages, output and input, close-on-exec and numbered >= 3.
    let mut ch = channels(policy.tty, stdin)?;
    let (msg_w, go_r) = (
        Channels::init_fd(&ch.ctl.msg_w),
        Channels::init_fd(&ch.ctl.go_r),
    );
    let mut keep: Vec<c_int> = vec![msg_w, go_r];
    keep.extend(ch.ctl.pty_child.as_ref().map(|p| p.as_raw_fd()));

    // c. Root: open user-given sources here as detached trees (see plan::Source::in_supervisor).
    let trees = open_trees(&mut plan.sources)?;
    keep.extend(trees.iter().map(|t| t.as_raw_fd()));
    // The run's files' bytes, for init to write (step 13).
    let files = plan::files_fd(&extras.files)?;
    keep.extend(files.as_ref().map(|f| f.as_raw_fd()));
    keep.sort_unstable();
    let fds = ChildFds {
        stdio: ch.stdio,
        msg: msg_w,
        go: go_r,
        pty_sock: ch.ctl.pty_child.as_ref().map_or(-1, |p| p.as_raw_fd()),
        files: files.as_ref().map_or(-1, |f| f.as_raw_fd()),
        keep,
    };

    // d. clone3. Root: the user namespace is created with this thread's effective ids switched to the
    //    run's host id, so that the namespace's owner is that id, not host root. The kernel
    //    charges a namespace's per-user counts (inotify instances, fanotify groups, queued signals,
    //    processes) to its owner as well, up the chain: owned by root, a sandbox could use up host
    //    root's own quotas for every root process on the host (audit F3). Only this thread
    //    changes, for the length of the clone3; the child starts with those ids too.
    let switched = switch_ids(ids)?;
    let started = Instant::now();
    let (pid, pidfd) = match engine {
        Engine::InProcess => {
            #[allow(unsafe_code)]
            // EXCEPTION (sys module docs): the clone of the sandbox's init itself.
            // SAFETY: the child branch calls child::init, which is async-signal-safe (see its
            // module doc) and never returns.
            let cloned = unsafe { sys::clone3(NAMESPACES) };
            match cloned {
                Ok(sys::Forked::Child) => child::init(&mut plan, &fds),
                Ok(sys::Forked::Parent { pid, pidfd }) => (pid, pidfd),
                Err(e) => {
                    drop(switched);
                    return Err(namespaces_error(e));
                }
            }
        }
        Engine::Exec(prog) => {
            // The init program gets the payload's streams on 0, 1, 2 already, and the same
            // numbers for everything else it keeps.
            let sent = ChildFds {
                stdio: [0, 1, 2],
                msg: fds.msg,
                go: fds.go,
                pty_sock: fds.pty_sock,
                files: fds.files,
                keep: fds.keep.clone(),
            };
            let started = crate::engine::exec_in_namespaces(
                prog,
                NAMESPACES,
                "init",
                crate::engine::INIT_ARGV0,
                &[fds.go, fds.msg],
                fds.stdio,
                &fds.keep,
            );
            let s = match started {
                Ok(s) => s,
                Err(e) => {
                    drop(switched);
                    return Err(exec_error(e));
                }
            };
            // The init holds its own copies now. Ours closed before the plan goes out: an init
            // that is gone (or refuses the plan and exits) must show here as a closed socket,
            // not as a peer we hold open ourselves and a send that never ends.
            ch.close_init_side();
            // Its first read: the descriptors and the plan. If it is already gone, its own
            // error is on the message pipe, read below.
            let _ = sys::send_all(ch.go_w_raw(), &crate::engine::init_message(&sent, &plan));
            (s.pid, s.pidfd)
        }
    };
    drop(switched);
    // Init holds its own copy of the files' descriptor now.
    drop(files);
    let mut running = Running::new(
        pid,
        pidfd,
        ch,
        started,
        ids,
        lease,
        policy,
        &plan,
        engine.name(),
    )?;

    // e. The maps. Unprivileged, the kernel allows exactly one id mapped to ourselves, and only after
    // setgroups is denied (otherwise dropping a group could grant access, CVE-2014-8989).
    if ids.privileged {
        write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
        write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
        // f. The writable trees idmapped through the sandbox's user namespace.
        if plan.sources.iter().any(|s| s.idmap) {
            let ns = File::open(format!("/proc/{pid}/ns/user"))
                .map_err(io_err("open the sandbox's user namespace"))?;
            idmap_trees(&plan.sources, ns.as_raw_fd())?;
        }
    } else {
        write_proc(pid, "setgroups", "deny")?;
        write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
        write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
    }
    drop(trees);
    // g. "go": init goes on with its steps 3-12.
    sys::write_all(running.go_w(), b"g").map_err(|e| SetupError::Supervisor {
        op: "start the sandbox",
        source: io::Error::from_raw_os_error(e),
    })?;
    let views = Views {
        sources: &plan.sources,
        ops: &plan.ops,
        plan: &plan,
        program: &policy.command[0],
        files: &extras.files,
    };
    running.complete(before_start, None, &views, setup_cpu0)?;
    Ok(running)
}

/// What a setup error's index refers to: the sources and operations the init ran (a template's
/// per-run init runs a part of its own), and the plan for the rest.
pub(crate) struct Views<'a> {
    pub sources: &'a [plan::Source],
    pub ops: &'a [plan::Op],
    pub plan: &'a plan::Plan,
    pub program: &'a str,
    /// The run's files, for an error writing one.
    pub files: &'a [plan::FileIn],
}

/// The ids came from the scratch directory's owner: the directory the plan mounts (and the child
/// checks again by device and inode) must be that same one, not one swapped in meanwhile.
pub(crate) fn check_scratch(
    plan: &plan::Plan,
    scratch_seen: Option<(u64, u64)>,
) -> Result<(), SetupError> {
    if let (Some(seen), Some(i)) = (scratch_seen, plan.scratch_source) {
        let s = &plan.sources[i];
        if (s.dev, s.ino) != seen {
            return Err(SetupError::HostMount {
                what: "the scratch directory",
                path: s.path.to_string_lossy().into_owned().into(),
                source: io::Error::from_raw_os_error(libc::ESTALE),
                hint: " (it changed while palisade was checking it)",
            });
        }
    }
    Ok(())
}

/// Root: this thread's effective ids switched to the run's host id while the user namespace is
/// created (see step d); `None` unprivileged.
pub(crate) fn switch_ids(ids: Ids) -> Result<Option<sys::EffectiveIds>, SetupError> {
    if !ids.privileged {
        return Ok(None);
    }
    sys::EffectiveIds::switch(ids.host_uid, ids.host_gid)
        .map(Some)
        .map_err(|e| SetupError::Supervisor {
            op: "switch to the run's host id to create its user namespace",
            source: io::Error::from_raw_os_error(e),
        })
}

/// The error for a failed start of an engine process (see `engine::exec_in_namespaces`).
pub(crate) fn exec_error((op, e): (&'static str, i32)) -> SetupError {
    if op == "clone" {
        return namespaces_error(e);
    }
    SetupError::Supervisor {
        op,
        source: io::Error::from_raw_os_error(e),
    }
}

/// Root: each writable tree idmapped through the user namespace `userns`, so that files written
/// inside land on disk owned by the scratch directory's owner.
pub(crate) fn idmap_trees(sources: &[plan::Source], userns: c_int) -> Result<(), SetupError> {
    for s in sources.iter().filter(|s| s.idmap && s.tree >= 0) {
        let attrs = sys::MOUNT_ATTR_IDMAP | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
        let flags = libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32;
        sys::mount_setattr(s.tree, c"", flags, attrs, 0, userns).map_err(|e| {
            SetupError::HostMount {
                what: "an idmapped mount of",
                path: s.path.to_string_lossy().into_owned().into(),
                source: io::Error::from_raw_os_error(e),
                hint: "; the file system must support idmapped mounts (ext4, xfs, btrfs, tmpfs on Linux 6.3+)",
            }
        })?;
    }
    Ok(())
}

/// Root: the sources the supervisor opens itself (see plan::Source::in_supervisor), each as a
/// detached mount tree, checked by device and inode; `tree` set in each. The trees are returned
/// for the caller to hold until the init has them.
pub(crate) fn open_trees(sources: &mut [plan::Source]) -> Result<Vec<OwnedFd>, SetupError> {
    let mut trees: Vec<OwnedFd> = Vec::new();
    for s in sources.iter_mut().filter(|s| s.in_supervisor) {
        let path = std::path::PathBuf::from(s.path.to_string_lossy().into_owned());
        let hm = |source: i32, hint: &'static str| SetupError::HostMount {
            what: "bind source",
            path: path.clone(),
            source: io::Error::from_raw_os_error(source),
            hint,
        };
        let fd = sys::open_path_noresolve(
            &s.path,
            sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
        )
        .map_err(|e| hm(e, ""))?;
        if sys::dev_ino(fd.as_raw_fd()) != Ok((s.dev, s.ino)) {
            return Err(hm(
                libc::ESTALE,
                " (it changed while palisade was checking it)",
            ));
        }
        let flags = sys::OPEN_TREE_CLONE
            | sys::OPEN_TREE_CLOEXEC
            | libc::AT_EMPTY_PATH as u32
            | libc::AT_RECURSIVE as u32;
        let t = above2(sys::open_tree(fd.as_raw_fd(), c"", flags).map_err(|e| hm(e, ""))?)?;
        s.tree = t.as_raw_fd();
        trees.push(t);
    }
    Ok(trees)
}

/// The descriptors of one run, the supervisor's side and the init's.
pub(crate) struct Channels {
    /// The message pipe and sockets.
    pub ctl: Control,
    /// The init's ends of the standard streams (closed here once the init has its own).
    pub child_side: Vec<OwnedFd>,
    /// What becomes the payload's 0, 1, 2 (numbers in `child_side`, or the caller's own 0).
    pub stdio: [c_int; 3],
    out_r: Option<OwnedFd>,
    err_r: Option<OwnedFd>,
    stdin_w: Option<OwnedFd>,
    relay_from: Option<RawFd>,
    stdin_bytes: Vec<u8>,
    feeds_bytes: bool,
}

impl Channels {
    /// The supervisor's end of the init's socket.
    pub(crate) fn go_w_raw(&self) -> c_int {
        self.ctl.go_w.as_raw_fd()
    }

    /// The number of an init's end, or -1 without one.
    pub(crate) fn init_fd(fd: &Option<OwnedFd>) -> c_int {
        fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// Closes the init's ends here, once the init has its own copies: the message pipe then ends
    /// when the init (and whoever else held it) is gone.
    pub(crate) fn close_init_side(&mut self) {
        self.ctl.close_init_side();
        self.child_side.clear();
    }
}

/// The message pipe and sockets between the supervisor and one run's init, which exist before
/// the run's program and streams are known (a template makes its runs' inits ahead).
pub(crate) struct Control {
    msg_r: OwnedFd,
    pub msg_w: Option<OwnedFd>,
    go_w: OwnedFd,
    pub go_r: Option<OwnedFd>,
    pty_parent: Option<OwnedFd>,
    pub pty_child: Option<OwnedFd>,
}

impl Control {
    /// The pipe and sockets, close-on-exec and numbered ≥ 3; with `tty`, the socket on which the
    /// init sends the pty master.
    pub(crate) fn new(tty: bool) -> Result<Control, SetupError> {
        let (msg_r, msg_w) = pipe()?;
        let (go_w, go_r) = socketpair()?;
        let (pty_parent, pty_child) = if tty {
            let (a, b) = socketpair()?;
            (Some(a), Some(b))
        } else {
            (None, None)
        };
        Ok(Control {
            msg_r,
            msg_w: Some(msg_w),
            go_w,
            go_r: Some(go_r),
            pty_parent,
            pty_child,
        })
    }

    /// The supervisor's end of the init's message pipe.
    pub(crate) fn msg_r_raw(&self) -> c_int {
        self.msg_r.as_raw_fd()
    }

    /// Closes the init's ends here, once the init has its own copies.
    pub(crate) fn close_init_side(&mut self) {
        self.msg_w = None;
        self.go_r = None;
        self.pty_child = None;
    }
}

/// Pipes and sockets for messages, output and input of one run, close-on-exec and numbered ≥ 3.
/// The payload's stdin: /dev/null, the caller's own (never a terminal: relayed through a pipe
/// instead), or a pipe the supervisor (bytes) or the caller (Stdin::Pipe) writes into.
pub(crate) fn channels(tty: bool, stdin: Stdin) -> Result<Channels, SetupError> {
    channels_with(Control::new(tty)?, stdin)
}

/// [`channels`] on a [`Control`] made earlier (a terminal if it has the pty socket).
pub(crate) fn channels_with(control: Control, stdin: Stdin) -> Result<Channels, SetupError> {
    let mut child_side: Vec<OwnedFd> = Vec::new();
    let mut stdin_w: Option<OwnedFd> = None;
    let mut relay_from: Option<RawFd> = None;
    let mut stdin_bytes = Vec::new();
    let feeds_bytes = matches!(stdin, Stdin::Bytes(_));
    let (stdio, out_r, err_r) = if control.pty_parent.is_some() {
        let null = devnull()?;
        let n = null.as_raw_fd();
        child_side.push(null);
        ([n, n, n], None, None)
    } else {
        let (or, ow) = pipe()?;
        let (er, ew) = pipe()?;
        let mut piped = |child_side: &mut Vec<OwnedFd>| -> Result<c_int, SetupError> {
            let (r, w) = pipe()?;
            let raw = r.as_raw_fd();
            child_side.push(r);
            stdin_w = Some(w);
            Ok(raw)
        };
        let input = match stdin {
            Stdin::Inherit if sys::is_terminal(0) => {
                relay_from = Some(0);
                piped(&mut child_side)?
            }
            Stdin::Inherit => 0,
            Stdin::Null => {
                let n = devnull()?;
                let raw = n.as_raw_fd();
                child_side.push(n);
                raw
            }
            Stdin::Bytes(b) => {
                stdin_bytes = b;
                piped(&mut child_side)?
            }
            Stdin::Pipe => piped(&mut child_side)?,
            Stdin::Socket => {
                let (ours, theirs) = socketpair()?;
                let raw = theirs.as_raw_fd();
                child_side.push(theirs);
                stdin_w = Some(ours);
                raw
            }
        };
        let s = [input, ow.as_raw_fd(), ew.as_raw_fd()];
        child_side.push(ow);
        child_side.push(ew);
        (s, Some(or), Some(er))
    };
    Ok(Channels {
        ctl: control,
        child_side,
        stdio,
        out_r,
        err_r,
        stdin_w,
        relay_from,
        stdin_bytes,
        feeds_bytes,
    })
}

impl Running {
    /// A run whose init exists: the init's ends of `ch` are closed here (the init has its own),
    /// the supervisor's kept.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        pid: i32,
        pidfd: OwnedFd,
        ch: Channels,
        started: Instant,
        ids: Ids,
        lease: Option<IdLease>,
        policy: &Policy,
        plan: &plan::Plan,
        engine: &'static str,
    ) -> Result<Running, SetupError> {
        let Channels {
            ctl:
                Control {
                    msg_r,
                    msg_w,
                    go_w,
                    go_r,
                    pty_parent,
                    pty_child,
                },
            child_side,
            out_r,
            err_r,
            stdin_w,
            relay_from,
            stdin_bytes,
            feeds_bytes,
            ..
        } = ch;
        drop((msg_w, go_r, pty_child, child_side));
        // Our ends of the pipes never block the supervisor's loop (see Running::wait). A stdin
        // end the caller takes (Stdin::Pipe, Stdin::Socket) stays blocking: the caller writes it
        // from its own thread.
        let loop_feeds = relay_from.is_some() || feeds_bytes;
        let fed = stdin_w.as_ref().filter(|_| loop_feeds);
        for f in [out_r.as_ref(), err_r.as_ref(), fed].into_iter().flatten() {
            if let Err(e) = sys::set_nonblocking(f.as_raw_fd()) {
                // The init exists and is this process's child: killed and reaped here, not left
                // to its parent-death signal (a caller's thread may outlive the run).
                let _ = sys::pidfd_send_signal(pidfd.as_raw_fd(), libc::SIGKILL);
                let _ = sys::waitpid(pid, 0);
                return Err(SetupError::Supervisor {
                    op: "make the output pipes non-blocking",
                    source: io::Error::from_raw_os_error(e),
                });
            }
        }
        Ok(Running {
            pid,
            pidfd: Arc::new(pidfd),
            msg: File::from(msg_r),
            go_w: Some(go_w),
            pty_parent,
            stdout: out_r.map(File::from),
            stderr: err_r.map(File::from),
            pty: None,
            stdin_w: stdin_w.map(File::from),
            loop_feeds_stdin: loop_feeds,
            stdin_bytes,
            relay_from,
            started,
            ids,
            _lease: lease,
            limits: policy.limits,
            landlock: plan.landlock.state(),
            protection: plan.protection.clone(),
            notify: None,
            denied: Vec::new(),
            attempts: Vec::new(),
            attempts_dropped: 0,
            cancelled: Arc::new(AtomicBool::new(false)),
            done: false,
            egress: Vec::new(),
            setup_cpu: Duration::ZERO,
            engine,
            workspace: None,
            // The plan's filter watches them whenever the sandbox has no egress.
            watch_sockets: !policy.network.enabled(),
            sockets_made: 0,
            net_lease: None,
            mount_ns: None,
        })
    }

    /// The supervisor's end of the init's socket (until the payload has started).
    pub(crate) fn go_w(&self) -> c_int {
        self.go_w.as_ref().map_or(-1, |g| g.as_raw_fd())
    }

    /// The rest of the start, once the init runs its setup: the caller's hook (the cgroup) and
    /// "j", the pty master, then the init's first message (`early`, if one was read already):
    /// started, with the egress listeners and the seccomp listener, or why not.
    pub(crate) fn complete(
        &mut self,
        before_start: Option<BeforeStart<'_>>,
        early: Option<Msg>,
        views: &Views<'_>,
        setup_cpu0: Duration,
    ) -> Result<(), SetupError> {
        let go_w = self.go_w();
        // h. While init builds the view: the caller's hook (the cgroup), then "j", which init
        // waits for before it starts the payload.
        if early.is_none() {
            let files = match before_start {
                Some(hook) => hook(self.pid).map_err(|source| SetupError::Supervisor {
                    op: "place the sandbox in its cgroup",
                    source,
                })?,
                None => Vec::new(),
            };
            let raw: Vec<c_int> = files.iter().map(|f| f.as_raw_fd()).collect();
            // If init is gone already, sending fails; its own error message is then on the msg
            // pipe, read below, and is the one worth reporting.
            let _ = sys::send_fds(go_w, b'j', &raw);
        }
        // go_w stays open until the payload has started: init checks it for a hang-up after
        // re-arming its parent-death signal (see child.rs, step 3).
        if let Some(sock) = self.pty_parent.take().filter(|_| early.is_none()) {
            if let Ok((_, got)) = sys::recv_fds(sock.as_raw_fd()) {
                self.pty = got.into_iter().next().map(File::from);
            }
            if let Some(p) = &self.pty {
                // Ours alone (init closed its copy): writes of the caller's input never block.
                sys::set_nonblocking(p.as_raw_fd()).map_err(|e| SetupError::Supervisor {
                    op: "make the pty non-blocking",
                    source: io::Error::from_raw_os_error(e),
                })?;
            }
        }
        let m = match early {
            Some(m) => m,
            None => {
                let mut b = [0u8; 16];
                let n = sys::read_full(self.msg.as_raw_fd(), &mut b).unwrap_or(0);
                if n != 16 {
                    return Err(SetupError::InitVanished);
                }
                Msg::from_bytes(&b)
            }
        };
        if m.kind == child::MSG_STARTED {
            // A workspace's tmpfs, sent while init built the view.
            if let Some(base) = &views.plan.workspace {
                match sys::recv_fds(go_w).map(|(tag, got)| (tag, got.len(), got)) {
                    Ok((plan::WORKSPACE_TAG, 1, got)) => {
                        let fd = got.into_iter().next().expect("one descriptor came");
                        self.workspace = Some((fd, base.clone()));
                    }
                    _ => {
                        return Err(SetupError::Supervisor {
                            op: "receive the workspace's upper layer",
                            source: io::Error::from_raw_os_error(libc::EPROTO),
                        })
                    }
                }
            }
            // Init sent the egress listeners while it set up, before the payload existed.
            for chunk in views.plan.sockets.chunks(sys::MAX_FDS) {
                match sys::recv_fds(go_w) {
                    Ok((b'n', got)) if got.len() == chunk.len() => {
                        for (spec, fd) in chunk.iter().zip(got) {
                            self.egress.push((*spec, fd));
                        }
                    }
                    _ => {
                        return Err(SetupError::Supervisor {
                            op: "receive the egress proxy's listeners",
                            source: io::Error::from_raw_os_error(libc::EPROTO),
                        })
                    }
                }
            }
            // The payload sent its seccomp listener before its exec, so before init's "started".
            match sys::recv_fds(go_w).map(|(tag, got)| (tag, got.len(), got)) {
                Ok((b's', 1, got)) => {
                    self.notify = got.into_iter().next();
                }
                Ok(_) | Err(_) => {
                    return Err(SetupError::Supervisor {
                        op: "receive the payload's seccomp listener",
                        source: io::Error::from_raw_os_error(libc::EPROTO),
                    })
                }
            }
        }
        // Kept: at its end, init may send its mount namespace on it (see child.rs, step 21).
        self.mount_ns = self.go_w.take();
        self.setup_cpu = sys::thread_cpu_time().saturating_sub(setup_cpu0);
        match m.kind {
            child::MSG_STARTED => Ok(()),
            _ => Err(setup_error(&m, views)),
        }
    }
}

/// The error an init's message (not "started") stands for, in words.
pub(crate) fn setup_error(m: &Msg, views: &Views<'_>) -> SetupError {
    let plan = views.plan;
    match m.kind {
        child::MSG_SETUP_ERROR => {
            let step = Step::from_u32(m.step);
            let what = match step {
                Some(Step::Op) => plan::describe_op(views.ops, views.sources, m.index as usize),
                Some(Step::OpenSource) | Some(Step::SourceChanged) => format!(
                    "open host path {}{}",
                    views
                        .sources
                        .get(m.index as usize)
                        .map_or(String::new(), |s| s.path.to_string_lossy().into_owned()),
                    if step == Some(Step::SourceChanged) {
                        " (it changed while palisade was checking it)"
                    } else {
                        ""
                    }
                ),
                Some(Step::LandlockRuleset) => "create the Landlock ruleset".into(),
                Some(Step::LandlockRule) => format!(
                    "add the Landlock rule for {}",
                    plan.landlock.ruleset().map_or(String::new(), |r| {
                        let i = m.index as usize;
                        match r.rules.get(i) {
                            Some(rule) => rule.path.to_string_lossy().into_owned(),
                            None => r
                                .ports
                                .get(i - r.rules.len())
                                .map_or(String::new(), |p| format!("TCP port {}", p.0)),
                        }
                    })
                ),
                Some(Step::EgressSocket) => format!(
                    "create the egress proxy's listener {}",
                    plan.sockets
                        .get(m.index as usize)
                        .map_or(String::new(), |s| format!(
                            "{}:{}{}",
                            std::net::Ipv4Addr::from(s.addr),
                            s.port,
                            if s.udp() { "/udp" } else { "" }
                        ))
                ),
                Some(Step::LandlockRestrict) => {
                    "enter the Landlock ruleset (landlock_restrict_self)".into()
                }
                Some(Step::Engine) => {
                    "read the plan in palisade's init program (is it the same palisade build?)"
                        .into()
                }
                Some(Step::FilesIn) => format!(
                    "write the run's file {} in the working directory (files[{}])",
                    views
                        .files
                        .get(m.index as usize)
                        .map_or(String::new(), |f| f.path.clone()),
                    m.index
                ),
                Some(Step::TemplateProc) => "mount the prepared view's own procfs (a host /proc with masked or over-mounted entries, as in some containers, prevents this)".into(),
                Some(s) => format!("{s:?}"),
                None => format!("step {}", m.step),
            };
            SetupError::Child {
                // An unknown number would be a bug between two halves of one binary.
                step: step.unwrap_or(Step::Fork),
                what,
                source: io::Error::from_raw_os_error(m.value),
            }
        }
        child::MSG_EXEC_ERROR if m.index == u32::MAX => SetupError::Child {
            step: Step::PreparePayload,
            what: "prepare the payload (session, terminal, capabilities, no_new_privs)".into(),
            source: io::Error::from_raw_os_error(m.value),
        },
        child::MSG_EXEC_ERROR => SetupError::Exec {
            program: views.program.to_owned(),
            source: io::Error::from_raw_os_error(m.value),
        },
        _ => SetupError::InitVanished,
    }
}

/// The error for a sandbox whose namespaces cannot be created (`e`: the errno of the clone), with
/// what to do about it.
pub fn namespaces_error(e: i32) -> SetupError {
    let hint = match e {
        libc::EPERM | libc::EACCES => {
            "unprivileged user namespaces are refused on this host (on Ubuntu 24.04: AppArmor's kernel.apparmor_restrict_unprivileged_userns; in a container: its seccomp profile); run `palisade doctor`"
        }
        libc::ENOSPC => "the user.max_user_namespaces limit is reached or 0; raise it with `sysctl user.max_user_namespaces=15000`",
        libc::ENOSYS => "the kernel has no clone3 (Linux 5.3 or newer is required)",
        libc::EINVAL => "the kernel lacks one of the namespaces palisade needs (user, mount, pid, net, ipc, uts, cgroup)",
        _ => "run `palisade doctor`",
    };
    SetupError::Namespaces {
        source: io::Error::from_raw_os_error(e),
        hint,
    }
}

fn socketpair() -> Result<(OwnedFd, OwnedFd), SetupError> {
    let (a, b) = sys::socketpair(libc::SOCK_STREAM).map_err(|e| os_err("socketpair", e))?;
    Ok((above2(a)?, above2(b)?))
}

/// What [`Running::wait`] watches besides the sandbox itself.
pub struct Watch<'a> {
    /// Where the payload's output goes. The loop never blocks on it: it stops reading the
    /// sandbox's pipes while the queue is full (see [`OutputQueue`]).
    pub output: &'a OutputQueue,
    /// With a CPU-time limit: how to read what the sandbox has used.
    pub cpu: Option<CpuWatch<'a>>,
    /// With a terminal: the caller's terminal, whose input is relayed into the pty and whose
    /// size the pty takes on `SIGWINCH` (the CLI's fd 0).
    pub terminal: Option<RawFd>,
    /// Signals to forward to the sandbox while waiting (`SIGWINCH` resizes the pty instead).
    pub signals: Option<&'a crate::host::SignalSource>,
    /// The most CPUs' worth of time the supervisor may spend answering refused calls, per unit of
    /// wall time (the sandbox's CPU quota, or 1).
    pub refusal_share: f64,
}

/// The state of the caller's input on its way into the sandbox (a pty, or the stdin pipe).
struct Input {
    /// Where it comes from: the caller's terminal or descriptor (`None` once at its end).
    from: Option<RawFd>,
    /// Read but not yet taken by the sandbox; at most [`INPUT_BUFFER`].
    pending: Vec<u8>,
}

impl Running {
    /// Which engine started the sandbox: `in-process`, `exec` or `template`.
    pub fn engine(&self) -> &'static str {
        self.engine
    }

    /// The sandbox init's pid on the host.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A pidfd for the sandbox's init: readable once init has exited (for an event loop).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.pidfd.as_fd()
    }

    /// Something that kills the sandbox from any thread.
    pub fn killer(&self) -> Killer {
        Killer {
            pidfd: self.pidfd.clone(),
            cancelled: self.cancelled.clone(),
        }
    }

    /// The ids the payload runs with, and their host mapping.
    pub fn ids(&self) -> Ids {
        self.ids
    }

    /// What the plan did with the policy's protected paths.
    pub fn protection(&self) -> &crate::plan::Protection {
        &self.protection
    }

    /// Whether Landlock is enforced for this run (with which ABI and rights), or why not.
    pub fn landlock(&self) -> &LandlockState {
        &self.landlock
    }

    /// Takes the workspace's private tmpfs (its `upper` directory holds the changes) and the host
    /// directory under it. Read it only once [`Running::wait`] has returned: until then the
    /// sandbox writes it.
    pub fn take_workspace(&mut self) -> Option<(OwnedFd, plan::WorkspaceBase)> {
        self.workspace.take()
    }

    /// Takes the lease of the run's network namespace, when a template's pool lent it: drop it
    /// once the run is over and the egress proxy's listeners are closed, after saying
    /// [`crate::NetLease::unused`] if [`Outcome::made_no_socket`].
    pub fn take_net_lease(&mut self) -> Option<crate::zygote::NetLease> {
        self.net_lease.take()
    }

    /// Takes the supervisor's end of init's `go` socket, on which init, at its end, sends a
    /// descriptor of the run's mount namespace when the run left little in it (child.rs, step
    /// 21): while the socket is open, the namespace lives. Dropping the last reference to a
    /// mount namespace waits for an expedited RCU grace period (tens to hundreds of
    /// microseconds, every CPU interrupted), which init's own exit would otherwise wait for,
    /// before the run can be seen to end. Drop it once the run's report is out, off the caller's
    /// path.
    pub fn take_mount_ns(&mut self) -> Option<OwnedFd> {
        self.mount_ns.take()
    }

    pub(crate) fn lend_net(&mut self, lease: crate::zygote::NetLease) {
        self.net_lease = Some(lease);
    }

    /// Takes the egress proxy's listeners (bound inside the sandbox's network namespace), for the
    /// supervisor to serve; empty without network rules.
    pub fn take_egress(&mut self) -> Vec<(plan::SockSpec, OwnedFd)> {
        std::mem::take(&mut self.egress)
    }

    /// Takes the write end of the payload's stdin pipe ([`Stdin::Pipe`]); closing it is the
    /// payload's end of file. The caller writes from its own thread (a payload that does not read
    /// blocks that writer, never the supervisor's loop).
    pub fn take_stdin(&mut self) -> Option<File> {
        if self.loop_feeds_stdin {
            return None;
        }
        self.stdin_w.take()
    }

    /// The pty master (with a terminal), e.g. to resize it.
    pub fn pty(&self) -> Option<&File> {
        self.pty.as_ref()
    }

    /// Sends `sig` to the sandbox's init, which forwards it to the payload.
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        pidfd_signal(self.pidfd.as_raw_fd(), sig)
    }

    /// Kills the whole sandbox at once: init dies, and with it every process in its namespace.
    pub fn kill(&self) {
        let _ = self.signal(libc::SIGKILL);
    }

    /// Relays output and input until the sandbox's init has exited and its output is drained,
    /// then reaps init and returns what happened.
    ///
    /// Nothing in the loop blocks: every descriptor the supervisor writes to is non-blocking and
    /// its own, output goes into a bounded queue, and the deadline and CPU checks come round
    /// whatever the payload or the output's consumer does. With `cpu`, the whole sandbox is killed
    /// once its processes together (and the supervisor's work for them) have used the CPU-time
    /// limit.
    pub fn wait(mut self, w: Watch<'_>) -> Result<Outcome, SetupError> {
        // A payload that closes its stdin must not kill a library caller that does not ignore
        // SIGPIPE: the signal is blocked in this thread while it writes there.
        let _sigpipe = BlockedSigpipe::new();
        let cpu0 = sys::thread_cpu_time();
        let mut term = Termination::Vanished;
        let (mut out_n, mut err_n) = (0u64, 0u64);
        let mut buf = vec![0u8; 64 * 1024];
        let mut msg_open = true;
        let mut init_gone: Option<Instant> = None;
        let deadline = self.started + self.limits.timeout();
        let cap = self.limits.output_bytes;
        let mut limit_hit: Option<LimitHit> = None;
        let mut truncated = false;
        let cpu_limit = self.limits.cpu_time();
        let mut cpu_watch_lost = false;
        let mut cpu_next = w
            .cpu
            .as_ref()
            .map(|c| self.started + next_cpu_check(cpu_limit, Duration::ZERO, c.cpus + 1.0));
        let mut input = Input {
            from: if self.pty.is_some() {
                w.terminal
            } else {
                self.relay_from
            },
            pending: std::mem::take(&mut self.stdin_bytes),
        };
        let refusal_budget = REFUSAL_WINDOW.mul_f64(w.refusal_share.clamp(0.01, 64.0));
        let mut window = (Instant::now(), sys::thread_cpu_time());
        let mut refusals_paused_until: Option<Instant> = None;
        let mut refusals_throttled = 0u64;
        let mut refusal_cpu = Duration::ZERO;
        loop {
            let now = Instant::now();
            if let Some(t) = refusals_paused_until {
                if now >= t {
                    refusals_paused_until = None;
                    window = (now, sys::thread_cpu_time());
                }
            }
            let room = init_gone.is_some() || w.output.room() > 0;
            let out_fd = self
                .stdout
                .as_ref()
                .or(self.pty.as_ref())
                .map(|f| f.as_raw_fd());
            let err_fd = self.stderr.as_ref().map(|f| f.as_raw_fd());
            // Done once init is gone (every process of the sandbox died with it), its last
            // message is in, and the output is drained.
            if init_gone.is_some() && !msg_open && out_fd.is_none() && err_fd.is_none() {
                break;
            }
            if init_gone.is_some_and(|t| t.elapsed() > DRAIN_GRACE) {
                // Output still open past the grace: nothing of the sandbox is left to close it.
                break;
            }
            let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(10);
            let mut add = |fd: RawFd, events: i16| {
                pfds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                pfds.len() - 1
            };
            let i_out = out_fd.filter(|_| room).map(|fd| add(fd, libc::POLLIN));
            let i_err = err_fd.filter(|_| room).map(|fd| add(fd, libc::POLLIN));
            let i_room = (!room).then(|| add(w.output.room_fd(), libc::POLLIN));
            let i_msg = msg_open.then(|| add(self.msg.as_raw_fd(), libc::POLLIN));
            let i_pid = init_gone
                .is_none()
                .then(|| add(self.pidfd.as_raw_fd(), libc::POLLIN));
            let i_notify = match (&self.notify, refusals_paused_until) {
                (Some(n), None) => Some(add(n.as_raw_fd(), libc::POLLIN)),
                _ => None,
            };
            let input_to = if self.pty.is_some() {
                self.pty.as_ref().map(|f| f.as_raw_fd())
            } else {
                self.stdin_w.as_ref().map(|f| f.as_raw_fd())
            };
            let feeding = init_gone.is_none() && input_to.is_some();
            let i_in = match input.from {
                Some(fd) if feeding && input.pending.len() < INPUT_BUFFER => {
                    Some(add(fd, libc::POLLIN))
                }
                _ => None,
            };
            let i_to = match input_to {
                Some(fd) if feeding && !input.pending.is_empty() => Some(add(fd, libc::POLLOUT)),
                _ => None,
            };
            let i_sig = w.signals.map(|s| add(s.fd(), libc::POLLIN));
            // Until the deadline, the next look at the CPU time or the end of a refusal pause
            // (rounded up to whole ms); without end once the sandbox is over or already killed.
            let watching = limit_hit.is_none() && init_gone.is_none();
            let mut until = if watching {
                Some(cpu_next.map_or(deadline, |c| c.min(deadline)))
            } else {
                None
            };
            if let Some(t) = refusals_paused_until {
                until = Some(until.map_or(t, |u| u.min(t)));
            }
            if let Some(g) = init_gone {
                let end = g + DRAIN_GRACE;
                until = Some(until.map_or(end, |u| u.min(end)));
            }
            let wait_ms: c_int = match until {
                None => -1,
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
                }
            };
            let r = match sys::poll(&mut pfds, wait_ms) {
                Ok(n) => n,
                Err(libc::EINTR) => 0,
                Err(e) => {
                    self.kill();
                    return Err(os_err("poll", e));
                }
            };
            if watching {
                let now = Instant::now();
                if now >= deadline {
                    self.kill();
                    limit_hit = Some(LimitHit::Timeout);
                } else if let (Some(at), Some(c)) = (cpu_next, w.cpu.as_ref()) {
                    if now >= at {
                        // Charged: the supervisor's work the payload can make as large as it
                        // likes (answering refused calls, proxying). Relaying output is bounded
                        // by the output limit and not charged.
                        let ours = refusal_cpu;
                        let theirs = c.supervisor.map_or(Duration::ZERO, |f| f());
                        match (c.used)() {
                            Some(used) if used + ours + theirs >= cpu_limit => {
                                self.kill();
                                limit_hit = Some(LimitHit::CpuTime);
                            }
                            Some(used) => {
                                cpu_next = Some(
                                    now + next_cpu_check(
                                        cpu_limit,
                                        used + ours + theirs,
                                        c.cpus + 1.0,
                                    ),
                                )
                            }
                            None => {
                                cpu_next = None;
                                cpu_watch_lost = true;
                            }
                        }
                    }
                }
            }
            if r == 0 {
                continue;
            }
            let ready = |i: Option<usize>| i.map_or(0, |i| pfds[i].revents);
            if ready(i_pid) != 0 {
                init_gone = Some(Instant::now());
            }
            if ready(i_room) != 0 {
                sys::eventfd_clear(w.output.room_fd());
            }
            if ready(i_notify) & libc::POLLIN != 0 {
                let before = sys::thread_cpu_time();
                self.answer_refused_call();
                refusal_cpu += sys::thread_cpu_time().saturating_sub(before);
                let spent = sys::thread_cpu_time().saturating_sub(window.1);
                if window.0.elapsed() >= REFUSAL_WINDOW {
                    window = (Instant::now(), sys::thread_cpu_time());
                } else if spent >= refusal_budget {
                    refusals_paused_until = Some(window.0 + REFUSAL_WINDOW);
                    refusals_throttled += 1;
                }
            } else if ready(i_notify) != 0 {
                // No process of the sandbox runs under the filter any more.
                self.notify = None;
            }
            if ready(i_out) != 0 {
                let src = self
                    .stdout
                    .as_mut()
                    .or(self.pty.as_mut())
                    .expect("polled output exists");
                match src.read(&mut buf) {
                    Ok(0) => {
                        self.stdout = None;
                        self.pty = None;
                    }
                    Ok(n) => {
                        let take = take(n, cap, out_n + err_n);
                        w.output.push(Stream::Stdout, &buf[..take]);
                        out_n += take as u64;
                        truncated |= take < n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // EIO on a pty whose last slave closed.
                    Err(_) => {
                        self.stdout = None;
                        self.pty = None;
                    }
                }
            }
            if ready(i_err) != 0 {
                let src = self.stderr.as_mut().expect("polled stderr exists");
                match src.read(&mut buf) {
                    Ok(0) => self.stderr = None,
                    Ok(n) => {
                        let take = take(n, cap, out_n + err_n);
                        w.output.push(Stream::Stderr, &buf[..take]);
                        err_n += take as u64;
                        truncated |= take < n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => self.stderr = None,
                }
            }
            if ready(i_msg) != 0 {
                let mut b = [0u8; 16];
                match sys::read_full(self.msg.as_raw_fd(), &mut b) {
                    Ok(16) => {
                        let m = Msg::from_bytes(&b);
                        if m.kind == child::MSG_EXITED {
                            let st = m.value;
                            term = if libc::WIFSIGNALED(st) {
                                Termination::Signaled(libc::WTERMSIG(st))
                            } else {
                                Termination::Exited(libc::WEXITSTATUS(st))
                            };
                        }
                    }
                    _ => msg_open = false,
                }
            }
            if ready(i_sig) != 0 {
                while let Some(sig) = w.signals.and_then(|s| s.next()) {
                    match (sig, self.pty.as_ref(), w.terminal) {
                        (libc::SIGWINCH, Some(pty), Some(t)) => crate::host::copy_winsize(t, pty),
                        (libc::SIGWINCH, _, _) => {}
                        _ => {
                            let _ = self.signal(sig);
                        }
                    }
                }
            }
            if ready(i_in) != 0 {
                let fd = input.from.expect("polled input exists");
                let room = INPUT_BUFFER - input.pending.len();
                // One read after POLLIN: it does not block even on a descriptor that is not ours
                // (the caller's terminal keeps its own flags).
                let want = room.min(buf.len());
                match sys::read(fd, &mut buf[..want]) {
                    Ok(n) if n > 0 => input.pending.extend_from_slice(&buf[..n]),
                    Err(libc::EINTR) => {}
                    Ok(_) | Err(_) => input.from = None,
                }
            }
            if ready(i_to) != 0 {
                let fd = input_to.expect("polled input target exists");
                match sys::write(fd, &input.pending) {
                    Ok(n) if n > 0 => {
                        input.pending.drain(..n);
                    }
                    Ok(_) | Err(libc::EAGAIN) | Err(libc::EINTR) => {}
                    Err(_) => {
                        // The payload closed its end (EPIPE) or the pty hung up: drop the rest.
                        input = Input {
                            from: None,
                            pending: Vec::new(),
                        };
                        if self.pty.is_none() {
                            self.stdin_w = None;
                        }
                    }
                }
            }
            if self.loop_feeds_stdin && input.from.is_none() && input.pending.is_empty() {
                // All the input there will be was taken: the payload sees end of file.
                self.stdin_w = None;
            }
            if truncated && limit_hit.is_none() && init_gone.is_none() {
                // Past the cap: kill, then keep draining (and discarding) until the pipes close,
                // so that the supervisor's memory stays flat whatever the payload writes.
                self.kill();
                limit_hit = Some(LimitHit::Output);
            }
        }
        w.output.close();
        // Reap init; its rusage covers every process it reaped, i.e. all of the sandbox's.
        if init_gone.is_none() {
            // Only reached past the drain grace without init gone: it is killed now.
            self.kill();
        }
        let reaped = sys::wait4(self.pid);
        self.done = true;
        let (_, ru) = reaped.map_err(|e| os_err("wait4", e))?;
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        let cancelled = limit_hit.is_none() && self.cancelled.load(Ordering::SeqCst);
        Ok(Outcome {
            termination: term,
            limit_hit,
            output_truncated: truncated,
            wall: self.started.elapsed(),
            user_cpu: tv(ru.ru_utime),
            system_cpu: tv(ru.ru_stime),
            max_rss: ru.ru_maxrss as u64 * 1024,
            stdout_bytes: out_n,
            stderr_bytes: err_n,
            cpu_watch_lost,
            denied: std::mem::take(&mut self.denied),
            cancelled,
            supervisor_cpu: sys::thread_cpu_time().saturating_sub(cpu0) + self.setup_cpu,
            refusals_throttled,
            attempts: std::mem::take(&mut self.attempts),
            attempts_dropped: self.attempts_dropped,
            made_no_socket: self.watch_sockets && self.sockets_made == 0,
        })
    }

    /// Takes one refused call from the seccomp listener, records it and makes it fail with the
    /// filter's errno. The call never runs; a caller that died meanwhile is simply skipped.
    fn answer_refused_call(&mut self) {
        let Some(listener) = self.notify.as_ref().map(|f| f.as_raw_fd()) else {
            return;
        };
        let Ok(n) = sys::seccomp_notif_recv(listener) else {
            return;
        };
        match crate::seccomp::watched(n.nr, n.arch, &n.args) {
            Some(crate::seccomp::Watched::Connect) => {
                // Recorded only if the caller is still the one that called (its pid not
                // reused), then the kernel runs the call and decides it.
                if let Some(a) =
                    read_attempt(&n).filter(|_| sys::seccomp_notif_valid(listener, n.id))
                {
                    self.record_attempt(a);
                }
                let _ = sys::seccomp_notif_continue(listener, n.id);
                return;
            }
            Some(crate::seccomp::Watched::Socket) => {
                // Counted whether or not the call then succeeds: a socket may have been made.
                self.sockets_made += 1;
                let _ = sys::seccomp_notif_continue(listener, n.id);
                return;
            }
            None => {}
        }
        let (name, errno) = crate::seccomp::answer(n.nr, n.arch, &n.args);
        // Recorded before the answer: until then the caller waits in the call, so its pid can
        // still be looked up (a short-lived child would be gone right after).
        record_refusal(&mut self.denied, name, errno, || inner_pid(n.pid));
        let _ = sys::seccomp_notif_fail(listener, n.id, errno);
    }
}

impl Running {
    /// Counts an attempt: its destination's entry, or a new one while there is room. The DNS
    /// stub's own address is left out (its lookups are listed by name).
    fn record_attempt(&mut self, a: Attempt) {
        let stub = a.protocol == "udp"
            && a.port == palisade_policy::net::DNS_PORT
            && a.address == std::net::IpAddr::from([127, 0, 0, 1]);
        if stub {
            return;
        }
        if let Some(x) = self
            .attempts
            .iter_mut()
            .find(|x| (x.address, x.port, x.protocol) == (a.address, a.port, a.protocol))
        {
            x.count += 1;
        } else if self.attempts.len() < MAX_ATTEMPTS {
            self.attempts.push(a);
        } else {
            self.attempts_dropped += 1;
        }
    }
}

/// Adds one refused call to the list: every call keeps its own entry; a call's open-ended details
/// (`socket (family N)`) are kept up to [`MAX_DETAILS_PER_CALL`] and folded into `CALL (other)`
/// past that.
fn record_refusal(
    denied: &mut Vec<DeniedCall>,
    name: String,
    errno: i32,
    pid: impl FnOnce() -> u32,
) {
    let call = name.split(" (").next().unwrap_or(&name).to_owned();
    let name = if name.len() > call.len()
        && !denied.iter().any(|d| d.name == name)
        && denied
            .iter()
            .filter(|d| d.name.len() > call.len() && d.name.starts_with(&format!("{call} (")))
            .count()
            >= MAX_DETAILS_PER_CALL
    {
        format!("{call} (other)")
    } else {
        name
    };
    if let Some(d) = denied.iter_mut().find(|d| d.name == name) {
        d.count += 1;
    } else {
        denied.push(DeniedCall {
            name,
            count: 1,
            first_pid: pid(),
            errno,
        });
    }
}

/// How many of `n` new output bytes fit under the output cap, `used` bytes being relayed already.
fn take(n: usize, cap: u64, used: u64) -> usize {
    n.min(cap.saturating_sub(used).min(usize::MAX as u64) as usize)
}

/// SIGPIPE blocked in the calling thread while this lives; one that arrived meanwhile (a payload
/// that closed its stdin while we wrote) is taken and dropped before the old mask comes back.
struct BlockedSigpipe {
    old: sys::SigSet,
}

impl BlockedSigpipe {
    fn new() -> BlockedSigpipe {
        // pthread_sigmask fails only for an invalid `how`; the old mask is then the empty set.
        let old = sys::thread_block(&sys::SigSet::of(&[libc::SIGPIPE]))
            .unwrap_or_else(|_| sys::SigSet::empty());
        BlockedSigpipe { old }
    }
}

impl Drop for BlockedSigpipe {
    fn drop(&mut self) {
        sys::take_pending(libc::SIGPIPE);
        sys::thread_set_mask(&self.old);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
            let _ = sys::waitpid(self.pid, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_mapped_id_exists_only_where_a_map_covers_it() {
        assert!(id_in_map(
            "         0          0 4294967295\n",
            ROOT_MAPPED_ID
        ));
        assert!(!id_in_map(
            "         0       1000          1\n",
            ROOT_MAPPED_ID
        ));
        assert!(!id_in_map("", ROOT_MAPPED_ID));
        assert!(id_in_map(
            "0 100000 65536\n2147000000 5 1\n",
            ROOT_MAPPED_ID
        ));
    }

    #[test]
    fn cpu_checks_are_spaced_by_what_is_left_of_the_budget() {
        let s = Duration::from_secs;
        // 10 s left on 2 CPUs: nothing can run out in under 5 s.
        assert_eq!(next_cpu_check(s(10), Duration::ZERO, 2.0), s(5));
        // Half a CPU of quota drains 1 s of budget in 2 s.
        assert_eq!(next_cpu_check(s(3), s(2), 0.5), s(2));
        // Near or past the limit: the shortest interval, never zero (no busy loop).
        assert_eq!(next_cpu_check(s(1), s(1), 2.0), CPU_CHECK_MIN);
        assert_eq!(next_cpu_check(s(1), s(5), 2.0), CPU_CHECK_MIN);
        assert_eq!(next_cpu_check(s(1), Duration::ZERO, 0.0), s(100));
    }
}
