//! The server's policy as a ceiling: what every request starts from and may only narrow.
//!
//! The server reads one policy file (the same schema as `palisade run --policy`). Its values are
//! each request's defaults; its `[bounds]` table, or without one the values themselves, are the
//! ceiling, as the policy crate's [`Bounds`]. A request may ask for any limit up to the bounds and
//! name allow rules the bounds' rules cover (a request that names none has no network); the
//! file's binds, environment and other settings apply to every run and a request cannot change
//! them. A request never names a host path and never reads the server's environment: the
//! request types have no field for either, but one: a session's `workspace`, admitted only at or
//! under the roots the operator gave (`--workspace-root`, [`Ceiling::with_workspaces`]; none by
//! default, and then every workspace is refused), as [`crate::workspace`] says. Every policy built for a request is checked whole
//! with [`Policy::check_within`] before it runs, whatever the per-field checks here said.

use crate::api;
use crate::error::ServiceError;
use palisade::policy::net::NetRule;
use palisade::policy::{Bounds, EnvVar, Limits, Policy, Scratch};
use std::collections::BTreeMap;

/// The server's policy, checked for use as a ceiling.
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// The defaults (lowered to the bounds).
    policy: Policy,
    bounds: Bounds,
    /// Where clients may open workspaces; `None`: nowhere.
    workspaces: Option<crate::Workspaces>,
}

impl Ceiling {
    /// Takes the server's effective policy (its command is ignored). Refuses what a shared server
    /// must not have: a host scratch directory (every run would share it) or anything at the
    /// agent's path inside.
    pub fn new(policy: Policy) -> Result<Ceiling, String> {
        let bounds = Bounds::from_policy(&policy);
        Ceiling::with_bounds(policy, bounds)
    }

    /// The server's defaults under separate bounds (a policy file's `[bounds]` table): the
    /// defaults are lowered to the bounds where they exceed them.
    pub fn with_bounds(mut policy: Policy, bounds: Bounds) -> Result<Ceiling, String> {
        policy.clamp_to(&bounds);
        if let Scratch::Workspace { path } = &policy.scratch {
            return Err(format!(
                "filesystem.workspace `{}`: a server's sessions each open the workspace their client names; let them name directories under it with `palisade serve --workspace-root DIR`",
                path.display()
            ));
        }
        if let Scratch::Host { path } = &policy.scratch {
            return Err(format!(
                "filesystem.scratch `{}`: a server's runs each get a fresh scratch; a host directory would be shared by all of them",
                path.display()
            ));
        }
        if let Some(b) = policy
            .binds
            .iter()
            .find(|b| b.target.starts_with("/.palisade"))
        {
            return Err(format!(
                "bind target `{}`: /.palisade is where the server puts its agent inside",
                b.target
            ));
        }
        if policy.tty {
            return Err("tty: a server's runs have no terminal".into());
        }
        if policy.keep_scratch {
            return Err("filesystem.keep_scratch: a server's runs each get a fresh scratch that goes with them".into());
        }
        if bounds.scratch.is_some() || bounds.keep_scratch {
            return Err("bounds.filesystem.scratch: a request never names a host directory".into());
        }
        Ok(Ceiling {
            policy,
            bounds,
            workspaces: None,
        })
    }

    /// Lets sessions open workspaces under `w`'s roots.
    pub fn with_workspaces(mut self, w: crate::Workspaces) -> Ceiling {
        self.workspaces = Some(w);
        self
    }

    /// Where clients may open workspaces, if anywhere.
    pub fn workspaces(&self) -> Option<&crate::Workspaces> {
        self.workspaces.as_ref()
    }

    /// The workspace a request names (`field`), checked: under one of the roots, a real directory.
    pub(crate) fn workspace(
        &self,
        ask: &str,
        field: &str,
    ) -> Result<crate::workspace::Admitted, ServiceError> {
        match &self.workspaces {
            Some(w) if !w.roots().is_empty() => w.admit(ask, field),
            _ => Err(ServiceError::not_allowed(
                field,
                ask,
                "none: this server opens no workspace (filesystem.workspace); its operator enables them with `palisade serve --workspace-root DIR`",
            )),
        }
    }

    /// The most processes one of this server's sandboxes may hold (its bounds' `pids`).
    pub fn max_pids(&self) -> u64 {
        self.bounds.limits.pids
    }

