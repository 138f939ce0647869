//! Receiving a raft snapshot without the raft thread: the chunks of a snapshot's stream (see
//! `snapshot_send`) are handed, as they arrive and in order, to a thread of their own that
//! writes the state beside the current one ([`SnapshotTarget`]: a new generation of the state
//! engine) and seals it when the stream ends and adds up. The `MsgSnapshot` that follows the
//! chunks is handed to the raft thread only once its stream is sealed, for the index it names;
//! otherwise it is dropped (the leader sends it again), so raft never accepts a snapshot the
//! state machine cannot install at once. A stream cut short, forged or damaged is refused with
//! its reason and leaves the current state as it was.
//!
//! Memory is bounded: a stream's chunks wait in a queue of a few chunks (the connection waits
//! when it is full), at most [`MAX_STREAMS`] streams are received at once, and one that makes no
//! progress for [`STREAM_TIMEOUT`] is given up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use crate::peer::snapshot_wire::Chunk;

/// Where a received snapshot's state is written.
pub trait SnapshotTarget: Send + Sync {
    /// Begin writing group `group`'s snapshot `id` beside its current state.
    fn begin(&self, group: u64, id: u64) -> Result<Box<dyn SnapshotWriter>, String>;
}

/// One snapshot's state being written.
pub trait SnapshotWriter: Send {
    /// The next bytes of the stream.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), String>;
    /// The stream ended: check it and seal what it wrote; the index the state is at.
    fn finish(self: Box<Self>) -> Result<u64, String>;
}

/// Streams received at once at most.
pub const MAX_STREAMS: usize = 4;
/// A stream whose next chunk does not come within this long is given up.
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// Chunks waiting for a stream's writer at most.
const QUEUE_CHUNKS: usize = 4;

/// A stream's outcome: `None` while it is received.
type Outcome = Option<Result<u64, String>>;

/// One stream being received.
struct Stream {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    /// A chunk came out of order (or a sequence was lost): whatever the writer says, it fails.
    broken: Arc<std::sync::atomic::AtomicBool>,
    next_seq: u32,
    outcome: watch::Receiver<Outcome>,
    heard: Instant,
}

/// Every snapshot stream being received by this node, by (sender, group, id).
pub struct SnapshotInbox {
    target: Arc<dyn SnapshotTarget>,
    logger: slog::Logger,
    /// A stream longer than this is refused (more than any state within the quota holds): a
    /// peer's stream cannot fill the disk.
    max_stream_bytes: u64,
    streams: Mutex<HashMap<(u64, u64, u64), Stream>>,
}

impl SnapshotInbox {
    /// An inbox writing into `target`, refusing streams past `max_stream_bytes`, logging to
    /// `logger`.
    pub fn new(
        target: Arc<dyn SnapshotTarget>,
        max_stream_bytes: u64,
        logger: slog::Logger,
    ) -> Self {
        SnapshotInbox {
            target,
            logger,
            max_stream_bytes,
            streams: Mutex::new(HashMap::new()),
        }
    }

    /// Take `c`: the first chunk of a stream starts its writer; a chunk out of order, or one
    /// beyond [`MAX_STREAMS`], fails the stream. Waits while the writer's queue is full.
    pub async fn on_chunk(&self, c: Chunk) {
        let key = (c.from, c.group, c.id);
        let tx = {
            let mut streams = self.streams.lock();
            streams.retain(|_, s| s.heard.elapsed() < STREAM_TIMEOUT);
            if c.seq == 0 && !streams.contains_key(&key) {
                let busy = streams.values().filter(|s| s.tx.is_some()).count() >= MAX_STREAMS;
                let s = match busy {
                    true => failed("too many snapshots received at once; send it again later"),
                    false => self.start(c.group, c.id),
                };
                streams.insert(key, s);
            }
            let Some(s) = streams.get_mut(&key) else {
                return; // a stream whose start was not seen: nothing to add it to
            };
            s.heard = Instant::now();
            if c.seq != s.next_seq {
                s.broken.store(true, std::sync::atomic::Ordering::SeqCst);
                s.tx = None; // out of order: the writer ends, and the stream fails
            }
            s.next_seq = c.seq.wrapping_add(1);
            let tx = s.tx.clone();
            if c.last {
                s.tx = None; // the writer finishes once the queue is empty
            }
            tx
        };
        if let Some(tx) = tx {
            let _ = tx.send(c.bytes).await;
        }
    }

