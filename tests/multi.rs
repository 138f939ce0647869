//! Many raft groups per node (`raft_lease::multi`, `raft_lease::sim::multi`): shared liveness
//! against per-group heartbeats in simulated time, failover after a node dies, a group stuck on
//! a live node, and the seeded randomized multi-group simulation with a negative control for
//! every hazard in MULTI.md.
//!
//! - `RAFT_LEASE_SEED=N` runs one seed of the randomized tests (a failure prints it).
//! - `RAFT_LEASE_MULTI_SEEDS=N` runs seeds `0..N` (default 16, the CI seeds).

mod multi_common;

use multi_common::seeds;
use raft_lease::multi::LivenessMode;
use raft_lease::sim::multi::random::{self, MultiControl, MultiOutcome};
use raft_lease::sim::multi::{MultiSim, MultiSimConfig};

fn sim(mode: LivenessMode, groups: u64) -> MultiSim {
    MultiSim::new(MultiSimConfig {
        groups,
        mode,
        ..MultiSimConfig::default()
    })
}

/// Every group has a leader holding a valid lease.
fn all_leased(s: &MultiSim) -> bool {
    (1..=s.config().groups).all(|g| leased(s, g))
}

fn leased(s: &MultiSim, gid: u64) -> bool {
    let Some(leader) = s.leader(gid) else {
        return false;
    };
    let node = s.node(leader).expect("a leader is up");
    node.group(gid)
        .is_some_and(|g| g.lease_status().state.is_held())
}

/// Messages sent over `ms` of idle simulated time, after the cluster settled.
fn idle_messages(s: &mut MultiSim, ms: u64) -> u64 {
    let (_, before) = s.sent();
    s.run_for_ms(ms);
    s.sent().1 - before
}

#[test]
fn shared_liveness_quiesces_idle_groups_and_keeps_every_lease() {
    let groups = 24;
    let mut shared = sim(LivenessMode::Shared, groups);
    let mut per_group = sim(LivenessMode::PerGroup, groups);
    for s in [&mut shared, &mut per_group] {
        assert!(s.run_until(5_000, all_leased), "the cluster never settled");
        s.run_for_ms(1_000);
    }
    let shared_msgs = idle_messages(&mut shared, 2_000);
    let per_group_msgs = idle_messages(&mut per_group, 2_000);
    eprintln!(
        "{groups} idle groups over 2 s: shared liveness {shared_msgs} messages, per-group heartbeats {per_group_msgs}"
    );
    assert!(all_leased(&shared), "an idle group lost its lease");
    for node in 1..=3 {
        let m = shared.node(node).expect("up");
        for gid in 1..=groups {
            assert!(
                m.is_quiescent(gid),
                "group {gid} on node {node} still ticks"
            );
        }
    }
    // The node stream costs the same at any number of groups; heartbeats grow with them
    // (here 24 groups: 16 times fewer messages).
    assert!(
        shared_msgs * 10 < per_group_msgs,
        "shared liveness sent {shared_msgs} idle messages against {per_group_msgs}"
    );
    assert!(shared.check().violations.is_empty());
    let mut few = sim(LivenessMode::Shared, 3);
    assert!(
        few.run_until(5_000, all_leased),
        "the cluster never settled"
    );
    few.run_for_ms(1_000);
    let few_msgs = idle_messages(&mut few, 2_000);
    assert!(
        shared_msgs <= few_msgs + few_msgs / 10,
        "idle shared liveness grew with the groups: {few_msgs} messages at 3, {shared_msgs} at {groups}"
    );
}

