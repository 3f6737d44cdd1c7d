//! Cgroups of their own for the execs of a session: programs started one after another, or at the
//! same time, inside one running sandbox.
//!
//! A session's limits are its run cgroup's, and they hold for all its execs together. What the
//! kernel counts per cgroup (an OOM kill, above all) would then be the session's, and with two
//! execs at once nobody could say whose process the kill was. So each exec gets a child of the
//! run's cgroup in the memory hierarchy, which its first process enters before it starts the
//! program, with its own count and a memory ceiling a little below the run's
//! ([`exec_memory_ceiling`]).
//!
//! That ceiling keeps the session. The run's own processes (the sandbox's init and the session's
//! agent) are under the run's ceiling with every exec, and when the run as a whole is at its
//! ceiling the kernel kills the process with the most memory mapped, which need not be the exec
//! that took the memory: an exec that wrote a file past the ceiling into scratch (file pages that
//! belong to no process) had the agent killed, the largest process left, and the session ended
//! (measured: `dd` of 400 MiB into a 128 MiB session). So an exec's ceiling is set as its cgroup
//! is handed out, to what the run has left for it: the run's ceiling less room for the run's own
//! processes, less what is charged outside the exec's cgroup at that moment (files earlier execs
//! left in other exec cgroups, files written through the agent, the agent's own memory), but a
//! quarter of the room more than what is charged to the cgroup already, so that a small program
//! can still start in a full session, if that is within a quarter of the room past what is left
//! ([`Children::set_ceiling`]). The exec meets
//! its ceiling first, and the kernel chooses only among the exec's own processes.
//!
//! Execs at once could still together pass the run's ceiling, each within its own (two that each
//! wrote 100 MiB into a 128 MiB session had the agent killed). So the exec cgroups are not the
//! run's children but its `execs` child's ([`EXECS`]), whose ceiling, set at each hand-out, is what
//! the run has left beside what is charged outside it (the agent, the init, files written through
//! the agent), never more than [`exec_memory_ceiling`]. Execs together meet that ceiling before
//! the run's, and the kernel then chooses among the execs' processes, never the agent or the
//! init. An exec alone keeps the whole of what is left: a background exec that holds little does
//! not halve the next one's. What this does not cover: the agent itself taking more than the
//! room while an exec runs; it moves a file's bytes in bounded pieces for that reason.
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
//! An exec's directory is kept when it ends, for a later exec of the same run: making and
//! removing a memory cgroup costs ~50 µs on a v1 host, and a removed one can stay in the kernel
//! (below). A later exec takes it only once no process is left in it (its process list reads
//! empty), and counts its OOM kills from the count read as it takes it; its ceiling is set
//! again. Memory still charged to it (a file the earlier exec wrote in scratch) counts in its
//! ceiling as it would in the run's. The only processes that can enter it are those given its
//! join file, and the supervisor gives that only with the exec it hands the directory to. Past
//! [`IDLE_EXEC_CGROUPS`] ended ones, those nothing runs in are removed; one an exec left
//! processes in is not taken while they run, and once they are gone is taken or removed like the
//! others, or goes with the run. At most [`MAX_EXEC_CGROUPS`] exist at once in one run: past
//! that (or past the other bounds below), an exec shares one with the exec that holds it, one an
//! ended exec left a process in first ([`ExecCgroup::shared`]): the ceiling holds for both, and
//! the OOM kills counted there are theirs together.
//!
//! Taking ended ones again also bounds what the host keeps of removed ones. A memory cgroup
//! removed while pages are still charged to it (a file the exec wrote in scratch, cached) stays
//! in the kernel, with its kernel memory, until those pages go (`crate::held`): with a directory
//! made and removed per exec, 2,000 execs that each appended to a file left 2,000 such cgroups
//! for the session's life (measured). So a run makes at most [`MADE_EXEC_CGROUPS`] over its life;
//! an exec that then finds none free (a session whose execs keep leaving processes behind) gets
//! none of its own. Exec cgroups that exist hold the kernel's memory cgroup ids (65,535 for the
//! host, live ones only), so one process, a server with all its sessions, holds at most
//! [`MAX_EXEC_CGROUPS_IN_PROCESS`] at once, each run's first one aside (every run gets one, so
//! that one tenant's sessions holding them all cannot leave another's execs without a ceiling;
//! the runs themselves are bounded by the server).

