//! The raft log on TiKV's raft-engine: one append-only stream of checksummed batches, each
//! written and fsynced once, with an in-memory index of where every entry lies. Entries go to
//! one raft group of the engine, the hard state, conf state, snapshot and node id to a second
//! as key-values, so that a compaction or an installed snapshot and the log cut that goes with
//! it are one atomic batch.
//!
//! On open the engine replays its files, checking every batch's checksum. The newest file ends,
//! after a crash, in the zeros the engine allocated ahead of its writes; those are dropped. Any
//! other damage is refused with [`StoreError::Corrupt`], and the files are left as found: a file
//! cut short inside a batch, a byte changed, a batch torn by a crash in the middle of its write.
//! The engine cannot tell a torn batch (never acknowledged) from a damaged one followed by
//! acknowledged ones, and dropping those could forget this node's vote; a node refused so is
//! removed and added back on a new dir, as for a damaged redb file. (A file cut exactly at a
//! batch's end cannot be told from one that ended there.) Log files are not recycled: a new
//! file holds nothing old to mistake for a batch.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft_engine::{Command, Config, Engine, LogBatch, MessageExt, ReadableSize, RecoveryMode};

use crate::disk::log_store::{Cut, DiskError, LogStore, Meta, StoreError, Write};
use crate::disk::zero_fill::ZeroFilled;

/// The engine's folder in a data dir.
pub const ENGINE_DIR: &str = "raft-engine";
/// The engine's raft group holding group 0's log; group `g`'s is `LOG + 2g`.
const LOG: u64 = 1;
/// The engine's raft group holding the rest of group 0, as key-values; group `g`'s is `META + 2g`.
const META: u64 = 2;
const HARD_STATE: &[u8] = b"hard_state";
const CONF_STATE: &[u8] = b"conf_state";
const CONF_META: &[u8] = b"conf_meta";
const SNAPSHOT: &[u8] = b"snapshot";
/// The raft id of the node the store belongs to (u64, big-endian).
const NODE_ID: &[u8] = b"node_id";
/// Rewritten by every [`LogStore::sync`]: a batch with something in it, written with `sync`,
/// is what makes raft-engine fsync (its own `Engine::sync` writes an empty batch, which 0.4.2
/// returns from before syncing anything).
const SYNCED: &[u8] = b"synced";
/// Entries read per call while scanning the log at open.
const SCAN_CHUNK: u64 = 1024;

/// How raft-engine finds an entry's index.
struct EntryExt;

impl MessageExt for EntryExt {
    type Entry = Entry;

    fn index(e: &Entry) -> u64 {
        e.index
    }
}

