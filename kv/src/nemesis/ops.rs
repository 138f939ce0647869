//! The nemesis's history: every client operation with its invocation and completion times (one
//! monotonic clock, this process's), the node it went to and what came back. An operation whose
//! outcome is unknown (a timeout, a connection lost after the request was sent) is recorded as
//! such: the checker lets it take effect or not.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum Call {
    /// Write a unique `value` to `key`; with `fence`, `(lock, token)` fences the write.
    Put {
        /// The key.
        key: String,
        /// The value, unique in the history.
        value: String,
        /// The lock and token the write is fenced with.
        fence: Option<(String, u64)>,
    },
    /// Write a unique `value` to `key` if its value is still `expect` (etcd's `Txn`).
    Cas {
        /// The key.
        key: String,
        /// The value, unique in the history.
        value: String,
        /// The value the compare expects.
        expect: String,
    },
    /// Read `key` in `mode` (`lease`, `auto`, `index`). `final_read`: the read after the faults,
    /// that lost writes are judged by.
    Get {
        /// The key.
        key: String,
        /// The read mode asked for.
        mode: String,
        /// Whether this is a final read.
        final_read: bool,
    },
    /// Start a session.
    Session,
    /// Keep session `session` alive.
    KeepAlive {
        /// The session.
        session: u64,
    },
    /// Take `lock` for `session`.
    Lock {
        /// The lock.
        lock: String,
        /// The session.
        session: u64,
    },
    /// Release `lock` held by `session` under `token`.
    Unlock {
        /// The lock.
        lock: String,
        /// The session.
        session: u64,
        /// The token.
        token: u64,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "ret", rename_all = "snake_case")]
pub enum Ret {
    /// A write committed at `revision` (the raft index).
    Written {
        /// Its revision.
        revision: u64,
    },
    /// A read: the value and its revision, or `None` for an absent key; `served` is `lease` or
    /// `index`, as the node said.
    Read {
        /// Value and revision.
        value: Option<(String, u64)>,
        /// How it was served.
        served: String,
    },
    /// A session was granted.
    Session {
        /// Its id.
        id: u64,
    },
    /// A keep-alive: whether the session was refreshed (it was alive when it applied).
    Refreshed {
        /// Whether the session was alive.
        alive: bool,
    },
    /// A lock was granted with `token`.
    Token {
        /// The fencing token.
        token: u64,
    },
    /// An unlock applied.
    Unlocked,
    /// Definitely no effect: refused by the state machine or by a node before proposing.
    Failed {
        /// The error code or reason.
        why: String,
    },
    /// Unknown: it may or may not have taken effect.
    Unknown {
        /// Why the outcome is unknown.
        why: String,
    },
}

/// One operation.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// Index in the history.
    pub id: usize,
    /// The client that issued it.
    pub client: u32,
    /// The node that answered (the first asked, or the one a redirect led to).
    pub node: u64,
    /// What was asked.
    pub call: Call,
    /// Invocation time, ns since the run began.
    pub invoke_ns: u64,
    /// Completion time and result; `None` while outstanding (unknown at the end).
    pub done: Option<(u64, Ret)>,
}

impl Op {
    /// The result, if completed.
    pub fn ret(&self) -> Option<&Ret> {
        self.done.as_ref().map(|(_, r)| r)
    }

    /// Completion time, or `u64::MAX` if it never completed.
    pub fn complete_ns(&self) -> u64 {
        self.done.as_ref().map_or(u64::MAX, |(t, _)| *t)
    }
}

/// The shared, append-only history.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    /// A history whose clock starts at `start`.
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            start,
            ops: Arc::default(),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Record an invocation (now).
    pub fn invoke(&self, client: u32, node: u64, call: Call) -> usize {
        let mut ops = self.ops.lock();
        let id = ops.len();
        let invoke_ns = self.now_ns();
        ops.push(Op {
            id,
            client,
            node,
            call,
            invoke_ns,
            done: None,
        });
        id
    }

    /// Record a completion (now) at `node`. A second completion is a harness bug.
    pub fn complete(&self, id: usize, node: u64, ret: Ret) {
        let now = self.now_ns();
        let mut ops = self.ops.lock();
        let op = &mut ops[id];
        assert!(op.done.is_none(), "op {id} completed twice: {op:?}");
        op.node = node;
        op.done = Some((now, ret));
    }

    /// How many operations were invoked so far.
    pub fn len(&self) -> usize {
        self.ops.lock().len()
    }

    /// A copy of every operation so far.
    pub fn snapshot(&self) -> Vec<Op> {
        self.ops.lock().clone()
    }
}
