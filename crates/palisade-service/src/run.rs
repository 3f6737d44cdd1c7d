//! One-shot runs and batches.
//!
//! A request is checked whole before anything starts (a bad one is an error naming its field,
//! with nothing started). A run without files to fetch or a compile stage runs directly as the
//! sandbox's payload: its files (code in a language is written to the language's file) are
//! written by the sandbox's init, inside the boundary, before the payload starts
//! (`palisade::Io::files`). Files to fetch or a compile stage go through the agent: the sandbox's
//! payload is `palisade __agent`, which writes the files, runs each stage with fresh pipes whose
//! ends the server reads directly, and reads files back, all from inside the boundary.

use crate::api::{self, Data, RunReport, RunRequest, RunResult, RunStatus, Stage};
use crate::budget::{Charge, Charged};
use crate::client::{AgentConn, Exec, Exit};
use crate::proto::{self, Request};
use crate::{Service, ServiceError};
use palisade::policy::{Bind, Policy};
use palisade::{Io, Run, Sandbox, Status, Stdin, Template};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Time for the agent's own work (files in and out) on top of the stages' limits.
pub(crate) const AGENT_SLACK: Duration = Duration::from_secs(30);
/// How long the pipes of an exec may stay open after its program ended or was killed (a
/// process that left its group may hold them), before the exec is given up.
const DRAIN_GRACE: Duration = Duration::from_secs(3);
/// Fewest processes a sandbox can run a command in: its init and the program.
pub(crate) const DIRECT_MIN_PIDS: u64 = 2;
/// Fewest processes and threads a sandbox with the agent needs: init, the agent, a thread that
/// waits for the exec, and the program.
pub(crate) const AGENT_MIN_PIDS: u64 = 4;
/// Fewest open files per process a sandbox starts with (its setup's own descriptors).
pub(crate) const DIRECT_MIN_FILES: u64 = 4;
/// Fewest open files per process for the agent (its socket, directories, an exec's pipes).
pub(crate) const AGENT_MIN_FILES: u64 = 32;
/// Least memory for a session: its sandbox's init and agent take ~2.5 MiB, and an exec needs
/// room beside them (sessions of 1 and 2 MiB had the agent or init killed at their first exec,
/// found by an independent attack).
pub(crate) const SESSION_MIN_MEMORY: u64 = 16 << 20;
/// What the agent takes for each exec running (its thread, its pipes: ~85 KiB measured), with a
/// margin: a session runs at most as many execs at once as half its room holds of this
/// ([`max_running_execs`]).
const AGENT_PER_EXEC: u64 = 128 << 10;

/// Most execs a session of `memory` bytes runs at once: the agent's memory for them is charged
/// beside the execs' cgroups, and must stay within half the room they leave it
/// ([`palisade::exec_memory_ceiling`]); 350 background execs took the agent 30 MiB, past a 16 MiB
/// room, and the kernel killed it (found by an independent attack).
pub(crate) fn max_running_execs(memory: u64) -> usize {
    let room = memory.saturating_sub(palisade::exec_memory_ceiling(memory));
    ((room / 2 / AGENT_PER_EXEC) as usize).max(1)
}

/// Most files a request may fetch.
const MAX_FETCH: usize = 256;
/// Largest Python code (with its arguments) that warm Python runs as `python3 -c CODE`; larger
/// code is written to its file and runs cold (a template's request and a warm run's code pipe
/// are bounded: 160 KiB and the warm run's own bound).
const WARM_CODE_MAX: usize = 64 << 10;
/// Most files a request may write.
const MAX_FILES: usize = 4096;

/// One stage to run.
#[derive(Debug, Clone)]
pub(crate) struct StagePlan {
    pub argv: Vec<String>,
    pub timeout: Duration,
    pub output: u64,
}

/// A checked request.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    policy: Policy,
    stdin: Vec<u8>,
    files: Vec<(String, bytes::Bytes)>,
    fetch: Vec<String>,
    compile: Option<StagePlan>,
    run: StagePlan,
    /// Start the command directly, without the agent.
    direct: bool,
    /// The sandbox would be the warm pool's: the ceiling's limits, no egress, no variables.
    poolable: bool,
    /// The request's own variables (a template run gets them with its command).
    run_env: Vec<(String, String)>,
    /// `python3 -c CODE`: a run for the warm-Python template.
    warm: bool,
}

/// A running sandbox held by the service: registered for shutdown, killed and cleaned up off the
/// async threads when dropped early (a client that went away, a shutdown).
pub(crate) struct Held {
    svc: Service,
    run: Option<Run>,
    key: u64,
}

impl Held {
    pub(crate) async fn start(svc: &Service, sandbox: Sandbox, io: Io) -> Held {
        let run = tokio::task::spawn_blocking(move || sandbox.start(io))
            .await
            .expect("starting a run does not panic");
        Held::hold(svc, run)
    }

