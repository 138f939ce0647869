//! A deterministic in-process cluster of [`LeaseNode`]s with simulated clocks and network.

use std::collections::{HashMap, HashSet};

use raft::eraftpb::{ConfChangeV2, ConfState, Message, MessageType};
use raft::{StateRole, Storage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use slog::Logger;

use crate::clock::{Clock, SimClock};
use crate::config::LeaseConfig;
use crate::node::LeaseNode;
use crate::read::{ReadId, ReadMode};
use crate::sim::history::{CheckReport, History, OpId, OpKind, OpResult};
use crate::sim::kv::{encode_put, KvState, SimIo, SimStateMachine};
use crate::sim::monitor::{ElectionStats, LeaseMonitor, NodeView};
use crate::sim::net::{NetConfig, SimNet};
use crate::sim::storage::SimStorage;

type SimLeaseNode = LeaseNode<SimStorage, SimClock>;

/// How to build a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes, with ids `1..=nodes`.
    pub nodes: u64,
    /// The initial voters (default: every node). Other nodes are not voters until added.
    pub voters: Option<Vec<u64>>,
    /// Seed for every random choice (network, election timeouts).
    pub seed: u64,
    /// Real-time interval between ticks, on each node's own clock.
    pub tick_ms: u64,
    /// raft's `election_tick`.
    pub election_tick: usize,
    /// raft's `heartbeat_tick`.
    pub heartbeat_tick: usize,
    /// raft's randomized election timeout is drawn from `[election_tick, election_tick +
    /// election_spread_ticks]` at every role or term change, by the node's seeded generator
    /// (raft-rs's own draw is unseeded and is overwritten).
    pub election_spread_ticks: usize,
    /// raft's pre-vote.
    pub pre_vote: bool,
    /// The lease configuration of every node.
    pub lease: LeaseConfig,
    /// Clock drift per node in ppm, indexed by `id - 1` (missing: 0).
    pub drift_ppm: Vec<i64>,
    /// Simulation quantum in microseconds of real time.
    pub step_us: u64,
    /// Network faults.
    pub net: NetConfig,
    /// Each node snapshots its state and compacts its log once this many entries were applied
    /// since its last snapshot (0: never). A node that falls behind then catches up by snapshot.
    pub compact_every: u64,
    /// Makes each node's state machine (at boot and at every restart): the crate's own
    /// [`KvState`] by default, or yours.
    pub state_machine: fn() -> Box<dyn SimStateMachine>,
    /// A node's own promise and election timeout, in ms, indexed by `id - 1` (missing or 0: the
    /// shared `lease.promise_ms` and `election_tick`). A node with its own setting has an election
    /// timeout equal to its promise, as the example KV derives both from `--election-ms`: nodes
    /// in the middle of a rolling change of that setting. Change it between a crash and a restart
    /// with [`SimCluster::set_promise_ms`].
    pub promise_ms_per_node: Vec<u64>,
    /// Nodes (by id) that run without follower read leases whatever `lease.follower_leases`
    /// says: a setting being turned on node by node.
    pub follower_leases_off: Vec<u64>,
}

impl Default for SimConfig {
    /// 3 nodes, 10 ms ticks, 100 ms election timeout, 20 ms heartbeats, `P` = 100 ms, ρ = 1%,
    /// ε = 2 ms, a 100 µs quantum and 0.5–2 ms network delay.
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            voters: None,
            seed: 0,
            tick_ms: 10,
            election_tick: 10,
            heartbeat_tick: 2,
            election_spread_ticks: 5,
            pre_vote: true,
            lease: LeaseConfig {
                promise_ms: 100,
                drift_ppm: 10_000,
                margin_ms: 2,
                ..LeaseConfig::default()
            },
            drift_ppm: Vec::new(),
            step_us: 100,
            net: NetConfig::default(),
            compact_every: 0,
            state_machine: || Box::new(KvState::new()),
            promise_ms_per_node: Vec::new(),
            follower_leases_off: Vec::new(),
        }
    }
}

/// One simulated node: its raft state survives a crash, its memory does not.
struct SimNode {
    id: u64,
    node: Option<SimLeaseNode>,
    storage: SimStorage,
    clock: SimClock,
    kv: Box<dyn SimStateMachine>,
    paused: bool,
    ticks_stalled: bool,
    /// Local time of the next tick.
    next_tick_ns: u64,
    /// Messages that arrived while paused, delivered on resume.
    held: Vec<Message>,
    writes: HashSet<OpId>,
    reads: HashMap<ReadId, (OpId, Vec<u8>)>,
    /// Snapshots installed from a leader since the start (they survive crashes).
    installs: u64,
    /// Persisted, as the example KV does: the longest promise any run of this node made, in ms.
    /// Each boot passes it as `prior_promise_ms`.
    max_promise_ms: u64,
}

