//! Heartbeat rounds: which send time each acknowledgement proves. Pure, no I/O.
//!
//! raft-rs followers echo a heartbeat's `context` in their `MsgHeartbeatResponse`. The leader
//! tags each batch of heartbeats it sends (a round) and records the round's `t0`, read before the
//! send. A response carrying the tag proves that its sender received a message sent at or after
//! `t0`. When raft already set a ReadIndex context, that context names the round instead.
//!
//! **One context, one `t0`, for ever.** raft-rs re-sends the newest pending ReadIndex context on
//! every heartbeat, so one context goes out many times. Its round keeps the send time of the
//! *first* copy, which is no later than that of any copy an acknowledgement can answer. Once the
//! round is gone (completed, pruned, evicted or cleared), the context is **retired**: a later
//! copy starts no new round, and its acknowledgements renew nothing. Otherwise a late
//! acknowledgement of the first copy would be credited with a later copy's `t0`, and the lease
//! would outlive the acknowledging node's promise. Contexts are numbered and never reused
//! ([`crate::ctx`]), so "retired" is a watermark, not a growing set.
//!
//! Appends are deliberately not used: a successful `MsgAppendResponse` for a stale append carries
//! the follower's commit index, not the append's, so the response cannot be tied to one send time
//! without an argument we do not have. Heartbeats go out every heartbeat interval under any load.

use std::collections::VecDeque;

use fxhash::{FxHashMap, FxHashSet};

use crate::ctx::LayerCtx;

/// Rounds kept at most; when more are started, the oldest is retired (it proves the least).
pub const MAX_ROUNDS: usize = 256;

/// One round: the copies of one context.
#[derive(Debug)]
struct Round {
    /// The context its heartbeats carry.
    ctx: LayerCtx,
    /// Local time read before the round's first copy was handed to the transport.
    sent_at_ns: u64,
    /// Voters known to have received a copy, the leader included, each with the lease its
    /// promise backs past `sent_at_ns` (from the promise its acknowledgement says it made).
    acked: FxHashMap<u64, u64>,
}

/// A round a quorum acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumAck {
    /// The round's `t0`: no later than the send time of any copy.
    pub sent_at_ns: u64,
    /// The longest lease past `t0` that a quorum of the acknowledging voters backs.
    pub lease_ns: u64,
}

/// What stamping a heartbeat's ReadIndex context did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadCtxSent {
    /// The first copy: a round starts with this send time.
    Started,
    /// A re-sent copy of a live round: the round keeps its first send time.
    Resent,
    /// The context's round is gone: this copy renews nothing.
    Retired,
}

/// The rounds of the current term, in the order they were started.
#[derive(Debug, Default)]
pub struct RoundTracker {
    /// The last round tag issued; tags are never reused.
    last_tag: u64,
    /// The highest read context ever given a round. A read context at or below it with no live
    /// round is retired for good.
    highest_read_ctx: u64,
    /// Live rounds, oldest first. `sent_at_ns` never decreases along the queue.
    rounds: VecDeque<Round>,
    /// Negative control (tests only): a retired read context gets a new round, later `t0`.
    remap_retired: bool,
    /// Rounds retired because the table was full.
    evicted: u64,
}

impl RoundTracker {
    /// A tracker. `remap_retired` reinstates the re-sent-context bug, for negative controls only.
    pub fn new(remap_retired: bool) -> Self {
        RoundTracker {
            remap_retired,
            ..RoundTracker::default()
        }
    }

    /// Retire every live round (new term, step-down, membership change).
    pub fn clear(&mut self) {
        self.rounds.clear();
    }

    /// Start a round of heartbeats sent with no context, at `sent_at_ns`; returns its tag.
    /// `leader` is the leader's id and the lease its own promise backs past `sent_at_ns`.
    pub fn start_tagged(&mut self, leader: (u64, u64), sent_at_ns: u64) -> LayerCtx {
        self.last_tag += 1;
        let ctx = LayerCtx::Round(self.last_tag);
        self.push(ctx, leader, sent_at_ns);
        ctx
    }

    /// A heartbeat carrying the ReadIndex context `ctx` is about to be sent at `sent_at_ns`.
    pub fn on_read_ctx_sent(
        &mut self,
        ctx: LayerCtx,
        leader: (u64, u64),
        sent_at_ns: u64,
    ) -> ReadCtxSent {
        let LayerCtx::Read(id) = ctx else {
            panic!("not a read context: {ctx:?}");
        };
        if self.position(ctx).is_some() {
            return ReadCtxSent::Resent;
        }
        if id <= self.highest_read_ctx && !self.remap_retired {
            return ReadCtxSent::Retired;
        }
        self.highest_read_ctx = self.highest_read_ctx.max(id);
        self.push(ctx, leader, sent_at_ns);
        ReadCtxSent::Started
    }

