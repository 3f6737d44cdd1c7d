//! The engines (docs/engine.md), attacked from inside: a sandbox started by palisade's exec'd init
//! program holds nothing of its caller, and one started by a template's zygote is as isolated as
//! a cold one and from every other run of the template. Run as root and as an unprivileged user.
//!
//! The init program is the real `palisade` binary (`PALISADE_BIN`, or the one cargo built); the
//! probe is bound in at `/probe`.

mod common;
#[path = "common/testnet.rs"]
mod testnet;
use common::*;
use common::{probe_sh as policy, probe_template as template};
use palisade::policy::{Bind, Policy};
use palisade::{Engine, Io, Report, Sandbox, Status, Template};

/// The value of `field` (in kB) in a `/proc/PID/status` text.
fn status_kb(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in:\n{status}"))
}

/// The sandbox's init (pid 1 inside) maps none of the caller's memory when palisade's init
/// program is exec'd; the in-process engine's does (the control, which shows that the measure
/// sees a copied image). The caller holds 256 MiB it has touched; the payload reads its init's
/// resident anonymous memory from `/proc/1/status`.
#[test]
fn the_exec_engines_init_holds_none_of_the_callers_memory() {
    let _one = serial();
    let mut heap = vec![0u8; 256 << 20];
    for i in (0..heap.len()).step_by(4096) {
        heap[i] = 1;
    }
    let sandbox = Sandbox::from_policy(policy("cat /proc/1/status; cat /proc/1/cmdline")).unwrap();
    let exec = sandbox.clone().engine(exec_engine()).output();
    let inproc = sandbox.engine(Engine::InProcess).output();
    std::hint::black_box(&heap);
    for (o, name) in [(&exec, "exec"), (&inproc, "in-process")] {
        assert_eq!(o.report.status, Status::Ok, "{name}: {:?}", o.report);
        assert_eq!(o.report.engine, Some(name));
    }
    let exec_out = String::from_utf8_lossy(&exec.stdout);
    let inproc_out = String::from_utf8_lossy(&inproc.stdout);
    let (e, i) = (
        status_kb(&exec_out, "RssAnon:"),
        status_kb(&inproc_out, "RssAnon:"),
    );
    assert!(
        e < 64 << 10,
        "the exec'd init holds {e} kB of anonymous memory"
    );
    assert!(
        i >= 200 << 10,
        "control: the in-process init should show the caller's 256 MiB, shows {i} kB"
    );
    // And it is palisade's init program, not a copy of this test.
    assert!(exec_out.contains("palisade-init"), "{exec_out}");
}

/// An init program that cannot be used fails the run as palisade's own error, naming the
/// program; the payload never runs.
#[test]
fn an_init_program_that_cannot_be_used_is_a_sandbox_error() {
    let _one = serial();
    let d = TempDir::new("init");
    let marker = d.path().join("ran");
    let script = format!("touch {}", marker.display());
    let missing = d.path().join("no-such-palisade");
    let out = Sandbox::from_policy(policy(&script))
        .unwrap()
        .engine(Engine::InitProgram(missing.clone()))
        .output();
    assert_eq!(out.report.status, Status::SandboxError);
    let err = out.report.error.clone().unwrap_or_default();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    // A program that is not palisade (it exits without reading its plan): the run fails, the
    // payload never starts.
    let out = Sandbox::from_policy(policy(&script))
        .unwrap()
        .engine(Engine::InitProgram("/bin/true".into()))
        .output();
    assert_eq!(out.report.status, Status::SandboxError, "{:?}", out.report);
    assert_eq!(out.report.engine, Some("exec"));
    assert!(!marker.exists());
}

// ---- Templates ----

/// A template of the default policy.
fn default_template() -> Template {
    template(Policy::new(["true"]).unwrap())
}

/// Runs a shell script in a run of a template: `trun` (a template run) or `wrun` (a warm
/// Python run that execs the shell).
type Runner = fn(&Template, &str, &[(&str, &str)]) -> (Run, Report);

