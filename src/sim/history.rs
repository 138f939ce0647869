//! A history of client operations and a linearizability checker for a KV register per key.
//!
//! Every write carries a unique value, and raft gives writes a total order: the log index that
//! committed them (their revision). With the write order known, a history is linearizable iff:
//! - **no stale read**: a read returns a revision at least as new as every write to its key that
//!   was acknowledged before the read was invoked;
//! - **no read from the future**: a read returns a write that was invoked before the read
//!   completed, with that write's value;
//! - **reads never go back**: a read invoked after another read of the same key completed
//!   returns a revision at least as new;
//! - **writes keep real-time order**: a write invoked after another write was acknowledged gets a
//!   larger revision.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::read::ReadKind;

/// Identifies an operation in a [`History`].
pub type OpId = u64;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// Write `value` (unique in the history) to `key`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value, unique across the history.
        value: Vec<u8>,
    },
    /// Read `key`.
    Get {
        /// The key.
        key: Vec<u8>,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The write was acknowledged: committed at log index `revision` and applied.
    Written {
        /// The raft index that committed the write.
        revision: u64,
    },
    /// The read returned `value` written at `revision` (`None`: the key was absent).
    Read {
        /// Value and revision, or `None` when absent.
        value: Option<(Vec<u8>, u64)>,
        /// How the read was served.
        served: ReadKind,
    },
    /// The operation failed. A failed write may still take effect later.
    Failed(String),
}

/// One operation: invoked at `invoke_ns`, completed at `complete_ns` (real simulated time).
#[derive(Debug, Clone)]
pub struct Op {
    /// Its id.
    pub id: OpId,
    /// The node it was sent to.
    pub node: u64,
    /// What it asked for.
    pub kind: OpKind,
    /// Real time of invocation.
    pub invoke_ns: u64,
    /// Real time of completion and the result; `None` while outstanding.
    pub done: Option<(u64, OpResult)>,
}

/// Records operations as they are invoked and completed.
///
/// [`crate::sim::SimCluster`] records into one, but the checker depends on nothing else: record
/// the clients of a store of your own (a state machine behind [`crate::LeaseNode`], tested on
/// real threads or processes, times from one clock) and check that.
///
/// # Example
/// Writes must carry unique values, and report the raft index that committed them (their
/// revision). Here a read served after a write was acknowledged misses it: a stale read.
///
/// ```
/// use raft_lease::sim::{History, OpKind, OpResult, Violation};
/// use raft_lease::ReadKind;
///
/// let mut history = History::default();
/// let key = b"balance".to_vec();
/// let put = |value: &str| OpKind::Put { key: key.clone(), value: value.into() };
/// let get = OpKind::Get { key: key.clone() };
///
/// // Node 1 writes "10" (committed at index 5), acknowledged at t = 20 ns.
/// let w1 = history.invoke(1, put("10"), 10);
/// history.complete(w1, OpResult::Written { revision: 5 }, 20);
/// // A lease read on node 1 sees it.
/// let r1 = history.invoke(1, get.clone(), 30);
/// let seen = Some((b"10".to_vec(), 5));
/// history.complete(r1, OpResult::Read { value: seen, served: ReadKind::Lease }, 40);
/// assert!(history.check().violations.is_empty());
///
/// // Node 2 writes "20" at index 7, acknowledged at t = 60; then node 1, on an old lease,
/// // still answers "10".
/// let w2 = history.invoke(2, put("20"), 50);
/// history.complete(w2, OpResult::Written { revision: 7 }, 60);
/// let r2 = history.invoke(1, get, 70);
/// let stale = Some((b"10".to_vec(), 5));
/// history.complete(r2, OpResult::Read { value: stale, served: ReadKind::Lease }, 80);
///
/// let report = history.check();
/// assert_eq!(report.stale_reads(), 1);
/// assert!(matches!(
///     report.violations[0],
///     Violation::StaleRead { read, missed_write, .. } if read == r2 && missed_write == w2
/// ));
/// ```
#[derive(Debug, Default, Clone)]
pub struct History {
    ops: Vec<Op>,
    /// Revisions at which each write was seen applied on any node (writes may outlive their client).
    applied_revision: HashMap<OpId, u64>,
    /// Rules a node broke, seen as they happened (an apply past the exposed index).
    broken_rules: Vec<Violation>,
}

