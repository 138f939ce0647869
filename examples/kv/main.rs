//! An example replicated KV store on raft-lease: separate processes over TCP, durable on redb,
//! lease reads on the HTTP threads, ReadIndex fallback, sessions, locks and fenced writes.
//!
//! ```sh
//! cargo run --release --example kv -- cluster            # 3 local nodes; Ctrl-C stops them
//! cargo run --release --example kv -- node --id 1 \
//!     --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 --http 127.0.0.1:8001 --data-dir /tmp/kv1
//! ```

mod bench;
mod clock;
mod cluster;
mod http;
mod metrics;
mod server;
mod state;
mod storage;
mod transport;

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use parking_lot::RwLock;
use slog::{crit, info, o, warn, Drain, Logger};

use crate::server::{NodeOptions, Runtime};
use crate::transport::{Transport, TransportConfig};

#[derive(Parser)]
#[command(about = "A replicated KV store on raft-lease")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Node(NodeArgs),
    /// Run a local cluster of node processes on loopback until Ctrl-C.
    Cluster(cluster::ClusterArgs),
    /// Start a local cluster with a peer delay and compare HTTP lease reads with index reads.
    Bench(bench::BenchArgs),
}

/// One node's options.
#[derive(Args, Clone)]
pub struct NodeArgs {
    /// This node's raft id (one of --peers).
    #[arg(long)]
    id: u64,
    /// Every voter: `1=127.0.0.1:7001,2=...` (this node's entry is its peer listen address).
    #[arg(long)]
    peers: String,
    /// HTTP listen address.
    #[arg(long)]
    http: SocketAddr,
    /// Where the raft log, hard state and snapshots live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Other nodes' HTTP addresses, `1=127.0.0.1:8001,...`, for `leader_http` in redirects.
    #[arg(long, default_value = "")]
    peer_http: String,
    /// Raft election timeout. The lease promise P equals it.
    #[arg(long, default_value_t = 1000)]
    election_ms: u64,
    /// Raft heartbeat interval: the lease renews on every heartbeat.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Raft tick interval.
    #[arg(long, default_value_t = 10)]
    tick_ms: u64,
    /// Bound on clock drift, in parts per million.
    #[arg(long, default_value_t = 500)]
    drift_ppm: u64,
    /// Lease safety margin.
    #[arg(long, default_value_t = 10)]
    margin_ms: u64,
    /// Extra delay on every outgoing peer message (emulates a cross-zone network).
    #[arg(long, default_value_t = 0)]
    peer_delay_ms: u64,
    /// Enable /admin/partition, /admin/heal, /admin/clock and /admin/transfer (tests only).
    #[arg(long)]
    fault_injection: bool,
    /// UNSAFE: use raft-rs ReadOnlyOption::LeaseBased instead of the lease (to demonstrate the hazard).
    #[arg(long)]
    unsafe_lease_based: bool,
    /// Snapshot and compact the raft log every this many applied entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// HTTP worker threads. Each blocks while its request waits for raft (ReadIndex, writes).
    #[arg(long, default_value_t = 16)]
    http_threads: usize,
}

fn parse_map(s: &str, what: &str) -> Result<BTreeMap<u64, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (id, addr) = p
                .split_once('=')
                .ok_or(format!("{what}: expected id=address, got {p:?}"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("{what}: bad id {id:?}"))?;
            if id == 0 {
                return Err(format!("{what}: id 0 is reserved by raft"));
            }
            Ok((id, addr.trim().to_string()))
        })
        .collect()
}

