//! `kv node`: check the options and the data dir, set up TLS, start the I/O runtime (HTTP and
//! peers on tokio), run the raft loop until SIGTERM/SIGINT or a fatal error, then stop in order:
//! the raft loop answers every request still waiting (503), the accept loops stop, open
//! connections finish the request in hand, and the runtime shuts down.
//!
//! Exit codes: 0 stopped by a signal; 1 a fatal error (storage failure, a port in use);
//! 2 bad options or TLS files; 3 the data dir was refused (another node's, in use by another
//! process, its store missing, empty or corrupt, or its lease promise record unreadable).

use std::collections::HashSet;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use raft::eraftpb::Snapshot;
use slog::{info, o, warn, Logger};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::base::budget::Budget;
use crate::base::clock::ScaledClock;
use crate::base::conns::ConnTable;
use crate::base::options::NodeOptions;
use crate::cli::args::NodeArgs;
use crate::disk::marker::DirError;
use crate::disk::promise_file::PromiseRecord;
use crate::disk::storage::DiskStorage;
use crate::node::app::App;
use crate::peer::members::{Addrs, Members};
use crate::peer::transport::{Transport, TransportConfig};
use crate::raft::raft_loop::{LoopConfig, RaftLoop, Wiring};
use crate::state::kv_state::KvState;
use crate::tls::config::PeerTls;

/// Why a node stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum Exit {
    /// Bad options or TLS files.
    #[error("{0}")]
    Config(String),
    /// The data dir was refused.
    #[error("{0}")]
    Dir(#[from] DirError),
    /// A fatal error at run time.
    #[error("{0}")]
    Fatal(String),
}

impl Exit {
    /// The process's exit code.
    pub fn code(&self) -> i32 {
        match self {
            Exit::Fatal(_) => 1,
            Exit::Config(_) => 2,
            Exit::Dir(_) => 3,
        }
    }
}

fn config(e: impl ToString) -> Exit {
    Exit::Config(e.to_string())
}

fn fatal(e: impl ToString) -> Exit {
    Exit::Fatal(e.to_string())
}

fn peer_tls(args: &NodeArgs, log: &Logger) -> Result<Option<PeerTls>, Exit> {
    match args.peer_tls_files().map_err(config)? {
        Some(f) => Ok(Some(
            PeerTls::load(&f.ca, &f.cert, &f.key, args.id).map_err(config)?,
        )),
        None => {
            for _ in 0..3 {
                warn!(log, "!!! --insecure-peers: peer traffic is PLAINTEXT and UNAUTHENTICATED. Anyone who \
                            reaches the peer port can forge raft messages, lose acknowledged writes and \
                            cause stale reads. Local experiments only. !!!");
            }
            Ok(None)
        }
    }
}

/// The address book a founding node starts with: `--peers` and `--peer-http`.
fn founding_members(o: &NodeOptions) -> Members {
    let addrs = o
        .peers
        .iter()
        .map(|(&id, peer)| {
            let http = o.peer_http.get(&id).cloned();
            (
                id,
                Addrs {
                    peer: peer.clone(),
                    http,
                    etcd: o.etcd_of(id),
                },
            )
        })
        .collect();
    let founding = raft::eraftpb::ConfState {
        voters: o.peers.keys().copied().collect(),
        ..Default::default()
    };
    Members {
        addrs,
        conf: Some(crate::peer::follow::Followed::of(FOUNDING_INDEX, &founding)),
        ..Members::default()
    }
}

/// The index of the cluster's first snapshot: the version of the founding configuration.
const FOUNDING_INDEX: u64 = 1;

/// The cluster's first snapshot, the same on every founding node: index 1, term 1, the voters
/// of `--peers`, their addresses, an empty store. A joining node starts with none.
fn bootstrap(o: &NodeOptions) -> Option<Snapshot> {
    if o.join.is_some() {
        return None;
    }
    // An empty machine part: the state at index 1 is empty (see `raft_loop::open_state`).
    let data = crate::raft::snapshot::envelope(&founding_members(o), FOUNDING_INDEX, &[]);
    let mut s = Snapshot {
        data: data.into(),
        ..Default::default()
    };
    let m = s.mut_metadata();
    (m.index, m.term) = (FOUNDING_INDEX, 1);
    m.mut_conf_state().voters = o.peers.keys().copied().collect();
    Some(s)
}

/// The promise `P` these options make, in ms: raft's election timeout in whole ticks.
/// Shared liveness: a group with nothing to do for two election timeouts quiesces.
fn quiesce_after_ticks(o: &NodeOptions) -> u32 {
    (2 * election_tick(o)).min(u32::MAX as usize) as u32
}

