//! Runs every fault scenario with the lease as designed and with its safety switched off, and
//! prints how many seeds produced a stale read. The lease must show 0 everywhere.
//!
//! `cargo run --release --features sim --example stale_reads [-- --seeds N]`

use raft_lease::sim::scenarios;

fn main() {
    let seeds = parse_seeds();
    println!(
        "{:<24} {:<54} {:>12} {:>16}",
        "scenario", "hazard", "lease: stale", "control: stale"
    );
    let mut lease_stale_total = 0;
    for s in scenarios::all() {
        let (mut safe_stale, mut control_stale, mut lease_reads) = (0, 0, 0);
        for seed in 0..seeds {
            let safe = s.check(seed, true);
            lease_reads += safe.lease_reads_checked;
            safe_stale += usize::from(safe.stale_reads() > 0);
            control_stale += usize::from(s.check(seed, false).stale_reads() > 0);
        }
        lease_stale_total += safe_stale;
        let lease = format!("{safe_stale}/{seeds}");
        let control = format!("{control_stale}/{seeds}");
        println!(
            "{:<24} {:<54} {:>12} {:>16}   ({lease_reads} lease reads checked)",
            s.name, s.hazard, lease, control
        );
    }
    println!(
        "\ncontrols: {:?}",
        scenarios::all()
            .iter()
            .map(|s| (s.name, s.control))
            .collect::<Vec<_>>()
    );
    if lease_stale_total > 0 {
        eprintln!("STALE READS WITH THE LEASE ON: this is a bug, please report it with the seed");
        std::process::exit(1);
    }
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
