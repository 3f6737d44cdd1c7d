//! Crashes inside against the host's `kernel.core_pattern` (audit F8). With a pipe pattern (apport,
//! systemd-coredump) the kernel starts the helper as root on the host and streams it the crashing
//! process's memory, whatever `RLIMIT_CORE` says — except at exactly 1, which palisade pins.
//!
//! A test binary of its own: these tests change a host-wide sysctl for a moment, and no other test
//! of this binary may crash meanwhile. They run one at a time (a lock), and the old pattern comes
//! back when the guard is dropped, an assertion failing included. Only root may set the pattern: as
//! another user they say so and check nothing here (the pinned limit itself is tested for every
//! user in `boundary.rs`, `the_core_limit_stays_at_one_whatever_the_payload_does`).

mod common;
use common::*;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::sync::Mutex;

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

/// One test at a time changes the pattern.
static PATTERN_LOCK: Mutex<()> = Mutex::new(());

/// `kernel.core_pattern` set to a test value for as long as this lives.
struct CorePattern {
    old: String,
}

impl CorePattern {
    fn set(pattern: &str) -> CorePattern {
        let old = std::fs::read_to_string(CORE_PATTERN).expect("kernel.core_pattern is readable");
        let old = old.trim_end_matches('\n').to_owned();
        let guard = CorePattern { old };
        std::fs::write(CORE_PATTERN, pattern)
            .unwrap_or_else(|e| panic!("setting kernel.core_pattern to {pattern:?}: {e}"));
        guard
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(CORE_PATTERN, &self.old) {
            // Not a panic: this may run while a failed assertion unwinds.
            eprintln!(
                "!!! kernel.core_pattern could not be restored to {:?}: {e}; restore it by hand",
                self.old
            );
        }
    }
}

fn root_only(test: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    // Straight to the descriptor, past the test harness's capture: a skip is always shown.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: only root can set kernel.core_pattern (uid {})",
        euid()
    );
    false
}

/// A helper that writes its arguments to `log` first, then takes the core: the kernel finishes a
/// dump (larger than a pipe's buffer) only after the helper has read it, so once the crashed
/// process is gone, a helper that ran has written its line.
fn helper(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let log = dir.path().join("helper.log");
    let helper = dir.path().join("helper");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec cat > /dev/null\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    (helper, log)
}

/// The crash of a payload that first lowers its core limit every way it can (the probe's
/// `setrlimit`, `prlimit64`; the shell's `ulimit -c 0`) never reaches a pipe helper; the same
/// crash outside does.
#[test]
fn a_pipe_core_pattern_never_gets_a_crash_from_inside() {
    if !root_only("a_pipe_core_pattern_never_gets_a_crash_from_inside") {
        return;
    }
    let _one = PATTERN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("core-pipe");
    let (helper, log) = helper(&dir);
    // Names the crashing processes take (`comm`, 15 bytes at most), so that a crash elsewhere on
    // the machine during the test cannot be mistaken for ours.
    let id = std::process::id();
    let (inside, inside_sh, outside) =
        (format!("pin{id}"), format!("psh{id}"), format!("pout{id}"));
    let (r, r_sh, control) = {
        let _pattern = CorePattern::set(&format!("|{} %e %u %c", helper.display()));
        let r = probe(&[], &["core-limit", "crash", &inside]);
        let r_sh = run(
            &[],
            &[
                "/bin/sh",
                "-c",
                &format!("ulimit -c 0 && exec /probe core-limit crash {inside_sh}"),
            ],
        );
        let control = std::process::Command::new(probe_bin())
            .args(["core-limit", "crash", &outside])
            .output()
            .unwrap();
        (r, r_sh, control)
    };
    // The control's line is there once its process is gone (see `helper`); wait for it all the
    // same, generously, on a busy machine.
    let mut logged = String::new();
    for _ in 0..300 {
        logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged
            .lines()
            .any(|l| l.starts_with(&format!("{outside} ")))
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        logged
            .lines()
            .any(|l| l == format!("{outside} {} 0", euid())),
        "control: the helper never ran for a crash outside the sandbox (with RLIMIT_CORE 0), so \
         this test could not see one inside: {logged:?}"
    );
    for name in [&inside, &inside_sh] {
        assert!(
            !logged.contains(name.as_str()),
            "a crash inside the sandbox reached the host's core helper: {logged:?}"
        );
    }
    // Each crashed with SIGSEGV, after lowering what it could.
    assert_eq!(r.code, 128 + libc::SIGSEGV, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.probe("core-limit now"), "ok soft=1 hard=1");
    assert_eq!(
        r_sh.code,
        128 + libc::SIGSEGV,
        "{}{}",
        r_sh.stdout,
        r_sh.stderr
    );
    assert_eq!(r_sh.probe("core-limit now"), "ok soft=1 hard=1");
    assert_eq!(control.status.signal(), Some(libc::SIGSEGV));
}

/// `palisade doctor` tells what the host's pattern means for a sandbox: a file pattern and a pipe
/// are kept out (ok), a core-dump socket (Linux 6.16) gets every crash whatever the limit (warn,
/// with the fix).
#[test]
fn doctor_names_the_core_pattern_and_what_it_means_for_a_sandbox() {
    if !root_only("doctor_names_the_core_pattern_and_what_it_means_for_a_sandbox") {
        return;
    }
    let _one = PATTERN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let row = |pattern: &str| -> serde_json::Value {
        let _pattern = CorePattern::set(pattern);
        let o = std::process::Command::new(palisade_bin())
            .args(["doctor", "--json"])
            .output()
            .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json");
        j["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "core-dumps")
            .unwrap_or_else(|| panic!("no core-dumps row: {j}"))
            .clone()
    };
    let dir = TempDir::new("core-doctor");
    let pipe = row(&format!("|{}/helper %p", dir.s()));
    assert_eq!(pipe["verdict"], "ok", "{pipe}");
    let detail = pipe["detail"].as_str().unwrap();
    assert!(
        detail.contains("pipes crashes") && detail.contains("pinned at 1"),
        "{pipe}"
    );
    let file = row("core");
    assert_eq!(file["verdict"], "ok", "{file}");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let v: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .take(2)
        .collect();
    if (v[0], v[1]) >= (6, 16) {
        let socket = row(&format!("@{}/coredump.socket", dir.s()));
        assert_eq!(socket["verdict"], "warn", "{socket}");
        assert!(
            socket["fix"]
                .as_str()
                .unwrap()
                .contains("kernel.core_pattern=core"),
            "{socket}"
        );
    }
}
