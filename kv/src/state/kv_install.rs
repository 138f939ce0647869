//! A snapshot into the state: the stream is written under a new generation beside the current
//! state, in bounded batches, then sealed; the raft log takes the snapshot; then the new
//! generation becomes the group's. A crash between any two of those writes is settled when the
//! node starts again ([`KvState::settle`]), so the state and the raft log always agree.
//!
//! Also the store's upkeep between passes: rows of replaced generations removed, and the
//! physical step of a compaction, a bounded batch at a time.

use crate::disk::state_engine::EngineError;
use crate::state::kv_state::{KvState, SWEEP_BUDGET};
use crate::state::mvcc::generation::{self, Staging};
use crate::state::mvcc::{Batch, MvccError};
use crate::state::stream::{Row, StreamReader};

/// Bytes of rows written per engine batch while staging a snapshot.
pub const STAGE_BATCH_BYTES: usize = 4 << 20;

/// Rows of replaced generations removed per upkeep step.
pub const COLLECT_BUDGET: usize = 16_384;

impl KvState {
    /// Write `stream` (a snapshot of the state at `index`) beside the current state and seal
    /// it; the state is unchanged until [`KvState::install_staged`]. A stream that does not add
    /// up is refused whole and leaves only rows to be removed.
    pub fn stage(&mut self, stream: &[u8], index: u64) -> Result<(), String> {
        let engine = self.keyspace.engine().clone();
        let mut staging =
            Staging::begin(&engine, self.keyspace.group()).map_err(|e| e.to_string())?;
        if stream.is_empty() {
            // No stream at all: an empty state (the cluster's bootstrap snapshot).
            staging
                .put_rows(&crate::state::mvcc::empty_state_rows(index))
                .map_err(|e| e.to_string())?;
            return staging.seal(index).map_err(|e| e.to_string());
        }
        let mut reader = StreamReader::default();
        let (mut rows, mut bytes): (Vec<Row>, usize) = (Vec::new(), 0);
        for piece in stream.chunks(1 << 20) {
            for r in reader
                .feed(piece)
                .map_err(|e| format!("snapshot refused: {e}"))?
            {
                bytes += r.key.len() + r.value.len();
                rows.push(r);
                if bytes >= STAGE_BATCH_BYTES {
                    staging.put_rows(&rows).map_err(|e| e.to_string())?;
                    (rows, bytes) = (Vec::new(), 0);
                }
            }
        }
        reader
            .finish()
            .map_err(|e| format!("snapshot refused: {e}"))?;
        staging.put_rows(&rows).map_err(|e| e.to_string())?;
        staging.seal(index).map_err(|e| e.to_string())
    }

    /// Make the sealed state the group's (the raft log took the snapshot), and read it.
    pub fn install_staged(&mut self) -> Result<(), String> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        if !generation::complete_install(&engine, group).map_err(|e| e.to_string())? {
            return Err("no sealed snapshot to install".into());
        }
        self.reload()?;
        self.mark_durable();
        Ok(())
    }

    /// Stage and install `stream` at once (a state whose raft log needs no snapshot of its own:
    /// tests, and the loop's own order is in `raft_io`).
    #[cfg(test)]
    pub fn install_stream(&mut self, stream: &[u8], index: u64) -> Result<(), String> {
        self.stage(stream, index)?;
        self.install_staged()
    }

    /// At start: complete or drop an install a crash left half done (the raft log took a
    /// snapshot at `log_snapshot_index`), and read the state again if it changed.
    pub fn settle(&mut self, log_snapshot_index: u64) -> Result<(), String> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        let done = generation::settle_install(&engine, group, log_snapshot_index)
            .map_err(|e| e.to_string())?;
        if done {
            self.reload()?;
            self.mark_durable();
        }
        Ok(())
    }

    /// One bounded step of upkeep: rows of replaced generations, then a compaction's sweep.
    /// Whether more is left.
    pub fn tidy_step(&mut self) -> Result<bool, EngineError> {
        let engine = self.keyspace.engine().clone();
        let fatal = |e: MvccError| EngineError::Io(e.to_string());
        let view = engine.view()?;
        if generation::dead_left(&view).map_err(fatal)? {
            generation::collect_dead(&engine, COLLECT_BUDGET).map_err(fatal)?;
            return Ok(true);
        }
        drop(view);
        let due = self.keyspace.read(|r| {
            let c = r.counters();
            Ok(c.swept < c.compacted)
        });
        if !due.map_err(fatal)? {
            return Ok(false);
        }
        let group = self.keyspace.group();
        let applied = self.applied;
        let (more, counters) = engine.write(false, |w| {
            let mut b = Batch::begin(w, group).map_err(fatal)?;
            let mut more = false;
            if b.sweep_due() {
                b.sweep(SWEEP_BUDGET).map_err(fatal)?;
                more = b.sweep_due();
            }
            Ok((more, b.finish(applied).map_err(fatal)?))
        })?;
        self.keyspace.publish(&counters);
        Ok(more)
    }
}