/// Runs `sh -c script` from `t`; the result as the boundary tests read it, and the report.
fn trun(t: &Template, script: &str, env: &[(&str, &str)]) -> (Run, Report) {
    let out = t
        .start(["/bin/sh", "-c", script], env, Io::default())
        .wait_output();
    assert_eq!(out.report.engine, Some("template"), "{:?}", out.report);
    let r = Run {
        code: out.report.exit_code_for_cli(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (r, out.report)
}

/// The boundary tests' attacks (boundary.rs), from sandboxes a template made: the same walls
/// hold, and the report names the same layers as a cold run's.
#[test]
fn template_runs_hold_the_boundary() {
    let _one = serial();
    boundary_attacks(&default_template(), trun);
}

/// The same attacks from warm Python runs: the payload is a fork of the zygote's interpreter,
/// which execs the shell (so the attacks run in what a warm run's boundary leaves).
#[test]
fn warm_runs_hold_the_boundary() {
    let _one = serial();
    boundary_attacks(&warm_template(Policy::new(["true"]).unwrap()), wrun);
}

fn boundary_attacks(t: &Template, trun: Runner) {
    // Files of the invoking user and of the host.
    let home = home_dir();
    let canary = home.join(format!(".palisade-canary-{}", unique("t")));
    std::fs::write(&canary, "CANARY-SECRET").expect("a canary in the test user's home");
    let (r, _) = trun(t, &format!("/probe read {}", canary.display()), &[]);
    let _ = std::fs::remove_file(&canary);
    assert_eq!(r.probe(&format!("read {}", canary.display())), "absent");
    let (r, _) = trun(
        t,
        "/probe read /etc/shadow; /probe read /etc/machine-id; /probe read /etc/passwd",
        &[],
    );
    assert_eq!(r.probe("read /etc/shadow"), "absent");
    assert_eq!(r.probe("read /etc/machine-id"), "absent");
    assert!(!r.probe("read /etc/passwd").contains("palisade-test:x"));
    // Writes outside the scratch directory.
    let paths = [
        "/usr/palisade-x",
        "/etc/palisade-x",
        "/palisade-x",
        "/bin/palisade-x",
        "/dev/palisade-x",
        "/proc/sys/kernel/hostname",
    ];
    let script: Vec<String> = paths.iter().map(|p| format!("/probe write {p}")).collect();
    let (r, _) = trun(t, &script.join("; "), &[]);
    for p in paths {
        let got = r.probe(&format!("write {p}"));
        assert!(
            got.starts_with("denied"),
            "write to {p} was not refused: {got}"
        );
    }
    let (r, _) = trun(
        t,
        "/probe write /workspace/x; /probe write /tmp/x; /probe write /dev/shm/x",
        &[],
    );
    for p in ["/workspace/x", "/tmp/x", "/dev/shm/x"] {
        assert_eq!(r.probe(&format!("write {p}")), "ok", "{}", r.stdout);
    }
    // No capability, no privilege, the filter installed.
    let (r, rep) = trun(t, "/probe caps; /probe whoami", &[]);
    let caps = r.probe("caps");
    for want in [
        "CapEff=0000000000000000",
        "CapPrm=0000000000000000",
        "CapBnd=0000000000000000",
        "CapAmb=0000000000000000",
        "NoNewPrivs=1",
        "Seccomp=2",
    ] {
        assert!(caps.contains(want), "{caps}");
    }
    assert_ne!(rep.host_uid, Some(0));
    // The environment: built from scratch, the init's unreadable.
    let (r, _) = trun(t, "/probe env; /probe read /proc/1/environ", &[]);
    assert!(
        r.stdout.contains("probe env: HOME=/workspace"),
        "{}",
        r.stdout
    );
    let init_env = r.probe("read /proc/1/environ");
    assert!(
        init_env.starts_with("denied") || init_env == "ok 0 bytes ",
        "{init_env}"
    );
    for l in r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("probe env: "))
    {
        let n = l.split('=').next().unwrap();
        assert!(
            ["PATH", "HOME", "LANG", "PWD", "SHLVL", "_"].contains(&n),
            "unexpected variable {l}"
        );
    }
    // Processes: only the sandbox's own; a host process cannot be signalled.
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let vp = victim.id();
    let (r, _) = trun(t, &format!("/probe pids; /probe kill {vp}"), &[]);
    let pids: Vec<u32> = r
        .probe("pids")
        .trim_start_matches("ok ")
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        pids.contains(&1) && pids.len() <= 4,
        "pids inside: {pids:?}"
    );
    assert_eq!(r.probe(&format!("kill {vp}")), "denied ESRCH");
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process was killed"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
    // The host's cgroup tree is hidden.
    let (r, _) = trun(t, "/probe read /proc/self/cgroup", &[]);
    let cg = r.probe("read /proc/self/cgroup");
    assert!(!cg.contains("palisade") && !cg.contains(".."), "{cg}");
    // The run's own user namespace has its own ceilings: no nested namespace of any kind, few
    // inotify instances.
    let (r, _) = trun(
        t,
        "cd /proc/sys/user && cat max_user_namespaces max_net_namespaces max_pid_namespaces max_inotify_instances max_fanotify_groups",
        &[],
    );
    assert_eq!(r.stdout, "0\n0\n0\n32\n0\n", "{}", r.stderr);
    // The filter refuses the risky calls, and nested namespaces.
    let (r, _) = trun(t, "/probe syscalls; /probe unshare-user", &[]);
    for what in [
        "sys io_uring_setup",
        "sys bpf",
        "sys userfaultfd",
        "sys keyctl",
        "sys process_vm_readv",
        "sys unshare-user",
        "sys clone-newnet",
        "sys ptrace-traceme",
        "sys open_tree_attr",
        "sys fanotify_init",
        "sys memfd_secret",
        "sys io_setup",
    ] {
        assert_eq!(r.probe(what), "denied EPERM", "{what}\n{}", r.stdout);
    }
    assert_eq!(r.probe("sys socket-netlink"), "denied EAFNOSUPPORT");
    assert!(r.probe("unshare-user").starts_with("denied"));
    // The host's loopback and its abstract unix sockets.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::net::TcpStream::connect(addr).expect("control: the host listener accepts");
    use std::os::linux::net::SocketAddrExt;
    let name = unique("palisade-abstract");
    let ua = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let ul = std::os::unix::net::UnixListener::bind_addr(&ua).unwrap();
    ul.set_nonblocking(true).unwrap();
    drop(std::os::unix::net::UnixStream::connect_addr(&ua).expect("control connect"));
    ul.accept().expect("the control connection");
    let (r, _) = trun(
        t,
        &format!("/probe connect {addr}; /probe unix-abstract {name}"),
        &[],
    );
    assert!(
        r.probe(&format!("connect {addr}")).starts_with("denied"),
        "{}",
        r.stdout
    );
    assert_eq!(
        r.probe(&format!("unix-abstract {name}")),
        "denied ECONNREFUSED"
    );
    assert!(ul.accept().is_err(), "a connection from inside arrived");
    // Descriptors: 0, 1, 2 only, whatever this process holds.
    let (r, _) = trun(t, "/probe fds", &[]);
    let fds = r.probe("fds");
    let nums: Vec<&str> = fds
        .trim_start_matches("ok ")
        .split(',')
        .map(|e| e.split("->").next().unwrap())
        .collect();
    assert_eq!(nums, ["0", "1", "2"], "{fds}");
    // Exit codes and signals pass through.
    for code in [0, 1, 42] {
        let (r, _) = trun(t, &format!("exit {code}"), &[]);
        assert_eq!(r.code, code);
    }
    let (_, rep) = trun(t, "exec /probe segv", &[]);
    assert_eq!((rep.status, rep.signal), (Status::Signal, Some(11)));
    // A daemon does not outlive its run.
    let marker = unique("palisade-daemon-marker");
    let (r, _) = trun(t, &format!("/probe daemon {marker}; /probe pids"), &[]);
    assert_eq!(r.probe("daemon"), "ok");
    assert!(r.probe("pids").split(',').count() >= 4, "{}", r.stdout);
    assert_eq!(
        host_pids_with(&marker),
        Vec::<u32>::new(),
        "the daemon outlived the run"
    );
    // The report: the same layers, each as enforced as in a cold run.
    let (_, rep) = trun(t, "true", &[]);
    let cold = Sandbox::from_policy(policy("true"))
        .unwrap()
        .engine(Engine::InProcess)
        .output()
        .report;
    let layers = |r: &Report| {
        r.layers
            .iter()
            .map(|l| (l.name, l.enforced))
            .collect::<Vec<_>>()
    };
    assert_eq!(layers(&rep), layers(&cold));
    assert_eq!(rep.landlock_abi, cold.landlock_abi);
    assert_eq!(
        (rep.uid, rep.host_uid.map(|u| u != 0)),
        (cold.uid, Some(true))
    );
}

/// What run N leaves is not visible to run N+1 of the same template: a file in each writable
/// place, a SysV shared-memory segment, a daemon, its environment. (Listening sockets die with
/// their processes; the runs at the same time below show that another run's cannot be reached.)
#[test]
fn nothing_of_one_run_is_visible_to_the_next() {
    let _one = serial();
    left_behind(&default_template(), trun);
    left_behind(&warm_template(Policy::new(["true"]).unwrap()), wrun);
}

fn left_behind(t: &Template, trun: Runner) {
    let marker = unique("palisade-left-behind");
    let (r, rep) = trun(
        t,
        &format!(
            "for d in /tmp /dev/shm /workspace; do /probe write $d/left-{marker}; done; /probe sysv-shm 1; cat /proc/sysvipc/shm | wc -l; /probe daemon {marker}; echo \"secret=$RUN_SECRET\""
        ),
        &[("RUN_SECRET", "sx-1")],
    );
    assert_eq!(rep.status, Status::Ok, "{rep:?}");
    for d in ["/tmp", "/dev/shm", "/workspace"] {
        assert_eq!(r.probe(&format!("write {d}/left-{marker}")), "ok");
    }
    assert_eq!(r.probe("sysv-shm 1"), "ok 1 MiB");
    assert!(
        r.stdout.contains("\n2\n"),
        "control: the segment exists in run N: {}",
        r.stdout
    );
    assert!(r.stdout.contains("secret=sx-1"));
    let (r, rep) = trun(
        t,
        &format!(
            "for d in /tmp /dev/shm /workspace; do /probe read $d/left-{marker}; done; cat /proc/sysvipc/shm | wc -l; /probe pids; echo \"secret=$RUN_SECRET\""
        ),
        &[],
    );
    assert_eq!(rep.status, Status::Ok, "{rep:?}");
    for d in ["/tmp", "/dev/shm", "/workspace"] {
        assert_eq!(
            r.probe(&format!("read {d}/left-{marker}")),
            "absent",
            "{}",
            r.stdout
        );
    }
    assert!(
        r.stdout.contains("\n1\n"),
        "run N's SysV segment is visible: {}",
        r.stdout
    );
    assert!(r.stdout.contains("secret=\n"), "{}", r.stdout);
    assert!(r.probe("pids").split(',').count() <= 4, "{}", r.stdout);
    assert_eq!(
        host_pids_with(&marker),
        Vec::<u32>::new(),
        "run N's daemon is alive"
    );
}

/// A template without egress keeps the network namespace of a run that made no socket for a
/// later run (docs/engine.md, "The network namespace"), and never one a run made a socket in: a
/// socket that only tried an abstract unix name (no packet, nothing left once closed; only the
/// filter saw it) and a name lookup that sent packets over `lo` (which the next run would read in
/// its counters) each send the next run to a namespace of its own, with `lo` untouched. The first
/// pair is the control that the namespace is handed on at all.
#[test]
fn a_network_namespace_goes_to_a_later_run_only_if_no_socket_was_made() {
    let _one = serial();
    a_later_runs_network(&default_template(), trun);
    a_later_runs_network(&warm_template(Policy::new(["true"]).unwrap()), wrun);
}

