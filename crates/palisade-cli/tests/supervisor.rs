//! The supervisor against a payload that attacks it rather than the boundary: host quotas through
//! the namespace's owner, a pty it stops reading, the caller's terminal, the refused-call list,
//! the report's path and channel, the CPU the supervisor spends for it (audit 2026-12-03: F3, F4,
//! F7, F10, F11, F12, F13, F14). As root and as the unprivileged test user.
mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Waits for `child` at most `limit` (a liveness watchdog far above the expected time, not a
/// timing assertion): kills it and fails the test if it is still running then.
fn wait_or_fail(child: &mut std::process::Child, limit: Duration, what: &str) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: palisade was still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A python3 payload file in a fresh directory, mounted at /probe.
fn script(tag: &str, text: &str) -> (TempDir, String) {
    let d = TempDir::new(tag);
    std::fs::write(d.path().join("p.py"), text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        d.path().join("p.py"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let bind = format!("{}:/p", d.s());
    (d, bind)
}

/// Runs `python3 /p/p.py ARGS` in a sandbox with its stdout piped, returning the child and a
/// reader of its stdout lines.
fn spawn_script(
    bind: &str,
    opts: &[&str],
    args: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut cmd = vec!["/usr/bin/python3", "/p/p.py"];
    cmd.extend_from_slice(args);
    let mut o = vec!["--ro", bind];
    o.extend_from_slice(opts);
    let mut child = command(&o, &cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("palisade starts");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Reads lines until one starts with `prefix`; fails with what came instead.
fn expect_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, prefix: &str) -> String {
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l.starts_with(prefix) {
            return l;
        }
        seen.push(l);
    }
    panic!("no `{prefix}` line from the payload; it printed {seen:?}");
}

fn host_inotify_works() -> Result<(), std::io::Error> {
    // SAFETY: inotify_init1 returns a new descriptor or -1; the descriptor is closed at once.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: closing the descriptor we just got.
    unsafe { libc::close(fd) };
    Ok(())
}

fn host_timer_works() -> Result<(), std::io::Error> {
    // SAFETY: a zeroed sigevent is valid; timer_create fills `t` on success, and the timer is
    // deleted at once.
    unsafe {
        let mut ev: libc::sigevent = std::mem::zeroed();
        ev.sigev_notify = libc::SIGEV_SIGNAL;
        ev.sigev_signo = libc::SIGRTMIN();
        let mut t: libc::timer_t = std::mem::zeroed();
        if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::timer_delete(t);
    }
    Ok(())
}

const HOGS: &str = r#"
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while libc.inotify_init1(0) >= 0:
    n += 1
print("inotify", n, flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
q = 0
while q < 1000000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) == 0:
    q += 1
print("queued", q, flush=True)
# kill() is never held to RLIMIT_SIGPENDING (the kernel lets it override the limit), but it is
# still counted against the namespace's owner.
k = 0
try:
    while k < int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGRTMIN)
        k += 1
except OSError:
    pass
print("killed", k, flush=True)
print("ready", flush=True)
time.sleep(30)
"#;

/// F3: inotify instances and queued signals inside count against the namespace's owner up the
/// chain. The host's own processes of the launching user (root, or the test user) keep theirs
/// while a sandbox takes all it can.
#[test]
fn a_sandbox_cannot_use_up_the_launching_users_kernel_quotas() {
    let (_d, bind) = script("hogs", HOGS);
    // Unprivileged, the namespace's owner is the user themself (the kernel maps no other id), and
    // signals queued with kill() count against them unbounded: that one is for root launches only
    // (docs/threat-model.md).
    let kills = if euid() == 0 { "200000" } else { "0" };
    let (mut child, mut lines) = spawn_script(&bind, &["--timeout", "60s"], &[kills]);
    let inotify: u64 = expect_line(&mut lines, "inotify ")[8..].parse().unwrap();
    let queued: u64 = expect_line(&mut lines, "queued ")[7..].parse().unwrap();
    let killed: u64 = expect_line(&mut lines, "killed ")[7..].parse().unwrap();
    expect_line(&mut lines, "ready");
    let ino = host_inotify_works();
    let timer = host_timer_works();
    let _ = child.kill();
    let _ = child.wait();
    assert!(ino.is_ok(), "host inotify_init1 as uid {}: {ino:?}", euid());
    assert!(
        timer.is_ok(),
        "host timer_create as uid {}: {timer:?}",
        euid()
    );
    // The sandbox keeps to its own small share.
    assert!(inotify <= 32, "{inotify} inotify instances inside");
    assert!(queued <= 1024, "{queued} signals queued inside");
    assert!(
        inotify > 0 && queued > 0,
        "the hogs did not run: {inotify} {queued}"
    );
    if euid() == 0 {
        assert_eq!(killed, 200_000, "the kill() hog did not run");
    }
}

/// F3: a root-launched run's user namespace is owned by its own host id, not root, and two runs
/// at once get different ids.
#[test]
fn root_launched_runs_get_a_host_id_of_their_own() {
    let (_d, bind) = script(
        "ids",
        "import time\nprint(open('/proc/self/uid_map').read().split()[1], flush=True)\nprint('ready', flush=True)\ntime.sleep(30)\n",
    );
    let (mut a, mut la) = spawn_script(&bind, &["--timeout", "60s"], &[]);
    let (mut b, mut lb) = spawn_script(&bind, &["--timeout", "60s"], &[]);
    let ida: u64 = la.next().unwrap().unwrap().trim().parse().unwrap();
    let idb: u64 = lb.next().unwrap().unwrap().trim().parse().unwrap();
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    if euid() == 0 {
        assert_ne!(ida, idb, "two root-launched runs share host id {ida}");
        for id in [ida, idb] {
            assert!(
                (2_147_000_000..2_147_000_000 + 65_536).contains(&id),
                "host id {id}"
            );
        }
    } else {
        // Unprivileged, the kernel allows only the user's own id.
        assert_eq!((ida, idb), (euid() as u64, euid() as u64));
    }
}

const RAW_NO_READ: &str = r#"
import tty, termios, time, sys
tty.setraw(0, termios.TCSANOW)
for i in range(20):
    time.sleep(1)
"#;

/// F4: with a pty, a payload that switches it to raw mode and never reads, under more input than
/// the pty holds, used to block the supervisor in a write: no timeout, no report, no exit.
#[test]
fn a_payload_that_stops_reading_its_pty_still_meets_its_timeout() {
    let (_d, bind) = script("pty", RAW_NO_READ);
    let input = TempDir::new("pty-in");
    let inp = input.path().join("in");
    std::fs::write(&inp, vec![b'x'; 20_000_000]).unwrap();
    let mut child = Command::new(palisade_bin())
        .args([
            "run",
            "-q",
            "--tty",
            "--timeout",
            "2s",
            "--json",
            "-",
            "--ro",
            &bind,
        ])
        .args(["--", "/usr/bin/python3", "/p/p.py"])
        .stdin(std::fs::File::open(&inp).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(out), &mut s);
        s
    });
    let code = wait_or_fail(&mut child, Duration::from_secs(60), "pty not read");
    let out = reader.join().unwrap();
    assert_eq!(code, 124, "{out}");
    let r = Run {
        code,
        stdout: out,
        stderr: String::new(),
    }
    .report();
    assert_eq!(r["status"], "timeout", "{r}");
}

