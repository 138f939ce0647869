//! `kv nemesis`: randomized faults against real KV processes, every client operation recorded
//! and the whole history checked (Jepsen's method, on one machine).
//!
//! It starts a cluster (peer TLS, `--fault-injection`), runs writers, readers on every node in
//! every mode, and lockers with fenced writes, while a seeded schedule pauses, kills, partitions
//! (both ways and one way), skews clocks, transfers leadership, changes membership and leaves a
//! follower behind until it catches up by snapshot. After the faults it heals everything, reads
//! every key through the leader, and checks the history (see `checker`).

mod checker;
mod clients;
mod etcd_clients;
mod faults;
mod membership;
mod ops;
mod preload;
mod procs;
mod report;
mod schedule;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use parking_lot::{Mutex, RwLock};

use crate::cli::netns;
use clients::Shared;
use faults::Nemesis;
use ops::{Call, Recorder, Ret};

/// `kv nemesis`'s options.
#[derive(Args)]
pub struct NemesisArgs {
    /// A short run for CI: 3 nodes, every fault kind once, about 75 s of faults.
    #[arg(long)]
    pub quick: bool,
    /// The schedule's seed (default: from the time; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds of faults (default 75 with --quick, else 600).
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Founding nodes: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
    pub nodes: u64,
    /// Raft groups per node (keys spread over them; shared liveness above 1). After a membership
    /// change, the nemesis waits until every group follows group 0's configuration.
    #[arg(long, default_value_t = 1)]
    pub groups: u32,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// NEGATIVE CONTROL: the nodes use raft-rs `LeaseBased` reads (stale reads expected).
    #[arg(long)]
    pub unsafe_lease_based: bool,
    /// NEGATIVE CONTROL: every clock fault runs the leader's clock at this rate (far beyond ρ,
    /// for example 0.05) and cuts the leader off (stale reads expected).
    #[arg(long)]
    pub clock_rate: Option<f64>,
    /// EXPERIMENTAL: the nodes run follower read leases of at most this many ms (`G`; the
    /// nodes' heartbeat is 100 ms and their election timeout 1000 ms, so 101 to 499), and the
    /// readers also read with `read=local` at every node. Membership changes are not drawn then
    /// (see `docs/follower.md`: a committed change can wait on a slow holder while raft-rs
    /// refuses to campaign).
    #[arg(long)]
    pub follower_leases_ms: Option<u64>,
    /// NEGATIVE CONTROL: with --follower-leases-ms, replicas apply up to raft's commit instead
    /// of the exposed index (stale follower reads expected).
    #[arg(long, requires = "follower_leases_ms")]
    pub unsafe_apply_to_commit: bool,
    /// The clients speak etcd's v3 gRPC API (the `etcd-client` crate): puts, compare-and-swap
    /// through `Txn`, linearizable and serializable ranges, leases and watches, every watch
    /// event checked against the history (see docs/etcd.md).
    #[arg(long)]
    pub etcd: bool,
    /// NEGATIVE CONTROL: with --etcd, the nodes start every watch one revision late (watch
    /// anomalies expected).
    #[arg(long, requires = "etcd")]
    pub unsafe_watch_off_by_one: bool,
    /// NEGATIVE CONTROL: with --etcd, a follower serves a linearizable read without waiting to
    /// have applied up to the leader's revision (stale reads expected).
    #[arg(long, requires = "etcd")]
    pub unsafe_follower_read_unwaited: bool,
    /// Succeed only if the run shows at least one watch anomaly (the watch control in CI).
    #[arg(long, requires = "etcd")]
    pub expect_watch_anomalies: bool,
    /// Succeed only if the run shows at least one stale read (for the controls in CI).
    #[arg(long)]
    pub expect_stale_reads: bool,
    /// Each node on a test host of its own: a Linux network namespace with its own address on a
    /// bridge (the clients stay in the root namespace), and the network faults made by nftables
    /// inside the namespaces (dropped, rejected with a reset, one way, between two nodes only,
    /// random loss). Needs root, iproute2 and nftables; without them the run exits with code 5.
    #[arg(long)]
    pub netns: bool,
    /// Only these fault kinds (by the names the report uses, `isolate_leader,split`, say):
    /// to measure one fault's effect over many runs of it.
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Keep the cluster's data and logs in this dir (default: a temporary dir, removed).
    #[arg(long)]
    pub keep_dir: Option<PathBuf>,
    /// With --etcd: load this many keys of 256 bytes before the faults start (every snapshot
    /// then streams them all), and check after the run that every one is still there.
    #[arg(long, requires = "etcd")]
    pub preload_keys: Option<u64>,
}