#[test]
fn killed_node_groups_are_led_again_within_promise_and_an_election_timeout() {
    let mut s = sim(LivenessMode::Shared, 12);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000); // quiescent
    let led: Vec<u64> = (1..=12).filter(|&g| s.leader(g) == Some(1)).collect();
    assert!(!led.is_empty(), "node 1 leads nothing: pick another seed");
    let killed_at_ns = s.now_ns();
    s.crash(1);
    let bound_ms = s.config().lease.promise_ms
        + s.config().tick_ms * (s.config().election_tick + s.config().election_spread_ticks) as u64
        + 1_000;
    let ok = s.run_until(bound_ms, |s| led.iter().all(|&g| leased(s, g)));
    let took_ms = (s.now_ns() - killed_at_ns) / 1_000_000;
    eprintln!(
        "node 1 killed: its {} groups were led again with a lease in {took_ms} ms (bound {bound_ms} ms)",
        led.len()
    );
    assert!(
        ok,
        "after {bound_ms} ms some of {led:?} had no leased leader"
    );
    let r = s.check();
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn a_node_is_supported_by_a_live_peer_and_not_by_a_killed_one() {
    let mut s = sim(LivenessMode::Shared, 3);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    assert!(
        s.node(1).expect("up").supported_by(2),
        "a live peer supports"
    );
    s.crash(2);
    s.run_for_ms(2 * s.config().lease.promise_ms);
    let m = s.node(1).expect("up");
    assert!(!m.supported_by(2), "a killed peer's support ran out");
    assert!(m.supported_by(3), "the other peer still supports");
    let mut per_group = sim(LivenessMode::PerGroup, 3);
    assert!(per_group.run_until(5_000, all_leased));
    assert!(
        !per_group.node(1).expect("up").supported_by(2),
        "no session"
    );
}

/// One group's raft messages stop at its leader's node, while that node's support flows.
fn stuck_group(no_give_up: bool) -> bool {
    let mut config = MultiSimConfig::default();
    config.lease.safeties.testing.no_give_up = no_give_up;
    let mut s = MultiSim::new(config);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000); // followers fortified, the group quiescent
    let stuck_at = s.leader(1).expect("leased");
    s.mute_group(1, stuck_at);
    // A client's write wakes the stuck leader; check-quorum steps it down.
    s.put(1, stuck_at, b"k");
    let moved = s.run_until(5_000, |s| {
        s.leader(1).is_some_and(|l| l != stuck_at) && leased(s, 1)
    });
    assert!(s.check().violations.is_empty());
    moved
}

#[test]
fn group_stuck_on_a_live_node_is_led_elsewhere() {
    assert!(
        stuck_group(false),
        "the stuck group was never led elsewhere"
    );
}

#[test]
fn control_no_give_up_leaves_a_stuck_group_unavailable() {
    assert!(
        !stuck_group(true),
        "the group moved although its followers stayed fortified"
    );
}

// ----- randomized -----------------------------------------------------------------------------

fn run(seed: u64, control: Option<MultiControl>) -> MultiOutcome {
    random::run(seed, control, 2_500)
}

#[test]
fn randomized_multi_group_faults_never_break_a_lease() {
    let (mut lease_reads, mut checks, mut faults) = (0, 0, 0);
    let mut failovers = Vec::new();
    for seed in seeds() {
        let out = run(seed, None);
        let r = &out.report;
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {} violations, first {:?}\nreproduce: RAFT_LEASE_SEED={seed} cargo test --all-features --test multi\nfaults: {:#?}",
            r.violations.len(),
            r.violations[0],
            out.faults
        );
        if let Err(e) = &out.liveness {
            panic!(
                "seed {seed}: liveness failed: {e}\nfaults: {:#?}",
                out.faults
            );
        }
        lease_reads += r.lease_reads_checked;
        checks += r.lease_checks;
        faults += out.faults.len();
        failovers.extend(out.failovers);
    }
    eprintln!(
        "randomized multi-group ({} seeds): {faults} faults, {lease_reads} lease reads and {checks} \
         lease-monitor instants checked, 0 violations, every group led again after healing",
        seeds().len()
    );
    report_failovers(&failovers);
    assert!(lease_reads > 0 && checks > 0, "nothing was checked");
}

/// How long the groups of a crashed node that led the most took to be led again with a lease,
/// counted from the first instant a majority of each group's voters were up (another crash can
/// hold that back). Reported, not asserted: a pause, a cut, a held message or a membership
/// change of the run can hold a group up for as long as it lasts; the fault-free bound is
/// asserted by `killed_node_groups_are_led_again_within_promise_and_an_election_timeout`.
fn report_failovers(failovers: &[random::Failover]) {
    let groups = failovers.iter().flat_map(|f| f.groups.iter());
    let (mut took, mut waited, mut never) = (Vec::new(), 0, 0);
    for g in groups {
        match (g.quorum_back_ms, g.leased_after_ms) {
            (Some(back), Some(ms)) => {
                took.push(ms);
                waited += (back > 0) as usize;
            }
            _ => never += 1,
        }
    }
    took.sort_unstable();
    let pct = |p: usize| took.get(took.len() * p / 100).copied();
    eprintln!(
        "mass failovers: {} crashes, {} groups led again with a lease in p50 {:?} / p90 {:?} / \
         max {:?} ms from a majority of their voters being up ({waited} of them waited for a \
         crashed voter to restart; {never} not led again before the liveness phase)",
        failovers.len(),
        took.len(),
        pct(50),
        pct(90),
        took.last()
    );
}

