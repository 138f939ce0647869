//! The HTTP front end under floods of idle connections, slow bodies and huge headers, and the
//! peer port under huge length prefixes: the node keeps serving others, and its memory stays
//! bounded (peak RSS from /proc, with a generous bound; no timing is asserted).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::cluster::{http, json, metric, put, rss_kib, Cluster};
use crate::forge::Cred;

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

/// Wait up to 5 s for counter `name` of node 1 to reach `n`; its value.
fn counted(c: &Cluster, name: &str, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = metric(c.port(1), name);
        if v >= n || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// 8 connections each claiming a 256 MiB frame: with TLS, from an authenticated member (node 2's
/// own certificate), so the prefix is really read; with `--insecure-peers`, from anyone.
fn length_prefix_flood(insecure: bool) {
    let args: &[&str] = if insecure { &["--insecure-peers"] } else { &[] };
    let c = Cluster::start(2, args);
    c.leader(&[1, 2], 15);
    let cred = if insecure {
        Cred::Plain
    } else {
        Cred::Member(2)
    };
    let (hwm0, hwm1) = peak_growth(&c, || {
        for _ in 0..8 {
            let Ok(mut w) = crate::forge::connect(&c, 1, cred) else {
                continue;
            };
            let _ = w.write_all(&[0x10, 0, 0, 0, 1]); // a 256 MiB frame, final
            let _ = w.write_all(&vec![0u8; 1 << 20]);
            let _ = w.flush();
        }
    });
    let refused = counted(&c, "kv_peer_bad_frames_total", 8);
    eprintln!("insecure {insecure}: 8 × 256 MiB length prefixes: peak RSS {hwm0} -> {hwm1} KiB; {refused} refused");
    assert!(refused >= 8, "{refused}");
    assert!(hwm1 < hwm0 + 32 * 1024, "peak RSS grew by more than 32 MiB");
    let l = c.leader(&[1, 2], 15);
    put(c.port(l), "after", "served");
}

#[test]
fn huge_peer_length_prefixes_are_refused_before_allocating() {
    length_prefix_flood(false); // an authenticated member: read, and refused on the prefix alone
    length_prefix_flood(true); // anyone, without TLS: the same
}

/// Connections that each send 64 MiB of frames that never end a message: all of them together
/// hold at most the peer byte budget (here a 16 MiB state cap gives a budget of about 100 MiB).
#[test]
fn peer_reassembly_of_all_connections_is_bounded_by_one_budget() {
    let c = Cluster::start(
        1,
        &[
            "--insecure-peers",
            "--quota-backend-bytes",
            "16777216",
            "--max-inflight-bytes",
            "4194304",
        ],
    );
    c.leader(&[1], 15);
    let frame: Vec<u8> = [&[0x00, 0x10, 0, 0, 0][..], &vec![7u8; 1 << 20]].concat(); // 1 MiB, not final
    let (hwm0, hwm1) = peak_growth(&c, || {
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let Ok(mut w) = crate::forge::connect(&c, 1, Cred::Plain) else {
                        return;
                    };
                    for _ in 0..64 {
                        if w.write_all(&frame).is_err() {
                            return; // closed by the node
                        }
                    }
                });
            }
        });
    });
    let grew_mib = (hwm1 - hwm0) / 1024;
    eprintln!("8 × 64 MiB of unfinished messages: peak RSS {hwm0} -> {hwm1} KiB (+{grew_mib} MiB)");
    assert!(
        grew_mib < 160,
        "peak RSS grew by {grew_mib} MiB, past the budget"
    );
    put(c.port(1), "after", "served");
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
    assert_eq!(transfer(&right), 200, "node 1 leads already");
    assert_eq!(transfer(&[]), 401);
    // A transfer raft would ignore (to a node that is not a voter) is refused, not accepted.
    let (code, body) =
        crate::cluster::http_with(c.port(1), "POST", "/admin/transfer", b"{\"to\": 7}", &right)
            .unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(
        (code, crate::cluster::error_code(&body).as_str()),
        (409, "transfer_refused"),
        "{body}"
    );
}

/// `GET path` over HTTPS, trusting the cluster CA.
fn https_get(c: &Cluster, path: &str) -> Option<(u16, Vec<u8>)> {
    crate::forge::https_admin(c, c.port(1), "GET", path, b"")
        .map(|(code, b)| (code, b.into_bytes()))
}

#[test]
fn https_clients_are_served_with_a_certificate_of_the_cluster_ca() {
    let mut c = Cluster::prepare(1, &[]);
    c.serve_https();
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

/// A TCP connection to 127.0.0.1:`port` from the loopback address 127.0.0.`src` (a second
/// client address on one machine: all of 127.0.0.0/8 is loopback).
fn connect_from(src: u8, port: u16) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a socket this function owns, bound and connected with valid addresses; on success
    // its descriptor is handed to a TcpStream, which closes it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let src = addr([127, 0, 0, src], 0);
        let dst = addr([127, 0, 0, 1], port);
        let ok = libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len) == 0
            && libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len) == 0;
        if !ok {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(TcpStream::from_raw_fd(fd))
    }
}

/// GET `path` on a fresh connection from 127.0.0.`src`; the status, if answered.
fn get_from(src: u8, port: u16, path: &str) -> Option<u16> {
    let mut s = connect_from(src, port).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    crate::cluster::read_response(&mut s).map(|(code, _)| code)
}

