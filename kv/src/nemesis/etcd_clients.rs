//! The nemesis's clients in etcd-API mode (`kv nemesis --etcd`): through the etcd v3 gRPC API of
//! every node, with the `etcd-client` crate, a real client nobody here wrote. Writers put unique
//! values, compare-and-swap writers go through `Txn`, readers make linearizable and
//! serializable ranges at every node, a lease client grants, attaches, keeps alive and revokes,
//! and one watcher per node follows the checked keys from the first revision on, reconnecting
//! (to any node) from the revision after the last event it saw. Every operation is recorded in
//! the same history as the HTTP clients', and checked by the same checker; the watchers' events
//! are checked against the history itself (`check_watches`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checker::Anomaly;
use super::clients::{Shared, KEYS, OP_TIMEOUT};
use super::ops::{Call, Op, Ret};

/// How long a client waits before it issues its next operation anyway.
const PATIENCE: Duration = Duration::from_millis(200);
/// Operations one client has outstanding at most.
const MAX_IN_FLIGHT: usize = 16;
/// The prefix of the checked keys (`e/0` .. `e/7`).
pub const PREFIX: &str = "e/";

/// One event a watcher saw: (revision, key, put or delete, value).
pub type Seen = (i64, String, bool, String);

/// What the etcd clients share besides the HTTP clients' `Shared`.
#[derive(Clone)]
pub struct Etcd {
    /// The common part: history, targets, stop.
    pub s: Shared,
    /// etcd API addresses by id (index 0 unused).
    pub addrs: Arc<Vec<String>>,
    conns: Arc<Mutex<HashMap<u64, Client>>>,
    /// Each watcher's events, in the order it saw them.
    pub watched: Arc<Mutex<Vec<Vec<Seen>>>>,
    /// What the lease rounds found wrong.
    pub lease_anomalies: Arc<Mutex<Vec<String>>>,
}

impl Etcd {
    /// Clients of the nodes at `addrs`.
    pub fn new(s: Shared, addrs: Arc<Vec<String>>) -> Etcd {
        Etcd {
            s,
            addrs,
            conns: Arc::default(),
            watched: Arc::default(),
            lease_anomalies: Arc::default(),
        }
    }

    /// A client of node `id` (one connection per node, made on first use).
    pub async fn client(&self, id: u64) -> Option<Client> {
        if let Some(c) = self.conns.lock().get(&id) {
            return Some(c.clone());
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(OP_TIMEOUT);
        let addr = self.addrs[id as usize].clone();
        let c = tokio::time::timeout(OP_TIMEOUT, Client::connect([addr], Some(opts)))
            .await
            .ok()?
            .ok()?;
        self.conns.lock().insert(id, c.clone());
        Some(c)
    }

    /// Drop every connection: a connection's tasks live on the runtime that made it, so a new
    /// runtime needs new ones.
    pub fn forget_connections(&self) {
        self.conns.lock().clear();
    }

    fn target(&self, pick: usize) -> u64 {
        let t = self.s.targets.read();
        t[pick % t.len()]
    }
}

fn why(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    }
}

