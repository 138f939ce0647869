//! `kv cluster` as a user runs it: the banner's first examples, run as printed (by curl too when it
//! is installed), work whichever node leads, the
//! data persists across runs, a node killed with `kill -9` is reported with the command that
//! restarts it while the others keep serving, `restart N` on the console brings it back, a second
//! cluster on the same ports shows the real error with a hint (and `--temp` removes its dir), and
//! ports that would overflow are refused.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{exe, http_follow, json, status};

/// A `kv cluster` process with its console output in files.
struct Console {
    child: Child,
    stdin: Option<ChildStdin>,
    out: std::path::PathBuf,
}

impl Console {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Console {
        let out = dir.join(format!("{name}.out"));
        let mut child = Command::new(exe())
            .arg("cluster")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(dir.join(format!("{name}.out.err"))).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        Console { child, stdin, out }
    }

    /// Everything it printed so far (stdout, then stderr).
    fn printed(&self) -> String {
        let err = self.out.with_extension("out.err");
        std::fs::read_to_string(&self.out).unwrap_or_default()
            + &std::fs::read_to_string(err).unwrap_or_default()
    }

    fn wait_printed(&self, what: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.printed();
            if text.contains(what) {
                return text;
            }
            assert!(Instant::now() < deadline, "never printed {what:?}:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Ctrl-C, and its exit code.
    fn interrupt(mut self) -> (Option<i32>, String) {
        // SAFETY: signalling a child process we spawned and still own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let code = wait(&mut self.child, 20);
        (code, self.printed())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if self.child.try_wait().unwrap().is_none() {
            // SAFETY: as above; a console that is still running is stopped with its nodes.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
            let _ = wait(&mut self.child, 20);
        }
    }
}

fn wait(child: &mut Child, secs: u64) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// The banner's `n`th curl example (from 0), run as a user runs it: read flag by flag (only the
/// flags the banner uses: an unknown one fails the test) and sent the same way, and also by curl
/// itself through `sh` when curl is installed. Returns what each printed: the response body.
fn run_banner_example(printed: &str, n: usize) -> Vec<String> {
    let line = printed
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("curl "))
        .nth(n)
        .unwrap_or_else(|| panic!("no curl example {n} in the banner:\n{printed}"));
    eprintln!("banner example: {line}");
    let words: Vec<&str> = line.split_whitespace().collect();
    let (mut method, mut body, mut follow, mut url) = ("GET", Vec::new(), false, "");
    let mut i = 1;
    while i < words.len() {
        match words[i] {
            "-s" => {}
            "-sL" => follow = true,
            "-X" => (method, i) = (words[i + 1], i + 1),
            "--data-binary" => (body, i) = (words[i + 1].trim_matches('\'').into(), i + 1),
            w if w.trim_matches('\'').starts_with("http://") => url = w.trim_matches('\''),
            w => panic!("the banner uses {w:?}, which this test does not read: {line}"),
        }
        i += 1;
    }
    let (authority, path) = url["http://".len()..].split_once('/').unwrap();
    let port: u16 = authority.rsplit_once(':').unwrap().1.parse().unwrap();
    let path = format!("/{path}");
    let answer = match follow {
        true => http_follow(port, method, &path, &body),
        false => crate::cluster::http(port, method, &path, &body),
    };
    let mut printed = vec![answer.unwrap_or_else(|| panic!("no answer to {line}")).1];
    if Command::new("curl").arg("--version").output().is_ok() {
        let out = Command::new("sh").args(["-c", line]).output().unwrap();
        assert!(out.status.success(), "{line}: {out:?}");
        printed.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    printed
}

fn leader(base: u16) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for id in 1..=3u64 {
            if status(base + 1000 + id as u16)
                .is_some_and(|s| s["role"] == "leader" && s["lease"]["state"] != "expired")
            {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kv_cluster_keeps_its_data_reports_a_dead_node_restarts_it_and_explains_a_port_in_use() {
    let _serial = crate::cluster::serial();
    let (base, _ports) = crate::ports::reserve_base(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv-data");
    let (dir_s, base_s) = (dir.display().to_string(), base.to_string());
    let mut first = Console::start(
        tmp.path(),
        "first",
        &["--data-dir", &dir_s, "--base-port", &base_s],
    );
    first.wait_printed("Ctrl-C stops every node", 30);
    let node1 = base + 1001;
    let l = leader(base);
    if l == 1 {
        // The banner's examples go to node 1: make sure they are redirected.
        let token = std::fs::read_to_string(dir.join("admin.token")).unwrap();
        let auth = format!("Bearer {token}");
        let body = b"{\"to\": 2}";
        crate::cluster::http_with(
            node1,
            "POST",
            "/admin/transfer",
            body,
            &[("Authorization", &auth)],
        )
        .unwrap();
        while leader(base) == 1 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The banner's first examples, exactly as printed (they name node 1, which does not lead now).
    let banner = first.printed();
    for out in run_banner_example(&banner, 0) {
        assert!(json(&out)["revision"].as_u64().is_some(), "{out}");
    }
    for (n, mode) in [(1, "lease"), (2, "index")] {
        for out in run_banner_example(&banner, n) {
            let v = json(&out);
            assert_eq!(
                (v["value"].as_str(), v["read"].as_str()),
                (Some("hello"), Some(mode)),
                "{out}"
            );
        }
    }
    // kill -9 one follower: reported, with the restart command; the others keep serving.
    let victim: u16 = (1..=3u16)
        .find(|&i| i != 1 && u64::from(i) != leader(base))
        .unwrap();
    let pid = status(base + 1000 + victim).unwrap()["pid"]
        .as_u64()
        .unwrap();
    // SAFETY: a node process the console under test started for us.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let text = first.wait_printed(&format!("node {victim} exited"), 10);
    assert!(
        text.contains(&format!("`restart {victim}`"))
            && text.contains(&format!(" node --id {victim} ")),
        "{text}"
    );
    assert_eq!(
        http_follow(node1, "PUT", "/kv/during", b"outage")
            .unwrap()
            .0,
        200,
        "the others keep serving"
    );
    first.type_line(&format!("restart {victim}"));
    first.wait_printed(&format!("node {victim} restarted"), 10);
    let deadline = Instant::now() + Duration::from_secs(15);
    while status(base + 1000 + victim).is_none() {
        assert!(Instant::now() < deadline, "node {victim} did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A second cluster on the same ports: the real error, and a hint.
    let mut second = Console::start(tmp.path(), "second", &["--temp", "--base-port", &base_s]);
    let code = wait(&mut second.child, 30);
    let text = second.printed();
    assert!(
        code == Some(1) && text.contains("Address already in use") && text.contains("--base-port"),
        "{code:?}\n{text}"
    );
    // --temp: a throwaway data dir, removed on exit.
    let temp = text
        .lines()
        .find_map(|l| {
            l.split_once(", data in ")
                .map(|(_, d)| d.trim().to_string())
        })
        .expect("the banner names the data dir");
    assert!(
        text.contains(&format!("removed {temp}")) && !Path::new(&temp).exists(),
        "{temp} kept:\n{text}"
    );
    // Ports past 65535 are refused before anything starts.
    let out = Command::new(exe())
        .args(["cluster", "--temp", "--base-port", "65000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && err.contains("65535"),
        "{err}"
    );
    // Ctrl-C keeps the data; the same command restarts the cluster with it.
    let (code, text) = first.interrupt();
    assert!(
        code == Some(0) && text.contains("data kept in"),
        "{code:?}\n{text}"
    );
    let again = Console::start(tmp.path(), "again", &["--data-dir", &dir_s]);
    again.wait_printed("Ctrl-C stops every node", 30);
    leader(base);
    for (k, v) in [("greeting", "hello"), ("during", "outage")] {
        let (code, body) = http_follow(node1, "GET", &format!("/kv/{k}?read=index"), b"").unwrap();
        assert_eq!(
            (code, json(&body)["value"].as_str()),
            (200, Some(v)),
            "{k} after a restart: {body}"
        );
    }
    let out = Command::new(exe())
        .args(["cluster", "--data-dir", &dir_s, "--nodes", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && err.contains("holds a cluster of 3 nodes"),
        "{err}"
    );
    let (code, _) = again.interrupt();
    assert_eq!(code, Some(0));
}
