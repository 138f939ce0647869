//! `kv bench`: HTTP load on a local 3-node cluster, writes next to reads: for each number of
//! keep-alive clients (1, 16 and 64 by default), PUTs, then `GET ?read=lease`, then
//! `GET ?read=index`, each for `--seconds`, all on the leader; on a cluster whose raft logs are on
//! raft-engine, then on one on redb (`--log-engine` picks one), in one run. First it measures
//! the data dir's disk: a 4 KiB append and `fdatasync`. `--json PATH` writes the cells and that
//! probe as a JSON array (see `report::to_json`).
//!
//! Each cell also prints the CPU it cost per operation, the three nodes' and the bench's own (its
//! clients), and how busy the machine was (see `cpu`): where clients and nodes share a few
//! cores, that CPU, not the store, bounds the latency at many clients.
//!
//! The clients spin when there are fewer of them than CPUs: each polls for its answer for
//! `--spin-us` before blocking on it, and the nodes run with `--http-spin-us`; 0 turns either
//! off, to show what waking a halted CPU costs on each side of the socket (see `http::spin_io`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::base::log_engine::LogEngine;
use crate::bench::cpu::CpuSample;
use crate::bench::report::{self, Cell};
use crate::bench::stages::{Scrape, Stages};
use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;
use crate::cli::cluster::plan::{shutdown, Plan};
use crate::http::client::Client;

/// `kv bench`'s options.
#[derive(Args)]
pub struct BenchArgs {
    /// Numbers of concurrent keep-alive clients, one cell each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Seconds per cell.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Bytes per written value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// One-way delay added to every peer message.
    #[arg(long, default_value_t = 0)]
    peer_delay_ms: u64,
    /// Ports: peers BASE+1.., HTTP BASE+1001...
    #[arg(long, default_value_t = 7100)]
    base_port: u16,
    /// Write the cells as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of the cells: this many sessions kept alive on the leader for `--seconds`.
    #[arg(long)]
    sessions: Option<usize>,
    /// The sessions' TTL.
    #[arg(long, default_value_t = 12_000)]
    ttl_ms: u64,
    /// Keep-alive connections for `--sessions`.
    #[arg(long, default_value_t = 32)]
    conns: usize,
    /// Microseconds each client polls for its answer before blocking, in cells with fewer clients
    /// than CPUs; 0 blocks at once.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// The nodes' `--http-spin-us`: how long a connection polls for its next request.
    #[arg(long, default_value_t = 50)]
    http_spin_us: u64,
    /// The log engine to bench; both by default, raft-engine then redb (`--sessions`: the
    /// default engine).
    #[arg(long)]
    log_engine: Option<LogEngine>,
    /// Instead of the cells: this many groups per node, in shared liveness then per-group
    /// liveness (idle cost, leases, first reads, memory, failover; see `bench::groups`).
    #[arg(long)]
    groups: Option<u32>,
    /// With `--groups`: seconds of the idle period.
    #[arg(long, default_value_t = 60)]
    idle_s: u64,
    /// With `--groups`: the nodes' follower read leases (`G`, ms), and after the idle period one
    /// `read=local` read of every group at each of its followers: the share served there.
    #[arg(long)]
    follower_leases_ms: Option<u64>,
    /// Instead of the HTTP cells: the store beside a 3-member etcd 3.4, both through etcd's
    /// gRPC API with one client (see `bench::etcd`).
    #[arg(long)]
    vs_etcd: bool,
    /// Instead of the HTTP cells: the data-scale scenario (bulk load, restarts, a member
    /// replaced, whole-keyspace ranges) on the store, then on a 3-member etcd 3.4 (see
    /// `bench::datascale`).
    #[arg(long, conflicts_with = "vs_etcd")]
    data_scale: bool,
    /// With `--data-scale`: keys to load.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// With `--data-scale`: runs of the whole scenario on both systems (medians reported).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// With `--vs-etcd` or `--data-scale`: the etcd binary (default: `$ETCD_BIN`, else `etcd`
    /// on the PATH).
    #[arg(long)]
    etcd_bin: Option<PathBuf>,
    /// With `--vs-etcd`: the operations to run (default: all of them; see `bench::etcd::ops`).
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// With `--vs-etcd` or `--data-scale`: a flag for the store's nodes (`kv node`'s),
    /// repeatable, such as
    /// `--node-arg=--log-engine --node-arg=redb`.
    #[arg(long, allow_hyphen_values = true)]
    node_arg: Vec<String>,
}

