//! A snapshot into the state: its stream is written under a new generation beside the current
//! state, in bounded batches, then sealed as an install with the snapshot's id; the raft log
//! takes the snapshot; then the new generation becomes the group's. A crash between any two of
//! those writes is settled when the node starts again ([`KvState::settle`]), so the state and
//! the raft log always agree. A streamed snapshot is written by [`StateSnapshots`], off the raft
//! thread, as its chunks arrive.
//!
//! Also the store's upkeep between passes: installs that can no longer be used dropped, rows of
//! replaced generations removed, and the physical step of a compaction, a bounded batch at a
//! time.

use crate::disk::state_engine::{EngineError, StateEngine, StateView};
use crate::peer::snapshot_recv::{SnapshotTarget, SnapshotWriter};
use crate::peer::snapshot_send::StreamSource;
use crate::state::kv_state::{KvState, SWEEP_BUDGET};
use crate::state::mvcc::generation::{self, Staging};
use crate::state::mvcc::{empty_state_rows, Batch, MvccError};
use crate::state::stream::{write_generation, Row, StreamReader, StreamWriter};

/// Bytes of rows written per engine batch while staging a snapshot.
pub const STAGE_BATCH_BYTES: usize = 4 << 20;

/// Rows of replaced generations removed per upkeep step.
pub const COLLECT_BUDGET: usize = 16_384;

/// The id of a snapshot staged from bytes in hand (not streamed): the cluster's bootstrap.
pub const LOCAL_STAGE: u64 = 0;

/// Writes one snapshot's stream into a new generation as it comes.
struct StreamInto {
    staging: Staging,
    reader: StreamReader,
    rows: Vec<Row>,
    bytes: usize,
    id: u64,
    expect: Option<u64>,
}

impl StreamInto {
    fn new(engine: &StateEngine, group: u64, id: u64, expect: Option<u64>) -> Result<Self, String> {
        Ok(StreamInto {
            staging: Staging::begin(engine, group).map_err(|e| e.to_string())?,
            reader: StreamReader::default(),
            rows: Vec::new(),
            bytes: 0,
            id,
            expect,
        })
    }
}

