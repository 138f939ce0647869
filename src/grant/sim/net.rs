//! The simulated transport between clients and the grantor: delay, loss, and links that block.

use std::collections::BTreeMap;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::grant::server::{ClientId, Grant};
use crate::grant::session::SessionId;

/// A client's request to the grantor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Req {
    /// Acquire or renew the lease for `term_ms`.
    Lease { term_ms: u64 },
    /// Give the lease back.
    Release,
    /// Start a session.
    Session { ttl_ms: u64 },
    /// Keep a session alive.
    KeepAlive { sid: SessionId, ttl_ms: u64 },
    /// Take lock `L` for a session.
    Lock { sid: SessionId },
    /// Free lock `L`.
    Unlock { sid: SessionId },
}

/// The grantor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resp {
    /// To a lease request or a keep-alive (a session's "grant" carries its id as the token).
    Grant(Result<Grant, String>),
    /// To a session request.
    Session(Result<SessionId, String>),
    /// To a lock request: the fencing token.
    Lock(Result<u64, String>),
    /// To a release or an unlock: nothing to say.
    Done,
}

/// A message on the wire.
#[derive(Debug, Clone)]
pub(super) enum Packet {
    /// From client `client` (index), request `req_id`, sent as [`ClientId`] `from` (the client's
    /// id when it sent it: a later incarnation has another).
    ToGrantor {
        client: usize,
        from: ClientId,
        req_id: u64,
        req: Req,
    },
    /// The answer to `req_id`, to client `client`.
    ToClient {
        client: usize,
        req_id: u64,
        resp: Resp,
    },
}

impl Packet {
    fn client(&self) -> usize {
        match self {
            Packet::ToGrantor { client, .. } | Packet::ToClient { client, .. } => *client,
        }
    }
}

/// Messages in flight, by real delivery time.
pub(super) struct Net {
    /// (deliver_at_ns, sequence) → packet.
    queue: BTreeMap<(u64, u64), Packet>,
    seq: u64,
    /// Per client: its link delivers nothing before this real instant (a blocked transport).
    blocked_until_ns: Vec<u64>,
    /// Largest normal one-way delay, ns.
    max_delay_ns: u64,
    /// Chance that a message is lost, in parts per million.
    loss_ppm: u32,
}

impl Net {
    pub(super) fn new(clients: usize, max_delay_ns: u64, loss_ppm: u32) -> Self {
        Net {
            queue: BTreeMap::new(),
            seq: 0,
            blocked_until_ns: vec![0; clients],
            max_delay_ns,
            loss_ppm,
        }
    }

    /// Send at real time `now_ns`: lost, or delivered after a delay, and not before the link unblocks.
    pub(super) fn send(&mut self, p: Packet, now_ns: u64, rng: &mut ChaCha8Rng) {
        if rng.gen_range(0..1_000_000) < self.loss_ppm {
            return;
        }
        let delay_ns = rng.gen_range(0..=self.max_delay_ns);
        let at_ns = (now_ns + delay_ns).max(self.blocked_until_ns[p.client()] + delay_ns);
        self.seq += 1;
        self.queue.insert((at_ns, self.seq), p);
    }

    /// Block client `client`'s link in both directions until real time `until_ns`: what is sent
    /// meanwhile, and what is already in flight, arrives after that.
    pub(super) fn block(&mut self, client: usize, until_ns: u64) {
        let b = &mut self.blocked_until_ns[client];
        *b = (*b).max(until_ns);
        let held: Vec<(u64, u64)> = self
            .queue
            .iter()
            .filter(|(k, p)| p.client() == client && k.0 < until_ns)
            .map(|(k, _)| *k)
            .collect();
        for k in held {
            let p = self.queue.remove(&k).expect("listed");
            self.queue.insert((until_ns + (k.0 % 1_000_000), k.1), p);
        }
    }

    /// Messages due by real time `now_ns`, in delivery order.
    pub(super) fn due(&mut self, now_ns: u64) -> Vec<Packet> {
        let later = self.queue.split_off(&(now_ns + 1, 0));
        let due = std::mem::replace(&mut self.queue, later);
        due.into_values().collect()
    }
}
