//! The seeded randomized multi-group simulation: node-level faults and per-group transfers and
//! membership changes under load (safety phase), then every fault healed (liveness phase: every
//! group is led again and serves a write and a read). Every group's history and lease monitor
//! must find nothing.

use raft::eraftpb::ConfChangeType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::faults::{self, Later, Undo, PROMISES_MS};
pub use super::faults::{FailedGroup, Failover};
use super::{episodes, follower_runs, MultiSim, MultiSimConfig};
use crate::config::Safeties;
use crate::multi::LivenessMode;
use crate::read::ReadMode;
use crate::sim::history::{CheckReport, OpResult};
use crate::sim::scenarios::conf_change;
use crate::sim::NetConfig;

/// A negative control of shared liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiControl {
    /// A supporter forgets the epochs it withdrew: support comes back at one of them.
    ForgetWithdrawals,
    /// A restarted node keeps its incarnation.
    SameIncarnation,
    /// A restarted node votes at once: no boot promise.
    NoBootPromise,
    /// Clocks drift up to 30% against a bound of 1%.
    DriftBeyondBound,
    /// A leader that steps down leaves its followers fortified (a liveness failure when the
    /// group is stuck on a live node).
    NoGiveUp,
    /// A supporter that sees a later epoch releases the earlier one's replicas at once.
    EndEpochAtOnce,
    /// A leader of a new term counts the fortifications made for its earlier term.
    CountEarlierTerms,
    /// A fortified replica lets go as soon as raft moves its term (a held, rejected pre-vote
    /// response of a later term is enough), while its node still supports the leader.
    ReleaseOnTermMove,
    /// Every acknowledgement is counted on the counting node's own promise, and a node boots
    /// with its own promise only: with nodes of different promise settings (a rolling change),
    /// leases outlive the promises they rest on.
    MixedSettingsOwnPromise,
    /// A node that stops hosting a group forgets the fortification its replica made: hosted
    /// again while the node still supports that leader, the new replica votes for others.
    ForgetRemovedFortifications,
    /// With follower read leases: a node that stops leading a group releases its fortified
    /// voters at once, while a read lease it granted may still be served (FOLLOWER.md rule 13).
    ReleaseAtOnce,
}

/// What one run found.
#[derive(Debug)]
pub struct MultiOutcome {
    /// Every group's linearizability and lease-monitor findings.
    pub report: CheckReport,
    /// The faults injected, with their times.
    pub faults: Vec<String>,
    /// Whether every group served again after healing, or what did not.
    pub liveness: Result<(), String>,
    /// Each mass failover, and how long its groups took to be led again with a lease (other
    /// faults may have been active meanwhile: nothing is asserted on it).
    pub failovers: Vec<Failover>,
}

