//! The `Ready` cycle: outgoing messages stamped with their round's send time (or, on a follower, with the promise it made), and what `advance` must notice (a transfer raft gave up, a leader's own removal).

use super::*;

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// Is there work for the driver? (Same as `RawNode::has_ready`.)
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Take raft's `Ready`. The node consumes its `read_states`; handle the rest as with `RawNode`.
    ///
    /// With follower read leases on, drive the node with [`LeaseNode::handle_ready`] (or a
    /// `MultiNode`) instead: committed entries must be held back to the exposed index, which
    /// `Ready`'s own committed entries are not ([`LeaseNode::advance`] panics then).
    pub fn ready(&mut self) -> Ready {
        self.issue_index_round(); // reads started since the last round share this one
        let mut rd = self.raw.ready();
        self.note_persisting(rd.entries()); // published below, before any acknowledgement leaves
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
    pub(super) fn stamp(&mut self, mut msgs: Vec<Message>) -> Vec<Message> {
        if self.raw.raft.state != StateRole::Leader {
            self.stamp_acks(&mut msgs);
            self.tag_acks(&mut msgs);
            self.hold_transfer(&mut msgs);
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
        self.hold_transfer(&mut msgs);
        self.expose_now(); // a commit index leaves with the `E` computed from it
        if let Some(x) = self.exposure.as_mut() {
            x.annotate(&mut msgs, now_ns);
        }
        msgs
    }

    /// Each heartbeat acknowledgement says what this node promised on receipt: its own `P`,
    /// and the drift bound it assumes. The leader counts that, not its own settings.
    ///
    /// A node on raft-rs `LeaseBased` reads keeps no promise, and says it promised nothing, so
    /// that no leader counts on a promise it never made (a cluster with the setting on one node
    /// only). The negative control `no_promise` keeps claiming `P`: it is the bug it re-injects.
    pub(super) fn stamp_acks(&self, msgs: &mut [Message]) {
        let keeps = !self.safeties.raft_lease_based;
        let promised = Promised {
            promise_ns: if keeps { self.derived.promise_ns } else { 0 },
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
    pub(super) fn stamp_heartbeat(
        &mut self,
        m: &mut Message,
        tag: &mut Option<LayerCtx>,
        now_ns: u64,
    ) {
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
    ///
    /// # Panics
    /// With follower read leases on: it would count entries held back for the exposed index as
    /// applied. Drive such a node with [`LeaseNode::handle_ready`].
    pub fn advance(&mut self, rd: Ready) -> LightReady {
        assert!(
            self.exposure.is_none(),
            "LeaseNode::advance with follower read leases on: drive the node with handle_ready"
        );
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
    pub(super) fn note_timeout_now(&mut self, msgs: &[Message]) {
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

    pub(super) fn after_advance(&mut self) {
        self.in_ready = false;
        self.step_down_if_removed();
        self.sync();
    }

    /// raft gave up a transfer (its transferee did not take over within an election timeout),
    /// leaving this leader fenced for the rest of a term that may never end. If `MsgTimeoutNow`
    /// never left (nor waits to), nothing can force an election: lift the fence. If it left, a
    /// late copy can still force one in the next term, so no lease is safe in this term: step
    /// down (never inside a `Ready`), and let a new term be elected, where a lease can be had.
    pub(super) fn end_abandoned_transfer(&mut self) {
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
    pub(super) fn step_down_if_removed(&mut self) {
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
}
