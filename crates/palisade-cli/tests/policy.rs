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

#[test]
fn protected_paths_cannot_be_written_moved_or_replaced() {
    let d = project();
    let attack = r#"
try() { if sh -c "$1" 2>/dev/null; then echo "$2: DONE"; else echo "$2: refused"; fi; }
try 'echo evil > .git/hooks/pre-commit' hook-write
try 'printf "[core]\n\tfsmonitor = evil\n" >> .git/config' config-append
try 'rm -f .git/config' config-remove
try 'mv .git/config .git/config.old' config-rename
try 'mv .git/hooks .git/hooks.old' hooks-rename
try 'mv .git .git-old' git-rename
try 'rm -rf .git' git-remove
try 'echo ok >> README' readme-write
try 'echo ok > .git/objects/new' objects-write
"#;
    let scratch = d.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", attack],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    for refused in [
        "hook-write",
        "config-append",
        "config-remove",
        "config-rename",
        "hooks-rename",
        "git-rename",
        "git-remove",
    ] {
        assert!(
            r.stdout.contains(&format!("{refused}: refused")),
            "{refused}\n{}",
            r.stdout
        );
    }
    // Control: the rest of the project, .git's other contents included, stays writable.
    assert!(r.stdout.contains("readme-write: DONE"), "{}", r.stdout);
    assert_eq!(
        std::fs::read_to_string(d.path().join(".git/config")).unwrap(),
        "[core]\n\tbare = false\n"
    );
    assert!(!d.path().join(".git/hooks/pre-commit").exists());
    assert_eq!(
        std::fs::read_to_string(d.path().join("README")).unwrap(),
        "hello\nok\n"
    );
    let j = r.report();
    let p = &j["protected"];
    assert_eq!(
        p["read_only"],
        serde_json::json!([".git/hooks", ".git/config"])
    );
    assert_eq!(p["pinned"], serde_json::json!([".git"]));
    assert_eq!(p["blocked"], serde_json::json!([]));
}

/// A protected path that does not exist cannot be covered by a mount, so the code can create it;
/// after the run it is moved aside, reported, and announced on stderr even with `-q`. A symlink
/// the code leaves where a directory would be is what gets moved, never followed.
#[test]
fn protected_paths_created_inside_are_moved_aside_after_the_run() {
    let d = TempDir::new("created");
    std::fs::create_dir(d.path().join("elsewhere")).unwrap();
    let script = "echo 'rm -rf ~' > .envrc; mkdir -p .claude && echo '{}' > .claude/settings.json; \
                  mkdir -p .config/pip .config/fish && echo evil > .config/fish/config.fish && echo ok > .config/pip/pip.conf; \
                  mkdir -p elsewhere/hooks && ln -s elsewhere .cursor; echo made";
    let scratch = d.s();
    let r = run(
        &["--json", "-", "--scratch", &scratch],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("made"), "{}", r.stdout);
    let moved: Vec<(String, String)> = r.report()["protected"]["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["path"].as_str().unwrap().to_owned(),
                b["moved_to"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = |p: &str, to: &str| (p.to_owned(), to.to_owned());
    assert_eq!(
        moved,
        vec![
            want(".envrc", ".envrc.palisade-blocked"),
            want(".config/fish", ".config/fish.palisade-blocked"),
            want(".claude", ".claude.palisade-blocked"),
            want(".cursor", ".cursor.palisade-blocked"),
        ]
    );
    let host = d.path();
    assert!(!host.join(".envrc").exists() && host.join(".envrc.palisade-blocked").exists());
    assert!(!host.join(".claude").exists());
    assert!(
        host.join(".config/pip/pip.conf").exists(),
        "only the protected part moves"
    );
    assert!(host
        .join(".config/fish.palisade-blocked/config.fish")
        .exists());
    // The symlink itself moved; what it pointed to is untouched.
    assert!(
        std::fs::symlink_metadata(host.join(".cursor.palisade-blocked"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(host.join("elsewhere/hooks").is_dir());
    assert!(
        r.stderr.contains(
            "protected path .envrc was created inside: moved to .envrc.palisade-blocked\n"
        ),
        "{}",
        r.stderr
    );
    // A second run never replaces what the first moved aside.
    let r = run(
        &["--scratch", &scratch],
        &["/bin/sh", "-c", "echo again > .envrc"],
    );
    assert!(
        r.stderr.contains(
            "protected path .envrc was created inside: moved to .envrc.palisade-blocked-2"
        ),
        "{}",
        r.stderr
    );
}

#[test]
fn unprotect_and_protect_change_the_list_and_nothing_else() {
    let d = project();
    std::fs::write(d.path().join("Makefile"), "all:\n").unwrap();
    let scratch = d.s();
    let script = "echo '[user]' >> .git/config && echo config-ok; \
                  echo evil > .git/hooks/post-checkout || echo hook-refused; \
                  echo x >> Makefile || echo makefile-refused";
    let r = run(
        &[
            "--scratch",
            &scratch,
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
