//! The lease monitor: checks the lease itself, at every step, not only the reads it serves.
//!
//! A stale read needs a client to ask at the wrong moment; an overlapping lease does not. At every
//! instant of real (simulated) time the monitor checks that:
//! - no two nodes hold a lease;
//! - no node holds a lease of term `T` while another node leads a later term;
//! - every lease held is backed: the nodes whose promise stops them from voting for anyone but
//!   the holder form a quorum of the holder's configuration (both halves when joint). This is the
//!   lease argument itself, checked directly: it fails as soon as a lease outlives the promises
//!   it rests on, before any election has to happen in the gap. A crashed node counts as backing
//!   (it cannot vote); once restarted, its boot promise, or the lack of one, speaks for it;
//! - no promise that backs a lease held is broken: a node that promised the holder does not
//!   campaign, and does not vote for anyone else in a later term, while the lease lasts;
//! - no follower read lease of term `T` is held while a node other than `T`'s leader leads a
//!   later term (FOLLOWER.md rule 3: a read lease ends before the leader lease that granted it,
//!   and a different leader is elected only after that lease, and the releases held back for
//!   the read leases, have ended). The granting node may lead again at once: its grant table
//!   comes with it.
//!
//! The promises are read as made, not as enforced: a negative control that switches off the
//! refusal of votes leaves the promise in place, and the monitor catches the node breaking it.
//!
//! A node holds a lease when its own clock says so ([`crate::LeaseNode::lease_status`]), paused or
//! not: a paused node's clock runs on, and it would serve from that lease the moment it resumes.
//! The monitor also counts elections, to report split votes (terms in which two or more nodes
//! stood as candidates and none won).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::sim::history::Violation;

/// What the monitor sees of one node at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node's raft id.
    pub id: u64,
    /// Its raft term.
    pub term: u64,
    /// Whether it believes it leads `term`.
    pub leading: bool,
    /// Whether it stands as a candidate (not a pre-candidate) in `term`, as a voter of the
    /// newest configuration (the simulator leaves out removed nodes campaigning on a stale one).
    pub candidate: bool,
    /// The term of the lease it holds now by its own clock, if any.
    pub lease_term: Option<u64>,
    /// The term of the follower read lease it holds now by its own clock, if any: the term of
    /// the leader that granted it.
    pub read_lease_term: Option<u64>,
    /// Whether it is campaigning: a pre-candidate or a candidate, in any configuration.
    pub campaigning: bool,
    /// The node it voted for in `term` (0: none).
    pub vote: u64,
    /// The nodes whose lease this node's promise backs now (see the module docs).
    pub backs: Vec<u64>,
    /// The voters of its configuration: incoming, and outgoing (empty unless joint).
    pub voters: (Vec<u64>, Vec<u64>),
}

/// One election term as seen by the monitor.
#[derive(Debug, Clone, Default)]
struct Term {
    candidates: BTreeSet<u64>,
    leader: Option<u64>,
}

/// Watches every node's lease at every step. See the module docs.
#[derive(Debug, Default, Clone)]
pub struct LeaseMonitor {
    /// Instants checked.
    checks: u64,
    /// Each overlap once, at the first instant it was seen.
    violations: Vec<Violation>,
    /// Overlaps already reported: (two holders?, holder, its lease term, other node, its term).
    seen: HashSet<(bool, u64, u64, u64, u64)>,
    terms: BTreeMap<u64, Term>,
    /// For each promise seen backing a lease held, (node, holder, lease term), the node's term
    /// and vote when it was first seen: a vote cast before the promise (a restarted node's
    /// persisted vote, under its boot promise) breaks nothing.
    promised_votes: HashMap<(u64, u64, u64), (u64, u64)>,
}

/// How elections went: see [`LeaseMonitor::elections`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ElectionStats {
    /// Terms in which some node stood as a candidate.
    pub contested_terms: u64,
    /// Terms won by a leader.
    pub won_terms: u64,
    /// Finished terms in which two or more candidates stood and none won.
    pub split_votes: u64,
}

