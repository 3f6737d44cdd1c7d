//! Attacks on a run's files (`Io::files`, a server request's `files`, docs/engine.md "A run's
//! files"): the sandbox's init writes them under the working directory before the payload starts.
//! Real sandboxes, as root and as the unprivileged test user.

mod common;
use common::serve::{assert_nothing_held, Server, POLICY};
use common::*;
use common::{probe_sh as policy, probe_template as template};
use palisade::policy::{Policy, Scratch};
use palisade::{Engine, FileIn, Io, Sandbox, Status};
use serde_json::json;

fn file(path: &str, data: &[u8], mode: u32) -> FileIn {
    FileIn {
        path: path.into(),
        data: data.to_vec(),
        mode,
    }
}

fn io(files: Vec<FileIn>) -> Io {
    Io {
        files,
        ..Io::default()
    }
}

/// Host processes holding the files' memfd (`memfd:palisade-files`).
fn memfd_holders() -> Vec<(u32, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(l) = std::fs::read_link(fd.path()) {
                let l = l.display().to_string();
                if l.contains("palisade-files") {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    v.push((pid, format!("{l} {}", String::from_utf8_lossy(&cmd))));
                }
            }
        }
    }
    v
}

// ---- The server: what its checks pass, the engine must write. ----

/// A path the server's check accepts (it drops empty components: `sub//a.txt`, `b/`) was written
/// by the agent before; the direct run must write it too, or refuse it as a bad request.
#[test]
fn server_paths_with_empty_components_are_written_or_refused_up_front() {
    let s = Server::start(POLICY, &[]);
    for path in ["sub//a.txt", "b.txt/"] {
        let r = s.post(
            "/v1/run",
            &json!({
                "language": "python",
                "code": "import os\nprint(sorted(os.listdir('.')))",
                "files": {path: "hello"},
            }),
        );
        let j = r.json();
        assert_eq!(
            (r.status, j["status"].as_str()),
            (200, Some("ok")),
            "{path}: {j}"
        );
        let top = path.split('/').next().unwrap();
        assert!(
            j["stdout"]["data"]
                .as_str()
                .unwrap_or_default()
                .contains(top),
            "{path}: {j}"
        );
    }
    // Two names of one path, or a file where another's directory goes: refused up front.
    for files in [
        json!({"a//b": "1", "a/b": "2"}),
        json!({"a": "1", "a/b": "2"}),
        json!({"main.py/x": "1"}),
    ] {
        let r = s.post(
            "/v1/run",
            &json!({"language": "python", "code": "print(1)", "files": files}),
        );
        let j = r.json();
        assert_eq!(r.status, 400, "{files}: {j}");
        assert!(
            j["error"]["field"]
                .as_str()
                .unwrap_or_default()
                .starts_with("files"),
            "{files}: {j}"
        );
    }
    assert_nothing_held(s.pid());
}

/// As many files as the server allows (4096), with short names, in one run: the server's own
/// limit passes, so the run must be written, not fail inside the engine.
#[test]
fn server_4095_files_with_short_names_run() {
    let s = Server::start(POLICY, &[]);
    let mut files = serde_json::Map::new();
    for i in 0..4095 {
        files.insert(format!("inputs/case-{i:04}.txt"), json!(format!("{i}")));
    }
    let r = s.post(
        "/v1/run",
        &json!({
            "language": "python",
            "code": "import os\nprint(len(os.listdir('inputs')))",
            "files": files,
        }),
    );
    let j = r.json();
    assert_eq!(r.status, 200, "{j}");
    assert_eq!(j["status"], "ok", "{j}");
    assert_eq!(j["stdout"]["data"], "4095\n", "{j}");
    assert_nothing_held(s.pid());
}

/// 4096 files is the server's own limit for `files`; with `code` the server adds the language's
/// file, 4097 in all, past the engine's 4096: a request the server accepts, failing in the engine.
/// Names short enough that the template's record is no limit here.
#[test]
fn server_4096_files_and_code_run() {
    let s = Server::start(POLICY, &[]);
    let mut files = serde_json::Map::new();
    for i in 0..4096 {
        files.insert(format!("{i}"), json!(""));
    }
    let r = s.post(
        "/v1/run",
        &json!({
            "language": "python",
            "code": "import os\nprint(len(os.listdir('.')))",
            "files": files,
        }),
    );
    let j = r.json();
    // More than a run's files take: through the agent, as before it.
    assert_eq!((r.status, j["status"].as_str()), (200, Some("ok")), "{j}");
    assert_eq!(j["stdout"]["data"], "4097\n", "{j}");
    assert_nothing_held(s.pid());
}

