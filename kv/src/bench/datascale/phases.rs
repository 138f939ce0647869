//! The five phases of `kv bench --data-scale`, in order, on one running system while the probe
//! runs: `load` (N keys by concurrent writers), `follower_restart` (kill -9 a follower, restart
//! it, time until it serves a linearizable read), `full_restart` (the same for all three,
//! until any member serves), `member_replace` (remove a follower, wipe it, add it back, time
//! until it holds every key) and `ranges` (the whole keyspace read from a follower and from the
//! leader: full, keys only, count only).
//!
//! Around each phase the leader's raft term is read (`Status`); after each, the bench waits
//! until every member names the same leader before the next phase starts (that wait is not
//! part of the phase's duration, but the probe's puts meanwhile count in the phase).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, KvClient, Txn, TxnOp};
use prost::Message as _;

use crate::bench::datascale::probe::{Probe, ProbeStats};
use crate::bench::datascale::system::{System, MEMBERS};
use crate::bench::datascale::view::{self, View};

/// The phases, in the order they run.
pub const NAMES: [&str; 5] = [
    "load",
    "follower_restart",
    "full_restart",
    "member_replace",
    "ranges",
];

/// Concurrent writers in `load`.
pub const WRITERS: usize = 32;

/// Puts per transaction in `load`.
pub const TXN_PUTS: u64 = 100;

/// Bytes per loaded value.
pub const VALUE_BYTES: usize = 256;

/// The prefix of every loaded key (the probe's key is outside it).
pub const KEY_PREFIX: &str = "key/";

/// The longest wait for a member to serve, hold every key or agree on the leader.
const WAIT: Duration = Duration::from_secs(900);

/// A writer's transaction that keeps failing this long ends the load with an error.
const WRITER_GIVE_UP: Duration = Duration::from_secs(120);

/// The longest one range of the whole keyspace may take, ms.
const RANGE_TIMEOUT_MS: u64 = 600_000;

/// Whether phase `name` restarts members (elections are expected there).
pub fn is_restart(name: &str) -> bool {
    matches!(name, "follower_restart" | "full_restart")
}

/// Loaded key number `k`.
pub fn key(k: u64) -> String {
    format!("{KEY_PREFIX}{k:010}")
}