impl LeaseMonitor {
    /// Check one instant `at_ns` of real time.
    pub fn observe(&mut self, at_ns: u64, nodes: &[NodeView]) {
        self.checks += 1;
        for n in nodes {
            self.record_election(n);
        }
        self.forget_ended_promises(nodes);
        for holder in nodes.iter().filter(|n| n.read_lease_term.is_some()) {
            self.check_read_lease(at_ns, holder, nodes);
        }
        for holder in nodes.iter().filter(|n| n.lease_term.is_some()) {
            let lease_term = holder.lease_term.expect("filtered");
            self.check_backed(at_ns, holder, lease_term, nodes);
            self.check_promises_kept(at_ns, holder, lease_term, nodes);
            for other in nodes.iter().filter(|o| o.id != holder.id) {
                if let Some(other_term) = other.lease_term {
                    self.report(holder, lease_term, other, other_term, || {
                        Violation::TwoLeaseHolders {
                            at_ns,
                            first: holder.id,
                            first_term: lease_term,
                            second: other.id,
                            second_term: other_term,
                        }
                    });
                }
                if other.leading && other.term > lease_term {
                    self.report(holder, lease_term, other, other.term, || {
                        Violation::LeaseBehindLeader {
                            at_ns,
                            holder: holder.id,
                            lease_term,
                            leader: other.id,
                            leader_term: other.term,
                        }
                    });
                }
            }
        }
    }

    /// No node but the one that led the read lease's term leads a later term while it lives.
    fn check_read_lease(&mut self, at_ns: u64, holder: &NodeView, nodes: &[NodeView]) {
        let lease_term = holder.read_lease_term.expect("a read lease held");
        let granter = self.terms.get(&lease_term).and_then(|t| t.leader);
        let later = nodes
            .iter()
            .filter(|o| o.leading && o.term > lease_term && Some(o.id) != granter);
        for leader in later {
            let key = (
                false,
                holder.id,
                lease_term,
                leader.id,
                u64::MAX - leader.term,
            );
            if self.seen.insert(key) {
                self.violations.push(Violation::ReadLeaseBehindLeader {
                    at_ns,
                    holder: holder.id,
                    lease_term,
                    granter,
                    leader: leader.id,
                    leader_term: leader.term,
                });
            }
        }
    }

    /// The holder's lease must rest on a quorum of promises.
    fn check_backed(&mut self, at_ns: u64, holder: &NodeView, lease_term: u64, nodes: &[NodeView]) {
        let backers: Vec<u64> = nodes
            .iter()
            .filter(|n| n.backs.contains(&holder.id))
            .map(|n| n.id)
            .collect();
        let (incoming, outgoing) = &holder.voters;
        let majority = |voters: &Vec<u64>| {
            voters.is_empty()
                || 2 * voters.iter().filter(|v| backers.contains(v)).count() > voters.len()
        };
        if majority(incoming) && majority(outgoing) {
            return;
        }
        if self.seen.insert((false, holder.id, lease_term, 0, 0)) {
            self.violations.push(Violation::UnbackedLease {
                at_ns,
                holder: holder.id,
                lease_term,
                backers,
            });
        }
    }

    /// A node whose promise backs the holder neither campaigns nor votes for another node in a
    /// later term.
    fn check_promises_kept(
        &mut self,
        at_ns: u64,
        holder: &NodeView,
        lease_term: u64,
        nodes: &[NodeView],
    ) {
        let promised = nodes
            .iter()
            .filter(|n| n.id != holder.id && n.backs.contains(&holder.id));
        for n in promised {
            let key = (n.id, holder.id, lease_term);
            let first = *self.promised_votes.entry(key).or_insert((n.term, n.vote));
            let voted_since = (n.term, n.vote) != first;
            let voted_elsewhere =
                voted_since && n.term > lease_term && n.vote != 0 && n.vote != holder.id;
            if !(n.campaigning || n.leading || voted_elsewhere) {
                continue;
            }
            if self
                .seen
                .insert((false, holder.id, lease_term, n.id, n.term))
            {
                self.violations.push(Violation::PromiseBroken {
                    at_ns,
                    holder: holder.id,
                    lease_term,
                    node: n.id,
                    node_term: n.term,
                    vote: n.vote,
                });
            }
        }
    }