/// The first CI seed on which the control is caught: by the safety checks, or for a liveness
/// hazard by the liveness phase.
fn assert_caught(control: MultiControl, by_liveness: bool) {
    let caught = seeds().into_iter().find(|&seed| {
        let out = run(seed, Some(control));
        match by_liveness {
            true => out.liveness.is_err(),
            false => out.report.unsafe_found(),
        }
    });
    eprintln!("multi-group control {control:?}: caught by seed {caught:?}");
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(caught.is_some(), "the CI seeds never caught {control:?}");
    }
}

#[test]
fn control_support_resumed_at_a_withdrawn_epoch_is_caught() {
    assert_caught(MultiControl::ForgetWithdrawals, false);
}

#[test]
fn control_restart_without_a_new_incarnation_is_caught() {
    assert_caught(MultiControl::SameIncarnation, false);
}

#[test]
fn control_no_boot_promise_is_caught() {
    assert_caught(MultiControl::NoBootPromise, false);
}

#[test]
fn control_drift_beyond_the_bound_is_caught() {
    assert_caught(MultiControl::DriftBeyondBound, false);
}

#[test]
fn control_ending_an_epoch_at_once_is_caught() {
    assert_caught(MultiControl::EndEpochAtOnce, false);
}

#[test]
fn control_counting_an_earlier_terms_fortifications_is_caught() {
    assert_caught(MultiControl::CountEarlierTerms, false);
}

#[test]
fn control_releasing_on_a_term_move_is_caught() {
    assert_caught(MultiControl::ReleaseOnTermMove, false);
}

#[test]
fn control_counting_own_promise_with_mixed_settings_is_caught() {
    assert_caught(MultiControl::MixedSettingsOwnPromise, false);
}

#[test]
fn control_forgetting_a_removed_replicas_fortification_is_caught() {
    assert_caught(MultiControl::ForgetRemovedFortifications, false);
}

#[test]
fn control_no_give_up_is_caught_by_the_liveness_phase() {
    assert_caught(MultiControl::NoGiveUp, true);
}

// ----- fortification and the leader's own campaigns -----------------------------------------

mod manual {
    //! Three `MultiNode`s on one simulated clock, delivering every batch at once, recording
    //! every raft message sent: to replay one later, as a delayed duplicate.

    use raft::eraftpb::{Entry, EntryType, HardState, Message, Snapshot};
    use raft::storage::MemStorage;
    use raft_lease::multi::{
        LivenessMode, MultiApp, MultiConfig, MultiMemApp, MultiNode, NodeBatch,
    };
    use raft_lease::{LeaseConfig, LeaseNode, SimClock};

    pub type Node = MultiNode<MemStorage, SimClock>;
    type Replica = LeaseNode<MemStorage, SimClock>;

    struct NoState;

    impl MultiMemApp<SimClock> for NoState {
        fn apply(&mut self, _: u64, _: &mut Replica, _: Vec<Entry>) {}
    }

    /// One node's app: no state, and optionally one persist failure right after a `Ready`
    /// applied a membership change (a disk error at the worst moment).
    #[derive(Default)]
    pub struct App {
        pub fail_after_conf_change: bool,
        conf_changed: bool,
        pub failed: bool,
        /// (group, index) of entries persisted since the last sync.
        unsynced: std::collections::BTreeSet<(u64, u64)>,
        /// Calls of `persist` with entries.
        pub persists: u64,
        /// Calls of `sync`.
        pub syncs: u64,
        /// Entries applied here before the sync that made them durable here.
        pub applied_unsynced: u64,
    }

    impl MultiApp<MemStorage, SimClock> for App {
        type Error = raft::Error;

        fn install_snapshot(&mut self, g: u64, n: &mut Replica, s: Snapshot) -> raft::Result<()> {
            MultiApp::install_snapshot(&mut NoState, g, n, s)
        }

