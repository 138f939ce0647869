//! Sessions: one lease shared by many keys and locks (as with Chubby sessions and etcd leases),
//! kept alive in batches. Pure: time is an argument, on the grantor's clock. Images for snapshots
//! are in `image`; takeovers and checkpoints in `takeover`.

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use crate::grant::fence::StaleToken;
use crate::grant::GrantConfig;

mod image;
mod takeover;

pub use image::{SessionImage, SessionsImage};
pub use takeover::SessionsCheckpoint;

/// Identifies a session. Ids are never reused by one [`Sessions`].
///
/// A session belongs to **one client incarnation**, like a [`ClientId`](crate::grant::ClientId):
/// a lock request under a session that holds the lock answers with the held token (so that a
/// retry whose answer was lost learns it), so a restarted process must start a new session rather
/// than reuse a persisted id while its old incarnation may still run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// Why a session call was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SessionError {
    /// No live session has this id (never granted, expired or revoked).
    #[error("unknown or expired session {0:?}")]
    Unknown(SessionId),
    /// The TTL is zero or above the maximum.
    #[error("ttl {ttl_ms} ms is outside 1..={max_ttl_ms} ms")]
    BadTtl {
        /// The requested TTL.
        ttl_ms: u64,
        /// The largest TTL granted.
        max_ttl_ms: u64,
    },
    /// The lock is held: by another session, or by the asking session itself.
    #[error("lock {name:?} is held by session {holder:?}")]
    LockHeld {
        /// The lock.
        name: String,
        /// Its holder.
        holder: SessionId,
        /// Only when the asking session itself is the holder: the token it holds the lock under
        /// (an earlier request's answer was lost, or a late copy of one arrived). **It is not a
        /// grant**: never act on the lock under it (an unlock of it may still be on its way).
        /// Unlock with it, then lock again for a new token.
        token: Option<u64>,
    },
}

/// What ending a session revoked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revoked {
    /// Keys attached to the session: delete them.
    pub keys: Vec<Vec<u8>>,
    /// Locks the session held: now free.
    pub locks: Vec<String>,
}

/// The result of a batched keep-alive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeepAlive {
    /// Sessions refreshed.
    pub refreshed: usize,
    /// Ids that named no live session.
    pub unknown: Vec<SessionId>,
}

#[derive(Debug, Clone)]
struct Session {
    ttl_ms: u64,
    /// On the grantor's clock, exclusive: last refresh + ttl·(1+ρ) + ε.
    expiry_ns: u64,
    /// The time the session had left at the last [`Sessions::checkpoint`] since its last grant or
    /// keep-alive, in ns: a duration, valid on any clock. `None`: a full TTL (no checkpoint since).
    /// `Some(0)`: found expired (it is dead on every clock).
    checkpoint_ns: Option<u64>,
    keys: BTreeSet<Vec<u8>>,
    locks: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy)]
struct Lock {
    holder: SessionId,
    token: u64,
}

/// Every session, key attachment and lock of one grantor. Replicate it (e.g. through raft) so that
/// a new grantor can take over with [`Sessions::takeover`], and call [`Sessions::checkpoint`]
/// every checkpoint interval so that takeovers cannot keep a dead client's session for ever.
///
/// Invariant: every instant in it (`now_ns` arguments, expiries) is on **one** clock: the clock of
/// the grantor that created it or last called [`Sessions::takeover`]. A new or restarted grantor
/// (another process or machine) must call `takeover` on its own clock before any other call.
/// A restarted grantor that is not replicated must not start from [`Sessions::new`]: it would
/// forget the sessions and locks it gave. Rebuild it from a persisted [`Sessions::image`] and
/// [`Sessions::last_checkpoint`] (written together before each answer leaves), with
/// [`Sessions::from_image`] and [`Sessions::restore_checkpoint`], and call `takeover`.
#[derive(Debug, Clone)]
pub struct Sessions {
    config: GrantConfig,
    next_id: u64,
    sessions: BTreeMap<SessionId, Session>,
    /// (expiry, id) for every session: expiry in order without a scan.
    by_expiry: BTreeSet<(u64, SessionId)>,
    locks: BTreeMap<String, Lock>,
    /// The highest token ever issued per lock. Never decreases, even after the lock is freed.
    lock_tokens: BTreeMap<String, u64>,
}

