//! What a raft log engine must do for the node's raft storage (`DiskStorage`): hold the log, the hard
//! state, the conf state, the latest snapshot and the node's id, and write any mix of them in
//! one atomic, fsynced batch.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use thiserror::Error;

pub use crate::base::log_engine::LogEngine;

/// Any failure of a log engine. The node treats it as fatal: raft cannot continue safely.
pub type DiskError = Box<dyn std::error::Error + Send + Sync>;

/// Why an existing store could not be opened as this node's.
#[derive(Debug, Error)]
pub enum StoreError {
    /// No store file.
    #[error("missing")]
    Missing,
    /// A store file of 0 bytes.
    #[error("empty (0 bytes)")]
    Empty,
    /// A store without a configuration or node id.
    #[error("not initialized (it holds no configuration)")]
    Uninitialized,
    /// Another node's store.
    #[error("node {0}'s")]
    OtherNode(u64),
    /// A store that cannot be read.
    #[error("corrupt or unreadable ({0})")]
    Corrupt(String),
    /// Another process has the store open (a node already running on this dir).
    #[error("in use by another process")]
    InUse,
}

/// What to drop of the log in a [`Write`], before its entries are appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing.
    None,
    /// Every entry before this index (a compaction).
    Before(u64),
    /// Every entry (a snapshot installed in place of the log).
    All,
}

/// One atomic, fsynced batch. Entries replace any suffix of the log they overlap.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// Drop these first.
    pub cut: Cut,
    /// Append these (consecutive indexes).
    pub entries: &'a [Entry],
    /// Whether `entries` start at or before the log's last index (a conflicting suffix).
    pub overwrites: bool,
    /// The new hard state.
    pub hard_state: Option<&'a HardState>,
    /// The new conf state.
    pub conf_state: Option<&'a ConfState>,
    /// What the application keeps with the conf state (written with it, atomically).
    pub conf_meta: Option<&'a [u8]>,
    /// The new latest snapshot.
    pub snapshot: Option<&'a Snapshot>,
    /// The node id, written once at creation.
    pub node_id: Option<u64>,
    /// Whether the batch is fsynced before `write` returns; `false` leaves it to the next
    /// [`LogStore::sync`] (or the next synced batch). Engines that cannot defer sync every batch.
    pub sync: bool,
}

impl Write<'_> {
    /// A batch that changes nothing yet.
    pub fn nothing() -> Self {
        Write {
            cut: Cut::None,
            entries: &[],
            overwrites: false,
            hard_state: None,
            conf_state: None,
            conf_meta: None,
            snapshot: None,
            node_id: None,
            sync: true,
        }
    }
}

/// Everything but the log, as stored.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// The hard state (default if never written).
    pub hard_state: HardState,
    /// The conf state, if the store was initialized.
    pub conf_state: Option<ConfState>,
    /// What the application kept with the conf state (empty if nothing).
    pub conf_meta: Vec<u8>,
    /// The latest snapshot (default if none).
    pub snapshot: Snapshot,
    /// The node id, if written.
    pub node_id: Option<u64>,
}

/// A raft log engine. See the module docs.
pub trait LogStore: Send + Sync {
    /// Read everything but the log.
    fn meta(&self) -> Result<Meta, DiskError>;
    /// Hand every entry of the log to `sink`, in index order. An engine that finds a gap or a
    /// misplaced entry fails rather than hand it on.
    fn scan(&self, sink: &mut dyn FnMut(Entry)) -> Result<(), DiskError>;
    /// Write one batch, atomically, and fsync it before returning.
    fn write(&self, w: &Write<'_>) -> Result<(), DiskError>;
    /// Entries `[low, high)`; fewer if the log does not hold them all. With `max_size`, as raft
    /// limits them: entries while their total encoded size stays within it, and at least one.
    fn read_range(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> Result<Vec<Entry>, DiskError>;
    /// Drop files no longer needed after a compaction (engines that keep old files).
    fn purge(&self) -> Result<(), DiskError> {
        Ok(())
    }
    /// Make every batch written so far durable (one fsync for every group of the engine).
    fn sync(&self) -> Result<(), DiskError> {
        Ok(())
    }
    /// Raft group `group`'s store on the same engine (this one is group 0's). An engine that
    /// holds one group refuses any other.
    fn group(&self, group: u64) -> Result<std::sync::Arc<dyn LogStore>, DiskError>;
}