        fn apply(&mut self, g: u64, n: &mut Replica, entries: Vec<Entry>) -> raft::Result<()> {
            let normal = |e: &Entry| e.get_entry_type() == EntryType::EntryNormal;
            self.conf_changed |= !entries.iter().all(normal);
            let unsynced = |e: &&Entry| self.unsynced.contains(&(g, e.index));
            self.applied_unsynced += entries.iter().filter(unsynced).count() as u64;
            MultiApp::apply(&mut NoState, g, n, entries)
        }

        fn persist(
            &mut self,
            g: u64,
            n: &mut Replica,
            entries: &[Entry],
            hs: Option<&HardState>,
        ) -> raft::Result<()> {
            if self.fail_after_conf_change && self.conf_changed && !self.failed {
                self.failed = true;
                return Err(raft::Error::Store(raft::StorageError::Unavailable));
            }
            self.persists += !entries.is_empty() as u64;
            self.unsynced.extend(entries.iter().map(|e| (g, e.index)));
            MultiApp::persist(&mut NoState, g, n, entries, hs)
        }

        fn sync(&mut self) -> raft::Result<()> {
            self.syncs += 1;
            self.unsynced.clear();
            Ok(())
        }

        fn set_commit(&mut self, g: u64, n: &mut Replica, commit: u64) -> raft::Result<()> {
            MultiApp::set_commit(&mut NoState, g, n, commit)
        }
    }

    pub struct Cluster {
        pub clock: SimClock,
        pub nodes: Vec<Node>,
        pub apps: Vec<App>,
        /// Errors `handle_ready` returned (the driver reports them and goes on).
        pub errors: usize,
        /// Every raft message sent so far, with its group.
        pub sent: Vec<(u64, Message)>,
        /// Directed links `(from, to)` on which raft messages are dropped (the node-level
        /// support and fortification messages still flow).
        pub cut: Vec<(u64, u64)>,
    }

    impl Cluster {
        pub fn new(groups: u64) -> Self {
            Cluster::with(groups, |_, _| {})
        }

        /// A cluster whose lease config of node `id` is first changed by `lease(id, config)`.
        pub fn with(groups: u64, lease: impl Fn(u64, &mut LeaseConfig)) -> Self {
            let clock = SimClock::new(0, 0);
            let logger = slog::Logger::root(slog::Discard, slog::o!());
            let nodes = (1..=3)
                .map(|node_id| {
                    let config = MultiConfig {
                        node_id,
                        incarnation: 1,
                        mode: LivenessMode::Shared,
                        raft: raft::Config {
                            election_tick: 10,
                            heartbeat_tick: 2,
                            check_quorum: true,
                            pre_vote: true,
                            ..Default::default()
                        },
                        lease: {
                            let mut l = LeaseConfig {
                                promise_ms: 100,
                                drift_ppm: 1_000,
                                margin_ms: 2,
                                ..Default::default()
                            };
                            lease(node_id, &mut l);
                            l
                        },
                        tick_ms: 10,
                        quiesce_after_ticks: 20,
                        seed: 3,
                    };
                    let storage = || MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
                    let storages = (1..=groups).map(|g| (g, storage()));
                    MultiNode::new(config, storages, clock.clone(), &logger).expect("valid")
                })
                .collect();
            Cluster {
                clock,
                nodes,
                apps: (0..3).map(|_| App::default()).collect(),
                errors: 0,
                sent: Vec::new(),
                cut: Vec::new(),
            }
        }

        pub fn run_ms(&mut self, ms: u64) {
            for _ in 0..ms / 10 {
                self.clock.advance(10_000_000);
                self.nodes.iter_mut().for_each(|n| n.tick());
                self.settle();
            }
        }

        /// Process and deliver until nothing more is sent.
        pub fn settle(&mut self) {
            loop {
                let mut batches = Vec::new();
                let errors = self.errors;
                for (node, app) in self.nodes.iter_mut().zip(&mut self.apps) {
                    if node.handle_ready(app).is_err() {
                        self.errors += 1;
                    }
                    batches.extend(node.take_outbox());
                }
                // After an error the driver reports it and goes back to its loop: a tick next.
                if batches.is_empty() || self.errors > errors {
                    return;
                }
                for b in batches {
                    self.sent.extend(b.raft.iter().cloned());
                    self.deliver(b);
                }
            }
        }

