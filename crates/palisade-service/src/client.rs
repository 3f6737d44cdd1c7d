//! The server's end of the agent's control socket. Every byte from the agent is untrusted: frame
//! sizes are bounded, headers must parse as the protocol's types, descriptors are accepted only
//! with an exec's reply (three, each a pipe of the right direction) and closed otherwise, and no
//! path that comes back is ever used on the host.
//!
//! Nothing the agent controls is waited for without a bound: every call has a deadline, and an
//! agent that misses one (stopped by the code, which runs as its user, or stuck) is taken for
//! broken at once: the connection is declared gone, which wakes every waiter and lets the
//! session's reaper kill the whole sandbox. The agent serves one request at a time, in order,
//! so a call's deadline counts from the latest deadline of the calls before it still waiting
//! (a `signal` queued behind a long file operation is given that operation's time too).

use crate::budget::{Budget, Charge};
use crate::proto::{self, Entry, Event, Request};
use bytes::Bytes;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::io::Interest;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// Most descriptors that may wait for their frame.
const MAX_PENDING_FDS: usize = 16;
/// Most descriptors the server sends with one frame (an exec's cgroup: one file on v1 and v2).
const MAX_SENT_FDS: usize = 4;
/// How long the agent may take to answer a control call (start a program, send a signal): it
/// does either at once, so missing this means it is stopped or broken.
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(20);
/// How long the agent may take for a file call (write, read, list, remove, archive) on top of
/// the time to move its data at [`TRANSFER_FLOOR`].
pub const FILE_DEADLINE: Duration = Duration::from_secs(120);
/// The slowest rate at which the agent is still taken to be moving a file's data, in bytes per
/// second.
pub const TRANSFER_FLOOR: u64 = 1 << 20;

/// A reply to one request.
#[derive(Debug)]
pub enum Reply {
    /// Done: entries (list), data (read), pid and pipes (exec).
    Ok {
        entries: Vec<Entry>,
        data: Vec<u8>,
        /// `data`'s bytes, counted against the server's budget of bytes held for replies.
        held: Charge,
        pid: Option<i32>,
        fds: Vec<OwnedFd>,
        skipped: Option<u64>,
        /// A listing cut to what fits in one frame.
        truncated: bool,
        /// An exec's: whether its process entered the cgroups it was given.
        joined: Option<bool>,
        /// A read's: the file it read, as it was when opened.
        file: Option<proto::FileId>,
    },
    /// Failed, with the agent's code and message.
    Err { code: String, message: String },
    /// Not kept: the answer's pieces did not fit in the server's budget of bytes held. The
    /// server's own word, which no answer of the agent can make.
    Full,
}

/// How an exec ended, as the agent saw it.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub wall_ms: f64,
    /// CPU time of the program and the descendants it waited for, as the agent read it (a
    /// figure from inside the sandbox: checked finite and not negative, else `None`).
    pub cpu_ms: Option<f64>,
}

/// The agent is gone or spoke out of protocol.
#[derive(Debug, Clone)]
pub struct Lost(pub String);

struct Shared {
    /// Calls waiting for their reply, each with its deadline.
    pending: Mutex<HashMap<u64, (oneshot::Sender<Reply>, tokio::time::Instant)>>,
    exits: Mutex<HashMap<u64, oneshot::Sender<Exit>>>,
    dead: AtomicBool,
    why: Mutex<Option<String>>,
    gone: tokio::sync::Notify,
}

impl Shared {
    /// The agent is gone (the first reason given stays): every waiter wakes with an error.
    fn die(&self, why: String) {
        {
            let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
            if w.is_none() {
                *w = Some(why);
            }
        }
        self.dead.store(true, Ordering::SeqCst);
        // Dropping the senders wakes every waiter with an error.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.exits.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.gone.notify_waiters();
    }
}

