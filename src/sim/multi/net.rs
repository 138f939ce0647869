//! The simulated network between nodes: seeded delay, loss, duplication and reordering of whole
//! node batches, plus directed link cuts.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::multi::NodeBatch;
use crate::sim::NetConfig;

/// Node batches in flight.
#[derive(Debug, Default)]
pub struct BatchNet {
    /// Fault settings, changeable at any time.
    pub config: NetConfig,
    blocked: HashSet<(u64, u64)>,
    /// Extra one-way delay per directed link, in µs: a slow link, whose batches later ones
    /// on other links overtake (a straggler from an earlier incarnation, say).
    slow_us: HashMap<(u64, u64), u64>,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    by_seq: BTreeMap<u64, NodeBatch>,
    seq: u64,
    /// Batches handed to the network.
    pub batches_sent: u64,
    /// Messages inside them (raft, fortification and support), counted one by one.
    pub messages_sent: u64,
}

impl BatchNet {
    /// A network with these settings.
    pub fn new(config: NetConfig) -> Self {
        BatchNet {
            config,
            ..BatchNet::default()
        }
    }

    /// Send `batch` at real time `now_ns`, applying loss, duplication and delay.
    pub fn send(&mut self, batch: NodeBatch, now_ns: u64, rng: &mut ChaCha8Rng) {
        self.batches_sent += 1;
        self.messages_sent += batch.len() as u64;
        if self.is_blocked(batch.from, batch.to) || rng.gen_bool(self.config.loss.clamp(0.0, 1.0)) {
            return;
        }
        let copies = 1 + usize::from(rng.gen_bool(self.config.duplicate.clamp(0.0, 1.0)));
        for _ in 0..copies {
            let hi = self.config.max_delay_us.max(self.config.min_delay_us);
            let extra_us = self
                .slow_us
                .get(&(batch.from, batch.to))
                .copied()
                .unwrap_or(0);
            let at = now_ns + (rng.gen_range(self.config.min_delay_us..=hi) + extra_us) * 1_000;
            self.seq += 1;
            self.queue.push(Reverse((at, self.seq)));
            self.by_seq.insert(self.seq, batch.clone());
        }
    }

    /// Batches due by `now_ns`, in delivery order; links blocked now drop them.
    pub fn due(&mut self, now_ns: u64) -> Vec<NodeBatch> {
        let mut out = Vec::new();
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if at > now_ns {
                break;
            }
            self.queue.pop();
            let b = self.by_seq.remove(&seq).expect("queued batch");
            if !self.is_blocked(b.from, b.to) {
                out.push(b);
            }
        }
        out
    }

    /// Drop every batch in flight to `node` (it crashed).
    pub fn drop_to(&mut self, node: u64) {
        self.by_seq.retain(|_, b| b.to != node);
        let by_seq = &self.by_seq;
        self.queue
            .retain(|Reverse((_, seq))| by_seq.contains_key(seq));
    }

    /// Cut the directed link `from → to`.
    pub fn block(&mut self, from: u64, to: u64) {
        self.blocked.insert((from, to));
    }

    /// Restore the directed link `from → to`.
    pub fn unblock(&mut self, from: u64, to: u64) {
        self.blocked.remove(&(from, to));
    }

    /// Delay every batch sent on `from → to` from now on by `extra_us` more (0: back to normal).
    pub fn slow(&mut self, from: u64, to: u64, extra_us: u64) {
        match extra_us {
            0 => self.slow_us.remove(&(from, to)),
            _ => self.slow_us.insert((from, to), extra_us),
        };
    }

    /// Restore every link: no cuts, no slow links.
    pub fn heal(&mut self) {
        self.blocked.clear();
        self.slow_us.clear();
    }

    /// Whether `from → to` is cut.
    pub fn is_blocked(&self, from: u64, to: u64) -> bool {
        self.blocked.contains(&(from, to))
    }
}
