//! Scenario tests, each named for the hazard it covers, all in simulated time.
//!
//! Every safety scenario runs twice: as designed, where the linearizability checker must find
//! nothing, and as a negative control with one safety deliberately switched off, where the same
//! scenario and the same checker must catch a stale read. A check that cannot fail proves nothing.

use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, MessageType,
};
use raft_lease::sim::{CheckReport, Load, SimCluster, SimConfig};
use raft_lease::{LeaseState, ReadMode, UnsafeMode};

/// Seeds each scenario runs with. Safe runs must be clean on all; controls must fail on some.
const SEEDS: std::ops::Range<u64> = 0..8;

fn config(seed: u64, mode: UnsafeMode) -> SimConfig {
    let mut c = SimConfig {
        seed,
        ..SimConfig::default()
    };
    c.lease.unsafe_mode = mode;
    c
}

fn elect(sim: &mut SimCluster) -> u64 {
    assert!(
        sim.run_until(3_000, |s| s.leader().is_some()),
        "no leader elected"
    );
    sim.leader().unwrap()
}

fn others(sim: &SimCluster, node: u64) -> Vec<u64> {
    sim.ids().into_iter().filter(|&id| id != node).collect()
}

/// Runs `scenario` on every seed and returns (seed, report) pairs.
fn run_seeds(mode: UnsafeMode, scenario: impl Fn(&mut SimCluster)) -> Vec<(u64, CheckReport)> {
    run_seeds_with(|seed| config(seed, mode), scenario)
}

fn run_seeds_with(
    cfg: impl Fn(u64) -> SimConfig,
    scenario: impl Fn(&mut SimCluster),
) -> Vec<(u64, CheckReport)> {
    SEEDS
        .map(|seed| {
            let mut sim = SimCluster::new(cfg(seed));
            scenario(&mut sim);
            (seed, sim.check())
        })
        .collect()
}

/// Safe runs: no violation on any seed, and lease reads were really served and checked.
fn assert_safe(runs: &[(u64, CheckReport)]) {
    for (seed, r) in runs {
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {} violations, first: {:?}",
            r.violations.len(),
            r.violations[0]
        );
        assert!(
            r.lease_reads_checked > 0,
            "seed {seed}: no lease read was checked; the scenario proves nothing"
        );
        assert!(r.writes_acked > 0, "seed {seed}: no write was acknowledged");
    }
}

/// Negative controls: the same checker catches a stale read on at least one seed.
fn assert_caught(runs: &[(u64, CheckReport)]) -> usize {
    let caught: Vec<u64> = runs
        .iter()
        .filter(|(_, r)| r.stale_reads() > 0)
        .map(|(s, _)| *s)
        .collect();
    assert!(
        !caught.is_empty(),
        "the checker caught no stale read on any seed: the control failed to fail"
    );
    eprintln!(
        "negative control caught stale reads on seeds {caught:?} of {:?}",
        SEEDS
    );
    caught.len()
}

// ----- a partitioned old leader ----------------------------------------------------------------

fn partitioned_old_leader(sim: &mut SimCluster) {
    let leader = elect(sim);
    sim.run_with_load(300, &Load::default());
    let rest = others(sim, leader);
    sim.partition(&[leader], &rest);
    sim.run_with_load(800, &Load::default());
    sim.heal();
    sim.run_with_load(300, &Load::default());
}

#[test]
fn partitioned_old_leader_never_serves_stale_reads() {
    assert_safe(&run_seeds(UnsafeMode::Safe, partitioned_old_leader));
}

#[test]
fn control_raft_lease_based_serves_stale_reads_after_a_partition() {
    assert_caught(&run_seeds(
        UnsafeMode::RaftLeaseBased,
        partitioned_old_leader,
    ));
}

// ----- a paused leader (the GC pause) ----------------------------------------------------------

