//! `kv certs`: certificates for a cluster started by hand (see `tls::certs`).

use std::path::PathBuf;

use clap::Args;

use crate::tls::certs::make;

/// `kv certs`: certificates for a cluster started by hand.
#[derive(Args)]
pub struct CertsArgs {
    /// Where to write them (an existing CA there is reused).
    #[arg(long)]
    dir: PathBuf,
    /// Node ids, `1,2,3`.
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u64>,
    /// Also make `http.pem`/`http.key` for `--http-cert`/`--http-key`, for these names or IPs.
    #[arg(long, value_delimiter = ',')]
    http_san: Vec<String>,
}

/// `kv certs`: make the files; the process's exit code.
pub fn run(args: CertsArgs) -> i32 {
    if args.ids.contains(&0) {
        eprintln!("error: raft id 0 is reserved");
        return 2;
    }
    match make(&args.dir, &args.ids, &args.http_san) {
        Ok(()) => {
            let d = args.dir.display();
            println!("certificates in {d}: ca.pem, ca.key (keep it private), node-<id>.pem/.key");
            for id in &args.ids {
                println!("  node {id}: --peer-ca {d}/ca.pem --peer-cert {d}/node-{id}.pem --peer-key {d}/node-{id}.key");
            }
            if !args.http_san.is_empty() {
                println!("  HTTPS: --http-cert {d}/http.pem --http-key {d}/http.key (clients trust ca.pem)");
            }
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
