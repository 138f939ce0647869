//! Durable raft storage: the log, the hard state, the conf state and the latest snapshot, on a
//! [`LogEngine`] (raft-engine or redb), with the log's indexes, terms and newest entries
//! mirrored in memory.
//!
//! Every `Ready`'s entries and hard state are written in one batch that is fsynced before the
//! node sends anything that depends on them, except a hard state that moves only the commit index,
//! which stays in memory (see [`DiskStorage::persist`]).

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::disk::engine_log::EngineLog;
use crate::disk::log_store::{Cut, LogStore, Write};
pub use crate::disk::log_store::{DiskError, LogEngine, StoreError};
use crate::disk::mem_log::{MemLog, TAIL_BYTES};
use crate::disk::redb_log::RedbLog;

/// What is cached in memory; the disk is the truth, but for a commit index newer than the stored
/// one (never written alone). Reloading from disk may move `hard_state.commit` back: only do it
/// after writing the cached hard state, as `compact` and `apply_snapshot` do.
#[derive(Debug, Clone)]
struct Cache {
    hard_state: HardState,
    conf_state: ConfState,
    /// What the application kept with `conf_state` (see [`DiskStorage::set_conf_state`]).
    conf_meta: Vec<u8>,
    snapshot_meta: SnapshotMetadata,
    /// The log's indexes, terms and newest entries, as on disk.
    log: MemLog,
}

/// Makes the snapshot raft sends a follower that needs one, for a request at an index (the
/// state machine's own, at its applied index: the log keeps no copy of the state).
pub type SnapshotSource = Arc<dyn Fn(u64) -> raft::Result<Snapshot> + Send + Sync>;

/// raft storage on a log engine. Clones share the engine.
#[derive(Clone)]
pub struct DiskStorage {
    /// Where raft's snapshots for followers come from (`None`: the snapshot last saved).
    source: Arc<RwLock<Option<SnapshotSource>>>,
    log: Arc<dyn LogStore>,
    engine: LogEngine,
    /// The node the store belongs to.
    node_id: u64,
    cache: Arc<RwLock<Cache>>,
    /// Bytes of the newest entries kept in memory (`TAIL_BYTES`; smaller in tests).
    tail_bytes: usize,
}