impl Sessions {
    /// No sessions: a first start, or a replica that will apply the replicated history. TTLs are
    /// bounded by `config.max_term_ms`.
    ///
    /// Panics if `config` is invalid ([`GrantConfig::validate`]): a programmer error.
    pub fn new(config: GrantConfig) -> Self {
        config.assert_valid();
        Sessions {
            config,
            next_id: 0,
            sessions: BTreeMap::new(),
            by_expiry: BTreeSet::new(),
            locks: BTreeMap::new(),
            lock_tokens: BTreeMap::new(),
        }
    }

    /// Start a session with `ttl_ms` at `now_ns`.
    pub fn grant(&mut self, ttl_ms: u64, now_ns: u64) -> Result<SessionId, SessionError> {
        let max_ttl_ms = self.config.max_term_ms;
        if ttl_ms == 0 || ttl_ms > max_ttl_ms {
            return Err(SessionError::BadTtl { ttl_ms, max_ttl_ms });
        }
        self.next_id += 1;
        let id = SessionId(self.next_id);
        let expiry_ns = now_ns.saturating_add(self.config.grantor_hold_ns(ttl_ms));
        let session = Session {
            ttl_ms,
            expiry_ns,
            checkpoint_ns: None,
            keys: BTreeSet::new(),
            locks: BTreeSet::new(),
        };
        self.sessions.insert(id, session);
        self.by_expiry.insert((expiry_ns, id));
        Ok(id)
    }

    /// Refresh many sessions in one call, each to a full TTL from `now_ns`.
    ///
    /// A session that has expired but is not yet reaped ([`Sessions::expire`]) is answered as
    /// unknown, like one that is gone, and marked dead, so that no later takeover revives it.
    pub fn keepalive(&mut self, ids: &[SessionId], now_ns: u64) -> KeepAlive {
        let mut out = KeepAlive::default();
        for &id in ids {
            if self.live_mut(id, now_ns).is_some() {
                self.extend(id, now_ns);
                out.refreshed += 1;
            } else {
                out.unknown.push(id);
            }
        }
        out
    }

    /// NEGATIVE CONTROL, for tests only: a keep-alive that leaves the last checkpoint in place. A
    /// takeover then gives the session only what was left before the keep-alive, and it expires
    /// while its client still believes in it.
    #[doc(hidden)]
    pub fn control_keepalive_keeping_the_checkpoint(
        &mut self,
        ids: &[SessionId],
        now_ns: u64,
    ) -> KeepAlive {
        let kept: Vec<_> = ids
            .iter()
            .map(|id| self.sessions.get(id).and_then(|s| s.checkpoint_ns))
            .collect();
        let out = self.keepalive(ids, now_ns);
        for (id, checkpoint_ns) in ids.iter().zip(kept) {
            if let Some(s) = self
                .sessions
                .get_mut(id)
                .filter(|s| s.checkpoint_ns.is_none())
            {
                s.checkpoint_ns = checkpoint_ns;
            }
        }
        out
    }

    /// Move session `id`'s expiry to a full TTL from `now_ns`, never earlier than it was. Both
    /// instants are on this grantor's clock (see [`Sessions`]).
    fn extend(&mut self, id: SessionId, now_ns: u64) {
        let config = self.config;
        let s = self.sessions.get_mut(&id).expect("extend a known session");
        s.checkpoint_ns = None; // a full TTL from now: what a checkpoint said no longer holds
        let old_ns = s.expiry_ns;
        s.expiry_ns = old_ns.max(now_ns.saturating_add(config.grantor_hold_ns(s.ttl_ms)));
        let new_ns = s.expiry_ns;
        self.by_expiry.remove(&(old_ns, id));
        self.by_expiry.insert((new_ns, id));
        debug_assert!(new_ns >= old_ns && new_ns > now_ns);
    }

    /// The session, if it is live at `now_ns`. One found expired but not yet reaped is marked
    /// dead (checkpointed at 0): it was answered as gone, so no takeover may revive it.
    fn live_mut(&mut self, id: SessionId, now_ns: u64) -> Option<&mut Session> {
        let s = self.sessions.get_mut(&id)?;
        if now_ns >= s.expiry_ns {
            s.checkpoint_ns = Some(0);
            return None;
        }
        Some(s)
    }

