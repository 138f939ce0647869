//! The data dir's promise record, `kv-promise.json`: the longest lease promise `P` (in ms) that
//! any run of a node on this dir may still be bound by.
//!
//! A follower's promise not to vote (`P`, which equals `--election-ms`) outlives the process that
//! made it: a leader counts on it until it runs out. A node restarted with a shorter `P` (the
//! middle of a rolling change of `--election-ms`) must keep the longer promise its previous run
//! made, so it boots refusing votes for the recorded value (`prior_promise_ms` of the lease
//! config). The rules:
//!
//! - At boot, before the node can make any promise, the record is raised to this run's `P` if
//!   that is longer, written durably (a temporary file, fsynced, renamed, the dir fsynced).
//! - Once this run has been up longer than the record it found (on the lease clock, from a reading
//!   taken before the node existed), every promise of earlier runs has ended, and the record is
//!   lowered to this run's `P`.
//! - A fresh dir has made no promise: its record starts at this run's `P`.
//! - An initialized dir (it has a marker) without a record comes from a build before the record
//!   (or crashed between writing the marker and the record, before any promise): what it promised
//!   is unknown. The node boots with this run's `P`, which is what nodes did before the record,
//!   logs a warning, and writes the record. Safe if the previous run's `--election-ms` was not
//!   longer; otherwise wait that long before restarting.
//! - A record that cannot be read or parsed refuses the start, like a bad marker (exit 3).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use raft_lease::Clock;
use serde::{Deserialize, Serialize};
use slog::{info, warn, Logger};

use crate::base::clock::ScaledClock;
use crate::disk::marker::{io, write_durably, DirError};

/// The record's file name in a data dir.
pub const PROMISE_FILE: &str = "kv-promise.json";
/// The record's format.
const FORMAT: u32 = 1;
/// The longest promise a record may hold: the longest `--election-ms` accepted.
const MAX_RECORD_MS: u64 = crate::base::options::MAX_ELECTION_MS;
/// How often the lowering thread looks at the clock and the stop flag.
const LOWER_POLL: Duration = Duration::from_millis(100);

/// What the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format: u32,
    max_promise_ms: u64,
}

/// What a data dir said about earlier promises when the node booted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A fresh dir: no earlier run, no earlier promise.
    Fresh,
    /// An initialized dir without a record: what earlier runs promised is unknown.
    Unknown,
    /// The record: the longest promise (ms) an earlier run may still be bound by.
    Recorded(u64),
}

impl Found {
    /// What to pass as `prior_promise_ms` (0: nothing known).
    pub fn prior_ms(self) -> u64 {
        match self {
            Found::Recorded(ms) => ms,
            Found::Fresh | Found::Unknown => 0,
        }
    }
}

/// This run's promise and the dir's record, shared with the HTTP side (`/status`).
#[derive(Debug)]
pub struct PromiseRecord {
    dir: PathBuf,
    /// This run's `P`, in ms.
    pub promise_ms: u64,
    /// What the dir said at boot.
    pub found: Found,
    /// The value on disk now.
    recorded_ms: AtomicU64,
    /// The lease clock when the record was read, before the node could make any promise.
    started_ns: u64,
}

/// Parse a record's text: `None` with the reason if it is not one this build wrote.
fn parse(text: &str) -> Result<u64, String> {
    let r: Record = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if r.format != FORMAT {
        return Err(format!("format {} (this build knows {FORMAT})", r.format));
    }
    if r.max_promise_ms == 0 || r.max_promise_ms > MAX_RECORD_MS {
        return Err(format!(
            "max_promise_ms {} is outside 1..={MAX_RECORD_MS}",
            r.max_promise_ms
        ));
    }
    Ok(r.max_promise_ms)
}

/// The record in `dir`, `None` if there is none; a record that is not valid is an error.
pub fn read(dir: &Path) -> Result<Option<u64>, DirError> {
    let path = dir.join(PROMISE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(bad(&path, e.to_string()))
        }
        Err(e) => return Err(io(&path, e)),
    };
    parse(&text).map(Some).map_err(|why| bad(&path, why))
}

fn bad(path: &Path, why: String) -> DirError {
    DirError::BadPromiseRecord {
        path: path.display().to_string(),
        why,
    }
}

