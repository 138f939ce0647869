//! A rolling change of `--election-ms` (the lease promise `P`): nodes with different promises in
//! one cluster, and a node restarted with a shorter one. Each test has its control,
//! `--unsafe-count-own-promise` (a leader counts its own `P`, a restarted node keeps only its
//! own), which must show the stale read or the early vote.

use std::time::{Duration, Instant};

use crate::cluster::{http, json, put, set_flag, status, transfer, Cluster};

/// The old leader's `P` and its followers' (the middle of a rolling change from 2000 to 300).
const LEADER_MS: &str = "2000";
const FOLLOWER_MS: &str = "300";
/// How long the old leader is read after the cut: past the end of a lease counted on its own
/// `P` (2000 ms less drift and margin, 1,626 ms), so that the control's stale window is covered.
const READ_FOR: Duration = Duration::from_millis(2_500);

/// One lease read sent to the old leader.
struct Read {
    sent: Instant,
    code: Option<u16>,
    value: Option<String>,
}

/// What the old leader answered after the cut.
#[derive(Debug)]
struct Outcome {
    /// Lease reads sent after the cut.
    after_cut: usize,
    /// Of those, answered 200 (with the old value: it is cut off).
    served_after_cut: usize,
    /// Lease reads sent after the new write was acknowledged.
    after_ack: usize,
    /// Of those, answered 200 with the old value: stale.
    stale: usize,
    /// When the new write was acknowledged, after the cut.
    ack_ms: u128,
    /// The last stale read, after the cut.
    last_stale_ms: Option<u128>,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} lease reads after the cut, {} served; write acknowledged {} ms after the cut; \
             {} lease reads after it, {} stale (the last sent {:?} ms after the cut)",
            self.after_cut,
            self.served_after_cut,
            self.ack_ms,
            self.after_ack,
            self.stale,
            self.last_stale_ms
        )
    }
}

fn flags(control: bool) -> Vec<&'static str> {
    let mut args = vec!["--fault-injection"];
    if control {
        args.push("--unsafe-count-own-promise");
    }
    args
}

/// Node 1 with `P` = 2000 ms leading nodes 2 and 3 with `P` = 300 ms.
fn mixed_cluster(control: bool) -> Cluster {
    let c = Cluster::start_each(3, &flags(control), |id, f| {
        let ms = if id == 1 { LEADER_MS } else { FOLLOWER_MS };
        set_flag(f, "--election-ms", ms);
    });
    let l = c.leader(&[1, 2, 3], 20);
    if l != 1 {
        transfer(&c, l, 1);
    }
    c
}

/// `GET /kv/k?read=lease` on `port`.
fn lease_read(port: u16) -> Read {
    let sent = Instant::now();
    let answer = http(port, "GET", "/kv/k?read=lease", b"");
    let value = match &answer {
        Some((200, body)) => json(body)["value"].as_str().map(str::to_string),
        _ => None,
    };
    Read {
        sent,
        code: answer.map(|(code, _)| code),
        value,
    }
}

/// Write `k = new` through nodes 2 and 3 until one acknowledges it; when it did.
fn write_through_majority(c: &Cluster) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        for id in [2, 3] {
            if let Some((200, _)) = http(c.port(id), "PUT", "/kv/k", b"new") {
                return Instant::now();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "the majority never acknowledged the write:\n{}",
        c.log_tail()
    );
}

/// Cut the leader (node 1) off; write through the majority while reading the old leader under
/// its lease for `READ_FOR`.
fn cut_and_read(c: &Cluster) -> Outcome {
    put(c.port(1), "k", "old");
    let before = lease_read(c.port(1));
    assert_eq!(
        (before.code, before.value.as_deref()),
        (Some(200), Some("old")),
        "the leader serves lease reads before the cut"
    );
    let cut = http(
        c.port(1),
        "POST",
        "/admin/partition",
        br#"{"peers": [2, 3]}"#,
    )
    .unwrap();
    assert_eq!(cut.0, 200, "{}", cut.1);
    let cut_at = Instant::now();
    let (ack, reads) = std::thread::scope(|s| {
        let writer = s.spawn(|| write_through_majority(c));
        let mut reads = Vec::new();
        while cut_at.elapsed() < READ_FOR || !writer.is_finished() {
            reads.push(lease_read(c.port(1)));
        }
        (writer.join().unwrap(), reads)
    });
    outcome(cut_at, ack, &reads)
}