/// How long the agent may take to answer `req`, whose frame carries `data` bytes.
fn allowance(req: &Request, data: usize) -> Duration {
    let moving = |bytes: u64| Duration::from_secs(bytes / TRANSFER_FLOOR);
    match req {
        Request::Exec { .. } | Request::Signal { .. } => CONTROL_DEADLINE,
        Request::Read { len: Some(n), .. } => FILE_DEADLINE + moving(*n),
        Request::Read { max, .. } => FILE_DEADLINE + moving(*max),
        Request::TarOut { len, .. } | Request::TarMore { len, .. } => FILE_DEADLINE + moving(*len),
        Request::TarDrop { .. } => CONTROL_DEADLINE,
        Request::Write { .. }
        | Request::TarIn { .. }
        | Request::Mkdir { .. }
        | Request::List { .. }
        | Request::Remove { .. } => FILE_DEADLINE + moving(data as u64),
    }
}

type Writer = tokio::sync::Mutex<Option<tokio::net::unix::OwnedWriteHalf>>;

/// A connection to one agent.
pub struct AgentConn {
    shared: Arc<Shared>,
    /// Shared with the tasks that write frames ([`write_frame`]).
    writer: Arc<Writer>,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    /// The server's budget of bytes held for replies.
    held: Budget,
}

/// A started exec: its pipes and the promise of its end.
pub struct Exec {
    pub id: u64,
    pub pid: i32,
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: oneshot::Receiver<Exit>,
    /// Whether its process entered the cgroups it was given (`false` when none were).
    pub joined: bool,
}

