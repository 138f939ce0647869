//! `kv hosts`: test hosts on one machine, to rehearse a deployment (docs/deploy.md) or to run
//! the store on addresses of its own: each host a Linux network namespace with its own address
//! on a bridge, the machine itself at `.254`. Needs root, iproute2 and nftables.
//!
//! `kv hosts up --ids 1,2,3` makes namespaces `rlkhost-1`.. with 10.77.0.1..; run a command on
//! host 2 with `ip netns exec rlkhost-2 COMMAND`; `kv hosts down --ids 1,2,3` removes them.

use clap::{Args, ValueEnum};

use crate::cli::netns::{Hosts, NetnsError, UNAVAILABLE_EXIT};

/// What to do.
#[derive(Clone, Copy, ValueEnum)]
pub enum Action {
    /// Make the hosts (kept until `down`).
    Up,
    /// Remove them.
    Down,
}

/// `kv hosts`'s options.
#[derive(Args)]
pub struct HostsArgs {
    /// `up` or `down`.
    action: Action,
    /// Host ids: host N gets the address SUBNET.N.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    ids: Vec<u64>,
    /// The first three parts of the hosts' /24 (the machine itself is SUBNET.254).
    #[arg(long, default_value = "10.77.0")]
    subnet: String,
}

/// `kv hosts`: the process's exit code (5: namespaces cannot be had here).
pub fn run(args: HostsArgs) -> i32 {
    let parts: Vec<&str> = args.subnet.split('.').collect();
    let octets_ok = parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok());
    if !octets_ok || args.ids.iter().any(|&i| !(1..=253).contains(&i)) {
        eprintln!("error: --subnet takes A.B.C and --ids 1 to 253");
        return 2;
    }
    let hosts = Hosts::named("host", &args.subnet, &args.ids);
    match args.action {
        Action::Down => {
            hosts.remove();
            println!("removed hosts {:?}", args.ids);
            0
        }
        Action::Up => match hosts.build_and_keep() {
            Ok(()) => {
                for &id in &args.ids {
                    println!(
                        "host {id}: {} in namespace {}",
                        hosts.addr(id),
                        hosts.ns(id)
                    );
                }
                println!(
                    "run on a host: ip netns exec {} COMMAND",
                    hosts.ns(args.ids[0])
                );
                0
            }
            Err(e @ NetnsError::Unavailable(_)) => {
                eprintln!("error: {e}");
                UNAVAILABLE_EXIT
            }
            Err(e) => {
                eprintln!("error: {e} (`kv hosts down` removes what was made)");
                1
            }
        },
    }
}
