//! Peer transport, sending side: one node batch per pass to each peer (the support session, the
//! fortification messages and every group's raft messages, `raft_lease::multi::wire`), split
//! over two connections per peer, its lanes (mutual TLS unless `--insecure-peers`), as frames
//! (see `frame`): the log (appends, their answers and snapshots, in order) on one, everything
//! else on the other, so that heartbeats and the support session never wait behind a snapshot.
//!
//! Each lane has a sender task with a queue bounded in batches and in bytes: the raft thread
//! never blocks on a slow or dead peer, and a peer that accepts nothing holds a bounded amount
//! of memory. A message that is not delivered is **reported** to the raft thread: a snapshot as
//! failed (raft-rs otherwise waits for it forever, sending that peer nothing but heartbeats), an
//! append as unreachable (raft then probes instead of streaming). A message counts as lost when
//! its queue is full, the peer is cut off by fault injection, the connection cannot be made, or a
//! frame makes no progress for [`FRAME_TIMEOUT`]; a snapshot counts as delivered once its frames
//! are flushed. Connections reconnect with backoff; a connection to an address that does not prove
//! it is that peer is dropped. Peers are found in the replicated address book, so nodes added
//! later are reached too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use raft::eraftpb::MessageType;
use raft_lease::multi::{wire, GroupId, NodeBatch};
use slog::{debug, error, info, warn, Logger};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::{timeout, Instant};

use crate::base::budget::Budget;
use crate::base::metrics::Metrics;
use crate::peer::dial::{dial, DialError, PeerStream};
use crate::peer::express::{writer_over, Express, PeerConn, PeerWriter};
use crate::peer::frame::{write_message, FrameError};
use crate::peer::heard::Heard;
use crate::peer::members::Members;
use crate::tls::config::PeerTls;

/// Batches queued per peer before new ones are dropped.
const QUEUE_LEN: usize = 4096;
/// Batches written per flush at most.
const BATCH: usize = 256;
/// A frame (at most 1 MiB) or a flush that makes no progress for this long fails the connection.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(2);
pub use crate::peer::dial::HANDSHAKE_TIMEOUT;

/// Peers cut off by fault injection: an id alone cuts both directions; `id | ONLY_OUT` drops
/// only what this node sends to it, `id | ONLY_IN` only what it receives from it.
pub type Blocked = Arc<RwLock<HashSet<u64>>>;
/// In [`Blocked`]: only messages to the peer are dropped.
pub const ONLY_OUT: u64 = 1 << 62;
/// In [`Blocked`]: only messages from the peer are dropped.
pub const ONLY_IN: u64 = 1 << 61;

/// Whether messages from (`inbound`) or to peer `id` are dropped.
pub fn cut(blocked: &Blocked, id: u64, inbound: bool) -> bool {
    let b = blocked.read();
    b.contains(&id) || b.contains(&(id | if inbound { ONLY_IN } else { ONLY_OUT }))
}

/// What the transport tells the raft thread about messages it could not deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// A snapshot of group `group` to `to` was flushed (`delivered`) or lost.
    Snapshot {
        /// The group.
        group: GroupId,
        /// The peer.
        to: u64,
        /// Whether all its frames were flushed.
        delivered: bool,
    },
    /// A message of group `group` to `to` (an append) was lost.
    Unreachable {
        /// The group.
        group: GroupId,
        /// The peer.
        to: u64,
    },
}

/// A batch queued for a peer: its bytes, and what raft must hear of if it is lost.
struct Outgoing {
    /// The encoded batch (empty: only flush what the express path left buffered).
    bytes: Vec<u8>,
    /// The group and type of each raft message in it.
    raft: Vec<(GroupId, MessageType)>,
    to: u64,
    queued_at: Instant,
}

impl Outgoing {
    /// A request to the sender task to flush what the express path left buffered of `self`: it
    /// carries `self`'s raft messages, so that they are reported lost if the flush fails.
    fn flush_request(&self) -> Outgoing {
        Outgoing {
            bytes: Vec::new(),
            raft: self.raft.clone(),
            to: self.to,
            queued_at: self.queued_at,
        }
    }
}

