//! The state machine's own store, beside the raft log: an ordered key-value engine with tables,
//! consistent read views that see one committed state while writes go on, and write batches
//! that commit atomically.
//!
//! The MVCC rules (`state::mvcc`) are written against [`EngineRead`] and [`EngineWrite`]; the
//! engine underneath is fjall ([`StateEngine`]), a log-structured merge tree: a batch is one
//! atomic journal record and costs no page rewrite, a read view is a snapshot at a sequence
//! number, and flushes and compactions run on fjall's own threads, never the raft thread. Chosen
//! over redb by measuring the store's workload (`docs/kv.md`, "The state engine"): redb's
//! durable commit rewrites every page changed since the last one, which held the writer (the
//! raft thread) for 0.3 s every 50 ms under a bulk load.
//!
//! A batch is visible to every view opened after it at once, and durable only once
//! [`StateEngine::persist`] (or a batch written with `durable`) has synced the journal after it:
//! a crash loses what was not. The node tracks which applied index is durable, and never cuts
//! the raft log past it. Writes are serialized (one batch at a time, read-your-writes inside a
//! batch through an overlay of its own writes over a snapshot taken when it began).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use parking_lot::Mutex;
use thiserror::Error;

/// The engine's directory in a data dir.
pub const STATE_FILE: &str = "state";

/// The engine's block cache: what the node's resident memory holds of the state at most, beside
/// its write buffers and what reads and writes in flight hold. Small: the operating system's
/// page cache holds the engine's files too, and a scan of a whole keyspace would otherwise leave
/// the cache full of blocks no point read needs.
pub const STATE_CACHE_BYTES: usize = 64 << 20;

/// The journal's size at most: bounds what a start replays.
const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// An engine failure. Fatal where the state is written (the node stops rather than apply
/// entries to a state it cannot keep); a read that fails answers its client with it.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The engine could not read or write.
    #[error("state engine: {0}")]
    Io(String),
    /// What the engine holds does not make sense (a damaged or forged file, or a bug).
    #[error("state engine holds something malformed: {0}")]
    Corrupt(String),
    /// Another process has the engine open.
    #[error("state engine in use by another process")]
    InUse,
}

fn io(e: impl std::fmt::Display) -> EngineError {
    EngineError::Io(e.to_string())
}

/// The tables of the state engine. Every key begins with the 8-byte generation of the data it
/// belongs to (see `state::mvcc::layout`), but for [`Table::Groups`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// Each live key's current version.
    Latest,
    /// Versions no longer current (superseded, and tombstones), by key then revision.
    History,
    /// Which keys each revision changed, by revision then place.
    Changes,
    /// The keys attached to each lease.
    LeaseKeys,
    /// Per generation: the revision counters, the applied index, sessions, alarms.
    Meta,
    /// Per group: the generation its data lives under (and the node's generation counter).
    Groups,
}

impl Table {
    /// Every table, in the order a snapshot stream carries them.
    pub const ALL: [Table; 6] = [
        Table::Latest,
        Table::History,
        Table::Changes,
        Table::LeaseKeys,
        Table::Meta,
        Table::Groups,
    ];

    /// The table's name in the engine.
    pub fn name(self) -> &'static str {
        match self {
            Table::Latest => "latest",
            Table::History => "history",
            Table::Changes => "changes",
            Table::LeaseKeys => "lease_keys",
            Table::Meta => "meta",
            Table::Groups => "groups",
        }
    }

    /// The table's number in a snapshot stream.
    pub fn code(self) -> u8 {
        Table::ALL.iter().position(|&t| t == self).expect("listed") as u8
    }

    /// The table of a snapshot stream's number.
    pub fn of_code(code: u8) -> Option<Table> {
        Table::ALL.get(code as usize).copied()
    }
}

/// What a visitor of rows says: go on, or stop here.
pub type Visit<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> bool;

