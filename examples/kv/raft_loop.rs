//! A raft loop to copy: one thread drives a `LeaseNode` over a durable log, a peer transport and
//! a state machine of your own ([`StateMachine`]), and answers requests from other threads.
//!
//! The KV's own parts (keys, sessions, locks) are in `kv_machine` and `state`; nothing here knows
//! them. What the loop does, per pass:
//! 1. wait for a peer message, a request, a transport report, or the next tick;
//! 2. take **everything** already waiting (peer messages, requests, reports), up to a batch limit:
//!    every pending write is proposed before the next `Ready`, so one fsync covers them all
//!    (group commit);
//! 3. tick if due, and let the state machine propose housekeeping on the leader;
//! 4. process `Ready`s (send, apply, persist: `LeaseNode::handle_ready`), then compact if due;
//! 5. hand back finished reads, and publish the status for the HTTP threads.
//!
//! Lease reads never come here: HTTP workers serve them through the `ReadHandle`. Writes are
//! matched to their entries by (index, term), so an answer is exact even across leaders. When the
//! loop stops, every request still waiting is answered `ShuttingDown`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::RwLock;
use raft::eraftpb::{ConfState, Message, MessageType};
use raft::SnapshotStatus;
use raft_lease::{LeaseConfig, LeaseNode, ReadError, ReadHandle, ReadId, ReadKind, ReadMode};
use slog::{crit, info, warn, Logger};
use tokio::sync::oneshot;

use crate::budget::Ticket;
use crate::clock::ScaledClock;
use crate::members::{Change, ChangeError, Members};
use crate::metrics::Metrics;
use crate::raft_io::{LoopIo, Waiter};
use crate::status::Status;
use crate::storage::{DiskError, DiskStorage};
use crate::transport::{Report, Transport};

/// The node type the loop drives.
pub type Node = LeaseNode<DiskStorage, Arc<ScaledClock>>;

/// The application's replicated state, as the loop sees it.
pub trait StateMachine: Sized + Send + Sync + 'static {
    /// A request to change the state (becomes one raft entry).
    type Command: Send + 'static;
    /// What applying a command produced, for the client waiting on it.
    type Outcome: Send + 'static;
    /// A read of the state.
    type Query: Send + 'static;
    /// A read's answer.
    type Answer: Send + 'static;

    /// The state in `snapshot` (made by [`StateMachine::snapshot`]); an empty state for `&[]`.
    fn restore(snapshot: &[u8]) -> Result<Self, String>;
    /// The whole state, as snapshot data.
    fn snapshot(&self) -> Vec<u8>;
    /// The last raft index applied.
    fn applied(&self) -> u64;
    /// Record that the entry at `index` applied with nothing for the state machine (empty, or a
    /// membership change).
    fn skip(&mut self, index: u64);
    /// Apply the entry at `index`. Deterministic: every replica gets the same state and outcome.
    fn apply(&mut self, index: u64, data: &[u8]) -> Self::Outcome;
    /// Read the state.
    fn query(&self, q: &Self::Query) -> Self::Answer;
    /// On the leader, just before proposing: the entry's data (leader-side facts such as its
    /// clock reading filled in), or why it cannot be proposed now.
    /// A refusal is answered as [`WriteReply::Refused`].
    fn prepare(&self, cmd: Self::Command, at: &Leading) -> Result<Vec<u8>, Self::Outcome>;
    /// On the leader, once per tick with no housekeeping entry in flight: an entry to propose
    /// (the state may note what it proposed, such as a checkpoint in flight).
    fn housekeeping(&mut self, at: &Leading) -> Option<Vec<u8>>;
}

/// The leader's term and clock, for [`StateMachine::prepare`] and housekeeping.
#[derive(Debug, Clone, Copy)]
pub struct Leading {
    /// The leader's term.
    pub term: u64,
    /// The leader's lease clock now.
    pub now_ns: u64,
}

/// A write's answer.
#[derive(Debug)]
pub enum WriteReply<O> {
    /// Committed and applied: the state machine's outcome.
    Done(O),
    /// This node does not lead; `leader` if it knows who does.
    NotLeader {
        /// The leader's id.
        leader: Option<u64>,
    },
    /// Not proposed: the state machine refused it on the leader (not ready yet, say).
    Refused(O),
    /// Not applied, for sure: raft refused it, or another leader's entry took its place.
    NotApplied(String),
    /// Not known: the node stopped, or gave up waiting, before the entry's fate was known.
    Unknown(String),
}

