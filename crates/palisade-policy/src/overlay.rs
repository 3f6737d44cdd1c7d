//! Changes to a policy, and the one merge that applies them.
//!
//! Every source of policy is a [`PolicyOverlay`]: a policy file, a built-in profile, each setter
//! of the library's builder, the command line's options, a server's request. They all reach a
//! [`Policy`] through [`PolicyOverlay::apply`], so a field means the same wherever it is written:
//! a value replaces the one in force, a list adds to it.

use crate::http::{HttpRule, Secret};
use crate::net::{NetRule, Pin};
use crate::protect::ProtectedPath;
use crate::{Bind, Degradable, EnvName, EnvVar, Limits, Policy, PolicyError, Scratch};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Changes to a [`Policy`], in the shape of a policy file (docs/policy.md): `None` keeps the
/// value in force, a list adds to the one in force.
///
/// ```
/// use palisade_policy::{Policy, PolicyOverlay};
/// let mut p = Policy::new(["true"]).unwrap();
/// let mut o = PolicyOverlay::default();
/// o.limits.pids = Some(64);
/// o.hostname = Some("job".into());
/// o.apply(&mut p);
/// assert_eq!((p.limits.pids, p.hostname.as_str()), (64, "job"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyOverlay {
    /// Built-in profiles, applied before the fields of every overlay of the same layering
    /// ([`layer`]); [`PolicyOverlay::apply`] alone does not apply them.
    pub profiles: Vec<String>,
    pub hostname: Option<String>,
    /// A host directory as scratch (`filesystem.scratch`).
    pub scratch: Option<PathBuf>,
    /// A host directory as a copy-on-write workspace (`filesystem.workspace`); replaces a
    /// scratch set before it, as `scratch` replaces a workspace.
    pub workspace: Option<PathBuf>,
    pub keep_scratch: Option<bool>,
    /// `filesystem.ro` and `filesystem.rw`.
    pub binds: Vec<Bind>,
    /// More paths under the scratch directory kept read-only inside.
    pub protect: Vec<ProtectedPath>,
    /// Protected paths made writable again (applied after `protect`).
    pub unprotect: Vec<ProtectedPath>,
    /// `env.set`: a later value for a name replaces an earlier one, and an earlier `env.pass`.
    pub env_set: Vec<EnvVar>,
    /// `env.pass`: names whose values the caller gives later ([`Policy::resolve_env`]); applied
    /// after `env_set`, and replaces an earlier value for the name.
    pub env_pass: Vec<EnvName>,
    pub allow_net: Vec<NetRule>,
    pub deny_net: Vec<NetRule>,
    pub resolve: Vec<Pin>,
    pub dns_server: Option<SocketAddr>,
    pub local_ports: Vec<u16>,
    /// `network.inspect = true`: every allowed host's TLS inspected.
    pub inspect_all: Option<bool>,
    /// `network.inspect = [...]`: these hosts' TLS inspected.
    pub inspect: Vec<NetRule>,
    pub no_inspect: Vec<NetRule>,
    /// `network.http`: rules for the requests of the hosts they name.
    pub http: Vec<HttpRule>,
    /// `network.max_body`, in bytes.
    pub max_body: Option<u64>,
    /// `network.secrets`: a later secret for a name replaces an earlier one.
    pub secrets: Vec<Secret>,
    pub upstream_ca: Option<PathBuf>,
    pub limits: LimitsOverlay,
    pub allow_degraded: Vec<Degradable>,
    pub allow_ptrace: Option<bool>,
    /// Not a policy-file field: whether there is a terminal is the caller's to say at run time.
    pub tty: Option<bool>,
}

/// The limits an overlay sets; `None` keeps the value in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsOverlay {
    pub timeout_ms: Option<u64>,
    pub cpu_time_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub open_files: Option<u64>,
    pub file_size_bytes: Option<u64>,
    pub output_bytes: Option<u64>,
    pub tmp_bytes: Option<u64>,
    pub scratch_bytes: Option<u64>,
    pub cpu_milli: Option<u64>,
}

