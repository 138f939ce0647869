//! Scenario tests, each named for the hazard it covers, all in simulated time.
//!
//! Every safety scenario runs twice: as designed, where the linearizability checker must find
//! nothing, and as a negative control with one safety deliberately switched off, where the same
//! scenario and the same checker must catch a stale read. A check that cannot fail proves nothing.
//! The scenarios themselves live in `raft_lease::sim::scenarios`.

use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2};

use raft_lease::sim::scenarios::{self, elect, others, Scenario};
use raft_lease::sim::{CheckReport, Load, SimCluster, SimConfig};
use raft_lease::{LeaseState, ReadMode, Safeties};

/// Seeds each scenario runs with. Safe runs must be clean on all; controls must fail on some.
const SEEDS: std::ops::Range<u64> = 0..8;

fn config(seed: u64, safeties: Safeties) -> SimConfig {
    let mut c = SimConfig {
        seed,
        ..SimConfig::default()
    };
    c.lease.safeties = safeties;
    c
}

fn scenario(name: &str) -> Scenario {
    scenarios::all()
        .into_iter()
        .find(|s| s.name == name)
        .expect("known scenario")
}

fn run_seeds(name: &str, safe: bool) -> Vec<(u64, CheckReport)> {
    let s = scenario(name);
    SEEDS.map(|seed| (seed, s.check(seed, safe))).collect()
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
            r.reads_checked > 0,
            "seed {seed}: no read was checked; the scenario proves nothing"
        );
        assert!(r.writes_acked > 0, "seed {seed}: no write was acknowledged");
    }
}

/// Safe runs of a scenario where the lease serves reads before the fault.
fn assert_safe_with_lease_reads(runs: &[(u64, CheckReport)]) {
    assert_safe(runs);
    for (seed, r) in runs {
        assert!(
            r.lease_reads_checked > 0,
            "seed {seed}: no lease read was checked"
        );
    }
}

/// Negative controls: the same checks (stale reads, or the lease monitor's overlaps) catch the
/// control on at least one seed. Returns on how many seeds.
fn assert_caught(runs: &[(u64, CheckReport)]) -> usize {
    let caught: Vec<u64> = runs
        .iter()
        .filter(|(_, r)| r.unsafe_found())
        .map(|(s, _)| *s)
        .collect();
    assert!(
        !caught.is_empty(),
        "no stale read and no lease overlap on any seed: the control failed to fail"
    );
    let stale: Vec<u64> = runs
        .iter()
        .filter(|(_, r)| r.stale_reads() > 0)
        .map(|(s, _)| *s)
        .collect();
    eprintln!(
        "negative control caught on seeds {caught:?} of {SEEDS:?} (stale reads on {stale:?})"
    );
    caught.len()
}

#[test]
fn every_scenario_has_a_negative_control() {
    let all = scenarios::all();
    assert_eq!(all.len(), 14);
    for s in &all {
        assert!(
            !matches!(s.control, scenarios::Control::Safeties(c) if c.all_on()),
            "{} has no control",
            s.name
        );
    }
}

#[test]
fn partitioned_old_leader_never_serves_stale_reads() {
    assert_safe_with_lease_reads(&run_seeds("partitioned old leader", true));
}

#[test]
fn control_raft_lease_based_serves_stale_reads_after_a_partition() {
    assert_caught(&run_seeds("partitioned old leader", false));
}

#[test]
fn paused_leader_resumes_after_lease_expiry_without_stale_reads() {
    assert_safe_with_lease_reads(&run_seeds("paused leader", true));
}

#[test]
fn control_raft_lease_based_serves_stale_reads_after_a_pause() {
    let caught = assert_caught(&run_seeds("paused leader", false));
    assert_eq!(
        caught,
        SEEDS.count(),
        "a paused LeaseBased leader is stale every time"
    );
}

#[test]
fn stalled_leader_ticker_does_not_stretch_the_lease() {
    assert_safe_with_lease_reads(&run_seeds("stalled leader ticker", true));
}

#[test]
fn control_raft_lease_based_stretches_with_a_stalled_ticker() {
    let caught = assert_caught(&run_seeds("stalled leader ticker", false));
    assert_eq!(
        caught,
        SEEDS.count(),
        "a leader with no ticks never steps down"
    );
}

#[test]
fn follower_tick_burst_never_shortens_the_promise() {
    assert_safe_with_lease_reads(&run_seeds("follower tick burst", true));
}

#[test]
fn control_no_promise_is_broken_by_a_tick_burst() {
    assert_caught(&run_seeds("follower tick burst", false));
}

#[test]
fn control_no_campaign_hold_lets_a_promising_node_vote_for_itself() {
    // The safe run is `follower_tick_burst_never_shortens_the_promise`: the same scenario.
    assert_caught(&run_seeds("own campaign in a burst", false));
}

#[test]
fn delayed_timeout_now_never_gives_two_holders() {
    // The transfer fences the lease for the rest of the term, so reads there go to ReadIndex.
    assert_safe(&run_seeds("delayed MsgTimeoutNow", true));
}

