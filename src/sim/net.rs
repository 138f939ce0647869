//! A simulated network: seeded delay, loss, duplication and reordering, plus partitions.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};

use raft::eraftpb::{Message, MessageType};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Network fault settings. Delays are one-way, in microseconds of real time.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Smallest one-way delay.
    pub min_delay_us: u64,
    /// Largest one-way delay. Different delays reorder messages.
    pub max_delay_us: u64,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
}

impl Default for NetConfig {
    /// 0.5–2 ms one way, no loss, no duplication.
    fn default() -> Self {
        NetConfig {
            min_delay_us: 500,
            max_delay_us: 2_000,
            loss: 0.0,
            duplicate: 0.0,
        }
    }
}

/// Extra delay for the messages that match: a link, a message type, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayRule {
    /// Only messages from this node (`None`: any).
    pub from: Option<u64>,
    /// Only messages to this node (`None`: any).
    pub to: Option<u64>,
    /// Only messages of this type (`None`: any).
    pub msg_type: Option<MessageType>,
    /// The extra one-way delay, in nanoseconds.
    pub extra_ns: u64,
}

impl DelayRule {
    fn matches(&self, m: &Message) -> bool {
        self.from.is_none_or(|f| f == m.from)
            && self.to.is_none_or(|t| t == m.to)
            && self.msg_type.is_none_or(|ty| ty == m.get_msg_type())
    }
}

/// A message in flight.
#[derive(Debug, Clone)]
pub struct InFlight {
    /// Real time of delivery.
    pub deliver_at_ns: u64,
    /// The message.
    pub msg: Message,
}

/// The simulated network.
#[derive(Debug)]
pub struct SimNet {
    /// Fault settings, changeable at any time.
    pub config: NetConfig,
    /// Directed links that drop everything: `(from, to)`.
    blocked: HashSet<(u64, u64)>,
    /// Extra delays; a message gets the largest that matches it.
    delays: Vec<DelayRule>,
    /// Messages in flight, ordered by (delivery time, send sequence).
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    by_seq: BTreeMap<u64, InFlight>,
    seq: u64,
    /// Messages handed to the network, by type.
    pub sent_by_type: BTreeMap<i32, u64>,
    /// `MsgSnapshot`s the network dropped, as `(from, to)`, for the sender's raft to hear of.
    dropped_snapshots: Vec<(u64, u64)>,
}

impl SimNet {
    /// A network with these settings.
    pub fn new(config: NetConfig) -> Self {
        SimNet {
            config,
            blocked: HashSet::new(),
            delays: Vec::new(),
            queue: BinaryHeap::new(),
            by_seq: BTreeMap::new(),
            seq: 0,
            sent_by_type: BTreeMap::new(),
            dropped_snapshots: Vec::new(),
        }
    }

    /// Send `msg` at real time `now_ns`, applying loss, duplication and delay.
    pub fn send(&mut self, msg: Message, now_ns: u64, rng: &mut ChaCha8Rng) {
        *self
            .sent_by_type
            .entry(msg.get_msg_type() as i32)
            .or_default() += 1;
        if self.is_blocked(msg.from, msg.to) || rng.gen_bool(self.config.loss.clamp(0.0, 1.0)) {
            self.dropped(&msg);
            return;
        }
        let copies = if rng.gen_bool(self.config.duplicate.clamp(0.0, 1.0)) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let (lo, hi) = (
                self.config.min_delay_us,
                self.config.max_delay_us.max(self.config.min_delay_us),
            );
            let delay_ns = rng.gen_range(lo..=hi) * 1_000 + self.extra_delay_ns(&msg);
            self.seq += 1;
            let at = now_ns + delay_ns;
            self.queue.push(Reverse((at, self.seq)));
            self.by_seq.insert(
                self.seq,
                InFlight {
                    deliver_at_ns: at,
                    msg: msg.clone(),
                },
            );
        }
    }

    /// Messages due by `now_ns`, in delivery order. Links blocked now drop them.
    pub fn due(&mut self, now_ns: u64) -> Vec<Message> {
        let mut out = Vec::new();
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if at > now_ns {
                break;
            }
            self.queue.pop();
            let m = self.by_seq.remove(&seq).expect("queued message").msg;
            if self.is_blocked(m.from, m.to) {
                self.dropped(&m);
            } else {
                out.push(m);
            }
        }
        out
    }

    /// Record that `m` was lost (a snapshot's sender hears of it).
    pub(crate) fn dropped(&mut self, m: &Message) {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            self.dropped_snapshots.push((m.from, m.to));
        }
    }

    /// The `MsgSnapshot`s dropped since the last call, as `(from, to)`.
    pub fn take_dropped_snapshots(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.dropped_snapshots)
    }

    /// Drop every message in flight to `node` (it crashed).
    pub fn drop_to(&mut self, node: u64) {
        let lost: Vec<Message> = self
            .by_seq
            .values()
            .filter(|f| f.msg.to == node)
            .map(|f| f.msg.clone())
            .collect();
        lost.iter().for_each(|m| self.dropped(m));
        self.by_seq.retain(|_, f| f.msg.to != node);
        let by_seq = &self.by_seq;
        self.queue
            .retain(|Reverse((_, seq))| by_seq.contains_key(seq));
    }

    /// Block the directed link `from → to`.
    pub fn block(&mut self, from: u64, to: u64) {
        self.blocked.insert((from, to));
    }

    /// Unblock every link.
    pub fn heal(&mut self) {
        self.blocked.clear();
    }

    /// Whether `from → to` is blocked.
    pub fn is_blocked(&self, from: u64, to: u64) -> bool {
        self.blocked.contains(&(from, to))
    }

    /// Delay every message of type `ty` by an extra `extra_ns` (0 removes the rule).
    pub fn delay_type(&mut self, ty: MessageType, extra_ns: u64) {
        self.delay(DelayRule {
            from: None,
            to: None,
            msg_type: Some(ty),
            extra_ns,
        });
    }

    /// Add an extra delay for the messages `rule` matches, replacing a rule with the same
    /// match. An `extra_ns` of 0 removes it.
    pub fn delay(&mut self, rule: DelayRule) {
        self.delays
            .retain(|r| (r.from, r.to, r.msg_type) != (rule.from, rule.to, rule.msg_type));
        if rule.extra_ns > 0 {
            self.delays.push(rule);
        }
    }

    /// Remove every extra delay.
    pub fn clear_delays(&mut self) {
        self.delays.clear();
    }

    fn extra_delay_ns(&self, m: &Message) -> u64 {
        let matching = self.delays.iter().filter(|r| r.matches(m));
        matching.map(|r| r.extra_ns).max().unwrap_or(0)
    }

    /// Messages in flight.
    pub fn in_flight(&self) -> usize {
        self.by_seq.len()
    }

    /// Messages sent of one type.
    pub fn sent(&self, ty: MessageType) -> u64 {
        self.sent_by_type.get(&(ty as i32)).copied().unwrap_or(0)
    }
}
