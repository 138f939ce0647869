//! Reads of one group's keyspace in one state of the engine: a key's current version, its
//! version at a past revision, scans of a range at any revision kept, and a lease's keys.

use crate::disk::state_engine::{EngineRead, Table};
use crate::state::mvcc::counters::{malformed, storage, Counters};
use crate::state::mvcc::errors::MvccError;
use crate::state::mvcc::layout::{self, decode_version};
use crate::state::mvcc::version::Version;

/// The first key after `key` alone: the end of a one-key range.
fn just_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// Reads of one group's keyspace in one state of the engine.
pub struct Reader<'a> {
    pub(super) e: &'a dyn EngineRead,
    pub(super) gen: u64,
    pub(super) rev: i64,
    pub(super) compacted: i64,
    pub(super) counters: Counters,
}

impl Reader<'_> {
    /// The generation's counters in this state.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// A row of the generation's `meta` table.
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, MvccError> {
        self.e
            .get(Table::Meta, &layout::meta_key(self.gen, name))
            .map_err(storage)
    }

    /// The revision of the last change.
    pub fn rev(&self) -> i64 {
        self.rev
    }

    /// The compacted revision (0: none).
    pub fn compacted(&self) -> i64 {
        self.compacted
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

    /// `key`'s current version, if it exists now.
    pub fn latest(&self, key: &[u8]) -> Result<Option<Version>, MvccError> {
        let row = self
            .e
            .get(Table::Latest, &layout::latest_key(self.gen, key));
        match row.map_err(storage)? {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("latest"))?,
            )),
        }
    }

    /// `key`'s newest history row at or below `rev` (a version no longer current, or a
    /// tombstone), if any.
    fn history_at(&self, key: &[u8], rev: i64) -> Result<Option<Version>, MvccError> {
        let from = layout::history_start(self.gen, key);
        let to = layout::history_key(self.gen, key, rev.saturating_add(1).max(0));
        let mut found = None;
        self.e
            .scan(Table::History, &from, Some(&to), true, &mut |_, v| {
                found = Some(v.to_vec());
                false
            })
            .map_err(storage)?;
        match found {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("history"))?,
            )),
        }
    }

    /// `key`'s version with `mod_rev` exactly `rev` (a put, or a tombstone), if it is kept.
    pub(super) fn version_of_change(
        &self,
        key: &[u8],
        rev: i64,
    ) -> Result<Option<Version>, MvccError> {
        if let Some(v) = self.latest(key)?.filter(|v| v.mod_rev == rev) {
            return Ok(Some(v));
        }
        let row = self
            .e
            .get(Table::History, &layout::history_key(self.gen, key, rev))
            .map_err(storage)?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some(
                decode_version(&row).ok_or_else(|| malformed("history"))?,
            )),
        }
    }

    /// `key`'s version at `rev`, if the key existed then.
    pub fn version_at(&self, key: &[u8], rev: i64) -> Result<Option<Version>, MvccError> {
        if let Some(v) = self.latest(key)? {
            if v.mod_rev <= rev {
                return Ok(Some(v));
            }
        }
        Ok(self.history_at(key, rev)?.filter(|v| v.value.is_some()))
    }

    /// Hand the keys in `key`..`end` that existed at `rev`, in key order, with their version
    /// then, to `visit` until it returns `false`.
    pub fn scan_at(
        &self,
        key: &[u8],
        end: &[u8],
        rev: i64,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        if end.is_empty() {
            // One key: a point read. A scan would also step over every superseded copy of the
            // row the engine still holds, which for a key written often (a compare-and-swap
            // loop) is most of what it reads.
            if let Some(v) = self.version_at(key, rev)? {
                visit(key, &v);
            }
            return Ok(());
        }
        let (from, to) = self.latest_range(key, end);
        if rev >= self.rev {
            return self.scan_latest(&from, to.as_deref(), visit);
        }
        self.scan_past(key, end, rev, visit)
    }

    /// The `latest` rows of `key`..`end`.
    fn latest_range(&self, key: &[u8], end: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
        self.rows_of(key, end, layout::latest_key)
    }

    /// The rows of a table keyed by `row(gen, key)` (a key first) for the keys `key`..`end`.
    fn rows_of(
        &self,
        key: &[u8],
        end: &[u8],
        row: fn(u64, &[u8]) -> Vec<u8>,
    ) -> (Vec<u8>, Option<Vec<u8>>) {
        let from = row(self.gen, key);
        let to = match end {
            [] => Some(row(self.gen, &just_after(key))),
            [0] => layout::prefix_end(&layout::gen_prefix(self.gen)),
            end if end <= key => Some(from.clone()),
            end => Some(row(self.gen, end)),
        };
        (from, to)
    }

    fn scan_latest(
        &self,
        from: &[u8],
        to: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        let mut bad = false;
        self.e
            .scan(
                Table::Latest,
                from,
                to,
                false,
                &mut |k, row| match decode_version(row) {
                    Some(v) => visit(layout::key_of_latest(k), &v),
                    None => {
                        bad = true;
                        false
                    }
                },
            )
            .map_err(storage)?;
        match bad {
            true => Err(malformed("latest")),
            false => Ok(()),
        }
    }

    /// A scan at a past revision: the keys current now whose version then is current, merged
    /// in key order with the keys whose version then is in the history.
    fn scan_past(
        &self,
        key: &[u8],
        end: &[u8],
        rev: i64,
        visit: &mut dyn FnMut(&[u8], &Version) -> bool,
    ) -> Result<(), MvccError> {
        let mut found: std::collections::BTreeMap<Vec<u8>, Version> = Default::default();
        let (from, to) = self.latest_range(key, end);
        self.scan_latest(&from, to.as_deref(), &mut |k, v| {
            if v.mod_rev <= rev {
                found.insert(k.to_vec(), v.clone());
            }
            true
        })?;
        let (hist_from, hist_to) = self.rows_of(key, end, layout::history_start);
        let mut bad = false;
        let mut best: Option<(Vec<u8>, Vec<u8>)> = None; // per key, its newest row at or below rev
        let mut settle =
            |best: &mut Option<(Vec<u8>, Vec<u8>)>,
             found: &mut std::collections::BTreeMap<Vec<u8>, Version>| {
                if let Some((k, row)) = best.take() {
                    match decode_version(&row) {
                        Some(v) if v.value.is_some() => {
                            found.entry(k).or_insert(v);
                        }
                        Some(_) => {}
                        None => bad = true,
                    }
                }
            };
        self.e
            .scan(
                Table::History,
                &hist_from,
                hist_to.as_deref(),
                false,
                &mut |row_key, row| {
                    let Some(k) = layout::key_of_history(row_key) else {
                        return false;
                    };
                    if best.as_ref().is_some_and(|(b, _)| *b != k) {
                        settle(&mut best, &mut found);
                    }
                    if layout::rev_of_history(row_key) <= rev {
                        best = Some((k, row.to_vec()));
                    }
                    true
                },
            )
            .map_err(storage)?;
        settle(&mut best, &mut found);
        if bad {
            return Err(malformed("history"));
        }
        for (k, v) in &found {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }

    /// The keys attached to lease `id` now.
    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        let from = layout::lease_start(self.gen, id);
        let to = layout::prefix_end(&from);
        let mut keys = Vec::new();
        self.e
            .scan(
                Table::LeaseKeys,
                &from,
                to.as_deref(),
                false,
                &mut |k, _| {
                    keys.push(k[16..].to_vec());
                    true
                },
            )
            .map_err(storage)?;
        Ok(keys)
    }
}
