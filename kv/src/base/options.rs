//! How a node runs: its options, checked (from `kv node`'s command line, see `cli::args`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::base::admin_token::AdminToken;

/// The longest `--election-ms` (the lease promise) accepted: a day. The data dir's promise record
/// refuses anything longer as corrupt.
pub const MAX_ELECTION_MS: u64 = 86_400_000;

/// The most raft groups a node hosts.
pub const MAX_GROUPS: u32 = 100_000;

/// The largest `--quota-backend-bytes` accepted.
pub const MAX_QUOTA_BYTES: u64 = 64 << 30;

/// How a node runs: its checked options.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// This node's raft id.
    pub id: u64,
    /// Peer addresses (`host:port`) by id, this node's own included (it listens there).
    pub peers: BTreeMap<u64, String>,
    /// HTTP addresses by id, for redirects until the address book knows them.
    pub peer_http: BTreeMap<u64, String>,
    /// The HTTP listen address.
    pub http: SocketAddr,
    /// The etcd v3 API's listen address (`None`: not served).
    pub etcd_listen: Option<SocketAddr>,
    /// etcd API addresses by id, for forwarding to the leader.
    pub peer_etcd: BTreeMap<u64, String>,
    /// The data dir.
    pub data_dir: PathBuf,
    /// Recorded in the data dir's marker.
    pub cluster_id: String,
    /// Raft's election timeout (the lease promise P equals it).
    pub election_ms: u64,
    /// Raft's heartbeat interval.
    pub heartbeat_ms: u64,
    /// Raft's tick.
    pub tick_ms: u64,
    /// The clock rate error bound.
    pub drift_ppm: u64,
    /// The lease's safety margin.
    pub margin_ms: u64,
    /// Extra one-way delay on outgoing peer messages.
    pub peer_delay_ms: u64,
    /// Whether `/admin` fault injection is on.
    pub fault_injection: bool,
    /// Required for `/admin`.
    pub admin_token: Option<AdminToken>,
    /// Peers talk plaintext, unauthenticated (local experiments only).
    pub insecure_peers: bool,
    /// raft-rs `LeaseBased` reads (unsafe, for demonstrations).
    pub unsafe_lease_based: bool,
    /// Keep-alives answered without the leader-lease check (unsafe, the sessions' control).
    pub unsafe_keepalive_without_lease: bool,
    /// A leader counts its own promise for every acknowledgement, and the node boots with its
    /// own promise only (unsafe, the negative control for a rolling change of `--election-ms`).
    pub unsafe_count_own_promise: bool,
    /// Follower read leases of at most this many ms (`G`); `None`: off (the default).
    pub follower_leases_ms: Option<u64>,
    /// With follower read leases, replicas apply up to raft's commit index instead of the
    /// exposed index (unsafe, the negative control for follower reads).
    pub unsafe_apply_to_commit: bool,
    /// The raft log is cut past what the state engine made durable (unsafe, the negative
    /// control for the cut).
    pub unsafe_cut_past_durable: bool,
    /// etcd watches start one revision late (unsafe, the negative control for watches).
    pub unsafe_watch_off_by_one: bool,
    /// A follower's linearizable etcd read does not wait to have the leader's revision (unsafe,
    /// the negative control for follower reads).
    pub unsafe_follower_read_unwaited: bool,
    /// The etcd API's port does not rewrite HTTP/2 `:authority` values (the negative control
    /// for etcd's Go clients' forms).
    pub unsafe_authority_as_sent: bool,
    /// A member answers a forwarded write without waiting to have applied it (the negative
    /// control for read-your-writes at a follower).
    pub unsafe_forward_unwaited: bool,
    /// Snapshot and compact every this many applied entries.
    pub snapshot_every: u64,
    /// The engine for a new data dir's raft log; `None`: the dir's own (the default for a new
    /// one). A dir on another engine is refused.
    pub log_engine: Option<crate::base::log_engine::LogEngine>,
    /// Join a running cluster through this member.
    pub join: Option<JoinTarget>,
    /// etcd's space quota: bytes the keyspace may hold (NOSPACE, 507 beyond).
    pub quota_backend_bytes: u64,
    /// Bytes of writes in flight at most (503 beyond).
    pub max_inflight_bytes: u64,
    /// UNSAFE test switch: the transport does not report lost messages to raft.
    pub no_transport_reports: bool,
    /// UNSAFE test switch: peer messages raft-rs trusts blindly reach it unchecked.
    pub no_admission_checks: bool,
    /// Raft groups on the node (keys spread over them).
    pub groups: u32,
    /// How the groups' leases stay alive.
    pub liveness: raft_lease::multi::LivenessMode,
    /// Hand leaderships above this node's share to the node that leads the fewest groups.
    pub balance_leaders: bool,
}

/// The member `--join` asks first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTarget {
    /// Its HTTP address, `host:port`.
    pub addr: String,
    /// Over HTTPS: the CA (PEM) its certificate chains to; `None`: plain HTTP.
    pub https_ca: Option<PathBuf>,
}

impl NodeOptions {
    /// This node's HTTP address as others reach it.
    pub fn advertised_http(&self) -> String {
        self.peer_http
            .get(&self.id)
            .cloned()
            .unwrap_or_else(|| self.http.to_string())
    }

    /// Node `id`'s etcd API address as others reach it: `--peer-etcd`'s, else (for this node)
    /// `--etcd-listen`.
    pub fn etcd_of(&self, id: u64) -> Option<String> {
        self.peer_etcd.get(&id).cloned().or_else(|| {
            (id == self.id)
                .then_some(self.etcd_listen)
                .flatten()
                .map(|a| a.to_string())
        })
    }

    /// The largest message a peer may send: a batch of raft messages carrying the writes in
    /// flight, with room for their framing (snapshots travel in chunks of their own, whatever
    /// the state's size).
    pub fn max_message_bytes(&self) -> usize {
        (self.max_inflight_bytes + (32 << 20)) as usize
    }
}
