//! Bounds: the most a policy may ask for, held by a caller that runs policies someone else
//! wrote (a server's requests).
//!
//! [`Policy::check_within`] says whether a policy fits a [`Bounds`], and when it does not, names
//! the policy field, the value asked and what the bounds allow, so that a server can answer 4xx
//! with it. [`Bounds::admit`] is the whole path of a request: the caller's base policy lowered
//! to the bounds, the request's overlay on top, validated, checked.
//!
//! **Lowered or refused?** What the request did not ask for — the defaults, the server's own
//! base policy — is lowered to the bounds ([`Policy::clamp_to`]): a request that says nothing
//! must run under any bounds, so the default 10-minute timeout under a 30-second ceiling becomes
//! 30 seconds. What the request asked for is refused when it does not fit, never lowered in
//! silence: a run with less than it asked for (1 GiB where it asked for 4) would fail later in a
//! way its caller cannot explain, while the refusal names the field and both values, and the
//! caller can ask again.
//!
//! **What fits**, field by field:
//! - `limits.*`: each at most the bounds' value; the CPU time as in force (unset: the timeout);
//!   bounds with a CPU quota need a quota (`limits.cpus`) at most as large.
//! - `network.allow`: for each port a rule opens (none given: 80 and 443), one allow rule of the
//!   bounds with that port whose pattern covers the rule's: an exact name is covered by the
//!   same name or by a wildcard above it (`api.example.com` by `*.example.com`); a wildcard by
//!   an equal or wider wildcard (`*.a.example.com` by `*.example.com`), never by an exact name;
//!   an address or CIDR block by a block of the same family that contains it. Names and
//!   addresses never cover each other.
//! - `network.deny`: the bounds' deny rules stay in force whenever egress is on
//!   ([`Bounds::admit`] adds them); `network.resolve`: only the bounds' pins;
//!   `network.dns_server`: only the bounds' server, which `admit` sets.
//! - `network.inspect`: what the bounds inspect stays inspected (`admit` adds it);
//!   `network.no_inspect`: only hosts the bounds exempt, or hosts the bounds do not inspect.
//! - `network.http`: the bounds' rules stay in force (`admit` adds them), and a rule of the
//!   policy is either within one of the bounds' (its host, port, methods and path covered) or
//!   about hosts no rule of the bounds names, where it only narrows what the bounds allow.
//! - `network.max_body`: at most the bounds' (lowered to it when not asked for).
//! - `network.secrets`: only secrets the bounds name (the same variable, host and port); the
//!   caller gives their values. `network.upstream_ca`: only the bounds' file, which `admit` sets.
//! - `filesystem.ro`/`rw`: each host path at or under a host path of the bounds' binds, by whole
//!   components and without `.` or `..`; writable only under a writable one.
//!   `filesystem.scratch`: a fresh tmpfs, or a host directory at or under the bounds' scratch.
//!   `filesystem.keep_scratch` only where the bounds keep theirs. Every path the bounds protect
//!   stays protected (`filesystem.unprotect` cannot reopen it).
//! - `env.pass`: only names the bounds pass.
//! - `layers.allow_degraded`: only layers the bounds waive; `layers.allow_ptrace` and `tty` only
//!   where the bounds allow them.
//! - Free, because they reach nothing outside the sandbox: the command, `hostname`, `env.set`,
//!   `network.local_ports`.
//!
//! **What bounds do not do.** Host paths are compared as written. The backend resolves them
//! later and follows symbolic links on the way (`palisade_linux::plan::resolve_host`), so an
//! allowed prefix must not hold links that whoever writes requests can create or change — a
//! directory that a sandbox can write (a writable bind, a kept scratch) is such a place.

use crate::file::{fmt_ms, fmt_size};
use crate::http::HttpRule;
use crate::net::{overlaps, NetRule, Network, Pattern, DEFAULT_PORTS};
use crate::{layer, Bind, Degradable, EnvName, Limits, Policy, PolicyError, PolicyOverlay};
use serde::Serialize;
use std::fmt::Display;
use std::path::{Component, Path, PathBuf};
use thiserror::Error;

/// A host path under which binds may be made; writable ones may be bound writable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPrefix {
    pub path: PathBuf,
    pub writable: bool,
}

/// The most a policy may ask for (see the [module documentation](self) for what fits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// The largest value of each limit; `cpu_time_ms` is always set, and `cpu_milli` unset means
    /// no CPU quota is required.
    pub limits: Limits,
    /// Where a host scratch directory may be; `None`: only a fresh tmpfs.
    pub scratch: Option<PathBuf>,
    pub keep_scratch: bool,
    /// Where binds may come from.
    pub paths: Vec<HostPrefix>,
    /// Paths that stay protected whatever a policy unprotects.
    pub protected: Vec<String>,
    /// Names a policy may pass; the caller gives their values.
    pub env_pass: Vec<EnvName>,
    /// `allow`: the widest rules; `deny`: rules always in force; `resolve`: the only pins;
    /// `dns_server`: the only server. `local_ports` bound nothing.
    pub network: Network,
    pub allow_degraded: Vec<Degradable>,
    pub allow_ptrace: bool,
    pub tty: bool,
}

/// A policy value beyond its [`Bounds`]: the policy field (as a policy file names it), the value
/// asked and what the bounds allow there.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize)]
#[error("{field}: {asked} is beyond the bounds ({allowed})")]
pub struct BoundsError {
    pub field: &'static str,
    pub asked: String,
    pub allowed: String,
}

fn beyond(field: &'static str, asked: impl Display, allowed: impl Display) -> BoundsError {
    BoundsError {
        field,
        asked: asked.to_string(),
        allowed: allowed.to_string(),
    }
}

