//! Giving a term up: a node that stops leading a group (a step-down, a term given up, the group
//! removed) releases the voters fortified to it over the node stream, so that they may elect a
//! leader without waiting for their node's support of it to end.
//!
//! A release ends the leader's lease early, so it waits for what rests on that lease
//! (FOLLOWER.md rule 13): it leaves only once every read lease the node granted in the group
//! has ended on the node's own count. A different leader can be elected only after the promises
//! behind the lease have ended, or after a release; a voter released while a read lease still
//! lives has no promise left to stop it, and a majority of released voters could elect a leader
//! that commits without the holder, which would then serve a read missing that write. Until the
//! release leaves, the node neither campaigns in the group (its grants hold the campaign back)
//! nor votes for another candidate (its own promise outlasts its lease, which outlasts every
//! grant).

use std::collections::BTreeSet;

use raft::Storage;

use super::{FortifyMsg, GroupId, LivenessMode, MultiNode};
use crate::clock::Clock;
use crate::liveness::NodeId;

/// A term given up: its release leaves at `from_ns`, and is sent again until `until_ns`.
#[derive(Debug, Clone)]
pub(super) struct GivenUp {
    pub group: GroupId,
    pub term: u64,
    /// The voters to release (kept here: the group may have been removed since).
    pub voters: Vec<NodeId>,
    /// No release leaves before this local instant: the last read lease granted in the group
    /// ends on this node's count then (0: none was granted).
    pub from_ns: u64,
    /// Sent once already (it left at or after `from_ns`).
    pub sent: bool,
    /// Sent again with every round of support heartbeats until this local instant.
    pub until_ns: u64,
}

impl<S: Storage, C: Clock + Clone> MultiNode<S, C> {
    /// This replica no longer leads `gid` at `term`, and its lease ended with it: release every
    /// replica fortified to it, over the node stream, once the read leases it granted have
    /// ended. Without the release, a group whose raft messages do not get through
    /// (check-quorum stepped its leader down) would stay fortified to a leader that cannot
    /// serve, while the node stream keeps the support alive.
    pub(super) fn give_up(&mut self, gid: GroupId, term: u64) {
        let g = &self.groups[&gid];
        assert!(
            !g.leads(term),
            "group {gid}: gives up term {term} it still leads"
        );
        assert!(
            g.node.lease_status().remaining_ns == 0,
            "group {gid}: gives up term {term} with its lease still held"
        );
        let voters = g.members().all_voters().collect();
        let grants_end_ns = g.node.grants_end_ns();
        self.release_term(gid, term, voters, grants_end_ns);
    }

    /// Release `voters` from `term` of `gid` once `grants_end_ns` has passed on this node's
    /// clock (at once if it has), and again for `3P` after.
    pub(super) fn release_term(
        &mut self,
        gid: GroupId,
        term: u64,
        voters: Vec<NodeId>,
        grants_end_ns: u64,
    ) {
        let knobs = &self.config.lease.safeties.testing;
        if self.mode != LivenessMode::Shared || knobs.no_give_up {
            return;
        }
        let from_ns = if knobs.release_at_once {
            0
        } else {
            grants_end_ns
        };
        let now_ns = self.clock.now_ns();
        let until_ns = now_ns
            .max(from_ns)
            .saturating_add(3 * self.derived.promise_ns);
        self.given_up.push(GivenUp {
            group: gid,
            term,
            voters,
            from_ns,
            sent: false,
            until_ns,
        });
        self.send_due_releases(now_ns);
        slog::debug!(self.logger, "gave up leadership"; "group" => gid, "term" => term,
            "release_in_ns" => from_ns.saturating_sub(now_ns));
    }

    /// Send every release whose read leases have ended and that has not left yet.
    pub(super) fn send_due_releases(&mut self, now_ns: u64) {
        let due: Vec<usize> = (0..self.given_up.len())
            .filter(|&i| !self.given_up[i].sent && self.given_up[i].from_ns <= now_ns)
            .collect();
        for i in due {
            let u = self.given_up[i].clone();
            self.send_release(&u, now_ns);
            self.given_up[i].sent = true;
        }
    }

    /// Send every release that left within `3P` again, one round per heartbeat interval.
    pub(super) fn resend_releases(&mut self, now_ns: u64) {
        self.given_up.retain(|u| !u.sent || now_ns < u.until_ns);
        for u in self.given_up.clone().iter().filter(|u| u.sent) {
            self.send_release(u, now_ns);
        }
    }

    fn send_release(&mut self, u: &GivenUp, now_ns: u64) {
        assert!(
            u.from_ns <= now_ns,
            "group {}: term {} released before the read leases granted under it end",
            u.group,
            u.term
        );
        let peers: BTreeSet<NodeId> = u.voters.iter().copied().collect();
        let me = self.id;
        for peer in peers.into_iter().filter(|&p| p != me) {
            let to = self.batch_to(peer);
            to.fortify.push(FortifyMsg::Release {
                group: u.group,
                term: u.term,
            });
        }
    }
}
