//! The server's budget of bytes held for replies (`--max-held`): programs' output captured, files
//! and archives read back, and the replies made of them, from the moment the server holds them
//! until the client has taken them. The sandbox decides how much it writes and the client how fast
//! it reads, so neither may decide how much of the server's memory that takes.
//!
//! Bytes are counted by [`Charge`]s, each given back when dropped. Two ways in:
//! - [`Budget::try_charge`]: bytes still to be read from a sandbox (output as it comes, a file's
//!   pieces) are taken only while they fit; what does not fit is not read (output is cut, a file
//!   read is refused `busy`).
//! - [`Budget::admit`] then [`Budget::force`]: work that will make a reply (a run, a read, an exec)
//!   starts only while the budget is not full; what it made is counted whatever its size, which is
//!   bounded by the work's own caps.
//!
//! So the bytes held are at most the budget plus what the work admitted at once can make past
//! it: one-shot runs' outputs (at most `--max-concurrency` of them at once), and copies made to
//! answer (a reply's JSON, at most about twice its bytes).
//!
//! What is kept for a client to fetch later (a background exec's result, [`Budget::keep`]) is
//! counted too, but the budget may drop it, oldest first, when it needs room: a budget filled by
//! results nobody fetches would otherwise refuse everyone's work for as long as their sessions
//! live.

use crate::ServiceError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The budget; cheap to clone.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.inner.limit)
            .field("held", &self.held())
            .finish()
    }
}

struct Inner {
    limit: u64,
    held: AtomicU64,
    /// Requests refused, outputs cut, and kept values dropped, because it was full.
    refused: AtomicU64,
    cut: AtomicU64,
    evicted: AtomicU64,
    /// Bytes of kept values still held (the most that dropping them all could give back).
    evictable: Arc<AtomicU64>,
    /// What was kept ([`Budget::keep`]), oldest first: dropped from the front when room is
    /// needed. An entry whose value is gone already is skipped.
    kept: Mutex<VecDeque<Weak<dyn Evict>>>,
}

/// A kept value the budget may drop.
trait Evict: Send + Sync {
    /// Drops the value; whether there was one.
    fn evict(&self) -> bool;
}

/// Entries of the kept queue past which the ones already gone are swept out.
const KEPT_SWEEP: usize = 8192;

/// A value kept for a client to fetch later, with its bytes counted against the budget until it
/// is dropped: with the `Kept`, or by the budget when it needs room (oldest first).
pub struct Kept<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Clone for Kept<T> {
    /// The same kept value (dropping a clone drops nothing; the budget may still drop it).
    fn clone(&self) -> Self {
        Kept {
            slot: self.slot.clone(),
        }
    }
}

struct Slot<T> {
    value: Mutex<Option<(T, Charge)>>,
    /// Its bytes, and the budget's count of kept bytes they are in.
    bytes: u64,
    evictable: Arc<AtomicU64>,
}

