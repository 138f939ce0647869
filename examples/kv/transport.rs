//! Peer transport: raft messages over TCP as length-prefixed protobuf, one connection per peer.
//!
//! Each peer has a sender thread with a bounded queue: the raft thread never blocks on a slow or
//! dead peer (a full queue drops the message; raft retransmits). Connections reconnect with
//! backoff. Garbage on a socket closes that connection with a logged error; the node runs on.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::Message;
use slog::{debug, info, warn, Logger};

use crate::metrics::Metrics;

/// Largest frame accepted: a snapshot of the whole store must fit.
pub const MAX_FRAME_BYTES: usize = 256 << 20;
/// Messages queued per peer before new ones are dropped.
const QUEUE_LEN: usize = 4096;

/// Peers cut off by fault injection (both directions).
pub type Blocked = Arc<RwLock<HashSet<u64>>>;

struct Outgoing {
    msg: Message,
    queued_at: Instant,
}

/// The sending side, owned by the raft thread.
pub struct Transport {
    queues: BTreeMap<u64, Sender<Outgoing>>,
    blocked: Blocked,
    metrics: Arc<Metrics>,
}

/// Settings shared by the transport's threads.
#[derive(Clone)]
pub struct TransportConfig {
    pub my_id: u64,
    pub peers: BTreeMap<u64, SocketAddr>,
    /// Extra one-way delay on every outgoing message (a cross-zone network on one machine).
    pub peer_delay: Duration,
    pub blocked: Blocked,
    pub metrics: Arc<Metrics>,
    pub logger: Logger,
    pub stop: Arc<AtomicBool>,
}

impl Transport {
    /// Start a sender thread per peer.
    pub fn start(cfg: &TransportConfig) -> Transport {
        let mut queues = BTreeMap::new();
        for (&id, &addr) in cfg.peers.iter().filter(|(id, _)| **id != cfg.my_id) {
            let (tx, rx) = bounded(QUEUE_LEN);
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name(format!("peer-send-{id}"))
                .spawn(move || send_loop(id, addr, rx, cfg))
                .expect("spawn a peer sender");
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
        match q.try_send(Outgoing {
            msg,
            queued_at: Instant::now(),
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.metrics.dropped_full.inc(),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn send_loop(peer: u64, addr: SocketAddr, rx: Receiver<Outgoing>, cfg: TransportConfig) {
    let log = cfg
        .logger
        .new(slog::o!("peer" => peer, "addr" => addr.to_string()));
    let mut conn: Option<BufWriter<TcpStream>> = None;
    let mut backoff = Duration::from_millis(20);
    while !cfg.stop.load(Ordering::Relaxed) {
        let Ok(out) = rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let due = out.queued_at + cfg.peer_delay;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if conn.is_none() {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                    info!(log, "connected to peer");
                    conn = Some(BufWriter::new(s));
                    backoff = Duration::from_millis(20);
                }
                Err(e) => {
                    debug!(log, "peer unreachable; dropping message"; "error" => %e, "backoff_ms" => backoff.as_millis());
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let w = conn.as_mut().expect("connected");
        let mut result = write_frame(w, &out.msg);
        // Write what else is queued now in the same flush.
        while result.is_ok() {
            match rx.try_recv() {
                Ok(more) => result = write_frame(w, &more.msg),
                Err(_) => break,
            }
        }
        if let Err(e) = result.and_then(|_| w.flush()) {
            warn!(log, "peer connection failed; reconnecting"; "error" => %e);
            conn = None;
        }
    }
}

fn write_frame(w: &mut impl Write, msg: &Message) -> std::io::Result<()> {
    let bytes = msg.write_to_bytes().map_err(std::io::Error::other)?;
    w.write_all(&(bytes.len() as u32).to_be_bytes())?;
    w.write_all(&bytes)
}

/// Accept peer connections and deliver their messages to `inbox`.
pub fn listen(listener: TcpListener, inbox: Sender<Message>, cfg: TransportConfig) {
    std::thread::Builder::new()
        .name("peer-accept".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if cfg.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (inbox, cfg) = (inbox.clone(), cfg.clone());
                let _ = std::thread::Builder::new()
                    .name("peer-recv".into())
                    .spawn(move || recv_loop(stream, inbox, cfg));
            }
        })
        .expect("spawn the peer listener");
}

fn recv_loop(stream: TcpStream, inbox: Sender<Message>, cfg: TransportConfig) {
    let remote = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let log = cfg.logger.new(slog::o!("remote" => remote));
    let mut r = BufReader::new(stream);
    loop {
        let msg = match read_frame(&mut r) {
            Ok(Some(m)) => m,
            Ok(None) => return, // closed
            Err(e) => {
                cfg.metrics.bad_frames.inc();
                warn!(log, "garbage on a peer socket; closing it"; "error" => %e);
                return;
            }
        };
        if msg.to != cfg.my_id || !cfg.peers.contains_key(&msg.from) || msg.from == cfg.my_id {
            cfg.metrics.bad_frames.inc();
            warn!(log, "message not for this node or from no known peer; dropped"; "from" => msg.from, "to" => msg.to);
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

/// Read one frame. `Ok(None)` on a clean close between frames.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Message>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes exceeds {MAX_FRAME_BYTES}"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Message::parse_from_bytes(&buf)
        .map(Some)
        .map_err(|e| std::io::Error::other(format!("bad protobuf: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_an_error() {
        let m = Message {
            from: 2,
            to: 1,
            ..Default::default()
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &m).unwrap();
        assert_eq!(read_frame(&mut &buf[..]).unwrap(), Some(m));
        assert!(
            read_frame(&mut &[0xff, 0xff, 0xff, 0xff][..]).is_err(),
            "too large"
        );
        assert!(
            read_frame(&mut &[0, 0, 0, 3, 0xff, 0xff, 0xff][..]).is_err(),
            "not protobuf"
        );
        assert_eq!(read_frame(&mut &[][..]).unwrap(), None, "clean close");
    }
}
