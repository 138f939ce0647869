//! The commands that change the state, and what applying one produced.
//!
//! Commands travel in raft entries as `[u32 header length][JSON header][raw value bytes]`, so that
//! a 1 MiB value is not inflated by JSON. Session times are the proposing leader's clock readings
//! (`now_ns`); a new leader first proposes `Takeover`, which re-bases every session on its clock.

use raft::eraftpb::{Entry, EntryType};
use raft_lease::follower::Keys;
use serde::{Deserialize, Serialize};

/// A change to the state, as proposed through raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Write a key. `session` ties it to a session (a put without one unties it); `fence` is
    /// `(lock, token)`. `now_ns` is the leader's clock when it proposed a put with a session.
    Put {
        /// The key.
        key: String,
        /// The session the key is tied to.
        session: Option<u64>,
        /// The lock and token the write is fenced with.
        fence: Option<(String, u64)>,
        /// The proposing leader's clock (with a session).
        #[serde(default)]
        now_ns: u64,
    },
    /// Delete a key.
    Delete {
        /// The key.
        key: String,
    },
    /// Start a session.
    SessionGrant {
        /// Its time to live.
        ttl_ms: u64,
        /// The proposing leader's clock.
        now_ns: u64,
    },
    /// Sessions the leader refreshed (in its memory) while a checkpoint named them: clears
    /// their checkpoint on every replica, so that a takeover gives them a full TTL again. The
    /// only keep-alive that is a raft entry (see `sessions_local`).
    SessionKeepalive {
        /// The sessions.
        ids: Vec<u64>,
        /// The proposing leader's clock.
        now_ns: u64,
    },
    /// End a session.
    SessionRevoke {
        /// The session.
        id: u64,
    },
    /// Take a lock for a session.
    Lock {
        /// The lock.
        name: String,
        /// The session.
        session: u64,
        /// The proposing leader's clock.
        now_ns: u64,
    },
    /// Release a lock a session holds: under `token` if given (safe to retry: a later lock of
    /// the same name has a larger token), else under whatever token it holds now.
    Unlock {
        /// The lock.
        name: String,
        /// The session that holds it.
        session: u64,
        /// The token it holds the lock under.
        #[serde(default)]
        token: Option<u64>,
    },
    /// A new leader re-bases every session on its clock (a full TTL from `now_ns`).
    Takeover {
        /// The new leader's term.
        term: u64,
        /// Its clock.
        now_ns: u64,
    },
    /// End the sessions `ids`, whose TTL ran out by `now_ns` on the leader of `term` (its
    /// decision, from the expiries in its memory).
    Expire {
        /// The leader's term.
        term: u64,
        /// Its clock.
        now_ns: u64,
        /// The sessions to end (an entry of the older form, without them, ends none).
        #[serde(default)]
        ids: Vec<u64>,
    },
    /// An etcd transaction (a put or a delete is one of one operation): the entry's value is
    /// etcd's `TxnRequest`, protobuf-encoded (`state::mvcc::txn`).
    EtcdTxn {},
    /// Compact etcd's keyspace history below `revision`.
    EtcdCompact {
        /// The revision to compact to.
        revision: i64,
    },
    /// Raise (`activate`) or lower etcd's alarm `alarm` for member `member` (see
    /// `state::alarms`).
    EtcdAlarm {
        /// Raise it; `false`: lower it.
        activate: bool,
        /// The member it is raised for.
        member: u64,
        /// etcd's alarm type (`NOSPACE` 1, `CORRUPT` 2).
        alarm: i32,
    },
    /// The time each of `remaining`'s sessions had left at `now_ns` on the leader of `term`, for
    /// the next takeover ([`Sessions::checkpoint`]): only sessions with no keep-alive for half
    /// their TTL, so that a client renewing on time never needs a raft entry.
    ///
    /// [`Sessions::checkpoint`]: raft_lease::grant::Sessions::checkpoint
    Checkpoint {
        /// The leader's term.
        term: u64,
        /// Its clock.
        now_ns: u64,
        /// (session, ns left on the leader's clock).
        remaining: Vec<(u64, u64)>,
    },
}

