//! Membership changes through raft with real processes, with a client writing and reading
//! throughout: grow 3 → 5 with `kv node --join` (each new node catches up by snapshot, then is
//! promoted), shrink 5 → 3 in one joint change, remove the leader (refused until leadership is
//! transferred), replace a node, and join through a follower with `--peers` naming only that
//! follower and the new node (as the documented join does). The client checks every read against the writes acknowledged
//! before it began: a read that returns an older value is stale.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{http_follow, json, Cluster};

/// What the client saw.
#[derive(Debug, Default)]
struct Seen {
    writes: AtomicU64,
    reads: AtomicU64,
    stale: AtomicU64,
    unavailable: AtomicU64,
}

/// One sequential client: write `n` to a key, then read it through another node, over and over,
/// through whichever nodes are up (`ports`), following redirects.
fn client(ports: &Mutex<Vec<u16>>, stop: &AtomicBool, seen: &Seen) {
    let mut acked = 0u64;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let live = ports.lock().unwrap().clone();
        let port = live[i % live.len()];
        let n = acked + 1;
        match http_follow(port, "PUT", "/kv/counter", n.to_string().as_bytes()) {
            Some((200, _)) => {
                acked = n;
                seen.writes.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let port = live[(i + 1) % live.len()];
        let mode = ["auto", "lease", "index"][i % 3];
        if let Some((200, body)) =
            http_follow(port, "GET", &format!("/kv/counter?read={mode}"), b"")
        {
            let got: u64 = json(&body)["value"]
                .as_str()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
            seen.reads.fetch_add(1, Ordering::Relaxed);
            if got < acked {
                seen.stale.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "STALE: read {got} through port {port} ({mode}) after {acked} was acknowledged"
                );
            }
        }
    }
}

/// `POST /admin/members` through node `via` (redirected to the leader).
fn change(c: &Cluster, via: u64, changes: Value) -> (u16, Value) {
    let body = json!({ "changes": changes }).to_string();
    let (code, body) =
        http_follow(c.port(via), "POST", "/admin/members", body.as_bytes()).expect("an answer");
    (code, json(&body))
}

/// Wait until node `via` reports exactly these voters and learners, not joint.
fn wait_conf(c: &Cluster, via: u64, voters: &[u64], learners: &[u64]) {
    let members = || http_follow(c.port(via), "GET", "/members", b"").map(|(_, b)| json(&b));
    wait_members(c, members, voters, learners);
}

