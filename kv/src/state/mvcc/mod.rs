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

pub mod compact;
pub mod errors;
pub mod generation;
pub mod layout;
pub mod range;
pub mod txn;
pub mod version;
pub mod watch;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

pub use errors::MvccError;
pub use version::{Version, VERSION_OVERHEAD_BYTES};

use crate::disk::state_engine::{EngineError, EngineRead, EngineWrite, StateEngine, Table};
use layout::{decode_u64, decode_version, encode_u64, encode_version};

/// Whether `k` is in the range `key`..`end`, as etcd reads a key and its `range_end`: an
/// empty `end` is the key alone, `\0` is every key from `key` on, anything else is `[key, end)`.
pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

/// The first key after `key` alone: the end of a one-key range.
fn just_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// A generation's counters, kept in one `meta` row and written with every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// The revision of the last change: 1 in an empty store, as in etcd. Never decreases.
    pub rev: i64,
    /// Revisions below this one are gone (reads and watches from them are refused); 0: none.
    /// Invariant: `compacted <= rev`.
    pub compacted: i64,
    /// Physical compaction is done for the changes below this revision (superseded versions
    /// at or below `compacted` are removed from here up, a batch at a time; past `compacted`
    /// when done).
    pub swept: i64,
    /// Bytes of every version kept, with [`VERSION_OVERHEAD_BYTES`] each.
    pub bytes: u64,
    /// The last raft index applied to this generation.
    pub applied: u64,
}

