//! Shared by the follower-lease simulator tests: the configuration, whether the followers hold
//! read leases, and a holder that receives writes late.

use raft::eraftpb::MessageType;
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
/// write late.
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
