//! How the keyspace lies in the state engine's tables (`disk::state_engine`): every key begins
//! with the 8-byte generation the group's data lives under, so that a snapshot received builds a
//! new generation beside the old one and a one-row change makes it the group's.
//!
//! | table | key | value |
//! |---|---|---|
//! | `latest` | gen, key | the key's current [`Version`] |
//! | `history` | gen, escaped key, revision | a version no longer current, or a tombstone |
//! | `changes` | gen, revision, place | the key the revision changed at that place |
//! | `lease_keys` | gen, lease, key | (empty) |
//! | `meta` | gen, name | the generation's counters, sessions, alarms |
//! | `groups` | group | the group's generation (and `next_gen`: the node's counter) |
//!
//! Numbers are big-endian, so keys sort as their numbers do. A key followed by more bytes is
//! escaped (each `0x00` as `0x00 0xFF`, then `0x00 0x01`), so that one key's rows sort together
//! and keys keep their order.

use crate::state::mvcc::version::Version;

/// The `groups` row naming the next generation to hand out.
pub const NEXT_GEN: &[u8] = b"next_gen";

/// A generation's prefix.
pub fn gen_prefix(gen: u64) -> [u8; 8] {
    gen.to_be_bytes()
}

/// The first key after every key beginning with `prefix` (`None`: there is none).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

/// `key` escaped so that bytes may follow it (see the module docs).
pub fn escaped(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 1]);
    out
}

/// The `latest` row of `key`.
pub fn latest_key(gen: u64, key: &[u8]) -> Vec<u8> {
    cat(&[&gen_prefix(gen), key])
}

/// `key` of a `latest` row of generation `gen`.
pub fn key_of_latest(row: &[u8]) -> &[u8] {
    &row[8..]
}

/// The `history` row of `key` at `rev`.
pub fn history_key(gen: u64, key: &[u8], rev: i64) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &escaped(key), &rev_bytes(rev)])
}

/// Where `key`'s history rows begin, and where every key from `key` on begins (the same).
pub fn history_start(gen: u64, key: &[u8]) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &escaped(key)])
}

/// The revision of a `history` row's key.
pub fn rev_of_history(row: &[u8]) -> i64 {
    let at = row.len() - 8;
    i64::from_be_bytes(row[at..].try_into().expect("8 bytes"))
}

/// The key of a `history` row (unescaped). `None` for a row that is not one.
pub fn key_of_history(row: &[u8]) -> Option<Vec<u8>> {
    let escaped = row.get(8..row.len().checked_sub(8)?)?;
    let mut out = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        if b != 0 {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(0xFF) => out.push(0),
            Some(1) if bytes.len() == 0 => return Some(out),
            _ => return None,
        }
    }
    None
}

fn rev_bytes(rev: i64) -> [u8; 8] {
    debug_assert!(rev >= 0, "revisions are never negative");
    rev.to_be_bytes()
}

/// The `changes` row of revision `rev` at `place`.
pub fn change_key(gen: u64, rev: i64, place: u32) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &rev_bytes(rev), &place.to_be_bytes()])
}

/// Where the `changes` rows of revision `rev` begin.
pub fn changes_from(gen: u64, rev: i64) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &rev_bytes(rev.max(0))])
}

/// The revision of a `changes` row's key.
pub fn rev_of_change(row: &[u8]) -> i64 {
    i64::from_be_bytes(row[8..16].try_into().expect("8 bytes"))
}

/// The `lease_keys` row of `key` attached to `lease`.
pub fn lease_key(gen: u64, lease: i64, key: &[u8]) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &lease.to_be_bytes(), key])
}

/// Where the `lease_keys` rows of `lease` begin.
pub fn lease_start(gen: u64, lease: i64) -> Vec<u8> {
    cat(&[&gen_prefix(gen), &lease.to_be_bytes()])
}

/// The `meta` row `name` of generation `gen`.
pub fn meta_key(gen: u64, name: &str) -> Vec<u8> {
    cat(&[&gen_prefix(gen), name.as_bytes()])
}

/// The `groups` row of `group`.
pub fn group_key(group: u64) -> [u8; 8] {
    group.to_be_bytes()
}

const HEADER: usize = 33;

/// A version as a row's value: create, mod, version and lease (8 bytes each), then 1 and the
/// value, or 0 for a tombstone.
pub fn encode_version(v: &Version) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + v.value.as_ref().map_or(0, Vec::len));
    for n in [v.create_rev, v.mod_rev, v.version, v.lease] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    match &v.value {
        Some(value) => {
            out.push(1);
            out.extend_from_slice(value);
        }
        None => out.push(0),
    }
    out
}

/// A row's value as a version; `None` if it is not one.
pub fn decode_version(row: &[u8]) -> Option<Version> {
    let n = |i: usize| {
        Some(i64::from_be_bytes(
            row.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    let value = match row.get(32)? {
        1 => Some(row[HEADER..].to_vec()),
        0 if row.len() == HEADER => None,
        _ => return None,
    };
    Some(Version {
        create_rev: n(0)?,
        mod_rev: n(1)?,
        version: n(2)?,
        lease: n(3)?,
        value,
    })
}

/// A `u64` as a row's value.
pub fn encode_u64(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// A row's value as a `u64`.
pub fn decode_u64(row: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(row.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_keys_keep_their_order_with_anything_after_them() {
        let keys: [&[u8]; 7] = [b"", b"\0", b"\0\0", b"\0\x01", b"a", b"a\0", b"ab"];
        for pair in keys.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(a < b);
            let lo = cat(&[&escaped(a), &[0xFF; 8]]);
            let hi = cat(&[&escaped(b), &[0; 8]]);
            assert!(lo < hi, "{a:?} after anything sorts before {b:?}");
        }
        for k in keys {
            for rev in [0, 1, i64::MAX] {
                let row = history_key(7, k, rev);
                assert_eq!(key_of_history(&row).as_deref(), Some(k));
                assert_eq!(rev_of_history(&row), rev);
            }
        }
        assert_eq!(key_of_history(b"short"), None);
        assert_eq!(key_of_history(&cat(&[&[0; 8], b"a\0\x07", &[0; 8]])), None);
    }

    #[test]
    fn versions_round_trip_and_garbage_is_refused() {
        let v = Version {
            create_rev: 2,
            mod_rev: 9,
            version: 3,
            lease: 77,
            value: Some(b"value".to_vec()),
        };
        assert_eq!(decode_version(&encode_version(&v)), Some(v.clone()));
        let tomb = Version { value: None, ..v };
        assert_eq!(decode_version(&encode_version(&tomb)), Some(tomb.clone()));
        let mut bad = encode_version(&tomb);
        bad.push(1);
        assert_eq!(decode_version(&bad), None, "a tombstone with a value");
        assert_eq!(decode_version(&[1, 2, 3]), None);
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
    }
}
