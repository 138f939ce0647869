//! The replicated state machine: keys, sessions and locks, and how a command (see `command`)
//! changes them. Its snapshots are in `snapshot`.
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

use raft_lease::grant::{GrantConfig, SessionError, SessionId, Sessions, SessionsCheckpoint};

use crate::state::command::{check_names, Command, Outcome, Refusal};
use crate::state::mvcc::{Mvcc, MvccError};

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
    /// etcd's keyspace (the etcd API's; apart from `kv`), whose leases are these sessions.
    pub mvcc: Mvcc,
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
            mvcc: Mvcc::new(),
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
        if let Command::EtcdTxn {} = cmd {
            return Outcome::Etcd(self.etcd_txn(value));
        }
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
            Command::EtcdTxn {} => unreachable!("applied above"),
            Command::EtcdCompact { revision } => {
                let done = self.mvcc.compact(revision).map(|()| self.mvcc.rev());
                Outcome::EtcdCompacted(done)
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

    /// An etcd transaction, from its protobuf encoding; its leases are sessions that exist.
    fn etcd_txn(&mut self, encoded: &[u8]) -> Result<crate::state::mvcc::txn::TxnDone, MvccError> {
        let t = <etcd_client::proto::PbTxnRequest as prost::Message>::decode(encoded)
            .map_err(|e| MvccError::Invalid(format!("undecodable transaction: {e}")))?;
        let sessions = &self.sessions;
        let exists = |id: i64| id > 0 && sessions.is_live(SessionId(id as u64), APPLY_NOW_NS);
        self.mvcc.txn(&t, &exists)
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
                // An etcd lease is this session: its keys go in one revision.
                self.mvcc.end_lease(id as i64);
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

    /// Store `value` at `key`, written at `revision`, and count its bytes.
    pub(super) fn insert(&mut self, key: String, value: Vec<u8>, revision: u64) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
