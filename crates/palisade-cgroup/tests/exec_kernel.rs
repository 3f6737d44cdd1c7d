//! A session's exec cgroup against the real kernel, v1 or v2 (whichever this host has): what the
//! run's ceiling must hold is charged in it, socket buffers included.

mod common;

use common::memory_dir_of;
use palisade_cgroup::CgroupLimits;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// Bytes of socket buffers charged to the memory cgroup `dir`: v1 `memory.kmem.tcp.usage_in_bytes`
/// (which holds UDP too), v2 `sock` of `memory.stat`.
fn socket_charge(dir: &Path) -> u64 {
    if let Ok(v) = std::fs::read_to_string(dir.join("memory.kmem.tcp.usage_in_bytes")) {
        return v.trim().parse().unwrap();
    }
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap();
    stat.lines()
        .find_map(|l| l.strip_prefix("sock "))
        .unwrap_or_else(|| panic!("no sock in {}: {stat}", dir.display()))
        .trim()
        .parse()
        .unwrap()
}

/// A process in an exec cgroup fills a UDP socket's receive buffer on loopback: the buffers are
/// charged to the exec's cgroup, and so held by the run's ceiling above it (on v1 a child's
/// socket buffers were charged to no cgroup at all until its own socket knob was written).
#[test]
#[ignore = "needs root: creates cgroups in palisade's parent; the root pass runs it with --include-ignored"]
fn an_exec_cgroups_socket_buffers_are_charged() {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(uid.unwrap(), 0, "this test creates cgroups: run it as root");
    let m = palisade_cgroup::detect(Path::new("/sys/fs/cgroup"), 0).unwrap();
    let mut run = m
        .create(&CgroupLimits {
            memory_bytes: 256 << 20,
            pids: 64,
            cpu_quota_us: None,
        })
        .unwrap();
    let exec = run.exec_cgroup().unwrap().expect("an exec cgroup");
    let script = "import socket, sys\n\
        sys.stdin.readline()\n\
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        r.bind(('127.0.0.1', 0))\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        for _ in range(100): s.sendto(b'x' * 1000, r.getsockname())\n\
        print('ready', flush=True)\n\
        sys.stdin.readline()\n";
    let mut p = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut join = exec.join_files().unwrap();
    for f in &mut join {
        f.write_all(p.id().to_string().as_bytes()).unwrap();
    }
    let dir = memory_dir_of(p.id());
    assert!(
        dir.ends_with(exec.name()),
        "{} is not the exec's",
        dir.display()
    );
    let mut stdin = p.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    BufReader::new(p.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // v1's figure is a counter read as it is; v2's `memory.stat` is brought up to date when a
    // read finds enough changes pending, or by the kernel's flush every 2 s: a few hundred KiB of
    // socket buffers can wait for the latter.
    let t0 = std::time::Instant::now();
    let mut charged = socket_charge(&dir);
    while charged == 0 && t0.elapsed() < std::time::Duration::from_secs(6) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        charged = socket_charge(&dir);
    }
    drop(stdin);
    let _ = p.wait();
    drop((join, exec));
    run.remove().unwrap();
    assert_eq!(line.trim(), "ready");
    assert!(
        charged > 0,
        "the exec's socket buffers are charged to no cgroup ({} shows 0)",
        dir.display()
    );
}

/// Starts `sh -c script` with its process in the exec cgroup `exec` (by pid, as the agent's child
/// does with `0`) before it goes on past a line on its stdin; returns it running.
fn start_in(exec: &dyn palisade_cgroup::ExecCgroup, script: &str) -> std::process::Child {
    let mut p = Command::new("sh")
        .args(["-c", &format!("read go; {script}")])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    for mut f in exec.join_files().unwrap() {
        f.write_all(p.id().to_string().as_bytes()).unwrap();
    }
    p.stdin.take().unwrap().write_all(b"go\n").unwrap();
    p
}

