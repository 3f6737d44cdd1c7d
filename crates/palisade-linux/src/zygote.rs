//! Templates: a prepared policy that starts fresh sandboxes quickly (docs/engine.md).
//!
//! A [`Template`] is one zygote: palisade's own program, exec'd once (see `engine`) in a user
//! namespace of its own (the template's, T) and a mount namespace, where it builds the part of the
//! view that is the same for every run (system directories, `/etc`, `/dev`'s nodes, the policy's
//! binds outside per-run places), makes it read-only and pivots into it; it also holds a
//! descriptor for each Landlock rule of that part. It is small, single-threaded and holds nothing
//! of the supervisor. For each run (usually ahead of it: while the run before runs) the
//! supervisor sends it a request on the template's socket (`SOCK_SEQPACKET`, one bounded record:
//! the run's part of the view and the init's descriptors, no program); the zygote clones a
//! per-run init with `CLONE_NEWUSER | CLONE_NEWPID` and `CLONE_PARENT` (so the init is the
//! supervisor's child: the supervisor waits for it, gets its rusage, owns its pidfd), then goes
//! back to waiting. The per-run init:
//!
//! - maps itself into its new user namespace (P, a child of T: one uid and one gid, each to
//!   itself; the kernel lets a process map its own ids), so that the per-user counts of the run
//!   (processes, queued signals, inotify instances) and the ceilings of `/proc/sys/user` are its
//!   own, and every mount copied from the zygote is locked;
//! - unshares new mount, network, IPC and UTS namespaces (owned by P): the network namespace,
//!   the costliest, is made in parallel with the zygote serving the next request;
//! - mounts its per-run part on the prepared view's mount points (`plan::PER_RUN_MOUNTS`): a
//!   fresh `/proc` for its pid namespace, `/dev/pts`, `/dev/shm`, `/tmp`, the scratch
//!   directory and what lies under them; the prepared part is read-only, and locked so (the copy
//!   of a mount into a less privileged namespace keeps its read-only flag for good);
//! - runs the in-process engine's steps 10–12 (Landlock, hostname, loopback, egress listeners,
//!   pty), then waits on its own socket for the run's program and streams
//!   ([`receive_program`]), which the supervisor sends when the run starts;
//! - then steps 13–20 (the run's files, the cgroup join, the payload).
//!
//! The zygote never talks to a payload and never holds a run's program: a payload runs in a pid
//! namespace where the zygote does not exist, in a user namespace that has no capability over T,
//! and the per-run init has closed the template's socket before anything of the run's own
//! happens. What runs of one template share is written in docs/engine.md.

use crate::child::{self, ChildFds, Msg, Prepared, Step};
use crate::engine::{self, InitProgram};
use crate::error::SetupError;
use crate::plan::{self, Ids, Op, Plan, RunPart, Source};
use crate::spawn::{self, BeforeStart, IdLease, Running, Stdin, Views};
use crate::sys;
use crate::warm::{self, WarmPython};
use crate::wire::{self, Reader, WireError, Writer};
use libc::c_int;
use palisade_policy::{Policy, Scratch};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

/// Message kinds on a template's socket.
const KIND_TEMPLATE: u8 = 2;
const KIND_READY: u8 = 3;
const KIND_RUN: u8 = 4;
const KIND_FAILED: u8 = 5;
/// The supervisor gives a run's network namespace back (see [`NetLease`]).
const KIND_RETURN: u8 = 6;
/// A run's program, on its init's own socket (see [`receive_program`]).
const KIND_PROGRAM: u8 = 7;

/// Most bytes of one message on a template's socket (a `SOCK_SEQPACKET` record, which the
/// kernel refuses past the socket's send buffer, ~208 KiB by default), and of a run's program
/// record on its init's socket (after its length): a run's program, arguments and environment
/// together must fit.
pub const MAX_RECORD: usize = 160 * 1024;

/// How long a run waits for the zygote's answer (the new init's pid), in milliseconds.
const ZYGOTE_ANSWER_MS: i32 = 30_000;

/// The namespaces the zygote is made in: the template's user namespace and a mount namespace
/// (from which it makes the prepared view's own).
const ZYGOTE_NAMESPACES: u64 = sys::CLONE_NEWUSER | sys::CLONE_NEWNS;

/// A prepared policy: one zygote, ready to start runs. Dropping it ends the zygote; runs already
/// started are not affected. Its runs' inits are children of the thread that made it (their
/// parent-death signal is tied to it): keep that thread alive as long as the template and its
/// runs.
pub struct Template {
    /// Shared with the runs' [`NetLease`]s, which give their network namespaces back on it.
    ctl: Arc<OwnedFd>,
    zygote: i32,
    _zygote_pidfd: OwnedFd,
    /// Root: the template's user namespace, through which a run's writable trees are idmapped.
    userns: Option<File>,
    ids: Ids,
    /// The template's plan, for the supervisor: what a run's report says (Landlock, sockets), and
    /// the per-run part a run with an ephemeral scratch reuses.
    plan: Plan,
    part: RunPart,
    /// With warm Python: the interpreter the zygote holds (docs/engine.md, "Warm Python").
    warm: Option<WarmPython>,
    /// Runs' inits made ahead, and how many are being asked for now (together at most
    /// [`AHEAD`]).
    ahead: std::sync::Mutex<(Vec<Ahead>, usize)>,
    _lease: Option<IdLease>,
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Template")
            .field("zygote", &self.zygote)
            .field("ids", &self.ids)
            .finish_non_exhaustive()
    }
}

fn supervisor(op: &'static str, e: i32) -> SetupError {
    SetupError::Supervisor {
        op,
        source: io::Error::from_raw_os_error(e),
    }
}

/// A record for a run's init or the zygote, if it is at most [`MAX_RECORD`] bytes; `what` names
/// what it holds.
fn bounded(record: Vec<u8>, what: &str) -> Result<Vec<u8>, SetupError> {
    if record.len() > MAX_RECORD {
        return Err(SetupError::Supervisor {
            op: "start a run of the template",
            source: io::Error::other(format!(
                "{what}: {} bytes; a template's run takes at most {MAX_RECORD}",
                record.len()
            )),
        });
    }
    Ok(record)
}

/// A warm run's code pipe: the read end (for the payload), with `data` already in it. The pipe
/// holds all of it, so the write never waits for a reader.
fn code_pipe(data: &[u8]) -> Result<OwnedFd, SetupError> {
    if data.len() > warm::MAX_WARM_RUN {
        return Err(SetupError::Supervisor {
            op: "start a warm run",
            source: io::Error::other(format!(
                "its code, arguments and environment take {} bytes; a warm run takes at most {}",
                data.len(),
                warm::MAX_WARM_RUN
            )),
        });
    }
    let (r, w) = sys::pipe().map_err(|e| supervisor("make a warm run's code pipe", e))?;
    let want = data.len().max(4096) as c_int;
    sys::set_pipe_size(w.as_raw_fd(), want)
        .map_err(|e| supervisor("size a warm run's code pipe", e))?;
    sys::write_all(w.as_raw_fd(), data).map_err(|e| supervisor("write a warm run's code", e))?;
    let r = spawn::above2(r)?;
    Ok(r)
}

/// A zygote's failure to start warm Python, in words (the module named).
fn warm_error(m: &Msg, wp: &WarmPython) -> Option<SetupError> {
    let what = match Step::from_u32(m.step)? {
        Step::WarmPython if m.index == 0 => format!(
            "load and start {} (warm_python.library)",
            wp.library.display()
        ),
        Step::WarmPython if m.index == warm::END_FAILED => format!(
            "define how runs start and end in the warm interpreter of {} (a module of \
             warm_python.modules may have replaced one of the standard library's)",
            wp.real.display()
        ),
        Step::WarmPython => format!(
            "find CPython's C API in {} (warm_python.library)",
            wp.library.display()
        ),
        Step::WarmImport => format!(
            "import {} in the warm interpreter (warm_python.modules; is it installed for {}?)",
            wp.modules
                .get(m.index as usize)
                .map_or("os, signal, types, weakref", |s| s.as_str()),
            wp.real.display()
        ),
        Step::WarmThreads => format!(
            "keep the warm interpreter single-threaded: after the imports of warm_python.modules it has {} threads (a module that starts threads at import cannot be forked; leave it out)",
            m.index
        ),
        _ => return None,
    };
    Some(SetupError::Child {
        step: Step::from_u32(m.step)?,
        what,
        source: io::Error::from_raw_os_error(m.value),
    })
}

