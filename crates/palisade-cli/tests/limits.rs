//! Limits the supervisor enforces: wall-clock timeout and output cap. Each test checks the number
//! the report gives against what was asked.

mod common;
use common::*;

#[test]
fn timeout_kills_everything_including_processes_that_ignore_sigterm() {
    let marker = unique("palisade-timeout-marker");
    let script = format!("trap '' TERM; /probe linger {marker} & /probe linger {marker}-2");
    let r = run(
        &["--timeout", "1s", "--json", "-"],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(r.code, 124, "{}", r.stderr);
    let j = r.report();
    assert_eq!(j["status"], "timeout");
    assert_eq!(j["limits"]["timeout_ms"], 1000);
    let wall = j["wall_time_ms"].as_f64().unwrap();
    assert!(
        (1000.0..30000.0).contains(&wall),
        "wall time {wall} ms for a 1 s timeout"
    );
    assert!(
        j["cpu_user_ms"].as_f64().unwrap() + j["cpu_system_ms"].as_f64().unwrap() < 500.0,
        "{j}"
    );
    assert_eq!(
        host_pids_with(&marker),
        Vec::<u32>::new(),
        "a process outlived the timeout"
    );
}

/// CPU time (user plus system) the report gives, in ms.
fn cpu_ms(j: &serde_json::Value) -> f64 {
    j["cpu_user_ms"].as_f64().unwrap() + j["cpu_system_ms"].as_f64().unwrap()
}

#[test]
fn a_cpu_loop_under_a_cpu_limit_is_a_cpu_timeout() {
    let r = run(
        &["--cpu-time", "1s", "--json", "-"],
        &["/probe", "burn", "30", "1"],
    );
    assert_eq!(r.code, 124, "{}", r.stderr);
    let j = r.report();
    assert_eq!(j["status"], "cpu-timeout", "{j}");
    assert_eq!(j["limits"]["cpu_time_ms"], 1000);
    let cpu = cpu_ms(&j);
    assert!(
        (1000.0..1500.0).contains(&cpu),
        "{cpu} ms of CPU under a 1 s limit"
    );
    assert!(j["wall_time_ms"].as_f64().unwrap() < 20_000.0, "{j}");
    let layer = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "cpu-time-limit")
        .cloned()
        .expect("the cpu-time layer is reported");
    assert_eq!(layer["enforced"], true, "{layer}");
    // Control: the same probe for a short while under the default limit ends on its own.
    let r = run(&["--json", "-"], &["/probe", "burn", "0.3", "1"]);
    assert_eq!(r.report()["status"], "ok", "{}", r.stdout);
}

#[test]
fn the_cpu_limit_covers_all_processes_together() {
    // Two burning processes, each far below the limit alone (per-process RLIMIT_CPU would let each
    // spend 2 s): together they reach 1 s and the whole sandbox is stopped, both of them counted.
    let marker = unique("palisade-cpu-marker");
    let script = format!("/probe burn 30 1 {marker} & /probe burn 30 1 {marker} & wait");
    let r = run(
        &["--cpu-time", "1s", "--json", "-"],
        &["/bin/sh", "-c", &script],
    );
    let j = r.report();
    assert_eq!(j["status"], "cpu-timeout", "{j}");
    let cpu = cpu_ms(&j);
    assert!((1000.0..1500.0).contains(&cpu), "{cpu} ms of CPU in all");
    assert_eq!(
        host_pids_with(&marker),
        Vec::<u32>::new(),
        "a burner outlived the kill"
    );
}

#[test]
fn cpu_of_processes_killed_at_the_timeout_is_accounted() {
    // A background burner the kernel reaps when the sandbox is torn down at the deadline: its CPU
    // is not in init's rusage, but the cgroup accounted it.
    let r = run(
        &["--timeout", "1s", "--json", "-"],
        &["/bin/sh", "-c", "/probe burn 30 1 & sleep 30"],
    );
    let j = r.report();
    assert_eq!(j["status"], "timeout", "{j}");
    let cpu = cpu_ms(&j);
    assert!(
        (700.0..1300.0).contains(&cpu),
        "{cpu} ms of CPU in a 1 s run with a burner"
    );
}

#[test]
fn the_deadline_holds_while_output_never_stops() {
    // The supervisor is woken by output all the time; the deadline must still be checked.
    let r = run(
        &["--timeout", "1s", "--json", "-"],
        &["/bin/sh", "-c", "while :; do echo x; done"],
    );
    let j = r.report();
    assert_eq!(j["status"], "timeout", "{}", r.stderr);
    let wall = j["wall_time_ms"].as_f64().unwrap();
    assert!((1000.0..10_000.0).contains(&wall), "wall {wall} ms");
}