    /// A run of `template`: `argv` and `env` are the run's own, the rest the template's.
    pub(crate) async fn start_template(
        svc: &Service,
        template: Template,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        io: Io,
    ) -> Held {
        let run = tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            template.start(argv, &env, io)
        })
        .await
        .expect("starting a run does not panic");
        Held::hold(svc, run)
    }

    fn hold(svc: &Service, run: Run) -> Held {
        let key = svc.register(run.killer());
        Held {
            svc: svc.clone(),
            run: Some(run),
            key,
        }
    }

    pub(crate) fn run_mut(&mut self) -> &mut Run {
        self.run.as_mut().expect("held until finished")
    }

    /// Waits until the run is over (its report ready), without blocking a thread.
    pub(crate) async fn done(&self) {
        let Some(run) = self.run.as_ref() else { return };
        let Some(fd) = run.done_fd() else { return };
        let Ok(owned) = fd.try_clone_to_owned() else {
            return;
        };
        // The AsyncFd owns its duplicate of the descriptor, so it stays open while registered
        // (what the newer, unsafe `register` asks its caller to promise).
        #[allow(deprecated)]
        let a = tokio::io::unix::AsyncFd::new(owned);
        if let Ok(a) = a {
            let _ = a.readable().await;
        }
    }

    /// The OOM kills its cgroup has counted so far (see [`Run::oom_kills`]).
    pub(crate) fn oom_kills(&self) -> Option<u64> {
        self.run.as_ref().and_then(|r| r.oom_kills())
    }

    /// A cgroup of its own for one exec (see [`Run::exec_cgroup`]).
    pub(crate) fn exec_cgroup(&self) -> Result<Option<palisade::ExecCgroup>, String> {
        match self.run.as_ref() {
            Some(r) => r.exec_cgroup(),
            None => Ok(None),
        }
    }

    /// Memory held for a file the agent is about to write (see [`Run::reserve_memory`]).
    pub(crate) fn reserve_memory(
        &self,
        bytes: u64,
    ) -> Result<palisade::MemoryReservation, palisade::ReserveError> {
        match self.run.as_ref() {
            Some(r) => r.reserve_memory(bytes),
            None => Ok(palisade::MemoryReservation::none()),
        }
    }

    pub(crate) fn kill(&self) {
        if let Some(r) = &self.run {
            r.kill();
        }
    }

    /// The report and the output not read yet, once over.
    pub(crate) async fn finish(mut self) -> palisade::Output {
        self.done().await;
        let run = self.run.take().expect("held until finished");
        let out = tokio::task::spawn_blocking(move || run.wait_output())
            .await
            .expect("wait_output does not panic");
        self.svc.unregister(self.key);
        out
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            run.kill();
            // Dropping a run waits for its cleanup: not on an async thread.
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    let svc = self.svc.clone();
                    let key = self.key;
                    h.spawn_blocking(move || {
                        drop(run);
                        svc.unregister(key);
                    });
                    return;
                }
                Err(_) => drop(run),
            }
        }
        self.svc.unregister(self.key);
    }
}

impl Plan {
    pub(crate) fn policy_mut(&mut self) -> &mut Policy {
        &mut self.policy
    }

    pub(crate) fn is_warm(&self) -> bool {
        self.warm
    }
}

