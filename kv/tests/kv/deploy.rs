//! docs/deploy.md run as printed: four test hosts in network namespaces (`kv hosts up`) with the
//! guide's addresses, each block run on the host the guide names, from that host's own dir: the
//! certificates made on an admin machine, three nodes started with the guide's command (the
//! systemd unit's `ExecStart` is checked to be that command), health checks with curl over
//! HTTPS, a fourth node joining with `--join`, and one removed. Only the program's path is put
//! in for `kv`, and each host's `node.env` values for the guide's example ones.
//!
//! It needs root, iproute2, nftables and curl, as CI has; elsewhere it says so and passes
//! without running (under `CI` it fails instead).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{exe, json};

const GUIDE: &str = include_str!("../../../docs/deploy.md");
const HOSTS: &str = "1,2,3,4";

/// The lines of the guide's block tagged `tag` (` ```sh tag`), continuations joined.
fn block(tag: &str) -> Vec<String> {
    let start = GUIDE
        .lines()
        .position(|l| l.starts_with("```") && l.ends_with(&format!(" {tag}")))
        .unwrap_or_else(|| panic!("docs/deploy.md has no block {tag}"));
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in GUIDE
        .lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("```"))
    {
        let text = line.trim();
        match open {
            true => out
                .last_mut()
                .unwrap()
                .push_str(&format!(" {}", text.trim_end_matches('\\').trim())),
            false => out.push(text.trim_end_matches('\\').trim().to_string()),
        }
        open = text.ends_with('\\');
    }
    out
}

/// A shell line with `kv` as this build's program.
fn with_program(line: &str) -> String {
    match line.strip_prefix("kv ") {
        Some(rest) => format!("{} {rest}", exe().display()),
        None => line.to_string(),
    }
}

/// The hosts, and the nodes on them, removed on drop.
struct Hosts {
    nodes: Vec<Child>,
}

impl Hosts {
    /// `kv hosts up`; `None` where network namespaces cannot be had.
    fn up() -> Option<Hosts> {
        let _ = Command::new(exe())
            .args(["hosts", "down", "--ids", HOSTS])
            .output();
        let out = Command::new(exe())
            .args(["hosts", "up", "--ids", HOSTS])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        match out.status.code() {
            Some(0) => Some(Hosts { nodes: Vec::new() }),
            Some(5) if std::env::var_os("CI").is_none() => {
                eprintln!("SKIPPED: the deploy guide needs network namespaces: {err}");
                None
            }
            _ => panic!("kv hosts up: {out:?}"),
        }
    }

    /// Start the guide's block `tag` on host `id` from `dir`, its `node.env` in the environment.
    fn start(&mut self, id: u64, dir: &Path, tag: &str) {
        let line = with_program(&block(tag)[0]);
        let script = format!("set -a; . ./node.env; set +a; exec {line}");
        let log = std::fs::File::create(dir.join("node.log")).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("rlkhost-{id}"),
                "sh",
                "-c",
                &script,
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes.push(child);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(exe())
            .args(["hosts", "down", "--ids", HOSTS])
            .output();
    }
}