/// Settings shared by the transport's tasks and the peer listener.
#[derive(Clone)]
pub struct TransportConfig {
    /// This node's raft id.
    pub my_id: u64,
    /// The peers this node was started with (`--peers`): used until the address book knows them.
    pub started_with: BTreeMap<u64, String>,
    /// The replicated address book.
    pub members: Arc<RwLock<Members>>,
    /// Extra one-way delay on every outgoing message, in ms (a cross-zone network on one
    /// machine; `/admin/delay` changes it).
    pub peer_delay_ms: Arc<AtomicU64>,
    /// Extra delay on every incoming peer message before the raft thread gets it, in ms (one
    /// slow link into this node; `/admin/delay` with `"direction": "in"` changes it).
    pub peer_delay_in_ms: Arc<AtomicU64>,
    /// Peers cut off by fault injection.
    pub blocked: Blocked,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Where to log.
    pub logger: Logger,
    /// Mutual TLS; `None` with `--insecure-peers`.
    pub tls: Option<PeerTls>,
    /// Bytes received from peers and not yet stepped (see `listen`).
    pub peer_budget: Arc<Budget>,
    /// The largest message accepted from a peer.
    pub max_message_bytes: usize,
    /// When each peer's last admitted message arrived (the listener records it).
    pub heard: Arc<Heard>,
}

impl TransportConfig {
    /// Where peer `id` listens: the address book's entry, else the one it was started with.
    pub fn addr_of(&self, id: u64) -> Option<String> {
        let book = self.members.read();
        book.addrs
            .get(&id)
            .map(|a| a.peer.clone())
            .or_else(|| self.started_with.get(&id).cloned())
    }
}

/// A peer's queue to its sender task, and its connection (see `express`). Each peer has two
/// lanes: the log (appends, their answers, snapshots), and everything else (heartbeats, votes,
/// the support session, fortification), which never waits behind a snapshot on a slow or stuck
/// connection.
struct Peer {
    queue: mpsc::Sender<Outgoing>,
    conn: Arc<PeerConn>,
}

/// The sending side, owned by the raft thread.
pub struct Transport {
    /// By peer and lane (`true`: the log).
    queues: HashMap<(u64, bool), Peer>,
    cfg: TransportConfig,
    rt: tokio::runtime::Handle,
    reports: Reports,
}

/// Where reports go; `None` only for the tests' control (`--no-transport-reports`).
type Reports = Option<crossbeam_channel::Sender<Report>>;

impl Transport {
    /// A transport whose sender tasks run on `rt` and report to `reports`.
    pub fn new(cfg: &TransportConfig, rt: &tokio::runtime::Handle, reports: Reports) -> Transport {
        Transport {
            queues: HashMap::new(),
            cfg: cfg.clone(),
            rt: rt.clone(),
            reports,
        }
    }

    /// Queue `batch` for its peer. Never blocks; a batch that cannot be queued is reported.
    /// The log (appends, their answers, snapshots) travels on one lane, in order; everything
    /// else (heartbeats, votes, the support session, fortification) on the other, so it never
    /// waits behind a snapshot, and an append never overtakes the snapshot it follows.
    pub fn send(&mut self, batch: NodeBatch) {
        batch
            .raft
            .iter()
            .for_each(|(_, m)| self.cfg.metrics.sent(m.get_msg_type()));
        self.cfg.metrics.batches_sent.inc();
        self.cfg.metrics.peer_messages_sent.add(batch.len() as u64);
        let (log, rest) = split_lanes(batch);
        for (part, log_lane) in [(rest, false), (log, true)] {
            if !part.is_empty() {
                self.send_lane(part, log_lane);
            }
        }
    }

    /// Queue `batch` on one lane of its peer (see [`Transport::send`]).
    fn send_lane(&mut self, batch: NodeBatch, log_lane: bool) {
        let raft: Vec<(GroupId, MessageType)> = batch
            .raft
            .iter()
            .map(|(g, m)| (*g, m.get_msg_type()))
            .collect();
        let to = batch.to;
        let out = Outgoing {
            bytes: Vec::new(),
            raft,
            to,
            queued_at: Instant::now(),
        };
        if cut(&self.cfg.blocked, to, false) {
            return report_lost(&self.reports, &self.cfg.metrics, &out);
        }
        let delayed = self.cfg.peer_delay_ms.load(Ordering::Relaxed) > 0;
        let metrics = self.cfg.metrics.clone();
        let rt = self.rt.clone();
        let snapshot = out.raft.iter().any(|(_, t)| *t == MessageType::MsgSnapshot);
        let max_queued = self.max_queued_bytes();
        let Some(peer) = self.queue(to, log_lane) else {
            return report_lost(&self.reports, &metrics, &out);
        };
        let out = Outgoing {
            bytes: wire::encode(&batch),
            ..out
        };
        let flush_only = match delayed || snapshot {
            true => None,
            false => {
                let _runtime = rt.enter();
                match peer.conn.try_write(&out.bytes) {
                    Express::Sent => return metrics.express_sent.inc(),
                    Express::Buffered => Some(out.flush_request()),
                    Express::Declined => None,
                    Express::Failed(e) => {
                        metrics.peer_write_failures.inc();
                        warn!(self.cfg.logger, "peer connection failed; reconnecting";
                              "peer" => to, "error" => %e, "lost" => 1);
                        return report_lost(&self.reports, &metrics, &out);
                    }
                }
            }
        };
        if flush_only.is_some() {
            metrics.express_sent.inc();
        }
        let queued = flush_only.unwrap_or(out);
        let len = queued.bytes.len();
        if peer.conn.queued_bytes.load(Ordering::Acquire) + len > max_queued {
            metrics.dropped_full.inc();
            return report_lost(&self.reports, &metrics, &queued);
        }
        peer.conn.unwritten.fetch_add(1, Ordering::AcqRel);
        peer.conn.queued_bytes.fetch_add(len, Ordering::AcqRel);
        metrics.peer_queued_bytes.add(len as u64);
        if let Err(TrySendError::Full(out) | TrySendError::Closed(out)) =
            peer.queue.try_send(queued)
        {
            untake(&peer.conn, &metrics, &out);
            metrics.dropped_full.inc();
            report_lost(&self.reports, &metrics, &out);
        }
    }

