//! A cluster of real `kv` node processes on loopback for the tests: certificates made with
//! `kv certs`, an admin token, ports reserved across processes (see `ports`), bounded waits, and
//! everything killed on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Lines of each node's log shown when a test fails (`KV_TEST_LOG_LINES` to change).
static LOG_TAIL_LINES_ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Every test cluster's admin token.
pub const TOKEN: &str = "test-admin-token-0123456789abcdef";

const FAST: &[&str] = &[
    "--election-ms",
    "400",
    "--heartbeat-ms",
    "40",
    "--tick-ms",
    "10",
];

/// The `kv` binary, which cargo builds before the integration tests.
pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kv"))
}

/// One cluster at a time: several 3-process clusters at once starve a 2-core machine and
/// turn elections into a test of the scheduler.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Hold this while running processes that are not a `Cluster` (one cluster at a time).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct Cluster {
    _serial: std::sync::MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    pub data: PathBuf,
    pub peer_ports: Vec<u16>,
    pub http_ports: Vec<u16>,
    /// Each node's etcd API port (served unless the cluster has many groups).
    pub etcd_ports: Vec<u16>,
    /// The reservations behind the ports.
    pub _reserved: Vec<crate::ports::Port>,
    pub nodes: Vec<Option<Child>>,
    pub args: Vec<String>,
    /// The founding members (the others joined later).
    pub founders: usize,
}

