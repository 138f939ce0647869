//! The seeded randomized simulation, in the style of TigerBeetle's VOPR: a random cluster
//! configuration and random, overlapping faults under client load (the safety phase), then every
//! fault healed (the liveness phase). The history checker and the lease monitor must find
//! nothing, and the healed cluster must serve a write and a read again.
//!
//! Everything follows from the seed: the same [`RandomRun`] gives the same run, so a failing
//! seed reproduces. A negative control ([`Control`]) runs the same seed with one safety off; the
//! crate's tests show that each control is caught within the CI seeds.

mod loss;
mod nemesis;
mod phases;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::{FollowerLeases, LeaseConfig, Safeties, TestingKnobs};
use crate::sim::history::CheckReport;
use crate::sim::scenarios::Control;
use crate::sim::{NetConfig, SimCluster, SimConfig};
use loss::{lose_leader_after_change, read_leases_again};
use nemesis::Nemesis;
use phases::{heal_everything, liveness_phase, safety_phase};

/// One randomized run.
#[derive(Debug, Clone, Copy)]
pub struct RandomRun {
    /// Fixes the configuration, the faults and the network.
    pub seed: u64,
    /// The negative control to run, or `None` for the lease as designed.
    pub control: Option<Control>,
    /// Length of the safety phase, in simulated milliseconds.
    pub safety_ms: u64,
}

/// What one randomized run found.
#[derive(Debug)]
pub struct RunOutcome {
    /// The cluster configuration the seed chose.
    pub config: SimConfig,
    /// Linearizability and lease-monitor findings.
    pub report: CheckReport,
    /// Client operations recorded.
    pub ops: usize,
    /// The faults injected, with their times, for the failure message.
    pub faults: Vec<String>,
    /// Whether the healed cluster served again, or what it last did.
    pub liveness: Result<(), String>,
    /// With follower read leases: the ms until every live voter held a read lease again once
    /// the cluster served, and the bound it must stay within (`None`: follower leases off, no
    /// grant in this configuration can outlast the margin, or the cluster never served).
    pub read_leases_after_ms: Option<(u64, u64)>,
    /// Split votes seen during the liveness phase.
    pub liveness_split_votes: u64,
    /// Heartbeat rounds retired because a round table was full, summed over the nodes up at the end.
    pub rounds_evicted: u64,
    /// Snapshots installed by followers that had fallen behind compaction.
    pub snapshots_installed: u64,
    /// Lease reads served by a node after it had installed a snapshot.
    pub lease_reads_after_install: u64,
}

/// The safety phase runs in slices of this many simulated ms: a fault may start, and faults
/// due end, between two slices.
const SLICE_MS: u64 = 20;

/// The largest drift of the drift control: 30%, against a configured bound of at most 2%.
const DRIFT_BEYOND_PPM: i64 = 300_000;

/// A random cluster configuration for `seed`, with `control` applied.
pub fn random_config(seed: u64, control: Option<Control>, rng: &mut ChaCha8Rng) -> SimConfig {
    let nodes = rng.gen_range(3..=5);
    let voters: Vec<u64> = (1..=if rng.gen_bool(0.5) { 3 } else { nodes }).collect();
    let (tick_ms, heartbeat_tick, election_tick) = random_ticks(rng);
    let mut c = SimConfig {
        nodes,
        voters: Some(voters),
        seed,
        tick_ms,
        heartbeat_tick,
        election_tick,
        election_spread_ticks: rng.gen_range(1..=election_tick),
        pre_vote: rng.gen_bool(0.8),
        compact_every: if rng.gen_bool(0.8) {
            rng.gen_range(5..=200)
        } else {
            0
        },
        ..SimConfig::default()
    };
    c.lease = random_lease(&c, rng);
    c.net = random_net(&c, rng);
    let rho = c.lease.drift_ppm as i64;
    let drift = match control {
        Some(Control::DriftBeyondBound) => DRIFT_BEYOND_PPM,
        _ => rho,
    };
    c.drift_ppm = (0..c.nodes)
        .map(|_| rng.gen_range(-drift..=drift))
        .collect();
    if let Some(Control::Safeties(safeties)) = control {
        c.lease.safeties = safeties;
    }
    random_follower_leases(&mut c, control);
    c
}

