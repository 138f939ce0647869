//! A store of many raft groups on real processes (`--groups`, shared liveness): each key in its
//! group, leaders spread over the nodes, redirects to the key's group's leader, lease reads on
//! every group, and a leader of many groups killed and restarted with no acknowledged write lost.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::cluster::{http, http_follow, http_raw, json, others, Cluster};

const GROUPS: u64 = 8;

/// Every group's leader, once each group has exactly one node that says it leads it, among
/// `among` (within `secs`).
fn leaders(c: &Cluster, among: &[u64], secs: u64) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let mut led: Vec<Vec<u64>> = vec![Vec::new(); GROUPS as usize];
        for &id in among {
            let Some((200, body)) = http(c.port(id), "GET", "/groups", b"") else {
                continue;
            };
            for g in json(&body)["list"].as_array().expect("a list") {
                if g["leader_here"] == true {
                    led[g["group"].as_u64().unwrap() as usize].push(id);
                }
            }
        }
        if led.iter().all(|l| l.len() == 1) {
            return led.into_iter().map(|l| l[0]).collect();
        }
        assert!(
            Instant::now() < deadline,
            "groups not each led once within {secs} s: {led:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (status, the `x-kv-group` header, body) of one request to `port`.
fn with_group(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Option<u64>, String) {
    let (code, head, body) = http_raw(port, method, path, body, &[]).expect("an answer");
    let group = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("x-kv-group:")
            .and_then(|v| v.trim().parse().ok())
    });
    (code, group, String::from_utf8_lossy(&body).into_owned())
}

/// A PUT through any node, following redirects, until it is answered 200 (within 10 s).
fn put_anywhere(c: &Cluster, via: u64, key: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = http_follow(c.port(via), "PUT", &format!("/kv/{key}"), value.as_bytes());
        if let Some((200, _)) = got {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "PUT {key}: {got:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A read through raft through any node, following redirects, until it is answered 200 (within
/// 10 s): the value.
fn get_anywhere(c: &Cluster, via: u64, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = http_follow(c.port(via), "GET", &format!("/kv/{key}?read=index"), b"");
        if let Some((200, body)) = &got {
            return json(body)["value"].as_str().unwrap_or_default().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "GET {key}: {got:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn many_groups_place_each_key_in_one_spread_leaders_and_redirect_per_group() {
    // Leaders stay where elections put them: the test writes to each group's leader as found.
    let c = Cluster::start(3, &["--groups", "8", "--balance-leaders", "false"]);
    let led = leaders(&c, &[1, 2, 3], 20);
    let nodes: BTreeSet<u64> = led.iter().copied().collect();
    assert!(nodes.len() >= 2, "every group led by one node: {led:?}");
    let s = json(&http(c.port(1), "GET", "/status", b"").unwrap().1);
    assert_eq!(
        (s["groups"].as_u64(), s["liveness"].as_str()),
        (Some(GROUPS), Some("shared"))
    );
    let mut seen = BTreeSet::new();
    for i in 0..40 {
        let key = format!("k{i}");
        let (_, group, _) = with_group(c.port(1), "GET", &format!("/kv/{key}?read=index"), b"");
        let g = group.expect("a key's answers name its group");
        seen.insert(g);
        let leader = led[g as usize];
        // The group's leader takes the write and serves it from its lease, with no round.
        let (code, got, body) = with_group(c.port(leader), "PUT", &format!("/kv/{key}"), b"v");
        assert_eq!((code, got), (200, Some(g)), "{body}");
        let (code, _, body) =
            with_group(c.port(leader), "GET", &format!("/kv/{key}?read=lease"), b"");
        assert_eq!(
            (code, json(&body)["read"].as_str()),
            (200, Some("lease")),
            "{body}"
        );
        // Another node redirects to that group's leader, whoever leads the node's other groups.
        let other = others(leader)[0];
        let (code, head, _) =
            http_raw(c.port(other), "PUT", &format!("/kv/{key}"), b"w", &[]).unwrap();
        let location = format!("127.0.0.1:{}", c.port(leader));
        assert_eq!(code, 307, "{head}");
        assert!(head.contains(&location), "{head}");
    }
    assert!(seen.len() >= 6, "40 keys in only {seen:?} of 8 groups");
    // Sessions and locks live in group 0: a session-bound write elsewhere is refused, typed.
    let key = (0..)
        .map(|i| format!("s{i}"))
        .find(|k| with_group(c.port(1), "GET", &format!("/kv/{k}?read=index"), b"").1 != Some(0));
    let key = key.unwrap();
    let (code, _, body) = with_group(c.port(1), "PUT", &format!("/kv/{key}?session=1"), b"v");
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        crate::cluster::error_code(&body),
        "not_in_group_0",
        "{body}"
    );
}

#[test]
fn a_node_leading_many_groups_killed_and_restarted_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, &["--groups", "8"]);
    let led = leaders(&c, &[1, 2, 3], 20);
    let acked: Vec<(String, String)> = (0..48)
        .map(|i| (format!("key-{i}"), format!("value-{i}")))
        .collect();
    for (k, v) in &acked {
        put_anywhere(&c, 1, k, v);
    }
    let busiest = (1..=3)
        .max_by_key(|id| led.iter().filter(|l| *l == id).count())
        .unwrap();
    c.kill9(busiest);
    let survivors = others(busiest);
    let after = leaders(&c, &survivors, 20);
    assert!(after.iter().all(|l| *l != busiest));
    for (k, v) in &acked {
        assert_eq!(&get_anywhere(&c, survivors[0], k), v, "{k}");
    }
    put_anywhere(&c, survivors[0], "after-failover", "yes");
    c.spawn(busiest);
    leaders(&c, &[1, 2, 3], 20);
    // The restarted node holds every group again: through it, each write reads back.
    for (k, v) in acked
        .iter()
        .chain([&("after-failover".into(), "yes".into())])
    {
        assert_eq!(&get_anywhere(&c, busiest, k), v, "{k}");
    }
}

