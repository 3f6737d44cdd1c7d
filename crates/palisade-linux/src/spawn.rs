//! The supervisor side: prepare the plan, `clone3` the sandbox's init into new namespaces, write
//! its id maps, relay its output, and collect how it ended.
//!
//! A [`Running`] sandbox owns every resource of one run (pidfd, pipes, pty master); dropping it
//! kills the sandbox. Nothing here is global: one process can hold many of them at once.

use crate::child::{self, ChildFds, Msg, Step};
use crate::error::SetupError;
use crate::landlock::LandlockState;
use crate::plan::{self, Ids};
use crate::sys;
use libc::c_int;
use palisade_policy::{Policy, Scratch};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// Host uid and gid that a root-launched sandbox's ids map to: never host root, and not an id a
/// normal system hands out (outside the ranges of `login.defs`, `/etc/subuid` and systemd's
/// container ranges, below 2^31 so signed-int tools cope).
pub const ROOT_MAPPED_ID: u32 = 2_147_000_000;

/// Namespaces the sandbox's init is cloned into. The cgroup namespace comes later: init unshares
/// it once it has been moved into the run's cgroup, so that this cgroup is the root it sees.
pub const NAMESPACES: u64 = sys::CLONE_NEWUSER
    | sys::CLONE_NEWNS
    | sys::CLONE_NEWPID
    | sys::CLONE_NEWNET
    | sys::CLONE_NEWIPC
    | sys::CLONE_NEWUTS;

/// What the payload's standard input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stdin {
    /// The supervisor's own standard input.
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
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
    pidfd: OwnedFd,
    msg: File,
    stdout: Option<File>,
    stderr: Option<File>,
    pty: Option<File>,
    started: Instant,
    ids: Ids,
    limits: palisade_policy::Limits,
    landlock: LandlockState,
    protection: crate::plan::Protection,
    /// The payload's seccomp listener: refused calls arrive here to be answered and recorded.
    notify: Option<OwnedFd>,
    denied: Vec<DeniedCall>,
    done: bool,
    /// The egress proxy's listeners, made inside the sandbox's network namespace.
    egress: Vec<(plan::SockSpec, OwnedFd)>,
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

/// At most this many distinct refused calls are listed (each with its count); more are counted
/// under the last entry, so a payload cannot grow the supervisor's memory through refusals.
const MAX_DENIED_KINDS: usize = 64;

fn io_err(op: &'static str) -> impl Fn(io::Error) -> SetupError {
    move |source| SetupError::Supervisor { op, source }
}

fn last_os(op: &'static str) -> SetupError {
    SetupError::Supervisor {
        op,
        source: io::Error::last_os_error(),
    }
}

/// A pipe whose ends are close-on-exec and numbered ≥ 3 (so the child can dup2 onto 0..2 freely).
fn pipe() -> Result<(OwnedFd, OwnedFd), SetupError> {
    let mut p = [0 as c_int; 2];
    // SAFETY: pipe2 fills the array with two new descriptors that we then own.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_os("pipe2"));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    Ok((above2(r)?, above2(w)?))
}

fn above2(fd: OwnedFd) -> Result<OwnedFd, SetupError> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor that we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(last_os("fcntl(F_DUPFD_CLOEXEC)"));
    }
    // SAFETY: `n` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn devnull() -> Result<OwnedFd, SetupError> {
    let f = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(io_err("open /dev/null"))?;
    above2(f.into())
}

