//! Byte budgets: memory that input may make a node hold, counted in bytes before it is held.
//!
//! A [`Ticket`] holds bytes of a [`Budget`] until it is dropped. A request that cannot get its
//! bytes is refused at once (HTTP 503 `overloaded`, or a peer connection closed), so memory from
//! input is bounded by the budget however many clients or connections there are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A number of bytes shared by everyone who takes from it.
#[derive(Debug)]
pub struct Budget {
    /// Invariant: `used <= limit` at every instant (taken with compare-and-swap).
    limit: u64,
    used: AtomicU64,
    /// Requests refused for want of bytes.
    refused: AtomicU64,
}

/// Bytes held from a budget; dropping it gives them back.
#[derive(Debug)]
pub struct Ticket {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// Take `bytes`, or `None` (and count a refusal) if they would exceed the limit.
    pub fn take(self: &Arc<Self>, bytes: u64) -> Option<Ticket> {
        let mut t = Ticket {
            budget: self.clone(),
            bytes: 0,
        };
        t.grow(bytes).then_some(t)
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Ticket {
    /// Hold `more` bytes as well; `false` (holding what it held) if the budget has not got them.
    pub fn grow(&mut self, more: u64) -> bool {
        let b = &self.budget;
        let taken = b
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|&n| n <= b.limit)
            });
        if taken.is_err() {
            b.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.bytes += more;
        true
    }

    /// The limit of the budget this ticket holds bytes of.
    pub fn budget_limit(&self) -> u64 {
        self.budget.limit
    }

    /// Bytes this ticket holds.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let before = self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        debug_assert!(before >= self.bytes, "a budget gave back more than it lent");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_lends_up_to_its_limit_and_takes_back_on_drop() {
        let b = Budget::new(100);
        let mut t = b.take(60).expect("fits");
        assert!(b.take(41).is_none(), "60 + 41 > 100");
        assert_eq!(b.refused(), 1);
        let u = b.take(40).expect("60 + 40 = 100 fits exactly");
        assert!(!t.grow(1), "full");
        assert_eq!((t.bytes(), b.used()), (60, 100));
        drop(u);
        assert!(t.grow(40));
        assert_eq!(b.used(), 100);
        drop(t);
        assert_eq!(b.used(), 0);
        assert!(b.take(u64::MAX).is_none(), "no overflow");
    }
}
