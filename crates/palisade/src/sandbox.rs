//! The library entry point: build a policy, start it, hold the [`Run`], get a [`Report`].
//!
//! Each run is supervised by a thread of its own for as long as the run lasts: it creates the
//! sandbox (so the sandbox's parent-death signal is tied to it, not to a caller's thread that may
//! be retired from a pool of the caller's), serves its egress proxy, enforces its deadlines and
//! ceilings, and cleans up. The thread is the library's: a run's thread that has finished waits
//! for the next run's for a moment (`palisade_linux::pool`), since a new thread costs ~50 µs of CPU
//! here; it ends only with no child left (a run ends with its init reaped). The caller holds a [`Run`]: it can kill it from any thread, wait for
//! it, poll a descriptor from an event loop, read its output as it comes, and drop it, which
//! kills the sandbox and releases everything it held.

use crate::report::Report;
use crate::workspace::{ApplyMode, Retention, Store, WorkspaceReport};
use palisade_cgroup::{CgroupLimits, Manager, RunCgroup};
use palisade_linux::host::SignalSource;
use palisade_linux::{CpuWatch, Killer, OutputQueue, Received, SetupError, Watch};
use palisade_policy::Degradable;
use palisade_policy::{Policy, PolicyError, Scratch};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The runs' supervising threads, kept for the next run (`palisade_linux::pool`).
static RUN_THREADS: palisade_linux::pool::Pool = palisade_linux::pool::Pool::new(c"palisade-run");

/// A sandbox ready to run: a validated policy plus how to treat the scratch directory. Cheap to
/// clone, `Send` and `Sync`: one `Sandbox` can start any number of runs from any threads.
#[derive(Clone)]
pub struct Sandbox {
    /// Shared by clones: a run's thread holds one (a policy holds ~60 strings of protected paths
    /// alone), and a server clones its sandboxes for every request.
    pub(crate) policy: Arc<Policy>,
    pub(crate) keep: bool,
    pub(crate) stdin: Stdin,
    pub(crate) cgroup_root: PathBuf,
    pub(crate) net_notify: Option<NetNotify>,
    pub(crate) workspace: WorkspaceOptions,
    pub(crate) engine: Engine,
    /// The engine `engine` resolves to, found at the first start and kept for the others.
    resolved: Arc<OnceLock<Result<palisade_linux::Engine, String>>>,
    /// The cgroup hierarchy runs are made in, found at the first start that finds one.
    manager: Arc<OnceLock<Arc<dyn Manager>>>,
}

/// How a sandbox's init is started (docs/engine.md). Every engine builds the same boundary; they
/// differ in what they cost and in what of the caller the sandbox's init holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Engine {
    /// The init program named by `PALISADE_INIT` if set (a path that cannot be opened is an
    /// error, never a silent fallback), else this executable if it registered itself with
    /// [`crate::engine::run_if_init`] (the `palisade` binary does), else [`Engine::InProcess`].
    #[default]
    Auto,
    /// A fork-like clone of the calling process: cheapest for a small caller, but the start
    /// costs more the more memory the caller has, and the sandbox's init holds a copy-on-write
    /// image of it until the run ends.
    InProcess,
    /// Palisade's init program at this path (a `palisade` binary), exec'd in the sandbox's new
    /// namespaces: nothing of the caller's memory is copied or kept.
    InitProgram(PathBuf),
}

impl Engine {
    /// What this choice means on this host, now.
    fn resolve(&self) -> Result<palisade_linux::Engine, String> {
        use palisade_linux::InitProgram;
        let open = |p: &std::path::Path, from: &str| {
            InitProgram::open(p)
                .map(palisade_linux::Engine::Exec)
                .map_err(|e| format!("{from} `{}`: {e}", p.display()))
        };
        match self {
            Engine::InProcess => Ok(palisade_linux::Engine::InProcess),
            Engine::InitProgram(p) => open(p, "the init program"),
            Engine::Auto => match std::env::var_os(palisade_linux::engine::INIT_PROGRAM_ENV) {
                Some(p) => open(
                    std::path::Path::new(&p),
                    palisade_linux::engine::INIT_PROGRAM_ENV,
                ),
                None => Ok(InitProgram::registered().map_or(
                    palisade_linux::Engine::InProcess,
                    palisade_linux::Engine::Exec,
                )),
            },
        }
    }
}