/// A read's answer.
#[derive(Debug)]
pub enum ReadReply<A> {
    /// The state read, and how it was made linearizable.
    Value {
        /// The answer.
        answer: A,
        /// Lease or ReadIndex.
        kind: ReadKind,
    },
    /// This node does not lead.
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// A strict lease read without a lease.
    LeaseNotHeld,
    /// The node stopped before the read was served.
    ShuttingDown,
}

/// A membership change's answer.
#[derive(Debug)]
pub enum MembersReply {
    /// Applied: the configuration now (joint while `voters_outgoing` is not empty; raft leaves
    /// the joint configuration by itself).
    Done {
        /// The configuration after the change.
        conf: ConfState,
        /// The raft index of the change.
        index: u64,
    },
    /// Refused before it reached raft.
    Invalid(ChangeError),
    /// Refused by raft or the lease layer (a change already in progress, a leader removing itself).
    Refused(String),
    /// This node does not lead.
    NotLeader {
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// Not known: the node stopped or leadership changed first.
    Unknown(String),
}

/// Work for the raft thread.
pub enum Request<M: StateMachine> {
    /// Propose a command; the answer comes when it applied. `ticket` holds its bytes meanwhile.
    Propose {
        /// The command.
        cmd: M::Command,
        /// Where to answer.
        reply: oneshot::Sender<WriteReply<M::Outcome>>,
        /// The request's bytes in the in-flight budget.
        ticket: Option<Ticket>,
    },
    /// A read through raft (ReadIndex, or a lease read the HTTP worker could not serve).
    Read {
        /// What to read.
        query: M::Query,
        /// How.
        mode: ReadMode,
        /// Where to answer.
        reply: oneshot::Sender<ReadReply<M::Answer>>,
    },
    /// Change the membership.
    Members {
        /// The changes, as one raft membership change.
        changes: Vec<Change>,
        /// Where to answer.
        reply: oneshot::Sender<MembersReply>,
    },
    /// Hand leadership to `to`.
    Transfer {
        /// The new leader.
        to: u64,
    },
}

/// A peer message and the bytes it holds in the peer budget until it is stepped.
pub struct Inbound {
    /// The message.
    pub msg: Message,
    /// Its bytes in the peer budget.
    pub ticket: Option<Ticket>,
}

/// Who leads, as of the raft thread's last pass (read on every request, so kept in atomics).
#[derive(Debug, Default)]
pub struct Leadership {
    is_leader: AtomicBool,
    /// The leader's id; 0 when none is known.
    leader_id: AtomicU64,
    /// The node's raft term.
    term: AtomicU64,
}

impl Leadership {
    /// (this node leads, the leader it knows of).
    pub fn get(&self) -> (bool, Option<u64>) {
        let id = self.leader_id.load(Ordering::Acquire);
        (
            self.is_leader.load(Ordering::Acquire),
            (id != 0).then_some(id),
        )
    }

    /// The node's raft term, as of the raft thread's last pass.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    fn set(&self, is_leader: bool, leader: Option<u64>, term: u64) {
        self.term.store(term, Ordering::Release);
        self.leader_id.store(leader.unwrap_or(0), Ordering::Release);
        self.is_leader.store(is_leader, Ordering::Release);
    }
}

/// What the loop shares with the HTTP threads.
pub struct Shared<M: StateMachine> {
    /// The state machine: written by the raft thread, read by lease reads.
    pub machine: RwLock<M>,
    /// Who leads, after every pass.
    pub leadership: Leadership,
    /// The node's status: published every tick, and at once when leadership changes.
    pub status: RwLock<Status>,
    /// The address book.
    pub members: Arc<RwLock<Members>>,
    /// Lease reads on any thread.
    pub handle: ReadHandle<Arc<ScaledClock>>,
    /// The lease clock.
    pub clock: Arc<ScaledClock>,
    /// Requests to the raft thread.
    pub requests: Sender<Request<M>>,
}

/// How the loop runs.
#[derive(Debug, Clone, Copy)]
pub struct LoopConfig {
    /// raft's tick interval.
    pub tick_ms: u64,
    /// Snapshot and compact once this many entries applied since the last snapshot; a tenth of
    /// it stays in the log behind the snapshot for followers that lag a little.
    pub snapshot_every: u64,
    /// Most messages, requests or reports taken from one channel in one pass.
    pub max_batch: usize,
    /// Requests queued for the raft thread at most.
    pub queue_len: usize,
    /// Drop peer messages no correct peer sends (see [`admissible`]); off only for a test's control.
    pub admission_checks: bool,
}

