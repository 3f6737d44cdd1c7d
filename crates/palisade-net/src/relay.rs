//! The proxy's I/O: waits that end at a deadline or when the proxy stops, the upstream
//! connection, the relay of an allowed connection in one thread, and the CPU meter.
//!
//! Every socket here is non-blocking and every wait is a `poll` that includes the proxy's stop
//! signal, so no thread can be held past [`crate::Egress::finish`] by a client that stops reading
//! or writing.

use crate::Shared;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Some socket is ready (or has an error or hang-up to report).
    Ready,
    /// The deadline passed.
    Deadline,
    /// The proxy is stopping.
    Stop,
}

/// Why a handler gave up: the proxy is stopping.
#[derive(Debug)]
struct Stopping;

impl std::fmt::Display for Stopping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(crate::share::why_stopped())
    }
}

impl std::error::Error for Stopping {}

/// The error a handler returns when the proxy stops under it.
pub(crate) fn stopping() -> io::Error {
    io::Error::other(Stopping)
}

/// Whether `e` is [`stopping`]'s.
pub(crate) fn is_stopping(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Stopping>())
}

/// Waits until one of `fds` is ready for its events, `deadline` passes, or the proxy stops (which
/// wins over the other two); in a connection's thread, the connection's cut
/// ([`crate::share`]) counts as the proxy's stop.
pub(crate) fn wait(sh: &Shared, fds: &[PollFd<'_>], deadline: Option<Instant>) -> Wake {
    wait_seen(sh, fds, deadline).0
}

/// [`wait`], and which of `fds` had something to report (bit `i` for `fds[i]`, the first 32).
pub(crate) fn wait_seen(sh: &Shared, fds: &[PollFd<'_>], deadline: Option<Instant>) -> (Wake, u32) {
    let conn = crate::share::current();
    let mut all: Vec<PollFd<'_>> = fds.to_vec();
    all.push(PollFd::new(&sh.stop, PollFlags::IN));
    if let Some(c) = &conn {
        all.push(PollFd::new(&c.cut, PollFlags::IN));
    }
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => {
                // Past the deadline, poll once without waiting: the stop signal still counts.
                let left = d.saturating_duration_since(Instant::now());
                Some(Timespec {
                    tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX),
                    tv_nsec: left.subsec_nanos().into(),
                })
            }
        };
        match poll(&mut all, timeout.as_ref()) {
            Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => return (Wake::Deadline, 0),
            Ok(0) => continue,
            Ok(_) => {
                if all[fds.len()..].iter().any(|f| !f.revents().is_empty()) {
                    return (Wake::Stop, 0);
                }
                if let Some(c) = &conn {
                    c.touch();
                }
                let seen = all[..fds.len()]
                    .iter()
                    .take(32)
                    .enumerate()
                    .filter(|(_, f)| !f.revents().is_empty())
                    .fold(0u32, |m, (i, _)| m | 1 << i);
                return (Wake::Ready, seen);
            }
            Err(Errno::INTR) => continue,
            // poll fails only for bad arguments or no memory: stop waiting rather than spin.
            Err(_) => return (Wake::Stop, 0),
        }
    }
}

/// Waits for one socket.
pub(crate) fn wait_one(
    sh: &Shared,
    fd: BorrowedFd<'_>,
    events: PollFlags,
    deadline: Option<Instant>,
) -> Wake {
    wait(sh, &[PollFd::from_borrowed_fd(fd, events)], deadline)
}

