//! The reference: a real etcd 3.4 cluster of three members on loopback (Debian's `etcd-server`),
//! started by the test, killed on drop. Each compatibility test runs against it too, so that the
//! test is shown to check etcd's behaviour, not only this store's.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `etcd` binary: `$ETCD_BIN`, else `etcd` on the PATH.
pub fn etcd_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ETCD_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

/// Whether the reference can run; a missing etcd fails under CI (`CI` set), and is skipped with
/// a clear line elsewhere.
pub fn available() -> bool {
    if etcd_bin().is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "etcd is not installed: CI must install Debian's etcd-server (etcd 3.4)"
    );
    eprintln!(
        "SKIPPED: no etcd binary (apt-get install etcd-server): the reference run is skipped"
    );
    false
}

/// A 3-member etcd cluster.
pub struct Etcd {
    _serial: std::sync::MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    /// Client ports, member by member.
    pub client_ports: Vec<u16>,
    _reserved: Vec<crate::ports::Port>,
    /// The members' processes (`None`: killed).
    pub members: Vec<Option<Child>>,
}

impl Etcd {
    /// Start three members and wait until each answers.
    pub fn start() -> Etcd {
        let serial = crate::cluster::serial();
        let dir = tempfile::tempdir().unwrap();
        let reserved: Vec<_> = (0..6).map(|_| crate::ports::reserve()).collect();
        let (client, peer): (Vec<u16>, Vec<u16>) = (
            reserved[..3].iter().map(|p| p.port).collect(),
            reserved[3..].iter().map(|p| p.port).collect(),
        );
        let initial: Vec<String> = (0..3)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", peer[i]))
            .collect();
        let mut members = Vec::new();
        for i in 0..3 {
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let child = Command::new(etcd_bin().expect("etcd"))
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{}", client[i]),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{}", client[i]),
                ])
                .args([
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{}", peer[i]),
                ])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{}", peer[i]),
                ])
                .args(["--initial-cluster", &initial.join(",")])
                .args([
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    "ref",
                ])
                .args(["--heartbeat-interval", "40", "--election-timeout", "400"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn etcd");
            members.push(Some(child));
        }
        let e = Etcd {
            _serial: serial,
            _dir: dir,
            client_ports: client,
            _reserved: reserved,
            members,
        };
        e.wait_healthy(&[0, 1, 2]);
        e
    }

    /// Wait until every member in `which` commits a linearizable read.
    pub fn wait_healthy(&self, which: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for &i in which {
            let ep = format!("127.0.0.1:{}", self.client_ports[i]);
            loop {
                let ok = Command::new("etcdctl")
                    .args(["--endpoints", &ep, "endpoint", "health"])
                    .output()
                    .is_ok_and(|o| o.status.success());
                if ok {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {i} never became healthy"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Kill member `i` with SIGKILL.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
        }
    }
}