impl Command {
    /// Whether the command carries the leader's clock, and so needs the sessions to be on it.
    pub fn on_leader_clock(&self) -> bool {
        matches!(
            self,
            Command::Put {
                session: Some(_),
                ..
            } | Command::SessionGrant { .. }
                | Command::SessionKeepalive { .. }
                | Command::Lock { .. }
        )
    }

    /// The session the leader must find live (on its clock) before it proposes: a lock's, or
    /// the one a put ties its key to. Replicas only check that it exists.
    pub fn session_to_check(&self) -> Option<u64> {
        match self {
            Command::Put { session, .. } => *session,
            Command::Lock { session, .. } => Some(*session),
            _ => None,
        }
    }

    /// Fill in the proposing leader's clock reading.
    pub fn set_now(&mut self, now: u64) {
        match self {
            Command::Put { now_ns, .. }
            | Command::SessionGrant { now_ns, .. }
            | Command::SessionKeepalive { now_ns, .. }
            | Command::Lock { now_ns, .. } => *now_ns = now,
            _ => {}
        }
    }
}

/// Encode a command and the value it carries (empty for all but `Put`).
pub fn encode(cmd: &Command, value: &[u8]) -> Vec<u8> {
    encode_raw(&serde_json::to_vec(cmd).expect("commands serialize"), value)
}

/// Decode entry data made by [`encode`].
pub fn decode(data: &[u8]) -> Result<(Command, &[u8]), String> {
    let (header, value) = decode_raw(data)?;
    let cmd = serde_json::from_slice(header).map_err(|e| format!("bad command: {e}"))?;
    Ok((cmd, value))
}

/// What applying a command produced, for the client waiting on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A write or delete committed at this revision (raft index).
    Revision(u64),
    /// A session was started.
    Session(u64),
    /// A lock was taken with this fencing token.
    Token(u64),
    /// Sessions refreshed, and ids that named no live session.
    KeepAlive {
        /// How many were refreshed.
        refreshed: usize,
        /// Ids of no live session.
        unknown: Vec<u64>,
    },
    /// A session was ended.
    Revoked,
    /// A lock was released.
    Unlocked,
    /// Housekeeping applied (nobody waits on it).
    Housekeeping,
    /// The command was refused.
    Refused(Refusal),
    /// An etcd transaction ran, or why it was refused (on every replica alike).
    Etcd(Result<crate::state::mvcc::txn::TxnDone, crate::state::mvcc::MvccError>),
    /// etcd's keyspace was compacted (the revision it is at now), or why not.
    EtcdCompacted(Result<i64, crate::state::mvcc::MvccError>),
    /// The alarms an `EtcdAlarm` changed: (member, type), empty when it changed none.
    Alarms(Vec<(u64, i32)>),
}

/// Why a command was refused (deterministically, on every replica; or by the leader before it
/// was proposed: `NotReady`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No live session with this id.
    UnknownSession(u64),
    /// A session holds the lock: another one, or the asking one itself.
    LockHeld {
        /// The session holding it.
        holder: u64,
        /// Only when the asking session holds it: its token (**not a grant**: unlock with it,
        /// then lock again for a new token).
        token: Option<u64>,
    },
    /// A fence whose token is not the lock's current one.
    StaleFence {
        /// The token given.
        token: u64,
        /// The lock's current token.
        current: u64,
    },
    /// A fence for a lock that nobody holds, or an unlock by a session that does not hold it.
    LockNotHeld {
        /// The lock.
        lock: String,
    },
    /// A TTL of 0 or over the maximum.
    BadTtl {
        /// The TTL given.
        ttl_ms: u64,
        /// The maximum.
        max_ttl_ms: u64,
    },
    /// A key or lock name over the limits (only a forged or buggy proposal gets this far).
    BadName(String),
    /// An entry that is not a command (only a forged or buggy proposal gets this far).
    Undecodable(String),
    /// The key does not exist.
    NotFound,
    /// etcd's `NOSPACE` alarm is raised: nothing that adds to the keyspace is applied until it
    /// is disarmed (see `state::alarms`).
    NoSpace,
    /// A new leader whose sessions are not on its clock yet: retry shortly (never proposed).
    NotReady,
}

