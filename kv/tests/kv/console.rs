//! `kv cluster` as a user runs it: the banner's examples, run as printed (by curl too when it is
//! installed), work whichever node leads, the admin one included (its token survives the
//! redirect); with `--http-cert` the banner prints `https://` URLs with `--cacert`; the data
//! persists across runs; a node killed with `kill -9` is reported with the command that restarts
//! it while the others keep serving, and `restart N` brings it back; `stop N` stops that node only
//! and says which still run; `status` shows each node's pid, role, leader and term; a second
//! console on the same dir is refused before its banner, and one on the same ports shows the real
//! error with a hint (and `--temp` removes its dir); ports that would overflow are refused, and so,
//! before the banner, is what a node would refuse at start.

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

/// The banner's curl examples, each on one line (a line ending in `\` continues on the next).
fn banner_examples(printed: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in printed.lines().map(str::trim) {
        if open {
            let last = out.last_mut().unwrap();
            last.push(' ');
            last.push_str(line);
        } else if line.starts_with("curl ") {
            out.push(line.to_string());
        } else {
            continue;
        }
        let last = out.last_mut().unwrap();
        open = last.ends_with('\\');
        if open {
            last.pop();
            *last = last.trim_end().to_string();
        }
    }
    out
}

/// A shell line's words: single and double quotes, and `$(cat FILE)` inside double quotes (all
/// the banner uses).
fn shell_words(line: &str) -> Vec<String> {
    let mut words: Vec<Option<String>> = vec![None];
    let mut quote = None;
    let mut rest = line;
    while let Some(ch) = rest.chars().next() {
        rest = &rest[ch.len_utf8()..];
        let word = words.last_mut().unwrap();
        match (quote, ch) {
            (None, ' ') if word.is_some() => words.push(None),
            (None, ' ') => {}
            (None, '\'' | '"') => {
                quote = Some(ch);
                word.get_or_insert_default();
            }
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '$') if rest.starts_with("(cat ") => {
                let (cmd, after) = rest[5..].split_once(')').unwrap();
                let path = shell_words(cmd).pop().unwrap();
                let text = std::fs::read_to_string(path).unwrap();
                word.get_or_insert_default().push_str(text.trim());
                rest = after;
            }
            (_, c) => word.get_or_insert_default().push(c),
        }
    }
    words.into_iter().flatten().collect()
}

/// What curl would send and whether it follows redirects (and keeps `Authorization` across a
/// change of port, as only `--location-trusted` does).
#[derive(Default)]
struct CurlLine {
    method: String,
    body: Vec<u8>,
    headers: Vec<(String, String)>,
    follow: bool,
    trusted: bool,
    url: String,
}

/// `line` read flag by flag: only the flags the banner uses (an unknown one fails the test).
fn parse_curl(line: &str) -> CurlLine {
    let words = shell_words(line);
    let mut c = CurlLine {
        method: "GET".into(),
        ..CurlLine::default()
    };
    let mut i = 1;
    while i < words.len() {
        let next = words.get(i + 1).cloned().unwrap_or_default();
        match words[i].as_str() {
            "-s" => {}
            "-sL" | "-L" => c.follow = true,
            "--location-trusted" => (c.follow, c.trusted) = (true, true),
            "-X" => (c.method, i) = (next, i + 1),
            "--data-binary" | "-d" => (c.body, i) = (next.into_bytes(), i + 1),
            "--cacert" => i += 1,
            "-H" => {
                let (k, v) = next.split_once(':').unwrap();
                c.headers.push((k.into(), v.trim().into()));
                i += 1;
            }
            w if w.starts_with("http") => c.url = w.to_string(),
            w => panic!("the banner uses {w:?}, which this test does not read: {line}"),
        }
        i += 1;
    }
    c
}

/// Send `c` as curl would over plain HTTP; (status, body).
fn send_as_curl(c: &CurlLine) -> Option<(u16, String)> {
    let (authority, path) = c.url["http://".len()..].split_once('/').unwrap();
    let first: u16 = authority.rsplit_once(':').unwrap().1.parse().unwrap();
    let (mut port, path) = (first, format!("/{path}"));
    for _ in 0..4 {
        let keep = |k: &str| c.trusted || port == first || !k.eq_ignore_ascii_case("authorization");
        let headers: Vec<(&str, &str)> = c
            .headers
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (code, head, body) =
            crate::cluster::http_raw(port, &c.method, &path, &c.body, &headers)?;
        let location = head.lines().find_map(|l| {
            let l = l.to_ascii_lowercase();
            l.strip_prefix("location:").map(|v| v.trim().to_string())
        });
        match location.and_then(|l| l.split(':').nth(2)?.split('/').next()?.parse().ok()) {
            Some(p) if c.follow && code == 307 => port = p,
            _ => return Some((code, String::from_utf8_lossy(&body).into_owned())),
        }
    }
    None
}

