//! The places of a member's inbound peer connections: at most
//! [`peer::MAX_CONNECTIONS_PER_PEER`] at once. A member that connects again while it holds every
//! place closes its own oldest connection: a peer whose connections went dead without a reset (a
//! network that dropped everything, then healed) is let in at once, not kept out until the dead
//! ones time out, and still holds no more places than the limit.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::base::limits::peer;
use crate::base::metrics::Metrics;

/// Open inbound connections per authenticated peer id, oldest first: each its serial and the
/// signal that closes it.
pub type PerPeer = Arc<Mutex<HashMap<u64, VecDeque<(u64, Arc<Notify>)>>>>;

/// A place among a member's inbound connections, freed on drop.
pub struct PeerSlot {
    per_peer: PerPeer,
    id: u64,
    serial: u64,
    /// Fires when a newer connection of the same member takes this place.
    closed: Arc<Notify>,
}

impl PeerSlot {
    /// A place for a connection of member `id`, its oldest connection closed if it held every
    /// place.
    pub fn take(per_peer: &PerPeer, id: u64) -> PeerSlot {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let closed = Arc::new(Notify::new());
        let mut m = per_peer.lock();
        let open = m.entry(id).or_default();
        while open.len() >= peer::MAX_CONNECTIONS_PER_PEER {
            let (_, oldest) = open.pop_front().expect("at the limit, so not empty");
            oldest.notify_one(); // a permit: its task ends even if it is not waiting yet
        }
        open.push_back((serial, closed.clone()));
        assert!(
            open.len() <= peer::MAX_CONNECTIONS_PER_PEER,
            "peer {id}: {} places, over the limit",
            open.len()
        );
        PeerSlot {
            per_peer: per_peer.clone(),
            id,
            serial,
            closed,
        }
    }

    /// Run `conn` until it ends, or a newer connection of the member takes this place.
    pub async fn serve(&self, conn: impl std::future::Future<Output = ()>, metrics: &Metrics) {
        tokio::select! {
            _ = conn => {}
            _ = self.closed.notified() => metrics.peer_superseded.inc(),
        }
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.per_peer.lock();
        if let Some(open) = m.get_mut(&self.id) {
            open.retain(|(s, _)| *s != self.serial);
            if open.is_empty() {
                m.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_member_over_its_places_closes_its_oldest_connection_not_the_new_one() {
        let (per_peer, metrics) = (PerPeer::default(), Metrics::default());
        let slots: Vec<PeerSlot> = (0..peer::MAX_CONNECTIONS_PER_PEER)
            .map(|_| PeerSlot::take(&per_peer, 7))
            .collect();
        let other = PeerSlot::take(&per_peer, 8);
        let newest = PeerSlot::take(&per_peer, 7);
        // The oldest of member 7 ends at once; the others, member 8's and the newest, run on.
        let never = std::future::pending::<()>();
        let oldest = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            slots[0].serve(never, &metrics),
        );
        assert!(oldest.await.is_ok(), "the oldest connection was not closed");
        assert_eq!(metrics.peer_superseded.get(), 1);
        for s in [&slots[1], &other, &newest] {
            let running = s.serve(std::future::pending::<()>(), &metrics);
            let polled = tokio::time::timeout(std::time::Duration::from_millis(1), running).await;
            assert!(
                polled.is_err(),
                "a connection that kept its place was closed"
            );
        }
        assert_eq!(per_peer.lock()[&7].len(), peer::MAX_CONNECTIONS_PER_PEER);
        drop(slots);
        assert_eq!(per_peer.lock()[&7].len(), 1, "places free on drop");
        drop((newest, other));
        assert!(
            per_peer.lock().is_empty(),
            "no entry is left for a member with no connection"
        );
    }
}
