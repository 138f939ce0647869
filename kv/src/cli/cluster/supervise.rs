//! `kv cluster`'s console: start the nodes, print the banner, report a node that dies (its last
//! error, a hint, and the exact command that restarts it), and obey `restart N`, `stop N` and
//! `status` typed on standard input (see `commands`), until Ctrl-C.

use std::io::BufRead;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cli::cluster::commands::{obey, running};
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

/// How long the supervisor waits for a console command between looks at the nodes.
const CONSOLE_WAIT: Duration = Duration::from_millis(200);

/// What the console gave within a wait.
#[derive(Debug, PartialEq)]
enum Next {
    /// A command line.
    Command(String),
    /// Nothing within the wait.
    Nothing,
    /// Nothing ever again: stdin is closed (the answer comes at once, without waiting).
    Closed,
}

/// The console's next command, waiting at most `wait`.
fn next_command(commands: &crossbeam_channel::Receiver<String>, wait: Duration) -> Next {
    match commands.recv_timeout(wait) {
        Ok(cmd) => Next::Command(cmd),
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Next::Nothing,
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Next::Closed,
    }
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
    crate::cli::cluster::banner::print(plan);
    let commands = console();
    let mut code = 0;
    while !stop.load(Ordering::Relaxed) {
        reap(plan, &mut nodes);
        if nodes.iter().all(Option::is_none) {
            eprintln!(
                "every node has stopped; exiting (see the errors above, then run the same \
                 `kv cluster` command again)"
            );
            code = 1;
            break;
        }
        match next_command(&commands, CONSOLE_WAIT) {
            Next::Command(cmd) => obey(plan, &mut nodes, &cmd),
            Next::Nothing => {}
            // stdin closed (`&`, `nohup`, `</dev/null`): the loop still looks at the nodes,
            // at the same pace, instead of spinning on a channel that answers at once.
            Next::Closed => std::thread::sleep(CONSOLE_WAIT),
        }
    }
    shutdown(nodes.into_iter().flatten().collect());
    println!("all nodes stopped");
    code
}

/// Report every node that exited since the last look: its error, a hint, and how to restart it
/// (with the console's `restart N` only if the console stays up: some node still runs).
fn reap(plan: &Plan, nodes: &mut [Option<Child>]) {
    let mut exited = Vec::new();
    for (i, slot) in nodes.iter_mut().enumerate() {
        if let Some(status) = slot.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            *slot = None;
            exited.push((i as u64 + 1, status));
        }
    }
    let stays_up = nodes.iter().any(Option::is_some);
    for (id, status) in exited {
        let error = last_error(plan, id);
        eprintln!(
            "node {id} exited ({status}){}",
            error.as_ref().map_or(String::new(), |e| format!(": {e}"))
        );
        if let Some(h) = error.as_deref().and_then(|e| hint(e, plan, id)) {
            eprintln!("  hint: {h}");
        }
        if stays_up {
            eprintln!(
                "  {}. Restart it by typing `restart {id}`, or with:",
                running(nodes)
            );
            eprintln!("  {}", plan.command_line(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_console_is_told_from_a_quiet_one() {
        let (tx, rx) = crossbeam_channel::unbounded();
        tx.send("status".to_string()).unwrap();
        assert_eq!(
            next_command(&rx, Duration::ZERO),
            Next::Command("status".into())
        );
        assert_eq!(next_command(&rx, Duration::ZERO), Next::Nothing);
        drop(tx);
        assert_eq!(next_command(&rx, Duration::ZERO), Next::Closed);
    }
}
