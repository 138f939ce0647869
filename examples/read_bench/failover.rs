//! Failover: kill the leader, time the first successful read afterwards, lease vs ReadIndex.

use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use raft_lease::{ReadMode, Safeties};

use crate::cluster::{Cluster, Cmd, TICK};

/// Time from `killed_at` to the first read served by any live node, by `mode`. For `Auto`, the
/// read handle (lease, on the caller's thread) is tried first on each node.
fn first_read(
    cluster: &Cluster,
    killed: usize,
    mode: ReadMode,
    killed_at: Instant,
) -> Option<Duration> {
    let (tx, rx) = unbounded();
    while killed_at.elapsed() < Duration::from_secs(10) {
        for (i, n) in cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != killed)
        {
            if mode == ReadMode::Auto && n.handle.read(|| crate::cluster::get(&n.state, 1)).is_ok()
            {
                return Some(killed_at.elapsed());
            }
            let _ = i;
            let _ = n.cmds.send(Cmd::Read {
                mode,
                started: Instant::now(),
                reply: tx.clone(),
            });
            if let Ok(done) = rx.recv_timeout(Duration::from_millis(20)) {
                if done.kind.is_some() {
                    return Some(killed_at.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

pub fn run(trials: usize, delay: Duration) {
    let mut cluster = Cluster::start(3, delay, Safeties::default());
    let (mut lease, mut index) = (Vec::new(), Vec::new());
    for trial in 1..=trials {
        let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
            eprintln!("error: no leader before trial {trial}");
            std::process::exit(1);
        };
        std::thread::sleep(Duration::from_millis(200)); // a steady lease
        let killed_at = Instant::now();
        cluster.kill(leader);
        let (a, b) = std::thread::scope(|s| {
            let c = &cluster;
            let a = s.spawn(move || first_read(c, leader, ReadMode::Auto, killed_at));
            let b = s.spawn(move || first_read(c, leader, ReadMode::ReadIndex, killed_at));
            (a.join().expect("auto"), b.join().expect("index"))
        });
        eprint!(
            "\r[trial {trial}/{trials}] auto {:?} read_index {:?}        ",
            a, b
        );
        lease.extend(a);
        index.extend(b);
        cluster.restart(leader);
        std::thread::sleep(Duration::from_millis(500)); // catch up
    }
    eprintln!();
    report("lease_handle/auto", &mut lease, trials);
    report("read_index", &mut index, trials);
    let (p_ms, election_ms, round_ms) = (
        300.0,
        30.0 * TICK.as_millis() as f64,
        2.0 * delay.as_secs_f64() * 1e3,
    );
    println!(
        "lease arithmetic: P ({p_ms} ms) + election (timeout {election_ms}..{} ms, then vote rounds) + one round ({round_ms:.1} ms)",
        2.0 * election_ms
    );
}

fn report(name: &str, samples: &mut [Duration], trials: usize) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    match (samples.get(samples.len() / 2), samples.last()) {
        (Some(p50), Some(max)) => println!(
            "{name:<18} kill → first read: p50 {:>7.1} ms  max {:>7.1} ms  ({} of {trials} trials)",
            ms(*p50),
            ms(*max),
            samples.len()
        ),
        _ => println!("{name:<18} no read succeeded"),
    }
}