/// Totals over a run: see [`SimCluster::totals`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimTotals {
    /// Snapshots installed by followers that fell behind compaction.
    pub snapshots_installed: u64,
    /// Lease reads served by a node that had installed a snapshot before.
    pub lease_reads_after_install: u64,
    /// Heartbeat rounds retired because a round table was full.
    pub rounds_evicted: u64,
}

/// A deterministic cluster: the same config and the same calls give the same history.
///
/// Each node is a [`LeaseNode`] on its own [`SimClock`] over a simulated network, serving a
/// replicated KV register per key (the crate's own state machine, [`crate::sim::kv`]). Clients
/// ([`SimCluster::put`], [`SimCluster::get`], [`SimCluster::handle_get`], or a [`Load`]) are
/// recorded in a [`History`], and [`SimCluster::check`] checks it for linearizability together
/// with every lease overlap the lease monitor saw.
///
/// # Example
/// Test your own numbers against every fault scenario, then show that the checker fails when a
/// safety is off. The scenarios ([`crate::sim::scenarios`]) are plain functions of a cluster, so
/// they run on a cluster configured like yours; write your own hazard the same way.
///
/// ```
/// use raft_lease::sim::{scenarios, Load, SimCluster, SimConfig};
/// use raft_lease::LeaseConfig;
///
/// // Your numbers: 10 ms ticks, 300 ms election timeout, 30 ms heartbeats, P = 300 ms, ρ = 1%,
/// // with clocks drifting at the bound in opposite directions.
/// let yours = |seed| SimConfig {
///     seed,
///     election_tick: 30,
///     heartbeat_tick: 3,
///     lease: LeaseConfig {
///         promise_ms: 300,
///         drift_ppm: 10_000,
///         margin_ms: 5,
///         ..LeaseConfig::default()
///     },
///     drift_ppm: vec![-10_000, 10_000, 10_000],
///     ..SimConfig::default()
/// };
/// for scenario in scenarios::all() {
///     let mut config = yours(7);
///     (scenario.configure)(&mut config);
///     let mut sim = SimCluster::new(config);
///     (scenario.run)(&mut sim);
///     let report = sim.check();
///     assert!(
///         report.violations.is_empty(),
///         "{}: {:?}\n{}",
///         scenario.name,
///         report.violations,
///         sim.describe()
///     );
///     assert!(report.reads_checked > 0 && report.lease_checks > 0);
/// }
///
/// // Your own hazard: a leader paused for longer than its lease (its clock runs on), while the
/// // others elect a leader and take writes; it then serves a waiting client first.
/// let mut sim = SimCluster::new(yours(8));
/// let leader = scenarios::elect(&mut sim);
/// sim.run_with_load(300, &Load::default());
/// sim.pause(leader);
/// sim.run_with_load(1_000, &Load::default());
/// sim.resume_clients_first(leader);
/// sim.handle_get(leader, b"k0");
/// sim.run_with_load(300, &Load::default());
/// assert!(sim.check().violations.is_empty());
///
/// // A checker that cannot fail proves nothing: with raft-rs's tick-based `LeaseBased` reads,
/// // the partition scenario serves stale reads, and the checker says so.
/// let partition = &scenarios::all()[0];
/// assert_eq!(partition.name, "partitioned old leader");
/// assert!(partition.check(7, false).unsafe_found());
/// ```
///
/// To run a state machine of your own here, implement [`SimStateMachine`] for it and set
/// [`SimConfig::state_machine`]: every node then replicates yours, and the scenarios, the
/// randomized faults, the checker and the lease monitor apply to it unchanged.
///
/// ```
/// use std::collections::HashMap;
/// use raft_lease::sim::kv::SimStateMachine;
/// use raft_lease::sim::{scenarios, SimCluster, SimConfig};
///
/// /// Your store's state machine, behind the simulator's register-per-key interface.
/// #[derive(Default)]
/// struct MyStore(HashMap<Vec<u8>, (Vec<u8>, u64)>);
///
/// impl SimStateMachine for MyStore {
///     fn put(&mut self, key: &[u8], value: &[u8], revision: u64) {
///         self.0.insert(key.to_vec(), (value.to_vec(), revision));
///     }
///     fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u64)> {
///         self.0.get(key).cloned()
///     }
///     fn snapshot(&self) -> Vec<u8> {
///         serde_json::to_vec(&self.0.iter().collect::<Vec<_>>()).unwrap()
///     }
///     fn restore(&mut self, snapshot: &[u8]) -> Option<()> {
///         let entries: Vec<(Vec<u8>, (Vec<u8>, u64))> = serde_json::from_slice(snapshot).ok()?;
///         self.0 = entries.into_iter().collect();
///         Some(())
///     }
/// }
///
/// for scenario in scenarios::all() {
///     let mut config = SimConfig {
///         seed: 3,
///         compact_every: 20, // followers catch up by snapshot: `restore` is exercised too
///         state_machine: || Box::new(MyStore::default()),
///         ..SimConfig::default()
///     };
///     (scenario.configure)(&mut config);
///     let mut sim = SimCluster::new(config);
///     (scenario.run)(&mut sim);
///     let report = sim.check();
///     assert!(report.violations.is_empty(), "{}: {:?}", scenario.name, report.violations);
/// }
/// ```
pub struct SimCluster {
    config: SimConfig,
    rng: ChaCha8Rng,
    now_ns: u64,
    nodes: Vec<SimNode>,
    net: SimNet,
    history: History,
    monitor: LeaseMonitor,
    /// Running totals; evictions of crashed nodes are added at the crash.
    totals: SimTotals,
    logger: Logger,
    /// Elections to start at simulated instants: (instant in ns, node).
    campaigns_at: Vec<(u64, u64)>,
}