impl Counters {
    /// An empty keyspace at revision 1, nothing applied.
    pub const EMPTY: Counters = Counters {
        rev: 1,
        compacted: 0,
        swept: 0,
        bytes: 0,
        applied: 0,
    };

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        for n in [self.rev, self.compacted, self.swept] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        out.extend_from_slice(&self.bytes.to_be_bytes());
        out.extend_from_slice(&self.applied.to_be_bytes());
        out
    }

    fn decode(row: &[u8]) -> Option<Counters> {
        let n = |i: usize| {
            Some(u64::from_be_bytes(
                row.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        let c = Counters {
            rev: n(0)? as i64,
            compacted: n(1)? as i64,
            swept: n(2)? as i64,
            bytes: n(3)?,
            applied: n(4)?,
        };
        let sane = row.len() == 40
            && c.rev >= 1
            && (0..=c.rev).contains(&c.compacted)
            && (0..=c.compacted + 1).contains(&c.swept);
        sane.then_some(c)
    }
}

const COUNTERS: &str = "counters";

/// The rows of an empty keyspace whose state is that at `applied` (what an empty snapshot
/// stream stands for: the cluster's bootstrap), keys without a generation prefix.
pub fn empty_state_rows(applied: u64) -> Vec<crate::state::stream::Row> {
    let c = Counters {
        applied,
        ..Counters::EMPTY
    };
    vec![crate::state::stream::Row {
        table: Table::Meta,
        key: COUNTERS.as_bytes().to_vec(),
        value: c.encode(),
    }]
}

fn storage(e: EngineError) -> MvccError {
    MvccError::Storage(e.to_string())
}

fn malformed(what: &str) -> MvccError {
    MvccError::Storage(format!("a malformed {what} row"))
}

/// The generation group `group`'s data lives under in the state `r` (0: none yet).
pub fn gen_of(r: &dyn EngineRead, group: u64) -> Result<u64, MvccError> {
    match r
        .get(Table::Groups, &layout::group_key(group))
        .map_err(storage)?
    {
        None => Ok(0),
        Some(row) => decode_u64(&row).ok_or_else(|| malformed("group")),
    }
}

/// Generation `gen`'s counters in the state `r` (an empty keyspace's if it has none).
pub fn counters_of(r: &dyn EngineRead, gen: u64) -> Result<Counters, MvccError> {
    match r
        .get(Table::Meta, &layout::meta_key(gen, COUNTERS))
        .map_err(storage)?
    {
        None => Ok(Counters::EMPTY),
        Some(row) => Counters::decode(&row).ok_or_else(|| malformed("counters")),
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
        let view = self.engine.view().map_err(storage)?;
        let gen = gen_of(&view, self.group)?;
        let c = counters_of(&view, gen)?;
        f(&Reader {
            e: &view,
            gen,
            rev: c.rev,
            compacted: c.compacted,
            counters: c,
        })
    }
}

/// Reads of one group's keyspace in one state of the engine.
pub struct Reader<'a> {
    e: &'a dyn EngineRead,
    gen: u64,
    rev: i64,
    compacted: i64,
    counters: Counters,
}

impl Reader<'_> {
    /// The generation's counters in this state.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// A row of the generation's `meta` table.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, MvccError> {
        self.e
            .get(Table::Meta, &layout::meta_key(self.gen, name))
            .map_err(storage)
    }

    /// The revision of the last change.
    pub fn rev(&self) -> i64 {
        self.rev
    }

    /// The compacted revision (0: none).
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// The revision a read asks for (0: the current one), or why it cannot be read.
    pub fn read_rev(&self, asked: i64) -> Result<i64, MvccError> {
        match asked {
            r if r <= 0 => Ok(self.rev),
            r if r > self.rev => Err(MvccError::FutureRev),
            r if r < self.compacted => Err(MvccError::Compacted),
            r => Ok(r),
        }
    }

    /// `key`'s current version, if it exists now.
    pub fn latest(&self, key: &[u8]) -> Result<Option<Version>, MvccError> {
        let row = self
            .e
            .get(Table::Latest, &layout::latest_key(self.gen, key));
        match row.map_err(storage)? {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("latest"))?,
            )),
        }
    }

    /// `key`'s newest history row at or below `rev` (a version no longer current, or a
    /// tombstone), if any.
    fn history_at(&self, key: &[u8], rev: i64) -> Result<Option<Version>, MvccError> {
        let from = layout::history_start(self.gen, key);
        let to = layout::history_key(self.gen, key, rev.saturating_add(1).max(0));
        let mut found = None;
        self.e
            .scan(Table::History, &from, Some(&to), true, &mut |_, v| {
                found = Some(v.to_vec());
                false
            })
            .map_err(storage)?;
        match found {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("history"))?,
            )),
        }
    }

    /// `key`'s version with `mod_rev` exactly `rev` (a put, or a tombstone), if it is kept.
    fn version_of_change(&self, key: &[u8], rev: i64) -> Result<Option<Version>, MvccError> {
        if let Some(v) = self.latest(key)?.filter(|v| v.mod_rev == rev) {
            return Ok(Some(v));
        }
        let row = self
            .e
            .get(Table::History, &layout::history_key(self.gen, key, rev))
            .map_err(storage)?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("history"))?,
            )),
        }
    }

    /// `key`'s version at `rev`, if the key existed then.
    pub fn version_at(&self, key: &[u8], rev: i64) -> Result<Option<Version>, MvccError> {
        if let Some(v) = self.latest(key)? {
            if v.mod_rev <= rev {
                return Ok(Some(v));
            }
        }
        Ok(self.history_at(key, rev)?.filter(|v| v.value.is_some()))
    }

    /// Hand the keys in `key`..`end` that existed at `rev`, in key order, with their version
    /// then, to `visit` until it returns `false`.
    pub fn scan_at(
        &self,
        key: &[u8],
        end: &[u8],
        rev: i64,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        let (from, to) = self.latest_range(key, end);
        if rev >= self.rev {
            return self.scan_latest(&from, to.as_deref(), visit);
        }
        self.scan_past(key, end, rev, visit)
    }

    /// The `latest` rows of `key`..`end`.
    fn latest_range(&self, key: &[u8], end: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
        self.rows_of(key, end, layout::latest_key)
    }

    /// The rows of a table keyed by `row(gen, key)` (a key first) for the keys `key`..`end`.
    fn rows_of(
        &self,
        key: &[u8],
        end: &[u8],
        row: fn(u64, &[u8]) -> Vec<u8>,
    ) -> (Vec<u8>, Option<Vec<u8>>) {
        let from = row(self.gen, key);
        let to = match end {
            [] => Some(row(self.gen, &just_after(key))),
            [0] => layout::prefix_end(&layout::gen_prefix(self.gen)),
            end if end <= key => Some(from.clone()),
            end => Some(row(self.gen, end)),
        };
        (from, to)
    }

    fn scan_latest(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        let mut bad = false;
        self.e
            .scan(
                Table::Latest,
                from,
                to,
                false,
                &mut |k, row| match decode_version(row) {
                    Some(v) => visit(layout::key_of_latest(k), &v),
                    None => {
                        bad = true;
                        false
                    }
                },
            )
            .map_err(storage)?;
        match bad {
            true => Err(malformed("latest")),
            false => Ok(()),
        }
    }

    /// A scan at a past revision: the keys current now whose version then is current, merged
    /// in key order with the keys whose version then is in the history.
    fn scan_past(
        &self,
        key: &[u8],
        end: &[u8],
        rev: i64,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        let mut found: std::collections::BTreeMap<Vec<u8>, Version> = Default::default();
        let (from, to) = self.latest_range(key, end);
        self.scan_latest(&from, to.as_deref(), &mut |k, v| {
            if v.mod_rev <= rev {
                found.insert(k.to_vec(), v.clone());
            }
            true
        })?;
        let (hist_from, hist_to) = self.rows_of(key, end, layout::history_start);
        let mut bad = false;
        let mut best: Option<(Vec<u8>, Vec<u8>)> = None; // per key, its newest row at or below rev
        let mut settle =
            |best: &mut Option<(Vec<u8>, Vec<u8>)>,
             found: &mut std::collections::BTreeMap<Vec<u8>, Version>| {
                if let Some((k, row)) = best.take() {
                    match decode_version(&row) {
                        Some(v) if v.value.is_some() => {
                            found.entry(k).or_insert(v);
                        }
                        Some(_) => {}
                        None => bad = true,
                    }
                }
            };
        self.e
            .scan(
                Table::History,
                &hist_from,
                hist_to.as_deref(),
                false,
                &mut |row_key, row| {
                    let Some(k) = layout::key_of_history(row_key) else {
                        return false;
                    };
                    if best.as_ref().is_some_and(|(b, _)| *b != k) {
                        settle(&mut best, &mut found);
                    }
                    if layout::rev_of_history(row_key) <= rev {
                        best = Some((k, row.to_vec()));
                    }
                    true
                },
            )
            .map_err(storage)?;
        settle(&mut best, &mut found);
        if bad {
            return Err(malformed("history"));
        }
        for (k, v) in &found {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    /// The keys attached to lease `id` now.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        let from = layout::lease_start(self.gen, id);
        let to = layout::prefix_end(&from);
        let mut keys = Vec::new();
        self.e
            .scan(
                Table::LeaseKeys,
                &from,
                to.as_deref(),
                false,
                &mut |k, _| {
                    keys.push(k[16..].to_vec());
                    true
                },
            )
            .map_err(storage)?;
        Ok(keys)
    }
}

