//! A raft loop to copy: one thread drives every group of the node (a `MultiNode`) over one
//! durable log engine, one peer transport and a state machine of your own per group
//! ([`StateMachine`]), and answers requests from other threads.
//!
//! The KV's own parts (keys, sessions, locks) are in `state`; nothing here knows them. What the
//! loop does, per pass:
//! 1. wait for a peer batch, a request, a transport report, or the next tick;
//! 2. take **everything** already waiting (peer batches, requests, reports), up to a batch limit:
//!    every pending write of every group is proposed before the next `Ready`s, so one fsync
//!    covers them all (group commit, across groups);
//! 3. tick if due, and let group 0's state machine propose housekeeping on its leader;
//! 4. process every touched group's `Ready` (`MultiNode::handle_ready_and_send`): what may leave
//!    at once goes to the transport (a leader's appends overlap its own fsync), then one fsync
//!    for every group, then what waited for it; then compact groups that are due;
//! 5. hand back finished reads, and publish who leads each touched group for the HTTP threads.
//!
//! Lease reads never come here: HTTP workers serve them through each group's `ReadHandle`.
//! Writes are matched to their entries by (index, term), so an answer is exact even across
//! leaders. When the loop stops, every request still waiting is answered `ShuttingDown`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use parking_lot::RwLock;
use raft::eraftpb::{Entry, HardState, Snapshot};
use raft::SnapshotStatus;
use raft_lease::multi::{GroupId, MultiApp, MultiConfig, MultiNode, NodeBatch};
use raft_lease::{ReadError, ReadId, ReadMode};
use slog::{crit, info, warn, Logger};
use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::base::clock::ScaledClock;
use crate::base::disk_stall::DiskStall;
use crate::base::metrics::Metrics;
use crate::disk::storage::{DiskError, DiskStorage};
use crate::peer::listen::Inbound;
use crate::peer::members::{Change, Members};
use crate::peer::transport::{Report, Transport};
use crate::raft::admission::admissible;
use crate::raft::balance::Balance;
use crate::raft::following::Following;
use crate::raft::machine::{Leading, Node, StateMachine};
use crate::raft::raft_io::{LoopIo, Waiter};
use crate::raft::requests::{MembersReply, ReadReply, Request, Routed, WriteReply};
use crate::raft::shared::{Groups, Shared};
use crate::raft::snapshot::split;

/// Every group of the node.
pub type Multi = MultiNode<DiskStorage, Arc<ScaledClock>>;

/// Group `gid`'s state as the state engine holds it, agreed with its raft log `storage`: an
/// install a crash left half done is settled, the log's bootstrap snapshot (an empty state at
/// index 1) is taken in, and the log's commit index is raised to what the state applied. The
/// envelope of the log's last snapshot (the address book and the configuration followed).
fn open_state<M: StateMachine>(
    engine: &crate::disk::state_engine::StateEngine,
    gid: GroupId,
    storage: &DiskStorage,
) -> Result<(M, Option<crate::raft::snapshot::Envelope>), StartError> {
    let mut machine = M::open(engine.clone(), gid)?;
    let snap = storage.latest_snapshot()?;
    let (snap_index, env, stream) = match &snap {
        Some(s) => {
            let (env, stream) = split(&s.data)?;
            (s.get_metadata().index, Some(env), stream)
        }
        None => (0, None, &[][..]),
    };
    machine.settle(snap_index)?;
    let first = raft::Storage::first_index(storage)?;
    if machine.applied() + 1 < first {
        // The log no longer holds the entries after the state: only its own snapshot may
        // bridge the gap (the cluster's bootstrap, an empty state at index 1).
        if snap_index > 1 && stream.is_empty() {
            return Err(format!(
                "group {gid}: the state engine is at index {} but the raft log begins at {first} \
                 (cut at its snapshot at {snap_index}): the entries between are gone; the data \
                 dir is damaged (restore it from a backup, or remove the node and add it back \
                 on a new dir)",
                machine.applied()
            )
            .into());
        }
        let id = machine.stage(stream, snap_index)?;
        machine.install_staged(id)?;
    }
    let last = raft::Storage::last_index(storage)?;
    if machine.applied() > last {
        return Err(format!(
            "group {gid}: the state engine applied up to {} but the raft log ends at {last}; \
             the data dir is damaged",
            machine.applied()
        )
        .into());
    }
    storage.set_commit(machine.applied())?; // applied entries were committed
    Ok((machine, env))
}

