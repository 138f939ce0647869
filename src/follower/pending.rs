//! The entries a replica has persisted above its applied index, with the keys each writes: a
//! read of a key one of them writes must wait, since that entry may already be exposed.

use std::collections::BTreeMap;

use raft::eraftpb::{Entry, EntryType};

/// The keys one entry writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    /// These keys.
    Some(Vec<Vec<u8>>),
    /// Unknown: every key (a configuration change, an entry the application cannot decode).
    All,
}

impl Keys {
    /// What an entry writes when the application has not said how to read its keys: nothing
    /// for an empty normal entry (raft's entry at the start of a term), every key otherwise.
    pub fn unknown(entry: &Entry) -> Keys {
        match entry.get_entry_type() == EntryType::EntryNormal && entry.data.is_empty() {
            true => Keys::Some(Vec::new()),
            false => Keys::All,
        }
    }

    /// Whether these keys include none.
    fn is_none(&self) -> bool {
        matches!(self, Keys::Some(keys) if keys.is_empty())
    }
}

/// Entries persisted above applied, by index.
#[derive(Debug, Clone, Default)]
pub struct PendingKeys {
    entries: BTreeMap<u64, Keys>,
    /// Entries up to this index were persisted before this replica started, with keys not
    /// read: while any of them is above applied, every key counts as pending.
    unknown_through: u64,
    /// The applied index last reported.
    applied: u64,
}

impl PendingKeys {
    /// A replica that starts with entries `applied + 1 ..= last_index` already persisted.
    pub fn at_start(applied: u64, last_index: u64) -> Self {
        PendingKeys {
            entries: BTreeMap::new(),
            unknown_through: last_index,
            applied,
        }
    }

    /// Entry `index` was persisted, writing `keys`. raft may overwrite an uncommitted suffix,
    /// so every entry from `index` on is replaced.
    pub fn on_persisted(&mut self, index: u64, keys: Keys) {
        self.entries.split_off(&index);
        self.entries.insert(index, keys);
        self.unknown_through = self.unknown_through.min(index.saturating_sub(1));
        // overwritten from `index`
    }

    /// A snapshot up to `index` was installed: the log it replaced is gone, and what it covers
    /// is applied.
    pub fn on_snapshot(&mut self, index: u64) {
        self.entries.clear();
        self.unknown_through = self.unknown_through.min(index);
        self.on_applied(index);
    }

    /// Entries up to `applied` were applied: no longer pending.
    pub fn on_applied(&mut self, applied: u64) {
        self.entries = self.entries.split_off(&(applied + 1));
        self.applied = self.applied.max(applied);
        debug_assert!(self.entries.keys().all(|&i| i > applied));
    }

    /// Whether entries persisted before the start, keys unknown, are still above applied.
    fn unknown_pending(&self) -> bool {
        self.unknown_through > self.applied
    }

    /// The highest pending index that writes any key (0: none): a read that cannot name its
    /// keys waits until it is applied.
    pub fn last_writing(&self) -> u64 {
        let last = self.entries.iter().rev().find(|(_, k)| !k.is_none());
        let known = last.map_or(0, |(&i, _)| i);
        match self.unknown_pending() {
            true => known.max(self.unknown_through),
            false => known,
        }
    }

    /// Whether a pending entry writes any key.
    pub fn touches_any(&self) -> bool {
        self.last_writing() > self.applied
    }

    /// Whether a pending entry writes `key`.
    pub fn touches(&self, key: &[u8]) -> bool {
        self.unknown_pending()
            || self.entries.values().any(|k| match k {
                Keys::All => true,
                Keys::Some(keys) => keys.iter().any(|k| k == key),
            })
    }

    /// Whether a pending entry writes a key in `[start, end)` (a range read).
    pub fn touches_range(&self, start: &[u8], end: &[u8]) -> bool {
        let within = |k: &Vec<u8>| k.as_slice() >= start && k.as_slice() < end;
        self.unknown_pending()
            || self.entries.values().any(|k| match k {
                Keys::All => true,
                Keys::Some(keys) => keys.iter().any(within),
            })
    }

    /// Entries pending.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_entries_block_reads_of_their_keys_until_applied() {
        let mut p = PendingKeys::default();
        p.on_persisted(5, Keys::Some(vec![b"a".to_vec()]));
        p.on_persisted(6, Keys::Some(vec![b"m".to_vec()]));
        assert!(p.touches(b"a") && p.touches(b"m") && !p.touches(b"b"));
        assert!(p.touches_range(b"a", b"b") && !p.touches_range(b"b", b"m"));
        p.on_applied(5);
        assert!(!p.touches(b"a") && p.touches(b"m"));
        p.on_persisted(6, Keys::Some(vec![b"z".to_vec()]));
        assert!(
            !p.touches(b"m"),
            "an overwritten entry writes nothing any more"
        );
        p.on_persisted(7, Keys::All);
        assert!(p.touches(b"anything") && p.touches_range(b"x", b"y"));
        p.on_applied(7);
        assert!(p.is_empty());
    }

    #[test]
    fn entries_found_in_the_log_at_start_block_every_read_until_applied() {
        let mut p = PendingKeys::at_start(3, 6);
        assert!(p.touches(b"a") && p.touches_range(b"a", b"b") && p.touches_any());
        assert_eq!(p.last_writing(), 6);
        p.on_applied(5);
        assert!(p.touches(b"a"), "entry 6 is still pending");
        p.on_applied(6);
        assert!(!p.touches(b"a") && !p.touches_any());
        assert_eq!(p.last_writing(), 0);
    }

    #[test]
    fn an_overwritten_or_snapshotted_tail_stops_blocking_reads() {
        let mut p = PendingKeys::at_start(3, 20);
        p.on_persisted(6, Keys::Some(vec![b"x".to_vec()]));
        assert_eq!(
            p.last_writing(),
            6,
            "entries 6..=20 of the last run were overwritten"
        );
        assert!(p.touches(b"a"), "4 and 5 are still unknown");
        p.on_applied(5);
        assert!(!p.touches(b"a") && p.touches(b"x"));
        p.on_snapshot(15);
        assert!(
            p.is_empty() && !p.touches_any(),
            "the snapshot replaced the log"
        );
        let mut q = PendingKeys::at_start(0, 20);
        q.on_snapshot(10);
        assert_eq!(q.last_writing(), 0, "nothing above the snapshot is left");
    }

    #[test]
    fn an_empty_entry_writes_nothing_and_blocks_no_read() {
        let mut p = PendingKeys::default();
        let empty = Entry::default();
        p.on_persisted(1, Keys::unknown(&empty));
        assert!(!p.touches(b"a") && !p.touches_any());
        assert_eq!(p.last_writing(), 0);
        let put = Entry {
            data: b"k=v".to_vec().into(),
            ..Default::default()
        };
        p.on_persisted(2, Keys::unknown(&put));
        assert!(p.touches(b"a") && p.touches_any());
        assert_eq!(p.last_writing(), 2);
    }
}
