//! Peer transport, receiving side: accept peer connections, authenticate them (mutual TLS), and
//! deliver the node batches they carry to the raft thread's inbox.
//!
//! Until a connection has authenticated (its TLS handshake done, or with `--insecure-peers` its
//! first message read) it holds a place in a small table of pending handshakes, at most
//! [`peer::MAX_PENDING_PER_IP`] from one address and [`peer::MAX_PENDING`] in all, for at most
//! `HANDSHAKE_TIMEOUT`. A newcomer over a limit closes the pending connection that matters least
//! (one that has sent nothing, oldest first; see `base::conns`), never itself: idle sockets opened by
//! anyone who reaches the port cannot keep members from connecting. An authenticated connection
//! takes one of [`peer::MAX_CONNECTIONS_PER_PEER`] places of its member instead; a member that
//! connects again with every place taken closes its own oldest connection (see `slots`).
//!
//! A batch is dropped (and counted) unless it is addressed to this node, comes from a member in
//! the address book (or one this node was started with) that was not removed, and names the same
//! sender as the certificate of the connection it came on; a raft message in it is dropped unless
//! it names the batch's sender and receiver and is of a type peers send each other (never a
//! proposal or a node-local message). Frames are bounded in size, and the bytes of
//! messages being received or waiting for the raft thread in the peer byte budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use raft::eraftpb::{Message, MessageType};
use raft_lease::multi::NodeBatch;
use slog::{info, warn, Logger};
use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::timeout;

use crate::base::budget::Ticket;
use crate::base::conns::{Admission, ConnTable, Guard, Phase};
use crate::base::limits::peer;
use crate::peer::frame::{read_message, FrameError, PeerMessage};
use crate::peer::slots::{PeerSlot, PerPeer};
use crate::peer::snapshot_wire::{descriptor_id, machine_part, Chunk};
use crate::peer::transport::{TransportConfig, HANDSHAKE_TIMEOUT};
use crate::tls::config::peer_node_id;

/// Why a decoded message was dropped.
#[derive(Debug, PartialEq, Eq)]
pub enum Reject {
    /// Not for this node, or from no member.
    Misaddressed,
    /// `from` is not the id in the connection's certificate.
    Spoofed {
        /// The sender the message names.
        claimed: u64,
        /// The id in the certificate.
        cert: u64,
    },
    /// A type peers never send each other.
    Type(MessageType),
}

/// Message types that travel between peers. Proposals are never forwarded in this KV (only the
/// leader proposes) and the rest are node-local.
fn peer_type(t: MessageType) -> bool {
    use MessageType::*;
    !matches!(
        t,
        MsgHup | MsgBeat | MsgPropose | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum
    )
}

/// Whether a batch from `from` to `to`, received on a connection authenticated as `cert_id`,
/// may reach the node.
pub fn check_sender(
    from: u64,
    to: u64,
    cert_id: Option<u64>,
    cfg: &TransportConfig,
) -> Result<(), Reject> {
    let member = cfg.members.read().accepts(from, &cfg.started_with);
    if to != cfg.my_id || from == cfg.my_id || !member {
        return Err(Reject::Misaddressed);
    }
    if let Some(cert) = cert_id.filter(|&c| c != from) {
        return Err(Reject::Spoofed {
            claimed: from,
            cert,
        });
    }
    Ok(())
}

/// Whether `msg`, received on a connection authenticated as `cert_id`, may reach raft.
pub fn check(msg: &Message, cert_id: Option<u64>, cfg: &TransportConfig) -> Result<(), Reject> {
    check_sender(msg.from, msg.to, cert_id, cfg)?;
    if !peer_type(msg.get_msg_type()) {
        return Err(Reject::Type(msg.get_msg_type()));
    }
    Ok(())
}

/// `batch` with every raft message that may not reach raft taken out; `Err` if the batch itself
/// may not reach the node, or carried nothing else. Every refusal is counted.
fn checked(
    mut batch: NodeBatch,
    cert_id: Option<u64>,
    cfg: &TransportConfig,
) -> Result<NodeBatch, Reject> {
    if let Err(r) = check_sender(batch.from, batch.to, cert_id, cfg) {
        count(&r, cfg);
        return Err(r);
    }
    let (from, to) = (batch.from, batch.to);
    let mut first = None;
    batch.raft.retain(|(_, m)| {
        let verdict = match (m.from, m.to) {
            (f, t) if f == from && t == to => check(m, cert_id, cfg),
            _ => Err(Reject::Misaddressed),
        };
        if let Err(r) = verdict {
            count(&r, cfg);
            first.get_or_insert(r);
            return false;
        }
        true
    });
    match first {
        // A batch that carried nothing else but a refused message is refused as it.
        Some(r) if batch.is_empty() => Err(r),
        _ => Ok(batch),
    }
}