fn other(e: DiskError) -> raft::Error {
    raft::Error::Store(StorageError::Other(e))
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl DiskStorage {
    /// Create (or open) the store of `engine` in `dir` for node `node_id`. A new store starts
    /// from `bootstrap` (the cluster's first snapshot, the same on every founding node: its
    /// configuration and index 1), or empty with no configuration (a node that joins a running
    /// cluster and learns everything from a snapshot). For a dir without a marker only: see
    /// `marker::open_data_dir`.
    pub fn create(
        dir: &Path,
        bootstrap: Option<&Snapshot>,
        node_id: u64,
        engine: LogEngine,
    ) -> Result<Self, StoreError> {
        let log: Arc<dyn LogStore> = match engine {
            LogEngine::RaftEngine => Arc::new(EngineLog::create(dir)?),
            LogEngine::Redb => Arc::new(RedbLog::create(dir)?),
        };
        Self::initialized(log, bootstrap, node_id, engine)
    }

    /// Raft group `group`'s store on this one's engine (this store is group 0's), created from
    /// `bootstrap` as [`DiskStorage::create`] does if it holds nothing yet. An engine that holds
    /// one group (redb) refuses any other.
    pub fn group(&self, group: u64, bootstrap: Option<&Snapshot>) -> Result<Self, StoreError> {
        match self.other_group(group)? {
            None => Ok(self.clone()),
            Some(log) => Self::initialized(log, bootstrap, self.node_id, self.engine),
        }
    }

    /// Raft group `group`'s existing store on this one's engine: refused if it was never
    /// initialized.
    pub fn group_existing(&self, group: u64) -> Result<Self, StoreError> {
        match self.other_group(group)? {
            None => Ok(self.clone()),
            Some(log) => Self::checked(log, self.engine, self.node_id),
        }
    }

    /// The log store of group `group` on this engine; `None` for group 0, this store's own.
    fn other_group(&self, group: u64) -> Result<Option<Arc<dyn LogStore>>, StoreError> {
        match group {
            0 => Ok(None),
            g => self.log.group(g).map(Some).map_err(corrupt),
        }
    }

    /// `log` initialized from `bootstrap` unless it already was, then opened.
    fn initialized(
        log: Arc<dyn LogStore>,
        bootstrap: Option<&Snapshot>,
        node_id: u64,
        engine: LogEngine,
    ) -> Result<Self, StoreError> {
        let meta = log.meta().map_err(corrupt)?;
        let mut w = Write::nothing();
        let (cs, hs);
        if meta.conf_state.is_none() {
            cs = bootstrap
                .map(|b| b.get_metadata().get_conf_state().clone())
                .unwrap_or_default();
            w.conf_state = Some(&cs);
            if let Some(snap) = bootstrap {
                let m = snap.get_metadata();
                hs = HardState {
                    term: m.term,
                    commit: m.index,
                    ..Default::default()
                };
                w.snapshot = Some(snap);
                w.hard_state = Some(&hs);
            }
        }
        if meta.node_id.is_none() {
            w.node_id = Some(node_id);
        }
        log.write(&w).map_err(corrupt)?;
        Self::checked(log, engine, node_id)
    }

    /// Open the existing store of `engine` in `dir` of node `node_id`: never creates one, and
    /// refuses a store that is empty, uninitialized, unreadable or another node's.
    pub fn open_existing(dir: &Path, node_id: u64, engine: LogEngine) -> Result<Self, StoreError> {
        let log: Arc<dyn LogStore> = match engine {
            LogEngine::RaftEngine => Arc::new(EngineLog::open_existing(dir)?),
            LogEngine::Redb => Arc::new(RedbLog::open_existing(dir)?),
        };
        Self::checked(log, engine, node_id)
    }

    fn checked(
        log: Arc<dyn LogStore>,
        engine: LogEngine,
        node_id: u64,
    ) -> Result<Self, StoreError> {
        let meta = log.meta().map_err(corrupt)?;
        let found = match (&meta.conf_state, meta.node_id) {
            (Some(_), Some(id)) => id,
            _ => return Err(StoreError::Uninitialized),
        };
        if found != node_id {
            return Err(StoreError::OtherNode(found));
        }
        let storage = DiskStorage {
            source: Arc::new(RwLock::new(None)),
            log,
            engine,
            node_id,
            cache: Arc::new(RwLock::new(Cache {
                hard_state: HardState::default(),
                conf_state: ConfState::default(),
                conf_meta: Vec::new(),
                snapshot_meta: SnapshotMetadata::default(),
                log: MemLog::new(1, TAIL_BYTES),
            })),
            tail_bytes: TAIL_BYTES,
        };
        storage.reload().map_err(corrupt)?;
        Ok(storage)
    }

    /// Serve raft's snapshots for followers from `source` from now on.
    pub fn set_snapshot_source(&self, source: SnapshotSource) {
        *self.source.write() = Some(source);
    }

    /// The engine the log is on.
    pub fn engine(&self) -> LogEngine {
        self.engine
    }

    /// Whether nothing was persisted beyond the bootstrap: no vote, no entry, no snapshot past
    /// index 1, no term past 1.
    pub fn is_pristine(&self) -> Result<bool, StoreError> {
        let c = self.cache.read();
        Ok(c.hard_state.vote == 0
            && c.hard_state.term <= 1
            && c.log.last_index() == c.snapshot_meta.index
            && c.snapshot_meta.index <= 1)
    }

    fn reload(&self) -> Result<(), DiskError> {
        let meta = self.log.meta()?;
        let snapshot_meta = meta.snapshot.get_metadata().clone();
        let mut mem: Option<MemLog> = None;
        let mut chunk = Vec::new();
        let tail_bytes = self.tail_bytes;
        let mut index_zero = false;
        self.log.scan(&mut |e: Entry| {
            if e.index == 0 {
                index_zero = true; // damage: raft's log starts at 1
                return;
            }
            let m = mem.get_or_insert_with(|| MemLog::new(e.index, tail_bytes));
            chunk.push(e);
            if chunk.len() == 1024 {
                m.append(&std::mem::take(&mut chunk));
            }
        })?;
        if index_zero {
            return Err("log: an entry at index 0".into());
        }
        let mut mem = mem.unwrap_or_else(|| MemLog::new(snapshot_meta.index + 1, tail_bytes));
        mem.append(&chunk);
        let (first, last, snap) = (mem.first_index(), mem.last_index(), snapshot_meta.index);
        if first > snap + 1 || last < snap {
            return Err(format!(
                "the log [{first}, {last}] does not follow the snapshot at {snap}"
            )
            .into());
        }
        let mut c = self.cache.write();
        *c = Cache {
            hard_state: meta.hard_state,
            conf_state: meta.conf_state.unwrap_or_default(),
            conf_meta: meta.conf_meta,
            snapshot_meta,
            log: mem,
        };
        Ok(())
    }

    /// Persist a `Ready`'s entries (replacing any conflicting suffix) and hard state; durable at
    /// the next [`DiskStorage::sync`] (one fsync for every group of the node), which must come
    /// before anything that depends on them is sent or counted.
    ///
    /// A hard state that changes only the commit index, with no entries, is kept in memory (see
    /// [`DiskStorage::set_commit`]): raft needs the term and the vote durable before it speaks,
    /// never the commit index, which a restarted node learns again from its leader. Written, it
    /// would cost every node one more fsync per commit, on the raft thread, in the next write's
    /// way.
    ///
    /// Whether anything was written.
    pub fn persist(
        &self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<bool, DiskError> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(false);
        }
        if let (true, Some(hs)) = (entries.is_empty(), hard_state) {
            let stored = self.cache.read().hard_state.clone();
            if hs.term == stored.term && hs.vote == stored.vote {
                self.set_commit(hs.commit)?;
                return Ok(false);
            }
        }
        let last_index = self.cache.read().log.last_index();
        let overwrites = entries.first().is_some_and(|e| e.index <= last_index);
        self.log.write(&Write {
            entries,
            overwrites,
            hard_state,
            sync: false,
            ..Write::nothing()
        })?;
        let mut c = self.cache.write();
        c.log.append(entries);
        if let Some(hs) = hard_state {
            c.hard_state = hs.clone();
        }
        Ok(true)
    }

    /// Make every write of every group of this store's engine durable.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.log.sync()
    }

    /// Record a newer commit index (from a `LightReady`), in memory: raft puts it in the next
    /// `Ready`'s hard state, which `persist` writes, and a compaction writes it too, so a restart
    /// never finds a snapshot past the stored commit index. A crash in between loses only a commit
    /// index that raft learns again from the leader. (A batch of its own per `Ready` would cost
    /// every node a second fsync per batch.)
    pub fn set_commit(&self, commit: u64) -> Result<(), DiskError> {
        let mut c = self.cache.write();
        c.hard_state.commit = c.hard_state.commit.max(commit);
        Ok(())
    }

    /// Record the configuration applied at some index, and with it, atomically, what the
    /// application keeps about it (`conf_meta`, read back by [`DiskStorage::conf_meta`]); durable
    /// at the next [`DiskStorage::sync`], which the raft loop runs in the same round (lost with a
    /// crash before it, both are derived again from the log).
    pub fn set_conf_state(&self, cs: &ConfState, conf_meta: &[u8]) -> Result<(), DiskError> {
        self.log.write(&Write {
            conf_state: Some(cs),
            conf_meta: Some(conf_meta),
            sync: false,
            ..Write::nothing()
        })?;
        let mut c = self.cache.write();
        c.conf_state = cs.clone();
        c.conf_meta = conf_meta.to_vec();
        Ok(())
    }

    /// What the application kept with the stored configuration (empty if nothing).
    pub fn conf_meta(&self) -> Vec<u8> {
        self.cache.read().conf_meta.clone()
    }

    /// Install a snapshot received from the leader: it replaces the whole log.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<(), DiskError> {
        let meta = snapshot.get_metadata();
        let mut hs = self.cache.read().hard_state.clone();
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        self.log.write(&Write {
            cut: Cut::All,
            hard_state: Some(&hs),
            conf_state: Some(meta.get_conf_state()),
            snapshot: Some(snapshot),
            ..Write::nothing()
        })?;
        self.reload()
    }

    /// Record a snapshot at `index` (applied, and durable in the state machine's own store),
    /// with `data` (the envelope: what the log keeps of it), and drop the log before
    /// `index - keep_entries`, so that the disk stays bounded under a long write load.
    pub fn compact(&self, index: u64, data: Vec<u8>, keep_entries: u64) -> Result<(), DiskError> {
        let term = raft::Storage::term(self, index)?;
        let mut snapshot = Snapshot {
            data: data.into(),
            ..Default::default()
        };
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.cache.read().conf_state.clone());
        let cut = index.saturating_sub(keep_entries);
        let mut hs = self.cache.read().hard_state.clone();
        hs.commit = hs.commit.max(index); // the snapshot's index is committed
        self.log.write(&Write {
            cut: Cut::Before(cut),
            hard_state: Some(&hs),
            snapshot: Some(&snapshot),
            ..Write::nothing()
        })?;
        self.reload()?;
        self.log.purge()
    }

    /// The latest snapshot saved or installed, if any.
    pub fn latest_snapshot(&self) -> Result<Option<Snapshot>, DiskError> {
        let s = self.log.meta()?.snapshot;
        Ok((s != Snapshot::default()).then_some(s))
    }

    /// Entries in the log (for status and tests).
    pub fn log_len(&self) -> u64 {
        let c = self.cache.read();
        (c.log.last_index() + 1).saturating_sub(c.log.first_index())
    }

    /// Keep at most `bytes` of entries in memory (tests: to read older ones from disk).
    #[cfg(test)]
    fn set_tail_bytes(&mut self, bytes: usize) -> Result<(), DiskError> {
        self.tail_bytes = bytes;
        self.reload()
    }

    /// Entries `[low, high)` read from disk (older than those kept in memory), no more than raft's
    /// size limit allows (at least one): a lagging follower's appends read only what they send.
    fn read_range(&self, low: u64, high: u64, max_size: Option<u64>) -> raft::Result<Vec<Entry>> {
        let entries = self.log.read_range(low, high, max_size).map_err(other)?;
        let want = high.saturating_sub(low);
        let consecutive = (low..).zip(&entries).all(|(i, e)| e.index == i);
        let limited = max_size.is_some() && !entries.is_empty() && (entries.len() as u64) < want;
        let whole = entries.len() as u64 == want;
        if !consecutive || !(whole || limited && self.limit_reached(&entries, max_size)?) {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(entries)
    }

    /// Whether a short read of `entries` stopped at the size limit, not at a hole: the next entry
    /// is there, and would have passed the limit.
    fn limit_reached(&self, entries: &[Entry], max_size: Option<u64>) -> raft::Result<bool> {
        let next = entries.last().map_or(0, |e| e.index + 1);
        let got = self.log.read_range(next, next + 1, None).map_err(other)?;
        let bytes: u64 = entries.iter().map(|e| u64::from(e.compute_size())).sum();
        Ok(got.first().is_some_and(|e| {
            e.index == next && bytes + u64::from(e.compute_size()) > max_size.unwrap_or(u64::MAX)
        }))
    }
}

