//! Writes of one group's keyspace inside one engine batch of the raft thread: a revision at a
//! time, each key's old version moved to the history as a new one takes its place.

use crate::disk::state_engine::{EngineWrite, Table};
use crate::state::mvcc::counters::{counters_of, gen_of, next_gen, storage, Counters, COUNTERS};
use crate::state::mvcc::errors::MvccError;
use crate::state::mvcc::layout::{self, encode_u64, encode_version};
use crate::state::mvcc::reader::Reader;
use crate::state::mvcc::version::Version;

/// One group's keyspace inside one engine batch of the raft thread: its generation and its
/// counters, written back with the batch ([`Batch::finish`]).
pub struct Batch<'a> {
    pub(super) w: &'a mut dyn EngineWrite,
    pub(super) gen: u64,
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
