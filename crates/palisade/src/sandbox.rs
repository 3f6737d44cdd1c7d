//! The library entry point: build a policy, start it, hold the [`Run`], get a [`Report`].
//!
//! Each run is supervised by a thread of its own, which lives exactly as long as the run: it
//! creates the sandbox (so the sandbox's parent-death signal is tied to it, not to a caller's
//! thread that may be retired from a pool), serves its egress proxy, enforces its deadlines and
//! ceilings, and cleans up. The caller holds a [`Run`]: it can kill it from any thread, wait for
//! it, poll a descriptor from an event loop, read its output as it comes, and drop it, which
//! kills the sandbox and releases everything it held.

use crate::report::Report;
use palisade_cgroup::{CgroupLimits, RunCgroup};
use palisade_linux::host::SignalSource;
use palisade_linux::{CpuWatch, Killer, OutputQueue, Received, SetupError, Watch};
use palisade_policy::Degradable;
use palisade_policy::{Policy, PolicyError, Scratch};
use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A sandbox ready to run: a validated policy plus how to treat the scratch directory. Cheap to
/// clone, `Send` and `Sync`: one `Sandbox` can start any number of runs from any threads.
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
    /// How the run ended.
    pub report: Report,
    /// Everything the payload wrote on stdout (at most the output limit, with stderr).
    pub stdout: Vec<u8>,
    /// Everything it wrote on stderr.
    pub stderr: Vec<u8>,
}

/// What the payload reads on its standard input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Stdin {
    /// `/dev/null`: the default. A library caller's own standard input is never handed to
    /// untrusted code unless it asks for [`Stdin::Inherit`].
    #[default]
    Null,
    /// These bytes, then end of file; written by the supervisor as the payload reads them.
    Bytes(Vec<u8>),
    /// A pipe: take its write end with [`Run::take_stdin`] and write from your own thread;
    /// closing it is the payload's end of file.
    Pipe,
    /// A unix stream socket as the payload's fd 0; take the other end with [`Run::take_stdin`]
    /// (both ways; descriptors can be passed over it).
    Socket,
    /// The caller's own standard input (for a command-line front end). A terminal is relayed
    /// through a pipe, never handed over: the payload cannot write to it or change its modes.
    Inherit,
}

impl From<Stdin> for palisade_linux::Stdin {
    fn from(s: Stdin) -> Self {
        match s {
            Stdin::Null => palisade_linux::Stdin::Null,
            Stdin::Bytes(b) => palisade_linux::Stdin::Bytes(b),
            Stdin::Pipe => palisade_linux::Stdin::Pipe,
            Stdin::Socket => palisade_linux::Stdin::Socket,
            Stdin::Inherit => palisade_linux::Stdin::Inherit,
        }
    }
}

/// How to start one run; `Io::default()` reads nothing and captures the output in memory.
#[derive(Default)]
pub struct Io {
    /// Standard input; `None`: the sandbox's own setting ([`crate::Builder::stdin`], `/dev/null`
    /// unless set).
    pub stdin: Option<Stdin>,
    /// Stream the output: at most this many bytes wait in memory for [`Run::recv_output`] before
    /// the payload is held back (its writes block until the reader catches up; the deadline
    /// still runs). `None`: keep all of it (the output limit bounds it) for [`Run::wait_output`].
    pub stream_buffer: Option<usize>,
    /// With a pty (the policy's `tty`): the caller's terminal, relayed into the pty, whose size
    /// the pty takes (the CLI's fd 0). It must stay open until the run ends.
    pub terminal: Option<RawFd>,
    /// Signals to forward to the payload (see [`crate::term::ForwardedSignals`]).
    pub signals: Option<SignalSource>,
}

/// Which stream a chunk of output came from.
pub use palisade_linux::Stream;

/// A chunk from [`Run::recv_output`].
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes the payload wrote.
    Data(Stream, Vec<u8>),
    /// Nothing arrived within the wait.
    Timeout,
    /// The run is over and all its output was read.
    End,
}

