//! The phases of one cell, measured from outside the node threads: setup until every group has
//! a leased leader, the idle window, lease reads on random groups, and failover.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raft_lease::multi::LivenessMode;
use raft_lease::{Clock as _, ReadHandle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cluster::Cluster;
use crate::node::Clock;
use crate::timing;

/// Per group (index `gid - 1`), the index of a live node whose replica holds a valid lease.
pub fn lease_holders(c: &Cluster) -> Vec<Option<usize>> {
    (0..c.groups as usize)
        .map(|g| {
            c.nodes
                .iter()
                .position(|n| n.is_alive() && n.handles[g].lease_held())
        })
        .collect()
}

fn leased_count(c: &Cluster) -> usize {
    lease_holders(c).iter().filter(|h| h.is_some()).count()
}

/// How setup went.
pub struct Setup {
    /// From boot until every group had a leased leader (or the timeout).
    pub leased_ms: f64,
    /// Groups with a leased leader at the end of setup.
    pub leased: usize,
    /// Share of replicas quiescent at the end of setup (shared liveness), in %.
    pub quiescent_pct: f64,
}

/// Wait until every group has a leased leader, then (shared liveness) until every replica has
/// quiesced, each for at most `timeout`; then let the cluster settle for `settle`.
pub fn setup(c: &Cluster, mode: LivenessMode, timeout: Duration, settle: Duration) -> Setup {
    let t0 = Instant::now();
    let all = c.groups as usize;
    while leased_count(c) < all && t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(50));
    }
    let leased_ms = t0.elapsed().as_secs_f64() * 1e3;
    let replicas = all * c.nodes.len();
    let quiesced = || c.quiescent().iter().sum::<usize>();
    if mode == LivenessMode::Shared {
        let t1 = Instant::now();
        while quiesced() < replicas && t1.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(settle);
    Setup {
        leased_ms,
        leased: leased_count(c),
        quiescent_pct: 100.0 * quiesced() as f64 / replicas as f64,
    }
}

/// The idle window's figures, per node (averaged over the nodes).
pub struct Idle {
    pub msgs_per_s: f64,
    pub batches_per_s: f64,
    pub cpu_ms_per_s: f64,
    /// The lowest share of groups with a leased leader over the window's samples, in %.
    pub min_lease_pct: f64,
    /// Ticks the node threads were too late for, all nodes, over the window.
    pub ticks_missed: u64,
}

/// Sample the counters over `window`, and the leases `samples` times within it.
pub fn idle(c: &Cluster, window: Duration, samples: u32) -> Idle {
    let count = |f: fn(&crate::node::NodeStats) -> u64| -> u64 {
        c.nodes.iter().map(|n| f(&n.stats)).sum()
    };
    let msgs = || count(|s| s.msgs_sent.load(Ordering::Relaxed));
    let batches = || count(|s| s.batches_sent.load(Ordering::Relaxed));
    let missed = || count(|s| s.ticks_missed.load(Ordering::Relaxed));
    let cpu0: Vec<_> = c.nodes.iter().map(|n| n.stats.cpu()).collect();
    let (m0, b0, k0, t0) = (msgs(), batches(), missed(), Instant::now());
    let mut min_lease_pct = f64::MAX;
    for i in 1..=samples {
        let at = t0 + window * i / samples;
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let pct = 100.0 * leased_count(c) as f64 / c.groups as f64;
        min_lease_pct = min_lease_pct.min(pct);
    }
    let secs = t0.elapsed().as_secs_f64();
    let nodes = c.nodes.len() as f64;
    let cpu_ms: f64 = c
        .nodes
        .iter()
        .zip(cpu0)
        .map(|(n, before)| cpu_rate_ms_per_s(before, n.stats.cpu()))
        .sum();
    Idle {
        msgs_per_s: (msgs() - m0) as f64 / secs / nodes,
        batches_per_s: (batches() - b0) as f64 / secs / nodes,
        cpu_ms_per_s: cpu_ms / nodes,
        min_lease_pct,
        ticks_missed: missed() - k0,
    }
}

