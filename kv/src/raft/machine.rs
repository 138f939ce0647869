//! What the raft loop needs from the application: its replicated state ([`StateMachine`]), and the
//! node type the loop drives.

use std::sync::Arc;

use raft::eraftpb::Entry;
use raft_lease::follower::Keys;
use raft_lease::LeaseNode;

use crate::base::clock::ScaledClock;
use crate::disk::state_engine::{EngineError, StateEngine};
use crate::disk::storage::DiskStorage;
use crate::peer::snapshot_send::StreamSource;

/// The node type the loop drives.
pub type Node = LeaseNode<DiskStorage, Arc<ScaledClock>>;

/// The application's replicated state, as the loop sees it. Its data lives in the state engine
/// beside the raft log (one engine per node, every group in it): applying writes a batch of it
/// with the applied index, and a restart opens it where it was left, replaying only the log
/// after its applied index. No whole-state copy is made on the raft thread for a restart or a
/// log cut; a snapshot for a follower is a stream of the engine's rows at one applied index.
pub trait StateMachine: Sized + Send + Sync + 'static {
    /// A request to change the state (becomes one raft entry).
    type Command: Send + 'static;
    /// What applying a command produced, for the client waiting on it.
    type Outcome: Send + 'static;
    /// A read of the state.
    type Query: Send + 'static;
    /// A read's answer.
    type Answer: Send + 'static;
    /// Reads of the state that take no lock the apply path takes (a handle on the engine).
    type Reader: Clone + Send + Sync + 'static;

    /// Group `group`'s state as `engine` holds it (an empty state at index 0 if none).
    fn open(engine: StateEngine, group: u64) -> Result<Self, String>;
    /// The handle readers use.
    fn reader(&self) -> Self::Reader;
    /// The last raft index applied.
    fn applied(&self) -> u64;
    /// The last raft index applied and durable: the raft log is never cut past it.
    fn durable(&self) -> u64;
    /// Make everything applied durable (one fsync of the engine).
    fn make_durable(&mut self) -> Result<(), EngineError>;
    /// Everything applied is durable: the engine was made durable after it (by the loop, once
    /// for every group of the node).
    fn mark_durable(&mut self);
    /// Apply a run of committed entries, each `(index, data)` (empty data: nothing for the
    /// state machine, as an empty entry or a membership change), in one engine batch; each
    /// entry's outcome (`None` for an empty one). Deterministic: every replica gets the same
    /// state and outcomes. An engine failure writes nothing of the run and stops the node.
    fn apply(&mut self, run: &[(u64, &[u8])]) -> Result<Vec<Option<Self::Outcome>>, EngineError>;
    /// Read the state.
    fn query(&self, q: &Self::Query) -> Self::Answer;
    /// A view of the state as applied now (no copy: opening it costs about nothing), to stream
    /// as a snapshot later, off the raft thread (`peer::snapshot_send`).
    fn snapshot_view(&self) -> Result<Box<dyn StreamSource>, EngineError>;
    /// Write a snapshot stream taken at `index`, in hand, beside the state, durably, as an
    /// install in progress; the state is unchanged until [`StateMachine::install_staged`].
    /// A stream that does not add up is refused with the reason, and changes nothing. The
    /// install's id.
    fn stage(&mut self, stream: &[u8], index: u64) -> Result<u64, String>;
    /// The index install `id` holds, if it is staged and sealed (a streamed snapshot's state is
    /// sealed by `peer::snapshot_recv` before raft sees it).
    fn staged_index(&self, id: u64) -> Result<Option<u64>, String>;
    /// Make staged install `id` the state (the raft log has taken the snapshot meanwhile).
    fn install_staged(&mut self, id: u64) -> Result<(), String>;
    /// At start, with the raft log's last snapshot at `log_snapshot_index`: complete an install
    /// a crash left half done if the log took its snapshot, else drop it.
    fn settle(&mut self, log_snapshot_index: u64) -> Result<(), String>;
    /// A bounded step of the store's own upkeep (removing what a compaction or a replaced
    /// state left), between passes; whether more is left.
    fn tidy(&mut self) -> Result<bool, EngineError> {
        Ok(false)
    }
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
