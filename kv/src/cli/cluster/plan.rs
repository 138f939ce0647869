//! How to start each node of a cluster in a dir ([`Plan`]): the dir's certificates, cluster id
//! and admin token, each node's command line, and starting and stopping the node processes.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::base::admin_token::AdminToken;
use crate::cli::cluster::args::ClusterArgs;
use crate::cli::cluster::layout::Layout;

/// The cluster id in `dir/cluster-id`, made up the first time.
pub fn cluster_id(dir: &Path) -> Result<String, String> {
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
    /// With `--http-cert` among the node flags the nodes serve HTTPS: the CA its clients trust.
    pub https_ca: Option<PathBuf>,
    /// Whether the nodes serve etcd's API (one group only: it needs one revision space).
    pub etcd: bool,
    /// Each node's address where it is not 127.0.0.1 (a test host of its own).
    pub hosts: BTreeMap<u64, String>,
}

/// The groups the nodes are asked to host: `--groups`, or the same flag among the node flags
/// (after `--`), else 1.
fn groups_asked(args: &ClusterArgs) -> u64 {
    let in_node_args = args
        .node_args
        .iter()
        .position(|a| a == "--groups")
        .and_then(|i| args.node_args.get(i + 1))
        .and_then(|n| n.parse().ok());
    args.groups.map(u64::from).or(in_node_args).unwrap_or(1)
}

/// The CA that clients of HTTPS nodes trust, if `node_args` give `--http-cert`: `ca.pem` beside
/// the certificate (where `kv certs --http-san` writes both), else the cluster CA in `dir/tls`.
fn https_ca(node_args: &[String], dir: &Path) -> Option<PathBuf> {
    let cert = node_args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.as_str() {
            "--http-cert" => node_args.get(i + 1).cloned(),
            a => a.strip_prefix("--http-cert=").map(str::to_string),
        })?;
    let beside = Path::new(&cert).parent().map(|d| d.join("ca.pem"));
    Some(
        beside
            .filter(|ca| ca.exists())
            .unwrap_or_else(|| dir.join("tls").join("ca.pem")),
    )
}

/// `s` as a shell word: as it is if it needs no quoting, else in single quotes.
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

impl Plan {
    /// Set up `dir` (certificates, cluster id, admin token) for `layout`.
    pub fn new(args: &ClusterArgs, dir: &Path, layout: Layout) -> Result<Plan, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        if !args.insecure_peers {
            let ids: Vec<u64> = (1..=layout.nodes).collect();
            crate::tls::certs::make(&dir.join("tls"), &ids, &[], "http")?;
        }
        let mut common = vec!["--cluster-id".to_string(), cluster_id(dir)?];
        common.push("--admin-token-file".into());
        common.push(admin_token_file(dir)?.display().to_string());
        common.extend(["--peer-delay-ms".into(), args.peer_delay_ms.to_string()]);
        if let Some(n) = args.groups {
            common.extend(["--groups".into(), n.to_string()]);
        }
        if let Some(g) = args.follower_leases_ms {
            common.extend(["--follower-leases-ms".into(), g.to_string()]);
        }
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
            https_ca: https_ca(&args.node_args, dir),
            etcd: groups_asked(args) == 1,
            hosts: BTreeMap::new(),
        })
    }

    /// `https` if the nodes serve HTTPS, else `http`.
    pub fn scheme(&self) -> &'static str {
        match self.https_ca {
            Some(_) => "https",
            None => "http",
        }
    }

    /// Node `id`'s address (127.0.0.1 unless it has a host of its own).
    pub fn host(&self, id: u64) -> &str {
        self.hosts.get(&id).map_or("127.0.0.1", String::as_str)
    }

    /// `1=HOST:PORT,...` for every node of the layout, the port of each from `port`.
    pub fn list(&self, port: impl Fn(u64) -> u16) -> String {
        (1..=self.layout.nodes)
            .map(|i| format!("{i}={}:{}", self.host(i), port(i)))
            .collect::<Vec<_>>()
            .join(",")
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
            self.list(|i| l.peer_port(i)),
            "--peer-http".into(),
            self.list(|i| l.http_port(i)),
            "--http".into(),
            format!("{}:{}", self.host(id), l.http_port(id)),
            "--data-dir".into(),
            node_dir.display().to_string(),
        ];
        if self.etcd {
            a.extend([
                "--etcd-listen".into(),
                format!("{}:{}", self.host(id), l.etcd_port(id)),
                "--peer-etcd".into(),
                self.list(|i| l.etcd_port(i)),
            ]);
        }
        if !self.insecure {
            let tls = self.dir.join("tls");
            let (cert, key) = crate::tls::certs::node_files(&tls, id);
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

    /// Refuse, before any node starts, what node `id` would refuse at start: its flags, its
    /// settings (a `--follower-leases-ms` out of bounds), its TLS files, a data dir of another
    /// number of groups.
    pub fn preflight(&self, id: u64) -> Result<(), String> {
        #[derive(clap::Parser)]
        struct NodeCommand {
            #[command(flatten)]
            args: crate::cli::args::NodeArgs,
        }
        let argv =
            std::iter::once("kv node".to_string()).chain(self.node_args(id).into_iter().skip(1));
        let parsed = <NodeCommand as clap::Parser>::try_parse_from(argv)
            .map_err(|e| format!("node {id}: {}", e.render().to_string().trim_end()))?;
        crate::cli::node::preflight(&parsed.args).map_err(|e| format!("node {id}: {e}"))
    }

    /// The command line that starts node `id`, to paste in a shell.
    pub fn command_line(&self, id: u64) -> String {
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

/// Stop `children` with SIGTERM, then SIGKILL after 5 s; the caller says what stopped.
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
}
