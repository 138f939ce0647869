//! The history a watch reads: every change from a revision on, in revision order and, within a
//! revision, in the order the change made them, each with the key's version before it.

use etcd_client::proto::PbEvent as Event;

use crate::state::mvcc::{in_range, Mvcc, MvccError};

/// etcd's event types (`mvccpb.Event.EventType`).
pub const EVENT_PUT: i32 = 0;
/// A delete.
pub const EVENT_DELETE: i32 = 1;

/// The changes a watch of `key`..`end` sees.
#[derive(Debug, Clone, PartialEq)]
pub struct Events {
    /// The events, in order.
    pub events: Vec<Event>,
    /// The revision read up to (inclusive): the next read starts after it.
    pub through: i64,
}

impl Mvcc {
    /// The events of `key`..`end` with revisions from `from` to `through` (at most `max`
    /// events, ending at a revision's end), each with the version before it when `prev_kv`.
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
        let mut events = Vec::new();
        // A watch may start in the future: nothing before `from` is ever read.
        let mut through = self.rev.max(from - 1);
        for (&rev, keys) in self.changes.range(from..) {
            if events.len() >= max {
                through = rev - 1;
                break;
            }
            for k in keys.iter().filter(|k| in_range(k, key, end)) {
                events.extend(self.event(k, rev, prev_kv));
            }
        }
        Ok(Events { events, through })
    }

    /// The change of `key` at `rev` (none when compaction took its version: a deletion at the
    /// compacted revision).
    fn event(&self, key: &[u8], rev: i64, prev_kv: bool) -> Option<Event> {
        let vs = self.keys.get(key)?;
        let at = vs.binary_search_by_key(&rev, |v| v.mod_rev).ok()?;
        debug_assert!(rev > self.compacted || at == 0);
        let v = &vs[at];
        let prev = at
            .checked_sub(1)
            .map(|i| &vs[i])
            .filter(|p| prev_kv && p.value.is_some());
        Some(Event {
            r#type: if v.value.is_some() {
                EVENT_PUT
            } else {
                EVENT_DELETE
            },
            kv: Some(v.key_value(key)),
            prev_kv: prev.map(|p| p.key_value(key)),
        })
    }
}
