//! The seccomp filter: a second wall in front of the kernel's attack surface.
//!
//! Installed last in the payload, after no_new_privs and right before `execve`, so that none of
//! palisade's own setup calls are filtered. Refused calls fail with `EPERM` (not a kill), so that
//! programs fail gracefully (the supervisor gives the answer, see below); `clone3` fails with `ENOSYS` so that libc falls back to `clone`, whose
//! flags a classic BPF filter can inspect (it cannot read `clone3`'s argument struct).
//!
//! | refused | why |
//! |---|---|
//! | other ABIs (i386 on x86_64, x32) | their syscall numbers would bypass the checks below |
//! | `io_uring_*` | performs I/O without passing through the syscalls this filter checks; a long record of kernel bugs |
//! | `bpf`, `perf_event_open`, `userfaultfd`, `keyctl`, `add_key`, `request_key` | frequent privilege-escalation surface, not needed by payloads |
//! | `ptrace`, `process_vm_readv/writev` | inspecting or steering other processes |
//! | `kexec_*`, module calls, `reboot`, `swapon/off`, `acct`, `quotactl*`, `syslog`, `iopl`, `ioperm`, `uselib`, `_sysctl`, `lookup_dcookie` | host administration |
//! | `mount` and the new mount API (`open_tree_attr` included), `umount2`, `pivot_root`, `chroot` | changing the filesystem view |
//! | `open_by_handle_at`, `name_to_handle_at` | opening files by handle, around the mount view (the "shocker" escape) |
//! | `unshare`, `setns`, `clone` with namespace flags | new namespaces unlock more kernel surface (nested user namespaces are also capped at 0) |
//! | `ioctl` `TIOCSTI`, `TIOCLINUX` | keystroke injection into a terminal; the command is compared as 32 bits (CVE-2019-10063) |
//! | `ioctl` `TIOCSETD` | a line discipline on the sandbox's own pty: loads and runs rarely used kernel code (n_gsm, n_hdlc, PPP) and, with PPP, registers a channel counted in the network namespace, which a template may hand to a later run |
//! | `socket` and `socketpair` of families other than `AF_UNIX`, `AF_INET`, `AF_INET6` | netlink, packet, vsock, xdp… sockets: no route out but the proxy's, and no other family's code (`socketpair` creates a socket of the family before it finds out the family has no pairs) |
//! | `memfd_secret` | a secret memory area is taken out of the kernel's direct map, splitting its large pages for good: a payload that makes and drops them over fresh memory splits the host's 1 GiB mappings one by one (an independent attack, 2026-12-05: 16 of 24 in one run), slowing every kernel memory access until reboot |
//! | `io_setup` | native AIO contexts count against one host-wide quota, `fs.aio-max-nr`: one payload could take all of it, denying it to host services and other sandboxes while it runs (the same attack) |
//! | `fanotify_init` | a group counts against the per-user quota of the user namespace's owner, host root for a root-launched sandbox (audit F3); inotify stays |
//! | `prlimit64` of `RLIMIT_CORE` that also reads the old limit | the limit stays at [`CORE_LIMIT`]; a plain `setrlimit` or `prlimit64` of it returns 0 and changes nothing (not reported) |
//! | `lsm_set_self_attr` | changing the process's LSM context, which `/proc/self/attr` does not allow inside (Landlock) |
//! | `chmod`, `fchmod`, `fchmodat(2)`, `open`, `openat`, `creat`, `mknod(at)` with set-uid or set-gid in the mode; `openat2` (ENOSYS: its mode is out of a filter's reach) | files written to scratch or `--rw` binds land on the host owned by a real user: a set-uid file left there would run as that user (root, for a root-launched sandbox) for anyone who can reach it |
//!
//! Allowed on purpose: `landlock_create_ruleset`, `landlock_add_rule`, `landlock_restrict_self`.
//! The payload has entered palisade's Landlock domain before this filter exists (step 16, the
//! filter is step 19), and Landlock only ever narrows: a payload that sandboxes itself further
//! gains nothing. The other calls of the table up to Linux 6.18 that are allowed (`statmount`,
//! `listmount`, `mseal`, the `*xattrat` calls, `file_getattr`/`file_setattr`, …) are listed with the
//! reason for each in `docs/layers/seccomp.md`.
//!
//! Attempts are reported: the filter hands every refused call (all rows above but the `ENOSYS`
//! fallbacks of `clone3` and `openat2`, and the `RLIMIT_CORE` changes answered 0) to the supervisor
//! through a seccomp user-notification listener; the supervisor records name, count and first pid
//! and answers with the errno, so the call never runs. A run that makes no refused call pays only for creating and passing the
//! listener.
//!
//! `--allow-ptrace` takes `ptrace` and `process_vm_readv/writev` off the refused list (debuggers).

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const BPF_JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
const BPF_RET_K: u16 = 0x06;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_USER_NOTIF: u32 = 0x7fc0_0000;

// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;

/// Offset of the low 32 bits of argument `i` (the arguments are 64-bit words in the machine's
/// byte order, and both architectures palisade builds for are little-endian).
const fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}
/// Offset of the high 32 bits of argument `i`.
const fn arg_hi(i: u32) -> u32 {
    arg_lo(i) + 4
}
#[cfg(not(target_endian = "little"))]
compile_error!(
    "the seccomp filter reads the low half of each argument at the little-endian offset"
);

/// The payload's `RLIMIT_CORE`, soft and hard, which the filter keeps there. One byte is too small
/// for any core file (the kernel writes none under its format's minimum, a page for ELF), and it is
/// the one value at which the kernel starts no `core_pattern` pipe helper: it reserves 1 to catch a
/// helper that crashes itself. A helper ignores every other limit, 0 included, and would get the
/// crashing process's memory, as root on the host (audit F8). A socket pattern (`@`, Linux 6.16)
/// ignores even 1; `palisade doctor` warns about it.
pub const CORE_LIMIT: u64 = 1;