/// The ids the payload gets, what they map to on the host, and (root only) the device and inode
/// of the scratch directory they were read from, which the plan must then mount.
fn choose_ids(policy: &Policy) -> Result<(Ids, Option<(u64, u64)>), SetupError> {
    // SAFETY: trivially safe id queries.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Root in a user namespace that lacks ROOT_MAPPED_ID (a rootless container, `unshare -r`)
    // cannot map the payload there; it takes the unprivileged path, mapping only itself.
    if euid != 0 || !root_mapped_id_exists() {
        if let Scratch::Host { path } = &policy.scratch {
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
                SetupError::NotWritable {
                    field: "--scratch",
                    path: path.clone(),
                    uid: euid,
                }
            })?;
            // SAFETY: access() with a NUL-terminated path.
            if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
                return Err(SetupError::NotWritable {
                    field: "--scratch",
                    path: path.clone(),
                    uid: euid,
                });
            }
        }
        return Ok((
            Ids {
                uid: euid,
                gid: egid,
                host_uid: euid,
                host_gid: egid,
                privileged: false,
            },
            None,
        ));
    }
    // Root: the payload is the scratch directory's owner inside (root for an ephemeral scratch),
    // mapped to ROOT_MAPPED_ID outside. The scratch is then idmapped through the same namespace,
    // so files written there land on disk owned by that owner, never by ROOT_MAPPED_ID.
    let (uid, gid, seen) = match &policy.scratch {
        Scratch::Ephemeral => (0, 0, None),
        Scratch::Host { path } => {
            let (_, meta) = plan::resolve_host("--scratch", path)?;
            (meta.uid(), meta.gid(), Some((meta.dev(), meta.ino())))
        }
    };
    Ok((
        Ids {
            uid,
            gid,
            host_uid: ROOT_MAPPED_ID,
            host_gid: ROOT_MAPPED_ID,
            privileged: true,
        },
        seen,
    ))
}

