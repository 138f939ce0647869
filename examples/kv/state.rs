//! The replicated state machine: keys, sessions and locks, and the commands that change them.
//!
//! Commands travel in raft entries as `[u32 header length][JSON header][raw value bytes]`, so that
//! a 1 MiB value is not inflated by JSON. Session times are the proposing leader's clock readings
//! (`now_ns`); a new leader first proposes `Takeover`, which re-bases every session on its clock.
//!
//! Clocks: an expiry is compared only with readings of the clock it was set on. `Takeover` sets
//! every expiry to `now + ttl·(1+ρ) + ε` from the new leader's clock alone, never comparing it with
//! the old leader's readings ([`Sessions::takeover`]). Session commands are proposed only once the
//! leader's `Takeover` is applied, and `Expire` carries its term, so each applies on one clock.
//!
//! Restart: this replicated grantor uses the *restore* path, not a boot holdback. Every session,
//! keep-alive and lock is answered only once committed, so the raft log is the persisted record
//! and holds everything a holdback would wait out; a holdback would instead refuse session
//! commands for `max_ttl·(1+ρ) + ε` (10 minutes) after every failover.

use std::collections::BTreeMap;

use raft_lease::grant::{
    GrantConfig, SessionError, SessionId, SessionImage, Sessions, SessionsImage,
};
use serde::{Deserialize, Serialize};

/// A change to the state, as proposed through raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Write a key. `session` ties it to a session; `fence` is `(lock, token)`.
    Put {
        req: u64,
        key: String,
        session: Option<u64>,
        fence: Option<(String, u64)>,
    },
    /// Delete a key.
    Delete { req: u64, key: String },
    /// Start a session.
    SessionGrant { req: u64, ttl_ms: u64, now_ns: u64 },
    /// Refresh sessions.
    SessionKeepalive {
        req: u64,
        ids: Vec<u64>,
        now_ns: u64,
    },
    /// End a session.
    SessionRevoke { req: u64, id: u64 },
    /// Take a lock for a session.
    Lock {
        req: u64,
        name: String,
        session: u64,
        now_ns: u64,
    },
    /// A new leader re-bases every session on its clock (a full TTL from `now_ns`).
    Takeover { term: u64, now_ns: u64 },
    /// End sessions whose TTL ran out by `now_ns` on the leader of `term`.
    Expire { term: u64, now_ns: u64 },
}

impl Command {
    /// The request id a client waits on, if any.
    pub fn req(&self) -> Option<u64> {
        match self {
            Command::Put { req, .. }
            | Command::Delete { req, .. }
            | Command::SessionGrant { req, .. }
            | Command::SessionKeepalive { req, .. }
            | Command::SessionRevoke { req, .. }
            | Command::Lock { req, .. } => Some(*req),
            Command::Takeover { .. } | Command::Expire { .. } => None,
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
    KeepAlive { refreshed: usize, unknown: Vec<u64> },
    /// A session was ended.
    Revoked,
    /// The command was refused.
    Refused(Refusal),
}

/// Why a command was refused (deterministically, on every replica).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    UnknownSession(u64),
    LockHeld {
        holder: u64,
    },
    /// A fence whose token is not the lock's current one.
    StaleFence {
        token: u64,
        current: u64,
    },
    /// A fence for a lock that nobody holds.
    LockNotHeld {
        lock: String,
    },
    BadTtl {
        ttl_ms: u64,
        max_ttl_ms: u64,
    },
    /// A key or lock name over the limits (only a forged or buggy proposal gets this far).
    BadName(String),
    NotFound,
}

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub value: Vec<u8>,
    /// The raft index of the write that produced it.
    pub revision: u64,
}

/// The state machine.
pub struct KvState {
    pub kv: BTreeMap<String, Stored>,
    pub sessions: Sessions,
    /// The term whose leader's clock the session times are on (set by `Takeover`).
    pub sessions_term: u64,
    pub applied: u64,
}

/// Sessions' grant config: ρ = 500 ppm, ε = 10 ms, TTLs up to 10 minutes.
pub fn session_config() -> GrantConfig {
    GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 600_000,
    }
}

impl KvState {
    pub fn new() -> Self {
        KvState {
            kv: BTreeMap::new(),
            sessions: Sessions::new(session_config()),
            sessions_term: 0,
            applied: 0,
        }
    }

