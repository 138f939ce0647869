//! What the raft loop shares with the HTTP threads, per group ([`Shared`]: the state machine,
//! who leads, the status, the read handle) and for the node ([`Groups`]: every group, where a key
//! belongs, the address book, the clock, and the queue of requests to the raft thread).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};
use parking_lot::RwLock;
use raft_lease::multi::GroupId;
use raft_lease::ReadHandle;

use crate::base::clock::ScaledClock;
use crate::peer::members::Members;
use crate::raft::machine::StateMachine;
use crate::raft::requests::{Request, Routed};
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

/// What the loop shares with the HTTP threads about one group.
pub struct Shared<M: StateMachine> {
    /// The group.
    pub group: GroupId,
    /// The state machine: written by the raft thread (its sessions and counters are read by
    /// other threads; its data is read through `reader`, without this lock).
    pub machine: RwLock<M>,
    /// Reads of the state machine's data that take no lock the apply path takes.
    pub reader: M::Reader,
    /// The version of group 0's configuration this group last followed (see `peer::follow`),
    /// as of the applied index: what a snapshot of the group carries.
    pub follows: AtomicU64,
    /// Who leads, after every pass.
    pub leadership: Leadership,
    /// The group's status: published every tick (group 0) or when it changed, and at once when
    /// leadership changes.
    pub status: RwLock<Status>,
    /// Lease reads on any thread.
    pub handle: ReadHandle<Arc<ScaledClock>>,
    /// The address book (the node's).
    pub members: Arc<RwLock<Members>>,
    /// The lease clock (the node's).
    pub clock: Arc<ScaledClock>,
    /// Requests to the raft thread (the node's queue).
    requests: Sender<Routed<M>>,
    /// The last index applied, published after every batch of applies (and a snapshot's
    /// install) for tasks that wait for the state to move (etcd's watches).
    applied: tokio::sync::watch::Sender<u64>,
}

impl<M: StateMachine> Shared<M> {
    /// The group's shared state, with no status yet.
    pub fn new(
        group: GroupId,
        machine: M,
        handle: ReadHandle<Arc<ScaledClock>>,
        members: Arc<RwLock<Members>>,
        clock: Arc<ScaledClock>,
        requests: Sender<Routed<M>>,
    ) -> Self {
        Shared {
            group,
            reader: machine.reader(),
            follows: AtomicU64::new(0),
            machine: RwLock::new(machine),
            leadership: Leadership::default(),
            status: RwLock::default(),
            handle,
            members,
            clock,
            requests,
            applied: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Publish the state machine's applied index to [`Shared::applied_changes`]'s receivers.
    pub fn publish_applied(&self) {
        let applied = self.machine.read().applied();
        self.applied.send_if_modified(|last| {
            let moved = *last != applied;
            *last = applied;
            moved
        });
    }

    /// A receiver that wakes when the applied index moves.
    pub fn applied_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Queue `req` for the raft thread, for this group. Never blocks.
    pub fn send(&self, req: Request<M>) -> Result<(), TrySendError<Routed<M>>> {
        self.requests.try_send(Routed {
            group: self.group,
            req,
        })
    }
}

/// Every group of the node, by id from 0.
pub struct Groups<M: StateMachine> {
    /// Group `g` is `all[g]`.
    pub all: Vec<Arc<Shared<M>>>,
    /// Groups ticked on this node (not quiescent), as of the raft thread's last tick.
    pub awake: AtomicU64,
    /// Groups hosted here whose configuration, as applied here, is not group 0's yet (counted on
    /// the raft thread's ticks while a change spreads; see `peer::follow`).
    pub behind: AtomicU64,
}

impl<M: StateMachine> Groups<M> {
    /// Group `g` (of [`Groups::count`]).
    pub fn get(&self, g: GroupId) -> &Arc<Shared<M>> {
        &self.all[g as usize]
    }

    /// Group 0: sessions, locks, and the node-wide routes.
    pub fn first(&self) -> &Arc<Shared<M>> {
        &self.all[0]
    }

    /// How many groups the node hosts.
    pub fn count(&self) -> u32 {
        self.all.len() as u32
    }
}
