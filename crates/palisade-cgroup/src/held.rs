//! Removed memory cgroups the kernel still holds, kept few.
//!
//! Removing a memory cgroup does not free it while pages are still charged to it: a file page is
//! charged to the cgroup of the process that first brought it into the page cache (a host file a
//! run was the first to read, a file a session's exec wrote), and it stays charged, the removed
//! cgroup held with it, until the page is reclaimed. On a host with memory to spare that is never.
//! The kernel has 65,535 memory cgroup ids for the whole host, live and held alike, and once they
//! are spent no cgroup can be made there at all, by palisade or systemd or a container runtime.
//! A run that reads one page no earlier run read holds one id: 300 one-shot runs that each read a
//! different file of `/usr` left 300 held (this v1 VM, 2026-12-05), so a tenant with 65,000 cheap
//! runs could stop every cgroup on the host.
//!
//! So once the host holds more than [`GIVE_BACK_ABOVE`] memory cgroups, a run's (or an exec's)
//! memory cgroup gives back what is charged to it just before it is removed, and is then freed
//! with its directory: v1 `memory.force_empty`, v2 `memory.reclaim` of what `memory.current`
//! shows (its processes are gone by then, so that is only page cache and kernel objects).
//! Below the mark nothing is given back: the pages a run brought in (an interpreter's modules,
//! say) stay cached for the next, charged to the held cgroup. Giving back always would throw away
//! what the next run of the same program would read again; past the mark it throws away only
//! what each run newly brought in, since what later runs share stays charged to the cgroups held
//! before.
//!
//! The count: v1 has no count for part of a hierarchy, so it is the host's (the `memory` line of
//! `/proc/cgroups`, live and held); v2 counts palisade's own (`nr_dying_descendants` of the
//! palisade parent's `cgroup.stat`). It is read at most once every 100 ms.

use crate::keyed;
use rustix::fs::{Mode, OFlags};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Memory cgroups the host holds (see the module's text for what is counted) past which a run's
/// gives back its pages before it is removed: a quarter of the kernel's 65,535 ids.
pub const GIVE_BACK_ABOVE: u64 = 16_384;

static ABOVE: AtomicU64 = AtomicU64::new(GIVE_BACK_ABOVE);

/// The last count read, and when.
static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

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
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let n = match *last {
        Some((at, n)) if at.elapsed() < FRESH => n,
        _ => {
            let n = count.read().unwrap_or(0);
            *last = Some((Instant::now(), n));
            n
        }
    };
    n > above
}

/// Gives back what is charged to memory cgroup `rel` under directory `dir` (`.`: `dir` itself),
/// whose processes are gone; `v2` picks the file. Best effort: what it cannot give back keeps the
/// cgroup held, as without it.
pub(crate) fn give_back(dir: impl AsFd, rel: &str, v2: bool) {
    let open = |name: &str, flags: OFlags| {
        rustix::fs::openat(
            &dir,
            format!("{rel}/{name}").as_str(),
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
    };
    if !v2 {
        if let Ok(f) = open("memory.force_empty", OFlags::WRONLY) {
            let _ = rustix::io::write(&f, b"0");
        }
        return;
    }
    let mut buf = [0u8; 32];
    let Ok(f) = open("memory.current", OFlags::RDONLY) else {
        return;
    };
    let Ok(n) = rustix::io::read(&f, &mut buf) else {
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
