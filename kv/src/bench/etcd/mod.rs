//! `kv bench --vs-etcd`: the store and etcd 3.4 side by side, through etcd's own gRPC API.
//!
//! One run starts a 3-node cluster of the store and a 3-member etcd cluster on this machine, both
//! with fsync on, and drives both with the same Rust gRPC client (the `etcd-client` crate): the
//! same connections (one per client), the same requests, all on each system's leader. The cells
//! alternate between the systems, so that both see the same machine. Each cell reports
//! operations per second, p50, p99 and the CPU of the system's three processes per operation;
//! then the ratios of the store to etcd and the targets they are held to. With no etcd binary,
//! etcd's cells are skipped with a line saying how to install it.

pub mod cell;
pub mod member;
pub mod ops;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::Client;
use serde_json::json;

use crate::bench::cpu::CpuSample;
use crate::bench::stages::{Scrape, Stages};
use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;
use crate::cli::cluster::plan::{shutdown, Plan};
use cell::Cell;
use ops::Op;

/// What `kv bench --vs-etcd` runs.
pub struct VsEtcd {
    /// Numbers of concurrent clients, one cell each per operation and system.
    pub clients: Vec<usize>,
    /// Seconds per cell.
    pub seconds: u64,
    /// Bytes per written value.
    pub value_bytes: usize,
    /// The store's ports start here (as `kv cluster`'s); etcd's at 3000 above.
    pub base_port: u16,
    /// The etcd binary, if given.
    pub etcd_bin: Option<PathBuf>,
    /// Where to write the JSON.
    pub json: Option<PathBuf>,
    /// The operations, in this order.
    pub ops: Vec<Op>,
    /// More flags for the store's nodes.
    pub node_args: Vec<String>,
}

/// A system under test: its name, its leader's endpoint and its processes.
struct System {
    name: &'static str,
    leader: String,
    pids: Vec<u32>,
    /// The store's nodes' HTTP addresses, for their write stages (`None`: etcd).
    http: Option<Vec<String>>,
}

/// Run the whole comparison in `dir`.
pub fn run(args: &VsEtcd, dir: &Path) -> Result<(), (i32, String)> {
    let uptime_before = uptime();
    let fdatasync = crate::bench::fsync::fdatasync_us(dir, 200).map_err(|e| (1, e.to_string()))?;
    let etcd = find_etcd(args)?;
    println!(
        "kv bench --vs-etcd: 3 nodes of the store and 3 members of {}, fsync on, on this machine \
         ({} CPUs); {} s per cell, {}-byte values; one gRPC client (etcd-client) with one \
         connection and one request in flight per client, on each leader; fdatasync of 4 KiB on \
         this disk: p50 {:.0} µs, p99 {:.0} µs",
        etcd.as_ref().map_or("etcd (absent)", |(_, v)| v.as_str()),
        crate::bench::report::cores(),
        args.seconds,
        args.value_bytes,
        fdatasync.0,
        fdatasync.1
    );
    let store_dir = dir.join("raft-lease");
    std::fs::create_dir_all(&store_dir).map_err(|e| (1, e.to_string()))?;
    let (plan, layout) = store_plan(args, &store_dir)?;
    let children: Vec<_> = (1..=3)
        .map(|id| plan.spawn(id))
        .collect::<Result<_, _>>()
        .map_err(|e| (1, e))?;
    let store_pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let etcd_cluster = etcd
        .as_ref()
        .map(|(bin, _)| member::EtcdCluster::start(bin, dir, args.base_port + 3000))
        .transpose();
    let result = etcd_cluster.map_err(|e| (1, e)).and_then(|etcd_cluster| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| (1, e.to_string()))?;
        runtime.block_on(all_cells(args, layout, store_pids, etcd_cluster.as_ref()))
    });
    shutdown(children);
    let cells = result?;
    report(args, &cells, fdatasync, etcd.map(|(_, v)| v), uptime_before)
}

/// The etcd binary and its version, or `None` (its cells skipped, said so).
fn find_etcd(args: &VsEtcd) -> Result<Option<(PathBuf, String)>, (i32, String)> {
    let Some(bin) = member::etcd_bin(args.etcd_bin.as_deref()) else {
        println!(
            "SKIPPED etcd's cells: no etcd binary on the PATH (Debian and Ubuntu: \
             apt-get install etcd-server; or give --etcd-bin or $ETCD_BIN)"
        );
        return Ok(None);
    };
    let version = member::version(&bin).map_err(|e| (1, e))?;
    Ok(Some((bin, version)))
}