/// How often the state engine is made durable while groups apply (one fsync of its journal for
/// every group): the raft log keeps what was applied since, for a restart to replay.
const PERSIST_EVERY: Duration = Duration::from_millis(100);

/// With every group quiescent (shared liveness, nothing to do), the loop ticks this many times
/// less often: a tick then only runs the support session (heartbeats every third of the promise,
/// withdrawals of support that ran out), for which a few tens of milliseconds do not matter, and
/// any message, request or read wakes the loop at once as always.
const QUIET_TICKS: u32 = 5;

/// How the loop runs.
#[derive(Debug, Clone, Copy)]
pub struct LoopConfig {
    /// raft's tick interval.
    pub tick_ms: u64,
    /// Snapshot and compact a group once this many entries applied since its last snapshot (see
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
    /// Hand leaderships above this node's share to the node leading the fewest groups (see
    /// `balance`).
    pub balance_leaders: bool,
    /// Follower read leases are on: the loop also wakes when a read lease a group granted ends
    /// (writes held back for it go on then, not at the next tick).
    pub follower_leases: bool,
    /// Negative control (tests only): the raft log is cut up to the applied index, past what
    /// the state engine made durable.
    pub unsafe_cut_past_durable: bool,
}

/// What the loop is given.
pub struct Wiring {
    /// Every group's raft log store (opened, possibly bootstrapped), group `g` at `g`; all on one
    /// engine.
    pub storages: Vec<DiskStorage>,
    /// The state engine every group's state machine lives in.
    pub state: crate::disk::state_engine::StateEngine,
    /// Where views of the state described to raft wait for the transport to stream them.
    pub views: Arc<crate::peer::snapshot_send::SnapshotViews>,
    /// How the node hosts its groups (its id, incarnation, liveness mode, raft and lease configs).
    pub multi: MultiConfig,
    /// The sending side of the peer transport.
    pub transport: Transport,
    /// Peer batches.
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
    /// The stalled-disk fault: syncs of the log wait while it is set.
    pub disk_stall: Arc<DiskStall>,
}

/// A read waiting for raft: what to read, and where to answer.
type PendingRead<M> = (
    <M as StateMachine>::Query,
    oneshot::Sender<ReadReply<<M as StateMachine>::Answer>>,
);

/// One group's part of the loop.
struct GroupLoop<M: StateMachine> {
    io: LoopIo<M>,
    shared: Arc<Shared<M>>,
    reads: HashMap<ReadId, PendingRead<M>>,
    /// The (term, index) of the housekeeping entry in flight: one at a time.
    housekeeping: Option<(u64, u64)>,
}

/// The raft thread's own state.
pub struct RaftLoop<M: StateMachine> {
    multi: Multi,
    /// Group `g` at `g`.
    groups: Vec<GroupLoop<M>>,
    /// Group 0's store: syncing it syncs the engine every group shares.
    store: DiskStorage,
    disk_stall: Arc<DiskStall>,
    transport: Transport,
    inbox: Receiver<Inbound>,
    reports: Receiver<Report>,
    requests: Receiver<Routed<M>>,
    /// Groups stepped, asked or reported on in this pass: their leadership is published.
    touched: BTreeSet<GroupId>,
    /// Groups with reads waiting for raft.
    reading: BTreeSet<GroupId>,
    /// Moving the groups led here to group 0's configuration.
    following: Following,
    /// Spreading leaders over the nodes.
    balance: Balance,
    /// The state engine of every group.
    state: crate::disk::state_engine::StateEngine,
    /// Groups that applied since the state engine was last made durable, and when it was.
    undurable: BTreeSet<GroupId>,
    persisted_at: Instant,
    /// What the HTTP threads see of every group.
    shared: Arc<Groups<M>>,
    /// When the oldest append with entries stepped in this pass arrived, on a follower: the time
    /// from its arrival to its answer leaving is measured once the pass's `Ready`s are handled.
    append_arrived: Option<Instant>,
    cfg: LoopConfig,
    stop: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    logger: Logger,
}

