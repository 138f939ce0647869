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
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::etcd::authority::Rewriter;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Open connections, by client address.
pub struct Limits {
    max: usize,
    max_per_ip: usize,
    /// Whether bytes pass through untouched (no [`Rewriter`]: a negative control).
    as_sent: bool,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Limits {
    /// At most `max` connections, `max_per_ip` from one address.
    pub fn new(max: usize, max_per_ip: usize, as_sent: bool) -> Arc<Limits> {
        assert!(
            max > 0 && max_per_ip > 0,
            "limits need room for one connection"
        );
        Arc::new(Limits {
            max,
            max_per_ip,
            as_sent,
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
            io: Io::Plain(io),
            ip,
            limits: self.clone(),
            rewriter: if self.as_sent {
                Rewriter::passthrough()
            } else {
                Rewriter::default()
            },
            ready: Vec::new(),
            ready_at: 0,
        })
    }
}

/// A client connection, plain or after its TLS handshake.
enum Io {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS (ALPN `h2` or `http/1.1`).
    Tls(Box<TlsStream<TcpStream>>),
    /// Taken for a handshake that has not ended (never read or written).
    Taken,
}

/// An admitted connection; dropping it frees its place. What the client sends reaches the
/// server through a [`Rewriter`] (etcd's Go clients' `:authority` forms).
pub struct Limited {
    io: Io,
    ip: IpAddr,
    limits: Arc<Limits>,
    rewriter: Rewriter,
    /// Rewritten bytes the server has not read yet, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
}

impl Limited {
    /// This connection after a TLS handshake with `acceptor`; it keeps its place meanwhile,
    /// and frees it when the handshake fails.
    pub async fn tls(mut self, acceptor: &TlsAcceptor) -> io::Result<Limited> {
        let Io::Plain(tcp) = std::mem::replace(&mut self.io, Io::Taken) else {
            panic!("a connection to the etcd API upgraded to TLS twice");
        };
        let tls = acceptor.accept(tcp).await?;
        self.io = Io::Tls(Box::new(tls));
        Ok(self)
    }

    /// The connection's stream, to read or write.
    fn stream(&mut self) -> Pin<&mut (dyn AsyncReadWrite + Send)> {
        match &mut self.io {
            Io::Plain(tcp) => Pin::new(tcp),
            Io::Tls(tls) => Pin::new(tls.as_mut()),
            Io::Taken => panic!("a connection used during its TLS handshake"),
        }
    }
}

/// What a client stream does.
trait AsyncReadWrite: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> AsyncReadWrite for T {}

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
        match &self.io {
            Io::Plain(tcp) => tcp.connect_info(),
            Io::Tls(tls) => tls.get_ref().0.connect_info(),
            Io::Taken => panic!("a connection served during its TLS handshake"),
        }
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let me = &mut *self;
            if me.ready_at < me.ready.len() {
                let n = buf.remaining().min(me.ready.len() - me.ready_at);
                buf.put_slice(&me.ready[me.ready_at..me.ready_at + n]);
                me.ready_at += n;
                return Poll::Ready(Ok(()));
            }
            me.ready.clear();
            me.ready_at = 0;
            let mut raw = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut raw);
            match me.stream().poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if let Err(e) = me.rewriter.feed(filled, &mut me.ready) {
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
                other => return other,
            }
        }
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}