/// The config for `seed`: 3 to 5 nodes, 4 to 8 groups (every node a voter of every group, or
/// half the time each group on three nodes), shared liveness, pre-vote and
/// check-quorum on or off; in three fifths of the seeds with pre-vote every node with a promise
/// of its own (a rolling change of the promise under way), in a fifth some nodes without
/// pre-vote (a rolling change of that setting); the control applied.
pub fn config(seed: u64, control: Option<MultiControl>) -> MultiSimConfig {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x006d_756c_7469);
    let nodes = rng.gen_range(3..=5);
    let mut c = MultiSimConfig {
        nodes,
        groups: rng.gen_range(4..=8),
        seed,
        mode: LivenessMode::Shared,
        quiesce_after_ticks: rng.gen_range(5..=30),
        ..MultiSimConfig::default()
    };
    let drift = match control {
        Some(MultiControl::DriftBeyondBound) => 300_000,
        _ => c.lease.drift_ppm as i64,
    };
    c.drift_ppm = (0..nodes).map(|_| rng.gen_range(-drift..=drift)).collect();
    c.pre_vote = rng.gen_bool(0.7);
    let no_check_quorum = rng.gen_bool(0.2);
    let mut own = || PROMISES_MS[rng.gen_range(0..PROMISES_MS.len())];
    let per_node: Vec<u64> = (0..nodes).map(|_| own()).collect();
    let without: Vec<u64> = (1..=nodes).filter(|_| rng.gen_bool(0.4)).collect();
    // Raft without pre-vote is not live when nodes' election timeouts do not overlap: a node
    // with a short timeout and a stale log campaigns first every time, moves every term and
    // never wins (seen as terms in the hundreds and no leader). Mixed promises (a rolling
    // change of the election timeout) need pre-vote on every node, as the example KV runs.
    match rng.gen_range(0..5) {
        0..=2 if c.pre_vote => c.promise_ms_per_node = per_node,
        3 if c.pre_vote && (1..nodes as usize).contains(&without.len()) => {
            c.no_pre_vote_nodes = without;
        }
        _ => {}
    }
    // Without check-quorum, a leader cut off from its quorum learns of a later term only from
    // an answer to its appends, which raft-rs sends only with pre-vote or check-quorum on; and
    // it refuses the later candidates' votes while it keeps promising itself with every
    // heartbeat round it sends. With neither, its group never elects again (seen).
    c.check_quorum = !(no_check_quorum && c.pre_vote && c.no_pre_vote_nodes.is_empty());
    // Half the clusters of more than three nodes place each group on three of them, as stores
    // of many groups do: each pair of nodes shares only some groups.
    if rng.gen_bool(0.5) {
        c.replicas = 3;
    }
    let knobs = &mut c.lease.safeties.testing;
    knobs.forget_withdrawals = control == Some(MultiControl::ForgetWithdrawals);
    knobs.no_boot_promise = control == Some(MultiControl::NoBootPromise);
    knobs.no_give_up = control == Some(MultiControl::NoGiveUp);
    knobs.end_epoch_at_once = control == Some(MultiControl::EndEpochAtOnce);
    knobs.count_earlier_terms = control == Some(MultiControl::CountEarlierTerms);
    knobs.release_on_term_move = control == Some(MultiControl::ReleaseOnTermMove);
    knobs.count_own_promise = control == Some(MultiControl::MixedSettingsOwnPromise);
    knobs.forget_removed_fortifications =
        control == Some(MultiControl::ForgetRemovedFortifications);
    knobs.release_at_once = control == Some(MultiControl::ReleaseAtOnce);
    c.same_incarnation_on_restart = control == Some(MultiControl::SameIncarnation);
    c
}

/// Run one seed for `safety_ms` of faults, then the liveness phase.
pub fn run(seed: u64, control: Option<MultiControl>, safety_ms: u64) -> MultiOutcome {
    run_keeping_sim(seed, control, safety_ms).0
}

/// [`run`], and the simulation as it ended, to inspect a failure.
pub fn run_keeping_sim(
    seed: u64,
    control: Option<MultiControl>,
    safety_ms: u64,
) -> (MultiOutcome, MultiSim) {
    run_config(config(seed, control), safety_ms)
}

/// [`run_keeping_sim`] on a config of its own (the follower-lease runs'). With follower read
/// leases on, the safety phase also cuts groups apart on their own (see
/// [`super::follower_runs`]), drawn from a generator of its own.
pub(super) fn run_config(c: MultiSimConfig, safety_ms: u64) -> (MultiOutcome, MultiSim) {
    let seed = c.seed;
    let follower_leases = c.lease.follower_leases.is_some();
    let mut sim = MultiSim::new(c);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfa17);
    let mut split_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5b11_7000);
    let mut faults = Vec::new();
    let mut later = Later::new();
    let mut failovers = Vec::new();
    faults.push(format!("0ms {}", stale_copies(&mut sim, &mut rng)));
    while sim.now_ns() / 1_000_000 < safety_ms {
        let now_ms = sim.now_ns() / 1_000_000;
        undo_due(&mut sim, &mut later, now_ms);
        if rng.gen_bool(0.4) {
            let fault = inject(&mut sim, &mut rng, &mut later, &mut failovers);
            if !fault.is_empty() {
                faults.push(format!("{now_ms}ms {fault}"));
            }
        }
        if follower_leases && split_rng.gen_bool(0.05) {
            let fault = follower_runs::group_split(&mut sim, &mut split_rng);
            if !fault.is_empty() {
                faults.push(format!("{now_ms}ms {fault}"));
            }
        }
        let mode = [ReadMode::Lease, ReadMode::Auto, ReadMode::ReadIndex][rng.gen_range(0..3)];
        sim.run_with_load(20, mode, 2_000, 5_000);
    }
    heal(&mut sim, &later);
    // Without check-quorum a leader that cannot reach its group never steps down, so never
    // gives up: its followers stay fortified while its node's support flows (see
    // `MultiSimConfig::check_quorum`). The stuck group is tested where check-quorum is on.
    if !sim.config().check_quorum {
        faults.push("check-quorum off: no group stuck after healing".into());
    } else if let Some(stuck) = stick_one_group(&mut sim, &mut rng) {
        faults.push(stuck);
    }
    let liveness = liveness_phase(&mut sim);
    failovers.iter_mut().for_each(|f| f.measure(&sim));
    let outcome = MultiOutcome {
        report: sim.check(),
        faults,
        liveness,
        failovers,
    };
    (outcome, sim)
}

