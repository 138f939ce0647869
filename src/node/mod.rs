//! `LeaseNode`: a thin driver around raft-rs's `RawNode` that adds the real-time lease.
//!
//! It intercepts `step` (refuses votes under the promise, records heartbeat acknowledgements),
//! stamps outgoing rounds with their send time, tracks role and term, and owns the read queue.
//! The decisions themselves live in the pure state machines of [`crate::lease`],
//! [`crate::promise`], [`crate::round`] and [`crate::read`].
//!
//! # Driving it
//! Use it as you would use `RawNode`, with four differences:
//! - take outgoing messages with [`LeaseNode::take_messages`], [`LeaseNode::take_persisted_messages`]
//!   and [`LeaseNode::take_light_messages`] (they tag heartbeats and read `t0`) just before sending;
//! - apply committed entries before [`LeaseNode::advance`] / [`LeaseNode::advance_apply`];
//! - after `advance`, call [`LeaseNode::serve_reads`] to hand back finished reads;
//! - raft's `read_states` are consumed by the node: use [`LeaseNode::read`] for reads.

use std::sync::Arc;

use raft::eraftpb::{ConfState, Message, MessageType};
use raft::{
    Config, LightReady, RawNode, ReadOnlyOption, Ready, StateRole, Storage, CAMPAIGN_TRANSFER,
};
use raft_proto::ConfChangeI;
use slog::{debug, info, warn, Logger};
use thiserror::Error;

use crate::clock::Clock;
use crate::config::{ConfigError, Derived, LeaseConfig, Safeties};
use crate::ctx::{LayerCtx, Promised, ReservedContext};
use crate::handle::{ReadHandle, Shared, Slot};
use crate::lease::{AckOutcome, LeaderLease, LeaseState};
use crate::promise::{CampaignJitter, FollowerPromise, VoteDecision};
use crate::read::{ReadError, ReadId, ReadKind, ReadMode, ReadQueue, ServedRead};
use crate::round::RoundTracker;
use crate::status::{CounterSnapshot, Counters, LeaseStatus};

mod exposure;
mod leadership;
mod publish;
mod reads;
mod ready;
mod traffic;

