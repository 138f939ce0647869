//! The nemesis's hands: it finds the leader, applies one fault, undoes it, and records when it
//! began and ended. Waits for the cluster (a leader, a member caught up) have generous deadlines:
//! a deadline passed is noted in the timeline, never judged as safety.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use serde_json::{json, Value};

use super::procs::{call, Procs, MAX_IDS};
use super::schedule::{Fault, Who};
use crate::cli::netns::{Block, Hosts, NetnsError};

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Its kind.
    pub kind: &'static str,
    /// The fault as scheduled.
    pub fault: Fault,
    /// The nodes it hit.
    pub nodes: Vec<u64>,
    /// When it began and ended (undone), ms since the run began.
    pub start_ms: u64,
    /// When it was undone.
    pub end_ms: u64,
    /// What happened (`done`, or why it was cut short).
    pub outcome: String,
}

/// The nemesis's view of the cluster.
pub struct Nemesis {
    /// The processes.
    pub procs: Mutex<Procs>,
    /// The ids clients send to (members), shared with them.
    pub targets: Arc<RwLock<Vec<u64>>>,
    /// Ids that have been members (their data dirs exist).
    pub used: Mutex<BTreeSet<u64>>,
    /// Faults so far.
    pub timeline: Mutex<Vec<Event>>,
    /// When the run began.
    pub start: Instant,
    /// HTTP addresses by id.
    pub addrs: Arc<Vec<String>>,
    /// The admin `Authorization` header value.
    pub auth: String,
}

pub(super) fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

impl Nemesis {
    pub(super) fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub(super) fn members(&self) -> Vec<u64> {
        self.targets.read().clone()
    }

    /// A JSON call to node `id` with the admin token (no redirect followed), within 2 s.
    pub(super) fn http(
        &self,
        id: u64,
        method: &str,
        path: &str,
        body: &Value,
    ) -> Option<(u16, Value)> {
        let b = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let headers = [("Authorization", self.auth.as_str())];
        let a = call(
            &self.addrs[id as usize],
            method,
            path,
            &b,
            &headers,
            Duration::from_secs(2),
        )
        .ok()?;
        Some((
            a.status,
            serde_json::from_str(&a.body).unwrap_or(Value::Null),
        ))
    }

    /// A node's `/status`.
    pub fn status(&self, id: u64) -> Option<Value> {
        self.http(id, "GET", "/status", &Value::Null)
            .filter(|(c, _)| *c == 200)
            .map(|(_, v)| v)
    }