impl AgentConn {
    /// Takes the socket (the other end of the agent's fd 0). `max_data`: the largest answer's
    /// data the server accepts from the agent (a file read back), its pieces together; each
    /// piece is counted against `held` as it comes, and an answer whose pieces do not fit is
    /// not kept (the call fails `busy`).
    pub fn new(sock: std::fs::File, max_data: usize, held: Budget) -> std::io::Result<AgentConn> {
        let std_sock = std::os::unix::net::UnixStream::from(OwnedFd::from(sock));
        std_sock.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(std_sock)?;
        let (r, w) = stream.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            why: Mutex::new(None),
            gone: tokio::sync::Notify::new(),
        });
        let sh = shared.clone();
        let budget = held.clone();
        let reader = tokio::spawn(async move {
            let why = read_loop(r, &sh, max_data, budget).await;
            sh.die(why);
        });
        Ok(AgentConn {
            shared,
            writer: Arc::new(tokio::sync::Mutex::new(Some(w))),
            next: AtomicU64::new(1),
            reader,
            held,
        })
    }

    fn lost(&self) -> Lost {
        Lost(
            self.shared
                .why
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "the agent is gone".into()),
        )
    }

    /// Why the agent is gone (or "the agent is gone" while it is not).
    pub fn why(&self) -> String {
        self.lost().0
    }

    /// The server's budget of bytes held for replies, which this connection's answers count
    /// against.
    pub fn held(&self) -> &Budget {
        &self.held
    }

    /// Whether the agent is gone.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::SeqCst)
    }

    /// Waits until the agent is gone.
    pub async fn gone(&self) {
        let n = self.shared.gone.notified();
        if self.is_dead() {
            return;
        }
        n.await
    }

    /// A fresh request id.
    pub fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends `req` with `data` and waits for its reply, until its deadline: the agent serves
    /// requests in order, so the deadline is the latest of the calls still waiting (or now),
    /// plus this call's own allowance. Past it the agent is taken for broken (see the module's
    /// doc): the connection is gone and every call fails.
    pub async fn call(&self, req: Request, data: Bytes) -> Result<Reply, Lost> {
        self.call_fds(req, data, Vec::new()).await
    }

    /// [`AgentConn::call`] with descriptors that go with the request's frame.
    async fn call_fds(&self, req: Request, data: Bytes, fds: Vec<OwnedFd>) -> Result<Reply, Lost> {
        let id = req.id();
        let (tx, rx) = oneshot::channel();
        if self.is_dead() {
            return Err(self.lost());
        }
        let own = allowance(&req, data.len());
        let deadline = {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            let before = pending.values().map(|(_, d)| *d).max().unwrap_or(now);
            let deadline = before.max(now) + own;
            pending.insert(id, (tx, deadline));
            deadline
        };
        // The frame goes out whole whatever becomes of this call: a caller that is gone (a client
        // that walked away) must not leave a frame cut off half-way, whose missing bytes the
        // agent would take from the next request's (measured: the session was lost).
        let head = proto::encode_head(&req, data.len());
        let writer = self.writer.clone();
        let sent = tokio::spawn(async move { write_frame(&writer, &head, &data, &fds).await });
        let exchange = async {
            sent.await
                .map_err(|e| Lost(format!("writing to the agent: {e}")))??;
            rx.await.map_err(|_| self.lost())
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(r) => r,
            Err(_) => {
                let why = format!(
                    "the agent stopped answering: no reply to its `{}` request within its deadline (it was stopped, or is stuck)",
                    op_name(&req)
                );
                tracing::warn!(why, "agent taken for broken");
                self.shared.die(why);
                Err(self.lost())
            }
        }
    }

    /// Starts `argv`; the exit's receiver is registered before the request goes out. Its
    /// process enters the cgroups of `join` (files opened for writing: an exec's cgroup) before
    /// it starts the program.
    pub async fn exec(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
        join: &[std::fs::File],
    ) -> Result<Result<Exec, (String, String)>, Lost> {
        let id = self.id();
        let (etx, erx) = oneshot::channel();
        self.shared
            .exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, etx);
        // Their own copies for the frame's writer, which may outlive this call.
        let fds: Result<Vec<OwnedFd>, _> = join
            .iter()
            .map(|f| f.as_fd().try_clone_to_owned())
            .collect();
        let fds = match fds {
            Ok(f) => f,
            Err(e) => {
                self.shared
                    .exits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                return Ok(Err((
                    "io".into(),
                    format!("the exec's cgroup descriptors could not be copied: {e}"),
                )));
            }
        };
        let req = Request::Exec {
            id,
            argv,
            env,
            cwd,
            join: !join.is_empty(),
        };
        let reply = self.call_fds(req, Bytes::new(), fds).await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => return Err(e),
        };
        match reply {
            Reply::Ok {
                pid: Some(pid),
                fds,
                joined,
                ..
            } if fds.len() == 3 => {
                let mut it = fds.into_iter();
                let (i, o, e) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
                // Each must be a pipe of the right direction (tokio checks both), or the agent lied.
                let bad = |what: &str, err: std::io::Error| {
                    Lost(format!("the agent passed a bad {what} descriptor: {err}"))
                };
                let stdin = pipe::Sender::from_owned_fd(i).map_err(|e| bad("stdin", e))?;
                let stdout = pipe::Receiver::from_owned_fd(o).map_err(|e| bad("stdout", e))?;
                let stderr = pipe::Receiver::from_owned_fd(e).map_err(|e| bad("stderr", e))?;
                Ok(Ok(Exec {
                    id,
                    pid,
                    stdin: Some(stdin),
                    stdout,
                    stderr,
                    exit: erx,
                    // What the agent says of it: the exec's own count is used only then.
                    joined: !join.is_empty() && joined == Some(true),
                }))
            }
            Reply::Ok { .. } => Err(Lost(
                "the agent's exec reply had no pid or not three descriptors".into(),
            )),
            Reply::Full => Err(Lost("the agent answered an exec in pieces".into())),
            Reply::Err { code, message } => {
                self.shared
                    .exits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                Ok(Err((code, message)))
            }
        }
    }

    /// Sends a signal to an exec's process group.
    pub async fn signal(&self, exec: u64, signal: i32) -> Result<Reply, Lost> {
        let id = self.id();
        self.call(Request::Signal { id, exec, signal }, Bytes::new())
            .await
    }

    /// Closes the connection: the agent reads end of file and ends, and with it the sandbox.
    pub async fn close(&self) {
        if let Some(mut w) = self.writer.lock().await.take() {
            let _ = w.shutdown().await;
        }
    }
}

