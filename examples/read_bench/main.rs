//! Read benchmark: lease reads against ReadIndex and raft-rs's own read paths, side by side in
//! one run, on an in-process 3-node cluster with real threads, the real clock and a delayed,
//! protobuf-encoding network.
//!
//! ```sh
//! cargo run --release --example read_bench -- [--quick] [--json PATH] [--svg PATH]
//! cargo run --release --example read_bench -- failover [--trials 20]
//! cargo run --release --example read_bench -- pending
//! cargo run --release --example read_bench -- writes
//! ```

mod cluster;
mod failover;
mod measure;
mod pending;
mod svg;
mod writes;

use std::time::Duration;

use clap::{Parser, Subcommand};
use raft_lease::Safeties;

use crate::cluster::{Cluster, Opts};
use crate::measure::{idle_rate, measure, mixed, scaling, Cell, Mode};

#[derive(Parser)]
#[command(about = "Lease reads vs ReadIndex vs raft-rs, side by side")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Sub>,
    /// The whole sweep in well under a minute (shorter cells).
    #[arg(long)]
    quick: bool,
    /// Write one JSON object per cell to this file (a JSON array).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Draw p50 latency against delay per mode (log scale) to this SVG file.
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
    /// Override the measuring time per cell, in milliseconds.
    #[arg(long)]
    cell_ms: Option<u64>,
}

#[derive(Subcommand)]
enum Sub {
    /// Kill the leader repeatedly; time from the kill to the first successful read.
    Failover {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        #[arg(long, default_value_t = 100)]
        delay_us: u64,
    },
    /// Time and memory per read with up to 100,000 ReadIndex reads outstanding.
    Pending,
    /// Only what follower read leases cost writes (part of the whole run).
    Writes,
}

const DELAYS_US: [u64; 4] = [0, 100, 1_000, 5_000];
const OUTSTANDING: [usize; 2] = [1, 64];

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Sub::Failover { trials, delay_us }) => {
            return failover::run(trials, Duration::from_micros(delay_us));
        }
        Some(Sub::Pending) => return pending::run(),
        Some(Sub::Writes) | None => {}
    }
    let window = Duration::from_millis(cli.cell_ms.unwrap_or(if cli.quick { 250 } else { 2_000 }));
    if let Some(Sub::Writes) = cli.cmd {
        follower_writes(window);
        return;
    }
    let load_before = load_average();
    let cells = sweep(window);
    print_legend();
    print_table(&cells);
    print_ratios(&cells);
    let scaled = thread_scaling(window);
    idle_cpu();
    mixed_writes(window);
    let writes = follower_writes(window);
    warn_if_busy(load_before);
    if let Some(path) = &cli.json {
        let reads = cells.iter().chain(&scaled).map(Cell::json);
        let all: Vec<serde_json::Value> = reads.chain(writes).collect();
        let count = all.len();
        let json = serde_json::Value::Array(all);
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&json).expect("json")) {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {count} cells to {}", path.display());
    }
    if let Some(path) = &cli.svg {
        if let Err(e) = std::fs::write(path, svg::chart(&cells)) {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("wrote {}", path.display());
    }
}

fn sweep(window: Duration) -> Vec<Cell> {
    let total = DELAYS_US.len() * Mode::ALL.len() * OUTSTANDING.len();
    let mut cells = Vec::with_capacity(total);
    let follower = Opts {
        follower_leases: Some(writes::follower_leases()),
        slow_delay: None,
    };
    for delay_us in DELAYS_US {
        for (safeties, opts, modes) in [
            (Safeties::default(), Opts::default(), &Mode::ALL[..5]),
            (
                Safeties::raft_lease_based(),
                Opts::default(),
                &Mode::ALL[5..6],
            ),
            (Safeties::default(), follower, &Mode::ALL[6..]),
        ] {
            let delay = Duration::from_micros(delay_us);
            let cluster = Cluster::start_with(3, delay, safeties, opts);
            let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
                eprintln!("error: no leader at {delay_us} µs one-way delay");
                std::process::exit(1);
            };
            // Follower reads run on a follower, once it holds a read lease.
            let at = match opts.follower_leases {
                Some(_) => writes::holding_follower(&cluster, leader),
                None => leader,
            };
            let idle = idle_rate(&cluster, Duration::from_millis(300));
            for &mode in modes {
                for outstanding in OUTSTANDING {
                    eprint!(
                        "\r[{:>2}/{total}] {:<20} delay {:>5} µs  outstanding {:>2}   ",
                        cells.len() + 1,
                        mode.name(),
                        delay_us,
                        outstanding
                    );
                    cells.push(measure(
                        &cluster,
                        at,
                        mode,
                        delay_us,
                        outstanding,
                        window,
                        idle,
                    ));
                }
            }
        }
    }
    eprintln!();
    cells
}