fn promise_ms(o: &NodeOptions) -> u64 {
    election_tick(o) as u64 * o.tick_ms
}

fn election_tick(o: &NodeOptions) -> usize {
    (o.election_ms / o.tick_ms).max(2) as usize
}

/// The lease safeties these options ask for: all of them unless an unsafe flag is given.
fn safeties(o: &NodeOptions) -> raft_lease::Safeties {
    let mut safeties = if o.unsafe_lease_based {
        raft_lease::Safeties::raft_lease_based()
    } else {
        raft_lease::Safeties::default()
    };
    safeties.testing.count_own_promise = o.unsafe_count_own_promise;
    safeties.testing.apply_to_commit = o.unsafe_apply_to_commit;
    safeties
}

/// The raft and lease configs for these options, validated by `LeaseNode::new`. `prior_ms`:
/// the longest promise an earlier run on the data dir may still be bound by (0: none known).
fn configs(o: &NodeOptions, prior_ms: u64) -> (raft::Config, raft_lease::LeaseConfig) {
    let election_tick = election_tick(o);
    let heartbeat_tick = (o.heartbeat_ms / o.tick_ms).max(1) as usize;
    let rc = raft::Config {
        id: o.id,
        election_tick,
        heartbeat_tick,
        check_quorum: true,
        pre_vote: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        max_uncommitted_size: o.max_inflight_bytes,
        ..raft::Config::default()
    };
    let lease = raft_lease::LeaseConfig {
        promise_ms: promise_ms(o),
        drift_ppm: o.drift_ppm,
        margin_ms: o.margin_ms,
        renew_below_pct: 33,
        safeties: safeties(o),
        seed: o.id,
        prior_promise_ms: prior_ms,
        follower_leases: o.follower_leases_ms.map(raft_lease::FollowerLeases::new),
    };
    (rc, lease)
}

/// Refuse options whose raft and lease configs `LeaseNode::new` would refuse (a `G` of
/// --follower-leases-ms outside its bounds among them), before anything is opened.
fn check_configs(o: &NodeOptions) -> Result<(), Exit> {
    let (rc, lease) = configs(o, 0);
    lease.validate(&rc, o.tick_ms).map(drop).map_err(|e| {
        let hint = match e {
            raft_lease::ConfigError::GrantTooLong { .. }
            | raft_lease::ConfigError::GrantNotAboveHeartbeat { .. } => format!(
                "--follower-leases-ms {}: must be above --heartbeat-ms {} and below half of \
                 --election-ms {}: ",
                o.follower_leases_ms.unwrap_or(0),
                o.heartbeat_ms,
                o.election_ms
            ),
            _ => String::new(),
        };
        Exit::Config(format!("{hint}{e}"))
    })
}

/// What `kv node` would refuse at start with these arguments, checked without opening or
/// binding anything: the options, the raft and lease configs, the TLS files (peer, HTTPS, and
/// `--join`'s CA), and a data dir made with another number of groups. `kv node` runs it first,
/// and `kv cluster` for every node before it starts one.
pub fn preflight(args: &NodeArgs) -> Result<(), Exit> {
    let opts = args.options().map_err(config)?;
    check_configs(&opts)?;
    if let Some(f) = args.peer_tls_files().map_err(config)? {
        PeerTls::load(&f.ca, &f.cert, &f.key, args.id).map_err(config)?;
    }
    if let (Some(cert), Some(key)) = (&args.http_cert, &args.http_key) {
        crate::tls::config::http_acceptor(cert, key).map_err(config)?;
    }
    if let Some(ca) = opts.join.as_ref().and_then(|j| j.https_ca.as_ref()) {
        crate::tls::config::https_client(ca).map_err(config)?;
    }
    crate::disk::marker::check_groups(&opts.data_dir, opts.groups)?;
    Ok(())
}

/// The sockets a node listens on.
struct Listeners {
    peer: TcpListener,
    http: TcpListener,
    etcd: Option<TcpListener>,
}

