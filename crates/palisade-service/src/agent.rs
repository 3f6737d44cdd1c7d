//! `palisade __agent`: the sandbox's payload when the server moves files or runs several commands
//! in one sandbox. It runs inside the boundary (namespaces, Landlock, seccomp, the cgroup's
//! ceilings), so whatever it is asked to do, it can reach nothing the code inside could not.
//!
//! It first makes itself non-dumpable (so that a process it starts, same uid, cannot read or
//! write its memory or take its descriptors through `/proc`), moves its control socket (fd 0) to
//! a close-on-exec descriptor and puts `/dev/null` at fd 0, then serves [`proto`]
//! requests until the server closes the socket. Files are opened one component at a time with
//! `O_NOFOLLOW` (a symlink anywhere on the path fails), with `O_NONBLOCK` (a fifo cannot block
//! it), and only regular files are read or replaced.

use crate::archive;
use crate::proto::{self, check_path, Entry, Event, Request};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Runs the agent on fd 0; returns the process's exit code.
pub fn main() -> i32 {
    // Large buffers (a file read back, an archive) given back to the kernel when freed.
    palisade::agent::give_large_buffers_back();
    // Before anything else: no process this agent starts may read its memory or descriptors.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!("palisade agent: cannot make itself non-dumpable: {e}");
        return 125;
    }
    let sock = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("palisade agent: no control socket on fd 0: {e}");
            return 125;
        }
    };
    match std::fs::File::open("/dev/null") {
        Ok(n) => {
            if let Err(e) = rustix::stdio::dup2_stdin(&n) {
                eprintln!("palisade agent: cannot replace fd 0: {e}");
                return 125;
            }
        }
        Err(e) => {
            eprintln!("palisade agent: cannot open /dev/null: {e}");
            return 125;
        }
    }
    let cwd = match rustix::fs::open(
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("palisade agent: cannot open the working directory: {e}");
            return 125;
        }
    };
    let agent = Agent {
        out: Arc::new(Mutex::new(UnixStream::from(
            sock.try_clone().expect("dup the socket"),
        ))),
        cwd,
        execs: Arc::new(Mutex::new(HashMap::new())),
        tars: Mutex::new(Vec::new()),
        walk_fds: walk_fds(),
    };
    let mut input = UnixStream::from(sock);
    loop {
        let mut prefix = [0u8; 8];
        // Descriptors the server sends (an exec's cgroup) come with a frame's first bytes.
        let fds = match read_prefix(&input, &mut prefix) {
            Ok(fds) => fds,
            Err(_) => break, // the server closed the socket: the end
        };
        let (h, d) = match proto::lengths(&prefix, proto::MAX_DATA) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("palisade agent: bad frame from the server: {e}");
                return 125;
            }
        };
        let mut header = vec![0u8; h];
        if input.read_exact(&mut header).is_err() {
            break;
        }
        let req: Request = match serde_json::from_slice(&header) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("palisade agent: bad request from the server: {e}");
                return 125;
            }
        };
        if let Request::Write { .. } | Request::TarIn { .. } = req {
            // From the socket to the disk as it arrives: the agent's memory is the session's,
            // and a file held whole on its way in was charged twice.
            let mut body = (&input).take(d as u64);
            agent.handle_stream(req, &mut body);
            // What an error left unread, so that the next frame starts where it should.
            if std::io::copy(&mut body, &mut std::io::sink()).is_err() || body.limit() > 0 {
                break;
            }
            continue;
        }
        let mut data = vec![0u8; d];
        if input.read_exact(&mut data).is_err() {
            break;
        }
        agent.handle(req, data, fds);
    }
    // Whatever is still running dies with the sandbox when this payload ends.
    0
}

/// Most descriptors the agent takes with one frame; more are closed by the kernel.
const MAX_FRAME_FDS: usize = 4;

/// Reads a frame's 8-byte prefix, with the descriptors that came with its first bytes
/// (close-on-exec). An error or the end of the stream before the whole prefix is an error.
fn read_prefix(sock: &UnixStream, prefix: &mut [u8; 8]) -> std::io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut n = 0;
    while n < prefix.len() {
        let mut space =
            [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FRAME_FDS))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let got = match rustix::net::recvmsg(
            sock,
            &mut [std::io::IoSliceMut::new(&mut prefix[n..])],
            &mut control,
            rustix::net::RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(r) = m {
                fds.extend(r);
            }
        }
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        n += got;
    }
    Ok(fds)
}

struct Agent {
    out: Arc<Mutex<UnixStream>>,
    cwd: OwnedFd,
    /// Running execs: id → process group.
    execs: Arc<Mutex<HashMap<u64, i32>>>,
    /// Archives between their pieces, by the id of the request that opened each, with when each
    /// was last asked for, the one asked for last at the end (at most [`MAX_TARS`]).
    tars: Mutex<Vec<(u64, Instant, TarCursor)>>,
    /// Most descriptors the archives' walks hold together: half the agent's own limit.
    walk_fds: usize,
}

