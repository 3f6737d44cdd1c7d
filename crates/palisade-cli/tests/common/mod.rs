//! Helpers for the boundary tests: run the real `palisade` binary with the real probe inside.
//! [`serve`] is the harness of the tests of `palisade serve` and `palisade mcp`.
// Every test binary of this crate compiles this module as its own copy and uses a part of it: what
// one binary leaves unused is used by another, not dead.
#![allow(dead_code)]

pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

/// One test of a binary at a time, for tests that measure this process (its memory, descriptors,
/// threads, children) or own templates whose zygotes are its children: another test's runs in
/// flight would blur them. Each test binary has its own lock.
pub fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `p` with the probe bound read-only at `/probe`.
pub fn with_probe(mut p: palisade::policy::Policy) -> palisade::policy::Policy {
    p.binds.push(
        palisade::policy::Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap(),
    );
    p
}

/// A policy running `sh -c script` with the probe bound at `/probe`.
pub fn probe_sh(script: &str) -> palisade::policy::Policy {
    with_probe(palisade::policy::Policy::new(["/bin/sh", "-c", script]).unwrap())
}

/// The exec engine with this build's `palisade` as the init program.
pub fn exec_engine() -> palisade::Engine {
    palisade::Engine::InitProgram(palisade_bin())
}

/// A template of `p` (the probe bound at `/probe`) made by palisade's init program.
pub fn probe_template(p: palisade::policy::Policy) -> palisade::Template {
    palisade::Sandbox::from_policy(with_probe(p))
        .unwrap()
        .engine(exec_engine())
        .prepare()
        .expect("a template")
}

/// The `palisade` binary: `PALISADE_BIN` (CI copies binaries where an unprivileged user can read
/// them) or the one cargo built for this test.
pub fn palisade_bin() -> PathBuf {
    std::env::var_os("PALISADE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_palisade").into())
}

/// The probe binary, which the tests bind into the sandbox at `/probe`: `PALISADE_PROBE`, or the
/// one `cargo build` left beside the test executables (`target/debug/palisade-probe`; it is a
/// package of its own, so that its `unsafe` stays out of the library and the CLI).
pub fn probe_bin() -> PathBuf {
    let p: PathBuf = std::env::var_os("PALISADE_PROBE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the test's own path");
            // target/debug/deps/<test> -> target/debug/palisade-probe
            exe.parent()
                .and_then(|d| d.parent())
                .expect("the test runs from target/<profile>/deps")
                .join("palisade-probe")
        });
    assert!(
        p.exists(),
        "the probe binary {} is missing: the boundary tests cannot run without it \
         (build it with `cargo build -p palisade-probe`, or set PALISADE_PROBE)",
        p.display()
    );
    p
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The result of the probe line for `what`, e.g. `denied EROFS`; panics if the probe printed no
    /// such line (it could not run, which must fail the test, never pass it).
    pub fn probe(&self, what: &str) -> String {
        let prefix = format!("probe {what}: ");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| {
                panic!(
                    "the probe printed no `{what}` line\nexit {}\nstdout:\n{}\nstderr:\n{}",
                    self.code, self.stdout, self.stderr
                )
            })
            .to_owned()
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&o.status).unwrap_or(0)
            }),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// `palisade run -q --no-tty --ro PROBE:/probe <opts> -- <cmd>`.
impl Run {
    /// The JSON report (`--json -`), which palisade writes after the command's output: the last
    /// line that opens an object, or the whole stdout when the command printed nothing.
    pub fn report(&self) -> serde_json::Value {
        let start = self
            .stdout
            .rfind("\n{")
            .map(|i| i + 1)
            .or_else(|| self.stdout.find('{'))
            .unwrap_or_else(|| panic!("no JSON report on stdout: {}", self.stdout));
        serde_json::from_str(&self.stdout[start..]).expect("the report is JSON")
    }
}

pub fn command(opts: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(palisade_bin());
    let probe = format!("{}:/probe", probe_bin().display());
    c.args(["run", "-q", "--no-tty", "--ro", &probe])
        .args(opts)
        .arg("--")
        .args(cmd);
    c.stdin(Stdio::null());
    c
}

pub fn run(opts: &[&str], cmd: &[&str]) -> Run {
    command(opts, cmd)
        .output()
        .expect("palisade could not be started")
        .into()
}

/// `palisade ARGS` with the change sets kept in `store`.
pub fn cli(store: &Path, args: &[&str]) -> Run {
    Command::new(palisade_bin())
        .args(args)
        .env("PALISADE_CHANGES_DIR", store)
        .stdin(Stdio::null())
        .output()
        .expect("palisade could not be started")
        .into()
}

