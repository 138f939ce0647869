//! A data dir that is not what it should be refuses to start (exit 3, a clear message, never a
//! panic, never an empty start), and a fatal storage error exits non-zero.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cluster::{http, json, put, Cluster};

/// Both log engines, as `--log-engine` names them.
const ENGINES: [&str; 2] = ["raft-engine", "redb"];

/// The file holding the raft log in node dir `dir` on `engine` (raft-engine's newest log file).
fn store_file(dir: &Path, engine: &str) -> PathBuf {
    if engine == "redb" {
        return dir.join("raft.redb");
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("raft-engine"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "raftlog"))
        .collect();
    files.sort();
    files.pop().expect("a raft-engine log file")
}

/// Stop node `id` with SIGTERM; it must exit 0.
fn stop(c: &mut Cluster, id: u64) {
    c.signal(id, libc::SIGTERM);
    let s = c.wait_exit(id, 10);
    assert!(s.success(), "SIGTERM: {s}");
}

/// Start node `id` and expect it to refuse: exit code and the log's last lines.
fn refused_start(c: &mut Cluster, id: u64) -> (Option<i32>, String) {
    c.spawn(id);
    let code = c.wait_exit(id, 10).code();
    let log = std::fs::read_to_string(c.log_path(id)).unwrap();
    (code, log)
}

#[test]
fn a_truncated_missing_or_corrupt_raft_store_refuses_to_start() {
    for engine in ENGINES {
        damaged_store_refuses_to_start(engine);
    }
}

fn damaged_store_refuses_to_start(engine: &str) {
    let mut c = Cluster::start(1, &["--log-engine", engine]);
    c.leader(&[1], 15);
    put(c.port(1), "k", "kept");
    stop(&mut c, 1);
    let store = store_file(&c.data.join("node1"), engine);
    let intact = std::fs::read(&store).unwrap();
    let mut junk = intact.clone();
    junk[..4096.min(intact.len())].fill(0xa5);
    // Cut inside what was written: the log alone is small now (the state is in its own
    // engine), and raft-engine's file is mostly the zeros it was made with, so half of it may
    // hold every batch. A cut short of the last written byte tears the last batch.
    let written = intact.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let torn = intact[..written
        .saturating_sub(7)
        .min(intact.len() / 2)
        .max(written / 2)]
        .to_vec();
    let damage: [(&str, Option<Vec<u8>>); 4] = [
        ("truncated to 0 bytes", Some(Vec::new())),
        ("deleted", None),
        ("header overwritten", Some(junk)),
        ("cut inside what was written", Some(torn)),
    ];
    for (what, damaged) in damage {
        match &damaged {
            Some(bytes) => std::fs::write(&store, bytes).unwrap(),
            None => std::fs::remove_file(&store).unwrap(),
        }
        let (code, log) = refused_start(&mut c, 1);
        let last = log.lines().last().unwrap_or_default().to_string();
        eprintln!("{engine} store {what}: exit {code:?}: {last}");
        assert_eq!(code, Some(3), "{what}: {log}");
        assert!(
            log.contains("refusing to start") && !log.contains("panicked"),
            "{what}: {log}"
        );
        assert_eq!(
            std::fs::read(&store).ok(),
            damaged,
            "{what}: the store was touched"
        );
        std::fs::write(&store, &intact).unwrap();
    }
    // Control: the same dir with its store intact starts and still has the write.
    c.spawn(1);
    c.leader(&[1], 15);
    let (code, body) = http(c.port(1), "GET", "/kv/k?read=index", b"").unwrap();
    assert_eq!((code, json(&body)["value"].as_str()), (200, Some("kept")));
}

#[test]
fn another_nodes_or_clusters_data_dir_is_refused() {
    let mut c = Cluster::start(3, &["--log-engine", "redb"]);
    let l = c.leader(&[1, 2, 3], 15);
    put(c.port(l), "k", "v");
    for id in [1, 2] {
        stop(&mut c, id);
    }
    let (d1, d2) = (c.data.join("node1"), c.data.join("node2"));
    let saved = std::fs::read(d2.join("raft.redb")).unwrap();
    // Node 1's store copied over node 2's, under node 2's marker.
    std::fs::copy(d1.join("raft.redb"), d2.join("raft.redb")).unwrap();
    let (code, log) = refused_start(&mut c, 2);
    eprintln!("node 1's store in node 2's dir: exit {code:?}");
    assert!(code == Some(3) && log.contains("node 1's"), "{log}");
    std::fs::write(d2.join("raft.redb"), saved).unwrap();
    // Node 2 pointed at node 1's whole dir.
    let out = c.command_in(2, &d1).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("node 2 on node 1's dir: exit {:?}", out.status.code());
    assert!(
        out.status.code() == Some(3) && err.contains("belongs to node 1"),
        "{err}"
    );
    // Another cluster's name.
    let out = c
        .command_edited(1, |args| {
            let at = args.iter().position(|a| a == "test-cluster").unwrap();
            args[at] = "other".into();
        })
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Control: the right node on its own dir starts.
    c.spawn(2);
    c.spawn(1);
    c.leader(&[1, 2, 3], 15);
}