/// `kv bench`.
pub fn run(args: BenchArgs) -> i32 {
    if args.http_spin_us > crate::base::limits::MAX_SPIN_US {
        eprintln!(
            "error: --http-spin-us must be at most {}",
            crate::base::limits::MAX_SPIN_US
        );
        return 2;
    }
    let dir = match tempfile::Builder::new()
        .prefix("raft-lease-kv-bench-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    match all(&args, dir.path()) {
        Ok(()) => 0,
        Err((code, e)) => {
            eprintln!("error: {e}");
            code
        }
    }
}

/// `--groups`: each liveness mode in turn on three processes, then the table and the ratios.
fn groups(args: &BenchArgs, groups: u32, dir: &std::path::Path) -> Result<(), (i32, String)> {
    use crate::bench::groups::{header, measure, Setup};
    println!(
        "kv bench --groups {groups}: 3 nodes, {} s idle, shared liveness then per-group",
        args.idle_s
    );
    let mut cells = Vec::new();
    let mut json = Vec::new();
    let mut failed = Vec::new();
    println!("{}", header());
    for mode in ["shared", "per-group"] {
        let how = Setup {
            groups,
            mode,
            idle_s: args.idle_s,
            follower_leases_ms: args.follower_leases_ms,
        };
        // A mode that fails is reported, and the other is still measured.
        match measure(&dir.join(mode), args.base_port, &how) {
            Ok(cell) => {
                println!("{}", cell.line());
                json.push(cell.to_json());
                cells.push(cell);
            }
            Err(e) => {
                println!("{mode:<10} {groups:>7}  failed: {e}");
                json.push(serde_json::json!({"mode": mode, "groups": groups, "error": e}));
                failed.push(format!("{mode}: {e}"));
            }
        }
    }
    if let [s, p] = &cells[..] {
        println!(
            "shared/per-group: idle CPU {:.3}x, messages {:.4}x",
            s.idle_cpu_per_node / p.idle_cpu_per_node.max(f64::MIN_POSITIVE),
            s.msgs_per_s_per_node / p.msgs_per_s_per_node.max(f64::MIN_POSITIVE)
        );
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&json).expect("cells serialize");
        std::fs::write(path, text + "\n").map_err(|e| (1, format!("{}: {e}", path.display())))?;
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err((1, failed.join("; "))),
    }
}

