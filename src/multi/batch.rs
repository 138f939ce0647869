//! What one node sends another in one go: the support session, every group's fortification
//! messages, and every group's raft messages, batched per destination node.

use raft::eraftpb::Message;

use crate::liveness::{Epoch, NodeId, SupportMsg};

/// A raft group's id.
pub type GroupId = u64;

/// A per-group fortification message, riding on the node-level batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FortifyMsg {
    /// The leader of `group` at `term` asks the receiver's replica to fortify, under the
    /// support the receiver gives it at `epoch`.
    Request {
        /// The group.
        group: GroupId,
        /// The term led.
        term: u64,
        /// The epoch of support the fortification rests on.
        epoch: Epoch,
    },
    /// The replica fortified: it counts while its node supports the leader at `epoch`, under
    /// its node's `incarnation`.
    Ack {
        /// The group.
        group: GroupId,
        /// The term led.
        term: u64,
        /// The epoch of support.
        epoch: Epoch,
        /// The supporting node's incarnation.
        incarnation: u32,
    },
    /// The replica did not fortify (another term, another leader, or no support): the leader
    /// wakes the group, so that raft brings the replica up to date, and asks again.
    Reject {
        /// The group.
        group: GroupId,
        /// The term led.
        term: u64,
    },
    /// The sender no longer leads `group` at `term` (it stepped down, or gave up because the
    /// group could not reach a quorum) and has stopped serving: a replica fortified to it for
    /// that term is released and campaigns after jitter. Sent over the node stream, so it
    /// arrives even when the group's own raft messages do not.
    Release {
        /// The group.
        group: GroupId,
        /// The term no longer led.
        term: u64,
    },
}

impl FortifyMsg {
    /// The group the message is about.
    pub fn group(&self) -> GroupId {
        match *self {
            FortifyMsg::Request { group, .. }
            | FortifyMsg::Ack { group, .. }
            | FortifyMsg::Reject { group, .. }
            | FortifyMsg::Release { group, .. } => group,
        }
    }
}

/// Everything one node sends another in one go.
#[derive(Debug, Clone, Default)]
pub struct NodeBatch {
    /// The sending node.
    pub from: NodeId,
    /// The receiving node.
    pub to: NodeId,
    /// The node-level support session.
    pub support: Vec<SupportMsg>,
    /// Per-group fortification.
    pub fortify: Vec<FortifyMsg>,
    /// Per-group raft messages.
    pub raft: Vec<(GroupId, Message)>,
}

impl NodeBatch {
    /// Messages in the batch, counted one by one (raft, fortification and support).
    pub fn len(&self) -> usize {
        self.support.len() + self.fortify.len() + self.raft.len()
    }

    /// Whether the batch carries nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