fn count(reject: &Reject, cfg: &TransportConfig) {
    match reject {
        Reject::Spoofed { .. } => cfg.metrics.peer_spoofed.inc(),
        Reject::Type(_) => cfg.metrics.peer_refused_types.inc(),
        Reject::Misaddressed => cfg.metrics.bad_frames.inc(),
    }
}

/// What every connection task needs.
struct Ctx {
    inbox: crossbeam_channel::Sender<Inbound>,
    cfg: TransportConfig,
    per_peer: PerPeer,
    pending: Arc<ConnTable>,
}

/// Accept peer connections until `stop` changes.
pub async fn listen(
    listener: TcpListener,
    inbox: crossbeam_channel::Sender<Inbound>,
    cfg: TransportConfig,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(Ctx {
        inbox,
        cfg,
        per_peer: Arc::default(),
        pending: ConnTable::new(peer::MAX_PENDING, peer::MAX_PENDING_PER_IP),
    });
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                warn!(ctx.cfg.logger, "peer accept failed; retrying"; "error" => %e);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some((guard, admission)) = ctx.pending.admit(remote.ip()) else {
            ctx.cfg.metrics.peer_refused.inc();
            continue;
        };
        if let Admission::Evicted(_) = admission {
            ctx.cfg.metrics.peer_evicted.inc();
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let close = guard.slot.clone();
            tokio::select! {
                _ = connection(tcp, guard, &ctx) => {}
                _ = close.close.notified() => {}
            }
        });
    }
}

/// Authenticate the connection within the handshake timeout, then receive from it.
async fn connection(tcp: TcpStream, pending: Guard, ctx: &Ctx) {
    let _ = peer::tune(&tcp); // a dead inbound connection ends within seconds
    let remote = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let log = ctx.cfg.logger.new(slog::o!("remote" => remote));
    // A connection that sent a byte has started: it is closed after those that sent nothing.
    let started = async {
        let _ = tcp.readable().await;
        pending.set(Phase::Idle);
    };
    if timeout(HANDSHAKE_TIMEOUT, started).await.is_err() {
        return;
    }
    let Some(tls) = &ctx.cfg.tls else {
        return insecure(tcp, pending, ctx, &log).await;
    };
    let stream = match timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        failed => {
            ctx.cfg.metrics.peer_tls_failures.inc();
            let why = failed.map_or("timed out".to_string(), |r| {
                r.err().map(|e| e.to_string()).unwrap_or_default()
            });
            warn!(log, "peer TLS handshake failed; closed"; "error" => why);
            return;
        }
    };
    let cert_id = peer_node_id(stream.get_ref().1);
    let member = |id: &u64| {
        *id != ctx.cfg.my_id && ctx.cfg.members.read().accepts(*id, &ctx.cfg.started_with)
    };
    let Some(id) = cert_id.filter(member) else {
        ctx.cfg.metrics.peer_tls_failures.inc();
        warn!(log, "peer certificate names no other member; closed"; "cert_id" => ?cert_id);
        return;
    };
    drop(pending); // authenticated: it no longer counts as a pending handshake
    let slot = PeerSlot::take(&ctx.per_peer, id);
    info!(log, "peer connected"; "peer" => id);
    let conn = recv_loop(BufReader::new(stream), Some(id), ctx, &log);
    slot.serve(conn, &ctx.cfg.metrics).await
}

/// `--insecure-peers`: the first message names the peer (nothing proves it).
async fn insecure(tcp: TcpStream, pending: Guard, ctx: &Ctx, log: &Logger) {
    let mut r = BufReader::new(tcp);
    let budget = &ctx.cfg.peer_budget;
    let first = timeout(
        HANDSHAKE_TIMEOUT,
        read_message(&mut r, ctx.cfg.max_message_bytes, budget),
    )
    .await;
    let (msg, ticket) = match first {
        Ok(Ok(Some(m))) => m,
        Ok(Err(e)) => {
            ctx.cfg.metrics.bad_frames.inc();
            warn!(log, "bad frame on a peer socket; closing it"; "error" => %e);
            return;
        }
        _ => return,
    };
    drop(pending);
    let (from, to) = match &msg {
        PeerMessage::Batch(b) => (b.from, b.to),
        PeerMessage::Chunk(c) => (c.from, c.to),
    };
    // Only a member takes a member's place (nothing proves the claim here, but a stranger's
    // claim does not close anyone's connections).
    if let Err(r) = check_sender(from, to, None, &ctx.cfg) {
        count(&r, &ctx.cfg);
        return;
    }
    let slot = PeerSlot::take(&ctx.per_peer, from);
    match msg {
        PeerMessage::Batch(batch) => {
            let batch = gate_snapshots(batch, ctx, log).await;
            deliver(batch, ticket, None, ctx, log, &mut false)
        }
        PeerMessage::Chunk(c) => take_chunk(c, None, ctx, log).await,
    }
    slot.serve(recv_loop(r, None, ctx, log), &ctx.cfg.metrics)
        .await
}

