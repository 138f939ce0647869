//! Faults of the randomized multi-group run beyond whole links and whole nodes: single messages
//! held, delayed, duplicated or dropped by type inside node batches, rolling changes of a node's
//! promise, the loss or stall of the node that leads the most groups, joint membership changes,
//! transfers of quiescent groups, and groups removed from a node and hosted there again.

use raft::eraftpb::{ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{MsgAction, MsgKind, MsgRule, MultiSim};
use crate::multi::GroupId;
use crate::sim::scenarios::conf_change;

/// The promises a node may run with, in ms (its election timeout too), around the shared 100.
pub const PROMISES_MS: [u64; 6] = [50, 60, 80, 100, 120, 150];

/// A fault that ends by itself later.
#[derive(Debug, Clone, Copy)]
pub(super) enum Undo {
    Resume,
    Restart,
    /// Reconnect the node with this peer.
    Reconnect(u64),
    /// Let this group's raft messages through to the node again.
    Unmute(u64),
    /// The node's link to this peer is fast again.
    Fast(u64),
    /// The node hosts this group again.
    AddGroup(u64),
}

/// Faults to undo: `(ms, node, what)`.
pub(super) type Later = Vec<(u64, u64, Undo)>;

fn now_ms(sim: &MultiSim) -> u64 {
    sim.now_ns() / 1_000_000
}

/// One kind of single message, on one link or all links from or to one node, for 50–600 ms:
/// held alone for a while (reordered against its batch, delayed around `P`, or held up to `10P`
/// and delivered long after the world moved on), sent twice (the copy up to `10P` late), or lost.
pub(super) fn message_rule(sim: &mut MultiSim, rng: &mut ChaCha8Rng) -> String {
    let n = sim.config().nodes;
    let p_us = sim.max_promise_ms() * 1_000;
    let kind = MsgKind::ALL[rng.gen_range(0..MsgKind::ALL.len())];
    let (a, b) = (rng.gen_range(1..=n), rng.gen_range(1..=n));
    let (from, to) = match rng.gen_range(0..3) {
        0 if a != b => (Some(a), Some(b)),
        0 | 1 => (Some(a), None),
        _ => (None, Some(b)),
    };
    let hold = |min_extra_us, max_extra_us| MsgAction::Hold {
        min_extra_us,
        max_extra_us,
    };
    let action = match rng.gen_range(0..6) {
        0 => hold(0, p_us / 2),
        1 => hold(p_us / 2, 2 * p_us),
        2 => hold(p_us, 10 * p_us),
        3 | 4 => MsgAction::Duplicate {
            min_extra_us: 0,
            max_extra_us: 10 * p_us,
        },
        _ => MsgAction::Drop,
    };
    let until_ms = now_ms(sim) + rng.gen_range(50..=600);
    sim.net_mut().add_rule(MsgRule {
        from,
        to,
        kind,
        action,
        until_ns: until_ms * 1_000_000,
    });
    let link = |x: Option<u64>| x.map_or("*".to_string(), |x| x.to_string());
    format!(
        "{kind:?} {}->{}: {action:?} until {until_ms}ms",
        link(from),
        link(to)
    )
}

/// A rolling change of the promise setting on one node (with pre-vote only): it stops, gets a
/// new promise (and election timeout), and starts again at once or later, passing the longest
/// promise it ever ran with as `prior_promise_ms`.
pub(super) fn rolling_change(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    node: u64,
    later: &mut Later,
) -> String {
    // Without pre-vote, nodes whose election timeouts do not overlap are not live (see
    // `random::config`).
    let c = sim.config();
    if !sim.is_up(node) || !c.pre_vote || !c.no_pre_vote_nodes.is_empty() {
        return String::new();
    }
    // With follower read leases, only a promise whose election timeout fits `G` (below half
    // of it): a node refuses to start with one it does not.
    let grant_ms = c.lease.follower_leases.map_or(0, |f| f.max_grant_ms);
    let fits: Vec<u64> = PROMISES_MS
        .into_iter()
        .filter(|&p| grant_ms < p / 2 || grant_ms == 0)
        .collect();
    let was_ms = sim.promise_ms(node);
    let promise_ms = fits[rng.gen_range(0..fits.len())];
    sim.crash(node);
    sim.set_promise_ms(node, promise_ms);
    let what = format!("rolling change: {node} restarts with P {was_ms}->{promise_ms}ms");
    if rng.gen_bool(0.5) {
        sim.restart(node);
        return format!("{what} at once");
    }
    let at = now_ms(sim) + rng.gen_range(0..300);
    later.push((at, node, Undo::Restart));
    format!("{what} at {at}ms")
}

/// The groups each up node leads now.
fn led_by(sim: &MultiSim, node: u64) -> Vec<GroupId> {
    let groups = 1..=sim.config().groups;
    groups.filter(|&g| sim.leader(g) == Some(node)).collect()
}

/// A mass failover: when each group the crashed node led had a leader holding a lease again.
#[derive(Debug, Clone)]
pub struct Failover {
    /// Real time of the crash, ns.
    pub at_ns: u64,
    /// The node that crashed.
    pub node: u64,
    /// Each group it led.
    pub groups: Vec<FailedGroup>,
}

/// One group of a [`Failover`]. Other faults may go on meanwhile: a second crash can leave the
/// group without a quorum of live voters for a while, so the time to a leased leader is counted
/// from the first instant a majority of its voters (both halves of a joint configuration) were
/// up again.
#[derive(Debug, Clone)]
pub struct FailedGroup {
    /// The group.
    pub gid: GroupId,
    /// Its voters at the crash, incoming and outgoing.
    pub voters: (Vec<u64>, Vec<u64>),
    /// How long after the crash a majority of its voters were up again (0 if the crash left
    /// one), ms; `None` if never.
    pub quorum_back_ms: Option<u64>,
    /// How long after that a live leader held a lease, ms; `None` if never.
    pub leased_after_ms: Option<u64>,
}

impl Failover {
    /// Read from the simulation how long each group took.
    pub(super) fn measure(&mut self, sim: &MultiSim) {
        for g in self.groups.iter_mut() {
            let (incoming, outgoing) = &g.voters;
            let both = sim.majority_up_ns([incoming, outgoing], self.at_ns);
            g.quorum_back_ms = both.map(|t| (t - self.at_ns) / 1_000_000);
            let again =
                both.and_then(|t| sim.leased_again_ns(g.gid, t).map(|l| (l - t) / 1_000_000));
            g.leased_after_ms = again;
        }
    }
}

/// Mass failover: the node that leads the most groups crashes, and comes back after up to `10P`.
pub(super) fn mass_failover(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    watched: &mut Vec<Failover>,
) -> String {
    let Some((groups, node)) = busiest_leader(sim) else {
        return String::new();
    };
    let failed = groups.iter().filter_map(|&gid| {
        let (_, cs) = leader_conf(sim, gid)?;
        Some(FailedGroup {
            gid,
            voters: (cs.voters, cs.voters_outgoing),
            quorum_back_ms: None,
            leased_after_ms: None,
        })
    });
    watched.push(Failover {
        at_ns: sim.now_ns(),
        node,
        groups: failed.collect(),
    });
    sim.crash(node);
    let p_ms = sim.max_promise_ms();
    let at = now_ms(sim) + rng.gen_range(p_ms..=10 * p_ms);
    later.push((at, node, Undo::Restart));
    format!("mass failover: {node}, leader of groups {groups:?}, crashes; restarts at {at}ms")
}

/// The node that leads the most groups stalls (a GC pause, a stopped VM) for `P` to `5P`: its
/// clock runs on, and every lease it holds must end before another leader's begins, in every
/// group at once, each lease resting on promises its followers made with their own settings.
pub(super) fn mass_stall(sim: &mut MultiSim, rng: &mut ChaCha8Rng, later: &mut Later) -> String {
    let Some((groups, node)) = busiest_leader(sim) else {
        return String::new();
    };
    sim.pause(node);
    let p_ms = sim.max_promise_ms();
    let until = now_ms(sim) + rng.gen_range(p_ms..=5 * p_ms);
    later.push((until, node, Undo::Resume));
    format!("mass stall: {node}, leader of groups {groups:?}, paused until {until}ms")
}

/// The live, running node that leads the most groups, with those groups (none if it leads none).
fn busiest_leader(sim: &MultiSim) -> Option<(Vec<GroupId>, u64)> {
    let up = (1..=sim.config().nodes).filter(|&n| sim.is_up(n) && !sim.is_paused(n));
    let most = up
        .map(|n| (led_by(sim, n), n))
        .max_by_key(|(g, n)| (g.len(), *n));
    most.filter(|(g, _)| !g.is_empty())
}

/// Group `gid`'s configuration at its leader, and the leader.
fn leader_conf(sim: &MultiSim, gid: GroupId) -> Option<(u64, ConfState)> {
    let leader = sim.leader(gid)?;
    let g = sim.node(leader)?.group(gid)?;
    Some((leader, g.raw().raft.prs().conf().to_conf_state()))
}

/// A joint membership change (ConfChangeV2) in group `gid`: leave a joint configuration, or
/// enter one: a voter replaced by a node outside or a learner, or a voter demoted to learner
/// (a learner promoted with it), left explicitly later or at once by raft.
pub(super) fn joint_change(sim: &mut MultiSim, rng: &mut ChaCha8Rng, gid: GroupId) -> String {
    let Some((leader, cs)) = leader_conf(sim, gid) else {
        return String::new();
    };
    let cc = if cs.voters_outgoing.is_empty() {
        match enter_joint(sim, rng, leader, &cs) {
            Some(cc) => cc,
            None => return String::new(),
        }
    } else {
        ConfChangeV2::default() // leave the joint configuration
    };
    let desc = format!(
        "group {gid} at {leader}: joint {:?} {:?}",
        cc.get_transition(),
        cc.get_changes()
    );
    match sim.propose_conf_change(gid, leader, cc) {
        Ok(()) => desc,
        Err(e) => format!("{desc} refused: {e}"),
    }
}

fn enter_joint(
    sim: &MultiSim,
    rng: &mut ChaCha8Rng,
    leader: u64,
    cs: &ConfState,
) -> Option<ConfChangeV2> {
    let all = 1..=sim.config().nodes;
    let outside: Vec<u64> = all
        .filter(|n| !cs.voters.contains(n) && !cs.learners.contains(n))
        .collect();
    let others: Vec<u64> = cs.voters.iter().copied().filter(|&v| v != leader).collect();
    let mut pick = |v: &[u64]| (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())]);
    let (out, learner, incoming) = (pick(&others)?, pick(&cs.learners), pick(&outside));
    let mut cc = ConfChangeV2::default();
    let mut push = |ty, node| {
        cc.mut_changes()
            .extend(conf_change(ty, node).take_changes())
    };
    match (incoming.or(learner), rng.gen_range(0..3)) {
        (Some(n), 0 | 1) => {
            push(ConfChangeType::AddNode, n);
            push(ConfChangeType::RemoveNode, out);
        }
        (promote, _) if cs.voters.len() >= 3 => {
            push(ConfChangeType::AddLearnerNode, out);
            if let Some(l) = promote.filter(|l| cs.learners.contains(l)) {
                push(ConfChangeType::AddNode, l);
            }
        }
        _ => return None,
    }
    let transition = [
        ConfChangeTransition::Explicit,
        ConfChangeTransition::Explicit,
        ConfChangeTransition::Implicit,
        ConfChangeTransition::Auto,
    ][rng.gen_range(0..4)];
    cc.set_transition(transition);
    Some(cc)
}

