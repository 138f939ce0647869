//! etcd's v3 API with clients nobody here wrote: the Rust `etcd-client` crate (`etcd/compat.rs`)
//! and `etcdctl` 3.4 as a user types it (`etcd/etcdctl.rs`). **Every compatibility test runs
//! twice: against this store and against a real etcd 3.4 cluster the test starts**, so that a
//! test is shown to check etcd's behaviour and not only ours. The store-only tests (bad input on
//! the gRPC port) are in `etcd/attack.rs`.

#[path = "etcd/attack.rs"]
mod attack;
#[path = "etcd/authority.rs"]
mod authority;
#[path = "etcd/bench.rs"]
mod bench;
#[path = "kv/cluster.rs"]
#[allow(dead_code)]
mod cluster;
#[path = "etcd/compat.rs"]
mod compat;
#[path = "etcd/etcdctl.rs"]
mod etcdctl;
#[path = "etcd/http_side.rs"]
mod http_side;
#[path = "kv/ports.rs"]
#[allow(dead_code)]
mod ports;
#[path = "etcd/read_your_writes.rs"]
mod read_your_writes;
#[path = "etcd/reference.rs"]
mod reference;
#[path = "etcd/target.rs"]
#[allow(dead_code)]
mod target;

use target::Target;

/// One check, as two tests: `NAME::store` and `NAME::etcd`.
macro_rules! both {
    ($name:ident, $check:path) => {
        mod $name {
            use super::*;

            #[test]
            fn store() {
                let t = Target::store();
                compat::runtime().block_on($check(&t));
            }

            #[test]
            fn etcd() {
                if !reference::available() {
                    return;
                }
                let t = Target::etcd();
                compat::runtime().block_on($check(&t));
            }
        }
    };
}

/// One `etcdctl` check, as two tests, the target given mutably (it may kill the leader).
macro_rules! both_etcdctl {
    ($name:ident, $check:path) => {
        mod $name {
            use super::*;

            #[test]
            fn store() {
                if !etcdctl::available() {
                    return;
                }
                let mut t = Target::store();
                $check(&mut t);
            }

            #[test]
            fn etcd() {
                if !etcdctl::available() || !reference::available() {
                    return;
                }
                let mut t = Target::etcd();
                $check(&mut t);
            }
        }
    };
}

both_etcdctl!(etcdctl_commands, etcdctl::commands);
both_etcdctl!(
    etcdctl_lock_across_a_killed_leader,
    etcdctl::lock_across_a_killed_leader
);
both_etcdctl!(
    etcdctl_elect_across_a_killed_leader,
    etcdctl::elect_across_a_killed_leader
);

both!(
    http_version_health_and_metrics_beside_grpc,
    http_side::version_health_metrics
);

/// `/health` false with 503 on the last of three members, on the store and on etcd 3.4.
mod http_health_false_without_a_leader {
    use super::*;

    #[test]
    fn store() {
        if !http_side::available() {
            return;
        }
        http_side::health_false_without_a_leader(&mut Target::store());
    }

    #[test]
    fn etcd() {
        if !http_side::available() || !reference::available() {
            return;
        }
        http_side::health_false_without_a_leader(&mut Target::etcd());
    }
}

both!(
    every_authority_go_clients_send_gets_an_answer,
    authority::every_form_answers
);

/// The control: with the `:authority` rewriting off, the URL forms etcd's Go clients send are
/// refused (the stream reset as malformed), so the test above can fail.
#[test]
fn control_authority_as_sent_is_refused_by_the_http2_server() {
    let t = Target::store_with(&["--unsafe-authority-as-sent"]);
    let ep = &t.endpoints()[0];
    assert_eq!(
        authority::status_call(ep, Some(ep.as_str())),
        authority::Answer::GrpcStatus("0".into())
    );
    for form in [format!("http://{ep}"), format!("#initially=[http://{ep}]")] {
        let got = authority::status_call(ep, Some(&form));
        assert_ne!(got, authority::Answer::GrpcStatus("0".into()), "{form}");
    }
}

both!(
    a_follower_reads_its_own_writes,
    read_your_writes::a_follower_reads_its_own_writes
);

/// The control: a member that answers a forwarded write before applying it
/// (`--unsafe-forward-unwaited`) misses some of its own writes in serializable reads.
#[test]
fn control_a_follower_answering_before_it_applied_misses_its_own_writes() {
    let t = Target::store_with(&["--unsafe-forward-unwaited"]);
    let missed = compat::runtime().block_on(read_your_writes::misses_at_a_follower(&t, 2000));
    assert!(
        missed > 0,
        "0 of 2000 serializable gets missed without the wait"
    );
}

both!(kv_and_revisions, compat::kv_and_revisions);
both!(transactions, compat::transactions);
both!(compaction, compat::compaction);
both!(watches, compat::watches);
both!(leases, compat::leases);
both!(any_member, compat::any_member);

