//! Removed memory cgroups the kernel still holds, kept few.
//!
//! Removing a memory cgroup does not free it while pages are still charged to it: a file page is
//! charged to the cgroup of the process that first brought it into the page cache (a host file a
//! run was the first to read, a file a session's exec wrote), and it stays charged, the removed
//! cgroup held with it, until the page is reclaimed; on a host with memory to spare, that is not
//! soon. A held cgroup keeps its kernel memory, in no sandbox's ceiling: ~30 KiB here (2,000 held
//! ones took 6.3 MB of per-CPU memory and 54 MB of slab on this 2-CPU VM, 2026-12-05), more on a
//! host with more CPUs (the per-CPU part grows with them), and every reclaim and statistics walk
//! of the hierarchy visits it. 300 one-shot runs that each read a different file of `/usr` left
//! 300 held, so a tenant's cheap runs could have the host keep gigabytes (72,000 held: 2.2 GB
//! here). (They do not spend the kernel's 65,535 memory cgroup ids: since Linux 4.8 a cgroup
//! gives its id back when it is removed, and more than 65,535 held ones were made here with a
//! `mkdir` still working after them. Live ones do hold ids: see `crate::exec`.)
//!
//! So once the host holds more than [`GIVE_BACK_ABOVE`] memory cgroups, a run's (or an exec's)
//! memory cgroup whose processes are gone gives back what is charged to it just before it is
//! removed, and is then freed with its directory: v1 `memory.force_empty`, v2 `memory.reclaim` of
//! what `memory.current` shows (with no process left, only page cache and kernel objects; pages of
//! a tmpfs cannot be given back on a host without swap, but a run's scratch tmpfs is gone with
//! its processes). Below the mark nothing is given back: the pages a run brought in (an
//! interpreter's modules, say) stay cached for the next, charged to the held cgroup. Giving back
//! always would throw away what the next run of the same program would read again; past the mark
//! it throws away only what each run newly brought in, since what later runs share stays charged
//! to cgroups held from before.
//!
//! The count: v1 has no count for part of a hierarchy, so it is the host's (the `memory` line of
//! `/proc/cgroups`, live and held); v2 counts palisade's own (`nr_dying_descendants` of the
//! palisade parent's `cgroup.stat`). It is read at most once every 100 ms; one that cannot be
//! read gives nothing back.

use crate::keyed;
use rustix::fs::{Mode, OFlags};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Memory cgroups the host holds (see the module's text for what is counted) past which a run's
/// gives back its pages before it is removed: ~120 MiB of held cgroups on this 2-CPU VM.
pub const GIVE_BACK_ABOVE: u64 = 4_096;

static ABOVE: AtomicU64 = AtomicU64::new(GIVE_BACK_ABOVE);

/// The last count read, and when, and where (`None`: the host's, v1).
static LAST: Mutex<Option<(Instant, u64, Option<PathBuf>)>> = Mutex::new(None);

/// How long a count read stands.
const FRESH: Duration = Duration::from_millis(100);

/// Sets the mark past which a removed memory cgroup gives back its pages first (for this
/// process; [`GIVE_BACK_ABOVE`] unless set): `0` gives back always, `u64::MAX` never.
pub fn set_give_back_above(n: u64) {
    ABOVE.store(n, Ordering::Relaxed);
}

/// Where the count is read.
pub(crate) enum Count<'a> {
    /// The host's, from `/proc/cgroups`.
    V1,
    /// Palisade's removed ones, under this parent.
    V2(&'a Path),
}

impl Count<'_> {
    fn read(&self) -> Option<u64> {
        match self {
            Count::V1 => host_memory_cgroups(&std::fs::read_to_string("/proc/cgroups").ok()?),
            Count::V2(parent) => keyed(
                &std::fs::read_to_string(parent.join("cgroup.stat")).ok()?,
                "nr_dying_descendants",
            ),
        }
    }
}

/// The memory controller's `num_cgroups` in `/proc/cgroups`.
fn host_memory_cgroups(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some("memory")).then(|| f.nth(1)?.parse().ok())?
    })
}

/// Whether a memory cgroup removed now should give back its pages first.
pub(crate) fn over(count: Count<'_>) -> bool {
    let above = ABOVE.load(Ordering::Relaxed);
    match above {
        0 => return true,
        u64::MAX => return false,
        _ => {}
    }
    let key = match count {
        Count::V1 => None,
        Count::V2(p) => Some(p),
    };
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let n = match &*last {
        Some((at, n, k)) if at.elapsed() < FRESH && k.as_deref() == key => *n,
        _ => {
            let n = count.read().unwrap_or(0);
            *last = Some((Instant::now(), n, key.map(Path::to_path_buf)));
            n
        }
    };
    n > above
}