/// Run `line` with `sh` in `dir` (the client side, in the root namespace); its standard output.
fn sh(dir: &Path, line: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &with_program(line)])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{line}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `line` until `ok` holds of its output, for up to 30 s; the last output.
fn until(dir: &Path, line: &str, ok: impl Fn(&Value) -> bool, logs: &[PathBuf]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("sh")
            .args(["-c", line])
            .current_dir(dir)
            .output()
            .unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if ok(&v) {
            return v;
        }
        if Instant::now() > deadline {
            let tails: Vec<String> = logs
                .iter()
                .map(|p| std::fs::read_to_string(p).unwrap_or_default())
                .collect();
            panic!("{line}: {v}\n{}", tails.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Host `id`'s dir: its files copied from the admin's `tls/` as step 1 lists, and its
/// `node.env` with the guide's keys.
fn host_dir(root: &Path, id: u64, cluster_id: &str) -> PathBuf {
    let dir = root.join(format!("host{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let tls = root.join("admin/tls");
    for f in [
        "ca.pem".to_string(),
        format!("node-{id}.pem"),
        format!("node-{id}.key"),
        format!("http-{id}.pem"),
        format!("http-{id}.key"),
        "admin.token".to_string(),
    ] {
        std::fs::copy(tls.join(&f), dir.join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let values = [
        ("ID", id.to_string()),
        ("ADDR", format!("10.77.0.{id}")),
        ("CLUSTER_ID", cluster_id.to_string()),
    ];
    let env: Vec<String> = block("deploy-env")
        .iter()
        .map(|l| {
            let key = l.split('=').next().unwrap();
            let (_, v) = values
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap_or_else(|| panic!("node.env key {key}"));
            format!("{key}={v}")
        })
        .collect();
    std::fs::write(dir.join("node.env"), env.join("\n") + "\n").unwrap();
    dir
}

/// The voters a `/members` answer lists.
fn voters(v: &Value) -> Vec<u64> {
    v["voters"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[test]
fn the_deploy_guide_runs_as_printed() {
    let _serial = crate::cluster::serial();
    // The unit starts the guide's command: the same flags, the program at its installed path.
    let exec = block("deploy-unit")
        .into_iter()
        .find_map(|l| l.strip_prefix("ExecStart=").map(str::to_string));
    assert_eq!(
        exec.unwrap().replace("/usr/local/bin/kv ", "kv "),
        block("deploy-node")[0]
    );
    let Some(mut hosts) = Hosts::up() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let admin = tmp.path().join("admin");
    std::fs::create_dir_all(&admin).unwrap();
    for line in block("deploy-certs") {
        sh(&admin, &line);
    }
    let tls = admin.join("tls");
    let cluster_id = std::fs::read_to_string(tls.join("cluster-id")).unwrap();
    let mut logs = Vec::new();
    for id in 1..=3 {
        let dir = host_dir(tmp.path(), id, cluster_id.trim());
        hosts.start(id, &dir, "deploy-node");
        logs.push(dir.join("node.log"));
    }
    let check = block("deploy-check");
    until(&tls, &check[0], |v| v["role"].is_string(), &logs);
    until(&tls, &check[1], |v| v["revision"].is_u64(), &logs);
    let read = until(&tls, &check[2], |v| v["value"].is_string(), &logs);
    assert_eq!(read["value"], "hello", "{read}");
    until(&tls, &check[3], |v| voters(v) == [1, 2, 3], &logs);
    until(&tls, &check[4], |v| v["health"] == "true", &logs);
    // A fourth node joins over HTTPS.
    for line in block("deploy-add-certs") {
        sh(&admin, &line);
    }
    let dir = host_dir(tmp.path(), 4, cluster_id.trim());
    hosts.start(4, &dir, "deploy-join");
    logs.push(dir.join("node.log"));
    until(&tls, &check[3], |v| voters(v) == [1, 2, 3, 4], &logs);
    // Node 3 removed (through node 1, redirected to the leader with the token); a leader may
    // not remove itself, so as the guide says, its leadership moves first.
    let leader = until(&tls, &check[0], |v| v["leader_id"].is_u64(), &logs)["leader_id"].clone();
    if leader == 3 {
        let transfer = block("deploy-remove")[0]
            .replace(
                r#"{"changes": [{"op": "remove", "id": 3}]}"#,
                r#"{"to": 1}"#,
            )
            .replace("/admin/members", "/admin/transfer");
        sh(&tls, &transfer);
        until(
            &tls,
            &check[0],
            |v| v["leader_id"].is_u64() && v["leader_id"] != 3,
            &logs,
        );
    }
    let removed = json(&sh(&tls, &block("deploy-remove")[0]));
    assert_eq!(voters(&removed), [1, 2, 4], "{removed}");
    until(&tls, &check[3], |v| voters(v) == [1, 2, 4], &logs);
    let read = until(
        &tls,
        &check[2].replace("10.77.0.3", "10.77.0.4"),
        |v| v["value"].is_string(),
        &logs,
    );
    assert_eq!(
        read["value"], "hello",
        "node 4 serves what was written before it joined: {read}"
    );
}
