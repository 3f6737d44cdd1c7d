//! The boundary, attacked from inside real sandboxes. Each test fails if the probe could not run.
//! Run as root and as an unprivileged user (see `.ci/run`).

mod common;
use common::*;
use palisade::policy::{Bind, Policy};
use palisade::{Report, Sandbox};
use std::os::unix::fs::MetadataExt;

#[test]
fn canary_in_the_invoking_users_home_is_absent() {
    let home = home_dir();
    let canary = home.join(format!(".palisade-canary-{}", unique("c")));
    std::fs::write(&canary, "CANARY-SECRET")
        .expect("the test must be able to write a canary in its own home");
    let r = probe(&[], &["read", &canary.display().to_string()]);
    let _ = std::fs::remove_file(&canary);
    assert_eq!(
        r.probe(&format!("read {}", canary.display())),
        "absent",
        "{}",
        r.stderr
    );
    let r = probe(&[], &["read", &home.display().to_string()]);
    assert!(!r.stdout.contains("CANARY-SECRET"));
}

#[test]
fn etc_shadow_and_host_etc_are_absent() {
    let r = probe(&[], &["read", "/etc/shadow"]);
    assert_eq!(r.probe("read /etc/shadow"), "absent");
    let r = probe(&[], &["read", "/etc/machine-id"]);
    assert_eq!(r.probe("read /etc/machine-id"), "absent");
    // What is there is the synthesized file, not the host's.
    let r = probe(&[], &["read", "/etc/passwd"]);
    let line = r.probe("read /etc/passwd");
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        !line.contains("postgres") && !line.contains("palisade-test:x"),
        "host passwd leaked: {line}"
    );
}

#[test]
fn writes_outside_scratch_fail() {
    for p in [
        "/usr/palisade-x",
        "/etc/palisade-x",
        "/palisade-x",
        "/bin/palisade-x",
        "/proc/sys/kernel/hostname",
    ] {
        let r = probe(&[], &["write", p]);
        let got = r.probe(&format!("write {p}"));
        assert!(
            got.starts_with("denied"),
            "write to {p} was not refused: {got}"
        );
    }
    assert!(!std::path::Path::new("/usr/palisade-x").exists());
}

#[test]
fn writes_in_scratch_land_on_the_host_owned_by_the_invoking_user() {
    let d = TempDir::new("scratch");
    let r = probe(&["--scratch", &d.s()], &["write", "/workspace/out.txt"]);
    assert_eq!(r.probe("write /workspace/out.txt"), "ok", "{}", r.stderr);
    let meta = std::fs::metadata(d.path().join("out.txt"))
        .expect("the file written in scratch is on the host");
    assert_eq!(meta.uid(), euid(), "file owner on the host");
    // Relative paths land in scratch too: it is the working directory.
    let r = probe(&["--scratch", &d.s()], &["write", "rel.txt"]);
    assert_eq!(r.probe("write rel.txt"), "ok");
    assert!(d.path().join("rel.txt").exists());
}

#[test]
fn payload_is_never_host_root() {
    let r = probe(&[], &["caps"]);
    let caps = r.probe("caps");
    assert!(caps.contains("CapEff=0000000000000000"), "{caps}");
    assert!(caps.contains("CapPrm=0000000000000000"), "{caps}");
    assert!(caps.contains("CapBnd=0000000000000000"), "{caps}");
    assert!(caps.contains("CapAmb=0000000000000000"), "{caps}");
    assert!(caps.contains("NoNewPrivs=1"), "{caps}");
    let d = TempDir::new("json");
    let rep = d.path().join("r.json");
    let r = run(
        &["--json", &rep.display().to_string()],
        &["/probe", "whoami"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
    assert_ne!(
        j["host_uid"], 0,
        "the payload's host uid must never be 0: {j}"
    );
}

#[test]
fn secrets_in_the_environment_do_not_leak() {
    let secret = unique("FAKE-SECRET-VALUE");
    let mut c = command(
        &[],
        &[
            "/bin/sh",
            "-c",
            "/probe env; /probe read /proc/1/environ; /probe read /proc/self/environ",
        ],
    );
    c.env("FAKE_SECRET", &secret)
        .env("SSH_AUTH_SOCK", "/tmp/agent.sock");
    let r: Run = c.output().unwrap().into();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("probe env: HOME=/workspace"),
        "{}",
        r.stdout
    );
    assert!(
        !r.stdout.contains(&secret),
        "the secret leaked:\n{}",
        r.stdout
    );
    assert!(!r.stdout.contains("SSH_AUTH_SOCK"), "{}", r.stdout);
    let init_env = r.probe("read /proc/1/environ");
    assert!(
        init_env.starts_with("denied") || init_env == "ok 0 bytes ",
        "{init_env}"
    );
    let names: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("probe env: "))
        .map(|l| l.split('=').next().unwrap())
        .collect();
    for n in &names {
        assert!(
            ["PATH", "HOME", "LANG", "PWD", "SHLVL", "_"].contains(n),
            "unexpected variable {n} in {names:?}"
        );
    }
}

#[test]
fn supervisor_environ_is_out_of_reach() {
    let secret = unique("SUPERVISOR-SECRET");
    let mut c = command(
        &[],
        &[
            "/bin/sh",
            "-c",
            "for p in /proc/[0-9]*; do /probe read $p/environ; done",
        ],
    );
    c.env("FAKE_SECRET", &secret);
    let r: Run = c.output().unwrap().into();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("probe read /proc/1/environ"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains(&secret), "{}", r.stdout);
}

