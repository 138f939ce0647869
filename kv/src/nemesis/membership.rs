//! The membership faults: a node removed and added back, a node replaced by a new one, a follower
//! left behind until it catches up by snapshot, and the waits they need (a voter added or gone,
//! every group following group 0's configuration).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::faults::{sleep_ms, Nemesis};
use super::procs::{call, MAX_IDS};

impl Nemesis {
    /// Restart `id` from its data dir.
    pub(super) fn restart(&self, id: u64) -> String {
        match self.procs.lock().spawn(id, None) {
            Ok(()) => "done".into(),
            Err(e) => format!("restart failed: {e}"),
        }
    }

    /// `POST /admin/members` through the leader (redirects followed once). With follower read
    /// leases a change is refused while read leases live (granting stops meanwhile, and their
    /// holders are asked to give them up, which takes a round trip): asked again, up to 100
    /// times, 20 ms apart (2 s, past any `G`, should a give-up be lost).
    pub(super) fn change(&self, changes: Value) -> Result<Value, String> {
        for _ in 0..100 {
            let l = self.leader(20).ok_or("no leader")?;
            match self.admin(l, "/admin/members", json!({ "changes": changes.clone() })) {
                Some((200, v)) => return Ok(v),
                Some((409, v)) if v.to_string().contains("read leases are live") => sleep_ms(20),
                other => return Err(format!("membership change answered {other:?}")),
            }
        }
        Err("membership change refused 100 times: read leases stayed live".into())
    }

    /// Wait until the leader's configuration has `id` as a voter (`want`) or not.
    pub(super) fn wait_voter(&self, id: u64, want: bool, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            let conf = self
                .leader(5)
                .and_then(|l| self.http(l, "GET", "/members", &Value::Null));
            if let Some((200, m)) = conf {
                let voters: Vec<u64> = m["voters"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                if voters.contains(&id) == want && m["joint"] == false {
                    return true;
                }
            }
            sleep_ms(100);
        }
        false
    }

    /// Wait until no member has a group whose configuration is not group 0's (a store of many
    /// groups follows a membership change group by group, as an operator waits for before the
    /// next); what it took, for the outcome ("" at once).
    pub(super) fn wait_followed(&self, secs: u64) -> String {
        let t0 = Instant::now();
        let behind = |id| {
            self.status(id)
                .is_none_or(|s| s["groups_behind_membership"].as_u64() != Some(0))
        };
        while self.members().into_iter().any(behind) {
            if t0.elapsed() > Duration::from_secs(secs) {
                return format!("; groups not all following group 0 after {secs} s");
            }
            sleep_ms(100);
        }
        match t0.elapsed().as_millis() {
            0..=1 => String::new(),
            ms => format!("; every group followed in {ms} ms"),
        }
    }

    pub(super) fn set_targets(&self, remove: u64, add: Option<u64>) {
        let mut t = self.targets.write();
        t.retain(|&i| i != remove);
        t.extend(add);
        t.sort_unstable();
        t.dedup();
    }