fn undo_due(sim: &mut MultiSim, later: &mut Later, now_ms: u64) {
    let (due, rest): (Vec<_>, Vec<_>) = later.drain(..).partition(|(at, _, _)| *at <= now_ms);
    *later = rest;
    for (_, node, undo) in due {
        match undo {
            Undo::Restart if !sim.is_up(node) => sim.restart(node),
            Undo::Resume if sim.is_paused(node) => sim.resume(node),
            Undo::Reconnect(peer) => sim.reconnect(node, peer),
            Undo::Unmute(gid) => sim.unmute_group(gid, node),
            Undo::Fast(peer) => sim.slow_link(node, peer, 0),
            Undo::AddGroup(gid) => {
                sim.add_group(node, gid);
            }
            _ => {}
        }
    }
}

/// One fault, drawn from every kind the run knows.
fn inject(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    failovers: &mut Vec<Failover>,
) -> String {
    let node = rng.gen_range(1..=sim.config().nodes);
    let gid = rng.gen_range(1..=sim.config().groups);
    match rng.gen_range(0..32) {
        k @ 0..=9 => node_fault(sim, rng, later, k, node),
        k @ 10..=16 => group_fault(sim, rng, later, k, gid),
        17 | 18 => faults::message_rule(sim, rng),
        19 => faults::rolling_change(sim, rng, node, later),
        20 => faults::mass_failover(sim, rng, later, failovers),
        21 => faults::mass_stall(sim, rng, later),
        22 => faults::joint_change(sim, rng, gid),
        23 => faults::quiescent_transfer(sim, rng),
        24 => faults::remove_and_readd(sim, rng, later, gid),
        _ => episode(sim, rng, later, gid),
    }
}

/// Faults of nodes and links: cuts, pauses, crashes, drift, slow links, the network's settings.
fn node_fault(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    kind: u32,
    node: u64,
) -> String {
    let n = sim.config().nodes;
    let now_ms = sim.now_ns() / 1_000_000;
    match kind {
        0 => {
            let rest: Vec<u64> = (1..=n).filter(|&i| i != node).collect();
            sim.partition(&[node], &rest);
            format!("isolate {node}")
        }
        1 => {
            let to = rng.gen_range(1..=n);
            sim.block(node, to);
            format!("block {node}->{to}")
        }
        2 => {
            sim.heal();
            "heal".into()
        }
        3 if sim.is_up(node) && !sim.is_paused(node) => {
            sim.pause(node);
            let until = now_ms + rng.gen_range(50..400);
            later.push((until, node, Undo::Resume));
            format!("pause {node} until {until}ms")
        }
        4 if sim.is_up(node) => {
            sim.crash(node);
            let at = now_ms + rng.gen_range(0..300);
            later.push((at, node, Undo::Restart));
            format!("crash {node}, restart at {at}ms")
        }
        5 => drift(sim, rng, node),
        6 => {
            let max_delay_us = rng.gen_range(100..5_000);
            sim.net_mut().config = NetConfig {
                min_delay_us: rng.gen_range(50..=max_delay_us),
                max_delay_us,
                loss: rng.gen_range(0.0..0.05),
                duplicate: rng.gen_range(0.0..0.05),
            };
            format!("net changed, {}", stale_copies(sim, rng))
        }
        7 => straggler(sim, rng, node, later),
        8 | 9 if sim.is_up(node) => {
            sim.crash(node);
            sim.restart(node);
            format!("restart {node} at once")
        }
        _ => String::new(),
    }
}

