//! cgroup v2: one unified hierarchy; the palisade parent enables the memory and pids controllers
//! for its children.
//!
//! Socket buffers (TCP, UDP) are charged to the socket's memory cgroup by the kernel's design and
//! count against `memory.max` with everything else, unless the kernel was booted with
//! `cgroup.memory=nosocket`. But a buffer received in softirq (on loopback, inside the sender's
//! system call) is charged with an atomic allocation, which the kernel never fails: it goes past
//! `memory.max`, and only the next allocation in the cgroup in process context reclaims or calls
//! the OOM killer (in the VM matrix's 6.12 guest: a 355 MB peak under 256 MiB, then the kill).
//! [`RunCgroup::gaps`] says both.

use crate::*;
use rustix::io::Errno;

/// The v2 manager: the palisade parent in the unified hierarchy.
pub struct V2 {
    base: PathBuf,
}

fn unified(root: &Path) -> Option<PathBuf> {
    // A pure v2 host mounts the hierarchy at the root; a hybrid one at `unified/`.
    for p in [root.to_owned(), root.join("unified")] {
        let Ok(ctrls) = std::fs::read_to_string(p.join("cgroup.controllers")) else {
            continue; // a hybrid host's root is a tmpfs of mount points
        };
        let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
        if has("memory") && has("pids") {
            return Some(p);
        }
    }
    None
}

/// Enables memory and pids (required) and cpu (where offered) for the children of `dir`.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let cur = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let avail = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let on = |c: &str| cur.split_whitespace().any(|x| x == c);
    let offered = |c: &str| avail.split_whitespace().any(|x| x == c);
    let missing: Vec<&str> = REQUIRED.into_iter().filter(|c| !offered(c)).collect();
    if !missing.is_empty() {
        return Err(CgroupError::MissingControllers {
            path: dir.to_owned(),
            missing: missing.join(" "),
        });
    }
    // cpu is taken where the hierarchy offers it (a quota is then written and reported).
    let want: Vec<String> = REQUIRED
        .into_iter()
        .chain(offered("cpu").then_some("cpu"))
        .filter(|c| !on(c))
        .map(|c| format!("+{c}"))
        .collect();
    if !want.is_empty() {
        write(&dir.join("cgroup.subtree_control"), &want.join(" "))?;
    }
    Ok(())
}

/// Controllers a run cgroup cannot do without.
const REQUIRED: [&str; 2] = ["memory", "pids"];

/// The leaf a user's supervisor moves the processes of its delegated cgroup into, so that the
/// cgroup itself may enable controllers for its children (v2 allows controllers only in cgroups
/// without processes of their own, the "no internal processes" rule).
pub const PROCS_LEAF: &str = "palisade-procs";

/// This process's cgroup in the unified hierarchy, from `/proc/self/cgroup` (`0::/path`).
fn own_cgroup(unified: &Path) -> Result<PathBuf, CgroupError> {
    let f = Path::new("/proc/self/cgroup");
    let text = std::fs::read_to_string(f).map_err(io_at("read", f))?;
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    Ok(unified.join(rel.trim_start_matches('/')))
}

/// Whether cgroup `dir` is delegated to `uid`: the directory and the files a delegate writes are
/// the user's, and the cgroup carries the delegation mark. Ownership alone is not enough: under
/// `user@UID.service` every cgroup is the user's, including scopes the user's systemd manages and
/// never delegated (a terminal's scope), whose processes palisade must not move.
///
/// `uid` is the host's uid; inside a user namespace (`unshare -r`) the owners `stat` shows are
/// this namespace's, so they are mapped out through `/proc/self/uid_map` before comparing.
fn delegated_to(dir: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    ["", "cgroup.procs", "cgroup.subtree_control"]
        .iter()
        .all(|f| {
            std::fs::metadata(dir.join(f)).is_ok_and(|m| outside_uid(&map, m.uid()) == Some(uid))
        })
        && marked_delegated(dir)
}

/// The uid the parent namespace knows `local` by, from a `uid_map` ("inside outside count" lines);
/// `None` for a uid the map leaves out (shown as the overflow uid).
fn outside_uid(map: &str, local: u32) -> Option<u32> {
    map.lines().find_map(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let (inside, outside, count) = (*f.first()?, *f.get(1)?, *f.get(2)?);
        let local = u64::from(local);
        (inside <= local && local < inside + count)
            .then(|| u32::try_from(outside + (local - inside)).ok())
            .flatten()
    })
}

