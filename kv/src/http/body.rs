//! Request bodies: read within the limits (size, minimum rate, timeout), and JSON bodies.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use crate::base::conns::Phase;
use crate::base::limits::BODY_GRACE;
use crate::http::ctx::Ctx;
use crate::http::reply::{error, Reply};

/// Largest JSON body (sessions, admin).
pub const MAX_JSON_BYTES: usize = 64 << 10;

/// Read the whole body: at most `limit` bytes (413); no slower than the minimum rate after the
/// grace, and within the body timeout (408).
pub async fn read_body(mut body: Incoming, limit: usize, c: &Ctx<'_>) -> Result<Vec<u8>, Reply> {
    let limits = &c.app.limits;
    let too_large = || error(413, "too_large", format!("body over {limit} bytes"));
    let hint = hyper::body::Body::size_hint(&body);
    if hint.lower() > limit as u64 {
        return Err(too_large());
    }
    c.conn.set(Phase::Body);
    let start = tokio::time::Instant::now();
    let (hard, rate) = (
        start + limits.body_timeout(),
        limits.min_body_bytes_per_s as f64,
    );
    let mut buf = Vec::with_capacity((hint.lower() as usize).min(limit));
    loop {
        let due = BODY_GRACE.as_secs_f64() + (buf.len() + 1) as f64 / rate;
        let deadline = hard.min(start + Duration::from_secs_f64(due));
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                let detail = format!(
                    "the body arrived slower than {} bytes/s, or not within {} ms",
                    limits.min_body_bytes_per_s, limits.body_timeout_ms
                );
                return Err(error(408, "body_timeout", detail));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(error(400, "bad_body", e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
            c.conn.body_bytes(data.len() as u64);
        }
    }
    c.conn.set(Phase::Waiting);
    Ok(buf)
}

/// A JSON body of at most [`MAX_JSON_BYTES`]; `expected` shows its shape (`{"ttl_ms": N}`) in the
/// 400 `bad_json` that a body which is not JSON gets.
pub async fn json_body(body: Incoming, c: &Ctx<'_>, expected: &str) -> Result<Value, Reply> {
    let b: Vec<u8> = read_body(body, MAX_JSON_BYTES.min(c.app.limits.max_body_bytes), c).await?;
    serde_json::from_slice(&b).map_err(|e| {
        let detail = format!("the body is not valid JSON ({e}); expected {expected}");
        error(400, "bad_json", detail)
    })
}