/// Half the time, stale copies: 0.2–2% of messages of every kind are sent once more, alone,
/// up to `10P` late (held in a queue, retransmitted): whatever trusts a message to be fresh is
/// tested, a request that finds its receiver in a later term answered with that term included.
fn stale_copies(sim: &mut MultiSim, rng: &mut ChaCha8Rng) -> String {
    let (p, max_us) = match rng.gen_bool(0.5) {
        true => (rng.gen_range(0.02..0.05), 10 * sim.max_promise_ms() * 1_000),
        false => (0.0, 0),
    };
    sim.net_mut().set_stale_copies(p, max_us);
    format!("stale copies {:.1}% up to {}ms", p * 100.0, max_us / 1_000)
}

/// A node's clock drifts anywhere within the larger of the configured drifts and 1%.
fn drift(sim: &mut MultiSim, rng: &mut ChaCha8Rng, node: u64) -> String {
    let drifts = sim.config().drift_ppm.iter().map(|d| d.abs());
    let rho = drifts.max().unwrap_or(0).max(10_000);
    let ppm = rng.gen_range(-rho..=rho);
    sim.clock(node).set_drift_ppm(ppm);
    format!("drift {node} {ppm}ppm")
}

/// Faults aimed at one group: transfers, membership, a group stuck on its leader, partial
/// partitions around its leader.
fn group_fault(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    kind: u32,
    gid: u64,
) -> String {
    let node = rng.gen_range(1..=sim.config().nodes);
    let now_ms = sim.now_ns() / 1_000_000;
    match kind {
        10 => match sim.leader(gid) {
            Some(leader) if leader != node => {
                sim.transfer_leader(gid, leader, node);
                format!("group {gid}: transfer {leader}->{node}")
            }
            _ => String::new(),
        },
        11 => membership(sim, gid, node),
        12..=14 => restart_during_partial_partition(sim, rng, gid, later),
        15 => match sim.leader(gid) {
            Some(leader) => {
                sim.mute_group(gid, leader);
                let until = now_ms + rng.gen_range(100..1_500);
                later.push((until, leader, Undo::Unmute(gid)));
                format!("group {gid}: stuck on its leader {leader} until {until}ms")
            }
            None => String::new(),
        },
        _ => isolate_then_reconnect_one(sim, rng, gid, later),
    }
}

/// One of the scripted episodes on group `gid`. Each starts from a healed network; one that
/// does not line up (the group not in shape, or the world moved otherwise) is healed again
/// at once, so that the cuts and rules it set up do not linger unannounced.
fn episode(sim: &mut MultiSim, rng: &mut ChaCha8Rng, later: &mut Later, gid: u64) -> String {
    let mut pick = rng.gen_range(0..5);
    if pick == 2 && !sim.config().pre_vote {
        pick = 3; // a follower's campaign moves its term without pre-vote
    }
    let gid = match pick {
        2 | 4 => gid, // any number of voters
        _ => three_voter_group(sim, gid),
    };
    let (name, run) = match pick {
        0 => ("late withdrawal", episodes::late_withdrawal(sim, gid, rng)),
        1 => ("resumed support", episodes::resumed_support(sim, gid, rng)),
        2 => (
            "later term",
            episodes::answer_from_a_later_term(sim, gid, rng),
        ),
        3 => ("round trip", episodes::transfer_round_trip(sim, gid, rng)),
        _ => (
            "moved away and back",
            episodes::moved_away_and_back(sim, gid, rng),
        ),
    };
    match run {
        Some((leader, what)) => {
            later.push((sim.now_ns() / 1_000_000, leader, Undo::Unmute(gid)));
            what
        }
        None => {
            sim.heal();
            format!("group {gid}: episode '{name}' did not line up; healed")
        }
    }
}