/// Run `call` at node `node` through the etcd API; its result as the checker reads it.
pub async fn run_op(e: &Etcd, node: u64, call: &Call) -> Ret {
    let Some(mut c) = e.client(node).await else {
        return Ret::Unknown {
            why: "no connection".into(),
        };
    };
    let unknown = |err: etcd_client::Error| Ret::Unknown { why: why(&err) };
    match call {
        Call::Put {
            key,
            value,
            fence: None,
        } => match c.put(key.as_str(), value.as_str(), None).await {
            Ok(r) => Ret::Written {
                revision: r.header().map_or(0, |h| h.revision()) as u64,
            },
            Err(err) => unknown(err),
        },
        Call::Cas { key, value, expect } => {
            let txn = Txn::new()
                .when([Compare::value(
                    key.as_str(),
                    CompareOp::Equal,
                    expect.as_str(),
                )])
                .and_then([TxnOp::put(key.as_str(), value.as_str(), None)]);
            match c.txn(txn).await {
                Ok(r) if r.succeeded() => Ret::Written {
                    revision: r.header().map_or(0, |h| h.revision()) as u64,
                },
                Ok(_) => Ret::Failed {
                    why: "compare failed".into(),
                },
                Err(err) => unknown(err),
            }
        }
        Call::Get { key, mode, .. } => {
            let opts = (mode == "serializable").then(|| GetOptions::new().with_serializable());
            match c.get(key.as_str(), opts).await {
                Ok(r) => Ret::Read {
                    value: r.kvs().first().map(|kv| {
                        (
                            String::from_utf8_lossy(kv.value()).to_string(),
                            kv.mod_revision() as u64,
                        )
                    }),
                    served: if mode == "serializable" {
                        "serializable".into()
                    } else {
                        "etcd".into()
                    },
                },
                Err(err) => unknown(err),
            }
        }
        other => Ret::Failed {
            why: format!("not an etcd call: {other:?}"),
        },
    }
}

/// Issue operations from `next` until stopped, each its own task, at most `MAX_IN_FLIGHT`.
async fn pipelined(e: Etcd, client: u32, mut next: impl FnMut() -> (u64, Call)) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    while !e.s.stop.load(Ordering::Relaxed) {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (node, call) = next();
        let id = e.s.rec.invoke(client, node, call.clone());
        let (e2, done) = (e.clone(), tokio::sync::oneshot::channel::<()>());
        tokio::spawn(async move {
            let ret = tokio::time::timeout(OP_TIMEOUT, run_op(&e2, node, &call))
                .await
                .unwrap_or(Ret::Unknown {
                    why: "timed out".into(),
                });
            e2.s.rec.complete(id, node, ret);
            drop(slot);
            let _ = done.0.send(());
        });
        let _ = tokio::time::timeout(PATIENCE, done.1).await;
        tokio::time::sleep(e.s.think).await;
    }
}

/// Unique puts to the checked keys, at random nodes; every other one a compare-and-swap from
/// the value a serializable read found.
async fn writer(e: Etcd, client: u32, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut n = 0u64;
    let mut last: HashMap<String, String> = HashMap::new();
    let e2 = e.clone();
    pipelined(e, client, move || {
        n += 1;
        let key = format!("{PREFIX}{}", rng.gen_range(0..KEYS));
        let value = format!("c{client}-{n}");
        let node = e2.target(rng.gen());
        let call = match (client % 2, last.get(&key)) {
            (1, Some(prev)) => Call::Cas {
                key: key.clone(),
                value: value.clone(),
                expect: prev.clone(),
            },
            _ => Call::Put {
                key: key.clone(),
                value: value.clone(),
                fence: None,
            },
        };
        last.insert(key, value);
        (node, call)
    })
    .await
}

/// Ranges at one node (by slot in the targets), linearizable and serializable.
async fn reader(e: Etcd, client: u32, slot: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let e2 = e.clone();
    pipelined(e, client, move || {
        let key = format!("{PREFIX}{}", rng.gen_range(0..KEYS));
        let mode = if rng.gen_bool(0.25) {
            "serializable"
        } else {
            "linearizable"
        };
        let call = Call::Get {
            key,
            mode: mode.into(),
            final_read: false,
        };
        (e2.target(slot), call)
    })
    .await
}

