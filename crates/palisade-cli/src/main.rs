//! `palisade`: the command-line front end. Thin: parse, build a policy, run, report.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use palisade::policy::untrusted::Untrusted;
use palisade::policy::{
    parse_count, parse_cpus, parse_duration, parse_size, Bind, Degradable, EnvVar, MAX_OPEN_FILES,
    MAX_PIDS,
};
use palisade::term::{ForwardedSignals, RawTerminal};
use palisade::{Report, Sandbox, EXIT_SANDBOX_ERROR};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

mod serve;

/// A kernel-enforced sandbox for code nobody has read.
#[derive(Parser, Debug)]
#[command(name = "palisade", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a command in a new sandbox.
    ///
    /// Exit status: the command's own; 128+N if it was killed by signal N; 124 if palisade killed
    /// it for a limit (timeout, CPU time, memory, output); 125 if palisade itself failed (bad option, setup failure);
    /// 126 if the command cannot be executed; 127 if it was not found inside the sandbox.
    Run(Box<RunArgs>),
    /// Check what this host gives each layer (user namespaces, Landlock, seccomp, cgroups,
    /// containers), end with a real trial run, and say how to fix what is missing. Exit status 0
    /// when `palisade run` works here, 1 when it does not.
    Doctor {
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delegate a palisade cgroup subtree to a user, once, as root (like systemd's Delegate=yes),
    /// so that the user's sandboxes get memory and process ceilings.
    CgroupDelegate {
        /// The user (name or uid) to delegate to.
        #[arg(long)]
        user: String,
    },
    /// Check, show and describe policy files and profiles (docs/policy.md).
    Policy {
        #[command(subcommand)]
        cmd: PolicyCmd,
    },
    /// Serve the HTTP API: one-shot runs, batches, sessions, files, a SandboxFusion-compatible
    /// /run_code (docs/server.md). The policy file is the ceiling of every request.
    Serve(Box<serve::ServeArgs>),
    /// The server's agent inside a sandbox (not for direct use).
    #[command(name = "__agent", hide = true)]
    Agent,
}

#[derive(Subcommand, Debug)]
enum PolicyCmd {
    /// Validate a policy file: each error with its line, the field, the bad value and what is
    /// accepted. Exit status 0 when the file is valid, 125 when it is not.
    Check {
        /// The policy file (TOML).
        file: PathBuf,
    },
    /// Print the effective policy, as a policy file, after the defaults, the profiles, the file
    /// and the options, exactly as `palisade run` with the same options would use it.
    Show(Box<RunArgs>),
    /// Print the JSON Schema of policy files (for editors).
    Schema,
    /// List the built-in profiles and what each opens.
    Profiles,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Read the policy from a TOML file (docs/policy.md); options given here override it.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Apply a built-in profile (repeatable, in order, after the file's own profiles):
    /// default, python, pypi, node, npm, shell, build. `palisade policy profiles` lists them.
    #[arg(long = "profile", value_name = "NAME")]
    profile: Vec<String>,
    /// Keep PATH (relative to a host --scratch directory) read-only inside, on top of the
    /// protected defaults (all of .git, shell and login files, .ssh, editor, agent, Python and Node
    /// settings: `palisade policy show` lists them). Repeatable.
    #[arg(long = "protect", value_name = "PATH")]
    protect: Vec<String>,
    /// Make a protected path writable again (repeatable). It reopens a way for code to act after
    /// the run: use it for a workload that must write that very path.
    #[arg(long = "unprotect", value_name = "PATH")]
    unprotect: Vec<String>,
    /// Host directory mounted read-write at /workspace (the working directory and $HOME).
    /// Default: a fresh tmpfs that vanishes with the run. With a real project the code changes
    /// the project itself, and what it leaves there runs later on the host, outside any sandbox:
    /// the source and build files when someone runs them, and files that host tools load or run
    /// without asking (git config and hooks, shell and editor settings, a virtual environment).
    /// Protected paths keep the known places of the second kind read-only, or move what the code
    /// created there aside after the run; no list names them all. Review what changed before
    /// using it. A copy-on-write workspace (--workspace, planned) will be the recommended way to
    /// give code a project.
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Use a host temporary directory as scratch and keep it after the run (its path is reported).
    #[arg(long, conflicts_with = "scratch")]
    keep: bool,
    /// Make a host path visible read-only: HOST or HOST:INSIDE. Repeatable.
    #[arg(long = "ro", value_name = "HOST[:INSIDE]")]
    ro: Vec<String>,
    /// Make a host path visible read-write: HOST or HOST:INSIDE. Repeatable.
    #[arg(long = "rw", value_name = "HOST[:INSIDE]")]
    rw: Vec<String>,
    /// Set a variable inside: NAME=VALUE, or NAME to pass palisade's own value. Repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// Write the JSON report to PATH (replaced as a whole at the end; refused inside the scratch
    /// directory or a --rw bind), or to stdout with `-`, after the command's own output. `-` is
    /// for people: the command can print a report-shaped line itself, so programs read PATH or
    /// --report-fd, never stdout, and never judge a run by the exit status alone.
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    json: Option<String>,
    /// Write the JSON report to descriptor N, which the caller opened (e.g. `3>report.json`) and
    /// the sandbox never sees: a channel the command cannot forge.
    #[arg(long = "report-fd", value_name = "N")]
    report_fd: Option<i32>,
    /// Give the command a pseudo-terminal of its own (default: when stdin is a terminal).
    #[arg(long, overrides_with = "no_tty")]
    tty: bool,
    /// Never allocate a pseudo-terminal.
    #[arg(long = "no-tty", overrides_with = "tty")]
    no_tty: bool,
    /// Wall-clock limit for the whole run, e.g. 30s, 1.5m, 2h (default 10m). At the deadline every
    /// process of the sandbox is killed and the status is `timeout` (exit 124).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// CPU time for all processes of the sandbox together, user plus system, e.g. 30s (default:
    /// the --timeout value). When it is used up every process is killed and the status is
    /// `cpu-timeout` (exit 124).
    #[arg(long = "cpu-time", value_name = "DURATION", allow_hyphen_values = true)]
    cpu_time: Option<String>,
    /// Cap on stdout plus stderr, e.g. 1MiB (default 64MiB). Past it, output is discarded, the
    /// sandbox is killed and the status is `output-limit` (exit 124).
    #[arg(long = "output-limit", value_name = "SIZE", allow_hyphen_values = true)]
    output_limit: Option<String>,
    /// Ceiling on processes and threads inside the sandbox, init included (default 1024); forks
    /// past it fail with EAGAIN.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pids: Option<String>,
    /// Open files per process (default 1024).
    #[arg(long = "open-files", value_name = "N", allow_hyphen_values = true)]
    open_files: Option<String>,
    /// Largest file a process may write, e.g. 100MiB (default 1GiB); past it the writer gets
    /// SIGXFSZ.
    #[arg(long = "file-size", value_name = "SIZE", allow_hyphen_values = true)]
    file_size: Option<String>,
    /// Memory ceiling for the whole sandbox, tmpfs contents included, swap off, e.g. 512MiB
    /// (default 2GiB). Past it the kernel's OOM killer acts; the status is `oom` (exit 124).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    memory: Option<String>,
    /// Run even though the host cannot enforce LAYER, which the report then lists as waived.
    /// Accepted: cgroup (memory and process ceilings; rlimits still apply), landlock (the
    /// filesystem's second wall, for kernels without Landlock; the mount view still applies).
    /// Repeatable.
    #[arg(long = "allow-degraded", value_name = "LAYER")]
    allow_degraded: Vec<String>,
    /// Size of the sandbox's /tmp tmpfs, e.g. 64MiB (default 256MiB); past it, writes fail with
    /// ENOSPC. Its contents also count against --memory.
    #[arg(long = "tmp-size", value_name = "SIZE", allow_hyphen_values = true)]
    tmp_size: Option<String>,
    /// Size of the ephemeral scratch tmpfs at /workspace (default 1GiB).
    #[arg(long = "scratch-size", value_name = "SIZE", allow_hyphen_values = true)]
    scratch_size: Option<String>,
    /// CPU share for the whole sandbox, e.g. 0.5 or 2, enforced by the cgroup's CPU quota
    /// (default: no quota; the wall-clock timeout bounds a runaway loop).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    cpus: Option<String>,
    /// Let processes inside the sandbox trace one another (ptrace, process_vm_readv/writev: gdb,
    /// strace), which the seccomp filter refuses by default. Nothing outside becomes reachable.
    #[arg(long = "allow-ptrace")]
    allow_ptrace: bool,
    /// Allow egress to RULE through palisade's proxy (repeatable): HOST, *.DOMAIN (subdomains
    /// only), an IP address, [IPv6] or a CIDR block, optionally :PORT (default 80 and 443).
    /// Without any, the sandbox has no network at all.
    #[arg(long = "allow-net", value_name = "RULE")]
    allow_net: Vec<String>,
    /// Deny RULE even where an allow rule matches (repeatable; without :PORT, every port).
    #[arg(long = "deny-net", value_name = "RULE")]
    deny_net: Vec<String>,
    /// Resolve HOST to IP for the proxy's upstream connections instead of asking the system
    /// resolver (repeatable; for tests and special setups; the address is still checked).
    #[arg(long, value_name = "HOST=IP")]
    resolve: Vec<String>,
    /// Ask the DNS server at IP (port 53, or :PORT) for the addresses of allowed names instead of
    /// the system resolver: a test network's own server, or a resolver /etc/resolv.conf does not
    /// name. The answers are checked like any other address.
    #[arg(long = "dns-server", value_name = "IP[:PORT]")]
    dns_server: Option<String>,
    /// Let the payload listen on TCP PORT inside its own network namespace and connect to it
    /// there (repeatable), for a test server and its client both inside; nothing outside can
    /// reach it. Landlock refuses every other TCP bind, and every connect but to these ports and
    /// the egress proxy's.
    #[arg(long = "allow-local-port", value_name = "PORT")]
    allow_local_port: Vec<u16>,
    /// Print every network decision on stderr as it happens, allowed ones too (denied ones are
    /// printed anyway unless --quiet).
    #[arg(long = "net-log")]
    net_log: bool,
    /// Do not print the one-line summary (nor denied connections) on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                EXIT_SANDBOX_ERROR
            } else {
                0
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match cli.cmd {
        Cmd::Run(a) => match run(*a) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisade: error: {e:#}");
                EXIT_SANDBOX_ERROR
            }
        },
        Cmd::Doctor { json } => doctor(json),
        Cmd::Policy { cmd } => match policy_cmd(cmd) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisade: error: {e:#}");
                EXIT_SANDBOX_ERROR
            }
        },
        Cmd::Serve(a) => match serve::main(*a) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisade: error: {e:#}");
                EXIT_SANDBOX_ERROR
            }
        },
        Cmd::Agent => palisade_service::agent::main(),
        Cmd::CgroupDelegate { user } => match delegate(&user) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("palisade: error: {e:#}");
                EXIT_SANDBOX_ERROR
            }
        },
    };
    std::process::exit(code);
}

