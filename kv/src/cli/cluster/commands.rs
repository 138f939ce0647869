//! The console's commands: `restart N`, `stop N` and `status` (each node's process, and from its
//! `/status` its role, the leader it knows and its term).

use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::cli::cluster::plan::{shutdown, Plan};
use crate::http::client::{get_tls, Client};

/// How long `status` waits for each node's answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// Obey one line typed on the console.
pub fn obey(plan: &Plan, nodes: &mut [Option<Child>], cmd: &str) {
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
        ("stop", Some(i)) => stop(nodes, i),
        ("status", _) => status(plan, nodes),
        ("", _) => {}
        _ => println!(
            "commands: restart N, stop N, status (N is 1 to {})",
            nodes.len()
        ),
    }
}

/// `stop N`: stop that node only, and say which still run.
fn stop(nodes: &mut [Option<Child>], i: usize) {
    let Some(c) = nodes[i].take() else {
        println!("node {} is not running", i + 1);
        return;
    };
    shutdown(vec![c]);
    println!(
        "node {} stopped (`restart {}` starts it again); {}",
        i + 1,
        i + 1,
        running(nodes)
    );
}

/// Which nodes run, in words.
pub fn running(nodes: &[Option<Child>]) -> String {
    let ids: Vec<String> = (1..=nodes.len())
        .filter(|&id| nodes[id - 1].is_some())
        .map(|id| id.to_string())
        .collect();
    match ids.as_slice() {
        [] => "no node is running".to_string(),
        ids => format!("running: node {}", ids.join(", ")),
    }
}

/// `status`: each node's process and what its `/status` says.
fn status(plan: &Plan, nodes: &[Option<Child>]) {
    for (i, n) in nodes.iter().enumerate() {
        let id = i as u64 + 1;
        match n {
            None => println!("node {id}: stopped"),
            Some(c) => println!("node {id}: running, pid {}, {}", c.id(), describe(plan, id)),
        }
    }
}

/// A node's role, the leader it knows and its term, from its `/status`.
fn describe(plan: &Plan, id: u64) -> String {
    let v = match node_status(plan, id) {
        Ok(v) => v,
        Err(e) => return format!("no answer from its /status ({e})"),
    };
    let (role, term) = (v["role"].as_str().unwrap_or("unknown"), &v["term"]);
    match (role, v["leader_id"].as_u64()) {
        ("leader", _) => format!("leader, term {term}"),
        (role, Some(l)) => match v["last_heard_ms"].as_u64() {
            Some(ms) => format!("{role}, leader node {l} (last heard {ms} ms ago), term {term}"),
            None => format!("{role}, leader node {l}, term {term}"),
        },
        (role, None) => format!("{role}, no leader known, term {term}"),
    }
}

/// Node `id`'s `/status`, over HTTPS if the nodes serve it.
fn node_status(plan: &Plan, id: u64) -> Result<Value, String> {
    let addr = format!("127.0.0.1:{}", plan.layout.http_port(id));
    let answer = match &plan.https_ca {
        Some(ca) => get_tls(&addr, "/status", ca, STATUS_TIMEOUT),
        None => Client::connect(&addr, STATUS_TIMEOUT)
            .and_then(|mut c| c.request("GET", "/status", b"", &[])),
    };
    let body = answer.map_err(|e| e.to_string())?.body;
    serde_json::from_str(&body).map_err(|e| e.to_string())
}
