//! A small blocking HTTP/1.1 client for the node's own tools (`join`, `cluster`, `bench`): a
//! keep-alive [`Client`] for load, and one-shot [`request`]s that follow the cluster's 307
//! redirects to the leader.

use std::io::{BufRead, BufReader, Write};
use std::mem::MaybeUninit;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use socket2::SockRef;

use crate::tls::config::https_client;

/// A spinning client whose polls are further apart than this lost its CPU to other work.
const MAX_POLL_GAP: Duration = Duration::from_micros(20);

/// A keep-alive connection: just enough for requests with a `Content-Length` answer.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
    /// How long to poll for an answer before blocking on it.
    spin: Duration,
}

/// An answer: status, body, and the `Location` header if any.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// The body, as text (lossy).
    pub body: String,
    /// The `Location` header.
    pub location: Option<String>,
}

impl Client {
    /// Connect to `addr` (`host:port`).
    pub fn connect(addr: &str, timeout: Duration) -> std::io::Result<Client> {
        let s = connect_tcp(addr, timeout)?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
            spin: Duration::ZERO,
        })
    }

    /// Poll for each answer for up to `spin` before blocking on it (zero: block at once). On an
    /// idle machine a thread blocked in `read` lets its CPU halt, and waking it costs tens of
    /// microseconds; a short spin trades that CPU time for latency, as `read_bench`'s clients do. (It polls without
    /// `sched_yield`: on a busy machine that queued the spinner behind other work, 10 µs slower.)
    pub fn spin(mut self, spin: Duration) -> Client {
        self.spin = spin;
        self
    }

    /// One request on this connection.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> std::io::Result<Answer> {
        let head = request_head(method, path, body.len(), headers);
        self.w.write_all(head.as_bytes())?;
        self.w.write_all(body)?;
        self.await_answer();
        self.read_answer()
    }

    /// Spin until the answer's first byte is here or `spin` has passed. A spin that
    /// loses its CPU for a while stops: that CPU is busy and will not halt, and a blocked thread
    /// is woken ahead of the other work, where a spinning one waits behind it.
    fn await_answer(&self) {
        if self.spin.is_zero() || !self.r.buffer().is_empty() {
            return;
        }
        let start = Instant::now();
        let mut polled_at = start;
        let mut byte = [MaybeUninit::<u8>::uninit()];
        let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT;
        loop {
            match SockRef::from(&self.w).recv_with_flags(&mut byte, flags) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                _ => return, // a byte, the end, or an error: the blocking read takes it from here
            }
            let now = Instant::now();
            if now - start >= self.spin || now - polled_at > MAX_POLL_GAP {
                return;
            }
            polled_at = now;
        }
    }

    fn read_answer(&mut self) -> std::io::Result<Answer> {
        parse_answer(&mut self.r)
    }
}

/// A request's line and headers, with its `Content-Length`.
fn request_head(method: &str, path: &str, body_len: usize, headers: &[(&str, &str)]) -> String {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: kv\r\nContent-Length: {body_len}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The longest answer body read: what the node's tools ask for is far smaller, and a
/// `Content-Length` is a claim, not a budget.
const MAX_ANSWER_BYTES: usize = 16 << 20;
/// The longest line of an answer's head.
const MAX_HEAD_LINE_BYTES: u64 = 64 << 10;

/// One line of an answer's head into `line`, refused past [`MAX_HEAD_LINE_BYTES`].
fn read_head_line<R: BufRead>(r: &mut R, line: &mut String) -> std::io::Result<()> {
    let n = std::io::Read::take(&mut *r, MAX_HEAD_LINE_BYTES).read_line(line)?;
    if n as u64 == MAX_HEAD_LINE_BYTES && !line.ends_with('\n') {
        return Err(std::io::Error::other("an answer header line past 64 KiB"));
    }
    Ok(())
}

/// An answer with a `Content-Length` (or none), read from `r`.
fn parse_answer(r: &mut impl BufRead) -> std::io::Result<Answer> {
    let mut line = String::new();
    read_head_line(r, &mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {line:?}")))?;
    let (mut len, mut location) = (0usize, None);
    for n in 0.. {
        if n == 256 {
            return Err(std::io::Error::other(
                "an answer with over 256 header lines",
            ));
        }
        line.clear();
        read_head_line(r, &mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("location:") {
            location = Some(line[9..].trim().to_string());
        }
    }
    if len > MAX_ANSWER_BYTES {
        let why = format!("an answer of {len} bytes, past {MAX_ANSWER_BYTES}");
        return Err(std::io::Error::other(why));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        location,
    })
}

/// A TCP connection to `addr` (`host:port`), with `timeout` on connecting, reads and writes.
fn connect_tcp(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr}: no address")))?;
    let s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// One `GET` over HTTPS to `addr` (`host:port`, the host as the server's certificate names it),
/// trusting the CA certificates in the PEM file `ca`; redirects are not followed.
pub fn get_tls(addr: &str, path: &str, ca: &Path, timeout: Duration) -> std::io::Result<Answer> {
    let config = https_client(ca).map_err(std::io::Error::other)?;
    once_tls(&config, addr, "GET", path, b"", &[], timeout)
}

/// One request over HTTPS on a connection of its own.
fn once_tls(
    config: &Arc<ClientConfig>,
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Answer> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(std::io::Error::other)?;
    let conn =
        rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, connect_tcp(addr, timeout)?);
    let close = [("Connection", "close")];
    let head = request_head(method, path, body.len(), &[&close[..], headers].concat());
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    parse_answer(&mut BufReader::new(s))
}

/// `http://host:port/path` or `https://host:port/path` → (`host:port`, `/path`).
pub fn split_url(url: &str) -> Option<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some((host.to_string(), format!("/{path}")))
}

