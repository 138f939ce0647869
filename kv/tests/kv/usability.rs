//! What a user meets first: one error shape on every route (malformed HTTP included), unlock,
//! `--version`, duplicate peer ids refused, host names in `--peers`, Prometheus names, and a
//! clean shutdown (a read still waiting gets 503, not a timeout).

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{error_code, exe, http, http_with, json, metric, put, read_response, Cluster};

fn one_node(args: &[&str]) -> Cluster {
    let c = Cluster::start(1, args);
    c.leader(&[1], 15);
    c
}

/// A raw request on a fresh connection; (status, body).
fn raw(port: u16, bytes: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let (code, body) = read_response(&mut s).expect("an answer");
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn every_error_has_one_shape_on_every_route_malformed_http_included() {
    let c = one_node(&[]);
    let p = c.port(1);
    let session = loop {
        let (code, body) = http(p, "POST", "/session", b"{\"ttl_ms\": 60000}").unwrap();
        if code == 200 {
            break json(&body)["id"].as_u64().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50)); // not_ready just after election
    };
    let lock = format!("/lock/L?session={session}");
    let big = vec![b'x'; (1 << 20) + 1];
    let cases: Vec<(&str, String, Vec<u8>, u16, &str)> = vec![
        ("GET", "/nope".into(), vec![], 404, "not_found"),
        ("GET", "/kv/missing".into(), vec![], 404, "not_found"),
        ("DELETE", "/kv/missing".into(), vec![], 404, "not_found"),
        ("PATCH", "/kv/k".into(), vec![], 405, "method_not_allowed"),
        ("PUT", "/kv/%FF".into(), b"v".to_vec(), 400, "bad_key"),
        (
            "PUT",
            format!("/kv/{}", "k".repeat(1025)),
            b"v".to_vec(),
            400,
            "key_too_long",
        ),
        ("PUT", "/kv/big".into(), big, 413, "too_large"),
        (
            "PUT",
            "/kv/k?session=x".into(),
            b"v".to_vec(),
            400,
            "bad_session",
        ),
        (
            "PUT",
            "/kv/k?fence=nocolon".into(),
            b"v".to_vec(),
            400,
            "bad_fence",
        ),
        (
            "PUT",
            "/kv/k?fence=nolock:5".into(),
            b"v".to_vec(),
            409,
            "lock_not_held",
        ),
        (
            "GET",
            "/kv/k?read=fast".into(),
            vec![],
            400,
            "bad_read_mode",
        ),
        ("GET", "/kv/k?x=%ZZ".into(), vec![], 400, "bad_query"),
        (
            "POST",
            "/session".into(),
            b"{not json".to_vec(),
            400,
            "bad_json",
        ),
        (
            "POST",
            "/session".into(),
            b"{\"ttl_ms\": 0}".to_vec(),
            400,
            "bad_ttl",
        ),
        ("GET", "/session".into(), vec![], 405, "method_not_allowed"),
        ("DELETE", "/session/abc".into(), vec![], 400, "bad_session"),
        (
            "DELETE",
            "/session/99".into(),
            vec![],
            404,
            "unknown_session",
        ),
        ("POST", "/lock/L".into(), vec![], 400, "bad_lock"),
        (
            "POST",
            "/lock/L?session=99".into(),
            vec![],
            404,
            "unknown_session",
        ),
        (
            "DELETE",
            "/lock/L?session=99".into(),
            vec![],
            409,
            "lock_not_held",
        ),
        (
            "POST",
            "/admin/heal".into(),
            vec![],
            404,
            "fault_injection_disabled",
        ),
        (
            "GET",
            "/admin/members".into(),
            vec![],
            405,
            "method_not_allowed",
        ),
        (
            "POST",
            "/admin/members".into(),
            b"{\"changes\": []}".to_vec(),
            400,
            "bad_change",
        ),
        (
            "POST",
            "/admin/members".into(),
            b"{\"changes\": [{\"op\": \"x\"}]}".to_vec(),
            400,
            "bad_change",
        ),
        ("POST", "/admin/nope".into(), vec![], 404, "not_found"),
    ];
    assert_eq!(http(p, "POST", &lock, b"").unwrap().0, 200);
    for (method, path, body, want, code) in &cases {
        let (got, answer) = http(p, method, path, body).unwrap();
        assert_eq!(
            (got, error_code(&answer).as_str()),
            (*want, *code),
            "{method} {path}: {answer}"
        );
    }
    let no_token = http_with(p, "POST", "/admin/members", b"{}", &[]).unwrap();
    assert_eq!(
        (
            no_token.0,
            error_code(&String::from_utf8_lossy(&no_token.1))
        ),
        (401, "unauthorized".into())
    );
    // Malformed HTTP, answered by hyper itself: the same shape.
    let malformed: [(&[u8], u16, &str); 3] = [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
        (
            b"GET /status HTTP/1.1\r\nBad Header\r\n\r\n",
            400,
            "bad_request",
        ),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400, "bad_request"),
    ];
    for (bytes, want, code) in malformed {
        let (got, body) = raw(p, bytes);
        assert_eq!(
            (got, error_code(&body).as_str()),
            (want, code),
            "{:?}: {body}",
            String::from_utf8_lossy(bytes)
        );
    }
    let mut head = b"GET /status HTTP/1.1\r\nX-Big: ".to_vec();
    head.extend(vec![b'a'; 64 << 10]);
    head.extend(b"\r\n\r\n");
    let (got, body) = raw(p, &head);
    assert_eq!(
        (got, error_code(&body).as_str()),
        (431, "header_too_large"),
        "{body}"
    );
    put(p, "after", "served");
}

