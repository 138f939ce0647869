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

use std::collections::BTreeSet;

use raft_lease::grant::{SessionError, SessionId, Sessions, SessionsCheckpoint};

use crate::disk::state_engine::{EngineError, StateEngine};
use crate::state::alarms::{Alarms, ALARMS_ROW, NOSPACE};
use crate::state::command::{check_names, decode, Command, Outcome, Refusal};
use crate::state::mvcc::{Batch, Keyspace, MvccError};
pub use crate::state::sessions_row::session_config;
use crate::state::sessions_row::{decode_sessions, SessionsState, SESSIONS_ROW};

/// One stored value, as the HTTP API answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The value's bytes.
    pub value: Vec<u8>,
    /// The revision of the write that produced it (the keyspace's `mod_revision`).
    pub revision: u64,
}

/// Entries are applied with this time wherever the session library takes one: 0, before every
/// expiry, so a call checks only that the session exists. Liveness is the leader's decision,
/// made before it proposes; replicas' expiries are not the leader's (see the module docs).
pub const APPLY_NOW_NS: u64 = 0;

/// Changes of a compaction's physical step looked at per engine batch (see `mvcc::compact`).
pub const SWEEP_BUDGET: usize = 4_096;

/// The state machine of one group: its keyspace in the state engine, and (in memory, kept in
/// the engine with every batch that changes them) its sessions and locks.
pub struct KvState {
    /// The keys (etcd's API's and the HTTP API's: one keyspace), with their history.
    pub keyspace: Keyspace,
    /// Sessions and locks.
    pub sessions: Sessions,
    /// The term whose leader's clock the session times are on (set by `Takeover`).
    pub sessions_term: u64,
    /// The last index applied (written with every batch, in the batch).
    pub applied: u64,
    /// Sessions a committed checkpoint names and no replicated keep-alive has cleared since
    /// (the same on every replica). A keep-alive of one of them must go through raft.
    pub checkpointed: BTreeSet<u64>,
    /// The leader's own: sessions named by its checkpoint entry in flight (proposed, not yet
    /// applied). A keep-alive of one of them must go through raft too, so that its entry comes
    /// after the checkpoint's and clears it. Empty on followers.
    pub checkpoint_in_flight: BTreeSet<u64>,
    /// The leader's own: when (its clock) to propose the next checkpoint.
    pub next_checkpoint_ns: u64,
    /// etcd's raised alarms (the same on every replica at the same index).
    pub alarms: Alarms,
    /// The sessions changed in the batch being applied: the batch writes their row.
    sessions_dirty: bool,
    /// The alarms changed in the batch being applied: the batch writes their row.
    alarms_dirty: bool,
    /// The last applied index that is durable in the engine: the raft log is never cut past it.
    durable: u64,
}

fn fatal(e: MvccError) -> EngineError {
    EngineError::Io(e.to_string())
}

impl KvState {
    /// Group `group`'s state as the engine holds it (empty, at index 0, if it holds none).
    pub fn open(engine: StateEngine, group: u64) -> Result<Self, String> {
        let keyspace = Keyspace::open(engine, group).map_err(|e| e.to_string())?;
        let mut s = KvState {
            keyspace,
            sessions: Sessions::new(session_config()),
            sessions_term: 0,
            applied: 0,
            checkpointed: BTreeSet::new(),
            checkpoint_in_flight: BTreeSet::new(),
            next_checkpoint_ns: 0,
            alarms: Alarms::default(),
            sessions_dirty: false,
            alarms_dirty: false,
            durable: 0,
        };
        s.reload()?;
        s.durable = s.applied;
        Ok(s)
    }

    /// Read the applied index and the sessions from the engine again (after a snapshot was
    /// installed under a new generation).
    pub fn reload(&mut self) -> Result<(), String> {
        let (counters, row, alarms) = self
            .keyspace
            .read(|r| Ok((r.counters(), r.meta(SESSIONS_ROW)?, r.meta(ALARMS_ROW)?)))
            .map_err(|e| e.to_string())?;
        self.alarms = match alarms {
            Some(row) => Alarms::decode(&row).map_err(|e| e.to_string())?,
            None => Alarms::default(),
        };
        let st = match row {
            Some(row) => decode_sessions(&row)?,
            None => Default::default(),
        };
        (self.sessions, self.sessions_term, self.checkpointed) =
            (st.sessions, st.sessions_term, st.checkpointed);
        self.applied = counters.applied;
        self.checkpoint_in_flight.clear();
        self.keyspace.publish(&counters);
        Ok(())
    }

