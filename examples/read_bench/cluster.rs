//! An in-process cluster of `LeaseNode`s on real threads and the real clock. A network thread
//! delays every raft message by a one-way delay; messages are protobuf-encoded on the way.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, unbounded, Receiver, Sender};
use protobuf::Message as _;
use raft::eraftpb::{Entry, EntryType, Message};
use raft::storage::MemStorage;
use raft_lease::drive::MemApp;
use raft_lease::follower::Keys;
use raft_lease::{
    Clock, FollowerLeases, LeaseConfig, LeaseNode, MonotonicClock, ReadHandle, ReadId, ReadKind,
    ReadMode, Safeties,
};

/// The replicated state: a register per key, `KEYS` keys. Reads are plain atomic loads, so the
/// `local` baseline and the lease reads pay the same for the state itself and readers on many
/// threads share nothing but read-only cache lines.
pub type State = Arc<Vec<AtomicU64>>;

/// Keys in the state.
pub const KEYS: u64 = 1_024;

/// The value of `key`.
pub fn get(state: &State, key: u64) -> u64 {
    state[(key % KEYS) as usize].load(Ordering::Acquire)
}
/// Every node's inbox and liveness, for sending without the network thread.
type Direct = (Vec<Sender<Vec<u8>>>, Vec<Arc<AtomicBool>>);
/// A node's inbox of encoded raft messages.
type Inbox = (Sender<Vec<u8>>, Receiver<Vec<u8>>);
type Node = LeaseNode<MemStorage, Arc<MonotonicClock>>;

pub const TICK: Duration = Duration::from_millis(10);
const ELECTION_TICKS: usize = 30;
const HEARTBEAT_TICKS: usize = 3;

/// A finished read: when it was issued, and how it was served (`None`: it failed).
pub struct Done {
    pub started: Instant,
    pub kind: Option<ReadKind>,
}

/// Work for a node thread.
pub enum Cmd {
    /// A read through the layer.
    Read {
        mode: ReadMode,
        started: Instant,
        reply: Sender<Done>,
    },
    /// raft-rs's own `read_index`, one round per read.
    RawRead {
        started: Instant,
        reply: Sender<Done>,
    },
    /// A write of `key`, answered once applied here.
    Write {
        key: u64,
        value: u64,
        started: Instant,
        reply: Sender<Done>,
    },
    Stop,
}

/// What the cluster knows of one node.
pub struct NodeSlot {
    pub cmds: Sender<Cmd>,
    pub state: State,
    pub handle: ReadHandle<Arc<MonotonicClock>>,
    pub is_leader: Arc<AtomicBool>,
    pub alive: Arc<AtomicBool>,
    storage: MemStorage,
    thread: Option<JoinHandle<()>>,
}

/// The delayed network: one thread, messages ordered by delivery time.
struct Net {
    tx: Sender<(Instant, u64, Vec<u8>)>,
    /// Messages sent by any node.
    sent: Arc<AtomicU64>,
}

pub struct Cluster {
    pub nodes: Vec<NodeSlot>,
    net: Net,
    inboxes: Vec<Inbox>,
    alive: Vec<Arc<AtomicBool>>,
    clock: Arc<MonotonicClock>,
    mode: Safeties,
    delay: Duration,
    opts: Opts,
    /// The id of the node made slow (0: none).
    slow: Arc<AtomicU64>,
}

/// What a cluster runs with beyond the safeties and the one-way delay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Opts {
    /// Follower read leases (off: `None`).
    pub follower_leases: Option<FollowerLeases>,
    /// The one-way delay of a node made slow with [`Cluster::slow_down`], both ways.
    pub slow_delay: Option<Duration>,
}

impl Cluster {
    /// Start `n` nodes with a one-way `delay`, in `mode` (Safe, or RaftLeaseBased for raft-rs's own).
    pub fn start(n: u64, delay: Duration, mode: Safeties) -> Cluster {
        Cluster::start_with(n, delay, mode, Opts::default())
    }