// ---- The engine ----

/// Files larger than the scratch tmpfs fail the run as palisade's error naming the file, in every
/// engine; the payload never runs.
#[test]
fn files_past_the_scratch_size_fail_naming_the_file() {
    let _one = serial();
    let d = TempDir::new("fbig");
    let marker = d.path().join("ran");
    let mut p = policy(&format!("touch {}", marker.display()));
    p.limits.scratch_bytes = 1 << 20;
    let mut tp = Policy::new(["true"]).unwrap();
    tp.limits.scratch_bytes = 1 << 20;
    let files = || {
        vec![
            file("small.txt", b"x", 0o644),
            file("big/blob.bin", &vec![7u8; 2 << 20], 0o644),
        ]
    };
    let t = template(tp);
    let runs = [
        (
            "in-process",
            Sandbox::from_policy(p.clone())
                .unwrap()
                .engine(Engine::InProcess)
                .start(io(files()))
                .wait_output(),
        ),
        (
            "exec",
            Sandbox::from_policy(p.clone())
                .unwrap()
                .engine(exec_engine())
                .start(io(files()))
                .wait_output(),
        ),
        (
            "template",
            t.start(
                ["/bin/sh", "-c", &format!("touch {}", marker.display())],
                &[],
                io(files()),
            )
            .wait_output(),
        ),
    ];
    for (name, o) in runs {
        assert_eq!(
            o.report.status,
            Status::SandboxError,
            "{name}: {:?}",
            o.report
        );
        let e = o.report.error.clone().unwrap_or_default();
        assert!(e.contains("big/blob.bin"), "{name}: {e}");
    }
    assert!(!marker.exists());
    assert!(memfd_holders().is_empty(), "{:?}", memfd_holders());
}

/// The largest plan the checks pass (4096 files, paths of up to 4096 bytes) in the exec engine and
/// a template: either written or refused naming `files`.
#[test]
fn many_long_paths_are_written_or_refused_naming_files() {
    let _one = serial();
    let long = |i: usize| format!("{}/{i:04}", "d".repeat(200));
    let files: Vec<FileIn> = (0..4096).map(|i| file(&long(i), b"x", 0o644)).collect();
    let script = "ls /workspace/d* | wc -l";
    let t = template(Policy::new(["true"]).unwrap());
    let runs = [
        (
            "exec",
            Sandbox::from_policy(policy(script))
                .unwrap()
                .engine(exec_engine())
                .start(io(files.clone()))
                .wait_output(),
        ),
        (
            "template",
            t.start(["/bin/sh", "-c", script], &[], io(files.clone()))
                .wait_output(),
        ),
    ];
    for (name, o) in runs {
        if o.report.status == Status::Ok {
            assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "4096", "{name}");
        } else {
            let e = o.report.error.clone().unwrap_or_default();
            assert!(e.contains("files"), "{name}: {:?}", o.report);
        }
    }
}

/// No process on the host holds the files' memfd once the payload runs: not the supervisor (this
/// process), not the sandbox's init, not a template's zygote.
#[test]
fn no_process_holds_the_files_memfd_while_the_payload_runs() {
    let _one = serial();
    let files = || vec![file("a.txt", b"secret bytes", 0o600)];
    let t = template(Policy::new(["true"]).unwrap());
    let script = "ls -l /proc/self/fd; sleep 3";
    let runs: Vec<(&str, palisade::Run)> = vec![
        (
            "in-process",
            Sandbox::from_policy(policy(script))
                .unwrap()
                .engine(Engine::InProcess)
                .start(io(files())),
        ),
        (
            "exec",
            Sandbox::from_policy(policy(script))
                .unwrap()
                .engine(exec_engine())
                .start(io(files())),
        ),
        (
            "template",
            t.start(["/bin/sh", "-c", script], &[], io(files())),
        ),
    ];
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let holders = memfd_holders();
    for (name, r) in runs {
        let o = r.wait_output();
        assert_eq!(o.report.status, Status::Ok, "{name}: {:?}", o.report);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("memfd"), "{name}: {out}");
    }
    assert!(holders.is_empty(), "{holders:?}");
}