/// `kv certs` into `dir` for `ids` (and an HTTPS certificate for 127.0.0.1).
pub fn make_certs(dir: &std::path::Path, ids: &[u64]) {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    let out = Command::new(exe())
        .args(["certs", "--ids", &ids.join(","), "--http-san", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run kv certs");
    assert!(out.status.success(), "kv certs: {out:?}");
}

impl Cluster {
    /// `n` nodes with mutual TLS (unless `args` has `--insecure-peers`), all up (answering
    /// HTTP). A node that finds its port taken makes the cluster start over on other ports.
    pub fn start(n: usize, args: &[&str]) -> Cluster {
        Cluster::start_each(n, args, |_, _| {})
    }

    /// Like `start`, with node `id`'s flags changed by `edit(id, flags)` (see `set_flag`).
    pub fn start_each(n: usize, args: &[&str], edit: impl Fn(u64, &mut Vec<String>)) -> Cluster {
        for attempt in 0.. {
            let mut c = Cluster::prepare(n, args);
            for id in 1..=n as u64 {
                c.spawn_edited(id, |flags| edit(id, flags));
            }
            match c.wait_up() {
                Ok(()) => return c,
                Err(e) if attempt < 5 => {
                    eprintln!("cluster start, attempt {attempt}: {e}; new ports")
                }
                Err(e) => panic!("cluster did not start: {e}\n{}", c.log_tail()),
            }
        }
        unreachable!()
    }

    /// Wait until every running node answers HTTP; `Err` if one exited (a port taken, say).
    pub fn wait_up(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        for id in 1..=self.nodes.len() as u64 {
            while status(self.port(id)).is_none() {
                if !self.running(id) {
                    let log = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
                    return Err(format!(
                        "node {id} exited: {}",
                        log.lines().last().unwrap_or("")
                    ));
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} never answered:\n{}",
                    self.log_tail()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Everything but the processes.
    pub fn prepare(n: usize, args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let serial = serial();
        let data = dir.path().to_path_buf();
        // Flags given in `args` replace the fast defaults.
        let fast = FAST.chunks(2).filter(|kv| !args.contains(&kv[0])).flatten();
        let mut all: Vec<String> = fast.chain(args).map(|s| s.to_string()).collect();
        if !args.contains(&"--cluster-id") {
            all.extend(["--cluster-id".to_string(), "test-cluster".to_string()]);
        }
        if !args.contains(&"--insecure-peers") {
            let ids: Vec<u64> = (1..=n as u64).collect();
            make_certs(&data.join("tls"), &ids);
        }
        std::fs::write(data.join("admin.token"), TOKEN).unwrap();
        all.push("--admin-token-file".into());
        all.push(data.join("admin.token").display().to_string());
        let reserved: Vec<crate::ports::Port> =
            (0..3 * n).map(|_| crate::ports::reserve()).collect();
        Cluster {
            _serial: serial,
            data,
            _dir: dir,
            peer_ports: reserved[..n].iter().map(|p| p.port).collect(),
            http_ports: reserved[n..2 * n].iter().map(|p| p.port).collect(),
            etcd_ports: reserved[2 * n..].iter().map(|p| p.port).collect(),
            _reserved: reserved,
            nodes: (0..n).map(|_| None).collect(),
            args: all,
            founders: n,
        }
    }

    /// Make room for node `id` (ports, certificate) before it joins.
    pub fn add_slot(&mut self, id: u64) {
        while self.nodes.len() < id as usize {
            let (p, h, e) = (
                crate::ports::reserve(),
                crate::ports::reserve(),
                crate::ports::reserve(),
            );
            self.peer_ports.push(p.port);
            self.http_ports.push(h.port);
            self.etcd_ports.push(e.port);
            self._reserved.extend([p, h, e]);
            self.nodes.push(None);
        }
        if !self.args.iter().any(|a| a == "--insecure-peers") {
            make_certs(&self.tls(), &[id]);
        }
    }

    /// Start node `id` as a new member joining through node `via`.
    pub fn spawn_join(&mut self, id: u64, via: u64) {
        let cmd = self.command(id);
        self.spawn_join_with(id, via, cmd);
    }

    /// Start node `id` joining through node `via`, with only the nodes `listed` in its `--peers`
    /// and `--peer-http` (as the documented join lists only the node it joins through and itself).
    pub fn spawn_join_listing(&mut self, id: u64, via: u64, listed: &[u64]) {
        let cmd = self.command_listing(id, &self.data.join(format!("node{id}")), listed);
        self.spawn_join_with(id, via, cmd);
    }

    fn spawn_join_with(&mut self, id: u64, via: u64, mut cmd: Command) {
        cmd.args(["--join", &format!("127.0.0.1:{}", self.port(via))]);
        self.spawn_command(id, cmd);
    }

    /// Start node `id` with `cmd`, its stderr to its log file.
    fn spawn_command(&mut self, id: u64, mut cmd: Command) {
        // For a post-mortem, a restarted node's log follows its earlier runs'.
        let keep = std::env::var("KV_TEST_KEEP_DIR").is_ok();
        let log = (std::fs::OpenOptions::new().create(true).write(true))
            .append(keep)
            .truncate(!keep)
            .open(self.log_path(id))
            .unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn node");
        self.nodes[id as usize - 1] = Some(child);
    }

    /// Every node started from now on serves HTTPS with the cluster CA's certificate.
    pub fn serve_https(&mut self) {
        let tls = self.tls();
        for (flag, file) in [("--http-cert", "http.pem"), ("--http-key", "http.key")] {
            self.args.push(flag.into());
            self.args.push(tls.join(file).display().to_string());
        }
    }

    pub fn tls(&self) -> PathBuf {
        self.data.join("tls")
    }

    /// Node `id`'s command line with its common flags changed by `edit` first.
    pub fn command_edited(&mut self, id: u64, edit: impl FnOnce(&mut Vec<String>)) -> Command {
        let saved = self.args.clone();
        edit(&mut self.args);
        let cmd = self.command(id);
        self.args = saved;
        cmd
    }

    /// The command line of node `id` (as `spawn` runs it).
    pub fn command(&self, id: u64) -> Command {
        self.command_in(id, &self.data.join(format!("node{id}")))
    }

    /// The command line of node `id` on data dir `dir`. A founding node lists the founders; a
    /// node that joined lists every node so far (itself included).
    pub fn command_in(&self, id: u64, dir: &std::path::Path) -> Command {
        let upto = if (id as usize) <= self.founders {
            self.founders
        } else {
            self.nodes.len()
        };
        let listed: Vec<u64> = (1..=upto as u64).collect();
        self.command_listing(id, dir, &listed)
    }

    /// The command line of node `id` on data dir `dir`, with the nodes `listed` in its `--peers`
    /// and `--peer-http`.
    pub fn command_listing(&self, id: u64, dir: &std::path::Path, listed: &[u64]) -> Command {
        let list = |ports: &[u16]| {
            listed
                .iter()
                .map(|&i| format!("{i}=127.0.0.1:{}", ports[i as usize - 1]))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut cmd = Command::new(exe());
        cmd.args(["node", "--id", &id.to_string(), "--peers"])
            .arg(list(&self.peer_ports))
            .arg("--peer-http")
            .arg(list(&self.http_ports))
            .args(["--http", &format!("127.0.0.1:{}", self.port(id))])
            .arg("--data-dir")
            .arg(dir)
            .args(&self.args);
        if self.serves_etcd() {
            cmd.args([
                "--etcd-listen",
                &format!("127.0.0.1:{}", self.etcd_port(id)),
            ])
            .arg("--peer-etcd")
            .arg(list(&self.etcd_ports));
        }
        if !self.args.iter().any(|a| a == "--insecure-peers") {
            let tls = self.tls();
            cmd.arg("--peer-ca").arg(tls.join("ca.pem"));
            cmd.arg("--peer-cert")
                .arg(tls.join(format!("node-{id}.pem")));
            cmd.arg("--peer-key")
                .arg(tls.join(format!("node-{id}.key")));
        }
        cmd
    }

    pub fn spawn(&mut self, id: u64) {
        self.spawn_edited(id, |_| {});
    }

    /// Start node `id` with its common flags changed by `edit` (for this start only).
    pub fn spawn_edited(&mut self, id: u64, edit: impl FnOnce(&mut Vec<String>)) {
        let cmd = self.command_edited(id, edit);
        self.spawn_command(id, cmd);
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        self.data.join(format!("node{id}.log"))
    }

    pub fn port(&self, id: u64) -> u16 {
        self.http_ports[id as usize - 1]
    }

    /// Node `id`'s etcd API port.
    pub fn etcd_port(&self, id: u64) -> u16 {
        self.etcd_ports[id as usize - 1]
    }

    /// Whether the nodes serve etcd's API: one group only.
    pub fn serves_etcd(&self) -> bool {
        let groups = self.args.iter().position(|a| a == "--groups");
        groups.is_none_or(|i| self.args.get(i + 1).is_some_and(|n| n == "1"))
    }

    pub fn peer_port(&self, id: u64) -> u16 {
        self.peer_ports[id as usize - 1]
    }

    pub fn pid(&self, id: u64) -> u32 {
        self.nodes[id as usize - 1].as_ref().expect("running").id()
    }

    pub fn signal(&self, id: u64, sig: i32) {
        // SAFETY: signalling a child process we spawned and still own.
        assert_eq!(unsafe { libc::kill(self.pid(id) as libc::pid_t, sig) }, 0);
    }

    pub fn kill9(&mut self, id: u64) {
        let mut child = self.nodes[id as usize - 1].take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Wait up to `secs` for node `id` to exit on its own; its status.
    pub fn wait_exit(&mut self, id: u64, secs: u64) -> ExitStatus {
        let child = self.nodes[id as usize - 1].as_mut().expect("running");
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.nodes[id as usize - 1] = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not exit within {secs} s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether node `id` is still running.
    pub fn running(&mut self, id: u64) -> bool {
        let slot = &mut self.nodes[id as usize - 1];
        slot.as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// The ids of every node slot.
    pub fn ids(&self) -> Vec<u64> {
        (1..=self.nodes.len() as u64).collect()
    }

    /// The leader, once one node says it leads with a lease (within `secs`).
    pub fn leader(&self, among: &[u64], secs: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            for &id in among {
                if let Some(s) = status(self.port(id)) {
                    if s["role"] == "leader" && s["lease"]["state"] != "expired" {
                        return id;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "no leader with a lease among {among:?} within {secs} s:\n{}",
            self.log_tail()
        );
    }

    /// Every (key, value) in `acked` reads back through raft on node `id`.
    pub fn assert_acked(&self, id: u64, acked: &[(String, String)]) {
        for (k, v) in acked {
            let (code, body) = http(self.port(id), "GET", &format!("/kv/{k}?read=index"), b"")
                .unwrap_or((0, "no answer".into()));
            assert_eq!(
                (code, json(&body)["value"].as_str()),
                (200, Some(v.as_str())),
                "acknowledged write {k} lost: {body}\n{}",
                self.log_tail()
            );
        }
    }

    pub fn log_tail(&self) -> String {
        #[allow(non_snake_case)]
        let LOG_TAIL_LINES = *LOG_TAIL_LINES_ENV.get_or_init(|| {
            std::env::var("KV_TEST_LOG_LINES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(15)
        });
        (1..=self.nodes.len() as u64)
            .map(|id| {
                let log = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL_LINES).collect();
                format!(
                    "--- node {id}\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.nodes.iter_mut().flatten() {
            // SAFETY: as in `signal`; SIGCONT first so that a stopped child can die.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test's data dirs and logs, kept for a post-mortem when asked.
        if let (true, Ok(to)) = (std::thread::panicking(), std::env::var("KV_TEST_KEEP_DIR")) {
            let to = format!("{to}/{}-{}", std::process::id(), self.peer_ports[0]);
            let copied = std::process::Command::new("cp")
                .args(["-a", &self.data.display().to_string(), &to])
                .status();
            eprintln!("data dirs kept in {to}: {copied:?}");
        }
    }
}

/// One HTTP/1.1 request with the admin token, following 307 redirects to the leader (up to 3);
/// (status, body). `None` if no node answers in 5 s.
pub fn http_follow(port: u16, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    let auth = format!("Bearer {TOKEN}");
    let mut port = port;
    for _ in 0..3 {
        let (code, head, body_bytes) =
            http_raw(port, method, path, body, &[("Authorization", &auth)])?;
        let location = head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("location:")
                .map(|v| v.trim().to_string())
        });
        let next = location.and_then(|l| l.split(':').nth(2)?.split('/').next()?.parse().ok());
        match (code, next) {
            (307, Some(p)) => port = p,
            _ => return Some((code, String::from_utf8_lossy(&body_bytes).into_owned())),
        }
    }
    None
}

/// One HTTP/1.1 request with the admin token; returns (status, body). `None` if the node does
/// not answer in 5 s.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> Option<(u16, String)> {
    http_with(
        port,
        method,
        path,
        body,
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    )
    .map(|(c, b)| (c, String::from_utf8_lossy(&b).into_owned()))
}

/// One HTTP/1.1 request with these headers; (status, raw body).
pub fn http_with(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Option<(u16, Vec<u8>)> {
    http_raw(port, method, path, body, headers).map(|(c, _, b)| (c, b))
}

/// One HTTP/1.1 request with these headers; (status, head, raw body).
pub fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Option<(u16, String, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    // A server may answer before the body is sent (a 503 at once) and close: read its answer
    // even when sending the rest failed.
    let _ = s.write_all(body);
    read_full_response(&mut s)
}

/// A whole `Connection: close` response: (status, body).
pub fn read_response(s: &mut impl Read) -> Option<(u16, Vec<u8>)> {
    read_full_response(s).map(|(c, _, b)| (c, b))
}

/// A whole `Connection: close` response: (status, head, body).
pub fn read_full_response(s: &mut impl Read) -> Option<(u16, String, Vec<u8>)> {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf); // a reset after the answer still leaves the answer
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, head, buf[split + 4..].to_vec()))
}

pub fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

pub fn status(port: u16) -> Option<Value> {
    http(port, "GET", "/status", b"").map(|(_, b)| json(&b))
}

pub fn put(port: u16, key: &str, value: &str) -> u64 {
    let (code, body) = http(port, "PUT", &format!("/kv/{key}"), value.as_bytes()).expect("answer");
    assert_eq!(code, 200, "PUT {key}: {body}");
    json(&body)["revision"].as_u64().unwrap()
}

/// A counter or gauge from `/metrics`.
pub fn metric(port: u16, name: &str) -> u64 {
    let (code, text) = http(port, "GET", "/metrics", b"").expect("metrics");
    assert_eq!(code, 200);
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// A labelled counter from `/metrics`: the line of `name` whose labels contain `label` (0 if none).
pub fn metric_labeled(port: u16, name: &str, label: &str) -> u64 {
    let (code, text) = http(port, "GET", "/metrics", b"").expect("metrics");
    assert_eq!(code, 200);
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Ask `from` to hand leadership to `to` until `to` leads with a lease. raft aborts a transfer
/// whose target has not caught up within an election timeout, so it is asked again.
pub fn transfer(c: &Cluster, from: u64, to: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let body = format!("{{\"to\": {to}}}");
        let _ = http_follow(c.port(from), "POST", "/admin/transfer", body.as_bytes());
        for _ in 0..20 {
            let s = status(c.port(to));
            if s.is_some_and(|s| s["role"] == "leader" && s["lease"]["state"] != "expired") {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("leadership never moved to node {to}:\n{}", c.log_tail());
}

/// Everything an error answer must have: `{"error": code, "detail": text}`; the code.
pub fn error_code(body: &str) -> String {
    let v = json(body);
    assert!(v["detail"].is_string(), "no detail: {body}");
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {body}"))
        .to_string()
}

/// Set `flag` to `value` in a node's flags, replacing the value it had (or adding both).
pub fn set_flag(flags: &mut Vec<String>, flag: &str, value: &str) {
    match flags.iter().position(|f| f == flag) {
        Some(at) => flags[at + 1] = value.to_string(),
        None => flags.extend([flag.to_string(), value.to_string()]),
    }
}

/// The ids 1..=3 other than `id`.
pub fn others(id: u64) -> Vec<u64> {
    (1..=3).filter(|&i| i != id).collect()
}

/// A process's resident set and its peak, in KiB (from /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}