/// The store's cluster, as `kv cluster` makes it (mutual TLS between peers, etcd's API plain).
fn store_plan(args: &VsEtcd, dir: &Path) -> Result<(Plan, Layout), (i32, String)> {
    let cluster = ClusterArgs {
        node_args: args.node_args.clone(),
        ..ClusterArgs::local(3, dir, args.base_port)
    };
    let layout = Layout::new(3, args.base_port);
    let plan = layout
        .check()
        .and_then(|_| Plan::new(&cluster, dir, layout))
        .map_err(|e| (2, e.to_string()))?;
    Ok((plan, layout))
}

/// Every cell, the systems alternating.
async fn all_cells(
    args: &VsEtcd,
    layout: Layout,
    store_pids: Vec<u32>,
    etcd: Option<&member::EtcdCluster>,
) -> Result<Vec<Cell>, (i32, String)> {
    let endpoints: Vec<String> = (1..=3)
        .map(|id| format!("127.0.0.1:{}", layout.etcd_port(id)))
        .collect();
    let mut systems = vec![System {
        name: "raft-lease",
        leader: member::leader(&endpoints).await.map_err(|e| (1, e))?,
        pids: store_pids,
        http: Some(
            (1..=3)
                .map(|id| format!("127.0.0.1:{}", layout.http_port(id)))
                .collect(),
        ),
    }];
    if let Some(e) = etcd {
        systems.push(System {
            name: "etcd",
            leader: member::leader(&e.endpoints).await.map_err(|e| (1, e))?,
            pids: e.pids(),
            http: None,
        });
    }
    for s in &systems {
        preload(&s.leader)
            .await
            .map_err(|e| (1, format!("{}: {e}", s.name)))?;
    }
    println!("{}", cell::header());
    let mut cells = Vec::new();
    for &clients in &args.clients {
        for &op in &args.ops {
            for s in &systems {
                let scrape = || s.http.iter().flatten().map(|a| Scrape::of(a)).collect();
                let before: Vec<Scrape> = scrape();
                let c = one_cell(args, s, op, clients)
                    .map_err(|e| (1, format!("{} {} {clients}: {e}", s.name, op.name())))?;
                println!("{}", c.row());
                if let (Op::Put, Some(http)) = (op, &s.http) {
                    let leader = endpoints.iter().position(|e| *e == s.leader).unwrap_or(0);
                    let stages = Stages::around(c.mean_us, leader, &before, &scrape());
                    println!("  {}", stages.line("raft-lease", clients));
                    debug_assert_eq!(http.len(), before.len());
                }
                cells.push(c);
                compact(&s.leader)
                    .await
                    .map_err(|e| (1, format!("{}: {e}", s.name)))?;
            }
        }
    }
    Ok(cells)
}

/// The keys the ranges read.
async fn preload(ep: &str) -> Result<(), String> {
    let mut c = Client::connect([ep], None)
        .await
        .map_err(|e| e.to_string())?;
    for k in 0..ops::RANGE_KEYS {
        c.put(format!("k{k}"), format!("value-{k}"), None)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Compact the history to the current revision, so that no cell's versions weigh on the next.
async fn compact(ep: &str) -> Result<(), String> {
    let mut c = Client::connect([ep], None)
        .await
        .map_err(|e| e.to_string())?;
    let rev = c.get("k0", None).await.map_err(|e| e.to_string())?;
    let rev = rev.header().map_or(0, |h| h.revision());
    match c.compact(rev, None).await {
        // A cell that wrote nothing leaves the revision compacted already.
        Err(e) if e.to_string().contains("has been compacted") => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(_) => Ok(()),
    }
}

/// `clients` clients doing `op` on `s` for the cell's time. The clients run on as many threads
/// as there are CPUs (fewer if there are fewer clients), each a single-threaded runtime, so that
/// a client's gRPC channel's tasks wake each other without crossing threads; the cell's clock
/// and the CPU counters start once every client has connected and made its state.
fn one_cell(args: &VsEtcd, s: &System, op: Op, clients: usize) -> Result<Cell, String> {
    let threads = clients.min(crate::bench::report::cores() as usize).max(1);
    let ready = std::sync::Barrier::new(threads + 1);
    let seconds = Duration::from_secs(args.seconds);
    let (results, t0, cpu_before) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (ready, leader) = (&ready, s.leader.as_str());
                let mine: Vec<usize> = (t..clients).step_by(threads).collect();
                let value = vec![b'v'; args.value_bytes];
                scope.spawn(move || client_thread(op, leader, mine, value, seconds, ready))
            })
            .collect();
        ready.wait();
        let (t0, cpu_before) = (Instant::now(), CpuSample::now(&s.pids));
        let results: Vec<Result<ops::Measured, String>> = handles
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a client panicked".into())))
            .collect();
        (results, t0, cpu_before)
    });
    let (mut lat, mut errors) = (Vec::new(), 0);
    for m in results {
        let m = m?;
        lat.extend(m.lat_ns);
        errors += m.errors;
    }
    let secs = t0.elapsed().as_secs_f64();
    let ops = lat.len() as f64;
    let cpu = cpu_before
        .zip(CpuSample::now(&s.pids))
        .map(|(b, a)| b.cost(&a, ops).nodes_us_per_op);
    lat.sort_unstable();
    let at = |q: f64| {
        let i = ((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1));
        lat.get(i).copied().unwrap_or(0) as f64 / 1e3
    };
    let mean_us = lat.iter().sum::<u64>() as f64 / lat.len().max(1) as f64 / 1e3;
    Ok(Cell {
        system: s.name,
        mean_us,
        op: op.name(),
        clients,
        ops_per_s: ops / secs,
        p50_us: at(0.5),
        p99_us: at(0.99),
        cpu_us_per_op: cpu,
        errors,
    })
}

