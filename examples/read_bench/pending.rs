//! Cost as work grows: `n` ReadIndex reads outstanding at once, up to 100,000. Each size is run
//! twice: with the cluster answering (time per read, issue to answer), and with the followers
//! stopped so that the reads stay pending (memory per pending read, from the process's RSS).

use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use raft_lease::{ReadMode, Safeties};

use crate::cluster::{Cluster, Cmd};

/// Issue `n` ReadIndex reads at `leader` at once; returns the reply channel.
fn issue(
    cluster: &Cluster,
    leader: usize,
    n: usize,
) -> crossbeam_channel::Receiver<crate::cluster::Done> {
    let (tx, rx) = unbounded();
    for _ in 0..n {
        let cmd = Cmd::Read {
            mode: ReadMode::ReadIndex,
            started: Instant::now(),
            reply: tx.clone(),
        };
        let _ = cluster.nodes[leader].cmds.send(cmd);
    }
    rx
}

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:"));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// One size with the cluster answering: nanoseconds per read from the first issue to the last answer.
fn answered(n: usize) -> Option<f64> {
    let cluster = Cluster::start(3, Duration::from_micros(100), Safeties::default());
    let leader = cluster.leader(Duration::from_secs(10))?;
    let t0 = Instant::now();
    let rx = issue(&cluster, leader, n);
    for _ in 0..n {
        rx.recv_timeout(Duration::from_secs(30)).ok()?.kind?;
    }
    Some(t0.elapsed().as_nanos() as f64 / n as f64)
}

/// One size with the followers stopped: bytes of RSS per pending read.
fn pending_bytes(n: usize) -> Option<f64> {
    let mut cluster = Cluster::start(3, Duration::from_micros(100), Safeties::default());
    let leader = cluster.leader(Duration::from_secs(10))?;
    for i in (0..3).filter(|&i| i != leader) {
        cluster.kill(i);
    }
    let before = rss_kib();
    let rx = issue(&cluster, leader, n);
    std::thread::sleep(Duration::from_millis(50)); // the raft thread takes them in
    let after = rss_kib();
    drop(rx);
    Some((after.saturating_sub(before) * 1024) as f64 / n as f64)
}

/// Print both measurements for 1,000, 10,000 and 100,000 reads.
pub fn run() {
    println!("ReadIndex reads outstanding at once, 3 nodes, 100 µs one-way:");
    for n in [1_000, 10_000, 100_000] {
        match (answered(n), pending_bytes(n)) {
            (Some(ns), Some(bytes)) => println!(
                "  {n:>7} reads: {ns:>8.0} ns per read issued to answered; {bytes:>6.0} bytes of RSS per pending read"
            ),
            _ => println!("  {n:>7} reads: no leader, or reads failed"),
        }
    }
}
