//! A generation's counters (its revision, compacted revision, sweep progress, bytes and applied
//! index, in one `meta` row), where a group's generation is found, and the errors of reading
//! them.

use crate::disk::state_engine::{EngineError, EngineRead, EngineWrite, Table};
use crate::state::mvcc::errors::MvccError;
use crate::state::mvcc::layout::{self, decode_u64, encode_u64};

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
    /// Bytes of every version kept, with [`VERSION_OVERHEAD_BYTES`](crate::state::mvcc::VERSION_OVERHEAD_BYTES) each.
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

    pub(super) fn encode(&self) -> Vec<u8> {
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

pub(super) const COUNTERS: &str = "counters";

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

pub(super) fn storage(e: EngineError) -> MvccError {
    MvccError::Storage(e.to_string())
}

pub(super) fn malformed(what: &str) -> MvccError {
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

/// The next generation of the node (from 1).
pub(super) fn next_gen(w: &mut dyn EngineWrite) -> Result<u64, MvccError> {
    let next = match w.get(Table::Groups, layout::NEXT_GEN).map_err(storage)? {
        None => 1,
        Some(row) => decode_u64(&row).ok_or_else(|| malformed("next_gen"))?,
    };
    w.put(Table::Groups, layout::NEXT_GEN, &encode_u64(next + 1))
        .map_err(storage)?;
    Ok(next)
}