/// What a sandbox with a workspace (`filesystem.workspace`) does with its changes.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceOptions {
    /// Where change sets are kept; `None`: [`Store::default_dir`].
    pub store: Option<Store>,
    /// Apply the change set after the run (`run --apply`).
    pub apply: ApplyMode,
    /// How many change sets the store keeps.
    pub retention: Retention,
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
    /// Files to put in the working directory (the scratch directory) before the payload starts:
    /// written by the sandbox's init, inside the boundary, as the sandbox's own user, never
    /// following a symbolic link (see [`FileIn`]). A bad path fails the run before anything starts
    /// (`sandbox-error`, naming `files`).
    pub files: Vec<FileIn>,
}

/// A file given to a run ([`Io::files`]).
pub use palisade_linux::FileIn;
/// Whether files at these paths fit in one run's [`Io::files`] (at most [`MAX_FILES_IN`] of them,
/// their paths and records at most 64 KiB); more go to the sandbox some other way.
pub use palisade_linux::{in_files_fit, MAX_FILES_IN};

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
    thread: Option<palisade_linux::pool::Handle>,
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
    /// The run's cgroup while the run goes on (for [`Run::oom_kills`]); taken by the run's
    /// thread for the report and removed.
    cgroup: Mutex<Option<Box<dyn RunCgroup>>>,
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

    /// The OOM kills the run's cgroup has counted so far, read from the kernel now (a session's
    /// server reads it around each exec); `None` before the cgroup exists, after the run is over
    /// (the report has the total), or without a cgroup (waived with `allow_degraded`).
    pub fn oom_kills(&self) -> Option<u64> {
        self.shared
            .cgroup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.stats().oom_kills)
    }

    /// A cgroup of its own, under the run's, for one program that something inside the sandbox
    /// starts on the caller's behalf (a session's exec, through its agent): the run's limits hold
    /// over it, and it counts its own OOM kills, so that two programs at once are told apart
    /// (palisade-cgroup's `exec` module). The program's process enters it before its exec
    /// ([`crate::agent::join_cgroups_before_exec`] with [`ExecCgroup::join_files`]).
    /// `Ok(None)` where the run has none to give: no cgroup (waived), the run over, or
    /// [`palisade_cgroup::MAX_EXEC_CGROUPS`] still there; `Err` says why it could not be made.
    pub fn exec_cgroup(&self) -> Result<Option<ExecCgroup>, String> {
        let cg = self.shared.cgroup.lock().unwrap_or_else(|p| p.into_inner());
        match cg.as_ref() {
            Some(c) => c
                .exec_cgroup()
                .map(|e| e.map(ExecCgroup))
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    /// Holds `bytes` of the run's memory for a process of the run's own that is about to have
    /// them charged outside its execs' cgroups (a session's agent writing a file into scratch):
    /// `Err(ReserveError::Full)` with what is left when the run has not that much beside the room
    /// its own processes need, else the run's execs together are held to what is left beside it
    /// until the reservation is dropped (palisade-cgroup's `exec` module). A file written into a
    /// full run would be charged past its ceiling, and the kernel would kill the run's largest
    /// process. A run without a cgroup, or without exec cgroups, holds and refuses nothing.
    pub fn reserve_memory(
        &self,
        bytes: u64,
    ) -> Result<palisade_cgroup::MemoryReservation, palisade_cgroup::ReserveError> {
        let cg = self.shared.cgroup.lock().unwrap_or_else(|p| p.into_inner());
        match cg.as_ref() {
            Some(c) => c.reserve_memory(bytes),
            None => Ok(palisade_cgroup::MemoryReservation::none()),
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

/// The cgroup of one program started inside a run's sandbox ([`Run::exec_cgroup`]). Dropping it
/// hands it back to the run: a later program takes it once nothing this one left runs there
/// (counting from zero), or it is removed (at the latest with the run).
pub struct ExecCgroup(Box<dyn palisade_cgroup::ExecCgroup>);

impl ExecCgroup {
    /// Its directory's name under the run's cgroup.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Files (opened for writing, close-on-exec) into which the program's process writes `0` to
    /// enter, before its exec.
    pub fn join_files(&self) -> std::io::Result<Vec<File>> {
        self.0.join_files().map_err(std::io::Error::other)
    }

    /// OOM kills of its processes so far.
    pub fn oom_kills(&self) -> u64 {
        self.0.oom_kills()
    }
}

impl std::fmt::Debug for ExecCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ExecCgroup").field(&self.0.name()).finish()
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
        Ok(Sandbox::assemble(
            policy,
            Stdin::Null,
            PathBuf::from(CGROUP_ROOT),
        ))
    }

    /// A sandbox of a validated policy, with the default engine and no egress callback.
    pub(crate) fn assemble(policy: Policy, stdin: Stdin, cgroup_root: PathBuf) -> Sandbox {
        Sandbox {
            keep: policy.keep_scratch,
            policy: Arc::new(policy),
            stdin,
            cgroup_root,
            net_notify: None,
            workspace: WorkspaceOptions::default(),
            engine: Engine::Auto,
            resolved: Arc::new(OnceLock::new()),
            manager: Arc::new(OnceLock::new()),
        }
    }

    /// The cgroup hierarchy for runs: found once (what the host offers does not change from one
    /// run to the next), looked for again only while none is found.
    fn cgroups(&self) -> Result<Arc<dyn Manager>, palisade_cgroup::CgroupError> {
        if let Some(m) = self.manager.get() {
            return Ok(m.clone());
        }
        let m: Arc<dyn Manager> =
            palisade_cgroup::detect(&self.cgroup_root, palisade_linux::host::cgroup_uid())?.into();
        Ok(self.manager.get_or_init(|| m).clone())
    }

    /// Chooses how the sandbox's init is started (default [`Engine::Auto`]).
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self.resolved = Arc::new(OnceLock::new());
        self
    }

    /// How a workspace's changes are kept and applied (see [`crate::workspace`]).
    pub fn with_workspace(mut self, o: WorkspaceOptions) -> Self {
        self.workspace = o;
        self
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
        self.start_with(io, None, Spawner::Cold)
    }

    /// Starts a run whose sandbox `spawner` makes, with `policy` (the sandbox's own if `None`).
    pub(crate) fn start_with(&self, io: Io, policy: Option<Policy>, spawner: Spawner) -> Run {
        let done_fd = match palisade_linux::host::event_fd() {
            Ok(fd) => fd,
            Err(e) => return failed_run(self, &thread_error(e)),
        };
        let output = match OutputQueue::new(io.stream_buffer.unwrap_or(usize::MAX)) {
            Ok(q) => Arc::new(q),
            Err(e) => return failed_run(self, &thread_error(e)),
        };
        let shared = Arc::new(Shared {
            report: Mutex::new(None),
            done: Condvar::new(),
            done_fd: Some(done_fd),
            cgroup: Mutex::new(None),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel::<Started>(1);
        let sandbox = self.clone();
        let (sh, out) = (shared.clone(), output.clone());
        let thread = RUN_THREADS.spawn(move || {
            let limits = sandbox.policy.limits;
            // A bug that panics here must still end the run with a report (built with
            // `panic = "unwind"`; the release profile aborts instead): whoever waits for the
            // run would otherwise wait for ever. Dropping the unwound state kills the sandbox.
            let mut panicked = false;
            let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                sandbox.supervise(io, policy, &spawner, &out, &tx, &sh.cgroup)
            }))
            .unwrap_or_else(|p| {
                panicked = true;
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
            // A run that failed after its cgroup was made: removed here, as the run ends.
            drop(sh.cgroup.lock().unwrap_or_else(|p| p.into_inner()).take());
            *sh.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
            sh.done.notify_all();
            if let Some(fd) = &sh.done_fd {
                palisade_linux::host::signal_event(fd);
            }
            if panicked {
                // Not back to the pool: the thread ends, and with it, by their parent-death
                // signal, any child the panic left unreaped.
                std::panic::resume_unwind(Box::new("the run's thread panicked"));
            }
        });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => return failed_run(self, &thread_error(e)),
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
        mut io: Io,
        policy: Option<Policy>,
        spawner: &Spawner,
        output: &OutputQueue,
        started: &std::sync::mpsc::SyncSender<Started>,
        cgroup: &Mutex<Option<Box<dyn RunCgroup>>>,
    ) -> Report {
        let tell = |k: Option<Killer>, s: Option<File>| {
            let _ = started.send(Started {
                killer: k,
                stdin: s,
            });
        };
        let t0 = Instant::now();
        let mut policy = policy.unwrap_or_else(|| (*self.policy).clone());
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
            Scratch::Ephemeral | Scratch::Workspace { .. } => None,
        };
        // A workspace: where its change set will be kept, settled (and refused if the sandbox
        // could write there) before anything runs.
        let store = match &policy.scratch {
            Scratch::Workspace { .. } => match self.workspace_store(&policy) {
                Ok(s) => Some(s),
                Err(e) => return fail(&e, scratch),
            },
            _ => None,
        };
        // The file-system clock at the start: a project file changed at or after it was changed
        // during the run (a conflict for the change set). Only a workspace run waits for it.
        let started_ns = match &policy.scratch {
            Scratch::Workspace { .. } => palisade_linux::fs::next_tick_ns(),
            _ => 0,
        };
        // The cgroup: memory and process ceilings for the sandbox as a whole. Fail closed: without
        // one, refuse, unless the user waived it by name.
        let (manager, waived) = match self.cgroups() {
            Ok(m) => (Some(m), None),
            Err(e) if policy.allow_degraded.contains(&Degradable::Cgroup) => {
                (None, Some(e.to_string()))
            }
            Err(e) => {
                let msg = format!(
                    "{e}; or add `cgroup` to layers.allow_degraded to run with rlimits only"
                );
                // Without user namespaces nothing can run whatever the cgroup: that is the error
                // to give first (found by the VM matrix's no-userns guest, where an undelegated
                // user was told only about the cgroup). `doctor` lists both.
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
        let limits = CgroupLimits {
            memory_bytes: policy.limits.memory_bytes,
            pids: policy.limits.pids,
            cpu_quota_us: policy.limits.cpu_quota_us(),
        };
        // A template's run takes the cgroup made ahead for it, if its limits are the run's; the
        // CPU the template's thread spent making it goes into the run's report.
        let ahead_cpu = std::cell::Cell::new(Duration::ZERO);
        let ahead = |limits: &CgroupLimits| match spawner {
            Spawner::Template(t) => t
                .cgroup
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .filter(|(l, ..)| l == limits)
                .map(|(_, c, cpu)| {
                    ahead_cpu.set(cpu);
                    c
                }),
            Spawner::Cold => None,
        };
        let prepare = |pid: i32| -> std::io::Result<Vec<std::fs::File>> {
            let Some(m) = &manager else {
                return Ok(Vec::new());
            };
            let c = match ahead(&limits) {
                Some(c) => c,
                None => {
                    m.clean_stale_once();
                    m.create(&limits).map_err(std::io::Error::other)?
                }
            };
            let files = c.self_join_files().map_err(std::io::Error::other)?;
            if files.is_empty() {
                c.join(pid).map_err(std::io::Error::other)?;
            }
            *cgroup.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
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
            files: std::mem::take(&mut io.files),
        };
        let stdin = io.stdin.clone().unwrap_or_else(|| self.stdin.clone());
        let (spawned, engine_name) = match spawner {
            Spawner::Cold => {
                let engine = match self.resolved.get_or_init(|| self.engine.resolve()) {
                    Ok(e) => e,
                    Err(why) => {
                        let e = SetupError::Supervisor {
                            op: "find palisade's init program",
                            source: std::io::Error::other(why.clone()),
                        };
                        return fail(&e, scratch);
                    }
                };
                let r = palisade_linux::spawn_with(
                    &policy,
                    stdin.into(),
                    Some(&prepare),
                    engine,
                    &extras,
                );
                (r, engine.name())
            }
            Spawner::Template(t) => (
                t.engine
                    .spawn(&policy, stdin.into(), Some(&prepare), &extras),
                "template",
            ),
        };
        let mut running = match spawned {
            Ok(r) => r,
            Err(e) => {
                let mut r = fail(&e, scratch);
                r.set_engine(engine_name);
                return r;
            }
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
        // A template's next run: its init and its cgroup, made by the template's thread while
        // this run's payload runs (docs/engine.md, "Inits made ahead"). Not for runs with a host
        // scratch directory (each has its init made at its start, from the directory as it is).
        if let (Spawner::Template(t), Scratch::Ephemeral) = (spawner, &policy.scratch) {
            t.ask_ahead(manager.as_ref().map(|m| (m.clone(), limits)));
        }
        if let (Some(pty), Some(t)) = (running.pty(), io.terminal) {
            palisade_linux::host::copy_winsize(t, pty);
        }
        let ws_layer = running.take_workspace();
        let ids = running.ids();
        let running_engine = running.engine();
        let landlock = running.landlock().clone();
        let protection = running.protection().clone();
        // The CPU-time limit, over every process of the sandbox, from the cgroup's accounting.
        let used = || {
            cgroup
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|c| c.cpu_used())
        };
        // The quota actually written, not the one asked for: a host without a cpu controller for
        // palisade applies none, and the budget can then drain on every CPU at once.
        let quota = cgroup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
        // A network namespace lent by the template's pool: given back below, once the proxy's
        // listeners in it are closed, as unused only if the run made no socket at all.
        let net_lease = running.take_net_lease();
        // The run's mount namespace, when init hands it over at its end (its last reference
        // waits for an expedited RCU grace period): let go after the report, by the template's
        // thread. A cold run gains nothing by it (its own thread would let it go before its
        // report): its socket is closed now, and the namespace ends in init's exit, inside the
        // run's cgroup, as it always did.
        let mount_ns = running
            .take_mount_ns()
            .filter(|_| matches!(spawner, Spawner::Template(_)));
        let mut net_unused = false;
        let mut report = match running.wait(watch) {
            Ok(mut o) => {
                net_unused = o.made_no_socket;
                attempts = (std::mem::take(&mut o.attempts), o.attempts_dropped);
                let mut r = Report::from_outcome(&o, ids, &landlock, scratch, policy.limits);
                r.supervisor_cpu_ms += ahead_cpu.get().as_secs_f64() * 1000.0;
                r
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
        let mut cgroup = cgroup.lock().unwrap_or_else(|p| p.into_inner()).take();
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
        match net_lease {
            Some(l) if net_unused => l.unused(),
            lease => drop(lease),
        }
        report.set_protected(&protection, disarmed);
        // The workspace's upper layer, now that nothing of the sandbox can write it any more, and
        // the run's status is final (an OOM kill is known only from the cgroup), which the change
        // set records and `--apply on-success` reads.
        if let (Some((tmpfs, base)), Some(store)) = (ws_layer, &store) {
            let ws = self.keep_changes(tmpfs, &base, store, started_ns, &policy, &report);
            report.set_workspace(ws);
        }
        report.set_engine(running_engine);
        if let (Spawner::Template(t), Some(ns)) = (spawner, mount_ns) {
            t.release(ns);
        }
        report
    }
}

impl Sandbox {
    /// The store a workspace run keeps its change set in: the caller's, or the default one;
    /// refused when the sandbox could write there (a writable bind over it).
    fn workspace_store(&self, policy: &Policy) -> Result<Store, SetupError> {
        let store = match (&self.workspace.store, Store::default_dir()) {
            (Some(s), _) => s.clone(),
            (None, Some(d)) => Store::new(d),
            (None, None) => {
                return Err(SetupError::Supervisor {
                    op: "choose where to keep the workspace's changes",
                    source: std::io::Error::other(
                        "no HOME or XDG_STATE_HOME to keep change sets under; give a store (palisade: PALISADE_CHANGES_DIR)",
                    ),
                })
            }
        };
        store.check().map_err(|e| SetupError::Supervisor {
            op: "check where the workspace's changes will be kept",
            source: std::io::Error::other(e.to_string()),
        })?;
        // The nearest existing ancestor, canonical: where the store is or will be.
        let mut at = store.path().to_path_buf();
        let canon = loop {
            if let Ok(c) = at.canonicalize() {
                break c;
            }
            if !at.pop() {
                break at;
            }
        };
        // Inside the workspace, the code would see the other change sets (and its changes could
        // add to the store).
        if let Some(dir) = policy.scratch.host_path() {
            let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
            if canon.starts_with(&dir) {
                return Err(SetupError::HostPath {
                    field: "filesystem.workspace",
                    path: dir,
                    source: std::io::Error::other(format!(
                        "the change sets are kept in {}, inside the workspace: keep them elsewhere (palisade: PALISADE_CHANGES_DIR)",
                        store.path().display()
                    )),
                });
            }
        }
        for b in policy.binds.iter().filter(|b| b.writable) {
            let src = b.source.canonicalize().unwrap_or_else(|_| b.source.clone());
            if canon.starts_with(&src) || src.starts_with(&canon) && store.path().starts_with(&src)
            {
                return Err(SetupError::HostPath {
                    field: "filesystem.rw",
                    path: b.source.clone(),
                    source: std::io::Error::other(format!(
                        "the workspace's change sets are kept in {}, which this writable bind would let the code change; bind something else",
                        store.path().display()
                    )),
                });
            }
        }
        Ok(store)
    }

    /// Reads the upper layer into a change set, prunes the store, and applies it if asked.
    fn keep_changes(
        &self,
        tmpfs: std::os::fd::OwnedFd,
        base: &palisade_linux::plan::WorkspaceBase,
        store: &Store,
        started_ns: i128,
        policy: &Policy,
        report: &Report,
    ) -> WorkspaceReport {
        use crate::workspace::{self, ApplyOptions, RunResult};
        let status = serde_json::to_value(report.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let mut ws = WorkspaceReport {
            dir: base.path.display().to_string(),
            store: Some(store.path().display().to_string()),
            apply: self.workspace.apply,
            ..WorkspaceReport::default()
        };
        let input = workspace::capture::CaptureInput {
            store,
            tmpfs,
            base,
            started_ns,
            run: RunResult {
                status,
                exit_code: report.exit_code,
            },
            protected: &policy.protected,
            cap: policy.limits.scratch_bytes,
        };
        let meta = match workspace::capture(input) {
            Ok(Some(m)) => m,
            Ok(None) => return ws,
            Err(e) => {
                ws.error = Some(e.to_string());
                return ws;
            }
        };
        ws.change_set = Some(meta.id.clone());
        ws.summary = meta.summary.clone();
        ws.renames = meta.renames.clone();
        ws.incomplete = meta.incomplete.clone();
        if let Ok(p) = store.prune(&self.workspace.retention, Some(&meta.id)) {
            ws.pruned = p;
        }
        let wanted = match self.workspace.apply {
            ApplyMode::Never => false,
            ApplyMode::OnSuccess => report.status == crate::Status::Ok,
            ApplyMode::Always => true,
        };
        if wanted {
            match store
                .get(&meta.id)
                .and_then(|cs| cs.apply(&ApplyOptions::default()))
            {
                Ok(a) => ws.applied = Some(a),
                Err(e) => ws.apply_error = Some(e.to_string()),
            }
        }
        ws
    }
}

pub use palisade_linux::WarmPython;

/// Who makes a run's sandbox.
pub(crate) enum Spawner {
    /// The sandbox's engine, from scratch.
    Cold,
    /// A prepared template's zygote.
    Template(Arc<TemplateInner>),
}

impl Sandbox {
    /// Prepares this sandbox's policy as a [`Template`]: a zygote (palisade's init program, see
    /// [`Engine`]) builds the part of the view every run shares once, and each
    /// [`Template::start`] then makes a fresh sandbox from it in a fraction of a cold start.
    /// Every run still gets its own pid, mount, IPC, UTS, network and user namespace, scratch,
    /// cgroup and limits (docs/engine.md says what runs of one template share). Needs palisade's
    /// init program: the engine must not be [`Engine::InProcess`].
    ///
    /// ```no_run
    /// use palisade::{Io, Sandbox, Status};
    ///
    /// let template = Sandbox::builder().command(["true"]).build().unwrap().prepare().unwrap();
    /// for i in 0..3 {
    ///     let out = template.start(["sh", "-c", "echo $N"], &[("N", &i.to_string())], Io::default()).wait_output();
    ///     assert_eq!(out.report.status, Status::Ok);
    ///     assert_eq!(out.report.engine, Some("template"));
    /// }
    /// ```
    pub fn prepare(&self) -> Result<Template, SetupError> {
        self.prepare_with(None)
    }

    /// As [`Sandbox::prepare`], with a warm interpreter (off unless asked for: `prepare` never
    /// starts one). The zygote loads `warm`'s Python, starts it and imports its modules before
    /// its first run; a run of `python3 -c CODE [ARG...]` is then a fork of that interpreter
    /// inside the run's own fresh boundary, sparing Python's start-up, and its report's
    /// `engine` is `template-warm`; any other command runs as in a plain template. What every
    /// run then shares (imported modules and their state, the hash seed, the address-space
    /// layout) is written in docs/engine.md ("Warm Python"): import nothing that reads a secret.
    ///
    /// ```no_run
    /// use palisade::{Io, Sandbox, Status, WarmPython};
    ///
    /// let warm = WarmPython::find("/usr/bin/python3".as_ref(), &["json".into()]).unwrap();
    /// let template = Sandbox::builder().command(["true"]).build().unwrap().prepare_warm_python(warm).unwrap();
    /// let out = template.start(["python3", "-c", "print(1)"], &[], Io::default()).wait_output();
    /// assert_eq!(out.report.engine, Some("template-warm"));
    /// assert_eq!(out.stdout, b"1\n");
    /// ```
    pub fn prepare_warm_python(&self, warm: WarmPython) -> Result<Template, SetupError> {
        self.prepare_with(Some(warm))
    }

    fn prepare_with(&self, warm: Option<WarmPython>) -> Result<Template, SetupError> {
        let prog = match self.resolved.get_or_init(|| self.engine.resolve()) {
            Ok(palisade_linux::Engine::Exec(p)) => p.clone(),
            Ok(palisade_linux::Engine::InProcess) => {
                return Err(SetupError::Supervisor {
                    op: "prepare a template",
                    source: std::io::Error::other(
                        "a template needs palisade's init program: set PALISADE_INIT, choose Engine::InitProgram, or call palisade::engine::run_if_init() first in main",
                    ),
                })
            }
            Err(why) => {
                return Err(SetupError::Supervisor {
                    op: "find palisade's init program",
                    source: std::io::Error::other(why.clone()),
                })
            }
        };
        // The zygote and every run's init are children of this thread (their parent-death signal
        // is tied to it): it lives until the template and its last run are gone.
        // It also makes the next run's init and cgroup when a run has started (a request on
        // `alive`), off the runs' own threads; requests that come while it works are one.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (alive, until) = std::sync::mpsc::channel::<ToThread>();
        let policy = self.policy.clone();
        let cgroup: Arc<CgroupAhead> = Arc::new(Mutex::new(None));
        let slot = cgroup.clone();
        let releasing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let released = releasing.clone();
        let thread = std::thread::Builder::new()
            .name("palisade-template".into())
            .spawn(move || {
                let made =
                    palisade_linux::Template::new(&policy, &prog, warm.as_ref()).map(Arc::new);
                let engine = made.as_ref().ok().cloned();
                let _ = tx.send(made);
                let Some(engine) = engine else {
                    return;
                };
                while let Ok(first) = until.recv() {
                    // Requests that came meanwhile are one; holds are let go after the work.
                    let (mut ahead, mut release) = (None, Vec::new());
                    for m in
                        std::iter::once(first).chain(std::iter::from_fn(|| until.try_recv().ok()))
                    {
                        match m {
                            ToThread::Ahead(a) => ahead = Some(a),
                            ToThread::Release(fd) => release.push(fd),
                        }
                    }
                    let let_go = |release: Vec<std::os::fd::OwnedFd>| {
                        let n = release.len();
                        drop(release);
                        released.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
                    };
                    let Some(ahead) = ahead else {
                        let_go(release);
                        continue;
                    };
                    engine.fill();
                    if let Some((m, limits)) = ahead {
                        let empty = slot.lock().unwrap_or_else(|p| p.into_inner()).is_none();
                        if empty {
                            // A failure is the next run's to report: it makes its own.
                            let cpu0 = palisade_linux::host::thread_cpu_time();
                            let made = m.create(&limits).ok().map(|c| {
                                let cpu =
                                    palisade_linux::host::thread_cpu_time().saturating_sub(cpu0);
                                (limits, c, cpu)
                            });
                            *slot.lock().unwrap_or_else(|p| p.into_inner()) = made;
                        }
                    }
                    let_go(release);
                }
                // The template's last holder is gone: its inits made ahead and its zygote end
                // here, on the thread they belong to.
                drop(engine);
            })
            .map_err(|source| SetupError::Supervisor {
                op: "start the template's thread",
                source,
            })?;
        let engine = rx.recv().map_err(|_| SetupError::Supervisor {
            op: "prepare a template",
            source: std::io::Error::other("its thread ended"),
        })??;
        Ok(Template {
            sandbox: self.clone(),
            inner: Arc::new(TemplateInner {
                engine,
                cgroup,
                releasing,
                _thread: TemplateThread {
                    alive: Some(alive),
                    thread: Some(thread),
                },
            }),
        })
    }
}

/// A prepared sandbox: [`Sandbox::prepare`]. Cheap to clone, `Send` and `Sync`; runs can start
/// from any thread, at the same time. Dropping every clone ends the template once its last run
/// has ended.
#[derive(Clone)]
pub struct Template {
    sandbox: Sandbox,
    inner: Arc<TemplateInner>,
}

/// What the template's thread makes ahead for the next run: its init, and with a cgroup manager
/// its cgroup with these limits.
type Ahead = Option<(Arc<dyn Manager>, CgroupLimits)>;

/// Ended runs' mount namespaces a template's thread may have on their way at once (each holds at
/// most what `palisade_linux::Running::take_mount_ns` says).
const MAX_RELEASING: usize = 8;

/// What a run asks of the template's thread.
enum ToThread {
    /// Make the next run ahead.
    Ahead(Ahead),
    /// Let an ended run's mount namespace go (see `palisade_linux::Running::take_mount_ns`):
    /// its end waits for the kernel, which the run's caller then does not.
    Release(std::os::fd::OwnedFd),
}

/// A run's cgroup made ahead, with the limits it was made with and the CPU time making it took.
type CgroupAhead = Mutex<Option<(CgroupLimits, Box<dyn RunCgroup>, Duration)>>;

pub(crate) struct TemplateInner {
    /// Shared with the template's thread, which drops it last.
    engine: Arc<palisade_linux::Template>,
    /// The next run's cgroup, made by the template's thread while a run's payload runs
    /// (docs/engine.md, "Inits made ahead"). Each is used once.
    cgroup: Arc<CgroupAhead>,
    /// Ended runs' mount namespaces handed to the template's thread and not let go yet (at most
    /// [`MAX_RELEASING`]; past that a run lets its own go).
    releasing: Arc<std::sync::atomic::AtomicUsize>,
    /// Dropped after `engine`: the thread the zygote and the runs' inits belong to.
    _thread: TemplateThread,
}

struct TemplateThread {
    alive: Option<std::sync::mpsc::Sender<ToThread>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TemplateInner {
    /// Asks the template's thread to make the next run's init and, with `cgroup`, its cgroup.
    fn ask_ahead(&self, cgroup: Ahead) {
        if let Some(a) = &self._thread.alive {
            let _ = a.send(ToThread::Ahead(cgroup));
        }
    }

    /// Hands an ended run's mount namespace to the template's thread, which lets it go; with
    /// [`MAX_RELEASING`] on their way already, the caller lets it go itself.
    fn release(&self, ns: std::os::fd::OwnedFd) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.releasing.fetch_add(1, Relaxed) >= MAX_RELEASING {
            self.releasing.fetch_sub(1, Relaxed);
            return;
        }
        match &self._thread.alive {
            Some(a) if a.send(ToThread::Release(ns)).is_ok() => {}
            _ => {
                self.releasing.fetch_sub(1, Relaxed);
            }
        }
    }
}

impl Drop for TemplateThread {
    fn drop(&mut self) {
        self.alive = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("sandbox", &self.sandbox)
            .field("engine", &self.inner.engine)
            .finish()
    }
}

impl Template {
    /// Starts `command` in a fresh sandbox of the template, with `env` added to the policy's
    /// variables (a name given in both takes the value given here). Returns like
    /// [`Sandbox::start`]; the report's `engine` is `template`. A bad command or variable is a
    /// run whose report says so (`sandbox-error`, the field named), nothing is started.
    pub fn start<I, S>(&self, command: I, env: &[(&str, &str)], io: Io) -> Run
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut policy = (*self.sandbox.policy).clone();
        policy.command = command.into_iter().map(Into::into).collect();
        if let Err(e) = run_values(&mut policy, env) {
            let e = SetupError::Policy(e);
            return failed_run(&self.sandbox, &e);
        }
        self.sandbox
            .start_with(io, Some(policy), Spawner::Template(self.inner.clone()))
    }

    /// Whether the template's zygote is still there: once it is gone (killed, or ended with an
    /// error), every [`Template::start`] fails with a sandbox error; prepare a new template.
    pub fn is_alive(&self) -> bool {
        self.inner.engine.alive()
    }

    /// The sandbox this template was prepared from.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }
}

/// A run's own command and variables, checked as the policy's are (`Policy::validate_values`
/// for the command, `EnvVar::new` for each variable).
fn run_values(policy: &mut Policy, env: &[(&str, &str)]) -> Result<(), PolicyError> {
    let bad = |value: &str, expected: &'static str| PolicyError::Invalid {
        field: "command",
        value: value.to_owned(),
        expected,
    };
    match policy.command.first() {
        None => {
            return Err(bad(
                "",
                "a program to run, e.g. [\"python3\", \"script.py\"]",
            ))
        }
        Some(p) if p.is_empty() => return Err(bad("", "a non-empty program name or path")),
        _ => {}
    }
    if let Some(a) = policy.command.iter().find(|a| a.contains('\0')) {
        return Err(bad(a, "arguments without NUL bytes"));
    }
    for (name, value) in env {
        let v = palisade_policy::EnvVar::new(name, value)?;
        policy.env.retain(|o| o.name != v.name);
        policy.env.push(v);
    }
    Ok(())
}

/// Output kept in memory for a streaming reader before the payload is held back.
pub(crate) const STREAM_BUFFER: usize = 1 << 20;

fn thread_error(source: std::io::Error) -> SetupError {
    SetupError::Supervisor {
        op: "start the run's supervising thread",
        source,
    }
}

/// A run that never started: its report says why.
fn failed_run(sandbox: &Sandbox, e: &SetupError) -> Run {
    let report = Report::from_error(e, Duration::ZERO, None, sandbox.policy.limits);
    Run {
        shared: Arc::new(Shared {
            report: Mutex::new(None),
            done: Condvar::new(),
            done_fd: None,
            cgroup: Mutex::new(None),
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