/// A leader whose log writes stall (`/admin/stall-disk`) is not counted on for long: the thread
/// stuck in the sync is the one that sends its heartbeats, so its support runs out, its leases
/// end (it serves no lease read after), and every group it led is led elsewhere within
/// `P + election timeout + 1 s`; once its disk answers again it catches up.
#[test]
fn a_leader_whose_disk_stalls_loses_its_leases_and_its_groups_fail_over() {
    // Leaders stay where elections put them: the test follows one group's leader.
    let c = Cluster::start(
        3,
        &[
            "--groups",
            "8",
            "--fault-injection",
            "--balance-leaders",
            "false",
        ],
    );
    let led = leaders(&c, &[1, 2, 3], 20);
    let busiest = (1..=3)
        .max_by_key(|id| led.iter().filter(|l| *l == id).count())
        .unwrap();
    let g = led.iter().position(|l| *l == busiest).unwrap() as u64;
    let key = (0..)
        .map(|i| format!("stall-{i}"))
        .find(|k| with_group(c.port(1), "GET", &format!("/kv/{k}?read=index"), b"").1 == Some(g))
        .unwrap();
    put_anywhere(&c, busiest, &key, "before");
    let (code, body) = http(
        c.port(busiest),
        "POST",
        "/admin/stall-disk",
        br#"{"stalled": true}"#,
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    // A write makes the raft thread sync, and there it stays (the write times out, 504).
    let port = c.port(busiest);
    let path = format!("/kv/{key}");
    let write = std::thread::spawn(move || http(port, "PUT", &path, b"during").map(|r| r.0));
    let after = leaders(&c, &others(busiest), 20);
    assert!(after.iter().all(|l| *l != busiest), "{after:?}");
    assert_ne!(
        write.join().unwrap(),
        Some(200),
        "a write acknowledged through a stalled disk"
    );
    let (code, body) = http(
        c.port(busiest),
        "GET",
        &format!("/kv/{key}?read=lease"),
        b"",
    )
    .unwrap();
    assert_ne!(code, 200, "a lease read on the stalled node: {body}");
    let groups = json(&http(c.port(busiest), "GET", "/groups", b"").unwrap().1);
    let leased = groups["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["leased"] == true)
        .count();
    assert_eq!(leased, 0, "{groups}");
    http(
        c.port(busiest),
        "POST",
        "/admin/stall-disk",
        br#"{"stalled": false}"#,
    )
    .unwrap();
    put_anywhere(&c, busiest, &key, "after");
    assert_eq!(get_anywhere(&c, busiest, &key), "after");
}

/// A member's fortification and raft messages for groups this node does not host (a peer
/// started with more groups, or a forged batch) are dropped, and the node keeps serving.
#[test]
fn a_members_messages_for_groups_not_hosted_here_are_dropped_and_harmless() {
    use raft_lease::liveness::Epoch;
    use raft_lease::multi::{FortifyMsg, NodeBatch};
    // Leaders stay where elections put them: the test checks that no leadership moved.
    let mut c = Cluster::start(3, &["--groups", "8", "--balance-leaders", "false"]);
    let led = leaders(&c, &[1, 2, 3], 20);
    let mut hb = raft::eraftpb::Message {
        from: 2,
        to: 1,
        term: 1,
        ..Default::default()
    };
    hb.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
    let far = [8, 9, 1 << 40, u64::MAX];
    let batch = NodeBatch {
        from: 2,
        to: 1,
        fortify: far
            .iter()
            .flat_map(|&group| {
                [
                    FortifyMsg::Request {
                        group,
                        term: 1,
                        epoch: Epoch(1),
                    },
                    FortifyMsg::Ack {
                        group,
                        term: 1,
                        epoch: Epoch(1),
                        incarnation: 1,
                    },
                    FortifyMsg::Reject { group, term: 1 },
                    FortifyMsg::Release { group, term: 1 },
                ]
            })
            .collect(),
        raft: far.iter().map(|&g| (g, hb.clone())).collect(),
        ..NodeBatch::default()
    };
    for _ in 0..5 {
        assert!(crate::forge::send_batch(
            &c,
            1,
            crate::forge::Cred::Member(2),
            &batch
        ));
    }
    assert_eq!(leaders(&c, &[1, 2, 3], 20), led, "leadership moved");
    put_anywhere(&c, 1, "still", "served");
    assert!(c.running(1));
    let log = std::fs::read_to_string(c.log_path(1)).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

/// Wait until every node of `nodes` has every group at exactly `voters` (no learner, not joint)
/// and counts no group behind group 0's configuration (within 60 s).
fn wait_every_group(c: &Cluster, nodes: &[u64], voters: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = serde_json::json!({"voters": voters, "learners": [], "voters_outgoing": [],
                                  "joint": false});
    loop {
        let off: Vec<(u64, Option<u64>)> = nodes
            .iter()
            .flat_map(|&id| {
                let groups = http(c.port(id), "GET", "/groups", b"").map(|(_, b)| json(&b));
                let status = crate::cluster::status(c.port(id));
                let behind = status.and_then(|s| s["groups_behind_membership"].as_u64());
                let list = groups.map(|g| g["list"].as_array().cloned().unwrap_or_default());
                let wrong = list.map_or(vec![None], |l| {
                    let bad = l.iter().filter(|g| g["conf"] != want);
                    bad.map(|g| g["group"].as_u64()).collect()
                });
                let behind = (behind != Some(0)).then_some(None);
                wrong.into_iter().chain(behind).map(move |g| (id, g))
            })
            .collect();
        if off.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "(node, group) not at {voters:?} within 60 s: {off:?}\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `POST /admin/members` through node `via`, redirected to group 0's leader: 200.
fn change_members(c: &Cluster, via: u64, changes: serde_json::Value) {
    let body = serde_json::json!({ "changes": changes }).to_string();
    let got = http_follow(c.port(via), "POST", "/admin/members", body.as_bytes());
    assert!(matches!(got, Some((200, _))), "{got:?}");
}

/// Membership changes reach every group: the operator changes group 0, and each other group's
/// leader moves its group to group 0's configuration. A node joins (every group adds it and it
/// catches up by snapshot, then serves every key); then a node that leads groups is removed
/// (each group it led is led elsewhere and drops it); a member restarts; another node joins; no
/// acknowledged write is lost.
#[test]
fn membership_changes_reach_every_group_a_joiner_serves_all_and_a_removed_leader_leaves_all() {
    let mut c = Cluster::start(3, &["--groups", "8"]);
    leaders(&c, &[1, 2, 3], 20);
    let acked: Vec<(String, String)> = (0..32)
        .map(|i| (format!("key-{i}"), format!("value-{i}")))
        .collect();
    for (k, v) in &acked {
        put_anywhere(&c, 1, k, v);
    }
    c.add_slot(4);
    c.spawn_join(4, 1);
    wait_every_group(&c, &[1, 2, 3, 4], &[1, 2, 3, 4]);
    for (k, v) in &acked {
        assert_eq!(&get_anywhere(&c, 4, k), v, "{k} through the joiner");
    }
    // Remove a node that leads groups but not group 0 (group 0's leader may not remove itself).
    let led = leaders(&c, &[1, 2, 3, 4], 20);
    let gone = (1..=4)
        .filter(|&id| id != led[0])
        .max_by_key(|id| led.iter().filter(|l| *l == id).count())
        .unwrap();
    let rest: Vec<u64> = (1..=4).filter(|&id| id != gone).collect();
    change_members(
        &c,
        rest[0],
        serde_json::json!([{"op": "remove", "id": gone}]),
    );
    wait_every_group(&c, &rest, &rest);
    c.kill9(gone);
    let after = leaders(&c, &rest, 20);
    assert!(after.iter().all(|l| *l != gone), "{after:?}");
    for (k, v) in &acked {
        assert_eq!(&get_anywhere(&c, rest[0], k), v, "{k} after the removal");
    }
    for g in 0..GROUPS {
        put_anywhere(&c, rest[1], &format!("after-{g}"), "written");
    }
    // A member killed and restarted comes back with every group as it was (its membership
    // entries since the last snapshot are not applied twice), and a later change reaches all.
    c.kill9(rest[0]);
    c.spawn(rest[0]);
    wait_every_group(&c, &rest, &rest);
    c.add_slot(5);
    c.spawn_join(5, rest[1]);
    let mut grown = rest.clone();
    grown.push(5);
    wait_every_group(&c, &grown, &grown);
    for (k, v) in &acked {
        assert_eq!(&get_anywhere(&c, 5, k), v, "{k} through the second joiner");
    }
}

/// How many groups each of `ids` says it leads.
fn led_counts(c: &Cluster, ids: &[u64]) -> Vec<u64> {
    let led = |id| crate::cluster::status(c.port(id)).and_then(|s| s["groups_led"].as_u64());
    ids.iter().map(|&id| led(id).unwrap_or(0)).collect()
}

/// Start three nodes of 24 groups, kill node 3 until nodes 1 and 2 lead every group, start it
/// again, and wait up to `window_s` until no node leads more than its share (8) and the slack
/// (1): the counts then, or why not.
fn spread_after_a_late_start(balance: &str, window_s: u64) -> Result<Vec<u64>, String> {
    let mut c = Cluster::start(3, &["--groups", "24", "--balance-leaders", balance]);
    c.kill9(3);
    let deadline = Instant::now() + Duration::from_secs(20);
    while led_counts(&c, &[1, 2]).iter().sum::<u64>() < 24 {
        assert!(Instant::now() < deadline, "{}", c.log_tail());
        std::thread::sleep(Duration::from_millis(50));
    }
    c.spawn(3);
    let deadline = Instant::now() + Duration::from_secs(window_s);
    loop {
        let led = led_counts(&c, &[1, 2, 3]);
        if led.iter().sum::<u64>() == 24 && led.iter().all(|&n| n <= 9) {
            return Ok(led);
        }
        if Instant::now() > deadline {
            return Err(format!("leaders not spread within {window_s} s: {led:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Leaders spread over the nodes: a node started after the others (so elected to lead nothing)
/// is handed leaderships until none leads clearly more than its share; with the spreading
/// switched off (the control), it stays leading nothing. Both get the same window: eight of the
/// balancer's looks at the spread (one a second), where spreading takes two or three.
#[test]
fn leaders_spread_over_the_nodes_even_to_one_that_started_late() {
    const WINDOW_S: u64 = 8;
    let led = spread_after_a_late_start("true", WINDOW_S).unwrap();
    assert!(led[2] >= 6, "node 3 leads {} of 24: {led:?}", led[2]);
    let control = spread_after_a_late_start("false", WINDOW_S);
    assert!(control.is_err(), "spread without balancing: {control:?}");
}
