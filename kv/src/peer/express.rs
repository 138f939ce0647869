//! The express path of the peer transport: the raft thread writes a small batch into a peer's
//! connection itself, when nothing is queued ahead of it, instead of waking the peer's sender
//! task to do it.
//!
//! Each hand-off from the raft thread to a sender task is a thread wake-up, and on a machine
//! where the nodes and their clients share a few cores a wake-up waits for a core: a write's
//! append to a follower and the follower's answer each paid one. Here the raft thread takes the
//! connection's lock without waiting ([`PeerConn::writer`]), copies the frame into the
//! connection's buffer, and flushes once without waiting. What the socket does not take at once
//! stays buffered in order, and the sender task is asked to finish the flush; the connection is
//! never left inside a frame.
//!
//! Order is kept: the raft thread writes only when no batch it queued before is still unwritten
//! ([`PeerConn::unwritten`] is decremented by the sender task only after it has written a
//! batch, with the lock held).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncWrite, BufWriter};

use crate::base::limits::peer::MAX_FRAME_BYTES;
use crate::peer::frame::FINAL;

/// A peer connection's writer: a buffer over the (TLS) stream.
pub type PeerWriter = BufWriter<Box<dyn AsyncWrite + Send + Unpin>>;

/// The buffer of a peer connection's writer: a batch the express path takes must fit in what
/// is free of it.
const WRITER_BUFFER_BYTES: usize = 64 << 10;

/// The writer of a new connection `w`: every peer connection's is made here, with the buffer
/// the express path's room check counts on.
pub fn writer_over(w: Box<dyn AsyncWrite + Send + Unpin>) -> PeerWriter {
    BufWriter::with_capacity(WRITER_BUFFER_BYTES, w)
}

/// One peer's connection, shared by its sender task and the raft thread.
#[derive(Default)]
pub struct PeerConn {
    /// The connection (`None`: not connected; the sender task connects).
    pub writer: tokio::sync::Mutex<Option<PeerWriter>>,
    /// Batches queued for the sender task and not yet written by it (flush requests included).
    pub unwritten: AtomicUsize,
    /// Bytes of the batches queued for the sender task and not yet taken by it: bounded (see
    /// `transport`), so a peer that accepts nothing holds a bounded amount of memory.
    pub queued_bytes: AtomicUsize,
    /// Times the connection failed (or could not be made) and what was queued was lost: a
    /// snapshot streamed over it while this moves lost chunks, and is lost whole.
    pub failures: std::sync::atomic::AtomicU64,
}

/// What an express write did.
#[derive(Debug)]
pub enum Express {
    /// Written and flushed.
    Sent,
    /// Written; part of it is still buffered: the sender task must flush.
    Buffered,
    /// Not taken (something queued ahead, the connection busy or absent, no room): queue it.
    Declined,
    /// The connection failed: it was closed, and the batch is lost.
    Failed(std::io::Error),
}

impl PeerConn {
    /// Write the encoded batch `bytes` as one frame, if the express path may (see the module
    /// docs). Runs on the raft thread, inside the runtime's context, and never waits.
    pub fn try_write(&self, bytes: &[u8]) -> Express {
        if bytes.len() > MAX_FRAME_BYTES || self.unwritten.load(Ordering::Acquire) > 0 {
            return Express::Declined;
        }
        let Ok(mut guard) = self.writer.try_lock() else {
            return Express::Declined;
        };
        let Some(w) = guard.as_mut() else {
            return Express::Declined;
        };
        // Every connection's writer is made with this capacity (`writer_over`).
        if WRITER_BUFFER_BYTES.saturating_sub(w.buffer().len()) < 5 + bytes.len() {
            return Express::Declined;
        }
        match write_frame(w, bytes) {
            Ok(true) => Express::Sent,
            Ok(false) => Express::Buffered,
            Err(e) => {
                *guard = None; // closed: the sender task connects again
                Express::Failed(e)
            }
        }
    }
}

/// Copy `bytes` as one frame into `w`'s buffer (which has room for it), then flush once without
/// waiting: whether everything reached the socket.
fn write_frame(w: &mut PeerWriter, bytes: &[u8]) -> std::io::Result<bool> {
    let mut header = [0u8; 5];
    header[..4].copy_from_slice(&(bytes.len() as u32).to_be_bytes());
    header[4] = FINAL;
    for part in [&header[..], bytes] {
        match poll_once(|cx| Pin::new(&mut *w).poll_write(cx, part)) {
            Poll::Ready(Ok(n)) => assert_eq!(n, part.len(), "a buffered write with room"),
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => unreachable!("a buffered write with room never waits"),
        }
    }
    match poll_once(|cx| Pin::new(&mut *w).poll_flush(cx)) {
        Poll::Ready(r) => r.map(|()| true),
        Poll::Pending => Ok(false),
    }
}

/// Poll `f` once with a waker that does nothing: whoever polls next (the sender task) registers
/// its own.
fn poll_once<T>(mut f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut once = std::future::poll_fn(|cx| Poll::Ready(f(cx)));
    match Pin::new(&mut once).poll(&mut cx) {
        Poll::Ready(p) => p,
        Poll::Pending => unreachable!("poll_fn returns Ready"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn conn_over(w: impl AsyncWrite + Send + Unpin + 'static) -> PeerConn {
        let conn = PeerConn::default();
        let writer: Box<dyn AsyncWrite + Send + Unpin> = Box::new(w);
        *conn.writer.try_lock().unwrap() = Some(writer_over(writer));
        conn
    }

    #[tokio::test]
    async fn an_express_write_is_one_whole_frame_on_the_wire() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let conn = conn_over(a);
        assert!(matches!(conn.try_write(b"hello"), Express::Sent));
        let mut got = [0u8; 10];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"\0\0\0\x05\x01hello");
    }

    #[tokio::test]
    async fn nothing_is_written_ahead_of_a_queued_batch_or_a_busy_connection() {
        let (a, _b) = tokio::io::duplex(1 << 20);
        let conn = conn_over(a);
        conn.unwritten.store(1, Ordering::Release);
        assert!(
            matches!(conn.try_write(b"x"), Express::Declined),
            "a batch queued ahead"
        );
        conn.unwritten.store(0, Ordering::Release);
        let held = conn.writer.try_lock().unwrap();
        assert!(
            matches!(conn.try_write(b"x"), Express::Declined),
            "the task is writing"
        );
        drop(held);
        *conn.writer.try_lock().unwrap() = None;
        assert!(
            matches!(conn.try_write(b"x"), Express::Declined),
            "not connected"
        );
    }

    #[tokio::test]
    async fn a_full_socket_leaves_the_frame_buffered_whole_for_the_task() {
        let (a, mut b) = tokio::io::duplex(4);
        let conn = conn_over(a);
        assert!(matches!(conn.try_write(b"0123456789"), Express::Buffered));
        let too_big = vec![0u8; WRITER_BUFFER_BYTES];
        assert!(
            matches!(conn.try_write(&too_big), Express::Declined),
            "no room left"
        );
        let mut guard = conn.writer.lock().await;
        let w = guard.as_mut().unwrap();
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 15];
            b.read_exact(&mut got).await.unwrap();
            got
        });
        tokio::io::AsyncWriteExt::flush(w).await.unwrap();
        assert_eq!(reader.await.unwrap(), b"\0\0\0\x0a\x010123456789");
    }
}