/// Connections from 127.0.0.1 that send a PUT's head claiming a 1 MB body, then one byte a second;
/// each one the node closes is opened again at once, until `stop`.
fn slow_bodies(port: u16, n: usize, stop: &std::sync::atomic::AtomicBool) -> usize {
    use std::sync::atomic::Ordering;
    let open = || -> Option<TcpStream> {
        let mut s = connect_from(1, port).ok()?;
        s.write_all(b"PUT /kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
            .ok()?;
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| open()).collect();
    let mut opened = n;
    while !stop.load(Ordering::Relaxed) {
        for c in conns.iter_mut() {
            let alive = c.as_mut().is_some_and(|s| {
                let mut b = [0u8; 512];
                let closed = s.read(&mut b).is_ok() || s.write(b"x").is_err();
                !closed
            });
            if !alive {
                *c = open();
                opened += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    opened
}

#[test]
fn slow_bodies_on_every_connection_never_lock_other_clients_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let args = [
        "--http-max-connections",
        "64",
        "--http-max-connections-per-ip",
        "48",
        "--http-body-timeout-ms",
        "30000",
    ];
    let c = one_node(&args);
    let p = c.port(1);
    put(p, "k", "v");
    let stop = AtomicBool::new(false);
    let (others, same_ip, opened) = std::thread::scope(|s| {
        let flood = s.spawn(|| slow_bodies(p, 64, &stop));
        std::thread::sleep(Duration::from_millis(500));
        let mut others = Vec::new();
        let mut same_ip = Vec::new();
        for _ in 0..10 {
            others.push(get_from(2, p, "/kv/k?read=lease")); // another address
            same_ip.push(get_from(1, p, "/kv/k?read=lease")); // the flood's own address
            std::thread::sleep(Duration::from_millis(200));
        }
        stop.store(true, Ordering::Relaxed);
        (others, same_ip, flood.join().unwrap())
    });
    let evicted = metric(p, "kv_http_evicted_total");
    eprintln!("64 slow bodies ({opened} opened): GETs from another address {others:?}, from the same {same_ip:?}; {evicted} evicted");
    assert!(others.iter().all(|c| *c == Some(200)), "{others:?}");
    assert!(same_ip.iter().all(|c| *c == Some(200)), "{same_ip:?}");
    assert!(evicted > 0, "the table never filled");
}

#[test]
fn an_idle_flood_never_closes_a_keep_alive_client() {
    let c = one_node(&[
        "--http-max-connections",
        "64",
        "--http-max-connections-per-ip",
        "64",
    ]);
    let p = c.port(1);
    put(p, "k", "v");
    // A keep-alive client that has completed requests, then idles between them.
    let mut client = TcpStream::connect(("127.0.0.1", p)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut failed = 0;
    let mut ask = |client: &mut TcpStream| {
        let req = b"GET /kv/k?read=lease HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = [0u8; 4096];
        let ok = client.write_all(req).is_ok()
            && client
                .read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"HTTP/1.1 200"));
        failed += usize::from(!ok);
    };
    ask(&mut client);
    let mut idle = Vec::new();
    for round in 0..5 {
        // 60 new idle connections per round: the table (64) is full after the first.
        idle.extend((0..60).filter_map(|_| TcpStream::connect(("127.0.0.1", p)).ok()));
        std::thread::sleep(Duration::from_millis(100));
        ask(&mut client);
        eprintln!("round {round}: {} idle connections opened", idle.len());
    }
    let evicted = metric(p, "kv_http_evicted_total");
    eprintln!(
        "keep-alive client: {failed} of 6 requests failed; {evicted} idle connections evicted"
    );
    assert!(evicted >= 200, "the table never filled: {evicted}");
    assert_eq!(failed, 0, "the keep-alive client was closed");
}

#[test]
fn concurrent_large_puts_are_refused_at_once_beyond_the_inflight_budget() {
    let c = one_node(&["--max-inflight-bytes", "8388608"]);
    let p = c.port(1);
    let mib = vec![b'x'; 1 << 20];
    let (codes, (hwm0, hwm1)) = {
        let mut codes = Vec::new();
        let growth = peak_growth(&c, || {
            codes = std::thread::scope(|s| {
                let workers: Vec<_> = (0..32)
                    .map(|t| {
                        let mib = &mib;
                        s.spawn(move || {
                            (0..4)
                                .map(|i| {
                                    http(p, "PUT", &format!("/kv/m{t}-{i}"), mib).map(|(c, _)| c)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().unwrap())
                    .collect()
            });
        });
        (codes, growth)
    };
    let ok = codes.iter().filter(|c| **c == Some(200)).count();
    let overloaded = codes.iter().filter(|c| **c == Some(503)).count();
    eprintln!("32 clients × 4 PUTs of 1 MiB, 8 MiB in flight at most: {ok} acknowledged, {overloaded} refused (503); peak RSS {hwm0} -> {hwm1} KiB");
    assert_eq!(ok + overloaded, codes.len(), "{codes:?}");
    assert!(overloaded > 0 && ok > 0, "{codes:?}");
    assert!(
        hwm1 < hwm0 + 128 * 1024,
        "peak RSS grew by more than 128 MiB"
    );
    for t in 0..32 {
        for i in 0..4 {
            let code = http(p, "GET", &format!("/kv/m{t}-{i}?read=index"), b"")
                .unwrap()
                .0;
            assert!(code == 200 || code == 404);
        }
    }
}
