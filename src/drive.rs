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
///
/// Over raft-rs's `MemStorage`, implementing [`MemApp`] (transport and state machine only) is
/// enough. For your own log store, transport and state machine, implement this trait.
///
/// # Example
/// A node's I/O with a transport of channels, a state machine that is a map, and a log store
/// (here raft-rs's `MemStorage`, which the node reads its log back from; a store of your own
/// implements `raft::Storage` over its files and makes [`ReadyIo::persist`] durable). Three nodes
/// then replicate a write through it.
///
/// ```
/// use std::collections::HashMap;
///
/// use crossbeam_channel::{unbounded, Receiver, Sender};
/// use raft::eraftpb::{Entry, EntryType, HardState, Message, Snapshot};
/// use raft::storage::MemStorage;
/// use raft_lease::drive::apply_conf_change_entry;
/// use raft_lease::{LeaseConfig, LeaseNode, ReadyIo, SimClock};
///
/// type Error = Box<dyn std::error::Error + Send + Sync>;
/// type Clock = SimClock; // BootClock in production
/// type Node = LeaseNode<MemStorage, Clock>;
///
/// struct NodeIo {
///     /// The transport: one channel to each peer.
///     peers: HashMap<u64, Sender<Message>>,
///     /// The state machine.
///     kv: HashMap<String, String>,
///     /// How many times `persist` made the log durable.
///     syncs: u64,
/// }
///
/// impl ReadyIo<MemStorage, Clock> for NodeIo {
///     type Error = Error;
///
///     fn send(&mut self, msgs: Vec<Message>) {
///         for m in msgs {
///             // A peer that is down loses the message; raft sends again.
///             let _ = self.peers[&m.to].send(m);
///         }
///     }
///
///     fn install_snapshot(
///         &mut self,
///         node: &mut Node,
///         snapshot: Snapshot,
///     ) -> Result<(), Error> {
///         // The state machine becomes the snapshot's, then the log store takes its metadata.
///         self.kv = std::str::from_utf8(snapshot.get_data())?
///             .lines()
///             .filter_map(|line| line.split_once('='))
///             .map(|(k, v)| (k.to_string(), v.to_string()))
///             .collect();
///         Ok(node.mut_store().wl().apply_snapshot(snapshot)?)
///     }
///
///     fn apply(&mut self, node: &mut Node, entries: Vec<Entry>) -> Result<(), Error> {
///         for e in entries {
///             if e.get_entry_type() != EntryType::EntryNormal {
///                 // A membership change: the node applies it, the log store records it.
///                 if let Some(conf_state) = apply_conf_change_entry(node, &e)? {
///                     node.mut_store().wl().set_conf_state(conf_state);
///                 }
///             } else if let Some((k, v)) = std::str::from_utf8(&e.data)?.split_once('=') {
///                 self.kv.insert(k.to_string(), v.to_string());
///             }
///         }
///         Ok(())
///     }
///
///     fn persist(
///         &mut self,
///         node: &mut Node,
///         entries: &[Entry],
///         hs: Option<&HardState>,
///     ) -> Result<(), Error> {
///         let mut log = node.mut_store().wl();
///         log.append(entries)?; // replaces any conflicting suffix
///         if let Some(hs) = hs {
///             log.set_hardstate(hs.clone());
///         }
///         self.syncs += 1; // fsync here: messages that depend on it are sent after this returns
///         Ok(())
///     }
///
///     fn set_commit(&mut self, node: &mut Node, commit: u64) -> Result<(), Error> {
///         node.mut_store().wl().mut_hard_state().set_commit(commit);
///         Ok(())
///     }
/// }
///
/// // Three nodes, each with its inbox.
/// let clock = SimClock::new(0, 0);
/// let logger = slog::Logger::root(slog::Discard, slog::o!());
/// let inboxes: Vec<(Sender<Message>, Receiver<Message>)> = (0..3).map(|_| unbounded()).collect();
/// let mut nodes = Vec::new();
/// for id in 1..=3u64 {
///     let rc = raft::Config { id, election_tick: 10, heartbeat_tick: 2, ..Default::default() };
///     let lc =
///         LeaseConfig { promise_ms: 100, drift_ppm: 500, margin_ms: 2, ..Default::default() };
///     let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
///     let node = LeaseNode::new(&rc, storage, lc, 10, clock.clone(), &logger)?;
///     let peers = (1..=3).map(|p| (p, inboxes[p as usize - 1].0.clone())).collect();
///     nodes.push((node, NodeIo { peers, kv: HashMap::new(), syncs: 0 }));
/// }
///
/// // Each node's loop: tick, step its inbox, process `Ready`s through its `NodeIo`.
/// let mut run = |nodes: &mut Vec<(Node, NodeIo)>, ms: u64| {
///     for _ in 0..ms / 10 {
///         clock.advance(10_000_000);
///         for (node, io) in nodes.iter_mut() {
///             node.tick();
///             node.handle_ready(io)?;
///         }
///         while inboxes.iter().any(|(_, inbox)| !inbox.is_empty()) {
///             for ((node, io), (_, inbox)) in nodes.iter_mut().zip(&inboxes) {
///                 for m in inbox.try_iter() {
///                     node.step(m)?;
///                 }
///                 node.handle_ready(io)?;
///             }
///         }
///     }
///     Ok::<(), Error>(())
/// };
///
/// run(&mut nodes, 1_000)?;
/// let (leader, _) = nodes.iter_mut().find(|(node, _)| node.is_leader()).expect("a leader");
/// leader.propose(vec![], b"colour=blue".to_vec())?;
/// run(&mut nodes, 50)?;
/// for (_, io) in &nodes {
///     assert_eq!(io.kv["colour"], "blue");
///     assert!(io.syncs > 0);
/// }
/// # Ok::<(), Error>(())
/// ```
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

