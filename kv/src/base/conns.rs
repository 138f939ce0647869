//! Connection tables: at most `max` connections, at most `max_per_ip` from one address. A
//! newcomer over either limit closes the connection that matters least, never itself:
//! 1. one that never started (no request, or no TLS byte, yet), oldest first;
//! 2. one idle between requests, least recently active first;
//! 3. one receiving a request body, slowest first (bytes per second since the body began);
//!
//! and a connection whose request is complete and waiting for its answer is never closed. So a
//! flood of idle or never-started connections cannot push out clients that use theirs, and a
//! flood of slow bodies loses to any client that sends its body at a normal rate. Only when every
//! candidate is waiting for an answer is the newcomer refused. The HTTP front end and the peer
//! port's TLS handshakes each have a table.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// Nothing received yet (or no request completed yet, and none in progress).
    Fresh = 0,
    /// Idle between requests, after at least one (or a handshake under way).
    Idle = 1,
    /// Receiving a request body.
    Body = 2,
    /// The request is complete and waits for its answer.
    Waiting = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Fresh,
            1 => Phase::Idle,
            2 => Phase::Body,
            _ => Phase::Waiting,
        }
    }
}

/// One connection's state, shared between its task and the table.
#[derive(Debug)]
pub struct Slot {
    /// The client's address.
    pub ip: IpAddr,
    phase: AtomicU8,
    /// Nanoseconds since the table's start: the last change of phase.
    since_ns: AtomicU64,
    /// Body bytes received since the body began.
    body_bytes: AtomicU64,
    /// Told when the table closes this connection.
    pub close: Notify,
}

/// A connection's place in the table; dropping it frees the place.
pub struct Guard {
    table: Arc<ConnTable>,
    id: u64,
    /// The connection's state.
    pub slot: Arc<Slot>,
}

/// What the table did with a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Room was free.
    Admitted,
    /// Another connection was closed to make room.
    Evicted(Phase),
}

/// Open connections, keyed by admission order (oldest first).
pub struct ConnTable {
    max: usize,
    max_per_ip: usize,
    start: Instant,
    inner: Mutex<(u64, BTreeMap<u64, Arc<Slot>>)>,
}

impl ConnTable {
    /// A table of `max` connections, `max_per_ip` from one address.
    pub fn new(max: usize, max_per_ip: usize) -> Arc<Self> {
        assert!(max > 0 && max_per_ip > 0, "a table needs room for one");
        Arc::new(ConnTable {
            max,
            max_per_ip: max_per_ip.min(max),
            start: Instant::now(),
            inner: Mutex::new((0, BTreeMap::new())),
        })
    }

    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Admit a connection from `ip`, closing the least useful one if a limit is reached.
    /// `None`: every candidate waits for an answer; the newcomer is refused.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<(Guard, Admission)> {
        let now = self.now_ns();
        let mut inner = self.inner.lock();
        let (next, open) = &mut *inner;
        let from_ip = open.values().filter(|s| s.ip == ip).count();
        let mut admission = Admission::Admitted;
        if from_ip >= self.max_per_ip || open.len() >= self.max {
            let same_ip = from_ip >= self.max_per_ip;
            let victim = open
                .iter()
                .filter(|(_, s)| !same_ip || s.ip == ip)
                .filter_map(|(&id, s)| Some((s.rank(now)?, id)))
                .min();
            let (rank, id) = victim?;
            let evicted = open.remove(&id).expect("a listed slot");
            evicted.close.notify_one();
            admission = Admission::Evicted(rank.0);
        }
        *next += 1;
        let slot = Arc::new(Slot {
            ip,
            phase: AtomicU8::new(Phase::Fresh as u8),
            since_ns: AtomicU64::new(now),
            body_bytes: AtomicU64::new(0),
            close: Notify::new(),
        });
        open.insert(*next, slot.clone());
        debug_assert!(open.len() <= self.max);
        let guard = Guard {
            table: self.clone(),
            id: *next,
            slot,
        };
        Some((guard, admission))
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.inner.lock().1.len()
    }
}

