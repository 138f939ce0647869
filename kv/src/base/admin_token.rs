//! The admin bearer token that `/admin` requests must carry: read from `--admin-token-file`,
//! made up by `kv cluster`, compared in constant time, never shown by `Debug`.

use std::fmt;
use std::path::Path;

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
