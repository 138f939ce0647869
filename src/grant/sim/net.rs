//! The simulated transport between clients and the grantor: delay, loss, duplicates that arrive
//! seconds late, and links that block.

use std::collections::BTreeMap;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::grant::event::TransportError;
use crate::grant::server::{ClientId, Grant};
use crate::grant::session::{SessionError, SessionId};

/// A client's request to the grantor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Req {
    /// Acquire the lease for `term_ms`.
    Acquire { term_ms: u64 },
    /// Renew the holding `token` for `term_ms`.
    Renew { token: u64, term_ms: u64 },
    /// Give back the holding `token`.
    Release { token: u64 },
    /// Start a session.
    Session { ttl_ms: u64 },
    /// Keep a session alive.
    KeepAlive { sid: SessionId, ttl_ms: u64 },
    /// Take lock `L` for a session.
    Lock { sid: SessionId },
    /// Free lock `L`, held under `token`.
    Unlock { sid: SessionId, token: u64 },
}

/// The grantor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Resp {
    /// To a lease request or a keep-alive (a session's "grant" carries its id as the token).
    Grant(Result<Grant, TransportError>),
    /// To a session request.
    Session(Result<SessionId, SessionError>),
    /// To a lock request: the fencing token.
    Lock(Result<u64, SessionError>),
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
    /// Chance that a message is delivered twice, in parts per million.
    dup_ppm: u32,
    /// How late a duplicate may arrive, at most, ns after it was sent.
    dup_late_ns: u64,
    /// Chance that a message is slow (overtaken by later ones), in parts per million.
    slow_ppm: u32,
    /// How late a slow message may arrive, at most, ns after it was sent.
    slow_late_ns: u64,
}

/// How a [`Net`] delays, loses and duplicates.
#[derive(Debug, Clone, Copy)]
pub(super) struct NetFaults {
    pub(super) max_delay_ns: u64,
    pub(super) loss_ppm: u32,
    pub(super) dup_ppm: u32,
    pub(super) dup_late_ns: u64,
    pub(super) slow_ppm: u32,
    pub(super) slow_late_ns: u64,
}

impl Net {
    pub(super) fn new(clients: usize, faults: NetFaults) -> Self {
        Net {
            queue: BTreeMap::new(),
            seq: 0,
            blocked_until_ns: vec![0; clients],
            max_delay_ns: faults.max_delay_ns,
            loss_ppm: faults.loss_ppm,
            dup_ppm: faults.dup_ppm,
            dup_late_ns: faults.dup_late_ns,
            slow_ppm: faults.slow_ppm,
            slow_late_ns: faults.slow_late_ns,
        }
    }

    /// Send at real time `now_ns`: lost, or delivered after a delay (sometimes a long one, so
    /// that later messages overtake it), and not before the link unblocks; sometimes also a
    /// second copy, up to `dup_late_ns` late (a retransmission, or a request a proxy retried).
    pub(super) fn send(&mut self, p: Packet, now_ns: u64, rng: &mut ChaCha8Rng) {
        if rng.gen_range(0..1_000_000) < self.dup_ppm {
            let late_ns = rng.gen_range(0..=self.dup_late_ns);
            self.enqueue(p.clone(), now_ns, late_ns);
        }
        if rng.gen_range(0..1_000_000) < self.loss_ppm {
            return;
        }
        let delay_ns = if rng.gen_range(0..1_000_000) < self.slow_ppm {
            rng.gen_range(0..=self.slow_late_ns)
        } else {
            rng.gen_range(0..=self.max_delay_ns)
        };
        self.enqueue(p, now_ns, delay_ns);
    }

    fn enqueue(&mut self, p: Packet, now_ns: u64, delay_ns: u64) {
        let from_ns = now_ns.max(self.blocked_until_ns[p.client()]);
        self.seq += 1;
        self.queue.insert((from_ns + delay_ns, self.seq), p);
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
