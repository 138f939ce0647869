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
    AckTag, Grant, GrantRequest, GrantTable, HolderNote, Keys, LagPolicy, LeaderNote, PendingKeys,
    ReadLease,
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
    /// The lagging-node policy, if set: no grant to a voter lacking an entry committed long ago.
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
    /// and waits for them to end (every grant ends within `G` of the refusal, or sooner when
    /// its holder gives it up).
    grants_paused_until_ns: u64,
    /// As the leader: the term whose read leases its holders are asked to give up, on every
    /// append and heartbeat of that term, while a transfer or a membership change waits for
    /// them. Cleared once every grant has ended or been given up, and once nothing waits (no
    /// `MsgTimeoutNow` held, granting no longer paused).
    asking: Option<u64>,
    /// As a voter: the give-up to tell the leader with the next acknowledgement (the last tag
    /// it voids). A lost one is asked for again; the leader waits `G` out if none arrives.
    give_up_report: Option<AckTag>,
    /// Testing (the measure beside, and the behaviour before give-ups): holders are never
    /// asked, so a transfer or a membership change waits for every grant to run out.
    no_give_ups: bool,
    /// Liveness control (tests only): asks go on once nothing waits, until every grant ends.
    asks_after_waits: bool,
    /// The last term in which a `MsgTimeoutNow` left this node: granting stays stopped for the
    /// rest of it (a transferee may campaign on it however late it arrives). A transfer raft
    /// gave up before one left lets granting resume.
    timeout_now_left_in: Option<u64>,
    /// Liveness control (tests only): granting never resumes after a transfer in its term.
    no_resume: bool,
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
            asking: None,
            give_up_report: None,
            no_give_ups: false,
            asks_after_waits: false,
            timeout_now_left_in: None,
            no_resume: false,
        }
    }

    /// As the leader of `term`: ask every holder to give its read lease up, so that what waits
    /// for them waits one round trip, not `G`. Returns whether the ask is new (the caller sends
    /// heartbeats now, to carry it).
    fn ask_give_ups(&mut self, term: u64) -> bool {
        let new = !self.no_give_ups && self.asking != Some(term);
        if new {
            self.asking = Some(term);
        }
        debug_assert!(self.no_give_ups || self.asking == Some(term));
        new
    }

    /// A membership change of `term` waits for the read leases at `now_ns`: pause granting
    /// until every grant has ended and for `G` after (the window in which the change, proposed
    /// again, finds none), ask the holders to give theirs up, and return the instant the last
    /// grant ends if none is given up, and whether the ask is new.
    fn pause_grants_for_conf_change(&mut self, term: u64, now_ns: u64) -> (u64, bool) {
        let end_ns = self.table.last_end_ns().max(now_ns);
        let until_ns = end_ns.saturating_add(self.max_grant_ns);
        self.grants_paused_until_ns = self.grants_paused_until_ns.max(until_ns);
        (end_ns, self.ask_give_ups(term))
    }

    /// A membership change may be proposed now (no grant lives): granting may resume, since
    /// raft holds every grant back itself once the change is pending (`pending_conf > E`).
    fn conf_change_may_go(&mut self) {
        self.grants_paused_until_ns = 0;
        self.asking = None;
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
        if knobs.accept_voided_grants {
            self.lease = self.lease.control_accept_voided();
        }
        self.no_give_ups = knobs.no_read_lease_give_ups;
        self.asks_after_waits = knobs.asks_after_waits;
        self.no_resume = knobs.no_resume_after_abandoned_transfer;
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

    /// A leader's note arrived with one of its messages, while this replica is in `term`. A
    /// grant is taken before an ask in the same note is answered: the give-up voids it.
    pub(crate) fn on_note(&mut self, note: &LeaderNote, term: u64, now_ns: u64) {
        self.lease.on_exposed(note.exposed);
        if let Some(g) = &note.grant {
            self.lease.on_grant(g, term, now_ns);
        }
        if let Some(ask) = note.give_up {
            if let Some(given) = self.lease.give_up(ask) {
                self.give_up_report = Some(given); // the latest covers every earlier one
            }
            debug_assert!(!self.lease.is_valid(now_ns) || self.lease_term_above(ask));
        }
    }

    /// Whether this replica's lease is of a later term than `term` (a give-up of `term` leaves
    /// it).
    fn lease_term_above(&self, term: u64) -> bool {
        self.lease.term() > term
    }

    /// What the leader tells each voter on its appends and heartbeats at `now_ns`: `E`, the
    /// grant made to it since the last message, if any, and the ask to give read leases up
    /// while something waits for them.
    pub(crate) fn annotate(&mut self, msgs: &mut [Message], now_ns: u64) {
        // Asked only while something waits: a held `MsgTimeoutNow`, or a membership change
        // while granting is paused. Once granting resumes, an ask would end each new grant as
        // it arrived, and no follower would hold a read lease for the rest of the term.
        let waits = !self.held_timeout_now.is_empty()
            || now_ns < self.grants_paused_until_ns
            || self.asks_after_waits;
        if self.table.all_ended(now_ns) || !waits {
            self.asking = None;
        }
        debug_assert!(self.asking.is_none() || waits);
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
                give_up: self.asking.filter(|&t| t == m.term),
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
                gave_up: self.give_up_report.take(),
            };
            let mut ctx = m.take_context().to_vec();
            note.attach(&mut ctx);
            m.context = ctx.into();
        }
    }

    /// As the leader of `term`: a voter's tagged acknowledgement, stepped at `req.received_ns`
    /// with raft's matched index after it. A grant answers it if every rule allows
    /// ([`GrantTable::grant`]); it leaves with the next message to the voter.
    /// Under the lagging-node policy, a voter whose acknowledgement lacks an entry committed
    /// long before it arrived is not granted (`commit`: raft's, after stepping it).
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
            if lag.term() != term {
                lag.enter(term, &[]); // a new term: its voters come with the next exposure
            }
            lag.observe(req.holder, req.matched, commit, req.received_ns);
            lag.lagging(req.holder, req.received_ns)
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
    /// `MsgTimeoutNow` waits in the node until every read lease granted has ended or been given
    /// up; the holders are asked to give theirs up. Returns whether the ask is new.
    pub(crate) fn hold_timeout_now(
        &mut self,
        msgs: &mut Vec<Message>,
        term: u64,
        now_ns: u64,
    ) -> bool {
        let is_timeout_now = |m: &Message| m.get_msg_type() == MessageType::MsgTimeoutNow;
        if !msgs.iter().any(is_timeout_now) {
            return false;
        }
        self.table.stop_granting(term);
        if self.table.all_ended(now_ns) {
            self.timeout_now_left_in = Some(term); // it leaves now, unheld
            return false;
        }
        let (held, rest): (Vec<Message>, Vec<Message>) = msgs.drain(..).partition(is_timeout_now);
        self.held_timeout_now.extend(held);
        *msgs = rest;
        self.ask_give_ups(term)
    }

    /// As the leader at `now_ns`: `holder` gave up its read lease through `given`. Returns
    /// whether it is no longer counted.
    pub(crate) fn on_gave_up(&mut self, holder: u64, given: AckTag, now_ns: u64) -> bool {
        self.table.on_give_up(holder, given, now_ns)
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
        let out = match self.table.all_ended(now_ns) {
            true => std::mem::take(&mut self.held_timeout_now),
            false => Vec::new(),
        };
        if !out.is_empty() {
            self.timeout_now_left_in = Some(term);
        }
        out
    }

    /// As the leader of `term` with no transfer under way: if none of this term's
    /// `MsgTimeoutNow`s left (raft gave the transfer up while they were held, or before it
    /// sent one), granting resumes; else it stays stopped for the rest of the term.
    pub(crate) fn transfer_abandoned(&mut self, term: u64) {
        let none_left = self.timeout_now_left_in != Some(term) && self.held_timeout_now.is_empty();
        if none_left && !self.no_resume {
            self.table.resume_granting();
        }
    }

    /// A `MsgTimeoutNow` of `term` left unheld (the negative control that sends it at once).
    pub(crate) fn timeout_now_left(&mut self, term: u64) {
        self.timeout_now_left_in = Some(term);
    }

    /// A transfer is under way in `term`: no more grants in it.
    pub(crate) fn stop_granting(&mut self, term: u64) {
        self.table.stop_granting(term);
    }

    /// The term of the last grant this replica took as a holder (0: none).
    pub(crate) fn read_lease_term(&self) -> u64 {
        self.lease.term()
    }

    /// Whether this replica's read lease is valid at `now_ns`.
    pub(crate) fn holds_read_lease(&self, now_ns: u64) -> bool {
        self.lease.is_valid(now_ns)
    }

    /// The instant, on this node's clock, at which the last read lease it granted ends on its
    /// count (0: none granted, or all given up).
    pub(crate) fn grants_end_ns(&self) -> u64 {
        self.table.last_end_ns()
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
        (term, matched): (u64, Vec<(u64, u64)>),
        commit: u64,
        now_ns: u64,
    ) {
        if let Some(lag) = self.lag.as_mut() {
            let voters: Vec<u64> = matched.iter().map(|&(v, _)| v).collect();
            lag.enter(term, &voters);
            for (voter, m) in matched {
                lag.observe(voter, m, commit, now_ns);
            }
        }
    }
}

mod node;
#[cfg(test)]
mod tests;
