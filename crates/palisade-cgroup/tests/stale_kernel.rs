//! Stale cleanup against the real kernel, across pid namespaces: supervisors started with
//! `unshare -pf --mount-proc` (and `-r` for an unprivileged user) create run cgroups in the same
//! cgroupfs as this process, which cleans. Their pids mean nothing here (each is given one that
//! does not exist in this namespace), so only the lock can tell a live owner from a dead one.
//!
//! The supervisors are this test binary again, in the role of [`OWNER_ENV`]; they use a private
//! subtree of the real hierarchies, so the suite's other runs are not involved.

use palisade_cgroup::{CgroupLimits, Manager};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Set in a supervisor started by the test: the cgroup root it creates its runs under.
const OWNER_ENV: &str = "PALISADE_STALE_OWNER_ROOT";
/// This test's name, which a supervisor is started with (`--exact`).
const TEST: &str = "runs_of_a_supervisor_in_another_pid_namespace_go_only_once_it_is_gone";

const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 64 << 20,
    pids: 16,
    cpu_quota_us: None,
};

fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap()
}

/// The supervisor's side: two runs, its own process in the first (so that the kernel has to let
/// go of a member before the directory can go), then `owner-ready NAME NAME` and a wait for the
/// kill.
fn be_owner(root: &Path) {
    let m = palisade_cgroup::detect(root, 0).expect("the private root has a manager");
    let before = run_dirs(&memory_parent(root));
    let runs: Vec<_> = (0..2).map(|_| m.create(&LIMITS).unwrap()).collect();
    runs[0].join(std::process::id() as i32).unwrap();
    let mine: Vec<String> = run_dirs(&memory_parent(root))
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    // On a line of its own: libtest has just printed `test NAME ... ` without one.
    println!("\nowner-ready {}", mine.join(" "));
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Where this test's private subtree of the cgroup hierarchies goes, and the root to give
/// `detect` for it: v2, a cgroup with the memory and pids controllers; v1, a temporary directory
/// of links named after the hierarchies, to a cgroup in each.
struct Private {
    root: PathBuf,
    /// The cgroups made for the test, removed at the end (the palisade parent inside first).
    made: Vec<PathBuf>,
    links: Option<PathBuf>,
}

impl Private {
    fn new(test: &str) -> Private {
        let uid = euid();
        let real = Path::new("/sys/fs/cgroup");
        let m = palisade_cgroup::detect(real, uid).unwrap_or_else(|e| {
            panic!("no cgroup for this user ({e}): the test needs the suite's delegation")
        });
        let tag = format!("{test}-test-{}", std::process::id());
        if m.version() == "v2" {
            let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
            let own = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            let cg2 = cgroup2_mount();
            // Beside palisade's own runs: root's `palisade/`, a user's delegated cgroup (the one
            // holding the leaf the user's processes are in).
            let parent = if uid == 0 {
                cg2.join("palisade")
            } else {
                let own = cg2.join(own.trim_start_matches('/'));
                own.parent().unwrap().to_owned()
            };
            let d = parent.join(tag);
            std::fs::create_dir(&d).unwrap();
            Private {
                root: d.clone(),
                made: vec![d],
                links: None,
            }
        } else {
            let links = std::env::temp_dir().join(&tag);
            std::fs::create_dir(&links).unwrap();
            let mut made = Vec::new();
            for h in ["memory", "pids"] {
                let mut d = real.join(h).join("palisade");
                if uid != 0 {
                    d = d.join(format!("user-{uid}"));
                }
                let d = d.join(&tag);
                std::fs::create_dir(&d).unwrap();
                std::os::unix::fs::symlink(&d, links.join(h)).unwrap();
                made.push(d);
            }
            Private {
                root: links.clone(),
                made,
                links: Some(links),
            }
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        // After a failure, runs may be left (the supervisors are dead by now: dropped first).
        for d in &self.made {
            if let Ok(rd) = std::fs::read_dir(d.join("palisade")) {
                for e in rd
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("run-"))
                {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(d.join("palisade"));
            let _ = std::fs::remove_dir(d);
        }
        if let Some(l) = &self.links {
            let _ = std::fs::remove_dir_all(l);
        }
    }
}

fn cgroup2_mount() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let point = pre.split(' ').nth(4)?;
            (post.split(' ').next()? == "cgroup2").then(|| PathBuf::from(point))
        })
        .expect("no cgroup2 mount")
}

/// The palisade parent holding the runs (v1: the memory hierarchy's).
fn memory_parent(root: &Path) -> PathBuf {
    let v1 = root.join("memory");
    if v1.exists() {
        v1.join("palisade")
    } else {
        root.join("palisade")
    }
}

/// The run directories under `parent`, sorted.
fn run_dirs(parent: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("run-"))
        .collect();
    v.sort();
    v
}

/// A pid that no process has in this namespace, nor the next few: the supervisor in the other
/// namespace is given it, so that a cleaner judging by pid would take it for dead.
fn pid_unused_here() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (max / 2..max - 8)
        .rev()
        .step_by(97)
        .find(|p| (*p..p + 8).all(|q| !Path::new(&format!("/proc/{q}")).exists()))
        .expect("a free pid")
}