/// Leases: grant, attach a key, keep alive a few times, revoke; errors are expected under
/// faults and only counted (lease keys are not among the checked keys).
async fn leaser(e: Etcd, seed: u64) -> (u64, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut ok, mut failed) = (0u64, 0u64);
    while !e.s.stop.load(Ordering::Relaxed) {
        let node = e.target(rng.gen());
        let Some(mut c) = e.client(node).await else {
            continue;
        };
        let round = async {
            let id = c.lease_grant(5, None).await?.id();
            c.put(
                format!("lease/{id}"),
                "v",
                Some(PutOptions::new().with_lease(id)),
            )
            .await?;
            let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
            for _ in 0..3 {
                keeper.keep_alive().await?;
                answers.message().await?;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            c.lease_revoke(id).await?;
            // A revoked lease is gone, and so is its key (linearizable reads, after the ack).
            let key = c.get(format!("lease/{id}"), None).await?;
            let ttl = c.lease_time_to_live(id, None).await?.ttl();
            Ok::<Option<String>, etcd_client::Error>(match (key.kvs().len(), ttl) {
                (0, -1) => None,
                (n, ttl) => Some(format!("lease {id} revoked, then {n} keys and TTL {ttl}")),
            })
        };
        match tokio::time::timeout(OP_TIMEOUT * 2, round).await {
            Ok(Ok(None)) => ok += 1,
            Ok(Ok(Some(anomaly))) => {
                e.lease_anomalies.lock().push(anomaly);
                ok += 1;
            }
            Ok(Err(err)) => {
                if failed < 3 {
                    println!("etcd lease round at node {node}: {}", why(&err));
                }
                failed += 1;
                // A node with no leader answers at once: do not spin on it.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => failed += 1,
        }
    }
    (ok, failed)
}

/// Follow the checked keys from revision `from` at node `slot`'s target, reconnecting after
/// any error from the revision after the last event seen.
async fn watcher(e: Etcd, slot: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen: Vec<Seen> = Vec::new();
    let mut pick = slot;
    while !e.s.stop.load(Ordering::Relaxed) {
        let node = e.target(pick);
        pick += 1;
        let Some(mut c) = e.client(node).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let from = seen.last().map_or(1, |s| s.0 + 1);
        let opts = WatchOptions::new().with_prefix().with_start_revision(from);
        let Ok(Ok(mut w)) = tokio::time::timeout(OP_TIMEOUT, c.watch(PREFIX, Some(opts))).await
        else {
            continue;
        };
        // A client also resumes on its own now and then (every 1 to 3 s), as one that restarts
        // or rebalances does: each resume is a start from the revision after the last event.
        let resume_at =
            tokio::time::Instant::now() + Duration::from_millis(rng.gen_range(1000..3000));
        loop {
            if tokio::time::Instant::now() >= resume_at {
                break;
            }
            let msg = tokio::time::timeout(Duration::from_millis(500), w.message()).await;
            if e.s.stop.load(Ordering::Relaxed) {
                break;
            }
            let m = match msg {
                Err(_) => continue, // quiet: no change, or a paused node; keep waiting
                Ok(Ok(Some(m))) if !m.canceled() => m,
                Ok(_) => break,
            };
            for ev in m.events() {
                let Some(kv) = ev.kv() else { continue };
                seen.push((
                    kv.mod_revision(),
                    String::from_utf8_lossy(kv.key()).to_string(),
                    ev.event_type() == EventType::Put,
                    String::from_utf8_lossy(kv.value()).to_string(),
                ));
            }
        }
    }
    e.watched.lock().push(seen);
}

/// Start the etcd clients on their own runtime (a thread); join it for the lease counts.
pub fn start(e: &Etcd, nodes: u64, seed: u64) -> std::thread::JoinHandle<(u64, u64)> {
    let e = e.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the etcd clients");
        rt.block_on(async move {
            let mut tasks = Vec::new();
            for w in 0..2u32 {
                tasks.push(tokio::spawn(writer(
                    e.clone(),
                    1 + w,
                    seed ^ (100 + w as u64),
                )));
            }
            for slot in 0..nodes as usize {
                let client = 10 + slot as u32;
                tasks.push(tokio::spawn(reader(
                    e.clone(),
                    client,
                    slot,
                    seed ^ (200 + slot as u64),
                )));
                tasks.push(tokio::spawn(watcher(
                    e.clone(),
                    slot,
                    seed ^ (400 + slot as u64),
                )));
            }
            let leases = tokio::spawn(leaser(e.clone(), seed ^ 300));
            for t in tasks {
                let _ = t.await;
            }
            leases.await.unwrap_or((0, 0))
        })
    })
}