/// A transfer of a quiescent group (its leader asleep, its lease on the node stream): to a
/// voter, or to a node raft ignores (a learner, or the leader itself).
pub(super) fn quiescent_transfer(sim: &mut MultiSim, rng: &mut ChaCha8Rng) -> String {
    let asleep: Vec<(GroupId, u64)> = (1..=sim.config().groups)
        .filter_map(|g| Some((g, sim.leader(g)?)))
        .filter(|&(g, l)| sim.node(l).is_some_and(|m| m.is_quiescent(g)))
        .collect();
    if asleep.is_empty() {
        return String::new();
    }
    let (gid, leader) = asleep[rng.gen_range(0..asleep.len())];
    let to = rng.gen_range(1..=sim.config().nodes);
    sim.transfer_leader(gid, leader, to);
    format!("group {gid} (quiescent): transfer {leader}->{to}")
}

/// Group `gid` is removed from a node (its replica destroyed, or moved away and back): its
/// leader's, a follower fortified to it, or any other. The node hosts it again from its storage
/// at once, within `2P`, or up to `10P` later. While away the replica cannot vote; hosted again
/// while its node still supports the leader it had fortified, it must refuse every other
/// candidate (the fortification outlives the replica), and whatever it led is given up.
pub(super) fn remove_and_readd(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    gid: GroupId,
) -> String {
    let hosts: Vec<u64> = (1..=sim.config().nodes)
        .filter(|&n| sim.hosts(n, gid) && !sim.is_paused(n))
        .collect();
    let leader = sim.leader(gid).filter(|l| hosts.contains(l));
    let node = match (rng.gen_range(0..3), leader) {
        (0, Some(l)) => l,
        (1, Some(l)) => match hosts.iter().copied().find(|&n| n != l) {
            Some(f) => f,
            None => return String::new(),
        },
        _ if !hosts.is_empty() => hosts[rng.gen_range(0..hosts.len())],
        _ => return String::new(),
    };
    assert!(sim.remove_group(node, gid), "node {node} hosts group {gid}");
    let p_ms = sim.max_promise_ms();
    let back_ms = match rng.gen_range(0..3) {
        0 => 0,
        1 => rng.gen_range(1..=2 * p_ms),
        _ => rng.gen_range(2 * p_ms..=10 * p_ms),
    };
    if back_ms == 0 {
        assert!(
            sim.add_group(node, gid),
            "node {node} took group {gid} back"
        );
        return format!("group {gid} removed from {node} and hosted again at once");
    }
    let at = now_ms(sim) + back_ms;
    later.push((at, node, Undo::AddGroup(gid)));
    format!("group {gid} removed from {node}; hosted again at {at}ms")
}
