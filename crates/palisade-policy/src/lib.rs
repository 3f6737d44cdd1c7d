//! palisade's policy: what one sandboxed run may see and do.
//!
//! Everything here is pure data. Values are validated when they are built (or deserialized), so an
//! invalid path, variable name or host name cannot exist past the parser: the Linux backend can
//! trust what it receives and never re-checks. Nothing in this crate touches the host.
//!
//! The default is deny: a [`Policy`] made from only a command has no host paths beyond the system
//! directories, an ephemeral scratch directory, an empty environment (plus `PATH`, `HOME`, `LANG`)
//! and no network.
//!
//! Every source of policy — a policy file, a built-in profile, the command line's options, the
//! library's builder, a server's request — is a [`PolicyOverlay`], applied by one merge
//! ([`PolicyOverlay::apply`], [`layer`] for the precedence). A caller that runs policies someone
//! else wrote holds [`Bounds`]: [`Policy::check_within`] names the field a policy asks too much
//! of, and [`Bounds::admit`] lowers what the request did not ask for. Variables passed by name
//! stay names until the caller that owns an environment resolves them ([`Policy::resolve_env`]):
//! nothing here reads the process environment.
#![forbid(unsafe_code)]

pub mod bounds;
mod env;
mod error;
pub mod file;
pub mod http;
mod limits;
pub mod net;
mod overlay;
mod path;
pub mod profile;
pub mod protect;
pub mod untrusted;

pub use bounds::{Bounds, BoundsError, HostPrefix};
pub use env::{EnvName, EnvVar};
pub use error::PolicyError;
pub use limits::{
    parse_count, parse_cpus, parse_duration, parse_size, Limits, MAX_CPUS, MAX_OPEN_FILES,
    MAX_OUTPUT, MAX_PIDS, MAX_TIMEOUT,
};
pub use overlay::{layer, LimitsOverlay, PolicyOverlay};
pub use path::SandboxPath;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A secret whose value the caller could not give ([`Policy::resolve_secrets`]): the secret as
/// the policy names it, and why. Never holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network.secrets `{secret}`: {why}")]
pub struct SecretError {
    pub secret: String,
    pub why: String,
}

/// Where the scratch directory, the one writable place, is mounted inside and used as `$HOME` and
/// the working directory.
pub const SCRATCH_DIR: &str = "/workspace";

/// Inside paths that palisade builds itself; a bind may not land on or under them.
pub const RESERVED_TARGETS: &[&str] = &[
    "/",
    "/proc",
    "/dev",
    SCRATCH_DIR,
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/hostname",
];

/// The `PATH` a payload gets unless the policy sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One sandboxed run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The program and its arguments. The program is looked up in the sandbox's `PATH` when it
    /// has no `/`.
    pub command: Vec<String>,
    /// The one writable directory.
    #[serde(default)]
    pub scratch: Scratch,
    /// With an ephemeral scratch: use a fresh host temporary directory instead of a tmpfs, and
    /// leave it behind after the run (its path is reported).
    #[serde(default)]
    pub keep_scratch: bool,
    /// Extra host paths made visible inside.
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Variables set inside, on top of `PATH`, `HOME`, `LANG` (and `TERM` with a terminal).
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Variables to pass by name (`env.pass`), still without a value. The library never reads
    /// the process environment: the caller that owns one resolves these names with
    /// [`Policy::resolve_env`], and [`Policy::validate`] refuses a policy until it has, so a
    /// policy from elsewhere (a request, a file) cannot reach into the environment of the
    /// process that runs it unless that process hands the values over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_pass: Vec<EnvName>,
    /// Give the payload a fresh pseudo-terminal of its own.
    #[serde(default)]
    pub tty: bool,
    /// Host name inside the sandbox's UTS namespace.
    #[serde(default = "default_hostname")]
    pub hostname: String,
    /// Ceilings; all on by default.
    #[serde(default)]
    pub limits: Limits,
    /// Layers the user explicitly accepts to run without when the host cannot enforce them.
    #[serde(default)]
    pub allow_degraded: Vec<Degradable>,
    /// Let processes inside trace one another (`ptrace`, `process_vm_readv/writev`: debuggers,
    /// `strace`), which the seccomp filter refuses by default. Nothing outside becomes reachable:
    /// the pid namespace shows no other process, init is not dumpable, and Landlock confines
    /// tracing to the sandbox's own domain.
    #[serde(default)]
    pub allow_ptrace: bool,
    /// Egress: none unless allow rules are given; then only through palisade's proxy.
    #[serde(default)]
    pub network: net::Network,
    /// Paths under a host scratch directory kept read-only inside, whether or not they exist
    /// (see [`protect`]); relative to the scratch directory. Unused with an ephemeral scratch.
    #[serde(default = "protect::defaults")]
    pub protected: Vec<String>,
    /// TESTS ONLY, never set it otherwise: one more host path in the mount view that gets **no
    /// Landlock rule**, so that a test can show Landlock refusing what a wrong mount view would
    /// expose. Refused by validation in release builds; not reachable from the CLI, never read
    /// from or written to a policy file
    /// (`serde(skip)`), and the report names it when set.
    #[doc(hidden)]
    #[serde(skip)]
    pub debug_unlandlocked_bind: Option<Bind>,
}

