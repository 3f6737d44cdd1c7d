//! Assembling a policy: [`Builder`] takes options one at a time, validates each, and builds a
//! [`Sandbox`].
//!
//! Each setter is a one-field [`PolicyOverlay`] applied with the same merge as a policy file or a
//! profile ([`PolicyOverlay::apply`]): a value replaces the one in force, a list adds to it, in
//! the order the setters are called.

use crate::sandbox::{Output, Sandbox, CGROUP_ROOT};
use crate::Stdin;
use palisade_policy::file::PolicyFile;
use palisade_policy::net::{parse_dns_server, NetRule, Pin};
use palisade_policy::protect::ProtectedPath;
use palisade_policy::{layer, Bind, Bounds, Degradable, EnvName, EnvVar, Limits};
use palisade_policy::{Policy, PolicyError, PolicyOverlay};
use std::path::{Path, PathBuf};

/// Builds a [`Sandbox`]; every setter validates, and the first error is returned by `build`.
#[derive(Debug)]
pub struct Builder {
    /// The policy so far: the defaults, then each setter in turn.
    policy: Policy,
    /// Ceilings from policy files with a `[bounds]` table, or given with [`Builder::bounds`].
    bounds: Vec<Bounds>,
    stdin: Stdin,
    cgroup_root: Option<PathBuf>,
    error: Option<PolicyError>,
}

impl Default for Builder {
    fn default() -> Self {
        let mut policy = Policy::new(["true"]).expect("the defaults are valid");
        policy.command.clear();
        Builder {
            policy,
            bounds: Vec::new(),
            stdin: Stdin::Null,
            cgroup_root: None,
            error: None,
        }
    }
}

impl Builder {
    /// Applies a one-field overlay that `set` fills in.
    fn with(mut self, set: impl FnOnce(&mut PolicyOverlay)) -> Self {
        let mut o = PolicyOverlay::default();
        set(&mut o);
        o.apply(&mut self.policy);
        self
    }

    /// Applies a one-field overlay built from a parsed value, or keeps the first error.
    fn parsed<T>(
        mut self,
        value: Result<T, PolicyError>,
        set: impl FnOnce(&mut PolicyOverlay, T),
    ) -> Self {
        match value {
            Ok(v) => self.with(|o| set(o, v)),
            Err(e) => {
                self.error = self.error.or(Some(e));
                self
            }
        }
    }