/// A started run. Dropping it kills the sandbox and waits for its cleanup, so nothing of it is
/// left behind: processes, cgroup, proxy threads, listeners, temporary directories.
pub struct Run {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `None` only for a run that could not even start its thread.
    output: Option<Arc<OutputQueue>>,
    killer: Option<Killer>,
    stdin: Option<File>,
    report: Option<Report>,
}

/// What the run's thread and the [`Run`] share.
struct Shared {
    report: Mutex<Option<Report>>,
    done: Condvar,
    /// Readable once the report is ready; `None` for a run over before it started.
    done_fd: Option<OwnedFd>,
}

/// Sent by the run's thread once the sandbox is started (or failed to start).
struct Started {
    killer: Option<Killer>,
    stdin: Option<File>,
}

impl Run {
    /// Kills the sandbox from any thread (see [`Run::killer`]); the report's status becomes
    /// `cancelled` unless it had already ended. Returns at once; [`Run::wait`] for the report.
    pub fn kill(&self) {
        if let Some(k) = &self.killer {
            k.kill();
        }
    }

    /// A handle that kills this run from any thread, also after the `Run` moved elsewhere.
    pub fn killer(&self) -> Option<RunKiller> {
        self.killer.clone().map(RunKiller)
    }

    /// A descriptor that becomes readable once the run is over and its report is ready: for an
    /// event loop (e.g. tokio's `AsyncFd`), then [`Run::try_wait`]. `None` when the run never
    /// started (its report is ready at once).
    pub fn done_fd(&self) -> Option<BorrowedFd<'_>> {
        self.shared.done_fd.as_ref().map(|f| f.as_fd())
    }

    /// The report if the run is over, without waiting.
    pub fn try_wait(&mut self) -> Option<&Report> {
        if self.report.is_none() {
            let r = self
                .shared
                .report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(r) = r {
                self.join();
                self.report = Some(r);
            }
        }
        self.report.as_ref()
    }

    /// Waits for the run to end and returns its report. Output not read yet stays readable with
    /// [`Run::recv_output`] until the `Run` is dropped; see [`Run::wait_output`] to get it.
    pub fn wait(&mut self) -> Report {
        if let Some(r) = &self.report {
            return r.clone();
        }
        let mut g = self.shared.report.lock().unwrap_or_else(|p| p.into_inner());
        while g.is_none() {
            g = self.shared.done.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        let r = g.take().expect("the report is there");
        drop(g);
        self.join();
        self.report = Some(r.clone());
        r
    }

    /// Waits for the end and returns the report with the output not read yet (all of it with
    /// `stream_buffer: None`).
    pub fn wait_output(mut self) -> Output {
        let report = self.wait();
        let (stdout, stderr) = self
            .output
            .as_ref()
            .map(|o| o.take_all())
            .unwrap_or_default();
        Output {
            report,
            stdout,
            stderr,
        }
    }

    /// The next chunk of output, waiting at most `wait` (`None`: until one comes or the run is
    /// over and drained).
    pub fn recv_output(&self, wait: Option<Duration>) -> Chunk {
        match self.output.as_ref().map(|o| o.recv(wait)) {
            Some(Received::Chunk(s, d)) => Chunk::Data(s, d),
            Some(Received::Timeout) => Chunk::Timeout,
            Some(Received::Closed) | None => Chunk::End,
        }
    }

    /// The write end of the payload's stdin ([`Stdin::Pipe`]), once.
    pub fn take_stdin(&mut self) -> Option<File> {
        self.stdin.take()
    }

    fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.report.is_none() {
            self.kill();
            // Output nobody will read must not hold the payload back while it dies.
            if let Some(o) = &self.output {
                let _ = o.take_all();
            }
        }
        self.stdin = None;
        self.join();
    }
}

/// Kills a run from any thread; see [`Run::killer`].
#[derive(Clone)]
pub struct RunKiller(Killer);

