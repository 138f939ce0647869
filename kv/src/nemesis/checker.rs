//! The nemesis's checker: exact for its workload, where every write carries a unique value and
//! raft's log index (the revision a write reports) orders all writes.
//!
//! - **Stale read**: a read returned a revision older than a write acknowledged before the read
//!   was invoked, or older than a read that completed before it was invoked.
//! - **Bogus read**: a read returned a value no write of that key had been invoked for by its end,
//!   a write that was refused, or an acknowledged write under another revision.
//! - **Reordered writes**: a write invoked after another was acknowledged got a lower revision.
//! - **Lost write**: a write acknowledged before a final read (after every fault was healed) is
//!   missing from it: the final read holds an older revision, or this revision with another value.
//! - **Lease violation**: a fenced write accepted with a token lower than one already accepted or
//!   already granted; or a lock granted to a session while another session held it (the holder
//!   took it earlier, had not asked to release it, and was refreshed after the grant: sessions
//!   are never revived, so it was alive, holding the lock, when the second grant applied).
//!
//! An operation whose outcome is unknown may or may not have happened: its value may be read,
//! and its absence is no anomaly. The crate's `sim::History` checks the same conditions in
//! simulated time; the KV example cannot depend on the `sim` feature, and adds fences and locks.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::ops::{Call, Op, Ret};

/// One anomaly: its kind, the operation that shows it, and the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// The operation judged.
    pub op: usize,
    /// The operation it conflicts with.
    pub against: usize,
    /// What was seen.
    pub detail: String,
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Reads that missed an earlier acknowledged write or an earlier read's newer revision.
    pub stale_reads: Vec<Anomaly>,
    /// Acknowledged writes missing from the final reads.
    pub lost_writes: Vec<Anomaly>,
    /// Fence or lock violations.
    pub lease_violations: Vec<Anomaly>,
    /// Reads of values never (or differently) written.
    pub bogus_reads: Vec<Anomaly>,
    /// Writes whose revisions go against real-time order.
    pub reordered_writes: Vec<Anomaly>,
    /// Reads that returned an answer and were checked (final reads included).
    pub reads_checked: usize,
    /// Of those, served under the lease.
    pub lease_reads_checked: usize,
    /// Of those, served by a follower under its follower read lease.
    pub follower_reads_checked: usize,
    /// Acknowledged writes checked.
    pub writes_acked: usize,
    /// Writes whose outcome is unknown.
    pub writes_unknown: usize,
    /// Accepted fenced writes and lock grants checked.
    pub lock_ops_checked: usize,
    /// Watch events missed, duplicated or out of order, and acknowledged writes missing from the
    /// watched history (etcd-API mode).
    pub watch_anomalies: Vec<Anomaly>,
    /// Watch events checked against the history.
    pub watch_events_checked: usize,
}

impl Verdict {
    /// Every anomaly of every kind.
    pub fn anomalies(&self) -> usize {
        self.stale_reads.len()
            + self.lost_writes.len()
            + self.lease_violations.len()
            + self.bogus_reads.len()
            + self.reordered_writes.len()
            + self.watch_anomalies.len()
    }
}

/// A completed operation of one key: (completion, revision, op id).
type Done = (u64, u64, usize);

/// For each query time (any order), the newest `(revision, id)` among `done` completed strictly
/// before it.
fn newest_before(done: &[Done], queries: &[u64]) -> Vec<Option<(u64, usize)>> {
    let mut done = done.to_vec();
    done.sort_unstable();
    let mut order: Vec<usize> = (0..queries.len()).collect();
    order.sort_by_key(|&i| queries[i]);
    let (mut out, mut next, mut newest) = (vec![None; queries.len()], 0, None);
    for i in order {
        while let Some(&(t, rev, id)) = done.get(next).filter(|d| d.0 < queries[i]) {
            let _ = t;
            newest = newest.max(Some((rev, id)));
            next += 1;
        }
        out[i] = newest;
    }
    out
}