/// The first group from `gid` on (round the ids) whose leader has a configuration of three
/// voters, not joint, as the episodes need; `gid` if none has.
fn three_voter_group(sim: &MultiSim, gid: u64) -> u64 {
    let groups = sim.config().groups;
    let three = |g: u64| {
        let Some(l) = sim.leader(g) else { return false };
        let Some(cs) = sim
            .node(l)
            .and_then(|m| m.group(g))
            .map(|x| x.raw().raft.prs().conf().to_conf_state())
        else {
            return false;
        };
        cs.voters.len() == 3 && cs.voters_outgoing.is_empty()
    };
    (0..groups)
        .map(|i| (gid - 1 + i) % groups + 1)
        .find(|&g| three(g))
        .unwrap_or(gid)
}

/// One link turns slow for a while (up to `3P` one way): batches sent on it meanwhile arrive
/// after later ones, perhaps after the sender restarted.
fn straggler(sim: &mut MultiSim, rng: &mut ChaCha8Rng, node: u64, later: &mut Later) -> String {
    let n = sim.config().nodes;
    let peer = (node % n) + 1;
    let p_us = sim.config().lease.promise_ms * 1_000;
    let extra_us = rng.gen_range(p_us / 2..=3 * p_us);
    sim.slow_link(node, peer, extra_us);
    let until = sim.now_ns() / 1_000_000 + rng.gen_range(20..200);
    later.push((until, node, Undo::Fast(peer)));
    format!("link {node}->{peer} slow by {extra_us}us until {until}ms")
}

/// A group's leader is cut off for longer than `P`, then its links to one follower come back
/// while the others stay cut. Half the time the others' links to that follower are slow
/// meanwhile (up to `3P` one way): the election among the followers goes on in the network
/// after the old leader is back, and late answers from a node that moved to a later term reach
/// a follower fortified again.
fn isolate_then_reconnect_one(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    gid: u64,
    later: &mut Later,
) -> String {
    let Some(leader) = sim.leader(gid) else {
        return String::new();
    };
    let others: Vec<u64> = (1..=sim.config().nodes).filter(|&n| n != leader).collect();
    sim.partition(&[leader], &others);
    let peer = others[rng.gen_range(0..others.len())];
    let p_ms = sim.config().lease.promise_ms;
    let at = sim.now_ns() / 1_000_000 + rng.gen_range(p_ms..=3 * p_ms);
    later.push((at, leader, Undo::Reconnect(peer)));
    let mut what =
        format!("group {gid}: leader {leader} isolated, reconnected with {peer} at {at}ms");
    if rng.gen_bool(0.5) {
        let slow_us = rng.gen_range(p_ms * 500..=3 * p_ms * 1_000);
        let until = at + rng.gen_range(0..=3 * p_ms);
        for &o in others.iter().filter(|&&o| o != peer) {
            sim.slow_link(o, peer, slow_us);
            later.push((until, o, Undo::Fast(peer)));
        }
        what += &format!(", links to {peer} slow by {slow_us}us until {until}ms");
    }
    what
}

/// A rolling restart during a partial partition: a follower of group `gid` restarts at once,
/// while the leader is cut off from another follower (which stops supporting it and campaigns).
fn restart_during_partial_partition(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    gid: u64,
    later: &mut Later,
) -> String {
    let Some(leader) = sim.leader(gid) else {
        return String::new();
    };
    let others: Vec<u64> = (1..=sim.config().nodes)
        .filter(|&n| n != leader && sim.is_up(n))
        .collect();
    if others.len() < 2 {
        return String::new();
    }
    let restarted = others[rng.gen_range(0..others.len())];
    let cut = *others
        .iter()
        .find(|&&n| n != restarted)
        .expect("two others");
    sim.crash(restarted);
    let at = sim.now_ns() / 1_000_000 + rng.gen_range(0..50);
    later.push((at, restarted, Undo::Restart));
    sim.block(leader, cut);
    format!("group {gid}: {restarted} restarts at {at}ms while {leader}->{cut} is cut")
}

