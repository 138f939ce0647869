//! Compaction, in two steps. The logical step is the entry's own: reads and watches below the
//! compacted revision are refused from the batch that applies it on, on every replica alike.
//! The physical step removes, a bounded batch at a time, the versions no read may see any more
//! (each superseded at or below the compacted revision, and tombstones at or below it) and the
//! changes below it, so that a compaction of millions of versions never holds the raft thread
//! for long. What is left to remove is invisible: every read is at or above the compacted
//! revision, and every version it may see is kept.

use crate::disk::state_engine::Table;
use crate::state::mvcc::{layout, storage, Batch, MvccError, Version};

impl Batch<'_> {
    /// Drop the history below `at`: each key keeps its version at `at` (none if it was deleted
    /// by then), and reads and watches below `at` are refused from now on. The versions freed
    /// are removed by [`Batch::sweep`].
    pub fn compact(&mut self, at: i64) -> Result<(), MvccError> {
        if at > self.counters.rev {
            return Err(MvccError::FutureRev);
        }
        if at <= self.counters.compacted {
            return Err(MvccError::Compacted);
        }
        // The changes at the last compacted revision were kept while their versions were: the
        // next sweep looks at them again.
        let last = self.counters.compacted;
        self.counters.swept = self.counters.swept.min(last);
        self.counters.compacted = at;
        debug_assert!(self.sweep_due());
        Ok(())
    }

    /// Whether versions freed by a compaction are left to remove (`swept` passes the compacted
    /// revision once every change up to it was looked at).
    pub fn sweep_due(&self) -> bool {
        self.counters.compacted > 0 && self.counters.swept <= self.counters.compacted
    }

    /// Remove what the compaction freed, revision by revision from where the last sweep
    /// stopped, until `budget` changes were looked at (a revision is never split). Returns how
    /// many were.
    pub fn sweep(&mut self, budget: usize) -> Result<usize, MvccError> {
        let (gen, compacted) = (self.gen, self.counters.compacted);
        let mut todo: Vec<(Vec<u8>, i64, Vec<u8>)> = Vec::new();
        let from = layout::changes_from(gen, self.counters.swept);
        let to = layout::changes_from(gen, compacted + 1);
        let mut last_rev = None;
        self.w
            .scan(
                Table::Changes,
                &from,
                Some(&to),
                false,
                &mut |row_key, key| {
                    let rev = layout::rev_of_change(row_key);
                    if todo.len() >= budget && last_rev != Some(rev) {
                        return false;
                    }
                    last_rev = Some(rev);
                    todo.push((row_key.to_vec(), rev, key.to_vec()));
                    true
                },
            )
            .map_err(storage)?;
        let done_through = match (todo.len() < budget, last_rev) {
            (true, _) | (false, None) => compacted + 1,
            (false, Some(rev)) => rev + 1,
        };
        for (row_key, rev, key) in &todo {
            self.sweep_change(row_key, *rev, key)?;
        }
        self.counters.swept = done_through.min(compacted + 1);
        Ok(todo.len())
    }

    /// One change of revision `rev` at or below the compacted revision: its version goes if no
    /// read may see it, and the change itself goes if it is below the compacted revision or its
    /// version went.
    fn sweep_change(&mut self, row_key: &[u8], rev: i64, key: &[u8]) -> Result<(), MvccError> {
        let compacted = self.counters.compacted;
        let current = self.reader().latest(key)?;
        let in_history = current.as_ref().is_none_or(|v| v.mod_rev != rev);
        let mut gone = false;
        if in_history {
            let hist_row = layout::history_key(self.gen, key, rev);
            if let Some(v) = self.history_row(&hist_row)? {
                let next = self.next_after(key, rev, current.as_ref())?;
                let superseded = next.is_some_and(|n| n <= compacted);
                if superseded || v.value.is_none() {
                    self.counters.bytes -= v.cost(key);
                    self.w.delete(Table::History, &hist_row).map_err(storage)?;
                    gone = true;
                }
            }
        }
        if rev < compacted || gone {
            self.w.delete(Table::Changes, row_key).map_err(storage)?;
        }
        Ok(())
    }

    fn history_row(&self, row: &[u8]) -> Result<Option<Version>, MvccError> {
        match self.w.get(Table::History, row).map_err(storage)? {
            None => Ok(None),
            Some(v) => layout::decode_version(&v)
                .map(Some)
                .ok_or_else(|| MvccError::Storage("a malformed history row".into())),
        }
    }

    /// The revision of `key`'s next version after `rev` (in the history, else the current one).
    fn next_after(
        &self,
        key: &[u8],
        rev: i64,
        current: Option<&Version>,
    ) -> Result<Option<i64>, MvccError> {
        let from = layout::history_key(self.gen, key, rev + 1);
        let to = layout::history_key(self.gen, key, i64::MAX);
        let mut next = None;
        self.w
            .scan(
                Table::History,
                &from,
                Some(&to),
                false,
                &mut |row_key, _| {
                    next = Some(layout::rev_of_history(row_key));
                    false
                },
            )
            .map_err(storage)?;
        Ok(next.or(current.map(|v| v.mod_rev)))
    }
}