    /// An empty state in an engine of its own in memory (tests).
    #[cfg(test)]
    pub fn new() -> Self {
        KvState::open(StateEngine::in_memory(), 0).expect("an empty state opens")
    }

    /// The last applied index that is durable.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Everything applied was just made durable by a durable batch of the engine.
    pub(crate) fn mark_durable(&mut self) {
        self.durable = self.applied;
    }

    /// Make everything applied durable.
    pub fn make_durable(&mut self) -> Result<(), EngineError> {
        if self.durable < self.applied {
            self.keyspace.engine().persist()?;
            self.durable = self.applied;
        }
        Ok(())
    }

    /// Apply a run of committed entries, each `(index, data)` (empty data: nothing for the
    /// state machine), in one engine batch with the applied index; their outcomes. An engine
    /// failure writes nothing and is fatal to the caller.
    pub fn apply_run(&mut self, run: &[(u64, &[u8])]) -> Result<Vec<Option<Outcome>>, EngineError> {
        let engine = self.keyspace.engine().clone();
        let group = self.keyspace.group();
        let (outcomes, counters) = engine.write(false, |w| {
            let mut b = Batch::begin(w, group).map_err(fatal)?;
            let mut outcomes = Vec::with_capacity(run.len());
            for &(index, data) in run {
                self.advance(index);
                outcomes.push(match data.is_empty() {
                    true => None,
                    false => Some(self.apply_entry(&mut b, index, data)?),
                });
            }
            if b.sweep_due() {
                b.sweep(SWEEP_BUDGET).map_err(fatal)?;
            }
            if std::mem::take(&mut self.sessions_dirty) {
                let row =
                    SessionsState::encode(&self.sessions, self.sessions_term, &self.checkpointed);
                b.set_meta(SESSIONS_ROW, &row).map_err(fatal)?;
            }
            if std::mem::take(&mut self.alarms_dirty) {
                b.set_meta(ALARMS_ROW, &self.alarms.encode())
                    .map_err(fatal)?;
            }
            Ok((outcomes, b.finish(self.applied).map_err(fatal)?))
        })?;
        self.keyspace.publish(&counters);
        Ok(outcomes)
    }

    /// Apply one command, `(index, cmd, value)`, in a batch of its own (tests).
    #[cfg(test)]
    pub fn apply(&mut self, index: u64, cmd: Command, value: &[u8]) -> Outcome {
        let data = crate::state::command::encode(&cmd, value);
        let mut out = self.apply_run(&[(index, &data)]).expect("the engine works");
        out.pop()
            .flatten()
            .expect("an outcome for an entry with data")
    }

    /// Record `index` as applied (it must follow the last one).
    fn advance(&mut self, index: u64) {
        assert!(
            index > self.applied,
            "applied {index} after {}",
            self.applied
        );
        self.applied = index;
    }

    /// Apply one entry in `b`. A refusal is an outcome (the same on every replica); only an
    /// engine failure is an error.
    fn apply_entry(
        &mut self,
        b: &mut Batch<'_>,
        index: u64,
        data: &[u8],
    ) -> Result<Outcome, EngineError> {
        let (cmd, value) = match decode(data) {
            Ok(c) => c,
            // Every replica refuses it alike, so the state stays the same everywhere.
            Err(why) => return Ok(Outcome::Refused(Refusal::Undecodable(why))),
        };
        let _ = index;
        if self.alarms.any(NOSPACE) && adds_to_keyspace(&cmd, value) {
            return Ok(match cmd {
                Command::EtcdTxn {} => Outcome::Etcd(Err(MvccError::NoSpace)),
                _ => Outcome::Refused(Refusal::NoSpace),
            });
        }
        if let Command::EtcdTxn {} = cmd {
            return match self.etcd_txn(b, value) {
                Err(MvccError::Storage(e)) => Err(EngineError::Io(e)),
                done => Ok(Outcome::Etcd(done)),
            };
        }
        if let Err(why) = check_names(&cmd) {
            return Ok(Outcome::Refused(Refusal::BadName(why)));
        }
        let session_change = !matches!(
            cmd,
            Command::Put { .. }
                | Command::Delete { .. }
                | Command::EtcdCompact { .. }
                | Command::EtcdAlarm { .. }
        );
        self.sessions_dirty |= session_change;
        self.apply_command(b, cmd, value).map_err(fatal)
    }