    fn start(&self, group: u64, id: u64) -> Stream {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUE_CHUNKS);
        let (done_tx, done_rx) = watch::channel(None);
        let (target, log) = (self.target.clone(), self.logger.clone());
        let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let broken_w = broken.clone();
        let max_bytes = self.max_stream_bytes;
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut received = 0u64;
            let outcome = (|| {
                let mut w = target.begin(group, id)?;
                while let Some(bytes) = rx.blocking_recv() {
                    received += bytes.len() as u64;
                    if received > max_bytes {
                        return Err(format!(
                            "the stream passed {max_bytes} bytes, more than a state within the quota holds"
                        ));
                    }
                    w.feed(&bytes)?;
                }
                if broken_w.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err("its chunks came out of order (one was lost)".to_string());
                }
                w.finish()
            })();
            match &outcome {
                Ok(index) => slog::info!(log, "snapshot stream received and sealed";
                    "group" => group, "index" => index, "bytes" => received,
                    "ms" => started.elapsed().as_millis() as u64),
                Err(why) => slog::warn!(log, "snapshot stream refused";
                    "group" => group, "bytes" => received, "error" => why),
            }
            let _ = done_tx.send(Some(outcome));
        });
        Stream {
            tx: Some(tx),
            broken,
            next_seq: 0,
            outcome: done_rx,
            heard: Instant::now(),
        }
    }

    /// The outcome of the stream of snapshot `id` of `group` from `from`, once it ended: the
    /// index its state is at, or why it was refused. Waits up to [`STREAM_TIMEOUT`].
    pub async fn outcome(&self, from: u64, group: u64, id: u64) -> Result<u64, String> {
        let rx = self
            .streams
            .lock()
            .get(&(from, group, id))
            .map(|s| s.outcome.clone());
        let Some(mut rx) = rx else {
            return Err("no stream of it arrived".into());
        };
        let waited = tokio::time::timeout(STREAM_TIMEOUT, rx.wait_for(Option::is_some)).await;
        let outcome = match waited {
            Ok(Ok(done)) => done.clone().expect("waited for it"),
            Ok(Err(_)) => Err("its writer stopped".into()),
            Err(_) => Err("its stream did not end in time".into()),
        };
        self.streams.lock().remove(&(from, group, id));
        outcome
    }
}

/// A stream refused from its start (its outcome is the reason).
fn failed(why: &str) -> Stream {
    let (_, rx) = watch::channel(Some(Err(why.to_string())));
    Stream {
        tx: None,
        broken: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        next_seq: 0,
        outcome: rx,
        heard: Instant::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target that keeps what it was fed, and refuses a stream with "bad" in it.
    #[derive(Default)]
    struct Keep(Arc<Mutex<Vec<u8>>>);

    struct KeepWriter(Arc<Mutex<Vec<u8>>>, Vec<u8>);

    impl SnapshotTarget for Keep {
        fn begin(&self, _: u64, _: u64) -> Result<Box<dyn SnapshotWriter>, String> {
            Ok(Box::new(KeepWriter(self.0.clone(), Vec::new())))
        }
    }

    impl SnapshotWriter for KeepWriter {
        fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
            self.1.extend_from_slice(bytes);
            Ok(())
        }

        fn finish(self: Box<Self>) -> Result<u64, String> {
            if self.1.windows(3).any(|w| w == b"bad") {
                return Err("refused".into());
            }
            *self.0.lock() = self.1.clone();
            Ok(self.1.len() as u64)
        }
    }

    fn chunk(id: u64, seq: u32, last: bool, bytes: &[u8]) -> Chunk {
        Chunk {
            from: 2,
            to: 1,
            group: 0,
            id,
            seq,
            last,
            bytes: bytes.to_vec(),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_stream_in_order_is_sealed_and_one_out_of_order_or_refused_fails() {
        let target = Keep::default();
        let kept = target.0.clone();
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let inbox = SnapshotInbox::new(Arc::new(target), 1 << 30, log);
        rt().block_on(async {
            inbox.on_chunk(chunk(1, 0, false, b"ab")).await;
            inbox.on_chunk(chunk(1, 1, true, b"cd")).await;
            assert_eq!(inbox.outcome(2, 0, 1).await, Ok(4));
            assert_eq!(*kept.lock(), b"abcd");
            inbox.on_chunk(chunk(2, 0, false, b"x")).await;
            inbox.on_chunk(chunk(2, 2, true, b"y")).await;
            assert!(inbox.outcome(2, 0, 2).await.is_err(), "a chunk missing");
            inbox.on_chunk(chunk(3, 0, true, b"bad")).await;
            assert_eq!(inbox.outcome(2, 0, 3).await, Err("refused".into()));
            assert!(inbox.outcome(2, 0, 4).await.is_err(), "never sent");
            inbox.on_chunk(chunk(5, 1, true, b"late")).await;
            assert!(
                inbox.outcome(2, 0, 5).await.is_err(),
                "its start never came"
            );
        });
    }
}
