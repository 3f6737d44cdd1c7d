//! The library API, used the way a long-running server would: many sandboxes from many threads.

use palisade::{Sandbox, Status};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn builder_runs_and_captures_output() {
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

/// clone3 from a process with other threads: the child must not touch any lock those threads
/// may hold (allocator, glibc's set*id machinery). A deadlock shows up here as a timeout.
#[test]
fn concurrent_sandboxes_from_many_threads() {
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