/// A limit's field, the value asked, the bound, and how to write them.
type LimitCheck = (&'static str, u64, u64, fn(u64) -> String);

/// `what` as a list for a message, or `none` with why.
fn one_of<T: Display>(prefix: &str, items: &[T], none: &str) -> String {
    if items.is_empty() {
        return format!("none: {none}");
    }
    let v: Vec<String> = items.iter().map(|x| x.to_string()).collect();
    format!("{prefix}{}", v.join(", "))
}

fn cpus(milli: u64) -> String {
    format!("{}", milli as f64 / 1000.0)
}

/// Whether `path` is `prefix` or under it by whole components; paths with `.` or `..` never are.
fn under(path: &Path, prefix: &Path) -> bool {
    let clean = |p: &Path| {
        p.is_absolute()
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    clean(path) && clean(prefix) && path.starts_with(prefix)
}

/// Whether every destination `a` matches, `b` matches too.
fn covers(b: &Pattern, a: &Pattern) -> bool {
    let below = |n: &str, d: &str| {
        n.strip_suffix(d)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    };
    match (a, b) {
        (Pattern::Exact(n), Pattern::Exact(m)) => n == m,
        (Pattern::Exact(n), Pattern::Subdomains(d)) => below(n, d),
        (Pattern::Subdomains(d1), Pattern::Subdomains(d2)) => d1 == d2 || below(d1, d2),
        (
            Pattern::Net {
                addr: a1,
                prefix: p1,
            },
            Pattern::Net {
                addr: a2,
                prefix: p2,
            },
        ) => a1.is_ipv4() == a2.is_ipv4() && p1 >= p2 && crate::net::mask(*a1, *p2) == *a2,
        _ => false,
    }
}

/// Whether the allow rule `r` opens nothing that `ceiling`'s allow rules do not.
fn rule_fits(r: &NetRule, ceiling: &[NetRule]) -> bool {
    let ports = r.port.map_or(DEFAULT_PORTS.to_vec(), |p| vec![p]);
    ports.iter().all(|&port| {
        ceiling
            .iter()
            .any(|c| c.allows_port(port) && covers(&c.pattern, &r.pattern))
    })
}

/// Whether every request HTTP rule `r` allows, `c` allows too.
fn http_covers(c: &HttpRule, r: &HttpRule) -> bool {
    let host = match (&c.host, &r.host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(r)) => {
            covers(&c.pattern, &r.pattern) && c.port.is_none_or(|p| r.port == Some(p))
        }
    };
    let methods = match (&c.methods, &r.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(r)) => r.iter().all(|m| c.contains(m)),
    };
    let (cp, rp) = (c.path.as_str(), r.path.as_str());
    let path = cp == rp
        || cp == "/**"
        || cp
            .strip_suffix("/**")
            .is_some_and(|base| rp == base || rp.starts_with(&cp[..cp.len() - 2]));
    host && methods && path
}

impl Bounds {
    /// Bounds whose values are exactly `p`'s: what `p` sets is the most a policy may ask for
    /// (its binds are the prefixes binds may come from, its scratch the one scratch may be
    /// under, its `env.pass` the names that may be passed, …).
    ///
    /// ```
    /// use palisade_policy::{Bounds, Policy};
    /// let mut server = Policy::new(["true"]).unwrap();
    /// server.limits.timeout_ms = 30_000;
    /// let b = Bounds::from_policy(&server);
    /// let mut asked = Policy::new(["sleep", "60"]).unwrap();
    /// asked.limits.timeout_ms = 60_000;
    /// let e = asked.check_within(&b).unwrap_err();
    /// assert_eq!((e.field, e.asked.as_str(), e.allowed.as_str()), ("limits.timeout", "1m", "at most 30s"));
    /// ```
    pub fn from_policy(p: &Policy) -> Bounds {
        Bounds {
            limits: p.limits.resolved(),
            scratch: p.scratch.host_path().map(|x| x.to_path_buf()),
            keep_scratch: p.keep_scratch,
            paths: p
                .binds
                .iter()
                .map(|b| HostPrefix {
                    path: b.source.clone(),
                    writable: b.writable,
                })
                .collect(),
            protected: p.protected.clone(),
            env_pass: p.env_pass.clone(),
            network: p.network.clone(),
            allow_degraded: p.allow_degraded.clone(),
            allow_ptrace: p.allow_ptrace,
            tty: p.tty,
        }
    }

    /// A request's policy: `base` (the caller's defaults and the request's command) lowered to
    /// these bounds, then `layers` in the documented precedence ([`layer`]: the request's
    /// overlay, or a policy file and options), the bounds' deny rules and DNS server where
    /// egress is on, validated ([`Policy::validate_values`]) and checked to fit. The names in
    /// `env.pass` are left for the caller to resolve, and are names the bounds pass.
    ///
    /// ```
    /// use palisade_policy::{Bounds, Policy, PolicyError, PolicyOverlay};
    /// let mut server = Policy::new(["true"]).unwrap();
    /// server.limits.timeout_ms = 30_000;
    /// let b = Bounds::from_policy(&server);
    /// // A request that asks nothing gets the default timeout lowered to the bounds'.
    /// let p = b.admit(Policy::new(["true"]).unwrap(), &[&PolicyOverlay::default()]).unwrap();
    /// assert_eq!(p.limits.timeout_ms, 30_000);
    /// // One that asks for more is refused, with the field and both values.
    /// let mut asked = PolicyOverlay::default();
    /// asked.limits.timeout_ms = Some(600_000);
    /// let e = b.admit(Policy::new(["true"]).unwrap(), &[&asked]).unwrap_err();
    /// assert_eq!(e.to_string(), "limits.timeout: 10m is beyond the bounds (at most 30s)");
    /// ```
    pub fn admit(
        &self,
        mut base: Policy,
        layers: &[&PolicyOverlay],
    ) -> Result<Policy, PolicyError> {
        base.clamp_to(self);
        layer(&mut base, layers)?;
        if base.network.enabled() {
            for d in &self.network.deny {
                if !base.network.deny.contains(d) {
                    base.network.deny.push(d.clone());
                }
            }
            if base.network.dns_server.is_none() {
                base.network.dns_server = self.network.dns_server;
            }
            let (n, c) = (&mut base.network, &self.network);
            if c.inspect_all {
                n.inspect_all = true;
                n.inspect.clear();
            } else if !n.inspect_all {
                for r in &c.inspect {
                    if !n.inspect.contains(r) {
                        n.inspect.push(r.clone());
                    }
                }
            }
            for r in &c.http {
                if !n.http.contains(r) {
                    n.http.push(r.clone());
                }
            }
            if n.upstream_ca.is_none() {
                n.upstream_ca.clone_from(&c.upstream_ca);
            }
            if n.max_body.is_none() {
                n.max_body = c.max_body;
            }
        }
        base.validate_values()?;
        base.check_within(self)?;
        Ok(base)
    }
}

