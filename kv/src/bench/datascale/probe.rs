//! `kv bench --data-scale`'s probe: one small put every [`PERIOD_MS`] to the cluster, on a
//! thread and a runtime of its own so that the bench's other requests do not delay it; each
//! put's latency or failure is kept, tagged with the phase running when it was sent.
//!
//! The probe has a connection to each of the three members and sends each put to the next in
//! turn. A put that could not be sent because that member's port refused the connection (the
//! member is down) goes to the next member at once, as etcd's Go client only sends on a
//! connection that is up; it counts as rerouted, not failed, and its latency includes the
//! refusals. Every other error (a reset, a timeout, an error answer) is a failed put.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_client::KvClient;

use crate::bench::datascale::stats::quantile;
use crate::bench::datascale::view;

/// Time between the starts of two puts (a put slower than this delays the next).
const PERIOD_MS: u64 = 20;

/// A put that takes longer than this counts as failed.
const PUT_TIMEOUT_MS: u64 = 10_000;

/// The key the probe writes (outside the load's `key/` prefix).
pub const PROBE_KEY: &str = "probe";

/// No phase: puts sent now are not reported.
const NO_PHASE: usize = usize::MAX;

/// One put.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The phase running when it was sent.
    pub phase: usize,
    /// When it was sent.
    pub at: Instant,
    /// How long it took, ms (until it failed, for a failure).
    pub latency_ms: f64,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Members that refused the connection before one took the put.
    pub rerouted: u32,
}

/// What the probe saw during a phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeStats {
    /// Puts that succeeded.
    pub puts: usize,
    /// The 99th percentile of their latencies, ms (`None`: no put succeeded).
    pub p99_ms: Option<f64>,
    /// The largest, ms (`None`: no put succeeded).
    pub max_ms: Option<f64>,
    /// Puts that failed (sent at or after the phase's cut-off).
    pub failures: u64,
    /// The first failures' reasons, a few.
    pub errors: Vec<String>,
    /// Puts sent to another member because the first one tried was down.
    pub rerouted: u64,
}

/// The running probe.
pub struct Probe {
    /// The phase the puts sent now belong to.
    phase: Arc<AtomicUsize>,
    /// Set to end the probe.
    stop: Arc<AtomicBool>,
    /// Every put sent during a phase.
    samples: Arc<Mutex<Vec<Sample>>>,
    /// The probe's thread (`None` once joined).
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Probe {
    /// Start putting to the cluster at `endpoints`; no phase yet.
    pub fn start(endpoints: Vec<String>) -> Probe {
        let phase = Arc::new(AtomicUsize::new(NO_PHASE));
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (p, s, out) = (phase.clone(), stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("the probe's runtime: {e}"))?;
            runtime.block_on(put_loop(endpoints, p, s, out))
        });
        Probe {
            phase,
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Tag the puts sent from now on with phase `index`.
    pub fn set_phase(&self, index: usize) {
        self.phase.store(index, Ordering::Relaxed);
    }

    /// What the probe saw in phase `index`, failures counted only for puts sent at or after
    /// `count_failures_from` (`None`: all of them).
    pub fn stats(&self, index: usize, count_failures_from: Option<Instant>) -> ProbeStats {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let mine = samples.iter().filter(|s| s.phase == index);
        let mut lat: Vec<f64> = Vec::new();
        let mut stats = ProbeStats::default();
        for s in mine {
            stats.rerouted += u64::from(s.rerouted > 0);
            match &s.error {
                None => lat.push(s.latency_ms),
                Some(_) if count_failures_from.is_some_and(|from| s.at < from) => {}
                Some(e) => {
                    stats.failures += 1;
                    if stats.errors.len() < 3 {
                        stats.errors.push(e.clone());
                    }
                }
            }
        }
        lat.sort_by(f64::total_cmp);
        stats.puts = lat.len();
        stats.p99_ms = (!lat.is_empty()).then(|| quantile(&lat, 0.99));
        stats.max_ms = lat.last().copied();
        stats
    }

    /// Stop the probe; why it could not run, if it could not.
    pub fn stop(mut self) -> Result<(), String> {
        self.halt()
    }

    /// Stop the thread and join it (once; later calls find nothing to join).
    fn halt(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the probe panicked".into()),
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Put [`PROBE_KEY`] every [`PERIOD_MS`] until `stop`, each put's outcome in `out`.
async fn put_loop(
    endpoints: Vec<String>,
    phase: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<Sample>>>,
) -> Result<(), String> {
    let mut members = Vec::new();
    for ep in &endpoints {
        members.push(view::connect(std::slice::from_ref(ep)).await?.kv_client());
    }
    let mut next = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        next += Duration::from_millis(PERIOD_MS);
        n += 1;
        let (at, tag) = (Instant::now(), phase.load(Ordering::Relaxed));
        let (error, rerouted) = put_once(&mut members, n).await;
        let sample = Sample {
            phase: tag,
            at,
            latency_ms: at.elapsed().as_secs_f64() * 1e3,
            error,
            rerouted,
        };
        if tag != NO_PHASE {
            out.lock().unwrap_or_else(|p| p.into_inner()).push(sample);
        }
        let now = Instant::now();
        if next < now {
            next = now; // a slow put delays the next; no burst to catch up
        }
        tokio::time::sleep_until(next.into()).await;
    }
    Ok(())
}

/// Put number `n`, to member `n` mod 3 first and on to the next while one refuses the
/// connection or the connection breaks under the put (its member died): why it failed
/// (`None`: it did not), and how many members it was sent to before.
async fn put_once(members: &mut [KvClient], n: u64) -> (Option<String>, u32) {
    let count = members.len().max(1);
    let mut refused = 0u32;
    let mut why = String::from("no member");
    for k in 0..count {
        let Some(kv) = members.get_mut((n as usize + k) % count) else {
            break;
        };
        let put = kv.put(PROBE_KEY, n.to_string(), None);
        match tokio::time::timeout(Duration::from_millis(PUT_TIMEOUT_MS), put).await {
            Ok(Ok(_)) => return (None, refused),
            // Refused, or cut by the member's death: sent again to the next member.
            Ok(Err(e)) if view::refused(&e) || view::connection_lost(&e) => {
                refused += 1;
                why = e.to_string();
            }
            Ok(Err(e)) => return (Some(e.to_string()), refused),
            Err(_) => {
                return (
                    Some(format!("no answer within {PUT_TIMEOUT_MS} ms")),
                    refused,
                )
            }
        }
    }
    (
        Some(format!("every member refused the connection: {why}")),
        refused,
    )
}
