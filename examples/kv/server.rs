//! The raft thread: drives the `LeaseNode`, persists, applies, and answers requests from the
//! HTTP threads over channels.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::RwLock;
use raft::eraftpb::{Entry, HardState, Message, Snapshot};
use raft_lease::drive::apply_conf_change_entry;
use raft_lease::{
    Clock, CounterSnapshot, LeaseConfig, LeaseNode, LeaseState, ReadError, ReadHandle, ReadId,
    ReadKind, ReadMode, ReadyIo, Safeties,
};
use slog::{crit, info, warn, Logger};
use tokio::sync::oneshot;

use crate::admin::AdminToken;
use crate::clock::ScaledClock;
use crate::metrics::Metrics;
use crate::state::{decode, encode, Command, KvState, Outcome, Stored};
use crate::storage::{DiskError, DiskStorage};
use crate::transport::{Blocked, Transport};

/// How a node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub id: u64,
    pub peers: BTreeMap<u64, SocketAddr>,
    pub peer_http: BTreeMap<u64, String>,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    /// Recorded in the data dir's marker.
    pub cluster_id: String,
    pub election_ms: u64,
    pub heartbeat_ms: u64,
    pub tick_ms: u64,
    pub drift_ppm: u64,
    pub margin_ms: u64,
    pub peer_delay_ms: u64,
    pub fault_injection: bool,
    /// Required for `/admin` (with `fault_injection`).
    pub admin_token: Option<AdminToken>,
    /// Peers talk plaintext, unauthenticated (local experiments only).
    pub insecure_peers: bool,
    pub unsafe_lease_based: bool,
    /// Snapshot and compact the log once this many entries were applied since the last snapshot;
    /// a tenth of it stays behind the snapshot for followers that lag a little.
    pub snapshot_every: u64,
}

/// A write's answer.
#[derive(Debug)]
pub enum WriteReply {
    Done(Outcome),
    NotLeader {
        leader: Option<u64>,
    },
    /// Sessions are not on this leader's clock yet (just elected): retry shortly.
    NotReady,
    /// Leadership was lost before the write applied here: it may or may not be applied.
    Unknown(String),
}

/// A read's answer.
#[derive(Debug)]
pub enum ReadReply {
    Value {
        stored: Option<Stored>,
        kind: ReadKind,
    },
    NotLeader {
        leader: Option<u64>,
    },
    LeaseNotHeld,
}

/// Work for the raft thread.
pub enum Request {
    Write {
        cmd: Command,
        value: Vec<u8>,
        reply: oneshot::Sender<WriteReply>,
    },
    Read {
        key: String,
        mode: ReadMode,
        reply: oneshot::Sender<ReadReply>,
    },
    Transfer {
        to: u64,
    },
}

/// What the HTTP threads see.
#[derive(Debug, Clone, Default)]
pub struct StatusView {
    pub role: String,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub commit: u64,
    pub applied: u64,
    /// The last index in the raft log.
    pub last_index: u64,
    pub lease: Option<(LeaseState, u64)>,
    pub counters: CounterSnapshot,
    pub is_leader: bool,
    /// Entries in the on-disk log.
    pub log_entries: u64,
}

/// State shared between the raft thread and the HTTP threads.
pub struct Shared {
    pub opts: NodeOptions,
    pub state: RwLock<KvState>,
    pub status: RwLock<StatusView>,
    pub metrics: Arc<Metrics>,
    pub handle: ReadHandle<Arc<ScaledClock>>,
    pub clock: Arc<ScaledClock>,
    pub requests: Sender<Request>,
    pub blocked: Blocked,
    pub stop: Arc<AtomicBool>,
}

type Node = LeaseNode<DiskStorage, Arc<ScaledClock>>;

/// The raft thread's own state.
pub struct Runtime {
    node: Node,
    /// Everything `Ready` processing touches, apart from the node.
    io: KvIo,
    shared: Arc<Shared>,
    inbox: Receiver<Message>,
    requests: Receiver<Request>,
    pending_reads: HashMap<ReadId, (String, oneshot::Sender<ReadReply>)>,
    next_req: u64,
    takeover_proposed: u64,
    last_expire: Instant,
    was_leader: (bool, u64),
    logger: Logger,
}