/// The socket families `socket` and `socketpair` may create.
const FAMILIES: [i32; 3] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];

/// Set-user-ID and set-group-ID bits of a file mode.
const SETID_BITS: u32 = 0o6000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// x32 system calls on x86_64 carry this bit.
const X32_BIT: u32 = 0x4000_0000;

const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP
    | 0x80) as u32; // CLONE_NEWTIME

/// A place in a program under construction that jumps can name before it is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

/// Where a conditional jump goes: on to the next instruction, or to a label.
#[derive(Debug, Clone, Copy)]
enum To {
    Next,
    At(Label),
}

/// A classic-BPF program whose jumps name labels, so that no offset is counted by hand. Classic
/// BPF only jumps forward, by at most 255 instructions: `finish` resolves
/// every label and checks both, and that the program cannot run off its end.
#[derive(Default)]
struct Asm {
    code: Vec<(SockFilter, [To; 2])>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Places `l` at the next instruction.
    fn place(&mut self, l: Label) {
        assert!(
            self.labels[l.0].is_none(),
            "seccomp program: label placed twice"
        );
        self.labels[l.0] = Some(self.code.len());
    }

    fn push(&mut self, code: u16, k: u32, jt: To, jf: To) {
        let i = SockFilter {
            code,
            jt: 0,
            jf: 0,
            k,
        };
        self.code.push((i, [jt, jf]));
    }

    /// Loads the 32-bit word at `off` of `struct seccomp_data`.
    fn load(&mut self, off: u32) {
        self.push(BPF_LD_W_ABS, off, To::Next, To::Next);
    }

    fn ret(&mut self, k: u32) {
        self.push(BPF_RET_K, k, To::Next, To::Next);
    }

    fn jeq(&mut self, k: u32, jt: To, jf: To) {
        self.push(BPF_JEQ_K, k, jt, jf);
    }

    fn jge(&mut self, k: u32, jt: To, jf: To) {
        self.push(BPF_JGE_K, k, jt, jf);
    }

    fn jset(&mut self, k: u32, jt: To, jf: To) {
        self.push(BPF_JSET_K, k, jt, jf);
    }

    /// Dispatches on the loaded value: jumps to the label paired with it in `sorted` (ascending,
    /// each value once), or to `otherwise` if it has none. A binary search over the values, with
    /// up to three comparisons in each leaf; every path ends in a jump, so nothing falls through.
    fn search(&mut self, sorted: &[(u32, Label)], otherwise: Label) {
        const LEAF: usize = 4;
        assert!(!sorted.is_empty(), "seccomp program: a search of nothing");
        if sorted.len() <= LEAF {
            for (i, &(k, l)) in sorted.iter().enumerate() {
                let miss = if i + 1 == sorted.len() {
                    To::At(otherwise)
                } else {
                    To::Next
                };
                self.jeq(k, To::At(l), miss);
            }
            return;
        }
        let (low, high) = sorted.split_at(sorted.len() / 2);
        let upper = self.label();
        self.jge(high[0].0, To::At(upper), To::Next);
        self.search(low, otherwise);
        self.place(upper);
        self.search(high, otherwise);
    }

    /// The finished program. Panics on a mistake in the program's construction (an unplaced
    /// label, a backward or too long jump, a last instruction that is not a return): the program
    /// depends on nothing but `allow_ptrace`, and the unit tests build it both ways.
    fn finish(self) -> Vec<SockFilter> {
        let len = self.code.len();
        let at = |pc: usize, to: To| -> usize {
            let target = match to {
                To::Next => pc + 1,
                To::At(l) => self.labels[l.0].expect("seccomp program: a label was never placed"),
            };
            assert!(
                target > pc && target < len,
                "seccomp program: jump from {pc} to {target} is not forward inside the program"
            );
            target - pc - 1
        };
        let short = |off: usize| -> u8 {
            u8::try_from(off).expect("seccomp program: a conditional jump is longer than 255")
        };
        let out: Vec<SockFilter> = self
            .code
            .iter()
            .enumerate()
            .map(|(pc, &(mut i, [jt, jf]))| {
                if matches!(i.code, BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K) {
                    i.jt = short(at(pc, jt));
                    i.jf = short(at(pc, jf));
                }
                i
            })
            .collect();
        assert_eq!(
            out.last().map(|i| i.code),
            Some(BPF_RET_K),
            "seccomp program: the last instruction must return"
        );
        out
    }
}

/// A system call's name and number.
macro_rules! sys {
    ($name:ident) => {
        (stringify!($name).trim_start_matches("SYS_"), libc::$name)
    };
}

/// Calls newer than the `libc` crate's tables; the same number on every architecture (the common
/// table, from 424 on).
const SYS_LSM_SET_SELF_ATTR: i64 = 460;
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// The calls `--allow-ptrace` takes off the refused list.
const TRACING: [i64; 3] = [
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
];

/// System calls refused outright, with their names (for the report); with `allow_ptrace`, the
/// tracing calls are not among them.
pub fn refused(allow_ptrace: bool) -> Vec<(&'static str, i64)> {
    let mut v = denied();
    if allow_ptrace {
        v.retain(|(_, nr)| !TRACING.contains(nr));
    }
    v
}

