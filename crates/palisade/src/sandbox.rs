//! The library entry point: build a policy, run it, get a [`Report`].

use crate::report::Report;
use palisade_cgroup::{run_name, CgroupLimits, RunCgroup};
use palisade_linux::{CpuWatch, Running, SetupError, Sinks, Stdin};
use palisade_policy::file::PolicyFile;
use palisade_policy::Degradable;
use palisade_policy::{Bind, EnvVar, Policy, PolicyError, Scratch};
use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A sandbox ready to run: a validated policy plus how to treat the scratch directory.
#[derive(Clone)]
pub struct Sandbox {
    policy: Policy,
    keep: bool,
    stdin: Stdin,
    cgroup_root: PathBuf,
    net_notify: Option<NetNotify>,
}

/// Called with each egress decision as it happens (from the proxy's threads).
pub type NetNotify = std::sync::Arc<dyn Fn(&palisade_net::Event) + Send + Sync>;

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("policy", &self.policy)
            .field("keep", &self.keep)
            .field("cgroup_root", &self.cgroup_root)
            .finish_non_exhaustive()
    }
}

/// Output captured by [`Sandbox::output`].
#[derive(Debug, Clone)]
pub struct Output {
    pub report: Report,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Builds a [`Sandbox`]; every setter validates, and the first error is returned by `build`.
#[derive(Debug, Default)]
pub struct Builder {
    command: Vec<String>,
    scratch: Option<PathBuf>,
    keep: bool,
    binds: Vec<Bind>,
    env: Vec<EnvVar>,
    tty: bool,
    stdin_null: bool,
    limits: palisade_policy::Limits,
    degraded: Vec<Degradable>,
    cgroup_root: Option<PathBuf>,
    allow_ptrace: bool,
    network: palisade_policy::net::Network,
    hostname: Option<String>,
    /// `None`: the default protected paths.
    protected: Option<Vec<String>>,
    error: Option<PolicyError>,
}

impl Builder {
    /// The program and its arguments.
    pub fn command<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command = argv.into_iter().map(Into::into).collect();
        self
    }

