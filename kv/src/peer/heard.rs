//! When a message from each peer last arrived, recorded by the listener as it admits the message
//! (before the raft thread takes it, so a follower busy with its own disk still sees its leader
//! talking). A follower sends clients to the leader only while it hears from it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::base::clock::monotonic_ms;

/// The last arrival from each peer, in ms on [`monotonic_ms`]; only admitted members' ids.
#[derive(Debug, Default)]
pub struct Heard {
    at_ms: RwLock<HashMap<u64, AtomicU64>>,
}

impl Heard {
    /// A message from `peer` arrived now.
    pub fn record(&self, peer: u64) {
        let now = monotonic_ms();
        if let Some(at) = self.at_ms.read().get(&peer) {
            at.store(now, Ordering::Relaxed);
            return;
        }
        self.at_ms
            .write()
            .entry(peer)
            .or_default()
            .store(now, Ordering::Relaxed);
    }

    /// How many ms ago the last message from `peer` arrived; `None` if none ever did.
    pub fn ago_ms(&self, peer: u64) -> Option<u64> {
        let at = self.at_ms.read().get(&peer)?.load(Ordering::Relaxed);
        Some(monotonic_ms().saturating_sub(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_peers_heard_from_have_an_age() {
        let h = Heard::default();
        assert_eq!(h.ago_ms(2), None);
        h.record(2);
        assert!(h.ago_ms(2).is_some_and(|ms| ms < 60_000));
        assert_eq!(h.ago_ms(3), None);
    }
}
