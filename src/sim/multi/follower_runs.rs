//! The randomized multi-group simulation with follower read leases: every voter of every group
//! serves reads under the read leases its leader grants, checked for linearizability at every
//! read, and the lease monitor checks at every step that no read lease lives while a node other
//! than the one that granted it leads a later term.
//!
//! These runs draw the same faults as [`super::random`], on the same configs, and two things of
//! their own from generators of their own, so that each seed's other draws stay as they are:
//! - half of them run five nodes, every one a voter of every group (a majority can then elect
//!   without both the old leader and a holder on its side);
//! - a group split, as an episode: one group's raft messages between its leader, with up to
//!   one follower, and the other nodes are lost both ways for `P` to `5P`, while the node
//!   stream carries support and fortification as before (the store's transport sends a group's
//!   appends and the node's support on separate lanes with separate queues). A leader cut off
//!   from its group's quorum this way steps down by check-quorum with its read leases still
//!   live, while its node's support of it flows on.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::random::{self, MultiControl, MultiOutcome};
use super::{MultiSim, MultiSimConfig};
use crate::config::FollowerLeases;
use crate::read::ReadMode;

/// The config for `seed` with follower read leases: [`random::config`], then `G` drawn from
/// above one heartbeat interval to below half the shortest election timeout of any node, and
/// half the time five nodes, every one a voter of every group.
pub fn config(seed: u64, control: Option<MultiControl>) -> MultiSimConfig {
    let mut c = random::config(seed, control);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xf011_0e45);
    if rng.gen_bool(0.5) {
        c.nodes = 5;
        c.replicas = 0;
        let drift = c.drift_ppm.iter().map(|d| d.abs()).max().unwrap_or(0);
        while c.drift_ppm.len() < 5 {
            c.drift_ppm.push(rng.gen_range(-drift..=drift));
        }
        while c.promise_ms_per_node.len() < 5 && !c.promise_ms_per_node.is_empty() {
            c.promise_ms_per_node.push(c.lease.promise_ms);
        }
    }
    // A rolling change of the promise (see `faults::rolling_change`) gives a node only a
    // promise `G` fits (below half its election timeout), as a store refuses to start with one
    // it does not.
    let shortest_ms = (1..=c.nodes as usize)
        .map(|idx| match c.promise_ms_per_node.get(idx - 1).copied() {
            Some(ms) if ms > 0 => ms,
            _ => c.election_tick as u64 * c.tick_ms,
        })
        .min()
        .expect("nodes");
    let heartbeat_ms = c.heartbeat_tick as u64 * c.tick_ms;
    let (lo_ms, hi_ms) = (heartbeat_ms + 1, (shortest_ms - 1) / 2);
    assert!(lo_ms <= hi_ms, "no valid G for {c:?}");
    // Half the time from the top half of the range: a read lease granted just before a
    // step-down then outlives the jitter of the released voters' campaigns.
    let lo_ms = match rng.gen_bool(0.5) {
        true => lo_ms.max((lo_ms + hi_ms) / 2),
        false => lo_ms,
    };
    c.lease.follower_leases = Some(FollowerLeases::new(rng.gen_range(lo_ms..=hi_ms)));
    c
}

/// Run one seed with follower read leases for `safety_ms` of faults, then the liveness phase.
pub fn run(seed: u64, control: Option<MultiControl>, safety_ms: u64) -> MultiOutcome {
    random::run_config(config(seed, control), safety_ms).0
}

/// A group split (see the module docs), as an episode: from a quiet network (see
/// [`super::episodes`]), group `gid`'s leader, with up to one of its followers, loses the
/// group's raft messages to and from every other node for `P` to `5P`, under the run's load
/// and with no other fault meanwhile; then the group's messages flow again.
pub(super) fn group_split(sim: &mut MultiSim, rng: &mut ChaCha8Rng) -> String {
    let gid = rng.gen_range(1..=sim.config().groups);
    super::episodes::quiet(sim, gid);
    let Some(leader) = sim.leader(gid) else {
        return format!("group {gid}: no leader to split from its group");
    };
    let n = sim.config().nodes;
    let mut side = vec![leader];
    if rng.gen_bool(0.7) {
        let others: Vec<u64> = (1..=n).filter(|&x| x != leader).collect();
        side.push(others[rng.gen_range(0..others.len())]);
    }
    let rest: Vec<u64> = (1..=n).filter(|b| !side.contains(b)).collect();
    let p_ms = sim.max_promise_ms();
    let ms = rng.gen_range(p_ms..=5 * p_ms);
    for &a in &side {
        rest.iter().for_each(|&b| sim.mute_group_link(gid, a, b));
    }
    let mode = [ReadMode::Lease, ReadMode::Auto, ReadMode::ReadIndex][rng.gen_range(0..3)];
    sim.run_with_load(ms, mode, 2_000, 5_000);
    for &a in &side {
        rest.iter().for_each(|&b| sim.unmute_group_link(gid, a, b));
    }
    let led = sim.leader(gid);
    format!("group {gid}: {side:?} cut from {rest:?} in the group alone for {ms}ms (then led by {led:?})")
}
