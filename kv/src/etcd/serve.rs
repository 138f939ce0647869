//! The etcd API's gRPC server on its listener: the five services, TLS with the HTTP
//! certificate when given, and limits on what one client may hold (connections: `conns`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use slog::{info, Logger};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::etcd::api::{EtcdApi, KEY_ROOM_BYTES};
use crate::etcd::forward::Forwarder;
use crate::node::app::App;

/// Streams (calls in flight) one connection may hold.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// The files of the API's TLS: the certificate and key it serves, the CA that signs the other
/// nodes' (for forwarding).
pub struct EtcdTls {
    /// Certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// Private key (PEM).
    pub key_pem: Vec<u8>,
    /// The CA of the other nodes' certificates (PEM).
    pub ca_pem: Vec<u8>,
}

/// Wait until this node leads group 0 or hears from its leader; `false` if `stop` came first.
async fn ready(api: &EtcdApi, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    loop {
        if *stop.borrow() {
            return false;
        }
        let (leads, leader) = api.group().leadership.get();
        if leads || api.app().live_leader(leader).is_some() {
            return true;
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

/// Serve the etcd API on `listener` until `stop` turns true, from the moment the node is ready
/// (see [`ready`]); until then connections wait in the listener's queue.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: Option<EtcdTls>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    log: Logger,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Past the request limit (`EtcdApi::check_size`, etcd's "request is too large") gRPC's own
    // limit stops a message before it is held whole: twice the limit.
    let max_message = 2 * (app.limits.max_body_bytes + KEY_ROOM_BYTES);
    let (max_connections, max_per_ip) = (
        app.limits.max_connections,
        app.limits.max_connections_per_ip,
    );
    let api = EtcdApi::new(app, Forwarder::new(tls.as_ref().map(|t| t.ca_pem.clone())));
    let mut server = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .tcp_nodelay(true);
    if let Some(t) = &tls {
        let identity = Identity::from_pem(&t.cert_pem, &t.key_pem);
        server = server
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(|e| format!("etcd API TLS: {e}"))?;
    }
    // As etcd: the port is bound from the start, but nothing is served until the member is
    // ready (it knows a live leader): a client waits, or goes on to another endpoint, instead
    // of getting "no leader" from a member that just started or joined.
    if !ready(&api, &mut stop).await {
        return Ok(());
    }
    info!(log, "etcd API listening"; "addr" => %addr, "tls" => tls.is_some());
    let router = server
        .add_service(PbKvServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbWatchServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbLeaseServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbClusterServer::new(api.clone()))
        .add_service(PbMaintenanceServer::new(api));
    let limits = crate::etcd::conns::Limits::new(max_connections, max_per_ip);
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(
        move |conn| match conn {
            Ok(io) => {
                let _ = io.set_nodelay(true);
                limits.admit(io).map(Ok::<_, std::io::Error>)
            }
            // An accept error (a connection reset before it was taken, no fds left) ends no
            // listening: the next accept is tried.
            Err(_) => None,
        },
    );
    let stopped = async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    router
        .serve_with_incoming_shutdown(incoming, stopped)
        .await
        .map_err(|e| format!("etcd API on {addr}: {e}"))
}