impl Service {
    /// Checks `req` against the ceiling and the languages; `at` prefixes field names (`runs[3].`).
    pub(crate) fn plan(&self, req: &RunRequest, at: &str) -> Result<Plan, ServiceError> {
        let ceiling = &self.inner.config.ceiling;
        let f = |s: &str| format!("{at}{s}");
        let limits = ceiling.limits(&req.limits, &f("limits"))?;
        let network = ceiling.network(&req.allow_net, &f("allow_net"))?;
        let env = ceiling.env(&req.env, &f("env"))?;
        let stdin = match &req.stdin {
            Some(c) => c.bytes(&f("stdin"))?,
            None => Vec::new(),
        };
        let mut files = Vec::new();
        if req.files.len() > MAX_FILES {
            return Err(ServiceError::invalid(
                f("files"),
                format!("{} files", req.files.len()),
                format!("at most {MAX_FILES} files"),
            ));
        }
        // Each path as it will be written: empty components dropped (`a//b` is `a/b`), so two
        // names of one path, or a file where another file's directory goes, are refused here.
        let mut named = std::collections::BTreeSet::new();
        for (p, c) in &req.files {
            let field = f(&format!("files[{p:?}]"));
            let comps =
                proto::check_path(p).map_err(|e| ServiceError::invalid(&field, p.as_str(), e))?;
            let path = comps.join("/");
            if !named.insert(path.clone()) {
                return Err(ServiceError::invalid(
                    &field,
                    p.as_str(),
                    format!("a path no other entry of `files` names ({path})"),
                ));
            }
            files.push((path, c.bytes(&field)?.into()));
        }

        if req.fetch.len() > MAX_FETCH {
            return Err(ServiceError::invalid(
                f("fetch"),
                format!("{} paths", req.fetch.len()),
                format!("at most {MAX_FETCH} paths"),
            ));
        }
        for (i, p) in req.fetch.iter().enumerate() {
            proto::check_path(p)
                .map_err(|e| ServiceError::invalid(f(&format!("fetch[{i}]")), p.as_str(), e))?;
        }
        let stage_limits = |s: &api::StageLimits, field: &str| -> Result<StagePlan, ServiceError> {
            let c = ceiling.policy().limits;
            let t = s.timeout_ms.unwrap_or(c.timeout_ms);
            if t == 0 {
                return Err(ServiceError::invalid(
                    f(&format!("{field}.timeout_ms")),
                    "0",
                    format!("between 1 and {}", c.timeout_ms),
                ));
            }
            if t > c.timeout_ms {
                return Err(ServiceError::ceiling(
                    &f(&format!("{field}.timeout_ms")),
                    t,
                    c.timeout_ms,
                ));
            }
            let o = s.output_bytes.unwrap_or(c.output_bytes);
            if o == 0 {
                return Err(ServiceError::invalid(
                    f(&format!("{field}.output_bytes")),
                    "0",
                    format!("between 1 and {}", c.output_bytes),
                ));
            }
            if o > c.output_bytes {
                return Err(ServiceError::ceiling(
                    &f(&format!("{field}.output_bytes")),
                    o,
                    c.output_bytes,
                ));
            }
            Ok(StagePlan {
                argv: Vec::new(),
                timeout: Duration::from_millis(t),
                output: o,
            })
        };
        let run_stage = StagePlan {
            argv: Vec::new(),
            timeout: Duration::from_millis(limits.timeout_ms),
            output: limits.output_bytes,
        };
        let mut warm = false;
        let (argv, compile, code_file) = match (&req.command, &req.language, &req.code) {
            (Some(cmd), None, None) => {
                if cmd.is_empty() || cmd[0].is_empty() {
                    return Err(ServiceError::invalid(
                        f("command"),
                        "[]",
                        "a program and its arguments, e.g. [\"python3\", \"-c\", \"print(1)\"]",
                    ));
                }
                if let Some(a) = cmd.iter().find(|a| a.contains('\0')) {
                    return Err(ServiceError::invalid(
                        f("command"),
                        a.as_str(),
                        "arguments without NUL bytes",
                    ));
                }
                if !req.args.is_empty() {
                    return Err(ServiceError::invalid(
                        f("args"),
                        format!("{:?}", req.args),
                        "args only with `language` and `code` (put them in `command`)",
                    ));
                }
                if req.compile.is_some() {
                    return Err(ServiceError::invalid(
                        f("compile"),
                        "set",
                        "a compile stage only with a compiled `language`",
                    ));
                }
                (cmd.clone(), None, None)
            }
            (None, Some(l), Some(code)) => {
                let Some(lang) = crate::lang::find(&self.inner.langs, l) else {
                    return Err(ServiceError {
                        code: "unknown-language",
                        ..ServiceError::invalid(
                            f("language"),
                            l.as_str(),
                            format!(
                                "one of this server's languages: {}",
                                crate::lang::names(&self.inner.langs)
                            ),
                        )
                    });
                };
                if let Some(a) = req.args.iter().find(|a| a.contains('\0')) {
                    return Err(ServiceError::invalid(
                        f("args"),
                        a.as_str(),
                        "arguments without NUL bytes",
                    ));
                }
                if named.contains(lang.file) {
                    return Err(ServiceError::invalid(
                        f(&format!("files[{:?}]", lang.file)),
                        lang.file,
                        format!("another path: `code` is written to {}", lang.file),
                    ));
                }
                // Warm Python takes `python3 -c CODE`: code that fits in an argument, in a run
                // with no files to fetch, runs so (its other files are written by the sandbox's
                // init as for any direct run); other code is written to the language's file as
                // without it.
                let as_arg = self.inner.config.warm_python.is_some()
                    && lang.name == "python"
                    && req.fetch.is_empty()
                    && !code.contains('\0')
                    && code.len() + req.args.iter().map(|a| a.len() + 1).sum::<usize>()
                        <= WARM_CODE_MAX;
                if as_arg {
                    let mut argv = vec!["python3".to_string(), "-c".into(), code.clone()];
                    argv.extend(req.args.iter().cloned());
                    warm = true;
                    (argv, None, None)
                } else {
                    let mut argv: Vec<String> = lang.run.iter().map(|s| s.to_string()).collect();
                    argv.extend(req.args.iter().cloned());
                    let compile = match (lang.compile, &req.compile) {
                        (Some(c), s) => {
                            let mut p = stage_limits(
                                s.as_ref().unwrap_or(&api::StageLimits::default()),
                                "compile",
                            )?;
                            p.argv = c.iter().map(|s| s.to_string()).collect();
                            Some(p)
                        }
                        (None, Some(_)) => {
                            return Err(ServiceError::invalid(
                                f("compile"),
                                "set",
                                format!(
                                "a compile stage only for compiled languages; {} is interpreted",
                                lang.name
                            ),
                            ))
                        }
                        (None, None) => None,
                    };
                    (
                        argv,
                        compile,
                        Some((lang.file.to_string(), code.as_bytes().to_vec())),
                    )
                }
            }
            (None, Some(_), None) => {
                return Err(ServiceError::invalid(
                    f("code"),
                    "(missing)",
                    "the source code to run in `language`",
                ))
            }
            (None, None, Some(_)) => {
                return Err(ServiceError::invalid(
                    f("language"),
                    "(missing)",
                    format!(
                        "the language of `code`: {}",
                        crate::lang::names(&self.inner.langs)
                    ),
                ))
            }
            _ => {
                return Err(ServiceError::invalid(
                    f("command"),
                    "(missing or both)",
                    "either `command`, or `language` and `code`",
                ))
            }
        };
        if let Some(cf) = code_file {
            named.insert(cf.0.clone());
            files.insert(0, (cf.0, cf.1.into()));
        }
        for (path, _) in &files {
            let mut dir = path.as_str();
            while let Some((up, _)) = dir.rsplit_once('/') {
                if named.contains(up) {
                    return Err(ServiceError::invalid(
                        f(&format!("files[{up:?}]")),
                        up,
                        format!("a file that is not also the directory of another ({path})"),
                    ));
                }
                dir = up;
            }
        }
        // Files to write need no agent: the sandbox's init writes them (palisade::Io::files), as
        // many as fit in a run's request; more go through the agent.
        let direct = req.fetch.is_empty()
            && compile.is_none()
            && palisade::in_files_fit(files.iter().map(|(p, _)| p.as_str()));
        let min_files = if direct {
            DIRECT_MIN_FILES
        } else {
            AGENT_MIN_FILES
        };
        if limits.open_files < min_files {
            return Err(ServiceError::invalid(
                f("limits.open_files"),
                limits.open_files.to_string(),
                format!(
                    "at least {min_files}: what the sandbox's own setup{} needs",
                    if direct { "" } else { " and its agent" }
                ),
            ));
        }
        let min = if direct {
            DIRECT_MIN_PIDS
        } else {
            AGENT_MIN_PIDS
        };
        if limits.pids < min {
            return Err(ServiceError::invalid(
                f("limits.pids"),
                limits.pids.to_string(),
                format!(
                    "at least {min}: the sandbox's init, {}",
                    if direct {
                        "and the program"
                    } else {
                        "the agent that moves the files, its watcher and the program"
                    }
                ),
            ));
        }
        let policy = if direct {
            ceiling.policy_for(argv.clone(), limits, network, env)?
        } else {
            let mut l = limits;
            // The sandbox's own deadline is a backstop over every stage; each stage's is kept by
            // the server. Its output cap is for the agent's own messages: the stages' pipes are
            // read and capped by the server.
            let total = run_stage.timeout
                + compile.as_ref().map_or(Duration::ZERO, |c| c.timeout)
                + AGENT_SLACK;
            l.timeout_ms =
                (total.as_millis() as u64).min(palisade::policy::MAX_TIMEOUT.as_millis() as u64);
            l.output_bytes = 1 << 20;
            let mut p = ceiling.policy_for(
                vec![proto::AGENT_PATH.into(), proto::AGENT_ARG.into()],
                l,
                network,
                env,
            )?;
            p.binds.push(agent_bind(&self.inner.config.agent_exe)?);
            p
        };
        let poolable = {
            let c = ceiling.policy().limits;
            let mut same = limits;
            same.timeout_ms = c.timeout_ms;
            same.output_bytes = c.output_bytes;
            let mut base = c;
            base.cpu_time_ms = Some(c.cpu_time().as_millis() as u64);
            !direct && same == base && req.allow_net.is_empty() && req.env.is_empty()
        };
        Ok(Plan {
            poolable,
            run_env: req
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            warm,
            policy,
            stdin,
            files,
            fetch: req.fetch.clone(),
            compile,
            run: StagePlan { argv, ..run_stage },
            direct,
        })
    }

