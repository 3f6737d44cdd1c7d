//! The report of one run: what happened, what it cost, which layers held.

use palisade_linux::landlock::{fs_names, scope_names, BIND_TCP, CONNECT_TCP};
use palisade_linux::{Ids, LandlockState, LimitHit, Outcome, SetupError, Termination};
use serde::Serialize;

/// Exit code of `palisade run` when palisade itself failed (bad option or policy, setup failure).
pub const EXIT_SANDBOX_ERROR: i32 = 125;
/// Exit code when palisade killed the sandbox for a limit (`timeout`, `output-limit`); the report
/// says which. The same code as GNU `timeout`.
pub const EXIT_LIMIT: i32 = 124;
/// Exit code when the command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command was not found inside the sandbox.
pub const EXIT_NOT_FOUND: i32 = 127;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Exit code 0.
    Ok,
    /// A non-zero exit code.
    Exit,
    /// Killed by a signal.
    Signal,
    /// Killed by palisade when the wall-clock timeout passed.
    Timeout,
    /// Killed when the sandbox's processes together used up their CPU time.
    CpuTimeout,
    /// Killed by palisade when stdout plus stderr reached the output cap.
    OutputLimit,
    /// Killed by the kernel's OOM killer at the sandbox's memory ceiling.
    Oom,
    /// Killed because the caller cancelled the run (`Run::kill`).
    Cancelled,
    /// palisade failed; the program's result is unknown (or it never ran).
    SandboxError,
    /// The program ended (`exit_code`, `signal` say how), but something it created at a protected
    /// path could not be moved aside and is still in place: see `protected.blocked`. Exit 125.
    ProtectionFailed,
}

/// A refused system call, with how often and by whom it was attempted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeniedSyscall {
    /// `ptrace`, `bpf`, `socket (netlink)`, `ioctl TIOCSTI`, `clone (namespace flags)`…
    pub name: String,
    pub count: u64,
    /// The first process that tried, as a pid inside the sandbox.
    pub first_pid: u32,
    /// What the call returned: `EPERM`, or `EAFNOSUPPORT` for a socket family.
    pub errno: &'static str,
}

/// One isolation layer and whether it was enforced for this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// The layer (`user-namespace`, `landlock`, `seccomp`, `cgroup-limits`, …).
    pub name: &'static str,
    /// Whether it held for this run (false: waived, or the host lacks it).
    pub enforced: bool,
    /// What it did, with versions and figures, or why it was not enforced.
    pub detail: String,
}

/// Everything palisade knows about one run. Serialized as the `--json` report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// How the run ended.
    pub status: Status,
    /// The payload's exit code (`exit`, `ok`).
    pub exit_code: Option<i32>,
    /// The signal that killed the payload (`signal`).
    pub signal: Option<i32>,
    /// Its name (`SIGKILL`, …).
    pub signal_name: Option<&'static str>,
    /// What failed, for `sandbox-error`.
    pub error: Option<String>,
    /// The kind of failure as a stable code (`namespaces`, `host-path`, `setup-step`, `exec`,
    /// …), for programs; `error` is for people.
    pub error_kind: Option<&'static str>,
    /// For `setup-step`: which step of the sandbox's setup failed (`pivot-root`,
    /// `landlock-restrict`, …; docs/setup-order.md).
    pub error_step: Option<&'static str>,
    /// Wall-clock time from the sandbox's creation to its end.
    pub wall_time_ms: f64,
    /// CPU time of every process of the sandbox: from the cgroup where it accounts CPU (which
    /// includes processes the kernel reaped at a kill), else from `wait4` on init.
    pub cpu_user_ms: f64,
    /// System CPU time of the same processes.
    pub cpu_system_ms: f64,
    /// CPU the supervisor spent for this sandbox: setting it up, relaying its output and input,
    /// answering the calls it was refused, proxying its connections. The refused calls' and the
    /// proxy's part is charged to the CPU-time limit too.
    pub supervisor_cpu_ms: f64,
    /// Times the supervisor paused answering refused calls because they had used the sandbox's
    /// CPU share (a payload flooding it with refused calls).
    pub refusals_throttled: u64,
    /// Peak resident set of the largest process.
    pub max_rss_bytes: u64,
    /// Bytes relayed (at most the output cap in all).
    pub stdout_bytes: u64,
    /// Bytes of standard error relayed.
    pub stderr_bytes: u64,
    /// Output beyond the cap was discarded.
    pub output_truncated: bool,
    /// The ceilings in force.
    pub limits: palisade_policy::Limits,
    /// Peak memory of the whole sandbox (cgroup accounting), in bytes.
    pub memory_peak_bytes: Option<u64>,
    /// Peak of the socket buffers the sandbox held (cgroup v1, where they are counted apart from
    /// `memory_peak_bytes` and held to a ceiling of their own).
    pub socket_memory_peak_bytes: Option<u64>,
    /// Processes the OOM killer killed in the sandbox.
    pub oom_kills: u64,
    /// Most processes and threads alive at once in the sandbox (cgroup accounting).
    pub pids_peak: Option<u64>,
    /// The CPU share in force (CPUs), when the host's cgroup has the cpu controller.
    pub cpus: Option<f64>,
    /// The cgroup version that enforced memory and process ceilings, if one did.
    pub cgroup: Option<&'static str>,
    /// The kernel's Landlock ABI, when Landlock was enforced.
    pub landlock_abi: Option<u32>,
    /// System calls the seccomp filter refused, in the order first attempted: what the code
    /// tried that the sandbox stopped.
    pub denied_syscalls: Vec<DeniedSyscall>,
    /// The payload's uid inside the sandbox.
    pub uid: Option<u32>,
    /// The host uid that uid is on the host (never 0).
    pub host_uid: Option<u32>,
    /// Host path of the scratch directory, when it is one (`--scratch` or `--keep`).
    pub scratch: Option<String>,
    /// Every isolation layer and whether it was enforced.
    pub layers: Vec<Layer>,
    /// How the sandbox was started (docs/engine.md): `in-process` (a fork-like clone of the
    /// caller), `exec` (palisade's init program, exec'd), `template` (cloned by a prepared
    /// template's zygote); `None` when no engine was tried.
    pub engine: Option<&'static str>,
    /// Egress: `none`, or `allow-list` with every decision of the proxy and DNS stub.
    pub network: Network,
    /// Protected paths under a host scratch directory: what was kept read-only, and anything the
    /// code created at a protected path, moved aside after the run.
    pub protected: Protected,
    /// With a workspace (`filesystem.workspace`): the change set the run left, its summary, and
    /// what `--apply` did with it. Absent from the JSON for other runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::workspace::WorkspaceReport>,
    /// The supervisor lost the cgroup's CPU accounting during the run (see `cpu-time-limit`).
    #[serde(skip)]
    pub(crate) cpu_watch_lost: bool,
}