/// One client thread: connect its clients (`ids`) and make their state, wait for the other
/// threads, then run them all for `seconds`. A thread that fails before the start still waits
/// at the barrier, so that none waits for ever.
fn client_thread(
    op: Op,
    leader: &str,
    ids: Vec<usize>,
    value: Vec<u8>,
    seconds: Duration,
    ready: &std::sync::Barrier,
) -> Result<ops::Measured, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string());
    let made = runtime.as_ref().map_err(Clone::clone).and_then(|rt| {
        rt.block_on(async {
            let mut made = Vec::with_capacity(ids.len());
            for &i in &ids {
                let mut c = Client::connect([leader], None)
                    .await
                    .map_err(|e| e.to_string())?;
                made.push((i, ops::prepare(op, &mut c, i).await?, c));
            }
            Ok::<_, String>(made)
        })
    });
    ready.wait();
    let (runtime, made) = (runtime?, made?);
    let end = Instant::now() + seconds;
    runtime.block_on(async {
        let tasks: Vec<_> = made
            .into_iter()
            .map(|(i, p, c)| tokio::spawn(ops::run(op, c, p, i, value.clone(), end)))
            .collect();
        let mut all = ops::Measured::default();
        for t in tasks {
            let m = t.await.map_err(|e| format!("a client panicked: {e}"))??;
            all.lat_ns.extend(m.lat_ns);
            all.errors += m.errors;
        }
        Ok(all)
    })
}

/// `uptime`'s line (the machine's load), or why there is none.
pub(crate) fn uptime() -> String {
    match std::process::Command::new("uptime").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Err(e) => format!("uptime: {e}"),
    }
}

/// The ratios and the targets printed; the JSON written.
fn report(
    args: &VsEtcd,
    cells: &[Cell],
    fdatasync: (f64, f64),
    etcd_version: Option<String>,
    uptime_before: String,
) -> Result<(), (i32, String)> {
    println!("\nthe store ÷ etcd:");
    for line in cell::ratios(cells) {
        println!("  {line}");
    }
    let targets = cell::targets(cells, fdatasync.0);
    println!("\ntargets:");
    for t in &targets {
        let sign = if t.at_most { "≤" } else { "≥" };
        let met = if t.met() { "met" } else { "MISSED" };
        println!(
            "  {:<52} {:>8.3} {sign} {:<5} {met}",
            t.what, t.measured, t.bound
        );
    }
    let Some(path) = &args.json else {
        return Ok(());
    };
    let doc = json!({
        "bench": "kv bench --vs-etcd",
        "seconds_per_cell": args.seconds,
        "value_bytes": args.value_bytes,
        "cores": crate::bench::report::cores(),
        "etcd": etcd_version,
        "uptime_before": uptime_before,
        "uptime_after": uptime(),
        "fdatasync_4k": {"p50_us": fdatasync.0.round(), "p99_us": fdatasync.1.round()},
        "cells": cells.iter().map(Cell::to_json).collect::<Vec<_>>(),
        "targets": targets.iter().map(cell::Target::to_json).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&doc).expect("the report serializes");
    std::fs::write(path, text + "\n").map_err(|e| (1, format!("{}: {e}", path.display())))
}