/// Follower read leases for half the seeds, and for every seed of a follower-lease control, with
/// `G` drawn from above one heartbeat interval to below half the election timeout; and on half of
/// those, `P` raised into the top quarter of its range (up to the election timeout), where a
/// leader lease ends late enough for an election to follow it within `G` (a read lease that
/// outlived it would then be read from). Drawn from a generator of their own, so that every
/// other draw of the seed stays as it was.
fn random_follower_leases(c: &mut SimConfig, control: Option<Control>) {
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed ^ 0xf0_11_0e_4e);
    let forced = matches!(control, Some(Control::Safeties(s)) if follower_knob(&s.testing));
    if !rng.gen_bool(0.5) && !forced {
        return;
    }
    let heartbeat_ms = c.heartbeat_tick as u64 * c.tick_ms;
    let election_ms = c.election_tick as u64 * c.tick_ms;
    let (lo_ms, hi_ms) = (heartbeat_ms + 1, (election_ms - 1) / 2);
    assert!(lo_ms <= hi_ms, "no valid G for {c:?}");
    let mut lease = LeaseConfig {
        follower_leases: Some(FollowerLeases::new(rng.gen_range(lo_ms..=hi_ms))),
        ..c.lease.clone()
    };
    let raft = raft::Config {
        election_tick: c.election_tick,
        heartbeat_tick: c.heartbeat_tick,
        ..raft::Config::default()
    };
    lease
        .validate(&raft, c.tick_ms)
        .unwrap_or_else(|e| panic!("G drawn out of range: {e}"));
    if rng.gen_bool(0.5) {
        let promise_ms = rng.gen_range(election_ms * 3 / 4..=election_ms);
        let late = LeaseConfig {
            promise_ms: promise_ms.max(lease.promise_ms),
            ..lease.clone()
        };
        if late.validate(&raft, c.tick_ms).is_ok() {
            lease = late;
        }
    }
    c.lease = lease;
}

/// Whether a knob of follower read leases is set: its control runs with them on.
pub fn follower_knob(k: &TestingKnobs) -> bool {
    k.apply_to_commit
        || k.expose_commit
        || k.no_transfer_wait
        || k.uncapped_grant
        || k.grant_lagging
        || k.lease_from_receipt
        || k.reuse_tags
        || k.ignore_pending_keys
        || k.conf_with_grants
        || k.accept_voided_grants
        || k.no_read_lease_give_ups
        || k.asks_after_waits
        || k.no_resume_after_abandoned_transfer
}

/// `(tick_ms, heartbeat_tick, election_tick)`. One seed in ten has 1 ms heartbeats and a 300 ms
/// election timeout: hundreds of rounds in flight per lease, past the round table's limit.
fn random_ticks(rng: &mut ChaCha8Rng) -> (u64, usize, usize) {
    if rng.gen_bool(0.1) {
        return (1, 1, 300);
    }
    let tick_ms = [1, 2, 5, 10][rng.gen_range(0..4)];
    let heartbeat_tick = rng.gen_range(1..=3);
    // An election timeout of at least 20 ms and three heartbeats.
    let min_election = (20 / tick_ms as usize).max(3 * heartbeat_tick).max(2);
    let election_tick = rng.gen_range(min_election..=min_election.max(30));
    (tick_ms, heartbeat_tick, election_tick)
}

/// A valid lease config: `P` from just above one heartbeat interval up to the election timeout,
/// ρ up to 2%, ε up to 3 ms.
fn random_lease(c: &SimConfig, rng: &mut ChaCha8Rng) -> LeaseConfig {
    let raft = raft::Config {
        election_tick: c.election_tick,
        heartbeat_tick: c.heartbeat_tick,
        ..raft::Config::default()
    };
    let heartbeat_ms = c.heartbeat_tick as u64 * c.tick_ms;
    let election_ms = c.election_tick as u64 * c.tick_ms;
    // With 300 heartbeats per election timeout, a long P keeps more rounds alive than the
    // round table holds.
    // A quarter of the seeds have P under two heartbeat intervals: a pending context's round
    // is pruned between two of its copies.
    let (lo_ms, hi_ms) = if election_ms >= 300 * heartbeat_ms {
        (election_ms * 9 / 10, election_ms)
    } else if rng.gen_bool(0.25) {
        (heartbeat_ms + 1, (2 * heartbeat_ms).min(election_ms))
    } else {
        (heartbeat_ms + 1, election_ms)
    };
    for _ in 0..20 {
        let lease = LeaseConfig {
            promise_ms: rng.gen_range(lo_ms..=hi_ms),
            drift_ppm: rng.gen_range(0..=20_000),
            margin_ms: rng.gen_range(0..=3),
            ..LeaseConfig::default()
        };
        if lease.validate(&raft, c.tick_ms).is_ok() {
            return lease;
        }
    }
    LeaseConfig {
        promise_ms: election_ms,
        drift_ppm: 0,
        margin_ms: 0,
        ..LeaseConfig::default()
    }
}