impl Report {
    /// The exit code `palisade run` ends with: the payload's own, 128+signal, or a reserved code.
    pub fn exit_code_for_cli(&self) -> i32 {
        match self.status {
            Status::Ok => 0,
            Status::Exit => self.exit_code.unwrap_or(EXIT_SANDBOX_ERROR),
            Status::Signal => 128 + self.signal.unwrap_or(0),
            Status::Timeout | Status::CpuTimeout | Status::OutputLimit | Status::Oom => EXIT_LIMIT,
            Status::Cancelled => 128 + libc::SIGKILL,
            Status::SandboxError => self.exit_code.unwrap_or(EXIT_SANDBOX_ERROR),
            Status::ProtectionFailed => EXIT_SANDBOX_ERROR,
        }
    }

    pub(crate) fn from_outcome(
        o: &Outcome,
        ids: Ids,
        landlock: &LandlockState,
        scratch: Option<String>,
        limits: palisade_policy::Limits,
    ) -> Report {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        let (status, exit_code, signal, error) = match (o.limit_hit, o.termination) {
            (Some(LimitHit::Timeout), _) => (Status::Timeout, None, None, None),
            (Some(LimitHit::Output), _) => (Status::OutputLimit, None, None, None),
            (Some(LimitHit::CpuTime), _) => (Status::CpuTimeout, None, None, None),
            (None, _) if o.cancelled => (Status::Cancelled, None, None, None),
            (None, t) => match t {
                Termination::Exited(0) => (Status::Ok, Some(0), None, None),
                Termination::Exited(c) => (Status::Exit, Some(c), None, None),
                Termination::Signaled(s) => (Status::Signal, None, Some(s), None),
                Termination::Vanished => (
                    Status::SandboxError,
                    None,
                    None,
                    Some(
                        "the sandbox's init was killed from outside before the payload ended"
                            .to_owned(),
                    ),
                ),
            },
        };
        Report {
            exit_code,
            signal,
            signal_name: signal.and_then(signal_name),
            error,
            cpu_user_ms: ms(o.user_cpu),
            cpu_system_ms: ms(o.system_cpu),
            supervisor_cpu_ms: ms(o.supervisor_cpu),
            refusals_throttled: o.refusals_throttled,
            max_rss_bytes: o.max_rss,
            stdout_bytes: o.stdout_bytes,
            stderr_bytes: o.stderr_bytes,
            output_truncated: o.output_truncated,
            cpu_watch_lost: o.cpu_watch_lost,
            denied_syscalls: o
                .denied
                .iter()
                .map(|d| DeniedSyscall {
                    name: d.name.clone(),
                    count: d.count,
                    first_pid: d.first_pid,
                    errno: match d.errno {
                        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
                        _ => "EPERM",
                    },
                })
                .collect(),
            ..Report::base(status, o.wall, scratch, limits, Some((ids, landlock)))
        }
    }

