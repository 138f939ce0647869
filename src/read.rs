//! The read path: modes, errors, and the queue of reads waiting to be served. Pure, no I/O.
//!
//! A lease read captures the commit index when it starts, waits until `applied ≥` that index,
//! reads the state, and only then checks that the lease is still held (read first, validate second).
//! A ReadIndex read waits for a quorum round through raft's `read_index`; waiting reads are batched
//! into one round, and a round that raft dropped is retried.

use std::collections::VecDeque;

use thiserror::Error;

use crate::ctx::LayerCtx;

/// How a read may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// Only from the lease; fails with [`ReadError::LeaseNotHeld`] when no lease is held.
    Lease,
    /// Always by a ReadIndex quorum round.
    ReadIndex,
    /// From the lease when held, else by ReadIndex.
    Auto,
}

/// How a read was actually served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadKind {
    /// From local state under the lease, with no network round.
    Lease,
    /// After a ReadIndex quorum round.
    Index,
}

impl ReadKind {
    /// `lease` or `index`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadKind::Lease => "lease",
            ReadKind::Index => "index",
        }
    }
}

/// Identifies one read issued through [`crate::LeaseNode::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReadId(pub u64);

/// Why a read was not served.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReadError {
    /// This node is not the leader (or stopped leading while the read waited).
    #[error("not the leader (leader hint: {leader_hint:?})")]
    NotLeader {
        /// The leader this node knows of, if any.
        leader_hint: Option<u64>,
    },
    /// Strict lease read, and no valid lease is held (or it was lost before validation).
    #[error("no valid lease is held")]
    LeaseNotHeld,
}

/// The outcome of one read, from [`crate::LeaseNode::serve_reads`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRead<T> {
    /// The read.
    pub id: ReadId,
    /// What the caller's state read returned and how it was served, or why it failed.
    pub result: Result<(T, ReadKind), ReadError>,
}

/// `read_index` rounds in flight at once. A second round lets reads that arrive during the
/// first go out at once (about one round of latency); more would cost messages per read.
pub(crate) const MAX_ROUNDS_IN_FLIGHT: usize = 2;

/// A lease read waiting for `applied ≥ index`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRead {
    pub id: ReadId,
    /// The commit index captured when the read started.
    pub index: u64,
    /// `Lease` (strict) or `Auto` (falls back to ReadIndex).
    pub mode: ReadMode,
}

/// One `read_index` round carrying a batch of reads.
#[derive(Debug)]
pub(crate) struct IndexBatch {
    pub ctx: Vec<u8>,
    pub ids: Vec<ReadId>,
    /// Ticks since the round was issued; a round raft dropped is retried.
    pub ticks_waited: u64,
}

/// Every read not yet handed back. Reads are never dropped: each ends served or failed.
#[derive(Debug, Default)]
pub(crate) struct ReadQueue {
    next_id: u64,
    next_ctx: u64,
    /// Lease reads waiting for apply, in start order.
    pub lease: VecDeque<LeaseRead>,
    /// ReadIndex reads not yet in a round.
    pub index_waiting: Vec<ReadId>,
    /// Rounds in flight, at most [`MAX_ROUNDS_IN_FLIGHT`]; reads arriving meanwhile batch
    /// into the next round.
    pub index_inflight: VecDeque<IndexBatch>,
    /// ReadIndex reads with their read index, waiting for apply.
    pub index_ready: VecDeque<(ReadId, u64)>,
    /// Reads that failed, to hand back.
    pub failed: Vec<(ReadId, ReadError)>,
}

impl ReadQueue {
    pub fn next_id(&mut self) -> ReadId {
        self.next_id += 1;
        ReadId(self.next_id)
    }