#[test]
fn control_no_transfer_fence_gives_two_holders() {
    assert_caught(&run_seeds("delayed MsgTimeoutNow", false));
}

#[test]
fn control_lifting_the_fence_after_timeout_now_left_gives_two_holders() {
    // The safe run is `delayed_timeout_now_never_gives_two_holders`: the same scenario, where
    // the leader steps down when raft gives the transfer up.
    assert_caught(&run_seeds(
        "transfer given up after MsgTimeoutNow left",
        false,
    ));
}

#[test]
fn restarted_follower_refuses_votes_for_p_after_boot() {
    assert_safe_with_lease_reads(&run_seeds("follower restart", true));
}

#[test]
fn control_no_boot_promise_lets_a_restarted_follower_vote_at_once() {
    assert_caught(&run_seeds("follower restart", false));
}

#[test]
fn drift_at_the_bound_is_safe() {
    assert_safe_with_lease_reads(&run_seeds("clock drift", true));
}

#[test]
fn control_drift_beyond_the_bound_serves_stale_reads() {
    assert_caught(&run_seeds("clock drift", false));
}

#[test]
fn a_leader_counts_the_shorter_promise_its_followers_made() {
    assert_safe_with_lease_reads(&run_seeds("followers with a shorter promise", true));
}

#[test]
fn control_a_leader_counting_its_own_promise_serves_stale_reads() {
    assert_caught(&run_seeds("followers with a shorter promise", false));
}

#[test]
fn followers_restarted_with_a_shorter_promise_keep_the_longer_one_at_boot() {
    assert_safe_with_lease_reads(&run_seeds(
        "followers restarted with a shorter promise",
        true,
    ));
}

#[test]
fn control_followers_restarted_with_a_shorter_promise_forget_it_and_serve_stale_reads() {
    assert_caught(&run_seeds(
        "followers restarted with a shorter promise",
        false,
    ));
}

#[test]
fn a_resent_read_context_never_credits_a_later_t0() {
    assert_safe(&run_seeds(
        "re-sent read context after a ticker stall",
        true,
    ));
}

#[test]
fn control_a_retired_context_remapped_to_a_new_round_outlives_the_promise() {
    assert_caught(&run_seeds(
        "re-sent read context after a ticker stall",
        false,
    ));
}

#[test]
fn a_retried_read_round_is_never_answered_by_its_first_attempt() {
    assert_safe_with_lease_reads(&run_seeds(
        "read round retried under its first context",
        true,
    ));
}

#[test]
fn control_a_read_round_retried_under_its_first_context_serves_stale_reads() {
    let runs = run_seeds("read round retried under its first context", false);
    assert_caught(&runs);
    assert!(
        runs.iter().any(|(_, r)| r.stale_reads() > 0),
        "the first attempt's acknowledgement answered no read started later"
    );
}

#[test]
fn a_removed_leader_never_renews_its_own_lease() {
    assert_safe_with_lease_reads(&run_seeds("removed leader", true));
}

#[test]
fn a_removed_leader_left_leading_still_never_renews_its_own_lease() {
    // raft-rs's own handling (the leader may remove itself and keeps leading), with the
    // sole-voter check on: the lease then rests on the remaining voter's acks alone.
    let s = scenario("removed leader");
    for seed in SEEDS {
        let mut c = s.config(seed, true);
        c.lease.safeties.testing.keep_removed_leader = true;
        let mut sim = SimCluster::new(c);
        (s.run)(&mut sim);
        let r = sim.check();
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:?}",
            r.violations[0]
        );
    }
}

#[test]
fn control_a_removed_leader_renewing_from_its_own_clock_serves_stale_reads() {
    let runs = run_seeds("removed leader", false);
    assert_caught(&runs);
    assert!(
        runs.iter().any(|(_, r)| r.stale_reads() > 0),
        "the bug served stale lease reads"
    );
}

