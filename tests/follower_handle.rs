//! Follower reads through a [`raft_lease::ReadHandle`], as an application thread makes them:
//! with follower leases on, a follower's handle serves reads under its read lease, and waits
//! for any pending entry that writes a key to be applied. A holder that receives writes late
//! (appends to it take 3 ms more) has entries pending that the leader already exposed and
//! answered; its handle reads are checked by the linearizability checker.
//! Control: a follower that ignores its pending entries serves stale reads.

mod follower_common;

use follower_common::{config, followers_hold, slow_appends_to, stale_reads_with};
use raft_lease::sim::{CheckReport, OpResult, SimCluster, SimConfig};

/// Reads through both followers' handles every millisecond for 400 ms, a write every 5 ms,
/// appends to one follower 3 ms late. Returns the check and the handle reads served at
/// followers.
fn run_handle_reads(c: SimConfig) -> (CheckReport, usize) {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    let leader = sim.leader().expect("a leader");
    let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    assert!(sim.run_until(500, followers_hold), "no read leases");
    slow_appends_to(&mut sim, followers[0]);
    for ms in 0..400 {
        if ms % 5 == 0 {
            sim.put(leader, b"k");
        }
        for &f in &followers {
            sim.handle_get(f, b"k");
        }
        sim.run_for_ms(1);
    }
    let served = sim.history().ops().iter().filter(|op| {
        followers.contains(&op.node) && matches!(op.done, Some((_, OpResult::Read { .. })))
    });
    (sim.check(), served.count())
}

#[test]
fn a_followers_read_handle_serves_under_its_read_lease_and_never_a_stale_read() {
    let mut served = 0;
    for seed in 0..4 {
        let (report, n) = run_handle_reads(config(seed));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        served += n;
    }
    eprintln!("{served} handle reads served at followers over 4 seeds");
    assert!(served > 0, "no follower handle read was served");
}

#[test]
fn control_a_follower_ignoring_its_pending_entries_serves_stale_reads() {
    let stale = stale_reads_with(|k| k.ignore_pending_keys = true, |c| run_handle_reads(c).0);
    assert!(stale > 0, "no stale follower read found over 4 seeds");
}
