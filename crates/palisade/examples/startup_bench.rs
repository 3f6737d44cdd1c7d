//! Start-up through the library, measured (a benchmark, not a test: nothing is asserted).
//!
//! ```sh
//! cargo run --release -p palisade --example startup_bench -- [--memory MB] [--runs N] [--threads T] \
//!     [--engine in-process|exec|template|warm|none] [--init PATH] [--seconds S] [-- COMMAND...]
//! ```
//!
//! With `--seconds`, every thread starts runs one after the other until that much time has
//! passed (bench/peers.py and bench/startup.py measure throughput so).
//!
//! `--engine exec` and `template` need palisade's init program: `--init PATH` (a `palisade`
//! binary), or `PALISADE_INIT`.
//!
//! `--memory MB` first allocates and touches that much memory in this process, the way a
//! long-running server holds its heap: a spawner that copies the caller's page tables
//! (the in-process engine's fork-like `clone3`) pays for it on every start. Prints, as one JSON
//! line: the median and 90th percentile of the time `start` takes (until the payload has
//! exec'd) and of a whole run of `/bin/true`, runs per second over all threads, and CPU per run
//! (this process and its reaped children, a template's zygote included, from `/proc/self/stat`;
//! not the kernel's own threads, which tear a network namespace down after the run).

use palisade::{Engine, Io, Sandbox, Status};
use std::time::{Duration, Instant};

struct Args {
    memory_mb: usize,
    runs: usize,
    /// Run for this long instead of `runs` runs.
    seconds: Option<f64>,
    threads: usize,
    engine: String,
    init: Option<std::path::PathBuf>,
    command: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        memory_mb: 0,
        runs: 200,
        seconds: None,
        threads: 1,
        engine: "in-process".into(),
        init: std::env::var_os("PALISADE_INIT").map(Into::into),
        command: vec!["/bin/true".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut num = |name: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match x.as_str() {
            "--memory" => a.memory_mb = num("--memory"),
            "--runs" => a.runs = num("--runs"),
            "--seconds" => {
                a.seconds = Some(
                    it.next()
                        .and_then(|v| v.parse().ok())
                        .expect("--seconds takes a number"),
                )
            }
            "--threads" => a.threads = num("--threads").max(1),
            "--engine" => a.engine = it.next().expect("--engine takes a name"),
            "--init" => a.init = Some(it.next().expect("--init takes a path").into()),
            "--" => {
                a.command = it.by_ref().collect();
                break;
            }
            other => panic!("unknown option {other}"),
        }
    }
    a
}

/// CPU time of this process and of its children it has reaped, in clock ticks.
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &s[s.rfind(')').expect("a comm field") + 2..];
    // After the comm: state is field 0, utime 11, stime 12, cutime 13, cstime 14.
    after
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse::<u64>().unwrap_or(0))
        .sum()
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

fn main() {
    let a = args();
    // The caller's memory: allocated and touched, page by page, and kept alive to the end.
    let mut heap: Vec<u8> = vec![0; a.memory_mb << 20];
    for i in (0..heap.len()).step_by(4096) {
        heap[i] = (i >> 12) as u8 | 1;
    }
    let mut sandbox = Sandbox::builder()
        .command(a.command.clone())
        .build()
        .expect("a valid policy");
    let init = || Engine::InitProgram(a.init.clone().expect("--init PATH or PALISADE_INIT"));
    sandbox = match a.engine.as_str() {
        "in-process" | "none" => sandbox.engine(Engine::InProcess),
        "exec" | "template" | "warm" => sandbox.engine(init()),
        other => panic!("unknown engine {other}"),
    };
    // `none`: no sandbox at all, the command started and waited for by this process
    // (`std::process::Command`, posix_spawn), its output thrown away: the bare loop the
    // sandboxed rows are compared with, measured the same way.
    let bare = a.engine == "none";
    // `warm`: a template with warm Python (docs/engine.md); COMMAND is then `python3 -c CODE`.
    let template = match a.engine.as_str() {
        "template" => Some(sandbox.prepare().expect("a template")),
        "warm" => {
            let warm = palisade::WarmPython::find("/usr/bin/python3".as_ref(), &[])
                .expect("python3 with its shared library");
            Some(sandbox.prepare_warm_python(warm).expect("a warm template"))
        }
        _ => None,
    };
    let start = |io: Io| match &template {
        Some(t) => t.start(a.command.clone(), &[], io),
        None => sandbox.start(io),
    };
    // One run: how long it took to start, and to end.
    let one = || -> (Duration, Duration) {
        let t = Instant::now();
        if bare {
            let mut child = std::process::Command::new(&a.command[0])
                .args(&a.command[1..])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("the command starts");
            let started = t.elapsed();
            assert!(child.wait().expect("the command ends").success());
            return (started, t.elapsed());
        }
        let run = start(Io::default());
        let started = t.elapsed();
        let out = run.wait_output();
        assert_eq!(out.report.status, Status::Ok, "{:?}", out.report.error);
        (started, t.elapsed())
    };
    // Warm-up: lazily opened files, the allocator, the kernel's caches.
    for _ in 0..10 {
        one();
    }
    let per_thread = a.runs.div_ceil(a.threads);
    let cpu0 = cpu_ticks();
    let t0 = Instant::now();
    let deadline = a.seconds.map(|s| t0 + Duration::from_secs_f64(s));
    let more = |done: usize| match deadline {
        Some(d) => Instant::now() < d,
        None => done < per_thread,
    };
    let results: Vec<(Vec<Duration>, Vec<Duration>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.threads)
            .map(|_| {
                s.spawn(|| {
                    let (mut starts, mut totals) = (Vec::new(), Vec::new());
                    while more(starts.len()) {
                        let (started, ended) = one();
                        starts.push(started);
                        totals.push(ended);
                    }
                    (starts, totals)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a run thread"))
            .collect()
    });
    let wall = t0.elapsed();
    // A template's zygote is reaped when the template is dropped: its CPU counts from then on.
    drop(template);
    let ticks = cpu_ticks() - cpu0;
    let n: usize = results.iter().map(|r| r.0.len()).sum();
    let mut starts: Vec<Duration> = results.iter().flat_map(|r| r.0.clone()).collect();
    let mut totals: Vec<Duration> = results.iter().flat_map(|r| r.1.clone()).collect();
    let hz = 100.0; // USER_HZ
    println!(
        "{{\"engine\": \"{}\", \"memory_mb\": {}, \"threads\": {}, \"runs\": {}, \"start_median_ms\": {:.3}, \"start_p90_ms\": {:.3}, \"run_median_ms\": {:.3}, \"run_p90_ms\": {:.3}, \"runs_per_s\": {:.1}, \"wall_s\": {:.3}, \"cpu_ms_per_run\": {:.3}}}",
        a.engine,
        a.memory_mb,
        a.threads,
        n,
        percentile(&mut starts, 0.5),
        percentile(&mut starts, 0.9),
        percentile(&mut totals, 0.5),
        percentile(&mut totals, 0.9),
        n as f64 / wall.as_secs_f64(),
        wall.as_secs_f64(),
        ticks as f64 * 1000.0 / hz / n as f64,
    );
    std::hint::black_box(&heap);
}