#[test]
fn proc_lists_only_sandbox_processes_and_host_pids_cannot_be_killed() {
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep is needed on the host");
    let vp = victim.id().to_string();
    let r = run(
        &[],
        &["/bin/sh", "-c", &format!("/probe pids; /probe kill {vp}")],
    );
    let pids = r.probe("pids");
    let list: Vec<u32> = pids
        .trim_start_matches("ok ")
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        list.contains(&1) && list.len() <= 4,
        "pids inside: {list:?}"
    );
    assert!(!list.contains(&victim.id()) || victim.id() < 10);
    assert_eq!(r.probe(&format!("kill {vp}")), "denied ESRCH");
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process was killed"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn the_host_cgroup_tree_is_hidden() {
    let r = probe(&[], &["read", "/proc/self/cgroup"]);
    let got = r.probe("read /proc/self/cgroup");
    assert!(got.starts_with("ok"), "{got}");
    for line in got
        .split("\\n")
        .filter(|l| !l.is_empty() && !l.starts_with("ok"))
    {
        assert!(
            line.ends_with(":/"),
            "a host cgroup path is visible: {line} in {got}"
        );
    }
    assert!(!got.contains("palisade") && !got.contains(".."), "{got}");
}

/// A sandbox's own terminal file system holds at most 64 terminals. Without a ceiling of its own,
/// every sandbox's instance draws on one host-wide pool (`kernel.pty.max` less the host's
/// reserve: 3,072 by default), which one payload could empty for every container and sandbox on
/// the host (an independent attack, 2026-12-05, held 3,071 from one run).
#[test]
fn a_sandbox_holds_at_most_64_terminals() {
    let r = probe(&[], &["ptys"]);
    assert_eq!(r.probe("ptys"), "ok 64 then ENOSPC", "{}", r.stdout);
    // With --tty the run's own terminal is one of them.
    let r = probe(&["--tty"], &["ptys"]);
    assert_eq!(r.probe("ptys"), "ok 63 then ENOSPC", "{}", r.stdout);
}

#[test]
fn seccomp_refuses_the_kernels_riskiest_calls() {
    // Control: outside the sandbox these calls work on this host, so a refusal inside is the
    // filter's doing, not the host's.
    let control: Run = std::process::Command::new(probe_bin())
        .arg("syscalls")
        .output()
        .unwrap()
        .into();
    for what in [
        "sys keyctl",
        "sys process_vm_readv",
        "sys socket-netlink",
        "sys ptrace-traceme",
        "sys fanotify_init",
        "sys socketpair-unix",
        "sys io_setup",
    ] {
        assert!(
            control.probe(what).starts_with("ok"),
            "control {what}: {}",
            control.probe(what)
        );
    }
    // open_tree_attr came in Linux 6.15: an older kernel answers ENOSYS outside, and the filter
    // must refuse it inside all the same (it is refused by number, whatever the kernel knows).
    let got = control.probe("sys open_tree_attr");
    if kernel_at_least(6, 15) {
        assert!(got.starts_with("ok"), "control sys open_tree_attr: {got}");
    } else {
        assert_eq!(got, "denied ENOSYS", "control sys open_tree_attr");
    }
    // memfd_secret is there only where the kernel has secret memory (on by default since 6.5).
    let got = control.probe("sys memfd_secret");
    assert!(
        got.starts_with("ok") || got == "denied ENOSYS",
        "control sys memfd_secret: {got}"
    );
    // socketpair of these families fails outside too, but in the family's own code (no pairs,
    // or no CAP_NET_RAW), not for want of the family: the code the filter keeps out runs there.
    for what in ["sys socketpair-netlink", "sys socketpair-packet"] {
        let got = control.probe(what);
        assert!(
            got.starts_with("denied") && got != "denied EAFNOSUPPORT",
            "control {what}: {got}"
        );
    }
    let r = probe(&["--tty"], &["syscalls"]);
    for what in [
        "sys io_uring_setup",
        "sys bpf",
        "sys userfaultfd",
        "sys keyctl",
        "sys process_vm_readv",
        "sys unshare-user",
        "sys clone-newnet",
        "sys tiocsti-high-bits",
        "sys ptrace-traceme",
        "sys memfd_secret",
        "sys io_setup",
    ] {
        assert_eq!(r.probe(what), "denied EPERM", "{what}\n{}", r.stdout);
    }
    assert_eq!(
        r.probe("sys clone3"),
        "absent".replace("absent", "denied ENOSYS")
    );
    assert_eq!(r.probe("sys socket-netlink"), "denied EAFNOSUPPORT");
    assert_eq!(r.probe("sys socket-packet"), "denied EAFNOSUPPORT");
    for family in ["netlink", "packet", "vsock", "xdp"] {
        assert_eq!(
            r.probe(&format!("sys socketpair-{family}")),
            "denied EAFNOSUPPORT"
        );
    }
    assert_eq!(r.probe("sys socketpair-unix"), "ok");
    assert_eq!(r.probe("sys open_tree_attr"), "denied EPERM");
    assert_eq!(r.probe("sys fanotify_init"), "denied EPERM");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(r.probe("sys x32-getpid"), "denied EPERM");
    }
    let caps = probe(&[], &["caps"]).probe("caps");
    assert!(
        caps.contains("Seccomp=2"),
        "the filter is not installed: {caps}"
    );
}