fn a_later_runs_network(t: &Template, trun: Runner) {
    // The namespace, and lo's packets received and sent (`/proc/net/dev`: the fields after the
    // name are rx bytes, packets, ...; the 9th and 10th are tx bytes and packets).
    let look =
        "readlink /proc/self/ns/net; awk '$1 == \"lo:\" { print \"lo\", $3, $11 }' /proc/net/dev";
    let seen = |t: &Template, before: &str| -> (String, String) {
        let (r, rep) = trun(t, &format!("{before}{look}"), &[]);
        assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
        let ns = r
            .stdout
            .lines()
            .find(|l| l.starts_with("net:["))
            .unwrap_or_else(|| panic!("no namespace in {}", r.stdout))
            .to_owned();
        let lo = r
            .stdout
            .lines()
            .find(|l| l.starts_with("lo "))
            .unwrap_or_else(|| panic!("no lo in {}", r.stdout))
            .to_owned();
        (ns, lo)
    };
    let (first, lo) = seen(t, "");
    assert_eq!(lo, "lo 0 0", "a fresh namespace has sent nothing");
    // A namespace given back comes to a later run: the next run's init was made (in a namespace
    // of its own) while this one ran, so it is the run after it, or one more per init kept ahead.
    let back = (0..LATER).any(|_| seen(t, "").0 == first);
    assert!(
        back,
        "control: a namespace no socket was made in is handed to a later run"
    );
    for (attack, what) in [
        (
            "/probe unix-abstract palisade-nobody-listens; ",
            "a socket that sent nothing",
        ),
        // A lookup: UDP to the DNS stub on 127.0.0.1:53 (TCP to any other port is refused by
        // Landlock before a packet leaves).
        ("getent hosts palisade-lookup.invalid; ", "packets over lo"),
    ] {
        let (dirty, lo) = seen(t, attack);
        if what == "packets over lo" {
            assert_ne!(lo, "lo 0 0", "control: the connect went over lo");
        }
        for _ in 0..LATER {
            let (next, lo) = seen(t, "");
            assert_ne!(
                dirty, next,
                "the namespace of a run with {what} was handed to a later run"
            );
            assert_eq!(lo, "lo 0 0", "after {what}: a later run's lo has traffic");
        }
    }
}

/// How many runs later a namespace given back unused is handed on at the latest (with one
/// init made ahead, two: see docs/engine.md, "Inits made ahead").
const LATER: usize = 3;

/// What a run could change in its network namespace without a socket: the attributes of the
/// namespace's own `/proc/net` entries (one set per namespace, shared by every procfs; owned by
/// root of T, onto which a root launch maps the run's root: the run owns them). The run's `/proc`
/// is read-only as a mount, so `chmod`, `chown` and new times are refused there, as root and
/// unprivileged, and the next run, which may get the same namespace, finds the entries as the
/// kernel made them (otherwise a channel between runs of about ten bits an entry, and a way to
/// refuse a later run its own `/proc/net`).
#[test]
fn a_run_cannot_change_its_network_namespaces_proc_net() {
    let _one = serial();
    proc_net_changed(&default_template(), trun);
    proc_net_changed(&warm_template(Policy::new(["true"]).unwrap()), wrun);
}

fn proc_net_changed(t: &Template, trun: Runner) {
    // The namespace, then the mode and modification time of its `dev` entry (neither makes a
    // socket).
    let look = "readlink /proc/self/ns/net; stat -c 'mode %a %Y' /proc/self/net/dev";
    let seen = |t: &Template, before: &str| -> (String, String, String) {
        let (r, rep) = trun(t, &format!("{before}{look}"), &[]);
        assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
        let line = |p: &str| {
            r.stdout
                .lines()
                .find(|l| l.starts_with(p))
                .unwrap_or_else(|| panic!("no {p} in {}", r.stdout))
                .to_owned()
        };
        (line("net:["), line("mode "), r.stdout.clone())
    };
    let (_, mode, _) = seen(t, "");
    assert!(
        mode.starts_with("mode 444 "),
        "as the kernel makes it: {mode}"
    );
    let (changer, after, out) = seen(
        t,
        "chmod 1000 /proc/self/net/dev || echo chmod-refused; touch -d @1000000 /proc/self/net/dev || echo touch-refused; chown +0:+0 /proc/self/net/dev || echo chown-refused; ",
    );
    for refused in ["chmod-refused", "touch-refused", "chown-refused"] {
        assert!(out.contains(refused), "{refused}: {out}");
    }
    assert_eq!(
        mode_of(&after),
        mode_of(&mode),
        "the run changed its /proc/net entry"
    );
    assert!(
        !after.ends_with(" 1000000"),
        "the run set its /proc/net entry's time: {after}"
    );
    // The later run that gets the changer's namespace (control: it is handed on).
    let seen_next = (0..LATER)
        .map(|_| seen(t, ""))
        .find(|(ns, ..)| *ns == changer)
        .map(|(_, m, _)| m)
        .expect("control: the namespace is handed on to a later run");
    assert_eq!(
        mode_of(&seen_next),
        mode_of(&mode),
        "the next run sees the entry changed"
    );
    assert!(
        !seen_next.ends_with(" 1000000"),
        "the next run sees the time set: {seen_next}"
    );
}

