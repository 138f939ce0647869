//! `kv bench --sessions N --ttl-ms T`: N sessions kept alive on the leader by `--conns` keep-alive
//! connections, each renewing its sessions at a third of their TTL and batching, every 20 ms,
//! the renewals that came due (as a client library would). Reports keep-alives (renewed
//! sessions) per second, request p50 and p99, the leader's CPU time per second (from `/proc`),
//! raft entries per second (all, and those keep-alives caused), and expiries: **spurious** (a
//! session answered `unknown` while the client's view of it, from the send time of its last
//! answered renewal, still held) and **lapsed** (a view that ran out before a renewal was
//! answered: the client's lateness, not the grantor's).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::client::Client;
use crate::state::kv_state::session_config;

/// What to load.
#[derive(Debug, Clone, Copy)]
pub struct SessionLoad {
    /// Sessions.
    pub sessions: usize,
    /// Their TTL.
    pub ttl_ms: u64,
    /// Keep-alive connections.
    pub conns: usize,
    /// Seconds of keep-alives, after every session is granted.
    pub seconds: u64,
}

/// What one connection saw.
#[derive(Debug, Default)]
struct ConnReport {
    renewed: u64,
    latencies_ns: Vec<u64>,
    via_raft: u64,
    spurious: u64,
    lapsed: u64,
    errors: u64,
}

/// A session as its client sees it.
struct Held {
    id: u64,
    view_end: Instant,
    next_renew: Instant,
    lapsed: bool,
}

const BATCH_EVERY: Duration = Duration::from_millis(20);

/// Grant the sessions, keep them alive for the load's time, and report, as a JSON object.
pub fn bench(addr: &str, load: &SessionLoad) -> Result<Value, String> {
    let per_conn = load.sessions.div_ceil(load.conns.max(1));
    let granted: Vec<Vec<Held>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..load.conns)
            .map(|c| {
                let n = per_conn.min(load.sessions.saturating_sub(c * per_conn));
                s.spawn(move || grant(addr, n, load.ttl_ms))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("granting panicked".into())))
            .collect::<Result<_, String>>()
    })?;
    let pid = leader_status(addr)?["pid"]
        .as_u64()
        .ok_or("no pid in /status")?;
    let (cpu0, idx0, t0) = (cpu_seconds(pid)?, last_index(addr)?, Instant::now());
    let end = t0 + Duration::from_secs(load.seconds);
    let reports: Vec<ConnReport> = std::thread::scope(|s| {
        let workers: Vec<_> = granted
            .into_iter()
            .map(|held| s.spawn(move || keep_alive(addr, held, load.ttl_ms, end)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a connection panicked".into()))
            })
            .collect::<Result<_, String>>()
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, idx1) = (cpu_seconds(pid)?, last_index(addr)?);
    Ok(summarize(load, &reports, secs, cpu1 - cpu0, idx1 - idx0))
}

fn summarize(
    load: &SessionLoad,
    reports: &[ConnReport],
    secs: f64,
    cpu_s: f64,
    entries: u64,
) -> Value {
    let mut lat: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.latencies_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let at = |q: f64| {
        let i = ((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1));
        lat.get(i).copied().unwrap_or(0) as f64 / 1e3
    };
    let sum = |f: fn(&ConnReport) -> u64| reports.iter().map(f).sum::<u64>();
    let round = |v: f64| (v * 10.0).round() / 10.0;
    json!({
        "sessions": load.sessions, "ttl_ms": load.ttl_ms, "conns": load.conns,
        "seconds": round(secs),
        "keepalives_per_s": round(sum(|r| r.renewed) as f64 / secs),
        "requests_per_s": round(lat.len() as f64 / secs),
        "p50_us": round(at(0.5)), "p99_us": round(at(0.99)),
        "leader_cpu_per_s": (cpu_s / secs * 1000.0).round() / 1000.0,
        "raft_entries_per_s": round(entries as f64 / secs),
        "keepalive_raft_entries": sum(|r| r.via_raft),
        "spurious_expiries": sum(|r| r.spurious),
        "lapsed": sum(|r| r.lapsed),
        "errors": sum(|r| r.errors),
    })
}