/// An error with its stable code.
struct Fail(&'static str, String);

impl From<rustix::io::Errno> for Fail {
    fn from(e: rustix::io::Errno) -> Fail {
        let code = match e {
            rustix::io::Errno::NOENT => "not-found",
            rustix::io::Errno::LOOP => "symlink",
            rustix::io::Errno::NOTDIR => "not-directory",
            rustix::io::Errno::EXIST => "exists",
            rustix::io::Errno::ISDIR => "is-directory",
            rustix::io::Errno::NOSPC | rustix::io::Errno::FBIG | rustix::io::Errno::DQUOT => {
                "no-space"
            }
            _ => "io",
        };
        Fail(code, e.to_string())
    }
}

impl Agent {
    /// Sends one frame: its header, then `data` as it is (a file read back is not copied into
    /// the frame: the agent's memory is the session's, and a second copy of a 16 MiB file was
    /// more than the room an exec's ceiling leaves it).
    fn send(&self, ev: &Event, data: &[u8], fds: &[BorrowedFd<'_>]) {
        let head = proto::encode_head(ev, data.len());
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let mut sent = 0;
        if !fds.is_empty() {
            let mut space =
                [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(3))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            control.push(rustix::net::SendAncillaryMessage::ScmRights(fds));
            // The descriptors go with the frame's first bytes; the rest follows as usual.
            match rustix::net::sendmsg(
                &*out,
                &[std::io::IoSlice::new(&head), std::io::IoSlice::new(data)],
                &mut control,
                rustix::net::SendFlags::empty(),
            ) {
                Ok(n) => sent = n,
                Err(_) => return,
            }
        }
        if sent < head.len() {
            if out.write_all(&head[sent..]).is_err() {
                return;
            }
            sent = head.len();
        }
        let _ = out.write_all(&data[sent - head.len()..]);
    }

    fn handle(&self, req: Request, data: Vec<u8>, fds: Vec<OwnedFd>) {
        let id = req.id();
        let r = match req {
            Request::Write { .. } | Request::TarIn { .. } => {
                // Their data is read from the socket as it is written (`handle_stream`).
                let _ = data;
                Err(Fail("invalid", "a write out of its stream".into()))
            }
            Request::Mkdir { path, .. } => self.dir(&path, true).map(|_| ()),
            Request::Read {
                path,
                max,
                offset,
                len,
                ..
            } => match self.read(id, &path, max, offset, len) {
                Ok((last, file)) => {
                    let mut ok = Event::ok(id);
                    if let Event::Ok { file: f, .. } = &mut ok {
                        *f = Some(file);
                    }
                    self.send(&ok, &last, &[]);
                    return;
                }
                Err(e) => Err(e),
            },
            Request::List { path, .. } => match self.list(&path) {
                Ok((entries, truncated)) => {
                    self.send(
                        &Event::Ok {
                            id,
                            entries,
                            pid: None,
                            skipped: None,
                            truncated,
                            joined: None,
                            file: None,
                        },
                        &[],
                        &[],
                    );
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Remove {
                path, recursive, ..
            } => self.remove(&path, recursive),
            Request::Exec {
                argv,
                env,
                cwd,
                join,
                ..
            } => {
                // The descriptors of the exec's cgroup came with its frame, if it has one.
                let join = if join { fds } else { Vec::new() };
                if let Err(Fail(code, message)) = self.exec(id, argv, env, &cwd, join) {
                    self.send(
                        &Event::Err {
                            id,
                            code: code.into(),
                            message: bounded(message),
                        },
                        &[],
                        &[],
                    );
                }
                return;
            }
            Request::Signal { exec, signal, .. } => self.signal(exec, signal),
            Request::TarOut {
                path,
                len,
                strict,
                max,
                ..
            } => {
                // Room first: a walk past its time or past the descriptors' share goes before
                // this one opens its directory.
                self.prune_tars(1);
                match self
                    .base_dir(&path, false)
                    .and_then(|(d, _)| TarCursor::new(d, strict, max))
                {
                    Ok(c) => return self.tar_piece(id, id, c, len),
                    Err(e) => Err(e),
                }
            }
            Request::TarMore { cursor, len, .. } => {
                let mut tars = self.tars.lock().unwrap_or_else(|p| p.into_inner());
                match tars.iter().position(|(c, _, _)| *c == cursor) {
                    Some(i) => {
                        let (_, _, c) = tars.remove(i);
                        drop(tars);
                        self.prune_tars(c.fds());
                        return self.tar_piece(id, cursor, c, len);
                    }
                    None => Err(Fail(
                        "gone",
                        "the archive is no longer open (more were opened since, or it was left unasked for too long)".into(),
                    )),
                }
            }
            Request::TarDrop { cursor, .. } => {
                let mut tars = self.tars.lock().unwrap_or_else(|p| p.into_inner());
                tars.retain(|(c, _, _)| *c != cursor);
                Ok(())
            }
        };
        self.answer(id, r);
    }

    /// Serves a request whose frame's data (`body`) is still on the socket: a file or an archive
    /// written in, from the socket to the disk as it arrives. What it leaves unread of `body`
    /// (after an error) is the caller's to skip.
    fn handle_stream(&self, req: Request, body: &mut dyn Read) {
        let id = req.id();
        let r = match req {
            Request::Write { path, mode, .. } => self.write(&path, mode, body),
            Request::TarIn { path, .. } => self.tar_in(&path, body),
            _ => Err(Fail("invalid", "not a stream".into())),
        };
        self.answer(id, r);
    }

    /// Answers request `id` with `Ok` and no data, or its error.
    fn answer(&self, id: u64, r: Result<(), Fail>) {
        match r {
            Ok(()) => self.send(&Event::ok(id), &[], &[]),
            Err(Fail(code, message)) => self.send(
                &Event::Err {
                    id,
                    code: code.into(),
                    message: bounded(message),
                },
                &[],
                &[],
            ),
        }
    }

    /// Opens the directory `comps` under the working directory, component by component, never
    /// following a symlink; `create` makes missing ones.
    fn open_dir(&self, comps: &[&str], create: bool) -> Result<OwnedFd, Fail> {
        let mut dir = rustix::fs::openat(
            &self.cwd,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for c in comps {
            let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
            dir = match rustix::fs::openat(&dir, *c, flags, Mode::empty()) {
                Ok(d) => d,
                Err(rustix::io::Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, *c, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    rustix::fs::openat(&dir, *c, flags, Mode::empty())?
                }
                // A symlink with O_DIRECTORY|O_NOFOLLOW: ENOTDIR on some kernels, ELOOP on others.
                Err(e) => {
                    if is_symlink(&dir, c) {
                        return Err(Fail(
                            "symlink",
                            format!("`{c}` is a symbolic link: not followed"),
                        ));
                    }
                    return Err(e.into());
                }
            };
        }
        Ok(dir)
    }

    fn split<'p>(&self, path: &'p str) -> Result<(Vec<&'p str>, &'p str), Fail> {
        let comps = check_path(path).map_err(|e| Fail("invalid", e.to_owned()))?;
        let (last, parents) = comps.split_last().expect("check_path gives at least one");
        Ok((parents.to_vec(), last))
    }

    /// Replaces the regular file at `path` (parents made) with what `src` gives, copied a piece
    /// at a time.
    fn write(&self, path: &str, mode: u32, src: &mut dyn Read) -> Result<(), Fail> {
        let (parents, name) = self.split(path)?;
        let dir = self.open_dir(&parents, true)?;
        let mode = Mode::from_raw_mode(mode & 0o777);
        let f = rustix::fs::openat(
            &dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            mode,
        )
        .map_err(|e| {
            if is_symlink(&dir, name) {
                Fail(
                    "symlink",
                    format!("`{path}` is a symbolic link: not followed"),
                )
            } else if e == rustix::io::Errno::NXIO {
                Fail("not-regular", format!("`{path}` is not a regular file"))
            } else {
                e.into()
            }
        })?;
        let st = rustix::fs::fstat(&f)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Fail(
                "not-regular",
                format!("`{path}` is not a regular file"),
            ));
        }
        rustix::fs::ftruncate(&f, 0)?;
        rustix::fs::fchmod(&f, mode)?;
        let mut file = std::fs::File::from(f);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fail("io", format!("reading the file's data: {e}"))),
            };
            file.write_all(&buf[..n])
                .map_err(|e| match e.raw_os_error() {
                    Some(n) => Fail::from(rustix::io::Errno::from_raw_os_error(n)),
                    None => Fail("io", e.to_string()),
                })?;
        }
    }

    fn dir(&self, path: &str, create: bool) -> Result<OwnedFd, Fail> {
        let comps = check_path(path).map_err(|e| Fail("invalid", e.to_owned()))?;
        self.open_dir(&comps, create)
    }

    /// Sends the regular file at `path` (at most `max` bytes; with `len`, only up to `len` bytes
    /// from `offset`) as the data of request `id`'s answer: every piece but the last in
    /// [`Event::Part`] frames; returns the last, and which file it was.
    fn read(
        &self,
        id: u64,
        path: &str,
        max: u64,
        offset: u64,
        len: Option<u64>,
    ) -> Result<(Vec<u8>, proto::FileId), Fail> {
        let (parents, name) = self.split(path)?;
        let dir = self.open_dir(&parents, false)?;
        let f = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            if is_symlink(&dir, name) {
                Fail(
                    "symlink",
                    format!("`{path}` is a symbolic link: not followed"),
                )
            } else {
                e.into()
            }
        })?;
        let st = rustix::fs::fstat(&f)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Fail(
                "not-regular",
                format!("`{path}` is not a regular file"),
            ));
        }
        if st.st_size as u64 > max {
            return Err(Fail(
                "too-large",
                format!("`{path}` has {} bytes (at most {max})", st.st_size),
            ));
        }
        let file = proto::FileId {
            size: st.st_size as u64,
            dev: st.st_dev,
            ino: st.st_ino,
            ctime: [st.st_ctime, st.st_ctime_nsec as i64],
            mtime: [st.st_mtime, st.st_mtime_nsec as i64],
        };
        let mut parts = Parts::new(self, id);
        let mut f = std::fs::File::from(f);
        if let Some(len) = len {
            // A piece of a streamed read: what is there from `offset`, at most `len` (nothing
            // from past the end, where a seek may not go at all).
            if offset >= file.size {
                return Ok((Vec::new(), file));
            }
            use std::io::Seek;
            f.seek(std::io::SeekFrom::Start(offset))
                .map_err(|e| Fail("io", e.to_string()))?;
            parts
                .fill_from(&mut f.take(len))
                .map_err(|e| Fail("io", e.to_string()))?;
            return Ok((parts.buf, file));
        }
        // The size can grow while we read (the code may still be writing): read at most max+1.
        parts
            .fill_from(&mut f.take(max.saturating_add(1)))
            .map_err(|e| Fail("io", e.to_string()))?;
        if parts.len() > max {
            return Err(Fail("too-large", format!("`{path}` grew past {max} bytes")));
        }
        Ok((parts.buf, file))
    }

    /// The directory's entries by name, as many as fit in one reply's header ([`LIST_BUDGET`]);
    /// `true` when some were left out.
    fn list(&self, path: &str) -> Result<(Vec<Entry>, bool), Fail> {
        let dir = if path.is_empty() || path == "." {
            self.open_dir(&[], false)?
        } else {
            self.dir(path, false)?
        };
        // The first names by name that can fit in the reply: a heap of the least ones read so
        // far, within twice the reply's budget in bytes (all the names of a directory, held at
        // once, took the agent past its room: 100,000 long names, 28 MB).
        let mut kept: std::collections::BinaryHeap<std::ffi::CString> =
            std::collections::BinaryHeap::new();
        let mut bytes = 0usize;
        let mut truncated = false;
        for (read, e) in rustix::fs::Dir::read_from(&dir)?.enumerate() {
            let e = e?;
            let n = e.file_name();
            if n.to_bytes() == b"." || n.to_bytes() == b".." {
                continue;
            }
            if read >= LIST_READ_MAX {
                truncated = true;
                break;
            }
            kept.push(n.to_owned());
            bytes += n.to_bytes().len() + 1;
            while bytes > 2 * LIST_BUDGET {
                let Some(last) = kept.pop() else {
                    break;
                };
                bytes -= last.to_bytes().len() + 1;
                truncated = true;
            }
        }
        let names = kept.into_sorted_vec();
        let mut out = Vec::new();
        let mut used = 0usize;
        for n in names {
            let st =
                rustix::fs::statat(&dir, n.as_c_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok();
            let kind = match st.map(|s| FileType::from_raw_mode(s.st_mode)) {
                Some(FileType::RegularFile) => "file",
                Some(FileType::Directory) => "dir",
                Some(FileType::Symlink) => "symlink",
                Some(FileType::Fifo) => "fifo",
                Some(FileType::Socket) => "socket",
                _ => "other",
            };
            let entry = Entry {
                name: n.to_string_lossy().into_owned(),
                kind: kind.into(),
                size: st.map(|s| s.st_size as u64).unwrap_or(0),
            };
            // Its bytes in the reply's JSON, and the comma before it.
            let cost = serde_json::to_vec(&entry).map_or(usize::MAX, |v| v.len()) + 1;
            if used.saturating_add(cost) > LIST_BUDGET {
                truncated = true;
                break;
            }
            used += cost;
            out.push(entry);
        }
        Ok((out, truncated))
    }

    fn remove(&self, path: &str, recursive: bool) -> Result<(), Fail> {
        let (parents, name) = self.split(path)?;
        let dir = self.open_dir(&parents, false)?;
        let st = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            if recursive {
                let c = std::ffi::CString::new(name)
                    .map_err(|_| Fail("invalid", "a name with a NUL byte".into()))?;
                remove_tree(&dir, &c, 0)?;
            } else {
                rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::REMOVEDIR)?;
            }
        } else {
            rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::empty())?;
        }
        Ok(())
    }

    fn exec(
        &self,
        id: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: &str,
        join: Vec<OwnedFd>,
    ) -> Result<(), Fail> {
        let Some(prog) = argv.first() else {
            return Err(Fail("invalid", "an empty command".into()));
        };
        let dir = if cwd.is_empty() {
            std::path::PathBuf::from(".")
        } else {
            check_path(cwd).map_err(|e| Fail("invalid", e.to_owned()))?;
            // Checked without following links, then used by name: the code may swap it in between,
            // which only moves its own program to another directory it can reach anyway.
            self.dir(cwd, false)?;
            std::path::PathBuf::from(cwd)
        };
        let (in_r, in_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let mut cmd = std::process::Command::new(prog);
        cmd.args(&argv[1..])
            .envs(env)
            .current_dir(dir)
            .stdin(std::process::Stdio::from(in_r))
            .stdout(std::process::Stdio::from(out_w))
            .stderr(std::process::Stdio::from(err_w))
            .process_group(0);
        // The exec's own cgroup, entered by its process before the program starts.
        let joined = if join.is_empty() {
            None
        } else {
            let j = palisade::agent::join_cgroups_before_exec(&mut cmd, join);
            Some(j.map_err(|e| Fail("io", format!("cannot prepare the exec's cgroup: {e}")))?)
        };
        let t0 = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => "not-found",
                std::io::ErrorKind::PermissionDenied => "permission",
                _ => "io",
            };
            Fail(code, format!("cannot start `{prog}`: {e}"))
        })?;
        // The Command holds the child's ends; drop them so that end of file reaches the server.
        drop(cmd);
        let joined = joined.map(|j| j.all());
        let pid = child.id() as i32;
        self.execs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, pid);
        self.send(
            &Event::Ok {
                id,
                entries: Vec::new(),
                pid: Some(pid),
                skipped: None,
                truncated: false,
                joined,
                file: None,
            },
            &[],
            &[in_w.as_fd(), out_r.as_fd(), err_r.as_fd()],
        );
        drop((in_w, out_r, err_r));
        let (out, execs) = (self.out.clone(), self.execs.clone());
        std::thread::spawn(move || {
            let cpu_ms = exit_cpu_ms(pid);
            let st = child.wait();
            execs.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            // An exec ends with its program: what it left running in its process group goes
            // too, so that its pipes reach end of file.
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
            }
            let (code, signal) = match st {
                Ok(s) => (s.code(), s.signal()),
                Err(_) => (None, None),
            };
            let ev = Event::Exit {
                id,
                code,
                signal,
                wall_ms: t0.elapsed().as_secs_f64() * 1000.0,
                cpu_ms,
            };
            let frame = proto::encode(&ev, &[]);
            let _ = out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .write_all(&frame);
        });
        Ok(())
    }

    fn signal(&self, exec: u64, signal: i32) -> Result<(), Fail> {
        let pgid = self
            .execs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&exec)
            .copied();
        let Some(pgid) = pgid else {
            return Err(Fail("not-found", format!("no running exec {exec}")));
        };
        let sig = rustix::process::Signal::from_named_raw(signal)
            .ok_or_else(|| Fail("invalid", format!("signal {signal}")))?;
        let pid =
            rustix::process::Pid::from_raw(pgid).ok_or_else(|| Fail("invalid", "pid".into()))?;
        rustix::process::kill_process_group(pid, sig)?;
        Ok(())
    }
}

