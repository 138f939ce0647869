//! [`MultiNode`]: one node hosting many raft groups, each a [`LeaseNode`], with their leases
//! on one support session per pair of nodes (shared liveness, [`crate::liveness`]).
//!
//! In [`LivenessMode::Shared`] a group's leader asks each voter's node to fortify the group under
//! the support that node gives it; its lease is the latest instant a quorum of fortified voters is
//! supported until. A group with nothing to do quiesces: no ticks and no raft heartbeats, on the
//! leader and on the followers, while the lease lives on the node-level session. Any raft message,
//! proposal or ReadIndex read wakes it; a supporter that withdraws a leader's epoch wakes every
//! replica it had fortified for it, and they campaign after seeded jitter. In
//! [`LivenessMode::PerGroup`] every group renews its own lease with its own heartbeats, as a
//! single [`LeaseNode`] does (the baseline the multi-group bench compares with).
//!
//! The driver is sans-IO: hand it peers' [`NodeBatch`]es, tick it, let it process `Ready`s through
//! your [`MultiApp`], and send what [`MultiNode::take_outbox`] returns.

mod batch;
mod group;
mod mem;
mod release;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use raft::eraftpb::{ConfChangeV2, Entry, HardState, Message, MessageType, Snapshot};
use raft::Storage;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use slog::Logger;

pub use batch::{FortifyMsg, GroupId, NodeBatch};
pub use mem::MultiMemApp;

use crate::clock::Clock;
use crate::config::{Derived, LeaseConfig};
use crate::drive::ReadyStep;
use crate::follower::Keys;
use crate::handle::LeaseTable;
use crate::liveness::{
    lease_until_ns, Epoch, Fortification, NodeId, Requester, SupportMsg, Supporter,
};
use crate::node::{LeaseNode, NodeError};
use crate::read::{ReadError, ReadId, ReadMode, ServedRead};
use group::Group;
use release::GivenUp;

/// What a removed group leaves on its node.
#[derive(Debug, Clone, Copy, Default)]
struct Tombstone {
    /// The fortification its replica had made: a leader may still count it, so a replica of the
    /// group hosted here again refuses every other candidate until it ends.
    fortification: Option<Fortification>,
    /// The highest term a leader released the replica from.
    released_term: u64,
}

/// How the groups' leases are kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LivenessMode {
    /// Each group renews its lease with its own raft heartbeats; no group quiesces.
    PerGroup,
    /// One support session per pair of nodes; groups fortify and quiesce.
    Shared,
}

/// How to build a [`MultiNode`].
#[derive(Clone)]
pub struct MultiConfig {
    /// This node's id: its replica id in every group it hosts.
    pub node_id: NodeId,
    /// Bumped and persisted by the caller at every boot, from 1.
    pub incarnation: u32,
    /// Shared liveness or per-group heartbeats.
    pub mode: LivenessMode,
    /// The raft config of every group (its `id` is set to `node_id`).
    pub raft: raft::Config,
    /// The lease config of every group.
    pub lease: LeaseConfig,
    /// Real interval between calls to [`MultiNode::tick`].
    pub tick_ms: u64,
    /// A group with nothing to do for this many ticks quiesces (shared mode).
    pub quiesce_after_ticks: u32,
    /// Seeds the jitter of campaigns after a withdrawal.
    pub seed: u64,
}