impl SimCluster {
    /// Build and boot the cluster at real time 0. Panics on an invalid config (a test bug).
    pub fn new(config: SimConfig) -> Self {
        Self::with_logger(config, Logger::root(slog::Discard, slog::o!()))
    }

    /// Like [`SimCluster::new`], logging through `logger`.
    pub fn with_logger(config: SimConfig, logger: Logger) -> Self {
        assert!(
            config.nodes > 0 && config.step_us > 0 && config.tick_ms > 0,
            "bad sim config {config:?}"
        );
        let rng = ChaCha8Rng::seed_from_u64(config.seed);
        let voters = config
            .voters
            .clone()
            .unwrap_or_else(|| (1..=config.nodes).collect());
        let nodes = (1..=config.nodes)
            .map(|id| {
                // Every node starts from the same initial configuration; a non-voter waits to be added.
                let storage = SimStorage::new(voters.clone());
                let drift = config.drift_ppm.get(id as usize - 1).copied().unwrap_or(0);
                SimNode {
                    id,
                    node: None,
                    storage,
                    clock: SimClock::new(0, drift),
                    kv: (config.state_machine)(),
                    paused: false,
                    ticks_stalled: false,
                    next_tick_ns: 0,
                    held: Vec::new(),
                    writes: HashSet::new(),
                    reads: HashMap::new(),
                    installs: 0,
                    max_promise_ms: 0,
                }
            })
            .collect();
        let net = SimNet::new(config.net.clone());
        let mut cluster = SimCluster {
            config,
            rng,
            now_ns: 0,
            nodes,
            net,
            history: History::default(),
            monitor: LeaseMonitor::default(),
            totals: SimTotals::default(),
            logger,
            campaigns_at: Vec::new(),
        };
        for idx in 0..cluster.nodes.len() {
            cluster.boot(idx);
        }
        cluster
    }

    fn boot(&mut self, idx: usize) {
        let c = &self.config;
        let n = &mut self.nodes[idx];
        // The state machine restarts from the latest snapshot; raft replays the log after it.
        let snapshot = n.storage.latest_snapshot();
        n.kv = (c.state_machine)();
        if !snapshot.data.is_empty() {
            n.kv.restore(&snapshot.data)
                .expect("the node wrote this snapshot");
        }
        let own_ms = c.promise_ms_per_node.get(idx).copied().unwrap_or(0);
        let (promise_ms, election_tick) = match own_ms {
            0 => (c.lease.promise_ms, c.election_tick),
            ms => (ms, (ms / c.tick_ms) as usize),
        };
        let rc = raft::Config {
            applied: snapshot.get_metadata().index,
            id: n.id,
            election_tick,
            heartbeat_tick: c.heartbeat_tick,
            min_election_tick: election_tick,
            max_election_tick: election_tick + c.election_spread_ticks + 1,
            check_quorum: true,
            pre_vote: c.pre_vote,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..raft::Config::default()
        };
        let off = c.follower_leases_off.contains(&n.id);
        let lease = LeaseConfig {
            seed: c.lease.seed ^ c.seed,
            promise_ms,
            prior_promise_ms: n.max_promise_ms,
            follower_leases: c.lease.follower_leases.filter(|_| !off),
            ..c.lease.clone()
        };
        n.max_promise_ms = n.max_promise_ms.max(promise_ms);
        let mut node = LeaseNode::new(
            &rc,
            n.storage.clone(),
            lease,
            c.tick_ms,
            n.clock.clone(),
            &self.logger,
        )
        .unwrap_or_else(|e| panic!("node {} failed to start: {e}", n.id));
        node.set_entry_keys(crate::sim::kv::entry_keys);
        n.next_tick_ns = n.clock.now_ns() + c.tick_ms * 1_000_000;
        n.node = Some(node);
    }

    // ----- time -------------------------------------------------------------------------------

