//! Give-ups: a transfer or a membership change waits for every follower read lease its leader
//! granted (FOLLOWER.md rule 4). The leader asks its holders to give theirs up, on heartbeats
//! sent at once; each answers on its acknowledgement, and what waited goes on one round trip
//! later instead of up to `G` later. Measured here in simulated time, beside the same run with
//! give-ups off (`no_read_lease_give_ups`: every grant is waited out) and beside `G`.
//!
//! The settings make the difference plain: heartbeats every 100 ms, a 1 s election timeout
//! and `G` = 400 ms, with 0.5–2 ms one way on the network.
//!
//! Safety of a give-up (a grant overtaken by the give-up must revive nothing) is checked by the
//! unit tests of `ReadLease` and `GrantTable` and, with its control `accept_voided_grants`, by
//! the randomized simulation (`tests/randomized.rs`).

mod follower_common;

use follower_common::{
    followers_hold, holding_leader_and_followers, no_op_change, stale_reads_with,
};
use raft::eraftpb::MessageType;
use raft_lease::config::TestingKnobs;
use raft_lease::sim::{CheckReport, DelayRule, Load, SimCluster, SimConfig};
use raft_lease::FollowerLeases;

/// `G`, in ms.
const G_MS: u64 = 400;
/// The largest one-way delay of the network, in ms.
const MAX_DELAY_MS: u64 = 2;

fn config(seed: u64, give_ups: bool) -> SimConfig {
    let mut c = SimConfig {
        seed,
        election_tick: 100,
        heartbeat_tick: 10,
        ..SimConfig::default()
    };
    c.lease.promise_ms = 1_000;
    c.lease.follower_leases = Some(FollowerLeases::new(G_MS));
    c.lease.safeties.testing.no_read_lease_give_ups = !give_ups;
    c
}

/// The bound with give-ups: the ask's heartbeat and its answer, then the `MsgTimeoutNow` and
/// the vote's round trip (or the change's append and its acknowledgement), each at the
/// largest delay, plus a millisecond of quanta.
fn round_trips_bound_ms(round_trips: u64) -> u64 {
    round_trips * 2 * MAX_DELAY_MS + 1
}

/// A cluster whose followers hold read leases, the last granted a heartbeat ago at most.
fn holding(c: SimConfig) -> SimCluster {
    let mut sim = SimCluster::new(c);
    assert!(sim.run_until(3_000, |s| s.leader().is_some()), "no leader");
    assert!(sim.run_until(1_000, followers_hold), "no read leases");
    sim.run_for_ms(37); // between heartbeats: the last grants are fresh, not renewed yet
    sim
}

/// [`holding`], with give-ups on and `set` applied to the testing knobs.
fn holding_with(seed: u64, set: fn(&mut TestingKnobs)) -> SimCluster {
    let mut c = config(seed, true);
    set(&mut c.lease.safeties.testing);
    holding(c)
}

/// Transfer from the leader to a follower under live read leases; returns the ms until the
/// follower leads (`None`: not within 2 s).
fn transfer_ms(c: SimConfig) -> Option<u64> {
    let mut sim = holding(c);
    let l = sim.leader().expect("a leader");
    let to = (1..=3).find(|&id| id != l).expect("a follower");
    let start_ns = sim.now_ns();
    sim.transfer_leader(l, to);
    let led = sim.run_until(2_000, |s| s.leader() == Some(to));
    led.then(|| (sim.now_ns() - start_ns).div_ceil(1_000_000))
}

/// Propose a membership change under live read leases, again every millisecond while it is
/// refused for them; returns the ms until it is accepted (`None`: not within 2 s).
fn change_ms(c: SimConfig) -> Option<u64> {
    let mut sim = holding(c);
    let l = sim.leader().expect("a leader");
    let start_ns = sim.now_ns();
    let refused = sim.propose_conf_change(l, no_op_change()).is_err();
    assert!(refused, "read leases live: the first proposal is refused");
    let accepted = (0..2_000).any(|_| {
        sim.run_for_ms(1);
        sim.propose_conf_change(l, no_op_change()).is_ok()
    });
    accepted.then(|| (sim.now_ns() - start_ns).div_ceil(1_000_000))
}

