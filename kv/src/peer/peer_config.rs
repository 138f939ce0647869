//! The transport's settings, shared by its sending tasks and the peer listener.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::RwLock;
use slog::Logger;

use crate::base::budget::Budget;
use crate::base::metrics::Metrics;
use crate::peer::heard::Heard;
use crate::peer::members::Members;
use crate::peer::snapshot_recv::SnapshotInbox;
use crate::peer::snapshot_send::SnapshotViews;
use crate::tls::config::PeerTls;

/// Peers cut off by fault injection: an id alone cuts both directions; `id | ONLY_OUT` drops
/// only what this node sends to it, `id | ONLY_IN` only what it receives from it.
pub type Blocked = Arc<RwLock<std::collections::HashSet<u64>>>;

/// Settings shared by the transport's tasks and the peer listener.
#[derive(Clone)]
pub struct TransportConfig {
    /// This node's raft id.
    pub my_id: u64,
    /// The peers this node was started with (`--peers`): used until the address book knows them.
    pub started_with: BTreeMap<u64, String>,
    /// The replicated address book.
    pub members: Arc<RwLock<Members>>,
    /// Extra one-way delay on every outgoing message, in ms (a cross-zone network on one
    /// machine; `/admin/delay` changes it).
    pub peer_delay_ms: Arc<AtomicU64>,
    /// Extra delay on every incoming peer message before the raft thread gets it, in ms (one
    /// slow link into this node; `/admin/delay` with `"direction": "in"` changes it).
    pub peer_delay_in_ms: Arc<AtomicU64>,
    /// Peers cut off by fault injection.
    pub blocked: Blocked,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Where to log.
    pub logger: Logger,
    /// Mutual TLS; `None` with `--insecure-peers`.
    pub tls: Option<PeerTls>,
    /// Bytes received from peers and not yet stepped (see `listen`).
    pub peer_budget: Arc<Budget>,
    /// The largest message accepted from a peer.
    pub max_message_bytes: usize,
    /// When each peer's last admitted message arrived (the listener records it).
    pub heard: Arc<Heard>,
    /// The views of snapshots described to raft, streamed to peers by the transport.
    pub views: Option<Arc<SnapshotViews>>,
    /// Where snapshots streamed to this node are written (`None`: it takes none).
    pub snapshots: Option<Arc<SnapshotInbox>>,
}

impl TransportConfig {
    /// Where peer `id` listens: the address book's entry, else the one it was started with.
    pub fn addr_of(&self, id: u64) -> Option<String> {
        let book = self.members.read();
        book.addrs
            .get(&id)
            .map(|a| a.peer.clone())
            .or_else(|| self.started_with.get(&id).cloned())
    }
}
