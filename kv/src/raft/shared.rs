//! What the raft loop shares with the HTTP threads: the state machine, who leads, the status, the
//! address book, the read handle and the clock, and the queue of requests to the raft thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;
use parking_lot::RwLock;
use raft_lease::ReadHandle;

use crate::base::clock::ScaledClock;
use crate::peer::members::Members;
use crate::raft::machine::StateMachine;
use crate::raft::requests::Request;
use crate::raft::status::Status;

/// Who leads, as of the raft thread's last pass (read on every request, so kept in atomics).
#[derive(Debug, Default)]
pub struct Leadership {
    is_leader: AtomicBool,
    /// The leader's id; 0 when none is known.
    leader_id: AtomicU64,
    /// The node's raft term.
    term: AtomicU64,
}

impl Leadership {
    /// (this node leads, the leader it knows of).
    pub fn get(&self) -> (bool, Option<u64>) {
        let id = self.leader_id.load(Ordering::Acquire);
        (
            self.is_leader.load(Ordering::Acquire),
            (id != 0).then_some(id),
        )
    }

    /// The node's raft term, as of the raft thread's last pass.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// Record who leads (the raft thread, after every pass).
    pub(super) fn set(&self, is_leader: bool, leader: Option<u64>, term: u64) {
        self.term.store(term, Ordering::Release);
        self.leader_id.store(leader.unwrap_or(0), Ordering::Release);
        self.is_leader.store(is_leader, Ordering::Release);
    }
}

/// What the loop shares with the HTTP threads.
pub struct Shared<M: StateMachine> {
    /// The state machine: written by the raft thread, read by lease reads.
    pub machine: RwLock<M>,
    /// Who leads, after every pass.
    pub leadership: Leadership,
    /// The node's status: published every tick, and at once when leadership changes.
    pub status: RwLock<Status>,
    /// The address book.
    pub members: Arc<RwLock<Members>>,
    /// Lease reads on any thread.
    pub handle: ReadHandle<Arc<ScaledClock>>,
    /// The lease clock.
    pub clock: Arc<ScaledClock>,
    /// Requests to the raft thread.
    pub requests: Sender<Request<M>>,
}
