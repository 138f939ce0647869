//! Heartbeat rounds: which send time each acknowledgement proves. Pure, no I/O.
//!
//! raft-rs followers echo a heartbeat's `context` in their `MsgHeartbeatResponse`. The leader tags
//! each batch of heartbeats it sends (a round) and records the round's `t0`, read before the send.
//! A response carrying the tag proves that its sender received a message sent at or after `t0`.
//! When raft already set a ReadIndex context, that context is unique and is mapped to a round instead;
//! a retransmission with the same context keeps the round's first, earliest `t0`.
//!
//! Appends are deliberately not used: a successful `MsgAppendResponse` for a stale append carries
//! the follower's commit index, not the append's, so the response cannot be tied to one send time
//! without an argument we do not have. Heartbeats go out every heartbeat interval under any load.

use std::collections::{BTreeMap, HashMap};

use fxhash::FxHashSet;

/// The prefix of a context this layer put on a heartbeat. Stripped before raft sees the response.
pub const ROUND_TAG_PREFIX: &[u8] = b"rl-round:";
/// The prefix of every ReadIndex context this layer issues.
pub const READ_CTX_PREFIX: &[u8] = b"rl-read:";
/// Rounds kept at most; older ones can only extend the lease less than newer ones.
const MAX_ROUNDS: usize = 256;

/// One round of heartbeats.
#[derive(Debug)]
struct Round {
    /// Local time read before the round was handed to the transport.
    sent_at_ns: u64,
    /// Voters known to have received the round, the leader included.
    acked: FxHashSet<u64>,
}

/// The rounds of the current term.
#[derive(Debug, Default)]
pub struct RoundTracker {
    next_id: u64,
    rounds: BTreeMap<u64, Round>,
    /// ReadIndex contexts seen on outgoing heartbeats, mapped to the round of their first send.
    read_ctx_rounds: HashMap<Vec<u8>, u64>,
}

/// Encode a round id as a heartbeat context.
pub fn round_tag(id: u64) -> Vec<u8> {
    let mut tag = ROUND_TAG_PREFIX.to_vec();
    tag.extend_from_slice(&id.to_be_bytes());
    tag
}

/// Decode a heartbeat context made by [`round_tag`].
pub fn parse_round_tag(ctx: &[u8]) -> Option<u64> {
    let id = ctx.strip_prefix(ROUND_TAG_PREFIX)?;
    Some(u64::from_be_bytes(id.try_into().ok()?))
}

impl RoundTracker {
    /// Forget every round (new term, step-down, membership change).
    pub fn clear(&mut self) {
        self.rounds.clear();
        self.read_ctx_rounds.clear();
    }

    /// Start a round sent at `sent_at_ns` by `leader_id`; returns its id.
    pub fn start(&mut self, leader_id: u64, sent_at_ns: u64) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let mut acked = FxHashSet::default();
        acked.insert(leader_id);
        self.rounds.insert(id, Round { sent_at_ns, acked });
        while self.rounds.len() > MAX_ROUNDS {
            self.rounds.pop_first();
        }
        id
    }

    /// The round for a ReadIndex context, started now if this context was never sent before.
    pub fn round_for_read_ctx(&mut self, ctx: &[u8], leader_id: u64, sent_at_ns: u64) -> u64 {
        if let Some(&id) = self.read_ctx_rounds.get(ctx) {
            if self.rounds.contains_key(&id) {
                return id;
            }
        }
        let id = self.start(leader_id, sent_at_ns);
        self.read_ctx_rounds.insert(ctx.to_vec(), id);
        id
    }

    /// The round a response context refers to, if it is one of ours.
    pub fn round_of_ctx(&self, ctx: &[u8]) -> Option<u64> {
        parse_round_tag(ctx).or_else(|| self.read_ctx_rounds.get(ctx).copied())
    }

    /// `from` acknowledged round `id`. When the acks now form a quorum, returns the round's `t0`
    /// and forgets it and every older round (they prove less).
    pub fn on_ack(
        &mut self,
        id: u64,
        from: u64,
        has_quorum: impl Fn(&FxHashSet<u64>) -> bool,
    ) -> Option<u64> {
        let round = self.rounds.get_mut(&id)?;
        round.acked.insert(from);
        if !has_quorum(&round.acked) {
            return None;
        }
        let sent_at_ns = round.sent_at_ns;
        self.rounds = self.rounds.split_off(&(id + 1));
        self.read_ctx_rounds.retain(|_, r| *r > id);
        Some(sent_at_ns)
    }

    /// Forget rounds sent before `oldest_useful_ns`: they can no longer extend a lease.
    pub fn prune_before(&mut self, oldest_useful_ns: u64) {
        self.rounds.retain(|_, r| r.sent_at_ns >= oldest_useful_ns);
        let rounds = &self.rounds;
        self.read_ctx_rounds.retain(|_, id| rounds.contains_key(id));
    }

    /// Rounds still waiting for a quorum.
    pub fn pending(&self) -> usize {
        self.rounds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn majority_of_3(acked: &FxHashSet<u64>) -> bool {
        acked.iter().filter(|id| (1..=3).contains(*id)).count() >= 2
    }

    #[test]
    fn tags_round_trip_and_reject_garbage() {
        assert_eq!(parse_round_tag(&round_tag(42)), Some(42));
        assert_eq!(parse_round_tag(b"rl-round:short"), None);
        assert_eq!(parse_round_tag(b""), None);
        assert_eq!(parse_round_tag(b"rl-read:00000000"), None);
    }

    #[test]
    fn minority_ack_proves_nothing_quorum_returns_t0() {
        let mut t = RoundTracker::default();
        let r = t.start(1, 100);
        assert_eq!(t.on_ack(r, 1, majority_of_3), None, "the leader alone");
        assert_eq!(t.on_ack(r, 9, majority_of_3), None, "a non-voter");
        assert_eq!(t.on_ack(r, 2, majority_of_3), Some(100));
        assert_eq!(
            t.on_ack(r, 3, majority_of_3),
            None,
            "a late ack of a completed round"
        );
    }

    #[test]
    fn an_older_round_is_forgotten_once_a_newer_one_completes() {
        let mut t = RoundTracker::default();
        let old = t.start(1, 100);
        let new = t.start(1, 200);
        assert_eq!(t.on_ack(new, 2, majority_of_3), Some(200));
        assert_eq!(t.on_ack(old, 3, majority_of_3), None);
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn a_resent_read_context_keeps_its_first_send_time() {
        let mut t = RoundTracker::default();
        let first = t.round_for_read_ctx(b"rl-read:1", 1, 100);
        let again = t.round_for_read_ctx(b"rl-read:1", 1, 900);
        assert_eq!(first, again);
        assert_eq!(t.round_of_ctx(b"rl-read:1"), Some(first));
        assert_eq!(t.on_ack(first, 2, majority_of_3), Some(100));
    }

    #[test]
    fn pruning_drops_rounds_too_old_to_matter() {
        let mut t = RoundTracker::default();
        let r = t.start(1, 100);
        t.round_for_read_ctx(b"c", 1, 100);
        t.prune_before(101);
        assert_eq!(t.pending(), 0);
        assert_eq!(t.on_ack(r, 2, majority_of_3), None);
        assert_eq!(t.round_of_ctx(b"c"), None);
    }
}