/// Loaded key `k`'s value: [`VALUE_BYTES`] pseudo-random bytes (splitmix64 seeded by `k`), so
/// that neither system gains from compressing them.
fn value(k: u64) -> Vec<u8> {
    let mut state = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = Vec::with_capacity(VALUE_BYTES);
    while out.len() < VALUE_BYTES {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(VALUE_BYTES);
    out
}

/// One range of the whole keyspace from one member.
#[derive(Debug, Clone)]
pub struct Ranged {
    /// `follower` or `leader`.
    pub member: &'static str,
    /// `full`, `keys_only` or `count_only`.
    pub kind: &'static str,
    /// How long it took, ms (`None`: it failed).
    pub ms: Option<f64>,
    /// The size of the answer's protobuf encoding, bytes.
    pub answer_bytes: u64,
    /// The keys it counted.
    pub count: i64,
}

/// A phase's own requests that failed: how many, and the first few reasons.
#[derive(Debug, Default)]
struct Failures(Mutex<(u64, Vec<String>)>);

impl Failures {
    /// Count one failure, for `why`.
    fn note(&self, why: String) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f.0 += 1;
        if f.1.len() < 3 {
            f.1.push(why);
        }
    }

    /// How many, and the first reasons.
    fn take(&self) -> (u64, Vec<String>) {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What a phase's own work measured.
#[derive(Debug, Default)]
struct Outcome {
    /// Its own requests that failed, and the first reasons.
    failures: (u64, Vec<String>),
    /// The probe's failures count from here on (`None`: all of them).
    count_failures_from: Option<Instant>,
    /// `load`: keys written per second.
    keys_per_s: Option<f64>,
    /// The restarts: ms from the restart to the first linearizable read served.
    time_to_serve_ms: Option<f64>,
    /// `member_replace`: ms from the member's addition until it held every key.
    time_to_every_key_ms: Option<f64>,
    /// `ranges`: each range.
    ranges: Vec<Ranged>,
    /// What else happened (membership changes refused before they were accepted).
    notes: Vec<String>,
}

/// One phase's measurements.
#[derive(Debug, Clone)]
pub struct Phase {
    /// One of [`NAMES`].
    pub name: &'static str,
    /// Wall time of the phase's own work, ms.
    pub duration_ms: f64,
    /// What the probe saw.
    pub probe: ProbeStats,
    /// The phase's own requests that failed.
    pub own_failures: u64,
    /// The first reasons they failed.
    pub own_errors: Vec<String>,
    /// The leader before the phase.
    pub before: View,
    /// The leader after it (once every member agreed on it).
    pub after: View,
    /// `load`: keys written per second.
    pub keys_per_s: Option<f64>,
    /// The restarts: ms until the restarted member (any member, after a full restart) served
    /// its first linearizable read.
    pub time_to_serve_ms: Option<f64>,
    /// `member_replace`: ms from the new member's addition until it held every key.
    pub time_to_every_key_ms: Option<f64>,
    /// `ranges`: each range.
    pub ranges: Vec<Ranged>,
    /// What else happened (membership changes refused before they were accepted).
    pub notes: Vec<String>,
}

impl Phase {
    /// Failed client requests: the probe's and the phase's own.
    pub fn failed_requests(&self) -> u64 {
        self.probe.failures + self.own_failures
    }

    /// Elections during the phase: how far the leader's raft term moved.
    pub fn elections(&self) -> u64 {
        self.after.term.saturating_sub(self.before.term)
    }
}

/// Run every phase on `sys`, the probe tagging its puts with each in turn; `on_end` sees
/// each phase as it ends.
pub async fn run_all(
    sys: &mut System,
    probe: &Probe,
    keys: u64,
    on_end: &dyn Fn(&Phase),
) -> Result<Vec<Phase>, String> {
    let mut phases = Vec::new();
    for (i, &name) in NAMES.iter().enumerate() {
        let endpoints = sys.endpoints().to_vec();
        let before = view::settled(&endpoints, WAIT).await?;
        probe.set_phase(i);
        let t0 = Instant::now();
        let out = match name {
            "load" => load(&endpoints, keys).await?,
            "follower_restart" => follower_restart(sys, before).await?,
            "full_restart" => full_restart(sys).await?,
            "member_replace" => member_replace(sys, before, keys).await?,
            _ => ranges(&endpoints, before).await?,
        };
        let duration_ms = ms(t0.elapsed());
        let after = view::settled(sys.endpoints(), WAIT).await?;
        let phase = Phase {
            name,
            duration_ms,
            probe: probe.stats(i, out.count_failures_from),
            own_failures: out.failures.0,
            own_errors: out.failures.1,
            before,
            after,
            keys_per_s: out.keys_per_s,
            time_to_serve_ms: out.time_to_serve_ms,
            time_to_every_key_ms: out.time_to_every_key_ms,
            ranges: out.ranges,
            notes: out.notes,
        };
        on_end(&phase);
        phases.push(phase);
    }
    Ok(phases)
}

/// `d` in milliseconds.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `load`: `keys` keys by [`WRITERS`] writers through one client of the whole cluster.
async fn load(endpoints: &[String], keys: u64) -> Result<Outcome, String> {
    let client = view::connect(endpoints).await?;
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Failures::default());
    let t0 = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (kv, next, failures) = (view::kv(&client), next.clone(), failures.clone());
        writers.spawn(writer(kv, next, keys, failures));
    }
    while let Some(done) = writers.join_next().await {
        done.map_err(|e| format!("a writer panicked: {e}"))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Outcome {
        failures: failures.take(),
        keys_per_s: Some(keys as f64 / secs.max(f64::MIN_POSITIVE)),
        ..Outcome::default()
    })
}