/// The `allow` header of a raw response head.
fn allow_header(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let l = l.to_ascii_lowercase();
        l.strip_prefix("allow:").map(|v| v.trim().to_string())
    })
}

#[test]
fn wrong_methods_bad_json_and_bad_queries_are_named_and_a_follower_shows_it_holds_no_lease() {
    let c = Cluster::start(3, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    let (p, f) = (c.port(l), crate::cluster::others(l)[0]);
    // A wrong method on a read-only route: 405 with Allow, as on /kv.
    for path in ["/status", "/metrics", "/members"] {
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let (code, head, body) = crate::cluster::http_raw(p, method, path, b"", &[]).unwrap();
            let body = String::from_utf8_lossy(&body);
            assert_eq!(
                (
                    code,
                    error_code(&body).as_str(),
                    allow_header(&head).as_deref()
                ),
                (405, "method_not_allowed", Some("get")),
                "{method} {path}: {head}\n{body}"
            );
        }
    }
    // A body that is not JSON, on every JSON route: 400 bad_json that says so.
    for path in [
        "/session",
        "/session/keepalive",
        "/admin/members",
        "/admin/transfer",
    ] {
        let (code, body) = http(p, "POST", path, b"{bad").unwrap();
        assert_eq!(
            (code, error_code(&body).as_str()),
            (400, "bad_json"),
            "{path}: {body}"
        );
        let detail = json(&body)["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains("not valid JSON") && detail.contains("expected"),
            "{detail}"
        );
    }
    // A parameter given twice, or one the route does not take: 400 bad_query naming it.
    let queries = [
        ("GET", "/kv/k?read=lease&read=index", "read"),
        ("GET", "/kv/k?raed=lease", "raed"),
        ("PUT", "/kv/k?bogus=1", "bogus"),
        ("PUT", "/kv/k?session=1&session=2", "session"),
        ("DELETE", "/kv/k?read=index", "read"),
        ("GET", "/status?verbose=1", "verbose"),
        ("GET", "/members?x", "x"),
        ("POST", "/lock/L?session=1&token=2", "token"),
        ("POST", "/session?ttl_ms=5", "ttl_ms"),
        ("POST", "/admin/transfer?to=2", "to"),
    ];
    for (method, path, param) in queries {
        for port in [p, c.port(f)] {
            let (code, body) = http(port, method, path, b"{\"to\": 2}").unwrap();
            assert_eq!(
                (
                    code,
                    error_code(&body).as_str(),
                    json(&body)["parameter"].as_str()
                ),
                (400, "bad_query", Some(param)),
                "{method} {path} on port {port}: {body}"
            );
        }
    }
    let (code, body) = http(p, "GET", "/kv/k?read=index", b"").unwrap();
    assert_eq!(
        (code, error_code(&body).as_str()),
        (404, "not_found"),
        "{body}"
    );
    // Only the leader holds a lease: a follower says so rather than "expired".
    let leader = crate::cluster::status(p).unwrap();
    assert!(
        ["valid", "suspect"].contains(&leader["lease"]["state"].as_str().unwrap()),
        "{leader}"
    );
    let follower = crate::cluster::status(c.port(f)).unwrap();
    assert_eq!(follower["lease"]["state"], "not_leader", "{follower}");
}