impl LimitsOverlay {
    /// Writes the limits this overlay sets into `l`.
    pub fn apply(&self, l: &mut Limits) {
        let set = |v: Option<u64>, t: &mut u64| {
            if let Some(v) = v {
                *t = v;
            }
        };
        set(self.timeout_ms, &mut l.timeout_ms);
        set(self.memory_bytes, &mut l.memory_bytes);
        set(self.pids, &mut l.pids);
        set(self.open_files, &mut l.open_files);
        set(self.file_size_bytes, &mut l.file_size_bytes);
        set(self.output_bytes, &mut l.output_bytes);
        set(self.tmp_bytes, &mut l.tmp_bytes);
        set(self.scratch_bytes, &mut l.scratch_bytes);
        if self.cpu_time_ms.is_some() {
            l.cpu_time_ms = self.cpu_time_ms;
        }
        if self.cpu_milli.is_some() {
            l.cpu_milli = self.cpu_milli;
        }
    }
}

impl PolicyOverlay {
    /// The merge: writes this overlay's fields into `p` (not its profiles: see [`layer`]).
    /// Values replace the ones in force; lists add to them (a variable or a protected path is
    /// never listed twice; a degraded layer once). The result is checked by
    /// [`Policy::validate`], not here: two layers may only make sense together.
    pub fn apply(&self, p: &mut Policy) {
        if let Some(h) = &self.hostname {
            p.hostname.clone_from(h);
        }
        if let Some(s) = &self.scratch {
            p.scratch = Scratch::Host { path: s.clone() };
        }
        if let Some(w) = &self.workspace {
            p.scratch = Scratch::Workspace { path: w.clone() };
        }
        if let Some(k) = self.keep_scratch {
            p.keep_scratch = k;
        }
        p.binds.extend(self.binds.iter().cloned());
        for x in &self.protect {
            if !p.protected.iter().any(|y| y == x.as_str()) {
                p.protected.push(x.as_str().to_owned());
            }
        }
        for x in &self.unprotect {
            p.protected.retain(|y| y != x.as_str());
        }
        for v in &self.env_set {
            p.env.retain(|o| o.name != v.name);
            p.env_pass.retain(|n| *n != v.name);
            p.env.push(v.clone());
        }
        for n in &self.env_pass {
            p.env.retain(|o| o.name != *n);
            if !p.env_pass.contains(n) {
                p.env_pass.push(n.clone());
            }
        }
        p.network.allow.extend(self.allow_net.iter().cloned());
        p.network.deny.extend(self.deny_net.iter().cloned());
        p.network.resolve.extend(self.resolve.iter().cloned());
        if let Some(a) = self.dns_server {
            p.network.dns_server = Some(a);
        }
        p.network
            .local_ports
            .extend(self.local_ports.iter().copied());
        let n = &mut p.network;
        if let Some(all) = self.inspect_all {
            n.inspect_all = all;
        }
        // Every host inspected: a list would say nothing more.
        if n.inspect_all {
            n.inspect.clear();
        } else {
            add_new(&mut n.inspect, &self.inspect);
        }
        add_new(&mut n.no_inspect, &self.no_inspect);
        add_new(&mut n.http, &self.http);
        if let Some(b) = self.max_body {
            n.max_body = Some(b);
        }
        for s in &self.secrets {
            n.secrets.retain(|o| o.name != s.name);
            n.secrets.push(s.clone());
        }
        if let Some(c) = &self.upstream_ca {
            n.upstream_ca = Some(c.clone());
        }
        self.limits.apply(&mut p.limits);
        for d in &self.allow_degraded {
            if !p.allow_degraded.contains(d) {
                p.allow_degraded.push(*d);
            }
        }
        if let Some(a) = self.allow_ptrace {
            p.allow_ptrace = a;
        }
        if let Some(t) = self.tty {
            p.tty = t;
        }
    }

    /// Applies this overlay's profiles to `p`, in order. An unknown name is an error naming it.
    pub fn apply_profiles(&self, p: &mut Policy) -> Result<(), PolicyError> {
        for name in &self.profiles {
            crate::profile::overlay(name)?.apply(p);
        }
        Ok(())
    }
}

/// Adds to `to` the items of `from` it does not hold yet.
fn add_new<T: PartialEq + Clone>(to: &mut Vec<T>, from: &[T]) {
    for x in from {
        if !to.contains(x) {
            to.push(x.clone());
        }
    }
}