/// Writes one frame: `head` (its lengths and header), then `data` (not copied into it: a file
/// written in may be as large as the request body); `fds` go with its first bytes (`SCM_RIGHTS`).
async fn write_frame(
    writer: &Writer,
    head: &[u8],
    data: &[u8],
    fds: &[OwnedFd],
) -> Result<(), Lost> {
    let mut w = writer.lock().await;
    let Some(w) = w.as_mut() else {
        return Err(Lost("the connection to the agent is closed".into()));
    };
    let lost = |e: std::io::Error| Lost(format!("writing to the agent: {e}"));
    let mut sent = 0;
    if !fds.is_empty() {
        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        let stream: &tokio::net::UnixStream = w.as_ref();
        sent = loop {
            stream.writable().await.map_err(lost)?;
            let r = stream.try_io(Interest::WRITABLE, || {
                let mut space = [std::mem::MaybeUninit::<u8>::uninit();
                    rustix::cmsg_space!(ScmRights(MAX_SENT_FDS))];
                let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
                if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
                    return Err(std::io::Error::other("too many descriptors for one frame"));
                }
                rustix::net::sendmsg(
                    stream,
                    &[std::io::IoSlice::new(head)],
                    &mut control,
                    rustix::net::SendFlags::NOSIGNAL,
                )
                .map_err(std::io::Error::from)
            });
            match r {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(lost(e)),
            }
        };
    }
    w.write_all(&head[sent..]).await.map_err(lost)?;
    w.write_all(data).await.map_err(lost)
}

/// The operation's name, for messages.
fn op_name(req: &Request) -> &'static str {
    match req {
        Request::Write { .. } => "write",
        Request::Mkdir { .. } => "mkdir",
        Request::Read { .. } => "read",
        Request::List { .. } => "list",
        Request::Remove { .. } => "remove",
        Request::Exec { .. } => "exec",
        Request::Signal { .. } => "signal",
        Request::TarOut { .. } => "tar_out",
        Request::TarMore { .. } => "tar_more",
        Request::TarDrop { .. } => "tar_drop",
        Request::TarIn { .. } => "tar_in",
    }
}

