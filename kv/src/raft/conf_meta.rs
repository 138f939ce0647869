//! What a group keeps on disk with its applied configuration, in the same write: the index of
//! the membership change that left it, the version of group 0's configuration the group follows
//! (see `peer::follow`), and, for group 0, the address book.
//!
//! Why: a restarted node's raft starts from the stored configuration, while its state machine
//! starts from the older snapshot, and the entries between them are applied again. A membership
//! entry at or below the stored index is already in that configuration, so it is skipped whole:
//! raft is not asked again (re-entering a joint configuration it is still in would fail, and a
//! change it refused would leave the group's bookkeeping behind the other replicas'), and the
//! followed version and the address book come back as they were after it.

use serde::{Deserialize, Serialize};

use crate::peer::members::Members;

/// A group's bookkeeping for its stored configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfMeta {
    /// The index of the membership entry that left the stored configuration.
    pub index: u64,
    /// The version of group 0's configuration the group followed after it.
    pub follows: u64,
    /// Group 0's address book after it (`None` for other groups).
    pub book: Option<Members>,
}

impl ConfMeta {
    /// The bytes stored with the configuration.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a configuration's bookkeeping serializes")
    }

    /// What `bytes` (as stored; empty when a store has none) hold.
    pub fn decode(bytes: &[u8]) -> Result<Option<ConfMeta>, String> {
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| format!("the configuration's bookkeeping: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bookkeeping_round_trips_and_an_empty_store_has_none() {
        let mut book = Members::default();
        book.removed.insert(4);
        let m = ConfMeta {
            index: 9,
            follows: 7,
            book: Some(book),
        };
        assert_eq!(ConfMeta::decode(&m.encode()).unwrap(), Some(m));
        assert_eq!(ConfMeta::decode(b"").unwrap(), None);
        assert!(ConfMeta::decode(b"{").is_err());
    }
}