    /// Real simulated time, in nanoseconds since the start.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Advance one quantum: clocks, deliveries, ticks, and each node's ready loop.
    pub fn step(&mut self) {
        let dt_ns = self.config.step_us * 1_000;
        self.now_ns += dt_ns;
        for n in &self.nodes {
            n.clock.advance(dt_ns);
        }
        for m in self.net.due(self.now_ns) {
            self.deliver(m);
        }
        self.start_campaigns_due();
        self.report_dropped_snapshots();
        for idx in 0..self.nodes.len() {
            self.tick_node(idx);
            self.process(idx);
        }
        self.observe_leases();
    }

    /// The voters (both halves) of the configuration applied by the running node furthest ahead.
    fn newest_voters(&self) -> Vec<u64> {
        let up = self.nodes.iter().filter_map(|n| n.node.as_ref());
        let newest = up.max_by_key(|node| node.raw().raft.raft_log.applied);
        newest.map_or_else(Vec::new, |node| {
            let cs = node.raw().raft.prs().conf().to_conf_state();
            cs.voters.into_iter().chain(cs.voters_outgoing).collect()
        })
    }

    /// Show the lease monitor every node's lease at this instant.
    fn observe_leases(&mut self) {
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.id).collect();
        let newest = self.newest_voters();
        let views: Vec<NodeView> = self
            .nodes
            .iter()
            .map(|n| match n.node.as_ref() {
                Some(node) => node_view(node, &ids, &newest),
                None => NodeView {
                    id: n.id,
                    // Its term and vote as persisted: it resumes with them.
                    term: n.storage.initial_state().map_or(0, |s| s.hard_state.term),
                    leading: false,
                    candidate: false,
                    lease_term: None,
                    read_lease_term: None,
                    campaigning: false,
                    vote: n.storage.initial_state().map_or(0, |s| s.hard_state.vote),
                    // A crashed node cannot vote; once up again, its boot promise (or the lack
                    // of one) speaks for it.
                    backs: ids.clone(),
                    voters: (Vec::new(), Vec::new()),
                },
            })
            .collect();
        self.monitor.observe(self.now_ns, &views);
    }

    /// Run for `ms` of real time.
    pub fn run_for_ms(&mut self, ms: u64) {
        let end_ns = self.now_ns + ms * 1_000_000;
        while self.now_ns < end_ns {
            self.step();
        }
    }

    /// Run until `done` holds (checked each quantum) or `max_ms` pass. Returns whether it held.
    pub fn run_until(&mut self, max_ms: u64, mut done: impl FnMut(&SimCluster) -> bool) -> bool {
        let end_ns = self.now_ns + max_ms * 1_000_000;
        while self.now_ns < end_ns {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// A transport tells raft of a snapshot it failed to deliver, or raft waits for it for ever.
    fn report_dropped_snapshots(&mut self) {
        for (from, to) in self.net.take_dropped_snapshots() {
            self.report_snapshot(from, to, raft::SnapshotStatus::Failure);
        }
    }

    /// The transport tells the sender how a snapshot went, as a real one does once it has
    /// streamed the snapshot or failed to.
    fn report_snapshot(&mut self, from: u64, to: u64, status: raft::SnapshotStatus) {
        let Some(idx) = self.live_index(from) else {
            return;
        };
        let node = self.nodes[idx].node.as_mut().expect("live");
        node.report_snapshot(to, status);
        self.process(idx);
    }

    fn deliver(&mut self, m: Message) {
        let Some(idx) = self.index(m.to) else { return };
        let n = &mut self.nodes[idx];
        let Some(node) = n.node.as_mut() else {
            self.net.dropped(&m); // to a crashed node
            return;
        };
        if n.paused {
            n.held.push(m);
            return;
        }
        let snapshot_from = (m.get_msg_type() == MessageType::MsgSnapshot).then_some(m.from);
        let _ = node.step(m); // a peer's bad message is raft's to refuse; the node keeps running
        self.process(idx);
        if let Some(from) = snapshot_from {
            let to = self.nodes[idx].id;
            self.report_snapshot(from, to, raft::SnapshotStatus::Finish);
        }
    }

    fn tick_node(&mut self, idx: usize) {
        let tick_ns = self.config.tick_ms * 1_000_000;
        let n = &mut self.nodes[idx];
        let (Some(node), false) = (n.node.as_mut(), n.paused) else {
            return;
        };
        let now_ns = n.clock.now_ns();
        if n.ticks_stalled {
            return; // missed ticks fire in a burst when the ticker runs again (tokio's default)
        }
        while now_ns >= n.next_tick_ns {
            node.tick();
            n.next_tick_ns += tick_ns;
        }
    }

    /// Drain the node's ready loop, compact its log when due, then hand back finished reads.
    fn process(&mut self, idx: usize) {
        let SimCluster {
            nodes,
            net,
            rng,
            history,
            now_ns,
            config,
            totals,
            ..
        } = self;
        let n = &mut nodes[idx];
        let (Some(node), false) = (n.node.as_mut(), n.paused) else {
            return;
        };
        let mut io = SimIo {
            id: n.id,
            storage: &n.storage,
            kv: n.kv.as_mut(),
            writes: &mut n.writes,
            history,
            net,
            rng,
            now_ns: *now_ns,
            installs: &mut n.installs,
        };
        node.handle_ready(&mut io)
            .expect("the sim's storage never fails");
        // A driver that sleeps until `next_wake_ns` must never be woken at once again: a `Ready`
        // clears what that instant waited for.
        if let Some(at_ns) = node.next_wake_ns() {
            let now = node.clock().now_ns();
            assert!(
                at_ns > now,
                "node {} asks to be woken at {at_ns}, now {now}, again",
                n.id
            );
        }
        compact_if_due(node, &n.storage, n.kv.as_ref(), config.compact_every);
        let (kv, reads) = (&n.kv, &mut n.reads);
        let served = node.serve_reads(|rid| reads.get(&rid).and_then(|(_, key)| kv.get(key)));
        for s in served {
            let Some((op, _)) = reads.remove(&s.id) else {
                continue;
            };
            let result = match s.result {
                Ok((value, served)) => {
                    let after_install = n.installs > 0 && served == crate::ReadKind::Lease;
                    totals.lease_reads_after_install += u64::from(after_install);
                    OpResult::Read { value, served }
                }
                Err(e) => OpResult::Failed(e.to_string()),
            };
            history.complete(op, result, *now_ns);
        }
    }

    // ----- clients ----------------------------------------------------------------------------

    /// Write a unique value to `key` through `node`. Acknowledged when `node` applies it.
    pub fn put(&mut self, node: u64, key: &[u8]) -> OpId {
        let op_placeholder = self.history.ops().len() as OpId;
        let value = format!("v{op_placeholder}").into_bytes();
        let op = self.history.invoke(
            node,
            OpKind::Put {
                key: key.to_vec(),
                value: value.clone(),
            },
            self.now_ns,
        );
        debug_assert_eq!(op, op_placeholder);
        let Some(idx) = self.live_index(node) else {
            self.history
                .complete(op, OpResult::Failed("unavailable".into()), self.now_ns);
            return op;
        };
        let n = &mut self.nodes[idx];
        let lease_node = n.node.as_mut().expect("live");
        if !lease_node.is_leader() {
            self.history
                .complete(op, OpResult::Failed("not leader".into()), self.now_ns);
            return op;
        }
        match lease_node.propose(vec![], encode_put(op, key, &value)) {
            Ok(()) => {
                n.writes.insert(op);
            }
            Err(e) => self
                .history
                .complete(op, OpResult::Failed(e.to_string()), self.now_ns),
        }
        self.process(idx);
        op
    }

    /// Read `key` through `node` in `mode`.
    pub fn get(&mut self, node: u64, key: &[u8], mode: ReadMode) -> OpId {
        let op = self
            .history
            .invoke(node, OpKind::Get { key: key.to_vec() }, self.now_ns);
        let Some(idx) = self.live_index(node) else {
            self.history
                .complete(op, OpResult::Failed("unavailable".into()), self.now_ns);
            return op;
        };
        let n = &mut self.nodes[idx];
        match n.node.as_mut().expect("live").read(mode) {
            Ok(rid) => {
                n.reads.insert(rid, (op, key.to_vec()));
            }
            Err(e) => self
                .history
                .complete(op, OpResult::Failed(e.to_string()), self.now_ns),
        }
        self.process(idx);
        op
    }

    /// Read `key` from `node`'s local state under its follower read lease: read first, then
    /// validate ([`crate::LeaseNode::check_local_read_key`]: only a pending write of `key`
    /// holds it back); a refused read fails.
    pub fn follower_get(&mut self, node: u64, key: &[u8]) -> OpId {
        self.local_get(node, key, |n| {
            let value = n.kv.get(key);
            match n.node.as_ref().expect("live").check_local_read_key(key) {
                Ok(()) => OpResult::Read {
                    value,
                    served: crate::ReadKind::FollowerLease,
                },
                Err(e) => OpResult::Failed(format!("{e:?}")),
            }
        })
    }

    /// Read `key` through `node`'s [`crate::ReadHandle`], as an application thread would (on a
    /// follower, under its follower read lease).
    pub fn handle_get(&mut self, node: u64, key: &[u8]) -> OpId {
        self.local_get(node, key, |n| {
            let live = n.node.as_ref().expect("live");
            let served = match live.is_leader() {
                true => crate::ReadKind::Lease,
                false => crate::ReadKind::FollowerLease,
            };
            match live.read_handle().try_read(|| n.kv.get(key)) {
                Ok(value) => OpResult::Read { value, served },
                Err(e) => OpResult::Failed(e.to_string()),
            }
        })
    }

    /// A read of `key` served at `node` with no raft step, by `serve`, recorded in the history.
    fn local_get(&mut self, node: u64, key: &[u8], serve: impl Fn(&SimNode) -> OpResult) -> OpId {
        let op = self
            .history
            .invoke(node, OpKind::Get { key: key.to_vec() }, self.now_ns);
        let result = match self.live_index(node) {
            None => OpResult::Failed("unavailable".into()),
            Some(idx) => serve(&self.nodes[idx]),
        };
        self.history.complete(op, result, self.now_ns);
        op
    }

    // ----- faults -----------------------------------------------------------------------------

    /// Cut every link between the groups `a` and `b`, both ways.
    pub fn partition(&mut self, a: &[u64], b: &[u64]) {
        for &x in a {
            for &y in b {
                self.net.block(x, y);
                self.net.block(y, x);
            }
        }
    }

    /// Cut the link `from → to` only.
    pub fn block(&mut self, from: u64, to: u64) {
        self.net.block(from, to);
    }

    /// Restore every link.
    pub fn heal(&mut self) {
        self.net.heal();
    }

    /// Pause a node (a GC pause or `SIGSTOP`): its clock runs on, it processes nothing, and
    /// messages to it wait.
    pub fn pause(&mut self, node: u64) {
        let idx = self.index(node).expect("known node");
        self.nodes[idx].paused = true;
    }

    /// Resume a paused node: it first serves any waiting client work, then gets its messages.
    pub fn resume(&mut self, node: u64) {
        let idx = self.index(node).expect("known node");
        self.nodes[idx].paused = false;
        let held = std::mem::take(&mut self.nodes[idx].held);
        for m in held {
            self.deliver(m);
        }
    }

    /// Resume a paused node but keep its held messages for one more quantum, so that client
    /// requests sent right after this call reach it before its network traffic does.
    pub fn resume_clients_first(&mut self, node: u64) {
        let idx = self.index(node).expect("known node");
        self.nodes[idx].paused = false;
        let held = std::mem::take(&mut self.nodes[idx].held);
        for m in held {
            self.net.send(m, self.now_ns, &mut self.rng);
        }
    }

    /// Stall or restart the node's tick thread while its clock runs on (etcd-io/etcd#13527).
    /// When it runs again, the missed ticks fire in one burst, as a catching-up timer does.
    pub fn stall_ticks(&mut self, node: u64, stalled: bool) {
        let idx = self.index(node).expect("known node");
        self.nodes[idx].ticks_stalled = stalled;
    }

    /// Crash a node: it loses its memory and messages in flight to it; its raft storage stays.
    pub fn crash(&mut self, node: u64) {
        let idx = self.index(node).expect("known node");
        let n = &mut self.nodes[idx];
        let evicted = n
            .node
            .as_ref()
            .map_or(0, |node| node.counters().rounds_evicted);
        self.totals.rounds_evicted += evicted;
        n.node = None;
        n.paused = false;
        n.held.clear();
        n.reads.clear();
        n.writes.clear(); // their outcome is unknown to the client: they stay incomplete
        self.net.drop_to(node);
    }

    /// Give `node` its own promise (and election timeout) of `promise_ms` from its next boot: a
    /// rolling change of the setting.
    pub fn set_promise_ms(&mut self, node: u64, promise_ms: u64) {
        let idx = self.index(node).expect("known node");
        let per_node = &mut self.config.promise_ms_per_node;
        if per_node.len() <= idx {
            per_node.resize(idx + 1, 0);
        }
        per_node[idx] = promise_ms;
    }

    /// Restart a crashed node from its persisted raft state.
    pub fn restart(&mut self, node: u64) {
        let idx = self.index(node).expect("known node");
        assert!(self.nodes[idx].node.is_none(), "node {node} is running");
        self.boot(idx);
    }

    /// The node's clock (to change its drift or step it).
    pub fn clock(&self, node: u64) -> &SimClock {
        &self.nodes[self.index(node).expect("known node")].clock
    }

    /// The network (to change delays, loss or duplication, or to delay one message type).
    pub fn net_mut(&mut self) -> &mut SimNet {
        &mut self.net
    }

    /// The network, read-only.
    pub fn net(&self) -> &SimNet {
        &self.net
    }

    /// Ask `from` (the leader) to transfer leadership to `to`.
    pub fn transfer_leader(&mut self, from: u64, to: u64) {
        let idx = self.live_index(from).expect("live node");
        self.nodes[idx]
            .node
            .as_mut()
            .expect("live")
            .transfer_leader(to);
        self.process(idx);
    }

    /// Start an election on `node` at the simulated instant `at_ns` (an election timer that
    /// fires early), unless it is then down, paused, leading or a candidate. The node
    /// refuses it as [`LeaseNode::campaign`] does (a promise that holds, grants that live).
    pub fn campaign_at(&mut self, node: u64, at_ns: u64) {
        self.campaigns_at.push((at_ns, node));
    }

    fn start_campaigns_due(&mut self) {
        let now_ns = self.now_ns;
        let (due, later) = self.campaigns_at.drain(..).partition(|c| c.0 <= now_ns);
        self.campaigns_at = later;
        for (_, node) in due {
            let Some(idx) = self.live_index(node) else {
                continue;
            };
            let role = self.nodes[idx]
                .node
                .as_ref()
                .expect("live")
                .raw()
                .raft
                .state;
            if matches!(role, StateRole::Follower | StateRole::PreCandidate) {
                self.campaign(node);
            }
        }
    }

    /// Start an election on `node` now.
    pub fn campaign(&mut self, node: u64) {
        let idx = self.live_index(node).expect("live node");
        let _ = self.nodes[idx].node.as_mut().expect("live").campaign();
        self.process(idx);
    }

    /// Propose a membership change through `node`.
    pub fn propose_conf_change(&mut self, node: u64, cc: ConfChangeV2) -> raft::Result<()> {
        let idx = self.live_index(node).expect("live node");
        let r = self.nodes[idx]
            .node
            .as_mut()
            .expect("live")
            .propose_conf_change(vec![], cc);
        self.process(idx);
        r
    }

    // ----- inspection -------------------------------------------------------------------------

    /// The running node `id`, if it is up.
    pub fn node(&self, id: u64) -> Option<&SimLeaseNode> {
        self.nodes.get(self.index(id)?)?.node.as_ref()
    }

    /// The live, unpaused leader with the highest term.
    pub fn leader(&self) -> Option<u64> {
        self.leader_where(|_| true)
    }

    /// The node of `among` that believes it leads with the highest term, if any (up and
    /// unpaused).
    pub fn leader_among(&self, among: &[u64]) -> Option<u64> {
        self.leader_where(|id| among.contains(&id))
    }

    fn leader_where(&self, reached: impl Fn(u64) -> bool) -> Option<u64> {
        self.nodes
            .iter()
            .filter(|n| !n.paused && reached(n.id))
            .filter_map(|n| n.node.as_ref())
            .filter(|n| n.is_leader())
            .max_by_key(|n| n.raw().raft.term)
            .map(|n| n.id())
    }

    /// Every node that believes it leads (up and unpaused).
    pub fn self_believed_leaders(&self) -> Vec<u64> {
        let up = self
            .nodes
            .iter()
            .filter(|n| !n.paused)
            .filter_map(|n| n.node.as_ref());
        up.filter(|n| n.is_leader()).map(|n| n.id()).collect()
    }

    /// The history recorded so far.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Check the history for linearizability, with every lease overlap the monitor saw.
    pub fn check(&self) -> CheckReport {
        let mut report = self.history.check();
        report
            .violations
            .extend_from_slice(self.monitor.violations());
        report.lease_checks = self.monitor.checks();
        report
    }

    /// Totals so far: snapshots installed, lease reads after an install, rounds evicted.
    pub fn totals(&self) -> SimTotals {
        let live = self.nodes.iter().filter_map(|n| n.node.as_ref());
        SimTotals {
            snapshots_installed: self.nodes.iter().map(|n| n.installs).sum(),
            rounds_evicted: self.totals.rounds_evicted
                + live.map(|node| node.counters().rounds_evicted).sum::<u64>(),
            ..self.totals
        }
    }

    /// One line per node: up, paused or crashed; role, term, leader; configuration; log
    /// positions; lease. For failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let line = match n.node.as_ref() {
                None => format!("node {}: crashed\n", n.id),
                Some(node) => {
                    let r = &node.raw().raft;
                    let cs = r.prs().conf().to_conf_state();
                    format!(
                        "node {}: {:?} term {} leader {} paused {} stalled {} voters {:?}/{:?} learners {:?} \
                         commit {} applied {} last {} lease {:?}\n",
                        n.id, r.state, r.term, r.leader_id, n.paused, n.ticks_stalled, cs.voters,
                        cs.voters_outgoing, cs.learners, r.raft_log.committed, r.raft_log.applied,
                        r.raft_log.last_index(), node.lease_status().state
                    )
                }
            };
            out.push_str(&line);
        }
        out
    }

    /// How elections went so far (split votes).
    pub fn elections(&self) -> ElectionStats {
        self.monitor.elections()
    }

    /// The configuration node `id` has applied, if it is up.
    pub fn conf_state(&self, id: u64) -> Option<ConfState> {
        let node = self.node(id)?;
        Some(node.raw().raft.prs().conf().to_conf_state())
    }

    /// Ids of every node.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Whether `node` is up (not crashed).
    pub fn is_up(&self, node: u64) -> bool {
        self.node(node).is_some()
    }

    /// Whether `node` is paused.
    pub fn is_paused(&self, node: u64) -> bool {
        self.index(node).is_some_and(|i| self.nodes[i].paused)
    }

    /// The seeded RNG, for drivers that want their choices reproducible too.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    /// The configuration the cluster was built with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn index(&self, id: u64) -> Option<usize> {
        (1..=self.nodes.len() as u64)
            .contains(&id)
            .then(|| id as usize - 1)
    }

    fn live_index(&self, id: u64) -> Option<usize> {
        let idx = self.index(id)?;
        let n = &self.nodes[idx];
        (n.node.is_some() && !n.paused).then_some(idx)
    }
}