    pub(crate) fn from_error(
        e: &SetupError,
        wall: std::time::Duration,
        scratch: Option<String>,
        limits: palisade_policy::Limits,
    ) -> Report {
        let code = match e {
            SetupError::Exec { source, .. } => match source.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_EXECUTE,
            },
            _ => EXIT_SANDBOX_ERROR,
        };
        Report {
            exit_code: Some(code),
            error: Some(error_chain(e)),
            error_kind: Some(e.kind()),
            error_step: e.step().map(|s| s.code()),
            ..Report::base(Status::SandboxError, wall, scratch, limits, None)
        }
    }

    /// A report with `status` and nothing measured yet; the constructors above fill in the rest.
    fn base(
        status: Status,
        wall: std::time::Duration,
        scratch: Option<String>,
        limits: palisade_policy::Limits,
        started: Option<(Ids, &LandlockState)>,
    ) -> Report {
        let ids = started.map(|s| s.0);
        let landlock = started.map(|s| s.1);
        Report {
            status,
            exit_code: None,
            signal: None,
            signal_name: None,
            error: None,
            error_kind: None,
            error_step: None,
            wall_time_ms: wall.as_secs_f64() * 1000.0,
            cpu_user_ms: 0.0,
            cpu_system_ms: 0.0,
            supervisor_cpu_ms: 0.0,
            refusals_throttled: 0,
            max_rss_bytes: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            output_truncated: false,
            limits: limits.resolved(),
            memory_peak_bytes: None,
            socket_memory_peak_bytes: None,
            oom_kills: 0,
            pids_peak: None,
            cpus: None,
            cgroup: None,
            landlock_abi: match landlock {
                Some(LandlockState::Enforced { abi, .. }) => Some(*abi),
                _ => None,
            },
            uid: ids.map(|i| i.uid),
            host_uid: ids.map(|i| i.host_uid),
            scratch,
            layers: layers(ids, landlock),
            engine: None,
            cpu_watch_lost: false,
            denied_syscalls: Vec::new(),
            network: Network::default(),
            protected: Protected::default(),
            workspace: None,
        }
    }

    /// Records what became of a workspace's changes. Changes that could not be kept fail the
    /// run: status `sandbox-error`, with the program's own result in the message.
    pub(crate) fn set_workspace(&mut self, ws: crate::workspace::WorkspaceReport) {
        if let Some(e) = &ws.error {
            let result = match (self.status, self.exit_code, self.signal) {
                (Status::SandboxError, ..) => String::new(),
                (_, Some(c), _) => format!(" (the program had ended: exit {c})"),
                (_, _, Some(s)) => format!(" (the program had ended: signal {s})"),
                _ => String::new(),
            };
            let before = self.error.take().map(|b| format!("; before that: {b}"));
            self.status = Status::SandboxError;
            self.exit_code = Some(EXIT_SANDBOX_ERROR);
            self.error_kind = Some("workspace");
            self.error = Some(format!("{e}{result}{}", before.unwrap_or_default()));
        }
        self.workspace = Some(ws);
    }

    /// Records which engine started (or tried to start) the sandbox.
    pub(crate) fn set_engine(&mut self, engine: &'static str) {
        self.engine = Some(engine);
    }

    /// Records the protected paths, and what was moved aside after the run. Something the code
    /// created that is still in place fails the run: status `protection-failed`, whatever the
    /// program's own result (kept in `exit_code` and `signal`).
    pub(crate) fn set_protected(
        &mut self,
        p: &palisade_linux::plan::Protection,
        disarmed: Vec<palisade_linux::host::Disarmed>,
    ) {
        let armed: Vec<&str> = disarmed
            .iter()
            .filter(|d| d.moved_to.is_none())
            .map(|d| d.path.as_str())
            .collect();
        if !armed.is_empty() {
            let before = match (self.status, self.error.take()) {
                (_, Some(e)) => format!("; before that: {e}"),
                (Status::Ok | Status::Exit | Status::Signal, None) => String::new(),
                (s, None) => format!(
                    "; the run had ended with status {}",
                    serde_json::to_value(s)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
            };
            self.status = Status::ProtectionFailed;
            self.error = Some(format!(
                "created inside at a protected path and could NOT be moved aside, still in place: {}{before}",
                armed.join(", ")
            ));
        }
        self.protected = Protected {
            read_only: p.read_only.clone(),
            pinned: p.pinned.clone(),
            watched: p.watched.clone(),
            derived: p
                .derived
                .iter()
                .map(|d| Derived {
                    path: d.path.clone(),
                    from: d.from.clone(),
                })
                .collect(),
            not_followed: p.not_followed.clone(),
            blocked: disarmed
                .into_iter()
                .map(|d| Blocked {
                    path: d.path,
                    moved_to: d.moved_to,
                    error: d.error,
                })
                .collect(),
        };
    }

    /// Records the egress proxy's decisions (with allow rules), and says so in the network layer.
    pub(crate) fn set_network(
        &mut self,
        log: palisade_net::NetLog,
        net: &palisade_policy::net::Network,
    ) {
        // The proxy's CPU is the supervisor's too.
        self.supervisor_cpu_ms += log.supervisor_cpu_ms as f64;
        let rules = net.allow.len();
        let resolver = match net.dns_server {
            Some(a) => format!("DNS server {a} (--dns-server)"),
            None => "the host's resolver".to_owned(),
        };
        self.network = Network {
            mode: "allow-list",
            events: log.events,
            allowed: log.allowed,
            denied: log.denied,
            dropped: log.dropped,
            refused_connections: log.refused_connections,
            cut_connections: log.cut_connections,
            took_connections: log.took_connections,
            paced_connections: log.paced_connections,
            notify_suppressed: log.notify_suppressed,
            supervisor_cpu_ms: log.supervisor_cpu_ms,
            attempts: Vec::new(),
            attempts_dropped: 0,
        };
        if let Some(l) = self
            .layers
            .iter_mut()
            .find(|l| l.name == "network-namespace")
        {
            l.detail = format!(
                "only loopback, no route out; egress through palisade's proxy for {rules} allow rule(s) (HTTP 127.0.0.1:{}, SOCKS5 127.0.0.1:{}, DNS stub 127.0.0.1:53, transparent capture); allowed names resolved by {resolver}",
                palisade_policy::net::HTTP_PROXY_PORT,
                palisade_policy::net::SOCKS_PORT
            );
        }
    }

    /// Records what a run without egress tried to reach: the names the DNS stub refused and the
    /// destinations of `connect` calls the kernel refused.
    pub(crate) fn set_attempts(
        &mut self,
        log: palisade_net::NetLog,
        connects: Vec<palisade_linux::Attempt>,
        connects_dropped: u64,
    ) {
        self.supervisor_cpu_ms += log.supervisor_cpu_ms as f64;
        self.network.supervisor_cpu_ms = log.supervisor_cpu_ms;
        let mut v: Vec<Attempt> = log
            .lookups
            .into_iter()
            .map(|l| Attempt {
                protocol: "dns",
                name: Some(l.name),
                address: None,
                port: None,
                count: l.count,
            })
            .collect();
        v.extend(connects.into_iter().map(|a| Attempt {
            protocol: a.protocol,
            name: None,
            address: Some(match a.address {
                std::net::IpAddr::V6(x) => format!("[{x}]"),
                x => x.to_string(),
            }),
            port: Some(a.port),
            count: a.count,
        }));
        self.network.attempts = v;
        self.network.attempts_dropped = log.lookups_dropped + connects_dropped;
    }

    /// Says in the seccomp layer that tracing inside was allowed (`--allow-ptrace`).
    pub(crate) fn note_ptrace_allowed(&mut self) {
        if let Some(l) = self.layers.iter_mut().find(|l| l.name == "seccomp") {
            l.detail = format!(
                "{}; ALLOWED by --allow-ptrace: ptrace, process_vm_readv, process_vm_writev between processes of the sandbox",
                l.detail.replacen(
                    &palisade_linux::seccomp::denied().len().to_string(),
                    &palisade_linux::seccomp::refused(true).len().to_string(),
                    1
                )
            );
        }
    }

    /// Records what the cgroup layer did: enforced (with its accounting) or waived.
    pub(crate) fn set_cgroup(
        &mut self,
        version: Option<&'static str>,
        stats: palisade_cgroup::CgroupStats,
        waived: Option<String>,
        gaps: &[palisade_cgroup::Gap],
    ) {
        self.socket_memory_peak_bytes = stats.socket_memory_peak;
        self.cgroup = version;
        self.memory_peak_bytes = stats.memory_peak;
        self.oom_kills = stats.oom_kills;
        self.pids_peak = stats.pids_peak;
        self.cpus = stats
            .cpu_quota_us
            .map(|q| q as f64 / palisade_cgroup::CPU_PERIOD_US as f64);
        if let Some(c) = stats.cpu {
            self.cpu_user_ms = c.user.as_secs_f64() * 1000.0;
            self.cpu_system_ms = c.system.as_secs_f64() * 1000.0;
        }
        // An OOM kill that took the payload down is the run's cause of death.
        if stats.oom_kills > 0
            && self.status == Status::Signal
            && self.signal == Some(libc::SIGKILL)
        {
            self.status = Status::Oom;
        }
        if stats.oom_kills > 0
            && self.status == Status::SandboxError
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.contains("killed from outside"))
        {
            self.status = Status::Oom;
            self.error = None;
        }
        // Without the cgroup's watch, RLIMIT_CPU is what stops a process that spends the budget:
        // SIGXCPU at its soft limit, which is what it was; SIGKILL at the hard limit a second
        // later for code that caught SIGXCPU. A SIGKILL is taken for it only with about the soft
        // limit's worth of CPU used ("about": wait4's times are tick-sampled estimates, while the
        // kernel checks the limit on its exact runtime; seen 1951 ms for a kill at 2 s, 1772 ms
        // and 1557 ms on a loaded 2-CPU machine).
        let rlimit_ms = self.limits.cpu_time_ms.map_or(u64::MAX, |l| {
            palisade_linux::plan::rlimit_cpu_secs(std::time::Duration::from_millis(l)) * 1000
        });
        let used = self.cpu_user_ms + self.cpu_system_ms;
        if (stats.cpu.is_none() || self.cpu_watch_lost)
            && self.status == Status::Signal
            && self.limits.cpu_time_ms.is_some()
            && match self.signal {
                Some(libc::SIGXCPU) => true,
                Some(libc::SIGKILL) => used >= rlimit_ms as f64 * 0.8,
                _ => false,
            }
        {
            self.status = Status::CpuTimeout;
        }
        let layer = match (version, waived) {
            (Some(v), _) => Layer {
                name: "cgroup-limits",
                enforced: true,
                detail: format!(
                    "cgroup {v}: memory {} bytes (swap off), pids {}, {}{}",
                    self.limits.memory_bytes,
                    self.limits.pids,
                    match self.cpus {
                        Some(c) => format!("cpu quota {c} CPUs"),
                        None if self.limits.cpu_milli.is_some() => {
                            "no cpu controller for palisade on this host: no cpu quota".to_owned()
                        }
                        None => "no cpu quota (--cpus sets one)".to_owned(),
                    },
                    gaps.iter()
                        .map(|g| format!("; not held within the memory ceiling here: {g}"))
                        .collect::<String>()
                ),
            },
            (None, Some(why)) => Layer {
                name: "cgroup-limits",
                enforced: false,
                detail: format!("waived (layers.allow_degraded: cgroup): {why}"),
            },
            (None, None) => Layer {
                name: "cgroup-limits",
                enforced: false,
                detail: "not started".into(),
            },
        };
        self.layers.push(layer);
        let limit = self.limits.cpu_time_ms.unwrap_or(0);
        self.layers.push(match stats.cpu {
            Some(_) if self.cpu_watch_lost => Layer {
                name: "cpu-time-limit",
                enforced: false,
                detail: format!("the cgroup's CPU accounting could not be read during the run: from then on only RLIMIT_CPU per process ({limit} ms, rounded up to whole seconds, plus one)"),
            },
            Some(_) => Layer {
                name: "cpu-time-limit",
                enforced: true,
                detail: format!("{limit} ms for all processes together, watched by the supervisor through the cgroup's CPU accounting; RLIMIT_CPU per process as a second wall"),
            },
            None => Layer {
                name: "cpu-time-limit",
                enforced: false,
                detail: format!("no cgroup CPU accounting: only RLIMIT_CPU per process ({limit} ms, rounded up to whole seconds, plus one); a payload that forks can use more in all"),
            },
        });
    }

    /// One line for humans, e.g. `palisade: ok · exit 0 · 3.1 ms · cpu 0.4 ms · rss 1.2 MiB`.
    pub fn summary(&self) -> String {
        let what = match self.status {
            Status::Ok => "ok · exit 0".to_owned(),
            Status::Exit => format!("exit {}", self.exit_code.unwrap_or(-1)),
            Status::Signal => format!(
                "killed by signal {} ({})",
                self.signal.unwrap_or(0),
                self.signal_name.unwrap_or("?")
            ),
            Status::Oom => format!(
                "out of memory at the {} MiB ceiling: killed",
                self.limits.memory_bytes >> 20
            ),
            Status::Timeout => format!("timeout after {} ms: killed", self.limits.timeout_ms),
            Status::CpuTimeout => format!(
                "CPU time limit of {} ms used up: killed",
                self.limits.cpu_time_ms.unwrap_or(0)
            ),
            Status::OutputLimit => format!(
                "output limit of {} bytes reached: killed",
                self.limits.output_bytes
            ),
            Status::Cancelled => "cancelled by the caller: killed".to_owned(),
            Status::SandboxError => {
                return format!(
                    "palisade: sandbox error: {}",
                    self.error.as_deref().unwrap_or("unknown")
                )
            }
            Status::ProtectionFailed => format!(
                "PROTECTION FAILED (exit 125; the program's {})",
                match (self.exit_code, self.signal) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "result: none".to_owned(),
                }
            ),
        };
        let mut s = format!(
            "palisade: {what} · {:.1} ms · cpu {:.1} ms · rss {:.1} MiB · out {} B · err {} B",
            self.wall_time_ms,
            self.cpu_user_ms + self.cpu_system_ms,
            self.max_rss_bytes as f64 / 1048576.0,
            self.stdout_bytes,
            self.stderr_bytes
        );
        if let Some(p) = &self.scratch {
            s.push_str(&format!(" · scratch {p}"));
        }
        if self.network.mode != "none" {
            s.push_str(&format!(
                " · net {} allowed, {} denied",
                self.network.allowed, self.network.denied
            ));
        }
        if let Some(w) = &self.workspace {
            match &w.change_set {
                Some(id) => {
                    let sm = &w.summary;
                    s.push_str(&format!(
                        " · workspace {id}: {} change(s) ({} added, {} modified, {} deleted), {} B",
                        sm.entries,
                        sm.added,
                        sm.modified,
                        sm.deleted + sm.replaced,
                        sm.bytes
                    ));
                    let held = sm.refused + sm.conflicts + sm.protected + sm.risky;
                    if held > 0 {
                        s.push_str(&format!(
                            ", {held} to review (refused, conflicting, protected or risky)"
                        ));
                    }
                    match (&w.applied, &w.apply_error) {
                        (Some(a), _) => s.push_str(&format!(", APPLIED {} entries", a.entries)),
                        (None, Some(e)) => s.push_str(&format!(
                            ", not applied: {}",
                            e.lines().next().unwrap_or("")
                        )),
                        _ => s.push_str(&format!(
                            "; review: palisade diff {id}, then palisade apply {id}"
                        )),
                    }
                }
                None if w.error.is_none() => s.push_str(" · workspace: no change"),
                None => {}
            }
        }
        for b in &self.protected.blocked {
            match &b.moved_to {
                Some(to) => s.push_str(&format!(
                    " · PROTECTED {} was created inside: moved to {to}",
                    b.path
                )),
                None => s.push_str(&format!(
                    " · PROTECTED {} was created inside and could NOT be moved aside: {}",
                    b.path,
                    b.error.as_deref().unwrap_or("?")
                )),
            }
        }
        if !self.denied_syscalls.is_empty() {
            let calls: Vec<String> = self
                .denied_syscalls
                .iter()
                .map(|d| format!("{}×{}", d.name, d.count))
                .collect();
            s.push_str(&format!(" · refused: {}", calls.join(", ")));
        }
        s
    }
}

