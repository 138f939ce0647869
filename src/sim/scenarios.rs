//! Fault scenarios, each named for the hazard it covers, for the tests, the demo and your own store.
//!
//! Each takes a fresh [`SimCluster`] and drives it through the hazard under a steady client
//! [`Load`]; then [`SimCluster::check`] tells whether any read was stale. Run each with the safety
//! on and, as a negative control, with it switched off: see [`Scenario::control`].

use raft::eraftpb::MessageType;

use crate::config::{Safeties, TestingKnobs};
use crate::read::ReadMode;
use crate::sim::{Load, SimCluster, SimConfig};

/// Elect a leader (within 3 s of simulated time) and return it. Panics if none is elected.
pub fn elect(sim: &mut SimCluster) -> u64 {
    assert!(
        sim.run_until(3_000, |s| s.leader().is_some()),
        "no leader elected"
    );
    sim.leader().expect("checked")
}

/// Every node but `node`.
pub fn others(sim: &SimCluster, node: u64) -> Vec<u64> {
    sim.ids().into_iter().filter(|&id| id != node).collect()
}

/// The worst case for the lease: node 1's clock slow by `actual_ppm`, the others fast by as much,
/// with the configured bound ρ = 1%. At the bound it is safe; beyond it, it is not.
pub fn drift_config(seed: u64, actual_ppm: i64) -> SimConfig {
    let mut c = SimConfig {
        seed,
        ..SimConfig::default()
    };
    c.lease.drift_ppm = 10_000;
    c.drift_ppm = vec![-actual_ppm, actual_ppm, actual_ppm];
    c
}

/// A hazard and how to switch its safety off.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Short name.
    pub name: &'static str,
    /// What goes wrong without the safety.
    pub hazard: &'static str,
    /// The negative control: which safety is switched off.
    pub control: Control,
    /// Drive the cluster through the hazard.
    pub run: fn(&mut SimCluster),
}

/// How a negative control breaks the safety.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Run the nodes with these safeties (one switched off).
    Safeties(Safeties),
    /// Let clocks drift at 30% while the lease assumes 1%.
    DriftBeyondBound,
}

impl Scenario {
    /// The cluster config for `seed`, with the safety on (`safe`) or switched off.
    pub fn config(&self, seed: u64, safe: bool) -> SimConfig {
        match (self.control, safe) {
            (Control::DriftBeyondBound, true) => drift_config(seed, 10_000),
            (Control::DriftBeyondBound, false) => drift_config(seed, 300_000),
            (Control::Safeties(control), safe) => {
                let mut c = SimConfig {
                    seed,
                    ..SimConfig::default()
                };
                c.lease.safeties = if safe { Safeties::default() } else { control };
                c
            }
        }
    }

    /// Run on a fresh cluster and check the history.
    pub fn check(&self, seed: u64, safe: bool) -> crate::sim::CheckReport {
        let mut sim = SimCluster::new(self.config(seed, safe));
        (self.run)(&mut sim);
        sim.check()
    }
}

/// Safeties with one testing knob switched.
pub fn knob(set: fn(&mut TestingKnobs)) -> Safeties {
    let mut s = Safeties::default();
    set(&mut s.testing);
    s
}

/// Every scenario with a negative control.
pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "partitioned old leader",
            hazard: "raft-rs LeaseBased trusts tick-based check-quorum",
            control: Control::Safeties(Safeties::raft_lease_based()),
            run: partitioned_old_leader,
        },
        Scenario {
            name: "paused leader",
            hazard: "a paused LeaseBased leader serves reads on resume",
            control: Control::Safeties(Safeties::raft_lease_based()),
            run: paused_leader,
        },
        Scenario {
            name: "stalled leader ticker",
            hazard: "no ticks, no step-down (etcd-io/etcd#13527)",
            control: Control::Safeties(Safeties::raft_lease_based()),
            run: stalled_leader_ticker,
        },
        Scenario {
            name: "follower tick burst",
            hazard: "a tick-counted promise shrinks in a burst",
            control: Control::Safeties(knob(|k| k.no_promise = true)),
            run: follower_tick_burst,
        },
        Scenario {
            name: "own campaign in a burst",
            hazard: "a promising node votes for itself",
            control: Control::Safeties(knob(|k| k.no_campaign_hold = true)),
            run: follower_tick_burst,
        },
        Scenario {
            name: "delayed MsgTimeoutNow",
            hazard: "a late forced election (tikv/raft-rs#234)",
            control: Control::Safeties(knob(|k| k.no_transfer_fence = true)),
            run: delayed_timeout_now,
        },
        Scenario {
            name: "follower restart",
            hazard: "a restarted node forgets its promise (tikv/tikv#15035)",
            control: Control::Safeties(knob(|k| k.no_boot_promise = true)),
            run: follower_restart,
        },
        Scenario {
            name: "clock drift",
            hazard: "clocks drift beyond the bound",
            control: Control::DriftBeyondBound,
            run: partition_node_1,
        },
    ]
}

