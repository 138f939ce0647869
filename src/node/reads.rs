//! Reads: lease reads, ReadIndex rounds, and the renewal a read may need.

use super::*;

impl<S: Storage, C: Clock> LeaseNode<S, C> {
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

    pub(super) fn count_served<T>(&self, served: &crate::read::Served<T>) {
        let c = &self.shared.counters;
        c.fallbacks
            .fetch_add(served.fallbacks, std::sync::atomic::Ordering::Relaxed);
        for r in &served.reads {
            match r.result {
                Ok((_, ReadKind::Lease | ReadKind::FollowerLease)) => {
                    Counters::bump(&c.lease_reads)
                }
                Ok((_, ReadKind::Index)) => Counters::bump(&c.index_reads),
                Err(ReadError::LeaseNotHeld) => Counters::bump(&c.lease_refusals),
                Err(_) => {}
            }
        }
    }

    pub(super) fn lease_held_now(&self) -> bool {
        self.lease_held_at(self.clock.now_ns())
    }

    pub(super) fn lease_held_at(&self, now_ns: u64) -> bool {
        self.raw.raft.state == StateRole::Leader
            && self.lease.state(now_ns).is_held()
            && !self.safeties.raft_lease_based
    }

    pub(super) fn not_leader(&self) -> ReadError {
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

    /// A round that got no answer within two heartbeat intervals is re-sent with a new context:
    /// raft-rs ignores a context still pending, so under the old one the first attempt's
    /// acknowledgements would answer the reads started since (the `reuse_read_ctx_on_retry`
    /// control).
    pub(super) fn retry_dropped_round(&mut self) {
        if self.reads.tick(2 * self.heartbeat_tick.max(1)) {
            debug!(self.logger, "read_index round unanswered; retrying"; "reads" => self.reads.len());
        }
        self.issue_index_round();
    }

    /// Renewal normally rides on raft's heartbeats. Only a lease already past its renew point,
    /// with no round sent for a heartbeat interval, asks raft for an early heartbeat.
    pub(super) fn renew_if_due(&mut self) {
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
    pub(super) fn own_ack_is_a_quorum(&self) -> bool {
        let prs = self.raw.raft.prs();
        if !self.safeties.self_renewal_needs_sole_voter() {
            return prs.is_singleton(); // the negative control: any single voter
        }
        let mut me = fxhash::FxHashSet::default();
        me.insert(self.raw.raft.id);
        prs.has_quorum(&me)
    }
}
