//! `kv cluster`'s console: start the nodes, print the banner, report a node that dies (its last
//! error, a hint, and the exact command that restarts it), and obey `restart N`, `stop N` and
//! `status` typed on standard input, until Ctrl-C.

use std::io::BufRead;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::cluster::plan::{shutdown, Plan};

/// The last `error: ...` line of a node's log (what the node printed as it exited).
pub fn last_error(plan: &Plan, id: u64) -> Option<String> {
    let log = std::fs::read_to_string(plan.log_path(id)).ok()?;
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("error: "))
        .map(str::to_string)
}

/// A hint for a node's error.
pub fn hint(error: &str, plan: &Plan, id: u64) -> Option<String> {
    let l = plan.layout;
    if error.contains("Address already in use") {
        let other = l
            .base_port
            .checked_add(100)
            .filter(|b| *b as u64 + 1000 + l.nodes <= 65535);
        let suggest = other.map_or(String::new(), |b| {
            format!(" (for example --base-port {b} --temp)")
        });
        return Some(format!(
            "port {} or {} is taken, by another program or another `kv cluster`: stop it, or use \
             other ports with --base-port{suggest}",
            l.peer_port(id),
            l.http_port(id)
        ));
    }
    if error.contains("another process is using this data dir") {
        return Some(format!(
            "another `kv cluster` (or node) runs on {}: stop it first, or use --data-dir DIR or --temp",
            plan.dir.display()
        ));
    }
    if error.contains("refusing to start") {
        return Some(
            "the node's data dir was refused (see the error); its data is untouched".into(),
        );
    }
    None
}

fn banner(plan: &Plan) {
    let l = plan.layout;
    println!(
        "raft-lease KV cluster: {} nodes, data in {}",
        l.nodes,
        plan.dir.display()
    );
    if plan.insecure {
        println!("  peers: PLAINTEXT, UNAUTHENTICATED (--insecure-peers): local experiments only");
    } else {
        println!(
            "  peers: mutual TLS, certificates in {}",
            plan.dir.join("tls").display()
        );
    }
    for id in 1..=l.nodes {
        println!(
            "  node {id}: http://127.0.0.1:{}   log: {}",
            l.http_port(id),
            plan.log_path(id).display()
        );
    }
    let h = format!("127.0.0.1:{}", l.http_port(1));
    let token = plan.dir.join("admin.token");
    println!(
        "\nTry (any node answers: one that does not lead redirects to the leader, and -L follows):"
    );
    println!("  curl -sL -X PUT --data-binary 'hello' http://{h}/kv/greeting");
    println!("  curl -sL 'http://{h}/kv/greeting?read=lease'");
    println!("  curl -sL 'http://{h}/kv/greeting?read=index'");
    println!("  curl -s http://{h}/status");
    println!("  curl -s http://{h}/members");
    println!("  curl -s http://{h}/metrics");
    println!(
        "  curl -sL -H \"Authorization: Bearer $(cat {})\" -X POST \\",
        token.display()
    );
    println!("       -d '{{\"to\": 2}}' http://{h}/admin/transfer");
    println!("\nConsole: `restart N`, `stop N`, `status`. Ctrl-C stops every node.");
}

/// Read console commands (`restart N`, `stop N`, `status`) into a channel, until stdin closes.
fn console() -> crossbeam_channel::Receiver<String> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_string()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Start every node and supervise them until `stop`. The exit code: 0 after Ctrl-C, 1 if every
/// node has died.
pub fn run(plan: &Plan, stop: &AtomicBool, _temp: bool) -> i32 {
    let mut nodes: Vec<Option<Child>> = Vec::new();
    for id in 1..=plan.layout.nodes {
        match plan.spawn(id) {
            Ok(c) => nodes.push(Some(c)),
            Err(e) => {
                eprintln!("error: {e}");
                shutdown(nodes.into_iter().flatten().collect());
                return 1;
            }
        }
    }
    banner(plan);
    let commands = console();
    let mut code = 0;
    while !stop.load(Ordering::Relaxed) {
        reap(plan, &mut nodes);
        if nodes.iter().all(Option::is_none) {
            eprintln!("every node has stopped; exiting");
            code = 1;
            break;
        }
        if let Ok(cmd) = commands.recv_timeout(Duration::from_millis(200)) {
            obey(plan, &mut nodes, &cmd);
        }
    }
    shutdown(nodes.into_iter().flatten().collect());
    code
}

/// Report every node that exited since the last look.
fn reap(plan: &Plan, nodes: &mut [Option<Child>]) {
    for (i, slot) in nodes.iter_mut().enumerate() {
        let id = i as u64 + 1;
        let Some(status) = slot.as_mut().and_then(|c| c.try_wait().ok().flatten()) else {
            continue;
        };
        *slot = None;
        let error = last_error(plan, id);
        eprintln!(
            "node {id} exited ({status}){}",
            error.as_ref().map_or(String::new(), |e| format!(": {e}"))
        );
        if let Some(h) = error.as_deref().and_then(|e| hint(e, plan, id)) {
            eprintln!("  hint: {h}");
        }
        eprintln!("  the other nodes keep running. Restart it by typing `restart {id}`, or with:");
        eprintln!("  {}", plan.command_line(id));
    }
}

fn obey(plan: &Plan, nodes: &mut [Option<Child>], cmd: &str) {
    let mut words = cmd.split_whitespace();
    let (verb, id) = (
        words.next().unwrap_or(""),
        words.next().and_then(|w| w.parse::<u64>().ok()),
    );
    let slot = id
        .filter(|i| (1..=nodes.len() as u64).contains(i))
        .map(|i| i as usize - 1);
    match (verb, slot) {
        ("restart", Some(i)) if nodes[i].is_none() => match plan.spawn(i as u64 + 1) {
            Ok(c) => {
                nodes[i] = Some(c);
                println!("node {} restarted", i + 1);
            }
            Err(e) => eprintln!("error: {e}"),
        },
        ("restart", Some(i)) => println!("node {} is running; `stop {}` first", i + 1, i + 1),
        ("stop", Some(i)) => match nodes[i].take() {
            Some(c) => shutdown(vec![c]),
            None => println!("node {} is not running", i + 1),
        },
        ("status", _) => {
            for (i, n) in nodes.iter().enumerate() {
                let state = if n.is_some() { "running" } else { "stopped" };
                println!("node {}: {state}", i + 1);
            }
        }
        ("", _) => {}
        _ => println!(
            "commands: restart N, stop N, status (N is 1 to {})",
            nodes.len()
        ),
    }
}