/// A steady client load for scenarios: reads at every node that believes it leads, writes at
/// the leader with the highest term.
#[derive(Debug, Clone)]
pub struct Load {
    /// Mode of the reads sent through the raft thread.
    pub read_mode: ReadMode,
    /// Also read through each believed leader's read handle.
    pub handle_reads: bool,
    /// Read every this many microseconds.
    pub read_every_us: u64,
    /// Write every this many microseconds (0: no writes).
    pub write_every_us: u64,
    /// Keys used: `k0..k{keys-1}`.
    pub keys: u64,
    /// The nodes the writing clients reach (`None`: every node): writes go to the leader with
    /// the highest term among them, and to none while none of them leads (clients cut off with
    /// one side of a partition).
    pub writes_at: Option<Vec<u64>>,
}

impl Default for Load {
    /// Strict lease reads and handle reads every 1 ms, a write every 5 ms, one key.
    fn default() -> Self {
        Load {
            read_mode: ReadMode::Lease,
            handle_reads: true,
            read_every_us: 1_000,
            write_every_us: 5_000,
            keys: 1,
            writes_at: None,
        }
    }
}

impl SimCluster {
    /// Run for `ms` under `load`.
    pub fn run_with_load(&mut self, ms: u64, load: &Load) {
        let end_ns = self.now_ns + ms * 1_000_000;
        let (read_ns, write_ns) = (load.read_every_us * 1_000, load.write_every_us * 1_000);
        let (mut next_read, mut next_write) = (self.now_ns, self.now_ns);
        while self.now_ns < end_ns {
            let key = format!("k{}", self.rng.gen_range(0..load.keys.max(1))).into_bytes();
            if write_ns > 0 && self.now_ns >= next_write {
                next_write += write_ns;
                let leader = match &load.writes_at {
                    None => self.leader(),
                    Some(reach) => self.leader_among(reach),
                };
                if let Some(leader) = leader {
                    self.put(leader, &key);
                }
            }
            if self.now_ns >= next_read {
                next_read += read_ns;
                let leaders = self.self_believed_leaders();
                for &node in &leaders {
                    self.get(node, &key, load.read_mode);
                    if load.handle_reads {
                        self.handle_get(node, &key);
                    }
                }
                if self.config.lease.follower_leases.is_some() {
                    let others: Vec<u64> = (1..=self.nodes.len() as u64)
                        .filter(|id| !leaders.contains(id))
                        .collect();
                    for node in others {
                        self.follower_get(node, &key);
                        if load.handle_reads {
                            self.handle_get(node, &key);
                        }
                    }
                }
            }
            self.step();
        }
    }
}

