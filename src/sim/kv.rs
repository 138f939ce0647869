//! The simulator's replicated KV: the entry format and applying committed entries.

use std::collections::{BTreeMap, HashSet};

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType};
use raft::storage::MemStorage;

use crate::clock::SimClock;
use crate::node::LeaseNode;
use crate::sim::history::{History, OpId, OpResult};

/// Applied KV state: key → (value, revision).
pub type KvState = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// Encode a put as entry data: op id, key length, key, value.
pub fn encode_put(op: OpId, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(12 + key.len() + value.len());
    data.extend_from_slice(&op.to_be_bytes());
    data.extend_from_slice(&(key.len() as u32).to_be_bytes());
    data.extend_from_slice(key);
    data.extend_from_slice(value);
    data
}

/// Decode entry data made by [`encode_put`]. `None` if it is malformed.
pub fn decode_put(data: &[u8]) -> Option<(OpId, &[u8], &[u8])> {
    let op = OpId::from_be_bytes(data.get(..8)?.try_into().ok()?);
    let key_len = u32::from_be_bytes(data.get(8..12)?.try_into().ok()?) as usize;
    let key = data.get(12..12 + key_len)?;
    Some((op, key, &data[12 + key_len..]))
}

/// What applying needs from one simulated node.
pub struct Applier<'a> {
    /// The node's raft id.
    pub id: u64,
    /// The node.
    pub node: &'a mut LeaseNode<MemStorage, SimClock>,
    /// Its storage (for conf states).
    pub storage: &'a MemStorage,
    /// Its KV state.
    pub kv: &'a mut KvState,
    /// Writes proposed at this node and not yet acknowledged.
    pub writes: &'a mut HashSet<OpId>,
}

impl Applier<'_> {
    /// Apply committed entries in order; acknowledge this node's own writes.
    pub fn apply(&mut self, entries: Vec<Entry>, history: &mut History, now_ns: u64) {
        for e in entries {
            match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() => {}
                EntryType::EntryNormal => self.apply_put(&e, history, now_ns),
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data).expect("sim conf change");
                    let cs = self.node.apply_conf_change(&cc).expect("apply conf change");
                    self.storage.wl().set_conf_state(cs);
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data).expect("sim conf change v2");
                    let cs = self
                        .node
                        .apply_conf_change(&cc)
                        .expect("apply conf change v2");
                    self.storage.wl().set_conf_state(cs);
                }
            }
        }
    }

    fn apply_put(&mut self, e: &Entry, history: &mut History, now_ns: u64) {
        let (op, key, value) = decode_put(&e.data)
            .unwrap_or_else(|| panic!("node {} applied a malformed entry at {}", self.id, e.index));
        self.kv.insert(key.to_vec(), (value.to_vec(), e.index));
        history.applied(op, e.index);
        if self.writes.remove(&op) {
            history.complete(op, OpResult::Written { revision: e.index }, now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_round_trips_and_garbage_is_rejected() {
        let data = encode_put(7, b"key", b"value");
        assert_eq!(decode_put(&data), Some((7, &b"key"[..], &b"value"[..])));
        assert_eq!(decode_put(&data[..10]), None);
        let mut bad = data.clone();
        bad[11] = 200; // key length past the end
        assert_eq!(decode_put(&bad), None);
    }
}
