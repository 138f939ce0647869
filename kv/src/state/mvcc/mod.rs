//! etcd's keyspace, with its history (MVCC, as etcd has it), in the state engine: one revision
//! counter that moves by one for each change (a transaction that writes is one change, however
//! many keys it writes), and per key its `create_revision`, `mod_revision` and `version`. Reads
//! at a past revision are served until that revision is compacted. Keys and values are bytes.
//!
//! Applying is deterministic and compares no time: every replica holds the same history. A
//! lease here is a session of the store's sessions (`kv_state`); the keys attached to each live
//! lease are kept here, and a lease's end deletes them in one revision. The HTTP API's keys are
//! these keys too: one keyspace behind both front ends.
//!
//! Where it lies on disk is in [`layout`]. Reads go through a [`Reader`] over one view of the
//! engine (a read transaction: it sees one committed state while the raft thread applies), so a
//! read never holds anything the apply path needs. Writes go through a [`Batch`], one per engine
//! batch of the raft thread, and a [`Write`] per revision.

pub mod batch;
pub mod compact;
pub mod counters;
pub mod errors;
pub mod generation;
pub mod hash;
pub mod layout;
pub mod range;
pub mod reader;
pub mod txn;
pub mod version;
pub mod watch;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

pub use batch::{Batch, Write};
pub use counters::{counters_of, empty_state_rows, gen_of, Counters};
pub use errors::MvccError;
pub use reader::Reader;
pub use version::{Version, VERSION_OVERHEAD_BYTES};

use crate::disk::state_engine::StateEngine;
use counters::storage;

/// Whether `k` is in the range `key`..`end`, as etcd reads a key and its `range_end`: an
/// empty `end` is the key alone, `\0` is every key from `key` on, anything else is `[key, end)`.
pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

/// One group's keyspace in the state engine: a handle, cheap to clone, that the raft thread
/// writes through and any thread reads through.
#[derive(Clone)]
pub struct Keyspace {
    engine: StateEngine,
    group: u64,
    /// The revision as last committed, for headers and checks that do not open a view.
    rev: Arc<AtomicI64>,
    bytes: Arc<AtomicU64>,
}

impl Keyspace {
    /// Group `group`'s keyspace in `engine` (an empty one if it has none yet).
    pub fn open(engine: StateEngine, group: u64) -> Result<Self, MvccError> {
        let ks = Keyspace {
            engine,
            group,
            rev: Arc::new(AtomicI64::new(1)),
            bytes: Arc::new(AtomicU64::new(0)),
        };
        let view = ks.engine.view().map_err(storage)?;
        let gen = gen_of(&view, group)?;
        ks.publish(&counters_of(&view, gen)?);
        Ok(ks)
    }

    /// The engine it lives in.
    pub fn engine(&self) -> &StateEngine {
        &self.engine
    }

    /// The group.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// Publish the counters a commit left.
    pub fn publish(&self, c: &Counters) {
        self.rev.store(c.rev, Ordering::Release);
        self.bytes.store(c.bytes, Ordering::Release);
    }

    /// The revision of the last change, as last committed.
    pub fn rev(&self) -> i64 {
        self.rev.load(Ordering::Acquire)
    }

    /// Bytes of every version kept, as last committed.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Run `f` on a read of the state as last committed: one view, one generation, counters
    /// that match it.
    pub fn read<T>(
        &self,
        f: impl FnOnce(&Reader<'_>) -> Result<T, MvccError>,
    ) -> Result<T, MvccError> {
        self.pin()?.read(f)
    }

    /// The state as last committed, pinned: reads on it see this instant's state however long
    /// they take and on whatever thread (a linearizable read takes its view under the lease,
    /// then scans it after).
    pub fn pin(&self) -> Result<Pinned, MvccError> {
        let view = self.engine.view().map_err(storage)?;
        let gen = gen_of(&view, self.group)?;
        let counters = counters_of(&view, gen)?;
        Ok(Pinned {
            view,
            gen,
            counters,
        })
    }
}

/// One group's keyspace at one instant, owned (see [`Keyspace::pin`]).
pub struct Pinned {
    view: crate::disk::state_engine::StateView,
    gen: u64,
    counters: Counters,
}

impl Pinned {
    /// Run `f` on the pinned state.
    pub fn read<T>(
        &self,
        f: impl FnOnce(&Reader<'_>) -> Result<T, MvccError>,
    ) -> Result<T, MvccError> {
        let c = self.counters;
        f(&Reader {
            e: &self.view,
            gen: self.gen,
            rev: c.rev,
            compacted: c.compacted,
            counters: c,
        })
    }
}

#[cfg(test)]
mod tests;
