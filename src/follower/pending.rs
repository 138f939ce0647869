//! The entries a replica has persisted above its applied index, with the keys each writes: a
//! read of a key one of them writes must wait, since that entry may already be exposed.

use std::collections::BTreeMap;

/// The keys one entry writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    /// These keys.
    Some(Vec<Vec<u8>>),
    /// Unknown: every key (a configuration change, an entry the application cannot decode).
    All,
}

/// Entries persisted above applied, by index.
#[derive(Debug, Clone, Default)]
pub struct PendingKeys {
    entries: BTreeMap<u64, Keys>,
}

impl PendingKeys {
    /// Entry `index` was persisted, writing `keys`. raft may overwrite an uncommitted suffix,
    /// so every entry from `index` on is replaced.
    pub fn on_persisted(&mut self, index: u64, keys: Keys) {
        self.entries.split_off(&index);
        self.entries.insert(index, keys);
    }

    /// Entries up to `applied` were applied: no longer pending.
    pub fn on_applied(&mut self, applied: u64) {
        self.entries = self.entries.split_off(&(applied + 1));
        debug_assert!(self.entries.keys().all(|&i| i > applied));
    }

    /// Whether a pending entry writes `key`.
    pub fn touches(&self, key: &[u8]) -> bool {
        self.entries.values().any(|k| match k {
            Keys::All => true,
            Keys::Some(keys) => keys.iter().any(|k| k == key),
        })
    }

    /// Whether a pending entry writes a key in `[start, end)` (a range read).
    pub fn touches_range(&self, start: &[u8], end: &[u8]) -> bool {
        let within = |k: &Vec<u8>| k.as_slice() >= start && k.as_slice() < end;
        self.entries.values().any(|k| match k {
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
}