    /// Apply one committed command at `index`.
    pub fn apply(&mut self, index: u64, cmd: Command, value: &[u8]) -> Outcome {
        assert!(
            index > self.applied,
            "applied {index} after {}",
            self.applied
        );
        self.applied = index;
        if let Err(why) = check_names(&cmd) {
            return Outcome::Refused(Refusal::BadName(why));
        }
        match cmd {
            Command::Put {
                key,
                session,
                fence,
                ..
            } => self.put(index, key, value, session, fence),
            Command::Delete { key, .. } => match self.kv.remove(&key) {
                Some(_) => Outcome::Revision(index),
                None => Outcome::Refused(Refusal::NotFound),
            },
            Command::SessionGrant { ttl_ms, now_ns, .. } => {
                match self.sessions.grant(ttl_ms, now_ns) {
                    Ok(id) => Outcome::Session(id.0),
                    Err(SessionError::BadTtl { ttl_ms, max_ttl_ms }) => {
                        Outcome::Refused(Refusal::BadTtl { ttl_ms, max_ttl_ms })
                    }
                    Err(e) => unreachable!("grant fails only on a bad ttl: {e}"),
                }
            }
            Command::SessionKeepalive { ids, now_ns, .. } => {
                let ids: Vec<SessionId> = ids.into_iter().map(SessionId).collect();
                let ka = self.sessions.keepalive(&ids, now_ns);
                Outcome::KeepAlive {
                    refreshed: ka.refreshed,
                    unknown: ka.unknown.into_iter().map(|s| s.0).collect(),
                }
            }
            Command::SessionRevoke { id, .. } => match self.sessions.revoke(SessionId(id)) {
                Some(revoked) => {
                    self.delete_keys(&revoked.keys);
                    Outcome::Revoked
                }
                None => Outcome::Refused(Refusal::UnknownSession(id)),
            },
            Command::Lock {
                name,
                session,
                now_ns,
                ..
            } => match self.sessions.lock(&name, SessionId(session), now_ns) {
                Ok(token) => Outcome::Token(token),
                Err(SessionError::LockHeld { holder, .. }) => {
                    Outcome::Refused(Refusal::LockHeld { holder: holder.0 })
                }
                Err(_) => Outcome::Refused(Refusal::UnknownSession(session)),
            },
            Command::Takeover { term, now_ns } => {
                self.sessions.takeover(now_ns);
                self.sessions_term = term;
                Outcome::Revoked
            }
            Command::Expire { term, now_ns } => {
                if term == self.sessions_term {
                    for (_, revoked) in self.sessions.expire(now_ns) {
                        self.delete_keys(&revoked.keys);
                    }
                }
                Outcome::Revoked
            }
        }
    }

    fn put(
        &mut self,
        index: u64,
        key: String,
        value: &[u8],
        session: Option<u64>,
        fence: Option<(String, u64)>,
    ) -> Outcome {
        if let Some((lock, token)) = fence {
            // Exactly the current holder's token: a lower one is stale, a higher one was never
            // issued, and a lock nobody holds fences nothing.
            match self.sessions.lock_holder(&lock) {
                None => return Outcome::Refused(Refusal::LockNotHeld { lock }),
                Some((_, current)) if current != token => {
                    return Outcome::Refused(Refusal::StaleFence { token, current })
                }
                Some(_) => {}
            }
        }
        if let Some(id) = session {
            // A session's own clock reading is not known here: a live session is one not yet expired.
            if self
                .sessions
                .attach_key(SessionId(id), key.as_bytes(), 0)
                .is_err()
            {
                return Outcome::Refused(Refusal::UnknownSession(id));
            }
        }
        self.kv.insert(
            key,
            Stored {
                value: value.to_vec(),
                revision: index,
            },
        );
        Outcome::Revision(index)
    }

    fn delete_keys(&mut self, keys: &[Vec<u8>]) {
        for k in keys {
            if let Ok(k) = std::str::from_utf8(k) {
                self.kv.remove(k);
            }
        }
    }

