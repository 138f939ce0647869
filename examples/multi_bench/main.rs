//! Multi-group benchmark: per-group heartbeat leases against shared liveness (one support
//! session per pair of nodes), side by side in one run, at 1, 100, 1,000 and 10,000 groups.
//!
//! Three nodes run in one process, each a thread owning a `MultiNode` that hosts every group,
//! on the real clock; node batches cross a network thread that delays them by a one-way delay.
//! Per cell (a mode at a number of groups) it boots a fresh cluster, waits until every group
//! has a leader holding a lease (and, in shared liveness, every replica has quiesced), then
//! measures: idle messages, batches and node-thread CPU per second per node, and the lowest
//! share of groups with a leased leader; lease-read latency on random groups through their
//! `ReadHandle`s from a reader thread; and failover after killing the node leading the most
//! groups. It ends with the goals it checks, computed from this run's measurements.
//!
//! Lease reads: one reader thread holds a clone of the leader's handle of every leased group
//! and reads random groups (a seeded draw, uniform over the groups), each read a handle read
//! whose state read is one atomic load of the group's state on the leader's node. The reported
//! p50 (`read_p50_ns`) is per read: reads are timed in batches of 64 back to back, the random
//! groups drawn before the batch's first timer reading, and the p50 is the median over batches
//! of the batch's time / 64 (a batch with a failed read is not kept). That is a median of means
//! of 64 reads, not the median of single reads, and it carries 1/64 of one timer reading's cost
//! (20-30 ns on this machine). Reads timed one by one are reported beside it
//! (`read_single_p50_ns`, and `read_p99_ns`): each carries a whole timer reading, and the timer
//! moves in steps of about 10 ns here, which is as large as the differences being measured.
//! The floor (`read_local_p50_ns`, `read_local_single_p50_ns`) is the same loop, the same draw
//! of groups and the same state load plus one clock reading, without the lease check: what
//! reaching a random group costs at that number of groups. Each of the four loops runs for the
//! read window after a warm-up of a fifth of it, on the same thread, in every cell and mode.
//!
//! ```sh
//! cargo run --release --example multi_bench -- [--quick] [--json PATH] [--svg PATH] [--delay-us 100]
//! ```

mod cluster;
mod measure;
mod net;
mod node;
mod report;
mod svg;
mod timing;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use raft_lease::multi::LivenessMode;

use crate::cluster::Cluster;
use crate::report::{mode_name, Cell};

#[derive(Parser)]
#[command(about = "Per-group heartbeat leases vs shared liveness, at 1 to 10,000 groups")]
struct Cli {
    /// Shorter phases (the same numbers of groups): a few minutes in all.
    #[arg(long)]
    quick: bool,
    /// Write one JSON object per cell to this file (a JSON array).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw idle messages/s and CPU against groups (log-log, both modes) to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// One-way delay of every node batch, in microseconds.
    #[arg(long, default_value_t = 100)]
    delay_us: u64,
    /// The numbers of groups to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 100, 1_000, 10_000])]
    groups: Vec<u64>,
    /// The liveness modes to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [Mode::PerGroup, Mode::Shared])]
    modes: Vec<Mode>,
    /// Seeds the nodes' jitter and the reader's choice of groups.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A liveness mode, as the command line names it.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    #[value(name = "per_group")]
    PerGroup,
    Shared,
}

impl Mode {
    fn liveness(self) -> LivenessMode {
        match self {
            Mode::PerGroup => LivenessMode::PerGroup,
            Mode::Shared => LivenessMode::Shared,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(mode_name(self.liveness()))
    }
}

/// How long each phase of a cell lasts.
struct Phases {
    setup_timeout: Duration,
    settle: Duration,
    idle: Duration,
    idle_samples: u32,
    read: Duration,
    failover_timeout: Duration,
}

impl Phases {
    fn new(quick: bool) -> Phases {
        let s = Duration::from_secs;
        match quick {
            true => Phases {
                setup_timeout: s(60),
                settle: s(1),
                idle: s(2),
                idle_samples: 8,
                read: Duration::from_millis(500),
                failover_timeout: s(15),
            },
            false => Phases {
                setup_timeout: s(120),
                settle: s(2),
                idle: s(5),
                idle_samples: 20,
                read: s(2),
                failover_timeout: s(30),
            },
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let phases = Phases::new(cli.quick);
    let delay = Duration::from_micros(cli.delay_us);
    println!(
        "3 nodes, tick {} ms, heartbeat {} ms, election timeout {} ms, P {} ms, L {:.1} ms, one-way delay {} µs, {} cores",
        timing::TICK_MS,
        timing::heartbeat_ms(),
        timing::election_ms(),
        timing::promise_ms(),
        timing::lease_ms(),
        cli.delay_us,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let t0 = Instant::now();
    let mut cells = Vec::new();
    for &groups in &cli.groups {
        for mode in &cli.modes {
            cells.push(run_cell(mode.liveness(), groups, delay, cli.seed, &phases));
        }
    }
    println!(
        "\n{} cells in {:.0} s\n",
        cells.len(),
        t0.elapsed().as_secs_f64()
    );
    report::print_table(&cells);
    report::print_targets(&cells);
    if let Some(path) = &cli.json {
        let json = serde_json::Value::Array(cells.iter().map(Cell::json).collect());
        write(path, &serde_json::to_string_pretty(&json).expect("json"));
    }
    if let Some(path) = &cli.svg {
        write(path, &svg::chart(&cells));
    }
}

fn write(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("error: cannot write {}: {e}", path.display());
        std::process::exit(1);
    }
    println!("wrote {}", path.display());
}

/// Boot a fresh cluster, then measure idle, reads and failover on it.
fn run_cell(mode: LivenessMode, groups: u64, delay: Duration, seed: u64, p: &Phases) -> Cell {
    let name = mode_name(mode);
    eprintln!("[{name} × {groups}] booting");
    let mut cluster = Cluster::start(mode, groups, delay, seed);
    let setup = measure::setup(&cluster, mode, p.setup_timeout, p.settle);
    eprintln!(
        "[{name} × {groups}] {} of {groups} groups leased after {:.1} s; {:.1}% of replicas quiescent",
        setup.leased,
        setup.leased_ms / 1e3,
        setup.quiescent_pct
    );
    let idle = measure::idle(&cluster, p.idle, p.idle_samples);
    let reads = measure::reads(&cluster, p.read, seed);
    let failover = measure::failover(&mut cluster, p.failover_timeout);
    eprintln!(
        "[{name} × {groups}] idle {:.0} msgs/s {:.2} cpu ms/s per node, lease ≥ {:.2}%; read p50 {:.1} ns; failover of node {} ({} groups) max {:?} ms",
        idle.msgs_per_s,
        idle.cpu_ms_per_s,
        idle.min_lease_pct,
        reads.p50_ns,
        failover.killed,
        failover.groups,
        failover.max_ms
    );
    drop(cluster);
    Cell {
        mode,
        groups,
        delay_us: delay.as_micros() as u64,
        setup,
        idle,
        reads,
        failover,
    }
}
