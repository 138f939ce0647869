//! A multi-group node after its app fails inside `handle_ready`: its cached configuration is never stale.

use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft_lease::drive::apply_conf_change_entry;
use raft_lease::multi::{LivenessMode, MultiApp, MultiConfig, MultiNode, NodeBatch};
use raft_lease::{LeaseConfig, LeaseNode, SimClock};

type Node = MultiNode<MemStorage, SimClock>;

/// A `MemStorage` app whose `persist` fails once, right after a Ready whose committed entries
/// applied a membership change (a disk error at the wrong moment).
#[derive(Default)]
struct App {
    fail_after_conf_change: bool,
    applied_conf_change: bool,
    failed: bool,
}

impl MultiApp<MemStorage, SimClock> for App {
    type Error = raft::Error;
    fn install_snapshot(
        &mut self,
        _: u64,
        node: &mut LeaseNode<MemStorage, SimClock>,
        snapshot: Snapshot,
    ) -> raft::Result<()> {
        node.raw().store().wl().apply_snapshot(snapshot)
    }
    fn apply(
        &mut self,
        _: u64,
        node: &mut LeaseNode<MemStorage, SimClock>,
        entries: Vec<Entry>,
    ) -> raft::Result<()> {
        for e in &entries {
            if let Some(cs) = apply_conf_change_entry(node, e)? {
                node.raw().store().wl().set_conf_state(cs);
                self.applied_conf_change = true;
            }
        }
        Ok(())
    }
    fn persist(
        &mut self,
        _: u64,
        node: &mut LeaseNode<MemStorage, SimClock>,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> raft::Result<()> {
        if self.fail_after_conf_change && self.applied_conf_change && !self.failed {
            self.failed = true;
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let store = node.raw().store();
        let mut core = store.wl();
        core.append(entries)?;
        if let Some(hs) = hs {
            core.set_hardstate(hs.clone());
        }
        Ok(())
    }
    fn set_commit(
        &mut self,
        _: u64,
        node: &mut LeaseNode<MemStorage, SimClock>,
        commit: u64,
    ) -> raft::Result<()> {
        node.raw().store().wl().mut_hard_state().set_commit(commit);
        Ok(())
    }
}

fn nodes(clock: &SimClock) -> Vec<Node> {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    (1..=3)
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
                lease: LeaseConfig {
                    promise_ms: 100,
                    drift_ppm: 1_000,
                    margin_ms: 2,
                    ..Default::default()
                },
                tick_ms: 10,
                quiesce_after_ticks: 20,
                seed: 3,
            };
            let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
            MultiNode::new(config, [(1, storage)], clock.clone(), &logger).expect("valid")
        })
        .collect()
}

/// Process and deliver until quiet; errors from `handle_ready` are swallowed (the node keeps
/// running, as STANDARDS asks of a node after an I/O error it reports).
fn settle(nodes: &mut [Node], apps: &mut [App]) -> usize {
    let mut errors = 0;
    loop {
        let mut batches: Vec<NodeBatch> = Vec::new();
        for (n, app) in nodes.iter_mut().zip(apps.iter_mut()) {
            if n.handle_ready(app).is_err() {
                errors += 1;
            }
            batches.extend(n.take_outbox());
        }
        // The driver logs an error and goes back to its loop (next: a tick).
        if batches.is_empty() || errors > 0 {
            return errors;
        }
        for b in batches {
            let to = b.to as usize - 1;
            nodes[to].step(b);
        }
    }
}

fn run_ms(nodes: &mut [Node], apps: &mut [App], clock: &SimClock, ms: u64) -> usize {
    let mut errors = 0;
    for _ in 0..ms / 10 {
        clock.advance(10_000_000);
        nodes.iter_mut().for_each(|n| n.tick());
        errors += settle(nodes, apps);
    }
    errors
}

/// An `Err` from the app inside `handle_ready` (after a membership change was applied
/// to raft in that Ready) must not leave the leader's cached voters at the old ones (before the
/// fix, `extend_lease` computed the lease over them; debug builds panic "stale members").
#[test]
fn an_app_error_after_a_conf_change_never_leaves_the_member_cache_stale() {
    let clock = SimClock::new(0, 0);
    let mut nodes = nodes(&clock);
    let mut apps: Vec<App> = (0..3).map(|_| App::default()).collect();
    run_ms(&mut nodes, &mut apps, &clock, 2_000);
    let l = nodes
        .iter()
        .position(|n| n.group(1).is_some_and(|g| g.is_leader()))
        .expect("a leader");
    let x = (0..3).find(|&i| i != l).unwrap() as u64 + 1;
    apps[l].fail_after_conf_change = true;
    let mut cc = ConfChangeV2::default();
    let mut c = ConfChangeSingle::default();
    c.set_change_type(ConfChangeType::RemoveNode);
    c.node_id = x;
    cc.mut_changes().push(c);
    nodes[l].propose_conf_change(1, cc).expect("proposed");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_ms(&mut nodes, &mut apps, &clock, 500)
    }));
    assert!(apps[l].failed, "the injected error never fired");
    let voters = nodes[l]
        .group(1)
        .unwrap()
        .raw()
        .raft
        .prs()
        .conf()
        .to_conf_state();
    assert!(!voters.voters.contains(&x), "the removal was not applied");
    if let Err(p) = result {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("after one app error the node broke: {msg}");
    }
}
