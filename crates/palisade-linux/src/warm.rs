//! Warm Python (docs/engine.md, "Warm Python"): a template's zygote that holds a started
//! interpreter, and the payload side that hands a run's code to a fork of it.
//!
//! Guarantees: the zygote starts the interpreter once, before its first run, in network, IPC
//! and UTS namespaces of its own, and checks it is still single-threaded after the imports; it
//! never runs any line of a run's code, and never receives it: a run's code, arguments and
//! environment travel from the supervisor to the payload through a pipe the zygote only passes
//! on, and the payload reads it after it has entered the run's whole boundary (Landlock,
//! capabilities, no-new-privs, seccomp: `child::payload_steps`). Not guaranteed: that runs do not
//! share what the interpreter did at start (modules, their state, the hash seed, the address-space
//! layout); that is the option's trade-off, written in docs/engine.md.

use crate::child::{Fail, Step};
use crate::sys;
use crate::wire::{Reader, WireError, Writer};
use libc::c_int;
use std::ffi::{CStr, CString};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The kind of the message on a warm run's code pipe.
const KIND_WARM_CODE: u8 = 6;

/// Most bytes of a warm run's code, arguments and environment together.
pub const MAX_WARM_RUN: usize = 1 << 20;

/// Where a Python's shared library is looked for, by its version (`libpython3.N.so.1.0`).
const LIBRARY_DIRS: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/lib64",
];

/// A warm interpreter's configuration: which Python, its shared library, the modules the
/// zygote imports before its first run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPython {
    /// The program as runs name it (`/usr/bin/python3`), and its real path.
    pub python: PathBuf,
    pub real: PathBuf,
    /// `libpython3.N.so.1.0` of the same version.
    pub library: PathBuf,
    /// Imported in the zygote, in this order.
    pub modules: Vec<String>,
}

