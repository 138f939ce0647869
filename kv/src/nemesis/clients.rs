//! The nemesis's clients: writers of unique values, readers in every mode pinned to every node
//! (a node that was paused still gets reads, queued in its sockets, as a real client's would be),
//! and lockers (a session, a lock, writes fenced with its token, keep-alives, unlock).
//!
//! A client does not wait long for an answer: after `PATIENCE` it issues its next operation while
//! the first stays outstanding (at most `MAX_IN_FLIGHT`), so reads are invoked all through a
//! pause and are answered when the node resumes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use super::ops::{Call, Recorder, Ret};
use super::procs::{call, redirect, NoAnswer, MAX_IDS};

/// How long a client waits before it issues its next operation anyway.
const PATIENCE: Duration = Duration::from_millis(200);
/// Operations one client has outstanding at most.
const MAX_IN_FLIGHT: usize = 16;
/// A request's deadline (the node answers 504 after 5 s).
pub const OP_TIMEOUT: Duration = Duration::from_secs(7);
/// Keys the writers and readers share.
pub const KEYS: u64 = 8;
/// The lock the lockers contend for.
const LOCK: &str = "L0";

/// What every client shares.
#[derive(Clone)]
pub struct Shared {
    /// The history.
    pub rec: Recorder,
    /// HTTP addresses by id (index 0 unused).
    pub addrs: Arc<Vec<String>>,
    /// The ids clients send to (the members, running or not).
    pub targets: Arc<RwLock<Vec<u64>>>,
    /// Set to stop.
    pub stop: Arc<AtomicBool>,
    /// Pause between a client's operations.
    pub think: Duration,
    /// Readers also read with `read=local` (the nodes run follower read leases).
    pub local_reads: bool,
}

impl Shared {
    fn id_of(&self, addr: &str) -> u64 {
        self.addrs.iter().position(|a| a == addr).unwrap_or(0) as u64
    }

    fn target(&self, pick: usize) -> u64 {
        let t = self.targets.read();
        t[pick % t.len()]
    }
}

/// Send a request to node `id`, following up to 3 redirects. Returns the node that answered last.
pub fn exchange(
    s: &Shared,
    id: u64,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u64, Result<(u16, Value), NoAnswer>) {
    let (mut node, mut path) = (id, path.to_string());
    for _ in 0..4 {
        let a = match call(
            &s.addrs[node as usize],
            method,
            &path,
            body,
            &[],
            OP_TIMEOUT,
        ) {
            Ok(a) => a,
            Err(e) => return (node, Err(e)),
        };
        match redirect(&a).map(|(addr, p)| (s.id_of(&addr), p)) {
            Some((next, p)) if next != 0 => (node, path) = (next, p),
            _ => {
                return (
                    node,
                    Ok((
                        a.status,
                        serde_json::from_str(&a.body).unwrap_or(Value::Null),
                    )),
                )
            }
        }
    }
    (node, Ok((307, Value::Null)))
}

/// Codes that say a request had no effect.
fn no_effect(code: u16, error: &str) -> bool {
    matches!(code, 307 | 400..=499)
        || (code == 503
            && matches!(
                error,
                "not_leader"
                    | "no_leader"
                    | "overloaded"
                    | "not_applied"
                    | "not_ready"
                    | "lease_not_held"
            ))
}

