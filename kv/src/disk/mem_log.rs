//! The raft log's terms, and its newest entries, kept in memory beside the disk store.
//!
//! raft-rs asks its storage for terms and entries on almost every step: the term at the commit
//! index, the term before each append, the entries of each append to a follower. Read from redb,
//! each answer cost a read transaction and a decode; at 64 writing clients that was a large share
//! of the leader's raft thread. The disk stays the truth: this mirrors what was committed to it,
//! is changed only after the disk transaction commits, and is rebuilt from the disk on open, after
//! a compaction and after a snapshot.

use std::collections::VecDeque;

use protobuf::Message as _;
use raft::eraftpb::Entry;

/// Bytes of entries kept in memory at most (their encoded size); older entries are read from
/// disk. The newest entry is always kept, whatever its size.
pub const TAIL_BYTES: usize = 32 << 20;

/// The log's terms (all of them) and newest entries (within a byte budget).
#[derive(Debug, Clone)]
pub struct MemLog {
    /// The log's first index: the index of `terms[0]`, or of the next entry when the log is
    /// empty (the snapshot's index + 1). Always at least 1.
    first_index: u64,
    /// The term of every entry in the log, from `first_index` on, with no gap.
    terms: VecDeque<u64>,
    /// The newest entries, contiguous and ending at the last index (empty only when the log is).
    tail: VecDeque<Entry>,
    /// The encoded size of the entries in `tail`.
    tail_bytes: usize,
    /// `tail_bytes` stays at most this, unless `tail` holds one entry.
    budget_bytes: usize,
}

impl MemLog {
    /// An empty log whose next entry is at `first_index`.
    pub fn new(first_index: u64, budget_bytes: usize) -> Self {
        assert!(first_index >= 1, "a log's first index is at least 1");
        MemLog {
            first_index,
            terms: VecDeque::new(),
            tail: VecDeque::new(),
            tail_bytes: 0,
            budget_bytes,
        }
    }

    /// The log's first index (the snapshot's index + 1 when the log is empty).
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// The log's last index (the snapshot's index when the log is empty).
    pub fn last_index(&self) -> u64 {
        self.first_index + self.terms.len() as u64 - 1
    }

    /// The term of the entry at `index`, if it is in the log.
    pub fn term(&self, index: u64) -> Option<u64> {
        let offset = index.checked_sub(self.first_index)?;
        self.terms.get(offset as usize).copied()
    }

    /// The index of the oldest entry held in memory (the next index when none is).
    pub fn tail_start(&self) -> u64 {
        self.tail.front().map_or(self.last_index() + 1, |e| e.index)
    }

    /// Append `entries` (contiguous, written to disk), replacing the log from their first index.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        assert!(
            first.index <= self.last_index() + 1,
            "entries from {} leave a gap after the last index {}",
            first.index,
            self.last_index()
        );
        if first.index < self.first_index {
            *self = MemLog::new(first.index, self.budget_bytes);
        }
        self.terms
            .truncate((first.index - self.first_index) as usize);
        while self.tail.back().is_some_and(|e| e.index >= first.index) {
            let dropped = self.tail.pop_back().expect("checked");
            self.tail_bytes -= dropped.compute_size() as usize;
        }
        for e in entries {
            debug_assert_eq!(e.index, self.last_index() + 1, "entries are contiguous");
            self.terms.push_back(e.term);
            self.tail_bytes += e.compute_size() as usize;
            self.tail.push_back(e.clone());
        }
        while self.tail_bytes > self.budget_bytes && self.tail.len() > 1 {
            let dropped = self.tail.pop_front().expect("more than one");
            self.tail_bytes -= dropped.compute_size() as usize;
        }
        debug_assert_eq!(self.tail.back().map(|e| e.index), Some(self.last_index()));
    }

    /// Push the entries of `[low, high)` (all in memory: `low >= tail_start`) onto `out`, after
    /// those it holds, within raft's `max_bytes` for all of them (the first entry always; `None`
    /// for no limit). Returns whether the limit stopped it.
    pub fn copy_tail(
        &self,
        low: u64,
        high: u64,
        max_bytes: Option<u64>,
        out: &mut Vec<Entry>,
    ) -> bool {
        let start = self.tail_start();
        assert!(low >= start, "entry {low} is not in memory");
        assert!(high <= self.last_index() + 1, "entries past the last index");
        let limit = max_bytes.filter(|&m| m != raft::NO_LIMIT);
        let mut bytes: u64 = match limit {
            Some(_) => out.iter().map(|e| u64::from(e.compute_size())).sum(),
            None => 0,
        };
        for e in self
            .tail
            .range((low - start) as usize..(high - start) as usize)
        {
            if let Some(max) = limit {
                bytes += u64::from(e.compute_size());
                if !out.is_empty() && bytes > max {
                    return true;
                }
            }
            out.push(e.clone());
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, bytes: usize) -> Entry {
        Entry {
            index,
            term,
            data: vec![7; bytes].into(),
            ..Default::default()
        }
    }

    #[test]
    fn appending_a_conflicting_suffix_replaces_terms_and_entries() {
        let mut log = MemLog::new(2, TAIL_BYTES);
        assert_eq!((log.first_index(), log.last_index()), (2, 1));
        log.append(&(2..=10).map(|i| entry(i, 1, 10)).collect::<Vec<_>>());
        log.append(&[entry(8, 2, 10)]);
        assert_eq!(log.last_index(), 8);
        assert_eq!(
            (log.term(7), log.term(8), log.term(9), log.term(1)),
            (Some(1), Some(2), None, None)
        );
        let mut out = Vec::new();
        assert!(!log.copy_tail(2, 9, None, &mut out));
        assert_eq!(
            out.iter().map(|e| (e.index, e.term)).collect::<Vec<_>>(),
            [(2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 2)]
        );
    }

    #[test]
    fn the_tail_keeps_its_byte_budget_and_always_the_newest_entry() {
        let one = entry(1, 1, 100).compute_size() as usize;
        let mut log = MemLog::new(1, 3 * one);
        log.append(&(1..=10).map(|i| entry(i, 1, 100)).collect::<Vec<_>>());
        assert_eq!(log.tail_start(), 8, "three entries fit");
        assert_eq!(log.term(1), Some(1), "every term is kept");
        log.append(&[entry(11, 2, 10 * one)]);
        assert_eq!(
            log.tail_start(),
            11,
            "an entry over the budget is kept alone"
        );
    }

    #[test]
    fn copying_stops_at_the_byte_limit_but_never_before_one_entry() {
        let mut log = MemLog::new(1, TAIL_BYTES);
        log.append(&(1..=5).map(|i| entry(i, 1, 100)).collect::<Vec<_>>());
        let one = u64::from(entry(1, 1, 100).compute_size());
        let mut out = Vec::new();
        assert!(log.copy_tail(1, 6, Some(2 * one), &mut out));
        assert_eq!(out.len(), 2);
        let mut out = Vec::new();
        assert!(log.copy_tail(1, 6, Some(1), &mut out));
        assert_eq!(out.len(), 1, "the first entry goes whatever its size");
    }

    #[test]
    #[should_panic(expected = "leave a gap")]
    fn a_gap_is_a_programmer_error() {
        let mut log = MemLog::new(1, TAIL_BYTES);
        log.append(&[entry(3, 1, 1)]);
    }
}
