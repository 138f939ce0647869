//! The choice of engine for a node's raft log (`kv node --log-engine`).

use std::fmt;
use std::str::FromStr;

/// The engine a node's raft log lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogEngine {
    /// TiKV's raft-engine: an append-only log made for many raft groups, one fsync per batch.
    #[default]
    RaftEngine,
    /// A redb B-tree: every batch a copy-on-write transaction.
    Redb,
}

impl LogEngine {
    /// Both, in the order `kv bench` runs them.
    pub const ALL: [LogEngine; 2] = [LogEngine::RaftEngine, LogEngine::Redb];

    /// The name on the command line, in a data dir's marker and in bench reports.
    pub fn name(self) -> &'static str {
        match self {
            LogEngine::RaftEngine => "raft-engine",
            LogEngine::Redb => "redb",
        }
    }
}

impl fmt::Display for LogEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LogEngine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        LogEngine::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| format!("unknown log engine '{s}' (raft-engine or redb)"))
    }
}
