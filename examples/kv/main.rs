//! An example replicated KV store on raft-lease: separate processes, peers over mutual TLS,
//! durable on redb, an HTTP front end with limits where any node answers (307 to the leader),
//! lease reads on the HTTP workers, ReadIndex fallback, group commit, membership changes over
//! HTTP, sessions, locks and fenced writes. The raft loop (`raft_loop`, `raft_io`) is generic:
//! copy it for a store of your own.
//!
//! ```sh
//! cargo run --release --example kv -- cluster            # 3 local nodes in ./kv-data; Ctrl-C stops them
//! cargo run --release --example kv -- certs --dir /tmp/kv-tls --ids 1,2,3
//! cargo run --release --example kv -- node --id 1 --cluster-id demo \
//!     --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 --http 127.0.0.1:8001 \
//!     --peer-http 1=127.0.0.1:8001,2=127.0.0.1:8002,3=127.0.0.1:8003 --data-dir /tmp/kv1 \
//!     --peer-ca /tmp/kv-tls/ca.pem --peer-cert /tmp/kv-tls/node-1.pem --peer-key /tmp/kv-tls/node-1.key
//! ```

mod admin;
mod app;
mod args;
mod bench;
mod bench_cpu;
mod bench_sessions;
mod budget;
mod certs;
mod client;
mod clock;
mod cluster;
mod conns;
mod frame;
mod http;
mod http_errors;
mod http_server;
mod http_sessions;
mod join;
mod keys;
mod kv_machine;
mod limits;
mod log;
mod marker;
mod mem_log;
mod members;
mod metrics;
mod nemesis;
mod node;
mod peer_listen;
mod promise_file;
mod raft_io;
mod raft_loop;
mod reply;
mod sessions_local;
mod spin_io;
mod state;
mod status;
mod storage;
mod supervise;
mod tls;
mod transport;

use clap::{Parser, Subcommand};
use slog::crit;

#[derive(Parser)]
#[command(about = "A replicated KV store on raft-lease", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Node(Box<args::NodeArgs>),
    /// Run a local cluster of node processes on loopback (TLS set up for it) until Ctrl-C.
    Cluster(cluster::ClusterArgs),
    /// Make a cluster CA and node certificates for a cluster started by hand.
    Certs(certs::CertsArgs),
    /// Start a local 3-node cluster and measure HTTP writes, lease reads and index reads.
    Bench(bench::BenchArgs),
    /// Randomized faults against a local cluster, every client operation checked (see README
    /// "Correctness").
    Nemesis(nemesis::NemesisArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Node(args) => run_node(*args),
        Cmd::Cluster(args) => cluster::run(args),
        Cmd::Certs(args) => certs::run(args),
        Cmd::Bench(args) => bench::run(args),
        Cmd::Nemesis(args) => nemesis::run(args),
    };
    std::process::exit(code);
}

fn run_node(args: args::NodeArgs) -> i32 {
    let (log, flush) = log::stderr_logger();
    let result = node::run(&args, &log);
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