/// A raft-engine log of one raft group; every group of a node shares the engine. See the module
/// docs.
pub struct EngineLog {
    engine: Arc<Engine<ZeroFilled>>,
    /// The engine's raft group holding this group's log.
    log: u64,
    /// The engine's raft group holding this group's hard state, conf state, snapshot, node id.
    meta: u64,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

fn config(dir: &Path) -> Config {
    Config {
        dir: dir.join(ENGINE_DIR).to_string_lossy().into_owned(),
        enable_log_recycle: false,
        // Values are small and the CPU is the scarce part: no compression.
        batch_compression_threshold: ReadableSize(0),
        target_file_size: ReadableSize::mb(32),
        purge_threshold: ReadableSize::mb(256),
        ..Config::default()
    }
}

/// Why an open failed: damage the engine found in its files, or anything else.
enum OpenFailure {
    Damaged(String),
    Other(StoreError),
}

/// Open the engine in `dir`, mapping its failures to a [`StoreError`]: strictly, or, if the
/// strict open finds damage, dropping only zeros at the end of the newest files (see the
/// module docs).
fn open(dir: &Path) -> Result<EngineLog, StoreError> {
    match open_in(dir, RecoveryMode::AbsoluteConsistency) {
        Ok(log) => Ok(log),
        Err(OpenFailure::Damaged(why)) => open_dropping_zeros(dir, why),
        Err(OpenFailure::Other(e)) => Err(e),
    }
}

fn open_in(dir: &Path, mode: RecoveryMode) -> Result<EngineLog, OpenFailure> {
    let cfg = Config {
        recovery_mode: mode,
        ..config(dir)
    };
    // A panic while replaying damaged files must not take the process down unexplained.
    let opened = std::panic::catch_unwind(|| {
        Engine::open_with_file_system(cfg, Arc::new(ZeroFilled::new()))
    })
    .map_err(|_| OpenFailure::Other(corrupt("the log engine panicked reading it")))?;
    match opened {
        Ok(engine) => Ok(EngineLog {
            engine: Arc::new(engine),
            log: LOG,
            meta: META,
        }),
        Err(raft_engine::Error::Corruption(why)) => Err(OpenFailure::Damaged(why)),
        Err(e)
            if e.to_string()
                .contains("another instance is using this directory") =>
        {
            Err(OpenFailure::Other(StoreError::InUse))
        }
        Err(e) => Err(OpenFailure::Other(corrupt(e))),
    }
}

/// Open letting the engine cut the newest file of each queue at its first broken batch, and
/// keep that only if everything cut was zeros after an intact prefix; else put the files back
/// as they were (from copies made durable first) and refuse.
fn open_dropping_zeros(dir: &Path, why: String) -> Result<EngineLog, StoreError> {
    let files = newest_files(dir);
    let mut saved = Vec::new();
    for file in &files {
        let before = std::fs::read(file).map_err(corrupt)?;
        saved.push((file.clone(), backup(dir, file, &before)?, before));
    }
    let opened = open_in(dir, RecoveryMode::TolerateTailCorruption);
    let zeros_only = opened.is_ok()
        && saved.iter().all(|(file, _, before)| {
            std::fs::read(file).is_ok_and(|after| only_zeros_cut(before, &after))
        });
    if let (Ok(log), true) = (opened, zeros_only) {
        for (_, copy, _) in &saved {
            let _ = std::fs::remove_file(copy);
        }
        return Ok(log);
    } // else the engine is dropped here, before its files are put back
    for (file, copy, _) in &saved {
        std::fs::rename(copy, file).map_err(corrupt)?;
    }
    sync_dir(&dir.join(ENGINE_DIR))?;
    Err(StoreError::Corrupt(format!(
        "{why}; past the last intact batch of its newest files are bytes other than the zeros \
         a crash leaves (a torn or damaged batch)"
    )))
}

/// Whether `after` is `before` with only zeros cut from (or added to) its end, after an
/// intact, non-empty prefix.
fn only_zeros_cut(before: &[u8], after: &[u8]) -> bool {
    let kept = before.iter().zip(after).take_while(|(a, b)| a == b).count();
    kept > 0 && before[kept..].iter().all(|&b| b == 0) && after[kept..].iter().all(|&b| b == 0)
}

/// A durable copy of `file` (holding `bytes`) in `dir`, outside the engine's folder.
fn backup(dir: &Path, file: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
    let name = file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let copy = dir.join(ENGINE_DIR).join(format!("{name}.before-open"));
    let mut f = std::fs::File::create(&copy).map_err(corrupt)?;
    std::io::Write::write_all(&mut f, bytes).map_err(corrupt)?;
    f.sync_all().map_err(corrupt)?;
    sync_dir(&dir.join(ENGINE_DIR))?;
    Ok(copy)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(corrupt)
}

/// The newest file of each of the engine's queues in `dir` (`.raftlog`, `.rewrite`): the ones
/// a tolerant open may cut.
fn newest_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir.join(ENGINE_DIR)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
    files.sort();
    ["raftlog", "rewrite"]
        .iter()
        .filter_map(|ext| {
            let mut of_queue = files
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == *ext));
            of_queue.next_back().cloned()
        })
        .collect()
}

impl EngineLog {
    /// Create (or open) the engine in `dir/raft-engine`.
    pub fn create(dir: &Path) -> Result<Self, StoreError> {
        open(dir)
    }