fn parse_nodes(s: &str) -> Result<u64, String> {
    match s {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err("--nodes must be 3 or 5".into()),
    }
}

/// The raft election timeout the nodes run with (their default).
const ELECTION_MS: u64 = 1000;
/// The clock rate bound the nodes run with (their default `--drift-ppm`).
const RHO: f64 = 0.1;

/// `kv nemesis`.
pub fn run(a: NemesisArgs) -> i32 {
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
    });
    let duration = Duration::from_secs(a.duration_s.unwrap_or(if a.quick { 75 } else { 600 }));
    let nodes = if a.quick { 3 } else { a.nodes };
    if let Err(e) = check_kinds(&a) {
        eprintln!("error: {e}");
        return 2;
    }
    println!(
        "nemesis: seed {seed}, {nodes} nodes, {} groups, {} s of faults",
        a.groups,
        duration.as_secs()
    );
    let (dir, _temp) = match procs::run_dir(a.keep_dir.as_ref()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let cluster = procs::ClusterFlags {
        unsafe_lease_based: a.unsafe_lease_based,
        follower_leases_ms: a.follower_leases_ms,
        node_args: node_args(&a),
    };
    let hosts = match hosts(&a) {
        Ok(h) => h,
        Err(code) => return code,
    };
    let procs = match procs::Procs::start(&dir, nodes, seed, cluster, hosts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let start = Instant::now();
    let addrs = clients::addrs(|id| procs.http(id));
    let nem = Arc::new(Nemesis {
        auth: procs.auth(),
        procs: Mutex::new(procs),
        targets: Arc::new(RwLock::new((1..=nodes).collect())),
        used: Mutex::new((1..=nodes).collect::<BTreeSet<u64>>()),
        timeline: Mutex::default(),
        start,
        addrs: addrs.clone(),
    });
    let code = run_with(&a, seed, nodes, duration, &nem, addrs);
    let procs = Arc::try_unwrap(nem).map(|n| n.procs.into_inner());
    if let Ok(p) = procs {
        if a.keep_dir.is_none() && code != 0 {
            eprintln!("logs of the failed run: rerun with --keep-dir DIR to keep them");
        }
        p.shutdown();
    }
    code
}

/// The arguments every node of the run gets.
fn node_args(a: &NemesisArgs) -> Vec<String> {
    // Compact often, so that a follower left behind catches up by snapshot.
    let mut node_args = vec!["--snapshot-every".to_string(), "200".to_string()];
    if a.groups > 1 {
        node_args.extend(["--groups".to_string(), a.groups.to_string()]);
    }
    if a.unsafe_apply_to_commit {
        node_args.push("--unsafe-apply-to-commit".to_string());
    }
    if a.unsafe_watch_off_by_one {
        node_args.push("--unsafe-watch-off-by-one".to_string());
    }
    if a.unsafe_follower_read_unwaited {
        node_args.push("--unsafe-follower-read-unwaited".to_string());
    }
    node_args
}

/// The network namespaces of a `--netns` run (none without it); `Err` holds the exit code.
fn hosts(a: &NemesisArgs) -> Result<Option<netns::Hosts>, i32> {
    if !a.netns {
        return Ok(None);
    }
    match netns::Hosts::create(&(1..=procs::MAX_IDS).collect::<Vec<_>>()) {
        Ok(h) => Ok(Some(h)),
        Err(e @ netns::NetnsError::Unavailable(_)) => {
            eprintln!("error: --netns: {e}");
            Err(netns::UNAVAILABLE_EXIT)
        }
        Err(e) => {
            eprintln!("error: --netns: {e}");
            Err(2)
        }
    }
}

/// The command that runs this nemesis again, printed with the verdict.
fn rerun_line(a: &NemesisArgs, seed: u64, nodes: u64, duration: Duration) -> String {
    let mut rerun = format!(
        "cargo run --release --bin kv -- nemesis --seed {seed} --nodes {nodes} --duration-s {}",
        duration.as_secs()
    );
    for (on, flag) in [
        (a.quick, " --quick"),
        (a.etcd, " --etcd"),
        (a.unsafe_lease_based, " --unsafe-lease-based"),
        (a.unsafe_apply_to_commit, " --unsafe-apply-to-commit"),
        (a.unsafe_watch_off_by_one, " --unsafe-watch-off-by-one"),
        (
            a.unsafe_follower_read_unwaited,
            " --unsafe-follower-read-unwaited",
        ),
        (a.netns, " --netns"),
    ] {
        if on {
            rerun.push_str(flag);
        }
    }
    if !a.kinds.is_empty() {
        rerun.push_str(&format!(" --kinds {}", a.kinds.join(",")));
    }
    if let Some(g) = a.follower_leases_ms {
        rerun.push_str(&format!(" --follower-leases-ms {g}"));
    }
    if let Some(r) = a.clock_rate {
        rerun.push_str(&format!(" --clock-rate {r}"));
    }
    if let Some(n) = a.preload_keys {
        rerun.push_str(&format!(" --preload-keys {n}"));
    }
    if a.groups > 1 {
        rerun.push_str(&format!(" --groups {}", a.groups));
    }
    rerun
}

/// Runs the clients and the faults against a started cluster, checks the history, and reports.
fn run_with(
    a: &NemesisArgs,
    seed: u64,
    nodes: u64,
    duration: Duration,
    nem: &Arc<Nemesis>,
    addrs: Arc<Vec<String>>,
) -> i32 {
    if nem.leader(60).is_none() {
        eprintln!("error: no leader within 60 s of starting; seed {seed}");
        for id in 1..=nodes {
            eprintln!("node {id}:\n{}", nem.procs.lock().log_tail(id, 10));
        }
        return 2;
    }
    let etcd_addrs = || {
        let procs = nem.procs.lock();
        (1..=nodes).map(|id| procs.etcd(id)).collect::<Vec<_>>()
    };
    if let Some(keys) = a.preload_keys {
        match preload::load(&etcd_addrs(), keys) {
            Ok(rate) => println!("preloaded {keys} keys ({rate:.0} keys/s)"),
            Err(e) => {
                eprintln!("error: preload: {e}; seed {seed}");
                return 2;
            }
        }
    }
    let shared = Shared {
        rec: Recorder::new(nem.start),
        addrs,
        targets: nem.targets.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        think: Duration::from_millis(if a.quick { 5 } else { 20 }),
        local_reads: a.follower_leases_ms.is_some(),
    };
    let etcd = a.etcd.then(|| {
        let procs = nem.procs.lock();
        let addrs = clients::addrs(|id| procs.etcd(id));
        etcd_clients::Etcd::new(shared.clone(), addrs)
    });
    let (clients, etcd_clients) = match &etcd {
        None => (start_clients(&shared, nodes, seed), None),
        Some(e) => (Vec::new(), Some(etcd_clients::start(e, nodes, seed))),
    };
    let progress = progress(&shared, nem.clone());
    faults_for(a, seed, duration, nem);
    let node_exits = nem.heal_all();
    shared.stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let leases = etcd_clients.map(|h| h.join().unwrap_or((0, 0)));
    let _ = progress.join();
    let verdict = match &etcd {
        None => {
            final_reads(&shared, nem);
            checker::check(&shared.rec.snapshot())
        }
        Some(e) => etcd_final(e, nem, leases.unwrap_or((0, 0))),
    };
    let ops = shared.rec.snapshot();
    let rerun = rerun_line(a, seed, nodes, duration);
    let info = report::RunInfo {
        seed,
        nodes,
        duration_s: nem.start.elapsed().as_secs_f64(),
        rerun: rerun.clone(),
        node_exits: &node_exits,
        unsafe_lease_based: a.unsafe_lease_based,
        clock_rate: a.clock_rate,
        follower_leases_ms: a.follower_leases_ms,
        unsafe_apply_to_commit: a.unsafe_apply_to_commit,
    };
    let r = report::json(&info, &verdict, &ops, &nem.timeline.lock());
    report::print(&r);
    if let Some(path) = &a.report {
        let text = serde_json::to_string_pretty(&r).expect("the report serializes");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: {}: {e}", path.display());
            return 2;
        }
    }
    if let Some(keys) = a.preload_keys {
        match preload::count(&etcd_addrs()) {
            Ok(n) if n == keys => println!("every preloaded key is there ({n})"),
            Ok(n) => {
                println!("FAILED: {n} of the {keys} preloaded keys are there; rerun: {rerun}");
                return 1;
            }
            Err(e) => {
                println!("FAILED: preloaded keys not counted: {e}; rerun: {rerun}");
                return 1;
            }
        }
    }
    verdict_code(a, &verdict, &node_exits, seed, &rerun)
}