    /// `leader` is the leader's id and the lease its own promise backs.
    fn push(&mut self, ctx: LayerCtx, leader: (u64, u64), sent_at_ns: u64) {
        let newest_ns = self.rounds.back().map_or(0, |r| r.sent_at_ns);
        assert!(
            sent_at_ns >= newest_ns,
            "clock went backwards: round at {sent_at_ns} ns after one at {newest_ns} ns"
        );
        let mut acked = FxHashMap::default();
        acked.insert(leader.0, leader.1);
        self.rounds.push_back(Round {
            ctx,
            sent_at_ns,
            acked,
        });
        while self.rounds.len() > MAX_ROUNDS {
            self.rounds.pop_front();
            self.evicted += 1;
        }
        debug_assert!(self.rounds.len() <= MAX_ROUNDS);
    }

    fn position(&self, ctx: LayerCtx) -> Option<usize> {
        self.rounds.iter().position(|r| r.ctx == ctx)
    }

    /// `from` acknowledged a copy of `ctx`, and its promise backs `lease_ns` past the round's
    /// `t0`. When the round's acks now form a quorum, returns its `t0` (no later than the send
    /// time of any copy) with the longest lease a quorum of them backs, and retires it and every
    /// older round. A retired or unknown context proves nothing.
    pub fn on_ack(
        &mut self,
        ctx: LayerCtx,
        from: u64,
        lease_ns: u64,
        has_quorum: impl Fn(&FxHashSet<u64>) -> bool,
    ) -> Option<QuorumAck> {
        let pos = self.position(ctx)?;
        let round = &mut self.rounds[pos];
        let credit = round.acked.entry(from).or_insert(lease_ns);
        *credit = (*credit).min(lease_ns); // one voter, one credit: the smallest it claimed
        let lease_ns = quorum_lease_ns(&round.acked, &has_quorum)?;
        let sent_at_ns = round.sent_at_ns;
        self.rounds.drain(..=pos);
        debug_assert!(self.position(ctx).is_none());
        Some(QuorumAck {
            sent_at_ns,
            lease_ns,
        })
    }

    /// Retire rounds sent before `oldest_useful_ns`: they can no longer extend a lease.
    pub fn prune_before(&mut self, oldest_useful_ns: u64) {
        while self
            .rounds
            .front()
            .is_some_and(|r| r.sent_at_ns < oldest_useful_ns)
        {
            self.rounds.pop_front();
        }
    }

    /// Rounds still waiting for a quorum.
    pub fn pending(&self) -> usize {
        self.rounds.len()
    }