    /// Tie `key` to session `id`: it is deleted when the session ends.
    pub fn attach_key(
        &mut self,
        id: SessionId,
        key: &[u8],
        now_ns: u64,
    ) -> Result<(), SessionError> {
        let s = self.live_mut(id, now_ns).ok_or(SessionError::Unknown(id))?;
        s.keys.insert(key.to_vec());
        Ok(())
    }

    /// Acquire lock `name` for session `id`. Returns its fencing token, larger for every new
    /// holding, even the same session's next one after an unlock.
    ///
    /// A lock is granted only when free: a session that already holds it gets
    /// [`SessionError::LockHeld`] naming itself and its token, never the same token as a grant
    /// again. (Otherwise a lock request that overtakes the session's own pending unlock would be
    /// answered "yours, token t" just before the unlock of t frees it.)
    pub fn lock(&mut self, name: &str, id: SessionId, now_ns: u64) -> Result<u64, SessionError> {
        if self.live_mut(id, now_ns).is_none() {
            return Err(SessionError::Unknown(id));
        }
        if let Some(l) = self.locks.get(name) {
            return Err(SessionError::LockHeld {
                name: name.to_string(),
                holder: l.holder,
                token: (l.holder == id).then_some(l.token),
            });
        }
        let token = self.lock_tokens.get(name).copied().unwrap_or(0) + 1;
        self.lock_tokens.insert(name.to_string(), token);
        self.locks
            .insert(name.to_string(), Lock { holder: id, token });
        self.sessions
            .get_mut(&id)
            .expect("live")
            .locks
            .insert(name.to_string());
        Ok(token)
    }

    /// NEGATIVE CONTROL, for tests only: the first `lock`, which answered a session that already
    /// held the lock with its token, as a grant. Over a network that reorders, a lock request that
    /// overtakes the session's own unlock is answered "granted" just before that unlock frees it.
    #[doc(hidden)]
    pub fn control_lock_granting_the_holder_again(
        &mut self,
        name: &str,
        id: SessionId,
        now_ns: u64,
    ) -> Result<u64, SessionError> {
        match self.lock(name, id, now_ns) {
            Err(SessionError::LockHeld {
                token: Some(token), ..
            }) => Ok(token),
            other => other,
        }
    }

    /// Release lock `name` if session `id` holds it under `token`. Returns whether it did.
    ///
    /// Naming the token makes an unlock safe to retry and to deliver late or twice: the session's
    /// next lock of `name` has a larger token, so an old unlock matches nothing.
    pub fn unlock(&mut self, name: &str, id: SessionId, token: u64) -> bool {
        if self
            .locks
            .get(name)
            .is_none_or(|l| l.holder != id || l.token != token)
        {
            return false;
        }
        self.locks.remove(name);
        if let Some(s) = self.sessions.get_mut(&id) {
            s.locks.remove(name);
        }
        true
    }

    /// NEGATIVE CONTROL, for tests only: the first `unlock`, which named only the session. A late
    /// or duplicated copy frees the session's next lock of `name` while it believes in it.
    #[doc(hidden)]
    pub fn control_unlock_naming_only_the_session(&mut self, name: &str, id: SessionId) -> bool {
        match self.locks.get(name) {
            Some(l) if l.holder == id => self.unlock(name, id, l.token),
            _ => false,
        }
    }

    /// Whether a write fenced with `token` for lock `name` is current: not below the highest
    /// token ever issued for that lock.
    pub fn check_fence(&self, name: &str, token: u64) -> Result<(), StaleToken> {
        let highest = self.lock_tokens.get(name).copied().unwrap_or(0);
        if token < highest {
            return Err(StaleToken { token, highest });
        }
        Ok(())
    }

    /// End session `id` now; returns what it held, or `None` if there was no such session.
    pub fn revoke(&mut self, id: SessionId) -> Option<Revoked> {
        let s = self.sessions.remove(&id)?;
        self.by_expiry.remove(&(s.expiry_ns, id));
        for name in &s.locks {
            self.locks.remove(name);
        }
        Some(Revoked {
            keys: s.keys.into_iter().collect(),
            locks: s.locks.into_iter().collect(),
        })
    }