fn bind(rt: &Runtimes, o: &NodeOptions) -> Result<Listeners, Exit> {
    let own = &o.peers[&o.id];
    let peer_addr = own
        .to_socket_addrs()
        .map_err(|e| fatal(format!("peer address {own}: {e}")))?
        .next()
        .ok_or_else(|| fatal(format!("peer address {own} resolves to nothing")))?;
    let peer = (rt.peer)
        .block_on(TcpListener::bind(peer_addr))
        .map_err(|e| fatal(format!("peer listen {peer_addr}: {e}")))?;
    let http = (rt.io)
        .block_on(TcpListener::bind(o.http))
        .map_err(|e| fatal(format!("http listen {}: {e}", o.http)))?;
    let etcd = match o.etcd_listen {
        Some(addr) => Some(
            (rt.io)
                .block_on(TcpListener::bind(addr))
                .map_err(|e| fatal(format!("etcd API listen {addr}: {e}")))?,
        ),
        None => None,
    };
    Ok(Listeners { peer, http, etcd })
}

/// The transport's settings: the address book starts with `--peers` and `--peer-http`.
fn transport_config(opts: &NodeOptions, tls: Option<PeerTls>, log: &Logger) -> TransportConfig {
    TransportConfig {
        my_id: opts.id,
        started_with: opts.peers.clone(),
        members: Arc::new(RwLock::new(founding_members(opts))),
        peer_delay_ms: Arc::new(opts.peer_delay_ms.into()),
        peer_delay_in_ms: Arc::default(),
        blocked: Arc::new(RwLock::new(HashSet::new())),
        metrics: Arc::new(crate::base::metrics::Metrics::default()),
        logger: log.clone(),
        tls,
        peer_budget: Budget::new(opts.max_message_bytes() as u64 + (64 << 20)),
        max_message_bytes: opts.max_message_bytes(),
        heard: Arc::default(),
        views: None,
        snapshots: None,
    }
}

/// The opened data dir, with the lease clock and the promise record read from it before the
/// node exists.
struct Boot {
    /// Group `g`'s store at `g`.
    storages: Vec<DiskStorage>,
    /// The state engine.
    state: crate::disk::state_engine::StateEngine,
    /// This boot's incarnation.
    incarnation: u32,
    clock: Arc<ScaledClock>,
    promise: Arc<PromiseRecord>,
}

/// Open the data dir and its promise record; the record is raised durably to this run's
/// promise before anything can promise it.
fn boot(opts: &NodeOptions, log: &Logger) -> Result<Boot, Exit> {
    let opened = crate::disk::marker::open_data_dir(
        &opts.data_dir,
        &opts.cluster_id,
        opts.id,
        bootstrap(opts).as_ref(),
        opts.log_engine,
        opts.groups,
    )?;
    // Only shared liveness counts incarnations; a dir made before there was a choice has none.
    let shared = opts.liveness == raft_lease::multi::LivenessMode::Shared;
    let incarnation = crate::disk::incarnation::next(&opts.data_dir, opened.initialized && shared)?;
    let clock = Arc::new(ScaledClock::new());
    let promise = PromiseRecord::open(
        &opts.data_dir,
        promise_ms(opts),
        opened.initialized,
        &clock,
        log,
    )?;
    Ok(Boot {
        storages: opened.storages,
        state: opened.state,
        incarnation,
        clock,
        promise: Arc::new(promise),
    })
}

/// Everything a running node is made of, apart from the raft loop itself.
struct Running {
    app: Arc<App>,
    stop_tx: watch::Sender<bool>,
    stop: Arc<AtomicBool>,
}

