//! The simulated network between nodes: seeded delay, loss, duplication and reordering of whole
//! node batches, directed link cuts, and per-type rules that pull single messages out of the
//! batches they ride in (to hold, delay, duplicate or drop them on their own).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use raft::eraftpb::{Message, MessageType};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::liveness::SupportMsg;
use crate::multi::{FortifyMsg, GroupId, NodeBatch};
use crate::sim::NetConfig;

/// The kind of one message inside a node batch, as a [`MsgRule`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgKind {
    /// A group's raft message of this type.
    Raft(MessageType),
    /// [`FortifyMsg::Request`].
    FortifyRequest,
    /// [`FortifyMsg::Ack`].
    FortifyAck,
    /// [`FortifyMsg::Reject`].
    FortifyReject,
    /// [`FortifyMsg::Release`].
    FortifyRelease,
    /// [`SupportMsg::Heartbeat`].
    SupportHeartbeat,
    /// [`SupportMsg::Ack`].
    SupportAck,
    /// [`SupportMsg::Withdrawn`].
    SupportWithdrawn,
}

impl MsgKind {
    /// Every kind a rule may name: raft's vote, pre-vote, append, heartbeat and transfer
    /// messages, every fortification message and every support message.
    pub const ALL: [MsgKind; 18] = [
        MsgKind::Raft(MessageType::MsgRequestPreVote),
        MsgKind::Raft(MessageType::MsgRequestPreVoteResponse),
        MsgKind::Raft(MessageType::MsgRequestVote),
        MsgKind::Raft(MessageType::MsgRequestVoteResponse),
        MsgKind::Raft(MessageType::MsgAppend),
        MsgKind::Raft(MessageType::MsgAppendResponse),
        MsgKind::Raft(MessageType::MsgHeartbeat),
        MsgKind::Raft(MessageType::MsgHeartbeatResponse),
        MsgKind::Raft(MessageType::MsgTimeoutNow),
        MsgKind::Raft(MessageType::MsgSnapshot),
        MsgKind::Raft(MessageType::MsgReadIndex),
        MsgKind::FortifyRequest,
        MsgKind::FortifyAck,
        MsgKind::FortifyReject,
        MsgKind::FortifyRelease,
        MsgKind::SupportHeartbeat,
        MsgKind::SupportAck,
        MsgKind::SupportWithdrawn,
    ];

    fn of_raft(m: &Message) -> MsgKind {
        MsgKind::Raft(m.get_msg_type())
    }

    fn of_fortify(m: &FortifyMsg) -> MsgKind {
        match m {
            FortifyMsg::Request { .. } => MsgKind::FortifyRequest,
            FortifyMsg::Ack { .. } => MsgKind::FortifyAck,
            FortifyMsg::Reject { .. } => MsgKind::FortifyReject,
            FortifyMsg::Release { .. } => MsgKind::FortifyRelease,
        }
    }

    fn of_support(m: &SupportMsg) -> MsgKind {
        match m {
            SupportMsg::Heartbeat { .. } => MsgKind::SupportHeartbeat,
            SupportMsg::Ack { .. } => MsgKind::SupportAck,
            SupportMsg::Withdrawn { .. } => MsgKind::SupportWithdrawn,
        }
    }
}

/// What a [`MsgRule`] does to each message it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgAction {
    /// Pulled out of its batch and sent alone, `extra_us` later (drawn per message from
    /// `min..=max`): held, delayed and reordered against the rest of its batch and the batches
    /// after it.
    Hold {
        /// Smallest extra delay, µs.
        min_extra_us: u64,
        /// Largest extra delay, µs.
        max_extra_us: u64,
    },
    /// Sent with its batch, and a copy sent alone, `extra_us` later (drawn from `min..=max`).
    Duplicate {
        /// Smallest extra delay of the copy, µs.
        min_extra_us: u64,
        /// Largest extra delay of the copy, µs.
        max_extra_us: u64,
    },
    /// Lost.
    Drop,
}

