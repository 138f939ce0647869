//! One error shape for malformed HTTP too. hyper answers a request it cannot parse by itself
//! (400, 414 or 431 with an empty body; no hook changes that), so the connection's writes go
//! through [`ShapedIo`], which replaces exactly those answers with the JSON error every route
//! gives: `{"error": code, "detail": text}`.
//!
//! It tells hyper's own answers from the service's by their head: every response the service
//! makes has a `content-type`, and hyper's automatic error responses have none. It follows the
//! responses' framing (`content-length`) so that it only ever looks at heads, never at a body.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest response head looked at; a longer one passes through as it is.
const MAX_HEAD: usize = 64 << 10;
/// Bytes buffered here before a write waits for the socket.
const MAX_BUFFERED: usize = 64 << 10;

/// Set by the service while it answers a HEAD request, whose response has no body.
pub type HeadRequest = Arc<AtomicBool>;

enum Out {
    /// Collecting a response head.
    Head(Vec<u8>),
    /// Passing this many body bytes through.
    Body(u64),
}

/// A connection whose hyper-made error responses get the JSON error shape.
pub struct ShapedIo<I> {
    inner: I,
    out: Vec<u8>,
    state: Out,
    head_request: HeadRequest,
}

impl<I> ShapedIo<I> {
    /// Wrap `inner`; the service sets `head_request` while answering a HEAD request.
    pub fn new(inner: I, head_request: HeadRequest) -> Self {
        ShapedIo {
            inner,
            out: Vec::new(),
            state: Out::Head(Vec::new()),
            head_request,
        }
    }

    /// Take all of `buf` into the output, rewriting heads of hyper's error responses.
    fn consume(&mut self, buf: &[u8]) {
        let mut i = 0;
        while i < buf.len() {
            match &mut self.state {
                Out::Body(0) => self.state = Out::Head(Vec::new()),
                Out::Body(rem) => {
                    let take = (*rem).min((buf.len() - i) as u64) as usize;
                    self.out.extend_from_slice(&buf[i..i + take]);
                    *rem -= take as u64;
                    i += take;
                }
                Out::Head(head) => {
                    head.push(buf[i]);
                    i += 1;
                    if head.ends_with(b"\r\n\r\n") || head.len() >= MAX_HEAD {
                        let head = std::mem::take(head);
                        let no_body = self.head_request.swap(false, Ordering::AcqRel);
                        let (bytes, body) = shape(head, no_body);
                        self.out.extend_from_slice(&bytes);
                        self.state = Out::Body(body);
                    }
                }
            }
        }
    }
}

/// The head as it goes out, and how many body bytes follow it.
fn shape(head: Vec<u8>, no_body: bool) -> (Vec<u8>, u64) {
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let length = header("content-length:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if status < 400 || header("content-type:").is_some() || !head.ends_with(b"\r\n\r\n") {
        return (head, if no_body { 0 } else { length });
    }
    let (code, detail) = match status {
        431 => ("header_too_large", "the request head is over the limit"),
        414 => ("uri_too_long", "the request URI is over the limit"),
        _ => ("bad_request", "malformed HTTP request"),
    };
    let body = serde_json::json!({"error": code, "detail": detail}).to_string();
    let reason = hyper::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    (out.into_bytes(), 0)
}

impl<I: AsyncWrite + Unpin> ShapedIo<I> {
    /// Write out what is buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for ShapedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ShapedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.out.len() >= MAX_BUFFERED {
            ready!(self.poll_drain(cx))?;
        }
        self.consume(buf);
        if let Poll::Ready(Err(e)) = self.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(responses: &[&[u8]], head_request: bool) -> Vec<u8> {
        let flag = HeadRequest::default();
        let mut io = ShapedIo::new(Vec::<u8>::new(), flag.clone());
        for r in responses {
            flag.store(head_request, Ordering::Release);
            // Fed a byte at a time: heads may arrive in any number of writes.
            for b in r.chunks(1) {
                io.consume(b);
            }
        }
        io.out
    }

    #[test]
    fn hypers_empty_error_responses_get_the_json_shape_and_nothing_else_changes() {
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 25\r\n\r\n\
                     HTTP/1.1 400 x\r\n\r\n1234567";
        let hypers = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = run(&[ours, hypers], false);
        let text = String::from_utf8(out).unwrap();
        let (first, second) = text.split_at(ours.len());
        assert_eq!(
            first.as_bytes(),
            ours,
            "a body that looks like a head is a body"
        );
        assert!(second.starts_with("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json"));
        let body = second.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (v["error"].as_str(), v["detail"].is_string()),
            (Some("bad_request"), true)
        );
        let big = run(
            &[b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n"],
            false,
        );
        assert!(String::from_utf8(big).unwrap().contains("header_too_large"));
        // A HEAD response carries a content-length but no body: the next head is a head.
        let head = b"HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n";
        let out = run(&[head, hypers], true);
        assert!(String::from_utf8(out).unwrap().contains("\"bad_request\""));
        // Success and interim responses pass as they are.
        let ok = b"HTTP/1.1 100 Continue\r\n\r\n";
        assert_eq!(run(&[ok], false), ok);
    }
}