impl Policy {
    /// Whether this policy fits `b`; the first field that does not is the error (see
    /// [`crate::bounds`] for what fits).
    pub fn check_within(&self, b: &Bounds) -> Result<(), BoundsError> {
        let (l, m) = (&self.limits, &b.limits);
        let count = |v: u64| v.to_string();
        let checks: [LimitCheck; 9] = [
            ("limits.timeout", l.timeout_ms, m.timeout_ms, fmt_ms),
            (
                "limits.cpu_time",
                l.cpu_time().as_millis() as u64,
                m.cpu_time().as_millis() as u64,
                fmt_ms,
            ),
            ("limits.memory", l.memory_bytes, m.memory_bytes, fmt_size),
            ("limits.pids", l.pids, m.pids, count),
            ("limits.open_files", l.open_files, m.open_files, count),
            (
                "limits.file_size",
                l.file_size_bytes,
                m.file_size_bytes,
                fmt_size,
            ),
            ("limits.output", l.output_bytes, m.output_bytes, fmt_size),
            ("limits.tmp_size", l.tmp_bytes, m.tmp_bytes, fmt_size),
            (
                "limits.scratch_size",
                l.scratch_bytes,
                m.scratch_bytes,
                fmt_size,
            ),
        ];
        for (field, asked, max, fmt) in checks {
            if asked > max {
                return Err(beyond(field, fmt(asked), format!("at most {}", fmt(max))));
            }
        }
        if let Some(max) = m.cpu_milli {
            match l.cpu_milli {
                None => {
                    return Err(beyond(
                        "limits.cpus",
                        "no quota",
                        format!("at most {}", cpus(max)),
                    ))
                }
                Some(c) if c > max => {
                    return Err(beyond(
                        "limits.cpus",
                        cpus(c),
                        format!("at most {}", cpus(max)),
                    ))
                }
                Some(_) => {}
            }
        }

        if let Some(path) = self.scratch.host_path() {
            let fits = b.scratch.as_deref().is_some_and(|pre| under(path, pre));
            if !fits {
                return Err(beyond(
                    self.scratch.field(),
                    path.display(),
                    match &b.scratch {
                        Some(pre) => format!(
                            "a host directory at or under {}, without `.` or `..`, or none (a fresh tmpfs)",
                            pre.display()
                        ),
                        None => "none: only a fresh tmpfs".to_owned(),
                    },
                ));
            }
        }
        if self.keep_scratch && !b.keep_scratch {
            return Err(beyond("filesystem.keep_scratch", true, false));
        }
        for bind in &self.binds {
            let fits = b
                .paths
                .iter()
                .any(|h| (h.writable || !bind.writable) && under(&bind.source, &h.path));
            if !fits {
                let allowed: Vec<String> = b
                    .paths
                    .iter()
                    .filter(|h| h.writable || !bind.writable)
                    .map(|h| h.path.display().to_string())
                    .collect();
                return Err(beyond(
                    Bind::field(bind.writable),
                    bind.source.display(),
                    one_of(
                        if bind.writable {
                            "host paths at or under a writable one of: "
                        } else {
                            "host paths at or under one of: "
                        },
                        &allowed,
                        if bind.writable {
                            "no host path may be bound writable"
                        } else {
                            "no host path may be bound"
                        },
                    ),
                ));
            }
        }
        if self.debug_unlandlocked_bind.is_some() {
            return Err(beyond(
                "debug_unlandlocked_bind",
                "(set)",
                "none: a test-only field",
            ));
        }
        if let Some(x) = missing(&b.protected, &self.protected).next() {
            return Err(beyond("filesystem.unprotect", x, "kept protected"));
        }
        if let Some(n) = self.env_pass.iter().find(|n| !b.env_pass.contains(n)) {
            return Err(beyond(
                "env.pass",
                n,
                one_of("one of: ", &b.env_pass, "no variable is passed by name"),
            ));
        }

        let (net, ceiling) = (&self.network, &b.network);
        if let Some(r) = net.allow.iter().find(|r| !rule_fits(r, &ceiling.allow)) {
            return Err(beyond(
                "network.allow",
                r,
                one_of("within: ", &ceiling.allow, "no egress"),
            ));
        }
        if net.enabled() {
            if let Some(d) = ceiling.deny.iter().find(|d| !net.deny.contains(d)) {
                return Err(beyond(
                    "network.deny",
                    format!("a list without {d}"),
                    format!("{d} stays denied"),
                ));
            }
        }
        if let Some(p) = net.resolve.iter().find(|p| !ceiling.resolve.contains(p)) {
            return Err(beyond(
                "network.resolve",
                p,
                one_of("one of: ", &ceiling.resolve, "no pins"),
            ));
        }
        let resolver = |a: Option<std::net::SocketAddr>| match a {
            Some(a) => a.to_string(),
            None => "the system resolver".to_owned(),
        };
        let dns_fits = match (net.dns_server, ceiling.dns_server) {
            (Some(a), c) => Some(a) == c,
            (None, c) => c.is_none() || !net.enabled(),
        };
        if !dns_fits {
            return Err(beyond(
                "network.dns_server",
                resolver(net.dns_server),
                format!("only {}", resolver(ceiling.dns_server)),
            ));
        }
        if net.enabled() {
            if ceiling.inspect_all && !net.inspect_all {
                return Err(beyond(
                    "network.inspect",
                    "not every host",
                    "true: every host stays inspected",
                ));
            }
            if let Some(r) = ceiling
                .inspect
                .iter()
                .find(|r| !net.inspect_all && !net.inspect.contains(r))
            {
                return Err(beyond(
                    "network.inspect",
                    format!("a list without {r}"),
                    format!("{r} stays inspected"),
                ));
            }
            if let Some(r) = ceiling.http.iter().find(|r| !net.http.contains(r)) {
                return Err(beyond(
                    "network.http",
                    format!("rules without `{r}`"),
                    format!("`{r}` stays in force"),
                ));
            }
        }
        if let Some(x) = net.no_inspect.iter().find(|x| {
            !ceiling.no_inspect.contains(x)
                && (ceiling.inspect_all
                    || ceiling.inspect.iter().any(|r| overlaps(Some(r), Some(x))))
        }) {
            return Err(beyond(
                "network.no_inspect",
                x,
                one_of(
                    "one of: ",
                    &ceiling.no_inspect,
                    "the hosts the bounds inspect stay inspected",
                ),
            ));
        }
        if let Some(r) = net.http.iter().find(|r| {
            !ceiling.http.iter().any(|c| http_covers(c, r))
                && ceiling
                    .http
                    .iter()
                    .any(|c| overlaps(c.host.as_ref(), r.host.as_ref()))
        }) {
            let shown: Vec<String> = ceiling.http.iter().map(|c| format!("`{c}`")).collect();
            return Err(beyond(
                "network.http",
                format!("`{r}`"),
                format!("within one of: {}", shown.join(", ")),
            ));
        }
        if let Some(max) = ceiling.max_body {
            match net.max_body {
                Some(b) if b <= max => {}
                b => {
                    return Err(beyond(
                        "network.max_body",
                        b.map_or("no cap".to_owned(), fmt_size),
                        format!("at most {}", fmt_size(max)),
                    ))
                }
            }
        }
        if let Some(s) = net.secrets.iter().find(|s| {
            !ceiling
                .secrets
                .iter()
                .any(|c| c.name == s.name && c.host == s.host && c.port == s.port)
        }) {
            let named: Vec<String> = ceiling
                .secrets
                .iter()
                .map(|c| format!("{}@{}:{}", c.name, c.host, c.port))
                .collect();
            return Err(beyond(
                "network.secrets",
                format!("{}@{}:{}", s.name, s.host, s.port),
                one_of("one of: ", &named, "no secrets"),
            ));
        }
        let ca_fits = match (&net.upstream_ca, &ceiling.upstream_ca) {
            (Some(a), c) => Some(a) == c.as_ref(),
            (None, c) => c.is_none() || !net.enabled(),
        };
        if !ca_fits {
            let shown = |c: &Option<std::path::PathBuf>| match c {
                Some(p) => p.display().to_string(),
                None => "the host's trust store".to_owned(),
            };
            return Err(beyond(
                "network.upstream_ca",
                shown(&net.upstream_ca),
                format!("only {}", shown(&ceiling.upstream_ca)),
            ));
        }

        if let Some(d) = self
            .allow_degraded
            .iter()
            .find(|d| !b.allow_degraded.contains(d))
        {
            let waived: Vec<&str> = b.allow_degraded.iter().map(|d| d.name()).collect();
            return Err(beyond(
                "layers.allow_degraded",
                d.name(),
                one_of("one of: ", &waived, "every layer is required"),
            ));
        }
        if self.allow_ptrace && !b.allow_ptrace {
            return Err(beyond("layers.allow_ptrace", true, false));
        }
        if self.tty && !b.tty {
            return Err(beyond("tty", true, false));
        }
        Ok(())
    }

