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
//! answer (a reply's JSON, at most a third larger than its bytes).

use crate::ServiceError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The budget; cheap to clone.
#[derive(Clone, Debug)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: u64,
    held: AtomicU64,
    /// Requests refused, and outputs cut, because it was full.
    refused: AtomicU64,
    cut: AtomicU64,
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

    /// Counts a request refused because the budget was full.
    pub(crate) fn refuse(&self) {
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
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
        let held = self.held();
        if held < self.inner.limit {
            return Ok(());
        }
        self.refuse();
        Err(ServiceError::held_full(held, self.inner.limit))
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

    /// Takes `n` more bytes if they fit in its budget (a charge of no budget: always).
    pub fn try_grow(&mut self, n: u64) -> bool {
        let Some(b) = &self.of else {
            return true;
        };
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
}
