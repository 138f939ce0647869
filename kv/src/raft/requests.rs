//! Work for the raft thread ([`Request`]) and its answers, each sent back on a oneshot channel.

use raft::eraftpb::ConfState;
use raft_lease::{ReadKind, ReadMode};
use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::peer::members::{Change, ChangeError};
use crate::raft::machine::StateMachine;

/// A write's answer.
#[derive(Debug)]
pub enum WriteReply<O> {
    /// Committed and applied: the state machine's outcome.
    Done(O),
    /// This node does not lead; `leader` if it knows who does.
    NotLeader {
        /// The leader's id.
        leader: Option<u64>,
    },
    /// Not proposed: the state machine refused it on the leader (not ready yet, say).
    Refused(O),
    /// Not applied, for sure: raft refused it, or another leader's entry took its place.
    NotApplied(String),
    /// Not known: the node stopped, or gave up waiting, before the entry's fate was known.
    Unknown(String),
}

/// A read's answer.
#[derive(Debug)]
pub enum ReadReply<A> {
    /// The state read, and how it was made linearizable.
    Value {
        /// The answer.
        answer: A,
        /// Lease or ReadIndex.
        kind: ReadKind,
    },
    /// This node does not lead.
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// A strict lease read without a lease.
    LeaseNotHeld,
    /// The node stopped before the read was served.
    ShuttingDown,
}

/// A membership change's answer.
#[derive(Debug)]
pub enum MembersReply {
    /// Applied: the configuration now (joint while `voters_outgoing` is not empty; raft leaves
    /// the joint configuration by itself).
    Done {
        /// The configuration after the change.
        conf: ConfState,
        /// The raft index of the change.
        index: u64,
    },
    /// Refused before it reached raft.
    Invalid(ChangeError),
    /// Refused by raft or the lease layer (a change already in progress, a leader removing itself).
    Refused(String),
    /// This node does not lead.
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// Not known: the node stopped or leadership changed first.
    Unknown(String),
}

/// Work for the raft thread.
pub enum Request<M: StateMachine> {
    /// Propose a command; the answer comes when it applied. `ticket` holds its bytes meanwhile.
    Propose {
        /// The command.
        cmd: M::Command,
        /// Where to answer.
        reply: oneshot::Sender<WriteReply<M::Outcome>>,
        /// The request's bytes in the in-flight budget.
        ticket: Option<Ticket>,
        /// When it was queued for the raft thread (the write's queueing time is measured).
        sent_at: std::time::Instant,
    },
    /// A read through raft (ReadIndex, or a lease read the HTTP worker could not serve).
    Read {
        /// What to read.
        query: M::Query,
        /// How.
        mode: ReadMode,
        /// Where to answer.
        reply: oneshot::Sender<ReadReply<M::Answer>>,
    },
    /// Change the membership.
    Members {
        /// The changes, as one raft membership change.
        changes: Vec<Change>,
        /// Where to answer.
        reply: oneshot::Sender<MembersReply>,
    },
    /// Hand leadership to `to`.
    Transfer {
        /// The new leader.
        to: u64,
    },
}

/// A request for one group's replica.
pub struct Routed<M: StateMachine> {
    /// The group.
    pub group: raft_lease::multi::GroupId,
    /// The request.
    pub req: Request<M>,
}
