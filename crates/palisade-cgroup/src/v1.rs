//! cgroup v1: one hierarchy per controller (`memory`, `pids`, `cpuacct`, and `cpu` where mounted),
//! each with a palisade parent. Hosts often mount `cpu` and `cpuacct` together (`cpu,cpuacct`, with
//! the two names as symbolic links): hierarchies are compared by their real path, so such a host
//! gets one directory per run there, not two.
//!
//! Detection runs before every sandbox, so it costs a few `statx` calls and nothing more.
//!
//! **Socket buffers.** v1 charges a socket's buffers to its memory cgroup only once
//! `memory.kmem.tcp.limit_in_bytes` has been written for that cgroup, and then to a counter of their
//! own (`memory.kmem.tcp.*`), not to `memory.limit_in_bytes`. Despite the name it holds every socket
//! that does protocol memory accounting, UDP as well as TCP: measured on 6.18, a sandbox looping
//! datagrams to 128 of its own UDP sockets pinned 1.07 GB under a 64 MiB ceiling without it, and
//! 64 MiB with it. So the limit is written, equal to the memory ceiling, and the report says that
//! the sandbox may hold twice the ceiling in all ([`RunCgroup::gaps`]). Where the file is missing
//! (the kernel deprecates it; a later one may drop it) or refuses the write, nothing per cgroup
//! bounds socket buffers on v1 (the per-namespace sysctls are minimums, `net.core.rmem_max` and
//! `net.ipv4.udp_mem` are host-wide, and the number of sockets is bounded only by processes times
//! open files), and the gap says so. Unix socket and pipe buffers are kernel memory, charged to
//! `memory.limit_in_bytes` itself (a unix socket flood is an OOM kill: measured).

use crate::*;
use std::time::Duration;

/// The v1 manager: the palisade parent in each hierarchy it uses.
pub struct V1 {
    memory: PathBuf,
    pids: PathBuf,
    /// CPU accounting (and the CPU-time limit that rests on it), where the host mounts cpuacct.
    cpuacct: Option<PathBuf>,
    /// The cpu hierarchy's palisade parent, for quotas, where the host mounts it (and, for a user,
    /// it is delegated). The same directory as `cpuacct` when the two are mounted together.
    cpu: Option<PathBuf>,
}

/// Hierarchies palisade cannot run without.
const REQUIRED: [&str; 2] = ["memory", "pids"];
/// Hierarchies palisade uses where the host mounts them.
const OPTIONAL: [&str; 2] = ["cpuacct", "cpu"];

/// Controller `ctrl`'s hierarchy under `root`, if it is mounted.
fn hierarchy(root: &Path, ctrl: &str) -> Option<PathBuf> {
    let h = root.join(ctrl);
    h.join("cgroup.procs").exists().then_some(h)
}

