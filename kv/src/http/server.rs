//! The HTTP front end: hyper on tokio, HTTP/1.1, optionally over TLS, within `HttpLimits`.
//!
//! Nothing a client does holds a worker: requests are async; a body slower than the minimum rate
//! gets 408; a head that arrives too slowly (or an idle keep-alive connection) is closed; and a
//! full connection table (or an address over its share) closes the connection that matters least
//! to let a newcomer in (see `base::conns`). Malformed requests get the JSON error shape (see
//! `errors`). The accept loop stops as soon as the node begins to stop; connections then
//! finish the request in hand. After a connection moves a byte it polls for the next request
//! for `--http-spin-us` before it waits on the reactor (see `spin_io`).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slog::{warn, Logger};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::base::conns::{Admission, Guard, Phase};
use crate::base::limits::HANDSHAKE_TIMEOUT;
use crate::http::errors::{HeadRequest, ShapedIo};
use crate::http::spin_io::SpinIo;
use crate::node::app::App;

/// Accept connections until `stop` changes.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    mut stop: watch::Receiver<bool>,
    log: Logger,
) {
    let table = app.conns.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close; never give up.
                app.metrics.http_accept_errors.inc();
                warn!(log, "HTTP accept failed; retrying"; "error" => %e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match table.admit(remote.ip()) {
            None => app.metrics.http_refused.inc(), // dropping `tcp` refuses it
            Some((guard, how)) => {
                if let Admission::Evicted(_) = how {
                    app.metrics.http_evicted.inc();
                }
                app.metrics.http_open.set(table.len() as u64);
                tokio::spawn(connection(
                    tcp,
                    guard,
                    tls.clone(),
                    app.clone(),
                    stop.clone(),
                ));
            }
        }
    }
}

async fn connection(
    tcp: TcpStream,
    guard: Guard,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    stop: watch::Receiver<bool>,
) {
    let _ = tcp.set_nodelay(true);
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let table = app.conns.clone();
    let crowded = Box::new(move || table.len() > workers);
    let tcp = SpinIo::new(tcp, app.limits.spin(), crowded);
    let slot = guard.slot.clone();
    let guard = Arc::new(guard);
    let served = async {
        match tls {
            None => serve_io(tcp, guard, app.clone(), stop).await,
            Some(acceptor) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => serve_io(stream, guard, app.clone(), stop).await,
                    _ => app.metrics.http_tls_failures.inc(),
                }
            }
        }
    };
    tokio::select! {
        _ = served => {}
        _ = slot.close.notified() => {}
    }
}

async fn serve_io<I>(io: I, guard: Arc<Guard>, app: Arc<App>, mut stop: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head_request = HeadRequest::default();
    let svc_app = app.clone();
    let flag = head_request.clone();
    let svc = service_fn(move |rq: hyper::Request<hyper::body::Incoming>| {
        let (app, guard, flag) = (svc_app.clone(), guard.clone(), flag.clone());
        async move {
            flag.store(rq.method() == hyper::Method::HEAD, Ordering::Release);
            let r = crate::http::routes::handle(rq, &app, &guard).await;
            guard.set(Phase::Idle);
            Ok::<_, Infallible>(r)
        }
    });
    let limits = &app.limits;
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout())
        .max_buf_size(limits.max_header_bytes)
        .writev(false)
        .serve_connection(TokioIo::new(ShapedIo::new(io, head_request)), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.changed() => {}
    }
    // Stopping: finish the request in hand (its answer may be 503 shutting_down), then close.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
}
