//! Shared by the randomized multi-group tests.

/// The seeds to run: `RAFT_LEASE_SEED=N` alone, or `0..RAFT_LEASE_MULTI_SEEDS` (default 16, the
/// CI seeds).
pub fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("RAFT_LEASE_SEED") {
        return vec![seed.parse().expect("RAFT_LEASE_SEED must be a number")];
    }
    let n = std::env::var("RAFT_LEASE_MULTI_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok());
    (0..n.unwrap_or(16)).collect()
}