/// Check a whole history.
pub fn check(ops: &[Op]) -> Verdict {
    let mut v = Verdict::default();
    let mut keys: BTreeMap<&str, (Vec<&Op>, Vec<&Op>)> = BTreeMap::new();
    for op in ops {
        match &op.call {
            Call::Put { key, .. } | Call::Cas { key, .. } => {
                keys.entry(key).or_default().0.push(op)
            }
            Call::Get { key, .. } => keys.entry(key).or_default().1.push(op),
            _ => {}
        }
    }
    for (writes, reads) in keys.values() {
        check_key(writes, reads, &mut v);
    }
    check_fences(ops, &mut v);
    check_lock_holders(ops, &mut v);
    v
}

fn written(op: &Op) -> Option<u64> {
    match op.ret() {
        Some(Ret::Written { revision }) => Some(*revision),
        _ => None,
    }
}

/// A read's answer: the value and revision (None: absent), how it was served, whether final.
type ReadAnswer<'a> = (&'a Option<(String, u64)>, &'a str, bool);

fn read(op: &Op) -> Option<ReadAnswer<'_>> {
    match (&op.call, op.ret()) {
        (Call::Get { final_read, .. }, Some(Ret::Read { value, served })) => {
            Some((value, served.as_str(), *final_read))
        }
        _ => None,
    }
}

fn check_key(writes: &[&Op], reads: &[&Op], v: &mut Verdict) {
    let acked: Vec<Done> = writes
        .iter()
        .filter_map(|w| Some((w.complete_ns(), written(w)?, w.id)))
        .collect();
    v.writes_acked += acked.len();
    v.writes_unknown += writes
        .iter()
        .filter(|w| matches!(w.ret(), None | Some(Ret::Unknown { .. })))
        .count();
    let by_id: WritesById = writes.iter().map(|w| (w.id, *w)).collect();
    let invoked: Vec<u64> = acked
        .iter()
        .map(|&(_, _, id)| writes_op(&by_id, id).invoke_ns)
        .collect();
    for ((_, rev, id), before) in acked.iter().zip(newest_before(&acked, &invoked)) {
        if let Some((prev, first)) = before.filter(|(prev, _)| prev >= rev) {
            let detail =
                format!("revision {rev} after write {first} at revision {prev} was acknowledged");
            v.reordered_writes.push(Anomaly {
                op: *id,
                against: first,
                detail,
            });
        }
    }
    let by_value: HashMap<&str, &Op> = writes
        .iter()
        .filter_map(|w| match &w.call {
            Call::Put { value, .. } | Call::Cas { value, .. } => Some((value.as_str(), *w)),
            _ => None,
        })
        .collect();
    let answered: Vec<(&Op, u64, bool)> = reads
        .iter()
        .filter_map(|r| {
            let (value, served, final_read) = read(r)?;
            v.reads_checked += 1;
            v.lease_reads_checked += usize::from(served == "lease");
            v.follower_reads_checked += usize::from(served == "follower_lease");
            if let Some((val, rev)) = value {
                check_source(r, val, *rev, &by_value, v);
            }
            Some((*r, value.as_ref().map_or(0, |(_, rev)| *rev), final_read))
        })
        .collect();
    check_stale(&acked, &answered, v);
    check_final(&acked, &by_id, &answered, v);
}

/// One key's writes by id (a key has tens of thousands in a long run: no linear search).
type WritesById<'a> = HashMap<usize, &'a Op>;

fn writes_op<'a>(writes: &WritesById<'a>, id: usize) -> &'a Op {
    writes
        .get(&id)
        .expect("an acknowledged write is in the list")
}

