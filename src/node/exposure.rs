//! Follower read leases inside the node: the exposed index `E`, carried on the leader's appends
//! and heartbeats, and applies held back to it (FOLLOWER.md rule 1). Off unless
//! [`LeaseConfig::follower_leases`](crate::LeaseConfig::follower_leases) is set.
//!
//! Every replica, the leader included, hands the application only committed entries at or below
//! the largest `E` it knows; the rest wait here until `E` reaches them. raft-rs is told what was
//! applied with `advance_append` and `advance_apply_to`, never `advance`, which would count held
//! entries as applied (and let raft accept a second configuration change while one waits).

use std::collections::VecDeque;

use raft::eraftpb::Entry;

use super::*;
use crate::follower::{GrantTable, HolderNote, LeaderNote, ReadLease};

/// The exposed index and the entries held back from the application.
#[derive(Debug)]
pub(crate) struct Exposure {
    /// The grants this node made as a leader, and the `E` it computed (kept across terms).
    table: GrantTable,
    /// This node's read lease as a voter, and the largest `E` it received.
    lease: ReadLease,
    /// Committed entries above `E`, in index order, not yet handed to the application.
    held: VecDeque<Entry>,
    /// The last index handed to the application (or covered by a snapshot). Never above
    /// [`Exposure::exposed`] but for a snapshot's.
    applied: u64,
}

impl Exposure {
    /// Follower leases with `G` = `max_grant_ns`, for a node that has applied up to `applied`
    /// (raft's `Config::applied`: the application's own persisted index, never raft's commit).
    pub(crate) fn new(derived: &Derived, boot_ns: u64, applied: u64) -> Self {
        let max_grant_ns = derived.max_grant_ns.expect("follower leases on");
        Exposure {
            table: GrantTable::new(max_grant_ns, derived.drift_ppm, derived.margin_ns),
            lease: ReadLease::new(boot_ns, derived.drift_ppm, derived.margin_ns),
            held: VecDeque::new(),
            applied,
        }
    }

    /// `E`: the largest exposed index this node computed or received. Never goes down.
    pub(crate) fn exposed(&self) -> u64 {
        self.table.exposed().max(self.lease.exposed())
    }

    /// The last index handed to the application.
    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// As the leader of `term` at `now_ns`, with raft's `commit` (an entry of `term` committed or
    /// not): recompute `E`.
    pub(crate) fn expose(&mut self, commit: u64, committed_in_term: bool, now_ns: u64) {
        self.table.expose(commit, committed_in_term, now_ns);
    }

    /// A leader's note arrived with one of its messages.
    pub(crate) fn on_note(&mut self, note: &LeaderNote) {
        self.lease.on_exposed(note.exposed);
    }

    /// What the leader tells each voter on its appends and heartbeats: `E`.
    pub(crate) fn annotate(&self, msgs: &mut [Message]) {
        let note = LeaderNote {
            exposed: self.exposed(),
            grant: None,
        };
        for m in msgs.iter_mut().filter(|m| {
            matches!(
                m.get_msg_type(),
                MessageType::MsgAppend | MessageType::MsgHeartbeat
            )
        }) {
            let mut ctx = m.take_context().to_vec();
            note.attach(&mut ctx);
            m.context = ctx.into();
        }
    }

    /// Take newly committed `entries` (consecutive, after every entry taken before) and return
    /// those the application may apply now: every entry held or new up to `E`.
    pub(crate) fn release(&mut self, entries: Vec<Entry>) -> Vec<Entry> {
        if let (Some(last), Some(first)) = (self.held.back(), entries.first()) {
            assert_eq!(
                first.index,
                last.index + 1,
                "committed entries out of order"
            );
        }
        self.held.extend(entries);
        let exposed = self.exposed();
        let n = self.held.iter().take_while(|e| e.index <= exposed).count();
        let out: Vec<Entry> = self.held.drain(..n).collect();
        if let Some(last) = out.last() {
            assert!(
                last.index > self.applied,
                "entry {} applied twice",
                last.index
            );
            self.applied = last.index;
        }
        debug_assert!(self.applied <= exposed || out.is_empty());
        debug_assert!(self.held.front().is_none_or(|e| e.index > exposed));
        out
    }

