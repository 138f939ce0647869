//! What the raft loop needs from the application: its replicated state ([`StateMachine`]), and the
//! node type the loop drives.

use std::sync::Arc;

use raft::eraftpb::Entry;
use raft_lease::follower::Keys;
use raft_lease::LeaseNode;

use crate::base::clock::ScaledClock;
use crate::disk::storage::DiskStorage;

/// The node type the loop drives.
pub type Node = LeaseNode<DiskStorage, Arc<ScaledClock>>;

/// The application's replicated state, as the loop sees it.
pub trait StateMachine: Sized + Send + Sync + 'static {
    /// A request to change the state (becomes one raft entry).
    type Command: Send + 'static;
    /// What applying a command produced, for the client waiting on it.
    type Outcome: Send + 'static;
    /// A read of the state.
    type Query: Send + 'static;
    /// A read's answer.
    type Answer: Send + 'static;

    /// The state in `snapshot` (made by [`StateMachine::snapshot`]); an empty state for `&[]`.
    fn restore(snapshot: &[u8]) -> Result<Self, String>;
    /// The whole state, as snapshot data.
    fn snapshot(&self) -> Vec<u8>;
    /// The last raft index applied.
    fn applied(&self) -> u64;
    /// Record that the entry at `index` applied with nothing for the state machine (empty, or a
    /// membership change).
    fn skip(&mut self, index: u64);
    /// Apply the entry at `index`. Deterministic: every replica gets the same state and outcome.
    fn apply(&mut self, index: u64, data: &[u8]) -> Self::Outcome;
    /// Read the state.
    fn query(&self, q: &Self::Query) -> Self::Answer;
    /// On the leader, just before proposing: the entry's data (leader-side facts such as its
    /// clock reading filled in), or why it cannot be proposed now.
    /// A refusal is answered as `WriteReply::Refused`.
    fn prepare(&self, cmd: Self::Command, at: &Leading) -> Result<Vec<u8>, Self::Outcome>;
    /// On the leader, once per tick with no housekeeping entry in flight: an entry to propose
    /// (the state may note what it proposed, such as a checkpoint in flight).
    fn housekeeping(&mut self, at: &Leading) -> Option<Vec<u8>>;
    /// The keys an entry writes, for follower read leases: a pure function of the entry, the
    /// same on every replica ([`Keys::All`] for what it cannot tell). The default says every
    /// entry with data writes every key.
    fn entry_keys(entry: &Entry) -> Keys {
        Keys::unknown(entry)
    }
}

/// The leader's term and clock, for [`StateMachine::prepare`] and housekeeping.
#[derive(Debug, Clone, Copy)]
pub struct Leading {
    /// The leader's term.
    pub term: u64,
    /// The leader's lease clock now.
    pub now_ns: u64,
}
