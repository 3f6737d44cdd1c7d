//! Policy files, profiles and protected paths, through the real `palisade` binary and real
//! sandboxes. Run as root and as an unprivileged user (see `scripts/test.sh`).

mod common;
use common::*;
use std::process::{Command, Stdio};

fn palisade(args: &[&str]) -> Run {
    Command::new(palisade_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("palisade could not be started")
        .into()
}

fn require(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(found, "{tool} is missing on this host: run .ci/setup");
}

/// A project directory with a git repository's protected files in it, as an agent's checkout
/// would have them.
fn project() -> TempDir {
    let d = TempDir::new("project");
    std::fs::create_dir_all(d.path().join(".git/hooks")).unwrap();
    std::fs::create_dir_all(d.path().join(".git/objects")).unwrap();
    std::fs::write(d.path().join(".git/config"), "[core]\n\tbare = false\n").unwrap();
    std::fs::write(d.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(d.path().join("README"), "hello\n").unwrap();
    d
}

/// Writes, appends, removes, renames and redirects aimed at the repository, each reported as
/// DONE or refused.
const GIT_ATTACK: &str = r#"
try() { if sh -c "$1" 2>/dev/null; then echo "$2: DONE"; else echo "$2: refused"; fi; }
try 'echo evil > .git/hooks/pre-commit' hook-write
try 'printf "[core]\n\tfsmonitor = evil\n" >> .git/config' config-append
try 'rm -f .git/config' config-remove
try 'mv .git/config .git/config.old' config-rename
try 'mv .git/hooks .git/hooks.old' hooks-rename
try 'echo ok > .git/objects/new' objects-write
try 'mv .git .git-old' git-rename
try 'rm -rf .git' git-remove
try 'echo ../.cache/g > .git/commondir' commondir-write
try 'printf "[core]\n\tfsmonitor = evil\n" > .git/config.worktree' worktree-config-write
try 'echo ok >> README' readme-write
"#;

fn assert_refused(r: &Run, names: &[&str]) {
    for refused in names {
        assert!(
            r.stdout.contains(&format!("{refused}: refused")),
            "{refused}\n{}",
            r.stdout
        );
    }
}

/// By default the whole of `.git` is read-only: its config, hooks, `commondir` and
/// `config.worktree` (through which git would take its config and hooks from a directory the code
/// wrote) cannot be written, and `.git` cannot be moved or removed; the rest of the project can.
#[test]
fn protected_paths_cannot_be_written_moved_or_replaced() {
    let d = project();
    let scratch = d.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", GIT_ATTACK],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_refused(
        &r,
        &[
            "hook-write",
            "config-append",
            "config-remove",
            "config-rename",
            "hooks-rename",
            "git-rename",
            "git-remove",
            "commondir-write",
            "worktree-config-write",
            "objects-write",
        ],
    );
    // Control: the rest of the project stays writable.
    assert!(r.stdout.contains("readme-write: DONE"), "{}", r.stdout);
    assert_eq!(
        std::fs::read_to_string(d.path().join(".git/config")).unwrap(),
        "[core]\n\tbare = false\n"
    );
    assert!(!d.path().join(".git/hooks/pre-commit").exists());
    assert!(!d.path().join(".git/commondir").exists());
    assert_eq!(
        std::fs::read_to_string(d.path().join("README")).unwrap(),
        "hello\nok\n"
    );
    let j = r.report();
    let p = &j["protected"];
    assert_eq!(p["read_only"], serde_json::json!([".git"]));
    assert_eq!(p["pinned"], serde_json::json!([]));
    assert_eq!(p["blocked"], serde_json::json!([]));

    // `--unprotect .git` lets code commit; the repository's config, hooks and redirects stay
    // protected: existing ones read-only, the others moved aside after the run.
    let r = run(
        &["--json", "-", "--scratch", &scratch, "--unprotect", ".git"],
        &["/bin/sh", "-c", GIT_ATTACK],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert_refused(
        &r,
        &[
            "hook-write",
            "config-append",
            "config-remove",
            "config-rename",
            "hooks-rename",
            "git-rename",
            "git-remove",
        ],
    );
    for done in ["objects-write", "commondir-write", "worktree-config-write"] {
        assert!(
            r.stdout.contains(&format!("{done}: DONE")),
            "{done}\n{}",
            r.stdout
        );
    }
    let j = r.report();
    let p = &j["protected"];
    assert_eq!(
        p["read_only"],
        serde_json::json!([".git/config", ".git/hooks"])
    );
    assert_eq!(p["pinned"], serde_json::json!([".git"]));
    let blocked = blocked(&j);
    assert_eq!(
        blocked.iter().map(|b| b.0.as_str()).collect::<Vec<_>>(),
        [".git/config.worktree", ".git/commondir"]
    );
    for (path, to) in &blocked {
        assert!(!d.path().join(path).exists(), "{path} is still in place");
        assert!(d.path().join(to).is_file(), "{to}");
    }
}

/// `(path, moved_to)` of each entry of the report's `protected.blocked`; a path that could not be
/// moved fails the test.
fn blocked(report: &serde_json::Value) -> Vec<(String, String)> {
    report["protected"]["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["path"].as_str().unwrap().to_owned(),
                b["moved_to"]
                    .as_str()
                    .unwrap_or_else(|| panic!("not moved: {b}"))
                    .to_owned(),
            )
        })
        .collect()
}