/// Whether ROOT_MAPPED_ID exists as a uid and a gid in this process's user namespace (always in
/// the initial one, whose maps cover every id).
fn root_mapped_id_exists() -> bool {
    let has =
        |file: &str| std::fs::read_to_string(file).is_ok_and(|m| id_in_map(&m, ROOT_MAPPED_ID));
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

fn write_proc(pid: i32, file: &'static str, data: &str) -> Result<(), SetupError> {
    std::fs::write(format!("/proc/{pid}/{file}"), data)
        .map_err(|source| SetupError::IdMap { file, source })
}

/// Called with the sandbox init's host pid after its namespaces exist, while init builds the
/// filesystem view, before the payload starts: it prepares the run's cgroup and either moves init
/// in itself (cgroup v2) or returns up to [`sys::MAX_FDS`] files (cgroup v1 `tasks`) through which
/// init moves itself in, which is much cheaper. Every process of the sandbox then starts inside.
pub type BeforeStart<'a> = &'a dyn Fn(i32) -> io::Result<Vec<File>>;

/// Starts `policy`'s command in a new sandbox and returns once it has been exec'd (or failed to).
pub fn spawn(
    policy: &Policy,
    stdin: Stdin,
    before_start: Option<BeforeStart<'_>>,
) -> Result<Running, SetupError> {
    let (ids, scratch_seen) = choose_ids(policy)?;
    let mut plan = plan::build(policy, ids, &plan::RealHost)?;
    // The ids came from the scratch directory's owner: the directory the plan mounts (and the child
    // checks again by device and inode) must be that same one, not one swapped in meanwhile.
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

    let (msg_r, msg_w) = pipe()?;
    let (go_w, go_r) = socketpair()?;
    let mut keep: Vec<c_int> = vec![msg_w.as_raw_fd(), go_r.as_raw_fd()];
    let mut child_side: Vec<OwnedFd> = Vec::new();
    let (stdio, out_r, err_r, pty_parent, pty_child) = if policy.tty {
        let null = devnull()?;
        let (a, b) = socketpair()?;
        keep.push(b.as_raw_fd());
        let n = null.as_raw_fd();
        child_side.push(null);
        ([n, n, n], None, None, Some(a), Some(b))
    } else {
        let (or, ow) = pipe()?;
        let (er, ew) = pipe()?;
        let input = match stdin {
            Stdin::Inherit => 0,
            Stdin::Null => {
                let n = devnull()?;
                let raw = n.as_raw_fd();
                child_side.push(n);
                raw
            }
        };
        let s = [input, ow.as_raw_fd(), ew.as_raw_fd()];
        child_side.push(ow);
        child_side.push(ew);
        (s, Some(or), Some(er), None, None)
    };

    // Root: open user-given sources here as detached trees (see plan::Source::in_supervisor).
    let mut trees: Vec<OwnedFd> = Vec::new();
    for s in plan.sources.iter_mut().filter(|s| s.in_supervisor) {
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
        // SAFETY: fd was just opened and is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
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
        let t = sys::open_tree(fd.as_raw_fd(), c"", flags).map_err(|e| hm(e, ""))?;
        // SAFETY: t was just created and is ours.
        let t = above2(unsafe { OwnedFd::from_raw_fd(t) })?;
        s.tree = t.as_raw_fd();
        keep.push(t.as_raw_fd());
        trees.push(t);
    }
    keep.sort_unstable();
    let fds = ChildFds {
        stdio,
        msg: msg_w.as_raw_fd(),
        go: go_r.as_raw_fd(),
        pty_sock: pty_child.as_ref().map_or(-1, |p| p.as_raw_fd()),
        keep,
    };

    let started = Instant::now();
    // SAFETY: the child branch calls child::init, which is async-signal-safe (see its module doc)
    // and never returns.
    let (pid, pidfd) = match unsafe { sys::clone3(NAMESPACES) } {
        Ok(sys::Forked::Child) => child::init(&mut plan, &fds),
        Ok(sys::Forked::Parent { pid, pidfd }) => (pid, pidfd),
        Err(e) => return Err(namespaces_error(e)),
    };
    // SAFETY: clone3 returned a new pidfd that we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((msg_w, go_r, pty_child, child_side));
    let mut running = Running {
        pid,
        pidfd,
        msg: File::from(msg_r),
        stdout: out_r.map(File::from),
        stderr: err_r.map(File::from),
        pty: None,
        started,
        ids,
        limits: policy.limits,
        landlock: plan.landlock.state(),
        protection: plan.protection.clone(),
        notify: None,
        denied: Vec::new(),
        done: false,
        egress: Vec::new(),
    };

    // The maps. Unprivileged, the kernel allows exactly one id mapped to ourselves, and only after
    // setgroups is denied (otherwise dropping a group could grant access, CVE-2014-8989).
    if ids.privileged {
        write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
        write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
        if plan.sources.iter().any(|s| s.idmap) {
            let ns = File::open(format!("/proc/{pid}/ns/user"))
                .map_err(io_err("open the sandbox's user namespace"))?;
            for s in plan.sources.iter().filter(|s| s.idmap) {
                let attrs = sys::MOUNT_ATTR_IDMAP | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
                sys::mount_setattr(s.tree, c"", libc::AT_EMPTY_PATH as u32 | libc::AT_RECURSIVE as u32, attrs, 0, ns.as_raw_fd())
                    .map_err(|e| SetupError::HostMount {
                        what: "an idmapped mount of",
                        path: s.path.to_string_lossy().into_owned().into(),
                        source: io::Error::from_raw_os_error(e),
                        hint: "; the file system must support idmapped mounts (ext4, xfs, btrfs, tmpfs on Linux 6.3+)",
                    })?;
            }
        }
    } else {
        write_proc(pid, "setgroups", "deny")?;
        write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
        write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
    }
    drop(trees);
    sys::write_all(go_w.as_raw_fd(), b"g").map_err(|e| SetupError::Supervisor {
        op: "start the sandbox",
        source: io::Error::from_raw_os_error(e),
    })?;
    // While init builds the view: the caller's hook (the cgroup), then "j", which init waits for
    // before it starts the payload.
    let files = match before_start {
        Some(hook) => hook(pid).map_err(|source| SetupError::Supervisor {
            op: "place the sandbox in its cgroup",
            source,
        })?,
        None => Vec::new(),
    };
    let raw: Vec<c_int> = files.iter().map(|f| f.as_raw_fd()).collect();
    // If init is gone already, sending fails; its own error message is then on the msg pipe, read
    // below, and is the one worth reporting.
    let _ = sys::send_fds(go_w.as_raw_fd(), b'j', &raw);
    drop(files);
    // go_w stays open until the payload has started: init checks it for a hang-up after
    // re-arming its parent-death signal (see child.rs, step 2).

    if let Some(sock) = pty_parent {
        let mut got = [-1 as c_int; sys::MAX_FDS];
        if let Ok((_, n)) = sys::recv_fds(sock.as_raw_fd(), &mut got) {
            // SAFETY: the kernel just installed these descriptors in our table; we own them.
            let mut owned: Vec<OwnedFd> = got[..n]
                .iter()
                .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
                .collect();
            running.pty = (!owned.is_empty()).then(|| File::from(owned.swap_remove(0)));
        }
    }
    let mut b = [0u8; 16];
    let n = sys::read_full(running.msg.as_raw_fd(), &mut b).unwrap_or(0);
    if n != 16 {
        return Err(SetupError::InitVanished);
    }
    let m = Msg::from_bytes(&b);
    if m.kind == child::MSG_STARTED {
        // Init sent the egress listeners while it set up, before the payload existed.
        let mut got = [-1 as c_int; sys::MAX_FDS];
        for chunk in plan.sockets.chunks(sys::MAX_FDS) {
            match sys::recv_fds(go_w.as_raw_fd(), &mut got) {
                Ok((b'n', n)) if n == chunk.len() => {
                    for (spec, &fd) in chunk.iter().zip(&got[..n]) {
                        // SAFETY: the kernel just installed these descriptors; we own them.
                        running
                            .egress
                            .push((*spec, unsafe { OwnedFd::from_raw_fd(fd) }));
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
        match sys::recv_fds(go_w.as_raw_fd(), &mut got) {
            Ok((b's', 1)) => {
                // SAFETY: the kernel just installed this descriptor in our table; we own it.
                running.notify = Some(unsafe { OwnedFd::from_raw_fd(got[0]) });
            }
            Ok(_) | Err(_) => {
                return Err(SetupError::Supervisor {
                    op: "receive the payload's seccomp listener",
                    source: io::Error::from_raw_os_error(libc::EPROTO),
                })
            }
        }
    }
    drop(go_w);
    match m.kind {
        child::MSG_STARTED => Ok(running),
        child::MSG_SETUP_ERROR => {
            let step = Step::from_u32(m.step);
            let what = match step {
                Some(Step::Op) => plan::describe(&plan, m.index as usize),
                Some(Step::OpenSource) | Some(Step::SourceChanged) => format!(
                    "open host path {}{}",
                    plan.sources
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
                Some(s) => format!("{s:?}"),
                None => format!("step {}", m.step),
            };
            Err(SetupError::Child {
                step: what,
                source: io::Error::from_raw_os_error(m.value),
            })
        }
        child::MSG_EXEC_ERROR if m.index == u32::MAX => Err(SetupError::Child {
            step: "prepare the payload (session, terminal, capabilities, no_new_privs)".into(),
            source: io::Error::from_raw_os_error(m.value),
        }),
        child::MSG_EXEC_ERROR => {
            let program = policy.command[0].clone();
            Err(SetupError::Exec {
                program,
                source: io::Error::from_raw_os_error(m.value),
            })
        }
        _ => Err(SetupError::InitVanished),
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
    let mut p = [0 as c_int; 2];
    // SAFETY: socketpair fills the array with two new descriptors that we then own.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            p.as_mut_ptr(),
        )
    } != 0
    {
        return Err(last_os("socketpair"));
    }
    // SAFETY: both were just created.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    Ok((above2(a)?, above2(b)?))
}

/// Where the payload's output goes.
pub struct Sinks<'a> {
    pub stdout: &'a mut dyn Write,
    pub stderr: &'a mut dyn Write,
    /// With a terminal: the caller's input, relayed into the pty (e.g. the supervisor's stdin).
    pub input: Option<c_int>,
    /// Signals to forward to the sandbox while waiting (SIGWINCH resizes the pty instead).
    pub signals: Option<&'a crate::host::ForwardedSignals>,
}

impl Running {
    /// The sandbox init's pid on the host.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The ids the payload runs with, and their host mapping.
    pub fn ids(&self) -> Ids {
        self.ids
    }

    /// Whether Landlock is enforced for this run (with which ABI and rights), or why not.
    /// What the plan did with the policy's protected paths.
    pub fn protection(&self) -> &crate::plan::Protection {
        &self.protection
    }

    pub fn landlock(&self) -> &LandlockState {
        &self.landlock
    }

    /// Takes the egress proxy's listeners (bound inside the sandbox's network namespace), for the
    /// supervisor to serve; empty without network rules.
    pub fn take_egress(&mut self) -> Vec<(plan::SockSpec, OwnedFd)> {
        std::mem::take(&mut self.egress)
    }

    /// The pty master (with a terminal), e.g. to resize it.
    pub fn pty(&self) -> Option<&File> {
        self.pty.as_ref()
    }

    /// Sends `sig` to the sandbox's init, which forwards it to the payload.
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal on our own pidfd with no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig,
                0usize,
                0u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Kills the whole sandbox at once: init dies, and with it every process in its namespace.
    pub fn kill(&self) {
        let _ = self.signal(libc::SIGKILL);
    }

    /// Relays output until the payload has exited and every output stream is closed, then reaps
    /// init and returns what happened.
    ///
    /// With `cpu`, the CPU-time limit is watched too: the whole sandbox is killed once its
    /// processes together have used it up.
    pub fn wait(
        mut self,
        sinks: Sinks<'_>,
        cpu: Option<CpuWatch<'_>>,
    ) -> Result<Outcome, SetupError> {
        let mut term = Termination::Vanished;
        let (mut out_n, mut err_n) = (0u64, 0u64);
        let mut buf = vec![0u8; 64 * 1024];
        let mut msg_open = true;
        let mut input = sinks.input;
        let deadline = self.started + self.limits.timeout();
        let cap = self.limits.output_bytes;
        let mut limit_hit: Option<LimitHit> = None;
        let mut truncated = false;
        let cpu_limit = self.limits.cpu_time();
        let mut cpu_watch_lost = false;
        let mut cpu_next = cpu
            .as_ref()
            .map(|w| self.started + next_cpu_check(cpu_limit, Duration::ZERO, w.cpus));
        loop {
            let pollin = |fd: c_int| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let out_fd = self
                .stdout
                .as_ref()
                .map(|f| f.as_raw_fd())
                .or(self.pty.as_ref().map(|f| f.as_raw_fd()));
            let err_fd = self.stderr.as_ref().map(|f| f.as_raw_fd());
            let msg_fd = msg_open.then(|| self.msg.as_raw_fd());
            let mut pfds: Vec<libc::pollfd> = [out_fd, err_fd, msg_fd]
                .into_iter()
                .flatten()
                .map(pollin)
                .collect();
            // Done once the payload's status is in and its output is drained; the caller's input
            // and signals alone do not keep the loop going.
            if pfds.is_empty() {
                break;
            }
            if let (Some(i), Some(_)) = (input, self.pty.as_ref()) {
                pfds.push(pollin(i));
            }
            if let Some(s) = sinks.signals {
                pfds.push(pollin(s.fd()));
            }
            let notify_fd = self.notify.as_ref().map(|f| f.as_raw_fd());
            if let Some(n) = notify_fd {
                pfds.push(pollin(n));
            }
            // Until the deadline or the next look at the CPU time (rounded up to whole ms), or
            // without end once the payload is done or already killed.
            let watching = limit_hit.is_none() && term == Termination::Vanished;
            let wait_ms: c_int = if !watching {
                -1
            } else {
                let until = cpu_next.map_or(deadline, |c| c.min(deadline));
                let left = until.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
            };
            // SAFETY: pfds is a valid array of pollfd of the given length.
            let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as _, wait_ms) };
            if watching {
                let now = Instant::now();
                if now >= deadline {
                    self.kill();
                    limit_hit = Some(LimitHit::Timeout);
                } else if let (Some(at), Some(w)) = (cpu_next, cpu.as_ref()) {
                    if now >= at {
                        match (w.used)() {
                            Some(used) if used >= cpu_limit => {
                                self.kill();
                                limit_hit = Some(LimitHit::CpuTime);
                            }
                            Some(used) => {
                                cpu_next = Some(now + next_cpu_check(cpu_limit, used, w.cpus))
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
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(SetupError::Supervisor {
                    op: "poll",
                    source: e,
                });
            }
            for p in pfds.iter().filter(|p| p.revents != 0) {
                if Some(p.fd) == notify_fd {
                    if p.revents & libc::POLLIN != 0 {
                        self.answer_refused_call();
                    } else {
                        // No process of the sandbox runs under the filter any more.
                        self.notify = None;
                    }
                } else if Some(p.fd) == out_fd {
                    let src = self
                        .stdout
                        .as_mut()
                        .or(self.pty.as_mut())
                        .expect("polled output exists");
                    match src.read(&mut buf) {
                        Ok(0) | Err(_) => {
                            // EOF (or EIO on a pty whose last slave closed).
                            self.stdout = None;
                            self.pty = None;
                        }
                        Ok(n) => {
                            let take = relay(&mut *sinks.stdout, &buf[..n], cap - (out_n + err_n));
                            out_n += take as u64;
                            truncated |= take < n;
                        }
                    }
                } else if Some(p.fd) == err_fd {
                    let src = self.stderr.as_mut().expect("polled stderr exists");
                    match src.read(&mut buf) {
                        Ok(0) | Err(_) => self.stderr = None,
                        Ok(n) => {
                            let take = relay(&mut *sinks.stderr, &buf[..n], cap - (out_n + err_n));
                            err_n += take as u64;
                            truncated |= take < n;
                        }
                    }
                } else if p.fd == self.msg.as_raw_fd() {
                    let mut b = [0u8; 16];
                    match sys::read_full(p.fd, &mut b) {
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
                } else if Some(p.fd) == sinks.signals.map(|s| s.fd()) {
                    while let Some(sig) = sinks.signals.and_then(|s| s.next()) {
                        match (sig, self.pty.as_ref(), input) {
                            (libc::SIGWINCH, Some(pty), Some(i)) => {
                                crate::host::copy_winsize(i, pty)
                            }
                            (libc::SIGWINCH, _, _) => {}
                            _ => {
                                let _ = self.signal(sig);
                            }
                        }
                    }
                } else if Some(p.fd) == input {
                    // SAFETY: reading into our buffer from the caller's input descriptor.
                    let n = unsafe { libc::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) };
                    if n <= 0 {
                        input = None;
                    } else if let Some(pty) = self.pty.as_mut() {
                        let _ = pty.write_all(&buf[..n as usize]);
                    }
                }
            }
            if truncated && limit_hit.is_none() && term == Termination::Vanished {
                // Past the cap: kill, then keep draining (and discarding) until the pipes close,
                // so that the supervisor's memory stays flat whatever the payload writes.
                self.kill();
                limit_hit = Some(LimitHit::Output);
            }
        }
        // Reap init; its rusage covers every process it reaped, i.e. all of the sandbox's.
        let mut st = 0;
        // SAFETY: an all-zero rusage is valid to be overwritten.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting for our own child with valid out-pointers.
        let r = unsafe { libc::wait4(self.pid, &mut st, 0, &mut ru) };
        self.done = true;
        if r < 0 {
            return Err(last_os("wait4"));
        }
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
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
        let (name, errno) = crate::seccomp::answer(n.nr, n.arch, &n.args);
        // Recorded before the answer: until then the caller waits in the call, so its pid can
        // still be looked up (a short-lived child would be gone right after).
        if let Some(d) = self.denied.iter_mut().find(|d| d.name == name) {
            d.count += 1;
        } else if self.denied.len() < MAX_DENIED_KINDS {
            self.denied.push(DeniedCall {
                name,
                count: 1,
                first_pid: inner_pid(n.pid),
                errno,
            });
        } else if let Some(last) = self.denied.last_mut() {
            last.count += 1;
        }
        let _ = sys::seccomp_notif_fail(listener, n.id, errno);
    }
}

/// Writes at most `room` bytes of `data` to `sink` and returns how many it took. A sink that
/// fails (a closed terminal, a full disk) does not stop the run: the bytes are counted as relayed.
fn relay(sink: &mut dyn Write, data: &[u8], room: u64) -> usize {
    let take = data.len().min(room.min(usize::MAX as u64) as usize);
    let _ = sink.write_all(&data[..take]).and_then(|_| sink.flush());
    take
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
            let mut st = 0;
            // SAFETY: reaping our own child after killing it.
            unsafe { libc::waitpid(self.pid, &mut st, 0) };
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
