//! Attacks that each guard one layer the other tests could lose unnoticed (docs/testing.md,
//! "Mutation testing": each test here failed with its layer removed by hand and passes with it).
//! Every attack runs from inside a real sandbox: cold runs through the `palisade` binary or the
//! library, template and warm runs through the library's templates made by palisade's init
//! program. Run as root and as an unprivileged user.

mod common;
use common::probe_template as template;
use common::*;
use palisade::policy::{Bind, Policy};
use palisade::{Engine, Io, Report, Sandbox, Template};

/// A warm-Python template of the default policy, the probe bound at `/probe`.
fn warm_template() -> Template {
    let mut p = Policy::new(["true"]).unwrap();
    p.binds
        .push(Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap());
    let warm = palisade::WarmPython::find("/usr/bin/python3".as_ref(), &[])
        .expect("python3 with its shared library");
    Sandbox::from_policy(p)
        .unwrap()
        .engine(Engine::InitProgram(palisade_bin()))
        .prepare_warm_python(warm)
        .expect("a warm template")
}

/// `sh -c script` in a run of `t` (a warm template's run execs the shell from its interpreter).
fn trun(t: &Template, warm: bool, script: &str) -> (Run, Report) {
    let cmd: Vec<&str> = if warm {
        vec![
            "python3",
            "-c",
            "import os, sys; os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[1]])",
            script,
        ]
    } else {
        vec!["/bin/sh", "-c", script]
    };
    let out = t.start(cmd, &[], Io::default()).wait_output();
    let want = if warm { "template-warm" } else { "template" };
    assert_eq!(out.report.engine, Some(want), "{:?}", out.report);
    let r = Run {
        code: out.report.exit_code_for_cli(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (r, out.report)
}

/// Landlock in a template's runs, seen from inside through the two refusals only Landlock makes
/// (boundary.rs has them for cold runs): a write to the payload's own `/proc/self/oom_score_adj`,
/// which the mount view leaves writable (the control outside shows raising it needs no
/// privilege), and a signal to init (same uid, outside the payload's domain; ABI 6 and later).
/// A template run whose payload skipped `landlock_restrict_self` passed every other test: the
/// report states the plan, not what the payload entered.
#[test]
fn landlock_holds_in_template_and_warm_runs() {
    let _one = serial();
    let script =
        "echo 500 > /proc/self/oom_score_adj && echo proc-write-ok || echo proc-write-denied; \
                  kill -0 1 2>/dev/null && echo signal-ok || echo signal-denied";
    let control = std::process::Command::new("/bin/sh")
        .args(["-c", script])
        .output()
        .unwrap();
    let control = String::from_utf8_lossy(&control.stdout).into_owned();
    assert!(control.contains("proc-write-ok"), "control: {control}");
    for (t, warm) in [
        (template(Policy::new(["true"]).unwrap()), false),
        (warm_template(), true),
    ] {
        let (r, rep) = trun(&t, warm, script);
        assert_eq!(r.code, 0, "warm {warm}: {}\n{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains("proc-write-denied"),
            "warm {warm}: {}",
            r.stdout
        );
        if rep.landlock_abi.unwrap_or(0) >= 6 {
            assert!(
                r.stdout.contains("signal-denied"),
                "warm {warm}: {}",
                r.stdout
            );
        }
    }
}

/// A cold run started by palisade's exec'd init program holds descriptors 0, 1, 2 only. That init
/// inherits its channels to the supervisor across its own exec (they cannot be close-on-exec
/// there), so here only the payload's own close-on-exec pass (step 18) keeps the supervisor's
/// "go" socket and message pipe out of the payload; the in-process engine's are close-on-exec
/// from the start, which is why the CLI's tests (in-process) did not notice that pass missing.
#[test]
fn an_exec_engine_payload_holds_only_its_standard_streams() {
    let _one = serial();
    let mut p = Policy::new(["/probe", "fds"]).unwrap();
    p.binds
        .push(Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap());
    let out = Sandbox::from_policy(p)
        .unwrap()
        .engine(Engine::InitProgram(palisade_bin()))
        .output();
    assert_eq!(out.report.engine, Some("exec"), "{:?}", out.report);
    let r = Run {
        code: out.report.exit_code_for_cli(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let fds = r.probe("fds");
    let nums: Vec<&str> = fds
        .trim_start_matches("ok ")
        .split(',')
        .map(|e| e.split("->").next().unwrap())
        .collect();
    assert_eq!(nums, ["0", "1", "2"], "{fds}");
}

/// Mount points under which the sandbox's view puts something (docs/layers/filesystem.md).
const VIEW: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/etc",
    "/proc",
    "/dev",
    "/tmp",
    "/workspace",
    "/probe",
];

/// The mount points in a `/proc/self/mountinfo` text that lie outside the sandbox's view.
fn outside_view(mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| {
            *m != "/"
                && !VIEW
                    .iter()
                    .any(|v| m == v || m.strip_prefix(v).is_some_and(|r| r.starts_with('/')))
        })
        .map(str::to_owned)
        .collect()
}

/// The old root is detached after `pivot_root`, in cold and in template runs: the sandbox's
/// mount table holds its own view and nothing of the host's. Kept attached beneath the new root,
/// the host's tree is no longer reachable by path, but every host mount (`/sys`, `/run`, `/home`,
/// whatever the host has) is listed to the payload with its source and options, and the whole
/// host tree stays pinned in the sandbox's namespace; no other test looked at the table.
#[test]
fn the_sandboxs_mount_table_holds_nothing_of_the_hosts() {
    let _one = serial();
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let host_only = outside_view(&host);
    assert!(
        !host_only.is_empty(),
        "control: the host should have mounts outside the sandbox's view:\n{host}"
    );
    let cold = run(&[], &["/bin/cat", "/proc/self/mountinfo"]);
    assert_eq!(cold.code, 0, "{}", cold.stderr);
    assert_eq!(
        outside_view(&cold.stdout),
        Vec::<String>::new(),
        "cold run:\n{}",
        cold.stdout
    );
    assert!(
        cold.stdout.lines().count() < 64,
        "cold run:\n{}",
        cold.stdout
    );
    let t = template(Policy::new(["true"]).unwrap());
    let (r, _) = trun(&t, false, "cat /proc/self/mountinfo");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        outside_view(&r.stdout),
        Vec::<String>::new(),
        "template run:\n{}",
        r.stdout
    );
    assert!(r.stdout.lines().count() < 64, "template run:\n{}", r.stdout);
}

/// Init is not dumpable, in cold and template runs: its `/proc/1/*` files are not the payload's
/// (the kernel gives a non-dumpable process's files to root, or the overflow id where root is not
/// mapped), so the payload cannot ptrace init or open its memory, environment or descriptors by
/// ownership. Landlock refuses those too, which is why no read attempt showed a dumpable init:
/// the owner is what tells. For a root launch the switch to the run's host id clears
/// dumpability already; it is the unprivileged run (same ids before and after) where the explicit
/// `PR_SET_DUMPABLE 0` is all there is.
#[test]
fn init_is_not_the_payloads_to_inspect() {
    let _one = serial();
    let script = "stat -c 'owner %u' /proc/1/environ; echo \"me $(id -u)\"";
    let field = |out: &str, key: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no `{key}` line in:\n{out}"))
            .trim()
            .to_owned()
    };
    let cold = run(&[], &["/bin/sh", "-c", script]);
    assert_eq!(cold.code, 0, "{}", cold.stderr);
    let t = template(Policy::new(["true"]).unwrap());
    let (tr, _) = trun(&t, false, script);
    assert_eq!(tr.code, 0, "{}", tr.stderr);
    for (r, what) in [(&cold, "cold"), (&tr, "template")] {
        let (owner, me) = (field(&r.stdout, "owner "), field(&r.stdout, "me "));
        // A root-launched template run is uid 0 inside with 0 mapped: the owner the kernel gives
        // a non-dumpable process's files is then the payload's uid too, and tells nothing.
        if what == "template" && me == "0" {
            continue;
        }
        assert_ne!(
            owner, me,
            "{what}: init's /proc files belong to the payload's uid"
        );
    }
}