/// How the node's own tools reach the nodes' HTTP front ends: plain HTTP (the default), or
/// HTTPS trusting one CA. A cluster's nodes all serve one or the other, so a redirect is
/// followed with the same.
#[derive(Clone, Default)]
pub struct Dialer {
    https: Option<Arc<ClientConfig>>,
}

impl Dialer {
    /// HTTPS, trusting the CA certificates in the PEM file `ca`.
    pub fn https(ca: &Path) -> Result<Dialer, crate::tls::config::TlsError> {
        Ok(Dialer {
            https: Some(https_client(ca)?),
        })
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.https.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// One request to `addr`, following up to 5 redirects (307 keeps the method and the body).
    pub fn request(
        &self,
        addr: &str,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> std::io::Result<Answer> {
        let timeout = Duration::from_secs(5);
        let (mut addr, mut path) = (addr.to_string(), path.to_string());
        for _ in 0..5 {
            let a = match &self.https {
                Some(config) => once_tls(config, &addr, method, &path, body, headers, timeout)?,
                None => Client::connect(&addr, timeout)?.request(method, &path, body, headers)?,
            };
            match (a.status, a.location.as_deref().and_then(split_url)) {
                (307 | 308, Some((next_addr, next_path))) => (addr, path) = (next_addr, next_path),
                _ => return Ok(a),
            }
        }
        Err(std::io::Error::other("too many redirects"))
    }
}

/// One plain HTTP request to `addr`, following up to 5 redirects (see [`Dialer::request`]).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    Dialer::default().request(addr, method, path, body, headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_address_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:8001/kv/a?read=lease"),
            Some(("127.0.0.1:8001".into(), "/kv/a?read=lease".into()))
        );
        assert_eq!(split_url("http://h:1"), Some(("h:1".into(), "/".into())));
        assert_eq!(
            split_url("https://h:1/x"),
            Some(("h:1".into(), "/x".into()))
        );
        assert_eq!(split_url("ftp://h:1/x"), None);
    }

    #[test]
    fn an_answer_is_read_only_within_its_bounds() {
        let parse = |text: String| parse_answer(&mut std::io::Cursor::new(text.into_bytes()));
        let ok = parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi".into()).unwrap();
        assert_eq!((ok.status, ok.body.as_str()), (200, "hi"));
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            u64::MAX / 2
        );
        let e = parse(huge).unwrap_err().to_string();
        assert!(
            e.contains("past"),
            "a Content-Length is a claim, not a budget: {e}"
        );
        let long = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(100 << 10));
        assert!(parse(long).unwrap_err().to_string().contains("64 KiB"));
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "X: y\r\n".repeat(300));
        assert!(parse(many)
            .unwrap_err()
            .to_string()
            .contains("256 header lines"));
    }

    #[test]
    fn a_spinning_client_reads_the_same_answers_as_a_blocking_one() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                for answer in ["one", "second"] {
                    let mut line = String::new();
                    while line != "\r\n" {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                    }
                    let text = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    w.write_all(text.as_bytes()).unwrap();
                }
            }
        });
        for spin in [Duration::ZERO, Duration::from_secs(10)] {
            let mut c = Client::connect(&addr, Duration::from_secs(5))
                .unwrap()
                .spin(spin);
            let bodies: Vec<String> = (0..2)
                .map(|_| c.request("GET", "/", b"", &[]).unwrap().body)
                .collect();
            assert_eq!(bodies, ["one", "second"], "spin {spin:?}");
        }
        server.join().unwrap();
    }
}