#[test]
fn a_fatal_storage_error_exits_non_zero() {
    for engine in ENGINES {
        a_full_disk_exits_non_zero_and_loses_nothing(engine);
    }
}

fn a_full_disk_exits_non_zero_and_loses_nothing(engine: &str) {
    let mut c = Cluster::start(1, &["--log-engine", engine]);
    c.leader(&[1], 15);
    put(c.port(1), "k", "v");
    let store = store_file(&c.data.join("node1"), engine);
    let size = std::fs::metadata(&store).unwrap().len();
    // The disk fills up: no file of the node may grow more than 8 MiB past its size now.
    let lim = libc::rlimit {
        rlim_cur: size + (8 << 20),
        rlim_max: size + (8 << 20),
    };
    // SAFETY: prlimit on a child process we own, with a valid struct.
    let rc = unsafe {
        libc::prlimit(
            c.pid(1) as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit");
    let value = vec![b'x'; 512 << 10];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut acked = 0;
    while c.running(1) {
        assert!(
            Instant::now() < deadline,
            "the node never failed:\n{}",
            c.log_tail()
        );
        if http(c.port(1), "PUT", &format!("/kv/big{acked}"), &value)
            .is_some_and(|(code, _)| code == 200)
        {
            acked += 1;
        }
    }
    let code = c.wait_exit(1, 5).code();
    let log = std::fs::read_to_string(c.log_path(1)).unwrap();
    eprintln!("{engine}: disk full after {acked} acknowledged 512 KiB writes: exit {code:?}");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("storage failed"), "{log}");
    assert!(acked > 0, "nothing was acknowledged before the disk filled");
    // Restarted with room again: every acknowledged write is there.
    c.spawn(1);
    c.leader(&[1], 15);
    let raw = [("Accept", "application/octet-stream")];
    for i in 0..acked {
        let (code, got) = crate::cluster::http_with(
            c.port(1),
            "GET",
            &format!("/kv/big{i}?read=index"),
            b"",
            &raw,
        )
        .unwrap();
        assert!(
            code == 200 && got == value,
            "big{i} lost after the disk filled: {code}"
        );
    }
    let (code, body) = http(c.port(1), "GET", "/kv/k?read=index", b"").unwrap();
    assert_eq!((code, json(&body)["value"].as_str()), (200, Some("v")));
}

#[test]
fn a_second_process_on_a_data_dir_is_told_the_dir_is_in_use_not_corrupt() {
    let c = Cluster::start(1, &[]);
    c.leader(&[1], 15);
    put(c.port(1), "k", "v");
    // The same node's command line, on other ports, on the same dir.
    let (peer, web) = (crate::ports::reserve(), crate::ports::reserve());
    let mut cmd = std::process::Command::new(crate::cluster::exe());
    let args: Vec<String> = c.args.clone();
    cmd.args([
        "node",
        "--id",
        "1",
        "--peers",
        &format!("1=127.0.0.1:{}", peer.port),
    ])
    .args(["--http", &format!("127.0.0.1:{}", web.port), "--data-dir"])
    .arg(c.data.join("node1"))
    .args(&args);
    let tls = c.tls();
    cmd.arg("--peer-ca").arg(tls.join("ca.pem"));
    cmd.arg("--peer-cert").arg(tls.join("node-1.pem"));
    cmd.arg("--peer-key").arg(tls.join("node-1.key"));
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    eprintln!("second process: exit {:?}: {last}", out.status.code());
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        last.contains("another process is using this data dir"),
        "{last}"
    );
    assert!(
        !last.contains("corrupt") && !last.contains("Restore"),
        "{last}"
    );
    // The first one is untouched and serves.
    let (code, body) = http(c.port(1), "GET", "/kv/k?read=index", b"").unwrap();
    assert_eq!((code, json(&body)["value"].as_str()), (200, Some("v")));
}