    /// Move every waiting ReadIndex read into a new round; returns its context, if any read waits.
    pub fn start_batch(&mut self) -> Option<Vec<u8>> {
        if self.index_inflight.len() >= MAX_ROUNDS_IN_FLIGHT || self.index_waiting.is_empty() {
            return None;
        }
        self.next_ctx += 1;
        let ctx = LayerCtx::Read(self.next_ctx).encode();
        let ids = std::mem::take(&mut self.index_waiting);
        self.index_inflight.push_back(IndexBatch {
            ctx: ctx.clone(),
            ids,
            ticks_waited: 0,
        });
        debug_assert!(self.index_inflight.len() <= MAX_ROUNDS_IN_FLIGHT);
        Some(ctx)
    }

    /// The round with context `ctx` came back with read index `index`. False if it is not ours.
    pub fn complete_batch(&mut self, ctx: &[u8], index: u64) -> bool {
        let Some(pos) = self.index_inflight.iter().position(|b| b.ctx == ctx) else {
            return false;
        };
        let batch = self.index_inflight.remove(pos).expect("found above");
        self.index_ready
            .extend(batch.ids.into_iter().map(|id| (id, index)));
        true
    }

    /// Put the in-flight rounds' reads back to wait, so that the next round carries them.
    pub fn requeue_inflight(&mut self) {
        let mut ids: Vec<ReadId> = self.index_inflight.drain(..).flat_map(|b| b.ids).collect();
        ids.append(&mut self.index_waiting);
        self.index_waiting = ids;
    }

    /// Fail every pending read with `err` (the node stopped leading).
    pub fn fail_all(&mut self, err: &ReadError) {
        self.requeue_inflight();
        let ids = self
            .lease
            .drain(..)
            .map(|r| r.id)
            .chain(self.index_waiting.drain(..))
            .chain(self.index_ready.drain(..).map(|(id, _)| id));
        let failed: Vec<_> = ids.map(|id| (id, err.clone())).collect();
        self.failed.extend(failed);
        debug_assert!(self.is_idle());
    }

    /// No read is waiting for anything.
    pub fn is_idle(&self) -> bool {
        self.lease.is_empty()
            && self.index_waiting.is_empty()
            && self.index_inflight.is_empty()
            && self.index_ready.is_empty()
    }

    /// Reads not yet handed back.
    pub fn len(&self) -> usize {
        self.lease.len()
            + self.index_waiting.len()
            + self
                .index_inflight
                .iter()
                .map(|b| b.ids.len())
                .sum::<usize>()
            + self.index_ready.len()
            + self.failed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_reads_batch_into_rounds_at_most_two_in_flight() {
        let mut q = ReadQueue::default();
        let (a, b) = (q.next_id(), q.next_id());
        q.index_waiting.extend([a, b]);
        let ctx = q.start_batch().expect("two reads wait");
        let c = q.next_id();
        q.index_waiting.push(c);
        let ctx2 = q.start_batch().expect("a second round may fly");
        let d = q.next_id();
        q.index_waiting.push(d);
        assert_eq!(q.start_batch(), None, "at most two rounds in flight");
        assert!(!q.complete_batch(b"other", 9));
        assert!(q.complete_batch(&ctx, 7));
        assert_eq!(q.index_ready, VecDeque::from([(a, 7), (b, 7)]));
        assert!(q.complete_batch(&ctx2, 8));
        assert!(q.start_batch().is_some(), "the next batch goes out");
        assert_eq!(q.index_inflight[0].ids, vec![d]);
    }

    #[test]
    fn nothing_is_dropped_on_step_down() {
        let mut q = ReadQueue::default();
        let ids: Vec<_> = (0..4).map(|_| q.next_id()).collect();
        q.lease.push_back(LeaseRead {
            id: ids[0],
            index: 3,
            mode: ReadMode::Lease,
        });
        q.index_waiting.push(ids[1]);
        q.start_batch();
        q.index_waiting.push(ids[2]);
        q.index_ready.push_back((ids[3], 2));
        assert_eq!(q.len(), 4);
        q.fail_all(&ReadError::NotLeader {
            leader_hint: Some(2),
        });
        assert!(q.is_idle());
        let mut failed: Vec<_> = q.failed.iter().map(|(id, _)| *id).collect();
        failed.sort();
        assert_eq!(failed, ids);
    }
}