fn outcome(cut_at: Instant, ack: Instant, reads: &[Read]) -> Outcome {
    let served = |r: &&Read| r.code == Some(200);
    let after_ack: Vec<&Read> = reads.iter().filter(|r| r.sent > ack).collect();
    let stale: Vec<&Read> = after_ack
        .iter()
        .copied()
        .filter(|r| served(r) && r.value.as_deref() != Some("new"))
        .collect();
    Outcome {
        after_cut: reads.len(),
        served_after_cut: reads.iter().filter(served).count(),
        after_ack: after_ack.len(),
        stale: stale.len(),
        ack_ms: (ack - cut_at).as_millis(),
        last_stale_ms: stale.last().map(|r| (r.sent - cut_at).as_millis()),
    }
}

fn run(control: bool) -> Outcome {
    let c = mixed_cluster(control);
    let o = cut_and_read(&c);
    eprintln!(
        "leader P = {LEADER_MS} ms, followers P = {FOLLOWER_MS} ms (control: {control}): {o}"
    );
    o
}

#[test]
fn a_cut_off_leader_with_a_longer_promise_than_its_followers_serves_no_stale_lease_read() {
    let o = run(false);
    assert!(
        o.after_ack >= 50,
        "too few reads after the acknowledgement to test anything: {o:?}"
    );
    assert_eq!(o.stale, 0, "stale lease reads: {o:?}");
}

#[test]
fn control_count_own_promise_serves_stale_lease_reads_in_a_rolling_change() {
    let found = (0..2).map(|_| run(true)).find(|o| o.stale > 0);
    assert!(
        found.is_some(),
        "a leader counting its own P never served a stale read in 2 tries"
    );
}

/// Node `id`'s status: (uptime in ms, the leader it knows, its promise fields).
fn boot_view(c: &Cluster, id: u64) -> Option<(u64, Option<u64>, serde_json::Value)> {
    let s = status(c.port(id))?;
    let uptime = s["uptime_ms"].as_u64()?;
    Some((uptime, s["leader_id"].as_u64(), s["promise"].clone()))
}