/// A batch read off a connection and held back by the incoming delay (fault injection).
type HeldBatch = (tokio::time::Instant, NodeBatch, Ticket);

async fn recv_loop<R: AsyncRead + Unpin>(
    mut r: BufReader<R>,
    cert_id: Option<u64>,
    ctx: &Ctx,
    log: &Logger,
) {
    // Batches held back by `/admin/delay {"direction": "in"}` go through `held`, in order; with
    // no delay and nothing held, a batch is delivered at once.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<HeldBatch>();
    let held = std::sync::atomic::AtomicUsize::new(0);
    let holding = &held;
    let read = async move {
        let mut warned = false;
        loop {
            let read = read_message(&mut r, ctx.cfg.max_message_bytes, &ctx.cfg.peer_budget);
            // No idle timeout: a lane may be quiet for long (the log lane of an idle cluster),
            // and a dead peer's connection fails by keep-alive within seconds (`peer::tune`).
            let (msg, ticket) = match read.await {
                Ok(None) => return, // closed
                Err(FrameError::Io(e)) => {
                    info!(log, "peer connection ended"; "error" => %e);
                    return;
                }
                Err(e) => {
                    ctx.cfg.metrics.bad_frames.inc();
                    warn!(log, "bad frame on a peer socket; closing it"; "error" => %e);
                    return;
                }
                Ok(Some(m)) => m,
            };
            let batch = match msg {
                PeerMessage::Chunk(c) => {
                    take_chunk(c, cert_id, ctx, log).await;
                    continue;
                }
                PeerMessage::Batch(b) => gate_snapshots(b, ctx, log).await,
            };
            let delay_ms = ctx.cfg.peer_delay_in_ms.load(Ordering::Relaxed);
            if delay_ms == 0 && holding.load(Ordering::Acquire) == 0 {
                deliver(batch, ticket, cert_id, ctx, log, &mut warned);
                continue;
            }
            holding.fetch_add(1, Ordering::AcqRel);
            let _ = tx.send((tokio::time::Instant::now(), batch, ticket));
        }
    };
    let forward = async {
        let mut warned = false;
        while let Some((at, batch, ticket)) = rx.recv().await {
            let delay_ms = ctx.cfg.peer_delay_in_ms.load(Ordering::Relaxed);
            tokio::time::sleep_until(at + std::time::Duration::from_millis(delay_ms)).await;
            deliver(batch, ticket, cert_id, ctx, log, &mut warned);
            holding.fetch_sub(1, Ordering::AcqRel);
        }
    };
    tokio::join!(read, forward);
}

/// A chunk of a snapshot's stream, from a member to this node (and the member its connection's
/// certificate names), goes to the snapshot inbox; anything else is dropped and counted.
async fn take_chunk(c: Chunk, cert_id: Option<u64>, ctx: &Ctx, log: &Logger) {
    if let Err(r) = check_sender(c.from, c.to, cert_id, &ctx.cfg) {
        count(&r, &ctx.cfg);
        return;
    }
    match &ctx.cfg.snapshots {
        Some(inbox) => inbox.on_chunk(c).await,
        None => warn!(log, "a snapshot chunk for a node that takes none; dropped"),
    }
}

/// `batch` with each `MsgSnapshot` that carries a descriptor kept only once the state its
/// stream carried is sealed for the snapshot's index: raft never takes a snapshot the state
/// machine cannot install at once. A dropped one is sent again by its leader.
async fn gate_snapshots(mut batch: NodeBatch, ctx: &Ctx, log: &Logger) -> NodeBatch {
    let described = |m: &Message| {
        let snap = m.get_snapshot();
        let id = machine_part(&snap.data).and_then(descriptor_id)?;
        Some((id, snap.get_metadata().index))
    };
    let wanted: Vec<(usize, u64, u64, u64)> = batch
        .raft
        .iter()
        .enumerate()
        .filter(|(_, (_, m))| m.get_msg_type() == MessageType::MsgSnapshot)
        .filter_map(|(i, (g, m))| described(m).map(|(id, index)| (i, *g, id, index)))
        .collect();
    let mut refused = Vec::new();
    for (i, group, id, index) in wanted {
        let outcome = match &ctx.cfg.snapshots {
            Some(inbox) => inbox.outcome(batch.from, group, id).await,
            None => Err("this node takes no streamed snapshot".into()),
        };
        match outcome {
            Ok(sealed) if sealed == index => {}
            other => {
                warn!(log, "snapshot dropped: its state did not arrive whole";
                      "group" => group, "index" => index, "outcome" => ?other);
                ctx.cfg.metrics.snapshots_lost.inc();
                refused.push(i);
            }
        }
    }
    for i in refused.into_iter().rev() {
        batch.raft.remove(i);
    }
    batch
}