    /// Checks a request the way [`Service::run`] does, without running it: the error names the
    /// field (front ends use it for a dry run; the fuzz target for request decoding calls it).
    pub fn check_run(&self, req: &RunRequest) -> Result<(), ServiceError> {
        self.plan(req, "").map(|_| ())
    }

    /// `POST /v1/run`: checks, waits for a slot (or `busy`), runs.
    pub async fn run(&self, req: RunRequest) -> Result<Charged<RunResult>, ServiceError> {
        let plan = self.plan(&req, "")?;
        let mut t = self.admit()?;
        let t0 = Instant::now();
        t.ready().await?;
        let r = self.execute(plan).await;
        self.inner.metrics.run(
            r.status,
            t0.elapsed().as_secs_f64(),
            r.report.as_ref().map(RunReport::get),
        );
        Ok(r)
    }

    /// Runs a checked plan (a slot is held by the caller).
    /// Its result holds the bytes it carries (output, files) against the server's budget.
    pub(crate) async fn execute(&self, mut plan: Plan) -> Charged<RunResult> {
        let none = |r| Charged::new(r, Charge::default());
        // Checked here for every run; the sandbox of its own (a copy of the whole policy) is made
        // only for a run that no template makes, below.
        if let Err(e) = plan.policy.validate() {
            return none(sandbox_error(
                ServiceError::internal(format!("policy: {e}")),
                None,
            ));
        }
        let own = |policy: &Policy| {
            Sandbox::from_policy(policy.clone())
                .map_err(|e| sandbox_error(ServiceError::internal(format!("policy: {e}")), None))
        };
        if plan.direct {
            let io = Io {
                stdin: Some(Stdin::Bytes(plan.stdin)),
                stream_buffer: None,
                files: plan
                    .files
                    .into_iter()
                    .map(|(path, data)| palisade::FileIn {
                        path,
                        data: data.into(),
                        mode: 0o644,
                    })
                    .collect(),
                ..Io::default()
            };
            let held = match self.template_for(&mut plan.policy, plan.warm).await {
                Some(t) => {
                    Held::start_template(self, t, plan.policy.command.clone(), plan.run_env, io)
                        .await
                }
                None => match own(&plan.policy) {
                    Ok(sandbox) => Held::start(self, sandbox, io).await,
                    Err(r) => return none(r),
                },
            };
            let out = held.finish().await;
            return self.direct_result(out);
        }
        let t0 = Instant::now();
        let warm = if plan.poolable {
            self.take_warm()
        } else {
            None
        };
        let (held, conn) = match warm {
            Some(w) => (w.held, w.conn),
            None => {
                let io = Io {
                    stdin: Some(Stdin::Socket),
                    stream_buffer: None,
                    ..Io::default()
                };
                let mut held = match self.template_for(&mut plan.policy, false).await {
                    Some(t) => {
                        let argv = plan.policy.command.clone();
                        Held::start_template(self, t, argv, plan.run_env.clone(), io).await
                    }
                    None => match own(&plan.policy) {
                        Ok(sandbox) => Held::start(self, sandbox, io).await,
                        Err(r) => return none(r),
                    },
                };
                let Some(sock) = held.run_mut().take_stdin() else {
                    let out = held.finish().await;
                    return self.direct_result(out);
                };
                let conn = match AgentConn::new(
                    sock,
                    self.inner.config.max_fetch_bytes as usize + 1,
                    self.inner.held.clone(),
                ) {
                    Ok(c) => c,
                    Err(e) => {
                        return none(sandbox_error(
                            ServiceError::internal(format!("agent socket: {e}")),
                            None,
                        ))
                    }
                };
                (held, conn)
            }
        };
        tracing::debug!(
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "agent sandbox ready"
        );
        let mut result = agent_stages(&conn, &plan, self.inner.config.max_fetch_bytes).await;
        tracing::debug!(
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "agent stages done"
        );
        if conn.is_dead() {
            // The agent stopped answering (or died): nothing more of the run goes through it,
            // and its sandbox goes at once rather than at its own deadline.
            held.kill();
            if result.status == RunStatus::SandboxError && result.error.is_none() {
                result.error = Some(ServiceError::internal(format!("the agent: {}", conn.why())));
            }
        }
        let agent_dead = conn.is_dead();
        conn.close().await;
        let out = held.finish().await;
        tracing::debug!(
            ms = t0.elapsed().as_secs_f64() * 1000.0,
            "agent sandbox ended"
        );
        // What the sandbox's own report says overrides a stage left unfinished: it was killed
        // for the sandbox's deadline, CPU time or memory, or palisade failed.
        let ended = matches!(
            result.status,
            RunStatus::Ok
                | RunStatus::Exit
                | RunStatus::Signal
                | RunStatus::Timeout
                | RunStatus::OutputLimit
        );
        match out.report.status {
            Status::SandboxError | Status::ProtectionFailed if !ended || result.error.is_some() => {
                result.status = RunStatus::SandboxError;
                result.error = Some(ServiceError::internal(
                    out.report
                        .error
                        .clone()
                        .unwrap_or_else(|| "sandbox error".into()),
                ));
            }
            Status::CpuTimeout if !ended || result.signal == Some(9) => {
                result.status = RunStatus::CpuTimeout;
                result.error = None;
            }
            Status::Timeout if !ended => {
                result.status = RunStatus::Timeout;
                result.error = None;
            }
            Status::Oom if !ended => {
                result.status = RunStatus::Oom;
                result.error = None;
            }
            _ => {}
        }
        // The agent killed by the OOM killer while a stage ran: the run reached its memory
        // ceiling, and the kernel took the largest process of the sandbox, which need not be the
        // program (one that filled scratch with a file maps little itself). The sandbox was then
        // stopped (`cancelled` in its report); the run's result is the memory's.
        if agent_dead && out.report.oom_kills > 0 && result.status == RunStatus::SandboxError {
            result.status = RunStatus::Oom;
            result.error = None;
        }
        // Files that could not be read back because the sandbox was gone: `oom` where the OOM
        // killer took the agent (reading a file back takes memory too, after a program that
        // left the run little), else `not-fetched`.
        if agent_dead {
            let why = if out.report.oom_kills > 0 {
                "oom"
            } else {
                "not-fetched"
            };
            for p in &plan.fetch {
                if !result.files.contains_key(p) && !result.file_errors.contains_key(p) {
                    result.file_errors.insert(p.clone(), why.into());
                }
            }
        }
        // A stage killed by SIGKILL in a sandbox where the OOM killer acted died of memory.
        if out.report.oom_kills > 0
            && result.status == RunStatus::Signal
            && result.signal == Some(9)
        {
            result.status = RunStatus::Oom;
        }
        if let Some(c) = result.compile.as_mut() {
            if out.report.oom_kills > 0 && c.status == RunStatus::Signal && c.signal == Some(9) {
                c.status = RunStatus::Oom;
                if result.stdout.bytes == 0 && result.exit_code.is_none() {
                    result.status = RunStatus::Oom;
                }
            }
        }
        result.report = Some(RunReport::new(out.report));
        result
    }

