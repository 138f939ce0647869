//! What every etcd service shares ([`EtcdApi`]): the node, the forwarder, response headers,
//! where a request goes (here or the leader), proposing a command and reading linearizably.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::proto::PbResponseHeader as ResponseHeader;
use raft_lease::ReadMode;
use tokio::sync::oneshot;
use tonic::Status;

use crate::etcd::errors;
use crate::etcd::forward::{Forwarder, FORWARDED};
use crate::node::app::App;
use crate::raft::requests::{ReadReply, Request, WriteReply};
use crate::raft::shared::Shared;
use crate::state::alarms::{Alarms, ALARMS_ROW, NOSPACE};
use crate::state::command::{Command, Outcome, Refusal};
use crate::state::kv_machine::KvCommand;
use crate::state::kv_state::KvState;
use crate::state::mvcc::Pinned;

/// How long a request waits for the raft thread.
const WAIT: Duration = Duration::from_secs(5);

/// How far behind a forwarded write's revision a member is taken to be rebuilding (from a
/// snapshot, or after a long absence) rather than merely late: a follower in step is a few
/// revisions behind the leader at most.
pub const REBUILDING_REVISIONS: i64 = 1_000;

/// What a write costs in the in-flight budget besides its bytes.
const WRITE_OVERHEAD_BYTES: u64 = 2048;

/// Where a request that needs the leader goes.
pub enum Route {
    /// This node leads.
    Here,
    /// Forward to the leader's etcd API address.
    Leader(String),
}

/// The etcd API of a node: every service is implemented on it.
#[derive(Clone)]
pub struct EtcdApi(pub(crate) Arc<Inner>);

/// [`EtcdApi`]'s state.
pub struct Inner {
    /// The node.
    pub app: Arc<App>,
    /// Calls to the leader.
    pub fwd: Forwarder,
    /// The cluster's id in headers: FNV-1a of `--cluster-id`.
    pub cluster_id: u64,
    /// Watchers of every stream on this node (bounded: `watch::MAX_WATCHERS_PER_NODE`).
    pub watchers: std::sync::atomic::AtomicUsize,
}

impl EtcdApi {
    /// The API of `app`'s node, forwarding through `fwd`.
    pub fn new(app: Arc<App>, fwd: Forwarder) -> Self {
        let cluster_id = fnv1a(app.opts.cluster_id.as_bytes());
        EtcdApi(Arc::new(Inner {
            app,
            fwd,
            cluster_id,
            watchers: Default::default(),
        }))
    }

    /// The node.
    pub fn app(&self) -> &App {
        &self.0.app
    }

    /// The store's only group (the etcd API needs one revision space).
    pub fn group(&self) -> &Arc<Shared<KvState>> {
        self.0.app.first()
    }