#[test]
fn allow_ptrace_lets_tracing_through_and_nothing_else() {
    let r = run(&["--allow-ptrace", "--json", "-"], &["/probe", "syscalls"]);
    assert!(
        r.probe("sys ptrace-traceme").starts_with("ok"),
        "{}",
        r.stdout
    );
    assert!(
        r.probe("sys process_vm_readv").starts_with("ok"),
        "{}",
        r.stdout
    );
    assert_eq!(r.probe("sys bpf"), "denied EPERM");
    assert_eq!(r.probe("sys unshare-user"), "denied EPERM");
    assert!(
        r.stdout.contains("ALLOWED by --allow-ptrace"),
        "{}",
        r.stdout
    );
    // Without the switch, the same calls are refused (see the test above).
    let r = run(&[], &["/probe", "syscalls"]);
    assert_eq!(r.probe("sys ptrace-traceme"), "denied EPERM");
}

#[test]
fn refused_calls_are_reported_with_counts() {
    let r = run(
        &["--json", "-"],
        &[
            "/bin/sh",
            "-c",
            "/probe syscalls; /probe syscalls; /probe syscalls",
        ],
    );
    let j = r.report();
    let denied = j["denied_syscalls"].as_array().expect("denied_syscalls");
    let entry = |name: &str| {
        denied
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} not reported: {denied:?}"))
            .clone()
    };
    for name in [
        "ptrace",
        "bpf",
        "io_uring_setup",
        "keyctl",
        "unshare",
        "ioctl TIOCSTI",
    ] {
        let d = entry(name);
        assert_eq!(d["count"], 3, "{d}");
        assert_eq!(d["errno"], "EPERM", "{d}");
        // A pid inside the sandbox (init is 1, the shell 2, the probes after it).
        assert!((2..1000).contains(&d["first_pid"].as_u64().unwrap()), "{d}");
    }
    assert_eq!(entry("socket (netlink)")["errno"], "EAFNOSUPPORT");
    let pair = entry("socketpair (netlink)");
    assert_eq!(
        (&pair["errno"], &pair["count"]),
        (&"EAFNOSUPPORT".into(), &3.into())
    );
    assert_eq!(entry("clone (namespace flags)")["count"], 3);
    // clone3's ENOSYS is libc's everyday fallback, not an attempt.
    assert!(denied.iter().all(|d| d["name"] != "clone3"), "{denied:?}");
    // Control: an ordinary run reports nothing.
    let r = run(
        &["--json", "-"],
        &["/bin/sh", "-c", "ls / >/dev/null; echo hi"],
    );
    let j = r.report();
    assert_eq!(j["denied_syscalls"], serde_json::json!([]), "{j}");
}

/// Every call on the filter's refused list, once: each fails with `EPERM` inside and the report
/// records it under its name, once, from a pid inside; and `socket` and `socketpair` of each refused
/// family fail with `EAFNOSUPPORT` and are recorded as `socket (FAMILY)`, `socketpair (FAMILY)`.
#[test]
fn every_refused_call_fails_with_eperm_and_is_reported() {
    // Control, as root (whom no capability check refuses): outside, the kernel's own argument
    // checks answer, never EPERM (nor EAFNOSUPPORT for the families), so those errors inside are
    // the filter's.
    if euid() == 0 {
        let out = std::process::Command::new(probe_bin())
            .arg("refused")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.lines().count() >= 48, "control: {out}");
        assert!(!out.contains("EPERM"), "control: {out}");
        assert!(!out.contains("EAFNOSUPPORT"), "control: {out}");
    }
    let r = probe(&["--json", "-"], &["refused"]);
    let lines: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("probe refused "))
        .collect();
    assert!(lines.len() >= 40, "{}", r.stdout);
    let j = r.report();
    let denied = j["denied_syscalls"].as_array().expect("denied_syscalls");
    let reported = |name: &str, errno: &str| {
        let d = denied
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} not reported: {denied:?}"));
        assert_eq!(d["errno"], errno, "{d}");
        assert!((1..1000).contains(&d["first_pid"].as_u64().unwrap()), "{d}");
    };
    for l in &lines {
        let (what, result) = l["probe refused ".len()..].split_once(": ").unwrap();
        assert_eq!(result, "denied EPERM", "{l}");
        let name = match what {
            "ioctl-TIOCSTI" => "ioctl TIOCSTI",
            "ioctl-TIOCSETD" => "ioctl TIOCSETD",
            w if w.starts_with("ioctl-TIOCLINUX") => "ioctl TIOCLINUX",
            w => w,
        };
        reported(name, "EPERM");
    }
    // The calls added for audit findings F3 and F15, by name: a probe that lost them would
    // otherwise still pass.
    // The calls added for an independent attack of 2026-12-05 too (memfd_secret, io_setup).
    for name in [
        "open_tree_attr",
        "fanotify_init",
        "lsm_set_self_attr",
        "memfd_secret",
        "io_setup",
    ] {
        assert_eq!(
            r.probe(&format!("refused {name}")),
            "denied EPERM",
            "{}",
            r.stdout
        );
    }
    for call in ["socket", "socketpair"] {
        for family in ["netlink", "packet", "vsock", "xdp"] {
            assert_eq!(
                r.probe(&format!("refused-family {call}-{family}")),
                "denied EAFNOSUPPORT"
            );
            reported(&format!("{call} ({family})"), "EAFNOSUPPORT");
        }
    }
    let count = |name: &str| {
        denied
            .iter()
            .find(|d| d["name"] == name)
            .map(|d| d["count"].as_u64().unwrap())
    };
    assert_eq!(count("mount"), Some(1));
    assert_eq!(count("socketpair (xdp)"), Some(1));
    assert_eq!(count("ioctl TIOCLINUX"), Some(2));
}