/// The history of the checked keys, from the first revision, as one watch at `node` reads it
/// after the faults: every event up to the current revision.
pub async fn history(e: &Etcd, node: u64) -> Result<Vec<Seen>, String> {
    let mut c = e.client(node).await.ok_or("no connection")?;
    // The checked keys are never deleted: the newest of their revisions ends their history.
    let keys = c
        .get(PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| why(&e))?;
    let now = keys
        .kvs()
        .iter()
        .map(|kv| kv.mod_revision())
        .max()
        .unwrap_or(0);
    let opts = WatchOptions::new().with_prefix().with_start_revision(1);
    let mut w = c.watch(PREFIX, Some(opts)).await.map_err(|e| why(&e))?;
    let mut out: Vec<Seen> = Vec::new();
    while out.last().is_none_or(|s| s.0 < now) && now > 0 {
        let m = tokio::time::timeout(Duration::from_secs(10), w.message())
            .await
            .map_err(|_| {
                format!(
                    "no event for 10 s at revision {:?} of {now}",
                    out.last().map(|s| s.0)
                )
            })?
            .map_err(|e| why(&e))?
            .ok_or("the watch ended")?;
        if m.canceled() {
            return Err(format!("the watch was canceled: {}", m.cancel_reason()));
        }
        for ev in m.events() {
            let kv = ev.kv().ok_or("an event with no key")?;
            out.push((
                kv.mod_revision(),
                String::from_utf8_lossy(kv.key()).to_string(),
                ev.event_type() == EventType::Put,
                String::from_utf8_lossy(kv.value()).to_string(),
            ));
        }
    }
    Ok(out)
}

/// The history itself (read through the same watch code, so checked on its own): revisions
/// never go down, no key changes twice in a revision, every event is the write of a value some
/// client invoked and was not refused, at the revision it was acknowledged with; and each
/// compare-and-swap that succeeded follows, in its key's history, the write of the value it
/// expected.
fn check_history(history: &[Seen], ops: &[Op], out: &mut Vec<Anomaly>) {
    let writes: HashMap<(&str, &str), &Op> = ops
        .iter()
        .filter_map(|op| match &op.call {
            Call::Put { key, value, .. } | Call::Cas { key, value, .. } => {
                Some(((key.as_str(), value.as_str()), op))
            }
            _ => None,
        })
        .collect();
    let mut bad = |op: usize, detail: String| {
        out.push(Anomaly {
            op,
            against: op,
            detail,
        })
    };
    let mut prev_of_key: HashMap<&str, &str> = HashMap::new();
    for (i, (rev, key, put, value)) in history.iter().enumerate() {
        if let Some(before) = i.checked_sub(1).map(|j| &history[j]) {
            if before.0 > *rev || (before.0 == *rev && &before.1 == key) {
                bad(
                    0,
                    format!("the history goes from {before:?} to {:?}", history[i]),
                );
            }
        }
        if !put {
            bad(0, format!("a delete of {key} at {rev}: no client deletes"));
            continue;
        }
        let Some(w) = writes.get(&(key.as_str(), value.as_str())) else {
            bad(0, format!("{key}={value} at {rev}: no client wrote it"));
            continue;
        };
        match w.ret() {
            Some(Ret::Failed { why }) => {
                bad(w.id, format!("{key}={value} at {rev}: refused ({why})"))
            }
            Some(Ret::Written { revision }) if *revision as i64 != *rev => bad(
                w.id,
                format!("{key}={value} at {rev}: acknowledged at {revision}"),
            ),
            _ => {}
        }
        if let Call::Cas { expect, .. } = &w.call {
            if prev_of_key.get(key.as_str()) != Some(&expect.as_str()) {
                let was = prev_of_key.get(key.as_str());
                bad(w.id, format!("compare-and-swap {key}={value} at {rev} expected {expect:?}, the value before was {was:?}"));
            }
        }
        prev_of_key.insert(key, value);
    }
}