/// A per-type network rule: messages of `kind` on the links it names, sent before `until_ns`
/// (real time), get `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgRule {
    /// Only messages from this node (`None`: any).
    pub from: Option<u64>,
    /// Only messages to this node (`None`: any).
    pub to: Option<u64>,
    /// The kind of message.
    pub kind: MsgKind,
    /// What happens to it.
    pub action: MsgAction,
    /// The rule applies to messages sent before this real instant.
    pub until_ns: u64,
}

impl MsgRule {
    fn on_link(&self, from: u64, to: u64, now_ns: u64) -> bool {
        now_ns < self.until_ns
            && self.from.is_none_or(|f| f == from)
            && self.to.is_none_or(|t| t == to)
    }
}

/// Node batches in flight.
#[derive(Debug, Default)]
pub struct BatchNet {
    /// Fault settings, changeable at any time.
    pub config: NetConfig,
    blocked: HashSet<(u64, u64)>,
    /// Extra one-way delay per directed link, in µs: a slow link, whose batches later ones
    /// on other links overtake (a straggler from an earlier incarnation, say).
    slow_us: HashMap<(u64, u64), u64>,
    /// Per-type rules, applied in order (the first that matches a message wins).
    rules: Vec<MsgRule>,
    /// Stale copies: each message, of any kind, is also sent alone with this probability, up
    /// to `stale_max_us` late (a copy held in a queue or a retransmission, delivered after the
    /// world moved on).
    stale_copy: f64,
    stale_max_us: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    by_seq: BTreeMap<u64, NodeBatch>,
    seq: u64,
    /// Batches handed to the network.
    pub batches_sent: u64,
    /// Messages inside them (raft, fortification and support), counted one by one.
    pub messages_sent: u64,
    /// Messages a per-type rule held, duplicated or dropped.
    pub messages_ruled: u64,
}

/// Messages a rule pulled out of one batch: each to go alone, after its extra delay.
type Pulled = Vec<(NodeBatch, u64)>;

impl BatchNet {
    /// A network with these settings.
    pub fn new(config: NetConfig) -> Self {
        BatchNet {
            config,
            ..BatchNet::default()
        }
    }

    /// Send `batch` at real time `now_ns`, applying loss, duplication and delay to the batch,
    /// and the per-type rules to each message in it.
    pub fn send(&mut self, batch: NodeBatch, now_ns: u64, rng: &mut ChaCha8Rng) {
        self.batches_sent += 1;
        self.messages_sent += batch.len() as u64;
        if self.is_blocked(batch.from, batch.to) || rng.gen_bool(self.config.loss.clamp(0.0, 1.0)) {
            return;
        }
        let (batch, mut pulled) = self.apply_rules(batch, now_ns, rng);
        pulled.extend(self.stale_copies(&batch, rng));
        for (single, extra_us) in pulled {
            self.enqueue(single, now_ns, extra_us, rng);
        }
        if batch.is_empty() {
            return;
        }
        let copies = 1 + usize::from(rng.gen_bool(self.config.duplicate.clamp(0.0, 1.0)));
        for _ in 0..copies {
            self.enqueue(batch.clone(), now_ns, 0, rng);
        }
    }

    /// Queue `batch` for delivery after the link's delay plus `extra_us`.
    fn enqueue(&mut self, batch: NodeBatch, now_ns: u64, extra_us: u64, rng: &mut ChaCha8Rng) {
        let hi = self.config.max_delay_us.max(self.config.min_delay_us);
        let slow_us = self
            .slow_us
            .get(&(batch.from, batch.to))
            .copied()
            .unwrap_or(0);
        let delay_us = rng.gen_range(self.config.min_delay_us..=hi) + slow_us + extra_us;
        self.seq += 1;
        self.queue
            .push(Reverse((now_ns + delay_us * 1_000, self.seq)));
        self.by_seq.insert(self.seq, batch);
    }

