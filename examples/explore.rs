use raft_lease::sim::*;
use raft_lease::*;
fn main() {
    for mode in [UnsafeMode::Safe, UnsafeMode::RaftLeaseBased] {
        for seed in 0..10 {
            let mut cfg = SimConfig {
                seed,
                ..SimConfig::default()
            };
            cfg.lease.unsafe_mode = mode;
            let mut sim = SimCluster::new(cfg);
            assert!(sim.run_until(2_000, |s| s.leader().is_some()));
            let leader = sim.leader().unwrap();
            sim.run_with_load(300, &Load::default());
            let others: Vec<u64> = sim.ids().into_iter().filter(|&id| id != leader).collect();
            sim.partition(&[leader], &others);
            sim.run_with_load(1_000, &Load::default());
            let r = sim.check();
            let c = sim.node(leader).unwrap().counters();
            println!("{mode:?} seed {seed} leader {leader} new {:?} viol {} stale {} reads {} lease {} writes {} {:?}", sim.leader(), r.violations.len(), r.stale_reads(), r.reads_checked, r.lease_reads_checked, r.writes_acked, c);
        }
    }
}