    /// The policy itself.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The limits of a request: the ceiling's, narrowed by what it asks; `prefix` names the
    /// request's field (`limits`, `runs[3].limits`).
    pub fn limits(&self, ask: &api::Limits, prefix: &str) -> Result<Limits, ServiceError> {
        // The defaults are the server's values; the maxima its bounds.
        let c = self.bounds.limits;
        let mut l = self.policy.limits;
        let field = |f: &str| format!("{prefix}.{f}");
        let check = |f: &str,
                     v: Option<u64>,
                     max: u64,
                     min: u64,
                     t: &mut u64|
         -> Result<(), ServiceError> {
            if let Some(v) = v {
                if v < min {
                    return Err(ServiceError::invalid(
                        field(f),
                        v.to_string(),
                        format!("at least {min}, at most {max}"),
                    ));
                }
                if v > max {
                    return Err(ServiceError::ceiling(&field(f), v, max));
                }
                *t = v;
            }
            Ok(())
        };
        check(
            "timeout_ms",
            ask.timeout_ms,
            c.timeout_ms,
            1,
            &mut l.timeout_ms,
        )?;
        check(
            "memory_bytes",
            ask.memory_bytes,
            c.memory_bytes,
            1 << 20,
            &mut l.memory_bytes,
        )?;
        check("pids", ask.pids, c.pids, 1, &mut l.pids)?;
        check(
            "output_bytes",
            ask.output_bytes,
            c.output_bytes,
            1,
            &mut l.output_bytes,
        )?;
        check(
            "open_files",
            ask.open_files,
            c.open_files,
            1,
            &mut l.open_files,
        )?;
        check(
            "file_size_bytes",
            ask.file_size_bytes,
            c.file_size_bytes,
            1,
            &mut l.file_size_bytes,
        )?;
        check(
            "tmp_bytes",
            ask.tmp_bytes,
            c.tmp_bytes,
            1 << 20,
            &mut l.tmp_bytes,
        )?;
        check(
            "scratch_bytes",
            ask.scratch_bytes,
            c.scratch_bytes,
            1 << 20,
            &mut l.scratch_bytes,
        )?;
        let cpu_ceiling = c.cpu_time().as_millis() as u64;
        let mut cpu = (self.policy.limits.cpu_time().as_millis() as u64).min(cpu_ceiling);
        check("cpu_time_ms", ask.cpu_time_ms, cpu_ceiling, 1, &mut cpu)?;
        // The ceiling's CPU time stays in force unless the request narrows it (a timeout narrowed
        // alone must not leave a CPU budget larger than the server allows).
        l.cpu_time_ms = Some(cpu);
        if let Some(cpus) = ask.cpus {
            if !cpus.is_finite() || !(0.01..=palisade::policy::MAX_CPUS as f64).contains(&cpus) {
                return Err(ServiceError::invalid(
                    field("cpus"),
                    cpus.to_string(),
                    "between 0.01 and 4096 CPUs",
                ));
            }
            let milli = (cpus * 1000.0).round() as u64;
            if let Some(max) = c.cpu_milli {
                if milli > max {
                    return Err(ServiceError::ceiling(
                        &field("cpus"),
                        cpus,
                        max as f64 / 1000.0,
                    ));
                }
            }
            l.cpu_milli = Some(milli);
        }
        l.validate().map_err(|e| {
            ServiceError::invalid(
                prefix,
                e.to_string(),
                "limits within the ranges palisade accepts",
            )
        })?;
        Ok(l)
    }

    /// Each asked rule must be covered by the bounds' allow rules (the policy crate's rule: an
    /// exact name by the same name or a wildcard above it, a wildcard by a wider one, an address
    /// by a block that holds it, for every port the rule opens); the server's deny rules, pins
    /// and DNS server always apply.
    pub fn network(
        &self,
        ask: &[String],
        field: &str,
    ) -> Result<palisade::policy::net::Network, ServiceError> {
        let mut net = self.policy.network.clone();
        net.allow.clear();
        for (i, s) in ask.iter().enumerate() {
            let f = format!("{field}[{i}]");
            let r = NetRule::parse("allow_net", s)
                .map_err(|e| ServiceError::invalid(&f, s.as_str(), e.to_string()))?;
            let mut probe = self.policy.clone();
            probe.network.allow = vec![r.clone()];
            if probe.check_within(&self.bounds).is_err() {
                let allowed: Vec<String> = self
                    .bounds
                    .network
                    .allow
                    .iter()
                    .map(|r| r.to_string())
                    .collect();
                return Err(ServiceError::not_allowed(
                    &f,
                    s.as_str(),
                    if allowed.is_empty() {
                        "none: this server allows no egress".to_owned()
                    } else {
                        format!("a rule within the server's: {}", allowed.join(", "))
                    },
                ));
            }
            if !net.allow.contains(&r) {
                net.allow.push(r);
            }
        }
        Ok(net)
    }

