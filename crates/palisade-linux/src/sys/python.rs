//! CPython's C API, as far as warm Python uses it: loaded with `dlopen` in a template's zygote,
//! started once, and used again in the zygote's forks (each a copy of the one thread that
//! started it, which holds the interpreter's lock and never released it).

use super::{CStrArray, Errno};
use libc::{c_char, c_int, c_void};
use std::ffi::{CStr, CString};

/// The interpreter's entry points, found by `dlsym`; a fork keeps them valid (same address
/// space layout).
#[derive(Clone, Copy)]
pub struct Python {
    initialize_ex: unsafe extern "C" fn(c_int),
    finalize_ex: unsafe extern "C" fn() -> c_int,
    run_simple: unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int,
    import: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    err_clear: unsafe extern "C" fn(),
    after_fork_child: unsafe extern "C" fn(),
    sys_set_object: unsafe extern "C" fn(*const c_char, *mut c_void) -> c_int,
    list_new: unsafe extern "C" fn(isize) -> *mut c_void,
    list_set_item: unsafe extern "C" fn(*mut c_void, isize, *mut c_void) -> c_int,
    bytes_from: unsafe extern "C" fn(*const c_char, isize) -> *mut c_void,
    decode_fs: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    decref: unsafe extern "C" fn(*mut c_void),
    incref: unsafe extern "C" fn(*mut c_void),
    sys_get_object: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    call_object: unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void,
    err_print: unsafe extern "C" fn(),
}