/// Why a [`LeaseNode`] could not be created.
#[derive(Debug, Error)]
pub enum NodeError {
    /// The lease configuration is invalid.
    #[error("invalid lease config: {0}")]
    Config(#[from] ConfigError),
    /// raft-rs refused its configuration or storage.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// raft's `LeaseBased` read option is unsafe; the layer needs `Safe` (it provides the lease).
    #[error("raft read_only_option must be Safe; the lease layer provides lease reads")]
    UnsafeReadOption,
    /// A `MultiNode` already hosts a group with this id.
    #[error("group {0} is already hosted on this node")]
    GroupExists(u64),
    /// A `MultiNode` hosts no group with this id.
    #[error("group {0} is not hosted on this node")]
    NoSuchGroup(u64),
}

/// Why [`LeaseNode::campaign`] did not start an election.
#[derive(Debug, Error)]
pub enum CampaignError {
    /// This node promised a leader not to vote for anyone else yet, itself included.
    #[error("promise holds for {remaining_ns} ns more")]
    PromiseHolds {
        /// Time left on the promise, in nanoseconds.
        remaining_ns: u64,
    },
    /// A follower read lease this node granted may still be served: a term of its own could
    /// expose writes its holder lacks (follower leases only).
    #[error("a read lease this node granted may still be served")]
    GrantsLive,
    /// raft refused.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}

/// A raft node with a real-time leader lease. See the module docs for how to drive it.
///
/// # Example
/// Three nodes driven by hand (`tick`, `step`, `handle_ready`), and each way a read can end: a
/// follower names the leader, a lease read is served at once, a ReadIndex read after a quorum
/// round, a strict lease read on a cut-off leader is refused, and a read waiting on a leader that
/// was deposed fails rather than answer stale.
///
/// ```
/// # use std::collections::HashMap;
/// # use raft::eraftpb::{Entry, EntryType, Message};
/// # use raft::storage::MemStorage;
/// use raft_lease::{LeaseConfig, LeaseNode, MemApp, ReadError, ReadKind, ReadMode, SimClock};
/// # type Node = LeaseNode<MemStorage, SimClock>;
/// # #[derive(Default)]
/// # struct App { outbox: Vec<Message>, kv: HashMap<String, String> }
/// # impl MemApp<SimClock> for App {
/// #     fn send(&mut self, msgs: Vec<Message>) { self.outbox.extend(msgs); }
/// #     fn apply(&mut self, _: &mut Node, entries: Vec<Entry>) {
/// #         let puts = entries.iter().filter(|e| e.get_entry_type() == EntryType::EntryNormal);
/// #         for put in puts.filter_map(|e| std::str::from_utf8(&e.data).ok()?.split_once('=')) {
/// #             self.kv.insert(put.0.to_string(), put.1.to_string());
/// #         }
/// #     }
/// # }
///
/// /// Run every node for `ms`: tick every 10 ms, step what the network delivers, process
/// /// `Ready`s. The network drops everything to and from `cut`.
/// fn run(nodes: &mut [(Node, App)], clock: &SimClock, ms: u64, cut: Option<usize>)
///     -> Result<(), raft::Error>
/// {
///     for _ in 0..ms / 10 {
///         clock.advance(10_000_000);
///         for (node, app) in nodes.iter_mut() {
///             node.tick();
///             node.handle_ready(app)?;
///         }
///         loop {
///             let sent: Vec<Message> =
///                 nodes.iter_mut().flat_map(|(_, app)| app.outbox.drain(..)).collect();
///             if sent.is_empty() {
///                 break;
///             }
///             let cut_id = cut.map(|c| c as u64 + 1);
///             let reaches = |m: &Message| cut_id.is_none_or(|c| m.from != c && m.to != c);
///             for m in sent.into_iter().filter(reaches) {
///                 let (node, app) = &mut nodes[m.to as usize - 1];
///                 node.step(m)?;
///                 node.handle_ready(app)?;
///             }
///         }
///     }
///     Ok(())
/// }
///
/// # let clock = SimClock::new(0, 0);
/// # let logger = slog::Logger::root(slog::Discard, slog::o!());
/// # let mut nodes = Vec::new();
/// # for id in 1..=3 {
/// #     let rc = raft::Config { id, election_tick: 10, heartbeat_tick: 2, ..Default::default() };
/// #     let lc = LeaseConfig { promise_ms: 100, drift_ppm: 500, margin_ms: 2, ..Default::default() };
/// #     let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
/// #     nodes.push((LeaseNode::new(&rc, storage, lc, 10, clock.clone(), &logger)?, App::default()));
/// # }
/// // Three nodes as in the crate docs: P = 100 ms, ρ = 500 ppm, ε = 2 ms, 10 ms ticks.
/// run(&mut nodes, &clock, 1_000, None)?;
/// let leader = nodes.iter().position(|(node, _)| node.is_leader()).expect("a leader");
/// let leader_id = nodes[leader].0.id();
/// nodes[leader].0.propose(vec![], b"k=v1".to_vec())?;
/// run(&mut nodes, &clock, 20, None)?;
///
/// // A follower serves no reads: it names the leader, for the client to retry there.
/// let follower = (leader + 1) % 3;
/// let not_leader = ReadError::NotLeader { leader_hint: Some(leader_id) };
/// assert_eq!(nodes[follower].0.read(ReadMode::Auto), Err(not_leader));
///
/// // On the leader, a lease read needs no round; a ReadIndex read waits for one. Both hand back
/// // from `serve_reads`, which reads your state (first) for each finished read.
/// let (node, app) = &mut nodes[leader];
/// let lease_read = node.read(ReadMode::Lease)?;
/// let index_read = node.read(ReadMode::ReadIndex)?;
/// let served = node.serve_reads(|_id| app.kv["k"].clone());
/// assert_eq!(served.len(), 1);
/// assert_eq!(served[0].id, lease_read);
/// assert_eq!(served[0].result, Ok(("v1".to_string(), ReadKind::Lease)));
/// run(&mut nodes, &clock, 10, None)?; // the round goes out and a quorum answers
/// let (node, app) = &mut nodes[leader];
/// let served = node.serve_reads(|_id| app.kv["k"].clone());
/// assert_eq!(served[0].id, index_read);
/// assert_eq!(served[0].result, Ok(("v1".to_string(), ReadKind::Index)));
///
/// // Cut the leader off. Within L its lease lapses: strict lease reads are refused at once,
/// // and an `Auto` read waits for a ReadIndex round that cannot complete.
/// run(&mut nodes, &clock, 150, Some(leader))?;
/// let node = &mut nodes[leader].0;
/// assert!(node.is_leader() && !node.lease_status().state.is_held());
/// assert_eq!(node.read(ReadMode::Lease), Err(ReadError::LeaseNotHeld));
/// let waiting = node.read(ReadMode::Auto)?;
///
/// // Meanwhile the others elect a leader (after their promises end) and take a write. When the
/// // old leader hears of it, it steps down and its waiting read fails: never answered stale.
/// run(&mut nodes, &clock, 1_000, Some(leader))?;
/// // (The cut-off node still believes it leads, so look among the others.)
/// let others = (0..3).filter(|&i| i != leader);
/// let new_leader = others.into_iter().find(|&i| nodes[i].0.is_leader()).expect("a new leader");
/// nodes[new_leader].0.propose(vec![], b"k=v2".to_vec())?;
/// run(&mut nodes, &clock, 100, None)?;
/// let (node, app) = &mut nodes[leader];
/// assert!(!node.is_leader());
/// let served = node.serve_reads(|_id| app.kv["k"].clone());
/// assert_eq!(served[0].id, waiting);
/// let new_leader_id = nodes[new_leader].0.id();
/// assert_eq!(served[0].result, Err(ReadError::NotLeader { leader_hint: Some(new_leader_id) }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LeaseNode<S: Storage, C: Clock> {
    raw: RawNode<S>,
    clock: Arc<C>,
    /// Which safeties are on, fixed at creation. Every switch is read through it.
    safeties: Safeties,
    derived: Derived,
    heartbeat_tick: u64,
    /// raft's election timeout range in ticks, `[min, max)`.
    election_ticks: (usize, usize),
    lease: LeaderLease,
    promise: FollowerPromise,
    /// Spreads out campaigns that the promise held back.
    jitter: CampaignJitter,
    /// The end of the last promise that held back this node's own campaign (0: none).
    held_until_ns: u64,
    /// Under shared liveness: the leader this replica is fortified to, while its node supports
    /// that leader's node (set and cleared by the multi-group driver). Votes for others and this
    /// replica's own campaigns are refused meanwhile.
    fortified_to: Option<u64>,
    rounds: RoundTracker,
    reads: ReadQueue,
    shared: Arc<Shared<C>>,
    logger: Logger,
    /// Role and term last seen; a change loses the lease and fails queued reads.
    seen: (StateRole, u64),
    /// Whether the lease was held at the last publish, to count expirations.
    lease_was_held: bool,
    /// Between `ready()` and `advance*()`: raft must not be stepped, so no read round is issued.
    in_ready: bool,
    /// This leader applied its own removal; it steps down at the next point outside a `Ready`.
    removed_while_leading: bool,
    /// Bumped whenever raft's configuration may have changed: a conf change applied, a snapshot
    /// stepped (raft restores its configuration as it steps it). See [`Self::conf_version`].
    conf_version: u64,
    /// The term in which this leader last sent `MsgTimeoutNow` (0: never). A transfer raft gives
    /// up after that cannot lift the fence: the message may still arrive and force an election.
    timeout_now_term: u64,
    /// Ticks since this leader last sent a round of heartbeats.
    ticks_since_round: u64,
    /// Answers to [`LeaseNode::raw_read_index`] calls, for the caller to take.
    raw_read_states: Vec<raft::ReadState>,
    /// Follower read leases: the exposed index and the entries held back to it (`None`: off).
    exposure: Option<exposure::Exposure>,
}

/// A node that goes away takes its lease with it: its read handles (clones may live on other
/// threads) refuse from then on, rather than serve until the last lease published runs out.
impl<S: Storage, C: Clock> Drop for LeaseNode<S, C> {
    fn drop(&mut self) {
        self.shared.revoke();
    }
}

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// Create a node. `tick_ms` is the real interval between calls to [`LeaseNode::tick`].
    ///
    /// Fails if the lease config does not validate against raft's election timeout, or raft refuses.
    pub fn new(
        raft_config: &Config,
        storage: S,
        config: LeaseConfig,
        tick_ms: u64,
        clock: C,
        logger: &Logger,
    ) -> Result<Self, NodeError> {
        let clock = Arc::new(clock);
        let slot = Slot::alone(clock.clone());
        LeaseNode::in_node(raft_config, storage, config, tick_ms, clock, slot, logger)
    }

