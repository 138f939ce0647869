//! Names from URLs (keys, lock names, query values) decoded strictly: every `%XX` escape must be
//! well formed and the result must be UTF-8. Nothing is decoded lossily, so two different names
//! never alias; a name that cannot be decoded is refused.

use std::fmt;

/// Longest key or lock name, in bytes after decoding.
pub const MAX_NAME_BYTES: usize = 1024;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// The decoded bytes are not UTF-8.
    NotUtf8,
    /// Nothing at all.
    Empty,
    /// Longer than [`MAX_NAME_BYTES`] (its length).
    TooLong(usize),
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::BadEscape => write!(f, "a % escape is not followed by two hex digits"),
            NameError::NotUtf8 => write!(f, "not UTF-8 once decoded"),
            NameError::Empty => write!(f, "empty"),
            NameError::TooLong(n) => write!(f, "{n} bytes exceeds {MAX_NAME_BYTES}"),
        }
    }
}

/// Decode `%XX` escapes strictly (`+` stays `+`).
pub fn percent_decode(s: &str) -> Result<String, NameError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                .ok_or(NameError::BadEscape)?;
            out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| NameError::NotUtf8)
}

/// A key or lock name: decoded strictly, non-empty, at most [`MAX_NAME_BYTES`].
pub fn name(raw: &str) -> Result<String, NameError> {
    let n = percent_decode(raw)?;
    check_name(&n)?;
    Ok(n)
}

/// The limits on a decoded key or lock name (also applied to every command at apply time).
pub fn check_name(n: &str) -> Result<(), NameError> {
    if n.is_empty() {
        return Err(NameError::Empty);
    }
    if n.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong(n.len()));
    }
    Ok(())
}

/// `a=1&b=2` decoded strictly into pairs.
pub fn parse_query(q: &str) -> Result<Vec<(String, String)>, NameError> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn different_raw_names_never_decode_to_the_same_key() {
        assert_eq!(name("a%2Fb"), Ok("a/b".into()));
        assert_eq!(name("caf%C3%A9"), Ok("café".into()));
        // Lossy UTF-8 turned both into U+FFFD: now both are refused.
        assert_eq!(name("%FF"), Err(NameError::NotUtf8));
        assert_eq!(name("%FE"), Err(NameError::NotUtf8));
        // A malformed escape kept as text would alias `%2525G1`'s decoding.
        assert_eq!(name("%G1"), Err(NameError::BadEscape));
        assert_eq!(name("%4"), Err(NameError::BadEscape));
        assert_eq!(name(""), Err(NameError::Empty));
        assert_eq!(name(&"k".repeat(1024)).map(|n| n.len()), Ok(1024));
        assert_eq!(name(&"k".repeat(1025)), Err(NameError::TooLong(1025)));
    }

    #[test]
    fn queries_decode_strictly() {
        assert_eq!(
            parse_query("read=lease&fence=L%3A1:5&flag"),
            Ok(vec![
                ("read".into(), "lease".into()),
                ("fence".into(), "L:1:5".into()),
                ("flag".into(), String::new())
            ])
        );
        assert_eq!(parse_query("x=%ZZ"), Err(NameError::BadEscape));
    }
}
