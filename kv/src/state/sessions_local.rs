//! The leader's side of sessions: keep-alives answered from its memory under the leader lease,
//! and the housekeeping entries it proposes (expiry, checkpoints).
//!
//! **The rule.** A keep-alive moves the session's expiry in the leader's copy of the sessions
//! first, and is answered only if the leader lease is still valid afterwards (read first,
//! validate second, as a lease read). So it was received before the lease ended, and the lease
//! ended before any new leader could be elected and take over (the lease argument). A takeover
//! gives every session at least what its last checkpoint recorded, or a full TTL: the client's
//! view, `sent_at + TTL·(1−ρ) − ε`, ends before the new leader's expiry,
//! `takeover + TTL·(1+ρ) + ε`. Without the lease check, a deposed leader that still believes it
//! leads stretches a client's view past the new grantor's (the control in `tests/kv/sessions.rs`).
//!
//! **Checkpoints.** A checkpoint records what a session had left when the leader proposed it, so
//! a keep-alive answered after that moment must never be hidden by it. The leader checkpoints
//! only sessions with no keep-alive for half their TTL (a client renewing at a third of its TTL
//! never needs a raft entry), and a keep-alive of a session a checkpoint names (committed, or in
//! flight) is answered only once a replicated keep-alive, after the checkpoint in the log, has
//! cleared it.
//!
//! **Without the lease** the answer is 503 `lease_not_held` (retry), not a ReadIndex round: a
//! leader lacks its lease only at the start of its term (when its sessions are not on its clock
//! yet either) or when it is losing leadership, and a client has two thirds of its TTL to retry.
//! A ReadIndex round per keep-alive would load the raft thread exactly when it is in trouble.

use raft_lease::grant::SessionId;

use crate::state::command::{Command, Refusal};
use crate::state::kv_state::{session_config, KvState};

/// How often the leader proposes a checkpoint (when some session is idle).
pub const CHECKPOINT_EVERY_NS: u64 = 1_000_000_000;
/// Most sessions one `Expire` entry ends.
pub const EXPIRE_BATCH: usize = 1_000;

/// A keep-alive as the leader answered it from memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalKeepAlive {
    /// Sessions refreshed.
    pub refreshed: usize,
    /// Ids of no live session.
    pub unknown: Vec<u64>,
    /// Refreshed sessions that a checkpoint names: the answer waits for a replicated keep-alive
    /// of these to clear it.
    pub via_raft: Vec<u64>,
}

impl KvState {
    /// On the leader of `term`, at `now_ns` on its clock: refresh `ids` in memory. The caller
    /// answers only if the leader lease is valid after this returns (and, for `via_raft`, once
    /// their replicated keep-alive applied).
    pub fn keepalive_local(
        &mut self,
        ids: &[u64],
        term: u64,
        now_ns: u64,
    ) -> Result<LocalKeepAlive, Refusal> {
        if self.sessions_term != term {
            return Err(Refusal::NotReady);
        }
        let sids: Vec<SessionId> = ids.iter().copied().map(SessionId).collect();
        let ka = self.sessions.keepalive(&sids, now_ns);
        let unknown: Vec<u64> = ka.unknown.iter().map(|s| s.0).collect();
        let via_raft = ids
            .iter()
            .copied()
            .filter(|id| !unknown.contains(id))
            .filter(|id| self.checkpointed.contains(id) || self.checkpoint_in_flight.contains(id))
            .collect();
        Ok(LocalKeepAlive {
            refreshed: ka.refreshed,
            unknown,
            via_raft,
        })
    }

    /// On the leader: sessions whose expiry (in its memory) passed by `now_ns`, at most
    /// [`EXPIRE_BATCH`].
    pub fn expired_ids(&self, now_ns: u64) -> Vec<u64> {
        if self.sessions.next_expiry_ns().is_none_or(|t| t > now_ns) {
            return Vec::new();
        }
        let mut due: Vec<(u64, u64)> = self
            .sessions
            .expiries()
            .filter(|&(_, _, expiry_ns)| expiry_ns <= now_ns)
            .map(|(id, _, expiry_ns)| (expiry_ns, id.0))
            .collect();
        due.sort_unstable();
        due.into_iter()
            .take(EXPIRE_BATCH)
            .map(|(_, id)| id)
            .collect()
    }