#[test]
fn output_cap_truncates_kills_and_says_so() {
    let r = run(
        &["--output-limit", "1MiB", "--json", "-"],
        &["/bin/sh", "-c", "yes | head -c 200000000"],
    );
    assert_eq!(r.code, 124, "{}", r.stderr);
    let j = r.report();
    assert_eq!(j["status"], "output-limit");
    assert_eq!(j["output_truncated"], true);
    assert_eq!(j["stdout_bytes"], 1 << 20);
    assert_eq!(j["limits"]["output_bytes"], 1 << 20);
    let relayed = r
        .stdout
        .rfind("{\n  \"status\"")
        .expect("the report follows the output");
    assert_eq!(relayed, 1 << 20, "bytes that reached palisade's stdout");
}

#[test]
fn output_under_the_cap_is_untouched() {
    let r = run(
        &["--output-limit", "1MiB", "--json", "-"],
        &["/bin/sh", "-c", "head -c 1000 /dev/zero | tr '\\0' x"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j = r.report();
    assert_eq!(j["status"], "ok");
    assert_eq!(j["output_truncated"], false);
    assert_eq!(j["stdout_bytes"], 1000);
    assert_eq!(
        j["limits"]["timeout_ms"], 600_000,
        "the default timeout is on"
    );
    assert_eq!(j["limits"]["output_bytes"], 1 << 20);
}

#[test]
fn a_fork_bomb_hits_the_process_ceiling() {
    // Control: with room, the probe does fork 60 children.
    let r = run(&["--pids", "200"], &["/probe", "forks", "60"]);
    assert_eq!(
        r.probe("forks 60"),
        "ok spawned=60 error=none",
        "{}",
        r.stderr
    );
    // Under a ceiling of 32 (init and the probe count too), forks fail with EAGAIN before 32.
    let r = run(
        &["--pids", "32", "--json", "-"],
        &["/probe", "forks", "500"],
    );
    let got = r.probe("forks 500");
    let spawned: u64 = got
        .split("spawned=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((20..32).contains(&spawned), "{got}");
    assert!(got.ends_with("error=EAGAIN"), "{got}");
    let j = r.report();
    assert_eq!(j["limits"]["pids"], 32);
    // The cgroup's own count: the sandbox never had more than the ceiling at once.
    let peak = j["pids_peak"]
        .as_u64()
        .expect("the peak process count is reported");
    assert!((20..=32).contains(&peak), "pids peak {peak}");
}

#[test]
fn file_size_and_tmp_size_are_bounded() {
    let r = run(
        &["--file-size", "1MiB", "--json", "-"],
        &["/probe", "fill", "/tmp/big", "4194304"],
    );
    let j = r.report();
    assert_eq!(j["status"], "signal", "{}", r.stdout);
    assert_eq!(j["signal_name"], "SIGXFSZ");
    assert_eq!(j["limits"]["file_size_bytes"], 1 << 20);
    // /tmp is a 256 MiB tmpfs: a bigger write fails inside, and the run goes on.
    let r = run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "/probe fill /tmp/big 300000000; /probe write /tmp/after",
        ],
    );
    assert_eq!(r.probe("fill /tmp/big"), "denied ENOSPC", "{}", r.stderr);
    assert_eq!(r.code, 0);
}

#[test]
fn memory_past_the_ceiling_is_an_oom_with_the_numbers() {
    let r = run(
        &["--memory", "64MiB", "--json", "-"],
        &["/probe", "alloc", "512"],
    );
    assert_eq!(r.code, 124, "{}", r.stderr);
    let j = r.report();
    assert_eq!(j["status"], "oom", "{j}");
    assert!(j["oom_kills"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(j["limits"]["memory_bytes"], 64 << 20);
    let peak = j["memory_peak_bytes"]
        .as_u64()
        .expect("peak memory is reported");
    assert!(peak <= 64 << 20 && peak > 32 << 20, "peak {peak}");
    let layer = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "cgroup-limits")
        .unwrap()
        .clone();
    assert_eq!(layer["enforced"], true, "{layer}");
    // Under the ceiling the same allocation works, and the run is ok.
    let r = run(
        &["--memory", "256MiB", "--json", "-"],
        &["/probe", "alloc", "64"],
    );
    assert_eq!(r.probe("alloc 64"), "ok 64 MiB");
    assert_eq!(r.report()["status"], "ok");
}

#[test]
fn tmpfs_contents_count_against_the_memory_ceiling() {
    // /tmp is a 256 MiB tmpfs; under a 64 MiB ceiling, filling it is stopped by the cgroup first.
    let r = run(
        &["--memory", "64MiB", "--json", "-"],
        &["/probe", "fill", "/tmp/big", "200000000"],
    );
    let j = r.report();
    assert!(
        j["status"] == "oom" || r.stdout.contains("denied"),
        "{}",
        r.stdout
    );
    assert!(j["memory_peak_bytes"].as_u64().unwrap() <= 64 << 20);
}

#[test]
fn no_cgroup_leaks_after_runs() {
    for _ in 0..20 {
        let r = run(&[], &["true"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    let r = run(&["--timeout", "200ms"], &["sleep", "5"]);
    assert_eq!(r.code, 124);
    // Tests run in parallel, so live sandboxes of other tests may have cgroups now; a leak is a
    // run cgroup whose supervisor (its pid is in the name) is gone. Stale ones from a killed
    // supervisor are removed by the next start, so none may remain after the runs above.
    let leaked: Vec<_> = cgroup_runs()
        .into_iter()
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let pid = name.split('-').nth(1).unwrap();
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        })
        .collect();
    assert!(leaked.is_empty(), "run cgroups left behind: {leaked:?}");
}

/// The run cgroups currently present under palisade's parents (v1 or v2, root or delegated).
fn cgroup_runs() -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    let uid = euid();
    for base in [
        "/sys/fs/cgroup/memory/palisade",
        "/sys/fs/cgroup/pids/palisade",
        "/sys/fs/cgroup/cpuacct/palisade",
        "/sys/fs/cgroup/cpu/palisade",
        "/sys/fs/cgroup/palisade",
        "/sys/fs/cgroup/unified/palisade",
    ] {
        let dir = if uid == 0 {
            base.into()
        } else {
            std::path::Path::new(base).join(format!("user-{uid}"))
        };
        if let Ok(rd) = std::fs::read_dir(&dir) {
            v.extend(
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("run-")),
            );
        }
    }
    v
}

#[test]
fn tmp_and_scratch_sizes_are_what_was_asked() {
    let r = run(
        &["--tmp-size", "8MiB", "--scratch-size", "4MiB", "--json", "-"],
        &["/bin/sh", "-c", "/probe fill /tmp/x 20000000; /probe fill /workspace/y 10000000; /probe fill /tmp/small 1000000"],
    );
    assert_eq!(r.probe("fill /tmp/x"), "denied ENOSPC", "{}", r.stderr);
    assert_eq!(r.probe("fill /workspace/y"), "denied ENOSPC");
    assert_eq!(r.code, 0, "the run goes on after ENOSPC: {}", r.stderr);
    let j = r.report();
    assert_eq!(j["limits"]["tmp_bytes"], 8 << 20);
    assert_eq!(j["limits"]["scratch_bytes"], 4 << 20);
}

#[test]
fn sysv_shared_memory_counts_against_the_memory_ceiling() {
    let r = run(
        &["--memory", "64MiB", "--json", "-"],
        &["/probe", "sysv-shm", "200"],
    );
    assert_eq!(r.report()["status"], "oom", "{}", r.stdout);
    // Under the ceiling the same call works (the probe can do it), and the segment dies with the
    // run's IPC namespace.
    let r = run(&["--memory", "256MiB"], &["/probe", "sysv-shm", "32"]);
    assert_eq!(r.probe("sysv-shm 32"), "ok 32 MiB");
}

#[test]
fn cpu_quota_holds_the_sandbox_to_its_share() {
    // Two spinning threads for 2 s of wall time under half a CPU: about 1 s of CPU in all. The
    // control, with two CPUs, gets about twice as much (on a host with two or more CPUs).
    let burn = |cpus: &str| -> (u64, serde_json::Value) {
        let r = run(
            &["--cpus", cpus, "--json", "-"],
            &["/probe", "burn", "2", "2"],
        );
        let got = r.probe("burn");
        let ms = got.trim_start_matches("ok cpu_ms=").parse().unwrap();
        (ms, r.report())
    };
    let (half, j) = burn("0.5");
    assert_eq!(j["cpus"], 0.5);
    assert!(
        (500..1400).contains(&half),
        "{half} ms of CPU in 2 s under half a CPU"
    );
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let (two, _) = burn("2");
        assert!(
            two > half * 3 / 2,
            "with 2 CPUs the probe got {two} ms, with 0.5 {half} ms"
        );
    } else {
        eprintln!("note: one CPU on this host; the 2-CPU control of the quota test is not run");
    }
}