/// Reads of one consistent state.
pub trait EngineRead {
    /// The value at `key` in `t`.
    fn get(&self, t: Table, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;
    /// Hand the rows of `t` with keys in `[from, to)` (`to`: `None` for no end) to `visit`, in
    /// key order (descending with `reverse`), until it returns `false`.
    fn scan(
        &self,
        t: Table,
        from: &[u8],
        to: Option<&[u8]>,
        reverse: bool,
        visit: Visit<'_>,
    ) -> Result<(), EngineError>;
}

/// Writes of one batch; reads through it see its own writes.
pub trait EngineWrite: EngineRead {
    /// Set `key` in `t` to `value`.
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> Result<(), EngineError>;
    /// Remove `key` from `t` (nothing if absent).
    fn delete(&mut self, t: Table, key: &[u8]) -> Result<(), EngineError>;
}

struct Inner {
    db: Database,
    /// The tables, in [`Table::ALL`]'s order.
    tables: Vec<Keyspace>,
    /// One batch at a time (its overlay reads a snapshot taken when it began).
    writer: Mutex<()>,
    /// An engine in a temporary dir (tests) keeps it until dropped.
    _temp: Option<tempfile::TempDir>,
    /// Names this opening of the engine: what an earlier process left half written carries
    /// another (see `mvcc::generation`).
    opening: u64,
}

/// The fjall state engine. Clones share the database.
#[derive(Clone)]
pub struct StateEngine {
    inner: Arc<Inner>,
}

/// A read view: one committed state, as of when it was opened.
pub struct StateView {
    snap: fjall::Snapshot,
    inner: Arc<Inner>,
}

/// One write batch: its own writes, over the state when it began.
pub struct StateWrite<'e> {
    inner: &'e Inner,
    base: fjall::Snapshot,
    /// Per table: each key written, with its new value (`None`: removed).
    overlay: Vec<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
}

fn bounds<'a>(from: &'a [u8], to: Option<&'a [u8]>) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (
        Bound::Included(from),
        to.map_or(Bound::Unbounded, Bound::Excluded),
    )
}

/// Rows in either direction.
type Rows<'a, T> = Box<dyn Iterator<Item = T> + 'a>;

/// Hand the rows of `snap`'s table `ks` in `[from, to)` to `visit`, `overlay` (the rows written
/// over it, `None` for removed) taking the place of the table's own.
fn merged_scan(
    snap: &fjall::Snapshot,
    ks: &Keyspace,
    overlay: Option<&BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    (from, to): (&[u8], Option<&[u8]>),
    reverse: bool,
    visit: Visit<'_>,
) -> Result<(), EngineError> {
    if to.is_some_and(|to| to <= from) {
        return Ok(());
    }
    let range = snap.range::<&[u8], _>(ks, bounds(from, to));
    let mut base: Rows<'_, fjall::Guard> = match reverse {
        true => Box::new(range.rev()),
        false => Box::new(range),
    };
    let empty = BTreeMap::new();
    let over = overlay.unwrap_or(&empty).range::<[u8], _>(bounds(from, to));
    let mut over: Rows<'_, (&Vec<u8>, &Option<Vec<u8>>)> = match reverse {
        true => Box::new(over.rev()),
        false => Box::new(over),
    };
    let mut next_base = || -> Result<Option<(fjall::UserKey, fjall::UserValue)>, EngineError> {
        base.next().map(|g| g.into_inner().map_err(io)).transpose()
    };
    let (mut b, mut o) = (next_base()?, over.next());
    loop {
        let take_over = match (&b, &o) {
            (None, None) => return Ok(()),
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((bk, _)), Some((ok, _))) => match reverse {
                false => ok.as_slice() <= &bk[..],
                true => ok.as_slice() >= &bk[..],
            },
        };
        let go_on = if take_over {
            let (ok, ov) = o.expect("chosen");
            if b.as_ref().is_some_and(|(bk, _)| &bk[..] == ok.as_slice()) {
                b = next_base()?; // written over in the batch
            }
            o = over.next();
            match ov {
                Some(v) => visit(ok, v),
                None => true,
            }
        } else {
            let (bk, bv) = b.take().expect("chosen");
            b = next_base()?;
            visit(&bk, &bv)
        };
        if !go_on {
            return Ok(());
        }
    }
}

impl EngineRead for StateView {
    fn get(&self, t: Table, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let ks = &self.inner.tables[t.code() as usize];
        Ok(self.snap.get(ks, key).map_err(io)?.map(|v| v.to_vec()))
    }

    fn scan(
        &self,
        t: Table,
        from: &[u8],
        to: Option<&[u8]>,
        reverse: bool,
        visit: Visit<'_>,
    ) -> Result<(), EngineError> {
        let ks = &self.inner.tables[t.code() as usize];
        merged_scan(&self.snap, ks, None, (from, to), reverse, visit)
    }
}