/// Whether two paths are one directory (`cpu` and `cpuacct` mounted together, the two names
/// being links to `cpu,cpuacct`).
fn same_dir(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

fn base(hier: &Path, uid: u32) -> PathBuf {
    let b = hier.join("palisade");
    if uid == 0 {
        b
    } else {
        b.join(format!("user-{uid}"))
    }
}

/// The palisade parent in `hier`: created for root, required to be delegated for a user.
fn parent(hier: &Path, uid: u32) -> Result<PathBuf, CgroupError> {
    let b = base(hier, uid);
    // Checked first: a failing mkdir on cgroupfs still takes the kernel's global cgroup lock.
    if b.join("cgroup.procs").exists() {
        Ok(b)
    } else if uid == 0 {
        std::fs::create_dir_all(&b).map_err(io_at("create", &b))?;
        Ok(b)
    } else {
        Err(CgroupError::NotDelegated { uid, tried: b })
    }
}

impl V1 {
    /// The v1 manager under `root`, or `None` if the memory and pids hierarchies are not there.
    ///
    /// A user needs the memory, pids and (where mounted) cpuacct parents delegated; the cpu
    /// parent is used when it is.
    pub fn detect(root: &Path, uid: u32) -> Result<Option<V1>, CgroupError> {
        let (Some(mem), Some(pids)) = (hierarchy(root, "memory"), hierarchy(root, "pids")) else {
            return Ok(None);
        };
        let (memory, pids) = (parent(&mem, uid)?, parent(&pids, uid)?);
        let acct_h = hierarchy(root, "cpuacct");
        let cpuacct = acct_h.as_deref().map(|h| parent(h, uid)).transpose()?;
        let cpu = match hierarchy(root, "cpu") {
            Some(h) if acct_h.as_deref().is_some_and(|a| same_dir(a, &h)) => cpuacct.clone(),
            Some(h) => parent(&h, uid).ok(),
            None => None,
        };
        Ok(Some(V1 {
            memory,
            pids,
            cpuacct,
            cpu,
        }))
    }

    pub(crate) fn delegate(
        root: &Path,
        uid: u32,
        gid: u32,
    ) -> Result<Option<Vec<PathBuf>>, CgroupError> {
        if REQUIRED.iter().any(|c| hierarchy(root, c).is_none()) {
            return Ok(None);
        }
        let mut out: Vec<PathBuf> = Vec::new();
        for h in REQUIRED
            .iter()
            .chain(&OPTIONAL)
            .filter_map(|c| hierarchy(root, c))
        {
            let d = base(&h, uid);
            if out.contains(&d) {
                continue;
            }
            std::fs::create_dir_all(&d).map_err(io_at("create", &d))?;
            chown(&d, uid, gid)?;
            for f in ["cgroup.procs", "tasks"] {
                chown(&d.join(f), uid, gid)?;
            }
            out.push(d);
        }
        Ok(Some(out))
    }
}

impl V1 {
    /// The palisade parents this manager uses, each once (`cpu` and `cpuacct` may be one).
    fn parents(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = vec![&self.memory, &self.pids];
        for p in [&self.cpuacct, &self.cpu].into_iter().flatten() {
            if !v.contains(&p.as_path()) {
                v.push(p);
            }
        }
        v
    }

    /// The run's directories under `name`, made and locked, or the reason not.
    fn make(&self, name: &str, cpu: bool) -> Result<V1Run, owner::MakeError> {
        let at = |p: &Option<PathBuf>| p.as_ref().map(|p| p.join(name));
        let cpu = if cpu { at(&self.cpu) } else { None };
        // Made into the run from the first directory on: if a later one fails, dropping the run
        // removes those made so far.
        let mut run = V1Run {
            memory: 0,
            pids: 0,
            cpuacct: None,
            cpu: None,
            quota: None,
            made: Vec::new(),
            gaps: Vec::new(),
            sockets_counted: false,
            memory_bytes: 0,
            children: std::sync::OnceLock::new(),
        };
        run.memory = run.place(Some(self.memory.join(name)))?.unwrap_or_default();
        run.pids = run.place(Some(self.pids.join(name)))?.unwrap_or_default();
        run.cpuacct = run.place(at(&self.cpuacct))?;
        run.cpu = run.place(cpu)?;
        Ok(run)
    }
}

/// The socket-buffer ceiling of a v1 memory cgroup `dir` (see the module doc): `memory_bytes`
/// written to `memory.kmem.tcp.limit_in_bytes`, or, where the kernel has no such file or refuses
/// the value, the gap that leaves. The flag says whether the buffers are now counted.
fn limit_socket_buffers(dir: &owner::Owned, memory_bytes: u64) -> Result<(Gap, bool), CgroupError> {
    const F: &str = "memory.kmem.tcp.limit_in_bytes";
    let unbounded = |why: String| Gap {
        what: "socket buffers",
        bound: format!(
            "NOT bounded by the run's cgroup: this cgroup v1 kernel {why}, so UDP and TCP buffers \
             are bounded only by the host-wide net.ipv4.udp_mem and tcp_mem, shared with the host"
        ),
    };
    if !dir.has(F) {
        return Ok((
            unbounded("has no memory.kmem.tcp.limit_in_bytes (socket accounting)".into()),
            false,
        ));
    }
    let written = dir
        .open(F, true)
        .and_then(|mut f| std::io::Write::write_all(&mut f, memory_bytes.to_string().as_bytes()));
    match written {
        Ok(()) => Ok((
            Gap {
                what: "socket buffers",
                bound: format!(
                    "a ceiling of their own, {memory_bytes} bytes \
                     (memory.kmem.tcp.limit_in_bytes), beside the memory ceiling: cgroup v1 \
                     counts UDP and TCP buffers apart from the rest, so the sandbox can hold up \
                     to twice its memory ceiling in all"
                ),
            },
            true,
        )),
        // EINVAL, EOPNOTSUPP or ENOTSUPP from a kernel that keeps the file but no longer the knob.
        Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => Ok((
            unbounded(format!("refused memory.kmem.tcp.limit_in_bytes ({e})")),
            false,
        )),
        Err(e) => Err(io_at("write", &dir.path.join(F))(e)),
    }
}

impl Manager for V1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, limits: &CgroupLimits) -> Result<Box<dyn RunCgroup>, CgroupError> {
        let mut run = make_run(|name| self.make(name, limits.cpu_quota_us.is_some()))?;
        let mem = limits.memory_bytes.to_string();
        let memory = &run.made[run.memory];
        write_in(memory, "memory.limit_in_bytes", &mem)?;
        let (gap, counted) = limit_socket_buffers(memory, limits.memory_bytes)?;
        // Swap off for the sandbox: memory+swap capped at the same value where the kernel accounts
        // swap, and swappiness 0. On a host without swap there is nothing to turn off (and each
        // write costs a trip through the cgroup locks), so both are skipped.
        if crate::host_has_swap() {
            if memory.has("memory.memsw.limit_in_bytes") {
                write_in(memory, "memory.memsw.limit_in_bytes", &mem)?;
            }
            if memory.has("memory.swappiness") {
                write_in(memory, "memory.swappiness", "0")?;
            }
        }
        write_in(&run.made[run.pids], "pids.max", &limits.pids.to_string())?;
        if let (Some(c), Some(q)) = (run.cpu, limits.cpu_quota_us) {
            let c = &run.made[c];
            write_in(c, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            write_in(c, "cpu.cfs_quota_us", &q.to_string())?;
            run.quota = Some(q);
        }
        run.gaps.push(gap);
        run.sockets_counted = counted;
        run.memory_bytes = limits.memory_bytes;
        run.gaps.extend_from_slice(host_boot_gaps());
        Ok(Box::new(run))
    }