/// The node's storage, state machine and transport, as seen by `LeaseNode::handle_ready`.
pub struct KvIo {
    storage: DiskStorage,
    shared: Arc<Shared>,
    transport: Transport,
    pending_writes: HashMap<u64, oneshot::Sender<WriteReply>>,
    snapshot_index: u64,
    logger: Logger,
}

/// The raft and lease configs for these options, validated by `LeaseNode::new`.
fn configs(o: &NodeOptions, applied: u64) -> (raft::Config, LeaseConfig) {
    let election_tick = (o.election_ms / o.tick_ms).max(2) as usize;
    let heartbeat_tick = (o.heartbeat_ms / o.tick_ms).max(1) as usize;
    let rc = raft::Config {
        id: o.id,
        election_tick,
        heartbeat_tick,
        applied,
        check_quorum: true,
        pre_vote: true,
        max_size_per_msg: 1 << 20,
        max_inflight_msgs: 256,
        ..raft::Config::default()
    };
    let mode = if o.unsafe_lease_based {
        Safeties::raft_lease_based()
    } else {
        Safeties::default()
    };
    let lease = LeaseConfig {
        promise_ms: election_tick as u64 * o.tick_ms,
        drift_ppm: o.drift_ppm,
        margin_ms: o.margin_ms,
        renew_below_pct: 33,
        safeties: mode,
        seed: o.id,
    };
    (rc, lease)
}

/// What connects the raft thread to the transport and the HTTP side.
pub struct Wiring {
    pub inbox: Receiver<Message>,
    pub transport: Transport,
    pub blocked: Blocked,
    pub metrics: Arc<Metrics>,
    pub stop: Arc<AtomicBool>,
}

/// Why a node could not start.
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

impl Runtime {
    /// Rebuild the state from the storage's latest snapshot, and create the node.
    pub fn open(
        opts: NodeOptions,
        storage: DiskStorage,
        wiring: Wiring,
        logger: Logger,
    ) -> Result<(Runtime, Arc<Shared>), StartError> {
        let Wiring {
            inbox,
            transport,
            blocked,
            metrics,
            stop,
        } = wiring;
        let state = match storage.latest_snapshot()? {
            Some(s) => KvState::from_snapshot(&s.data)?,
            None => KvState::new(),
        };
        let snapshot_index = state.applied;
        let (rc, lease) = configs(&opts, state.applied);
        let clock = Arc::new(ScaledClock::new());
        let node = LeaseNode::new(
            &rc,
            storage.clone(),
            lease,
            opts.tick_ms,
            clock.clone(),
            &logger,
        )?;
        let (req_tx, req_rx) = crossbeam_channel::bounded(4096);
        let shared = Arc::new(Shared {
            handle: node.read_handle(),
            clock,
            state: RwLock::new(state),
            status: RwLock::default(),
            metrics,
            requests: req_tx,
            blocked,
            stop,
            opts,
        });
        let next_req = (shared.clock.now_ns() << 8) | shared.opts.id; // unique per boot and node
        let io = KvIo {
            storage,
            shared: shared.clone(),
            transport,
            pending_writes: HashMap::new(),
            snapshot_index,
            logger: logger.clone(),
        };
        let rt = Runtime {
            node,
            io,
            shared: shared.clone(),
            inbox,
            requests: req_rx,
            pending_reads: HashMap::new(),
            next_req,
            takeover_proposed: 0,
            last_expire: Instant::now(),
            was_leader: (false, 0),
            logger,
        };
        Ok((rt, shared))
    }

    /// Run until stopped. A storage failure is fatal: the node stops rather than risk safety,
    /// and the error is returned so that the process exits non-zero.
    pub fn run(mut self) -> Result<(), DiskError> {
        let mut result = Ok(());
        let tick = Duration::from_millis(self.shared.opts.tick_ms);
        let mut next_tick = Instant::now() + tick;
        while !self.shared.stop.load(Ordering::Relaxed) {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            select! {
                recv(self.inbox) -> m => if let Ok(m) = m { self.step(m) },
                recv(self.requests) -> r => if let Ok(r) = r { self.request(r) },
                default(timeout) => {}
            }
            let now = Instant::now();
            if now >= next_tick {
                self.node.tick();
                next_tick = (next_tick + tick).max(now); // missed ticks are dropped, not burst
                self.housekeeping();
            }
            if let Err(e) = self.handle_ready() {
                crit!(self.logger, "storage failed; stopping"; "error" => %e);
                self.shared.stop.store(true, Ordering::Relaxed);
                result = Err(e);
                break;
            }
            self.serve_reads();
            self.publish();
        }
        self.fail_pending("node shutting down");
        info!(self.logger, "raft thread stopped");
        result
    }

