//! The library API, used the way a long-running server would: many sandboxes from many threads.
//!
//! The tests that run sandboxes take [`serial`]: the leak check counts what this process holds,
//! which other tests' sandboxes in flight would blur, and the CPU-time test keeps a CPU busy for
//! seconds. None asserts a wall-clock window; the host may be busy.

use palisade::{Sandbox, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Held by every test of this binary that runs sandboxes.
fn serial() -> MutexGuard<'static, ()> {
    static RUNS: Mutex<()> = Mutex::new(());
    // A test that failed while holding it says so itself; the others may still run.
    RUNS.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn builder_runs_and_captures_output() {
    let _runs = serial();
    let out = Sandbox::builder()
        .command(["/bin/sh", "-c", "echo \"$MODE\"; pwd; echo err >&2; exit 7"])
        .env("MODE", "fast")
        .output()
        .unwrap();
    assert_eq!(out.report.status, Status::Exit, "{:?}", out.report);
    assert_eq!(out.report.exit_code, Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fast\n/workspace\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
}

#[test]
fn builder_rejects_bad_input_before_running() {
    let e = Sandbox::builder()
        .command(["true"])
        .env("1X", "y")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("1X"), "{e}");
    let e = Sandbox::builder()
        .command(Vec::<String>::new())
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("command"), "{e}");
    let e = Sandbox::builder()
        .command(["true"])
        .ro("relative")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("relative"), "{e}");
}

/// The builder's limits: checked when the sandbox is built, before anything runs, each error
/// naming its field and value; the first bad setting is the one reported; and what a setter
/// stores is what the policy gets. No sandbox runs here.
#[test]
fn builder_limits_are_checked_at_build_and_reach_the_policy() {
    let refused = |b: palisade::Builder| b.command(["true"]).build().unwrap_err().to_string();
    let e = refused(Sandbox::builder().timeout(Duration::ZERO));
    assert!(e.contains("timeout") && e.contains('0'), "{e}");
    let e = refused(Sandbox::builder().output_limit(0));
    assert!(e.contains("limits.output"), "{e}");
    let e = refused(Sandbox::builder().limits(palisade::policy::Limits {
        cpu_milli: Some(5),
        ..Default::default()
    }));
    assert!(e.contains("cpus") && e.contains('5'), "{e}");
    let e = refused(Sandbox::builder().profile("no-such-profile"));
    assert!(e.contains("no-such-profile"), "{e}");
    // The first bad setting wins, whatever comes after it.
    let e = refused(Sandbox::builder().env("1X", "y").ro("relative"));
    assert!(e.contains("1X") && !e.contains("relative"), "{e}");
    // A CPU time under 1 ms is rounded up to 1 ms, never to 0 (which would be refused).
    let b = Sandbox::builder().cpu_time(Duration::from_nanos(1));
    assert_eq!(b.current_limits().cpu_time_ms, Some(1));
    let sandbox = Sandbox::builder()
        .command(["true"])
        .timeout(Duration::from_millis(1500))
        .cpu_time(Duration::from_millis(700))
        .output_limit(4096)
        .env("A", "1")
        .env("A", "2")
        .build()
        .unwrap();
    let p = sandbox.policy();
    assert_eq!(
        (
            p.limits.timeout_ms,
            p.limits.cpu_time_ms,
            p.limits.output_bytes
        ),
        (1500, Some(700), 4096)
    );
    let env: Vec<(&str, &str)> = p
        .env
        .iter()
        .map(|v| (v.name.as_str(), v.value.as_str()))
        .collect();
    assert_eq!(env, [("A", "2")], "a later value replaces the earlier one");
}

