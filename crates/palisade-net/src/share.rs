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
//! at the same count do not take places from each other back and forth.
//!
//! A place is taken from another sandbox only for a connection that has earned it: one the rules
//! allowed and whose upstream connection is made. Until then a connection that finds the process
//! full waits *pending*, holding no place (at most [`MAX_PENDING`] of a sandbox at once; one
//! more is refused at once), so a bare `connect` and `close` from inside cuts nobody (found by
//! an independent attack: one that held nothing cut another sandbox's connections 2,000 times in
//! 5 s). A sandbox also cuts at most [`CUTS_PER_S`] a second (after a burst of [`CUT_BURST`]),
//! so one that opens and closes allowed connections as fast as its pace lets it cannot keep
//! another's cut, and its report counts what it took (`took_connections`). A pending connection
//! that finds no place it may take is refused, with an event that says so.
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
    /// Each proxy with at least one place or one pending connection, and its connections in the
    /// order they came.
    holders: Vec<Holder>,
}

struct Holder {
    proxy: u64,
    conns: Vec<Arc<Conn>>,
    /// Connections of this proxy waiting, without a place, for their upstream connection.
    pending: usize,
}

/// Most connections of one sandbox that wait, without a place, for the right to take one.
pub(crate) const MAX_PENDING: usize = 4;
/// Places a sandbox may take from others a second, sustained, and at once after a quiet while.
pub(crate) const CUTS_PER_S: f64 = 8.0;
pub(crate) const CUT_BURST: f64 = 32.0;

/// A sandbox's turns to take places from others ([`CUTS_PER_S`], [`CUT_BURST`]).
pub(crate) struct Cuts {
    tokens: f64,
    at: std::time::Instant,
}

impl Cuts {
    pub(crate) fn new() -> Cuts {
        Cuts {
            tokens: CUT_BURST,
            at: std::time::Instant::now(),
        }
    }

    pub(crate) fn try_take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let since = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now.max(self.at);
        self.tokens = (self.tokens + since * CUTS_PER_S).min(CUT_BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One connection's place: how it is cut, and when it last had something to move.
pub(crate) struct Conn {
    /// Signalled once, when the connection is cut; never read, so it stays readable.
    pub(crate) cut: OwnedFd,
    was_cut: AtomicBool,
    /// Milliseconds of the monotonic clock.
    active_ms: AtomicU64,
    /// Waits without a place ([`Share::settle`]).
    pending: AtomicBool,
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
    /// Every place is held, and this proxy may not wait for one or take one from another.
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

    /// A place for a new connection of `proxy`: a free one, or, when all are held, a pending
    /// one (no place yet: [`Share::settle`] takes one once the connection has earned it).
    pub(crate) fn take(&self, proxy: u64) -> Result<Arc<Conn>, Full> {
        let conn = Arc::new(Conn {
            cut: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                .map_err(|_| Full::Descriptors)?,
            was_cut: AtomicBool::new(false),
            active_ms: AtomicU64::new(now_ms()),
            pending: AtomicBool::new(false),
        });
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.cap.load(Ordering::SeqCst).max(1);
        let free = held.total < cap;
        let i = match held.holders.iter().position(|h| h.proxy == proxy) {
            Some(i) => i,
            None => {
                held.holders.push(Holder {
                    proxy,
                    conns: Vec::new(),
                    pending: 0,
                });
                held.holders.len() - 1
            }
        };
        let h = &mut held.holders[i];
        if free {
            h.conns.push(conn.clone());
            held.total += 1;
        } else if h.pending < MAX_PENDING {
            h.pending += 1;
            conn.pending.store(true, Ordering::Release);
        } else {
            if h.conns.is_empty() && h.pending == 0 {
                held.holders.swap_remove(i);
            }
            return Err(Full::Process);
        }
        Ok(conn)
    }

    /// Gives a pending `conn` of `proxy` a place, now that it has earned one: a free one, or one
    /// taken from the sandbox that holds the most, if that one holds at least two more than
    /// `proxy` and `cuts` has a turn (its longest-idle connection is cut). `Ok(true)` when a
    /// place was taken from another. A connection with a place already has nothing to do.
    pub(crate) fn settle(
        &self,
        proxy: u64,
        conn: &Arc<Conn>,
        cuts: &Mutex<Cuts>,
    ) -> Result<bool, Full> {
        if !conn.pending.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.cap.load(Ordering::SeqCst).max(1);
        let Some(me) = held.holders.iter().position(|h| h.proxy == proxy) else {
            return Err(Full::Process);
        };
        let mine = held.holders[me].conns.len();
        let mut took = false;
        if held.total >= cap {
            // The first of the largest holders: ties go to the one that came first.
            let most = held
                .holders
                .iter()
                .enumerate()
                .rev()
                .max_by_key(|(_, h)| h.conns.len())
                .map(|(i, h)| (i, h.conns.len()));
            let Some((v, _)) = most.filter(|&(_, n)| n >= mine + 2) else {
                return Err(Full::Process);
            };
            if !cuts.lock().unwrap_or_else(|e| e.into_inner()).try_take() {
                return Err(Full::Process);
            }
            // Its connection idle longest; among equals the one that came first.
            let victim = &mut held.holders[v].conns;
            let (at, _) = victim
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.active_ms.load(Ordering::Relaxed))
                .expect("a holder holds at least two places");
            victim.remove(at).cut();
            held.total -= 1;
            took = true;
        }
        let h = &mut held.holders[me];
        h.pending -= 1;
        h.conns.push(conn.clone());
        conn.pending.store(false, Ordering::Release);
        held.total += 1;
        Ok(took)
    }

    /// Gives `conn`'s place back (nothing if it was cut: its place went when it was), or its
    /// turn among the pending.
    pub(crate) fn give_back(&self, proxy: u64, conn: &Arc<Conn>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = held.holders.iter().position(|h| h.proxy == proxy) else {
            return;
        };
        let h = &mut held.holders[i];
        if conn.pending.swap(false, Ordering::AcqRel) {
            h.pending -= 1;
        } else if let Some(at) = h.conns.iter().position(|c| Arc::ptr_eq(c, conn)) {
            h.conns.remove(at);
            held.total -= 1;
        }
        let h = &held.holders[i];
        if h.conns.is_empty() && h.pending == 0 {
            held.holders.swap_remove(i);
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

/// Gives the calling thread's connection, if it waits without a place, the place it has now
/// earned (its destination allowed, its upstream connected: [`Share::settle`]); why not, if
/// there is none it may take.
pub(crate) fn settle(sh: &Shared) -> Result<(), &'static str> {
    let Some(conn) = current() else {
        return Ok(());
    };
    match sh.limits.share.settle(sh.id, &conn, &sh.cuts) {
        Ok(took) => {
            if took {
                sh.took.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
        Err(_) => Err(
            "the server's proxies have all their connections open, and no other sandbox holds two more than this one (or this sandbox took places from others faster than it may)",
        ),
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
                        "the server's proxies have all their connections open, and this sandbox has as many waiting for one as it may"
                    }
                    Full::Descriptors => "the supervisor is out of file descriptors",
                })
            }
        }
    }

    /// Makes this the connection the calling thread serves, so that its waits also end when it is
    /// cut, and [`settle`] finds it.
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
