//! What the transport's lanes carry and report: a batch queued for a peer, with the raft
//! messages it holds, and what the raft thread hears of messages that were not delivered.

use raft::eraftpb::MessageType;
use raft_lease::multi::GroupId;
use tokio::time::Instant;

use crate::base::metrics::Metrics;
use crate::peer::express::PeerConn;
use std::sync::atomic::Ordering;

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
pub struct Outgoing {
    /// The encoded batch (empty: only flush what the express path left buffered).
    pub bytes: Vec<u8>,
    /// The group and type of each raft message in it.
    pub raft: Vec<(GroupId, MessageType)>,
    /// The peer.
    pub to: u64,
    /// When it was queued.
    pub queued_at: Instant,
}

impl Outgoing {
    /// `self` with `bytes` (to queue a copy of it).
    pub fn flush_request_with(&self, bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            ..self.flush_request()
        }
    }

    /// A request to the sender task to flush what the express path left buffered of `self`: it
    /// carries `self`'s raft messages, so that they are reported lost if the flush fails.
    pub fn flush_request(&self) -> Outgoing {
        Outgoing {
            bytes: Vec::new(),
            raft: self.raft.clone(),
            to: self.to,
            queued_at: self.queued_at,
        }
    }
}

/// Where reports go; `None` only for the tests' control (`--no-transport-reports`).
pub type Reports = Option<crossbeam_channel::Sender<Report>>;

/// `out` has left its lane's queue: its bytes no longer count.
pub fn untake(conn: &PeerConn, metrics: &Metrics, out: &Outgoing) {
    conn.unwritten.fetch_sub(1, Ordering::AcqRel);
    conn.queued_bytes
        .fetch_sub(out.bytes.len(), Ordering::AcqRel);
    metrics.peer_queued_bytes.sub(out.bytes.len() as u64);
}

/// Tell the raft thread that the raft messages of `out` were lost.
pub fn report_lost(reports: &Reports, metrics: &Metrics, out: &Outgoing) {
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

pub fn send_report(reports: &Reports, r: Report) {
    if let Some(tx) = reports {
        let _ = tx.try_send(r);
    }
}