    fn step(&mut self, m: Message) {
        let _ = self.node.step(m);
        for _ in 0..256 {
            match self.inbox.try_recv() {
                Ok(m) => {
                    let _ = self.node.step(m);
                }
                Err(_) => break,
            }
        }
    }

    fn request(&mut self, r: Request) {
        match r {
            Request::Write { cmd, value, reply } => self.write(cmd, value, reply),
            Request::Read { key, mode, reply } => match self.node.read(mode) {
                Ok(id) => {
                    self.pending_reads.insert(id, (key, reply));
                }
                Err(ReadError::NotLeader { leader_hint }) => {
                    let _ = reply.send(ReadReply::NotLeader {
                        leader: leader_hint,
                    });
                }
                Err(ReadError::LeaseNotHeld) => {
                    let _ = reply.send(ReadReply::LeaseNotHeld);
                }
            },
            Request::Transfer { to } => self.node.transfer_leader(to),
        }
    }

    fn write(&mut self, mut cmd: Command, value: Vec<u8>, reply: oneshot::Sender<WriteReply>) {
        if !self.node.is_leader() {
            let _ = reply.send(WriteReply::NotLeader {
                leader: self.node.leader_id(),
            });
            return;
        }
        let term = self.node.raw().raft.term;
        let now_ns = self.shared.clock.now_ns();
        let needs_sessions = matches!(
            cmd,
            Command::SessionGrant { .. } | Command::SessionKeepalive { .. } | Command::Lock { .. }
        );
        if needs_sessions && self.shared.state.read().sessions_term != term {
            let _ = reply.send(WriteReply::NotReady);
            return;
        }
        self.next_req += 1;
        let req = self.next_req;
        set_req_and_time(&mut cmd, req, now_ns);
        self.shared.metrics.proposals.inc();
        match self.node.propose(vec![], encode(&cmd, &value)) {
            Ok(()) => {
                self.io.pending_writes.insert(req, reply);
            }
            Err(e) => {
                let _ = reply.send(WriteReply::Unknown(format!("proposal refused: {e}")));
            }
        }
    }

    /// A new leader re-bases sessions on its clock; then it expires sessions whose TTL ran out.
    fn housekeeping(&mut self) {
        if !self.node.is_leader() {
            return;
        }
        let term = self.node.raw().raft.term;
        let now_ns = self.shared.clock.now_ns();
        let (sessions_term, next_expiry) = {
            let s = self.shared.state.read();
            (s.sessions_term, s.sessions.next_expiry_ns())
        };
        let cmd = if sessions_term != term && self.takeover_proposed != term {
            self.takeover_proposed = term;
            Command::Takeover { term, now_ns }
        } else if sessions_term == term
            && next_expiry.is_some_and(|t| t <= now_ns)
            && self.last_expire.elapsed() > Duration::from_millis(100)
        {
            self.last_expire = Instant::now();
            Command::Expire { term, now_ns }
        } else {
            return;
        };
        let _ = self.node.propose(vec![], encode(&cmd, &[]));
    }

    fn handle_ready(&mut self) -> Result<(), DiskError> {
        self.node.handle_ready(&mut self.io)?;
        self.maybe_compact()
    }

    fn maybe_compact(&mut self) -> Result<(), DiskError> {
        let applied = self.shared.state.read().applied;
        let every = self.shared.opts.snapshot_every;
        if applied < self.io.snapshot_index + every {
            return Ok(());
        }
        let data = self.shared.state.read().snapshot();
        self.io.storage.compact(applied, data, every / 10)?;
        self.io.snapshot_index = applied;
        info!(self.logger, "snapshot taken, log compacted"; "index" => applied, "log_entries" => self.io.storage.log_len());
        Ok(())
    }

