//! The delayed network: one thread holds every node batch for the one-way delay, then hands it
//! to the destination node's inbox. Batches are moved, not serialized (so neither mode pays for
//! encoding; per-group heartbeats would pay the most). A batch from or to a dead node is dropped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, RecvTimeoutError, Sender};
use raft_lease::multi::NodeBatch;

/// A batch and the instant it is due at its destination.
pub type InFlight = (Instant, NodeBatch);

/// The network thread and the way into it.
pub struct Net {
    tx: Option<Sender<InFlight>>,
    thread: Option<JoinHandle<()>>,
}

impl Net {
    /// Start the network over the nodes' inboxes (node `id` at index `id - 1`) and liveness.
    pub fn start(inboxes: Vec<Sender<NodeBatch>>, alive: Vec<Arc<AtomicBool>>) -> Net {
        let (tx, rx) = unbounded::<InFlight>();
        let thread = std::thread::Builder::new()
            .name("net".into())
            .spawn(move || {
                // Every batch waits the same delay: sending order is (nearly) delivery order,
                // and each sender's own batches stay in order, as on a TCP connection.
                let mut queue: VecDeque<InFlight> = VecDeque::new();
                loop {
                    let got = match queue.front() {
                        Some((at, _)) => {
                            rx.recv_timeout(at.saturating_duration_since(Instant::now()))
                        }
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match got {
                        Ok(item) => queue.push_back(item),
                        Err(RecvTimeoutError::Disconnected) => return,
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    deliver_due(&mut queue, &inboxes, &alive);
                }
            })
            .expect("spawn the network thread");
        Net {
            tx: Some(tx),
            thread: Some(thread),
        }
    }

    /// A sender for a node thread.
    pub fn sender(&self) -> Sender<InFlight> {
        self.tx.clone().expect("the network is up")
    }

    /// Wait for the network thread to end (once every node thread has dropped its sender).
    pub fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn deliver_due(
    queue: &mut VecDeque<InFlight>,
    inboxes: &[Sender<NodeBatch>],
    alive: &[Arc<AtomicBool>],
) {
    let now = Instant::now();
    let up = |id: u64| alive[id as usize - 1].load(Ordering::Acquire);
    while queue.front().is_some_and(|(at, _)| *at <= now) {
        let (_, batch) = queue.pop_front().expect("front");
        if up(batch.from) && up(batch.to) {
            let _ = inboxes[batch.to as usize - 1].send(batch);
        }
    }
}

/// The instant a batch sent now is due, `delay` later.
pub fn due(delay: Duration) -> Instant {
    Instant::now() + delay
}