/// Wire the raft loop, the transport and the HTTP side, and start the I/O tasks.
fn start(
    args: &NodeArgs,
    opts: NodeOptions,
    boot: Boot,
    runtimes: &Runtimes,
    log: &Logger,
) -> Result<(RaftLoop<KvState>, Running), Exit> {
    let rt = &runtimes.io;
    let tls = peer_tls(args, log)?;
    let http_tls = match (&args.http_cert, &args.http_key) {
        (Some(c), Some(k)) => Some(crate::tls::config::http_acceptor(c, k).map_err(config)?),
        _ => None,
    };
    let listeners = bind(runtimes, &opts)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(fatal)?;
    }
    let mut tcfg = transport_config(&opts, tls, log);
    // Snapshots stream beside the raft messages: views described to raft, sent by the
    // transport; streams received, written into the state engine off the raft thread.
    let boot_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let views = Arc::new(crate::peer::snapshot_send::SnapshotViews::new(
        opts.id, boot_ns,
    ));
    tcfg.views = Some(views.clone());
    let target = crate::state::kv_install::StateSnapshots {
        engine: boot.state.clone(),
    };
    // A state within the quota streams in less than twice its logical bytes; four times leaves
    // room for a quota lowered since the state grew.
    let max_stream_bytes = opts.quota_backend_bytes.saturating_mul(4) + (256 << 20);
    tcfg.snapshots = Some(Arc::new(crate::peer::snapshot_recv::SnapshotInbox::new(
        Arc::new(target),
        max_stream_bytes,
        log.clone(),
    )));
    let disk_stall = Arc::new(crate::base::disk_stall::DiskStall::default());
    let (metrics, members) = (tcfg.metrics.clone(), tcfg.members.clone());
    let (inbox_tx, inbox) = crossbeam_channel::bounded(8192);
    let (reports_tx, reports) = crossbeam_channel::bounded(8192);
    let reports_tx = (!opts.no_transport_reports).then_some(reports_tx);
    let transport = Transport::new(&tcfg, runtimes.peer.handle(), reports_tx);
    let (stop_tx, stop_rx) = watch::channel(false);
    runtimes.peer.spawn(crate::peer::listen::listen(
        listeners.peer,
        inbox_tx,
        tcfg.clone(),
        stop_rx.clone(),
    ));
    let (raft, lease) = configs(&opts, boot.promise.found.prior_ms());
    let multi = raft_lease::multi::MultiConfig {
        node_id: opts.id,
        incarnation: boot.incarnation,
        mode: opts.liveness,
        raft,
        lease,
        tick_ms: opts.tick_ms,
        quiesce_after_ticks: quiesce_after_ticks(&opts),
        seed: opts.id ^ u64::from(boot.incarnation).rotate_left(32),
    };
    let wiring = Wiring {
        storages: boot.storages,
        state: boot.state,
        views,
        multi,
        transport,
        inbox,
        reports,
        members,
        clock: boot.clock.clone(),
        stop: stop.clone(),
        metrics: metrics.clone(),
        disk_stall: disk_stall.clone(),
    };
    let cfg = LoopConfig {
        tick_ms: opts.tick_ms,
        snapshot_every: opts.snapshot_every,
        max_batch: 1024,
        queue_len: 4096,
        admission_checks: !opts.no_admission_checks,
        balance_leaders: opts.balance_leaders,
        follower_leases: opts.follower_leases_ms.is_some(),
        unsafe_cut_past_durable: opts.unsafe_cut_past_durable,
    };
    let (raft_loop, groups) = RaftLoop::open(cfg, wiring, log.clone()).map_err(fatal)?;
    let app = Arc::new(App {
        groups,
        inflight: Budget::new(opts.max_inflight_bytes),
        conns: ConnTable::new(
            args.http_limits.max_connections,
            args.http_limits.max_connections_per_ip,
        ),
        limits: args.http_limits.clone(),
        metrics,
        blocked: tcfg.blocked.clone(),
        disk_stall,
        peer_delay_ms: tcfg.peer_delay_ms.clone(),
        peer_delay_in_ms: tcfg.peer_delay_in_ms.clone(),
        heard: tcfg.heard.clone(),
        scheme: if http_tls.is_some() { "https" } else { "http" },
        peer_tls: tcfg.tls.clone(),
        promise: boot.promise.clone(),
        opts,
    });
    boot.promise
        .lower_when_due(boot.clock, stop.clone(), log.clone());
    if let Some(listener) = listeners.etcd {
        let tls = etcd_tls(args)?;
        let (app, stop_rx, log) = (app.clone(), stop_rx.clone(), log.clone());
        rt.spawn(async move {
            if let Err(e) =
                crate::etcd::serve::serve(app, listener, tls, stop_rx, log.clone()).await
            {
                slog::error!(log, "etcd API stopped"; "error" => e);
            }
        });
    }
    rt.spawn(crate::http::server::serve(
        listeners.http,
        http_tls,
        app.clone(),
        stop_rx,
        log.clone(),
    ));
    Ok((raft_loop, Running { app, stop_tx, stop }))
}

/// The etcd API's TLS: the HTTP certificate and key, and the peer CA for forwarding to the
/// other nodes' (their certificates are the cluster CA's, as `kv certs` makes them).
fn etcd_tls(args: &NodeArgs) -> Result<Option<crate::etcd::serve::EtcdTls>, Exit> {
    let (Some(cert), Some(key)) = (&args.http_cert, &args.http_key) else {
        return Ok(None);
    };
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| config(format!("{}: {e}", p.display())));
    let ca_pem = match &args.peer_ca {
        Some(ca) => read(ca)?,
        None => read(cert)?,
    };
    Ok(Some(crate::etcd::serve::EtcdTls {
        cert_pem: read(cert)?,
        key_pem: read(key)?,
        ca_pem,
    }))
}