/// Poll node `id` until it knows a leader; its uptime then (its own clock) and its promise.
fn uptime_at_first_leader(c: &Cluster, id: u64) -> (u64, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some((uptime, Some(_), promise)) = boot_view(c, id) {
            return (uptime, promise);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("node {id} never knew a leader:\n{}", c.log_tail());
}

/// The longer promise of the rolling change's restart test.
const OLD_MS: u64 = 3_000;

/// Node 3 runs with `P` = 3000 ms, nodes 1 and 2 with 300; node 3 and then the leader are
/// killed, and node 3 restarts with 300 ms (`control`: and `--unsafe-count-own-promise`). The
/// survivor needs node 3's vote. Node 3's uptime when it first knows the new leader.
fn restart_shorter(control: bool) -> (u64, Cluster) {
    let mut c = Cluster::start_each(3, &[], |id, f| {
        let ms = if id == 3 {
            OLD_MS.to_string()
        } else {
            FOLLOWER_MS.into()
        };
        set_flag(f, "--election-ms", &ms);
    });
    let l = c.leader(&[1, 2], 20);
    let recorded = &boot_view(&c, 3).unwrap().2["recorded_promise_ms"];
    assert_eq!(recorded.as_u64(), Some(OLD_MS));
    c.kill9(3);
    c.kill9(l);
    c.spawn_edited(3, |f| {
        set_flag(f, "--election-ms", FOLLOWER_MS);
        if control {
            f.push("--unsafe-count-own-promise".into());
        }
    });
    let (uptime, promise) = uptime_at_first_leader(&c, 3);
    eprintln!("node 3 restarted with P = {FOLLOWER_MS} ms after {OLD_MS} (control: {control}): first knew a leader at {uptime} ms of uptime; {promise}");
    assert_eq!(promise["promise_ms"], 300);
    assert_eq!(promise["prior_promise_ms"], OLD_MS);
    (uptime, c)
}

/// The record once every earlier promise has ended, from `/status` and from the file.
fn wait_lowered(c: &Cluster, id: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let path = c.data.join(format!("node{id}/kv-promise.json"));
    while Instant::now() < deadline {
        let shown = boot_view(c, id).and_then(|v| v.2["recorded_promise_ms"].as_u64());
        if shown == Some(300) {
            let file = json(&std::fs::read_to_string(&path).unwrap());
            return file["max_promise_ms"].as_u64().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "node {id}'s promise record was never lowered:\n{}",
        c.log_tail()
    );
}

#[test]
fn a_node_restarted_with_a_shorter_election_timeout_keeps_its_longer_promise() {
    let (uptime, c) = restart_shorter(false);
    assert!(
        uptime >= OLD_MS,
        "node 3 voted {uptime} ms after its restart, inside the {OLD_MS} ms its previous run promised"
    );
    assert_eq!(
        wait_lowered(&c, 3),
        300,
        "lowered once the old promise ended"
    );
}

#[test]
fn control_count_own_promise_votes_inside_the_previous_runs_promise() {
    let early = (0..2)
        .map(|_| restart_shorter(true).0)
        .find(|&u| u < OLD_MS);
    assert!(
        early.is_some(),
        "a node that forgot its previous run's promise never voted inside it in 2 tries"
    );
}

/// Start single node 1 and expect it to refuse: its exit code and log.
fn refused_start(c: &mut Cluster) -> (Option<i32>, String) {
    c.spawn(1);
    let code = c.wait_exit(1, 10).code();
    (code, std::fs::read_to_string(c.log_path(1)).unwrap())
}

#[test]
fn a_corrupt_promise_record_refuses_to_start_and_a_missing_one_is_written_again() {
    let mut c = Cluster::start(1, &[]);
    c.leader(&[1], 15);
    let record = c.data.join("node1/kv-promise.json");
    let intact = std::fs::read(&record).unwrap();
    for bad in [
        &b"{\"format\": 1, \"max_promise_ms\": \"x\"}"[..],
        b"",
        b"\xff",
    ] {
        c.signal(1, libc::SIGTERM);
        assert!(c.wait_exit(1, 10).success());
        std::fs::write(&record, bad).unwrap();
        let (code, log) = refused_start(&mut c);
        let last = log.lines().last().unwrap_or_default();
        let shown = String::from_utf8_lossy(bad);
        eprintln!("promise record {shown:?}: exit {code:?}: {last}");
        assert_eq!(code, Some(3), "{log}");
        assert!(
            log.contains("refusing to start") && !log.contains("panicked"),
            "{log}"
        );
        assert_eq!(std::fs::read(&record).unwrap(), bad, "left as it was");
        std::fs::write(&record, &intact).unwrap();
        c.spawn(1);
        c.leader(&[1], 15);
    }
    // An initialized dir without a record (an older build's): starts, says so, writes one.
    c.signal(1, libc::SIGTERM);
    assert!(c.wait_exit(1, 10).success());
    std::fs::remove_file(&record).unwrap();
    c.spawn(1);
    c.leader(&[1], 15);
    let log = std::fs::read_to_string(c.log_path(1)).unwrap();
    assert!(log.contains("has no kv-promise.json"), "{log}");
    assert_eq!(std::fs::read(&record).unwrap(), intact);
}
