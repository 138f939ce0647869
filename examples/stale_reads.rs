//! Runs every fault scenario with the lease as designed and with its safety switched off, and
//! prints on how many seeds a stale read was served, or the lease monitor saw a lease outlive
//! its promises. The lease must show 0 everywhere.
//!
//! `cargo run --release --features sim --example stale_reads [-- --seeds N]`

use raft_lease::sim::scenarios;

fn main() {
    let seeds = parse_seeds();
    println!(
        "{:<42} {:>14} {:>15} {:>15}",
        "scenario", "lease: unsafe", "control: stale", "control: caught"
    );
    let mut lease_unsafe_total = 0;
    for s in scenarios::all() {
        let (mut safe_unsafe, mut control_stale, mut control_caught, mut lease_reads) =
            (0, 0, 0, 0);
        for seed in 0..seeds {
            let safe = s.check(seed, true);
            lease_reads += safe.lease_reads_checked;
            safe_unsafe += usize::from(safe.unsafe_found());
            let control = s.check(seed, false);
            control_stale += usize::from(control.stale_reads() > 0);
            control_caught += usize::from(control.unsafe_found());
        }
        lease_unsafe_total += safe_unsafe;
        println!(
            "{:<42} {:>14} {:>15} {:>15}   {} ({lease_reads} lease reads checked)",
            s.name,
            format!("{safe_unsafe}/{seeds}"),
            format!("{control_stale}/{seeds}"),
            format!("{control_caught}/{seeds}"),
            s.hazard,
        );
    }
    println!(
        "\n\"unsafe\" and \"caught\": a stale read, or a lease overlap seen by the lease monitor."
    );
    for s in scenarios::all() {
        println!("control of {:<42} {}", s.name, describe(s.control));
    }
    if lease_unsafe_total > 0 {
        eprintln!("UNSAFE WITH THE LEASE ON: this is a bug, please report it with the seed");
        std::process::exit(1);
    }
}

fn describe(control: scenarios::Control) -> String {
    raft_lease::sim::random::describe(Some(control))
}

fn parse_seeds() -> u64 {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--seeds") {
        None => 10,
        Some(i) => match args.get(i + 1).and_then(|n| n.parse().ok()) {
            Some(n) if n > 0 => n,
            _ => {
                eprintln!("usage: stale_reads [--seeds N]   (N a positive number)");
                std::process::exit(2);
            }
        },
    }
}