/// Snapshot the node's state and compact its log once `every` entries were applied since the
/// last snapshot, or when raft wanted a fresher snapshot to send. The state is exactly the
/// applied index here: the ready loop just ran.
fn compact_if_due(node: &SimLeaseNode, storage: &SimStorage, kv: &dyn SimStateMachine, every: u64) {
    let applied = node.raw().raft.raft_log.applied;
    let snap_index = storage.latest_snapshot().get_metadata().index;
    let first = storage.first_index().expect("MemStorage first index");
    let due = every > 0 && applied >= snap_index + every;
    if !(storage.take_wanted() || due) || applied < first {
        return;
    }
    storage
        .compact(applied, kv.snapshot())
        .unwrap_or_else(|e| panic!("node {} failed to compact at {applied}: {e}", node.id()));
}

/// What the lease monitor sees of a running node. Only a voter of the newest configuration counts
/// as a candidate: a removed node campaigning on a stale one splits nobody's vote.
fn node_view(node: &SimLeaseNode, ids: &[u64], newest_voters: &[u64]) -> NodeView {
    let status = node.lease_status();
    let r = &node.raw().raft;
    let conf = r.prs().conf().to_conf_state();
    NodeView {
        id: node.id(),
        term: r.term,
        leading: r.state == StateRole::Leader,
        candidate: r.state == StateRole::Candidate && newest_voters.contains(&node.id()),
        campaigning: matches!(r.state, StateRole::Candidate | StateRole::PreCandidate),
        vote: r.vote,
        lease_term: status.term.filter(|_| status.state.is_held()),
        read_lease_term: node.read_lease_term(),
        backs: ids
            .iter()
            .copied()
            .filter(|&l| node.promise_backs(l))
            .collect(),
        voters: (conf.voters, conf.voters_outgoing),
    }
}
