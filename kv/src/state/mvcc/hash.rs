//! A hash of the keyspace at a revision, for etcd's `HashKV`: every key that existed then, with
//! its version (create and mod revision, version, lease, value), in key order, under CRC-32C.
//! Replicas that applied the same entries give the same hash at the same revision; a replica
//! whose state differs (a damaged or altered engine file) gives another. The history before
//! `rev` is not hashed: two replicas may have swept a compaction to different points.

use crate::state::mvcc::reader::Reader;
use crate::state::mvcc::MvccError;

impl Reader<'_> {
    /// The hash of the keyspace at `rev` (0: now), and the revision hashed.
    pub fn hash_at(&self, rev: i64) -> Result<(u32, i64), MvccError> {
        let rev = self.read_rev(rev)?;
        let mut h = crc32fast::Hasher::new();
        self.scan_at(&[0], &[0], rev, &mut |key, v| {
            h.update(&(key.len() as u64).to_be_bytes());
            h.update(key);
            for n in [v.create_rev, v.mod_rev, v.version, v.lease] {
                h.update(&n.to_be_bytes());
            }
            let value = v.value.as_deref().unwrap_or_default();
            h.update(&(value.len() as u64).to_be_bytes());
            h.update(value);
            true
        })?;
        Ok((h.finalize(), rev))
    }
}
