use etcd_client::proto::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp,
};

use super::*;
use crate::disk::state_engine::{EngineRead, EngineWrite, StateEngine, Table};
use crate::state::mvcc::counters::COUNTERS;

/// A group's keyspace in an engine of its own, applied to a batch at a time.
struct Store {
    ks: Keyspace,
    applied: u64,
}

impl Store {
    fn new() -> Self {
        Store {
            ks: Keyspace::open(StateEngine::in_memory(), 0).unwrap(),
            applied: 0,
        }
    }

    /// Run `f` on one batch, committed.
    fn with<T>(&mut self, f: impl FnOnce(&mut Batch<'_>) -> T) -> T {
        self.applied += 1;
        let applied = self.applied;
        let engine = self.ks.engine().clone();
        let (out, c) = engine
            .write(false, |w| {
                let mut b = Batch::begin(w, 0).unwrap();
                let out = f(&mut b);
                Ok((out, b.finish(applied).unwrap()))
            })
            .unwrap();
        self.ks.publish(&c);
        out
    }

    fn txn(
        &mut self,
        t: &PbTxnRequest,
        leases: &dyn Fn(i64) -> bool,
    ) -> Result<txn::TxnDone, MvccError> {
        self.with(|b| b.txn(t, leases))
    }

    fn rev(&self) -> i64 {
        self.ks.rev()
    }

    fn compact(&mut self, at: i64) -> Result<(), MvccError> {
        self.with(|b| b.compact(at))
    }

    /// Every row of every table but the counters (whose applied index moves with each batch).
    fn rows(&self) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
        let v = self.ks.engine().view().unwrap();
        let mut out = Vec::new();
        for t in Table::ALL {
            v.scan(t, b"", None, false, &mut |k, val| {
                if !k.ends_with(COUNTERS.as_bytes()) {
                    out.push((t, k.to_vec(), val.to_vec()));
                }
                true
            })
            .unwrap();
        }
        out
    }
}

fn put(key: &[u8], value: &[u8]) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            prev_kv: true,
            ..Default::default()
        })),
    }
}

fn one(op: PbTxnRequestOp) -> PbTxnRequest {
    PbTxnRequest {
        success: vec![op],
        ..Default::default()
    }
}

fn get(m: &Store, key: &[u8], end: &[u8], rev: i64) -> Result<range::Ranged, MvccError> {
    let r = PbRangeRequest {
        key: key.to_vec(),
        range_end: end.to_vec(),
        revision: rev,
        ..Default::default()
    };
    m.ks.read(|v| v.range(&r, v.rev()))
}

const NO_LEASES: &dyn Fn(i64) -> bool = &|_| false;

#[test]
fn each_change_moves_the_revision_by_one_and_keys_keep_create_mod_and_version() {
    let mut m = Store::new();
    assert_eq!(m.rev(), 1, "an empty store is at revision 1, as etcd's");
    assert_eq!(m.txn(&one(put(b"a", b"1")), NO_LEASES).unwrap().revision, 2);
    assert_eq!(m.txn(&one(put(b"a", b"2")), NO_LEASES).unwrap().revision, 3);
    let kv = &get(&m, b"a", b"", 0).unwrap().kvs[0];
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    assert_eq!(get(&m, b"a", b"", 2).unwrap().kvs[0].value, b"1");
    assert_eq!(get(&m, b"a", b"", 4), Err(MvccError::FutureRev));
    // Two keys in one transaction: one revision.
    let two = PbTxnRequest {
        success: vec![put(b"b", b"x"), put(b"c", b"y")],
        ..Default::default()
    };
    assert_eq!(m.txn(&two, NO_LEASES).unwrap().revision, 4);
    let all = get(&m, b"\0", b"\0", 0).unwrap();
    assert_eq!(all.count, 3);
    assert_eq!(
        all.kvs.iter().map(|k| k.key.clone()).collect::<Vec<_>>(),
        [b"a", b"b", b"c"]
    );
    // A delete of nothing changes nothing.
    let del = |k: &[u8]| {
        one(PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                key: k.to_vec(),
                ..Default::default()
            })),
        })
    };
    assert_eq!(m.txn(&del(b"zz"), NO_LEASES).unwrap().revision, 4);
    assert_eq!(m.txn(&del(b"a"), NO_LEASES).unwrap().revision, 5);
    assert!(get(&m, b"a", b"", 0).unwrap().kvs.is_empty());
    assert_eq!(get(&m, b"a", b"", 4).unwrap().kvs[0].value, b"2");
    // Created again: a new create revision, version 1.
    m.txn(&one(put(b"a", b"3")), NO_LEASES).unwrap();
    let kv = &get(&m, b"a", b"", 0).unwrap().kvs[0];
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (6, 6, 1));
}