/// An ended exec's cgroup is taken by a later exec of the run once nothing runs in it, and
/// counts that exec's OOM kills only: one reused after a kill reads 0, the run's total keeps the
/// kill. One a process still runs in is not taken.
#[test]
#[ignore = "needs root: creates cgroups in palisade's parent; the root pass runs it with --include-ignored"]
fn an_exec_cgroup_taken_again_counts_only_its_new_execs_kills() {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(uid.unwrap(), 0, "this test creates cgroups: run it as root");
    let m = palisade_cgroup::detect(Path::new("/sys/fs/cgroup"), 0).unwrap();
    let mut run = m
        .create(&CgroupLimits {
            memory_bytes: 64 << 20,
            pids: 64,
            cpu_quota_us: None,
        })
        .unwrap();
    let first = run.exec_cgroup().unwrap().expect("an exec cgroup");
    let name = first.name().to_owned();
    let st = start_in(&*first, "exec python3 -c 'x = b\"x\" * (256 << 20)'")
        .wait()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(9),
        "{st:?}"
    );
    assert_eq!(first.oom_kills(), 1);
    drop(first);
    let second = run.exec_cgroup().unwrap().expect("an exec cgroup again");
    assert_eq!(second.name(), name, "the ended, empty one is taken");
    assert_eq!(
        second.oom_kills(),
        0,
        "the earlier exec's kill is not this one's"
    );
    assert!(run.stats().oom_kills >= 1, "the run's total keeps it");
    let st = start_in(&*second, "exit 3").wait().unwrap();
    assert_eq!(st.code(), Some(3));
    assert_eq!(second.oom_kills(), 0);
    // A process left running in it: the next exec gets another.
    let mut left = start_in(&*second, "exec sleep 60");
    drop(second);
    let third = run.exec_cgroup().unwrap().expect("a third");
    let other = third.name().to_owned();
    let _ = left.kill();
    let _ = left.wait();
    drop(third);
    run.remove().unwrap();
    assert_ne!(other, name, "a cgroup with a process in it was taken");
}

/// An exec that writes a file past the run's memory ceiling into a tmpfs (pages of no process's)
/// is killed in its own cgroup, at its own ceiling, and a larger process of the run's own (as a
/// session's agent is) lives on. With the exec's cgroup under the run's ceiling alone, the kernel
/// killed the largest process of the whole run: the bystander.
#[test]
#[ignore = "needs root: creates cgroups in palisade's parent; the root pass runs it with --include-ignored"]
fn an_exec_past_the_ceiling_is_killed_in_its_own_cgroup_not_the_runs_largest_process() {
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    assert_eq!(uid.unwrap(), 0, "this test creates cgroups: run it as root");
    let shm = Path::new("/dev/shm");
    let fs = rustix::fs::statfs(shm).expect("/dev/shm: this test writes its file to a tmpfs there");
    assert_eq!(
        fs.f_type as i64, 0x0102_1994,
        "/dev/shm is not a tmpfs: this test needs one for pages that belong to no process"
    );
    let m = palisade_cgroup::detect(Path::new("/sys/fs/cgroup"), 0).unwrap();
    let limit: u64 = 128 << 20;
    let mut run = m
        .create(&CgroupLimits {
            memory_bytes: limit,
            pids: 64,
            cpu_quota_us: None,
        })
        .unwrap();
    // The bystander: 6 MiB of its own, less than the room the exec leaves, more than the exec's
    // processes map.
    let mut bystander = Command::new("python3")
        .args([
            "-c",
            "import sys\nx = bytearray(6 << 20)\nx[::4096] = b'x' * len(x[::4096])\n\
             print('ready', flush=True)\nsys.stdin.readline()\n",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    run.join(bystander.id() as i32).unwrap();
    let mut line = String::new();
    BufReader::new(bystander.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let exec = run.exec_cgroup().unwrap().expect("an exec cgroup");
    // The exec's directory, and its ceiling.
    // (The bystander is in the run's directory, or in its leaf on v2.)
    let mut run_dir = memory_dir_of(bystander.id());
    if run_dir.ends_with(palisade_cgroup::PROCS_LEAF) {
        run_dir.pop();
    }
    let dir = run_dir.join(exec.name());
    let ceiling = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .unwrap_or_else(|| panic!("no memory ceiling file in {}", dir.display()));
    let file = shm.join(format!("palisade-exec-kernel-{}", std::process::id()));
    let st = start_in(
        &*exec,
        &format!(
            "exec dd if=/dev/zero of={} bs=1M count=256 2>/dev/null",
            file.display()
        ),
    )
    .wait()
    .unwrap();
    let (kills, run_kills) = (exec.oom_kills(), run.stats().oom_kills);
    let _ = std::fs::remove_file(&file);
    let bystander_alive = bystander.try_wait().unwrap().is_none();
    drop(bystander.stdin.take());
    let _ = bystander.kill();
    let _ = bystander.wait();
    drop(exec);
    run.remove().unwrap();
    assert!(
        bystander_alive,
        "the run's own process was killed for the exec's file (the exec: {st:?}, {kills} kills in its cgroup, {run_kills} in the run)"
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(9),
        "the exec past its ceiling: {st:?}"
    );
    assert_eq!(kills, 1, "kills counted in the exec's cgroup");
    assert_eq!(
        ceiling.trim().parse::<u64>().ok(),
        Some(palisade_cgroup::exec_memory_ceiling(limit)),
        "the exec cgroup's ceiling in {}",
        dir.display()
    );
}
