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
    Grant, GrantRequest, GrantTable, HolderNote, Keys, LagPolicy, LeaderNote, LocalRefusal,
    PendingKeys, ReadLease,
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
    /// [`Exposure::exposed`] but for a snapshot's or the replay's at start.
    applied: u64,
    /// The last index the application has finished applying: `applied` once the entries handed
    /// over have gone through the application ([`Exposure::mark_shown`]). Only this is published
    /// to read handles and checked by reads: a handle must never see an index whose entry is
    /// still on its way into the state (a membership change applied first publishes mid-batch).
    shown: u64,
    /// Grants made and not yet sent, by holder: each leaves on the next append or heartbeat to it.
    pending: BTreeMap<u64, Grant>,
    /// `MsgTimeoutNow`s held until every read lease this node granted has ended (rule 4).
    held_timeout_now: Vec<Message>,
    /// The entries persisted above `applied`, with the keys each writes (rule 5).
    pending_keys: PendingKeys,
    /// Which keys an entry writes, as the application says ([`Keys::unknown`] until it does).
    entry_keys: fn(&Entry) -> Keys,
    /// The lagging-node policy, if set: no grant to a voter long behind the commit index.
    lag: Option<LagPolicy>,
    /// raft's commit index when this node started: entries up to it are applied at once, `E` or
    /// not. They were committed before the restart (an earlier run may have shown some), and a
    /// committed membership change left unapplied would keep raft-rs from campaigning, with
    /// only a leader able to raise `E`. Nothing above `E` is shown: no read lease is served
    /// while applied is above the `E` this node knows.
    replay_to: u64,
    /// `G`.
    max_grant_ns: u64,
    /// Negative control (tests only): membership changes are proposed and committed while read
    /// leases live.
    conf_with_grants: bool,
    /// No grant before this instant: a membership change was refused while read leases lived,
    /// and waits for them to end (every grant ends within `G` of the refusal).
    grants_paused_until_ns: u64,
}

impl Exposure {
    /// Follower leases with `G` = `max_grant_ns`, for a node that has applied up to `applied`
    /// (raft's `Config::applied`: the application's own persisted index, never raft's commit).
    /// Entries `applied + 1 ..= last_index` are already in the log: their keys are not read, so
    /// they block every follower read until applied.
    /// `commit`: raft's commit index at start.
    pub(crate) fn new(
        derived: &Derived,
        boot_ns: u64,
        applied: u64,
        (commit, last_index): (u64, u64),
    ) -> Self {
        let max_grant_ns = derived.max_grant_ns.expect("follower leases on");
        Exposure {
            table: GrantTable::new(max_grant_ns, derived.drift_ppm, derived.margin_ns),
            lease: ReadLease::new(boot_ns, derived.drift_ppm, derived.margin_ns),
            held: VecDeque::new(),
            applied,
            shown: applied,
            pending: BTreeMap::new(),
            held_timeout_now: Vec::new(),
            pending_keys: PendingKeys::at_start(applied, last_index),
            entry_keys: Keys::unknown,
            lag: (derived.max_lag_ns).map(|lag_ns| LagPolicy::new(lag_ns, max_grant_ns)),
            grants_paused_until_ns: 0,
            replay_to: commit,
            max_grant_ns,
            conf_with_grants: false,
        }
    }

    /// A membership change waits for the read leases at `now_ns`: pause granting until every
    /// grant has ended and for `G` after (the window in which the change, proposed again, finds
    /// none), and return the instant the last grant ends.
    fn pause_grants_for_conf_change(&mut self, now_ns: u64) -> u64 {
        let end_ns = self.table.last_end_ns().max(now_ns);
        let until_ns = end_ns.saturating_add(self.max_grant_ns);
        self.grants_paused_until_ns = self.grants_paused_until_ns.max(until_ns);
        end_ns
    }

    /// `entries` are about to be persisted (an acknowledgement of them leaves only after).
    pub(crate) fn on_persisting(&mut self, entries: &[Entry]) {
        for e in entries {
            self.pending_keys
                .on_persisted(e.index, (self.entry_keys)(e));
        }
    }

    /// The index a read that cannot name its keys waits to see applied: `E`, or the last
    /// pending entry that writes any key, whichever is higher.
    pub(crate) fn read_barrier(&self) -> u64 {
        self.exposed().max(self.pending_keys.last_writing())
    }