    /// Lowers what does not fit `b` and can be lowered: each limit to the bounds' (a CPU quota
    /// added where the bounds have one), `keep_scratch`, `allow_ptrace`, `tty` and waived
    /// layers the bounds do not allow, the bounds' protected paths protected. For the values a
    /// request did not ask for, before its overlay is applied ([`Bounds::admit`]); lists it
    /// cannot shorten (binds, allow rules, names) are left for [`Policy::check_within`].
    pub fn clamp_to(&mut self, b: &Bounds) {
        let (l, m) = (&mut self.limits, &b.limits);
        for (v, max) in [
            (&mut l.timeout_ms, m.timeout_ms),
            (&mut l.memory_bytes, m.memory_bytes),
            (&mut l.pids, m.pids),
            (&mut l.open_files, m.open_files),
            (&mut l.file_size_bytes, m.file_size_bytes),
            (&mut l.output_bytes, m.output_bytes),
            (&mut l.tmp_bytes, m.tmp_bytes),
            (&mut l.scratch_bytes, m.scratch_bytes),
        ] {
            *v = (*v).min(max);
        }
        let cpu_max = m.cpu_time().as_millis() as u64;
        if l.cpu_time().as_millis() as u64 > cpu_max {
            l.cpu_time_ms = Some(cpu_max);
        }
        if let Some(max) = m.cpu_milli {
            l.cpu_milli = Some(l.cpu_milli.unwrap_or(max).min(max));
        }
        if let (Some(max), Some(v)) = (b.network.max_body, self.network.max_body) {
            self.network.max_body = Some(v.min(max));
        }
        self.keep_scratch &= b.keep_scratch;
        self.allow_ptrace &= b.allow_ptrace;
        self.tty &= b.tty;
        self.allow_degraded.retain(|d| b.allow_degraded.contains(d));
        let mut add: Vec<String> = Vec::new();
        for x in missing(&b.protected, &self.protected) {
            // Once, even where bounds built by hand list a path twice.
            if !add.contains(x) {
                add.push(x.clone());
            }
        }
        self.protected.extend(add);
    }
}