    /// Forget the votes of promises no longer backing a lease held, so that a promise made later
    /// starts from the vote it finds.
    fn forget_ended_promises(&mut self, nodes: &[NodeView]) {
        self.promised_votes
            .retain(|&(node, holder, lease_term), _| {
                let held = nodes
                    .iter()
                    .any(|n| n.id == holder && n.lease_term == Some(lease_term));
                let backs = nodes
                    .iter()
                    .any(|n| n.id == node && n.backs.contains(&holder));
                held && backs
            });
    }

    fn report(
        &mut self,
        holder: &NodeView,
        lease_term: u64,
        other: &NodeView,
        other_term: u64,
        violation: impl FnOnce() -> Violation,
    ) {
        let violation = violation();
        let two_holders = matches!(violation, Violation::TwoLeaseHolders { .. });
        let key = (two_holders, holder.id, lease_term, other.id, other_term);
        // Two holders are one overlap whichever is named first.
        let mirror = (two_holders, other.id, other_term, holder.id, lease_term);
        if !self.seen.contains(&mirror) && self.seen.insert(key) {
            self.violations.push(violation);
        }
    }

    fn record_election(&mut self, n: &NodeView) {
        if !n.candidate && !n.leading {
            return;
        }
        let term = self.terms.entry(n.term).or_default();
        if n.candidate {
            term.candidates.insert(n.id);
        }
        if n.leading {
            term.leader = Some(n.id);
        }
    }

    /// Instants checked so far.
    pub fn checks(&self) -> u64 {
        self.checks
    }