/// A supervisor started by the test; killed when dropped, so that a failing test leaves none.
struct Owner(Child);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A supervisor in a new pid namespace (and, for a user, a new user namespace), its pid there
/// set to one unused here; `--kill-child`: killing `unshare` kills the namespace's init, and with
/// it every process of the namespace. Returns it and the names of its runs.
fn start_owner(root: &Path) -> (Owner, Vec<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new("unshare");
    if euid() != 0 {
        c.arg("-r");
    }
    let mut child = c
        .args(["-pf", "--mount-proc", "--kill-child", "sh", "-c"])
        .arg(format!(
            "echo {} > /proc/sys/kernel/ns_last_pid || exit 1; \"$0\" \"$@\" & wait",
            pid_unused_here()
        ))
        .arg(&exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env(OWNER_ENV, root)
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) is needed for this test");
    let out = BufReader::new(child.stdout.take().unwrap());
    let child = Owner(child);
    let names = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("owner-ready ").map(str::to_owned))
        .unwrap_or_else(|| panic!("the supervisor in a new pid namespace never became ready"));
    (child, names.split(' ').map(str::to_owned).collect())
}

/// Kills a supervisor and waits until the kernel has dropped its locks (the process is gone):
/// a blocking `flock` on one of its run directories returns then.
fn kill_owner(owner: Owner, parent: &Path, name: &str) {
    drop(owner);
    let dir = std::fs::File::open(parent.join(name)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive);
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the killed supervisor's lock was never released")
        .unwrap();
}

/// Cleans until every run in `gone` has left `parent`: a directory whose last member is still
/// being torn down is kept and retried by the cleaner; the kernel's teardown is not instant.
fn clean_until_gone(m: &dyn Manager, parent: &Path, gone: &[String]) {
    for _ in 0..3000 {
        m.clean_stale();
        if gone.iter().all(|n| !parent.join(n).exists()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "left by a dead supervisor and never removed: {:?}",
        run_dirs(parent)
    );
}

#[test]
fn runs_of_a_supervisor_in_another_pid_namespace_go_only_once_it_is_gone() {
    if let Some(root) = std::env::var_os(OWNER_ENV) {
        return be_owner(Path::new(&root));
    }
    let private = Private::new("stale");
    let root = &private.root;
    let m = palisade_cgroup::detect(root, 0).unwrap();
    let parent = memory_parent(root);
    let (live, live_runs) = start_owner(root);
    let (doomed, doomed_runs) = start_owner(root);
    assert_eq!(
        live_runs.len() + doomed_runs.len(),
        4,
        "{:?}",
        run_dirs(&parent)
    );
    kill_owner(doomed, &parent, &doomed_runs[0]);

    // This process, in another pid namespace than both, cleans: the live supervisor's runs stay
    // (its process too, in the first), the killed one's go.
    let removed = m.clean_stale();
    clean_until_gone(m.as_ref(), &parent, &doomed_runs);
    assert_eq!(run_dirs(&parent), live_runs, "removed: {removed:?}");
    let procs = std::fs::read_to_string(parent.join(&live_runs[0]).join("cgroup.procs")).unwrap();
    assert!(
        !procs.trim().is_empty(),
        "the live supervisor left its cgroup"
    );
    if root.join("pids").exists() {
        let pids = root.join("pids/palisade");
        assert_eq!(run_dirs(&pids), live_runs, "v1: the pids hierarchy too");
    }

    // Once it is killed, its runs go as well.
    kill_owner(live, &parent, &live_runs[0]);
    clean_until_gone(m.as_ref(), &parent, &live_runs);
    assert_eq!(run_dirs(&parent), Vec::<String>::new());
    if root.join("pids").exists() {
        assert_eq!(run_dirs(&root.join("pids/palisade")), Vec::<String>::new());
    }
}

#[test]
fn a_run_cgroup_still_busy_is_not_waited_for_but_removed_later() {
    let private = Private::new("busy");
    let m = palisade_cgroup::detect(&private.root, 0).unwrap();
    let parent = memory_parent(&private.root);
    let mut run = m.create(&LIMITS).unwrap();
    let name = run_dirs(&parent).pop().unwrap();
    // A cgroup with a child cgroup that has a child of its own is busy for rmdir (EBUSY), as
    // one whose last member is still being torn down is, on v1 and v2 alike (v2's cgroup.kill
    // cannot empty this one): what the run thread waited ~0.9 s per hierarchy for before. Now
    // removal returns after a few ms, and the directory stays, locked by this process. (A run's
    // own children, a session's exec cgroups, are one level deep and removed with it once empty:
    // two levels stand for one that will not go yet.)
    let child = parent.join(&name).join("busy");
    let inner = child.join("inner");
    std::fs::create_dir(&child).unwrap();
    std::fs::create_dir(&inner).unwrap();
    let t = std::time::Instant::now();
    run.remove().unwrap();
    eprintln!(
        "remove() of a busy run cgroup returned after {:?}",
        t.elapsed()
    );
    assert!(parent.join(&name).is_dir());
    let other = std::fs::File::open(parent.join(&name)).unwrap();
    assert_eq!(
        rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive),
        Err(rustix::io::Errno::WOULDBLOCK),
        "the busy directory was let go: another cleaner could take it for stale while it is ours"
    );
    drop(other);
    // Once it is no longer busy, this process's next run removes it, its empty child first.
    std::fs::remove_dir(&inner).unwrap();
    drop(m.create(&LIMITS).unwrap());
    assert_eq!(run_dirs(&parent), Vec::<String>::new());
}
