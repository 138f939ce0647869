//! `kv cluster`'s options.

use std::path::PathBuf;

use clap::Args;

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
    /// Peer ports are BASE+1..BASE+N; HTTP ports are BASE+1001..BASE+1000+N and etcd API ports
    /// BASE+2001..BASE+2000+N unless set apart below (default 7000, or what the data dir holds).
    #[arg(long)]
    pub base_port: Option<u16>,
    /// HTTP ports are HTTP_BASE+1..HTTP_BASE+N (default: --base-port + 1000).
    #[arg(long)]
    pub http_base_port: Option<u16>,
    /// etcd API ports are ETCD_BASE+1..ETCD_BASE+N (default: --base-port + 2000).
    #[arg(long)]
    pub etcd_base_port: Option<u16>,
    /// Passed to every node: raft groups per node, keys spread over them (default 1; a data
    /// dir keeps the number it was made with).
    #[arg(long)]
    pub groups: Option<u32>,
    /// Passed to every node: extra one-way delay on peer messages.
    #[arg(long, default_value_t = 0)]
    pub peer_delay_ms: u64,
    /// Passed to every node: `/admin/partition`, `/admin/heal` and `/admin/clock`.
    #[arg(long)]
    pub fault_injection: bool,
    /// Passed to every node (UNSAFE, demonstrations only).
    #[arg(long)]
    pub unsafe_lease_based: bool,
    /// Passed to every node: EXPERIMENTAL follower read leases of at most this many ms (off by
    /// default; see `kv node --help`).
    #[arg(long)]
    pub follower_leases_ms: Option<u64>,
    /// Passed to every node: plaintext, unauthenticated peers (UNSAFE, local experiments only).
    #[arg(long)]
    pub insecure_peers: bool,
    /// More flags for every node, after `--` (for example `-- --snapshot-every 1000`).
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

impl ClusterArgs {
    /// A cluster of `nodes` on loopback in `data_dir`, ports from `base_port`, every other
    /// option at `kv cluster`'s default (the benches and the nemesis start from this).
    pub fn local(nodes: u64, data_dir: &std::path::Path, base_port: u16) -> ClusterArgs {
        ClusterArgs {
            nodes: Some(nodes),
            data_dir: data_dir.to_path_buf(),
            temp: false,
            base_port: Some(base_port),
            http_base_port: None,
            etcd_base_port: None,
            groups: None,
            peer_delay_ms: 0,
            fault_injection: false,
            unsafe_lease_based: false,
            follower_leases_ms: None,
            insecure_peers: false,
            node_args: Vec::new(),
        }
    }
}
