//! Generations: a group's data lives under one generation prefix (`layout`), named by its row
//! in `groups`. A snapshot received is written under a new generation, beside the current one,
//! in short batches that never hold the engine's writer for long; one small batch then makes it
//! the group's and marks the old one dead. Rows of dead generations are removed later, a bounded
//! batch at a time. A crash at any point leaves either the old generation current (the new one
//! dead, to be removed) or the new one: never a mix.

use crate::disk::state_engine::{EngineRead, EngineWrite, StateEngine, Table};
use crate::state::mvcc::{counters_of, gen_of, layout, next_gen, storage, MvccError};
use crate::state::stream::{Row, GROUP_TABLES};

const DEAD: &[u8] = b"dead";

fn dead_key(gen: u64) -> Vec<u8> {
    let mut k = DEAD.to_vec();
    k.extend_from_slice(&gen.to_be_bytes());
    k
}

/// A new generation being written for a group.
pub struct Staging {
    engine: StateEngine,
    group: u64,
    gen: u64,
    rows: u64,
}

impl Staging {
    /// Begin a new generation for `group`: dead until [`Staging::finish`] makes it the group's.
    pub fn begin(engine: &StateEngine, group: u64) -> Result<Self, MvccError> {
        let gen = engine
            .write(false, |w| {
                let gen = next_gen(w).map_err(to_engine)?;
                w.put(Table::Groups, &dead_key(gen), &[])?;
                Ok(gen)
            })
            .map_err(storage)?;
        Ok(Staging {
            engine: engine.clone(),
            group,
            gen,
            rows: 0,
        })
    }

    /// Write `rows` (keys without a generation prefix) into the new generation, in one batch.
    pub fn put_rows(&mut self, rows: &[Row]) -> Result<(), MvccError> {
        let gen = self.gen;
        self.engine
            .write(false, |w| {
                for r in rows {
                    debug_assert!(GROUP_TABLES.contains(&r.table));
                    let mut key = layout::gen_prefix(gen).to_vec();
                    key.extend_from_slice(&r.key);
                    w.put(r.table, &key, &r.value)?;
                }
                Ok(())
            })
            .map_err(storage)?;
        self.rows += rows.len() as u64;
        Ok(())
    }

    /// Seal the new generation as the one to install for the state at `applied`, if its
    /// counters say it holds that state: one durable batch records the install (it is no longer
    /// dead), and [`complete_install`] then makes it the group's. Between the two the caller
    /// makes the raft log take the snapshot; a crash in between is settled at the next start
    /// by [`settle_install`].
    pub fn seal(self, applied: u64) -> Result<(), MvccError> {
        let (group, gen) = (self.group, self.gen);
        let counters = counters_of(&self.engine.view().map_err(storage)?, gen)?;
        if counters.applied != applied {
            return Err(MvccError::Storage(format!(
                "a snapshot for index {applied} holds the state at {}",
                counters.applied
            )));
        }
        let mut intent = layout::encode_u64(gen).to_vec();
        intent.extend_from_slice(&layout::encode_u64(applied));
        self.engine
            .write(true, |w| {
                w.delete(Table::Groups, &dead_key(gen))?;
                w.put(Table::Groups, &intent_key(group), &intent)
            })
            .map_err(storage)
    }
}

fn intent_key(group: u64) -> Vec<u8> {
    let mut k = INSTALL.to_vec();
    k.extend_from_slice(&group.to_be_bytes());
    k
}

const INSTALL: &[u8] = b"install";

/// The install sealed for `group` and not completed: (its generation, the index it holds).
pub fn sealed_install(r: &dyn EngineRead, group: u64) -> Result<Option<(u64, u64)>, MvccError> {
    let Some(row) = r.get(Table::Groups, &intent_key(group)).map_err(storage)? else {
        return Ok(None);
    };
    let n = |i: usize| row.get(i..i + 8).and_then(layout::decode_u64);
    match (n(0), n(8), row.len()) {
        (Some(gen), Some(index), 16) => Ok(Some((gen, index))),
        _ => Err(MvccError::Storage("a malformed install row".into())),
    }
}

/// Make the generation sealed for `group` the group's, and the old one dead, in one durable
/// batch. Returns whether there was one.
pub fn complete_install(engine: &StateEngine, group: u64) -> Result<bool, MvccError> {
    engine
        .write(true, |w| {
            let Some((gen, _)) = sealed_install(&*w, group).map_err(to_engine)? else {
                return Ok(false);
            };
            let old = gen_of(&*w, group).map_err(to_engine)?;
            if old != 0 {
                w.put(Table::Groups, &dead_key(old), &[])?;
            }
            w.delete(Table::Groups, &intent_key(group))?;
            w.put(
                Table::Groups,
                &layout::group_key(group),
                &layout::encode_u64(gen),
            )?;
            Ok(true)
        })
        .map_err(storage)
}