    fn apply_command(
        &mut self,
        b: &mut Batch<'_>,
        cmd: Command,
        value: &[u8],
    ) -> Result<Outcome, MvccError> {
        Ok(match cmd {
            Command::Put {
                key,
                session,
                fence,
                ..
            } => self.put(b, key, value, session, fence)?,
            Command::Delete { key } => {
                let mut w = b.write();
                let gone = w.delete(key.as_bytes())?;
                let rev = w.commit();
                match gone {
                    Some(_) => Outcome::Revision(rev as u64),
                    None => Outcome::Refused(Refusal::NotFound),
                }
            }
            Command::SessionGrant { ttl_ms, now_ns } => self.grant(ttl_ms, now_ns),
            Command::SessionKeepalive { ids, .. } => self.clear_checkpoints(ids),
            Command::SessionRevoke { id } => match self.end_session(b, id)? {
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
            Command::EtcdTxn {} => unreachable!("applied by the caller"),
            Command::EtcdCompact { revision } => match b.compact(revision) {
                Ok(()) => Outcome::EtcdCompacted(Ok(b.counters.rev)),
                Err(MvccError::Storage(e)) => return Err(MvccError::Storage(e)),
                Err(e) => Outcome::EtcdCompacted(Err(e)),
            },
            Command::EtcdAlarm {
                activate,
                member,
                alarm,
            } => self.alarm(activate, member, alarm),
            Command::Takeover { term, now_ns } => {
                self.sessions.takeover(now_ns);
                self.sessions_term = term;
                self.checkpoint_in_flight.clear();
                Outcome::Housekeeping
            }
            Command::Expire { term, ids, .. } => {
                if term == self.sessions_term {
                    for id in ids {
                        self.end_session(b, id)?;
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
        })
    }

    /// An etcd transaction, from its protobuf encoding; its leases are sessions that exist.
    fn etcd_txn(
        &mut self,
        b: &mut Batch<'_>,
        encoded: &[u8],
    ) -> Result<crate::state::mvcc::txn::TxnDone, MvccError> {
        let t = <etcd_client::proto::PbTxnRequest as prost::Message>::decode(encoded)
            .map_err(|e| MvccError::Invalid(format!("undecodable transaction: {e}")))?;
        let sessions = &self.sessions;
        let exists = |id: i64| id > 0 && sessions.is_live(SessionId(id as u64), APPLY_NOW_NS);
        b.txn(&t, &exists)
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

    /// End session `id` (revoked or expired): its lease's keys go, in one revision; whether
    /// it was.
    fn end_session(&mut self, b: &mut Batch<'_>, id: u64) -> Result<bool, MvccError> {
        self.checkpointed.remove(&id);
        match self.sessions.revoke(SessionId(id)) {
            Some(_) => {
                b.end_lease(id as i64)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Raise or lower an alarm; what it changed (an alarm of type `NONE` changes nothing).
    fn alarm(&mut self, activate: bool, member: u64, alarm: i32) -> Outcome {
        let changed = match (alarm, activate) {
            (0, _) => false,
            (_, true) => self.alarms.raise(member, alarm),
            (_, false) => self.alarms.lower(member, alarm),
        };
        self.alarms_dirty |= changed;
        Outcome::Alarms(match changed {
            true => vec![(member, alarm)],
            false => Vec::new(),
        })
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

    /// A put of the HTTP API: fenced by a lock's token if asked, tied to a session (the lease
    /// of the same id) or untied from any.
    fn put(
        &mut self,
        b: &mut Batch<'_>,
        key: String,
        value: &[u8],
        session: Option<u64>,
        fence: Option<(String, u64)>,
    ) -> Result<Outcome, MvccError> {
        if let Some((lock, token)) = fence {
            // Exactly the current holder's token: a lower one is stale, a higher one was never
            // issued, and a lock nobody holds fences nothing.
            match self.sessions.lock_holder(&lock) {
                None => return Ok(Outcome::Refused(Refusal::LockNotHeld { lock })),
                Some((_, current)) if current != token => {
                    return Ok(Outcome::Refused(Refusal::StaleFence { token, current }))
                }
                Some(_) => {}
            }
        }
        if let Some(id) = session {
            if !self.sessions.is_live(SessionId(id), APPLY_NOW_NS) {
                return Ok(Outcome::Refused(Refusal::UnknownSession(id)));
            }
        }
        let mut w = b.write();
        w.put(key.as_bytes(), value.to_vec(), session.unwrap_or(0) as i64)?;
        Ok(Outcome::Revision(w.commit() as u64))
    }
}

/// Whether applying `cmd` (with `value`) may add to the keyspace or its leases: what etcd's
/// no-space mode refuses. A transaction that does not decode is let through (it is refused when
/// applied, writing nothing).
fn adds_to_keyspace(cmd: &Command, value: &[u8]) -> bool {
    match cmd {
        Command::Put { .. } | Command::SessionGrant { .. } => true,
        Command::EtcdTxn {} => <etcd_client::proto::PbTxnRequest as prost::Message>::decode(value)
            .is_ok_and(|t| crate::state::mvcc::txn::has_puts(&t)),
        _ => false,
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
        assert_eq!(s.apply(6, fenced("L", 1), b"v"), Outcome::Revision(2));
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
        let all = s.keyspace.read(|r| {
            let mut n = 0;
            r.scan_at(b"\0", b"\0", r.rev(), &mut |_, _| {
                n += 1;
                true
            })?;
            Ok(n)
        });
        assert_eq!(all, Ok(1));
    }

    #[test]
    fn a_raised_nospace_alarm_refuses_what_adds_and_lets_deletes_through_until_disarmed() {
        use crate::state::alarms::NOSPACE;
        use etcd_client::proto::{PbPutRequest, PbTxnRequest, PbTxnRequestOp};
        let engine = StateEngine::in_memory();
        let mut s = KvState::open(engine.clone(), 0).unwrap();
        let put = |k: &str| Command::Put {
            key: k.into(),
            session: None,
            fence: None,
            now_ns: 0,
        };
        assert!(matches!(s.apply(1, put("a"), b"1"), Outcome::Revision(_)));
        let raise = Command::EtcdAlarm {
            activate: true,
            member: 7,
            alarm: NOSPACE,
        };
        assert_eq!(
            s.apply(2, raise.clone(), b""),
            Outcome::Alarms(vec![(7, NOSPACE)])
        );
        assert_eq!(
            s.apply(3, raise, b""),
            Outcome::Alarms(vec![]),
            "raised already"
        );
        assert_eq!(
            s.apply(4, put("b"), b"2"),
            Outcome::Refused(Refusal::NoSpace)
        );
        let grant = Command::SessionGrant {
            ttl_ms: 1_000,
            now_ns: 0,
        };
        assert_eq!(s.apply(5, grant, b""), Outcome::Refused(Refusal::NoSpace));
        let op = etcd_client::proto::PbTxnOpRequest::RequestPut(PbPutRequest {
            key: b"c".to_vec(),
            value: b"3".to_vec(),
            ..Default::default()
        });
        let t = PbTxnRequest {
            failure: vec![PbTxnRequestOp { request: Some(op) }],
            ..Default::default()
        };
        let t = prost::Message::encode_to_vec(&t);
        let refused = s.apply(6, Command::EtcdTxn {}, &t);
        assert_eq!(
            refused,
            Outcome::Etcd(Err(MvccError::NoSpace)),
            "a put in either branch"
        );
        let del = s.apply(7, Command::Delete { key: "a".into() }, b"");
        assert!(
            matches!(del, Outcome::Revision(_)),
            "a delete passes: {del:?}"
        );
        // Every replica has the alarm from the engine: a reopened state still refuses.
        let mut s = KvState::open(engine, 0).unwrap();
        assert_eq!(
            s.apply(8, put("b"), b"2"),
            Outcome::Refused(Refusal::NoSpace)
        );
        let lower = Command::EtcdAlarm {
            activate: false,
            member: 7,
            alarm: NOSPACE,
        };
        assert_eq!(s.apply(9, lower, b""), Outcome::Alarms(vec![(7, NOSPACE)]));
        assert!(matches!(s.apply(10, put("b"), b"2"), Outcome::Revision(_)));
        assert!(matches!(
            s.apply(11, Command::EtcdTxn {}, &t),
            Outcome::Etcd(Ok(_))
        ));
    }
}