#[test]
fn no_set_uid_file_reaches_the_host() {
    use std::os::unix::fs::PermissionsExt;
    // Control: outside the sandbox the probe can make a set-uid file (its own, in a temp dir).
    let outside = TempDir::new("setuid-control");
    let f = outside.path().join("x");
    let control: Run = std::process::Command::new(probe_bin())
        .args(["setuid", f.to_str().unwrap()])
        .output()
        .unwrap()
        .into();
    assert_eq!(
        control.probe(&format!("chmod-setuid {}", f.display())),
        "ok"
    );
    let d = TempDir::new("setuid");
    let r = probe(&["--scratch", &d.s()], &["setuid", "/workspace/x"]);
    assert_eq!(
        r.probe("chmod-setuid /workspace/x"),
        "denied EPERM",
        "{}",
        r.stderr
    );
    assert_eq!(
        r.probe("create-setuid /workspace/x.created"),
        "denied EPERM"
    );
    for e in std::fs::read_dir(d.path()).unwrap().flatten() {
        let mode = e.metadata().unwrap().permissions().mode();
        assert_eq!(
            mode & 0o6000,
            0,
            "{} has mode {mode:o} on the host",
            e.path().display()
        );
    }
}

#[test]
fn nested_user_namespaces_are_refused() {
    let r = probe(&[], &["unshare-user"]);
    assert!(
        r.probe("unshare-user").starts_with("denied"),
        "{}",
        r.stdout
    );
    let r = run(&[], &["unshare", "-U", "true"]);
    assert_ne!(r.code, 0, "unshare -U succeeded inside: {}", r.stderr);
    assert!(
        r.stderr.contains("unshare"),
        "util-linux unshare must be installed: {}",
        r.stderr
    );
}

#[test]
fn exit_codes_pass_through_and_signals_are_reported() {
    for code in [0, 1, 42] {
        let r = probe(&[], &["exit", &code.to_string()]);
        assert_eq!(r.code, code, "{}", r.stderr);
    }
    let d = TempDir::new("segv");
    let rep = d.path().join("r.json");
    let r = run(&["--json", &rep.display().to_string()], &["/probe", "segv"]);
    assert_eq!(r.code, 128 + 11, "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
    assert_eq!(j["status"], "signal");
    assert_eq!(j["signal"], 11);
    assert_eq!(j["signal_name"], "SIGSEGV");
}

#[test]
fn the_hosts_loopback_is_unreachable() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // Control: the listener is real and reachable from the host.
    std::net::TcpStream::connect(addr).expect("the host listener must accept from the host");
    let r = probe(&[], &["connect", &addr.to_string()]);
    assert!(
        r.probe(&format!("connect {addr}")).starts_with("denied"),
        "{}",
        r.stdout
    );
    // The namespace alone: with Landlock letting port 80 through, the empty namespace has no
    // route out.
    let r = probe(
        &["--allow-local-port", "80"],
        &["connect", "10.255.255.1:80"],
    );
    assert_eq!(r.probe("connect 10.255.255.1:80"), "denied ENETUNREACH");
}

