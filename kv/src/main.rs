//! An example replicated KV store on raft-lease: separate processes, peers over mutual TLS, the
//! raft log on raft-engine (or redb) and the state in a fjall state engine beside it, an HTTP
//! front end with limits where any node answers (307 to the leader) and etcd's v3 gRPC API over
//! the same keyspace, lease reads on the front ends' workers, ReadIndex fallback, group commit,
//! membership changes over HTTP, sessions, locks and fenced writes. The raft loop (`raft/`) is
//! generic: copy it for a store of your own.
//!
//! The modules are layers; each imports only from the layers below it:
//!
//! | layer | what |
//! |---|---|
//! | `nemesis`, `bench` | randomized faults with every operation checked; HTTP load |
//! | `cli` | the commands: `kv node` (and joining), `kv cluster` (and its console), `kv certs` |
//! | `etcd` | etcd's v3 gRPC API over the same state machine (see docs/etcd.md) |
//! | `http` | the HTTP front end and its routes, and a small client |
//! | `node` | what both front ends share: every group's shared state, options, budgets, metrics |
//! | `state` | the replicated state machine: the keyspace and its history, sessions, locks, alarms |
//! | `raft` | the generic raft loop and its I/O |
//! | `peer` | the address book, frames, the transport and the peer listener |
//! | `disk` | the raft store, the state engine, the data dir's marker and promise record |
//! | `tls` | certificates and rustls set-ups |
//! | `base` | clock, logger, budgets, limits, connection tables, metrics, options |
//!
//! ```sh
//! cargo run --release --bin kv -- cluster            # 3 local nodes in ./kv-data; Ctrl-C stops them
//! cargo run --release --bin kv -- certs --dir /tmp/kv-tls --ids 1,2,3
//! cargo run --release --bin kv -- node --id 1 --cluster-id demo \
//!     --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 --http 127.0.0.1:8001 \
//!     --peer-http 1=127.0.0.1:8001,2=127.0.0.1:8002,3=127.0.0.1:8003 --data-dir /tmp/kv1 \
//!     --peer-ca /tmp/kv-tls/ca.pem --peer-cert /tmp/kv-tls/node-1.pem --peer-key /tmp/kv-tls/node-1.key
//! ```

mod base;
mod bench;
mod cli;
mod disk;
mod etcd;
mod http;
mod nemesis;
mod node;
mod peer;
mod raft;
mod state;
mod tls;

use clap::{Parser, Subcommand};
use slog::crit;

#[derive(Parser)]
#[command(name = "kv", about = "A replicated KV store on raft-lease", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Node(Box<cli::args::NodeArgs>),
    /// Run a local cluster of node processes on loopback (TLS set up for it) until Ctrl-C.
    Cluster(cli::cluster::args::ClusterArgs),
    /// Make a cluster CA and node certificates for a cluster started by hand.
    Certs(cli::certs::CertsArgs),
    /// Test hosts on this machine (network namespaces with addresses of their own), to rehearse
    /// a deployment: `kv hosts up`, `kv hosts down` (root; see docs/deploy.md).
    Hosts(cli::hosts::HostsArgs),
    /// Start a local 3-node cluster and measure HTTP writes, lease reads and index reads.
    Bench(bench::load::BenchArgs),
    /// Randomized faults against a local cluster, every client operation checked (see
    /// docs/correctness.md).
    Nemesis(nemesis::NemesisArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Node(args) => run_node(*args),
        Cmd::Cluster(args) => cli::cluster::run(args),
        Cmd::Certs(args) => cli::certs::run(args),
        Cmd::Hosts(args) => cli::hosts::run(args),
        Cmd::Bench(args) => bench::load::run(args),
        Cmd::Nemesis(args) => nemesis::run(args),
    };
    std::process::exit(code);
}

fn run_node(args: cli::args::NodeArgs) -> i32 {
    let (log, flush) = base::log::stderr_logger();
    let result = cli::node::run(&args, &log);
    if let Err(e) = &result {
        crit!(log, "node failed"; "error" => %e, "exit_code" => e.code());
    }
    drop(log);
    drop(flush); // every record logged so far is written before the process exits
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}"); // the last line, for `kv cluster` to show
            e.code()
        }
    }
}
