//! The data dir's marker, `kv-node.json`: which cluster and which node the dir belongs to.
//!
//! A dir with a marker is initialized: its raft store must be there, non-empty, readable and the
//! same node's, or the node refuses to start. Starting empty would forget the term and the vote,
//! and a node that forgets its vote can vote twice in one term. The marker is written (atomically)
//! only after the store was created, so a crash in between leaves a pristine store and no marker,
//! which is initialized again on the next start.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::disk::state_engine::{EngineError, StateEngine, STATE_CACHE_BYTES, STATE_FILE};
use crate::disk::storage::{DiskStorage, LogEngine, StoreError};

/// The marker's file name in a data dir.
pub const MARKER_FILE: &str = "kv-node.json";
/// Format 3: the state machine's data lives in its own engine, `state.redb`, beside the raft
/// log (format 2 kept it in the raft log's snapshots); the raft log starts after a bootstrap
/// snapshot at index 1 (so that nodes that join later always start from a snapshot), and
/// membership carries addresses.
const FORMAT: u32 = 3;

/// What the marker records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    /// The dir's format.
    pub format: u32,
    /// The cluster's id.
    pub cluster_id: String,
    /// The node's raft id.
    pub node_id: u64,
    /// The engine its raft log is on (`redb` in dirs made before there was a choice).
    #[serde(default = "redb_name")]
    pub log_engine: String,
    /// The raft groups the node hosts (1 in dirs made before there was a choice). Keys are
    /// placed by it, so it never changes.
    #[serde(default = "one")]
    pub groups: u32,
}

fn redb_name() -> String {
    LogEngine::Redb.name().to_string()
}

fn one() -> u32 {
    1
}

/// Why a data dir was refused. The node exits with code 3.
#[derive(Debug, Error)]
pub enum DirError {
    /// Another node's dir.
    #[error(
        "{dir}: this data dir belongs to node {found}, not node {expected}; refusing to start"
    )]
    OtherNode {
        /// The dir.
        dir: String,
        /// The node it belongs to.
        found: u64,
        /// This node.
        expected: u64,
    },
    /// Another cluster's dir.
    #[error(
        "{dir}: this data dir belongs to cluster {found:?}, not {expected:?}; refusing to start"
    )]
    OtherCluster {
        /// The dir.
        dir: String,
        /// The cluster it belongs to.
        found: String,
        /// This node's cluster.
        expected: String,
    },
    #[error(
        "{dir}: initialized (it has {MARKER_FILE}) but its raft store is {what}; refusing to start \
         empty, which would forget this node's term and vote. Restore the dir from a backup, or \
         remove the node from the cluster and start it on a new, empty dir"
    )]
    /// A marked dir whose store is missing, empty, corrupt or another node's.
    Store {
        /// The dir.
        dir: String,
        /// What is wrong with the store.
        what: String,
    },
    #[error(
        "{dir}: holds raft state but no {MARKER_FILE} (another version, or tampered with); \
         refusing to start"
    )]
    /// Raft state without a marker.
    NoMarker {
        /// The dir.
        dir: String,
    },
    #[error(
        "{dir}: its raft store is {what} (and the dir has no {MARKER_FILE}); refusing to start"
    )]
    /// An unmarked dir whose store cannot be used.
    Unusable {
        /// The dir.
        dir: String,
        /// What is wrong with the store.
        what: String,
    },
    #[error(
        "{dir}: its raft log is on {found}, not {asked}; refusing to start. Start it without \
         --log-engine (or with --log-engine {found}); to move a node to another engine, remove \
         it from the cluster and add it back on a new, empty dir"
    )]
    /// `--log-engine` names another engine than the dir's.
    OtherEngine {
        /// The dir.
        dir: String,
        /// The dir's engine.
        found: String,
        /// The engine asked for.
        asked: LogEngine,
    },
    /// `--groups` names another number than the dir's.
    #[error(
        "{dir}: this data dir holds {found} raft groups, not {asked}: keys are placed by the \
         number of groups, so it is fixed when the cluster is made; start with --groups {found}"
    )]
    OtherGroups {
        /// The dir.
        dir: String,
        /// The dir's number of groups.
        found: u32,
        /// The number asked for.
        asked: u32,
    },
    #[error("{path}: unreadable marker: {why}")]
    /// A marker that cannot be read.
    BadMarker {
        /// The marker's path.
        path: String,
        /// Why.
        why: String,
    },
    #[error(
        "{path}: unreadable lease promise record: {why}; refusing to start, since this node \
         could break a promise its previous run made. If the dir is otherwise intact, write \
         {{\"format\": 1, \"max_promise_ms\": N}} with N the longest --election-ms it ever \
         ran with"
    )]
    /// A lease promise record (`kv-promise.json`) that cannot be read.
    BadPromiseRecord {
        /// The record's path.
        path: String,
        /// Why.
        why: String,
    },
    #[error(
        "{dir}: another process is using this data dir (a node already running on it?); refusing \
         to start. Stop that process first; the dir itself is fine"
    )]
    /// Another process has the dir's store open.
    InUse {
        /// The dir.
        dir: String,
    },
    /// The dir could not be read or written.
    #[error("{0}")]
    Io(String),
}

