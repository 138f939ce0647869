//! The baseline of `kv bench --vs-etcd`: a real etcd 3.4 cluster of three members on loopback
//! (Debian's `etcd-server`), with etcd's defaults (fsync on every WAL write), killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `etcd` binary: `explicit`, else `$ETCD_BIN`, else `etcd` on the `PATH`.
pub fn etcd_bin(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ETCD_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// `etcd --version`'s first line, or why there is none.
pub fn version(bin: &Path) -> Result<String, String> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{} --version printed nothing", bin.display()))
}

/// A running 3-member etcd cluster.
pub struct EtcdCluster {
    /// The members' client addresses (`127.0.0.1:port`), member by member.
    pub endpoints: Vec<String>,
    members: Vec<Child>,
}

impl EtcdCluster {
    /// Start three members in `dir`, clients on `base_port`+1..=3, peers on `base_port`+11..=13.
    pub fn start(bin: &Path, dir: &Path, base_port: u16) -> Result<EtcdCluster, String> {
        let mut cluster = EtcdCluster {
            endpoints: (0..3)
                .map(|i| format!("127.0.0.1:{}", base_port + 1 + i))
                .collect(),
            members: Vec::new(),
        };
        for i in 0..3u16 {
            let child = spawn_member(bin, dir, base_port, i, "new", &[])?;
            cluster.members.push(child);
        }
        Ok(cluster)
    }

    /// The members' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Child::id).collect()
    }
}

/// Start member `i` (0..=2) of the cluster [`EtcdCluster::start`] lays out in `dir` from
/// `base_port`, data in `dir/m{i}`, standard error appended to `dir/etcd{i}.log`, with
/// `--initial-cluster-state` `state` (`new`, or `existing` for a member added to a running
/// cluster) and the flags `extra` after the others.
pub(crate) fn spawn_member(
    bin: &Path,
    dir: &Path,
    base_port: u16,
    i: u16,
    state: &str,
    extra: &[String],
) -> Result<Child, String> {
    let peer = |i: u16| format!("http://127.0.0.1:{}", base_port + 11 + i);
    let client = format!("http://127.0.0.1:{}", base_port + 1 + i);
    let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", peer(i))).collect();
    let log_path = dir.join(format!("etcd{i}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    Command::new(bin)
        .args(["--name", &format!("m{i}")])
        .arg("--data-dir")
        .arg(dir.join(format!("m{i}")))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer(i)])
        .args(["--initial-advertise-peer-urls", &peer(i)])
        .args(["--initial-cluster", &initial.join(",")])
        .args(["--initial-cluster-state", state])
        .args(["--initial-cluster-token", "kv-bench"])
        .args(["--logger", "zap", "--log-level", "warn"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))
}

/// The client address among `endpoints` of the member that says it leads (within 30 s): etcd's
/// or the store's, through etcd's `Status`.
pub async fn leader(endpoints: &[String]) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for ep in endpoints {
            if let Ok(mut c) = etcd_client::Client::connect([ep.as_str()], None).await {
                if let Ok(s) = c.status().await {
                    let me = s.header().map(|h| h.member_id());
                    if me == Some(s.leader()) && s.leader() != 0 {
                        return Ok(ep.clone());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "none of {endpoints:?} led within 30 s (see the logs)"
    ))
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in &mut self.members {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
