//! A snapshot's state streamed to a peer from a thread of its own, chunk by chunk, on the log
//! lane of its connection and within its bounds, then the `MsgSnapshot` that names it (see
//! `snapshot_send`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use raft::eraftpb::MessageType;
use raft_lease::multi::{wire, GroupId, NodeBatch};
use slog::{warn, Logger};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::base::metrics::Metrics;
use crate::peer::express::PeerConn;
use crate::peer::outgoing::{report_lost, untake, Outgoing, Reports};
use crate::peer::snapshot_send::SnapshotViews;
use crate::peer::snapshot_wire::{descriptor_id, machine_part, Chunk, CHUNK_BYTES};

/// The `MsgSnapshot`s of `batch` that carry a descriptor (their state is streamed before them),
/// taken out of it.
pub fn take_described_snapshots(batch: &mut NodeBatch) -> Vec<(GroupId, raft::eraftpb::Message)> {
    let described = |m: &raft::eraftpb::Message| {
        m.get_msg_type() == MessageType::MsgSnapshot
            && machine_part(&m.get_snapshot().data)
                .and_then(descriptor_id)
                .is_some()
    };
    if !batch.raft.iter().any(|(_, m)| described(m)) {
        return Vec::new();
    }
    let (snaps, rest) = std::mem::take(&mut batch.raft)
        .into_iter()
        .partition(|(_, m)| described(m));
    batch.raft = rest;
    snaps
}

/// A peer's log lane, as a snapshot's streaming thread sends on it.
struct Lane {
    queue: mpsc::Sender<Outgoing>,
    conn: Arc<PeerConn>,
    metrics: Arc<Metrics>,
    /// The connection's failures when the stream began: one more, and chunks were lost.
    failures: u64,
}

/// Bytes a snapshot's stream keeps queued on its lane at most (it waits for the rest).
const STREAM_QUEUED_BYTES: usize = 8 << 20;

impl Lane {
    /// Queue the stream of `src` as chunks of snapshot `id` of `group` from `from` to `to`,
    /// the last an empty one.
    fn stream(
        &self,
        src: Box<dyn crate::peer::snapshot_send::StreamSource>,
        (from, to, group, id): (u64, u64, GroupId, u64),
    ) -> Result<(), String> {
        let mut seq = 0u32;
        let mut chunk = |bytes: Vec<u8>, last: bool| {
            let c = Chunk {
                from,
                to,
                group,
                id,
                seq,
                last,
                bytes,
            };
            seq += 1;
            self.push(Outgoing {
                bytes: c.encode(),
                raft: Vec::new(),
                to,
                queued_at: Instant::now(),
            })
        };
        // A piece of the stream may pass the chunk size by a row: cut it to size.
        src.stream(CHUNK_BYTES, &mut |bytes| {
            bytes
                .chunks(CHUNK_BYTES)
                .try_for_each(|piece| chunk(piece.to_vec(), false))
        })?;
        chunk(Vec::new(), true)
    }

    /// Queue `out`, waiting while the lane holds [`STREAM_QUEUED_BYTES`] or its queue is full;
    /// an error once the lane is gone.
    fn push(&self, out: Outgoing) -> Result<(), String> {
        let failed = || self.conn.failures.load(Ordering::Acquire) != self.failures;
        while self.conn.queued_bytes.load(Ordering::Acquire) > STREAM_QUEUED_BYTES {
            if self.queue.is_closed() || failed() {
                return Err("the peer's connection failed while the snapshot streamed".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if failed() {
            return Err("the peer's connection failed while the snapshot streamed".into());
        }
        let len = out.bytes.len();
        self.conn.unwritten.fetch_add(1, Ordering::AcqRel);
        self.conn.queued_bytes.fetch_add(len, Ordering::AcqRel);
        self.metrics.peer_queued_bytes.add(len as u64);
        self.queue.blocking_send(out).map_err(|e| {
            untake(&self.conn, &self.metrics, &e.0);
            "the peer's lane is gone".to_string()
        })
    }
}

/// Stream the snapshot `m` of `group` names (its view in `views`) from `from` to its peer on
/// `lane` (the peer's log lane; `None`: none can be had), chunk by chunk, from a thread of its
/// own, then `m` itself; it is reported lost if the view is gone or the lane fails, and
/// delivered once `m` is flushed (as any snapshot).
#[allow(clippy::too_many_arguments)]
pub fn stream_snapshot(
    from: u64,
    group: GroupId,
    m: raft::eraftpb::Message,
    views: Arc<SnapshotViews>,
    lane: Option<(mpsc::Sender<Outgoing>, Arc<PeerConn>)>,
    reports: Reports,
    metrics: Arc<Metrics>,
    logger: Logger,
) {
    let to = m.to;
    let id = machine_part(&m.get_snapshot().data).and_then(descriptor_id);
    let last = Outgoing {
        bytes: wire::encode(&NodeBatch {
            from,
            to,
            raft: vec![(group, m)],
            ..NodeBatch::default()
        }),
        raft: vec![(group, MessageType::MsgSnapshot)],
        to,
        queued_at: Instant::now(),
    };
    let (Some(id), Some((queue, conn))) = (id, lane) else {
        return report_lost(&reports, &metrics, &last);
    };
    std::thread::spawn(move || {
        let failures = conn.failures.load(Ordering::Acquire);
        let lane = Lane {
            queue,
            conn,
            metrics: metrics.clone(),
            failures,
        };
        let streamed = views
            .take(id)
            .ok_or_else(|| "its view is gone".to_string())
            .and_then(|src| lane.stream(src, (from, to, group, id)));
        let sent = streamed.and_then(|()| lane.push(last.flush_request_with(last.bytes.clone())));
        if let Err(why) = sent {
            warn!(logger, "snapshot stream failed"; "group" => group, "peer" => to, "error" => why);
            report_lost(&reports, &metrics, &last);
        }
    });
}
