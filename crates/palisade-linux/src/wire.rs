//! The engine's wire format: a [`Plan`] and its descriptors, written by the supervisor and read by
//! palisade's own init program after `execve` (see `engine`), or sent to a template's zygote.
//!
//! Hand-written, little-endian, versioned: a message starts with [`MAGIC`] and [`VERSION`], and a
//! reader refuses any other (an init program from another palisade build must not guess at a
//! layout). The reader trusts nothing: every count and length is checked against what is left of
//! the message and against a ceiling, every index against the table it indexes, every string for
//! NUL bytes, and a message that does not end exactly where its last field does is refused. What
//! the init does with a well-formed plan is the same as the in-process engine does with the plan
//! it built itself.
//!
//! Not sent: the plan's protection record (the supervisor's own bookkeeping), the payload's stack
//! and the pointer arrays of [`Exec`] (rebuilt on the reading side), and source descriptors other
//! than detached trees (opened by the reader).

use crate::child::ChildFds;
use crate::landlock::{LandlockPlan, Rule, Ruleset};
use crate::plan::{Exec, Ids, Op, Plan, RunPart, SockRole, SockSpec, Source};
use crate::seccomp::SockFilter;
use libc::c_int;
use std::ffi::CString;

/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"PLSD";
/// Layout version; bumped with any change to what is written.
pub const VERSION: u32 = 3;
/// The largest message either side accepts.
pub const MAX_MESSAGE: usize = 8 << 20;
/// Most elements of any list (sources, operations, rules, arguments…).
const MAX_ITEMS: usize = 1 << 16;
/// Most instructions of a classic BPF program (the kernel's `BPF_MAXINSNS`).
const MAX_BPF: usize = 4096;
/// Resource numbers run below this (`RLIM_NLIMITS` on Linux).
const RLIMITS: u32 = 16;

/// A malformed message: what was being read when it went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed engine message ({})", self.0)
    }
}

impl std::error::Error for WireError {}

type R<T> = Result<T, WireError>;

