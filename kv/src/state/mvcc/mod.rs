//! etcd's keyspace, with its history (MVCC, as etcd has it): one revision counter that moves by
//! one for each change (a transaction that writes is one change, however many keys it writes),
//! and per key its `create_revision`, `mod_revision` and `version`. Reads at a past revision are
//! served until that revision is compacted. Keys and values are bytes.
//!
//! Applying is deterministic and compares no time: every replica holds the same history. A
//! lease here is a session of the store's sessions (`kv_state`); the keys attached to each live
//! lease are kept here, and a lease's end deletes them in one revision.
//!
//! This keyspace is apart from the HTTP API's keys (whose `revision` is the raft index): one key
//! space with two revision counters would make one of them lie.

pub mod errors;
pub mod image;
pub mod range;
pub mod txn;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use etcd_client::proto::PbKeyValue as KeyValue;

pub use errors::MvccError;

/// What a version costs in the byte count besides its key and value bytes.
pub const VERSION_OVERHEAD_BYTES: u64 = 64;

/// One version of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The revision that created the key (0 in a tombstone).
    pub create_rev: i64,
    /// The revision of this change.
    pub mod_rev: i64,
    /// How many times the key was written since it was created (0 in a tombstone).
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
    /// The value; `None`: the key was deleted at `mod_rev` (a tombstone).
    pub value: Option<Vec<u8>>,
}

impl Version {
    /// This version as etcd's `KeyValue` of `key` (a tombstone: the key and `mod_revision` only,
    /// as etcd's delete events have it).
    pub fn key_value(&self, key: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: self.create_rev,
            mod_revision: self.mod_rev,
            version: self.version,
            value: self.value.clone().unwrap_or_default(),
            lease: self.lease,
        }
    }

    fn cost(&self, key: &[u8]) -> u64 {
        key.len() as u64 + self.value.as_ref().map_or(0, Vec::len) as u64 + VERSION_OVERHEAD_BYTES
    }
}

/// The keyspace and its history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mvcc {
    /// The revision of the last change: 1 in an empty store, as in etcd. Never decreases.
    rev: i64,
    /// Revisions below this one are gone (reads and watches from them are refused); 0: none.
    /// Invariant: `compacted <= rev`.
    compacted: i64,
    /// Every key's versions, oldest first, each with a larger `mod_rev` than the one before.
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    /// The keys each revision from `compacted` on changed, in the order it changed them.
    changes: BTreeMap<i64, Vec<Vec<u8>>>,
    /// The keys attached to each lease, as of the last revision.
    lease_keys: BTreeMap<i64, BTreeSet<Vec<u8>>>,
    /// Bytes of every version kept, with [`VERSION_OVERHEAD_BYTES`] each.
    bytes: u64,
}

impl Default for Mvcc {
    fn default() -> Self {
        Mvcc::new()
    }
}

/// The keys from `key` to `end`, as etcd reads a key and its `range_end`: an empty `end` is the
/// key alone, `\0` is every key from `key` on, anything else is `[key, end)`.
pub fn bounds(key: &[u8], end: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = Bound::Included(key.to_vec());
    match end {
        [] => (start, Bound::Included(key.to_vec())),
        [0] => (start, Bound::Unbounded),
        // An end at or before the key is an empty range (never a panic of `BTreeMap::range`).
        end if end <= key => (start, Bound::Excluded(key.to_vec())),
        end => (start, Bound::Excluded(end.to_vec())),
    }
}

/// Whether `k` is in the range `key`..`end` (see [`bounds`]).
pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

/// The newest of `vs` (oldest first) at `rev`, if it is not a tombstone: a binary search.
fn latest_at(vs: &[Version], rev: i64) -> Option<&Version> {
    let at = vs.partition_point(|v| v.mod_rev <= rev).checked_sub(1)?;
    let v = &vs[at];
    v.value.as_ref().map(|_| v)
}

