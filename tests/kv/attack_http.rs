//! The HTTP front end under floods of idle connections, slow bodies and huge headers, and the
//! peer port under huge length prefixes: the node keeps serving others, and its memory stays
//! bounded (peak RSS from /proc, with a generous bound; no timing is asserted).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::cluster::{http, json, metric, put, rss_kib, Cluster};

/// Let this test process open `n` sockets.
fn raise_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit on this process with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(n.max(lim.rlim_cur));
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn one_node(args: &[&str]) -> Cluster {
    let c = Cluster::start(1, args);
    c.leader(&[1], 15);
    c
}

/// A GET answered 200, and how long it took (reported, never asserted).
fn timed_get(port: u16, path: &str) -> Duration {
    let t = Instant::now();
    let (code, body) = http(port, "GET", path, b"").expect("an answer");
    assert_eq!(code, 200, "{body}");
    t.elapsed()
}

#[test]
fn idle_connection_flood_never_stops_the_node_serving() {
    raise_open_files(4096);
    let c = one_node(&[]);
    let p = c.port(1);
    put(p, "k", "v");
    let (rss0, _) = rss_kib(c.pid(1));
    // More idle connections than --http-max-connections (default 512).
    let idle: Vec<TcpStream> = (0..700)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", p)).ok())
        .collect();
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        slowest = slowest.max(timed_get(p, "/kv/k?read=lease"));
    }
    put(p, "during", "flood");
    let evicted = metric(p, "kv_http_evicted_total");
    let (rss1, _) = rss_kib(c.pid(1));
    eprintln!(
        "{} idle connections: 20 GETs served, slowest {slowest:?}; {evicted} idle evicted; RSS {rss0} -> {rss1} KiB",
        idle.len()
    );
    assert!(idle.len() > 512, "the test could open only {}", idle.len());
    assert!(evicted > 0, "the table never filled");
    drop(idle);
    // It recovers by itself: the closed connections leave the table.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(p, "kv_http_connections") > 2 {
        assert!(
            Instant::now() < deadline,
            "closed connections stayed in the table"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        rss1 < rss0 + 64 * 1024,
        "RSS grew by more than 64 MiB: {rss0} -> {rss1} KiB"
    );
}

