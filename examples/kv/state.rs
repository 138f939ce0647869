//! The replicated state machine: keys, sessions and locks, and the commands that change them.
//!
//! Commands travel in raft entries as `[u32 header length][JSON header][raw value bytes]`, so that
//! a 1 MiB value is not inflated by JSON. Session times are the proposing leader's clock readings
//! (`now_ns`); a new leader first proposes `Takeover`, which re-bases every session on its clock.
//!
//! **Keep-alives are the leader's alone** (see `sessions_local`): the leader moves a session's
//! expiry in its own copy of the sessions and answers under its lease; no raft entry. So the
//! copies differ in their expiries, and **applying an entry never compares a time**: the leader
//! decides, on its clock, which sessions are live when it proposes (`prepare`) and which expired
//! (`Expire` names them), and what each had left (`Checkpoint` names it); every replica applies
//! those decisions alike. Only a `Takeover` sets expiries, from the new leader's clock alone,
//! never comparing it with the old leader's readings ([`Sessions::takeover`]).
//!
//! Restart: this replicated grantor uses the *restore* path, not a boot holdback. Grants, locks,
//! checkpoints and expiries are answered only once committed, and a keep-alive answered from the
//! leader's memory is covered by the takeover rule (a new leader gives every session what its
//! last checkpoint recorded, or a full TTL), so the raft log holds everything a holdback would
//! wait out; a holdback would instead refuse session commands for `max_ttl·(1+ρ) + ε` (10 minutes)
//! after every failover.

use std::collections::{BTreeMap, BTreeSet};

use raft_lease::grant::{
    GrantConfig, SessionError, SessionId, SessionImage, Sessions, SessionsCheckpoint, SessionsImage,
};
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
    /// The time each of `remaining`'s sessions had left at `now_ns` on the leader of `term`, for
    /// the next takeover ([`Sessions::checkpoint`]): only sessions with no keep-alive for half
    /// their TTL, so that a client renewing on time never needs a raft entry.
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
    /// A new leader whose sessions are not on its clock yet: retry shortly (never proposed).
    NotReady,
}

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The value's bytes.
    pub value: Vec<u8>,
    /// The raft index of the write that produced it.
    pub revision: u64,
}

/// Entries are applied with this time wherever the session library takes one: 0, before every
/// expiry, so a call checks only that the session exists. Liveness is the leader's decision,
/// made before it proposes; replicas' expiries are not the leader's (see the module docs).
pub const APPLY_NOW_NS: u64 = 0;

/// What a key costs in the state's byte count besides its key and value bytes.
pub const KEY_OVERHEAD_BYTES: u64 = 64;

/// The state machine.
pub struct KvState {
    /// The keys.
    pub kv: BTreeMap<String, Stored>,
    /// Sessions and locks.
    pub sessions: Sessions,
    /// The term whose leader's clock the session times are on (set by `Takeover`).
    pub sessions_term: u64,
    /// The last index applied.
    pub applied: u64,
    /// The session each session-tied key belongs to. A put without a session (or a delete) unties
    /// the key, so that the session's end no longer deletes it (the library's `Sessions` keeps
    /// the key in the session's set: this map has the last word).
    pub owners: BTreeMap<String, u64>,
    /// Keys and values in bytes, with [`KEY_OVERHEAD_BYTES`] per key.
    pub bytes: u64,
    /// Sessions a committed checkpoint names and no replicated keep-alive has cleared since
    /// (the same on every replica). A keep-alive of one of them must go through raft.
    pub checkpointed: BTreeSet<u64>,
    /// The leader's own: sessions named by its checkpoint entry in flight (proposed, not yet
    /// applied). A keep-alive of one of them must go through raft too, so that its entry comes
    /// after the checkpoint's and clears it. Empty on followers.
    pub checkpoint_in_flight: BTreeSet<u64>,
    /// The leader's own: when (its clock) to propose the next checkpoint.
    pub next_checkpoint_ns: u64,
}

/// Sessions' grant config: ρ = 500 ppm, ε = 10 ms, TTLs up to 10 minutes.
pub fn session_config() -> GrantConfig {
    GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 600_000,
    }
}

fn cost(key: &str, value: &[u8]) -> u64 {
    key.len() as u64 + value.len() as u64 + KEY_OVERHEAD_BYTES
}

impl KvState {
    /// An empty state.
    pub fn new() -> Self {
        KvState {
            kv: BTreeMap::new(),
            sessions: Sessions::new(session_config()),
            sessions_term: 0,
            applied: 0,
            owners: BTreeMap::new(),
            bytes: 0,
            checkpointed: BTreeSet::new(),
            checkpoint_in_flight: BTreeSet::new(),
            next_checkpoint_ns: 0,
        }
    }

    /// Record `index` as applied (it must follow the last one).
    pub fn advance(&mut self, index: u64) {
        assert!(
            index > self.applied,
            "applied {index} after {}",
            self.applied
        );
        self.applied = index;
    }

