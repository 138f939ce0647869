//! An attacker's tool: forged raft messages, framed as the peer port expects, sent over raw TCP
//! or TLS with no client certificate, a certificate from another CA, or a member's certificate.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use raft::eraftpb::{Entry, Message, MessageType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::cluster::Cluster;

/// What the attacker connects with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cred {
    /// Plaintext TCP (what `--insecure-peers` speaks).
    Plain,
    /// TLS that trusts the cluster CA but presents no certificate.
    NoCert,
    /// TLS with a node certificate signed by another CA.
    ForeignCa,
    /// TLS with member `id`'s real certificate (a member may only speak as itself).
    Member(u64),
}

/// One frame holding `msg` alone in a node batch, as raft group 0's (the group of a store of
/// one group).
pub fn frame(msg: &Message) -> Vec<u8> {
    let bytes = raft_lease::multi::wire::encode(&raft_lease::multi::NodeBatch {
        from: msg.from,
        to: msg.to,
        raft: vec![(0, msg.clone())],
        ..Default::default()
    });
    let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
    out.push(1); // the message's final (only) frame
    out.extend_from_slice(&bytes);
    out
}

pub fn msg(t: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut m = Message {
        from,
        to,
        term,
        ..Default::default()
    };
    m.set_msg_type(t);
    m
}

/// A proposal carrying a `Put` of `key`, as the KV encodes commands in entries.
pub fn propose_put(from: u64, to: u64, key: &str) -> Message {
    let header =
        serde_json::json!({"op": "put", "req": 0, "key": key, "session": null, "fence": null});
    let header = serde_json::to_vec(&header).unwrap();
    let mut data = (header.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(&header);
    data.extend_from_slice(b"forged");
    let mut m = msg(MessageType::MsgPropose, from, to, 0);
    m.mut_entries().push(Entry {
        data: data.into(),
        ..Default::default()
    });
    m
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

pub fn client_config(ca: &Path, client: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca) {
        roots.add(c).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_file(key).unwrap())
            .unwrap(),
    })
}

/// A connection to node `to`'s peer port. TLS handshakes that the node refuses may still look
/// complete here (TLS 1.3 checks the client certificate last): the node drops what follows.
pub fn connect(c: &Cluster, to: u64, cred: Cred) -> std::io::Result<Box<dyn Write + Send>> {
    let tcp = TcpStream::connect(("127.0.0.1", c.peer_port(to)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(2)))?;
    tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
    let tls = c.tls();
    let config = match cred {
        Cred::Plain => return Ok(Box::new(tcp)),
        Cred::NoCert => client_config(&tls.join("ca.pem"), None),
        Cred::ForeignCa => {
            let other = c.data.join("foreign-ca");
            if !other.join("node-1.pem").exists() {
                crate::cluster::make_certs(&other, &[1, 2, 3]);
            }
            let (cert, key) = (other.join("node-1.pem"), other.join("node-1.key"));
            client_config(&tls.join("ca.pem"), Some((&cert, &key)))
        }
        Cred::Member(id) => {
            let cert = tls.join(format!("node-{id}.pem"));
            let key = tls.join(format!("node-{id}.key"));
            client_config(&tls.join("ca.pem"), Some((&cert, &key)))
        }
    };
    let name = ServerName::try_from(format!("node-{to}.raft-lease")).unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
    let mut tcp = tcp;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
}

/// Send `msgs` to node `to` over a fresh connection; whether the bytes could be written.
pub fn send(c: &Cluster, to: u64, cred: Cred, msgs: &[Message]) -> bool {
    let Ok(mut w) = connect(c, to, cred) else {
        return false;
    };
    msgs.iter()
        .try_for_each(|m| w.write_all(&frame(m)))
        .and_then(|_| w.flush())
        .is_ok()
}

/// Send the node batch `batch` (encoded whole, in one frame) to node `to` over a fresh
/// connection; whether the bytes could be written.
pub fn send_batch(c: &Cluster, to: u64, cred: Cred, batch: &raft_lease::multi::NodeBatch) -> bool {
    let Ok(mut w) = connect(c, to, cred) else {
        return false;
    };
    let bytes = raft_lease::multi::wire::encode(batch);
    let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
    out.push(1);
    out.extend_from_slice(&bytes);
    w.write_all(&out).and_then(|_| w.flush()).is_ok()
}

/// Heartbeat acknowledgement contexts: a follower's acknowledgement with the promise it made
/// (25 bytes), one claiming an absurd promise, an older build's bare context, and garbage.
pub fn ack_contexts() -> Vec<Vec<u8>> {
    use raft_lease::ctx::{LayerCtx, Promised};
    let promised = |promise_ns, drift_ppm| Promised {
        promise_ns,
        drift_ppm,
    };
    let ack = LayerCtx::Round(1).encode_ack(promised(300_000_000, 100_000));
    let mut odd_kind = ack.clone();
    odd_kind[12] = b'x';
    vec![
        ack.clone(),
        LayerCtx::Round(u64::MAX).encode_ack(promised(u64::MAX, u32::MAX)),
        LayerCtx::Read(1).encode_ack(promised(0, 0)),
        LayerCtx::Round(2).encode(),
        odd_kind,
        ack[..24].to_vec(),
        [ack, vec![0]].concat(),
        vec![0xa5; 25],
        vec![0xff; 64 << 10],
    ]
}

/// One HTTPS request to 127.0.0.1:`port` with the admin token, trusting the cluster CA;
/// (status, body as text).
pub fn https_admin(
    c: &Cluster,
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, String)> {
    let config = client_config(&c.tls().join("ca.pem"), None);
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).ok()?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\
         Authorization: Bearer {}\r\n\r\n",
        body.len(),
        crate::cluster::TOKEN
    );
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    crate::cluster::read_response(&mut s)
        .map(|(code, b)| (code, String::from_utf8_lossy(&b).into_owned()))
}
