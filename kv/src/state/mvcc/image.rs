//! The keyspace in a snapshot: a header of numbers (serialized with the store's snapshot
//! header) and the keys' and values' bytes, in order, apart.

use serde::{Deserialize, Serialize};

use crate::state::mvcc::{Mvcc, Version};

/// One version in a snapshot header (see [`MvccHeader::versions`]).
pub type VersionRow = (u32, i64, i64, i64, i64, i64, u32);

/// The keyspace's numbers, for the snapshot header.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MvccHeader {
    /// The revision.
    pub rev: i64,
    /// The compacted revision.
    pub compacted: i64,
    /// Every version, key by key, oldest first:
    /// (key bytes, create, mod, version, lease, value bytes or -1 for a tombstone, the
    /// change's place within its revision).
    pub versions: Vec<VersionRow>,
}

impl Mvcc {
    /// The keyspace as a snapshot header and the bytes it refers to.
    pub fn image(&self) -> (MvccHeader, Vec<u8>) {
        let mut blob = Vec::with_capacity(self.bytes as usize);
        let mut versions = Vec::new();
        let mut place = std::collections::HashMap::new();
        for (rev, keys) in &self.changes {
            for (i, k) in keys.iter().enumerate() {
                place.insert((*rev, k.as_slice()), i as u32);
            }
        }
        for (k, vs) in &self.keys {
            for v in vs {
                blob.extend_from_slice(k);
                let len = match &v.value {
                    Some(value) => {
                        blob.extend_from_slice(value);
                        value.len() as i64
                    }
                    None => -1,
                };
                let key_len = u32::try_from(k.len()).expect("keys are bounded");
                let sub = place.get(&(v.mod_rev, k.as_slice())).copied().unwrap_or(0);
                versions.push((
                    key_len,
                    v.create_rev,
                    v.mod_rev,
                    v.version,
                    v.lease,
                    len,
                    sub,
                ));
            }
        }
        let header = MvccHeader {
            rev: self.rev,
            compacted: self.compacted,
            versions,
        };
        (header, blob)
    }

    /// Rebuild from [`Mvcc::image`]'s parts; an error for an image that does not add up.
    pub fn from_image(h: MvccHeader, mut blob: &[u8]) -> Result<Mvcc, String> {
        let mut m = Mvcc::new();
        if h.rev < 1 || h.compacted < 0 || h.compacted > h.rev {
            return Err(format!(
                "bad keyspace revisions {} / {}",
                h.rev, h.compacted
            ));
        }
        let mut take = |n: usize| -> Result<Vec<u8>, String> {
            let bytes = blob.get(..n).ok_or("keyspace bytes truncated")?.to_vec();
            blob = &blob[n..];
            Ok(bytes)
        };
        let mut by_rev: std::collections::BTreeMap<i64, Vec<(u32, Vec<u8>)>> = Default::default();
        for (key_len, create_rev, mod_rev, version, lease, len, sub) in h.versions {
            let key = take(key_len as usize)?;
            let value = match len {
                -1 => None,
                n => Some(take(usize::try_from(n).map_err(|_| "bad value length")?)?),
            };
            let vs = m.keys.entry(key.clone()).or_default();
            if vs.last().is_some_and(|l| l.mod_rev >= mod_rev) || mod_rev > h.rev {
                return Err(format!(
                    "keyspace versions out of order at revision {mod_rev}"
                ));
            }
            let v = Version {
                create_rev,
                mod_rev,
                version,
                lease,
                value,
            };
            m.bytes += v.cost(&key);
            vs.push(v);
            if mod_rev >= h.compacted {
                by_rev.entry(mod_rev).or_default().push((sub, key));
            }
        }
        for (k, vs) in &m.keys {
            let last = vs.last().expect("a key has a version");
            if last.value.is_some() && last.lease != 0 {
                m.lease_keys
                    .entry(last.lease)
                    .or_default()
                    .insert(k.clone());
            }
        }
        m.changes = by_rev
            .into_iter()
            .map(|(rev, mut keys)| {
                keys.sort();
                (rev, keys.into_iter().map(|(_, k)| k).collect())
            })
            .collect();
        (m.rev, m.compacted) = (h.rev, h.compacted);
        Ok(m)
    }
}
