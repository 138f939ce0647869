//! Costs of the general lease primitives. `cargo bench --bench grant`.
//!
//! `keepalive_10k_sessions` refreshes 10,000 sessions (12 s TTL) in one batched call. At the
//! seed design's load of about 2,500 renewals/s, the fraction of one core is
//! `2,500 × (time per batch / 10,000) / 1 s`. `checkpoint_10k_sessions` records the time each of
//! them has left (once per checkpoint interval), and `takeover_10k_sessions` re-bases them on a
//! new grantor's clock (once per failover); compare each with the keep-alive batch of the same run.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use raft_lease::grant::{GrantConfig, GrantorRecord, LeaseServer, SessionId, Sessions};
use raft_lease::SimClock;

fn grantor(c: &mut Criterion) {
    let first_start = GrantorRecord::default();
    let mut server = LeaseServer::restore(SimClock::new(0, 0), GrantConfig::default(), first_start);
    let mut now_ns = 0u64;
    c.bench_function("acquire_new_owner", |b| {
        b.iter(|| {
            now_ns += 1;
            let client = now_ns;
            let grant = server.acquire(client, 1_000, now_ns).expect("free");
            server.release(client, grant.token);
            black_box(grant)
        })
    });
    let token = server.acquire(7, 1_000, now_ns).expect("free").token;
    c.bench_function("renew_same_owner", |b| {
        b.iter(|| {
            now_ns += 1;
            black_box(server.renew(7, token, 1_000, now_ns))
        })
    });
}

fn sessions(c: &mut Criterion) {
    let mut sessions = Sessions::new(GrantConfig::default());
    let ids: Vec<SessionId> = (0..10_000)
        .map(|_| sessions.grant(12_000, 0).expect("ttl"))
        .collect();
    let mut now_ns = 0u64;
    c.bench_function("keepalive_10k_sessions", |b| {
        b.iter(|| {
            now_ns += 1_000;
            black_box(sessions.keepalive(&ids, now_ns))
        })
    });
    c.bench_function("checkpoint_10k_sessions", |b| {
        b.iter(|| {
            now_ns += 1_000;
            black_box(sessions.checkpoint(now_ns))
        })
    });
    c.bench_function("takeover_10k_sessions", |b| {
        b.iter(|| {
            now_ns += 1_000;
            sessions.takeover(now_ns);
            black_box(sessions.next_expiry_ns())
        })
    });
}

criterion_group!(benches, grantor, sessions);
criterion_main!(benches);
