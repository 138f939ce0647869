//! Follower read leases and membership changes: a change is committed only while no read lease
//! lives, so a replica that learns it is committed also learns it is exposed. Otherwise a
//! replica can know a change is committed and be unable to apply it (applies wait for the
//! exposed index `E`), and raft-rs refuses to campaign with a committed change unapplied: if the
//! leader then goes, the replica that has the change cannot campaign, the one that lacks it
//! cannot win, and the group has no leader after every fault has healed.
//!
//! Control: `conf_with_grants` proposes the change, and goes on granting, while read leases
//! live: the group is left with no leader.
//!
//! The same holds under a leader that runs without follower leases (the setting turned on node
//! by node): it grants nothing, so what it commits is exposed, and its followers apply it.
//! Control: `ignore_plain_leaders` waits for an exposed index such a leader never sends.

mod follower_common;

use follower_common::{config, followers_hold, no_op_change, slow_appends_to};
use raft_lease::config::TestingKnobs;
use raft_lease::sim::{SimCluster, SimConfig};

/// The raft commit index `id` knows.
fn committed(sim: &SimCluster, id: u64) -> u64 {
    sim.node(id).map_or(0, |n| n.raw().raft.raft_log.committed)
}

/// Followers hold read leases; appends to `slow` take 3 ms more, so it acknowledges a new entry
/// late. The leader proposes a membership change (again and again while it is refused), and is
/// crashed as soon as the other follower knows the change is committed. Every other fault then
/// heals. Returns whether the two followers elect a leader within 3 s.
fn leader_after_change_and_crash(c: SimConfig) -> bool {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    let leader = sim.leader().expect("a leader");
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let (fast, slow) = (followers[0], followers[1]);
    assert!(sim.run_until(500, followers_hold), "no read leases");
    slow_appends_to(&mut sim, slow);
    let proposed = (0..500).any(|_| {
        let ok = sim.propose_conf_change(leader, no_op_change()).is_ok();
        if !ok {
            sim.run_for_ms(1);
        }
        ok
    });
    assert!(proposed, "the change was refused for 500 ms");
    let change_index = sim
        .node(leader)
        .expect("up")
        .raw()
        .raft
        .raft_log
        .last_index();
    let knows = |s: &SimCluster| committed(s, fast) >= change_index;
    assert!(sim.run_until(500, knows), "the change was never committed");
    sim.crash(leader);
    sim.heal();
    sim.net_mut().clear_delays();
    sim.run_until(3_000, |s| s.leader().is_some())
}

/// The seeds of 0 to 3 on which `scenario`, with `set` applied to the testing knobs, ends with
/// no leader.
fn seeds_without_a_leader(scenario: fn(SimConfig) -> bool, set: fn(&mut TestingKnobs)) -> Vec<u64> {
    let stuck = (0..4).filter(|&seed| {
        let mut c = config(seed);
        set(&mut c.lease.safeties.testing);
        !scenario(c)
    });
    let stuck: Vec<u64> = stuck.collect();
    eprintln!(
        "{} of 4 seeds left without a leader: {stuck:?}",
        stuck.len()
    );
    stuck
}

#[test]
fn a_membership_change_committed_as_the_leader_goes_leaves_a_group_that_elects() {
    let stuck = seeds_without_a_leader(leader_after_change_and_crash, |_| {});
    assert!(
        stuck.is_empty(),
        "seeds {stuck:?}: no leader after the change and the crash"
    );
}

#[test]
fn control_a_change_committed_under_read_leases_leaves_the_group_without_a_leader() {
    let stuck =
        seeds_without_a_leader(leader_after_change_and_crash, |k| k.conf_with_grants = true);
    assert!(!stuck.is_empty(), "every seed elected a leader");
}

/// Node 1 runs without follower leases and leads; nodes 2 and 3 run with them. Node 1 commits a
/// membership change and is crashed. Returns whether 2 and 3 elect a leader within 3 s: they
/// can only if they applied the change, which needs an exposed index node 1 never sends.
fn leader_after_a_plain_leader_goes(mut c: SimConfig) -> bool {
    c.follower_leases_off = vec![1];
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    let leader = sim.leader().expect("a leader");
    if leader != 1 {
        sim.transfer_leader(leader, 1);
        assert!(
            sim.run_until(2_000, |s| s.leader() == Some(1)),
            "node 1 never led"
        );
    }
    sim.run_for_ms(100);
    sim.propose_conf_change(1, no_op_change())
        .expect("no read leases to wait for");
    let change_index = sim.node(1).expect("up").raw().raft.raft_log.last_index();
    let knows = |s: &SimCluster| (2..=3).all(|id| committed(s, id) >= change_index);
    assert!(sim.run_until(500, knows), "the change was never committed");
    sim.run_for_ms(50);
    sim.crash(1);
    sim.run_until(3_000, |s| s.leader().is_some())
}

#[test]
fn replicas_under_a_leader_without_follower_leases_apply_and_can_take_over() {
    let stuck = seeds_without_a_leader(leader_after_a_plain_leader_goes, |_| {});
    assert!(
        stuck.is_empty(),
        "seeds {stuck:?}: no leader after the plain leader went"
    );
}

#[test]
fn control_replicas_waiting_for_a_plain_leaders_exposed_index_elect_no_one() {
    let stuck = seeds_without_a_leader(leader_after_a_plain_leader_goes, |k| {
        k.ignore_plain_leaders = true
    });
    assert!(!stuck.is_empty(), "every seed elected a leader");
}
