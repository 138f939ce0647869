//! Dialing a peer: a TCP connection and, with TLS, a handshake that proves the peer is the node
//! it is asked for. The transport dials every peer this way, and `/admin/members` dials a node
//! before adding it, so a node whose certificate this cluster does not trust (another CA, another
//! id) is refused at once rather than added and then silently unreachable.

use std::time::Duration;

use thiserror::Error;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::tls::config::{peer_node_id, PeerTls};

/// TLS handshakes between peers must finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a TCP connect to a peer may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A dialed peer connection, ready to write frames to.
pub type PeerStream = Box<dyn AsyncWrite + Send + Unpin>;

/// Why a peer could not be dialed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum DialError {
    /// Nothing answered (no address, refused, timed out): the node may not run yet.
    #[error("{0}")]
    Unreachable(String),
    /// Something answered, but the TLS handshake failed or the certificate names another node:
    /// the two nodes' certificates are not of one cluster (another CA, or another id).
    #[error("{0}")]
    Untrusted(String),
}

impl DialError {
    /// A line for an operator: what failed, and for a certificate, what to check.
    pub fn explain(&self) -> String {
        match self {
            DialError::Unreachable(why) => why.clone(),
            DialError::Untrusted(why) => format!(
                "{why}: the two nodes do not trust each other's certificates; each must be signed \
                 by the cluster CA (--peer-ca, `kv certs` with the cluster's ca.key) and name its own id"
            ),
        }
    }
}

/// Dial node `peer` at `addr`; with `tls`, complete the handshake and check that the certificate
/// names `peer` (rustls checks the chain and the name; the id is checked once more, strictly).
pub async fn dial(peer: u64, addr: &str, tls: Option<&PeerTls>) -> Result<PeerStream, DialError> {
    let tcp = timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| DialError::Unreachable(format!("{addr}: connect timed out")))?
        .map_err(|e| DialError::Unreachable(format!("{addr}: {e}")))?;
    let _ = crate::base::limits::peer::tune(&tcp);
    let Some(tls) = tls else {
        return Ok(Box::new(tcp));
    };
    let stream = timeout(
        HANDSHAKE_TIMEOUT,
        tls.connector.connect(PeerTls::server_name(peer), tcp),
    )
    .await
    .map_err(|_| DialError::Unreachable(format!("{addr}: TLS handshake timed out")))?
    .map_err(|e| {
        let why = format!("{addr}: TLS handshake: {e}");
        // rustls's own refusals (a certificate, an alert) come as invalid data; a reset or an
        // end of stream from a node going down does not say its certificate is wrong.
        match e.kind() {
            std::io::ErrorKind::InvalidData => DialError::Untrusted(why),
            _ => DialError::Unreachable(why),
        }
    })?;
    match peer_node_id(stream.get_ref().1) {
        Some(id) if id == peer => Ok(Box::new(stream)),
        other => Err(DialError::Untrusted(format!(
            "{addr} presented node {other:?}, expected {peer}"
        ))),
    }
}
