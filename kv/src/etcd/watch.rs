//! etcd's Watch service: one bidirectional stream holds many watchers. Each watcher reads the
//! keyspace's history from the revision it asked for, in revision order, and remembers the next
//! revision it owes, so every change reaches it exactly once, across leader changes (the
//! history is this node's own replicated state) and after a reconnect with `start_revision`.
//! A watcher whose next revision was compacted away is canceled with `compact_revision` set.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use etcd_client::proto::{
    PbWatchRequest as WatchRequest, PbWatchRequestUnion as Union, PbWatchResponse as WatchResponse,
    PbWatchService,
};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::etcd::api::EtcdApi;
use crate::state::mvcc::watch::{EVENT_DELETE, EVENT_PUT};
use crate::state::mvcc::MvccError;

/// Watchers one stream may hold.
pub const MAX_WATCHERS_PER_STREAM: usize = 1024;
/// Events in one response at most (a response ends at a revision's end, so one revision's
/// events may pass it).
const MAX_EVENTS_PER_RESPONSE: usize = 1000;
/// Events read from the history in one pass over a stream's watchers (under the state's lock).
const EVENTS_PER_PASS: usize = 4096;
/// Watchers of every stream on the node together, at most.
pub const MAX_WATCHERS_PER_NODE: usize = 100_000;
/// How often a watcher that asked for progress notifications gets one with no events.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// etcd's watch filters.
const FILTER_NOPUT: i32 = 0;
const FILTER_NODELETE: i32 = 1;

/// One watcher's answer of a pass: (watcher, events, the revision it is synced through, the
/// compacted revision if it was canceled, else 0).
type Batch = (i64, Vec<etcd_client::proto::PbEvent>, i64, i64);

struct Watcher {
    key: Vec<u8>,
    end: Vec<u8>,
    /// The first revision not yet sent.
    next_rev: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
}

/// One stream's watchers.
struct Session {
    api: EtcdApi,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    out: mpsc::Sender<Result<WatchResponse, Status>>,
}

impl Session {
    async fn send(&self, r: WatchResponse) -> bool {
        self.out.send(Ok(r)).await.is_ok()
    }

    fn response(&self, watch_id: i64) -> WatchResponse {
        WatchResponse {
            header: self.api.header_now(),
            watch_id,
            ..Default::default()
        }
    }

