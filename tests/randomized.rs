//! A seeded randomized simulation: random faults and load (safety phase), then every fault
//! healed (liveness phase). The checker must find no violation; the cluster must serve again.
//!
//! - `RAFT_LEASE_SEED=N` runs one seed (the failure message prints it).
//! - `RAFT_LEASE_SEEDS=N` runs seeds `0..N` (default 32).
//! - `RAFT_LEASE_LONG=1` runs 500 seeds with a longer safety phase.

use raft_lease::sim::{CheckReport, Load, NetConfig, OpResult, SimCluster, SimConfig};
use raft_lease::{ReadMode, Safeties};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Outcome {
    report: CheckReport,
    ops: usize,
    /// Faults injected, for the failure message.
    faults: Vec<String>,
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("RAFT_LEASE_SEED") {
        return vec![seed.parse().expect("RAFT_LEASE_SEED must be a number")];
    }
    let long = std::env::var("RAFT_LEASE_LONG").is_ok();
    let n = std::env::var("RAFT_LEASE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok());
    (0..n.unwrap_or(if long { 500 } else { 32 })).collect()
}

fn safety_ms() -> u64 {
    if std::env::var("RAFT_LEASE_LONG").is_ok() {
        10_000
    } else {
        2_500
    }
}

fn config(seed: u64, safeties: Safeties, rng: &mut ChaCha8Rng) -> SimConfig {
    let mut c = SimConfig {
        seed,
        nodes: 3 + 2 * rng.gen_range(0..2),
        ..SimConfig::default()
    };
    c.lease.safeties = safeties;
    let rho = c.lease.drift_ppm as i64;
    c.drift_ppm = (0..c.nodes).map(|_| rng.gen_range(-rho..=rho)).collect();
    c
}

/// One random fault. Returns a description.
fn inject(sim: &mut SimCluster, rng: &mut ChaCha8Rng, paused: &mut Vec<(u64, u64)>) -> String {
    let ids = sim.ids();
    let node = ids[rng.gen_range(0..ids.len())];
    let now_ms = sim.now_ns() / 1_000_000;
    match rng.gen_range(0..9) {
        0 => {
            let rest: Vec<u64> = ids.iter().copied().filter(|&i| i != node).collect();
            sim.partition(&[node], &rest);
            format!("{now_ms}ms isolate {node}")
        }
        1 => {
            let to = ids[rng.gen_range(0..ids.len())];
            sim.block(node, to);
            format!("{now_ms}ms block {node}->{to}")
        }
        2 => {
            sim.heal();
            format!("{now_ms}ms heal")
        }
        3 if sim.is_up(node) && !sim.is_paused(node) => {
            sim.pause(node);
            let until_ms = now_ms + rng.gen_range(50..400);
            paused.push((node, until_ms));
            format!("{now_ms}ms pause {node} until {until_ms}ms")
        }
        4 if sim.is_up(node) => {
            paused.retain(|(n, _)| *n != node);
            sim.crash(node);
            sim.restart(node);
            format!("{now_ms}ms crash+restart {node}")
        }
        5 => {
            let stalled = rng.gen_bool(0.5);
            sim.stall_ticks(node, stalled);
            format!("{now_ms}ms stall ticks {node}: {stalled}")
        }
        6 => {
            let max_delay_us = rng.gen_range(100..5_000);
            let net = NetConfig {
                min_delay_us: rng.gen_range(50..=max_delay_us),
                max_delay_us,
                loss: rng.gen_range(0.0..0.1),
                duplicate: rng.gen_range(0.0..0.05),
            };
            let desc = format!("{now_ms}ms net {net:?}");
            sim.net_mut().config = net;
            desc
        }
        7 => match sim.leader() {
            Some(leader) if leader != node => {
                sim.transfer_leader(leader, node);
                format!("{now_ms}ms transfer {leader}->{node}")
            }
            _ => String::new(),
        },
        _ => {
            let rho = sim.config().lease.drift_ppm as i64;
            let ppm = rng.gen_range(-rho..=rho);
            sim.clock(node).set_drift_ppm(ppm);
            format!("{now_ms}ms drift {node} {ppm}ppm")
        }
    }
}

fn run_seed(seed: u64, safeties: Safeties) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_1ea5e);
    let mut sim = SimCluster::new(config(seed, safeties, &mut rng));
    let mut faults = Vec::new();
    let mut paused: Vec<(u64, u64)> = Vec::new();
    // Safety phase: faults every 50 ms on average, under load.
    let end_ms = safety_ms();
    while sim.now_ns() / 1_000_000 < end_ms {
        let now_ms = sim.now_ns() / 1_000_000;
        for (node, _) in paused.iter().filter(|(_, until)| *until <= now_ms) {
            sim.resume(*node);
        }
        paused.retain(|(_, until)| *until > now_ms);
        if rng.gen_bool(0.4) {
            faults.push(inject(&mut sim, &mut rng, &mut paused));
        }
        let read_mode = [ReadMode::Lease, ReadMode::Auto, ReadMode::ReadIndex][rng.gen_range(0..3)];
        sim.run_with_load(
            20,
            &Load {
                read_mode,
                keys: 3,
                ..Load::default()
            },
        );
    }
    heal_everything(&mut sim, &paused);
    let liveness = liveness_phase(&mut sim);
    assert!(
        liveness.is_ok(),
        "seed {seed}: liveness failed: {}\nfaults: {faults:#?}",
        liveness.unwrap_err()
    );
    Outcome {
        report: sim.check(),
        ops: sim.history().ops().len(),
        faults,
    }
}

