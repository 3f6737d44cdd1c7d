//! Cgroups of their own for the execs of a session: programs started one after another, or at the
//! same time, inside one running sandbox.
//!
//! A session's limits are its run cgroup's, and they hold for all its execs together. What the
//! kernel counts per cgroup (an OOM kill, above all) would then be the session's, and with two
//! execs at once nobody could say whose process the kill was. So each exec gets a child of the
//! run's cgroup in the memory hierarchy, which its first process enters before it starts the
//! program: no limit of its own (the parent's hold over it, hierarchically), only its own count.
//!
//! - **v1**: a child of the run's memory directory. A v1 memory cgroup counts an OOM kill only in
//!   the cgroup of the process killed, never in its parents, so the run's own total adds its
//!   children's ([`Children::oom_total`]).
//! - **v2**: the kernel lets a cgroup give controllers to its children only while it holds no
//!   process itself (the "no internal processes" rule), and the run's init and agent are in the
//!   run's cgroup. Before its first exec cgroup, they move into a leaf ([`crate::PROCS_LEAF`]) and
//!   the run's cgroup enables the memory controller for its children. An OOM kill is counted in
//!   the victim's cgroup and in each of its parents, so the run's own total already holds them.
//!
//! The exec's first process moves itself by writing `0` into a file the supervisor opened
//! ([`ExecCgroup::join_files`], v1 `tasks`, v2 `cgroup.procs`): the kernel checks the opener's
//! credentials, so the sandbox never needs a cgroup file system of its own, and the descriptor is
//! close-on-exec, so the program never holds it.
//!
//! An exec's directory is removed when it ends, or, while processes it left behind still run
//! there, at a later exec's start or with the run. At most [`MAX_EXEC_CGROUPS`] exist at once in
//! one run: past that, an exec gets none (its count is the session's, as before).

use crate::*;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// Most exec cgroups one run holds at once, ended ones still busy included.
pub const MAX_EXEC_CGROUPS: usize = 64;

/// The exec cgroups of one run.
pub(crate) struct Children {
    /// The directory they are made in (an `O_PATH` descriptor of it, not the locked one).
    dir: OwnedFd,
    path: PathBuf,
    /// The file with the `oom_kill` count: v1 `memory.oom_control`, v2 `memory.events`.
    events: &'static str,
    /// The file a process writes `0` into to enter: v1 `tasks`, v2 `cgroup.procs`.
    join: &'static str,
    /// Control files written in each new child before it is handed out (v1: the socket-buffer
    /// knob, without which the child's sockets are charged to no cgroup at all).
    setup: &'static [(&'static str, &'static str)],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    seq: u64,
    /// Directories made and not yet removed, and whether their exec has ended.
    live: Vec<(String, bool)>,
    /// OOM kills counted in directories since removed.
    removed_oom: u64,
}

