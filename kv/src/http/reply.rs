//! An HTTP answer: a status, a body (JSON unless said otherwise) and a few extra headers.
//!
//! Every error, on every route, has one shape: `{"error": code, "detail": text}`, with a few more
//! fields where they help (`leader_id` on `not_leader`, say). hyper's own answers to malformed
//! requests are given the same shape by `errors`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{json, Value};

/// A response before it becomes a hyper `Response`.
pub struct Reply {
    /// The HTTP status.
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

/// A JSON error: `{"error": code, "detail": detail}`.
pub fn error(status: u16, code: &str, detail: impl Into<String>) -> Reply {
    error_with(status, code, detail, json!({}))
}

/// A JSON error with more fields (an object's fields are added to `error` and `detail`).
pub fn error_with(status: u16, code: &str, detail: impl Into<String>, more: Value) -> Reply {
    debug_assert!(status >= 300, "an error with status {status}");
    let mut body = json!({"error": code, "detail": detail.into()});
    if let (Some(b), Value::Object(m)) = (body.as_object_mut(), more) {
        for (k, v) in m {
            b.entry(k).or_insert(v);
        }
    }
    reply(status, body)
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
            let body = json!({"error": "bad_response", "detail": "a response header was invalid"});
            let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            r.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        })
    }
}
