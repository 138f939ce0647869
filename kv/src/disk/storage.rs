//! Durable raft storage on redb: the log, the hard state, the conf state and the latest snapshot.
//!
//! Every `Ready`'s entries and hard state are written in one transaction that is fsynced
//! (`Durability::Immediate`) before the node sends anything that depends on them.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

use crate::disk::mem_log::{MemLog, TAIL_BYTES};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const HARD_STATE: &str = "hard_state";
const CONF_STATE: &str = "conf_state";
const SNAPSHOT: &str = "snapshot";
/// The raft id of the node the store belongs to (u64, big-endian).
const NODE_ID: &str = "node_id";

/// Any failure of the disk store. The node treats it as fatal: raft cannot continue safely.
pub type DiskError = Box<dyn std::error::Error + Send + Sync>;

/// What is cached in memory; the disk is the truth.
#[derive(Debug, Clone)]
struct Cache {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot_meta: SnapshotMetadata,
    /// The log's indexes, terms and newest entries, as on disk.
    log: MemLog,
}

/// raft storage on a redb file. Clones share the database.
#[derive(Clone)]
pub struct DiskStorage {
    db: Arc<Database>,
    cache: Arc<RwLock<Cache>>,
    /// Bytes of the newest entries kept in memory (`TAIL_BYTES`; smaller in tests).
    tail_bytes: usize,
}

fn other(e: impl std::error::Error + Send + Sync + 'static) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(e)))
}

/// Why an existing store could not be opened as this node's.
#[derive(Debug, Error)]
pub enum StoreError {
    /// No store file.
    #[error("missing")]
    Missing,
    /// A store file of 0 bytes.
    #[error("empty (0 bytes)")]
    Empty,
    /// A store without a configuration or node id.
    #[error("not initialized (it holds no configuration)")]
    Uninitialized,
    /// Another node's store.
    #[error("node {0}'s")]
    OtherNode(u64),
    /// A store that cannot be read.
    #[error("corrupt or unreadable ({0})")]
    Corrupt(String),
    /// Another process has the store open (a node already running on this dir).
    #[error("in use by another process")]
    InUse,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// A store that could not be opened: in use by another process, or unreadable.
fn open_failed(e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse,
        e => corrupt(e),
    }
}

const STORE_FILE: &str = "raft.redb";

impl DiskStorage {
    /// Create (or open) `dir/raft.redb` for node `node_id`. A new store starts from `bootstrap`
    /// (the cluster's first snapshot, the same on every founding node: its configuration and
    /// index 1), or empty with no configuration (a node that joins a running cluster and learns
    /// everything from a snapshot). For a dir without a marker only: see `marker::open_data_dir`.
    pub fn create(
        dir: &Path,
        bootstrap: Option<&Snapshot>,
        node_id: u64,
    ) -> Result<Self, StoreError> {
        let db = Database::create(dir.join(STORE_FILE)).map_err(open_failed)?;
        let init = || -> Result<(), DiskError> {
            let txn = db.begin_write()?;
            {
                txn.open_table(LOG)?;
                let mut meta = txn.open_table(META)?;
                if meta.get(CONF_STATE)?.is_none() {
                    let cs = bootstrap.map(|b| b.get_metadata().get_conf_state().clone());
                    meta.insert(
                        CONF_STATE,
                        cs.unwrap_or_default().write_to_bytes()?.as_slice(),
                    )?;
                    if let Some(snap) = bootstrap {
                        let m = snap.get_metadata();
                        let hs = HardState {
                            term: m.term,
                            commit: m.index,
                            ..Default::default()
                        };
                        meta.insert(SNAPSHOT, snap.write_to_bytes()?.as_slice())?;
                        meta.insert(HARD_STATE, hs.write_to_bytes()?.as_slice())?;
                    }
                }
                if meta.get(NODE_ID)?.is_none() {
                    meta.insert(NODE_ID, node_id.to_be_bytes().as_slice())?;
                }
            }
            txn.commit()?;
            Ok(())
        };
        init().map_err(corrupt)?;
        Self::checked(db, node_id)
    }