#[test]
fn a_compare_and_swap_runs_one_branch_and_a_refused_txn_changes_nothing() {
    let mut m = Store::new();
    m.txn(&one(put(b"k", b"v1")), NO_LEASES).unwrap();
    let cas = |expect: &[u8], new: &[u8]| PbTxnRequest {
        compare: vec![PbCompare {
            key: b"k".to_vec(),
            result: 0,
            target: 3,
            target_union: Some(PbTargetUnion::Value(expect.to_vec())),
            range_end: vec![],
        }],
        success: vec![put(b"k", new)],
        failure: vec![],
    };
    let done = m.txn(&cas(b"v1", b"v2"), NO_LEASES).unwrap();
    assert!(done.succeeded);
    let Some(PbTxnOpResponse::ResponsePut(p)) = &done.responses[0].response else {
        panic!("{done:?}")
    };
    assert_eq!(p.prev_kv.as_ref().unwrap().value, b"v1");
    let done = m.txn(&cas(b"v1", b"v3"), NO_LEASES).unwrap();
    assert!(!done.succeeded);
    assert_eq!(done.revision, 3, "the failed branch wrote nothing");
    // A put with a lease that does not exist: refused whole, nothing written.
    let mut with_lease = put(b"other", b"x");
    if let Some(PbTxnOpRequest::RequestPut(p)) = &mut with_lease.request {
        p.lease = 7;
    }
    let txn = PbTxnRequest {
        success: vec![put(b"first", b"x"), with_lease],
        ..Default::default()
    };
    let before = m.rows();
    assert_eq!(m.txn(&txn, NO_LEASES), Err(MvccError::LeaseNotFound));
    assert_eq!(m.rows(), before);
    let dup = PbTxnRequest {
        success: vec![put(b"d", b"1"), put(b"d", b"2")],
        ..Default::default()
    };
    assert_eq!(m.txn(&dup, NO_LEASES), Err(MvccError::DuplicateKey));
}

#[test]
fn compaction_keeps_each_keys_version_at_the_revision_and_refuses_reads_below() {
    let mut m = Store::new();
    for v in [b"1", b"2", b"3"] {
        m.txn(&one(put(b"k", v)), NO_LEASES).unwrap();
    }
    m.txn(&one(put(b"gone", b"x")), NO_LEASES).unwrap(); // rev 5
    let rev = m.with(|b| {
        let mut w = b.write();
        w.delete(b"gone").unwrap();
        w.commit()
    });
    assert_eq!(rev, 6);
    m.compact(6).unwrap();
    assert_eq!(get(&m, b"k", b"", 5), Err(MvccError::Compacted));
    assert_eq!(get(&m, b"k", b"", 6).unwrap().kvs[0].value, b"3");
    assert_eq!(m.compact(6), Err(MvccError::Compacted));
    assert_eq!(m.compact(7), Err(MvccError::FutureRev));
    assert_eq!(
        m.ks.read(|v| v.events(b"k", b"", 5, false, 100)),
        Err(MvccError::Compacted)
    );
    // The sweep removes every version no read may see, and what reads see stays.
    let rows_before = m.rows().len();
    while m.with(|b| b.sweep_due()) {
        m.with(|b| b.sweep(1).unwrap());
    }
    let history: Vec<_> = m
        .rows()
        .into_iter()
        .filter(|(t, _, _)| *t == Table::History)
        .collect();
    assert!(
        history.is_empty(),
        "k's older versions and gone's are swept: {history:?}"
    );
    assert!(m.rows().len() < rows_before);
    assert_eq!(get(&m, b"k", b"", 6).unwrap().kvs[0].value, b"3");
    assert!(get(&m, b"gone", b"", 6).unwrap().kvs.is_empty());
    assert_eq!(
        m.ks.read(|v| v.events(b"k", b"", 6, false, 100))
            .unwrap()
            .events
            .len(),
        0
    );
}