/// The sandbox builder for `a`: defaults, then the policy file's profiles, the `--profile`
/// options, the file's own fields, and the other options last.
fn builder(a: &RunArgs, tty: bool) -> anyhow::Result<palisade::Builder> {
    let mut b = Sandbox::builder().command(a.command.clone()).tty(tty);
    let file = match &a.policy {
        Some(p) => Some(read_policy_file(p)?),
        None => None,
    };
    if let Some(f) = &file {
        for p in &f.profiles {
            b = b.profile(p);
        }
    }
    for p in &a.profile {
        b = b.profile(p);
    }
    if let Some(f) = &file {
        b = b.overlay(f);
    }
    if a.allow_ptrace {
        b = b.allow_ptrace(true);
    }
    if a.keep {
        b = b.keep_scratch(true);
    }
    for p in &a.protect {
        b = b.protect(p);
    }
    for p in &a.unprotect {
        b = b.unprotect(p);
    }
    if let Some(s) = &a.scratch {
        b = b.scratch_dir(s);
    }
    if let Some(t) = &a.timeout {
        b = b.timeout(parse_duration("--timeout", t)?);
    }
    if let Some(o) = &a.output_limit {
        b = b.output_limit(parse_size("--output-limit", o)?);
    }
    let mut limits = b.current_limits();
    if let Some(t) = &a.cpu_time {
        limits.cpu_time_ms = Some(parse_duration("--cpu-time", t)?.as_millis() as u64);
    }
    if let Some(p) = &a.pids {
        limits.pids = parse_count("--pids", p, MAX_PIDS)?;
    }
    if let Some(n) = &a.open_files {
        limits.open_files = parse_count("--open-files", n, MAX_OPEN_FILES)?;
    }
    if let Some(f) = &a.file_size {
        limits.file_size_bytes = parse_size("--file-size", f)?;
    }
    if let Some(m) = &a.memory {
        limits.memory_bytes = parse_size("--memory", m)?;
    }
    if let Some(c) = &a.cpus {
        limits.cpu_milli = Some(parse_cpus("--cpus", c)?);
    }
    if let Some(t) = &a.tmp_size {
        limits.tmp_bytes = parse_size("--tmp-size", t)?;
    }
    if let Some(t) = &a.scratch_size {
        limits.scratch_bytes = parse_size("--scratch-size", t)?;
    }
    b = b.limits(limits);
    for l in &a.allow_degraded {
        b = b.allow_degraded(Degradable::parse(l)?);
    }
    for s in &a.ro {
        b = b.bind_spec(Bind::parse(s, false)?);
    }
    for s in &a.rw {
        b = b.bind_spec(Bind::parse(s, true)?);
    }
    let mut has_term = false;
    for e in &a.env {
        let v = if e.contains('=') {
            EnvVar::parse(e)?
        } else {
            let val = std::env::var(e).with_context(|| {
                format!(
                    "--env {e}: `{e}` is not set in palisade's environment; use --env {e}=VALUE"
                )
            })?;
            EnvVar::new(e, &val)?
        };
        has_term |= v.name.as_str() == "TERM";
        b = b.env(v.name.as_str(), &v.value);
    }
    if tty && !has_term {
        if let Ok(t) = std::env::var("TERM") {
            b = b.env("TERM", &t);
        }
    }
    for r in &a.allow_net {
        b = b.allow_net(r);
    }
    for r in &a.deny_net {
        b = b.deny_net(r);
    }
    if let Some(d) = &a.dns_server {
        b = b.dns_server(d);
    }
    for r in &a.resolve {
        b = b.resolve(r);
    }
    for &p in &a.allow_local_port {
        b = b.allow_local_port(p);
    }
    Ok(b)
}

