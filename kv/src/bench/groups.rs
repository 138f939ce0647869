//! `kv bench --groups N`: a store of many groups on three real processes, in shared liveness and
//! in per-group liveness one after the other in the same run, each measured the same way:
//!
//! - **idle**: after every group is led with a lease and, in shared mode, every group quiescent
//!   on every node (in per-group mode, `2 × election timeout` more), the nodes' CPU (from `/proc`) and the messages they send (raft,
//!   support and fortification, counted one by one) over `--idle-s`, per node;
//! - **leases**: the share of groups whose leader holds a lease at the end of the idle period;
//! - **follower reads** (with `--follower-leases-ms`): one `GET ?read=local` of every group at
//!   each of its two followers, and the share served there rather than refused for want of a
//!   read lease;
//! - **first reads**: one `GET ?read=auto` on every group's leader, and how many fell back to a
//!   ReadIndex round instead of the lease;
//! - **memory**: each node's resident memory over the number of groups (an upper bound: it
//!   includes what a node of one group holds);
//! - **failover**: kill -9 the node that leads the most groups; for each group it led, the time
//!   until a surviving node leads it with a lease, beside the bound `P + election timeout + 1 s`.
//!
//! With `--json PATH` it writes one cell per mode (see [`GroupsCell::to_json`]).

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::cpu::process_cpu_s;
use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;
use crate::cli::cluster::plan::{shutdown, Plan};
use crate::http::client::{request, Client};
use crate::state::placement::group_of;

/// The nodes' election timeout (ms): the lease promise `P` equals it.
const ELECTION_MS: u64 = 1_000;

/// One mode's measurements.
#[derive(Debug, Clone)]
pub struct GroupsCell {
    /// `shared` or `per_group`.
    pub mode: &'static str,
    /// Groups per node.
    pub groups: u32,
    /// Mean CPU of one node while idle, as a share of one core.
    pub idle_cpu_per_node: f64,
    /// The busiest node's CPU while idle, as a share of one core.
    pub idle_cpu_max_node: f64,
    /// Mean messages a node sent per second while idle.
    pub msgs_per_s_per_node: f64,
    /// Groups whose leader held a lease at the end of the idle period, over all groups.
    pub leased_share: f64,
    /// The nodes' follower read leases (`G`, ms), if on.
    pub follower_leases_ms: Option<u64>,
    /// With follower read leases: of the `read=local` reads after the idle period, one per group
    /// at each of its followers, the share served there.
    pub follower_read_share: Option<f64>,
    /// The number of those reads.
    pub follower_reads_asked: u64,
    /// First reads after the idle period served by ReadIndex instead of the lease.
    pub first_read_fallbacks: u64,
    /// Failover: the slowest group's time to a leased leader, and the 99th percentile.
    pub failover_max_ms: f64,
    /// The 99th percentile of the same.
    pub failover_p99_ms: f64,
    /// `P + election timeout + 1 s`.
    pub failover_bound_ms: f64,
    /// Groups the killed node led.
    pub failover_groups: usize,
    /// Of those, the groups not led with a lease again within the wait (counted at the wait).
    pub failover_unrecovered: usize,
    /// Resident bytes of a node over its groups (mean over the nodes).
    pub bytes_per_group: f64,
}

impl GroupsCell {
    /// The cell as JSON (`kv bench --groups --json`).
    pub fn to_json(&self) -> Value {
        json!({"mode": self.mode, "groups": self.groups,
               "idle_cpu_per_node": self.idle_cpu_per_node,
               "idle_cpu_max_node": self.idle_cpu_max_node,
               "msgs_per_s_per_node": self.msgs_per_s_per_node,
               "leased_share": self.leased_share,
               "follower_leases_ms": self.follower_leases_ms,
               "follower_read_share": self.follower_read_share,
               "follower_reads_asked": self.follower_reads_asked,
               "first_read_fallbacks": self.first_read_fallbacks,
               "failover_max_ms": self.failover_max_ms, "failover_p99_ms": self.failover_p99_ms,
               "failover_bound_ms": self.failover_bound_ms,
               "failover_groups": self.failover_groups,
               "failover_unrecovered": self.failover_unrecovered,
               "bytes_per_group": self.bytes_per_group})
    }

