//! The two systems `kv bench --data-scale` runs its scenario on, behind one type: the store's
//! three nodes (started as `kv bench --vs-etcd` starts them) and etcd's three members (as
//! `bench::etcd::member` starts them), each with a member per *slot* 0..=2 on fixed ports: start,
//! kill -9, restart, and replace a member.
//!
//! Replacing a member of the store: it is removed (`POST /admin/members` on the leader with the
//! admin token), killed, its data dir wiped, and a node of a new raft id (with a certificate of
//! the cluster CA for that id) starts on the slot's ports and data dir with `--join` through the
//! leader: it adds itself as a learner, catches up by snapshot and promotes itself. Replacing a
//! member of etcd: `member remove`, kill, wipe, `member add` with the same peer URL, then the
//! member starts with `--initial-cluster-state existing`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::datascale::stats::RssTable;
use crate::bench::datascale::view;
use crate::bench::etcd::member;
use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;
use crate::cli::cluster::plan::{admin_token_file, shutdown, Plan};

/// Members per system.
pub const MEMBERS: usize = 3;

/// How the members of one system are started.
enum Kind {
    /// The store: the cluster's plan, each slot's raft id and command line.
    Store {
        /// The plan `kv cluster` would follow (certificates, token, flags).
        plan: Plan,
        /// Each slot's raft id (a replaced slot gets a new one).
        ids: Vec<u64>,
        /// Each slot's `kv node` arguments.
        args: Vec<Vec<String>>,
    },
    /// etcd: the binary, the port base and the extra flags of every member.
    Etcd {
        /// The `etcd` binary.
        bin: PathBuf,
        /// As `member::spawn_member` takes it.
        base_port: u16,
        /// Flags after `EtcdCluster::start`'s.
        extra: Vec<String>,
        /// Each slot's `--initial-cluster-state`.
        states: Vec<&'static str>,
    },
}

/// How long a membership change may keep being refused (etcd refuses one until every member
/// has been connected for 5 s, so right after a restart) before the bench gives up.
const REFUSALS_WAIT: Duration = Duration::from_secs(120);

/// A replacement done.
#[derive(Debug)]
pub struct Replaced {
    /// When the new member was added (etcd: `member add` asked; the store: the joining node
    /// started, as it adds itself).
    pub added: Instant,
    /// What was refused before it was accepted (retried, not failed client requests).
    pub notes: Vec<String>,
}

/// A membership change asked again while it is refused, within [`REFUSALS_WAIT`].
struct Refusals {
    /// The change, for the note.
    what: String,
    /// When it was first asked.
    since: Instant,
    /// Refusals so far.
    count: u32,
    /// The first refusal's reason.
    first: Option<String>,
}

impl Refusals {
    /// No refusal yet of `what`.
    fn new(what: String) -> Refusals {
        Refusals {
            what,
            since: Instant::now(),
            count: 0,
            first: None,
        }
    }

    /// Note refusal `why`, and wait before the next try; an error once it has lasted too long.
    async fn again(&mut self, why: String) -> Result<(), String> {
        if self.since.elapsed() > REFUSALS_WAIT {
            return Err(format!(
                "{}: refused for {} s: {why}",
                self.what,
                REFUSALS_WAIT.as_secs()
            ));
        }
        self.count += 1;
        self.first.get_or_insert(why);
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    /// What was refused, if anything.
    fn note(&self) -> Option<String> {
        let first = self.first.as_deref()?;
        Some(format!(
            "{} refused {} time(s) over {:.1} s before it was accepted (first: {first})",
            self.what,
            self.count,
            self.since.elapsed().as_secs_f64()
        ))
    }
}

/// One running system.
pub struct System {
    /// `raft-lease` or `etcd`.
    pub name: &'static str,
    /// Its dir (the members' data dirs and logs are under it).
    pub dir: PathBuf,
    /// How its members start.
    kind: Kind,
    /// Each slot's etcd API address, `127.0.0.1:port`.
    endpoints: Vec<String>,
    /// Each slot's process, `None` while it is down.
    children: Vec<Option<Child>>,
    /// Each slot's process and peak memory.
    pub rss: Arc<RssTable>,
}

impl System {
    /// The store's three nodes in `dir`, ports from `base_port` (as `kv cluster` lays them
    /// out), with `node_args` added to every node's flags.
    pub fn start_store(dir: &Path, base_port: u16, node_args: &[String]) -> Result<System, String> {
        let cluster = ClusterArgs {
            node_args: node_args.to_vec(),
            ..ClusterArgs::local(MEMBERS as u64, dir, base_port)
        };
        let layout = Layout::new(MEMBERS as u64, base_port);
        layout.check()?;
        let plan = Plan::new(&cluster, dir, layout)?;
        let ids: Vec<u64> = (1..=MEMBERS as u64).collect();
        let args = ids.iter().map(|&id| plan.node_args(id)).collect();
        let endpoints = ids
            .iter()
            .map(|&id| format!("127.0.0.1:{}", layout.etcd_port(id)))
            .collect();
        let kind = Kind::Store { plan, ids, args };
        System::start(dir, "raft-lease", kind, endpoints)
    }

