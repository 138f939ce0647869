//! Three nodes in one process, each a thread owning its `MultiNode` with every group, over the
//! delayed network. The bench sees each node through its groups' `ReadHandle`s, its counters
//! and its commands; it can kill a node (stop its thread; batches from and to it are dropped).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use raft::storage::MemStorage;
use raft_lease::multi::{GroupId, LivenessMode, MultiNode, NodeBatch};
use raft_lease::ReadHandle;

use crate::net::{InFlight, Net};
use crate::node::{App, Clock, Cmd, NodeStats, State, Worker};
use crate::timing::multi_config;

/// Nodes in the cluster, ids `1..=NODES`; every one is a voter of every group.
pub const NODES: u64 = 3;

/// What the bench holds of one node.
pub struct Slot {
    /// Per group, indexed by `gid - 1`: a read handle of this node's replica.
    pub handles: Vec<ReadHandle<Clock>>,
    pub state: State,
    pub stats: Arc<NodeStats>,
    alive: Arc<AtomicBool>,
    cmds: Sender<Cmd>,
    thread: Option<JoinHandle<()>>,
}

impl Slot {
    /// Whether the node's thread runs.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

pub struct Cluster {
    pub nodes: Vec<Slot>,
    pub groups: u64,
    net: Net,
}

impl Cluster {
    /// Boot `NODES` nodes hosting groups `1..=groups` in `mode`, batches delayed by `delay`.
    pub fn start(mode: LivenessMode, groups: u64, delay: Duration, seed: u64) -> Cluster {
        let inboxes: Vec<(Sender<NodeBatch>, Receiver<NodeBatch>)> =
            (0..NODES).map(|_| unbounded()).collect();
        let alive: Vec<Arc<AtomicBool>> = (0..NODES)
            .map(|_| Arc::new(AtomicBool::new(true)))
            .collect();
        let net = Net::start(
            inboxes.iter().map(|(tx, _)| tx.clone()).collect(),
            alive.clone(),
        );
        let booting: Vec<_> = (1..=NODES)
            .map(|id| {
                let inbox = inboxes[id as usize - 1].1.clone();
                let parts = (inbox, net.sender(), alive[id as usize - 1].clone());
                spawn(id, mode, groups, delay, seed, parts)
            })
            .collect();
        // Each thread builds its own groups (in parallel), then hands back their read handles.
        let nodes = booting.into_iter().map(|b| b.recv()).collect();
        Cluster { nodes, groups, net }
    }

    /// Stop node `i`'s thread (index `id - 1`); the network drops batches from and to it.
    pub fn kill(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.alive.store(false, Ordering::Release);
        let _ = n.cmds.send(Cmd::Stop);
        if let Some(t) = n.thread.take() {
            t.join().expect("node thread");
        }
    }

    /// Quiescent groups on each live node (asked of the node threads).
    pub fn quiescent(&self) -> Vec<usize> {
        let asks: Vec<Receiver<usize>> = self
            .nodes
            .iter()
            .filter(|n| n.is_alive())
            .map(|n| {
                let (tx, rx) = bounded(1);
                let _ = n.cmds.send(Cmd::Quiescent(tx));
                rx
            })
            .collect();
        asks.iter()
            .map(|rx| rx.recv_timeout(Duration::from_secs(10)).unwrap_or(0))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        self.net.stop();
    }
}

/// A node thread that is building its groups.
struct Booting {
    ready: Receiver<Vec<ReadHandle<Clock>>>,
    slot: Slot,
}

impl Booting {
    fn recv(mut self) -> Slot {
        self.slot.handles = self.ready.recv().expect("a node thread failed to boot");
        self.slot
    }
}

type Parts = (Receiver<NodeBatch>, Sender<InFlight>, Arc<AtomicBool>);

fn spawn(
    id: u64,
    mode: LivenessMode,
    groups: u64,
    delay: Duration,
    seed: u64,
    (inbox, net, alive): Parts,
) -> Booting {
    let (cmd_tx, cmds) = unbounded();
    let (ready_tx, ready) = bounded(1);
    let state: State = Arc::new((0..=groups).map(|_| AtomicU64::new(0)).collect());
    let stats = Arc::new(NodeStats::default());
    let (app_state, worker_stats) = (state.clone(), stats.clone());
    let thread = std::thread::Builder::new()
        .name(format!("node-{id}"))
        .spawn(move || {
            let node = build(id, mode, groups, seed);
            let handles = (1..=groups)
                .map(|g| node.group(g).expect("hosted").read_handle())
                .collect();
            let _ = ready_tx.send(handles);
            let app = App { state: app_state };
            let stats = worker_stats;
            Worker {
                node,
                app,
                inbox,
                cmds,
                net,
                delay,
                stats,
            }
            .run();
        })
        .expect("spawn a node thread");
    let slot = Slot {
        handles: Vec::new(),
        state,
        stats,
        alive,
        cmds: cmd_tx,
        thread: Some(thread),
    };
    Booting { ready, slot }
}

fn build(id: u64, mode: LivenessMode, groups: u64, seed: u64) -> crate::node::Multi {
    let voters: Vec<u64> = (1..=NODES).collect();
    let storages = (1..=groups).map(|g: GroupId| {
        let s = MemStorage::new_with_conf_state((voters.clone(), vec![]));
        (g, s)
    });
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    MultiNode::new(
        multi_config(id, mode, seed),
        storages,
        Clock::new(),
        &logger,
    )
    .unwrap_or_else(|e| panic!("node {id}: bad bench config: {e}"))
}
