//! `kv node`'s command line, checked into [`NodeOptions`] and the node's TLS files.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::base::admin_token::AdminToken;
use crate::base::limits::HttpLimits;
use crate::base::log_engine::LogEngine;
use crate::base::options::{JoinTarget, NodeOptions, MAX_ELECTION_MS, MAX_GROUPS, MAX_QUOTA_BYTES};
use crate::peer::members::check_addr;

/// One node's options.
#[derive(Args, Clone)]
pub struct NodeArgs {
    /// This node's raft id (one of --peers).
    #[arg(long)]
    pub id: u64,
    /// Every voter's peer address, `1=host:7001,2=...`: host names or IP addresses. This node's
    /// entry is where it listens. With --join: this node and some members to reach first.
    #[arg(long)]
    pub peers: String,
    /// HTTP listen address.
    #[arg(long)]
    pub http: SocketAddr,
    /// Where the raft log, hard state, snapshots and the dir's marker live.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The cluster's name, recorded in the data dir's marker: a dir of another cluster is
    /// refused. Give every node of a cluster the same one (`kv cluster` makes one up).
    #[arg(long)]
    pub cluster_id: String,
    /// Every node's HTTP address, `1=host:8001,...`, for redirects to the leader (this node's
    /// entry is the address others reach it at; default: --http).
    #[arg(long, default_value = "")]
    pub peer_http: String,
    /// Serve etcd's v3 gRPC API (`etcdctl`, etcd's client libraries) on this address, over TLS
    /// with --http-cert/--http-key when given (see docs/etcd.md). One group only.
    #[arg(long)]
    pub etcd_listen: Option<std::net::SocketAddr>,
    /// Every node's etcd API address, `1=host:2379,...`: a node that does not lead forwards
    /// writes and linearizable reads to the leader's (this node's entry is the address others
    /// reach it at; default: --etcd-listen).
    #[arg(long, default_value = "")]
    pub peer_etcd: String,
    /// Join a running cluster: the HTTP address of any member (`host:port`, `http://host:port`
    /// or `https://host:port`; with no scheme, HTTPS if this node serves HTTPS with --http-cert,
    /// else HTTP). The node asks to be added as a learner, catches up (by snapshot), then asks to
    /// be promoted to voter. Needs --admin-token-file with the cluster's admin token.
    #[arg(long, requires = "admin_token_file")]
    pub join: Option<String>,
    /// With --join over HTTPS: the CA certificate (PEM) that the members' HTTPS certificates chain
    /// to (default: --peer-ca, which signs them when `kv certs --http-san` made them).
    #[arg(long, requires = "join")]
    pub join_ca: Option<PathBuf>,
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
    /// UNSAFE: answer session keep-alives without checking the leader lease (to demonstrate the
    /// hazard: a deposed leader stretches a client's session past the new leader's).
    #[arg(long)]
    pub unsafe_keepalive_without_lease: bool,
    /// UNSAFE, tests only: the leader counts every acknowledgement on its own promise (its
    /// --election-ms), not on the one the follower made, and a restarted node keeps only its own
    /// promise, not the longer one its data dir recorded. With nodes of different --election-ms
    /// (a rolling change) a cut-off leader then serves stale lease reads.
    #[arg(long, hide = true)]
    pub unsafe_count_own_promise: bool,
    /// EXPERIMENTAL, off by default: follower read leases of at most this many ms (`G`). Every
    /// voter then serves `GET /kv/<key>?read=local` from its own state while it holds one, and a
    /// write is answered only once every live holder has it. `G` must be above --heartbeat-ms
    /// and below half of --election-ms.
    #[arg(long)]
    pub follower_leases_ms: Option<u64>,
    /// UNSAFE, tests only: with follower read leases, every replica applies up to raft's commit
    /// index instead of the exposed index, so an acknowledged write may be missing on a holder
    /// that still serves local reads (stale follower reads).
    #[arg(long, hide = true, requires = "follower_leases_ms")]
    pub unsafe_apply_to_commit: bool,
    /// NEGATIVE CONTROL (hidden): the raft log is cut up to the applied index, past what the
    /// state engine has made durable, so a crash right after a cut loses applied state whose
    /// entries are gone from the log.
    #[arg(long, hide = true)]
    pub unsafe_cut_past_durable: bool,
    /// NEGATIVE CONTROL (hidden): etcd watches start one revision after the one asked for, so
    /// a watcher that reconnects misses an event (the etcd-API nemesis must find it).
    #[arg(long, hide = true)]
    pub unsafe_watch_off_by_one: bool,
    /// NEGATIVE CONTROL (hidden): a follower serves a linearizable etcd read from its own state
    /// as soon as the leader gave its revision, without waiting to have applied that far (the
    /// etcd-API nemesis must find a stale read).
    #[arg(long, hide = true)]
    pub unsafe_follower_read_unwaited: bool,
    /// NEGATIVE CONTROL (hidden): the etcd API's port hands each HTTP/2 `:authority` to the
    /// server as the client sent it, so the forms etcd's Go clients send are refused.
    #[arg(long, hide = true)]
    pub unsafe_authority_as_sent: bool,
    /// NEGATIVE CONTROL (hidden): a member answers a write it forwarded as soon as the leader
    /// answers, before it has applied the write itself (read-your-writes at that member breaks).
    #[arg(long, hide = true)]
    pub unsafe_forward_unwaited: bool,
    /// Cut the raft log every this many applied entries (or after as many bytes of entries as
    /// the last cut's state held, 64 MiB at least, whichever comes first), up to what the state
    /// engine has made durable. A cut copies nothing: a follower behind the log gets a snapshot
    /// streamed from a view of the state engine.
    #[arg(long, default_value_t = 100_000)]
    pub snapshot_every: u64,
    /// The engine for the raft log: raft-engine (the default for a new data dir) or redb. A dir
    /// keeps the engine it was made with; naming another is refused.
    #[arg(long)]
    pub log_engine: Option<LogEngine>,
    /// Raft groups on every node; each key belongs to one, by a hash of the key (see
    /// `state::placement`). Every node of a cluster must have the same, and a data dir keeps the
    /// number it was made with. 1 (the default) is one group, as the store was before there was
    /// a choice; many groups spread the leaders, and so the writes, over the nodes.
    #[arg(long, default_value_t = 1)]
    pub groups: u32,
    /// How the groups' leases stay alive: `per-group` (each group's own raft heartbeats renew its
    /// lease) or `shared` (one support session per pair of nodes backs every group's lease, and
    /// idle groups stop ticking and sending heartbeats). Default: per-group for one group,
    /// shared for more (per-group heartbeats cost messages in proportion to the groups).
    #[arg(long, value_enum)]
    pub liveness: Option<Liveness>,
    /// With many groups, a node that leads clearly more than its share of them hands some to
    /// the node that leads the fewest (raft leadership transfers, about once a second), so that
    /// writes and the idle cost of leading spread over the nodes. `false` leaves leaders where
    /// elections put them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub balance_leaders: bool,
    /// Worker threads for HTTP and peer I/O (async: a slow client holds none of them).
    #[arg(long, default_value_t = 2)]
    pub http_threads: usize,
    /// etcd's space quota: bytes the keyspace may hold, its history included (keys and values,
    /// with 64 bytes per version). A write beyond is refused: through etcd's API with "database
    /// space exceeded" and the NOSPACE alarm raised (writes stay refused until it is disarmed),
    /// through the HTTP API with 507. Give every node the same. 1 byte to 64 GiB (etcd's default
    /// is 2 GiB, its recommended most 8 GiB).
    #[arg(long, alias = "max-state-bytes", default_value_t = 2 << 30)]
    pub quota_backend_bytes: u64,
    /// Bytes of writes waiting for the raft thread or for their entries to apply, at most; a
    /// write beyond gets 503 `overloaded` at once, before its body is read.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_inflight_bytes: u64,
    /// UNSAFE, tests only: the transport does not tell raft about lost snapshots and appends
    /// (a lagging follower then stays stuck until the leader changes).
    #[arg(long, hide = true)]
    pub no_transport_reports: bool,
    /// UNSAFE, tests only: peer messages no correct peer sends (a heartbeat whose commit is past
    /// the log, a leader's message from a node that does not lead) reach raft-rs unchecked.
    #[arg(long, hide = true)]
    pub no_admission_checks: bool,
    /// The HTTP front end's limits.
    #[command(flatten)]
    pub http_limits: HttpLimits,
}

