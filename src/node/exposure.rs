//! Follower read leases inside the node: the exposed index `E`, carried on the leader's appends
//! and heartbeats, and applies held back to it (FOLLOWER.md rule 1). Off unless
//! [`LeaseConfig::follower_leases`](crate::LeaseConfig::follower_leases) is set.
//!
//! Every replica, the leader included, hands the application only committed entries at or below
//! the largest `E` it knows; the rest wait here until `E` reaches them. raft-rs is told what was
//! applied with `advance_append` and `advance_apply_to`, never `advance`, which would count held
//! entries as applied (and let raft accept a second configuration change while one waits).

use std::collections::VecDeque;

use raft::eraftpb::{Entry, Message, MessageType};

use super::*;
use crate::follower::{
    Grant, GrantRequest, GrantTable, HolderNote, LeaderNote, LocalRefusal, ReadLease,
};
use std::collections::BTreeMap;

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
    /// Grants made and not yet sent, by holder: each leaves on the next append or heartbeat to it.
    pending: BTreeMap<u64, Grant>,
    /// `MsgTimeoutNow`s held until every read lease this node granted has ended (rule 4).
    held_timeout_now: Vec<Message>,
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
            pending: BTreeMap::new(),
            held_timeout_now: Vec::new(),
        }
    }

    /// The negative controls the testing knobs ask for.
    pub(crate) fn with_controls(mut self, knobs: &crate::config::TestingKnobs) -> Self {
        if knobs.expose_commit {
            self.table = self.table.control_expose_commit();
        }
        self
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

    /// A leader's note arrived with one of its messages, while this replica is in `term`.
    pub(crate) fn on_note(&mut self, note: &LeaderNote, term: u64, now_ns: u64) {
        self.lease.on_exposed(note.exposed);
        if let Some(g) = &note.grant {
            self.lease.on_grant(g, term, now_ns);
        }
    }

    /// What the leader tells each voter on its appends and heartbeats: `E`, and the grant made
    /// to it since the last message, if any.
    pub(crate) fn annotate(&mut self, msgs: &mut [Message]) {
        let exposed = self.exposed();
        for m in msgs.iter_mut().filter(|m| {
            matches!(
                m.get_msg_type(),
                MessageType::MsgAppend | MessageType::MsgHeartbeat
            )
        }) {
            let note = LeaderNote {
                exposed,
                grant: self.pending.remove(&m.to),
            };
            let mut ctx = m.take_context().to_vec();
            note.attach(&mut ctx);
            m.context = ctx.into();
        }
    }

    /// As a voter of `term` following `leader`: tag each acknowledgement to it, reading the
    /// clock (`now_ns`) before the transport has it.
    pub(crate) fn tag_acks(&mut self, msgs: &mut [Message], term: u64, leader: u64, now_ns: u64) {
        for m in msgs.iter_mut().filter(|m| {
            m.to == leader
                && m.term == term
                && matches!(
                    m.get_msg_type(),
                    MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse
                )
        }) {
            let note = HolderNote {
                tag: Some(self.lease.tag(term, now_ns)),
                gave_up: None,
            };
            let mut ctx = m.take_context().to_vec();
            note.attach(&mut ctx);
            m.context = ctx.into();
        }
    }

    /// As the leader of `term`: a voter's tagged acknowledgement, stepped at `req.received_ns`
    /// with raft's matched index after it. A grant answers it if every rule allows
    /// ([`GrantTable::grant`]); it leaves with the next message to the voter.
    pub(crate) fn on_ack(&mut self, req: GrantRequest, term: u64, leader_until_ns: Option<u64>) {
        self.table.on_matched(req.holder, req.matched);
        if let Ok(g) = self.table.grant(req, term, leader_until_ns) {
            self.pending.insert(req.holder, g);
        }
    }

    /// As the leader of `term` at `now_ns`: a transfer stops every grant in `term`, and every
    /// `MsgTimeoutNow` waits in the node until every read lease granted has ended.
    pub(crate) fn hold_timeout_now(&mut self, msgs: &mut Vec<Message>, term: u64, now_ns: u64) {
        let is_timeout_now = |m: &Message| m.get_msg_type() == MessageType::MsgTimeoutNow;
        if !msgs.iter().any(is_timeout_now) {
            return;
        }
        self.table.stop_granting(term);
        if !self.table.all_ended(now_ns) {
            let (held, rest): (Vec<Message>, Vec<Message>) =
                msgs.drain(..).partition(is_timeout_now);
            self.held_timeout_now.extend(held);
            *msgs = rest;
        }
    }

    /// The held `MsgTimeoutNow`s that may leave: once every read lease has ended, those raft
    /// still sends, to its transferee in its term. The others are dropped, never to be sent.
    pub(crate) fn release_timeout_now(
        &mut self,
        term: u64,
        transferee: Option<u64>,
        now_ns: u64,
    ) -> Vec<Message> {
        self.held_timeout_now
            .retain(|m| m.term == term && transferee == Some(m.to));
        match self.table.all_ended(now_ns) {
            true => std::mem::take(&mut self.held_timeout_now),
            false => Vec::new(),
        }
    }

    /// A transfer is under way in `term`: no more grants in it.
    pub(crate) fn stop_granting(&mut self, term: u64) {
        self.table.stop_granting(term);
    }

    /// Whether this replica's read lease is valid at `now_ns`.
    pub(crate) fn holds_read_lease(&self, now_ns: u64) -> bool {
        self.lease.is_valid(now_ns)
    }

    /// Whether a grant this node made may still be counted at `now_ns`.
    pub(crate) fn counts_any(&self, now_ns: u64) -> bool {
        !self.table.all_ended(now_ns)
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

    /// Negative control: hand over every committed entry, `E` or not.
    fn release_all(&mut self, entries: Vec<Entry>) -> Vec<Entry> {
        let mut out: Vec<Entry> = self.held.drain(..).collect();
        out.extend(entries);
        if let Some(last) = out.last() {
            self.applied = last.index;
        }
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
        let to_commit = self.safeties.testing.apply_to_commit;
        match self.exposure.as_mut() {
            Some(x) if to_commit => x.release_all(entries),
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

    /// Split a follower-lease note off a peer's message, keeping what a leader's says; a
    /// voter's is returned, to be answered once raft has stepped the message. `Err`: the note is
    /// malformed and the message must be dropped.
    pub(crate) fn take_note(&mut self, m: &mut Message) -> Result<Option<HolderNote>, ()> {
        if !m.get_context().ends_with(crate::follower::wire::MAGIC) {
            return Ok(None); // no trailer: the message stays as it came, uncopied
        }
        let ctx = m.take_context();
        let (term, now_ns) = (self.raw.raft.term, self.clock.now_ns());
        let split = match m.get_msg_type() {
            MessageType::MsgAppend | MessageType::MsgHeartbeat => {
                LeaderNote::split(&ctx).map(|(base, note)| {
                    if let (Some(x), Some(note)) = (self.exposure.as_mut(), note) {
                        x.on_note(&note, term, now_ns);
                    }
                    (base.to_vec(), None)
                })
            }
            MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse => {
                HolderNote::split(&ctx).map(|(base, note)| (base.to_vec(), note))
            }
            _ => Ok((ctx.to_vec(), None)),
        };
        match split {
            Ok((base, note)) => {
                m.context = base.into();
                Ok(note)
            }
            Err(e) => {
                warn!(self.logger, "peer message dropped"; "why" => %e, "from" => m.from);
                Err(())
            }
        }
    }

    /// As the leader: a voter's note, on an acknowledgement raft has just stepped.
    pub(crate) fn on_holder_note(&mut self, from: u64, note: HolderNote) {
        let r = &self.raw.raft;
        let Some(x) = self.exposure.as_mut() else {
            return;
        };
        let (Some(tag), StateRole::Leader) = (note.tag, r.state) else {
            return;
        };
        let req = GrantRequest {
            holder: from,
            tag,
            received_ns: self.clock.now_ns(),
            is_voter: r.prs().conf().voters().contains(from),
            matched: r.prs().get(from).map_or(0, |p| p.matched),
        };
        let until_ns = self
            .lease
            .usable_until_ns()
            .filter(|_| self.lease.term() == Some(r.term));
        if r.lead_transferee.is_some() {
            x.stop_granting(r.term);
        }
        x.on_ack(req, r.term, until_ns);
    }

    /// Hold every `MsgTimeoutNow` in `msgs` while a read lease lives; a node that no longer
    /// leads (it stepped down with one still queued) sends none.
    pub(crate) fn hold_transfer(&mut self, msgs: &mut Vec<Message>) {
        let r = &self.raw.raft;
        let (term, leading, now_ns) = (r.term, r.state == StateRole::Leader, self.clock.now_ns());
        let send_at_once = self.safeties.testing.no_transfer_wait;
        let Some(x) = self.exposure.as_mut().filter(|_| !send_at_once) else {
            return;
        };
        match leading {
            true => x.hold_timeout_now(msgs, term, now_ns),
            false => msgs.retain(|m| m.get_msg_type() != MessageType::MsgTimeoutNow),
        }
    }

    /// The held `MsgTimeoutNow`s that may leave now.
    pub(crate) fn released_transfer(&mut self) -> Vec<Message> {
        let r = &self.raw.raft;
        let (term, transferee) = (r.term, r.lead_transferee);
        let leading = r.state == StateRole::Leader;
        let now_ns = self.clock.now_ns();
        let Some(x) = self.exposure.as_mut() else {
            return Vec::new();
        };
        let out = x.release_timeout_now(term, transferee.filter(|_| leading), now_ns);
        if !out.is_empty() {
            info!(self.logger, "read leases ended: MsgTimeoutNow leaves"; "term" => term);
        }
        out
    }

    /// As a voter: tag the acknowledgements in `msgs` to the leader.
    pub(crate) fn tag_acks(&mut self, msgs: &mut [Message]) {
        let r = &self.raw.raft;
        if let Some(x) = self.exposure.as_mut() {
            x.tag_acks(msgs, r.term, r.leader_id, self.clock.now_ns());
        }
    }

    /// Whether a read lease this node granted may still be counted at `now_ns` (FOLLOWER.md
    /// rule 3: until then it does not campaign).
    pub(crate) fn grants_live(&self, now_ns: u64) -> bool {
        self.exposure.as_ref().is_some_and(|x| x.counts_any(now_ns))
    }

    /// Whether a read may be served from this replica's local state now, under its follower
    /// read lease. Read the state first, then ask: a read validated after it was made is
    /// linearizable. The keys of pending entries are not known here, so any entry in the log
    /// above what was applied refuses the read ([`LocalRefusal::PendingWrite`]).
    pub fn check_local_read(&self) -> Result<(), LocalRefusal> {
        let Some(x) = self.exposure.as_ref() else {
            return Err(LocalRefusal::NoReadLease);
        };
        let applied = x.applied();
        if applied > x.exposed() {
            return Err(LocalRefusal::NoReadLease); // a snapshot above E: none until E catches up
        }
        let pending = self.raw.raft.raft_log.last_index() > applied;
        x.lease.check_local(self.clock.now_ns(), applied, pending)
    }

    /// Whether this replica holds a follower read lease now.
    pub fn holds_read_lease(&self) -> bool {
        let now_ns = self.clock.now_ns();
        self.exposure
            .as_ref()
            .is_some_and(|x| x.holds_read_lease(now_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derived() -> Derived {
        let cfg = LeaseConfig {
            follower_leases: Some(crate::config::FollowerLeases::new(300)),
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
        x.on_note(
            &LeaderNote {
                exposed: 4,
                grant: None,
            },
            1,
            0,
        );
        assert_eq!(indexes(&x.release(Vec::new())), [3, 4]);
        assert_eq!(x.applied(), 4);
        assert_eq!(indexes(&x.release(entries(6..=6))), Vec::<u64>::new());
        x.on_note(
            &LeaderNote {
                exposed: 3,
                grant: None,
            },
            1,
            0,
        );
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
        x.on_note(
            &LeaderNote {
                exposed: 4,
                grant: None,
            },
            1,
            0,
        );
        assert_eq!(indexes(&x.release(Vec::new())), [4]);
    }

    #[test]
    fn every_timeout_now_waits_for_the_grants_and_only_the_current_transferee_gets_one() {
        let mut x = Exposure::new(&derived(), 1, 0);
        let tag = crate::follower::AckTag {
            term: 2,
            boot: 9,
            seq: 1,
        };
        let req = GrantRequest {
            holder: 3,
            tag,
            received_ns: 1_000,
            is_voter: true,
            matched: 0,
        };
        x.on_ack(req, 2, Some(1_000_000_000));
        let timeout_now = |to| Message {
            msg_type: MessageType::MsgTimeoutNow,
            to,
            term: 2,
            ..Default::default()
        };
        let mut msgs = vec![timeout_now(4), Message::default(), timeout_now(5)];
        x.hold_timeout_now(&mut msgs, 2, 2_000);
        assert_eq!(msgs.len(), 1, "both held, the rest sent");
        assert!(
            x.release_timeout_now(2, Some(5), 2_000).is_empty(),
            "a grant lives"
        );
        let out = x.release_timeout_now(2, Some(5), u64::MAX);
        assert_eq!(
            out.iter().map(|m| m.to).collect::<Vec<_>>(),
            [5],
            "only to the transferee"
        );
        assert!(
            x.release_timeout_now(2, Some(5), u64::MAX).is_empty(),
            "sent once"
        );
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn a_gap_in_committed_entries_is_a_bug() {
        let mut x = Exposure::new(&derived(), 1, 0);
        x.release(entries(1..=2));
        x.release(entries(4..=4));
    }
}