/// Why the loop could not start.
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

/// The node's `Ready` I/O: each group's own, and one sync for all.
struct Apps<'a, M: StateMachine> {
    groups: &'a mut [GroupLoop<M>],
    /// Groups that applied since the state engine was made durable.
    undurable: &'a mut BTreeSet<GroupId>,
    store: &'a DiskStorage,
    disk_stall: &'a DiskStall,
    /// Time spent writing since the last sync, if anything was written: with the sync, the
    /// log's time per round (an engine that defers syncs spends it in the sync; redb in the
    /// writes).
    writing: Option<Duration>,
    metrics: &'a Metrics,
}

impl<M: StateMachine> Apps<'_, M> {
    fn io(&mut self, group: GroupId) -> &mut LoopIo<M> {
        &mut self.groups[group as usize].io
    }
}

impl<M: StateMachine> MultiApp<DiskStorage, Arc<ScaledClock>> for Apps<'_, M> {
    type Error = DiskError;

    fn install_snapshot(&mut self, g: GroupId, n: &mut Node, s: Snapshot) -> Result<(), DiskError> {
        self.io(g).install_snapshot(n, s)
    }

    fn apply(&mut self, g: GroupId, n: &mut Node, entries: Vec<Entry>) -> Result<(), DiskError> {
        self.undurable.insert(g);
        self.io(g).apply(n, entries)?;
        if self.io(g).take_unsynced() {
            self.writing.get_or_insert_default(); // a configuration written: this round syncs
        }
        Ok(())
    }

    fn persist(
        &mut self,
        g: GroupId,
        _: &mut Node,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> Result<(), DiskError> {
        let t = Instant::now();
        if self.io(g).persist(entries, hs)? {
            self.writing = Some(self.writing.unwrap_or_default() + t.elapsed());
        }
        Ok(())
    }

    fn set_commit(&mut self, g: GroupId, _: &mut Node, commit: u64) -> Result<(), DiskError> {
        self.io(g).set_commit(commit)
    }

    fn sync(&mut self) -> Result<(), DiskError> {
        let Some(writing) = self.writing.take() else {
            return Ok(());
        };
        let t = Instant::now();
        self.disk_stall.wait();
        self.store.sync()?;
        let took = writing + t.elapsed();
        self.metrics.persist_seconds.observe(took.as_secs_f64());
        Ok(())
    }
}

