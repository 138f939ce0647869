//! `kv cluster`: start N node processes on loopback, print their endpoints, stop them on Ctrl-C.
//!
//! It sets up everything the nodes need in its data dir, with no manual step: a throwaway cluster
//! CA and node certificates (`tls/`), a cluster id (`cluster-id`), and with `--fault-injection` an
//! admin token (`admin.token`).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::admin::AdminToken;

#[derive(Args)]
pub struct ClusterArgs {
    /// How many nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Data directory (one subdirectory per node). Default: a fresh temporary directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Peer ports are BASE+1..; HTTP ports are BASE+1001...
    #[arg(long, default_value_t = 7000)]
    pub base_port: u16,
    /// Passed to every node: extra one-way delay on peer messages.
    #[arg(long, default_value_t = 0)]
    pub peer_delay_ms: u64,
    /// Passed to every node.
    #[arg(long)]
    pub fault_injection: bool,
    /// Passed to every node (UNSAFE, demonstrations only).
    #[arg(long)]
    pub unsafe_lease_based: bool,
    /// Passed to every node: plaintext, unauthenticated peers (UNSAFE, local experiments only).
    #[arg(long)]
    pub insecure_peers: bool,
}

pub fn run(args: ClusterArgs) -> i32 {
    if !(1..=9).contains(&args.nodes) {
        eprintln!("error: --nodes must be 1..=9");
        return 2;
    }
    let temp = match args.data_dir {
        Some(_) => None,
        None => match tempfile::Builder::new().prefix("raft-lease-kv-").tempdir() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: cannot create a temporary directory: {e}");
                return 1;
            }
        },
    };
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.as_ref().expect("temp").path().to_path_buf());
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("error: cannot handle signals: {e}");
            return 1;
        }
    }
    let mut children = match spawn_all(&args, &dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    print_banner(&args, &dir);
    let code = supervise(&mut children, &stop);
    shutdown(children);
    if temp.is_some() {
        println!("removed {}", dir.display());
    }
    code
}

fn addrs(args: &ClusterArgs) -> (String, String) {
    let ids = 1..=args.nodes;
    let peers = ids
        .clone()
        .map(|i| format!("{i}=127.0.0.1:{}", args.base_port + i as u16))
        .collect::<Vec<_>>()
        .join(",");
    let https = ids
        .map(|i| format!("{i}=127.0.0.1:{}", args.base_port + 1000 + i as u16))
        .collect::<Vec<_>>()
        .join(",");
    (peers, https)
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

/// The flags that give node `id` its TLS files, cluster id and admin token.
fn security_args(args: &ClusterArgs, dir: &Path, id: u64) -> Result<Vec<String>, String> {
    let mut out = vec!["--cluster-id".to_string(), cluster_id(dir)?];
    if args.insecure_peers {
        out.push("--insecure-peers".into());
    } else {
        let tls = dir.join("tls");
        let (cert, key) = crate::certs::node_files(&tls, id);
        for (flag, path) in [
            ("--peer-ca", tls.join("ca.pem")),
            ("--peer-cert", cert),
            ("--peer-key", key),
        ] {
            out.push(flag.into());
            out.push(path.display().to_string());
        }
    }
    if args.fault_injection {
        out.push("--fault-injection".into());
        out.push("--admin-token-file".into());
        out.push(admin_token_file(dir)?.display().to_string());
    }
    Ok(out)
}

pub fn spawn_all(args: &ClusterArgs, dir: &Path) -> Result<Vec<Child>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let (peers, https) = addrs(args);
    if !args.insecure_peers {
        let ids: Vec<u64> = (1..=args.nodes).collect();
        crate::certs::make(&dir.join("tls"), &ids, &[])?;
    }
    let mut children = Vec::new();
    for id in 1..=args.nodes {
        let node_dir = dir.join(format!("node{id}"));
        std::fs::create_dir_all(&node_dir).map_err(|e| format!("{}: {e}", node_dir.display()))?;
        let log =
            std::fs::File::create(dir.join(format!("node{id}.log"))).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&exe);
        cmd.arg("node").args([
            "--id",
            &id.to_string(),
            "--peers",
            &peers,
            "--peer-http",
            &https,
        ]);
        cmd.args([
            "--http",
            &format!("127.0.0.1:{}", args.base_port + 1000 + id as u16),
        ]);
        cmd.arg("--data-dir").arg(&node_dir);
        cmd.args(["--peer-delay-ms", &args.peer_delay_ms.to_string()]);
        cmd.args(security_args(args, dir, id)?);
        if args.unsafe_lease_based {
            cmd.arg("--unsafe-lease-based");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn node {id}: {e}"))?;
        children.push(child);
    }
    Ok(children)
}

fn print_banner(args: &ClusterArgs, dir: &Path) {
    println!(
        "raft-lease KV cluster: {} nodes, data in {}",
        args.nodes,
        dir.display()
    );
    if args.insecure_peers {
        println!("  peers: PLAINTEXT, UNAUTHENTICATED (--insecure-peers): local experiments only");
    } else {
        println!(
            "  peers: mutual TLS, certificates in {}",
            dir.join("tls").display()
        );
    }
    if args.fault_injection {
        let token = dir.join("admin.token");
        println!(
            "  /admin: curl -H \"Authorization: Bearer $(cat {})\" ...",
            token.display()
        );
    }
    for id in 1..=args.nodes {
        println!(
            "  node {id}: http://127.0.0.1:{}   log: {}",
            args.base_port + 1000 + id as u16,
            dir.join(format!("node{id}.log")).display()
        );
    }
    let h = format!("127.0.0.1:{}", args.base_port + 1001);
    println!("\nTry (a node that is not the leader answers 503 with leader_http):");
    println!("  curl -s http://{h}/status");
    println!("  curl -s -X PUT --data-binary 'hello' http://{h}/kv/greeting");
    println!("  curl -s 'http://{h}/kv/greeting?read=lease'");
    println!("  curl -s 'http://{h}/kv/greeting?read=index'");
    println!("  curl -s http://{h}/metrics");
    println!("\nCtrl-C stops every node.");
}

fn supervise(children: &mut [Child], stop: &AtomicBool) -> i32 {
    while !stop.load(Ordering::Relaxed) {
        for (i, c) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                eprintln!("node {} exited: {status}; stopping the cluster", i + 1);
                return 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    0
}

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