/// clone3 from a process with other threads: the child must not touch any lock those threads
/// may hold (allocator, glibc's set*id machinery). A deadlock shows up here as a timeout.
#[test]
fn concurrent_sandboxes_from_many_threads() {
    let _runs = serial();
    const THREADS: usize = 4;
    const RUNS: usize = 25;
    let (tx, rx) = mpsc::channel();
    for t in 0..THREADS {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for i in 0..RUNS {
                // Allocate on this thread while others clone, to exercise the allocator's locks.
                let junk: Vec<String> = (0..64).map(|k| format!("{t}-{i}-{k}")).collect();
                let out = Sandbox::builder()
                    .command(["/bin/sh", "-c", "echo $T-$I"])
                    .env("T", &t.to_string())
                    .env("I", &i.to_string())
                    .output()
                    .unwrap();
                drop(junk);
                let ok = out.report.status == Status::Ok
                    && out.stdout == format!("{t}-{i}\n").into_bytes();
                tx.send((
                    t,
                    i,
                    ok,
                    format!("{:?} {:?}", out.report.status, out.report.error),
                ))
                .unwrap();
            }
        });
    }
    drop(tx);
    for _ in 0..THREADS * RUNS {
        let (t, i, ok, detail) = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a sandbox hung: the child side took a lock held by another thread");
        assert!(ok, "thread {t} run {i}: {detail}");
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Many runs from one long-lived process, as a server would do them: no descriptor, memory,
/// cgroup or temporary directory may accumulate. 200 runs here; `bench/soak.sh` runs 1,000
/// (`PALISADE_SOAK_RUNS`).
#[test]
fn many_runs_leave_nothing_behind() {
    let _runs = serial();
    let runs: usize = std::env::var("PALISADE_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let sandbox = Sandbox::builder()
        .command(["/bin/true"])
        .keep_scratch(false)
        .build()
        .unwrap();
    // Warm up allocator pools and lazily opened files before measuring.
    for _ in 0..20 {
        assert_eq!(sandbox.output().report.status, Status::Ok);
    }
    let (fds0, rss0) = (open_fds(), rss_kib());
    let tmp0 = palisade_temp_dirs();
    for i in 0..runs {
        let out = sandbox.output();
        assert_eq!(
            out.report.status,
            Status::Ok,
            "run {i}: {:?}",
            out.report.error
        );
    }
    let (fds1, rss1) = (open_fds(), rss_kib());
    eprintln!("soak: {runs} runs; descriptors {fds0} -> {fds1}; RSS {rss0} KiB -> {rss1} KiB");
    // No other sandbox of this binary is in flight (`serial`); the margin is for descriptors the
    // runtime opens lazily. A leak of one per run would show as `runs` more.
    assert!(
        fds1 <= fds0 + 16,
        "descriptors grew from {fds0} to {fds1} over {runs} runs"
    );
    assert!(
        rss1 <= rss0 + 8 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB over {runs} runs"
    );
    assert_eq!(
        palisade_temp_dirs(),
        tmp0,
        "temporary directories were left behind"
    );
    let me = std::process::id().to_string();
    for base in [
        "/sys/fs/cgroup/memory/palisade",
        "/sys/fs/cgroup/pids/palisade",
        "/sys/fs/cgroup/palisade",
    ] {
        let uid = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap();
        let dir = if uid == 0 {
            base.into()
        } else {
            std::path::Path::new(base).join(format!("user-{uid}"))
        };
        if let Ok(rd) = std::fs::read_dir(&dir) {
            // The soak's runs are all over and their cgroups removed, and no other run of this
            // process is in flight (`serial`); the small margin is for a removal that gave up
            // while the kernel still counted a dying process in the cgroup (it retries ~1 s).
            let mine = rd
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("run-{me}-"))
                })
                .count();
            assert!(
                mine <= 8,
                "{mine} run cgroups of this process remain under {}",
                dir.display()
            );
        }
    }
}

fn palisade_temp_dirs() -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("palisade-{}-", std::process::id()))
        })
        .collect();
    v.sort();
    v
}

/// Without a cgroup (here: a cgroup root with no hierarchy), runs are refused unless the layer is
/// waived; waived, the CPU-time limit still holds per process through RLIMIT_CPU, and the report
/// says the tree-wide watch was not enforced.
#[test]
fn without_a_cgroup_runs_are_refused_unless_waived_and_rlimit_cpu_still_holds() {
    let _runs = serial();
    let marker = format!("palisade-rlimit-cpu-{}", std::process::id());
    let burn = || {
        Sandbox::builder()
            .command([
                probe(),
                "burn".into(),
                "30".into(),
                "1".into(),
                marker.clone(),
            ])
            .ro(probe())
            .cgroup_root("/nonexistent/palisade-test-cgroup-root")
            .cpu_time(Duration::from_millis(500))
    };
    let out = burn().output().unwrap();
    assert_eq!(out.report.status, Status::SandboxError, "{:?}", out.report);
    assert!(
        out.report
            .error
            .as_deref()
            .is_some_and(|e| e.contains("add `cgroup` to layers.allow_degraded")),
        "{:?}",
        out.report.error
    );
    // What the sandbox's own processes add to wait4's figure besides the probe (init and its
    // setup: a few ms on a native CPU, a hundred or more under emulation), measured on this host
    // now with a run that does nothing, threefold, and never under 30 ms.
    let init_ms = (0..3)
        .map(|_| {
            let o = Sandbox::builder()
                .command(["/bin/true"])
                .cgroup_root("/nonexistent/palisade-test-cgroup-root")
                .allow_degraded(palisade::policy::Degradable::Cgroup)
                .output()
                .unwrap();
            assert_eq!(o.report.status, Status::Ok, "{:?}", o.report);
            o.report.cpu_user_ms + o.report.cpu_system_ms
        })
        .fold(0.0, f64::max);
    let init_ms = (3.0 * init_ms).max(30.0);
    let sampler = CpuSampler::start(&marker);
    let out = burn()
        .allow_degraded(palisade::policy::Degradable::Cgroup)
        .output()
        .unwrap();
    let end = Instant::now();
    let seen = sampler.finish();
    let r = &out.report;
    // RLIMIT_CPU is whole seconds plus one: the probe is killed with SIGKILL at 2 s of CPU (the
    // kernel's exact runtime; wait4's tick-sampled times come out up to ~10 % lower, 1892 ms
    // seen), and a SIGKILL at 80 % of it or more is taken for the limit. The kernel checks the
    // limit at its tick, which comes late on an emulated or overloaded host (3296 ms seen in an
    // emulated guest of the VM matrix while the host compiled): the figure is held to what the
    // sampler saw the probe use, not to a window. The kernel charges RLIMIT_CPU by ticks, which
    // run ahead of the exact runtime on a busy CPU: once, under a load average of ~9, the kill
    // came at 1557 ms, under the rule's 80 %, and the report said `signal` (docs/benchmarks.md,
    // "The test suite on a busy machine": a product fix, still open).
    assert_eq!(r.status, Status::CpuTimeout, "{r:?}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("probe burn:"),
        "the probe ran its 30 s to the end"
    );
    let cpu = r.cpu_user_ms + r.cpu_system_ms;
    assert!(cpu >= 1600.0, "{cpu} ms of CPU");
    let seen = seen.expect("the burning probe was not seen running");
    // wait4's figure, against the kernel's account of the probe read while it ran: at least the
    // last reading, at most that plus what one spinning thread can have used since, plus init's
    // own (measured above).
    let most = seen.most_by(end) + init_ms;
    eprintln!(
        "cpu: the report gives {cpu:.1} ms; the probe used {:.1} to {most:.1} ms",
        seen.cpu_ms
    );
    assert!(
        (seen.cpu_ms..=most).contains(&cpu),
        "the report gives {cpu} ms of CPU; the probe used {} to {most} ms",
        seen.cpu_ms
    );
    let layer = |n: &str| r.layers.iter().find(|l| l.name == n).unwrap().clone();
    assert!(!layer("cpu-time-limit").enforced, "{:?}", r.layers);
    assert!(!layer("cgroup-limits").enforced, "{:?}", r.layers);
}