impl<M: StateMachine> RaftLoop<M> {
    /// Rebuild every group's state from its latest snapshot, and host the groups.
    pub fn open(
        cfg: LoopConfig,
        w: Wiring,
        logger: Logger,
    ) -> Result<(RaftLoop<M>, Arc<Groups<M>>), StartError> {
        assert!(!w.storages.is_empty(), "a node hosts at least one group");
        let store = w.storages[0].clone();
        let mut multi = MultiNode::new(w.multi, std::iter::empty(), w.clock.clone(), &logger)?;
        multi.set_entry_keys(M::entry_keys);
        let (req_tx, req_rx) = crossbeam_channel::bounded(cfg.queue_len);
        let mut groups = Vec::with_capacity(w.storages.len());
        for (gid, storage) in w.storages.into_iter().enumerate() {
            let gid = gid as GroupId;
            let (machine, env) = open_state::<M>(&w.state, gid, &storage)?;
            let follows = env.as_ref().map_or(0, |env| env.follows);
            if let (Some(env), 0) = (env, gid) {
                *w.members.write() = env.book; // the address book is group 0's
            }
            multi.add_group_applied(gid, storage.clone(), machine.applied())?;
            let handle = multi.group(gid).expect("just added").read_handle();
            let shared = Arc::new(Shared::new(
                gid,
                machine,
                handle,
                w.members.clone(),
                w.clock.clone(),
                req_tx.clone(),
            ));
            let log = logger.new(slog::o!("group" => gid));
            let views = w.views.clone();
            let metrics = w.metrics.clone();
            let mut io = LoopIo::new(storage, follows, shared.clone(), views, metrics, log)?;
            io.unsafe_cut_past_durable = cfg.unsafe_cut_past_durable;
            groups.push(GroupLoop {
                io,
                shared,
                reads: HashMap::new(),
                housekeeping: None,
            });
        }
        let all = groups.iter().map(|g| g.shared.clone()).collect();
        let shared = Arc::new(Groups {
            all,
            awake: Default::default(),
            behind: Default::default(),
        });
        let l = RaftLoop {
            multi,
            groups,
            store,
            disk_stall: w.disk_stall,
            transport: w.transport,
            inbox: w.inbox,
            reports: w.reports,
            requests: req_rx,
            touched: BTreeSet::new(),
            reading: BTreeSet::new(),
            following: Default::default(),
            balance: Balance::new(cfg.balance_leaders),
            state: w.state.clone(),
            undurable: BTreeSet::new(),
            persisted_at: Instant::now(),
            append_arrived: None,
            cfg,
            stop: w.stop,
            metrics: w.metrics,
            shared: shared.clone(),
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
            let grant_ends = self.grant_ends();
            let wake = grant_ends.map_or(next_tick, |at| at.min(next_tick));
            self.wait(wake.saturating_duration_since(Instant::now()));
            self.drain();
            if grant_ends.is_some_and(|at| Instant::now() >= at) {
                self.multi.wake_due(); // before then no grant has ended
            }
            let now = Instant::now();
            let ticked = now >= next_tick;
            if ticked {
                self.multi.tick();
                let quiet = self.multi.awake_groups().next().is_none();
                let step = if quiet { tick * QUIET_TICKS } else { tick };
                next_tick = (next_tick + step).max(now); // missed ticks are dropped, not burst
                self.housekeeping();
                self.follow_group_0();
                let groups = self.groups.len();
                self.balance
                    .tick(&mut self.multi, groups, &mut self.touched);
                self.groups[0]
                    .io
                    .publish_progress(self.multi.group(0).expect("group 0"));
                if let Err(e) = self.upkeep() {
                    crit!(self.logger, "state engine failed; stopping"; "error" => %e);
                    self.stop.store(true, Ordering::Relaxed);
                    result = Err(e);
                    break;
                }
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
            if next_tick > Instant::now() + tick && self.multi.awake_groups().next().is_some() {
                next_tick = Instant::now() + tick; // a group woke: tick it at the usual pace
            }
        }
        self.shutdown();
        result
    }

    /// With follower leases, when the next read lease a group here granted ends (see
    /// `MultiNode::next_wake_ns`). With a lease clock rate set for a test, the wake-up comes
    /// somewhat early (the loop then waits again) or late (never later than the next tick).
    fn grant_ends(&self) -> Option<Instant> {
        if !self.cfg.follower_leases {
            return None;
        }
        let at_ns = self.multi.next_wake_ns()?;
        let now_ns = raft_lease::Clock::now_ns(self.multi.clock());
        Some(Instant::now() + Duration::from_nanos(at_ns.saturating_sub(now_ns)))
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

    /// Take everything already waiting, a batch per channel: one fsync for all.
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
            proposed += matches!(r.req, Request::Propose { .. }) as u64;
            self.request(r);
        }
        if proposed > 0 {
            self.metrics.batch_sizes.observe(proposed as f64);
        }
    }

