//! Engines: how a sandbox's init comes to exist.
//!
//! - **in-process** ([`Engine::InProcess`]): `clone3` without a new stack, fork-like, from the
//!   calling thread (see `spawn`). Cheapest for a small caller such as the command line. The
//!   kernel copies the caller's page tables, so the cost grows with the caller's memory, and the
//!   init holds a copy-on-write image of it until it exits (kept from the payload by
//!   `PR_SET_DUMPABLE` and dropped capabilities only).
//! - **exec** ([`Engine::Exec`]): `clone` with `CLONE_VM | CLONE_VFORK` and the sandbox's
//!   namespaces on a small stack of its own, then at once `execveat` of palisade's own init
//!   program ([`InitProgram`]): no page table is copied, and nothing of the caller survives the
//!   exec. The plan follows over the init's socket in the wire format (`wire`); the init reads
//!   it and goes on with the same steps as the in-process engine (`child::init`).
//! - **template** (`zygote`): one exec'd process per template holds the prepared parts and
//!   clones a fresh per-run init for each run.
//!
//! The init program is the `palisade` binary itself, which must call [`run_if_init`] as the very
//! first thing in `main`: when started as an init (its `argv[0]` and the `PALISADE_ENGINE`
//! marker say so), the call never returns.
//!
//! Between `clone` and `execve` the child shares the caller's memory while the calling thread is
//! suspended (`CLONE_VFORK`), and runs only raw system calls on its own stack: no allocation, no
//! lock, nothing another thread of the caller could hold. Its steps, each for a reason:
//! - the parent-death signal (it survives a plain exec; a set-id exec clears it, and the init
//!   sets it again first thing);
//! - every capability it holds in the new user namespace made ambient: once exec'd with a uid
//!   the namespace does not map yet, the kernel would otherwise recompute its capabilities as
//!   none;
//! - the payload's standard streams on 0, 1, 2, the descriptors the init needs made inheritable
//!   (the child has a descriptor table of its own, so this changes nothing of the caller's), and
//!   every other descriptor closed, so the init program never holds one of the caller's.

use crate::child::{self, ChildFds, Msg, Step};
use crate::sys;
use crate::wire::{self, Reader, Writer};
use libc::c_int;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The environment variable that marks a process as one of palisade's engine processes, with
/// its role as value.
const MARKER: &str = "PALISADE_ENGINE";
/// The environment variable naming the init program explicitly.
pub const INIT_PROGRAM_ENV: &str = "PALISADE_INIT";

/// `argv[0]` of an exec'd per-run init.
pub(crate) const INIT_ARGV0: &CStr = c"palisade-init";
/// `argv[0]` of a template's zygote.
pub(crate) const ZYGOTE_ARGV0: &CStr = c"palisade-zygote";

/// Message kind: a cold init's descriptors and plan.
const KIND_INIT: u8 = 1;

/// How a sandbox's init is started.
#[derive(Clone, Debug)]
pub enum Engine {
    /// Fork-like `clone3` from the calling thread.
    InProcess,
    /// `clone(CLONE_VM | CLONE_VFORK)` then `execve` of palisade's init program.
    Exec(InitProgram),
}

impl Engine {
    /// The name the report gives the engine: `in-process` or `exec`.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::InProcess => "in-process",
            Engine::Exec(_) => "exec",
        }
    }
}

/// Palisade's own init program, opened once: it is executed through this descriptor, so the
/// file that runs is the one opened here, whatever happens to its path later.
#[derive(Clone)]
pub struct InitProgram {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

impl std::fmt::Debug for InitProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitProgram")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl InitProgram {
    /// Opens `path` (`O_PATH`): it must be a regular file this process may execute.
    pub fn open(path: &Path) -> io::Result<InitProgram> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fd = sys::openat(libc::AT_FDCWD, &c, libc::O_PATH, 0)
            .map_err(io::Error::from_raw_os_error)?;
        let st = sys::stat_nofollow(fd.as_raw_fd(), c"").map_err(io::Error::from_raw_os_error)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            ));
        }
        sys::access_effective(&c, libc::X_OK).map_err(io::Error::from_raw_os_error)?;
        Ok(InitProgram {
            fd: Arc::new(fd),
            path: path.to_owned(),
        })
    }

    /// The init program named by `PALISADE_INIT`, if set.
    pub fn from_env() -> Option<io::Result<InitProgram>> {
        std::env::var_os(INIT_PROGRAM_ENV).map(|p| InitProgram::open(Path::new(&p)))
    }

    /// This process's own executable, if it called [`run_if_init`] (it is then a palisade
    /// binary that knows the init role).
    pub fn registered() -> Option<InitProgram> {
        REGISTERED.get().and_then(|r| r.clone())
    }

    /// Where it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw(&self) -> c_int {
        self.fd.as_raw_fd()
    }
}