fn paused_leader(sim: &mut SimCluster) {
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

#[test]
fn paused_leader_resumes_after_lease_expiry_without_stale_reads() {
    assert_safe(&run_seeds(UnsafeMode::Safe, paused_leader));
}

#[test]
fn control_raft_lease_based_serves_stale_reads_after_a_pause() {
    let caught = assert_caught(&run_seeds(UnsafeMode::RaftLeaseBased, paused_leader));
    assert_eq!(
        caught,
        SEEDS.count(),
        "a paused LeaseBased leader is stale every time"
    );
}

// ----- a stalled tick thread (etcd-io/etcd#13527) ----------------------------------------------

fn stalled_leader_ticker(sim: &mut SimCluster) {
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

#[test]
fn stalled_leader_ticker_does_not_stretch_the_lease() {
    assert_safe(&run_seeds(UnsafeMode::Safe, stalled_leader_ticker));
}

#[test]
fn control_raft_lease_based_stretches_with_a_stalled_ticker() {
    let caught = assert_caught(&run_seeds(
        UnsafeMode::RaftLeaseBased,
        stalled_leader_ticker,
    ));
    assert_eq!(
        caught,
        SEEDS.count(),
        "a leader with no ticks never steps down"
    );
}

/// A follower's ticker stalls, then fires its missed ticks in a burst: tick-counted "lease"
/// checks expire at once although the leader was heard a moment ago. The clock-based promise does not.
fn follower_tick_burst(sim: &mut SimCluster) {
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

#[test]
fn follower_tick_burst_never_shortens_the_promise() {
    assert_safe(&run_seeds(UnsafeMode::Safe, follower_tick_burst));
}

#[test]
fn control_no_promise_is_broken_by_a_tick_burst() {
    assert_caught(&run_seeds(UnsafeMode::NoPromise, follower_tick_burst));
}

// ----- a delayed MsgTimeoutNow (tikv/raft-rs#234) ----------------------------------------------

fn delayed_timeout_now(sim: &mut SimCluster) {
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

#[test]
fn delayed_timeout_now_never_gives_two_holders() {
    let runs = run_seeds(UnsafeMode::Safe, delayed_timeout_now);
    for (seed, r) in &runs {
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}",
            r.violations.first()
        );
        assert!(
            r.reads_checked > 0 && r.writes_acked > 0,
            "seed {seed}: nothing checked"
        );
    }
}

#[test]
fn control_no_transfer_fence_gives_two_holders() {
    assert_caught(&run_seeds(UnsafeMode::NoTransferFence, delayed_timeout_now));
}

// ----- a follower restart (tikv/tikv#15035) ----------------------------------------------------

fn follower_restart(sim: &mut SimCluster) {
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

#[test]
fn restarted_follower_refuses_votes_for_p_after_boot() {
    assert_safe(&run_seeds(UnsafeMode::Safe, follower_restart));
}

#[test]
fn control_no_boot_promise_lets_a_restarted_follower_vote_at_once() {
    assert_caught(&run_seeds(UnsafeMode::NoBootPromise, follower_restart));
}

// ----- clock drift at the bound and beyond -----------------------------------------------------

/// The worst case for the lease: the leader's clock slow, the followers' fast.
fn drift_config(seed: u64, actual_ppm: i64) -> SimConfig {
    let mut c = config(seed, UnsafeMode::Safe);
    c.lease.drift_ppm = 10_000; // ρ = 1% configured
    c.drift_ppm = vec![-actual_ppm, actual_ppm, actual_ppm];
    c
}

fn partition_node_1(sim: &mut SimCluster) {
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

#[test]
fn drift_at_the_bound_is_safe() {
    assert_safe(&run_seeds_with(
        |seed| drift_config(seed, 10_000),
        partition_node_1,
    ));
}

#[test]
fn control_drift_beyond_the_bound_serves_stale_reads() {
    assert_caught(&run_seeds_with(
        |seed| drift_config(seed, 150_000),
        partition_node_1,
    ));
}

// ----- a membership change ---------------------------------------------------------------------

fn single(ty: ConfChangeType, node: u64) -> ConfChangeSingle {
    let mut s = ConfChangeSingle::default();
    s.set_change_type(ty);
    s.node_id = node;
    s
}

fn lease_state(sim: &SimCluster, node: u64) -> LeaseState {
    sim.node(node)
        .map_or(LeaseState::Expired, |n| n.lease_status().state)
}

/// Voters {1,2,3} → joint ({L,X,R}, {L,X,4}) → {L,X,4}. In the joint configuration the lease
/// needs both quorums: with only L and R answering, the old configuration alone would grant it.
#[test]
fn membership_change_reestablishes_the_lease_under_both_quorums() {
    let mut sim = SimCluster::new(SimConfig {
        nodes: 4,
        voters: Some(vec![1, 2, 3]),
        seed: 3,
        ..SimConfig::default()
    });
    let l = elect(&mut sim);
    assert!(
        sim.run_until(500, |s| lease_state(s, l).is_held()),
        "no lease before the change"
    );
    let old: Vec<u64> = [1, 2, 3].into_iter().filter(|&id| id != l).collect();
    let (x, r) = (old[0], old[1]);

    let mut cc = ConfChangeV2::default();
    cc.set_transition(ConfChangeTransition::Explicit);
    cc.set_changes(
        vec![
            single(ConfChangeType::AddNode, 4),
            single(ConfChangeType::RemoveNode, r),
        ]
        .into(),
    );
    sim.propose_conf_change(l, cc).unwrap();
    let joint = |s: &SimCluster| {
        s.node(l).is_some_and(|n| {
            !n.raw()
                .raft
                .prs()
                .conf()
                .to_conf_state()
                .voters_outgoing
                .is_empty()
        })
    };
    assert!(
        sim.run_until(500, joint),
        "joint configuration never applied"
    );
    assert_eq!(
        lease_state(&sim, l),
        LeaseState::Expired,
        "the change must drop the lease"
    );

    // Only L and R (old quorum, not a new one) can acknowledge now.
    sim.block(x, l);
    sim.block(4, l);
    sim.run_for_ms(80);
    assert!(
        sim.node(l).unwrap().is_leader(),
        "the test needs L still leading"
    );
    assert_eq!(
        lease_state(&sim, l),
        LeaseState::Expired,
        "an old-configuration quorum alone granted the lease"
    );

    sim.heal();
    assert!(
        sim.run_until(200, |s| lease_state(s, l).is_held()),
        "joint quorum never re-established the lease"
    );
    sim.propose_conf_change(l, ConfChangeV2::default()).unwrap(); // leave the joint configuration
    let left = |s: &SimCluster| {
        s.node(l).is_some_and(|n| {
            n.raw()
                .raft
                .prs()
                .conf()
                .to_conf_state()
                .voters_outgoing
                .is_empty()
        })
    };
    assert!(
        sim.run_until(500, left),
        "never left the joint configuration"
    );
    assert!(
        sim.run_until(200, |s| lease_state(s, l).is_held()),
        "new quorum never re-established the lease"
    );
    sim.run_with_load(300, &Load::default());
    let report = sim.check();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.lease_reads_checked > 0);
}

// ----- liveness and counters -------------------------------------------------------------------

#[test]
fn auto_reads_fall_back_to_read_index_while_no_lease_is_held() {
    let mut sim = SimCluster::new(config(1, UnsafeMode::Safe));
    let leader = elect(&mut sim);
    sim.run_with_load(
        200,
        &Load {
            read_mode: ReadMode::Auto,
            ..Load::default()
        },
    );
    let before = sim.node(leader).unwrap().counters();
    assert!(before.lease_reads > 0, "{before:?}");
    sim.transfer_leader(leader, others(&sim, leader)[0]); // fences the lease for this term
    sim.run_for_ms(1);
    let id = sim.get(leader, b"k0", ReadMode::Auto);
    sim.run_for_ms(50);
    let after = sim.node(leader).map(|n| n.counters());
    let op = &sim.history().ops()[id as usize];
    let report = sim.check();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    match (&op.done, after) {
        (Some((_, raft_lease::sim::OpResult::Read { served, .. })), Some(c)) => {
            assert_eq!(*served, raft_lease::ReadKind::Index);
            assert!(c.fallbacks > before.fallbacks);
        }
        (Some((_, raft_lease::sim::OpResult::Failed(e))), _) => {
            assert!(e.contains("not the leader"), "{e}")
        }
        other => panic!("the read neither finished nor failed: {other:?}"),
    }
}

#[test]
fn idle_lease_adds_no_messages_beyond_raft_heartbeats() {
    let run = |mode: UnsafeMode| {
        let mut sim = SimCluster::new(config(2, mode));
        elect(&mut sim);
        sim.run_for_ms(200);
        let before: u64 = sim.net().sent_by_type.values().sum();
        sim.run_for_ms(1_000);
        let after: u64 = sim.net().sent_by_type.values().sum();
        (after - before, sim.leader())
    };
    let (with_lease, leader) = run(UnsafeMode::Safe);
    let (raft_only, _) = run(UnsafeMode::RaftLeaseBased);
    assert!(leader.is_some());
    assert_eq!(
        with_lease, raft_only,
        "the lease must ride on raft's own heartbeats at idle"
    );
    assert!(with_lease > 0);
}
