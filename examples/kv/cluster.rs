//! `kv cluster`: a local cluster of node processes on loopback, to keep.
//!
//! Its data persists in `./kv-data` (as etcd keeps `default.etcd`); run it again and the nodes
//! restart from their data dirs. `--temp` gives a throwaway dir, removed on exit. It sets up
//! everything the nodes need with no manual step: a cluster CA and node certificates (`tls/`), a
//! cluster id, and an admin token (`admin.token`, for `/admin`). The layout (how many nodes, which
//! ports) is recorded in `cluster.json` and kept on later runs.
//!
//! A node that dies is reported on the console with its last error and a hint, and the others
//! keep running; the console prints the exact command that restarts it, and takes `restart N`
//! (and `stop N`, `status`) on standard input. Ctrl-C stops every node.

use std::io::{BufRead, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::admin::AdminToken;

/// `kv cluster`'s options.
#[derive(Args)]
pub struct ClusterArgs {
    /// How many nodes (1 to 9; default 3, or what the data dir holds).
    #[arg(long)]
    pub nodes: Option<u64>,
    /// Data directory, kept across runs (one subdirectory per node).
    #[arg(long, default_value = "kv-data")]
    pub data_dir: PathBuf,
    /// A throwaway data directory instead, removed on exit.
    #[arg(long, conflicts_with = "data_dir")]
    pub temp: bool,
    /// Peer ports are BASE+1..BASE+N; HTTP ports are BASE+1001..BASE+1000+N (default 7000, or
    /// what the data dir holds).
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Passed to every node: extra one-way delay on peer messages.
    #[arg(long, default_value_t = 0)]
    pub peer_delay_ms: u64,
    /// Passed to every node: `/admin/partition`, `/admin/heal` and `/admin/clock`.
    #[arg(long)]
    pub fault_injection: bool,
    /// Passed to every node (UNSAFE, demonstrations only).
    #[arg(long)]
    pub unsafe_lease_based: bool,
    /// Passed to every node: plaintext, unauthenticated peers (UNSAFE, local experiments only).
    #[arg(long)]
    pub insecure_peers: bool,
    /// More flags for every node, after `--` (for example `-- --snapshot-every 1000`).
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

/// What a cluster's dir records: how many nodes and on which ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Nodes 1..=nodes.
    pub nodes: u64,
    /// The base port.
    pub base_port: u16,
}

impl Layout {
    /// Node `id`'s peer port.
    pub fn peer_port(&self, id: u64) -> u16 {
        self.base_port + id as u16
    }

    /// Node `id`'s HTTP port.
    pub fn http_port(&self, id: u64) -> u16 {
        self.base_port + 1000 + id as u16
    }

    /// Refuse a layout whose ports would overflow (or use port 0).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=9).contains(&self.nodes) {
            return Err("--nodes must be 1 to 9".into());
        }
        let top = self.base_port as u64 + 1000 + self.nodes;
        if top > u16::MAX as u64 || self.base_port == 0 {
            return Err(format!(
                "--base-port {}: the HTTP ports would run to {top}, past 65535; use a base port of at most {}",
                self.base_port,
                u16::MAX as u64 - 1000 - self.nodes
            ));
        }
        Ok(())
    }

    fn list(&self, port: impl Fn(u64) -> u16) -> String {
        (1..=self.nodes)
            .map(|i| format!("{i}=127.0.0.1:{}", port(i)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The layout recorded in `dir`, or the one the options ask for (recorded now).
fn layout(args: &ClusterArgs, dir: &Path) -> Result<Layout, String> {
    let path = dir.join("cluster.json");
    let asked = Layout {
        nodes: args.nodes.unwrap_or(3),
        base_port: args.base_port.unwrap_or(7000),
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        asked.check()?;
        let json = serde_json::to_string(&asked).expect("a layout serializes");
        std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(asked);
    };
    let kept: Layout =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let differs = args.nodes.is_some_and(|n| n != kept.nodes)
        || args.base_port.is_some_and(|p| p != kept.base_port);
    if differs {
        return Err(format!(
            "{} holds a cluster of {} nodes on base port {}; run without --nodes/--base-port to \
             restart it, or use another --data-dir (or --temp) for a new one",
            dir.display(),
            kept.nodes,
            kept.base_port
        ));
    }
    kept.check()?;
    Ok(kept)
}

/// The cluster id in `dir/cluster-id`, made up the first time.
fn cluster_id(dir: &Path) -> Result<String, String> {
    let path = dir.join("cluster-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_string());
    }
    let token = AdminToken::generate().map_err(|e| e.to_string())?;
    let id = format!("kv-{}", &token.expose()[..12]);
    std::fs::write(&path, &id).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(id)
}

/// The admin token in `dir/admin.token` (mode 0600), made up the first time.
pub fn admin_token_file(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join("admin.token");
    if !path.exists() {
        let token = AdminToken::generate().map_err(|e| e.to_string())?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(token.expose().as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(path)
}

/// How to start each node of a cluster in `dir`.
pub struct Plan {
    /// The program (this one).
    pub exe: PathBuf,
    /// The cluster's dir.
    pub dir: PathBuf,
    /// Its layout.
    pub layout: Layout,
    /// Flags every node gets.
    pub common: Vec<String>,
    /// Whether peers talk plaintext.
    pub insecure: bool,
}

impl Plan {
    /// Set up `dir` (certificates, cluster id, admin token) for `layout`.
    pub fn new(args: &ClusterArgs, dir: &Path, layout: Layout) -> Result<Plan, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        if !args.insecure_peers {
            let ids: Vec<u64> = (1..=layout.nodes).collect();
            crate::certs::make(&dir.join("tls"), &ids, &[])?;
        }
        let mut common = vec!["--cluster-id".to_string(), cluster_id(dir)?];
        common.push("--admin-token-file".into());
        common.push(admin_token_file(dir)?.display().to_string());
        common.extend(["--peer-delay-ms".into(), args.peer_delay_ms.to_string()]);
        let flags = [
            (args.fault_injection, "--fault-injection"),
            (args.unsafe_lease_based, "--unsafe-lease-based"),
            (args.insecure_peers, "--insecure-peers"),
        ];
        common.extend(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, f)| f.to_string()),
        );
        common.extend(args.node_args.iter().cloned());
        Ok(Plan {
            exe,
            dir: dir.to_path_buf(),
            layout,
            common,
            insecure: args.insecure_peers,
        })
    }

    /// Node `id`'s arguments.
    pub fn node_args(&self, id: u64) -> Vec<String> {
        let l = self.layout;
        let node_dir = self.dir.join(format!("node{id}"));
        let mut a: Vec<String> = vec![
            "node".into(),
            "--id".into(),
            id.to_string(),
            "--peers".into(),
            l.list(|i| l.peer_port(i)),
            "--peer-http".into(),
            l.list(|i| l.http_port(i)),
            "--http".into(),
            format!("127.0.0.1:{}", l.http_port(id)),
            "--data-dir".into(),
            node_dir.display().to_string(),
        ];
        if !self.insecure {
            let tls = self.dir.join("tls");
            let (cert, key) = crate::certs::node_files(&tls, id);
            for (flag, path) in [
                ("--peer-ca", tls.join("ca.pem")),
                ("--peer-cert", cert),
                ("--peer-key", key),
            ] {
                a.push(flag.into());
                a.push(path.display().to_string());
            }
        }
        a.extend(self.common.iter().cloned());
        a
    }

    /// The command line that starts node `id`, to paste in a shell.
    pub fn command_line(&self, id: u64) -> String {
        let quote = |s: &str| {
            if s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
            {
                s.to_string()
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            }
        };
        std::iter::once(self.exe.display().to_string())
            .chain(self.node_args(id))
            .map(|s| quote(&s))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The log file of node `id`.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node{id}.log"))
    }

    /// Start node `id`, its standard error appended to its log.
    pub fn spawn(&self, id: u64) -> Result<Child, String> {
        let node_dir = self.dir.join(format!("node{id}"));
        std::fs::create_dir_all(&node_dir).map_err(|e| format!("{}: {e}", node_dir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(|e| e.to_string())?;
        Command::new(&self.exe)
            .args(self.node_args(id))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn node {id}: {e}"))
    }
}

/// `kv cluster`.
pub fn run(args: ClusterArgs) -> i32 {
    let temp = match args.temp {
        false => None,
        true => match tempfile::Builder::new().prefix("raft-lease-kv-").tempdir() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: cannot create a temporary directory: {e}");
                return 1;
            }
        },
    };
    let dir = temp
        .as_ref()
        .map_or(args.data_dir.clone(), |t| t.path().to_path_buf());
    let prepared = std::fs::create_dir_all(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|_| layout(&args, &dir))
        .and_then(|l| Plan::new(&args, &dir, l));
    let plan = match prepared {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("error: cannot handle signals: {e}");
            return 1;
        }
    }
    let code = crate::supervise::run(&plan, &stop, temp.is_some());
    match temp {
        Some(t) => {
            drop(t);
            println!("removed {}", dir.display());
        }
        None => println!(
            "data kept in {}: run the same `kv cluster` command again to restart the nodes",
            dir.display()
        ),
    }
    code
}

/// Read console commands (`restart N`, `stop N`, `status`) into a channel, until stdin closes.
pub fn console() -> crossbeam_channel::Receiver<String> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_string()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Stop `children` with SIGTERM, then SIGKILL after 5 s.
pub fn shutdown(children: Vec<Child>) {
    for c in &children {
        // SAFETY: sending SIGTERM to a child we spawned and have not reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for mut c in children {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if c.try_wait().ok().flatten().is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    println!("all nodes stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_that_would_overflow_are_refused() {
        let ok = Layout {
            nodes: 3,
            base_port: 7000,
        };
        assert_eq!(ok.check(), Ok(()));
        assert_eq!((ok.peer_port(1), ok.http_port(3)), (7001, 8003));
        let top = Layout {
            nodes: 3,
            base_port: 65535 - 1003,
        };
        assert_eq!(top.check(), Ok(()), "the last HTTP port is 65535");
        for base in [65000, 65535 - 1002, 0] {
            let e = Layout {
                nodes: 3,
                base_port: base,
            }
            .check()
            .unwrap_err();
            assert!(e.contains("--base-port"), "{base}: {e}");
        }
        assert!(Layout {
            nodes: 10,
            base_port: 7000
        }
        .check()
        .is_err());
    }
}