/// What the loop is given.
pub struct Wiring {
    /// The raft log store (opened, possibly bootstrapped).
    pub storage: DiskStorage,
    /// The sending side of the peer transport.
    pub transport: Transport,
    /// Peer messages.
    pub inbox: Receiver<Inbound>,
    /// What happened to messages the transport could not deliver.
    pub reports: Receiver<Report>,
    /// The address book the transport and listener share.
    pub members: Arc<RwLock<Members>>,
    /// The lease clock.
    pub clock: Arc<ScaledClock>,
    /// Set to stop the loop.
    pub stop: Arc<AtomicBool>,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

/// A read waiting for raft: what to read, and where to answer.
type PendingRead<M> = (
    <M as StateMachine>::Query,
    oneshot::Sender<ReadReply<<M as StateMachine>::Answer>>,
);

/// The raft thread's own state.
pub struct RaftLoop<M: StateMachine> {
    node: Node,
    io: LoopIo<M>,
    shared: Arc<Shared<M>>,
    inbox: Receiver<Inbound>,
    reports: Receiver<Report>,
    requests: Receiver<Request<M>>,
    reads: HashMap<ReadId, PendingRead<M>>,
    /// The (term, index) of the housekeeping entry in flight: one at a time.
    housekeeping: Option<(u64, u64)>,
    cfg: LoopConfig,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    logger: Logger,
}

/// Why the loop could not start.
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

impl<M: StateMachine> RaftLoop<M> {
    /// Rebuild the state from the storage's latest snapshot, and create the node.
    pub fn open(
        rc: raft::Config,
        lease: LeaseConfig,
        cfg: LoopConfig,
        w: Wiring,
        logger: Logger,
    ) -> Result<(RaftLoop<M>, Arc<Shared<M>>), StartError> {
        let (machine, book) = match w.storage.latest_snapshot()? {
            Some(s) => crate::raft_io::restore::<M>(&s.data)?,
            None => (M::restore(&[])?, None),
        };
        if let Some(book) = book {
            *w.members.write() = book;
        }
        let rc = raft::Config {
            applied: machine.applied(),
            ..rc
        };
        let node = LeaseNode::new(
            &rc,
            w.storage.clone(),
            lease,
            cfg.tick_ms,
            w.clock.clone(),
            &logger,
        )?;
        let (req_tx, req_rx) = crossbeam_channel::bounded(cfg.queue_len);
        let shared = Arc::new(Shared {
            handle: node.read_handle(),
            clock: w.clock,
            machine: RwLock::new(machine),
            leadership: Leadership::default(),
            status: RwLock::default(),
            members: w.members,
            requests: req_tx,
        });
        let io = LoopIo::new(
            w.storage,
            shared.clone(),
            w.transport,
            w.metrics.clone(),
            logger.clone(),
        );
        let l = RaftLoop {
            node,
            io,
            shared: shared.clone(),
            inbox: w.inbox,
            reports: w.reports,
            requests: req_rx,
            reads: HashMap::new(),
            housekeeping: None,
            cfg,
            stop: w.stop,
            metrics: w.metrics,
            logger,
        };
        Ok((l, shared))
    }

    /// Run until stopped. A storage failure is fatal: the node stops rather than risk safety,
    /// and the error is returned so that the process exits non-zero.
    pub fn run(mut self) -> Result<(), DiskError> {
        let tick = Duration::from_millis(self.cfg.tick_ms);
        let mut next_tick = Instant::now() + tick;
        let mut result = Ok(());
        while !self.stop.load(Ordering::Relaxed) {
            self.wait(next_tick.saturating_duration_since(Instant::now()));
            self.drain();
            let now = Instant::now();
            let ticked = now >= next_tick;
            if ticked {
                self.node.tick();
                next_tick = (next_tick + tick).max(now); // missed ticks are dropped, not burst
                self.housekeeping();
                self.io.publish_progress(&self.node);
            }
            if let Err(e) = self.handle_ready() {
                crit!(self.logger, "storage failed; stopping"; "error" => %e);
                self.stop.store(true, Ordering::Relaxed);
                result = Err(e);
                break;
            }
            self.serve_reads();
            self.publish(ticked);
        }
        self.shutdown();
        result
    }

