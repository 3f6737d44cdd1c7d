//! The run handle as a long-running server uses it: started from an async runtime, cancelled
//! midway, watched through a descriptor, fed and read while it runs, and dropped; nothing of a run
//! may outlive it. The tests in this binary take turns (one lock), so that the leak checks see
//! this binary's own runs only.

use palisade::{Chunk, Io, Sandbox, Status, Stdin, Stream};
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a process holds that a leaked run would leave behind.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    fds: usize,
    /// The library's threads (all named `palisade-*`): the test harness starts and ends threads
    /// of its own for the next tests at any moment, which a count of all would see.
    threads: Vec<String>,
    children: Vec<u32>,
    cgroups: Vec<String>,
    mounts: usize,
    temp_dirs: usize,
}

/// The names of this process's threads, sorted.
fn thread_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .map(|r| {
            r.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn held() -> Held {
    let me = std::process::id();
    let count = |d: &str| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    let mut children = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // pid (comm) state ppid ...: the comm may hold spaces, so split after the last ')'.
            let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            let ppid: u32 = after
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            if ppid == me {
                children.push(pid);
            }
        }
    }
    let mut cgroups = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("run-") && name.contains(&format!("-{me}-")) {
                    cgroups.push(e.path().display().to_string());
                }
                if d.components().count() < 8 {
                    stack.push(e.path());
                }
            }
        }
    }
    let temp_dirs = std::fs::read_dir(std::env::temp_dir())
        .map(|r| {
            r.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("palisade-{me}-"))
                })
                .count()
        })
        .unwrap_or(0);
    Held {
        fds: count("/proc/self/fd"),
        // A thread waiting in the library's pool for the next run's work (named so before its
        // run is told it ended) is not held by any run.
        threads: thread_names()
            .into_iter()
            .filter(|n| n.starts_with("palisade-") && n != "palisade-idle")
            .collect(),
        children,
        cgroups,
        // Only mounts that are palisade's (a `palisade` tmpfs, a path under a palisade temp or
        // state directory): other work on the machine (another suite, the test internet's
        // namespace) mounts and unmounts in the host's namespace while this runs.
        mounts: std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains("palisade") && !l.contains("/run/netns/"))
            .count(),
        temp_dirs,
    }
}

