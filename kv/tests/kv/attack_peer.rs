//! Forged raft messages on the peer port. With mutual TLS (the default) every forgery is refused
//! and the cluster keeps serving; each control runs the same attack with `--insecure-peers` and
//! shows the damage it does when the defence is off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use raft::eraftpb::MessageType;

use crate::cluster::{http, json, metric, others, put, status, Cluster};
use crate::forge::{self, msg, Cred};

/// Every way an outsider (or a member speaking as another) can connect to the peer port.
fn creds(insecure: bool, member: u64) -> Vec<Cred> {
    if insecure {
        vec![Cred::Plain]
    } else {
        vec![
            Cred::Plain,
            Cred::NoCert,
            Cred::ForeignCa,
            Cred::Member(member),
        ]
    }
}

fn start(insecure: bool, extra: &[&'static str]) -> Cluster {
    let mut args = extra.to_vec();
    if insecure {
        args.push("--insecure-peers");
    }
    Cluster::start(3, &args)
}

/// The refusal counters of node `id`: (TLS failures, spoofed senders, refused types).
fn refusals(c: &Cluster, id: u64) -> (u64, u64, u64) {
    let p = c.port(id);
    (
        metric(p, "kv_peer_tls_failures_total"),
        metric(p, "kv_peer_spoofed_total"),
        metric(p, "kv_peer_refused_types_total"),
    )
}

fn term_and_last(port: u16) -> (u64, u64) {
    let s = status(port).expect("status");
    (
        s["term"].as_u64().unwrap(),
        s["last_index"].as_u64().unwrap(),
    )
}

struct AckAttack {
    put_code: Option<u16>,
    /// Whether the new leader lacks the PUT that was acknowledged.
    lost: bool,
    refusals: (u64, u64, u64),
}

/// The followers cut themselves off from the leader (fault injection on their side, so the
/// leader still hears anyone claiming to be them); the attacker acknowledges the leader's appends
/// as follower `f1` while a client writes. The followers then elect a leader of their own.
fn append_ack_attack(insecure: bool) -> AckAttack {
    let c = start(insecure, &["--fault-injection"]);
    let l = c.leader(&[1, 2, 3], 15);
    let f = others(l);
    for &id in &f {
        let body = format!("{{\"peers\": [{l}]}}");
        assert_eq!(
            http(c.port(id), "POST", "/admin/partition", body.as_bytes())
                .unwrap()
                .0,
            200
        );
    }
    let stop = AtomicBool::new(false);
    let put_code = std::thread::scope(|s| {
        s.spawn(|| {
            for cred in creds(insecure, f[1]).into_iter().cycle() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let (term, last) = term_and_last(c.port(l));
                let mut ack = msg(MessageType::MsgAppendResponse, f[0], l, term);
                ack.index = last;
                forge::send(&c, l, cred, &[ack]);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        let answer = http(c.port(l), "PUT", "/kv/victim", b"acked?");
        stop.store(true, Ordering::Relaxed);
        answer.map(|(code, _)| code)
    });
    let refusals = refusals(&c, l);
    let l2 = c.leader(&f, 15);
    let (code, _) = http(c.port(l2), "GET", "/kv/victim?read=index", b"").unwrap();
    for &id in &f {
        assert_eq!(http(c.port(id), "POST", "/admin/heal", b"").unwrap().0, 200);
    }
    let l3 = c.leader(&[1, 2, 3], 15);
    put(c.port(l3), "after", "served"); // the cluster still serves
    AckAttack {
        put_code,
        lost: put_code == Some(200) && code == 404,
        refusals,
    }
}

#[test]
fn forged_append_acks_are_refused_and_no_acknowledged_write_is_lost() {
    let a = append_ack_attack(false);
    eprintln!(
        "mTLS: PUT answered {:?}; lost {}; refusals (tls, spoofed, types) {:?}",
        a.put_code, a.lost, a.refusals
    );
    assert_ne!(
        a.put_code,
        Some(200),
        "the write was acknowledged without the followers"
    );
    assert!(!a.lost);
    assert!(
        a.refusals.0 >= 3,
        "plain, no-cert and foreign-CA handshakes refused: {:?}",
        a.refusals
    );
    assert!(
        a.refusals.1 >= 1,
        "a member speaking as another is refused: {:?}",
        a.refusals
    );
}

#[test]
fn control_insecure_peers_forged_append_acks_lose_an_acknowledged_write() {
    let a = append_ack_attack(true);
    eprintln!("insecure: PUT answered {:?}; lost {}", a.put_code, a.lost);
    assert_eq!(
        a.put_code,
        Some(200),
        "the forged acks did not commit the write"
    );
    assert!(a.lost, "the new leader has the write after all");
}

/// The leader is partitioned; the attacker sends follower `f1` a `MsgTimeoutNow` in the
/// leader's name. Returns whether `f1` led within 2 s (well before any election of its own: the
/// election timeout is 4 s), and whether the old leader then served the old value under its lease
/// (about 3.3 s from its last acknowledged round) after the new leader acknowledged a new one.
fn timeout_now_attack(insecure: bool) -> (bool, bool, (u64, u64, u64)) {
    let c = start(
        insecure,
        &[
            "--fault-injection",
            "--election-ms",
            "4000",
            "--heartbeat-ms",
            "100",
        ],
    );
    let l = c.leader(&[1, 2, 3], 20);
    let f = others(l);
    put(c.port(l), "k", "old");
    let (term, _) = term_and_last(c.port(l));
    let body = format!("{{\"peers\": {f:?}}}");
    assert_eq!(
        http(c.port(l), "POST", "/admin/partition", body.as_bytes())
            .unwrap()
            .0,
        200
    );
    for cred in creds(insecure, f[1]) {
        forge::send(
            &c,
            f[0],
            cred,
            &[msg(MessageType::MsgTimeoutNow, l, f[0], term)],
        );
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut led = false;
    while Instant::now() < deadline && !led {
        led = status(c.port(f[0])).is_some_and(|s| s["role"] == "leader");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut stale = false;
    if led {
        let written = (0..50).any(|_| {
            let ok =
                http(c.port(f[0]), "PUT", "/kv/k", b"new").is_some_and(|(code, _)| code == 200);
            if !ok {
                std::thread::sleep(Duration::from_millis(10));
            }
            ok
        });
        let (code, body) = http(c.port(l), "GET", "/kv/k?read=lease", b"").unwrap();
        stale = written && code == 200 && json(&body)["value"] == "old";
    }
    let refusals = refusals(&c, f[0]);
    assert_eq!(http(c.port(l), "POST", "/admin/heal", b"").unwrap().0, 200);
    if !insecure {
        let (t, _) = term_and_last(c.port(f[0]));
        assert_eq!(
            t, term,
            "the follower's term moved on a forged MsgTimeoutNow"
        );
        let l2 = c.leader(&[1, 2, 3], 20);
        put(c.port(l2), "after", "served");
    }
    (led, stale, refusals)
}

#[test]
fn forged_timeout_now_is_refused_and_starts_no_election() {
    let (led, stale, refusals) = timeout_now_attack(false);
    eprintln!(
        "mTLS: new leader within 2 s: {led}; stale lease read: {stale}; refusals {refusals:?}"
    );
    assert!(!led && !stale);
    assert!(refusals.0 >= 3 && refusals.1 >= 1, "{refusals:?}");
}

#[test]
fn control_insecure_peers_forged_timeout_now_serves_a_stale_lease_read() {
    let mut trials = Vec::new();
    while trials.len() < 3 && !trials.iter().any(|&(_, stale)| stale) {
        let (led, stale, _) = timeout_now_attack(true);
        trials.push((led, stale));
    }
    eprintln!("insecure: (new leader within 2 s, stale lease read) per trial: {trials:?}");
    assert!(
        trials.iter().any(|&(_, stale)| stale),
        "a forged MsgTimeoutNow never produced a stale lease read in 3 trials: {trials:?}"
    );
}

/// Forged heartbeats with term + 100, from "follower" f1 to the leader, every 20 ms for a second,
/// while a client writes. Returns (writes acknowledged, the leader's term after, its role).
fn high_term_attack(insecure: bool) -> (usize, u64, u64, String) {
    let c = start(insecure, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    let f = others(l);
    let (term, _) = term_and_last(c.port(l));
    let stop = AtomicBool::new(false);
    let acked = std::thread::scope(|s| {
        s.spawn(|| {
            for cred in creds(insecure, f[1]).into_iter().cycle() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let hb = msg(MessageType::MsgHeartbeat, f[0], l, term + 100);
                forge::send(&c, l, cred, &[hb]);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut acked = 0;
        while Instant::now() < deadline {
            if http(c.port(l), "PUT", "/kv/w", b"x").is_some_and(|(code, _)| code == 200) {
                acked += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        acked
    });
    let s = status(c.port(l)).unwrap();
    let role = s["role"].as_str().unwrap().to_string();
    (acked, term, s["term"].as_u64().unwrap(), role)
}

#[test]
fn forged_high_term_heartbeats_are_refused_and_the_leader_keeps_leading() {
    let (acked, before, after, role) = high_term_attack(false);
    eprintln!(
        "mTLS: {acked} writes acknowledged in 1 s under attack; term {before} -> {after}; {role}"
    );
    assert_eq!((after, role.as_str()), (before, "leader"));
    assert!(acked > 0);
}

#[test]
fn control_insecure_peers_forged_high_term_heartbeat_deposes_the_leader() {
    let (acked, before, after, role) = high_term_attack(true);
    eprintln!("insecure: {acked} writes acknowledged in 1 s under attack; term {before} -> {after}; {role}");
    assert!(
        after >= before + 100,
        "the leader's term did not jump: {before} -> {after}"
    );
}

/// Forged heartbeats to follower f0. In the leader's name, commit = 10^12, with every credential
/// (member f1's certificate included: spoofed). Then from members speaking as themselves with
/// their own certificates (a stolen key, or with `--insecure-peers` anyone): f1, which does not
/// lead, with commit = 10^12 and with commit 0, and the leader l with commit = 10^12. Returns
/// the follower's exit code, if it died.
/// A member's heartbeat acknowledgements to the leader, with its promise, with an older build's
/// bare context, and with garbage (see `forge::ack_contexts`): the leader keeps leading with its
/// lease, serves, and nothing panics.
#[test]
fn garbage_in_a_members_heartbeat_acknowledgements_is_harmless() {
    let mut c = start(false, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    let f = others(l)[0];
    put(c.port(l), "k", "v");
    let (term, _) = term_and_last(c.port(l));
    let acks: Vec<_> = forge::ack_contexts()
        .into_iter()
        .map(|ctx| {
            let mut m = msg(MessageType::MsgHeartbeatResponse, f, l, term);
            m.context = ctx.into();
            m
        })
        .collect();
    let refused_before = refusals(&c, l);
    for _ in 0..20 {
        assert!(forge::send(&c, l, Cred::Member(f), &acks));
    }
    assert_eq!(c.leader(&[1, 2, 3], 15), l, "the leader kept leading");
    assert_eq!(
        refusals(&c, l),
        refused_before,
        "a member speaking as itself is let through to raft"
    );
    assert_eq!(term_and_last(c.port(l)).0, term, "in the same term");
    let (code, body) = http(c.port(l), "GET", "/kv/k?read=lease", b"").unwrap();
    assert_eq!((code, json(&body)["value"].as_str()), (200, Some("v")));
    put(c.port(l), "k", "still served");
    assert!(c.running(l));
    let log = std::fs::read_to_string(c.log_path(l)).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

fn huge_commit_attack(insecure: bool, extra: &[&'static str]) -> (Option<i32>, Cluster, u64) {
    let mut c = start(insecure, extra);
    let l = c.leader(&[1, 2, 3], 15);
    let f = others(l);
    let (term, _) = term_and_last(c.port(l));
    let hb = |from: u64, commit: u64| {
        let mut hb = msg(MessageType::MsgHeartbeat, from, f[0], term);
        hb.commit = commit;
        hb
    };
    let mut forged: Vec<(Cred, raft::eraftpb::Message)> = creds(insecure, f[1])
        .into_iter()
        .map(|cred| (cred, hb(l, 1_000_000_000_000)))
        .collect();
    let (as_f1, as_l) = match insecure {
        true => (Cred::Plain, Cred::Plain),
        false => (Cred::Member(f[1]), Cred::Member(l)),
    };
    forged.push((as_f1, hb(f[1], 0)));
    forged.push((as_f1, hb(f[1], 1_000_000_000_000)));
    forged.push((as_l, hb(l, 1_000_000_000_000)));
    for (cred, m) in forged {
        forge::send(&c, f[0], cred, &[m]);
    }
    // Until the follower has dealt with the members' forgeries: it dropped them all, or it died.
    // A generous deadline, for a loaded machine: the wait ends as soon as either is seen.
    let members_forged = if insecure { 4 } else { 3 };
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = c.port(f[0]);
    let dropped = || {
        let (_, text) = http(port, "GET", "/metrics", b"")?;
        let line = text
            .lines()
            .find(|l| l.starts_with("kv_peer_inadmissible_total{"))?;
        line.rsplit(' ').next()?.parse::<u64>().ok()
    };
    while Instant::now() < deadline
        && c.running(f[0])
        && dropped().is_none_or(|n| n < members_forged)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let exit = (!c.running(f[0])).then(|| c.wait_exit(f[0], 5).code().unwrap_or(-1));
    (exit, c, l)
}

#[test]
fn forged_huge_commit_is_refused_and_the_follower_stays_up() {
    let (exit, c, l) = huge_commit_attack(false, &[]);
    let f = others(l)[0];
    let dropped = metric(c.port(f), "kv_peer_inadmissible_total");
    eprintln!(
        "mTLS: follower exit {exit:?}; refusals {:?}; inadmissible {dropped}",
        refusals(&c, f)
    );
    assert_eq!(exit, None, "the follower died");
    assert_eq!(status(c.port(f)).unwrap()["role"], "follower");
    put(c.port(l), "after", "served");
    assert!(refusals(&c, f).0 >= 3 && refusals(&c, f).1 >= 1);
    assert!(
        dropped >= 3,
        "members speaking as themselves were not dropped: {dropped}"
    );
}

#[test]
fn insecure_peers_forged_huge_commit_is_dropped_before_raft() {
    let (exit, c, l) = huge_commit_attack(true, &[]);
    let f = others(l)[0];
    let dropped = metric(c.port(f), "kv_peer_inadmissible_total");
    eprintln!("insecure: follower exit {exit:?}; inadmissible {dropped}");
    assert_eq!(exit, None, "the follower died");
    assert!(dropped >= 4, "{dropped}");
}

#[test]
fn control_without_admission_checks_a_member_speaking_as_itself_panics_the_follower() {
    let (exit, _, _) = huge_commit_attack(false, &["--no-admission-checks"]);
    eprintln!("mTLS, no admission checks: follower exit {exit:?}");
    assert_eq!(exit, Some(101), "raft-rs panics on a commit past its log");
}

#[test]
fn forged_proposals_are_refused_even_from_a_member_and_even_without_tls() {
    for insecure in [false, true] {
        let c = start(insecure, &[]);
        let l = c.leader(&[1, 2, 3], 15);
        let f = others(l);
        let (_, last) = term_and_last(c.port(l));
        let long_key = "x".repeat(2048);
        // Member(f[0]) is a member under its own name: still no proposals.
        for cred in creds(insecure, f[0]) {
            let props = [
                forge::propose_put(f[0], l, "forged"),
                forge::propose_put(f[0], l, &long_key),
            ];
            forge::send(&c, l, cred, &props);
        }
        std::thread::sleep(Duration::from_millis(200));
        let (code, _) = http(c.port(l), "GET", "/kv/forged?read=index", b"").unwrap();
        let (_, last_after) = term_and_last(c.port(l));
        let r = refusals(&c, l);
        eprintln!("insecure {insecure}: GET forged {code}; last index {last} -> {last_after}; refusals {r:?}");
        assert_eq!(code, 404, "a forged proposal was applied");
        assert_eq!(last_after, last, "a forged proposal reached the log");
        assert!(r.2 >= 1, "the proposal type was not refused: {r:?}");
        put(c.port(l), "after", "served");
    }
}

/// Hold `n` idle TCP connections (never a byte sent) to each of `ports`, opening a new one as
/// soon as one is closed, until `stop`. Returns how many were opened.
fn idle_flood(ports: &[u16], n: usize, stop: &AtomicBool) -> usize {
    use std::io::Read;
    let open = |p: u16| {
        std::net::TcpStream::connect(("127.0.0.1", p))
            .ok()
            .filter(|s| s.set_nonblocking(true).is_ok())
    };
    let mut conns: Vec<(u16, Option<std::net::TcpStream>)> = ports
        .iter()
        .flat_map(|&p| (0..n).map(move |_| (p, None)))
        .collect();
    let mut opened = 0;
    while !stop.load(Ordering::Relaxed) {
        for (p, c) in conns.iter_mut() {
            let closed = c.as_mut().is_none_or(|s| {
                let mut b = [0u8; 64];
                !matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            if closed {
                *c = open(*p);
                opened += usize::from(c.is_some());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    opened
}

#[test]
fn idle_sockets_on_the_peer_ports_never_stop_an_election() {
    let mut c = start(false, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    let f = others(l);
    let ports: Vec<u16> = (1..=3).map(|id| c.peer_port(id)).collect();
    let stop = AtomicBool::new(false);
    let (elected, opened) = std::thread::scope(|s| {
        let flood = s.spawn(|| idle_flood(&ports, 70, &stop));
        std::thread::sleep(Duration::from_millis(500));
        // The leader dies and a follower restarts: the two survivors must handshake anew.
        c.kill9(l);
        c.kill9(f[1]);
        c.spawn(f[1]);
        let t = Instant::now();
        let mut elected = None;
        while elected.is_none() && t.elapsed() < Duration::from_secs(15) {
            elected = f.iter().copied().find(|&id| {
                status(c.port(id))
                    .is_some_and(|s| s["role"] == "leader" && s["lease"]["state"] != "expired")
            });
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        (elected.map(|id| (id, t.elapsed())), flood.join().unwrap())
    });
    let evicted = metric(c.port(f[0]), "kv_peer_evicted_total");
    eprintln!("70 idle sockets per peer port ({opened} opened): new leader {elected:?}; {evicted} evicted on node {}", f[0]);
    let (l2, _) = elected.expect("no leader within 15 s under the flood");
    assert!(evicted > 0, "the pending-handshake table never filled");
    put(c.port(l2), "after", "served");
}