/// What templates do not take: a workspace (its overlay, and the upper layer the supervisor
/// reads after the run, are one run's own from the first step, which a prepared view cannot
/// share), and TLS inspection (each run's CA is trusted through files of the view's `/etc`, which
/// the template builds once).
fn template_takes(policy: &Policy) -> Result<(), SetupError> {
    let refuse = |why: &str| SetupError::Supervisor {
        op: "use a template",
        source: io::Error::new(io::ErrorKind::Unsupported, why.to_owned()),
    };
    if let Scratch::Workspace { .. } = &policy.scratch {
        return Err(refuse(
            "filesystem.workspace: a workspace is one run's own; templates take an ephemeral or \
             host scratch directory (start a workspace run with Sandbox::start)",
        ));
    }
    if policy.network.inspects_any() {
        return Err(refuse(
            "network.inspect (or network.http, network.secrets): TLS inspection trusts a CA of \
             the run's own in the view's /etc, which a template builds once; start such runs \
             with Sandbox::start",
        ));
    }
    Ok(())
}

impl Template {
    /// Prepares `policy` (its command is the default for runs): starts the zygote with `prog`,
    /// which builds the prepared view, and returns once it is ready. Root launches claim one
    /// host id for the template's lifetime, which all its runs use.
    ///
    /// With `warm`, the zygote also starts that Python and imports its modules before it says
    /// ready; runs of `python3 -c CODE` are then forks of it ([`WarmPython::takes`]).
    pub fn new(
        policy: &Policy,
        prog: &InitProgram,
        warm: Option<&WarmPython>,
    ) -> Result<Template, SetupError> {
        template_takes(policy)?;
        let (ids, scratch_seen, lease) = spawn::choose_ids(policy)?;
        let mut plan = plan::build(policy, ids, &plan::RealHost)?;
        spawn::check_scratch(&plan, scratch_seen)?;
        let part = plan::run_part(&plan);
        // Root: the sources of the prepared view the supervisor opens itself. The run's own are
        // opened for each run (a tree mounts once).
        let prepared: Vec<bool> = (0..plan.sources.len())
            .map(|i| {
                plan.ops.iter().any(
                    |o| matches!(o, Op::Bind { source, .. } if *source == i && !plan::is_per_run(o)),
                )
            })
            .collect();
        let mut opened: Vec<Source> = plan
            .sources
            .iter()
            .zip(&prepared)
            .map(|(s, &p)| Source {
                in_supervisor: s.in_supervisor && p,
                ..s.clone()
            })
            .collect();
        let trees = spawn::open_trees(&mut opened)?;
        for (s, o) in plan.sources.iter_mut().zip(&opened) {
            s.tree = o.tree;
        }
        let (ours, theirs) = sys::socketpair(libc::SOCK_SEQPACKET)
            .map_err(|e| supervisor("socketpair for the template", e))?;
        let ctl = spawn::above2(ours)?;
        let theirs = spawn::above2(theirs)?;
        let null = spawn::devnull()?;
        let n = null.as_raw_fd();
        let switched = spawn::switch_ids(ids)?;
        let started = engine::exec_in_namespaces(
            prog,
            ZYGOTE_NAMESPACES,
            "zygote",
            engine::ZYGOTE_ARGV0,
            &[theirs.as_raw_fd()],
            [n, n, n],
            &[theirs.as_raw_fd()],
        );
        drop(switched);
        let z = started.map_err(spawn::exec_error)?;
        drop((theirs, null));
        let pid = z.pid;
        let mut t = Template {
            ctl: Arc::new(ctl),
            zygote: pid,
            _zygote_pidfd: z.pidfd,
            userns: None,
            ids,
            plan,
            part,
            warm: warm.cloned(),
            ahead: std::sync::Mutex::new((Vec::new(), 0)),
            _lease: lease,
        };
        // The maps, as for a cold run (spawn.rs, step e).
        if ids.privileged {
            spawn::write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
            spawn::write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
            let ns = File::open(format!("/proc/{pid}/ns/user"))
                .map_err(spawn::io_err("open the template's user namespace"))?;
            spawn::idmap_trees(&t.plan.sources, ns.as_raw_fd())?;
            t.userns = Some(ns);
        } else {
            spawn::write_proc(pid, "setgroups", "deny")?;
            spawn::write_proc(pid, "uid_map", &format!("{} {} 1\n", ids.uid, ids.host_uid))?;
            spawn::write_proc(pid, "gid_map", &format!("{} {} 1\n", ids.gid, ids.host_gid))?;
        }
        // The plan, with the trees of the prepared view.
        let mut w = Writer::new(KIND_TEMPLATE);
        wire::write_plan(&mut w, &t.plan);
        let with_tree: Vec<usize> = (0..t.plan.sources.len())
            .filter(|&i| t.plan.sources[i].tree >= 0)
            .collect();
        w.len(with_tree.len());
        with_tree.iter().for_each(|&i| w.len(i));
        w.bool(warm.is_some());
        if let Some(wp) = warm {
            let c = |p: &std::path::Path| {
                CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| SetupError::Supervisor {
                    op: "prepare warm Python",
                    source: io::Error::other(format!("a path with a NUL byte: {}", p.display())),
                })
            };
            w.cstr(&c(&wp.library)?);
            w.cstr(&c(&wp.real)?);
            let modules: Vec<CString> = wp
                .modules
                .iter()
                .map(|m| CString::new(m.as_str()).expect("module names are checked"))
                .collect();
            w.cstrs(&modules);
        }
        let raw: Vec<c_int> = with_tree.iter().map(|&i| t.plan.sources[i].tree).collect();
        let bytes = w.into_bytes();
        if bytes.len() > MAX_RECORD {
            return Err(supervisor("send the template its plan", libc::EMSGSIZE));
        }
        sys::send_msg(t.ctl.as_raw_fd(), &bytes, &raw)
            .map_err(|e| supervisor("send the template its plan", e))?;
        drop(trees);
        for s in &mut t.plan.sources {
            s.tree = -1;
        }
        // Ready, or why not.
        let mut buf = vec![0u8; 64];
        let got = sys::recv_msg(t.ctl.as_raw_fd(), &mut buf)
            .map_err(|e| supervisor("hear from the template's zygote", e))?;
        got.fds.into_iter().for_each(sys::close_owned); // none is expected
        let reply = Reader::new(&buf[..got.len]);
        match reply {
            Ok((KIND_READY, r)) => match r.finish() {
                Ok(()) => {
                    t.fill();
                    Ok(t)
                }
                Err(e) => Err(SetupError::Supervisor {
                    op: "prepare the template",
                    source: io::Error::other(e),
                }),
            },
            Ok((KIND_FAILED, mut r)) => {
                let m = Msg {
                    kind: child::MSG_SETUP_ERROR,
                    step: r.u32("step").unwrap_or(0),
                    index: r.u32("index").unwrap_or(0),
                    value: r.i32("errno").unwrap_or(libc::EIO),
                };
                let views = Views {
                    sources: &t.plan.sources,
                    ops: &t.plan.ops,
                    plan: &t.plan,
                    program: &policy.command[0],
                    files: &[],
                };
                if let Some(e) = warm.and_then(|wp| warm_error(&m, wp)) {
                    return Err(e);
                }
                Err(spawn::setup_error(&m, &views))
            }
            _ => Err(SetupError::Supervisor {
                op: "prepare the template",
                source: io::Error::other("its zygote ended during its setup"),
            }),
        }
    }

    /// Whether the zygote is still there to start runs (its pidfd not yet readable: a zygote
    /// killed or ended makes every later start fail, so a caller holding templates drops it).
    pub fn alive(&self) -> bool {
        !sys::readable_within(self._zygote_pidfd.as_raw_fd(), 0)
    }

    /// The ids of every run of this template, and their host mapping.
    pub fn ids(&self) -> Ids {
        self.ids
    }

    /// Starts `policy`'s command in a fresh sandbox of this template and returns once it has
    /// been exec'd (or failed to). `policy` must be the template's own with only the command, the
    /// environment and the scratch directory changed (the facade makes it so); a host scratch
    /// directory must belong to the template's ids.
    pub fn spawn(
        &self,
        policy: &Policy,
        stdin: Stdin,
        before_start: Option<BeforeStart<'_>>,
        extras: &plan::Extras,
    ) -> Result<Running, SetupError> {
        let setup_cpu0 = sys::thread_cpu_time();
        template_takes(policy)?;
        // The secrets' placeholders are variables of the run; a CA to trust cannot be added here.
        if extras.trust.is_some() {
            return Err(SetupError::Supervisor {
                op: "use a template",
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a CA to trust for TLS inspection (see network.inspect)",
                ),
            });
        }
        let mut exec = plan::exec_plan(policy, extras)?;
        // The run's files' bytes, for its init to write (step 13).
        let files = plan::files_fd(&extras.files)?;
        // Warm Python: the init gets a placeholder program; the run's own code, arguments and
        // environment go to the payload on a pipe of its own.
        let warm_run = match &self.warm {
            Some(wp) if wp.takes(&policy.command) => {
                let data = warm::encode_run(&exec.argv, &exec.envp);
                let real = CString::new(wp.real.as_os_str().as_encoded_bytes())
                    .map_err(|_| supervisor("start a warm run", libc::EINVAL))?;
                let files = std::mem::take(&mut exec.files);
                exec = plan::Exec::new(vec![real.clone()], vec![real], Vec::new());
                exec.files = files;
                Some(code_pipe(&data)?)
            }
            _ => None,
        };
        // The run's part of the view: the template's, or, with a host scratch directory, from a
        // plan made now (the directory's protected paths are as they are now).
        let fresh = match &policy.scratch {
            Scratch::Ephemeral | Scratch::Workspace { .. } => None,
            Scratch::Host { .. } => {
                let (ids, seen) = spawn::inside_ids(policy)?;
                if (ids.uid, ids.gid) != (self.ids.uid, self.ids.gid) {
                    return Err(SetupError::Supervisor {
                        op: "start a run of the template",
                        source: io::Error::other(format!(
                            "its scratch directory belongs to uid {} gid {}, the template's runs are uid {} gid {}",
                            ids.uid, ids.gid, self.ids.uid, self.ids.gid
                        )),
                    });
                }
                let p = plan::build(policy, self.ids, &plan::RealHost)?;
                spawn::check_scratch(&p, seen)?;
                Some(p)
            }
        };
        let part = match &fresh {
            Some(p) => plan::run_part(p),
            None => self.part.clone(),
        };
        // The run's program record, for its init.
        let mut w = Writer::new(KIND_PROGRAM);
        wire::write_exec(&mut w, &exec);
        w.bool(warm_run.is_some());
        w.bool(files.is_some());
        let record = bounded(
            w.into_bytes(),
            "the run's program, arguments, environment and files' names",
        )?;
        // The run's init: one made ahead (a run with the template's own per-run part), or one
        // asked for now.
        let taken = match fresh {
            None if policy.tty == self.plan.tty && self.makes_ahead() => self.take_ahead(),
            _ => None,
        };
        // One made ahead that has ended or failed since (killed, say: an init waiting for its
        // program says nothing until it has it) is let go, and this run asks for its own.
        let taken = taken.and_then(|mut a| (!a.ended()).then_some(a));
        let mut ahead = match taken {
            Some(a) => a,
            None => self.ask(&part, policy.tty)?,
        };
        // Asking for it ahead was this run's work too, on the template's thread.
        let setup_cpu0 = setup_cpu0.saturating_sub(ahead.cpu);
        // The zygote's answer: the init's pid. An error of the init itself may come first (the
        // init reports it before the zygote has written the pid), and is the one to report.
        let views = self.views(&part, fresh.as_ref(), policy, extras);
        let (pid, early) = ahead.answer().map_err(|e| match e {
            Answer::Late => SetupError::Supervisor {
                op: "start a run of the template",
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    "its zygote did not answer within 30 s",
                ),
            },
            Answer::Gone(early) => {
                early.map_or(SetupError::InitVanished, |m| spawn::setup_error(&m, &views))
            }
        })?;
        // The init is our child (CLONE_PARENT) and unreaped: its pid cannot name another process.
        // Given back as soon as it exists: a failure below drops it, and the namespace with it.
        let lease = ahead.lease.take();
        let control = ahead.control.take().expect("an ahead run is taken once");
        drop(ahead);
        // Until the run owns it, a failure here ends the init (its socket closes) and reaps it.
        let reap = |e: SetupError| {
            let _ = sys::waitpid(pid, 0);
            e
        };
        let mut ch = spawn::channels_with(control, stdin).map_err(reap)?;
        // The program and streams, to the init (see `receive_program`). An init that has failed
        // already cannot take them: its own error is then read below, and is the one reported.
        let started = Instant::now();
        let extra: Vec<c_int> = [warm_run.as_ref(), files.as_ref()]
            .into_iter()
            .flatten()
            .map(|f| f.as_raw_fd())
            .collect();
        if send_program(ch.go_w_raw(), ch.stdio, &record, &extra).is_err() {
            // An init that did not get all of it would read what follows as its program: it is
            // ended now, and the run reports it vanished (or its own error, sent before).
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        // The init holds its own copies now.
        ch.close_init_side();
        drop(files);
        let warm_run_sent = warm_run.is_some();
        drop(warm_run);
        let pidfd = match sys::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                drop(ch);
                return Err(reap(supervisor("open a pidfd for the run", e)));
            }
        };
        let mut running = Running::new(
            pid,
            pidfd,
            ch,
            started,
            self.ids,
            None,
            policy,
            fresh.as_ref().unwrap_or(&self.plan),
            if warm_run_sent {
                "template-warm"
            } else {
                "template"
            },
        )?;
        if let Some(l) = lease {
            running.lend_net(l);
        }
        running.complete(before_start, early, &views, setup_cpu0)?;
        Ok(running)
    }

    /// Asks the zygote for a run's init with `part` as its part of the view (its host paths
    /// opened here as root); the init makes the view, then waits for its program.
    fn ask(&self, part: &RunPart, tty: bool) -> Result<Ahead, SetupError> {
        let mut part = part.clone();
        let mut control = spawn::Control::new(tty)?;
        let trees = spawn::open_trees(&mut part.sources)?;
        if let Some(ns) = &self.userns {
            spawn::idmap_trees(&part.sources, ns.as_raw_fd())?;
        }
        let mut w = Writer::new(KIND_RUN);
        wire::write_run_part(&mut w, &part);
        w.bool(control.pty_child.is_some());
        let bytes = bounded(w.into_bytes(), "the run's view")?;
        let raw = |f: &Option<OwnedFd>| f.as_ref().map(|f| f.as_raw_fd());
        let fds: Vec<c_int> = [
            raw(&control.msg_w),
            raw(&control.go_r),
            raw(&control.pty_child),
        ]
        .into_iter()
        .flatten()
        .chain(trees.iter().map(|t| t.as_raw_fd()))
        .collect();
        sys::send_msg(self.ctl.as_raw_fd(), &bytes, &fds).map_err(|e| SetupError::Supervisor {
            op: "start a run of the template",
            source: io::Error::new(
                io::Error::from_raw_os_error(e).kind(),
                format!("its zygote is gone ({})", io::Error::from_raw_os_error(e)),
            ),
        })?;
        // The zygote and the init hold their own copies now.
        control.close_init_side();
        Ok(Ahead {
            control: Some(control),
            ctl: self.ctl.clone(),
            lease: None,
            pid: None,
            failed: false,
            cpu: std::time::Duration::ZERO,
        })
    }

    /// Whether runs' inits are made ahead: only for a per-run part without host paths. A host
    /// path is opened and checked (device and inode) when the init is made, which may be long
    /// before its run: a directory replaced meanwhile would still be the one bound. Such runs,
    /// and runs with a host scratch directory, have their init made at their start.
    fn makes_ahead(&self) -> bool {
        self.part.sources.is_empty()
    }

    /// An init made ahead, if one is ready.
    fn take_ahead(&self) -> Option<Ahead> {
        self.ahead.lock().unwrap_or_else(|p| p.into_inner()).0.pop()
    }

    /// Asks for runs' inits ahead until `AHEAD` are ready or asked for: call it once a run
    /// has started (the zygote and the new init then work while the run's payload does, not
    /// before the run's caller hears that it started). Runs that call it at the same time ask
    /// for no more than that between them. A failure is not this run's: the next run asks for
    /// its own init and reports it.
    pub fn fill(&self) {
        if !self.makes_ahead() {
            return;
        }
        let lock = || self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            {
                let mut q = lock();
                if q.0.len() + q.1 >= AHEAD {
                    return;
                }
                q.1 += 1;
            }
            let cpu0 = sys::thread_cpu_time();
            let asked = self.ask(&self.part, self.plan.tty).map(|mut a| {
                a.cpu = sys::thread_cpu_time().saturating_sub(cpu0);
                a
            });
            let mut q = lock();
            q.1 -= 1;
            match asked {
                Ok(a) => q.0.push(a),
                Err(_) => return,
            }
        }
    }

    fn views<'a>(
        &'a self,
        part: &'a RunPart,
        fresh: Option<&'a Plan>,
        policy: &'a Policy,
        extras: &'a plan::Extras,
    ) -> Views<'a> {
        Views {
            sources: &part.sources,
            ops: &part.ops,
            plan: fresh.unwrap_or(&self.plan),
            program: &policy.command[0],
            files: &extras.files,
        }
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        // Inits made ahead end first (each sees its socket close), and are reaped.
        self.ahead
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clear();
        // The zygote sees the end of its socket and exits; then it is reaped.
        sys::shutdown(self.ctl.as_raw_fd());
        let _ = sys::waitpid(self.zygote, 0);
    }
}