/// The I/O of every group's `Ready`s, named by group (the messages are the driver's to send).
pub trait MultiApp<S: Storage, C: Clock> {
    /// A storage or application failure; it stops processing and is returned.
    type Error;
    /// Install a snapshot into group `group`'s storage and state machine.
    fn install_snapshot(
        &mut self,
        group: GroupId,
        node: &mut LeaseNode<S, C>,
        snapshot: Snapshot,
    ) -> Result<(), Self::Error>;
    /// Apply group `group`'s committed entries (membership changes through
    /// [`crate::drive::apply_conf_change_entry`]).
    fn apply(
        &mut self,
        group: GroupId,
        node: &mut LeaseNode<S, C>,
        entries: Vec<Entry>,
    ) -> Result<(), Self::Error>;
    /// Persist group `group`'s new entries and hard state: durably, or durably by the next
    /// [`MultiApp::sync`].
    fn persist(
        &mut self,
        group: GroupId,
        node: &mut LeaseNode<S, C>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> Result<(), Self::Error>;
    /// Record group `group`'s newer commit index.
    fn set_commit(
        &mut self,
        group: GroupId,
        node: &mut LeaseNode<S, C>,
        commit: u64,
    ) -> Result<(), Self::Error>;
    /// Make everything [`MultiApp::persist`] was given since the last call durable: called once
    /// per round of [`MultiNode::handle_ready`], after every group's persisting and before any
    /// message that depends on it is handed out or raft counts the log. A `persist` that is
    /// durable by itself leaves this as is; one that only buffers makes one fsync here for
    /// every group.
    fn sync(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// One node hosting many raft groups. See the module docs.
pub struct MultiNode<S: Storage, C: Clock + Clone> {
    id: NodeId,
    mode: LivenessMode,
    /// One clock for the node and every group: a handle read on any group finds it cached.
    clock: Arc<C>,
    /// Where the groups publish for read handles, densely.
    leases: LeaseTable<C>,
    derived: Derived,
    quiesce_after_ticks: u32,
    groups: BTreeMap<GroupId, Group<S, C>>,
    requester: Requester,
    supporter: Supporter,
    /// What to send, per destination node.
    outbox: BTreeMap<NodeId, NodeBatch>,
    /// Groups stepped, ticked or asked something since the last `handle_ready`.
    dirty: BTreeSet<GroupId>,
    /// Groups not quiescent: the ones ticked.
    awake: BTreeSet<GroupId>,
    /// Groups this replica led after their last `Ready`, with the lease it last extended to (a
    /// hint for the passes over the groups led at every round of support, kept apart from the
    /// groups so that a pass over thousands of leases that still last touches little memory;
    /// the pass checks again: leadership moves only in a `Ready`'s wake, and a group that just
    /// became leader has its lease extended as it fortifies).
    led: BTreeMap<GroupId, u64>,
    /// The peers were last scanned for at this local instant; `None`: due (they change with
    /// membership).
    peers_scanned_ns: Option<u64>,
    /// Peers whose support was renewed since the last tick: the leases resting on them are
    /// extended at the next tick.
    support_renewed: BTreeSet<NodeId>,
    /// Replicas released by a withdrawal, to campaign at a jittered instant: (instant, group).
    campaigns: Vec<(u64, GroupId)>,
    /// Terms given up: each release leaves once the read leases granted under the term have
    /// ended, and is sent again with every round of support heartbeats until `3P` after, in
    /// case one was lost.
    given_up: Vec<GivenUp>,
    /// What removed groups leave behind on this node until it has ended: a fortification a
    /// leader may still count, and the highest term released. Restored if the group comes back.
    removed: BTreeMap<GroupId, Tombstone>,
    rng: ChaCha8Rng,
    config: MultiConfig,
    logger: Logger,
    /// Which keys an entry writes, for follower read leases: given to every group hosted here
    /// (see [`MultiNode::set_entry_keys`]).
    entry_keys: Option<fn(&Entry) -> Keys>,
}

impl<S: Storage, C: Clock + Clone> MultiNode<S, C> {
    /// A node hosting `groups` (each with its storage), booting now.
    pub fn new(
        config: MultiConfig,
        groups: impl IntoIterator<Item = (GroupId, S)>,
        clock: C,
        logger: &Logger,
    ) -> Result<Self, NodeError> {
        let mut rc = config.raft.clone();
        rc.id = config.node_id;
        let derived = config.lease.validate(&rc, config.tick_ms)?;
        let logger = logger.new(slog::o!("node" => config.node_id));
        let now_ns = clock.now_ns();
        let clock = Arc::new(clock);
        let mut node = MultiNode {
            id: config.node_id,
            mode: config.mode,
            leases: LeaseTable::new(clock.clone()),
            clock,
            derived,
            quiesce_after_ticks: config.quiesce_after_ticks,
            groups: BTreeMap::new(),
            requester: requester(&config, &derived),
            supporter: supporter(&config, &derived),
            outbox: BTreeMap::new(),
            dirty: BTreeSet::new(),
            awake: BTreeSet::new(),
            peers_scanned_ns: None,
            support_renewed: BTreeSet::new(),
            led: BTreeMap::new(),
            campaigns: Vec::new(),
            given_up: Vec::new(),
            removed: BTreeMap::new(),
            rng: ChaCha8Rng::seed_from_u64(config.seed ^ config.node_id.rotate_left(17) ^ now_ns),
            config,
            logger,
            entry_keys: None,
        };
        for (gid, storage) in groups {
            node.add_group(gid, storage)?;
        }
        Ok(node)
    }

    /// Say which keys each entry writes, for every group hosted here and every group added
    /// later (see [`LeaseNode::set_entry_keys`]). Call it before the groups take entries: until
    /// then, every entry with data writes every key.
    pub fn set_entry_keys(&mut self, keys: fn(&Entry) -> Keys) {
        self.entry_keys = Some(keys);
        for g in self.groups.values_mut() {
            g.node.set_entry_keys(keys);
        }
    }

    /// Host one more group. A group id already hosted is refused ([`NodeError::GroupExists`]):
    /// replacing it would leave the old group's read handles with its last lease.
    pub fn add_group(&mut self, gid: GroupId, storage: S) -> Result<(), NodeError> {
        self.add_group_applied(gid, storage, 0)
    }

    /// Host one more group whose state machine has applied up to `applied` (raft's
    /// `Config::applied`; 0 for raft's default, the index before the storage's first entry):
    /// a state machine restored from a snapshot while the log keeps entries behind it is not
    /// handed those entries again.
    pub fn add_group_applied(
        &mut self,
        gid: GroupId,
        storage: S,
        applied: u64,
    ) -> Result<(), NodeError> {
        if self.groups.contains_key(&gid) {
            return Err(NodeError::GroupExists(gid));
        }
        let mut rc = self.config.raft.clone();
        rc.id = self.id;
        rc.applied = applied;
        let mut lease = self.config.lease.clone();
        lease.seed ^= gid.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let logger = self.logger.new(slog::o!("group" => gid));
        let mut node = LeaseNode::in_node(
            &rc,
            storage,
            lease,
            self.config.tick_ms,
            self.clock.clone(),
            self.leases.slot(),
            &logger,
        )?;
        if let Some(keys) = self.entry_keys {
            node.set_entry_keys(keys);
        }
        let safeties = self.config.lease.safeties;
        let mut group = Group::new(
            node,
            safeties.testing.count_earlier_terms,
            safeties.fortification_outlives_term_moves(),
        );
        let forget = safeties.testing.forget_removed_fortifications;
        if let Some(t) = self.removed.get(&gid).filter(|_| !forget) {
            group.restore(t.fortification, t.released_term);
        }
        self.groups.insert(gid, group);
        self.wake(gid);
        self.peers_scanned_ns = None;
        Ok(())
    }

    /// Stop hosting group `gid` (its replica moved away or was destroyed); the caller disposes
    /// of its storage.
    ///
    /// - Its read handles refuse from now on (the node is dropped and revokes its lease). Its
    ///   lease slot is never handed out again, so a handle kept past this never reads another
    ///   group's lease; the slot's memory goes with the last handle to its chunk.
    /// - If it led a term, that term is given up: every voter fortified to it is released over
    ///   the node stream (sent again for `3P`), once every read lease it granted has ended, and
    ///   campaigns after jitter.
    /// - A fortification it had made stays on the node until the support under it ends or its
    ///   leader releases it: the leader may still count it. If the group is hosted here again
    ///   meanwhile ([`Self::add_group`]), its new replica refuses every other candidate until
    ///   then. Nothing else of the old replica comes back: the new one has a new slot, counts
    ///   no fortification, and has led nothing.
    /// - The support session is the node's and is untouched: epochs are per pair of nodes.
    pub fn remove_group(&mut self, gid: GroupId) -> Result<(), NodeError> {
        let g = self
            .groups
            .remove(&gid)
            .ok_or(NodeError::NoSuchGroup(gid))?;
        let led = g.node.is_leader().then(|| g.node.raw().raft.term);
        let voters: Vec<NodeId> = g.members().all_voters().collect();
        let (fortification, released_term) = (g.fortification, g.released_term());
        let grants_end_ns = g.node.grants_end_ns();
        drop(g); // revokes its read handles
        self.removed.insert(
            gid,
            Tombstone {
                fortification,
                released_term,
            },
        );
        self.awake.remove(&gid);
        self.led.remove(&gid);
        self.dirty.remove(&gid);
        self.campaigns.retain(|&(_, c)| c != gid);
        self.peers_scanned_ns = None;
        if let Some(term) = led {
            self.release_term(gid, term, voters, grants_end_ns);
        }
        slog::info!(self.logger, "group removed"; "group" => gid, "led" => ?led,
            "fortified_to" => ?fortification.map(|f| f.leader));
        Ok(())
    }

    /// Tick group `gid` again, and count it idle from now.
    fn wake(&mut self, gid: GroupId) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.quiescent = false;
            g.idle_ticks = 0;
            self.awake.insert(gid);
            self.dirty.insert(gid);
        }
    }

    // ----- time ------------------------------------------------------------------------------

    /// Called every `tick_ms`: the support session, withdrawals, awake groups' ticks,
    /// fortification and quiescence.
    pub fn tick(&mut self) {
        let now_ns = self.clock.now_ns();
        if self.mode == LivenessMode::Shared {
            let renewed = std::mem::take(&mut self.support_renewed);
            if !renewed.is_empty() {
                self.extend_leases_resting_on(&renewed, false);
            }
            self.send_support(now_ns);
            self.send_due_releases(now_ns);
            self.withdraw_expired(now_ns);
            self.start_due_campaigns(now_ns);
        }
        for &gid in &self.awake {
            let g = self.groups.get_mut(&gid).expect("awake groups are hosted");
            g.node.tick();
            g.idle_ticks = g.idle_ticks.saturating_add(1);
            self.dirty.insert(gid);
        }
        if self.mode == LivenessMode::Shared {
            let gids: Vec<GroupId> = self.dirty.iter().copied().collect();
            for gid in gids {
                self.fortify_and_quiesce(gid, now_ns);
            }
        }
    }

    fn send_support(&mut self, now_ns: u64) {
        // Peers change only with a group's members (refreshed after every `Ready` and step) or
        // with a group added or removed, each of which clears the scan: a scan costs a pass over
        // every group's members, so it is not repeated otherwise.
        if self.peers_scanned_ns.is_none() {
            for peer in self.peers() {
                self.requester.add_peer(peer);
            }
            self.peers_scanned_ns = Some(now_ns);
        }
        let due = self.requester.due(now_ns);
        if !due.is_empty() {
            self.resend_releases(now_ns);
        }
        for (peer, msg) in due {
            self.batch_to(peer).support.push(msg);
        }
    }

    /// Every node hosting a voter or learner of a group hosted here, but this one.
    fn peers(&self) -> BTreeSet<NodeId> {
        let mut peers: BTreeSet<NodeId> = self
            .groups
            .values()
            .flat_map(|g| g.members().all())
            .collect();
        peers.remove(&self.id);
        peers
    }

    /// Support that ran out is withdrawn for good; every replica fortified under it is released
    /// and campaigns after seeded jitter.
    fn withdraw_expired(&mut self, now_ns: u64) {
        let withdrawn = self.supporter.withdraw_expired(now_ns);
        if withdrawn.is_empty() {
            return;
        }
        let mut released = Vec::new();
        for (&gid, g) in self.groups.iter_mut() {
            let Some(f) = g.fortification else { continue };
            if withdrawn.contains(&(f.leader, f.epoch)) {
                g.release_from_ended_leader();
                released.push((gid, f.leader));
            }
        }
        for (gid, old_leader) in released {
            self.campaign_after_jitter(gid, old_leader, now_ns);
        }
        for t in self.removed.values_mut() {
            if t.fortification
                .is_some_and(|f| withdrawn.contains(&(f.leader, f.epoch)))
            {
                t.fortification = None;
            }
        }
        slog::debug!(self.logger, "support withdrawn"; "withdrawn" => ?withdrawn);
    }

    fn start_due_campaigns(&mut self, now_ns: u64) {
        let (due, later): (Vec<_>, Vec<_>) =
            self.campaigns.drain(..).partition(|(at, _)| *at <= now_ns);
        self.campaigns = later;
        for (_, gid) in due {
            let released = self
                .groups
                .get(&gid)
                .is_some_and(|g| g.fortification.is_none());
            if released {
                self.wake(gid);
                let g = self.groups.get_mut(&gid).expect("present");
                g.node.expire_election_timer();
            }
        }
    }

    // ----- messages ----------------------------------------------------------------------------

    /// A batch from a peer node arrived: its support session, then its raft messages, then its
    /// fortification (a new leader's request to fortify often comes with its first append,
    /// which makes the leader known to the replica).
    pub fn step(&mut self, batch: NodeBatch) {
        let now_ns = self.clock.now_ns();
        let from = batch.from;
        for msg in batch.support {
            self.on_support(from, msg, now_ns);
        }
        for (gid, m) in batch.raft {
            self.step_raft(gid, m);
        }
        for msg in batch.fortify {
            self.on_fortify(from, msg, now_ns);
        }
    }

    fn on_support(&mut self, from: NodeId, msg: SupportMsg, now_ns: u64) {
        match msg {
            SupportMsg::Heartbeat { epoch, seq } => {
                if let Some(answer) =
                    self.supporter
                        .on_heartbeat(from, epoch, seq, self.clock.now_ns())
                {
                    self.batch_to(from).support.push(answer);
                }
            }
            answer => {
                let withdrawn = matches!(answer, SupportMsg::Withdrawn { .. });
                if self.requester.on_answer(from, answer, now_ns) {
                    match withdrawn {
                        true => self.extend_leases_resting_on(&BTreeSet::from([from]), true),
                        // Renewed: extended at the next tick, once for every peer that answered
                        // meanwhile (a pass over the groups per answer would cost twice as much).
                        false => {
                            self.support_renewed.insert(from);
                        }
                    }
                }
            }
        }
    }

    fn on_fortify(&mut self, from: NodeId, msg: FortifyMsg, now_ns: u64) {
        match msg {
            FortifyMsg::Request { group, term, epoch } => {
                let answer = self.fortify_replica(from, group, term, epoch, now_ns);
                self.batch_to(from).fortify.push(answer);
            }
            FortifyMsg::Ack {
                group,
                term,
                epoch,
                incarnation,
            } => {
                let Some(g) = self.groups.get_mut(&group) else {
                    return;
                };
                g.clear_fortified_if_new_term();
                if g.leads(term) && self.requester.epoch_for(from) == Some(epoch) {
                    g.fortified.insert(from, (epoch, incarnation));
                    self.extend_lease(group);
                }
            }
            FortifyMsg::Reject { group, term } => {
                if self.groups.get(&group).is_some_and(|g| g.leads(term)) {
                    self.wake(group); // raft's own heartbeats bring the replica up to date
                }
            }
            FortifyMsg::Release { group, term } => {
                if let Some(t) = self.removed.get_mut(&group) {
                    t.released_term = t.released_term.max(term);
                    if t.fortification
                        .is_some_and(|f| f.leader == from && f.term == term)
                    {
                        t.fortification = None;
                    }
                }
                let Some(g) = self.groups.get_mut(&group) else {
                    return;
                };
                if g.release_by(from, term) {
                    self.campaign_after_jitter(group, from, now_ns);
                }
            }
        }
    }

    /// A released replica campaigns in its slot: the voters that may succeed `old_leader` are
    /// ranked by a hash of the group, so each group's survivors campaign one after another
    /// (not together, which splits the vote), and the first campaigner differs between groups.
    /// Within the slot, seeded jitter.
    fn campaign_after_jitter(&mut self, gid: GroupId, old_leader: NodeId, now_ns: u64) {
        let Some(g) = self.groups.get(&gid) else {
            return;
        };
        let voters = g.members().voters.iter().copied();
        let mut candidates: Vec<NodeId> = voters.filter(|&v| v != old_leader).collect();
        candidates.sort_by_key(|&v| mix(gid, v));
        let rank = candidates
            .iter()
            .position(|&v| v == self.id)
            .unwrap_or(candidates.len());
        let tick_ns = self.config.tick_ms * 1_000_000;
        let slot_ns =
            (self.derived.campaign_jitter_ns / candidates.len().max(1) as u64).max(2 * tick_ns);
        let at_ns = now_ns + rank as u64 * slot_ns + self.rng.gen_range(0..=slot_ns / 2);
        self.campaigns.push((at_ns, gid));
    }

    /// A fortification is made only by a replica in the leader's term that knows that leader,
    /// while this node supports the leader's node at the epoch named.
    fn fortify_replica(
        &mut self,
        leader: NodeId,
        gid: GroupId,
        term: u64,
        epoch: Epoch,
        now_ns: u64,
    ) -> FortifyMsg {
        let supported = self.supporter.supports(leader, epoch, now_ns);
        let Some(g) = self.groups.get_mut(&gid) else {
            return FortifyMsg::Reject { group: gid, term };
        };
        let r = &g.node.raw().raft;
        let stale = g.term_is_over(term);
        if !supported || stale || r.term != term || r.leader_id != leader {
            return FortifyMsg::Reject { group: gid, term };
        }
        g.fortify(Fortification {
            leader,
            term,
            epoch,
        });
        FortifyMsg::Ack {
            group: gid,
            term,
            epoch,
            incarnation: self.supporter.incarnation(),
        }
    }

    /// Any raft message wakes its group; all but heartbeats also count as work.
    fn step_raft(&mut self, gid: GroupId, m: Message) {
        let routine = matches!(
            m.get_msg_type(),
            MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse
        );
        let Some(idle_ticks) = self.groups.get(&gid).map(|g| g.idle_ticks) else {
            return;
        };
        self.wake(gid);
        let g = self.groups.get_mut(&gid).expect("present");
        if routine {
            g.idle_ticks = idle_ticks;
        }
        // A lost release: the old leader's own campaign for a later term ends the fortification.
        g.released_by_campaign(&m);
        if g.ignores_while_fortified(&m) {
            slog::debug!(self.logger, "fortified: later-term message ignored";
                "group" => gid, "from" => m.from, "msg" => ?m.get_msg_type(), "term" => m.term);
            return;
        }
        let _ = g.node.step(m); // a peer's bad message is raft's to refuse
        g.drop_stale_fortification();
        self.refresh_members(gid); // raft restores a snapshot's configuration as it steps it
    }

    fn batch_to(&mut self, to: NodeId) -> &mut NodeBatch {
        let from = self.id;
        self.outbox.entry(to).or_insert_with(|| NodeBatch {
            from,
            to,
            ..NodeBatch::default()
        })
    }

    /// Every batch to send, one per destination node.
    pub fn take_outbox(&mut self) -> Vec<NodeBatch> {
        std::mem::take(&mut self.outbox)
            .into_values()
            .filter(|b| !b.is_empty())
            .collect()
    }

    // ----- leases ----------------------------------------------------------------------------

    /// As leader of `gid`: ask voters whose fortification does not match the support counted
    /// now, extend the lease, and quiesce an idle group.
    fn fortify_and_quiesce(&mut self, gid: GroupId, now_ns: u64) {
        let interval_ns = self.derived.promise_ns / 3;
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        if g.node.is_leader() {
            let term = g.node.raw().raft.term;
            for v in g.voters_to_fortify(self.id, &self.requester, now_ns, interval_ns) {
                let epoch = self
                    .requester
                    .epoch_for(v)
                    .expect("support asked of every voter");
                let to = self.batch_to(v);
                to.fortify.push(FortifyMsg::Request {
                    group: gid,
                    term,
                    epoch,
                });
            }
            self.extend_lease(gid);
        }
        let g = self.groups.get_mut(&gid).expect("present");
        if g.may_quiesce(self.quiesce_after_ticks) {
            // A leader sleeps only while it holds a lease; a follower only while fortified.
            assert!(
                g.node.lease_status().remaining_ns > 0 || !g.node.is_leader(),
                "group {gid}: a leader quiesces with no lease"
            );
            assert!(
                g.fortification.is_some() || g.node.is_leader(),
                "group {gid}: an unfortified follower quiesces"
            );
            g.quiescent = true;
            self.awake.remove(&gid);
        }
    }

    /// Recompute and extend the lease of every group led here that counts on one of `peers`.
    /// After a withdrawal those groups wake, to fortify again under the next epoch.
    ///
    /// On a renewal, a lease that outlasts the next round of support by a quarter of a round is
    /// left as it is (it is extended at the next round, from the support then): with thousands
    /// of groups this halves the work, and an extension skipped only ever leaves a lease
    /// shorter than it could be.
    ///
    /// One pass over the groups led, each looked up once (with thousands of groups led, the
    /// lookups are most of an idle node's work).
    fn extend_leases_resting_on(&mut self, peers: &BTreeSet<NodeId>, withdrawn: bool) {
        let now_ns = self.clock.now_ns();
        let interval_ns = self.derived.promise_ns / 3;
        let keep_until_ns = now_ns.saturating_add(interval_ns + interval_ns / 4);
        let counts_on = |g: &Group<S, C>| peers.iter().any(|p| g.fortified.contains_key(p));
        let mut woken = Vec::new();
        for (&gid, hint) in self.led.iter_mut() {
            if !withdrawn && *hint > keep_until_ns {
                continue;
            }
            let Some(g) = self.groups.get_mut(&gid) else {
                continue;
            };
            if !g.node.is_leader() || !counts_on(g) {
                continue;
            }
            *hint = extend_group_lease(self.id, &self.requester, gid, g, now_ns);
            if withdrawn {
                woken.push(gid);
            }
        }
        for gid in woken {
            self.wake(gid);
        }
    }

    fn extend_lease(&mut self, gid: GroupId) {
        let now_ns = self.clock.now_ns();
        self.extend_lease_at(gid, now_ns);
    }

    /// Recompute group `gid`'s lease from its fortifications and the support under them, with
    /// the clock read at `now_ns`, and extend it.
    fn extend_lease_at(&mut self, gid: GroupId, now_ns: u64) {
        let Some(g) = self.groups.get_mut(&gid).filter(|g| g.node.is_leader()) else {
            return;
        };
        let usable_until_ns = extend_group_lease(self.id, &self.requester, gid, g, now_ns);
        if let Some(hint) = self.led.get_mut(&gid) {
            *hint = usable_until_ns;
        }
    }

    // ----- clients -----------------------------------------------------------------------------

    /// Process every `Ready` of the groups touched since the last call, with one
    /// [`MultiApp::sync`] per round for all of them: first every group's messages, snapshot,
    /// committed entries and persisting; then `sync`; then what waited for the log to be
    /// durable (the persisted messages, `advance`, the light `Ready`s). A round repeats while a
    /// group has another `Ready`.
    ///
    /// If `app` fails, the error is returned at once, and the node must stop (as a `LeaseNode`
    /// whose `handle_ready` failed must): every `Ready` begun in the round is dropped, with
    /// entries of it already handed to `app`. The groups touched stay due and the members of
    /// each group handled are read again all the same (a configuration it applied before the
    /// failure is in force), so that what is inspected afterwards is not stale.
    pub fn handle_ready<A: MultiApp<S, C>>(&mut self, app: &mut A) -> Result<(), A::Error> {
        self.ready_rounds::<A, fn(NodeBatch)>(app, None)
    }

    /// [`Self::handle_ready`], handing every batch to `send` as soon as it may leave: before each
    /// round's sync, what does not depend on it (a leader's appends, which then overlap its own
    /// fsync; the support session; fortification), and after the last round everything else.
    /// [`Self::take_outbox`] then has nothing.
    pub fn handle_ready_and_send<A: MultiApp<S, C>>(
        &mut self,
        app: &mut A,
        send: &mut dyn FnMut(NodeBatch),
    ) -> Result<(), A::Error> {
        let result = self.ready_rounds(app, Some(&mut *send));
        self.take_outbox().into_iter().for_each(&mut *send);
        result
    }

    fn ready_rounds<A: MultiApp<S, C>, F: FnMut(NodeBatch) + ?Sized>(
        &mut self,
        app: &mut A,
        mut send: Option<&mut F>,
    ) -> Result<(), A::Error> {
        while !self.dirty.is_empty() {
            let dirty = std::mem::take(&mut self.dirty);
            if let Err(e) = self.ready_round(&dirty, app, send.as_deref_mut()) {
                self.dirty.extend(dirty);
                return Err(e);
            }
        }
        Ok(())
    }

    /// One round over `dirty`: both halves of at most one `Ready` per group, one sync between
    /// (before it, what may leave goes to `send`). A group with another `Ready` after it is due
    /// again.
    fn ready_round<A: MultiApp<S, C>, F: FnMut(NodeBatch) + ?Sized>(
        &mut self,
        dirty: &BTreeSet<GroupId>,
        app: &mut A,
        send: Option<&mut F>,
    ) -> Result<(), A::Error> {
        let mut begun = Vec::new();
        let mut result = Ok(());
        for &gid in dirty {
            match self.ready_half(gid, None, app) {
                Ok(Some(rd)) => begun.push((gid, rd)),
                Ok(None) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let (Some(send), Ok(())) = (send, &result) {
            self.take_outbox().into_iter().for_each(send);
        }
        let late_sync = self.config.lease.safeties.testing.sync_after_advance;
        let synced = !begun.is_empty() && !late_sync;
        if result.is_ok() && synced {
            result = app.sync();
        }
        for (gid, rd) in begun {
            if result.is_ok() {
                result = self.ready_half(gid, Some(rd), app).map(|_| ());
            }
        }
        if result.is_ok() && late_sync {
            result = app.sync();
        }
        for &gid in dirty {
            self.after_ready(gid);
        }
        result
    }

    /// The first half of group `gid`'s `Ready` (`rd` is `None`: prepare and begin), or the
    /// second (`rd` is the one begun).
    fn ready_half<A: MultiApp<S, C>>(
        &mut self,
        gid: GroupId,
        rd: Option<raft::Ready>,
        app: &mut A,
    ) -> Result<Option<raft::Ready>, A::Error> {
        let Some(g) = self.groups.get_mut(&gid) else {
            return Ok(None);
        };
        let (outbox, from) = (&mut self.outbox, self.id);
        let mut step = |node: &mut LeaseNode<S, C>, step: ReadyStep<'_>| match step {
            ReadyStep::Send(msgs) => {
                route(outbox, from, gid, msgs);
                Ok(())
            }
            ReadyStep::InstallSnapshot(snapshot) => app.install_snapshot(gid, node, snapshot),
            ReadyStep::Apply(entries) => app.apply(gid, node, entries),
            ReadyStep::Persist(entries, hs) => app.persist(gid, node, entries, hs),
            ReadyStep::SetCommit(commit) => app.set_commit(gid, node, commit),
        };
        match rd {
            None => {
                g.node.ready_prepare(&mut step)?;
                g.node.ready_begin(&mut step)
            }
            Some(rd) => g.node.ready_finish(rd, &mut step).map(|()| None),
        }
    }

    /// After a round: the members read again, a new term's fortifications cleared, a term no
    /// longer led given up, and the group due again if raft has more for it.
    fn after_ready(&mut self, gid: GroupId) {
        self.refresh_members(gid);
        let Some(g) = self.groups.get_mut(&gid) else {
            return;
        };
        match g.node.is_leader() {
            true => {
                g.clear_fortified_if_new_term();
                self.led.entry(gid).or_insert(0);
            }
            false => {
                self.led.remove(&gid);
            }
        }
        let more = g.node.has_ready();
        if let Some(term) = g.take_stepped_down() {
            self.give_up(gid, term);
        }
        if more {
            self.dirty.insert(gid);
        }
    }

    /// Read group `gid`'s members again after raft may have changed its configuration (a
    /// `Ready` handled, or a snapshot stepped), so that no path computes over a stale voter set.
    fn refresh_members(&mut self, gid: GroupId) {
        let changed = self
            .groups
            .get_mut(&gid)
            .is_some_and(|g| g.refresh_members());
        if changed {
            self.peers_scanned_ns = None; // the support session may have a new peer
        }
    }

    /// Propose a normal entry in group `gid` (wakes it).
    pub fn propose(&mut self, gid: GroupId, data: Vec<u8>) -> raft::Result<()> {
        self.wake(gid);
        let g = self
            .groups
            .get_mut(&gid)
            .ok_or(raft::Error::StepPeerNotFound)?;
        g.node.propose(vec![], data)
    }

    /// Propose a membership change in group `gid` (wakes it).
    pub fn propose_conf_change(&mut self, gid: GroupId, cc: ConfChangeV2) -> raft::Result<()> {
        self.wake(gid);
        self.peers_scanned_ns = None;
        let g = self
            .groups
            .get_mut(&gid)
            .ok_or(raft::Error::StepPeerNotFound)?;
        g.node.propose_conf_change(vec![], cc)
    }

    /// Transfer leadership of group `gid` (wakes it; fences its lease as a single group does).
    pub fn transfer_leader(&mut self, gid: GroupId, to: NodeId) {
        self.wake(gid);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.node.transfer_leader(to);
        }
    }

    /// The transport could not deliver a message to `to` in group `gid` (an append, say): raft
    /// probes that peer instead of streaming to it.
    pub fn report_unreachable(&mut self, gid: GroupId, to: NodeId) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.node.report_unreachable(to);
            self.dirty.insert(gid);
        }
    }

    /// A snapshot sent to `to` in group `gid` was delivered or lost: raft stops waiting for it.
    pub fn report_snapshot(&mut self, gid: GroupId, to: NodeId, status: raft::SnapshotStatus) {
        if let Some(g) = self.groups.get_mut(&gid) {
            g.node.report_snapshot(to, status);
            self.wake(gid);
        }
    }

    /// Start a read in group `gid`. A lease read needs no raft round and leaves a quiescent
    /// group asleep; any other read wakes it.
    pub fn read(&mut self, gid: GroupId, mode: ReadMode) -> Result<ReadId, ReadError> {
        let g = self
            .groups
            .get(&gid)
            .ok_or(ReadError::NotLeader { leader_hint: None })?;
        let by_lease = mode != ReadMode::ReadIndex && g.node.lease_status().state.is_held();
        if !by_lease {
            self.wake(gid);
        }
        self.dirty.insert(gid);
        self.groups.get_mut(&gid).expect("present").node.read(mode)
    }

    /// Hand back group `gid`'s finished reads (see [`LeaseNode::serve_reads`]).
    pub fn serve_reads<T>(
        &mut self,
        gid: GroupId,
        read_state: impl FnMut(ReadId) -> T,
    ) -> Vec<ServedRead<T>> {
        match self.groups.get_mut(&gid) {
            Some(g) => g.node.serve_reads(read_state),
            None => Vec::new(),
        }
    }

    /// With follower leases: the earliest instant on this node's clock at which a read lease a
    /// group led here granted ends, so that, with no message, writes held back for it may be
    /// applied or a held transfer may go on ([`LeaseNode::next_wake_ns`] over the awake groups;
    /// a group that grants is not quiescent). `None`: nothing waits on a grant. A driver that
    /// sleeps until its next tick wakes then, and calls [`Self::wake_due`] and `handle_ready`.
    pub fn next_wake_ns(&self) -> Option<u64> {
        let groups = self.awake.iter().filter_map(|gid| self.groups.get(gid));
        groups.filter_map(|g| g.node.next_wake_ns()).min()
    }

    /// Make due, for the next `handle_ready`, every awake group whose
    /// [`LeaseNode::next_wake_ns`] has come.
    pub fn wake_due(&mut self) {
        let now_ns = self.clock.now_ns();
        for &gid in &self.awake {
            let node = self.groups.get(&gid).map(|g| &g.node);
            if node
                .and_then(|n| n.next_wake_ns())
                .is_some_and(|at| at <= now_ns)
            {
                self.dirty.insert(gid);
            }
        }
    }

    // ----- inspection --------------------------------------------------------------------------

    /// Group `gid`'s replica here.
    pub fn group(&self, gid: GroupId) -> Option<&LeaseNode<S, C>> {
        self.groups.get(&gid).map(|g| &g.node)
    }

    /// The groups hosted here.
    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups.keys().copied().collect()
    }

    /// The groups ticked here (not quiescent): the only ones whose leadership a tick may move.
    pub fn awake_groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.awake.iter().copied()
    }

    /// Whether group `gid` is quiescent here (not ticked).
    pub fn is_quiescent(&self, gid: GroupId) -> bool {
        self.groups.get(&gid).is_some_and(|g| g.quiescent)
    }

    /// Whether this node's replica of `gid` backs `leader`'s lease now: fortified to it (it
    /// refuses every other candidate until released), or its own clock promise (the boot
    /// promise included).
    pub fn promise_backs(&self, gid: GroupId, leader: NodeId) -> bool {
        self.groups
            .get(&gid)
            .is_some_and(|g| g.node.promise_backs(leader))
    }

    /// Whether node `peer` supports this one now: its support, asked for over the node stream,
    /// is still in force. A hint for placement (where to move a leadership), never for safety.
    /// Always `false` in per-group mode, where there is no support session.
    pub fn supported_by(&self, peer: NodeId) -> bool {
        let now_ns = self.clock.now_ns();
        self.mode == LivenessMode::Shared && self.requester.support_from(peer, now_ns).is_some()
    }

    /// How many groups this node led after their last `Ready` (a count kept as leadership
    /// moves, read in constant time).
    pub fn groups_led(&self) -> usize {
        self.led.len()
    }

    /// How the groups' leases are kept alive here.
    pub fn liveness(&self) -> LivenessMode {
        self.mode
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The node's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

/// Recompute leader `g`'s lease (group `gid`, on node `me`) from its fortifications and the
/// support under them, with the clock read at `now_ns`, and extend it; until when it may be used
/// (0: not at all), the hint [`MultiNode`] keeps.
fn extend_group_lease<S: Storage, C: Clock + Clone>(
    me: NodeId,
    requester: &Requester,
    gid: GroupId,
    g: &mut Group<S, C>,
    now_ns: u64,
) -> u64 {
    assert!(
        g.node.is_leader(),
        "group {gid}: a lease extended off its leader"
    );
    g.clear_fortified_if_new_term(); // never count an earlier term's fortifications
    debug_assert!(
        g.counts_term(g.node.raw().raft.term),
        "group {gid}: counting fortifications of another term"
    );
    let support = |v| requester.support_from(v, now_ns);
    let members = g.members();
    let voters = (&members.voters[..], &members.outgoing[..]);
    let until_ns = lease_until_ns(me, voters, &g.fortified, support);
    let term = g.node.raw().raft.term;
    g.node.extend_lease_to_at(term, until_ns, now_ns);
    g.node.lease_usable_until_ns().unwrap_or(0)
}

fn requester(config: &MultiConfig, derived: &Derived) -> Requester {
    let r = Requester::new(config.incarnation, derived, []);
    if config.lease.safeties.testing.count_own_promise {
        return r.control_count_own_promise();
    }
    r
}

fn supporter(config: &MultiConfig, derived: &Derived) -> Supporter {
    let knobs = &config.lease.safeties.testing;
    let mut s = Supporter::new(config.incarnation, derived);
    if knobs.forget_withdrawals {
        s = s.control_forget_withdrawals();
    }
    if knobs.end_epoch_at_once {
        s = s.control_end_at_once();
    }
    s
}

/// A well-mixed hash of a group and a node (splitmix64's finalizer), for campaign order.
fn mix(gid: GroupId, node: NodeId) -> u64 {
    let mut z = gid.rotate_left(32) ^ node ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Route a group's raft messages into the node's batches.
fn route(outbox: &mut BTreeMap<NodeId, NodeBatch>, from: NodeId, gid: GroupId, msgs: Vec<Message>) {
    for m in msgs {
        let to = m.to;
        let batch = outbox.entry(to).or_insert_with(|| NodeBatch {
            from,
            to,
            ..NodeBatch::default()
        });
        batch.raft.push((gid, m));
    }
}