    /// A snapshot up to `index` was installed: entries it covers are dropped, and it counts as
    /// applied. `E` is not raised from it.
    pub(crate) fn on_snapshot(&mut self, index: u64) {
        self.held.retain(|e| e.index > index);
        self.applied = self.applied.max(index);
    }
}

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// The exposed index `E` this node knows (`None`: follower leases are off). The application
    /// is handed committed entries up to it only.
    pub fn exposed(&self) -> Option<u64> {
        self.exposure.as_ref().map(Exposure::exposed)
    }

    /// As the leader, recompute `E` from raft's commit index.
    pub(crate) fn expose_now(&mut self) {
        let r = &self.raw.raft;
        let Some(x) = self.exposure.as_mut() else {
            return;
        };
        if r.state != StateRole::Leader {
            return;
        }
        let commit = r.raft_log.committed;
        let in_term = r.raft_log.term(commit).is_ok_and(|t| t == r.term);
        x.expose(commit, in_term, self.clock.now_ns());
    }

    /// The committed `entries` the application may apply now (all of them with follower leases
    /// off).
    pub(crate) fn hold_back(&mut self, entries: Vec<Entry>) -> Vec<Entry> {
        match self.exposure.as_mut() {
            Some(x) => x.release(entries),
            None => entries,
        }
    }

    /// Tell raft what the application applied: with follower leases, only what was released.
    pub(crate) fn advance_applied(&mut self) {
        match self.exposure.as_ref().map(Exposure::applied) {
            Some(applied) => {
                let applied = applied.max(self.raw.raft.raft_log.applied);
                self.advance_apply_to(applied)
            }
            None => self.advance_apply(),
        }
    }

    /// Take raft's `Ready` past its committed entries: with follower leases, raft must not count
    /// the held ones applied.
    pub(crate) fn advance_for_exposure(&mut self, rd: Ready) -> LightReady {
        match self.exposure.is_some() {
            true => {
                let light = self.advance_append(rd);
                self.advance_applied();
                light
            }
            false => self.advance(rd),
        }
    }

    /// A snapshot up to `index` was installed.
    pub(crate) fn exposure_on_snapshot(&mut self, index: u64) {
        if let Some(x) = self.exposure.as_mut() {
            x.on_snapshot(index);
        }
    }

    /// Split a follower-lease note off a peer's message, keeping what it says. `false`: the
    /// note is malformed and the message must be dropped.
    pub(crate) fn take_note(&mut self, m: &mut Message) -> bool {
        let ctx = m.take_context();
        let split = match m.get_msg_type() {
            MessageType::MsgAppend | MessageType::MsgHeartbeat => {
                LeaderNote::split(&ctx).map(|(base, note)| {
                    if let (Some(x), Some(note)) = (self.exposure.as_mut(), note) {
                        x.on_note(&note);
                    }
                    base.to_vec()
                })
            }
            MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse => {
                HolderNote::split(&ctx).map(|(base, _)| base.to_vec())
            }
            _ => Ok(ctx.to_vec()),
        };
        match split {
            Ok(base) => {
                m.context = base.into();
                true
            }
            Err(e) => {
                warn!(self.logger, "peer message dropped"; "why" => %e, "from" => m.from);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derived() -> Derived {
        let cfg = LeaseConfig {
            follower_leases: Some(crate::config::FollowerLeases { max_grant_ms: 300 }),
            ..LeaseConfig::default()
        };
        let rc = raft::Config {
            election_tick: 10,
            heartbeat_tick: 1,
            ..Default::default()
        };
        cfg.validate(&rc, 100).unwrap()
    }

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        range
            .map(|index| Entry {
                index,
                term: 1,
                ..Default::default()
            })
            .collect()
    }

    fn indexes(es: &[Entry]) -> Vec<u64> {
        es.iter().map(|e| e.index).collect()
    }

    #[test]
    fn entries_past_the_exposed_index_wait_for_it() {
        let mut x = Exposure::new(&derived(), 1, 2);
        assert!(x.release(entries(3..=5)).is_empty(), "E is 0: nothing");
        x.on_note(&LeaderNote {
            exposed: 4,
            grant: None,
        });
        assert_eq!(indexes(&x.release(Vec::new())), [3, 4]);
        assert_eq!(x.applied(), 4);
        assert_eq!(indexes(&x.release(entries(6..=6))), Vec::<u64>::new());
        x.on_note(&LeaderNote {
            exposed: 3,
            grant: None,
        });
        assert_eq!(x.exposed(), 4, "E never goes down");
        x.expose(9, true, 0);
        assert_eq!(indexes(&x.release(Vec::new())), [5, 6]);
    }

    #[test]
    fn a_leader_exposes_only_once_its_term_has_a_committed_entry() {
        let mut x = Exposure::new(&derived(), 1, 0);
        x.expose(7, false, 0);
        assert_eq!(x.exposed(), 0);
        x.expose(7, true, 0);
        assert_eq!(x.exposed(), 7);
    }

    #[test]
    fn a_snapshot_drops_what_it_covers_and_never_raises_the_exposed_index() {
        let mut x = Exposure::new(&derived(), 1, 0);
        assert!(x.release(entries(1..=4)).is_empty());
        x.on_snapshot(3);
        assert_eq!((x.applied(), x.exposed()), (3, 0));
        x.on_note(&LeaderNote {
            exposed: 4,
            grant: None,
        });
        assert_eq!(indexes(&x.release(Vec::new())), [4]);
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn a_gap_in_committed_entries_is_a_bug() {
        let mut x = Exposure::new(&derived(), 1, 0);
        x.release(entries(1..=2));
        x.release(entries(4..=4));
    }
}