/// How many runs' inits a template keeps made ahead (docs/engine.md, "Inits made ahead").
const AHEAD: usize = 1;

/// Why a run's init has no pid.
enum Answer {
    /// The zygote did not answer within [`ZYGOTE_ANSWER_MS`].
    Late,
    /// The zygote or the init ended first; the init's own error, if it sent one.
    Gone(Option<Msg>),
}

/// A run's init asked of the zygote: it makes the run's view, then waits for its program (see
/// `receive_program`). Dropped without a run, its socket closes, so the init ends, and it is
/// reaped here.
struct Ahead {
    control: Option<spawn::Control>,
    ctl: Arc<OwnedFd>,
    /// Its network namespace's lease, once the answer is read (0 is none).
    lease: Option<NetLease>,
    /// The init's pid and the first message of its own, once the answer is read.
    pid: Option<(i32, Option<Msg>)>,
    /// The answer did not come (or the zygote ended first): it is not waited for again.
    failed: bool,
    /// The supervisor's CPU time spent asking for it ahead (another thread's), for its run's
    /// report.
    cpu: std::time::Duration,
}

impl Ahead {
    /// Whether an init made ahead has ended or failed: once the zygote's answer is read, it
    /// writes nothing on its message pipe before its program comes, but an error or its end.
    /// (One whose answer is not read yet is taken as it is: the answer tells.)
    fn ended(&mut self) -> bool {
        let Some(c) = &self.control else {
            return true;
        };
        let msg = c.msg_r_raw();
        if self.pid.is_none() && !sys::readable_within(msg, 0) {
            return false;
        }
        match self.answer() {
            Ok((_, Some(_))) | Err(_) => true,
            Ok((_, None)) => sys::readable_within(msg, 0),
        }
    }