    /// Open the existing `dir/raft.redb` of node `node_id`: never creates one, and refuses a
    /// store that is empty, uninitialized, unreadable or another node's.
    pub fn open_existing(dir: &Path, node_id: u64) -> Result<Self, StoreError> {
        let path = dir.join(STORE_FILE);
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing),
            Err(e) => return Err(corrupt(e)),
            Ok(m) if m.len() == 0 => return Err(StoreError::Empty),
            Ok(_) => {}
        }
        // redb reports corruption as errors; a panic in it must not take the node down either.
        let opened = std::panic::catch_unwind(|| Database::open(&path))
            .map_err(|_| corrupt("the store library panicked reading it"))?;
        Self::checked(opened.map_err(open_failed)?, node_id)
    }

    fn checked(db: Database, node_id: u64) -> Result<Self, StoreError> {
        let found = {
            let txn = db.begin_read().map_err(corrupt)?;
            let meta = match txn.open_table(META) {
                Ok(m) => m,
                Err(redb::TableError::TableDoesNotExist(_)) => {
                    return Err(StoreError::Uninitialized)
                }
                Err(e) => return Err(corrupt(e)),
            };
            if meta.get(CONF_STATE).map_err(corrupt)?.is_none() {
                return Err(StoreError::Uninitialized);
            }
            let id = meta
                .get(NODE_ID)
                .map_err(corrupt)?
                .map(|v| v.value().to_vec());
            id.and_then(|b| Some(u64::from_be_bytes(b.try_into().ok()?)))
                .ok_or(StoreError::Uninitialized)?
        };
        if found != node_id {
            return Err(StoreError::OtherNode(found));
        }
        let storage = DiskStorage {
            db: Arc::new(db),
            cache: Arc::new(RwLock::new(Cache {
                hard_state: HardState::default(),
                conf_state: ConfState::default(),
                snapshot_meta: SnapshotMetadata::default(),
                log: MemLog::new(1, TAIL_BYTES),
            })),
            tail_bytes: TAIL_BYTES,
        };
        storage.reload().map_err(corrupt)?;
        Ok(storage)
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
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let log = txn.open_table(LOG)?;
        let get = |k: &str| -> Result<Option<Vec<u8>>, DiskError> {
            Ok(meta.get(k)?.map(|v| v.value().to_vec()))
        };
        let hard_state = get(HARD_STATE)?
            .map(|b| HardState::parse_from_bytes(&b))
            .transpose()?
            .unwrap_or_default();
        let conf_state = get(CONF_STATE)?
            .map(|b| ConfState::parse_from_bytes(&b))
            .transpose()?
            .unwrap_or_default();
        let snapshot = get(SNAPSHOT)?
            .map(|b| Snapshot::parse_from_bytes(&b))
            .transpose()?
            .unwrap_or_default();
        let snapshot_meta = snapshot.get_metadata().clone();
        let first = log.first()?.map(|(k, _)| k.value());
        let mut mem = MemLog::new(first.unwrap_or(snapshot_meta.index + 1), self.tail_bytes);
        let mut chunk = Vec::new();
        for (next, row) in (mem.first_index()..).zip(log.iter()?) {
            let (key, value) = row?;
            let e = Entry::parse_from_bytes(value.value())?;
            // A damaged store is an error at open, not a panic in the mirror.
            if key.value() != next || e.index != next {
                let found = (key.value(), e.index);
                return Err(
                    format!("log: expected entry {next}, found key/index {found:?}").into(),
                );
            }
            chunk.push(e);
            if chunk.len() == 1024 {
                mem.append(&std::mem::take(&mut chunk));
            }
        }
        mem.append(&chunk);
        let mut c = self.cache.write();
        *c = Cache {
            hard_state,
            conf_state,
            snapshot_meta,
            log: mem,
        };
        Ok(())
    }

    /// Persist a `Ready`'s entries (replacing any conflicting suffix) and hard state, fsynced.
    pub fn persist(
        &self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<(), DiskError> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let last_index = self.cache.read().log.last_index();
        let txn = self.db.begin_write()?;
        {
            let mut log = txn.open_table(LOG)?;
            if let Some(first) = entries.first() {
                if first.index <= last_index {
                    log.retain_in(first.index.., |_, _| false)?; // a conflicting suffix
                }
                for e in entries {
                    log.insert(e.index, e.write_to_bytes()?.as_slice())?;
                }
            }
            if let Some(hs) = hard_state {
                txn.open_table(META)?
                    .insert(HARD_STATE, hs.write_to_bytes()?.as_slice())?;
            }
        }
        txn.commit()?;
        let mut c = self.cache.write();
        c.log.append(entries);
        if let Some(hs) = hard_state {
            c.hard_state = hs.clone();
        }
        Ok(())
    }

    /// Record a newer commit index (from a `LightReady`), in memory: raft puts it in the next
    /// `Ready`'s hard state, which `persist` writes, and a compaction writes it too, so a restart
    /// never finds a snapshot past the stored commit index. A crash in between loses only a commit
    /// index that raft learns again from the leader. (A transaction of its own per `Ready`, as
    /// before, cost every node a second store commit per batch.)
    pub fn set_commit(&self, commit: u64) -> Result<(), DiskError> {
        let mut c = self.cache.write();
        c.hard_state.commit = c.hard_state.commit.max(commit);
        Ok(())
    }

    /// Record the configuration applied at some index.
    pub fn set_conf_state(&self, cs: &ConfState) -> Result<(), DiskError> {
        let txn = self.db.begin_write()?;
        txn.open_table(META)?
            .insert(CONF_STATE, cs.write_to_bytes()?.as_slice())?;
        txn.commit()?;
        self.cache.write().conf_state = cs.clone();
        Ok(())
    }

    /// Install a snapshot received from the leader: it replaces the whole log.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<(), DiskError> {
        let meta = snapshot.get_metadata();
        let mut hs = self.cache.read().hard_state.clone();
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        let txn = self.db.begin_write()?;
        {
            let mut log = txn.open_table(LOG)?;
            log.retain(|_, _| false)?;
            let mut m = txn.open_table(META)?;
            m.insert(SNAPSHOT, snapshot.write_to_bytes()?.as_slice())?;
            m.insert(HARD_STATE, hs.write_to_bytes()?.as_slice())?;
            m.insert(
                CONF_STATE,
                meta.get_conf_state().write_to_bytes()?.as_slice(),
            )?;
        }
        txn.commit()?;
        self.reload()
    }

    /// Save a snapshot of the state machine at `index` (applied) and drop the log before
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
        let txn = self.db.begin_write()?;
        {
            let mut log = txn.open_table(LOG)?;
            log.retain_in(..cut, |_, _| false)?;
            let mut meta = txn.open_table(META)?;
            meta.insert(SNAPSHOT, snapshot.write_to_bytes()?.as_slice())?;
            meta.insert(HARD_STATE, hs.write_to_bytes()?.as_slice())?;
        }
        txn.commit()?;
        self.reload()
    }

    /// The latest snapshot saved or installed, if any.
    pub fn latest_snapshot(&self) -> Result<Option<Snapshot>, DiskError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let bytes = meta.get(SNAPSHOT)?.map(|v| v.value().to_vec());
        Ok(bytes.map(|b| Snapshot::parse_from_bytes(&b)).transpose()?)
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

    /// Entries `[low, high)` read from disk (older than those kept in memory).
    fn read_range(&self, low: u64, high: u64) -> raft::Result<Vec<Entry>> {
        let txn = self.db.begin_read().map_err(other)?;
        let log = txn.open_table(LOG).map_err(other)?;
        let mut entries = Vec::with_capacity((high - low) as usize);
        for row in log.range(low..high).map_err(other)? {
            let (_, v) = row.map_err(other)?;
            entries.push(Entry::parse_from_bytes(v.value()).map_err(raft::Error::CodecError)?);
        }
        if entries.len() as u64 != high - low {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(entries)
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
        let mut entries = match low < in_memory {
            true => self.read_range(low, in_memory.min(high))?,
            false => Vec::with_capacity((high - low) as usize),
        };
        let before = entries.len();
        raft::util::limit_size(&mut entries, max_size);
        if entries.len() == before && high > in_memory {
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
    fn persists_reopens_truncates_and_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1).unwrap();
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
            DiskStorage::open_existing(dir.path(), 2).map(|_| ()),
            Err(StoreError::OtherNode(1))
        ));
        let s = DiskStorage::open_existing(dir.path(), 1).unwrap();
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
        let s = DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1).unwrap();
        s.persist(&(2..=6).map(|i| entry(i, 1)).collect::<Vec<_>>(), None)
            .unwrap();
        let txn = s.db.begin_write().unwrap();
        txn.open_table(LOG).unwrap().remove(4).unwrap();
        txn.commit().unwrap();
        drop(s);
        match DiskStorage::open_existing(dir.path(), 1) {
            Err(StoreError::Corrupt(why)) => assert!(why.contains("expected entry 4"), "{why}"),
            other => panic!("opened a log with a gap: {:?}", other.map(|_| ())),
        }
    }

    /// Every read answered from memory, from disk, or from both equals the disk's own answer,
    /// with and without raft's size limit, and after a conflicting suffix and a reopen.
    #[test]
    fn entries_and_terms_from_memory_equal_the_disks() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::create(dir.path(), Some(&bootstrap(&[1, 2, 3])), 1).unwrap();
        let one = entry(2, 1).compute_size() as usize;
        s.set_tail_bytes(3 * one).unwrap();
        s.persist(&(2..=12).map(|i| entry(i, 1)).collect::<Vec<_>>(), None)
            .unwrap();
        s.persist(&[entry(9, 2), entry(10, 2)], None).unwrap();
        let check = |s: &DiskStorage, tail_start: u64| {
            assert_eq!(s.cache.read().log.tail_start(), tail_start);
            for low in 2..=10 {
                for high in low..=11 {
                    let disk = s.read_range(low, high).unwrap();
                    for max in [None, Some(2 * one as u64), Some(1)] {
                        let mut want = disk.clone();
                        raft::util::limit_size(&mut want, max);
                        let got = s.entries(low, high, max, GetEntriesContext::empty(false));
                        assert_eq!(got.unwrap(), want, "entries [{low}, {high}) max {max:?}");
                    }
                }
                assert_eq!(
                    s.term(low).unwrap(),
                    s.read_range(low, low + 1).unwrap()[0].term
                );
            }
            assert!(matches!(
                s.term(11),
                Err(raft::Error::Store(StorageError::Unavailable))
            ));
        };
        check(&s, 9); // the suffix replaced the three in memory
        drop(s);
        let mut s = DiskStorage::open_existing(dir.path(), 1).unwrap();
        s.set_tail_bytes(3 * one).unwrap();
        check(&s, 8); // reloaded: the newest three
    }
}