/// An abstract unix socket listening on the host (a D-Bus or X11 socket has this form) is out of
/// reach: abstract names belong to the network namespace, and Landlock ABI 6 also scopes them.
#[test]
fn an_abstract_unix_socket_on_the_host_is_unreachable() {
    use std::os::linux::net::SocketAddrExt;
    let name = unique("palisade-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let l = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    l.set_nonblocking(true).unwrap();
    // Control: the host can connect.
    let c = std::os::unix::net::UnixStream::connect_addr(&addr).expect("control connect");
    drop(c);
    l.accept().expect("the control connection");
    let r = probe(&[], &["unix-abstract", &name]);
    assert_eq!(
        r.probe(&format!("unix-abstract {name}")),
        "denied ECONNREFUSED",
        "{}",
        r.stdout
    );
    assert!(l.accept().is_err(), "a connection from inside arrived");
}

fn landlock_abi() -> u64 {
    run(&["--json", "-"], &["true"]).report()["landlock_abi"]
        .as_u64()
        .expect("landlock_abi in the report")
}

/// Landlock's TCP rights (ABI 4 and later), a second wall behind the empty network namespace: a
/// connect to a port that is neither the proxy's nor an allowed local port, and any bind, are
/// refused by Landlock before the network stack sees them; `--allow-local-port` opens exactly the
/// ports it names, for a server and its client inside the sandbox. Without ABI 4 the report says
/// TCP is not handled and the namespace answers alone.
#[test]
fn landlock_limits_tcp_to_the_proxy_and_the_allowed_local_ports() {
    let abi = landlock_abi();
    let r = probe(&["--json", "-"], &["connect", "127.0.0.1:9"]);
    let layer = r.report()["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "landlock")
        .cloned()
        .expect("a landlock layer");
    let detail = layer["detail"].as_str().unwrap().to_owned();
    let listen =
        |opts: &[&str], addr: &str| probe(opts, &["listen", addr]).probe(&format!("listen {addr}"));
    if abi < 4 {
        assert!(
            detail.contains("TCP not handled (ABI 4 needed)"),
            "{detail}"
        );
        assert_eq!(r.probe("connect 127.0.0.1:9"), "denied ECONNREFUSED");
        assert_eq!(listen(&[], "127.0.0.1:8000"), "ok served");
        return;
    }
    assert!(
        detail.contains("TCP connect only to no port, bind only to no port"),
        "{detail}"
    );
    assert_eq!(r.probe("connect 127.0.0.1:9"), "denied EACCES");
    assert_eq!(listen(&[], "127.0.0.1:8000"), "denied EACCES");
    assert_eq!(listen(&[], "[::1]:8000"), "denied EACCES");
    // Control: the same server and client work once the port is allowed, and only that port.
    let open = ["--allow-local-port", "8000"];
    assert_eq!(listen(&open, "127.0.0.1:8000"), "ok served");
    assert_eq!(listen(&open, "127.0.0.1:8001"), "denied EACCES");
    // With an allow rule, the proxy's own ports are open to connect, and nothing else.
    let r = probe(
        &["--json", "-", "--allow-net", "example.org"],
        &["connect", "127.0.0.1:9"],
    );
    assert_eq!(r.probe("connect 127.0.0.1:9"), "denied EACCES");
    let j = r.report();
    let detail = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "landlock")
        .unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(detail.contains("1080, 3128"), "{detail}");
}

#[test]
fn allow_local_port_is_checked() {
    for (bad, why) in [
        ("0", "from 1 to 65535"),
        ("70000", "not in 0..=65535"),
        ("x", "invalid digit"),
    ] {
        let r = run(&["--allow-local-port", bad], &["true"]);
        assert_eq!(r.code, 125, "{bad}: {}", r.stderr);
        assert!(r.stderr.contains("allow-local-port"), "{bad}: {}", r.stderr);
        assert!(r.stderr.contains(why), "{bad}: {}", r.stderr);
    }
}

#[test]
fn a_double_forked_daemon_does_not_survive_the_run() {
    let marker = unique("palisade-daemon-marker");
    let r = run(
        &[],
        &[
            "/bin/sh",
            "-c",
            &format!("/probe daemon {marker}; /probe pids"),
        ],
    );
    assert_eq!(r.probe("daemon"), "ok");
    let n = r.probe("pids").split(',').count();
    assert!(
        n >= 4,
        "the daemon was not running during the run: {}",
        r.stdout
    );
    assert_eq!(
        host_pids_with(&marker),
        Vec::<u32>::new(),
        "the daemon outlived the run"
    );
}

#[test]
fn sigkill_of_the_supervisor_kills_the_payload() {
    let marker = unique("palisade-orphan-marker");
    // The payload's own command line (the supervisor's and init's start with palisade's path).
    let payload = format!("/probe\0linger\0{marker}");
    let mut child = command(&[], &["/probe", "linger", &marker])
        .spawn()
        .unwrap();
    // Each wait below ends as soon as its condition holds, and gives up after a minute (a slow
    // host, an emulated guest, may take seconds to start or reap a sandbox).
    let t0 = std::time::Instant::now();
    let mut pids = Vec::new();
    while t0.elapsed() < std::time::Duration::from_secs(60) {
        pids = host_pids_starting(&payload);
        if !pids.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(!pids.is_empty(), "the payload never started");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(60) {
        if host_pids_starting(&payload).is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!(
        "the payload survived its supervisor: {:?}",
        host_pids_starting(&payload)
    );
}

#[test]
fn inherited_descriptors_do_not_cross() {
    let d = TempDir::new("fd");
    let secret = d.path().join("open-secret");
    std::fs::write(&secret, "x").unwrap();
    let f = std::fs::File::open(&secret).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: clearing FD_CLOEXEC on a descriptor this test owns, so the child inherits it.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let r = probe(&[], &["fds"]);
    let fds = r.probe("fds");
    let nums: Vec<&str> = fds
        .trim_start_matches("ok ")
        .split(',')
        .map(|e| e.split("->").next().unwrap())
        .collect();
    assert_eq!(
        nums,
        ["0", "1", "2"],
        "descriptors inside: {fds} (the test's open fd was {fd})"
    );
    assert!(!fds.contains("open-secret"));
    drop(f);
}

#[test]
fn tiocsti_cannot_inject_into_the_callers_terminal() {
    let mut master = 0;
    let mut slave = 0;
    // SAFETY: openpty fills two descriptors we then own.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty failed: a pty is needed for this test");
    let spawn_on_pty = |mut c: std::process::Command| -> Run {
        use std::os::unix::process::CommandExt;
        // SAFETY: the stdio descriptor is a dup of our pty slave.
        let s: std::os::fd::OwnedFd =
            unsafe { std::os::fd::FromRawFd::from_raw_fd(libc::dup(slave)) };
        c.stdin(std::process::Stdio::from(s));
        // SAFETY: setsid and TIOCSCTTY are async-signal-safe; they make the pty the child's
        // controlling terminal, as a user's shell would have it.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
        }
        c.output().unwrap().into()
    };
    // Control: without palisade, the probe on this terminal can inject (proves the test can fail).
    let mut direct = std::process::Command::new(probe_bin());
    direct.arg("tiocsti");
    let control = spawn_on_pty(direct);
    let mut c = std::process::Command::new(palisade_bin());
    c.args([
        "run",
        "-q",
        "--no-tty",
        "--ro",
        &format!("{}:/probe", probe_bin().display()),
        "--",
        "/probe",
        "tiocsti",
    ]);
    let sandboxed = spawn_on_pty(c);
    // SAFETY: closing descriptors we own.
    unsafe {
        libc::close(master);
        libc::close(slave);
    }
    let legacy = std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
        .map(|s| s.trim() == "1")
        .unwrap_or(true);
    if legacy {
        assert_eq!(
            control.probe("tiocsti"),
            "ok",
            "control: TIOCSTI should work outside the sandbox"
        );
    } else {
        eprintln!(
            "note: dev.tty.legacy_tiocsti=0 on this host; the kernel refuses TIOCSTI everywhere"
        );
    }
    assert_eq!(
        sandboxed.probe("tiocsti"),
        "denied EPERM",
        "{}",
        sandboxed.stderr
    );
}

/// With `--tty` the payload's terminal is a pty of the sandbox's own devpts instance: the caller's
/// terminal and the host's other ptys are not in its `/dev/pts`, and its pty is not on the host's.
#[test]
fn tty_mode_gives_a_private_pty() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    // The caller's terminal: a pty of the host's devpts, palisade's stdin and controlling
    // terminal, as in a user's shell. Ptys are opened until one is not pts/0, all held to the
    // end: devpts numbers from the lowest free, so the host's pts/0 is taken meanwhile, and a pty
    // the sandbox got from the host's devpts could not be /dev/pts/0.
    let mut held: Vec<(OwnedFd, OwnedFd)> = Vec::new();
    let caller_n = loop {
        let (mut m, mut s) = (0, 0);
        // SAFETY: openpty fills two descriptors, which nothing else owns.
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty failed: a pty is needed for this test");
        // SAFETY: both were just opened by openpty; these are their only owners.
        let pair = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        let name = std::fs::read_link(format!("/proc/self/fd/{}", pair.1.as_raw_fd())).unwrap();
        let n: u32 = name
            .to_str()
            .and_then(|p| p.strip_prefix("/dev/pts/"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the host's pty is {}, not in /dev/pts", name.display()));
        held.push(pair);
        if n != 0 {
            break n;
        }
    };
    let caller = &held.last().unwrap().1;
    let caller_dev = std::fs::File::from(caller.try_clone().unwrap())
        .metadata()
        .unwrap()
        .dev();
    let script = |probe: &str| {
        format!(
            "{probe} isatty; echo \"pts: $(ls -A /dev/pts | tr '\\n' ' ')\"; \
             echo \"dev: $(stat -c %d /dev/pts/0) $(stat -c %d /dev/pts)\"; \
             if [ -e /dev/pts/{caller_n} ]; then echo caller: there; else echo caller: absent; fi"
        )
    };
    let on_the_callers_terminal = |mut c: std::process::Command| -> Run {
        c.stdin(std::process::Stdio::from(caller.try_clone().unwrap()));
        // SAFETY: setsid and TIOCSCTTY are async-signal-safe; they make the pty the child's
        // controlling terminal.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
        }
        c.output().unwrap().into()
    };
    // What a payload prints on a pty ends its lines with CR LF.
    let said = |r: &Run, prefix: &str| -> String {
        r.stdout
            .lines()
            .find_map(|l| l.trim_end_matches('\r').strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no `{prefix}` line\nstdout:\n{}\nstderr:\n{}",
                    r.stdout, r.stderr
                )
            })
            .trim()
            .to_owned()
    };
    // Control, without palisade: the same script on the caller's terminal sees it, finds it in
    // /dev/pts, and /dev/pts on its device (proves the checks below can fail).
    let mut direct = std::process::Command::new("/bin/sh");
    direct.args(["-c", &script(&probe_bin().display().to_string())]);
    let control = on_the_callers_terminal(direct);
    assert_eq!(
        said(&control, "probe isatty: "),
        format!("ok /dev/pts/{caller_n}")
    );
    assert_eq!(said(&control, "caller: "), "there");
    let control_dev = said(&control, "dev: ");
    assert_eq!(
        control_dev.split(' ').next_back(),
        Some(caller_dev.to_string().as_str()),
        "control: /dev/pts on the host is the caller's terminal's devpts ({control_dev})"
    );

    let r = on_the_callers_terminal(command(&["--tty"], &["/bin/sh", "-c", &script("/probe")]));
    assert_eq!(said(&r, "probe isatty: "), "ok /dev/pts/0", "{}", r.stderr);
    assert_eq!(
        said(&r, "pts: "),
        "0 ptmx",
        "the sandbox's /dev/pts holds its own pty only, none of the host's (the caller's is pts/{caller_n})"
    );
    let dev = said(&r, "dev: ");
    let devs: Vec<u64> = dev
        .split(' ')
        .map(|d| {
            d.parse()
                .unwrap_or_else(|_| panic!("dev: {dev}\n{}", r.stderr))
        })
        .collect();
    assert_eq!(devs.len(), 2, "dev: {dev}");
    assert_eq!(
        devs[0], devs[1],
        "the pty is on the sandbox's devpts instance ({dev})"
    );
    assert_ne!(
        devs[1], caller_dev,
        "the sandbox's devpts is the host's, where the caller's terminal is"
    );
    assert_eq!(
        said(&r, "caller: "),
        "absent",
        "the caller's terminal, pts/{caller_n} of the host, is in the sandbox's /dev/pts"
    );
    drop(held);
}