/// Every system call the filter can refuse outright, with its name.
pub fn denied() -> Vec<(&'static str, i64)> {
    let mut v = vec![
        sys!(SYS_io_uring_setup),
        sys!(SYS_io_uring_enter),
        sys!(SYS_io_uring_register),
        sys!(SYS_bpf),
        sys!(SYS_perf_event_open),
        sys!(SYS_userfaultfd),
        sys!(SYS_keyctl),
        sys!(SYS_add_key),
        sys!(SYS_request_key),
        sys!(SYS_ptrace),
        sys!(SYS_process_vm_readv),
        sys!(SYS_process_vm_writev),
        sys!(SYS_kexec_load),
        sys!(SYS_kexec_file_load),
        sys!(SYS_init_module),
        sys!(SYS_finit_module),
        sys!(SYS_delete_module),
        sys!(SYS_mount),
        sys!(SYS_umount2),
        sys!(SYS_fsopen),
        sys!(SYS_fsconfig),
        sys!(SYS_fsmount),
        sys!(SYS_fspick),
        sys!(SYS_move_mount),
        sys!(SYS_open_tree),
        ("open_tree_attr", SYS_OPEN_TREE_ATTR),
        sys!(SYS_mount_setattr),
        sys!(SYS_pivot_root),
        sys!(SYS_chroot),
        sys!(SYS_swapon),
        sys!(SYS_swapoff),
        sys!(SYS_reboot),
        sys!(SYS_acct),
        sys!(SYS_quotactl),
        sys!(SYS_quotactl_fd),
        sys!(SYS_open_by_handle_at),
        sys!(SYS_name_to_handle_at),
        sys!(SYS_syslog),
        sys!(SYS_unshare),
        sys!(SYS_setns),
        sys!(SYS_lookup_dcookie),
        sys!(SYS_fanotify_init),
        sys!(SYS_memfd_secret),
        sys!(SYS_io_setup),
        ("lsm_set_self_attr", SYS_LSM_SET_SELF_ATTR),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        sys!(SYS_iopl),
        sys!(SYS_ioperm),
        sys!(SYS_uselib),
        sys!(SYS__sysctl),
    ]);
    v
}

/// Builds the filter program. Refusals go to the supervisor through the filter's listener, so that
/// the report can list them; the two fallbacks that libc takes on its own (`clone3`, `openat2`
/// answering `ENOSYS`) are answered in the filter and not reported.
///
/// The program first dispatches on the number (a binary search, `Asm::search`), then checks the
/// arguments of the few calls that need it in a block of their own; every block ends in one of the shared answers at the end
/// (so no block falls into the next, and the number never has to be loaded twice).
pub fn program(allow_ptrace: bool) -> Vec<SockFilter> {
    program_with(allow_ptrace, false)
}

/// A call the supervisor watches without deciding it, then lets the kernel run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// A `connect` of a sandbox without egress: the supervisor records where it was going (the
    /// report's attempts).
    Connect,
    /// A `socket` or `socketpair` of an allowed family, in a sandbox without egress: the
    /// supervisor notes that the run made a socket, so that its network namespace is never
    /// handed to a later run (docs/engine.md, "The network namespace").
    Socket,
}

/// Whether the supervisor watches this call without deciding it, and why; `None` for a call the
/// filter refused, which the supervisor answers with [`answer`]. The family of a `socket` is
/// read from the call's registers, which no other thread of the caller can change.
pub fn watched(nr: i32, arch: u32, args: &[u64; 6]) -> Option<Watched> {
    if arch != AUDIT_ARCH {
        return None;
    }
    match nr as i64 {
        libc::SYS_connect => Some(Watched::Connect),
        libc::SYS_socket | libc::SYS_socketpair if FAMILIES.contains(&(args[0] as i32)) => {
            Some(Watched::Socket)
        }
        _ => None,
    }
}

