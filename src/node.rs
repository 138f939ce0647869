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
            reads: ReadQueue::default(),
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
        };
        node.reseed_election_timeout();
        node.sync();
        Ok(node)
    }

    // ----- raft traffic -------------------------------------------------------------------

    /// Advance raft's logical clock by one tick. The lease itself never counts ticks.
    ///
    /// A node whose promise still holds does not campaign either: its vote for itself is a vote.
    /// The tick that would start the election is held back until the promise ends.
    pub fn tick(&mut self) -> bool {
        if self.campaign_blocked() {
            self.sync();
            return false;
        }
        let more = self.raw.tick();
        self.ticks_since_round += 1;
        self.retry_dropped_round();
        self.renew_if_due();
        self.sync();
        more
    }

    /// Step a message from a peer. Votes under the promise are dropped; heartbeat
    /// acknowledgements extend the lease; a leader's message renews this node's promise.
    pub fn step(&mut self, mut m: Message) -> raft::Result<()> {
        match m.get_msg_type() {
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                if !self.vote_allowed(&m) =>
            {
                return Ok(());
            }
            MessageType::MsgHeartbeatResponse => self.on_heartbeat_response(&mut m),
            _ => {}
        }
        let from_leader = matches!(
            m.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
        );
        let (from, term) = (m.from, m.term);
        if m.get_msg_type() == MessageType::MsgSnapshot {
            self.conf_version += 1;
        }
        let result = self.raw.step(m);
        if from_leader && result.is_ok() {
            self.on_leader_message(from, term);
        }
        self.sync();
        result
    }

    /// Would this tick start an election while the promise (or the jitter after it) holds?
    fn campaign_blocked(&mut self) -> bool {
        let r = &self.raw.raft;
        let would_campaign = r.state != StateRole::Leader
            && r.promotable()
            && r.election_elapsed + 1 >= r.randomized_election_timeout();
        if !would_campaign || !self.safeties.campaign_hold() {
            return false;
        }
        if self.fortified_to.is_some_and(|leader| leader != r.id) {
            return true;
        }
        let (id, now_ns) = (r.id, self.clock.now_ns());
        let until_ns = self.promise.until_ns();
        if let VoteDecision::Refuse { .. } = self.promise.check_vote(id, now_ns) {
            debug_assert!(now_ns < until_ns);
            self.held_until_ns = until_ns;
            return true;
        }
        // Jitter only a campaign the promise held back: one whose timer fired after the promise
        // ended was not lined up with anyone's by the hold.
        let held_back = self.held_until_ns == until_ns && until_ns != 0;
        if !held_back || !self.safeties.campaign_jitter() || self.promise.holder() == Some(id) {
            return false;
        }
        now_ns < self.jitter.campaign_at_ns(until_ns)
    }

    fn vote_allowed(&mut self, m: &Message) -> bool {
        if !self.safeties.promise() {
            return true;
        }
        // A forced election after MsgTimeoutNow: the old leader fenced its lease before sending it.
        if m.get_context() == CAMPAIGN_TRANSFER {
            return true;
        }
        if self.fortified_to.is_some_and(|leader| leader != m.from) {
            Counters::bump(&self.shared.counters.refused_votes);
            return false;
        }
        match self.promise.check_vote(m.from, self.clock.now_ns()) {
            VoteDecision::Allow => true,
            VoteDecision::Refuse {
                remaining_ns,
                holder,
            } => {
                Counters::bump(&self.shared.counters.refused_votes);
                debug!(self.logger, "refused vote under promise";
                    "candidate" => m.from, "msg" => ?m.get_msg_type(),
                    "remaining_ns" => remaining_ns, "holder" => ?holder);
                false
            }
        }
    }

    /// The clock is read after raft processed the message, never before.
    fn on_leader_message(&mut self, from: u64, term: u64) {
        let r = &self.raw.raft;
        if r.state == StateRole::Follower && r.leader_id == from && r.term == term {
            self.promise.on_leader_message(from, self.clock.now_ns());
        }
    }

    /// An acknowledgement counts only for the round of the copy it acknowledges, and only for
    /// the promise its sender says it made on receipt (never this leader's own settings).
    fn on_heartbeat_response(&mut self, m: &mut Message) {
        let Some((ctx, promised)) = LayerCtx::parse_ack(m.get_context()) else {
            return;
        };
        match ctx {
            LayerCtx::Round(_) => drop(m.take_context()), // our tag: raft never sees it
            LayerCtx::Read(_) => m.context = ctx.encode().into(), // what raft's read_index sent
        }
        let r = &self.raw.raft;
        if r.state != StateRole::Leader || m.term != r.term {
            return;
        }
        let credit_ns = match promised {
            _ if !self.safeties.count_carried_promise() => self.derived.lease_ns,
            Some(p) => self
                .derived
                .lease_for_promise_ns(p.promise_ns, u64::from(p.drift_ppm)),
            None => 0, // a node that says nothing of its promise backs no lease
        };
        let prs = r.prs();
        if let Some(q) = self
            .rounds
            .on_ack(ctx, m.from, credit_ns, |acked| prs.has_quorum(acked))
        {
            self.on_quorum_ack(q.sent_at_ns, q.lease_ns);
        }
    }

    /// A quorum, this node included, acknowledged messages sent at or after `sent_at_ns`, and
    /// their promises back `lease_ns` past it.
    fn on_quorum_ack(&mut self, sent_at_ns: u64, lease_ns: u64) {
        let now_ns = self.clock.now_ns();
        assert!(
            sent_at_ns <= now_ns,
            "a round acknowledged before it was sent: t0 {sent_at_ns} ns, now {now_ns} ns"
        );
        let term = self.raw.raft.term;
        if self.lease.on_quorum_ack(term, sent_at_ns, lease_ns) == AckOutcome::Extended {
            Counters::bump(&self.shared.counters.renewals);
            debug_assert!(self.lease.term() == Some(self.raw.raft.term));
        }
    }

    /// Is there work for the driver? (Same as `RawNode::has_ready`.)
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Take raft's `Ready`. The node consumes its `read_states`; handle the rest as with `RawNode`.
    pub fn ready(&mut self) -> Ready {
        self.issue_index_round(); // reads started since the last round share this one
        let mut rd = self.raw.ready();
        for rs in rd.take_read_states() {
            if let Some(LayerCtx::Read(_)) = LayerCtx::parse(&rs.request_ctx) {
                if !self.reads.round_answered(&rs.request_ctx, rs.index) {
                    debug!(self.logger, "read state for a round no longer waited for"; "index" => rs.index);
                }
            } else {
                self.raw_read_states.push(rs);
            }
        }
        self.note_timeout_now(rd.messages());
        self.note_timeout_now(rd.persisted_messages());
        self.in_ready = true;
        self.sync();
        rd
    }

    /// Take `Ready::messages()`, stamped. Call just before handing them to the transport.
    pub fn take_messages(&mut self, rd: &mut Ready) -> Vec<Message> {
        let msgs = rd.take_messages();
        self.stamp(msgs)
    }

    /// Take `Ready::persisted_messages()`, stamped. Send them after persisting the `Ready`.
    pub fn take_persisted_messages(&mut self, rd: &mut Ready) -> Vec<Message> {
        let msgs = rd.take_persisted_messages();
        self.stamp(msgs)
    }

    /// Take `LightReady::messages()`, stamped.
    pub fn take_light_messages(&mut self, light: &mut LightReady) -> Vec<Message> {
        let msgs = light.take_messages();
        self.stamp(msgs)
    }

    /// Tag heartbeat rounds and read their `t0` now, before the transport sends them.
    fn stamp(&mut self, mut msgs: Vec<Message>) -> Vec<Message> {
        if self.raw.raft.state != StateRole::Leader {
            self.stamp_acks(&mut msgs);
            return msgs;
        }
        let (id, term, now_ns) = (self.raw.raft.id, self.raw.raft.term, self.clock.now_ns());
        let mut tag = None;
        let mut sent_round = false;
        for m in msgs.iter_mut() {
            match m.get_msg_type() {
                MessageType::MsgHeartbeat if m.term == term => {
                    sent_round = true;
                    self.stamp_heartbeat(m, &mut tag, now_ns);
                }
                MessageType::MsgTimeoutNow => {
                    // Recorded and fenced when raft handed it out (`note_timeout_now`).
                    debug_assert_eq!(self.timeout_now_term, term, "MsgTimeoutNow not noted");
                    debug_assert!(
                        self.lease.is_fenced() || !self.safeties.transfer_fence(),
                        "MsgTimeoutNow leaving an unfenced lease"
                    );
                }
                _ => {}
            }
        }
        if sent_round {
            // The leader counts itself in the majority, so it keeps the promise too.
            self.promise.on_leader_message(id, now_ns);
            self.ticks_since_round = 0;
        }
        self.rounds
            .prune_before(now_ns.saturating_sub(self.derived.lease_ns));
        msgs
    }

    /// Each heartbeat acknowledgement says what this node promised on receipt: its own `P`,
    /// and the drift bound it assumes. The leader counts that, not its own settings.
    fn stamp_acks(&self, msgs: &mut [Message]) {
        let promised = Promised {
            promise_ns: self.derived.promise_ns,
            drift_ppm: u32::try_from(self.derived.drift_ppm).expect("ρ validated ≤ 10%"),
        };
        for m in msgs
            .iter_mut()
            .filter(|m| m.get_msg_type() == MessageType::MsgHeartbeatResponse)
        {
            if let Some(ctx) = LayerCtx::parse(m.get_context()) {
                m.context = ctx.encode_ack(promised).into();
            }
        }
    }

    /// One round tag for every heartbeat raft left without a context; a ReadIndex context
    /// names its own round, which keeps its first send time.
    fn stamp_heartbeat(&mut self, m: &mut Message, tag: &mut Option<LayerCtx>, now_ns: u64) {
        let id = self.raw.raft.id;
        if m.get_context().is_empty() {
            let me = (id, self.derived.lease_ns);
            let t = *tag.get_or_insert_with(|| self.rounds.start_tagged(me, now_ns));
            m.context = t.encode().into();
        } else if let Some(ctx @ LayerCtx::Read(_)) = LayerCtx::parse(m.get_context()) {
            self.rounds
                .on_read_ctx_sent(ctx, (id, self.derived.lease_ns), now_ns);
        }
    }

    /// Like `RawNode::advance`: apply the `Ready`'s committed entries first.
    pub fn advance(&mut self, rd: Ready) -> LightReady {
        let light = self.raw.advance(rd);
        self.note_timeout_now(light.messages());
        self.after_advance();
        light
    }

    /// Like `RawNode::advance_append`.
    pub fn advance_append(&mut self, rd: Ready) -> LightReady {
        let light = self.raw.advance_append(rd);
        self.note_timeout_now(light.messages());
        self.after_advance();
        light
    }

    /// raft handed out `MsgTimeoutNow` (in a `Ready` or `LightReady`): record it and fence now,
    /// when raft produces it, so that a caller who takes the messages without [`Self::take_messages`]
    /// still cannot have the fence lifted while it is in flight.
    fn note_timeout_now(&mut self, msgs: &[Message]) {
        let leading = self.raw.raft.state == StateRole::Leader;
        if leading
            && msgs
                .iter()
                .any(|m| m.get_msg_type() == MessageType::MsgTimeoutNow)
        {
            self.timeout_now_term = self.raw.raft.term;
            self.fence_for_transfer("raft produced MsgTimeoutNow");
        }
    }

    /// Like `RawNode::advance_apply`: call after applying the `LightReady`'s committed entries.
    pub fn advance_apply(&mut self) {
        self.raw.advance_apply();
        self.sync();
    }

    /// Like `RawNode::advance_apply_to`.
    pub fn advance_apply_to(&mut self, applied: u64) {
        self.raw.advance_apply_to(applied);
        self.sync();
    }

    fn after_advance(&mut self) {
        self.in_ready = false;
        self.step_down_if_removed();
        self.sync();
    }

    /// raft gave up a transfer (its transferee did not take over within an election timeout),
    /// leaving this leader fenced for the rest of a term that may never end. If `MsgTimeoutNow`
    /// never left (nor waits to), nothing can force an election: lift the fence. If it left, a
    /// late copy can still force one in the next term, so no lease is safe in this term: step
    /// down (never inside a `Ready`), and let a new term be elected, where a lease can be had.
    fn end_abandoned_transfer(&mut self) {
        let r = &self.raw.raft;
        let abandoned = r.state == StateRole::Leader
            && r.lead_transferee.is_none()
            && self.seen == (StateRole::Leader, r.term)
            && self.lease.is_fenced();
        if !abandoned || self.in_ready {
            return;
        }
        let term = r.term;
        let queued = r
            .msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgTimeoutNow);
        let left = self.timeout_now_term == term || queued;
        if !left {
            self.lease.lift_transfer_fence();
            debug_assert!(!self.lease.is_fenced() && self.lease.usable_until_ns().is_none());
            info!(self.logger, "transfer given up before MsgTimeoutNow left: fence lifted"; "term" => term);
        } else if self.safeties.abandoned_transfer_steps_down() {
            self.raw.raft.become_follower(term, raft::INVALID_ID);
            info!(self.logger, "transfer given up after MsgTimeoutNow left: stepped down"; "term" => term);
        } else {
            self.lease.lift_transfer_fence(); // the negative control
        }
    }

    /// A leader that applied its own removal steps down, but never between `ready()` and
    /// `advance()`: raft-rs aborts if a non-leader has messages waiting in the `LightReady`.
    fn step_down_if_removed(&mut self) {
        if !self.removed_while_leading || self.in_ready {
            return;
        }
        self.removed_while_leading = false;
        if self.raw.raft.state == StateRole::Leader {
            let term = self.raw.raft.term;
            self.raw.raft.become_follower(term, raft::INVALID_ID);
            info!(
                self.logger,
                "removed from the configuration while leading: stepped down"
            );
        }
    }

    // ----- proposals and leadership ---------------------------------------------------------

    /// Propose a normal entry.
    pub fn propose(&mut self, context: Vec<u8>, data: Vec<u8>) -> raft::Result<()> {
        let r = self.raw.propose(context, data);
        self.sync();
        r
    }

    /// Propose a membership change.
    ///
    /// A leader may not remove or demote itself (`ConfChangeError`): transfer leadership first,
    /// as TiKV and etcd do. raft-rs 0.7 keeps a removed leader leading, drops its proposals and
    /// panics when its commit index moves; and the voters left may not yet know they are voters,
    /// with nobody left to tell them.
    pub fn propose_conf_change(
        &mut self,
        context: Vec<u8>,
        cc: impl ConfChangeI,
    ) -> raft::Result<()> {
        let id = self.raw.raft.id;
        if self.is_leader() && self.safeties.guard_leader_removal() && removes(&cc.as_v2(), id) {
            return Err(raft::Error::ConfChangeError(format!(
                "leader {id} cannot remove or demote itself: transfer leadership first"
            )));
        }
        let r = self.raw.propose_conf_change(context, cc);
        self.sync();
        r
    }

    /// Apply a committed membership change. A leader drops its lease and re-establishes it
    /// under the new configuration's quorum (both quorums for a joint configuration).
    ///
    /// A leader that is no longer a voter steps down. raft-rs 0.7 would keep it leading: it
    /// drops proposals, and panics when the commit index moves on (`maybe_commit` unwraps the
    /// leader's own progress, which the change removed).
    pub fn apply_conf_change(&mut self, cc: &impl ConfChangeI) -> raft::Result<ConfState> {
        self.conf_version += 1;
        let cs = self.raw.apply_conf_change(cc)?;
        if self.raw.raft.state == StateRole::Leader {
            self.lose_lease(Loss::ConfigChanged);
            info!(self.logger, "membership changed: lease dropped until the new quorum acks";
                "voters" => ?cs.voters, "voters_outgoing" => ?cs.voters_outgoing);
            let id = self.raw.raft.id;
            if !self.raw.raft.prs().conf().voters().contains(id)
                && self.safeties.guard_leader_removal()
            {
                self.removed_while_leading = true;
                self.step_down_if_removed();
            }
        }
        self.sync();
        Ok(cs)
    }

    /// A counter that changes whenever raft's configuration may have changed (a conf change
    /// applied, a snapshot stepped): cache what you derive from the configuration against it.
    pub fn conf_version(&self) -> u64 {
        self.conf_version
    }

    /// Tell raft whether a snapshot sent to `to` arrived (like `RawNode::report_snapshot`). A
    /// transport that drops a `MsgSnapshot` must report `Failure`, or raft keeps waiting for it
    /// and never sends that peer anything but heartbeats again.
    pub fn report_snapshot(&mut self, to: u64, status: raft::SnapshotStatus) {
        self.raw.report_snapshot(to, status);
        self.sync();
    }

    /// Tell raft that the last message to `to` could not be delivered (like
    /// `RawNode::report_unreachable`).
    pub fn report_unreachable(&mut self, to: u64) {
        self.raw.report_unreachable(to);
        self.sync();
    }

    /// Start an election now.
    ///
    /// Refused while this node's promise holds: its vote for itself would break the promise.
    pub fn campaign(&mut self) -> Result<(), CampaignError> {
        if self.safeties.campaign_hold() {
            let decision = self
                .promise
                .check_vote(self.raw.raft.id, self.clock.now_ns());
            if let VoteDecision::Refuse { remaining_ns, .. } = decision {
                return Err(CampaignError::PromiseHolds { remaining_ns });
            }
        }
        let r = self.raw.campaign();
        self.sync();
        Ok(r?)
    }

    /// Transfer leadership. Once raft acts on it (sets its transferee, or sends
    /// `MsgTimeoutNow`), the lease is fenced for the rest of this term, before `MsgTimeoutNow`
    /// can leave; reads fall back to ReadIndex until the next term. A transfer raft ignores (to
    /// itself, to a learner) costs nothing. If raft gives the transfer up (its transferee did
    /// not take over within an election timeout), the fence is lifted when `MsgTimeoutNow`
    /// never left, and otherwise this leader steps down so that a later term can lease again.
    pub fn transfer_leader(&mut self, transferee: u64) {
        self.raw.transfer_leader(transferee);
        self.sync();
    }

    fn fence_for_transfer(&mut self, why: &'static str) {
        let leading = self.raw.raft.state == StateRole::Leader;
        if !leading || self.lease.is_fenced() || !self.safeties.transfer_fence() {
            return;
        }
        self.lose_lease(Loss::Transfer(why));
        debug_assert!(self.lease.is_fenced() && self.lease.usable_until_ns().is_none());
    }

    /// Drop the lease, retire every round in flight, and revoke it for read handles.
    fn lose_lease(&mut self, why: Loss) {
        match why {
            Loss::SteppedDown => self.lease.lose(),
            Loss::NewTerm(term) => self.lease.start_term(term),
            Loss::ConfigChanged => self.lease.reset_for_config_change(),
            Loss::Transfer(reason) => {
                self.lease.fence_for_transfer();
                info!(self.logger, "lease fenced for the rest of the term"; "reason" => reason);
            }
        }
        self.rounds.clear();
        self.shared.revoke();
        debug_assert!(self.lease.usable_until_ns().is_none());
        info!(self.logger, "lease dropped"; "why" => ?why, "term" => self.raw.raft.term);
    }

    // ----- reads ------------------------------------------------------------------------------

    /// Start a read. Returns its id; the outcome comes back from [`LeaseNode::serve_reads`].
    ///
    /// A ReadIndex read's round goes out at the next [`LeaseNode::handle_ready`] (or `ready`,
    /// `serve_reads`, `tick`): every read started in between shares one round.
    ///
    /// Fails at once with [`ReadError::NotLeader`] on a non-leader, and with
    /// [`ReadError::LeaseNotHeld`] for a strict [`ReadMode::Lease`] read when no lease is held.
    pub fn read(&mut self, mode: ReadMode) -> Result<ReadId, ReadError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(self.not_leader());
        }
        let counters = &self.shared.counters;
        let id = match mode {
            _ if self.safeties.raft_lease_based && mode != ReadMode::ReadIndex => {
                self.reads.start_index()
            }
            ReadMode::Lease | ReadMode::Auto if self.lease_held_now() => {
                let commit = self.raw.raft.raft_log.committed;
                self.reads.start_lease(commit, mode)
            }
            ReadMode::Lease => {
                Counters::bump(&counters.lease_refusals);
                return Err(ReadError::LeaseNotHeld);
            }
            ReadMode::Auto => {
                Counters::bump(&counters.fallbacks);
                self.reads.start_index()
            }
            ReadMode::ReadIndex => self.reads.start_index(),
        };
        // The round goes out at the next `handle_ready` (or `serve_reads`, or tick), so that
        // every read started meanwhile shares it.
        Ok(id)
    }

    /// raft-rs's own `read_index`, one round per call, bypassing the layer's batching and lease
    /// (for comparisons). `ctx` must not start with [`crate::ctx::RESERVED_PREFIX`]. The answer comes back
    /// from [`LeaseNode::take_raw_read_states`]; raft-rs may drop it silently.
    pub fn raw_read_index(&mut self, ctx: Vec<u8>) -> Result<(), ReservedContext> {
        if LayerCtx::is_reserved(&ctx) {
            return Err(ReservedContext);
        }
        self.raw.read_index(ctx);
        Ok(())
    }

    /// Answers to [`LeaseNode::raw_read_index`] so far.
    pub fn take_raw_read_states(&mut self) -> Vec<raft::ReadState> {
        std::mem::take(&mut self.raw_read_states)
    }

    /// Hand back every read that finished. For each read whose index is applied, `read_state`
    /// reads the caller's state *first*; a lease read is then validated against the clock.
    /// An `Auto` read whose lease was lost meanwhile goes back to wait for ReadIndex.
    pub fn serve_reads<T>(&mut self, read_state: impl FnMut(ReadId) -> T) -> Vec<ServedRead<T>> {
        let applied = self.raw.raft.raft_log.applied;
        let index_kind = match self.safeties.raft_lease_based {
            true => ReadKind::Lease,
            false => ReadKind::Index,
        };
        let held_until_ns =
            match self.raw.raft.state == StateRole::Leader && !self.safeties.raft_lease_based {
                true => self.lease.usable_until_ns(),
                false => None,
            };
        let clock = &self.clock;
        let lease_held = || held_until_ns.is_some_and(|until_ns| clock.now_ns() < until_ns);
        let served = self
            .reads
            .serve(applied, index_kind, lease_held, read_state);
        self.count_served(&served);
        self.issue_index_round();
        served.reads
    }

    fn count_served<T>(&self, served: &crate::read::Served<T>) {
        let c = &self.shared.counters;
        c.fallbacks
            .fetch_add(served.fallbacks, std::sync::atomic::Ordering::Relaxed);
        for r in &served.reads {
            match r.result {
                Ok((_, ReadKind::Lease)) => Counters::bump(&c.lease_reads),
                Ok((_, ReadKind::Index)) => Counters::bump(&c.index_reads),
                Err(ReadError::LeaseNotHeld) => Counters::bump(&c.lease_refusals),
                Err(_) => {}
            }
        }
    }

    fn lease_held_now(&self) -> bool {
        self.lease_held_at(self.clock.now_ns())
    }

    fn lease_held_at(&self, now_ns: u64) -> bool {
        self.raw.raft.state == StateRole::Leader
            && self.lease.state(now_ns).is_held()
            && !self.safeties.raft_lease_based
    }

    fn not_leader(&self) -> ReadError {
        let hint = self.raw.raft.leader_id;
        ReadError::NotLeader {
            leader_hint: (hint != raft::INVALID_ID).then_some(hint),
        }
    }

    /// Send waiting ReadIndex reads as one `read_index` round (the queue caps rounds in flight),
    /// once the leader has committed in its term (raft-rs 0.7 silently drops a `read_index`
    /// before that).
    pub(crate) fn issue_index_round(&mut self) {
        let r = &self.raw.raft;
        if self.in_ready || r.state != StateRole::Leader || !r.commit_to_current_term() {
            return;
        }
        if let Some(ctx) = self.reads.next_round() {
            Counters::bump(&self.shared.counters.index_rounds);
            self.raw.read_index(ctx);
        }
    }

    /// A round that got no answer within two heartbeat intervals is re-sent with a new context.
    fn retry_dropped_round(&mut self) {
        if self.reads.tick(2 * self.heartbeat_tick.max(1)) {
            debug!(self.logger, "read_index round unanswered; retrying"; "reads" => self.reads.len());
        }
        self.issue_index_round();
    }

    /// Renewal normally rides on raft's heartbeats. Only a lease already past its renew point,
    /// with no round sent for a heartbeat interval, asks raft for an early heartbeat.
    fn renew_if_due(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        if self.own_ack_is_a_quorum() {
            // The only voter: no other leader can arise without a membership change, which
            // drops the lease. Its own acknowledgement, now, is the quorum, and it keeps its
            // promise to itself for it.
            let (id, now_ns) = (self.raw.raft.id, self.clock.now_ns());
            self.promise.on_leader_message(id, now_ns);
            self.on_quorum_ack(now_ns, self.derived.lease_ns);
            return;
        }
        let suspect = self.lease.state(self.clock.now_ns()) == LeaseState::Suspect;
        if suspect && self.ticks_since_round >= self.heartbeat_tick.max(1) && !self.in_ready {
            self.raw.ping();
        }
    }

    /// Whether this node alone is a quorum: it is the one voter of every half of the
    /// configuration. raft-rs keeps a leader that removed itself leading, and a configuration of
    /// one voter is not "I am that voter".
    fn own_ack_is_a_quorum(&self) -> bool {
        let prs = self.raw.raft.prs();
        if !self.safeties.self_renewal_needs_sole_voter() {
            return prs.is_singleton(); // the negative control: any single voter
        }
        let mut me = fxhash::FxHashSet::default();
        me.insert(self.raw.raft.id);
        prs.has_quorum(&me)
    }

    // ----- role tracking and publishing ------------------------------------------------------

    /// Notice role and term changes, a transfer under way, the first commit of a term, and
    /// publish for read handles.
    fn sync(&mut self) {
        self.end_abandoned_transfer();
        let (role, term) = (self.raw.raft.state, self.raw.raft.term);
        if (role, term) != self.seen {
            if self.seen.0 == StateRole::Leader {
                self.lose_lease(Loss::SteppedDown);
                let err = self.not_leader();
                self.reads.fail_all(&err);
            }
            if role == StateRole::Leader {
                self.lose_lease(Loss::NewTerm(term));
            }
            self.seen = (role, term);
            self.reseed_election_timeout();
        }
        if role == StateRole::Leader {
            if self.raw.raft.lead_transferee.is_some() {
                self.fence_for_transfer("raft started a leadership transfer");
            }
            if self.raw.raft.commit_to_current_term() {
                self.lease.on_commit_in_term(term);
                self.issue_index_round();
            }
        }
        self.publish();
    }

    /// raft-rs re-draws its election timeout from an unseeded generator at every role or term
    /// change; overwrite the draw with a seeded one before the next tick can use it.
    fn reseed_election_timeout(&mut self) {
        let (min, max) = self.election_ticks;
        if max > min + 1 {
            let ticks = self.jitter.election_timeout_ticks(min, max);
            self.raw.raft.set_randomized_election_timeout(ticks);
        }
    }

    fn publish(&mut self) {
        let now_ns = self.clock.now_ns();
        let held = self.lease_held_at(now_ns);
        let until_ns = match self.lease.usable_until_ns() {
            Some(until_ns) if held => until_ns,
            _ => 0,
        };
        assert!(
            until_ns <= now_ns.saturating_add(self.derived.lease_ns),
            "lease published to {until_ns} ns, past now {now_ns} ns + L"
        );
        assert!(
            until_ns == 0 || until_ns > now_ns,
            "an expired lease published as held"
        );
        let log = &self.raw.raft.raft_log;
        self.shared.publish(log.committed, log.applied, until_ns);
        if self.lease_was_held && !held {
            Counters::bump(&self.shared.counters.expirations);
            debug!(self.logger, "lease no longer held"; "now_ns" => now_ns);
        }
        self.lease_was_held = held;
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
        let r = &self.raw.raft;
        if r.state != StateRole::Leader || r.term != term || until_ns == 0 {
            return;
        }
        let now_ns = self.clock.now_ns();
        let capped_ns = until_ns.min(now_ns.saturating_add(self.derived.lease_ns));
        if let Some(sent_at_ns) = capped_ns.checked_sub(self.derived.lease_ns) {
            // The leader counts itself in the quorum, so it keeps the promise too.
            let id = self.raw.raft.id;
            self.promise.on_leader_message(id, now_ns);
            self.on_quorum_ack(sent_at_ns, self.derived.lease_ns);
            self.publish();
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
