//! A [`NodeBatch`] as bytes, for a transport between processes: one encoding for the support
//! session, the fortification messages and every group's raft messages (raft's own protobuf).
//!
//! Layout, integers big-endian: `MAGIC ‖ from (u64) ‖ to (u64)`, then three counted lists
//! (`u32` count, then the items): support messages and fortification messages (a kind byte and
//! fixed fields each), and raft messages (`group (u64) ‖ length (u32) ‖ protobuf`). Decoding
//! takes nothing on trust: a count larger than the bytes left could hold, a length past the end,
//! an unknown kind, bytes after the last list, or a raft message protobuf refuses is a
//! [`BatchError`], and nothing of the batch is used.

use protobuf::Message as _;
use raft::eraftpb::Message;
use thiserror::Error;

use crate::liveness::{Epoch, SupportMsg};
use crate::multi::batch::{FortifyMsg, NodeBatch};

/// The first bytes of every encoded batch.
pub const MAGIC: &[u8; 4] = b"rlB\x01";

/// The fewest bytes an item of each list takes (a count larger than the bytes left could hold
/// is refused before anything is allocated for it).
const MIN_SUPPORT: usize = 1 + 8;
const MIN_FORTIFY: usize = 1 + 16;
const MIN_RAFT: usize = 8 + 4;

/// Why bytes are not a batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    /// It does not start with [`MAGIC`].
    #[error("not a node batch (bad magic)")]
    BadMagic,
    /// It ends inside a field, or a count or length promises more than is there.
    #[error("node batch cut short or with a count beyond its bytes")]
    Truncated,
    /// A support or fortification message of a kind this version does not know.
    #[error("node batch: unknown message kind {0}")]
    UnknownKind(u8),
    /// Bytes after the last list.
    #[error("node batch: {0} bytes after the end")]
    Trailing(usize),
    /// A raft message protobuf refuses.
    #[error("node batch: bad raft message: {0}")]
    Raft(String),
}

/// `batch` as bytes.
pub fn encode(batch: &NodeBatch) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 32 * batch.len());
    out.extend_from_slice(MAGIC);
    put64(&mut out, batch.from);
    put64(&mut out, batch.to);
    put32(&mut out, batch.support.len() as u32);
    batch.support.iter().for_each(|m| put_support(&mut out, m));
    put32(&mut out, batch.fortify.len() as u32);
    batch.fortify.iter().for_each(|m| put_fortify(&mut out, m));
    put32(&mut out, batch.raft.len() as u32);
    for (group, m) in &batch.raft {
        put64(&mut out, *group);
        let bytes = m.write_to_bytes().expect("a raft message always encodes");
        put32(&mut out, bytes.len() as u32);
        out.extend_from_slice(&bytes);
    }
    out
}

/// The batch in `bytes` (made by [`encode`]).
pub fn decode(bytes: &[u8]) -> Result<NodeBatch, BatchError> {
    let mut r = Reader(bytes);
    if r.take(MAGIC.len())? != MAGIC {
        return Err(BatchError::BadMagic);
    }
    let mut batch = NodeBatch {
        from: r.u64()?,
        to: r.u64()?,
        ..NodeBatch::default()
    };
    for _ in 0..r.count(MIN_SUPPORT)? {
        batch.support.push(support(&mut r)?);
    }
    for _ in 0..r.count(MIN_FORTIFY)? {
        batch.fortify.push(fortify(&mut r)?);
    }
    for _ in 0..r.count(MIN_RAFT)? {
        let group = r.u64()?;
        let len = r.u32()? as usize;
        let m =
            Message::parse_from_bytes(r.take(len)?).map_err(|e| BatchError::Raft(e.to_string()))?;
        batch.raft.push((group, m));
    }
    match r.0.len() {
        0 => Ok(batch),
        n => Err(BatchError::Trailing(n)),
    }
}

fn put_support(out: &mut Vec<u8>, m: &SupportMsg) {
    match *m {
        SupportMsg::Heartbeat { epoch, seq } => {
            out.push(b'H');
            put64(out, epoch.0);
            put64(out, seq);
        }
        SupportMsg::Ack {
            epoch,
            seq,
            incarnation,
            promise_ns,
            drift_ppm,
        } => {
            out.push(b'A');
            put64(out, epoch.0);
            put64(out, seq);
            put32(out, incarnation);
            put64(out, promise_ns);
            put32(out, drift_ppm);
        }
        SupportMsg::Withdrawn { epoch } => {
            out.push(b'W');
            put64(out, epoch.0);
        }
    }
}

fn support(r: &mut Reader<'_>) -> Result<SupportMsg, BatchError> {
    Ok(match r.u8()? {
        b'H' => SupportMsg::Heartbeat {
            epoch: Epoch(r.u64()?),
            seq: r.u64()?,
        },
        b'A' => SupportMsg::Ack {
            epoch: Epoch(r.u64()?),
            seq: r.u64()?,
            incarnation: r.u32()?,
            promise_ns: r.u64()?,
            drift_ppm: r.u32()?,
        },
        b'W' => SupportMsg::Withdrawn {
            epoch: Epoch(r.u64()?),
        },
        other => return Err(BatchError::UnknownKind(other)),
    })
}