    /// Rounds retired so far because more than [`MAX_ROUNDS`] were in flight.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

/// The longest lease `l` such that the voters backing at least `l` form a quorum, if any do.
fn quorum_lease_ns(
    acked: &FxHashMap<u64, u64>,
    has_quorum: impl Fn(&FxHashSet<u64>) -> bool,
) -> Option<u64> {
    let all: FxHashSet<u64> = acked.keys().copied().collect();
    if !has_quorum(&all) {
        return None;
    }
    let mut credits: Vec<u64> = acked.values().copied().collect();
    credits.sort_unstable_by(|a, b| b.cmp(a));
    let lease_ns = credits.into_iter().find(|&l| {
        let backing: FxHashSet<u64> = acked
            .iter()
            .filter(|(_, &c)| c >= l)
            .map(|(&v, _)| v)
            .collect();
        has_quorum(&backing)
    });
    debug_assert!(
        lease_ns.is_some(),
        "all of them are a quorum, so the smallest credit is"
    );
    lease_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn majority_of_3(acked: &FxHashSet<u64>) -> bool {
        acked.iter().filter(|id| (1..=3).contains(*id)).count() >= 2
    }

    /// The lease every voter's promise backs, in these tests.
    const L: u64 = 100;

    fn tracker() -> RoundTracker {
        RoundTracker::new(false)
    }

    #[test]
    fn minority_ack_proves_nothing_quorum_returns_t0() {
        let mut t = tracker();
        let r = t.start_tagged((1, L), 100);
        assert_eq!(
            t.on_ack(r, 1, L, majority_of_3).map(|q| q.sent_at_ns),
            None,
            "the leader alone"
        );
        assert_eq!(
            t.on_ack(r, 9, L, majority_of_3).map(|q| q.sent_at_ns),
            None,
            "a non-voter"
        );
        assert_eq!(
            t.on_ack(r, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            Some(100)
        );
        assert_eq!(
            t.on_ack(r, 3, L, majority_of_3).map(|q| q.sent_at_ns),
            None,
            "a late ack of a completed round"
        );
    }

    #[test]
    fn an_older_round_is_retired_once_a_newer_one_completes() {
        let mut t = tracker();
        let old = t.start_tagged((1, L), 100);
        let new = t.start_tagged((1, L), 200);
        assert_eq!(
            t.on_ack(new, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            Some(200)
        );
        assert_eq!(
            t.on_ack(old, 3, L, majority_of_3).map(|q| q.sent_at_ns),
            None
        );
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn a_resent_read_context_keeps_its_first_send_time() {
        let mut t = tracker();
        let c = LayerCtx::Read(1);
        assert_eq!(t.on_read_ctx_sent(c, (1, L), 100), ReadCtxSent::Started);
        assert_eq!(t.on_read_ctx_sent(c, (1, L), 900), ReadCtxSent::Resent);
        assert_eq!(
            t.on_ack(c, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            Some(100)
        );
    }

    #[test]
    fn a_context_whose_round_was_pruned_is_retired_for_good() {
        let mut t = tracker();
        let c = LayerCtx::Read(1);
        t.on_read_ctx_sent(c, (1, L), 100);
        t.prune_before(101);
        assert_eq!(t.pending(), 0);
        assert_eq!(t.on_read_ctx_sent(c, (1, L), 500), ReadCtxSent::Retired);
        assert_eq!(
            t.on_ack(c, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            None,
            "a late ack of the first copy"
        );
        assert_eq!(
            t.on_read_ctx_sent(LayerCtx::Read(2), (1, L), 600),
            ReadCtxSent::Started
        );
    }

    #[test]
    fn cleared_completed_and_evicted_contexts_are_retired() {
        let mut t = tracker();
        let (a, b) = (LayerCtx::Read(1), LayerCtx::Read(2));
        t.on_read_ctx_sent(a, (1, L), 10);
        t.clear();
        assert_eq!(
            t.on_read_ctx_sent(a, (1, L), 20),
            ReadCtxSent::Retired,
            "cleared"
        );
        t.on_read_ctx_sent(b, (1, L), 30);
        assert_eq!(
            t.on_ack(b, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            Some(30)
        );
        assert_eq!(
            t.on_read_ctx_sent(b, (1, L), 40),
            ReadCtxSent::Retired,
            "completed"
        );
        let c = LayerCtx::Read(3);
        t.on_read_ctx_sent(c, (1, L), 50);
        for i in 0..MAX_ROUNDS as u64 {
            t.start_tagged((1, L), 60 + i);
        }
        assert_eq!(t.pending(), MAX_ROUNDS);
        assert_eq!(
            t.on_read_ctx_sent(c, (1, L), 999),
            ReadCtxSent::Retired,
            "evicted"
        );
        assert_eq!(t.on_ack(c, 2, L, majority_of_3).map(|q| q.sent_at_ns), None);
    }

    #[test]
    fn control_remapping_a_retired_context_credits_a_later_t0() {
        let mut t = RoundTracker::new(true);
        let c = LayerCtx::Read(1);
        t.on_read_ctx_sent(c, (1, L), 100);
        t.prune_before(101);
        assert_eq!(t.on_read_ctx_sent(c, (1, L), 500), ReadCtxSent::Started);
        assert_eq!(
            t.on_ack(c, 2, L, majority_of_3).map(|q| q.sent_at_ns),
            Some(500),
            "the bug: an ack of the copy sent at 100 is credited at 500"
        );
    }

    /// One step of the property test.
    #[derive(Debug, Clone)]
    enum Op {
        Wait(u64),
        StartTagged,
        /// Send a read context: a new one, or a copy of the `n`-th one sent so far.
        SendRead(Option<usize>),
        /// `from` acknowledges the `n`-th copy sent so far.
        Ack(usize, u64),
        Prune(u64),
        Clear,
        /// Start enough tagged rounds to evict the oldest.
        Flood,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (1..50u64).prop_map(Op::Wait),
            Just(Op::StartTagged),
            proptest::option::of(0..64usize).prop_map(Op::SendRead),
            (0..64usize, 2..=3u64).prop_map(|(n, from)| Op::Ack(n, from)),
            (0..200u64).prop_map(Op::Prune),
            Just(Op::Clear),
            Just(Op::Flood),
        ]
    }

    /// Runs `ops`; returns the first ack credited later than the copy it acknowledges, or a
    /// lease that moved backwards, as an error.
    fn check_ops(ops: &[Op], remap_retired: bool) -> Result<(), String> {
        let mut t = RoundTracker::new(remap_retired);
        let mut lease = crate::lease::LeaderLease::new(&crate::config::Derived {
            promise_ns: 120,
            boot_promise_ns: 120,
            lease_ns: L,
            drift_ppm: 0,
            margin_ns: 0,
            renew_before_ns: 30,
            campaign_jitter_ns: 0,
            max_grant_ns: None,
            max_lag_ns: None,
        });
        lease.start_term(1);
        lease.on_commit_in_term(1);
        let (mut now, mut next_read, mut copies) = (0u64, 1u64, Vec::<(LayerCtx, u64)>::new());
        for op in ops {
            match *op {
                Op::Wait(dt) => now += dt,
                Op::StartTagged => copies.push((t.start_tagged((1, L), now), now)),
                Op::SendRead(which) => {
                    let reads: Vec<LayerCtx> = copies
                        .iter()
                        .map(|c| c.0)
                        .filter(|c| matches!(c, LayerCtx::Read(_)))
                        .collect();
                    let ctx = match which.and_then(|n| reads.get(n % reads.len().max(1)).copied()) {
                        Some(ctx) => ctx,
                        None => {
                            next_read += 1;
                            LayerCtx::Read(next_read - 1)
                        }
                    };
                    t.on_read_ctx_sent(ctx, (1, L), now);
                    copies.push((ctx, now));
                }
                Op::Ack(n, from) if !copies.is_empty() => {
                    let (ctx, sent_at) = copies[n % copies.len()];
                    if let Some(t0) = t.on_ack(ctx, from, L, majority_of_3).map(|q| q.sent_at_ns) {
                        if t0 > sent_at {
                            return Err(format!(
                                "ack of {ctx:?} sent at {sent_at} credited at {t0}"
                            ));
                        }
                        let before = lease.usable_until_ns();
                        lease.on_quorum_ack(1, t0, L);
                        if lease.usable_until_ns() < before {
                            return Err("the lease moved backwards".into());
                        }
                    }
                }
                Op::Ack(..) => {}
                Op::Prune(age) => t.prune_before(now.saturating_sub(age)),
                Op::Clear => t.clear(),
                Op::Flood => (0..=MAX_ROUNDS).for_each(|_| {
                    t.start_tagged((1, L), now);
                }),
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]
        #[test]
        fn an_ack_never_credits_a_later_t0_and_the_lease_never_regresses(
            ops in proptest::collection::vec(op(), 1..80)
        ) {
            proptest::prop_assert_eq!(check_ops(&ops, false), Ok(()));
        }
    }

    #[test]
    fn control_the_property_test_finds_the_remapped_context() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = proptest::collection::vec(op(), 1..80);
        let found = (0..2_000).find_map(|_| {
            let ops = strategy.new_tree(&mut runner).unwrap().current();
            check_ops(&ops, true).err()
        });
        assert!(
            found.is_some(),
            "random sequences never found the remapping bug"
        );
    }

    #[test]
    fn the_lease_is_the_longest_a_quorum_of_acknowledged_promises_backs() {
        let mut t = tracker();
        let five =
            |acked: &FxHashSet<u64>| acked.iter().filter(|id| (1..=5).contains(*id)).count() >= 3;
        let r = t.start_tagged((1, 100), 1_000);
        assert_eq!(t.on_ack(r, 2, 40, five), None, "two of five");
        let q = t.on_ack(r, 3, 70, five).expect("1, 2 and 3 are a quorum");
        assert_eq!(
            (q.sent_at_ns, q.lease_ns),
            (1_000, 40),
            "the weakest of the three counts"
        );
        let r = t.start_tagged((1, 100), 2_000);
        t.on_ack(r, 2, 90, five);
        t.on_ack(r, 2, 10, five);
        let q = t.on_ack(r, 4, 80, five).expect("a quorum");
        assert_eq!(
            q.lease_ns, 10,
            "a voter that claimed two promises is credited the shorter"
        );
    }

    #[test]
    #[should_panic(expected = "clock went backwards")]
    fn a_round_older_than_the_newest_is_a_bug() {
        let mut t = tracker();
        t.start_tagged((1, L), 100);
        t.start_tagged((1, L), 99);
    }
}