    /// The zygote's answer: the init's pid (its network namespace's lease kept), and an error
    /// the init sent before the zygote's answer, if any.
    fn answer(&mut self) -> Result<(i32, Option<Msg>), Answer> {
        if let Some(got) = self.pid {
            return Ok(got);
        }
        if self.failed {
            return Err(Answer::Gone(None));
        }
        let msg = self
            .control
            .as_ref()
            .expect("an ahead run is answered before it is taken")
            .msg_r_raw();
        let mut early: Option<Msg> = None;
        loop {
            let mut b = [0u8; 16];
            // The zygote answers at once; one that does not within the bound is broken, and the
            // run fails instead of waiting for it (no deadline of the run is running yet).
            if !sys::readable_within(msg, ZYGOTE_ANSWER_MS) {
                self.failed = true;
                return Err(Answer::Late);
            }
            match sys::read_full(msg, &mut b) {
                Ok(16) => {}
                _ => {
                    self.failed = true;
                    return Err(Answer::Gone(early));
                }
            }
            let m = Msg::from_bytes(&b);
            if m.kind == child::MSG_SPAWNED && m.value > 0 {
                self.pid = Some((m.value, early));
                self.lease = (m.index != 0).then(|| NetLease {
                    ctl: self.ctl.clone(),
                    lease: m.index,
                    unused: false,
                });
                return Ok((m.value, early));
            }
            early.get_or_insert(m);
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        if self.control.is_none() {
            return; // taken by its run
        }
        let pid = self.answer().ok().map(|(pid, _)| pid);
        drop(self.control.take());
        if let Some(pid) = pid {
            // Our child, unreaped: the pid is still its. Killed rather than left to see its
            // socket's end, which it reads only once its setup is done.
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = sys::waitpid(pid, 0);
        }
        // Its network namespace, given back used: the template lets it go.
        drop(self.lease.take());
    }
}

/// Sends a run's program to its init (see `receive_program`).
fn send_program(
    go: c_int,
    stdio: [c_int; 3],
    record: &[u8],
    extra: &[c_int],
) -> sys::SysResult<()> {
    sys::send_fds(go, b'p', &stdio)?;
    let len = (record.len() as u32).to_le_bytes();
    sys::send_all(go, &len)?;
    sys::send_all(go, record)?;
    if !extra.is_empty() {
        sys::send_fds(go, b'x', extra)?;
    }
    Ok(())
}

// ---- The zygote: palisade's own program, exec'd once per template. ----

/// What the zygote holds between runs.
struct Zygote {
    plan: Plan,
    /// The mount namespace it was made in: a copy of the host's, where a run's host paths are
    /// looked up (unprivileged: the zygote opens them itself).
    host_ns: c_int,
    /// The prepared view's mount namespace, where it lives.
    base_ns: c_int,
    /// The host's `/proc`, where each run's init writes its own id maps (`self/uid_map`).
    host_proc: c_int,
    /// For each Landlock rule, its path opened in the prepared view, or -1 (a per-run path).
    rule_fds: Vec<c_int>,
    /// The started interpreter, with warm Python.
    warm: Option<sys::Python>,
    /// Network namespaces made ahead and given back unused (a template without egress).
    net: Option<NetPool>,
    /// In a run's init cloned with a namespace of the pool: the DNS stub's socket, bound in it by
    /// the zygote (the init has no capability there); -1 otherwise.
    lent_dns: c_int,
}

/// A zygote's setup failure: the step, an index, the errno.
type Fail = child::Fail;

fn reply_failed(ctl: c_int, (step, index, errno): Fail) {
    let mut w = Writer::new(KIND_FAILED);
    w.u32(step as u32);
    w.u32(index);
    w.i32(errno);
    let _ = sys::send_msg(ctl, &w.into_bytes(), &[]);
}

/// The zygote's `main`: reads the template, prepares the view, says ready, serves runs until the
/// supervisor closes the socket.
pub(crate) fn main(ctl: c_int) -> ! {
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _);
    let mut buf = vec![0u8; MAX_RECORD + 1];
    let got = match sys::recv_msg(ctl, &mut buf) {
        Ok(g) if g.len > 0 && !g.truncated && g.len <= MAX_RECORD => g,
        _ => sys::exit(1),
    };
    // The trees become the plan's sources' (raw numbers, as every plan holds them).
    let nfds = got.fds.len();
    let mut fds = [-1 as c_int; sys::MAX_MSG_FDS];
    for (slot, fd) in fds.iter_mut().zip(got.fds) {
        *slot = fd.into_raw_fd();
    }
    let decoded = Reader::new(&buf[..got.len]).and_then(|(kind, mut r)| {
        if kind != KIND_TEMPLATE {
            return Err(WireError("kind"));
        }
        let mut plan = wire::read_plan(&mut r)?;
        let n = r.count(sys::MAX_MSG_FDS, 4, "template trees")?;
        if n != nfds {
            return Err(WireError("template trees (count)"));
        }
        for &fd in &fds[..n] {
            let i = r.index(plan.sources.len(), "template tree source")?;
            plan.sources[i].tree = fd;
        }
        let warm = if r.bool("warm python")? {
            let library = r.cstr("warm library")?;
            let python = r.cstr("warm python")?;
            let modules = r.cstrs("warm modules")?;
            Some((library, python, modules))
        } else {
            None
        };
        r.finish()?;
        Ok((plan, warm))
    });
    let (plan, warm_cfg) = match decoded {
        Ok(p) => p,
        Err(_) => {
            reply_failed(ctl, (Step::Engine, 0, libc::EPROTO));
            sys::exit(1)
        }
    };
    let prepared = prepare(plan, ctl).and_then(|mut z| {
        if let Some((library, python, modules)) = &warm_cfg {
            z.warm = Some(warm::start(library, python, modules, z.host_proc)?);
        }
        Ok(z)
    });
    match prepared {
        Ok(mut z) => {
            z.net = NetPool::new(&z.plan, z.host_proc);
            if sys::send_msg(ctl, &Writer::new(KIND_READY).into_bytes(), &[]).is_err() {
                sys::exit(1);
            }
            serve(&mut z, ctl, &mut buf)
        }
        Err(f) => {
            reply_failed(ctl, f);
            sys::exit(1)
        }
    }
}