/// One way the history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// With follower leases, a node applied an entry past the exposed index it knew
    /// (FOLLOWER.md rule 1: it shows a write a holder may not have yet).
    AppliedPastExposed {
        /// Real time it happened.
        at_ns: u64,
        /// The node.
        node: u64,
        /// The entry applied.
        index: u64,
        /// The exposed index it knew.
        exposed: u64,
    },
    /// A read missed a write acknowledged before it started.
    StaleRead {
        /// The read.
        read: OpId,
        /// The node that served it.
        node: u64,
        /// How it was served.
        served: ReadKind,
        /// The revision it returned (0: absent).
        got_revision: u64,
        /// An acknowledged write it should have seen.
        missed_write: OpId,
        /// That write's revision.
        missed_revision: u64,
    },
    /// A read returned a value no write had been invoked for by then, or the wrong value.
    FutureOrBogusRead {
        /// The read.
        read: OpId,
        /// The revision it returned.
        got_revision: u64,
    },
    /// A read returned an older revision than a read that completed before it started.
    ReadWentBack {
        /// The earlier read.
        earlier: OpId,
        /// The later read.
        later: OpId,
    },
    /// A write acknowledged before another was invoked got a larger revision.
    WritesReordered {
        /// The write acknowledged first.
        first: OpId,
        /// The write invoked after it.
        second: OpId,
    },
    /// Two nodes held a lease at the same real instant (seen by the lease monitor).
    TwoLeaseHolders {
        /// Real time it was first seen.
        at_ns: u64,
        /// One holder.
        first: u64,
        /// The term of its lease.
        first_term: u64,
        /// The other holder.
        second: u64,
        /// The term of its lease.
        second_term: u64,
    },
    /// A node held a lease of one term while another node led a later term.
    LeaseBehindLeader {
        /// Real time it was first seen.
        at_ns: u64,
        /// The node holding the lease.
        holder: u64,
        /// The term of its lease.
        lease_term: u64,
        /// The node leading the later term.
        leader: u64,
        /// That term.
        leader_term: u64,
    },
    /// A node held a follower read lease of one term while a node other than that term's leader
    /// led a later term.
    ReadLeaseBehindLeader {
        /// Real time it was first seen.
        at_ns: u64,
        /// The node holding the read lease.
        holder: u64,
        /// The term of the leader that granted it.
        lease_term: u64,
        /// That leader, as the monitor saw it (`None`: never seen leading).
        granter: Option<u64>,
        /// The node leading the later term.
        leader: u64,
        /// That term.
        leader_term: u64,
    },
    /// A node held a lease that no quorum of promises backed: it outlived the promises it rests on.
    UnbackedLease {
        /// Real time it was first seen.
        at_ns: u64,
        /// The node holding the lease.
        holder: u64,
        /// The term of its lease.
        lease_term: u64,
        /// The nodes whose promise backed it then.
        backers: Vec<u64>,
    },
    /// A node that had promised a lease holder campaigned, or voted for another node in a later
    /// term, while that lease was held.
    PromiseBroken {
        /// Real time it was first seen.
        at_ns: u64,
        /// The node holding the lease.
        holder: u64,
        /// The term of its lease.
        lease_term: u64,
        /// The node that broke its promise.
        node: u64,
        /// That node's term.
        node_term: u64,
        /// Whom it voted for in that term (0: none).
        vote: u64,
    },
}

