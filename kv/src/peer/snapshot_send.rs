//! Sending a raft snapshot without the raft thread: when raft asks its storage for a snapshot,
//! the state machine opens a read view (no copy, no scan) and registers it here under a new id;
//! raft's `MsgSnapshot` carries only that id (`snapshot_wire`). When the transport meets the
//! message, a thread of its own streams the view's rows to the peer as chunks, on the same lane
//! of the connection and with its queue's bounds, then sends the `MsgSnapshot` after them; the
//! raft thread never waits for a snapshot's bytes, and no step holds the state in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A view of a group's state at one applied index, held until streamed.
pub trait StreamSource: Send {
    /// Write the state as a snapshot stream to `sink`, in chunks of about `chunk_bytes`.
    fn stream(
        self: Box<Self>,
        chunk_bytes: usize,
        sink: &mut dyn FnMut(Vec<u8>) -> Result<(), String>,
    ) -> Result<(), String>;
}

/// A view not streamed within this long is dropped (it pins the state it sees).
pub const VIEW_TTL: Duration = Duration::from_secs(600);

/// Views registered at most at once: raft asks for one snapshot per lagging follower and group.
pub const MAX_VIEWS: usize = 64;

/// A view, and when it was registered.
type Registered = (Box<dyn StreamSource>, Instant);

/// Views registered by the raft thread, by snapshot id, until the transport streams them.
pub struct SnapshotViews {
    views: Mutex<HashMap<u64, Registered>>,
    /// Ids from here on: the node's id in the top bits, its boot in the middle, a counter below,
    /// so that no two snapshots a receiver sees share one.
    next: AtomicU64,
}

impl SnapshotViews {
    /// The registry of node `node_id`, booted at `boot_ns` (any number that differs between boots).
    pub fn new(node_id: u64, boot_ns: u64) -> Self {
        let base = (node_id << 48) ^ ((boot_ns & 0xFF_FFFF) << 24);
        SnapshotViews {
            views: Mutex::new(HashMap::new()),
            next: AtomicU64::new(base | 1),
        }
    }

    /// Register `view`; the id its snapshot's descriptor names. The oldest views go first when
    /// there are too many, and any past [`VIEW_TTL`].
    pub fn register(&self, view: Box<dyn StreamSource>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut views = self.views.lock();
        views.retain(|_, (_, at)| at.elapsed() < VIEW_TTL);
        while views.len() >= MAX_VIEWS {
            let oldest = views.keys().min().copied(); // ids grow: the smallest is the oldest
            views.remove(&oldest.expect("not empty"));
        }
        views.insert(id, (view, Instant::now()));
        id
    }

    /// The view of snapshot `id`, once (`None`: never registered, or dropped).
    pub fn take(&self, id: u64) -> Option<Box<dyn StreamSource>> {
        self.views.lock().remove(&id).map(|(v, _)| v)
    }

    /// Views held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.views.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<u8>);

    impl StreamSource for Fixed {
        fn stream(
            self: Box<Self>,
            _: usize,
            sink: &mut dyn FnMut(Vec<u8>) -> Result<(), String>,
        ) -> Result<(), String> {
            sink(self.0)
        }
    }

    #[test]
    fn a_view_is_taken_once_and_the_oldest_go_first() {
        let v = SnapshotViews::new(3, 12345);
        let a = v.register(Box::new(Fixed(b"a".to_vec())));
        assert_eq!(a >> 48, 3, "the node's id in the top bits");
        let mut got = Vec::new();
        let src = v.take(a).expect("registered");
        src.stream(1, &mut |c| {
            got.extend(c);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, b"a");
        assert!(v.take(a).is_none(), "once");
        let ids: Vec<u64> = (0..MAX_VIEWS + 2)
            .map(|_| v.register(Box::new(Fixed(Vec::new()))))
            .collect();
        assert_eq!(v.len(), MAX_VIEWS);
        assert!(v.take(ids[0]).is_none() && v.take(ids[1]).is_none());
        assert!(v.take(ids[MAX_VIEWS + 1]).is_some());
    }
}
