//! `kv node --join`: a new node joins a running cluster by itself.
//!
//! 1. It learns every member's addresses from the member it joins through (`GET /members`), so
//!    that it can reach, and accept connections from, whichever member leads, even if `--peers`
//!    lists only some of them. Then it asks that member (`POST /admin/members`, redirected to the
//!    leader) to add it as a learner, with its peer and HTTP addresses. A learner receives the log but does not vote, so a node
//!    that is far behind never weakens the quorum.
//! 2. The leader finds the learner's log empty and sends it a snapshot (taken when the learner was
//!    added); the learner installs it and then follows the log.
//! 3. Once the leader reports the learner replicating and past the index of its own addition,
//!    and every other group has added it too (each group's leader follows group 0's
//!    configuration, see `peer::follow`, and sends it that group's snapshot), it asks to be
//!    promoted to voter.
//!
//! 4. The join ends when the promotion is answered. A node removed by an operator while it was
//!    joining finds itself out of the configuration it was in, and ends the join without asking
//!    to be added again.
//!
//! Every step is idempotent: a restarted joiner picks up where its configuration says it is (a
//! restart with `--join` after a removal asks again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use slog::{info, warn, Logger};

use crate::base::options::JoinTarget;
use crate::http::client::Dialer;
use crate::node::app::App;
use crate::peer::members::{is_member, Addrs};

/// Where the joiner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Not in the configuration: ask to be added as a learner.
    Add,
    /// A learner: wait until caught up, then ask to be promoted.
    Promote,
    /// A voter: done.
    Done,
}

fn step(app: &App) -> Step {
    let s = app.status();
    let me = app.opts.id;
    if s.conf.voters.contains(&me) {
        Step::Done
    } else if is_member(&s.conf, me) {
        Step::Promote
    } else {
        Step::Add
    }
}