#[test]
fn unlock_version_duplicate_peers_host_names_and_prometheus_names() {
    let c = one_node(&[]);
    let p = c.port(1);
    // DELETE /lock/<name>?session=S unlocks; another session then takes it with a larger token.
    let grant = || loop {
        let (code, body) = http(p, "POST", "/session", b"{\"ttl_ms\": 60000}").unwrap();
        if code == 200 {
            return json(&body)["id"].as_u64().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (a, b) = (grant(), grant());
    let (code, body) = http(p, "POST", &format!("/lock/L?session={a}"), b"").unwrap();
    let token = json(&body)["token"].as_u64().unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        http(p, "POST", &format!("/lock/L?session={b}"), b"")
            .unwrap()
            .0,
        409
    );
    let (code, body) = http(p, "DELETE", &format!("/lock/L?session={b}"), b"").unwrap();
    assert_eq!(
        (code, error_code(&body).as_str()),
        (409, "lock_not_held"),
        "only the holder unlocks"
    );
    let wrong = format!("/lock/L?session={a}&token={}", token + 1);
    let (code, body) = http(p, "DELETE", &wrong, b"").unwrap();
    assert_eq!(
        (code, error_code(&body).as_str()),
        (409, "lock_not_held"),
        "a token never issued"
    );
    let (code, body) = http(
        p,
        "DELETE",
        &format!("/lock/L?session={a}&token={token}"),
        b"",
    )
    .unwrap();
    assert_eq!(
        (code, json(&body)["unlocked"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (code, _) = http(
        p,
        "DELETE",
        &format!("/lock/L?session={a}&token={token}"),
        b"",
    )
    .unwrap();
    assert_eq!(
        code, 409,
        "an unlock delivered twice frees nothing the second time"
    );
    assert_eq!(
        http(p, "POST", &format!("/lock/L?session={a}"), b"")
            .unwrap()
            .0,
        200
    );
    let (code, body) = http(p, "DELETE", &format!("/lock/L?session={a}"), b"").unwrap();
    assert_eq!(
        (code, json(&body)["unlocked"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    let (code, body) = http(p, "POST", &format!("/lock/L?session={b}"), b"").unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(json(&body)["token"].as_u64().unwrap() > token);
    // Prometheus: times in seconds, counters in _total, latency histograms.
    assert_eq!(http(p, "GET", "/kv/L?read=lease", b"").unwrap().0, 404);
    let (_, text) = http(p, "GET", "/metrics", b"").unwrap();
    for name in [
        "raft_lease_remaining_seconds{",
        "kv_read_duration_seconds_bucket{node=\"1\",read=\"lease\",le=",
        "kv_read_duration_seconds_count{node=\"1\",read=\"index\"}",
        "kv_write_duration_seconds_bucket{",
        "kv_proposals_per_batch_count{",
    ] {
        assert!(text.contains(name), "no {name} in /metrics");
    }
    for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
        let (name, kind) = line[7..].split_once(' ').unwrap();
        assert!(!name.ends_with("_ms"), "{line}");
        assert!(kind != "counter" || name.ends_with("_total"), "{line}");
    }
    assert!(metric(p, "kv_write_duration_seconds_count") >= 4);
    // --version.
    let out = Command::new(exe()).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(env!("CARGO_PKG_VERSION")),
        "{text}"
    );
    // Duplicate ids in --peers are refused.
    let out = Command::new(exe())
        .args([
            "node",
            "--id",
            "1",
            "--cluster-id",
            "x",
            "--insecure-peers",
            "--http",
            "127.0.0.1:1",
        ])
        .args(["--peers", "1=127.0.0.1:1,1=127.0.0.1:2", "--data-dir"])
        .arg(c.data.join("unused"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2) && err.contains("given twice"),
        "{err}"
    );
    drop(c);
    host_names_in_peers();
}

/// A node whose --peers and --peer-http name hosts, not addresses.
fn host_names_in_peers() {
    let c = Cluster::prepare(1, &["--insecure-peers"]);
    let peers = format!("1=localhost:{}", c.peer_port(1));
    let peer_http = format!("1=localhost:{}", c.port(1));
    let mut child = Command::new(exe())
        .args([
            "node",
            "--id",
            "1",
            "--cluster-id",
            "hosts",
            "--insecure-peers",
            "--peers",
            &peers,
        ])
        .args([
            "--peer-http",
            &peer_http,
            "--http",
            &format!("127.0.0.1:{}", c.port(1)),
        ])
        .arg("--data-dir")
        .arg(c.data.join("node1"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(c.log_path(1)).unwrap())
        .spawn()
        .unwrap();
    let up = (|| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if http(c.port(1), "PUT", "/kv/k", b"v").is_some_and(|(code, _)| code == 200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    })();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        up,
        "a node with host names in --peers never served:\n{}",
        c.log_tail()
    );
}

#[test]
fn a_read_waiting_at_shutdown_gets_503_and_the_node_exits_promptly() {
    // Followers stopped: a ReadIndex read on the leader waits for a quorum that never answers.
    let mut c = Cluster::start(3, &["--election-ms", "3000", "--heartbeat-ms", "100"]);
    let l = c.leader(&[1, 2, 3], 20);
    put(c.port(l), "k", "v");
    for f in crate::cluster::others(l) {
        c.signal(f, libc::SIGSTOP);
    }
    let rounds = metric(c.port(l), "raft_lease_index_rounds_total");
    let mut s = TcpStream::connect(("127.0.0.1", c.port(l))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /kv/k?read=index HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    // The read is waiting on the raft thread once its ReadIndex round has been issued.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(c.port(l), "raft_lease_index_rounds_total") == rounds {
        assert!(
            Instant::now() < deadline,
            "the read never reached the raft thread"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    c.signal(l, libc::SIGTERM);
    let answer = read_response(&mut s)
        .map(|(code, body)| (code, String::from_utf8_lossy(&body).into_owned()));
    let exit = c.wait_exit(l, 10);
    eprintln!("answer {answer:?} after {:?}; exit {exit}", t.elapsed());
    let (code, body) = answer.expect("an answer, not a dropped connection");
    assert_eq!(
        (code, error_code(&body).as_str()),
        (503, "shutting_down"),
        "{body}"
    );
    assert!(exit.success(), "{exit}");
    for f in crate::cluster::others(l) {
        c.signal(f, libc::SIGCONT);
    }
}

/// `kv SUB --help`'s flags (`--help` aside), each with its default if it has one.
fn flags_of(sub: &str) -> Vec<(String, Option<String>)> {
    let out = Command::new(exe()).args([sub, "--help"]).output().unwrap();
    assert!(out.status.success(), "kv {sub} --help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let words = line.trim_start().trim_start_matches("-h, ");
        if let Some(name) = words.strip_prefix("--").filter(|_| line.starts_with("  ")) {
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.push((format!("--{name}"), None));
        }
        if let (Some((_, d)), Some(last)) = (line.split_once("[default: "), flags.last_mut()) {
            last.1 = Some(d.split(']').next().unwrap().to_string());
        }
    }
    flags.retain(|(f, _)| f != "--help");
    assert!(flags.len() >= 3, "kv {sub} --help lists no flags:\n{help}");
    flags
}

/// The documented command line for `kv SUB` (docs/kv.md), with its continuation lines.
fn readme_command(section: &str, sub: &str) -> String {
    let start = format!("--bin kv -- {sub} ");
    let mut lines = section.lines().skip_while(|l| !l.contains(&start));
    let mut text = String::new();
    for line in lines.by_ref() {
        text.push_str(line);
        text.push('\n');
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    assert!(
        !text.is_empty(),
        "docs/kv.md has no `kv {sub}` command line"
    );
    text
}

#[test]
fn the_documented_command_lines_name_every_flag_with_its_default() {
    let readme = include_str!("../../../docs/kv.md");
    let section = readme
        .split_once("## Commands")
        .and_then(|(_, rest)| rest.split("\n## ").next())
        .expect("docs/kv.md's Commands section");
    assert!(section.contains("--bin kv -- --version"));
    for sub in ["node", "cluster", "bench", "certs"] {
        let line = readme_command(section, sub);
        for (flag, default) in flags_of(sub) {
            let start = line
                .match_indices(&flag)
                .map(|(i, _)| i)
                .find(|&i| {
                    let end = &line[i + flag.len()..];
                    !end.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                })
                .unwrap_or_else(|| panic!("docs/kv.md's `kv {sub}` leaves out {flag}:\n{line}"));
            // `[--flag VALUE]` shows the default (an upper-case VALUE is a placeholder).
            let shown = line[start + flag.len()..].split_whitespace().next();
            let shown = shown.unwrap_or("").trim_end_matches(']');
            let optional = line[..start].ends_with('[');
            if let Some(d) = default.filter(|_| optional && !shown.starts_with(char::is_uppercase))
            {
                assert_eq!(shown, d, "docs/kv.md's `kv {sub}` shows {flag} {shown}");
            }
        }
    }
}
