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
use crate::config::{ConfigError, Derived, LeaseConfig, UnsafeMode};
use crate::handle::{ReadHandle, Shared};
use crate::lease::{AckOutcome, LeaderLease, LeaseState};
use crate::promise::{FollowerPromise, VoteDecision};
use crate::read::{LeaseRead, ReadError, ReadId, ReadKind, ReadMode, ReadQueue, ServedRead};
use crate::round::{parse_round_tag, round_tag, RoundTracker, READ_CTX_PREFIX};
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
pub struct LeaseNode<S: Storage, C: Clock> {
    raw: RawNode<S>,
    clock: Arc<C>,
    config: LeaseConfig,
    derived: Derived,
    heartbeat_tick: u64,
    lease: LeaderLease,
    promise: FollowerPromise,
    rounds: RoundTracker,
    reads: ReadQueue,
    shared: Arc<Shared>,
    logger: Logger,
    /// Role and term last seen; a change loses the lease and fails queued reads.
    seen: (StateRole, u64),
    /// Whether the lease was held at the last publish, to count expirations.
    lease_was_held: bool,
    /// Between `ready()` and `advance*()`: raft must not be stepped, so no read round is issued.
    in_ready: bool,
    /// Ticks since this leader last sent a round of heartbeats.
    ticks_since_round: u64,
    /// Answers to [`LeaseNode::raw_read_index`] calls, for the caller to take.
    raw_read_states: Vec<raft::ReadState>,
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
        let derived = config.validate(raft_config.min_election_tick() as u64, tick_ms)?;
        let mut rc = raft_config.clone();
        if config.unsafe_mode == UnsafeMode::RaftLeaseBased {
            rc.read_only_option = ReadOnlyOption::LeaseBased;
            rc.check_quorum = true;
        } else if rc.read_only_option != ReadOnlyOption::Safe {
            return Err(NodeError::UnsafeReadOption);
        }
        let logger = logger.new(slog::o!("raft_id" => rc.id));
        if config.unsafe_mode != UnsafeMode::Safe {
            warn!(logger, "UNSAFE lease mode: stale reads are possible"; "mode" => ?config.unsafe_mode);
        }
        let raw = RawNode::new(&rc, storage, &logger)?;
        let boot_ns = clock.now_ns();
        let promise = match config.unsafe_mode {
            UnsafeMode::Safe | UnsafeMode::NoTransferFence | UnsafeMode::NoCampaignHold => {
                FollowerPromise::at_boot(derived.promise_ns, boot_ns)
            }
            _ => FollowerPromise::none(derived.promise_ns),
        };
        let seen = (raw.raft.state, raw.raft.term);
        let mut node = LeaseNode {
            raw,
            clock: Arc::new(clock),
            config,
            lease: LeaderLease::new(&derived),
            derived,
            heartbeat_tick: rc.heartbeat_tick as u64,
            promise,
            rounds: RoundTracker::default(),
            reads: ReadQueue::default(),
            shared: Arc::new(Shared::default()),
            logger,
            seen,
            lease_was_held: false,
            in_ready: false,
            ticks_since_round: 0,
            raw_read_states: Vec::new(),
        };
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
            MessageType::MsgTransferLeader => self.fence_for_transfer("transfer requested by peer"),
            _ => {}
        }
        let from_leader = matches!(
            m.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
        );
        let (from, term) = (m.from, m.term);
        let result = self.raw.step(m);
        if from_leader && result.is_ok() {
            self.on_leader_message(from, term);
        }
        self.sync();
        result
    }

    /// Would this tick start an election while the promise forbids this node's own vote?
    fn campaign_blocked(&mut self) -> bool {
        let r = &self.raw.raft;
        let would_campaign = r.state != StateRole::Leader
            && r.promotable()
            && r.election_elapsed + 1 >= r.randomized_election_timeout();
        if !would_campaign || !self.campaign_hold_enforced() {
            return false;
        }
        let decision = self.promise.check_vote(r.id, self.clock.now_ns());
        debug_assert!(matches!(decision, VoteDecision::Allow) || self.promise.until_ns() > 0);
        matches!(decision, VoteDecision::Refuse { .. })
    }

    fn campaign_hold_enforced(&self) -> bool {
        self.promise_enforced() && self.config.unsafe_mode != UnsafeMode::NoCampaignHold
    }

    fn promise_enforced(&self) -> bool {
        !matches!(
            self.config.unsafe_mode,
            UnsafeMode::NoPromise | UnsafeMode::RaftLeaseBased
        )
    }

    fn vote_allowed(&mut self, m: &Message) -> bool {
        if matches!(
            self.config.unsafe_mode,
            UnsafeMode::NoPromise | UnsafeMode::RaftLeaseBased
        ) {
            return true;
        }
        // A forced election after MsgTimeoutNow: the old leader fenced its lease before sending it.
        if m.get_context() == CAMPAIGN_TRANSFER {
            return true;
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

    fn on_heartbeat_response(&mut self, m: &mut Message) {
        let round = self.rounds.round_of_ctx(m.get_context());
        if parse_round_tag(m.get_context()).is_some() {
            m.take_context(); // our tag: raft never sees it
        }
        let r = &self.raw.raft;
        let (Some(round), true) = (round, r.state == StateRole::Leader && m.term == r.term) else {
            return;
        };
        let prs = r.prs();
        if let Some(sent_at_ns) = self
            .rounds
            .on_ack(round, m.from, |acked| prs.has_quorum(acked))
        {
            let term = self.raw.raft.term;
            if self.lease.on_quorum_ack(term, sent_at_ns) == AckOutcome::Extended {
                Counters::bump(&self.shared.counters.renewals);
            }
        }
    }

    /// Is there work for the driver? (Same as `RawNode::has_ready`.)
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Take raft's `Ready`. The node consumes its `read_states`; handle the rest as with `RawNode`.
    pub fn ready(&mut self) -> Ready {
        let mut rd = self.raw.ready();
        for rs in rd.take_read_states() {
            if rs.request_ctx.starts_with(READ_CTX_PREFIX) {
                if !self.reads.complete_batch(&rs.request_ctx, rs.index) {
                    debug!(self.logger, "read state for a round no longer waited for"; "index" => rs.index);
                }
            } else {
                self.raw_read_states.push(rs);
            }
        }
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
            return msgs;
        }
        let (id, term, now_ns) = (self.raw.raft.id, self.raw.raft.term, self.clock.now_ns());
        let mut round = None;
        let mut sent_round = false;
        for m in msgs.iter_mut() {
            match m.get_msg_type() {
                MessageType::MsgHeartbeat if m.term == term => {
                    sent_round = true;
                    if m.get_context().is_empty() {
                        let r = *round.get_or_insert_with(|| self.rounds.start(id, now_ns));
                        m.context = round_tag(r).into();
                    } else if m.get_context().starts_with(READ_CTX_PREFIX) {
                        self.rounds.round_for_read_ctx(m.get_context(), id, now_ns);
                    }
                }
                MessageType::MsgTimeoutNow => self.fence_for_transfer("MsgTimeoutNow is leaving"),
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

    /// Like `RawNode::advance`: apply the `Ready`'s committed entries first.
    pub fn advance(&mut self, rd: Ready) -> LightReady {
        let light = self.raw.advance(rd);
        self.after_advance();
        light
    }

    /// Like `RawNode::advance_append`.
    pub fn advance_append(&mut self, rd: Ready) -> LightReady {
        let light = self.raw.advance_append(rd);
        self.after_advance();
        light
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
        self.sync();
    }

    // ----- proposals and leadership ---------------------------------------------------------

    /// Propose a normal entry.
    pub fn propose(&mut self, context: Vec<u8>, data: Vec<u8>) -> raft::Result<()> {
        let r = self.raw.propose(context, data);
        self.sync();
        r
    }

    /// Propose a membership change.
    pub fn propose_conf_change(
        &mut self,
        context: Vec<u8>,
        cc: impl ConfChangeI,
    ) -> raft::Result<()> {
        let r = self.raw.propose_conf_change(context, cc);
        self.sync();
        r
    }

    /// Apply a committed membership change. A leader drops its lease and re-establishes it
    /// under the new configuration's quorum (both quorums for a joint configuration).
    pub fn apply_conf_change(&mut self, cc: &impl ConfChangeI) -> raft::Result<ConfState> {
        let cs = self.raw.apply_conf_change(cc)?;
        if self.raw.raft.state == StateRole::Leader {
            self.lease.reset_for_config_change();
            self.rounds.clear();
            self.shared.revoke();
            info!(self.logger, "membership changed: lease dropped until the new quorum acks";
                "voters" => ?cs.voters, "voters_outgoing" => ?cs.voters_outgoing);
        }
        self.sync();
        Ok(cs)
    }

    /// Start an election now.
    ///
    /// Refused while this node's promise holds: its vote for itself would break the promise.
    pub fn campaign(&mut self) -> Result<(), CampaignError> {
        if self.campaign_hold_enforced() {
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

    /// Transfer leadership. The lease is revoked for the rest of this term *before* raft can
    /// send `MsgTimeoutNow`; reads fall back to ReadIndex until the next term.
    pub fn transfer_leader(&mut self, transferee: u64) {
        self.fence_for_transfer("transfer_leader called");
        self.raw.transfer_leader(transferee);
        self.sync();
    }

    fn fence_for_transfer(&mut self, why: &str) {
        let leading = self.raw.raft.state == StateRole::Leader;
        if !leading
            || self.lease.is_fenced()
            || self.config.unsafe_mode == UnsafeMode::NoTransferFence
        {
            return;
        }
        self.lease.fence_for_transfer();
        self.shared.revoke();
        info!(self.logger, "lease fenced for the rest of the term"; "why" => why, "term" => self.raw.raft.term);
        debug_assert!(self.lease.usable_until_ns().is_none());
    }

    // ----- reads ------------------------------------------------------------------------------

    /// Start a read. Returns its id; the outcome comes back from [`LeaseNode::serve_reads`].
    ///
    /// Fails at once with [`ReadError::NotLeader`] on a non-leader, and with
    /// [`ReadError::LeaseNotHeld`] for a strict [`ReadMode::Lease`] read when no lease is held.
    pub fn read(&mut self, mode: ReadMode) -> Result<ReadId, ReadError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(self.not_leader());
        }
        let id = self.reads.next_id();
        let raft_lease_based = self.config.unsafe_mode == UnsafeMode::RaftLeaseBased;
        let counters = &self.shared.counters;
        match mode {
            _ if raft_lease_based && mode != ReadMode::ReadIndex => {
                self.reads.index_waiting.push(id)
            }
            ReadMode::Lease | ReadMode::Auto if self.lease_held_now() => {
                let index = self.raw.raft.raft_log.committed;
                self.reads.lease.push_back(LeaseRead { id, index, mode });
            }
            ReadMode::Lease => {
                Counters::bump(&counters.lease_refusals);
                return Err(ReadError::LeaseNotHeld);
            }
            ReadMode::Auto => {
                Counters::bump(&counters.fallbacks);
                self.reads.index_waiting.push(id);
            }
            ReadMode::ReadIndex => self.reads.index_waiting.push(id),
        }
        self.issue_index_round();
        Ok(id)
    }

    /// raft-rs's own `read_index`, one round per call, bypassing the layer's batching and lease
    /// (for comparisons). `ctx` must not start with the layer's prefix. The answer comes back
    /// from [`LeaseNode::take_raw_read_states`]; raft-rs may drop it silently.
    pub fn raw_read_index(&mut self, ctx: Vec<u8>) {
        assert!(
            !ctx.starts_with(READ_CTX_PREFIX),
            "context prefix reserved by the lease layer"
        );
        self.raw.read_index(ctx);
    }

    /// Answers to [`LeaseNode::raw_read_index`] so far.
    pub fn take_raw_read_states(&mut self) -> Vec<raft::ReadState> {
        std::mem::take(&mut self.raw_read_states)
    }

    /// Hand back every read that finished. For each read whose index is applied, `read_state`
    /// reads the caller's state *first*; a lease read is then validated against the clock.
    /// An `Auto` read whose lease was lost meanwhile goes back to wait for ReadIndex.
    pub fn serve_reads<T>(
        &mut self,
        mut read_state: impl FnMut(ReadId) -> T,
    ) -> Vec<ServedRead<T>> {
        let applied = self.raw.raft.raft_log.applied;
        let mut out: Vec<ServedRead<T>> = self
            .reads
            .failed
            .drain(..)
            .map(|(id, e)| ServedRead { id, result: Err(e) })
            .collect();
        while let Some(r) = self
            .reads
            .lease
            .front()
            .copied()
            .filter(|r| r.index <= applied)
        {
            self.reads.lease.pop_front();
            let value = read_state(r.id);
            if let Some(result) = self.validate_lease_read(r, value) {
                out.push(ServedRead { id: r.id, result });
            }
        }
        let kind = match self.config.unsafe_mode {
            UnsafeMode::RaftLeaseBased => ReadKind::Lease,
            _ => ReadKind::Index,
        };
        while let Some(&(id, _)) = self
            .reads
            .index_ready
            .front()
            .filter(|(_, i)| *i <= applied)
        {
            self.reads.index_ready.pop_front();
            let value = read_state(id);
            let counters = &self.shared.counters;
            Counters::bump(match kind {
                ReadKind::Lease => &counters.lease_reads,
                ReadKind::Index => &counters.index_reads,
            });
            out.push(ServedRead {
                id,
                result: Ok((value, kind)),
            });
        }
        self.issue_index_round();
        out
    }

    /// Read first, validate second: the clock is read after the state was read.
    fn validate_lease_read<T>(
        &mut self,
        r: LeaseRead,
        value: T,
    ) -> Option<Result<(T, ReadKind), ReadError>> {
        let counters = &self.shared.counters;
        if self.lease_held_now() {
            Counters::bump(&counters.lease_reads);
            return Some(Ok((value, ReadKind::Lease)));
        }
        if r.mode == ReadMode::Auto {
            Counters::bump(&counters.fallbacks);
            self.reads.index_waiting.push(r.id);
            return None;
        }
        Counters::bump(&counters.lease_refusals);
        Some(Err(ReadError::LeaseNotHeld))
    }

    fn lease_held_now(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
            && self.lease.state(self.clock.now_ns()).is_held()
            && self.config.unsafe_mode != UnsafeMode::RaftLeaseBased
    }

    fn not_leader(&self) -> ReadError {
        let hint = self.raw.raft.leader_id;
        ReadError::NotLeader {
            leader_hint: (hint != raft::INVALID_ID).then_some(hint),
        }
    }

    /// Send waiting ReadIndex reads as one `read_index` round (at most two in flight), once the
    /// leader has committed in its term (raft-rs 0.7 silently drops a `read_index` before that).
    fn issue_index_round(&mut self) {
        let r = &self.raw.raft;
        if self.in_ready || r.state != StateRole::Leader || !r.commit_to_current_term() {
            return;
        }
        if let Some(ctx) = self.reads.start_batch() {
            Counters::bump(&self.shared.counters.index_rounds);
            self.raw.read_index(ctx);
        }
    }

    /// A round that got no answer within two heartbeat intervals is re-sent with a new context.
    fn retry_dropped_round(&mut self) {
        let limit = 2 * self.heartbeat_tick.max(1);
        let mut overdue = false;
        for batch in self.reads.index_inflight.iter_mut() {
            batch.ticks_waited += 1;
            overdue |= batch.ticks_waited >= limit;
        }
        if overdue {
            debug!(self.logger, "read_index round unanswered; retrying"; "reads" => self.reads.len());
            self.reads.requeue_inflight();
        }
        self.issue_index_round();
    }

    /// Renewal normally rides on raft's heartbeats. Only a lease already past its renew point,
    /// with no round sent for a heartbeat interval, asks raft for an early heartbeat.
    fn renew_if_due(&mut self) {
        let r = &self.raw.raft;
        if r.state == StateRole::Leader && r.prs().is_singleton() {
            // The only voter: no other leader can arise without a membership change, which
            // drops the lease. Its own acknowledgement is the quorum.
            let (term, now_ns) = (r.term, self.clock.now_ns());
            if self.lease.on_quorum_ack(term, now_ns) == AckOutcome::Extended {
                Counters::bump(&self.shared.counters.renewals);
            }
            return;
        }
        let suspect = self.lease.state(self.clock.now_ns()) == LeaseState::Suspect;
        if suspect && self.ticks_since_round >= self.heartbeat_tick.max(1) && !self.in_ready {
            self.raw.ping();
        }
    }

    // ----- role tracking and publishing ------------------------------------------------------

    /// Notice role and term changes, the first commit of a term, and publish for read handles.
    fn sync(&mut self) {
        let (role, term) = (self.raw.raft.state, self.raw.raft.term);
        if (role, term) != self.seen {
            if self.seen.0 == StateRole::Leader {
                self.lease.lose();
                self.rounds.clear();
                self.shared.revoke();
                let err = self.not_leader();
                self.reads.fail_all(&err);
                info!(self.logger, "stopped leading: lease lost"; "term" => term, "role" => ?role);
            }
            if role == StateRole::Leader {
                self.lease.start_term(term);
                self.rounds.clear();
                self.shared.revoke();
                info!(self.logger, "leading"; "term" => term);
            }
            self.seen = (role, term);
        }
        if role == StateRole::Leader && self.raw.raft.commit_to_current_term() {
            self.lease.on_commit_in_term(term);
            self.issue_index_round();
        }
        self.publish();
    }

    fn publish(&mut self) {
        let now_ns = self.clock.now_ns();
        let held = self.lease_held_now();
        let until_ns = if held {
            self.lease.usable_until_ns().unwrap_or(0)
        } else {
            0
        };
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
        ReadHandle::new(self.shared.clone(), self.clock.clone())
    }

    /// The lease as of now.
    pub fn lease_status(&self) -> LeaseStatus {
        let now_ns = self.clock.now_ns();
        let state = if self.config.unsafe_mode == UnsafeMode::RaftLeaseBased {
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

    /// A copy of the event counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.shared.counters.snapshot()
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