/// A read returned the value of a write of this key, invoked before the read ended, not
/// refused, under the revision it was acknowledged with.
fn check_source(r: &Op, val: &str, rev: u64, by_value: &HashMap<&str, &Op>, v: &mut Verdict) {
    let why = match by_value.get(val) {
        None => Some(("no write of this value to this key".to_string(), r.id)),
        Some(w) if w.invoke_ns > r.complete_ns() => {
            Some(("a write invoked after the read ended".into(), w.id))
        }
        Some(w) => match w.ret() {
            Some(Ret::Failed { why }) => Some((format!("a write refused with {why}"), w.id)),
            Some(Ret::Written { revision }) if *revision != rev => Some((
                format!("revision {rev}, but the write was acknowledged at {revision}"),
                w.id,
            )),
            _ => None,
        },
    };
    if let Some((detail, against)) = why {
        v.bogus_reads.push(Anomaly {
            op: r.id,
            against,
            detail: format!("read {val:?}@{rev}: {detail}"),
        });
    }
}

/// Reads (final ones aside) must see every write acknowledged, and every revision read, before
/// they were invoked.
fn check_stale(acked: &[Done], answered: &[(&Op, u64, bool)], v: &mut Verdict) {
    // Serializable reads (etcd's) may be stale by definition: only their source is checked.
    let reads: Vec<&(&Op, u64, bool)> = answered
        .iter()
        .filter(|a| {
            !a.2 && !matches!(a.0.ret(), Some(Ret::Read { served, .. }) if served == "serializable")
        })
        .collect();
    let at: Vec<u64> = reads.iter().map(|(r, _, _)| r.invoke_ns).collect();
    let read_done: Vec<Done> = answered
        .iter()
        .map(|(r, rev, _)| (r.complete_ns(), *rev, r.id))
        .collect();
    let w = newest_before(acked, &at);
    let rr = newest_before(&read_done, &at);
    for (i, (r, got, _)) in reads.iter().enumerate() {
        let served = match r.ret() {
            Some(Ret::Read { served, .. }) => served.as_str(),
            _ => "",
        };
        let (what, newest) = match (w[i], rr[i]) {
            (Some(nw), _) if nw.0 > *got => ("write acknowledged", nw),
            (_, Some(nr)) if nr.0 > *got => ("read completed", nr),
            _ => continue,
        };
        let detail = format!(
            "{served} read on node {} got revision {got}; a {what} before it was invoked had revision {}",
            r.node, newest.0
        );
        v.stale_reads.push(Anomaly {
            op: r.id,
            against: newest.1,
            detail,
        });
    }
}

/// Every write acknowledged before a final read was invoked is in it.
fn check_final(
    acked: &[Done],
    writes: &WritesById<'_>,
    answered: &[(&Op, u64, bool)],
    v: &mut Verdict,
) {
    let mut lost = BTreeMap::new();
    for (r, got, _) in answered.iter().filter(|a| a.2) {
        let value = match read(r) {
            Some((Some((val, _)), _, _)) => Some(val.as_str()),
            _ => None,
        };
        for &(t, rev, id) in acked.iter().filter(|d| d.0 < r.invoke_ns) {
            let same_value = matches!(&writes_op(writes, id).call, Call::Put { value: wv, .. } | Call::Cas { value: wv, .. } if Some(wv.as_str()) == value);
            if rev > *got || (rev == *got && !same_value) {
                let detail = format!("acknowledged at revision {rev} (t={t} ns); the final read on node {} holds revision {got}", r.node);
                lost.entry(id).or_insert(Anomaly {
                    op: id,
                    against: r.id,
                    detail,
                });
            }
        }
    }
    v.lost_writes.extend(lost.into_values());
}