    /// Wait for one thing to do, or until `timeout`.
    fn wait(&mut self, timeout: Duration) {
        select! {
            recv(self.inbox) -> m => if let Ok(m) = m { self.step(m) },
            recv(self.requests) -> r => if let Ok(r) = r { self.request(r) },
            recv(self.reports) -> r => if let Ok(r) = r { self.report(r) },
            default(timeout) => {}
        }
    }

    /// Take everything already waiting, a batch per channel: one `Ready` (one fsync) for all.
    fn drain(&mut self) {
        for _ in 0..self.cfg.max_batch {
            let Ok(m) = self.inbox.try_recv() else { break };
            self.step(m);
        }
        for _ in 0..self.cfg.max_batch {
            let Ok(r) = self.reports.try_recv() else {
                break;
            };
            self.report(r);
        }
        let mut proposed = 0;
        for _ in 0..self.cfg.max_batch {
            let Ok(r) = self.requests.try_recv() else {
                break;
            };
            proposed += matches!(r, Request::Propose { .. }) as u64;
            self.request(r);
        }
        if proposed > 0 {
            self.metrics.batch_sizes.observe(proposed as f64);
        }
    }

    /// Step a peer message, unless it is one no correct peer sends (see [`admissible`]).
    fn step(&mut self, m: Inbound) {
        let checked = match self.cfg.admission_checks {
            true => admissible(&self.node, &m.msg),
            false => Ok(()),
        };
        if let Err(why) = checked {
            self.metrics.peer_inadmissible.inc();
            warn!(self.logger, "peer message dropped"; "why" => why, "from" => m.msg.from,
                  "type" => ?m.msg.get_msg_type(), "term" => m.msg.term);
            return;
        }
        let _ = self.node.step(m.msg); // raft refuses what it must (a removed peer, say)
        drop(m.ticket); // its bytes leave the peer budget once raft has the message
    }

    /// Tell raft what the transport could not deliver.
    fn report(&mut self, r: Report) {
        match r {
            Report::Snapshot { to, delivered } => {
                let status = if delivered {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                };
                self.node.report_snapshot(to, status);
            }
            Report::Unreachable { to } => self.node.report_unreachable(to),
        }
    }

    fn request(&mut self, r: Request<M>) {
        match r {
            Request::Propose { cmd, reply, ticket } => self.propose(cmd, reply, ticket),
            Request::Read { query, mode, reply } => self.read(query, mode, reply),
            Request::Members { changes, reply } => self.change_members(&changes, reply),
            Request::Transfer { to } => self.node.transfer_leader(to),
        }
    }

    fn leading(&self) -> Option<Leading> {
        self.node.is_leader().then(|| Leading {
            term: self.node.raw().raft.term,
            now_ns: raft_lease::Clock::now_ns(&*self.shared.clock),
        })
    }

    fn propose(
        &mut self,
        cmd: M::Command,
        reply: oneshot::Sender<WriteReply<M::Outcome>>,
        ticket: Option<Ticket>,
    ) {
        if reply.is_closed() {
            return; // the client gave up while it was queued: never propose it
        }
        let Some(at) = self.leading() else {
            let _ = reply.send(WriteReply::NotLeader {
                leader: self.node.leader_id(),
            });
            return;
        };
        let data = match self.shared.machine.read().prepare(cmd, &at) {
            Ok(d) => d,
            Err(refusal) => {
                let _ = reply.send(WriteReply::Refused(refusal));
                return;
            }
        };
        self.metrics.proposals.inc();
        match self.propose_entry(data) {
            Ok(index) => self.io.wait(index, at.term, Waiter::Write(reply, ticket)),
            Err(why) => {
                let _ = reply.send(WriteReply::NotApplied(why));
            }
        }
    }

    /// Propose `data`; the index raft gave it.
    fn propose_entry(&mut self, data: Vec<u8>) -> Result<u64, String> {
        let before = self.node.raw().raft.raft_log.last_index();
        self.node
            .propose(vec![], data)
            .map_err(|e| format!("raft refused the proposal: {e}"))?;
        let index = self.node.raw().raft.raft_log.last_index();
        if index == before {
            return Err("raft dropped the proposal".into());
        }
        debug_assert_eq!(index, before + 1);
        Ok(index)
    }