/// The leader is cut off from everyone; the others elect a new leader and write while clients keep
/// reading from the old one.
pub fn partitioned_old_leader(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    sim.partition(&[leader], &rest);
    sim.run_with_load(800, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// The leader is paused (a GC pause, `SIGSTOP`) past its lease; a new leader writes; on resume a
/// client that was waiting reads from the old leader before it hears of the new term.
pub fn paused_leader(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    sim.pause(leader);
    sim.run_with_load(600, &Load::default()); // a new leader is elected and writes
    sim.resume_clients_first(leader);
    for _ in 0..5 {
        sim.get(leader, b"k0", ReadMode::Lease); // a client was waiting on the paused leader
        sim.handle_get(leader, b"k0");
    }
    sim.run_with_load(300, &Load::default());
}

/// The leader's tick thread stalls (etcd-io/etcd#13527) while it is partitioned: tick-based
/// check-quorum never steps it down. The clock runs on.
pub fn stalled_leader_ticker(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    sim.stall_ticks(leader, true);
    let rest = others(sim, leader);
    sim.partition(&[leader], &rest);
    sim.run_with_load(800, &Load::default());
    sim.stall_ticks(leader, false);
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// A follower's ticker stalls, then fires its missed ticks in a burst: tick-counted "lease"
/// checks expire at once although the leader was heard a moment ago. The clock-based promise does not.
pub fn follower_tick_burst(sim: &mut SimCluster) {
    let leader = elect(sim);
    let rest = others(sim, leader);
    let (b, c) = (rest[0], rest[1]);
    sim.partition(&[leader], &[b]); // b keeps campaigning; c keeps following the leader
    sim.run_with_load(300, &Load::default());
    sim.stall_ticks(c, true);
    sim.run_with_load(300, &Load::default());
    sim.partition(&[leader], &[c]); // the leader is now isolated, its lease acked by c
    sim.stall_ticks(c, false); // the burst
    sim.run_with_load(500, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// A `MsgTimeoutNow` is delayed past the transfer's timeout (tikv/raft-rs#234). The old leader keeps
/// leading, then the late message starts a forced election while replies to the old leader are cut.
pub fn delayed_timeout_now(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    let (target, other) = (rest[0], rest[1]);
    sim.net_mut()
        .delay_type(MessageType::MsgTimeoutNow, 250_000_000);
    sim.transfer_leader(leader, target);
    // The transfer times out; the old leader keeps leading and renewing in its term.
    sim.run_with_load(200, &Load::default());
    // Replies to the old leader are cut, but its messages still reach the target, so the late
    // MsgTimeoutNow arrives and starts a forced election.
    sim.block(target, leader);
    sim.block(other, leader);
    sim.block(leader, other);
    sim.run_with_load(600, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// A follower whose acknowledgements hold the lease restarts and forgets its promise
/// (tikv/tikv#15035), while a candidate with an up-to-date log is campaigning.
pub fn follower_restart(sim: &mut SimCluster) {
    let leader = elect(sim);
    let rest = others(sim, leader);
    let (b, c) = (rest[0], rest[1]);
    sim.run_with_load(300, &Load::default());
    // The lease rests on c's acknowledgements. No writes meanwhile, so b's log stays up to date.
    sim.partition(&[leader], &[b]);
    sim.run_with_load(
        400,
        &Load {
            write_every_us: 0,
            ..Load::default()
        },
    );
    sim.partition(&[leader], &[c]);
    sim.crash(c);
    sim.restart(c); // forgets its promise; b is campaigning
    sim.run_with_load(600, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// Node 1 (give it the slow clock) leads, then is partitioned; see [`drift_config`].
pub fn partition_node_1(sim: &mut SimCluster) {
    assert!(sim.run_until(3_000, |s| s.leader().is_some()));
    // Make node 1 (the slow clock) the leader.
    if sim.leader() != Some(1) {
        let l = sim.leader().unwrap();
        sim.transfer_leader(l, 1);
        assert!(
            sim.run_until(3_000, |s| s.leader() == Some(1)),
            "transfer to node 1 failed"
        );
    }
    sim.run_with_load(400, &Load::default());
    sim.partition(&[1], &[2, 3]);
    sim.run_with_load(800, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}