    /// Apply one committed command at `index`.
    pub fn apply(&mut self, index: u64, cmd: Command, value: &[u8]) -> Outcome {
        self.advance(index);
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
            Command::Delete { key } => self.delete(index, &key),
            Command::SessionGrant { ttl_ms, now_ns } => self.grant(ttl_ms, now_ns),
            Command::SessionKeepalive { ids, .. } => self.clear_checkpoints(ids),
            Command::SessionRevoke { id } => match self.end_session(id) {
                true => Outcome::Revoked,
                false => Outcome::Refused(Refusal::UnknownSession(id)),
            },
            Command::Lock { name, session, .. } => self.lock(&name, session),
            Command::Unlock {
                name,
                session,
                token,
            } => {
                let held = self.sessions.lock_holder(&name).map(|(_, t)| t);
                let token = token.or(held).unwrap_or(0);
                if self.sessions.unlock(&name, SessionId(session), token) {
                    Outcome::Unlocked
                } else {
                    Outcome::Refused(Refusal::LockNotHeld { lock: name })
                }
            }
            Command::Takeover { term, now_ns } => {
                self.sessions.takeover(now_ns);
                self.sessions_term = term;
                self.checkpoint_in_flight.clear();
                Outcome::Housekeeping
            }
            Command::Expire { term, ids, .. } => {
                if term == self.sessions_term {
                    for id in ids {
                        self.end_session(id);
                    }
                }
                Outcome::Housekeeping
            }
            Command::Checkpoint {
                term, remaining, ..
            } => {
                if term == self.sessions_term {
                    self.checkpointed
                        .extend(remaining.iter().map(|(id, _)| *id));
                    let remaining = remaining.into_iter().map(|(id, r)| (SessionId(id), r));
                    let checkpoint = SessionsCheckpoint {
                        remaining: remaining.collect(),
                    };
                    self.sessions.restore_checkpoint(&checkpoint);
                    self.checkpoint_in_flight.clear(); // one housekeeping entry at a time
                }
                Outcome::Housekeeping
            }
        }
    }

    /// A replicated keep-alive: the leader refreshed `ids` in its memory; clear their checkpoints
    /// here (time-free: [`APPLY_NOW_NS`] keeps every expiry where it is).
    fn clear_checkpoints(&mut self, ids: Vec<u64>) -> Outcome {
        let ids: Vec<SessionId> = ids.into_iter().map(SessionId).collect();
        let ka = self.sessions.keepalive(&ids, APPLY_NOW_NS);
        for id in &ids {
            self.checkpointed.remove(&id.0);
        }
        Outcome::KeepAlive {
            refreshed: ka.refreshed,
            unknown: ka.unknown.into_iter().map(|s| s.0).collect(),
        }
    }

    /// End session `id` (revoked or expired) and delete the keys it still owns; whether it was.
    fn end_session(&mut self, id: u64) -> bool {
        self.checkpointed.remove(&id);
        match self.sessions.revoke(SessionId(id)) {
            Some(revoked) => {
                self.delete_owned(id, &revoked.keys);
                true
            }
            None => false,
        }
    }

    fn grant(&mut self, ttl_ms: u64, now_ns: u64) -> Outcome {
        match self.sessions.grant(ttl_ms, now_ns) {
            Ok(id) => Outcome::Session(id.0),
            Err(SessionError::BadTtl { ttl_ms, max_ttl_ms }) => {
                Outcome::Refused(Refusal::BadTtl { ttl_ms, max_ttl_ms })
            }
            Err(e) => unreachable!("grant fails only on a bad ttl: {e}"),
        }
    }

    fn lock(&mut self, name: &str, session: u64) -> Outcome {
        match self.sessions.lock(name, SessionId(session), APPLY_NOW_NS) {
            Ok(token) => Outcome::Token(token),
            Err(SessionError::LockHeld { holder, token, .. }) => {
                Outcome::Refused(Refusal::LockHeld {
                    holder: holder.0,
                    token,
                })
            }
            Err(_) => Outcome::Refused(Refusal::UnknownSession(session)),
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
        match session {
            Some(id) => {
                if self
                    .sessions
                    .attach_key(SessionId(id), key.as_bytes(), APPLY_NOW_NS)
                    .is_err()
                {
                    return Outcome::Refused(Refusal::UnknownSession(id));
                }
                self.owners.insert(key.clone(), id);
            }
            None => {
                self.owners.remove(&key);
            }
        }
        self.insert(key, value.to_vec(), index);
        Outcome::Revision(index)
    }

    fn insert(&mut self, key: String, value: Vec<u8>, revision: u64) {
        let (added, key_len) = (cost(&key, &value), key.len() as u64);
        if let Some(old) = self.kv.insert(key, Stored { value, revision }) {
            self.bytes -= key_len + old.value.len() as u64 + KEY_OVERHEAD_BYTES;
        }
        self.bytes += added;
    }

    fn delete(&mut self, index: u64, key: &str) -> Outcome {
        self.owners.remove(key);
        match self.remove(key) {
            true => Outcome::Revision(index),
            false => Outcome::Refused(Refusal::NotFound),
        }
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.kv.remove(key) {
            Some(old) => {
                self.bytes -= cost(key, &old.value);
                true
            }
            None => false,
        }
    }

    /// A session ended: delete the keys it still owns.
    fn delete_owned(&mut self, session: u64, keys: &[Vec<u8>]) {
        for k in keys {
            let Ok(k) = std::str::from_utf8(k) else {
                continue;
            };
            if self.owners.get(k) == Some(&session) {
                self.owners.remove(k);
                self.remove(k);
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
            owners: self.owners.iter().map(|(k, s)| (k.clone(), *s)).collect(),
            checkpoint: checkpoint_rows(&self.sessions.last_checkpoint()),
            keys: self
                .kv
                .iter()
                .map(|(k, s)| (k.clone(), s.revision, s.value.len() as u64))
                .collect(),
        };
        let mut values = Vec::with_capacity(self.bytes as usize);
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
        let mut state = KvState::new();
        for (key, revision, len) in h.keys {
            let len = len as usize;
            let value = values
                .get(..len)
                .ok_or("snapshot values truncated")?
                .to_vec();
            values = &values[len..];
            state.insert(key, value, revision);
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
        state.sessions = Sessions::from_image(session_config(), image);
        // The checkpoint of the same moment as the image: without it, a node restored from this
        // snapshot would give full TTLs at its next takeover.
        let checkpoint = SessionsCheckpoint {
            remaining: h
                .checkpoint
                .iter()
                .map(|&(id, r)| (SessionId(id), r))
                .collect(),
        };
        state.sessions.restore_checkpoint(&checkpoint);
        state.checkpointed = h.checkpoint.iter().map(|(id, _)| *id).collect();
        state.sessions_term = h.sessions_term;
        state.applied = h.applied;
        state.owners = h.owners.into_iter().collect();
        Ok(state)
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
    /// (key, session) of every key tied to a session.
    #[serde(default)]
    owners: Vec<(String, u64)>,
    /// (session, ns left) of the sessions' last checkpoint ([`Sessions::last_checkpoint`]).
    #[serde(default)]
    checkpoint: Vec<(u64, u64)>,
    /// (key, revision, value length); the values follow the header, in this order.
    keys: Vec<(String, u64, u64)>,
}

fn checkpoint_rows(c: &SessionsCheckpoint) -> Vec<(u64, u64)> {
    c.remaining.iter().map(|(id, r)| (id.0, *r)).collect()
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
            // The leader's decision, from the expiries in its memory, on its clock alone.
            assert!(s.expired_ids(new_now + hold - 1).is_empty());
            assert!(s.sessions.is_live(SessionId(id), new_now + hold - 1));
            let ids = s.expired_ids(new_now + hold);
            assert_eq!(ids, vec![id]);
            let expire = Command::Expire {
                term: 3,
                now_ns: new_now + hold,
                ids,
            };
            s.apply(4, expire, b"");
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
                    name: "L".into(),
                    session: id,
                    now_ns: 0
                },
                b""
            ),
            Outcome::Token(1)
        );
        let put = |session| Command::Put {
            key: "a".into(),
            session,
            fence: Some(("L".into(), 1)),
            now_ns: 0,
        };
        assert_eq!(s.apply(4, put(Some(id)), b"x"), Outcome::Revision(4));
        let stale = Command::Put {
            key: "b".into(),
            session: None,
            fence: Some(("L".into(), 0)),
            now_ns: 0,
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
                ids: copy.expired_ids(2_000_000_000),
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
            ttl_ms: 1_000,
            now_ns: 0,
        };
        let Outcome::Session(id) = s.apply(2, grant, b"") else {
            panic!()
        };
        let fenced = |lock: &str, token| Command::Put {
            key: "k".into(),
            session: None,
            fence: Some((lock.into(), token)),
            now_ns: 0,
        };
        let not_held = Outcome::Refused(Refusal::LockNotHeld { lock: "L".into() });
        assert_eq!(s.apply(3, fenced("L", 5), b"v"), not_held, "never issued");
        let lock = Command::Lock {
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
        s.apply(7, Command::SessionRevoke { id }, b"");
        assert_eq!(s.apply(8, fenced("L", 1), b"v"), not_held, "released");
        let long = Command::Put {
            key: "k".repeat(1025),
            session: None,
            fence: None,
            now_ns: 0,
        };
        assert!(matches!(
            s.apply(9, long, b"v"),
            Outcome::Refused(Refusal::BadName(_))
        ));
        assert_eq!(s.kv.len(), 1);
    }
}