    /// Remove `id` (the leader after a transfer), stop it, start it again with `--join`.
    pub(super) fn remove_add_back(&self, id: u64, l: u64) -> (Vec<u64>, String) {
        if id == l {
            let to = self.members().into_iter().find(|&i| i != l);
            let Some(to) = to else {
                return (vec![id], "skipped: a single member".into());
            };
            self.admin(l, "/admin/transfer", json!({"to": to}));
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.leader(5) == Some(l) && Instant::now() < deadline {
                sleep_ms(100);
            }
        }
        if let Err(e) = self.change(json!([{"op": "remove", "id": id}])) {
            return (vec![id], format!("remove: {e}"));
        }
        self.wait_voter(id, false, 30);
        self.set_targets(id, None);
        let followed = self.wait_followed(60);
        // Let it apply its own removal (so it asks to join again), then stop it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.status(id).is_some_and(|s| s["member"] == true) {
            sleep_ms(100);
        }
        self.procs.lock().kill9(id);
        sleep_ms(500);
        (vec![id], format!("{}{followed}", self.join(id)))
    }

    /// Start `id` with `--join` through the leader and wait until it votes.
    pub(super) fn join(&self, id: u64) -> String {
        let Some(via) = self.leader(20) else {
            return "no leader to join through".into();
        };
        if let Err(e) = self.procs.lock().spawn(id, Some(via)) {
            return format!("spawn: {e}");
        }
        self.used.lock().insert(id);
        let ok = self.wait_voter(id, true, 60);
        self.set_targets(0, Some(id));
        let followed = self.wait_followed(60);
        match ok {
            true => format!("done{followed}"),
            false => format!("not a voter again within 60 s{followed}"),
        }
    }

    /// Replace `old` by an id that has not been a member, in one joint change.
    pub(super) fn replace(&self, old: u64, l: u64) -> (Vec<u64>, String) {
        let fresh = (1..=MAX_IDS).find(|i| !self.used.lock().contains(i));
        let Some(new) = fresh.filter(|_| old != l) else {
            return self.remove_add_back(old, l);
        };
        let (peer, http) = (
            self.procs.lock().peer(new),
            self.addrs[new as usize].clone(),
        );
        let mut add = json!({"op": "add_voter", "id": new, "peer": peer, "http": http});
        // The other members forward etcd calls to it: its etcd API address goes in the book.
        if self.procs.lock().serves_etcd() {
            add["etcd"] = self.procs.lock().etcd(new).into();
        }
        let change = json!([add, {"op": "remove", "id": old}]);
        if let Err(e) = self.change(change) {
            return (vec![old, new], format!("replace: {e}"));
        }
        self.set_targets(old, None);
        let outcome = self.join(new);
        self.wait_voter(old, false, 30);
        let outcome = format!("{outcome}{}", self.wait_followed(60));
        self.procs.lock().kill9(old);
        (vec![old, new], outcome)
    }

    /// Leave `id` behind (cut off) while the log is compacted past it, then kill and restart
    /// it `restarts` times as it catches up, and wait until it has applied the leader's commit.
    pub(super) fn lagging(&self, id: u64, behind_ms: u64, restarts: u32) -> (Vec<u64>, String) {
        let rest: Vec<u64> = self.members().into_iter().filter(|&i| i != id).collect();
        let mut snaps = 0; // summed over its processes: a restart starts the counters again
        self.cut(&[id], &rest, None);
        sleep_ms(behind_ms);
        let target = self
            .leader(20)
            .and_then(|l| self.status(l))
            .and_then(|s| s["commit"].as_u64())
            .unwrap_or(0);
        self.heal(&self.members());
        for i in 0..restarts {
            snaps += self.snapshots(id);
            self.procs.lock().kill9(id);
            let _ = self.procs.lock().spawn(id, None);
            sleep_ms(300 + 200 * i as u64);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            if self
                .status(id)
                .and_then(|s| s["applied"].as_u64())
                .is_some_and(|a| a >= target)
            {
                snaps += self.snapshots(id);
                let ms = t0.elapsed().as_millis();
                let outcome = format!("caught up to {target} {ms} ms after {restarts} restarts; {snaps} snapshots received");
                return (vec![id], outcome);
            }
            sleep_ms(100);
        }
        (vec![id], format!("not caught up to {target} within 60 s"))
    }

    /// Snapshots node `id`'s current process received.
    pub(super) fn snapshots(&self, id: u64) -> u64 {
        let m = call(
            &self.addrs[id as usize],
            "GET",
            "/metrics",
            b"",
            &[],
            Duration::from_secs(2),
        )
        .map_or(String::new(), |a| a.body);
        m.lines()
            .find(|l| l.starts_with("raft_messages_received_total") && l.contains("MsgSnapshot"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    }
}