/// Reads what is there (at most `buf.len()`), waiting until `deadline`: `Ok(None)` when it passed.
pub(crate) fn read_by(
    sh: &Shared,
    mut s: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<Option<usize>> {
    loop {
        match s.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        match wait_one(sh, s.as_fd(), PollFlags::IN, Some(deadline)) {
            Wake::Ready => {}
            Wake::Deadline => return Ok(None),
            Wake::Stop => return Err(stopping()),
        }
    }
}

/// Fills `buf`, by `deadline`; end of file or the deadline is an error.
pub(crate) fn read_exact_by(
    sh: &Shared,
    s: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match read_by(sh, s, &mut buf[at..], deadline)? {
            Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Some(n) => at += n,
            None => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    Ok(())
}

/// How long a reply to the client may take to be written (it is small: a client that reads
/// nothing at all runs into this only if it also fills its receive buffer).
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// Writes all of `bytes` to the client, within [`REPLY_WAIT`].
pub(crate) fn write_all(sh: &Shared, mut s: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + REPLY_WAIT;
    while !bytes.is_empty() {
        match s.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        match wait_one(sh, s.as_fd(), PollFlags::OUT, Some(deadline)) {
            Wake::Ready => {}
            Wake::Deadline => return Err(io::ErrorKind::TimedOut.into()),
            Wake::Stop => return Err(stopping()),
        }
    }
    Ok(())
}

/// A non-blocking TCP connection to `to`, made within `timeout` (or until the proxy stops).
pub(crate) fn connect(sh: &Shared, to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let family = match to {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    match rustix::net::connect(&fd, &to) {
        Ok(()) => {}
        Err(Errno::INPROGRESS) | Err(Errno::INTR) => {
            match wait_one(
                sh,
                fd.as_fd(),
                PollFlags::OUT,
                Some(Instant::now() + timeout),
            ) {
                Wake::Ready => sockopt::socket_error(&fd)??,
                Wake::Deadline => return Err(io::ErrorKind::TimedOut.into()),
                Wake::Stop => return Err(stopping()),
            }
        }
        Err(e) => return Err(e.into()),
    }
    let s = TcpStream::from(fd);
    // What the client wrote as one piece leaves as one: without it a small write behind another
    // (a TLS client's request after its Finished, a request's body after its head) waits for
    // the server's delayed acknowledgment, 40 ms on Linux.
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Adds the calling thread's CPU time to the proxy's total as it goes, and at the end.
pub(crate) struct CpuMeter<'a> {
    total: &'a AtomicU64,
    seen: u64,
}

impl<'a> CpuMeter<'a> {
    /// Counts from now: a thread from a pool has spent CPU on earlier work
    /// (`palisade_linux::pool`).
    pub(crate) fn new(total: &'a AtomicU64) -> CpuMeter<'a> {
        CpuMeter {
            total,
            seen: thread_cpu_ns(),
        }
    }

    /// Adds what the thread spent since the last tick.
    pub(crate) fn tick(&mut self) {
        let now = thread_cpu_ns();
        self.total
            .fetch_add(now.saturating_sub(self.seen), Ordering::Relaxed);
        self.seen = self.seen.max(now);
    }
}

/// The calling thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    use rustix::time::{clock_gettime, ClockId};
    let t = clock_gettime(ClockId::ThreadCPUTime);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

impl Drop for CpuMeter<'_> {
    fn drop(&mut self) {
        self.tick();
    }
}

/// Most bytes moved in one step of a relay, and the pipe size asked for.
const STEP: usize = 1 << 20;
/// Most steps (each up to [`STEP`] bytes) one direction takes before the relay looks at the stop
/// signal and the other direction again.
const ROUND: usize = 16;
/// The buffer of a relay that cannot splice.
const COPY_BUF: usize = 64 * 1024;

/// Pages of pipe buffer the relays of this process hold ([`PipePages`]).
static PIPE_PAGES: AtomicU64 = AtomicU64::new(0);

/// The most pages of pipe buffer the relays of this process may hold. The kernel counts pipe
/// buffers per user, and past `/proc/sys/fs/pipe-user-pages-soft` (16,384 pages by default)
/// every new pipe of that user's, in any of its processes, gets 2 pages instead of 16, and may
/// not be grown: 32 relays of 1 MiB pipes (two each) took a non-root supervisor there, and with
/// it the host's other processes of the same user. So a non-root process keeps to a quarter of
/// the soft limit; a relay past it has a pipe of the default size, or none (it copies through a
/// buffer). Root is not held to the limit by the kernel.
fn pipe_budget() -> u64 {
    static BUDGET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        if rustix::process::geteuid().is_root() {
            return u64::MAX;
        }
        match std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft")
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        {
            Some(0) => u64::MAX, // no limit
            Some(soft) => soft / 4,
            None => 4096,
        }
    })
}

/// Pages of pipe buffer one relay direction holds, counted in [`PIPE_PAGES`] until dropped.
struct PipePages(u64);

impl PipePages {
    /// `n` more pages, if the budget has them.
    fn take(&mut self, n: u64) -> bool {
        let budget = pipe_budget();
        let got = PIPE_PAGES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(n).filter(|t| *t <= budget)
        });
        if got.is_ok() {
            self.0 += n;
        }
        got.is_ok()
    }
}

impl Drop for PipePages {
    fn drop(&mut self) {
        PIPE_PAGES.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// A pipe for a relay direction, within this process's budget of pipe pages ([`pipe_budget`]):
/// of [`STEP`] bytes where the budget has them, else of the kernel's default size, else none.
fn relay_pipe() -> (Option<(OwnedFd, OwnedFd)>, PipePages) {
    use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags};
    let page = rustix::param::page_size() as u64;
    let mut pages = PipePages(0);
    let Ok((r, w)) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) else {
        return (None, pages);
    };
    let default = fcntl_getpipe_size(&w).map_or(16, |b| (b as u64).div_ceil(page));
    if !pages.take(default) {
        return (None, pages);
    }
    let more = (STEP as u64).div_ceil(page).saturating_sub(default);
    if more > 0 && pages.take(more) && fcntl_setpipe_size(&w, STEP).is_err() {
        // Refused (a host's `pipe-max-size` below it): what it has is what is counted.
        PIPE_PAGES.fetch_sub(more, Ordering::AcqRel);
        pages.0 -= more;
    }
    (Some((r, w)), pages)
}