fn verdict_code(
    a: &NemesisArgs,
    v: &checker::Verdict,
    exits: &[u64],
    seed: u64,
    rerun: &str,
) -> i32 {
    if a.expect_watch_anomalies {
        if v.watch_anomalies.is_empty() {
            println!("CONTROL FAILED: no watch anomaly (seed {seed}); rerun: {rerun}");
            return 1;
        }
        println!(
            "control passed: {} watch anomalies found, as expected (seed {seed})",
            v.watch_anomalies.len()
        );
        return 0;
    }
    if a.expect_stale_reads {
        if v.stale_reads.is_empty() {
            println!("CONTROL FAILED: no stale read (seed {seed}); rerun: {rerun}");
            return 1;
        }
        println!(
            "control passed: {} stale reads found, as expected (seed {seed})",
            v.stale_reads.len()
        );
        return 0;
    }
    if v.anomalies() > 0 || !exits.is_empty() {
        println!("FAILED: {} anomalies, nodes that exited on their own {exits:?} (seed {seed}); rerun: {rerun}", v.anomalies());
        return 1;
    }
    println!("passed: no anomaly (seed {seed})");
    0
}

fn start_clients(s: &Shared, nodes: u64, seed: u64) -> Vec<std::thread::JoinHandle<()>> {
    let mut handles = Vec::new();
    let mut client = 0u32;
    let mut spawn = |f: Box<dyn FnOnce(Shared, u32) + Send>| {
        client += 1;
        let (s, c) = (s.clone(), client);
        handles.push(std::thread::spawn(move || f(s, c)));
    };
    for w in 0..2 {
        spawn(Box::new(move |s, c| {
            clients::writer(s, c, seed ^ (100 + w))
        }));
    }
    for slot in 0..nodes as usize {
        spawn(Box::new(move |s, c| {
            clients::reader(s, c, slot, seed ^ (200 + slot as u64))
        }));
    }
    for l in 0..2 {
        spawn(Box::new(move |s, c| {
            clients::locker(s, c, seed ^ (300 + l))
        }));
    }
    handles
}

