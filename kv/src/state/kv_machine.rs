//! The KV's own part of the raft loop: its state (keys, sessions, locks) as a
//! [`StateMachine`], what the leader fills in and checks before proposing (its clock; that the
//! session is live in its memory), and its housekeeping (a new leader's sessions takeover, then
//! session expiry and checkpoints, see `sessions_local`).

use raft_lease::grant::SessionId;

use crate::disk::state_engine::{EngineError, StateEngine};
use crate::peer::snapshot_send::StreamSource;
use crate::raft::machine::{Leading, StateMachine};
use crate::state::command::{encode, Command, Outcome, Refusal};
use crate::state::kv_state::{KvState, Stored};
use crate::state::mvcc::{Keyspace, MvccError};

/// `key`'s current value as the HTTP API answers it, read from one view of the keyspace.
pub fn stored(ks: &Keyspace, key: &str) -> Result<Option<Stored>, MvccError> {
    let v = ks.read(|r| r.latest(key.as_bytes()))?;
    Ok(v.map(|v| Stored {
        value: v.value.unwrap_or_default(),
        revision: v.mod_rev as u64,
    }))
}

/// A command and the value it carries (empty for all but a put).
#[derive(Debug)]
pub struct KvCommand {
    /// The command.
    pub cmd: Command,
    /// A put's value.
    pub value: Vec<u8>,
}

impl StateMachine for KvState {
    type Command = KvCommand;
    type Outcome = Outcome;
    type Query = String;
    type Answer = Result<Option<Stored>, MvccError>;
    type Reader = Keyspace;

    fn open(engine: StateEngine, group: u64) -> Result<Self, String> {
        KvState::open(engine, group)
    }

    fn reader(&self) -> Keyspace {
        self.keyspace.clone()
    }

    fn applied(&self) -> u64 {
        self.applied
    }

    fn durable(&self) -> u64 {
        KvState::durable(self)
    }

    fn make_durable(&mut self) -> Result<(), EngineError> {
        KvState::make_durable(self)
    }

    fn mark_durable(&mut self) {
        KvState::mark_durable(self)
    }

    fn apply(&mut self, run: &[(u64, &[u8])]) -> Result<Vec<Option<Outcome>>, EngineError> {
        self.apply_run(run)
    }

    fn query(&self, key: &String) -> Result<Option<Stored>, MvccError> {
        stored(&self.keyspace, key)
    }

    fn snapshot_view(&self) -> Result<Box<dyn StreamSource>, EngineError> {
        Ok(Box::new(self.view_for_snapshot()?))
    }

    fn stage(&mut self, stream: &[u8], index: u64) -> Result<u64, String> {
        KvState::stage(self, stream, index)
    }

    fn staged_index(&self, id: u64) -> Result<Option<u64>, String> {
        KvState::staged_index(self, id)
    }

    fn install_staged(&mut self, id: u64) -> Result<(), String> {
        KvState::install_staged(self, id)
    }

    fn settle(&mut self, log_snapshot_index: u64) -> Result<(), String> {
        KvState::settle(self, log_snapshot_index)
    }

    fn tidy(&mut self) -> Result<bool, EngineError> {
        self.tidy_step()
    }

    /// Session times are the leader's clock readings, and mean something only once the
    /// sessions are on this leader's clock (its `Takeover` applied). A lock or a put tied to a
    /// session needs the session live in the leader's memory now: replicas do not look at time.
    fn prepare(&self, c: KvCommand, at: &Leading) -> Result<Vec<u8>, Outcome> {
        let KvCommand { mut cmd, value } = c;
        if cmd.on_leader_clock() {
            if self.sessions_term != at.term {
                return Err(Outcome::Refused(Refusal::NotReady));
            }
            cmd.set_now(at.now_ns);
        }
        if let Some(id) = cmd.session_to_check() {
            if !self.sessions.is_live(SessionId(id), at.now_ns) {
                return Err(Outcome::Refused(Refusal::UnknownSession(id)));
            }
        }
        Ok(encode(&cmd, &value))
    }

    /// First a takeover, which re-bases every session on the new leader's clock; then the
    /// expiry of sessions whose TTL ran out in its memory; then, every second, a checkpoint of
    /// idle sessions.
    fn housekeeping(&mut self, at: &Leading) -> Option<Vec<u8>> {
        let cmd = if self.sessions_term != at.term {
            Command::Takeover {
                term: at.term,
                now_ns: at.now_ns,
            }
        } else {
            let ids = self.expired_ids(at.now_ns);
            if !ids.is_empty() {
                Command::Expire {
                    term: at.term,
                    now_ns: at.now_ns,
                    ids,
                }
            } else {
                self.checkpoint_due(at.term, at.now_ns)?
            }
        };
        Some(encode(&cmd, &[]))
    }

    fn entry_keys(entry: &raft::eraftpb::Entry) -> raft_lease::follower::Keys {
        crate::state::command::entry_keys(entry)
    }
}