    /// `POST /v1/run/batch`: every run checked first (a bad one fails the whole batch, naming
    /// `runs[i]`), then run with at most `concurrency` at once; results are sent on the channel
    /// as they finish, each with its index. The batch holds one place in the queue; its runs
    /// share the server's slots with everyone else's. Dropping the receiver (a client that went
    /// away) kills the batch's running sandboxes.
    pub fn run_batch(
        &self,
        req: api::BatchRequest,
    ) -> Result<tokio::sync::mpsc::Receiver<Charged<api::BatchLine>>, ServiceError> {
        if req.runs.is_empty() {
            return Err(ServiceError::invalid("runs", "[]", "at least one run"));
        }
        let max = self.inner.config.max_concurrency;
        let conc = match req.concurrency {
            None => max,
            Some(0) => {
                return Err(ServiceError::invalid(
                    "concurrency",
                    "0",
                    format!("between 1 and {max}"),
                ))
            }
            Some(c) if c > max => return Err(ServiceError::ceiling("concurrency", c, max)),
            Some(c) => c,
        };
        let plans: Vec<Plan> = req
            .runs
            .iter()
            .enumerate()
            .map(|(i, r)| self.plan(r, &format!("runs[{i}].")))
            .collect::<Result<_, _>>()?;
        let ticket = self.admit()?;
        // One result waits in the channel; the others that are done wait to be sent, each with
        // its place of the batch's `conc` held.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let svc = self.clone();
        tokio::spawn(async move {
            let _ticket = ticket;
            let local = std::sync::Arc::new(tokio::sync::Semaphore::new(conc));
            let mut set = tokio::task::JoinSet::new();
            for (index, plan) in plans.into_iter().enumerate() {
                let Ok(lp) = local.clone().acquire_owned().await else {
                    break;
                };
                if tx.is_closed() || svc.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                // A run starts only while the server's budget of bytes held for replies has room,
                // checked once it has its slot (as a queued run, `Ticket::ready`: checked before
                // the wait, twenty batches' runs held twelve times the budget); a batch's run
                // waits for room rather than fail, its slot given back meanwhile.
                // At shutdown it stops waiting: the rest of the batch is not started (it waited
                // out the grace period).
                let stopping = || svc.inner.stopping.load(std::sync::atomic::Ordering::SeqCst);
                let gp = loop {
                    while !svc.inner.held.has_room() && !tx.is_closed() && !stopping() {
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                            _ = tx.closed() => {}
                        }
                    }
                    if tx.is_closed() || stopping() {
                        break None;
                    }
                    let Ok(gp) = svc.inner.slots.clone().acquire_owned().await else {
                        break None;
                    };
                    if svc.inner.held.has_room() {
                        break Some(gp);
                    }
                };
                let Some(gp) = gp else {
                    break;
                };
                let (svc, tx) = (svc.clone(), tx.clone());
                set.spawn(async move {
                    let t0 = Instant::now();
                    let result = tokio::select! {
                        r = svc.execute(plan) => r,
                        // The client went away: dropping the run kills its sandbox.
                        _ = tx.closed() => return,
                    };
                    svc.inner.metrics.run(
                        result.status,
                        t0.elapsed().as_secs_f64(),
                        result.report.as_ref().map(RunReport::get),
                    );
                    // The server's slot goes back at once; the batch's own place only once the
                    // result is handed on, so that a client that stops reading stops the batch
                    // (at most `conc` results wait for it) instead of piling results up.
                    drop(gp);
                    let (result, held) = result.into_parts();
                    let _ = tx
                        .send(Charged::new(api::BatchLine { index, result }, held))
                        .await;
                    drop(lp);
                });
                while set.try_join_next().is_some() {}
            }
            while set.join_next().await.is_some() {}
        });
        Ok(rx)
    }
}