impl<T> Slot<T> {
    /// Takes the value out (and its bytes out of the kept count), if it is still there.
    fn take(&self) -> Option<(T, Charge)> {
        let v = self.value.lock().unwrap_or_else(|p| p.into_inner()).take();
        if v.is_some() {
            self.evictable.fetch_sub(self.bytes, Ordering::SeqCst);
        }
        v
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl<T: Send> Evict for Slot<T> {
    fn evict(&self) -> bool {
        // Taken out under the lock, dropped after it (with its charge).
        self.take().is_some()
    }
}

impl<T> Kept<T> {
    /// `f` of the value, or `None` when the budget has dropped it.
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let v = self.slot.value.lock().unwrap_or_else(|p| p.into_inner());
        v.as_ref().map(|(t, _)| f(t))
    }

    /// The bytes it holds (0 once dropped).
    pub fn bytes(&self) -> u64 {
        let v = self.slot.value.lock().unwrap_or_else(|p| p.into_inner());
        v.as_ref().map_or(0, |(_, c)| c.bytes())
    }
}

/// Bytes counted against a [`Budget`] until dropped. The default holds nothing.
#[derive(Debug, Default)]
pub struct Charge {
    of: Option<Budget>,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                limit,
                held: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                cut: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                evictable: Arc::new(AtomicU64::new(0)),
                kept: Mutex::new(VecDeque::new()),
            }),
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.inner.held.load(Ordering::SeqCst)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Requests refused `busy` because the budget was full.
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Outputs cut because the budget was full.
    pub fn cut(&self) -> u64 {
        self.inner.cut.load(Ordering::Relaxed)
    }

    /// Kept values dropped to make room.
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    /// Keeps `value`, holding `charge`, until the `Kept` is dropped or the budget needs its
    /// room.
    pub fn keep<T: Send + 'static>(&self, value: T, charge: Charge) -> Kept<T> {
        let bytes = charge.bytes();
        self.inner.evictable.fetch_add(bytes, Ordering::SeqCst);
        let slot = Arc::new(Slot {
            value: Mutex::new(Some((value, charge))),
            bytes,
            evictable: self.inner.evictable.clone(),
        });
        let weak: Weak<dyn Evict> = Arc::downgrade(&slot) as Weak<dyn Evict>;
        let mut q = self.inner.kept.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= KEPT_SWEEP {
            q.retain(|w| w.strong_count() > 0);
        }
        q.push_back(weak);
        Kept { slot }
    }

    /// Drops kept values, oldest first, until `fits` says the bytes held fit or none is left;
    /// none when dropping them all would not be enough (the request is refused anyway, and the
    /// results would be lost for nothing).
    fn make_room(&self, fits: impl Fn(u64) -> bool) {
        let held = self.held();
        if fits(held) {
            return;
        }
        let kept = self.inner.evictable.load(Ordering::SeqCst);
        if !fits(held.saturating_sub(kept)) {
            return;
        }
        loop {
            if fits(self.held()) {
                return;
            }
            let oldest = self
                .inner
                .kept
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            let Some(w) = oldest else { return };
            if let Some(slot) = w.upgrade() {
                if slot.evict() {
                    self.inner.evicted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Counts a request refused because the budget was full; the error that refuses it.
    pub fn refuse(&self) -> ServiceError {
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
        ServiceError::held_full(self.held(), self.inner.limit)
    }

    /// Counts an output cut because the budget was full.
    pub(crate) fn note_cut(&self) {
        self.inner.cut.fetch_add(1, Ordering::Relaxed);
    }

    /// An empty charge on this budget, to grow with [`Charge::try_grow`].
    pub fn charge(&self) -> Charge {
        Charge {
            of: Some(self.clone()),
            bytes: 0,
        }
    }

    /// `n` more bytes, if they fit.
    pub fn try_charge(&self, n: u64) -> Option<Charge> {
        let mut c = self.charge();
        c.try_grow(n).then_some(c)
    }

    fn fits(&self, n: u64) -> bool {
        self.held().saturating_add(n) <= self.inner.limit
    }

    /// `n` more bytes, whether they fit or not: for what admitted work made (see the module).
    pub fn force(&self, n: u64) -> Charge {
        self.inner.held.fetch_add(n, Ordering::SeqCst);
        Charge {
            of: Some(self.clone()),
            bytes: n,
        }
    }

    /// Whether work that makes a reply may start: `busy` (429, retry after a second) while the
    /// bytes held are at the limit or past it.
    pub fn admit(&self) -> Result<(), ServiceError> {
        let limit = self.inner.limit;
        self.make_room(|h| h < limit);
        let held = self.held();
        if held < limit {
            return Ok(());
        }
        Err(self.refuse())
    }

    /// Whether work may start now ([`Budget::admit`] without counting a refusal).
    pub fn has_room(&self) -> bool {
        let limit = self.inner.limit;
        self.make_room(|h| h < limit);
        self.held() < limit
    }

    /// `n` bytes held for work that may make that much (its largest answer), or `busy` when they
    /// do not fit; the work sets the charge to what it made when it ends ([`Charge::set`]).
    pub fn reserve(&self, n: u64) -> Result<Charge, ServiceError> {
        self.try_charge(n).ok_or_else(|| self.refuse())
    }

    /// [`Budget::admit`], then [`Budget::force`] of `n` bytes.
    pub fn admit_charge(&self, n: u64) -> Result<Charge, ServiceError> {
        self.admit()?;
        Ok(self.force(n))
    }

    fn give_back(&self, n: u64) {
        self.inner.held.fetch_sub(n, Ordering::SeqCst);
    }
}

impl Charge {
    /// Bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes `n` more bytes if they fit in its budget, once kept values are dropped to make
    /// room if need be (a charge of no budget: always).
    pub fn try_grow(&mut self, n: u64) -> bool {
        let Some(b) = &self.of else {
            return true;
        };
        if !b.fits(n) {
            b.make_room(|h| h.saturating_add(n) <= b.inner.limit);
        }
        let limit = b.inner.limit;
        let ok = b
            .inner
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                h.checked_add(n).filter(|t| *t <= limit)
            })
            .is_ok();
        if ok {
            self.bytes += n;
        }
        ok
    }

    /// Holds exactly `n` bytes from now on: more are taken whether they fit or not (the reply
    /// they stand for is made), fewer are given back.
    pub fn set(&mut self, n: u64) {
        let Some(b) = &self.of else {
            return;
        };
        if n > self.bytes {
            b.inner.held.fetch_add(n - self.bytes, Ordering::SeqCst);
        } else {
            b.give_back(self.bytes - n);
        }
        self.bytes = n;
    }

    /// An empty charge on the same budget (of none when this one is of none).
    pub fn budget_charge(&self) -> Charge {
        Charge {
            of: self.of.clone(),
            bytes: 0,
        }
    }

    /// Adds `other`'s bytes to this one (of the same budget, or this one of none).
    pub fn merge(&mut self, mut other: Charge) {
        if other.bytes == 0 {
            return;
        }
        if self.of.is_none() {
            std::mem::swap(self, &mut other);
            return;
        }
        self.bytes += other.bytes;
        other.bytes = 0;
    }
}

/// A reply and the bytes it holds: a front end keeps it (or its [`Charge`]) until the client has
/// taken the reply. It reads and serializes as the reply itself.
#[derive(Debug)]
pub struct Charged<T> {
    pub value: T,
    pub charge: Charge,
}

impl<T> Charged<T> {
    /// `value` holding `charge`.
    pub fn new(value: T, charge: Charge) -> Charged<T> {
        Charged { value, charge }
    }

    /// The reply and its charge, apart.
    pub fn into_parts(self) -> (T, Charge) {
        (self.value, self.charge)
    }

    /// The reply, its charge given back.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> std::ops::Deref for Charged<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Charged<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: serde::Serialize> serde::Serialize for Charged<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(b) = &self.of {
            if self.bytes > 0 {
                b.give_back(self.bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_the_limit_and_go_back_when_dropped() {
        let b = Budget::new(100);
        let mut a = b.try_charge(60).expect("fits");
        assert!(b.try_charge(41).is_none());
        assert!(!a.try_grow(41));
        assert!(a.try_grow(40));
        assert_eq!(b.held(), 100);
        assert!(b.admit().is_err());
        assert_eq!(b.refused(), 1);
        a.set(10);
        assert_eq!(b.held(), 10);
        b.admit().expect("room again");
        // Admitted work's bytes are counted past the limit.
        let f = b.admit_charge(500).expect("admitted");
        assert_eq!(b.held(), 510);
        let mut m = Charge::default();
        m.merge(f);
        m.merge(a);
        assert_eq!(m.bytes(), 510);
        drop(m);
        assert_eq!(b.held(), 0);
    }

    /// Kept values hold their bytes until dropped, and the budget drops them, oldest first, to
    /// fit what it is asked for.
    #[test]
    fn kept_values_are_dropped_oldest_first_for_room() {
        let b = Budget::new(100);
        let old = b.keep("old", b.force(40));
        let new = b.keep("new", b.force(40));
        let gone = b.keep("gone", b.force(10));
        drop(gone);
        assert_eq!(b.held(), 80);
        // 30 fit only once the oldest is dropped.
        let c = b.try_charge(30).expect("room made");
        assert_eq!((old.with(|s| *s), new.with(|s| *s)), (None, Some("new")));
        assert_eq!((b.held(), b.evicted(), old.bytes()), (70, 1, 0));
        // Full: admission drops the rest first.
        let f = b.force(30);
        b.admit().expect("room made");
        assert_eq!((new.with(|s| *s), b.held(), b.evicted()), (None, 60, 2));
        drop((c, f));
        assert_eq!(b.held(), 0);
    }

    /// Nothing kept is dropped when dropping it all would not make the room asked for: the
    /// request is refused, and the kept values stay.
    #[test]
    fn kept_values_are_not_dropped_for_nothing() {
        let b = Budget::new(100);
        let kept = b.keep("kept", b.force(10));
        let other = b.force(100);
        assert!(b.admit().is_err());
        assert!(b.try_charge(1).is_none());
        assert_eq!((kept.with(|s| *s), b.evicted()), (Some("kept"), 0));
        drop(other);
        drop(kept);
        assert_eq!(b.held(), 0);
        assert_eq!(b.inner.evictable.load(Ordering::SeqCst), 0);
    }
}
