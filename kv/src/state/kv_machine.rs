//! The KV's own part of the raft loop: its state (keys, sessions, locks) as a
//! [`StateMachine`], what the leader fills in and checks before proposing (its clock; that the
//! session is live in its memory), and its housekeeping (a new leader's sessions takeover, then
//! session expiry and checkpoints, see `sessions_local`).

use raft_lease::grant::SessionId;

use crate::raft::machine::{Leading, StateMachine};
use crate::state::command::{decode, encode, Command, Outcome, Refusal};
use crate::state::kv_state::{KvState, Stored};

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
    type Answer = Option<Stored>;

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        if snapshot.is_empty() {
            return Ok(KvState::new());
        }
        KvState::from_snapshot(snapshot)
    }

    fn snapshot(&self) -> Vec<u8> {
        KvState::snapshot(self)
    }

    fn applied(&self) -> u64 {
        self.applied
    }

    fn skip(&mut self, index: u64) {
        self.advance(index);
    }

    fn apply(&mut self, index: u64, data: &[u8]) -> Outcome {
        match decode(data) {
            Ok((cmd, value)) => KvState::apply(self, index, cmd, value),
            Err(why) => {
                // Every replica refuses it alike, so the state stays the same everywhere.
                self.advance(index);
                Outcome::Refused(Refusal::Undecodable(why))
            }
        }
    }

    fn query(&self, key: &String) -> Option<Stored> {
        self.kv.get(key).cloned()
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