/// A run's own /proc is read-only as a mount itself: in a cold run it is the only mount there,
/// with no writable proc instance beneath a read-only one. A template's runs cover the
/// template's own (the procfs of a pid namespace that is gone, which the kernel needs to be
/// visible before a run may mount one; docs/engine.md) with theirs, read-only the same way.
#[test]
fn a_runs_proc_is_a_read_only_mount() {
    let _one = serial();
    // The options of every mount on /proc (mountinfo's fields 5 and 6), in mount order.
    let look = "awk '$5 == \"/proc\" { print \"proc-mount\", $6 }' /proc/self/mountinfo";
    let mounts = |out: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix("proc-mount "))
            .map(str::to_owned)
            .collect()
    };
    let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
    let cold = common::run(&[], &["/bin/sh", "-c", look]);
    assert_eq!(cold.code, 0, "{}", cold.stderr);
    let m = mounts(&cold.stdout);
    assert!(m.len() == 1 && ro(&m[0]), "cold run: {m:?}");
    let (r, rep) = trun(&default_template(), look, &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
    let t = mounts(&r.stdout);
    let (r, rep) = wrun(&warm_template(Policy::new(["true"]).unwrap()), look, &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
    let w = mounts(&r.stdout);
    for (what, m) in [("template run", t), ("warm run", w)] {
        assert!(m.len() == 2 && ro(&m[1]), "{what}: {m:?}");
    }
}

/// The mode of a `mode %a %Y` line. The time is not compared: procfs stamps an entry's inode with
/// the time it is made, and the kernel may drop and remake it between two runs.
fn mode_of(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or(line)
}

/// Two runs of one template at the same time: the one cannot reach the other's TCP listener, its
/// abstract unix socket, its processes, its files or its SysV segments, while the other shows
/// (a control) that they are there.
#[test]
fn runs_at_the_same_time_do_not_see_each_other() {
    let _one = serial();
    let mut p = Policy::new(["true"]).unwrap();
    p.network.local_ports.push(8123);
    at_the_same_time(&template(p.clone()), trun);
    // The holder, a `python3 -c`, is a warm run too here.
    at_the_same_time(&warm_template(p), wrun);
}

fn at_the_same_time(t: &Template, trun: Runner) {
    let name = unique("palisade-run-abstract");
    let holder = format!(
        r#"import os, socket, subprocess, sys, time
t = socket.socket(); t.bind(("127.0.0.1", 8123)); t.listen()
u = socket.socket(socket.AF_UNIX); u.bind("\0{name}"); u.listen()
open("/tmp/holder-file", "w").write("x")
subprocess.run(["/probe", "sysv-shm", "1"], check=True, stdout=subprocess.DEVNULL)
c = socket.create_connection(("127.0.0.1", 8123)); c.close()
v = socket.socket(socket.AF_UNIX); v.connect("\0{name}"); v.close()
print("ready", os.getpid(), flush=True)
time.sleep(60)
"#
    );
    let mut a = t.start(
        ["python3", "-c", &holder],
        &[],
        Io {
            stream_buffer: Some(1 << 16),
            ..Io::default()
        },
    );
    let mut seen = String::new();
    while !seen.contains("ready") {
        match a.recv_output(None) {
            palisade::Chunk::Data(_, d) => seen.push_str(&String::from_utf8_lossy(&d)),
            palisade::Chunk::Timeout => {}
            palisade::Chunk::End => panic!("the holder ended: {seen} {:?}", a.wait()),
        }
    }
    let (r, rep) = trun(
        t,
        &format!("/probe connect 127.0.0.1:8123; /probe unix-abstract {name}; /probe read /tmp/holder-file; cat /proc/sysvipc/shm | wc -l; /probe pids"),
        &[],
    );
    a.kill();
    let arep = a.wait();
    assert_eq!(rep.status, Status::Ok, "{rep:?}");
    assert_eq!(
        r.probe("connect 127.0.0.1:8123"),
        "denied ECONNREFUSED",
        "{}",
        r.stdout
    );
    assert_eq!(
        r.probe(&format!("unix-abstract {name}")),
        "denied ECONNREFUSED"
    );
    assert_eq!(r.probe("read /tmp/holder-file"), "absent");
    assert!(r.stdout.contains("\n1\n"), "{}", r.stdout);
    assert!(r.probe("pids").split(',').count() <= 4, "{}", r.stdout);
    assert_eq!(arep.status, Status::Cancelled, "{arep:?}");
}

/// Limits and reports are each run's own: a run holding most of the process limit leaves another
/// run of the template, at the same time, its whole allowance (the process counts are per run:
/// own user namespace, own cgroup); each report counts its own run only.
#[test]
fn limits_and_reports_are_per_run() {
    let _one = serial();
    let mut p = Policy::new(["true"]).unwrap();
    p.limits.pids = 64;
    per_run(&template(p.clone()), trun);
    per_run(&warm_template(p), wrun);
}

fn per_run(t: &Template, trun: Runner) {
    let holder = r#"import subprocess, time
kids = [subprocess.Popen(["sleep", "60"]) for _ in range(50)]
print("ready", flush=True)
time.sleep(60)
"#;
    let mut a = t.start(
        ["python3", "-c", holder],
        &[],
        Io {
            stream_buffer: Some(1 << 16),
            ..Io::default()
        },
    );
    let mut seen = String::new();
    while !seen.contains("ready") {
        match a.recv_output(None) {
            palisade::Chunk::Data(_, d) => seen.push_str(&String::from_utf8_lossy(&d)),
            palisade::Chunk::Timeout => {}
            palisade::Chunk::End => panic!("the holder ended: {seen} {:?}", a.wait()),
        }
    }
    let (r, rep) = trun(t, "/probe forks 40; exit 3", &[]);
    a.kill();
    let arep = a.wait();
    assert_eq!(
        r.probe("forks 40"),
        "ok spawned=40 error=none",
        "{}",
        r.stdout
    );
    assert_eq!((rep.status, rep.exit_code), (Status::Exit, Some(3)));
    // The run's own ceiling still holds it: 64 processes at most.
    let (r, _) = trun(t, "/probe forks 100", &[]);
    let got = r.probe("forks 100");
    assert!(
        got.starts_with("ok spawned=6") && got.ends_with("error=EAGAIN"),
        "{got}"
    );
    assert_eq!(arep.status, Status::Cancelled);
    if let (Some(ap), Some(bp)) = (arep.pids_peak, rep.pids_peak) {
        assert!(
            ap >= 50 && (40..=45).contains(&bp),
            "pids peaks {ap} and {bp}"
        );
    }
    assert_eq!(
        rep.stdout_bytes as usize,
        "probe forks 40: ok spawned=40 error=none\n".len()
    );
}

/// A run's program, arguments and environment never reach the zygote: they go to the run's own
/// init on its own socket, after its clone (docs/engine.md, "Per run"). As root the test reads
/// the zygote's whole memory and finds the template's own variable there (the control: the
/// reading works) and no byte of a run's secret, after runs and with an init made ahead waiting.
/// Unprivileged, the zygote's memory is not readable at all (it is not dumpable).
#[test]
fn the_zygote_never_holds_a_runs_program() {
    let _one = serial();
    let nonce = format!(
        "{:x}{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let control = format!("palisade-template-control-{nonce}");
    let secret = format!("palisade-run-secret-{nonce}");
    let mut p = Policy::new(["true"]).unwrap();
    p.env
        .push(palisade::policy::EnvVar::parse(&format!("CONTROL={control}")).unwrap());
    let t = template(p);
    for _ in 0..3 {
        let (r, rep) = trun(&t, "echo \"$SECRET\" \"$1\"", &[("SECRET", &secret)]);
        assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
        assert!(
            r.stdout.contains(&secret),
            "control: the run has it: {}",
            r.stdout
        );
    }
    let me = std::process::id();
    let zygote = host_pids_where(|c| c.starts_with(b"palisade-zygote\0"))
        .into_iter()
        .find(|&pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ppid = status.lines().find(|l| l.starts_with("PPid:"));
            let nspid = status.lines().find(|l| l.starts_with("NSpid:"));
            ppid.is_some_and(|l| l.split_whitespace().nth(1) == Some(&me.to_string()))
                && nspid.is_some_and(|l| l.split_whitespace().count() == 2)
        })
        .expect("the template's zygote among this process's children");
    let mem = std::fs::File::open(format!("/proc/{zygote}/mem"));
    if euid() != 0 {
        let e = mem.expect_err("a user reads the zygote's memory");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        return;
    }
    let mem = mem.expect("root opens the zygote's memory");
    let maps = std::fs::read_to_string(format!("/proc/{zygote}/maps")).unwrap();
    let mut all = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let range = f.next().unwrap();
        let perms = f.next().unwrap();
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        use std::os::unix::fs::FileExt;
        if mem.read_exact_at(&mut buf, a).is_ok() {
            all.extend_from_slice(&buf);
        }
    }
    let has = |needle: &str| all.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(
        has(&control),
        "control: the template's own variable is in its zygote"
    );
    assert!(!has(&secret), "a run's variable is in the zygote's memory");
}

/// The next run's init, made ahead, is a process like any other on the host: one killed while it
/// waits (by the host's OOM killer, say) is let go and reaped, and the run it was made for asks
/// for its own, instead of failing.
#[test]
fn a_run_whose_init_made_ahead_was_killed_starts_all_the_same() {
    let _one = serial();
    let t = default_template();
    assert_eq!(trun(&t, "true", &[]).1.status, Status::Ok);
    let me = std::process::id();
    // An init made ahead: a copy of the zygote, pid 1 of its own pid namespace, with nothing
    // under it yet. The template's thread makes it after a run starts: wait for it.
    let ahead = || {
        host_pids_where(|c| c.starts_with(b"palisade-zygote\0"))
            .into_iter()
            .filter(|&pid| {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let field = |k: &str| {
                    status
                        .lines()
                        .find(|l| l.starts_with(k))
                        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
                        .unwrap_or_default()
                };
                field("PPid:") == me.to_string()
                    && field("NSpid:").ends_with(" 1")
                    && !field("State:").starts_with('Z')
            })
            .collect::<Vec<u32>>()
    };
    let t0 = std::time::Instant::now();
    let mut found = ahead();
    while found.is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        found = ahead();
    }
    assert_eq!(found.len(), 1, "one init made ahead: {found:?}");
    // SAFETY: kill(2) on a child of this process, found just now and not reaped (a zombie keeps
    // its pid until then).
    assert_eq!(unsafe { libc::kill(found[0] as i32, libc::SIGKILL) }, 0);
    // Gone (a zombie, its descriptors closed) before the next run starts. (One killed at the very
    // moment its run starts fails that run: its program went to it already.)
    let zombie = || {
        std::fs::read_to_string(format!("/proc/{}/status", found[0])).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
    };
    let t0 = std::time::Instant::now();
    while !zombie() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(zombie(), "the killed init did not end");
    let (r, rep) = trun(&t, "echo started", &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
    assert_eq!(r.stdout, "started\n");
    // The killed one is reaped: no zombie of it is left.
    let status = std::fs::read_to_string(format!("/proc/{}/status", found[0]));
    assert!(
        status.map_or(true, |s| !s
            .lines()
            .any(|l| l.starts_with("PPid:") && l.ends_with(&me.to_string()))),
        "the killed init is still this process's child"
    );
}