/// Each watcher saw a prefix of the history, event for event (no change missed, none twice, none
/// out of order), the history holds every write acknowledged at its revision, and the history
/// itself holds ([`check_history`]).
pub fn check_watches(history: &[Seen], watched: &[Vec<Seen>], ops: &[Op]) -> Vec<Anomaly> {
    let mut out = Vec::new();
    check_history(history, ops, &mut out);
    for (i, seen) in watched.iter().enumerate() {
        let agree = seen.len() <= history.len() && seen[..] == history[..seen.len()];
        if !agree {
            let at = seen
                .iter()
                .zip(history)
                .position(|(a, b)| a != b)
                .unwrap_or(seen.len().min(history.len()));
            let detail = format!(
                "watcher {i}: event {at} is {:?}, the history's is {:?} ({} seen, {} in the history)",
                seen.get(at),
                history.get(at),
                seen.len(),
                history.len()
            );
            out.push(Anomaly {
                op: 0,
                against: 0,
                detail,
            });
        }
    }
    let puts: std::collections::HashSet<(i64, &str, &str)> = history
        .iter()
        .filter(|s| s.2)
        .map(|s| (s.0, s.1.as_str(), s.3.as_str()))
        .collect();
    for op in ops {
        let write = match &op.call {
            Call::Put { key, value, .. } | Call::Cas { key, value, .. } => Some((key, value)),
            _ => None,
        };
        if let (Some((key, value)), Some(Ret::Written { revision })) = (write, op.ret()) {
            if key.starts_with(PREFIX)
                && !puts.contains(&(*revision as i64, key.as_str(), value.as_str()))
            {
                let detail = format!("acknowledged {key}={value} at revision {revision} is not in the watched history");
                out.push(Anomaly {
                    op: op.id,
                    against: op.id,
                    detail,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::ops::Recorder;

    fn ops() -> Vec<Op> {
        let rec = Recorder::new(std::time::Instant::now());
        let put = |v: &str, rev: u64| {
            let id = rec.invoke(
                1,
                1,
                Call::Put {
                    key: "e/0".into(),
                    value: v.into(),
                    fence: None,
                },
            );
            rec.complete(id, 1, Ret::Written { revision: rev });
        };
        put("a", 2);
        put("b", 3);
        let cas = rec.invoke(
            2,
            1,
            Call::Cas {
                key: "e/0".into(),
                value: "c".into(),
                expect: "b".into(),
            },
        );
        rec.complete(cas, 1, Ret::Written { revision: 4 });
        rec.snapshot()
    }

    fn seen(v: &str, rev: i64) -> Seen {
        (rev, "e/0".into(), true, v.into())
    }

    #[test]
    fn a_true_history_and_its_prefixes_pass() {
        let h = vec![seen("a", 2), seen("b", 3), seen("c", 4)];
        let watched = vec![h.clone(), h[..1].to_vec(), Vec::new()];
        assert_eq!(check_watches(&h, &watched, &ops()), Vec::new());
    }

    #[test]
    fn missed_doubled_and_reordered_events_and_a_bad_history_are_each_found() {
        let h = vec![seen("a", 2), seen("b", 3), seen("c", 4)];
        let missed = vec![seen("a", 2), seen("c", 4)];
        let doubled = vec![seen("a", 2), seen("a", 2)];
        assert_eq!(check_watches(&h, &[missed, doubled], &ops()).len(), 2);
        // An acknowledged write missing from the history; a CAS after the wrong value.
        let lost = vec![seen("a", 2), seen("c", 4)];
        let found = check_watches(&lost, &[], &ops());
        assert!(
            found
                .iter()
                .any(|a| a.detail.contains("not in the watched history")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|a| a.detail.contains("compare-and-swap")),
            "{found:?}"
        );
        // Out of order, at the wrong revision, a value nobody wrote.
        let bad = vec![seen("b", 3), seen("a", 2), seen("zz", 5), seen("c", 9)];
        let found = check_watches(&bad, &[], &ops());
        for what in ["goes from", "no client wrote it", "acknowledged at"] {
            assert!(
                found.iter().any(|a| a.detail.contains(what)),
                "{what}: {found:?}"
            );
        }
    }
}