    /// A node that reads `clock` (shared with the other groups of its node) and publishes for
    /// read handles in `slot` (a slot of its node's lease table).
    pub(crate) fn in_node(
        raft_config: &Config,
        storage: S,
        config: LeaseConfig,
        tick_ms: u64,
        clock: Arc<C>,
        slot: Slot<C>,
        logger: &Logger,
    ) -> Result<Self, NodeError> {
        assert!(
            Arc::ptr_eq(&clock, slot.clock()),
            "a group publishes in a slot of its table for the clock it reads"
        );
        let derived = config.validate(raft_config, tick_ms)?;
        let safeties = config.safeties;
        let mut rc = raft_config.clone();
        if safeties.raft_lease_based {
            rc.read_only_option = ReadOnlyOption::LeaseBased;
            rc.check_quorum = true;
        } else if rc.read_only_option != ReadOnlyOption::Safe {
            return Err(NodeError::UnsafeReadOption);
        }
        let logger = logger.new(slog::o!("raft_id" => rc.id));
        if !safeties.all_on() {
            warn!(logger, "UNSAFE lease safeties: stale reads are possible"; "safeties" => ?safeties);
        }
        let raw = RawNode::new(&rc, storage, &logger)?;
        let boot_ns = clock.now_ns();
        let promise = if safeties.boot_promise() {
            let boot_promise_ns = if safeties.count_carried_promise() {
                derived.boot_promise_ns
            } else {
                derived.promise_ns // the negative control: the previous run's promise forgotten
            };
            FollowerPromise::at_boot(derived.promise_ns, boot_promise_ns, boot_ns)
        } else {
            FollowerPromise::none(derived.promise_ns)
        };
        let jitter_seed = config.seed ^ rc.id.rotate_left(32) ^ boot_ns;
        let seen = (raw.raft.state, raw.raft.term);
        let (commit, last_index) = (raw.raft.raft_log.committed, raw.raft.raft_log.last_index());
        let mut node = LeaseNode {
            raw,
            clock,
            safeties,
            lease: LeaderLease::new(&derived),
            jitter: CampaignJitter::new(jitter_seed, derived.campaign_jitter_ns),
            held_until_ns: 0,
            fortified_to: None,
            derived,
            heartbeat_tick: rc.heartbeat_tick as u64,
            election_ticks: (rc.min_election_tick(), rc.max_election_tick()),
            promise,
            rounds: RoundTracker::new(safeties.testing.remap_retired_ctx),
            reads: ReadQueue::new(safeties.testing.reuse_read_ctx_on_retry),
            shared: Arc::new(Shared::new(slot)),
            logger,
            seen,
            lease_was_held: false,
            in_ready: false,
            removed_while_leading: false,
            timeout_now_term: 0,
            conf_version: 0,
            ticks_since_round: 0,
            raw_read_states: Vec::new(),
            exposure: derived.max_grant_ns.map(|_| {
                let x =
                    exposure::Exposure::new(&derived, boot_ns, rc.applied, (commit, last_index));
                x.with_controls(&safeties.testing)
            }),
        };
        node.reseed_election_timeout();
        node.sync();
        Ok(node)
    }