/// Remove `node` from group `gid` (unless it leads it, or too few voters remain), or add it back.
fn membership(sim: &mut MultiSim, gid: u64, node: u64) -> String {
    let Some(leader) = sim.leader(gid) else {
        return String::new();
    };
    let Some(cs) = sim
        .node(leader)
        .and_then(|m| m.group(gid))
        .map(|g| g.raw().raft.prs().conf().to_conf_state())
    else {
        return String::new();
    };
    let cc = if cs.voters.contains(&node) {
        if node == leader || cs.voters.len() <= 3 {
            return String::new();
        }
        conf_change(ConfChangeType::RemoveNode, node)
    } else {
        conf_change(ConfChangeType::AddNode, node)
    };
    let desc = format!("group {gid} at {leader}: {:?}", cc.get_changes());
    match sim.propose_conf_change(gid, leader, cc) {
        Ok(()) => desc,
        Err(e) => format!("{desc} refused: {e}"),
    }
}

fn heal(sim: &mut MultiSim, later: &[(u64, u64, Undo)]) {
    sim.heal();
    for &(_, node, undo) in later {
        match undo {
            Undo::Unmute(gid) => sim.unmute_group(gid, node),
            Undo::AddGroup(gid) => {
                sim.add_group(node, gid);
            }
            _ => {}
        }
    }
    sim.net_mut().config = NetConfig::default();
    sim.net_mut().set_stale_copies(0.0, 0);
    for &(_, node, _) in later {
        if sim.is_paused(node) {
            sim.resume(node);
        }
    }
    for node in 1..=sim.config().nodes {
        if sim.is_paused(node) {
            sim.resume(node);
        }
        if !sim.is_up(node) {
            sim.restart(node);
        }
    }
}

/// After healing, one group's leader settles and then gets stuck: its raft messages stop while
/// its node's support flows on. The liveness phase needs the group led elsewhere.
fn stick_one_group(sim: &mut MultiSim, rng: &mut ChaCha8Rng) -> Option<String> {
    let gid = rng.gen_range(1..=sim.config().groups);
    sim.run_until(3_000, |s| s.leader(gid).is_some());
    sim.run_for_ms(500); // its followers fortify
    let leader = sim.leader(gid)?;
    // The others can elect a leader without it only in a configuration of three voters or more
    // (the membership faults leave some of two, or joint).
    let g = sim.node(leader)?.group(gid)?;
    let cs = g.raw().raft.prs().conf().to_conf_state();
    if cs.voters.len() < 3 || !cs.voters_outgoing.is_empty() {
        return None;
    }
    sim.mute_group(gid, leader);
    Some(format!(
        "after healing, group {gid} stuck on its leader {leader}"
    ))
}

/// Every group is led again and serves a write and a read within 10 s of healing.
fn liveness_phase(sim: &mut MultiSim) -> Result<(), String> {
    let groups = sim.config().groups;
    for gid in 1..=groups {
        let start_ns = sim.now_ns();
        let mut last = String::from("no leader");
        loop {
            if sim.now_ns() - start_ns > 10_000_000_000 {
                return Err(format!(
                    "group {gid} not serving 10 s after healing: {last}"
                ));
            }
            if !sim.run_until(1_000, |s| s.leader(gid).is_some()) {
                continue;
            }
            let leader = sim.leader(gid).expect("checked");
            let write = sim.put(gid, leader, b"liveness");
            sim.run_for_ms(200);
            let read = sim.get(gid, leader, b"liveness", ReadMode::Auto);
            sim.run_for_ms(200);
            let ops = sim.histories()[&gid].ops();
            match (&ops[write as usize].done, &ops[read as usize].done) {
                (
                    Some((_, OpResult::Written { .. })),
                    Some((_, OpResult::Read { value: Some(_), .. })),
                ) => break,
                (w, r) => last = format!("write {w:?}, read {r:?}"),
            }
        }
    }
    Ok(())
}

/// The safeties a control switches off, for a report line.
pub fn describe(control: Option<MultiControl>) -> String {
    match control {
        None => format!("{:?}", Safeties::default().all_on()),
        Some(c) => format!("{c:?}"),
    }
}
