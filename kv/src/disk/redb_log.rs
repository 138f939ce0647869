//! The raft log on redb: a B-tree of entries by index and a table of the rest, each batch one
//! transaction committed with `Durability::Immediate` (fsynced).

use std::path::Path;
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::disk::log_store::{Cut, DiskError, LogStore, Meta, StoreError, Write};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const HARD_STATE: &str = "hard_state";
const CONF_STATE: &str = "conf_state";
const CONF_META: &str = "conf_meta";
const SNAPSHOT: &str = "snapshot";
/// The raft id of the node the store belongs to (u64, big-endian).
const NODE_ID: &str = "node_id";

/// The store's file in a data dir.
pub const STORE_FILE: &str = "raft.redb";

/// A redb log. See the module docs.
pub struct RedbLog {
    db: Database,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// A store that needs redb's repair (a crash left it so) is repaired on a copy, which then
/// takes its place: a store the repair refuses is left as found.
fn repair_on_a_copy(path: &Path) -> Result<(), StoreError> {
    let copy = path.with_extension("redb.repair");
    std::fs::copy(path, &copy).map_err(corrupt)?;
    let repaired = std::panic::catch_unwind(|| Database::open(&copy))
        .map_err(|_| corrupt("the store library panicked repairing it"));
    let repaired = repaired.and_then(|r| r.map_err(open_failed));
    match repaired {
        Ok(db) => {
            drop(db);
            std::fs::rename(&copy, path).map_err(corrupt)?;
            let dir = path.parent().unwrap_or(Path::new("."));
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(corrupt)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&copy);
            Err(e)
        }
    }
}

/// A store that could not be opened: in use by another process, or unreadable.
fn open_failed(e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse,
        e => corrupt(e),
    }
}

impl RedbLog {
    /// Create (or open) `dir/raft.redb`, with its tables.
    pub fn create(dir: &Path) -> Result<Self, StoreError> {
        let db = Database::create(dir.join(STORE_FILE)).map_err(open_failed)?;
        let init = || -> Result<(), DiskError> {
            let txn = db.begin_write()?;
            txn.open_table(LOG)?;
            txn.open_table(META)?;
            txn.commit()?;
            Ok(())
        };
        init().map_err(corrupt)?;
        Ok(RedbLog { db })
    }

    /// Open the existing `dir/raft.redb`: never creates one; refuses an empty or unreadable one.
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(STORE_FILE);
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing),
            Err(e) => return Err(corrupt(e)),
            Ok(m) if m.len() == 0 => return Err(StoreError::Empty),
            Ok(_) => {}
        }
        // redb reports corruption as errors; a panic in it must not take the node down either.
        // Opened read-only first: a damaged file is refused as found (a writable open may write
        // its header while it looks); an intact one, or one that needs only redb's repair after
        // a crash (which a read-only open cannot do), is opened to be written.
        let checked = std::panic::catch_unwind(|| redb::ReadOnlyDatabase::open(&path))
            .map_err(|_| corrupt("the store library panicked reading it"))?;
        match checked {
            Ok(db) => db.close().map_err(corrupt)?,
            Err(redb::DatabaseError::RepairAborted) => repair_on_a_copy(&path)?,
            Err(e) => return Err(open_failed(e)),
        }
        let opened = std::panic::catch_unwind(|| Database::open(&path))
            .map_err(|_| corrupt("the store library panicked reading it"))?;
        let db = opened.map_err(open_failed)?;
        let txn = db.begin_read().map_err(corrupt)?;
        match txn.open_table(META) {
            Ok(_) => {}
            Err(redb::TableError::TableDoesNotExist(_)) => return Err(StoreError::Uninitialized),
            Err(e) => return Err(corrupt(e)),
        }
        drop(txn);
        Ok(RedbLog { db })
    }

    /// Remove entry `index` behind the store's back (tests: a damaged store).
    #[cfg(test)]
    pub fn remove_entry(&self, index: u64) {
        let txn = self.db.begin_write().unwrap();
        txn.open_table(LOG).unwrap().remove(index).unwrap();
        txn.commit().unwrap();
    }
}