    /// Step a peer batch: each raft message checked just before it is stepped (one that no
    /// correct peer sends, see [`admissible`], is dropped: an earlier message of the same batch
    /// may have changed what is admissible), and nothing of a group not hosted here.
    fn step(&mut self, m: Inbound) {
        let Inbound {
            mut batch,
            ticket,
            received_at,
        } = m;
        let (from, to) = (batch.from, batch.to);
        let multi = &self.multi;
        batch.fortify.retain(|f| multi.group(f.group()).is_some());
        self.touched.extend(batch.fortify.iter().map(|f| f.group()));
        let one = |m| NodeBatch {
            from,
            to,
            raft: vec![m],
            ..NodeBatch::default()
        };
        for (gid, msg) in std::mem::take(&mut batch.raft) {
            if let Err(why) = self.admit(gid, &msg) {
                self.metrics.peer_inadmissible.inc();
                warn!(self.logger, "peer message dropped"; "why" => why, "group" => gid,
                      "from" => msg.from, "type" => ?msg.get_msg_type(), "term" => msg.term);
                continue;
            }
            self.touched.insert(gid);
            let append = msg.get_msg_type() == raft::eraftpb::MessageType::MsgAppend;
            if append && !msg.entries.is_empty() {
                let oldest = self
                    .append_arrived
                    .map_or(received_at, |t| t.min(received_at));
                self.append_arrived = Some(oldest);
            }
            self.multi.step(one((gid, msg))); // raft refuses what it must (a removed peer, say)
        }
        // The support session and fortification after the raft messages they came with: a new
        // leader's first append makes it known before its request to fortify is judged.
        self.multi.step(batch);
        drop(ticket); // its bytes leave the peer budget once raft has the batch
    }