/// Waits until what the process holds is back to `before` (threads and descriptors of finished
/// runs go away as their threads end), or fails with the difference.
fn assert_back_to(before: &Held) {
    let t0 = Instant::now();
    loop {
        let now = held();
        if &now == before {
            return;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
                .map(|r| {
                    r.flatten()
                        .map(|e| {
                            let to = std::fs::read_link(e.path()).unwrap_or_default();
                            format!("{}->{}", e.file_name().to_string_lossy(), to.display())
                        })
                        .collect()
                })
                .unwrap_or_default();
            panic!(
                "left behind: before {before:?}, after {now:?} (all threads now: {:?}; descriptors \
                 now: {fds:?})",
                thread_names()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 200 runs started at once from a tokio runtime: half are cancelled midway, half complete;
/// completion is awaited through each run's descriptor. Afterwards the process holds exactly
/// what it held before: descriptors, threads, child processes, cgroups, mounts, temp dirs.
#[test]
fn two_hundred_runs_from_tokio_half_cancelled_leave_nothing_behind() {
    let _g = serial();
    let long = Sandbox::builder()
        .command(["/bin/sh", "-c", "echo started; exec sleep 60"])
        .build()
        .unwrap();
    let short = Sandbox::builder()
        .command(["/bin/sh", "-c", "echo done"])
        .build()
        .unwrap();
    // Warm up what is opened once per process, and once per sandbox value (each keeps the cgroup
    // hierarchy it found, and the engine it resolved, for its later runs).
    assert_eq!(short.output().report.status, Status::Ok);
    let mut warm = long.start(Io::default());
    warm.kill();
    assert_eq!(warm.wait().status, Status::Cancelled);
    // 200 runs at once hold a few descriptors each: raise the soft limit to the hard one, as a
    // server running that many would.
    // SAFETY: getrlimit/setrlimit on this process with a valid rlimit struct.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
    // And tokio's own process-wide state: built with its `signal` feature (as in a workspace
    // build, where the CLI enables it), a first runtime opens a self-pipe kept for the process.
    drop(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    );
    let before = held();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..200 {
            let (long, short) = (long.clone(), short.clone());
            tasks.push(tokio::spawn(async move {
                let cancel = i % 2 == 0;
                let sb = if cancel { long } else { short };
                let mut run = tokio::task::spawn_blocking(move || sb.start(Io::default()))
                    .await
                    .unwrap();
                if cancel {
                    // Midway: once the payload is running (it printed), kill it from here.
                    let killer = run.killer().expect("a started run has a killer");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    killer.kill();
                }
                // The AsyncFd owns its duplicate of the descriptor, so it stays open while
                // registered (what the newer `register` asks its caller to promise).
                #[allow(deprecated)]
                let fd = tokio::io::unix::AsyncFd::new(
                    run.done_fd()
                        .expect("a started run has a done descriptor")
                        .try_clone_to_owned()
                        .unwrap(),
                )
                .unwrap();
                let _ = fd.readable().await.unwrap();
                let report = run
                    .try_wait()
                    .expect("done_fd readable: the report is ready")
                    .clone();
                let (out, _) = match run.recv_output(Some(Duration::ZERO)) {
                    Chunk::Data(Stream::Stdout, d) => (d, ()),
                    _ => (Vec::new(), ()),
                };
                (cancel, report, out)
            }));
        }
        let mut v = Vec::new();
        for t in tasks {
            v.push(t.await.unwrap());
        }
        v
    });
    drop(rt);
    for (cancel, report, out) in &results {
        if *cancel {
            assert_eq!(report.status, Status::Cancelled, "{report:?}");
        } else {
            assert_eq!(report.status, Status::Ok, "{report:?}");
            assert_eq!(out, b"done\n");
        }
    }
    drop(results);
    assert_back_to(&before);
}

/// With the in-process engine a run's init is a clone of its caller, which may have other
/// threads: from the clone to its end init must not allocate (a thread may have held the
/// allocator's lock at that moment, and init would wait for it for ever). Two threads allocate
/// without pause while runs start one after the other; every run ends on its own, none at its
/// deadline (init had allocated at its very end, and a run hung until its timeout now and then).
#[test]
fn in_process_runs_beside_allocating_threads_end_on_their_own() {
    let _g = serial();
    let sb = Sandbox::builder()
        .command(["/bin/true"])
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // One arena for every thread: the allocating threads then take the lock of the arena the
    // starting thread (and so its clone) uses. Threads made earlier keep theirs; the test's own
    // do not exist yet.
    // SAFETY: mallopt with a valid parameter; it only bounds the arenas made from now on.
    assert_eq!(unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) }, 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammers: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let v: Vec<u8> = Vec::with_capacity(16 + (n * 37 + i) % 4000);
                    std::hint::black_box(&v);
                    n += 1;
                }
            })
        })
        .collect();
    let mut bad = Vec::new();
    for _ in 0..400 {
        let out = sb.output();
        if out.report.status != Status::Ok {
            bad.push(format!(
                "{:?} after {} ms",
                out.report.status, out.report.wall_time_ms
            ));
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hammers {
        h.join().unwrap();
    }
    assert!(bad.is_empty(), "{bad:?}");
}

/// Output nobody reads holds the payload back, never the deadline: a payload writing without end
/// into a stalled consumer still ends at its timeout, within the drain grace.
#[test]
fn a_stalled_output_consumer_does_not_delay_the_timeout() {
    let _g = serial();
    let sb = Sandbox::builder()
        .command(["yes", "a line of output that nobody will read"])
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut run = sb.start(Io {
        stream_buffer: Some(64 * 1024),
        ..Io::default()
    });
    // Never read: the run's thread must still end it.
    let report = run.wait();
    assert_eq!(report.status, Status::Timeout, "{report:?}");
    assert!(
        report.wall_time_ms < 1000.0 + 5000.0,
        "{} ms for a 1 s timeout",
        report.wall_time_ms
    );
    // What was read is bounded by the buffer, plus one read past it, plus what the pipe still
    // held once the sandbox was dead (at most the largest pipe the payload could ask for).
    let pipe_max: u64 = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        report.stdout_bytes <= 64 * 1024 + 64 * 1024 + pipe_max,
        "{} bytes read past a stalled 64 KiB buffer",
        report.stdout_bytes
    );
}

