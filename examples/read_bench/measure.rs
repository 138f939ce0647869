//! Measuring one cell: a mode, a one-way delay and a number of outstanding reads.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use raft_lease::{Clock, MonotonicClock, ReadError, ReadMode};

use crate::cluster::{Cluster, Cmd, Done};

/// How a read is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Local,
    LeaseHandle,
    LeaseNode,
    ReadIndex,
    RaftrsReadIndex,
    RaftrsLeaseBased,
    /// A read through a follower's handle, under its follower read lease.
    FollowerLease,
}

impl Mode {
    pub const ALL: [Mode; 7] = [
        Mode::Local,
        Mode::LeaseHandle,
        Mode::LeaseNode,
        Mode::ReadIndex,
        Mode::RaftrsReadIndex,
        Mode::RaftrsLeaseBased,
        Mode::FollowerLease,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::LeaseHandle => "lease_handle",
            Mode::LeaseNode => "lease_node",
            Mode::ReadIndex => "read_index",
            Mode::RaftrsReadIndex => "raftrs_read_index",
            Mode::RaftrsLeaseBased => "raftrs_lease_based",
            Mode::FollowerLease => "follower_lease",
        }
    }

    /// Served on the caller's thread, with no round through the raft thread.
    fn synchronous(self) -> bool {
        matches!(self, Mode::Local | Mode::LeaseHandle | Mode::FollowerLease)
    }
}

/// One cell's results.
#[derive(Debug, Clone)]
pub struct Cell {
    pub mode: Mode,
    pub one_way_delay_us: u64,
    pub outstanding: usize,
    pub client_threads: usize,
    pub reads: u64,
    pub failed: u64,
    /// `failed` by reason ([`Samples::fail`]).
    pub failed_by: BTreeMap<&'static str, u64>,
    /// Runs of refusals back to back on one client thread, and the longest in ns.
    pub refusal_runs: u64,
    pub longest_refusal_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub reads_per_sec: f64,
    pub msgs_per_read: f64,
    /// A thread-scaling cell: `client_threads` reader threads, each with its own handle.
    pub scaling: bool,
}

impl Cell {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode.name(), "one_way_delay_us": self.one_way_delay_us, "outstanding": self.outstanding,
            "client_threads": self.client_threads, "reads": self.reads, "failed": self.failed,
            "failed_by": self.failed_by, "refusal_rate": self.refusal_rate(),
            "refusal_runs": self.refusal_runs, "longest_refusal_us": self.longest_refusal_ns / 1_000,
            "p50_ns": self.p50_ns, "p99_ns": self.p99_ns, "p999_ns": self.p999_ns,
            "reads_per_sec": self.reads_per_sec, "msgs_per_read": self.msgs_per_read,
            "scaling": self.scaling,
        })
    }

    /// The share of reads refused: failed / (served + failed).
    pub fn refusal_rate(&self) -> f64 {
        self.failed as f64 / (self.reads + self.failed).max(1) as f64
    }

    /// What the failures were, on one line (empty: none).
    pub fn failures(&self) -> String {
        if self.failed == 0 {
            return String::new();
        }
        let by: Vec<String> = self
            .failed_by
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        format!(
            "{} {} us out {}: {} failed ({:.1}% of reads: {}), in {} runs back to back, the longest {:.1} ms",
            self.mode.name(),
            self.one_way_delay_us,
            self.outstanding,
            self.failed,
            100.0 * self.refusal_rate(),
            by.join(", "),
            self.refusal_runs,
            self.longest_refusal_ns as f64 / 1e6,
        )
    }
}

/// Latencies of successful reads, and failures by reason.
#[derive(Default)]
pub struct Samples {
    pub latencies_ns: Vec<u64>,
    /// Reads not served: the sum of `failed_by`.
    pub failed: u64,
    /// Why: `no_lease` (the handle holds no valid lease: on a follower, its read lease lapsed,
    /// as when the client threads starve the node threads of CPU), `not_leader`, `refused`
    /// (the raft thread answered with an error), `no_answer` (none within 2 s).
    pub failed_by: BTreeMap<&'static str, u64>,
    /// Runs of refusals back to back on one client thread (one lapse of a lease shows as one
    /// run of many quick refusals), and the longest, in ns.
    pub refusal_runs: u64,
    pub longest_refusal_ns: u64,
}

impl Samples {
    pub fn merge(&mut self, other: Samples) {
        self.latencies_ns.extend(other.latencies_ns);
        self.failed += other.failed;
        for (why, n) in other.failed_by {
            *self.failed_by.entry(why).or_default() += n;
        }
        self.refusal_runs += other.refusal_runs;
        self.longest_refusal_ns = self.longest_refusal_ns.max(other.longest_refusal_ns);
    }

    /// A run of refusals that began at `since` has ended.
    fn end_refusal_run(&mut self, since: Instant) {
        self.refusal_runs += 1;
        let run_ns = since.elapsed().as_nanos() as u64;
        self.longest_refusal_ns = self.longest_refusal_ns.max(run_ns);
    }