fn open_dir(path: &std::ffi::CStr, flags: c_int) -> Result<c_int, i32> {
    sys::openat(libc::AT_FDCWD, path, flags, 0).map(IntoRawFd::into_raw_fd)
}

/// Builds the prepared view (the template's part of the plan), pivots into it and makes it
/// read-only. The steps are the in-process engine's (child.rs) where they are the same.
fn prepare(mut plan: Plan, ctl: c_int) -> Result<Zygote, Fail> {
    let at = child::at;
    // Become the mapped ids (the supervisor wrote the maps before it sent the plan).
    let ids = plan.ids;
    if ids.privileged {
        sys::setgroups_empty().map_err(|e| (Step::Ids, 0, e))?;
    }
    sys::setresgid(ids.gid).map_err(|e| (Step::Ids, 1, e))?;
    sys::setresuid(ids.uid).map_err(|e| (Step::Ids, 2, e))?;
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _).map_err(at(Step::DeathSignal))?;
    if sys::hung_up(ctl) {
        sys::exit(1);
    }
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(at(Step::Dumpable))?;
    // Modes in the plan exact.
    sys::umask(0);
    // The host's mount namespace as the zygote sees it (a copy, slave of the host's shared
    // mounts), kept for looking up a run's host paths; the host's /proc, for the runs' maps.
    let host_ns =
        open_dir(c"/proc/self/ns/mnt", libc::O_RDONLY).map_err(at(Step::MountsPrivate))?;
    let host_proc =
        open_dir(c"/proc", libc::O_PATH | libc::O_DIRECTORY).map_err(at(Step::MountsPrivate))?;
    // The prepared view's own mount namespace: private, so nothing crosses to or from the host.
    sys::unshare(libc::CLONE_NEWNS).map_err(at(Step::MountsPrivate))?;
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(at(Step::MountsPrivate))?;
    let base_ns =
        open_dir(c"/proc/self/ns/mnt", libc::O_RDONLY).map_err(at(Step::MountsPrivate))?;
    // Open the prepared part's sources (step 5), before anything is mounted over them.
    let used: Vec<bool> = (0..plan.sources.len())
        .map(|i| {
            plan.ops.iter().any(
                |o| matches!(o, Op::Bind { source, .. } if *source == i && !plan::is_per_run(o)),
            )
        })
        .collect();
    for (i, s) in plan.sources.iter_mut().enumerate() {
        if s.tree < 0 && used[i] {
            child::open_source(s, i)?;
        }
    }
    // The new root (step 6), its prepared part (step 7).
    child::new_root()?;
    for (i, op) in plan.ops.iter().enumerate() {
        if !plan::is_per_run(op) {
            child::run_op(&plan, op).map_err(|e| (Step::Op, i as u32, e))?;
        }
    }
    // A procfs that is fully visible in the prepared view: the kernel lets a run mount its own
    // /proc only where one already is. It is the procfs of a pid namespace that has died (a
    // helper's, which exits at once), so it shows no process; every run covers it with its own.
    helper_proc().map_err(at(Step::TemplateProc))?;
    // Step 8: pivot into the view, detach the host's tree.
    sys::pivot_root(c".", c".").map_err(at(Step::PivotRoot))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(at(Step::DetachOldRoot))?;
    let _ = sys::chdir(c"/");
    // Step 9, for every run at once: the prepared part's own file systems read-only (the root,
    // /dev); in a run's namespace the flag is locked.
    sys::mount_setattr(libc::AT_FDCWD, c"/", 0, sys::MOUNT_ATTR_RDONLY, 0, -1)
        .map_err(at(Step::RootReadOnly))?;
    for op in plan.ops.iter().filter(|o| !plan::is_per_run(o)) {
        if let Op::Tmpfs { path, .. } = op {
            sys::mount_setattr(libc::AT_FDCWD, path, 0, sys::MOUNT_ATTR_RDONLY, 0, -1)
                .map_err(at(Step::RootReadOnly))?;
        }
    }
    // The Landlock rules' paths in the prepared part, opened once (step 10 for every run).
    let mut rule_fds = Vec::new();
    if let Some(ll) = plan.landlock.ruleset() {
        for (i, r) in ll.rules.iter().enumerate() {
            if plan::is_per_run_path(r.path.to_bytes()) {
                rule_fds.push(-1);
                continue;
            }
            match sys::openat(libc::AT_FDCWD, &r.path, libc::O_PATH, 0) {
                Ok(fd) => rule_fds.push(fd.into_raw_fd()),
                Err(libc::ENOENT) if r.optional => rule_fds.push(-1),
                Err(e) => return Err((Step::LandlockRule, i as u32, e)),
            }
        }
    }
    Ok(Zygote {
        plan,
        host_ns,
        base_ns,
        host_proc,
        rule_fds,
        warm: None,
        net: None,
        lent_dns: -1,
    })
}

/// Mounts `proc` (relative to the working directory) from a child in a new pid namespace that
/// exits at once.
fn helper_proc() -> Result<(), i32> {
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the clone of the zygote's proc helper itself.
    // SAFETY: the zygote is single-threaded; the child only mounts and exits.
    let forked = unsafe { sys::clone3(sys::CLONE_NEWPID) }?;
    match forked {
        sys::Forked::Child => {
            let r = sys::mount(
                Some(c"proc"),
                c"proc",
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            );
            sys::exit(if r.is_ok() { 0 } else { 1 })
        }
        sys::Forked::Parent { pid, pidfd } => {
            sys::close_owned(pidfd);
            let st = sys::waitpid(pid, 0).map_or(0, |(_, st)| st);
            if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
                Ok(())
            } else {
                Err(libc::EPERM)
            }
        }
    }
}

/// One run's request, decoded: the run's part of the view and its init's channels. The run's
/// program and streams are not in it: they go to the init itself, once it has made the view
/// ([`receive_program`]), so the zygote never holds any run's program or environment.
struct Request {
    part: RunPart,
    fds: ChildFds,
    /// Every descriptor that came with the request.
    all: Vec<c_int>,
}

fn decode_request(bytes: &[u8], fds: &[c_int]) -> Result<Request, WireError> {
    let (kind, mut r) = Reader::new(bytes)?;
    if kind != KIND_RUN {
        return Err(WireError("kind"));
    }
    let mut part = wire::read_run_part(&mut r)?;
    let pty = r.bool("pty")?;
    r.finish()?;
    let trees = part.sources.iter().filter(|s| s.tree >= 0).count();
    let base = 2 + pty as usize;
    if fds.len() != base + trees {
        return Err(WireError("descriptors (count)"));
    }
    let mut t = fds[base..].iter();
    for s in part.sources.iter_mut().filter(|s| s.tree >= 0) {
        s.tree = *t.next().expect("counted above");
    }
    let mut keep: Vec<c_int> = fds.to_vec();
    keep.sort_unstable();
    Ok(Request {
        part,
        fds: ChildFds {
            // The init's streams come with its program.
            stdio: [-1; 3],
            msg: fds[0],
            go: fds[1],
            pty_sock: if pty { fds[2] } else { -1 },
            files: -1,
            keep,
        },
        all: fds.to_vec(),
    })
}