/// Looks a symbol up in `lib`; the caller names the type it has in the C API.
///
/// # Safety
/// `lib` is a handle `dlopen` returned; `T` is the function pointer type of the symbol `name`
/// in CPython's C API.
unsafe fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> Result<T, (u32, Errno)> {
    // SAFETY: dlsym on a handle dlopen returned (the caller's contract), with a NUL-terminated
    // name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err((1, libc::ENOSYS));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller names the symbol's type; a function pointer is pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

extern "C" {
    static mut environ: *const *const c_char;
}

impl Python {
    /// Loads `library` (`RTLD_NOW | RTLD_GLOBAL`, so that extension modules find the C API),
    /// finds the entry points, names the program `program` (from which the interpreter finds its
    /// prefix and sets `sys.executable`; `Py_SetProgramName` is deprecated but present in
    /// 3.8–3.13, and without it the compiled-in prefix is used) and starts the interpreter.
    /// A failure is (0: not loaded, 1: a symbol missing; errno).
    ///
    /// # Safety
    /// The calling process is single-threaded and stays so but for the interpreter's own
    /// threads; the value is used only on this thread, and on the one thread of a process forked
    /// from it. (The interpreter's state is not thread-safe without its lock, which this thread
    /// takes here and never releases; the C `environ` is replaced in [`Python::set_environ`].)
    pub unsafe fn start(library: &CStr, program: &CStr) -> Result<Python, (u32, Errno)> {
        // SAFETY: dlopen of a NUL-terminated path.
        let lib = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if lib.is_null() {
            return Err((0, libc::ENOENT));
        }
        // SAFETY: each type is the one the symbol has in CPython's stable C API.
        let py = unsafe {
            Python {
                initialize_ex: sym(lib, c"Py_InitializeEx")?,
                finalize_ex: sym(lib, c"Py_FinalizeEx")?,
                run_simple: sym(lib, c"PyRun_SimpleStringFlags")?,
                import: sym(lib, c"PyImport_ImportModule")?,
                err_clear: sym(lib, c"PyErr_Clear")?,
                after_fork_child: sym(lib, c"PyOS_AfterFork_Child")?,
                sys_set_object: sym(lib, c"PySys_SetObject")?,
                list_new: sym(lib, c"PyList_New")?,
                list_set_item: sym(lib, c"PyList_SetItem")?,
                bytes_from: sym(lib, c"PyBytes_FromStringAndSize")?,
                decode_fs: sym(lib, c"PyUnicode_DecodeFSDefault")?,
                decref: sym(lib, c"Py_DecRef")?,
                incref: sym(lib, c"Py_IncRef")?,
                sys_get_object: sym(lib, c"PySys_GetObject")?,
                call_object: sym(lib, c"PyObject_CallObject")?,
                err_print: sym(lib, c"PyErr_Print")?,
            }
        };
        // SAFETY: the type of Py_SetProgramName; the wide string is leaked, as the API requires
        // it to live as long as the interpreter. Single-threaded, per the caller's contract.
        unsafe {
            if let Ok(set) =
                sym::<unsafe extern "C" fn(*const libc::wchar_t)>(lib, c"Py_SetProgramName")
            {
                let wide: Vec<libc::wchar_t> = program
                    .to_bytes()
                    .iter()
                    .map(|&b| b as libc::wchar_t)
                    .chain(std::iter::once(0))
                    .collect();
                set(wide.leak().as_ptr());
            }
            (py.initialize_ex)(0);
        }
        Ok(py)
    }

    /// Imports `module` (and drops the reference); whether it worked. A failed import's
    /// exception is cleared.
    pub fn import(&self, module: &CStr) -> bool {
        // SAFETY: the interpreter is initialised and this thread holds its lock (`start`'s
        // contract); a new reference is released at once.
        unsafe {
            let got = (self.import)(module.as_ptr());
            if got.is_null() {
                (self.err_clear)();
                return false;
            }
            (self.decref)(got);
        }
        true
    }

    /// The C `environ` becomes `env` (for the programs the run starts: `subprocess` without
    /// `env=`).
    pub fn set_environ(&self, env: &'static CStrArray) {
        // SAFETY: single-threaded (`start`'s contract), so nothing reads `environ` meanwhile;
        // the array is NULL-terminated and lives for the rest of the process.
        unsafe { environ = env.as_ptrs().as_ptr() };
    }

    /// In a fork of the process that started the interpreter: `PyOS_AfterFork_Child`, then
    /// `sys.argv` = `[argv[1]] + argv[3..]` (`-c` and the arguments, as `python3 -c` has it),
    /// `sys._palisade_env` = `envp` as bytes, the function `sys.<bootstrap>` called (the
    /// template's, compiled once), then `argv[2]` (the code) run.
    /// The code's result (0: no uncaught exception); `Err` if the setup before it failed.
    /// `argv` holds at least three strings.
    pub fn run_command(
        &self,
        argv: &[CString],
        envp: &[CString],
        bootstrap: &CStr,
    ) -> Result<c_int, ()> {
        assert!(argv.len() >= 3, "PY -c CODE");
        let py = self;
        // SAFETY: this thread holds the interpreter's lock (it is the copy of the thread that
        // initialised it, which never released it); every object made here is passed on or
        // released as the C API says (PyList_SetItem steals its item; PySys_SetObject does not).
        unsafe {
            (py.after_fork_child)();
            let list = |items: &[CString], f: &dyn Fn(&CStr) -> *mut c_void| -> *mut c_void {
                let l = (py.list_new)(items.len() as isize);
                for (i, s) in items.iter().enumerate() {
                    (py.list_set_item)(l, i as isize, f(s));
                }
                l
            };
            let args = list(&argv[1..], &|s| (py.decode_fs)(s.as_ptr()));
            let mut argv_py = args;
            // sys.argv is ['-c', ARG...]: the code itself is not in it.
            let rest: Vec<CString> = std::iter::once(argv[1].clone())
                .chain(argv[3..].iter().cloned())
                .collect();
            (py.decref)(argv_py);
            argv_py = list(&rest, &|s| (py.decode_fs)(s.as_ptr()));
            let env = list(envp, &|s| {
                (py.bytes_from)(s.as_ptr(), s.to_bytes().len() as isize)
            });
            if argv_py.is_null()
                || env.is_null()
                || (py.sys_set_object)(c"argv".as_ptr(), argv_py) != 0
                || (py.sys_set_object)(c"_palisade_env".as_ptr(), env) != 0
            {
                return Err(());
            }
            (py.decref)(argv_py);
            (py.decref)(env);
            if !py.call_sys(bootstrap) {
                return Err(());
            }
            Ok((py.run_simple)(argv[2].as_ptr(), std::ptr::null_mut()))
        }
    }

    /// Runs `code` in `__main__`; whether it ran without an uncaught exception (which is
    /// printed).
    pub fn run(&self, code: &CStr) -> bool {
        // SAFETY: this thread holds the interpreter's lock (`start`'s contract, or the copy of
        // that thread in a fork; see `run_command`).
        unsafe { (self.run_simple)(code.as_ptr(), std::ptr::null_mut()) == 0 }
    }

    /// Calls `sys.NAME()` from C, with no Python frame under it (so no module's globals are held
    /// by the call); whether it returned without an exception (which is printed).
    pub fn call_sys(&self, name: &CStr) -> bool {
        // SAFETY: as in `run`; PySys_GetObject returns a borrowed reference (or NULL), held as
        // our own for the call (the function may remove itself from `sys`); the call's result is
        // a new reference, released.
        unsafe {
            let f = (self.sys_get_object)(name.as_ptr());
            if f.is_null() {
                return false;
            }
            (self.incref)(f);
            let r = (self.call_object)(f, std::ptr::null_mut());
            (self.decref)(f);
            if r.is_null() {
                (self.err_print)();
                return false;
            }
            (self.decref)(r);
            true
        }
    }

    /// `Py_FinalizeEx`, after the run's code, as `python3 -c` ends: negative if it failed.
    pub fn finalize(&self) -> c_int {
        // SAFETY: this thread holds the interpreter's lock (see `run_command`).
        unsafe { (self.finalize_ex)() }
    }
}
