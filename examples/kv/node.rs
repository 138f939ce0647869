//! `kv node`: check the options and the data dir, set up TLS, start the I/O runtime (HTTP and
//! peers on tokio) and run the raft thread until SIGTERM/SIGINT or a fatal error.
//!
//! Exit codes: 0 stopped by a signal; 1 a fatal error (storage failure, a port in use);
//! 2 bad options or TLS files; 3 the data dir was refused (another node's, or its store missing,
//! empty or corrupt).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use slog::{info, o, warn, Logger};
use tokio::net::TcpListener;

use crate::args::NodeArgs;
use crate::limits::peer;
use crate::marker::DirError;
use crate::server::{Runtime, Wiring};
use crate::tls::PeerTls;
use crate::transport::{Transport, TransportConfig};

/// Why a node stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum Exit {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Dir(#[from] DirError),
    #[error("{0}")]
    Fatal(String),
}

impl Exit {
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

/// Run a node until it is stopped.
pub fn run(args: &NodeArgs, root: &Logger) -> Result<(), Exit> {
    let opts = args.options().map_err(config)?;
    let log = root.new(o!("node" => opts.id));
    if opts.unsafe_lease_based {
        warn!(log, "!!! --unsafe-lease-based: raft-rs LeaseBased reads can be STALE. For demonstrations only. !!!");
    }
    let tls = peer_tls(args, &log)?;
    let http_tls = match (&args.http_cert, &args.http_key) {
        (Some(c), Some(k)) => Some(crate::tls::http_acceptor(c, k).map_err(config)?),
        _ => None,
    };
    let fds = args.http_limits.max_connections + peer::MAX_CONNECTIONS + 64;
    crate::limits::ensure_open_files(fds as u64).map_err(config)?;
    let voters: Vec<u64> = opts.peers.keys().copied().collect();
    let storage = crate::marker::open_data_dir(&opts.data_dir, &opts.cluster_id, opts.id, &voters)?;
    // A file-size limit (or a full disk) must be a storage error, not a silent kill.
    // SAFETY: ignoring a signal has no preconditions.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(fatal)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.http_threads.max(1))
        .thread_name("kv-io")
        .enable_all()
        .build()
        .map_err(fatal)?;
    let peer_addr = opts.peers[&opts.id];
    let peer_listener = rt
        .block_on(TcpListener::bind(peer_addr))
        .map_err(|e| fatal(format!("peer listen {peer_addr}: {e}")))?;
    let http_listener = rt
        .block_on(TcpListener::bind(opts.http))
        .map_err(|e| fatal(format!("http listen {}: {e}", opts.http)))?;
    let blocked = Arc::new(RwLock::new(HashSet::new()));
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let tcfg = TransportConfig {
        my_id: opts.id,
        peers: opts.peers.clone(),
        peer_delay: Duration::from_millis(opts.peer_delay_ms),
        blocked: blocked.clone(),
        metrics: metrics.clone(),
        logger: log.clone(),
        tls,
    };
    let (inbox_tx, inbox) = crossbeam_channel::bounded(8192);
    let transport = Transport::start(&tcfg, rt.handle());
    rt.spawn(crate::peer_listen::listen(peer_listener, inbox_tx, tcfg));
    let wiring = Wiring {
        inbox,
        transport,
        blocked,
        metrics,
        stop: stop.clone(),
    };
    let (runtime, shared) =
        Runtime::open(opts.clone(), storage, wiring, log.clone()).map_err(fatal)?;
    let limits = Arc::new(args.http_limits.clone());
    rt.spawn(crate::http_server::serve(
        http_listener,
        http_tls,
        shared,
        limits,
        log.clone(),
    ));
    info!(log, "node up"; "http" => %opts.http, "peer" => %peer_addr, "data_dir" => %opts.data_dir.display(),
          "peer_tls" => !opts.insecure_peers, "https" => args.http_cert.is_some());
    let result = runtime.run(); // returns on SIGTERM/SIGINT or a fatal storage error
    stop.store(true, Ordering::Relaxed);
    rt.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(()) => {
            info!(log, "node stopped");
            Ok(())
        }
        Err(e) => Err(fatal(format!("storage failed: {e}"))),
    }
}
