//! The simulator's replicated KV: the entry format, and the I/O that applies committed entries.

use std::collections::{BTreeMap, HashSet};

use raft::eraftpb::{Entry, EntryType, Message};
use raft::storage::MemStorage;
use rand_chacha::ChaCha8Rng;

use crate::clock::SimClock;
use crate::drive::MemApp;
use crate::node::LeaseNode;
use crate::sim::history::{History, OpId, OpResult};
use crate::sim::net::SimNet;

type SimLeaseNode = LeaseNode<MemStorage, SimClock>;

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

/// The simulator's I/O for one node's `Ready`s: the simulated network, the node's KV state,
/// and the history that acknowledges its writes.
pub struct SimIo<'a> {
    /// The node's raft id.
    pub id: u64,
    /// Its KV state.
    pub kv: &'a mut KvState,
    /// Writes proposed at this node and not yet acknowledged.
    pub writes: &'a mut HashSet<OpId>,
    /// Where acknowledgements are recorded.
    pub history: &'a mut History,
    /// The network.
    pub net: &'a mut SimNet,
    /// The cluster's seeded RNG (network faults).
    pub rng: &'a mut ChaCha8Rng,
    /// Real simulated time.
    pub now_ns: u64,
}

impl SimIo<'_> {
    fn apply_put(&mut self, e: &Entry) {
        let (op, key, value) = decode_put(&e.data)
            .unwrap_or_else(|| panic!("node {} applied a malformed entry at {}", self.id, e.index));
        self.kv.insert(key.to_vec(), (value.to_vec(), e.index));
        self.history.applied(op, e.index);
        if self.writes.remove(&op) {
            self.history
                .complete(op, OpResult::Written { revision: e.index }, self.now_ns);
        }
    }
}

impl MemApp<SimClock> for SimIo<'_> {
    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            self.net.send(m, self.now_ns, self.rng);
        }
    }

    fn apply(&mut self, _: &mut SimLeaseNode, entries: Vec<Entry>) {
        let puts = entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty());
        for e in puts {
            self.apply_put(e);
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