    /// [`Cluster::start`] with `opts`.
    pub fn start_with(n: u64, delay: Duration, mode: Safeties, opts: Opts) -> Cluster {
        let inboxes: Vec<_> = (0..n).map(|_| unbounded()).collect();
        let alive: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::new(AtomicBool::new(true))).collect();
        let net = start_net(
            inboxes.iter().map(|(tx, _)| tx.clone()).collect(),
            alive.clone(),
        );
        let voters: Vec<u64> = (1..=n).collect();
        let clock = Arc::new(MonotonicClock::new());
        let mut c = Cluster {
            nodes: Vec::new(),
            net,
            inboxes,
            alive: alive.clone(),
            clock,
            mode,
            delay,
            opts,
            slow: Arc::new(AtomicU64::new(0)),
        };
        for id in 1..=n {
            let storage = MemStorage::new_with_conf_state((voters.clone(), vec![]));
            let slot = c.spawn(id, storage, alive[id as usize - 1].clone());
            c.nodes.push(slot);
        }
        c
    }

    fn spawn(&self, id: u64, storage: MemStorage, alive: Arc<AtomicBool>) -> NodeSlot {
        let rc = raft::Config {
            id,
            election_tick: ELECTION_TICKS,
            heartbeat_tick: HEARTBEAT_TICKS,
            check_quorum: true,
            pre_vote: true,
            max_inflight_msgs: 256,
            max_size_per_msg: 1 << 20,
            ..raft::Config::default()
        };
        let lease = LeaseConfig {
            promise_ms: 300,
            drift_ppm: 500,
            margin_ms: 5,
            safeties: self.mode,
            follower_leases: self.opts.follower_leases,
            ..LeaseConfig::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = LeaseNode::new(
            &rc,
            storage.clone(),
            lease,
            TICK.as_millis() as u64,
            self.clock.clone(),
            &logger,
        )
        .expect("bench node config");
        let mut node = node;
        node.set_entry_keys(entry_keys);
        let (cmd_tx, cmd_rx) = unbounded();
        let state: State = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let is_leader = Arc::new(AtomicBool::new(false));
        alive.store(true, Ordering::Release);
        let io = BenchIo {
            state: state.clone(),
            net: self.net.tx.clone(),
            direct: (self.delay.is_zero() && self.opts.slow_delay.is_none()).then(|| {
                let inboxes = self.inboxes.iter().map(|(tx, _)| tx.clone()).collect();
                (inboxes, self.alive.clone())
            }),
            sent: self.net.sent.clone(),
            delay: self.delay,
            slow: (
                self.slow.clone(),
                self.opts.slow_delay.unwrap_or(self.delay),
            ),
            writes: HashMap::new(),
        };
        let worker = Worker {
            node,
            io,
            is_leader: is_leader.clone(),
            inbox: self.inboxes[id as usize - 1].1.clone(),
            cmds: cmd_rx,
            reads: HashMap::new(),
            raw_reads: HashMap::new(),
            raw_ready: Vec::new(),
            next_ctx: 0,
        };
        let handle = worker.node.read_handle();
        let thread = std::thread::Builder::new()
            .name(format!("node-{id}"))
            .spawn(move || worker.run())
            .expect("spawn node");
        NodeSlot {
            cmds: cmd_tx,
            state,
            handle,
            is_leader,
            alive,
            storage,
            thread: Some(thread),
        }
    }

    /// The node that believes it leads and holds a lease (or, for raft-rs modes, just leads).
    pub fn leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for (i, n) in self.nodes.iter().enumerate() {
                let usable = self.mode == Safeties::raft_lease_based() || n.handle.lease_held();
                if n.alive.load(Ordering::Acquire) && n.is_leader.load(Ordering::Acquire) && usable
                {
                    return Some(i);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// From now on, node `id`'s messages take [`Opts::slow_delay`] both ways.
    pub fn slow_down(&self, id: u64) {
        assert!(self.opts.slow_delay.is_some(), "no slow delay configured");
        self.slow.store(id, Ordering::Relaxed);
    }

    /// Messages sent by all nodes so far.
    pub fn messages_sent(&self) -> u64 {
        self.net.sent.load(Ordering::Relaxed)
    }

    /// Stop node `i`'s thread; the network drops messages to it. Its raft storage is kept.
    pub fn kill(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.alive.store(false, Ordering::Release);
        let _ = n.cmds.send(Cmd::Stop);
        if let Some(t) = n.thread.take() {
            let _ = t.join();
        }
        n.is_leader.store(false, Ordering::Release);
        while self.inboxes[i].1.try_recv().is_ok() {}
    }

    /// Restart a killed node from its raft storage (its state is rebuilt from the log).
    pub fn restart(&mut self, i: usize) {
        let storage = self.nodes[i].storage.clone();
        let alive = self.nodes[i].alive.clone();
        self.nodes[i] = self.spawn(i as u64 + 1, storage, alive);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].thread.is_some() {
                self.kill(i);
            }
        }
    }
}