/// CPU ms per second between two `(instant, cpu ns)` samples of one thread.
fn cpu_rate_ms_per_s(before: Option<(Instant, u64)>, after: Option<(Instant, u64)>) -> f64 {
    match (before, after) {
        (Some((t0, c0)), Some((t1, c1))) if t1 > t0 => {
            (c1 - c0) as f64 / 1e6 / (t1 - t0).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// Reads timed together by one pair of timer readings (see [`reads`]).
pub const BATCH: usize = 64;

/// Read latencies on random groups, in ns.
pub struct Reads {
    /// Per-read p50: the median over batches of [`BATCH`] reads of the batch's time / [`BATCH`].
    pub p50_ns: f64,
    /// p50 and p99 of reads timed one by one (each includes one timer reading's cost, and the
    /// timer moves in steps of about 10 ns on this machine).
    pub single_p50_ns: u64,
    pub p99_ns: u64,
    /// Lease reads done in the timed phases (after warm-up), and how many failed.
    pub reads: u64,
    pub failed: u64,
    /// The same random choice and state load with a clock reading but no lease check (the
    /// floor: what reaching a random group's state costs at this number of groups), measured
    /// as `p50_ns` and `single_p50_ns` are.
    pub local_p50_ns: f64,
    pub local_single_p50_ns: u64,
}

/// How one timed read is done.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Through the group leader's read handle.
    Lease,
    /// The state alone, and one clock reading.
    Local,
}

/// On one reader thread, for `window` each: lease reads of random leased groups through their
/// leaders' read handles (the thread's own clones) timed in batches of [`BATCH`], then timed one
/// by one; then the floor (local reads of random groups) the same two ways. The first fifth of
/// each window warms up.
pub fn reads(c: &Cluster, window: Duration, seed: u64) -> Reads {
    let targets: Vec<(usize, usize)> = lease_holders(c)
        .iter()
        .enumerate()
        .filter_map(|(g, h)| h.map(|n| (g, n)))
        .collect();
    if targets.is_empty() {
        let none = Reads {
            p50_ns: 0.0,
            single_p50_ns: 0,
            p99_ns: 0,
            reads: 0,
            failed: 0,
            local_p50_ns: 0.0,
            local_single_p50_ns: 0,
        };
        return none;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let handles: Vec<_> = targets
                .iter()
                .map(|&(g, n)| (c.nodes[n].handles[g].clone(), &c.nodes[n].state[g + 1]))
                .collect();
            let lease = Loop::new(&handles, Kind::Lease, window, seed);
            let local = Loop::new(&handles, Kind::Local, window, seed);
            let (mut batched, mut single) = (lease.batched(), lease.single());
            let (mut local_batched, mut local_single) = (local.batched(), local.single());
            let per_read = |batch_ns: u64| batch_ns as f64 / BATCH as f64;
            let (p50_ns, p99_ns) = percentiles(&mut single.lat);
            Reads {
                p50_ns: per_read(percentiles(&mut batched.lat).0),
                single_p50_ns: p50_ns,
                p99_ns,
                reads: batched.lat.len() as u64 * BATCH as u64 + single.lat.len() as u64,
                failed: batched.failed + single.failed,
                local_p50_ns: per_read(percentiles(&mut local_batched.lat).0),
                local_single_p50_ns: percentiles(&mut local_single.lat).0,
            }
        })
        .join()
        .expect("reader thread")
    })
}

type Target<'a> = (ReadHandle<Clock>, &'a AtomicU64);

/// Timed reads of random targets of one kind, for `window`.
struct Loop<'a, 'b> {
    targets: &'a [Target<'b>],
    kind: Kind,
    window: Duration,
    seed: u64,
}

/// Times measured after warm-up (of a batch, or of one read), in ns, and the reads that failed.
struct Timed {
    lat: Vec<u64>,
    failed: u64,
}

