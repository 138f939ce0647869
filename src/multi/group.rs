//! One group hosted by a [`super::MultiNode`]: its [`LeaseNode`], and what shared liveness keeps
//! for it (the fortifications it counts as leader, the one it made as follower, quiescence).

use std::collections::BTreeMap;

use raft::eraftpb::{Message, MessageType};
use raft::{StateRole, Storage};

use crate::clock::Clock;
use crate::liveness::{Fortification, Fortified, NodeId, Requester};
use crate::node::LeaseNode;

/// The members of a group's configuration, cached from raft's progress tracker after every
/// `Ready` (where a configuration changes: a conf change applied, a snapshot installed), so that
/// paths run for every group on every support ack need not rebuild them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Members {
    /// Voters (of the incoming half, when joint).
    pub voters: Vec<NodeId>,
    /// Voters of the outgoing half while joint, else empty.
    pub outgoing: Vec<NodeId>,
    /// Learners.
    pub learners: Vec<NodeId>,
}

impl Members {
    /// Read from raft's progress tracker.
    fn of<S: Storage, C: Clock>(node: &LeaseNode<S, C>) -> Self {
        let cs = node.raw().raft.prs().conf().to_conf_state();
        Members {
            voters: cs.voters,
            outgoing: cs.voters_outgoing,
            learners: cs.learners,
        }
    }

    /// Every voter, of both halves when joint (a voter of both appears twice).
    pub fn all_voters(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.voters.iter().chain(&self.outgoing).copied()
    }

    /// Every node with a replica: voters and learners.
    pub fn all(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.all_voters().chain(self.learners.iter().copied())
    }
}

/// One hosted group.
pub(super) struct Group<S: Storage, C: Clock> {
    pub node: LeaseNode<S, C>,
    /// The configuration's members, read at `members_version` of the node's configuration.
    members: Members,
    /// [`LeaseNode::conf_version`] when `members` was read.
    members_version: u64,
    /// As leader: per voter, the `(epoch, incarnation)` its fortification was made under.
    pub fortified: Fortified,
    /// The term `fortified` belongs to.
    fortified_term: u64,
    /// As leader: when each voter was last asked to fortify.
    asked_ns: BTreeMap<NodeId, u64>,
    /// As follower: the fortification this replica made, while its node supports the leader.
    pub fortification: Option<Fortification>,
    /// The term this replica led when last seen leading; taken when it no longer leads it.
    led_term: Option<u64>,
    /// The highest term a leader released this replica from: that term is over, and so is
    /// every earlier one, so a delayed request for any of them must not fortify it again.
    released_term: u64,
    /// Ticks since the last message that was not a heartbeat, proposal or non-lease read.
    pub idle_ticks: u32,
    /// Not ticked, and its raft sends no heartbeats.
    pub quiescent: bool,
    /// Negative control (tests only): a new term keeps counting the earlier term's
    /// fortifications.
    count_earlier_terms: bool,
    /// Off only as a negative control: a fortification is let go as soon as raft's term moves.
    outlives_term_moves: bool,
}

impl<S: Storage, C: Clock> Group<S, C> {
    pub fn new(
        node: LeaseNode<S, C>,
        count_earlier_terms: bool,
        outlives_term_moves: bool,
    ) -> Self {
        Group {
            count_earlier_terms,
            outlives_term_moves,
            members: Members::of(&node),
            members_version: node.conf_version(),
            node,
            fortified: Fortified::new(),
            fortified_term: 0,
            asked_ns: BTreeMap::new(),
            fortification: None,
            led_term: None,
            released_term: 0,
            idle_ticks: 0,
            quiescent: false,
        }
    }

    /// The configuration's members. Exact outside a `Ready`: asserted in debug builds.
    pub fn members(&self) -> &Members {
        debug_assert_eq!(self.members, Members::of(&self.node), "stale members");
        &self.members
    }

    /// Read the members again if the node's configuration may have changed since they were
    /// read (nothing to do otherwise). Returns whether they changed.
    pub fn refresh_members(&mut self) -> bool {
        if self.node.conf_version() == self.members_version {
            return false;
        }
        self.members_version = self.node.conf_version();
        let now = Members::of(&self.node);
        let changed = now != self.members;
        self.members = now;
        changed
    }

    /// Whether this replica leads `term`.
    pub fn leads(&self, term: u64) -> bool {
        self.node.is_leader() && self.node.raw().raft.term == term
    }

    /// A replica of a group hosted here again: what the removed one left (see
    /// [`super::MultiNode::remove_group`]).
    pub fn restore(&mut self, fortification: Option<Fortification>, released_term: u64) {
        self.released_term = released_term;
        if let Some(f) = fortification {
            self.fortify(f);
        }
    }

    /// The highest term a leader released this replica from.
    pub fn released_term(&self) -> u64 {
        self.released_term
    }

    /// Fortify this replica to `f.leader`.
    pub fn fortify(&mut self, f: Fortification) {
        self.fortification = Some(f);
        self.node.set_fortified(Some(f.leader));
    }

    /// Release the fortification: raft moved on to another term or leader.
    pub fn release(&mut self) {
        self.fortification = None;
        self.node.set_fortified(None);
    }

    /// Release the fortification because its leader's lease has ended (its support was
    /// withdrawn, or it gave the term up): forget that leader too, so that raft-rs hears the
    /// other replicas' campaigns at once.
    pub fn release_from_ended_leader(&mut self) {
        self.release();
        self.node.forget_leader();
    }

    /// The term this replica has stopped leading since the last call, if any (it stepped down,
    /// or raft moved to a later term). Its voters' fortifications are to be released.
    pub fn take_stepped_down(&mut self) -> Option<u64> {
        let now = self.node.is_leader().then(|| self.node.raw().raft.term);
        let was = self.led_term;
        self.led_term = now;
        was.filter(|&t| Some(t) != now)
    }