    /// The negative controls the testing knobs ask for.
    pub(crate) fn with_controls(mut self, knobs: &crate::config::TestingKnobs) -> Self {
        if knobs.expose_commit {
            self.table = self.table.control_expose_commit();
        }
        if knobs.uncapped_grant {
            self.table = self.table.control_uncapped();
        }
        if knobs.grant_lagging {
            self.table = self.table.control_grant_lagging();
        }
        if knobs.lease_from_receipt {
            self.lease = self.lease.control_from_receipt();
        }
        if knobs.reuse_tags {
            self.lease = self.lease.control_reuse_tags();
        }
        self.conf_with_grants = knobs.conf_with_grants;
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

    /// The last index the application has finished applying.
    pub(crate) fn shown(&self) -> u64 {
        self.shown
    }

    /// The application has applied everything handed to it: what reads may rely on moves up,
    /// and the entries it covers are no longer pending.
    pub(crate) fn mark_shown(&mut self) {
        debug_assert!(self.shown <= self.applied);
        self.shown = self.applied;
        self.pending_keys.on_applied(self.shown);
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
    /// Under the lagging-node policy, a voter whose acknowledgement comes long after the commit
    /// it acknowledges is not granted (`commit`: raft's, after stepping it).
    /// No grant either while a membership change is pending above `E` (`pending_conf`: raft's
    /// index of the last one proposed) or waits for the read leases: a membership change is
    /// committed only with no read lease live, so every message that tells a replica it is
    /// committed also tells it that it is exposed (else a replica that knows it committed could
    /// not apply it, and raft-rs refuses to campaign with it unapplied).
    ///
    /// `E` is recomputed from `commit` first (`in_term`: an entry of `term` is committed), so
    /// that a grant is checked against the `E` of now: a new leader whose first commit of its
    /// term was stepped in the same batch would otherwise check against an `E` from before it,
    /// below entries an earlier leader exposed and answered, and could grant to a node that
    /// lacks them.
    pub(crate) fn on_ack(
        &mut self,
        req: GrantRequest,
        term: u64,
        leader_until_ns: Option<u64>,
        (commit, in_term, pending_conf): (u64, bool, u64),
    ) {
        self.table.expose(commit, in_term, req.received_ns);
        self.table.on_matched(req.holder, req.matched);
        let lagging = self.lag.as_mut().is_some_and(|lag| {
            let lagging = lag.lagging(req.holder, req.received_ns);
            lag.observe(req.holder, req.matched, commit, req.received_ns);
            lagging
        });
        let conf_waits = !self.conf_with_grants
            && (pending_conf > self.exposed() || req.received_ns < self.grants_paused_until_ns);
        if lagging || conf_waits {
            return;
        }
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
        let exposed = self.exposed().max(self.replay_to);
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

    /// The next instant at which, with no message, `E` may move (a grant holding it back ends)
    /// or a held `MsgTimeoutNow` may leave (the last grant ends).
    fn next_wake_ns(&self, commit: u64, now_ns: u64) -> Option<u64> {
        let unblock = match self.held.is_empty() && self.exposed() >= commit {
            true => None,
            false => self.table.next_unblock_ns(commit, now_ns),
        };
        let last_ns = self.table.last_end_ns();
        let release = (!self.held_timeout_now.is_empty() && last_ns > now_ns).then_some(last_ns);
        unblock.into_iter().chain(release).min()
    }

    /// A snapshot up to `index` was installed: entries it covers are dropped, and it counts as
    /// applied. `E` is not raised from it.
    pub(crate) fn on_snapshot(&mut self, index: u64) {
        self.held.retain(|e| e.index > index);
        self.applied = self.applied.max(index);
        self.pending_keys.on_snapshot(index);
        self.shown = self.shown.max(index); // the application installed it before this call
    }

    /// As the leader at `now_ns`: how far behind `commit` each voter's `matched` is.
    pub(crate) fn observe_lag(
        &mut self,
        matched: impl Iterator<Item = (u64, u64)>,
        commit: u64,
        now_ns: u64,
    ) {
        if let Some(lag) = self.lag.as_mut() {
            for (voter, m) in matched {
                lag.observe(voter, m, commit, now_ns);
            }
        }
    }
}

impl<S: Storage, C: Clock> LeaseNode<S, C> {
    /// The exposed index `E` this node knows (`None`: follower leases are off). The application
    /// is handed committed entries up to it only.
    pub fn exposed(&self) -> Option<u64> {
        self.exposure.as_ref().map(Exposure::exposed)
    }

    /// The last index this node may hand the application: the `E` it knows, or raft's commit
    /// index when it started if that is higher (a replay of what was committed before the
    /// restart; no read lease is served until `E` covers it). `None`: follower leases are off.
    pub fn apply_limit(&self) -> Option<u64> {
        self.exposure.as_ref().map(|x| x.exposed().max(x.replay_to))
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
        let now_ns = self.clock.now_ns();
        x.expose(commit, in_term, now_ns);
        let voters = r.prs().conf().voters();
        let matched = r.prs().iter().filter(|(id, _)| voters.contains(**id));
        x.observe_lag(matched.map(|(&id, p)| (id, p.matched)), commit, now_ns);
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
        if let Some(x) = self.exposure.as_mut() {
            x.mark_shown();
        }
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

    /// A snapshot up to `index` is about to be installed: if it goes past `E`, read handles must
    /// stop serving before the state moves past what may be shown (a read validated after this
    /// sees the revocation).
    pub(crate) fn before_snapshot(&mut self, index: u64) {
        let past = self.exposure.as_ref().is_some_and(|x| index > x.exposed());
        if past && self.raw.raft.state != StateRole::Leader {
            self.shared.revoke();
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
            self.on_leader_without_notes(m);
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

    /// An append or heartbeat of this node's term with no follower-lease note comes from a
    /// leader that runs without follower leases (a setting being turned on node by node): it
    /// grants nothing, so every entry it has committed is exposed. Without this, a replica with
    /// follower leases would never apply under it, and a committed membership change left
    /// unapplied keeps raft-rs from campaigning once that leader is gone.
    fn on_leader_without_notes(&mut self, m: &Message) {
        let from_leader = matches!(
            m.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat
        );
        if let Some(x) = self.exposure.as_mut() {
            let control = self.safeties.testing.ignore_plain_leaders;
            if from_leader && m.term == self.raw.raft.term && m.term > 0 && !control {
                x.lease.on_exposed(m.commit);
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
        let commit = r.raft_log.committed;
        let in_term = r.raft_log.term(commit).is_ok_and(|t| t == r.term);
        x.on_ack(
            req,
            r.term,
            until_ns,
            (commit, in_term, r.pending_conf_index),
        );
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

    /// Whether a read of unnamed keys may be served from this replica's local state now, under
    /// its follower read lease. Read the state first, then ask: a read validated after it was
    /// made is linearizable. Any pending entry that writes a key refuses it
    /// ([`LocalRefusal::PendingWrite`]); name the keys to wait only for those
    /// ([`Self::check_local_read_key`], [`Self::check_local_read_range`]).
    pub fn check_local_read(&self) -> Result<(), LocalRefusal> {
        self.check_local_with(|p| p.touches_any())
    }

    /// [`Self::check_local_read`] for a read of `key` alone: only a pending entry that writes
    /// `key` refuses it (as [`Self::set_entry_keys`] says an entry's keys). Call it on the
    /// thread that drives the node, with nothing applied between the state read and the call
    /// (other threads read through a [`crate::ReadHandle`]).
    pub fn check_local_read_key(&self, key: &[u8]) -> Result<(), LocalRefusal> {
        self.check_local_with(|p| p.touches(key))
    }

    /// [`Self::check_local_read`] for a read of the keys in `[start, end)`.
    pub fn check_local_read_range(&self, start: &[u8], end: &[u8]) -> Result<(), LocalRefusal> {
        self.check_local_with(|p| p.touches_range(start, end))
    }

    fn check_local_with(
        &self,
        touches: impl FnOnce(&PendingKeys) -> bool,
    ) -> Result<(), LocalRefusal> {
        let Some(x) = self.exposure.as_ref() else {
            return Err(LocalRefusal::NoReadLease);
        };
        let applied = x.shown();
        if applied > x.exposed() {
            return Err(LocalRefusal::NoReadLease); // a snapshot above E: none until E catches up
        }
        let ignore = self.safeties.testing.ignore_pending_keys;
        let pending = !ignore && touches(&x.pending_keys);
        x.lease.check_local(self.clock.now_ns(), applied, pending)
    }

    /// Say which keys each entry writes, so that a follower read waits only for pending entries
    /// that write its keys. `keys` must be a pure function of the entry, the same on every
    /// replica; an entry it cannot decode should be [`Keys::All`]. Until this is called, every
    /// entry with data writes every key ([`Keys::unknown`]).
    pub fn set_entry_keys(&mut self, keys: fn(&Entry) -> Keys) {
        if let Some(x) = self.exposure.as_mut() {
            x.entry_keys = keys;
        }
    }

    /// `entries` of a `Ready` are about to be persisted.
    pub(crate) fn note_persisting(&mut self, entries: &[Entry]) {
        if let Some(x) = self.exposure.as_mut() {
            x.on_persisting(entries);
        }
    }

    /// What a follower with follower leases publishes for read handles: `(barrier, applied,
    /// read lease end)`, where a read waits for `applied ≥ barrier` ([`Exposure::read_barrier`]).
    /// `None` on a leader, or with follower leases off.
    pub(crate) fn follower_publication(&self, now_ns: u64) -> Option<(u64, u64, u64)> {
        let x = self.exposure.as_ref()?;
        if self.raw.raft.state == StateRole::Leader {
            return None;
        }
        let applied = x.shown();
        let until_ns = match x.holds_read_lease(now_ns) && applied <= x.exposed() {
            true => x.lease.until_ns(),
            false => 0,
        };
        debug_assert!(until_ns == 0 || until_ns > now_ns);
        let barrier = match self.safeties.testing.ignore_pending_keys {
            true => x.exposed(), // the negative control
            false => x.read_barrier(),
        };
        Some((barrier, applied, until_ns))
    }

    /// With follower leases: the next instant on this node's clock at which a read lease it
    /// granted ends and so, with no message, writes held back for it may be applied or a held
    /// transfer may go on. A driver that sleeps until its next tick should wake then and call
    /// `handle_ready`: a killed holder then stalls writes for one grant, not one grant and a
    /// tick. `None`: nothing waits on a grant (always on a node that does not lead: a grant
    /// table kept from an earlier term holds nothing back here).
    pub fn next_wake_ns(&self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        let commit = self.raw.raft.raft_log.committed;
        let x = self.exposure.as_ref()?;
        x.next_wake_ns(commit, self.clock.now_ns())
    }

    /// As the leader, with follower leases: whether a membership change may be proposed now.
    /// While a read lease this node granted may be valid it may not (`Err`: the instant on this
    /// node's clock when the last one ends); granting pauses until then, so a retry at that
    /// instant finds none.
    pub(crate) fn conf_change_waits(&mut self) -> Result<(), u64> {
        let now_ns = self.clock.now_ns();
        let Some(x) = self.exposure.as_mut().filter(|x| !x.conf_with_grants) else {
            return Ok(());
        };
        match x.table.all_ended(now_ns) {
            true => Ok(()),
            false => Err(x.pause_grants_for_conf_change(now_ns)),
        }
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
        let mut x = Exposure::new(&derived(), 1, 2, (2, 2));
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
        let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
        x.expose(7, false, 0);
        assert_eq!(x.exposed(), 0);
        x.expose(7, true, 0);
        assert_eq!(x.exposed(), 7);
    }

    /// A new leader's first commit of its term and a voter's acknowledgement stepped in one
    /// batch, before any `E` was recomputed: the grant is checked against the `E` of the commit,
    /// so a voter lagging behind it gets none.
    #[test]
    fn a_grant_is_checked_against_the_exposed_index_of_the_current_commit() {
        let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
        let tag = crate::follower::AckTag {
            term: 2,
            boot: 9,
            seq: 1,
        };
        let req = |matched| GrantRequest {
            holder: 3,
            tag,
            received_ns: 1_000,
            is_voter: true,
            matched,
        };
        assert_eq!(x.exposed(), 0, "no E computed in this term yet");
        x.on_ack(req(5), 2, Some(1_000_000_000), (10, true, 0));
        assert!(x.pending.is_empty(), "matched 5 is below E 10: no grant");
        assert_eq!(x.exposed(), 10);
        x.on_ack(req(10), 2, Some(1_000_000_000), (10, true, 0));
        assert!(x.pending.contains_key(&3), "caught up: granted");
    }

    #[test]
    fn reads_rely_only_on_what_the_application_finished_applying() {
        let mut x = Exposure::new(&derived(), 1, 2, (2, 2));
        x.on_note(
            &LeaderNote {
                exposed: 5,
                grant: None,
            },
            1,
            0,
        );
        let puts: Vec<Entry> = (entries(3..=5).into_iter())
            .map(|e| Entry {
                data: b"k=v".to_vec().into(),
                ..e
            })
            .collect();
        x.on_persisting(&puts);
        assert_eq!(indexes(&x.release(puts)), [3, 4, 5]);
        assert_eq!(
            (x.applied(), x.shown()),
            (5, 2),
            "handed over, not yet applied"
        );
        assert!(
            x.pending_keys.touches(b"k"),
            "still pending while being applied"
        );
        x.mark_shown();
        assert_eq!(x.shown(), 5);
        assert!(!x.pending_keys.touches(b"k"));
    }

    #[test]
    fn a_snapshot_drops_what_it_covers_and_never_raises_the_exposed_index() {
        let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
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
        let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
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
        x.on_ack(req, 2, Some(1_000_000_000), (0, true, 0));
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
        let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
        x.release(entries(1..=2));
        x.release(entries(4..=4));
    }
}