/// Write `max_promise_ms` durably: a temporary file, fsynced, renamed into place, the dir fsynced.
pub fn write(dir: &Path, max_promise_ms: u64) -> Result<(), DirError> {
    let record = Record {
        format: FORMAT,
        max_promise_ms,
    };
    let text = serde_json::to_string_pretty(&record).expect("a record serializes");
    write_durably(dir, PROMISE_FILE, &text)
}

/// What the dir says about earlier promises. `initialized`: the dir had a marker before this
/// start (see [`crate::disk::marker::Opened`]).
fn find(dir: &Path, initialized: bool) -> Result<Found, DirError> {
    Ok(match (read(dir)?, initialized) {
        (Some(ms), _) => Found::Recorded(ms),
        (None, false) => Found::Fresh,
        (None, true) => Found::Unknown,
    })
}

impl PromiseRecord {
    /// Read the record of `dir` for a run with promise `promise_ms`, and raise it to
    /// `promise_ms` durably if that is longer (or there was none). Call before the node exists:
    /// no promise of this run may precede the write.
    pub fn open(
        dir: &Path,
        promise_ms: u64,
        initialized: bool,
        clock: &ScaledClock,
        log: &Logger,
    ) -> Result<PromiseRecord, DirError> {
        let started_ns = clock.now_ns();
        let found = find(dir, initialized)?;
        let recorded_ms = found.prior_ms().max(promise_ms);
        if found != Found::Recorded(recorded_ms) {
            write(dir, recorded_ms)?;
        }
        let record = PromiseRecord {
            dir: dir.to_path_buf(),
            promise_ms,
            found,
            recorded_ms: AtomicU64::new(recorded_ms),
            started_ns,
        };
        record.log_boot(log);
        Ok(record)
    }

    fn log_boot(&self, log: &Logger) {
        let (p, prior) = (self.promise_ms, self.found.prior_ms());
        if self.found == Found::Unknown {
            warn!(log, "the data dir has no {PROMISE_FILE} (made by an older build?): what its previous run \
                        promised is unknown; booting with this run's promise. Safe unless the previous \
                        --election-ms was longer than this one"; "promise_ms" => p);
        }
        info!(log, "lease promise"; "promise_ms" => p, "prior_promise_ms" => prior,
              "recorded_promise_ms" => self.recorded_ms());
    }

    /// The value on disk now.
    pub fn recorded_ms(&self) -> u64 {
        self.recorded_ms.load(Ordering::Relaxed)
    }

    /// How long this run has been up on the lease clock, from before the node existed.
    pub fn uptime_ms(&self, clock: &ScaledClock) -> u64 {
        clock.now_ns().saturating_sub(self.started_ns) / 1_000_000
    }

    /// Whether the record may be lowered to this run's `P` at lease-clock instant `now_ns`:
    /// this run has been up longer than the record it found, so every earlier promise has ended.
    fn lowering_due(&self, now_ns: u64) -> bool {
        let old_ns = self.found.prior_ms().saturating_mul(1_000_000);
        self.found.prior_ms() > self.promise_ms && now_ns.saturating_sub(self.started_ns) > old_ns
    }

    /// Lower the record to this run's `P` once every earlier run's promise has ended, on a
    /// thread of its own; nothing to do unless an earlier run recorded a longer promise. A
    /// failed write keeps the longer record (safe: a later boot just waits longer).
    pub fn lower_when_due(
        self: &Arc<Self>,
        clock: Arc<ScaledClock>,
        stop: Arc<AtomicBool>,
        log: Logger,
    ) {
        if self.found.prior_ms() <= self.promise_ms {
            return;
        }
        let (record, thread_log) = (self.clone(), log.clone());
        let spawned = std::thread::Builder::new()
            .name("kv-promise".into())
            .spawn(move || record.lower_loop(&clock, &stop, &thread_log));
        if let Err(e) = spawned {
            warn!(log, "could not start the thread that lowers the lease promise record; it keeps \
                        the longer value"; "error" => %e);
        }
    }

