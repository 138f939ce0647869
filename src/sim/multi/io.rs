//! The multi-group simulator's application: each group's storage, its KV state machine, and the
//! histories that acknowledge writes.

use std::collections::{BTreeMap, HashMap, HashSet};

use raft::eraftpb::{Entry, EntryType, HardState, Snapshot};

use crate::clock::SimClock;
use crate::drive::apply_conf_change_entry;
use crate::multi::{GroupId, MultiApp};
use crate::node::LeaseNode;
use crate::sim::history::{History, OpId, OpResult};
use crate::sim::kv::{decode_put, KvState, SimStateMachine};
use crate::sim::storage::SimStorage;

type Node = LeaseNode<SimStorage, SimClock>;

/// One node's application, borrowed for one round of `Ready`s.
pub(super) struct MultiIo<'a> {
    pub id: u64,
    pub storages: &'a BTreeMap<GroupId, SimStorage>,
    pub kv: &'a mut BTreeMap<GroupId, KvState>,
    /// Writes proposed at this node and not yet acknowledged, per group.
    pub writes: &'a mut HashMap<GroupId, HashSet<OpId>>,
    pub histories: &'a mut BTreeMap<GroupId, History>,
    pub now_ns: u64,
}

impl MultiIo<'_> {
    fn storage(&self, gid: GroupId) -> &SimStorage {
        self.storages
            .get(&gid)
            .expect("every hosted group has storage")
    }

    fn apply_put(&mut self, gid: GroupId, e: &Entry) {
        let (op, key, value) = decode_put(&e.data).unwrap_or_else(|| {
            panic!(
                "node {} group {gid}: malformed entry at {}",
                self.id, e.index
            )
        });
        self.kv.entry(gid).or_default().put(key, value, e.index);
        let history = self.histories.entry(gid).or_default();
        history.applied(op, e.index);
        if self.writes.entry(gid).or_default().remove(&op) {
            history.complete(op, OpResult::Written { revision: e.index }, self.now_ns);
        }
    }
}

impl MultiApp<SimStorage, SimClock> for MultiIo<'_> {
    type Error = raft::Error;

    fn install_snapshot(
        &mut self,
        gid: GroupId,
        _: &mut Node,
        snapshot: Snapshot,
    ) -> raft::Result<()> {
        let kv = self.kv.entry(gid).or_default();
        kv.restore(&snapshot.data)
            .expect("the simulator wrote this snapshot");
        self.storage(gid).install(snapshot)
    }

    fn apply(&mut self, gid: GroupId, node: &mut Node, entries: Vec<Entry>) -> raft::Result<()> {
        for e in &entries {
            if let Some(cs) = apply_conf_change_entry(node, e)? {
                self.storage(gid).set_conf_state(cs);
            } else if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                self.apply_put(gid, e);
            }
        }
        Ok(())
    }

    fn persist(
        &mut self,
        gid: GroupId,
        _: &mut Node,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        self.storage(gid).persist(entries, hs)
    }

    fn set_commit(&mut self, gid: GroupId, _: &mut Node, commit: u64) -> raft::Result<()> {
        self.storage(gid).set_commit(commit);
        Ok(())
    }
}
