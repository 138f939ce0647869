//! Faults of the randomized multi-group run beyond whole links and whole nodes: single messages
//! held, delayed, duplicated or dropped by type inside node batches, rolling changes of a node's
//! promise, the loss or stall of the node that leads the most groups, joint membership changes
//! and transfers of quiescent groups.

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
    let (was_ms, promise_ms) = (sim.promise_ms(node), PROMISES_MS[rng.gen_range(0..6)]);
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
    /// Each group it led, and how long it took to be led again with a lease (ms), if it was.
    pub groups: Vec<(GroupId, Option<u64>)>,
    /// The groups among them whose other voters are no quorum: led again only once it is back.
    pub needed: Vec<GroupId>,
}

impl Failover {
    /// Read from the simulation how long each group took.
    pub(super) fn measure(&mut self, sim: &MultiSim) {
        for (gid, took) in self.groups.iter_mut() {
            let again = sim.leased_again_ns(*gid, self.at_ns);
            *took = again.map(|t| (t - self.at_ns) / 1_000_000);
        }
    }

    /// The slowest group whose other voters are a quorum, or one never led again: `(group,
    /// ms)`, `None` ms for never.
    pub fn slowest(&self) -> Option<(GroupId, Option<u64>)> {
        let others = self.groups.iter().filter(|(g, _)| !self.needed.contains(g));
        let never = others.clone().find(|(_, t)| t.is_none());
        never.or_else(|| others.max_by_key(|(_, t)| *t)).copied()
    }
}

/// Mass failover: the node that leads the most groups crashes, and comes back after up to `10P`.
pub(super) fn mass_failover(
    sim: &mut MultiSim,
    rng: &mut ChaCha8Rng,
    later: &mut Later,
    watched: &mut Vec<Failover>,
) -> String {
    let up = (1..=sim.config().nodes).filter(|&n| sim.is_up(n) && !sim.is_paused(n));
    let most = up
        .map(|n| (led_by(sim, n), n))
        .max_by_key(|(g, n)| (g.len(), *n));
    let Some((groups, node)) = most.filter(|(g, _)| !g.is_empty()) else {
        return String::new();
    };
    let needed: Vec<GroupId> = groups
        .iter()
        .copied()
        .filter(|&g| leader_conf(sim, g).is_some_and(|(_, cs)| !quorum_without(&cs, node)))
        .collect();
    watched.push(Failover {
        at_ns: sim.now_ns(),
        node,
        groups: groups.iter().map(|&g| (g, None)).collect(),
        needed: needed.clone(),
    });
    sim.crash(node);
    let p_ms = sim.max_promise_ms();
    let at = now_ms(sim) + rng.gen_range(p_ms..=10 * p_ms);
    later.push((at, node, Undo::Restart));
    format!(
        "mass failover: {node}, leader of groups {groups:?} ({needed:?} need it for a quorum), \
         crashes; restarts at {at}ms"
    )
}

/// The node that leads the most groups stalls (a GC pause, a stopped VM) for `P` to `5P`: its
/// clock runs on, and every lease it holds must end before another leader's begins, in every
/// group at once, each lease resting on promises its followers made with their own settings.
pub(super) fn mass_stall(sim: &mut MultiSim, rng: &mut ChaCha8Rng, later: &mut Later) -> String {
    let up = (1..=sim.config().nodes).filter(|&n| sim.is_up(n) && !sim.is_paused(n));
    let most = up
        .map(|n| (led_by(sim, n), n))
        .max_by_key(|(g, n)| (g.len(), *n));
    let Some((groups, node)) = most.filter(|(g, _)| !g.is_empty()) else {
        return String::new();
    };
    sim.pause(node);
    let p_ms = sim.max_promise_ms();
    let until = now_ms(sim) + rng.gen_range(p_ms..=5 * p_ms);
    later.push((until, node, Undo::Resume));
    format!("mass stall: {node}, leader of groups {groups:?}, paused until {until}ms")
}

/// Whether the voters of `cs` but `node` are a quorum (of both halves when joint).
fn quorum_without(cs: &ConfState, node: u64) -> bool {
    let majority = |voters: &[u64]| {
        voters.is_empty() || 2 * voters.iter().filter(|&&v| v != node).count() > voters.len()
    };
    majority(&cs.voters) && majority(&cs.voters_outgoing)
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
