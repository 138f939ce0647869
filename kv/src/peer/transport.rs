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
//! frame makes no progress for `send_loop::FRAME_TIMEOUT`; a snapshot counts as delivered once its frames
//! are flushed. Connections reconnect with backoff; a connection to an address that does not prove
//! it is that peer is dropped. Peers are found in the replicated address book, so nodes added
//! later are reached too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use raft::eraftpb::MessageType;
use raft_lease::multi::{wire, GroupId, NodeBatch};
use slog::warn;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;

use crate::peer::express::{Express, PeerConn};
pub use crate::peer::outgoing::Report;
use crate::peer::outgoing::{report_lost, untake, Outgoing, Reports};
pub use crate::peer::peer_config::{Blocked, TransportConfig};
use crate::peer::send_loop::send_loop;
use crate::peer::snapshot_send::SnapshotViews;
use crate::peer::stream_out::{stream_snapshot, take_described_snapshots};

/// Batches queued per peer before new ones are dropped.
const QUEUE_LEN: usize = 4096;
pub use crate::peer::dial::HANDSHAKE_TIMEOUT;

/// In [`Blocked`]: only messages to the peer are dropped.
pub const ONLY_OUT: u64 = 1 << 62;
/// In [`Blocked`]: only messages from the peer are dropped.
pub const ONLY_IN: u64 = 1 << 61;

/// Whether messages from (`inbound`) or to peer `id` are dropped.
pub fn cut(blocked: &Blocked, id: u64, inbound: bool) -> bool {
    let b = blocked.read();
    b.contains(&id) || b.contains(&(id | if inbound { ONLY_IN } else { ONLY_OUT }))
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
    pub fn send(&mut self, mut batch: NodeBatch) {
        batch
            .raft
            .iter()
            .for_each(|(_, m)| self.cfg.metrics.sent(m.get_msg_type()));
        self.cfg.metrics.batches_sent.inc();
        self.cfg.metrics.peer_messages_sent.add(batch.len() as u64);
        if let Some(views) = self.cfg.views.clone() {
            for (group, m) in take_described_snapshots(&mut batch) {
                self.stream_snapshot(group, m, views.clone());
            }
        }
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
                        peer.conn.failures.fetch_add(1, Ordering::AcqRel);
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

    /// Stream the snapshot `m` of `group` names to its peer (see `stream_out`).
    fn stream_snapshot(
        &mut self,
        group: GroupId,
        m: raft::eraftpb::Message,
        views: Arc<SnapshotViews>,
    ) {
        let to = m.to;
        let lane = match cut(&self.cfg.blocked, to, false) {
            true => None,
            false => self
                .queue(to, true)
                .map(|p| (p.queue.clone(), p.conn.clone())),
        };
        let (reports, metrics) = (self.reports.clone(), self.cfg.metrics.clone());
        let (from, logger) = (self.cfg.my_id, self.cfg.logger.clone());
        stream_snapshot(from, group, m, views, lane, reports, metrics, logger);
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
