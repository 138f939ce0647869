//! Compatibility checks through the Rust `etcd-client` crate, each run against this store and
//! against etcd 3.4 (see `etcd.rs`): what a client of etcd relies on, answer by answer.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaseTimeToLiveOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};

use crate::target::Target;

/// A runtime for a test's client.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A client of every endpoint.
pub async fn client(t: &Target) -> Client {
    Client::connect(t.endpoints(), None).await.expect("connect")
}

/// A client of one endpoint.
pub async fn client_of(ep: &str) -> Client {
    Client::connect([ep], None).await.expect("connect")
}

/// The next message of a watch, within 10 s.
async fn next(w: &mut etcd_client::WatchStream) -> etcd_client::WatchResponse {
    let m = tokio::time::timeout(Duration::from_secs(10), w.message()).await;
    m.expect("a watch message in time")
        .unwrap()
        .expect("the watch is open")
}

/// The next keep-alive answer, within 10 s.
async fn next_keepalive(
    answers: &mut etcd_client::LeaseKeepAliveStream,
) -> etcd_client::LeaseKeepAliveResponse {
    let m = tokio::time::timeout(Duration::from_secs(10), answers.message()).await;
    m.expect("a keep-alive answer in time")
        .unwrap()
        .expect("the stream is open")
}

/// The gRPC status of an error.
fn status(e: etcd_client::Error) -> (tonic::Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC status: {other:?}"),
    }
}

/// `e` is etcd's refusal with `code` and exactly `text`.
fn assert_refused(e: etcd_client::Error, code: tonic::Code, text: &str) {
    assert_eq!(status(e), (code, text.to_string()));
}

fn rev(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.expect("every response has a header").revision()
}