/// A layer that may be waived (`layers.allow_degraded`), loudly, and reported as not enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Degradable {
    /// Memory and process ceilings through a cgroup (rlimits still apply).
    Cgroup,
    /// Landlock, the filesystem's second wall (the mount view still applies).
    Landlock,
}

impl Degradable {
    /// The policy-file (and command-line) name.
    pub fn name(self) -> &'static str {
        match self {
            Degradable::Cgroup => "cgroup",
            Degradable::Landlock => "landlock",
        }
    }

    /// Parses the name.
    ///
    /// ```
    /// use palisade_policy::Degradable;
    /// assert_eq!(Degradable::parse("landlock").unwrap(), Degradable::Landlock);
    /// assert!(Degradable::parse("seccomp").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Degradable, PolicyError> {
        match s {
            "cgroup" => Ok(Degradable::Cgroup),
            "landlock" => Ok(Degradable::Landlock),
            _ => Err(PolicyError::invalid(
                "layers.allow_degraded",
                s,
                "one of: cgroup, landlock",
            )),
        }
    }
}

fn default_hostname() -> String {
    "sandbox".to_owned()
}

/// The scratch directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum Scratch {
    /// A fresh tmpfs that exists only inside the sandbox and vanishes with it.
    #[default]
    Ephemeral,
    /// A host directory, bound read-write. Files written there belong to the invoking user.
    Host {
        /// Absolute host path of an existing directory.
        path: PathBuf,
    },
    /// A host directory seen writable through a copy-on-write overlay: the directory itself is
    /// never written during the run; what the code changes is kept after it as a change set to
    /// review and apply (docs/workspace.md).
    Workspace {
        /// Absolute host path of an existing directory.
        path: PathBuf,
    },
}

impl Scratch {
    /// The host directory, for a host scratch or a workspace.
    pub fn host_path(&self) -> Option<&std::path::Path> {
        match self {
            Scratch::Ephemeral => None,
            Scratch::Host { path } | Scratch::Workspace { path } => Some(path),
        }
    }

    /// The policy field that sets it: `filesystem.scratch` or `filesystem.workspace`.
    pub fn field(&self) -> &'static str {
        match self {
            Scratch::Workspace { .. } => "filesystem.workspace",
            _ => "filesystem.scratch",
        }
    }
}

/// A host path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    /// Absolute host path. It is resolved by the backend without following symlinks.
    pub source: PathBuf,
    /// Where it appears inside; the same path as on the host unless given.
    pub target: SandboxPath,
    /// Writable (`filesystem.rw`) or read-only (`filesystem.ro`).
    #[serde(default)]
    pub writable: bool,
}