impl Children {
    /// The exec cgroups of the run whose (memory) directory is `parent`.
    pub(crate) fn new(
        parent: &owner::Owned,
        events: &'static str,
        join: &'static str,
        setup: &'static [(&'static str, &'static str)],
    ) -> Result<Children, CgroupError> {
        let dir = rustix::fs::openat(
            parent.dir_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_at("open", &parent.path)(e.into()))?;
        Ok(Children {
            dir,
            path: parent.path.clone(),
            events,
            join,
            setup,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new exec cgroup, or `None` if [`MAX_EXEC_CGROUPS`] are still there.
    pub(crate) fn make(self: &Arc<Self>) -> Result<Option<Box<dyn ExecCgroup>>, CgroupError> {
        let mut st = self.state();
        self.remove_ended(&mut st);
        if st.live.len() >= MAX_EXEC_CGROUPS {
            return Ok(None);
        }
        let name = format!("exec-{}", st.seq);
        st.seq += 1;
        rustix::fs::mkdirat(&self.dir, name.as_str(), Mode::from_raw_mode(0o700))
            .map_err(|e| io_at("create", &self.path.join(&name))(e.into()))?;
        for (file, value) in self.setup {
            let rel = format!("{name}/{file}");
            let written = rustix::fs::openat(
                &self.dir,
                rel.as_str(),
                OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .and_then(|f| rustix::io::write(&f, value.as_bytes()));
            if let Err(e) = written {
                let _ = rustix::fs::unlinkat(&self.dir, name.as_str(), AtFlags::REMOVEDIR);
                return Err(io_at("write", &self.path.join(&rel))(e.into()));
            }
        }
        st.live.push((name.clone(), false));
        Ok(Some(Box::new(Exec {
            children: self.clone(),
            name,
        })))
    }

    /// The `oom_kill` count of child `name`.
    fn oom_kills(&self, name: &str) -> u64 {
        let f = rustix::fs::openat(
            &self.dir,
            format!("{name}/{}", self.events).as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        );
        let Ok(f) = f else { return 0 };
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while n < buf.len() {
            match rustix::io::read(&f, &mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(Errno::INTR) => {}
                Err(_) => return 0,
            }
        }
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| keyed(s, "oom_kill"))
            .unwrap_or(0)
    }

    /// Removes the directories of ended execs that nothing runs in any more (one attempt each).
    fn remove_ended(&self, st: &mut State) {
        let mut i = 0;
        while i < st.live.len() {
            let (name, ended) = &st.live[i];
            if *ended {
                let kills = self.oom_kills(name);
                match rustix::fs::unlinkat(&self.dir, name.as_str(), AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {
                        st.removed_oom += kills;
                        st.live.swap_remove(i);
                        continue;
                    }
                    Err(_) => {} // busy: processes it left still run there
                }
            }
            i += 1;
        }
    }

    /// OOM kills counted in every exec cgroup of the run, removed ones included.
    pub(crate) fn oom_total(&self) -> u64 {
        let st = self.state();
        st.removed_oom + st.live.iter().map(|(n, _)| self.oom_kills(n)).sum::<u64>()
    }

    fn ended(&self, name: &str) {
        let mut st = self.state();
        if let Some(c) = st.live.iter_mut().find(|(n, _)| n == name) {
            c.1 = true;
        }
        self.remove_ended(&mut st);
    }
}

/// One exec's cgroup.
struct Exec {
    children: Arc<Children>,
    name: String,
}

impl ExecCgroup for Exec {
    fn join_files(&self) -> Result<Vec<std::fs::File>, CgroupError> {
        let c = &self.children;
        let rel = format!("{}/{}", self.name, c.join);
        // Opened, never created: the kernel made the file.
        rustix::fs::openat(
            &c.dir,
            rel.as_str(),
            OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map(|f| vec![std::fs::File::from(f)])
        .map_err(|e| io_at("open", &c.path.join(&rel))(e.into()))
    }

    fn oom_kills(&self) -> u64 {
        self.children.oom_kills(&self.name)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.children.ended(&self.name);
    }
}

/// Removes the child cgroups of run directory `dir` (one level: an exec's, or the leaf of a v2
/// run's own processes), so that the directory itself can go; one attempt each. For a run
/// directory the kernel reports busy.
pub(crate) fn remove_children(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten().take(4 * MAX_EXEC_CGROUPS) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_cgroups_are_bounded_counted_and_removed() {
        let parent = std::env::temp_dir().join(format!("palisade-exec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        let run = match owner::make(&parent.join("run-7-00000000000000dd-0")) {
            Ok(o) => o,
            Err(_) => panic!("could not make the run directory"),
        };
        let c = Arc::new(Children::new(&run, "memory.oom_control", "tasks", &[]).unwrap());
        let a = c.make().unwrap().expect("an exec cgroup");
        let b = c.make().unwrap().expect("another");
        assert_ne!(a.name(), b.name());
        // What the kernel writes in a v1 memory cgroup's memory.oom_control.
        let events = |n: &str, k: u64| {
            std::fs::write(
                run.path.join(n).join("memory.oom_control"),
                format!("oom_kill_disable 0\nunder_oom 0\noom_kill {k}\n"),
            )
            .unwrap()
        };
        events(a.name(), 2);
        events(b.name(), 0);
        assert_eq!((a.oom_kills(), b.oom_kills()), (2, 0));
        assert_eq!(c.oom_total(), 2);
        // On a real cgroupfs the kernel removes the control files with the directory; here the
        // directory stays busy (not empty) while they are there, as one with a process left.
        let an = a.name().to_owned();
        drop(a);
        assert!(run.path.join(&an).is_dir(), "a busy directory is kept");
        assert_eq!(c.oom_total(), 2, "its count still counts");
        // Removed at the next exec's start once empty. (Its count, read just before, stays in
        // the total: on a real cgroupfs the file goes with the directory, which a temporary
        // directory cannot show; the server's tests check the session's total on the kernel.)
        std::fs::remove_file(run.path.join(&an).join("memory.oom_control")).unwrap();
        let mut more = vec![c.make().unwrap().expect("a third")];
        assert!(!run.path.join(&an).exists());
        assert_eq!(c.oom_total(), 0);
        // Bounded: past MAX_EXEC_CGROUPS live ones, an exec gets none.
        while let Some(e) = c.make().unwrap() {
            more.push(e);
        }
        assert_eq!(more.len() + 1, MAX_EXEC_CGROUPS, "b and the others");
        drop(more);
        drop(b);
        // Directories only stay while something is in them; a file stands for that here.
        remove_children(&run.path);
        let left: Vec<_> = std::fs::read_dir(&run.path).unwrap().flatten().collect();
        assert_eq!(
            left.len(),
            1,
            "only b, which still holds a file, is left: {left:?}"
        );
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
