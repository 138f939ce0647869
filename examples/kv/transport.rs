//! Peer transport, sending side: raft messages to each peer over one connection (mutual TLS
//! unless `--insecure-peers`), as frames (see `frame`).
//!
//! Each peer has a sender task with a bounded queue: the raft thread never blocks on a slow or
//! dead peer (a full queue drops the message; raft retransmits). Connections reconnect with
//! backoff; a connection to an address that does not prove it is that peer is dropped.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use raft::eraftpb::Message;
use slog::{debug, info, warn, Logger};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::{timeout, Instant};

use crate::frame::write_message;
use crate::limits::HANDSHAKE_TIMEOUT;
use crate::metrics::Metrics;
use crate::tls::{peer_node_id, PeerTls};

/// Messages queued per peer before new ones are dropped.
const QUEUE_LEN: usize = 4096;
/// A write that makes no progress for this long fails the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Peers cut off by fault injection (both directions).
pub type Blocked = Arc<RwLock<HashSet<u64>>>;

struct Outgoing {
    msg: Message,
    queued_at: Instant,
}

/// Settings shared by the transport's tasks.
#[derive(Clone)]
pub struct TransportConfig {
    pub my_id: u64,
    pub peers: BTreeMap<u64, SocketAddr>,
    /// Extra one-way delay on every outgoing message (a cross-zone network on one machine).
    pub peer_delay: Duration,
    pub blocked: Blocked,
    pub metrics: Arc<Metrics>,
    pub logger: Logger,
    /// Mutual TLS; `None` with `--insecure-peers`.
    pub tls: Option<PeerTls>,
}

/// The sending side, owned by the raft thread.
pub struct Transport {
    queues: BTreeMap<u64, mpsc::Sender<Outgoing>>,
    blocked: Blocked,
    metrics: Arc<Metrics>,
}

type PeerWriter = BufWriter<Box<dyn AsyncWrite + Send + Unpin>>;

impl Transport {
    /// Start a sender task per peer on `rt`.
    pub fn start(cfg: &TransportConfig, rt: &tokio::runtime::Handle) -> Transport {
        let mut queues = BTreeMap::new();
        for (&id, &addr) in cfg.peers.iter().filter(|(id, _)| **id != cfg.my_id) {
            let (tx, rx) = mpsc::channel(QUEUE_LEN);
            rt.spawn(send_loop(id, addr, rx, cfg.clone()));
            queues.insert(id, tx);
        }
        Transport {
            queues,
            blocked: cfg.blocked.clone(),
            metrics: cfg.metrics.clone(),
        }
    }

    /// Queue `msg` for its peer. Never blocks.
    pub fn send(&self, msg: Message) {
        self.metrics.sent(msg.get_msg_type());
        if self.blocked.read().contains(&msg.to) {
            return;
        }
        let Some(q) = self.queues.get(&msg.to) else {
            return;
        };
        let out = Outgoing {
            msg,
            queued_at: Instant::now(),
        };
        if let Err(TrySendError::Full(_)) = q.try_send(out) {
            self.metrics.dropped_full.inc();
        }
    }
}

async fn send_loop(
    peer: u64,
    addr: SocketAddr,
    mut rx: mpsc::Receiver<Outgoing>,
    cfg: TransportConfig,
) {
    let log = cfg
        .logger
        .new(slog::o!("peer" => peer, "addr" => addr.to_string()));
    let mut conn: Option<PeerWriter> = None;
    let mut backoff = Duration::from_millis(20);
    while let Some(out) = rx.recv().await {
        tokio::time::sleep_until(out.queued_at + cfg.peer_delay).await;
        if conn.is_none() {
            match connect(peer, addr, &cfg).await {
                Ok(w) => {
                    info!(log, "connected to peer"; "tls" => cfg.tls.is_some());
                    conn = Some(BufWriter::new(w));
                    backoff = Duration::from_millis(20);
                }
                Err(e) => {
                    debug!(log, "peer unreachable; dropping message"; "error" => %e, "backoff_ms" => backoff.as_millis());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let w = conn.as_mut().expect("connected");
        let written = timeout(WRITE_TIMEOUT, write_batch(w, out.msg, &mut rx)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(log, "peer connection failed; reconnecting"; "error" => %e);
                conn = None;
            }
            Err(_) => {
                warn!(log, "peer write timed out; reconnecting");
                conn = None;
            }
        }
    }
}

/// Write `first` and whatever else is queued now, then flush once.
async fn write_batch(
    w: &mut PeerWriter,
    first: Message,
    rx: &mut mpsc::Receiver<Outgoing>,
) -> Result<(), crate::frame::FrameError> {
    write_message(w, &first).await?;
    while let Ok(more) = rx.try_recv() {
        write_message(w, &more.msg).await?;
    }
    w.flush().await?;
    Ok(())
}

async fn connect(
    peer: u64,
    addr: SocketAddr,
    cfg: &TransportConfig,
) -> Result<Box<dyn AsyncWrite + Send + Unpin>, String> {
    let tcp = timeout(Duration::from_millis(500), TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &cfg.tls else {
        return Ok(Box::new(tcp));
    };
    let stream = timeout(
        HANDSHAKE_TIMEOUT,
        tls.connector.connect(PeerTls::server_name(peer), tcp),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_string())?
    .map_err(|e| format!("TLS handshake: {e}"))?;
    // rustls checked the chain and the name; check the id once more, strictly.
    match peer_node_id(stream.get_ref().1) {
        Some(id) if id == peer => Ok(Box::new(stream)),
        other => Err(format!(
            "peer at {addr} presented node {other:?}, expected {peer}"
        )),
    }
}