/// The machine's 1-minute load average, from `/proc/loadavg` (None where there is none).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Warn when other work shared the cores: the figures are then not comparable between runs
/// (ratios within the run still are, since every mode was measured under the same load).
fn warn_if_busy(load_before: Option<f64>) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let loads = [load_before, load_average()];
    let worst = loads.iter().flatten().copied().fold(0.0, f64::max);
    // The bench itself keeps about one core busy; more than that is someone else's work.
    if worst > 1.0 + cores / 4.0 {
        println!(
            "\nWARNING: the machine was busy (load average up to {worst:.1} on {cores} cores, \
             measured before and after): absolute figures are not comparable with an idle run; \
             the ratios within this run still are"
        );
    }
}

fn print_legend() {
    println!(
        "modes, on the leader of 3 in-process nodes unless said: local = a clock read and the state read \
         (the floor); lease_handle = a lease read through a ReadHandle on the caller's thread; \
         lease_node = a lease read through the raft thread; read_index = this crate's batched \
         ReadIndex; raftrs_read_index / raftrs_lease_based = raft-rs 0.7's own read paths (the \
         second is unsafe); follower_lease = a read through a follower's ReadHandle under its follower \
         read lease (on a follower of a cluster with follower leases on). delay_us = simulated one-way network delay; out = reads outstanding \
         at once; msgs/read = raft messages sent per read; failed = reads not served, each an \
         answer, not a lost read: a handle with no valid lease refuses at once (no_lease: on a \
         follower, its read lease lapsed, as when client threads spinning on every core starve \
         the node threads of CPU and a renewal comes late), or the raft thread refused it \
         (refused), or none came within 2 s (no_answer); each cell with failures is broken down \
         by reason below the table, with its runs of refusals back to back.\n"
    );
}

fn fmt_ns(ns: u64) -> String {
    match ns {
        n if n < 10_000 => format!("{n} ns"),
        n if n < 10_000_000 => format!("{:.1} µs", n as f64 / 1e3),
        n => format!("{:.2} ms", n as f64 / 1e6),
    }
}

fn print_table(cells: &[Cell]) {
    println!(
        "{:<20} {:>8} {:>4} {:>11} {:>11} {:>11} {:>12} {:>10} {:>7}",
        "mode", "delay_us", "out", "p50", "p99", "p99.9", "reads/s", "msgs/read", "failed"
    );
    for c in cells {
        println!(
            "{:<20} {:>8} {:>4} {:>11} {:>11} {:>11} {:>12.0} {:>10.3} {:>7}",
            c.mode.name(),
            c.one_way_delay_us,
            c.outstanding,
            fmt_ns(c.p50_ns),
            fmt_ns(c.p99_ns),
            fmt_ns(c.p999_ns),
            c.reads_per_sec,
            c.msgs_per_read,
            c.failed
        );
    }
    for line in cells.iter().map(Cell::failures).filter(|l| !l.is_empty()) {
        println!("  failed: {line}");
    }
}

fn find(cells: &[Cell], mode: Mode, delay: u64, out: usize) -> Option<&Cell> {
    cells
        .iter()
        .find(|c| c.mode == mode && c.one_way_delay_us == delay && c.outstanding == out)
}

fn print_ratios(cells: &[Cell]) {
    println!("\nratios (p50): read_index / lease_handle, lease_handle / local; throughput lease_handle / local");
    for delay in DELAYS_US {
        for out in OUTSTANDING {
            let (Some(local), Some(handle), Some(index)) = (
                find(cells, Mode::Local, delay, out),
                find(cells, Mode::LeaseHandle, delay, out),
                find(cells, Mode::ReadIndex, delay, out),
            ) else {
                continue;
            };
            let r = |a: u64, b: u64| a as f64 / b.max(1) as f64;
            println!(
                "  delay {:>5} µs, out {:>2}: read_index/lease_handle {:>10.0}x   lease_handle/local {:>5.2}x   throughput {:>5.0}%",
                delay,
                out,
                r(index.p50_ns, handle.p50_ns),
                r(handle.p50_ns, local.p50_ns),
                100.0 * handle.reads_per_sec / local.reads_per_sec.max(1.0)
            );
            if let Some(f) = find(cells, Mode::FollowerLease, delay, out) {
                println!(
                    "  {:>28} follower_lease/local {:>5.2}x   msgs/read {:.3}",
                    "",
                    r(f.p50_ns, local.p50_ns),
                    f.msgs_per_read
                );
            }
        }
    }
}