impl raft::Storage for DiskStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let c = self.cache.read();
        Ok(RaftState::new(c.hard_state.clone(), c.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        let c = self.cache.read();
        if low < c.log.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let last = c.log.last_index();
        assert!(
            high <= last + 1,
            "entries [{low}, {high}) past the last index {last}"
        );
        let in_memory = c.log.tail_start().max(low);
        let on_disk = in_memory.min(high);
        let mut entries = match low < in_memory {
            true => self.read_range(low, on_disk, max_size)?,
            false => Vec::with_capacity((high - low) as usize),
        };
        let whole = entries.len() as u64 == on_disk.saturating_sub(low);
        let before = entries.len();
        raft::util::limit_size(&mut entries, max_size);
        if whole && entries.len() == before && high > in_memory {
            c.log.copy_tail(in_memory, high, max_size, &mut entries);
        }
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let c = self.cache.read();
        if idx == c.snapshot_meta.index {
            return Ok(c.snapshot_meta.term);
        }
        if idx < c.log.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        c.log
            .term(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.cache.read().log.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.cache.read().log.last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let source = self.source.read().clone();
        if let Some(source) = source {
            return source(request_index);
        }
        match self
            .latest_snapshot()
            .map_err(|e| raft::Error::Store(StorageError::Other(e)))?
        {
            Some(s) if s.get_metadata().index >= request_index => Ok(s),
            _ => Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage as _;

    /// The first snapshot of a cluster of `voters`.
    fn bootstrap(voters: &[u64]) -> Snapshot {
        let mut s = Snapshot::default();
        s.mut_metadata().index = 1;
        s.mut_metadata().term = 1;
        s.mut_metadata().mut_conf_state().voters = voters.to_vec();
        s
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_commit_only_hard_state_stays_in_memory_and_a_term_or_vote_is_written() {
        for engine in LogEngine::ALL {
            let dir = tempfile::tempdir().unwrap();
            let s =
                DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1, engine).unwrap();
            let hs = |term, vote, commit| HardState {
                term,
                vote,
                commit,
                ..Default::default()
            };
            let entries: Vec<Entry> = (2..=5).map(|i| entry(i, 1)).collect();
            assert!(s.persist(&entries, Some(&hs(1, 1, 2))).unwrap());
            assert!(
                !s.persist(&[], Some(&hs(1, 1, 4))).unwrap(),
                "nothing written"
            );
            assert_eq!(s.initial_state().unwrap().hard_state, hs(1, 1, 4));
            assert_eq!(
                s.log.meta().unwrap().hard_state,
                hs(1, 1, 2),
                "{engine}: a commit-only change is not written"
            );
            assert!(s.persist(&[], Some(&hs(2, 0, 4))).unwrap());
            assert_eq!(
                s.log.meta().unwrap().hard_state,
                hs(2, 0, 4),
                "{engine}: a new term is written"
            );
            s.persist(&[], Some(&hs(2, 3, 5))).unwrap();
            assert_eq!(
                s.log.meta().unwrap().hard_state,
                hs(2, 3, 5),
                "{engine}: a vote is written"
            );
            s.persist(&[], Some(&hs(2, 3, 5))).unwrap();
            s.persist(&[entry(6, 2)], Some(&hs(2, 3, 5))).unwrap();
            drop(s);
            let s = DiskStorage::open_existing(dir.path(), 1, engine).unwrap();
            assert_eq!(s.initial_state().unwrap().hard_state, hs(2, 3, 5));
            assert_eq!(s.last_index().unwrap(), 6);
        }
    }

    #[test]
    fn persists_reopens_truncates_and_compacts() {
        for engine in LogEngine::ALL {
            persists_reopens_truncates_and_compacts_on(engine);
        }
    }

    fn persists_reopens_truncates_and_compacts_on(engine: LogEngine) {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1, engine).unwrap();
        assert!(s.is_pristine().unwrap());
        assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
        assert_eq!(
            (s.first_index().unwrap(), s.last_index().unwrap()),
            (2, 1),
            "the log starts after the bootstrap snapshot"
        );
        assert_eq!(s.term(1).unwrap(), 1);
        assert!(
            matches!(s.term(0), Err(raft::Error::Store(StorageError::Compacted))),
            "a new node needs a snapshot"
        );
        let entries: Vec<Entry> = (2..=10).map(|i| entry(i, 1)).collect();
        let hs = HardState {
            term: 1,
            vote: 1,
            commit: 0,
            ..Default::default()
        };
        s.persist(&entries, Some(&hs)).unwrap();
        s.persist(&[entry(8, 2)], None).unwrap(); // a conflicting suffix is replaced
        drop(s);
        assert!(matches!(
            DiskStorage::open_existing(dir.path(), 2, engine).map(|_| ()),
            Err(StoreError::OtherNode(1))
        ));
        let s = DiskStorage::open_existing(dir.path(), 1, engine).unwrap();
        assert!(!s.is_pristine().unwrap());
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (2, 8));
        assert_eq!(s.term(8).unwrap(), 2);
        assert_eq!(s.initial_state().unwrap().hard_state, hs);
        assert_eq!(
            s.initial_state().unwrap().conf_state.voters,
            vec![1, 2, 3],
            "kept from the first open"
        );
        s.compact(6, b"state".to_vec(), 2).unwrap();
        assert_eq!(s.first_index().unwrap(), 4);
        assert!(matches!(
            s.entries(1, 3, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(
            s.entries(4, 9, None, GetEntriesContext::empty(false))
                .unwrap()
                .len(),
            5
        );
        let snap = s.snapshot(6, 2).unwrap();
        assert_eq!(
            (
                snap.get_metadata().index,
                snap.get_metadata().term,
                &snap.data[..]
            ),
            (6, 1, &b"state"[..])
        );
    }

    /// A log with a hole in it (a damaged store) is refused at open with an error.
    #[test]
    fn a_log_with_a_gap_is_refused_at_open_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1, LogEngine::Redb)
            .unwrap();
        s.persist(&(2..=6).map(|i| entry(i, 1)).collect::<Vec<_>>(), None)
            .unwrap();
        drop(s);
        RedbLog::open_existing(dir.path()).unwrap().remove_entry(4);
        match DiskStorage::open_existing(dir.path(), 1, LogEngine::Redb) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("expected entry 4"), "{why}"),
            other => panic!("opened a log with a gap: {:?}", other.map(|_| ())),
        }
    }

    /// Every read answered from memory, from disk, or from both equals the disk's own answer,
    /// with and without raft's size limit, and after a conflicting suffix and a reopen.
    #[test]
    fn entries_and_terms_from_memory_equal_the_disks() {
        for engine in LogEngine::ALL {
            entries_and_terms_from_memory_equal_the_disks_on(engine);
        }
    }

    fn entries_and_terms_from_memory_equal_the_disks_on(engine: LogEngine) {
        let dir = tempfile::tempdir().unwrap();
        let mut s =
            DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1, engine).unwrap();
        let one = entry(2, 1).compute_size() as usize;
        s.set_tail_bytes(3 * one).unwrap();
        s.persist(&(2..=12).map(|i| entry(i, 1)).collect::<Vec<_>>(), None)
            .unwrap();
        s.persist(&[entry(9, 2), entry(10, 2)], None).unwrap();
        let check = |s: &DiskStorage, tail_start: u64| {
            assert_eq!(s.cache.read().log.tail_start(), tail_start);
            for low in 2..=10 {
                for high in low..=11 {
                    let disk = s.read_range(low, high, None).unwrap();
                    for max in [None, Some(2 * one as u64), Some(1)] {
                        let mut want = disk.clone();
                        raft::util::limit_size(&mut want, max);
                        let limited = s.read_range(low, high, max).unwrap();
                        assert_eq!(limited, want, "disk [{low}, {high}) max {max:?}");
                        let got = s.entries(low, high, max, GetEntriesContext::empty(false));
                        assert_eq!(got.unwrap(), want, "entries [{low}, {high}) max {max:?}");
                    }
                }
                assert_eq!(
                    s.term(low).unwrap(),
                    s.read_range(low, low + 1, None).unwrap()[0].term
                );
            }
            assert!(matches!(
                s.term(11),
                Err(raft::Error::Store(StorageError::Unavailable))
            ));
        };
        check(&s, 9); // the suffix replaced the three in memory
        drop(s);
        let mut s = DiskStorage::open_existing(dir.path(), 1, engine).unwrap();
        s.set_tail_bytes(3 * one).unwrap();
        check(&s, 8); // reloaded: the newest three
    }
}