fn start_net(inboxes: Vec<Sender<Vec<u8>>>, alive: Vec<Arc<AtomicBool>>) -> Net {
    let (tx, rx) = unbounded::<(Instant, u64, Vec<u8>)>();
    let sent = Arc::new(AtomicU64::new(0));
    std::thread::Builder::new()
        .name("net".into())
        .spawn(move || {
            let mut queue: BinaryHeap<Reverse<(Instant, u64, usize)>> = BinaryHeap::new();
            let mut bodies: HashMap<u64, Vec<u8>> = HashMap::new();
            let mut seq = 0u64;
            loop {
                let wait = queue
                    .peek()
                    .map(|Reverse((at, _, _))| at.saturating_duration_since(Instant::now()));
                let got = match wait {
                    Some(w) => rx.recv_timeout(w).map_err(|e| e.is_disconnected()),
                    None => rx.recv().map_err(|_| true),
                };
                match got {
                    Ok((at, to, bytes)) => {
                        seq += 1;
                        bodies.insert(seq, bytes);
                        queue.push(Reverse((at, seq, to as usize - 1)));
                    }
                    Err(true) => return,
                    Err(false) => {}
                }
                let now = Instant::now();
                while let Some(Reverse((at, s, to))) = queue
                    .peek()
                    .copied()
                    .filter(|Reverse((at, _, _))| *at <= now)
                {
                    let _ = at;
                    queue.pop();
                    let bytes = bodies.remove(&s).expect("queued");
                    if alive[to].load(Ordering::Acquire) {
                        let _ = inboxes[to].send(bytes);
                    }
                }
            }
        })
        .expect("spawn net");
    Net { tx, sent }
}

/// One node's thread.
struct Worker {
    node: Node,
    io: BenchIo,
    is_leader: Arc<AtomicBool>,
    inbox: Receiver<Vec<u8>>,
    cmds: Receiver<Cmd>,
    reads: HashMap<ReadId, (Instant, Sender<Done>)>,
    raw_reads: HashMap<Vec<u8>, (Instant, Sender<Done>)>,
    /// raft-rs read states waiting for apply: (index, started, reply).
    raw_ready: Vec<(u64, Instant, Sender<Done>)>,
    next_ctx: u64,
}

/// A node's network, state and waiting writes, as `LeaseNode::handle_ready` sees them.
struct BenchIo {
    state: State,
    net: Sender<(Instant, u64, Vec<u8>)>,
    /// With no delay, messages go straight to the receiver's inbox (if it is alive), not
    /// through the network thread.
    direct: Option<Direct>,
    sent: Arc<AtomicU64>,
    delay: Duration,
    /// The node (by id; 0: none) whose messages, both ways, take the other one-way delay.
    slow: (Arc<AtomicU64>, Duration),
    writes: HashMap<u64, (Instant, Sender<Done>)>,
}

/// The key a bench write writes: its first 8 bytes (a follower read of another key does not
/// wait for it).
fn entry_keys(e: &Entry) -> Keys {
    match e.get_entry_type() == EntryType::EntryNormal && e.data.len() == 16 {
        true => Keys::Some(vec![e.data[..8].to_vec()]),
        false => Keys::unknown(e),
    }
}

/// How long a node thread spins for new work before it parks: a read or a message that arrives
/// meanwhile is picked up in microseconds, with no futex wake-up. At idle it costs one spin per
/// tick (see the bench's idle CPU line).
const SPIN: Duration = Duration::from_micros(50);

/// The thread should stop.
struct Stopped;

impl Worker {
    fn run(mut self) {
        let mut next_tick = Instant::now() + TICK;
        let mut busy = false;
        loop {
            // With follower leases, a grant that ends may let held writes apply: wake for it.
            let wake = match self.node.next_wake_ns() {
                Some(at_ns) => {
                    let now_ns = self.node.clock().now_ns();
                    next_tick
                        .min(Instant::now() + Duration::from_nanos(at_ns.saturating_sub(now_ns)))
                }
                None => next_tick,
            };
            match self.wait_for_work(wake, busy) {
                Ok(worked) => busy = worked,
                Err(Stopped) => return,
            }
            if Instant::now() >= next_tick {
                self.node.tick();
                next_tick += TICK;
            }
            self.handle_ready();
            self.answer_reads();
            self.is_leader
                .store(self.node.is_leader(), Ordering::Release);
        }
    }

    /// Take every message and command waiting. After work (`busy`), spin up to [`SPIN`] for
    /// more before parking until some arrives or the next tick is due. Returns whether any came.
    fn wait_for_work(&mut self, next_tick: Instant, busy: bool) -> Result<bool, Stopped> {
        let spin = if busy { SPIN } else { Duration::ZERO };
        let spin_until = (Instant::now() + spin).min(next_tick);
        loop {
            if self.drain()? {
                return Ok(true);
            }
            if Instant::now() >= spin_until {
                break;
            }
            // Yield rather than burn the core: with more busy threads than cores, the thread
            // this one waits for may need it.
            std::thread::yield_now();
        }
        let timeout = next_tick.saturating_duration_since(Instant::now());
        let got = select! {
            recv(self.inbox) -> m => m.map(|bytes| self.step(&bytes)).is_ok(),
            recv(self.cmds) -> c => match c {
                Ok(Cmd::Stop) | Err(_) => return Err(Stopped),
                Ok(cmd) => { self.command(cmd); true }
            },
            default(timeout) => false,
        };
        Ok(self.drain()? || got)
    }