#[test]
fn control_the_lock_checker_finds_sections_run_without_the_lock() {
    etcdctl::sections_without_the_lock_overlap();
}

/// Bad input on the gRPC port: etcd's codes, and the node keeps serving (the store only: what
/// etcd answers to garbage is not the question).
#[test]
fn bad_input_on_the_etcd_port_gets_etcds_codes_and_never_stops_a_node() {
    let c = cluster::Cluster::start(3, &[]);
    let l = c.leader(&[1, 2, 3], 15);
    let rt = compat::runtime();
    rt.block_on(attack::refusals(&c));
    rt.block_on(attack::too_many_watchers(&c));
    rt.block_on(attack::garbage_on_the_port(&c));
    rt.block_on(attack::too_many_connections(&c));
    let follower = [1, 2, 3].into_iter().find(|&i| i != l).unwrap();
    rt.block_on(attack::a_forged_forward_mark(&c, follower));
}

#[test]
fn a_full_store_refuses_etcd_writes_until_compacted() {
    let c = cluster::Cluster::start(1, &["--quota-backend-bytes", "2000000"]);
    c.leader(&[1], 15);
    compat::runtime().block_on(attack::a_full_store(&c));
}

/// The `etcdctl` lines of docs/etcd.md, run as printed against a cluster of the store (its
/// ports in place of `kv cluster`'s 9001-9003): every line exits 0. The lines that run until
/// stopped (`watch`, `elect`) run for three seconds.
#[test]
fn the_etcdctl_lines_of_the_guide_work_as_printed() {
    if !etcdctl::available() {
        return;
    }
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/etcd.md")).unwrap();
    let block = doc
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let t = Target::store();
    let eps = t.endpoints();
    let mut script = String::from("set -e\n");
    for line in block.lines().filter(|l| !l.starts_with("cargo ")) {
        let mut line = line.replace("127.0.0.1:9001", &eps[0]);
        line = line
            .replace("127.0.0.1:9002", &eps[1])
            .replace("127.0.0.1:9003", &eps[2]);
        if line.contains(" watch ") || line.contains(" elect ") {
            let cmd = line.split('#').next().unwrap().trim().to_string();
            line = format!("timeout 3 {cmd} || [ $? = 124 ]");
        }
        script.push_str(&line);
        script.push('\n');
    }
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("holding my-lock/") && stdout.contains("compacted revision 5"),
        "{stdout}"
    );
}

/// Over TLS (the HTTP certificate, which names 127.0.0.1): a client that trusts the cluster CA
/// writes and reads at every node, so followers forward to the leader over TLS too.
#[test]
fn the_etcd_api_over_tls_serves_and_forwards_at_every_node() {
    let mut c = cluster::Cluster::prepare(3, &[]);
    let tls = c.tls();
    for (flag, file) in [("--http-cert", "http.pem"), ("--http-key", "http.key")] {
        c.args.push(flag.into());
        c.args.push(tls.join(file).display().to_string());
    }
    for id in 1..=3 {
        c.spawn(id);
    }
    let ca = std::fs::read(tls.join("ca.pem")).unwrap();
    let rt = compat::runtime();
    rt.block_on(async {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for id in 1..=3u64 {
            let ep = format!("https://127.0.0.1:{}", c.etcd_port(id));
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(ca.clone()));
            let opts = etcd_client::ConnectOptions::new().with_tls(tls);
            let key = format!("tls/{id}");
            loop {
                let put = async {
                    let mut cl =
                        etcd_client::Client::connect([ep.as_str()], Some(opts.clone())).await?;
                    cl.put(key.as_str(), "v", None).await?;
                    cl.get(key.as_str(), None).await
                };
                match put.await {
                    Ok(got) if got.kvs().len() == 1 => break,
                    other => {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "node {id} over TLS: {other:?}\n{}",
                            c.log_tail()
                        );
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                }
            }
        }
    });
    if !http_side::available() {
        return;
    }
    // The HTTP side over TLS, as curl negotiates it by ALPN: HTTP/1.1 and HTTP/2.
    let cacert = tls.join("ca.pem").display().to_string();
    for id in 1..=3u64 {
        let url = format!("https://127.0.0.1:{}/version", c.etcd_port(id));
        for proto in ["--http1.1", "--http2"] {
            let (code, body) = http_side::curl(&url, &["--cacert", &cacert, proto]);
            assert!(
                code == 200 && body.contains("\"etcdcluster\":\"3.4.0\""),
                "node {id} {proto}: {code} {body}"
            );
        }
    }
}

/// With follower read leases on, a follower serves linearizable ranges from its own state (no
/// forward): any member still reads every write acknowledged before it.
#[test]
fn any_member_reads_linearizably_with_follower_leases() {
    let t = Target::store_with(&["--follower-leases-ms", "120"]);
    compat::runtime().block_on(compat::any_member(&t));
}