/// One writer: transactions of [`TXN_PUTS`] puts, batch after batch (taken from `next`) until
/// `keys` are written; a failed transaction is counted and tried again.
async fn writer(
    mut kv: KvClient,
    next: Arc<AtomicU64>,
    keys: u64,
    failures: Arc<Failures>,
) -> Result<(), String> {
    let batches = keys.div_ceil(TXN_PUTS);
    loop {
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= batches {
            return Ok(());
        }
        let ops: Vec<TxnOp> = (b * TXN_PUTS..keys.min((b + 1) * TXN_PUTS))
            .map(|k| TxnOp::put(key(k), value(k), None))
            .collect();
        let txn = Txn::new().and_then(ops);
        let first_try = Instant::now();
        while let Err(e) = view::within(60_000, kv.txn(txn.clone())).await {
            failures.note(e.clone());
            if first_try.elapsed() > WRITER_GIVE_UP {
                return Err(format!("batch {b} kept failing: {e}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `follower_restart`: kill -9 a follower, restart it, time until it serves.
async fn follower_restart(sys: &mut System, before: View) -> Result<Outcome, String> {
    let slot = before.follower(MEMBERS);
    sys.kill9(slot);
    sys.spawn(slot)?;
    let t0 = Instant::now();
    let served = view::first_served(&sys.endpoints()[slot], t0 + WAIT).await?;
    Ok(Outcome {
        time_to_serve_ms: Some(ms(served - t0)),
        ..Outcome::default()
    })
}

/// `full_restart`: kill -9 all three, restart them, time until any serves; the probe's
/// failures count from then on.
async fn full_restart(sys: &mut System) -> Result<Outcome, String> {
    for slot in 0..MEMBERS {
        sys.kill9(slot);
    }
    for slot in 0..MEMBERS {
        sys.spawn(slot)?;
    }
    let t0 = Instant::now();
    let mut waits = tokio::task::JoinSet::new();
    for ep in sys.endpoints() {
        let ep = ep.clone();
        waits.spawn(async move { view::first_served(&ep, t0 + WAIT).await });
    }
    let mut last = String::from("no member");
    while let Some(done) = waits.join_next().await {
        match done.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(served) => {
                return Ok(Outcome {
                    time_to_serve_ms: Some(ms(served - t0)),
                    count_failures_from: Some(served),
                    ..Outcome::default()
                })
            }
            Err(e) => last = e,
        }
    }
    Err(format!("after the full restart no member served: {last}"))
}

/// `member_replace`: replace a follower, time until the new member holds every key, then wait
/// until the membership is whole.
async fn member_replace(sys: &mut System, before: View, keys: u64) -> Result<Outcome, String> {
    let slot = before.follower(MEMBERS);
    let replaced = sys.replace(slot, before).await?;
    let (ep, added) = (sys.endpoints()[slot].clone(), replaced.added);
    let has_all = view::holds_all(&ep, KEY_PREFIX, keys, added + WAIT).await?;
    sys.wait_members(WAIT).await?;
    Ok(Outcome {
        time_to_every_key_ms: Some(ms(has_all - added)),
        notes: replaced.notes,
        ..Outcome::default()
    })
}

/// `ranges`: the whole keyspace, full, keys only and count only (linearizable), from a
/// follower and from the leader, each alone.
async fn ranges(endpoints: &[String], before: View) -> Result<Outcome, String> {
    let failures = Failures::default();
    let mut out = Vec::new();
    let members = [
        ("follower", before.follower(MEMBERS)),
        ("leader", before.leader_slot),
    ];
    for (member, slot) in members {
        let client = view::connect(&[endpoints[slot].clone()]).await?;
        let mut kv = view::kv(&client);
        for kind in ["full", "keys_only", "count_only"] {
            let options = match kind {
                "full" => GetOptions::new().with_all_keys(),
                "keys_only" => GetOptions::new().with_all_keys().with_keys_only(),
                _ => GetOptions::new().with_all_keys().with_count_only(),
            };
            let t0 = Instant::now();
            let got = view::within(RANGE_TIMEOUT_MS, kv.get("", Some(options))).await;
            let took = ms(t0.elapsed());
            let mut r = Ranged {
                member,
                kind,
                ms: None,
                answer_bytes: 0,
                count: 0,
            };
            match got {
                Ok(resp) => {
                    r.ms = Some(took);
                    r.answer_bytes = resp.0.encoded_len() as u64;
                    r.count = resp.count();
                }
                Err(e) => failures.note(format!("{member} {kind}: {e}")),
            }
            out.push(r);
        }
    }
    Ok(Outcome {
        failures: failures.take(),
        ranges: out,
        ..Outcome::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_in_load_order_and_values_differ() {
        assert_eq!(key(7), "key/0000000007");
        assert!(key(9) < key(10));
        let (a, b) = (value(1), value(2));
        assert_eq!((a.len(), b.len()), (VALUE_BYTES, VALUE_BYTES));
        assert_ne!(a, b);
        assert_eq!(a, value(1));
    }
}
