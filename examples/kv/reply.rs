//! An HTTP answer: a status, a body (JSON unless said otherwise) and a few extra headers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{json, Value};

/// A response before it becomes a hyper `Response`.
pub struct Reply {
    pub status: u16,
    body: Bytes,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
}

/// A JSON reply.
pub fn reply(status: u16, body: Value) -> Reply {
    Reply {
        status,
        body: Bytes::from(body.to_string()),
        content_type: "application/json",
        headers: Vec::new(),
    }
}

/// A JSON error: `{"error": what, "detail": detail}`.
pub fn error(status: u16, what: &str, detail: impl Into<String>) -> Reply {
    reply(status, json!({"error": what, "detail": detail.into()}))
}

impl Reply {
    /// Any body with its content type.
    pub fn raw(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type,
            headers: Vec::new(),
        }
    }

    /// Add a header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    /// The hyper response.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut b = Response::builder()
            .status(self.status)
            .header("content-type", self.content_type);
        for (name, value) in &self.headers {
            b = b.header(*name, value.as_str());
        }
        b.body(Full::new(self.body)).unwrap_or_else(|_| {
            let mut r = Response::new(Full::new(Bytes::from_static(b"bad response header")));
            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            r
        })
    }
}