    /// Step every waiting message and run every waiting command, so that one `Ready` (and one
    /// ReadIndex round) covers them all. Returns whether there was any.
    fn drain(&mut self) -> Result<bool, Stopped> {
        let mut any = false;
        while let Ok(bytes) = self.inbox.try_recv() {
            self.step(&bytes);
            any = true;
        }
        loop {
            match self.cmds.try_recv() {
                Ok(Cmd::Stop) => return Err(Stopped),
                Ok(cmd) => self.command(cmd),
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(any),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(Stopped),
            }
            any = true;
        }
    }

    fn step(&mut self, bytes: &[u8]) {
        if let Ok(m) = Message::parse_from_bytes(bytes) {
            let _ = self.node.step(m);
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Read {
                mode,
                started,
                reply,
            } => match self.node.read(mode) {
                Ok(id) => {
                    self.reads.insert(id, (started, reply));
                }
                Err(_) => {
                    let _ = reply.send(Done {
                        started,
                        kind: None,
                    });
                }
            },
            Cmd::RawRead { started, reply } => {
                self.next_ctx += 1;
                let ctx = format!("bench-{}", self.next_ctx).into_bytes();
                self.raw_reads.insert(ctx.clone(), (started, reply));
                self.node
                    .raw_read_index(ctx)
                    .expect("bench contexts are outside the reserved prefix");
            }
            Cmd::Write {
                key,
                value,
                started,
                reply,
            } => {
                let mut data = key.to_be_bytes().to_vec();
                data.extend_from_slice(&value.to_be_bytes());
                if self.node.propose(vec![], data).is_ok() {
                    self.io.writes.insert(key ^ value, (started, reply));
                } else {
                    let _ = reply.send(Done {
                        started,
                        kind: None,
                    });
                }
            }
            Cmd::Stop => unreachable!("handled by run"),
        }
    }

    fn handle_ready(&mut self) {
        self.node
            .handle_ready(&mut self.io)
            .expect("MemStorage never fails");
    }

    fn answer_reads(&mut self) {
        let state = &self.io.state;
        let served = self.node.serve_reads(|_| get(state, 1));
        for s in served {
            if let Some((started, reply)) = self.reads.remove(&s.id) {
                let _ = reply.send(Done {
                    started,
                    kind: s.result.ok().map(|(_, k)| k),
                });
            }
        }
        for rs in self.node.take_raw_read_states() {
            if let Some((started, reply)) = self.raw_reads.remove(&rs.request_ctx) {
                self.raw_ready.push((rs.index, started, reply));
            }
        }
        let applied = self.node.raw().raft.raft_log.applied;
        let state = &self.io.state;
        self.raw_ready.retain(|(index, started, reply)| {
            if *index > applied {
                return true;
            }
            std::hint::black_box(get(state, 1));
            let _ = reply.send(Done {
                started: *started,
                kind: Some(ReadKind::Index),
            });
            false
        });
    }
}

impl MemApp<Arc<MonotonicClock>> for BenchIo {
    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            self.sent.fetch_add(1, Ordering::Relaxed);
            let bytes = m.write_to_bytes().expect("encode");
            if let Some((inboxes, alive)) = &self.direct {
                let to = m.to as usize - 1;
                if alive[to].load(Ordering::Acquire) {
                    let _ = inboxes[to].send(bytes);
                }
                continue;
            }
            let slow = self.slow.0.load(Ordering::Relaxed);
            let delay = match m.to == slow || m.from == slow {
                true => self.slow.1,
                false => self.delay,
            };
            let _ = self.net.send((Instant::now() + delay, m.to, bytes));
        }
    }

    fn apply(&mut self, _: &mut Node, entries: Vec<Entry>) {
        let writes = entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && e.data.len() == 16);
        for e in writes {
            let key = u64::from_be_bytes(e.data[..8].try_into().expect("8 bytes"));
            let value = u64::from_be_bytes(e.data[8..].try_into().expect("8 bytes"));
            self.state[(key % KEYS) as usize].store(value, Ordering::Release);
            if let Some((started, reply)) = self.writes.remove(&(key ^ value)) {
                let _ = reply.send(Done {
                    started,
                    kind: Some(ReadKind::Index),
                });
            }
        }
    }
}
