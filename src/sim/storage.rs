//! The simulator's raft storage: raft-rs's `MemStorage` for the log and hard state, plus a
//! snapshot that carries the state machine, so that compaction and catching up by snapshot
//! exercise the state machine too (`MemStorage`'s own snapshots carry no data).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// `MemStorage` with a snapshot of the state machine. Clones share one store (it survives a
/// simulated crash, as a disk does).
#[derive(Clone)]
pub struct SimStorage {
    mem: MemStorage,
    /// The latest snapshot: taken here at compaction, or installed from the leader. Its index
    /// is at or below the log's first index, and its data is the state machine at that index.
    snapshot: Arc<Mutex<Snapshot>>,
    /// raft asked for a snapshot that the latest one cannot serve (too old, or from a
    /// configuration without the receiver): the node should take a fresh one.
    wanted: Arc<AtomicBool>,
}

impl SimStorage {
    /// An empty store whose initial configuration is `voters`.
    pub fn new(voters: Vec<u64>) -> Self {
        SimStorage {
            mem: MemStorage::new_with_conf_state((voters, vec![])),
            snapshot: Arc::new(Mutex::new(Snapshot::default())),
            wanted: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Append entries (replacing any conflicting suffix) and record the hard state.
    pub fn persist(&self, entries: &[Entry], hs: Option<&HardState>) -> raft::Result<()> {
        crate::drive::persist_to_mem(&self.mem, entries, hs)
    }

    /// Record a newer commit index.
    pub fn set_commit(&self, commit: u64) {
        self.mem.wl().mut_hard_state().set_commit(commit);
    }

    /// Record the configuration a membership change produced.
    pub fn set_conf_state(&self, cs: ConfState) {
        self.mem.wl().set_conf_state(cs);
    }

    /// Install a snapshot from the leader: the log restarts after it.
    pub fn install(&self, snapshot: Snapshot) -> raft::Result<()> {
        self.mem.wl().apply_snapshot(snapshot.clone())?;
        *self.snapshot.lock() = snapshot;
        Ok(())
    }

    /// Snapshot the state machine (`data`, as of the applied index `index`) and drop the log
    /// before `index`. The entry at `index` stays, so its term stays known.
    pub fn compact(&self, index: u64, data: Vec<u8>) -> raft::Result<()> {
        let term = self.mem.term(index)?;
        let mut snap = Snapshot {
            data: data.into(),
            ..Snapshot::default()
        };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.mem.initial_state()?.conf_state);
        *self.snapshot.lock() = snap;
        self.mem.wl().compact(index)
    }

    /// Whether raft asked for a fresher snapshot since the last call (then take one).
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::Relaxed)
    }

    /// The latest snapshot (empty when none was taken or installed).
    pub fn latest_snapshot(&self) -> Snapshot {
        self.snapshot.lock().clone()
    }
}

impl Storage for SimStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let snap = self.snapshot.lock();
        if idx != 0 && idx == snap.get_metadata().index {
            return Ok(snap.get_metadata().term);
        }
        drop(snap);
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The latest snapshot, if it is recent enough and its configuration includes `to` (a node
    /// outside it refuses to restore it). Otherwise a fresh one is wanted, and raft retries.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let snap = self.snapshot.lock();
        let meta = snap.get_metadata();
        let cs = meta.get_conf_state();
        let members = [
            &cs.voters,
            &cs.learners,
            &cs.voters_outgoing,
            &cs.learners_next,
        ];
        let includes_to = members.iter().any(|ids| ids.contains(&to));
        if meta.index < request_index.max(1) || !includes_to {
            self.wanted.store(true, Ordering::Relaxed);
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(snap.clone())
    }
}