impl Bind {
    /// Parses `HOST[:INSIDE]`, the form of `filesystem.ro` and `filesystem.rw`.
    ///
    /// ```
    /// use palisade_policy::Bind;
    /// let b = Bind::parse("/srv/data:/data", false).unwrap();
    /// assert_eq!(b.target.as_str(), "/data");
    /// assert!(Bind::parse("relative/path", false).is_err());
    /// ```
    pub fn parse(spec: &str, writable: bool) -> Result<Bind, PolicyError> {
        let field = Bind::field(writable);
        let (source, target) = match spec.split_once(':') {
            Some((s, t)) => (s, t),
            None => (spec, spec),
        };
        if source.is_empty() || !source.starts_with('/') {
            return Err(PolicyError::invalid(
                field,
                spec,
                "an absolute host path, optionally followed by `:` and an absolute path inside",
            ));
        }
        let target = SandboxPath::new(target).map_err(|e| e.in_field(field))?;
        Ok(Bind {
            source: PathBuf::from(source),
            target,
            writable,
        })
    }
}

impl Bind {
    /// The policy field of a bind: `filesystem.rw` or `filesystem.ro`.
    pub fn field(writable: bool) -> &'static str {
        if writable {
            "filesystem.rw"
        } else {
            "filesystem.ro"
        }
    }
}

impl Policy {
    /// A policy that runs `command` with every default in place.
    ///
    /// ```
    /// use palisade_policy::Policy;
    /// let p = Policy::new(["python3", "-c", "print(1)"]).unwrap();
    /// assert!(p.binds.is_empty() && p.env.is_empty());
    /// ```
    pub fn new<I, S>(command: I) -> Result<Policy, PolicyError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let p = Policy {
            command: command.into_iter().map(Into::into).collect(),
            scratch: Scratch::default(),
            keep_scratch: false,
            binds: Vec::new(),
            env: Vec::new(),
            env_pass: Vec::new(),
            tty: false,
            hostname: default_hostname(),
            limits: Limits::default(),
            allow_degraded: Vec::new(),
            debug_unlandlocked_bind: None,
            allow_ptrace: false,
            network: net::Network::default(),
            protected: protect::defaults(),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks what the type system cannot: the command, the hostname, overlapping and reserved
    /// bind targets, duplicate variables, and that every variable passed by name has been given
    /// its value ([`Policy::resolve_env`]). Deserialized policies must pass this before use.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_values()?;
        if let Some(n) = self.env_pass.first() {
            return Err(PolicyError::invalid(
                "env.pass",
                n.as_str(),
                "a value from the caller first: Policy::resolve_env (the library never reads the process environment by itself)",
            ));
        }
        if let Some(s) = self.network.secrets.iter().find(|s| s.value.is_none()) {
            return Err(PolicyError::Invalid {
                field: "network.secrets",
                value: s.to_string(),
                expected: "a value from the caller first: Policy::resolve_secrets (the library never reads the process environment or a secret's file by itself)",
            });
        }
        Ok(())
    }

    /// Gives each secret of `network.secrets` its value from `lookup`, which the caller writes:
    /// the command line reads its own environment or the secret's file
    /// ([`http::SecretSource`]); a server, whatever it lets requests use. `lookup` returns the
    /// value, or why there is none (shown in the error with the secret, never a value). On an
    /// error nothing changes.
    ///
    /// ```
    /// use palisade_policy::{http::Secret, net::NetRule, Policy};
    /// let mut p = Policy::new(["true"]).unwrap();
    /// p.network.allow.push(NetRule::parse("t", "api.example.com").unwrap());
    /// p.network.secrets.push(Secret::parse("t", "TOKEN@api.example.com").unwrap());
    /// assert!(p.validate().is_err());
    /// p.resolve_secrets(|_| Ok("t0k".to_owned())).unwrap();
    /// p.validate().unwrap();
    /// ```
    pub fn resolve_secrets(
        &mut self,
        mut lookup: impl FnMut(&http::Secret) -> Result<String, String>,
    ) -> Result<(), SecretError> {
        let mut values = Vec::with_capacity(self.network.secrets.len());
        for s in &self.network.secrets {
            let v = lookup(s).map_err(|why| SecretError {
                secret: s.to_string(),
                why,
            })?;
            let v = http::SecretValue::new(&v).map_err(|why| SecretError {
                secret: s.to_string(),
                why: format!("expected {why}"),
            })?;
            values.push(v);
        }
        for (s, v) in self.network.secrets.iter_mut().zip(values) {
            s.value = Some(v);
        }
        Ok(())
    }