    // ----- accessors --------------------------------------------------------------------------

    /// A handle for lease reads from other threads.
    pub fn read_handle(&self) -> ReadHandle<C> {
        ReadHandle::new(self.shared.clone())
    }

    /// The lease as of now.
    pub fn lease_status(&self) -> LeaseStatus {
        let now_ns = self.clock.now_ns();
        let state = if self.safeties.raft_lease_based {
            LeaseState::Expired
        } else {
            self.lease.state(now_ns)
        };
        LeaseStatus {
            state,
            remaining_ns: if state.is_held() {
                self.lease.remaining_ns(now_ns)
            } else {
                0
            },
            term: self.lease.term(),
            fenced: self.lease.is_fenced(),
        }
    }

    /// Whether this node has promised, as of now, not to vote for or become any leader but
    /// `leader`. The lease of `leader` rests on a quorum of such promises; the simulator's lease
    /// monitor checks that they form one, and that none of them is broken. This is the promise
    /// made, whether or not a safety knob keeps the node from honouring it.
    pub fn promise_backs(&self, leader: u64) -> bool {
        self.fortified_to == Some(leader) || self.promise.backs(leader, self.clock.now_ns())
    }

    // ----- shared liveness (the multi-group driver's hooks) ---------------------------------

    /// Fortify this replica to `leader` (its node supports the leader's node), or release it
    /// (`None`: the support was withdrawn). While fortified it refuses every vote and pre-vote
    /// for another candidate, and its own campaign.
    pub fn set_fortified(&mut self, leader: Option<u64>) {
        self.fortified_to = leader;
    }

    /// The leader this replica is fortified to, if any.
    pub fn fortified_to(&self) -> Option<u64> {
        self.fortified_to
    }