impl Slot {
    /// How dispensable this connection is: lower goes first; `None` is never closed.
    fn rank(&self, now_ns: u64) -> Option<(Phase, u64)> {
        let since = self.since_ns.load(Ordering::Acquire);
        match Phase::from_u8(self.phase.load(Ordering::Acquire)) {
            Phase::Waiting => None,
            p @ (Phase::Fresh | Phase::Idle) => Some((p, since)),
            Phase::Body => {
                let secs = (now_ns.saturating_sub(since) as f64 / 1e9).max(1e-3);
                let rate = self.body_bytes.load(Ordering::Acquire) as f64 / secs;
                Some((Phase::Body, rate as u64))
            }
        }
    }

    /// The phase now.
    #[cfg(test)]
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }
}

impl Guard {
    /// Move to `phase` (a body's byte count starts again at 0).
    pub fn set(&self, phase: Phase) {
        let s = &self.slot;
        if phase == Phase::Body {
            s.body_bytes.store(0, Ordering::Release);
        }
        s.since_ns.store(self.table.now_ns(), Ordering::Release);
        s.phase.store(phase as u8, Ordering::Release);
    }

    /// Count `n` body bytes received.
    pub fn body_bytes(&self, n: u64) {
        self.slot.body_bytes.fetch_add(n, Ordering::AcqRel);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.table.inner.lock().1.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_full_table_closes_the_least_useful_connection_first() {
        let t = ConnTable::new(4, 4);
        let (used, _) = t.admit(ip(1)).unwrap();
        used.set(Phase::Idle); // a client that completed a request
        let (slow, _) = t.admit(ip(2)).unwrap();
        slow.set(Phase::Body);
        let (waiting, _) = t.admit(ip(3)).unwrap();
        waiting.set(Phase::Waiting);
        let (_fresh, _) = t.admit(ip(4)).unwrap();
        // Full: the never-started one goes first, then the idle one, then the slow body.
        let (a, how) = t.admit(ip(5)).unwrap();
        assert_eq!(how, Admission::Evicted(Phase::Fresh));
        a.set(Phase::Waiting);
        let (b, how) = t.admit(ip(5)).unwrap();
        assert_eq!(how, Admission::Evicted(Phase::Idle));
        b.set(Phase::Waiting);
        let (c, how) = t.admit(ip(5)).unwrap();
        assert_eq!(how, Admission::Evicted(Phase::Body));
        c.set(Phase::Waiting);
        assert!(t.admit(ip(5)).is_none(), "all wait for answers: refused");
        assert_eq!(t.len(), 4);
        drop((used, slow)); // evicted already: freeing them changes nothing
        assert_eq!(t.len(), 4);
        drop(waiting);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn one_address_over_its_limit_closes_its_own_connections_only() {
        let t = ConnTable::new(8, 2);
        let (other, _) = t.admit(ip(9)).unwrap(); // fresh, the oldest: still not touched
        let (first, _) = t.admit(ip(1)).unwrap();
        first.set(Phase::Idle);
        let (_second, _) = t.admit(ip(1)).unwrap();
        let (_third, how) = t.admit(ip(1)).unwrap();
        assert_eq!(how, Admission::Evicted(Phase::Fresh), "its own fresh one");
        assert_eq!(other.slot.phase(), Phase::Fresh);
        assert_eq!(t.len(), 3);
        // Of two bodies, the slower goes.
        let t = ConnTable::new(2, 2);
        let (fast, _) = t.admit(ip(1)).unwrap();
        let (slow, _) = t.admit(ip(1)).unwrap();
        fast.set(Phase::Body);
        slow.set(Phase::Body);
        fast.body_bytes(1 << 20);
        slow.body_bytes(1);
        let _third = t.admit(ip(1)).unwrap();
        let mut open: Vec<u64> = t.inner.lock().1.keys().copied().collect();
        open.sort();
        assert_eq!(open, vec![fast.id, 3], "the slow body was closed");
    }
}