/// The agent's bind: the server's executable, read-only, at the agent's path.
pub(crate) fn agent_bind(exe: &std::path::Path) -> Result<Bind, ServiceError> {
    Bind::parse(&format!("{}:{}", exe.display(), proto::AGENT_PATH), false)
        .map_err(|e| ServiceError::internal(format!("the agent's bind: {e}")))
}

/// The stages through the agent: files in, compile, run, files out.
async fn agent_stages(conn: &AgentConn, plan: &Plan, max_fetch: u64) -> Charged<RunResult> {
    let mut result = Charged::new(empty_result(RunStatus::SandboxError), Charge::default());
    for (path, data) in &plan.files {
        let id = conn.id();
        match conn
            .call(
                Request::Write {
                    id,
                    path: path.clone(),
                    mode: 0o644,
                },
                data.clone(),
            )
            .await
        {
            Ok(crate::client::Reply::Ok { .. }) => {}
            Ok(crate::client::Reply::Full) => {
                result.error = Some(ServiceError::internal(
                    "the agent answered a write in pieces",
                ));
                return result;
            }
            Ok(crate::client::Reply::Err { code, message }) => {
                result.error = Some(ServiceError::file(
                    &format!("files[{path:?}]"),
                    &code,
                    &message,
                ));
                return result;
            }
            Err(e) => {
                result.error = Some(ServiceError::internal(format!("the agent: {}", e.0)));
                return result;
            }
        }
    }
    if let Some(c) = &plan.compile {
        let stage = match stage(conn, c, Vec::new()).await {
            Ok((s, held)) => {
                result.charge.merge(held);
                s
            }
            Err(e) => {
                result.error = Some(e);
                return result;
            }
        };
        let ok = stage.status == RunStatus::Ok;
        let (status, exit_code, signal) = (stage.status, stage.exit_code, stage.signal);
        result.compile = Some(stage);
        if !ok {
            result.status = status;
            result.exit_code = exit_code;
            result.signal = signal;
            result.wall_time_ms = 0.0;
            return result;
        }
    }
    match stage(conn, &plan.run, plan.stdin.clone()).await {
        Ok((s, held)) => {
            result.charge.merge(held);
            result.cut_by_server = s.cut_by_server;
            result.status = s.status;
            result.exit_code = s.exit_code;
            result.signal = s.signal;
            result.wall_time_ms = s.wall_time_ms;
            result.stdout = s.stdout;
            result.stderr = s.stderr;
        }
        Err(e) => {
            result.error = Some(e);
            return result;
        }
    }
    // One budget for all the files of a run (--max-fetch), so that many fetches cannot make the
    // server hold many times it.
    let mut budget = max_fetch;
    for p in &plan.fetch {
        let id = conn.id();
        match conn
            .call(
                Request::Read {
                    id,
                    path: p.clone(),
                    max: budget,
                    offset: 0,
                    len: None,
                },
                bytes::Bytes::new(),
            )
            .await
        {
            Ok(crate::client::Reply::Ok { data, held, .. }) => {
                budget = budget.saturating_sub(data.len() as u64);
                result.charge.merge(held);
                result.files.insert(p.clone(), Data::new(data, false));
            }
            Ok(crate::client::Reply::Err { code, .. }) => {
                result
                    .file_errors
                    .insert(p.clone(), crate::shorten(&code, 40));
            }
            // Past the server's budget of bytes held: not read back (`busy`, retry later).
            Ok(crate::client::Reply::Full) => {
                result.file_errors.insert(p.clone(), "busy".into());
            }
            Err(_) => break,
        }
    }
    result
}

/// A chunk of a streamed exec's output: whether it is stderr's, its bytes, and what they hold
/// against the server's budget.
pub(crate) type Chunk = (bool, Vec<u8>, Charge);

/// What one exec's pipes and end gave.
pub(crate) struct Captured {
    pub exit: Option<Exit>,
    pub timed_out: bool,
    pub output_hit: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes handed to a tap.
    pub streamed: u64,
    /// Output a streaming client did not take by the exec's deadline, dropped.
    pub dropped: bool,
    pub wall: Duration,
    /// The output kept, counted against the server's budget of bytes held.
    pub held: Charge,
    /// Output cut because that budget was full.
    pub cut_by_server: bool,
}

