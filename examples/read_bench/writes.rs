//! What follower read leases cost writes: a write is exposed (and so answered) only once every
//! live holder has it, not only a majority. Measured side by side, follower leases on and off,
//! at each one-way delay; with one follower five times slower than the other, with and without
//! the lagging-node policy; and the stall after a holder is killed, against its bound.

use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use raft_lease::{FollowerLeases, Safeties};

use crate::cluster::{Cluster, Cmd, Opts};
use crate::measure::Samples;

/// `G`: the longest read lease a leader grants (heartbeats every 30 ms, election timeout 300 ms).
pub const GRANT_MS: u64 = 100;

/// The lagging-node policy's bound in the slow-follower cell: the slow follower's writes arrive
/// about 8 ms after the quorum's at 1 ms and 5 ms one-way.
pub const MAX_LAG_MS: u64 = 3;

/// Follower read leases as the bench runs them.
pub fn follower_leases() -> FollowerLeases {
    FollowerLeases::new(GRANT_MS)
}

/// One write cell, as a JSON object.
fn cell(mode: &str, delay_us: u64, samples: &mut Samples) -> serde_json::Value {
    let (p50_ns, p99_ns, _) = samples.percentiles();
    serde_json::json!({
        "mode": mode, "one_way_delay_us": delay_us, "writes": samples.latencies_ns.len(),
        "failed": samples.failed, "p50_ns": p50_ns, "p99_ns": p99_ns,
    })
}

/// The index of a follower of `leader` that holds a follower read lease (waits up to 10 s).
pub fn holding_follower(cluster: &Cluster, leader: usize) -> usize {
    let f = (leader + 1) % cluster.nodes.len();
    wait_holders(cluster, &[f]);
    f
}

