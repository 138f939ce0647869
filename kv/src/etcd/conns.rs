//! Connections to the etcd API's port, bounded as the HTTP port's are: at most
//! `--http-max-connections` open, `--http-max-connections-per-ip` from one address; a newcomer
//! past either is closed at once (a gRPC connection is long-lived and multiplexed, so none is
//! evicted to make room). Many idle connections slow nobody else and never stop the node.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections, by client address.
pub struct Limits {
    max: usize,
    max_per_ip: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Limits {
    /// At most `max` connections, `max_per_ip` from one address.
    pub fn new(max: usize, max_per_ip: usize) -> Arc<Limits> {
        assert!(
            max > 0 && max_per_ip > 0,
            "limits need room for one connection"
        );
        Arc::new(Limits {
            max,
            max_per_ip,
            open: Mutex::default(),
        })
    }

    /// `io` admitted, or `None` (it is dropped, so closed) past a limit.
    pub fn admit(self: &Arc<Self>, io: TcpStream) -> Option<Limited> {
        let ip = io.peer_addr().ok()?.ip();
        let mut open = self.open.lock();
        let (total, by_ip) = &mut *open;
        let from_ip = by_ip.entry(ip).or_insert(0);
        if *total >= self.max || *from_ip >= self.max_per_ip {
            return None;
        }
        *total += 1;
        *from_ip += 1;
        Some(Limited {
            io,
            ip,
            limits: self.clone(),
        })
    }
}

/// An admitted connection; dropping it frees its place.
pub struct Limited {
    io: TcpStream,
    ip: IpAddr,
    limits: Arc<Limits>,
}

impl Drop for Limited {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock();
        let (total, by_ip) = &mut *open;
        assert!(*total > 0, "a connection freed twice");
        *total -= 1;
        if let Some(n) = by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&self.ip);
            }
        }
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