    /// A response whose header says the watcher is synced through `revision`.
    fn response_at(&self, watch_id: i64, revision: i64) -> WatchResponse {
        WatchResponse {
            header: self.api.header(revision),
            watch_id,
            ..Default::default()
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> bool {
        match req.request_union {
            Some(Union::CreateRequest(c)) => {
                let mut id = c.watch_id;
                if id == 0 {
                    while self.watchers.contains_key(&self.next_id) {
                        self.next_id += 1;
                    }
                    id = self.next_id;
                }
                let on_node = self.api.0.watchers.load(Ordering::Relaxed);
                let refuse = if self.watchers.len() >= MAX_WATCHERS_PER_STREAM {
                    Some(format!(
                        "etcdserver: at most {MAX_WATCHERS_PER_STREAM} watchers per stream"
                    ))
                } else if on_node >= MAX_WATCHERS_PER_NODE {
                    Some(format!(
                        "etcdserver: at most {MAX_WATCHERS_PER_NODE} watchers per node; retry later"
                    ))
                } else if id < 0 || self.watchers.contains_key(&id) {
                    Some("mvcc: duplicate watch ID provided on the WatchStream".to_string())
                } else {
                    None
                };
                if let Some(reason) = refuse {
                    let mut r = self.response(-1);
                    (r.created, r.canceled, r.cancel_reason) = (true, true, reason);
                    return self.send(r).await;
                }
                let current = self.api.keyspace().rev();
                // The negative control: one revision late.
                let late = i64::from(self.api.app().opts.unsafe_watch_off_by_one);
                let w = Watcher {
                    next_rev: late
                        + if c.start_revision > 0 {
                            c.start_revision
                        } else {
                            current + 1
                        },
                    no_put: c.filters.contains(&FILTER_NOPUT),
                    no_delete: c.filters.contains(&FILTER_NODELETE),
                    key: c.key,
                    end: c.range_end,
                    prev_kv: c.prev_kv,
                    progress_notify: c.progress_notify,
                };
                self.watchers.insert(id, w);
                self.api.0.watchers.fetch_add(1, Ordering::Relaxed);
                let mut r = self.response(id);
                r.created = true;
                self.send(r).await && self.pump().await
            }
            Some(Union::CancelRequest(c)) => {
                if self.watchers.remove(&c.watch_id).is_none() {
                    return true;
                }
                self.api.0.watchers.fetch_sub(1, Ordering::Relaxed);
                let mut r = self.response(c.watch_id);
                r.canceled = true;
                self.send(r).await
            }
            // Answered once every watcher is synced, at the revision they are synced through.
            Some(Union::ProgressRequest(_)) => {
                self.pump().await && {
                    let through = self.synced_through();
                    self.send(self.response_at(-1, through)).await
                }
            }
            None => true,
        }
    }

    /// Send every watcher what the history holds for it past its next revision, in passes of
    /// at most [`EVENTS_PER_PASS`] events, each pass on one view of the state engine (the raft
    /// thread never waits for it); the answers of a pass are sent, waiting for the client to
    /// take them, before the next pass reads more.
    async fn pump(&mut self) -> bool {
        loop {
            let (out, behind) = self.pass();
            for (id, events, through, compacted) in out {
                let mut r = self.response_at(id, through);
                r.events = events;
                if compacted != 0 {
                    (r.canceled, r.compact_revision) = (true, compacted);
                }
                if !self.send(r).await {
                    return false;
                }
            }
            if !behind {
                return true;
            }
            tokio::task::yield_now().await;
        }
    }

    /// One pass on one view of the keyspace: each watcher's next batch (watcher, events, the
    /// revision it is synced through, the compacted revision if it was canceled), and whether
    /// any watcher is still behind.
    fn pass(&mut self) -> (Vec<Batch>, bool) {
        let ks = self.api.keyspace().clone();
        match ks.read(|m| Ok(self.pass_on(m))) {
            Ok(done) => done,
            // A storage failure: nothing this pass; the watchers stay, and the next pass tries again.
            Err(_) => (Vec::new(), true),
        }
    }

    /// [`Self::pass`] on one view of the keyspace.
    fn pass_on(&mut self, m: &crate::state::mvcc::Reader<'_>) -> (Vec<Batch>, bool) {
        let current = m.rev();
        let (mut out, mut gone, mut budget) = (Vec::new(), Vec::new(), EVENTS_PER_PASS);
        for (&id, w) in self.watchers.iter_mut() {
            if w.next_rev > current || budget == 0 {
                continue;
            }
            let max = budget.min(MAX_EVENTS_PER_RESPONSE);
            match m.events(&w.key, &w.end, w.next_rev, w.prev_kv, max) {
                Ok(got) => {
                    w.next_rev = got.through + 1;
                    budget = budget.saturating_sub(got.events.len().max(1));
                    let events: Vec<_> = got
                        .events
                        .into_iter()
                        .filter(|e| !(e.r#type == EVENT_PUT && w.no_put))
                        .filter(|e| !(e.r#type == EVENT_DELETE && w.no_delete))
                        .collect();
                    if !events.is_empty() {
                        out.push((id, events, got.through, 0));
                    }
                }
                Err(MvccError::Compacted) => {
                    out.push((id, Vec::new(), current, m.compacted()));
                    gone.push(id);
                }
                Err(_) => {} // a storage failure: this watcher tries again at the next pass
            }
        }
        for id in gone {
            self.watchers.remove(&id);
            self.api.0.watchers.fetch_sub(1, Ordering::Relaxed);
        }
        let behind = self.watchers.values().any(|w| w.next_rev <= current);
        (out, behind)
    }

    /// The revision every watcher of this stream is synced through (the current one if none).
    fn synced_through(&self) -> i64 {
        let current = self.api.keyspace().rev();
        self.watchers
            .values()
            .map(|w| w.next_rev - 1)
            .min()
            .unwrap_or(current)
            .min(current)
    }

    /// Progress notifications: each watcher that asked gets its own synced revision, so a
    /// client that resumes from a notification's header misses nothing.
    async fn progress(&mut self) -> bool {
        if !self.pump().await {
            return false;
        }
        let due: Vec<(i64, i64)> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify)
            .map(|(id, w)| (*id, w.next_rev - 1))
            .collect();
        for (id, through) in due {
            if !self.send(self.response_at(id, through)).await {
                return false;
            }
        }
        true
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let n = self.watchers.len();
        self.api.0.watchers.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A stream of watch responses.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PbWatchService for EtcdApi {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let mut inbound = req.into_inner();
        let mut applied = self.group().applied_changes();
        let mut s = Session {
            api: self.clone(),
            watchers: BTreeMap::new(),
            next_id: 0,
            out: tx,
        };
        tokio::spawn(async move {
            let mut progress = tokio::time::interval(PROGRESS_EVERY);
            progress.tick().await;
            loop {
                let alive = tokio::select! {
                    msg = inbound.next() => match msg {
                        Some(Ok(req)) => s.handle(req).await,
                        _ => false,
                    },
                    changed = applied.changed() => changed.is_ok() && s.pump().await,
                    _ = progress.tick() => s.progress().await,
                };
                if !alive {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