impl<'a, 'b> Loop<'a, 'b> {
    fn new(targets: &'a [Target<'b>], kind: Kind, window: Duration, seed: u64) -> Self {
        Loop {
            targets,
            kind,
            window,
            seed,
        }
    }

    /// One read of target `i`: whether it succeeded.
    #[inline(always)]
    fn read(&self, clock: &Clock, i: usize) -> bool {
        let (h, state) = &self.targets[i];
        let r = match self.kind {
            Kind::Lease => h.read(|| state.load(Ordering::Acquire)),
            Kind::Local => {
                std::hint::black_box(clock.now_ns());
                Ok(state.load(Ordering::Acquire))
            }
        };
        std::hint::black_box(r).is_ok()
    }

    /// Batches of [`BATCH`] reads of random targets, each batch timed as a whole. The targets
    /// are drawn before the timer starts, so the time is the reads' alone (plus one timer
    /// reading per batch). A batch with a failed read is not kept.
    fn batched(&self) -> Timed {
        let (clock, mut rng) = (Clock::new(), ChaCha8Rng::seed_from_u64(self.seed));
        let mut timed = Timed {
            lat: Vec::with_capacity(1 << 16),
            failed: 0,
        };
        let mut picks = [0usize; BATCH];
        let start = Instant::now();
        let (warm, end) = (start + self.window / 5, start + self.window);
        while Instant::now() < end {
            let measuring = Instant::now() >= warm;
            for _ in 0..4 {
                for p in picks.iter_mut() {
                    *p = rng.gen_range(0..self.targets.len());
                }
                let t0 = Instant::now();
                let ok = picks.iter().filter(|&&i| self.read(&clock, i)).count();
                let dt = t0.elapsed().as_nanos() as u64;
                if measuring {
                    timed.failed += (BATCH - ok) as u64;
                    if ok == BATCH {
                        timed.lat.push(dt);
                    }
                }
            }
        }
        timed
    }

    /// Reads of random targets timed one by one.
    fn single(&self) -> Timed {
        let (clock, mut rng) = (Clock::new(), ChaCha8Rng::seed_from_u64(self.seed));
        let mut timed = Timed {
            lat: Vec::with_capacity(1 << 20),
            failed: 0,
        };
        let start = Instant::now();
        let (warm, end) = (start + self.window / 5, start + self.window);
        while Instant::now() < end {
            let measuring = Instant::now() >= warm;
            for _ in 0..256 {
                let i = rng.gen_range(0..self.targets.len());
                let t0 = Instant::now();
                let ok = self.read(&clock, i);
                let dt = t0.elapsed().as_nanos() as u64;
                match (ok, measuring) {
                    (true, true) => timed.lat.push(dt),
                    (false, true) => timed.failed += 1,
                    _ => {}
                }
            }
        }
        timed
    }
}

/// (p50, p99) of `lat`, 0 when empty.
fn percentiles(lat: &mut [u64]) -> (u64, u64) {
    lat.sort_unstable();
    let at = |q: f64| match lat.len() {
        0 => 0,
        n => lat[((n as f64 * q) as usize).min(n - 1)],
    };
    (at(0.50), at(0.99))
}

/// Failover after a node is killed.
pub struct Failover {
    /// The node killed (id): the one leading the most groups.
    pub killed: u64,
    /// Groups it led.
    pub groups: usize,
    pub p50_ms: f64,
    /// `None` when some group had no new leased leader by the timeout.
    pub max_ms: Option<f64>,
    /// Groups with no new leased leader by the timeout.
    pub unrecovered: usize,
    /// Groups led again later than the target bound (`P` + election timeout + 1 s), or never.
    pub over_bound: usize,
}

/// Kill the node leading the most groups; poll every 5 ms until each group it led has a leased
/// leader on a live node, or `timeout`.
pub fn failover(c: &mut Cluster, timeout: Duration) -> Failover {
    let holders = lease_holders(c);
    let led_by = |n: usize| holders.iter().filter(|&&h| h == Some(n)).count();
    let victim = (0..c.nodes.len())
        .max_by_key(|&n| (led_by(n), usize::MAX - n))
        .expect("nodes");
    let mut pending: Vec<usize> = (0..holders.len())
        .filter(|&g| holders[g] == Some(victim))
        .collect();
    let groups = pending.len();
    let killed_at = Instant::now();
    c.kill(victim);
    let mut took_ms = Vec::with_capacity(groups);
    while !pending.is_empty() && killed_at.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(5));
        let ms = killed_at.elapsed().as_secs_f64() * 1e3;
        pending.retain(|&g| {
            let led = c
                .nodes
                .iter()
                .any(|n| n.is_alive() && n.handles[g].lease_held());
            if led {
                took_ms.push(ms);
            }
            !led
        });
    }
    took_ms.sort_by(f64::total_cmp);
    let bound_ms = timing::failover_bound_ms() as f64;
    let late = took_ms.iter().filter(|&&ms| ms > bound_ms).count();
    Failover {
        killed: victim as u64 + 1,
        groups,
        p50_ms: took_ms.get(took_ms.len() / 2).copied().unwrap_or(0.0),
        max_ms: pending
            .is_empty()
            .then(|| took_ms.last().copied().unwrap_or(0.0)),
        unrecovered: pending.len(),
        over_bound: late + pending.len(),
    }
}