    /// Open the existing engine in `dir/raft-engine`: never creates one; refuses a folder
    /// without log files (missing), or one the engine cannot read.
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(ENGINE_DIR);
        let files = match std::fs::read_dir(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::Missing),
            Err(e) => return Err(corrupt(e)),
            Ok(rd) => rd.filter_map(Result::ok).map(|e| e.path()),
        };
        if !files.into_iter().any(|p| is_log_file(&p)) {
            return Err(StoreError::Missing); // no log file in the engine's folder
        }
        let log = open(dir)?;
        if log.engine.get(log.meta, NODE_ID).is_none() {
            return Err(StoreError::Uninitialized);
        }
        Ok(log)
    }

    fn get<M: protobuf::Message>(&self, key: &[u8]) -> Result<Option<M>, DiskError> {
        Ok(self.engine.get_message::<M>(self.meta, key)?)
    }
}

/// Whether `p` is one of the engine's log files (`*.raftlog`).
fn is_log_file(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "raftlog")
}

impl LogStore for EngineLog {
    fn meta(&self) -> Result<Meta, DiskError> {
        let node_id = self.engine.get(self.meta, NODE_ID).map(|b| {
            let bytes: [u8; 8] = b.try_into().map_err(|_| "node id: not 8 bytes")?;
            Ok::<_, DiskError>(u64::from_be_bytes(bytes))
        });
        Ok(Meta {
            hard_state: self.get::<HardState>(HARD_STATE)?.unwrap_or_default(),
            conf_state: self.get::<ConfState>(CONF_STATE)?,
            conf_meta: self.engine.get(self.meta, CONF_META).unwrap_or_default(),
            snapshot: self.get::<Snapshot>(SNAPSHOT)?.unwrap_or_default(),
            node_id: node_id.transpose()?,
        })
    }

    fn scan(&self, sink: &mut dyn FnMut(Entry)) -> Result<(), DiskError> {
        let (Some(first), Some(last)) = (
            self.engine.first_index(self.log),
            self.engine.last_index(self.log),
        ) else {
            return Ok(());
        };
        let mut low = first;
        while low <= last {
            let high = (low + SCAN_CHUNK).min(last + 1);
            for (want, e) in (low..).zip(self.read_range(low, high, None)?) {
                if e.index != want {
                    return Err(format!("log: expected entry {want}, found {}", e.index).into());
                }
                sink(e);
            }
            low = high;
        }
        Ok(())
    }

