//! `kv cluster`'s banner: where the nodes are, and curl lines that work as printed whichever node
//! leads: `-L` follows a follower's redirect to the leader, and the admin example uses
//! `--location-trusted`, since curl drops the `Authorization` header when a redirect changes the
//! port. With HTTPS nodes (`--http-cert` among the node flags) the URLs are `https://` and curl
//! is given the CA to trust (`--cacert`).

use crate::cli::cluster::plan::{quote, Plan};

/// Print the banner.
pub fn print(plan: &Plan) {
    header(plan);
    examples(plan);
    println!("\nConsole: `restart N`, `stop N`, `status`. Ctrl-C stops every node.");
}

fn header(plan: &Plan) {
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
            "  node {id}: {}://127.0.0.1:{}   log: {}",
            plan.scheme(),
            l.http_port(id),
            plan.log_path(id).display()
        );
    }
}

fn examples(plan: &Plan) {
    let url = format!("{}://127.0.0.1:{}", plan.scheme(), plan.layout.http_port(1));
    let curl = match &plan.https_ca {
        Some(ca) => format!("curl --cacert {}", quote(&ca.display().to_string())),
        None => "curl".to_string(),
    };
    let token = quote(&plan.dir.join("admin.token").display().to_string());
    println!(
        "\nTry (any node answers: one that does not lead redirects to the leader; -L follows, and \
         --location-trusted keeps the admin token across that redirect):"
    );
    println!("  {curl} -sL -X PUT --data-binary 'hello' {url}/kv/greeting");
    println!("  {curl} -sL '{url}/kv/greeting?read=lease'");
    println!("  {curl} -sL '{url}/kv/greeting?read=index'");
    println!("  {curl} -s {url}/status");
    println!("  {curl} -s {url}/members");
    println!("  {curl} -s {url}/metrics");
    println!(
        "  {curl} -s --location-trusted -H \"Authorization: Bearer $(cat {token})\" -X POST \\"
    );
    println!("       -d '{{\"to\": 2}}' {url}/admin/transfer");
    if plan.etcd {
        etcd_examples(plan);
    }
}

/// `etcdctl` lines that work as printed (etcd's v3 API on every node; see docs/etcd.md).
fn etcd_examples(plan: &Plan) {
    let l = plan.layout;
    // host:port, no scheme: etcdctl 3.4 sends a URL endpoint as the HTTP/2 :authority of its
    // per-endpoint calls (`endpoint status`, `defrag`), which HTTP/2 servers other than Go's
    // refuse as malformed. With --cacert, etcdctl speaks TLS to such endpoints.
    let endpoints: Vec<String> = (1..=l.nodes)
        .map(|i| format!("127.0.0.1:{}", l.etcd_port(i)))
        .collect();
    let cacert = match &plan.https_ca {
        Some(ca) => format!(" --cacert {}", quote(&ca.display().to_string())),
        None => String::new(),
    };
    let etcdctl = format!("etcdctl{cacert} --endpoints={}", endpoints.join(","));
    println!("\netcd's v3 API (etcdctl 3.4 and etcd's client libraries, unchanged):");
    println!("  {etcdctl} put greeting hello");
    println!("  {etcdctl} get greeting");
    println!("  {etcdctl} endpoint status -w table");
}