#[test]
fn bad_limits_are_refused() {
    for (opt, val) in [
        ("--timeout", "0s"),
        ("--timeout", "10"),
        ("--timeout", "-1s"),
        ("--output-limit", "0"),
        ("--output-limit", "1.5M"),
        ("--output-limit", "99999T"),
        ("--cpu-time", "0ms"),
        ("--cpu-time", "1"),
        ("--cpu-time", "8d"),
    ] {
        let r = run(&[opt, val], &["true"]);
        assert_eq!(r.code, 125, "{opt} {val}: {}", r.stderr);
        assert!(
            r.stderr.contains(opt) && r.stderr.contains(val),
            "{opt} {val}: {}",
            r.stderr
        );
    }
}

/// Audit F9's attack, in python3 inside: UDP sockets with `SO_RCVBUF` raised (the kernel caps it at
/// the host's `net.core.rmem_max`, so as many sockets as it takes to be able to hold `argv[1]`
/// bytes, up to 900 under the default 1024 open files), datagrams looped to each over the sandbox's
/// own loopback until it is full, then the bytes its sockets hold, from `/proc/net/udp` of its own
/// network namespace (`rx_queue`: the buffers' true size, what the kernel charges).
const UDP_PIN: &str = r#"
import socket, sys
target, rs, room = int(sys.argv[1]), [], 0
while room < target and len(rs) < 900:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    r.bind(("127.0.0.1", 0))
    rs.append(r)
    room += r.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for r in rs:
    for _ in range(r.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 60000 + 2):
        w.sendto(b"x" * 60000, r.getsockname())