/// The extended attributes systemd (251 and later) sets to `1` on the cgroup of a unit with
/// `Delegate=yes`: `trusted.delegate`, and `user.delegate`, which an unprivileged reader can see.
/// `palisade cgroup-delegate` sets both as well.
pub const DELEGATE_XATTRS: [&str; 2] = ["user.delegate", "trusted.delegate"];

fn marked_delegated(dir: &Path) -> bool {
    DELEGATE_XATTRS.iter().any(|name| {
        let mut b = [0u8; 8];
        matches!(rustix::fs::getxattr(dir, *name, &mut b), Ok(n) if &b[..n] == b"1")
    })
}

impl V2 {
    /// The v2 manager under `root`, or `None` without a unified hierarchy offering memory and pids.
    ///
    /// Root uses `palisade/` at the top of the hierarchy. A user needs palisade itself to run in a
    /// cgroup delegated to them (see [`V2::delegated`]): cgroup v2 lets a process move another only
    /// when it may write `cgroup.procs` of the two cgroups' common ancestor, so run cgroups must
    /// live under the user's own.
    pub fn detect(root: &Path, uid: u32) -> Result<Option<V2>, CgroupError> {
        let Some(u) = unified(root) else {
            return Ok(None);
        };
        if uid != 0 {
            return V2::delegated(&own_cgroup(&u)?, uid, std::process::id()).map(Some);
        }
        let b = u.join("palisade");
        if !b.join("cgroup.procs").exists() {
            enable_controllers(&u)?;
            std::fs::create_dir_all(&b).map_err(io_at("create", &b))?;
            enable_controllers(&b)?;
        }
        Ok(Some(V2 { base: b }))
    }

    /// For a user whose process `pid` is in cgroup `own`: runs go under `own`, which must be
    /// delegated to `uid` (systemd `Delegate=yes`, e.g. `systemd-run --user --scope -p
    /// Delegate=yes`, or `palisade cgroup-delegate` with the supervisor started inside). The first
    /// time, every process in `own` (ours and, say, the shell of the scope) moves into the leaf
    /// [`PROCS_LEAF`], so that `own` may enable controllers for its run cgroups; later runs find
    /// the process in the leaf already.
    pub fn delegated(own: &Path, uid: u32, pid: u32) -> Result<V2, CgroupError> {
        let own = match own.file_name() {
            Some(n) if n == PROCS_LEAF => own.parent().unwrap_or(own),
            _ => own,
        };
        if !delegated_to(own, uid) {
            return Err(CgroupError::NotDelegatedV2 {
                uid,
                own: own.to_owned(),
            });
        }
        let procs = own.join("cgroup.procs");
        let there = std::fs::read_to_string(&procs).map_err(io_at("read", &procs))?;
        if !there.trim().is_empty() {
            let leaf = own.join(PROCS_LEAF);
            match std::fs::create_dir(&leaf) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io_at("create", &leaf)(e))
                }
                _ => {}
            }
            // One pid per write, as cgroupfs wants; a process that exited meanwhile is skipped.
            let dst = leaf.join("cgroup.procs");
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true) // a no-op on cgroupfs, where the kernel made the file
                .open(&dst)
                .map_err(io_at("open", &dst))?;
            let ours = pid.to_string();
            for p in there.split_whitespace() {
                use std::io::Write;
                match f.write_all(format!("{p}\n").as_bytes()) {
                    Ok(()) => {}
                    // The process exited meanwhile.
                    Err(e) if p != ours && Errno::from_io_error(&e) == Some(Errno::SRCH) => {}
                    Err(e) => return Err(io_at("move a process into", &dst)(e)),
                }
            }
        }
        enable_controllers(own)?;
        Ok(V2 {
            base: own.to_owned(),
        })
    }

    pub(crate) fn delegate(
        root: &Path,
        uid: u32,
        gid: u32,
    ) -> Result<Option<Vec<PathBuf>>, CgroupError> {
        let Some(u) = unified(root) else {
            return Ok(None);
        };
        enable_controllers(&u)?;
        let parent = u.join("palisade");
        std::fs::create_dir_all(&parent).map_err(io_at("create", &parent))?;
        enable_controllers(&parent)?;
        let d = parent.join(format!("user-{uid}"));
        std::fs::create_dir_all(&d).map_err(io_at("create", &d))?;
        chown(&d, uid, gid)?;
        for f in ["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"] {
            chown(&d.join(f), uid, gid)?;
        }
        for name in DELEGATE_XATTRS {
            rustix::fs::setxattr(&d, name, b"1", rustix::fs::XattrFlags::empty())
                .map_err(|e| io_at("mark as delegated", &d)(e.into()))?;
        }
        // The leaf the user's processes start in. Once the first run has enabled controllers on
        // `d`, no process can be placed in `d` itself any more (EBUSY: the "no internal
        // processes" rule), so the leaf is where every later login or service goes.
        let leaf = d.join(PROCS_LEAF);
        match std::fs::create_dir(&leaf) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io_at("create", &leaf)(e))
            }
            _ => {}
        }
        chown(&leaf, uid, gid)?;
        for f in ["cgroup.procs", "cgroup.threads"] {
            chown(&leaf.join(f), uid, gid)?;
        }
        Ok(Some(vec![d]))
    }
}