/// Fenced writes: accepted tokens never go down, and never below a token already granted.
fn check_fences(ops: &[Op], v: &mut Verdict) {
    let mut by_lock: BTreeMap<&str, (Vec<Done>, Vec<&Op>)> = BTreeMap::new();
    for op in ops {
        match (&op.call, op.ret()) {
            (
                Call::Put {
                    fence: Some((lock, token)),
                    ..
                },
                Some(Ret::Written { .. }),
            ) => {
                let e = by_lock.entry(lock).or_default();
                e.0.push((op.complete_ns(), *token, op.id));
                e.1.push(op);
            }
            (Call::Lock { lock, .. }, Some(Ret::Token { token })) => {
                by_lock
                    .entry(lock)
                    .or_default()
                    .0
                    .push((op.complete_ns(), *token, op.id));
            }
            _ => {}
        }
    }
    for (lock, (seen, accepted)) in by_lock {
        v.lock_ops_checked += seen.len();
        let at: Vec<u64> = accepted.iter().map(|w| w.invoke_ns).collect();
        for (w, before) in accepted.iter().zip(newest_before(&seen, &at)) {
            let Call::Put {
                fence: Some((_, token)),
                ..
            } = &w.call
            else {
                unreachable!()
            };
            if let Some((newest, against)) = before.filter(|(t, _)| t > token) {
                let detail = format!("write fenced {lock}:{token} accepted after token {newest} was granted or accepted");
                v.lease_violations.push(Anomaly {
                    op: w.id,
                    against,
                    detail,
                });
            }
        }
    }
}