    /// The program and its arguments.
    pub fn command<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.policy.command = argv.into_iter().map(Into::into).collect();
        self
    }

    /// Starts over from `policy`, command included (e.g. one a caller layered and checked
    /// itself); the setters called after it apply on top.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// A host directory to use as scratch (writable, the working directory, `$HOME`).
    pub fn scratch_dir(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.with(|o| o.scratch = Some(dir))
    }

    /// Keep the ephemeral scratch: a host temporary directory is used and left behind.
    pub fn keep_scratch(self, keep: bool) -> Self {
        self.with(|o| o.keep_scratch = Some(keep))
    }

    /// Makes a host path visible read-only at the same path inside.
    pub fn ro(self, host: impl AsRef<Path>) -> Self {
        self.bind(host, false)
    }

    /// Makes a host path visible read-write at the same path inside.
    pub fn rw(self, host: impl AsRef<Path>) -> Self {
        self.bind(host, true)
    }

    fn bind(self, host: impl AsRef<Path>, writable: bool) -> Self {
        let b = Bind::parse(&host.as_ref().to_string_lossy(), writable);
        self.parsed(b, |o, b| o.binds.push(b))
    }

    /// Adds a parsed bind (`HOST[:INSIDE]`).
    pub fn bind_spec(self, b: Bind) -> Self {
        self.with(|o| o.binds.push(b))
    }

    /// Sets a variable inside; a later value for the same name replaces the earlier one (so
    /// that command-line options override a policy file's).
    pub fn env(self, name: &str, value: &str) -> Self {
        self.parsed(EnvVar::new(name, value), |o, v| o.env_set.push(v))
    }

    /// Passes a variable by name: its value is given later by [`Builder::resolve_env`], from
    /// whatever the caller chooses; `build` refuses until then. Policy files' `env.pass` names
    /// wait the same way.
    pub fn pass_env(self, name: &str) -> Self {
        self.parsed(EnvName::new(name), |o, n| o.env_pass.push(n))
    }

    /// Gives the variables passed by name their values from `lookup` (see
    /// [`Policy::resolve_env`]). The library never reads the process environment on its own:
    /// to pass the caller's, say so.
    ///
    /// ```
    /// use palisade::policy::file::PolicyFile;
    /// let f = PolicyFile::parse("p.toml", "[env]\npass = [\"HOME\"]\n").unwrap();
    /// let b = palisade::Sandbox::builder().command(["true"]).policy_file(&f);
    /// assert!(b.build().unwrap_err().to_string().contains("env.pass `HOME`"));
    /// let b = palisade::Sandbox::builder().command(["true"]).policy_file(&f);
    /// let s = b.resolve_env(|n| std::env::var(n.as_str()).ok()).build().unwrap();
    /// assert_eq!(s.policy().env[0].name.as_str(), "HOME");
    /// ```
    pub fn resolve_env(mut self, lookup: impl FnMut(&EnvName) -> Option<String>) -> Self {
        if let Err(e) = self.policy.resolve_env(lookup) {
            self.error = self.error.or(Some(e));
        }
        self
    }

    /// The sandbox's host name (default `sandbox`).
    pub fn hostname(self, name: &str) -> Self {
        let name = name.to_owned();
        self.with(|o| o.hostname = Some(name))
    }

    /// Keeps `path` (relative to a host scratch directory) read-only inside, on top of the
    /// default protected paths (see [`palisade_policy::protect`]).
    pub fn protect(self, path: &str) -> Self {
        let p = ProtectedPath::new(path).map_err(|e| e.in_field("filesystem.protect"));
        self.parsed(p, |o, p| o.protect.push(p))
    }

    /// Makes a protected path writable again, e.g. `.git/config` for a workload that configures
    /// its own repository. Loud on purpose: it reopens a way to act after the run.
    pub fn unprotect(self, path: &str) -> Self {
        let p = ProtectedPath::new(path).map_err(|e| e.in_field("filesystem.unprotect"));
        self.parsed(p, |o, p| o.unprotect.push(p))
    }

    /// Applies a built-in profile (see [`palisade_policy::profile`]).
    ///
    /// ```
    /// let b = palisade::Sandbox::builder().command(["true"]).profile("build");
    /// assert_eq!(b.current_limits().pids, 4096);
    /// ```
    pub fn profile(self, name: &str) -> Self {
        self.parsed(palisade_policy::profile::overlay(name), |o, p| *o = p)
    }

    /// Applies a policy file: its profiles, then its own fields. Lists add to what is set,
    /// values replace it. A file with a `[bounds]` table also bounds the result: what was set
    /// before the file is lowered to fit, as defaults are, and what is set after it must fit,
    /// or `build` refuses with the field and both values.
    pub fn policy_file(mut self, f: &PolicyFile) -> Self {
        if f.bounds.is_some() {
            match f.ceiling() {
                Ok(b) => self = self.bounds(b),
                Err(e) => {
                    self.error = self.error.or(Some(e));
                    return self;
                }
            }
        }
        if let Err(e) = layer(&mut self.policy, &[&f.overlay]) {
            self.error = self.error.or(Some(e));
        }
        self
    }

    /// Applies an overlay's own fields, not its profiles (see [`palisade_policy::layer`] for
    /// the precedence between the profiles and fields of several).
    pub fn overlay(mut self, o: &PolicyOverlay) -> Self {
        o.apply(&mut self.policy);
        self
    }

    /// Bounds the policy by `b`: what is set so far is lowered to fit (as defaults are, see
    /// [`Policy::clamp_to`]); what is set after must fit, or `build` refuses with the field
    /// and both values ([`Policy::check_within`]).
    pub fn bounds(mut self, b: Bounds) -> Self {
        self.policy.clamp_to(&b);
        self.bounds.push(b);
        self
    }

    /// Wall-clock timeout for the whole run (default 10 minutes).
    pub fn timeout(self, t: std::time::Duration) -> Self {
        let ms = t.as_millis().min(u64::MAX as u128) as u64;
        self.with(|o| o.limits.timeout_ms = Some(ms))
    }

    /// CPU time for all processes together (default: the wall-clock timeout).
    pub fn cpu_time(self, t: std::time::Duration) -> Self {
        // Rounded up, so that a non-zero limit never becomes 0 (which validation refuses).
        let ms = t.as_nanos().div_ceil(1_000_000).min(u64::MAX as u128) as u64;
        self.with(|o| o.limits.cpu_time_ms = Some(ms))
    }

    /// Cap on stdout plus stderr, in bytes (default 64 MiB).
    pub fn output_limit(self, bytes: u64) -> Self {
        self.with(|o| o.limits.output_bytes = Some(bytes))
    }

    /// The limits set so far (defaults where none was set).
    pub fn current_limits(&self) -> Limits {
        self.policy.limits
    }

    /// All limits at once.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.policy.limits = limits;
        self
    }

    /// Runs even when the host cannot give this layer, which the report then lists as waived.
    pub fn allow_degraded(self, layer: Degradable) -> Self {
        self.with(|o| o.allow_degraded.push(layer))
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
    pub fn allow_ptrace(self, allow: bool) -> Self {
        self.with(|o| o.allow_ptrace = Some(allow))
    }

    /// Allows egress to `rule` (`HOST`, `*.DOMAIN`, IP or CIDR, optionally `:PORT`) through
    /// palisade's proxy. Without any, the sandbox has no network.
    pub fn allow_net(self, rule: &str) -> Self {
        let r = NetRule::parse("network.allow", rule);
        self.parsed(r, |o, r| o.allow_net.push(r))
    }

    /// Denies `rule` even where an allow rule would match (deny wins).
    pub fn deny_net(self, rule: &str) -> Self {
        let r = NetRule::parse("network.deny", rule);
        self.parsed(r, |o, r| o.deny_net.push(r))
    }

    /// Pins a name to an address (`HOST=IP`) for the proxy's upstream lookups; for tests and
    /// special setups. The address is still checked like any other.
    pub fn resolve(self, pin: &str) -> Self {
        self.parsed(Pin::parse(pin), |o, p| o.resolve.push(p))
    }

    /// Resolves allowed names by asking the DNS server `server` (`IP[:PORT]`, port 53 by default)
    /// instead of the system resolver; the answers are checked like any other addresses.
    pub fn dns_server(self, server: &str) -> Self {
        self.parsed(parse_dns_server(server), |o, a| o.dns_server = Some(a))
    }

    /// Lets the payload listen on TCP `port` inside its own network namespace and connect to it
    /// there (a test server and its client); Landlock refuses every other TCP bind.
    pub fn allow_local_port(self, port: u16) -> Self {
        self.with(|o| o.local_ports.push(port))
    }

    /// Gives the payload a pty of its own.
    pub fn tty(self, tty: bool) -> Self {
        self.with(|o| o.tty = Some(tty))
    }

    /// Standard input for runs that do not say otherwise ([`crate::Io::stdin`]); `/dev/null`
    /// by default.
    pub fn stdin(mut self, stdin: Stdin) -> Self {
        self.stdin = stdin;
        self
    }

    /// Validates everything, checks the bounds, and returns the sandbox.
    pub fn build(self) -> Result<Sandbox, PolicyError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let policy = self.policy;
        policy.validate_values()?;
        for b in &self.bounds {
            policy.check_within(b)?;
        }
        policy.validate()?;
        Ok(Sandbox {
            net_notify: None,
            keep: policy.keep_scratch,
            policy,
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

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_policy::Scratch;

    /// The setters are the policy file's fields: the same calls and the same file give the same
    /// policy.
    #[test]
    fn setters_and_a_file_give_the_same_policy() {
        let f = PolicyFile::parse(
            "p.toml",
            r#"
profiles = ["python"]
hostname = "job"
[filesystem]
scratch = "/srv/proj"
ro = ["/opt/data"]
rw = ["/tmp/out:/out"]
protect = ["Makefile"]
unprotect = [".git/config"]
[env]
set = { MODE = "fast" }
[network]
allow = ["pypi.org:443"]
deny = ["bad.pypi.org"]
resolve = ["pypi.org=203.0.113.7"]
dns_server = "198.51.100.53"
local_ports = [8000]
[limits]
timeout = "90s"
cpu_time = "1m"
output = "1MiB"
[layers]
allow_degraded = ["cgroup"]
allow_ptrace = true
"#,
        )
        .unwrap();
        let from_file = Sandbox::builder()
            .command(["true"])
            .policy_file(&f)
            .build()
            .unwrap();
        let from_setters = Sandbox::builder()
            .command(["true"])
            .profile("python")
            .hostname("job")
            .scratch_dir("/srv/proj")
            .ro("/opt/data")
            .bind_spec(Bind::parse("/tmp/out:/out", true).unwrap())
            .protect("Makefile")
            .unprotect(".git/config")
            .env("MODE", "fast")
            .allow_net("pypi.org:443")
            .deny_net("bad.pypi.org")
            .resolve("pypi.org=203.0.113.7")
            .dns_server("198.51.100.53")
            .allow_local_port(8000)
            .timeout(std::time::Duration::from_secs(90))
            .cpu_time(std::time::Duration::from_secs(60))
            .output_limit(1 << 20)
            .allow_degraded(Degradable::Cgroup)
            .allow_ptrace(true)
            .build()
            .unwrap();
        assert_eq!(from_file.policy(), from_setters.policy());
        assert_eq!(
            from_file.policy().scratch,
            Scratch::Host {
                path: "/srv/proj".into()
            }
        );
    }

    /// Errors name the policy field, never a command-line option.
    #[test]
    fn errors_name_policy_fields() {
        let field = |b: Builder| b.command(["true"]).build().unwrap_err().field();
        let b = Sandbox::builder;
        assert_eq!(field(b().ro("rel")), Some("filesystem.ro"));
        assert_eq!(field(b().rw("/a:rel")), Some("filesystem.rw"));
        assert_eq!(field(b().profile("nope")), Some("profiles"));
        assert_eq!(field(b().allow_net("*")), Some("network.allow"));
        assert_eq!(field(b().deny_net("*")), Some("network.deny"));
        assert_eq!(field(b().resolve("x")), Some("network.resolve"));
        assert_eq!(field(b().dns_server("x")), Some("network.dns_server"));
        assert_eq!(field(b().protect("/etc")), Some("filesystem.protect"));
        assert_eq!(field(b().unprotect("../x")), Some("filesystem.unprotect"));
        assert_eq!(field(b().env("1X", "")), Some("env.set"));
        assert_eq!(field(b().pass_env("1X")), Some("env.pass"));
        assert_eq!(field(b().pass_env("X")), Some("env.pass"));
        assert_eq!(field(b().scratch_dir("rel")), Some("filesystem.scratch"));
        assert_eq!(field(b().output_limit(0)), Some("limits.output"));
        assert_eq!(
            field(b().deny_net("a.org")),
            Some("network.deny/network.resolve/network.dns_server")
        );
        assert_eq!(
            field(b().allow_net("a.org").allow_local_port(3128)),
            Some("network.local_ports")
        );
    }

    /// A file's `[bounds]`: what came before is lowered, what comes after is checked.
    #[test]
    fn a_files_bounds_lower_what_came_before_and_check_what_comes_after() {
        let f = PolicyFile::parse("s.toml", "[bounds.limits]\ntimeout = \"30s\"\n").unwrap();
        let s = Sandbox::builder()
            .command(["true"])
            .timeout(std::time::Duration::from_secs(3600))
            .policy_file(&f)
            .build()
            .unwrap();
        assert_eq!(s.policy().limits.timeout_ms, 30_000);
        let e = Sandbox::builder()
            .command(["true"])
            .policy_file(&f)
            .timeout(std::time::Duration::from_secs(31))
            .build()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limits.timeout: 31s is beyond the bounds (at most 30s)"
        );
        // The file's own host paths are its ceiling: nothing else may be bound.
        let e = Sandbox::builder()
            .command(["true"])
            .policy_file(&f)
            .ro("/etc")
            .build()
            .unwrap_err();
        assert_eq!(e.field(), Some("filesystem.ro"));
    }
}