/// `measure` on seeds 0 to 3 with give-ups on and off, printed beside `G`; returns the worst of
/// each.
fn worst_of(what: &str, measure: fn(SimConfig) -> Option<u64>) -> (u64, u64) {
    let mut worst = (0, 0);
    for seed in 0..4 {
        let with = measure(config(seed, true));
        let without = measure(config(seed, false));
        eprintln!(
            "{what}, seed {seed}: {with:?} ms with give-ups, {without:?} ms waiting out every \
             grant (G = {G_MS} ms)"
        );
        let with = with.unwrap_or_else(|| panic!("seed {seed}: {what} never went on"));
        let without = without.unwrap_or_else(|| panic!("seed {seed}: {what} never went on"));
        worst = (worst.0.max(with), worst.1.max(without));
    }
    worst
}

#[test]
fn a_transfer_under_live_read_leases_waits_one_round_trip_not_g() {
    let (with, without) = worst_of("transfer", transfer_ms);
    let bound = round_trips_bound_ms(2);
    assert!(with <= bound, "{with} ms with give-ups, over {bound} ms");
    assert!(
        without >= G_MS / 2,
        "{without} ms waiting every grant out: the grants were not live (G = {G_MS} ms)"
    );
}

#[test]
fn a_membership_change_under_live_read_leases_waits_one_round_trip_not_g() {
    let (with, without) = worst_of("membership change", change_ms);
    let bound = round_trips_bound_ms(1);
    assert!(with <= bound, "{with} ms with give-ups, over {bound} ms");
    assert!(
        without >= G_MS / 2,
        "{without} ms waiting every grant out: the grants were not live (G = {G_MS} ms)"
    );
}

/// The hazard of a give-up: a grant overtaken by it. Under load, the leader's appends to one
/// holder take 3 ms more, and the grants they carry with them; the heartbeat that asks for the
/// give-up is not slowed, so the holder gives up before a grant made earlier arrives. The
/// transferee's messages to that holder take 30 ms more, so it hears of the new leader's writes
/// late. A grant the give-up voided must revive nothing: the old leader stopped counting the
/// holder on its give-up and let the transfer go.
fn run_overtaken_grant(c: SimConfig) -> CheckReport {
    let (mut sim, l, to, slow) = holding_leader_and_followers(c);
    let delay = |from, msg_type, extra_ms: u64| DelayRule {
        from: Some(from),
        to: Some(slow),
        msg_type,
        extra_ns: extra_ms * 1_000_000,
    };
    sim.net_mut()
        .delay(delay(l, Some(MessageType::MsgAppend), 3));
    sim.net_mut().delay(delay(to, None, 30));
    let load = Load {
        write_every_us: 500, // an append in flight to the holder at any instant
        ..Load::default()
    };
    sim.run_with_load(100, &load);
    sim.transfer_leader(l, to);
    sim.run_with_load(400, &load);
    sim.check()
}

#[test]
fn a_give_up_overtaken_by_a_grant_made_before_it_never_serves_a_stale_read() {
    for seed in 0..4 {
        let report = run_overtaken_grant(follower_common::config(seed));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
    }
}

/// The holder takes the voided grant: its lease lives on after the leader stopped counting it,
/// and it serves reads the new leader's writes have overtaken.
#[test]
fn control_a_holder_taking_a_voided_grant_serves_stale_follower_reads() {
    let stale = stale_reads_with(|k| k.accept_voided_grants = true, run_overtaken_grant);
    assert!(stale > 0, "no stale follower read found over 4 seeds");
}