        pub fn deliver(&mut self, mut b: NodeBatch) {
            if self.cut.contains(&(b.from, b.to)) {
                b.raft.clear();
            }
            let to = b.to as usize - 1;
            self.nodes[to].step(b);
        }

        pub fn leader(&self, gid: u64) -> Option<u64> {
            let g = |n: &Node| n.group(gid).is_some_and(|g| g.is_leader());
            self.nodes.iter().find(|n| g(n)).map(|n| n.id())
        }
    }
}

/// Hand `msg` (group 1) to node `to` alone, as if the network delivered it just now.
fn replay(c: &mut manual::Cluster, to: u64, msg: raft::eraftpb::Message) {
    let batch = raft_lease::multi::NodeBatch {
        from: msg.from,
        to,
        raft: vec![(1, msg)],
        ..Default::default()
    };
    c.deliver(batch);
    c.settle();
}

#[test]
fn delayed_copy_of_the_winning_vote_request_never_releases_a_fortification() {
    use raft::eraftpb::MessageType;
    let mut c = manual::Cluster::new(1);
    c.run_ms(1_000);
    let leader = c.leader(1).expect("led");
    let follower = (1..=3).find(|&n| n != leader).expect("two followers");
    let fortified = |c: &manual::Cluster| {
        c.nodes[follower as usize - 1]
            .group(1)
            .unwrap()
            .fortified_to()
    };
    assert_eq!(fortified(&c), Some(leader));
    let term = c.nodes[leader as usize - 1]
        .group(1)
        .unwrap()
        .raw()
        .raft
        .term;
    let won = c
        .sent
        .iter()
        .map(|(_, m)| m)
        .find(|m| {
            m.from == leader
                && m.to == follower
                && m.get_msg_type() == MessageType::MsgRequestVote
                && m.term == term
        })
        .expect("the campaign that won the term")
        .clone();
    // The request that won the term arrives again, late: the leader still leads it.
    replay(&mut c, follower, won.clone());
    assert_eq!(
        fortified(&c),
        Some(leader),
        "a late copy released the fortification"
    );
    assert!(c.nodes[leader as usize - 1]
        .group(1)
        .unwrap()
        .lease_status()
        .state
        .is_held());
    // The check can fail: a pre-vote for a later term from the same leader does release it,
    // since a candidate no longer leads its old term.
    let mut later = won;
    later.set_msg_type(MessageType::MsgRequestPreVote);
    later.term = term + 1;
    replay(&mut c, follower, later);
    assert_eq!(fortified(&c), None, "a campaign for a later term releases");
}

/// A held, rejected pre-vote response of a later term reaches both followers of a
/// quiescent group. raft-rs moves a follower's term on it; if that released the fortification,
/// the followers, whose per-group promises lapsed while the group slept, elect one of them while
/// the leader, cut off from it, still counts their fortifications (their nodes support it at the
/// same epoch). Returns whether two nodes ever held a lease of group 1 at the same instant.
fn term_move_overlap(release_on_term_move: bool) -> bool {
    use raft::eraftpb::{Message, MessageType};
    let mut c = manual::Cluster::with(1, |_, l| {
        l.safeties.testing.release_on_term_move = release_on_term_move;
    });
    c.run_ms(1_000);
    let r = c.leader(1).expect("led");
    let followers: Vec<u64> = (1..=3).filter(|&n| n != r).collect();
    fn group(
        c: &manual::Cluster,
        n: u64,
    ) -> &raft_lease::LeaseNode<raft::storage::MemStorage, raft_lease::SimClock> {
        c.nodes[n as usize - 1].group(1).unwrap()
    }
    for &f in &followers {
        assert_eq!(group(&c, f).fortified_to(), Some(r), "{f} fortified");
    }
    assert!(c.nodes[r as usize - 1].is_quiescent(1), "the group sleeps");
    let term = group(&c, r).raw().raft.term;
    for &f in &followers {
        c.cut.push((f, r)); // whoever wins next cannot tell the old leader
        let other = followers.iter().copied().find(|&o| o != f).unwrap();
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgRequestPreVoteResponse);
        m.from = other;
        m.to = f;
        m.term = term + 1;
        m.reject = true;
        replay(&mut c, f, m);
    }
    let holders = |c: &manual::Cluster| {
        (1..=3)
            .filter(|&n| group(c, n).lease_status().state.is_held())
            .count()
    };
    let mut overlap = false;
    for _ in 0..300 {
        c.run_ms(10);
        overlap |= holders(&c) > 1;
    }
    if !release_on_term_move {
        for &f in &followers {
            assert_eq!(group(&c, f).fortified_to(), Some(r), "{f} let go");
        }
        assert_eq!(c.leader(1), Some(r), "the leader keeps its group");
    }
    overlap
}