/// The result of a write-like call from an answer.
fn judge(call: &Call, answer: Result<(u16, Value), NoAnswer>) -> Ret {
    let (code, body) = match answer {
        Ok(a) => a,
        Err(NoAnswer::NotSent(why)) => return Ret::Failed { why },
        Err(NoAnswer::Lost(why)) => return Ret::Unknown { why },
    };
    let err = body["error"].as_str().unwrap_or_default().to_string();
    if code == 200 {
        let n = |k: &str| body[k].as_u64();
        let ok = match call {
            Call::Put { .. } => n("revision").map(|revision| Ret::Written { revision }),
            Call::Session => n("id").map(|id| Ret::Session { id }),
            Call::KeepAlive { .. } => n("refreshed").map(|r| Ret::Refreshed { alive: r == 1 }),
            Call::Lock { .. } => n("token").map(|token| Ret::Token { token }),
            Call::Unlock { .. } => Some(Ret::Unlocked),
            Call::Get { .. } | Call::Cas { .. } => None,
        };
        return ok.unwrap_or(Ret::Unknown {
            why: format!("200 with {body}"),
        });
    }
    if let Call::Get { .. } = call {
        return Ret::Failed {
            why: format!("{code} {err}"),
        };
    }
    match no_effect(code, &err) {
        true => Ret::Failed {
            why: format!("{code} {err}"),
        },
        false => Ret::Unknown {
            why: format!("{code} {err}"),
        },
    }
}

/// A read's result from an answer.
fn judge_read(answer: Result<(u16, Value), NoAnswer>) -> Ret {
    match answer {
        Ok((200, b)) => match (b["value"].as_str(), b["revision"].as_u64()) {
            (Some(v), Some(r)) => Ret::Read {
                value: Some((v.to_string(), r)),
                served: b["read"].as_str().unwrap_or("").into(),
            },
            _ => Ret::Failed {
                why: format!("unexpected answer {b}"),
            },
        },
        Ok((404, b)) if b["error"] == "not_found" && b["read"].is_string() => Ret::Read {
            value: None,
            served: b["read"].as_str().unwrap_or("").into(),
        },
        Ok((code, b)) => Ret::Failed {
            why: format!("{code} {}", b["error"].as_str().unwrap_or("")),
        },
        Err(NoAnswer::NotSent(why) | NoAnswer::Lost(why)) => Ret::Failed { why },
    }
}

/// Run one operation: record its invocation, send it, record its completion.
pub fn run_op(s: &Shared, client: u32, node: u64, c: Call) -> Ret {
    if let Call::Cas { .. } = c {
        return Ret::Failed {
            why: "a compare-and-swap is an etcd API call (kv nemesis --etcd)".into(),
        };
    }
    let (method, path, body) = match &c {
        Call::Put { key, value, fence } => {
            let f = fence
                .as_ref()
                .map_or(String::new(), |(l, t)| format!("?fence={l}:{t}"));
            ("PUT", format!("/kv/{key}{f}"), value.clone().into_bytes())
        }
        Call::Get { key, mode, .. } => ("GET", format!("/kv/{key}?read={mode}"), Vec::new()),
        Call::Session => ("POST", "/session".into(), br#"{"ttl_ms": 2000}"#.to_vec()),
        Call::KeepAlive { session } => (
            "POST",
            "/session/keepalive".into(),
            format!("{{\"ids\": [{session}]}}").into_bytes(),
        ),
        Call::Lock { lock, session } => (
            "POST",
            format!("/lock/{lock}?session={session}"),
            Vec::new(),
        ),
        Call::Unlock {
            lock,
            session,
            token,
        } => (
            "DELETE",
            format!("/lock/{lock}?session={session}&token={token}"),
            Vec::new(),
        ),
        Call::Cas { .. } => unreachable!("refused above"),
    };
    let id = s.rec.invoke(client, node, c.clone());
    let (answered_by, answer) = exchange(s, node, method, &path, &body);
    let ret = match c {
        Call::Get { .. } => judge_read(answer),
        _ => judge(&c, answer),
    };
    s.rec.complete(id, answered_by, ret.clone());
    ret
}

/// A client that issues `next()`'s operations one after another, each on its own thread, with
/// up to `MAX_IN_FLIGHT` outstanding.
fn pipelined(s: &Shared, client: u32, mut next: impl FnMut() -> (u64, Call)) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = crossbeam_channel::unbounded::<()>();
    while !s.stop.load(Ordering::Relaxed) {
        if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            let _ = rx.recv_timeout(PATIENCE);
            continue;
        }
        let (node, c) = next();
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (s2, f, tx) = (s.clone(), in_flight.clone(), tx.clone());
        std::thread::spawn(move || {
            run_op(&s2, client, node, c);
            f.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send(());
        });
        let _ = rx.recv_timeout(PATIENCE);
        std::thread::sleep(s.think);
    }
    while in_flight.load(Ordering::Relaxed) > 0 {
        let _ = rx.recv_timeout(PATIENCE);
    }
}