    /// The most bytes queued for one lane of one peer: the largest message and 64 MiB more. A
    /// batch beyond is dropped and reported lost (raft sends again).
    fn max_queued_bytes(&self) -> usize {
        self.cfg.max_message_bytes + (64 << 20)
    }

    /// The queue of peer `to`'s lane (the log, or the other), its sender task started on first
    /// use.
    fn queue(&mut self, to: u64, log_lane: bool) -> Option<&Peer> {
        if to == self.cfg.my_id {
            return None;
        }
        let lane = (to, log_lane);
        if !self.queues.contains_key(&lane) {
            self.cfg.addr_of(to)?;
            let (tx, rx) = mpsc::channel(QUEUE_LEN);
            let reports = self.reports.clone();
            let conn = Arc::new(PeerConn::default());
            let task = send_loop(to, rx, conn.clone(), self.cfg.clone(), reports);
            self.rt.spawn(task);
            self.queues.insert(lane, Peer { queue: tx, conn });
        }
        self.queues.get(&lane)
    }
}

/// `batch` split in two: the log (appends, their answers and snapshots, in their order), and
/// the rest (heartbeats, votes, the support session, fortification).
fn split_lanes(mut batch: NodeBatch) -> (NodeBatch, NodeBatch) {
    use MessageType::{MsgAppend, MsgAppendResponse, MsgSnapshot};
    let is_log = |t| matches!(t, MsgAppend | MsgAppendResponse | MsgSnapshot);
    let (log, rest) = std::mem::take(&mut batch.raft)
        .into_iter()
        .partition(|(_, m)| is_log(m.get_msg_type()));
    batch.raft = rest;
    let log = NodeBatch {
        from: batch.from,
        to: batch.to,
        raft: log,
        ..NodeBatch::default()
    };
    (log, batch)
}

/// `out` has left its lane's queue: its bytes no longer count.
fn untake(conn: &PeerConn, metrics: &Metrics, out: &Outgoing) {
    conn.unwritten.fetch_sub(1, Ordering::AcqRel);
    conn.queued_bytes
        .fetch_sub(out.bytes.len(), Ordering::AcqRel);
    metrics.peer_queued_bytes.sub(out.bytes.len() as u64);
}

/// Tell the raft thread that the raft messages of `out` were lost.
fn report_lost(reports: &Reports, metrics: &Metrics, out: &Outgoing) {
    for &(group, t) in &out.raft {
        let report = match t {
            MessageType::MsgSnapshot => {
                metrics.snapshots_lost.inc();
                Report::Snapshot {
                    group,
                    to: out.to,
                    delivered: false,
                }
            }
            MessageType::MsgAppend => Report::Unreachable { group, to: out.to },
            _ => continue,
        };
        send_report(reports, report);
    }
}

fn send_report(reports: &Reports, r: Report) {
    if let Some(tx) = reports {
        let _ = tx.try_send(r);
    }
}