fn read_policy_file(p: &std::path::Path) -> anyhow::Result<palisade::policy::file::PolicyFile> {
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("--policy {}: cannot read the file", p.display()))?;
    Ok(palisade::policy::file::PolicyFile::parse(
        &p.display().to_string(),
        &text,
    )?)
}

fn run(a: RunArgs) -> anyhow::Result<i32> {
    let tty = if a.tty {
        true
    } else if a.no_tty {
        false
    } else {
        std::io::stdin().is_terminal()
    };
    let b = builder(&a, tty)?;
    let mut sandbox = b.build()?;
    // Where the report goes, settled before anything runs: a path the code could replace while
    // it runs is refused now, not followed later.
    let report_to = ReportTarget::open(&a, sandbox.policy())?;
    if a.net_log || !a.quiet {
        let all = a.net_log;
        sandbox = sandbox.on_net_event(std::sync::Arc::new(move |e: &palisade::NetEvent| {
            if all || e.decision != "allowed" {
                eprintln!(
                    "palisade: net: {} {} {}:{} ({}: {})",
                    e.decision,
                    e.via,
                    Untrusted::new(&e.host),
                    e.port,
                    e.reason,
                    Untrusted::new(&e.detail)
                );
            }
        }));
    }
    // Forward the usual termination signals to the sandbox (its init passes them to the payload).
    // Blocked here before the run's thread starts, so that every thread of palisade inherits the
    // mask and the signals reach the sandbox instead of ending palisade.
    let mut wanted = vec![libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];
    if tty {
        wanted.push(libc::SIGWINCH);
    }
    let signals = ForwardedSignals::new(&wanted).context("cannot take signals for forwarding")?;
    let raw = if tty { RawTerminal::enter(0) } else { None };
    let mut run = sandbox.start(palisade::Io {
        stdin: Some(palisade::Stdin::Inherit),
        stream_buffer: Some(1 << 20),
        terminal: tty.then_some(0),
        signals: Some(
            signals
                .source()
                .context("cannot take signals for forwarding")?,
        ),
    });
    // This thread only writes the output; the run's own thread enforces the deadline and the
    // ceilings, so a slow terminal or a full pipe here holds back the payload, never its limits.
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    loop {
        match run.recv_output(None) {
            palisade::Chunk::Data(palisade::Stream::Stdout, d) => {
                let _ = out.write_all(&d).and_then(|_| out.flush());
            }
            palisade::Chunk::Data(palisade::Stream::Stderr, d) => {
                let _ = err.write_all(&d).and_then(|_| err.flush());
            }
            palisade::Chunk::Timeout => {}
            palisade::Chunk::End => break,
        }
    }
    let report = run.wait();
    drop(raw);
    drop(out);
    drop(signals);
    emit(&a, &report, report_to)?;
    Ok(report.exit_code_for_cli())
}