/// Check `batch` and hand what passes to the raft thread with its bytes' ticket.
fn deliver(
    batch: NodeBatch,
    ticket: Ticket,
    cert_id: Option<u64>,
    ctx: &Ctx,
    log: &Logger,
    warned: &mut bool,
) {
    let cfg = &ctx.cfg;
    let (from, to) = (batch.from, batch.to);
    let batch = match checked(batch, cert_id, cfg) {
        Ok(b) => b,
        Err(reject) => {
            if !std::mem::replace(warned, true) {
                warn!(log, "peer message dropped"; "reason" => ?reject, "from" => from, "to" => to);
            }
            return;
        }
    };
    batch
        .raft
        .iter()
        .for_each(|(_, m)| cfg.metrics.received(m.get_msg_type()));
    if crate::peer::transport::cut(&cfg.blocked, from, true) {
        return;
    }
    cfg.heard.record(from);
    let inbound = Inbound {
        batch,
        ticket: Some(ticket),
        received_at: std::time::Instant::now(),
    };
    if ctx.inbox.try_send(inbound).is_err() {
        cfg.metrics.dropped_full.inc();
    }
}

/// A peer's batch and the bytes it holds in the peer budget until it is stepped.
pub struct Inbound {
    /// The batch.
    pub batch: NodeBatch,
    /// Its bytes in the peer budget.
    pub ticket: Option<Ticket>,
    /// When it was read off the connection.
    pub received_at: std::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TransportConfig {
        TransportConfig {
            my_id: 1,
            started_with: [
                (1, "127.0.0.1:1".to_string()),
                (2, "127.0.0.1:2".to_string()),
                (3, "127.0.0.1:3".to_string()),
            ]
            .into(),
            members: Arc::default(),
            peer_delay_ms: Arc::default(),
            peer_delay_in_ms: Arc::default(),
            blocked: Arc::default(),
            metrics: Arc::default(),
            logger: Logger::root(slog::Discard, slog::o!()),
            tls: None,
            peer_budget: crate::base::budget::Budget::new(1 << 20),
            heard: Arc::default(),
            max_message_bytes: 1 << 20,
            views: None,
            snapshots: None,
        }
    }

    fn msg(from: u64, to: u64, t: MessageType) -> Message {
        let mut m = Message {
            from,
            to,
            ..Default::default()
        };
        m.set_msg_type(t);
        m
    }

    #[test]
    fn only_messages_from_the_certified_peer_of_peer_types_pass() {
        let c = cfg();
        let hb = MessageType::MsgHeartbeat;
        assert_eq!(check(&msg(2, 1, hb), Some(2), &c), Ok(()));
        assert_eq!(
            check(&msg(2, 1, hb), None, &c),
            Ok(()),
            "insecure: no certificate to check"
        );
        assert_eq!(
            check(&msg(2, 1, hb), Some(3), &c),
            Err(Reject::Spoofed {
                claimed: 2,
                cert: 3
            })
        );
        assert_eq!(
            check(&msg(2, 5, hb), Some(2), &c),
            Err(Reject::Misaddressed)
        );
        assert_eq!(
            check(&msg(9, 1, hb), Some(9), &c),
            Err(Reject::Misaddressed)
        );
        assert_eq!(check(&msg(1, 1, hb), None, &c), Err(Reject::Misaddressed));
        let prop = MessageType::MsgPropose;
        assert_eq!(
            check(&msg(2, 1, prop), Some(2), &c),
            Err(Reject::Type(prop))
        );
        for t in [
            MessageType::MsgAppendResponse,
            MessageType::MsgTimeoutNow,
            MessageType::MsgSnapshot,
        ] {
            assert_eq!(check(&msg(3, 1, t), Some(3), &c), Ok(()));
        }
        // A removed member is refused; a member added later is accepted.
        c.members.write().removed.insert(3);
        assert_eq!(
            check(&msg(3, 1, hb), Some(3), &c),
            Err(Reject::Misaddressed)
        );
        c.members.write().addrs.insert(
            9,
            crate::peer::members::Addrs {
                peer: "127.0.0.1:9".into(),
                http: None,
                etcd: None,
            },
        );
        assert_eq!(check(&msg(9, 1, hb), Some(9), &c), Ok(()));
    }

    #[test]
    fn heartbeat_acknowledgements_pass_whatever_their_context() {
        let c = cfg();
        for ctx in crate::peer::ack_contexts::ack_contexts() {
            let mut m = msg(2, 1, MessageType::MsgHeartbeatResponse);
            m.context = ctx.into();
            assert_eq!(check(&m, Some(2), &c), Ok(()));
        }
    }
}