/// The protected-paths part of the report (paths relative to the scratch directory).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Protected {
    /// Mounted read-only over themselves.
    pub read_only: Vec<String>,
    /// Directories on the way, made mount points so that they cannot be moved or removed.
    pub pinned: Vec<String>,
    /// Did not exist at the start (the first missing component of a protected path); looked at
    /// after the run.
    pub watched: Vec<String>,
    /// Protected as well because the repository's own files point there.
    pub derived: Vec<Derived>,
    /// Places the repository's files point at that palisade did not follow (outside the scratch
    /// directory, …), with why: not protected.
    pub not_followed: Vec<String>,
    /// Watched paths the code created, and where they were moved.
    pub blocked: Vec<Blocked>,
}

/// A protected path found in the repository's own files.
#[derive(Debug, Clone, Serialize)]
pub struct Derived {
    pub path: String,
    /// Where it was named, e.g. ``core.hooksPath in `.git/config` ``.
    pub from: String,
}

/// A protected path the code created during the run.
#[derive(Debug, Clone, Serialize)]
pub struct Blocked {
    pub path: String,
    /// Relative to the scratch directory (in palisade's `.palisade-blocked-XXXXXXXX`
    /// directory); `None` if the move failed: then `error` says why, the path is still in place,
    /// and the status is `protection-failed`.
    pub moved_to: Option<String>,
    pub error: Option<String>,
}

/// The network part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Network {
    /// `none` (no network at all) or `allow-list`.
    pub mode: &'static str,
    /// Every decision, in order: connections with their bytes, and DNS answers.
    pub events: Vec<palisade_net::Event>,
    pub allowed: u64,
    pub denied: u64,
    /// Decisions past the kept maximum, counted only.
    pub dropped: u64,
    /// Connections the proxy closed at once, past its cap on open connections (or, in a
    /// process with many sandboxes, when all the process's were open and this one held its share).
    pub refused_connections: u64,
    /// Open connections cut to give another sandbox of the same process its share of the
    /// process's connections (`palisade serve --max-proxy-connections`), the longest idle first.
    pub cut_connections: u64,
    /// Places this sandbox's connections took from other sandboxes' (each cut one of theirs).
    pub took_connections: u64,
    /// Upstream connections that waited for their turn, past the proxy's pace
    /// (`palisade_net::MAX_CONNECTS_PER_S`).
    pub paced_connections: u64,
    /// Decisions not passed to the `on_net_event` callback (not printed): past its cap.
    pub notify_suppressed: u64,
    /// CPU time the supervisor's proxy threads spent on this sandbox, in milliseconds.
    pub supervisor_cpu_ms: u64,
    /// Without egress: what the code tried to reach (names it looked up, addresses it connected
    /// to), each with a count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
    /// Attempts past the listed maximum, counted only.
    #[serde(skip_serializing_if = "is_zero")]
    pub attempts_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Something a run without egress tried to reach: a name (`dns`), or an address and port
