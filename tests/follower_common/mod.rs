//! Shared by the follower-lease simulator tests: the configuration, whether the followers hold
//! read leases, and a holder that receives writes late.

use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, MessageType};
use raft_lease::config::TestingKnobs;
use raft_lease::sim::{CheckReport, DelayRule, SimCluster, SimConfig};
use raft_lease::FollowerLeases;

/// Seed `seed`, with follower leases of `G` = 40 ms (election timeout 100 ms, heartbeats 20 ms:
/// `G` between them and below half the timeout).
pub fn config(seed: u64) -> SimConfig {
    let mut c = SimConfig {
        seed,
        ..SimConfig::default()
    };
    c.lease.follower_leases = Some(FollowerLeases::new(40));
    c
}

/// Whether every follower of nodes 1 to 3 holds a read lease.
pub fn followers_hold(sim: &SimCluster) -> bool {
    let l = sim.leader();
    (1..=3)
        .filter(|&id| Some(id) != l)
        .all(|id| sim.node(id).is_some_and(|n| n.holds_read_lease()))
}

/// Appends to `slow` take 3 ms more: it acknowledges every heartbeat at once but receives each
/// write late. (Not every test file slows a holder.)
#[allow(dead_code)]
pub fn slow_appends_to(sim: &mut SimCluster, slow: u64) {
    sim.net_mut().delay(DelayRule {
        from: None,
        to: Some(slow),
        msg_type: Some(MessageType::MsgAppend),
        extra_ns: 3_000_000,
    });
}

/// A control: `run` on seeds 0 to 3 with a safety switched off (`off` sets its testing knob).
/// Returns the stale reads found over the four seeds. (Not every test file has such a control.)
#[allow(dead_code)]
pub fn stale_reads_with(
    off: fn(&mut TestingKnobs),
    run: impl Fn(SimConfig) -> CheckReport,
) -> usize {
    let stale = (0..4).map(|seed| {
        let mut c = config(seed);
        off(&mut c.lease.safeties.testing);
        run(c).stale_reads()
    });
    let stale = stale.sum();
    eprintln!("control: {stale} stale follower reads over 4 seeds");
    stale
}

/// A cluster of `c` with a leader whose two followers hold read leases: `(sim, leader, to,
/// slow)`, the followers in id order. (Not every test file uses it.)
#[allow(dead_code)]
pub fn holding_leader_and_followers(c: SimConfig) -> (SimCluster, u64, u64, u64) {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(2_000, |s| s.leader().is_some()), "no leader");
    assert!(sim.run_until(500, followers_hold), "no read leases");
    let l = sim.leader().expect("a leader");
    let mut others = (1..=3).filter(|&id| id != l);
    let (to, slow) = (others.next().unwrap(), others.next().unwrap());
    (sim, l, to, slow)
}

/// A change that changes nothing: node 1, already a voter, added as a voter again. (Not every
/// test file uses it.)
#[allow(dead_code)]
pub fn no_op_change() -> ConfChangeV2 {
    let mut single = ConfChangeSingle::default();
    single.set_change_type(ConfChangeType::AddNode);
    single.node_id = 1;
    let mut cc = ConfChangeV2::default();
    cc.set_changes(vec![single].into());
    cc
}