/// `--liveness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Liveness {
    /// Each group's raft heartbeats renew its lease.
    PerGroup,
    /// One support session per pair of nodes backs every group's lease.
    Shared,
}

/// Peer TLS files, all three or none.
pub struct PeerTlsFiles {
    /// The cluster CA.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// `1=host:port,2=...`: ids nonzero and given once, addresses `host:port`.
pub fn parse_map(s: &str, what: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for p in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (id, addr) = p
            .split_once('=')
            .ok_or(format!("{what}: expected id=host:port, got {p:?}"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("{what}: bad id {id:?}"))?;
        if id == 0 {
            return Err(format!("{what}: id 0 is reserved by raft"));
        }
        let addr = addr.trim().to_string();
        if !check_addr(&addr) {
            return Err(format!(
                "{what}: bad address {addr:?} for id {id} (expected host:port)"
            ));
        }
        if out.insert(id, addr).is_some() {
            return Err(format!("{what}: id {id} is given twice"));
        }
    }
    Ok(out)
}

impl NodeArgs {
    /// The checked options.
    pub fn options(&self) -> Result<NodeOptions, String> {
        let peers = parse_map(&self.peers, "--peers")?;
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
        if self.election_ms > MAX_ELECTION_MS {
            return Err(format!(
                "--election-ms must be at most {MAX_ELECTION_MS} (a day): the data dir records it"
            ));
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 128 {
            return Err("--cluster-id must be 1 to 128 bytes".into());
        }
        if self.quota_backend_bytes == 0 || self.quota_backend_bytes > MAX_QUOTA_BYTES {
            return Err("--quota-backend-bytes must be 1 byte to 64 GiB".into());
        }
        if self.max_inflight_bytes < 2 << 20 {
            return Err(
                "--max-inflight-bytes must be at least 2 MiB (one write of 1 MiB and more)".into(),
            );
        }
        let join = self
            .join
            .as_deref()
            .map(|j| self.join_target(j))
            .transpose()?;
        if self.groups == 0 || self.groups > MAX_GROUPS {
            return Err(format!("--groups must be 1 to {MAX_GROUPS}"));
        }
        if self.groups > 1 && self.log_engine == Some(LogEngine::Redb) {
            return Err(
                "--groups above 1 needs --log-engine raft-engine: redb holds one group".into(),
            );
        }
        let liveness = match self.liveness {
            Some(Liveness::Shared) => raft_lease::multi::LivenessMode::Shared,
            Some(Liveness::PerGroup) => raft_lease::multi::LivenessMode::PerGroup,
            None if self.groups == 1 => raft_lease::multi::LivenessMode::PerGroup,
            None => raft_lease::multi::LivenessMode::Shared,
        };
        if self.etcd_listen.is_some() && self.groups > 1 {
            return Err(format!(
                "--etcd-listen needs --groups 1: etcd's API has one revision for the whole \
                 keyspace, and {} groups would each count their own (see docs/etcd.md)",
                self.groups
            ));
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
            etcd_listen: self.etcd_listen,
            peer_etcd: parse_map(&self.peer_etcd, "--peer-etcd")?,
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
            unsafe_keepalive_without_lease: self.unsafe_keepalive_without_lease,
            unsafe_count_own_promise: self.unsafe_count_own_promise,
            follower_leases_ms: self.follower_leases_ms,
            unsafe_apply_to_commit: self.unsafe_apply_to_commit,
            unsafe_cut_past_durable: self.unsafe_cut_past_durable,
            unsafe_watch_off_by_one: self.unsafe_watch_off_by_one,
            unsafe_follower_read_unwaited: self.unsafe_follower_read_unwaited,
            unsafe_authority_as_sent: self.unsafe_authority_as_sent,
            unsafe_forward_unwaited: self.unsafe_forward_unwaited,
            snapshot_every: self.snapshot_every,
            log_engine: self.log_engine,
            join,
            quota_backend_bytes: self.quota_backend_bytes,
            max_inflight_bytes: self.max_inflight_bytes,
            no_transport_reports: self.no_transport_reports,
            no_admission_checks: self.no_admission_checks,
            groups: self.groups,
            liveness,
            balance_leaders: self.balance_leaders,
        })
    }