fn policy_cmd(cmd: PolicyCmd) -> anyhow::Result<i32> {
    use palisade::policy::file::PolicyFile;
    match cmd {
        PolicyCmd::Check { file } => {
            let f = read_policy_file(&file)?;
            let name = file.display();
            // The whole policy as a run would build it (duplicate targets, the proxy's ports),
            // then the host paths it names, which a run would refuse.
            let sandbox = Sandbox::builder()
                .command(["true"])
                .policy_file(&f)
                .build()
                .with_context(|| format!("{name}"))?;
            let p = sandbox.policy();
            if let palisade::policy::Scratch::Host { path } = &p.scratch {
                if !path.is_dir() {
                    anyhow::bail!(
                        "{name}: filesystem.scratch `{}`: not a directory on this host",
                        path.display()
                    );
                }
            }
            for b in &p.binds {
                if std::fs::symlink_metadata(&b.source).is_err() {
                    let field = if b.writable {
                        "filesystem.rw"
                    } else {
                        "filesystem.ro"
                    };
                    anyhow::bail!(
                        "{name}: {field} `{}`: no such path on this host",
                        b.source.display()
                    );
                }
            }
            println!("{name}: ok");
            Ok(0)
        }
        PolicyCmd::Show(a) => {
            let sandbox = builder(&a, a.tty)?
                .command(if a.command.is_empty() {
                    vec!["true".to_owned()]
                } else {
                    a.command.clone()
                })
                .build()?;
            if !a.command.is_empty() {
                println!("# command: {}", a.command.join(" "));
            }
            print!("{}", PolicyFile::render(sandbox.policy(), a.keep));
            Ok(0)
        }
        PolicyCmd::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&palisade::policy::file::json_schema())?
            );
            Ok(0)
        }
        PolicyCmd::Profiles => {
            for (name, summary, text) in palisade::policy::profile::PROFILES {
                println!("{name:<8} {summary}");
                for l in text.lines().filter(|l| !l.is_empty()) {
                    println!("         | {l}");
                }
            }
            Ok(0)
        }
    }
}