#[test]
fn a_held_rejected_pre_vote_response_never_ends_a_fortification() {
    assert!(!term_move_overlap(false), "two lease holders");
}

#[test]
fn control_releasing_on_a_term_move_gives_two_lease_holders() {
    assert!(term_move_overlap(true), "the control found no overlap");
}

/// Both followers of a quiescent group have the group removed and hosted again on the same
/// storage (a replica moved away and back, or rebuilt). The leader, whose raft messages to them
/// are cut, still counts the fortifications they made: their nodes support it at the same epoch
/// and incarnation. Returns whether two nodes ever held a lease of group 1 at the same instant.
fn readded_followers_overlap(forget: bool) -> bool {
    let mut c = manual::Cluster::with(1, |_, l| {
        l.safeties.testing.forget_removed_fortifications = forget;
    });
    c.run_ms(1_000);
    let r = c.leader(1).expect("led");
    let followers: Vec<u64> = (1..=3).filter(|&n| n != r).collect();
    for &f in &followers {
        let node = &mut c.nodes[f as usize - 1];
        assert_eq!(node.group(1).unwrap().fortified_to(), Some(r));
        let storage = node.group(1).unwrap().raw().store().clone();
        node.remove_group(1).expect("hosted");
        assert!(node.group(1).is_none());
        node.add_group(1, storage).expect("hosted again");
        c.cut.push((f, r));
    }
    let mut overlap = false;
    for _ in 0..300 {
        c.run_ms(10);
        let held = (1..=3).filter(|&n| {
            let g = c.nodes[n as usize - 1].group(1).unwrap();
            g.lease_status().state.is_held()
        });
        overlap |= held.count() > 1;
    }
    if !forget {
        for &f in &followers {
            let g = c.nodes[f as usize - 1].group(1).unwrap();
            assert_eq!(g.fortified_to(), Some(r), "{f} hosted again unfortified");
        }
    }
    overlap
}

#[test]
fn a_group_hosted_again_keeps_the_fortification_its_removed_replica_made() {
    assert!(!readded_followers_overlap(false), "two lease holders");
}

#[test]
fn control_a_group_hosted_again_forgetting_its_fortification_gives_two_lease_holders() {
    assert!(
        readded_followers_overlap(true),
        "the control found no overlap"
    );
}

/// A removed group's read handles refuse for good, and a group hosted again under the same id
/// revives nothing of the old one: a new slot, no lease until it earns one in a new term.
#[test]
fn a_removed_group_revokes_its_handles_and_a_readded_one_revives_nothing() {
    let mut c = manual::Cluster::new(2);
    c.run_ms(1_000);
    let r = c.leader(1).expect("led");
    let leader = &mut c.nodes[r as usize - 1];
    let old = leader.group(1).unwrap().read_handle();
    assert!(old.read(|| ()).is_ok(), "a lease read before the removal");
    let term = leader.group(1).unwrap().raw().raft.term;
    let storage = leader.group(1).unwrap().raw().store().clone();
    leader.remove_group(1).expect("hosted");
    assert!(
        old.read(|| ()).is_err(),
        "a removed group's handle still reads"
    );
    assert!(matches!(
        leader.remove_group(1),
        Err(raft_lease::NodeError::NoSuchGroup(1))
    ));
    leader.add_group(1, storage).expect("hosted again");
    let new = leader.group(1).unwrap().read_handle();
    assert!(
        new.read(|| ()).is_err(),
        "the new replica starts with no lease"
    );
    c.run_ms(2_000);
    assert!(old.read(|| ()).is_err(), "the old slot came back to life");
    let l = c.leader(1).expect("group 1 led again");
    let g = c.nodes[l as usize - 1].group(1).unwrap();
    assert!(g.raw().raft.term > term, "led again in a later term");
    assert!(g.lease_status().state.is_held(), "and leased");
    let l2 = c.leader(2).expect("group 2 led");
    let g2 = c.nodes[l2 as usize - 1].group(2).unwrap();
    assert!(
        g2.lease_status().state.is_held(),
        "the other group lost its lease"
    );
}