/// Grant `n` sessions on one connection; each first renews somewhere in [T/6, T/3] after its grant.
fn grant(addr: &str, n: usize, ttl_ms: u64) -> Result<Vec<Held>, String> {
    let mut c = Client::connect(addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let valid = Duration::from_nanos(session_config().holder_valid_ns(ttl_ms));
    let third = Duration::from_millis(ttl_ms / 3);
    let body = format!("{{\"ttl_ms\": {ttl_ms}}}");
    let mut held = Vec::with_capacity(n);
    let mut tries = 0;
    while held.len() < n {
        let sent = Instant::now();
        let a = c
            .request("POST", "/session", body.as_bytes(), &[])
            .map_err(|e| e.to_string())?;
        if a.status != 200 {
            tries += 1;
            if tries > 200 {
                return Err(format!("granting a session: {} {}", a.status, a.body));
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let v: Value = serde_json::from_str(&a.body).map_err(|e| e.to_string())?;
        let stagger = third.mul_f64(0.5 + 0.5 * (held.len() % 97) as f64 / 97.0);
        held.push(Held {
            id: v["id"].as_u64().ok_or("no session id")?,
            view_end: sent + valid,
            next_renew: sent + stagger,
            lapsed: false,
        });
    }
    Ok(held)
}

/// Renew `held` until `end`: every 20 ms, one request for the sessions that came due.
fn keep_alive(
    addr: &str,
    mut held: Vec<Held>,
    ttl_ms: u64,
    end: Instant,
) -> Result<ConnReport, String> {
    let mut c = Client::connect(addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let valid = Duration::from_nanos(session_config().holder_valid_ns(ttl_ms));
    let third = Duration::from_millis(ttl_ms / 3);
    let mut r = ConnReport::default();
    while Instant::now() < end {
        let sent = Instant::now();
        let due: Vec<usize> = (0..held.len())
            .filter(|&i| held[i].next_renew <= sent)
            .collect();
        if !due.is_empty() {
            let ids: Vec<u64> = due.iter().map(|&i| held[i].id).collect();
            let body = json!({ "ids": ids }).to_string();
            let a = c
                .request("POST", "/session/keepalive", body.as_bytes(), &[])
                .map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_str(&a.body).unwrap_or_default();
            if a.status != 200 {
                r.errors += 1; // retried at the next batch: the sessions stay due
            } else {
                r.latencies_ns.push(sent.elapsed().as_nanos() as u64);
                let unknown: Vec<u64> = v["unknown"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_u64)
                    .collect();
                let via_raft = v["via"] == "raft";
                for &i in &due {
                    let h = &mut held[i];
                    if unknown.contains(&h.id) {
                        r.spurious += (sent < h.view_end) as u64;
                        h.next_renew = end; // gone: never renewed again
                        continue;
                    }
                    r.renewed += 1;
                    r.via_raft += via_raft as u64;
                    h.view_end = sent + valid;
                    h.next_renew = sent + third;
                }
            }
        }
        for h in held
            .iter_mut()
            .filter(|h| !h.lapsed && h.view_end <= Instant::now())
        {
            h.lapsed = true;
            r.lapsed += 1;
        }
        std::thread::sleep(BATCH_EVERY.saturating_sub(sent.elapsed()));
    }
    Ok(r)
}

fn leader_status(addr: &str) -> Result<Value, String> {
    let a = crate::http::client::request(addr, "GET", "/status", b"", &[])
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&a.body).map_err(|e| e.to_string())
}

fn last_index(addr: &str) -> Result<u64, String> {
    leader_status(addr)?["last_index"]
        .as_u64()
        .ok_or_else(|| "no last_index in /status".into())
}

/// User plus system CPU time of process `pid`, in seconds (`/proc/<pid>/stat`).
fn cpu_seconds(pid: u64) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let after_comm = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("bad /proc stat")?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `after_comm` starts at field 3.
    let ticks: u64 = fields
        .get(11..13)
        .ok_or("short /proc stat")?
        .iter()
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// The report as the table's lines.
pub fn print(v: &Value) {
    println!(
        "kv bench sessions: {} sessions, TTL {} ms, {} connections, {} s (3 nodes, fsync on)",
        v["sessions"], v["ttl_ms"], v["conns"], v["seconds"]
    );
    println!(
        "keep-alives/s {}  requests/s {}  p50 {} µs  p99 {} µs  leader CPU {} s/s  raft entries/s {} (from keep-alives: {})  spurious expiries {}  lapsed {}  errors {}",
        v["keepalives_per_s"], v["requests_per_s"], v["p50_us"], v["p99_us"], v["leader_cpu_per_s"],
        v["raft_entries_per_s"], v["keepalive_raft_entries"], v["spurious_expiries"], v["lapsed"], v["errors"]
    );
}
