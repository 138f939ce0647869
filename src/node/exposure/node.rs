//! The node's side of follower read leases: the notes on its messages, held transfers and
//! membership changes, and whether a read may be served from local state.

use raft::eraftpb::{Entry, Message, MessageType};
use raft::{LightReady, Ready, StateRole, Storage};
use slog::{debug, info, warn};

use super::Exposure;
use crate::clock::Clock;
use crate::follower::{GrantRequest, HolderNote, Keys, LeaderNote, LocalRefusal, PendingKeys};
use crate::node::LeaseNode;

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
        let matched = matched.map(|(&id, p)| (id, p.matched)).collect();
        x.observe_lag((r.term, matched), commit, now_ns);
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
        let msg_term = m.term;
        let split = match m.get_msg_type() {
            MessageType::MsgAppend | MessageType::MsgHeartbeat => {
                LeaderNote::split(&ctx).map(|(base, note)| {
                    // A leader asks only for its own term's read leases: any other ask is not
                    // one a leader makes, and is ignored.
                    let note = note.map(|n| LeaderNote {
                        give_up: n.give_up.filter(|&t| t == msg_term),
                        ..n
                    });
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

    /// A voter's note, on an acknowledgement raft has just stepped. Its give-up counts
    /// whatever this node's role (the grants it made are counted across step-downs); its tag
    /// asks for a grant, which only the leader makes.
    pub(crate) fn on_holder_note(&mut self, from: u64, note: HolderNote) {
        let r = &self.raw.raft;
        let Some(x) = self.exposure.as_mut() else {
            return;
        };
        if let Some(given) = note.gave_up {
            let ended = x.on_gave_up(from, given, self.clock.now_ns());
            debug!(self.logger, "read lease given up"; "holder" => from, "term" => given.term,
                   "seq" => given.seq, "no longer counted" => ended);
        }
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
        match r.lead_transferee.is_some() {
            true => x.stop_granting(r.term),
            false => x.transfer_abandoned(r.term),
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
        let Some(x) = self.exposure.as_mut() else {
            return;
        };
        if send_at_once {
            if msgs
                .iter()
                .any(|m| m.get_msg_type() == MessageType::MsgTimeoutNow)
            {
                x.timeout_now_left(term);
            }
            return;
        }
        let asked = match leading {
            true => x.hold_timeout_now(msgs, term, now_ns),
            false => {
                msgs.retain(|m| m.get_msg_type() != MessageType::MsgTimeoutNow);
                false
            }
        };
        if asked {
            info!(self.logger, "transfer waits for read leases: holders asked to give them up";
                  "term" => term);
            self.raw.ping(); // heartbeats carry the ask now, not at the next heartbeat tick
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

    /// The instant, on this node's clock, until which it counts a read lease it granted (0:
    /// none; always 0 without follower leases). A node that stops leading releases its
    /// fortified voters only from then on (FOLLOWER.md rule 13).
    pub(crate) fn grants_end_ns(&self) -> u64 {
        self.exposure.as_ref().map_or(0, |x| x.grants_end_ns())
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
    /// The holders are asked to give their read leases up: a retry one round trip later
    /// usually finds none.
    pub(crate) fn conf_change_waits(&mut self) -> Result<(), u64> {
        let (now_ns, term) = (self.clock.now_ns(), self.raw.raft.term);
        let Some(x) = self.exposure.as_mut().filter(|x| !x.conf_with_grants) else {
            return Ok(());
        };
        if x.table.all_ended(now_ns) {
            x.conf_change_may_go();
            return Ok(());
        }
        let (end_ns, asked) = x.pause_grants_for_conf_change(term, now_ns);
        if asked {
            self.raw.ping();
        }
        Err(end_ns)
    }

    /// The term of the follower read lease this replica holds now, if it holds one: the term
    /// of the leader that granted it.
    pub fn read_lease_term(&self) -> Option<u64> {
        let now_ns = self.clock.now_ns();
        let x = self.exposure.as_ref()?;
        x.holds_read_lease(now_ns).then(|| x.read_lease_term())
    }

    /// Whether this replica holds a follower read lease now.
    pub fn holds_read_lease(&self) -> bool {
        let now_ns = self.clock.now_ns();
        self.exposure
            .as_ref()
            .is_some_and(|x| x.holds_read_lease(now_ns))
    }
}
