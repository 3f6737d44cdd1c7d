//! cgroup v1: one hierarchy per controller (`memory`, `pids`, and `cpu` where mounted), each with a
//! palisade parent.

use crate::*;

/// The v1 manager: the palisade parent in the memory and pids hierarchies.
pub struct V1 {
    memory: PathBuf,
    pids: PathBuf,
    /// The cpu hierarchy's palisade parent, where the host mounts it (and, for a user, it is
    /// delegated).
    cpu: Option<PathBuf>,
}

const CONTROLLERS: [&str; 2] = ["memory", "pids"];

fn base(root: &Path, ctrl: &str, uid: u32) -> PathBuf {
    let b = root.join(ctrl).join("palisade");
    if uid == 0 {
        b
    } else {
        b.join(format!("user-{uid}"))
    }
}

impl V1 {
    /// The v1 manager under `root`, or `None` if the memory and pids hierarchies are not there.
    pub fn detect(root: &Path, uid: u32) -> Result<Option<V1>, CgroupError> {
        if !CONTROLLERS
            .iter()
            .all(|c| root.join(c).join("cgroup.procs").exists())
        {
            return Ok(None);
        }
        let (memory, pids) = (base(root, "memory", uid), base(root, "pids", uid));
        for b in [&memory, &pids] {
            // Checked first: a failing mkdir on cgroupfs still takes the kernel's global cgroup lock.
            if uid == 0 && !b.join("cgroup.procs").exists() {
                std::fs::create_dir_all(b).map_err(io_at("create", b))?;
            } else if !b.join("cgroup.procs").exists() {
                return Err(CgroupError::NotDelegated {
                    uid,
                    tried: b.clone(),
                });
            }
        }
        let cpu = base(root, "cpu", uid);
        let cpu = if !root.join("cpu/cgroup.procs").exists() {
            None
        } else if cpu.join("cgroup.procs").exists() {
            Some(cpu)
        } else if uid == 0 {
            std::fs::create_dir_all(&cpu).map_err(io_at("create", &cpu))?;
            Some(cpu)
        } else {
            None
        };
        Ok(Some(V1 { memory, pids, cpu }))
    }

    pub(crate) fn delegate(
        root: &Path,
        uid: u32,
        gid: u32,
    ) -> Result<Option<Vec<PathBuf>>, CgroupError> {
        if !CONTROLLERS
            .iter()
            .all(|c| root.join(c).join("cgroup.procs").exists())
        {
            return Ok(None);
        }
        let mut out = Vec::new();
        let cpu = root.join("cpu/cgroup.procs").exists().then_some("cpu");
        for c in CONTROLLERS.into_iter().chain(cpu) {
            let d = base(root, c, uid);
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

impl Manager for V1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> Result<Box<dyn RunCgroup>, CgroupError> {
        let cpu = match (&self.cpu, limits.cpu_quota_us) {
            (Some(c), Some(_)) => Some(c.join(name)),
            _ => None,
        };
        let mut run = V1Run {
            memory: self.memory.join(name),
            pids: self.pids.join(name),
            cpu: cpu.clone(),
            quota: None,
            made: Vec::new(),
        };
        for d in [Some(run.memory.clone()), Some(run.pids.clone()), cpu]
            .into_iter()
            .flatten()
        {
            std::fs::create_dir(&d).map_err(io_at("create", &d))?;
            run.made.push(d);
        }
        let mem = limits.memory_bytes.to_string();
        write(&run.memory.join("memory.limit_in_bytes"), &mem)?;
        // Swap off for the sandbox: memory+swap capped at the same value where the kernel accounts
        // swap, and swappiness 0. On a host without swap there is nothing to turn off (and each
        // write costs a trip through the cgroup locks), so both are skipped.
        if crate::host_has_swap() {
            let memsw = run.memory.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &mem)?;
            }
            let swappiness = run.memory.join("memory.swappiness");
            if swappiness.exists() {
                write(&swappiness, "0")?;
            }
        }
        write(&run.pids.join("pids.max"), &limits.pids.to_string())?;
        if let (Some(c), Some(q)) = (&run.cpu, limits.cpu_quota_us) {
            write(&c.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(&c.join("cpu.cfs_quota_us"), &q.to_string())?;
            run.quota = Some(q);
        }
        Ok(Box::new(run))
    }

    fn clean_stale(&self) {
        for parent in [Some(&self.memory), Some(&self.pids), self.cpu.as_ref()]
            .into_iter()
            .flatten()
        {
            let Ok(rd) = std::fs::read_dir(parent) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = stale_pid(&name) {
                    // A dead supervisor's sandbox died with it (PDEATHSIG), so its cgroup is
                    // empty; one that is not stays (one attempt, no retry: this is on every
                    // start). Liveness is judged in our own pid namespace, so supervisors in
                    // other pid namespaces need their own palisade parent.
                    if !pid_alive(pid) {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
        }
    }
}

struct V1Run {
    memory: PathBuf,
    pids: PathBuf,
    cpu: Option<PathBuf>,
    quota: Option<u64>,
    made: Vec<PathBuf>,
}

impl V1Run {
    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        [Some(&self.memory), Some(&self.pids), self.cpu.as_ref()]
            .into_iter()
            .flatten()
    }
}

impl RunCgroup for V1Run {
    fn join(&self, pid: i32) -> Result<(), CgroupError> {
        for d in self.dirs() {
            write(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    fn self_join_files(&self) -> Result<Vec<std::fs::File>, CgroupError> {
        self.dirs()
            .map(|d| {
                let p = d.join("tasks");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map_err(io_at("open", &p))
            })
            .collect()
    }

    fn stats(&self) -> CgroupStats {
        read_stats(
            &self.memory.join("memory.max_usage_in_bytes"),
            &self.memory.join("memory.oom_control"),
            &self.pids.join("pids.peak"),
            self.quota,
        )
    }

    fn remove(&mut self) -> Result<(), CgroupError> {
        let mut first = None;
        for d in self.made.drain(..) {
            if let Err(e) = rmdir_retry(&d) {
                first.get_or_insert(e);
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

    fn fake_root(tag: &str) -> PathBuf {
        let r = std::env::temp_dir().join(format!("palisade-cg1-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&r);
        for c in CONTROLLERS {
            std::fs::create_dir_all(r.join(c)).unwrap();
            std::fs::write(r.join(c).join("cgroup.procs"), "").unwrap();
        }
        r
    }

    #[test]
    fn create_writes_limits_in_each_hierarchy() {
        let root = fake_root("create");
        let m = V1::detect(&root, 0).unwrap().expect("fake v1 detected");
        // A real cgroupfs creates the control files in a new directory; a temp dir does not, so
        // create the run directories' files the way the kernel would before the writes.
        let name = "run-1-1";
        let limits = CgroupLimits {
            memory_bytes: 64 << 20,
            pids: 32,
            cpu_quota_us: None,
        };
        let mem = root.join("memory/palisade").join(name);
        let pids = root.join("pids/palisade").join(name);
        // create() makes the directories; the writes then create plain files in the temp dir.
        let run = m.create(name, &limits).unwrap();
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
        run.join(42).unwrap();
        assert_eq!(
            std::fs::read_to_string(mem.join("cgroup.procs")).unwrap(),
            "42"
        );
        drop(run);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn unprivileged_users_need_a_delegated_subtree() {
        let root = fake_root("deleg");
        let e = V1::detect(&root, 1000)
            .err()
            .expect("not delegated yet")
            .to_string();
        assert!(
            e.contains("cgroup-delegate") && e.contains("user-1000"),
            "{e}"
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