    /// The leader of the highest term among the members (None within `secs`).
    pub fn leader(&self, secs: u64) -> Option<u64> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            let best = self
                .members()
                .into_iter()
                .filter_map(|id| Some((self.status(id)?, id)))
                .filter(|(s, _)| s["role"] == "leader")
                .max_by_key(|(s, _)| s["term"].as_u64());
            if let Some((_, id)) = best {
                return Some(id);
            }
            sleep_ms(100);
        }
        None
    }

    pub(super) fn resolve(&self, who: Who, leader: u64) -> u64 {
        let others: Vec<u64> = self
            .members()
            .into_iter()
            .filter(|&i| i != leader)
            .collect();
        match who {
            Who::Leader => leader,
            Who::Follower(n) if !others.is_empty() => others[n % others.len()],
            Who::Follower(_) => leader,
        }
    }

    pub(super) fn admin(&self, id: u64, path: &str, body: Value) -> Option<(u16, Value)> {
        self.http(id, "POST", path, &body)
    }

    /// Cut `a` from `b` both ways, or with `dir` on `a` only (`out`: a's messages to b): in the
    /// transport (`/admin/partition`), or with `--netns` by the kernel (packets dropped).
    pub(super) fn cut(&self, a: &[u64], b: &[u64], dir: Option<&str>) {
        if self.kernel(|h| {
            for &x in a {
                for &y in b {
                    match dir {
                        None => h.block(x, y, Block::Drop, false)?,
                        Some("out") => h.block(x, y, Block::Drop, true)?,
                        Some(_) => h.block(y, x, Block::Drop, true)?,
                    }
                }
            }
            Ok(())
        }) {
            return;
        }
        for &x in a {
            let d = dir.unwrap_or("both");
            self.admin(x, "/admin/partition", json!({"peers": b, "direction": d}));
        }
        if dir.is_none() {
            for &y in b {
                self.admin(y, "/admin/partition", json!({"peers": a}));
            }
        }
    }

    pub(super) fn heal(&self, ids: &[u64]) {
        if self.kernel(|h| ids.iter().try_for_each(|&id| h.heal(id))) {
            return;
        }
        for &id in ids {
            self.admin(id, "/admin/heal", Value::Null);
        }
    }

    /// With `--netns`, change the kernel's rules with `f` and say so (`true`); a rule that
    /// cannot be set is printed (the fault is then weaker than drawn, never unsafe).
    pub(super) fn kernel(&self, f: impl FnOnce(&mut Hosts) -> Result<(), NetnsError>) -> bool {
        let mut procs = self.procs.lock();
        let Some(h) = procs.hosts.as_mut() else {
            return false;
        };
        if let Err(e) = f(h) {
            eprintln!("nemesis: a packet-filter rule failed: {e}");
        }
        true
    }

    pub(super) fn signal(&self, id: u64, sig: libc::c_int) {
        self.procs.lock().signal(id, sig);
    }

    /// Apply `fault`, undo it, record it.
    pub fn apply(&self, fault: &Fault) {
        let start_ms = self.ms();
        let (nodes, outcome) = match self.leader(20) {
            None => (vec![], "skipped: no leader within 20 s".to_string()),
            Some(l) => self.run(fault, l),
        };
        let e = Event {
            kind: fault.kind(),
            fault: fault.clone(),
            nodes,
            start_ms,
            end_ms: self.ms(),
            outcome,
        };
        println!(
            "[{:>7.1}s] {:<20} nodes {:?}: {}",
            e.start_ms as f64 / 1e3,
            e.kind,
            e.nodes,
            e.outcome
        );
        self.timeline.lock().push(e);
    }

    /// Runs `fault` with `l` as the leader; returns the nodes it touched and what happened.
    pub(super) fn run(&self, fault: &Fault, l: u64) -> (Vec<u64>, String) {
        let done = || "done".to_string();
        match *fault {
            Fault::Pause { who, ms } => {
                let id = self.resolve(who, l);
                self.stop_for(id, ms);
                (vec![id], done())
            }
            Fault::StallDisk { who, ms } => {
                let id = self.resolve(who, l);
                self.admin(id, "/admin/stall-disk", json!({"stalled": true}));
                sleep_ms(ms);
                self.admin(id, "/admin/stall-disk", json!({"stalled": false}));
                (vec![id], done())
            }
            Fault::Kill { who, down_ms } => {
                let id = self.resolve(who, l);
                self.procs.lock().kill9(id);
                sleep_ms(down_ms);
                (vec![id], self.restart(id))
            }
            Fault::IsolateLeader { ms } => self.isolate(l, ms, false),
            Fault::IsolatePauseLeader { ms } => self.isolate(l, ms, true),
            Fault::Split {
                ms,
                leader_in_minority,
            } => self.split(l, ms, leader_in_minority),
            Fault::OneWay { ms, out } => {
                let others = self.others(l);
                self.cut(&[l], &others, Some(if out { "out" } else { "in" }));
                sleep_ms(ms);
                self.heal(&[l]);
                (vec![l], done())
            }
            Fault::Clock {
                who,
                rate,
                ms,
                isolate,
            } => self.clock(self.resolve(who, l), rate, ms, isolate),
            Fault::Transfer { pause_ms } => self.transfer(l, pause_ms),
            Fault::SlowFollower { ms, delay_ms } => {
                let id = self.resolve(Who::Follower(delay_ms as usize), l);
                self.slow(id, ms, delay_ms);
                (vec![id], done())
            }
            Fault::RejectLeader { .. } | Fault::PairCut { .. } | Fault::Loss { .. } => {
                self.network(fault, l)
            }
            Fault::RemoveAddBack { who } => self.remove_add_back(self.resolve(who, l), l),
            Fault::Replace { who } => self.replace(self.resolve(who, l), l),
            Fault::Lagging {
                behind_ms,
                restarts,
            } => self.lagging(
                self.resolve(Who::Follower(behind_ms as usize), l),
                behind_ms,
                restarts,
            ),
        }
    }

    /// The members other than `l`.
    pub(super) fn others(&self, l: u64) -> Vec<u64> {
        self.members().into_iter().filter(|&i| i != l).collect()
    }

    /// Stops `id` (SIGSTOP) for `ms`, then lets it go on.
    pub(super) fn stop_for(&self, id: u64, ms: u64) {
        self.signal(id, libc::SIGSTOP);
        sleep_ms(ms);
        self.signal(id, libc::SIGCONT);
    }

    /// Cuts leader `l` from the others for `ms`; with `pause`, it is also stopped for those
    /// `ms` and then runs, still cut off, for one more second (a deposed leader resuming).
    pub(super) fn isolate(&self, l: u64, ms: u64, pause: bool) -> (Vec<u64>, String) {
        self.cut(&[l], &self.others(l), None);
        if pause {
            self.stop_for(l, ms);
        }
        sleep_ms(if pause { 1000 } else { ms });
        self.heal(&self.members());
        (vec![l], "done".into())
    }

    /// Splits the members into a minority (with leader `l` in it if `leader_in_minority`) and a
    /// majority for `ms`.
    pub(super) fn split(&self, l: u64, ms: u64, leader_in_minority: bool) -> (Vec<u64>, String) {
        let all = self.members();
        let minority_n = (all.len() - 1) / 2;
        let mut minority: Vec<u64> = if leader_in_minority { vec![l] } else { vec![] };
        let others = self.others(l);
        minority.extend(
            others
                .iter()
                .rev()
                .copied()
                .take(minority_n - minority.len()),
        );
        let majority: Vec<u64> = all
            .iter()
            .copied()
            .filter(|i| !minority.contains(i))
            .collect();
        self.cut(&minority, &majority, None);
        sleep_ms(ms);
        self.heal(&all);
        (minority, "done".into())
    }

    /// Runs `id`'s clock at `rate` for `ms`; with `isolate`, it is also cut off and stopped for
    /// the first half.
    pub(super) fn clock(&self, id: u64, rate: f64, ms: u64, isolate: bool) -> (Vec<u64>, String) {
        self.admin(id, "/admin/clock", json!({"rate": rate}));
        if isolate {
            self.cut(&[id], &self.others(id), None);
            self.stop_for(id, ms / 2);
        }
        sleep_ms(if isolate { ms / 2 } else { ms });
        if isolate {
            self.heal(&self.members());
        }
        self.admin(id, "/admin/clock", json!({"rate": 1.0}));
        (vec![id], "done".into())
    }

    /// Asks leader `l` to hand its leadership to the first other member, then stops it for
    /// `pause_ms` if given (a leader stalled in the middle of its transfer).
    pub(super) fn transfer(&self, l: u64, pause_ms: Option<u64>) -> (Vec<u64>, String) {
        let Some(&to) = self.others(l).first() else {
            return (vec![l], "skipped: no follower".into());
        };
        let r = self.admin(l, "/admin/transfer", json!({"to": to}));
        if let Some(ms) = pause_ms {
            self.stop_for(l, ms);
        }
        (
            vec![l, to],
            format!("transfer answered {:?}", r.map(|r| r.0)),
        )
    }

    /// For `ms`, delays what `id` receives by `delay_ms` in bursts (three delays long, then 200 ms
    /// without).
    pub(super) fn slow(&self, id: u64, ms: u64, delay_ms: u64) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(ms) {
            let slow = json!({"ms": delay_ms, "direction": "in"});
            self.admin(id, "/admin/delay", slow);
            sleep_ms(3 * delay_ms);
            self.admin(id, "/admin/delay", json!({"ms": 0, "direction": "in"}));
            sleep_ms(200);
        }
    }

    /// The faults only the kernel makes (`--netns`): connections to the leader reset, a cut
    /// between the leader and one follower, random loss at one node.
    pub(super) fn network(&self, fault: &Fault, l: u64) -> (Vec<u64>, String) {
        let (nodes, ms) = match *fault {
            Fault::RejectLeader { ms } => {
                let others = self.others(l);
                self.kernel(|h| {
                    others
                        .iter()
                        .try_for_each(|&o| h.block(l, o, Block::Reject, false))
                });
                (vec![l], ms)
            }
            Fault::PairCut { who, ms } => {
                let f = self.resolve(who, l);
                self.cut(&[l], &[f], None);
                (vec![l, f], ms)
            }
            Fault::Loss { who, ms, percent } => {
                let id = self.resolve(who, l);
                self.kernel(|h| h.loss(id, percent));
                (vec![id], ms)
            }
            _ => unreachable!("not a kernel fault: {fault:?}"),
        };
        sleep_ms(ms);
        // A reset is set at the leader only; the others at the nodes they name.
        let healed = match fault {
            Fault::RejectLeader { .. } => self.members(),
            _ => nodes.clone(),
        };
        self.heal(&healed);
        (nodes, "done".into())
    }

    /// Undo everything: resume, heal and reset the clock of every member, restart any member
    /// that is not running. Returns the members that had exited on their own.
    pub fn heal_all(&self) -> Vec<u64> {
        let mut exited = Vec::new();
        for id in self.members() {
            let mut p = self.procs.lock();
            p.signal(id, libc::SIGCONT);
            if !p.running(id) {
                exited.push(id);
                let _ = p.spawn(id, None);
            }
        }
        self.kernel(|h| (1..=MAX_IDS).try_for_each(|id| h.heal(id)));
        for id in self.members() {
            self.admin(id, "/admin/heal", Value::Null);
            self.admin(id, "/admin/clock", json!({"rate": 1.0}));
            self.admin(id, "/admin/delay", json!({"ms": 0, "direction": "in"}));
        }
        exited
    }
}
