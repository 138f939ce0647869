//! A lane's sender task: it takes the lane's queued batches, connects (and reconnects with
//! backoff), writes them as frames, flushes, and reports what it could not deliver.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use raft::eraftpb::MessageType;
use slog::{debug, error, info, warn, Logger};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::base::metrics::Metrics;
use crate::peer::dial::{dial, DialError, PeerStream};
use crate::peer::express::{writer_over, PeerConn, PeerWriter};
use crate::peer::frame::{write_message, FrameError};
use crate::peer::outgoing::{report_lost, send_report, untake, Outgoing, Report, Reports};
use crate::peer::peer_config::TransportConfig;

/// Batches written per flush at most.
const BATCH: usize = 256;
/// A frame (at most 1 MiB) or a flush that makes no progress for this long fails the connection.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(2);

/// Send what comes on `rx` to `peer`, until the queue closes.
pub async fn send_loop(
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
                    shared.failures.fetch_add(1, Ordering::AcqRel);
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
            shared.failures.fetch_add(1, Ordering::AcqRel);
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