/// Keys, revisions and ranges: the revision moves by one per change, each key keeps its create
/// and mod revision and version, past revisions read until compacted, ranges come in key order
/// with `count` and `more`, and errors have etcd's texts.
pub async fn kv_and_revisions(t: &Target) {
    let mut c = client(t).await;
    let r0 = rev(c.get("nothing", None).await.unwrap().header());
    let p = c.put("a", "1", None).await.unwrap();
    assert_eq!(
        rev(p.header()),
        r0 + 1,
        "{}: one change, one revision",
        t.name()
    );
    c.put("a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    for k in ["b", "c", "d"] {
        c.put(k, k, None).await.unwrap();
    }
    let got = c.get("a", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(
        (
            kv.value(),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version()
        ),
        (&b"2"[..], r0 + 1, r0 + 2, 2),
        "{}",
        t.name()
    );
    let old = c
        .get("a", Some(GetOptions::new().with_revision(r0 + 1)))
        .await
        .unwrap();
    assert_eq!(old.kvs()[0].value(), b"1");
    assert_eq!(
        rev(old.header()),
        r0 + 5,
        "a past read's header has the current revision"
    );
    let range = c
        .get("a", Some(GetOptions::new().with_range("d")))
        .await
        .unwrap();
    let keys: Vec<&[u8]> = range.kvs().iter().map(|k| k.key()).collect();
    assert_eq!(keys, [&b"a"[..], b"b", b"c"]);
    let limited = c
        .get("a", Some(GetOptions::new().with_from_key().with_limit(2)))
        .await
        .unwrap();
    assert_eq!(
        (limited.kvs().len(), limited.count(), limited.more()),
        (2, 4, true),
        "{}",
        t.name()
    );
    let counted = c
        .get("a", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!((counted.kvs().len(), counted.count()), (0, 1));
    let sorted = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_sort(SortTarget::Mod, SortOrder::Descend),
            ),
        )
        .await
        .unwrap();
    assert_eq!(sorted.kvs()[0].key(), b"d", "{}: newest first", t.name());
    let keys_only = c
        .get("b", Some(GetOptions::new().with_keys_only()))
        .await
        .unwrap();
    assert!(keys_only.kvs()[0].value().is_empty());
    let serial = c
        .get("b", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(serial.kvs()[0].value(), b"b");
    let filtered = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_min_mod_revision(r0 + 4),
            ),
        )
        .await
        .unwrap();
    assert_eq!(filtered.kvs().len(), 2, "{}: c and d", t.name());
    // Bytes, NULs and all.
    let key = vec![0u8, 1, 255, b'k'];
    c.put(key.clone(), vec![0u8, 0, 7], None).await.unwrap();
    assert_eq!(
        c.get(key.clone(), None).await.unwrap().kvs()[0].value(),
        [0, 0, 7]
    );
    let del = c
        .delete(
            "a",
            Some(DeleteOptions::new().with_range("c").with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!((del.deleted(), del.prev_kvs().len()), (2, 2));
    let none = c.delete("zzz", None).await.unwrap();
    assert_eq!(
        (none.deleted(), rev(none.header())),
        (0, rev(del.header())),
        "a delete of nothing changes nothing"
    );
    let e = c
        .get("a", Some(GetOptions::new().with_revision(10_000)))
        .await
        .unwrap_err();
    assert_refused(
        e,
        tonic::Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
    let e = c.put("", "v", None).await.unwrap_err();
    assert_refused(
        e,
        tonic::Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    let e = c
        .put("k", "v", Some(PutOptions::new().with_lease(123_456)))
        .await
        .unwrap_err();
    assert_refused(
        e,
        tonic::Code::NotFound,
        "etcdserver: requested lease not found",
    );
    let e = c
        .put("never", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap_err();
    assert_refused(e, tonic::Code::InvalidArgument, "etcdserver: key not found");
}

/// Transactions: compares on value, version, create and mod revision over a key and over a
/// range, one branch, nested transactions, the header's revision is the writes' (the lock
/// recipe compares it with the key's create revision), and a key written twice is refused.
pub async fn transactions(t: &Target) {
    let mut c = client(t).await;
    c.put("t/a", "1", None).await.unwrap();
    c.put("t/b", "1", None).await.unwrap();
    let cas = |expect: &str, new: &str| {
        Txn::new()
            .when([Compare::value("t/a", CompareOp::Equal, expect)])
            .and_then([TxnOp::put("t/a", new, None)])
            .or_else([TxnOp::get("t/a", None)])
    };
    let ok = c.txn(cas("1", "2")).await.unwrap();
    assert!(ok.succeeded(), "{}", t.name());
    let written = rev(ok.header());
    let got = c.get("t/a", None).await.unwrap();
    assert_eq!(
        got.kvs()[0].mod_revision(),
        written,
        "the txn's header is its writes' revision"
    );
    let failed = c.txn(cas("1", "3")).await.unwrap();
    assert!(!failed.succeeded());
    match &failed.op_responses()[0] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"2"),
        other => panic!("{other:?}"),
    }
    // Over a range: every key must hold.
    let all_v1 = Txn::new()
        .when([Compare::version("t/", CompareOp::Greater, 0).with_prefix()])
        .and_then([TxnOp::put("t/c", "x", None)]);
    assert!(c.txn(all_v1).await.unwrap().succeeded());
    let all_one = Txn::new().when([Compare::version("t/", CompareOp::Equal, 1).with_prefix()]);
    assert!(
        !c.txn(all_one).await.unwrap().succeeded(),
        "t/a is at version 2"
    );
    // A missing key compares as zeros: the lock recipe's "create_revision == 0".
    let create = Txn::new()
        .when([Compare::create_revision("t/new", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("t/new", "mine", None)]);
    let created = c.txn(create).await.unwrap();
    assert!(created.succeeded());
    let kv = c.get("t/new", None).await.unwrap();
    assert_eq!(kv.kvs()[0].create_revision(), rev(created.header()));
    let mod_lt = Txn::new().when([Compare::mod_revision(
        "t/new",
        CompareOp::Less,
        rev(created.header()) + 1,
    )]);
    assert!(c.txn(mod_lt).await.unwrap().succeeded());
    // Nested, both levels at one revision.
    let before = rev(c.get("t/a", None).await.unwrap().header());
    let inner = Txn::new()
        .when([Compare::value("t/b", CompareOp::Equal, "1")])
        .and_then([TxnOp::put("t/inner", "yes", None)]);
    let outer = Txn::new().and_then([TxnOp::put("t/outer", "yes", None), TxnOp::txn(inner)]);
    let nested = c.txn(outer).await.unwrap();
    assert_eq!(rev(nested.header()), before + 1, "{}", t.name());
    let inner_kv = c.get("t/inner", None).await.unwrap();
    assert_eq!(inner_kv.kvs()[0].mod_revision(), before + 1);
    let dup = Txn::new().and_then([TxnOp::put("t/d", "1", None), TxnOp::put("t/d", "2", None)]);
    let e = c.txn(dup).await.unwrap_err();
    assert_refused(
        e,
        tonic::Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    let many: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("t/m{i}"), "v", None))
        .collect();
    let e = c.txn(Txn::new().and_then(many)).await.unwrap_err();
    assert_refused(
        e,
        tonic::Code::InvalidArgument,
        "etcdserver: too many operations in txn request",
    );
}

/// Compaction: reads below it get etcd's `compacted` error, at it they are served, and a watch
/// from below it is canceled with `compact_revision` set.
pub async fn compaction(t: &Target) {
    let mut c = client(t).await;
    let first = rev(c.put("cmp", "1", None).await.unwrap().header());
    c.put("cmp", "2", None).await.unwrap();
    let last = rev(c.put("cmp", "3", None).await.unwrap().header());
    c.compact(last - 1, None).await.unwrap();
    let e = c
        .get("cmp", Some(GetOptions::new().with_revision(first)))
        .await
        .unwrap_err();
    assert_refused(
        e,
        tonic::Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    let at = c
        .get("cmp", Some(GetOptions::new().with_revision(last - 1)))
        .await
        .unwrap();
    assert_eq!(at.kvs()[0].value(), b"2");
    let e = c.compact(last - 1, None).await.unwrap_err();
    assert_eq!(status(e).0, tonic::Code::OutOfRange, "{}", t.name());
    let mut w = c
        .watch("cmp", Some(WatchOptions::new().with_start_revision(first)))
        .await
        .unwrap();
    let created = w.message().await.unwrap().unwrap();
    assert!(created.created());
    let canceled = loop {
        let m = w.message().await.unwrap().unwrap();
        if m.canceled() {
            break m;
        }
    };
    assert_eq!(canceled.compact_revision(), last - 1, "{}", t.name());
}

/// Watches: the created answer, history from a start revision with the version before each
/// change, live events in revision order with a txn's events at one revision, filters,
/// progress, cancel.
pub async fn watches(t: &Target) {
    let mut c = client(t).await;
    let start = rev(c.put("w/a", "1", None).await.unwrap().header());
    c.put("w/a", "2", None).await.unwrap();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start)
        .with_prev_key();
    let mut w = c.watch("w/", Some(opts)).await.unwrap();
    let created = w.message().await.unwrap().unwrap();
    assert!(
        created.created() && created.watch_id() != -1,
        "{}",
        t.name()
    );
    let txn = Txn::new().and_then([TxnOp::put("w/b", "x", None), TxnOp::delete("w/a", None)]);
    let txn_rev = rev(c.txn(txn).await.unwrap().header());
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let m = tokio::time::timeout(Duration::from_secs(10), w.message())
            .await
            .expect("events in time");
        for e in m.unwrap().unwrap().events() {
            let kv = e.kv().unwrap();
            let prev = e.prev_kv().map(|p| p.value().to_vec());
            seen.push((e.event_type(), kv.key().to_vec(), kv.mod_revision(), prev));
        }
    }
    let expect = vec![
        (EventType::Put, b"w/a".to_vec(), start, None),
        (
            EventType::Put,
            b"w/a".to_vec(),
            start + 1,
            Some(b"1".to_vec()),
        ),
        (EventType::Put, b"w/b".to_vec(), txn_rev, None),
        (
            EventType::Delete,
            b"w/a".to_vec(),
            txn_rev,
            Some(b"2".to_vec()),
        ),
    ];
    assert_eq!(seen, expect, "{}", t.name());
    // Progress: a response with no events at the current revision.
    w.request_progress().await.unwrap();
    let progress = next(&mut w).await;
    assert!(progress.events().is_empty());
    assert_eq!(rev(progress.header()), txn_rev);
    let id = created.watch_id();
    w.cancel(id).await.unwrap();
    let m = next(&mut w).await;
    assert!(m.canceled(), "{}", t.name());
    // Filters: deletes only.
    let opts = WatchOptions::new().with_filters([etcd_client::WatchFilterType::NoPut]);
    let mut d = c.watch("w/b", Some(opts)).await.unwrap();
    assert!(d.message().await.unwrap().unwrap().created());
    c.put("w/b", "y", None).await.unwrap();
    c.delete("w/b", None).await.unwrap();
    let m = next(&mut d).await;
    assert_eq!(m.events().len(), 1);
    assert_eq!(m.events()[0].event_type(), EventType::Delete);
}

/// Leases: grant, keep-alive, time to live with keys, list, revoke deleting its keys in one
/// revision; unknown leases answer as etcd's do.
pub async fn leases(t: &Target) {
    let mut c = client(t).await;
    let g = c.lease_grant(20, None).await.unwrap();
    let id = g.id();
    assert!(id > 0 && g.ttl() >= 20, "{}", t.name());
    c.put("l/a", "1", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    c.put("l/b", "1", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    let (mut keeper, mut answers) = c.lease_keep_alive(id).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let a = next_keepalive(&mut answers).await;
    assert_eq!((a.id(), a.ttl()), (id, 20), "{}", t.name());
    let ttl = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    let mut keys = ttl.keys().to_vec();
    keys.sort();
    assert_eq!(keys, [b"l/a".to_vec(), b"l/b".to_vec()]);
    assert!(
        ttl.ttl() > 0 && ttl.ttl() <= 20 && ttl.granted_ttl() == 20,
        "{ttl:?}"
    );
    let listed = c.leases().await.unwrap();
    assert!(listed.leases().iter().any(|l| l.id() == id));
    let before = rev(c.get("l/a", None).await.unwrap().header());
    c.lease_revoke(id).await.unwrap();
    let after = c
        .get("l/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(
        (after.kvs().len(), rev(after.header())),
        (0, before + 1),
        "{}: one revision for both keys",
        t.name()
    );
    let gone = c.lease_time_to_live(id, None).await.unwrap();
    assert_eq!(gone.ttl(), -1, "{}", t.name());
    let e = c.lease_revoke(id).await.unwrap_err();
    assert_refused(
        e,
        tonic::Code::NotFound,
        "etcdserver: requested lease not found",
    );
    // A keep-alive of a lease that is gone answers TTL 0.
    keeper.keep_alive().await.unwrap();
    let a = next_keepalive(&mut answers).await;
    assert_eq!(a.ttl(), 0, "{}", t.name());
    // A compare on a key's lease (etcdctl's txn cannot: it panics on lease compares).
    let g2 = c.lease_grant(20, None).await.unwrap();
    c.put("l/c", "1", Some(PutOptions::new().with_lease(g2.id())))
        .await
        .unwrap();
    let by_lease = Txn::new().when([Compare::lease("l/c", CompareOp::Equal, g2.id())]);
    assert!(c.txn(by_lease).await.unwrap().succeeded(), "{}", t.name());
}

/// Any member takes any request: a write sent to each member in turn applies, and a
/// linearizable read at every member sees the write acknowledged just before it.
pub async fn any_member(t: &Target) {
    for (i, ep) in t.endpoints().iter().enumerate() {
        let mut c = client_of(ep).await;
        let key = format!("any/{i}");
        let written = rev(c.put(key.clone(), "v", None).await.unwrap().header());
        for other in t.endpoints() {
            let mut r = client_of(&other).await;
            let got = r.get(key.clone(), None).await.unwrap();
            assert_eq!(
                got.kvs().len(),
                1,
                "{}: a linearizable read at {other} after a write at {ep}",
                t.name()
            );
            assert!(rev(got.header()) >= written);
        }
    }
    let mut c = client(t).await;
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3, "{}", t.name());
    for m in members.members() {
        assert!(!m.client_urls().is_empty() && !m.is_learner(), "{m:?}");
    }
    for ep in t.endpoints() {
        let s = client_of(&ep).await.status().await.unwrap();
        assert!(
            s.leader() != 0 && s.version().starts_with("3.4"),
            "{}: {s:?}",
            t.name()
        );
    }
}
