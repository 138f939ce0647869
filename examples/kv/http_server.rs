//! The HTTP front end: hyper on tokio, HTTP/1.1, optionally over TLS, within `HttpLimits`.
//!
//! Nothing a client does holds a worker: requests are async, a body that arrives too slowly gets
//! 408, a head that arrives too slowly (or an idle keep-alive connection) is closed, and a full
//! connection table closes its oldest idle connection to let a new client in.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slog::{warn, Logger};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::conns::{ConnGuard, ConnTable};
use crate::limits::{HttpLimits, HANDSHAKE_TIMEOUT};
use crate::server::Shared;

/// Accept connections until the runtime is shut down.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    limits: Arc<HttpLimits>,
    log: Logger,
) {
    let table = ConnTable::new(limits.max_connections, shared.metrics.clone());
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close; never give up.
                shared.metrics.http_accept_errors.inc();
                warn!(log, "HTTP accept failed; retrying"; "error" => %e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(guard) = table.admit() else {
            continue; // full of busy connections: dropping `tcp` refuses this one
        };
        tokio::spawn(connection(
            tcp,
            guard,
            tls.clone(),
            shared.clone(),
            limits.clone(),
        ));
    }
}

async fn connection(
    tcp: TcpStream,
    guard: ConnGuard,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    limits: Arc<HttpLimits>,
) {
    let _ = tcp.set_nodelay(true);
    let close = guard.close.clone();
    let guard = Arc::new(guard);
    let served = async {
        match tls {
            None => serve_io(tcp, guard, shared, limits).await,
            Some(acceptor) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => serve_io(stream, guard, shared, limits).await,
                    _ => shared.metrics.http_tls_failures.inc(),
                }
            }
        }
    };
    tokio::select! {
        _ = served => {}
        _ = close.notified() => {}
    }
}

async fn serve_io<I>(io: I, guard: Arc<ConnGuard>, shared: Arc<Shared>, limits: Arc<HttpLimits>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc_limits = limits.clone();
    let svc = service_fn(move |rq| {
        let busy = guard.busy();
        let (shared, limits) = (shared.clone(), svc_limits.clone());
        async move {
            let r = crate::http::handle(rq, shared, limits).await;
            drop(busy);
            Ok::<_, Infallible>(r)
        }
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout())
        .max_buf_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}