/// An I/O failure on `path`.
pub(crate) fn io(path: &Path, e: impl std::fmt::Display) -> DirError {
    DirError::Io(format!("{}: {e}", path.display()))
}

/// Write `text` to `dir/name` durably: a temporary file, fsynced, renamed into place, and the dir
/// fsynced, so that a crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_durably(dir: &Path, name: &str, text: &str) -> Result<(), DirError> {
    let tmp: PathBuf = dir.join(format!("{name}.tmp"));
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|_| f.sync_all()))
        .map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| io(dir, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, e))
}

/// Refuse a dir that holds another number of groups than `groups`, before anything is opened
/// (a dir with no marker, or none at all, is new: it takes any number).
pub fn check_groups(dir: &Path, groups: u32) -> Result<(), DirError> {
    match read_marker(dir)? {
        Some(m) if m.groups != groups => Err(DirError::OtherGroups {
            dir: dir.display().to_string(),
            found: m.groups,
            asked: groups,
        }),
        _ => Ok(()),
    }
}

fn read_marker(dir: &Path) -> Result<Option<Marker>, DirError> {
    let path = dir.join(MARKER_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, e)),
    };
    let bad = |why: String| DirError::BadMarker {
        path: path.display().to_string(),
        why,
    };
    let m: Marker = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if m.format == 2 {
        return Err(bad(
            "format 2, made by an earlier build that kept the state in the raft log's snapshots; \
             this build keeps it in a state engine of its own (format 3). Run the earlier build \
             on this dir, or remove the node from the cluster and add it back on a new dir"
                .into(),
        ));
    }
    if m.format != FORMAT {
        return Err(bad(format!(
            "format {} (this build knows {FORMAT})",
            m.format
        )));
    }
    Ok(Some(m))
}

/// Write the marker durably.
fn write_marker(dir: &Path, m: &Marker) -> Result<(), DirError> {
    let text = serde_json::to_string_pretty(m).expect("a marker serializes");
    write_durably(dir, MARKER_FILE, &text)
}

/// An opened data dir.
pub struct Opened {
    /// Its raft stores, group `g` at `g`, all on one engine.
    pub storages: Vec<DiskStorage>,
    /// The state engine of every group's state machine.
    pub state: StateEngine,
    /// Whether it was initialized (had a marker) before this start: an earlier run may have
    /// used it.
    pub initialized: bool,
}

