//! The sessions and locks of a group, as one row of its `meta` table: written in the engine
//! batch that changed them, read when the state is opened (a restart, or a snapshot installed).
//! Keys tied to a session are the keyspace's (attached to the lease of the same id), not here.

use raft_lease::grant::{SessionId, SessionImage, Sessions, SessionsCheckpoint, SessionsImage};
use serde::{Deserialize, Serialize};

use raft_lease::grant::GrantConfig;

/// The row's name in `meta`.
pub const SESSIONS_ROW: &str = "sessions";

type SessionRow = (u64, u64, u64, Vec<String>);

/// What the row holds.
#[derive(Serialize, Deserialize)]
struct Row {
    sessions_term: u64,
    next_session: u64,
    /// (id, ttl, expiry on the clock of the leader of `sessions_term`, locks held).
    sessions: Vec<SessionRow>,
    locks: Vec<(String, u64, u64)>,
    lock_tokens: Vec<(String, u64)>,
    /// (session, ns left) of the sessions' last checkpoint ([`Sessions::last_checkpoint`]).
    checkpoint: Vec<(u64, u64)>,
    /// Sessions a committed checkpoint names and no replicated keep-alive cleared since.
    checkpointed: Vec<u64>,
}

/// The parts of the state the row holds.
pub struct SessionsState {
    /// Sessions and locks.
    pub sessions: Sessions,
    /// The term whose leader's clock the session times are on.
    pub sessions_term: u64,
    /// Sessions a committed checkpoint names and no replicated keep-alive cleared since.
    pub checkpointed: std::collections::BTreeSet<u64>,
}

impl Default for SessionsState {
    fn default() -> Self {
        SessionsState {
            sessions: Sessions::new(session_config()),
            sessions_term: 0,
            checkpointed: Default::default(),
        }
    }
}

/// Sessions' grant config: ρ = 500 ppm, ε = 10 ms, TTLs up to 10 minutes.
pub fn session_config() -> GrantConfig {
    GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 600_000,
    }
}

impl SessionsState {
    /// The sessions, locks and checkpoint as the row's bytes.
    pub fn encode(
        sessions: &Sessions,
        sessions_term: u64,
        checkpointed: &std::collections::BTreeSet<u64>,
    ) -> Vec<u8> {
        let image = sessions.image();
        let row = Row {
            sessions_term,
            next_session: image.next_id,
            sessions: image
                .sessions
                .iter()
                .map(|s| (s.id.0, s.ttl_ms, s.expiry_ns, s.locks.clone()))
                .collect(),
            locks: image
                .locks
                .iter()
                .map(|(n, h, t)| (n.clone(), h.0, *t))
                .collect(),
            lock_tokens: image.lock_tokens.clone(),
            checkpoint: checkpoint_rows(&sessions.last_checkpoint()),
            checkpointed: checkpointed.iter().copied().collect(),
        };
        serde_json::to_vec(&row).expect("the sessions row serializes")
    }
}

/// The sessions in a row made by [`SessionsState::encode`].
pub fn decode_sessions(row: &[u8]) -> Result<SessionsState, String> {
    let r: Row = serde_json::from_slice(row).map_err(|e| format!("bad sessions row: {e}"))?;
    let image = SessionsImage {
        next_id: r.next_session,
        sessions: r
            .sessions
            .into_iter()
            .map(|(id, ttl_ms, expiry_ns, locks)| SessionImage {
                id: SessionId(id),
                ttl_ms,
                expiry_ns,
                keys: Vec::new(),
                locks,
            })
            .collect(),
        locks: r
            .locks
            .into_iter()
            .map(|(n, holder, t)| (n, SessionId(holder), t))
            .collect(),
        lock_tokens: r.lock_tokens,
    };
    let mut sessions = Sessions::from_image(session_config(), image);
    // The checkpoint of the same moment as the image: without it, a node restored from this
    // row would give full TTLs at its next takeover.
    let checkpoint = SessionsCheckpoint {
        remaining: r
            .checkpoint
            .iter()
            .map(|&(id, left)| (SessionId(id), left))
            .collect(),
    };
    sessions.restore_checkpoint(&checkpoint);
    Ok(SessionsState {
        sessions,
        sessions_term: r.sessions_term,
        checkpointed: r.checkpointed.into_iter().collect(),
    })
}

fn checkpoint_rows(c: &SessionsCheckpoint) -> Vec<(u64, u64)> {
    c.remaining.iter().map(|(id, r)| (id.0, *r)).collect()
}
