//! `kv bench`: HTTP load on a local 3-node cluster with a per-message peer delay, comparing
//! `GET ?read=lease` with `GET ?read=index` in one run (keep-alive clients on loopback).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Args;

use crate::cluster::{shutdown, spawn_all, ClusterArgs};

#[derive(Args)]
pub struct BenchArgs {
    /// Concurrent HTTP clients (each a keep-alive connection to the leader).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds per read mode.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// One-way delay added to every peer message.
    #[arg(long, default_value_t = 1)]
    peer_delay_ms: u64,
    /// Ports: peers BASE+1.., HTTP BASE+1001...
    #[arg(long, default_value_t = 7100)]
    base_port: u16,
}

/// A keep-alive HTTP/1.1 client: just enough for GET and PUT with a Content-Length reply.
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    fn connect(port: u16) -> std::io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.w.write_all(head.as_bytes())?;
        self.w.write_all(body)?;
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let code = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body)?;
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    }
}

pub fn run(args: BenchArgs) -> i32 {
    let dir = match tempfile::Builder::new()
        .prefix("raft-lease-kv-bench-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let cluster = ClusterArgs {
        nodes: 3,
        data_dir: Some(dir.path().to_path_buf()),
        base_port: args.base_port,
        peer_delay_ms: args.peer_delay_ms,
        fault_injection: false,
        unsafe_lease_based: false,
        insecure_peers: false,
    };
    let children = match spawn_all(&cluster, dir.path()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    };
    let code = match bench(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    shutdown(children);
    code
}

fn leader_port(args: &BenchArgs) -> Result<u16, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        for id in 1..=3u16 {
            let port = args.base_port + 1000 + id;
            let status = Client::connect(port).and_then(|mut c| c.request("GET", "/status", b""));
            if let Ok((200, body)) = status {
                if body.contains("\"role\":\"leader\"") && body.contains("\"state\":\"valid\"") {
                    return Ok(port);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("no leader with a lease within 20 s".into())
}

fn bench(args: &BenchArgs) -> Result<(), String> {
    let port = leader_port(args)?;
    let mut c = Client::connect(port).map_err(|e| e.to_string())?;
    for k in 0..100 {
        c.request("PUT", &format!("/kv/k{k}"), format!("value-{k}").as_bytes())
            .map_err(|e| e.to_string())?;
    }
    println!(
        "kv bench: 3 nodes, peer delay {} ms one way, {} keep-alive clients, {} s per mode",
        args.peer_delay_ms, args.clients, args.seconds
    );
    println!(
        "{:<8} {:>10} {:>10} {:>12} {:>8}",
        "read", "p50", "p99", "reads/s", "errors"
    );
    for mode in ["lease", "index"] {
        let (mut lat, errors, secs) = load(port, mode, args)?;
        lat.sort_unstable();
        let at = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        println!(
            "{mode:<8} {:>8.1}µs {:>8.1}µs {:>12.0} {errors:>8}",
            at(0.5) as f64 / 1e3,
            at(0.99) as f64 / 1e3,
            lat.len() as f64 / secs
        );
    }
    Ok(())
}

fn load(port: u16, mode: &str, args: &BenchArgs) -> Result<(Vec<u64>, u64, f64), String> {
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let t0 = Instant::now();
    let results: Vec<Result<(Vec<u64>, u64), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..args.clients)
            .map(|i| {
                s.spawn(move || {
                    let mut c = Client::connect(port).map_err(|e| e.to_string())?;
                    let (mut lat, mut errors, mut k) = (Vec::new(), 0u64, i);
                    while Instant::now() < end {
                        k = (k + 7) % 100;
                        let t = Instant::now();
                        match c.request("GET", &format!("/kv/k{k}?read={mode}"), b"") {
                            Ok((200, _)) => lat.push(t.elapsed().as_nanos() as u64),
                            Ok(_) => errors += 1,
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    Ok((lat, errors))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut all, mut errors) = (Vec::new(), 0);
    for r in results {
        let (lat, e) = r?;
        all.extend(lat);
        errors += e;
    }
    Ok((all, errors, secs))
}
