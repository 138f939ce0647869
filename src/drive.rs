//! One standard way to process raft's `Ready`s: the caller supplies the I/O, the node keeps
//! the order that raft-rs requires and the lease depends on.
//!
//! The order, per `Ready`: send the leader's messages (stamped), install a snapshot, apply
//! committed entries, persist entries and hard state, send the persisted messages, advance, record
//! the new commit index, send the light messages, apply the light committed entries, advance apply.

use raft::eraftpb::{Entry, HardState, Message, Snapshot};
use raft::storage::MemStorage;
use raft::Storage;

use crate::clock::Clock;
use crate::node::LeaseNode;

/// The I/O behind [`LeaseNode::handle_ready`]. Each method gets the node, so that applying can
/// call [`LeaseNode::apply_conf_change`].
pub trait ReadyIo<S: Storage, C: Clock> {
    /// A storage or application failure; it stops the loop and is returned.
    type Error;
    /// Hand messages to the transport (already stamped with their round's send time).
    fn send(&mut self, msgs: Vec<Message>);
    /// Install a snapshot from the leader: storage and state machine.
    fn install_snapshot(
        &mut self,
        node: &mut LeaseNode<S, C>,
        snapshot: Snapshot,
    ) -> Result<(), Self::Error>;
    /// Apply committed entries to the state machine, in order.
    fn apply(&mut self, node: &mut LeaseNode<S, C>, entries: Vec<Entry>)
        -> Result<(), Self::Error>;
    /// Persist new log entries (replacing any conflicting suffix) and the hard state, durably.
    fn persist(
        &mut self,
        node: &mut LeaseNode<S, C>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> Result<(), Self::Error>;
    /// Record a newer commit index.
    fn set_commit(&mut self, node: &mut LeaseNode<S, C>, commit: u64) -> Result<(), Self::Error>;
}

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// Process every pending `Ready` through `io`. Call after `step`, `tick`, `propose` or `read`.
    pub fn handle_ready<IO: ReadyIo<S, C>>(&mut self, io: &mut IO) -> Result<(), IO::Error> {
        while self.has_ready() {
            let mut rd = self.ready();
            io.send(self.take_messages(&mut rd));
            if !rd.snapshot().is_empty() {
                io.install_snapshot(self, rd.snapshot().clone())?;
            }
            io.apply(self, rd.take_committed_entries())?;
            io.persist(self, rd.entries(), rd.hs())?;
            io.send(self.take_persisted_messages(&mut rd));
            let mut light = self.advance(rd);
            if let Some(commit) = light.commit_index() {
                io.set_commit(self, commit)?;
            }
            io.send(self.take_light_messages(&mut light));
            io.apply(self, light.take_committed_entries())?;
            self.advance_apply();
        }
        Ok(())
    }
}

/// The application half of a driver over raft-rs's `MemStorage` (tests, simulations, examples):
/// implement `send` and `apply`; persistence into the node's `MemStorage` is provided, and
/// membership changes are applied and recorded before `apply` sees the entries.
pub trait MemApp<C: Clock> {
    /// Hand messages to the transport.
    fn send(&mut self, msgs: Vec<Message>);
    /// Apply committed entries (membership changes included, already applied to the node).
    fn apply(&mut self, node: &mut LeaseNode<MemStorage, C>, entries: Vec<Entry>);
}

impl<C: Clock, A: MemApp<C>> ReadyIo<MemStorage, C> for A {
    type Error = raft::Error;

    fn send(&mut self, msgs: Vec<Message>) {
        MemApp::send(self, msgs);
    }

    fn install_snapshot(
        &mut self,
        node: &mut LeaseNode<MemStorage, C>,
        snapshot: Snapshot,
    ) -> raft::Result<()> {
        node.raw().store().wl().apply_snapshot(snapshot)
    }

    fn apply(
        &mut self,
        node: &mut LeaseNode<MemStorage, C>,
        entries: Vec<Entry>,
    ) -> raft::Result<()> {
        for e in &entries {
            if let Some(cs) = apply_conf_change_entry(node, e)? {
                node.raw().store().wl().set_conf_state(cs);
            }
        }
        MemApp::apply(self, node, entries);
        Ok(())
    }

    fn persist(
        &mut self,
        node: &mut LeaseNode<MemStorage, C>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        let store = node.raw().store();
        let mut core = store.wl();
        core.append(entries)?;
        if let Some(hs) = hs {
            core.set_hardstate(hs.clone());
        }
        Ok(())
    }

    fn set_commit(&mut self, node: &mut LeaseNode<MemStorage, C>, commit: u64) -> raft::Result<()> {
        node.raw().store().wl().mut_hard_state().set_commit(commit);
        Ok(())
    }
}

/// A [`MemApp`] that collects outgoing messages and committed entries for the caller.
#[derive(Debug, Default)]
pub struct Collect {
    /// Messages to send, in order.
    pub messages: Vec<Message>,
    /// Committed entries, in order (membership changes already applied to the node).
    pub committed: Vec<Entry>,
}

impl<C: Clock> MemApp<C> for Collect {
    fn send(&mut self, msgs: Vec<Message>) {
        self.messages.extend(msgs);
    }

    fn apply(&mut self, _: &mut LeaseNode<MemStorage, C>, entries: Vec<Entry>) {
        self.committed.extend(entries);
    }
}

/// If `e` is a membership change, apply it to `node` and return the new configuration (to be
/// recorded in storage); `None` for a normal entry, and for a change raft refuses to apply (such
/// as one removing every voter). raft checks a change against the configuration, which every
/// node has applied identically, so every node refuses it alike: it is a no-op, not a failure.
pub fn apply_conf_change_entry<S: Storage, C: Clock>(
    node: &mut LeaseNode<S, C>,
    e: &Entry,
) -> raft::Result<Option<raft::eraftpb::ConfState>> {
    use protobuf::Message as _;
    use raft::eraftpb::{ConfChange, ConfChangeV2, EntryType};
    let applied = match e.get_entry_type() {
        EntryType::EntryNormal => return Ok(None),
        EntryType::EntryConfChange => {
            node.apply_conf_change(&ConfChange::parse_from_bytes(&e.data)?)
        }
        EntryType::EntryConfChangeV2 => {
            node.apply_conf_change(&ConfChangeV2::parse_from_bytes(&e.data)?)
        }
    };
    match applied {
        Ok(cs) => Ok(Some(cs)),
        Err(raft::Error::ConfChangeError(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
