//! Per-run cgroups for palisade, on cgroup v2 or v1, behind one trait.
//!
//! A run gets its own cgroup under a palisade parent (`palisade/` at the root of each hierarchy for
//! root, `palisade/user-UID/` once root has delegated it to a user with
//! [`delegate`]). The sandbox's init joins it before the payload starts, so every process of the
//! sandbox is inside; the limits hold for all of them together, and the accounting (peak memory, OOM
//! kills) covers all of them. The cgroup is removed after the run. Run cgroups left by a killed
//! supervisor are removed by a later one, once per process ([`Manager::clean_stale_once`]); who
//! owns a run cgroup is decided by a lock its supervisor holds, not by a pid, so supervisors in
//! different pid namespaces sharing one cgroupfs never take each other's runs for stale (the
//! protocol, and why a lock: the `owner` module).
//!
//! What a run's cgroup does not hold within its memory ceiling on a given host (socket buffers on
//! cgroup v1, say) is listed by [`RunCgroup::gaps`], for the report.
//!
//! A session's execs (programs started one after another inside one running sandbox) can each
//! have a child of the run's cgroup ([`RunCgroup::exec_cgroup`], the `exec` module): the run's
//! limits hold over them together, and each counts its own OOM kills.
//!
//! A memory cgroup removed while pages are still charged to it stays in the kernel with its
//! kernel memory: past a mark, a run's gives back its pages before it goes (the `held` module).
//!
//! File writes plus two system calls through rustix (`flock`, `getrandom`); the root of the
//! hierarchies is injectable, so the writers and the cleanup are tested on a temporary directory.
#![forbid(unsafe_code)]

mod exec;
mod held;
mod owner;
mod v1;
mod v2;

use std::io;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub use exec::{
    exec_memory_ceiling, EXECS, EXEC_ROOM_MAX, EXEC_ROOM_MIN, IDLE_EXEC_CGROUPS, MADE_EXEC_CGROUPS,
    MAX_EXEC_CGROUPS, MAX_EXEC_CGROUPS_IN_PROCESS,
};
pub use held::{set_give_back_above, GIVE_BACK_ABOVE};
pub use v1::V1;
pub use v2::{PROCS_LEAF, V2};

/// What a run's cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory ceiling in bytes for all processes together; swap is disabled.
    pub memory_bytes: u64,
    /// Processes and threads, all together.
    pub pids: u64,
    /// CPU time per 100 ms period, in µs, for all processes together (e.g. 50000 = half a CPU);
    /// `None` for no quota.
    pub cpu_quota_us: Option<u64>,
}

/// The CFS period palisade uses for CPU quotas, in µs.
pub const CPU_PERIOD_US: u64 = 100_000;

/// What the cgroup saw of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Peak memory of the whole sandbox, in bytes, where the kernel keeps it.
    pub memory_peak: Option<u64>,
    /// Processes the kernel's OOM killer killed in this cgroup.
    pub oom_kills: u64,
    /// Most processes and threads alive at once, where the kernel keeps it (`pids.peak`).
    pub pids_peak: Option<u64>,
    /// The CPU quota that was written (µs per 100 ms period), if the host has the cpu controller.
    pub cpu_quota_us: Option<u64>,
    /// CPU time of every process that ever ran in the cgroup, those the kernel reaped itself at a
    /// kill included.
    pub cpu: Option<CpuUsage>,
    /// Peak of the socket buffers (TCP, UDP) where the kernel keeps them in a counter of their own,
    /// outside `memory_peak`: cgroup v1's `memory.kmem.tcp`. `None` on v2, where they are part of
    /// `memory_peak`, and where they are not accounted at all (see [`RunCgroup::gaps`]).
    pub socket_memory_peak: Option<u64>,
}

