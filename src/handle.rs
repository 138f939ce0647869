//! A read handle: lease reads on application threads, with no round through the raft thread
//! (the idea of TiKV's LocalReader).
//!
//! The raft thread publishes the lease expiry, the commit index and the applied index in atomics.
//! A read captures the commit index, waits locally until `applied ≥` it, runs the caller's state
//! read, and then validates: the lease is still held at a clock reading taken *after* the state read,
//! and no revocation or term change happened in between (read first, validate second).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::clock::Clock;
use crate::read::ReadError;
use crate::status::Counters;

/// State the raft thread publishes for read handles.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The usable lease ends at this local instant (exclusive); 0 when no lease is held.
    pub lease_until_ns: AtomicU64,
    /// Bumped after every revocation and at every new term: a read that spans a bump fails.
    pub epoch: AtomicU64,
    /// The leader's commit index, published before the lease that relies on it.
    pub commit: AtomicU64,
    /// The applied index: the caller's state reflects at least this much.
    pub applied: AtomicU64,
    /// Event counters.
    pub counters: Counters,
}

impl Shared {
    /// Publish the indexes first, then the lease that relies on them.
    pub fn publish(&self, commit: u64, applied: u64, lease_until_ns: u64) {
        self.commit.store(commit, Ordering::Release);
        self.applied.store(applied, Ordering::Release);
        self.lease_until_ns.store(lease_until_ns, Ordering::Release);
    }

    /// Revoke the lease: clear it, then bump the epoch.
    pub fn revoke(&self) {
        self.lease_until_ns.store(0, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// A cloneable, `Send + Sync` handle for lease reads from any thread.
///
/// It serves only lease reads. When it returns [`ReadError::LeaseNotHeld`], send the read through
/// the raft thread ([`crate::LeaseNode::read`]), which can fall back to ReadIndex.
#[derive(Debug)]
pub struct ReadHandle<C: Clock> {
    shared: Arc<Shared>,
    clock: Arc<C>,
}

impl<C: Clock> Clone for ReadHandle<C> {
    fn clone(&self) -> Self {
        ReadHandle {
            shared: self.shared.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Why a handle read did not run or was not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    NotHeld,
    ApplyBehind,
}

impl<C: Clock> ReadHandle<C> {
    pub(crate) fn new(shared: Arc<Shared>, clock: Arc<C>) -> Self {
        ReadHandle { shared, clock }
    }

    /// Serve a lease read: `read_state` runs against local state, then the lease is validated.
    ///
    /// Waits (spinning, then yielding) while the applied index is behind the commit index captured
    /// at the start, for as long as the lease is held.
    pub fn read<T>(&self, mut read_state: impl FnMut() -> T) -> Result<T, ReadError> {
        let mut spins = 0u32;
        loop {
            match self.attempt(&mut read_state) {
                Ok(v) => return Ok(v),
                Err(Attempt::NotHeld) => return Err(ReadError::LeaseNotHeld),
                Err(Attempt::ApplyBehind) => {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Like [`ReadHandle::read`], but fails with [`ReadError::LeaseNotHeld`] instead of waiting
    /// when the applied index is behind (for single-threaded drivers such as the simulator).
    pub fn try_read<T>(&self, read_state: impl FnOnce() -> T) -> Result<T, ReadError> {
        self.attempt(read_state)
            .map_err(|_| ReadError::LeaseNotHeld)
    }

    fn attempt<T>(&self, read_state: impl FnOnce() -> T) -> Result<T, Attempt> {
        let s = &*self.shared;
        let epoch = s.epoch.load(Ordering::Acquire);
        let until_ns = s.lease_until_ns.load(Ordering::Acquire);
        if self.clock.now_ns() >= until_ns {
            Counters::bump(&s.counters.lease_refusals);
            return Err(Attempt::NotHeld);
        }
        let commit = s.commit.load(Ordering::Acquire);
        if s.applied.load(Ordering::Acquire) < commit {
            return Err(Attempt::ApplyBehind);
        }
        let value = read_state();
        // Validate after the read: a pause before this point shows up as an expired lease.
        let now_ns = self.clock.now_ns();
        let still_until_ns = s.lease_until_ns.load(Ordering::Acquire);
        if s.epoch.load(Ordering::Acquire) != epoch || now_ns >= still_until_ns {
            Counters::bump(&s.counters.lease_refusals);
            return Err(Attempt::NotHeld);
        }
        Counters::bump(&s.counters.lease_reads);
        Ok(value)
    }

    /// Whether a lease is held right now (a hint: the read itself validates again).
    pub fn lease_held(&self) -> bool {
        self.clock.now_ns() < self.shared.lease_until_ns.load(Ordering::Acquire)
    }
}