/// Every key and lock name a command carries must be within the HTTP API's limits.
pub fn check_names(cmd: &Command) -> Result<(), String> {
    let names: Vec<&str> = match cmd {
        Command::Put { key, fence, .. } => std::iter::once(key.as_str())
            .chain(fence.iter().map(|(n, _)| n.as_str()))
            .collect(),
        Command::Delete { key, .. } => vec![key],
        Command::Lock { name, .. } => vec![name],
        _ => vec![],
    };
    names
        .into_iter()
        .try_for_each(crate::state::keys::check_name)
        .map_err(|e| e.to_string())
}

/// The keys a raft entry writes, for follower read leases (`LeaseNode::set_entry_keys`): a put
/// or a delete writes its key; an empty normal entry (a new leader's) writes none; everything
/// else (sessions, locks, housekeeping, membership changes, data that does not decode) may
/// write any key. A pure function of the entry, the same on every replica.
pub fn entry_keys(entry: &Entry) -> Keys {
    if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
        return Keys::unknown(entry);
    }
    let Ok((header, _)) = decode_raw(&entry.data) else {
        return Keys::All;
    };
    match serde_json::from_slice::<KeyOf>(header) {
        Ok(KeyOf::Put { key } | KeyOf::Delete { key }) => Keys::Some(vec![key.into_bytes()]),
        _ => Keys::All,
    }
}

/// The key of a put or delete header, read without its other fields (a put's value is not in
/// the header, so this costs one small parse per entry).
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum KeyOf {
    Put { key: String },
    Delete { key: String },
}

/// `[u32 header length][header][rest]`.
pub fn encode_raw(header: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + header.len() + rest.len());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(rest);
    out
}

/// The header and the rest of data made by [`encode_raw`].
pub fn decode_raw(data: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let len = u32::from_be_bytes(
        data.get(..4)
            .ok_or("short data")?
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let header = data.get(4..4 + len).ok_or("header past the end")?;
    Ok((header, &data[4 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_garbage_is_an_error() {
        let cmd = Command::Put {
            key: "k".into(),
            session: Some(2),
            fence: Some(("L".into(), 3)),
            now_ns: 0,
        };
        let data = encode(&cmd, b"\x00\xffvalue");
        assert_eq!(decode(&data).unwrap(), (cmd, &b"\x00\xffvalue"[..]));
        assert!(decode(b"\x00\x00\x00\x09{}").is_err());
        assert!(decode(b"\x00").is_err());
    }

    fn entry(data: Vec<u8>) -> Entry {
        Entry {
            data: data.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_entry_writes_the_key_of_its_put_or_delete_and_anything_else_writes_every_key() {
        let put = Command::Put {
            key: "k1".into(),
            session: Some(3),
            fence: Some(("L".into(), 2)),
            now_ns: 7,
        };
        let keys = |c: &Command| entry_keys(&entry(encode(c, b"value")));
        assert_eq!(keys(&put), Keys::Some(vec![b"k1".to_vec()]));
        let delete = Command::Delete { key: "k2".into() };
        assert_eq!(keys(&delete), Keys::Some(vec![b"k2".to_vec()]));
        let revoke = Command::SessionRevoke { id: 3 };
        assert_eq!(keys(&revoke), Keys::All, "a session's end deletes its keys");
        let expire = Command::Expire {
            term: 2,
            now_ns: 1,
            ids: vec![3],
        };
        assert_eq!(keys(&expire), Keys::All);
        assert_eq!(entry_keys(&entry(Vec::new())), Keys::Some(Vec::new()));
        assert_eq!(entry_keys(&entry(b"\x00\x00".to_vec())), Keys::All);
        assert_eq!(
            entry_keys(&entry(b"\x00\x00\x00\x02{}".to_vec())),
            Keys::All
        );
        let mut conf = entry(encode(&put, b""));
        conf.set_entry_type(EntryType::EntryConfChangeV2);
        assert_eq!(entry_keys(&conf), Keys::All);
    }
}