/// A membership change refused under live read leases, and the leader paused across the instant
/// its grant pause ends: one holder's give-up and its next acknowledgement, slowed on their way,
/// are stepped after the pause together, so a grant is made again while the leader still asks.
/// The leader must stop asking once nothing waits; else each new grant is given up as it
/// arrives, and no follower holds a read lease for the rest of the term. Returns, per seed, the
/// ms of the 3 s after the pause in which every follower held one.
fn held_after_a_paused_refusal(set: fn(&mut TestingKnobs)) -> Vec<u64> {
    (0..4)
        .map(|seed| {
            let mut sim = holding_with(seed, set);
            let l = sim.leader().expect("a leader");
            let slow = (1..=3).filter(|&id| id != l).nth(1).expect("two followers");
            sim.net_mut().delay(DelayRule {
                from: Some(slow),
                to: Some(l),
                msg_type: None,
                extra_ns: 15_000_000,
            });
            let refused = sim.propose_conf_change(l, no_op_change()).is_err();
            assert!(refused, "read leases live: the change is refused");
            sim.put(l, b"k"); // an append that leaves while the leader asks
            sim.run_for_ms(8);
            sim.pause(l);
            sim.run_for_ms(772); // past the grant pause (the last grant's end, and G)
            sim.resume(l);
            sim.net_mut().clear_delays();
            (0..3_000)
                .filter(|_| {
                    sim.run_for_ms(1);
                    followers_hold(&sim)
                })
                .count() as u64
        })
        .collect()
}

#[test]
fn the_leader_stops_asking_once_nothing_waits() {
    let held = held_after_a_paused_refusal(|_| {});
    eprintln!("ms of 3,000 with every follower holding, per seed: {held:?}");
    assert!(held.iter().all(|&ms| ms >= 2_000), "{held:?}");
}

#[test]
fn control_asks_after_the_wait_leave_no_follower_holding() {
    let held = held_after_a_paused_refusal(|k| k.asks_after_waits = true);
    eprintln!("control: ms of 3,000 with every follower holding, per seed: {held:?}");
    assert!(held.iter().any(|&ms| ms < 100), "{held:?}");
}

/// raft gives a transfer up after an election timeout when the transferee cannot catch up (here
/// it is cut off and lacks a write), before any `MsgTimeoutNow` left. Granting, stopped for the transfer, must
/// resume: the other follower holds a read lease again, under the same leader in the same term.
/// Returns, per seed, whether it did within 1 s of the transfer being given up.
fn holds_after_an_abandoned_transfer(set: fn(&mut TestingKnobs)) -> Vec<bool> {
    (0..4)
        .map(|seed| {
            let mut sim = holding_with(seed, set);
            let l = sim.leader().expect("a leader");
            let mut others = (1..=3).filter(|&id| id != l);
            let (to, other) = (others.next().unwrap(), others.next().unwrap());
            let term = sim.node(l).expect("up").raw().raft.term;
            sim.partition(&[to], &[l, other]);
            sim.put(l, b"k"); // the transferee lacks it: raft sends no MsgTimeoutNow
            sim.run_for_ms(50);
            sim.transfer_leader(l, to);
            let given_up = sim.run_until(3_000, |s| {
                s.node(l)
                    .is_some_and(|n| n.raw().raft.lead_transferee.is_none())
            });
            assert!(given_up, "seed {seed}: raft never gave the transfer up");
            let holds = sim.run_until(1_000, |s| {
                s.node(other).is_some_and(|n| n.holds_read_lease())
            });
            let same =
                sim.leader() == Some(l) && sim.node(l).is_some_and(|n| n.raw().raft.term == term);
            assert!(
                same,
                "seed {seed}: leadership moved: {:?} term {:?}",
                sim.leader(),
                sim.leader()
                    .and_then(|id| sim.node(id))
                    .map(|n| n.raw().raft.term)
            );
            holds
        })
        .collect()
}

#[test]
fn granting_resumes_after_a_transfer_given_up_before_timeout_now_left() {
    let holds = holds_after_an_abandoned_transfer(|_| {});
    assert!(holds.iter().all(|&h| h), "{holds:?}");
}

#[test]
fn control_granting_stopped_for_the_rest_of_the_term_leaves_followers_without_leases() {
    let holds = holds_after_an_abandoned_transfer(|k| k.no_resume_after_abandoned_transfer = true);
    assert!(holds.iter().all(|&h| !h), "{holds:?}");
}
