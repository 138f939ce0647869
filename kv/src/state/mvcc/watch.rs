//! The history a watch reads: every change from a revision on, in revision order and, within a
//! revision, in the order the change made them, each with the key's version before it.

use etcd_client::proto::PbEvent as Event;

use crate::disk::state_engine::Table;
use crate::state::mvcc::{in_range, layout, storage, MvccError, Reader};

/// etcd's event types (`mvccpb.Event.EventType`).
pub const EVENT_PUT: i32 = 0;
/// A delete.
pub const EVENT_DELETE: i32 = 1;

/// Changes a call of [`Reader::events`] looks at, about (it ends at a revision's end).
pub const SCAN_BUDGET_ROWS: usize = 10_000;

/// The changes a watch of `key`..`end` sees.
#[derive(Debug, Clone, PartialEq)]
pub struct Events {
    /// The events, in order.
    pub events: Vec<Event>,
    /// The revision read up to (inclusive): the next read starts after it.
    pub through: i64,
}

impl Reader<'_> {
    /// The events of `key`..`end` with revisions from `from` to `through` (at most `max`
    /// events, ending at a revision's end, after looking at about [`SCAN_BUDGET_ROWS`] changes
    /// at most, so that a watch of a few keys behind a long history of others is read in
    /// bounded passes), each with the version before it when `prev_kv`.
    /// `Compacted` when `from` is below the compacted revision: events below it are gone (a
    /// change at the compacted revision itself is kept while its version is).
    pub fn events(
        &self,
        key: &[u8],
        end: &[u8],
        from: i64,
        prev_kv: bool,
        max: usize,
    ) -> Result<Events, MvccError> {
        if from < self.compacted {
            return Err(MvccError::Compacted);
        }
        // A watch may start in the future: nothing before `from` is ever read.
        let mut through = self.rev.max(from - 1);
        let mut changes: Vec<(i64, Vec<u8>)> = Vec::new();
        let start = layout::changes_from(self.gen, from);
        let stop = layout::changes_from(self.gen, self.rev + 1);
        let (mut count, mut scanned) = (0usize, 0usize);
        let mut last = None;
        self.e
            .scan(
                Table::Changes,
                &start,
                Some(&stop),
                false,
                &mut |row_key, k| {
                    let rev = layout::rev_of_change(row_key);
                    // At a revision's first change only: every change before it was looked at.
                    let full = count >= max || scanned >= SCAN_BUDGET_ROWS;
                    if full && last != Some(rev) {
                        through = rev - 1;
                        return false;
                    }
                    (last, scanned) = (Some(rev), scanned + 1);
                    if in_range(k, key, end) {
                        count += 1;
                        changes.push((rev, k.to_vec()));
                    }
                    true
                },
            )
            .map_err(storage)?;
        let mut events = Vec::with_capacity(changes.len());
        for (rev, k) in changes {
            events.extend(self.event(&k, rev, prev_kv)?);
        }
        Ok(Events { events, through })
    }

    /// The change of `key` at `rev` (none when compaction took its version: a deletion at the
    /// compacted revision).
    fn event(&self, key: &[u8], rev: i64, prev_kv: bool) -> Result<Option<Event>, MvccError> {
        let Some(v) = self.version_of_change(key, rev)? else {
            return Ok(None);
        };
        let prev = match prev_kv {
            true => self.version_at(key, rev - 1)?,
            false => None,
        };
        Ok(Some(Event {
            r#type: if v.value.is_some() {
                EVENT_PUT
            } else {
                EVENT_DELETE
            },
            kv: Some(v.key_value(key)),
            prev_kv: prev.map(|p| p.key_value(key)),
        }))
    }
}