impl Manager for V2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, limits: &CgroupLimits) -> Result<Box<dyn RunCgroup>, CgroupError> {
        // A run from the start: if a write fails, dropping it removes the directory.
        let mut run = V2Run {
            dir: Some(make_run(|name| owner::make(&self.base.join(name)))?),
            quota: None,
            memory_bytes: limits.memory_bytes,
            exec: std::sync::Mutex::new(None),
        };
        let dir = run.dir().expect("just made");
        write_in(dir, "memory.max", &limits.memory_bytes.to_string())?;
        if dir.has("memory.swap.max") {
            write_in(dir, "memory.swap.max", "0")?;
        }
        write_in(dir, "pids.max", &limits.pids.to_string())?;
        if let (Some(q), true) = (limits.cpu_quota_us, dir.has("cpu.max")) {
            write_in(dir, "cpu.max", &format!("{q} {CPU_PERIOD_US}"))?;
            run.quota = Some(q);
        }
        Ok(Box::new(run))
    }

    fn clean_stale(&self) -> Vec<PathBuf> {
        owner::clean(&[&self.base], Some("cgroup.kill"))
    }

    fn clean_stale_once(&self) {
        if owner::once(&self.base) {
            self.clean_stale();
        }
    }
}

/// What a v2 run's memory ceiling does not hold on this host (see the module doc), computed once.
fn v2_gaps() -> &'static [Gap] {
    static GAPS: std::sync::OnceLock<Vec<Gap>> = std::sync::OnceLock::new();
    GAPS.get_or_init(|| gaps_for(host_boot_gaps()))
}

/// The v2 gaps given the boot options' ones: socket buffers overshoot `memory.max`, unless they
/// are not charged at all (`nosocket`, which says so itself).
fn gaps_for(boot: &[Gap]) -> Vec<Gap> {
    let mut v = boot.to_vec();
    if !boot.iter().any(|g| g.what == "socket buffers") {
        v.insert(
            0,
            Gap {
                what: "socket buffers",
                bound: "charged to the memory ceiling, but those received in softirq (loopback \
                        traffic included) are charged even past it, until an allocation in the \
                        sandbox reclaims them or brings the OOM kill"
                    .into(),
            },
        );
    }
    v
}

struct V2Run {
    /// The run's directory, locked; `None` once removed.
    dir: Option<owner::Owned>,
    quota: Option<u64>,
    /// The run's memory ceiling, bytes.
    memory_bytes: u64,
    /// The cgroups of a session's execs: not asked for yet, or made ready (`Some(Some)`), or
    /// found impossible in this run (`Some(None)`).
    exec: std::sync::Mutex<Option<Option<std::sync::Arc<exec::Children>>>>,
}

/// Rounds of moving the run's processes into its leaf before giving up on exec cgroups (each
/// round moves what it found; only a process started meanwhile makes another round).
const LEAF_ROUNDS: usize = 8;
/// Milliseconds the run may take to freeze before its processes move (each of its processes
/// stops at its next return to user space).
const FREEZE_POLLS: usize = 200;