    /// Gives each variable of [`Policy::env_pass`] its value from `lookup`, and moves it to
    /// [`Policy::env`]. `lookup` is the caller's to write: its own environment
    /// (`|n| std::env::var(n.as_str()).ok()`, what the command line does), a table of what it
    /// lets requests see, or nothing at all. A name without a value is an error naming it, and
    /// then nothing changes.
    ///
    /// ```
    /// use palisade_policy::{EnvName, Policy};
    /// let mut p = Policy::new(["env"]).unwrap();
    /// p.env_pass.push(EnvName::new("TOKEN").unwrap());
    /// assert!(p.validate().is_err());
    /// p.resolve_env(|n| (n.as_str() == "TOKEN").then(|| "t0k".to_owned())).unwrap();
    /// assert_eq!((p.env[0].name.as_str(), p.env[0].value.as_str()), ("TOKEN", "t0k"));
    /// p.validate().unwrap();
    /// ```
    pub fn resolve_env(
        &mut self,
        mut lookup: impl FnMut(&EnvName) -> Option<String>,
    ) -> Result<(), PolicyError> {
        let mut vars = Vec::with_capacity(self.env_pass.len());
        for n in &self.env_pass {
            let Some(v) = lookup(n) else {
                return Err(PolicyError::invalid(
                    "env.pass",
                    n.as_str(),
                    "a variable the caller has a value for (or give its value in env.set)",
                ));
            };
            vars.push(EnvVar::new(n.as_str(), &v).map_err(|e| e.in_field("env.pass"))?);
        }
        self.env_pass.clear();
        for v in vars {
            self.env.retain(|o| o.name != v.name);
            self.env.push(v);
        }
        Ok(())
    }