/// Something the run's cgroup does not hold within its memory ceiling on this host: what escapes,
/// and what bounds it instead. For the report, so that a limit is never claimed wider than it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// What escapes the memory ceiling, e.g. `socket buffers`.
    pub what: &'static str,
    /// What bounds it instead, and why the cgroup cannot.
    pub bound: String,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.bound)
    }
}

/// CPU time a cgroup accounted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUsage {
    pub user: std::time::Duration,
    pub system: std::time::Duration,
}

/// Why a cgroup could not be used.
#[derive(Debug, Error)]
pub enum CgroupError {
    #[error(
        "no usable cgroup hierarchy with the memory and pids controllers under {}",
        root.display()
    )]
    NoHierarchy { root: PathBuf },
    #[error(
        "no cgroup delegated to uid {uid}: {}; as root, run `palisade cgroup-delegate --user \
         <name>` once (on systemd hosts, run palisade inside a session with a delegated user \
         slice)",
        tried.display()
    )]
    NotDelegated { uid: u32, tried: PathBuf },
    #[error(
        "palisade runs in cgroup {}, which is not delegated to uid {uid} (owned by the user and \
         marked with the user.delegate or trusted.delegate attribute): on cgroup v2 a user's run \
         cgroups must live under the user's own. On systemd hosts start palisade in a delegated \
         scope: `systemd-run --user --scope -p Delegate=yes palisade run …`; elsewhere, as root, \
         run `palisade cgroup-delegate --user <name>` once and start the user's palisade from a \
         process moved into its leaf (as root: `echo PID > \
         /sys/fs/cgroup/palisade/user-UID/palisade-procs/cgroup.procs`)",
        own.display()
    )]
    NotDelegatedV2 { uid: u32, own: PathBuf },
    #[error(
        "cgroup {} does not offer the {missing} controller(s) to its children; enable them in the \
         parent's cgroup.subtree_control (on systemd: `Delegate=memory pids cpu` for the unit)",
        path.display()
    )]
    MissingControllers { path: PathBuf, missing: String },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(crate) fn io_at<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_at("write", path))
}

/// A hierarchy palisade can create run cgroups in.
pub trait Manager: Send + Sync {
    /// `"v1"` or `"v2"`, for the report.
    fn version(&self) -> &'static str;
    /// Creates the cgroup of one run, with `limits` written, under a name of its own
    /// (`run-PID-TOKEN-SEQ`), locked by this process until it is removed.
    fn create(&self, limits: &CgroupLimits) -> Result<Box<dyn RunCgroup>, CgroupError>;
    /// Removes the run cgroups whose supervisor is provably gone (nobody holds their lock), in
    /// whatever pid namespace it ran, and returns them. Reads the whole palisade parent: on the
    /// way to a run, call [`Manager::clean_stale_once`].
    fn clean_stale(&self) -> Vec<PathBuf>;
    /// [`Manager::clean_stale`] the first time it is called for this parent in this process;
    /// nothing after that.
    fn clean_stale_once(&self);
}