/// (`tcp`, `udp`; `unknown` when the socket could not be looked at).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    pub count: u64,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            mode: "none",
            events: Vec::new(),
            allowed: 0,
            denied: 0,
            dropped: 0,
            refused_connections: 0,
            cut_connections: 0,
            took_connections: 0,
            paced_connections: 0,
            notify_suppressed: 0,
            supervisor_cpu_ms: 0,
            attempts: Vec::new(),
            attempts_dropped: 0,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

fn signal_name(s: i32) -> Option<&'static str> {
    Some(match s {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// The layers of this version. Those marked not enforced are not built yet (or were waived, or
/// the run never started); the report says so rather than implying protection it does not give.
fn layers(ids: Option<Ids>, landlock: Option<&LandlockState>) -> Vec<Layer> {
    let on = |name, detail: String| Layer {
        name,
        enforced: ids.is_some(),
        detail,
    };
    let mut v = vec![
        on(
            "user-namespace",
            match ids {
                Some(i) => format!("uid {} / gid {} inside = host uid {} / gid {}; nested user namespaces disabled", i.uid, i.gid, i.host_uid, i.host_gid),
                None => "not started".into(),
            },
        ),
        on("mount-namespace", "fresh tmpfs root, read-only system binds, pivot_root, old root detached".into()),
        on("pid-namespace", "own pid 1 (palisade init); every process dies with the payload".into()),
        on("network-namespace", "only loopback; no route out".into()),
        on("ipc-namespace", "own SysV IPC and POSIX message queues".into()),
        on("uts-namespace", "own host name".into()),
        on("cgroup-namespace", "own cgroup root view".into()),
        on("capabilities", "all sets empty, bounding and ambient cleared, securebits locked".into()),
        on("no-new-privs", "set before exec".into()),
        on("environment", "cleared; PATH, HOME, LANG (TERM with a tty) and --env only".into()),
        on("file-descriptors", "only stdin, stdout, stderr cross".into()),
        on("session", "new session (setsid): no TIOCSTI into the caller's terminal".into()),
    ];
    v.push(on(
        "wall-timeout",
        "the supervisor kills the whole sandbox at the deadline".into(),
    ));
    v.push(on(
        "output-limit",
        "the supervisor stops relaying and kills the sandbox at the cap".into(),
    ));
    v.push(on(
        "core-dumps",
        "off: RLIMIT_CORE held at 1 by seccomp (no core file, no core_pattern pipe helper)".into(),
    ));
    v.push(on(
        "process-ceiling",
        "RLIMIT_NPROC, counted per user namespace".into(),
    ));
    v.push(on("file-limits", "RLIMIT_NOFILE and RLIMIT_FSIZE".into()));
    v.push(on(
        "seccomp",
        format!(
            "{} system calls refused (io_uring, bpf, ptrace, keyctl, mount API, unshare/setns…), clone with namespace flags, TIOCSTI/TIOCLINUX/TIOCSETD, socket families but unix/inet/inet6, other ABIs; every refused attempt answered by the supervisor and listed in denied_syscalls",
            palisade_linux::seccomp::denied().len()
        ),
    ));
    v.push(landlock_layer(landlock));
    v.push(Layer {
        name: "egress-proxy",
        enforced: false,
        detail: "not running: no --allow-net rule, so the sandbox has no network at all".into(),
    });
    v
}

fn landlock_layer(state: Option<&LandlockState>) -> Layer {
    let (enforced, detail) = match state {
        None => (false, "not started".to_owned()),
        Some(LandlockState::Enforced {
            abi,
            handled_fs,
            handled_net,
            scoped,
            rules,
            ports,
            debug_unlandlocked,
        }) => {
            let scopes = scope_names(*scoped);
            let port_list = |right: u64| {
                let v: Vec<String> = ports
                    .iter()
                    .filter(|p| p.1 & right != 0)
                    .map(|p| p.0.to_string())
                    .collect();
                if v.is_empty() {
                    "no port".to_owned()
                } else {
                    format!("ports {}", v.join(", "))
                }
            };
            let tcp = if *handled_net == 0 {
                "TCP not handled (ABI 4 needed)".to_owned()
            } else {
                format!(
                    "TCP connect only to {}, bind only to {}",
                    port_list(CONNECT_TCP),
                    port_list(BIND_TCP)
                )
            };
            let mut d = format!(
                "ABI {abi}: {rules} rules; reads, executes and writes only under the view's paths \
                 (handled: {}); {tcp}; scoped: {}",
                fs_names(*handled_fs).join(", "),
                if scopes.is_empty() {
                    "none (ABI 6 needed)".to_owned()
                } else {
                    scopes.join(", ")
                }
            );
            if let Some(p) = debug_unlandlocked {
                d.push_str(&format!(
                    "; DEBUG: {p} is in the view without a Landlock rule (debug_unlandlocked_bind)"
                ));
            }
            (true, d)
        }
        Some(LandlockState::Waived { reason }) => (
            false,
            format!("waived (layers.allow_degraded: landlock): {reason}; the mount view is the only filesystem wall"),
        ),
    };
    Layer {
        name: "landlock",
        enforced,
        detail,
    }
}

#[cfg(test)]
mod protection_tests {
    use super::*;
    use palisade_linux::host::Disarmed;
    use palisade_linux::plan::Protection;

    fn ended(code: i32) -> Report {
        let o = Outcome {
            termination: Termination::Exited(code),
            limit_hit: None,
            output_truncated: false,
            wall: std::time::Duration::from_millis(5),
            user_cpu: std::time::Duration::ZERO,
            system_cpu: std::time::Duration::ZERO,
            max_rss: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            cpu_watch_lost: false,
            denied: Vec::new(),
            cancelled: false,
            supervisor_cpu: std::time::Duration::ZERO,
            refusals_throttled: 0,
            attempts: Vec::new(),
            attempts_dropped: 0,
            made_no_socket: false,
        };
        let ids = Ids {
            uid: 1000,
            gid: 1000,
            host_uid: 1000,
            host_gid: 1000,
            privileged: false,
        };
        let landlock = LandlockState::Waived {
            reason: "test".into(),
        };
        Report::from_outcome(&o, ids, &landlock, None, Default::default())
    }

    fn moved(path: &str) -> Disarmed {
        Disarmed {
            path: path.into(),
            moved_to: Some(format!(".palisade-blocked-abcdefgh/{path}.blocked")),
            error: None,
        }
    }

    /// Moved aside: reported, and the program's result stands. Still in place: the run fails
    /// (`protection-failed`, exit 125), the program's own code kept in `exit_code`.
    #[test]
    fn a_protected_path_left_in_place_fails_the_run() {
        let p = Protection {
            watched: vec![".envrc".into(), ".git".into()],
            ..Protection::default()
        };
        let mut r = ended(3);
        r.set_protected(&p, vec![moved(".envrc")]);
        assert_eq!((r.status, r.exit_code_for_cli()), (Status::Exit, 3));
        assert!(
            r.summary().contains(
                " · PROTECTED .envrc was created inside: moved to .palisade-blocked-abcdefgh/.envrc.blocked"
            ),
            "{}",
            r.summary()
        );
        let mut r = ended(0);
        let stuck = Disarmed {
            path: ".git".into(),
            moved_to: None,
            error: Some("Operation not permitted (os error 1)".into()),
        };
        r.set_protected(&p, vec![moved(".envrc"), stuck]);
        assert_eq!(r.status, Status::ProtectionFailed);
        assert_eq!(
            (r.exit_code, r.exit_code_for_cli()),
            (Some(0), EXIT_SANDBOX_ERROR)
        );
        assert_eq!(
            r.error.as_deref(),
            Some("created inside at a protected path and could NOT be moved aside, still in place: .git")
        );
        let s = r.summary();
        assert!(
            s.starts_with("palisade: PROTECTION FAILED (exit 125; the program's exit 0) · ")
                && s.contains(" · PROTECTED .git was created inside and could NOT be moved aside: Operation not permitted (os error 1)"),
            "{s}"
        );
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["status"], "protection-failed");
        assert_eq!(
            j["protected"]["blocked"][1]["moved_to"],
            serde_json::Value::Null
        );
    }
}

/// The status decision and the figures, as whole values: [`Report::from_outcome`] and
/// [`Report::from_error`], then [`Report::set_cgroup`], from made-up outcomes and cgroup
/// accounting. Each test compares the whole report (as JSON) with what it expects, apart from the
/// layers' prose: of the layers, only the two that `set_cgroup` decides are compared, by name and
/// whether enforced.
#[cfg(test)]
mod tests {
    use super::*;
    use palisade_cgroup::{CgroupStats, CpuUsage};
    use palisade_linux::DeniedCall;
    use serde_json::{json, Value};
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ids() -> Ids {
        Ids {
            uid: 1000,
            gid: 1000,
            host_uid: 1234,
            host_gid: 1234,
            privileged: false,
        }
    }

    fn landlock() -> LandlockState {
        LandlockState::Enforced {
            abi: 6,
            handled_fs: 0,
            handled_net: 0,
            scoped: 0,
            rules: 3,
            ports: Vec::new(),
            debug_unlandlocked: None,
        }
    }

    /// A 2 s CPU-time limit: RLIMIT_CPU is then 3 s, and 80 % of it 2400 ms.
    fn limits() -> palisade_policy::Limits {
        palisade_policy::Limits {
            cpu_time_ms: Some(2000),
            ..Default::default()
        }
    }

    /// A run that ended with `termination`, palisade having killed it for `limit` (or not).
    /// Times are binary fractions of a second, exact in floating point.
    fn outcome(limit: Option<LimitHit>, termination: Termination) -> Outcome {
        Outcome {
            termination,
            limit_hit: limit,
            output_truncated: false,
            wall: ms(1500),
            user_cpu: ms(500),
            system_cpu: ms(125),
            max_rss: 8 << 20,
            stdout_bytes: 5,
            stderr_bytes: 2,
            cpu_watch_lost: false,
            denied: Vec::new(),
            cancelled: false,
            supervisor_cpu: ms(0),
            refusals_throttled: 0,
            attempts: Vec::new(),
            attempts_dropped: 0,
            made_no_socket: false,
        }
    }

    /// cgroup v1 accounting: more CPU than init's rusage, as it counts processes the kernel
    /// reaped at a kill.
    fn stats() -> CgroupStats {
        CgroupStats {
            memory_peak: Some(32 << 20),
            oom_kills: 0,
            pids_peak: Some(3),
            cpu_quota_us: None,
            cpu: Some(CpuUsage {
                user: ms(750),
                system: ms(250),
            }),
            socket_memory_peak: None,
        }
    }

    /// `from_outcome` then `set_cgroup`, as `Sandbox::run` calls them.
    fn report(o: &Outcome, s: CgroupStats) -> Report {
        let mut r = Report::from_outcome(o, ids(), &landlock(), None, limits());
        r.set_cgroup(Some("v1"), s, None, &[]);
        r
    }

    /// The report as JSON, the layers cut to `[name, enforced]` of the two `set_cgroup` decides.
    fn value(r: &Report) -> Value {
        let mut v = serde_json::to_value(r).unwrap();
        let decided: Vec<Value> = r
            .layers
            .iter()
            .filter(|l| ["cgroup-limits", "cpu-time-limit"].contains(&l.name))
            .map(|l| json!([l.name, l.enforced]))
            .collect();
        v["layers"] = Value::Array(decided);
        v
    }

    /// `base` with the keys of `changes` replaced.
    fn with(mut base: Value, changes: Value) -> Value {
        for (k, v) in changes.as_object().unwrap() {
            assert!(base.get(k).is_some(), "no field {k} in the report");
            base[k] = v.clone();
        }
        base
    }

    /// The fixture's run, ended `ok`, with the cgroup's accounting.
    fn ok() -> Value {
        let network = json!({
            "mode": "none", "events": [], "allowed": 0, "denied": 0, "dropped": 0,
            "refused_connections": 0, "cut_connections": 0, "took_connections": 0,
            "paced_connections": 0, "notify_suppressed": 0, "supervisor_cpu_ms": 0,
        });
        json!({
            "status": "ok",
            "exit_code": 0,
            "signal": null,
            "signal_name": null,
            "error": null,
            "error_kind": null,
            "error_step": null,
            "wall_time_ms": 1500.0,
            "cpu_user_ms": 750.0,
            "cpu_system_ms": 250.0,
            "supervisor_cpu_ms": 0.0,
            "refusals_throttled": 0,
            "max_rss_bytes": 8 << 20,
            "stdout_bytes": 5,
            "stderr_bytes": 2,
            "output_truncated": false,
            "limits": limits(),
            "memory_peak_bytes": 32 << 20,
            "socket_memory_peak_bytes": null,
            "oom_kills": 0,
            "pids_peak": 3,
            "cpus": null,
            "cgroup": "v1",
            "landlock_abi": 6,
            "denied_syscalls": [],
            "uid": 1000,
            "host_uid": 1234,
            "scratch": null,
            "layers": [["cgroup-limits", true], ["cpu-time-limit", true]],
            "engine": null,
            "network": network,
            "protected": {"read_only": [], "pinned": [], "watched": [], "derived": [], "not_followed": [], "blocked": []},
        })
    }

    /// The summary line's tail for the fixture's figures (cgroup CPU).
    const FIGURES: &str = "1500.0 ms · cpu 1000.0 ms · rss 8.0 MiB · out 5 B · err 2 B";

    #[test]
    fn exit_code_0_is_ok_with_the_cgroups_figures() {
        let r = report(&outcome(None, Termination::Exited(0)), stats());
        assert_eq!(value(&r), ok());
        assert_eq!(r.exit_code_for_cli(), 0);
        assert_eq!(r.summary(), format!("palisade: ok · exit 0 · {FIGURES}"));
    }

    #[test]
    fn without_cgroup_accounting_the_figures_are_init_rusage() {
        let s = CgroupStats {
            cpu: None,
            ..stats()
        };
        let r = report(&outcome(None, Termination::Exited(0)), s);
        let want = with(
            ok(),
            json!({
                "cpu_user_ms": 500.0,
                "cpu_system_ms": 125.0,
                "layers": [["cgroup-limits", true], ["cpu-time-limit", false]],
            }),
        );
        assert_eq!(value(&r), want);
    }

    #[test]
    fn a_workspace_whose_changes_were_lost_fails_the_run_and_keeps_the_programs_result() {
        use crate::workspace::WorkspaceReport;
        let mut r = report(&outcome(None, Termination::Exited(0)), stats());
        r.set_workspace(WorkspaceReport {
            dir: "/p".into(),
            change_set: Some("20261204-000000-abcdef".into()),
            ..WorkspaceReport::default()
        });
        assert_eq!((r.status, r.exit_code_for_cli()), (Status::Ok, 0));
        assert!(
            r.summary().contains("workspace 20261204-000000-abcdef"),
            "{}",
            r.summary()
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["workspace"]["change_set"], "20261204-000000-abcdef");
        let mut r = report(&outcome(None, Termination::Exited(0)), stats());
        r.set_workspace(WorkspaceReport {
            dir: "/p".into(),
            error: Some("the workspace's changes could not be kept: disk full".into()),
            ..WorkspaceReport::default()
        });
        assert_eq!(r.status, Status::SandboxError);
        assert_eq!(r.exit_code_for_cli(), EXIT_SANDBOX_ERROR);
        assert_eq!(r.error_kind, Some("workspace"));
        assert_eq!(
            r.error.as_deref(),
            Some("the workspace's changes could not be kept: disk full (the program had ended: exit 0)")
        );
        // Without a workspace the report has no such key at all.
        let plain =
            serde_json::to_value(report(&outcome(None, Termination::Exited(0)), stats())).unwrap();
        assert!(plain.get("workspace").is_none());
    }

    #[test]
    fn a_non_zero_exit_code_is_exit_and_passes_through() {
        let mut o = outcome(None, Termination::Exited(3));
        o.denied = vec![
            DeniedCall {
                name: "ptrace".into(),
                count: 2,
                first_pid: 7,
                errno: libc::EPERM,
            },
            DeniedCall {
                name: "socket (netlink)".into(),
                count: 1,
                first_pid: 9,
                errno: libc::EAFNOSUPPORT,
            },
        ];
        let s = CgroupStats {
            cpu_quota_us: Some(50_000),
            ..stats()
        };
        let r = report(&o, s);
        let want = with(
            ok(),
            json!({
                "status": "exit",
                "exit_code": 3,
                "cpus": 0.5,
                "denied_syscalls": [
                    {"name": "ptrace", "count": 2, "first_pid": 7, "errno": "EPERM"},
                    {"name": "socket (netlink)", "count": 1, "first_pid": 9, "errno": "EAFNOSUPPORT"},
                ],
            }),
        );
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), 3);
        assert_eq!(
            r.summary(),
            format!("palisade: exit 3 · {FIGURES} · refused: ptrace×2, socket (netlink)×1")
        );
    }

    #[test]
    fn a_signal_is_signal_with_its_name_and_128_plus() {
        let r = report(
            &outcome(None, Termination::Signaled(libc::SIGSEGV)),
            stats(),
        );
        let want = with(
            ok(),
            json!({"status": "signal", "exit_code": null, "signal": 11, "signal_name": "SIGSEGV"}),
        );
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), 128 + 11);
        assert_eq!(
            r.summary(),
            format!("palisade: killed by signal 11 (SIGSEGV) · {FIGURES}")
        );
    }

    #[test]
    fn the_deadline_is_timeout_whatever_the_payload_did_meanwhile() {
        let want = with(ok(), json!({"status": "timeout", "exit_code": null}));
        // Init dies first at the kill; or the payload exited just as the deadline passed.
        for t in [Termination::Vanished, Termination::Exited(0)] {
            let r = report(&outcome(Some(LimitHit::Timeout), t), stats());
            assert_eq!(value(&r), want, "{t:?}");
            assert_eq!(r.exit_code_for_cli(), EXIT_LIMIT);
            assert_eq!(
                r.summary(),
                format!("palisade: timeout after 600000 ms: killed · {FIGURES}")
            );
        }
    }

    #[test]
    fn the_supervisors_cpu_watch_is_cpu_timeout() {
        let r = report(
            &outcome(Some(LimitHit::CpuTime), Termination::Vanished),
            stats(),
        );
        let want = with(ok(), json!({"status": "cpu-timeout", "exit_code": null}));
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), EXIT_LIMIT);
        assert_eq!(
            r.summary(),
            format!("palisade: CPU time limit of 2000 ms used up: killed · {FIGURES}")
        );
    }

    /// Without the cgroup's watch, RLIMIT_CPU (soft 3 s here) stops the payload: SIGXCPU is the
    /// CPU limit whatever the tick-sampled figure says; a SIGKILL counts with at least 80 % of
    /// the soft limit used (2400 ms), less does not.
    #[test]
    fn a_kill_at_80_percent_of_rlimit_cpu_is_cpu_timeout_without_the_cgroups_watch() {
        let waived = |status: &str, sig: i32, cpu: f64| {
            with(
                ok(),
                json!({
                    "status": status,
                    "exit_code": null,
                    "signal": sig,
                    "signal_name": signal_name(sig),
                    "cpu_user_ms": cpu,
                    "cpu_system_ms": 0.0,
                    "memory_peak_bytes": null,
                    "pids_peak": null,
                    "cgroup": null,
                    "layers": [["cgroup-limits", false], ["cpu-time-limit", false]],
                }),
            )
        };
        let r = unwatched(libc::SIGKILL, 2400);
        assert_eq!(value(&r), waived("cpu-timeout", libc::SIGKILL, 2400.0));
        assert_eq!(r.exit_code_for_cli(), EXIT_LIMIT);
        assert_eq!(
            r.summary(),
            "palisade: CPU time limit of 2000 ms used up: killed · 1500.0 ms · cpu 2400.0 ms · \
             rss 8.0 MiB · out 5 B · err 2 B"
        );
        assert_eq!(
            value(&unwatched(libc::SIGXCPU, 2500)),
            waived("cpu-timeout", libc::SIGXCPU, 2500.0)
        );
        // The kernel's tick-sampled count runs ahead on a busy machine: a SIGXCPU at 1557 ms.
        assert_eq!(
            value(&unwatched(libc::SIGXCPU, 1557)),
            waived("cpu-timeout", libc::SIGXCPU, 1557.0)
        );
        assert_eq!(
            value(&unwatched(libc::SIGKILL, 2375)),
            waived("signal", libc::SIGKILL, 2375.0)
        );
        // Another signal is the payload's own death, however much CPU it used.
        assert_eq!(
            value(&unwatched(libc::SIGTERM, 2500)),
            waived("signal", libc::SIGTERM, 2500.0)
        );
    }

    /// A payload that died of `sig` after `cpu` ms of CPU (user time, in init's rusage), in a run
    /// whose cgroup layer was waived.
    fn unwatched(sig: i32, cpu: u64) -> Report {
        let o = Outcome {
            user_cpu: ms(cpu),
            system_cpu: Duration::ZERO,
            ..outcome(None, Termination::Signaled(sig))
        };
        let mut r = Report::from_outcome(&o, ids(), &landlock(), None, limits());
        r.set_cgroup(
            None,
            CgroupStats::default(),
            Some("no cgroup here".into()),
            &[],
        );
        r
    }

    #[test]
    fn with_the_cgroups_watch_a_sigkill_is_not_taken_for_the_cpu_limit_unless_the_watch_was_lost() {
        let heavy = CgroupStats {
            cpu: Some(CpuUsage {
                user: ms(2500),
                system: Duration::ZERO,
            }),
            ..stats()
        };
        let killed = outcome(None, Termination::Signaled(libc::SIGKILL));
        // The watch held: it would have said so; a SIGKILL is someone else's.
        let r = report(&killed, heavy);
        let want = with(
            ok(),
            json!({
                "status": "signal",
                "exit_code": null,
                "signal": 9,
                "signal_name": "SIGKILL",
                "cpu_user_ms": 2500.0,
                "cpu_system_ms": 0.0,
            }),
        );
        assert_eq!(value(&r), want);
        // The watch was lost during the run: RLIMIT_CPU was the wall, and the layer says so.
        let r = report(
            &Outcome {
                cpu_watch_lost: true,
                ..killed
            },
            heavy,
        );
        let want = with(
            want,
            json!({
                "status": "cpu-timeout",
                "layers": [["cgroup-limits", true], ["cpu-time-limit", false]],
            }),
        );
        assert_eq!(value(&r), want);
    }

    #[test]
    fn a_kill_with_an_oom_kill_in_the_cgroup_is_oom() {
        let s = CgroupStats {
            oom_kills: 1,
            memory_peak: Some(64 << 20),
            ..stats()
        };
        let oom = with(
            ok(),
            json!({
                "status": "oom",
                "exit_code": null,
                "oom_kills": 1,
                "memory_peak_bytes": 64 << 20,
            }),
        );
        let r = report(&outcome(None, Termination::Signaled(libc::SIGKILL)), s);
        assert_eq!(
            value(&r),
            with(oom.clone(), json!({"signal": 9, "signal_name": "SIGKILL"}))
        );
        assert_eq!(r.exit_code_for_cli(), EXIT_LIMIT);
        assert_eq!(
            r.summary(),
            format!("palisade: out of memory at the 2048 MiB ceiling: killed · {FIGURES}")
        );
        // The OOM killer took init itself: no status came, and that is not a sandbox error.
        let r = report(&outcome(None, Termination::Vanished), s);
        assert_eq!(value(&r), oom);
        // A process of the sandbox was killed, but the payload exited on its own: its result.
        let r = report(&outcome(None, Termination::Exited(1)), s);
        assert_eq!(
            value(&r),
            with(
                ok(),
                json!({"status": "exit", "exit_code": 1, "oom_kills": 1, "memory_peak_bytes": 64 << 20})
            )
        );
    }

    #[test]
    fn the_output_cap_is_output_limit() {
        let mut o = outcome(Some(LimitHit::Output), Termination::Vanished);
        o.output_truncated = true;
        o.stdout_bytes = 64 << 20;
        let r = report(&o, stats());
        let want = with(
            ok(),
            json!({
                "status": "output-limit",
                "exit_code": null,
                "output_truncated": true,
                "stdout_bytes": 64 << 20,
            }),
        );
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), EXIT_LIMIT);
        assert!(
            r.summary()
                .starts_with("palisade: output limit of 67108864 bytes reached: killed · "),
            "{}",
            r.summary()
        );
    }

    #[test]
    fn a_run_the_caller_killed_is_cancelled_unless_a_limit_came_first() {
        let mut o = outcome(None, Termination::Vanished);
        o.cancelled = true;
        o.supervisor_cpu = ms(125);
        o.refusals_throttled = 3;
        let r = report(&o, stats());
        let want = with(
            ok(),
            json!({
                "status": "cancelled",
                "exit_code": null,
                "supervisor_cpu_ms": 125.0,
                "refusals_throttled": 3,
            }),
        );
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), 128 + libc::SIGKILL);
        assert!(
            r.summary()
                .starts_with("palisade: cancelled by the caller: killed · "),
            "{}",
            r.summary()
        );
        // The wait loop never sets both; if a limit was hit, it is the cause.
        let mut o = outcome(Some(LimitHit::Timeout), Termination::Vanished);
        o.cancelled = false;
        assert_eq!(report(&o, stats()).status, Status::Timeout);
    }

    #[test]
    fn init_vanishing_without_a_limit_is_a_sandbox_error() {
        let r = report(&outcome(None, Termination::Vanished), stats());
        let error = "the sandbox's init was killed from outside before the payload ended";
        let want = with(
            ok(),
            json!({"status": "sandbox-error", "exit_code": null, "error": error}),
        );
        assert_eq!(value(&r), want);
        assert_eq!(r.exit_code_for_cli(), EXIT_SANDBOX_ERROR);
        assert_eq!(r.summary(), format!("palisade: sandbox error: {error}"));
    }

    #[test]
    fn a_setup_error_is_a_sandbox_error_with_the_reserved_codes() {
        let exec = |errno: i32| SetupError::Exec {
            program: "/x".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        for (e, code) in [
            (exec(libc::ENOENT), EXIT_NOT_FOUND),
            (exec(libc::ENOTDIR), EXIT_NOT_FOUND),
            (exec(libc::EACCES), EXIT_CANNOT_EXECUTE),
            (SetupError::InitVanished, EXIT_SANDBOX_ERROR),
        ] {
            let r = Report::from_error(&e, ms(250), Some("/tmp/s".into()), limits());
            let want = with(
                ok(),
                json!({
                    "status": "sandbox-error",
                    "exit_code": code,
                    "error": error_chain(&e),
                    "error_kind": e.kind(),
                    "error_step": e.step().map(|s| s.code()),
                    "wall_time_ms": 250.0,
                    "cpu_user_ms": 0.0,
                    "cpu_system_ms": 0.0,
                    "max_rss_bytes": 0,
                    "stdout_bytes": 0,
                    "stderr_bytes": 0,
                    "memory_peak_bytes": null,
                    "pids_peak": null,
                    "cgroup": null,
                    "landlock_abi": null,
                    "uid": null,
                    "host_uid": null,
                    "scratch": "/tmp/s",
                    "layers": [],
                }),
            );
            assert_eq!(value(&r), want, "{e}");
            assert_eq!(r.exit_code_for_cli(), code, "{e}");
            // Nothing ran: no layer may claim to have held.
            assert!(r.layers.iter().all(|l| !l.enforced), "{:?}", r.layers);
        }
    }
}