/// Decodes a run's program record: the program, and whether a warm run's code pipe and the
/// run's files come with it.
fn decode_program(bytes: &[u8]) -> Result<(plan::Exec, bool, bool), WireError> {
    let (kind, mut r) = Reader::new(bytes)?;
    if kind != KIND_PROGRAM {
        return Err(WireError("kind"));
    }
    let exec = wire::read_exec(&mut r)?;
    let warm = r.bool("warm")?;
    let files = r.bool("files")?;
    r.finish()?;
    if files == exec.files.is_empty() {
        return Err(WireError(
            "files (descriptor without files, or files without one)",
        ));
    }
    Ok((exec, warm, files))
}

/// A network namespace given back: its lease number and whether the run left it unused.
fn decode_return(bytes: &[u8]) -> Option<(u32, bool)> {
    let (kind, mut r) = Reader::new(bytes).ok()?;
    if kind != KIND_RETURN {
        return None;
    }
    let lease = r.u32("lease").ok()?;
    let unused = r.bool("unused").ok()?;
    r.finish().ok()?;
    Some((lease, unused))
}

/// Serves runs until the supervisor closes the socket.
fn serve(z: &mut Zygote, ctl: c_int, buf: &mut [u8]) -> ! {
    loop {
        if let Some(p) = z.net.as_mut() {
            p.fill(|| !sys::readable_within(ctl, 0));
        }
        let got = match sys::recv_msg(ctl, buf) {
            Ok(g) if g.len == 0 => sys::exit(0),
            Ok(g) => g,
            Err(libc::EINTR) => continue,
            Err(_) => sys::exit(1),
        };
        // Raw numbers from here: a request hands each to the plan or closes it.
        let mut fds = [-1 as c_int; sys::MAX_MSG_FDS];
        let nfds = got.fds.len();
        for (slot, fd) in fds.iter_mut().zip(got.fds) {
            *slot = fd.into_raw_fd();
        }
        let received = &fds[..nfds];
        if !got.truncated && got.len <= MAX_RECORD {
            if let Some((lease, unused)) = decode_return(&buf[..got.len]) {
                received.iter().for_each(|&fd| sys::close(fd));
                if let Some(p) = z.net.as_mut() {
                    p.given_back(lease, unused);
                }
                continue;
            }
        }
        let req = if got.truncated || got.len > MAX_RECORD {
            Err(WireError("longer than a record"))
        } else {
            decode_request(&buf[..got.len], received)
        };
        match req {
            Ok(req) => {
                run(z, req);
                // The request's paths: no later run's init (a copy of this process) holds them.
                wipe_bytes(&mut buf[..got.len]);
            }
            // Malformed: nothing to answer on; closing the run's descriptors ends it (its
            // supervisor reads the end of its message pipe).
            Err(_) => received.iter().for_each(|&fd| sys::close(fd)),
        }
    }
}

/// Overwrites bytes so that the write is not optimized away.
fn wipe_bytes(b: &mut [u8]) {
    sys::volatile_zero(b);
}

/// One run: its host paths opened (unprivileged), its init cloned; the zygote keeps nothing of
/// it.
fn run(z: &mut Zygote, mut req: Request) {
    let msg = req.fds.msg;
    let done = |req: &Request| req.all.iter().for_each(|&fd| sys::close(fd));
    let fail = |req: &Request, (step, index, value): Fail| {
        child::send(
            msg,
            Msg {
                kind: child::MSG_SETUP_ERROR,
                step: step as u32,
                index,
                value,
            },
        );
        done(req);
    };
    // Unprivileged: the run's host paths (a host scratch directory, binds under per-run places)
    // opened here, in the host's mount namespace, as detached trees checked by device and inode.
    if let Err(f) = open_run_sources(z, &mut req.part.sources) {
        // Trees made before the failure are the zygote's own.
        for s in req.part.sources.iter().filter(|s| s.tree >= 0) {
            if !req.all.contains(&s.tree) {
                sys::close(s.tree);
            }
        }
        fail(&req, f);
        return;
    }
    let made: Vec<c_int> = req
        .part
        .sources
        .iter()
        .filter(|s| s.tree >= 0 && !req.all.contains(&s.tree))
        .map(|s| s.tree)
        .collect();
    // A network namespace of the pool, entered now so that the init is made in it, with the DNS
    // stub's socket bound in it (the init has no capability there to bind port 53).
    let dns = z.plan.sockets.first().copied();
    let lent = z.net.as_mut().zip(dns).and_then(|(p, dns)| p.lend(&dns));
    z.lent_dns = lent.map_or(-1, |(_, sock)| sock);
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the clone of a run's init itself.
    // SAFETY: the zygote is single-threaded: the child may run ordinary code. It never returns.
    let forked =
        unsafe { sys::clone3(libc::CLONE_PARENT as u64 | sys::CLONE_NEWUSER | sys::CLONE_NEWPID) };
    match forked {
        Ok(sys::Forked::Child) => run_init(z, &req.part, &req.fds, &made),
        Ok(sys::Forked::Parent { pid, pidfd }) => {
            sys::close_owned(pidfd);
            child::send(
                msg,
                Msg {
                    kind: child::MSG_SPAWNED,
                    step: 0,
                    // The lease of its network namespace, 0 for one of its own.
                    index: lent.map_or(0, |(lease, _)| lease),
                    value: pid,
                },
            );
            made.iter().for_each(|&fd| sys::close(fd));
            done(&req);
        }
        Err(e) => {
            made.iter().for_each(|&fd| sys::close(fd));
            fail(&req, (Step::Fork, 0, e));
            if let (Some(p), Some((lease, _))) = (z.net.as_mut(), lent) {
                p.given_back(lease, false);
            }
        }
    }
    // Only the init holds the DNS stub's socket now.
    if let Some((_, sock)) = lent {
        sys::close(sock);
    }
    z.lent_dns = -1;
}

/// Opens each run source that came without a tree: in the host's mount namespace, with no
/// symlink resolution, checked by device and inode, cloned as a detached tree.
fn open_run_sources(z: &Zygote, sources: &mut [Source]) -> Result<(), Fail> {
    if sources.iter().all(|s| s.tree >= 0) {
        return Ok(());
    }
    sys::setns(z.host_ns, libc::CLONE_NEWNS).map_err(|e| (Step::OpenSource, 0, e))?;
    let mut result = Ok(());
    for (i, s) in sources.iter_mut().enumerate().filter(|(_, s)| s.tree < 0) {
        let i = i as u32;
        let fd = match sys::open_path_noresolve(
            &s.path,
            sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS,
        ) {
            Ok(fd) => fd.into_raw_fd(),
            Err(e) => {
                result = Err((Step::OpenSource, i, e));
                break;
            }
        };
        let checked = match sys::dev_ino(fd) {
            Ok((d, n)) if d == s.dev && n == s.ino => Ok(()),
            Ok(_) => Err((Step::SourceChanged, i, libc::ESTALE)),
            Err(e) => Err((Step::OpenSource, i, e)),
        };
        let tree = checked.and_then(|()| {
            let flags = sys::OPEN_TREE_CLONE
                | sys::OPEN_TREE_CLOEXEC
                | libc::AT_EMPTY_PATH as u32
                | libc::AT_RECURSIVE as u32;
            sys::open_tree(fd, c"", flags)
                .map(IntoRawFd::into_raw_fd)
                .map_err(|e| (Step::OpenSource, i, e))
        });
        sys::close(fd);
        match tree {
            Ok(t) => s.tree = t,
            Err(f) => {
                result = Err(f);
                break;
            }
        }
    }
    // Back into the prepared view, whatever happened (its root becomes the working directory).
    if let Err(e) = sys::setns(z.base_ns, libc::CLONE_NEWNS) {
        // Without its view the zygote can serve nothing more.
        let _ = e;
        sys::exit(1);
    }
    result
}