/// [`program`], with `watch_net`: every `connect`, and every `socket` and `socketpair` of an
/// allowed family, goes to the supervisor too, which notes it ([`watched`]) and lets it run (a
/// run without egress: its attempts, and whether its network namespace stayed unused).
pub fn program_with(allow_ptrace: bool, watch_net: bool) -> Vec<SockFilter> {
    let mut a = Asm::default();
    // The shared answers, placed at the end. A refusal the report lists goes to the supervisor,
    // which records the call and answers with the errno `answer` gives (the call never runs).
    let refuse = a.label();
    let allow = a.label();
    let enosys = a.label();
    // The argument checks.
    let clone = a.label();
    let ioctl = a.label();
    let family = a.label();
    let setrlimit = a.label();
    let prlimit = a.label();
    let core_set = a.label();
    // Answered 0 without running: a change of RLIMIT_CORE.
    let unchanged = a.label();
    // One check of the set-id bits for each argument position a mode is passed in.
    let mut mode_checks: Vec<(u32, Label)> = Vec::new();
    let mut mode: Vec<(i64, Label)> = Vec::new();
    for (nr, arg) in mode_args() {
        let l = match mode_checks.iter().find(|&&(i, _)| i == arg) {
            Some(&(_, l)) => l,
            None => {
                let l = a.label();
                mode_checks.push((arg, l));
                l
            }
        };
        mode.push((nr, l));
    }

    // Architecture first: a foreign ABI would reinterpret every number below.
    a.load(OFF_ARCH);
    a.jeq(AUDIT_ARCH, To::Next, To::At(refuse));
    a.load(OFF_NR);
    if cfg!(target_arch = "x86_64") {
        a.jge(X32_BIT, To::At(refuse), To::Next);
    }
    // Every number with an answer other than "allow", sorted, and found by a binary search: a
    // call is decided in a dozen instructions, not after comparing it with every number in turn.
    // The kernel runs the program once per number of the table when the filter is installed (to
    // cache the numbers it allows whatever the arguments), so a linear list cost every run ~0.1 ms.
    let mut dispatch: Vec<(u32, Label)> = refused(allow_ptrace)
        .into_iter()
        .map(|(_, nr)| (nr as u32, refuse))
        .collect();
    if watch_net {
        dispatch.push((libc::SYS_connect as u32, refuse));
    }
    // clone3: ENOSYS, so that libc falls back to clone. openat2 takes its mode in a struct a
    // filter cannot read: ENOSYS, callers fall back to openat.
    dispatch.extend([
        (libc::SYS_clone3 as u32, enosys),
        (libc::SYS_openat2 as u32, enosys),
        (libc::SYS_clone as u32, clone),
        (libc::SYS_ioctl as u32, ioctl),
        (libc::SYS_socket as u32, family),
        (libc::SYS_socketpair as u32, family),
        (libc::SYS_setrlimit as u32, setrlimit),
        (libc::SYS_prlimit64 as u32, prlimit),
    ]);
    dispatch.extend(mode.iter().map(|&(nr, l)| (nr as u32, l)));
    dispatch.sort_by_key(|&(nr, _)| nr);
    for w in dispatch.windows(2) {
        assert!(
            w[0].0 != w[1].0,
            "seccomp program: number {} has two answers",
            w[0].0
        );
    }
    a.search(&dispatch, allow);

    // clone with any namespace flag.
    a.place(clone);
    a.load(arg_lo(0));
    a.jset(NAMESPACE_FLAGS, To::At(refuse), To::At(allow));
    // ioctl TIOCSTI / TIOCLINUX / TIOCSETD, compared on the low 32 bits of the command.
    a.place(ioctl);
    a.load(arg_lo(1));
    a.jeq(libc::TIOCSTI as u32, To::At(refuse), To::Next);
    a.jeq(libc::TIOCSETD as u32, To::At(refuse), To::Next);
    a.jeq(libc::TIOCLINUX as u32, To::At(refuse), To::At(allow));
    // socket and socketpair: only unix, inet, inet6 (socketpair runs the family's own socket
    // creation before it finds out the family has no pairs). Watching, an allowed family goes to
    // the supervisor too, which tells it from a refused one by the same register.
    a.place(family);
    a.load(arg_lo(0));
    let made = if watch_net { refuse } else { allow };
    for (i, f) in FAMILIES.into_iter().enumerate() {
        let other = if i + 1 == FAMILIES.len() {
            To::At(refuse)
        } else {
            To::Next
        };
        a.jeq(f as u32, To::At(made), other);
    }
    // RLIMIT_CORE stays at CORE_LIMIT: a payload that lowers it to 0 would have its crashes piped
    // to the host's core helper. setrlimit(RLIMIT_CORE) and prlimit64(pid, RLIMIT_CORE, new, NULL)
    // return 0 and change nothing: programs that turn core dumps off (gpg, sudo) get what they
    // asked for, since 1 writes no core either; raising the limit is useless here anyway. A
    // prlimit64 that also asks for the old limit is refused: skipping it would leave that unwritten.
    // Reading the limit (no new value) goes through. The resource is an `unsigned int`: its low
    // 32 bits; the pointers are compared whole.
    a.place(setrlimit);
    a.load(arg_lo(0));
    a.jeq(libc::RLIMIT_CORE, To::At(unchanged), To::At(allow));
    a.place(prlimit);
    a.load(arg_lo(1));
    a.jeq(libc::RLIMIT_CORE, To::Next, To::At(allow));
    a.load(arg_lo(2));
    a.jeq(0, To::Next, To::At(core_set));
    a.load(arg_hi(2));
    a.jeq(0, To::At(allow), To::Next);
    a.place(core_set);
    a.load(arg_lo(3));
    a.jeq(0, To::Next, To::At(refuse));
    a.load(arg_hi(3));
    a.jeq(0, To::At(unchanged), To::At(refuse));
    // No set-uid/set-gid bit on any file the payload creates or changes.
    for &(arg, l) in &mode_checks {
        a.place(l);
        a.load(arg_lo(arg));
        a.jset(SETID_BITS, To::At(refuse), To::At(allow));
    }

    a.place(unchanged);
    a.ret(RET_ERRNO); // errno 0: the call does not run and returns 0
    a.place(enosys);
    a.ret(RET_ERRNO | libc::ENOSYS as u32);
    a.place(allow);
    a.ret(RET_ALLOW);
    a.place(refuse);
    a.ret(RET_USER_NOTIF);
    a.finish()
}

/// System calls that take a file mode, and the index of that argument.
fn mode_args() -> Vec<(i64, u32)> {
    let mut v = vec![
        (libc::SYS_fchmod, 1),
        (libc::SYS_fchmodat, 2),
        (452, 2), // fchmodat2, the same number on every architecture
        (libc::SYS_openat, 3),
        (libc::SYS_mknodat, 2),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_chmod, 1),
        (libc::SYS_open, 2),
        (libc::SYS_creat, 1),
        (libc::SYS_mknod, 1),
    ]);
    v
}

/// How the supervisor answers a refused call the filter sent it: a name for the report, and the
/// errno the call fails with — `EAFNOSUPPORT` for a socket family (`socket` or `socketpair`),
/// `EPERM` for everything else, as the module table says. Classified the same way the filter is built.
pub fn answer(nr: i32, arch: u32, args: &[u64; 6]) -> (String, i32) {
    let eperm = |n: &str| (n.to_owned(), libc::EPERM);
    if arch != AUDIT_ARCH {
        return eperm("foreign-abi");
    }
    if cfg!(target_arch = "x86_64") && nr as u32 >= X32_BIT {
        return eperm("x32-abi");
    }
    let nr = nr as i64;
    if let Some((name, _)) = denied().into_iter().find(|&(_, n)| n == nr) {
        return eperm(name);
    }
    match nr {
        libc::SYS_clone => eperm("clone (namespace flags)"),
        libc::SYS_ioctl if args[1] as u32 == libc::TIOCSTI as u32 => eperm("ioctl TIOCSTI"),
        libc::SYS_ioctl if args[1] as u32 == libc::TIOCSETD as u32 => eperm("ioctl TIOCSETD"),
        libc::SYS_ioctl => eperm("ioctl TIOCLINUX"),
        libc::SYS_socket => (
            format!("socket ({})", family_name(args[0] as u32)),
            libc::EAFNOSUPPORT,
        ),
        libc::SYS_prlimit64 => eperm("prlimit64 RLIMIT_CORE"),
        libc::SYS_socketpair => (
            format!("socketpair ({})", family_name(args[0] as u32)),
            libc::EAFNOSUPPORT,
        ),
        _ => match mode_args().into_iter().find(|&(n, _)| n == nr) {
            Some(_) => eperm("set-uid/set-gid file mode"),
            None => (format!("syscall {nr}"), libc::EPERM),
        },
    }
}