// ----- scripted episodes ----------------------------------------------------------------------

/// The late-withdrawal episode on a settled 3-node cluster; returns the monitor's findings.
fn late_withdrawal_violations(end_epoch_at_once: bool) -> usize {
    use rand::SeedableRng;
    let mut config = MultiSimConfig {
        groups: 1,
        election_spread_ticks: 0,
        ..MultiSimConfig::default()
    };
    config.lease.safeties.testing.end_epoch_at_once = end_epoch_at_once;
    let mut s = MultiSim::new(config);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let done = raft_lease::sim::multi::episodes::late_withdrawal(&mut s, 1, &mut rng);
    assert!(done.is_some(), "the episode did not run");
    s.check().violations.len()
}

#[test]
fn late_withdrawal_from_a_restarted_supporter_never_cuts_a_lease_short() {
    assert_eq!(late_withdrawal_violations(false), 0);
}

#[test]
fn control_ending_an_epoch_at_once_gives_two_lease_holders() {
    assert!(
        late_withdrawal_violations(true) > 0,
        "the monitor saw nothing although the supporter released its replicas early"
    );
}

/// The resumed-support episode on a settled 3-node cluster; returns the monitor's findings.
fn resumed_support_violations(forget_withdrawals: bool) -> usize {
    use rand::SeedableRng;
    let mut config = MultiSimConfig {
        groups: 1,
        ..MultiSimConfig::default()
    };
    config.lease.safeties.testing.forget_withdrawals = forget_withdrawals;
    let mut s = MultiSim::new(config);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let done = raft_lease::sim::multi::episodes::resumed_support(&mut s, 1, &mut rng);
    assert!(done.is_some(), "the episode did not run");
    s.check().violations.len()
}

#[test]
fn support_never_resumes_at_a_withdrawn_epoch_for_a_deposed_leader() {
    assert_eq!(resumed_support_violations(false), 0);
}

#[test]
fn control_support_resumed_at_a_withdrawn_epoch_gives_two_lease_holders() {
    assert!(
        resumed_support_violations(true) > 0,
        "the monitor saw nothing although support came back at a withdrawn epoch"
    );
}

/// A leader transfers a group away and wins it back: its followers' fortifications of its
/// first term must not count in the second. Returns the monitor's findings.
fn won_back_violations(count_earlier_terms: bool) -> usize {
    let mut config = MultiSimConfig {
        groups: 1,
        ..MultiSimConfig::default()
    };
    config.lease.safeties.testing.count_earlier_terms = count_earlier_terms;
    let mut s = MultiSim::new(config);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000);
    let r = s.leader(1).expect("led");
    let x = (1..=3).find(|&n| n != r).expect("a follower");
    s.transfer_leader(1, r, x);
    assert!(s.run_until(3_000, |s| s.leader(1) == Some(x) && leased(s, 1)));
    s.run_for_ms(500);
    s.transfer_leader(1, x, r);
    assert!(s.run_until(3_000, |s| s.leader(1) == Some(r) && leased(s, 1)));
    s.run_for_ms(3_000);
    s.check().violations.len()
}

#[test]
fn leader_winning_a_group_back_counts_only_its_new_terms_fortifications() {
    assert_eq!(won_back_violations(false), 0);
}

#[test]
fn control_counting_an_earlier_terms_fortifications_breaks_the_lease() {
    assert!(
        won_back_violations(true) > 0,
        "the monitor saw nothing although the old term's fortifications were counted"
    );
}

/// A transfer raft gives up (to a node that is down) must not leave the group without a lease:
/// under shared liveness nothing else ends a healthy leader's term, so a fence kept for the
/// rest of the term would keep the group unleased and awake for good. Here `MsgTimeoutNow` may
/// or may not have left before the crash took effect; either way the group leases again (the
/// same term with the fence lifted, or a later term after the leader stepped down) and sleeps.
#[test]
fn an_abandoned_transfer_never_leaves_a_group_without_a_lease() {
    let mut s = sim(LivenessMode::Shared, 2);
    assert!(s.run_until(5_000, all_leased), "the cluster never settled");
    s.run_for_ms(1_000);
    let r = s.leader(1).expect("led");
    let x = (1..=3).find(|&n| n != r).expect("a follower");
    s.crash(x);
    s.transfer_leader(1, r, x);
    s.run_for_ms(300);
    s.restart(x);
    let settled = |s: &MultiSim| {
        let Some(l) = s.leader(1) else { return false };
        leased(s, 1) && s.node(l).is_some_and(|n| n.is_quiescent(1))
    };
    assert!(
        s.run_until(5_000, settled),
        "group 1 has no lease or never sleeps 5 s after an abandoned transfer"
    );
    assert!(
        s.check().violations.is_empty(),
        "{:?}",
        s.check().violations
    );
}