/// CPU time the process spends per second with an idle 3-node cluster (ticks and heartbeats
/// only): what the node threads' spinning before they park costs.
fn idle_cpu() {
    let cluster = Cluster::start(3, Duration::from_micros(100), Safeties::default());
    if cluster.leader(Duration::from_secs(10)).is_none() {
        eprintln!("error: no leader for the idle CPU run");
        return;
    }
    std::thread::sleep(Duration::from_millis(300));
    let (cpu0, t0) = (process_cpu(), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let ms_per_s = (process_cpu() - cpu0).as_secs_f64() * 1e3 / t0.elapsed().as_secs_f64();
    println!(
        "\nidle CPU, 3 nodes, ticks every 10 ms, heartbeats every 30 ms: {ms_per_s:.1} ms/s of CPU"
    );
}

/// User plus system CPU time of this process.
fn process_cpu() -> Duration {
    // SAFETY: `usage` is a valid, writable rusage, and RUSAGE_SELF is a valid target.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(
            libc::getrusage(libc::RUSAGE_SELF, &mut usage),
            0,
            "getrusage"
        );
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Lease reads on 1, 2, 4 and 8 reader threads against `local` on as many, at 0 delay.
fn thread_scaling(window: Duration) -> Vec<Cell> {
    let cluster = Cluster::start(3, Duration::ZERO, Safeties::default());
    let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
        eprintln!("error: no leader for the thread-scaling cells");
        std::process::exit(1);
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("\nthread scaling ({cores} cores on this machine): reads/s, lease_handle vs local");
    let mut cells = Vec::new();
    for threads in [1, 2, 4, 8] {
        let local = scaling(&cluster, leader, Mode::Local, threads, window);
        let handle = scaling(&cluster, leader, Mode::LeaseHandle, threads, window);
        println!(
            "  {threads} threads: local {:>12.0}/s p50 {:>7}   lease_handle {:>12.0}/s p50 {:>7}   throughput {:>4.0}%  p50 x{:.2}",
            local.reads_per_sec,
            fmt_ns(local.p50_ns),
            handle.reads_per_sec,
            fmt_ns(handle.p50_ns),
            100.0 * handle.reads_per_sec / local.reads_per_sec.max(1.0),
            handle.p50_ns as f64 / local.p50_ns.max(1) as f64,
        );
        cells.extend([local, handle]);
    }
    cells
}

/// What follower leases cost writes, printed and returned as JSON cells.
fn follower_writes(window: Duration) -> Vec<serde_json::Value> {
    let mut cells = writes::equal_delays(&DELAYS_US, window);
    cells.extend(writes::slow_follower(window));
    let stall = writes::holder_killed(window);
    println!(
        "\nwrites, one at a time to the leader (G = {} ms):",
        writes::GRANT_MS
    );
    println!(
        "lag = the lagging-node policy on (true: FollowerLeases::with_max_lag_ms({}), no grant to \
         a voter lacking an entry committed longer ago) or off (false), in the slow-follower cells; \
         - : not a slow-follower cell",
        writes::MAX_LAG_MS
    );
    println!(
        "{:<24} {:>8} {:>6} {:>11} {:>11}",
        "mode", "delay_us", "lag", "p50", "p99"
    );
    for c in &cells {
        println!(
            "{:<24} {:>8} {:>6} {:>11} {:>11}",
            c["mode"].as_str().unwrap_or("?"),
            c["one_way_delay_us"],
            c.get("lag_policy")
                .map_or("-".to_string(), |v| v.to_string()),
            fmt_ns(c["p50_ns"].as_u64().unwrap_or(0)),
            fmt_ns(c["p99_ns"].as_u64().unwrap_or(0)),
        );
    }
    for pair in cells.chunks(2).take(DELAYS_US.len()) {
        let r = |k: &str| {
            pair[0][k].as_f64().unwrap_or(0.0) / pair[1][k].as_f64().unwrap_or(1.0).max(1.0)
        };
        println!(
            "  delay {:>5} µs: on/off p50 x{:.2}, p99 x{:.2}",
            pair[0]["one_way_delay_us"],
            r("p50_ns"),
            r("p99_ns")
        );
    }
    println!(
        "holder killed: writes stalled {:.1} ms (bound: one grant plus a write's round, {:.1} ms)",
        stall["stall_ms"].as_f64().unwrap_or(0.0),
        stall["bound_ms"].as_f64().unwrap_or(0.0)
    );
    cells.push(stall);
    cells
}

/// Reads with 10% writes mixed in, at 1 ms one-way delay: lease reads wait for apply too.
fn mixed_writes(window: Duration) {
    let cluster = Cluster::start(3, Duration::from_millis(1), Safeties::default());
    let Some(leader) = cluster.leader(Duration::from_secs(10)) else {
        eprintln!("error: no leader for the mixed-writes run");
        return;
    };
    let (mut plain, mut with_writes) = mixed(&cluster, leader, window);
    let (p50a, p99a, _) = plain.percentiles();
    let (p50b, p99b, _) = with_writes.percentiles();
    println!(
        "\nlease_node at 1 ms delay, reads only:     p50 {:>10} p99 {:>10}",
        fmt_ns(p50a),
        fmt_ns(p99a)
    );
    println!(
        "lease_node at 1 ms delay, 10% writes:      p50 {:>10} p99 {:>10}  (p99 x{:.1})",
        fmt_ns(p50b),
        fmt_ns(p99b),
        p99b as f64 / p99a.max(1) as f64
    );
}
