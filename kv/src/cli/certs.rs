//! `kv certs`: what a cluster started by hand needs, in one dir: the cluster CA and node
//! certificates (see `tls::certs`), HTTPS certificates, a cluster id and an admin token.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::cli::cluster::plan::{admin_token_file, cluster_id};
use crate::tls::certs::make;

/// `kv certs`: certificates for a cluster started by hand.
#[derive(Args)]
pub struct CertsArgs {
    /// Where to write them (an existing CA there is reused, to add nodes later; so are an
    /// existing cluster id and admin token).
    #[arg(long)]
    dir: PathBuf,
    /// Node ids, `1,2,3`.
    #[arg(long, value_delimiter = ',', required = true)]
    ids: Vec<u64>,
    /// Also make an HTTPS certificate for `--http-cert`/`--http-key`, for these names or IPs
    /// (signed by the same CA, so clients trust ca.pem).
    #[arg(long, value_delimiter = ',')]
    http_san: Vec<String>,
    /// The HTTPS files' name: `<NAME>.pem` and `<NAME>.key`. Give each host its own (`http-4`
    /// for node 4, with node 4's names in --http-san) when the nodes do not share one name.
    #[arg(long, default_value = "http", requires = "http_san")]
    http_name: String,
}

/// `kv certs`: make the files; the process's exit code.
pub fn run(args: CertsArgs) -> i32 {
    if args.ids.contains(&0) {
        eprintln!("error: raft id 0 is reserved");
        return 2;
    }
    let name_ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if args.http_name.is_empty()
        || args.http_name.starts_with('.')
        || !args.http_name.chars().all(name_ok)
    {
        eprintln!(
            "error: --http-name {:?}: letters, digits, '-', '_' and '.' only",
            args.http_name
        );
        return 2;
    }
    // A new CA is a new cluster: it gets a cluster id and an admin token beside it. A dir whose
    // CA was made elsewhere (`kv cluster`'s) keeps the cluster's own, wherever they are.
    let new_cluster = !args.dir.join("ca.key").exists() || args.dir.join("cluster-id").exists();
    let made = make(&args.dir, &args.ids, &args.http_san, &args.http_name).and_then(|()| {
        if !new_cluster {
            return Ok(None);
        }
        let id = cluster_id(&args.dir)?;
        admin_token_file(&args.dir).map(|_| Some(id))
    });
    match made {
        Ok(cluster) => {
            print_files(&args, &args.dir, cluster.as_deref());
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// Say what was made, and what each node needs.
fn print_files(args: &CertsArgs, dir: &Path, cluster: Option<&str>) {
    let d = dir.display();
    println!("in {d}: ca.pem, ca.key (the CA's key: keep it here, private), node-<id>.pem/.key");
    let cluster = match cluster {
        Some(id) => {
            println!(
                "  cluster-id ({id}), admin.token (mode 0600: the secret for /admin and --join)"
            );
            id.to_string()
        }
        None => "<the cluster's id>".to_string(),
    };
    let https = !args.http_san.is_empty();
    let name = &args.http_name;
    for id in &args.ids {
        let mut files = format!("ca.pem node-{id}.pem node-{id}.key admin.token");
        if https {
            files.push_str(&format!(" {name}.pem {name}.key"));
        }
        println!("  node {id} needs {files}, and the flags");
        println!("    --cluster-id {cluster} --admin-token-file admin.token");
        println!("    --peer-ca ca.pem --peer-cert node-{id}.pem --peer-key node-{id}.key");
        if https {
            println!("    --http-cert {name}.pem --http-key {name}.key (clients trust ca.pem)");
        }
    }
}