held = sum(int(l.split()[4].split(":")[1], 16) for l in open("/proc/net/udp").readlines()[1:])
print("udp-pin sockets", len(rs), "held", held, flush=True)
"#;

/// Runs [`UDP_PIN`] under `--memory MEM`, able to hold `room` bytes; the report and the bytes held
/// (`None` if the run ended before it could say, as an OOM kill does).
fn udp_pin(memory: &str, room: u64) -> (serde_json::Value, Option<u64>, Run) {
    let r = run(
        &["--memory", memory, "--json", "-"],
        &["python3", "-c", UDP_PIN, &room.to_string()],
    );
    let held = r.stdout.lines().find_map(|l| {
        let rest = l.strip_prefix("udp-pin sockets ")?;
        rest.split_once(" held ")?.1.trim().parse().ok()
    });
    (r.report(), held, r)
}

#[test]
fn socket_buffers_are_held_to_the_memory_ceiling() {
    // F9: on cgroup v1 the sandbox pinned 1 GB of UDP receive buffers under --memory 64MiB, and
    // the report said 4.9 MB. Now v1 counts them against a ceiling of their own of the same size
    // (memory.kmem.tcp), so they stay under 64 MiB; v2 charges them to the run with everything
    // else, so the report's peak covers them, or the run is an OOM kill. (v2 charges a buffer
    // received in softirq even past memory.max, and the next allocation in the cgroup then
    // reclaims or kills: a bound of 64 MiB is not v2's promise, accounting and the kill are.)
    let (j, held, r) = udp_pin("64MiB", 512 << 20);
    eprintln!(
        "64 MiB ceiling, cgroup {}: status {}, held {held:?}, peak {}",
        j["cgroup"], j["status"], j["memory_peak_bytes"]
    );
    match j["status"].as_str() {
        Some("oom") => assert!(j["oom_kills"].as_u64().unwrap() >= 1, "{j}"),
        Some("ok") => {
            let held = held.unwrap_or_else(|| panic!("no udp-pin line: {}", r.stdout));
            if j["cgroup"] == "v2" {
                let peak = j["memory_peak_bytes"].as_u64().unwrap();
                assert!(peak >= held, "peak {peak} below the {held} bytes held");
            } else {
                assert_eq!(j["cgroup"], "v1", "{j}");
                assert!(
                    held <= 64 << 20,
                    "{held} bytes of socket buffers under a 64 MiB ceiling"
                );
            }
        }
        _ => panic!("{}\n{}", r.stdout, r.stderr),
    }
    // Control: the same code, able to hold 192 MiB under a 512 MiB ceiling, holds more than the
    // small ceiling allowed, so it was the ceiling that stopped it above, not the code or the
    // host's socket limits.
    let (j, held, r) = udp_pin("512MiB", 192 << 20);
    assert_eq!(j["status"], "ok", "{}\n{}", r.stdout, r.stderr);
    let held = held.unwrap_or_else(|| panic!("no udp-pin line: {}", r.stdout));
    assert!(
        held > 64 << 20 && held <= 512 << 20,
        "{held} bytes held under a 512 MiB ceiling"
    );
}
