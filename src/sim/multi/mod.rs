//! A deterministic multi-group simulator: `N` nodes, each a [`MultiNode`] hosting every one of
//! `G` groups, on per-node simulated clocks over a simulated network of node batches. Node-level
//! faults (partitions, one-way cuts, pauses, crashes, restarts, drift) and per-group transfers and
//! membership changes. The lease monitor checks every group at every step; each group's history
//! is checked for linearizability.

pub mod episodes;
mod faults;
pub mod follower_runs;
mod io;
mod net;
pub mod random;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use raft::eraftpb::ConfChangeV2;
use raft::{StateRole, Storage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use slog::Logger;

pub use net::{BatchNet, MsgAction, MsgKind, MsgRule};

use crate::clock::{Clock, SimClock};
use crate::config::LeaseConfig;
use crate::multi::{GroupId, LivenessMode, MultiConfig, MultiNode, NodeBatch};
use crate::read::{ReadId, ReadMode};
use crate::sim::history::{CheckReport, History, OpId, OpKind, OpResult};
use crate::sim::kv::{encode_put, KvState, SimStateMachine};
use crate::sim::monitor::{LeaseMonitor, NodeView};
use crate::sim::storage::SimStorage;
use crate::sim::NetConfig;
use io::MultiIo;

type Node = MultiNode<SimStorage, SimClock>;

/// How to build a multi-group simulation.
#[derive(Debug, Clone)]
pub struct MultiSimConfig {
    /// Nodes, with ids `1..=nodes`; every one hosts every group.
    pub nodes: u64,
    /// Groups, with ids `1..=groups`; every node hosts a replica of every group.
    pub groups: u64,
    /// Voters of each group at first (0: every node). Group `g`'s are the `replicas` nodes from
    /// node `g` on, round the ring: with more nodes than replicas, each pair of nodes shares
    /// only some groups, and the other nodes' replicas are not members until a membership
    /// change adds them.
    pub replicas: u64,
    /// Seeds every random choice.
    pub seed: u64,
    /// Real-time interval between ticks, on each node's own clock.
    pub tick_ms: u64,
    /// raft's `election_tick`.
    pub election_tick: usize,
    /// raft's `heartbeat_tick`.
    pub heartbeat_tick: usize,
    /// raft's election timeout is drawn from `[election_tick, election_tick + spread]`.
    pub election_spread_ticks: usize,
    /// The lease configuration of every group.
    pub lease: LeaseConfig,
    /// Shared liveness or per-group heartbeats.
    pub mode: LivenessMode,
    /// An idle group quiesces after this many ticks (shared liveness).
    pub quiesce_after_ticks: u32,
    /// Clock drift per node in ppm, indexed by `id - 1` (missing: 0).
    pub drift_ppm: Vec<i64>,
    /// Simulation quantum in microseconds of real time.
    pub step_us: u64,
    /// Network faults.
    pub net: NetConfig,
    /// raft's pre-vote.
    pub pre_vote: bool,
    /// Nodes that run without pre-vote although `pre_vote` is on: a rolling change of the
    /// setting under way. Such a node, cut off, moves its term up with every campaign, and
    /// answers the others' pre-votes with that later term.
    pub no_pre_vote_nodes: Vec<u64>,
    /// raft's check-quorum. Shared liveness needs it to give up a group stuck on a live node
    /// (its leader steps down, and releases its followers): without it such a group stays
    /// fortified to a leader that cannot serve.
    pub check_quorum: bool,
    /// A node's own promise and election timeout, in ms, indexed by `id - 1` (missing or 0: the
    /// shared `lease.promise_ms` and `election_tick`). A node with its own setting has an
    /// election timeout equal to its promise, as the example KV derives both from
    /// `--election-ms`: nodes in the middle of a rolling change of that setting. Change it
    /// between a crash and a restart with [`MultiSim::set_promise_ms`].
    pub promise_ms_per_node: Vec<u64>,
    /// Negative control: a restarted node keeps its incarnation.
    #[doc(hidden)]
    pub same_incarnation_on_restart: bool,
}

impl Default for MultiSimConfig {
    /// 3 nodes × 6 groups, shared liveness, the single-group simulator's timing (10 ms ticks,
    /// 100 ms election timeout, 20 ms heartbeats, `P` = 100 ms, ρ = 1%, ε = 2 ms), quiescence
    /// after 20 idle ticks.
    fn default() -> Self {
        let single = crate::sim::SimConfig::default();
        MultiSimConfig {
            nodes: 3,
            groups: 6,
            replicas: 0,
            seed: 0,
            tick_ms: single.tick_ms,
            election_tick: single.election_tick,
            heartbeat_tick: single.heartbeat_tick,
            election_spread_ticks: single.election_spread_ticks,
            lease: single.lease,
            mode: LivenessMode::Shared,
            quiesce_after_ticks: 20,
            drift_ppm: Vec::new(),
            step_us: 100,
            net: NetConfig::default(),
            pre_vote: true,
            no_pre_vote_nodes: Vec::new(),
            check_quorum: true,
            promise_ms_per_node: Vec::new(),
            same_incarnation_on_restart: false,
        }
    }
}

/// One simulated node: its storages survive a crash, its memory does not.
struct SimNode {
    id: u64,
    node: Option<Node>,
    storages: BTreeMap<GroupId, SimStorage>,
    kv: BTreeMap<GroupId, KvState>,
    clock: SimClock,
    paused: bool,
    /// Batches that arrived while paused, delivered on resume.
    held: Vec<NodeBatch>,
    next_tick_ns: u64,
    /// Persisted: bumped at every boot.
    incarnation: u32,
    /// Persisted, as the example KV does: the longest promise any run of this node made, in ms.
    /// Each boot passes it as `prior_promise_ms`.
    max_promise_ms: u64,
    writes: HashMap<GroupId, HashSet<OpId>>,
    reads: HashMap<(GroupId, ReadId), (OpId, Vec<u8>)>,
}

/// A deterministic multi-group cluster: the same config and calls give the same history.
pub struct MultiSim {
    config: MultiSimConfig,
    rng: ChaCha8Rng,
    now_ns: u64,
    nodes: Vec<SimNode>,
    net: BatchNet,
    histories: BTreeMap<GroupId, History>,
    monitors: BTreeMap<GroupId, LeaseMonitor>,
    /// `(group, node)`: that group's raft messages to and from that node are dropped, while
    /// the node's support and fortification messages flow (a group stuck on a live node).
    muted: BTreeSet<(GroupId, u64)>,
    /// `(group, a, b)` with `a < b`: that group's raft messages between `a` and `b` are dropped,
    /// both ways, while everything else flows (the group's lanes between two nodes lost while
    /// the node stream gets through).
    muted_links: BTreeSet<(GroupId, u64, u64)>,
    /// Per group: whether a live leader held a lease at the last step, and every instant one
    /// came to hold it after none did.
    leased: BTreeMap<GroupId, (bool, Vec<u64>)>,
    /// Every crash and boot: `(ns, node, up)`.
    up_log: Vec<(u64, u64, bool)>,
    logger: Logger,
}

impl MultiSim {
    /// Build and boot the cluster at real time 0. Panics on an invalid config (a test bug).
    pub fn new(config: MultiSimConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(config.seed);
        let voters: Vec<u64> = (1..=config.nodes).collect();
        let groups: Vec<GroupId> = (1..=config.groups).collect();
        let nodes = voters
            .iter()
            .map(|&id| SimNode {
                id,
                node: None,
                storages: groups
                    .iter()
                    .map(|&g| (g, SimStorage::new(initial_voters(&config, g))))
                    .collect(),
                kv: BTreeMap::new(),
                clock: SimClock::new(
                    0,
                    config.drift_ppm.get(id as usize - 1).copied().unwrap_or(0),
                ),
                paused: false,
                held: Vec::new(),
                next_tick_ns: 0,
                incarnation: 0,
                max_promise_ms: 0,
                writes: HashMap::new(),
                reads: HashMap::new(),
            })
            .collect();
        let mut sim = MultiSim {
            net: BatchNet::new(config.net.clone()),
            histories: groups.iter().map(|&g| (g, History::default())).collect(),
            monitors: groups
                .iter()
                .map(|&g| (g, LeaseMonitor::default()))
                .collect(),
            config,
            rng,
            now_ns: 0,
            nodes,
            muted: BTreeSet::new(),
            muted_links: BTreeSet::new(),
            leased: BTreeMap::new(),
            up_log: Vec::new(),
            logger: Logger::root(slog::Discard, slog::o!()),
        };
        for idx in 0..sim.nodes.len() {
            sim.boot(idx);
        }
        sim
    }

    fn boot(&mut self, idx: usize) {
        let c = &self.config;
        let n = &mut self.nodes[idx];
        if n.incarnation == 0 || !c.same_incarnation_on_restart {
            n.incarnation += 1;
        }
        let (promise_ms, election_tick) = own_promise(c, idx);
        let raft = raft::Config {
            election_tick,
            heartbeat_tick: c.heartbeat_tick,
            min_election_tick: election_tick,
            max_election_tick: election_tick + c.election_spread_ticks + 1,
            check_quorum: c.check_quorum,
            pre_vote: c.pre_vote && !c.no_pre_vote_nodes.contains(&n.id),
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..raft::Config::default()
        };
        let config = MultiConfig {
            node_id: n.id,
            incarnation: n.incarnation,
            mode: c.mode,
            raft,
            lease: LeaseConfig {
                seed: c.lease.seed ^ c.seed,
                promise_ms,
                prior_promise_ms: n.max_promise_ms,
                ..c.lease.clone()
            },
            tick_ms: c.tick_ms,
            quiesce_after_ticks: c.quiesce_after_ticks,
            seed: c.seed,
        };
        n.max_promise_ms = n.max_promise_ms.max(promise_ms);
        let storages = n.storages.iter().map(|(&g, s)| (g, s.clone()));
        let mut node = MultiNode::new(config, storages, n.clock.clone(), &self.logger)
            .unwrap_or_else(|e| panic!("node {} failed to start: {e}", n.id));
        node.set_entry_keys(crate::sim::kv::entry_keys);
        n.kv = n
            .storages
            .iter()
            .map(|(&g, s)| (g, state_from(&s.latest_snapshot().data)))
            .collect();
        n.next_tick_ns = n.clock.now_ns() + c.tick_ms * 1_000_000;
        n.node = Some(node);
        self.up_log.push((self.now_ns, n.id, true));
    }

    // ----- time ------------------------------------------------------------------------------

    /// Real simulated time, in nanoseconds since the start.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Advance one quantum: clocks, deliveries, ticks, each node's `Ready`s, the lease monitor.
    pub fn step(&mut self) {
        let dt_ns = self.config.step_us * 1_000;
        self.now_ns += dt_ns;
        for n in &self.nodes {
            n.clock.advance(dt_ns);
        }
        for b in self.net.due(self.now_ns) {
            self.deliver(b);
        }
        for idx in 0..self.nodes.len() {
            self.tick_node(idx);
            self.process(idx);
        }
        self.observe_leases();
    }

    /// Run for `ms` of real time.
    pub fn run_for_ms(&mut self, ms: u64) {
        let end_ns = self.now_ns + ms * 1_000_000;
        while self.now_ns < end_ns {
            self.step();
        }
    }

    /// Run until `done` holds or `max_ms` pass. Returns whether it held.
    pub fn run_until(&mut self, max_ms: u64, mut done: impl FnMut(&MultiSim) -> bool) -> bool {
        let end_ns = self.now_ns + max_ms * 1_000_000;
        while self.now_ns < end_ns {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    fn deliver(&mut self, mut b: NodeBatch) {
        let (muted, links) = (&self.muted, &self.muted_links);
        let link = (b.from.min(b.to), b.from.max(b.to));
        b.raft.retain(|(g, _)| {
            !muted.contains(&(*g, b.from))
                && !muted.contains(&(*g, b.to))
                && !links.contains(&(*g, link.0, link.1))
        });
        let idx = b.to as usize - 1;
        let n = &mut self.nodes[idx];
        let Some(node) = n.node.as_mut() else { return };
        if n.paused {
            n.held.push(b);
            return;
        }
        node.step(b);
        self.process(idx);
    }

    fn tick_node(&mut self, idx: usize) {
        let tick_ns = self.config.tick_ms * 1_000_000;
        let n = &mut self.nodes[idx];
        let (Some(node), false) = (n.node.as_mut(), n.paused) else {
            return;
        };
        let now_ns = n.clock.now_ns();
        while now_ns >= n.next_tick_ns {
            node.tick();
            n.next_tick_ns += tick_ns;
        }
    }

    /// Run the node's `Ready`s, send its batches, and hand back finished reads.
    fn process(&mut self, idx: usize) {
        let now_ns = self.now_ns;
        let n = &mut self.nodes[idx];
        let (Some(node), false) = (n.node.as_mut(), n.paused) else {
            return;
        };
        let mut io = MultiIo {
            id: n.id,
            storages: &n.storages,
            kv: &mut n.kv,
            writes: &mut n.writes,
            histories: &mut self.histories,
            now_ns,
        };
        node.handle_ready(&mut io)
            .expect("the sim's storage never fails");
        for b in node.take_outbox() {
            self.net.send(b, now_ns, &mut self.rng);
        }
        serve_reads(n, &mut self.histories, now_ns);
    }

    // ----- clients ----------------------------------------------------------------------------

    /// Write a unique value to `key` in group `gid` through `node`.
    pub fn put(&mut self, gid: GroupId, node: u64, key: &[u8]) -> OpId {
        let h = self.histories.get_mut(&gid).expect("known group");
        let value = format!("v{}", h.ops().len()).into_bytes();
        let kind = OpKind::Put {
            key: key.to_vec(),
            value: value.clone(),
        };
        let op = h.invoke(node, kind, self.now_ns);
        let idx = node as usize - 1;
        let result = match self.live(idx) {
            None => Err("unavailable".to_string()),
            Some(m) if !m.group(gid).is_some_and(|g| g.is_leader()) => Err("not leader".into()),
            Some(m) => m
                .propose(gid, encode_put(op, key, &value))
                .map_err(|e| e.to_string()),
        };
        match result {
            Ok(()) => {
                self.nodes[idx].writes.entry(gid).or_default().insert(op);
            }
            Err(e) => self.histories.get_mut(&gid).expect("known").complete(
                op,
                OpResult::Failed(e),
                self.now_ns,
            ),
        }
        self.process(idx);
        op
    }

    /// Read `key` in group `gid` through `node` in `mode`.
    pub fn get(&mut self, gid: GroupId, node: u64, key: &[u8], mode: ReadMode) -> OpId {
        let h = self.histories.get_mut(&gid).expect("known group");
        let op = h.invoke(node, OpKind::Get { key: key.to_vec() }, self.now_ns);
        let idx = node as usize - 1;
        let result = match self.live(idx) {
            None => Err("unavailable".to_string()),
            Some(m) => m.read(gid, mode).map_err(|e| e.to_string()),
        };
        match result {
            Ok(rid) => {
                self.nodes[idx].reads.insert((gid, rid), (op, key.to_vec()));
            }
            Err(e) => self.histories.get_mut(&gid).expect("known").complete(
                op,
                OpResult::Failed(e),
                self.now_ns,
            ),
        }
        self.process(idx);
        op
    }

    /// Read `key` in group `gid` from `node`'s local state under its follower read lease: read
    /// first, then validate ([`crate::LeaseNode::check_local_read_key`]: only a pending write
    /// of `key` holds it back); a refused read fails.
    pub fn follower_get(&mut self, gid: GroupId, node: u64, key: &[u8]) -> OpId {
        let h = self.histories.get_mut(&gid).expect("known group");
        let op = h.invoke(node, OpKind::Get { key: key.to_vec() }, self.now_ns);
        let n = &self.nodes[node as usize - 1];
        let replica = n
            .node
            .as_ref()
            .filter(|_| !n.paused)
            .and_then(|m| m.group(gid));
        let result = match replica {
            None => OpResult::Failed("unavailable".into()),
            Some(g) => {
                let value = n.kv.get(&gid).and_then(|kv| SimStateMachine::get(kv, key));
                match g.check_local_read_key(key) {
                    Ok(()) => OpResult::Read {
                        value,
                        served: crate::ReadKind::FollowerLease,
                    },
                    Err(e) => OpResult::Failed(format!("{e:?}")),
                }
            }
        };
        let h = self.histories.get_mut(&gid).expect("known group");
        h.complete(op, result, self.now_ns);
        op
    }

    fn live(&mut self, idx: usize) -> Option<&mut Node> {
        let n = &mut self.nodes[idx];
        n.node.as_mut().filter(|_| !n.paused)
    }

    /// Every `read_every_us`, read a random key in every group at each node that believes it
    /// leads it; every `write_every_us`, write one in a random group at its leader. For `ms`.
    pub fn run_with_load(
        &mut self,
        ms: u64,
        mode: ReadMode,
        read_every_us: u64,
        write_every_us: u64,
    ) {
        let end_ns = self.now_ns + ms * 1_000_000;
        let (mut next_read, mut next_write) = (self.now_ns, self.now_ns);
        while self.now_ns < end_ns {
            let key = format!("k{}", self.rng.gen_range(0..3)).into_bytes();
            if write_every_us > 0 && self.now_ns >= next_write {
                next_write += write_every_us * 1_000;
                let gid = self.rng.gen_range(1..=self.config.groups);
                if let Some(leader) = self.leader(gid) {
                    self.put(gid, leader, &key);
                }
            }
            if self.now_ns >= next_read {
                next_read += read_every_us * 1_000;
                for gid in 1..=self.config.groups {
                    let leaders = self.believed_leaders(gid);
                    for &node in &leaders {
                        self.get(gid, node, &key, mode);
                    }
                    if self.config.lease.follower_leases.is_some() {
                        let others = (1..=self.config.nodes).filter(|n| !leaders.contains(n));
                        for node in others.collect::<Vec<_>>() {
                            if self.hosts(node, gid) {
                                self.follower_get(gid, node, &key);
                            }
                        }
                    }
                }
            }
            self.step();
        }
    }

    // ----- faults -----------------------------------------------------------------------------

    /// Cut every link between the groups of nodes `a` and `b`, both ways.
    pub fn partition(&mut self, a: &[u64], b: &[u64]) {
        for &x in a {
            for &y in b {
                self.net.block(x, y);
                self.net.block(y, x);
            }
        }
    }

    /// Delay batches on `from → to` by `extra_us` more from now on (0: normal again).
    pub fn slow_link(&mut self, from: u64, to: u64, extra_us: u64) {
        self.net.slow(from, to, extra_us);
    }

    /// Cut the link `from → to` only.
    pub fn block(&mut self, from: u64, to: u64) {
        self.net.block(from, to);
    }

    /// Restore every link.
    pub fn heal(&mut self) {
        self.net.heal();
    }

    /// Drop group `gid`'s raft messages to and from `node` until [`MultiSim::unmute_group`],
    /// while everything else flows: the group is stuck on a live node. [`MultiSim::heal`]
    /// leaves it.
    pub fn mute_group(&mut self, gid: GroupId, node: u64) {
        self.muted.insert((gid, node));
    }

    /// Drop group `gid`'s raft messages between `a` and `b`, both ways, until
    /// [`MultiSim::unmute_group_link`], while everything else flows: their support and
    /// fortification, and the group's messages on every other link. [`MultiSim::heal`] leaves
    /// it.
    pub fn mute_group_link(&mut self, gid: GroupId, a: u64, b: u64) {
        self.muted_links.insert((gid, a.min(b), a.max(b)));
    }

    /// Let group `gid`'s raft messages between `a` and `b` through again.
    pub fn unmute_group_link(&mut self, gid: GroupId, a: u64, b: u64) {
        self.muted_links.remove(&(gid, a.min(b), a.max(b)));
    }

    /// Let group `gid`'s raft messages to and from `node` through again.
    pub fn unmute_group(&mut self, gid: GroupId, node: u64) {
        self.muted.remove(&(gid, node));
    }

    /// Restore the links between `a` and `b`, both ways.
    pub fn reconnect(&mut self, a: u64, b: u64) {
        self.net.unblock(a, b);
        self.net.unblock(b, a);
    }

    /// Pause a node: its clock runs on, it processes nothing, batches to it wait.
    pub fn pause(&mut self, node: u64) {
        self.nodes[node as usize - 1].paused = true;
    }

    /// Resume a paused node; it gets the batches that waited.
    pub fn resume(&mut self, node: u64) {
        let idx = node as usize - 1;
        self.nodes[idx].paused = false;
        for b in std::mem::take(&mut self.nodes[idx].held) {
            self.deliver(b);
        }
    }

    /// Crash a node: memory and batches in flight to it are lost; its storages stay.
    pub fn crash(&mut self, node: u64) {
        let n = &mut self.nodes[node as usize - 1];
        n.node = None;
        n.paused = false;
        n.held.clear();
        n.reads.clear();
        n.writes.clear(); // their outcome is unknown to their clients
        self.net.drop_to(node);
        self.up_log.push((self.now_ns, node, false));
    }

    /// Restart a crashed node from its storages, with a new incarnation (unless the control).
    pub fn restart(&mut self, node: u64) {
        let idx = node as usize - 1;
        assert!(self.nodes[idx].node.is_none(), "node {node} is running");
        self.boot(idx);
    }

    /// Stop hosting group `gid` on `node` ([`MultiNode::remove_group`]): its replica is
    /// destroyed or moves away, while its storage stays for [`MultiSim::add_group`]. Reads and
    /// writes in flight through it are lost to their clients. `false` if the node is down or
    /// does not host the group.
    pub fn remove_group(&mut self, node: u64, gid: GroupId) -> bool {
        let n = &mut self.nodes[node as usize - 1];
        let Some(m) = n.node.as_mut() else {
            return false;
        };
        if m.remove_group(gid).is_err() {
            return false;
        }
        n.reads.retain(|(g, _), _| *g != gid);
        n.writes.remove(&gid);
        true
    }

    /// Host group `gid` on `node` again from its storage, as a restart would: the replica
    /// replays its log from its snapshot. `false` if the node is down or hosts it already.
    pub fn add_group(&mut self, node: u64, gid: GroupId) -> bool {
        let n = &mut self.nodes[node as usize - 1];
        let (Some(m), Some(storage)) = (n.node.as_mut(), n.storages.get(&gid)) else {
            return false;
        };
        if m.add_group(gid, storage.clone()).is_err() {
            return false;
        }
        n.kv.insert(gid, state_from(&storage.latest_snapshot().data));
        true
    }

    /// Whether `node` is up and hosts group `gid`.
    pub fn hosts(&self, node: u64, gid: GroupId) -> bool {
        self.node(node).is_some_and(|m| m.group(gid).is_some())
    }

    /// Give `node` its own promise (and election timeout) of `promise_ms` from its next boot: a
    /// rolling change of the setting.
    pub fn set_promise_ms(&mut self, node: u64, promise_ms: u64) {
        let idx = node as usize - 1;
        let per_node = &mut self.config.promise_ms_per_node;
        if per_node.len() <= idx {
            per_node.resize(idx + 1, 0);
        }
        per_node[idx] = promise_ms;
    }

    /// The promise `node` runs with (or will, from its next boot), in ms.
    pub fn promise_ms(&self, node: u64) -> u64 {
        own_promise(&self.config, node as usize - 1).0
    }

    /// The longest promise any node ran with so far (at least the shared setting), in ms: a
    /// fault that must outlast every promise waits this long.
    pub fn max_promise_ms(&self) -> u64 {
        let ran = self.nodes.iter().map(|n| n.max_promise_ms);
        ran.max().unwrap_or(0).max(self.config.lease.promise_ms)
    }

    /// The node's clock (to change its drift).
    pub fn clock(&self, node: u64) -> &SimClock {
        &self.nodes[node as usize - 1].clock
    }

    /// The network's fault settings.
    pub fn net_mut(&mut self) -> &mut BatchNet {
        &mut self.net
    }

    /// Ask `from`, leading group `gid`, to transfer its leadership to `to`.
    pub fn transfer_leader(&mut self, gid: GroupId, from: u64, to: u64) {
        let idx = from as usize - 1;
        if let Some(m) = self.live(idx) {
            m.transfer_leader(gid, to);
        }
        self.process(idx);
    }

    /// Propose a membership change of group `gid` through `node`.
    pub fn propose_conf_change(
        &mut self,
        gid: GroupId,
        node: u64,
        cc: ConfChangeV2,
    ) -> raft::Result<()> {
        let idx = node as usize - 1;
        let r = match self.live(idx) {
            Some(m) => m.propose_conf_change(gid, cc),
            None => Err(raft::Error::StepPeerNotFound),
        };
        self.process(idx);
        r
    }

    // ----- inspection -------------------------------------------------------------------------

    /// The running node `id`, if up.
    pub fn node(&self, id: u64) -> Option<&Node> {
        self.nodes.get(id as usize - 1)?.node.as_ref()
    }

    /// The live, unpaused leader of group `gid` with the highest term.
    pub fn leader(&self, gid: GroupId) -> Option<u64> {
        let up = self
            .nodes
            .iter()
            .filter(|n| !n.paused)
            .filter_map(|n| n.node.as_ref());
        let leaders = up.filter_map(|m| m.group(gid)).filter(|g| g.is_leader());
        leaders.max_by_key(|g| g.raw().raft.term).map(|g| g.id())
    }

    /// Every up, unpaused node that believes it leads group `gid`.
    pub fn believed_leaders(&self, gid: GroupId) -> Vec<u64> {
        let up = self
            .nodes
            .iter()
            .filter(|n| !n.paused)
            .filter_map(|n| n.node.as_ref());
        up.filter(|m| m.group(gid).is_some_and(|g| g.is_leader()))
            .map(|m| m.id())
            .collect()
    }

    /// Every group's history.
    pub fn histories(&self) -> &BTreeMap<GroupId, History> {
        &self.histories
    }

    /// Check every group's history, with every lease overlap the monitors saw, in one report.
    pub fn check(&self) -> CheckReport {
        let mut total = CheckReport::default();
        for (gid, h) in &self.histories {
            let r = h.check();
            total.violations.extend(r.violations);
            total.reads_checked += r.reads_checked;
            total.lease_reads_checked += r.lease_reads_checked;
            total.follower_reads_checked += r.follower_reads_checked;
            total.writes_acked += r.writes_acked;
            let m = &self.monitors[gid];
            total.violations.extend_from_slice(m.violations());
            total.lease_checks += m.checks();
        }
        total
    }

    /// Messages sent over the network so far (batches, and the messages inside them).
    pub fn sent(&self) -> (u64, u64) {
        (self.net.batches_sent, self.net.messages_sent)
    }

    /// The configuration the cluster was built with.
    pub fn config(&self) -> &MultiSimConfig {
        &self.config
    }

    /// Whether `node` is up.
    pub fn is_up(&self, node: u64) -> bool {
        self.node(node).is_some()
    }

    /// Whether `node` is paused.
    pub fn is_paused(&self, node: u64) -> bool {
        self.nodes[node as usize - 1].paused
    }

    /// Show each group's monitor every replica of it at this instant.
    fn observe_leases(&mut self) {
        let ids: Vec<u64> = self.nodes.iter().map(|n| n.id).collect();
        for gid in 1..=self.config.groups {
            let views: Vec<NodeView> = self.nodes.iter().map(|n| view(n, gid, &ids)).collect();
            self.monitors
                .get_mut(&gid)
                .expect("known")
                .observe(self.now_ns, &views);
            let now = self.leader_holds_lease(gid);
            let (was, since) = self.leased.entry(gid).or_default();
            if now && !*was {
                since.push(self.now_ns);
            }
            *was = now;
        }
    }

    /// Whether group `gid`'s live, unpaused leader (of the highest term) holds a lease now.
    pub fn leader_holds_lease(&self, gid: GroupId) -> bool {
        let Some(leader) = self.leader(gid) else {
            return false;
        };
        let g = self.node(leader).and_then(|m| m.group(gid));
        g.is_some_and(|g| g.lease_status().state.is_held())
    }

    /// The first instant at or after `since_ns` at which a majority of each of `halves` (the
    /// voters of a configuration, incoming and outgoing) were up, booted, paused or not.
    pub fn majority_up_ns(&self, halves: [&[u64]; 2], since_ns: u64) -> Option<u64> {
        let mut up: BTreeSet<u64> = BTreeSet::new();
        let majority = |up: &BTreeSet<u64>| {
            halves.iter().all(|voters| {
                voters.is_empty()
                    || 2 * voters.iter().filter(|v| up.contains(v)).count() > voters.len()
            })
        };
        let mut at = since_ns;
        for &(change_ns, node, is_up) in &self.up_log {
            if change_ns > since_ns && majority(&up) {
                return Some(at);
            }
            at = change_ns.max(since_ns);
            match is_up {
                true => up.insert(node),
                false => up.remove(&node),
            };
        }
        majority(&up).then_some(at)
    }

    /// The first instant at or after `since_ns` at which group `gid` came to have a live leader
    /// holding a lease (after a step without one), if it did.
    pub fn leased_again_ns(&self, gid: GroupId, since_ns: u64) -> Option<u64> {
        let (_, since) = self.leased.get(&gid)?;
        since.iter().copied().find(|&t| t >= since_ns)
    }
}

/// The monitor's view of node `n`'s replica of `gid`.
fn view(n: &SimNode, gid: GroupId, ids: &[u64]) -> NodeView {
    let Some(g) = n.node.as_ref().and_then(|m| m.group(gid)) else {
        let hs = n.storages[&gid]
            .initial_state()
            .map(|s| s.hard_state)
            .unwrap_or_default();
        return NodeView {
            id: n.id,
            term: hs.term,
            leading: false,
            candidate: false,
            lease_term: None,
            read_lease_term: None,
            campaigning: false,
            vote: hs.vote,
            // A crashed node, or one not hosting the group, cannot vote; its boot promise, or the
            // fortification its node keeps for a group hosted again, speaks for it once it can.
            backs: ids.to_vec(),
            voters: (Vec::new(), Vec::new()),
        };
    };
    let m = n.node.as_ref().expect("up");
    let status = g.lease_status();
    let r = &g.raw().raft;
    let cs = r.prs().conf().to_conf_state();
    NodeView {
        id: n.id,
        term: r.term,
        leading: r.state == StateRole::Leader,
        candidate: r.state == StateRole::Candidate,
        lease_term: status.term.filter(|_| status.state.is_held()),
        read_lease_term: g.read_lease_term(),
        campaigning: matches!(r.state, StateRole::Candidate | StateRole::PreCandidate),
        vote: r.vote,
        backs: ids
            .iter()
            .copied()
            .filter(|&l| m.promise_backs(gid, l))
            .collect(),
        voters: (cs.voters, cs.voters_outgoing),
    }
}

/// Group `gid`'s voters at first: see [`MultiSimConfig::replicas`].
fn initial_voters(c: &MultiSimConfig, gid: GroupId) -> Vec<u64> {
    let n = c.nodes;
    let replicas = if c.replicas == 0 {
        n
    } else {
        c.replicas.min(n)
    };
    let mut voters: Vec<u64> = (0..replicas).map(|i| (gid - 1 + i) % n + 1).collect();
    voters.sort_unstable();
    voters
}

/// Node `idx`'s promise and election timeout in ticks: its own setting if it has one (the
/// election timeout then equals the promise), else the shared ones.
fn own_promise(c: &MultiSimConfig, idx: usize) -> (u64, usize) {
    match c.promise_ms_per_node.get(idx).copied().unwrap_or(0) {
        0 => (c.lease.promise_ms, c.election_tick),
        ms => (ms, (ms / c.tick_ms) as usize),
    }
}

fn state_from(snapshot: &[u8]) -> KvState {
    let mut kv = KvState::new();
    if !snapshot.is_empty() {
        kv.restore(snapshot)
            .expect("the simulator wrote this snapshot");
    }
    kv
}

/// Hand finished reads of every group back to their clients.
fn serve_reads(n: &mut SimNode, histories: &mut BTreeMap<GroupId, History>, now_ns: u64) {
    let SimNode {
        node, kv, reads, ..
    } = n;
    let Some(node) = node.as_mut() else { return };
    for gid in node.group_ids() {
        let state = kv.entry(gid).or_default();
        let served = node.serve_reads(gid, |rid| {
            reads
                .get(&(gid, rid))
                .and_then(|(_, key)| SimStateMachine::get(&*state, key))
        });
        for s in served {
            let Some((op, _)) = reads.remove(&(gid, s.id)) else {
                continue;
            };
            let result = match s.result {
                Ok((value, served)) => OpResult::Read { value, served },
                Err(e) => OpResult::Failed(e.to_string()),
            };
            histories
                .get_mut(&gid)
                .expect("known")
                .complete(op, result, now_ns);
        }
    }
}
