//! Plain copies of [`Sessions`] for snapshots and replication.
//!
//! An image holds the expiries as instants of the clock of the grantor that made it: restore it
//! with [`Sessions::from_image`] and, on any other clock, call [`Sessions::takeover`] before
//! anything else. The remaining durations of the last checkpoint travel beside it, in a
//! [`SessionsCheckpoint`](super::SessionsCheckpoint) ([`Sessions::last_checkpoint`]).

use super::{Lock, Session, SessionId, Sessions};
use crate::grant::GrantConfig;

/// A plain copy of one session, for snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionImage {
    /// The session.
    pub id: SessionId,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Its expiry on the clock of the grantor that made the image (meaningless on any other).
    pub expiry_ns: u64,
    /// Attached keys.
    pub keys: Vec<Vec<u8>>,
    /// Held locks.
    pub locks: Vec<String>,
}

/// A plain copy of a [`Sessions`], for snapshots: serialize it however you like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionsImage {
    /// The last session id handed out.
    pub next_id: u64,
    /// Every session.
    pub sessions: Vec<SessionImage>,
    /// Held locks: (name, holder, token).
    pub locks: Vec<(String, SessionId, u64)>,
    /// Highest token ever issued per lock.
    pub lock_tokens: Vec<(String, u64)>,
}

impl Sessions {
    /// A plain copy of everything, for a snapshot.
    pub fn image(&self) -> SessionsImage {
        SessionsImage {
            next_id: self.next_id,
            sessions: self
                .sessions
                .iter()
                .map(|(id, s)| SessionImage {
                    id: *id,
                    ttl_ms: s.ttl_ms,
                    expiry_ns: s.expiry_ns,
                    keys: s.keys.iter().cloned().collect(),
                    locks: s.locks.iter().cloned().collect(),
                })
                .collect(),
            locks: self
                .locks
                .iter()
                .map(|(n, l)| (n.clone(), l.holder, l.token))
                .collect(),
            lock_tokens: self
                .lock_tokens
                .iter()
                .map(|(n, t)| (n.clone(), *t))
                .collect(),
        }
    }

    /// Rebuild from an [`Sessions::image`]. Its expiries are on the clock of the grantor that made
    /// it: call [`Sessions::takeover`] before using it on another clock.
    pub fn from_image(config: GrantConfig, image: SessionsImage) -> Self {
        let mut s = Sessions::new(config);
        s.next_id = image.next_id;
        for si in image.sessions {
            s.by_expiry.insert((si.expiry_ns, si.id));
            let session = Session {
                ttl_ms: si.ttl_ms,
                expiry_ns: si.expiry_ns,
                checkpoint_ns: None,
                keys: si.keys.into_iter().collect(),
                locks: si.locks.into_iter().collect(),
            };
            s.sessions.insert(si.id, session);
        }
        s.locks = image
            .locks
            .into_iter()
            .map(|(n, holder, token)| (n, Lock { holder, token }))
            .collect();
        s.lock_tokens = image.lock_tokens.into_iter().collect();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn an_image_round_trips() {
        let mut s = super::super::tests::sessions();
        let a = s.grant(100, 0).unwrap();
        s.attach_key(a, b"k", 0).unwrap();
        s.lock("L", a, 0).unwrap();
        let copy = Sessions::from_image(s.config, s.image());
        assert_eq!(copy.image(), s.image());
        assert_eq!(copy.next_expiry_ns(), Some(100 * MS));
    }
}