    /// Every overlap seen, each once.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Elections so far. The newest term is left out of split votes: it may still be won.
    pub fn elections(&self) -> ElectionStats {
        let newest = self.terms.keys().next_back().copied();
        let mut stats = ElectionStats::default();
        for (term, t) in &self.terms {
            stats.contested_terms += u64::from(!t.candidates.is_empty());
            stats.won_terms += u64::from(t.leader.is_some());
            let finished = Some(*term) != newest;
            stats.split_votes +=
                u64::from(finished && t.leader.is_none() && t.candidates.len() >= 2);
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of a 3-voter configuration whose promise backs node 1.
    fn view(id: u64, term: u64, leading: bool, lease_term: Option<u64>) -> NodeView {
        NodeView {
            id,
            term,
            leading,
            candidate: false,
            lease_term,
            read_lease_term: None,
            campaigning: false,
            vote: 0,
            backs: vec![1],
            voters: (vec![1, 2, 3], vec![]),
        }
    }

    #[test]
    fn a_read_lease_of_a_term_ends_before_another_node_leads_a_later_one() {
        let holder = |lease| NodeView {
            read_lease_term: lease,
            ..view(3, 2, false, None)
        };
        let mut m = LeaseMonitor::default();
        m.observe(1, &[view(1, 2, true, Some(2)), holder(Some(2))]);
        m.observe(2, &[view(1, 3, true, None), holder(Some(2))]);
        assert!(
            m.violations().is_empty(),
            "the granter leads again: allowed"
        );
        m.observe(3, &[view(2, 4, true, None), holder(None)]);
        assert!(m.violations().is_empty(), "the read lease had ended");
        m.observe(4, &[view(2, 4, true, None), holder(Some(2))]);
        assert!(matches!(
            m.violations(),
            [Violation::ReadLeaseBehindLeader {
                holder: 3,
                lease_term: 2,
                granter: Some(1),
                leader: 2,
                leader_term: 4,
                ..
            }]
        ));
    }

    #[test]
    fn one_holder_and_its_followers_pass() {
        let mut m = LeaseMonitor::default();
        m.observe(1, &[view(1, 3, true, Some(3)), view(2, 3, false, None)]);
        assert!(m.violations().is_empty());
        assert_eq!(m.checks(), 1);
    }

    #[test]
    fn a_lease_behind_a_newer_leader_is_caught_once() {
        let mut m = LeaseMonitor::default();
        let backing = |v: NodeView, backs: Vec<u64>| NodeView { backs, ..v };
        let nodes = [
            view(1, 3, true, Some(3)),
            backing(view(2, 4, true, None), vec![2]),
            view(3, 3, false, None),
        ];
        m.observe(10, &nodes);
        m.observe(11, &nodes);
        assert_eq!(
            m.violations(),
            &[Violation::LeaseBehindLeader {
                at_ns: 10,
                holder: 1,
                lease_term: 3,
                leader: 2,
                leader_term: 4
            }]
        );
    }

    #[test]
    fn two_holders_are_caught_once_not_twice() {
        let mut m = LeaseMonitor::default();
        let backing = |v: NodeView, backs: Vec<u64>| NodeView { backs, ..v };
        m.observe(
            5,
            &[
                backing(view(1, 3, true, Some(3)), vec![1]),
                backing(view(2, 4, true, Some(4)), vec![2]),
                backing(view(3, 4, false, None), vec![1, 2]),
            ],
        );
        let kinds: Vec<_> = m
            .violations()
            .iter()
            .map(|v| matches!(v, Violation::TwoLeaseHolders { .. }))
            .collect();
        assert_eq!(
            kinds,
            vec![true, false],
            "two holders, then the lease behind a leader"
        );
    }

    #[test]
    fn a_lease_without_a_quorum_of_promises_is_caught() {
        let mut m = LeaseMonitor::default();
        let follower = |id, backs: Vec<u64>| NodeView {
            backs,
            ..view(id, 3, false, None)
        };
        m.observe(
            1,
            &[
                view(1, 3, true, Some(3)),
                follower(2, vec![1]),
                follower(3, vec![]),
            ],
        );
        assert!(m.violations().is_empty(), "1 and 2 back the lease");
        m.observe(
            2,
            &[
                view(1, 3, true, Some(3)),
                follower(2, vec![]),
                follower(3, vec![2]),
            ],
        );
        assert!(matches!(
            m.violations(),
            [Violation::UnbackedLease {
                holder: 1,
                lease_term: 3,
                ..
            }]
        ));
        let joint = NodeView {
            voters: (vec![1, 2, 3], vec![1, 4, 5]),
            ..view(1, 4, true, Some(4))
        };
        let mut m = LeaseMonitor::default();
        m.observe(
            3,
            &[joint.clone(), follower(2, vec![1]), follower(4, vec![])],
        );
        assert_eq!(m.violations().len(), 1, "the outgoing half has no quorum");
    }

    #[test]
    fn a_promised_node_that_campaigns_or_votes_elsewhere_breaks_its_promise() {
        let holder = view(1, 3, true, Some(3));
        let kept = [
            holder.clone(),
            view(2, 3, false, None),
            view(3, 3, false, None),
        ];
        let mut m = LeaseMonitor::default();
        m.observe(1, &kept);
        assert!(m.violations().is_empty());
        let campaigning = NodeView {
            campaigning: true,
            ..view(2, 3, false, None)
        };
        let voted = NodeView {
            vote: 2,
            ..view(3, 4, false, None)
        };
        m.observe(2, &[holder.clone(), campaigning, voted]);
        let broken: Vec<u64> = m
            .violations()
            .iter()
            .filter_map(|v| match v {
                Violation::PromiseBroken { node, .. } => Some(*node),
                _ => None,
            })
            .collect();
        assert_eq!(broken, vec![2, 3]);
    }

    #[test]
    fn a_vote_cast_before_the_promise_breaks_nothing() {
        // A node restarted with its boot promise (backing anyone) kept the vote it had
        // persisted in a later term: the vote predates the promise.
        let mut m = LeaseMonitor::default();
        let restarted = NodeView {
            vote: 2,
            ..view(2, 9, false, None)
        };
        let nodes = [
            view(1, 3, true, Some(3)),
            restarted,
            view(3, 3, false, None),
        ];
        m.observe(1, &nodes);
        m.observe(2, &nodes);
        assert!(m.violations().is_empty(), "{:?}", m.violations());
    }

    #[test]
    fn split_votes_are_finished_terms_with_two_candidates_and_no_leader() {
        let mut m = LeaseMonitor::default();
        let cand = |id, term| NodeView {
            candidate: true,
            ..view(id, term, false, None)
        };
        m.observe(1, &[cand(1, 2), cand(2, 2)]);
        m.observe(2, &[cand(1, 3), view(2, 3, true, None)]);
        m.observe(3, &[cand(1, 4), cand(2, 4)]);
        let stats = m.elections();
        assert_eq!(stats.split_votes, 1, "term 4 may still be won: {stats:?}");
        assert_eq!((stats.contested_terms, stats.won_terms), (3, 1));
    }
}