/// The cgroup of one run. Dropping it removes it (it must be empty by then).
pub trait RunCgroup: Send {
    /// Moves process `pid` (the sandbox's init, before the payload starts) into the cgroup.
    fn join(&self, pid: i32) -> Result<(), CgroupError>;
    /// Files through which a process can move itself in by writing "0" (v1 `tasks`), which is
    /// much cheaper for the kernel than [`RunCgroup::join`]; empty where that is not possible.
    fn self_join_files(&self) -> Result<Vec<std::fs::File>, CgroupError> {
        Ok(Vec::new())
    }
    /// What the cgroup accounted.
    fn stats(&self) -> CgroupStats;
    /// CPU time (user plus system) of the cgroup so far, from one small file read; `None` where
    /// the host gives palisade no CPU accounting. Cheap enough to call while the run goes on.
    fn cpu_used(&self) -> Option<std::time::Duration>;
    /// The CPU quota written for this run (µs per period), if one was: a requested quota the host
    /// could not apply (no cpu controller for palisade) is `None`.
    fn cpu_quota_us(&self) -> Option<u64>;
    /// What this run's cgroup does not hold within its memory ceiling on this host, each with what
    /// bounds it instead; empty where the ceiling covers everything it is documented to.
    fn gaps(&self) -> &[Gap];
    /// Removes the cgroup. One the kernel still reports busy a few milliseconds after its
    /// processes are gone is not waited for: this process keeps it locked and retries at its next
    /// run, or, if it exits first, the next supervisor's stale cleanup removes it.
    fn remove(&mut self) -> Result<(), CgroupError>;
    /// A cgroup of its own, under this one, for one program started inside the running sandbox
    /// (a session's exec), so that what the kernel counts (an OOM kill) is that program's alone
    /// (the `exec` module): an ended exec's, once nothing runs in it, or a new one. `Ok(None)`
    /// where this run cannot give one: the host's hierarchy, or [`MAX_EXEC_CGROUPS`] still
    /// there or [`MADE_EXEC_CGROUPS`] made, none of them free.
    fn exec_cgroup(&self) -> Result<Option<Box<dyn ExecCgroup>>, CgroupError> {
        Ok(None)
    }
    /// Holds `bytes` of the run's memory for a process of the run's own (a session's agent
    /// writing a file) to have charged outside the exec cgroups, if the run has that much left
    /// beside the room its own processes need ([`exec_memory_ceiling`]) and what its processes
    /// and files hold: the execs' ceiling together is lowered to leave it, and later execs'
    /// ceilings count it, until the reservation is dropped. `Full` otherwise. A run with no
    /// exec cgroups (or no memory ceiling) holds nothing and refuses nothing.
    fn reserve_memory(&self, bytes: u64) -> Result<MemoryReservation, ReserveError> {
        let _ = bytes;
        Ok(MemoryReservation::none())
    }
}

/// Room in a run's memory held for bytes about to be charged to the run outside its exec cgroups
/// (see [`RunCgroup::reserve_memory`]); dropping it gives the room back.
pub struct MemoryReservation {
    pub(crate) held: Option<(std::sync::Arc<exec::Children>, u64)>,
}

impl MemoryReservation {
    /// One that holds nothing: the run has no ceiling to keep.
    pub fn none() -> MemoryReservation {
        MemoryReservation { held: None }
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        if let Some((c, bytes)) = self.held.take() {
            c.unreserve(bytes);
        }
    }
}

/// Why room could not be held ([`RunCgroup::reserve_memory`]).
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// The run has only `left` bytes left beside the room its own processes need.
    #[error("the run has {left} bytes of memory left")]
    Full { left: u64 },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// The cgroup of one exec of a session, under its run's (see [`RunCgroup::exec_cgroup`]): the
/// run's limits hold over it; it counts its own OOM kills. Dropping it hands its directory back
/// to the run, for a later exec to take once no process the exec left runs there (the count
/// starting again from zero), or to be removed (past [`IDLE_EXEC_CGROUPS`] ended ones, or with
/// the run).
pub trait ExecCgroup: Send + Sync {
    /// The directory's name, under the run's.
    fn name(&self) -> &str;
    /// Files, opened for writing and close-on-exec, into which the exec's first process writes
    /// `0` to move itself in before it starts the program (v1 `tasks`, v2 `cgroup.procs`): the
    /// kernel checks the credentials they were opened with, not the writer's.
    fn join_files(&self) -> Result<Vec<std::fs::File>, CgroupError>;
    /// OOM kills of processes in this cgroup so far.
    fn oom_kills(&self) -> u64;
    /// Whether it is shared with another exec that holds it (none could be made for this one:
    /// [`MAX_EXEC_CGROUPS`], [`MADE_EXEC_CGROUPS`], [`MAX_EXEC_CGROUPS_IN_PROCESS`]): its ceiling
    /// holds for both, and its OOM kills are theirs together.
    fn shared(&self) -> bool {
        false
    }
}