    /// `n` reads not served, for `why`.
    pub fn fail(&mut self, why: &'static str, n: u64) {
        self.failed += n;
        *self.failed_by.entry(why).or_default() += n;
        debug_assert_eq!(self.failed, self.failed_by.values().sum::<u64>());
    }

    /// (p50, p99, p99.9) in ns.
    pub fn percentiles(&mut self) -> (u64, u64, u64) {
        self.latencies_ns.sort_unstable();
        let at = |q: f64| {
            let n = self.latencies_ns.len();
            if n == 0 {
                return 0;
            }
            self.latencies_ns[((n as f64 * q) as usize).min(n - 1)]
        };
        (at(0.50), at(0.99), at(0.999))
    }
}

/// Run `mode` against `leader` for `window`, with `outstanding` reads in flight.
pub fn run_reads(
    cluster: &Cluster,
    leader: usize,
    mode: Mode,
    outstanding: usize,
    window: Duration,
) -> (Samples, usize) {
    if mode.synchronous() {
        let threads = outstanding.min(std::thread::available_parallelism().map_or(2, |n| n.get()));
        return (
            sync_threads(cluster, leader, mode, threads, window),
            threads,
        );
    }
    (async_loop(cluster, leader, mode, outstanding, window), 1)
}

/// `threads` reader threads, each with its own handle, for `window`.
fn sync_threads(
    cluster: &Cluster,
    leader: usize,
    mode: Mode,
    threads: usize,
    window: Duration,
) -> Samples {
    {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| s.spawn(|| sync_loop(cluster, leader, mode, window)))
                .collect();
            let mut all = Samples::default();
            for h in handles {
                all.merge(h.join().expect("client thread"));
            }
            all
        })
    }
}

/// A synchronous mode with `threads` reader threads (a thread-scaling cell).
pub fn scaling(
    cluster: &Cluster,
    leader: usize,
    mode: Mode,
    threads: usize,
    window: Duration,
) -> Cell {
    assert!(
        mode.synchronous(),
        "scaling cells are for local and lease_handle"
    );
    let _ = sync_threads(cluster, leader, mode, threads, window / 5); // warm-up
    let t0 = Instant::now();
    let mut samples = sync_threads(cluster, leader, mode, threads, window);
    let secs = t0.elapsed().as_secs_f64();
    let (p50_ns, p99_ns, p999_ns) = samples.percentiles();
    let reads = samples.latencies_ns.len() as u64;
    Cell {
        mode,
        one_way_delay_us: 0,
        outstanding: threads,
        client_threads: threads,
        reads,
        failed: samples.failed,
        failed_by: samples.failed_by.clone(),
        refusal_runs: samples.refusal_runs,
        longest_refusal_ns: samples.longest_refusal_ns,
        p50_ns,
        p99_ns,
        p999_ns,
        reads_per_sec: reads as f64 / secs,
        msgs_per_read: 0.0,
        scaling: true,
    }
}

fn sync_loop(cluster: &Cluster, leader: usize, mode: Mode, window: Duration) -> Samples {
    let node = &cluster.nodes[leader];
    let handle = node.handle.clone(); // a reader thread's own handle
    let clock = MonotonicClock::new();
    let mut s = Samples {
        latencies_ns: Vec::with_capacity(1 << 20),
        ..Samples::default()
    };
    let end = Instant::now() + window;
    let mut k = 0u64;
    let mut refusing_since = None;
    while Instant::now() < end {
        for _ in 0..256 {
            k = (k + 7) % 1_000;
            let t0 = Instant::now();
            let read = match mode {
                Mode::Local => {
                    std::hint::black_box(clock.now_ns());
                    std::hint::black_box(crate::cluster::get(&node.state, k));
                    Ok(())
                }
                _ => handle
                    .read(|| crate::cluster::get(&node.state, k))
                    .map(|_| ()),
            };
            let dt = t0.elapsed().as_nanos() as u64;
            match read {
                Ok(()) => {
                    s.latencies_ns.push(dt);
                    if let Some(since) = refusing_since.take() {
                        s.end_refusal_run(since);
                    }
                }
                Err(e) => {
                    refusing_since.get_or_insert(t0);
                    s.fail(reason(&e), 1);
                }
            }
        }
    }
    if let Some(since) = refusing_since {
        s.end_refusal_run(since);
    }
    s
}

/// The name a refusal is counted under.
fn reason(e: &ReadError) -> &'static str {
    match e {
        ReadError::LeaseNotHeld => "no_lease",
        ReadError::NotLeader { .. } => "not_leader",
    }
}

fn issue(cluster: &Cluster, leader: usize, mode: Mode, reply: &Sender<Done>) {
    let started = Instant::now();
    let reply = reply.clone();
    let cmd = match mode {
        Mode::LeaseNode => Cmd::Read {
            mode: ReadMode::Lease,
            started,
            reply,
        },
        Mode::ReadIndex => Cmd::Read {
            mode: ReadMode::ReadIndex,
            started,
            reply,
        },
        _ => Cmd::RawRead { started, reply },
    };
    let _ = cluster.nodes[leader].cmds.send(cmd);
}