    fn lower_loop(&self, clock: &ScaledClock, stop: &AtomicBool, log: &Logger) {
        while !self.lowering_due(clock.now_ns()) {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(LOWER_POLL); // waits for the clock; nothing else to wait on
        }
        match self.lower() {
            Ok(()) => info!(log, "every earlier promise has ended: lease promise record lowered";
                            "recorded_promise_ms" => self.promise_ms),
            Err(e) => {
                warn!(log, "could not lower the lease promise record; it keeps the longer value"; "error" => %e)
            }
        }
    }

    /// Write this run's `P` as the record. Only once [`Self::lowering_due`].
    fn lower(&self) -> Result<(), DirError> {
        write(&self.dir, self.promise_ms)?;
        self.recorded_ms.store(self.promise_ms, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    fn open(dir: &Path, promise_ms: u64, initialized: bool) -> Result<PromiseRecord, DirError> {
        PromiseRecord::open(dir, promise_ms, initialized, &ScaledClock::new(), &log())
    }

    #[test]
    fn a_fresh_dir_records_its_promise_and_a_longer_one_raises_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let first = open(dir.path(), 300, false).unwrap();
        assert_eq!((first.found, first.recorded_ms()), (Found::Fresh, 300));
        assert_eq!(read(dir.path()).unwrap(), Some(300));
        let longer = open(dir.path(), 2_000, true).unwrap();
        assert_eq!(longer.found, Found::Recorded(300));
        assert_eq!(
            read(dir.path()).unwrap(),
            Some(2_000),
            "raised before the node exists"
        );
        let shorter = open(dir.path(), 300, true).unwrap();
        assert_eq!(shorter.found, Found::Recorded(2_000));
        assert_eq!(
            shorter.found.prior_ms(),
            2_000,
            "boots with the longer promise"
        );
        assert_eq!(
            read(dir.path()).unwrap(),
            Some(2_000),
            "kept until it has ended"
        );
        assert!(!dir.path().join(format!("{PROMISE_FILE}.tmp")).exists());
    }

    #[test]
    fn the_record_is_lowered_only_once_the_run_outlived_the_old_promise() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 2_000).unwrap();
        let r = open(dir.path(), 300, true).unwrap();
        let t0 = r.started_ns;
        assert!(!r.lowering_due(t0));
        assert!(
            !r.lowering_due(t0 + 2_000_000_000),
            "not before the old promise is over"
        );
        assert!(r.lowering_due(t0 + 2_000_000_001));
        r.lower().unwrap();
        assert_eq!(
            (r.recorded_ms(), read(dir.path()).unwrap()),
            (300, Some(300))
        );
        // Nothing to lower when the record was not longer than this run's promise.
        let same = open(dir.path(), 300, true).unwrap();
        assert!(!same.lowering_due(u64::MAX));
        let fresh = open(tempfile::tempdir().unwrap().path(), 300, false).unwrap();
        assert!(!fresh.lowering_due(u64::MAX));
    }

    #[test]
    fn an_initialized_dir_without_a_record_boots_with_its_own_promise_and_writes_one() {
        let dir = tempfile::tempdir().unwrap();
        let r = open(dir.path(), 500, true).unwrap();
        assert_eq!((r.found, r.found.prior_ms()), (Found::Unknown, 0));
        assert_eq!(read(dir.path()).unwrap(), Some(500));
    }

    #[test]
    fn a_corrupt_record_is_refused_not_guessed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PROMISE_FILE);
        let bad: [&[u8]; 7] = [
            b"",
            b"{",
            b"{\"format\": 1}",
            b"{\"format\": 2, \"max_promise_ms\": 300}",
            b"{\"format\": 1, \"max_promise_ms\": 0}",
            b"{\"format\": 1, \"max_promise_ms\": 300, \"extra\": 1}",
            b"\xff\xfe not utf-8",
        ];
        for bytes in bad {
            std::fs::write(&path, bytes).unwrap();
            let e = open(dir.path(), 300, true).unwrap_err();
            assert!(
                matches!(e, DirError::BadPromiseRecord { .. }),
                "{bytes:?}: {e}"
            );
            assert!(e.to_string().contains("refusing to start"), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as it was");
        }
        std::fs::write(
            &path,
            format!(
                "{{\"format\": 1, \"max_promise_ms\": {}}}",
                MAX_RECORD_MS + 1
            ),
        )
        .unwrap();
        assert!(read(dir.path()).is_err());
    }
}