    /// A response header at revision `revision`.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.0.cluster_id,
            member_id: self.0.app.opts.id,
            revision,
            raft_term: self.group().leadership.term(),
        })
    }

    /// A response header at the keyspace's current revision.
    pub fn header_now(&self) -> Option<ResponseHeader> {
        self.header(self.keyspace().rev())
    }

    /// The keyspace, read without the state machine's lock.
    pub fn keyspace(&self) -> &crate::state::mvcc::Keyspace {
        &self.group().reader
    }

    /// Where a request for the leader goes from here: this node, or the leader's address when
    /// raft knows one and this request was not forwarded already.
    pub fn route<T>(&self, req: &tonic::Request<T>) -> Result<Route, Status> {
        let (leads, leader) = self.group().leadership.get();
        if leads {
            return Ok(Route::Here);
        }
        if req.metadata().get(FORWARDED).is_some() {
            return Err(errors::leader_changed());
        }
        // The leader raft knows, even if nothing came from it for a while (a leader busy with
        // a large batch is late, not gone): as etcd's followers, forward to it; a deposed one
        // answers that it does not lead.
        let live = self
            .app()
            .live_leader(leader)
            .or(leader)
            .ok_or_else(errors::no_leader)?;
        let addr = self.app().etcd_of(live).ok_or_else(|| {
            Status::unavailable(format!(
                "etcdserver: node {live} leads and its etcd API address is not known here \
                 (give --peer-etcd)"
            ))
        })?;
        Ok(Route::Leader(addr))
    }

    /// Propose `cmd` (with `value`) on this node, the leader, and wait for it to apply.
    pub async fn propose(&self, cmd: Command, value: Vec<u8>) -> Result<Outcome, Status> {
        let app = self.app();
        let ticket = app
            .inflight
            .take(value.len() as u64 + WRITE_OVERHEAD_BYTES)
            .ok_or_else(errors::too_many_requests)?;
        let (tx, rx) = oneshot::channel();
        let req = Request::Propose {
            cmd: KvCommand { cmd, value },
            reply: tx,
            ticket: Some(ticket),
            sent_at: Instant::now(),
        };
        let t = Instant::now();
        let reply = self.ask(req, rx).await?;
        match reply {
            WriteReply::Done(o) => {
                app.metrics.write_seconds.observe(t.elapsed().as_secs_f64());
                Ok(o)
            }
            WriteReply::Refused(Outcome::Refused(Refusal::NotReady)) => Err(Status::unavailable(
                "etcdserver: leader is not ready yet; retry",
            )),
            WriteReply::Refused(o) => Ok(o),
            WriteReply::NotLeader { .. } | WriteReply::NotApplied(_) => {
                Err(errors::leader_changed())
            }
            WriteReply::Unknown(_) => Err(errors::timed_out()),
        }
    }

    /// Send `req` to the raft thread and wait for its answer.
    async fn ask<T>(&self, req: Request<KvState>, rx: oneshot::Receiver<T>) -> Result<T, Status> {
        match self.group().send(req) {
            Ok(()) => {}
            Err(crossbeam_channel::TrySendError::Full(_)) => {
                return Err(errors::too_many_requests())
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => return Err(errors::stopping()),
        }
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(errors::stopping()),
            Err(_) => Err(errors::timed_out()),
        }
    }

    /// Read `f` of the state linearizably on this node: a view of the state is pinned under the
    /// lease (on the leader) or a follower read lease, else (on the leader) after a ReadIndex
    /// round, and `f` reads it, so that a long scan never outlives the lease it began under.
    /// A `long` read (a scan of many rows) runs on a blocking thread, so that it holds no worker
    /// the peer transport and other clients need; a short one (a key) runs here, as a thread
    /// hop would cost it more than the read. `None`: this node cannot (it does not lead and
    /// holds no read lease): forward.
    pub async fn read<T: Send + 'static>(
        &self,
        long: bool,
        f: impl FnOnce(&Pinned) -> T + Send + 'static,
    ) -> Result<Option<T>, Status> {
        let Some(pinned) = self.pin_linearizable().await? else {
            return Ok(None);
        };
        run_read(long, pinned, f).await.map(Some)
    }

    /// Read `f` of the state as this node has it now (serializable); `long` as for
    /// [`EtcdApi::read`].
    pub async fn read_here<T: Send + 'static>(
        &self,
        long: bool,
        f: impl FnOnce(&Pinned) -> T + Send + 'static,
    ) -> Result<T, Status> {
        let pinned = self.keyspace().pin().map_err(errors::mvcc)?;
        run_read(long, pinned, f).await
    }

    /// A view of the state pinned at a linearizable point (see [`EtcdApi::read`]).
    async fn pin_linearizable(&self) -> Result<Option<Pinned>, Status> {
        let g = self.group().clone();
        let handle = g.handle.clone();
        let app = self.app();
        if !app.opts.unsafe_lease_based {
            let g2 = g.clone();
            let state = move || g2.reader.pin();
            if let Ok(v) = handle.try_read(state.clone()) {
                return v.map(Some).map_err(errors::mvcc);
            }
            if handle.lease_held() {
                if let Ok(v) = tokio::task::block_in_place(|| handle.read(state)) {
                    return v.map(Some).map_err(errors::mvcc);
                }
            }
        }
        if !g.leadership.get().0 {
            return Ok(self.pin_after_leader().await);
        }
        // ReadIndex: once the raft thread answers, this node has applied everything committed
        // when the read began; a view taken after that is linearizable.
        let (tx, rx) = oneshot::channel();
        let mode = match app.opts.unsafe_lease_based {
            true => ReadMode::Auto,
            false => ReadMode::ReadIndex,
        };
        let req = Request::Read {
            query: String::new(),
            mode,
            reply: tx,
        };
        match self.ask(req, rx).await? {
            ReadReply::Value { .. } => g.reader.pin().map(Some).map_err(errors::mvcc),
            ReadReply::NotLeader { .. } => Ok(None),
            ReadReply::LeaseNotHeld => Err(errors::no_leader()),
            ReadReply::ShuttingDown => Err(errors::stopping()),
        }
    }

    /// On a follower: a view of this node's state once it has the leader's revision at a
    /// linearizable point taken now (etcd's follower reads: the leader confirms a read index,
    /// the follower reads locally once it applied that far). Every write answered before the
    /// read began has a revision at most the leader's, so the view has it; the scan then costs
    /// the leader nothing. `None`: no leader to ask, no answer, or this node did not catch up
    /// within the wait (the caller forwards the request whole).
    async fn pin_after_leader(&self) -> Option<Pinned> {
        let (_, leader) = self.group().leadership.get();
        let id = self.app().live_leader(leader).or(leader)?;
        let addr = self.app().etcd_of(id)?;
        // The smallest linearizable read there is: a count of one key, for its header.
        let probe = etcd_client::proto::PbRangeRequest {
            key: vec![0],
            count_only: true,
            ..Default::default()
        };
        let path = "/etcdserverpb.KV/Range";
        let got: etcd_client::proto::PbRangeResponse =
            self.0.fwd.unary(&addr, path, probe).await.ok()?;
        let leader_rev = got.header?.revision;
        let unwaited = self.app().opts.unsafe_follower_read_unwaited;
        if !unwaited && !self.caught_up_to(leader_rev).await {
            return None;
        }
        self.keyspace().pin().ok()
    }

    /// Whether this node's state reaches `revision` within [`WAIT`] (it polls every ms).
    async fn caught_up_to(&self, revision: i64) -> bool {
        let deadline = Instant::now() + WAIT;
        while self.keyspace().rev() < revision {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }

    /// A forwarded write's answer, as this member gives it: once this member has applied the
    /// write (its header's revision), so that a serializable read here right after sees it, as
    /// on etcd, whose members answer a write once they applied it; and with this member's
    /// header (its id and term; the write's revision). If this member does not catch up within
    /// [`WAIT`], the answer goes anyway: the write is committed, and only this member is late.
    /// A member more than [`REBUILDING_REVISIONS`] behind (one being rebuilt from a snapshot)
    /// answers at once: waiting would hold its clients for the whole rebuild, and its state is
    /// not yet one a client reads its writes from.
    pub async fn answered_here(&self, header: Option<ResponseHeader>) -> Option<ResponseHeader> {
        let revision = header.as_ref().map_or(0, |h| h.revision);
        let behind = revision.saturating_sub(self.keyspace().rev());
        if !self.app().opts.unsafe_forward_unwaited && behind <= REBUILDING_REVISIONS {
            self.caught_up_to(revision).await;
        }
        self.header(revision)
    }

    /// Whether a request of `bytes` fits the HTTP API's body limit (with room for its framing).
    pub fn check_size(&self, bytes: usize) -> Result<(), Status> {
        match bytes <= self.app().limits.max_body_bytes + KEY_ROOM_BYTES {
            true => Ok(()),
            false => Err(errors::mvcc(crate::state::mvcc::MvccError::TooLarge)),
        }
    }

    /// Room in the state for a transaction's `puts` and `dels` bytes (etcd's "database space
    /// exceeded" otherwise). As in etcd's no-space mode, what only deletes (or only reads) is
    /// let through a full store, within an eighth more, so that a lock can still be released.
    /// A write refused for space raises the NOSPACE alarm (as etcd's quota does): writes stay
    /// refused, on every replica, until it is disarmed.
    pub async fn check_space(&self, puts: u64, dels: u64) -> Result<(), Status> {
        let app = self.app();
        let max = app.opts.quota_backend_bytes;
        let held = self.keyspace().bytes() + app.inflight.used();
        let fits = match puts {
            0 => held + dels <= max + max / 8,
            _ => held + puts + dels <= max,
        };
        if fits {
            return Ok(());
        }
        let raised = self
            .alarms()
            .is_ok_and(|a| a.list(app.opts.id, NOSPACE).len() == 1);
        if !raised {
            let cmd = Command::EtcdAlarm {
                activate: true,
                member: app.opts.id,
                alarm: NOSPACE,
            };
            // Refused either way; the alarm is raised unless leadership moved meanwhile.
            let _ = self.propose(cmd, Vec::new()).await;
        }
        Err(errors::mvcc(crate::state::mvcc::MvccError::NoSpace))
    }

    /// The raised alarms as this node's state holds them now (not a linearizable read).
    pub fn alarms(&self) -> Result<Alarms, Status> {
        let row = self
            .keyspace()
            .read(|r| r.meta(ALARMS_ROW))
            .map_err(errors::mvcc)?;
        match row {
            Some(row) => Alarms::decode(&row).map_err(|e| Status::internal(e.to_string())),
            None => Ok(Alarms::default()),
        }
    }
}

/// Run `f` on `pinned`: on a blocking thread if `long`, else here.
async fn run_read<T: Send + 'static>(
    long: bool,
    pinned: Pinned,
    f: impl FnOnce(&Pinned) -> T + Send + 'static,
) -> Result<T, Status> {
    if !long {
        return Ok(f(&pinned));
    }
    let done = tokio::task::spawn_blocking(move || f(&pinned)).await;
    done.map_err(|e| Status::internal(format!("a read's thread: {e}")))
}

/// What a request may hold besides a value of the body limit: keys and framing.
pub const KEY_ROOM_BYTES: usize = 64 << 10;

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