/// A socket family's name for the report.
fn family_name(family: u32) -> String {
    let name = match family as i32 {
        libc::AF_NETLINK => "netlink",
        libc::AF_PACKET => "packet",
        libc::AF_VSOCK => "vsock",
        libc::AF_XDP => "xdp",
        libc::AF_KEY => "key",
        libc::AF_ALG => "alg",
        libc::AF_BLUETOOTH => "bluetooth",
        libc::AF_CAN => "can",
        libc::AF_TIPC => "tipc",
        libc::AF_RDS => "rds",
        _ => return format!("family {family}"),
    };
    name.to_owned()
}

#[cfg(test)]
// `libc`'s ioctl request type differs between targets (u64 with glibc, i32 with musl).
#[allow(clippy::unnecessary_cast)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter for the instructions the filter uses, to check decisions
    /// without a kernel.
    fn run(p: &[SockFilter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        run_counted(p, nr, arch, args).0
    }

    /// [`run`], with the number of instructions it took.
    fn run_counted(p: &[SockFilter], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
        let data = |off: u32| -> u32 {
            match off {
                OFF_NR => nr,
                OFF_ARCH => arch,
                o if o >= 16 => {
                    let i = ((o - 16) / 8) as usize;
                    if (o - 16) % 8 == 0 {
                        args[i] as u32
                    } else {
                        (args[i] >> 32) as u32
                    }
                }
                _ => panic!("unexpected load at {off}"),
            }
        };
        let (mut pc, mut a) = (0usize, 0u32);
        let mut steps = 0;
        loop {
            let i = p[pc];
            steps += 1;
            match i.code {
                BPF_LD_W_ABS => a = data(i.k),
                BPF_RET_K => return (i.k, steps),
                BPF_JEQ_K => pc += if a == i.k { i.jt } else { i.jf } as usize,
                BPF_JGE_K => pc += if a >= i.k { i.jt } else { i.jf } as usize,
                BPF_JSET_K => pc += if a & i.k != 0 { i.jt } else { i.jf } as usize,
                c => panic!("unknown instruction {c:#x}"),
            }
            pc += 1;
        }
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    /// The filter's verdict, with a call it hands to the supervisor answered as the supervisor
    /// does (`answer`): so each check covers both halves of a refusal.
    fn decide(p: &[SockFilter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        match run(p, nr, arch, args) {
            RET_USER_NOTIF if watched(nr as i32, arch, &args).is_some() => RET_ALLOW,
            RET_USER_NOTIF => RET_ERRNO | answer(nr as i32, arch, &args).1 as u32,
            v => v,
        }
    }

    #[test]
    fn labels_resolve_to_forward_offsets() {
        let mut a = Asm::default();
        let (yes, no) = (a.label(), a.label());
        a.load(OFF_NR);
        a.jeq(7, To::At(yes), To::Next);
        a.jeq(8, To::Next, To::At(no));
        a.ret(1);
        a.place(yes);
        a.ret(2);
        a.place(no);
        a.ret(3);
        let p = a.finish();
        assert_eq!((p[1].jt, p[1].jf), (2, 0));
        assert_eq!((p[2].jt, p[2].jf), (0, 2));
        assert_eq!(run(&p, 7, 0, [0; 6]), 2);
        assert_eq!(run(&p, 8, 0, [0; 6]), 1);
        assert_eq!(run(&p, 9, 0, [0; 6]), 3);
    }

    #[test]
    #[should_panic(expected = "longer than 255")]
    fn a_jump_beyond_255_is_refused() {
        let mut a = Asm::default();
        let far = a.label();
        a.jeq(0, To::At(far), To::Next);
        for _ in 0..256 {
            a.load(OFF_NR);
        }
        a.place(far);
        a.ret(RET_ALLOW);
        a.finish();
    }

    #[test]
    #[should_panic(expected = "not forward")]
    fn a_backward_jump_is_refused() {
        let mut a = Asm::default();
        let back = a.label();
        a.place(back);
        a.load(OFF_NR);
        a.jeq(0, To::At(back), To::Next);
        a.ret(RET_ALLOW);
        a.finish();
    }

    #[test]
    #[should_panic(expected = "must return")]
    fn a_program_that_can_run_off_its_end_is_refused() {
        let mut a = Asm::default();
        a.load(OFF_NR);
        a.finish();
    }

    #[test]
    fn refusals_are_named_for_the_report() {
        let z = [0u64; 6];
        assert_eq!(answer(libc::SYS_ptrace as i32, AUDIT_ARCH, &z).0, "ptrace");
        assert_eq!(
            answer(libc::SYS_add_key as i32, AUDIT_ARCH, &z).0,
            "add_key"
        );
        let mut a = z;
        a[0] = libc::AF_NETLINK as u64;
        assert_eq!(
            answer(libc::SYS_socket as i32, AUDIT_ARCH, &a),
            ("socket (netlink)".to_owned(), libc::EAFNOSUPPORT)
        );
        a[1] = libc::TIOCSTI as u64 | 0xdead_0000_0000;
        assert_eq!(
            answer(libc::SYS_ioctl as i32, AUDIT_ARCH, &a).0,
            "ioctl TIOCSTI"
        );
        a[1] = libc::TIOCSETD as u64 | 0xdead_0000_0000;
        assert_eq!(
            answer(libc::SYS_ioctl as i32, AUDIT_ARCH, &a).0,
            "ioctl TIOCSETD"
        );
        assert_eq!(answer(3, 0x4000_0003, &z).0, "foreign-abi");
    }

    /// The other ABIs a process of this architecture can call the kernel through, each with its
    /// own numbers for `socket` and `socketpair`: every call there is refused, whatever the
    /// arguments, so no check below the architecture test has to hold for them.
    fn foreign_abis() -> Vec<(&'static str, u32, u32, u32)> {
        // (name, audit arch, socket, socketpair)
        if cfg!(target_arch = "x86_64") {
            vec![
                ("i386", 0x4000_0003, 359, 360),
                ("i386 socketcall", 0x4000_0003, 102, 102),
                ("x32", AUDIT_ARCH, 41 | X32_BIT, 53 | X32_BIT),
            ]
        } else {
            vec![("arm", 0x4000_0028, 281, 288)]
        }
    }

    /// Every family value a payload can pass (all the kernel knows, unknown ones, and values
    /// whose high bits the kernel drops, since `family` is an `int`).
    fn families() -> Vec<u64> {
        let mut v: Vec<u64> = (0..=64).collect();
        v.extend([0xffff, 0x7fff_ffff, 0xffff_ffff, u64::MAX]);
        v.extend(FAMILIES.map(|f| (1u64 << 32) | f as u64));
        v.extend(FAMILIES.map(|f| (0xdead_beefu64 << 32) | f as u64));
        v
    }

    #[test]
    fn socket_and_socketpair_create_only_unix_inet_inet6_on_every_abi() {
        const EAFNOSUPPORT: u32 = RET_ERRNO | libc::EAFNOSUPPORT as u32;
        for (allow_ptrace, watch_net) in [(false, false), (true, false), (false, true)] {
            let p = program_with(allow_ptrace, watch_net);
            for (call, nr) in [
                ("socket", libc::SYS_socket),
                ("socketpair", libc::SYS_socketpair),
            ] {
                for family in families() {
                    let args = [family, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
                    let got = decide(&p, nr as u32, AUDIT_ARCH, args);
                    if FAMILIES.contains(&(family as u32 as i32)) {
                        assert_eq!(got, RET_ALLOW, "{call} family {family:#x}");
                        // Watching, an allowed family reaches the supervisor (which notes the
                        // socket, then lets it be made); otherwise the filter allows it alone.
                        let seen = run(&p, nr as u32, AUDIT_ARCH, args) == RET_USER_NOTIF;
                        assert_eq!(seen, watch_net, "{call} family {family:#x}");
                        assert_eq!(
                            watched(nr as i32, AUDIT_ARCH, &args),
                            Some(Watched::Socket),
                            "{call} family {family:#x}"
                        );
                    } else {
                        assert_eq!(got, EAFNOSUPPORT, "{call} family {family:#x}");
                        let (name, _) = answer(nr as i32, AUDIT_ARCH, &args);
                        assert!(name.starts_with(&format!("{call} (")), "{name}");
                    }
                }
                for (abi, arch, socket, socketpair) in foreign_abis() {
                    let nr = if call == "socket" { socket } else { socketpair };
                    for family in families() {
                        let args = [family, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
                        assert_eq!(
                            decide(&p, nr, arch, args),
                            EPERM,
                            "{abi} {call} family {family:#x}"
                        );
                    }
                }
            }
        }
        let name =
            |nr: i64, family: i32| answer(nr as i32, AUDIT_ARCH, &[family as u64, 0, 0, 0, 0, 0]).0;
        assert_eq!(
            name(libc::SYS_socketpair, libc::AF_NETLINK),
            "socketpair (netlink)"
        );
        assert_eq!(
            name(libc::SYS_socketpair, libc::AF_PACKET),
            "socketpair (packet)"
        );
        assert_eq!(
            name(libc::SYS_socketpair, libc::AF_VSOCK),
            "socketpair (vsock)"
        );
        assert_eq!(name(libc::SYS_socketpair, libc::AF_XDP), "socketpair (xdp)");
        assert_eq!(name(libc::SYS_socket, 46), "socket (family 46)");
    }

    /// The calls added to the table since the list was written (up to Linux 6.18, whose last is
    /// 469), each decided: refused where the module table's reasons apply, allowed otherwise
    /// (docs/layers/seccomp.md says why for each).
    #[test]
    fn the_newer_calls_are_decided_one_by_one() {
        let p = program(false);
        let refused = [
            ("open_tree_attr", 467),
            ("fanotify_init", libc::SYS_fanotify_init),
            ("lsm_set_self_attr", 460),
            ("memfd_secret", libc::SYS_memfd_secret),
            ("io_setup", libc::SYS_io_setup),
        ];
        for (name, nr) in refused {
            assert_eq!(decide(&p, nr as u32, AUDIT_ARCH, [0; 6]), EPERM, "{name}");
            assert_eq!(answer(nr as i32, AUDIT_ARCH, &[0; 6]).0, name);
            for (abi, arch, ..) in foreign_abis() {
                let nr = if abi == "x32" {
                    nr as u32 | X32_BIT
                } else {
                    nr as u32
                };
                assert_eq!(decide(&p, nr, arch, [0; 6]), EPERM, "{abi} {name}");
            }
        }
        let allowed = [
            ("pidfd_getfd", libc::SYS_pidfd_getfd),
            ("process_madvise", libc::SYS_process_madvise),
            ("process_mrelease", libc::SYS_process_mrelease),
            ("cachestat", 451),
            ("map_shadow_stack", 453),
            ("futex_waitv", libc::SYS_futex_waitv),
            ("set_mempolicy_home_node", libc::SYS_set_mempolicy_home_node),
            ("futex_wake", 454),
            ("futex_wait", 455),
            ("futex_requeue", 456),
            ("statmount", 457),
            ("listmount", 458),
            ("lsm_get_self_attr", 459),
            ("lsm_list_modules", 461),
            ("mseal", libc::SYS_mseal),
            ("setxattrat", 463),
            ("getxattrat", 464),
            ("listxattrat", 465),
            ("removexattrat", 466),
            ("file_getattr", 468),
            ("file_setattr", 469),
        ];
        for (name, nr) in allowed {
            assert_eq!(
                decide(&p, nr as u32, AUDIT_ARCH, [0; 6]),
                RET_ALLOW,
                "{name}"
            );
        }
    }

    /// RLIMIT_CORE stays at CORE_LIMIT: changes return 0 and change nothing, a change that also
    /// reads the old limit is refused, reads and other resources go through; on every ABI.
    #[test]
    fn the_core_limit_cannot_be_changed() {
        const UNCHANGED: u32 = RET_ERRNO; // errno 0: not run, returns 0
        let core = libc::RLIMIT_CORE as u64;
        let ptr = 0x7ffd_1234_5678u64;
        let high_only = 0x7ffd_0000_0000u64; // a pointer whose low half is 0
        for p in [program(false), program(true)] {
            let setrlimit = |res: u64| {
                decide(
                    &p,
                    libc::SYS_setrlimit as u32,
                    AUDIT_ARCH,
                    [res, ptr, 0, 0, 0, 0],
                )
            };
            assert_eq!(setrlimit(core), UNCHANGED);
            // The kernel reads the resource as an unsigned int: high bits do not hide it.
            assert_eq!(setrlimit((1 << 32) | core), UNCHANGED);
            assert_eq!(setrlimit(libc::RLIMIT_NOFILE as u64), RET_ALLOW);
            let prlimit = |pid: u64, res: u64, new: u64, old: u64| {
                decide(
                    &p,
                    libc::SYS_prlimit64 as u32,
                    AUDIT_ARCH,
                    [pid, res, new, old, 0, 0],
                )
            };
            for pid in [0, 1, 2, u64::MAX] {
                assert_eq!(prlimit(pid, core, ptr, 0), UNCHANGED);
                assert_eq!(prlimit(pid, core, high_only, 0), UNCHANGED);
                assert_eq!(prlimit(pid, (7 << 32) | core, ptr, 0), UNCHANGED);
                assert_eq!(prlimit(pid, core, ptr, ptr), EPERM);
                assert_eq!(prlimit(pid, core, ptr, high_only), EPERM);
                assert_eq!(prlimit(pid, core, high_only, high_only), EPERM);
                // Reading it goes through.
                assert_eq!(prlimit(pid, core, 0, ptr), RET_ALLOW);
                assert_eq!(
                    prlimit(pid, libc::RLIMIT_NOFILE as u64, ptr, ptr),
                    RET_ALLOW
                );
            }
            for (abi, arch, ..) in foreign_abis() {
                // i386 setrlimit, prlimit64; x32 setrlimit, prlimit64.
                let nrs: [u32; 2] = if abi == "x32" {
                    [160 | X32_BIT, 302 | X32_BIT]
                } else if cfg!(target_arch = "x86_64") {
                    [75, 340]
                } else {
                    [75, 369]
                };
                for nr in nrs {
                    assert_eq!(
                        decide(&p, nr, arch, [core, ptr, ptr, 0, 0, 0]),
                        EPERM,
                        "{abi} {nr}"
                    );
                    assert_eq!(
                        decide(&p, nr, arch, [0, core, ptr, 0, 0, 0]),
                        EPERM,
                        "{abi} {nr}"
                    );
                }
            }
        }
        assert_eq!(
            answer(
                libc::SYS_prlimit64 as i32,
                AUDIT_ARCH,
                &[0, core, 1, 1, 0, 0]
            ),
            ("prlimit64 RLIMIT_CORE".to_owned(), libc::EPERM)
        );
    }

    /// Another ABI, or an x32 number, is refused for every number, before any number is looked at.
    #[test]
    fn every_call_of_another_abi_is_refused() {
        let p = program(true);
        for (abi, arch, ..) in foreign_abis() {
            let x32 = if abi == "x32" { X32_BIT } else { 0 };
            for nr in (0..1024).chain([0x3fff_ffff, 0xffff_ffff]) {
                let nr = nr | x32;
                assert_eq!(decide(&p, nr, arch, [0; 6]), EPERM, "{abi} {nr:#x}");
                let name = answer(nr as i32, arch, &[0; 6]).0;
                assert!(
                    name == "foreign-abi" || name == "x32-abi",
                    "{abi} {nr:#x}: {name}"
                );
            }
        }
    }

    #[test]
    fn decisions() {
        let p = program(false);
        let call = |nr: i64, args: [u64; 6]| decide(&p, nr as u32, AUDIT_ARCH, args);
        // --allow-ptrace lets exactly the tracing calls through.
        let traced = program(true);
        for nr in TRACING {
            assert_eq!(call(nr, [0; 6]), EPERM);
            assert_eq!(decide(&traced, nr as u32, AUDIT_ARCH, [0; 6]), RET_ALLOW);
        }
        assert_eq!(
            decide(&traced, libc::SYS_bpf as u32, AUDIT_ARCH, [0; 6]),
            EPERM
        );
        assert_eq!(call(libc::SYS_read, [0; 6]), RET_ALLOW);
        // Landlock can only narrow what the payload may do: a payload may sandbox itself.
        for nr in [
            libc::SYS_landlock_create_ruleset,
            libc::SYS_landlock_add_rule,
            libc::SYS_landlock_restrict_self,
        ] {
            assert_eq!(call(nr, [0; 6]), RET_ALLOW);
        }
        assert_eq!(call(libc::SYS_io_uring_setup, [0; 6]), EPERM);
        assert_eq!(call(libc::SYS_unshare, [0; 6]), EPERM);
        assert_eq!(
            call(libc::SYS_clone3, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        assert_eq!(
            call(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(
                libc::SYS_clone,
                [(libc::CLONE_NEWUSER | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0]
            ),
            EPERM
        );
        assert_eq!(
            call(libc::SYS_ioctl, [0, libc::TIOCSTI as u64, 0, 0, 0, 0]),
            EPERM
        );
        // The high 32 bits of the command do not matter (CVE-2019-10063).
        assert_eq!(
            call(
                libc::SYS_ioctl,
                [0, (1u64 << 32) | libc::TIOCSTI as u64, 0, 0, 0, 0]
            ),
            EPERM
        );
        for high in [0, 1u64 << 32] {
            assert_eq!(
                call(
                    libc::SYS_ioctl,
                    [0, high | libc::TIOCSETD as u64, 0, 0, 0, 0]
                ),
                EPERM
            );
        }
        // Reading the line discipline is harmless.
        assert_eq!(
            call(libc::SYS_ioctl, [0, libc::TIOCGETD as u64, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_ioctl, [0, libc::TIOCGWINSZ as u64, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_NETLINK as u64, 3, 0, 0, 0, 0]),
            RET_ERRNO | libc::EAFNOSUPPORT as u32
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_PACKET as u64, 3, 0, 0, 0, 0]),
            RET_ERRNO | libc::EAFNOSUPPORT as u32
        );
        // Set-uid and set-gid bits never reach a file; ordinary modes do.
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o4755, 0, 0, 0]), EPERM);
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o2755, 0, 0, 0]), EPERM);
        assert_eq!(call(libc::SYS_fchmodat, [0, 0, 0o755, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(libc::SYS_fchmod, [3, 0o4711, 0, 0, 0, 0]), EPERM);
        assert_eq!(call(452, [0, 0, 0o6755, 0, 0, 0]), EPERM);
        assert_eq!(
            call(libc::SYS_openat, [0, 0, libc::O_CREAT as u64, 0o4755, 0, 0]),
            EPERM
        );
        assert_eq!(
            call(libc::SYS_openat, [0, 0, libc::O_CREAT as u64, 0o644, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(call(libc::SYS_mknodat, [0, 0, 0o104755, 0, 0, 0]), EPERM);
        assert_eq!(
            call(libc::SYS_openat2, [0; 6]),
            RET_ERRNO | libc::ENOSYS as u32
        );
        if cfg!(target_arch = "x86_64") {
            assert_eq!(call(libc::SYS_chmod, [0, 0o4755, 0, 0, 0, 0]), EPERM);
            assert_eq!(
                call(libc::SYS_open, [0, libc::O_CREAT as u64, 0o2755, 0, 0, 0]),
                EPERM
            );
            assert_eq!(call(libc::SYS_creat, [0, 0o4755, 0, 0, 0, 0]), EPERM);
        }
        // Another ABI, or an x32 number, is refused before any number is looked at.
        assert_eq!(
            decide(&p, libc::SYS_read as u32, 0x4000_0003, [0; 6]),
            EPERM
        );
        if cfg!(target_arch = "x86_64") {
            assert_eq!(call(libc::SYS_read | 0x4000_0000, [0; 6]), EPERM);
        }
    }

    /// Every number of the table (and beyond it) gets its own answer and no other: a number with
    /// nothing to check is allowed whatever its arguments (arguments with every bit set would trip
    /// any argument check it was wrongly sent to), a refused one is refused; in every variant.
    #[test]
    fn every_number_gets_its_own_answer() {
        let special = [
            libc::SYS_clone3,
            libc::SYS_openat2,
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_setrlimit,
            libc::SYS_prlimit64,
            libc::SYS_connect,
        ];
        for (allow_ptrace, watch_net) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let p = program_with(allow_ptrace, watch_net);
            let refused: Vec<u32> = refused(allow_ptrace)
                .iter()
                .map(|&(_, nr)| nr as u32)
                .collect();
            let modes: Vec<u32> = mode_args().iter().map(|&(nr, _)| nr as u32).collect();
            for nr in (0..2048u32).chain([X32_BIT - 1, u32::MAX >> 2]) {
                if special.contains(&(nr as i64)) {
                    continue;
                }
                let want = if refused.contains(&nr) {
                    EPERM
                } else {
                    RET_ALLOW
                };
                // A call that takes a mode gets every bit but the set-id ones: allowed.
                let all = if modes.contains(&nr) {
                    !(SETID_BITS as u64)
                } else {
                    u64::MAX
                };
                for args in [[0; 6], [all; 6]] {
                    assert_eq!(
                        decide(&p, nr, AUDIT_ARCH, args),
                        want,
                        "{nr} {allow_ptrace} {watch_net}"
                    );
                }
            }
            // connect is the supervisor's to see only when watching; allowed either way.
            let connect = run(&p, libc::SYS_connect as u32, AUDIT_ARCH, [0; 6]);
            let expected = if watch_net { RET_USER_NOTIF } else { RET_ALLOW };
            assert_eq!(connect, expected);
        }
    }

    /// The kernel runs the whole program once for each number of the table when a filter is
    /// installed (its cache of numbers allowed whatever the arguments), and the JIT-compiled
    /// program at every call it has to look at: a number is decided in a few instructions, not
    /// after a comparison with every number in the list (which took 60 and more, and cost each
    /// run ~0.1 ms at its install).
    #[test]
    fn a_number_is_decided_in_few_instructions() {
        for (allow_ptrace, watch_net) in [(false, false), (true, true)] {
            let p = program_with(allow_ptrace, watch_net);
            let worst = (0..1024u32)
                .map(|nr| run_counted(&p, nr, AUDIT_ARCH, [0; 6]).1)
                .max()
                .unwrap();
            assert!(worst <= 18, "a number took {worst} instructions");
        }
    }
}