/// CPU time of the exec's program `pid` once it has ended, before it is reaped: its own (all its
/// threads) and its waited-for children's (`utime`, `stime`, `cutime`, `cstime` of its
/// `/proc/PID/stat`, which a zombie still has), in milliseconds. Processes it left to others
/// (orphans, reaped by the sandbox's init) are not in it. `None` if it cannot be read.
fn exit_cpu_ms(pid: i32) -> Option<f64> {
    let p = rustix::process::Pid::from_raw(pid)?;
    rustix::process::waitid(
        rustix::process::WaitId::Pid(p),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
    )
    .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 4 {
        return None;
    }
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some(f.iter().sum::<u64>() as f64 * 1000.0 / hz as f64)
}

/// Room for a listing's entries in a reply's header: [`proto::MAX_HEADER`] less what the rest
/// of the reply takes (its kind, id, flags and brackets take under a hundred bytes).
const LIST_BUDGET: usize = proto::MAX_HEADER - 1024;
/// Most names a listing reads from a directory (they are sorted, then cut to [`LIST_BUDGET`]).
const LIST_READ_MAX: usize = 100_000;
/// Names a recursive removal reads at once, at each level (then it reads the directory again).
const REMOVE_BATCH: usize = 64;
/// Longest error message the agent sends (a name inside it may be long).
const MESSAGE_MAX: usize = 4096;

