//! [`MultiMemApp`]: the application half of a [`MultiApp`] over raft-rs's `MemStorage`, for
//! tests, benches and examples (a store of your own implements [`MultiApp`] itself).

use raft::eraftpb::{Entry, HardState, Snapshot};
use raft::storage::MemStorage;

use super::{GroupId, MultiApp};
use crate::clock::Clock;
use crate::drive::{apply_conf_changes_to_mem, persist_to_mem};
use crate::node::LeaseNode;

/// Implement this (the state machine of each group) to get a [`MultiApp`] over `MemStorage`.
pub trait MultiMemApp<C: Clock> {
    /// Apply group `group`'s committed entries (membership changes included, already applied to
    /// the node and recorded in its storage).
    fn apply(&mut self, group: GroupId, node: &mut LeaseNode<MemStorage, C>, entries: Vec<Entry>);
}

impl<C: Clock, A: MultiMemApp<C>> MultiApp<MemStorage, C> for A {
    type Error = raft::Error;

    fn install_snapshot(
        &mut self,
        _: GroupId,
        node: &mut LeaseNode<MemStorage, C>,
        snapshot: Snapshot,
    ) -> raft::Result<()> {
        node.raw().store().wl().apply_snapshot(snapshot)
    }

    fn apply(
        &mut self,
        group: GroupId,
        node: &mut LeaseNode<MemStorage, C>,
        entries: Vec<Entry>,
    ) -> raft::Result<()> {
        apply_conf_changes_to_mem(node, &entries)?;
        MultiMemApp::apply(self, group, node, entries);
        Ok(())
    }

    fn persist(
        &mut self,
        _: GroupId,
        node: &mut LeaseNode<MemStorage, C>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        persist_to_mem(node.raw().store(), entries, hs)
    }

    fn set_commit(
        &mut self,
        _: GroupId,
        node: &mut LeaseNode<MemStorage, C>,
        commit: u64,
    ) -> raft::Result<()> {
        node.raw().store().wl().mut_hard_state().set_commit(commit);
        Ok(())
    }
}
