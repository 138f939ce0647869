//! `kv node`'s command line, checked into `NodeOptions` and the node's TLS set-up.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::admin::AdminToken;
use crate::limits::HttpLimits;
use crate::server::NodeOptions;

/// One node's options.
#[derive(Args, Clone)]
pub struct NodeArgs {
    /// This node's raft id (one of --peers).
    #[arg(long)]
    pub id: u64,
    /// Every voter: `1=127.0.0.1:7001,2=...` (this node's entry is its peer listen address).
    #[arg(long)]
    pub peers: String,
    /// HTTP listen address.
    #[arg(long)]
    pub http: SocketAddr,
    /// Where the raft log, hard state, snapshots and the dir's marker live.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The cluster's name, recorded in the data dir's marker: a dir of another cluster is refused.
    #[arg(long, default_value = "kv")]
    pub cluster_id: String,
    /// Other nodes' HTTP addresses, `1=127.0.0.1:8001,...`, for `leader_http` in redirects.
    #[arg(long, default_value = "")]
    pub peer_http: String,
    /// The cluster CA certificate (PEM) that signs every node's certificate (`kv certs`).
    #[arg(long)]
    pub peer_ca: Option<PathBuf>,
    /// This node's certificate (PEM); its SAN names this node's id.
    #[arg(long)]
    pub peer_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long)]
    pub peer_key: Option<PathBuf>,
    /// UNSAFE: plaintext, unauthenticated peers. Anyone who reaches the peer port can then forge
    /// raft messages, lose acknowledged writes and cause stale reads. Local experiments only.
    #[arg(long)]
    pub insecure_peers: bool,
    /// Serve HTTPS with this certificate (PEM); needs --http-key.
    #[arg(long, requires = "http_key")]
    pub http_cert: Option<PathBuf>,
    /// The HTTPS private key (PEM); needs --http-cert.
    #[arg(long, requires = "http_cert")]
    pub http_key: Option<PathBuf>,
    /// Raft election timeout. The lease promise P equals it.
    #[arg(long, default_value_t = 1000)]
    pub election_ms: u64,
    /// Raft heartbeat interval: the lease renews on every heartbeat.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Raft tick interval.
    #[arg(long, default_value_t = 10)]
    pub tick_ms: u64,
    /// Bound on clock rate error, in parts per million (10%: safe under any time daemon's
    /// slewing; 1000 will do on hosts whose daemon slews at most 500 ppm).
    #[arg(long, default_value_t = 100_000)]
    pub drift_ppm: u64,
    /// Lease safety margin.
    #[arg(long, default_value_t = 10)]
    pub margin_ms: u64,
    /// Extra delay on every outgoing peer message (emulates a cross-zone network).
    #[arg(long, default_value_t = 0)]
    pub peer_delay_ms: u64,
    /// Enable /admin/partition, /admin/heal, /admin/clock and /admin/transfer (tests only).
    /// Needs --admin-token-file: every /admin request must carry `Authorization: Bearer <token>`.
    #[arg(long, requires = "admin_token_file")]
    pub fault_injection: bool,
    /// A file holding the admin bearer token (at least 16 printable characters).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// UNSAFE: use raft-rs ReadOnlyOption::LeaseBased instead of the lease (to demonstrate the hazard).
    #[arg(long)]
    pub unsafe_lease_based: bool,
    /// Snapshot and compact the raft log every this many applied entries.
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_every: u64,
    /// Worker threads for HTTP and peer I/O (async: a slow client holds none of them).
    #[arg(long, default_value_t = 2)]
    pub http_threads: usize,
    #[command(flatten)]
    pub http_limits: HttpLimits,
}

/// Peer TLS files, all three or none.
pub struct PeerTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn parse_map(s: &str, what: &str) -> Result<BTreeMap<u64, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (id, addr) = p
                .split_once('=')
                .ok_or(format!("{what}: expected id=address, got {p:?}"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("{what}: bad id {id:?}"))?;
            if id == 0 {
                return Err(format!("{what}: id 0 is reserved by raft"));
            }
            Ok((id, addr.trim().to_string()))
        })
        .collect()
}

impl NodeArgs {
    /// The checked options.
    pub fn options(&self) -> Result<NodeOptions, String> {
        let peers = parse_map(&self.peers, "--peers")?
            .into_iter()
            .map(|(id, a)| {
                a.parse()
                    .map(|a| (id, a))
                    .map_err(|_| format!("--peers: bad address {a:?}"))
            })
            .collect::<Result<BTreeMap<u64, SocketAddr>, _>>()?;
        if !peers.contains_key(&self.id) {
            return Err(format!("--id {} is not in --peers", self.id));
        }
        if self.snapshot_every < 10 {
            return Err("--snapshot-every must be at least 10".into());
        }
        if self.tick_ms == 0
            || self.heartbeat_ms < self.tick_ms
            || self.election_ms <= self.heartbeat_ms
        {
            return Err("need 0 < --tick-ms <= --heartbeat-ms < --election-ms".into());
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 128 {
            return Err("--cluster-id must be 1 to 128 bytes".into());
        }
        self.http_limits.validate()?;
        let admin_token = self
            .admin_token_file
            .as_deref()
            .map(AdminToken::from_file)
            .transpose()?;
        Ok(NodeOptions {
            id: self.id,
            peers,
            peer_http: parse_map(&self.peer_http, "--peer-http")?,
            http: self.http,
            data_dir: self.data_dir.clone(),
            cluster_id: self.cluster_id.clone(),
            election_ms: self.election_ms,
            heartbeat_ms: self.heartbeat_ms,
            tick_ms: self.tick_ms,
            drift_ppm: self.drift_ppm,
            margin_ms: self.margin_ms,
            peer_delay_ms: self.peer_delay_ms,
            fault_injection: self.fault_injection,
            admin_token,
            insecure_peers: self.insecure_peers,
            unsafe_lease_based: self.unsafe_lease_based,
            snapshot_every: self.snapshot_every,
        })
    }

    /// The peer TLS files, or `None` with `--insecure-peers`.
    pub fn peer_tls_files(&self) -> Result<Option<PeerTlsFiles>, String> {
        match (&self.peer_ca, &self.peer_cert, &self.peer_key, self.insecure_peers) {
            (None, None, None, true) => Ok(None),
            (Some(ca), Some(cert), Some(key), false) => Ok(Some(PeerTlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            })),
            (_, _, _, true) => Err("--insecure-peers excludes --peer-ca/--peer-cert/--peer-key".into()),
            _ => Err(
                "peers need mutual TLS: give --peer-ca, --peer-cert and --peer-key (make them with \
                 `kv certs`), or --insecure-peers for a local experiment"
                    .into(),
            ),
        }
    }
}