#[test]
fn slow_bodies_hold_no_worker_and_time_out() {
    let c = one_node(&["--http-body-timeout-ms", "2000"]);
    let p = c.port(1);
    put(p, "k", "v");
    let mut slow: Vec<TcpStream> = (0..16)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
            let head =
                format!("PUT /kv/slow{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
            s.write_all(head.as_bytes()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        })
        .collect();
    // One byte per connection every 100 ms while normal clients are served.
    let mut served = Vec::new();
    for _ in 0..5 {
        for s in &mut slow {
            let _ = s.write_all(b"x");
        }
        served.push(timed_get(p, "/kv/k?read=lease"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let codes: Vec<Option<u16>> = slow
        .iter_mut()
        .map(|s| crate::cluster::read_response(s).map(|(code, _)| code))
        .collect();
    eprintln!("16 slow bodies: GETs meanwhile {served:?}; slow PUTs answered {codes:?}");
    assert!(codes.iter().all(|c| *c == Some(408)), "{codes:?}");
    let (code, _) = http(p, "GET", "/kv/slow0?read=lease", b"").unwrap();
    assert_eq!(code, 404, "a timed-out body was written");
}

/// Peak RSS growth (KiB) of node 1 while `attack` runs.
fn peak_growth(c: &Cluster, attack: impl FnOnce()) -> (u64, u64) {
    let (_, hwm0) = rss_kib(c.pid(1));
    attack();
    let (_, hwm1) = rss_kib(c.pid(1));
    (hwm0, hwm1)
}

#[test]
fn a_huge_header_is_refused_without_growing_memory() {
    let c = one_node(&[]);
    let p = c.port(1);
    let mut code = None;
    let (hwm0, hwm1) = peak_growth(&c, || {
        let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Big: ")
            .unwrap();
        let chunk = vec![b'a'; 1 << 20];
        let sent = (0..300).take_while(|_| s.write_all(&chunk).is_ok()).count();
        code = crate::cluster::read_response(&mut s).map(|(c, _)| c);
        eprintln!("300 MiB header: {sent} MiB written before the node closed; answered {code:?}");
    });
    eprintln!("peak RSS {hwm0} -> {hwm1} KiB");
    assert!(matches!(code, Some(431) | None), "{code:?}");
    assert!(hwm1 < hwm0 + 32 * 1024, "peak RSS grew by more than 32 MiB");
    put(p, "after", "served");
}

fn length_prefix_flood(insecure: bool) {
    let args: &[&str] = if insecure { &["--insecure-peers"] } else { &[] };
    let c = one_node(args);
    let (hwm0, hwm1) = peak_growth(&c, || {
        let conns: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(("127.0.0.1", c.peer_port(1))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
                let _ = s.write_all(&[0x10, 0, 0, 0, 1]); // a 256 MiB frame, final
                let _ = s.write_all(&vec![0u8; 1 << 20]);
                s
            })
            .collect();
        for mut s in conns {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf); // the node closes it
        }
    });
    let counted = if insecure {
        metric(c.port(1), "kv_peer_bad_frames_total")
    } else {
        metric(c.port(1), "kv_peer_tls_failures_total")
    };
    eprintln!("insecure {insecure}: 8 × 256 MiB length prefixes: peak RSS {hwm0} -> {hwm1} KiB; {counted} refused");
    assert!(counted >= 8, "{counted}");
    assert!(hwm1 < hwm0 + 32 * 1024, "peak RSS grew by more than 32 MiB");
    put(c.port(1), "after", "served");
}

#[test]
fn huge_peer_length_prefixes_are_refused_before_allocating() {
    length_prefix_flood(false); // not even read: the TLS handshake fails
    length_prefix_flood(true); // read, and refused on the prefix alone
}

#[test]
fn non_utf8_keys_are_refused_and_binary_values_round_trip() {
    let c = one_node(&[]);
    let p = c.port(1);
    assert_eq!(http(p, "PUT", "/kv/%FF", b"v").unwrap().0, 400);
    assert_eq!(
        http(p, "GET", "/kv/%FE", b"").unwrap().0,
        400,
        "no aliasing"
    );
    assert_eq!(http(p, "GET", "/kv/%G1", b"").unwrap().0, 400);
    assert_eq!(http(p, "POST", "/lock/%FF?session=1", b"").unwrap().0, 400);
    let long = "l".repeat(1025);
    assert_eq!(
        http(p, "POST", &format!("/lock/{long}?session=1"), b"")
            .unwrap()
            .0,
        400
    );
    let value = [0u8, 0xff, 1, 2, 0xc3];
    assert_eq!(http(p, "PUT", "/kv/caf%C3%A9", &value).unwrap().0, 200);
    let raw = [("Accept", "application/octet-stream")];
    let (code, body) = crate::cluster::http_with(p, "GET", "/kv/caf%C3%A9", b"", &raw).unwrap();
    assert_eq!((code, body.as_slice()), (200, &value[..]));
    let (code, body) = http(p, "GET", "/kv/caf%C3%A9?read=index", b"").unwrap();
    let v = json(&body);
    assert_eq!(code, 200);
    assert_eq!(
        (v["key"].as_str(), v["value_base64"].as_str()),
        (Some("café"), Some("AP8BAsM="))
    );
    assert!(v.get("value").is_none());
}

#[test]
fn a_fence_needs_a_held_lock_and_exactly_its_current_token() {
    let c = one_node(&[]);
    let p = c.port(1);
    let fenced = |fence: &str| {
        let (code, body) = http(p, "PUT", &format!("/kv/g?fence={fence}"), b"v").unwrap();
        (code, json(&body)["error"].as_str().map(str::to_string))
    };
    assert_eq!(
        fenced("nolock:5"),
        (409, Some("lock_not_held".into())),
        "a token never issued"
    );
    let session = loop {
        let (code, body) = http(p, "POST", "/session", b"{\"ttl_ms\": 60000}").unwrap();
        if code == 200 {
            break json(&body)["id"].as_u64().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50)); // not_ready just after election
    };
    let (code, body) = http(p, "POST", &format!("/lock/L?session={session}"), b"").unwrap();
    assert_eq!(code, 200, "{body}");
    let token = json(&body)["token"].as_u64().unwrap();
    assert_eq!(
        fenced(&format!("L:{}", token + 1)),
        (409, Some("stale_fence".into()))
    );
    assert_eq!(fenced(&format!("L:{token}")).0, 200);
    assert_eq!(
        http(p, "DELETE", &format!("/session/{session}"), b"")
            .unwrap()
            .0,
        200
    );
    assert_eq!(
        fenced(&format!("L:{token}")),
        (409, Some("lock_not_held".into())),
        "released"
    );
}

