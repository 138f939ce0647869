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
//! (and `stop N`, `status`) on standard input. Ctrl-C stops every node. One console runs on a dir
//! at a time (see `lock`): a second is refused, with exit code 3, before it starts anything.

pub mod args;
pub mod banner;
pub mod commands;
pub mod layout;
pub mod lock;
pub mod plan;
pub mod supervise;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use args::ClusterArgs;
use layout::layout;
use lock::DirLock;
use plan::Plan;

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
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: {}: {e}", dir.display());
        return 2;
    }
    let _lock = match DirLock::take(&dir) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return 3;
        }
    };
    let prepared = layout(&args, &dir)
        .and_then(|l| Plan::new(&args, &dir, l))
        .and_then(|p| {
            (1..=p.layout.nodes)
                .try_for_each(|id| p.preflight(id))
                .map(|()| p)
        });
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
    let code = supervise::run(&plan, &stop, temp.is_some());
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
