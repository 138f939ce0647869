//! What a node keeps on disk: the raft store (on raft-engine or redb, with its in-memory tail),
//! the data dir's marker, the record of the longest lease promise the dir ran with, and the
//! node's incarnation.

pub mod engine_log;
pub mod incarnation;
pub mod log_store;
pub mod marker;
pub mod mem_log;
pub mod promise_file;
pub mod redb_log;
pub mod state_engine;
pub mod storage;
pub mod zero_fill;