impl NodeArgs {
    fn options(&self) -> Result<NodeOptions, String> {
        let peers = parse_map(&self.peers, "--peers")?
            .into_iter()
            .map(|(id, a)| {
                a.parse()
                    .map(|a| (id, a))
                    .map_err(|_| format!("--peers: bad address {a:?}"))
            })
            .collect::<Result<BTreeMap<u64, SocketAddr>, _>>()?;
        if !peers.contains_key(&self.id) {
            return Err(format!("--id {} is not in --peers", self.id));
        }
        if self.snapshot_every < 10 {
            return Err("--snapshot-every must be at least 10".into());
        }
        if self.tick_ms == 0
            || self.heartbeat_ms < self.tick_ms
            || self.election_ms <= self.heartbeat_ms
        {
            return Err("need 0 < --tick-ms <= --heartbeat-ms < --election-ms".into());
        }
        Ok(NodeOptions {
            id: self.id,
            peers,
            peer_http: parse_map(&self.peer_http, "--peer-http")?,
            http: self.http,
            data_dir: self.data_dir.clone(),
            election_ms: self.election_ms,
            heartbeat_ms: self.heartbeat_ms,
            tick_ms: self.tick_ms,
            drift_ppm: self.drift_ppm,
            margin_ms: self.margin_ms,
            peer_delay_ms: self.peer_delay_ms,
            fault_injection: self.fault_injection,
            unsafe_lease_based: self.unsafe_lease_based,
            snapshot_every: self.snapshot_every,
        })
    }
}

fn logger() -> Logger {
    let decorator = slog_term::TermDecorator::new().stderr().build();
    let drain = slog_term::FullFormat::new(decorator).build().fuse();
    // raft-rs logs every message at debug level; keep info and above.
    let drain = slog::LevelFilter::new(drain, slog::Level::Info).fuse();
    let drain = slog_async::Async::new(drain).chan_size(4096).build().fuse();
    Logger::root(drain, o!())
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Node(args) => run_node(args),
        Cmd::Cluster(args) => cluster::run(args),
        Cmd::Bench(args) => bench::run(args),
    };
    std::process::exit(code);
}

fn run_node(args: NodeArgs) -> i32 {
    let log = logger();
    let opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    match start_node(opts, args.http_threads.max(1), &log) {
        Ok(()) => 0,
        Err(e) => {
            crit!(log, "node failed"; "error" => %e);
            std::thread::sleep(std::time::Duration::from_millis(50)); // let the async logger flush
            1
        }
    }
}

fn start_node(
    opts: NodeOptions,
    http_threads: usize,
    root: &Logger,
) -> Result<(), server::StartError> {
    let log = root.new(o!("node" => opts.id));
    if opts.unsafe_lease_based {
        warn!(log, "!!! --unsafe-lease-based: raft-rs LeaseBased reads can be STALE. For demonstrations only. !!!");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let listener = TcpListener::bind(opts.peers[&opts.id])
        .map_err(|e| format!("peer listen {}: {e}", opts.peers[&opts.id]))?;
    let http = Arc::new(
        tiny_http::Server::http(opts.http)
            .map_err(|e| format!("http listen {}: {e}", opts.http))?,
    );
    let blocked: transport::Blocked = Arc::new(RwLock::new(HashSet::new()));
    let metrics = Arc::new(metrics::Metrics::default());
    let tcfg = TransportConfig {
        my_id: opts.id,
        peers: opts.peers.clone(),
        peer_delay: std::time::Duration::from_millis(opts.peer_delay_ms),
        blocked: blocked.clone(),
        metrics: metrics.clone(),
        logger: log.clone(),
        stop: stop.clone(),
    };
    let (inbox_tx, inbox_rx) = crossbeam_channel::bounded(8192);
    let transport = Transport::start(&tcfg);
    transport::listen(listener, inbox_tx, tcfg);
    let (runtime, shared) = Runtime::open(
        opts.clone(),
        inbox_rx,
        transport,
        blocked,
        metrics,
        stop.clone(),
        log.clone(),
    )?;
    let workers: Vec<_> = (0..http_threads)
        .map(|i| {
            let (http, shared) = (http.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("http-{i}"))
                .spawn(move || http::serve(http, shared))
                .expect("spawn http")
        })
        .collect();
    info!(log, "node up"; "http" => %opts.http, "peer" => %opts.peers[&opts.id], "data_dir" => %opts.data_dir.display());
    runtime.run(); // returns on SIGTERM/SIGINT or a fatal storage error
    info!(
        log,
        "shutting down: no new requests, storage is flushed on every commit"
    );
    stop.store(true, Ordering::Relaxed);
    for _ in 0..workers.len() {
        http.unblock();
    }
    for w in workers {
        let _ = w.join();
    }
    info!(log, "node stopped");
    std::thread::sleep(std::time::Duration::from_millis(50));
    Ok(())
}
