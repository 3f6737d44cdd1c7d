//! cgroup v2: one unified hierarchy; the palisade parent enables the memory and pids controllers
//! for its children.

use crate::*;

/// The v2 manager: the palisade parent in the unified hierarchy.
pub struct V2 {
    base: PathBuf,
}

fn unified(root: &Path) -> Option<PathBuf> {
    // A pure v2 host mounts the hierarchy at the root; a hybrid one at `unified/`.
    for p in [root.to_owned(), root.join("unified")] {
        let ctrls = std::fs::read_to_string(p.join("cgroup.controllers")).ok()?;
        let has = |c: &str| ctrls.split_whitespace().any(|x| x == c);
        if has("memory") && has("pids") {
            return Some(p);
        }
    }
    None
}

fn base(u: &Path, uid: u32) -> PathBuf {
    let b = u.join("palisade");
    if uid == 0 {
        b
    } else {
        b.join(format!("user-{uid}"))
    }
}

fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let cur = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let avail = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let on = |c: &str| cur.split_whitespace().any(|x| x == c);
    // memory and pids are required; cpu is taken where the hierarchy offers it (a quota is then
    // written and reported).
    let cpu = avail.split_whitespace().any(|c| c == "cpu");
    let want: Vec<String> = ["memory", "pids"]
        .into_iter()
        .chain(cpu.then_some("cpu"))
        .filter(|c| !on(c))
        .map(|c| format!("+{c}"))
        .collect();
    if !want.is_empty() {
        write(&dir.join("cgroup.subtree_control"), &want.join(" "))?;
    }
    Ok(())
}

impl V2 {
    /// The v2 manager under `root`, or `None` without a unified hierarchy offering memory and pids.
    pub fn detect(root: &Path, uid: u32) -> Result<Option<V2>, CgroupError> {
        let Some(u) = unified(root) else {
            return Ok(None);
        };
        let b = base(&u, uid);
        if uid == 0 && !b.join("cgroup.procs").exists() {
            enable_controllers(&u)?;
            std::fs::create_dir_all(&b).map_err(io_at("create", &b))?;
            enable_controllers(&b)?;
        } else if !b.join("cgroup.procs").exists() {
            return Err(CgroupError::NotDelegated { uid, tried: b });
        }
        Ok(Some(V2 { base: b }))
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
        let d = base(&u, uid);
        std::fs::create_dir_all(&d).map_err(io_at("create", &d))?;
        enable_controllers(&d)?;
        chown(&d, uid, gid)?;
        for f in ["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"] {
            chown(&d.join(f), uid, gid)?;
        }
        Ok(Some(vec![d]))
    }
}

impl Manager for V2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, name: &str, limits: &CgroupLimits) -> Result<Box<dyn RunCgroup>, CgroupError> {
        let dir = self.base.join(name);
        std::fs::create_dir(&dir).map_err(io_at("create", &dir))?;
        let mut run = V2Run {
            dir: Some(dir.clone()),
            quota: None,
        };
        write(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
        write(&dir.join("pids.max"), &limits.pids.to_string())?;
        let cpu_max = dir.join("cpu.max");
        if let (Some(q), true) = (limits.cpu_quota_us, cpu_max.exists()) {
            write(&cpu_max, &format!("{q} {CPU_PERIOD_US}"))?;
            run.quota = Some(q);
        }
        Ok(Box::new(run))
    }

    fn clean_stale(&self) {
        let Ok(rd) = std::fs::read_dir(&self.base) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = stale_pid(&name) {
                if !pid_alive(pid) {
                    let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }
}

struct V2Run {
    dir: Option<PathBuf>,
    quota: Option<u64>,
}

impl RunCgroup for V2Run {
    fn join(&self, pid: i32) -> Result<(), CgroupError> {
        let dir = self.dir.as_ref().expect("not removed");
        write(&dir.join("cgroup.procs"), &pid.to_string())
    }

    fn stats(&self) -> CgroupStats {
        let Some(dir) = &self.dir else {
            return CgroupStats::default();
        };
        let stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
        let us = |k| keyed(&stat, k).map(std::time::Duration::from_micros);
        let cpu = us("user_usec").zip(us("system_usec"));
        read_stats(
            &dir.join("memory.peak"),
            &dir.join("memory.events"),
            &dir.join("pids.peak"),
            self.quota,
            cpu.map(|(user, system)| CpuUsage { user, system }),
        )
    }

    /// From `cpu.stat`, which every v2 cgroup has, with or without the cpu controller.
    fn cpu_used(&self) -> Option<std::time::Duration> {
        let stat = std::fs::read_to_string(self.dir.as_ref()?.join("cpu.stat")).ok()?;
        keyed(&stat, "usage_usec").map(std::time::Duration::from_micros)
    }

    fn remove(&mut self) -> Result<(), CgroupError> {
        match self.dir.take() {
            Some(d) => {
                let _ = std::fs::write(d.join("cgroup.kill"), "1");
                rmdir_retry(&d)
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
        let m = V2::detect(&r, 0).unwrap().expect("detected");
        assert_eq!(
            std::fs::read_to_string(r.join("cgroup.subtree_control")).unwrap(),
            "+memory +pids +cpu"
        );
        let run = m
            .create(
                "run-1-1",
                &CgroupLimits {
                    memory_bytes: 1 << 26,
                    pids: 32,
                    cpu_quota_us: None,
                },
            )
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(r.join("palisade/run-1-1/memory.max")).unwrap(),
            "67108864"
        );
        assert_eq!(
            std::fs::read_to_string(r.join("palisade/run-1-1/pids.max")).unwrap(),
            "32"
        );
        std::fs::write(
            r.join("palisade/run-1-1/cpu.stat"),
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
        drop(run);
        std::fs::remove_dir_all(&r).unwrap();
    }
}
