//! Where `kv bench`'s CPU goes: the node processes', the bench's own (its client threads), and how
//! busy the whole machine was, per cell (Linux `/proc`; elsewhere the columns stay empty).
//!
//! On a small machine the clients and the three nodes share the cores, and once those are busy the
//! latency at N clients is the CPU queue: by Little's law the mean latency is at least
//! N × (CPU per operation) ÷ cores. These columns let a reader see when that bound, not the
//! store, sets a cell's p50.

use std::time::Instant;

/// CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// CPU seconds (user + system) of the node processes so far.
    nodes_s: f64,
    /// CPU seconds of this process (the bench's clients) so far.
    bench_s: f64,
    /// The machine's (busy, total) clock ticks since boot, all CPUs.
    machine_ticks: (u64, u64),
    at: Instant,
}

/// CPU per operation during a cell, and the machine's busy share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuCost {
    /// Microseconds of node CPU per operation (all three nodes).
    pub nodes_us_per_op: f64,
    /// Microseconds of the bench's own CPU per operation (its clients).
    pub bench_us_per_op: f64,
    /// Percent of the machine's CPU time that was busy.
    pub machine_busy_pct: f64,
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// user + system CPU seconds of the process `pid` (`self` for this one).
pub fn process_cpu_s(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / ticks_per_s())
}

/// (busy, total) ticks of all CPUs since boot, from `/proc/stat`'s first line.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let t: Vec<u64> = line
        .split_whitespace()
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = t.iter().take(8).sum(); // user nice system idle iowait irq softirq steal
    let idle = t.get(3)? + t.get(4)?;
    Some((total - idle, total))
}

impl CpuSample {
    /// Read the counters now, for the node processes `pids`.
    pub fn now(pids: &[u32]) -> Option<CpuSample> {
        let nodes_s = pids
            .iter()
            .map(|p| process_cpu_s(&p.to_string()))
            .sum::<Option<f64>>()?;
        Some(CpuSample {
            nodes_s,
            bench_s: process_cpu_s("self")?,
            machine_ticks: machine_ticks()?,
            at: Instant::now(),
        })
    }

    /// The cost of `ops` operations done between `self` and `later`.
    pub fn cost(&self, later: &CpuSample, ops: f64) -> CpuCost {
        assert!(later.at >= self.at, "samples out of order");
        let per_op = |a: f64, b: f64| (b - a).max(0.0) * 1e6 / ops.max(1.0);
        let busy = later.machine_ticks.0.saturating_sub(self.machine_ticks.0) as f64;
        let total = later.machine_ticks.1.saturating_sub(self.machine_ticks.1) as f64;
        CpuCost {
            nodes_us_per_op: per_op(self.nodes_s, later.nodes_s),
            bench_us_per_op: per_op(self.bench_s, later.bench_s),
            machine_busy_pct: if total > 0.0 {
                100.0 * busy / total
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_burning_cpu_shows_in_its_cost() {
        let me = std::process::id();
        let before = CpuSample::now(&[me]).expect("Linux /proc");
        let (mut x, mut after) = (0u64, before);
        // Spin until the counter moves (a tick, 10 ms of CPU), or give up after 10 s of wall time.
        let start = std::time::Instant::now();
        while (after.bench_s == before.bench_s || after.nodes_s == before.nodes_s)
            && start.elapsed().as_secs() < 10
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            after = CpuSample::now(&[me]).unwrap();
        }
        let cost = before.cost(&after, 1.0);
        assert!(cost.bench_us_per_op > 0.0, "{cost:?}");
        assert!(cost.nodes_us_per_op > 0.0, "read as a node's pid: {cost:?}");
        assert!((0.0..=100.0).contains(&cost.machine_busy_pct));
    }

    #[test]
    fn a_process_that_does_not_exist_gives_no_sample() {
        assert!(CpuSample::now(&[u32::MAX]).is_none());
    }
}