/// No lock is granted while another session provably holds it.
///
/// Linear in the history plus the pairs of grants of one lock: unlocks and successful
/// keep-alives are indexed first (a 30-minute run has about 600,000 operations).
fn check_lock_holders(ops: &[Op], v: &mut Verdict) {
    let grants: Vec<(&Op, &str, u64, u64)> = ops
        .iter()
        .filter_map(|op| match (&op.call, op.ret()) {
            (Call::Lock { lock, session }, Some(Ret::Token { token })) => {
                Some((op, lock.as_str(), *session, *token))
            }
            _ => None,
        })
        .collect();
    // The earliest unlock invoked per holding (lock, session, token).
    let mut unlocked: HashMap<(&str, u64, u64), u64> = HashMap::new();
    // Per session, its last keep-alive answered alive (invocation time, op).
    let mut last_alive: HashMap<u64, (u64, &Op)> = HashMap::new();
    for o in ops {
        match &o.call {
            Call::Unlock {
                lock,
                session,
                token,
            } => {
                let at = unlocked
                    .entry((lock.as_str(), *session, *token))
                    .or_insert(u64::MAX);
                *at = (*at).min(o.invoke_ns);
            }
            Call::KeepAlive { session }
                if matches!(o.ret(), Some(Ret::Refreshed { alive: true })) =>
            {
                let e = last_alive.entry(*session).or_insert((o.invoke_ns, o));
                if o.invoke_ns > e.0 {
                    *e = (o.invoke_ns, o);
                }
            }
            _ => {}
        }
    }
    for &(a, lock, sa, ta) in &grants {
        for &(b, _, sb, tb) in grants
            .iter()
            .filter(|g| g.1 == lock && g.2 != sa && g.3 > ta)
        {
            let released = unlocked
                .get(&(lock, sa, ta))
                .is_some_and(|&at| at < b.complete_ns());
            let alive_after = last_alive
                .get(&sa)
                .filter(|(at, _)| *at > b.complete_ns())
                .map(|(_, k)| k);
            if let (false, Some(k)) = (released, alive_after) {
                let detail = format!(
                    "{lock} granted to session {sb} (token {tb}) while session {sa} held it (token {ta}), refreshed by op {} after the grant",
                    k.id
                );
                v.lease_violations.push(Anomaly {
                    op: b.id,
                    against: a.id,
                    detail,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds hand-written histories: times in ms.
    #[derive(Default)]
    struct H(Vec<Op>);

    impl H {
        fn op(&mut self, call: Call, t: (u64, u64), ret: Option<Ret>) -> usize {
            let id = self.0.len();
            let done = ret.map(|r| (t.1 * 1_000_000, r));
            self.0.push(Op {
                id,
                client: 0,
                node: 1,
                call,
                invoke_ns: t.0 * 1_000_000,
                done,
            });
            id
        }
        fn put(&mut self, v: &str, t: (u64, u64), rev: Option<u64>) -> usize {
            let call = Call::Put {
                key: "k".into(),
                value: v.into(),
                fence: None,
            };
            let ret = rev.map_or(
                Ret::Unknown {
                    why: "timeout".into(),
                },
                |revision| Ret::Written { revision },
            );
            self.op(call, t, Some(ret))
        }
        fn get(&mut self, got: Option<(&str, u64)>, t: (u64, u64), final_read: bool) -> usize {
            let call = Call::Get {
                key: "k".into(),
                mode: "lease".into(),
                final_read,
            };
            let value = got.map(|(v, r)| (v.to_string(), r));
            self.op(
                call,
                t,
                Some(Ret::Read {
                    value,
                    served: "lease".into(),
                }),
            )
        }
        fn fenced(&mut self, token: u64, t: (u64, u64), accepted: bool) -> usize {
            let call = Call::Put {
                key: "f".into(),
                value: format!("f{}", self.0.len()),
                fence: Some(("L".into(), token)),
            };
            let ret = if accepted {
                Ret::Written {
                    revision: 100 + self.0.len() as u64,
                }
            } else {
                Ret::Failed {
                    why: "stale_fence".into(),
                }
            };
            self.op(call, t, Some(ret))
        }
        fn lock(&mut self, session: u64, token: u64, t: (u64, u64)) -> usize {
            self.op(
                Call::Lock {
                    lock: "L".into(),
                    session,
                },
                t,
                Some(Ret::Token { token }),
            )
        }
        fn keepalive(&mut self, session: u64, t: (u64, u64), alive: bool) -> usize {
            self.op(
                Call::KeepAlive { session },
                t,
                Some(Ret::Refreshed { alive }),
            )
        }
    }

    #[test]
    fn a_stale_read_is_found_and_names_the_write_it_missed() {
        let mut h = H::default();
        h.put("a", (0, 10), Some(5));
        let w = h.put("b", (20, 30), Some(7));
        let r = h.get(Some(("a", 5)), (40, 50), false);
        let v = check(&h.0);
        assert_eq!(v.stale_reads.len(), 1, "{v:?}");
        assert_eq!((v.stale_reads[0].op, v.stale_reads[0].against), (r, w));
        assert_eq!(v.anomalies(), 1);
        // A read after a read that saw a newer revision is stale too.
        let mut h = H::default();
        h.put("a", (0, 10), Some(5));
        h.put("b", (20, 300), Some(7));
        let first = h.get(Some(("b", 7)), (40, 50), false);
        let later = h.get(Some(("a", 5)), (60, 70), false);
        let v = check(&h.0);
        assert_eq!(
            v.stale_reads
                .iter()
                .map(|a| (a.op, a.against))
                .collect::<Vec<_>>(),
            [(later, first)]
        );
    }

    #[test]
    fn a_lost_write_is_found_by_the_final_read() {
        let mut h = H::default();
        h.put("a", (0, 10), Some(5));
        let lost = h.put("b", (20, 30), Some(7));
        h.get(Some(("a", 5)), (100, 110), true);
        let v = check(&h.0);
        assert_eq!(
            v.lost_writes.iter().map(|a| a.op).collect::<Vec<_>>(),
            [lost],
            "{v:?}"
        );
        assert!(
            v.stale_reads.is_empty(),
            "a final read is judged for lost writes only"
        );
        // The same revision with another value is lost too (and that read is bogus).
        let mut h = H::default();
        let lost = h.put("a", (0, 10), Some(5));
        h.put("x", (0, 10), None);
        h.get(Some(("x", 5)), (100, 110), true);
        let v = check(&h.0);
        assert_eq!(
            v.lost_writes.iter().map(|a| a.op).collect::<Vec<_>>(),
            [lost]
        );
        assert!(
            v.bogus_reads.is_empty(),
            "x may have been written at 5: unknown outcome"
        );
    }

    #[test]
    fn concurrent_overlapping_operations_are_valid_in_either_order() {
        let mut h = H::default();
        h.put("a", (0, 10), Some(5));
        // b is in flight from 20 to 60: reads overlapping it may see a or b.
        h.put("b", (20, 60), Some(7));
        h.get(Some(("b", 7)), (25, 35), false);
        h.get(Some(("a", 5)), (30, 40), false); // invoked before the first read completed
        h.get(Some(("b", 7)), (70, 80), true);
        let v = check(&h.0);
        assert_eq!(v.anomalies(), 0, "{v:?}");
        assert_eq!(
            (v.reads_checked, v.lease_reads_checked, v.writes_acked),
            (3, 3, 2)
        );
    }

    #[test]
    fn an_unknown_outcome_write_may_or_may_not_have_happened() {
        for seen in [true, false] {
            let mut h = H::default();
            h.put("a", (0, 10), Some(5));
            h.put("u", (20, 30), None); // timed out: unknown
            let got = if seen { ("u", 6) } else { ("a", 5) };
            h.get(Some(got), (40, 50), false);
            h.get(Some(got), (60, 70), true);
            let v = check(&h.0);
            assert_eq!(v.anomalies(), 0, "seen {seen}: {v:?}");
            assert_eq!(v.writes_unknown, 1);
        }
        // But a refused write must never be read, nor a value never written.
        let mut h = H::default();
        let refused = h.op(
            Call::Put {
                key: "k".into(),
                value: "r".into(),
                fence: None,
            },
            (0, 10),
            Some(Ret::Failed {
                why: "not_leader".into(),
            }),
        );
        h.get(Some(("r", 6)), (20, 30), false);
        h.get(Some(("never", 8)), (20, 30), false);
        let v = check(&h.0);
        assert_eq!(v.bogus_reads.len(), 2, "{v:?}");
        assert_eq!(v.bogus_reads[0].against, refused);
    }

    #[test]
    fn a_fence_accepted_below_a_known_token_is_a_lease_violation() {
        let mut h = H::default();
        h.lock(1, 1, (0, 5));
        h.fenced(1, (10, 20), true);
        h.lock(2, 2, (30, 40));
        h.fenced(1, (35, 45), true); // concurrent with the grant: fine
        h.fenced(2, (50, 60), true);
        assert_eq!(check(&h.0).anomalies(), 0);
        h.fenced(1, (70, 80), false); // refused: fine
        assert_eq!(check(&h.0).anomalies(), 0);
        let bad = h.fenced(1, (90, 95), true);
        let v = check(&h.0);
        assert_eq!(
            v.lease_violations.iter().map(|a| a.op).collect::<Vec<_>>(),
            [bad],
            "{v:?}"
        );
    }

    #[test]
    fn a_lock_granted_while_its_holder_was_alive_is_a_lease_violation() {
        let mut h = H::default();
        h.lock(1, 1, (0, 5));
        let second = h.lock(2, 2, (10, 20));
        h.keepalive(1, (15, 25), true); // overlaps the grant: proves nothing
        h.keepalive(1, (30, 40), false); // session 1 had expired: fine
        assert_eq!(check(&h.0).anomalies(), 0);
        h.keepalive(1, (50, 60), true); // alive after the grant, never released: two holders
        let v = check(&h.0);
        assert_eq!(
            v.lease_violations.iter().map(|a| a.op).collect::<Vec<_>>(),
            [second]
        );
        // Released before the second grant completed: fine.
        h.op(
            Call::Unlock {
                lock: "L".into(),
                session: 1,
                token: 1,
            },
            (8, 12),
            Some(Ret::Unlocked),
        );
        assert_eq!(check(&h.0).anomalies(), 0);
    }
}