    /// etcd's three members in `dir`, ports from `base_port` (as `EtcdCluster::start` lays
    /// them out), with `extra` added to every member's flags.
    pub fn start_etcd(
        bin: &Path,
        dir: &Path,
        base_port: u16,
        extra: &[String],
    ) -> Result<System, String> {
        let kind = Kind::Etcd {
            bin: bin.to_path_buf(),
            base_port,
            extra: extra.to_vec(),
            states: vec!["new"; MEMBERS],
        };
        let endpoints = (0..MEMBERS as u16)
            .map(|i| format!("127.0.0.1:{}", base_port + 1 + i))
            .collect();
        System::start(dir, "etcd", kind, endpoints)
    }

    /// Start every slot of `kind`.
    fn start(
        dir: &Path,
        name: &'static str,
        kind: Kind,
        endpoints: Vec<String>,
    ) -> Result<System, String> {
        let mut s = System {
            name,
            dir: dir.to_path_buf(),
            kind,
            endpoints,
            children: (0..MEMBERS).map(|_| None).collect(),
            rss: Arc::new(RssTable::new(MEMBERS)),
        };
        for slot in 0..MEMBERS {
            s.spawn(slot)?;
        }
        Ok(s)
    }

    /// Each slot's etcd API address.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Slot `slot`'s data dir.
    pub fn member_dir(&self, slot: usize) -> PathBuf {
        match &self.kind {
            Kind::Store { .. } => self.dir.join(format!("node{}", slot + 1)),
            Kind::Etcd { .. } => self.dir.join(format!("m{slot}")),
        }
    }

    /// Start slot `slot`'s member (again), as it was last set up.
    pub fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let child = match &self.kind {
            Kind::Store { plan, args, .. } => {
                let log_path = plan.log_path(slot as u64 + 1);
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .map_err(|e| format!("{}: {e}", log_path.display()))?;
                Command::new(&plan.exe)
                    .args(&args[slot])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .map_err(|e| format!("spawn the store's slot {slot}: {e}"))?
            }
            Kind::Etcd {
                bin,
                base_port,
                extra,
                states,
            } => {
                member::spawn_member(bin, &self.dir, *base_port, slot as u16, states[slot], extra)?
            }
        };
        self.rss.set_pid(slot, Some(child.id()));
        self.children[slot] = Some(child);
        Ok(())
    }

    /// Kill slot `slot`'s member with SIGKILL (its memory sampled first) and reap it.
    pub fn kill9(&mut self, slot: usize) {
        self.rss.sample();
        self.rss.set_pid(slot, None);
        if let Some(mut c) = self.children[slot].take() {
            let _ = c.kill(); // SIGKILL; an error means it had exited already
            let _ = c.wait();
        }
    }

    /// Stop every member (SIGTERM, then SIGKILL after 5 s), their memory sampled first.
    pub fn stop(&mut self) {
        self.rss.sample();
        let children: Vec<Child> = self.children.iter_mut().filter_map(Option::take).collect();
        for slot in 0..MEMBERS {
            self.rss.set_pid(slot, None);
        }
        shutdown(children);
    }

