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
    /// palisade failed; the program's result is unknown (or it never ran).
    SandboxError,
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
    pub name: &'static str,
    pub enforced: bool,
    pub detail: String,
}

/// Everything palisade knows about one run. Serialized as the `--json` report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub status: Status,
    /// The payload's exit code (`exit`, `ok`).
    pub exit_code: Option<i32>,
    /// The signal that killed the payload (`signal`).
    pub signal: Option<i32>,
    pub signal_name: Option<&'static str>,
    /// What failed, for `sandbox-error`.
    pub error: Option<String>,
    pub wall_time_ms: f64,
    /// CPU time of every process of the sandbox: from the cgroup where it accounts CPU (which
    /// includes processes the kernel reaped at a kill), else from `wait4` on init.
    pub cpu_user_ms: f64,
    pub cpu_system_ms: f64,
    /// Peak resident set of the largest process.
    pub max_rss_bytes: u64,
    /// Bytes relayed (at most the output cap in all).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Output beyond the cap was discarded.
    pub output_truncated: bool,
    /// The ceilings in force.
    pub limits: palisade_policy::Limits,
    /// Peak memory of the whole sandbox (cgroup accounting), in bytes.
    pub memory_peak_bytes: Option<u64>,
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
    pub uid: Option<u32>,
    pub host_uid: Option<u32>,
    /// Host path of the scratch directory, when it is one (`--scratch` or `--keep`).
    pub scratch: Option<String>,
    pub layers: Vec<Layer>,
    /// Egress: `none`, or `allow-list` with every decision of the proxy and DNS stub.
    pub network: Network,
    /// Protected paths under a host scratch directory: what was kept read-only, and anything the
    /// code created at a protected path, moved aside after the run.
    pub protected: Protected,
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
            Status::SandboxError => self.exit_code.unwrap_or(EXIT_SANDBOX_ERROR),
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
            wall_time_ms: wall.as_secs_f64() * 1000.0,
            cpu_user_ms: 0.0,
            cpu_system_ms: 0.0,
            max_rss_bytes: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            output_truncated: false,
            limits: limits.resolved(),
            memory_peak_bytes: None,
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
            cpu_watch_lost: false,
            denied_syscalls: Vec::new(),
            network: Network::default(),
            protected: Protected::default(),
        }
    }

    /// Records the protected paths, and what was moved aside after the run.
    pub(crate) fn set_protected(
        &mut self,
        p: &palisade_linux::plan::Protection,
        blocked: Vec<Blocked>,
    ) {
        self.protected = Protected {
            read_only: p.read_only.clone(),
            pinned: p.pinned.clone(),
            watched: p.watched.clone(),
            blocked,
        };
    }

    /// Records the egress proxy's decisions (with allow rules), and says so in the network layer.
    pub(crate) fn set_network(
        &mut self,
        log: palisade_net::NetLog,
        net: &palisade_policy::net::Network,
    ) {
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
            notify_suppressed: log.notify_suppressed,
            supervisor_cpu_ms: log.supervisor_cpu_ms,
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
    ) {
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
        // SIGKILL at its hard limit (SIGXCPU first if the code lowered its soft limit). Only then,
        // and only with about that much CPU used, is a SIGKILL taken for it ("about": wait4's times
        // are tick-sampled estimates, while the kernel checks the limit on its exact runtime; seen
        // 1951 ms for a kill at 2 s, and 1772 ms on a loaded 2-CPU machine).
        let rlimit_ms = self.limits.cpu_time_ms.map_or(u64::MAX, |l| {
            palisade_linux::plan::rlimit_cpu_secs(std::time::Duration::from_millis(l)) * 1000
        });
        if (stats.cpu.is_none() || self.cpu_watch_lost)
            && self.status == Status::Signal
            && matches!(self.signal, Some(libc::SIGKILL) | Some(libc::SIGXCPU))
            && self.cpu_user_ms + self.cpu_system_ms >= rlimit_ms as f64 * 0.8
        {
            self.status = Status::CpuTimeout;
        }
        let layer = match (version, waived) {
            (Some(v), _) => Layer {
                name: "cgroup-limits",
                enforced: true,
                detail: format!(
                    "cgroup {v}: memory {} bytes (swap off), pids {}, {}",
                    self.limits.memory_bytes,
                    self.limits.pids,
                    match self.cpus {
                        Some(c) => format!("cpu quota {c} CPUs"),
                        None if self.limits.cpu_milli.is_some() => {
                            "no cpu controller for palisade on this host: no cpu quota".to_owned()
                        }
                        None => "no cpu quota (--cpus sets one)".to_owned(),
                    }
                ),
            },
            (None, Some(why)) => Layer {
                name: "cgroup-limits",
                enforced: false,
                detail: format!("waived with --allow-degraded cgroup: {why}"),
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
            Status::SandboxError => {
                return format!(
                    "palisade: sandbox error: {}",
                    self.error.as_deref().unwrap_or("unknown")
                )
            }
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
    /// Did not exist at the start; looked at after the run.
    pub watched: Vec<String>,
    /// Watched paths the code created, and where they were moved.
    pub blocked: Vec<Blocked>,
}

/// A protected path the code created during the run.
#[derive(Debug, Clone, Serialize)]
pub struct Blocked {
    pub path: String,
    /// Relative to the scratch directory; `None` if the move failed (then `error` says why).
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
    /// Connections the proxy closed at once, past its cap on open connections.
    pub refused_connections: u64,
    /// Decisions not passed to the `on_net_event` callback (not printed): past its cap.
    pub notify_suppressed: u64,
    /// CPU time the supervisor's proxy threads spent on this sandbox, in milliseconds.
    pub supervisor_cpu_ms: u64,
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
            notify_suppressed: 0,
            supervisor_cpu_ms: 0,
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
    v.push(on("core-dumps", "off (RLIMIT_CORE 0)".into()));
    v.push(on(
        "process-ceiling",
        "RLIMIT_NPROC, counted per user namespace".into(),
    ));
    v.push(on("file-limits", "RLIMIT_NOFILE and RLIMIT_FSIZE".into()));
    v.push(on(
        "seccomp",
        format!(
            "{} system calls refused (io_uring, bpf, ptrace, keyctl, mount API, unshare/setns…), clone with namespace flags, TIOCSTI/TIOCLINUX, socket families but unix/inet/inet6, other ABIs; every refused attempt answered by the supervisor and listed in denied_syscalls",
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
            format!("waived with --allow-degraded landlock: {reason}; the mount view is the only filesystem wall"),
        ),
    };
    Layer {
        name: "landlock",
        enforced,
        detail,
    }
}