    /// [`Policy::validate`] but for the variables still to pass by name: for a policy whose
    /// caller resolves them later (a server checking a request before it looks at values).
    pub fn validate_values(&self) -> Result<(), PolicyError> {
        // The test-only bind does not exist for release builds: a library user cannot ship it.
        if self.debug_unlandlocked_bind.is_some() && !cfg!(debug_assertions) {
            return Err(PolicyError::invalid(
                "debug_unlandlocked_bind",
                "(set)",
                "nothing: a test-only field, refused in release builds",
            ));
        }
        match self.command.first() {
            None => {
                return Err(PolicyError::invalid(
                    "command",
                    "",
                    "a program to run, e.g. `-- python3 script.py`",
                ))
            }
            Some(p) if p.is_empty() => {
                return Err(PolicyError::invalid(
                    "command",
                    "",
                    "a non-empty program name or path",
                ))
            }
            _ => {}
        }
        if let Some(a) = self.command.iter().find(|a| a.contains('\0')) {
            return Err(PolicyError::invalid(
                "command",
                a,
                "arguments without NUL bytes",
            ));
        }
        if let Some(path) = self.scratch.host_path() {
            if !path.is_absolute() {
                return Err(PolicyError::invalid(
                    self.scratch.field(),
                    &path.display().to_string(),
                    "an absolute path of an existing host directory",
                ));
            }
        }
        if self.keep_scratch && matches!(self.scratch, Scratch::Workspace { .. }) {
            return Err(PolicyError::invalid(
                "filesystem.keep_scratch",
                "true",
                "false with filesystem.workspace (the workspace's changes are kept anyway, as a change set)",
            ));
        }
        let h = &self.hostname;
        let ok_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if h.len() > 64 || !h.split('.').all(ok_label) {
            return Err(PolicyError::invalid(
                "hostname",
                h,
                "letters, digits, `-` and `.`, at most 64 characters (RFC 1123)",
            ));
        }
        self.limits.validate()?;
        self.network.validate()?;
        let twice = |p: &str| {
            PolicyError::invalid(
                "filesystem.protect",
                p,
                "each path once, without a trailing `/`",
            )
        };
        // This runs several times for each run and each request a server takes, over the ~60
        // default paths. Those are valid and listed once (a test holds them to it), so a list
        // that starts with them is checked from where it departs from them; a scan of all the
        // paths before each one was quadratic.
        let known = self
            .protected
            .iter()
            .zip(protect::DEFAULT_PROTECTED)
            .take_while(|(p, (d, _))| p.as_str() == *d)
            .count();
        let (defaults, rest) = self.protected.split_at(known);
        for (i, p) in rest.iter().enumerate() {
            let v =
                protect::ProtectedPath::check(p).map_err(|e| e.in_field("filesystem.protect"))?;
            if v != p || defaults.contains(p) || rest[..i].contains(p) {
                return Err(twice(p));
            }
        }
        for b in self.all_binds() {
            let field = Bind::field(b.writable);
            if !b.source.is_absolute() {
                return Err(PolicyError::invalid(
                    field,
                    &b.source.display().to_string(),
                    "an absolute host path",
                ));
            }
            if let Some(r) = RESERVED_TARGETS
                .iter()
                .find(|r| b.target.as_str() == **r || (**r != "/" && b.target.starts_with(r)))
            {
                return Err(PolicyError::Reserved {
                    field,
                    target: b.target.to_string(),
                    reserved: r,
                });
            }
        }
        let binds: Vec<&Bind> = self.all_binds().collect();
        for (i, b) in binds.iter().enumerate() {
            if let Some(dup) = binds[..i].iter().find(|o| o.target == b.target) {
                return Err(PolicyError::DuplicateTarget {
                    target: b.target.to_string(),
                    first: dup.source.display().to_string(),
                    second: b.source.display().to_string(),
                });
            }
        }
        for (i, v) in self.env.iter().enumerate() {
            if self.env[..i].iter().any(|o| o.name == v.name) {
                return Err(PolicyError::invalid(
                    "env.set",
                    v.name.as_str(),
                    "each variable named once",
                ));
            }
        }
        for s in &self.network.secrets {
            if self.env.iter().any(|o| o.name == s.name) || self.env_pass.contains(&s.name) {
                return Err(PolicyError::Invalid {
                    field: "network.secrets",
                    value: s.to_string(),
                    expected: "a variable that env.set and env.pass do not also name: inside it holds the secret's placeholder",
                });
            }
        }
        for (i, n) in self.env_pass.iter().enumerate() {
            if self.env_pass[..i].contains(n) || self.env.iter().any(|o| o.name == *n) {
                return Err(PolicyError::invalid(
                    "env.pass",
                    n.as_str(),
                    "each variable named once, in env.set or in env.pass",
                ));
            }
        }
        Ok(())
    }