    /// One line of the table.
    pub fn line(&self) -> String {
        format!(
            "{:<10} {:>7} {:>9.4} {:>8.4} {:>10.0} {:>7.3} {:>6} {:>9} {:>8.0} {:>8.0} {:>8.0} ({} groups) {:>8.0}",
            self.mode,
            self.groups,
            self.idle_cpu_per_node,
            self.idle_cpu_max_node,
            self.msgs_per_s_per_node,
            self.leased_share,
            self.follower_read_share
                .map_or("-".to_string(), |s| format!("{s:.3}")),
            self.first_read_fallbacks,
            self.failover_max_ms,
            self.failover_p99_ms,
            self.failover_bound_ms,
            self.failover_groups,
            self.bytes_per_group,
        )
    }
}

/// The table's header.
pub fn header() -> &'static str {
    "mode        groups  cpu/core  cpu max  msgs/s/node  leased  local  fallbacks  fo max   fo p99   bound   (led)  B/group"
}

/// A three-node cluster of `groups` groups in `mode` (`shared` or `per-group`), running.
struct Nodes {
    children: Vec<Child>,
    layout: Layout,
}

impl Nodes {
    fn start(dir: &std::path::Path, base_port: u16, how: &Setup) -> Result<Nodes, String> {
        let cluster = ClusterArgs {
            nodes: Some(3),
            data_dir: dir.to_path_buf(),
            temp: false,
            base_port: Some(base_port),
            http_base_port: None,
            etcd_base_port: None,
            groups: Some(how.groups),
            peer_delay_ms: 0,
            fault_injection: false,
            unsafe_lease_based: false,
            follower_leases_ms: how.follower_leases_ms,
            insecure_peers: false,
            node_args: vec![
                "--liveness".into(),
                how.mode.into(),
                "--election-ms".into(),
                ELECTION_MS.to_string(),
            ],
        };
        let layout = Layout::new(3, base_port);
        let plan = layout
            .check()
            .and_then(|_| Plan::new(&cluster, dir, layout))?;
        let mut children = Vec::new();
        for id in 1..=3 {
            match plan.spawn(id) {
                Ok(c) => children.push(c),
                Err(e) => {
                    // None left running to hold the ports the next mode needs.
                    shutdown(children);
                    return Err(e);
                }
            }
        }
        Ok(Nodes { children, layout })
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.layout.http_port(id))
    }

    fn pid(&self, id: u64) -> u32 {
        self.children[id as usize - 1].id()
    }
}

/// Per group: the node that leads it, and whether its lease is held there (from `/groups` of
/// every node in `among` that answers).
fn leaders(n: &Nodes, among: &[u64]) -> BTreeMap<u64, (u64, bool)> {
    let mut out = BTreeMap::new();
    for &id in among {
        let Ok(a) = request(&n.addr(id), "GET", "/groups", b"", &[]) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&a.body) else {
            continue;
        };
        for g in v["list"].as_array().into_iter().flatten() {
            if g["leader_here"] == true {
                let gid = g["group"].as_u64().unwrap_or(u64::MAX);
                out.insert(gid, (id, g["leased"] == true));
            }
        }
    }
    out
}

