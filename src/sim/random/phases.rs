//! The phases of one randomized run: faults under load, every fault healed, and the check that
//! the healed cluster serves again.

use rand::Rng;

use super::nemesis::Nemesis;
use super::SLICE_MS;
use crate::read::ReadMode;
use crate::sim::history::OpResult;
use crate::sim::{Load, SimCluster};

/// Faults every 20 ms with probability 0.4, under load, reads in a random mode per slice.
pub(super) fn safety_phase(
    sim: &mut SimCluster,
    nemesis: &mut Nemesis,
    safety_ms: u64,
) -> Vec<String> {
    let mut faults = Vec::new();
    while sim.now_ns() / 1_000_000 < safety_ms {
        faults.extend(nemesis.undo_due(sim));
        let now_ms = sim.now_ns() / 1_000_000;
        let in_episode = now_ms < nemesis.episode_until_ms;
        let calm = now_ms < nemesis.calm_until_ms;
        if !in_episode && !calm && nemesis.rng.gen_bool(0.4) {
            let fault = nemesis.inject(sim);
            if !fault.is_empty() {
                faults.push(format!("{now_ms}ms {fault}"));
            }
        }
        let modes = [ReadMode::Lease, ReadMode::Auto, ReadMode::ReadIndex];
        let read_mode = if in_episode {
            ReadMode::ReadIndex
        } else {
            modes[nemesis.rng.gen_range(0..3)]
        };
        let quiet = in_episode && nemesis.episode_without_writes;
        // While busy, a write every 0.5 ms: an append is in flight to every follower at any
        // instant, with the grants it carries (a give-up can then overtake one).
        let busy = now_ms < nemesis.busy_until_ms;
        let write_every_us = match (quiet, busy) {
            (true, _) => 0,
            (false, true) => 500,
            (false, false) => Load::default().write_every_us,
        };
        sim.run_with_load(
            SLICE_MS,
            &Load {
                read_mode,
                keys: 3,
                write_every_us,
                // An episode that began in this slice counts from now.
                writes_at: nemesis
                    .episode_writes_at
                    .clone()
                    .filter(|_| now_ms < nemesis.episode_until_ms),
                ..Load::default()
            },
        );
    }
    faults
}

pub(super) fn heal_everything(sim: &mut SimCluster) {
    sim.heal();
    sim.net_mut().config = sim.config().net.clone(); // the seed's own network, not a fault's
    sim.net_mut().clear_delays();
    for node in sim.ids() {
        if sim.is_paused(node) {
            sim.resume(node);
        }
        sim.stall_ticks(node, false);
        if !sim.is_up(node) {
            sim.restart(node);
        }
    }
}

/// With every fault healed, a leader emerges and serves a write and a read within 10 s of
/// simulated time. Leadership may still move while the last faults settle (a node that
/// campaigned during a partition rejoins with a higher term), so each try starts afresh.
pub(super) fn liveness_phase(sim: &mut SimCluster) -> Result<(), String> {
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
                return Ok(());
            }
            (w, r) => last = format!("write {w:?}, read {r:?}"),
        }
    }
    Err(format!(
        "not serving 10 s after healing; last try: {last}\n{}",
        sim.describe()
    ))
}