async fn send_loop(
    peer: u64,
    mut rx: mpsc::Receiver<Outgoing>,
    shared: Arc<PeerConn>,
    cfg: TransportConfig,
    reports: Reports,
) {
    let log = cfg.logger.new(slog::o!("peer" => peer));
    let mut backoff = Duration::from_millis(20);
    // The last dial failure logged: a new one is logged once, a repeat only at debug level.
    let mut failing: Option<DialError> = None;
    while let Some(out) = rx.recv().await {
        let delay = Duration::from_millis(cfg.peer_delay_ms.load(Ordering::Relaxed));
        if !delay.is_zero() {
            tokio::time::sleep_until(out.queued_at + delay).await; // the timer's 1 ms grain otherwise
        }
        let mut conn = shared.writer.lock().await;
        if conn.is_none() {
            match connect(peer, &cfg).await {
                Ok(w) => {
                    info!(log, "connected to peer"; "tls" => cfg.tls.is_some());
                    *conn = Some(writer_over(w));
                    backoff = Duration::from_millis(20);
                    failing = None;
                }
                Err(e) => {
                    log_dial_failure(&log, &e, &mut failing, backoff);
                    // Everything queued now is stale by the time a connection is made: it
                    // is reported lost (raft sends again), so that fresh heartbeats and
                    // support messages never wait behind it once the peer answers.
                    cfg.metrics.peer_queue_drained.inc();
                    let mut lost = Some(out);
                    while let Some(o) = lost.take().or_else(|| rx.try_recv().ok()) {
                        report_lost(&reports, &cfg.metrics, &o);
                        untake(&shared, &cfg.metrics, &o);
                    }
                    drop(conn);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let mut batch = vec![out];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let w = conn.as_mut().expect("connected");
        if let Err(e) = write_batch(w, &batch, &reports, &cfg.metrics).await {
            cfg.metrics.peer_write_failures.inc();
            warn!(log, "peer connection failed; reconnecting"; "error" => %e, "lost" => batch.len());
            *conn = None;
        }
        // Written (or reported lost) with the lock held: the raft thread may write after them.
        batch.iter().for_each(|o| untake(&shared, &cfg.metrics, o));
    }
}

/// Write `batch` and flush, each frame within [`FRAME_TIMEOUT`]. A batch with a snapshot is
/// flushed on its own and its snapshots reported delivered; on failure, everything not yet
/// reported is reported lost.
async fn write_batch(
    w: &mut PeerWriter,
    batch: &[Outgoing],
    reports: &Reports,
    metrics: &Metrics,
) -> Result<(), FrameError> {
    let mut unflushed = 0;
    for (i, out) in batch.iter().enumerate() {
        if out.bytes.is_empty() {
            continue; // a flush request: the flush below does it
        }
        let mut written = write_message(w, &out.bytes, FRAME_TIMEOUT).await;
        let snapshots = out
            .raft
            .iter()
            .filter(|(_, t)| *t == MessageType::MsgSnapshot);
        let snapshot = snapshots.clone().next().is_some();
        if written.is_ok() && snapshot {
            written = flush(w).await;
        }
        if let Err(e) = written {
            batch[unflushed..]
                .iter()
                .for_each(|out| report_lost(reports, metrics, out));
            return Err(e);
        }
        for &(group, _) in snapshots {
            metrics.snapshots_delivered.inc();
            let delivered = Report::Snapshot {
                group,
                to: out.to,
                delivered: true,
            };
            send_report(reports, delivered);
            unflushed = i + 1;
        }
    }
    if let Err(e) = flush(w).await {
        batch[unflushed..]
            .iter()
            .for_each(|out| report_lost(reports, metrics, out));
        return Err(e);
    }
    Ok(())
}

async fn flush(w: &mut PeerWriter) -> Result<(), FrameError> {
    match timeout(FRAME_TIMEOUT, w.flush()).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(FrameError::Stalled),
    }
}

/// Log a dial failure: once at warning level when it is new (an untrusted certificate at error
/// level, with what to check), then at debug level while it repeats.
fn log_dial_failure(
    log: &Logger,
    e: &DialError,
    failing: &mut Option<DialError>,
    backoff: Duration,
) {
    let backoff_ms = backoff.as_millis();
    if failing.as_ref() == Some(e) {
        debug!(log, "peer unreachable; dropping batch"; "error" => %e, "backoff_ms" => backoff_ms);
        return;
    }
    match e {
        DialError::Unreachable(_) => {
            warn!(log, "peer unreachable; dropping its messages until it answers"; "error" => %e)
        }
        DialError::Untrusted(_) => {
            error!(log, "peer refused: certificates do not match"; "error" => e.explain())
        }
    }
    *failing = Some(e.clone());
}

async fn connect(peer: u64, cfg: &TransportConfig) -> Result<PeerStream, DialError> {
    let addr = cfg
        .addr_of(peer)
        .ok_or_else(|| DialError::Unreachable("no address".into()))?;
    dial(peer, &addr, cfg.tls.as_ref()).await
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod transport_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_way_cut_drops_one_direction_only() {
        let b: Blocked = Arc::default();
        assert!(!cut(&b, 2, true) && !cut(&b, 2, false));
        b.write().insert(2 | ONLY_OUT);
        assert!(cut(&b, 2, false), "to 2 dropped");
        assert!(!cut(&b, 2, true), "from 2 delivered");
        assert!(!cut(&b, 3, false));
        b.write().insert(3 | ONLY_IN);
        assert!(cut(&b, 3, true) && !cut(&b, 3, false));
        b.write().insert(4);
        assert!(cut(&b, 4, true) && cut(&b, 4, false), "both ways");
    }
}