/// Run a node until it is stopped.
pub fn run(args: &NodeArgs, root: &Logger) -> Result<(), Exit> {
    let mut opts = args.options().map_err(config)?;
    let log = root.new(o!("node" => opts.id));
    if opts.unsafe_lease_based {
        warn!(log, "!!! --unsafe-lease-based: raft-rs LeaseBased reads can be STALE. For demonstrations only. !!!");
    }
    if opts.unsafe_count_own_promise {
        for _ in 0..3 {
            warn!(log, "!!! --unsafe-count-own-promise: the leader counts its own promise, not its followers', \
                        and a restart forgets a longer earlier promise. Nodes with different --election-ms \
                        serve STALE reads. Negative control for tests only. !!!");
        }
    }
    preflight(args)?; // what `kv cluster` checks before its banner, checked the same way here
    if opts.unsafe_apply_to_commit {
        for _ in 0..3 {
            warn!(log, "!!! --unsafe-apply-to-commit: replicas apply up to raft's commit, not the exposed index: \
                        followers serve STALE local reads. Negative control for tests only. !!!");
        }
    }
    if opts.unsafe_cut_past_durable {
        for _ in 0..3 {
            warn!(log, "!!! --unsafe-cut-past-durable: the raft log is cut past what the state engine made durable: \
                        a crash can LOSE acknowledged writes. Negative control for tests only. !!!");
        }
    }
    if let Some(g) = opts.follower_leases_ms {
        warn!(log, "--follower-leases-ms {g}: follower read leases are EXPERIMENTAL"; "max_grant_ms" => g);
    }
    if opts.unsafe_keepalive_without_lease {
        warn!(log, "!!! --unsafe-keepalive-without-lease: a deposed leader can keep sessions alive past the new leader's expiry. For demonstrations only. !!!");
    }
    let fds = args.http_limits.max_connections + crate::base::limits::peer::MAX_PENDING + 256;
    crate::base::limits::ensure_open_files(fds as u64).map_err(config)?;
    let boot = boot(&opts, &log)?;
    opts.log_engine = Some(boot.storages[0].engine()); // the dir's, shown by /status
                                                       // A file-size limit (or a full disk) must be a storage error, not a silent kill.
                                                       // SAFETY: ignoring a signal has no preconditions.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let rt = Runtimes {
        io: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.http_threads.max(1))
            .thread_name("kv-io")
            .enable_all()
            .build()
            .map_err(fatal)?,
        peer: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(PEER_THREADS)
            .thread_name("kv-peer")
            .enable_all()
            .build()
            .map_err(fatal)?,
    };
    let (raft_loop, running) = start(args, opts.clone(), boot, &rt, &log)?;
    if let Some(join) = opts.join.clone() {
        let (app, stop, log) = (running.app.clone(), running.stop.clone(), log.clone());
        std::thread::spawn(move || crate::cli::join::run(app, join, stop, log));
    }
    info!(log, "node up"; "http" => %opts.http, "peer" => &opts.peers[&opts.id], "data_dir" => %opts.data_dir.display(),
          "peer_tls" => !opts.insecure_peers, "join" => ?opts.join,
          "log_engine" => ?opts.log_engine.map(|e| e.name()));
    let result = raft_loop.run(); // returns on SIGTERM/SIGINT or a fatal storage error
    stop(rt, running);
    match result {
        Ok(()) => {
            info!(log, "node stopped");
            Ok(())
        }
        Err(e) => Err(fatal(format!("storage failed: {e}"))),
    }
}

/// The node's async runtimes. Peer I/O (raft messages, heartbeats, snapshot chunks) runs on a
/// runtime of its own, so that clients (a scan of a whole keyspace, thousands of connections)
/// never hold the threads that carry the messages the leases live on.
struct Runtimes {
    /// HTTP, etcd's API and their forwarding.
    io: tokio::runtime::Runtime,
    /// The peer transport and listener.
    peer: tokio::runtime::Runtime,
}

/// Worker threads of the peer runtime.
const PEER_THREADS: usize = 1;

/// Stop the I/O side: accept loops at once, connections after the request in hand.
fn stop(rt: Runtimes, running: Running) {
    running.stop.store(true, Ordering::Relaxed);
    let _ = running.stop_tx.send(true);
    let deadline = Instant::now() + Duration::from_secs(2);
    while running.app.conns.len() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5)); // polls a condition, with a deadline
    }
    rt.io.shutdown_timeout(Duration::from_millis(200));
    rt.peer.shutdown_timeout(Duration::from_millis(200));
}