/// A progress line every 10 s until the clients stop.
fn progress(s: &Shared, nem: Arc<Nemesis>) -> std::thread::JoinHandle<()> {
    let (rec, stop) = (s.rec.clone(), s.stop.clone());
    std::thread::spawn(move || {
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            if last.elapsed() >= Duration::from_secs(10) {
                last = Instant::now();
                println!(
                    "[{:>7.1}s] progress: {} operations, {} faults, members {:?}",
                    nem.start.elapsed().as_secs_f64(),
                    rec.len(),
                    nem.timeline.lock().len(),
                    nem.targets.read()
                );
            }
        }
    })
}

/// How this run's faults are drawn.
fn params(a: &NemesisArgs) -> schedule::Params {
    schedule::Params {
        election_ms: ELECTION_MS,
        rho: RHO,
        control_rate: a.clock_rate,
        membership: true,
        slow_follower: a.follower_leases_ms.is_some(),
        kernel_faults: a.netns,
    }
}

/// A `--kinds` entry that names no kind, or one these settings never draw.
fn check_kinds(a: &NemesisArgs) -> Result<(), String> {
    let known = schedule::kind_names();
    let first_pass = schedule::schedule(0, 4 * schedule::KINDS, &params(a));
    let drawn: Vec<&str> = first_pass.iter().map(|s| s.fault.kind()).collect();
    for k in &a.kinds {
        if !known.contains(&k.as_str()) {
            let all = known.join(", ");
            return Err(format!("--kinds {k}: no such fault kind; the kinds: {all}"));
        }
        if !drawn.contains(&k.as_str()) {
            return Err(format!(
                "--kinds {k}: not drawn with these settings (reject_leader, pair_cut and loss \
                 need --netns; slow_follower needs --follower-leases-ms)"
            ));
        }
    }
    Ok(())
}