/// `palisade run --workspace DIR -- ARGV` with the change sets kept in `store`; the id of the
/// change set it kept (the run must exit 0).
pub fn run_in_workspace(store: &Path, dir: &Path, argv: &[&str]) -> String {
    let d = dir.display().to_string();
    let mut args = vec![
        "run",
        "-q",
        "--no-tty",
        "--json",
        "-",
        "--workspace",
        &d,
        "--",
    ];
    args.extend_from_slice(argv);
    let r = cli(store, &args);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    r.report()["workspace"]["change_set"]
        .as_str()
        .unwrap_or_else(|| panic!("no change set: {}\n{}", r.stdout, r.stderr))
        .to_owned()
}

/// A program CI's setup installs with `script` (a Python venv, npm packages): `rel` under the
/// directory the variable `var` names, else under `default`. A missing one fails the test, and
/// says how to install it.
pub fn ci_tool(var: &str, default: &str, rel: &str, script: &str) -> PathBuf {
    let dir = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    let p = dir.join(rel);
    assert!(
        p.exists(),
        "{} is missing: run {script} (CI's setup does)",
        p.display()
    );
    p
}

/// `run` with the probe as the command.
pub fn probe(opts: &[&str], args: &[&str]) -> Run {
    let mut cmd = vec!["/probe"];
    cmd.extend_from_slice(args);
    run(opts, &cmd)
}

/// A fresh directory under the system temp dir, owned by the test's user, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::temp_dir();
        for i in 0..1000 {
            let p = base.join(format!("palisade-test-{tag}-{}-{i}", std::process::id()));
            if std::fs::create_dir(&p).is_ok() {
                return TempDir(p);
            }
        }
        panic!(
            "no temporary directory could be created under {}",
            base.display()
        );
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
    pub fn s(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The invoking user's home directory, from the password database.
pub fn home_dir() -> PathBuf {
    // SAFETY: getpwuid returns a pointer into static storage or NULL; we copy the string at once
    // in this single call site.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        assert!(!pw.is_null(), "the test's user has no password entry");
        PathBuf::from(
            std::ffi::CStr::from_ptr((*pw).pw_dir)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

pub fn euid() -> u32 {
    // SAFETY: trivially safe.
    unsafe { libc::geteuid() }
}

/// Host pids whose command line (arguments separated by NUL) satisfies `pred`.
pub fn host_pids_where(pred: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if pred(&c) {
                v.push(pid);
            }
        }
    }
    v
}

/// Host pids whose command line contains `marker`.
pub fn host_pids_with(marker: &str) -> Vec<u32> {
    host_pids_where(|c| String::from_utf8_lossy(c).contains(marker))
}

/// Host pids whose command line starts with `prefix`.
pub fn host_pids_starting(prefix: &str) -> Vec<u32> {
    host_pids_where(|c| c.starts_with(prefix.as_bytes()))
}

pub fn unique(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{}-{n}", std::process::id())
}

/// Every entry under `dir` with its kind, permission bits and contents (or link target).
pub fn tree(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fn walk(root: &Path, rel: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = rel.join(&n);
            let full = root.join(&p);
            let m = std::fs::symlink_metadata(&full).unwrap();
            let mode = std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777;
            let key = p.display().to_string();
            let ft = m.file_type();
            if ft.is_symlink() {
                let t = std::fs::read_link(&full).unwrap();
                out.insert(key, format!("link -> {}", t.display()));
            } else if ft.is_dir() {
                out.insert(key, format!("dir {mode:o}"));
                walk(root, &p, out);
            } else if ft.is_file() {
                let c = std::fs::read(&full).unwrap();
                out.insert(
                    key,
                    format!("file {mode:o} {:?}", String::from_utf8_lossy(&c)),
                );
            } else {
                out.insert(key, format!("special {mode:o}"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, Path::new(""), &mut out);
    out
}

/// What a script in the sandbox printed after `key: ` on a line of its own; panics if it printed
/// no such line (it did not get that far, which must fail the test).
pub fn said(r: &Run, key: &str) -> String {
    let prefix = format!("{key}: ");
    r.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| {
            panic!(
                "the script printed no `{key}` line\nexit {}\nstdout:\n{}\nstderr:\n{}",
                r.code, r.stdout, r.stderr
            )
        })
        .to_owned()
}

/// The egress decisions of a run's JSON report (`network.events`).
pub fn events(r: &Run) -> Vec<serde_json::Value> {
    r.report()["network"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}