/// Gives back what is charged to memory cgroup `rel` under directory `dir` (`.`: `dir` itself)
/// if no process is left in it (v1 `tasks` empty, v2 `cgroup.events` `populated 0`, which covers
/// its children too); `v2` picks the files. Best effort: what it cannot give back keeps the
/// cgroup held, as without it.
pub(crate) fn give_back(dir: impl AsFd, rel: &str, v2: bool) {
    // Processes still there (exiting, or left behind) would have their own memory reclaimed,
    // written to swap on a host with it, in fruitless rounds without.
    if !no_process_in(&dir, rel, v2) {
        return;
    }
    let open = |name: &str, flags: OFlags| {
        rustix::fs::openat(
            &dir,
            format!("{rel}/{name}").as_str(),
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
    };
    let mut buf = [0u8; 256];
    if !v2 {
        if let Ok(f) = open("memory.force_empty", OFlags::WRONLY) {
            let _ = rustix::io::write(&f, b"0");
        }
        return;
    }
    let Some(n) = read_at(&dir, rel, "memory.current", &mut buf) else {
        return;
    };
    let current = std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let (Some(bytes @ 1..), Ok(f)) = (current, open("memory.reclaim", OFlags::WRONLY)) {
        // Fails (EAGAIN) when it could not reclaim all of it; what is left is left.
        let _ = rustix::io::write(&f, bytes.to_string().as_bytes());
    }
}

/// Reads up to `buf.len()` bytes of control file `name` of cgroup `rel` under `dir`.
pub(crate) fn read_at(dir: impl AsFd, rel: &str, name: &str, buf: &mut [u8]) -> Option<usize> {
    let f = rustix::fs::openat(
        &dir,
        format!("{rel}/{name}").as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .ok()?;
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(&f, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    Some(n)
}

/// Whether cgroup `rel` under `dir` is known to hold no process: v1 its own `tasks` empty, v2
/// `cgroup.events` `populated 0` (its children too).
pub(crate) fn no_process_in(dir: impl AsFd, rel: &str, v2: bool) -> bool {
    let mut buf = [0u8; 256];
    if v2 {
        read_at(&dir, rel, "cgroup.events", &mut buf).is_some_and(|n| {
            std::str::from_utf8(&buf[..n]).is_ok_and(|t| keyed(t, "populated") == Some(0))
        })
    } else {
        read_at(&dir, rel, "tasks", &mut buf[..1]) == Some(0)
    }
}

/// Before a run directory left busy earlier is tried again (this process's pending ones, a dead
/// supervisor's stale ones): past the mark, if it is a memory cgroup, what is charged to it and
/// to its children (a session's exec cgroups) is given back, as a run's own removal does
/// ([`give_back`], each only with no process left in it). The first removal gave nothing back
/// while a process was still there.
pub(crate) fn before_late_removal(path: &Path) {
    let v2 = path.join("memory.reclaim").exists();
    if !v2 && !path.join("memory.force_empty").exists() {
        return; // not a memory cgroup (pids, cpu), or a kernel without the file
    }
    let parent = parent_of(path);
    if !over(if v2 { Count::V2(&parent) } else { Count::V1 }) {
        return;
    }
    let Ok(dir) = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    ) else {
        return;
    };
    // Still busy with a process of its own: it stays, nothing to give back yet.
    if !no_process_in(&dir, ".", v2) {
        return;
    }
    // v1: each child on its own (a v1 directory lists only its own processes), the exec
    // cgroups under the execs' own child first; v2's reclaim of the directory covers its
    // children, and its `populated` theirs.
    if !v2 {
        let children = |rel: &Path| -> Vec<String> {
            let Ok(rd) = std::fs::read_dir(path.join(rel)) else {
                return Vec::new();
            };
            rd.flatten()
                .take(4 * crate::exec::MAX_EXEC_CGROUPS)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect()
        };
        for name in children(Path::new("")) {
            if name == crate::exec::EXECS {
                for exec in children(Path::new(crate::exec::EXECS)) {
                    give_back(&dir, &format!("{name}/{exec}"), false);
                }
            }
            give_back(&dir, &name, false);
        }
    }
    give_back(&dir, ".", v2);
}

/// The palisade parent of a v2 run directory.
pub(crate) fn parent_of(run: &Path) -> PathBuf {
    run.parent().map(Path::to_path_buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_count_is_the_memory_line_of_proc_cgroups() {
        let text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\n\
                    cpu\t3\t40\t1\n\
                    memory\t4\t512\t1\n\
                    pids\t8\t90\t1\n";
        assert_eq!(host_memory_cgroups(text), Some(512));
        assert_eq!(host_memory_cgroups("cpu\t3\t40\t1\n"), None);
        assert_eq!(host_memory_cgroups("memory\t4\n"), None);
    }
}