    /// End every session whose TTL ran out by `now_ns`; returns what each held.
    pub fn expire(&mut self, now_ns: u64) -> Vec<(SessionId, Revoked)> {
        let due: Vec<SessionId> = self
            .by_expiry
            .iter()
            .take_while(|(t, _)| *t <= now_ns)
            .map(|(_, id)| *id)
            .collect();
        due.into_iter()
            .filter_map(|id| Some((id, self.revoke(id)?)))
            .collect()
    }

    /// Every session as `(id, ttl_ms, expiry_ns)`, the expiry on the grantor's clock.
    pub fn expiries(&self) -> impl Iterator<Item = (SessionId, u64, u64)> + '_ {
        self.sessions
            .iter()
            .map(|(id, s)| (*id, s.ttl_ms, s.expiry_ns))
    }

    /// Whether session `id` is live at `now_ns`.
    pub fn is_live(&self, id: SessionId, now_ns: u64) -> bool {
        self.sessions.get(&id).is_some_and(|s| now_ns < s.expiry_ns)
    }

    /// The holder and token of lock `name`.
    pub fn lock_holder(&self, name: &str) -> Option<(SessionId, u64)> {
        self.locks.get(name).map(|l| (l.holder, l.token))
    }

    /// The earliest expiry among live sessions, to know when to call [`Sessions::expire`].
    pub fn next_expiry_ns(&self) -> Option<u64> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    /// Sessions not yet expired or revoked (expired ones linger until [`Sessions::expire`]).
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether there is no session.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Sessions with no drift and no margin: times are exact.
    pub(super) fn sessions() -> Sessions {
        Sessions::new(GrantConfig {
            drift_ppm: 0,
            margin_ms: 0,
            max_term_ms: 60_000,
        })
    }

    #[test]
    fn expiry_revokes_attached_keys_and_locks() {
        let mut s = sessions();
        let a = s.grant(100, 0).unwrap();
        s.attach_key(a, b"k1", 0).unwrap();
        assert_eq!(s.lock("L", a, 0), Ok(1));
        assert_eq!(
            s.lock("L", a, 0),
            Err(SessionError::LockHeld {
                name: "L".into(),
                holder: a,
                token: Some(1)
            }),
            "the holder is told its token, not granted it again"
        );
        assert!(s.expire(100 * MS - 1).is_empty());
        let gone = s.expire(100 * MS);
        assert_eq!(
            gone,
            vec![(
                a,
                Revoked {
                    keys: vec![b"k1".to_vec()],
                    locks: vec!["L".into()]
                }
            )]
        );
        assert_eq!(
            s.attach_key(a, b"k2", 100 * MS),
            Err(SessionError::Unknown(a))
        );
        let b = s.grant(100, 100 * MS).unwrap();
        assert_eq!(
            s.lock("L", b, 100 * MS),
            Ok(2),
            "a new owner gets a larger token"
        );
        assert_eq!(
            s.check_fence("L", 1),
            Err(StaleToken {
                token: 1,
                highest: 2
            })
        );
        assert_eq!(s.check_fence("L", 2), Ok(()));
    }

    #[test]
    fn a_held_lock_is_refused_and_released_locks_move_on() {
        let mut s = sessions();
        let (a, b) = (s.grant(1_000, 0).unwrap(), s.grant(1_000, 0).unwrap());
        s.lock("L", a, 0).unwrap();
        assert_eq!(
            s.lock("L", b, 0),
            Err(SessionError::LockHeld {
                name: "L".into(),
                holder: a,
                token: None
            })
        );
        assert!(!s.unlock("L", b, 1));
        assert!(!s.unlock("L", a, 2), "not its token");
        assert!(s.unlock("L", a, 1));
        assert_eq!(s.lock("L", b, 0), Ok(2));
        assert_eq!(s.lock_holder("L"), Some((b, 2)));
        assert!(matches!(s.grant(0, 0), Err(SessionError::BadTtl { .. })));
    }
}