    /// The request's variables on top of the server policy's own.
    pub fn env(
        &self,
        ask: &BTreeMap<String, String>,
        field: &str,
    ) -> Result<Vec<EnvVar>, ServiceError> {
        let mut env = self.policy.env.clone();
        for (k, v) in ask {
            let var = EnvVar::new(k, v).map_err(|e| {
                ServiceError::invalid(format!("{field}.{k}"), k.as_str(), e.to_string())
            })?;
            env.retain(|o| o.name != var.name);
            env.push(var);
        }
        Ok(env)
    }

    /// A policy for `command` with the given limits, egress and environment.
    pub fn policy_for(
        &self,
        command: Vec<String>,
        limits: Limits,
        network: palisade::policy::net::Network,
        env: Vec<EnvVar>,
    ) -> Result<Policy, ServiceError> {
        let mut p = self.policy.clone();
        p.command = command;
        p.limits = limits;
        p.network = network;
        p.env = env;
        p.validate()
            .map_err(|e| ServiceError::invalid("command", e.to_string(), "a valid command"))?;
        // The whole policy against the bounds, as the policy crate decides it. A run through the
        // agent has a backstop deadline and output cap of the server's own (each stage's are
        // the request's, kept by the server): those two are checked as the request's.
        // Those two lowered for the check only, and put back (not a copy of the whole policy).
        let (timeout_ms, output_bytes) = (p.limits.timeout_ms, p.limits.output_bytes);
        p.limits.timeout_ms = timeout_ms.min(self.bounds.limits.timeout_ms);
        p.limits.output_bytes = output_bytes.min(self.bounds.limits.output_bytes);
        let within = p.check_within(&self.bounds);
        (p.limits.timeout_ms, p.limits.output_bytes) = (timeout_ms, output_bytes);
        within.map_err(|e| {
            let mut err = ServiceError::ceiling(request_field(e.field), &e.asked, &e.allowed);
            err.message = e.to_string();
            err.accepted = Some(format!("{} (the server's bounds)", e.allowed));
            err
        })?;
        Ok(p)
    }
}