    /// As leader, the lease may run to `until_ns`: a quorum of voters, itself included, is
    /// fortified to it and supported that long (see [`crate::liveness`]). Capped at `now + L`;
    /// ignored when not leading, fenced, or in another term than `term`.
    pub fn extend_lease_to(&mut self, term: u64, until_ns: u64) {
        let now_ns = self.clock.now_ns();
        self.extend_lease_to_at(term, until_ns, now_ns);
    }

    /// The instant the leader's lease may be used until, if it holds one in its term (it may
    /// have passed).
    pub(crate) fn lease_usable_until_ns(&self) -> Option<u64> {
        self.lease.usable_until_ns()
    }

    /// [`Self::extend_lease_to`] with the clock read at `now_ns` by the caller (a node of many
    /// groups extends thousands of leases with one reading).
    pub(crate) fn extend_lease_to_at(&mut self, term: u64, until_ns: u64, now_ns: u64) {
        let r = &self.raw.raft;
        if r.state != StateRole::Leader || r.term != term || until_ns == 0 {
            return;
        }
        let capped_ns = until_ns.min(now_ns.saturating_add(self.derived.lease_ns));
        if let Some(sent_at_ns) = capped_ns.checked_sub(self.derived.lease_ns) {
            // The leader counts itself in the quorum, so it keeps the promise too.
            let id = self.raw.raft.id;
            self.promise.on_leader_message(id, now_ns);
            self.on_quorum_ack_at(sent_at_ns, self.derived.lease_ns, now_ns);
            self.publish_at(now_ns);
        }
    }

    /// Make the election timer due: the next tick campaigns (after the campaign hold). For a
    /// replica whose fortification just ended, so that failover does not wait a full timeout.
    pub fn expire_election_timer(&mut self) {
        let r = &mut self.raw.raft;
        if r.state != StateRole::Leader {
            r.election_elapsed = r.randomized_election_timeout();
        }
    }

    /// As a follower, forget the leader: its support ended, so its term's lease has ended too.
    /// raft-rs ignores every vote request while a follower knows a leader it heard from within
    /// an election timeout, and a quiescent replica's timer stands still, so without this it
    /// would refuse the other survivors' campaigns for a full timeout.
    pub fn forget_leader(&mut self) {
        let r = &mut self.raw.raft;
        if r.state == StateRole::Follower {
            r.leader_id = raft::INVALID_ID;
        }
    }

    /// Whether a node that restarts refuses votes for `P` after boot.
    pub fn boots_with_promise(&self) -> bool {
        self.safeties.boot_promise()
    }

    /// A copy of the event counters.
    pub fn counters(&self) -> CounterSnapshot {
        CounterSnapshot {
            rounds_evicted: self.rounds.evicted(),
            ..self.shared.counter_snapshot()
        }
    }

    /// The wrapped `RawNode`, read-only.
    pub fn raw(&self) -> &RawNode<S> {
        &self.raw
    }

    /// The raft storage, for the driver to persist `Ready`s into.
    pub fn mut_store(&mut self) -> &mut S {
        self.raw.mut_store()
    }

    /// The lease's derived durations.
    pub fn derived(&self) -> &Derived {
        &self.derived
    }

    /// The clock the lease is measured on.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// This node's raft id.
    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this node knows of.
    pub fn leader_id(&self) -> Option<u64> {
        let id = self.raw.raft.leader_id;
        (id != raft::INVALID_ID).then_some(id)
    }

    /// Reads issued and not yet handed back by [`LeaseNode::serve_reads`].
    pub fn pending_reads(&self) -> usize {
        self.reads.len()
    }
}

/// Whether `cc` removes `id` or makes it a learner.
fn removes(cc: &raft::eraftpb::ConfChangeV2, id: u64) -> bool {
    use raft::eraftpb::ConfChangeType::{AddLearnerNode, RemoveNode};
    let leaves = |t| matches!(t, RemoveNode | AddLearnerNode);
    cc.get_changes()
        .iter()
        .any(|c| c.node_id == id && leaves(c.get_change_type()))
}

/// Why the lease was dropped.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// The node stopped leading, or its term changed.
    SteppedDown,
    /// The node leads a new term: no lease until a quorum acknowledges a round of it.
    NewTerm(u64),
    /// A membership change: no lease until the new configuration's quorum acknowledges.
    ConfigChanged,
    /// A leadership transfer is under way: fenced for the rest of the term.
    Transfer(&'static str),
}