fn put_fortify(out: &mut Vec<u8>, m: &FortifyMsg) {
    match *m {
        FortifyMsg::Request { group, term, epoch } => {
            out.push(b'Q');
            put64(out, group);
            put64(out, term);
            put64(out, epoch.0);
        }
        FortifyMsg::Ack {
            group,
            term,
            epoch,
            incarnation,
        } => {
            out.push(b'K');
            put64(out, group);
            put64(out, term);
            put64(out, epoch.0);
            put32(out, incarnation);
        }
        FortifyMsg::Reject { group, term } => {
            out.push(b'J');
            put64(out, group);
            put64(out, term);
        }
        FortifyMsg::Release { group, term } => {
            out.push(b'R');
            put64(out, group);
            put64(out, term);
        }
    }
}

fn fortify(r: &mut Reader<'_>) -> Result<FortifyMsg, BatchError> {
    let kind = r.u8()?;
    let (group, term) = (r.u64()?, r.u64()?);
    Ok(match kind {
        b'Q' => FortifyMsg::Request {
            group,
            term,
            epoch: Epoch(r.u64()?),
        },
        b'K' => FortifyMsg::Ack {
            group,
            term,
            epoch: Epoch(r.u64()?),
            incarnation: r.u32()?,
        },
        b'J' => FortifyMsg::Reject { group, term },
        b'R' => FortifyMsg::Release { group, term },
        other => return Err(BatchError::UnknownKind(other)),
    })
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// The bytes not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BatchError> {
        if n > self.0.len() {
            return Err(BatchError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, BatchError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, BatchError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, BatchError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }

    /// A count of items of at least `min_bytes` each, refused if the bytes left cannot hold it.
    fn count(&mut self, min_bytes: usize) -> Result<usize, BatchError> {
        let n = self.u32()? as usize;
        match n.checked_mul(min_bytes) {
            Some(need) if need <= self.0.len() => Ok(n),
            _ => Err(BatchError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use raft::eraftpb::{Entry, MessageType};

    fn batch() -> NodeBatch {
        let mut m = Message {
            from: 1,
            to: 2,
            term: 7,
            index: 40,
            commit: 39,
            ..Default::default()
        };
        m.set_msg_type(MessageType::MsgAppend);
        m.entries = vec![Entry {
            index: 41,
            term: 7,
            data: b"x=1".to_vec().into(),
            ..Default::default()
        }]
        .into();
        NodeBatch {
            from: 1,
            to: 2,
            support: vec![
                SupportMsg::Heartbeat {
                    epoch: Epoch(3),
                    seq: 9,
                },
                SupportMsg::Ack {
                    epoch: Epoch(4),
                    seq: 10,
                    incarnation: 2,
                    promise_ns: 1_500_000_000,
                    drift_ppm: 500,
                },
                SupportMsg::Withdrawn { epoch: Epoch(5) },
            ],
            fortify: vec![
                FortifyMsg::Request {
                    group: 11,
                    term: 7,
                    epoch: Epoch(3),
                },
                FortifyMsg::Ack {
                    group: 12,
                    term: 8,
                    epoch: Epoch(3),
                    incarnation: 2,
                },
                FortifyMsg::Reject { group: 13, term: 9 },
                FortifyMsg::Release {
                    group: 14,
                    term: 10,
                },
            ],
            raft: vec![(11, m.clone()), (u64::MAX, m)],
        }
    }

    fn same(a: &NodeBatch, b: &NodeBatch) -> bool {
        (a.from, a.to, &a.support, &a.fortify) == (b.from, b.to, &b.support, &b.fortify)
            && a.raft == b.raft
    }

    #[test]
    fn every_kind_of_message_round_trips() {
        let b = batch();
        assert!(same(&decode(&encode(&b)).expect("decodes"), &b));
        let empty = NodeBatch {
            from: 3,
            to: 1,
            ..NodeBatch::default()
        };
        assert!(same(&decode(&encode(&empty)).expect("decodes"), &empty));
    }

    #[test]
    fn a_batch_cut_anywhere_or_extended_is_refused() {
        let bytes = encode(&batch());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut} accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer).unwrap_err(), BatchError::Trailing(1));
        let mut other = bytes;
        other[0] = b'X';
        assert_eq!(decode(&other).unwrap_err(), BatchError::BadMagic);
    }

    #[test]
    fn a_huge_count_is_refused_before_anything_is_allocated() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode(&bytes).unwrap_err(), BatchError::Truncated);
    }

    proptest! {
        #[test]
        fn garbage_never_panics_and_what_decodes_re_encodes(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
            keep_magic in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if keep_magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(MAGIC);
            }
            if let Ok(b) = decode(&bytes) {
                prop_assert!(same(&decode(&encode(&b)).expect("re-decodes"), &b));
            }
        }
    }
}