/// Open the raft stores of `groups` groups in `dir` for node `node_id` of `cluster_id`,
/// initializing a fresh dir from `bootstrap` (see `DiskStorage::create`; every group starts from
/// it) on `engine` (the default if `None`), and refusing a dir that is not this node's, whose
/// store is not intact, that another process uses, whose log is on another engine than the one
/// asked for, or that holds another number of groups.
pub fn open_data_dir(
    dir: &Path,
    cluster_id: &str,
    node_id: u64,
    bootstrap: Option<&raft::eraftpb::Snapshot>,
    engine: Option<LogEngine>,
    groups: u32,
) -> Result<Opened, DirError> {
    assert!(groups >= 1, "a node hosts at least one group");
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let d = dir.display().to_string();
    let Some(m) = read_marker(dir)? else {
        let unusable = |e: StoreError| match e {
            StoreError::InUse => DirError::InUse { dir: d.clone() },
            e => DirError::Unusable {
                dir: d.clone(),
                what: e.to_string(),
            },
        };
        // A store already here (a crash before the marker, or a lost marker) is opened on its
        // own engine, so that its state is seen, never shadowed by a new store beside it.
        let engine = match (engine_on_disk(dir), engine) {
            (Some(found), Some(asked)) if found != asked => {
                return Err(DirError::OtherEngine {
                    dir: d,
                    found: found.name().to_string(),
                    asked,
                })
            }
            (found, asked) => found.or(asked).unwrap_or_default(),
        };
        let store = DiskStorage::create(dir, bootstrap, node_id, engine).map_err(unusable)?;
        let storages = (0..u64::from(groups))
            .map(|g| store.group(g, bootstrap))
            .collect::<Result<Vec<_>, _>>()
            .map_err(unusable)?;
        for s in &storages {
            if !s.is_pristine().map_err(unusable)? {
                return Err(DirError::NoMarker { dir: d });
            }
        }
        let state = open_state(dir, &d, false)?;
        write_marker(
            dir,
            &Marker {
                format: FORMAT,
                cluster_id: cluster_id.to_string(),
                node_id,
                log_engine: engine.name().to_string(),
                groups,
            },
        )?;
        return Ok(Opened {
            storages,
            state,
            initialized: false,
        });
    };
    if m.node_id != node_id {
        return Err(DirError::OtherNode {
            dir: d,
            found: m.node_id,
            expected: node_id,
        });
    }
    if m.cluster_id != cluster_id {
        return Err(DirError::OtherCluster {
            dir: d,
            found: m.cluster_id,
            expected: cluster_id.to_string(),
        });
    }
    let found: LogEngine = m.log_engine.parse().map_err(|why| DirError::BadMarker {
        path: dir.join(MARKER_FILE).display().to_string(),
        why,
    })?;
    if let Some(asked) = engine.filter(|&e| e != found) {
        return Err(DirError::OtherEngine {
            dir: d,
            found: m.log_engine,
            asked,
        });
    }
    if m.groups != groups {
        return Err(DirError::OtherGroups {
            dir: d,
            found: m.groups,
            asked: groups,
        });
    }
    let storage = DiskStorage::open_existing(dir, node_id, found).map_err(|e| store_err(&d, e))?;
    let storages = (0..u64::from(groups))
        .map(|g| storage.group_existing(g))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| store_err(&d, e))?;
    let state = open_state(dir, &d, true)?;
    Ok(Opened {
        storages,
        state,
        initialized: true,
    })
}

/// The state engine of `dir`: created in a new dir; in an initialized one it must be there
/// (its raft log was cut behind it, so a state started empty could never catch up).
fn open_state(dir: &Path, d: &str, initialized: bool) -> Result<StateEngine, DirError> {
    let path = dir.join(STATE_FILE);
    let what = match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && initialized => Some("missing".into()),
        Ok(m) if m.len() == 0 && initialized => Some("empty (0 bytes)".into()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Some(e.to_string()),
        _ => None,
    };
    if let Some(what) = what {
        return Err(DirError::Store {
            dir: d.into(),
            what: format!("state engine {STATE_FILE} {what}"),
        });
    }
    StateEngine::open(dir, STATE_CACHE_BYTES).map_err(|e| match e {
        EngineError::InUse => DirError::InUse { dir: d.into() },
        e => DirError::Store {
            dir: d.into(),
            what: format!("state engine {STATE_FILE}: {e}"),
        },
    })
}