/// The fsync probe, then each engine's cluster in turn, then the report.
fn all(args: &BenchArgs, dir: &std::path::Path) -> Result<(), (i32, String)> {
    if let Some(n) = args.groups {
        return groups(args, n, dir);
    }
    if args.follower_leases_ms.is_some() {
        return Err((2, "--follower-leases-ms goes with --groups".into()));
    }
    if args.data_scale {
        let ds = crate::bench::datascale::DataScale {
            keys: args.keys,
            runs: args.runs,
            base_port: args.base_port,
            etcd_bin: args.etcd_bin.clone(),
            json: args.json.clone(),
            node_args: args.node_arg.clone(),
        };
        return crate::bench::datascale::run(&ds, dir);
    }
    if args.vs_etcd {
        let vs = crate::bench::etcd::VsEtcd {
            clients: args.clients.clone(),
            seconds: args.seconds,
            value_bytes: args.value_bytes,
            base_port: args.base_port,
            etcd_bin: args.etcd_bin.clone(),
            json: args.json.clone(),
            ops: crate::bench::etcd::ops::Op::parse(&args.ops).map_err(|e| (2, e))?,
            node_args: args.node_arg.clone(),
        };
        return crate::bench::etcd::run(&vs, dir);
    }
    let fdatasync = crate::bench::fsync::fdatasync_us(dir, 200).map_err(|e| (1, e.to_string()))?;
    let engines = match (args.log_engine, args.sessions) {
        (Some(e), _) => vec![e],
        (None, Some(_)) => vec![LogEngine::default()],
        (None, None) => LogEngine::ALL.to_vec(),
    };
    println!(
        "kv bench: 3 nodes (fsync on), peer delay {} ms one way, {} s per cell, {}-byte values, keep-alive clients on the leader; fdatasync of 4 KiB on this disk: p50 {:.0} µs, p99 {:.0} µs",
        args.peer_delay_ms, args.seconds, args.value_bytes, fdatasync.0, fdatasync.1
    );
    let mut cells = Vec::new();
    for engine in engines {
        let sub = dir.join(engine.name());
        cells.extend(on_cluster(args, engine, &sub)?);
    }
    if args.sessions.is_some() {
        return Ok(());
    }
    for line in report::summary(&cells, fdatasync) {
        println!("{line}");
    }
    if let Some(path) = &args.json {
        std::fs::write(path, report::to_json(&cells, fdatasync))
            .map_err(|e| (1, format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// Start a 3-node cluster on `engine` in `dir`, run the cells (or the sessions) on it, stop it.
fn on_cluster(
    args: &BenchArgs,
    engine: LogEngine,
    dir: &std::path::Path,
) -> Result<Vec<Cell>, (i32, String)> {
    std::fs::create_dir_all(dir).map_err(|e| (1, e.to_string()))?;
    let cluster = ClusterArgs {
        nodes: Some(3),
        data_dir: dir.to_path_buf(),
        temp: false,
        base_port: Some(args.base_port),
        http_base_port: None,
        etcd_base_port: None,
        groups: None,
        peer_delay_ms: args.peer_delay_ms,
        fault_injection: false,
        unsafe_lease_based: false,
        follower_leases_ms: None,
        insecure_peers: false,
        node_args: vec![
            "--http-spin-us".into(),
            args.http_spin_us.to_string(),
            "--log-engine".into(),
            engine.name().into(),
        ],
    };
    let layout = Layout::new(3, args.base_port);
    let plan = layout
        .check()
        .and_then(|_| Plan::new(&cluster, dir, layout))
        .map_err(|e| (2, e.to_string()))?;
    let children: Vec<_> = (1..=3)
        .map(|id| plan.spawn(id))
        .collect::<Result<_, _>>()
        .map_err(|e| (1, e.to_string()))?;
    let pids: Vec<u32> = children.iter().map(|child| child.id()).collect();
    let result = pick(args, engine, layout, &pids);
    shutdown(children);
    result.map_err(|e| (1, e))
}

/// The sessions bench with `--sessions`, else the cells.
fn pick(
    args: &BenchArgs,
    engine: LogEngine,
    layout: Layout,
    pids: &[u32],
) -> Result<Vec<Cell>, String> {
    let Some(sessions) = args.sessions else {
        return bench(args, engine, layout, pids);
    };
    let load = crate::bench::sessions::SessionLoad {
        sessions,
        ttl_ms: args.ttl_ms,
        conns: args.conns.max(1),
        seconds: args.seconds,
    };
    let report = crate::bench::sessions::bench(&leader_addr(layout)?, &load)?;
    crate::bench::sessions::print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{report}\n"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Vec::new())
}

fn leader_addr(layout: Layout) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for id in 1..=layout.nodes {
            let addr = format!("127.0.0.1:{}", layout.http_port(id));
            let status = crate::http::client::request(&addr, "GET", "/status", b"", &[]);
            if let Ok(a) = status {
                if a.body.contains("\"role\":\"leader\"") && a.body.contains("\"state\":\"valid\"")
                {
                    return Ok(addr);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("no leader with a lease within 30 s".into())
}

fn bench(
    args: &BenchArgs,
    engine: LogEngine,
    layout: Layout,
    pids: &[u32],
) -> Result<Vec<Cell>, String> {
    let addr = leader_addr(layout)?;
    let mut c = Client::connect(&addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    for k in 0..100 {
        c.request(
            "PUT",
            &format!("/kv/k{k}"),
            format!("value-{k}").as_bytes(),
            &[],
        )
        .map_err(|e| e.to_string())?;
    }
    println!(
        "{}: clients poll for each answer for {} µs before blocking (--spin-us; in cells with fewer clients than the {} CPUs); nodes poll for the next request for {} µs (--http-spin-us)",
        engine,
        args.spin_us,
        report::cores(),
        args.http_spin_us
    );
    println!("{}", report::header());
    let nodes: Vec<String> = (1..=layout.nodes)
        .map(|id| format!("127.0.0.1:{}", layout.http_port(id)))
        .collect();
    let leader = nodes.iter().position(|n| *n == addr).unwrap_or(0);
    let mut cells = Vec::new();
    for &clients in &args.clients {
        for op in ["put", "get_lease", "get_index"] {
            let before: Vec<Scrape> = nodes.iter().map(|a| Scrape::of(a)).collect();
            let cpu_before = CpuSample::now(pids);
            let mut cell = load(&addr, op, clients, args)?;
            let after: Vec<Scrape> = nodes.iter().map(|a| Scrape::of(a)).collect();
            if op == "put" {
                cell.stages = Some(Stages::around(cell.mean_us, leader, &before, &after));
            }
            cell.engine = engine.name();
            cell.cpu = cpu_before
                .zip(CpuSample::now(pids))
                .map(|(b, a)| b.cost(&a, cell.ops_per_s * cell.seconds));
            let (per_batch, persist_us) = before[leader].batches(&after[leader]);
            let batch = match op {
                "put" => format!("{per_batch:.1} ({persist_us:.0} µs)"),
                _ => String::new(),
            };
            println!("{}", cell.row(&batch));
            if let Some(s) = cell.stages.filter(|_| clients == 1) {
                println!("{}", s.line(engine.name(), clients));
            }
            cells.push(cell);
        }
    }
    Ok(cells)
}

/// Run `clients` clients doing `op` for the cell's time.
fn load(addr: &str, op: &'static str, clients: usize, args: &BenchArgs) -> Result<Cell, String> {
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let t0 = Instant::now();
    let value = vec![b'v'; args.value_bytes];
    let results: Vec<Result<(Vec<u64>, u64), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..clients)
            .map(|i| {
                let value = &value;
                let spin = client_spin(args.spin_us, clients);
                s.spawn(move || client(addr, op, i, value, end, spin))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut lat, mut errors) = (Vec::new(), 0);
    for r in results {
        let (l, e) = r?;
        lat.extend(l);
        errors += e;
    }
    lat.sort_unstable();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1e3
    };
    let mean_us = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64 / 1e3;
    Ok(Cell {
        engine: "",
        op,
        clients,
        ops_per_s: lat.len() as f64 / secs,
        p50_us: at(0.5),
        p99_us: at(0.99),
        mean_us,
        errors,
        seconds: secs,
        cpu: None,
        stages: None,
    })
}

/// A client's spin: `spin_us`, but none when there are as many clients as CPUs or more (then the
/// spinning threads would only take CPU from the nodes, on the same machine).
fn client_spin(spin_us: u64, clients: usize) -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match clients < cpus {
        true => Duration::from_micros(spin_us),
        false => Duration::ZERO,
    }
}

/// One client: latencies (ns) of its successful requests, and how many failed.
fn client(
    addr: &str,
    op: &str,
    i: usize,
    value: &[u8],
    end: Instant,
    spin: Duration,
) -> Result<(Vec<u64>, u64), String> {
    let mut c = Client::connect(addr, Duration::from_secs(10))
        .map_err(|e| e.to_string())?
        .spin(spin);
    let (mut lat, mut errors, mut n) = (Vec::new(), 0u64, 0usize);
    while Instant::now() < end {
        n += 1;
        let t = Instant::now();
        let answer = match op {
            "put" => c.request("PUT", &format!("/kv/w{i}-{}", n % 1000), value, &[]),
            "get_lease" => c.request(
                "GET",
                &format!("/kv/k{}?read=lease", (i + 7 * n) % 100),
                b"",
                &[],
            ),
            _ => c.request(
                "GET",
                &format!("/kv/k{}?read=index", (i + 7 * n) % 100),
                b"",
                &[],
            ),
        };
        match answer {
            Ok(a) if a.status == 200 => lat.push(t.elapsed().as_nanos() as u64),
            Ok(_) => errors += 1,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((lat, errors))
}
