//! After every fault has healed, with follower read leases: a leader lost for good just as its
//! membership change commits, and the check that every live voter holds a read lease again.
//!
//! raft-rs refuses to campaign while a committed configuration change is not applied, and a
//! replica applies only up to the exposed index `E`. A change committed while a read lease lives
//! can leave the replica that knows it committed unable to apply it, and so to campaign, once
//! its leader is gone, while the one that lacks it cannot win (`conf_with_grants`, and
//! `tests/follower_conf.rs`). Here the remaining voters, a majority, must elect all the same.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::sim::scenarios::conf_change;
use crate::sim::{DelayRule, SimCluster};
use raft::eraftpb::{ConfChangeType, MessageType};

/// The leader's appends to one follower come late (a holder that acknowledges writes late);
/// the leader proposes a membership change that changes nothing (again every millisecond while
/// it is refused for live read leases) and is crashed, never to be restarted, as soon as
/// another voter knows the change is committed. `None`: no leader of three voters or more
/// (outside a joint configuration) to lose. Returns what it did.
pub(super) fn lose_leader_after_change(
    sim: &mut SimCluster,
    rng: &mut ChaCha8Rng,
) -> Option<String> {
    if !sim.run_until(3_000, |s| s.leader().is_some()) {
        return None;
    }
    let leader = sim.leader()?;
    let raft = &sim.node(leader)?.raw().raft;
    if raft.pending_conf_index > raft.raft_log.applied {
        return None; // a change still pending: the no-op could be dropped and a voter lost
    }
    let conf = sim.conf_state(leader)?;
    let others: Vec<u64> = conf
        .voters
        .iter()
        .copied()
        .filter(|&v| v != leader)
        .collect();
    if !conf.voters_outgoing.is_empty() || others.len() < 2 || others.len() == conf.voters.len() {
        return None;
    }
    let slow = others[rng.gen_range(0..others.len())];
    let extra_ms = rng.gen_range(1..=5);
    sim.net_mut().delay(DelayRule {
        from: Some(leader),
        to: Some(slow),
        msg_type: Some(MessageType::MsgAppend),
        extra_ns: extra_ms * 1_000_000,
    });
    let change = || conf_change(ConfChangeType::AddNode, leader); // already a voter
    let proposed_at_ms = (0..2_000).position(|_| {
        let accepted = sim.propose_conf_change(leader, change()).is_ok();
        if !accepted {
            sim.run_for_ms(1);
        }
        accepted
    });
    let index = sim.node(leader)?.raw().raft.raft_log.last_index();
    let knows = |s: &SimCluster| {
        let committed = |id| s.node(id).map_or(0, |n| n.raw().raft.raft_log.committed);
        others
            .iter()
            .any(|&id| id != slow && committed(id) >= index)
    };
    let committed = proposed_at_ms.is_some() && sim.run_until(1_000, knows);
    sim.crash(leader);
    sim.net_mut().clear_delays();
    Some(format!(
        "appends {leader}->{slow} +{extra_ms}ms; a no-op membership change at {leader} \
         accepted after {proposed_at_ms:?} ms, committed at another voter: {committed}; \
         {leader} lost for good"
    ))
}

/// Once the cluster serves again: the ms until every live voter of the leader's configuration
/// has held a read lease (the leader counts itself), or `Err` if not within `bound_ms`. Each
/// voter counts once it has held one, not all at the same instant: with a lease little longer
/// than a heartbeat round, grants last only between rounds.
pub(super) fn read_leases_again(sim: &mut SimCluster, bound_ms: u64) -> Result<u64, String> {
    let start_ns = sim.now_ns();
    let mut held = std::collections::BTreeSet::<u64>::new();
    let all_held = |s: &SimCluster| {
        let Some(leader) = s.leader() else {
            return false;
        };
        let voters = s.conf_state(leader).map_or_else(Vec::new, |c| c.voters);
        let live: Vec<u64> = voters
            .into_iter()
            .filter(|&v| v != leader && s.is_up(v))
            .collect();
        let holding = live
            .iter()
            .filter(|&&v| s.node(v).is_some_and(|n| n.holds_read_lease()));
        held.extend(holding);
        live.iter().all(|v| held.contains(v))
    };
    match sim.run_until(bound_ms, all_held) {
        true => Ok((sim.now_ns() - start_ns).div_ceil(1_000_000)),
        false => Err(format!(
            "a live voter held no read lease in {bound_ms} ms after the cluster served again\n{}",
            sim.describe()
        )),
    }
}
