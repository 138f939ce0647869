//! The simulator's replicated KV: the entry format, snapshots of the state, and the I/O that
//! applies committed entries and installs snapshots.

use std::collections::{BTreeMap, HashSet};

use raft::eraftpb::{Entry, EntryType, HardState, Message, Snapshot};
use rand_chacha::ChaCha8Rng;

use crate::clock::SimClock;
use crate::drive::{apply_conf_change_entry, ReadyIo};
use crate::node::LeaseNode;
use crate::sim::history::{History, OpId, OpResult};
use crate::sim::net::SimNet;
use crate::sim::storage::SimStorage;

type SimLeaseNode = LeaseNode<SimStorage, SimClock>;

/// Applied KV state: key → (value, revision). The simulator's default state machine.
pub type KvState = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// The state machine a simulated node replicates: a register per key, which is what the
/// history checker understands. Implement it over your own store's state machine to run it under
/// the scenarios, the randomized faults, the checker and the lease monitor
/// ([`SimConfig::state_machine`](crate::sim::SimConfig::state_machine)).
pub trait SimStateMachine: Send {
    /// Apply a write of `value` to `key`, committed at log index `revision`.
    fn put(&mut self, key: &[u8], value: &[u8], revision: u64);
    /// The value of `key` and the revision that wrote it, if any.
    fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u64)>;
    /// The whole state, for a snapshot.
    fn snapshot(&self) -> Vec<u8>;
    /// Replace the state with a snapshot made by [`SimStateMachine::snapshot`]. `None` if the
    /// snapshot is malformed.
    fn restore(&mut self, snapshot: &[u8]) -> Option<()>;
}

impl SimStateMachine for KvState {
    fn put(&mut self, key: &[u8], value: &[u8], revision: u64) {
        self.insert(key.to_vec(), (value.to_vec(), revision));
    }

    fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u64)> {
        BTreeMap::get(self, key).cloned()
    }

    fn snapshot(&self) -> Vec<u8> {
        encode_state(self)
    }

    fn restore(&mut self, snapshot: &[u8]) -> Option<()> {
        *self = decode_state(snapshot)?;
        Some(())
    }
}

/// Encode a put as entry data: op id, key length, key, value.
pub fn encode_put(op: OpId, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(12 + key.len() + value.len());
    data.extend_from_slice(&op.to_be_bytes());
    put_bytes(&mut data, key);
    data.extend_from_slice(value);
    data
}

/// Decode entry data made by [`encode_put`]. `None` if it is malformed.
pub fn decode_put(data: &[u8]) -> Option<(OpId, &[u8], &[u8])> {
    let op = OpId::from_be_bytes(data.get(..8)?.try_into().ok()?);
    let (key, value) = take_bytes(&data[8..])?;
    Some((op, key, value))
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// The keys an entry writes, for follower reads ([`crate::LeaseNode::set_entry_keys`]): a put's
/// key; nothing for raft's empty entry; every key for anything else.
pub fn entry_keys(e: &Entry) -> crate::follower::Keys {
    use crate::follower::Keys;
    if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
        return Keys::unknown(e);
    }
    match decode_put(&e.data) {
        Some((_, key, _)) => Keys::Some(vec![key.to_vec()]),
        None => Keys::All,
    }
}

/// Split a length-prefixed field off the front of `data`.
fn take_bytes(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let field = data.get(4..4usize.checked_add(len)?)?;
    Some((field, &data[4 + len..]))
}

/// Encode the whole state, for a snapshot.
pub fn encode_state(kv: &KvState) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, (value, revision)) in kv {
        put_bytes(&mut out, key);
        put_bytes(&mut out, value);
        out.extend_from_slice(&revision.to_be_bytes());
    }
    out
}

/// Decode a state made by [`encode_state`]. `None` if it is malformed.
pub fn decode_state(mut data: &[u8]) -> Option<KvState> {
    let mut kv = KvState::new();
    while !data.is_empty() {
        let (key, rest) = take_bytes(data)?;
        let (value, rest) = take_bytes(rest)?;
        let revision = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
        kv.insert(key.to_vec(), (value.to_vec(), revision));
        data = &rest[8..];
    }
    Some(kv)
}

/// The simulator's I/O for one node's `Ready`s: the simulated network, the node's storage and
/// KV state, and the history that acknowledges its writes.
pub struct SimIo<'a> {
    /// The node's raft id.
    pub id: u64,
    /// Its raft storage.
    pub storage: &'a SimStorage,
    /// Its state machine.
    pub kv: &'a mut dyn SimStateMachine,
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
    /// Snapshots this node installed, counted.
    pub installs: &'a mut u64,
}

impl SimIo<'_> {
    fn apply_put(&mut self, e: &Entry) {
        let (op, key, value) = decode_put(&e.data)
            .unwrap_or_else(|| panic!("node {} applied a malformed entry at {}", self.id, e.index));
        self.kv.put(key, value, e.index);
        self.history.applied(op, e.index);
        if self.writes.remove(&op) {
            self.history
                .complete(op, OpResult::Written { revision: e.index }, self.now_ns);
        }
    }
}

impl ReadyIo<SimStorage, SimClock> for SimIo<'_> {
    type Error = raft::Error;

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            self.net.send(m, self.now_ns, self.rng);
        }
    }

    fn install_snapshot(&mut self, _: &mut SimLeaseNode, snapshot: Snapshot) -> raft::Result<()> {
        self.kv.restore(&snapshot.data).unwrap_or_else(|| {
            panic!("node {} got a malformed snapshot", self.id);
        });
        self.storage.install(snapshot)?;
        *self.installs += 1;
        Ok(())
    }

    /// With follower leases, an entry past the exposed index the node knows is a violation of
    /// FOLLOWER.md's rule 1 (it would show a write no holder may have yet): recorded in the
    /// history, and the run goes on, so that what it leads to is checked too.
    fn apply(&mut self, node: &mut SimLeaseNode, entries: Vec<Entry>) -> raft::Result<()> {
        let exposed = node.apply_limit().unwrap_or(u64::MAX);
        if let Some(e) = entries.iter().find(|e| e.index > exposed) {
            let at_ns = self.now_ns;
            self.history
                .applied_past_exposed(self.id, e.index, exposed, at_ns);
        }
        for e in &entries {
            if let Some(cs) = apply_conf_change_entry(node, e)? {
                self.storage.set_conf_state(cs);
            } else if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                self.apply_put(e);
            }
        }
        Ok(())
    }

    fn persist(
        &mut self,
        _: &mut SimLeaseNode,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        self.storage.persist(entries, hs)
    }

    fn set_commit(&mut self, _: &mut SimLeaseNode, commit: u64) -> raft::Result<()> {
        self.storage.set_commit(commit);
        Ok(())
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

    #[test]
    fn state_round_trips_and_garbage_is_rejected() {
        let mut kv = KvState::new();
        kv.insert(b"a".to_vec(), (b"1".to_vec(), 3));
        kv.insert(vec![0xff], (vec![], 9));
        let data = encode_state(&kv);
        assert_eq!(decode_state(&data), Some(kv));
        assert_eq!(decode_state(&data[..data.len() - 1]), None);
        assert_eq!(decode_state(&[]), Some(KvState::new()));
    }
}
