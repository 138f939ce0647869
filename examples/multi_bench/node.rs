//! One node's thread: it owns a `MultiNode` hosting every group, steps the batches peers send,
//! ticks every `TICK_MS`, processes `Ready`s and hands its outbox to the network. It counts what
//! it sends and publishes its own thread CPU time at every tick.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::Mutex;
use raft::eraftpb::Entry;
use raft::storage::MemStorage;
use raft_lease::multi::{GroupId, MultiMemApp, MultiNode, NodeBatch};
use raft_lease::{LeaseNode, MonotonicClock};

use crate::net::{due, InFlight};
use crate::timing::TICK_MS;

pub type Clock = MonotonicClock;
pub type Multi = MultiNode<MemStorage, Clock>;

/// Each group's state on one node, indexed by group id: the index applied last. Lease reads
/// read it.
pub type State = Arc<Vec<AtomicU64>>;

/// What a node thread publishes for the bench.
#[derive(Default)]
pub struct NodeStats {
    /// Messages sent (`NodeBatch::len`, summed).
    pub msgs_sent: AtomicU64,
    /// Batches sent.
    pub batches_sent: AtomicU64,
    /// Ticks skipped because the thread was more than a tick late: raft time fell behind real
    /// time by this many ticks.
    pub ticks_missed: AtomicU64,
    /// The thread's CPU time and the instant it was read, at the last tick.
    cpu: Mutex<Option<(Instant, u64)>>,
}

impl NodeStats {
    /// `(instant, thread CPU ns)` as of the last tick.
    pub fn cpu(&self) -> Option<(Instant, u64)> {
        *self.cpu.lock()
    }
}

/// Work for a node thread besides batches.
pub enum Cmd {
    /// Answer how many groups are quiescent here.
    Quiescent(Sender<usize>),
    Stop,
}

/// The state machine of every group on one node.
pub struct App {
    pub state: State,
}

impl MultiMemApp<Clock> for App {
    fn apply(&mut self, group: GroupId, _: &mut LeaseNode<MemStorage, Clock>, entries: Vec<Entry>) {
        if let Some(last) = entries.last() {
            self.state[group as usize].store(last.index, Ordering::Release);
        }
    }
}

/// The thread was told to stop.
pub struct Stopped;

/// A node thread's parts.
pub struct Worker {
    pub node: Multi,
    pub app: App,
    pub inbox: Receiver<NodeBatch>,
    pub cmds: Receiver<Cmd>,
    pub net: Sender<InFlight>,
    pub delay: Duration,
    pub stats: Arc<NodeStats>,
}

impl Worker {
    /// Run until told to stop.
    pub fn run(mut self) {
        let tick = Duration::from_millis(TICK_MS);
        let mut next_tick = Instant::now() + tick;
        loop {
            if let Err(Stopped) = self.wait(next_tick) {
                return;
            }
            let now = Instant::now();
            if now >= next_tick {
                self.node.tick();
                next_tick += tick;
                if next_tick <= now {
                    // A timer fires once however late it is: raft time falls behind.
                    let late = (now - next_tick).as_nanos() / tick.as_nanos() + 1;
                    self.stats
                        .ticks_missed
                        .fetch_add(late as u64, Ordering::Relaxed);
                    next_tick += tick * late as u32;
                }
                self.publish_cpu();
            }
            self.node
                .handle_ready(&mut self.app)
                .expect("MemStorage never fails");
            self.send();
        }
    }

    /// Block until a batch or command arrives or the next tick is due; then step every batch
    /// waiting, so that one round of `Ready`s covers them all. `Err` when told to stop.
    fn wait(&mut self, next_tick: Instant) -> Result<(), Stopped> {
        let timeout = next_tick.saturating_duration_since(Instant::now());
        select! {
            recv(self.inbox) -> b => if let Ok(b) = b { self.node.step(b) },
            recv(self.cmds) -> c => self.command(c.unwrap_or(Cmd::Stop))?,
            default(timeout) => {},
        }
        while let Ok(b) = self.inbox.try_recv() {
            self.node.step(b);
        }
        while let Ok(c) = self.cmds.try_recv() {
            self.command(c)?;
        }
        Ok(())
    }

    fn command(&mut self, cmd: Cmd) -> Result<(), Stopped> {
        match cmd {
            Cmd::Stop => Err(Stopped),
            Cmd::Quiescent(reply) => {
                let ids = self.node.group_ids();
                let n = ids.iter().filter(|&&g| self.node.is_quiescent(g)).count();
                let _ = reply.send(n);
                Ok(())
            }
        }
    }

    fn send(&mut self) {
        for b in self.node.take_outbox() {
            self.stats
                .msgs_sent
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            self.stats.batches_sent.fetch_add(1, Ordering::Relaxed);
            let _ = self.net.send((due(self.delay), b));
        }
    }

    fn publish_cpu(&self) {
        *self.stats.cpu.lock() = Some((Instant::now(), thread_cpu_ns()));
    }
}

/// CPU time of the calling thread.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec, and CLOCK_THREAD_CPUTIME_ID is supported on
    // every target this example builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