    /// Split off the messages the rules match: what stays in the batch, and what goes alone.
    fn apply_rules(
        &mut self,
        mut batch: NodeBatch,
        now_ns: u64,
        rng: &mut ChaCha8Rng,
    ) -> (NodeBatch, Pulled) {
        self.rules.retain(|r| now_ns < r.until_ns);
        let (from, to) = (batch.from, batch.to);
        let rules: Vec<MsgRule> = self
            .rules
            .iter()
            .copied()
            .filter(|r| r.on_link(from, to, now_ns))
            .collect();
        if rules.is_empty() {
            return (batch, Vec::new());
        }
        let alone = |f: &dyn Fn(&mut NodeBatch)| {
            let mut b = NodeBatch {
                from,
                to,
                ..NodeBatch::default()
            };
            f(&mut b);
            b
        };
        let mut pulled = Vec::new();
        let mut ruled = 0;
        let mut keep = |kind: MsgKind, single: NodeBatch, pulled: &mut Pulled| -> bool {
            let Some(rule) = rules.iter().find(|r| r.kind == kind) else {
                return true;
            };
            ruled += 1;
            match rule.action {
                MsgAction::Drop => false,
                MsgAction::Hold {
                    min_extra_us,
                    max_extra_us,
                } => {
                    let extra_us = rng.gen_range(min_extra_us..=max_extra_us.max(min_extra_us));
                    pulled.push((single, extra_us));
                    false
                }
                MsgAction::Duplicate {
                    min_extra_us,
                    max_extra_us,
                } => {
                    let extra_us = rng.gen_range(min_extra_us..=max_extra_us.max(min_extra_us));
                    pulled.push((single, extra_us));
                    true
                }
            }
        };
        batch.support.retain(|m| {
            let single = alone(&|b| b.support.push(*m));
            keep(MsgKind::of_support(m), single, &mut pulled)
        });
        batch.fortify.retain(|m| {
            let single = alone(&|b| b.fortify.push(*m));
            keep(MsgKind::of_fortify(m), single, &mut pulled)
        });
        batch.raft.retain(|(g, m): &(GroupId, Message)| {
            let single = alone(&|b| b.raft.push((*g, m.clone())));
            keep(MsgKind::of_raft(m), single, &mut pulled)
        });
        self.messages_ruled += ruled;
        (batch, pulled)
    }

    /// Stale copies of some of `batch`'s messages, each alone and late.
    fn stale_copies(&self, batch: &NodeBatch, rng: &mut ChaCha8Rng) -> Pulled {
        if self.stale_copy <= 0.0 {
            return Vec::new();
        }
        let single = || NodeBatch {
            from: batch.from,
            to: batch.to,
            ..NodeBatch::default()
        };
        let mut copies = Vec::new();
        let mut late = |b: NodeBatch, rng: &mut ChaCha8Rng| {
            if rng.gen_bool(self.stale_copy) {
                copies.push((b, rng.gen_range(0..=self.stale_max_us)));
            }
        };
        for m in &batch.support {
            late(
                NodeBatch {
                    support: vec![*m],
                    ..single()
                },
                rng,
            );
        }
        for m in &batch.fortify {
            late(
                NodeBatch {
                    fortify: vec![*m],
                    ..single()
                },
                rng,
            );
        }
        for m in &batch.raft {
            late(
                NodeBatch {
                    raft: vec![m.clone()],
                    ..single()
                },
                rng,
            );
        }
        copies
    }

    /// From now on, send a stale copy of each message with probability `p`, up to `max_us`
    /// late (0: none).
    pub fn set_stale_copies(&mut self, p: f64, max_us: u64) {
        self.stale_copy = p.clamp(0.0, 1.0);
        self.stale_max_us = max_us;
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

    /// Add a per-type rule (until its `until_ns`, or [`BatchNet::heal`]).
    pub fn add_rule(&mut self, rule: MsgRule) {
        self.rules.push(rule);
    }

    /// Remove every per-type rule (messages they hold stay in flight).
    pub fn clear_rules(&mut self) {
        self.rules.clear();
    }

    /// Restore every link: no cuts, no slow links, no per-type rules. Messages in flight (held
    /// ones too) stay in flight.
    pub fn heal(&mut self) {
        self.blocked.clear();
        self.slow_us.clear();
        self.rules.clear();
    }

    /// Whether `from → to` is cut.
    pub fn is_blocked(&self, from: u64, to: u64) -> bool {
        self.blocked.contains(&(from, to))
    }
}