fn doctor(json: bool) -> i32 {
    use palisade::doctor::{healthy, run_checks, Verdict};
    let checks = run_checks(std::path::Path::new("/sys/fs/cgroup"));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "healthy": healthy(&checks),
                "checks": checks,
            }))
            .expect("checks serialize")
        );
    } else {
        for c in &checks {
            let tag = match c.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{tag}  {:<16} {}", c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("      {:<16} fix: {f}", "");
            }
        }
        println!(
            "{}",
            if healthy(&checks) {
                "palisade run works on this host."
            } else {
                "palisade run will refuse on this host until the rows marked FAIL are fixed."
            }
        );
    }
    if healthy(&checks) {
        0
    } else {
        1
    }
}

fn delegate(user: &str) -> anyhow::Result<()> {
    let (uid, gid) = lookup_user(user)?;
    let dirs = palisade_cgroup::delegate(std::path::Path::new("/sys/fs/cgroup"), uid, gid)
        .with_context(|| format!("cgroup-delegate --user {user}"))?;
    for d in &dirs {
        println!("delegated {} to uid {uid} gid {gid}", d.display());
    }
    // cgroup v2 moves a process only for a writer of the common ancestor's cgroup.procs, so the
    // user's palisade must itself run inside the delegated directory.
    if let [d] = dirs.as_slice() {
        if d.join("cgroup.subtree_control").exists() {
            println!(
                "cgroup v2: start {user}'s palisade from a process placed in its leaf, e.g. as root: echo <pid of {user}'s shell> > {}/cgroup.procs",
                d.join(palisade_cgroup::PROCS_LEAF).display()
            );
        }
    }
    Ok(())
}