/// Wait until every node in `ids` (indexes) holds a follower read lease; exit if none comes.
fn wait_holders(cluster: &Cluster, ids: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ids.iter().all(|&i| cluster.nodes[i].handle.lease_held()) {
        if Instant::now() > deadline {
            eprintln!("error: followers {ids:?} hold no read lease after 10 s");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A started cluster and its leader, with every follower holding a read lease if they are on.
fn start(delay: Duration, opts: Opts) -> (Cluster, usize) {
    let cluster = Cluster::start_with(3, delay, Safeties::default(), opts);
    let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
        eprintln!("error: no leader at {delay:?} one-way delay");
        std::process::exit(1);
    };
    if opts.follower_leases.is_some() {
        let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        wait_holders(&cluster, &followers);
    }
    (cluster, leader)
}

/// Writes one at a time to `leader` for `window`, each answered once applied there.
fn write_loop(cluster: &Cluster, leader: usize, window: Duration, seq: &mut u64) -> Samples {
    let (tx, rx) = unbounded();
    let mut s = Samples::default();
    let end = Instant::now() + window;
    while Instant::now() < end {
        *seq += 1;
        let write = Cmd::Write {
            key: *seq % 1_000,
            value: *seq,
            started: Instant::now(),
            reply: tx.clone(),
        };
        let _ = cluster.nodes[leader].cmds.send(write);
        match rx.recv_timeout(Duration::from_secs(2)) {
            Ok(done) if done.kind.is_some() => s
                .latencies_ns
                .push(done.started.elapsed().as_nanos() as u64),
            Ok(_) => s.fail("refused", 1),
            Err(_) => s.fail("no_answer", 1),
        }
    }
    s
}

/// Turns per write cell: a write cell measures `TURNS` times the read cells' window, so that
/// its p99 rests on a few dozen samples even at 5 ms one-way.
const TURNS: u32 = 12;

/// Measure `clusters` in turns (`TURNS` rounds of `window` each, after a warm-up), so that slow
/// drifts of the machine fall on every one alike.
fn in_turns(clusters: &[(Cluster, usize)], window: Duration) -> Vec<Samples> {
    let mut seq = 0;
    let mut out: Vec<Samples> = clusters.iter().map(|_| Samples::default()).collect();
    for (c, l) in clusters {
        let _ = write_loop(c, *l, window / 5, &mut seq); // warm-up
    }
    for _ in 0..TURNS {
        for ((c, l), s) in clusters.iter().zip(out.iter_mut()) {
            s.merge(write_loop(c, *l, window / 4, &mut seq));
        }
    }
    out
}

/// Write latency with follower leases on and off, at each one-way delay.
pub fn equal_delays(delays_us: &[u64], window: Duration) -> Vec<serde_json::Value> {
    let on = Opts {
        follower_leases: Some(follower_leases()),
        slow_delay: None,
    };
    let mut cells = Vec::new();
    for &delay_us in delays_us {
        eprint!("\rwrites at {delay_us:>5} µs one-way, follower leases on and off   ");
        let delay = Duration::from_micros(delay_us);
        let clusters = [start(delay, on), start(delay, Opts::default())];
        let [mut with, mut without] = <[Samples; 2]>::try_from(in_turns(&clusters, window))
            .unwrap_or_else(|_| unreachable!("two clusters"));
        cells.push(cell("write_leases_on", delay_us, &mut with));
        cells.push(cell("write_leases_off", delay_us, &mut without));
    }
    eprintln!();
    cells
}

/// One follower five times slower than the other (1 ms and 5 ms one-way): writes with follower
/// leases off, on, and on with the lagging-node policy.
pub fn slow_follower(window: Duration) -> Vec<serde_json::Value> {
    eprintln!("writes with one follower 5x slower (1 ms and 5 ms one-way)");
    let (delay, slow_delay) = (Duration::from_millis(1), Some(Duration::from_millis(5)));
    let policy = follower_leases().with_max_lag_ms(MAX_LAG_MS);
    let kinds = [
        (None, false),
        (Some(follower_leases()), false),
        (Some(policy), true),
    ];
    let clusters: Vec<(Cluster, usize)> = kinds
        .iter()
        .map(|&(follower_leases, _)| {
            let started = start(
                delay,
                Opts {
                    follower_leases,
                    slow_delay,
                },
            );
            let slow = (started.1 + 1) % 3;
            started.0.slow_down(slow as u64 + 1);
            started
        })
        .collect();
    // One after the other, each after writes for three grants: the policy acts on lagging
    // acknowledgements, so it takes up to one grant under writes to leave the slow node out
    // (and a cluster left idle between turns would grant it again).
    let mut seq = 0;
    let warm_up = Duration::from_millis(3 * GRANT_MS);
    let samples: Vec<Samples> = (clusters.iter())
        .map(|(c, l)| {
            let _ = write_loop(c, *l, warm_up, &mut seq);
            write_loop(c, *l, window, &mut seq)
        })
        .collect();
    let mut cells = Vec::new();
    for ((follower_leases, policy), mut s) in kinds.into_iter().zip(samples) {
        let mode = match follower_leases {
            Some(_) => "write_slow_follower_on",
            None => "write_slow_follower_off",
        };
        let mut c = cell(mode, 1_000, &mut s);
        c["slow_one_way_delay_us"] = 5_000.into();
        c["lag_policy"] = policy.into();
        cells.push(c);
    }
    cells
}

/// Kill a holder while writes run one at a time, at 100 µs one-way: the longest write after the
/// kill, against its bound (one grant, plus the write's own round, taken as the p99 before it).
pub fn holder_killed(window: Duration) -> serde_json::Value {
    let on = Opts {
        follower_leases: Some(follower_leases()),
        slow_delay: None,
    };
    let (mut cluster, leader) = start(Duration::from_micros(100), on);
    let mut seq = 0;
    let mut before = write_loop(&cluster, leader, window, &mut seq);
    let (_, p99_ns, _) = before.percentiles();
    let victim = (leader + 1) % 3;
    cluster.kill(victim); // between two writes: the next one waits for its read lease to end
    let after = write_loop(&cluster, leader, window, &mut seq);
    let stall_ns = after.latencies_ns.iter().copied().max().unwrap_or(0);
    let bound_ns = GRANT_MS * 1_000_000 + p99_ns;
    serde_json::json!({
        "mode": "holder_killed_stall", "one_way_delay_us": 100,
        "stall_ms": stall_ns as f64 / 1e6, "bound_ms": bound_ns as f64 / 1e6,
        "grant_ms": GRANT_MS, "write_p99_before_ms": p99_ns as f64 / 1e6,
        "writes_after": after.latencies_ns.len(), "failed_after": after.failed,
    })
}
