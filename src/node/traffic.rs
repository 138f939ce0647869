//! Raft traffic: ticks, peers' messages, the votes a promise refuses, and the acknowledgements that renew the lease.

use super::*;

impl<S: Storage, C: Clock> LeaseNode<S, C> {
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
        let Ok(holder_note) = self.take_note(&mut m) else {
            return Ok(());
        };
        match m.get_msg_type() {
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                if !self.vote_allowed(&m) =>
            {
                return Ok(());
            }
            MessageType::MsgHeartbeatResponse => self.on_heartbeat_response(&mut m),
            MessageType::MsgPropose
                if self.is_leader()
                    && proposes_conf_change(&m)
                    && self.conf_change_waits().is_err() =>
            {
                return Err(raft::Error::ProposalDropped); // forwarded: dropped, as raft would
            }
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
        if let (Some(note), Ok(())) = (holder_note, &result) {
            self.on_holder_note(from, note);
        }
        self.sync();
        result
    }

    /// Would this tick start an election while the promise (or the jitter after it) holds?
    pub(super) fn campaign_blocked(&mut self) -> bool {
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
        if self.grants_live(now_ns) {
            return true; // a read lease it granted may still be served: no new term of its own
        }
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

    pub(super) fn vote_allowed(&mut self, m: &Message) -> bool {
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
    pub(super) fn on_leader_message(&mut self, from: u64, term: u64) {
        let r = &self.raw.raft;
        if r.state == StateRole::Follower && r.leader_id == from && r.term == term {
            self.promise.on_leader_message(from, self.clock.now_ns());
        }
    }

    /// An acknowledgement counts only for the round of the copy it acknowledges, and only for
    /// the promise its sender says it made on receipt (never this leader's own settings).
    pub(super) fn on_heartbeat_response(&mut self, m: &mut Message) {
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
    pub(super) fn on_quorum_ack(&mut self, sent_at_ns: u64, lease_ns: u64) {
        let now_ns = self.clock.now_ns();
        self.on_quorum_ack_at(sent_at_ns, lease_ns, now_ns);
    }

    /// [`Self::on_quorum_ack`] with the clock read at `now_ns`.
    pub(super) fn on_quorum_ack_at(&mut self, sent_at_ns: u64, lease_ns: u64, now_ns: u64) {
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
}

/// Whether a forwarded proposal carries a membership change.
fn proposes_conf_change(m: &Message) -> bool {
    m.get_entries().iter().any(|e| {
        matches!(
            e.get_entry_type(),
            raft::eraftpb::EntryType::EntryConfChange | raft::eraftpb::EntryType::EntryConfChangeV2
        )
    })
}
