//! One version of a key, as the keyspace keeps it and etcd's API shows it.

use etcd_client::proto::PbKeyValue as KeyValue;

/// What a version costs in the byte count besides its key and value bytes.
pub const VERSION_OVERHEAD_BYTES: u64 = 64;

/// One version of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The revision that created the key (0 in a tombstone).
    pub create_rev: i64,
    /// The revision of this change.
    pub mod_rev: i64,
    /// How many times the key was written since it was created (0 in a tombstone).
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
    /// The value; `None`: the key was deleted at `mod_rev` (a tombstone).
    pub value: Option<Vec<u8>>,
}

impl Version {
    /// This version as etcd's `KeyValue` of `key` (a tombstone: the key and `mod_revision` only,
    /// as etcd's delete events have it).
    pub fn key_value(&self, key: &[u8]) -> KeyValue {
        KeyValue {
            key: key.to_vec(),
            create_revision: self.create_rev,
            mod_revision: self.mod_rev,
            version: self.version,
            value: self.value.clone().unwrap_or_default(),
            lease: self.lease,
        }
    }

    /// What the version costs in the byte count.
    pub fn cost(&self, key: &[u8]) -> u64 {
        key.len() as u64 + self.value.as_ref().map_or(0, Vec::len) as u64 + VERSION_OVERHEAD_BYTES
    }
}
