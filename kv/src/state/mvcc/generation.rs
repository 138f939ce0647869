//! Generations: a group's data lives under one generation prefix (`layout`), named by its row
//! in `groups`. A snapshot received is written under a new generation, beside the current one,
//! in short batches that never hold the engine's writer for long; one small batch then makes it
//! the group's and marks the old one dead. Rows of dead generations are removed later, a bounded
//! batch at a time. A crash at any point leaves either the old generation current (the new one
//! dead, to be removed) or the new one: never a mix.
//!
//! **A generation being written is not dead**: it carries a staging mark naming the engine's
//! opening that writes it, and only a mark of an earlier opening (a process that died while
//! it wrote) or a stream given up (the mark turned dead when its writer is dropped) makes its
//! rows collectable. Collecting the rows of a stream still being written, and sealing what is
//! left, would install a state missing them.

use crate::disk::state_engine::{EngineError, EngineRead, EngineWrite, StateEngine, Table};
use crate::state::mvcc::counters::{counters_of, gen_of, next_gen, storage};
use crate::state::mvcc::{layout, MvccError};
use crate::state::stream::{Row, GROUP_TABLES};

const DEAD: &[u8] = b"dead";
const STAGING: &[u8] = b"staging";

fn dead_key(gen: u64) -> Vec<u8> {
    marked(DEAD, gen)
}

fn staging_key(gen: u64) -> Vec<u8> {
    marked(STAGING, gen)
}

fn marked(mark: &[u8], gen: u64) -> Vec<u8> {
    let mut k = mark.to_vec();
    k.extend_from_slice(&gen.to_be_bytes());
    k
}

/// A new generation being written for a group.
pub struct Staging {
    engine: StateEngine,
    group: u64,
    gen: u64,
    rows: u64,
    /// Sealed: its mark is gone, and dropping it changes nothing.
    sealed: bool,
}