/// One direction of a relay: bytes taken from `from`, then given to `to` before any more are
/// taken, through a pipe with splice (they stay in the kernel) or, where splice is refused,
/// through a buffer.
struct Flow<'a> {
    from: &'a TcpStream,
    to: &'a TcpStream,
    /// Read end, write end.
    pipe: Option<(OwnedFd, OwnedFd)>,
    /// What the pipe holds of this process's budget ([`relay_pipe`]).
    _pages: PipePages,
    /// Bytes to give first (what the proxy read before deciding), or the copy buffer's content.
    buf: Vec<u8>,
    at: usize,
    in_pipe: usize,
    eof: bool,
    done: bool,
    count: &'a AtomicU64,
}

impl<'a> Flow<'a> {
    fn new(from: &'a TcpStream, to: &'a TcpStream, first: Vec<u8>, count: &'a AtomicU64) -> Self {
        let (pipe, pages) = relay_pipe();
        Flow {
            from,
            to,
            pipe,
            _pages: pages,
            buf: first,
            at: 0,
            in_pipe: 0,
            eof: false,
            done: false,
            count,
        }
    }

    fn held(&self) -> bool {
        self.at < self.buf.len() || self.in_pipe > 0
    }

    /// The events to wait for on `from` and on `to`.
    fn wants(&self) -> (PollFlags, PollFlags) {
        if self.done {
            (PollFlags::empty(), PollFlags::empty())
        } else if self.held() {
            (PollFlags::empty(), PollFlags::OUT)
        } else {
            (PollFlags::IN, PollFlags::empty())
        }
    }

    /// Moves what can be moved without waiting, up to [`ROUND`] steps; true if anything
    /// happened.
    fn step(&mut self) -> bool {
        use rustix::pipe::{splice, SpliceFlags};
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        let mut moved = false;
        for _ in 0..ROUND {
            if self.done {
                break;
            }
            if self.at < self.buf.len() {
                let mut to = self.to;
                match to.write(&self.buf[self.at..]) {
                    Ok(0) => self.end(),
                    Ok(n) => {
                        self.at += n;
                        self.count.fetch_add(n as u64, Ordering::Relaxed);
                        if self.at == self.buf.len() {
                            self.buf.clear();
                            self.at = 0;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return moved,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => self.end(),
                }
            } else if let (true, Some((r, _))) = (self.in_pipe > 0, &self.pipe) {
                match splice(r, None, self.to, None, self.in_pipe, flags) {
                    Ok(0) => self.end(),
                    Ok(n) => {
                        self.in_pipe -= n;
                        self.count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(Errno::AGAIN) => return moved,
                    Err(Errno::INTR) => continue,
                    Err(_) => self.end(),
                }
            } else if self.eof {
                self.end();
            } else if let Some((_, w)) = &self.pipe {
                match splice(self.from, None, w, None, STEP, flags) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.in_pipe = n,
                    Err(Errno::AGAIN) => return moved,
                    Err(Errno::INTR) => continue,
                    // Nothing spliced yet and splice refused: copy instead.
                    Err(Errno::INVAL) if self.count.load(Ordering::Relaxed) == 0 => {
                        self.pipe = None;
                    }
                    Err(_) => self.eof = true,
                }
            } else {
                self.buf.resize(COPY_BUF, 0);
                let mut from = self.from;
                match from.read(&mut self.buf) {
                    Ok(n) => {
                        self.buf.truncate(n);
                        self.eof = n == 0;
                    }
                    Err(e) => {
                        self.buf.clear();
                        match e.kind() {
                            io::ErrorKind::WouldBlock => return moved,
                            io::ErrorKind::Interrupted => continue,
                            _ => self.eof = true,
                        }
                    }
                }
            }
            moved = true;
        }
        moved
    }

    /// Half-closes: no more from `from`, none more to `to`.
    fn end(&mut self) {
        let _ = self.to.shutdown(Shutdown::Write);
        let _ = self.from.shutdown(Shutdown::Read);
        self.done = true;
    }
}

/// Relays between the client and the upstream until both directions are done, or the proxy
/// stops; `first` goes upstream before anything else. One thread, both directions.
pub(crate) fn relay(
    sh: &Shared,
    client: &TcpStream,
    upstream: &TcpStream,
    first: Vec<u8>,
    (out, inn): (&AtomicU64, &AtomicU64),
    meter: &mut CpuMeter<'_>,
) {
    let mut up = Flow::new(client, upstream, first, out);
    let mut down = Flow::new(upstream, client, Vec::new(), inn);
    loop {
        let moved = up.step() | down.step();
        if up.done && down.done {
            return;
        }
        let (up_from, up_to) = up.wants();
        let (down_from, down_to) = down.wants();
        // A socket with nothing to wait for is left out: its hang-up or error would otherwise
        // wake the poll again and again while the other side is the one that must move.
        let fds: Vec<PollFd<'_>> = [(client, up_from | down_to), (upstream, down_from | up_to)]
            .into_iter()
            .filter(|(_, ev)| !ev.is_empty())
            .map(|(s, ev)| PollFd::new(s, ev))
            .collect();
        // After progress, only look (more may be ready, and the stop signal counts); else wait.
        let woke = wait(sh, &fds, moved.then(Instant::now));
        meter.tick();
        if woke == Wake::Stop {
            return;
        }
    }
}
