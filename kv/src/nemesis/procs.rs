//! The nemesis's node processes: a `kv cluster` plan (TLS certificates, cluster id, admin
//! token, `--fault-injection`) for up to nine ids, of which the first few found the cluster and
//! the rest join later; signals, `kill -9`, restarts, and HTTP calls to a node.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;
use crate::cli::cluster::plan::Plan;
use crate::cli::netns::Hosts;
use crate::http::client::{split_url, Answer, Client};

/// Ids a run may use: founders first, then ids that join.
pub const MAX_IDS: u64 = 9;
/// Base ports are chosen here: above the kernel's ephemeral range (where outgoing connections
/// take local ports) and away from the test suite's range (20000..32000).
const BASE_PORTS: std::ops::Range<u16> = 61_000..63_400;

/// Why a call has no answer.
#[derive(Debug)]
pub enum NoAnswer {
    /// The request never left: it had no effect.
    NotSent(String),
    /// It was sent, and then the connection failed or timed out: the outcome is unknown.
    Lost(String),
}

/// What `kv cluster` passes to every node of a run.
pub struct ClusterFlags {
    /// raft-rs `LeaseBased` reads (the control).
    pub unsafe_lease_based: bool,
    /// Follower read leases of at most this many ms.
    pub follower_leases_ms: Option<u64>,
    /// More node flags.
    pub node_args: Vec<String>,
}

/// The running nodes.
pub struct Procs {
    /// With `--netns`: each node on a test host of its own (dropped after the nodes stop).
    pub hosts: Option<Hosts>,
    plan: Plan,
    founders: Vec<u64>,
    children: BTreeMap<u64, Child>,
    token: String,
    _ports: Vec<File>,
}

/// Lock `port` (a file lock shared with other runs) if it can be bound now.
fn try_port(port: u16) -> Option<File> {
    let dir = std::env::temp_dir().join("raft-lease-kv-test-ports");
    std::fs::create_dir_all(&dir).ok()?;
    let f = File::create(dir.join(port.to_string())).ok()?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    (locked && TcpListener::bind(("127.0.0.1", port)).is_ok()).then_some(f)
}

/// A base port whose peer, HTTP and etcd API ports for every id are free, and their locks.
fn reserve_base(seed: u64) -> Result<(u16, Vec<File>), String> {
    let span = (BASE_PORTS.end - BASE_PORTS.start) as u64;
    for i in 0..200u64 {
        let x = (seed ^ (std::process::id() as u64) << 20).wrapping_add(i * 7919);
        let base = BASE_PORTS.start + (x % span) as u16;
        let ports: Option<Vec<File>> = (1..=MAX_IDS as u16)
            .flat_map(|i| [base + i, base + 1000 + i, base + 2000 + i])
            .map(try_port)
            .collect();
        if let Some(p) = ports {
            return Ok((base, p));
        }
    }
    Err("no free base port in 200 tries".into())
}

impl Procs {
    /// Set up `dir` and start founders `1..=nodes`, on `hosts` if given; `flags` go to every
    /// node.
    pub fn start(
        dir: &Path,
        nodes: u64,
        seed: u64,
        flags: ClusterFlags,
        hosts: Option<Hosts>,
    ) -> Result<Procs, String> {
        let (base_port, ports) = reserve_base(seed)?;
        let layout = Layout::new(MAX_IDS, base_port);
        let args = ClusterArgs {
            fault_injection: true,
            unsafe_lease_based: flags.unsafe_lease_based,
            follower_leases_ms: flags.follower_leases_ms,
            node_args: flags.node_args,
            ..ClusterArgs::local(MAX_IDS, dir, base_port)
        };
        let mut plan = Plan::new(&args, dir, layout)?;
        if let Some(h) = &hosts {
            plan.hosts = (1..=MAX_IDS).map(|id| (id, h.addr(id))).collect();
        }
        let token = std::fs::read_to_string(dir.join("admin.token")).map_err(|e| e.to_string())?;
        let mut p = Procs {
            hosts,
            plan,
            founders: (1..=nodes).collect(),
            children: BTreeMap::new(),
            token: token.trim().to_string(),
            _ports: ports,
        };
        for id in 1..=nodes {
            p.spawn(id, None)?;
        }
        Ok(p)
    }

    /// Node `id`'s HTTP address.
    pub fn http(&self, id: u64) -> String {
        format!("{}:{}", self.plan.host(id), self.plan.layout.http_port(id))
    }

