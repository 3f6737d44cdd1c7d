//! The connections that all the proxies of one process hold together, and how a full process
//! shares them out between its sandboxes.
//!
//! Each open connection holds a supervisor thread, up to seven descriptors and its relay's
//! buffers, which no sandbox's cgroup is charged for; so the process holds at most
//! [`crate::MAX_CONNECTIONS_IN_PROCESS`] of them at once, all its proxies together. A first-come
//! cap alone would let a few sandboxes fill it with idle connections and leave every other
//! sandbox of the server with none: eight at their own cap of 128 fill 1,024. An idle timeout
//! would not stop that either, since a connection that sends a byte now and then is not idle.
//!
//! So when the process is full, a sandbox that holds fewer connections than another takes a
//! place from the sandbox that holds the most, if that one holds at least two more than it:
//! that sandbox's connection that has waited longest without anything to move is cut (its
//! thread ends at its next wait, as at the end of a run). The shares converge on max-min
//! fairness: each of `n` sandboxes that wants them gets at least `cap / n` places, whatever the
//! others hold, and no sandbox can cut another's below its own count plus one, so two sandboxes
//! at the same count do not take places from each other back and forth. A connection past that
//! is refused at once, as one past the sandbox's own cap.
//!
//! A connection's thread finds its cut signal through [`Place::enter`], which [`wait`] polls
//! beside the proxy's stop signal.
//!
//! [`wait`]: crate::relay::wait

use crate::Shared;
use rustix::event::{eventfd, EventfdFlags};
use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The places of one process's proxies (or of a unit test's).
pub(crate) struct Share {
    cap: AtomicUsize,
    held: Mutex<Held>,
}

struct Held {
    /// Places held, all holders together.
    total: usize,
    /// Each proxy with at least one place, and its connections in the order they came.
    holders: Vec<Holder>,
}

struct Holder {
    proxy: u64,
    conns: Vec<Arc<Conn>>,
}

/// One connection's place: how it is cut, and when it last had something to move.
pub(crate) struct Conn {
    /// Signalled once, when the connection is cut; never read, so it stays readable.
    pub(crate) cut: OwnedFd,
    was_cut: AtomicBool,
    /// Milliseconds of the monotonic clock.
    active_ms: AtomicU64,
}

impl Conn {
    /// That the connection had something to move now.
    pub(crate) fn touch(&self) {
        self.active_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn was_cut(&self) -> bool {
        self.was_cut.load(Ordering::Acquire)
    }

    fn cut(&self) {
        self.was_cut.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.cut, &1u64.to_ne_bytes());
    }
}

fn now_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1000 + (t.tv_nsec as u64) / 1_000_000
}