/// At start, an install a crash left half done: complete it if the raft log took its snapshot
/// (`log_snapshot_index` at or past its index), else drop it (the raft log and the state are
/// both as before it). Returns whether it was completed.
pub fn settle_install(
    engine: &StateEngine,
    group: u64,
    log_snapshot_index: u64,
) -> Result<bool, MvccError> {
    let view = engine.view().map_err(storage)?;
    let Some((gen, index)) = sealed_install(&view, group)? else {
        return Ok(false);
    };
    drop(view);
    if log_snapshot_index >= index {
        return complete_install(engine, group);
    }
    engine
        .write(true, |w| {
            w.put(Table::Groups, &dead_key(gen), &[])?;
            w.delete(Table::Groups, &intent_key(group))
        })
        .map_err(storage)?;
    Ok(false)
}

fn to_engine(e: MvccError) -> crate::disk::state_engine::EngineError {
    crate::disk::state_engine::EngineError::Io(e.to_string())
}

/// Whether any dead generation has rows left.
pub fn dead_left(r: &dyn EngineRead) -> Result<bool, MvccError> {
    let mut any = false;
    let end = layout::prefix_end(DEAD);
    r.scan(Table::Groups, DEAD, end.as_deref(), false, &mut |_, _| {
        any = true;
        false
    })
    .map_err(storage)?;
    Ok(any)
}

/// Remove up to `budget` rows of dead generations, in one batch; a generation with no rows
/// left is forgotten. Returns how many rows went.
pub fn collect_dead(engine: &StateEngine, budget: usize) -> Result<usize, MvccError> {
    engine
        .write(false, |w| {
            let mut dead = Vec::new();
            let end = layout::prefix_end(DEAD);
            w.scan(Table::Groups, DEAD, end.as_deref(), false, &mut |k, _| {
                dead.push(u64::from_be_bytes(k[4..12].try_into().expect("8 bytes")));
                dead.len() < 16
            })?;
            let mut removed = 0;
            for gen in dead {
                let prefix = layout::gen_prefix(gen);
                let end = layout::prefix_end(&prefix);
                let mut keys: Vec<(Table, Vec<u8>)> = Vec::new();
                for t in GROUP_TABLES {
                    w.scan(t, &prefix, end.as_deref(), false, &mut |k, _| {
                        keys.push((t, k.to_vec()));
                        removed + keys.len() < budget
                    })?;
                }
                let emptied = removed + keys.len() < budget;
                removed += keys.len();
                for (t, k) in keys {
                    w.delete(t, &k)?;
                }
                if emptied {
                    w.delete(Table::Groups, &dead_key(gen))?;
                }
                if removed >= budget {
                    break;
                }
            }
            Ok(removed)
        })
        .map_err(storage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::mvcc::{Batch, Keyspace};

    fn put(engine: &StateEngine, group: u64, key: &[u8], applied: u64) {
        engine
            .write(false, |w| {
                let mut b = Batch::begin(w, group).map_err(to_engine)?;
                let mut wr = b.write();
                wr.put(key, b"v".to_vec(), 0).map_err(to_engine)?;
                wr.commit();
                b.finish(applied).map_err(to_engine)?;
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn a_new_generation_replaces_the_old_whole_and_the_old_one_is_collected() {
        let e = StateEngine::in_memory();
        put(&e, 3, b"old", 5);
        let ks = Keyspace::open(e.clone(), 3).unwrap();
        // The rows a sender's stream would carry: another store's group at index 9.
        let other = StateEngine::in_memory();
        put(&other, 0, b"new", 9);
        let v = other.view().unwrap();
        let mut rows = Vec::new();
        for t in GROUP_TABLES {
            v.scan(t, &[], None, false, &mut |k, val| {
                rows.push(Row {
                    table: t,
                    key: k[8..].to_vec(),
                    value: val.to_vec(),
                });
                true
            })
            .unwrap();
        }
        let mut s = Staging::begin(&e, 3).unwrap();
        s.put_rows(&rows).unwrap();
        assert!(
            ks.read(|r| r.latest(b"new")).unwrap().is_none(),
            "not the group's yet"
        );
        assert!(
            Staging::begin(&e, 3).unwrap().seal(9).is_err(),
            "an empty one"
        );
        s.seal(9).unwrap();
        assert!(
            ks.read(|r| r.latest(b"new")).unwrap().is_none(),
            "sealed, not installed"
        );
        assert!(complete_install(&e, 3).unwrap());
        assert_eq!(ks.read(|r| Ok(r.counters().applied)).unwrap(), 9);
        assert!(ks.read(|r| r.latest(b"new")).unwrap().is_some());
        assert!(ks.read(|r| r.latest(b"old")).unwrap().is_none());
        assert!(dead_left(&e.view().unwrap()).unwrap());
        while collect_dead(&e, 2).unwrap() > 0 {}
        assert!(!dead_left(&e.view().unwrap()).unwrap());
        assert!(
            ks.read(|r| r.latest(b"new")).unwrap().is_some(),
            "the live one stays"
        );
    }
}