    /// Whether the nodes serve etcd's API (`--etcd-listen`).
    pub fn serves_etcd(&self) -> bool {
        self.plan.node_args(1).iter().any(|a| a == "--etcd-listen")
    }

    /// Node `id`'s etcd API address.
    pub fn etcd(&self, id: u64) -> String {
        format!("{}:{}", self.plan.host(id), self.plan.layout.etcd_port(id))
    }

    /// Node `id`'s peer address.
    pub fn peer(&self, id: u64) -> String {
        format!("{}:{}", self.plan.host(id), self.plan.layout.peer_port(id))
    }

    /// Start node `id` from its data dir, or, with `join`, as a new member through that node.
    /// Refused while a process of `id` still runs: two faults overlapping on one node (a kill
    /// and restart beside a lagging follower's restarts) must not start a second process on its
    /// data dir (the node would refuse it, exit 3, and the run would blame the node), nor lose
    /// track of the first.
    pub fn spawn(&mut self, id: u64, join: Option<u64>) -> Result<(), String> {
        if self.running(id) {
            return Err(format!("node {id} is already running"));
        }
        let list = |port: &dyn Fn(u64) -> u16| {
            let mut ids = self.founders.clone();
            ids.push(id);
            ids.sort_unstable();
            ids.dedup();
            ids.iter()
                .map(|&i| format!("{i}={}:{}", self.plan.host(i), port(i)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let l = self.plan.layout;
        let mut args = self.plan.node_args(id);
        for (flag, value) in [
            ("--peers", list(&|i| l.peer_port(i))),
            ("--peer-http", list(&|i| l.http_port(i))),
            ("--peer-etcd", list(&|i| l.etcd_port(i))),
        ] {
            // `--peer-etcd` only where the plan serves etcd's API (one group).
            if let Some(at) = args.iter().position(|a| a == flag) {
                args[at + 1] = value;
            }
        }
        if let Some(via) = join {
            args.extend(["--join".into(), self.http(via)]);
        }
        let node_dir = self.plan.dir.join(format!("node{id}"));
        std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.plan.log_path(id))
            .map_err(|e| e.to_string())?;
        let mut cmd = match &self.hosts {
            Some(h) => h.command(id, &self.plan.exe),
            None => std::process::Command::new(&self.plan.exe),
        };
        let child = cmd
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn node {id}: {e}"))?;
        self.children.insert(id, child);
        Ok(())
    }

    /// Whether node `id`'s process runs (started and not exited).
    pub fn running(&mut self, id: u64) -> bool {
        self.children
            .get_mut(&id)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Send `sig` to node `id` (if it runs).
    pub fn signal(&mut self, id: u64, sig: libc::c_int) {
        if self.running(id) {
            let pid = self.children[&id].id() as libc::pid_t;
            // SAFETY: a signal to a child this process spawned and has not reaped.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// `kill -9` node `id` and reap it.
    pub fn kill9(&mut self, id: u64) {
        if let Some(mut c) = self.children.remove(&id) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let text = std::fs::read_to_string(self.plan.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stop every node: SIGCONT (a paused node cannot die of SIGTERM), then SIGTERM, then kill.
    pub fn shutdown(mut self) {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        for id in ids {
            self.signal(id, libc::SIGCONT);
        }
        crate::cli::cluster::plan::shutdown(
            std::mem::take(&mut self.children).into_values().collect(),
        );
        drop(self.hosts.take()); // the namespaces go once no node runs in them
    }

    /// The admin bearer token's header value.
    pub fn auth(&self) -> String {
        format!("Bearer {}", self.token)
    }
}

/// One request to `addr` on a fresh connection, within `timeout`.
pub fn call(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Answer, NoAnswer> {
    let mut c = Client::connect(addr, timeout).map_err(|e| NoAnswer::NotSent(e.to_string()))?;
    c.request(method, path, body, headers)
        .map_err(|e| NoAnswer::Lost(e.to_string()))
}

/// Follow a 307 to where it points: the address and path, when it names a node.
pub fn redirect(a: &Answer) -> Option<(String, String)> {
    (a.status == 307).then_some(())?;
    a.location.as_deref().and_then(split_url)
}

/// A data dir for a run (kept with `keep`).
pub fn run_dir(keep: Option<&PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>), String> {
    match keep {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
            Ok((d.clone(), None))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("raft-lease-nemesis-")
                .tempdir()
                .map_err(|e| e.to_string())?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}
