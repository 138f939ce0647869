//! Peer frames: a raft message as protobuf, cut into frames of at most `MAX_FRAME_BYTES`.
//!
//! A frame is `[u32 big-endian length][u8 flags][length bytes]`; flag `FINAL` marks a message's
//! last frame. A length above the frame limit, or a message growing past the message limit, is an
//! error before anything is allocated for it; a frame's bytes are read in steps of
//! `READ_STEP_BYTES`, so memory grows only as bytes really arrive. A snapshot larger than one
//! frame travels as many.

use protobuf::Message as _;
use raft::eraftpb::Message;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::limits::peer::{MAX_FRAME_BYTES, READ_STEP_BYTES};

/// The flag on a message's last frame.
pub const FINAL: u8 = 1;

/// Why a frame was refused. The connection is closed after any of them.
#[derive(Debug, Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds {MAX_FRAME_BYTES}")]
    FrameTooLarge(usize),
    #[error("message of {0}+ bytes exceeds {1}")]
    MessageTooLarge(usize, usize),
    #[error("unknown frame flags {0:#x}")]
    BadFlags(u8),
    #[error("bad protobuf: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Write `msg` as one or more frames (not flushed).
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Message,
) -> Result<(), FrameError> {
    let bytes = msg.write_to_bytes()?;
    let pieces = bytes.len().div_ceil(MAX_FRAME_BYTES).max(1);
    for i in 0..pieces {
        let piece = &bytes
            [(i * MAX_FRAME_BYTES).min(bytes.len())..((i + 1) * MAX_FRAME_BYTES).min(bytes.len())];
        let flags = if i + 1 == pieces { FINAL } else { 0 };
        w.write_all(&(piece.len() as u32).to_be_bytes()).await?;
        w.write_all(&[flags]).await?;
        w.write_all(piece).await?;
    }
    Ok(())
}

/// Read one message of at most `max_message` bytes. `Ok(None)` on a clean close between messages.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    max_message: usize,
) -> Result<Option<Message>, FrameError> {
    let mut buf = Vec::new();
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
        read_piece(r, &mut buf, len).await?;
        if flags & FINAL != 0 {
            return Ok(Some(Message::parse_from_bytes(&buf)?));
        }
    }
}

/// Append `len` bytes to `buf`, growing it one step at a time as they arrive.
async fn read_piece<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    len: usize,
) -> std::io::Result<()> {
    let end = buf.len() + len;
    while buf.len() < end {
        let start = buf.len();
        buf.resize(start + (end - start).min(READ_STEP_BYTES), 0);
        r.read_exact(&mut buf[start..]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
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
        run(write_message(&mut wire, &m)).unwrap();
        let encoded = m.write_to_bytes().unwrap().len();
        assert_eq!(
            wire.len(),
            encoded + 3 * 5,
            "three frames with their headers"
        );
        assert_eq!(wire[4], 0, "the first frame is not the last");
        let got = run(read_message(&mut &wire[..], 1 << 30)).unwrap();
        assert_eq!(got, Some(m));
        let mut empty = Vec::new();
        run(write_message(&mut empty, &Message::default())).unwrap();
        assert_eq!(
            empty,
            [0, 0, 0, 0, FINAL],
            "an empty message is one empty final frame"
        );
    }

    #[test]
    fn limits_are_checked_before_allocating() {
        // A 4 GiB claim with no bytes behind it: refused on the header alone.
        let claim = [0xff, 0xff, 0xff, 0xff, FINAL];
        assert!(matches!(
            run(read_message(&mut &claim[..], 1 << 30)),
            Err(FrameError::FrameTooLarge(_))
        ));
        let m = big_snapshot(MAX_FRAME_BYTES * 2);
        let mut wire = Vec::new();
        run(write_message(&mut wire, &m)).unwrap();
        assert!(matches!(
            run(read_message(&mut &wire[..], MAX_FRAME_BYTES)),
            Err(FrameError::MessageTooLarge(..))
        ));
        assert!(matches!(
            run(read_message(&mut &[0, 0, 0, 0, 2][..], 1 << 30)),
            Err(FrameError::BadFlags(2))
        ));
        assert!(matches!(
            run(read_message(
                &mut &[0, 0, 0, 3, FINAL, 0xff, 0xff, 0xff][..],
                1 << 30
            )),
            Err(FrameError::Protobuf(_))
        ));
        // A frame that promises more than arrives is an error, not a hang or an allocation.
        assert!(matches!(
            run(read_message(
                &mut &[0, 0x0f, 0, 0, FINAL, 1, 2][..],
                1 << 30
            )),
            Err(FrameError::Io(_))
        ));
        assert!(
            run(read_message(&mut &[][..], 1 << 30)).unwrap().is_none(),
            "clean close"
        );
    }
}
