//! Every group follows group 0's configuration.
//!
//! Operators change membership in group 0 only (`POST /admin/members`). Group 0's address book
//! records the configuration each applied change left ([`Followed`]) with that change's index,
//! its **version**. The leader of every other group proposes, in its own group, the change that
//! makes its configuration group 0's ([`follow_change`]), tagged with the version it follows.
//!
//! A node whose group 0 lags may lead another group; it must never move that group back to an
//! older configuration. So every replica applies a tagged change only if its version is above the
//! version the group last followed ([`admits`]); an older one is skipped (raft's configuration
//! stays as it was). The decision depends only on the group's own log, so every replica makes the
//! same one, and a group's configurations follow group 0's in group 0's order, possibly skipping
//! some, never going back.

use std::collections::BTreeSet;

use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
};
use serde::{Deserialize, Serialize};

/// Group 0's configuration as its last applied membership change left it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    /// The index of that change in group 0's log (the founding snapshot's index for the
    /// configuration the cluster started with): the version other groups follow.
    pub version: u64,
    /// Its voters.
    pub voters: BTreeSet<u64>,
    /// Its learners.
    pub learners: BTreeSet<u64>,
    /// Whether it is joint (raft has not left it yet): not followed until it has.
    pub joint: bool,
}

impl Followed {
    /// Group 0's configuration `cs`, left by its change at `version`.
    pub fn of(version: u64, cs: &ConfState) -> Followed {
        Followed {
            version,
            voters: cs.voters.iter().copied().collect(),
            learners: cs.learners.iter().copied().collect(),
            joint: !cs.voters_outgoing.is_empty(),
        }
    }

    /// Whether `cs` (not joint) has exactly these voters and learners.
    #[cfg(test)]
    pub fn matches(&self, cs: &ConfState) -> bool {
        cs.voters_outgoing.is_empty()
            && cs.learners_next.is_empty()
            && same(&cs.voters, &self.voters)
            && same(&cs.learners, &self.learners)
    }
}

#[cfg(test)]
fn same(ids: &[u64], set: &BTreeSet<u64>) -> bool {
    ids.len() == set.len() && ids.iter().all(|id| set.contains(id))
}

/// What a follow change carries in its context.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FollowContext {
    follows: u64,
}

/// The change that moves a group whose configuration is `cs`, and which last followed version
/// `follows`, to `target`; `None` when there is nothing to do now: the target is not newer, or
/// is joint, or the group is in a joint configuration.
///
/// A group that already has the target's voters and learners (it skipped a configuration in
/// between) still gets a change, one that changes nothing (a voter added again), so that it
/// records the newer version: otherwise a leader whose group 0 lags could still move it to the
/// configuration it skipped.
pub fn follow_change(target: &Followed, cs: &ConfState, follows: u64) -> Option<ConfChangeV2> {
    if target.version <= follows || target.joint || !cs.voters_outgoing.is_empty() {
        return None;
    }
    let mut cc = ConfChangeV2::default();
    cc.set_transition(ConfChangeTransition::Auto);
    let mut push = |id: u64, t: ConfChangeType| push_to(&mut cc, id, t);
    for &id in target.voters.iter().filter(|id| !cs.voters.contains(id)) {
        push(id, ConfChangeType::AddNode);
    }
    for &id in target
        .learners
        .iter()
        .filter(|id| !cs.learners.contains(id))
    {
        push(id, ConfChangeType::AddLearnerNode); // a new learner, or a voter demoted
    }
    let kept = |id: &&u64| !target.voters.contains(id) && !target.learners.contains(id);
    for &id in cs.voters.iter().chain(&cs.learners).filter(kept) {
        push(id, ConfChangeType::RemoveNode);
    }
    if cc.get_changes().is_empty() {
        let voter = *target.voters.first()?;
        push_to(&mut cc, voter, ConfChangeType::AddNode); // a voter already: changes nothing
    }
    let ctx = FollowContext {
        follows: target.version,
    };
    let ctx = serde_json::to_vec(&ctx).expect("a follow context serializes");
    cc.set_context(ctx.into());
    Some(cc)
}

fn push_to(cc: &mut ConfChangeV2, id: u64, t: ConfChangeType) {
    let mut c = ConfChangeSingle {
        node_id: id,
        ..Default::default()
    };
    c.set_change_type(t);
    cc.mut_changes().push(c);
}

