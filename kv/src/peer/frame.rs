//! Peer frames: a message (a node batch, see `raft_lease::multi::wire`) cut into frames of at
//! most `MAX_FRAME_BYTES`.
//!
//! A frame is `[u32 big-endian length][u8 flags][length bytes]`; flag `FINAL` marks a message's
//! last frame. A length above the frame limit, or a message growing past the message limit, is an
//! error before anything is allocated for it; a frame's bytes are read in steps of
//! `READ_STEP_BYTES`, so memory grows only as bytes really arrive. A snapshot larger than one
//! frame travels as many. Bytes being reassembled, and whole messages until the raft thread has
//! stepped them, are held in the peer byte budget: a connection that cannot get bytes from it is
//! closed, so all connections together hold at most the budget.

use std::sync::Arc;
use std::time::Duration;

use raft_lease::multi::wire::{self, BatchError};
use raft_lease::multi::NodeBatch;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

use crate::base::budget::{Budget, Ticket};
use crate::base::limits::peer::{MAX_FRAME_BYTES, READ_STEP_BYTES};
use crate::peer::snapshot_wire::{Chunk, ChunkError, CHUNK_MAGIC};

/// The flag on a message's last frame.
pub const FINAL: u8 = 1;

/// Why a frame was refused. The connection is closed after any of them.
#[derive(Debug, Error)]
pub enum FrameError {
    /// A length prefix over [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds {MAX_FRAME_BYTES}")]
    FrameTooLarge(usize),
    /// A message growing past the message limit: (its size so far, the limit).
    #[error("message of {0}+ bytes exceeds {1}")]
    MessageTooLarge(usize, usize),
    /// The peer byte budget is used up by other connections.
    #[error("the peer byte budget ({0} bytes) is used up")]
    Budget(u64),
    /// Flags other than `FINAL`.
    #[error("unknown frame flags {0:#x}")]
    BadFlags(u8),
    /// The bytes are not a node batch.
    #[error("{0}")]
    Batch(#[from] BatchError),
    /// The bytes are not a snapshot chunk.
    #[error("{0}")]
    Chunk(#[from] ChunkError),
    /// A frame or a flush made no progress in time.
    #[error("a frame made no progress in time")]
    Stalled,
    /// The connection failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Write the encoded message `bytes` as one or more frames (not flushed), each within
/// `per_frame`.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    per_frame: Duration,
) -> Result<(), FrameError> {
    let pieces = bytes.len().div_ceil(MAX_FRAME_BYTES).max(1);
    for i in 0..pieces {
        let piece = &bytes
            [(i * MAX_FRAME_BYTES).min(bytes.len())..((i + 1) * MAX_FRAME_BYTES).min(bytes.len())];
        let flags = if i + 1 == pieces { FINAL } else { 0 };
        let frame = async {
            w.write_all(&(piece.len() as u32).to_be_bytes()).await?;
            w.write_all(&[flags]).await?;
            w.write_all(piece).await
        };
        timeout(per_frame, frame)
            .await
            .map_err(|_| FrameError::Stalled)??;
    }
    Ok(())
}

/// A message off a peer connection: a node batch, or a chunk of a snapshot's stream.
#[derive(Debug)]
pub enum PeerMessage {
    /// The support session, fortification and raft messages.
    Batch(NodeBatch),
    /// A piece of a snapshot's state (`snapshot_wire`).
    Chunk(Chunk),
}

/// Read one message of at most `max_message` bytes, its bytes held in `budget` (the ticket
/// returned holds them until dropped). `Ok(None)` on a clean close between messages.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    max_message: usize,
    budget: &Arc<Budget>,
) -> Result<Option<(PeerMessage, Ticket)>, FrameError> {
    let mut buf = Vec::new();
    let mut ticket = budget.take(0).expect("zero bytes always fit");
    loop {
        let mut header = [0u8; 5];
        match r.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && buf.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let flags = header[4];
        if flags & !FINAL != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::FrameTooLarge(len));
        }
        if buf.len() + len > max_message {
            return Err(FrameError::MessageTooLarge(buf.len() + len, max_message));
        }
        read_piece(r, &mut buf, len, &mut ticket).await?;
        if flags & FINAL != 0 {
            let msg = match buf.starts_with(CHUNK_MAGIC) {
                true => PeerMessage::Chunk(Chunk::decode(&buf)?),
                false => PeerMessage::Batch(wire::decode(&buf)?),
            };
            return Ok(Some((msg, ticket)));
        }
    }
}

