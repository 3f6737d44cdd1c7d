//! Assembling a policy: [`Builder`] takes options one at a time, validates each, and builds a
//! [`Sandbox`].

use crate::sandbox::{Output, Sandbox, CGROUP_ROOT};
use crate::Stdin;
use palisade_policy::file::PolicyFile;
use palisade_policy::Degradable;
use palisade_policy::{Bind, EnvVar, Policy, PolicyError, Scratch};
use std::path::{Path, PathBuf};

/// Builds a [`Sandbox`]; every setter validates, and the first error is returned by `build`.
#[derive(Debug, Default)]
pub struct Builder {
    command: Vec<String>,
    scratch: Option<PathBuf>,
    keep: bool,
    binds: Vec<Bind>,
    env: Vec<EnvVar>,
    tty: bool,
    stdin: Stdin,
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

    /// Standard input for runs that do not say otherwise ([`crate::Io::stdin`]); `/dev/null`
    /// by default.
    pub fn stdin(mut self, stdin: Stdin) -> Self {
        self.stdin = stdin;
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
            stdin: self.stdin,
            cgroup_root: self
                .cgroup_root
                .unwrap_or_else(|| PathBuf::from(CGROUP_ROOT)),
        })
    }

    /// Builds and runs, capturing output (see [`Sandbox::output`]).
    pub fn output(self) -> Result<Output, PolicyError> {
        Ok(self.build()?.output())
    }
}