fn async_loop(
    cluster: &Cluster,
    leader: usize,
    mode: Mode,
    outstanding: usize,
    window: Duration,
) -> Samples {
    let (tx, rx): (Sender<Done>, Receiver<Done>) = unbounded();
    let mut s = Samples::default();
    for _ in 0..outstanding {
        issue(cluster, leader, mode, &tx);
    }
    let end = Instant::now() + window;
    let mut in_flight = outstanding;
    while in_flight > 0 {
        let Some(done) = recv_spinning(&rx, Duration::from_secs(2)) else {
            s.fail("no_answer", in_flight as u64); // dropped by raft: give up on them
            break;
        };
        in_flight -= 1;
        match done.kind {
            Some(_) => s
                .latencies_ns
                .push(done.started.elapsed().as_nanos() as u64),
            None => s.fail("refused", 1),
        }
        if Instant::now() < end {
            issue(cluster, leader, mode, &tx);
            in_flight += 1;
        }
    }
    s
}

/// Receive, spinning briefly before blocking: a client waiting on an answer that comes within
/// microseconds should not pay for a futex wake-up.
fn recv_spinning<T>(rx: &Receiver<T>, timeout: Duration) -> Option<T> {
    let spin_until = Instant::now() + Duration::from_micros(50);
    while Instant::now() < spin_until {
        if let Ok(v) = rx.try_recv() {
            return Some(v);
        }
        std::thread::yield_now();
    }
    rx.recv_timeout(timeout).ok()
}

/// A cell measured against raft messages: `idle_msgs_per_sec` is subtracted.
pub fn measure(
    cluster: &Cluster,
    leader: usize,
    mode: Mode,
    delay_us: u64,
    outstanding: usize,
    window: Duration,
    idle_msgs_per_sec: f64,
) -> Cell {
    let _ = run_reads(cluster, leader, mode, outstanding, window / 5); // warm-up
    let msgs_before = cluster.messages_sent();
    let t0 = Instant::now();
    let (mut samples, client_threads) = run_reads(cluster, leader, mode, outstanding, window);
    let secs = t0.elapsed().as_secs_f64();
    let msgs = (cluster.messages_sent() - msgs_before) as f64 - idle_msgs_per_sec * secs;
    let (p50_ns, p99_ns, p999_ns) = samples.percentiles();
    let reads = samples.latencies_ns.len() as u64;
    Cell {
        mode,
        one_way_delay_us: delay_us,
        outstanding,
        client_threads,
        reads,
        failed: samples.failed,
        failed_by: samples.failed_by.clone(),
        refusal_runs: samples.refusal_runs,
        longest_refusal_ns: samples.longest_refusal_ns,
        p50_ns,
        p99_ns,
        p999_ns,
        reads_per_sec: reads as f64 / secs,
        msgs_per_read: if reads == 0 {
            0.0
        } else {
            (msgs / reads as f64).max(0.0)
        },
        scaling: false,
    }
}

/// Raft messages per second with no client load (heartbeats).
pub fn idle_rate(cluster: &Cluster, window: Duration) -> f64 {
    let before = cluster.messages_sent();
    let t0 = Instant::now();
    std::thread::sleep(window);
    (cluster.messages_sent() - before) as f64 / t0.elapsed().as_secs_f64()
}

/// Lease reads through the raft thread, one at a time, for `window`: without writes, then with a
/// write issued (not waited for) before every ninth read, so that 10% of operations are writes and
/// reads find entries committed but not yet applied. Returns the read latencies of each run.
pub fn mixed(cluster: &Cluster, leader: usize, window: Duration) -> (Samples, Samples) {
    let run = |with_writes: bool| {
        let (tx, rx) = unbounded();
        let (wtx, wrx) = unbounded();
        let mut s = Samples::default();
        let end = Instant::now() + window;
        let mut i = 0u64;
        while Instant::now() < end {
            i += 1;
            if with_writes && i % 9 == 0 {
                let write = Cmd::Write {
                    key: i % 100,
                    value: i,
                    started: Instant::now(),
                    reply: wtx.clone(),
                };
                let _ = cluster.nodes[leader].cmds.send(write);
            }
            let started = Instant::now();
            let _ = cluster.nodes[leader].cmds.send(Cmd::Read {
                mode: ReadMode::Lease,
                started,
                reply: tx.clone(),
            });
            match rx.recv_timeout(Duration::from_secs(2)) {
                Ok(Done {
                    kind: Some(_),
                    started,
                }) => s.latencies_ns.push(started.elapsed().as_nanos() as u64),
                Ok(_) => s.fail("refused", 1),
                Err(_) => s.fail("no_answer", 1),
            }
        }
        while wrx.recv_timeout(Duration::from_millis(100)).is_ok() {}
        s
    };
    (run(false), run(true))
}
