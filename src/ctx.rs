//! The contexts this layer puts on raft messages, encoded and parsed in one place.
//!
//! Two kinds travel in a heartbeat's `context`, and raft-rs followers echo both in their
//! `MsgHeartbeatResponse`:
//! - a **round tag**, put on heartbeats that raft sent with an empty context;
//! - a **read context**, passed to raft's `read_index` for a batch of ReadIndex reads. raft-rs
//!   sends it on the heartbeats of that request and re-sends the newest pending one on every
//!   heartbeat after.
//!
//! Every context the layer makes starts with [`RESERVED_PREFIX`]. A caller's own `read_index`
//! context must not ([`LeaseNode::raw_read_index`](crate::LeaseNode::raw_read_index) refuses one
//! that does), so a caller's context can never be taken for one of ours.
//!
//! Each kind numbers its contexts from 1 upwards and never reuses a number, so a context names
//! one round for ever: the lease rule "one tag, one `t0`" rests on that (see [`crate::round`]).

use thiserror::Error;

/// A caller's `read_index` context in the layer's reserved space: it would be taken for one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("read_index context starts with the lease layer's reserved prefix {RESERVED_PREFIX:?}")]
pub struct ReservedContext;

/// The first bytes of every context this layer makes.
pub const RESERVED_PREFIX: &[u8] = b"rl\0";

/// Encoded length: the prefix, a kind byte and a big-endian `u64`.
const ENCODED_LEN: usize = RESERVED_PREFIX.len() + 1 + 8;

const ROUND_KIND: u8 = b'h';
const READ_KIND: u8 = b'r';
const PROMISED_KIND: u8 = b'p';

/// Encoded length of an acknowledged context: the context, a kind byte, the promise in
/// nanoseconds (big-endian `u64`) and the drift bound in ppm (big-endian `u32`).
const ACK_LEN: usize = ENCODED_LEN + 1 + 8 + 4;

/// What a node promised on receipt of a heartbeat, carried back in its acknowledgement, so that
/// the leader counts the promise the node made, never its own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promised {
    /// How long, from its receipt, the node refuses other candidates (its `P`).
    pub promise_ns: u64,
    /// The rate error it assumes of clocks (its `ρ`), in ppm.
    pub drift_ppm: u32,
}

/// A context this layer put on a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerCtx {
    /// A round tag on heartbeats raft sent with no context. Numbered from 1.
    Round(u64),
    /// A ReadIndex batch's context. Numbered from 1.
    Read(u64),
}

impl LayerCtx {
    /// The bytes that go into a message's `context`.
    pub fn encode(self) -> Vec<u8> {
        let (kind, id) = match self {
            LayerCtx::Round(id) => (ROUND_KIND, id),
            LayerCtx::Read(id) => (READ_KIND, id),
        };
        assert!(id > 0, "context ids start at 1: {self:?}");
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.extend_from_slice(RESERVED_PREFIX);
        out.push(kind);
        out.extend_from_slice(&id.to_be_bytes());
        debug_assert_eq!(out.len(), ENCODED_LEN);
        out
    }

    /// Parse a context. `None` for anything this layer did not make, garbage included.
    pub fn parse(ctx: &[u8]) -> Option<LayerCtx> {
        let rest = ctx.strip_prefix(RESERVED_PREFIX)?;
        let (&kind, id) = rest.split_first()?;
        let id = u64::from_be_bytes(id.try_into().ok()?);
        match (kind, id) {
            (_, 0) => None,
            (ROUND_KIND, id) => Some(LayerCtx::Round(id)),
            (READ_KIND, id) => Some(LayerCtx::Read(id)),
            _ => None,
        }
    }

    /// The bytes a follower echoes for this context: the context and what it promised.
    pub fn encode_ack(self, promised: Promised) -> Vec<u8> {
        let mut out = self.encode();
        out.push(PROMISED_KIND);
        out.extend_from_slice(&promised.promise_ns.to_be_bytes());
        out.extend_from_slice(&promised.drift_ppm.to_be_bytes());
        debug_assert_eq!(out.len(), ACK_LEN);
        out
    }

    /// Parse an echoed context: the context, and what the echoing node promised if it said so.
    /// `None` for anything this layer did not make.
    pub fn parse_ack(ctx: &[u8]) -> Option<(LayerCtx, Option<Promised>)> {
        if ctx.len() != ACK_LEN {
            return LayerCtx::parse(ctx).map(|c| (c, None));
        }
        let (head, tail) = ctx.split_at(ENCODED_LEN);
        let layer = LayerCtx::parse(head)?;
        let (&kind, rest) = tail.split_first()?;
        let (promise, drift) = rest.split_at(8);
        let promised = Promised {
            promise_ns: u64::from_be_bytes(promise.try_into().ok()?),
            drift_ppm: u32::from_be_bytes(drift.try_into().ok()?),
        };
        (kind == PROMISED_KIND).then_some((layer, Some(promised)))
    }

    /// Whether `ctx` is in the layer's reserved space (a caller must not use it).
    pub fn is_reserved(ctx: &[u8]) -> bool {
        ctx.starts_with(RESERVED_PREFIX)
    }

    /// The context's number within its kind.
    pub fn id(self) -> u64 {
        match self {
            LayerCtx::Round(id) | LayerCtx::Read(id) => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_and_garbage_is_not_ours() {
        for ctx in [LayerCtx::Round(1), LayerCtx::Read(u64::MAX)] {
            assert_eq!(LayerCtx::parse(&ctx.encode()), Some(ctx));
            assert!(LayerCtx::is_reserved(&ctx.encode()));
        }
        let tag = LayerCtx::Round(7).encode();
        assert_eq!(LayerCtx::parse(&tag[..tag.len() - 1]), None, "truncated");
        assert_eq!(LayerCtx::parse(&[tag.clone(), vec![0]].concat()), None);
        let mut zero = tag.clone();
        zero[ENCODED_LEN - 8..].fill(0);
        assert_eq!(LayerCtx::parse(&zero), None, "id 0 is never issued");
        let mut odd_kind = tag;
        odd_kind[RESERVED_PREFIX.len()] = b'x';
        assert_eq!(LayerCtx::parse(&odd_kind), None);
        assert_eq!(LayerCtx::parse(b""), None);
        assert_eq!(LayerCtx::parse(b"user read context"), None);
        assert!(!LayerCtx::is_reserved(b"user read context"));
    }

    #[test]
    fn an_acknowledgement_carries_the_promise_and_garbage_carries_none() {
        let p = Promised {
            promise_ns: 300_000_000,
            drift_ppm: 10_000,
        };
        let ack = LayerCtx::Read(9).encode_ack(p);
        assert_eq!(
            LayerCtx::parse_ack(&ack),
            Some((LayerCtx::Read(9), Some(p)))
        );
        let bare = LayerCtx::Round(3).encode();
        assert_eq!(LayerCtx::parse_ack(&bare), Some((LayerCtx::Round(3), None)));
        assert_eq!(
            LayerCtx::parse(&ack),
            None,
            "an ack is not a context raft could match"
        );
        let mut odd = ack.clone();
        odd[ENCODED_LEN] = b'x';
        assert_eq!(LayerCtx::parse_ack(&odd), None);
        assert_eq!(LayerCtx::parse_ack(&ack[..ACK_LEN - 1]), None, "truncated");
        assert_eq!(LayerCtx::parse_ack(&[0u8; ACK_LEN]), None, "not ours");
    }

    #[test]
    #[should_panic(expected = "start at 1")]
    fn id_zero_is_a_bug() {
        LayerCtx::Read(0).encode();
    }
}