/// The per-run init (a clone of the zygote, pid 1 of a new pid namespace, in a new user
/// namespace): the run's own namespaces and mounts, then the in-process engine's last steps.
fn run_init(z: &mut Zygote, part: &RunPart, fds: &ChildFds, made: &[c_int]) -> ! {
    let mut ready = Prepared {
        slave: -1,
        ruleset: -1,
    };
    let fail = |(step, index, errno): Fail| -> ! {
        child::send(
            fds.msg,
            Msg {
                kind: child::MSG_SETUP_ERROR,
                step: step as u32,
                index,
                value: errno,
            },
        );
        sys::exit(1)
    };
    if let Err(f) = run_setup(z, part, fds, made, &mut ready) {
        fail(f);
    }
    // The view is made: the run's program and streams, from the supervisor. An init made ahead
    // waits here until its run starts (or its supervisor's end closes: it then ends).
    let (fds, code) = match receive_program(z, fds) {
        Ok(got) => got,
        Err(f) => fail(f),
    };
    // 13. The run's files, inside the boundary, before the payload exists.
    if fds.files >= 0 {
        let r = child::write_files(&z.plan, fds.files);
        sys::close(fds.files);
        if let Err(f) = r {
            fail(f);
        }
    }
    let fds = &fds;
    let stack_top = z.plan.payload_stack.as_mut_ptr_range().end;
    let warm = match (z.warm, code >= 0) {
        (Some(py), true) => Some(child::WarmPayload { py, code }),
        _ => None,
    };
    child::supervise(&z.plan, fds, ready, stack_top, warm)
}

fn run_setup(
    z: &mut Zygote,
    part: &RunPart,
    fds: &ChildFds,
    made: &[c_int],
    ready: &mut Prepared,
) -> Result<(), Fail> {
    let at = child::at;
    // 1. Die with the template's thread (whose child this init is, by CLONE_PARENT).
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _).map_err(at(Step::DeathSignal))?;
    // 2. Every descriptor but the run's own, the trees and what the next steps need closed: the
    //    template's socket above all. (The run's standard streams come with its program, once
    //    the view is made; until then 0, 1 and 2 are the zygote's, /dev/null.)
    let mut keep: Vec<c_int> = fds.keep.clone();
    keep.extend_from_slice(made);
    keep.push(z.host_proc);
    keep.extend(z.rule_fds.iter().copied().filter(|&fd| fd >= 0));
    if z.lent_dns >= 0 {
        keep.push(z.lent_dns);
    }
    keep.sort_unstable();
    keep.dedup();
    sys::close_all_but(&keep).map_err(at(Step::CloseFds))?;
    // 3. The run's user namespace maps its ids to themselves (the kernel allows a process to
    //    map its own uid and gid, the gid once setgroups is denied); then become them.
    let ids = z.plan.ids;
    let write = |file: &std::ffi::CStr, data: &str, index: u32| -> Result<(), Fail> {
        let fd =
            sys::openat(z.host_proc, file, libc::O_WRONLY, 0).map_err(|e| (Step::Ids, index, e))?;
        let r = sys::write_all(fd.as_raw_fd(), data.as_bytes());
        sys::close_owned(fd);
        r.map_err(|e| (Step::Ids, index, e))
    };
    // Dumpable for as long as it writes them: the files of a process that is not are root's, and
    // an unprivileged init could not open its own (the zygote it was cloned from is not).
    sys::prctl(libc::PR_SET_DUMPABLE, 1).map_err(at(Step::Dumpable))?;
    write(c"self/setgroups", "deny", 3)?;
    write(c"self/uid_map", &format!("{0} {0} 1\n", ids.uid), 4)?;
    write(c"self/gid_map", &format!("{0} {0} 1\n", ids.gid), 5)?;
    sys::close(z.host_proc);
    sys::setresgid(ids.gid).map_err(|e| (Step::Ids, 1, e))?;
    sys::setresuid(ids.uid).map_err(|e| (Step::Ids, 2, e))?;
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _).map_err(at(Step::DeathSignal))?;
    if sys::hung_up(fds.go) {
        sys::exit(1);
    }
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(at(Step::Dumpable))?;
    // Modes in the plan exact.
    sys::umask(0);
    // The run's own mount, network, IPC and UTS namespaces, owned by its user namespace; or,
    // with a network namespace of the template's pool (owned by T, where the init has no
    // capability), the others only.
    let net = if z.lent_dns >= 0 {
        0
    } else {
        libc::CLONE_NEWNET
    };
    sys::unshare(libc::CLONE_NEWNS | net | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)
        .map_err(at(Step::MountsPrivate))?;
    // 7. The run's part of the view, on the prepared view's mount points.
    for (i, op) in part.ops.iter().enumerate() {
        child::run_op_with(&part.sources, op).map_err(|e| (Step::Op, i as u32, e))?;
    }
    // 10. Landlock: the prepared part's rules through the zygote's descriptors, the run's own
    //     by path, now that its mounts are there.
    if let Some(ll) = z.plan.landlock.ruleset() {
        ready.ruleset = child::landlock_ruleset_with(ll, &z.rule_fds)?;
    }
    z.rule_fds.iter().for_each(|&fd| sys::close(fd));
    // 11, 12: host name, loopback, egress listeners, pty.
    let lent = (z.lent_dns >= 0).then_some(z.lent_dns);
    child::finish_view(&z.plan, fds, ready, lent)
}

