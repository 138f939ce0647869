//! Micro-benchmarks of the lease's hot paths, side by side with the floor they are compared to.
//!
//! `cargo bench --bench lease`. Compare `handle_read` with `local_read` (a bare map read plus one
//! clock read): the design target is within 2×.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use raft::storage::MemStorage;
use raft_lease::{
    Clock, Collect, Derived, FollowerPromise, LeaderLease, LeaseConfig, LeaseNode, MonotonicClock,
    ReadMode,
};

/// The real monotonic clock plus an offset, so the bench can step past the boot promise.
struct OffsetClock {
    inner: MonotonicClock,
    offset_ns: AtomicU64,
}

impl Clock for OffsetClock {
    fn now_ns(&self) -> u64 {
        self.inner.now_ns() + self.offset_ns.load(Ordering::Relaxed)
    }
}

fn leader() -> (LeaseNode<MemStorage, Arc<OffsetClock>>, Arc<OffsetClock>) {
    let clock = Arc::new(OffsetClock {
        inner: MonotonicClock::new(),
        offset_ns: AtomicU64::new(0),
    });
    let rc = raft::Config {
        id: 1,
        election_tick: 1_000,
        heartbeat_tick: 10,
        ..raft::Config::default()
    };
    let storage = MemStorage::new_with_conf_state((vec![1], vec![]));
    let cfg = LeaseConfig {
        promise_ms: 10_000,
        ..LeaseConfig::default()
    };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut node = LeaseNode::new(&rc, storage, cfg, 10, clock.clone(), &logger).expect("node");
    clock.offset_ns.store(10_000_000_000, Ordering::Relaxed); // past the boot promise
    node.campaign().expect("campaign");
    node.handle_ready(&mut Collect::default())
        .expect("MemStorage");
    node.tick(); // a single voter renews its lease on its own ticks
    assert!(node.lease_status().state.is_held());
    (node, clock)
}

fn reads(c: &mut Criterion) {
    let map: HashMap<u64, u64> = (0..10_000).map(|k| (k, k * 2)).collect();
    let clock = MonotonicClock::new();
    let mut g = c.benchmark_group("read");
    g.bench_function("local_read", |b| {
        let mut k = 0u64;
        b.iter(|| {
            k = (k + 7) % 10_000;
            black_box(clock.now_ns());
            black_box(map.get(&k).copied())
        })
    });
    let (mut node, _clock) = leader();
    let handle = node.read_handle();
    g.bench_function("handle_read", |b| {
        node.tick();
        let mut k = 0u64;
        b.iter(|| {
            k = (k + 7) % 10_000;
            black_box(
                handle
                    .try_read(|| map.get(&k).copied())
                    .expect("lease held"),
            )
        })
    });
    g.bench_function("node_read_lease", |b| {
        node.tick();
        let mut k = 0u64;
        b.iter(|| {
            k = (k + 7) % 10_000;
            node.read(ReadMode::Lease).expect("lease held");
            black_box(node.serve_reads(|_| map.get(&k).copied()))
        })
    });
    g.finish();
}

fn state_machines(c: &mut Criterion) {
    let derived = Derived {
        promise_ns: 1_000_000_000,
        boot_promise_ns: 1_000_000_000,
        lease_ns: 970_000_000,
        drift_ppm: 10_000,
        margin_ns: 10_000_000,
        renew_before_ns: 320_000_000,
        campaign_jitter_ns: 500_000_000,
        max_grant_ns: None,
        max_lag_ns: None,
    };
    let mut lease = LeaderLease::new(&derived);
    lease.start_term(1);
    lease.on_commit_in_term(1);
    let mut t = 0u64;
    c.bench_function("lease_state_check", |b| {
        b.iter(|| black_box(lease.state(black_box(500))))
    });
    c.bench_function("lease_quorum_ack", |b| {
        b.iter(|| {
            t += 1;
            black_box(lease.on_quorum_ack(1, t, derived.lease_ns))
        })
    });
    let mut promise = FollowerPromise::none(1_000_000_000);
    promise.on_leader_message(1, 0);
    c.bench_function("promise_check_vote", |b| {
        b.iter(|| black_box(promise.check_vote(2, black_box(5))))
    });
}

criterion_group!(benches, reads, state_machines);
criterion_main!(benches);