    /// The whole state as snapshot data.
    pub fn snapshot(&self) -> Vec<u8> {
        let image = self.sessions.image();
        let header = SnapshotHeader {
            applied: self.applied,
            sessions_term: self.sessions_term,
            next_session: image.next_id,
            sessions: image
                .sessions
                .iter()
                .map(|s| {
                    (
                        s.id.0,
                        s.ttl_ms,
                        s.expiry_ns,
                        to_strings(&s.keys),
                        s.locks.clone(),
                    )
                })
                .collect(),
            locks: image
                .locks
                .iter()
                .map(|(n, h, t)| (n.clone(), h.0, *t))
                .collect(),
            lock_tokens: image.lock_tokens.clone(),
            keys: self
                .kv
                .iter()
                .map(|(k, s)| (k.clone(), s.revision, s.value.len() as u64))
                .collect(),
        };
        let mut values = Vec::new();
        for s in self.kv.values() {
            values.extend_from_slice(&s.value);
        }
        encode_raw(
            &serde_json::to_vec(&header).expect("snapshot header serializes"),
            &values,
        )
    }

    /// Rebuild from snapshot data made by [`KvState::snapshot`].
    pub fn from_snapshot(data: &[u8]) -> Result<Self, String> {
        let (header, mut values) = decode_raw(data)?;
        let h: SnapshotHeader =
            serde_json::from_slice(header).map_err(|e| format!("bad snapshot: {e}"))?;
        let mut kv = BTreeMap::new();
        for (key, revision, len) in h.keys {
            let len = len as usize;
            let value = values
                .get(..len)
                .ok_or("snapshot values truncated")?
                .to_vec();
            values = &values[len..];
            kv.insert(key, Stored { value, revision });
        }
        let image = SessionsImage {
            next_id: h.next_session,
            sessions: h
                .sessions
                .into_iter()
                .map(|(id, ttl_ms, expiry_ns, keys, locks)| SessionImage {
                    id: SessionId(id),
                    ttl_ms,
                    expiry_ns,
                    keys: keys.into_iter().map(String::into_bytes).collect(),
                    locks,
                })
                .collect(),
            locks: h
                .locks
                .into_iter()
                .map(|(n, holder, t)| (n, SessionId(holder), t))
                .collect(),
            lock_tokens: h.lock_tokens,
        };
        let sessions = Sessions::from_image(session_config(), image);
        Ok(KvState {
            kv,
            sessions,
            sessions_term: h.sessions_term,
            applied: h.applied,
        })
    }
}

type SessionRow = (u64, u64, u64, Vec<String>, Vec<String>);

#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    applied: u64,
    sessions_term: u64,
    next_session: u64,
    sessions: Vec<SessionRow>,
    locks: Vec<(String, u64, u64)>,
    lock_tokens: Vec<(String, u64)>,
    /// (key, revision, value length); the values follow the header, in this order.
    keys: Vec<(String, u64, u64)>,
}

/// Session keys are attached from `String` keys, so they are UTF-8; nothing is decoded lossily.
fn to_strings(keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter()
        .map(|k| String::from_utf8(k.clone()).expect("session keys come from UTF-8 keys"))
        .collect()
}

/// Every key and lock name a command carries must be within the HTTP API's limits.
fn check_names(cmd: &Command) -> Result<(), String> {
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
        .try_for_each(crate::keys::check_name)
        .map_err(|e| e.to_string())
}

fn encode_raw(header: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + header.len() + rest.len());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(rest);
    out
}