    /// On the leader of `term`: a checkpoint to propose, if one is due and some session has had
    /// no keep-alive for half its TTL. Marks its sessions in flight (see the module docs).
    pub fn checkpoint_due(&mut self, term: u64, now_ns: u64) -> Option<Command> {
        if now_ns < self.next_checkpoint_ns {
            return None;
        }
        self.next_checkpoint_ns = now_ns.saturating_add(CHECKPOINT_EVERY_NS);
        let config = session_config();
        let remaining: Vec<(u64, u64)> = self
            .sessions
            .expiries()
            .filter_map(|(id, ttl_ms, expiry_ns)| {
                let left_ns = expiry_ns.saturating_sub(now_ns);
                let idle_ns = config.grantor_hold_ns(ttl_ms).saturating_sub(left_ns);
                (idle_ns > ttl_ms * 500_000).then_some((id.0, left_ns))
            })
            .collect();
        if remaining.is_empty() {
            return None;
        }
        self.checkpoint_in_flight = remaining.iter().map(|(id, _)| *id).collect();
        Some(Command::Checkpoint {
            term,
            now_ns,
            remaining,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::machine::{Leading, StateMachine};
    use crate::state::command::{decode, Outcome};
    use crate::state::kv_machine::KvCommand;

    const MS: u64 = 1_000_000;
    const TTL_MS: u64 = 3_000;

    /// A leader and a follower that apply the same log; `t0` is the leader's clock at takeover.
    struct Pair {
        leader: KvState,
        follower: KvState,
        index: u64,
    }

    impl Pair {
        fn new(t0: u64) -> Pair {
            let mut p = Pair {
                leader: KvState::new(),
                follower: KvState::new(),
                index: 0,
            };
            p.apply(Command::Takeover {
                term: 2,
                now_ns: t0,
            });
            p
        }

        fn apply(&mut self, cmd: Command) -> Outcome {
            self.index += 1;
            let out = self.leader.apply(self.index, cmd.clone(), b"");
            assert_eq!(self.follower.apply(self.index, cmd, b""), out);
            out
        }

        /// What the leader proposes for `cmd` at `now_ns`, applied on both.
        fn propose(&mut self, cmd: Command, now_ns: u64) -> Outcome {
            let at = Leading { term: 2, now_ns };
            let kv = KvCommand { cmd, value: vec![] };
            match self.leader.prepare(kv, &at) {
                Ok(data) => self.apply(decode(&data).unwrap().0),
                Err(refused) => refused,
            }
        }

        fn grant(&mut self, now_ns: u64) -> u64 {
            let grant = Command::SessionGrant {
                ttl_ms: TTL_MS,
                now_ns,
            };
            match self.propose(grant, now_ns) {
                Outcome::Session(id) => id,
                other => panic!("{other:?}"),
            }
        }
    }

    fn hold_ns() -> u64 {
        session_config().grantor_hold_ns(TTL_MS)
    }

    fn view_ns() -> u64 {
        session_config().holder_valid_ns(TTL_MS)
    }

    #[test]
    fn keepalives_move_only_the_leaders_copy_and_replicas_apply_its_decisions_alike() {
        let mut p = Pair::new(0);
        let (a, b) = (p.grant(0), p.grant(0));
        let lock = |session| Command::Lock {
            name: "L".into(),
            session,
            now_ns: 0,
        };
        assert_eq!(p.propose(lock(a), 0), Outcome::Token(1));
        for t in [1_000, 2_000, 3_000, 4_000] {
            let ka = p.leader.keepalive_local(&[a], 2, t * MS).unwrap();
            assert_eq!((ka.refreshed, ka.via_raft.len()), (1, 0), "no raft entry");
        }
        // b expired in the leader's memory; a lives on it, though no entry moved a's expiry.
        let now = 4_500 * MS;
        assert_eq!(p.leader.expired_ids(now), vec![b]);
        assert!(
            p.follower.expired_ids(now).len() == 2,
            "replicas' expiries mean nothing"
        );
        let ids = p.leader.expired_ids(now);
        p.apply(Command::Expire {
            term: 2,
            now_ns: now,
            ids,
        });
        // A lock by a's session is refused on the leader's word, before it is proposed; one by
        // b's too (gone), and one by a applies alike on every replica (time-free).
        assert!(matches!(
            p.propose(lock(b), now),
            Outcome::Refused(Refusal::UnknownSession(_))
        ));
        let held = Outcome::Refused(Refusal::LockHeld {
            holder: a,
            token: Some(1),
        });
        assert_eq!(
            p.propose(lock(a), now),
            held,
            "the holder is told its token, not granted"
        );
        assert_eq!(p.leader.sessions.image(), {
            let mut f = p.follower.sessions.image();
            f.sessions
                .iter_mut()
                .zip(p.leader.sessions.image().sessions)
                .for_each(|(s, l)| {
                    s.expiry_ns = l.expiry_ns; // the only difference: expiries in memory
                });
            f
        });
        let late = 4_000 * MS + hold_ns();
        let put = Command::Put {
            key: "k".into(),
            session: Some(a),
            fence: None,
            now_ns: 0,
        };
        assert_eq!(
            p.propose(put, late),
            Outcome::Refused(Refusal::UnknownSession(a)),
            "a put ties no key to a session whose TTL ran out in the leader's memory"
        );
    }

    #[test]
    fn only_sessions_idle_for_half_their_ttl_are_checkpointed() {
        let mut p = Pair::new(0);
        let (busy, idle) = (p.grant(0), p.grant(0));
        p.leader.keepalive_local(&[busy], 2, 1_000 * MS).unwrap();
        assert_eq!(
            p.leader.checkpoint_due(2, 1_400 * MS),
            None,
            "nobody idle yet"
        );
        let Some(Command::Checkpoint { remaining, .. }) = p.leader.checkpoint_due(2, 2_400 * MS)
        else {
            panic!("idle for 2.4 s of a 3 s TTL")
        };
        let want = vec![(idle, hold_ns() - 2_400 * MS)];
        assert_eq!(remaining, want, "busy: idle for 1.4 s");
        assert_eq!(
            p.leader.checkpoint_due(2, 3_000 * MS),
            None,
            "once a second"
        );
    }

    /// A client kept alive in the leader's memory after a checkpoint was proposed: the follower
    /// that takes over must give it no less than the client's view.
    fn view_outlives_takeover(keepalive_in_memory_only: bool) -> bool {
        let mut p = Pair::new(0);
        let s = p.grant(0);
        let ckpt = p
            .leader
            .checkpoint_due(2, 2_000 * MS)
            .expect("idle for 2 s");
        let sent_at = 2_100 * MS; // the client's request; the leader's clock is exact here
        let ka = p.leader.keepalive_local(&[s], 2, sent_at).unwrap();
        assert_eq!(ka.via_raft, vec![s], "named by the checkpoint in flight");
        p.apply(ckpt);
        if !keepalive_in_memory_only {
            let clear = Command::SessionKeepalive {
                ids: ka.via_raft,
                now_ns: sent_at,
            };
            assert!(matches!(
                p.propose(clear, sent_at),
                Outcome::KeepAlive { .. }
            ));
        }
        // The lease ends; the follower takes over on its own clock, at real time 2.2 s.
        let takeover = 2_200 * MS;
        p.follower.apply(
            p.index + 1,
            Command::Takeover {
                term: 3,
                now_ns: takeover,
            },
            b"",
        );
        let expiry = p.follower.sessions.expiries().next().unwrap().2;
        sent_at + view_ns() > expiry
    }

    #[test]
    fn a_keepalive_after_a_checkpoint_was_proposed_waits_for_raft_to_clear_it() {
        assert!(!view_outlives_takeover(false));
        assert!(
            view_outlives_takeover(true),
            "control: answered from memory alone, the checkpoint hides the keep-alive"
        );
    }

    #[test]
    fn a_snapshot_keeps_the_checkpoint_so_a_restored_node_gives_what_it_recorded() {
        let mut p = Pair::new(0);
        let s = p.grant(0);
        let ckpt = p.leader.checkpoint_due(2, 2_000 * MS).unwrap();
        p.apply(ckpt);
        let mut snap = Vec::new();
        let view: Box<dyn crate::peer::snapshot_send::StreamSource> =
            Box::new(p.follower.view_for_snapshot().unwrap());
        view.stream(1 << 10, &mut |c| {
            snap.extend(c);
            Ok(())
        })
        .unwrap();
        let mut restored = KvState::new();
        restored.install_stream(&snap, p.index).unwrap();
        assert!(restored.checkpointed.contains(&s));
        restored.apply(p.index + 1, Command::Takeover { term: 3, now_ns: 0 }, b"");
        let left = hold_ns() - 2_000 * MS;
        assert_eq!(restored.sessions.expiries().next().unwrap().2, left);
        // Control: the same snapshot without its checkpoint gives a full TTL again.
        let mut bare = KvState::new();
        bare.install_stream(&snap, p.index).unwrap();
        bare.sessions =
            raft_lease::grant::Sessions::from_image(session_config(), bare.sessions.image());
        bare.apply(p.index + 1, Command::Takeover { term: 3, now_ns: 0 }, b"");
        assert_eq!(bare.sessions.expiries().next().unwrap().2, hold_ns());
    }

    #[test]
    fn the_leader_answers_not_ready_until_its_takeover_applied() {
        let mut p = Pair::new(0);
        let s = p.grant(0);
        assert_eq!(p.leader.keepalive_local(&[s], 3, 0), Err(Refusal::NotReady));
        let ka = p.leader.keepalive_local(&[s, 99], 2, 0).unwrap();
        assert_eq!((ka.refreshed, ka.unknown), (1, vec![99]));
    }
}