/// Runs one stage through the agent and reads its pipes, keeping its deadline and output cap.
async fn stage(
    conn: &AgentConn,
    s: &StagePlan,
    stdin: Vec<u8>,
) -> Result<(Stage, Charge), ServiceError> {
    let exec = match conn
        .exec(s.argv.clone(), Vec::new(), String::new(), &[])
        .await
    {
        Ok(Ok(e)) => e,
        Ok(Err((code, message))) => return Err(exec_error(&code, &message)),
        Err(e) => return Err(ServiceError::internal(format!("the agent: {}", e.0))),
    };
    let mut c = capture(
        conn,
        exec,
        stdin,
        Charge::default(),
        s.timeout,
        s.output,
        None,
    )
    .await;
    let stage = stage_of(&mut c);
    Ok((stage, c.held))
}

/// The program could not be started (not found, not executable): in a run's result, a sandbox
/// error of kind `exec` as palisade's report says it, never the program's own result; for a
/// session's exec, a 400 naming `command`.
pub(crate) fn exec_error(code: &str, message: &str) -> ServiceError {
    ServiceError {
        code: "exec",
        field: Some("command".into()),
        value: Some(crate::shorten(code, 40)),
        class: crate::Class::BadRequest,
        ..ServiceError::internal(crate::shorten(message, 500))
    }
}

/// How a captured exec ended, in the run vocabulary; its output moves into the stage (not
/// copied: an exec may have captured up to its whole output cap).
pub(crate) fn stage_of(c: &mut Captured) -> Stage {
    let (status, code, signal) = if c.timed_out {
        (RunStatus::Timeout, None, None)
    } else if c.output_hit {
        (RunStatus::OutputLimit, None, None)
    } else {
        match c.exit {
            Some(Exit { code: Some(0), .. }) => (RunStatus::Ok, Some(0), None),
            Some(Exit { code: Some(n), .. }) => (RunStatus::Exit, Some(n), None),
            Some(Exit {
                signal: Some(s), ..
            }) => (RunStatus::Signal, None, Some(s)),
            _ => (RunStatus::SandboxError, None, None),
        }
    };
    Stage {
        status,
        exit_code: code,
        signal,
        wall_time_ms: c
            .exit
            .map(|e| e.wall_ms)
            .unwrap_or(c.wall.as_secs_f64() * 1000.0),
        cpu_time_ms: c.exit.and_then(|e| e.cpu_ms),
        oom_kills: None,
        cut_by_server: c.cut_by_server,
        // A streamed exec keeps none of its output here; its exit says whether some was lost.
        stdout: Data::new(std::mem::take(&mut c.stdout), c.output_hit || c.dropped),
        stderr: Data::new(std::mem::take(&mut c.stderr), c.output_hit || c.dropped),
    }
}

/// Writes `stdin`, reads stdout and stderr (at most `cap` bytes together; past it the exec is
/// killed), and waits for the end, killing the exec at `timeout`. `tap` gets each chunk as it
/// comes (streamed execs). If the exec does not end within a grace after a kill, it is given up
/// (`exit` stays `None`): the caller then kills the whole sandbox.
pub(crate) async fn capture(
    conn: &AgentConn,
    mut exec: Exec,
    stdin: Vec<u8>,
    stdin_held: Charge,
    timeout: Duration,
    cap: u64,
    tap: Option<&tokio::sync::mpsc::Sender<Chunk>>,
) -> Captured {
    let t0 = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut c = Captured {
        exit: None,
        timed_out: false,
        output_hit: false,
        stdout: Vec::new(),
        stderr: Vec::new(),
        streamed: 0,
        dropped: false,
        wall: Duration::ZERO,
        held: conn.held().charge(),
        cut_by_server: false,
    };
    let mut writer = exec.stdin.take().map(|mut w| {
        tokio::spawn(async move {
            let _ = w.write_all(&stdin).await;
            // Dropped here: end of file for the program; and the bytes' room in the budget.
            drop(stdin_held);
        })
    });
    let (mut out_open, mut err_open) = (true, true);
    let mut exit_rx = Some(&mut exec.exit);
    let mut killed_at: Option<tokio::time::Instant> = None;
    let mut ended_at: Option<tokio::time::Instant> = None;
    let mut ob = vec![0u8; 32 << 10];
    let mut eb = vec![0u8; 32 << 10];
    loop {
        if !out_open && !err_open && c.exit.is_some() {
            break;
        }
        let grace_end = match (killed_at, ended_at) {
            (Some(k), _) => Some(k + DRAIN_GRACE),
            (None, Some(e)) => Some(e + DRAIN_GRACE),
            _ => None,
        };
        let kill_at = if killed_at.is_some() {
            None
        } else {
            Some(deadline)
        };
        tokio::select! {
            r = exec.stdout.read(&mut ob), if out_open => match r {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => keep(&mut c, false, &ob[..n], cap, tap, deadline).await,
            },
            r = exec.stderr.read(&mut eb), if err_open => match r {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => keep(&mut c, true, &eb[..n], cap, tap, deadline).await,
            },
            e = async { exit_rx.as_mut().expect("guarded").await }, if exit_rx.is_some() => {
                exit_rx = None;
                match e {
                    Ok(e) => { c.exit = Some(e); ended_at = Some(tokio::time::Instant::now()); }
                    // The agent is gone: nothing more will come.
                    Err(_) => break,
                }
            },
            _ = tokio::time::sleep_until(kill_at.unwrap_or(deadline)), if kill_at.is_some() => {
                c.timed_out = c.exit.is_none();
                killed_at = Some(tokio::time::Instant::now());
                if c.exit.is_none() { let _ = conn.signal(exec.id, 9).await; }
            },
            _ = tokio::time::sleep_until(grace_end.unwrap_or(deadline)), if grace_end.is_some() => break,
            // A streaming client went away (acted on below).
            _ = async { tap.expect("guarded").closed().await }, if tap.is_some() && killed_at.is_none() => {},
        }
        if c.output_hit && killed_at.is_none() {
            killed_at = Some(tokio::time::Instant::now());
            let _ = conn.signal(exec.id, 9).await;
        }
        if tap.is_some_and(|t| t.is_closed()) && killed_at.is_none() {
            // A streaming client went away: the exec goes too.
            killed_at = Some(tokio::time::Instant::now());
            let _ = conn.signal(exec.id, 9).await;
        }
    }
    if let Some(w) = writer.take() {
        w.abort();
    }
    c.wall = t0.elapsed();
    if c.cut_by_server {
        conn.held().note_cut();
    }
    c
}

