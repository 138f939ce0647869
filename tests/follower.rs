//! Follower read leases in the simulator: with them on, every replica applies only up to the
//! exposed index it knows (checked at every apply), writes are still answered, and every
//! replica catches up to the leader's state once the load stops; the followers hold read leases.
//! Control: replicas that apply up to raft's commit index are caught at their first apply past
//! `E` (a holder's acknowledgement still on its way holds `E` below the commit index).

mod follower_common;

use follower_common::{
    config, followers_hold, holding_leader_and_followers, slow_appends_to, stale_reads_with,
};
use raft_lease::sim::{CheckReport, Load, SimCluster, SimConfig, Violation};

fn run(c: SimConfig) -> SimCluster {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    sim.run_with_load(400, &Load::default());
    sim.run_for_ms(200);
    sim
}

#[test]
fn replicas_apply_only_up_to_the_exposed_index_and_catch_up_when_load_stops() {
    let mut follower_reads = 0;
    for seed in 0..4 {
        let sim = run(config(seed));
        let report = sim.check();
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        assert!(
            report.writes_acked > 20,
            "seed {seed}: {} writes",
            report.writes_acked
        );
        follower_reads += report.follower_reads_checked;
        eprintln!(
            "seed {seed}: {} follower reads checked of {} reads, {} writes",
            report.follower_reads_checked, report.reads_checked, report.writes_acked
        );
        let l = sim.leader().expect("a leader");
        let leader = sim.node(l).unwrap().raw().raft.raft_log.applied;
        for id in 1..=3 {
            let node = sim.node(id).unwrap();
            let applied = node.raw().raft.raft_log.applied;
            assert_eq!(
                applied, leader,
                "seed {seed}: node {id} behind after the load stopped"
            );
            assert!(node.exposed().unwrap() >= applied, "seed {seed}: node {id}");
        }
    }
    // Any entry above applied refuses a follower read (its keys are not known yet), so under a
    // write every 5 ms on one key most are refused: some must still be served, and checked.
    assert!(
        follower_reads > 0,
        "no follower read was served and checked"
    );
}

#[test]
fn followers_hold_read_leases_while_the_leader_leads() {
    let mut sim = SimCluster::new(config(1));
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    assert!(
        sim.run_until(500, followers_hold),
        "the followers never held read leases together"
    );
}

#[test]
fn control_replicas_applying_up_to_raft_commit_are_caught() {
    let mut c = config(0);
    c.lease.safeties.testing.apply_to_commit = true;
    let report = run(c).check();
    let past = report
        .violations
        .iter()
        .filter(|v| matches!(v, Violation::AppliedPastExposed { .. }))
        .count();
    assert!(past > 0, "no apply past the exposed index was seen");
}

/// After the followers hold read leases, appends to one of them take 3 ms more: it acknowledges
/// every heartbeat at once but receives each write late. Its reads are checked.
fn run_slow_holder(c: SimConfig) -> CheckReport {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    assert!(sim.run_until(500, followers_hold), "no read leases");
    let l = sim.leader().expect("a leader");
    let slow = (1..=3).find(|&id| id != l).expect("a follower");
    slow_appends_to(&mut sim, slow);
    sim.run_with_load(400, &Load::default());
    sim.check()
}

#[test]
fn a_holder_that_receives_writes_late_never_serves_a_stale_read() {
    let mut follower_reads = 0;
    for seed in 0..4 {
        let report = run_slow_holder(config(seed));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        follower_reads += report.follower_reads_checked;
    }
    assert!(
        follower_reads > 0,
        "no follower read was served and checked"
    );
}

/// A leader that exposes up to its commit index, whatever its holders have matched: the late
/// holder serves the value before a write that was already answered.
#[test]
fn control_exposing_past_a_holder_serves_stale_follower_reads() {
    let stale = stale_reads_with(|k| k.expose_commit = true, run_slow_holder);
    assert!(stale > 0, "no stale follower read found over 4 seeds");
}

/// Followers hold read leases; appends to the follower that is not the transferee take 3 ms
/// more; the leader transfers to the other follower in the middle of the load. Returns the
/// report and whether the transferee led at the end.
fn run_transfer(c: SimConfig) -> (CheckReport, bool) {
    let (mut sim, l, to, slow) = holding_leader_and_followers(c);
    slow_appends_to(&mut sim, slow);
    sim.run_with_load(100, &Load::default());
    sim.transfer_leader(l, to);
    sim.run_with_load(400, &Load::default());
    let led = sim.leader() == Some(to);
    (sim.check(), led)
}

#[test]
fn a_transfer_waits_out_the_read_leases_and_no_holder_serves_a_stale_read() {
    let mut transferred = 0;
    for seed in 0..4 {
        let (report, led) = run_transfer(config(seed));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        transferred += usize::from(led);
    }
    assert!(transferred > 0, "no transfer completed in 4 seeds");
}

/// `MsgTimeoutNow` sent while read leases live: the transferee leads and exposes writes the
/// late holder has not received, while that holder still serves reads.
#[test]
fn control_a_transfer_that_does_not_wait_serves_stale_follower_reads() {
    let stale = stale_reads_with(|k| k.no_transfer_wait = true, |c| run_transfer(c).0);
    assert!(stale > 0, "no stale follower read found over 4 seeds");
}