impl Staging {
    /// Begin a new generation for `group`, marked as staged by this opening of the engine:
    /// its rows are never collected while it is written; given up (dropped unsealed) or left
    /// by an earlier process, it is dead.
    pub fn begin(engine: &StateEngine, group: u64) -> Result<Self, MvccError> {
        let opening = layout::encode_u64(engine.opening());
        let gen = engine
            .write(false, |w| {
                let gen = next_gen(w).map_err(to_engine)?;
                w.put(Table::Groups, &staging_key(gen), &opening)?;
                Ok(gen)
            })
            .map_err(storage)?;
        Ok(Staging {
            engine: engine.clone(),
            group,
            gen,
            rows: 0,
            sealed: false,
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

    /// Seal the new generation as install `id` of the state its counters hold (at `expect`, if
    /// given: anything else is refused): one durable batch records the install (the generation
    /// is no longer dead), and [`complete_install`] then makes it the group's. Between the two
    /// the caller makes the raft log take the snapshot; a crash in between is settled at the
    /// next start by [`settle_install`]. Returns the index the state is at.
    pub fn seal(mut self, id: u64, expect: Option<u64>) -> Result<u64, MvccError> {
        let (group, gen) = (self.group, self.gen);
        let opening = layout::encode_u64(self.engine.opening());
        let applied = self
            .engine
            .write(true, |w| {
                // Checked in the batch that seals: nothing can change the generation between.
                if w.get(Table::Groups, &staging_key(gen))?.as_deref() != Some(&opening[..]) {
                    return Err(EngineError::Io(format!("generation {gen} was given up")));
                }
                let applied = counters_of(&*w, gen).map_err(to_engine)?.applied;
                if expect.is_some_and(|e| e != applied) || applied == 0 {
                    return Err(EngineError::Io(format!(
                        "a snapshot for index {expect:?} holds the state at {applied}"
                    )));
                }
                let mut intent = layout::encode_u64(gen).to_vec();
                intent.extend_from_slice(&layout::encode_u64(applied));
                w.delete(Table::Groups, &staging_key(gen))?;
                w.put(Table::Groups, &intent_key(group, id), &intent)?;
                Ok(applied)
            })
            .map_err(storage)?;
        self.sealed = true;
        Ok(applied)
    }
}

impl Drop for Staging {
    /// A generation given up (its stream failed, was cut or forged) is dead: its rows go.
    fn drop(&mut self) {
        if self.sealed {
            return;
        }
        let gen = self.gen;
        let _ = self.engine.write(false, |w| {
            w.delete(Table::Groups, &staging_key(gen))?;
            w.put(Table::Groups, &dead_key(gen), &[])
        });
    }
}

fn intent_key(group: u64, id: u64) -> Vec<u8> {
    let mut k = intents_of(group);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn intents_of(group: u64) -> Vec<u8> {
    let mut k = INSTALL.to_vec();
    k.extend_from_slice(&group.to_be_bytes());
    k
}

const INSTALL: &[u8] = b"install";

/// Every install sealed for `group` and not completed: (its id, its generation, the index it
/// holds).
pub fn sealed_installs(r: &dyn EngineRead, group: u64) -> Result<Vec<(u64, u64, u64)>, MvccError> {
    let from = intents_of(group);
    let to = layout::prefix_end(&from);
    let mut rows = Vec::new();
    r.scan(Table::Groups, &from, to.as_deref(), false, &mut |k, v| {
        rows.push((k.to_vec(), v.to_vec()));
        true
    })
    .map_err(storage)?;
    let mut out = Vec::with_capacity(rows.len());
    for (k, v) in rows {
        let n = |b: &[u8], i: usize| b.get(i..i + 8).and_then(layout::decode_u64);
        match (n(&k, from.len()), n(&v, 0), n(&v, 8), v.len()) {
            (Some(id), Some(gen), Some(index), 16) => out.push((id, gen, index)),
            _ => return Err(MvccError::Storage("a malformed install row".into())),
        }
    }
    Ok(out)
}

/// The index sealed install `id` of `group` holds, if it is sealed.
pub fn sealed_index(r: &dyn EngineRead, group: u64, id: u64) -> Result<Option<u64>, MvccError> {
    let installs = sealed_installs(r, group)?;
    Ok(installs
        .into_iter()
        .find(|(i, _, _)| *i == id)
        .map(|(_, _, index)| index))
}

/// Make sealed install `id` of `group` the group's, and the old generation dead, in one
/// durable batch. Returns whether there was one.
pub fn complete_install(engine: &StateEngine, group: u64, id: u64) -> Result<bool, MvccError> {
    engine
        .write(true, |w| {
            let found = sealed_installs(&*w, group).map_err(to_engine)?;
            let Some(&(_, gen, _)) = found.iter().find(|(i, _, _)| *i == id) else {
                return Ok(false);
            };
            let old = gen_of(&*w, group).map_err(to_engine)?;
            if old != 0 {
                w.put(Table::Groups, &dead_key(old), &[])?;
            }
            w.delete(Table::Groups, &intent_key(group, id))?;
            w.put(
                Table::Groups,
                &layout::group_key(group),
                &layout::encode_u64(gen),
            )?;
            Ok(true)
        })
        .map_err(storage)
}

/// Drop the installs sealed for `group` that `keep` refuses: each generation dead, its record
/// gone. Returns how many were dropped.
pub fn drop_installs(
    engine: &StateEngine,
    group: u64,
    keep: impl Fn(u64, u64) -> bool,
) -> Result<usize, MvccError> {
    engine
        .write(true, |w| {
            let found = sealed_installs(&*w, group).map_err(to_engine)?;
            let mut dropped = 0;
            for (id, gen, index) in found {
                if !keep(id, index) {
                    w.put(Table::Groups, &dead_key(gen), &[])?;
                    w.delete(Table::Groups, &intent_key(group, id))?;
                    dropped += 1;
                }
            }
            Ok(dropped)
        })
        .map_err(storage)
}

/// At start, an install a crash left half done: the one at the raft log's snapshot index
/// (`log_snapshot_index`) is completed if the state is behind it (the log took it, the state
/// did not yet), every other is dropped. Returns whether one was completed.
pub fn settle_install(
    engine: &StateEngine,
    group: u64,
    log_snapshot_index: u64,
    applied: u64,
) -> Result<bool, MvccError> {
    let found = sealed_installs(&engine.view().map_err(storage)?, group)?;
    let take = found
        .iter()
        .find(|(_, _, index)| *index == log_snapshot_index && applied < log_snapshot_index)
        .map(|(id, _, _)| *id);
    drop_installs(engine, group, |id, _| Some(id) == take)?;
    match take {
        Some(id) => complete_install(engine, group, id),
        None => Ok(false),
    }
}

fn to_engine(e: MvccError) -> crate::disk::state_engine::EngineError {
    crate::disk::state_engine::EngineError::Io(e.to_string())
}

/// The generations whose rows may go (at most `max`): every dead one, and every one staged by
/// an earlier opening of the engine (its writer died with its process). Each with its mark.
fn collectable(
    r: &dyn EngineRead,
    opening: u64,
    max: usize,
) -> Result<Vec<(u64, Vec<u8>)>, EngineError> {
    let mut out = Vec::new();
    for mark in [DEAD, STAGING] {
        let end = layout::prefix_end(mark);
        r.scan(Table::Groups, mark, end.as_deref(), false, &mut |k, v| {
            let gen = k.get(mark.len()..).and_then(layout::decode_u64);
            let stale = mark == DEAD || layout::decode_u64(v) != Some(opening);
            if let (Some(gen), true) = (gen, stale) {
                out.push((gen, k.to_vec()));
            }
            out.len() < max
        })?;
    }
    Ok(out)
}

/// Whether any generation has rows to collect.
pub fn dead_left(engine: &StateEngine) -> Result<bool, MvccError> {
    let view = engine.view().map_err(storage)?;
    Ok(!collectable(&view, engine.opening(), 1)
        .map_err(storage)?
        .is_empty())
}

/// Remove up to `budget` rows of collectable generations (dead ones, and ones an earlier
/// process staged), in one batch; a generation with no rows left is forgotten. Returns how many
/// rows went.
pub fn collect_dead(engine: &StateEngine, budget: usize) -> Result<usize, MvccError> {
    let opening = engine.opening();
    engine
        .write(false, |w| {
            let mut removed = 0;
            for (gen, mark) in collectable(&*w, opening, 16)? {
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
                    w.delete(Table::Groups, &mark)?;
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
            Staging::begin(&e, 3).unwrap().seal(1, None).is_err(),
            "an empty one"
        );
        assert_eq!(s.seal(7, Some(9)).unwrap(), 9);
        assert!(
            ks.read(|r| r.latest(b"new")).unwrap().is_none(),
            "sealed, not installed"
        );
        assert_eq!(sealed_index(&e.view().unwrap(), 3, 7).unwrap(), Some(9));
        assert!(complete_install(&e, 3, 7).unwrap());
        assert_eq!(sealed_index(&e.view().unwrap(), 3, 7).unwrap(), None);
        assert_eq!(ks.read(|r| Ok(r.counters().applied)).unwrap(), 9);
        assert!(ks.read(|r| r.latest(b"new")).unwrap().is_some());
        assert!(ks.read(|r| r.latest(b"old")).unwrap().is_none());
        assert!(dead_left(&e).unwrap());
        while collect_dead(&e, 2).unwrap() > 0 {}
        assert!(!dead_left(&e).unwrap());
        assert!(
            ks.read(|r| r.latest(b"new")).unwrap().is_some(),
            "the live one stays"
        );
    }

    #[test]
    fn a_generation_being_written_is_never_collected_and_one_given_up_is() {
        let e = StateEngine::in_memory();
        put(&e, 0, b"live", 5);
        let source = StateEngine::in_memory();
        put(&source, 0, b"streamed", 9);
        let v = source.view().unwrap();
        let mut rows = Vec::new();
        for t in GROUP_TABLES {
            v.scan(t, &[], None, false, &mut |k, val| {
                let (table, key, value) = (t, k[8..].to_vec(), val.to_vec());
                rows.push(Row { table, key, value });
                true
            })
            .unwrap();
        }
        // Upkeep runs between every batch of a stream: none of its rows may go.
        let mut s = Staging::begin(&e, 0).unwrap();
        for r in &rows {
            s.put_rows(std::slice::from_ref(r)).unwrap();
            while collect_dead(&e, 1).unwrap() > 0 {}
        }
        assert_eq!(s.seal(1, Some(9)).unwrap(), 9);
        assert!(complete_install(&e, 0, 1).unwrap());
        while collect_dead(&e, 1).unwrap() > 0 {}
        let ks = Keyspace::open(e.clone(), 0).unwrap();
        assert!(
            ks.read(|r| r.latest(b"streamed")).unwrap().is_some(),
            "every streamed row"
        );
        assert_eq!(ks.read(|r| Ok(r.counters().applied)).unwrap(), 9);
        // A stream given up is dead; one an earlier process left (another opening) is too.
        let mut given_up = Staging::begin(&e, 0).unwrap();
        given_up.put_rows(&rows).unwrap();
        drop(given_up);
        assert!(dead_left(&e).unwrap());
        while collect_dead(&e, 1).unwrap() > 0 {}
        assert!(!dead_left(&e).unwrap());
        let left = Staging::begin(&e, 0).unwrap();
        let gen = left.gen;
        std::mem::forget(left); // its process died: no drop ran
        e.write(false, |w| {
            w.put(Table::Groups, &staging_key(gen), &layout::encode_u64(1))
        })
        .unwrap();
        assert!(dead_left(&e).unwrap(), "staged by another opening");
        while collect_dead(&e, 1).unwrap() > 0 {}
        assert!(!dead_left(&e).unwrap());
        assert!(
            ks.read(|r| r.latest(b"streamed")).unwrap().is_some(),
            "the live one stays"
        );
    }
}
