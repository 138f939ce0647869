//! `etcdctl` 3.4 as a user types it, against this store and against etcd 3.4: the printed
//! output of each command is checked, and the `lock` and `elect` recipes (client-side, on Txn,
//! Watch and Lease) keep one holder at a time while the cluster's leader is killed.

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::target::Target;

/// `etcdctl` with `endpoints`, as a user runs it.
fn etcdctl(endpoints: &[String]) -> Command {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--command-timeout=10s");
    c
}

fn run(t: &Target, args: &[&str]) -> String {
    let out = etcdctl(&t.endpoints())
        .args(args)
        .output()
        .expect("run etcdctl");
    check(t, args, out)
}

fn check(t: &Target, args: &[&str], out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}: etcdctl {args:?}: {}\n{stdout}",
        t.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Whether etcdctl is installed; under CI (`CI` set) it must be.
pub fn available() -> bool {
    if Command::new("etcdctl").arg("version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install Debian's etcd-client (etcdctl 3.4)"
    );
    eprintln!("SKIPPED: no etcdctl (apt-get install etcd-client)");
    false
}

/// put/get/del with prefixes and revisions, txn, watch, leases, member list, endpoint status
/// and health, compaction: each command's output as etcdctl prints it.
pub fn commands(t: &mut Target) {
    assert_eq!(run(t, &["put", "greeting", "hello"]), "OK\n");
    assert_eq!(run(t, &["get", "greeting"]), "greeting\nhello\n");
    for (k, v) in [("dir/a", "1"), ("dir/b", "2"), ("dirt", "3")] {
        run(t, &["put", k, v]);
    }
    assert_eq!(
        run(t, &["get", "dir/", "--prefix"]),
        "dir/a\n1\ndir/b\n2\n",
        "{}",
        t.name()
    );
    assert_eq!(
        run(t, &["get", "dir/", "--prefix", "--keys-only"]),
        "dir/a\n\ndir/b\n\n"
    );
    assert_eq!(
        run(t, &["get", "dir/a", "dirt"]),
        "dir/a\n1\ndir/b\n2\n",
        "a range [a, dirt)"
    );
    assert_eq!(
        run(t, &["get", "dirt", "--from-key"]),
        "dirt\n3\ngreeting\nhello\n"
    );
    let json = run(t, &["get", "greeting", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let created = v["kvs"][0]["create_revision"].as_i64().unwrap();
    run(t, &["put", "greeting", "bye"]);
    let old = run(t, &["get", "greeting", &format!("--rev={created}")]);
    assert_eq!(
        old,
        "greeting\nhello\n",
        "{}: a read at a past revision",
        t.name()
    );
    assert_eq!(run(t, &["del", "dir/", "--prefix"]), "2\n");
    assert_eq!(run(t, &["del", "nothing"]), "0\n");
    // txn, interactive: compares, then the success ops, then the failure ops.
    let mut txn = etcdctl(&t.endpoints())
        .args(["txn"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    txn.stdin
        .take()
        .unwrap()
        .write_all(b"value(\"greeting\") = \"bye\"\n\nput greeting again\nput other x\n\nput greeting never\n\n")
        .unwrap();
    let out = check(t, &["txn"], txn.wait_with_output().unwrap());
    assert_eq!(out, "SUCCESS\n\nOK\n\nOK\n", "{}", t.name());
    assert_eq!(
        run(t, &["get", "greeting", "--print-value-only"]),
        "again\n"
    );
    // Watch: history from a revision, printed as etcdctl prints events.
    let mut watch = spawn_logged(t, &["watch", "greeting", &format!("--rev={created}")]);
    let lines = read_lines(&mut watch, 9, Duration::from_secs(20));
    let _ = watch.kill();
    let _ = watch.wait();
    let expect = "PUT greeting hello PUT greeting bye PUT greeting again";
    assert_eq!(
        lines.join(" "),
        expect,
        "{}: a watch from a past revision",
        t.name()
    );
    lease_commands(t);
    let members = run(t, &["member", "list"]);
    assert_eq!(members.lines().count(), 3, "{}: {members}", t.name());
    assert!(
        members
            .lines()
            .all(|l| l.contains(", started, ") && l.ends_with(", false")),
        "{members}"
    );
    let status = run(t, &["endpoint", "status"]);
    assert_eq!(status.lines().count(), 3, "{}: {status}", t.name());
    assert_eq!(
        status.matches(", true, false, ").count(),
        1,
        "exactly one leader: {status}"
    );
    // With --cluster, etcdctl dials each member's advertised URL (`http://...`), and sends the
    // URL as the HTTP/2 `:authority`.
    let status = run(t, &["endpoint", "status", "--cluster"]);
    assert_eq!(status.lines().count(), 3, "{}: {status}", t.name());
    assert!(
        status.lines().all(|l| l.starts_with("http://")),
        "{}: {status}",
        t.name()
    );
    let defrag = run(t, &["defrag", "--cluster"]);
    assert_eq!(
        defrag
            .matches("Finished defragmenting etcd member[http://")
            .count(),
        3,
        "{}: {defrag}",
        t.name()
    );
    // Every member's keyspace hashes alike once each has applied the last write.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(t, &["endpoint", "hashkv", "--cluster"]);
        let hashes: Vec<&str> = out.lines().filter_map(|l| l.rsplit(", ").next()).collect();
        if hashes.len() == 3 && hashes.iter().all(|h| *h == hashes[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "{}: hashkv {out}", t.name());
        std::thread::sleep(Duration::from_millis(200));
    }
    let health = Command::new("etcdctl")
        .args([
            format!("--endpoints={}", t.endpoints().join(",")),
            "endpoint".into(),
            "health".into(),
        ])
        .output()
        .unwrap();
    let health = String::from_utf8_lossy(&health.stderr).to_string()
        + &String::from_utf8_lossy(&health.stdout);
    assert_eq!(
        health
            .matches("is healthy: successfully committed proposal")
            .count(),
        3,
        "{health}"
    );
    let rev = v["header"]["revision"].as_i64().unwrap();
    assert_eq!(
        run(t, &["compaction", &rev.to_string()]),
        format!("compacted revision {rev}\n")
    );
    let e = etcdctl(&t.endpoints())
        .args(["get", "greeting", &format!("--rev={}", rev - 1)])
        .output()
        .unwrap();
    assert!(!e.status.success());
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(
        stderr.contains("required revision has been compacted"),
        "{}: {stderr}",
        t.name()
    );
    move_leader(t);
}

/// `move-leader` to a member that does not lead: etcdctl finds the leader, and once it
/// answers, `endpoint status` names the new leader.
fn move_leader(t: &Target) {
    // "127.0.0.1:P, <id hex>, 3.4.x, <size>, <is leader>, <is learner>, <term>, ..."
    let status = run(t, &["endpoint", "status"]);
    let rows: Vec<Vec<&str>> = status.lines().map(|l| l.split(", ").collect()).collect();
    let to = rows.iter().find(|r| r[4] == "false").unwrap()[1].to_string();
    let out = run(t, &["move-leader", &to]);
    assert!(
        out.starts_with("Leadership transferred from ") && out.trim_end().ends_with(&to),
        "{}: {out}",
        t.name()
    );
    let status = run(t, &["endpoint", "status"]);
    let leader = status.lines().find(|l| l.contains(", true, false, "));
    assert!(
        leader.is_some_and(|l| l.contains(&format!(", {to}, "))),
        "{}: {status}",
        t.name()
    );
}

fn lease_commands(t: &Target) {
    let granted = run(t, &["lease", "grant", "30"]);
    // "lease 694d77aa9e38260f granted with TTL(30s)"
    let id = granted.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(
        granted,
        format!("lease {id} granted with TTL(30s)\n"),
        "{}",
        t.name()
    );
    assert_eq!(
        run(t, &["put", "leased", "v", &format!("--lease={id}")]),
        "OK\n"
    );
    let once = run(t, &["lease", "keep-alive", "--once", &id]);
    assert_eq!(
        once,
        format!("lease {id} keepalived with TTL(30)\n"),
        "{}",
        t.name()
    );
    let ttl = run(t, &["lease", "timetolive", &id, "--keys"]);
    assert!(
        ttl.starts_with(&format!("lease {id} granted with TTL(30s), remaining(")),
        "{ttl}"
    );
    assert!(
        ttl.ends_with("attached keys([leased])\n"),
        "{}: {ttl}",
        t.name()
    );
    assert!(run(t, &["lease", "list"]).contains(&id));
    assert_eq!(
        run(t, &["lease", "revoke", &id]),
        format!("lease {id} revoked\n")
    );
    assert_eq!(
        run(t, &["get", "leased"]),
        "",
        "the lease's key went with it"
    );
    assert_eq!(
        run(t, &["lease", "timetolive", &id]),
        format!("lease {id} already expired\n")
    );
}

/// A line-by-line log of a command that the lock (or election) guards.
fn spawn_logged(t: &Target, args: &[&str]) -> Child {
    etcdctl(&t.endpoints())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `etcdctl lock` from two clients in turn, the cluster's leader killed meanwhile: the guarded
/// sections never overlap, and both clients get the lock.
pub fn lock_across_a_killed_leader(t: &mut Target) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sections");
    let section = format!(
        "echo start $$ >> {0}; sleep 0.4; echo end $$ >> {0}",
        log.display()
    );
    let rt = crate::compat::runtime();
    let mut rounds = Vec::new();
    let started = Instant::now();
    for round in 0..6 {
        let eps = t.live_endpoints();
        let mut lockers: Vec<Child> = (0..2)
            .map(|_| {
                etcdctl(&eps)
                    .args(["lock", "the-lock", "--", "sh", "-c", &section])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        if round == 2 {
            std::thread::sleep(Duration::from_millis(200));
            t.kill_leader(&rt);
        }
        for l in &mut lockers {
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                if let Some(s) = l.try_wait().unwrap() {
                    rounds.push(s.success());
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}: a locker never finished",
                    t.name()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let sections = sections(&text).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
    let ok = rounds.iter().filter(|&&s| s).count();
    assert!(
        sections >= 10 && ok >= 10,
        "{}: {sections} sections, {ok} of 12 lockers ok in {:?}",
        t.name(),
        started.elapsed()
    );
}

/// The guarded sections in a log of `start PID` / `end PID` lines, or where two overlap.
pub fn sections(text: &str) -> Result<usize, String> {
    let mut holder: Option<&str> = None;
    let mut done = 0;
    for line in text.lines() {
        match (line.split_once(' '), holder) {
            (Some(("start", pid)), None) => holder = Some(pid),
            (Some(("end", pid)), Some(h)) if h == pid => {
                holder = None;
                done += 1;
            }
            _ => return Err(format!("two holders at once (at {line:?}):\n{text}")),
        }
    }
    Ok(done)
}

/// The control of the lock tests' checker: the same sections run without the lock overlap,
/// and the checker says so.
pub fn sections_without_the_lock_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sections");
    let section = format!(
        "echo start $$ >> {0}; sleep 0.4; echo end $$ >> {0}",
        log.display()
    );
    let mut both: Vec<Child> = (0..2)
        .map(|_| Command::new("sh").args(["-c", &section]).spawn().unwrap())
        .collect();
    for c in &mut both {
        c.wait().unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        sections(&text).is_err(),
        "the checker missed two holders:\n{text}"
    );
}

/// `etcdctl elect` from two campaigners: the second is elected only after the first resigns,
/// and the first stays elected while the cluster's leader is killed.
pub fn elect_across_a_killed_leader(t: &mut Target) {
    let rt = crate::compat::runtime();
    let mut alice = spawn_logged(t, &["elect", "the-election", "alice"]);
    let alice_out = read_line(&mut alice, Duration::from_secs(20));
    assert!(
        alice_out.starts_with("the-election/"),
        "{}: {alice_out:?}",
        t.name()
    );
    let mut bob = spawn_logged(t, &["elect", "the-election", "bob"]);
    let bob_lines = lines_of(&mut bob);
    std::thread::sleep(Duration::from_millis(500));
    t.kill_leader(&rt);
    // Bob must not be elected while alice holds it, leader or no leader: he prints nothing.
    let early = bob_lines.recv_timeout(Duration::from_secs(3));
    assert!(
        early.is_err(),
        "{}: bob elected while alice held it: {early:?}",
        t.name()
    );
    let observed = etcdctl(&t.live_endpoints())
        .args([
            "get",
            "the-election/",
            "--prefix",
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--print-value-only",
        ])
        .output()
        .unwrap();
    let order = String::from_utf8_lossy(&observed.stdout).to_string();
    assert!(order.starts_with("alice\n"), "{}: {order:?}", t.name());
    // Alice resigns (etcdctl resigns on SIGINT), then bob is elected.
    // SAFETY: signalling a child process this test spawned.
    unsafe { libc::kill(alice.id() as libc::pid_t, libc::SIGINT) };
    let _ = alice.wait();
    let bob_out = bob_lines
        .recv_timeout(Duration::from_secs(30))
        .expect("bob elected after alice resigned");
    assert!(
        bob_out.starts_with("the-election/"),
        "{}: {bob_out:?}",
        t.name()
    );
    let _ = bob.kill();
    let _ = bob.wait();
}

/// The non-empty lines `child` prints, as they come.
fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if !line.is_empty() && tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line `child` prints, within `within`.
fn read_line(child: &mut Child, within: Duration) -> String {
    read_lines(child, 1, within).remove(0)
}

/// The first `n` non-empty lines `child` prints, within `within` in all.
fn read_lines(child: &mut Child, n: usize, within: Duration) -> Vec<String> {
    let rx = lines_of(child);
    let deadline = Instant::now() + within;
    let mut lines = Vec::new();
    while lines.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    lines
}