/// A user's uid and primary gid from the password database (`/etc/passwd`), by name or number.
fn lookup_user(user: &str) -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("cannot read /etc/passwd")?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && (f[0] == user || f[2] == user) {
            return Ok((f[2].parse()?, f[3].parse()?));
        }
    }
    anyhow::bail!("--user `{user}`: no such user in /etc/passwd (give a user name or uid)")
}

/// Where `--json` / `--report-fd` send the report.
enum ReportTarget {
    None,
    /// After the command's own output on stdout (`--json -`): for people; a program must not
    /// trust it, since the command can print a report-shaped line first.
    Stdout,
    /// A file written at the end: created next to its final name in a directory opened now, then
    /// renamed over that name, so nothing at the name is followed or truncated.
    File {
        dir: std::fs::File,
        name: std::ffi::OsString,
        shown: String,
    },
    /// A descriptor the caller opened (`--report-fd N`); the sandbox never holds it.
    Fd(std::fs::File),
}

impl ReportTarget {
    fn open(a: &RunArgs, policy: &palisade::policy::Policy) -> anyhow::Result<ReportTarget> {
        if let Some(fd) = a.report_fd {
            anyhow::ensure!(
                a.json.is_none(),
                "--report-fd {fd}: give either --json or --report-fd, not both"
            );
            anyhow::ensure!(
                fd > 2,
                "--report-fd {fd}: 0, 1 and 2 are the command's own; open another descriptor (e.g. 3>report.json)"
            );
            let f = palisade::term::dup_fd(fd).with_context(|| {
                format!("--report-fd {fd}: not an open descriptor (open it first, e.g. `{fd}>report.json`)")
            })?;
            return Ok(ReportTarget::Fd(f));
        }
        let Some(p) = a.json.as_deref() else {
            return Ok(ReportTarget::None);
        };
        if p == "-" {
            return Ok(ReportTarget::Stdout);
        }
        let path = std::path::Path::new(p);
        let name = path
            .file_name()
            .with_context(|| format!("--json {p}: name a file, not a directory"))?
            .to_owned();
        let parent = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let canon = parent.canonicalize().with_context(|| {
            format!(
                "--json {p}: its directory {} does not exist",
                parent.display()
            )
        })?;
        // The sandbox may write its scratch directory and --rw binds: a report there could be
        // swapped for a link by the code, or the directory replaced, while it runs.
        let mut writable: Vec<PathBuf> = policy
            .binds
            .iter()
            .filter(|b| b.writable)
            .map(|b| b.source.clone())
            .collect();
        if let palisade::policy::Scratch::Host { path } = &policy.scratch {
            writable.push(path.clone());
        }
        for w in writable {
            let w = w.canonicalize().unwrap_or(w);
            if canon.starts_with(&w) {
                anyhow::bail!(
                    "--json {p}: inside {}, which the sandbox can write; put the report outside the scratch directory and --rw binds",
                    w.display()
                );
            }
        }
        let dir = palisade::term::open_directory(&canon)
            .with_context(|| format!("--json {p}: cannot open {}", canon.display()))?;
        Ok(ReportTarget::File {
            dir,
            name,
            shown: p.to_owned(),
        })
    }
}

fn emit(a: &RunArgs, report: &Report, to: ReportTarget) -> anyhow::Result<()> {
    if !a.quiet
        || matches!(
            report.status,
            palisade::Status::SandboxError | palisade::Status::ProtectionFailed
        )
    {
        eprintln!("{}", report.summary());
    } else {
        // Even when quiet: something the code left to run later was found and moved aside.
        for b in &report.protected.blocked {
            eprintln!(
                "palisade: protected path {} was created inside: {}",
                b.path,
                b.moved_to
                    .as_deref()
                    .map(|t| format!("moved to {t}"))
                    .unwrap_or_else(|| format!("NOT moved: {}", b.error.as_deref().unwrap_or("?")))
            );
        }
    }
    match to {
        ReportTarget::None => {}
        ReportTarget::Stdout => {
            let mut o = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut o, report)?;
            writeln!(o)?;
        }
        ReportTarget::Fd(mut f) => {
            serde_json::to_writer_pretty(&mut f, report)?;
            writeln!(f)?;
        }
        ReportTarget::File { dir, name, shown } => {
            let mut text = serde_json::to_vec_pretty(report)?;
            text.push(b'\n');
            palisade::term::replace_file_at(&dir, &name, &text)
                .with_context(|| format!("--json {shown}: cannot write the report"))?;
        }
    }
    Ok(())
}