impl Violation {
    /// Whether the lease monitor found it (rather than the history checker).
    pub fn is_lease_overlap(&self) -> bool {
        matches!(
            self,
            Violation::TwoLeaseHolders { .. }
                | Violation::LeaseBehindLeader { .. }
                | Violation::ReadLeaseBehindLeader { .. }
                | Violation::UnbackedLease { .. }
                | Violation::PromiseBroken { .. }
        )
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// What the checker found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Every violation found (empty: linearizable).
    pub violations: Vec<Violation>,
    /// Reads that returned a value and were checked.
    pub reads_checked: usize,
    /// Of those, reads served under the lease.
    pub lease_reads_checked: usize,
    /// Of those, reads served on a follower under its read lease.
    pub follower_reads_checked: usize,
    /// Acknowledged writes.
    pub writes_acked: usize,
    /// Instants at which the lease monitor checked every node's lease.
    pub lease_checks: u64,
}

impl CheckReport {
    /// Stale reads only.
    pub fn stale_reads(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| matches!(v, Violation::StaleRead { .. }))
            .count()
    }

    /// Lease overlaps found by the lease monitor only.
    pub fn lease_overlaps(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| v.is_lease_overlap())
            .count()
    }

    /// Whether the run broke safety: a stale read or a lease overlap (what a negative control
    /// must produce).
    pub fn unsafe_found(&self) -> bool {
        self.stale_reads() > 0 || self.lease_overlaps() > 0
    }
}

impl History {
    /// Record an invocation; returns its id.
    pub fn invoke(&mut self, node: u64, kind: OpKind, now_ns: u64) -> OpId {
        let id = self.ops.len() as OpId;
        self.ops.push(Op {
            id,
            node,
            kind,
            invoke_ns: now_ns,
            done: None,
        });
        id
    }

    /// Record a completion. Panics if the op is unknown or already complete (a harness bug).
    pub fn complete(&mut self, id: OpId, result: OpResult, now_ns: u64) {
        let op = &mut self.ops[id as usize];
        assert!(op.done.is_none(), "op {id} completed twice: {op:?}");
        assert!(
            now_ns >= op.invoke_ns,
            "op {id} completed before it was invoked"
        );
        if let OpResult::Written { revision } = result {
            self.applied_revision.insert(id, revision);
        }
        op.done = Some((now_ns, result));
    }

    /// Record that write `id` was applied at `revision` on some node. Panics if two nodes disagree.
    pub fn applied(&mut self, id: OpId, revision: u64) {
        let prev = self.applied_revision.insert(id, revision);
        assert!(
            prev.is_none_or(|r| r == revision),
            "write {id} applied at {prev:?} and {revision}"
        );
    }

    /// Record that `node` applied entry `index` past the exposed index `exposed` it knew.
    pub fn applied_past_exposed(&mut self, node: u64, index: u64, exposed: u64, now_ns: u64) {
        self.broken_rules.push(Violation::AppliedPastExposed {
            at_ns: now_ns,
            node,
            index,
            exposed,
        });
    }

    /// Every operation so far.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Check the history. See the module docs for the conditions.
    pub fn check(&self) -> CheckReport {
        let mut report = CheckReport {
            violations: self.broken_rules.clone(),
            ..CheckReport::default()
        };
        let by_key = self.index_by_key();
        for (key, (writes, reads)) in &by_key {
            let _ = key;
            self.check_key(writes, reads, &mut report);
        }
        report
    }

    fn index_by_key(&self) -> BTreeMap<&[u8], (Vec<&Op>, Vec<&Op>)> {
        let mut by_key: BTreeMap<&[u8], (Vec<&Op>, Vec<&Op>)> = BTreeMap::new();
        for op in &self.ops {
            match &op.kind {
                OpKind::Put { key, .. } => by_key.entry(key).or_default().0.push(op),
                OpKind::Get { key } => by_key.entry(key).or_default().1.push(op),
            }
        }
        by_key
    }

