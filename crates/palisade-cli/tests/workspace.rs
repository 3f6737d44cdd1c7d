//! The copy-on-write workspace (docs/workspace.md): real sandboxes edit a project through
//! `--workspace`; the project stays byte-for-byte as it was until `palisade apply`, which then
//! makes exactly the run's changes, and refuses what it must, whether the code planted it or the
//! stored change set was tampered with afterwards.

mod common;
use common::*;
use std::io::{BufRead, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

/// `palisade ARGS` with the change sets kept in `store`.
fn cli(store: &TempDir, args: &[&str]) -> Run {
    Command::new(palisade_bin())
        .args(args)
        .env("PALISADE_CHANGES_DIR", store.path())
        .stdin(Stdio::null())
        .output()
        .expect("palisade could not be started")
        .into()
}

/// `palisade run --workspace DIR --json - -- sh -c SCRIPT`.
fn ws_run(store: &TempDir, dir: &Path, script: &str, extra: &[&str]) -> Run {
    let d = dir.display().to_string();
    let mut args = vec!["run", "-q", "--no-tty", "--json", "-", "--workspace", &d];
    args.extend_from_slice(extra);
    args.extend(["--", "/bin/sh", "-c", script]);
    cli(store, &args)
}

/// The change set's id from a run's report.
fn change_set(r: &Run) -> String {
    let rep = r.report();
    rep["workspace"]["change_set"]
        .as_str()
        .unwrap_or_else(|| panic!("no change set in the report: {}\n{}", r.stdout, r.stderr))
        .to_owned()
}

/// A small project: text files, a directory tree, an executable, a link.
fn project(tag: &str) -> TempDir {
    let d = TempDir::new(tag);
    let p = d.path();
    std::fs::create_dir_all(p.join("src/deep")).unwrap();
    std::fs::create_dir_all(p.join("docs")).unwrap();
    std::fs::create_dir_all(p.join("lib/inner")).unwrap();
    std::fs::write(p.join("lib/inner/x.txt"), "inner\n").unwrap();
    std::fs::write(p.join("README"), "line 1\nline 2\nline 3\nline 4\nline 5\n").unwrap();
    std::fs::write(p.join("src/main.py"), "print('a')\nprint('b')\n").unwrap();
    std::fs::write(p.join("src/deep/util.py"), "X = 1\n").unwrap();
    std::fs::write(p.join("src/old.txt"), "moved content\n").unwrap();
    std::fs::write(p.join("docs/a.md"), "# a\n").unwrap();
    std::fs::write(p.join("docs/b.md"), "# b\n").unwrap();
    std::fs::write(p.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(p.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(p.join("gone.txt"), "bye\n").unwrap();
    std::os::unix::fs::symlink("README", p.join("readme-link")).unwrap();
    d
}

/// A copy of a tree (`cp -a`), for what the script would do on the host.
fn copy(from: &Path, tag: &str) -> TempDir {
    let d = TempDir::new(tag);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(d.path())
        .status()
        .expect("cp is missing");
    assert!(ok.success());
    d
}

/// Edits, creations, deletions, a rename, mode changes, a link, and a directory deleted and
/// recreated (an opaque directory in the upper layer).
const EDITS: &str = "set -e
printf 'line 1\\nline two\\nline 3\\nline 4\\nline 5\\nline 6\\n' > README
echo 'print(1)' >> src/main.py
echo 'new' > src/new.py
mkdir -p src/pkg/sub && echo 'deep' > src/pkg/sub/mod.py
rm gone.txt
mv src/old.txt src/renamed.txt
chmod 755 src/deep/util.py
chmod 644 run.sh
ln -s src/main.py main-link
rm -r docs && mkdir docs && echo '# only' > docs/only.md
rm src/deep/util.py && mkdir src/deep/util.py && echo inner > src/deep/util.py/x
rm -r lib/inner && echo flat > lib/inner
printf 'no newline' > tail.txt";

#[test]
fn the_project_is_untouched_until_apply_and_then_has_exactly_the_changes() {
    let store = TempDir::new("ws-store");
    let p = project("ws-edits");
    let before = tree(p.path());
    let expected_dir = copy(p.path(), "ws-expected");
    let ok = Command::new("/bin/sh")
        .args(["-c", EDITS])
        .current_dir(expected_dir.path())
        .status()
        .unwrap();
    assert!(ok.success());
    let expected = tree(expected_dir.path());

    let r = ws_run(&store, p.path(), EDITS, &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_eq!(tree(p.path()), before, "the project changed during the run");
    let id = change_set(&r);
    // Even with -q the id is said: without it the changes are hard to find.
    assert!(
        r.stderr.contains(&format!("workspace change set {id}")),
        "{}",
        r.stderr
    );
    let rep = r.report();
    let s = &rep["workspace"]["summary"];
    // docs (deleted and recreated), src/deep/util.py (a file made a directory), lib/inner (a
    // directory made a file).
    assert_eq!(s["replaced"], 3, "{s}");
    assert_eq!(s["deleted"], 2, "gone.txt and src/old.txt: {s}");
    assert_eq!(s["renamed"], 1, "{s}");
    assert!(s["first_paths"].as_array().unwrap().len() > 5, "{s}");

    // Looking changes nothing either.
    let c = cli(&store, &["changes", &id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(c.stdout.contains("R docs"), "{}", c.stdout);
    assert!(
        c.stdout.contains("renamed src/old.txt -> src/renamed.txt"),
        "{}",
        c.stdout
    );
    let j = cli(&store, &["changes", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    let entries = v["entries"].as_array().unwrap();
    let find = |p: &str| {
        entries
            .iter()
            .find(|e| e["path"] == p)
            .unwrap_or_else(|| panic!("{p}: {v}"))
    };
    assert_eq!(find("docs")["change"], "replaced");
    assert_eq!(find("src/deep/util.py")["change"], "replaced");
    assert_eq!(find("lib/inner")["change"], "replaced");
    assert_eq!(find("run.sh")["change"], "mode");
    assert_eq!(find("main-link")["target"], "src/main.py");
    let list = cli(&store, &["changes", "--list"]);
    assert!(list.stdout.contains(&id), "{}", list.stdout);
    assert_eq!(tree(p.path()), before);

    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 0, "{}\n{}", a.stdout, a.stderr);
    assert_eq!(tree(p.path()), expected);
    // Applied once: again, every path is a conflict and nothing changes.
    let again = cli(&store, &["apply", &id]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert_eq!(tree(p.path()), expected);
    let d = cli(&store, &["discard", &id]);
    assert_eq!(d.code, 0, "{}", d.stderr);
    let gone = cli(&store, &["changes", &id]);
    assert_eq!(gone.code, 125);
    assert!(gone.stderr.contains("no change set"), "{}", gone.stderr);
}

#[test]
fn git_apply_accepts_the_diff() {
    let store = TempDir::new("ws-git-store");
    let p = project("ws-git");
    let expected_dir = copy(p.path(), "ws-git-expected");
    assert!(Command::new("/bin/sh")
        .args(["-c", EDITS])
        .current_dir(expected_dir.path())
        .status()
        .unwrap()
        .success());
    let r = ws_run(&store, p.path(), EDITS, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = change_set(&r);
    let d = cli(&store, &["diff", &id]);
    assert_eq!(d.code, 0, "{}", d.stderr);
    assert!(
        d.stdout.contains("diff --git a/README b/README"),
        "{}",
        d.stdout
    );
    assert!(d.stdout.contains("rename from src/old.txt"), "{}", d.stdout);
    assert!(
        d.stdout.contains("\\ No newline at end of file"),
        "{}",
        d.stdout
    );
    // The real git, on a copy of the project as it was.
    let target = copy(p.path(), "ws-git-target");
    let mut git = Command::new("git")
        .args(["apply", "--verbose", "-"])
        .current_dir(target.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("git is missing: the diff test needs the real git");
    git.stdin
        .take()
        .unwrap()
        .write_all(d.stdout.as_bytes())
        .unwrap();
    let out = git.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "git apply refused the diff: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.stdout
    );
    // git applies contents and the executable bit; it keeps no empty directory and no other
    // mode bits, so compare what it can express.
    assert_eq!(tree(target.path()), tree(expected_dir.path()));
    // A path filter shows only that file.
    let one = cli(&store, &["diff", &id, "src/main.py"]);
    assert_eq!(
        one.stdout.matches("diff --git").count(),
        1,
        "{}",
        one.stdout
    );
}

/// What the code plants that apply must never write: a link to a host file, a hard link, a
/// fifo, and protected paths. All held back together (nothing changes), and each on its own. (A
/// set-user-ID file cannot be made inside: seccomp refuses the mode, checked here too; apply's
/// own refusal of one is in the tampering test.)
#[test]
fn apply_refuses_what_the_code_planted_and_changes_nothing() {
    let store = TempDir::new("ws-plant-store");
    let p = project("ws-plant");
    let before = tree(p.path());
    let script = "set -e
ln -s /etc/passwd evil-link
ln -s ../../etc/passwd up-link
ln README hard
mkfifo fifo
cp run.sh suid && ! chmod 4755 suid
! mknod dev c 1 3
echo 'echo owned' > .bashrc
mkdir -p .git/hooks && echo 'echo owned' > .git/hooks/pre-commit
echo fine > fine.txt";
    let r = ws_run(&store, p.path(), script, &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 1, "{}\n{}", a.stdout, a.stderr);
    for (path, why) in [
        ("evil-link", "absolute path"),
        ("up-link", "above its root"),
        ("hard", "hard link"),
        ("fifo", "a fifo"),
        (".bashrc", "protected"),
        (".git", "protected"),
    ] {
        assert!(
            a.stderr
                .lines()
                .any(|l| l.contains(path) && l.contains(why)),
            "{path}: {why}: {}",
            a.stderr
        );
    }
    assert_eq!(
        tree(p.path()),
        before,
        "a refused apply changed the project"
    );
    for path in ["evil-link", "up-link", "hard", "fifo"] {
        let one = cli(&store, &["apply", &id, path, "--include-risky", "--force"]);
        assert_eq!(one.code, 1, "{path}: {}", one.stderr);
        assert!(one.stderr.contains("refused"), "{path}: {}", one.stderr);
        assert_eq!(tree(p.path()), before, "{path}");
    }
    // --include-risky does not release a protected path; naming it does.
    let risky = cli(
        &store,
        &[
            "apply",
            &id,
            "--include-risky",
            "--exclude",
            "evil-link",
            "--exclude",
            "up-link",
            "--exclude",
            "hard",
            "--exclude",
            "fifo",
            "--exclude",
            "README",
        ],
    );
    assert_eq!(risky.code, 1, "{}", risky.stderr);
    assert!(
        risky.stderr.contains(".bashrc") && risky.stderr.contains("protected"),
        "{}",
        risky.stderr
    );
    assert_eq!(tree(p.path()), before);
    let named = cli(&store, &["apply", &id, ".bashrc"]);
    assert_eq!(named.code, 0, "{}", named.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join(".bashrc")).unwrap(),
        "echo owned\n"
    );
    assert!(!p.path().join("fine.txt").exists());
}

/// The stored change set is not trusted either: each way of tampering with it is refused, and
/// the project is left as it was.
#[test]
fn a_tampered_change_set_is_refused_and_changes_nothing() {
    let store = TempDir::new("ws-tamper-store");
    let p = project("ws-tamper");
    let secret = TempDir::new("ws-tamper-secret");
    std::fs::write(secret.path().join("secret"), "host secret\n").unwrap();
    let r = ws_run(
        &store,
        p.path(),
        "echo new > new.txt; echo more >> README",
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = change_set(&r);
    let dir = store.path().join(&id);
    let before = tree(p.path());
    let pristine: Vec<(String, Vec<u8>)> = ["meta.json", "entries.jsonl", "data"]
        .iter()
        .map(|n| (n.to_string(), std::fs::read(dir.join(n)).unwrap()))
        .collect();
    let restore = || {
        for (n, b) in &pristine {
            let _ = std::fs::remove_file(dir.join(n));
            std::fs::write(dir.join(n), b).unwrap();
        }
    };
    // Rewrites the entry for `path` in entries.jsonl.
    let edit = |path: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let text = std::fs::read_to_string(dir.join("entries.jsonl")).unwrap();
        let mut out = String::new();
        for l in text.lines() {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["path"] == path {
                f(&mut v);
            }
            out.push_str(&v.to_string());
            out.push('\n');
        }
        std::fs::write(dir.join("entries.jsonl"), out).unwrap();
    };
    let secret_file = secret.path().join("secret");
    type Tamper<'a> = (&'a str, Box<dyn Fn() + 'a>, &'a str);
    let cases: Vec<Tamper> = vec![
        (
            "data is a link to a host file",
            Box::new(|| {
                std::fs::remove_file(dir.join("data")).unwrap();
                std::os::unix::fs::symlink(&secret_file, dir.join("data")).unwrap();
            }),
            "damaged",
        ),
        (
            "data is a hard link",
            Box::new(|| {
                std::fs::hard_link(dir.join("data"), dir.join("data-again")).unwrap();
            }),
            "more than one name",
        ),
        (
            "data is a fifo",
            Box::new(|| {
                std::fs::remove_file(dir.join("data")).unwrap();
                let ok = Command::new("mkfifo")
                    .arg(dir.join("data"))
                    .status()
                    .unwrap();
                assert!(ok.success());
            }),
            "damaged",
        ),
        (
            "contents changed",
            Box::new(|| {
                let mut b = std::fs::read(dir.join("data")).unwrap();
                b[0] ^= 0x20;
                std::fs::write(dir.join("data"), b).unwrap();
            }),
            "do not match their hash",
        ),
        (
            "a path out of the project",
            Box::new(|| edit("new.txt", &|v| v["path"] = "../escaped.txt".into())),
            "not a path inside the project",
        ),
        (
            "an absolute path",
            Box::new(|| edit("new.txt", &|v| v["path"] = "/tmp/escaped.txt".into())),
            "not a path inside the project",
        ),
        (
            "a set-user-ID mode",
            Box::new(|| edit("new.txt", &|v| v["mode"] = 0o4755.into())),
            "set-user-ID",
        ),
        (
            "a device",
            Box::new(|| edit("new.txt", &|v| v["kind"] = "device".into())),
            "device node",
        ),
        (
            "a fifo",
            Box::new(|| edit("new.txt", &|v| v["kind"] = "fifo".into())),
            "a fifo",
        ),
        (
            "a link to a host file",
            Box::new(|| {
                edit("new.txt", &|v| {
                    v["kind"] = "symlink".into();
                    v["target"] = secret_file.display().to_string().into();
                })
            }),
            "absolute path",
        ),
        (
            "a protected path",
            Box::new(|| {
                edit("new.txt", &|v| {
                    v["path"] = ".git/hooks/post-checkout".into()
                })
            }),
            "protected",
        ),
    ];
    for (what, tamper, why) in &cases {
        restore();
        let _ = std::fs::remove_file(dir.join("data-again"));
        tamper();
        let a = cli(&store, &["apply", &id, "--force", "--include-risky"]);
        assert_ne!(a.code, 0, "{what}: {}", a.stdout);
        assert!(a.stderr.contains(why), "{what}: {}", a.stderr);
        assert_eq!(tree(p.path()), before, "{what}: the project changed");
        assert!(!secret.path().join("escaped.txt").exists());
        assert!(!Path::new("/tmp/escaped.txt").exists());
    }
    let _ = std::fs::remove_file(dir.join("data-again"));
    restore();
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 0, "the untampered change set: {}", a.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join("new.txt")).unwrap(),
        "new\n"
    );
}

/// A file the host changes while the run goes on is a conflict: apply leaves it as the host
/// made it, unless forced.
#[test]
fn a_host_edit_during_the_run_is_a_conflict() {
    let store = TempDir::new("ws-conflict-store");
    let p = project("ws-conflict");
    let d = p.path().display().to_string();
    // The code changes README, says so, and waits for a line on its stdin; meanwhile the host
    // edits README too.
    let mut child = Command::new(palisade_bin())
        .args([
            "run",
            "-q",
            "--no-tty",
            "--json",
            "-",
            "--workspace",
            &d,
            "--",
        ])
        .args([
            "/bin/sh",
            "-c",
            "echo mine > README; echo ready; read x; echo done",
        ])
        .env("PALISADE_CHANGES_DIR", store.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    std::fs::write(p.path().join("README"), "the host's\n").unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{rest}");
    let r = Run {
        code: 0,
        stdout: rest,
        stderr: String::new(),
    };
    let id = change_set(&r);
    assert_eq!(r.report()["workspace"]["summary"]["conflicts"], 1);
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 1, "{}", a.stderr);
    assert!(
        a.stderr.contains("README") && a.stderr.contains("conflict"),
        "{}",
        a.stderr
    );
    assert_eq!(
        std::fs::read_to_string(p.path().join("README")).unwrap(),
        "the host's\n"
    );
    let f = cli(&store, &["apply", &id, "--force"]);
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join("README")).unwrap(),
        "mine\n"
    );
}

#[test]
fn apply_on_success_applies_only_a_run_that_succeeded() {
    let store = TempDir::new("ws-auto-store");
    let p = project("ws-auto");
    let r = ws_run(
        &store,
        p.path(),
        "echo one > auto.txt; exit 3",
        &["--apply", "on-success"],
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(!p.path().join("auto.txt").exists());
    let rep = r.report();
    assert!(rep["workspace"]["applied"].is_null(), "{rep}");
    assert!(rep["workspace"]["change_set"].is_string());
    let r = ws_run(
        &store,
        p.path(),
        "echo two > auto.txt",
        &["--apply", "on-success"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join("auto.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(r.report()["workspace"]["applied"]["entries"], 1);
    // Something to review holds the whole of it back.
    let r = ws_run(
        &store,
        p.path(),
        "echo three > auto.txt; echo x > .envrc",
        &["--apply", "always"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        std::fs::read_to_string(p.path().join("auto.txt")).unwrap(),
        "two\n"
    );
    let rep = r.report();
    assert!(
        rep["workspace"]["apply_error"]
            .as_str()
            .unwrap()
            .contains(".envrc"),
        "{rep}"
    );
}

#[test]
fn bad_input_is_refused_with_the_cause_and_nothing_changes() {
    let store = TempDir::new("ws-bad-store");
    let missing = cli(
        &store,
        &[
            "run",
            "--no-tty",
            "--workspace",
            "/nonexistent/palisade-ws",
            "--",
            "true",
        ],
    );
    assert_eq!(missing.code, 125);
    assert!(
        missing.stderr.contains("--workspace")
            && missing.stderr.contains("/nonexistent/palisade-ws"),
        "{}",
        missing.stderr
    );
    let p = project("ws-bad");
    let file = p.path().join("README").display().to_string();
    let notdir = cli(
        &store,
        &["run", "--no-tty", "--workspace", &file, "--", "true"],
    );
    assert_eq!(notdir.code, 125);
    assert!(
        notdir.stderr.contains("not a directory"),
        "{}",
        notdir.stderr
    );
    let both = cli(
        &store,
        &[
            "run",
            "--no-tty",
            "--workspace",
            &p.s(),
            "--scratch",
            &p.s(),
            "--",
            "true",
        ],
    );
    assert_eq!(both.code, 125, "{}", both.stderr);
    for (args, needle) in [
        (
            vec!["changes", "20990101-000000-zzzzzz"],
            "no change set `20990101-000000-zzzzzz`",
        ),
        (vec!["apply", "../../etc"], "not a change-set id"),
        (vec!["diff", "NOPE"], "not a change-set id"),
    ] {
        let r = cli(&store, &args);
        assert_eq!(r.code, 125, "{args:?}");
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
    }
    // A project whose directory was replaced since the run: refused, and the new one untouched.
    let r = ws_run(&store, p.path(), "echo x > moved.txt", &[]);
    let id = change_set(&r);
    let aside = format!("{}-aside", p.s());
    std::fs::rename(p.path(), &aside).unwrap();
    std::fs::create_dir(p.path()).unwrap();
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 125, "{}", a.stderr);
    assert!(
        a.stderr.contains("not the one the run used"),
        "{}",
        a.stderr
    );
    assert_eq!(std::fs::read_dir(p.path()).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&aside);
    // A store inside the workspace (the code would see it), or one others may write.
    let inside = TempDir(p.path().join("store"));
    let r = ws_run(&inside, p.path(), "true", &[]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("inside the workspace"), "{}", r.stderr);
    let open = TempDir::new("ws-open-store");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = ws_run(&open, p.path(), "echo x > y", &[]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("writable by no one else"), "{}", r.stderr);
    let l = cli(&open, &["changes", "--list"]);
    assert_eq!(l.code, 125, "{}", l.stderr);
    // --apply without a workspace.
    let r = cli(
        &store,
        &["run", "--no-tty", "--apply", "always", "--", "true"],
    );
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("--workspace"), "{}", r.stderr);
}

/// The files of a project that are not the user's own (another owner's, root's) cannot be
/// changed inside by an unprivileged run; a root launch sees the project's owner as itself and
/// the files it applies belong to that owner.
#[test]
fn applied_files_belong_to_the_projects_owner() {
    let store = TempDir::new("ws-owner-store");
    let p = project("ws-owner");
    if euid() == 0 {
        // A project of some user's: the run sees it as its own, apply hands new files to them.
        let ok = Command::new("chown")
            .args(["-hR", "4242:4242"])
            .arg(p.path())
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let r = ws_run(
        &store,
        p.path(),
        "echo new > owned.txt; mkdir d; echo x > d/f",
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = change_set(&r);
    assert_eq!(cli(&store, &["apply", &id]).code, 0);
    let owner = std::fs::metadata(p.path()).unwrap().uid();
    for f in ["owned.txt", "d", "d/f"] {
        assert_eq!(
            std::fs::symlink_metadata(p.path().join(f)).unwrap().uid(),
            owner,
            "{f}"
        );
    }
}

/// What the code made unreadable (mode 000) is still read into the change set, complete, and
/// applied with that mode: the supervisor opens up the sandbox's own dead layer, never the
/// project.
#[test]
fn what_the_code_made_unreadable_is_kept_and_applied_as_it_was() {
    let store = TempDir::new("ws-000-store");
    let p = project("ws-000");
    let r = ws_run(
        &store,
        p.path(),
        "echo s > secret && chmod 000 secret && mkdir d && echo x > d/f && chmod 000 d",
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let rep = r.report();
    assert!(rep["workspace"]["incomplete"].is_null(), "{rep}");
    assert_eq!(rep["workspace"]["summary"]["entries"], 3, "{rep}");
    let id = change_set(&r);
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let mode = |f: &str| {
        std::fs::symlink_metadata(p.path().join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!((mode("secret"), mode("d")), (0, 0));
    std::fs::set_permissions(p.path().join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(std::fs::read(p.path().join("d/f")).unwrap(), b"x\n");
    std::fs::set_permissions(
        p.path().join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(std::fs::read(p.path().join("secret")).unwrap(), b"s\n");
}

/// A change set applied in parts: a path inside new directories brings those directories with
/// only that path in them; the rest follows later, into the directories already there.
#[test]
fn a_change_set_applies_in_parts() {
    let store = TempDir::new("ws-parts-store");
    let p = project("ws-parts");
    let r = ws_run(
        &store,
        p.path(),
        "mkdir -p new/a && echo x > new/a/x && echo y > new/a/y && echo b > new/b && echo m >> README",
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id = change_set(&r);
    let a = cli(&store, &["apply", &id, "new/a/x"]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(p.path().join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("new"), ["a"]);
    assert_eq!(names("new/a"), ["x"]);
    assert!(!std::fs::read_to_string(p.path().join("README"))
        .unwrap()
        .contains('m'));
    // What was applied is a conflict now; the rest goes in by name or by leaving it out.
    let again = cli(&store, &["apply", &id]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("new/a/x"), "{}", again.stderr);
    let rest = cli(&store, &["apply", &id, "--exclude", "new/a/x"]);
    assert_eq!(rest.code, 0, "{}", rest.stderr);
    assert_eq!(names("new"), ["a", "b"]);
    assert_eq!(names("new/a"), ["x", "y"]);
    assert!(std::fs::read_to_string(p.path().join("README"))
        .unwrap()
        .ends_with("m\n"));
    // A path that names nothing in the change set is an error, and nothing changes.
    let none = cli(&store, &["apply", &id, "no/such/path"]);
    assert_eq!(none.code, 125, "{}", none.stderr);
    assert!(none.stderr.contains("names no change"), "{}", none.stderr);
}

/// A project `proj` in a directory of its own that also holds `outside.txt`: a host file next
/// to the project, which no link applied into it may reach.
fn beside(tag: &str) -> (TempDir, std::path::PathBuf) {
    let d = TempDir::new(tag);
    let p = d.path().join("proj");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(d.path().join("outside.txt"), "host secret\n").unwrap();
    (d, p)
}

/// The line of `palisade changes ID` for `path`.
fn listed(store: &TempDir, id: &str, path: &str) -> String {
    let c = cli(store, &["changes", id]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    c.stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(path))
        .unwrap_or_else(|| panic!("{path} not listed:\n{}", c.stdout))
        .to_owned()
}

/// Asserts that `apply ID ARGS` is held back with `path` refused, and changes nothing.
fn refused(store: &TempDir, id: &str, args: &[&str], p: &Path, path: &str, why: &str) {
    let before = tree(p);
    let mut all = vec!["apply", id];
    all.extend_from_slice(args);
    let a = cli(store, &all);
    assert_eq!(a.code, 1, "apply {args:?}: {}\n{}", a.stdout, a.stderr);
    assert!(
        a.stderr
            .lines()
            .any(|l| l.contains(path) && l.contains("refused") && l.contains(why)),
        "apply {args:?}: {path}: {why}: {}",
        a.stderr
    );
    assert_eq!(tree(p), before, "apply {args:?} changed the project");
}

/// Finding 6's second reproducer: `d1/b -> ..` is the project's root, and `d1/a -> b/..` its
/// parent, though its words stay inside. `changes` shows it refused; `apply` refuses it, as a
/// whole or named alone, and the rest applies without it.
#[test]
fn a_link_climbing_out_through_a_new_link_is_refused() {
    let store = TempDir::new("ws-chain-store");
    let (_d, p) = beside("ws-chain");
    let r = ws_run(
        &store,
        &p,
        "mkdir d1 && ln -s .. d1/b && ln -s b/.. d1/a",
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    assert!(listed(&store, &id, "d1/a").contains("REFUSED"));
    assert!(!listed(&store, &id, "d1/b").contains("REFUSED"));
    refused(&store, &id, &[], &p, "d1/a", "after a name");
    refused(&store, &id, &["d1/a"], &p, "d1/a", "after a name");
    let rest = cli(&store, &["apply", &id, "--exclude", "d1/a"]);
    assert_eq!(rest.code, 0, "{}", rest.stderr);
    assert_eq!(std::fs::read_link(p.join("d1/b")).unwrap(), Path::new(".."));
    assert!(std::fs::symlink_metadata(p.join("d1/a")).is_err());
}

/// A partial apply naming the link alone, before and after the link it goes through: each
/// apply judges it over the project as it stands then, and its words are refused either way.
#[test]
fn a_link_named_alone_is_refused_before_and_after_what_it_goes_through() {
    let store = TempDir::new("ws-alone-store");
    let (_d, p) = beside("ws-alone");
    let r = ws_run(
        &store,
        &p,
        "mkdir d1 && ln -s .. d1/b && ln -s b/.. d1/a",
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    refused(&store, &id, &["d1/a"], &p, "d1/a", "after a name");
    let b = cli(&store, &["apply", &id, "d1/b"]);
    assert_eq!(b.code, 0, "{}", b.stderr);
    refused(&store, &id, &["d1/a"], &p, "d1/a", "after a name");
    assert!(std::fs::read_to_string(p.join("d1/a/outside.txt")).is_err());
}

/// Through links the project already has: `web/shared-link -> ../shared` (the audit's case,
/// `..` after it climbs from `shared`), and `ext`, a link of the user's to the directory above
/// the project. A link into the project through a link that stays in it applies.
#[test]
fn a_link_through_a_project_link_out_of_it_is_refused() {
    let store = TempDir::new("ws-hostlink-store");
    let (d, p) = beside("ws-hostlink");
    std::fs::create_dir_all(p.join("web")).unwrap();
    std::fs::create_dir_all(p.join("shared")).unwrap();
    std::fs::write(p.join("shared/ok.txt"), "shared\n").unwrap();
    std::os::unix::fs::symlink("../shared", p.join("web/shared-link")).unwrap();
    std::os::unix::fs::symlink(d.path(), p.join("ext")).unwrap();
    let r = ws_run(
        &store,
        &p,
        "ln -s web/shared-link/../../outside.txt x && ln -s ext/outside.txt y && ln -s web/shared-link/ok.txt fine && ln -s later/outside.txt z",
        &[],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    assert!(listed(&store, &id, "x").contains("REFUSED"));
    assert!(listed(&store, &id, "y").contains("REFUSED"));
    assert!(!listed(&store, &id, "fine").contains("REFUSED"));
    refused(&store, &id, &[], &p, "x", "after a name");
    refused(&store, &id, &[], &p, "y", "through `ext`");
    refused(
        &store,
        &id,
        &["y", "--include-risky", "--force"],
        &p,
        "y",
        "through `ext`",
    );
    // Apply judges again, over the project of the moment: `later` is a link out since the run.
    assert!(!listed(&store, &id, "z").contains("REFUSED"));
    std::os::unix::fs::symlink(d.path(), p.join("later")).unwrap();
    refused(&store, &id, &["z"], &p, "z", "through `later`");
    let fine = cli(&store, &["apply", &id, "fine"]);
    assert_eq!(fine.code, 0, "{}", fine.stderr);
    assert_eq!(std::fs::read_to_string(p.join("fine")).unwrap(), "shared\n");
}

/// Through links of the same change set: `d/e/up -> ../..` is the project's root and
/// `x -> d/e/up/../outside.txt` climbs above it; `l2 -> l1/outside.txt` goes through `l1`, a new
/// link out of the project. Each is refused, named alone too, and `changes` says so.
#[test]
fn a_link_through_a_link_of_the_same_change_set_is_refused() {
    let store = TempDir::new("ws-samecs-store");
    let (d, p) = beside("ws-samecs");
    let script = format!(
        "mkdir -p d/e && ln -s ../.. d/e/up && ln -s d/e/up/../outside.txt x && ln -s {} l1 && ln -s l1/outside.txt l2",
        d.path().display()
    );
    let r = ws_run(&store, &p, &script, &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    assert!(listed(&store, &id, "x").contains("REFUSED"));
    assert!(listed(&store, &id, "l2").contains("REFUSED"));
    refused(&store, &id, &["--exclude", "l1"], &p, "x", "after a name");
    refused(&store, &id, &["--exclude", "l1"], &p, "l2", "through `l1`");
    refused(&store, &id, &["l2"], &p, "l2", "through `l1`");
    let rest = cli(
        &store,
        &[
            "apply",
            &id,
            "--exclude",
            "l1",
            "--exclude",
            "l2",
            "--exclude",
            "x",
        ],
    );
    assert_eq!(rest.code, 0, "{}", rest.stderr);
    assert_eq!(
        std::fs::read_link(p.join("d/e/up")).unwrap(),
        Path::new("../..")
    );
    assert!(std::fs::read_to_string(p.join("d/e/up/outside.txt")).is_err());
}

/// Links within the project still apply as links: up from a subdirectory, to a sibling, to a
/// directory made in the same run, through another new link, through a link the project has,
/// to the root itself, dangling ones.
#[test]
fn links_within_the_project_apply() {
    let store = TempDir::new("ws-inlinks-store");
    let (_d, p) = beside("ws-inlinks");
    for dir in ["lib", "src", "shared", "web"] {
        std::fs::create_dir_all(p.join(dir)).unwrap();
    }
    std::fs::write(p.join("lib/x.txt"), "lib x\n").unwrap();
    std::fs::write(p.join("shared/a.txt"), "shared a\n").unwrap();
    std::os::unix::fs::symlink("../shared", p.join("web/shared-link")).unwrap();
    let script = "set -e
ln -s ../lib src/lib
mkdir v2 && echo two > v2/f.txt && ln -s v2 current
ln -s current/f.txt cf
mkdir -p pkg/sub && ln -s ../../lib/x.txt pkg/sub/x && ln -s .. pkg/root
ln -s web/shared-link/a.txt sa
ln -s ./lib/x.txt dotted
ln -s not/yet/there later";
    let r = ws_run(&store, &p, script, &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let id = change_set(&r);
    let c = cli(&store, &["changes", &id]);
    assert!(!c.stdout.contains("REFUSED"), "{}", c.stdout);
    let a = cli(&store, &["apply", &id]);
    assert_eq!(a.code, 0, "{}\n{}", a.stdout, a.stderr);
    for (link, target, reads) in [
        ("src/lib", "../lib", Some("src/lib/x.txt")),
        ("current", "v2", Some("current/f.txt")),
        ("cf", "current/f.txt", Some("cf")),
        ("pkg/sub/x", "../../lib/x.txt", Some("pkg/sub/x")),
        ("pkg/root", "..", Some("pkg/root/lib/x.txt")),
        ("sa", "web/shared-link/a.txt", Some("sa")),
        ("dotted", "./lib/x.txt", Some("dotted")),
        ("later", "not/yet/there", None),
    ] {
        assert_eq!(
            std::fs::read_link(p.join(link)).unwrap(),
            Path::new(target),
            "{link}"
        );
        if let Some(r) = reads {
            assert!(std::fs::read_to_string(p.join(r)).is_ok(), "{r}");
        }
    }
}