/// The probe binary, as the tests see it on the host: `PALISADE_PROBE`, or the one `cargo build`
/// left in the target directory (`cargo build -p palisade-probe`).
fn probe() -> String {
    if let Ok(p) = std::env::var("PALISADE_PROBE") {
        return p;
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("the test runs from target/<profile>/deps")
        .join("palisade-probe");
    assert!(
        p.exists(),
        "the probe binary {} is missing: build it with `cargo build -p palisade-probe`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

/// The CPU time of the `palisade-probe … MARKER` process, read from the host while it runs: the
/// kernel's own account (`/proc/PID/stat`, user plus system in clock ticks, rounded down), apart
/// from the report's. The last reading before the process died is a lower bound of what it got,
/// and it can have got at most the wall time since then per spinning thread.
struct CpuSampler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Option<Seen>>>,
}

impl Drop for CpuSampler {
    /// Stops the thread if a test panicked before `finish`.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The sampler's last reading.
#[derive(Debug, Clone, Copy)]
struct Seen {
    cpu_ms: f64,
    /// When the reading started.
    at: Instant,
}

impl Seen {
    /// The most CPU the process (one spinning thread) can have had by `end`: the last reading,
    /// plus the tick it was rounded down by and one the running task may not have been charged
    /// yet, plus the wall time since the reading.
    fn most_by(&self, end: Instant) -> f64 {
        self.cpu_ms + 2.0 * tick_ms() + (end - self.at).as_secs_f64() * 1000.0
    }
}

/// One clock tick (`/proc/PID/stat`'s unit), in ms.
fn tick_ms() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    1000.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

impl CpuSampler {
    fn start(marker: &str) -> CpuSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let marker = marker.to_owned();
        let thread = std::thread::spawn(move || {
            // The pid and its start time (ticks after boot), which tells a reused pid apart.
            let mut found: Option<(u32, u64)> = None;
            let mut seen = None;
            while !done.load(Ordering::Relaxed) {
                if found.is_none() {
                    found = marked_probe(&marker).and_then(|p| Some((p, stat(p)?.0)));
                }
                if let Some((pid, start)) = found {
                    let at = Instant::now();
                    if let Some((s, cpu_ms)) = stat(pid) {
                        if s == start {
                            seen = Some(Seen { cpu_ms, at });
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            seen
        });
        CpuSampler {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Option<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("finished once");
        thread.join().expect("the CPU sampler panicked")
    }
}

/// The host pid of the probe whose last argument is `marker`: the payload itself, not a clone of
/// this test process on its way to becoming it.
fn marked_probe(marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
                args.len() == 5 && args[1] == b"burn" && args[4] == marker.as_bytes()
            })
        })
}

/// A process's start time (ticks after boot) and CPU time so far (user plus system, in ms), from
/// `/proc/PID/stat`; `None` once it is gone.
fn stat(pid: u32) -> Option<(u64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold anything; the fields after it are numbers. Counted from
    // the state (field 3): utime is field 14, stime 15, starttime 22.
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some((n(22)?, (n(14)? + n(15)?) as f64 * tick_ms()))
}
