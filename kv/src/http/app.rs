//! What the HTTP side of a node holds: the raft loop's shared state, the options, limits,
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
use crate::raft::shared::Shared;
use crate::raft::status::Status;
use crate::state::kv_state::KvState;

/// The HTTP side's view of a node.
pub struct App {
    /// The raft loop's shared state.
    pub raft: Arc<Shared<KvState>>,
    /// The node's options.
    pub opts: NodeOptions,
    /// HTTP limits.
    pub limits: HttpLimits,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Peers cut off by fault injection.
    pub blocked: Blocked,
    /// The transport's extra one-way delay, in ms (fault injection changes it).
    pub peer_delay_ms: Arc<std::sync::atomic::AtomicU64>,
    /// When each peer was last heard from (the peer listener records it).
    pub heard: Arc<Heard>,
    /// Bytes of writes waiting for the raft thread or for their entries to apply.
    pub inflight: Arc<Budget>,
    /// The HTTP connection table.
    pub conns: Arc<ConnTable>,
    /// `http` or `https`, for redirects.
    pub scheme: &'static str,
    /// This run's lease promise and the data dir's record of earlier ones.
    pub promise: Arc<PromiseRecord>,
}

impl App {
    /// The status the raft thread published last.
    pub fn status(&self) -> Status {
        self.raft.status.read().clone()
    }

    /// The leader to send clients to: `leader`, if a message from it arrived within
    /// [`App::redirect_window_ms`]. A follower that heard nothing may be pointing at a dead leader
    /// (it keeps its id until an election ends), and answers 503 `no_leader` instead.
    pub fn live_leader(&self, leader: Option<u64>) -> Option<u64> {
        let window = self.redirect_window_ms();
        leader.filter(|&id| self.heard.ago_ms(id).is_some_and(|ms| ms <= window))
    }

    /// Two of raft's heartbeat intervals and a tick: a leader sends a heartbeat every interval,
    /// so a follower that heard nothing for this long has missed at least one.
    pub fn redirect_window_ms(&self) -> u64 {
        let (hb, tick) = (self.opts.heartbeat_ms, self.opts.tick_ms.max(1));
        let interval = (hb / tick).max(1) * tick;
        2 * interval + tick
    }

    /// Node `id`'s HTTP address: the address book's, else the one given with `--peer-http`.
    pub fn http_of(&self, id: u64) -> Option<String> {
        let book = self.raft.members.read();
        book.addrs
            .get(&id)
            .and_then(|a| a.http.clone())
            .or_else(|| self.opts.peer_http.get(&id).cloned())
    }
}