    /// Replace slot `slot`'s member (not the leader, `leader`): remove it from the membership,
    /// kill it, wipe its data dir, add a member on its ports anew.
    pub async fn replace(&mut self, slot: usize, leader: view::View) -> Result<Replaced, String> {
        match self.kind {
            Kind::Store { .. } => self.replace_store(slot, leader).await,
            Kind::Etcd { .. } => self.replace_etcd(slot, leader).await,
        }
    }

    /// [`System::replace`] for the store.
    async fn replace_store(&mut self, slot: usize, leader: view::View) -> Result<Replaced, String> {
        let Kind::Store { plan, ids, .. } = &self.kind else {
            return Err("not the store".into());
        };
        let (old_id, new_id) = (ids[slot], ids.iter().max().copied().unwrap_or(0) + 1);
        let leader_http = format!(
            "127.0.0.1:{}",
            plan.layout.http_port(leader.leader_slot as u64 + 1)
        );
        let token_path = admin_token_file(&plan.dir)?;
        let tls = plan.dir.join("tls");
        let mut refusals = Refusals::new(format!("removing node {old_id}"));
        while let Err(e) = remove_node(&leader_http, &token_path, old_id).await {
            refusals.again(e).await?;
        }
        self.kill9(slot);
        wipe(&self.member_dir(slot))?;
        crate::tls::certs::make(&tls, &[new_id], &[], "http")?;
        if let Kind::Store { plan, ids, args } = &mut self.kind {
            args[slot] = joiner_args(plan, ids, slot, new_id, &leader_http)?;
            ids[slot] = new_id;
        }
        let added = Instant::now();
        self.spawn(slot)?;
        Ok(Replaced {
            added,
            notes: refusals.note().into_iter().collect(),
        })
    }

    /// [`System::replace`] for etcd.
    async fn replace_etcd(&mut self, slot: usize, leader: view::View) -> Result<Replaced, String> {
        let Kind::Etcd { base_port, .. } = &self.kind else {
            return Err("not etcd".into());
        };
        let peer_url = format!("http://127.0.0.1:{}", base_port + 11 + slot as u16);
        let mut c = view::connect(&[self.endpoints[leader.leader_slot].clone()]).await?;
        let list = view::within(10_000, c.member_list()).await?;
        let name = format!("m{slot}");
        let old = list
            .members()
            .iter()
            .find(|m| m.name() == name)
            .map(|m| m.id())
            .ok_or_else(|| format!("etcd lists no member {name}"))?;
        let mut removal = Refusals::new(format!("member remove {name}"));
        while let Err(e) = view::within(10_000, c.member_remove(old)).await {
            removal.again(e).await?;
        }
        self.kill9(slot);
        wipe(&self.member_dir(slot))?;
        let added = Instant::now();
        let mut addition = Refusals::new(format!("member add {peer_url}"));
        while let Err(e) = view::within(10_000, c.member_add([peer_url.as_str()], None)).await {
            addition.again(e).await?;
        }
        if let Kind::Etcd { states, .. } = &mut self.kind {
            states[slot] = "existing";
        }
        self.spawn(slot)?;
        Ok(Replaced {
            added,
            notes: [removal.note(), addition.note()]
                .into_iter()
                .flatten()
                .collect(),
        })
    }