/// Appends fields to a message.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A message of `kind`, after the magic and the version.
    pub fn new(kind: u8) -> Writer {
        let mut w = Writer::default();
        w.buf.extend_from_slice(&MAGIC);
        w.u32(VERSION);
        w.u8(kind);
        w
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A count or an index (the reader takes at most 65,536 elements in a list).
    pub fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.buf.extend_from_slice(b);
    }
    pub fn cstr(&mut self, s: &std::ffi::CStr) {
        self.bytes(s.to_bytes());
    }
    pub fn cstrs(&mut self, v: &[CString]) {
        self.len(v.len());
        v.iter().for_each(|s| self.cstr(s));
    }
    /// The message, with its length in front (what goes on a stream).
    pub fn framed(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len() + 4);
        out.extend_from_slice(&(self.buf.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.buf);
        out
    }
    /// The message as it is (what goes in one datagram).
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads fields of a message in the order they were written.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Checks the magic and the version and returns the message's kind with a reader after it.
    pub fn new(buf: &'a [u8]) -> R<(u8, Reader<'a>)> {
        if buf.len() > MAX_MESSAGE {
            return Err(WireError("longer than the largest message"));
        }
        let mut r = Reader { buf, pos: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err(WireError("not a palisade engine message"));
        }
        if r.u32("version")? != VERSION {
            return Err(WireError(
                "another layout version (the init program is from another palisade build)",
            ));
        }
        let kind = r.u8("kind")?;
        Ok((kind, r))
    }
    fn take(&mut self, n: usize, what: &'static str) -> R<&'a [u8]> {
        if self.buf.len() - self.pos < n {
            return Err(WireError(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> R<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub fn bool(&mut self, what: &'static str) -> R<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(WireError(what)),
        }
    }
    pub fn u16(&mut self, what: &'static str) -> R<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &'static str) -> R<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn i32(&mut self, what: &'static str) -> R<i32> {
        Ok(self.u32(what)? as i32)
    }
    pub fn u64(&mut self, what: &'static str) -> R<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A count of elements of at least `min_size` bytes each, at most `max`: never more than what
    /// is left of the message could hold.
    pub fn count(&mut self, max: usize, min_size: usize, what: &'static str) -> R<usize> {
        let n = self.u32(what)? as usize;
        if n > max || n.saturating_mul(min_size.max(1)) > self.buf.len() - self.pos {
            return Err(WireError(what));
        }
        Ok(n)
    }
    /// An index below `bound`.
    pub fn index(&mut self, bound: usize, what: &'static str) -> R<usize> {
        let i = self.u32(what)? as usize;
        if i >= bound {
            return Err(WireError(what));
        }
        Ok(i)
    }
    pub fn bytes(&mut self, what: &'static str) -> R<&'a [u8]> {
        let n = self.count(MAX_MESSAGE, 1, what)?;
        self.take(n, what)
    }
    pub fn cstr(&mut self, what: &'static str) -> R<CString> {
        CString::new(self.bytes(what)?).map_err(|_| WireError(what))
    }
    pub fn cstrs(&mut self, what: &'static str) -> R<Vec<CString>> {
        let n = self.count(MAX_ITEMS, 4, what)?;
        (0..n).map(|_| self.cstr(what)).collect()
    }
    pub fn string(&mut self, what: &'static str) -> R<String> {
        String::from_utf8(self.bytes(what)?.to_vec()).map_err(|_| WireError(what))
    }
    /// The end: a message with bytes past its last field is refused.
    pub fn finish(self) -> R<()> {
        if self.pos != self.buf.len() {
            return Err(WireError("bytes after the last field"));
        }
        Ok(())
    }
}

/// Writes the descriptors an init works with (their numbers, valid in the receiving process).
pub fn write_fds(w: &mut Writer, fds: &ChildFds) {
    fds.stdio.iter().for_each(|&f| w.i32(f));
    w.i32(fds.msg);
    w.i32(fds.go);
    w.i32(fds.pty_sock);
    w.i32(fds.files);
    w.len(fds.keep.len());
    fds.keep.iter().for_each(|&f| w.i32(f));
}

/// Reads what [`write_fds`] wrote. Every number is a descriptor (≥ 0, or -1 for the pty socket),
/// and the list of descriptors to keep is sorted, as `child::init` needs it.
pub fn read_fds(r: &mut Reader<'_>) -> R<ChildFds> {
    let fd = |r: &mut Reader<'_>, what| -> R<c_int> {
        let v = r.i32(what)?;
        if v < 0 {
            return Err(WireError(what));
        }
        Ok(v)
    };
    let stdio = [fd(r, "stdin")?, fd(r, "stdout")?, fd(r, "stderr")?];
    let msg = fd(r, "message pipe")?;
    let go = fd(r, "control socket")?;
    let pty_sock = r.i32("pty socket")?;
    if pty_sock < -1 {
        return Err(WireError("pty socket"));
    }
    let files = r.i32("files")?;
    if files < -1 {
        return Err(WireError("files"));
    }
    let n = r.count(1024, 4, "descriptors kept")?;
    let keep = (0..n)
        .map(|_| fd(r, "descriptors kept"))
        .collect::<R<Vec<c_int>>>()?;
    if keep.windows(2).any(|p| p[0] >= p[1]) || keep.first().is_some_and(|&f| f < 3) {
        return Err(WireError("descriptors kept (sorted, each above 2)"));
    }
    Ok(ChildFds {
        stdio,
        msg,
        go,
        pty_sock,
        files,
        keep,
    })
}

fn write_op(w: &mut Writer, op: &Op) {
    // One tag per kind; a new kind of operation gets a new tag (and VERSION goes up).
    match op {
        Op::Mkdir { path, mode } => {
            w.u8(1);
            w.cstr(path);
            w.u32(*mode);
        }
        Op::Touch { path } => {
            w.u8(2);
            w.cstr(path);
        }
        Op::Symlink { target, path } => {
            w.u8(3);
            w.cstr(target);
            w.cstr(path);
        }
        Op::Write { path, data } => {
            w.u8(4);
            w.cstr(path);
            w.bytes(data);
        }
        Op::Tmpfs { path, flags, data } => {
            w.u8(5);
            w.cstr(path);
            w.u64(*flags);
            w.cstr(data);
        }
        Op::Proc { path } => {
            w.u8(6);
            w.cstr(path);
        }
        Op::Devpts { path } => {
            w.u8(7);
            w.cstr(path);
        }
        Op::Bind {
            source,
            path,
            attrs,
        } => {
            w.u8(8);
            w.len(*source);
            w.cstr(path);
            w.u64(*attrs);
        }
        Op::ReadOnly { path, optional } => {
            w.u8(9);
            w.cstr(path);
            w.bool(*optional);
        }
        Op::UserNsLimits => w.u8(10),
        Op::Overlay { path, data } => {
            w.u8(11);
            w.cstr(path);
            w.cstr(data);
        }
        Op::UserXattr { path } => {
            w.u8(12);
            w.cstr(path);
        }
        Op::SendDir { path, tag } => {
            w.u8(13);
            w.cstr(path);
            w.u8(*tag);
        }
        Op::Detach { path } => {
            w.u8(14);
            w.cstr(path);
        }
        Op::Rmdir { path } => {
            w.u8(15);
            w.cstr(path);
        }
        Op::BindFile { from, path } => {
            w.u8(16);
            w.cstr(from);
            w.cstr(path);
        }
    }
}

fn read_op(r: &mut Reader<'_>, sources: usize) -> R<Op> {
    Ok(match r.u8("operation")? {
        1 => Op::Mkdir {
            path: r.cstr("mkdir path")?,
            mode: r.u32("mkdir mode")?,
        },
        2 => Op::Touch {
            path: r.cstr("touch path")?,
        },
        3 => Op::Symlink {
            target: r.cstr("symlink target")?,
            path: r.cstr("symlink path")?,
        },
        4 => Op::Write {
            path: r.cstr("write path")?,
            data: r.bytes("write data")?.to_vec(),
        },
        5 => Op::Tmpfs {
            path: r.cstr("tmpfs path")?,
            flags: r.u64("tmpfs flags")?,
            data: r.cstr("tmpfs options")?,
        },
        6 => Op::Proc {
            path: r.cstr("proc path")?,
        },
        7 => Op::Devpts {
            path: r.cstr("devpts path")?,
        },
        8 => Op::Bind {
            source: r.index(sources, "bind source")?,
            path: r.cstr("bind path")?,
            attrs: r.u64("bind attributes")?,
        },
        9 => Op::ReadOnly {
            path: r.cstr("read-only path")?,
            optional: r.bool("read-only optional")?,
        },
        10 => Op::UserNsLimits,
        11 => Op::Overlay {
            path: r.cstr("overlay path")?,
            data: r.cstr("overlay options")?,
        },
        12 => Op::UserXattr {
            path: r.cstr("xattr check path")?,
        },
        13 => Op::SendDir {
            path: r.cstr("sent directory path")?,
            tag: r.u8("sent directory tag")?,
        },
        14 => Op::Detach {
            path: r.cstr("detach path")?,
        },
        15 => Op::Rmdir {
            path: r.cstr("rmdir path")?,
        },
        16 => Op::BindFile {
            from: r.cstr("bound file source")?,
            path: r.cstr("bound file path")?,
        },
        _ => return Err(WireError("operation")),
    })
}

fn write_ruleset(w: &mut Writer, rs: &Ruleset) {
    w.u32(rs.abi);
    w.u64(rs.handled_fs);
    w.u64(rs.handled_net);
    w.u64(rs.scoped);
    w.len(rs.rules.len());
    for rule in &rs.rules {
        w.cstr(&rule.path);
        w.u64(rule.access);
        w.bool(rule.optional);
    }
    w.len(rs.ports.len());
    for &(port, access) in &rs.ports {
        w.u16(port);
        w.u64(access);
    }
    match &rs.debug_unlandlocked {
        Some(p) => {
            w.bool(true);
            w.bytes(p.as_bytes());
        }
        None => w.bool(false),
    }
}

fn read_ruleset(r: &mut Reader<'_>) -> R<Ruleset> {
    let abi = r.u32("landlock abi")?;
    let handled_fs = r.u64("landlock handled")?;
    let handled_net = r.u64("landlock handled")?;
    let scoped = r.u64("landlock scopes")?;
    let n = r.count(MAX_ITEMS, 13, "landlock rules")?;
    let rules = (0..n)
        .map(|_| {
            Ok(Rule {
                path: r.cstr("landlock rule path")?,
                access: r.u64("landlock rule access")?,
                optional: r.bool("landlock rule optional")?,
            })
        })
        .collect::<R<Vec<Rule>>>()?;
    let n = r.count(65536, 10, "landlock ports")?;
    let ports = (0..n)
        .map(|_| Ok((r.u16("landlock port")?, r.u64("landlock port access")?)))
        .collect::<R<Vec<(u16, u64)>>>()?;
    let debug_unlandlocked = if r.bool("test-only bind")? {
        Some(r.string("test-only bind")?)
    } else {
        None
    };
    Ok(Ruleset {
        abi,
        handled_fs,
        handled_net,
        scoped,
        rules,
        ports,
        debug_unlandlocked,
    })
}

/// Writes the sources of a plan or of a run's part.
fn write_sources(w: &mut Writer, sources: &[Source]) {
    w.len(sources.len());
    for s in sources {
        w.cstr(&s.path);
        w.u64(s.dev);
        w.u64(s.ino);
        w.i32(s.tree);
        w.bool(s.idmap);
        w.bool(s.in_supervisor);
    }
}

fn read_sources(r: &mut Reader<'_>) -> R<Vec<Source>> {
    let n = r.count(MAX_ITEMS, 26, "sources")?;
    (0..n)
        .map(|_| {
            Ok(Source {
                path: r.cstr("source path")?,
                dev: r.u64("source device")?,
                ino: r.u64("source inode")?,
                tree: match r.i32("source tree")? {
                    t if t >= -1 => t,
                    _ => return Err(WireError("source tree")),
                },
                idmap: r.bool("source idmap")?,
                fd: -1,
                in_supervisor: r.bool("source opened by the supervisor")?,
            })
        })
        .collect()
}

fn read_ops(r: &mut Reader<'_>, sources: usize) -> R<Vec<Op>> {
    let n = r.count(MAX_ITEMS, 1, "operations")?;
    (0..n).map(|_| read_op(r, sources)).collect()
}

/// Writes the program to run: candidate paths, arguments, environment.
pub fn write_exec(w: &mut Writer, exec: &Exec) {
    w.cstrs(&exec.candidates);
    w.cstrs(&exec.argv);
    w.cstrs(&exec.envp);
    w.len(exec.files.len());
    for f in &exec.files {
        w.cstrs(&f.dirs);
        w.cstr(&f.name);
        w.u32(f.mode);
        w.u64(f.len);
    }
}

/// Reads what [`write_exec`] wrote; a program needs a candidate and an argument.
pub fn read_exec(r: &mut Reader<'_>) -> R<Exec> {
    let candidates = r.cstrs("program candidates")?;
    let argv = r.cstrs("arguments")?;
    let envp = r.cstrs("environment")?;
    if candidates.is_empty() || argv.is_empty() {
        return Err(WireError("program (no candidate or no argument)"));
    }
    let n = r.count(crate::plan::MAX_FILES_IN, 20, "files")?;
    // Each name one path component, as `plan::in_files` made them.
    let component = |c: &CString| {
        let b = c.as_bytes();
        !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && b.len() <= 255
    };
    let files = (0..n)
        .map(|_| {
            let dirs = r.cstrs("file directories")?;
            let name = r.cstr("file name")?;
            let mode = r.u32("file mode")?;
            let len = r.u64("file length")?;
            if !dirs.iter().all(component) || !component(&name) || mode & !0o777 != 0 {
                return Err(WireError("file (path or mode)"));
            }
            Ok(crate::plan::InFile {
                dirs,
                name,
                mode,
                len,
            })
        })
        .collect::<R<Vec<_>>>()?;
    let mut exec = Exec::new(candidates, argv, envp);
    exec.files = files;
    Ok(exec)
}

/// Writes a run's part of the view (see `plan::run_part`).
pub fn write_run_part(w: &mut Writer, part: &RunPart) {
    write_sources(w, &part.sources);
    w.len(part.ops.len());
    part.ops.iter().for_each(|op| write_op(w, op));
}

/// Reads what [`write_run_part`] wrote; every operation must be one a run does (see
/// `plan::is_per_run`): a run never changes the template's part of the view.
pub fn read_run_part(r: &mut Reader<'_>) -> R<RunPart> {
    let sources = read_sources(r)?;
    let ops = read_ops(r, sources.len())?;
    if !ops.iter().all(crate::plan::is_per_run) {
        return Err(WireError("a run's operation outside the per-run mounts"));
    }
    Ok(RunPart { sources, ops })
}

/// Writes everything of `plan` an init needs (see the module doc for what is left out).
pub fn write_plan(w: &mut Writer, plan: &Plan) {
    write_sources(w, &plan.sources);
    w.len(plan.ops.len());
    plan.ops.iter().for_each(|op| write_op(w, op));
    w.cstr(&plan.hostname);
    let i = plan.ids;
    w.u32(i.uid);
    w.u32(i.gid);
    w.u32(i.host_uid);
    w.u32(i.host_gid);
    w.bool(i.privileged);
    write_exec(w, &plan.exec);
    w.bool(plan.tty);
    w.cstr(&plan.workdir);
    match plan.scratch_source {
        Some(s) => {
            w.bool(true);
            w.len(s);
        }
        None => w.bool(false),
    }
    w.len(plan.seccomp.len());
    for f in &plan.seccomp {
        w.u16(f.code);
        w.u8(f.jt);
        w.u8(f.jf);
        w.u32(f.k);
    }
    w.len(plan.rlimits.len());
    for &(res, soft, hard) in &plan.rlimits {
        w.u32(res);
        w.u64(soft);
        w.u64(hard);
    }
    match &plan.landlock {
        LandlockPlan::Enforce(rs) => {
            w.u8(1);
            write_ruleset(w, rs);
        }
        LandlockPlan::Waived(why) => {
            w.u8(0);
            w.bytes(why.as_bytes());
        }
    }
    w.len(plan.sockets.len());
    for s in &plan.sockets {
        w.u8(match s.role {
            SockRole::HttpProxy => 1,
            SockRole::Socks => 2,
            SockRole::Dns => 3,
            SockRole::Transparent => 4,
        });
        w.u32(s.addr);
        w.u16(s.port);
    }
}

/// Reads what [`write_plan`] wrote, into a plan the init can run: its payload stack allocated,
/// the exec arrays built, every index checked.
pub fn read_plan(r: &mut Reader<'_>) -> R<Plan> {
    let sources = read_sources(r)?;
    let ops = read_ops(r, sources.len())?;
    let hostname = r.cstr("hostname")?;
    let ids = Ids {
        uid: r.u32("uid")?,
        gid: r.u32("gid")?,
        host_uid: r.u32("host uid")?,
        host_gid: r.u32("host gid")?,
        privileged: r.bool("privileged")?,
    };
    let exec = read_exec(r)?;
    let tty = r.bool("tty")?;
    let workdir = r.cstr("working directory")?;
    let scratch_source = if r.bool("scratch source")? {
        Some(r.index(sources.len(), "scratch source")?)
    } else {
        None
    };
    let n = r.count(MAX_BPF, 8, "seccomp program")?;
    let seccomp = (0..n)
        .map(|_| {
            Ok(SockFilter {
                code: r.u16("seccomp instruction")?,
                jt: r.u8("seccomp instruction")?,
                jf: r.u8("seccomp instruction")?,
                k: r.u32("seccomp instruction")?,
            })
        })
        .collect::<R<Vec<SockFilter>>>()?;
    if seccomp.is_empty() {
        return Err(WireError("seccomp program (empty)"));
    }
    let n = r.count(16, 20, "rlimits")?;
    let rlimits = (0..n)
        .map(|_| {
            let res = r.u32("rlimit resource")?;
            if res >= RLIMITS {
                return Err(WireError("rlimit resource"));
            }
            Ok((res, r.u64("rlimit soft")?, r.u64("rlimit hard")?))
        })
        .collect::<R<Vec<_>>>()?;
    let landlock = match r.u8("landlock")? {
        1 => LandlockPlan::Enforce(read_ruleset(r)?),
        0 => LandlockPlan::Waived(r.string("landlock waiver")?),
        _ => return Err(WireError("landlock")),
    };
    let n = r.count(256, 7, "egress sockets")?;
    let sockets = (0..n)
        .map(|_| {
            let role = match r.u8("egress socket role")? {
                1 => SockRole::HttpProxy,
                2 => SockRole::Socks,
                3 => SockRole::Dns,
                4 => SockRole::Transparent,
                _ => return Err(WireError("egress socket role")),
            };
            Ok(SockSpec {
                role,
                addr: r.u32("egress socket address")?,
                port: r.u16("egress socket port")?,
            })
        })
        .collect::<R<Vec<SockSpec>>>()?;
    Ok(Plan {
        sources,
        ops,
        hostname,
        ids,
        exec,
        tty,
        workdir,
        payload_stack: vec![0; crate::plan::PAYLOAD_STACK],
        scratch_source,
        seccomp,
        rlimits,
        landlock,
        sockets,
        protection: Default::default(),
        // The supervisor's alone: init only runs the workspace's operations.
        workspace: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_policy::{Bind, Policy};

    /// The real host's files, with Landlock ABI 6 whatever the kernel has.
    struct Abi6;

    impl crate::plan::HostFs for Abi6 {
        fn lstat(&self, p: &std::path::Path) -> Option<std::fs::Metadata> {
            crate::plan::RealHost.lstat(p)
        }
        fn readlink(&self, p: &std::path::Path) -> Option<std::path::PathBuf> {
            crate::plan::RealHost.readlink(p)
        }
        fn landlock_abi(&self) -> Result<u32, i32> {
            Ok(6)
        }
    }

    /// A realistic plan: the real host's view, a host scratch directory, binds, network rules
    /// (egress listeners, Landlock ports), a terminal.
    fn realistic() -> Plan {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("palisade-wire-{}-{n}", std::process::id()));
        std::fs::create_dir_all(d.join("data")).unwrap();
        let mut p = Policy::new(["python3", "-c", "print(1)"]).unwrap();
        p.scratch = palisade_policy::Scratch::Host { path: d.clone() };
        p.binds
            .push(Bind::parse(&format!("{}:/data", d.join("data").display()), false).unwrap());
        p.network.allow.push(
            palisade_policy::net::NetRule::parse("network.allow", "example.com:443").unwrap(),
        );
        p.network.local_ports.push(8000);
        p.tty = true;
        let ids = Ids {
            uid: 1000,
            gid: 1000,
            host_uid: 1000,
            host_gid: 1000,
            privileged: false,
        };
        let mut plan = crate::plan::build(&p, ids, &Abi6).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        let file = |path: &str, mode| crate::plan::FileIn {
            path: path.into(),
            data: b"x".to_vec(),
            mode,
        };
        plan.exec.files =
            crate::plan::in_files(&[file("main.py", 0o644), file("a/b/run.sh", 0o755)]).unwrap();
        plan
    }

    fn fds() -> ChildFds {
        ChildFds {
            stdio: [0, 1, 2],
            msg: 5,
            go: 6,
            pty_sock: -1,
            files: -1,
            keep: vec![5, 6, 9],
        }
    }

    fn encode(plan: &Plan) -> Vec<u8> {
        let mut w = Writer::new(1);
        write_fds(&mut w, &fds());
        write_plan(&mut w, plan);
        w.into_bytes()
    }

    /// Everything the init reads, as text (the exec arrays hold addresses, so they are compared
    /// through the strings they point at).
    fn shown(p: &Plan) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}/{:?}/{:?}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}",
            p.sources,
            p.ops,
            p.hostname,
            p.ids,
            p.exec.candidates,
            p.exec.argv,
            (&p.exec.envp, &p.exec.files),
            p.tty,
            p.workdir,
            p.scratch_source,
            p.seccomp,
            p.rlimits,
            p.landlock,
            p.sockets,
            p.payload_stack.len(),
        )
    }

    #[test]
    fn a_realistic_plan_round_trips() {
        let plan = realistic();
        assert!(plan.sockets.len() >= 3 && plan.tty && plan.scratch_source.is_some());
        assert!(matches!(&plan.landlock, LandlockPlan::Enforce(r) if !r.ports.is_empty()));
        let bytes = encode(&plan);
        let (kind, mut r) = Reader::new(&bytes).unwrap();
        assert_eq!(kind, 1);
        let f = read_fds(&mut r).unwrap();
        assert_eq!(
            (f.stdio, f.msg, f.go, f.pty_sock, f.keep.clone()),
            ([0, 1, 2], 5, 6, -1, vec![5, 6, 9])
        );
        let back = read_plan(&mut r).unwrap();
        r.finish().unwrap();
        assert_eq!(shown(&back), shown(&plan));
        // The pointer arrays are rebuilt: each points at the decoded strings and ends with NULL.
        assert_eq!(back.exec.argv.as_ptrs().len(), back.exec.argv.len() + 1);
        assert_eq!(back.exec.argv.as_ptrs()[0], back.exec.argv[0].as_ptr());
        assert!(back.exec.envp.as_ptrs().last().unwrap().is_null());
        // Written again, the decoded plan gives the same bytes.
        assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn a_workspace_plan_round_trips() {
        let d = std::env::temp_dir().join(format!("palisade-wire-ws-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut p = Policy::new(["true"]).unwrap();
        p.scratch = palisade_policy::Scratch::Workspace { path: d.clone() };
        let ids = Ids {
            uid: 1000,
            gid: 1000,
            host_uid: 1000,
            host_gid: 1000,
            privileged: false,
        };
        let plan = crate::plan::build(&p, ids, &Abi6).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        // Every kind of the workspace's operations is in it.
        for kind in ["Overlay", "UserXattr", "SendDir", "Detach", "Rmdir"] {
            assert!(
                plan.ops.iter().any(|o| format!("{o:?}").starts_with(kind)),
                "no {kind} in {:?}",
                plan.ops
            );
        }
        let bytes = encode(&plan);
        let (_, mut r) = Reader::new(&bytes).unwrap();
        read_fds(&mut r).unwrap();
        let back = read_plan(&mut r).unwrap();
        r.finish().unwrap();
        assert_eq!(shown(&back), shown(&plan));
        assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_refused() {
        let bytes = encode(&realistic());
        for n in 0..bytes.len() {
            let cut = &bytes[..n];
            let ok = Reader::new(cut).and_then(|(_, mut r)| {
                read_fds(&mut r)?;
                read_plan(&mut r)?;
                r.finish()
            });
            assert!(
                ok.is_err(),
                "a message cut at {n} of {} was read",
                bytes.len()
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        let (_, mut r) = Reader::new(&long).unwrap();
        read_fds(&mut r).unwrap();
        read_plan(&mut r).unwrap();
        assert_eq!(r.finish(), Err(WireError("bytes after the last field")));
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        // Another version.
        let mut b = encode(&realistic());
        b[4] ^= 0xff;
        assert!(Reader::new(&b).is_err());
        // A bind whose source index is out of range.
        let mut plan = realistic();
        let n = plan.sources.len();
        plan.ops.push(Op::Bind {
            source: n,
            path: c"x".into(),
            attrs: 0,
        });
        let b = encode(&plan);
        let (_, mut r) = Reader::new(&b).unwrap();
        read_fds(&mut r).unwrap();
        assert_eq!(read_plan(&mut r).unwrap_err(), WireError("bind source"));
        // A count far beyond what the message holds is refused before anything is allocated.
        let mut w = Writer::new(1);
        write_fds(&mut w, &fds());
        w.u32(u32::MAX);
        let b = w.into_bytes();
        let (_, mut r) = Reader::new(&b).unwrap();
        read_fds(&mut r).unwrap();
        assert_eq!(read_plan(&mut r).unwrap_err(), WireError("sources"));
        // A file name that is not one path component, or a mode past the permission bits.
        for (dirs, name, mode) in [
            (vec![c"..".to_owned()], c"x".to_owned(), 0o644),
            (vec![], c"a/b".to_owned(), 0o644),
            (vec![], c"".to_owned(), 0o644),
            (vec![], c"x".to_owned(), 0o4755),
        ] {
            let mut plan = realistic();
            plan.exec.files = vec![crate::plan::InFile {
                dirs,
                name,
                mode,
                len: 1,
            }];
            let b = encode(&plan);
            let (_, mut r) = Reader::new(&b).unwrap();
            read_fds(&mut r).unwrap();
            assert_eq!(
                read_plan(&mut r).unwrap_err(),
                WireError("file (path or mode)")
            );
        }
        // Descriptors to keep must be sorted and above 2.
        let mut w = Writer::new(1);
        write_fds(
            &mut w,
            &ChildFds {
                keep: vec![7, 4],
                ..fds()
            },
        );
        let b = w.into_bytes();
        let (_, mut r) = Reader::new(&b).unwrap();
        assert!(read_fds(&mut r).is_err());
    }
}
