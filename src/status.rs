//! Lease status and counters, cheap to read from any thread.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lease::LeaseState;

/// Monotonic event counters. Each is a relaxed atomic: cheap to bump and to read.
#[derive(Debug, Default)]
pub struct Counters {
    /// Reads served under the lease (through the node or a read handle).
    pub lease_reads: AtomicU64,
    /// Reads served by a ReadIndex round.
    pub index_reads: AtomicU64,
    /// `Auto` reads that fell back from the lease to ReadIndex.
    pub fallbacks: AtomicU64,
    /// Quorum acknowledgements that moved the lease expiry later.
    pub renewals: AtomicU64,
    /// Times a held lease ran out, or was lost by step-down, term change, transfer or membership change.
    pub expirations: AtomicU64,
    /// Vote and pre-vote requests dropped because the promise held.
    pub refused_votes: AtomicU64,
    /// Strict lease reads refused because no lease was held.
    pub lease_refusals: AtomicU64,
    /// `read_index` rounds issued (each may carry many reads).
    pub index_rounds: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A plain copy of every counter.
    pub fn snapshot(&self) -> CounterSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterSnapshot {
            lease_reads: get(&self.lease_reads),
            index_reads: get(&self.index_reads),
            fallbacks: get(&self.fallbacks),
            renewals: get(&self.renewals),
            expirations: get(&self.expirations),
            refused_votes: get(&self.refused_votes),
            lease_refusals: get(&self.lease_refusals),
            index_rounds: get(&self.index_rounds),
            rounds_evicted: 0,
        }
    }
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// See [`Counters::lease_reads`].
    pub lease_reads: u64,
    /// See [`Counters::index_reads`].
    pub index_reads: u64,
    /// See [`Counters::fallbacks`].
    pub fallbacks: u64,
    /// See [`Counters::renewals`].
    pub renewals: u64,
    /// See [`Counters::expirations`].
    pub expirations: u64,
    /// See [`Counters::refused_votes`].
    pub refused_votes: u64,
    /// See [`Counters::lease_refusals`].
    pub lease_refusals: u64,
    /// See [`Counters::index_rounds`].
    pub index_rounds: u64,
    /// Heartbeat rounds retired unanswered because the round table was full (more rounds in
    /// flight than it keeps). They renew nothing.
    pub rounds_evicted: u64,
}

/// The lease as seen at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseStatus {
    /// Valid, suspect (renewal due) or expired.
    pub state: LeaseState,
    /// Time left, 0 when not held.
    pub remaining_ns: u64,
    /// The term led, if leading.
    pub term: Option<u64>,
    /// Whether a leadership transfer fenced the lease for the rest of the term.
    pub fenced: bool,
}