fn heal_everything(sim: &mut SimCluster, paused: &[(u64, u64)]) {
    for (node, _) in paused {
        sim.resume(*node);
    }
    sim.heal();
    sim.net_mut().config = NetConfig::default();
    for node in sim.ids() {
        sim.stall_ticks(node, false);
        if !sim.is_up(node) {
            sim.restart(node);
        }
    }
}

/// With every fault healed, a leader emerges and serves a write and a read within 10 s of
/// simulated time. Leadership may still move once or twice while the last faults settle (a node
/// that campaigned during a partition rejoins with a higher term), so each try starts afresh.
fn liveness_phase(sim: &mut SimCluster) -> Result<(), String> {
    let start_ns = sim.now_ns();
    let mut last = String::from("no leader");
    while sim.now_ns() - start_ns < 10_000_000_000 {
        if !sim.run_until(1_000, |s| s.leader().is_some()) {
            continue;
        }
        sim.run_with_load(
            200,
            &Load {
                read_mode: ReadMode::Auto,
                keys: 3,
                ..Load::default()
            },
        );
        let Some(leader) = sim.leader() else { continue };
        let write = sim.put(leader, b"liveness");
        sim.run_for_ms(200);
        let read = sim.get(leader, b"liveness", ReadMode::Auto);
        sim.run_for_ms(200);
        let ops = sim.history().ops();
        match (&ops[write as usize].done, &ops[read as usize].done) {
            (
                Some((_, OpResult::Written { .. })),
                Some((_, OpResult::Read { value: Some(_), .. })),
            ) => {
                let took_ms = (sim.now_ns() - start_ns) / 1_000_000;
                if took_ms > 2_000 {
                    let seed = sim.config().seed;
                    eprintln!("liveness took {took_ms} ms after healing (seed {seed})");
                }
                return Ok(());
            }
            (w, r) => last = format!("write {w:?}, read {r:?}"),
        }
    }
    Err(format!("not serving 10 s after healing; last try: {last}"))
}

#[test]
fn randomized_faults_never_produce_a_stale_read() {
    let (mut ops, mut lease_reads) = (0, 0);
    for seed in seeds() {
        let out = run_seed(seed, Safeties::default());
        let r = &out.report;
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {} violations, first {:?}\nreproduce: RAFT_LEASE_SEED={seed} cargo test --all-features --test randomized\nfaults: {:#?}",
            r.violations.len(),
            r.violations[0],
            out.faults
        );
        ops += out.ops;
        lease_reads += r.lease_reads_checked;
    }
    eprintln!("randomized: {ops} operations, {lease_reads} lease reads checked, 0 violations");
    assert!(lease_reads > 0, "no lease read was checked");
}

#[test]
fn control_randomized_faults_catch_raft_lease_based() {
    let caught: Vec<u64> = seeds()
        .into_iter()
        .filter(|&seed| {
            run_seed(seed, Safeties::raft_lease_based())
                .report
                .stale_reads()
                > 0
        })
        .collect();
    eprintln!("randomized control: raft-rs LeaseBased served stale reads on seeds {caught:?}");
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(
            !caught.is_empty(),
            "random faults never caught raft-rs LeaseBased: the simulation is too gentle"
        );
    }
}
