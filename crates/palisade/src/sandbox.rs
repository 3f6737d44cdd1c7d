//! The library entry point: build a policy, run it, get a [`Report`].

use crate::report::Report;
use palisade_cgroup::{CgroupLimits, RunCgroup};
use palisade_linux::{CpuWatch, Running, SetupError, Sinks, Stdin};
use palisade_policy::Degradable;
use palisade_policy::{Policy, PolicyError, Scratch};
use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// A sandbox ready to run: a validated policy plus how to treat the scratch directory.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) policy: Policy,
    pub(crate) keep: bool,
    pub(crate) stdin: Stdin,
    pub(crate) cgroup_root: PathBuf,
    pub(crate) net_notify: Option<NetNotify>,
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

impl Sandbox {
    /// Starts a builder.
    pub fn builder() -> crate::Builder {
        crate::Builder::default()
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
            m.clean_stale_once();
            let limits = CgroupLimits {
                memory_bytes: policy.limits.memory_bytes,
                pids: policy.limits.pids,
                cpu_quota_us: policy.limits.cpu_quota_us(),
            };
            let c = m.create(&limits).map_err(std::io::Error::other)?;
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
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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