impl WarmPython {
    /// `python` (a path, e.g. `/usr/bin/python3`) and the modules to import. Its library is
    /// found by its version in the usual directories; a Python without one (built without
    /// `--enable-shared`, or the package not installed) is an error naming what was looked for.
    pub fn find(python: &Path, modules: &[String]) -> Result<WarmPython, String> {
        let real = std::fs::canonicalize(python).map_err(|e| {
            format!(
                "warm_python.python: {} cannot be resolved ({e}); give the path of a python3",
                python.display()
            )
        })?;
        let name = real
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let version = name.strip_prefix("python").unwrap_or_default();
        let ok = version.starts_with("3.")
            && version[2..].chars().all(|c| c.is_ascii_digit())
            && version.len() > 2;
        if !ok {
            return Err(format!(
                "warm_python.python: {} is {}, not a python3.N program",
                python.display(),
                real.display()
            ));
        }
        let lib = format!("libpython{version}.so.1.0");
        let library = LIBRARY_DIRS
            .iter()
            .map(|d| Path::new(d).join(&lib))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "warm_python: no {lib} in {} (install the shared library of {}, e.g. the libpython{version} package)",
                    LIBRARY_DIRS.join(", "),
                    real.display()
                )
            })?;
        WarmPython::with_library(python, &real, &library, modules)
    }

    /// As [`WarmPython::find`], with the library given.
    pub fn with_library(
        python: &Path,
        real: &Path,
        library: &Path,
        modules: &[String],
    ) -> Result<WarmPython, String> {
        for m in modules {
            let ok = !m.is_empty()
                && m.split('.').all(|p| {
                    !p.is_empty()
                        && !p.starts_with(|c: char| c.is_ascii_digit())
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if !ok {
                return Err(format!(
                    "warm_python.modules: {m:?} is not a module name (dotted identifiers, e.g. json or os.path)"
                ));
            }
        }
        Ok(WarmPython {
            python: python.to_owned(),
            real: real.to_owned(),
            library: library.to_owned(),
            modules: modules.to_vec(),
        })
    }

    /// Whether a run of `command` goes to the warm interpreter: exactly `PY -c CODE [ARG...]`,
    /// with PY the template's Python (its path, real path, or their file names).
    pub fn takes(&self, command: &[String]) -> bool {
        let Some(prog) = command.first() else {
            return false;
        };
        let names = [&self.python, &self.real];
        let named = names.iter().any(|p| {
            p.as_os_str() == prog.as_str() || p.file_name().is_some_and(|n| n == prog.as_str())
        });
        named && command.len() >= 3 && command[1] == "-c"
    }
}

/// A warm run's code, arguments (`argv[1..]`, `-c` first) and environment, as the payload reads
/// them from its pipe.
pub(crate) fn encode_run(argv: &[CString], envp: &[CString]) -> Vec<u8> {
    let mut w = Writer::new(KIND_WARM_CODE);
    w.cstrs(argv);
    w.cstrs(envp);
    w.into_bytes()
}

fn decode_run(buf: &[u8]) -> Result<(Vec<CString>, Vec<CString>), WireError> {
    let (kind, mut r) = Reader::new(buf)?;
    if kind != KIND_WARM_CODE {
        return Err(WireError("kind"));
    }
    let argv = r.cstrs("warm arguments")?;
    let envp = r.cstrs("warm environment")?;
    r.finish()?;
    if argv.len() < 3 || argv[1].as_bytes() != b"-c" {
        return Err(WireError("warm arguments (not PY -c CODE)"));
    }
    Ok((argv, envp))
}

/// In the zygote, after the prepared view: its own network, IPC and UTS namespaces, the
/// interpreter loaded and started, the modules imported; then a check that it is still one
/// thread. `proc` is the host's `/proc` (the view's shows no process).
pub(crate) fn start(
    library: &CStr,
    python: &CStr,
    modules: &[CString],
    proc: c_int,
) -> Result<sys::Python, Fail> {
    // Imports run here: they reach no network, no SysV object and no host name of the host's.
    sys::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS)
        .map_err(|e| (Step::WarmPython, 0, e))?;
    #[allow(unsafe_code)]
    // EXCEPTION (sys module docs): the interpreter's start.
    // SAFETY: the zygote is single-threaded (checked below once the imports have run: they
    // could start threads) and uses the interpreter on this thread only, and on the one thread
    // of each warm payload it forks.
    let py = unsafe { sys::Python::start(library, python) }
        .map_err(|(index, e)| (Step::WarmPython, index, e))?;
    // What every run's start and end use (see `END`), then the configured modules. A failure
    // names a configured module by its index; one of the first five, none. `atexit` is for the
    // end; imported by each run instead, it took ~0.2 ms of a ~2.5 ms `print(1)`.
    let first = [c"os", c"signal", c"types", c"weakref", c"atexit"];
    for (i, m) in first
        .into_iter()
        .chain(modules.iter().map(|m| m.as_c_str()))
        .enumerate()
    {
        if !py.import(m) {
            let index = i.checked_sub(first.len()).map_or(u32::MAX, |i| i as u32);
            return Err((Step::WarmImport, index, libc::ENOENT));
        }
    }
    // A run's start and end (END), and every object made so far frozen out of the collector's
    // reach: a collection in a run then never touches (and so never copies) the template's pages.
    // END collects first, which also empties the interpreter's free lists: a run's first full
    // collection otherwise freed the template's, copying their pages (~0.08 ms a run).
    if !py.run(END) {
        return Err((Step::WarmPython, END_FAILED, libc::EINVAL));
    }
    let threads = threads(proc).map_err(|e| (Step::WarmThreads, 0, e))?;
    if threads != 1 {
        return Err((Step::WarmThreads, threads, libc::EBUSY));
    }
    Ok(py)
}