/// Makes a run's directories with `make` (one per hierarchy, each locked) under a fresh name,
/// starting over with another when a concurrent stale cleanup removed one between its creation
/// and its lock.
pub(crate) fn make_run<T>(
    mut make: impl FnMut(&str) -> Result<T, owner::MakeError>,
) -> Result<T, CgroupError> {
    owner::retry_pending();
    let mut name = String::new();
    for _ in 0..owner::ATTEMPTS {
        name = owner::next_name();
        match make(&name) {
            Ok(t) => return Ok(t),
            Err(owner::MakeError::Failed(e)) => return Err(e),
            Err(owner::MakeError::Raced) => {}
        }
    }
    Err(CgroupError::Io {
        op: "create",
        path: PathBuf::from(name),
        source: io::Error::other(format!(
            "a concurrent stale cleanup removed it {} times in a row",
            owner::ATTEMPTS
        )),
    })
}

/// What the kernel's boot options take out of every memory cgroup, from the `/proc/cmdline` text:
/// `cgroup.memory=nosocket` (socket buffers) and `cgroup.memory=nokmem` (kernel memory).
pub(crate) fn boot_gaps(cmdline: &str) -> Vec<Gap> {
    let opts: Vec<&str> = cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("cgroup.memory="))
        .flat_map(|v| v.split(','))
        .collect();
    let mut v = Vec::new();
    if opts.contains(&"nosocket") {
        v.push(Gap {
            what: "socket buffers",
            bound: "not charged to any memory cgroup (the kernel was booted with \
                    cgroup.memory=nosocket): only the host-wide net.ipv4.tcp_mem and udp_mem \
                    bound them"
                .into(),
        });
    }
    if opts.contains(&"nokmem") {
        v.push(Gap {
            what: "kernel memory",
            bound: "pipe and unix socket buffers, page tables and the kernel objects the code \
                    makes are not charged to the memory cgroup (the kernel was booted with \
                    cgroup.memory=nokmem)"
                .into(),
        });
    }
    v
}

/// [`boot_gaps`] of this host, read once.
pub(crate) fn host_boot_gaps() -> &'static [Gap] {
    static GAPS: std::sync::OnceLock<Vec<Gap>> = std::sync::OnceLock::new();
    GAPS.get_or_init(|| boot_gaps(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default()))
}

/// Finds the manager for this host and caller under `root` (normally `/sys/fs/cgroup`): v2 when
/// the unified hierarchy has the memory and pids controllers, else v1 with memory and pids
/// hierarchies. `uid` 0 uses `palisade/`, others `palisade/user-UID/` (see [`delegate`]).
pub fn detect(root: &Path, uid: u32) -> Result<Box<dyn Manager>, CgroupError> {
    if let Some(v2) = V2::detect(root, uid)? {
        return Ok(Box::new(v2));
    }
    if let Some(v1) = V1::detect(root, uid)? {
        return Ok(Box::new(v1));
    }
    Err(CgroupError::NoHierarchy {
        root: root.to_owned(),
    })
}

/// Delegates a palisade subtree to `uid`/`gid` (root only, once), the way systemd's
/// `Delegate=yes` does: the directory and the files a delegate needs (`cgroup.procs`, and on v2
/// `cgroup.subtree_control` and `cgroup.threads`) become the user's. Returns the directories.
pub fn delegate(root: &Path, uid: u32, gid: u32) -> Result<Vec<PathBuf>, CgroupError> {
    if let Some(dirs) = V2::delegate(root, uid, gid)? {
        return Ok(dirs);
    }
    if let Some(dirs) = V1::delegate(root, uid, gid)? {
        return Ok(dirs);
    }
    Err(CgroupError::NoHierarchy {
        root: root.to_owned(),
    })
}

/// Whether the host has any swap: `/proc/swaps` lists a device or file past its header line.
/// Unknown counts as yes, so that swap is turned off whenever in doubt.
pub(crate) fn host_has_swap() -> bool {
    match std::fs::read("/proc/swaps") {
        Ok(b) => b.split(|&c| c == b'\n').filter(|l| !l.is_empty()).count() > 1,
        Err(_) => true,
    }
}