/// The paths of `want` that `have` does not list. Both usually start with the same ~60 default
/// paths, in the same order, and a server checks every request against its ceiling: the common
/// start is passed over pairwise; only the rest is looked for in all of `have`.
fn missing<'a>(want: &'a [String], have: &'a [String]) -> impl Iterator<Item = &'a String> {
    let same = want.iter().zip(have).take_while(|(w, h)| w == h).count();
    want[same..].iter().filter(move |w| !have.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Pin;
    use crate::protect::ProtectedPath;
    use crate::{EnvVar, LimitsOverlay, Scratch};

    #[test]
    fn clamping_adds_each_protected_path_of_the_bounds_once() {
        let mut p = Policy::new(["true"]).unwrap();
        let mut b = Bounds::from_policy(&p);
        p.protected.retain(|x| x != ".git/hooks");
        b.protected.push(".git/hooks".into());
        b.protected.push("Makefile".into());
        b.protected.push("Makefile".into());
        p.clamp_to(&b);
        for x in [".git/hooks", "Makefile"] {
            assert_eq!(p.protected.iter().filter(|y| *y == x).count(), 1, "{x}");
        }
        p.validate().unwrap();
    }

    #[test]
    fn missing_paths_are_found_past_a_common_start_and_anywhere_else() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let got = |w: &[&str], h: &[&str]| {
            let (w, h) = (v(w), v(h));
            missing(&w, &h).cloned().collect::<Vec<_>>()
        };
        assert!(got(&["a", "b", "c"], &["a", "b", "c", "d"]).is_empty());
        assert!(got(&["a", "b", "c"], &["c", "a", "b"]).is_empty());
        assert_eq!(got(&["a", "b", "c"], &["a", "c"]), ["b"]);
        assert_eq!(got(&["a", "b", "c"], &["a", "b"]), ["c"]);
        assert_eq!(got(&["a", "b", "c"], &[]), ["a", "b", "c"]);
        assert_eq!(got(&["a", "x", "c"], &["a", "b", "c"]), ["x"]);
    }

    fn rule(s: &str) -> NetRule {
        NetRule::parse("t", s).unwrap()
    }

    /// A ceiling with a little of everything.
    fn ceiling() -> Bounds {
        let mut p = Policy::new(["true"]).unwrap();
        p.limits = Limits {
            timeout_ms: 30_000,
            cpu_time_ms: Some(20_000),
            output_bytes: 1 << 20,
            pids: 64,
            open_files: 256,
            file_size_bytes: 8 << 20,
            memory_bytes: 512 << 20,
            cpu_milli: Some(1500),
            tmp_bytes: 64 << 20,
            scratch_bytes: 128 << 20,
        };
        p.scratch = Scratch::Host {
            path: "/srv/work".into(),
        };
        p.binds = vec![
            Bind::parse("/srv/data:/data", false).unwrap(),
            Bind::parse("/srv/out:/out", true).unwrap(),
        ];
        p.env_pass = vec![EnvName::new("HF_TOKEN").unwrap()];
        p.network.allow = vec![
            rule("*.example.com"),
            rule("pypi.org:443"),
            rule("api.test:8080"),
            rule("10.1.0.0/16:443"),
            rule("[2001:db8::/48]"),
        ];
        p.network.deny = vec![rule("bad.example.com")];
        p.network.resolve = vec![Pin::parse("api.test=10.1.2.3").unwrap()];
        p.network.dns_server = Some("10.1.0.53:53".parse().unwrap());
        p.allow_degraded = vec![Degradable::Cgroup];
        Bounds::from_policy(&p)
    }

    /// A policy with everything at the ceiling's value: it fits.
    fn at_ceiling() -> Policy {
        let mut p = Policy::new(["true"]).unwrap();
        p.limits = ceiling().limits;
        p.scratch = Scratch::Host {
            path: "/srv/work".into(),
        };
        p.binds = vec![
            Bind::parse("/srv/data", false).unwrap(),
            Bind::parse("/srv/out:/elsewhere", true).unwrap(),
        ];
        p.env_pass = vec![EnvName::new("HF_TOKEN").unwrap()];
        p.network = ceiling().network;
        p.allow_degraded = vec![Degradable::Cgroup];
        p
    }

    #[test]
    fn equal_and_below_fit() {
        let b = ceiling();
        at_ceiling().check_within(&b).unwrap();
        // Less of everything: the defaults' lists, smaller limits.
        let mut p = Policy::new(["true"]).unwrap();
        p.limits = Limits {
            timeout_ms: 1,
            cpu_time_ms: Some(1),
            output_bytes: 1,
            pids: 1,
            open_files: 1,
            file_size_bytes: 1,
            memory_bytes: 1 << 20,
            cpu_milli: Some(10),
            tmp_bytes: 1 << 20,
            scratch_bytes: 1 << 20,
        };
        p.check_within(&b).unwrap();
        // Under the prefixes, narrower rules, the free fields.
        p.scratch = Scratch::Host {
            path: "/srv/work/job-1".into(),
        };
        p.binds = vec![
            Bind::parse("/srv/data/x/y:/y", false).unwrap(),
            Bind::parse("/srv/out/run", false).unwrap(),
            Bind::parse("/srv/out/w:/w", true).unwrap(),
        ];
        p.network.allow = vec![
            rule("a.example.com:443"),
            rule("*.b.example.com"),
            rule("pypi.org:443"),
            rule("10.1.2.0/24:443"),
            rule("[2001:db8::5]:443"),
        ];
        p.network.deny = vec![rule("bad.example.com"), rule("worse.example.com")];
        p.network.dns_server = b.network.dns_server;
        p.network.local_ports = vec![8000];
        p.hostname = "anything".into();
        p.env.push(EnvVar::new("LD_PRELOAD", "/x.so").unwrap());
        p.protected.push("Makefile".into());
        p.check_within(&b).unwrap();
    }

    /// Each field above the ceiling: the error names the field, the value asked, and what the
    /// ceiling allows.
    #[test]
    fn each_field_above_the_ceiling_is_named_with_both_values() {
        let b = ceiling();
        type Edit = Box<dyn Fn(&mut Policy)>;
        let cases: Vec<(Edit, &str, &str, &str)> = vec![
            (Box::new(|p| p.limits.timeout_ms = 30_001), "limits.timeout", "30001ms", "at most 30s"),
            (Box::new(|p| p.limits.cpu_time_ms = Some(21_000)), "limits.cpu_time", "21s", "at most 20s"),
            // An unset CPU time is the timeout.
            (Box::new(|p| p.limits.cpu_time_ms = None), "limits.cpu_time", "30s", "at most 20s"),
            (Box::new(|p| p.limits.memory_bytes = 1 << 30), "limits.memory", "1GiB", "at most 512MiB"),
            (Box::new(|p| p.limits.pids = 65), "limits.pids", "65", "at most 64"),
            (Box::new(|p| p.limits.open_files = 1024), "limits.open_files", "1024", "at most 256"),
            (Box::new(|p| p.limits.file_size_bytes = (8 << 20) + 1), "limits.file_size", "8388609B", "at most 8MiB"),
            (Box::new(|p| p.limits.output_bytes = 2 << 20), "limits.output", "2MiB", "at most 1MiB"),
            (Box::new(|p| p.limits.tmp_bytes = 65 << 20), "limits.tmp_size", "65MiB", "at most 64MiB"),
            (Box::new(|p| p.limits.scratch_bytes = 1 << 30), "limits.scratch_size", "1GiB", "at most 128MiB"),
            (Box::new(|p| p.limits.cpu_milli = Some(2000)), "limits.cpus", "2", "at most 1.5"),
            (Box::new(|p| p.limits.cpu_milli = None), "limits.cpus", "no quota", "at most 1.5"),
            (Box::new(|p| p.scratch = Scratch::Host { path: "/srv/workshop".into() }), "filesystem.scratch", "/srv/workshop", "a host directory at or under /srv/work, without `.` or `..`, or none (a fresh tmpfs)"),
            (Box::new(|p| p.scratch = Scratch::Host { path: "/srv/work/../../etc".into() }), "filesystem.scratch", "/srv/work/../../etc", "a host directory at or under /srv/work, without `.` or `..`, or none (a fresh tmpfs)"),
            (Box::new(|p| p.keep_scratch = true), "filesystem.keep_scratch", "true", "false"),
            (Box::new(|p| p.binds.push(Bind::parse("/etc", false).unwrap())), "filesystem.ro", "/etc", "host paths at or under one of: /srv/data, /srv/out"),
            (Box::new(|p| p.binds.push(Bind::parse("/srv/database:/db", false).unwrap())), "filesystem.ro", "/srv/database", "host paths at or under one of: /srv/data, /srv/out"),
            (Box::new(|p| p.binds.push(Bind::parse("/srv/data/../../etc:/e", false).unwrap())), "filesystem.ro", "/srv/data/../../etc", "host paths at or under one of: /srv/data, /srv/out"),
            (Box::new(|p| p.binds.push(Bind::parse("/srv/data/x:/x", true).unwrap())), "filesystem.rw", "/srv/data/x", "host paths at or under a writable one of: /srv/out"),
            (Box::new(|p| p.debug_unlandlocked_bind = Some(Bind::parse("/srv/out", true).unwrap())), "debug_unlandlocked_bind", "(set)", "none: a test-only field"),
            (Box::new(|p| p.protected.retain(|x| x != ".git/hooks")), "filesystem.unprotect", ".git/hooks", "kept protected"),
            (Box::new(|p| p.env_pass.push(EnvName::new("AWS_SECRET_ACCESS_KEY").unwrap())), "env.pass", "AWS_SECRET_ACCESS_KEY", "one of: HF_TOKEN"),
            (Box::new(|p| p.network.allow.push(rule("evil.org"))), "network.allow", "evil.org", "within: *.example.com, pypi.org:443, api.test:8080, 10.1.0.0/16:443, [2001:db8::/48]"),
            (Box::new(|p| p.network.deny.clear()), "network.deny", "a list without bad.example.com", "bad.example.com stays denied"),
            (Box::new(|p| p.network.resolve.push(Pin::parse("pypi.org=203.0.113.9").unwrap())), "network.resolve", "pypi.org=203.0.113.9", "one of: api.test=10.1.2.3"),
            (Box::new(|p| p.network.dns_server = Some("8.8.8.8:53".parse().unwrap())), "network.dns_server", "8.8.8.8:53", "only 10.1.0.53:53"),
            (Box::new(|p| p.network.dns_server = None), "network.dns_server", "the system resolver", "only 10.1.0.53:53"),
            (Box::new(|p| p.allow_degraded.push(Degradable::Landlock)), "layers.allow_degraded", "landlock", "one of: cgroup"),
            (Box::new(|p| p.allow_ptrace = true), "layers.allow_ptrace", "true", "false"),
            (Box::new(|p| p.tty = true), "tty", "true", "false"),
        ];
        for (edit, field, asked, allowed) in cases {
            let mut p = at_ceiling();
            edit(&mut p);
            let e = p.check_within(&b).unwrap_err();
            assert_eq!(
                (e.field, e.asked.as_str(), e.allowed.as_str()),
                (field, asked, allowed),
                "{field}"
            );
            assert_eq!(
                e.to_string(),
                format!("{field}: {asked} is beyond the bounds ({allowed})")
            );
        }
        // A ceiling without any: none is the answer.
        let b = Bounds::from_policy(&Policy::new(["true"]).unwrap());
        for (edit, field, allowed) in [
            (
                Box::new(|p: &mut Policy| p.network.allow.push(rule("a.example.com"))) as Edit,
                "network.allow",
                "none: no egress",
            ),
            (
                Box::new(|p| p.env_pass.push(EnvName::new("HOME").unwrap())),
                "env.pass",
                "none: no variable is passed by name",
            ),
            (
                Box::new(|p| p.binds.push(Bind::parse("/srv", false).unwrap())),
                "filesystem.ro",
                "none: no host path may be bound",
            ),
            (
                Box::new(|p| p.binds.push(Bind::parse("/srv", true).unwrap())),
                "filesystem.rw",
                "none: no host path may be bound writable",
            ),
            (
                Box::new(|p| {
                    p.scratch = Scratch::Host {
                        path: "/srv".into(),
                    }
                }),
                "filesystem.scratch",
                "none: only a fresh tmpfs",
            ),
            (
                Box::new(|p| p.allow_degraded.push(Degradable::Cgroup)),
                "layers.allow_degraded",
                "none: every layer is required",
            ),
            (
                Box::new(|p| {
                    p.network
                        .resolve
                        .push(Pin::parse("a.org=192.0.2.1").unwrap())
                }),
                "network.resolve",
                "none: no pins",
            ),
        ] {
            let mut p = Policy::new(["true"]).unwrap();
            edit(&mut p);
            let e = p.check_within(&b).unwrap_err();
            assert_eq!((e.field, e.allowed.as_str()), (field, allowed));
        }
    }

    /// Which allow rules fit which: names, wildcards, addresses and ports.
    /// Inspection, HTTP rules, the body cap, secrets and the upstream CA: a request cannot turn
    /// inspection off, widen the rules, raise the cap, or name a secret the bounds do not.
    #[test]
    fn egress_beyond_names_stays_within_the_ceiling() {
        use crate::http::{HttpRule, Secret};
        fn http(s: &str) -> HttpRule {
            HttpRule::parse("t", s).unwrap()
        }
        let mut server = Policy::new(["true"]).unwrap();
        server.network.allow = vec![rule("*.example.com"), rule("pypi.org")];
        server.network.inspect = vec![rule("pypi.org"), rule("files.example.com")];
        server.network.no_inspect = vec![rule("pinned.example.com")];
        server.network.http = vec![
            http("read-only pypi.org"),
            http("GET,POST api.example.com/v1/**"),
        ];
        server.network.max_body = Some(1 << 20);
        server.network.secrets = vec![Secret::parse("t", "TOKEN@api.example.com").unwrap()];
        server.network.upstream_ca = Some("/etc/corp-ca.pem".into());
        let b = Bounds::from_policy(&server);
        // A request that asks for egress gets the ceiling's inspection, rules, cap and CA.
        let asked = PolicyOverlay {
            allow_net: vec![rule("api.example.com")],
            ..PolicyOverlay::default()
        };
        let p = b.admit(Policy::new(["true"]).unwrap(), &[&asked]).unwrap();
        assert_eq!(p.network.inspect, server.network.inspect);
        assert_eq!(p.network.http, server.network.http);
        assert_eq!(p.network.max_body, Some(1 << 20));
        assert_eq!(p.network.upstream_ca, server.network.upstream_ca);
        // Narrower rules, a smaller cap, the named secret, exemptions of hosts not inspected.
        let fits = PolicyOverlay {
            allow_net: vec![rule("api.example.com")],
            http: vec![
                http("GET api.example.com/v1/items/**"),
                http("read-only docs.example.com/**"),
            ],
            no_inspect: vec![rule("pinned.example.com"), rule("www.example.com")],
            max_body: Some(1024),
            secrets: server.network.secrets.clone(),
            ..PolicyOverlay::default()
        };
        let p = b.admit(Policy::new(["true"]).unwrap(), &[&fits]).unwrap();
        assert_eq!(p.network.max_body, Some(1024));
        type Edit = Box<dyn Fn(&mut PolicyOverlay)>;
        let cases: Vec<(Edit, &str, &str, &str)> = vec![
            (
                Box::new(|o| o.http.push(http("POST pypi.org/upload"))),
                "network.http",
                "`POST pypi.org/upload`",
                "within one of: `GET,HEAD,OPTIONS pypi.org`, `GET,POST api.example.com/v1/**`",
            ),
            (
                Box::new(|o| o.http.push(http("GET api.example.com/v2/**"))),
                "network.http",
                "`GET api.example.com/v2/**`",
                "within one of: `GET,HEAD,OPTIONS pypi.org`, `GET,POST api.example.com/v1/**`",
            ),
            (
                Box::new(|o| o.http.push(http("* *"))),
                "network.http",
                "`* *`",
                "within one of: `GET,HEAD,OPTIONS pypi.org`, `GET,POST api.example.com/v1/**`",
            ),
            (
                Box::new(|o| o.no_inspect.push(rule("files.example.com"))),
                "network.no_inspect",
                "files.example.com",
                "one of: pinned.example.com",
            ),
            (
                Box::new(|o| o.max_body = Some(2 << 20)),
                "network.max_body",
                "2MiB",
                "at most 1MiB",
            ),
            (
                Box::new(|o| {
                    o.secrets
                        .push(Secret::parse("t", "OTHER@api.example.com").unwrap())
                }),
                "network.secrets",
                "OTHER@api.example.com:443",
                "one of: TOKEN@api.example.com:443",
            ),
            (
                Box::new(|o| {
                    o.allow_net.push(rule("www.example.com"));
                    o.secrets = vec![Secret::parse("t", "TOKEN@www.example.com").unwrap()]
                }),
                "network.secrets",
                "TOKEN@www.example.com:443",
                "one of: TOKEN@api.example.com:443",
            ),
            (
                Box::new(|o| o.upstream_ca = Some("/tmp/mine.pem".into())),
                "network.upstream_ca",
                "/tmp/mine.pem",
                "only /etc/corp-ca.pem",
            ),
        ];
        for (edit, field, asked, allowed) in cases {
            let mut o = PolicyOverlay {
                allow_net: vec![rule("api.example.com")],
                ..PolicyOverlay::default()
            };
            edit(&mut o);
            let e = b.admit(Policy::new(["true"]).unwrap(), &[&o]).unwrap_err();
            let PolicyError::Bounds(e) = e else {
                panic!("{field}: not a bounds error: {e}")
            };
            assert_eq!(
                (e.field, e.asked.as_str(), e.allowed.as_str()),
                (field, asked, allowed)
            );
        }
        // A policy checked without `admit` must carry what the ceiling inspects and its rules.
        let mut p = Policy::new(["true"]).unwrap();
        p.network.allow = vec![rule("pypi.org")];
        p.network.upstream_ca = server.network.upstream_ca.clone();
        p.network.max_body = Some(1);
        let e = p.check_within(&b).unwrap_err();
        assert_eq!(
            (e.field, e.asked.as_str()),
            ("network.inspect", "a list without pypi.org")
        );
        p.network.inspect = server.network.inspect.clone();
        let e = p.check_within(&b).unwrap_err();
        assert_eq!(e.field, "network.http");
        p.network.http = server.network.http.clone();
        p.check_within(&b).unwrap();
        // Inspecting every host is required where the ceiling does.
        let mut all = server.clone();
        all.network.inspect_all = true;
        all.network.inspect.clear();
        let e = b.admit(Policy::new(["true"]).unwrap(), &[&asked]);
        assert!(e.is_ok());
        let ball = Bounds::from_policy(&all);
        let p = ball
            .admit(Policy::new(["true"]).unwrap(), &[&asked])
            .unwrap();
        assert!(p.network.inspect_all);
        let mut q = p.clone();
        q.network.inspect_all = false;
        assert_eq!(q.check_within(&ball).unwrap_err().field, "network.inspect");
    }

    #[test]
    fn allow_rules_fit_only_within_wider_ones() {
        let fits = |asked: &str, ceiling: &[&str]| {
            let c: Vec<NetRule> = ceiling.iter().map(|s| rule(s)).collect();
            rule_fits(&rule(asked), &c)
        };
        let yes = [
            ("api.example.com", &["*.example.com"][..]),
            ("a.b.example.com:443", &["*.example.com"]),
            ("api.example.com", &["api.example.com"]),
            ("*.example.com", &["*.example.com"]),
            ("*.a.example.com", &["*.example.com"]),
            // Ports: none given is 80 and 443, which two rules may cover together.
            ("pypi.org", &["pypi.org:80", "pypi.org:443"]),
            ("pypi.org:80", &["pypi.org"]),
            ("pypi.org:8443", &["pypi.org:8443"]),
            ("10.1.2.3", &["10.1.0.0/16"]),
            ("10.1.2.0/24:443", &["10.1.0.0/16"]),
            ("10.1.0.0/16", &["10.1.0.0/16"]),
            ("[2001:db8::1]", &["[2001:db8::/32]"]),
        ];
        for (asked, ceiling) in yes {
            assert!(fits(asked, ceiling), "{asked} within {ceiling:?}");
        }
        let no = [
            // A wildcard covers subdomains only, not the name itself.
            ("example.com", &["*.example.com"][..]),
            // A look-alike is not a subdomain.
            ("evilexample.com", &["*.example.com"]),
            ("api.example.com.evil.org", &["*.example.com"]),
            // A wildcard never fits an exact name, nor a narrower wildcard.
            ("*.example.com", &["api.example.com"]),
            ("*.example.com", &["*.a.example.com"]),
            ("*.com.example", &["*.example.com"]),
            // Ports beyond the ceiling's.
            ("pypi.org", &["pypi.org:443"]),
            ("pypi.org:8443", &["pypi.org"]),
            ("api.example.com:22", &["*.example.com"]),
            // Addresses: wider, elsewhere, another family, or a name for them.
            ("10.0.0.0/8", &["10.1.0.0/16"]),
            ("10.2.0.1", &["10.1.0.0/16"]),
            ("[::ffff:10.1.0.1]", &["10.1.0.0/16"]),
            ("10.1.0.1", &["[2001:db8::/32]"]),
            ("10.1.0.1", &["*.example.com"]),
            ("internal.example.com", &["10.1.0.0/16"]),
        ];
        for (asked, ceiling) in no {
            assert!(!fits(asked, ceiling), "{asked} not within {ceiling:?}");
        }
    }

    /// A request asks nothing: the defaults are lowered to the ceiling, not refused. A request
    /// asks too much: refused, not lowered.
    #[test]
    fn admit_lowers_the_defaults_and_refuses_what_was_asked() {
        let b = ceiling();
        let nothing = PolicyOverlay::default();
        let base = || {
            let mut p = Policy::new(["python3", "job.py"]).unwrap();
            // What a caller may have turned on by default: lowered too.
            p.keep_scratch = true;
            p.tty = true;
            p.allow_ptrace = true;
            p.allow_degraded = vec![Degradable::Landlock, Degradable::Cgroup];
            p
        };
        let p = b.admit(base(), &[&nothing]).unwrap();
        let mut want = Policy::new(["python3", "job.py"]).unwrap();
        want.limits = Limits {
            timeout_ms: 30_000,
            cpu_time_ms: Some(20_000),
            output_bytes: 1 << 20,
            pids: 64,
            open_files: 256,
            file_size_bytes: 8 << 20,
            memory_bytes: 512 << 20,
            cpu_milli: Some(1500),
            tmp_bytes: 64 << 20,
            scratch_bytes: 128 << 20,
        };
        want.allow_degraded = vec![Degradable::Cgroup];
        assert_eq!(p, want);

        // With egress on, the ceiling's deny rules and DNS server come with it.
        let mut asked = PolicyOverlay {
            allow_net: vec![rule("api.example.com")],
            env_pass: vec![EnvName::new("HF_TOKEN").unwrap()],
            binds: vec![Bind::parse("/srv/out/7:/out", true).unwrap()],
            ..PolicyOverlay::default()
        };
        asked.limits.memory_bytes = Some(256 << 20);
        let p = b.admit(base(), &[&asked]).unwrap();
        assert_eq!(p.network.allow, [rule("api.example.com")]);
        assert_eq!(p.network.deny, [rule("bad.example.com")]);
        assert_eq!(p.network.dns_server, b.network.dns_server);
        assert_eq!(p.limits.memory_bytes, 256 << 20);
        // The name is left for the caller to resolve: the policy is not runnable before.
        assert_eq!(p.env_pass, [EnvName::new("HF_TOKEN").unwrap()]);
        assert!(p.validate().is_err());

        // Asked, and beyond: refused with the field, whatever the defaults were.
        for (o, field) in [
            (
                PolicyOverlay {
                    limits: LimitsOverlay {
                        memory_bytes: Some(1 << 30),
                        ..LimitsOverlay::default()
                    },
                    ..PolicyOverlay::default()
                },
                "limits.memory",
            ),
            (
                PolicyOverlay {
                    tty: Some(true),
                    ..PolicyOverlay::default()
                },
                "tty",
            ),
            (
                PolicyOverlay {
                    unprotect: vec![ProtectedPath::new(".envrc").unwrap()],
                    ..PolicyOverlay::default()
                },
                "filesystem.unprotect",
            ),
            (
                PolicyOverlay {
                    profiles: vec!["build".into()],
                    ..PolicyOverlay::default()
                },
                "limits.timeout",
            ),
            (
                PolicyOverlay {
                    env_pass: vec![EnvName::new("PATH").unwrap()],
                    ..PolicyOverlay::default()
                },
                "env.pass",
            ),
            (
                PolicyOverlay {
                    scratch: Some("/home/me".into()),
                    ..PolicyOverlay::default()
                },
                "filesystem.scratch",
            ),
        ] {
            let e = b.admit(base(), &[&o]).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(matches!(e, PolicyError::Bounds(_)), "{e}");
        }
        // Invalid values are still invalid, before any bound.
        let o = PolicyOverlay {
            hostname: Some("bad host".into()),
            ..PolicyOverlay::default()
        };
        assert_eq!(
            b.admit(base(), &[&o]).unwrap_err().field(),
            Some("hostname")
        );
    }

    /// A policy file is its own ceiling; `[bounds]` widens it, values replacing and lists adding.
    #[test]
    fn a_file_and_its_bounds_table_give_the_ceiling() {
        let f = crate::file::PolicyFile::parse(
            "server.toml",
            r#"
[filesystem]
ro = ["/srv/data"]
[env]
pass = ["HF_TOKEN"]
[network]
allow = ["pypi.org:443"]
[limits]
timeout = "30s"
memory = "256MiB"
[bounds]
profiles = ["npm"]
[bounds.filesystem]
rw = ["/srv/out"]
[bounds.env]
pass = ["OTHER"]
[bounds.network]
allow = ["*.example.com"]
[bounds.limits]
timeout = "5m"
[bounds.layers]
allow_ptrace = true
"#,
        )
        .unwrap();
        let b = f.ceiling().unwrap();
        let mut base = Policy::new(["true"]).unwrap();
        base.binds = vec![Bind::parse("/srv/data", false).unwrap()];
        base.env_pass = vec![EnvName::new("HF_TOKEN").unwrap()];
        base.network.allow = vec![rule("pypi.org:443")];
        base.limits.timeout_ms = 30_000;
        base.limits.memory_bytes = 256 << 20;
        let mut want = Bounds::from_policy(&base);
        want.limits.timeout_ms = 300_000;
        want.limits.cpu_time_ms = Some(300_000);
        want.paths.push(HostPrefix {
            path: "/srv/out".into(),
            writable: true,
        });
        want.env_pass.push(EnvName::new("OTHER").unwrap());
        // The profiles of the file and of [bounds] first, then their fields.
        want.network.allow = vec![
            rule("registry.npmjs.org:443"),
            rule("pypi.org:443"),
            rule("*.example.com"),
        ];
        // The npm profile inspects.
        want.network.inspect_all = true;
        want.allow_ptrace = true;
        assert_eq!(b, want);
        // Without [bounds], exactly the file's values.
        let f = crate::file::PolicyFile::parse("s.toml", "[limits]\ntimeout = \"30s\"\n").unwrap();
        let mut p = Policy::new(["true"]).unwrap();
        p.limits.timeout_ms = 30_000;
        assert_eq!(f.ceiling().unwrap(), Bounds::from_policy(&p));
    }
}