impl Mvcc {
    /// An empty keyspace at revision 1.
    pub fn new() -> Self {
        Mvcc {
            rev: 1,
            compacted: 0,
            keys: BTreeMap::new(),
            changes: BTreeMap::new(),
            lease_keys: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// The revision of the last change.
    pub fn rev(&self) -> i64 {
        self.rev
    }

    /// The compacted revision (0: none).
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// Bytes of every version kept.
    pub fn bytes(&self) -> u64 {
        self.bytes
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

    /// `key`'s version at `rev`, if the key existed then.
    pub fn version_at(&self, key: &[u8], rev: i64) -> Option<&Version> {
        latest_at(self.keys.get(key)?, rev)
    }

    /// The keys in `key`..`end` that existed at `rev`, in key order, with their version then.
    pub fn scan_at<'a>(
        &'a self,
        key: &[u8],
        end: &[u8],
        rev: i64,
    ) -> impl Iterator<Item = (&'a [u8], &'a Version)> + 'a {
        self.keys
            .range(bounds(key, end))
            .filter_map(move |(k, vs)| latest_at(vs, rev).map(|v| (k.as_slice(), v)))
    }

    /// The keys attached to lease `id` now.
    pub fn lease_keys(&self, id: i64) -> Vec<Vec<u8>> {
        self.lease_keys
            .get(&id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Start the change of the next revision.
    pub fn write(&mut self) -> Write<'_> {
        let rev = self.rev + 1;
        Write {
            mvcc: self,
            rev,
            wrote: false,
        }
    }

    /// A lease ended: delete its keys, in one revision (none if it had no keys).
    pub fn end_lease(&mut self, id: i64) {
        let keys = self.lease_keys(id);
        let mut w = self.write();
        for k in keys {
            w.delete(&k);
        }
        w.commit();
        self.lease_keys.remove(&id);
    }

    /// Drop the history below `at`: each key keeps its version at `at` (none if it was
    /// deleted by then), and reads and watches below `at` are refused from now on.
    pub fn compact(&mut self, at: i64) -> Result<(), MvccError> {
        if at > self.rev {
            return Err(MvccError::FutureRev);
        }
        if at <= self.compacted {
            return Err(MvccError::Compacted);
        }
        let mut freed = 0;
        self.keys.retain(|k, vs| {
            let keep_from = vs.iter().rposition(|v| v.mod_rev <= at).unwrap_or(0);
            let gone_tombstone = vs[keep_from].mod_rev <= at && vs[keep_from].value.is_none();
            let cut = keep_from + usize::from(gone_tombstone);
            freed += vs[..cut].iter().map(|v| v.cost(k)).sum::<u64>();
            vs.drain(..cut);
            !vs.is_empty()
        });
        self.bytes -= freed;
        self.changes = self.changes.split_off(&at);
        // A change at `at` itself stays while its version does (a deletion's tombstone is gone).
        let keys = &self.keys;
        if let Some(at_changes) = self.changes.get_mut(&at) {
            at_changes.retain(|k| {
                keys.get(k)
                    .is_some_and(|vs| vs.iter().any(|v| v.mod_rev == at))
            });
            if at_changes.is_empty() {
                self.changes.remove(&at);
            }
        }
        self.compacted = at;
        debug_assert!(self.compacted <= self.rev);
        Ok(())
    }
}

/// The change of one revision in the making: every write in it gets `rev`; the revision moves
/// only if something was written ([`Write::commit`]).
pub struct Write<'a> {
    mvcc: &'a mut Mvcc,
    /// The revision this change will have.
    pub rev: i64,
    wrote: bool,
}

impl Write<'_> {
    /// The keyspace as this change leaves it so far (reads see its own writes at `self.rev`).
    pub fn view(&self) -> &Mvcc {
        self.mvcc
    }

    /// Write `key`: its previous live version (if any) is returned.
    pub fn put(&mut self, key: &[u8], value: Vec<u8>, lease: i64) -> Option<Version> {
        let rev = self.rev;
        let prev = self.mvcc.version_at(key, rev).cloned();
        let (create_rev, version) = match &prev {
            Some(p) => (p.create_rev, p.version + 1),
            None => (rev, 1),
        };
        if let Some(p) = &prev {
            self.detach(key, p.lease);
        }
        if lease != 0 {
            let set = self.mvcc.lease_keys.entry(lease).or_default();
            set.insert(key.to_vec());
        }
        let v = Version {
            create_rev,
            mod_rev: rev,
            version,
            lease,
            value: Some(value),
        };
        self.push(key, v);
        prev
    }

    /// Delete `key` if it exists now: its last version, if it did.
    pub fn delete(&mut self, key: &[u8]) -> Option<Version> {
        let rev = self.rev;
        let prev = self.mvcc.version_at(key, rev).cloned()?;
        self.detach(key, prev.lease);
        let tombstone = Version {
            create_rev: 0,
            mod_rev: rev,
            version: 0,
            lease: 0,
            value: None,
        };
        self.push(key, tombstone);
        Some(prev)
    }

    fn detach(&mut self, key: &[u8], lease: i64) {
        if let Some(set) = self.mvcc.lease_keys.get_mut(&lease) {
            set.remove(key);
            // No empty sets: a snapshot does not keep them, and replicas must compare equal.
            if set.is_empty() {
                self.mvcc.lease_keys.remove(&lease);
            }
        }
    }

    fn push(&mut self, key: &[u8], v: Version) {
        let m = &mut *self.mvcc;
        m.bytes += v.cost(key);
        let vs = m.keys.entry(key.to_vec()).or_default();
        // A key is written at most once per revision (a transaction's keys are checked for
        // overlaps before it runs).
        assert!(
            vs.last().is_none_or(|last| last.mod_rev < v.mod_rev),
            "key {key:?} written twice at revision {}",
            v.mod_rev
        );
        vs.push(v);
        m.changes.entry(self.rev).or_default().push(key.to_vec());
        self.wrote = true;
    }

    /// End the change: the revision moves by one if anything was written. The revision it
    /// leaves.
    pub fn commit(self) -> i64 {
        if self.wrote {
            self.mvcc.rev = self.rev;
        }
        debug_assert!(self.mvcc.rev == self.rev || !self.wrote);
        self.mvcc.rev
    }
}

#[cfg(test)]
mod tests;