#[test]
fn binds_are_read_only_or_writable_as_asked() {
    let ro = TempDir::new("ro");
    std::fs::write(ro.path().join("data.txt"), "DATA").unwrap();
    let rw = TempDir::new("rw");
    let r = run(
        &[
            "--ro",
            &format!("{}:/data", ro.s()),
            "--rw",
            &format!("{}:/out", rw.s()),
        ],
        &[
            "/bin/sh",
            "-c",
            "/probe read /data/data.txt; /probe write /data/new; /probe write /out/new",
        ],
    );
    assert!(r.probe("read /data/data.txt").contains("DATA"));
    assert_eq!(r.probe("write /data/new"), "denied EROFS");
    assert_eq!(r.probe("write /out/new"), "ok");
    assert_eq!(
        std::fs::metadata(rw.path().join("new")).unwrap().uid(),
        euid()
    );
}

/// A file under a directory the view already mirrors (a tool under `/opt` or `/usr`) can be bound
/// on its own: its mount point exists and belongs to host root, whom the sandbox cannot write as.
/// The guest matrix found this with the probe under `/opt`.
#[test]
fn a_file_under_a_mirrored_system_directory_can_be_bound() {
    let r = run(
        &["--ro", "/usr/bin/env"],
        &["/usr/bin/env", "/bin/sh", "-c", "echo BOUND"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("BOUND"), "{} {}", r.stdout, r.stderr);
}

#[test]
fn a_bind_source_that_is_a_symlink_is_resolved_once_by_the_supervisor() {
    let d = TempDir::new("link");
    std::fs::create_dir(d.path().join("real")).unwrap();
    std::fs::write(d.path().join("real/f"), "REAL").unwrap();
    std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).unwrap();
    let r = run(
        &[
            "--ro",
            &format!("{}:/data", d.path().join("link").display()),
        ],
        &["/probe", "read", "/data/f"],
    );
    assert!(r.probe("read /data/f").contains("REAL"));
}