fn decode_raw(data: &[u8]) -> Result<(&[u8], &[u8]), String> {
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
            req: 7,
            key: "k".into(),
            session: Some(2),
            fence: Some(("L".into(), 3)),
        };
        let data = encode(&cmd, b"\x00\xffvalue");
        assert_eq!(decode(&data).unwrap(), (cmd, &b"\x00\xffvalue"[..]));
        assert!(decode(b"\x00\x00\x00\x09{}").is_err());
        assert!(decode(b"\x00").is_err());
    }

    #[test]
    fn takeover_rebases_sessions_on_the_new_leaders_clock_alone() {
        const HOUR: u64 = 3_600_000_000_000;
        let hold = session_config().grantor_hold_ns(1_000);
        for (old_now, new_now) in [(720 * HOUR, HOUR), (HOUR, 720 * HOUR)] {
            let mut s = KvState::new();
            s.apply(
                1,
                Command::Takeover {
                    term: 2,
                    now_ns: old_now,
                },
                b"",
            );
            let grant = Command::SessionGrant {
                req: 1,
                ttl_ms: 1_000,
                now_ns: old_now,
            };
            let Outcome::Session(id) = s.apply(2, grant, b"") else {
                panic!()
            };
            s.apply(
                3,
                Command::Takeover {
                    term: 3,
                    now_ns: new_now,
                },
                b"",
            );
            s.apply(
                4,
                Command::Expire {
                    term: 3,
                    now_ns: new_now + hold - 1,
                },
                b"",
            );
            assert!(s.sessions.is_live(SessionId(id), new_now + hold - 1));
            s.apply(
                5,
                Command::Expire {
                    term: 3,
                    now_ns: new_now + hold,
                },
                b"",
            );
            assert!(
                s.sessions.is_empty(),
                "outlived a full TTL on the new leader's clock"
            );
        }
    }

    #[test]
    fn snapshot_round_trips_keys_sessions_and_locks() {
        let mut s = KvState::new();
        s.apply(1, Command::Takeover { term: 2, now_ns: 0 }, b"");
        let Outcome::Session(id) = s.apply(
            2,
            Command::SessionGrant {
                req: 1,
                ttl_ms: 1_000,
                now_ns: 0,
            },
            b"",
        ) else {
            panic!()
        };
        assert_eq!(
            s.apply(
                3,
                Command::Lock {
                    req: 2,
                    name: "L".into(),
                    session: id,
                    now_ns: 0
                },
                b""
            ),
            Outcome::Token(1)
        );
        let put = |session| Command::Put {
            req: 3,
            key: "a".into(),
            session,
            fence: Some(("L".into(), 1)),
        };
        assert_eq!(s.apply(4, put(Some(id)), b"x"), Outcome::Revision(4));
        let stale = Command::Put {
            req: 4,
            key: "b".into(),
            session: None,
            fence: Some(("L".into(), 0)),
        };
        assert_eq!(
            s.apply(5, stale, b"y"),
            Outcome::Refused(Refusal::StaleFence {
                token: 0,
                current: 1
            })
        );
        let copy = KvState::from_snapshot(&s.snapshot()).unwrap();
        assert_eq!(copy.kv, s.kv);
        assert_eq!(copy.sessions.image(), s.sessions.image());
        assert_eq!((copy.applied, copy.sessions_term), (5, 2));
        // Expiry on the leader of the sessions' term deletes the session's keys.
        let mut copy = copy;
        copy.apply(
            6,
            Command::Expire {
                term: 2,
                now_ns: 2_000_000_000,
            },
            b"",
        );
        assert!(copy.kv.is_empty());
        assert!(KvState::from_snapshot(b"junk").is_err());
    }

    #[test]
    fn a_fence_needs_a_held_lock_and_exactly_its_current_token() {
        let mut s = KvState::new();
        s.apply(1, Command::Takeover { term: 1, now_ns: 0 }, b"");
        let grant = Command::SessionGrant {
            req: 1,
            ttl_ms: 1_000,
            now_ns: 0,
        };
        let Outcome::Session(id) = s.apply(2, grant, b"") else {
            panic!()
        };
        let fenced = |lock: &str, token| Command::Put {
            req: 9,
            key: "k".into(),
            session: None,
            fence: Some((lock.into(), token)),
        };
        let not_held = Outcome::Refused(Refusal::LockNotHeld { lock: "L".into() });
        assert_eq!(s.apply(3, fenced("L", 5), b"v"), not_held, "never issued");
        let lock = Command::Lock {
            req: 2,
            name: "L".into(),
            session: id,
            now_ns: 0,
        };
        assert_eq!(s.apply(4, lock, b""), Outcome::Token(1));
        let higher = Outcome::Refused(Refusal::StaleFence {
            token: 2,
            current: 1,
        });
        assert_eq!(s.apply(5, fenced("L", 2), b"v"), higher, "never issued");
        assert_eq!(s.apply(6, fenced("L", 1), b"v"), Outcome::Revision(6));
        s.apply(7, Command::SessionRevoke { req: 3, id }, b"");
        assert_eq!(s.apply(8, fenced("L", 1), b"v"), not_held, "released");
        let long = Command::Put {
            req: 4,
            key: "k".repeat(1025),
            session: None,
            fence: None,
        };
        assert!(matches!(
            s.apply(9, long, b"v"),
            Outcome::Refused(Refusal::BadName(_))
        ));
        assert_eq!(s.kv.len(), 1);
    }
}