/// Writes `value` to control file `name` of a run's directory.
pub(crate) fn write_in(dir: &owner::Owned, name: &str, value: &str) -> Result<(), CgroupError> {
    use std::io::Write;
    dir.open(name, true)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(io_at("write", &dir.path.join(name)))
}

/// The `oom_kill N` count from a v1 `memory.oom_control` or v2 `memory.events` file.
pub(crate) fn oom_kills(dir: &owner::Owned, name: &str) -> u64 {
    read_small(dir, name)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| keyed(&s, "oom_kill"))
        .unwrap_or(0)
}

/// Reads a run's accounting from its memory-peak, OOM-event and pids-peak files (their names
/// differ between v1 and v2, and on v1 the pids file is in another directory).
pub(crate) fn read_stats(
    memory: &owner::Owned,
    [peak, events]: [&str; 2],
    pids: &owner::Owned,
    pids_peak: &str,
    cpu_quota_us: Option<u64>,
    cpu: Option<CpuUsage>,
) -> CgroupStats {
    CgroupStats {
        memory_peak: read_number(memory, peak),
        oom_kills: oom_kills(memory, events),
        pids_peak: read_number(pids, pids_peak),
        cpu_quota_us,
        cpu,
        socket_memory_peak: None,
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines, e.g. v2 `cpu.stat`).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A number in a one-value cgroup file.
pub(crate) fn read_number(dir: &owner::Owned, name: &str) -> Option<u64> {
    std::str::from_utf8(&read_small(dir, name)?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A small cgroup file whole (at most 4 KiB, longer is `None`): one open and as few reads as it
/// takes, without the size lookup `std::fs::read` makes first (cgroup files report size 0).
pub(crate) fn read_small(dir: &owner::Owned, name: &str) -> Option<Vec<u8>> {
    read_upto(dir, name, 4096)
}

/// A cgroup file whole if it is shorter than `cap` bytes (`None` otherwise, or if it cannot be
/// read).
pub(crate) fn read_upto(dir: &owner::Owned, name: &str, cap: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = dir.open(name, false).ok()?;
    let mut buf = vec![0u8; cap];
    let mut n = 0;
    loop {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if n == buf.len() {
            return None;
        }
    }
    buf.truncate(n);
    Some(buf)
}

pub(crate) fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), CgroupError> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io_at("chown", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_options_that_take_memory_out_of_cgroups_are_gaps() {
        assert_eq!(boot_gaps("quiet console=ttyS0 psi=1"), vec![]);
        let g = boot_gaps("quiet cgroup.memory=nokmem,nosocket ro");
        let what: Vec<&str> = g.iter().map(|g| g.what).collect();
        assert_eq!(what, ["socket buffers", "kernel memory"]);
        assert!(
            g[0].to_string().contains("cgroup.memory=nosocket"),
            "{}",
            g[0]
        );
        assert_eq!(
            boot_gaps("cgroup.memory=nosocket")[0].what,
            "socket buffers"
        );
        assert_eq!(
            boot_gaps("xcgroup.memory=nosocket cgroup.memory=nobpf"),
            vec![]
        );
    }

    #[test]
    fn error_messages_read_as_one_line_with_the_fix() {
        let e = CgroupError::NotDelegatedV2 {
            uid: 1000,
            own: "/sys/fs/cgroup/user.slice".into(),
        }
        .to_string();
        assert!(!e.contains('\n') && !e.contains("  "), "{e}");
        assert!(
            e.contains("run `palisade cgroup-delegate --user <name>` once"),
            "{e}"
        );
        assert!(
            e.contains("(as root: `echo PID > /sys/fs/cgroup/palisade/user-UID/palisade-procs/"),
            "{e}"
        );
    }
}