/// One group's keyspace inside one engine batch of the raft thread: its generation and its
/// counters, written back with the batch ([`Batch::finish`]).
pub struct Batch<'a> {
    w: &'a mut dyn EngineWrite,
    gen: u64,
    /// The counters as this batch leaves them so far.
    pub counters: Counters,
}

impl<'a> Batch<'a> {
    /// Begin group `group`'s part of the engine batch `w`. A group with no generation yet gets
    /// the node's next one.
    pub fn begin(w: &'a mut dyn EngineWrite, group: u64) -> Result<Self, MvccError> {
        let mut gen = gen_of(&*w, group)?;
        if gen == 0 {
            gen = next_gen(w)?;
            w.put(Table::Groups, &layout::group_key(group), &encode_u64(gen))
                .map_err(storage)?;
        }
        let counters = counters_of(&*w, gen)?;
        Ok(Batch { w, gen, counters })
    }

    /// Reads of the keyspace as this batch leaves it so far.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            e: &*self.w,
            gen: self.gen,
            rev: self.counters.rev,
            compacted: self.counters.compacted,
            counters: self.counters,
        }
    }

    /// Start the change of the next revision.
    pub fn write(&mut self) -> Write<'_, 'a> {
        let rev = self.counters.rev + 1;
        Write {
            batch: self,
            rev,
            place: 0,
        }
    }

    /// Write the counters back (with `applied` the last index applied in the batch).
    pub fn finish(mut self, applied: u64) -> Result<Counters, MvccError> {
        assert!(
            applied >= self.counters.applied,
            "applied {applied} after {}",
            self.counters.applied
        );
        self.counters.applied = applied;
        self.put_counters()?;
        Ok(self.counters)
    }

    fn put_counters(&mut self) -> Result<(), MvccError> {
        debug_assert!(self.counters.compacted <= self.counters.rev);
        self.w
            .put(
                Table::Meta,
                &layout::meta_key(self.gen, COUNTERS),
                &self.counters.encode(),
            )
            .map_err(storage)
    }

    /// Set a row of this generation's `meta` table.
    pub fn set_meta(&mut self, name: &str, value: &[u8]) -> Result<(), MvccError> {
        assert_ne!(name, COUNTERS, "the counters are the batch's own");
        self.w
            .put(Table::Meta, &layout::meta_key(self.gen, name), value)
            .map_err(storage)
    }

    /// A lease ended: delete its keys, in one revision (none if it had no keys).
    pub fn end_lease(&mut self, id: i64) -> Result<(), MvccError> {
        let keys = self.reader().lease_keys(id)?;
        let mut w = self.write();
        for k in keys {
            w.delete(&k)?;
        }
        w.commit();
        Ok(())
    }

    fn attach(&mut self, key: &[u8], lease: i64) -> Result<(), MvccError> {
        if lease == 0 {
            return Ok(());
        }
        let row = layout::lease_key(self.gen, lease, key);
        self.w.put(Table::LeaseKeys, &row, &[]).map_err(storage)
    }

    fn detach(&mut self, key: &[u8], lease: i64) -> Result<(), MvccError> {
        if lease == 0 {
            return Ok(());
        }
        let row = layout::lease_key(self.gen, lease, key);
        self.w.delete(Table::LeaseKeys, &row).map_err(storage)
    }
}