/// This executable, opened when it called [`run_if_init`].
static REGISTERED: OnceLock<Option<InitProgram>> = OnceLock::new();

/// Call as the very first thing in `main` of a program that may serve as palisade's init
/// program (the `palisade` binary does). Started as an engine process, it runs that role and
/// never returns; otherwise it records this executable as the init program for [`Engine::Exec`]
/// and templates, and returns at once.
pub fn run_if_init() {
    let role = std::env::var_os(MARKER);
    if let Some(role) = role {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let num = |i: usize| -> Option<c_int> {
            args.get(i)?
                .to_str()?
                .parse()
                .ok()
                .filter(|&fd: &c_int| fd > 2)
        };
        let argv0 = args.first().map(|a| a.as_bytes());
        if role == "init" && argv0 == Some(INIT_ARGV0.to_bytes()) && args.len() == 3 {
            if let (Some(go), Some(msg)) = (num(1), num(2)) {
                init_main(go, msg);
            }
        }
        if role == "zygote" && argv0 == Some(ZYGOTE_ARGV0.to_bytes()) && args.len() == 2 {
            if let Some(ctl) = num(1) {
                crate::zygote::main(ctl);
            }
        }
    }
    REGISTERED.get_or_init(|| {
        InitProgram::open(Path::new("/proc/self/exe"))
            .ok()
            .map(|mut p| {
                p.path = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
                p
            })
    });
}

/// An exec'd per-run init: reads its descriptors and plan from `go`, then runs the same setup as
/// the in-process engine. A message it cannot read is reported on `msg` as the `engine` step.
fn init_main(go: c_int, msg: c_int) -> ! {
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _);
    let fail = |e: i32| -> ! {
        let m = Msg {
            kind: child::MSG_SETUP_ERROR,
            step: Step::Engine as u32,
            index: 0,
            value: e,
        };
        let _ = sys::write_all(msg, &m.to_bytes());
        sys::exit(1)
    };
    let body = match read_framed(go) {
        Ok(b) => b,
        Err(0) => sys::exit(1), // the supervisor gave up before sending anything
        Err(e) => fail(e),
    };
    let decoded = Reader::new(&body).and_then(|(kind, mut r)| {
        if kind != KIND_INIT {
            return Err(wire::WireError("kind"));
        }
        let fds = wire::read_fds(&mut r)?;
        let plan = wire::read_plan(&mut r)?;
        r.finish()?;
        Ok((fds, plan))
    });
    match decoded {
        Ok((fds, mut plan)) if fds.go == go && fds.msg == msg => child::init(&mut plan, &fds),
        _ => fail(libc::EPROTO),
    }
}

/// Reads one length-prefixed message from a stream; `Err(0)` at end of file before it.
pub(crate) fn read_framed(fd: c_int) -> Result<Vec<u8>, i32> {
    let mut len = [0u8; 4];
    match sys::read_full(fd, &mut len) {
        Ok(4) => {}
        Ok(0) => return Err(0),
        Ok(_) => return Err(libc::EPROTO),
        Err(e) => return Err(e),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > wire::MAX_MESSAGE {
        return Err(libc::EMSGSIZE);
    }
    let mut body = vec![0u8; n];
    match sys::read_full(fd, &mut body) {
        Ok(got) if got == n => Ok(body),
        Ok(_) => Err(libc::EPROTO),
        Err(e) => Err(e),
    }
}

/// The message an exec'd init reads first: its descriptors and its plan.
pub(crate) fn init_message(fds: &ChildFds, plan: &crate::plan::Plan) -> Vec<u8> {
    let mut w = Writer::new(KIND_INIT);
    wire::write_fds(&mut w, fds);
    wire::write_plan(&mut w, plan);
    w.framed()
}

/// What the pre-exec child needs, prepared by the parent (the child cannot allocate).
struct ExecArgs<'a> {
    prog: c_int,
    argv: &'a sys::CStrArray,
    envp: &'a sys::CStrArray,
    /// Become 0, 1, 2.
    stdio: [c_int; 3],
    /// Kept open across the exec; sorted, each ≥ 3.
    keep: &'a [c_int],
    /// Which step failed (0: none) and its errno; written by the child before it exits.
    err_step: u32,
    err: i32,
}

/// Most descriptors an engine process keeps across its exec (the child cannot allocate a longer
/// list): the init's few, and one detached tree per bind source opened by a root supervisor.
const MAX_KEPT: usize = 1024;

