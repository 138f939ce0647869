//! A minimal replicated store to copy: three nodes in one process, raft messages over channels,
//! raft-rs's `MemStorage`, and a `HashMap` for the state machine. Reader threads read through
//! each node's `ReadHandle` and hand a read to the node's raft thread when no lease is held. The
//! leader is killed halfway; reads go on, and every read is checked against the writes
//! acknowledged before it began. `cargo run --example embed`: about three seconds.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use raft::eraftpb::{Entry, EntryType, Message};
use raft::storage::MemStorage;
use raft_lease::{BootClock, LeaseConfig, LeaseNode, MemApp, ReadError, ReadHandle, ReadKind};
use raft_lease::{ReadId, ReadMode};

const TICK: Duration = Duration::from_millis(10);
type Kv = Arc<RwLock<HashMap<String, u64>>>;
type Node = LeaseNode<MemStorage, BootClock>;
type Answer = Result<(Option<u64>, ReadKind), ReadError>;
/// What the clients count: reads served on a reader thread through node `i`'s handle, or through
/// a raft thread; failures; writes.
const HANDLE: [&str; 3] = [
    "via node 1's handle",
    "via node 2's handle",
    "via node 3's handle",
];
const RAFT_THREAD: [&str; 2] = ["lease via a raft thread", "ReadIndex via a raft thread"];
const REFUSED: &str = "refused (not the leader)";
const UNANSWERED: &str = "unanswered (a dead node)";
const STALE: &str = "STALE";
const WENT_BACK: &str = "older than an earlier read";
const WRITES: &str = "writes acknowledged";

/// What a node's raft thread receives.
enum Input {
    Raft(Message),
    /// Write `counter = value`; answered once this node has applied it.
    Put(u64, Sender<()>),
    /// A read handed over by a reader thread.
    Get(Sender<Answer>),
    Stop,
}

/// The node's transport and state machine, for `handle_ready`.
struct App {
    peers: HashMap<u64, Sender<Input>>,
    kv: Kv,
    /// Writes proposed here, by value, to answer when applied.
    puts: HashMap<u64, Sender<()>>,
}

impl MemApp<BootClock> for App {
    fn send(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            let _ = self.peers[&m.to].send(Input::Raft(m)); // a dead peer loses it
        }
    }

    fn apply(&mut self, _: &mut Node, entries: Vec<Entry>) {
        for e in entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal)
        {
            if let Ok(bytes) = <[u8; 8]>::try_from(&e.data[..]) {
                let value = u64::from_be_bytes(bytes);
                self.kv.write().unwrap().insert("counter".into(), value);
                if let Some(done) = self.puts.remove(&value) {
                    let _ = done.send(());
                }
            }
        }
    }
}

/// The raft thread: tick on time, step and serve what arrives, process `Ready`s.
fn run_node(mut node: Node, mut app: App, inbox: Receiver<Input>, leader: Arc<AtomicU64>) {
    let mut next_tick = Instant::now() + TICK;
    let mut gets: HashMap<ReadId, Sender<Answer>> = HashMap::new();
    loop {
        match inbox.recv_deadline(next_tick) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Input::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(Input::Raft(m)) => drop(node.step(m)), // raft drops what it refuses
            Ok(Input::Put(value, done)) if node.is_leader() => {
                app.puts.insert(value, done);
                drop(node.propose(vec![], value.to_be_bytes().to_vec())); // if refused: times out
            }
            Ok(Input::Put(..)) => {} // not the leader: the writer times out and retries
            Ok(Input::Get(reply)) => match node.read(ReadMode::Auto) {
                Ok(id) => drop(gets.insert(id, reply)),
                Err(e) => drop(reply.send(Err(e))),
            },
        }
        while Instant::now() >= next_tick {
            node.tick();
            next_tick += TICK;
        }
        node.handle_ready(&mut app)
            .expect("MemStorage does not fail");
        let kv = app.kv.read().unwrap();
        for read in node.serve_reads(|_id| kv.get("counter").copied()) {
            if let Some(reply) = gets.remove(&read.id) {
                let _ = reply.send(read.result);
            }
        }
        if node.is_leader() {
            leader.store(node.id(), SeqCst);
        }
    }
}