impl Drop for AgentConn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Reads frames until the agent closes or breaks the protocol; returns why it stopped.
async fn read_loop(
    r: tokio::net::unix::OwnedReadHalf,
    sh: &Shared,
    max_data: usize,
    held: Budget,
) -> String {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut fds: VecDeque<OwnedFd> = VecDeque::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut parts = Parts {
        by_id: HashMap::new(),
        bytes: 0,
        held,
        refused: None,
    };
    // The agent sends an answer's data in pieces of at most PART bytes, so the bytes of one
    // frame waiting here are bounded by that, not by the answer's.
    let frame_data = proto::PART.min(max_data);
    loop {
        // Every complete frame in the buffer first.
        while buf.len() >= 8 {
            let (h, d) = match proto::lengths(buf[..8].try_into().expect("8 bytes"), frame_data) {
                Ok(l) => l,
                Err(e) => return format!("the agent sent a bad frame: {e}"),
            };
            if buf.len() < 8 + h + d {
                break;
            }
            let ev: Event = match serde_json::from_slice(&buf[8..8 + h]) {
                Ok(e) => e,
                Err(e) => return format!("the agent sent a bad header: {e}"),
            };
            let data = buf[8 + h..8 + h + d].to_vec();
            buf.drain(..8 + h + d);
            if let Err(why) = dispatch(sh, ev, data, &mut fds, &mut parts, max_data) {
                return why;
            }
        }
        let res = r
            .as_ref()
            .async_io(Interest::READABLE, || {
                let mut space =
                    [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
                let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
                let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
                let m = rustix::net::recvmsg(
                    r.as_ref(),
                    &mut iov,
                    &mut control,
                    rustix::net::RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(std::io::Error::from)?;
                let mut got = Vec::new();
                for msg in control.drain() {
                    if let rustix::net::RecvAncillaryMessage::ScmRights(it) = msg {
                        got.extend(it);
                    }
                }
                let truncated = m.flags.contains(rustix::net::ReturnFlags::CTRUNC);
                Ok((m.bytes, got, truncated))
            })
            .await;
        match res {
            Ok((0, _, _)) => return "the agent closed its socket".into(),
            Ok((n, got, truncated)) => {
                if truncated {
                    return "the agent sent more descriptors than an exec's three".into();
                }
                fds.extend(got);
                if fds.len() > MAX_PENDING_FDS {
                    return "the agent sent descriptors without a frame for them".into();
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) => return format!("reading from the agent: {e}"),
        }
    }
}

/// The pieces of answers still to come ([`Event::Part`]), by request, with their bytes together
/// and what they are charged.
struct Parts {
    by_id: HashMap<u64, (Vec<u8>, Charge)>,
    bytes: usize,
    held: Budget,
    /// The call whose pieces did not fit in the budget: they are dropped as they come, and its
    /// answer is `busy`. (The agent answers one call at a time: one such call at most.)
    refused: Option<u64>,
}

impl Parts {
    /// Request `id`'s pieces, none left held.
    fn take(&mut self, id: u64) -> Option<(Vec<u8>, Charge)> {
        let p = self.by_id.remove(&id)?;
        self.bytes -= p.0.len();
        Some(p)
    }

    /// Counts `n` more bytes of `id`'s answer against the budget; `false` (and the call marked
    /// refused, its pieces dropped) when they do not fit.
    fn charge(&mut self, id: u64, n: usize) -> bool {
        if self.refused == Some(id) {
            return false;
        }
        let mut fits = true;
        if let Some((_, c)) = self.by_id.get_mut(&id) {
            fits = c.try_grow(n as u64);
        } else if n > 0 {
            match self.held.try_charge(n as u64) {
                Some(c) => {
                    self.by_id.insert(id, (Vec::new(), c));
                }
                None => fits = false,
            }
        }
        if !fits {
            self.take(id);
            self.refused = Some(id);
            let _ = self.held.refuse();
        }
        fits
    }
}

/// Hands an event to whoever waits for it. `Err`: the agent broke the protocol (more data in
/// pieces than one answer may have: the agent serves one request at a time, so the pieces held
/// at once are one answer's).
fn dispatch(
    sh: &Shared,
    ev: Event,
    mut data: Vec<u8>,
    fds: &mut VecDeque<OwnedFd>,
    parts: &mut Parts,
    max_data: usize,
) -> Result<(), String> {
    match ev {
        Event::Part { id } => {
            // Only for a call still waiting (one past its deadline has gone: its pieces too).
            let waiting = sh
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&id);
            if !waiting {
                return Ok(());
            }
            if parts.bytes + data.len() > max_data {
                return Err(format!(
                    "the agent sent more than {max_data} bytes of answers in pieces"
                ));
            }
            if parts.charge(id, data.len()) {
                parts.bytes += data.len();
                if let Some((p, _)) = parts.by_id.get_mut(&id) {
                    p.extend_from_slice(&data);
                }
            }
        }
        Event::Ok {
            id,
            entries,
            pid,
            skipped,
            truncated,
            joined,
            file,
        } => {
            // An exec's reply takes the three descriptors that came with it; any other reply
            // takes none (and a stray descriptor is closed when the queue is dropped or trimmed).
            let mine: Vec<OwnedFd> = if pid.is_some() {
                (0..3).filter_map(|_| fds.pop_front()).collect()
            } else {
                Vec::new()
            };
            let before = parts.by_id.get(&id).map_or(0, |p| p.0.len());
            if before + data.len() > max_data {
                return Err(format!(
                    "the agent sent an answer of more than {max_data} bytes"
                ));
            }
            let fits = parts.charge(id, data.len());
            let mut held = Charge::default();
            if let Some((mut p, c)) = parts.take(id) {
                p.extend_from_slice(&data);
                data = p;
                held = c;
            }
            let reply = if fits {
                Reply::Ok {
                    entries,
                    data,
                    held,
                    pid,
                    fds: mine,
                    skipped,
                    truncated,
                    joined,
                    file,
                }
            } else {
                parts.refused = None;
                Reply::Full
            };
            if let Some(tx) = sh
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)
            {
                let _ = tx.0.send(reply);
            }
        }
        Event::Err { id, code, message } => {
            parts.take(id);
            if parts.refused == Some(id) {
                parts.refused = None;
            }
            if let Some(tx) = sh
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)
            {
                let _ = tx.0.send(Reply::Err { code, message });
            }
        }
        Event::Exit {
            id,
            code,
            signal,
            wall_ms,
            cpu_ms,
        } => {
            if let Some(tx) = sh
                .exits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id)
            {
                let _ = tx.send(Exit {
                    code,
                    signal,
                    wall_ms,
                    cpu_ms: cpu_ms.filter(|c| c.is_finite() && *c >= 0.0),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Reads one request frame as the agent would; returns its id.
    fn request(sock: &mut std::os::unix::net::UnixStream) -> u64 {
        let mut prefix = [0u8; 8];
        sock.read_exact(&mut prefix).unwrap();
        let (h, d) = proto::lengths(&prefix, proto::MAX_DATA).unwrap();
        let mut rest = vec![0u8; h + d];
        sock.read_exact(&mut rest).unwrap();
        serde_json::from_slice::<Request>(&rest[..h]).unwrap().id()
    }

    /// An answer sent in pieces comes back whole; pieces for a call nobody waits for are
    /// dropped; pieces past the bound of one answer break the connection.
    #[tokio::test]
    async fn an_answer_in_pieces_is_put_together_and_bounded() {
        let (ours, mut agent) = std::os::unix::net::UnixStream::pair().unwrap();
        let conn = AgentConn::new(
            std::fs::File::from(OwnedFd::from(ours)),
            1000,
            Budget::new(1 << 20),
        )
        .unwrap();
        let fake = std::thread::spawn(move || {
            let id = request(&mut agent);
            for (ev, data) in [
                (Event::Part { id: id + 100 }, &[1u8; 600][..]),
                (Event::Part { id }, b"abc"),
                (Event::Part { id }, b"def"),
                (Event::ok(id), b"g"),
            ] {
                agent.write_all(&proto::encode(&ev, data)).unwrap();
            }
            let id = request(&mut agent);
            for _ in 0..2 {
                let f = proto::encode(&Event::Part { id }, &[2u8; 600]);
                agent.write_all(&f).unwrap();
            }
            // Open until the server side has read it all and given up.
            let _ = agent.read(&mut [0u8; 1]);
        });
        let read = |id| Request::Read {
            id,
            path: "f".into(),
            max: 1000,
            offset: 0,
            len: None,
        };
        match conn.call(read(conn.id()), Bytes::new()).await.unwrap() {
            Reply::Ok { data, .. } => assert_eq!(data, b"abcdefg"),
            other => panic!("{other:?}"),
        }
        let r = conn.call(read(conn.id()), Bytes::new()).await;
        assert!(r.is_err(), "{r:?}");
        assert!(
            conn.why().contains("more than 1000 bytes"),
            "{}",
            conn.why()
        );
        drop(conn);
        fake.join().unwrap();
    }

    /// An answer whose pieces do not fit in the server's budget of bytes held is not kept: the
    /// call fails `busy`, the connection goes on, and the next answer that fits comes whole. What
    /// an answer holds goes back when it is dropped.
    #[tokio::test]
    async fn an_answer_past_the_budget_is_refused_and_the_agent_goes_on() {
        let (ours, mut agent) = std::os::unix::net::UnixStream::pair().unwrap();
        let budget = Budget::new(1000);
        let conn = AgentConn::new(
            std::fs::File::from(OwnedFd::from(ours)),
            1 << 20,
            budget.clone(),
        )
        .unwrap();
        let fake = std::thread::spawn(move || {
            let id = request(&mut agent);
            for _ in 0..3 {
                let f = proto::encode(&Event::Part { id }, &[3u8; 400]);
                agent.write_all(&f).unwrap();
            }
            agent
                .write_all(&proto::encode(&Event::ok(id), b"x"))
                .unwrap();
            let id = request(&mut agent);
            agent
                .write_all(&proto::encode(&Event::Part { id }, &[4u8; 500]))
                .unwrap();
            agent
                .write_all(&proto::encode(&Event::ok(id), &[4u8; 499]))
                .unwrap();
            let _ = agent.read(&mut [0u8; 1]);
        });
        let read = |id| Request::Read {
            id,
            path: "f".into(),
            max: 1 << 20,
            offset: 0,
            len: None,
        };
        match conn.call(read(conn.id()), Bytes::new()).await.unwrap() {
            Reply::Full => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.refused(), 1);
        match conn.call(read(conn.id()), Bytes::new()).await.unwrap() {
            Reply::Ok { data, held, .. } => {
                assert_eq!(data.len(), 999);
                assert_eq!(held.bytes(), 999);
                assert_eq!(budget.held(), 999);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(budget.held(), 0);
        assert!(!conn.is_dead(), "{}", conn.why());
        drop(conn);
        fake.join().unwrap();
    }
}