/// The one directory palisade made for what it moved aside: `.palisade-blocked-XXXXXXXX` at the
/// root of `scratch`, mode 0700; every `moved_to` is in it.
fn blocked_dir(scratch: &std::path::Path, moved: &[(String, String)]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let dirs: Vec<String> = std::fs::read_dir(scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".palisade-blocked-"))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let dir = dirs[0].clone();
    assert_eq!(dir.len(), ".palisade-blocked-".len() + 8, "{dir}");
    let meta = std::fs::symlink_metadata(scratch.join(&dir)).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700, "{dir}");
    for (_, to) in moved {
        assert!(to.starts_with(&format!("{dir}/")), "{to}");
    }
    dir
}

/// A protected path that does not exist cannot be covered by a mount, so the code can create it;
/// after the run it is moved into palisade's own directory, reported, and announced on stderr even
/// with `-q`. A symlink the code leaves where a directory would be is what gets moved, never
/// followed; of a missing directory on the way (`.config` here) the whole goes.
#[test]
fn protected_paths_created_inside_are_moved_aside_after_the_run() {
    let d = TempDir::new("created");
    std::fs::create_dir(d.path().join("elsewhere")).unwrap();
    std::fs::create_dir_all(d.path().join(".local/share")).unwrap();
    let script = "echo 'rm -rf ~' > .envrc; mkdir -p .claude && echo '{}' > .claude/settings.json; \
                  mkdir -p .config/fish && echo evil > .config/fish/config.fish; \
                  mkdir -p .local/bin .local/share/app && echo evil > .local/bin/ls && echo ok > .local/share/app/data; \
                  mkdir -p elsewhere/hooks && ln -s elsewhere .cursor; echo made";
    let scratch = d.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    let moved = blocked(&r.report());
    let dir = blocked_dir(d.path(), &moved);
    let want = |p: &str, to: &str| (p.to_owned(), format!("{dir}/{to}"));
    assert_eq!(
        moved,
        vec![
            want(".config", ".config.blocked"),
            want(".envrc", ".envrc.blocked"),
            want(".local/bin", ".local%2Fbin.blocked"),
            want(".claude", ".claude.blocked"),
            want(".cursor", ".cursor.blocked"),
        ]
    );
    let host = d.path();
    assert!(!host.join(".envrc").exists());
    assert_eq!(
        std::fs::read_to_string(host.join(&dir).join(".envrc.blocked")).unwrap(),
        "rm -rf ~\n"
    );
    assert!(!host.join(".claude").exists() && !host.join(".config").exists());
    assert!(!host.join(".local/bin").exists());
    assert!(
        host.join(".local/share/app/data").exists(),
        "only the protected part of an existing directory moves"
    );
    assert!(host
        .join(&dir)
        .join(".config.blocked/fish/config.fish")
        .exists());
    // The symlink itself moved; what it pointed to is untouched.
    assert!(
        std::fs::symlink_metadata(host.join(&dir).join(".cursor.blocked"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(host.join("elsewhere/hooks").is_dir());
    assert!(
        r.stderr.contains(&format!(
            "protected path .envrc was created inside: moved to {dir}/.envrc.blocked\n"
        )),
        "{}",
        r.stderr
    );
    // A second run gets a directory of its own: nothing is ever replaced.
    let r = run(
        &["--scratch", &scratch],
        &["/bin/sh", "-c", "echo again > .envrc"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let second = r
        .stderr
        .strip_prefix("palisade: protected path .envrc was created inside: moved to ")
        .unwrap_or_else(|| panic!("{}", r.stderr))
        .trim_end()
        .to_owned();
    assert!(
        second.starts_with(".palisade-blocked-")
            && second.ends_with("/.envrc.blocked")
            && !second.starts_with(&dir),
        "{second}"
    );
    assert_eq!(
        std::fs::read_to_string(host.join(&dir).join(".envrc.blocked")).unwrap(),
        "rm -rf ~\n"
    );
}

#[test]
fn unprotect_and_protect_change_the_list_and_nothing_else() {
    let d = project();
    std::fs::write(d.path().join("Makefile"), "all:\n").unwrap();
    let scratch = d.s();
    let script = "echo '[user]' >> .git/config && echo config-ok || echo config-refused; \
                  echo evil > .git/hooks/post-checkout || echo hook-refused; \
                  echo x >> Makefile || echo makefile-refused";
    // `.git/config` is inside the protected `.git`: unprotecting it alone changes nothing.
    let r = run(
        &["--scratch", &scratch, "--unprotect", ".git/config"],
        &["/bin/sh", "-c", script],
    );
    assert!(r.stdout.contains("config-refused"), "{}", r.stdout);
    let r = run(
        &[
            "--scratch",
            &scratch,
            "--unprotect",
            ".git",
            "--unprotect",
            ".git/config",
            "--protect",
            "Makefile",
        ],
        &["/bin/sh", "-c", script],
    );
    for want in ["config-ok", "hook-refused", "makefile-refused"] {
        assert!(
            r.stdout.contains(want),
            "{want}: {}\n{}",
            r.stdout,
            r.stderr
        );
    }
    for (opt, bad) in [("--protect", "/etc"), ("--unprotect", "../x")] {
        let r = run(&["--scratch", &scratch, opt, bad], &["true"]);
        assert_eq!(r.code, 125, "{}", r.stderr);
        assert!(
            r.stderr.contains(bad) && r.stderr.contains("relative to the scratch directory"),
            "{}",
            r.stderr
        );
    }
}

#[test]
fn a_symlink_at_a_protected_path_is_refused_before_anything_runs() {
    let d = project();
    std::os::unix::fs::symlink("/etc/passwd", d.path().join(".bashrc")).unwrap();
    let scratch = d.s();
    let r = run(
        &["--scratch", &scratch],
        &["/bin/sh", "-c", "echo ran > ran"],
    );
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("protected path `.bashrc`") && r.stderr.contains("--unprotect .bashrc"),
        "{}",
        r.stderr
    );
    assert!(!d.path().join("ran").exists());
}

#[test]
fn policy_check_names_the_line_the_field_and_what_is_accepted() {
    let d = TempDir::new("check");
    let cases = [
        (
            "[limits]\nmemory = \"lots\"\n",
            "invalid limits.memory `lots`: expected a positive size such as 4096, 64k, 1MiB or 2GB, at most 1 TiB\n    2 | memory = \"lots\"\n",
            2,
        ),
        (
            "[network]\nallow = [\"*\"]\n",
            "invalid network.allow `*`: expected a host without `*`, or `*.DOMAIN` for subdomains; a bare `*` would allow everything, so it is refused\n    2 | allow = [\"*\"]\n",
            2,
        ),
        (
            "[filesystem]\nscratch = \"/nonexistent-palisade\"\n",
            "filesystem.scratch `/nonexistent-palisade`: not a directory on this host\n",
            0,
        ),
        (
            "[filesystem]\nro = [\"/srv/a:/x\", \"/srv/b:/x\"]\n",
            "bind target `/x` is given twice (from `/srv/a` and `/srv/b`); each inside path takes one bind\n",
            0,
        ),
        (
            "[network]\nallow = [\"example.org\"]\nlocal_ports = [3128]\n",
            "invalid network.local_ports `3128`: expected a port the egress proxy does not listen on inside",
            0,
        ),
    ];
    for (i, (text, message, line)) in cases.iter().enumerate() {
        let f = d.path().join(format!("bad{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let name = f.display().to_string();
        let r = palisade(&["policy", "check", &name]);
        assert_eq!(r.code, 125, "{text}: {}", r.stderr);
        let place = if *line > 0 {
            format!("{name}:{line}:")
        } else {
            format!("{name}: ")
        };
        assert!(
            r.stderr.starts_with(&format!("palisade: error: {place}")),
            "{text}: {}",
            r.stderr
        );
        assert!(r.stderr.contains(message), "{text}: {}", r.stderr);
        // `run --policy` refuses the same file the same way, and runs nothing.
        let marker = d.path().join(format!("ran{i}"));
        let touch = format!("touch {}", marker.display());
        let r = palisade(&[
            "run", "-q", "--policy", &name, "--", "/bin/sh", "-c", &touch,
        ]);
        assert_eq!(r.code, 125, "{}", r.stderr);
        assert!(!marker.exists());
    }
    let good = d.path().join("good.toml");
    std::fs::write(
        &good,
        "profiles = [\"python\"]\n[limits]\nmemory = \"512MiB\"\n",
    )
    .unwrap();
    let r = palisade(&["policy", "check", &good.display().to_string()]);
    assert_eq!(
        (r.code, r.stdout.trim()),
        (0, format!("{}: ok", good.display()).as_str()),
        "{}",
        r.stderr
    );
}

/// Defaults, then profiles, then the file, then options: what `policy show` prints is what `run`
/// uses.
#[test]
fn options_override_the_file_which_overrides_its_profiles() {
    let d = TempDir::new("layers");
    let f = d.path().join("p.toml");
    std::fs::write(
        &f,
        "profiles = [\"build\"]\n[env]\nset = { MODE = \"file\", KEEP = \"k\" }\n[limits]\npids = 512\ntimeout = \"2m\"\n",
    )
    .unwrap();
    let file = f.display().to_string();
    let r = palisade(&[
        "policy", "show", "--policy", &file, "--env", "MODE=cli", "--memory", "1GiB",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for want in [
        "MODE = \"cli\"",
        "KEEP = \"k\"",
        "pids = 512",
        "timeout = \"2m\"",
        "memory = \"1GiB\"",
        "tmp_size = \"1GiB\"",
    ] {
        assert!(r.stdout.contains(want), "{want}:\n{}", r.stdout);
    }
    // `show`'s output is itself a valid policy file that gives the same policy.
    let shown = d.path().join("shown.toml");
    std::fs::write(&shown, &r.stdout).unwrap();
    let again = palisade(&["policy", "show", "--policy", &shown.display().to_string()]);
    assert_eq!(again.stdout, r.stdout);
    let r = run(
        &["--json", "-", "--policy", &file, "--env", "MODE=cli"],
        &["/bin/sh", "-c", "echo $MODE $KEEP"],
    );
    assert!(r.stdout.starts_with("cli k\n"), "{}", r.stdout);
    let j = r.report();
    assert_eq!(j["limits"]["pids"], 512);
    assert_eq!(j["limits"]["timeout_ms"], 120_000);
    assert_eq!(j["limits"]["memory_bytes"], 4u64 << 30);
}

/// Each profile runs its typical workload, and the probe's attacks fail under it as under the
/// default: no host secrets, no network, the seccomp wall.
#[test]
fn each_profile_runs_its_workload_and_keeps_the_walls() {
    for t in ["python3", "node", "cc"] {
        require(t);
    }
    let workloads: &[(&str, &str, &str)] = &[
        (
            "python",
            "python3 -c 'import json, sqlite3, subprocess, threading, os\n\
db = sqlite3.connect(\"t.db\"); db.execute(\"create table t(x)\"); db.commit()\n\
out = subprocess.run([\"echo\", \"sub\"], capture_output=True, text=True).stdout.strip()\n\
t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
print(\"python-ok\", out, os.environ[\"PYTHONUNBUFFERED\"], json.dumps([1]))'",
            "python-ok sub 1 [1]",
        ),
        (
            "node",
            "node -e 'const fs = require(\"fs\"); const cp = require(\"child_process\");\n\
fs.writeFileSync(\"n.txt\", \"x\"); const s = cp.execFileSync(\"echo\", [\"sub\"]).toString().trim();\n\
fs.promises.readFile(\"n.txt\", \"utf8\").then(d => console.log(\"node-ok\", s, d, process.env.NPM_CONFIG_FUND));'",
            "node-ok sub x false",
        ),
        (
            "shell",
            "seq 1 1000 | sort -rn | head -3 | tr '\\n' ' ' | sed 's/ $//'; echo \" $LC_ALL\"",
            "1000 999 998 C.UTF-8",
        ),
        (
            "build",
            "printf '#include <stdio.h>\\nint main(void){puts(\"built-ok\");return 0;}\\n' > t.c && cc -O2 -o t t.c && ./t",
            "built-ok",
        ),
    ];
    for (profile, script, want) in workloads {
        let r = run(
            &["--profile", profile, "--json", "-"],
            &["/bin/sh", "-c", script],
        );
        assert_eq!(r.code, 0, "{profile}: {}\n{}", r.stdout, r.stderr);
        assert!(r.stdout.contains(want), "{profile}: {}", r.stdout);
        assert_eq!(r.report()["network"]["mode"], "none", "{profile}");
        let r = probe(&["--profile", profile], &["read", "/etc/shadow"]);
        assert_eq!(r.probe("read /etc/shadow"), "absent", "{profile}");
        let r = probe(&["--profile", profile], &["connect", "10.255.255.1:443"]);
        assert!(
            r.probe("connect 10.255.255.1:443").starts_with("denied"),
            "{profile}"
        );
        let r = probe(&["--profile", profile], &["syscalls"]);
        for call in ["sys bpf", "sys io_uring_setup", "sys unshare-user"] {
            assert_eq!(r.probe(call), "denied EPERM", "{profile} {call}");
        }
    }
    // The two network profiles open exactly their registries.
    for (profile, rules) in [
        (
            "pypi",
            "allow = [\"pypi.org:443\", \"files.pythonhosted.org:443\"]",
        ),
        ("npm", "allow = [\"registry.npmjs.org:443\"]"),
    ] {
        let r = palisade(&["policy", "show", "--profile", profile]);
        assert!(r.stdout.contains(rules), "{profile}: {}", r.stdout);
    }
    let r = palisade(&["policy", "show", "--profile", "nope"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr.contains("invalid --profile `nope`"),
        "{}",
        r.stderr
    );
}

/// `git` on the host after the run, as the test's user (the owner of the scratch directory), with
/// `HOME` at `home` and no system config: what the user does next in the project.
fn host_git(
    dir: &std::path::Path,
    home: &std::path::Path,
    path: Option<&str>,
    args: &[&str],
) -> Run {
    let sys_path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            path.map_or(sys_path.clone(), |p| format!("{p}:{sys_path}")),
        )
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.org")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.org")
        .stdin(Stdio::null())
        .output()
        .expect("git could not be started")
        .into()
}

/// A git repository with one commit in a fresh directory, made with `host_git`.
fn repo(tag: &str, home: &TempDir) -> TempDir {
    require("git");
    let d = TempDir::new(tag);
    std::fs::write(d.path().join("README"), "hello\n").unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "README"],
        &["commit", "-qm", "init"],
    ] {
        let r = host_git(d.path(), home.path(), None, args);
        assert_eq!(r.code, 0, "git {args:?}: {}", r.stderr);
    }
    d
}

/// What each planted command does when it runs on the host: says so, and leaves `pwned` in the
/// directory it runs in.
const PLANTED: &str = "echo PWNED >&2; touch pwned; false";

/// The host's `git` ran none of the planted commands: `r` says nothing of it and none of `dirs`
/// holds a `pwned` file.
fn assert_not_run(r: &Run, dirs: &[&std::path::Path]) {
    assert!(
        !r.stderr.contains("PWNED") && !r.stdout.contains("PWNED"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    for d in dirs {
        assert!(
            !d.join("pwned").exists(),
            "a planted command ran in {}",
            d.display()
        );
    }
}

/// F1 of the 2026-12-03 audit: `.git/commondir` (or `config.worktree`) pointed at a config the
/// code wrote, with a `core.fsmonitor` that the host's next `git status` runs. Refused with the
/// default list (`.git` read-only); with `--unprotect .git` the created redirects are moved aside.
#[test]
fn a_commondir_redirect_never_reaches_the_hosts_git() {
    let home = TempDir::new("home");
    let attack = format!(
        "mkdir -p .cache/g && cp -r .git/objects .git/refs .git/HEAD .cache/g/ && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"{PLANTED}\"\\n' > .cache/g/config; \
         echo ../.cache/g > .git/commondir && echo commondir-written; \
         printf '[extensions]\\n\\tworktreeConfig = true\\n' >> .git/config && \
         printf '[core]\\n\\tfsmonitor = \"{PLANTED}\"\\n' > .git/config.worktree && echo worktree-written; true"
    );
    for unprotect in [&[][..], &["--unprotect", ".git"]] {
        let d = repo("commondir", &home);
        let scratch = d.s();
        let mut opts = vec!["--json", "-", "--scratch", &scratch];
        opts.extend_from_slice(unprotect);
        let r = run(&opts, &["/bin/sh", "-c", &attack]);
        assert_eq!(r.code, 0, "{unprotect:?}: {}\n{}", r.stdout, r.stderr);
        let g = host_git(d.path(), home.path(), None, &["status", "--short"]);
        assert_eq!(g.code, 0, "{}", g.stderr);
        assert_not_run(&g, &[d.path()]);
        let j = r.report();
        if unprotect.is_empty() {
            assert!(!r.stdout.contains("commondir-written"), "{}", r.stdout);
            assert_eq!(j["protected"]["read_only"], serde_json::json!([".git"]));
        } else {
            assert!(r.stdout.contains("commondir-written"), "{}", r.stdout);
            let paths: Vec<String> = blocked(&j).into_iter().map(|b| b.0).collect();
            assert_eq!(paths, [".git/commondir"], "{unprotect:?}");
        }
    }
}

/// A hook directory named by the repository's `core.hooksPath` is protected as `.git/hooks` is:
/// read-only where it exists, moved aside after the run where the code created it; the report
/// says where it was named. The host's next commit runs no hook of the code's.
#[test]
fn a_core_hookspath_directory_is_protected() {
    let home = TempDir::new("home");
    let attack = format!(
        "if [ -e .githooks/keep ]; then mv .githooks .githooks.old 2>/dev/null && echo hooks-moved && \
         mv .githooks.old .githooks; fi; \
         mkdir -p .githooks; printf '#!/bin/sh\\n{PLANTED}\\n' > .githooks/pre-commit && \
         chmod 755 .githooks/pre-commit && echo hook-written; true"
    );
    for exists in [true, false] {
        let d = repo("hookspath", &home);
        let r = host_git(
            d.path(),
            home.path(),
            None,
            &["config", "core.hooksPath", ".githooks"],
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        if exists {
            std::fs::create_dir(d.path().join(".githooks")).unwrap();
            std::fs::write(d.path().join(".githooks/keep"), "").unwrap();
        }
        let scratch = d.s();
        let r = run(
            &["--json", "-", "--scratch", &scratch],
            &["/bin/sh", "-c", &attack],
        );
        assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
        let g = host_git(
            d.path(),
            home.path(),
            None,
            &["commit", "--allow-empty", "-qm", "next"],
        );
        assert_eq!(g.code, 0, "{}", g.stderr);
        assert_not_run(&g, &[d.path()]);
        let j = r.report();
        assert_eq!(
            j["protected"]["derived"],
            serde_json::json!([{"path": ".githooks", "from": "core.hooksPath in `.git/config`"}])
        );
        if exists {
            assert!(!r.stdout.contains("hook-written"), "{}", r.stdout);
            assert!(!r.stdout.contains("hooks-moved"), "{}", r.stdout);
            assert_eq!(
                j["protected"]["read_only"],
                serde_json::json!([".git", ".githooks"])
            );
        } else {
            assert!(r.stdout.contains("hook-written"), "{}", r.stdout);
            let paths: Vec<String> = blocked(&j).into_iter().map(|b| b.0).collect();
            assert_eq!(paths, [".githooks"]);
        }
    }
}

/// A scratch directory inside a repository, without a `.git` of its own: the code makes one
/// (`HEAD`, and a `commondir` to a config of its own), which the host's `git` would take for the
/// directory's repository. The `.git` it made is watched and moved aside as a whole.
#[test]
fn a_new_git_in_a_scratch_inside_a_repository_is_moved_aside() {
    let home = TempDir::new("home");
    let outer = repo("outer", &home);
    let sub = outer.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let attack = format!(
        "mkdir -p .git .cache/gc/objects .cache/gc/refs && echo 'ref: refs/heads/main' > .git/HEAD && \
         echo ../.cache/gc > .git/commondir && \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"{PLANTED}\"\\n' > .cache/gc/config && echo made"
    );
    let scratch = sub.display().to_string();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", &attack],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    let g = host_git(&sub, home.path(), None, &["status", "--short"]);
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_not_run(&g, &[&sub, outer.path()]);
    assert!(!sub.join(".git").exists());
    let moved = blocked(&r.report());
    let dir = blocked_dir(&sub, &moved);
    assert_eq!(moved, [(".git".to_owned(), format!("{dir}/.git.blocked"))]);
}

/// A scratch directory that is a home directory (as `.bashrc` on the list assumes it may be):
/// git's user config, which every repository reads, is protected.
#[test]
fn a_gitconfig_in_a_home_like_scratch_is_moved_aside() {
    let home_scratch = TempDir::new("homescratch");
    std::fs::create_dir_all(home_scratch.path().join(".config")).unwrap();
    let attack = format!(
        "printf '[core]\\n\\tfsmonitor = \"{PLANTED}\"\\n' > .gitconfig; \
         mkdir -p .config/git && cp .gitconfig .config/git/config && echo made"
    );
    let scratch = home_scratch.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", &attack],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    // Any repository, with this directory as HOME.
    let other = repo("other", &TempDir::new("home"));
    let g = host_git(
        other.path(),
        home_scratch.path(),
        None,
        &["status", "--short"],
    );
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_not_run(&g, &[other.path()]);
    let moved = blocked(&r.report());
    let paths: Vec<&str> = moved.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(paths, [".gitconfig", ".config/git"]);
}

/// A home-like scratch again: the places a login or the desktop starts programs from, and a key
/// that lets someone in. A `git` in `.local/bin` would shadow the host's.
#[test]
fn login_places_in_a_home_like_scratch_are_moved_aside() {
    let home_scratch = TempDir::new("homescratch");
    for d in [".config", ".local/share"] {
        std::fs::create_dir_all(home_scratch.path().join(d)).unwrap();
    }
    let attack = format!(
        "mkdir -p .ssh .config/systemd/user .config/autostart .local/bin && \
         echo 'ssh-ed25519 AAAA attacker' > .ssh/authorized_keys && \
         printf '[Service]\\nExecStart=/bin/sh -c \"{PLANTED}\"\\n' > .config/systemd/user/evil.service && \
         printf '[Desktop Entry]\\nExec=/bin/sh -c \"{PLANTED}\"\\n' > .config/autostart/evil.desktop && \
         printf '#!/bin/sh\\n{PLANTED}\\n' > .local/bin/git && chmod 755 .local/bin/git && echo made"
    );
    let scratch = home_scratch.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", &attack],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    let other = repo("other", &TempDir::new("home"));
    let bin = home_scratch.path().join(".local/bin").display().to_string();
    let g = host_git(
        other.path(),
        home_scratch.path(),
        Some(&bin),
        &["status", "--short"],
    );
    assert_eq!(g.code, 0, "{}", g.stderr);
    assert_not_run(&g, &[other.path(), home_scratch.path()]);
    for p in [
        ".ssh/authorized_keys",
        ".config/systemd/user/evil.service",
        ".config/autostart/evil.desktop",
        ".local/bin/git",
    ] {
        assert!(
            !home_scratch.path().join(p).exists(),
            "{p} is still in place"
        );
    }
    let moved = blocked(&r.report());
    let paths: Vec<&str> = moved.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(
        paths,
        [".ssh", ".config/systemd", ".config/autostart", ".local/bin"]
    );
}

/// F2 of the audit, as root did it: every `NAME.palisade-blocked-N` name taken beforehand. The
/// path goes into palisade's own directory all the same, and the names the code made stay.
#[test]
fn a_created_protected_path_is_moved_even_with_every_old_name_taken() {
    let d = TempDir::new("names");
    let scratch = d.s();
    let script = "echo 'echo PWNED' > .envrc; : > .envrc.palisade-blocked; \
                  i=2; while [ $i -le 999 ]; do : > .envrc.palisade-blocked-$i; i=$((i+1)); done; echo made";
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    assert!(!d.path().join(".envrc").exists(), "{}", r.stderr);
    let moved = blocked(&r.report());
    let dir = blocked_dir(d.path(), &moved);
    assert_eq!(
        moved,
        [(".envrc".to_owned(), format!("{dir}/.envrc.blocked"))]
    );
    let taken = std::fs::read_dir(d.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".envrc.palisade-blocked")
        })
        .count();
    assert_eq!(taken, 999);
}

/// F2 of the audit, as an unprivileged supervisor met it: the code makes the directories on the
/// way unwritable or unsearchable (it owns them, as the supervisor's user does). The supervisor
/// gets through, moves the paths aside, and puts the modes back as the code left them.
#[test]
fn a_created_protected_path_is_moved_even_when_its_directories_are_locked() {
    use std::os::unix::fs::PermissionsExt;
    let d = TempDir::new("locked");
    std::fs::create_dir(d.path().join(".config")).unwrap();
    let scratch = d.s();
    let script =
        "mkdir -p .git/hooks && printf '#!/bin/sh\\necho PWNED\\n' > .git/hooks/post-checkout && \
                  chmod 755 .git/hooks/post-checkout && echo 'echo PWNED' > .envrc && \
                  mkdir .config/fish && echo evil > .config/fish/config.fish && \
                  chmod 555 .git /workspace && chmod 000 .config && echo locked";
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", script],
    );
    let mode = |p: &str| {
        std::fs::symlink_metadata(d.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    let (root_mode, config_mode) = (mode(""), mode(".config"));
    // Unlocked for the checks and for the clean-up.
    for p in ["", ".config"] {
        std::fs::set_permissions(d.path().join(p), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("locked"), "{}", r.stdout);
    assert_eq!((root_mode, config_mode), (0o555, 0o000));
    for p in [".git", ".envrc", ".config/fish"] {
        assert!(
            !d.path().join(p).exists(),
            "{p} is still in place: {}",
            r.stderr
        );
    }
    let moved = blocked(&r.report());
    let dir = blocked_dir(d.path(), &moved);
    assert_eq!(
        moved,
        [
            (".git".to_owned(), format!("{dir}/.git.blocked")),
            (".envrc".to_owned(), format!("{dir}/.envrc.blocked")),
            (
                ".config/fish".to_owned(),
                format!("{dir}/.config%2Ffish.blocked")
            ),
        ]
    );
    assert!(d
        .path()
        .join(&dir)
        .join(".git.blocked/hooks/post-checkout")
        .is_file());
}

/// A created protected path that cannot be moved at all (here the host makes its directory
/// immutable while the run lasts, which needs root) fails the run: status `protection-failed`,
/// exit 125, the report says what is still in place, whatever the program's own result.
#[test]
fn a_protected_path_that_cannot_be_moved_fails_the_run() {
    if euid() != 0 {
        eprintln!("root only: making a directory immutable (chattr +i) needs root; report::tests covers the status unprivileged");
        return;
    }
    require("chattr");
    let d = TempDir::new("immutable");
    std::fs::create_dir(d.path().join(".config")).unwrap();
    let scratch = d.s();
    let script = "mkdir .config/fish && echo evil > .config/fish/config.fish && \
                  while [ ! -e go ]; do sleep 0.05; done; echo done";
    let mut child = command(
        &["--json", "-", "--scratch", &scratch, "--timeout", "5m"],
        &["/bin/sh", "-c", script],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // No deadline of the test's own: the payload waits for `go`, and palisade's timeout bounds
    // the run. If palisade ends first, the assertions below say why.
    while !d.path().join(".config/fish/config.fish").exists() && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let chattr = |flag: &str| {
        let s = Command::new("chattr")
            .arg(flag)
            .arg(d.path().join(".config"))
            .status()
            .unwrap();
        assert!(s.success(), "chattr {flag}");
    };
    chattr("+i");
    std::fs::write(d.path().join("go"), "").unwrap();
    let r: Run = child.wait_with_output().unwrap().into();
    chattr("-i");
    assert_eq!(r.code, 125, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("done"), "{}", r.stdout);
    let j = r.report();
    assert_eq!(j["status"], "protection-failed");
    assert_eq!(j["exit_code"], 0);
    let b = &j["protected"]["blocked"][0];
    assert_eq!(b["path"], ".config/fish");
    assert_eq!(b["moved_to"], serde_json::Value::Null);
    assert!(
        b["error"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{b}"
    );
    assert!(
        j["error"].as_str().unwrap().contains(".config/fish"),
        "{}",
        j["error"]
    );
    assert!(
        r.stderr.contains("could NOT be moved aside"),
        "{}",
        r.stderr
    );
}

/// Ordinary work in a protected project: builds write their output (`target/`, `node_modules/`,
/// `__pycache__`), git reads the repository, and nothing is blocked.
#[test]
fn ordinary_builds_in_a_protected_project_block_nothing() {
    for t in ["python3", "node", "cc", "git"] {
        require(t);
    }
    let home = TempDir::new("home");
    let d = repo("builds", &home);
    std::fs::write(d.path().join("m.py"), "X = 1\n").unwrap();
    let script = "python3 -c 'import m; print(\"py\", m.X)' && \
                  node -e 'const fs = require(\"fs\"); fs.mkdirSync(\"node_modules/x\", {recursive: true}); fs.writeFileSync(\"node_modules/x/index.js\", \"1\"); console.log(\"node\")' && \
                  mkdir -p target && printf 'int main(void){return 0;}\\n' > t.c && cc -o target/t t.c && ./target/t && echo built && \
                  git status --short >/dev/null && git log --oneline | wc -l";
    let scratch = d.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for want in ["py 1", "node", "built"] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    for p in ["__pycache__", "node_modules/x/index.js", "target/t"] {
        assert!(d.path().join(p).exists(), "{p}");
    }
    assert_eq!(r.report()["protected"]["blocked"], serde_json::json!([]));
}

/// A file's `[bounds]` through the command line: the defaults are lowered to them, an option
/// beyond them is refused before anything runs, naming the option, both values and the file.
#[test]
fn a_files_bounds_lower_the_defaults_and_refuse_options_beyond_them() {
    let d = TempDir::new("bounds");
    let f = d.path().join("p.toml");
    std::fs::write(
        &f,
        "[limits]\ntimeout = \"20s\"\n[bounds.limits]\ntimeout = \"1m\"\nmemory = \"256MiB\"\n[bounds.filesystem]\nro = [\"/usr\"]\n",
    )
    .unwrap();
    let file = f.display().to_string();
    // Nothing asked: the file's timeout, the default memory lowered to the bound.
    let r = palisade(&[
        "run",
        "-q",
        "--json",
        "-",
        "--policy",
        &file,
        "--ro",
        "/usr/share:/s",
        "--",
        "/bin/sh",
        "-c",
        "test -d /s && echo in",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("in\n"), "{}", r.stdout);
    let j = r.report();
    assert_eq!(j["limits"]["timeout_ms"], 20_000);
    assert_eq!(j["limits"]["memory_bytes"], 256u64 << 20);
    let marker = d.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for (opts, message) in [
        (
            vec!["--memory", "1GiB"],
            format!("palisade: error: --memory: 1GiB is beyond the bounds of {file} (at most 256MiB)\n"),
        ),
        (
            vec!["--timeout", "2m"],
            format!("palisade: error: --timeout: 2m is beyond the bounds of {file} (at most 1m)\n"),
        ),
        (
            vec!["--ro", "/etc"],
            format!("palisade: error: --ro: /etc is beyond the bounds of {file} (host paths at or under one of: /usr)\n"),
        ),
        (
            vec!["--rw", "/usr/share:/s"],
            format!("palisade: error: --rw: /usr/share is beyond the bounds of {file} (none: no host path may be bound writable)\n"),
        ),
        (
            vec!["--allow-net", "example.org"],
            format!("palisade: error: --allow-net: example.org is beyond the bounds of {file} (none: no egress)\n"),
        ),
    ] {
        let mut o = vec!["run", "-q", "--policy", &file];
        o.extend(opts.iter());
        o.extend(["--", "/bin/sh", "-c", &touch]);
        let r = palisade(&o);
        assert_eq!((r.code, r.stderr.as_str()), (125, message.as_str()), "{opts:?}");
        assert!(!marker.exists(), "{opts:?}: the command ran");
    }
    // A file whose own fields are beyond its bounds is refused in its own words.
    std::fs::write(&f, "[limits]\npids = 100\n[bounds.limits]\npids = 50\n").unwrap();
    let r = palisade(&["policy", "check", &file]);
    assert_eq!(r.code, 125);
    assert_eq!(
        r.stderr,
        format!("palisade: error: {file}: limits.pids: 100 is beyond the bounds (at most 50)\n")
    );
}

/// `env.pass` is a name until palisade gives it its own value at run time: `policy show` prints
/// names, never values; an unset name is refused, saying where it came from.
#[test]
fn variables_passed_by_name_get_palisades_value_only_at_run_time() {
    let d = TempDir::new("pass");
    let f = d.path().join("p.toml");
    std::fs::write(&f, "[env]\npass = [\"PALISADE_T_SECRET\"]\n").unwrap();
    let file = f.display().to_string();
    let show = Command::new(palisade_bin())
        .args([
            "policy",
            "show",
            "--policy",
            &file,
            "--env",
            "PALISADE_T_OTHER",
        ])
        .env("PALISADE_T_SECRET", "s3cr3t-value")
        .env("PALISADE_T_OTHER", "other-value")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(
        out.contains("pass = [\"PALISADE_T_SECRET\", \"PALISADE_T_OTHER\"]\n")
            && !out.contains("value"),
        "{out}"
    );
    let mut c = command(&["--policy", &file], &["/probe", "env"]);
    c.env("PALISADE_T_SECRET", "s3cr3t-value");
    let r: Run = c.output().unwrap().into();
    assert!(
        r.stdout
            .contains("probe env: PALISADE_T_SECRET=s3cr3t-value"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let mut c = command(&["--policy", &file], &["true"]);
    c.env_remove("PALISADE_T_SECRET");
    let r: Run = c.output().unwrap().into();
    assert_eq!(r.code, 125);
    assert_eq!(
        r.stderr,
        format!("palisade: error: {file}: env.pass `PALISADE_T_SECRET` is not set in palisade's environment; set it, or give its value in env.set\n")
    );
}