/// Append `len` bytes to `buf`, growing it (and `ticket`) one step at a time as they arrive.
async fn read_piece<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    len: usize,
    ticket: &mut Ticket,
) -> Result<(), FrameError> {
    let end = buf.len() + len;
    while buf.len() < end {
        let start = buf.len();
        let step = (end - start).min(READ_STEP_BYTES);
        if !ticket.grow(step as u64) {
            return Err(FrameError::Budget(ticket.budget_limit()));
        }
        buf.resize(start + step, 0);
        r.read_exact(&mut buf[start..]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::Message;

    const T: Duration = Duration::from_secs(1);

    fn budget() -> Arc<Budget> {
        Budget::new(1 << 30)
    }

    /// The raft messages of the batch read from `wire`.
    fn read(wire: &[u8], max: usize) -> Result<Option<Vec<(u64, Message)>>, FrameError> {
        run(read_message(&mut &wire[..], max, &budget())).map(|m| {
            m.map(|(msg, _)| match msg {
                PeerMessage::Batch(b) => b.raft,
                PeerMessage::Chunk(c) => panic!("a chunk: {c:?}"),
            })
        })
    }

    /// `m` alone in a batch of group 0, encoded.
    fn encoded(m: &Message) -> Vec<u8> {
        wire::encode(&NodeBatch {
            from: m.from,
            to: m.to,
            raft: vec![(0, m.clone())],
            ..NodeBatch::default()
        })
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn big_snapshot(bytes: usize) -> Message {
        let mut m = Message {
            from: 2,
            to: 1,
            ..Default::default()
        };
        m.set_msg_type(raft::eraftpb::MessageType::MsgSnapshot);
        m.mut_snapshot().data = vec![7u8; bytes].into();
        m
    }

    #[test]
    fn a_message_larger_than_a_frame_travels_as_several_and_round_trips() {
        let m = big_snapshot(MAX_FRAME_BYTES * 2 + 10);
        let mut wire = Vec::new();
        let bytes = encoded(&m);
        run(write_message(&mut wire, &bytes, T)).unwrap();
        assert_eq!(
            wire.len(),
            bytes.len() + 3 * 5,
            "three frames with their headers"
        );
        assert_eq!(wire[4], 0, "the first frame is not the last");
        let got = read(&wire, 1 << 30).unwrap();
        assert_eq!(got, Some(vec![(0, m)]));
        let mut empty = Vec::new();
        run(write_message(&mut empty, &[], T)).unwrap();
        assert_eq!(
            empty,
            [0, 0, 0, 0, FINAL],
            "an empty message is one empty final frame"
        );
    }

    #[test]
    fn heartbeat_acknowledgements_round_trip_with_their_context_intact() {
        for ctx in crate::peer::ack_contexts::ack_contexts() {
            let mut m = Message {
                from: 2,
                to: 1,
                term: 3,
                ..Default::default()
            };
            m.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeatResponse);
            m.context = ctx.into();
            let mut wire = Vec::new();
            run(write_message(&mut wire, &encoded(&m), T)).unwrap();
            assert_eq!(read(&wire, 1 << 20).unwrap(), Some(vec![(0, m)]));
        }
    }

    #[test]
    fn limits_are_checked_before_allocating() {
        // A 4 GiB claim with no bytes behind it: refused on the header alone.
        let claim = [0xff, 0xff, 0xff, 0xff, FINAL];
        assert!(matches!(
            read(&claim, 1 << 30),
            Err(FrameError::FrameTooLarge(_))
        ));
        let m = big_snapshot(MAX_FRAME_BYTES * 2);
        let mut wire = Vec::new();
        run(write_message(&mut wire, &encoded(&m), T)).unwrap();
        assert!(matches!(
            read(&wire, MAX_FRAME_BYTES),
            Err(FrameError::MessageTooLarge(..))
        ));
        assert!(matches!(
            read(&[0, 0, 0, 0, 2][..], 1 << 30),
            Err(FrameError::BadFlags(2))
        ));
        assert!(matches!(
            read(&[0, 0, 0, 3, FINAL, 0xff, 0xff, 0xff][..], 1 << 30),
            Err(FrameError::Batch(_))
        ));
        // A frame that promises more than arrives is an error, not a hang or an allocation.
        assert!(matches!(
            read(&[0, 0x0f, 0, 0, FINAL, 1, 2][..], 1 << 30),
            Err(FrameError::Io(_))
        ));
        assert!(read(&[][..], 1 << 30).unwrap().is_none(), "clean close");
    }

    #[test]
    fn reassembly_holds_bytes_in_the_budget_and_fails_when_it_is_used_up() {
        let m = big_snapshot(MAX_FRAME_BYTES * 2);
        let mut wire = Vec::new();
        run(write_message(&mut wire, &encoded(&m), T)).unwrap();
        let small = Budget::new(MAX_FRAME_BYTES as u64);
        assert!(matches!(
            run(read_message(&mut &wire[..], 1 << 30, &small)),
            Err(FrameError::Budget(_))
        ));
        assert_eq!(small.used(), 0, "a failed read gives its bytes back");
        let b = budget();
        let (got, ticket) = run(read_message(&mut &wire[..], 1 << 30, &b))
            .unwrap()
            .unwrap();
        let PeerMessage::Batch(got) = got else {
            panic!("not a batch")
        };
        assert_eq!(got.raft, vec![(0, m)]);
        assert!(b.used() >= (MAX_FRAME_BYTES * 2) as u64);
        drop(ticket);
        assert_eq!(b.used(), 0);
    }
}