/// A shell pipeline, scripts, renames across directories, named pipes, truncation, python3
/// reading its standard library and SQLite in scratch: everything an ordinary payload does still
/// works with Landlock on; only what the rules leave out is refused.
#[test]
fn landlock_leaves_an_ordinary_workload_working() {
    let script = r#"set -e
echo 'hello world' | tr a-z A-Z | tee /workspace/a.txt > /dev/null
sort /workspace/a.txt | cat - /workspace/a.txt > /tmp/b.txt
mkdir -p /tmp/d/e /workspace/sub
mv /tmp/b.txt /tmp/d/e/b.txt
ln -s /tmp/d/e/b.txt /workspace/sub/link
echo "lines $(wc -l < /workspace/sub/link)"
: > /tmp/d/e/b.txt
mkfifo /tmp/fifo
rm -r /tmp/d /tmp/fifo
printf '#!/bin/sh\necho script-ran\n' > /workspace/s.sh
chmod +x /workspace/s.sh
/workspace/s.sh
echo discarded > /dev/null
echo discarded >> /dev/null
echo "zero $(head -c 4 /dev/zero | wc -c) urandom $(head -c 4 /dev/urandom | wc -c)"
echo shm > /dev/shm/x && cat /dev/shm/x
echo "root lists $(ls / | grep -c '^workspace$')"
python3 -c '
import json, os, sqlite3, tempfile
src = open(json.__file__).read()
names = os.listdir(os.path.dirname(json.__file__))
with tempfile.NamedTemporaryFile(dir="/tmp") as f:
    f.write(b"x"); f.flush()
db = sqlite3.connect("/workspace/t.db"); db.execute("create table t(x)"); db.commit()
print("python", len(src) > 1000, "__init__.py" in names)
'
/probe write /dev/palisade-x
echo workload-done
"#;
    let r = run(&[], &["/bin/sh", "-c", script]);
    assert_eq!(r.code, 0, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    for want in [
        "lines 2",
        "script-ran",
        "zero 4 urandom 4",
        "shm",
        "root lists 1",
        "python True True",
        "workload-done",
    ] {
        assert!(
            r.stdout.lines().any(|l| l == want),
            "missing `{want}`:\n{}\n{}",
            r.stdout,
            r.stderr
        );
    }
    // /dev's own tmpfs is writable as a mount; Landlock keeps it read-only.
    assert_eq!(r.probe("write /dev/palisade-x"), "denied EACCES");

    // With a terminal: /dev/tty and the pty reopened by name, and a terminal ioctl on a device
    // opened after the restriction (Landlock's IOCTL_DEV right).
    let r = run(
        &["--tty"],
        &[
            "/bin/sh",
            "-c",
            "set -e; echo to-tty > /dev/tty; stty size < /dev/tty; echo via-pts > $(tty); echo tty-done",
        ],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for want in ["to-tty", "via-pts", "tty-done"] {
        assert!(r.stdout.contains(want), "missing `{want}`: {:?}", r.stdout);
    }
}

/// The library, because the test-only policy field is not reachable from the CLI.
fn run_policy(command: &str, binds: Vec<Bind>, unlandlocked: Option<Bind>) -> (Run, Report) {
    let mut p = Policy::new(["/bin/sh", "-c", command]).unwrap();
    p.binds = binds;
    p.binds
        .push(Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap());
    p.debug_unlandlocked_bind = unlandlocked;
    let out = Sandbox::from_policy(p).unwrap().output();
    let r = Run {
        code: out.report.exit_code_for_cli(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (r, out.report)
}

/// A host directory that a wrong mount view exposes (in the view, writable, with no Landlock
/// rule) can be neither read nor written; the same directory bound with `--rw` can.
#[test]
fn landlock_refuses_what_a_wrong_mount_view_would_expose() {
    let d = TempDir::new("unlandlocked");
    std::fs::write(d.path().join("secret.txt"), "LANDLOCK-CANARY").unwrap();
    let spec = format!("{}:/exposed", d.s());
    let cmd = "/probe read /exposed/secret.txt; /probe write /exposed/new.txt";

    // Control: a normal --rw bind of the same directory.
    let (r, _) = run_policy(cmd, vec![Bind::parse(&spec, true).unwrap()], None);
    let got = r.probe("read /exposed/secret.txt");
    assert!(
        got.starts_with("ok") && got.contains("LANDLOCK-CANARY"),
        "control: {got}"
    );
    assert_eq!(
        r.probe("write /exposed/new.txt"),
        "ok",
        "control: {}",
        r.stderr
    );
    std::fs::remove_file(d.path().join("new.txt")).expect("the control's write is on the host");

    // The same directory mounted the same way, without its rule: present (not `absent`), but
    // refused by Landlock.
    let (r, report) = run_policy(cmd, vec![], Some(Bind::parse(&spec, true).unwrap()));
    assert_eq!(
        r.probe("read /exposed/secret.txt"),
        "denied EACCES",
        "{}",
        r.stderr
    );
    assert_eq!(r.probe("write /exposed/new.txt"), "denied EACCES");
    assert!(!r.stdout.contains("LANDLOCK-CANARY"));
    assert!(
        !d.path().join("new.txt").exists(),
        "the write reached the host"
    );
    let layer = report.layers.iter().find(|l| l.name == "landlock").unwrap();
    assert!(
        layer.enforced && layer.detail.contains("DEBUG: /exposed"),
        "the report must name the path without a rule: {layer:?}"
    );
}

#[test]
fn the_report_says_landlock_is_enforced_with_its_abi() {
    let r = run(&["--json", "-"], &["true"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j = r.report();
    let abi = j["landlock_abi"]
        .as_u64()
        .expect("landlock_abi in the report");
    assert!(abi >= 1, "{j}");
    let layer = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "landlock")
        .expect("a landlock layer");
    assert_eq!(layer["enforced"], true, "{layer}");
    let detail = layer["detail"].as_str().unwrap();
    assert!(detail.starts_with(&format!("ABI {abi}: ")), "{detail}");
    assert!(
        detail.contains("read-file") && detail.contains("write-file"),
        "{detail}"
    );
}

/// Two refusals that only Landlock makes, seen from inside: writing the payload's own
/// `/proc/self/oom_score_adj` (outside `/proc/sys`, so the mount view leaves it writable; raising
/// it needs no privilege, as the control outside shows), and signalling init, which has the
/// payload's uid but is outside its Landlock domain (signal scoping, ABI 6 and later).
#[test]
fn landlock_alone_refuses_proc_writes_and_signals_to_init() {
    let script =
        "echo 500 > /proc/self/oom_score_adj && echo proc-write-ok || echo proc-write-denied; \
                  kill -0 1 2>/dev/null && echo signal-ok || echo signal-denied";
    let control = std::process::Command::new("/bin/sh")
        .args(["-c", script])
        .output()
        .unwrap();
    let control = String::from_utf8_lossy(&control.stdout).into_owned();
    assert!(control.contains("proc-write-ok"), "control: {control}");
    let r = run(&["--json", "-"], &["/bin/sh", "-c", script]);
    assert!(r.stdout.contains("proc-write-denied"), "{}", r.stdout);
    let j = r.report();
    if j["landlock_abi"].as_u64().unwrap() >= 6 {
        assert!(r.stdout.contains("signal-denied"), "{}", r.stdout);
    }
}

/// An ordinary build-and-commit workload still works under every wall at once (Landlock, seccomp,
/// the mount view, the limits), and the filter refuses nothing it does: a C compiler run, git in
/// scratch, python3 with threads and subprocesses.
#[test]
fn compilers_git_and_python_threads_work_and_trip_nothing() {
    let script = r#"set -e
cd /workspace
printf '#include <stdio.h>\nint main(void){puts("compiled-ok");return 0;}\n' > t.c
cc -O2 -o t t.c && ./t
git init -q repo && cd repo
git config user.email t@example.invalid && git config user.name t
echo x > f && git add f && git commit -qm first && echo y >> f && git commit -qam second
echo "git-commits=$(git rev-list --count HEAD)"
python3 -c '
import subprocess, threading
out = []
ts = [threading.Thread(target=lambda: out.append(subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("python-threads-ok" if out == ["sub"] * 4 else out)
'
"#;
    for tool in ["cc", "git", "python3"] {
        assert!(
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .status()
                .unwrap()
                .success(),
            "{tool} is missing on this host: run .ci/setup"
        );
    }
    let r = run(&["--json", "-"], &["/bin/sh", "-c", script]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for want in ["compiled-ok", "git-commits=2", "python-threads-ok"] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    let j = r.report();
    assert_eq!(j["denied_syscalls"], serde_json::json!([]), "{j}");
}

/// `RLIMIT_CORE` stays at 1 whatever the payload does (audit F8): at 0, the kernel would pipe a
/// crash to the host's `core_pattern` helper, as root. `setrlimit` and `prlimit64` of it return 0
/// and change nothing; one that also reads the old limit is refused and reported. Outside, the
/// same probe lowers it to 0, so the test can fail.
#[test]
fn the_core_limit_stays_at_one_whatever_the_payload_does() {
    let control: Run = std::process::Command::new(probe_bin())
        .arg("core-limit")
        .output()
        .unwrap()
        .into();
    assert_eq!(control.probe("core-limit setrlimit"), "ok");
    assert_eq!(control.probe("core-limit prlimit64-with-old"), "ok");
    assert_eq!(control.probe("core-limit now"), "ok soft=0 hard=0");
    let r = probe(&["--json", "-"], &["core-limit"]);
    assert_eq!(r.probe("core-limit setrlimit"), "ok", "{}", r.stderr);
    assert_eq!(r.probe("core-limit prlimit64"), "ok");
    assert_eq!(r.probe("core-limit prlimit64-with-old"), "denied EPERM");
    assert_eq!(r.probe("core-limit now"), "ok soft=1 hard=1");
    let j = r.report();
    let denied = j["denied_syscalls"].as_array().expect("denied_syscalls");
    let names: Vec<&str> = denied.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, ["prlimit64 RLIMIT_CORE"], "{denied:?}");
    assert_eq!(denied[0]["errno"], "EPERM");
    let layer = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "core-dumps")
        .expect("a core-dumps layer");
    assert_eq!(layer["enforced"], true, "{layer}");
    // Scripts that turn core dumps off keep working.
    let r = run(
        &[],
        &["/bin/sh", "-c", "ulimit -c 0 && ulimit -c && echo lowered"],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "0\nlowered\n"),
        "{}",
        r.stderr
    );
}

/// Whether the running kernel is at least `major.minor`, from uname's release.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}
