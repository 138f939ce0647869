//! A small blocking HTTP/1.1 client for the node's own tools (`join`, `cluster`, `bench`): a
//! keep-alive [`Client`] for load, and one-shot [`request`]s that follow the cluster's 307
//! redirects to the leader.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A keep-alive connection: just enough for requests with a `Content-Length` answer.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
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
        let sa = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{addr}: no address")))?;
        let s = TcpStream::connect_timeout(&sa, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// One request on this connection.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> std::io::Result<Answer> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: kv\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.w.write_all(head.as_bytes())?;
        self.w.write_all(body)?;
        self.read_answer()
    }

    fn read_answer(&mut self) -> std::io::Result<Answer> {
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {line:?}")))?;
        let (mut len, mut location) = (0usize, None);
        loop {
            line.clear();
            self.r.read_line(&mut line)?;
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
        let mut body = vec![0; len];
        self.r.read_exact(&mut body)?;
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            location,
        })
    }
}

/// `http://host:port/path` → (`host:port`, `/path`).
pub fn split_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some((host.to_string(), format!("/{path}")))
}

/// One request to `addr`, following up to 5 redirects (307 keeps the method and the body).
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    let (mut addr, mut path) = (addr.to_string(), path.to_string());
    for _ in 0..5 {
        let mut c = Client::connect(&addr, Duration::from_secs(5))?;
        let a = c.request(method, &path, body, headers)?;
        match (a.status, a.location.as_deref().and_then(split_url)) {
            (307 | 308, Some((next_addr, next_path))) => (addr, path) = (next_addr, next_path),
            _ => return Ok(a),
        }
    }
    Err(std::io::Error::other("too many redirects"))
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
        assert_eq!(split_url("https://h:1/x"), None);
    }
}