/// Wait until every group of `groups` is led with a lease among `among` (within `secs`).
fn all_leased(n: &Nodes, among: &[u64], groups: u32, secs: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let l = leaders(n, among);
        let leased = l.values().filter(|(_, held)| *held).count();
        if leased == groups as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{leased} of {groups} groups leased after {secs} s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until no node ticks any group (every group quiescent; within `secs`).
fn quiesced(n: &Nodes, secs: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let awake: Vec<u64> = (1..=3)
            .map(|id| {
                let a = request(&n.addr(id), "GET", "/status", b"", &[]);
                let v: Value = a
                    .ok()
                    .and_then(|a| serde_json::from_str(&a.body).ok())
                    .unwrap_or(Value::Null);
                v["groups_awake"].as_u64().unwrap_or(u64::MAX)
            })
            .collect();
        if awake.iter().all(|&a| a == 0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("groups still awake after {secs} s: {awake:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Messages node `addr` has sent (`kv_peer_messages_sent_total`).
fn messages_sent(addr: &str) -> Result<f64, String> {
    let a = request(addr, "GET", "/metrics", b"", &[]).map_err(|e| e.to_string())?;
    a.body
        .lines()
        .find(|l| l.starts_with("kv_peer_messages_sent_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .ok_or_else(|| "no kv_peer_messages_sent_total".to_string())
}

/// Resident bytes of process `pid`.
fn rss_bytes(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib * 1024.0)
}

/// Over `secs`: (mean CPU of a node as a share of one core, the busiest node's, mean messages
/// per second of a node).
fn idle(n: &Nodes, secs: u64) -> Result<(f64, f64, f64), String> {
    let cpu = |n: &Nodes| -> Vec<f64> {
        let of = |id: u64| process_cpu_s(&n.pid(id).to_string()).unwrap_or(0.0);
        (1..=3).map(of).collect()
    };
    let msgs =
        |n: &Nodes| -> Result<f64, String> { (1..=3).map(|id| messages_sent(&n.addr(id))).sum() };
    let (cpu0, msgs0, t0) = (cpu(n), msgs(n)?, Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (cpu1, msgs1, took) = (cpu(n), msgs(n)?, t0.elapsed().as_secs_f64());
    let used: Vec<f64> = cpu1
        .iter()
        .zip(&cpu0)
        .map(|(b, a)| (b - a) / took)
        .collect();
    let max = used.iter().copied().fold(0.0, f64::max);
    Ok((
        used.iter().sum::<f64>() / 3.0,
        max,
        (msgs1 - msgs0) / took / 3.0,
    ))
}

/// A key of each group (found by placing candidates).
fn key_per_group(groups: u32) -> Vec<String> {
    let mut keys = vec![String::new(); groups as usize];
    let mut missing = groups as usize;
    for i in 0u64.. {
        let k = format!("g{i}");
        let slot = &mut keys[group_of(&k, groups) as usize];
        if slot.is_empty() {
            *slot = k;
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    keys
}

/// One `GET ?read=auto` on every group's leader; how many were served by ReadIndex.
fn first_reads(n: &Nodes, groups: u32) -> Result<u64, String> {
    let leaders = leaders(n, &[1, 2, 3]);
    let mut clients: BTreeMap<u64, Client> = BTreeMap::new();
    let mut fallbacks = 0;
    for (g, key) in key_per_group(groups).iter().enumerate() {
        let leader = leaders.get(&(g as u64)).map_or(1, |l| l.0);
        let c = match clients.entry(leader) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let c = Client::connect(&n.addr(leader), Duration::from_secs(10));
                e.insert(c.map_err(|e| e.to_string())?)
            }
        };
        let a = c
            .request("GET", &format!("/kv/{key}?read=auto"), b"", &[])
            .map_err(|e| e.to_string())?;
        fallbacks += u64::from(!a.body.contains("\"read\":\"lease\""));
    }
    Ok(fallbacks)
}

/// One `GET ?read=local` of every group at each node that does not lead it: (served there,
/// asked). Served: a `200`, or a `404` (no such key: a read like any other), that says it was a
/// follower-lease read. Refused: `503 no_read_lease` (no valid read lease, or an entry the read
/// must show not applied yet). Any other answer, or a group with no known leader, is an error:
/// the share would not mean what it says.
fn follower_reads(n: &Nodes, groups: u32) -> Result<(u64, u64), String> {
    let leaders = leaders(n, &[1, 2, 3]);
    if leaders.len() != groups as usize {
        return Err(format!(
            "{} of {groups} groups have a known leader",
            leaders.len()
        ));
    }
    let keys = key_per_group(groups);
    let (mut served, mut asked) = (0u64, 0u64);
    for id in 1..=3u64 {
        let mut c =
            Client::connect(&n.addr(id), Duration::from_secs(10)).map_err(|e| e.to_string())?;
        for (g, key) in keys.iter().enumerate() {
            if leaders[&(g as u64)].0 == id {
                continue;
            }
            let a = c
                .request("GET", &format!("/kv/{key}?read=local"), b"", &[])
                .map_err(|e| e.to_string())?;
            match a.status {
                200 | 404 if a.body.contains("\"read\":\"follower_lease\"") => served += 1,
                503 if a.body.contains("no_read_lease") => {}
                s => return Err(format!("read=local of {key} at node {id}: {s} {}", a.body)),
            }
            asked += 1;
        }
    }
    Ok((served, asked))
}

/// How long failover is waited for; a group not led with a lease by then counts this long.
const FAILOVER_WAIT: Duration = Duration::from_secs(120);

/// Kill -9 the node leading the most groups; per group it led, ms until a survivor leads it with
/// a lease. (groups it led, max, p99, groups not led again within [`FAILOVER_WAIT`]).
fn failover(n: &mut Nodes) -> Result<(usize, f64, f64, usize), String> {
    let before = leaders(n, &[1, 2, 3]);
    let victim = (1..=3u64)
        .max_by_key(|id| before.values().filter(|(l, _)| l == id).count())
        .expect("three nodes");
    let led: Vec<u64> = before
        .iter()
        .filter(|(_, (l, _))| *l == victim)
        .map(|(g, _)| *g)
        .collect();
    let killed = Instant::now();
    n.children[victim as usize - 1]
        .kill()
        .map_err(|e| e.to_string())?;
    let survivors: Vec<u64> = (1..=3).filter(|&id| id != victim).collect();
    let mut done: BTreeMap<u64, f64> = BTreeMap::new();
    while done.len() < led.len() && killed.elapsed() < FAILOVER_WAIT {
        let now = leaders(n, &survivors);
        let ms = killed.elapsed().as_secs_f64() * 1e3;
        for g in &led {
            if now.get(g).is_some_and(|(_, held)| *held) {
                done.entry(*g).or_insert(ms);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let unrecovered = led.len() - done.len();
    let mut ms: Vec<f64> = done.into_values().collect();
    ms.extend(std::iter::repeat_n(
        FAILOVER_WAIT.as_secs_f64() * 1e3,
        unrecovered,
    ));
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok((led.len(), *ms.last().unwrap_or(&0.0), p99, unrecovered))
}

/// What one run of `measure` sets up.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Groups per node.
    pub groups: u32,
    /// The liveness mode: `shared` or `per-group`.
    pub mode: &'static str,
    /// Seconds of the idle period.
    pub idle_s: u64,
    /// The nodes' follower read leases (`G`, ms), if on.
    pub follower_leases_ms: Option<u64>,
}

/// One mode, measured: start, settle, idle, leases, follower reads, first reads, memory,
/// failover, stop.
pub fn measure(dir: &std::path::Path, base_port: u16, how: &Setup) -> Result<GroupsCell, String> {
    let mut n = Nodes::start(dir, base_port, how)?;
    let result = measure_on(&mut n, how);
    shutdown(std::mem::take(&mut n.children));
    result
}

fn measure_on(n: &mut Nodes, how: &Setup) -> Result<GroupsCell, String> {
    let groups = how.groups;
    all_leased(n, &[1, 2, 3], groups, 300)?;
    match how.mode {
        "shared" => quiesced(n, 120)?,
        _ => std::thread::sleep(Duration::from_millis(2 * ELECTION_MS)),
    }
    let (cpu, cpu_max, msgs) = idle(n, how.idle_s)?;
    let l = leaders(n, &[1, 2, 3]);
    let leased = l.values().filter(|(_, held)| *held).count() as f64 / f64::from(groups);
    let (served, asked) = match how.follower_leases_ms {
        Some(_) => follower_reads(n, groups)?,
        None => (0, 0),
    };
    let follower_read_share = (asked > 0).then(|| served as f64 / asked as f64);
    let fallbacks = first_reads(n, groups)?;
    let rss: f64 = (1..=3).map(|id| rss_bytes(n.pid(id))).sum::<f64>() / 3.0;
    let (led, max, p99, unrecovered) = failover(n)?;
    Ok(GroupsCell {
        mode: if how.mode == "shared" {
            "shared"
        } else {
            "per_group"
        },
        groups,
        idle_cpu_per_node: cpu,
        idle_cpu_max_node: cpu_max,
        msgs_per_s_per_node: msgs,
        leased_share: leased,
        follower_leases_ms: how.follower_leases_ms,
        follower_read_share,
        follower_reads_asked: asked,
        first_read_fallbacks: fallbacks,
        failover_max_ms: max,
        failover_p99_ms: p99,
        failover_bound_ms: (2 * ELECTION_MS + 1_000) as f64,
        failover_groups: led,
        failover_unrecovered: unrecovered,
        bytes_per_group: rss / f64::from(groups),
    })
}