/// Run the seeded schedule (only the `--kinds` given, if any) until `duration` has passed: a
/// short run reaches only the first kinds of its seed's order.
fn faults_for(a: &NemesisArgs, seed: u64, duration: Duration, nem: &Arc<Nemesis>) {
    let mut steps = schedule::schedule(seed, 100_000, &params(a));
    if !a.kinds.is_empty() {
        steps.retain(|s| a.kinds.iter().any(|k| k == s.fault.kind()));
    }
    let t0 = Instant::now();
    let mut background: Vec<std::thread::JoinHandle<()>> = Vec::new();
    for step in steps {
        if t0.elapsed() >= duration {
            break;
        }
        std::thread::sleep(Duration::from_millis(step.gap_ms));
        if step.overlap {
            let n = nem.clone();
            background.retain(|h| !h.is_finished());
            background.push(std::thread::spawn(move || n.apply(&step.fault)));
        } else {
            nem.apply(&step.fault);
        }
    }
    for h in background {
        let _ = h.join();
    }
}

/// etcd-API mode, after the faults: every checked key read linearizably, until each has an
/// answer; the history as one watch reads it; the checker's verdict with the watchers' events
/// checked against that history.
fn etcd_final(e: &etcd_clients::Etcd, nem: &Nemesis, leases: (u64, u64)) -> checker::Verdict {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    e.forget_connections();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut history = None;
    rt.block_on(async {
        for k in 0..clients::KEYS {
            let call = Call::Get {
                key: format!("{}{k}", etcd_clients::PREFIX),
                mode: "linearizable".into(),
                final_read: true,
            };
            while Instant::now() < deadline {
                let Some(l) = nem.leader(10) else { continue };
                let id = e.s.rec.invoke(0, l, call.clone());
                let ret = etcd_clients::run_op(e, l, &call).await;
                let done = matches!(ret, Ret::Read { .. });
                e.s.rec.complete(id, l, ret);
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        while history.is_none() && Instant::now() < deadline {
            if let Some(l) = nem.leader(10) {
                match etcd_clients::history(e, l).await {
                    Ok(h) => history = Some(h),
                    Err(why) => println!("etcd: the history at node {l}: {why}; again"),
                }
            }
        }
    });
    let ops = e.s.rec.snapshot();
    let mut v = checker::check(&ops);
    let watched = e.watched.lock().clone();
    println!(
        "etcd: {} watchers saw {} events; leases: {} rounds done, {} cut by faults",
        watched.len(),
        watched.iter().map(Vec::len).sum::<usize>(),
        leases.0,
        leases.1
    );
    match history {
        Some(h) => {
            v.watch_events_checked = watched.iter().map(Vec::len).sum();
            v.watch_anomalies = etcd_clients::check_watches(&h, &watched, &ops);
        }
        None => v.watch_anomalies.push(checker::Anomaly {
            op: 0,
            against: 0,
            detail: "the history could not be read after the faults".into(),
        }),
    }
    for detail in e.lease_anomalies.lock().iter() {
        let detail = detail.clone();
        v.lease_violations.push(checker::Anomaly {
            op: 0,
            against: 0,
            detail,
        });
    }
    v
}

/// After the faults: every key read through the leader (ReadIndex), until each has an answer.
fn final_reads(s: &Shared, nem: &Nemesis) {
    let mut keys: Vec<String> = (0..clients::KEYS).map(|k| format!("k{k}")).collect();
    keys.push("fenced-L0".into());
    let deadline = Instant::now() + Duration::from_secs(60);
    for key in keys {
        while Instant::now() < deadline {
            let Some(l) = nem.leader(10) else { continue };
            let c = Call::Get {
                key: key.clone(),
                mode: "index".into(),
                final_read: true,
            };
            if matches!(clients::run_op(s, 0, l, c), Ret::Read { .. }) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