#[test]
fn admin_routes_need_fault_injection_and_the_bearer_token() {
    let c = one_node(&["--fault-injection"]);
    let p = c.port(1);
    let heal = |headers: &[(&str, &str)]| {
        crate::cluster::http_with(p, "POST", "/admin/heal", b"", headers)
            .unwrap()
            .0
    };
    assert_eq!(heal(&[]), 401);
    assert_eq!(
        heal(&[("Authorization", "Bearer wrong-token-0123456789")]),
        401
    );
    let right = format!("Bearer {}", crate::cluster::TOKEN);
    assert_eq!(heal(&[("Authorization", &right)]), 200);
    // RFC 7235: the scheme name is case-insensitive.
    for scheme in ["bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} {}", crate::cluster::TOKEN);
        assert_eq!(heal(&[("Authorization", &auth)]), 200, "{scheme}");
    }
    assert_eq!(metric(p, "kv_admin_denied_total"), 2);
    drop(c);
    let mut c = one_node(&[]);
    // --fault-injection without a token file is refused at start (clap: exit 2).
    let out = c
        .command_edited(1, |args| {
            let at = args.iter().position(|a| a == "--admin-token-file").unwrap();
            args.drain(at..at + 2);
        })
        .arg("--fault-injection")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let right = [("Authorization", right.as_str())];
    let code = crate::cluster::http_with(c.port(1), "POST", "/admin/heal", b"", &right)
        .unwrap()
        .0;
    assert_eq!(
        code, 404,
        "no fault injection, no fault routes, token or not"
    );
    // Membership and leadership need the token only.
    let transfer = |h: &[(&str, &str)]| {
        crate::cluster::http_with(c.port(1), "POST", "/admin/transfer", b"{\"to\": 1}", h)
            .unwrap()
            .0
    };
    assert_eq!(transfer(&right), 202);
    assert_eq!(transfer(&[]), 401);
}

/// `GET path` over HTTPS, trusting the cluster CA.
fn https_get(c: &Cluster, path: &str) -> Option<(u16, Vec<u8>)> {
    let config = crate::forge::client_config(&c.tls().join("ca.pem"), None);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).ok()?;
    let tcp = TcpStream::connect(("127.0.0.1", c.port(1))).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    crate::cluster::read_response(&mut s)
}

#[test]
fn https_clients_are_served_with_a_certificate_of_the_cluster_ca() {
    let mut c = Cluster::prepare(1, &[]);
    let tls = c.tls();
    for (flag, file) in [("--http-cert", "http.pem"), ("--http-key", "http.key")] {
        c.args.push(flag.into());
        c.args.push(tls.join(file).display().to_string());
    }
    c.spawn(1);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some((200, body)) = https_get(&c, "/status") {
            let v = json(&String::from_utf8_lossy(&body));
            if v["role"] == "leader" {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no HTTPS answer:\n{}",
            c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("HTTPS /status: {status}");
    assert_eq!(
        http(c.port(1), "GET", "/status", b""),
        None,
        "plaintext on the HTTPS port"
    );
}