/// A template whose runs bind a host directory under a per-run place (`/tmp`) makes no init
/// ahead: the directory is opened and checked at each run's start, so one replaced after a run
/// is refused for the next run, never bound as it was (found by an independent review: an init
/// made ahead had opened the old one, and the next run read it).
#[test]
fn a_per_run_host_path_is_opened_at_each_runs_start() {
    let _one = serial();
    let base = std::env::temp_dir().join(format!("palisade-test-stale-{}", std::process::id()));
    let x = base.join("x");
    std::fs::create_dir_all(&x).unwrap();
    std::fs::write(x.join("v"), "old\n").unwrap();
    // Readable by the test user too (an unprivileged run).
    use std::os::unix::fs::PermissionsExt;
    for d in [&base, &x] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut p = Policy::new(["true"]).unwrap();
    p.binds
        .push(Bind::parse(&format!("{}:/tmp/data", x.display()), false).unwrap());
    let t = template(p);
    let (r, rep) = trun(&t, "cat /tmp/data/v", &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?}\n{}", r.stderr);
    assert_eq!(r.stdout, "old\n");
    // Time for the template's thread to make whatever it makes ahead.
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::rename(&x, base.join("x.old")).unwrap();
    std::fs::create_dir_all(&x).unwrap();
    std::fs::set_permissions(&x, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(x.join("v"), "new\n").unwrap();
    let (r, rep) = trun(&t, "cat /tmp/data/v", &[]);
    drop(t);
    let _ = std::fs::remove_dir_all(&base);
    // The template's plan knows the directory by device and inode: a replaced one is refused,
    // fail closed (the same as before inits were made ahead); never the old one bound.
    assert_ne!(
        r.stdout, "old\n",
        "the run bound the directory that was moved away"
    );
    assert_eq!(rep.status, Status::SandboxError, "{rep:?}\n{}", r.stderr);
    let e = rep.error.unwrap_or_default();
    assert!(
        e.contains("it changed while palisade was checking it"),
        "{e}"
    );
}

/// Runs of a template leave nothing behind: no process, no mount in this process's namespace,
/// no cgroup, no descriptor, no thread; and once the template is dropped, no zygote. 1,000
/// runs here; `PALISADE_SOAK_RUNS` for more (`bench/soak.sh --template`).
#[test]
fn many_template_runs_leave_nothing_behind() {
    let _one = serial();
    let runs: usize = std::env::var("PALISADE_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let before = held();
    let t = default_template();
    for _ in 0..20 {
        assert_eq!(trun(&t, "true", &[]).1.status, Status::Ok);
    }
    let warm = held();
    for i in 0..runs {
        let out = t.start(["/bin/true"], &[], Io::default()).wait_output();
        assert_eq!(
            out.report.status,
            Status::Ok,
            "run {i}: {:?}",
            out.report.error
        );
    }
    let after = held();
    eprintln!("template soak: {runs} runs; held before {warm:?}, after {after:?}");
    // Counted with the descriptors: each run's socket on which its init may hand over its mount
    // namespace, which the template's thread closes after the run's report (docs/engine.md,
    // "A run's end, and its mount namespace"); one never closed adds one per run.
    assert!(
        after.fds <= warm.fds + 8,
        "descriptors {} -> {} over {runs} runs",
        warm.fds,
        after.fds
    );
    assert_eq!(after.threads, warm.threads, "threads");
    // The zygote, and at most the next run's init made ahead (a new one after each run, made by
    // the template's thread, so it may or may not be there yet): no run's init is left.
    assert!(
        after.children.len() <= 2 && warm.children.len() <= 2,
        "children (the zygote and an init made ahead): {:?} -> {:?}",
        warm.children,
        after.children
    );
    assert_eq!(after.mounts, warm.mounts, "mounts");
    assert!(
        after.cgroups.len() <= 8,
        "run cgroups left: {:?}",
        after.cgroups
    );
    drop(t);
    let gone = held();
    assert_eq!(
        gone.children, before.children,
        "the zygote outlived its template"
    );
    assert_eq!(
        gone.threads, before.threads,
        "the template's thread outlived it"
    );
    assert!(
        gone.fds <= before.fds + 8,
        "descriptors {} -> {}",
        before.fds,
        gone.fds
    );
}

/// What this process holds that a leaked run would leave behind.
#[derive(Debug)]
struct Held {
    fds: usize,
    /// palisade's own threads (a run's, a template's).
    threads: usize,
    children: Vec<u32>,
    mounts: usize,
    cgroups: Vec<String>,
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
    children.sort();
    let mut cgroups = Vec::new();
    let prefix = format!("run-{me}-");
    for base in [
        "/sys/fs/cgroup/memory/palisade",
        "/sys/fs/cgroup/pids/palisade",
        "/sys/fs/cgroup/palisade",
    ] {
        let dir = if euid() == 0 {
            base.into()
        } else {
            std::path::Path::new(base).join(format!("user-{}", euid()))
        };
        if let Ok(rd) = std::fs::read_dir(&dir) {
            cgroups.extend(
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix)),
            );
        }
    }
    Held {
        fds: count("/proc/self/fd"),
        threads: std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|e| {
                // A thread waiting in the library's pool for the next run's work (named so
                // before its run is told it ended) is not held by any run.
                std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("palisade-") && c.trim() != "palisade-idle")
            })
            .count(),
        children,
        // Only mounts that are palisade's (a `palisade` tmpfs, a path under a palisade temp or
        // state directory): other work on the machine (another suite, the test internet's
        // namespace) mounts and unmounts in the host's namespace while this runs.
        mounts: std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains("palisade") && !l.contains("/run/netns/"))
            .count(),
        cgroups,
    }
}