/// The next generation of the node (from 1).
fn next_gen(w: &mut dyn EngineWrite) -> Result<u64, MvccError> {
    let next = match w.get(Table::Groups, layout::NEXT_GEN).map_err(storage)? {
        None => 1,
        Some(row) => decode_u64(&row).ok_or_else(|| malformed("next_gen"))?,
    };
    w.put(Table::Groups, layout::NEXT_GEN, &encode_u64(next + 1))
        .map_err(storage)?;
    Ok(next)
}

/// The change of one revision in the making: every write in it gets `rev`; the revision moves
/// only if something was written ([`Write::commit`]).
pub struct Write<'b, 'a> {
    batch: &'b mut Batch<'a>,
    /// The revision this change will have.
    pub rev: i64,
    /// Keys changed so far in this revision.
    place: u32,
}

impl Write<'_, '_> {
    /// The keyspace as this change leaves it so far (reads see its own writes at `self.rev`).
    pub fn view(&self) -> Reader<'_> {
        self.batch.reader()
    }

    /// Write `key`: its previous live version (if any) is returned.
    pub fn put(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        lease: i64,
    ) -> Result<Option<Version>, MvccError> {
        let rev = self.rev;
        let prev = self.batch.reader().latest(key)?;
        let (create_rev, version) = match &prev {
            Some(p) => (p.create_rev, p.version + 1),
            None => (rev, 1),
        };
        if let Some(p) = &prev {
            assert!(
                p.mod_rev < rev,
                "key {key:?} written twice at revision {rev}"
            );
            self.retire(key, p)?;
        }
        self.batch.attach(key, lease)?;
        let v = Version {
            create_rev,
            mod_rev: rev,
            version,
            lease,
            value: Some(value),
        };
        self.batch.counters.bytes += v.cost(key);
        let row = layout::latest_key(self.batch.gen, key);
        self.batch
            .w
            .put(Table::Latest, &row, &encode_version(&v))
            .map_err(storage)?;
        self.changed(key)?;
        Ok(prev)
    }

    /// Delete `key` if it exists now: its last version, if it did.
    pub fn delete(&mut self, key: &[u8]) -> Result<Option<Version>, MvccError> {
        let rev = self.rev;
        let Some(prev) = self.batch.reader().latest(key)? else {
            return Ok(None);
        };
        assert!(
            prev.mod_rev < rev,
            "key {key:?} written twice at revision {rev}"
        );
        self.retire(key, &prev)?;
        let tombstone = Version {
            create_rev: 0,
            mod_rev: rev,
            version: 0,
            lease: 0,
            value: None,
        };
        self.batch.counters.bytes += tombstone.cost(key);
        let row = layout::history_key(self.batch.gen, key, rev);
        let b = &mut *self.batch;
        b.w.put(Table::History, &row, &encode_version(&tombstone))
            .map_err(storage)?;
        b.w.delete(Table::Latest, &layout::latest_key(b.gen, key))
            .map_err(storage)?;
        self.changed(key)?;
        Ok(Some(prev))
    }

    /// `prev`, the current version of `key`, is current no more: into the history it goes.
    fn retire(&mut self, key: &[u8], prev: &Version) -> Result<(), MvccError> {
        self.batch.detach(key, prev.lease)?;
        let row = layout::history_key(self.batch.gen, key, prev.mod_rev);
        self.batch
            .w
            .put(Table::History, &row, &encode_version(prev))
            .map_err(storage)
    }

    fn changed(&mut self, key: &[u8]) -> Result<(), MvccError> {
        let row = layout::change_key(self.batch.gen, self.rev, self.place);
        self.place += 1;
        self.batch.w.put(Table::Changes, &row, key).map_err(storage)
    }

    /// End the change: the revision moves by one if anything was written. The revision it
    /// leaves.
    pub fn commit(self) -> i64 {
        if self.place > 0 {
            self.batch.counters.rev = self.rev;
        }
        debug_assert!(self.batch.counters.rev == self.rev || self.place == 0);
        self.batch.counters.rev
    }
}

#[cfg(test)]
mod tests;
