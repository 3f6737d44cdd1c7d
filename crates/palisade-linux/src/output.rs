//! Where the payload's output goes: a queue between the supervisor's loop, which must never
//! block (its deadline and CPU checks run in the same loop), and whoever consumes the output,
//! which may be slow or stalled (a terminal, an HTTP client, a full pipe).
//!
//! The loop only reads the sandbox's pipes while the queue has room: a consumer that falls behind
//! holds the payload back (its writes block, as on any full pipe), never the supervisor, and the
//! supervisor's memory stays within the queue's budget. Once the sandbox is dead, the loop drains
//! what is left in its pipes whatever the budget: that is bounded by the pipes' capacity and by the
//! output limit.

use crate::sys;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Which of the payload's streams a chunk came from. With a terminal, everything is `Stdout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output (or the pty).
    Stdout,
    /// Standard error.
    Stderr,
}

/// The next thing a consumer gets from an [`OutputQueue`].
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// Bytes the payload wrote.
    Chunk(Stream, Vec<u8>),
    /// Nothing arrived within the wait.
    Timeout,
    /// The run is over and everything was taken.
    Closed,
}

struct State {
    chunks: VecDeque<(Stream, Vec<u8>)>,
    bytes: usize,
    closed: bool,
    /// The loop stopped reading for lack of room and waits on `room` to be told.
    starved: bool,
}

/// A bounded queue of output chunks; see the module doc.
pub struct OutputQueue {
    state: Mutex<State>,
    ready: Condvar,
    /// Readable when a consumer made room after the loop ran out of it.
    room: OwnedFd,
    budget: usize,
}

impl OutputQueue {
    /// A queue that holds at most about `budget` bytes before the loop stops reading the
    /// sandbox's output (`usize::MAX`: never stops; the output limit still bounds it).
    pub fn new(budget: usize) -> std::io::Result<OutputQueue> {
        let fd = sys::eventfd().map_err(std::io::Error::from_raw_os_error)?;
        Ok(OutputQueue {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                bytes: 0,
                closed: false,
                starved: false,
            }),
            ready: Condvar::new(),
            room: fd,
            budget: budget.max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many more bytes the loop may read now; when 0 it polls [`Self::room_fd`].
    pub(crate) fn room(&self) -> usize {
        let mut s = self.lock();
        let room = self.budget.saturating_sub(s.bytes);
        s.starved = room == 0;
        room
    }

    pub(crate) fn room_fd(&self) -> RawFd {
        self.room.as_raw_fd()
    }

    /// Appends a chunk (the loop side).
    pub(crate) fn push(&self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut s = self.lock();
        s.bytes += data.len();
        match s.chunks.back_mut() {
            // Small writes of the same stream are merged, so a payload writing one byte at a time
            // costs the consumer one chunk per read, not one per byte.
            Some((st, last)) if *st == stream && last.len() < 64 * 1024 => {
                last.extend_from_slice(data)
            }
            _ => s.chunks.push_back((stream, data.to_vec())),
        }
        drop(s);
        self.ready.notify_all();
    }

    /// No more output will come: readers get what is queued, then the end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Takes the next chunk, waiting up to `wait` (`None`: until one comes or the run ends).
    pub fn recv(&self, wait: Option<Duration>) -> Received {
        let until = wait.map(|w| Instant::now() + w);
        let mut s = self.lock();
        loop {
            if let Some((stream, data)) = s.chunks.pop_front() {
                s.bytes -= data.len();
                if std::mem::take(&mut s.starved) {
                    sys::eventfd_signal(self.room.as_raw_fd());
                }
                return Received::Chunk(stream, data);
            }
            if s.closed {
                return Received::Closed;
            }
            s = match until {
                None => self.ready.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Received::Timeout;
                    }
                    self.ready
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// Takes everything queued so far, without waiting: stdout and stderr.
    pub fn take_all(&self) -> (Vec<u8>, Vec<u8>) {
        let mut s = self.lock();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for (stream, data) in s.chunks.drain(..) {
            match stream {
                Stream::Stdout => out.extend_from_slice(&data),
                Stream::Stderr => err.extend_from_slice(&data),
            }
        }
        s.bytes = 0;
        if std::mem::take(&mut s.starved) {
            sys::eventfd_signal(self.room.as_raw_fd());
        }
        (out, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_out_in_order_and_room_follows_the_budget() {
        let q = OutputQueue::new(10).unwrap();
        assert_eq!(q.room(), 10);
        q.push(Stream::Stdout, b"abc");
        q.push(Stream::Stdout, b"de");
        q.push(Stream::Stderr, b"xyz");
        assert_eq!(q.room(), 2);
        q.push(Stream::Stderr, b"12");
        assert_eq!(q.room(), 0);
        assert_eq!(
            q.recv(None),
            Received::Chunk(Stream::Stdout, b"abcde".to_vec())
        );
        assert_eq!(q.room(), 5);
        assert_eq!(
            q.recv(None),
            Received::Chunk(Stream::Stderr, b"xyz12".to_vec())
        );
        assert_eq!(q.recv(Some(Duration::from_millis(1))), Received::Timeout);
        q.close();
        assert_eq!(q.recv(None), Received::Closed);
    }

    #[test]
    fn a_consumer_that_makes_room_wakes_a_starved_loop() {
        let q = OutputQueue::new(4).unwrap();
        q.push(Stream::Stdout, b"full");
        assert_eq!(q.room(), 0); // the loop is starved now
        let mut fds = [libc::pollfd {
            fd: q.room_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(sys::poll(&mut fds, 0), Ok(0));
        let _ = q.recv(None);
        assert_eq!(sys::poll(&mut fds, 0), Ok(1));
        sys::eventfd_clear(q.room_fd());
        assert_eq!(sys::poll(&mut fds, 0), Ok(0));
    }

    #[test]
    fn take_all_splits_the_streams() {
        let q = OutputQueue::new(usize::MAX).unwrap();
        q.push(Stream::Stdout, b"a");
        q.push(Stream::Stderr, b"b");
        q.push(Stream::Stdout, b"c");
        assert_eq!(q.take_all(), (b"ac".to_vec(), b"b".to_vec()));
    }
}