    /// `--join`'s member: its address, and over HTTPS the CA its certificate chains to.
    fn join_target(&self, join: &str) -> Result<JoinTarget, String> {
        let (https, addr) = match join.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            Some((scheme, _)) => {
                return Err(format!("--join: scheme {scheme:?}: use http or https"))
            }
            None => (self.http_cert.is_some(), join),
        };
        let addr = addr.trim_end_matches('/');
        if !check_addr(addr) {
            return Err("--join: expected the host:port of a member's HTTP address".into());
        }
        let ca = match https {
            false => None,
            true => Some(self.join_ca.clone().or_else(|| self.peer_ca.clone()).ok_or(
                "--join over HTTPS needs the CA of the members' HTTPS certificates: give --join-ca",
            )?),
        };
        Ok(JoinTarget {
            addr: addr.to_string(),
            https_ca: ca,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        args: NodeArgs,
    }

    /// `kv node`'s options for these flags beside a minimal set.
    fn options(flags: &[&str]) -> Result<NodeOptions, String> {
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), "0123456789abcdef0123").unwrap();
        let base = [
            "kv",
            "--id",
            "1",
            "--peers",
            "1=127.0.0.1:7001",
            "--http",
            "127.0.0.1:8001",
        ];
        let more = [
            "--data-dir",
            "/nonexistent",
            "--cluster-id",
            "c",
            "--admin-token-file",
        ];
        let argv = base
            .iter()
            .chain(&more)
            .copied()
            .chain([token.path().to_str().unwrap()]);
        <Cmd as clap::Parser>::try_parse_from(argv.chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?
            .args
            .options()
    }