/// The run's program and streams, sent by the supervisor on the init's socket once the run
/// starts: `p` with the three standard streams (put in place as 0, 1 and 2 here), the program's
/// record (a length, then at most [`MAX_RECORD`] bytes), then, for a warm run or one with files,
/// `x` with the code pipe and the files' descriptor. The plan's program becomes the run's; the
/// descriptors the init keeps, with the files' and the code pipe's numbers, are returned.
fn receive_program(z: &mut Zygote, fds: &ChildFds) -> Result<(ChildFds, c_int), Fail> {
    let proto = (Step::Engine, 0, libc::EPROTO);
    let stdio = match sys::recv_fds(fds.go) {
        Ok((b'p', got)) if got.len() == 3 => got,
        // The supervisor's end closed (unread messages of ours in it: reset): a run made ahead
        // that will not start.
        Err(libc::EPIPE | libc::ECONNRESET) => sys::exit(0),
        _ => return Err(proto),
    };
    for (target, fd) in stdio.into_iter().enumerate() {
        let r = sys::dup2(fd.as_raw_fd(), target as c_int);
        sys::close_owned(fd);
        r.map_err(|e| (Step::Stdio, target as u32, e))?;
    }
    let mut len = [0u8; 4];
    if sys::read_full(fds.go, &mut len) != Ok(4) {
        return Err(proto);
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_RECORD {
        return Err(proto);
    }
    let mut record = vec![0u8; len];
    if sys::read_full(fds.go, &mut record) != Ok(len) {
        return Err(proto);
    }
    let (exec, warm, files) = decode_program(&record).map_err(|_| proto)?;
    if warm && z.warm.is_none() {
        return Err(proto);
    }
    let (mut code, mut files_fd) = (-1, -1);
    if warm || files {
        match sys::recv_fds(fds.go) {
            Ok((b'x', got)) if got.len() == warm as usize + files as usize => {
                let mut got = got.into_iter().map(IntoRawFd::into_raw_fd);
                if warm {
                    code = got.next().expect("counted");
                }
                if files {
                    files_fd = got.next().expect("counted");
                }
            }
            _ => return Err(proto),
        }
    }
    z.plan.exec = exec;
    let mut keep = fds.keep.clone();
    keep.extend([code, files_fd].into_iter().filter(|&fd| fd >= 0));
    keep.sort_unstable();
    Ok((
        ChildFds {
            stdio: [0, 1, 2],
            msg: fds.msg,
            go: fds.go,
            pty_sock: fds.pty_sock,
            files: files_fd,
            keep,
        },
        code,
    ))
}

// ---- Network namespaces given back unused (docs/engine.md, "The network namespace"). ----

/// Most namespaces the zygote keeps ready; more given back are let go.
const NET_FREE_MAX: usize = 8;
/// How many it makes ahead while no request waits.
const NET_FREE_TARGET: usize = 2;
/// Most namespaces out with runs that the zygote remembers; past it the oldest is forgotten (its
/// run keeps it; given back later, it is let go).
const NET_LENT_MAX: usize = 256;

/// The network namespaces of a template without egress. Each is made by the zygote (owned by the
/// template's user namespace T, so a run, in a user namespace of its own under T, has no
/// capability in it: it cannot add an address, a route, a rule or change a setting), with `lo` up
/// and nothing else. A run gets one of them instead of making its own; the supervisor gives it
/// back when the run is over, saying whether the run made any socket (the seccomp filter shows
/// it every `socket` and `socketpair`). One that a run made no socket in is as it was made, and
/// the zygote checks that no socket of any kind remains in it (its counts in `sockstat`) before it
/// hands it to another run; any other is let go and the kernel tears it down.
struct NetPool {
    /// Ready: descriptors of `/proc/thread-self/ns/net`.
    free: Vec<c_int>,
    /// Out with a run: (lease number, descriptor), oldest first.
    lent: std::collections::VecDeque<(u32, c_int)>,
    next: u32,
    /// The host's `/proc`.
    proc_: c_int,
}

impl NetPool {
    /// The pool of a template whose runs have no egress (their one listener is the DNS stub),
    /// with its first namespace made; `None` for any other, or where one cannot be made (each
    /// run then makes its own, as without a pool).
    fn new(plan: &Plan, proc_: c_int) -> Option<NetPool> {
        if !matches!(plan.sockets.as_slice(), [s] if s.role == plan::SockRole::Dns) {
            return None;
        }
        let mut p = NetPool {
            free: Vec::new(),
            lent: std::collections::VecDeque::new(),
            next: 0,
            proc_,
        };
        let first = p.make().ok()?;
        p.free.push(first);
        Some(p)
    }

    /// A new network namespace with `lo` up; the zygote is left in it.
    fn make(&self) -> Result<c_int, Fail> {
        sys::unshare(libc::CLONE_NEWNET).map_err(|e| (Step::MountsPrivate, 1, e))?;
        sys::loopback_up().map_err(|e| (Step::Loopback, 0, e))?;
        sys::openat(self.proc_, c"thread-self/ns/net", libc::O_RDONLY, 0)
            .map(IntoRawFd::into_raw_fd)
            .map_err(|e| (Step::MountsPrivate, 2, e))
    }

    /// Makes namespaces ahead while none is waiting to be asked for (`idle`).
    fn fill(&mut self, idle: impl Fn() -> bool) {
        while self.free.len() < NET_FREE_TARGET && idle() {
            match self.make() {
                Ok(fd) => self.free.push(fd),
                Err(_) => return,
            }
        }
    }

    /// Enters a namespace for the next run and binds the DNS stub's socket in it: the lease
    /// number (never 0) and the socket. `None` when none can be had: the run makes its own.
    fn lend(&mut self, dns: &plan::SockSpec) -> Option<(u32, c_int)> {
        let fd = match self.free.pop() {
            Some(fd) => fd,
            None => self.make().ok()?,
        };
        let sock = sys::setns(fd, libc::CLONE_NEWNET)
            .and_then(|()| sys::bound_inet_socket(true, dns.addr, dns.port));
        let Ok(sock) = sock else {
            sys::close(fd);
            return None;
        };
        self.next = self.next.wrapping_add(1).max(1);
        if self.lent.len() == NET_LENT_MAX {
            if let Some((_, old)) = self.lent.pop_front() {
                sys::close(old);
            }
        }
        self.lent.push_back((self.next, fd));
        Some((self.next, sock))
    }

    /// A namespace given back: kept for another run only if the run made no socket and none
    /// remains in it; otherwise let go.
    fn given_back(&mut self, lease: u32, unused: bool) {
        let Some(at) = self.lent.iter().position(|&(n, _)| n == lease) else {
            return;
        };
        let (_, fd) = self.lent.remove(at).expect("found above");
        if unused && self.free.len() < NET_FREE_MAX && self.empty(fd) {
            self.free.push(fd);
        } else {
            sys::close(fd);
        }
    }

    /// Whether no socket is left in the namespace `fd`: every count of its `sockstat` and
    /// `sockstat6` zero (sockets in use of every family, TCP orphans and time-wait, fragments).
    fn empty(&self, fd: c_int) -> bool {
        if sys::setns(fd, libc::CLONE_NEWNET).is_err() {
            return false;
        }
        [c"thread-self/net/sockstat", c"thread-self/net/sockstat6"]
            .iter()
            .all(|f| {
                let mut buf = [0u8; 1024];
                let Ok(file) = sys::openat(self.proc_, f, libc::O_RDONLY, 0) else {
                    return false;
                };
                let n = sys::read_full(file.as_raw_fd(), &mut buf);
                sys::close_owned(file);
                match n {
                    Ok(n) if n < buf.len() => sockstat_empty(&buf[..n]),
                    _ => false,
                }
            })
    }
}

/// Whether a `sockstat` or `sockstat6` text counts no socket: each line's `used`, `inuse`,
/// `orphan`, `tw` and `memory` (fragments) zero. `alloc` and `mem` are the protocol's across
/// every namespace, and not looked at. A line that does not parse counts as a socket.
fn sockstat_empty(text: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(text) else {
        return false;
    };
    let mut lines = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        lines += 1;
        let mut words = line.split_whitespace();
        if words.next().is_none_or(|label| !label.ends_with(':')) {
            return false;
        }
        let words: Vec<&str> = words.collect();
        if !words.len().is_multiple_of(2) {
            return false;
        }
        for kv in words.chunks(2) {
            let Ok(v) = kv[1].parse::<u64>() else {
                return false;
            };
            if matches!(kv[0], "used" | "inuse" | "orphan" | "tw" | "memory") && v != 0 {
                return false;
            }
        }
    }
    lines > 0
}

/// A run's network namespace, lent by its template's pool: dropping it gives it back to the
/// zygote, which keeps it for another run only if [`NetLease::unused`] was said and it finds no
/// socket left in it. Give it back only once nothing of the run can use it any more: the run's
/// processes gone and the supervisor's own socket in it (the DNS stub's) closed.
pub struct NetLease {
    ctl: Arc<OwnedFd>,
    lease: u32,
    unused: bool,
}

impl NetLease {
    /// The run made no socket (the filter showed the supervisor every one): its namespace is as
    /// it was made.
    pub fn unused(mut self) {
        self.unused = true;
    }
}

impl Drop for NetLease {
    fn drop(&mut self) {
        let mut w = Writer::new(KIND_RETURN);
        w.u32(self.lease);
        w.bool(self.unused);
        // A template already gone has taken its namespaces with it.
        let _ = sys::send_msg(self.ctl.as_raw_fd(), &w.into_bytes(), &[]);
    }
}

#[cfg(test)]
mod net_tests {
    use super::sockstat_empty;

    #[test]
    fn sockstat_counts_any_socket_and_ignores_the_protocols_global_figures() {
        let fresh = b"sockets: used 0\nTCP: inuse 0 orphan 0 tw 0 alloc 1 mem 148\nUDP: inuse 0 mem 12\nUDPLITE: inuse 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n";
        assert!(sockstat_empty(fresh));
        assert!(sockstat_empty(
            b"TCP6: inuse 0\nUDP6: inuse 0\nUDPLITE6: inuse 0\nRAW6: inuse 0\nFRAG6: inuse 0 memory 0\n"
        ));
        for (from, to) in [
            ("used 0", "used 1"),
            ("TCP: inuse 0", "TCP: inuse 2"),
            ("orphan 0", "orphan 1"),
            ("tw 0", "tw 3"),
            ("UDP: inuse 0", "UDP: inuse 1"),
            ("RAW: inuse 0", "RAW: inuse 1"),
            ("memory 0", "memory 4096"),
        ] {
            let t = String::from_utf8_lossy(fresh).replace(from, to);
            assert!(!sockstat_empty(t.as_bytes()), "{to}");
        }
        // Not a count of sockets in this namespace: the protocol's allocations and memory.
        let t = String::from_utf8_lossy(fresh).replace("alloc 1 mem 148", "alloc 90 mem 9000");
        assert!(sockstat_empty(t.as_bytes()));
        for bad in [
            &b""[..],
            b"sockets used 0\n",
            b"sockets: used\n",
            b"sockets: used x\n",
            b"\xff",
        ] {
            assert!(!sockstat_empty(bad), "{bad:?}");
        }
    }
}
