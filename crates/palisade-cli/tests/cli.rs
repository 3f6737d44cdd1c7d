//! The CLI's contract: exit codes, errors for bad input, the report.

mod common;
use common::*;

#[test]
fn a_bad_option_gives_the_reserved_code_and_names_the_option() {
    let r = run(&["--bogus-option"], &["true"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("--bogus-option"), "{}", r.stderr);
}

#[test]
fn bad_values_are_refused_before_anything_runs() {
    let d = TempDir::new("bad");
    let marker = d.path().join("ran");
    let m = marker.display().to_string();
    for (opts, needle) in [
        (vec!["--ro", "relative/path"], "--ro"),
        (vec!["--rw", "/tmp:/proc/x"], "/proc"),
        (vec!["--env", "1BAD=x"], "1BAD"),
        (
            vec!["--env", "PALISADE_SURELY_UNSET_VAR"],
            "PALISADE_SURELY_UNSET_VAR",
        ),
        (
            vec!["--scratch", "/nonexistent/palisade"],
            "/nonexistent/palisade",
        ),
        (
            vec!["--ro", "/nonexistent/palisade-src"],
            "/nonexistent/palisade-src",
        ),
    ] {
        let mut o = opts.clone();
        o.extend(["--rw", d.path().to_str().unwrap()]);
        let r = run(&o, &["/probe", "write", &m]);
        assert_eq!(r.code, 125, "{opts:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(needle),
            "{opts:?}: message does not name `{needle}`: {}",
            r.stderr
        );
        assert!(!marker.exists(), "{opts:?}: the command ran");
    }
}

#[test]
fn a_missing_command_gives_127_and_says_so() {
    let r = run(&[], &["palisade-no-such-command"]);
    assert_eq!(r.code, 127, "{}", r.stderr);
    assert!(
        r.stderr.contains("palisade-no-such-command"),
        "{}",
        r.stderr
    );
    let r = run(&[], &["/etc/hostname"]);
    assert_eq!(r.code, 126, "{}", r.stderr);
}

#[test]
fn env_passes_values_by_name_only_when_asked() {
    let mut c = command(&["--env", "PASSED", "--env", "SET=v=1"], &["/probe", "env"]);
    c.env("PASSED", "host-value").env("NOT_PASSED", "x");
    let r: Run = c.output().unwrap().into();
    assert!(
        r.stdout.contains("probe env: PASSED=host-value"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("probe env: SET=v=1"), "{}", r.stdout);
    assert!(!r.stdout.contains("NOT_PASSED"), "{}", r.stdout);
}

#[test]
fn json_report_describes_the_run() {
    let t0 = std::time::Instant::now();
    let r = run(
        &["--json", "-"],
        &["/bin/sh", "-c", "echo out; echo err >&2; sleep 0.2; exit 3"],
    );
    let outside = t0.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(r.code, 3);
    let json_start = r.stdout.find('{').expect("a JSON report on stdout");
    assert_eq!(&r.stdout[..json_start], "out\n");
    let j: serde_json::Value = serde_json::from_str(&r.stdout[json_start..]).unwrap();
    assert_eq!(j["status"], "exit");
    assert_eq!(j["exit_code"], 3);
    assert_eq!(j["stdout_bytes"], 4);
    assert_eq!(j["stderr_bytes"], 4);
    // The run's wall time covers the payload's 200 ms sleep and lies within the time this test
    // saw palisade take: both hold on a host however busy (monotonic clocks, no window).
    let wall = j["wall_time_ms"].as_f64().unwrap();
    assert!(
        (200.0..=outside).contains(&wall),
        "wall time {wall} ms for a run with a 200 ms sleep that took {outside} ms from outside"
    );
    // Its CPU time is the processes' (a shell, a sleep): no more than the wall time on every CPU.
    let cpu = j["cpu_user_ms"].as_f64().unwrap() + j["cpu_system_ms"].as_f64().unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    assert!(
        cpu > 0.0 && cpu <= wall * cpus,
        "{cpu} ms of CPU in {wall} ms"
    );
    let layers = j["layers"].as_array().unwrap();
    let enforced = |n: &str| {
        layers
            .iter()
            .find(|l| l["name"] == n)
            .map(|l| l["enforced"].as_bool().unwrap())
    };
    for n in [
        "user-namespace",
        "mount-namespace",
        "pid-namespace",
        "network-namespace",
        "capabilities",
        "no-new-privs",
    ] {
        assert_eq!(enforced(n), Some(true), "{n}");
    }
    assert_eq!(enforced("seccomp"), Some(true));
    assert_eq!(enforced("landlock"), Some(true));
    assert_eq!(
        enforced("egress-proxy"),
        Some(false),
        "without allow rules the proxy does not run, and the report must not claim it"
    );
    assert_eq!(r.stderr, "err\n");
}

#[test]
fn a_sandbox_error_is_never_the_programs_result() {
    let d = TempDir::new("err");
    let rep = d.path().join("r.json");
    let r = run(
        &[
            "--json",
            &rep.display().to_string(),
            "--ro",
            "/nonexistent/x",
        ],
        &["true"],
    );
    assert_eq!(r.code, 125);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
    assert_eq!(j["status"], "sandbox-error");
    assert!(j["error"].as_str().unwrap().contains("/nonexistent/x"));
}

#[test]
fn keep_leaves_the_scratch_directory_and_reports_it() {
    let r = run(&["--keep", "--json", "-"], &["/probe", "write", "kept.txt"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j = r.report();
    let dir =
        std::path::PathBuf::from(j["scratch"].as_str().expect("the kept scratch is reported"));
    assert!(dir.join("kept.txt").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn landlock_can_be_waived_by_name_and_the_help_says_so() {
    // The waiver only matters on a kernel without Landlock: here the layer is enforced anyway.
    let r = run(&["--allow-degraded", "landlock", "--json", "-"], &["true"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j = r.report();
    let layer = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "landlock")
        .cloned()
        .unwrap();
    assert_eq!(layer["enforced"], true, "{layer}");
    let r = run(&["--allow-degraded", "landlocks"], &["true"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr.contains("landlocks") && r.stderr.contains("cgroup, landlock"),
        "{}",
        r.stderr
    );
    let help = std::process::Command::new(palisade_bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("landlock (the"), "{help}");
}

fn doctor_json(cmd: &mut std::process::Command) -> (i32, serde_json::Value) {
    let o = cmd.output().expect("palisade doctor could not be started");
    let j = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o.status.code().unwrap_or(-1), j)
}

fn row<'a>(j: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} row: {j}"))
}

#[test]
fn doctor_matches_what_a_run_really_gets() {
    let (code, j) =
        doctor_json(std::process::Command::new(palisade_bin()).args(["doctor", "--json"]));
    assert_eq!(code, 0, "{j}");
    assert_eq!(j["healthy"], true);
    for name in [
        "kernel",
        "user-namespaces",
        "landlock",
        "seccomp",
        "core-dumps",
        "cgroup",
        "trial-run",
    ] {
        assert_eq!(row(&j, name)["verdict"], "ok", "{name}: {j}");
    }
    // The host's own core pattern, named (tests/core_dumps.rs sets others, as root).
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let core = row(&j, "core-dumps")["detail"].as_str().unwrap().to_owned();
    assert!(
        core.contains(&format!("{:?}", pattern.trim_end())),
        "{core}"
    );
    // The same Landlock ABI and cgroup version as a real run reports.
    let r = run(&["--json", "-"], &["true"]);
    let rep = r.report();
    let abi = rep["landlock_abi"].as_u64().unwrap();
    let ll = row(&j, "landlock")["detail"].as_str().unwrap().to_owned();
    assert!(ll.starts_with(&format!("ABI {abi}:")), "{ll} vs ABI {abi}");
    let cg = row(&j, "cgroup")["detail"].as_str().unwrap().to_owned();
    assert!(
        cg.starts_with(&format!("cgroup {} ", rep["cgroup"].as_str().unwrap())),
        "{cg}"
    );
}

/// A host where user namespaces are switched off, made safely: a throwaway user namespace whose
/// own `user.max_user_namespaces` is 0 (the machine's setting is untouched). `doctor` names the
/// cause and the fix, and `run` refuses with the same explanation.
#[test]
fn with_user_namespaces_off_doctor_explains_and_run_refuses() {
    let unshare = "/usr/bin/unshare";
    assert!(
        std::path::Path::new(unshare).exists(),
        "unshare (util-linux) is missing: run .ci/setup"
    );
    let inner = |args: &str| {
        let mut c = std::process::Command::new(unshare);
        c.args(["-Ur", "sh", "-c"]).arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec {} {args}",
            palisade_bin().display()
        ));
        c
    };
    let (code, j) = doctor_json(&mut inner("doctor --json"));
    assert_eq!(code, 1, "{j}");
    assert_eq!(j["healthy"], false);
    let u = row(&j, "user-namespaces");
    assert_eq!(u["verdict"], "fail", "{u}");
    assert!(
        u["fix"]
            .as_str()
            .unwrap()
            .contains("user.max_user_namespaces"),
        "{u}"
    );
    assert_eq!(row(&j, "trial-run")["verdict"], "fail");
    let o = inner("run -q -- true").output().unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("max_user_namespaces"), "{err}");
    // Control: the same wrapper without the sysctl change runs fine, with its cgroup: as root of
    // a user namespace, palisade uses the cgroups delegated to the uid that namespace maps 0 to.
    let o = std::process::Command::new(unshare)
        .args(["-Ur"])
        .arg(palisade_bin())
        .args(["run", "-q", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The help texts, whole, against the committed snapshots in `tests/snapshots/` (a doc comment
/// once slid onto the wrong subcommand and nobody saw it). After an intended change, refresh them
/// with `PALISADE_UPDATE_SNAPSHOTS=1 cargo test -p palisade-cli --test cli help`.
#[test]
fn help_texts_match_their_snapshots() {
    // Compiled in, so that the test binary checks them wherever it runs (the VM matrix copies
    // test binaries into a guest without the source tree).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    for (file, want, args) in [
        (
            "help.txt",
            include_str!("snapshots/help.txt"),
            &["--help"][..],
        ),
        (
            "help-run.txt",
            include_str!("snapshots/help-run.txt"),
            &["run", "--help"][..],
        ),
        (
            "help-doctor.txt",
            include_str!("snapshots/help-doctor.txt"),
            &["doctor", "--help"][..],
        ),
        (
            "help-cgroup-delegate.txt",
            include_str!("snapshots/help-cgroup-delegate.txt"),
            &["cgroup-delegate", "--help"][..],
        ),
        (
            "help-policy.txt",
            include_str!("snapshots/help-policy.txt"),
            &["policy", "--help"][..],
        ),
        (
            "help-serve.txt",
            include_str!("snapshots/help-serve.txt"),
            &["serve", "--help"][..],
        ),
    ] {
        let o = std::process::Command::new(palisade_bin())
            .args(args)
            .env("COLUMNS", "100")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "palisade {args:?}");
        let got = String::from_utf8(o.stdout).expect("help is UTF-8");
        if std::env::var_os("PALISADE_UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(dir.join(file), &got).unwrap();
            continue;
        }
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            panic!(
                "palisade {args:?} differs from tests/snapshots/{file} at line {}:\n  now:      {:?}\n  snapshot: {:?}\n(after an intended change: PALISADE_UPDATE_SNAPSHOTS=1 cargo test -p palisade-cli --test cli help, then rebuild)",
                line + 1,
                got.lines().nth(line),
                want.lines().nth(line)
            );
        }
    }
    // Every subcommand has its own description, not an empty one.
    let top = include_str!("snapshots/help.txt");
    for cmd in ["run ", "doctor ", "cgroup-delegate ", "policy ", "serve "] {
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with(cmd))
            .unwrap_or_else(|| panic!("no `{cmd}` line in:\n{top}"));
        assert!(
            line.trim().len() > cmd.len() + 10,
            "`{cmd}` has no description: {line}"
        );
    }
    let doctor = top
        .lines()
        .find(|l| l.trim_start().starts_with("doctor "))
        .unwrap();
    assert!(doctor.contains("Check what this host"), "{doctor}");
}