/// One-way delays up to half a heartbeat interval (at most 3 ms), from 50 µs.
fn random_net(c: &SimConfig, rng: &mut ChaCha8Rng) -> NetConfig {
    let heartbeat_us = c.heartbeat_tick as u64 * c.tick_ms * 1_000;
    let max_delay_us = rng.gen_range(100..=(heartbeat_us / 2).clamp(100, 3_000));
    NetConfig {
        min_delay_us: rng.gen_range(50..=max_delay_us),
        max_delay_us,
        loss: 0.0,
        duplicate: 0.0,
    }
}

/// Run one seed: the safety phase, then the liveness phase.
pub fn run(run: RandomRun) -> RunOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(run.seed ^ 0x5eed_1ea5e);
    let config = random_config(run.seed, run.control, &mut rng);
    let mut sim = SimCluster::new(config.clone());
    let mut nemesis = Nemesis::new(run.seed, rng, &config);
    let mut faults = safety_phase(&mut sim, &mut nemesis, run.safety_ms);
    heal_everything(&mut sim);
    let follower_leases = config.lease.follower_leases.is_some();
    let mut loss_rng = ChaCha8Rng::seed_from_u64(run.seed ^ 0x1055);
    if let Some(l) = follower_leases.then(|| lose_leader_after_change(&mut sim, &mut loss_rng)) {
        let now_ms = sim.now_ns() / 1_000_000;
        faults.push(l.map_or("no leader to lose".into(), |l| format!("{now_ms}ms {l}")));
    }
    let split_before = sim.elections().split_votes;
    let mut liveness = liveness_phase(&mut sim);
    let mut read_leases_after_ms = None;
    if let Some(bound_ms) = read_lease_bound_ms(&config).filter(|_| liveness.is_ok()) {
        match read_leases_again(&mut sim, bound_ms) {
            Ok(ms) => read_leases_after_ms = Some((ms, bound_ms)),
            Err(e) => liveness = Err(e),
        }
    }
    let totals = sim.totals();
    RunOutcome {
        report: sim.check(),
        ops: sim.history().ops().len(),
        faults,
        liveness,
        read_leases_after_ms,
        liveness_split_votes: sim.elections().split_votes - split_before,
        rounds_evicted: totals.rounds_evicted,
        snapshots_installed: totals.snapshots_installed,
        lease_reads_after_install: totals.lease_reads_after_install,
        config,
    }
}

/// How long after the cluster serves again every live voter must have held a read lease: the
/// new leader's own lease waits out the promise `P` and an election timeout at most; then a
/// heartbeat's acknowledgement is granted, and a grant may wait for `E` to pass the last index
/// of the leader's log at election (two heartbeats), plus one grant for a holder left out.
///
/// `None` where an idle follower can never hold one: a grant rides the leader's next message to
/// the holder, with no writes its next heartbeat, a heartbeat interval after the
/// acknowledgement it answers, and the holder's lease runs `g·(1−ρ)/(1+ρ) − ε` from that
/// acknowledgement, `g` at most `G` and what is left of the leader lease. Where that is no
/// longer than a heartbeat interval and a round trip, the grant has ended when it arrives.
/// (`G` just above one heartbeat interval passes the configuration's check: the check allows
/// what can never serve an idle follower read.)
fn read_lease_bound_ms(c: &SimConfig) -> Option<u64> {
    let heartbeat_ms = c.heartbeat_tick as u64 * c.tick_ms;
    let election_ms = (c.election_tick + c.election_spread_ticks) as u64 * c.tick_ms;
    let grant_ms = c.lease.follower_leases.map_or(0, |f| f.max_grant_ms);
    let rho = c.lease.drift_ppm as f64 / 1e6;
    let scale = (1.0 - rho) / (1.0 + rho);
    let leader_lease_ms = c.lease.promise_ms as f64 * scale - c.lease.margin_ms as f64;
    let round_ms = heartbeat_ms as f64 + 2.0 * c.net.max_delay_us as f64 / 1e3;
    let g_ms = (grant_ms as f64).min(leader_lease_ms - round_ms);
    let holder_ms = g_ms * scale - c.lease.margin_ms as f64;
    (holder_ms > round_ms + 1.0)
        .then_some(c.lease.promise_ms + election_ms + 3 * heartbeat_ms + grant_ms)
}

/// The safeties a control switches off, for a report line.
pub fn describe(control: Option<Control>) -> String {
    match control {
        None => "the lease as designed".into(),
        Some(Control::DriftBeyondBound) => {
            format!("clocks drifting up to {}%", DRIFT_BEYOND_PPM / 10_000)
        }
        Some(Control::Safeties(s)) if s == Safeties::raft_lease_based() => {
            "raft-rs LeaseBased".into()
        }
        Some(Control::Safeties(s)) => s.testing.set().join(" + "),
    }
}