    /// The leader of `term` released this replica. Returns whether it was fortified to it.
    pub fn release_by(&mut self, leader: NodeId, term: u64) -> bool {
        self.released_term = self.released_term.max(term);
        let matches = self
            .fortification
            .is_some_and(|f| f.leader == leader && f.term == term);
        if matches {
            self.release_from_ended_leader();
        }
        matches
    }

    /// A vote or pre-vote request for a later term from the leader this replica is fortified
    /// to: that leader no longer leads the fortified term (it campaigns for a later one), so its
    /// lease for that term has ended and the fortification is released. Returns whether it was.
    /// A request for the fortified term itself is the campaign that won it, delayed: it
    /// releases nothing.
    pub fn released_by_campaign(&mut self, m: &Message) -> bool {
        let campaign = matches!(
            m.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        );
        let later = |f: &Fortification| f.leader == m.from && m.term > f.term;
        let Some(f) = self.fortification.filter(|f| campaign && later(f)) else {
            return false;
        };
        self.release_by(f.leader, f.term)
    }

    /// Whether a leader released this replica from `term` or a later one (a request for
    /// `term` is stale).
    pub fn term_is_over(&self, term: u64) -> bool {
        term <= self.released_term
    }

    /// A fortification lasts as long as what the leader counts: its node's support for the
    /// leader's epoch, the leader's own term (a release, or its campaign for a later one), or
    /// until raft follows a leader of a later term. A later-term leader could only have been
    /// elected with the vote of some replica the leader counted, and every such replica refuses
    /// while fortified, so the leader no longer counts this one. A bare term move proves nothing:
    /// raft-rs moves a follower's term on any later-term message, a held and rejected pre-vote
    /// response included, while the leader of the fortified term still counts this replica.
    pub fn drop_stale_fortification(&mut self) {
        let Some(f) = self.fortification else { return };
        let r = &self.node.raw().raft;
        let follows_later_leader = r.leader_id != raft::INVALID_ID && r.term > f.term;
        debug_assert!(
            r.term > f.term || r.leader_id == raft::INVALID_ID || r.leader_id == f.leader,
            "two leaders of term {}: {} and {}",
            f.term,
            f.leader,
            r.leader_id
        );
        let term_moved = r.term != f.term;
        if follows_later_leader || (term_moved && !self.outlives_term_moves) {
            self.release();
        }
        debug_assert!(
            self.fortification.is_none() || !follows_later_leader,
            "fortified to {} at term {} while following a later leader",
            f.leader,
            f.term
        );
    }

    /// A fortified replica ignores a later-term message that names no leader of that term (a
    /// response, say a held, rejected pre-vote response), so that raft's term stays with the
    /// leader it backs; votes and pre-votes are refused by the promise anyway. A leader's own
    /// messages (append, heartbeat, snapshot) and a transfer's forced vote go through.
    pub fn ignores_while_fortified(&self, m: &Message) -> bool {
        let Some(f) = self.fortification else {
            return false;
        };
        if !self.outlives_term_moves || m.term <= self.node.raw().raft.term || m.from == f.leader {
            return false;
        }
        let from_leader = matches!(
            m.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
        );
        let forced_vote = m.get_msg_type() == MessageType::MsgRequestVote
            && m.get_context() == raft::CAMPAIGN_TRANSFER;
        !from_leader && !forced_vote
    }

    /// As leader, forget fortifications counted for an earlier term.
    pub fn clear_fortified_if_new_term(&mut self) {
        let term = self.node.raw().raft.term;
        if term != self.fortified_term && !self.count_earlier_terms {
            self.fortified.clear();
            self.asked_ns.clear();
            self.fortified_term = term;
        }
    }

    /// Whether the fortifications counted are those of `term` (always, but for the control that
    /// keeps an earlier term's).
    pub fn counts_term(&self, term: u64) -> bool {
        self.fortified_term == term || self.count_earlier_terms
    }

    /// As leader, the voters to ask (again) to fortify: those whose node supports this one, but
    /// whose fortification does not match that support, not asked within `interval_ns`.
    pub fn voters_to_fortify(
        &mut self,
        me: NodeId,
        requester: &Requester,
        now_ns: u64,
        interval_ns: u64,
    ) -> Vec<NodeId> {
        self.clear_fortified_if_new_term();
        let mut ask = Vec::new();
        let voters: Vec<NodeId> = self.members().all_voters().filter(|&v| v != me).collect();
        for v in voters {
            let Some(s) = requester.support_from(v, now_ns) else {
                continue; // its node does not support this one yet: nothing to fortify under
            };
            if self.fortified.get(&v) == Some(&(s.epoch, s.incarnation)) {
                continue;
            }
            let asked = self.asked_ns.get(&v).copied();
            if asked.is_none_or(|t| t.saturating_add(interval_ns) <= now_ns) {
                self.asked_ns.insert(v, now_ns);
                ask.push(v);
            }
        }
        ask
    }

    /// Whether the group may quiesce: idle for `after_ticks`, and as leader holding a lease
    /// with everything committed and applied and no read waiting, or as follower fortified.
    pub fn may_quiesce(&self, after_ticks: u32) -> bool {
        if self.quiescent || self.idle_ticks < after_ticks {
            return false;
        }
        let r = &self.node.raw().raft;
        match r.state {
            StateRole::Leader => {
                let log = &r.raft_log;
                let settled = log.committed == log.last_index() && log.applied == log.committed;
                let held = self.node.lease_status().remaining_ns > 0;
                settled && held && self.node.pending_reads() == 0 && r.lead_transferee.is_none()
            }
            _ => self.fortification.is_some(),
        }
    }
}
