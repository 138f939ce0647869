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
    #[should_panic(expected = "start at 1")]
    fn id_zero_is_a_bug() {
        LayerCtx::Read(0).encode();
    }
}