    /// Wait (within `wait`) until the membership is whole again after a replacement: three
    /// voters, none joining (the store: the leader's `/members`; etcd: every member started,
    /// none a learner).
    pub async fn wait_members(&self, wait: Duration) -> Result<(), String> {
        let deadline = Instant::now() + wait;
        loop {
            let last = match self.members_whole().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!("the membership never became whole: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Ok` if the membership has three voters and nothing pending; else what it has.
    async fn members_whole(&self) -> Result<(), String> {
        let v = view::view(&self.endpoints, Duration::from_secs(10)).await?;
        match &self.kind {
            Kind::Store { plan, ids, .. } => {
                let addr = format!(
                    "127.0.0.1:{}",
                    plan.layout.http_port(v.leader_slot as u64 + 1)
                );
                let answer = tokio::task::spawn_blocking(move || {
                    crate::http::client::request(&addr, "GET", "/members", b"", &[])
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
                let m: serde_json::Value =
                    serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
                let mut want = ids.clone();
                want.sort_unstable();
                let voters: Vec<u64> = m["voters"]
                    .as_array()
                    .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
                    .unwrap_or_default();
                let done = voters == want && m["learners"] == serde_json::json!([]);
                match done && m["joint"] == false {
                    true => Ok(()),
                    false => Err(answer.body),
                }
            }
            Kind::Etcd { .. } => {
                let mut c = view::connect(&[self.endpoints[v.leader_slot].clone()]).await?;
                let list = view::within(10_000, c.member_list()).await?;
                let ms = list.members();
                let whole = ms.len() == MEMBERS
                    && ms.iter().all(|m| !m.name().is_empty() && !m.is_learner());
                match whole {
                    true => Ok(()),
                    false => Err(format!("{ms:?}")),
                }
            }
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for mut c in self.children.iter_mut().filter_map(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `POST /admin/members` removing node `id`, through the store's node at `http` (the leader;
/// a redirect to the leader is followed), with the admin token in `token_path`.
async fn remove_node(http: &str, token_path: &Path, id: u64) -> Result<(), String> {
    let token = std::fs::read_to_string(token_path)
        .map_err(|e| format!("{}: {e}", token_path.display()))?;
    let body = serde_json::json!({"changes": [{"op": "remove", "id": id}]}).to_string();
    let addr = http.to_string();
    let answer = tokio::task::spawn_blocking(move || {
        let auth = format!("Bearer {}", token.trim());
        let headers = [("Authorization", auth.as_str())];
        crate::http::client::request(&addr, "POST", "/admin/members", body.as_bytes(), &headers)
    })
    .await
    .map_err(|e| format!("the removal's thread: {e}"))?
    .map_err(|e| format!("remove node {id} through {http}: {e}"))?;
    match answer.status {
        200 => Ok(()),
        code => Err(format!("remove node {id}: {code} {}", answer.body)),
    }
}

/// Remove `dir` and everything in it (nothing if it is not there).
fn wipe(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// The value after `flag` in `args` set to `value`; an error if `flag` is not there.
fn set_flag(args: &mut [String], flag: &str, value: String) -> Result<(), String> {
    let i = args
        .iter()
        .position(|a| a == flag)
        .ok_or_else(|| format!("no {flag} among the node's flags"))?;
    let v = args
        .get_mut(i + 1)
        .ok_or_else(|| format!("{flag} without a value"))?;
    *v = value;
    Ok(())
}

/// The `kv node` arguments of node `new_id` taking slot `slot`'s place: the slot's arguments
/// with its id, certificate and the address lists changed (every slot under its current id,
/// this one under `new_id`), and `--join` through the leader's HTTP address `leader_http`.
fn joiner_args(
    plan: &Plan,
    ids: &[u64],
    slot: usize,
    new_id: u64,
    leader_http: &str,
) -> Result<Vec<String>, String> {
    let l = plan.layout;
    let id_of = |s: usize| if s == slot { new_id } else { ids[s] };
    let list = |port: &dyn Fn(u64) -> u16| {
        (0..MEMBERS)
            .map(|s| format!("{}=127.0.0.1:{}", id_of(s), port(s as u64 + 1)))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut a = plan.node_args(slot as u64 + 1);
    set_flag(&mut a, "--id", new_id.to_string())?;
    set_flag(&mut a, "--peers", list(&|n| l.peer_port(n)))?;
    set_flag(&mut a, "--peer-http", list(&|n| l.http_port(n)))?;
    set_flag(&mut a, "--peer-etcd", list(&|n| l.etcd_port(n)))?;
    let (cert, key) = crate::tls::certs::node_files(&plan.dir.join("tls"), new_id);
    set_flag(&mut a, "--peer-cert", cert.display().to_string())?;
    set_flag(&mut a, "--peer-key", key.display().to_string())?;
    a.extend(["--join".to_string(), format!("http://{leader_http}")]);
    Ok(a)
}