/// The version a follow change carries; `None` for any other change (raft's own change that
/// leaves a joint configuration has no context).
pub fn version_of(cc: &ConfChangeV2) -> Option<u64> {
    serde_json::from_slice::<FollowContext>(cc.get_context())
        .ok()
        .map(|c| c.follows)
}

/// Whether a replica of a group that last followed version `follows` applies change `cc`: any
/// change that follows nothing, and a follow change only if it is newer.
pub fn admits(follows: u64, cc: &ConfChangeV2) -> bool {
    version_of(cc).is_none_or(|v| v > follows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            ..Default::default()
        }
    }

    fn target(version: u64, voters: &[u64], learners: &[u64]) -> Followed {
        Followed::of(version, &cs(voters, learners))
    }

    fn kinds(cc: &ConfChangeV2) -> Vec<(u64, ConfChangeType)> {
        let mut v: Vec<_> = cc
            .get_changes()
            .iter()
            .map(|c| (c.node_id, c.get_change_type()))
            .collect();
        v.sort_by_key(|c| c.0);
        v
    }

    #[test]
    fn a_group_is_moved_to_group_0s_configuration_in_one_change() {
        use ConfChangeType::*;
        let now = cs(&[1, 2, 3], &[]);
        let cc = follow_change(&target(9, &[1, 2, 4], &[5]), &now, 1).unwrap();
        assert_eq!(
            kinds(&cc),
            vec![(3, RemoveNode), (4, AddNode), (5, AddLearnerNode)]
        );
        assert_eq!(version_of(&cc), Some(9));
        let demote = follow_change(&target(9, &[1, 2], &[3]), &now, 1).unwrap();
        assert_eq!(kinds(&demote), vec![(3, AddLearnerNode)]);
        let promote = follow_change(&target(9, &[1, 2, 3], &[]), &cs(&[1, 2], &[3]), 1).unwrap();
        assert_eq!(kinds(&promote), vec![(3, AddNode)]);
    }

    #[test]
    fn nothing_is_proposed_that_is_not_newer_or_not_settled() {
        let now = cs(&[1, 2, 3], &[]);
        let other = target(9, &[1, 2, 4], &[]);
        assert!(follow_change(&other, &now, 9).is_none(), "already followed");
        assert!(
            follow_change(&other, &now, 12).is_none(),
            "older than followed"
        );
        let same = follow_change(&target(9, &[1, 2, 3], &[]), &now, 1).expect("a newer version");
        assert_eq!(
            kinds(&same),
            vec![(1, ConfChangeType::AddNode)],
            "changes nothing"
        );
        assert_eq!(same.enter_joint(), None, "a simple change");
        assert_eq!(version_of(&same), Some(9), "but records the version");
        let mut joint = other.clone();
        joint.joint = true;
        assert!(follow_change(&joint, &now, 1).is_none(), "group 0 is joint");
        let mut moving = now.clone();
        moving.voters_outgoing = vec![1, 2, 5];
        assert!(
            follow_change(&other, &moving, 1).is_none(),
            "this group is joint"
        );
        assert!(
            follow_change(&other, &now, 1).is_some(),
            "the positive case"
        );
    }

    #[test]
    fn a_replica_applies_only_newer_follow_changes_and_every_other_change() {
        let cc = follow_change(&target(9, &[1, 2, 4], &[]), &cs(&[1, 2, 3], &[]), 1).unwrap();
        assert!(admits(8, &cc));
        assert!(!admits(9, &cc), "the same version twice");
        assert!(!admits(12, &cc), "a lagging leader's older configuration");
        assert!(
            admits(12, &ConfChangeV2::default()),
            "raft leaving a joint config"
        );
        let mut operator = ConfChangeV2::default();
        operator.set_context(br#"{"addrs":{}}"#.to_vec().into());
        assert!(admits(12, &operator), "a change with another context");
    }

    #[test]
    fn matching_ignores_order_and_sees_a_joint_configuration() {
        let t = target(3, &[3, 1, 2], &[7]);
        assert!(t.matches(&cs(&[2, 3, 1], &[7])));
        assert!(!t.matches(&cs(&[1, 2], &[7])));
        assert!(!t.matches(&cs(&[1, 2, 3], &[])));
        let mut joint = cs(&[1, 2, 3], &[7]);
        joint.voters_outgoing = vec![1, 2, 3];
        assert!(!t.matches(&joint));
    }
}