impl EngineRead for StateWrite<'_> {
    fn get(&self, t: Table, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        if let Some(v) = self.overlay[t.code() as usize].get(key) {
            return Ok(v.clone());
        }
        let ks = &self.inner.tables[t.code() as usize];
        Ok(self.base.get(ks, key).map_err(io)?.map(|v| v.to_vec()))
    }

    fn scan(
        &self,
        t: Table,
        from: &[u8],
        to: Option<&[u8]>,
        reverse: bool,
        visit: Visit<'_>,
    ) -> Result<(), EngineError> {
        let i = t.code() as usize;
        let overlay = Some(&self.overlay[i]);
        merged_scan(
            &self.base,
            &self.inner.tables[i],
            overlay,
            (from, to),
            reverse,
            visit,
        )
    }
}

impl EngineWrite for StateWrite<'_> {
    fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        self.overlay[t.code() as usize].insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, t: Table, key: &[u8]) -> Result<(), EngineError> {
        self.overlay[t.code() as usize].insert(key.to_vec(), None);
        Ok(())
    }
}

impl StateEngine {
    /// Open (or create) the engine in `dir/state`, with `cache_bytes` of block cache.
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<Self, EngineError> {
        Self::open_at(dir.join(STATE_FILE), cache_bytes, None)
    }

    /// An engine in a temporary dir of its own, removed when the last clone is dropped (tests).
    #[cfg(test)]
    pub fn in_memory() -> Self {
        let temp = tempfile::tempdir().expect("a temporary dir");
        let path = temp.path().join(STATE_FILE);
        Self::open_at(path, 8 << 20, Some(temp)).expect("a new engine opens")
    }

    fn open_at(
        path: PathBuf,
        cache_bytes: usize,
        temp: Option<tempfile::TempDir>,
    ) -> Result<Self, EngineError> {
        let opened = Database::builder(&path)
            .cache_size(cache_bytes as u64)
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .manual_journal_persist(true)
            .worker_threads(1)
            .open();
        let db = opened.map_err(|e| match e {
            fjall::Error::Locked => EngineError::InUse,
            e => EngineError::Corrupt(e.to_string()),
        })?;
        let mut tables = Vec::with_capacity(Table::ALL.len());
        for t in Table::ALL {
            tables.push(
                db.keyspace(t.name(), KeyspaceCreateOptions::default)
                    .map_err(io)?,
            );
        }
        Ok(StateEngine {
            inner: Arc::new(Inner {
                db,
                tables,
                writer: Mutex::new(()),
                _temp: temp,
                opening: opening_id(),
            }),
        })
    }

    /// This opening of the engine's id: different in every process, and in every opening.
    pub fn opening(&self) -> u64 {
        self.inner.opening
    }

    /// A view of the state as last committed.
    pub fn view(&self) -> Result<StateView, EngineError> {
        Ok(StateView {
            snap: self.inner.db.snapshot(),
            inner: self.inner.clone(),
        })
    }

    /// Run `f` on one write batch and commit it atomically: visible to views at once, durable
    /// once the journal is synced after it, at once if `durable` (which makes every batch
    /// before it durable too). An error from `f` aborts the batch: nothing of it is written.
    pub fn write<T>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut StateWrite<'_>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let _one = self.inner.writer.lock();
        let mut w = StateWrite {
            inner: &self.inner,
            base: self.inner.db.snapshot(),
            overlay: vec![BTreeMap::new(); Table::ALL.len()],
        };
        let out = f(&mut w)?;
        let mut batch = self.inner.db.batch();
        for (i, rows) in w.overlay.into_iter().enumerate() {
            let ks = &self.inner.tables[i];
            for (k, v) in rows {
                match v {
                    Some(v) => batch.insert(ks, k, v),
                    None => batch.remove(ks, k),
                }
            }
        }
        batch.commit().map_err(io)?;
        if durable {
            self.persist()?;
        }
        Ok(out)
    }

    /// Make every batch committed so far durable (one fsync of the journal). Safe to call from
    /// any thread, beside a batch being written.
    pub fn persist(&self) -> Result<(), EngineError> {
        self.inner.db.persist(PersistMode::SyncAll).map_err(io)
    }

    /// The engine's bytes on disk.
    pub fn file_bytes(&self) -> u64 {
        self.inner.db.disk_space().unwrap_or(0)
    }

    /// Rewrite the engine's tables so that space freed by deletions goes back to the file
    /// system (etcd's defragment): it runs on the engine's tables while batches go on.
    /// Returns the bytes on disk after.
    pub fn compact_file(&self) -> Result<u64, EngineError> {
        for ks in &self.inner.tables {
            ks.rotate_memtable_and_wait().map_err(io)?;
            ks.major_compact().map_err(io)?;
        }
        Ok(self.file_bytes())
    }
}