/// The engine of a raft store already in `dir`, if there is one.
fn engine_on_disk(dir: &Path) -> Option<LogEngine> {
    if dir.join(crate::disk::redb_log::STORE_FILE).exists() {
        return Some(LogEngine::Redb);
    }
    let engine_dir = std::fs::read_dir(dir.join(crate::disk::engine_log::ENGINE_DIR)).ok()?;
    let mut files = engine_dir.filter_map(Result::ok);
    files
        .any(|e| e.path().extension().is_some_and(|x| x == "raftlog"))
        .then_some(LogEngine::RaftEngine)
}

fn store_err(dir: &str, e: StoreError) -> DirError {
    match e {
        StoreError::InUse => DirError::InUse { dir: dir.into() },
        StoreError::OtherNode(found) => DirError::Store {
            dir: dir.into(),
            what: format!("node {found}'s, not this node's"),
        },
        e => DirError::Store {
            dir: dir.into(),
            what: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot() -> raft::eraftpb::Snapshot {
        let mut s = raft::eraftpb::Snapshot::default();
        s.mut_metadata().index = 1;
        s.mut_metadata().term = 1;
        s.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        s
    }

    #[test]
    fn a_dir_in_use_by_another_process_is_refused_as_in_use_not_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let open = open_data_dir(dir.path(), "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .expect("fresh dir");
        let e = open_data_dir(dir.path(), "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::InUse { .. }), "{e}");
        assert!(
            !e.to_string().contains("corrupt") && !e.to_string().contains("Restore"),
            "{e}"
        );
        drop(open);
        drop(
            open_data_dir(dir.path(), "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
                .expect("free again"),
        );
    }

    #[test]
    fn a_marked_dir_refuses_another_node_a_missing_or_empty_store_and_an_unmarked_store() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        drop(open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1).expect("fresh dir"));
        drop(
            open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
                .expect("same node again"),
        );
        let e = open_data_dir(p, "c", 2, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(
                e,
                DirError::OtherNode {
                    found: 1,
                    expected: 2,
                    ..
                }
            ),
            "{e}"
        );
        let e = open_data_dir(p, "d", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::OtherCluster { .. }), "{e}");
        let store = p.join("raft.redb");
        std::fs::File::create(&store).unwrap(); // truncated to 0 bytes
        let e = open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::Store { .. }), "{e}");
        std::fs::remove_file(&store).unwrap();
        let e = open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::Store { .. }), "{e}");
        assert!(!store.exists(), "never re-created");
        // A store with state but no marker is refused; a pristine one is adopted.
        let other = tempfile::tempdir().unwrap();
        store_with_state(other.path(), LogEngine::Redb);
        let e = open_data_dir(other.path(), "c", 1, None, Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::NoMarker { .. }), "{e}");
    }

    /// A raft store on `engine` in `dir` with a vote recorded, and no marker.
    fn store_with_state(dir: &Path, engine: LogEngine) {
        let s = DiskStorage::create(dir, None, 1, engine).unwrap();
        let hs = raft::eraftpb::HardState {
            term: 3,
            vote: 1,
            ..Default::default()
        };
        s.persist(&[], Some(&hs)).unwrap();
    }

    #[test]
    fn a_dir_keeps_its_engine_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        drop(open_data_dir(p, "c", 1, Some(&boot()), None, 1).expect("fresh dir"));
        let m = read_marker(p).unwrap().unwrap();
        assert_eq!(m.log_engine, "raft-engine", "the default engine");
        let opened = open_data_dir(p, "c", 1, Some(&boot()), None, 1).expect("its own engine");
        assert_eq!(opened.storages[0].engine(), LogEngine::RaftEngine);
        drop(opened);
        let e = open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, DirError::OtherEngine { .. }), "{e}");
        assert!(e.to_string().contains("on raft-engine, not redb"), "{e}");
    }

    #[test]
    fn a_dir_keeps_its_number_of_groups_each_on_the_one_engine() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let opened = open_data_dir(p, "c", 1, Some(&boot()), None, 4).expect("fresh dir");
        assert_eq!(opened.storages.len(), 4);
        let vote = raft::eraftpb::HardState {
            term: 5,
            vote: 2,
            commit: 1,
            ..Default::default()
        };
        opened.storages[3].persist(&[], Some(&vote)).unwrap();
        opened.storages[0].sync().unwrap();
        drop(opened);
        assert_eq!(read_marker(p).unwrap().unwrap().groups, 4);
        let again = open_data_dir(p, "c", 1, Some(&boot()), None, 4).expect("reopened");
        let hs = |g: usize| {
            raft::Storage::initial_state(&again.storages[g])
                .unwrap()
                .hard_state
        };
        assert_eq!((hs(3).term, hs(3).vote), (5, 2), "group 3's own vote");
        assert_eq!(hs(1).vote, 0, "group 1 untouched");
        drop(again);
        for asked in [1, 8] {
            let e = open_data_dir(p, "c", 1, Some(&boot()), None, asked)
                .map(|_| ())
                .unwrap_err();
            assert!(matches!(e, DirError::OtherGroups { found: 4, .. }), "{e}");
        }
        let redb = tempfile::tempdir().unwrap();
        let e = open_data_dir(redb.path(), "c", 1, Some(&boot()), Some(LogEngine::Redb), 2)
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("redb holds one raft group"), "{e}");
    }

    #[test]
    fn an_unmarked_store_is_seen_on_its_own_engine_whatever_the_default() {
        for engine in LogEngine::ALL {
            let other = tempfile::tempdir().unwrap();
            store_with_state(other.path(), engine);
            for asked in [None, Some(engine)] {
                let e = open_data_dir(other.path(), "c", 1, None, asked, 1)
                    .map(|_| ())
                    .unwrap_err();
                assert!(
                    matches!(e, DirError::NoMarker { .. }),
                    "{engine} {asked:?}: {e}"
                );
            }
        }
    }

    #[test]
    fn a_marker_from_before_the_engine_choice_means_redb() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        drop(open_data_dir(p, "c", 1, Some(&boot()), Some(LogEngine::Redb), 1).expect("fresh"));
        let old = r#"{"format": 3, "cluster_id": "c", "node_id": 1}"#;
        std::fs::write(p.join(MARKER_FILE), old).unwrap();
        let opened = open_data_dir(p, "c", 1, Some(&boot()), None, 1).expect("an older dir");
        assert_eq!(opened.storages[0].engine(), LogEngine::Redb);
    }

    /// A dir of the format that kept the state in the raft log's snapshots is refused, with
    /// what to do; and an initialized dir whose state engine went missing is refused too (its
    /// log was cut behind that state).
    #[test]
    fn a_format_2_dir_and_a_dir_without_its_state_engine_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        drop(open_data_dir(p, "c", 1, Some(&boot()), None, 1).expect("fresh"));
        let marker = std::fs::read_to_string(p.join(MARKER_FILE)).unwrap();
        std::fs::write(
            p.join(MARKER_FILE),
            marker.replace("\"format\": 3", "\"format\": 2"),
        )
        .unwrap();
        match open_data_dir(p, "c", 1, Some(&boot()), None, 1) {
            Err(DirError::BadMarker { why, .. }) => assert!(why.contains("format 2"), "{why}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
        std::fs::write(p.join(MARKER_FILE), marker).unwrap();
        std::fs::remove_dir_all(p.join(STATE_FILE)).unwrap();
        match open_data_dir(p, "c", 1, Some(&boot()), None, 1) {
            Err(DirError::Store { what, .. }) => assert!(what.contains("missing"), "{what}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