    fn clean_stale(&self) -> Vec<PathBuf> {
        // v1 has no cgroup.kill: a dead supervisor's sandbox died with it (PDEATHSIG), so its
        // cgroups are empty; one that is not stays, and is retried later.
        owner::clean(&self.parents(), None)
    }

    fn clean_stale_once(&self) {
        if owner::once(&self.memory) {
            self.clean_stale();
        }
    }
}

struct V1Run {
    /// Where in `made` each hierarchy's directory is.
    memory: usize,
    pids: usize,
    cpuacct: Option<usize>,
    /// The cpu directory, where a quota was asked for and the host has the hierarchy.
    cpu: Option<usize>,
    quota: Option<u64>,
    /// Every directory of the run, once each, locked: joined, then removed (empty from then on).
    made: Vec<owner::Owned>,
    gaps: Vec<Gap>,
    /// Whether socket buffers are counted (`memory.kmem.tcp.limit_in_bytes` written).
    sockets_counted: bool,
    /// The run's memory ceiling, bytes.
    memory_bytes: u64,
    /// The cgroups of a session's execs, children of the memory directory, once asked for.
    children: std::sync::OnceLock<std::sync::Arc<exec::Children>>,
}

/// A nanosecond count in a cpuacct file.
fn ns(dir: &owner::Owned, name: &str) -> Option<Duration> {
    read_number(dir, name).map(Duration::from_nanos)
}

impl V1Run {
    /// The run's exec cgroups (made at the first call); `None` without a memory directory.
    fn children(&self) -> Result<Option<std::sync::Arc<exec::Children>>, CgroupError> {
        let Some(memory) = self.dir(self.memory) else {
            return Ok(None);
        };
        let c = match self.children.get() {
            Some(c) => c.clone(),
            None => {
                // v1 charges a socket's buffers to a memory cgroup only once its own
                // `memory.kmem.tcp.limit_in_bytes` was written (not inherited): written
                // unlimited in each child, the run's ceiling above it holds them. Each child's
                // own memory ceiling is set as it is handed out (`exec`'s text).
                let mut setup = Vec::new();
                if self.sockets_counted {
                    setup.push(("memory.kmem.tcp.limit_in_bytes", "-1".to_owned()));
                }
                let made = std::sync::Arc::new(exec::Children::new(
                    memory,
                    "memory.oom_control",
                    "tasks",
                    setup,
                    Some(exec::Ceiling {
                        run: self.memory_bytes,
                        usage: "memory.usage_in_bytes",
                        limit: "memory.limit_in_bytes",
                    }),
                )?);
                self.children.get_or_init(|| made).clone()
            }
        };
        Ok(Some(c))
    }