    /// The policy's binds, then the test-only one without a Landlock rule.
    fn all_binds(&self) -> impl Iterator<Item = &Bind> {
        self.binds.iter().chain(&self.debug_unlandlocked_bind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_parse_and_default_to_same_path() {
        let b = Bind::parse("/opt/tool", true).unwrap();
        assert_eq!(
            b,
            Bind {
                source: "/opt/tool".into(),
                target: SandboxPath::new("/opt/tool").unwrap(),
                writable: true
            }
        );
        let e = Bind::parse("rel", false).unwrap_err().to_string();
        assert!(
            e.contains("filesystem.ro") && e.contains("rel") && e.contains("absolute"),
            "{e}"
        );
        let e = Bind::parse("/a:rel", true).unwrap_err().to_string();
        assert!(e.contains("filesystem.rw") && e.contains("absolute"), "{e}");
    }

    #[test]
    fn reserved_and_duplicate_targets_are_refused() {
        let mut p = Policy::new(["true"]).unwrap();
        p.binds.push(Bind::parse("/srv:/proc/x", false).unwrap());
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("/proc/x") && e.contains("/proc"), "{e}");
        p.binds = vec![
            Bind::parse("/a:/x", false).unwrap(),
            Bind::parse("/b:/x", true).unwrap(),
        ];
        let e = p.validate().unwrap_err().to_string();
        assert!(
            e.contains("/x") && e.contains("/a") && e.contains("/b"),
            "{e}"
        );
        p.binds = vec![Bind::parse("/srv:/", false).unwrap()];
        assert!(p.validate().is_err());
    }

    #[test]
    fn protected_paths_are_each_valid_and_listed_once() {
        // The defaults, which `validate` takes as checked.
        let defaults: Vec<&str> = protect::DEFAULT_PROTECTED.iter().map(|(d, _)| *d).collect();
        for (i, d) in defaults.iter().enumerate() {
            assert_eq!(protect::ProtectedPath::check(d).ok(), Some(*d));
            assert!(!defaults[..i].contains(d), "{d} twice");
        }
        let mut p = Policy::new(["true"]).unwrap();
        let n = p.protected.len();
        assert_eq!(p.protected, defaults);
        // Sixteen components are allowed, a seventeenth is not.
        let deep = vec!["d"; 16].join("/");
        p.protected.push(deep.clone());
        p.validate().unwrap();
        for bad in [
            format!("{deep}/e"),
            "x/".into(),
            "/etc".into(),
            "a/../b".into(),
            "a//b".into(),
            "./a".into(),
            String::new(),
        ] {
            let mut q = p.clone();
            q.protected.push(bad.clone());
            let e = q.validate().unwrap_err();
            assert_eq!(e.field(), Some("filesystem.protect"), "{bad:?}: {e}");
        }
        // A duplicate, wherever it is: a default listed again, or the new one twice.
        for again in [p.protected[0].clone(), p.protected[n / 2].clone(), deep] {
            for at in [0, 1, n / 2, p.protected.len()] {
                let mut q = p.clone();
                q.protected.insert(at, again.clone());
                let e = q.validate().unwrap_err();
                assert_eq!(e.field(), Some("filesystem.protect"), "{again}: {e}");
                assert!(e.to_string().contains(&again), "{e}");
            }
        }
        // A list without some defaults, or in another order, is checked in full.
        let mut q = p.clone();
        q.protected.remove(0);
        q.validate().unwrap();
        q.protected.push(q.protected[n / 2].clone());
        assert!(q.validate().is_err());
        let mut q = p.clone();
        q.protected.reverse();
        q.validate().unwrap();
        q.protected.insert(5, "x/".into());
        assert!(q.validate().is_err());
    }

    #[test]
    fn empty_command_and_bad_hostname_are_refused() {
        assert!(Policy::new(Vec::<String>::new())
            .unwrap_err()
            .to_string()
            .contains("command"));
        let mut p = Policy::new(["true"]).unwrap();
        p.hostname = "bad_host!".into();
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("hostname") && e.contains("bad_host!"), "{e}");
    }

    #[test]
    fn the_unlandlocked_test_bind_is_never_in_a_policy_file_and_is_validated() {
        let mut p = Policy::new(["true"]).unwrap();
        p.debug_unlandlocked_bind = Some(Bind::parse("/srv:/x", true).unwrap());
        let j = serde_json::to_string(&p).unwrap();
        assert!(
            !j.contains("debug_unlandlocked_bind") && !j.contains("/srv"),
            "{j}"
        );
        let e = serde_json::from_str::<Policy>(
            r#"{"command":["true"],"debug_unlandlocked_bind":{"source":"/","target":"/x"}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("debug_unlandlocked_bind"), "{e}");
        p.binds.push(Bind::parse("/opt:/x", false).unwrap());
        assert!(p.validate().unwrap_err().to_string().contains("/x"));
        p.binds.clear();
        p.debug_unlandlocked_bind = Some(Bind::parse("/srv:/proc/x", true).unwrap());
        assert!(p.validate().is_err());
    }

    #[test]
    fn policy_round_trips_through_json_and_rejects_unknown_fields() {
        let mut p = Policy::new(["python3", "x.py"]).unwrap();
        p.env.push(EnvVar::parse("A=1").unwrap());
        p.scratch = Scratch::Host {
            path: "/tmp/s".into(),
        };
        let j = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&j).unwrap(), p);
        let bad = r#"{"command":["true"],"scratchh":{}}"#;
        let e = serde_json::from_str::<Policy>(bad).unwrap_err().to_string();
        assert!(e.contains("scratchh"), "{e}");
    }
}