impl RunKiller {
    /// Kills the sandbox; the run ends as `cancelled` unless it had already ended.
    pub fn kill(&self) {
        self.0.kill();
    }
}

impl Sandbox {
    /// Starts a builder.
    pub fn builder() -> crate::Builder {
        crate::Builder::default()
    }

    /// A sandbox for a policy built elsewhere (validated again here; bound it first with
    /// [`Policy::check_within`] if someone else wrote it).
    pub fn from_policy(policy: Policy) -> Result<Sandbox, PolicyError> {
        policy.validate()?;
        Ok(Sandbox {
            keep: policy.keep_scratch,
            policy,
            stdin: Stdin::Null,
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

    /// Runs to completion, capturing stdout and stderr in memory (at most the output limit).
    pub fn output(&self) -> Output {
        self.start(Io::default()).wait_output()
    }

    /// Runs to completion, writing the output to `stdout` and `stderr` from the calling thread
    /// as it comes (a slow writer holds the payload back, never its deadline).
    pub fn run_to(&self, stdout: &mut impl Write, stderr: &mut impl Write) -> Report {
        let mut run = self.start(Io {
            stream_buffer: Some(STREAM_BUFFER),
            ..Io::default()
        });
        loop {
            match run.recv_output(None) {
                Chunk::Data(Stream::Stdout, d) => {
                    let _ = stdout.write_all(&d).and_then(|_| stdout.flush());
                }
                Chunk::Data(Stream::Stderr, d) => {
                    let _ = stderr.write_all(&d).and_then(|_| stderr.flush());
                }
                Chunk::Timeout => {}
                Chunk::End => break,
            }
        }
        run.wait()
    }

    /// Starts a run and returns once its payload has started (or the start failed: the run's
    /// report is then ready at once, with status `sandbox-error`). A failure of palisade is
    /// never reported as the payload's result.
    ///
    /// ```
    /// use palisade::{Chunk, Io, Sandbox, Status, Stdin, Stream};
    ///
    /// let sandbox = Sandbox::builder().command(["cat"]).build().unwrap();
    /// let mut run = sandbox.start(Io { stdin: Some(Stdin::Bytes(b"hi\n".to_vec())), ..Io::default() });
    /// let out = run.wait_output();
    /// assert_eq!(out.report.status, Status::Ok);
    /// assert_eq!(out.stdout, b"hi\n");
    /// ```
    pub fn start(&self, io: Io) -> Run {
        let done_fd = match palisade_linux::host::event_fd() {
            Ok(fd) => fd,
            Err(e) => return failed_run(self, e),
        };
        let output = match OutputQueue::new(io.stream_buffer.unwrap_or(usize::MAX)) {
            Ok(q) => Arc::new(q),
            Err(e) => return failed_run(self, e),
        };
        let shared = Arc::new(Shared {
            report: Mutex::new(None),
            done: Condvar::new(),
            done_fd: Some(done_fd),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel::<Started>(1);
        let sandbox = self.clone();
        let (sh, out) = (shared.clone(), output.clone());
        let thread = std::thread::Builder::new()
            .name("palisade-run".into())
            .spawn(move || {
                let limits = sandbox.policy.limits;
                // A bug that panics here must still end the run with a report (built with
                // `panic = "unwind"`; the release profile aborts instead): whoever waits for the
                // run would otherwise wait for ever. Dropping the unwound state kills the sandbox.
                let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    sandbox.supervise(io, &out, &tx)
                }))
                .unwrap_or_else(|p| {
                    out.close();
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    let e = SetupError::Supervisor {
                        op: "supervise the run",
                        source: std::io::Error::other(format!("palisade panicked: {what}")),
                    };
                    Report::from_error(&e, Duration::ZERO, None, limits)
                });
                *sh.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
                sh.done.notify_all();
                if let Some(fd) = &sh.done_fd {
                    palisade_linux::host::signal_event(fd);
                }
            });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => return failed_run(self, e),
        };
        let started = rx.recv().unwrap_or(Started {
            killer: None,
            stdin: None,
        });
        Run {
            shared,
            thread: Some(thread),
            output: Some(output),
            killer: started.killer,
            stdin: started.stdin,
            report: None,
        }
    }

    /// The run's thread: sets the sandbox up, tells `started`, supervises it to the end, cleans
    /// up and returns the report.
    fn supervise(
        &self,
        io: Io,
        output: &OutputQueue,
        started: &std::sync::mpsc::SyncSender<Started>,
    ) -> Report {
        let tell = |k: Option<Killer>, s: Option<File>| {
            let _ = started.send(Started {
                killer: k,
                stdin: s,
            });
        };
        let t0 = Instant::now();
        let mut policy = self.policy.clone();
        let mut kept: Option<PathBuf> = None;
        // The scratch size caps the ephemeral tmpfs only: a host directory (--scratch, --keep)
        // lives on the host's disk, where palisade has no size to enforce. Refused rather than
        // silently ignored (audit F14).
        let host_scratch = self.keep || matches!(policy.scratch, Scratch::Host { .. });
        if host_scratch
            && policy.limits.scratch_bytes != palisade_policy::Limits::default().scratch_bytes
        {
            tell(None, None);
            output.close();
            let e = SetupError::Supervisor {
                op: "check limits.scratch_size",
                source: std::io::Error::other(
                    "limits.scratch_size caps the ephemeral scratch tmpfs only; with a host scratch directory (filesystem.scratch, or filesystem.keep_scratch) it cannot be enforced: drop it, or drop the host directory",
                ),
            };
            return Report::from_error(&e, t0.elapsed(), None, policy.limits);
        }
        if self.keep && policy.scratch == Scratch::Ephemeral {
            match make_temp_dir() {
                Ok(d) => {
                    policy.scratch = Scratch::Host { path: d.clone() };
                    kept = Some(d);
                }
                Err(source) => {
                    tell(None, None);
                    output.close();
                    let e = SetupError::Supervisor {
                        op: "create the scratch directory",
                        source,
                    };
                    return Report::from_error(&e, t0.elapsed(), None, policy.limits);
                }
            }
        }
        let fail = |e: &SetupError, scratch: Option<String>| {
            if let Some(d) = &kept {
                let _ = std::fs::remove_dir(d);
            }
            tell(None, None);
            output.close();
            Report::from_error(e, t0.elapsed(), scratch, policy.limits)
        };
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
                    let msg = format!(
                        "{e}; or add `cgroup` to layers.allow_degraded to run with rlimits only"
                    );
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
                    return fail(&e, scratch);
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
        // What the proxy needs before the sandbox exists: the run's CA (its key stays in this
        // process), whose certificate the view trusts, and the secrets' placeholders.
        let prepared = match palisade_net::Prepared::new(&policy.network) {
            Ok(p) => p,
            Err(e) => {
                let e = SetupError::Supervisor {
                    op: "prepare TLS inspection and secrets",
                    source: std::io::Error::other(e.to_string()),
                };
                return fail(&e, scratch);
            }
        };
        let extras = palisade_linux::Extras {
            trust: prepared.ca_pem().map(str::to_owned),
            env: prepared.placeholders(),
        };
        let stdin = io.stdin.clone().unwrap_or_else(|| self.stdin.clone());
        let mut running =
            match palisade_linux::spawn_with(&policy, stdin.into(), Some(&prepare), &extras) {
                Ok(r) => r,
                Err(e) => return fail(&e, scratch),
            };
        // The egress proxy, on the listeners init made inside the sandbox's network namespace
        // (without egress, the DNS stub alone: it refuses every name and counts it).
        let socks: Vec<(palisade_net::Role, std::os::fd::OwnedFd)> = running
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
        let egress = if socks.is_empty() {
            None
        } else {
            // Without egress there are no decisions to tell, only attempts for the report.
            let notify = self
                .net_notify
                .clone()
                .filter(|_| policy.network.enabled())
                .map(|f| Box::new(move |e: &palisade_net::Event| f(e)) as palisade_net::Notify);
            match palisade_net::Egress::start_prepared(
                policy.network.clone(),
                socks,
                notify,
                prepared,
            ) {
                Ok(e) => Some(e),
                Err(source) => {
                    running.kill();
                    drop(running);
                    let e = SetupError::Supervisor {
                        op: "start the egress proxy",
                        source,
                    };
                    return fail(&e, scratch);
                }
            }
        };
        tell(Some(running.killer()), running.take_stdin());
        if let (Some(pty), Some(t)) = (running.pty(), io.terminal) {
            palisade_linux::host::copy_winsize(t, pty);
        }
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
            .map(|q| q as f64 / palisade_cgroup::CPU_PERIOD_US as f64);
        // The proxy's threads' CPU for this sandbox, charged to its CPU-time limit with the rest.
        let proxy_cpu = || egress.as_ref().map_or(Duration::ZERO, |e| e.cpu_used());
        let watch = Watch {
            output,
            cpu: manager.as_ref().map(|_| CpuWatch {
                used: &used,
                supervisor: egress.as_ref().map(|_| &proxy_cpu as &dyn Fn() -> Duration),
                cpus: (palisade_linux::host::cpus() as f64).min(quota.unwrap_or(f64::MAX)),
            }),
            terminal: io.terminal,
            signals: io.signals.as_ref(),
            refusal_share: quota.unwrap_or(1.0).min(1.0),
        };
        let mut attempts = (Vec::new(), 0);
        let mut report = match running.wait(watch) {
            Ok(mut o) => {
                attempts = (std::mem::take(&mut o.attempts), o.attempts_dropped);
                Report::from_outcome(&o, ids, &landlock, scratch, policy.limits)
            }
            Err(e) => {
                output.close();
                Report::from_error(&e, t0.elapsed(), scratch, policy.limits)
            }
        };
        // The sandbox is gone (init's end kills every process in it): whatever appeared at a
        // protected path that did not exist at the start is moved aside, never left to run later.
        // First, before anything else the supervisor does for the report, so that nothing that
        // could fail on the way (the proxy's log, a short supply of memory) can leave it armed.
        let disarmed = palisade_linux::host::disarm_all(&protection);
        let mut cgroup = cgroup.into_inner();
        let stats = cgroup.as_ref().map(|c| c.stats()).unwrap_or_default();
        if let Some(c) = cgroup.as_mut() {
            let _ = c.remove();
        }
        let version = cgroup.as_ref().and(manager.as_ref()).map(|m| m.version());
        let gaps = cgroup
            .as_ref()
            .map(|c| c.gaps().to_vec())
            .unwrap_or_default();
        report.set_cgroup(version, stats, waived, &gaps);
        if policy.allow_ptrace {
            report.note_ptrace_allowed();
        }
        match egress {
            Some(e) if policy.network.enabled() => report.set_network(e.finish(), &policy.network),
            Some(e) => report.set_attempts(e.finish(), attempts.0, attempts.1),
            None => report.set_attempts(palisade_net::NetLog::default(), attempts.0, attempts.1),
        }
        report.set_protected(&protection, disarmed);
        report
    }
}

/// Output kept in memory for a streaming reader before the payload is held back.
pub(crate) const STREAM_BUFFER: usize = 1 << 20;

/// A run that never started: its report says why.
fn failed_run(sandbox: &Sandbox, e: std::io::Error) -> Run {
    let e = SetupError::Supervisor {
        op: "start the run's supervising thread",
        source: e,
    };
    let report = Report::from_error(&e, Duration::ZERO, None, sandbox.policy.limits);
    Run {
        shared: Arc::new(Shared {
            report: Mutex::new(None),
            done: Condvar::new(),
            done_fd: None,
        }),
        thread: None,
        output: None,
        killer: None,
        stdin: None,
        report: Some(report),
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