/// An id for an opening of the engine: the time and the process, and a counter for openings
/// within one process (unique enough to tell this process's writes from an earlier one's).
fn opening_id() -> u64 {
    static OPENINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let nanos = now.map_or(0, |d| d.as_nanos() as u64);
    let n = OPENINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(
        r: &impl EngineRead,
        t: Table,
        from: &[u8],
        to: Option<&[u8]>,
        rev: bool,
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        r.scan(t, from, to, rev, &mut |k, _| {
            out.push(k.to_vec());
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn a_view_sees_one_committed_state_while_writes_go_on() {
        let e = StateEngine::in_memory();
        e.write(false, |w| {
            w.put(Table::Latest, b"a", b"1")?;
            w.put(Table::Latest, b"b", b"2")
        })
        .unwrap();
        let before = e.view().unwrap();
        e.write(false, |w| {
            w.put(Table::Latest, b"c", b"3")?;
            w.delete(Table::Latest, b"a")
        })
        .unwrap();
        assert_eq!(
            collect(&before, Table::Latest, b"", None, false),
            [b"a", b"b"]
        );
        let after = e.view().unwrap();
        assert_eq!(
            collect(&after, Table::Latest, b"", None, false),
            [b"b", b"c"]
        );
        assert_eq!(
            collect(&after, Table::Latest, b"", None, true),
            [b"c", b"b"]
        );
        assert_eq!(
            collect(&after, Table::Latest, b"b", Some(b"c"), false),
            [b"b"]
        );
        assert!(collect(&after, Table::Latest, b"c", Some(b"b"), false).is_empty());
        assert_eq!(after.get(Table::Latest, b"c").unwrap(), Some(b"3".to_vec()));
        assert_eq!(before.get(Table::Latest, b"c").unwrap(), None);
    }

    #[test]
    fn a_failed_batch_writes_nothing() {
        let e = StateEngine::in_memory();
        let r: Result<(), _> = e.write(false, |w| {
            w.put(Table::Meta, b"k", b"v")?;
            Err(EngineError::Corrupt("refused".into()))
        });
        assert!(r.is_err());
        assert_eq!(e.view().unwrap().get(Table::Meta, b"k").unwrap(), None);
        let seen = e
            .write(false, |w| {
                w.put(Table::Meta, b"k", b"v")?;
                w.get(Table::Meta, b"k")
            })
            .unwrap();
        assert_eq!(seen, Some(b"v".to_vec()), "a batch reads its own writes");
    }

    #[test]
    fn a_batch_synced_survives_a_reopen_and_scans_merge_a_batchs_own_writes() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = StateEngine::open(dir.path(), 1 << 20).unwrap();
            e.write(false, |w| w.put(Table::Meta, b"1", b"x")).unwrap();
            e.write(true, |w| w.put(Table::Meta, b"2", b"x")).unwrap();
        }
        let e = StateEngine::open(dir.path(), 1 << 20).unwrap();
        let v = e.view().unwrap();
        assert!(
            v.get(Table::Meta, b"1").unwrap().is_some(),
            "synced by the later batch"
        );
        assert!(v.get(Table::Meta, b"2").unwrap().is_some());
        let seen = e
            .write(false, |w| {
                w.put(Table::Meta, b"0", b"new")?;
                w.delete(Table::Meta, b"1")?;
                w.put(Table::Meta, b"2", b"over")?;
                let mut rows = Vec::new();
                w.scan(Table::Meta, b"", None, false, &mut |k, v| {
                    rows.push((k.to_vec(), v.to_vec()));
                    true
                })?;
                let mut back = Vec::new();
                w.scan(Table::Meta, b"", None, true, &mut |k, _| {
                    back.push(k.to_vec());
                    true
                })?;
                Ok((rows, back))
            })
            .unwrap();
        assert_eq!(
            seen.0,
            vec![
                (b"0".to_vec(), b"new".to_vec()),
                (b"2".to_vec(), b"over".to_vec())
            ]
        );
        assert_eq!(seen.1, vec![b"2".to_vec(), b"0".to_vec()]);
        assert!(StateEngine::open(dir.path(), 1 << 20).is_err(), "in use");
    }
}