/// `m`, cut to [`MESSAGE_MAX`] bytes (at a character's boundary).
fn bounded(mut m: String) -> String {
    if m.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX - 3;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push('…');
    }
    m
}

impl Agent {
    fn base_dir(&self, path: &str, create: bool) -> Result<(OwnedFd, Vec<String>), Fail> {
        if path.is_empty() || path == "." {
            return Ok((self.open_dir(&[], create)?, Vec::new()));
        }
        let comps = check_path(path).map_err(|e| Fail("invalid", e.to_owned()))?;
        Ok((
            self.open_dir(&comps, create)?,
            comps.iter().map(|c| c.to_string()).collect(),
        ))
    }

    /// Answers request `id` with the next `len` bytes at most of the archive `c` (every piece
    /// of them but the last in [`Event::Part`] frames); the answer carries the count of entries
    /// skipped once the archive's end is in it, and `c` is kept as `cursor` until then.
    fn tar_piece(&self, id: u64, cursor: u64, mut c: TarCursor, len: u64) {
        // The descriptors this walk may hold: what the others kept leave of the agent's share.
        let others: usize = {
            let tars = self.tars.lock().unwrap_or_else(|p| p.into_inner());
            tars.iter().map(|(_, _, t)| t.fds()).sum()
        };
        c.room = self.walk_fds.saturating_sub(others).max(2);
        let mut parts = Parts::new(self, id);
        match c.fill(&mut parts, len) {
            Ok(done) => {
                let skipped = done.then_some(c.skipped);
                if !done {
                    let mut tars = self.tars.lock().unwrap_or_else(|p| p.into_inner());
                    if tars.len() >= MAX_TARS {
                        tars.remove(0);
                    }
                    tars.push((cursor, Instant::now(), c));
                }
                self.send(
                    &Event::Ok {
                        id,
                        entries: Vec::new(),
                        pid: None,
                        skipped,
                        truncated: false,
                        joined: None,
                        file: None,
                    },
                    &parts.buf,
                    &[],
                );
            }
            Err(e) => self.answer(id, Err(e)),
        }
    }