impl LogStore for RedbLog {
    fn meta(&self) -> Result<Meta, DiskError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let get = |k: &str| -> Result<Option<Vec<u8>>, DiskError> {
            Ok(meta.get(k)?.map(|v| v.value().to_vec()))
        };
        let node_id = get(NODE_ID)?.map(|b| {
            let bytes: [u8; 8] = b.try_into().map_err(|_| "node id: not 8 bytes")?;
            Ok::<_, DiskError>(u64::from_be_bytes(bytes))
        });
        Ok(Meta {
            hard_state: get(HARD_STATE)?
                .map(|b| HardState::parse_from_bytes(&b))
                .transpose()?
                .unwrap_or_default(),
            conf_state: get(CONF_STATE)?
                .map(|b| ConfState::parse_from_bytes(&b))
                .transpose()?,
            conf_meta: get(CONF_META)?.unwrap_or_default(),
            snapshot: get(SNAPSHOT)?
                .map(|b| Snapshot::parse_from_bytes(&b))
                .transpose()?
                .unwrap_or_default(),
            node_id: node_id.transpose()?,
        })
    }

    fn scan(&self, sink: &mut dyn FnMut(Entry)) -> Result<(), DiskError> {
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let mut next = None;
        for row in log.iter()? {
            let (key, value) = row?;
            let e = Entry::parse_from_bytes(value.value())?;
            let want = next.unwrap_or(key.value());
            if key.value() != want || e.index != want {
                let found = (key.value(), e.index);
                return Err(
                    format!("log: expected entry {want}, found key/index {found:?}").into(),
                );
            }
            next = Some(want + 1);
            sink(e);
        }
        Ok(())
    }

    fn write(&self, w: &Write<'_>) -> Result<(), DiskError> {
        let txn = self.db.begin_write()?;
        {
            let mut log = txn.open_table(LOG)?;
            match w.cut {
                Cut::None => {}
                Cut::Before(index) => log.retain_in(..index, |_, _| false)?,
                Cut::All => log.retain(|_, _| false)?,
            }
            if let (Some(first), true) = (w.entries.first(), w.overwrites) {
                log.retain_in(first.index.., |_, _| false)?; // a conflicting suffix
            }
            for e in w.entries {
                log.insert(e.index, e.write_to_bytes()?.as_slice())?;
            }
            let mut meta = txn.open_table(META)?;
            if let Some(hs) = w.hard_state {
                meta.insert(HARD_STATE, hs.write_to_bytes()?.as_slice())?;
            }
            if let Some(cs) = w.conf_state {
                meta.insert(CONF_STATE, cs.write_to_bytes()?.as_slice())?;
            }
            if let Some(m) = w.conf_meta {
                meta.insert(CONF_META, m)?;
            }
            if let Some(s) = w.snapshot {
                meta.insert(SNAPSHOT, s.write_to_bytes()?.as_slice())?;
            }
            if let Some(id) = w.node_id {
                meta.insert(NODE_ID, id.to_be_bytes().as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn read_range(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> Result<Vec<Entry>, DiskError> {
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let (mut entries, mut bytes) = (Vec::new(), 0u64);
        for row in log.range(low..high)? {
            let (_, v) = row?;
            bytes += v.value().len() as u64;
            if max_size.is_some_and(|max| bytes > max) && !entries.is_empty() {
                break; // raft's rule: within the limit, and at least one
            }
            entries.push(Entry::parse_from_bytes(v.value())?);
        }
        Ok(entries)
    }

    fn group(&self, group: u64) -> Result<Arc<dyn LogStore>, DiskError> {
        Err(
            format!("redb holds one raft group, not group {group}: many groups need raft-engine")
                .into(),
        )
    }
}