    fn check_key(&self, writes: &[&Op], reads: &[&Op], report: &mut CheckReport) {
        let acked = by_completion(writes.iter().filter_map(|w| match &w.done {
            Some((t, OpResult::Written { revision })) => Some(Done {
                op: w,
                complete_ns: *t,
                revision: *revision,
            }),
            _ => None,
        }));
        report.writes_acked += acked.len();
        check_write_order(&acked, report);
        let by_revision: HashMap<u64, &Op> = writes
            .iter()
            .filter_map(|w| Some((*self.applied_revision.get(&w.id)?, *w)))
            .collect();
        let mut checked = Vec::new();
        for read in reads {
            let Some((complete_ns, OpResult::Read { value, served })) = &read.done else {
                continue;
            };
            report.reads_checked += 1;
            report.lease_reads_checked += usize::from(*served == ReadKind::Lease);
            report.follower_reads_checked += usize::from(*served == ReadKind::FollowerLease);
            check_read_source(read, value, *complete_ns, &by_revision, report);
            let revision = value.as_ref().map_or(0, |(_, r)| *r);
            checked.push(Done {
                op: read,
                complete_ns: *complete_ns,
                revision,
            });
        }
        check_not_stale(&acked, &checked, report);
        check_reads_monotonic(by_completion(checked), report);
    }
}

/// A completed operation of one key, with the revision it wrote or read (0: absent).
#[derive(Clone, Copy)]
struct Done<'a> {
    op: &'a Op,
    complete_ns: u64,
    revision: u64,
}

fn by_completion<'a>(ops: impl IntoIterator<Item = Done<'a>>) -> Vec<Done<'a>> {
    let mut v: Vec<Done<'a>> = ops.into_iter().collect();
    v.sort_by_key(|d| (d.complete_ns, d.revision));
    v
}

/// Sweeps operations sorted by completion: for invocation times asked in increasing order, the
/// newest (revision, op) among those that completed strictly before.
struct NewestBefore<'a, 'b> {
    completed: &'b [Done<'a>],
    next: usize,
    newest: Option<(u64, OpId)>,
}

impl<'a, 'b> NewestBefore<'a, 'b> {
    fn new(completed: &'b [Done<'a>]) -> Self {
        NewestBefore {
            completed,
            next: 0,
            newest: None,
        }
    }

    fn at(&mut self, invoke_ns: u64) -> Option<(u64, OpId)> {
        while let Some(d) = self
            .completed
            .get(self.next)
            .filter(|d| d.complete_ns < invoke_ns)
        {
            self.newest = self.newest.max(Some((d.revision, d.op.id)));
            self.next += 1;
        }
        self.newest
    }
}

fn by_invocation<'a>(ops: &[Done<'a>]) -> Vec<Done<'a>> {
    let mut v = ops.to_vec();
    v.sort_by_key(|d| d.op.invoke_ns);
    v
}

/// A write invoked after another was acknowledged must get a larger revision.
fn check_write_order(acked: &[Done], report: &mut CheckReport) {
    let mut sweep = NewestBefore::new(acked);
    for w in by_invocation(acked) {
        if let Some((_, first)) = sweep
            .at(w.op.invoke_ns)
            .filter(|(prev, _)| *prev >= w.revision)
        {
            report.violations.push(Violation::WritesReordered {
                first,
                second: w.op.id,
            });
        }
    }
}

/// A read must see every write acknowledged before it was invoked.
fn check_not_stale(acked: &[Done], reads: &[Done], report: &mut CheckReport) {
    let mut sweep = NewestBefore::new(acked);
    for r in by_invocation(reads) {
        let Some((missed_revision, missed_write)) = sweep.at(r.op.invoke_ns) else {
            continue;
        };
        if missed_revision > r.revision {
            let served = match &r.op.done {
                Some((_, OpResult::Read { served, .. })) => *served,
                _ => unreachable!("only completed reads are checked"),
            };
            report.violations.push(Violation::StaleRead {
                read: r.op.id,
                node: r.op.node,
                served,
                got_revision: r.revision,
                missed_write,
                missed_revision,
            });
        }
    }
}