/// A supervisor killed with SIGKILL takes its template's zygote and every run with it. The
/// supervisor is this test binary again, started to hold a template and a run, and killed.
#[test]
fn a_zygote_whose_supervisor_dies_takes_everything_with_it() {
    let _one = serial();
    const HOLDER: &str = "PALISADE_TEST_TEMPLATE_HOLDER";
    if let Some(marker) = std::env::var_os(HOLDER) {
        let t = default_template();
        let marker = marker.to_string_lossy().into_owned();
        let _run = t.start(["/probe", "linger", &marker], &[], Io::default());
        println!("holding");
        std::thread::sleep(std::time::Duration::from_secs(120));
        return;
    }
    let marker = unique("palisade-held-run");
    let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_zygote_whose_supervisor_dies_takes_everything_with_it",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER, &marker)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let payload = format!("/probe\0linger\0{marker}");
    let mut run_pids = Vec::new();
    for _ in 0..800 {
        run_pids = host_pids_starting(&payload);
        if !run_pids.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(!run_pids.is_empty(), "the held run never started");
    let zygotes = || {
        host_pids_starting("palisade-zygote\0")
            .into_iter()
            .filter(|&p| parent_of(p) == holder.id())
            .collect::<Vec<_>>()
    };
    assert!(
        !zygotes().is_empty(),
        "control: the holder's zygote is there"
    );
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();
    for _ in 0..400 {
        if host_pids_starting(&payload).is_empty()
            && host_pids_starting("palisade-zygote\0")
                .iter()
                .all(|&p| parent_of(p) != holder.id())
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("left behind: run {:?}", host_pids_starting(&payload));
}

fn parent_of(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s[s.rfind(')')? + 1..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A template with a host scratch directory: every run mounts it afresh (checked by device and
/// inode), writes land on the host owned as in a cold run, and they are what the next run finds.
#[test]
fn a_template_with_a_host_scratch_directory() {
    let _one = serial();
    let d = TempDir::new("tscratch");
    let mut p = Policy::new(["true"]).unwrap();
    p.scratch = palisade::policy::Scratch::Host {
        path: d.path().to_owned(),
    };
    let t = template(p);
    let (r, rep) = trun(&t, "/probe write /workspace/out.txt", &[]);
    assert_eq!(r.probe("write /workspace/out.txt"), "ok", "{rep:?}");
    let meta = std::fs::metadata(d.path().join("out.txt")).expect("on the host");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), euid());
    let (r, _) = trun(&t, "/probe read /workspace/out.txt", &[]);
    assert!(
        r.probe("read /workspace/out.txt").starts_with("ok"),
        "{}",
        r.stdout
    );
}

/// A workspace is one run's own: preparing a template with one is refused, the field named, and
/// the project is left as it was.
#[test]
fn a_template_refuses_a_workspace() {
    let _one = serial();
    let d = TempDir::new("tworkspace");
    std::fs::write(d.path().join("file"), "before\n").unwrap();
    let mut p = policy("echo after > /workspace/file");
    p.scratch = palisade::policy::Scratch::Workspace {
        path: d.path().to_owned(),
    };
    let e = Sandbox::from_policy(p)
        .unwrap()
        .engine(exec_engine())
        .prepare()
        .expect_err("a template with a workspace was prepared");
    assert!(e.to_string().contains("filesystem.workspace"), "{e}");
    assert_eq!(
        std::fs::read_to_string(d.path().join("file")).unwrap(),
        "before\n"
    );
}

/// A run's command and variables are checked before anything starts, the field named; a request
/// too large for the template's socket is refused with its size.
#[test]
fn a_templates_run_requests_are_checked() {
    let _one = serial();
    let t = default_template();
    let out = t
        .start(Vec::<String>::new(), &[], Io::default())
        .wait_output();
    assert_eq!(out.report.status, Status::SandboxError);
    assert!(out.report.error.unwrap().contains("command"));
    let out = t
        .start(["true"], &[("1BAD", "x")], Io::default())
        .wait_output();
    assert_eq!(out.report.status, Status::SandboxError);
    assert!(out.report.error.unwrap().contains("1BAD"));
    let big = "x".repeat(200 * 1024);
    let out = t
        .start(["/bin/echo", &big], &[], Io::default())
        .wait_output();
    assert_eq!(out.report.status, Status::SandboxError);
    assert!(
        out.report
            .error
            .clone()
            .unwrap_or_default()
            .contains("at most"),
        "{:?}",
        out.report
    );
    // The template still serves.
    assert_eq!(trun(&t, "true", &[]).1.status, Status::Ok);
}

/// The egress proxy serves each run of a template on listeners made in that run's own network
/// namespace: two runs reach an allowed host of the test internet through it, and the host sees
/// each request (`scripts/testnet.sh up` first, as for the egress tests).
#[test]
fn a_templates_runs_reach_an_allowed_host_through_their_own_proxy() {
    let _one = serial();
    testnet::require();
    let mut p = Policy::new(["true"]).unwrap();
    for rule in ["allowed.test:80", testnet::WEB] {
        p.network
            .allow
            .push(palisade::policy::net::NetRule::parse("network.allow", rule).unwrap());
    }
    for pin in testnet::pins(&["allowed.test"]).chunks(2) {
        p.network
            .resolve
            .push(palisade::policy::net::Pin::parse(&pin[1]).unwrap());
    }
    let t = template(p);
    for i in 0..2 {
        let m = unique(&format!("tproxy{i}"));
        let (r, rep) = trun(
            &t,
            &format!("python3 -c \"import urllib.request; print('status', urllib.request.urlopen('http://allowed.test/{m}').status)\""),
            &[],
        );
        assert_eq!(rep.status, Status::Ok, "{rep:?} {}", r.stderr);
        assert!(r.stdout.contains("status 200"), "{}", r.stdout);
        assert!(
            !testnet::seen(&m).is_empty(),
            "the test host never saw run {i}'s request"
        );
        // The run's own proxy decided it: the connection, and the request on it, each allowed.
        assert_eq!(rep.network.denied, 0, "{:?}", rep.network);
        assert!(
            rep.network.events.iter().any(|e| e
                .request
                .as_ref()
                .is_some_and(|q| q.path.contains(&m) && q.status == Some(200))),
            "{:?}",
            rep.network
        );
    }
}

// ---- Warm Python ----

/// A warm-Python template of `p` (the probe bound at `/probe`), `random` imported in the zygote.
fn warm_template(p: Policy) -> Template {
    warm_template_with(p, &["random"])
}

/// A warm-Python template of `p` (the probe bound at `/probe`), `modules` imported in the zygote.
fn warm_template_with(mut p: Policy, modules: &[&str]) -> Template {
    p.binds
        .push(Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap());
    let modules: Vec<String> = modules.iter().map(|m| m.to_string()).collect();
    let warm = palisade::WarmPython::find("/usr/bin/python3".as_ref(), &modules)
        .expect("python3 with its shared library");
    Sandbox::from_policy(p)
        .unwrap()
        .engine(exec_engine())
        .prepare_warm_python(warm)
        .expect("a warm template")
}

/// The control of a warm run: `code` in a cold `python3 -c` of the same `/usr/bin/python3`,
/// which must end well; its standard output.
fn cold_python(code: &str) -> String {
    let cold = Sandbox::from_policy(Policy::new(["/usr/bin/python3", "-c", code]).unwrap())
        .unwrap()
        .output();
    assert_eq!(
        cold.report.status,
        Status::Ok,
        "{}",
        String::from_utf8_lossy(&cold.stderr)
    );
    String::from_utf8_lossy(&cold.stdout).into_owned()
}

/// Runs `code` in `t`'s warm interpreter with `args`.
fn pyrun(t: &Template, code: &str, args: &[&str], env: &[(&str, &str)]) -> (Run, Report) {
    let mut cmd = vec!["python3", "-c", code];
    cmd.extend_from_slice(args);
    let out = t.start(cmd, env, Io::default()).wait_output();
    assert_eq!(out.report.engine, Some("template-warm"), "{:?}", out.report);
    let r = Run {
        code: out.report.exit_code_for_cli(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (r, out.report)
}

/// A warm run that execs `sh -c script` (the script as its argument, its variables through
/// the run's environment: both travel on the warm path).
fn wrun(t: &Template, script: &str, env: &[(&str, &str)]) -> (Run, Report) {
    pyrun(
        t,
        "import os, sys; os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[1]])",
        &[script],
        env,
    )
}

/// What a warm run is, from inside the interpreter itself (no exec): pid 2 under palisade's
/// init, no capability, the filter on, descriptors 0, 1, 2 only, the run's arguments and
/// environment and nothing of the zygote's; `random` (imported in the zygote) reseeded per run;
/// `python3 -c`'s exit statuses.
#[test]
fn a_warm_run_is_its_own_python() {
    let _one = serial();
    let t = warm_template(Policy::new(["true"]).unwrap());
    let code = r#"import os, sys, random
st = open('/proc/self/status').read()
print('caps', [l for l in st.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp:'))])
print('fds', sorted(int(f) for f in os.listdir('/proc/self/fd') if os.path.exists('/proc/self/fd/' + f)))
print('ids', os.getpid(), os.getppid())
print('argv', sys.argv, sys.path[0] == '')
print('env', sorted(os.environ))
print('rand', random.random())
"#;
    let (a, rep) = pyrun(&t, code, &["x", "y z"], &[("RUN_VAR", "v1")]);
    assert_eq!(rep.status, Status::Ok, "{rep:?} {}", a.stderr);
    for want in [
        "'CapEff:\\t0000000000000000'",
        "'CapPrm:\\t0000000000000000'",
        "'CapBnd:\\t0000000000000000'",
        "'NoNewPrivs:\\t1'",
        "'Seccomp:\\t2'",
        "fds [0, 1, 2]\n",
        "ids 2 1\n",
        "argv ['-c', 'x', 'y z'] True\n",
        "env ['HOME', 'LANG', 'PATH', 'RUN_VAR']\n",
    ] {
        assert!(a.stdout.contains(want), "{want} not in {}", a.stdout);
    }
    let (b, _) = pyrun(&t, code, &["x", "y z"], &[]);
    assert!(
        b.stdout.contains("env ['HOME', 'LANG', 'PATH']\n"),
        "{}",
        b.stdout
    );
    let rand = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("rand"))
            .unwrap()
            .to_owned()
    };
    assert_ne!(
        rand(&a.stdout),
        rand(&b.stdout),
        "random is not reseeded per run"
    );
    // Exit statuses as python3 -c gives them.
    assert_eq!(pyrun(&t, "import sys; sys.exit(42)", &[], &[]).0.code, 42);
    let (r, _) = pyrun(&t, "raise ValueError('boom')", &[], &[]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("ValueError: boom"), "{}", r.stderr);
    let (_, rep) = pyrun(
        &t,
        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
        &[],
        &[],
    );
    assert_eq!((rep.status, rep.signal), (Status::Signal, Some(11)));
    // Another command of a warm template runs as in a plain template.
    let out = t
        .start(["/bin/sh", "-c", "echo plain"], &[], Io::default())
        .wait_output();
    assert_eq!(out.report.engine, Some("template"));
    assert_eq!(out.stdout, b"plain\n");
}

/// A warm run starts as `python3 -c` does: every signal's disposition, as Python records it and
/// as the kernel has it (set through the C module `_signal` in a warm run, not through
/// `signal.signal`; palisade's own `SIGSEGV` and `SIGBUS` handlers, which Python saw in the
/// zygote, are defaults again), the names of `__main__` with what they hold, and the buffering
/// of the standard streams (not a terminal: standard output is not line-buffered, standard error
/// is, as since Python 3.9). The same code in a cold run of the same `python3` is the control.
/// (Which modules are imported differs by design: the template's are; docs/engine.md.) And what
/// a template's module printed at its import in the zygote is not in any run's output.
#[test]
fn a_warm_run_starts_as_python_does() {
    let _one = serial();
    let t = warm_template(Policy::new(["true"]).unwrap());
    let code = r#"import signal, sys
main = sys.modules['__main__']
for n in sorted(signal.valid_signals()):
    h = signal.getsignal(n)
    kind = 'default_int_handler' if h is signal.default_int_handler else (int(h) if isinstance(h, int) else type(h).__name__)
    try:
        name = signal.Signals(n).name
    except ValueError:
        name = str(n)
    print('sig', name, kind)
print('\n'.join(l.strip() for l in open('/proc/self/status') if l.startswith(('SigBlk', 'SigIgn', 'SigCgt'))))
for k in sorted(vars(main)):
    v = vars(main)[k]
    print('main', k, type(v).__name__, v if isinstance(v, (str, type(None))) else '')
print('buffering', sys.stdout.line_buffering, sys.stderr.line_buffering)
print('main', main.__name__, main is sys.modules['__main__'])
"#;
    let cold = cold_python(code);
    // The control is meaningful: Python's start set the three it sets, and main has its names.
    for want in [
        "sig SIGINT default_int_handler\n",
        "sig SIGPIPE 1\n",
        "sig SIGXFSZ 1\n",
        "sig SIGSEGV 0\n",
        "sig SIGTERM 0\n",
        "SigCgt:\t0000000000000002\n",
        "main __name__ str __main__\n",
        "main __builtins__ module \n",
        "buffering False True\n",
        "main __main__ True\n",
    ] {
        assert!(cold.contains(want), "control: {want:?} not in {cold}");
    }
    let (warm, rep) = pyrun(&t, code, &[], &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?} {}", warm.stderr);
    assert_eq!(warm.stdout, cold, "{}", warm.stderr);
    // `this` prints the Zen of Python when it is imported: in the zygote, not in a run.
    let zen = warm_template_with(Policy::new(["true"]).unwrap(), &["this"]);
    let (r, rep) = pyrun(&zen, "print('mine')", &[], &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?} {}", r.stderr);
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("mine\n", ""));
}

/// A warm run ends as `python3 -c` does (docs/engine.md, "How a warm run ends"): it waits for
/// its non-daemon threads, runs its `atexit` handlers, and what its own objects hold is
/// finalized: a file left open in `__main__` or in a module the run imported is flushed, a
/// `__del__` of the run's runs. The same code in a cold `python3 -c` is the control.
#[test]
fn a_warm_run_ends_as_python_does() {
    let _one = serial();
    let t = warm_template(Policy::new(["true"]).unwrap());
    let code = r#"import atexit, os, sys, threading, time
out = open(sys.stdout.fileno(), 'w', closefd=False)
out.write('main-unflushed;')
class Late:
    def __del__(self):
        os.write(1, b'del-ran;')
late = Late()
def later():
    time.sleep(0.3)
    os.write(1, b'thread-done;')
threading.Thread(target=later).start()
atexit.register(lambda: os.write(1, b'atexit-ran;'))
with open('/tmp/palisade_mod.py', 'w') as f:
    f.write("import sys\nkept = open(sys.stdout.fileno(), 'w', closefd=False)\nkept.write('module-unflushed;')\n")
sys.path.insert(0, '/tmp')
import palisade_mod
print('printed', end=';')
"#;
    let cold = cold_python(code);
    let (warm, rep) = pyrun(&t, code, &[], &[]);
    assert_eq!(rep.status, Status::Ok, "{rep:?} {}", warm.stderr);
    assert_eq!(rep.engine, Some("template-warm"));
    let parts = |s: &str| {
        let mut v: Vec<String> = s
            .split(';')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    let want = parts("main-unflushed;del-ran;thread-done;atexit-ran;module-unflushed;printed;");
    assert_eq!(parts(&cold), want, "control: python3 -c");
    assert_eq!(parts(&warm.stdout), want, "{}", warm.stderr);
    // What went to the original standard output before the run replaced it is written, as by
    // python3 -c (which flushes sys.__stdout__ at its end too).
    let (r, _) = pyrun(
        &t,
        "import sys\nprint('kept', end='')\nsys.stdout = open('/dev/null', 'w')",
        &[],
        &[],
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, "kept"), "{}", r.stderr);
    // The exit status of a failure in an atexit handler is python's too (0: it is only printed).
    let (r, _) = pyrun(&t, "import atexit\natexit.register(lambda: 1/0)", &[], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("ZeroDivisionError"), "{}", r.stderr);
}

/// Nothing of run N's code or environment is in run N+1's memory: run N+1 scans every readable
/// mapping of its own for run N's secret, and finds it no more often than a secret no run ever
/// had (the scan's own copies of its needle); as a control, it finds a string of its own code.
#[test]
fn a_warm_run_holds_nothing_of_the_one_before() {
    let _one = serial();
    let t = warm_template(Policy::new(["true"]).unwrap());
    let secret = unique("WARMSECRET");
    let never = unique("WARMNEVER");
    let (r, _) = pyrun(
        &t,
        &format!("s = '{secret}'; print(len(s))"),
        &[],
        &[("ENV_SECRET", &format!("E{secret}"))],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The needle comes as hex, so the code itself does not hold it.
    let scan = |needle: &str| {
        let code = format!(
            r#"import re
needle = bytes.fromhex('{}')
own = b'OWN-' + b'MARK-7f3a'  # control: 'OWN-MARK-7f3a' is in this code
hits = {{needle: 0, own: 0}}
mem = open('/proc/self/mem', 'rb', buffering=0)
for line in open('/proc/self/maps').read().splitlines():
    f = line.split()
    if 'r' not in f[1] or (len(f) > 5 and f[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):
        continue
    lo, hi = (int(x, 16) for x in f[0].split('-'))
    try:
        mem.seek(lo); chunk = mem.read(hi - lo)
    except OSError:
        continue
    for k in hits:
        hits[k] += chunk.count(k)
    del chunk
print(hits[needle], hits[own])
"#,
            needle
                .as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let (r, _) = pyrun(&t, &code, &[], &[]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let v: Vec<u64> = r
            .stdout
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        (v[0], v[1])
    };
    let (seen, own) = scan(&secret);
    let (baseline, _) = scan(&never);
    let (seen_env, _) = scan(&format!("E{secret}"));
    assert!(own > 0, "control: the scan finds nothing of its own code");
    assert_eq!(seen, baseline, "run N's code is in run N+1's memory");
    assert_eq!(
        seen_env, baseline,
        "run N's environment is in run N+1's memory"
    );
}

// ---- A run's files (Io::files) ----

/// The files of the run in `files_test`: a program, a binary file past a pipe's buffer in
/// directories that do not exist yet, a private one and an executable script.
fn run_files() -> (Vec<palisade::FileIn>, Vec<u8>) {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let files = vec![
        palisade::FileIn {
            path: "main.py".into(),
            data: b"print('hi')\n".to_vec(),
            mode: 0o644,
        },
        palisade::FileIn {
            path: "data/in/x.bin".into(),
            data: big.clone(),
            mode: 0o600,
        },
        palisade::FileIn {
            path: "run.sh".into(),
            data: b"#!/bin/sh\necho script-ran\n".to_vec(),
            mode: 0o755,
        },
    ];
    (files, big)
}

/// What the payload sees of its files, and of its own descriptors.
const LOOK_AT_FILES: &str =
    "cd /workspace && stat -c '%n %a %u' main.py data/in/x.bin run.sh data data/in; \
     id -u; cksum < data/in/x.bin; cat main.py; ./run.sh; \
     for f in /proc/self/fd/*; do readlink $f; done | grep -c memfd || true";

/// Checks what [`LOOK_AT_FILES`] printed.
fn files_seen(what: &str, out: &str, big: &[u8]) {
    let lines: Vec<&str> = out.lines().collect();
    let uid = lines.get(5).copied().unwrap_or_default();
    let want_stat = [
        format!("main.py 644 {uid}"),
        format!("data/in/x.bin 600 {uid}"),
        format!("run.sh 755 {uid}"),
        format!("data 755 {uid}"),
        format!("data/in 755 {uid}"),
    ];
    assert_eq!(&lines[..5], &want_stat, "{what}: {out}");
    // cksum of the same bytes on the host.
    let mut c = std::process::Command::new("cksum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cksum");
    use std::io::Write;
    c.stdin.take().unwrap().write_all(big).unwrap();
    let host = String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap();
    assert_eq!(lines[6], host.trim(), "{what}: the bytes differ: {out}");
    assert_eq!(
        &lines[7..],
        ["print('hi')", "script-ran", "0"],
        "{what}: {out}"
    );
}

/// A run's files are in its working directory when the payload starts, with their modes, owned
/// by the sandbox's user, their bytes exact: from a cold start (both engines), a template and a
/// warm Python template. The payload holds no descriptor of them.
#[test]
fn a_runs_files_are_there_when_it_starts() {
    let _one = serial();
    let (files, big) = run_files();
    let io = || Io {
        files: files.clone(),
        ..Io::default()
    };
    for (engine, name) in [(Engine::InProcess, "in-process"), (exec_engine(), "exec")] {
        let o = Sandbox::from_policy(policy(LOOK_AT_FILES))
            .unwrap()
            .engine(engine)
            .start(io())
            .wait_output();
        assert_eq!(o.report.status, Status::Ok, "{name}: {:?}", o.report);
        files_seen(name, &String::from_utf8_lossy(&o.stdout), &big);
    }
    let t = default_template();
    let o = t
        .start(["/bin/sh", "-c", LOOK_AT_FILES], &[], io())
        .wait_output();
    assert_eq!(o.report.status, Status::Ok, "template: {:?}", o.report);
    files_seen("template", &String::from_utf8_lossy(&o.stdout), &big);
    // The next run of the template starts without them.
    let (r, _) = trun(&t, "ls -A /workspace | wc -l", &[]);
    assert_eq!(r.stdout.trim(), "0", "{}", r.stdout);
    let w = warm_template(Policy::new(["true"]).unwrap());
    let o = w
        .start(
            [
                "python3",
                "-c",
                "import os, sys; os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[1]])",
                LOOK_AT_FILES,
            ],
            &[],
            io(),
        )
        .wait_output();
    assert_eq!(o.report.engine, Some("template-warm"), "{:?}", o.report);
    assert_eq!(o.report.status, Status::Ok, "warm: {:?}", o.report);
    files_seen("warm", &String::from_utf8_lossy(&o.stdout), &big);
}

/// A bad file path or mode fails the run before anything starts, naming the field; nothing of
/// the payload runs.
#[test]
fn a_runs_bad_files_are_refused() {
    let _one = serial();
    let d = TempDir::new("badfiles");
    let marker = d.path().join("ran");
    let t = default_template();
    let file = |path: &str, mode: u32| palisade::FileIn {
        path: path.into(),
        data: b"x".to_vec(),
        mode,
    };
    for (files, field, value) in [
        (vec![file("../x", 0o644)], "files", "../x"),
        (vec![file("/etc/x", 0o644)], "files", "/etc/x"),
        (vec![file("a//b", 0o644)], "files", "a//b"),
        (vec![file("a/./b", 0o644)], "files", "a/./b"),
        (vec![file("", 0o644)], "files", ""),
        (vec![file("x", 0o4755)], "files.mode", "4755"),
        (vec![file("x", 0o644), file("x", 0o600)], "files", "x"),
        (vec![file("a", 0o644), file("a/b", 0o644)], "files", "a"),
    ] {
        let io = || Io {
            files: files.clone(),
            ..Io::default()
        };
        let script = format!("touch {}", marker.display());
        let cold = Sandbox::from_policy(policy(&script))
            .unwrap()
            .start(io())
            .wait_output();
        let warm = t.start(["/bin/sh", "-c", &script], &[], io()).wait_output();
        for (o, name) in [(cold, "cold"), (warm, "template")] {
            assert_eq!(o.report.status, Status::SandboxError, "{name} {files:?}");
            let e = o.report.error.clone().unwrap_or_default();
            assert!(
                e.contains(&format!("`{field}`")) || e.contains(field),
                "{name}: {e}"
            );
            assert!(e.contains(value), "{name}: {e}");
        }
        assert!(!marker.exists(), "the payload ran with {files:?}");
    }
}

/// With a host scratch directory, a symbolic link an earlier run left where a file of the run
/// goes is not followed: the run fails naming the file, and the link's target on the host is
/// untouched; a fifo there fails too, at once, rather than wait for a reader.
#[test]
fn a_runs_files_never_follow_a_link_left_in_a_host_scratch() {
    let _one = serial();
    let d = TempDir::new("filelink");
    let outside = TempDir::new("filelink-target");
    let target = outside.path().join("target");
    std::fs::write(&target, "host\n").unwrap();
    let scratch = d.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    std::os::unix::fs::symlink(&target, scratch.join("main.py")).unwrap();
    std::os::unix::fs::symlink(outside.path(), scratch.join("dir")).unwrap();
    let fifo = std::ffi::CString::new(scratch.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut p = Policy::new(["true"]).unwrap();
    p.scratch = palisade::policy::Scratch::Host {
        path: scratch.clone(),
    };
    let t = template(p.clone());
    for path in ["main.py", "dir/new", "fifo"] {
        let io = || Io {
            files: vec![palisade::FileIn {
                path: path.into(),
                data: b"from the run\n".to_vec(),
                mode: 0o644,
            }],
            ..Io::default()
        };
        let cold = Sandbox::from_policy(p.clone())
            .unwrap()
            .start(io())
            .wait_output();
        let tmpl = t.start(["true"], &[], io()).wait_output();
        for (o, name) in [(cold, "cold"), (tmpl, "template")] {
            assert_eq!(
                o.report.status,
                Status::SandboxError,
                "{name} {path}: {:?}",
                o.report
            );
            let e = o.report.error.clone().unwrap_or_default();
            assert!(
                e.contains(&format!("write the run's file {path}")),
                "{name}: {e}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "host\n");
    assert!(!outside.path().join("new").exists());
    // Control: a plain path there is written.
    let io = Io {
        files: vec![palisade::FileIn {
            path: "plain".into(),
            data: b"from the run\n".to_vec(),
            mode: 0o644,
        }],
        ..Io::default()
    };
    let o = t.start(["true"], &[], io).wait_output();
    assert_eq!(o.report.status, Status::Ok, "{:?}", o.report);
    assert_eq!(
        std::fs::read_to_string(scratch.join("plain")).unwrap(),
        "from the run\n"
    );
}
