//! Peer transport, receiving side: accept peer connections, authenticate them (mutual TLS), and
//! deliver the raft messages they carry to the raft thread's inbox.
//!
//! A message is dropped (and counted) unless it is addressed to this node, comes from a known
//! peer, names the same sender as the certificate of the connection it came on, and is of a
//! type peers send each other (never a proposal or a node-local message). Connections are
//! bounded in number, in number per peer, and in idle time; frames are bounded in size.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use raft::eraftpb::{Message, MessageType};
use slog::{info, warn, Logger};
use tokio::io::{AsyncRead, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

use crate::frame::read_message;
use crate::limits::{peer, HANDSHAKE_TIMEOUT};
use crate::tls::peer_node_id;
use crate::transport::TransportConfig;

/// Open inbound connections per authenticated peer id.
type PerPeer = Arc<Mutex<HashMap<u64, usize>>>;

/// A place in the per-peer count, freed on drop.
struct PeerSlot(PerPeer, u64);

impl PeerSlot {
    fn take(per_peer: &PerPeer, id: u64) -> Option<PeerSlot> {
        let mut m = per_peer.lock();
        let n = m.entry(id).or_default();
        if *n >= peer::MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot(per_peer.clone(), id))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some(n) = self.0.lock().get_mut(&self.1) {
            *n -= 1;
        }
    }
}

/// Why a decoded message was dropped.
#[derive(Debug, PartialEq, Eq)]
pub enum Reject {
    /// Not for this node, or from no known peer.
    Misaddressed,
    /// `from` is not the id in the connection's certificate.
    Spoofed { claimed: u64, cert: u64 },
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

/// Whether `msg`, received on a connection authenticated as `cert_id`, may reach raft.
pub fn check(msg: &Message, cert_id: Option<u64>, cfg: &TransportConfig) -> Result<(), Reject> {
    if msg.to != cfg.my_id || msg.from == cfg.my_id || !cfg.peers.contains_key(&msg.from) {
        return Err(Reject::Misaddressed);
    }
    if let Some(cert) = cert_id.filter(|&c| c != msg.from) {
        return Err(Reject::Spoofed {
            claimed: msg.from,
            cert,
        });
    }
    if !peer_type(msg.get_msg_type()) {
        return Err(Reject::Type(msg.get_msg_type()));
    }
    Ok(())
}

/// Accept peer connections until the runtime is shut down.
pub async fn listen(
    listener: TcpListener,
    inbox: crossbeam_channel::Sender<Message>,
    cfg: TransportConfig,
) {
    let open = Arc::new(Semaphore::new(peer::MAX_CONNECTIONS));
    let per_peer: PerPeer = Arc::default();
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                warn!(cfg.logger, "peer accept failed; retrying"; "error" => %e);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            cfg.metrics.peer_refused.inc();
            continue;
        };
        let (inbox, cfg, per_peer) = (inbox.clone(), cfg.clone(), per_peer.clone());
        tokio::spawn(async move {
            connection(tcp, inbox, &cfg, per_peer).await;
            drop(permit);
        });
    }
}

async fn connection(
    tcp: TcpStream,
    inbox: crossbeam_channel::Sender<Message>,
    cfg: &TransportConfig,
    per_peer: PerPeer,
) {
    let remote = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let log = cfg.logger.new(slog::o!("remote" => remote));
    let Some(tls) = &cfg.tls else {
        return recv_loop(tcp, None, inbox, cfg, &log).await;
    };
    let stream = match timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            cfg.metrics.peer_tls_failures.inc();
            warn!(log, "peer TLS handshake failed; closed"; "error" => %e);
            return;
        }
        Err(_) => {
            cfg.metrics.peer_tls_failures.inc();
            warn!(log, "peer TLS handshake timed out; closed");
            return;
        }
    };
    let cert_id = peer_node_id(stream.get_ref().1);
    let Some(id) = cert_id.filter(|id| cfg.peers.contains_key(id) && *id != cfg.my_id) else {
        cfg.metrics.peer_tls_failures.inc();
        warn!(log, "peer certificate names no other member; closed"; "cert_id" => ?cert_id);
        return;
    };
    let Some(_slot) = PeerSlot::take(&per_peer, id) else {
        cfg.metrics.peer_refused.inc();
        warn!(log, "too many connections from this peer; closed"; "peer" => id);
        return;
    };
    info!(log, "peer connected"; "peer" => id);
    recv_loop(stream, Some(id), inbox, cfg, &log).await
}

async fn recv_loop<R: AsyncRead + Unpin>(
    r: R,
    cert_id: Option<u64>,
    inbox: crossbeam_channel::Sender<Message>,
    cfg: &TransportConfig,
    log: &Logger,
) {
    let mut r = BufReader::new(r);
    let mut warned = false;
    loop {
        let msg = match timeout(
            peer::IDLE_TIMEOUT,
            read_message(&mut r, peer::MAX_MESSAGE_BYTES),
        )
        .await
        {
            Err(_) | Ok(Ok(None)) => return, // idle or closed
            Ok(Err(e)) => {
                cfg.metrics.bad_frames.inc();
                warn!(log, "bad frame on a peer socket; closing it"; "error" => %e);
                return;
            }
            Ok(Ok(Some(m))) => m,
        };
        if let Err(reject) = check(&msg, cert_id, cfg) {
            match reject {
                Reject::Spoofed { .. } => cfg.metrics.peer_spoofed.inc(),
                Reject::Type(_) => cfg.metrics.peer_refused_types.inc(),
                Reject::Misaddressed => cfg.metrics.bad_frames.inc(),
            }
            if !std::mem::replace(&mut warned, true) {
                warn!(log, "peer message dropped"; "reason" => ?reject, "from" => msg.from, "to" => msg.to);
            }
            continue;
        }
        cfg.metrics.received(msg.get_msg_type());
        if cfg.blocked.read().contains(&msg.from) {
            continue;
        }
        if inbox.try_send(msg).is_err() {
            cfg.metrics.dropped_full.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TransportConfig {
        TransportConfig {
            my_id: 1,
            peers: [
                (1, "127.0.0.1:1".parse().unwrap()),
                (2, "127.0.0.1:2".parse().unwrap()),
                (3, "127.0.0.1:3".parse().unwrap()),
            ]
            .into(),
            peer_delay: std::time::Duration::ZERO,
            blocked: Arc::default(),
            metrics: Arc::default(),
            logger: Logger::root(slog::Discard, slog::o!()),
            tls: None,
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
    }
}