use crate::*;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// The run's child that holds its exec cgroups, with a ceiling for all of them together (see the
/// module's text): an exec cgroup's name is `execs/exec-N`.
pub const EXECS: &str = "execs";

/// The most an exec cgroup's memory ceiling is, in a run whose ceiling is `run` bytes: the
/// run's, less room for the run's own processes (the sandbox's init and a session's agent, ~1 MiB
/// of anonymous memory together, with their page tables and sockets, and what the agent takes for
/// a file it moves while the exec runs). The room is a sixteenth of the run's ceiling, at least
/// 16 MiB and at most 64 MiB, and never more than a quarter of it. The ceiling an exec gets is
/// lower when the run holds memory outside the exec's cgroup ([`Children::set_ceiling`]).
pub fn exec_memory_ceiling(run: u64) -> u64 {
    let room = (run / 16).clamp(EXEC_ROOM_MIN, EXEC_ROOM_MAX).min(run / 4);
    run - room
}

/// The least room [`exec_memory_ceiling`] leaves for the run's own processes (where the run's
/// ceiling is at least four times as much).
pub const EXEC_ROOM_MIN: u64 = 16 << 20;

/// The most room [`exec_memory_ceiling`] leaves for the run's own processes.
pub const EXEC_ROOM_MAX: u64 = 64 << 20;

/// Most exec cgroups one run holds at once, ended ones included.
pub const MAX_EXEC_CGROUPS: usize = 64;

/// Most exec cgroups one process (a server, for all its sessions) holds at once, besides each
/// run's first. A memory cgroup that exists holds one of the kernel's 65,535 memory cgroup ids
/// for the whole host (a removed one gives it back), and a session's execs can keep theirs
/// existing by leaving a process in each: 64 each in 10,000 sessions would be 640,000.
pub const MAX_EXEC_CGROUPS_IN_PROCESS: usize = 4_096;

/// Exec cgroups this process holds (made, not yet removed).
static IN_PROCESS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Takes one of the process's [`MAX_EXEC_CGROUPS_IN_PROCESS`] places, if one is free.
fn take_place() -> bool {
    use std::sync::atomic::Ordering;
    IN_PROCESS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_EXEC_CGROUPS_IN_PROCESS).then_some(n + 1)
        })
        .is_ok()
}

fn give_places(n: usize) {
    IN_PROCESS.fetch_sub(n, std::sync::atomic::Ordering::AcqRel);
}

/// Most ended exec cgroups one run keeps for later execs to take.
pub const IDLE_EXEC_CGROUPS: usize = 8;

/// Most exec cgroups one run makes over its life (see the module's text: removed memory cgroups
/// the kernel keeps).
pub const MADE_EXEC_CGROUPS: u64 = 256;