    /// A host directory to use as scratch (writable, the working directory, `$HOME`).
    pub fn scratch_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch = Some(dir.into());
        self
    }

    /// Keep the ephemeral scratch: a host temporary directory is used and left behind.
    pub fn keep_scratch(mut self, keep: bool) -> Self {
        self.keep = keep;
        self
    }

    /// Makes a host path visible read-only at the same path inside.
    pub fn ro(self, host: impl AsRef<Path>) -> Self {
        self.bind(host, false)
    }

    /// Makes a host path visible read-write at the same path inside.
    pub fn rw(self, host: impl AsRef<Path>) -> Self {
        self.bind(host, true)
    }

    fn bind(mut self, host: impl AsRef<Path>, writable: bool) -> Self {
        match Bind::parse(&host.as_ref().to_string_lossy(), writable) {
            Ok(b) => self.binds.push(b),
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Adds a parsed bind (`HOST[:INSIDE]`).
    pub fn bind_spec(mut self, b: Bind) -> Self {
        self.binds.push(b);
        self
    }

    /// Sets a variable inside; a later value for the same name replaces the earlier one (so
    /// that command-line options override a policy file's).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        match EnvVar::new(name, value) {
            Ok(v) => {
                self.env.retain(|o| o.name != v.name);
                self.env.push(v)
            }
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// The sandbox's host name (default `sandbox`).
    pub fn hostname(mut self, name: &str) -> Self {
        self.hostname = Some(name.to_owned());
        self
    }

    /// Keeps `path` (relative to a host scratch directory) read-only inside, on top of the
    /// default protected paths (see [`palisade_policy::protect`]).
    pub fn protect(mut self, path: &str) -> Self {
        match palisade_policy::protect::ProtectedPath::new(path) {
            Ok(p) => {
                let list = self
                    .protected
                    .get_or_insert_with(palisade_policy::protect::defaults);
                if !list.iter().any(|x| x == p.as_str()) {
                    list.push(p.as_str().to_owned());
                }
            }
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Makes a protected path writable again, e.g. `.git/config` for a workload that configures
    /// its own repository. Loud on purpose: it reopens a way to act after the run.
    pub fn unprotect(mut self, path: &str) -> Self {
        match palisade_policy::protect::ProtectedPath::new(path) {
            Ok(p) => self
                .protected
                .get_or_insert_with(palisade_policy::protect::defaults)
                .retain(|x| x != p.as_str()),
            Err(e) => self.error = self.error.or(Some(e.in_field("unprotect"))),
        }
        self
    }

    /// Applies a built-in profile (see [`palisade_policy::profile`]).
    ///
    /// ```
    /// let b = palisade::Sandbox::builder().command(["true"]).profile("build");
    /// assert_eq!(b.current_limits().pids, 4096);
    /// ```
    pub fn profile(self, name: &str) -> Self {
        let Some(text) = palisade_policy::profile::get(name) else {
            let mut b = self;
            b.error = b.error.or(Some(PolicyError::Invalid {
                field: "--profile",
                value: name.to_owned(),
                expected: "one of the built-in profiles (palisade policy profiles lists them)",
            }));
            return b;
        };
        match PolicyFile::parse(&format!("profile {name}"), text) {
            Ok(f) => self.overlay(&f),
            // The profiles are parsed in a unit test; one that fails here is a build defect.
            Err(e) => panic!("built-in profile {name} is invalid: {e}"),
        }
    }

    /// Applies a policy file: its profiles, then its own fields. Lists add to what is set,
    /// values replace it.
    pub fn policy_file(self, f: &PolicyFile) -> Self {
        let mut b = self;
        for p in &f.profiles {
            b = b.profile(p);
        }
        b.overlay(f)
    }

    /// Applies a policy file's own fields, not its profiles (the CLI applies `--profile` options
    /// between the two).
    pub fn overlay(mut self, f: &PolicyFile) -> Self {
        if let Some(h) = &f.hostname {
            self.hostname = Some(h.clone());
        }
        if let Some(s) = &f.scratch {
            self.scratch = Some(s.clone());
        }
        if let Some(k) = f.keep_scratch {
            self.keep = k;
        }
        self.binds.extend(f.binds.iter().cloned());
        for p in &f.protect {
            self = self.protect(p);
        }
        for p in &f.unprotect {
            self = self.unprotect(p);
        }
        for v in &f.env_set {
            self = self.env(v.name.as_str(), &v.value);
        }
        for n in &f.env_pass {
            match std::env::var(n.as_str()) {
                Ok(v) => self = self.env(n.as_str(), &v),
                Err(_) => self.error = self.error.or(Some(PolicyError::Invalid {
                    field: "env.pass",
                    value: n.to_string(),
                    expected:
                        "a variable set in palisade's environment (or give its value in env.set)",
                })),
            }
        }
        self.network.allow.extend(f.allow_net.iter().cloned());
        self.network.deny.extend(f.deny_net.iter().cloned());
        self.network.resolve.extend(f.resolve.iter().cloned());
        if let Some(a) = f.dns_server {
            self.network.dns_server = Some(a);
        }
        self.network
            .local_ports
            .extend(f.local_ports.iter().copied());
        f.limits.apply(&mut self.limits);
        for &d in &f.allow_degraded {
            self = self.allow_degraded(d);
        }
        if let Some(p) = f.allow_ptrace {
            self.allow_ptrace = p;
        }
        self
    }

    /// Wall-clock timeout for the whole run (default 10 minutes).
    pub fn timeout(mut self, t: std::time::Duration) -> Self {
        self.limits.timeout_ms = t.as_millis().min(u64::MAX as u128) as u64;
        self
    }

    /// CPU time for all processes together (default: the wall-clock timeout).
    pub fn cpu_time(mut self, t: std::time::Duration) -> Self {
        // Rounded up, so that a non-zero limit never becomes 0 (which validation refuses).
        self.limits.cpu_time_ms =
            Some(t.as_nanos().div_ceil(1_000_000).min(u64::MAX as u128) as u64);
        self
    }

    /// Cap on stdout plus stderr, in bytes (default 64 MiB).
    pub fn output_limit(mut self, bytes: u64) -> Self {
        self.limits.output_bytes = bytes;
        self
    }

    /// The limits set so far (defaults where none was set).
    pub fn current_limits(&self) -> palisade_policy::Limits {
        self.limits
    }

    /// All limits at once.
    pub fn limits(mut self, limits: palisade_policy::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Runs even when the host cannot give this layer, which the report then lists as waived.
    pub fn allow_degraded(mut self, layer: Degradable) -> Self {
        if !self.degraded.contains(&layer) {
            self.degraded.push(layer);
        }
        self
    }

    /// Where the cgroup hierarchies are mounted (default `/sys/fs/cgroup`), e.g. for a container
    /// that mounts its cgroupfs elsewhere. Without a usable hierarchy there, runs are refused
    /// unless the cgroup layer is waived with [`Builder::allow_degraded`].
    pub fn cgroup_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.cgroup_root = Some(root.into());
        self
    }

    /// Lets processes inside trace one another (debuggers, `strace`); see
    /// [`Policy::allow_ptrace`]. Off by default.
    pub fn allow_ptrace(mut self, allow: bool) -> Self {
        self.allow_ptrace = allow;
        self
    }

    /// Allows egress to `rule` (`HOST`, `*.DOMAIN`, IP or CIDR, optionally `:PORT`) through
    /// palisade's proxy. Without any, the sandbox has no network.
    pub fn allow_net(mut self, rule: &str) -> Self {
        match palisade_policy::net::NetRule::parse("--allow-net", rule) {
            Ok(r) => self.network.allow.push(r),
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Denies `rule` even where an allow rule would match (deny wins).
    pub fn deny_net(mut self, rule: &str) -> Self {
        match palisade_policy::net::NetRule::parse("--deny-net", rule) {
            Ok(r) => self.network.deny.push(r),
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Pins a name to an address (`HOST=IP`) for the proxy's upstream lookups; for tests and
    /// special setups. The address is still checked like any other.
    pub fn resolve(mut self, pin: &str) -> Self {
        match palisade_policy::net::Pin::parse(pin) {
            Ok(p) => self.network.resolve.push(p),
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Resolves allowed names by asking the DNS server `server` (`IP[:PORT]`, port 53 by default)
    /// instead of the system resolver; the answers are checked like any other addresses.
    pub fn dns_server(mut self, server: &str) -> Self {
        match palisade_policy::net::parse_dns_server(server) {
            Ok(a) => self.network.dns_server = Some(a),
            Err(e) => self.error = self.error.or(Some(e)),
        }
        self
    }

    /// Lets the payload listen on TCP `port` inside its own network namespace and connect to it
    /// there (a test server and its client); Landlock refuses every other TCP bind.
    pub fn allow_local_port(mut self, port: u16) -> Self {
        self.network.local_ports.push(port);
        self
    }

    /// Gives the payload a pty of its own.
    pub fn tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// Standard input from `/dev/null` instead of the caller's.
    pub fn stdin_null(mut self, null: bool) -> Self {
        self.stdin_null = null;
        self
    }

    /// Validates everything and returns the sandbox.
    pub fn build(self) -> Result<Sandbox, PolicyError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut policy = Policy::new(self.command)?;
        if let Some(s) = self.scratch {
            policy.scratch = Scratch::Host { path: s };
        }
        policy.binds = self.binds;
        policy.env = self.env;
        policy.tty = self.tty;
        policy.limits = self.limits;
        policy.allow_degraded = self.degraded;
        policy.allow_ptrace = self.allow_ptrace;
        policy.network = self.network;
        if let Some(h) = self.hostname {
            policy.hostname = h;
        }
        if let Some(p) = self.protected {
            policy.protected = p;
        }
        policy.validate()?;
        Ok(Sandbox {
            net_notify: None,
            policy,
            keep: self.keep,
            stdin: if self.stdin_null {
                Stdin::Null
            } else {
                Stdin::Inherit
            },
            cgroup_root: self
                .cgroup_root
                .unwrap_or_else(|| PathBuf::from(CGROUP_ROOT)),
        })
    }

    /// Builds and runs, capturing output (see [`Sandbox::output`]).
    pub fn output(self) -> Result<Output, PolicyError> {
        Ok(self.stdin_null(true).build()?.output())
    }
}

impl Sandbox {
    /// Starts a builder.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A sandbox for an already validated policy.
    pub fn from_policy(policy: Policy, keep: bool, stdin: Stdin) -> Result<Sandbox, PolicyError> {
        policy.validate()?;
        Ok(Sandbox {
            policy,
            keep,
            stdin,
            cgroup_root: PathBuf::from(CGROUP_ROOT),
            net_notify: None,
        })
    }

    /// Calls `f` with each egress decision as it happens (e.g. to print denials at once).
    pub fn on_net_event(mut self, f: NetNotify) -> Self {
        self.net_notify = Some(f);
        self
    }

    /// The effective policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Runs to completion, capturing stdout and stderr in memory.
    pub fn output(&self) -> Output {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let report = self.run(
            Sinks {
                stdout: &mut out,
                stderr: &mut err,
                input: None,
                signals: None,
            },
            |_| {},
        );
        Output {
            report,
            stdout: out,
            stderr: err,
        }
    }

    /// Runs to completion, relaying output to `sinks`. `started` is called with the running
    /// sandbox (e.g. to size its pty) before output is relayed. A failure of palisade is a
    /// report with status `sandbox-error`, never the payload's result.
    pub fn run(&self, sinks: Sinks<'_>, started: impl FnOnce(&Running)) -> Report {
        let t0 = Instant::now();
        let mut policy = self.policy.clone();
        let mut kept: Option<PathBuf> = None;
        if self.keep && policy.scratch == Scratch::Ephemeral {
            match make_temp_dir() {
                Ok(d) => {
                    policy.scratch = Scratch::Host { path: d.clone() };
                    kept = Some(d);
                }
                Err(source) => {
                    let e = SetupError::Supervisor {
                        op: "create the scratch directory",
                        source,
                    };
                    return Report::from_error(&e, t0.elapsed(), None, policy.limits);
                }
            }
        }
        let scratch = match &policy.scratch {
            Scratch::Host { path } => Some(path.display().to_string()),
            Scratch::Ephemeral => None,
        };
        // The cgroup: memory and process ceilings for the sandbox as a whole. Fail closed: without
        // one, refuse, unless the user waived it by name.
        let (manager, waived) =
            match palisade_cgroup::detect(&self.cgroup_root, palisade_linux::host::cgroup_uid()) {
                Ok(m) => (Some(m), None),
                Err(e) if policy.allow_degraded.contains(&Degradable::Cgroup) => {
                    (None, Some(e.to_string()))
                }
                Err(e) => {
                    let msg =
                        format!("{e}; or pass --allow-degraded cgroup to run with rlimits only");
                    // Without user namespaces nothing can run whatever the cgroup: that is the
                    // error to give first (found by the VM matrix's no-userns guest, where an
                    // undelegated user was told only about the cgroup). `doctor` lists both.
                    let e = match palisade_linux::host::try_user_namespace() {
                        Err(errno) => palisade_linux::namespaces_error(errno),
                        Ok(()) => SetupError::Supervisor {
                            op: "set up the cgroup (memory and process ceilings)",
                            source: std::io::Error::other(msg),
                        },
                    };
                    if let Some(d) = &kept {
                        let _ = std::fs::remove_dir(d);
                    }
                    return Report::from_error(&e, t0.elapsed(), scratch, policy.limits);
                }
            };
        // The run's cgroup is made while init builds the view (palisade_linux::BeforeStart): init
        // then moves itself in through the v1 `tasks` files (cheap), or, on v2, is moved.
        let cgroup: RefCell<Option<Box<dyn RunCgroup>>> = RefCell::new(None);
        let prepare = |pid: i32| -> std::io::Result<Vec<std::fs::File>> {
            let Some(m) = &manager else {
                return Ok(Vec::new());
            };
            m.clean_stale();
            let limits = CgroupLimits {
                memory_bytes: policy.limits.memory_bytes,
                pids: policy.limits.pids,
                cpu_quota_us: policy.limits.cpu_quota_us(),
            };
            let c = m
                .create(&run_name(SEQ.fetch_add(1, Ordering::Relaxed)), &limits)
                .map_err(std::io::Error::other)?;
            let files = c.self_join_files().map_err(std::io::Error::other)?;
            if files.is_empty() {
                c.join(pid).map_err(std::io::Error::other)?;
            }
            *cgroup.borrow_mut() = Some(c);
            Ok(files)
        };
        let running = match palisade_linux::spawn(&policy, self.stdin, Some(&prepare)) {
            Ok(r) => r,
            Err(e) => {
                if let Some(d) = &kept {
                    let _ = std::fs::remove_dir(d);
                }
                return Report::from_error(&e, t0.elapsed(), scratch, policy.limits);
            }
        };
        let mut running = running;
        // The egress proxy, on the listeners init made inside the sandbox's network namespace.
        let egress = if policy.network.enabled() {
            let socks = running
                .take_egress()
                .into_iter()
                .map(|(spec, fd)| {
                    let role = match spec.role {
                        palisade_linux::SockRole::HttpProxy => palisade_net::Role::HttpProxy,
                        palisade_linux::SockRole::Socks => palisade_net::Role::Socks,
                        palisade_linux::SockRole::Dns => palisade_net::Role::Dns,
                        palisade_linux::SockRole::Transparent => palisade_net::Role::Transparent,
                    };
                    (role, fd)
                })
                .collect();
            let notify = self
                .net_notify
                .clone()
                .map(|f| Box::new(move |e: &palisade_net::Event| f(e)) as palisade_net::Notify);
            match palisade_net::Egress::start(policy.network.clone(), socks, notify) {
                Ok(e) => Some(e),
                Err(source) => {
                    running.kill();
                    let e = SetupError::Supervisor {
                        op: "start the egress proxy",
                        source,
                    };
                    return Report::from_error(&e, t0.elapsed(), scratch, policy.limits);
                }
            }
        } else {
            None
        };
        started(&running);
        let ids = running.ids();
        let landlock = running.landlock().clone();
        let protection = running.protection().clone();
        // The CPU-time limit, over every process of the sandbox, from the cgroup's accounting.
        let used = || cgroup.borrow().as_ref().and_then(|c| c.cpu_used());
        // The quota actually written, not the one asked for: a host without a cpu controller for
        // palisade applies none, and the budget can then drain on every CPU at once.
        let quota = cgroup
            .borrow()
            .as_ref()
            .and_then(|c| c.cpu_quota_us())
            .map_or(f64::MAX, |q| {
                q as f64 / palisade_cgroup::CPU_PERIOD_US as f64
            });
        let watch = manager.as_ref().map(|_| CpuWatch {
            used: &used,
            cpus: (palisade_linux::host::cpus() as f64).min(quota),
        });
        let mut report = match running.wait(sinks, watch) {
            Ok(o) => Report::from_outcome(&o, ids, &landlock, scratch, policy.limits),
            Err(e) => Report::from_error(&e, t0.elapsed(), scratch, policy.limits),
        };
        let mut cgroup = cgroup.into_inner();
        let stats = cgroup.as_ref().map(|c| c.stats()).unwrap_or_default();
        if let Some(c) = cgroup.as_mut() {
            let _ = c.remove();
        }
        let version = cgroup.as_ref().and(manager.as_ref()).map(|m| m.version());
        report.set_cgroup(version, stats, waived);
        if policy.allow_ptrace {
            report.note_ptrace_allowed();
        }
        if let Some(e) = egress {
            report.set_network(e.finish(), &policy.network);
        }
        // The sandbox is gone (init's end kills every process in it): whatever appeared at a
        // protected path that did not exist at the start is moved aside, never left to run later.
        let mut blocked = Vec::new();
        if let Some(dir) = &protection.scratch {
            for w in &protection.watched {
                match palisade_linux::host::disarm(dir, w) {
                    Ok(None) => {}
                    Ok(Some(to)) => blocked.push(crate::report::Blocked {
                        path: w.clone(),
                        moved_to: Some(to),
                        error: None,
                    }),
                    Err(e) => blocked.push(crate::report::Blocked {
                        path: w.clone(),
                        moved_to: None,
                        error: Some(e.to_string()),
                    }),
                }
            }
        }
        report.set_protected(&protection, blocked);
        report
    }

    /// Convenience for writers that are not `dyn`.
    pub fn run_to(&self, stdout: &mut impl Write, stderr: &mut impl Write) -> Report {
        self.run(
            Sinks {
                stdout,
                stderr,
                input: None,
                signals: None,
            },
            |_| {},
        )
    }
}

/// Root of the cgroup hierarchies.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Distinguishes the cgroups of one supervisor's runs.
static SEQ: AtomicU64 = AtomicU64::new(0);

fn make_temp_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let pid = std::process::id();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    for i in 0..100u32 {
        let p = base.join(format!(
            "palisade-{pid}-{:x}",
            (now as u64).wrapping_add(i as u64 * 7919)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "no free temporary directory name",
    ))
}

use std::os::unix::fs::DirBuilderExt;