impl V2Run {
    /// The run's exec cgroups: the first call moves the run's processes into a leaf and gives
    /// the memory controller to the run's children ([`V2Run::ready_children`]); if that fails, no
    /// exec of this run gets one, and the error says why once.
    fn children(&self) -> Result<Option<std::sync::Arc<exec::Children>>, CgroupError> {
        let mut st = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        let c = match &*st {
            Some(Some(c)) => c.clone(),
            Some(None) => return Ok(None),
            None => match self.ready_children() {
                Ok(c) => {
                    let c = std::sync::Arc::new(c);
                    *st = Some(Some(c.clone()));
                    c
                }
                Err(e) => {
                    *st = Some(None);
                    return Err(e);
                }
            },
        };
        drop(st);
        Ok(Some(c))
    }

    fn dir(&self) -> Option<&owner::Owned> {
        self.dir.as_ref()
    }

    /// Readies the run for exec cgroups (see the `exec` module): its processes (the sandbox's
    /// init and agent) move into the leaf [`PROCS_LEAF`], then the run's cgroup enables the
    /// memory controller for its children, which the kernel allows only once it holds no process
    /// itself. A process started meanwhile is moved in the next round.
    fn ready_children(&self) -> Result<exec::Children, CgroupError> {
        let dir = self.dir().ok_or_else(|| CgroupError::Io {
            op: "make an exec cgroup in",
            path: PathBuf::from("a removed run cgroup"),
            source: io::Error::from(io::ErrorKind::NotFound),
        })?;
        let leaf = dir.path.join(PROCS_LEAF);
        match rustix::fs::mkdirat(
            dir.dir_fd(),
            PROCS_LEAF,
            rustix::fs::Mode::from_raw_mode(0o700),
        ) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io_at("create", &leaf)(e.into())),
        }
        // Frozen while its processes move: none can exit and be reaped (the reaper, the
        // sandbox's init, is frozen too), so no pid read below can be reused by a process of
        // the host's before it is written.
        write_in(dir, "cgroup.freeze", "1")?;
        let r = self.move_into_leaf(dir, &leaf);
        let thawed = write_in(dir, "cgroup.freeze", "0");
        let c = r?;
        thawed?;
        Ok(c)
    }

    /// [`V2Run::ready_children`]'s moves, the run frozen.
    fn move_into_leaf(
        &self,
        dir: &owner::Owned,
        leaf: &Path,
    ) -> Result<exec::Children, CgroupError> {
        use std::io::Write;
        let mut frozen = false;
        for _ in 0..FREEZE_POLLS {
            let events = read_small(dir, "cgroup.events").unwrap_or_default();
            if keyed(&String::from_utf8_lossy(&events), "frozen") == Some(1) {
                frozen = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if !frozen {
            return Err(io_at("freeze", &dir.path)(io::Error::other(format!(
                "not frozen within {FREEZE_POLLS} ms"
            ))));
        }
        let to = format!("{PROCS_LEAF}/cgroup.procs");
        let mut dst = dir.open(&to, true).map_err(io_at("open", leaf))?;
        for _ in 0..LEAF_ROUNDS {
            // The sandbox's processes, bounded by its pids ceiling; read whole or not at all.
            let procs = read_upto(dir, "cgroup.procs", 1 << 20).ok_or_else(|| {
                io_at("read", &dir.path.join("cgroup.procs"))(io::Error::other(
                    "unreadable, or over 1 MiB",
                ))
            })?;
            let text = String::from_utf8_lossy(&procs);
            let pids: Vec<&str> = text.split_whitespace().collect();
            if pids.is_empty() {
                match write_in(dir, "cgroup.subtree_control", "+memory") {
                    Ok(()) => {
                        // Each child's own ceiling, set as it is handed out (`exec`'s text).
                        return exec::Children::new(
                            dir,
                            "memory.events",
                            "cgroup.procs",
                            Vec::new(),
                            Some(exec::Ceiling {
                                run: self.memory_bytes,
                                usage: "memory.current",
                                limit: "memory.max",
                            }),
                        );
                    }
                    // A process came in between: another round.
                    Err(CgroupError::Io { ref source, .. })
                        if Errno::from_io_error(source) == Some(Errno::BUSY) => {}
                    Err(e) => return Err(e),
                }
            }
            for p in pids {
                // One pid a write; a process that exited meanwhile is skipped.
                match dst.write_all(p.as_bytes()) {
                    Ok(()) => {}
                    Err(e) if Errno::from_io_error(&e) == Some(Errno::SRCH) => {}
                    Err(e) => return Err(io_at("move a process into", leaf)(e)),
                }
            }
        }
        Err(io_at("empty", &dir.path)(io::Error::other(format!(
            "processes kept coming in over {LEAF_ROUNDS} rounds of moving them into {PROCS_LEAF}"
        ))))
    }
}

/// A v2 run's `cpu.stat` (a few hundred bytes; read up to 64 KiB all the same: the CPU-time
/// watch rests on it).
/// Whether the unified hierarchy is mounted with `memory_localevents` (a flag of the whole
/// hierarchy, shown on each of its mounts): each cgroup's `memory.events` then counts its own
/// processes' events only. Read once.
fn local_events() -> bool {
    static LOCAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOCAL.get_or_init(|| {
        std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| mounted_local(&m))
    })
}

