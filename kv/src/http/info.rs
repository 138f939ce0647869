//! `GET /status`, `GET /members`, `GET /groups` and `GET /metrics`.

use serde_json::{json, Value};

use crate::http::reply::{reply, Reply};
use crate::node::app::App;
use crate::peer::members::is_member;

pub fn status(app: &App) -> Reply {
    let s = app.status();
    let (state, remaining_ns) = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    // Only a leader holds a lease: elsewhere "expired" would read as a fault.
    let state = match s.role {
        "leader" => state.as_str(),
        _ => "not_leader",
    };
    reply(
        200,
        json!({"id": app.opts.id, "pid": std::process::id(), "role": s.role, "term": s.term, "leader_id": s.leader_id,
               "commit": s.commit, "applied": s.applied, "last_index": s.last_index,
               "log_entries": s.log_entries, "insecure_peers": app.opts.insecure_peers,
               "member": is_member(&s.conf, app.opts.id), "last_heard_ms": last_heard_ms(app),
               "lease": {"state": state, "remaining_ms": remaining_ns / 1_000_000},
               "promise": promise_json(app), "uptime_ms": app.promise.uptime_ms(&app.first().clock),
               "log_engine": app.opts.log_engine.map(|e| e.name()),
               "groups": app.groups.count(), "groups_led": groups_led(app),
               "groups_awake": app.groups.awake.load(std::sync::atomic::Ordering::Relaxed),
               "groups_behind_membership": app.groups.behind.load(std::sync::atomic::Ordering::Relaxed),
               "liveness": liveness(app), "disk_stalled": app.disk_stall.is_stalled()}),
    )
}

/// How many groups this node leads.
fn groups_led(app: &App) -> usize {
    app.groups
        .all
        .iter()
        .filter(|g| g.leadership.get().0)
        .count()
}

fn liveness(app: &App) -> &'static str {
    match app.opts.liveness {
        raft_lease::multi::LivenessMode::Shared => "shared",
        raft_lease::multi::LivenessMode::PerGroup => "per_group",
    }
}

/// `GET /groups`: every group's leader and term as this node knows them, and its configuration
/// as applied here.
pub fn groups(app: &App) -> Reply {
    let list: Vec<Value> = app
        .groups
        .all
        .iter()
        .map(|g| {
            let (here, leader) = g.leadership.get();
            let conf = g.status.read().conf_json();
            json!({"group": g.group, "leader_id": leader, "term": g.leadership.term(),
                   "leader_here": here, "leased": here && g.handle.lease_held(), "conf": conf})
        })
        .collect();
    reply(
        200,
        json!({"id": app.opts.id, "groups": app.groups.count(), "liveness": liveness(app),
               "groups_led": groups_led(app), "list": list}),
    )
}

/// On a node that does not lead, how many ms ago it last heard from the leader it knows.
fn last_heard_ms(app: &App) -> Option<u64> {
    match app.first().leadership.get() {
        (false, Some(leader)) => app.heard.ago_ms(leader),
        _ => None,
    }
}

/// This run's lease promise `P`, the longest promise of an earlier run it boots with (0: none
/// known), and the data dir's record now, all in ms.
fn promise_json(app: &App) -> Value {
    let p = &app.promise;
    json!({"promise_ms": p.promise_ms, "prior_promise_ms": p.found.prior_ms(),
           "recorded_promise_ms": p.recorded_ms()})
}

pub fn members(app: &App) -> Reply {
    let s = app.status();
    let book = app.first().members.read().clone();
    let mut body = s.conf_json();
    let list: Vec<Value> = book
        .addrs
        .iter()
        .filter(|(id, _)| is_member(&s.conf, **id))
        .map(|(id, a)| {
            let role = if s.conf.learners.contains(id) {
                "learner"
            } else {
                "voter"
            };
            let mut m = json!({"id": id, "role": role, "peer": a.peer, "http": a.http});
            if let Some(etcd) = &a.etcd {
                m["etcd"] = etcd.as_str().into();
            }
            if let Some(p) = s.progress.get(id) {
                m["matched"] = p.matched.into();
                m["progress"] = p.state.into();
            }
            m
        })
        .collect();
    body["id"] = app.opts.id.into();
    body["leader_id"] = s.leader_id.into();
    body["members"] = list.into();
    reply(200, body)
}

pub fn metrics(app: &App) -> Reply {
    let s = app.status();
    let lease = s.lease.unwrap_or((raft_lease::LeaseState::Expired, 0));
    app.metrics.http_open.set(app.conns.len() as u64);
    let body = app
        .metrics
        .render(app.opts.id, lease, &s.counters, &app.inflight);
    Reply::raw(200, "text/plain; version=0.0.4", body)
}
