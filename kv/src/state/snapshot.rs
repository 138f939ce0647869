//! The state as snapshot data: `[u32 header length][JSON header][the values, in key order]`.

use raft_lease::grant::{SessionId, SessionImage, Sessions, SessionsCheckpoint, SessionsImage};
use serde::{Deserialize, Serialize};

use crate::state::command::{decode_raw, encode_raw};
use crate::state::kv_state::{session_config, KvState};

impl KvState {
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
            mvcc: None,
        };
        let mut header = header;
        let (mvcc, blob) = self.mvcc.image();
        header.mvcc = Some(mvcc);
        let mut values = Vec::with_capacity(self.bytes as usize + blob.len());
        for s in self.kv.values() {
            values.extend_from_slice(&s.value);
        }
        // etcd's keyspace's bytes follow the values.
        values.extend_from_slice(&blob);
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
        if let Some(mvcc) = h.mvcc {
            state.mvcc = crate::state::mvcc::Mvcc::from_image(mvcc, values)?;
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
    /// etcd's keyspace (absent in a snapshot from before it).
    #[serde(default)]
    mvcc: Option<crate::state::mvcc::image::MvccHeader>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::command::{Command, Outcome, Refusal};

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
}