#[test]
fn events_come_in_revision_order_with_the_version_before_them() {
    let mut m = Store::new();
    m.txn(&one(put(b"a", b"1")), NO_LEASES).unwrap();
    let two = PbTxnRequest {
        success: vec![put(b"c", b"x"), put(b"b", b"y")],
        ..Default::default()
    };
    m.txn(&two, NO_LEASES).unwrap();
    m.txn(&one(put(b"a", b"2")), NO_LEASES).unwrap();
    let ev = m.ks.read(|v| v.events(b"\0", b"\0", 1, true, 100)).unwrap();
    let keys: Vec<_> = ev
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().key.clone())
        .collect();
    assert_eq!(
        keys,
        [&b"a"[..], b"c", b"b", b"a"],
        "within a revision, in the txn's order"
    );
    assert_eq!(ev.events[3].prev_kv.as_ref().unwrap().value, b"1");
    assert_eq!(ev.through, 4);
    // A future start reads nothing before it.
    assert_eq!(
        m.ks.read(|v| v.events(b"a", b"", 9, false, 100))
            .unwrap()
            .through,
        8
    );
}

#[test]
fn a_watch_behind_a_long_history_of_other_keys_is_read_in_bounded_passes() {
    let mut m = Store::new();
    let others = crate::state::mvcc::watch::SCAN_BUDGET_ROWS * 3;
    for i in 0..others / 100 {
        let batch = PbTxnRequest {
            success: (0..100)
                .map(|j| put(format!("other/{i}/{j}").as_bytes(), b"v"))
                .collect(),
            ..Default::default()
        };
        m.txn(&batch, NO_LEASES).unwrap();
    }
    m.txn(&one(put(b"watched", b"1")), NO_LEASES).unwrap();
    let (mut from, mut passes, mut seen) = (1, 0, Vec::new());
    while from <= m.rev() {
        let ev =
            m.ks.read(|v| v.events(b"watched", b"", from, false, 100))
                .unwrap();
        assert!(ev.through >= from, "every pass moves on");
        seen.extend(ev.events);
        from = ev.through + 1;
        passes += 1;
    }
    assert_eq!(seen.len(), 1, "the one change of the watched key");
    assert!(
        passes >= 3,
        "{others} changes of other keys read in passes: {passes}"
    );
}

#[test]
fn replicas_that_applied_the_same_hash_alike_and_an_altered_value_changes_the_hash() {
    let no_leases = |_: i64| false;
    let (mut a, mut b) = (Store::new(), Store::new());
    for s in [&mut a, &mut b] {
        for i in 0..50u8 {
            s.txn(&one(put(&[b'k', i], &[i; 8])), &no_leases).unwrap();
        }
        s.txn(&one(put(b"k\x07", b"again")), &no_leases).unwrap();
    }
    let hash = |s: &Store, rev: i64| s.ks.read(|m| m.hash_at(rev)).unwrap();
    assert_eq!(hash(&a, 0), hash(&b, 0));
    assert_eq!(hash(&a, 20), hash(&b, 20));
    assert_ne!(
        hash(&a, 20).0,
        hash(&a, 0).0,
        "the hash is of the revision asked"
    );
    assert_eq!(hash(&a, 0).1, a.rev());
    // One replica's value altered in its engine, as a damaged file would have it.
    let mut found = None;
    let view = a.ks.engine().view().unwrap();
    view.scan(Table::Latest, &[], None, false, &mut |k, v| {
        if k.ends_with(b"k\x03") {
            found = Some((k.to_vec(), v.to_vec()));
        }
        found.is_none()
    })
    .unwrap();
    let (key, row) = found.expect("the key's latest row");
    let mut altered = row.clone();
    *altered.last_mut().unwrap() ^= 1;
    a.ks.engine()
        .write(false, |w| w.put(Table::Latest, &key, &altered))
        .unwrap();
    assert_ne!(hash(&a, 0), hash(&b, 0));
    assert!(matches!(
        a.ks.read(|m| m.hash_at(a.rev() + 1)),
        Err(MvccError::FutureRev)
    ));
}

#[test]
fn a_transaction_that_deletes_nothing_grows_by_its_puts_as_the_full_count_says() {
    let mut s = Store::new();
    s.txn(&one(put(b"a", b"1")), &|_| false).unwrap();
    let nested = PbTxnRequest {
        success: vec![put(b"b", b"22"), put(b"a", b"333")],
        ..Default::default()
    };
    let t = PbTxnRequest {
        success: vec![put(b"c", b"4444")],
        failure: vec![PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestTxn(nested)),
        }],
        ..Default::default()
    };
    assert!(!Reader::deletes(&t));
    let full = s.ks.read(|m| m.growth_bytes(&t)).unwrap();
    assert_eq!((Reader::put_growth_bytes(&t).unwrap(), 0), full);
    let deleting = one(PbTxnRequestOp {
        request: Some(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })),
    });
    assert!(Reader::deletes(&deleting));
}