/// The banner's `n`th curl example (from 0), run as a user runs it: sent as curl would send it
/// (over plain HTTP), and also by curl itself through `sh` when curl is installed. Returns what
/// each printed: the response body.
fn run_banner_example(printed: &str, n: usize) -> Vec<String> {
    let line = banner_examples(printed)
        .get(n)
        .cloned()
        .unwrap_or_else(|| panic!("no curl example {n} in the banner:\n{printed}"));
    eprintln!("banner example: {line}");
    let c = parse_curl(&line);
    let mut printed = Vec::new();
    if c.url.starts_with("http://") {
        let answer = send_as_curl(&c);
        printed.push(answer.unwrap_or_else(|| panic!("no answer to {line}")).1);
    }
    if curl_installed() {
        printed.push(run_in_shell(&line));
    }
    printed
}

fn curl_installed() -> bool {
    Command::new("curl").arg("--version").output().is_ok()
}

/// `line` run by `sh`; what it printed (it must succeed).
fn run_in_shell(line: &str) -> String {
    let out = Command::new("sh").args(["-c", line]).output().unwrap();
    assert!(out.status.success(), "{line}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
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

/// The banner's examples go to node 1: make sure they are redirected (leadership moves to 2).
fn lead_elsewhere_than_node_1(base: u16, dir: &Path) {
    if leader(base) != 1 {
        return;
    }
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap();
    let auth = format!("Bearer {token}");
    let body = b"{\"to\": 2}";
    let node1 = base + 1001;
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
    lead_elsewhere_than_node_1(base, &dir);
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
    // The report is several lines: wait for its last, the restart command.
    let text = first.wait_printed(&format!(" node --id {victim} "), 10);
    assert!(
        text.contains(&format!("node {victim} exited"))
            && text.contains(&format!("`restart {victim}`"))
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
    let (code, _) = again.interrupt();
    assert_eq!(code, Some(0));
    let out = Command::new(exe())
        .args(["cluster", "--data-dir", &dir_s, "--nodes", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && err.contains("holds a cluster of 3 nodes"),
        "{err}"
    );
    // What a node would refuse at start is refused before the banner, and no node starts: a
    // number of groups the dirs were not made with, a `G` out of bounds.
    for (flags, says) in [
        (&["--groups", "4"][..], "holds 1 raft groups, not 4"),
        (&["--follower-leases-ms", "5"][..], "--follower-leases-ms 5"),
    ] {
        let out = Command::new(exe())
            .args(["cluster", "--data-dir", &dir_s])
            .args(flags)
            .output()
            .unwrap();
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {text}{err}");
        assert!(
            err.contains(says) && err.contains("node 1"),
            "{flags:?}: {err}"
        );
        assert!(
            !text.contains("curl"),
            "{flags:?}: a banner was printed: {text}"
        );
        assert!(status(node1).is_none(), "{flags:?}: a node started");
    }
}

/// Type `status`; the lines it prints (one per node).
fn status_lines(console: &mut Console, nodes: u64) -> Vec<String> {
    let before = console.printed().matches(": running, pid ").count()
        + console.printed().matches(": stopped").count();
    console.type_line("status");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = console.printed();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains(": running, pid ") || l.ends_with(": stopped"))
            .map(str::to_string)
            .collect();
        if lines.len() >= before + nodes as usize {
            return lines[before..before + nodes as usize].to_vec();
        }
        assert!(Instant::now() < deadline, "no status:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_console_stops_one_node_says_which_run_shows_each_nodes_role_and_a_second_console_is_refused()
{
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
    lead_elsewhere_than_node_1(base, &dir);
    // The banner's admin example, as printed, sent to node 1, which does not lead: the token
    // survives the redirect. (With -L instead of --location-trusted curl drops it: unauthorized.)
    let banner = first.printed();
    let admin = banner_examples(&banner).len() - 1;
    for out in run_banner_example(&banner, admin) {
        assert_eq!(json(&out)["transfer_to"], 2, "{out}");
    }
    if curl_installed() {
        let line = &banner_examples(&banner)[admin];
        let dropped = run_in_shell(&line.replace("--location-trusted", "-L"));
        assert!(dropped.contains("unauthorized"), "{dropped}");
    }
    // `status`: every node's pid, role, the leader it knows and its term, from its /status.
    let l = leader(base);
    for (i, line) in status_lines(&mut first, 3).iter().enumerate() {
        let id = i as u16 + 1;
        let s = status(base + 1000 + id).unwrap();
        let pid = format!("node {id}: running, pid {},", s["pid"]);
        assert!(line.starts_with(&pid), "{line} (want {pid})");
        let role = if u64::from(id) == l {
            "leader, term ".to_string()
        } else {
            format!("follower, leader node {l} (last heard ")
        };
        assert!(line.contains(&role), "{line} (want {role}; leader {l})");
    }
    // `stop 2` stops node 2 only, and says so.
    first.type_line("stop 2");
    let text = first.wait_printed("node 2 stopped", 15);
    assert!(
        text.contains("running: node 1, 3") && !text.contains("all nodes stopped"),
        "{text}"
    );
    assert!(status(base + 1002).is_none(), "node 2 still answers");
    assert!(
        status(base + 1001).is_some() && status(base + 1003).is_some(),
        "{text}"
    );
    let lines = status_lines(&mut first, 3);
    assert_eq!(lines[1], "node 2: stopped", "{lines:?}");
    // A second console on the same dir is refused before it starts or prints anything else.
    let mut second = Console::start(tmp.path(), "second", &["--data-dir", &dir_s]);
    let code = wait(&mut second.child, 30);
    let text = second.printed();
    assert!(
        code == Some(3)
            && text.contains("another `kv cluster`")
            && text.contains(&format!("pid {}", first.child.id()))
            && !text.contains("Try (")
            && !text.contains("node 1: http"),
        "{code:?}\n{text}"
    );
    assert!(
        status(base + 1001).is_some(),
        "the first console's nodes keep running"
    );
    let (code, text) = first.interrupt();
    assert!(
        code == Some(0) && text.contains("all nodes stopped"),
        "{code:?}\n{text}"
    );
}

#[test]
fn with_https_the_banner_prints_https_urls_that_trust_the_cluster_ca() {
    let _serial = crate::cluster::serial();
    let (base, _ports) = crate::ports::reserve_base(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv-data");
    let tls = dir.join("tls");
    crate::cluster::make_certs(&tls, &[1, 2, 3]); // with an HTTPS certificate for 127.0.0.1
    let (cert, key) = (tls.join("http.pem"), tls.join("http.key"));
    let args = [
        "--data-dir",
        &dir.display().to_string(),
        "--base-port",
        &base.to_string(),
        "--",
        "--http-cert",
        &cert.display().to_string(),
        "--http-key",
        &key.display().to_string(),
    ]
    .map(str::to_string);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut console = Console::start(tmp.path(), "https", &args);
    let banner = console.wait_printed("Ctrl-C stops every node", 30);
    assert!(!banner.contains("http://"), "{banner}");
    for id in 1..=3 {
        let url = format!("node {id}: https://127.0.0.1:{}", base + 1000 + id);
        assert!(banner.contains(&url), "{banner}");
    }
    let cacert = format!("curl --cacert {} ", tls.join("ca.pem").display());
    let examples = banner_examples(&banner);
    assert_eq!(examples.len(), 7, "{banner}");
    for line in &examples {
        assert!(
            line.starts_with(&cacert) && line.contains("https://127.0.0.1:"),
            "{line}"
        );
    }
    // The console reads each node's /status over HTTPS too; once one leads, the examples work.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status_lines(&mut console, 3)
        .iter()
        .any(|l| l.contains(", leader, term "))
    {
        assert!(
            Instant::now() < deadline,
            "no leader:\n{}",
            console.printed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    if curl_installed() {
        let out = run_banner_example(&banner, 0).pop().unwrap();
        assert!(json(&out)["revision"].as_u64().is_some(), "{out}");
        let out = run_banner_example(&banner, 3).pop().unwrap();
        assert!(json(&out)["role"].is_string(), "{out}");
    }
    let (code, _) = console.interrupt();
    assert_eq!(code, Some(0));
}

/// CPU time (user and system) of process `pid` so far, in clock ticks (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields of the line, 12th and 13th after `)`.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `kv cluster` run with its stdin closed (`&`, `nohup`, `</dev/null`, CI) keeps supervising
/// without spinning: over two seconds its own process uses far less than a core (a loop that
/// took the closed console for a quiet one used all of it), and it still stops on Ctrl-C.
#[test]
fn a_console_whose_stdin_is_closed_does_not_spin() {
    let _serial = crate::cluster::serial();
    let (base, _ports) = crate::ports::reserve_base(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv-data");
    let (dir_s, base_s) = (dir.display().to_string(), base.to_string());
    let mut c = Console::start(
        tmp.path(),
        "closed",
        &["--data-dir", &dir_s, "--base-port", &base_s],
    );
    c.wait_printed("Ctrl-C stops every node", 30);
    c.stdin = None; // closes the console's stdin
    std::thread::sleep(Duration::from_millis(300));
    let pid = c.child.id();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        used < hz / 2,
        "the console used {used} ticks of CPU in 2 s ({hz} a second) with stdin closed"
    );
    let (code, printed) = c.interrupt();
    assert_eq!(code, Some(0), "{printed}");
}