/// The request's name for a policy field the bounds named.
fn request_field(policy_field: &str) -> &str {
    match policy_field {
        "limits.timeout" => "limits.timeout_ms",
        "limits.cpu_time" => "limits.cpu_time_ms",
        "limits.memory" => "limits.memory_bytes",
        "limits.output" => "limits.output_bytes",
        "limits.file_size" => "limits.file_size_bytes",
        "limits.tmp_size" => "limits.tmp_bytes",
        "limits.scratch_size" => "limits.scratch_bytes",
        "network.allow" => "allow_net",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceiling() -> Ceiling {
        let mut p = Policy::new(["true"]).unwrap();
        p.limits.memory_bytes = 256 << 20;
        p.limits.timeout_ms = 10_000;
        p.network
            .allow
            .push(NetRule::parse("t", "pypi.org").unwrap());
        Ceiling::new(p).unwrap()
    }

    #[test]
    fn an_agents_backstop_is_checked_as_the_ceiling_and_kept_as_asked() {
        // A run through the agent: a deadline and an output cap of the server's own, above the
        // ceiling's (each stage keeps the request's). Checked as the ceiling's, returned as given.
        let c = ceiling();
        let mut limits = c.limits(&api::Limits::default(), "limits").unwrap();
        limits.timeout_ms = 2 * limits.timeout_ms + 30_000;
        limits.output_bytes *= 4;
        let asked = limits;
        let policy_for = |l| {
            c.policy_for(
                vec!["true".into()],
                l,
                palisade::policy::net::Network::default(),
                Vec::new(),
            )
        };
        let p = policy_for(limits).unwrap();
        assert_eq!(
            (p.limits.timeout_ms, p.limits.output_bytes),
            (asked.timeout_ms, asked.output_bytes)
        );
        // Anything else above the ceiling is still refused.
        let mut more = asked;
        more.memory_bytes = 1 << 30;
        let e = policy_for(more).unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn limits_narrow_and_never_widen() {
        let c = ceiling();
        let l = c.limits(&api::Limits::default(), "limits").unwrap();
        assert_eq!(
            (l.memory_bytes, l.timeout_ms, l.cpu_time_ms),
            (256 << 20, 10_000, Some(10_000))
        );
        let l = c
            .limits(
                &api::Limits {
                    memory_bytes: Some(64 << 20),
                    timeout_ms: Some(500),
                    ..Default::default()
                },
                "limits",
            )
            .unwrap();
        assert_eq!(
            (l.memory_bytes, l.timeout_ms, l.cpu_time_ms),
            (64 << 20, 500, Some(10_000))
        );
        let e = c
            .limits(
                &api::Limits {
                    memory_bytes: Some(1 << 30),
                    ..Default::default()
                },
                "limits",
            )
            .unwrap_err();
        assert_eq!(
            (e.code, e.field.as_deref()),
            ("ceiling", Some("limits.memory_bytes"))
        );
        assert!(e.accepted.unwrap().contains(&(256u64 << 20).to_string()));
        let e = c
            .limits(
                &api::Limits {
                    timeout_ms: Some(0),
                    ..Default::default()
                },
                "runs[2].limits",
            )
            .unwrap_err();
        assert_eq!(
            (e.code, e.field.as_deref()),
            ("invalid", Some("runs[2].limits.timeout_ms"))
        );
        let e = c
            .limits(
                &api::Limits {
                    cpu_time_ms: Some(20_000),
                    ..Default::default()
                },
                "limits",
            )
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits.cpu_time_ms"));
    }

    #[test]
    fn only_the_servers_allow_rules() {
        let c = ceiling();
        assert!(c.network(&[], "allow_net").unwrap().allow.is_empty());
        assert_eq!(
            c.network(&["PyPI.org.".into()], "allow_net")
                .unwrap()
                .allow
                .len(),
            1
        );
        let e = c.network(&["example.com".into()], "allow_net").unwrap_err();
        assert_eq!(
            (e.code, e.field.as_deref()),
            ("not-allowed", Some("allow_net[0]"))
        );
        assert!(e.accepted.unwrap().contains("pypi.org"));
        let e = c.network(&["*".into()], "allow_net").unwrap_err();
        assert_eq!(e.code, "invalid");
    }

    #[test]
    fn rules_are_covered_as_the_policy_crate_decides() {
        let mut p = Policy::new(["true"]).unwrap();
        p.network
            .allow
            .push(NetRule::parse("t", "*.pythonhosted.org").unwrap());
        let c = Ceiling::new(p).unwrap();
        assert_eq!(
            c.network(&["files.pythonhosted.org".into()], "allow_net")
                .unwrap()
                .allow
                .len(),
            1
        );
        let e = c
            .network(&["pythonhosted.org".into()], "allow_net")
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("allow_net[0]"));
        let e = c
            .network(&["files.pythonhosted.org:22".into()], "allow_net")
            .unwrap_err();
        assert_eq!(e.code, "not-allowed");
    }

    #[test]
    fn a_bounds_table_separates_the_defaults_from_the_ceiling() {
        let f = palisade::policy::file::PolicyFile::parse(
            "s.toml",
            "[limits]\nmemory = \"128MiB\"\ntimeout = \"10s\"\n[bounds.limits]\nmemory = \"1GiB\"\ntimeout = \"1m\"\n",
        )
        .unwrap();
        let policy = palisade::Sandbox::builder()
            .command(["true"])
            .policy_file(&f)
            .build()
            .unwrap()
            .policy()
            .clone();
        let c = Ceiling::with_bounds(policy, f.ceiling().unwrap()).unwrap();
        let l = c.limits(&api::Limits::default(), "limits").unwrap();
        assert_eq!(
            (l.memory_bytes, l.timeout_ms),
            (128 << 20, 10_000),
            "the file's values are the defaults"
        );
        let l = c
            .limits(
                &api::Limits {
                    memory_bytes: Some(512 << 20),
                    ..Default::default()
                },
                "limits",
            )
            .unwrap();
        assert_eq!(
            l.memory_bytes,
            512 << 20,
            "a request may go up to the bounds"
        );
        let e = c
            .limits(
                &api::Limits {
                    memory_bytes: Some(2 << 30),
                    ..Default::default()
                },
                "limits",
            )
            .unwrap_err();
        assert_eq!(
            (e.code, e.field.as_deref()),
            ("ceiling", Some("limits.memory_bytes"))
        );
        // The whole policy is checked against the bounds too (here a limit the per-field checks
        // would not see: a timeout past the bounds through the limits given to policy_for).
        let mut over = l;
        over.cpu_time_ms = Some(120_000);
        let e = c
            .policy_for(vec!["true".into()], over, Default::default(), Vec::new())
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("limits.cpu_time_ms"), "{e:?}");
    }

    #[test]
    fn a_host_scratch_or_the_agents_path_is_refused() {
        let mut p = Policy::new(["true"]).unwrap();
        p.scratch = Scratch::Host {
            path: "/srv".into(),
        };
        assert!(Ceiling::new(p).unwrap_err().contains("shared"));
        let mut p = Policy::new(["true"]).unwrap();
        p.binds
            .push(palisade::policy::Bind::parse("/srv:/.palisade/x", false).unwrap());
        assert!(Ceiling::new(p).unwrap_err().contains("/.palisade"));
    }
}