/// Run the join until this node is a voter or `stop` is set. The join ends when its promotion
/// is answered, and also if the node finds itself out of the configuration once it has applied
/// its own addition (or once its configuration listed it): an operator removed it while it was
/// joining, and it does not add itself back (a restart with `--join` asks again). Between its
/// addition and the snapshot that brings it, it waits rather than asking again.
pub fn run(app: Arc<App>, target: JoinTarget, stop: Arc<AtomicBool>, log: Logger) {
    let dialer = match &target.https_ca {
        None => Dialer::default(),
        Some(ca) => match Dialer::https(ca) {
            Ok(d) => d,
            Err(e) => {
                slog::error!(log, "cannot join: the HTTPS CA"; "error" => %e);
                return;
            }
        },
    };
    let join = Join {
        app: &app,
        dialer,
        addr: target.addr,
    };
    let mut added_at = 0;
    let mut last_error = String::new();
    // Whether this node's own configuration has listed it (as a learner or a voter).
    let mut was_member = false;
    while !stop.load(Ordering::Relaxed) {
        let now = step(&app);
        let result = match now {
            // Ok(true): this node is a voter now.
            Step::Done => Ok(true),
            Step::Add if was_member || (added_at > 0 && app.status().applied >= added_at) => {
                warn!(
                    log,
                    "removed from the cluster while joining: not asking to be added again"
                );
                return;
            }
            Step::Add if added_at > 0 => Err(format!(
                "added at index {added_at}: waiting for the leader's snapshot"
            )),
            Step::Add => join.add(&log).map(|index| {
                added_at = index;
                false
            }),
            Step::Promote => join.promote(added_at).map(|()| true),
        };
        was_member |= now == Step::Promote;
        match result {
            Ok(true) => {
                info!(log, "joined the cluster as a voter");
                return;
            }
            Ok(false) => {}
            Err(e) if e != last_error => {
                warn!(log, "joining: not yet"; "why" => join.explain(&e));
                last_error = e;
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The member asked first, and how to reach it.
struct Join<'a> {
    app: &'a App,
    dialer: Dialer,
    /// The member's HTTP address, `host:port`.
    addr: String,
}

impl Join<'_> {
    /// `why` with a hint where a plain client met an HTTPS member, or the other way round.
    fn explain(&self, why: &str) -> String {
        let hint = match self.dialer.scheme() {
            "http" if why.contains("not an HTTP answer") => {
                " (the member may serve HTTPS: give --join https://HOST:PORT, with --join-ca if \
                 its certificate is not signed by --peer-ca)"
            }
            "https" if why.contains("InvalidContentType") || why.contains("corrupt message") => {
                " (the member may serve plain HTTP: give --join http://HOST:PORT)"
            }
            _ => "",
        };
        format!("{why}{hint}")
    }

    fn get(&self, addr: &str, path: &str) -> Result<Value, String> {
        let a = self
            .dialer
            .request(addr, "GET", path, b"", &[])
            .map_err(|e| format!("{addr}: {e}"))?;
        serde_json::from_str(&a.body).map_err(|e| format!("{addr}: {e}"))
    }

    fn admin(&self, body: Value) -> Result<Value, String> {
        let token = self.app.opts.admin_token.as_ref().ok_or("no admin token")?;
        let auth = format!("Bearer {}", token.expose());
        let headers = [("Authorization", auth.as_str())];
        let body = body.to_string();
        let join = &self.addr;
        let a = self
            .dialer
            .request(join, "POST", "/admin/members", body.as_bytes(), &headers)
            .map_err(|e| format!("{join}: {e}"))?;
        if a.status != 200 {
            return Err(format!("{}: {}", a.status, a.body));
        }
        serde_json::from_str(&a.body).map_err(|e| e.to_string())
    }

    /// Learn the members' addresses from the member's `GET /members` (see `Members::learn`);
    /// TLS still authenticates every peer connection, so an address only says where to dial.
    fn learn_members(&self, log: &Logger) -> Result<(), String> {
        let v = self.get(&self.addr, "/members")?;
        let listed = v["members"].as_array().ok_or("no members listed")?;
        let mut book = self.app.first().members.write();
        for m in listed {
            let (Some(id), Some(peer)) = (m["id"].as_u64(), m["peer"].as_str()) else {
                continue;
            };
            let http = m["http"].as_str().map(str::to_string);
            let etcd = m["etcd"].as_str().map(str::to_string);
            let addrs = Addrs {
                peer: peer.to_string(),
                http,
                etcd,
            };
            if id != self.app.opts.id && book.learn(id, addrs) {
                info!(log, "learned a member's addresses"; "id" => id, "peer" => peer);
            }
        }
        Ok(())
    }

    /// Ask to be added as a learner (after learning the members); the index of the change.
    fn add(&self, log: &Logger) -> Result<u64, String> {
        self.learn_members(log)?;
        let o = &self.app.opts;
        let mut change = json!({"op": "add_learner", "id": o.id, "peer": o.peers[&o.id], "http": o.advertised_http()});
        if let Some(etcd) = o.etcd_of(o.id) {
            change["etcd"] = etcd.into();
        }
        let v = self.admin(json!({"changes": [change]}))?;
        Ok(v["index"].as_u64().unwrap_or(0))
    }

    /// Ask to be promoted once the leader sees this learner caught up with its own addition,
    /// and (with many groups) every group here has it in its configuration, as a learner caught
    /// up to its own addition in that group: a group then never makes it a voter before it has
    /// the group's snapshot.
    fn promote(&self, added_at: u64) -> Result<(), String> {
        let app = self.app;
        let me = app.opts.id;
        let missing = app.groups.all.iter();
        let missing = missing.filter(|g| !is_member(&g.status.read().conf, me));
        let missing = missing.count();
        if missing > 0 {
            return Err(format!("{missing} groups have not added this node yet"));
        }
        let (progress, matched) = self.leader_view()?;
        let applied = app.status().applied;
        // Probe is as good as replicate once the leader knows it matched its addition: a
        // quiescent group (shared liveness) sends nothing that would move the learner's
        // progress on.
        if progress == "snapshot" || matched < added_at.max(1) || applied < added_at {
            return Err(format!(
                "catching up: {progress}, matched {matched}, applied {applied}, added at {added_at}"
            ));
        }
        self.admin(json!({"changes": [{"op": "add_voter", "id": me}]}))
            .map(|_| ())
    }

    /// This node's progress as the leader sees it: (state, matched).
    fn leader_view(&self) -> Result<(String, u64), String> {
        let me = self.app.opts.id;
        let mut v = self.get(&self.addr, "/members")?;
        if v["leader_id"] != v["id"] {
            let leader = v["leader_id"].clone();
            let addr = v["members"]
                .as_array()
                .and_then(|ms| ms.iter().find(|m| m["id"] == leader))
                .and_then(|m| m["http"].as_str())
                .ok_or("no leader known")?
                .to_string();
            v = self.get(&addr, "/members")?;
        }
        let mine = v["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["id"] == me))
            .ok_or("not in the leader's membership yet")?;
        let progress = mine["progress"].as_str().unwrap_or("unknown").to_string();
        Ok((progress, mine["matched"].as_u64().unwrap_or(0)))
    }
}