/// Paths of every shape the checks pass: unicode, newlines, backslashes, 255-byte names, a path
/// of 2048 components; written exactly where named.
#[test]
fn odd_paths_land_where_named() {
    let _one = serial();
    let deep = vec!["a"; 900].join("/") + "/z";
    let odd = [
        "ünï/çødé.txt".to_string(),
        "new\nline".into(),
        "back\\slash".into(),
        " lead space".into(),
        "-dash".into(),
        "n".repeat(255),
        deep.clone(),
    ];
    let files: Vec<FileIn> = odd.iter().map(|p| file(p, p.as_bytes(), 0o644)).collect();
    let d = TempDir::new("fodd");
    let scratch = d.path().join("s");
    std::fs::create_dir(&scratch).unwrap();
    let mut p = Policy::new(["true"]).unwrap();
    p.scratch = Scratch::Host {
        path: scratch.clone(),
    };
    let t = template(p.clone());
    for name in ["cold", "template"] {
        let o = match name {
            "cold" => Sandbox::from_policy(p.clone())
                .unwrap()
                .start(io(files.clone()))
                .wait_output(),
            _ => t.start(["true"], &[], io(files.clone())).wait_output(),
        };
        assert_eq!(o.report.status, Status::Ok, "{name}: {:?}", o.report);
        for path in &odd {
            assert_eq!(
                std::fs::read(scratch.join(path))
                    .unwrap_or_else(|e| panic!("{name} {path:?}: {e}")),
                path.as_bytes(),
                "{name}"
            );
        }
        // Emptied, not replaced: the template holds the directory it was prepared with.
        for e in std::fs::read_dir(&scratch).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
}

/// Traps left in a host scratch directory where a file or one of its directories goes: a unix
/// socket, a directory where the file goes, a file where a directory goes, a mount (tmpfs) where a
/// directory goes and a file bind-mounted over a name (root only), a device node (root only). Each
/// fails the run naming the file; nothing outside the scratch changes, and the run after writes.
#[test]
fn traps_in_a_host_scratch_fail_the_run_naming_the_file() {
    let _one = serial();
    let d = TempDir::new("ftraps");
    let outside = TempDir::new("ftraps-out");
    std::fs::write(outside.path().join("target"), "host\n").unwrap();
    let scratch = d.path().join("s");
    std::fs::create_dir(&scratch).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(scratch.join("sock")).unwrap();
    std::fs::create_dir(scratch.join("isdir")).unwrap();
    std::fs::write(scratch.join("isfile"), "x").unwrap();
    let root = euid() == 0;
    let mut paths = vec!["sock", "isdir", "isfile/x"];
    let cstr =
        |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut mounted = Vec::new();
    if root {
        std::fs::create_dir(scratch.join("mnt")).unwrap();
        std::fs::write(scratch.join("bound"), "in scratch\n").unwrap();
        // SAFETY: NUL-terminated strings.
        unsafe {
            assert_eq!(
                libc::mount(
                    c"tmpfs".as_ptr(),
                    cstr(&scratch.join("mnt")).as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null()
                ),
                0
            );
            assert_eq!(
                libc::mount(
                    cstr(&outside.path().join("target")).as_ptr(),
                    cstr(&scratch.join("bound")).as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null()
                ),
                0
            );
            assert_eq!(
                libc::mknod(
                    cstr(&scratch.join("null")).as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(1, 3)
                ),
                0
            );
        }
        mounted.push(scratch.join("mnt"));
        mounted.push(scratch.join("bound"));
        paths.extend(["mnt/x", "bound", "null"]);
    }
    let mut p = Policy::new(["true"]).unwrap();
    p.scratch = Scratch::Host {
        path: scratch.clone(),
    };
    let t = template(p.clone());
    let mut failures = Vec::new();
    for path in &paths {
        let files = || vec![file(path, b"from the run\n", 0o644)];
        for (name, o) in [
            (
                "cold",
                Sandbox::from_policy(p.clone())
                    .unwrap()
                    .start(io(files()))
                    .wait_output(),
            ),
            (
                "template",
                t.start(["true"], &[], io(files())).wait_output(),
            ),
        ] {
            let e = o.report.error.clone().unwrap_or_default();
            if o.report.status != Status::SandboxError
                || !e.contains(&format!("write the run's file {path}"))
            {
                failures.push(format!("{name} {path}: {:?} {e}", o.report.status));
            }
        }
    }
    let target = std::fs::read_to_string(outside.path().join("target")).unwrap();
    let mnt_x = scratch.join("mnt/x").exists();
    for m in mounted.iter().rev() {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(cstr(m).as_ptr(), libc::MNT_DETACH) };
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(target, "host\n");
    assert!(!mnt_x);
    let o = t
        .start(["true"], &[], io(vec![file("plain", b"ok", 0o644)]))
        .wait_output();
    assert_eq!(o.report.status, Status::Ok, "{:?}", o.report);
}

/// Two runs of one template share a host scratch directory: the first (still running) keeps
/// swapping a directory and a file of the second's for symbolic links to a host directory and a
/// host file, the second writes its files there again and again. The host never changes: each
/// write lands in the scratch or fails the run naming the file.
#[test]
fn a_running_payload_racing_another_runs_files_never_redirects_them() {
    let _one = serial();
    let d = TempDir::new("frace");
    let outside = TempDir::new("frace-out");
    // The host side, which the first run cannot see: links to it are only names.
    std::fs::write(outside.path().join("target"), "host\n").unwrap();
    // Readable and writable by the unprivileged user too: only the links stand in the way.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(
        outside.path().join("target"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let scratch = d.path().join("s");
    std::fs::create_dir(&scratch).unwrap();
    let mut p = Policy::new(["true"]).unwrap();
    p.scratch = Scratch::Host {
        path: scratch.clone(),
    };
    let t = template(p);
    let out = outside.path().display().to_string();
    let racer = format!(
        "cd /workspace; end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do \
         for i in 1 2 3 4 5 6 7 8 9 10; do \
         rm -rf d main.py; ln -s {out} d; ln -s {out}/target main.py; \
         rm -f d main.py; mkdir d; echo x > main.py; done; done"
    );
    let a = t.start(["/bin/sh", "-c", &racer], &[], Io::default());
    let start = std::time::Instant::now();
    let (mut ok, mut refused, mut other) = (0, 0, Vec::new());
    while start.elapsed() < std::time::Duration::from_secs(7) {
        let files = vec![
            file("d/x", b"from the run\n", 0o644),
            file("main.py", b"from the run\n", 0o644),
        ];
        let o = t.start(["true"], &[], io(files)).wait_output();
        let e = o.report.error.clone().unwrap_or_default();
        match o.report.status {
            Status::Ok => ok += 1,
            Status::SandboxError if e.contains("write the run's file") => refused += 1,
            s => other.push(format!("{s:?} {e}")),
        }
    }
    let a = a.wait_output();
    assert_eq!(a.report.status, Status::Ok, "{:?}", a.report);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("target")).unwrap(),
        "host\n"
    );
    assert!(!outside.path().join("x").exists());
    assert!(other.is_empty(), "{other:?}");
    eprintln!("race: {ok} written, {refused} refused");
    assert!(ok + refused > 5);
}