/// Layers `overlays` onto `p` in the documented precedence (docs/policy.md): the profiles of
/// every overlay, in order, then the fields of every overlay, in order. With a policy file and
/// the command line's options as `[file, options]` that is: the defaults, the file's profiles,
/// each `--profile`, the file's own fields, the other options.
///
/// ```
/// use palisade_policy::{layer, Policy, PolicyOverlay};
/// let mut file = PolicyOverlay::default();
/// file.profiles.push("build".into()); // pids 4096, timeout 30m, …
/// file.limits.pids = Some(512);
/// let mut options = PolicyOverlay::default();
/// options.limits.timeout_ms = Some(60_000);
/// let mut p = Policy::new(["make"]).unwrap();
/// layer(&mut p, &[&file, &options]).unwrap();
/// assert_eq!((p.limits.pids, p.limits.timeout_ms), (512, 60_000));
/// ```
pub fn layer(p: &mut Policy, overlays: &[&PolicyOverlay]) -> Result<(), PolicyError> {
    for o in overlays {
        o.apply_profiles(p)?;
    }
    for o in overlays {
        o.apply(p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::PolicyFile;

    fn parse(text: &str) -> PolicyOverlay {
        PolicyFile::parse("t.toml", text)
            .unwrap_or_else(|e| panic!("{e}"))
            .overlay
    }

    /// A file with profiles, then options on top: the exact policy, field by field.
    #[test]
    fn a_file_its_profiles_and_options_give_exactly_this_policy() {
        let file = parse(
            r#"
profiles = ["python", "build"]
hostname = "job"
[filesystem]
scratch = "/srv/proj"
ro = ["/opt/data", "/srv/x:/data"]
protect = ["Makefile"]
unprotect = [".git/config"]
[env]
set = { MODE = "file", KEEP = "k", PYTHONUNBUFFERED = "0" }
pass = ["HF_TOKEN"]
[network]
allow = ["pypi.org:443"]
deny = ["bad.pypi.org"]
resolve = ["pypi.org=203.0.113.7"]
dns_server = "198.51.100.53"
local_ports = [8000]
[limits]
pids = 512
timeout = "2m"
cpus = 0.5
[layers]
allow_degraded = ["cgroup"]
allow_ptrace = true
"#,
        );
        let mut options = PolicyOverlay {
            profiles: vec!["shell".into()],
            binds: vec![Bind::parse("/tmp/out:/out", true).unwrap()],
            env_set: vec![EnvVar::new("MODE", "cli").unwrap()],
            env_pass: vec![EnvName::new("KEEP").unwrap()],
            allow_net: vec![NetRule::parse("t", "*.example.org").unwrap()],
            local_ports: vec![9000],
            allow_degraded: vec![Degradable::Landlock, Degradable::Cgroup],
            allow_ptrace: Some(false),
            keep_scratch: Some(true),
            tty: Some(true),
            unprotect: vec![ProtectedPath::new("Makefile").unwrap()],
            ..PolicyOverlay::default()
        };
        options.limits.memory_bytes = Some(1 << 30);
        options.limits.pids = Some(100);
        let mut p = Policy::new(["python3", "job.py"]).unwrap();
        layer(&mut p, &[&file, &options]).unwrap();

        let mut want = Policy::new(["python3", "job.py"]).unwrap();
        want.hostname = "job".into();
        want.scratch = Scratch::Host {
            path: "/srv/proj".into(),
        };
        want.keep_scratch = true;
        want.tty = true;
        want.binds = vec![
            Bind::parse("/opt/data", false).unwrap(),
            Bind::parse("/srv/x:/data", false).unwrap(),
            Bind::parse("/tmp/out:/out", true).unwrap(),
        ];
        want.protected.retain(|x| x != ".git/config");
        // python's variables in file order, shell's, the file's (PYTHONUNBUFFERED replaced and
        // moved to the end, KEEP then passed by name instead), the option's MODE.
        let var = |n: &str, v: &str| EnvVar::new(n, v).unwrap();
        want.env = vec![
            var("PYTHONDONTWRITEBYTECODE", "1"),
            var("PIP_NO_INPUT", "1"),
            var("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            var("MPLBACKEND", "Agg"),
            var("SHELL", "/bin/sh"),
            var("LC_ALL", "C.UTF-8"),
            var("PYTHONUNBUFFERED", "0"),
            var("MODE", "cli"),
        ];
        want.env_pass = vec![
            EnvName::new("HF_TOKEN").unwrap(),
            EnvName::new("KEEP").unwrap(),
        ];
        want.network.allow = vec![
            NetRule::parse("t", "pypi.org:443").unwrap(),
            NetRule::parse("t", "*.example.org").unwrap(),
        ];
        want.network.deny = vec![NetRule::parse("t", "bad.pypi.org").unwrap()];
        want.network.resolve = vec![Pin::parse("pypi.org=203.0.113.7").unwrap()];
        want.network.dns_server = Some("198.51.100.53:53".parse().unwrap());
        want.network.local_ports = vec![8000, 9000];
        want.limits = Limits {
            // build's, the file's, the options'.
            file_size_bytes: 4 << 30,
            tmp_bytes: 1 << 30,
            timeout_ms: 120_000,
            pids: 100,
            memory_bytes: 1 << 30,
            cpu_milli: Some(500),
            ..Limits::default()
        };
        want.allow_degraded = vec![Degradable::Cgroup, Degradable::Landlock];
        want.allow_ptrace = false;
        assert_eq!(p, want);
        p.validate_values().unwrap();
        // Options layered alone: the profiles still come first.
        let mut q = Policy::new(["true"]).unwrap();
        let o = PolicyOverlay {
            profiles: vec!["build".into()],
            limits: LimitsOverlay {
                pids: Some(8),
                ..LimitsOverlay::default()
            },
            ..PolicyOverlay::default()
        };
        layer(&mut q, &[&o]).unwrap();
        assert_eq!((q.limits.pids, q.limits.timeout_ms), (8, 1_800_000));
    }

    #[test]
    fn env_set_and_pass_replace_each_other_by_name() {
        let mut p = Policy::new(["true"]).unwrap();
        let set = |n: &str, v: &str| PolicyOverlay {
            env_set: vec![EnvVar::new(n, v).unwrap()],
            ..PolicyOverlay::default()
        };
        let pass = |n: &str| PolicyOverlay {
            env_pass: vec![EnvName::new(n).unwrap()],
            ..PolicyOverlay::default()
        };
        set("A", "1").apply(&mut p);
        pass("A").apply(&mut p);
        pass("A").apply(&mut p);
        assert!(p.env.is_empty());
        assert_eq!(p.env_pass, [EnvName::new("A").unwrap()]);
        set("A", "2").apply(&mut p);
        assert_eq!(p.env, [EnvVar::new("A", "2").unwrap()]);
        assert!(p.env_pass.is_empty());
        p.validate().unwrap();
    }

    #[test]
    fn an_unknown_profile_is_named() {
        let o = PolicyOverlay {
            profiles: vec!["nope".into()],
            ..PolicyOverlay::default()
        };
        let e = layer(&mut Policy::new(["true"]).unwrap(), &[&o]).unwrap_err();
        assert_eq!(e.field(), Some("profiles"));
        assert!(e.to_string().contains("`nope`"), "{e}");
    }

    /// The values passed by name come from the caller's lookup, never from the process.
    #[test]
    fn names_to_pass_are_resolved_only_by_the_caller() {
        let mut p = Policy::new(["true"]).unwrap();
        parse("[env]\nset = { A = \"1\" }\npass = [\"PATH\", \"B\"]\n").apply(&mut p);
        // PATH is set in this test process; the policy still has no value for it.
        assert!(std::env::var_os("PATH").is_some());
        let e = p.validate().unwrap_err();
        assert_eq!(e.field(), Some("env.pass"));
        assert!(e.to_string().contains("`PATH`"), "{e}");
        // A lookup without a value for one name: an error naming it, and nothing changes.
        let before = p.clone();
        let e = p
            .resolve_env(|n| (n.as_str() == "PATH").then(|| "/x".to_owned()))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid env.pass `B`: expected a variable the caller has a value for (or give its value in env.set)"
        );
        assert_eq!(p, before);
        let mut asked = Vec::new();
        p.resolve_env(|n| {
            asked.push(n.to_string());
            Some(format!("v-{n}"))
        })
        .unwrap();
        assert_eq!(asked, ["PATH", "B"]);
        assert_eq!(
            p.env,
            [
                EnvVar::new("A", "1").unwrap(),
                EnvVar::new("PATH", "v-PATH").unwrap(),
                EnvVar::new("B", "v-B").unwrap()
            ]
        );
        assert!(p.env_pass.is_empty());
        p.validate().unwrap();
    }
}