/// Keeps a chunk of output, or hands it to `tap` (a streamed exec). A streaming client that
/// does not read holds the hand-over only until the exec's `deadline`: past it the chunk is
/// dropped, so that the deadline still kills the exec (the caller's loop acts on it next).
async fn keep(
    c: &mut Captured,
    err: bool,
    b: &[u8],
    cap: u64,
    tap: Option<&tokio::sync::mpsc::Sender<Chunk>>,
    deadline: tokio::time::Instant,
) {
    let used = (c.stdout.len() + c.stderr.len()) as u64 + c.streamed;
    let room = cap.saturating_sub(used) as usize;
    let take = &b[..b.len().min(room)];
    if take.len() < b.len() {
        c.output_hit = true;
    }
    if take.is_empty() {
        return;
    }
    match tap {
        // Streamed bytes are counted against the cap, not kept; on their way to the client they
        // hold their room in the server's budget, and what does not fit is cut as kept output is.
        Some(t) => {
            let mut held = c.held.budget_charge();
            if !held.try_grow(take.len() as u64) {
                c.output_hit = true;
                c.cut_by_server = true;
                return;
            }
            c.streamed += take.len() as u64;
            let sent = tokio::time::timeout_at(deadline, t.send((err, take.to_vec(), held))).await;
            // Not taken by the deadline (a client that went away is acted on by the caller).
            if sent.is_err() {
                c.dropped = true;
            }
        }
        // What does not fit in the server's budget is not kept: the exec is killed as at its
        // own cap (the caller's loop acts on `output_hit`), and its result says why.
        None if !c.held.try_grow(take.len() as u64) => {
            c.output_hit = true;
            c.cut_by_server = true;
        }
        None if err => c.stderr.extend_from_slice(take),
        None => c.stdout.extend_from_slice(take),
    }
}

fn empty_result(status: RunStatus) -> RunResult {
    RunResult {
        status,
        exit_code: None,
        signal: None,
        wall_time_ms: 0.0,
        stdout: Data::default(),
        stderr: Data::default(),
        compile: None,
        files: BTreeMap::new(),
        file_errors: BTreeMap::new(),
        error: None,
        report: None,
        cut_by_server: false,
    }
}

pub(crate) fn sandbox_error(e: ServiceError, report: Option<RunReport>) -> RunResult {
    RunResult {
        error: Some(e),
        report,
        ..empty_result(RunStatus::SandboxError)
    }
}

/// The status of a report, in the run vocabulary.
pub(crate) fn status_of(r: &palisade::Report) -> RunStatus {
    match r.status {
        Status::Ok => RunStatus::Ok,
        Status::Exit => RunStatus::Exit,
        Status::Signal => RunStatus::Signal,
        Status::Timeout => RunStatus::Timeout,
        Status::CpuTimeout => RunStatus::CpuTimeout,
        Status::Oom => RunStatus::Oom,
        Status::OutputLimit => RunStatus::OutputLimit,
        Status::Cancelled | Status::SandboxError | Status::ProtectionFailed => {
            RunStatus::SandboxError
        }
    }
}

impl Service {
    /// A direct run's result, its output counted against the server's budget (a run admitted
    /// while the budget was not full; its output is bounded by its cap).
    fn direct_result(&self, out: palisade::Output) -> Charged<RunResult> {
        let held = self
            .inner
            .held
            .force((out.stdout.len() + out.stderr.len()) as u64);
        Charged::new(direct_result(out), held)
    }
}

/// A direct run's result.
fn direct_result(out: palisade::Output) -> RunResult {
    let r = &out.report;
    let status = status_of(r);
    let truncated = r.output_truncated;
    let mut result = RunResult {
        status,
        exit_code: r
            .exit_code
            .filter(|_| matches!(status, RunStatus::Ok | RunStatus::Exit)),
        signal: r.signal,
        wall_time_ms: r.wall_time_ms,
        stdout: Data::new(out.stdout, truncated),
        stderr: Data::new(out.stderr, truncated),
        compile: None,
        files: BTreeMap::new(),
        file_errors: BTreeMap::new(),
        error: (status == RunStatus::SandboxError).then(|| {
            let mut e = ServiceError::internal(
                r.error.clone().unwrap_or_else(|| format!("{:?}", r.status)),
            );
            e.code = "sandbox-error";
            e.value = r.error_kind.map(str::to_owned);
            e
        }),
        report: None,
        cut_by_server: false,
    };
    result.report = Some(RunReport::new(out.report));
    result
}