    /// Drops the archives kept longer than [`TAR_IDLE`] without being asked for, then the ones
    /// asked for longest ago while the rest and `more` descriptors would be past half of the
    /// walks' share (so that the walk about to go on has the other half at least).
    fn prune_tars(&self, more: usize) {
        let mut tars = self.tars.lock().unwrap_or_else(|p| p.into_inner());
        tars.retain(|(_, at, _)| at.elapsed() < TAR_IDLE);
        while !tars.is_empty()
            && tars.iter().map(|(_, _, t)| t.fds()).sum::<usize>() + more > self.walk_fds / 2
        {
            tars.remove(0);
        }
    }

    /// Unpacks the archive `src` gives under `path` (made), entry by entry as it is read: the
    /// server checked it whole first ([`crate::archive::check`]), and each entry is checked
    /// again here ([`crate::archive::entry`]).
    fn tar_in(&self, path: &str, src: &mut dyn Read) -> Result<(), Fail> {
        let (_, base) = self.base_dir(path, true)?;
        let mut ar = tar::Archive::new(src);
        let entries = ar
            .entries()
            .map_err(|e| Fail("invalid", format!("not a tar archive: {e}")))?;
        for (n, e) in entries.enumerate() {
            let mut e = e.map_err(|e| Fail("invalid", format!("a bad tar entry: {e}")))?;
            if n >= archive::MAX_ENTRIES {
                return Err(Fail(
                    "too-large",
                    format!("more than {} entries", archive::MAX_ENTRIES),
                ));
            }
            let Some((rel, kind)) = archive::entry(&e).map_err(|r| Fail(r.0, r.1))? else {
                continue; // the archive's own `./`
            };
            let full = if base.is_empty() {
                rel
            } else {
                format!("{}/{rel}", base.join("/"))
            };
            match kind {
                archive::Kind::Dir => {
                    self.dir(&full, true)?;
                }
                archive::Kind::File(mode) => self.write(&full, mode, &mut e)?,
            }
        }
        Ok(())
    }
}