/// Wait until `members()` (a `/members` answer) lists exactly these voters and learners, not
/// joint.
fn wait_members(
    c: &Cluster,
    members: impl Fn() -> Option<Value>,
    voters: &[u64],
    learners: &[u64],
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = members();
        let ids = |v: &Value, k: &str| -> Vec<u64> {
            v[k].as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default()
        };
        if let Some(m) = &m {
            if ids(m, "voters") == voters && ids(m, "learners") == learners && m["joint"] == false {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "membership never became {voters:?}/{learners:?}: {m:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Start node `id` with `--join` through node `via`, and wait until it is a voter.
fn join(c: &mut Cluster, ports: &Mutex<Vec<u16>>, id: u64, via: u64, voters: &[u64]) {
    c.add_slot(id);
    c.spawn_join(id, via);
    wait_conf(c, via, voters, &[]);
    ports.lock().unwrap().push(c.port(id));
    let snapshots =
        crate::cluster::metric_labeled(c.port(id), "raft_messages_received_total", "MsgSnapshot");
    assert!(snapshots >= 1, "node {id} caught up without a snapshot");
}

/// The leader among `among`, with a lease (the new configuration's quorum renewed it).
fn leader(c: &Cluster, among: &[u64]) -> u64 {
    c.leader(among, 20)
}

fn run_with_client(c: &mut Cluster, scenario: impl FnOnce(&mut Cluster, &Mutex<Vec<u16>>)) -> Seen {
    let ports = Mutex::new(c.ids().iter().map(|&id| c.port(id)).collect::<Vec<_>>());
    let (stop, seen) = (AtomicBool::new(false), Seen::default());
    let outcome = std::thread::scope(|s| {
        s.spawn(|| client(&ports, &stop, &seen));
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(c, &ports)));
        stop.store(true, Ordering::Relaxed); // even when the scenario failed: the client stops
        outcome
    });
    eprintln!("client: {seen:?}");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    seen
}

#[test]
fn grow_3_to_5_by_join_and_shrink_back_in_one_joint_change_with_reads_throughout() {
    let mut c = Cluster::start(3, &[]);
    leader(&c, &[1, 2, 3]);
    let seen = run_with_client(&mut c, |c, ports| {
        join(c, ports, 4, 1, &[1, 2, 3, 4]);
        join(c, ports, 5, 2, &[1, 2, 3, 4, 5]);
        leader(c, &[1, 2, 3, 4, 5]);
        // Two voters out at once: a joint configuration, left by raft on its own.
        ports.lock().unwrap().truncate(3);
        let (code, body) = change(
            c,
            4,
            json!([{"op": "remove", "id": 4}, {"op": "remove", "id": 5}]),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(
            body["joint"], true,
            "two voters changed: entered a joint configuration: {body}"
        );
        wait_conf(c, 1, &[1, 2, 3], &[]);
        leader(c, &[1, 2, 3]);
        std::thread::sleep(Duration::from_millis(300)); // the client goes on in the new configuration
    });
    for id in [4, 5] {
        c.kill9(id); // removed: nothing depends on them
    }
    let l = leader(&c, &[1, 2, 3]);
    crate::cluster::put(c.port(l), "after", "served");
    assert_eq!(seen.stale.load(Ordering::Relaxed), 0, "stale reads");
    assert!(
        seen.writes.load(Ordering::Relaxed) > 10 && seen.reads.load(Ordering::Relaxed) > 10,
        "{seen:?}"
    );
}

#[test]
fn remove_the_leader_after_a_transfer_and_replace_a_node_with_reads_throughout() {
    let mut c = Cluster::start(3, &[]);
    let l = leader(&c, &[1, 2, 3]);
    let rest: Vec<u64> = [1, 2, 3].into_iter().filter(|&i| i != l).collect();
    let seen = run_with_client(&mut c, |c, ports| {
        // The leader may not remove itself: transfer first.
        let (code, body) = change(c, l, json!([{"op": "remove", "id": l}]));
        assert_eq!(
            (code, body["error"].as_str()),
            (409, Some("change_refused")),
            "{body}"
        );
        crate::cluster::transfer(c, l, rest[0]);
        let (code, body) = change(c, rest[1], json!([{"op": "remove", "id": l}]));
        assert_eq!(code, 200, "{body}");
        ports.lock().unwrap().retain(|&p| p != c.port(l));
        wait_conf(c, rest[0], &rest, &[]);
        c.kill9(l);
        // Replace rest[1] by node 4 in one joint change, then start node 4: it catches up by
        // snapshot as a voter already.
        c.add_slot(4);
        let peer = format!("127.0.0.1:{}", c.peer_port(4));
        let http = format!("127.0.0.1:{}", c.port(4));
        let replace = json!([{"op": "add_voter", "id": 4, "peer": peer, "http": http}, {"op": "remove", "id": rest[1]}]);
        let (code, body) = change(c, rest[0], replace);
        assert_eq!((code, &body["joint"]), (200, &json!(true)), "{body}");
        ports.lock().unwrap().retain(|&p| p != c.port(rest[1]));
        c.spawn_join(4, rest[0]);
        let mut voters = vec![rest[0], 4];
        voters.sort_unstable();
        wait_conf(c, rest[0], &voters, &[]);
        ports.lock().unwrap().push(c.port(4));
        c.kill9(rest[1]);
        leader(c, &voters);
        std::thread::sleep(Duration::from_millis(300));
    });
    assert_eq!(seen.stale.load(Ordering::Relaxed), 0, "stale reads");
    assert!(seen.writes.load(Ordering::Relaxed) > 10, "{seen:?}");
}

/// Wait until node `id` has applied at least `index`.
fn wait_applied(c: &Cluster, id: u64, index: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = crate::cluster::status(c.port(id));
        if s.as_ref().and_then(|s| s["applied"].as_u64()) >= Some(index) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} never applied {index}: {s:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_listing_only_some_members_joins_through_a_follower_and_catches_up() {
    let mut c = Cluster::start(3, &[]);
    if leader(&c, &[1, 2, 3]) == 1 {
        crate::cluster::transfer(&c, 1, 2);
    }
    let l = leader(&c, &[2, 3]);
    crate::cluster::put(c.port(l), "before", "the join");
    // As docs/kv.md joins node 4: --peers names node 1 (a follower now) and node 4 only.
    c.add_slot(4);
    c.spawn_join_listing(4, 1, &[1, 4]);
    wait_conf(&c, 1, &[1, 2, 3, 4], &[]);
    let l = leader(&c, &[1, 2, 3, 4]);
    let rev = crate::cluster::put(c.port(l), "after", "the join");
    wait_applied(&c, 4, rev);
    let (code, body) =
        crate::cluster::http(c.port(4), "GET", "/status", b"").expect("node 4 answers");
    assert_eq!(code, 200);
    assert_eq!(json(&body)["member"], true, "{body}");
    let learned = std::fs::read_to_string(c.log_path(4)).unwrap();
    assert!(
        learned.contains("learned a member's addresses"),
        "node 4 learned the members it was not started with:\n{}",
        c.log_tail()
    );
}

/// An operator removes a joiner the moment it becomes a voter (while its join may still be
/// running): it stays removed. Its join ends on its promotion's answer, or on finding itself out
/// of the configuration, and never asks to be added again.
#[test]
fn a_joiner_removed_as_soon_as_it_is_a_voter_does_not_add_itself_back() {
    let mut c = Cluster::start(3, &[]);
    leader(&c, &[1, 2, 3]);
    c.add_slot(4);
    c.spawn_join(4, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = http_follow(c.port(1), "GET", "/members", b"").map(|(_, b)| json(&b));
        let voters = m.as_ref().and_then(|m| m["voters"].as_array().cloned());
        if voters.is_some_and(|v| v.contains(&json!(4))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never a voter: {m:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, body) = change(&c, 1, json!([{"op": "remove", "id": 4}]));
    assert_eq!(code, 200, "{body}");
    // The join has ended once node 4 says how: only then can no request of it be in flight.
    let ended = [
        "joined the cluster as a voter",
        "removed from the cluster while joining",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ended
        .iter()
        .any(|l| std::fs::read_to_string(c.log_path(4)).unwrap().contains(l))
    {
        assert!(
            Instant::now() < deadline,
            "the join never ended\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = (1..=3).map(|id| std::fs::read_to_string(c.log_path(id)).unwrap());
    let asked: usize = logs
        .map(|l| l.matches("op: AddLearner, id: 4").count())
        .sum();
    assert_eq!(
        asked,
        1,
        "node 4 asked to be added {asked} times\n{}",
        c.log_tail()
    );
    wait_conf(&c, 1, &[1, 2, 3], &[]);
}

/// Wait until node `via` (over HTTPS) lists exactly these voters and no learner, not joint.
fn wait_voters_https(c: &Cluster, via: u64, voters: &[u64]) {
    let members = || {
        crate::forge::https_admin(c, c.port(via), "GET", "/members", b"")
            .filter(|(code, _)| *code == 200)
            .map(|(_, b)| json(&b))
    };
    wait_members(c, members, voters, &[]);
}

/// A cluster that serves HTTPS: a node joins with `--join` (no scheme: it serves HTTPS itself,
/// so it asks over HTTPS, trusting --peer-ca); a node whose peer certificate another CA signed
/// is refused (409 `peer_untrusted`, said in its log at warning level) and never added.
#[test]
fn a_node_joins_a_cluster_that_serves_https_and_one_of_another_ca_is_refused() {
    let mut c = Cluster::prepare(1, &[]);
    c.serve_https();
    c.spawn(1);
    wait_voters_https(&c, 1, &[1]);
    c.add_slot(2);
    c.add_slot(3);
    let tls = c.tls();
    // Node 3's peer certificate comes from a CA of its own; it trusts the cluster CA.
    let other = c.data.join("other-ca");
    crate::cluster::make_certs(&other, &[3]);
    for f in ["node-3.pem", "node-3.key"] {
        std::fs::copy(other.join(f), tls.join(f)).unwrap();
    }
    c.spawn_join(3, 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let log = std::fs::read_to_string(c.log_path(3)).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("peer_untrusted")) {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "node 3 was never refused\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        refused.contains("WARN") && refused.contains("cluster CA"),
        "{refused}"
    );
    // Node 2, with a certificate of the cluster CA, joins over HTTPS and becomes a voter.
    c.spawn_join(2, 1);
    wait_voters_https(&c, 1, &[1, 2]);
    let members = crate::forge::https_admin(&c, c.port(1), "GET", "/members", b"")
        .unwrap()
        .1;
    assert_eq!(
        json(&members)["learners"],
        json!([]),
        "node 3 was added: {members}"
    );
}