    /// Whether raft message `msg` of group `gid` may be stepped now.
    fn admit(&self, gid: GroupId, msg: &raft::eraftpb::Message) -> Result<(), &'static str> {
        match (self.multi.group(gid), self.cfg.admission_checks) {
            (None, _) => Err("a message for a group not hosted here"),
            (Some(node), true) => admissible(node, msg),
            (Some(_), false) => Ok(()),
        }
    }

    /// Tell raft what the transport could not deliver.
    fn report(&mut self, r: Report) {
        match r {
            Report::Snapshot {
                group,
                to,
                delivered,
            } => {
                let status = match delivered {
                    true => SnapshotStatus::Finish,
                    false => SnapshotStatus::Failure,
                };
                self.multi.report_snapshot(group, to, status);
            }
            Report::Unreachable { group, to } => self.multi.report_unreachable(group, to),
        }
    }

    fn request(&mut self, r: Routed<M>) {
        let Routed { group, req } = r;
        if self.multi.group(group).is_none() {
            return refuse_unhosted(req);
        }
        self.touched.insert(group);
        match req {
            Request::Propose {
                cmd,
                reply,
                ticket,
                sent_at,
            } => {
                let queued = sent_at.elapsed().as_secs_f64();
                self.metrics.write_queue_seconds.observe(queued);
                self.propose(group, cmd, reply, ticket)
            }
            Request::Read { query, mode, reply } => self.read(group, query, mode, reply),
            Request::Members { changes, reply } => self.change_members(group, &changes, reply),
            Request::Transfer { to } => self.multi.transfer_leader(group, to),
        }
    }

    fn node(&self, group: GroupId) -> &Node {
        self.multi.group(group).expect("a hosted group")
    }

    fn leading(&self, group: GroupId) -> Option<Leading> {
        let node = self.node(group);
        node.is_leader().then(|| Leading {
            term: node.raw().raft.term,
            now_ns: raft_lease::Clock::now_ns(&*self.groups[group as usize].shared.clock),
        })
    }

    fn propose(
        &mut self,
        group: GroupId,
        cmd: M::Command,
        reply: oneshot::Sender<WriteReply<M::Outcome>>,
        ticket: Option<Ticket>,
    ) {
        if reply.is_closed() {
            return; // the client gave up while it was queued: never propose it
        }
        let Some(at) = self.leading(group) else {
            let leader = self.node(group).leader_id();
            let _ = reply.send(WriteReply::NotLeader { leader });
            return;
        };
        let g = &self.groups[group as usize];
        let data = match g.shared.machine.read().prepare(cmd, &at) {
            Ok(d) => d,
            Err(refusal) => {
                let _ = reply.send(WriteReply::Refused(refusal));
                return;
            }
        };
        self.metrics.proposals.inc();
        match self.propose_entry(group, data) {
            Ok(index) => {
                let w = Waiter::Write(reply, ticket);
                self.groups[group as usize].io.wait(index, at.term, w)
            }
            Err(why) => {
                let _ = reply.send(WriteReply::NotApplied(why));
            }
        }
    }

    /// Propose `data` in `group`; the index raft gave it.
    fn propose_entry(&mut self, group: GroupId, data: Vec<u8>) -> Result<u64, String> {
        let before = self.node(group).raw().raft.raft_log.last_index();
        self.multi
            .propose(group, data)
            .map_err(|e| format!("raft refused the proposal: {e}"))?;
        let index = self.node(group).raw().raft.raft_log.last_index();
        if index == before {
            return Err("raft dropped the proposal".into());
        }
        debug_assert_eq!(index, before + 1);
        Ok(index)
    }

    fn read(
        &mut self,
        group: GroupId,
        query: M::Query,
        mode: ReadMode,
        reply: oneshot::Sender<ReadReply<M::Answer>>,
    ) {
        match self.multi.read(group, mode) {
            Ok(id) => {
                self.groups[group as usize].reads.insert(id, (query, reply));
                self.reading.insert(group);
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

    fn change_members(
        &mut self,
        group: GroupId,
        changes: &[Change],
        reply: oneshot::Sender<MembersReply>,
    ) {
        let node = self.node(group);
        if !node.is_leader() {
            let leader = node.leader_id();
            let _ = reply.send(MembersReply::NotLeader { leader });
            return;
        }
        let behind = self.groups_behind();
        if behind > 0 {
            let why = format!(
                "{behind} groups here do not follow the last membership change yet; retry when \
                 /status groups_behind_membership is 0"
            );
            let _ = reply.send(MembersReply::Refused(why));
            return;
        }
        let raft = &self.node(group).raw().raft;
        let cs = raft.prs().conf().to_conf_state();
        if raft.has_pending_conf() || !cs.voters_outgoing.is_empty() {
            let why = "another membership change is in progress; retry when it has applied";
            let _ = reply.send(MembersReply::Refused(why.into()));
            return;
        }
        if self.groups.len() > 1 && !keeps_a_quorum(&cs.voters, changes) {
            let why = "with many groups, one change may take out only a minority of the voters \
                       (the other groups still need a quorum of them to follow): split it";
            let _ = reply.send(MembersReply::Refused(why.into()));
            return;
        }
        let (mut cc, context) = match self.groups[0]
            .shared
            .members
            .read()
            .conf_change(&cs, changes)
        {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(MembersReply::Invalid(e));
                return;
            }
        };
        let (term, before) = (raft.term, raft.raft_log.last_index());
        cc.set_context(context.into());
        match self.multi.propose_conf_change(group, cc) {
            Ok(()) if self.node(group).raw().raft.raft_log.last_index() > before => {
                let index = self.node(group).raw().raft.raft_log.last_index();
                info!(self.logger, "membership change proposed"; "group" => group,
                      "index" => index, "changes" => ?changes);
                let w = Waiter::Members(reply);
                self.groups[group as usize].io.wait(index, term, w);
            }
            Ok(()) => {
                let _ = reply.send(MembersReply::Refused("raft dropped the change".into()));
            }
            Err(e) => {
                let _ = reply.send(MembersReply::Refused(e.to_string()));
            }
        }
    }

    /// Move the groups led here towards group 0's configuration, and publish how many are
    /// behind it.
    fn follow_group_0(&mut self) {
        let Some(target) = self.groups[0].shared.members.read().conf.clone() else {
            return;
        };
        let groups = &self.groups;
        let follows = |g: GroupId| groups[g as usize].io.follows();
        let (multi, touched) = (&mut self.multi, &mut self.touched);
        if let Some(n) = self
            .following
            .tick(multi, &target, &follows, touched, &self.logger)
        {
            self.shared.behind.store(n, Ordering::Relaxed);
        }
    }

    /// Groups hosted here that do not follow group 0's configuration yet, counted now (a
    /// membership change waits until there are none, so that changes reach every group one at
    /// a time).
    fn groups_behind(&mut self) -> u64 {
        let Some(target) = self.groups[0].shared.members.read().conf.clone() else {
            return 0;
        };
        let groups = &self.groups;
        let follows = |g: GroupId| groups[g as usize].io.follows();
        let n = self.following.count_behind(&self.multi, &target, &follows);
        self.shared.behind.store(n, Ordering::Relaxed);
        n
    }

    /// Group 0's state machine's own entries on its leader (sessions' takeover and expiry in the
    /// KV; sessions live in group 0), one in flight at a time.
    fn housekeeping(&mut self) {
        let Some(at) = self.leading(0) else {
            self.groups[0].housekeeping = None;
            return;
        };
        let applied = self.node(0).raw().raft.raft_log.applied;
        let g = &mut self.groups[0];
        if g.housekeeping
            .is_some_and(|(term, index)| term == at.term && index > applied)
        {
            return;
        }
        let Some(data) = g.shared.machine.write().housekeeping(&at) else {
            return;
        };
        if let Ok(index) = self.propose_entry(0, data) {
            self.groups[0].housekeeping = Some((at.term, index));
            self.touched.insert(0);
        }
    }

    /// On a tick: make the state engine durable if groups applied since it last was (one fsync
    /// for all), and a bounded step of its upkeep (what compactions and replaced states left).
    fn upkeep(&mut self) -> Result<(), DiskError> {
        if !self.undurable.is_empty() && self.persisted_at.elapsed() >= PERSIST_EVERY {
            self.state.persist()?;
            for gid in std::mem::take(&mut self.undurable) {
                self.groups[gid as usize]
                    .shared
                    .machine
                    .write()
                    .mark_durable();
            }
            self.persisted_at = Instant::now();
        }
        self.groups[0].shared.machine.write().tidy()?;
        Ok(())
    }

    fn handle_ready(&mut self) -> Result<(), DiskError> {
        let mut apps = Apps {
            undurable: &mut self.undurable,
            groups: &mut self.groups,
            store: &self.store,
            disk_stall: &self.disk_stall,
            writing: None,
            metrics: &self.metrics,
        };
        let transport = &mut self.transport;
        self.multi
            .handle_ready_and_send(&mut apps, &mut |b| transport.send(b))?;
        apps.sync()?; // a configuration applied after the round's sync (a light `Ready`)
        for &gid in &self.touched {
            let io = &mut self.groups[gid as usize].io;
            if io.maybe_compact(self.cfg.snapshot_every)? {
                self.disk_stall.cut_done();
            }
        }
        Ok(())
    }

    fn serve_reads(&mut self) {
        for gid in std::mem::take(&mut self.reading) {
            let g = &mut self.groups[gid as usize];
            let machine = g.shared.machine.read();
            let reads = &g.reads;
            let served = self
                .multi
                .serve_reads(gid, |id| reads.get(&id).map(|(q, _)| machine.query(q)));
            drop(machine);
            for s in served {
                let Some((_, reply)) = g.reads.remove(&s.id) else {
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
            if !g.reads.is_empty() {
                self.reading.insert(gid);
            }
        }
    }

    /// Publish who leads every group touched in this pass (and, on a tick, every group ticked:
    /// a quiescent group's leadership moves only with a message, which touches it), and group
    /// 0's whole status every tick or when its leadership changed.
    fn publish(&mut self, ticked: bool) {
        let mut gids = std::mem::take(&mut self.touched);
        if ticked {
            gids.extend(self.multi.awake_groups());
            gids.insert(0);
            let awake = self.multi.awake_groups().count() as u64;
            self.shared
                .awake
                .store(awake, std::sync::atomic::Ordering::Relaxed);
        }
        for gid in gids {
            let node = self.multi.group(gid).expect("a hosted group");
            let g = &mut self.groups[gid as usize];
            let (is_leader, term) = (node.is_leader(), node.raw().raft.term);
            let leader = node.leader_id();
            let leadership = &g.shared.leadership;
            let changed = leadership.get() != (is_leader, leader) || leadership.term() != term;
            leadership.set(is_leader, leader, term);
            g.io.on_role(is_leader, term);
            if changed && is_leader {
                self.following.led(gid);
            }
            if g.io.take_conf_changed() || (gid == 0 && ticked) || changed {
                g.io.publish(node);
            }
        }
    }

    /// Answer everything still waiting: the node is stopping.
    fn shutdown(&mut self) {
        for g in &mut self.groups {
            for (_, (_, reply)) in g.reads.drain() {
                let _ = reply.send(ReadReply::ShuttingDown);
            }
        }
        while let Ok(r) = self.requests.try_recv() {
            answer_stopping(r.req);
        }
        for g in &mut self.groups {
            g.io.fail_all("the node is stopping before the entry's fate was known");
        }
        info!(self.logger, "raft thread stopped");
    }
}

/// Whether the voters `voters` that `changes` leave voters are a majority of them: the groups
/// that follow group 0 commit the change under the old voters, and a removed node is cut off.
fn keeps_a_quorum(voters: &[u64], changes: &[Change]) -> bool {
    use crate::peer::members::Op;
    let out = |v: &u64| changes.iter().any(|c| c.id == *v && c.op != Op::AddVoter);
    let kept = voters.iter().filter(|v| !out(v)).count();
    kept > voters.len() / 2
}

/// Answer a request the node cannot take: it is stopping.
fn answer_stopping<M: StateMachine>(req: Request<M>) {
    match req {
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

/// Answer a request for a group this node does not host (none leads it here).
fn refuse_unhosted<M: StateMachine>(req: Request<M>) {
    match req {
        Request::Propose { reply, .. } => {
            let _ = reply.send(WriteReply::NotLeader { leader: None });
        }
        Request::Read { reply, .. } => {
            let _ = reply.send(ReadReply::NotLeader { leader: None });
        }
        Request::Members { reply, .. } => {
            let _ = reply.send(MembersReply::NotLeader { leader: None });
        }
        Request::Transfer { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::members::Op;

    fn change(op: Op, id: u64) -> Change {
        Change {
            op,
            id,
            peer: Some("h:1".into()),
            http: None,
            etcd: None,
        }
    }

    #[test]
    fn a_change_on_many_groups_takes_out_only_a_minority_of_the_voters() {
        let three = [1, 2, 3];
        assert!(keeps_a_quorum(&three, &[change(Op::Remove, 3)]));
        let replace = [change(Op::AddVoter, 4), change(Op::Remove, 3)];
        assert!(keeps_a_quorum(&three, &replace));
        let two_out = [change(Op::Remove, 2), change(Op::AddLearner, 3)];
        assert!(
            !keeps_a_quorum(&three, &two_out),
            "a demotion takes a voter out"
        );
        let swap = [change(Op::AddVoter, 4), change(Op::AddVoter, 5)];
        let swap = [&swap[..], &[change(Op::Remove, 2), change(Op::Remove, 3)]].concat();
        assert!(!keeps_a_quorum(&three, &swap), "{{1,2,3}} to {{1,4,5}}");
        assert!(keeps_a_quorum(&[1, 2, 3, 4, 5], &swap), "two of five");
    }
}