    fn read(
        &mut self,
        query: M::Query,
        mode: ReadMode,
        reply: oneshot::Sender<ReadReply<M::Answer>>,
    ) {
        match self.node.read(mode) {
            Ok(id) => {
                self.reads.insert(id, (query, reply));
            }
            Err(ReadError::NotLeader { leader_hint }) => {
                let _ = reply.send(ReadReply::NotLeader {
                    leader: leader_hint,
                });
            }
            Err(ReadError::LeaseNotHeld) => {
                let _ = reply.send(ReadReply::LeaseNotHeld);
            }
        }
    }

    fn change_members(&mut self, changes: &[Change], reply: oneshot::Sender<MembersReply>) {
        if !self.node.is_leader() {
            let _ = reply.send(MembersReply::NotLeader {
                leader: self.node.leader_id(),
            });
            return;
        }
        let raft = &self.node.raw().raft;
        let cs = raft.prs().conf().to_conf_state();
        if raft.has_pending_conf() || !cs.voters_outgoing.is_empty() {
            let why = "another membership change is in progress; retry when it has applied";
            let _ = reply.send(MembersReply::Refused(why.into()));
            return;
        }
        let (cc, context) = match self.shared.members.read().conf_change(&cs, changes) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(MembersReply::Invalid(e));
                return;
            }
        };
        let term = raft.term;
        let before = raft.raft_log.last_index();
        let mut cc = cc;
        cc.set_context(context.into());
        match self.node.propose_conf_change(vec![], cc) {
            Ok(()) if self.node.raw().raft.raft_log.last_index() > before => {
                let index = self.node.raw().raft.raft_log.last_index();
                info!(self.logger, "membership change proposed"; "index" => index, "changes" => ?changes);
                self.io.wait(index, term, Waiter::Members(reply));
            }
            Ok(()) => {
                let _ = reply.send(MembersReply::Refused("raft dropped the change".into()));
            }
            Err(e) => {
                let _ = reply.send(MembersReply::Refused(e.to_string()));
            }
        }
    }

    /// The state machine's own entries on the leader (sessions' takeover and expiry in the KV),
    /// one in flight at a time.
    fn housekeeping(&mut self) {
        let Some(at) = self.leading() else {
            self.housekeeping = None;
            return;
        };
        let applied = self.node.raw().raft.raft_log.applied;
        if self
            .housekeeping
            .is_some_and(|(term, index)| term == at.term && index > applied)
        {
            return;
        }
        let Some(data) = self.shared.machine.write().housekeeping(&at) else {
            return;
        };
        if let Ok(index) = self.propose_entry(data) {
            self.housekeeping = Some((at.term, index));
        }
    }

    fn handle_ready(&mut self) -> Result<(), DiskError> {
        self.node.handle_ready(&mut self.io)?;
        self.io.maybe_compact(self.cfg.snapshot_every)
    }

    fn serve_reads(&mut self) {
        if self.reads.is_empty() && self.node.pending_reads() == 0 {
            return;
        }
        let machine = self.shared.machine.read();
        let reads = &self.reads;
        let served = self
            .node
            .serve_reads(|id| reads.get(&id).map(|(q, _)| machine.query(q)));
        drop(machine);
        for s in served {
            let Some((_, reply)) = self.reads.remove(&s.id) else {
                continue;
            };
            let answer = match s.result {
                Ok((Some(answer), kind)) => ReadReply::Value { answer, kind },
                Ok((None, _)) => continue, // not ours: unreachable, every read id is ours
                Err(ReadError::NotLeader { leader_hint }) => ReadReply::NotLeader {
                    leader: leader_hint,
                },
                Err(ReadError::LeaseNotHeld) => ReadReply::LeaseNotHeld,
            };
            let _ = reply.send(answer);
        }
    }

    /// Publish who leads after every pass, and the whole status every tick or when that changed.
    fn publish(&mut self, ticked: bool) {
        let (is_leader, term) = (self.node.is_leader(), self.node.raw().raft.term);
        let leader = self.node.leader_id();
        let changed = self.shared.leadership.get() != (is_leader, leader)
            || self.shared.leadership.term() != term;
        self.shared.leadership.set(is_leader, leader, term);
        self.io.on_role(is_leader, term);
        if ticked || changed {
            self.io.publish(&self.node);
        }
    }

    /// Answer everything still waiting: the node is stopping.
    fn shutdown(&mut self) {
        for (_, (_, reply)) in self.reads.drain() {
            let _ = reply.send(ReadReply::ShuttingDown);
        }
        while let Ok(r) = self.requests.try_recv() {
            match r {
                Request::Propose { reply, .. } => {
                    let _ = reply.send(WriteReply::Unknown("the node is stopping".into()));
                }
                Request::Read { reply, .. } => {
                    let _ = reply.send(ReadReply::ShuttingDown);
                }
                Request::Members { reply, .. } => {
                    let _ = reply.send(MembersReply::Unknown("the node is stopping".into()));
                }
                Request::Transfer { .. } => {}
            }
        }
        self.io
            .fail_all("the node is stopping before the entry's fate was known");
        info!(self.logger, "raft thread stopped");
    }
}

