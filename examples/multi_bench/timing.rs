//! The timing every cell runs with, both modes alike, chosen as a deployment with many groups
//! would: 50 ms ticks, raft heartbeats every 100 ms, an election timeout of 1 s (randomized up
//! to 2 s, raft-rs's default spread), and the default lease (`P` = 1 s, ρ = 10%, ε = 10 ms, so
//! `L` ≈ 808 ms). Idle groups quiesce after 500 ms (shared liveness only).

use raft_lease::multi::{LivenessMode, MultiConfig};
use raft_lease::LeaseConfig;

/// Real interval between ticks.
pub const TICK_MS: u64 = 50;
/// raft heartbeats every 2 ticks: 100 ms.
const HEARTBEAT_TICKS: usize = 2;
/// raft's minimum election timeout: 20 ticks, 1 s (raft-rs draws it from `[20, 40)` ticks).
const ELECTION_TICKS: usize = 20;
/// An idle group quiesces after 10 ticks (500 ms) in shared liveness.
const QUIESCE_AFTER_TICKS: u32 = 10;

/// raft's config for every group (its id is set per node by `MultiNode`).
fn raft_config() -> raft::Config {
    raft::Config {
        election_tick: ELECTION_TICKS,
        heartbeat_tick: HEARTBEAT_TICKS,
        check_quorum: true,
        pre_vote: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        ..raft::Config::default()
    }
}

/// The lease config of every group: the crate's default.
fn lease_config() -> LeaseConfig {
    LeaseConfig::default()
}

/// The whole config of node `node_id` (first boot) in `mode`.
pub fn multi_config(node_id: u64, mode: LivenessMode, seed: u64) -> MultiConfig {
    MultiConfig {
        node_id,
        incarnation: 1,
        mode,
        raft: raft_config(),
        lease: LeaseConfig {
            seed,
            ..lease_config()
        },
        tick_ms: TICK_MS,
        quiesce_after_ticks: QUIESCE_AFTER_TICKS,
        seed,
    }
}

/// `P` in ms.
pub fn promise_ms() -> u64 {
    lease_config().promise_ms
}

/// raft's minimum election timeout in ms.
pub fn election_ms() -> u64 {
    ELECTION_TICKS as u64 * TICK_MS
}

/// raft's heartbeat interval in ms.
pub fn heartbeat_ms() -> u64 {
    HEARTBEAT_TICKS as u64 * TICK_MS
}

/// The failover target: `P` + one election timeout + 1 s.
pub fn failover_bound_ms() -> u64 {
    promise_ms() + election_ms() + 1_000
}

/// The lease `L` in ms, as validated against raft's config (panics on a bad config: a bench bug).
pub fn lease_ms() -> f64 {
    let d = lease_config()
        .validate(&raft_config(), TICK_MS)
        .expect("the bench's lease config validates");
    d.lease_ns as f64 / 1e6
}