/// The data of one answer (a file read back, an archive), sent in [`Event::Part`] frames of
/// [`proto::PART`] bytes as it comes; what is left at the end goes with the answer.
struct Parts<'a> {
    agent: &'a Agent,
    id: u64,
    buf: Vec<u8>,
    /// Bytes sent in parts so far.
    sent: u64,
}

impl<'a> Parts<'a> {
    fn new(agent: &'a Agent, id: u64) -> Parts<'a> {
        Parts {
            agent,
            id,
            buf: Vec::with_capacity(proto::PART),
            sent: 0,
        }
    }

    /// All its bytes so far, sent or not.
    fn len(&self) -> u64 {
        self.sent + self.buf.len() as u64
    }

    /// Sends the buffer, once full, as a part.
    fn send_full(&mut self) {
        if self.buf.len() >= proto::PART {
            self.agent
                .send(&Event::Part { id: self.id }, &self.buf, &[]);
            self.sent += self.buf.len() as u64;
            self.buf.clear();
        }
    }

    /// Reads `r` to its end straight into the buffer.
    fn fill_from(&mut self, r: &mut impl Read) -> std::io::Result<()> {
        loop {
            self.send_full();
            let start = self.buf.len();
            self.buf.resize(proto::PART, 0);
            let got = r.read(&mut self.buf[start..]);
            self.buf.truncate(start + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for Parts<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.send_full();
        let n = b.len().min(proto::PART - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Most archives a session's agent keeps open between their pieces; opening one more drops
/// the one asked for longest ago (its download then ends short).
const MAX_TARS: usize = 4;
/// An archive not asked for in this long is dropped (its client is long gone: the server cuts a
/// client that takes nothing for `--send-timeout`).
const TAR_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Half the agent's limit on open files (at least 8): what the archives' walks may hold
/// together, so that walks left half way can never take the descriptors the agent's other work
/// needs (found by an independent attack: four walks 50 deep took a session of 64 open files).
fn walk_fds() -> usize {
    let n = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1024);
    (n.min(1 << 20) as usize / 2).max(8)
}

/// An archive made from inside a piece at a time, never following a link: where the walk is
/// (one open directory per level), the file being sent, and the bytes made but not yet sent.
struct TarCursor {
    /// Each open directory with its path in the archive (`a/b/`, empty for the top).
    levels: Vec<(rustix::fs::Dir, String)>,
    /// Headers, padding or the end, made and not yet sent, from `at`.
    made: Vec<u8>,
    at: usize,
    /// The file whose content is being sent, its name, and the bytes of it still to send; then
    /// the zeros that pad it to a whole block.
    file: Option<(std::fs::File, String, u64)>,
    pad: usize,
    entries: usize,
    skipped: u64,
    /// The end's two empty blocks are made.
    ended: bool,
    /// An entry that would be skipped fails the archive.
    strict: bool,
    /// The most bytes the whole archive may have, end included, and those promised so far
    /// (headers, contents as large as their files were when opened, padding).
    max: u64,
    promised: u64,
    /// Most descriptors this walk may hold now (its directories and its file): set before each
    /// piece from what the agent's other walks hold.
    room: usize,
}

/// A tar block of zeros.
const BLOCK: usize = 512;

/// Whether an entry's open failed because it changed since it was looked at (replaced by a link,
/// a fifo with no writer, removed, its directory swapped): skipped as what it became.
fn changed(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [
        Errno::LOOP,
        Errno::NOENT,
        Errno::NXIO,
        Errno::NOTDIR,
        Errno::ISDIR,
    ]
    .contains(&e)
}

impl TarCursor {
    fn new(dir: OwnedFd, strict: bool, max: u64) -> Result<TarCursor, Fail> {
        Ok(TarCursor {
            levels: vec![(rustix::fs::Dir::new(dir)?, String::new())],
            made: Vec::new(),
            at: 0,
            file: None,
            pad: 0,
            entries: 0,
            skipped: 0,
            ended: false,
            strict,
            max,
            promised: 0,
            room: 2,
        })
    }

    /// Descriptors the walk holds: one per open directory, and its file.
    fn fds(&self) -> usize {
        self.levels.len() + usize::from(self.file.is_some())
    }

    /// Counts `n` more bytes promised; an archive that would then not end within `max` fails.
    fn promise(&mut self, n: u64, name: &str) -> Result<(), Fail> {
        let total = self.promised.saturating_add(n);
        if total.saturating_add(2 * BLOCK as u64) > self.max {
            return Err(Fail(
                "too-large",
                format!(
                    "the archive would be larger than {} bytes at `{}` (max_bytes: the server's --max-fetch unless the request names more; a file counts as large as it says it is, sparse or not, once per hard link)",
                    self.max,
                    name.escape_debug()
                ),
            ));
        }
        self.promised = total;
        Ok(())
    }

    /// Writes the archive's next `len` bytes at most to `w`; true once its end is written.
    fn fill(&mut self, w: &mut impl Write, len: u64) -> Result<bool, Fail> {
        let io = |e: std::io::Error| Fail("io", e.to_string());
        let mut left = len;
        loop {
            if self.at < self.made.len() {
                let n = ((self.made.len() - self.at) as u64).min(left) as usize;
                w.write_all(&self.made[self.at..self.at + n]).map_err(io)?;
                self.at += n;
                left -= n as u64;
                if self.at == self.made.len() {
                    self.made.clear();
                    self.at = 0;
                }
            } else if let Some((f, name, rest)) = &mut self.file {
                let want = (*rest).min(left);
                let got = std::io::copy(&mut f.take(want), w).map_err(io)?;
                if got < want {
                    return Err(Fail(
                        "changed",
                        format!("`{name}` shrank while it was archived"),
                    ));
                }
                *rest -= got;
                left -= got;
                if *rest == 0 {
                    self.file = None;
                    self.made.resize(self.pad, 0);
                }
            } else if self.ended {
                return Ok(true);
            } else {
                self.advance()?;
                continue;
            }
            if left == 0 {
                return Ok(self.ended && self.at == self.made.len() && self.file.is_none());
            }
        }
    }

    /// Makes the next entry's headers (and opens its file or directory), or the end.
    fn advance(&mut self) -> Result<(), Fail> {
        loop {
            let depth = self.levels.len();
            let Some((dir, prefix)) = self.levels.last_mut() else {
                self.made.extend_from_slice(&[0u8; 2 * BLOCK]);
                self.ended = true;
                return Ok(());
            };
            let Some(e) = dir.read() else {
                self.levels.pop();
                continue;
            };
            let Ok(e) = e else {
                continue;
            };
            let n = e.file_name().to_owned();
            if n.as_bytes() == b"." || n.as_bytes() == b".." {
                continue;
            }
            self.entries += 1;
            if self.entries > archive::MAX_ENTRIES {
                return Err(Fail(
                    "too-large",
                    format!("more than {} entries", archive::MAX_ENTRIES),
                ));
            }
            let Ok(name) = n.to_str() else {
                let shown = format!("{prefix}{}", n.to_string_lossy());
                self.skip(&shown, "its name is not UTF-8")?;
                continue;
            };
            let rel = format!("{prefix}{name}");
            let fd = dir.fd()?;
            let Ok(st) =
                rustix::fs::statat(fd, n.as_c_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            else {
                self.skip(&rel, "it could not be looked at")?;
                continue;
            };
            let mut h = tar::Header::new_gnu();
            h.set_mode(st.st_mode & 0o777);
            h.set_mtime(st.st_mtime.max(0) as u64);
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    if depth > proto::MAX_DEPTH {
                        return Err(Fail("invalid", "directory tree too deep".into()));
                    }
                    if depth + 1 > self.room {
                        return Err(self.no_room(&rel));
                    }
                    let sub = match rustix::fs::openat(
                        fd,
                        n.as_c_str(),
                        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        Ok(d) => d,
                        Err(e) if changed(e) => {
                            self.skip(&rel, "it changed while it was archived")?;
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    let rel = format!("{rel}/");
                    let before = self.made.len();
                    self.header(&mut h, &rel)?;
                    self.promise((self.made.len() - before) as u64, &rel)?;
                    self.levels.push((rustix::fs::Dir::new(sub)?, rel));
                    return Ok(());
                }
                FileType::RegularFile => {
                    if depth + 1 > self.room {
                        return Err(self.no_room(&rel));
                    }
                    let f = match rustix::fs::openat(
                        fd,
                        n.as_c_str(),
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                        Mode::empty(),
                    ) {
                        Ok(f) => f,
                        Err(e) if changed(e) => {
                            self.skip(&rel, "it changed while it was archived")?;
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    let st = rustix::fs::fstat(&f)?;
                    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                        self.skip(&rel, "it is no longer a regular file")?;
                        continue;
                    }
                    // Its content goes out as it is read, as large as it was when opened.
                    let size = st.st_size as u64;
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(size);
                    let before = self.made.len();
                    self.header(&mut h, &rel)?;
                    let pad = (BLOCK - (size % BLOCK as u64) as usize) % BLOCK;
                    let whole = ((self.made.len() - before) as u64)
                        .saturating_add(size)
                        .saturating_add(pad as u64);
                    self.promise(whole, &rel)?;
                    self.file = Some((std::fs::File::from(f), rel, size));
                    self.pad = pad;
                    return Ok(());
                }
                _ => self.skip(&rel, "it is not a regular file or a directory")?,
            }
        }
    }

    fn no_room(&self, name: &str) -> Fail {
        Fail(
            "too-large",
            format!(
                "`{}` is deeper than the agent's open files leave a walk room for ({} descriptors; raise the session's limits.open_files)",
                name.escape_debug(),
                self.room
            ),
        )
    }

    /// Counts an entry left out of the archive, or, when `strict`, fails the archive there.
    fn skip(&mut self, name: &str, why: &str) -> Result<(), Fail> {
        if self.strict {
            return Err(Fail(
                "not-regular",
                format!(
                    "`{}`: {why} (the archive was asked for strict)",
                    name.escape_debug()
                ),
            ));
        }
        self.skipped += 1;
        Ok(())
    }

    /// Makes `h`'s block for `name`, after a GNU long-name entry when the name does not fit in
    /// the header's 100 bytes.
    fn header(&mut self, h: &mut tar::Header, name: &str) -> Result<(), Fail> {
        let bytes = name.as_bytes();
        if bytes.len() > 100 {
            let mut long = tar::Header::new_gnu();
            long.set_entry_type(tar::EntryType::GNULongName);
            long.set_mode(0o644);
            long.set_mtime(0);
            long.set_size(bytes.len() as u64 + 1);
            let old = long.as_old_mut();
            old.name[..13].copy_from_slice(b"././@LongLink");
            long.set_cksum();
            self.made.extend_from_slice(long.as_bytes());
            self.made.extend_from_slice(bytes);
            self.made.push(0);
            let pad = (BLOCK - (bytes.len() + 1) % BLOCK) % BLOCK;
            self.made.resize(self.made.len() + pad, 0);
            h.as_old_mut().name.copy_from_slice(&bytes[..100]);
        } else {
            h.set_path(name)
                .map_err(|e| Fail("invalid", format!("`{name}`: {e}")))?;
        }
        h.set_cksum();
        self.made.extend_from_slice(h.as_bytes());
        Ok(())
    }
}

fn is_symlink(dir: &OwnedFd, name: &str) -> bool {
    rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .map(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
        .unwrap_or(false)
}

/// Removes `name` in `dir` and everything under it, without following links.
fn remove_tree(dir: &OwnedFd, name: &std::ffi::CStr, depth: usize) -> Result<(), Fail> {
    if depth > 256 {
        return Err(Fail("invalid", "directory tree too deep".into()));
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // A few names at a time, removed, then the directory read again from its start: all its
    // names at once, at every level, took the agent past its room (100,000 long names, found by
    // an independent attack), and removing is how a full session makes room.
    loop {
        let batch: Vec<(std::ffi::CString, bool)> = rustix::fs::Dir::read_from(&sub)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_bytes() != b"." && e.file_name().to_bytes() != b"..")
            .take(REMOVE_BATCH)
            .map(|e| {
                (
                    e.file_name().to_owned(),
                    e.file_type() == FileType::Directory,
                )
            })
            .collect();
        if batch.is_empty() {
            break;
        }
        for (n, is_dir) in batch {
            if is_dir {
                remove_tree(&sub, &n, depth + 1)?;
            } else {
                rustix::fs::unlinkat(&sub, n.as_c_str(), rustix::fs::AtFlags::empty())?;
            }
        }
    }
    rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::REMOVEDIR)?;
    Ok(())
}
