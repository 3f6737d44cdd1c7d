//! `palisade serve` sessions on a copy-on-write workspace (docs/workspace.md, "A server and the
//! SDK"), over a real socket with real sandboxes: the project is untouched until an apply over the
//! API, which then makes exactly the session's changes; the ceiling of `--workspace-root` refuses
//! every other directory before anything starts; change-set ids are this server's own; host
//! edits are conflicts and what the code planted is refused, as by the command line. Each test
//! starts its own server; they run as root and as the unprivileged test user (scripts/test.sh).

mod common;

use common::serve::{Resp, Server};
use common::{cli, run_in_workspace, tree, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A `palisade serve` whose change sets are kept in `store`; `Err` with its exit status and its
/// log when it exits instead (a refused configuration).
fn try_serve(store: &Path, policy: &str, opts: &[&str]) -> Result<Server, String> {
    Server::try_start(policy, opts, &[("PALISADE_CHANGES_DIR", store.as_os_str())])
}

fn serve(store: &Path, opts: &[&str]) -> Server {
    try_serve(store, "", opts).unwrap_or_else(|e| panic!("{e}"))
}

/// A session on a workspace, the way a client drives it.
impl Server {
    /// A session on `workspace`; its id.
    fn session(&self, workspace: &Path) -> String {
        let r = self.post(
            "/v1/sandboxes",
            &json!({"workspace": workspace.display().to_string()}),
        );
        assert_eq!(r.status, 201, "{} {}", r.text(), self.log());
        let v = r.json();
        assert_eq!(v["workspace"], workspace.display().to_string());
        v["id"].as_str().unwrap().to_owned()
    }

    /// `sh -c SCRIPT` in the session; its stdout (the exit must be 0).
    fn sh(&self, id: &str, script: &str) -> String {
        let r = self.post(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"command": ["/bin/sh", "-c", script]}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["status"], "ok", "{script}: {v}");
        v["stdout"]["data"].as_str().unwrap().to_owned()
    }

    /// Ends the session; the change set its report names.
    fn end(&self, id: &str) -> String {
        let r = self.delete(&format!("/v1/sandboxes/{id}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        v["report"]["workspace"]["change_set"]
            .as_str()
            .unwrap_or_else(|| panic!("no change set in the final report: {v}\n{}", self.log()))
            .to_owned()
    }

    fn apply(&self, cs: &str, body: &Value) -> Resp {
        self.post(&format!("/v1/changes/{cs}/apply"), body)
    }
}

/// A workspace root (canonical) holding a small project at `proj`.
fn root_with_project(tag: &str) -> (TempDir, PathBuf) {
    let root = TempDir::new(tag);
    let p = root.path().canonicalize().unwrap().join("proj");
    std::fs::create_dir_all(p.join("src/deep")).unwrap();
    std::fs::write(p.join("README"), "line 1\nline 2\nline 3\n").unwrap();
    std::fs::write(p.join("src/main.py"), "print('a')\n").unwrap();
    std::fs::write(p.join("src/deep/util.py"), "X = 1\n").unwrap();
    std::fs::write(p.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(p.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(p.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    (root, p)
}

const EDITS: &str = "set -e
printf 'line 1\\nline two\\nline 3\\n' > README
echo 'print(1)' >> src/main.py
mkdir -p src/pkg && echo new > src/pkg/mod.py
rm gone.txt
chmod 644 run.sh
ln -s src/main.py main-link
rm -r src/deep && mkdir src/deep && echo fresh > src/deep/only.py";

/// The whole cycle: a session edits, creates, deletes; its execs see their earlier writes; the
/// project is untouched until apply; the API shows what `palisade changes --json` shows; apply
/// makes exactly the changes; discard removes the change set. With a warm pool and templates on:
/// a workspace session starts cold.
#[test]
fn a_workspace_session_changes_nothing_until_apply_and_apply_makes_exactly_its_changes() {
    let store = TempDir::new("wsapi-store");
    let (root, p) = root_with_project("wsapi-root");
    let before = tree(&p);
    let expected = {
        let copy = TempDir::new("wsapi-expected");
        let ok = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", p.display()))
            .arg(copy.path())
            .status()
            .expect("cp is missing");
        assert!(ok.success());
        let ok = Command::new("/bin/sh")
            .args(["-c", EDITS])
            .current_dir(copy.path())
            .status()
            .unwrap();
        assert!(ok.success());
        std::fs::write(copy.path().join("put.txt"), "through the file API\n").unwrap();
        tree(copy.path())
    };
    let root_s = root.s();
    let s = serve(
        store.path(),
        &[
            "--workspace-root",
            &root_s,
            "--pool",
            "1",
            "--templates",
            "4",
        ],
    );
    let id = s.session(&p);
    assert_eq!(
        s.sh(&id, "pwd; cat README"),
        "/workspace\nline 1\nline 2\nline 3\n"
    );
    s.sh(&id, EDITS);
    // A later exec sees the earlier one's writes; the file API writes into the same layer.
    assert_eq!(
        s.sh(&id, "cat src/pkg/mod.py; ls src/deep"),
        "new\nonly.py\n"
    );
    let put = s.req(
        "PUT",
        &format!("/v1/sandboxes/{id}/files/put.txt"),
        b"through the file API\n",
    );
    assert_eq!(put.status, 204, "{}", put.text());
    assert_eq!(
        tree(&p),
        before,
        "the project changed while the session lived"
    );
    let cs = s.end(&id);
    assert_eq!(
        tree(&p),
        before,
        "the project changed when the session ended"
    );

    // The session is gone; its end names the change set.
    let gone = s.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(gone.status, 410);
    assert!(gone.text().contains(&cs), "{}", gone.text());
    let list = s.get("/v1/changes").json();
    let mine: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["id"] == cs.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{list}");
    assert_eq!(mine[0]["session"], id.as_str());
    assert_eq!(mine[0]["dir"], p.display().to_string());

    // The entries, as the command line shows them (the same store).
    let api = s.get(&format!("/v1/changes/{cs}")).json();
    let c = cli(store.path(), &["changes", &cs, "--json"]);
    assert_eq!(c.code, 0, "{}", c.stderr);
    let shown: Value = serde_json::from_str(&c.stdout).unwrap();
    assert_eq!(api, shown);
    let find = |path: &str| {
        api["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == path)
            .unwrap_or_else(|| panic!("{path}: {api}"))
            .clone()
    };
    assert_eq!(find("gone.txt")["change"], "deleted");
    assert_eq!(find("src/deep")["change"], "replaced");
    assert_eq!(find("run.sh")["change"], "mode");
    assert_eq!(find("main-link")["target"], "src/main.py");
    assert_eq!(find("put.txt")["change"], "added");

    // The diff: all of it, then one path.
    let d = s.post(&format!("/v1/changes/{cs}/diff"), &json!({})).json();
    let text = d["diff"]["data"].as_str().unwrap();
    assert!(text.contains("+line two"), "{text}");
    assert!(text.contains("deleted file mode 100644"), "{text}");
    let one = s
        .post(
            &format!("/v1/changes/{cs}/diff"),
            &json!({"paths": ["README"]}),
        )
        .json();
    assert_eq!(one["files"], 1, "{one}");
    assert!(!one["diff"]["data"].as_str().unwrap().contains("gone.txt"));
    assert_eq!(tree(&p), before, "looking changed the project");

    let a = s.apply(&cs, &json!({}));
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["dir"], p.display().to_string());
    assert_eq!(tree(&p), expected);
    // Applied once: a second apply finds every path changed since, and changes nothing.
    let again = s.apply(&cs, &json!({}));
    assert_eq!(again.status, 409, "{}", again.text());
    assert_eq!(again.json()["error"]["code"], "held");
    assert_eq!(tree(&p), expected);

    let del = s.delete(&format!("/v1/changes/{cs}"));
    assert_eq!(del.status, 204, "{}", del.text());
    assert!(!store.path().join(&cs).exists());
    assert_eq!(s.get(&format!("/v1/changes/{cs}")).status, 404);
}

/// The ceiling: a workspace outside every root, through a link, with `..`, a file, a missing
/// directory, a relative path, and any workspace on a server without roots, are refused with the
/// field named, and nothing is started or kept. A server policy with its own workspace, and a
/// root holding the store, do not start.
#[test]
fn workspaces_the_roots_do_not_hold_are_refused_and_nothing_starts() {
    let store = TempDir::new("wsapi-ceil-store");
    let (root, p) = root_with_project("wsapi-ceil-root");
    let outside = TempDir::new("wsapi-ceil-outside");
    let rc = root.path().canonicalize().unwrap();
    std::os::unix::fs::symlink(outside.path(), rc.join("link-out")).unwrap();
    std::os::unix::fs::symlink("proj", rc.join("link-in")).unwrap();
    std::fs::write(rc.join("file"), "x").unwrap();
    let root_s = root.s();

    let none = serve(store.path(), &[]);
    // The endpoints are in the OpenAPI document, with their types.
    let doc = none.get("/openapi.json").json();
    for p in [
        "/v1/changes",
        "/v1/changes/{id}",
        "/v1/changes/{id}/diff",
        "/v1/changes/{id}/apply",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} missing");
    }
    for t in [
        "ChangeSetInfo",
        "ChangeSetDoc",
        "DiffRequest",
        "DiffResult",
        "ApplyRequest",
        "AppliedResult",
        "HeldChange",
    ] {
        assert!(doc["components"]["schemas"][t].is_object(), "{t} missing");
    }
    assert!(doc["components"]["schemas"]["SessionRequest"]["properties"]["workspace"].is_object());
    let r = none.post(
        "/v1/sandboxes",
        &json!({"workspace": p.display().to_string()}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["field"], "workspace", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("--workspace-root"),
        "{e}"
    );
    assert_eq!(none.metric("palisade_sessions"), 0);

    let s = serve(store.path(), &["--workspace-root", &root_s]);
    let cases: Vec<(String, u16, &str)> = vec![
        (outside.s(), 403, "workspace roots"),
        ("/etc".into(), 403, "workspace roots"),
        (format!("{}/link-out", rc.display()), 403, "symbolic link"),
        (
            format!("{}/link-in/src", rc.display()),
            403,
            "symbolic link",
        ),
        (format!("{}/proj/../proj", rc.display()), 400, "`..`"),
        (
            format!(
                "{}/../{}",
                rc.display(),
                outside.path().file_name().unwrap().to_string_lossy()
            ),
            400,
            "`..`",
        ),
        (format!("{}/file", rc.display()), 400, "not one"),
        (format!("{}/proj/README", rc.display()), 400, "not one"),
        (format!("{}/missing", rc.display()), 400, "does not exist"),
        ("proj".into(), 400, "absolute"),
    ];
    for (ask, status, says) in &cases {
        let r = s.post("/v1/sandboxes", &json!({"workspace": ask}));
        assert_eq!(r.status, *status, "{ask}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["field"], "workspace", "{ask}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{ask}: {e}");
    }
    assert_eq!(s.metric("palisade_sessions"), 0);
    assert_eq!(s.get("/v1/changes").json(), json!([]));
    assert!(
        std::fs::read_dir(store.path()).unwrap().next().is_none(),
        "a refused request kept something"
    );

    // Refused at start: a policy with a workspace of its own, a root that holds the store.
    let e = try_serve(
        store.path(),
        &format!("[filesystem]\nworkspace = \"{}\"\n", p.display()),
        &[],
    )
    .err()
    .expect("a server policy with a workspace starts");
    assert!(e.contains("filesystem.workspace"), "{e}");
    let inner = rc.join("store");
    let e = try_serve(&inner, "", &["--workspace-root", &root_s])
        .err()
        .expect("a root holding the store starts");
    assert!(e.contains("change-set store"), "{e}");
}

/// Ids are this server's own: a change set the command line made, or another server's, in the
/// same store, is `not-found` for every operation, and stays in the store.
#[test]
fn change_sets_of_the_command_line_or_another_server_are_not_found() {
    let store = TempDir::new("wsapi-ids-store");
    let (root, p) = root_with_project("wsapi-ids-root");
    let root_s = root.s();
    let by_cli = run_in_workspace(store.path(), &p, &["/bin/sh", "-c", "echo cli > cli.txt"]);
    let other = serve(store.path(), &["--workspace-root", &root_s]);
    let oid = other.session(&p);
    other.sh(&oid, "echo other > other.txt");
    let by_other = other.end(&oid);
    let s = serve(store.path(), &["--workspace-root", &root_s]);
    for id in [&by_cli, &by_other, &"20261204-000000-nothere".to_owned()] {
        for r in [
            s.get(&format!("/v1/changes/{id}")),
            s.post(&format!("/v1/changes/{id}/diff"), &json!({})),
            s.apply(id, &json!({"force": true, "include_risky": true})),
            s.delete(&format!("/v1/changes/{id}")),
        ] {
            assert_eq!(r.status, 404, "{id}: {}", r.text());
            let e = &r.json()["error"];
            assert_eq!(e["field"], "change_set", "{e}");
            assert_eq!(e["value"], id.as_str(), "{e}");
        }
    }
    assert_eq!(s.get("/v1/changes").json(), json!([]));
    assert!(!p.join("cli.txt").exists() && !p.join("other.txt").exists());
    assert!(store.path().join(&by_cli).is_dir() && store.path().join(&by_other).is_dir());
    // The other server still has its own.
    assert_eq!(other.get(&format!("/v1/changes/{by_other}")).status, 200);
}

/// A host edit while the session lives is a conflict at apply (a structured 409, nothing
/// applied); `force` applies it. Two sessions on one directory are allowed: the second's apply
/// finds what the first applied, and is held.
#[test]
fn a_host_edit_during_the_session_is_a_conflict() {
    let store = TempDir::new("wsapi-conf-store");
    let (root, p) = root_with_project("wsapi-conf-root");
    let root_s = root.s();
    let s = serve(store.path(), &["--workspace-root", &root_s]);
    let a = s.session(&p);
    let b = s.session(&p);
    s.sh(&a, "echo mine > README; echo a > a.txt");
    s.sh(&b, "echo theirs > README");
    std::fs::write(p.join("src/main.py"), "host\n").unwrap();
    s.sh(&a, "echo session > src/main.py");
    let cs_a = s.end(&a);
    let cs_b = s.end(&b);
    let before = tree(&p);
    let r = s.apply(&cs_a, &json!({}));
    assert_eq!(r.status, 409, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["code"], "held", "{e}");
    assert_eq!(e["held_count"], 1, "{e}");
    assert_eq!(e["held"][0]["path"], "src/main.py", "{e}");
    assert_eq!(e["held"][0]["kind"], "conflict", "{e}");
    assert_eq!(tree(&p), before, "a held apply changed the project");
    let r = s.apply(&cs_a, &json!({"force": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        std::fs::read_to_string(p.join("src/main.py")).unwrap(),
        "session\n"
    );
    assert_eq!(std::fs::read_to_string(p.join("README")).unwrap(), "mine\n");
    // The second session's change set meets the first's apply.
    let r = s.apply(&cs_b, &json!({}));
    assert_eq!(r.status, 409, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["held"][0]["path"], "README", "{e}");
    assert_eq!(e["held"][0]["kind"], "conflict", "{e}");
    assert_eq!(std::fs::read_to_string(p.join("README")).unwrap(), "mine\n");
}

/// What the code plants in the session's layer is refused at apply over the API as by the
/// command line: a link out of the project, a hard link, a fifo, a protected path; a set-user-ID
/// file cannot be made inside, and one written into the stored change set is refused too.
#[test]
fn what_the_code_planted_is_refused_at_apply_and_nothing_changes() {
    let store = TempDir::new("wsapi-plant-store");
    let (root, p) = root_with_project("wsapi-plant-root");
    let root_s = root.s();
    let s = serve(store.path(), &["--workspace-root", &root_s]);
    let id = s.session(&p);
    s.sh(
        &id,
        "set -e
ln -s /etc/passwd evil-link
ln README hard
mkfifo fifo
cp run.sh suid && ! chmod 4755 suid
echo 'echo owned' > .bashrc
echo fine > fine.txt",
    );
    let cs = s.end(&id);
    let before = tree(&p);
    let r = s.apply(&cs, &json!({}));
    assert_eq!(r.status, 409, "{}", r.text());
    let e = r.json()["error"].clone();
    let held: BTreeMap<String, (String, String)> = e["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["path"].as_str().unwrap().to_owned(),
                (
                    h["kind"].as_str().unwrap().to_owned(),
                    h["reason"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect();
    for (path, kind, why) in [
        ("evil-link", "refused", "absolute path"),
        ("hard", "refused", "hard link"),
        ("fifo", "refused", "a fifo"),
        (".bashrc", "protected", "protected"),
    ] {
        let (k, r) = held
            .get(path)
            .unwrap_or_else(|| panic!("{path} not held: {e}"));
        assert_eq!(k, kind, "{path}: {e}");
        assert!(r.contains(why), "{path}: {e}");
    }
    assert!(!held.contains_key("fine.txt"), "{e}");
    assert_eq!(tree(&p), before, "a held apply changed the project");
    // Named one by one, with every override: still refused.
    for path in ["evil-link", "hard", "fifo"] {
        let r = s.apply(
            &cs,
            &json!({"paths": [path], "force": true, "include_risky": true}),
        );
        assert_eq!(r.status, 409, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["held"][0]["kind"], "refused");
        assert_eq!(tree(&p), before, "{path}");
    }
    // A set-user-ID mode written into the stored change set afterwards.
    let entries = store.path().join(&cs).join("entries.jsonl");
    let text = std::fs::read_to_string(&entries).unwrap();
    let edited: String = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if v["path"] == "fine.txt" {
                v["mode"] = 0o4755.into();
            }
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&entries, edited).unwrap();
    let r = s.apply(&cs, &json!({"paths": ["fine.txt"]}));
    assert_eq!(r.status, 409, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["held"][0]["kind"], "refused", "{e}");
    assert!(
        e["held"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("set-user-ID"),
        "{e}"
    );
    assert_eq!(tree(&p), before);
    // A path the change set does not have names the field.
    let r = s.apply(&cs, &json!({"paths": ["no/such"]}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["field"], "paths");
}

/// A session that ends on its own (its TTL) leaves its change set too, and the call for the
/// ended session names it.
#[test]
fn a_session_past_its_ttl_leaves_its_change_set() {
    let store = TempDir::new("wsapi-ttl-store");
    let (root, p) = root_with_project("wsapi-ttl-root");
    let root_s = root.s();
    let s = serve(store.path(), &["--workspace-root", &root_s]);
    let r = s.post(
        "/v1/sandboxes",
        &json!({"workspace": p.display().to_string(), "ttl_s": 1}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    s.sh(&id, "echo late > late.txt");
    // Waits for the reaper (bounded: the test fails rather than hangs).
    let t0 = Instant::now();
    loop {
        let g = s.get(&format!("/v1/sandboxes/{id}"));
        if g.status == 410 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "{}", g.text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Listed as soon as the session is seen gone (the list waits while it is being kept).
    let list = s.get("/v1/changes").json();
    let cs = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["session"] == id.as_str())
        .unwrap_or_else(|| panic!("no change set of {id}: {list}"))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = s.get(&format!("/v1/sandboxes/{id}"));
    assert!(again.text().contains(&cs), "{}", again.text());
    assert!(!p.join("late.txt").exists());
    assert_eq!(s.apply(&cs, &json!({})).status, 200);
    assert_eq!(
        std::fs::read_to_string(p.join("late.txt")).unwrap(),
        "late\n"
    );
}
