//! The etcd API's server on its listener: the five gRPC services and the HTTP side of the port
//! (`probes`), TLS with the HTTP certificate when given, and limits on what one client may hold
//! (connections: `conns`).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use slog::{info, Logger};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic::transport::Server;

use crate::etcd::api::{EtcdApi, KEY_ROOM_BYTES};
use crate::etcd::conns::{Limited, Limits};
use crate::etcd::forward::Forwarder;
use crate::etcd::probes;
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

/// How long a client's TLS handshake may take before its connection is closed.
const TLS_HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// Serve the etcd API on `listener` until `stop` turns true, from the moment the node is ready
/// (see [`ready`]); until then connections wait in the listener's queue. gRPC and HTTP
/// (`/version`, `/health`, `/metrics`: [`crate::etcd::probes`]) share the port as on etcd:
/// HTTP/1.1 or HTTP/2, plaintext or TLS with ALPN `h2` and `http/1.1`.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: Option<EtcdTls>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    log: Logger,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let acceptor = match &tls {
        Some(t) => Some(
            crate::tls::config::client_port_acceptor(&t.cert_pem, &t.key_pem)
                .map_err(|e| format!("etcd API TLS: {e}"))?,
        ),
        None => None,
    };
    let limits = crate::etcd::conns::Limits::new(
        app.limits.max_connections,
        app.limits.max_connections_per_ip,
        app.opts.unsafe_authority_as_sent,
    );
    let api = EtcdApi::new(app, Forwarder::new(tls.as_ref().map(|t| t.ca_pem.clone())));
    // As etcd: the port is bound from the start, but nothing is served until the member is
    // ready (it knows a live leader): a client waits, or goes on to another endpoint, instead
    // of getting "no leader" from a member that just started or joined.
    if !ready(&api, &mut stop).await {
        return Ok(());
    }
    info!(log, "etcd API listening"; "addr" => %addr, "tls" => tls.is_some());
    let incoming = accept(listener, limits, acceptor, stop.clone());
    let stopped = async move {
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .tcp_nodelay(true)
        .add_routes(routes(api))
        .serve_with_incoming_shutdown(incoming, stopped)
        .await
        .map_err(|e| format!("etcd API on {addr}: {e}"))
}

/// The five gRPC services and the HTTP side of the port.
fn routes(api: EtcdApi) -> Routes {
    // Past the request limit (`EtcdApi::check_size`, etcd's "request is too large") gRPC's own
    // limit stops a message before it is held whole: twice the limit.
    let app = api.app();
    let max_message = 2 * (app.limits.max_body_bytes + KEY_ROOM_BYTES);
    let grpc = Routes::new(PbKvServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbWatchServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbLeaseServer::new(api.clone()).max_decoding_message_size(max_message))
        .add_service(PbClusterServer::new(api.clone()))
        .add_service(PbMaintenanceServer::new(api.clone()));
    let (health_api, metrics_api) = (api.clone(), api);
    let http = axum::Router::new()
        .route(
            "/version",
            axum::routing::get(|| async { probes::version() }),
        )
        .route(
            "/health",
            axum::routing::get(move |uri: axum::http::Uri| {
                let api = health_api.clone();
                async move { probes::health(&api, uri.query()).await }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let api = metrics_api.clone();
                async move { probes::metrics(&api) }
            }),
        );
    let router = grpc
        .into_axum_router()
        .merge(http)
        .fallback(|req: axum::extract::Request| async move { probes::other(&req) });
    Routes::from(router)
}

/// Connections admitted by `limits`, after their TLS handshake when `acceptor` is given, until
/// `stop`. Handshakes run side by side, each bounded by [`TLS_HANDSHAKE_LIMIT`].
fn accept(
    listener: TcpListener,
    limits: Arc<Limits>,
    acceptor: Option<TlsAcceptor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> impl tokio_stream::Stream<Item = Result<Limited, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Limited>(64);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                _ = stop.changed() => return,
                conn = listener.accept() => conn,
            };
            // An accept error (a connection reset before it was taken, no fds left) ends no
            // listening: the next accept is tried.
            let Ok((io, _)) = conn else { continue };
            let _ = io.set_nodelay(true);
            let Some(conn) = limits.admit(io) else {
                continue;
            };
            let Some(acceptor) = acceptor.clone() else {
                if tx.send(conn).await.is_err() {
                    return;
                }
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let shaken = tokio::time::timeout(TLS_HANDSHAKE_LIMIT, conn.tls(&acceptor)).await;
                if let Ok(Ok(conn)) = shaken {
                    let _ = tx.send(conn).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}
