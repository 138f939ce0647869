//! Fault scenarios, each named for the hazard it covers, for the tests, the demo and your own store.
//!
//! Each takes a fresh [`SimCluster`] and drives it through the hazard under a steady client
//! [`Load`]; then [`SimCluster::check`] tells whether any read was stale. Run each with the safety
//! on and, as a negative control, with it switched off: see [`Scenario::control`].

use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, MessageType};

use crate::config::{Safeties, TestingKnobs};
use crate::read::ReadMode;
use crate::sim::{DelayRule, Load, SimCluster, SimConfig};

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
    /// Changes to the default cluster config the hazard needs.
    pub configure: fn(&mut SimConfig),
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
    fn new(
        name: &'static str,
        hazard: &'static str,
        control: Control,
        run: fn(&mut SimCluster),
    ) -> Self {
        Scenario {
            name,
            hazard,
            control,
            run,
            configure: |_| {},
        }
    }

    fn configured(self, configure: fn(&mut SimConfig)) -> Self {
        Scenario { configure, ..self }
    }

    /// The cluster config for `seed`, with the safety on (`safe`) or switched off.
    pub fn config(&self, seed: u64, safe: bool) -> SimConfig {
        let mut c = self.control_config(seed, safe);
        (self.configure)(&mut c);
        c
    }

    fn control_config(&self, seed: u64, safe: bool) -> SimConfig {
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
    let raft_lease_based = Control::Safeties(Safeties::raft_lease_based());
    vec![
        Scenario::new(
            "partitioned old leader",
            "raft-rs LeaseBased trusts tick-based check-quorum",
            raft_lease_based,
            partitioned_old_leader,
        ),
        Scenario::new(
            "paused leader",
            "a paused LeaseBased leader serves reads on resume",
            raft_lease_based,
            paused_leader,
        ),
        Scenario::new(
            "stalled leader ticker",
            "no ticks, no step-down (etcd-io/etcd#13527)",
            raft_lease_based,
            stalled_leader_ticker,
        ),
        Scenario::new(
            "follower tick burst",
            "a tick-counted promise shrinks in a burst",
            Control::Safeties(knob(|k| k.no_promise = true)),
            follower_tick_burst,
        ),
        Scenario::new(
            "own campaign in a burst",
            "a promising node votes for itself",
            Control::Safeties(knob(|k| k.no_campaign_hold = true)),
            follower_tick_burst,
        ),
        Scenario::new(
            "delayed MsgTimeoutNow",
            "a late forced election (tikv/raft-rs#234)",
            Control::Safeties(knob(|k| k.no_transfer_fence = true)),
            delayed_timeout_now,
        ),
        Scenario::new(
            "transfer given up after MsgTimeoutNow left",
            "a late forced election after the fence was lifted",
            Control::Safeties(knob(|k| k.lift_fence_after_timeout_now = true)),
            delayed_timeout_now,
        ),
        Scenario::new(
            "follower restart",
            "a restarted node forgets its promise (tikv/tikv#15035)",
            Control::Safeties(knob(|k| k.no_boot_promise = true)),
            follower_restart,
        ),
        Scenario::new(
            "clock drift",
            "clocks drift beyond the bound",
            Control::DriftBeyondBound,
            partition_node_1,
        ),
        Scenario::new(
            "re-sent read context after a ticker stall",
            "a late ack of a context's first copy credited with a later copy's t0",
            Control::Safeties(knob(|k| k.remap_retired_ctx = true)),
            stalled_leader_resends_a_retired_read_context,
        )
        .configured(long_check_quorum),
        Scenario::new(
            "read round retried under its first context",
            "a held ack of the first attempt answers reads started later (etcd-io/etcd#21399)",
            Control::Safeties(knob(|k| k.reuse_read_ctx_on_retry = true)),
            held_ack_answers_a_retried_read_round,
        ),
        Scenario::new(
            "followers with a shorter promise",
            "a leader counts its own P on followers that promised less (a rolling change)",
            Control::Safeties(knob(|k| k.count_own_promise = true)),
            partition_node_1,
        )
        .configured(|c| c.promise_ms_per_node = vec![100, 40, 40]),
        Scenario::new(
            "followers restarted with a shorter promise",
            "a node restarted with a shorter P forgets the longer promise it made",
            Control::Safeties(knob(|k| k.count_own_promise = true)),
            followers_restart_with_a_shorter_promise,
        ),
        Scenario::new(
            "removed leader",
            "a leader that removed itself renews its lease from its own clock",
            Control::Safeties(knob(|k| {
                k.keep_removed_leader = true;
                k.renew_any_singleton = true;
            })),
            removed_leader_keeps_leading,
        ),
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

/// Node 1 leads with a lease its followers acknowledged under `P` = 100 ms; it is cut off, and
/// both followers restart at once with `P` = 40 ms (a rolling change of the setting, done too
/// fast): unless they keep the longer promise they made, they elect one of them and write while
/// node 1 still serves lease reads.
pub fn followers_restart_with_a_shorter_promise(sim: &mut SimCluster) {
    lead_from(sim, 1);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, 1);
    sim.partition(&[1], &rest);
    for &n in &rest {
        sim.crash(n);
        sim.set_promise_ms(n, 40);
        sim.restart(n);
    }
    sim.run_with_load(600, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

/// Elect a leader and move leadership to `node` if another node won.
pub fn lead_from(sim: &mut SimCluster, node: u64) {
    for _ in 0..10 {
        let leader = elect(sim);
        if leader == node {
            return;
        }
        sim.transfer_leader(leader, node);
        sim.run_until(1_000, |s| s.leader() == Some(node));
    }
    assert_eq!(sim.leader(), Some(node), "node {node} never took over");
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

fn single(ty: ConfChangeType, node: u64) -> ConfChangeSingle {
    let mut s = ConfChangeSingle::default();
    s.set_change_type(ty);
    s.node_id = node;
    s
}

/// A membership change of one step.
pub fn conf_change(ty: ConfChangeType, node: u64) -> ConfChangeV2 {
    let mut cc = ConfChangeV2::default();
    cc.set_changes(vec![single(ty, node)].into());
    cc
}

/// Propose `cc` through `leader` and wait (up to 1 s) until `leader` has applied a
/// configuration that satisfies `applied`. Panics if it never does.
pub fn change_membership(
    sim: &mut SimCluster,
    leader: u64,
    cc: ConfChangeV2,
    applied: impl Fn(&raft::eraftpb::ConfState) -> bool,
) {
    sim.propose_conf_change(leader, cc)
        .unwrap_or_else(|e| panic!("conf change refused: {e}"));
    let done = sim.run_until(1_000, |s| {
        s.conf_state(leader).is_some_and(|cs| applied(&cs))
    });
    assert!(done, "the membership change never applied on {leader}");
}

/// An election timeout of 300 ms (P stays 100 ms): a leader's ticker can stall for most of it
/// without two check-quorum rounds firing in the burst that follows.
pub fn long_check_quorum(c: &mut SimConfig) {
    c.election_tick = 30;
    c.election_spread_ticks = 15;
}

/// The leader sends a ReadIndex context, then its ticker stalls while it is cut off, with one
/// follower's heartbeat responses delayed past the stall. raft-rs re-sends the pending context
/// when the ticker runs again, after the context's round was pruned; the follower's late ack of
/// the *first* copy then arrives. Credited to a new round, it would stretch the lease past
/// that follower's promise while the other two elect a new leader.
pub fn stalled_leader_resends_a_retired_read_context(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    let (f1, f2) = (rest[0], rest[1]);
    sim.partition(&[leader], &[f1]);
    sim.net_mut().delay(DelayRule {
        from: Some(f2),
        to: Some(leader),
        msg_type: Some(MessageType::MsgHeartbeatResponse),
        extra_ns: 350_000_000,
    });
    sim.run_with_load(400, &Load::default());
    sim.get(leader, b"k0", ReadMode::ReadIndex);
    sim.run_for_ms(3); // the context's first copy reaches f2, which answers (late)
    sim.block(leader, f2);
    sim.stall_ticks(leader, true);
    // Writes still reach the leader: each stamp prunes the context's round once it is old.
    sim.run_with_load(290, &Load::default());
    sim.stall_ticks(leader, false); // the burst re-sends the pending context
    sim.run_with_load(400, &Load::default());
    sim.heal();
    sim.net_mut().clear_delays();
    sim.run_with_load(300, &Load::default());
}

/// The leader's ReadIndex round goes out while one follower's heartbeat responses are held up
/// (350 ms) and the other follower is cut off; then the leader's messages stop reaching anyone,
/// and everything that follower sends it is held up as long. The followers elect a new leader,
/// which writes. The old leader hears of it only late, so it still leads (the held responses
/// keep its check-quorum content) and keeps retrying its unanswered round, and reads started
/// there after the write join the retry. Under a new context nothing answers them until the old
/// leader steps down. Under the first attempt's context (raft-rs ignores a context still
/// pending), the held response to its first copy answers them at the old read index: stale.
pub fn held_ack_answers_a_retried_read_round(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    let (f1, f2) = (rest[0], rest[1]);
    sim.partition(&[leader], &[f2]);
    let mut held = DelayRule {
        from: Some(f1),
        to: Some(leader),
        msg_type: Some(MessageType::MsgHeartbeatResponse),
        extra_ns: 350_000_000,
    };
    sim.net_mut().delay(held);
    // Held responses now arrive steadily, each 350 ms late: no lease, but check-quorum content.
    sim.run_with_load(400, &Load::default());
    sim.get(leader, b"k0", ReadMode::ReadIndex);
    sim.run_for_ms(3); // the round's first copy reaches f1, which answers (late)
    sim.block(leader, f1);
    held.msg_type = None; // the new leader's messages too
    sim.net_mut().delay(held);
    let index_reads = Load {
        read_mode: ReadMode::ReadIndex,
        ..Load::default()
    };
    sim.run_with_load(450, &index_reads);
    sim.heal();
    sim.net_mut().clear_delays();
    sim.run_with_load(300, &Load::default());
}

/// Voters {L, A, B}: B is removed, then L tries to remove itself, leaving {A}. The node refuses;
/// where it is let through and L left leading (raft-rs's own behaviour), L, cut off from A,
/// must still not renew its lease from its own clock: it is not the one voter. A's promise
/// ends, A elects itself and takes writes.
pub fn removed_leader_keeps_leading(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    let (a, b) = (rest[0], rest[1]);
    change_membership(
        sim,
        leader,
        conf_change(ConfChangeType::RemoveNode, b),
        |cs| !cs.voters.contains(&b),
    );
    if sim
        .propose_conf_change(leader, conf_change(ConfChangeType::RemoveNode, leader))
        .is_ok()
    {
        let removed = sim.run_until(1_000, |s| {
            s.conf_state(leader).is_some_and(|cs| cs.voters == [a])
        });
        assert!(removed, "the leader's removal never applied");
    }
    sim.run_with_load(200, &Load::default());
    sim.partition(&[leader], &[a, b]);
    sim.run_with_load(600, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}