/// Each process ceiling is in place on its own: the payload's `RLIMIT_NPROC` is the policy's
/// `--pids` (counted per user namespace, so it bounds this sandbox alone). The fork-bomb test in
/// limits.rs sees the lower of this and the cgroup's `pids.max`, so it could not tell either one
/// missing.
#[test]
fn the_process_rlimit_is_the_policys() {
    let r = run(&["--pids", "77"], &["/bin/cat", "/proc/self/limits"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Max processes"))
        .unwrap_or_else(|| panic!("no `Max processes` in:\n{}", r.stdout));
    let v: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(v[2..4], ["77", "77"], "{line}");
}

/// The cgroup's own process ceiling, read from the host: from inside, the per-user-namespace
/// `RLIMIT_NPROC` stops a fork bomb at the same count, so only the host can see that `pids.max`
/// was written (the mutant that skipped it survived every test from inside).
#[test]
fn the_run_cgroups_pids_max_is_the_policys() {
    let marker = unique("pidsmax");
    let mut child = std::process::Command::new(palisade_bin())
        .args(["run", "--quiet", "--pids", "77", "--", "sh", "-c"])
        .arg(format!("sleep 60; : {marker}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let pid = loop {
        // The payload's `sh` (palisade and its init carry the marker in their arguments too).
        let payload = host_pids_where(|c| {
            c.starts_with(b"sh\0") && String::from_utf8_lossy(c).contains(&marker)
        });
        if let Some(&p) = payload.first() {
            break p;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("palisade run ended ({st}) before its payload was seen");
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "the payload never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // The payload's cgroup as the host names it: the v1 pids hierarchy's line, else the v2 one.
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let file = cg
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (ctls, path) = rest.split_once(':')?;
            ctls.split(',')
                .any(|c| c == "pids")
                .then(|| format!("/sys/fs/cgroup/pids{path}/pids.max"))
        })
        .or_else(|| {
            cg.lines()
                .find_map(|l| l.strip_prefix("0::"))
                .map(|path| format!("/sys/fs/cgroup{path}/pids.max"))
        })
        .unwrap_or_else(|| panic!("no pids cgroup in:\n{cg}"));
    let max = std::fs::read_to_string(&file);
    let _ = child.kill();
    let _ = child.wait();
    let max = max.unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(max.trim(), "77", "{file}");
}
