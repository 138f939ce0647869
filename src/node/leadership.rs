//! Proposals, membership changes, campaigns and transfers, and where the lease is lost.

use super::*;

impl<S: Storage, C: Clock> LeaseNode<S, C> {
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
        if let Err(until_ns) = self.conf_change_waits() {
            let wait_ms = until_ns
                .saturating_sub(self.clock.now_ns())
                .div_ceil(1_000_000);
            return Err(raft::Error::ConfChangeError(format!(
                "follower read leases are live for {wait_ms} ms more at most; granting has \
                 stopped and their holders are asked to give them up: propose the change again \
                 after a round trip, or after that at the latest"
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
    /// Refused while this node's promise holds: its vote for itself would break the promise; and,
    /// with follower leases, while a read lease it granted may still be served.
    pub fn campaign(&mut self) -> Result<(), CampaignError> {
        if self.safeties.campaign_hold() {
            let decision = self
                .promise
                .check_vote(self.raw.raft.id, self.clock.now_ns());
            if let VoteDecision::Refuse { remaining_ns, .. } = decision {
                return Err(CampaignError::PromiseHolds { remaining_ns });
            }
        }
        if self.grants_live(self.clock.now_ns()) {
            return Err(CampaignError::GrantsLive);
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

    pub(super) fn fence_for_transfer(&mut self, why: &'static str) {
        let leading = self.raw.raft.state == StateRole::Leader;
        if !leading || self.lease.is_fenced() || !self.safeties.transfer_fence() {
            return;
        }
        self.lose_lease(Loss::Transfer(why));
        debug_assert!(self.lease.is_fenced() && self.lease.usable_until_ns().is_none());
    }

    /// Drop the lease, retire every round in flight, and revoke it for read handles.
    pub(super) fn lose_lease(&mut self, why: Loss) {
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
}
