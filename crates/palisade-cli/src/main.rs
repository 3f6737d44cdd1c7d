//! `palisade`: the command-line front end. Thin: parse, build a policy, run, report.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use palisade::policy::file::PolicyFile;
use palisade::policy::http::{parse_inspect, HttpRule, Secret, SecretSource};
use palisade::policy::net::{parse_dns_server, NetRule, Pin};
use palisade::policy::protect::ProtectedPath;
use palisade::policy::untrusted::Untrusted;
use palisade::policy::{
    parse_count, parse_cpus, parse_duration, parse_size, Bind, Degradable, EnvName, EnvVar, Policy,
    PolicyError, PolicyOverlay, MAX_OPEN_FILES, MAX_PIDS,
};
use palisade::term::{ForwardedSignals, RawTerminal};
use palisade::{Report, Sandbox, EXIT_SANDBOX_ERROR};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

mod changes;
mod mcp;
mod serve;
mod stall;

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
    /// Show what a workspace run changed (docs/workspace.md): `changes ID`, or `changes --list`.
    Changes(changes::ChangesArgs),
    /// Show a change set as a unified diff in git's format (`git apply` takes it).
    Diff(changes::DiffArgs),
    /// Apply a change set (or the named paths of it) to its project directory.
    Apply(changes::ApplyArgs),
    /// Remove a change set without applying it.
    Discard(changes::DiscardArgs),
    /// Serve the HTTP API: one-shot runs, batches, sessions, files, a SandboxFusion-compatible
    /// /run_code (docs/server.md). The policy file is the ceiling of every request.
    Serve(Box<serve::ServeArgs>),
    /// Serve the sandbox as a Model Context Protocol server for agent hosts: run_code and
    /// sandbox_* tools, on stdio (default) or Streamable HTTP (docs/mcp.md). The policy file is
    /// the ceiling of every call.
    Mcp(Box<mcp::McpArgs>),
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
    /// using it. --workspace is the recommended way to give code a project: it sees the same
    /// directory writable, and nothing reaches it until you review the changes and apply them.
    #[arg(long, value_name = "DIR", conflicts_with = "workspace")]
    scratch: Option<PathBuf>,
    /// Host directory seen at /workspace through a copy-on-write overlay: the code changes a
    /// copy, DIR itself is never written during the run, and what changed is kept as a change
    /// set (its id is in the summary and the report) to review with `palisade changes ID` and
    /// `palisade diff ID`, then apply with `palisade apply ID` (docs/workspace.md). Its changes
    /// are capped by --scratch-size and count against --memory while it runs.
    #[arg(long, value_name = "DIR", conflicts_with = "keep")]
    workspace: Option<PathBuf>,
    /// With --workspace: apply the change set after the run: never (default: keep it for
    /// review), on-success (exit 0), always. Refused, protected, risky or conflicting changes
    /// hold all of it back, for review.
    #[arg(long, value_name = "WHEN", default_value = "never")]
    apply: String,
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
    /// Inspect TLS (repeatable): alone, every allowed host's; with HOST (a name or *.DOMAIN,
    /// optionally :PORT), that host's. The proxy terminates the code's TLS with a certificate
    /// from a CA made for this run (its key never leaves palisade's memory; the sandbox trusts
    /// its certificate) and checks each request. Hosts named by --http-rule or --secret are
    /// inspected anyway.
    #[arg(long, value_name = "HOST", num_args = 0..=1, default_missing_value = "*")]
    inspect: Vec<String>,
    /// Never inspect HOST (repeatable): for clients that pin certificates or use mutual TLS.
    #[arg(long = "no-inspect", value_name = "HOST")]
    no_inspect: Vec<String>,
    /// Allow only these requests to the hosts a rule names (repeatable): METHODS HOST[:PORT][/PATH],
    /// e.g. 'GET,HEAD pypi.org/simple/**'; METHODS may be * or read-only (GET, HEAD, OPTIONS),
    /// HOST may be * (every host). Other requests get 403 and the connection closes.
    #[arg(long = "http-rule", value_name = "RULE")]
    http_rule: Vec<String>,
    /// Only read-only requests (GET, HEAD, OPTIONS) to every host: --http-rule 'read-only *'.
    #[arg(long = "net-read-only")]
    net_read_only: bool,
    /// Refuse request bodies larger than SIZE (e.g. 1MiB) on the requests the proxy reads.
    #[arg(
        long = "max-request-body",
        value_name = "SIZE",
        allow_hyphen_values = true
    )]
    max_request_body: Option<String>,
    /// NAME@HOST[:PORT][=env:VAR|=file:PATH] (repeatable): $NAME inside holds a random
    /// placeholder; the proxy puts the real value (palisade's $NAME, or VAR, or the file's
    /// content) in its place in the headers of requests to HOST over TLS, and refuses a request
    /// that carries it anywhere else. The value never enters the sandbox.
    #[arg(long = "secret", value_name = "NAME@HOST")]
    secret: Vec<String>,
    /// Verify inspected hosts against the CA certificates in FILE (PEM) instead of the host's
    /// trust store.
    #[arg(long = "upstream-ca", value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
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
    // First: started as palisade's own init program (docs/engine.md), this never returns.
    palisade::engine::run_if_init();
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
        Cmd::Changes(a) => changes::exit(changes::changes(a)),
        Cmd::Diff(a) => changes::exit(changes::diff(a)),
        Cmd::Apply(a) => changes::exit(changes::apply(a)),
        Cmd::Discard(a) => changes::exit(changes::discard(a)),
        Cmd::Serve(a) => match serve::main(*a) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("palisade: error: {e:#}");
                EXIT_SANDBOX_ERROR
            }
        },
        Cmd::Mcp(a) => match mcp::main(*a) {
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

/// Policy fields and the options that set them. The library names fields as a policy file does
/// (`filesystem.rw`); what `palisade run` prints names its options (`--rw`).
const OPTIONS: &[(&str, &str)] = &[
    ("profiles", "--profile"),
    ("filesystem.scratch", "--scratch"),
    ("filesystem.workspace", "--workspace"),
    ("filesystem.keep_scratch", "--keep"),
    ("filesystem.ro", "--ro"),
    ("filesystem.rw", "--rw"),
    ("filesystem.protect", "--protect"),
    ("filesystem.unprotect", "--unprotect"),
    ("env.set", "--env"),
    ("env.pass", "--env"),
    ("network.allow", "--allow-net"),
    ("network.deny", "--deny-net"),
    ("network.resolve", "--resolve"),
    ("network.dns_server", "--dns-server"),
    ("network.local_ports", "--allow-local-port"),
    ("network.inspect", "--inspect"),
    ("network.no_inspect", "--no-inspect"),
    ("network.http", "--http-rule"),
    ("network.max_body", "--max-request-body"),
    ("network.secrets", "--secret"),
    ("network.upstream_ca", "--upstream-ca"),
    ("limits.timeout", "--timeout"),
    ("limits.cpu_time", "--cpu-time"),
    ("limits.memory", "--memory"),
    ("limits.pids", "--pids"),
    ("limits.open_files", "--open-files"),
    ("limits.file_size", "--file-size"),
    ("limits.output", "--output-limit"),
    ("limits.tmp_size", "--tmp-size"),
    ("limits.scratch_size", "--scratch-size"),
    ("limits.cpus", "--cpus"),
    ("layers.allow_degraded", "--allow-degraded"),
    ("layers.allow_ptrace", "--allow-ptrace"),
    ("apply", "--apply"),
    ("tty", "--tty"),
];

/// A library message in the command line's words: each policy field (`a.b`) named as the option
/// that sets it, and "add `VALUE` to FIELD" as "pass --OPTION VALUE". Text in backticks quotes
/// values and is left alone.
fn in_option_words(text: &str) -> String {
    let dotted = || OPTIONS.iter().filter(|(f, _)| f.contains('.'));
    // A field ends where no name character (nor `.` and one) follows.
    let ends = |rest: &str| {
        let mut c = rest.chars();
        match c.next() {
            None => true,
            Some(x) if x.is_ascii_alphanumeric() || x == '_' => false,
            Some('.') => !c
                .next()
                .is_some_and(|y| y.is_ascii_alphanumeric() || y == '_'),
            Some(_) => true,
        }
    };
    let field_at = |s: &str| dotted().find(|(f, _)| s.starts_with(f) && ends(&s[f.len()..]));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let word_start = !out
            .chars()
            .next_back()
            .is_some_and(|p| p.is_ascii_alphanumeric() || matches!(p, '_' | '.' | '-'));
        if word_start {
            if let Some(after) = rest.strip_prefix("add `") {
                if let Some(end) = after.find('`') {
                    let to = after[end + 1..].strip_prefix(" to ").unwrap_or("");
                    if let Some((field, option)) = field_at(to) {
                        out.push_str(&format!("pass {option} {}", &after[..end]));
                        rest = &to[field.len()..];
                        continue;
                    }
                }
            }
            if let Some((field, option)) = field_at(rest) {
                out.push_str(option);
                rest = &rest[field.len()..];
                continue;
            }
        }
        if c == '`' {
            let end = rest[1..].find('`').map_or(rest.len(), |e| e + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A policy error as the command line says it: the field as its option.
fn option_error(e: PolicyError) -> anyhow::Error {
    let field = e
        .field()
        .and_then(|f| OPTIONS.iter().find(|(p, _)| *p == f));
    let e = match field {
        Some((_, option)) => e.in_field(option),
        None => e,
    };
    anyhow::anyhow!(in_option_words(&e.to_string()))
}

/// The options as an overlay on the policy (the file's, or the defaults). Values are parsed here,
/// so that errors name the option; `--env` keeps the last value given for a name.
fn options(a: &RunArgs, tty: bool) -> anyhow::Result<PolicyOverlay> {
    let mut o = PolicyOverlay {
        profiles: a.profile.clone(),
        scratch: a.scratch.clone(),
        workspace: a.workspace.clone(),
        keep_scratch: a.keep.then_some(true),
        allow_ptrace: a.allow_ptrace.then_some(true),
        local_ports: a.allow_local_port.clone(),
        // A terminal is a default (lowered under a file's bounds) unless asked for by name.
        tty: (a.tty || a.no_tty).then_some(tty),
        ..PolicyOverlay::default()
    };
    for (list, paths, option) in [
        (&mut o.protect, &a.protect, "--protect"),
        (&mut o.unprotect, &a.unprotect, "--unprotect"),
    ] {
        for p in paths {
            list.push(ProtectedPath::new(p).map_err(|e| option_error(e.in_field(option)))?);
        }
    }
    for (specs, writable) in [(&a.ro, false), (&a.rw, true)] {
        for s in specs {
            o.binds
                .push(Bind::parse(s, writable).map_err(option_error)?);
        }
    }
    for e in &a.env {
        if e.contains('=') {
            let v = EnvVar::parse(e).map_err(option_error)?;
            o.env_pass.retain(|n| *n != v.name);
            o.env_set.retain(|x| x.name != v.name);
            o.env_set.push(v);
        } else {
            let n = EnvName::new(e).map_err(option_error)?;
            o.env_set.retain(|x| x.name != n);
            if !o.env_pass.contains(&n) {
                o.env_pass.push(n);
            }
        }
    }
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    let l = &mut o.limits;
    for (given, option, to) in [
        (&a.timeout, "--timeout", &mut l.timeout_ms),
        (&a.cpu_time, "--cpu-time", &mut l.cpu_time_ms),
    ] {
        if let Some(t) = given {
            *to = Some(ms(parse_duration(option, t).map_err(option_error)?));
        }
    }
    for (given, option, to) in [
        (&a.output_limit, "--output-limit", &mut l.output_bytes),
        (&a.file_size, "--file-size", &mut l.file_size_bytes),
        (&a.memory, "--memory", &mut l.memory_bytes),
        (&a.tmp_size, "--tmp-size", &mut l.tmp_bytes),
        (&a.scratch_size, "--scratch-size", &mut l.scratch_bytes),
    ] {
        if let Some(s) = given {
            *to = Some(parse_size(option, s).map_err(option_error)?);
        }
    }
    for (given, option, max, to) in [
        (&a.pids, "--pids", MAX_PIDS, &mut l.pids),
        (
            &a.open_files,
            "--open-files",
            MAX_OPEN_FILES,
            &mut l.open_files,
        ),
    ] {
        if let Some(n) = given {
            *to = Some(parse_count(option, n, max).map_err(option_error)?);
        }
    }
    if let Some(c) = &a.cpus {
        l.cpu_milli = Some(parse_cpus("--cpus", c).map_err(option_error)?);
    }
    for d in &a.allow_degraded {
        let d = Degradable::parse(d).map_err(option_error)?;
        if !o.allow_degraded.contains(&d) {
            o.allow_degraded.push(d);
        }
    }
    for (rules, option, to) in [
        (&a.allow_net, "--allow-net", &mut o.allow_net),
        (&a.deny_net, "--deny-net", &mut o.deny_net),
    ] {
        for r in rules {
            to.push(NetRule::parse(option, r).map_err(option_error)?);
        }
    }
    for r in &a.resolve {
        o.resolve.push(Pin::parse(r).map_err(option_error)?);
    }
    if let Some(d) = &a.dns_server {
        o.dns_server = Some(parse_dns_server(d).map_err(option_error)?);
    }
    for h in &a.inspect {
        if h == "*" {
            o.inspect_all = Some(true);
        } else {
            o.inspect
                .push(parse_inspect("--inspect", h).map_err(option_error)?);
        }
    }
    for h in &a.no_inspect {
        o.no_inspect
            .push(parse_inspect("--no-inspect", h).map_err(option_error)?);
    }
    if a.net_read_only {
        o.http
            .push(HttpRule::parse("--net-read-only", "read-only *").map_err(option_error)?);
    }
    for r in &a.http_rule {
        o.http
            .push(HttpRule::parse("--http-rule", r).map_err(option_error)?);
    }
    if let Some(b) = &a.max_request_body {
        o.max_body = Some(parse_size("--max-request-body", b).map_err(option_error)?);
    }
    for x in &a.secret {
        let s = Secret::parse("--secret", x).map_err(option_error)?;
        o.secrets.retain(|o| o.name != s.name);
        o.secrets.push(s);
    }
    if let Some(c) = &a.upstream_ca {
        let abs = if c.is_absolute() {
            c.clone()
        } else {
            std::env::current_dir()
                .context("--upstream-ca: the working directory")?
                .join(c)
        };
        o.upstream_ca = Some(abs);
    }
    Ok(o)
}

/// Most bytes of a secret's file.
const MAX_SECRET_FILE: u64 = 64 * 1024;

/// A secret's value from palisade's own environment or the secret's file, as the policy says;
/// never from anywhere else. A file's trailing line break is not part of the value.
fn secret_value(s: &Secret) -> Result<String, String> {
    use std::io::Read;
    match &s.from {
        SecretSource::Env(v) => std::env::var(v.as_str()).map_err(|_| {
            format!("`{v}` is not set in palisade's environment; set it, or give the value's source as NAME@HOST=file:PATH")
        }),
        SecretSource::File(p) => {
            let f = std::fs::File::open(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let mut buf = Vec::new();
            f.take(MAX_SECRET_FILE + 1)
                .read_to_end(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            if buf.len() as u64 > MAX_SECRET_FILE {
                return Err(format!("{} is larger than 64 KiB", p.display()));
            }
            let text = String::from_utf8(buf)
                .map_err(|_| format!("{} is not text", p.display()))?;
            Ok(text.trim_end_matches(['\n', '\r']).to_owned())
        }
    }
}

/// What to do with the variables passed by name.
#[derive(Clone, Copy, PartialEq)]
enum PassedVars {
    /// Give them palisade's own values (`run`).
    Resolve,
    /// Check that palisade has a value for each, and keep them as names (`policy show`, which
    /// prints no value from the environment).
    Check,
}

/// The policy `a` gives: the defaults (with `tty`, the terminal found), the file's profiles,
/// each `--profile`, the file's own fields, the other options (docs/policy.md), within the
/// file's bounds when it has a `[bounds]` table. Errors are said in the file's words when the
/// file alone gives them, in the options' otherwise.
fn policy_for(
    a: &RunArgs,
    tty: bool,
    command: Vec<String>,
    vars: PassedVars,
) -> anyhow::Result<Policy> {
    let file = match &a.policy {
        Some(p) => Some((p.display().to_string(), read_policy_file(p)?)),
        None => None,
    };
    let options = options(a, tty)?;
    let mut base = Policy::new(command).map_err(option_error)?;
    base.tty = tty;
    let empty = PolicyFile::default();
    let f = file.as_ref().map_or(&empty, |(_, f)| f);
    let mut p = match f.policy(base.clone(), &options) {
        Ok(p) => p,
        Err(e) => match &file {
            Some((name, f))
                if f.policy(base, &PolicyOverlay::default()).err() == Some(e.clone()) =>
            {
                anyhow::bail!("{name}: {e}")
            }
            // An option beyond the file's [bounds]: say whose bounds.
            Some((name, _)) if matches!(e, PolicyError::Bounds(_)) => {
                let e = option_error(e).to_string();
                anyhow::bail!(
                    "{}",
                    e.replacen("the bounds", &format!("the bounds of {name}"), 1)
                )
            }
            _ => return Err(option_error(e)),
        },
    };
    // Values for the names to pass: from palisade's own environment, which only this caller may
    // read; the library never does.
    let mut check = p.clone();
    check
        .resolve_env(|n| std::env::var(n.as_str()).ok())
        .map_err(|e| {
            let name = match &e {
                PolicyError::Invalid { value, .. } => value.clone(),
                _ => String::new(),
            };
            match &file {
                Some((file, _)) if !options.env_pass.iter().any(|n| n.as_str() == name) => {
                    anyhow::anyhow!("{file}: env.pass `{name}` is not set in palisade's environment; set it, or give its value in env.set")
                }
                _ => anyhow::anyhow!(
                    "--env {name}: `{name}` is not set in palisade's environment; use --env {name}=VALUE"
                ),
            }
        })?;
    // Secrets' values likewise: from palisade's environment or their files, here only.
    check
        .resolve_secrets(secret_value)
        .map_err(|e| anyhow::anyhow!(in_option_words(&e.to_string())))?;
    if vars == PassedVars::Resolve {
        p = check;
    }
    let named = |p: &Policy, n: &str| {
        p.env.iter().any(|v| v.name.as_str() == n) || p.env_pass.iter().any(|v| v.as_str() == n)
    };
    if p.tty && !named(&p, "TERM") {
        if let Ok(t) = std::env::var("TERM") {
            p.env.push(EnvVar::new("TERM", &t).map_err(option_error)?);
        }
    }
    Ok(p)
}

/// The sandbox builder for `a` (see [`policy_for`]), with the variables passed by name given
/// palisade's own values.
fn builder(a: &RunArgs, tty: bool) -> anyhow::Result<palisade::Builder> {
    let p = policy_for(a, tty, a.command.clone(), PassedVars::Resolve)?;
    p.validate().map_err(option_error)?;
    Ok(Sandbox::builder().policy(p))
}

fn read_policy_file(p: &std::path::Path) -> anyhow::Result<PolicyFile> {
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("--policy {}: cannot read the file", p.display()))?;
    Ok(PolicyFile::parse(&p.display().to_string(), &text)?)
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
    let apply = palisade::workspace::ApplyMode::parse(&a.apply).map_err(option_error)?;
    if let palisade::policy::Scratch::Workspace { .. } = &sandbox.policy().scratch {
        sandbox = sandbox.with_workspace(palisade::WorkspaceOptions {
            store: Some(changes::store()?),
            apply,
            ..Default::default()
        });
    } else if apply != palisade::workspace::ApplyMode::Never {
        anyhow::bail!(
            "--apply {}: applies a workspace's changes; give --workspace DIR",
            a.apply
        );
    }
    // One run from a small process that holds nothing else: the in-process engine's fork-like
    // start costs less than loading palisade's init program again (docs/engine.md).
    // `PALISADE_INIT` still chooses the exec'd init explicitly.
    if std::env::var_os(palisade::engine::INIT_PROGRAM_ENV).is_none() {
        sandbox = sandbox.engine(palisade::Engine::InProcess);
    }
    // Where the report goes, settled before anything runs: a path the code could replace while
    // it runs is refused now, not followed later.
    let report_to = ReportTarget::open(&a, sandbox.policy())?;
    if a.net_log || !a.quiet {
        let all = a.net_log;
        sandbox = sandbox.on_net_event(std::sync::Arc::new(move |e: &palisade::NetEvent| {
            if all || e.decision != palisade::NetDecision::Allowed {
                // Every field the sandbox could shape is stored escaped and cut (palisade-net).
                eprintln!("palisade: net: {e}");
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
        files: Vec::new(),
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
    match cmd {
        PolicyCmd::Check { file } => {
            let f = read_policy_file(&file)?;
            let name = file.display();
            // The whole policy as a run would build it (duplicate targets, the proxy's ports, its
            // own bounds), then the host paths it names, which a run would refuse. Variables
            // passed by name are the running environment's business, not the file's.
            let p = f
                .policy(Policy::new(["true"])?, &PolicyOverlay::default())
                .with_context(|| format!("{name}"))?;
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
                    anyhow::bail!(
                        "{name}: {} `{}`: no such path on this host",
                        Bind::field(b.writable),
                        b.source.display()
                    );
                }
            }
            println!("{name}: ok");
            Ok(0)
        }
        PolicyCmd::Show(a) => {
            let command = if a.command.is_empty() {
                vec!["true".to_owned()]
            } else {
                a.command.clone()
            };
            let p = policy_for(&a, a.tty, command, PassedVars::Check)?;
            if !a.command.is_empty() {
                println!("# command: {}", a.command.join(" "));
            }
            print!("{}", PolicyFile::render(&p));
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

/// Most characters of the summary line printed (it lists every refused call and blocked path).
const SUMMARY_MAX: usize = 16 * 1024;

fn emit(a: &RunArgs, report: &Report, to: ReportTarget) -> anyhow::Result<()> {
    if !a.quiet
        || matches!(
            report.status,
            palisade::Status::SandboxError | palisade::Status::ProtectionFailed
        )
    {
        // One line, whatever a path or a name in it holds.
        let line = in_option_words(&report.summary());
        eprintln!("{}", Untrusted::new(&line).max(SUMMARY_MAX));
        if report.network.notify_suppressed > 0 {
            eprintln!(
                "palisade: {} more net decisions not printed (the report lists them)",
                report.network.notify_suppressed
            );
        }
    } else {
        // Even when quiet: where the workspace's changes are, or that they were lost.
        if let Some(w) = &report.workspace {
            if let Some(id) = &w.change_set {
                eprintln!(
                    "palisade: workspace change set {id}: {} change(s){}",
                    w.summary.entries,
                    if w.applied.is_some() { ", applied" } else { "" }
                );
            }
        }
        // Even when quiet: something the code left to run later was found and moved aside.
        for b in &report.protected.blocked {
            let line = format!(
                "palisade: protected path {} was created inside: {}",
                b.path,
                b.moved_to
                    .as_deref()
                    .map(|t| format!("moved to {t}"))
                    .unwrap_or_else(|| format!("NOT moved: {}", b.error.as_deref().unwrap_or("?")))
            );
            eprintln!("{}", Untrusted::new(&line).max(SUMMARY_MAX));
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Each row of the table is a policy-file field (or `tty`) and an option of `run`, so the
    /// words cannot drift from what the two accept.
    #[test]
    fn the_option_table_names_real_fields_and_options() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").unwrap();
        let longs: Vec<String> = run
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        let schema = palisade::policy::file::json_schema();
        for (field, option) in OPTIONS {
            assert!(longs.iter().any(|l| l == option), "{option}");
            let in_schema = match field.split_once('.') {
                Some((t, f)) => schema["properties"][t]["properties"].get(f).is_some(),
                None => {
                    schema["properties"].get(*field).is_some() || ["tty", "apply"].contains(field)
                }
            };
            assert!(in_schema, "{field}");
        }
    }

    #[test]
    fn library_words_become_option_words() {
        for (library, cli) in [
            (
                "invalid limits.memory `512k`: expected a size",
                "invalid --memory `512k`: expected a size",
            ),
            (
                "invalid network.deny/network.resolve/network.dns_server `(given)`: expected network.allow rules as well",
                "invalid --deny-net/--resolve/--dns-server `(given)`: expected --allow-net rules as well",
            ),
            (
                "replace it with a regular file or directory, or add `.bashrc` to filesystem.unprotect",
                "replace it with a regular file or directory, or pass --unprotect .bashrc",
            ),
            (
                "{hint}; or add `landlock` to layers.allow_degraded to run with the mount view",
                "{hint}; or pass --allow-degraded landlock to run with the mount view",
            ),
            ("filesystem.rw `/srv/x`: No such file", "--rw `/srv/x`: No such file"),
            // Values in backticks, longer names and other words are left alone.
            (
                "filesystem.ro `/srv/filesystem.ro`: gone",
                "--ro `/srv/filesystem.ro`: gone",
            ),
            ("env.set.A: expected a string", "env.set.A: expected a string"),
            ("my.limits.memory and limits.memoryx", "my.limits.memory and limits.memoryx"),
            ("add `x` to hostname", "add `x` to hostname"),
            ("limits.memory.", "--memory."),
            ("", ""),
            ("`unclosed limits.memory", "`unclosed limits.memory"),
        ] {
            assert_eq!(in_option_words(library), cli, "{library}");
        }
        // A structured field without a dot: mapped from the error, not from the text.
        let e = palisade::policy::profile::overlay("nope").unwrap_err();
        assert!(option_error(e)
            .to_string()
            .starts_with("invalid --profile `nope`: expected one of the built-in profiles"));
    }
}