/// F4, second variant: endless input with echo on kept the pty readable after the payload
/// exited, and the supervisor spun forever instead of ending.
#[test]
fn endless_input_into_a_pty_does_not_keep_the_supervisor_going() {
    let mut child = Command::new(palisade_bin())
        .args(["run", "-q", "--tty", "--timeout", "20s", "--", "sleep", "1"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let code = wait_or_fail(&mut child, Duration::from_secs(60), "endless pty input");
    assert_eq!(code, 0);
}

const FLOOD_KINDS: &str = r#"
import socket, ctypes
libc = ctypes.CDLL(None, use_errno=True)
for f in [f for f in range(3, 200) if f not in (1, 2, 10)][:64]:
    try: socket.socket(f, socket.SOCK_RAW, 0)
    except OSError: pass
for i in range(3):
    libc.syscall(321, 0, 0, 0)           # bpf
    libc.syscall(101, 16, 1, 0, 0)       # ptrace
    libc.syscall(272, 0x10000000)        # unshare(CLONE_NEWUSER)
"#;

/// F10: after 64 kinds of refused call, later ones were counted under the last entry and never
/// named. Every call the filter refuses is named in the report, however many others came first.
#[test]
fn every_refused_call_is_named_after_a_flood_of_others() {
    let (_d, bind) = script("kinds", FLOOD_KINDS);
    let r = run(
        &["--ro", &bind, "--json", "-"],
        &["/usr/bin/python3", "/p/p.py"],
    );
    let rep = r.report();
    let denied = rep["denied_syscalls"].as_array().unwrap();
    let names: Vec<&str> = denied.iter().map(|d| d["name"].as_str().unwrap()).collect();
    for call in ["bpf", "ptrace", "unshare"] {
        let d = denied
            .iter()
            .find(|d| d["name"] == call)
            .unwrap_or_else(|| panic!("{call} is not named: {names:?}"));
        assert_eq!(d["count"], 3, "{d}");
    }
    // The socket families are named up to a bound, the rest counted together.
    let sockets: u64 = denied
        .iter()
        .filter(|d| d["name"].as_str().unwrap().starts_with("socket ("))
        .map(|d| d["count"].as_u64().unwrap())
        .sum();
    assert!(
        sockets >= 60,
        "{sockets} refused sockets counted: {names:?}"
    );
    assert!(names.len() <= 40, "{} entries: {names:?}", names.len());
    assert!(names.contains(&"socket (other)"), "{names:?}");
}

/// F11: with `--no-tty` and a terminal on stdin, the payload used to get the caller's terminal
/// as fd 0: it could write to it without limit and change its modes. Now the terminal's input is
/// relayed through a pipe.
#[test]
fn without_a_pty_the_payload_never_holds_the_callers_terminal() {
    let (_d, bind) = script(
        "term",
        r#"
import os, sys
try:
    n = sum(os.write(0, b"Y" * 999 + b"\n") for i in range(200))
    print("wrote", n)
except OSError as e:
    print("write refused", e.errno)
print("isatty", os.isatty(0))
try:
    import termios
    a = termios.tcgetattr(0); a[3] &= ~termios.ECHO; termios.tcsetattr(0, termios.TCSANOW, a)
    print("termios changed")
except Exception as e:
    print("termios refused", type(e).__name__)
"#,
    );
    // `script` gives palisade a terminal on stdin; afterwards `stty -a` shows its modes.
    let inner = format!(
        "{} run -q --no-tty --output-limit 1MiB --ro {bind} -- /usr/bin/python3 /p/p.py; stty -a",
        palisade_bin().display()
    );
    let out = Command::new("script")
        .args(["-qfec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("write refused"), "{text}");
    assert!(text.contains("isatty False"), "{text}");
    assert!(text.contains("termios refused"), "{text}");
    assert!(!text.contains("YYYY"), "{text}");
    assert!(
        !text.split_whitespace().any(|w| w == "-echo"),
        "the terminal lost its echo: {text}"
    );
}

/// F7: `--json PATH` followed a link the code planted: a root supervisor overwrote any host
/// file. A report path inside what the sandbox can write is refused before anything runs; a
/// link at the report's name is replaced, never followed.
#[test]
fn the_report_path_is_never_followed_nor_inside_what_the_sandbox_writes() {
    let d = TempDir::new("json");
    let scratch = d.path().join("s");
    std::fs::create_dir(&scratch).unwrap();
    let inside = scratch.join("report.json");
    let r = run(
        &[
            "--scratch",
            &scratch.display().to_string(),
            "--json",
            &inside.display().to_string(),
        ],
        &["/bin/sh", "-c", "touch /workspace/ran"],
    );
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("--json") && r.stderr.contains("can write"),
        "{}",
        r.stderr
    );
    assert!(
        !scratch.join("ran").exists(),
        "the command ran despite the refusal"
    );

    let victim = d.path().join("victim");
    std::fs::write(&victim, "IMPORTANT").unwrap();
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("report.json")).unwrap();
    let r = run(
        &["--json", &out.join("report.json").display().to_string()],
        &["true"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "IMPORTANT");
    let meta = std::fs::symlink_metadata(out.join("report.json")).unwrap();
    assert!(meta.is_file(), "the report is not a plain file: {meta:?}");
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(rep["status"], "ok");
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

/// F12: the report on stdout follows the payload's own output, which can print a fake one
/// first. `--report-fd` is a channel the payload never holds.
#[test]
fn the_report_fd_cannot_be_forged_by_the_payload() {
    let d = TempDir::new("rfd");
    let file = d.path().join("r.json");
    let inner = format!(
        "{} run -q --no-tty --report-fd 3 -- sh -c 'printf \"{{\\\"status\\\":\\\"ok\\\",\\\"exit_code\\\":0}}\\n\"; test -e /proc/self/fd/3 && echo LEAK; exit 3' 3>{}",
        palisade_bin().display(),
        file.display()
    );
    let out = Command::new("sh")
        .args(["-c", &inner])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.starts_with("{\"status\":\"ok\""), "{stdout}");
    assert!(
        !stdout.contains("LEAK"),
        "the payload holds the report's descriptor: {stdout}"
    );
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(rep["status"], "exit", "{rep}");
    assert_eq!(rep["exit_code"], 3, "{rep}");
    // Bad descriptors are refused by name.
    let r = run(&["--report-fd", "1"], &["true"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("--report-fd"), "{}", r.stderr);
    let r = run(&["--report-fd", "97"], &["true"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("not an open descriptor"), "{}", r.stderr);
}

const REFUSAL_FLOOD: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + float(sys.argv[1])
for p in range(4):
    if os.fork() == 0:
        while time.time() < end:
            libc.syscall(163, 0)   # acct: refused, answered by the supervisor
        os._exit(0)
for p in range(4):
    os.wait()
"#;

/// F13: every refused call costs the supervisor a round trip outside the sandbox's cgroup. That
/// work is throttled to the sandbox's CPU share and charged to its CPU-time limit.
#[test]
fn the_supervisors_work_for_refused_calls_is_bounded_and_charged() {
    let (_d, bind) = script("flood", REFUSAL_FLOOD);
    // Charged: the sandbox itself barely runs (it waits in the refused calls), yet the CPU-time
    // limit ends it.
    let r = run(
        &[
            "--ro",
            &bind,
            "--cpu-time",
            "300ms",
            "--timeout",
            "60s",
            "--json",
            "-",
        ],
        &["/usr/bin/python3", "/p/p.py", "30"],
    );
    let rep = r.report();
    assert_eq!(rep["status"], "cpu-timeout", "{rep}");
    let sandbox = rep["cpu_user_ms"].as_f64().unwrap() + rep["cpu_system_ms"].as_f64().unwrap();
    let sup = rep["supervisor_cpu_ms"].as_f64().unwrap();
    assert!(
        sandbox + sup >= 300.0,
        "sandbox {sandbox} ms + supervisor {sup} ms"
    );
    // Throttled: under a 0.1 CPU quota the supervisor spends about that share, not a whole CPU.
    let r = run(
        &[
            "--ro",
            &bind,
            "--cpus",
            "0.1",
            "--timeout",
            "60s",
            "--json",
            "-",
        ],
        &["/usr/bin/python3", "/p/p.py", "3"],
    );
    let rep = r.report();
    assert_eq!(rep["status"], "ok", "{rep}");
    let wall = rep["wall_time_ms"].as_f64().unwrap();
    let sup = rep["supervisor_cpu_ms"].as_f64().unwrap();
    assert!(
        sup <= wall * 0.1 * 1.5 + 150.0,
        "supervisor {sup} ms of CPU in {wall} ms under --cpus 0.1"
    );
    assert!(rep["refusals_throttled"].as_u64().unwrap() > 0, "{rep}");
}

/// F14: with `--keep` the scratch is a host directory, where `--scratch-size` cannot be
/// enforced: the combination is refused instead of ignored.
#[test]
fn a_scratch_size_for_a_host_scratch_is_refused() {
    let r = run(&["--keep", "--scratch-size", "1MiB"], &["true"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("--scratch-size"), "{}", r.stderr);
    let d = TempDir::new("ssz");
    let r = run(&["--scratch", &d.s(), "--scratch-size", "1MiB"], &["true"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
}