#[test]
fn a_transfer_raft_ignores_costs_no_lease_and_a_real_one_fences() {
    let cfg = SimConfig {
        nodes: 4,
        voters: Some(vec![1, 2, 3]),
        seed: 5,
        ..SimConfig::default()
    };
    let mut sim = SimCluster::new(cfg);
    let l = elect(&mut sim);
    scenarios::change_membership(
        &mut sim,
        l,
        scenarios::conf_change(ConfChangeType::AddLearnerNode, 4),
        |cs| cs.learners.contains(&4),
    );
    assert!(sim.run_until(500, |s| lease_state(s, l).is_held()));
    sim.transfer_leader(l, l); // to itself: raft ignores it
    sim.transfer_leader(l, 4); // to a learner: raft ignores it
    sim.run_for_ms(50);
    let status = sim.node(l).unwrap().lease_status();
    assert!(
        status.state.is_held() && !status.fenced,
        "an ignored transfer fenced: {status:?}"
    );
    let to = others(&sim, l).into_iter().find(|&n| n != 4).unwrap();
    sim.net_mut()
        .delay_type(raft::eraftpb::MessageType::MsgTimeoutNow, 500_000_000);
    sim.transfer_leader(l, to);
    let status = sim.node(l).unwrap().lease_status();
    assert!(
        status.fenced && !status.state.is_held(),
        "a real transfer must fence: {status:?}"
    );
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
    let cfg = SimConfig {
        nodes: 4,
        voters: Some(vec![1, 2, 3]),
        seed: 3,
        ..SimConfig::default()
    };
    let mut sim = SimCluster::new(cfg);
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
    assert!(
        sim.run_until(500, |s| is_joint(s, l)),
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
    let state = lease_state(&sim, l);
    assert_eq!(
        state,
        LeaseState::Expired,
        "an old-configuration quorum alone granted the lease"
    );

    sim.heal();
    assert!(
        sim.run_until(200, |s| lease_state(s, l).is_held()),
        "joint quorum never re-established the lease"
    );
    sim.propose_conf_change(l, ConfChangeV2::default()).unwrap(); // leave the joint configuration
    assert!(
        sim.run_until(500, |s| !is_joint(s, l)),
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

fn is_joint(sim: &SimCluster, node: u64) -> bool {
    let conf = sim
        .node(node)
        .map(|n| n.raw().raft.prs().conf().to_conf_state());
    conf.is_some_and(|cs| !cs.voters_outgoing.is_empty())
}

// ----- liveness and counters -------------------------------------------------------------------

#[test]
fn auto_reads_fall_back_to_read_index_while_no_lease_is_held() {
    let mut sim = SimCluster::new(config(1, Safeties::default()));
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
    let run = |safeties: Safeties| {
        let mut sim = SimCluster::new(config(2, safeties));
        elect(&mut sim);
        sim.run_for_ms(200);
        let before: u64 = sim.net().sent_by_type.values().sum();
        sim.run_for_ms(1_000);
        let after: u64 = sim.net().sent_by_type.values().sum();
        (after - before, sim.leader())
    };
    let (with_lease, leader) = run(Safeties::default());
    let (raft_only, _) = run(Safeties::raft_lease_based());
    assert!(leader.is_some());
    assert_eq!(
        with_lease, raft_only,
        "the lease must ride on raft's own heartbeats at idle"
    );
    assert!(with_lease > 0);
}

// ----- a transfer raft gives up ----------------------------------------------------------------

fn term_of(sim: &SimCluster, node: u64) -> u64 {
    sim.node(node).map_or(0, |n| n.raw().raft.term)
}

/// A transfer to a follower that is down and behind: raft sends it appends, never
/// `MsgTimeoutNow`, and gives the transfer up after an election timeout. Nothing can force an
/// election, so the fence is lifted and the same leader leases again in the same term (before
/// the fix it stayed fenced for a term that need never end).
#[test]
fn a_transfer_given_up_before_timeout_now_left_lifts_the_fence() {
    for seed in SEEDS {
        let mut sim = SimCluster::new(config(seed, Safeties::default()));
        let l = elect(&mut sim);
        sim.run_with_load(300, &Load::default());
        let to = others(&sim, l)[0];
        sim.crash(to);
        sim.run_with_load(200, &Load::default()); // writes the crashed node lacks
        let term = term_of(&sim, l);
        sim.transfer_leader(l, to);
        assert!(
            sim.node(l).unwrap().lease_status().fenced,
            "seed {seed}: not fenced"
        );
        let leased_again = |s: &SimCluster| {
            let status = s.node(l).unwrap().lease_status();
            status.state.is_held() && !status.fenced
        };
        assert!(
            sim.run_until(2_000, leased_again),
            "seed {seed}: still fenced 2 s after the transfer: {:?}",
            sim.node(l).unwrap().lease_status()
        );
        assert_eq!(sim.leader(), Some(l), "seed {seed}");
        assert_eq!(term_of(&sim, l), term, "seed {seed}: the term changed");
        sim.restart(to);
        sim.run_with_load(500, &Load::default());
        let r = sim.check();
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
}

/// A transfer whose `MsgTimeoutNow` left but is held up in the network: raft gives the transfer
/// up, and since the late message could still force an election, the leader steps down, and a
/// later term holds a lease (before the fix: fenced for good, reads on ReadIndex for ever).
#[test]
fn a_transfer_given_up_after_timeout_now_left_ends_the_term() {
    for seed in SEEDS {
        let mut sim = SimCluster::new(config(seed, Safeties::default()));
        let l = elect(&mut sim);
        sim.run_with_load(300, &Load::default());
        let term = term_of(&sim, l);
        let to = others(&sim, l)[0];
        sim.net_mut()
            .delay_type(raft::eraftpb::MessageType::MsgTimeoutNow, 60_000_000_000);
        sim.transfer_leader(l, to);
        let leased_later = |s: &SimCluster| {
            s.ids().into_iter().any(|n| {
                let status = s.node(n).map(|x| x.lease_status());
                status.is_some_and(|st| st.state.is_held() && st.term > Some(term))
            })
        };
        assert!(
            sim.run_until(5_000, leased_later),
            "seed {seed}: no lease in a later term 5 s after the transfer was given up"
        );
        sim.run_with_load(300, &Load::default());
        let r = sim.check();
        assert!(r.violations.is_empty(), "seed {seed}: {:?}", r.violations);
    }
}
