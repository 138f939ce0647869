//! Fault injection over HTTP (`/admin/...`): only with `--fault-injection`, and only for a
//! request that carries the node's admin token (`Authorization: Bearer <token>`).

use std::fmt;
use std::path::Path;

use hyper::HeaderMap;
use serde_json::{json, Value};

use crate::reply::{error, reply, Reply};
use crate::server::{Request, Shared};

/// Shortest admin token accepted.
const MIN_TOKEN_CHARS: usize = 16;

/// The admin bearer token. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// Read a token from a file (surrounding whitespace ignored).
    pub fn from_file(path: &Path) -> Result<AdminToken, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--admin-token-file {}: {e}", path.display()))?;
        Self::new(text.trim())
    }

    /// A token of printable ASCII, at least 16 characters.
    pub fn new(token: &str) -> Result<AdminToken, String> {
        if token.len() < MIN_TOKEN_CHARS || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the admin token must be at least {MIN_TOKEN_CHARS} printable ASCII characters"
            ));
        }
        Ok(AdminToken(token.to_string()))
    }

    /// A fresh random token (32 bytes from the OS, hex).
    pub fn generate() -> std::io::Result<AdminToken> {
        use std::io::Read as _;
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(AdminToken(
            bytes.iter().map(|b| format!("{b:02x}")).collect(),
        ))
    }

    /// The token's text (to write it to a file).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is the token, in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let want = self.0.as_bytes();
        want.len() == presented.len()
            && want
                .iter()
                .zip(presented)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Fault injection must be on, and the request must carry the token.
pub fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), Reply> {
    let Some(token) = shared
        .opts
        .admin_token
        .as_ref()
        .filter(|_| shared.opts.fault_injection)
    else {
        return Err(error(
            404,
            "fault_injection_disabled",
            "start the node with --fault-injection and --admin-token-file",
        ));
    };
    let presented = headers
        .get("authorization")
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if presented.is_some_and(|p| token.matches(p)) {
        return Ok(());
    }
    shared.metrics.admin_denied.inc();
    Err(error(
        401,
        "unauthorized",
        "/admin needs Authorization: Bearer <token>",
    )
    .with_header("www-authenticate", "Bearer"))
}

/// `/admin/<what>` with a JSON body.
pub fn route(shared: &Shared, what: &str, body: Value) -> Result<Reply, Reply> {
    Ok(match what {
        "partition" => {
            let peers = body
                .get("peers")
                .and_then(Value::as_array)
                .ok_or_else(|| error(400, "bad_json", "expected {\"peers\": [N, ...]}"))?;
            shared
                .blocked
                .write()
                .extend(peers.iter().filter_map(Value::as_u64));
            reply(200, json!({"blocked": *shared.blocked.read()}))
        }
        "heal" => {
            shared.blocked.write().clear();
            reply(200, json!({"blocked": []}))
        }
        "clock" => {
            let rate = body
                .get("rate")
                .and_then(Value::as_f64)
                .ok_or_else(|| error(400, "bad_json", "expected {\"rate\": F}"))?;
            shared
                .clock
                .set_rate(rate)
                .map_err(|e| error(400, "bad_rate", e))?;
            reply(200, json!({"rate": rate}))
        }
        "transfer" => {
            let to = body
                .get("to")
                .and_then(Value::as_u64)
                .ok_or_else(|| error(400, "bad_json", "expected {\"to\": N}"))?;
            shared
                .requests
                .try_send(Request::Transfer { to })
                .map_err(|_| error(503, "overloaded", "the raft thread's queue is full"))?;
            reply(200, json!({"transfer_to": to}))
        }
        _ => error(404, "not_found", format!("no admin action {what}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_matches_and_debug_hides_it() {
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b""));
        assert!(AdminToken::new("short").is_err());
        assert!(AdminToken::new("has a space in it, long enough").is_err());
        assert!(!format!("{t:?}").contains("0123"));
        let g = AdminToken::generate().unwrap();
        assert_eq!(g.expose().len(), 64);
        assert_ne!(g, AdminToken::generate().unwrap());
    }
}
