//! The engines (docs/engine.md), attacked from inside: a sandbox started by palisade's exec'd init
//! program holds nothing of its caller, and one started by a template's zygote is as isolated as
//! a cold one and from every other run of the template. Run as root and as an unprivileged user.
//!
//! The init program is the real `palisade` binary (`PALISADE_BIN`, or the one cargo built); the
//! probe is bound in at `/probe`.

mod common;
use common::*;
use palisade::policy::{Bind, Policy};
use palisade::{Engine, Sandbox, Status};
use std::sync::{Mutex, MutexGuard};

/// Tests that measure this process (its memory, its descriptors, its children) take turns.
fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A policy running `sh -c script` with the probe bound at `/probe`.
fn policy(script: &str) -> Policy {
    let mut p = Policy::new(["/bin/sh", "-c", script]).unwrap();
    p.binds
        .push(Bind::parse(&format!("{}:/probe", probe_bin().display()), false).unwrap());
    p
}

fn exec_engine() -> Engine {
    Engine::InitProgram(palisade_bin())
}

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