    fn serve_reads(&mut self) {
        let state = self.shared.state.read();
        let pending = &self.pending_reads;
        let served = self
            .node
            .serve_reads(|id| pending.get(&id).and_then(|(k, _)| state.kv.get(k).cloned()));
        drop(state);
        for s in served {
            let Some((_, reply)) = self.pending_reads.remove(&s.id) else {
                continue;
            };
            let answer = match s.result {
                Ok((stored, kind)) => ReadReply::Value { stored, kind },
                Err(ReadError::NotLeader { leader_hint }) => ReadReply::NotLeader {
                    leader: leader_hint,
                },
                Err(ReadError::LeaseNotHeld) => ReadReply::LeaseNotHeld,
            };
            let _ = reply.send(answer);
        }
    }

    fn publish(&mut self) {
        let (is_leader, term) = (self.node.is_leader(), self.node.raw().raft.term);
        if self.was_leader.0 && (!is_leader || self.was_leader.1 != term) {
            self.fail_pending(
                "leadership lost before the write applied here; it may or may not be applied",
            );
        }
        self.was_leader = (is_leader, term);
        let r = &self.node.raw().raft;
        let ls = self.node.lease_status();
        *self.shared.status.write() = StatusView {
            role: format!("{:?}", r.state).to_lowercase(),
            term: r.term,
            leader_id: self.node.leader_id(),
            commit: r.raft_log.committed,
            applied: r.raft_log.applied,
            last_index: r.raft_log.last_index(),
            lease: Some((ls.state, ls.remaining_ns)),
            counters: self.node.counters(),
            is_leader,
            log_entries: self.io.storage.log_len(),
        };
    }

    fn fail_pending(&mut self, why: &str) {
        for (_, reply) in self.io.pending_writes.drain() {
            let _ = reply.send(WriteReply::Unknown(why.to_string()));
        }
    }
}

impl KvIo {
    fn apply_command(&mut self, e: &Entry) {
        let (cmd, value) = match decode(&e.data) {
            Ok(c) => c,
            Err(err) => {
                // Every replica skips it alike, so the state stays the same everywhere.
                warn!(self.logger, "skipping an undecodable entry"; "index" => e.index, "error" => err);
                self.shared.state.write().applied = e.index;
                return;
            }
        };
        let req = cmd.req();
        let outcome = self.shared.state.write().apply(e.index, cmd, value);
        if let Some(reply) = req.and_then(|r| self.pending_writes.remove(&r)) {
            let _ = reply.send(WriteReply::Done(outcome));
        }
    }
}

impl ReadyIo<DiskStorage, Arc<ScaledClock>> for KvIo {
    type Error = DiskError;

    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            self.transport.send(m);
        }
    }

    fn install_snapshot(&mut self, _: &mut Node, snap: Snapshot) -> Result<(), DiskError> {
        let state = KvState::from_snapshot(&snap.data)?;
        self.storage.apply_snapshot(&snap)?;
        self.snapshot_index = snap.get_metadata().index;
        *self.shared.state.write() = state;
        info!(self.logger, "installed snapshot"; "index" => self.snapshot_index);
        Ok(())
    }

    fn apply(&mut self, node: &mut Node, entries: Vec<Entry>) -> Result<(), DiskError> {
        for e in entries {
            if let Some(cs) = apply_conf_change_entry(node, &e)? {
                self.storage.set_conf_state(&cs)?;
                self.shared.state.write().applied = e.index;
            } else if e.data.is_empty() {
                self.shared.state.write().applied = e.index;
            } else {
                self.apply_command(&e);
            }
        }
        Ok(())
    }

    fn persist(
        &mut self,
        _: &mut Node,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> Result<(), DiskError> {
        self.storage.persist(entries, hs)
    }

    fn set_commit(&mut self, _: &mut Node, commit: u64) -> Result<(), DiskError> {
        self.storage.set_commit(commit)
    }
}

fn set_req_and_time(cmd: &mut Command, new_req: u64, new_now: u64) {
    match cmd {
        Command::Put { req, .. }
        | Command::Delete { req, .. }
        | Command::SessionRevoke { req, .. } => *req = new_req,
        Command::SessionGrant { req, now_ns, .. }
        | Command::SessionKeepalive { req, now_ns, .. }
        | Command::Lock { req, now_ns, .. } => {
            *req = new_req;
            *now_ns = new_now;
        }
        Command::Takeover { .. } | Command::Expire { .. } => {}
    }
}