/// Input: bytes written as the payload reads them, a pipe the caller writes itself, and bytes
/// for a payload that never reads (it must not hold anything up).
#[test]
fn stdin_as_bytes_or_a_pipe() {
    let _g = serial();
    let cat = Sandbox::builder().command(["cat"]).build().unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let out = cat
        .start(Io {
            stdin: Some(Stdin::Bytes(big.clone())),
            ..Io::default()
        })
        .wait_output();
    assert_eq!(out.report.status, Status::Ok, "{:?}", out.report);
    assert!(
        out.stdout == big,
        "{} bytes back of {}",
        out.stdout.len(),
        big.len()
    );

    let mut run = cat.start(Io {
        stdin: Some(Stdin::Pipe),
        ..Io::default()
    });
    let mut w = run.take_stdin().expect("the pipe's write end");
    assert!(run.take_stdin().is_none(), "the write end is given once");
    // More than a pipe holds, from this thread: the end is blocking, as a caller expects.
    w.write_all(&big).unwrap();
    drop(w);
    let out = run.wait_output();
    assert!(
        out.stdout == big,
        "{} bytes back of {}",
        out.stdout.len(),
        big.len()
    );

    // A socket: both ways.
    let echo = Sandbox::builder()
        .command(["sh", "-c", "read line; echo \"got $line\" >&0"])
        .build()
        .unwrap();
    let mut run = echo.start(Io {
        stdin: Some(Stdin::Socket),
        ..Io::default()
    });
    let mut s = run.take_stdin().expect("the socket's other end");
    s.write_all(b"hello\n").unwrap();
    let mut back = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&s), &mut back).unwrap();
    assert_eq!(back, "got hello\n");
    drop(s);
    assert_eq!(run.wait().status, Status::Ok);

    let ignores = Sandbox::builder().command(["true"]).build().unwrap();
    let out = ignores
        .start(Io {
            stdin: Some(Stdin::Bytes(vec![0; 10_000_000])),
            ..Io::default()
        })
        .wait_output();
    assert_eq!(out.report.status, Status::Ok, "{:?}", out.report);

    // The default is /dev/null, never the caller's own stdin.
    let out = Sandbox::builder()
        .command(["sh", "-c", "readlink /proc/self/fd/0; wc -c"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/dev/null\n0\n");
}

/// Killed from another thread while it runs, and dropped without waiting: both end the sandbox
/// at once and leave nothing.
#[test]
fn killed_from_another_thread_or_dropped() {
    let _g = serial();
    let sb = Sandbox::builder().command(["sleep", "60"]).build().unwrap();
    let _ = sb.clone(); // Sandbox: Clone + Send + Sync
    let before = held();
    let mut run = sb.start(Io::default());
    let killer = run.killer().unwrap();
    std::thread::spawn(move || killer.kill()).join().unwrap();
    let report = run.wait();
    assert_eq!(report.status, Status::Cancelled, "{report:?}");
    assert!(report.wall_time_ms < 30_000.0, "{}", report.wall_time_ms);
    drop(run);
    let run = sb.start(Io::default());
    drop(run);
    assert_back_to(&before);
}

/// Streaming: chunks arrive while the payload still runs.
#[test]
fn output_streams_while_the_payload_runs() {
    let _g = serial();
    let sb = Sandbox::builder()
        .command([
            "sh",
            "-c",
            "echo first; echo err >&2; read x; echo after $x",
        ])
        .build()
        .unwrap();
    let mut run = sb.start(Io {
        stdin: Some(Stdin::Pipe),
        stream_buffer: Some(1 << 16),
        ..Io::default()
    });
    let mut w = run.take_stdin().unwrap();
    let mut got = Vec::new();
    // "first" arrives before any input: the payload is still waiting for it.
    while !got.ends_with(b"first\n") {
        match run.recv_output(Some(Duration::from_secs(30))) {
            Chunk::Data(Stream::Stdout, d) => got.extend(d),
            Chunk::Data(Stream::Stderr, d) => assert_eq!(d, b"err\n"),
            other => panic!("{other:?} before the first line"),
        }
    }
    w.write_all(b"input\n").unwrap();
    drop(w);
    let out = run.wait_output();
    let mut all = got;
    all.extend(out.stdout);
    assert_eq!(String::from_utf8_lossy(&all), "first\nafter input\n");
}