/// The largest paths the checks pass (4096 files of 4000-byte paths: 16 MiB of names) in the exec
/// engine, whose plan travels to its init program: written, or refused naming `files`, and in any
/// case an answer within the run's own timeout (5 s here), never a supervisor that waits forever.
#[test]
fn the_longest_paths_the_checks_pass_in_the_exec_engine() {
    let _one = serial();
    let dir = vec!["d".repeat(249); 16].join("/");
    let files: Vec<FileIn> = (0..4096)
        .map(|i| file(&format!("{dir}/{i:04}"), b"x", 0o644))
        .collect();
    assert!(files[0].path.len() <= 4096);
    let script = "cd /workspace/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d*/d* && ls | wc -l";
    let mut p = policy(script);
    p.limits.timeout_ms = 5_000;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let o = Sandbox::from_policy(p)
            .unwrap()
            .engine(exec_engine())
            .start(io(files))
            .wait_output();
        let _ = tx.send(o);
    });
    let o = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run answers within 60 s (its timeout is 5 s)");
    if o.report.status == Status::Ok {
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "4096");
    } else {
        let e = o.report.error.clone().unwrap_or_default();
        assert!(e.contains("files"), "{:?}", o.report);
    }
}

/// The same through the server, when its runs start cold (`--templates 0`): about 9 MB of paths,
/// under the server's 16 MiB body limit and within its checks (4096 files, 4095 bytes and 64
/// components a path). The request must be answered (written, or refused naming `files`) within
/// its timeout, and the server must hold nothing after.
#[test]
fn server_cold_run_with_9mb_of_paths_is_answered() {
    let s = Server::start(
        "[limits]\nmemory = \"512MiB\"\ntimeout = \"10s\"\n",
        &["--templates", "0"],
    );
    let dir = vec!["d".repeat(240); 9].join("/");
    let mut files = serde_json::Map::new();
    for i in 0..4096 {
        files.insert(format!("{dir}/{i:04}"), json!(""));
    }
    let body = json!({"command": ["true"], "files": files});
    let r = s.req_within(
        "POST",
        "/v1/run",
        &serde_json::to_vec(&body).unwrap(),
        std::time::Duration::from_secs(90),
    );
    let r = r.expect("an answer within 90 s (the run's timeout is 10 s)");
    let j = r.json();
    assert!(
        j["status"] == "ok"
            || r.status == 400
            || j["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("files"),
        "HTTP {} {j}",
        r.status
    );
    assert_nothing_held(s.pid());
}