    #[test]
    fn join_speaks_https_when_asked_or_when_the_node_serves_it_and_trusts_a_named_ca() {
        let join = |flags: &[&str]| options(flags).map(|o| o.join.unwrap());
        let plain = join(&["--join", "10.0.0.1:8001"]).unwrap();
        assert_eq!(
            (plain.addr.as_str(), plain.https_ca),
            ("10.0.0.1:8001", None)
        );
        let ca = [
            "--peer-ca",
            "ca.pem",
            "--peer-cert",
            "n.pem",
            "--peer-key",
            "n.key",
        ];
        let https = join(&[&ca[..], &["--join", "https://10.0.0.1:8001/"]].concat()).unwrap();
        assert_eq!(
            (https.addr.as_str(), https.https_ca),
            ("10.0.0.1:8001", Some("ca.pem".into()))
        );
        let serves = [
            "--http-cert",
            "h.pem",
            "--http-key",
            "h.key",
            "--join",
            "10.0.0.1:8001",
        ];
        let own = join(&[&ca[..], &serves[..], &["--join-ca", "web.pem"]].concat()).unwrap();
        assert_eq!(
            own.https_ca,
            Some("web.pem".into()),
            "HTTPS, trusting --join-ca"
        );
        let forced = join(&[&serves[..4], &["--join", "http://10.0.0.1:8001"]].concat()).unwrap();
        assert_eq!(
            forced.https_ca, None,
            "http:// is plain whatever the node serves"
        );
        let no_ca = join(&["--insecure-peers", "--join", "https://10.0.0.1:8001"]).unwrap_err();
        assert!(no_ca.contains("--join-ca"), "{no_ca}");
        let scheme = join(&["--join", "ftp://10.0.0.1:8001"]).unwrap_err();
        assert!(scheme.contains("use http or https"), "{scheme}");
    }

    #[test]
    fn peer_lists_take_host_names_and_refuse_duplicates_and_bad_entries() {
        let m = parse_map(
            "1=node-a.example:7001, 2=127.0.0.1:7002,3=[::1]:7003",
            "--peers",
        )
        .unwrap();
        assert_eq!(m[&1], "node-a.example:7001");
        assert_eq!(m[&3], "[::1]:7003");
        let bad = [
            ("1=a:1,1=b:2", "given twice"),
            ("0=a:1", "reserved"),
            ("1=a", "expected host:port"),
            ("1=a:99999", "expected host:port"),
            ("x=a:1", "bad id"),
            ("1", "expected id=host:port"),
        ];
        for (input, why) in bad {
            let e = parse_map(input, "--peers").unwrap_err();
            assert!(e.contains(why), "{input}: {e}");
        }
    }
}
