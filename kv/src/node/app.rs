//! What a node's front ends hold in common: the raft loop's shared state, the options, limits,
//! budgets and counters.

use std::sync::Arc;

use crate::base::budget::Budget;
use crate::base::conns::ConnTable;
use crate::base::limits::HttpLimits;
use crate::base::metrics::Metrics;
use crate::base::options::NodeOptions;
use crate::disk::promise_file::PromiseRecord;
use crate::peer::heard::Heard;
use crate::peer::transport::Blocked;
use crate::raft::shared::{Groups, Shared};
use crate::raft::status::Status;
use crate::state::kv_state::KvState;

/// A node as its front ends (the HTTP API and etcd's) see it.
pub struct App {
    /// Every group's shared state.
    pub groups: Arc<Groups<KvState>>,
    /// The node's options.
    pub opts: NodeOptions,
    /// HTTP limits.
    pub limits: HttpLimits,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Peers cut off by fault injection.
    pub blocked: Blocked,
    /// The stalled-disk fault (fault injection sets it).
    pub disk_stall: Arc<crate::base::disk_stall::DiskStall>,
    /// The transport's extra one-way delay, in ms (fault injection changes it).
    /// The extra delay on incoming peer messages (fault injection).
    pub peer_delay_in_ms: Arc<std::sync::atomic::AtomicU64>,
    pub peer_delay_ms: Arc<std::sync::atomic::AtomicU64>,
    /// When each peer was last heard from (the peer listener records it).
    pub heard: Arc<Heard>,
    /// Bytes of writes waiting for the raft thread or for their entries to apply.
    pub inflight: Arc<Budget>,
    /// The HTTP connection table.
    pub conns: Arc<ConnTable>,
    /// `http` or `https`, for redirects.
    pub scheme: &'static str,
    /// The peers' mutual TLS (`None` with `--insecure-peers`): `/admin/members` dials a node
    /// with it before adding it.
    pub peer_tls: Option<crate::tls::config::PeerTls>,
    /// This run's lease promise and the data dir's record of earlier ones.
    pub promise: Arc<PromiseRecord>,
}

impl App {
    /// Group 0: sessions, locks, the address book, and the node-wide routes.
    pub fn first(&self) -> &Arc<Shared<KvState>> {
        self.groups.first()
    }

    /// The group that holds `key` (see `state::placement`).
    pub fn group_of(&self, key: &str) -> &Arc<Shared<KvState>> {
        let g = crate::state::placement::group_of(key, self.groups.count());
        self.groups.get(g)
    }

    /// Group 0's status, as the raft thread published it last.
    pub fn status(&self) -> Status {
        self.first().status.read().clone()
    }

    /// The leader to send clients to: `leader`, if a message from it arrived within
    /// [`App::redirect_window_ms`]. A follower that heard nothing may be pointing at a dead leader
    /// (it keeps its id until an election ends), and answers 503 `no_leader` instead.
    pub fn live_leader(&self, leader: Option<u64>) -> Option<u64> {
        let window = self.redirect_window_ms();
        leader.filter(|&id| self.heard.ago_ms(id).is_some_and(|ms| ms <= window))
    }

    /// Two of the leader's heartbeat intervals and a tick: a leader's node sends something every
    /// interval, so a follower that heard nothing for this long has missed at least one. Per
    /// group, the interval is raft's heartbeat; with shared liveness, a quiescent group sends
    /// none, and the node's support heartbeat (a third of the promise, `--election-ms`) is what
    /// comes.
    pub fn redirect_window_ms(&self) -> u64 {
        let (hb, tick) = (self.opts.heartbeat_ms, self.opts.tick_ms.max(1));
        let interval = match self.opts.liveness {
            raft_lease::multi::LivenessMode::PerGroup => (hb / tick).max(1) * tick,
            raft_lease::multi::LivenessMode::Shared => (self.opts.election_ms / 3).max(hb),
        };
        2 * interval + tick
    }

    /// Node `id`'s etcd API address: the address book's, else the one given with `--peer-etcd`
    /// (or, for this node, `--etcd-listen`).
    pub fn etcd_of(&self, id: u64) -> Option<String> {
        let book = self.first().members.read();
        book.addrs
            .get(&id)
            .and_then(|a| a.etcd.clone())
            .or_else(|| self.opts.etcd_of(id))
    }

    /// Node `id`'s HTTP address: the address book's, else the one given with `--peer-http`.
    pub fn http_of(&self, id: u64) -> Option<String> {
        let book = self.first().members.read();
        book.addrs
            .get(&id)
            .and_then(|a| a.http.clone())
            .or_else(|| self.opts.peer_http.get(&id).cloned())
    }
}