/// A writer of unique values to random keys, through random members.
pub fn writer(s: Shared, client: u32, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seq = 0u64;
    pipelined(&s.clone(), client, || {
        seq += 1;
        let key = format!("k{}", rng.gen_range(0..KEYS));
        let value = format!("w{client}-{seq}");
        (
            s.target(rng.gen()),
            Call::Put {
                key,
                value,
                fence: None,
            },
        )
    });
}

/// A reader's modes in turn: with follower read leases, every other read is `local` (served by
/// the node it is sent to, whichever node leads).
const MODES: [&str; 4] = ["lease", "auto", "index", "lease"];
const MODES_WITH_LOCAL: [&str; 6] = ["lease", "local", "auto", "local", "index", "local"];

/// A reader pinned to the `slot`-th member, in lease, auto and index modes in turn (and local
/// with follower read leases).
pub fn reader(s: Shared, client: u32, slot: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut n = 0usize;
    let modes: &[&str] = match s.local_reads {
        true => &MODES_WITH_LOCAL,
        false => &MODES,
    };
    pipelined(&s.clone(), client, || {
        n += 1;
        let key = format!("k{}", rng.gen_range(0..KEYS));
        let mode = modes[n % modes.len()].to_string();
        (
            s.target(slot),
            Call::Get {
                key,
                mode,
                final_read: false,
            },
        )
    });
}

/// A locker: a session, the lock, three writes fenced with its token (keep-alives between), then
/// unlock; a new session when the old one is gone. One operation at a time.
pub fn locker(s: Shared, client: u32, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut session = None;
    let mut seq = 0u64;
    let pause = |ms: u64| std::thread::sleep(Duration::from_millis(ms));
    while !s.stop.load(Ordering::Relaxed) {
        let node = s.target(rng.gen());
        let Some(sid) = session else {
            if let Ret::Session { id } = run_op(&s, client, node, Call::Session) {
                session = Some(id);
            } else {
                pause(100);
            }
            continue;
        };
        let Ret::Token { token } = run_op(
            &s,
            client,
            node,
            Call::Lock {
                lock: LOCK.into(),
                session: sid,
            },
        ) else {
            let ka = run_op(&s, client, node, Call::KeepAlive { session: sid });
            if ka == (Ret::Refreshed { alive: false }) {
                session = None; // expired: never revived
            }
            pause(50);
            continue;
        };
        for _ in 0..3 {
            seq += 1;
            let value = format!("f{client}-{seq}");
            let fence = Some((LOCK.to_string(), token));
            run_op(
                &s,
                client,
                s.target(rng.gen()),
                Call::Put {
                    key: format!("fenced-{LOCK}"),
                    value,
                    fence,
                },
            );
            run_op(
                &s,
                client,
                s.target(rng.gen()),
                Call::KeepAlive { session: sid },
            );
        }
        run_op(
            &s,
            client,
            s.target(rng.gen()),
            Call::Unlock {
                lock: LOCK.into(),
                session: sid,
                token,
            },
        );
        pause(20);
    }
}

/// The HTTP addresses of every id, by id.
pub fn addrs(http: impl Fn(u64) -> String) -> Arc<Vec<String>> {
    Arc::new(
        (0..=MAX_IDS)
            .map(|id| if id == 0 { String::new() } else { http(id) })
            .collect(),
    )
}