    fn write(&self, w: &Write<'_>) -> Result<(), DiskError> {
        let mut batch = LogBatch::default();
        match w.cut {
            Cut::None => {}
            Cut::Before(index) => batch.add_command(self.log, Command::Compact { index }),
            Cut::All => batch.add_command(self.log, Command::Clean),
        }
        // The engine replaces an overlapped suffix itself.
        if !w.entries.is_empty() {
            batch.add_entries::<EntryExt>(self.log, w.entries)?;
        }
        if let Some(hs) = w.hard_state {
            batch.put_message(self.meta, HARD_STATE.to_vec(), hs)?;
        }
        if let Some(cs) = w.conf_state {
            batch.put_message(self.meta, CONF_STATE.to_vec(), cs)?;
        }
        if let Some(m) = w.conf_meta {
            batch.put(self.meta, CONF_META.to_vec(), m.to_vec())?;
        }
        if let Some(s) = w.snapshot {
            batch.put(self.meta, SNAPSHOT.to_vec(), s.write_to_bytes()?)?;
        }
        if let Some(id) = w.node_id {
            batch.put(self.meta, NODE_ID.to_vec(), id.to_be_bytes().to_vec())?;
        }
        // The engine panics when an fsync fails: the node must stop, with an error.
        let engine = &self.engine;
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.write(&mut batch, w.sync)
        }));
        written.map_err(|_| "the log engine panicked writing (a failed fsync?)")??;
        Ok(())
    }

    /// The engine limits by each entry's stored length, its protobuf encoding as raft counts it
    /// (no compression); raft's own rule is applied after, so the answer is raft's exactly.
    fn read_range(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> Result<Vec<Entry>, DiskError> {
        let mut entries = Vec::new();
        if high > low {
            let max = max_size.map(|m| usize::try_from(m).unwrap_or(usize::MAX));
            self.engine
                .fetch_entries_to::<EntryExt>(self.log, low, high, max, &mut entries)?;
        }
        raft::util::limit_size(&mut entries, max_size);
        Ok(entries)
    }

    fn purge(&self) -> Result<(), DiskError> {
        // The engine panics when an fsync of a rewrite fails: the node must stop, with an error.
        let engine = &self.engine;
        let purged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.purge_expired_files()
        }));
        purged.map_err(|_| "the log engine panicked purging (a failed fsync?)")??;
        Ok(())
    }

    fn sync(&self) -> Result<(), DiskError> {
        let mut batch = LogBatch::default();
        batch.put(self.meta, SYNCED.to_vec(), Vec::new())?;
        // The engine panics when an fsync fails: the node must stop, with an error.
        let engine = &self.engine;
        let synced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.write(&mut batch, true)
        }));
        let written = synced.map_err(|_| "the log engine panicked syncing (a failed fsync?)")??;
        assert!(written > 0, "a sync wrote nothing, so it synced nothing");
        Ok(())
    }

    fn group(&self, group: u64) -> Result<Arc<dyn LogStore>, DiskError> {
        let offset = group
            .checked_mul(2)
            .filter(|o| *o < u64::MAX - META)
            .ok_or("group id out of range")?;
        Ok(Arc::new(EngineLog {
            engine: self.engine.clone(),
            log: LOG + offset,
            meta: META + offset,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        let data = vec![7u8; 150];
        range
            .map(|index| Entry {
                index,
                term: 1,
                data: data.clone().into(),
                ..Default::default()
            })
            .collect()
    }

    /// A store with entries 1..=300 written in batches of ten, and its one log file.
    fn written() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let log = EngineLog::create(dir.path()).unwrap();
        let cs = ConfState {
            voters: vec![1],
            ..Default::default()
        };
        log.write(&Write {
            conf_state: Some(&cs),
            node_id: Some(1),
            ..Write::nothing()
        })
        .unwrap();
        for low in (1..=300).step_by(10) {
            let batch = entries(low..=low + 9);
            log.write(&Write {
                entries: &batch,
                ..Write::nothing()
            })
            .unwrap();
        }
        drop(log);
        let files: Vec<PathBuf> = std::fs::read_dir(dir.path().join(ENGINE_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| is_log_file(p))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let file = files[0].clone();
        (dir, file)
    }

    fn reopened(dir: &Path) -> Result<u64, StoreError> {
        let log = EngineLog::open_existing(dir)?;
        let mut last = 0;
        log.scan(&mut |e| last = e.index).map_err(corrupt)?;
        Ok(last)
    }

    #[test]
    fn an_intact_store_reopens_with_every_entry() {
        let (dir, _) = written();
        assert_eq!(reopened(dir.path()).unwrap(), 300);
    }

    #[test]
    fn a_file_cut_short_is_refused_not_truncated_further() {
        let (dir, file) = written();
        let len = std::fs::metadata(&file).unwrap().len();
        for cut in [len - 100, len / 2] {
            let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
            f.set_len(cut).unwrap();
            drop(f);
            match reopened(dir.path()) {
                Err(StoreError::Corrupt(why)) => assert!(why.contains("torn or damaged"), "{why}"),
                other => panic!("a file cut to {cut} of {len} bytes opened: {other:?}"),
            }
            assert_eq!(
                std::fs::metadata(&file).unwrap().len(),
                cut,
                "left as found"
            );
        }
    }

    #[test]
    fn the_zeros_a_crash_leaves_at_the_end_are_dropped() {
        let (dir, file) = written();
        let mut bytes = std::fs::read(&file).unwrap();
        bytes.extend(std::iter::repeat_n(0u8, 1 << 20));
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(reopened(dir.path()).unwrap(), 300);
    }

    /// What a crash leaves of a store on `ZeroFilled`: its files as they are while it runs,
    /// the active one ending in the written zeros filled ahead. It reopens whole.
    #[test]
    fn a_crash_image_of_a_running_store_reopens_with_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let log = EngineLog::create(dir.path()).unwrap();
        let cs = ConfState {
            voters: vec![1],
            ..Default::default()
        };
        let meta = Write {
            conf_state: Some(&cs),
            node_id: Some(1),
            ..Write::nothing()
        };
        log.write(&meta).unwrap();
        let batch = entries(1..=50);
        log.write(&Write {
            entries: &batch,
            sync: true,
            ..Write::nothing()
        })
        .unwrap();
        let image = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join(ENGINE_DIR), image.path().join(ENGINE_DIR));
        std::fs::create_dir_all(&to).unwrap();
        let mut zeros_ahead = 0;
        for f in std::fs::read_dir(&from).unwrap().map(|e| e.unwrap().path()) {
            let bytes = std::fs::read(&f).unwrap();
            if is_log_file(&f) {
                zeros_ahead = bytes.iter().rev().take_while(|&&b| b == 0).count();
            }
            std::fs::write(to.join(f.file_name().unwrap()), bytes).unwrap();
        }
        assert!(
            zeros_ahead > 1 << 20,
            "the space ahead is filled: {zeros_ahead} zeros"
        );
        drop(log);
        assert_eq!(reopened(image.path()).unwrap(), 50);
    }

    #[test]
    fn a_changed_byte_is_refused() {
        let (dir, file) = written();
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        bytes.extend(std::iter::repeat_n(0u8, 4096)); // as after a crash
        std::fs::write(&file, &bytes).unwrap();
        match reopened(dir.path()) {
            Err(StoreError::Corrupt(_)) => {}
            other => panic!("a changed byte went unnoticed: {other:?}"),
        }
        assert_eq!(std::fs::read(&file).unwrap(), bytes, "left as found");
    }

    #[test]
    fn a_store_in_use_is_refused_as_in_use() {
        let (dir, _) = written();
        let open = EngineLog::open_existing(dir.path()).unwrap();
        assert!(matches!(
            EngineLog::open_existing(dir.path()).map(|_| ()),
            Err(StoreError::InUse)
        ));
        drop(open);
    }

    #[test]
    fn a_missing_or_empty_engine_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            EngineLog::open_existing(dir.path()).map(|_| ()),
            Err(StoreError::Missing)
        ));
        std::fs::create_dir(dir.path().join(ENGINE_DIR)).unwrap();
        assert!(matches!(
            EngineLog::open_existing(dir.path()).map(|_| ()),
            Err(StoreError::Missing)
        ));
    }

    /// raft-engine 0.4.2's `Engine::sync` writes an empty batch and returns before syncing: a
    /// round's sync must write a batch of its own, with `sync`, after the unsynced ones.
    #[test]
    fn a_rounds_sync_writes_a_synced_batch_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let log = EngineLog::create(dir.path()).unwrap();
        let g = log.group(3).unwrap();
        let unsynced = Write {
            entries: &entries(1..=3),
            sync: false,
            ..Write::nothing()
        };
        g.write(&unsynced).unwrap();
        assert!(log.engine.get(META, SYNCED).is_none());
        log.sync().unwrap();
        assert!(
            log.engine.get(META, SYNCED).is_some(),
            "the sync wrote nothing"
        );
        let empty = log.engine.write(&mut LogBatch::default(), true).unwrap();
        assert_eq!(
            empty, 0,
            "raft-engine writes (and syncs) nothing for an empty batch"
        );
        assert_eq!(g.read_range(1, 4, None).unwrap(), entries(1..=3));
    }
}