impl SnapshotWriter for StreamInto {
    fn feed(&mut self, piece: &[u8]) -> Result<(), String> {
        for r in self
            .reader
            .feed(piece)
            .map_err(|e| format!("snapshot refused: {e}"))?
        {
            self.bytes += r.key.len() + r.value.len();
            self.rows.push(r);
            if self.bytes >= STAGE_BATCH_BYTES {
                let rows = std::mem::take(&mut self.rows);
                self.staging.put_rows(&rows).map_err(|e| e.to_string())?;
                self.bytes = 0;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<u64, String> {
        self.reader
            .finish()
            .map_err(|e| format!("snapshot refused: {e}"))?;
        let rows = std::mem::take(&mut self.rows);
        self.staging.put_rows(&rows).map_err(|e| e.to_string())?;
        self.staging
            .seal(self.id, self.expect)
            .map_err(|e| e.to_string())
    }
}

/// Where streamed snapshots are written: the node's state engine.
pub struct StateSnapshots {
    /// The engine.
    pub engine: StateEngine,
}

impl SnapshotTarget for StateSnapshots {
    fn begin(&self, group: u64, id: u64) -> Result<Box<dyn SnapshotWriter>, String> {
        Ok(Box::new(StreamInto::new(&self.engine, group, id, None)?))
    }
}

/// A group's state at one applied index, as a read view, to stream later.
pub struct GenView {
    view: StateView,
    gen: u64,
}

impl StreamSource for GenView {
    fn stream(
        self: Box<Self>,
        chunk_bytes: usize,
        sink: &mut dyn FnMut(Vec<u8>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut failed = None;
        let mut into = |chunk: Vec<u8>| {
            sink(chunk).map_err(|e| {
                failed = Some(e.clone());
                EngineError::Io(e)
            })
        };
        let mut w = StreamWriter::new(chunk_bytes, &mut into);
        let written = write_generation(&self.view, self.gen, &mut w).and_then(|()| w.finish());
        match (written, failed) {
            (Ok(_), None) => Ok(()),
            (_, Some(why)) => Err(why),
            (Err(e), None) => Err(e.to_string()),
        }
    }
}

impl KvState {
    /// A view of the state as applied now, to stream as a snapshot.
    pub fn view_for_snapshot(&self) -> Result<GenView, EngineError> {
        let view = self.keyspace.engine().view()?;
        let gen = crate::state::mvcc::gen_of(&view, self.keyspace.group())
            .map_err(|e| EngineError::Io(e.to_string()))?;
        Ok(GenView { view, gen })
    }

    /// Write `stream` (a snapshot of the state at `index`, in hand) beside the current state and
    /// seal it as install [`LOCAL_STAGE`]; the state is unchanged until
    /// [`KvState::install_staged`]. An empty stream is an empty state. A stream that does not
    /// add up is refused whole and leaves only rows to be removed.
    pub fn stage(&mut self, stream: &[u8], index: u64) -> Result<u64, String> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        let mut w = Box::new(StreamInto::new(&engine, group, LOCAL_STAGE, Some(index))?);
        if stream.is_empty() {
            w.staging
                .put_rows(&empty_state_rows(index))
                .map_err(|e| e.to_string())?;
            w.staging
                .seal(LOCAL_STAGE, Some(index))
                .map_err(|e| e.to_string())?;
            return Ok(LOCAL_STAGE);
        }
        for piece in stream.chunks(1 << 20) {
            w.feed(piece)?;
        }
        w.finish()?;
        Ok(LOCAL_STAGE)
    }

    /// The index sealed install `id` holds, if it is sealed.
    pub fn staged_index(&self, id: u64) -> Result<Option<u64>, String> {
        let view = self.keyspace.engine().view().map_err(|e| e.to_string())?;
        generation::sealed_index(&view, self.keyspace.group(), id).map_err(|e| e.to_string())
    }

    /// Make sealed install `id` the state (the raft log took the snapshot), and read it.
    pub fn install_staged(&mut self, id: u64) -> Result<(), String> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        if !generation::complete_install(&engine, group, id).map_err(|e| e.to_string())? {
            return Err(format!("no sealed snapshot {id} to install"));
        }
        self.reload()?;
        self.mark_durable();
        Ok(())
    }

    /// Stage and install `stream` at once (tests; the loop's own order is in `raft_io`).
    #[cfg(test)]
    pub fn install_stream(&mut self, stream: &[u8], index: u64) -> Result<(), String> {
        let id = self.stage(stream, index)?;
        self.install_staged(id)
    }

    /// At start: complete or drop an install a crash left half done (the raft log took a
    /// snapshot at `log_snapshot_index`), and read the state again if it changed.
    pub fn settle(&mut self, log_snapshot_index: u64) -> Result<(), String> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        let done = generation::settle_install(&engine, group, log_snapshot_index, self.applied)
            .map_err(|e| e.to_string())?;
        if done {
            self.reload()?;
            self.mark_durable();
        }
        Ok(())
    }

    /// One bounded step of upkeep: installs at or below the applied index dropped (raft takes no
    /// snapshot it has passed), rows of replaced generations, then a compaction's sweep.
    /// Whether more is left.
    pub fn tidy_step(&mut self) -> Result<bool, EngineError> {
        let engine = self.keyspace.engine().clone();
        let fatal = |e: MvccError| EngineError::Io(e.to_string());
        let group = self.keyspace.group();
        let view = engine.view()?;
        let applied = self.applied;
        let stale = generation::sealed_installs(&view, group)
            .map_err(fatal)?
            .iter()
            .any(|&(_, _, index)| index <= applied);
        if stale {
            generation::drop_installs(&engine, group, |_, index| index > applied).map_err(fatal)?;
        }
        if generation::dead_left(&engine).map_err(fatal)? {
            generation::collect_dead(&engine, COLLECT_BUDGET).map_err(fatal)?;
            return Ok(true);
        }
        drop(view);
        let due = self.keyspace.read(|r| {
            let c = r.counters();
            Ok(c.compacted > 0 && c.swept <= c.compacted)
        });
        if !due.map_err(fatal)? {
            return Ok(false);
        }
        let (more, counters) = engine.write(false, |w| {
            let mut b = Batch::begin(w, group).map_err(fatal)?;
            b.sweep(SWEEP_BUDGET).map_err(fatal)?;
            let more = b.sweep_due();
            Ok((more, b.finish(applied).map_err(fatal)?))
        })?;
        self.keyspace.publish(&counters);
        Ok(more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::command::Command;

    fn put(s: &mut KvState, index: u64, key: &str) {
        let cmd = Command::Put {
            key: key.into(),
            session: None,
            fence: None,
            now_ns: 0,
        };
        s.apply(index, cmd, b"v");
    }

    fn value(s: &KvState, key: &str) -> bool {
        crate::state::kv_machine::stored(&s.keyspace, key)
            .unwrap()
            .is_some()
    }

    /// The stream of a state at index 9 holding key "new" (another replica's).
    fn stream_at_9() -> Vec<u8> {
        let mut other = KvState::new();
        for i in 1..=8 {
            other.apply_run(&[(i, &[])]).unwrap();
        }
        put(&mut other, 9, "new");
        let mut bytes = Vec::new();
        let view: Box<dyn StreamSource> = Box::new(other.view_for_snapshot().unwrap());
        view.stream(64, &mut |c| {
            bytes.extend(c);
            Ok(())
        })
        .unwrap();
        bytes
    }

    /// Install a snapshot into a state at index 5 (key "old") in its steps, stopping the process
    /// after `steps` of them: the stream half written (1), all written (2), sealed (3), the raft
    /// log taking the snapshot (4, modelled by the log's snapshot index a restart reads), the
    /// state switched (5). Then start again: the state is the old one, whole, unless the log
    /// took the snapshot, and then the new one, whole.
    fn cut_after(steps: usize) -> (u64, bool, bool) {
        let dir = tempfile::tempdir().unwrap();
        let stream = stream_at_9();
        let mut log_snapshot_index = 1;
        {
            let engine = StateEngine::open(dir.path(), 1 << 20).unwrap();
            let mut s = KvState::open(engine.clone(), 0).unwrap();
            for i in 1..=4 {
                s.apply_run(&[(i, &[])]).unwrap();
            }
            put(&mut s, 5, "old");
            s.make_durable().unwrap();
            let target = StateSnapshots {
                engine: engine.clone(),
            };
            let mut w = target.begin(0, 77).unwrap();
            let half = stream.len() / 2;
            if steps >= 1 {
                w.feed(&stream[..half]).unwrap();
            }
            if steps >= 2 {
                w.feed(&stream[half..]).unwrap();
            }
            if steps >= 3 {
                assert_eq!(w.finish().unwrap(), 9);
            }
            if steps >= 4 {
                log_snapshot_index = 9;
            }
            if steps >= 5 {
                s.install_staged(77).unwrap();
            }
        } // the process stops here: nothing more is written
        let engine = StateEngine::open(dir.path(), 1 << 20).unwrap();
        let mut s = KvState::open(engine, 0).unwrap();
        s.settle(log_snapshot_index).unwrap();
        while s.tidy_step().unwrap() {}
        (s.applied, value(&s, "old"), value(&s, "new"))
    }

    #[test]
    fn a_crash_between_any_two_writes_of_an_install_leaves_one_whole_state() {
        for steps in 0..=3 {
            assert_eq!(
                cut_after(steps),
                (5, true, false),
                "stopped after {steps} steps"
            );
        }
        for steps in 4..=5 {
            assert_eq!(
                cut_after(steps),
                (9, false, true),
                "stopped after {steps} steps"
            );
        }
    }

    #[test]
    fn a_forged_or_truncated_stream_is_refused_and_changes_nothing() {
        let stream = stream_at_9();
        let mut s = KvState::new();
        put(&mut s, 1, "old");
        let target = StateSnapshots {
            engine: s.keyspace.engine().clone(),
        };
        for bad in [&stream[..stream.len() - 3], b"KVSS\x01garbage".as_slice()] {
            let mut w = target.begin(0, 5).unwrap();
            let fed = w.feed(bad);
            let refused = fed.and_then(|()| w.finish());
            assert!(refused.is_err(), "{refused:?}");
            assert!(s.staged_index(5).unwrap().is_none(), "nothing sealed");
        }
        while s.tidy_step().unwrap() {}
        assert!(value(&s, "old") && !value(&s, "new"));
        assert_eq!(s.applied, 1);
    }
}
