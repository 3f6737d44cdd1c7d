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