/// A read invoked after another read completed must not return an older revision.
fn check_reads_monotonic(reads: Vec<Done>, report: &mut CheckReport) {
    let mut sweep = NewestBefore::new(&reads);
    for r in by_invocation(&reads) {
        if let Some((_, earlier)) = sweep
            .at(r.op.invoke_ns)
            .filter(|(newest, _)| *newest > r.revision)
        {
            report.violations.push(Violation::ReadWentBack {
                earlier,
                later: r.op.id,
            });
        }
    }
}

/// A read must return a write that was invoked before the read completed, with its value.
fn check_read_source(
    read: &Op,
    value: &Option<(Vec<u8>, u64)>,
    complete_ns: u64,
    by_revision: &HashMap<u64, &Op>,
    report: &mut CheckReport,
) {
    let Some((value, revision)) = value else {
        return;
    };
    let ok = by_revision.get(revision).is_some_and(|w| {
        w.invoke_ns <= complete_ns && matches!(&w.kind, OpKind::Put { value: v, .. } if v == value)
    });
    if !ok {
        report.violations.push(Violation::FutureOrBogusRead {
            read: read.id,
            got_revision: *revision,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(h: &mut History, v: &str, t0: u64, t1: u64, rev: u64) -> OpId {
        let id = h.invoke(
            1,
            OpKind::Put {
                key: b"k".to_vec(),
                value: v.into(),
            },
            t0,
        );
        h.complete(id, OpResult::Written { revision: rev }, t1);
        id
    }

    fn get(h: &mut History, got: Option<(&str, u64)>, t0: u64, t1: u64) -> OpId {
        let id = h.invoke(2, OpKind::Get { key: b"k".to_vec() }, t0);
        let value = got.map(|(v, r)| (v.as_bytes().to_vec(), r));
        h.complete(
            id,
            OpResult::Read {
                value,
                served: ReadKind::Lease,
            },
            t1,
        );
        id
    }

    #[test]
    fn a_linearizable_history_passes() {
        let mut h = History::default();
        put(&mut h, "a", 0, 10, 5);
        get(&mut h, Some(("a", 5)), 5, 8); // concurrent with the write: may see it
        put(&mut h, "b", 20, 30, 7);
        get(&mut h, Some(("a", 5)), 25, 26); // concurrent with "b": may miss it
        get(&mut h, Some(("b", 7)), 31, 32);
        let r = h.check();
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!((r.reads_checked, r.writes_acked), (3, 2));
    }

    #[test]
    fn the_checker_catches_each_violation() {
        let mut h = History::default();
        put(&mut h, "a", 0, 10, 5);
        let w = put(&mut h, "b", 20, 30, 7);
        let stale = get(&mut h, Some(("a", 5)), 31, 32);
        let r = h.check();
        assert_eq!(r.stale_reads(), 1);
        assert!(
            matches!(r.violations[0], Violation::StaleRead { read, missed_write, .. } if read == stale && missed_write == w)
        );

        let mut h = History::default();
        get(&mut h, Some(("a", 5)), 0, 1);
        put(&mut h, "a", 2, 3, 5);
        assert!(matches!(
            h.check().violations[0],
            Violation::FutureOrBogusRead { .. }
        ));

        let mut h = History::default();
        put(&mut h, "a", 0, 1, 5);
        put(&mut h, "b", 0, 100, 7);
        get(&mut h, Some(("b", 7)), 2, 3);
        get(&mut h, Some(("a", 5)), 4, 5);
        assert!(matches!(
            h.check().violations[..],
            [Violation::ReadWentBack { .. }]
        ));

        let mut h = History::default();
        put(&mut h, "a", 0, 1, 9);
        put(&mut h, "b", 2, 3, 7);
        assert!(matches!(
            h.check().violations[..],
            [Violation::WritesReordered { .. }]
        ));
    }
}