/// Whether a `cgroup2` mount in `mountinfo` has the `memory_localevents` super option.
fn mounted_local(mountinfo: &str) -> bool {
    mountinfo.lines().any(|l| {
        let Some((_, after)) = l.split_once(" - ") else {
            return false;
        };
        let mut f = after.split_whitespace();
        f.next() == Some("cgroup2")
            && f.nth(1)
                .is_some_and(|opts| opts.split(',').any(|o| o == "memory_localevents"))
    })
}

fn cpu_stat(dir: &owner::Owned) -> String {
    read_upto(dir, "cpu.stat", 64 << 10)
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

impl RunCgroup for V2Run {
    fn join(&self, pid: i32) -> Result<(), CgroupError> {
        let dir = self.dir().expect("not removed");
        write_in(dir, "cgroup.procs", &pid.to_string())
    }

    fn stats(&self) -> CgroupStats {
        let Some(dir) = self.dir() else {
            return CgroupStats::default();
        };
        let stat = cpu_stat(dir);
        let us = |k| keyed(&stat, k).map(std::time::Duration::from_micros);
        let cpu = us("user_usec").zip(us("system_usec"));
        let mut stats = read_stats(
            dir,
            ["memory.peak", "memory.events"],
            dir,
            "pids.peak",
            self.quota,
            cpu.map(|(user, system)| CpuUsage { user, system }),
        );
        // A hierarchy mounted with `memory_localevents` counts a kill only in the victim's own
        // cgroup, as v1 does: once the run's processes are in its leaf and its execs in theirs,
        // the run's total adds theirs.
        if local_events() {
            let exec = self.exec.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(Some(c)) = &*exec {
                stats.oom_kills += c.oom_total() + c.oom_kills_of(PROCS_LEAF);
            }
        }
        stats
    }

    fn cpu_quota_us(&self) -> Option<u64> {
        self.quota
    }

    /// From `cpu.stat`, which every v2 cgroup has, with or without the cpu controller.
    fn cpu_used(&self) -> Option<std::time::Duration> {
        keyed(&cpu_stat(self.dir()?), "usage_usec").map(std::time::Duration::from_micros)
    }

    fn gaps(&self) -> &[Gap] {
        v2_gaps()
    }

    /// The first one moves the run's processes into a leaf and gives the memory controller to
    /// the run's children ([`V2Run::ready_children`]); if that fails, no exec of this run gets
    /// one, and the error says why once.
    fn exec_cgroup(&self) -> Result<Option<Box<dyn ExecCgroup>>, CgroupError> {
        match self.children()? {
            Some(c) => c.make(),
            None => Ok(None),
        }
    }

    fn reserve_memory(&self, bytes: u64) -> Result<MemoryReservation, ReserveError> {
        match self.children()? {
            Some(c) => c.reserve(bytes),
            None => Ok(MemoryReservation::none()),
        }
    }

    fn remove(&mut self) -> Result<(), CgroupError> {
        match self.dir.take() {
            Some(d) => {
                let _ = write_in(&d, "cgroup.kill", "1");
                // Past the mark, what is still charged to it (and its children) is given back,
                // so that the kernel frees it with its directory (`crate::held`): once the
                // processes just killed are gone (a few milliseconds at most, as the removal
                // below would wait), or it would be removed as soon as they are, having given
                // nothing back.
                let parent = crate::held::parent_of(&d.path);
                if crate::held::over(crate::held::Count::V2(&parent)) {
                    for pause in std::iter::once(0).chain(owner::REMOVE_PAUSES_US) {
                        if pause > 0 {
                            std::thread::sleep(std::time::Duration::from_micros(pause));
                        }
                        if crate::held::no_process_in(d.dir_fd(), ".", true) {
                            break;
                        }
                    }
                    crate::held::give_back(d.dir_fd(), ".", true);
                }
                owner::remove(d, true).map(|_| ())
            }
            None => Ok(()),
        }
    }
}

impl Drop for V2Run {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_events_is_read_from_the_cgroup2_super_options() {
        let plain = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let local = "35 24 0:30 / /sys/fs/cgroup rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_localevents\n";
        // A v1 hierarchy's options are not the unified one's; a mount point named so is no option.
        let v1 = "40 24 0:33 / /sys/fs/cgroup/memory_localevents rw - cgroup cgroup rw,memory\n";
        assert!(!mounted_local(plain));
        assert!(mounted_local(local));
        assert!(!mounted_local(v1));
        assert!(mounted_local(&format!("{v1}{local}")));
    }

    #[test]
    fn owners_are_mapped_out_of_a_user_namespace() {
        let initial = "         0          0 4294967295\n";
        assert_eq!(outside_uid(initial, 1000), Some(1000));
        // `unshare -r` as uid 1000: root inside is 1000 outside; nobody else is mapped.
        let unshare = "         0       1000          1\n";
        assert_eq!(outside_uid(unshare, 0), Some(1000));
        assert_eq!(outside_uid(unshare, 65534), None);
        let ranges = "0 1000 1\n1 100000 65536\n";
        assert_eq!(outside_uid(ranges, 1), Some(100000));
        assert_eq!(outside_uid(ranges, 65536), Some(165535));
        assert_eq!(outside_uid(ranges, 65537), None);
        assert_eq!(outside_uid("", 0), None);
    }

    use super::*;

    #[test]
    fn v2_needs_memory_and_pids_controllers() {
        let r = std::env::temp_dir().join(format!("palisade-cg2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&r);
        std::fs::create_dir_all(&r).unwrap();
        std::fs::write(r.join("cgroup.controllers"), "cpu io").unwrap();
        assert!(V2::detect(&r, 0).unwrap().is_none());
        std::fs::write(r.join("cgroup.controllers"), "cpu io memory pids").unwrap();
        std::fs::write(r.join("cgroup.subtree_control"), "").unwrap();
        // What the kernel shows in the new child once the root enabled its controllers.
        std::fs::create_dir(r.join("palisade")).unwrap();
        std::fs::write(r.join("palisade/cgroup.controllers"), "memory pids cpu").unwrap();
        let m = V2::detect(&r, 0).unwrap().expect("detected");
        assert_eq!(
            std::fs::read_to_string(r.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        let run = m
            .create(&CgroupLimits {
                memory_bytes: 1 << 26,
                pids: 32,
                cpu_quota_us: None,
            })
            .unwrap();
        let names: Vec<String> = std::fs::read_dir(r.join("palisade"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("run-"))
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(owner::is_run_name(&names[0]), "{names:?}");
        let d = r.join("palisade").join(&names[0]);
        assert_eq!(
            std::fs::read_to_string(d.join("memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(std::fs::read_to_string(d.join("pids.max")).unwrap(), "32");
        std::fs::write(
            d.join("cpu.stat"),
            "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\nnr_periods 0\n",
        )
        .unwrap();
        assert_eq!(run.cpu_used(), Some(std::time::Duration::from_micros(2500)));
        assert_eq!(
            run.stats().cpu,
            Some(CpuUsage {
                user: std::time::Duration::from_micros(2000),
                system: std::time::Duration::from_micros(500)
            })
        );
        // A stale run (nobody holds it) goes, with a kill first; the live one stays.
        let dead = r.join("palisade/run-9-00000000deadbeef-3");
        std::fs::create_dir(&dead).unwrap();
        assert_eq!(m.clean_stale(), vec![dead.clone()]);
        assert!(d.is_dir());
        drop(run);
        std::fs::remove_dir_all(&r).unwrap();
    }
    #[test]
    fn v2_says_that_socket_buffers_can_overshoot_unless_they_are_not_charged_at_all() {
        let g = gaps_for(&[]);
        assert_eq!(g.len(), 1);
        assert!(g[0]
            .to_string()
            .starts_with("socket buffers: charged to the memory ceiling, but"));
        let nosocket = boot_gaps("cgroup.memory=nosocket,nokmem");
        let g = gaps_for(&nosocket);
        assert_eq!(
            g, nosocket,
            "not charged at all: the boot option's gap alone"
        );
    }

    #[test]
    fn a_hybrid_host_has_v2_under_unified() {
        // The root of a hybrid host is a tmpfs of mount points, with no cgroup files of its own.
        let r = std::env::temp_dir().join(format!("palisade-cg2h-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&r);
        std::fs::create_dir_all(r.join("unified")).unwrap();
        std::fs::write(r.join("unified/cgroup.controllers"), "").unwrap();
        assert_eq!(
            unified(&r),
            None,
            "an empty unified hierarchy is not v2 for palisade"
        );
        std::fs::write(r.join("unified/cgroup.controllers"), "cpu memory pids").unwrap();
        assert_eq!(unified(&r), Some(r.join("unified")));
        std::fs::remove_dir_all(&r).unwrap();
    }

    /// A delegated cgroup as a temporary directory owned by the test's own user.
    fn fake_delegated(tag: &str, controllers: &str, procs: &str) -> (PathBuf, u32) {
        use std::os::unix::fs::MetadataExt;
        let own = std::env::temp_dir().join(format!("palisade-cg2d-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&own);
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(own.join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(own.join("cgroup.procs"), procs).unwrap();
        rustix::fs::setxattr(&own, "user.delegate", b"1", rustix::fs::XattrFlags::empty())
            .expect("user xattrs on the temporary directory's file system");
        let uid = std::fs::metadata(&own).unwrap().uid();
        (own, uid)
    }

    #[test]
    fn a_user_runs_under_their_own_delegated_cgroup() {
        let (own, uid) = fake_delegated("ok", "cpu memory pids", "4242\n77\n");
        let m = V2::delegated(&own, uid, 77).unwrap();
        assert_eq!(m.base, own);
        // Every process of the delegated cgroup moved into the leaf, one pid per write.
        let leaf = own.join(PROCS_LEAF);
        assert_eq!(
            std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
            "4242\n77\n"
        );
        assert_eq!(
            std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        // A later run from the same process starts from the leaf and lands on the same parent.
        let again = V2::delegated(&leaf, uid, 77).unwrap();
        assert_eq!(again.base, own);
        std::fs::remove_dir_all(&own).unwrap();
    }

    #[test]
    fn a_cgroup_the_user_does_not_own_is_refused_with_the_fix() {
        let (own, uid) = fake_delegated("notours", "memory pids", "");
        let e = V2::delegated(&own, uid + 1, 77)
            .err()
            .expect("not ours")
            .to_string();
        assert!(
            e.contains("systemd-run --user --scope -p Delegate=yes"),
            "{e}"
        );
        assert!(
            !own.join(PROCS_LEAF).exists(),
            "nothing changed before the refusal"
        );
        std::fs::remove_dir_all(&own).unwrap();
    }

    #[test]
    fn a_cgroup_the_user_owns_but_nobody_delegated_is_refused() {
        // Like a terminal's scope under user@UID.service: the user's, but not delegated.
        let (own, uid) = fake_delegated("unmarked", "memory pids", "4242\n");
        rustix::fs::removexattr(&own, "user.delegate").unwrap();
        let e = V2::delegated(&own, uid, 77)
            .err()
            .expect("not delegated")
            .to_string();
        assert!(e.contains("Delegate=yes"), "{e}");
        assert!(!own.join(PROCS_LEAF).exists(), "a process was moved");
        std::fs::remove_dir_all(&own).unwrap();
    }

    #[test]
    fn a_delegation_without_the_memory_controller_is_refused() {
        let (own, uid) = fake_delegated("nomem", "cpu pids", "");
        let e = V2::delegated(&own, uid, 77)
            .err()
            .expect("no memory")
            .to_string();
        assert!(e.contains("memory") && e.contains("Delegate="), "{e}");
        std::fs::remove_dir_all(&own).unwrap();
    }
}