/// This process's thread count, from the host's `/proc`.
fn threads(proc: c_int) -> Result<u32, i32> {
    let fd = sys::openat(proc, c"self/status", libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
    let mut buf = [0u8; 4096];
    let n = sys::read_full(fd.as_raw_fd(), &mut buf);
    sys::close_owned(fd);
    let text = std::str::from_utf8(&buf[..n?]).map_err(|_| libc::EIO)?;
    text.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(libc::EIO)
}

/// The index of a `Step::WarmPython` failure that is END's (0 and 1 are `Python::start`'s).
pub(crate) const END_FAILED: u32 = 9;

/// The function of the template's interpreter (`sys.` this) that a run calls before its code
/// (see `END`, which defines it).
const BOOTSTRAP: &CStr = c"_palisade_bootstrap";

/// Defines, in the template's interpreter, what a run calls before its code and how it ends.
///
/// Before: `bootstrap`, in a function so that `__main__` gets none of its names and compiled
/// once here (not per run): a fresh `__main__`, the run's environment into `os.environ` (the C
/// `environ` is already the run's), `''` first on `sys.path` (as for `python3 -c`), Python's
/// usual signal dispositions (the payload steps reset every signal to its default), line
/// buffering on a terminal. The modules it and the end use (`os`, `signal`, `types`, `weakref`,
/// `atexit`) are the template's, imported before this: a run imports none of them itself. The
/// dispositions are set through `_signal`, the C module under `signal`: `signal.signal` turns
/// its numbers into and out of `enum` members, which took ~0.2 ms of a run's ~2.5 ms (timed
/// inside a `print(1)` run, 2026-12-06), and `_signal.signal` 0.02. What `__main__` takes of the
/// template's is listed once, here (`main_items`), not looked for in each run.
///
/// A signal whose handler was not Python's when `signal` was imported in the zygote (palisade's
/// runtime handles `SIGSEGV` and `SIGBUS` to report a stack overflow) is listed (`foreign`) and
/// set to its default by each run's start: the payload steps reset every disposition to the
/// default, and Python, which had recorded a handler of another's, said `None` for it where
/// `python3 -c` says `SIG_DFL`. The zygote and the runs' inits keep the runtime's handlers.
///
/// The zygote collects once before anything else here (before `before` is taken: a finalizer
/// that imports lists its module as the template's), which also empties the interpreter's free
/// lists: a run's first full collection otherwise freed the template's, copying their pages. It
/// flushes its standard streams (to `/dev/null`) before it freezes: what an import printed stayed
/// in the buffer, and came out at the top of every run's output.
///
/// The end: what `Py_FinalizeEx` does that a program can see, for the run's own objects, without
/// tearing down the whole interpreter (which writes to every object the template imported, and so
/// copies most of its pages: ~6 ms a run, more than the rest of it). In CPython's order: wait for
/// the non-daemon threads, the `atexit` handlers, flush the standard streams (the original ones
/// too, if the run replaced them) and every file of the run still open (see below), then every
/// global of `__main__` and of each module the run imported is set to `None` (names with one
/// leading underscore first), which closes the files they held and runs their `__del__`, a
/// collection (of the run's objects only: the template's are frozen), the standard streams
/// flushed again; then the process exits with the code's status, or 120 if a flush failed, as
/// `python3 -c` does.
/// Modules the template imported keep their globals, as they were before the run
/// (docs/engine.md, "How a warm run ends").
///
/// The run's files (text and buffered binary) are flushed before the collection because a
/// collection finalizes a cycle's objects in no defined order: a text file (`io.TextIOWrapper`)
/// whose buffer object is finalized first finds it closed and loses what it had not written, and
/// so does a buffered one whose raw file goes first. Which comes first depends on where the
/// collector's lists hold them, which any allocation earlier in the process moves; a file held by
/// the globals of `__main__` or of a module the run imported is in such a cycle as soon as a class
/// or function of that module is. Nothing in the search may end the run: a failure (memory) is
/// passed over, as the file's own finalizer would be.
const END: &CStr = c"import sys
_palisade_ns = {'__builtins__': __builtins__}
exec('''
import _signal, atexit, gc, io, os, signal, sys, types, weakref
gc.collect()
before = frozenset(sys.modules)
files = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)
main_items = tuple((k, v) for k, v in sys.modules['__main__'].__dict__.items()
                   if k[:2] == '__' and k != '__annotations__')
foreign = tuple(n for n in signal.valid_signals() if signal.getsignal(n) is None)
def bootstrap():
    del sys._palisade_bootstrap
    main = types.ModuleType('__main__')
    main.__dict__.update(main_items)
    main.__annotations__ = {}
    sys.modules['__main__'] = main
    env = sys._palisade_env
    del sys._palisade_env
    data = os.environ._data
    data.clear()
    for kv in env:
        k, eq, v = kv.partition(b'=')
        if eq:
            data[k] = v
    sys.path.insert(0, '')
    for n in foreign:
        try:
            _signal.signal(n, _signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
    for s in (sys.stdout, sys.stderr):
        if s is not None and s.isatty():
            s.reconfigure(line_buffering=True)
def flush():
    ok = True
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None and not f.closed:
                f.flush()
        except BaseException:
            ok = False
    return ok
def end(status):
    threading = sys.modules.get('threading')
    shutdown = getattr(threading, '_shutdown', None)
    del threading
    if shutdown is not None:
        shutdown()
    del shutdown
    atexit._run_exitfuncs()
    ok = flush()
    try:
        for o in gc.get_objects():
            if issubclass(type(o), files):
                try:
                    if not o.closed:
                        o.flush()
                except BaseException:
                    pass
    except BaseException:
        pass
    o = None
    names = ['__main__'] + [n for n in list(sys.modules) if n not in before]
    refs = []
    for n in names:
        m = sys.modules.pop(n, None)
        if m is not None:
            try:
                refs.append(weakref.ref(m))
            except TypeError:
                pass
        m = None
    gc.collect()
    for r in refs:
        d = getattr(r(), '__dict__', None)
        if type(d) is dict:
            for k in [k for k in d if k[:1] == '_' and k[:2] != '__']:
                d[k] = None
            for k in [k for k in d if k != '__builtins__']:
                d[k] = None
        d = None
    gc.collect()
    ok = flush() and ok
    os._exit(status if ok else 120)
def end_ok():
    end(0)
def end_failed():
    end(1)
''', _palisade_ns)
sys._palisade_bootstrap = _palisade_ns['bootstrap']
sys._palisade_end_ok = _palisade_ns['end_ok']
sys._palisade_end_failed = _palisade_ns['end_failed']
for _f in (sys.stdout, sys.stderr):
    try:
        _f.flush()
    except BaseException:
        pass
del _palisade_ns, sys, _f
import gc
gc.freeze()
del gc
";

/// The payload's last step, after `child::payload_steps` (it is inside the whole boundary):
/// reads the run from `code`, says "started" by closing `status`, and runs it as
/// `python3 -c` would. Never returns.
pub(crate) fn run(py: &sys::Python, code: c_int, status: c_int) -> ! {
    let mut buf = vec![0u8; MAX_WARM_RUN + 64];
    let n = match sys::read_full(code, &mut buf) {
        Ok(n) if n < buf.len() => n,
        Ok(_) => fail(status, libc::E2BIG),
        Err(e) => fail(status, e),
    };
    sys::close(code);
    let (argv, envp) = match decode_run(&buf[..n]) {
        Ok(v) => v,
        Err(_) => fail(status, libc::EPROTO),
    };
    drop(buf);
    // The C environment, for the programs the run starts (`subprocess` without `env=`); the
    // strings and the array live until the process exits.
    let envp: &'static sys::CStrArray = Box::leak(Box::new(sys::CStrArray::new(envp)));
    py.set_environ(envp);
    // Started: the init reports the run as running from here on.
    sys::close(status);
    let code_rc = match py.run_command(&argv, envp, BOOTSTRAP) {
        Ok(rc) => rc,
        Err(()) => sys::exit(1),
    };
    std::mem::forget(argv);
    // The end as python3 -c has it (END), which exits; past it only if it could not run.
    py.call_sys(if code_rc != 0 {
        c"_palisade_end_failed"
    } else {
        c"_palisade_end_ok"
    });
    let fin = py.finalize();
    sys::exit(if code_rc != 0 {
        1
    } else if fin < 0 {
        120
    } else {
        0
    })
}

/// Before "started": the error goes to the init on `status`, which reports it.
fn fail(status: c_int, errno: i32) -> ! {
    crate::child::send(
        status,
        crate::child::Msg {
            kind: crate::child::MSG_EXEC_ERROR,
            step: 0,
            index: 0,
            value: errno,
        },
    );
    sys::exit(127)
}