/// The exec cgroups of one run.
pub(crate) struct Children {
    /// The directory they are made in (an `O_PATH` descriptor of it, not the locked one).
    dir: OwnedFd,
    path: PathBuf,
    /// The file with the `oom_kill` count: v1 `memory.oom_control`, v2 `memory.events`.
    events: &'static str,
    /// The file a process writes `0` into to enter, and whose reading lists those in it: v1
    /// `tasks` (threads), v2 `cgroup.procs`.
    join: &'static str,
    /// Control files written in each new child before it is handed out (v1: the socket-buffer
    /// knob, without which the child's sockets are charged to no cgroup at all).
    setup: Vec<(&'static str, String)>,
    /// Each child's memory ceiling, set as it is handed out ([`Ceiling`]); `None`: none.
    ceiling: Option<Ceiling>,
    state: Mutex<State>,
}

/// How an exec cgroup's memory ceiling is set: the run's ceiling, its usage file (hierarchical:
/// v1 `memory.usage_in_bytes`, v2 `memory.current`) and the ceiling file (v1
/// `memory.limit_in_bytes`, v2 `memory.max`).
pub(crate) struct Ceiling {
    pub(crate) run: u64,
    pub(crate) usage: &'static str,
    pub(crate) limit: &'static str,
}

#[derive(Default)]
struct State {
    seq: u64,
    /// Directories made and not yet removed, and whether their exec has ended.
    live: Vec<(String, bool)>,
    /// OOM kills counted in directories since removed.
    removed_oom: u64,
    /// Bytes held for processes of the run's own about to have them charged outside the exec
    /// cgroups ([`Children::reserve`]): counted as charged outside them in every ceiling set.
    reserved: u64,
}

impl State {
    fn ended(&self) -> usize {
        self.live.iter().filter(|c| c.1).count()
    }
}

impl Children {
    /// The exec cgroups of the run whose (memory) directory is `parent`.
    pub(crate) fn new(
        parent: &owner::Owned,
        events: &'static str,
        join: &'static str,
        setup: Vec<(&'static str, String)>,
        ceiling: Option<Ceiling>,
    ) -> Result<Children, CgroupError> {
        let dir = rustix::fs::openat(
            parent.dir_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_at("open", &parent.path)(e.into()))?;
        match rustix::fs::mkdirat(&dir, EXECS, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(io_at("create", &parent.path.join(EXECS))(e.into())),
        }
        // v2: the memory controller for the exec cgroups under it (it holds no process itself).
        if events == "memory.events" {
            let rel = format!("{EXECS}/cgroup.subtree_control");
            rustix::fs::openat(
                &dir,
                rel.as_str(),
                OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .and_then(|f| rustix::io::write(&f, b"+memory"))
            .map_err(|e| io_at("write", &parent.path.join(&rel))(e.into()))?;
        }
        Ok(Children {
            dir,
            path: parent.path.clone(),
            events,
            join,
            setup,
            ceiling,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An exec cgroup: an ended one nothing runs in, or a new one, or, where neither can be had
    /// ([`MAX_EXEC_CGROUPS`], [`MADE_EXEC_CGROUPS`], [`MAX_EXEC_CGROUPS_IN_PROCESS`]), one shared
    /// with an exec that holds it (its ceiling holds for both; its OOM count is theirs together).
    /// Its memory ceiling is set as it is handed out ([`Children::set_ceiling`]). `None` only
    /// where the run has no exec cgroup at all and may make none.
    pub(crate) fn make(self: &Arc<Self>) -> Result<Option<Box<dyn ExecCgroup>>, CgroupError> {
        let mut st = self.state();
        // An ended exec's, once nothing runs in it, counting from its count now.
        for i in 0..st.live.len() {
            let (name, ended) = &st.live[i];
            if !*ended || !self.empty(name) {
                continue;
            }
            let Some(base) = self.oom_kills(name) else {
                continue;
            };
            st.live[i].1 = false;
            let name = st.live[i].0.clone();
            self.set_ceiling(&name, st.reserved);
            return Ok(Some(Box::new(Exec {
                children: self.clone(),
                name,
                base,
                shared: false,
            })));
        }
        self.remove_ended(&mut st, IDLE_EXEC_CGROUPS);
        // A run's first exec cgroup does not count against the process's: each run (session)
        // can have one, with its ceiling, whatever others hold (bounded by the runs).
        let place = || {
            if st.live.is_empty() {
                IN_PROCESS.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                true
            } else {
                take_place()
            }
        };
        if st.live.len() >= MAX_EXEC_CGROUPS || st.seq >= MADE_EXEC_CGROUPS || !place() {
            return Ok(self.share(&st));
        }
        let name = format!("{EXECS}/exec-{}", st.seq);
        st.seq += 1;
        if let Err(e) = rustix::fs::mkdirat(&self.dir, name.as_str(), Mode::from_raw_mode(0o700)) {
            give_places(1);
            return Err(io_at("create", &self.path.join(&name))(e.into()));
        }
        for (file, value) in &self.setup {
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
                give_places(1);
                return Err(io_at("write", &self.path.join(&rel))(e.into()));
            }
        }
        if !self.set_ceiling(&name, st.reserved) {
            let rel = format!("{name}/{}", self.ceiling.as_ref().map_or("", |c| c.limit));
            let _ = rustix::fs::unlinkat(&self.dir, name.as_str(), AtFlags::REMOVEDIR);
            give_places(1);
            return Err(io_at("write", &self.path.join(rel))(std::io::Error::other(
                "the exec's memory ceiling could not be set",
            )));
        }
        st.live.push((name.clone(), false));
        Ok(Some(Box::new(Exec {
            children: self.clone(),
            name,
            base: 0,
            shared: false,
        })))
    }

    /// One of the run's exec cgroups, shared with the exec that holds it: one an ended exec left
    /// a process in first, else the newest. Its ceiling is set again for what is charged now.
    fn share(self: &Arc<Self>, st: &State) -> Option<Box<dyn ExecCgroup>> {
        let (name, _) = st
            .live
            .iter()
            .find(|(_, ended)| *ended)
            .or_else(|| st.live.last())?;
        let base = self.oom_kills(name)?;
        self.set_ceiling(name, st.reserved);
        Some(Box::new(Exec {
            children: self.clone(),
            name: name.clone(),
            base,
            shared: true,
        }))
    }

    /// Sets child `name`'s memory ceiling for the exec it is handed to: [`exec_memory_ceiling`]
    /// of the run's, and no more than what the run has left beside what is charged outside the
    /// child now (files earlier execs wrote in other children, the agent's memory, held
    /// cgroups), less the same room; but a quarter of the room more than what is charged to the
    /// child now, so that a small program (an `rm` to make space) can still start, as long as
    /// that is within a quarter of the room past what is left (together, the run's processes
    /// keep three quarters of the room whatever the execs do).
    /// First the ceiling of all the execs together ([`EXECS`]) is set the same way for what is
    /// charged outside them. What is `reserved` ([`Children::reserve`]) counts as charged
    /// outside. Returns whether the child's was set (or there is none to set).
    fn set_ceiling(&self, name: &str, reserved: u64) -> bool {
        let Some(c) = &self.ceiling else {
            return true;
        };
        self.set_execs_ceiling(c, reserved);
        let own = self.usage(c, name).unwrap_or(0);
        let limit = self.ceiling_for(c, self.usage(c, "."), own, reserved);
        self.write_limit(c, name, limit).is_ok()
    }

    /// The ceiling of a child that holds `own` of the run's `run` bytes charged (and `reserved`
    /// more held, [`Children::reserve`]): see [`Children::set_ceiling`].
    fn ceiling_for(&self, c: &Ceiling, run: Option<u64>, own: u64, reserved: u64) -> u64 {
        let top = exec_memory_ceiling(c.run);
        let room = c.run - top;
        let others = run.map_or(0, |r| r.saturating_sub(own)) + reserved;
        let left = top.saturating_sub(others);
        // A quarter of the room past what it holds, so that an `rm` can start in a full
        // session; but never more than that past what is left: measured from what it holds
        // alone, the allowance came again with each exec, and files kept what each took (five
        // execs that filled scratch took the session past its ceiling, found by an independent
        // attack). Never below what it holds (v1 refuses that; it meets its ceiling at its next
        // page instead).
        left.max(own.saturating_add(room / 4))
            .min(left.saturating_add(room / 4))
            .min(top)
            .max(own)
    }

    /// Sets the ceiling of all the execs together ([`EXECS`]) for what is charged outside them
    /// now and `reserved`. What is charged can grow between the reading and the writing: v1 then
    /// refuses a ceiling below it (busy), and the figures are read again.
    fn set_execs_ceiling(&self, c: &Ceiling, reserved: u64) {
        for _ in 0..3 {
            let execs = self.usage(c, EXECS).unwrap_or(0);
            let limit = self.ceiling_for(c, self.usage(c, "."), execs, reserved);
            if self.write_limit(c, EXECS, limit) != Err(Errno::BUSY) {
                break;
            }
        }
    }

    /// The memory charged to child `rel` (`.`: the run), hierarchically.
    fn usage(&self, c: &Ceiling, rel: &str) -> Option<u64> {
        let mut buf = [0u8; 32];
        let text = self.read(rel, c.usage, &mut buf)?;
        std::str::from_utf8(text).ok()?.trim().parse().ok()
    }

    /// Writes `limit` as child `rel`'s memory ceiling.
    fn write_limit(&self, c: &Ceiling, rel: &str, limit: u64) -> Result<(), Errno> {
        let f = rustix::fs::openat(
            &self.dir,
            format!("{rel}/{}", c.limit).as_str(),
            OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        rustix::io::write(&f, limit.to_string().as_bytes()).map(|_| ())
    }

    /// Holds `bytes` of the run's memory for a process of the run's own (a session's agent
    /// writing a file into scratch) outside the exec cgroups, if the run has that much left
    /// beside the room ([`exec_memory_ceiling`]) and what is charged and held already: the
    /// execs' ceiling ([`EXECS`]) is lowered so that they cannot take it meanwhile, and every
    /// ceiling set until the reservation is dropped counts it as charged. Otherwise `Full` with
    /// what is left. Without it, a file written into a full session was charged past the
    /// session's ceiling and the kernel killed the session's largest process, the agent.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<MemoryReservation, ReserveError> {
        let Some(c) = &self.ceiling else {
            return Ok(MemoryReservation::none());
        };
        if bytes == 0 {
            // Nothing to hold: its end sets the execs' ceiling again (after a file's removal).
            return Ok(MemoryReservation {
                held: Some((self.clone(), 0)),
            });
        }
        let mut st = self.state();
        let top = exec_memory_ceiling(c.run);
        let unread = |what: &str| {
            ReserveError::Cgroup(io_at("read", &self.path.join(what))(std::io::Error::other(
                "the memory charged could not be read",
            )))
        };
        let run = self.usage(c, ".").ok_or_else(|| unread(c.usage))?;
        let left = top.saturating_sub(run.saturating_add(st.reserved));
        if bytes > left {
            return Err(ReserveError::Full { left });
        }
        // What the execs may have: the least of what is left beside the rest; they hold no more
        // than that now (`bytes` fits), unless they took more since the reading (v1: busy).
        let execs = self.usage(c, EXECS).unwrap_or(0);
        let outside = run.saturating_sub(execs);
        let limit = top.saturating_sub(outside + st.reserved + bytes);
        match self.write_limit(c, EXECS, limit) {
            Ok(()) => {}
            Err(Errno::BUSY) => {
                return Err(ReserveError::Full {
                    left: left
                        .saturating_sub(self.usage(c, EXECS).unwrap_or(0).saturating_sub(execs)),
                })
            }
            Err(e) => {
                return Err(ReserveError::Cgroup(io_at(
                    "write",
                    &self.path.join(EXECS).join(c.limit),
                )(e.into())))
            }
        }
        st.reserved += bytes;
        Ok(MemoryReservation {
            held: Some((self.clone(), bytes)),
        })
    }

    /// A reservation's end. The execs' ceiling is set again: what the reservation held is
    /// charged now (a file written), or was never taken (a write refused, a file removed since).
    pub(crate) fn unreserve(&self, bytes: u64) {
        let mut st = self.state();
        st.reserved = st.reserved.saturating_sub(bytes);
        if let Some(c) = &self.ceiling {
            self.set_execs_ceiling(c, st.reserved);
        }
    }

    /// Reads up to `buf.len()` bytes of the control file `file` of child `name`.
    fn read<'a>(&self, name: &str, file: &str, buf: &'a mut [u8]) -> Option<&'a [u8]> {
        let n = crate::held::read_at(&self.dir, name, file, buf)?;
        Some(&buf[..n])
    }

    /// The `oom_kill` count of child `name`; `None` if it cannot be read.
    fn oom_kills(&self, name: &str) -> Option<u64> {
        let mut buf = [0u8; 4096];
        let text = self.read(name, self.events, &mut buf)?;
        std::str::from_utf8(text)
            .ok()
            .and_then(|s| keyed(s, "oom_kill"))
    }

    /// The `oom_kill` count of child `name` (an exec's, or another child of the run such as a
    /// v2 run's leaf); 0 if it cannot be read.
    pub(crate) fn oom_kills_of(&self, name: &str) -> u64 {
        self.oom_kills(name).unwrap_or(0)
    }

    /// Whether every exec cgroup of the run is known to hold no process.
    pub(crate) fn all_empty(&self) -> bool {
        let st = self.state();
        st.live.iter().all(|(n, _)| self.empty(n))
    }

    /// Whether child `name` is known to hold no process (its process list read, and empty).
    fn empty(&self, name: &str) -> bool {
        let mut buf = [0u8; 1];
        self.read(name, self.join, &mut buf)
            .is_some_and(|b| b.is_empty())
    }

    /// Removes the directories of ended execs that nothing runs in any more (one attempt each)
    /// until at most `keep` ended ones are left.
    fn remove_ended(&self, st: &mut State, keep: usize) {
        let mut ended = st.ended();
        let mut i = 0;
        while i < st.live.len() && ended > keep {
            let (name, ended_) = &st.live[i];
            if *ended_ {
                let kills = self.oom_kills(name).unwrap_or(0);
                self.give_back(name);
                match rustix::fs::unlinkat(&self.dir, name.as_str(), AtFlags::REMOVEDIR) {
                    Ok(()) | Err(Errno::NOENT) => {
                        st.removed_oom += kills;
                        st.live.remove(i);
                        give_places(1);
                        ended -= 1;
                        continue;
                    }
                    Err(_) => {} // busy: processes it left still run there
                }
            }
            i += 1;
        }
    }

    /// Past the mark, child `name`, about to be removed, gives back what is charged to it if
    /// nothing runs in it, so that the kernel frees it with its directory (`crate::held`).
    fn give_back(&self, name: &str) {
        let v2 = self.events == "memory.events";
        let parent = crate::held::parent_of(&self.path);
        let count = if v2 {
            crate::held::Count::V2(&parent)
        } else {
            crate::held::Count::V1
        };
        if crate::held::over(count) {
            crate::held::give_back(&self.dir, name, v2);
        }
    }

    /// OOM kills counted in every exec cgroup of the run, removed ones included.
    pub(crate) fn oom_total(&self) -> u64 {
        let st = self.state();
        st.removed_oom
            + st.live
                .iter()
                .map(|(n, _)| self.oom_kills(n).unwrap_or(0))
                .sum::<u64>()
    }

    fn ended(&self, name: &str) {
        let mut st = self.state();
        if let Some(c) = st.live.iter_mut().find(|(n, _)| n == name) {
            c.1 = true;
        }
        self.remove_ended(&mut st, IDLE_EXEC_CGROUPS);
        // What the exec left (files it removed, memory it gave back) goes back to the others.
        if let Some(c) = &self.ceiling {
            self.set_execs_ceiling(c, st.reserved);
        }
    }
}

impl Drop for Children {
    /// The run is gone, and its exec cgroups with it (`remove_children`, or the run's stale
    /// cleanup): their places go back.
    fn drop(&mut self) {
        give_places(self.state().live.len());
    }
}

/// One exec's cgroup.
struct Exec {
    children: Arc<Children>,
    name: String,
    /// Its count when this exec took it (an earlier exec's kills).
    base: u64,
    /// Shared with the exec that holds it: its end is that exec's to tell.
    shared: bool,
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
        self.children
            .oom_kills(&self.name)
            .map_or(0, |n| n.saturating_sub(self.base))
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn shared(&self) -> bool {
        self.shared
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        if !self.shared {
            self.children.ended(&self.name);
        }
    }
}

/// Removes the child cgroups of run directory `dir` (the exec cgroups under [`EXECS`], then it;
/// the leaf of a v2 run's own processes), so that the directory itself can go; one attempt each. For a run
/// directory the kernel reports busy.
pub(crate) fn remove_children(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten().take(4 * MAX_EXEC_CGROUPS) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if e.file_name() == EXECS {
                remove_children(&e.path());
            }
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's files of a v1 memory cgroup that these tests read: its OOM count and its
    /// process list (`procs` lines).
    fn kernel_files(dir: &Path, kills: u64, procs: &str) {
        std::fs::write(
            dir.join("memory.oom_control"),
            format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"),
        )
        .unwrap();
        std::fs::write(dir.join("tasks"), procs).unwrap();
    }

    #[test]
    fn an_exec_ceiling_leaves_a_sixteenth_between_16_and_64_mib_at_most_a_quarter() {
        const M: u64 = 1 << 20;
        for (run, exec) in [
            (2048 * M, 1984 * M), // the default session: 64 MiB, the most
            (512 * M, 480 * M),   // a sixteenth
            (128 * M, 112 * M),   // 16 MiB, the least
            (64 * M, 48 * M),     // 16 MiB is a quarter
            (32 * M, 24 * M),     // a quarter, under 16 MiB
            (M, 768 << 10),       // the least ceiling a policy takes
        ] {
            assert_eq!(exec_memory_ceiling(run), exec, "{run}");
        }
    }

    #[test]
    fn exec_cgroups_are_bounded_counted_reused_and_removed() {
        let parent = std::env::temp_dir().join(format!("palisade-exec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        let run = match owner::make(&parent.join("run-7-00000000000000dd-0")) {
            Ok(o) => o,
            Err(_) => panic!("could not make the run directory"),
        };
        let c =
            Arc::new(Children::new(&run, "memory.oom_control", "tasks", Vec::new(), None).unwrap());
        let a = c.make().unwrap().expect("an exec cgroup");
        let b = c.make().unwrap().expect("another");
        assert_ne!(a.name(), b.name());
        let (an, bn) = (a.name().to_owned(), b.name().to_owned());
        kernel_files(&run.path.join(&an), 2, "");
        kernel_files(&run.path.join(&bn), 0, "41\n");
        assert_eq!((a.oom_kills(), b.oom_kills()), (2, 0));
        assert_eq!(c.oom_total(), 2);
        // Ended, a's is kept, and the next exec takes it: the same directory, counting from its
        // count then; the run's total still holds the earlier kills.
        drop(a);
        assert!(
            run.path.join(&an).is_dir(),
            "an ended exec's directory is kept"
        );
        let again = c.make().unwrap().expect("a's again");
        assert_eq!(again.name(), an, "an empty ended exec's directory is taken");
        assert_eq!(
            again.oom_kills(),
            0,
            "the earlier exec's kills are not this one's"
        );
        kernel_files(&run.path.join(&an), 3, "");
        assert_eq!((again.oom_kills(), c.oom_total()), (1, 3));
        // One that a process still runs in is not taken.
        drop(b);
        let other = c.make().unwrap().expect("a new one");
        assert!(other.name() != bn && other.name() != an, "{}", other.name());
        // One whose process list cannot be read (here: has none) is not taken either.
        assert_eq!(other.name(), "execs/exec-2");
        drop(other);
        let fourth = c.make().unwrap().expect("a fourth");
        assert_eq!(fourth.name(), "execs/exec-3");
        drop(again);
        // Bounded: past MAX_EXEC_CGROUPS, none of them free, an exec shares one that an ended
        // exec left a process in. Each new one here holds a process.
        let mut more = vec![fourth];
        kernel_files(&run.path.join("execs/exec-3"), 0, "1\n");
        let shared = loop {
            let e = c.make().unwrap().expect("one, or a shared one");
            if e.shared() {
                break e;
            }
            if e.name() != an {
                kernel_files(&run.path.join(e.name()), 0, "1\n");
            }
            more.push(e);
        };
        assert_eq!(more.len(), MAX_EXEC_CGROUPS - 2, "all but b's and exec-2");
        assert_eq!(
            shared.name(),
            bn,
            "the one an ended exec left a process in is shared first"
        );
        assert_eq!(c.state().live.len(), MAX_EXEC_CGROUPS, "no new one for it");
        drop(shared);
        assert!(
            c.state().live.iter().any(|(n, ended)| *n == bn && *ended),
            "a shared one's end leaves it as it was"
        );
        // Ended ones past IDLE_EXEC_CGROUPS are removed once nothing is in them (the files
        // stand for a process here: the kernel's go with the directory).
        for e in &more {
            let d = run.path.join(e.name());
            for f in ["tasks", "memory.oom_control"] {
                let _ = std::fs::remove_file(d.join(f));
            }
        }
        drop(more);
        let left: Vec<_> = std::fs::read_dir(run.path.join(EXECS))
            .unwrap()
            .flatten()
            .collect();
        assert!(
            left.len() <= IDLE_EXEC_CGROUPS + 2,
            "{} directories left: {left:?}",
            left.len()
        );
        // Over its life a run makes no more than MADE_EXEC_CGROUPS; free ones are still taken.
        let made = |c: &Arc<Children>| c.state().seq;
        while made(&c) < MADE_EXEC_CGROUPS {
            // (With no process list to read, an ended one is not taken again.)
            drop(c.make().unwrap().expect("one more"));
        }
        let ended = std::fs::read_dir(run.path.join(EXECS))
            .unwrap()
            .flatten()
            .map(|e| format!("{EXECS}/{}", e.file_name().to_string_lossy()))
            .find(|n| *n != bn)
            .expect("an ended one kept");
        kernel_files(&run.path.join(&ended), 0, "");
        let free = c
            .make()
            .unwrap()
            .expect("an ended, empty one is still taken");
        assert_eq!(free.name(), ended);
        let past = c.make().unwrap().expect("a shared one");
        assert!(
            past.shared(),
            "a new one past the run's {MADE_EXEC_CGROUPS}: {}",
            past.name()
        );
        drop(past);
        drop(free);
        for e in std::fs::read_dir(run.path.join(EXECS)).unwrap().flatten() {
            if format!("{EXECS}/{}", e.file_name().to_string_lossy()) != bn {
                for f in ["tasks", "memory.oom_control"] {
                    let _ = std::fs::remove_file(e.path().join(f));
                }
            }
        }
        // One process holds at most MAX_EXEC_CGROUPS_IN_PROCESS, all its runs together; a run
        // that goes gives its places back.
        let held_here = |c: &Children| c.state().live.len();
        let before = IN_PROCESS.load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(
            before,
            held_here(&c),
            "this run's are all the process holds"
        );
        let mut runs = Vec::new();
        let mut handles = Vec::new();
        for r in 0.. {
            let o = match owner::make(&parent.join(format!("run-7-00000000000000dd-{}", r + 1))) {
                Ok(o) => o,
                Err(_) => panic!("could not make run directory {r}"),
            };
            let cr = Arc::new(
                Children::new(&o, "memory.oom_control", "tasks", Vec::new(), None).unwrap(),
            );
            loop {
                let e = cr.make().unwrap().expect("one, or a shared one");
                if e.shared() {
                    break;
                }
                kernel_files(&o.path.join(e.name()), 0, "1\n");
                handles.push(e);
            }
            let full = held_here(&cr) < MAX_EXEC_CGROUPS;
            runs.push((o, cr));
            if full {
                break;
            }
        }
        // (A run's first is made past the cap too: the last run's may be one more.)
        let total = handles.len() + before;
        assert!(
            total == MAX_EXEC_CGROUPS_IN_PROCESS || total == MAX_EXEC_CGROUPS_IN_PROCESS + 1,
            "{total} exec cgroups made in the process"
        );
        // Past the process's cap, a new run still gets its first, and its next exec shares it.
        let o = match owner::make(&parent.join("run-7-00000000000000dd-first")) {
            Ok(o) => o,
            Err(_) => panic!("could not make a run directory"),
        };
        let cr =
            Arc::new(Children::new(&o, "memory.oom_control", "tasks", Vec::new(), None).unwrap());
        let first = cr
            .make()
            .unwrap()
            .expect("a run's first, past the process's cap");
        assert!(!first.shared());
        kernel_files(&o.path.join(first.name()), 0, "1\n");
        let second = cr.make().unwrap().expect("a shared one");
        assert!(second.shared() && second.name() == first.name());
        drop((first, second));
        drop(cr);
        std::fs::remove_dir_all(&o.path).unwrap();
        drop(o);
        drop(handles);
        drop(runs);
        assert_eq!(
            IN_PROCESS.load(std::sync::atomic::Ordering::Acquire),
            before
        );
        // Directories only stay while something is in them; a file stands for that here.
        remove_children(&run.path);
        let left: Vec<_> = std::fs::read_dir(run.path.join(EXECS))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(
            left.len(),
            1,
            "only b, which still holds a file, is left: {left:?}"
        );
        std::fs::remove_dir_all(run.path.join(&bn)).unwrap();
        remove_children(&run.path);
        assert_eq!(
            std::fs::read_dir(&run.path).unwrap().count(),
            0,
            "the execs' own directory goes once its exec cgroups are gone"
        );
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