/// One step of processing a `Ready`, in the order raft-rs requires.
pub(crate) enum ReadyStep<'a> {
    /// Hand messages to the transport.
    Send(Vec<Message>),
    /// Install a snapshot from the leader.
    InstallSnapshot(Snapshot),
    /// Apply committed entries.
    Apply(Vec<Entry>),
    /// Persist new entries and the hard state.
    Persist(&'a [Entry], Option<&'a HardState>),
    /// Record a newer commit index.
    SetCommit(u64),
}

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// Process every pending `Ready` through `io`. Call after `step`, `tick`, `propose` or `read`.
    pub fn handle_ready<IO: ReadyIo<S, C>>(&mut self, io: &mut IO) -> Result<(), IO::Error> {
        self.drive_ready(|node, step| match step {
            ReadyStep::Send(msgs) => {
                io.send(msgs);
                Ok(())
            }
            ReadyStep::InstallSnapshot(snapshot) => io.install_snapshot(node, snapshot),
            ReadyStep::Apply(entries) => io.apply(node, entries),
            ReadyStep::Persist(entries, hs) => io.persist(node, entries, hs),
            ReadyStep::SetCommit(commit) => io.set_commit(node, commit),
        })
    }

    /// The `Ready` loop, once, for [`LeaseNode::handle_ready`].
    pub(crate) fn drive_ready<E>(
        &mut self,
        mut step: impl FnMut(&mut Self, ReadyStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.ready_prepare(&mut step)?;
        while let Some(rd) = self.ready_begin(&mut step)? {
            self.ready_finish(rd, &mut step)?;
        }
        Ok(())
    }

    /// Before any `Ready`: start the round of the ReadIndex reads begun since the last call (they
    /// share one), and hand over held entries that `E` now covers.
    pub(crate) fn ready_prepare<E>(
        &mut self,
        step: &mut impl FnMut(&mut Self, ReadyStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.issue_index_round();
        self.release_exposed(step)
    }

    /// The first half of a `Ready`, up to its persisting: the leader's messages, a snapshot,
    /// committed entries, then the new entries and hard state. `None` when there is no `Ready`.
    ///
    /// The caller makes what was persisted durable before [`Self::ready_finish`]: that half
    /// sends the messages that depend on it and lets raft count this replica's log (a leader
    /// counts itself towards a commit).
    pub(crate) fn ready_begin<E>(
        &mut self,
        step: &mut impl FnMut(&mut Self, ReadyStep<'_>) -> Result<(), E>,
    ) -> Result<Option<raft::Ready>, E> {
        if !self.has_ready() {
            return Ok(None);
        }
        let mut rd = self.ready();
        let msgs = self.take_messages(&mut rd);
        step(self, ReadyStep::Send(msgs))?;
        if !rd.snapshot().is_empty() {
            let index = rd.snapshot().get_metadata().index;
            self.before_snapshot(index);
            step(self, ReadyStep::InstallSnapshot(rd.snapshot().clone()))?;
            self.exposure_on_snapshot(index);
        }
        // `E` was recomputed as the messages were stamped (a snapshot is a follower's).
        let committed = self.hold_back(rd.take_committed_entries());
        step(self, ReadyStep::Apply(committed))?;
        step(self, ReadyStep::Persist(rd.entries(), rd.hs()))?;
        Ok(Some(rd))
    }

    /// The second half of a `Ready` whose persisted state is durable: the messages that waited
    /// for it, `advance`, the new commit index, and the light `Ready`'s messages and entries.
    pub(crate) fn ready_finish<E>(
        &mut self,
        mut rd: raft::Ready,
        step: &mut impl FnMut(&mut Self, ReadyStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let msgs = self.take_persisted_messages(&mut rd);
        step(self, ReadyStep::Send(msgs))?;
        let mut light = self.advance_for_exposure(rd);
        if let Some(commit) = light.commit_index() {
            step(self, ReadyStep::SetCommit(commit))?;
        }
        let msgs = self.take_light_messages(&mut light); // `E` recomputed from the new commit
        step(self, ReadyStep::Send(msgs))?;
        let committed = self.hold_back(light.take_committed_entries());
        step(self, ReadyStep::Apply(committed))?;
        self.advance_applied();
        Ok(())
    }

    /// With follower leases: hand the application the held entries `E` now covers (it may have
    /// moved with a step, outside any `Ready`).
    fn release_exposed<E>(
        &mut self,
        step: &mut impl FnMut(&mut Self, ReadyStep<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.exposed().is_none() {
            return Ok(());
        }
        let released = self.released_transfer();
        if !released.is_empty() {
            step(self, ReadyStep::Send(released))?;
        }
        self.expose_now();
        let released = self.hold_back(Vec::new());
        if !released.is_empty() {
            step(self, ReadyStep::Apply(released))?;
            self.advance_applied();
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
        apply_conf_changes_to_mem(node, &entries)?;
        MemApp::apply(self, node, entries);
        Ok(())
    }

    fn persist(
        &mut self,
        node: &mut LeaseNode<MemStorage, C>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        persist_to_mem(node.raw().store(), entries, hs)
    }

    fn set_commit(&mut self, node: &mut LeaseNode<MemStorage, C>, commit: u64) -> raft::Result<()> {
        node.raw().store().wl().mut_hard_state().set_commit(commit);
        Ok(())
    }
}

/// Apply the membership changes among `entries` to `node` and record each in its `MemStorage`.
pub(crate) fn apply_conf_changes_to_mem<C: Clock>(
    node: &mut LeaseNode<MemStorage, C>,
    entries: &[Entry],
) -> raft::Result<()> {
    for e in entries {
        if let Some(cs) = apply_conf_change_entry(node, e)? {
            node.raw().store().wl().set_conf_state(cs);
        }
    }
    Ok(())
}

/// Append `entries` to a `MemStorage` (replacing any conflicting suffix) and record `hs`.
pub(crate) fn persist_to_mem(
    store: &MemStorage,
    entries: &[Entry],
    hs: Option<&HardState>,
) -> raft::Result<()> {
    let mut core = store.wl();
    core.append(entries)?;
    if let Some(hs) = hs {
        core.set_hardstate(hs.clone());
    }
    Ok(())
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