    /// Makes and locks directory `d` (once: cpu and cpuacct may be mounted together); its index
    /// in `made`.
    fn place(&mut self, d: Option<PathBuf>) -> Result<Option<usize>, owner::MakeError> {
        let Some(d) = d else { return Ok(None) };
        if let Some(i) = self.made.iter().position(|o| o.path == d) {
            return Ok(Some(i));
        }
        self.made.push(owner::make(&d)?);
        Ok(Some(self.made.len() - 1))
    }

    /// The directory at `i` of `made`; `None` once removed.
    fn dir(&self, i: usize) -> Option<&owner::Owned> {
        self.made.get(i)
    }
}

impl RunCgroup for V1Run {
    fn join(&self, pid: i32) -> Result<(), CgroupError> {
        for d in &self.made {
            write_in(d, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    fn self_join_files(&self) -> Result<Vec<std::fs::File>, CgroupError> {
        self.made
            .iter()
            .map(|d| {
                // Opened, never created.
                let f = rustix::fs::openat(
                    d.dir_fd(),
                    "tasks",
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                );
                f.map(std::fs::File::from)
                    .map_err(|e| io_at("open", &d.path.join("tasks"))(e.into()))
            })
            .collect()
    }

    fn stats(&self) -> CgroupStats {
        let (Some(memory), Some(pids)) = (self.dir(self.memory), self.dir(self.pids)) else {
            return CgroupStats::default();
        };
        // `cpuacct.usage` is exact (the scheduler's own runtime); the user/system files are
        // sampled at ticks and need not add up to it, so they only split the exact total.
        let cpu = self.cpuacct.and_then(|i| self.dir(i)).and_then(|d| {
            let total = ns(d, "cpuacct.usage")?;
            let u = ns(d, "cpuacct.usage_user").unwrap_or_default();
            let s = ns(d, "cpuacct.usage_sys").unwrap_or_default();
            let user = match (u + s).as_nanos() {
                0 => total,
                both => Duration::from_nanos(
                    (total.as_nanos() * u.as_nanos() / both).min(u64::MAX as u128) as u64,
                ),
            };
            Some(CpuUsage {
                user,
                system: total.saturating_sub(user),
            })
        });
        let sockets = self
            .sockets_counted
            .then(|| read_number(memory, "memory.kmem.tcp.max_usage_in_bytes"));
        let stats = read_stats(
            memory,
            ["memory.max_usage_in_bytes", "memory.oom_control"],
            pids,
            "pids.peak",
            self.quota,
            cpu,
        );
        CgroupStats {
            socket_memory_peak: sockets.flatten(),
            // A v1 memory cgroup counts a kill only where the process was, not in its parents:
            // the kills of the execs' own cgroups are added.
            oom_kills: stats.oom_kills + self.children.get().map_or(0, |c| c.oom_total()),
            ..stats
        }
    }

    fn cpu_quota_us(&self) -> Option<u64> {
        self.quota
    }

    fn cpu_used(&self) -> Option<Duration> {
        ns(self.dir(self.cpuacct?)?, "cpuacct.usage")
    }

    fn gaps(&self) -> &[Gap] {
        &self.gaps
    }

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
        // Past the mark, the memory directory (and its exec children) give back what is still
        // charged to them, so that the kernel frees them with their directories (`crate::held`).
        // (A v1 directory lists only its own processes: its execs' are checked here.)
        let execs_empty = self.children.get().is_none_or(|c| c.all_empty());
        if let Some(m) = self.made.get(self.memory).filter(|_| execs_empty) {
            if crate::held::over(crate::held::Count::V1) {
                crate::held::give_back(m.dir_fd(), ".", false);
            }
        }
        // The same processes are in every hierarchy: once one directory is still busy after the
        // short wait, the others are too, and are kept for later at once.
        let (mut first, mut wait) = (None, true);
        for d in self.made.drain(..) {
            match owner::remove(d, wait) {
                Ok(gone) => wait &= gone,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for V1Run {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary tree shaped like a v1 cgroupfs: one directory per hierarchy with a
    /// `cgroup.procs`; `co_mounted` puts cpu and cpuacct in one `cpu,cpuacct` directory with the
    /// two names as symbolic links, as systemd hosts do.
    fn fake_root(tag: &str, co_mounted: bool) -> PathBuf {
        let r = std::env::temp_dir().join(format!("palisade-cg1-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&r);
        let dirs: &[&str] = if co_mounted {
            &["memory", "pids", "cpu,cpuacct"]
        } else {
            &["memory", "pids", "cpuacct"]
        };
        for c in dirs {
            std::fs::create_dir_all(r.join(c)).unwrap();
            std::fs::write(r.join(c).join("cgroup.procs"), "").unwrap();
        }
        if co_mounted {
            std::os::unix::fs::symlink("cpu,cpuacct", r.join("cpu")).unwrap();
            std::os::unix::fs::symlink("cpu,cpuacct", r.join("cpuacct")).unwrap();
        }
        r
    }

    /// The name of the one run cgroup under `parent`.
    fn only_run(parent: &Path) -> String {
        let names: Vec<String> = std::fs::read_dir(parent)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("run-"))
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        names[0].clone()
    }

    const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 64 << 20,
        pids: 32,
        cpu_quota_us: None,
    };

    /// A run whose last hierarchy cannot be made leaves none of the others' directories behind.
    #[test]
    fn a_run_made_in_part_is_removed_whole() {
        let root = fake_root("part", false);
        let m = V1::detect(&root, 0).unwrap().expect("fake v1 detected");
        // cpuacct's parent becomes a file: its run directory cannot be made, whoever we are.
        let acct = root.join("cpuacct/palisade");
        std::fs::remove_dir_all(&acct).unwrap();
        std::fs::write(&acct, "").unwrap();
        assert!(m.create(&LIMITS).is_err());
        for h in ["memory", "pids"] {
            let left: Vec<String> = std::fs::read_dir(root.join(h).join("palisade"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| owner::is_run_name(n))
                .collect();
            assert!(left.is_empty(), "{h}: {left:?}");
        }
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn create_writes_limits_in_each_hierarchy() {
        let root = fake_root("create", false);
        let m = V1::detect(&root, 0).unwrap().expect("fake v1 detected");
        // create() makes the directories; the writes then create plain files in the temp dir
        // (a real cgroupfs has them already), except the socket-buffer limit, written only where
        // the kernel offers it: here it does not.
        let run = m.create(&LIMITS).unwrap();
        let name = only_run(&root.join("memory/palisade"));
        assert!(owner::is_run_name(&name), "{name}");
        let mem = root.join("memory/palisade").join(&name);
        let pids = root.join("pids/palisade").join(&name);
        let acct = root.join("cpuacct/palisade").join(&name);
        assert!(!mem.join("memory.kmem.tcp.limit_in_bytes").exists());
        let g = &run.gaps()[0];
        assert_eq!(g.what, "socket buffers");
        assert!(
            g.bound.starts_with("NOT bounded by the run's cgroup")
                && g.bound.contains("no memory.kmem.tcp.limit_in_bytes"),
            "{g}"
        );
        assert_eq!(run.stats().socket_memory_peak, None);
        assert_eq!(
            std::fs::read_to_string(mem.join("memory.limit_in_bytes")).unwrap(),
            "67108864"
        );
        assert_eq!(
            std::fs::read_to_string(pids.join("pids.max")).unwrap(),
            "32"
        );
        assert!(
            !mem.join("memory.memsw.limit_in_bytes").exists(),
            "memsw written where the kernel has none"
        );
        assert!(acct.is_dir(), "no cpuacct cgroup for CPU accounting");
        run.join(42).unwrap();
        for d in [&mem, &pids, &acct] {
            assert_eq!(
                std::fs::read_to_string(d.join("cgroup.procs")).unwrap(),
                "42"
            );
        }
        // The accounting as the kernel writes it, in nanoseconds.
        std::fs::write(acct.join("cpuacct.usage"), "1500000000\n").unwrap();
        // Tick-sampled, so they need not add up to the total: they only split it.
        std::fs::write(acct.join("cpuacct.usage_user"), "1240000000\n").unwrap();
        std::fs::write(acct.join("cpuacct.usage_sys"), "310000000\n").unwrap();
        assert_eq!(run.cpu_used(), Some(Duration::from_millis(1500)));
        assert_eq!(
            run.stats().cpu,
            Some(CpuUsage {
                user: Duration::from_millis(1200),
                system: Duration::from_millis(300)
            })
        );
        drop(run);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn cpu_and_cpuacct_mounted_together_get_one_directory() {
        let root = fake_root("comount", true);
        let m = V1::detect(&root, 0).unwrap().expect("fake v1 detected");
        let quota = CgroupLimits {
            cpu_quota_us: Some(50_000),
            ..LIMITS
        };
        let run = m.create(&quota).unwrap();
        let d = root
            .join("cpuacct/palisade")
            .join(only_run(&root.join("cpuacct/palisade")));
        assert_eq!(
            std::fs::read_to_string(d.join("cpu.cfs_quota_us")).unwrap(),
            "50000"
        );
        // Made once (a second mkdir would have failed) and joined once.
        run.join(7).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join("cgroup.procs")).unwrap(),
            "7"
        );
        drop(run);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn unprivileged_users_need_a_delegated_subtree() {
        let root = fake_root("deleg", false);
        let e = V1::detect(&root, 1000)
            .err()
            .expect("not delegated yet")
            .to_string();
        assert!(
            e.contains("cgroup-delegate") && e.contains("user-1000"),
            "{e}"
        );
        // Delegated memory and pids but not cpuacct (an older delegation): still refused, since
        // the CPU-time limit rests on it.
        for c in ["memory", "pids"] {
            let d = root.join(c).join("palisade/user-1000");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        let e = V1::detect(&root, 1000).err().expect("cpuacct missing");
        assert!(e.to_string().contains("cpuacct/palisade/user-1000"), "{e}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn socket_buffers_get_a_ceiling_where_the_kernel_offers_one() {
        // A memory cgroup of a kernel with socket accounting: the file is there, at "no limit".
        let dir = fake_root("tcp", false).join("memory");
        let Ok(run) = owner::make(&dir.join("run-1-0123456789abcdef-0")) else {
            panic!("cannot make a run directory in {}", dir.display());
        };
        let f = run.path.join("memory.kmem.tcp.limit_in_bytes");
        std::fs::write(&f, "9223372036854771712").unwrap();
        let (gap, counted) = limit_socket_buffers(&run, 64 << 20).unwrap();
        assert!(counted);
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "67108864");
        assert_eq!(gap.what, "socket buffers");
        assert!(
            gap.bound
                .starts_with("a ceiling of their own, 67108864 bytes")
                && gap.bound.contains("twice its memory ceiling"),
            "{gap}"
        );
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn stale_cleanup_takes_only_runs_whose_owner_is_gone() {
        let root = fake_root("stale", true);
        let m = V1::detect(&root, 0).unwrap().expect("fake v1 detected");
        let quota = CgroupLimits {
            cpu_quota_us: Some(50_000),
            ..LIMITS
        };
        let live = m.create(&quota).unwrap();
        let live_name = only_run(&root.join("memory/palisade"));
        // A dead supervisor's run: its directories in each hierarchy, unlocked, empty (its
        // sandbox died with it). And an earlier version's name, which is not ours to judge.
        let dead = "run-4242-00000000deadbeef-0";
        for h in ["memory", "pids", "cpu,cpuacct"] {
            std::fs::create_dir(root.join(h).join("palisade").join(dead)).unwrap();
            std::fs::create_dir(root.join(h).join("palisade/run-4242-0")).unwrap();
        }
        let mut removed = m.clean_stale();
        removed.sort();
        // The cpu,cpuacct hierarchy is reached through its `cpuacct` link.
        let mut want: Vec<PathBuf> = ["cpuacct", "memory", "pids"]
            .iter()
            .map(|h| root.join(h).join("palisade").join(dead))
            .collect();
        want.sort();
        assert_eq!(removed, want);
        for h in ["memory", "pids", "cpu,cpuacct"] {
            let p = root.join(h).join("palisade");
            assert!(
                p.join(&live_name).is_dir(),
                "the live run lost its {h} cgroup"
            );
            assert!(p.join("run-4242-0").is_dir());
        }
        // Once per process and parent: the second call does nothing, even with a new leftover.
        std::fs::create_dir(root.join("memory/palisade").join(dead)).unwrap();
        m.clean_stale_once();
        m.clean_stale_once();
        let left = root.join("memory/palisade").join(dead).exists();
        assert!(!left, "the first clean_stale_once did not clean");
        std::fs::create_dir(root.join("memory/palisade").join(dead)).unwrap();
        m.clean_stale_once();
        assert!(root.join("memory/palisade").join(dead).exists());
        drop(live);
        std::fs::remove_dir_all(root).unwrap();
    }
}
