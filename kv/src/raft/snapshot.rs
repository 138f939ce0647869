//! Snapshot data: an envelope of the address book and the version of group 0's configuration the
//! group last followed, then the state machine's own snapshot stream (empty in the raft log's
//! own record of its last snapshot: the state is in the state engine, not in the log).

use crate::peer::members::Members;

/// What a snapshot holds besides the state machine.
#[derive(Debug, Default)]
pub struct Envelope {
    /// The node's address book (group 0's; other groups' copies are not read).
    pub book: Members,
    /// The version of group 0's configuration this group last followed (see `peer::follow`).
    pub follows: u64,
}

/// The snapshot envelope: `[u32 length][head JSON][state machine snapshot]`.
pub fn envelope(members: &Members, follows: u64, machine: &[u8]) -> Vec<u8> {
    // The head is the book's JSON object with `follows` beside its fields (a head written before
    // groups followed group 0 reads as following version 0).
    let mut head = serde_json::to_value(members).expect("an address book serializes");
    head["follows"] = follows.into();
    let head = serde_json::to_vec(&head).expect("a snapshot head serializes");
    let mut out = Vec::with_capacity(4 + head.len() + machine.len());
    out.extend_from_slice(&(head.len() as u32).to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(machine);
    out
}

/// The envelope of snapshot data made by [`envelope`], and the state machine's bytes after it.
pub fn split(data: &[u8]) -> Result<(Envelope, &[u8]), String> {
    let len = data
        .get(..4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or("snapshot: short data")?;
    let head = data
        .get(4..4 + len)
        .ok_or("snapshot: address book past the end")?;
    let bad = |e: serde_json::Error| format!("snapshot: bad address book: {e}");
    let mut head: serde_json::Value = serde_json::from_slice(head).map_err(bad)?;
    let follows = match head.as_object_mut().and_then(|h| h.remove("follows")) {
        Some(v) => v.as_u64().ok_or("snapshot: bad follows")?,
        None => 0,
    };
    let env = Envelope {
        book: serde_json::from_value(head).map_err(bad)?,
        follows,
    };
    Ok((env, &data[4 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_keeps_what_the_group_followed_and_reads_an_older_head() {
        let mut book = Members::default();
        let addrs = crate::peer::members::Addrs {
            peer: "h:1".into(),
            http: None,
            etcd: None,
        };
        book.addrs.insert(7, addrs);
        let data = envelope(&book, 42, b"machine");
        let (env, machine) = split(&data).unwrap();
        assert_eq!(
            (env.follows, env.book, machine),
            (42, book, &b"machine"[..])
        );
        let old = br#"{"addrs":{"7":{"peer":"h:1","http":null}},"removed":[3]}"#;
        let mut data = (old.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(old);
        data.extend_from_slice(b"machine");
        let (env, _) = split(&data).unwrap();
        assert_eq!((env.follows, env.book.conf), (0, None));
        assert_eq!((env.book.addrs.len(), env.book.removed.len()), (1, 1));
        assert!(split(b"\0\0\0\x09{}").is_err(), "a head past the end");
    }
}