/// An app error inside `handle_ready`, right after a Ready applied a membership change, must not
/// leave the leader's cached voters at the old ones: before the fix the lease went on being
/// computed over them (debug builds panic "stale members").
#[test]
fn an_app_error_after_a_conf_change_never_leaves_the_member_cache_stale() {
    use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
    let mut c = manual::Cluster::new(1);
    c.run_ms(2_000);
    let l = c.leader(1).expect("a leader");
    let x = (1..=3).find(|&n| n != l).expect("a follower");
    c.apps[l as usize - 1].fail_after_conf_change = true;
    let mut remove = ConfChangeSingle::default();
    remove.set_change_type(ConfChangeType::RemoveNode);
    remove.node_id = x;
    let mut cc = ConfChangeV2::default();
    cc.mut_changes().push(remove);
    c.nodes[l as usize - 1]
        .propose_conf_change(1, cc)
        .expect("proposed");
    c.run_ms(500);
    assert!(
        c.apps[l as usize - 1].failed,
        "the injected error never fired"
    );
    assert_eq!(c.errors, 1);
    let g = c.nodes[l as usize - 1].group(1).expect("hosted");
    let voters = g.raw().raft.prs().conf().to_conf_state().voters;
    assert!(!voters.contains(&x), "the removal was not applied");
    assert!(g.lease_status().state.is_held(), "no lease after the error");
}

#[test]
fn a_group_id_already_hosted_is_refused_not_replaced() {
    let mut c = manual::Cluster::new(1);
    let storage = raft::storage::MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
    let refused = c.nodes[0].add_group(1, storage);
    assert!(
        matches!(refused, Err(raft_lease::NodeError::GroupExists(1))),
        "{refused:?}"
    );
    let storage = raft::storage::MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
    assert!(
        c.nodes[0].add_group(2, storage).is_ok(),
        "a new id is hosted"
    );
}

/// Writes to many groups at once while node 3 hears nothing, then node 3 catching up (its
/// appends carry entries and a commit that covers them): one sync per round covers every group's
/// persisting, and no entry is applied before the sync that made it durable on that node (raft
/// counts a log it was told is persisted: a leader counts itself towards a commit).
fn writes_to_many_groups(late_sync: bool) -> (u64, u64, u64) {
    let mut c = manual::Cluster::with(8, |_, l| l.safeties.testing.sync_after_advance = late_sync);
    c.run_ms(2_000);
    c.cut = vec![(1, 3), (2, 3)];
    let before: Vec<(u64, u64)> = c.apps.iter().map(|a| (a.persists, a.syncs)).collect();
    for round in 0..20u8 {
        for gid in 1..=8 {
            let l = c.leader(gid).expect("every group led");
            c.nodes[l as usize - 1]
                .propose(gid, vec![round])
                .expect("proposed");
        }
        c.settle();
    }
    c.cut.clear();
    c.run_ms(500);
    let persists: u64 = c
        .apps
        .iter()
        .zip(&before)
        .map(|(a, b)| a.persists - b.0)
        .sum();
    let syncs: u64 = c.apps.iter().zip(&before).map(|(a, b)| a.syncs - b.1).sum();
    let early: u64 = c.apps.iter().map(|a| a.applied_unsynced).sum();
    (persists, syncs, early)
}

#[test]
fn one_sync_covers_every_group_and_precedes_what_depends_on_it() {
    let (persists, syncs, early) = writes_to_many_groups(false);
    assert_eq!(early, 0, "entries applied before their sync");
    assert!(
        syncs * 2 < persists,
        "{syncs} syncs for {persists} persists of 8 groups: not batched"
    );
}

#[test]
fn control_a_sync_after_advance_applies_entries_before_they_are_durable() {
    let (_, _, early) = writes_to_many_groups(true);
    assert!(early > 0, "the late sync went unseen");
}