/// Why a new connection gets no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// Every place is held, and this proxy holds at least as many as any other less one.
    Process,
    /// No descriptor for the cut signal.
    Descriptors,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("cap", &self.cap.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Share {
    pub(crate) const fn new(cap: usize) -> Share {
        Share {
            cap: AtomicUsize::new(cap),
            held: Mutex::new(Held {
                total: 0,
                holders: Vec::new(),
            }),
        }
    }

    pub(crate) fn set_cap(&self, cap: usize) {
        self.cap.store(cap.max(1), Ordering::SeqCst);
    }

    /// A place for a new connection of `proxy`: a free one, or, when all are held, one taken from
    /// the proxy that holds the most if it holds at least two more than `proxy` (its longest-idle
    /// connection is cut).
    pub(crate) fn take(&self, proxy: u64) -> Result<Arc<Conn>, Full> {
        let conn = Arc::new(Conn {
            cut: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                .map_err(|_| Full::Descriptors)?,
            was_cut: AtomicBool::new(false),
            active_ms: AtomicU64::new(now_ms()),
        });
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.cap.load(Ordering::SeqCst).max(1);
        let mine = held
            .holders
            .iter()
            .position(|h| h.proxy == proxy)
            .map_or(0, |i| held.holders[i].conns.len());
        if held.total >= cap {
            // The first of the largest holders: ties go to the one that came first.
            let most = held
                .holders
                .iter()
                .enumerate()
                .rev()
                .max_by_key(|(_, h)| h.conns.len())
                .map(|(i, h)| (i, h.conns.len()));
            let Some((v, n)) = most.filter(|&(_, n)| n >= mine + 2) else {
                return Err(Full::Process);
            };
            // Its connection idle longest; among equals the one that came first.
            let victim = &mut held.holders[v].conns;
            let (at, _) = victim
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.active_ms.load(Ordering::Relaxed))
                .expect("a holder holds at least one place");
            let c = victim.remove(at);
            c.cut();
            debug_assert!(n >= 2);
            held.total -= 1;
        }
        match held.holders.iter_mut().find(|h| h.proxy == proxy) {
            Some(h) => h.conns.push(conn.clone()),
            None => held.holders.push(Holder {
                proxy,
                conns: vec![conn.clone()],
            }),
        }
        held.total += 1;
        Ok(conn)
    }

    /// Gives `conn`'s place back (nothing if it was cut: its place went when it was).
    pub(crate) fn give_back(&self, proxy: u64, conn: &Arc<Conn>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = held.holders.iter().position(|h| h.proxy == proxy) else {
            return;
        };
        let conns = &mut held.holders[i].conns;
        if let Some(at) = conns.iter().position(|c| Arc::ptr_eq(c, conn)) {
            conns.remove(at);
            let empty = conns.is_empty();
            held.total -= 1;
            if empty {
                held.holders.swap_remove(i);
            }
        }
    }

    /// Places held now, all proxies together.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

thread_local! {
    /// The connection the calling thread serves, if it serves one.
    static CURRENT: RefCell<Option<Arc<Conn>>> = const { RefCell::new(None) };
}

/// The connection the calling thread serves ([`Place::enter`]).
pub(crate) fn current() -> Option<Arc<Conn>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Why a wait that ended early ended, for the log: the run's end, or this connection's cut.
pub(crate) fn why_stopped() -> &'static str {
    if current().is_some_and(|c| c.was_cut()) {
        "the connection was cut to give another sandbox its share of the proxies' connections"
    } else {
        "the run ended"
    }
}

/// A connection's place among its proxy's and the process's; given back when dropped.
pub(crate) struct Place {
    sh: Arc<Shared>,
    conn: Arc<Conn>,
}

impl Place {
    /// Takes a new connection's place among `sh`'s open connections and the process's; why not,
    /// if either is full (nothing taken then).
    pub(crate) fn take(sh: &Arc<Shared>) -> Result<Place, &'static str> {
        if sh.open.fetch_add(1, Ordering::SeqCst) >= sh.limits.connections {
            sh.open.fetch_sub(1, Ordering::SeqCst);
            return Err("the sandbox has too many connections open through the proxy");
        }
        match sh.limits.share.take(sh.id) {
            Ok(conn) => Ok(Place {
                sh: sh.clone(),
                conn,
            }),
            Err(full) => {
                sh.open.fetch_sub(1, Ordering::SeqCst);
                Err(match full {
                    Full::Process => {
                        "the server's proxies have all their connections open, this sandbox as many as any other"
                    }
                    Full::Descriptors => "the supervisor is out of file descriptors",
                })
            }
        }
    }

    /// Makes this the connection the calling thread serves, so that its waits also end when it is
    /// cut.
    pub(crate) fn enter(&self) {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.conn.clone()));
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().is_some_and(|x| Arc::ptr_eq(x, &self.conn)) {
                *c = None;
            }
        });
        if self.conn.was_cut() {
            self.sh.cut.fetch_add(1, Ordering::Relaxed);
        }
        self.sh.limits.share.give_back(self.sh.id, &self.conn);
        self.sh.open.fetch_sub(1, Ordering::SeqCst);
    }
}