/// Step numbers of the pre-exec child, for the error message.
const EXEC_STEPS: [&str; 5] = [
    "",
    "make the init's capabilities ambient",
    "put the standard streams in place",
    "pass the init its descriptors",
    "execute palisade's init program",
];

/// The pre-exec child, between `clone(CLONE_VM | CLONE_VFORK)` and `execveat`: raw system calls
/// only, no allocation.
fn exec_child(a: &mut ExecArgs) -> ! {
    // The parent reads these only once the child has exited.
    fn fail(a: &mut ExecArgs, step: u32, e: i32) -> ! {
        sys::write_volatile(&mut a.err_step, step);
        sys::write_volatile(&mut a.err, if e == 0 { libc::EIO } else { e });
        sys::exit(127)
    }
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as _);
    if let Err(e) = sys::raise_ambient_all() {
        fail(a, 1, e);
    }
    for (target, &src) in a.stdio.iter().enumerate() {
        // dup2 makes the new number inheritable; one already in place may not be.
        let r = if src != target as c_int {
            sys::dup2(src, target as c_int)
        } else {
            sys::clear_cloexec(src)
        };
        if let Err(e) = r {
            fail(a, 2, e);
        }
    }
    for &fd in a.keep {
        if let Err(e) = sys::clear_cloexec(fd) {
            fail(a, 3, e);
        }
    }
    // Everything else closes: the caller's descriptors that are not close-on-exec never reach
    // the init program. The program's own descriptor stays until the exec, which closes it.
    let mut kept = [0 as c_int; MAX_KEPT + 1];
    let n = a.keep.len().min(MAX_KEPT);
    kept[..n].copy_from_slice(&a.keep[..n]);
    kept[n] = a.prog;
    kept[..=n].sort_unstable();
    if a.keep.len() > MAX_KEPT || sys::close_all_but(&kept[..=n]).is_err() {
        fail(a, 3, libc::EMFILE);
    }
    let e = sys::execveat_fd(a.prog, a.argv, a.envp);
    fail(a, 4, e)
}

/// A process started by [`exec_in_namespaces`].
pub(crate) struct Started {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

/// Starts `prog` as an engine process in new namespaces `ns` (as a `clone` flag set), with
/// `role` as its marker, `argv0` and `args`, the descriptors `stdio` as its 0, 1, 2 and `keep`
/// open (same numbers). Returns once it has exec'd. An error names the step that failed.
pub(crate) fn exec_in_namespaces(
    prog: &InitProgram,
    ns: u64,
    role: &str,
    argv0: &CStr,
    args: &[c_int],
    stdio: [c_int; 3],
    keep: &[c_int],
) -> Result<Started, (&'static str, i32)> {
    let strings: Vec<CString> = std::iter::once(argv0.to_owned())
        .chain(
            args.iter()
                .map(|a| CString::new(a.to_string()).expect("digits")),
        )
        .collect();
    let argv = sys::CStrArray::new(strings);
    let marker = CString::new(format!("{MARKER}={role}")).expect("no NUL");
    let envp = sys::CStrArray::new(vec![marker]);
    let mut sorted = keep.to_vec();
    sorted.sort_unstable();
    if sorted.len() > MAX_KEPT {
        return Err(("pass the init its descriptors", libc::EMFILE));
    }
    let mut a = ExecArgs {
        prog: prog.raw(),
        argv: &argv,
        envp: &envp,
        stdio,
        keep: &sorted,
        err_step: 0,
        err: 0,
    };
    let mut stack = vec![0u8; 64 * 1024];
    let top = stack.as_mut_ptr_range().end;
    let flags = libc::CLONE_PIDFD | ns as c_int | libc::SIGCHLD;
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the clone of an engine process itself.
    // SAFETY: `top` is the end of a live buffer only the child uses; exec_child runs raw system
    // calls only, touches nothing of ours but `a`, and ends in execveat or _exit; CLONE_VFORK
    // keeps this thread suspended (and `a`, `stack` alive) until then.
    let (pid, pidfd) =
        unsafe { sys::clone_vm_vfork(top, flags, &mut a, exec_child) }.map_err(|e| ("clone", e))?;
    let pidfd = pidfd.expect("CLONE_PIDFD gives a pidfd");
    // The child wrote these, if at all, before it exec'd or exited.
    let (step, err) = (sys::read_volatile(&a.err_step), sys::read_volatile(&a.err));
    drop(stack);
    if step != 0 {
        let _ = sys::waitpid(pid, 0);
        return Err((EXEC_STEPS[step as usize % EXEC_STEPS.len()], err));
    }
    Ok(Started { pid, pidfd })
}