/// Whether raft may see `m`. Two kinds of message no correct peer sends are dropped, because
/// raft-rs trusts them: a heartbeat whose commit index is past this node's log (raft-rs panics
/// on it), and an append, heartbeat or snapshot in this node's current term from a node that
/// is not the leader it knows for that term.
pub fn admissible(node: &Node, m: &Message) -> Result<(), &'static str> {
    let r = &node.raw().raft;
    let from_leader = matches!(
        m.get_msg_type(),
        MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
    );
    if m.get_msg_type() == MessageType::MsgHeartbeat && m.commit > r.raft_log.last_index() {
        return Err("a heartbeat's commit index is past the local log");
    }
    if from_leader && m.term == r.term && r.leader_id != 0 && m.from != r.leader_id {
        return Err("a leader's message from a node that does not lead this term");
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use raft_lease::ctx::{LayerCtx, Promised};

    /// Heartbeat acknowledgement contexts a peer may send: a follower's acknowledgement with the
    /// promise it made (25 bytes), the bare context of an older build, and garbage around both.
    pub(crate) fn ack_contexts() -> Vec<Vec<u8>> {
        let promised = Promised {
            promise_ns: 300_000_000,
            drift_ppm: 100_000,
        };
        let ack = LayerCtx::Round(7).encode_ack(promised);
        assert_eq!(ack.len(), 25);
        let absurd = Promised {
            promise_ns: u64::MAX,
            drift_ppm: u32::MAX,
        };
        let mut odd_kind = ack.clone();
        odd_kind[12] = b'x';
        vec![
            ack.clone(),
            LayerCtx::Read(u64::MAX).encode_ack(absurd),
            LayerCtx::Round(1).encode_ack(Promised {
                promise_ns: 0,
                drift_ppm: 0,
            }),
            LayerCtx::Round(7).encode(),
            odd_kind,
            ack[..24].to_vec(),
            [ack.clone(), vec![0]].concat(),
            vec![0xa5; 25],
            vec![0xff; 64 << 10],
            Vec::new(),
        ]
    }

    /// A follower (node 1 of voters 1, 2, 3) on a fresh data dir, as the KV makes one.
    fn follower() -> (tempfile::TempDir, Node) {
        let dir = tempfile::tempdir().unwrap();
        let mut boot = raft::eraftpb::Snapshot::default();
        (boot.mut_metadata().index, boot.mut_metadata().term) = (1, 1);
        boot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        let storage = DiskStorage::create(dir.path(), Some(&boot), 1).unwrap();
        let rc = raft::Config {
            id: 1,
            election_tick: 10,
            heartbeat_tick: 1,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        };
        let lease = LeaseConfig {
            promise_ms: 100,
            ..LeaseConfig::default()
        };
        let clock = Arc::new(ScaledClock::new());
        let log = Logger::root(slog::Discard, slog::o!());
        let node = LeaseNode::new(&rc, storage, lease, 10, clock, &log).unwrap();
        (dir, node)
    }

    #[test]
    fn heartbeat_acknowledgements_with_a_promise_or_garbage_pass_the_filter_harmlessly() {
        let (_dir, mut node) = follower();
        for ctx in ack_contexts() {
            let mut m = Message {
                from: 2,
                to: 1,
                term: node.raw().raft.term,
                ..Default::default()
            };
            m.set_msg_type(MessageType::MsgHeartbeatResponse);
            m.context = ctx.clone().into();
            assert_eq!(admissible(&node, &m), Ok(()), "{} bytes", ctx.len());
            let _ = node.step(m); // an error is fine; a panic or a change of role is not
            assert_eq!(node.raw().raft.state, raft::StateRole::Follower);
        }
    }
}