/// What the clients saw, counted by what it was: in this phase, and in all.
#[derive(Default)]
struct Stats(Mutex<[BTreeMap<&'static str, u64>; 2]>);

impl Stats {
    fn bump(&self, what: &'static str) {
        self.0
            .lock()
            .unwrap()
            .iter_mut()
            .for_each(|m| *m.entry(what).or_default() += 1);
    }

    /// The counts of the phase that ends, as a line.
    fn phase(&self) -> String {
        let phase = std::mem::take(&mut self.0.lock().unwrap()[0]);
        let all = HANDLE
            .iter()
            .chain(&RAFT_THREAD)
            .chain(&[REFUSED, UNANSWERED]);
        let reads = all.filter_map(|what| Some(format!("{} {what}", phase.get(what)?)));
        let reads = reads.collect::<Vec<_>>().join(", ");
        let bad =
            [STALE, WENT_BACK].map(|what| format!("{} {what}", phase.get(what).unwrap_or(&0)));
        let writes = phase.get(WRITES).unwrap_or(&0);
        format!("reads {reads} ({}); {writes} {WRITES}", bad.join(", "))
    }

    fn total(&self, what: &str) -> u64 {
        self.0.lock().unwrap()[1].get(what).copied().unwrap_or(0)
    }
}

/// Shared by the clients: inboxes, handles and state of every node, the leader as last seen.
struct Cluster {
    inboxes: Vec<Sender<Input>>,
    handles: Vec<ReadHandle<BootClock>>,
    kvs: Vec<Kv>,
    leader: Arc<AtomicU64>,
    /// The newest value acknowledged to the writer.
    acked: AtomicU64,
    stop: AtomicBool,
    stats: Stats,
}

/// A reader thread: a lease read through the leader's handle, else through its raft thread.
fn reader(c: &Cluster) {
    let mut last_seen = 0;
    while !c.stop.load(SeqCst) {
        let acked_before = c.acked.load(SeqCst);
        let i = (c.leader.load(SeqCst) - 1) as usize;
        let got = match c.handles[i].read(|| c.kvs[i].read().unwrap().get("counter").copied()) {
            Ok(v) => Ok((v, HANDLE[i])),
            Err(_lease_not_held) => {
                let (reply, answer) = bounded(1);
                let _ = c.inboxes[i].send(Input::Get(reply)); // a dead node never answers
                match answer.recv_timeout(Duration::from_millis(300)) {
                    Ok(Ok((v, ReadKind::Lease | ReadKind::FollowerLease))) => {
                        Ok((v, RAFT_THREAD[0]))
                    }
                    Ok(Ok((v, ReadKind::Index))) => Ok((v, RAFT_THREAD[1])),
                    Ok(Err(_not_leader)) => Err(REFUSED),
                    Err(_dead_or_slow) => Err(UNANSWERED),
                }
            }
        };
        match got {
            Ok((v, seen)) => {
                c.stats.bump(seen);
                let v = v.unwrap_or(0);
                if v < acked_before {
                    c.stats.bump(STALE);
                }
                if v < last_seen {
                    c.stats.bump(WENT_BACK);
                }
                last_seen = last_seen.max(v);
            }
            Err(seen) => c.stats.bump(seen),
        }
        thread::sleep(Duration::from_micros(300));
    }
}

/// The writer: `counter` = 1, 2, 3, … through the leader, one at a time.
fn writer(c: &Cluster) {
    for value in 1.. {
        if c.stop.load(SeqCst) {
            return;
        }
        let (done, acked) = bounded(1);
        let _ = c.inboxes[(c.leader.load(SeqCst) - 1) as usize].send(Input::Put(value, done));
        if acked.recv_timeout(Duration::from_millis(300)).is_ok() {
            c.acked.fetch_max(value, SeqCst);
            c.stats.bump(WRITES);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Wait for `done`, for at most 10 s; a cluster that cannot do it is a failure.
fn wait(what: &str, done: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(10) {
            eprintln!("embed: FAILED: no {what} within 10 s");
            std::process::exit(1);
        }
        thread::sleep(Duration::from_millis(1));
    }
    start.elapsed()
}

fn main() {
    let lease = LeaseConfig {
        promise_ms: 200,
        drift_ppm: 500,
        margin_ms: 5,
        ..LeaseConfig::default()
    };
    let (senders, receivers): (Vec<Sender<Input>>, Vec<_>) = (0..3).map(|_| unbounded()).unzip();
    let leader = Arc::new(AtomicU64::new(0));
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let (mut handles, mut kvs, mut threads) = (Vec::new(), Vec::new(), Vec::new());
    for (id, inbox) in (1..=3u64).zip(receivers) {
        let rc = raft::Config {
            id,
            election_tick: 20,
            heartbeat_tick: 3,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        };
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let tick_ms = TICK.as_millis() as u64;
        let node = LeaseNode::new(
            &rc,
            storage,
            lease.clone(),
            tick_ms,
            BootClock::new(),
            &logger,
        )
        .expect("a valid configuration");
        if id == 1 {
            println!(
                "3 nodes, ticks of {tick_ms} ms, election timeout 200 ms, heartbeats every 30 ms; \
                 P = 200 ms, ρ = 500 ppm, ε = 5 ms: lease L = {:.1} ms",
                node.derived().lease_ns as f64 / 1e6
            );
        }
        handles.push(node.read_handle());
        let kv = Kv::default();
        kvs.push(kv.clone());
        let peers = (1..=3).zip(senders.iter().cloned()).collect();
        let app = App {
            peers,
            kv,
            puts: HashMap::new(),
        };
        let leader = leader.clone();
        threads.push(thread::spawn(move || run_node(node, app, inbox, leader)));
    }
    let c = Cluster {
        inboxes: senders,
        handles,
        kvs,
        leader,
        acked: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        stats: Stats::default(),
    };
    let leads = |id: u64| id > 0 && c.handles[id as usize - 1].lease_held();
    let took = wait("leader with a lease", || leads(c.leader.load(SeqCst)));
    let first = c.leader.load(SeqCst);
    println!(
        "node {first} leads with a lease {} ms after start",
        took.as_millis()
    );

    thread::scope(|s| {
        s.spawn(|| writer(&c));
        s.spawn(|| reader(&c));
        s.spawn(|| reader(&c));
        thread::sleep(Duration::from_secs(1));
        println!("1 s of load: {}", c.stats.phase());

        c.inboxes[first as usize - 1].send(Input::Stop).unwrap();
        println!("killed node {first}, the leader");
        let took = wait("new leader with a lease", || {
            let now = c.leader.load(SeqCst);
            now != first && leads(now)
        });
        println!(
            "node {} leads with a lease {} ms after the kill; meanwhile: {}",
            c.leader.load(SeqCst),
            took.as_millis(),
            c.stats.phase()
        );
        thread::sleep(Duration::from_secs(1));
        println!("1 s more: {}", c.stats.phase());
        c.stop.store(true, SeqCst);
    });
    for inbox in &c.inboxes {
        let _ = inbox.send(Input::Stop);
    }
    threads
        .into_iter()
        .for_each(|t| t.join().expect("node thread"));

    let reads: u64 = HANDLE
        .iter()
        .chain(&RAFT_THREAD)
        .map(|w| c.stats.total(w))
        .sum();
    let (stale, went_back) = (c.stats.total(STALE), c.stats.total(WENT_BACK));
    println!(
        "checked {reads} reads against the writes acknowledged before each began: {stale} stale, \
         {went_back} older than an earlier read by the same thread"
    );
    if stale + went_back > 0 {
        eprintln!("embed: FAILED: a read was not linearizable");
        std::process::exit(1);
    }
}
