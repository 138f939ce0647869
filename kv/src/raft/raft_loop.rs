//! A raft loop to copy: one thread drives a `LeaseNode` over a durable log, a peer transport and
//! a state machine of your own ([`StateMachine`]), and answers requests from other threads.
//!
//! The KV's own parts (keys, sessions, locks) are in `state`; nothing here knows
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use parking_lot::RwLock;
use raft::SnapshotStatus;
use raft_lease::{LeaseConfig, LeaseNode, ReadError, ReadId, ReadMode};
use slog::{crit, info, warn, Logger};
use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::base::clock::ScaledClock;
use crate::base::metrics::Metrics;
use crate::disk::storage::{DiskError, DiskStorage};
use crate::peer::listen::Inbound;
use crate::peer::members::{Change, Members};
use crate::peer::transport::{Report, Transport};
use crate::raft::admission::admissible;
use crate::raft::machine::{Leading, Node, StateMachine};
use crate::raft::raft_io::{LoopIo, Waiter};
use crate::raft::requests::{MembersReply, ReadReply, Request, WriteReply};
use crate::raft::shared::{Leadership, Shared};
use crate::raft::snapshot::restore;

/// How the loop runs.
#[derive(Debug, Clone, Copy)]
pub struct LoopConfig {
    /// raft's tick interval.
    pub tick_ms: u64,
    /// Snapshot and compact once this many entries applied since the last snapshot (see
    /// `LoopIo::maybe_compact`, which also cuts after as many bytes of entries as the last
    /// snapshot held, and keeps up to 1,000 entries and about 16 MiB behind the snapshot for
    /// followers that lag a little).
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
    /// When the oldest append with entries stepped in this pass arrived, on a follower: the time
    /// from its arrival to its answer leaving is measured once the pass's `Ready` is handled.
    append_arrived: Option<Instant>,
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
            Some(s) => restore::<M>(&s.data)?,
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
            append_arrived: None,
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
            if let Some(t) = self.append_arrived.take() {
                let turnaround = t.elapsed().as_secs_f64();
                self.metrics.append_turnaround_seconds.observe(turnaround);
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
        let append = m.msg.get_msg_type() == raft::eraftpb::MessageType::MsgAppend;
        if append && !m.msg.entries.is_empty() {
            let oldest = self
                .append_arrived
                .map_or(m.received_at, |t| t.min(m.received_at));
            self.append_arrived = Some(oldest);
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
            Request::Propose {
                cmd,
                reply,
                ticket,
                sent_at,
            } => {
                let queued = sent_at.elapsed().as_secs_f64();
                self.metrics.write_queue_seconds.observe(queued);
                self.propose(cmd, reply, ticket)
            }
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
