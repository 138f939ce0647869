//! Scripted fault episodes for the multi-group simulator: sequences too precise for independent
//! random faults to line up, run with seeded timing by the randomized run and as scenario tests.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use raft::eraftpb::MessageType;

use super::{MsgAction, MsgKind, MsgRule, MultiSim};
use crate::multi::GroupId;

fn fortified_to(sim: &MultiSim, node: u64, gid: GroupId) -> Option<u64> {
    sim.node(node)?.group(gid)?.fortified_to()
}

/// An episode starts from a quiet network: no cuts, no slow links, no per-type rules, no loss
/// and no stale copies, and every paused
/// node resumed; then the group settles for up to `P` (its followers fortify again).
pub(super) fn quiet(sim: &mut MultiSim, gid: GroupId) {
    sim.heal();
    sim.net_mut().config = crate::sim::NetConfig::default();
    sim.net_mut().set_stale_copies(0.0, 0);
    for n in 1..=sim.config().nodes {
        if sim.is_paused(n) {
            sim.resume(n);
        }
    }
    let p_ms = sim.config().lease.promise_ms;
    sim.run_until(p_ms, |sim| {
        sim.leader(gid).is_some_and(|r| {
            (1..=sim.config().nodes).all(|n| n == r || fortified_to(sim, n, gid) == Some(r))
        })
    });
}

/// A supporter's withdrawal, sent by its previous incarnation, arrives after its new incarnation
/// supports the same epoch again and re-fortified. Group `gid`,
/// led by `R` with followers `S` and the rest:
/// 1. `R → S` is cut until `S` withdraws `R`'s epoch; then `S`'s answers turn slow (its
///    `Withdrawn` is in flight) and the link comes back;
/// 2. `S` restarts at once (its new incarnation forgot the withdrawal), supports `R` at the same
///    epoch and fortifies again;
/// 3. the others are cut from `R`, and the group's raft messages at `R` stop: `R`'s lease rests
///    on `S` alone, renewed over the node stream;
/// 4. the old `Withdrawn` lands: `R` moves to the next epoch, whose heartbeat tells `S` a later
///    epoch began. `S` must keep the promise it made under the earlier one to its end.
///
/// Returns the leader and what it did, or `None` when the group is not in shape for it (no
/// leader, not three voters, a node down). Leaves the cuts and the mute on: the caller heals
/// and unmutes.
pub fn late_withdrawal(
    sim: &mut MultiSim,
    gid: GroupId,
    rng: &mut ChaCha8Rng,
) -> Option<(u64, String)> {
    let (r, s, x) = three_in_shape(sim, gid)?;
    let p_ms = sim.config().lease.promise_ms;
    sim.block(r, s);
    if !sim.run_until(3 * p_ms, |sim| fortified_to(sim, s, gid).is_none()) {
        return None;
    }
    sim.run_for_ms(rng.gen_range(10..=p_ms / 2));
    sim.slow_link(s, r, rng.gen_range(5..=10) * p_ms * 1_000);
    sim.reconnect(r, s);
    sim.run_for_ms(rng.gen_range(p_ms / 4..=p_ms / 2)); // S answers R's heartbeat: Withdrawn
    sim.slow_link(s, r, 0);
    sim.crash(s);
    sim.restart(s);
    let refortified = |sim: &MultiSim| {
        fortified_to(sim, s, gid) == Some(r) && sim.node(r).is_some_and(|m| m.is_quiescent(gid))
    };
    sim.run_until(6 * p_ms, refortified);
    sim.partition(&[r], &[x]);
    sim.mute_group(gid, r);
    sim.run_for_ms(rng.gen_range(p_ms..=2 * p_ms));
    sim.run_until(10 * p_ms, |sim| fortified_to(sim, s, gid).is_none());
    sim.block(r, s);
    sim.run_for_ms(2 * p_ms);
    let what = format!("group {gid}: late withdrawal from {s}'s earlier incarnation reaches {r}");
    Some((r, what))
}

/// Support comes back to a leader its followers have left: group `gid`'s leader `R` is cut from
/// both followers (and the group's raft messages at `R` stop, so `R` keeps believing it leads),
/// they withdraw `R`'s epoch and elect one of themselves; then `R → S` comes back. `S` must
/// answer `R`'s heartbeat with the withdrawal, never support that epoch again: if it did, `R`
/// would count `S`'s old fortification and hold a lease beside the new leader.
///
/// Returns the old leader and what it did, or `None` when the group is not in shape for it.
/// Leaves the cuts and the mute on: the caller heals and unmutes.
pub fn resumed_support(
    sim: &mut MultiSim,
    gid: GroupId,
    rng: &mut ChaCha8Rng,
) -> Option<(u64, String)> {
    let (r, s, x) = three_in_shape(sim, gid)?;
    let p_ms = sim.config().lease.promise_ms;
    sim.mute_group(gid, r);
    sim.partition(&[r], &[x]);
    sim.block(r, s);
    let moved = |sim: &MultiSim| sim.leader(gid).is_some_and(|l| l != r);
    sim.run_until(10 * p_ms, moved);
    sim.run_for_ms(rng.gen_range(0..=p_ms));
    sim.reconnect(r, s);
    sim.run_for_ms(rng.gen_range(p_ms..=3 * p_ms));
    Some((
        r,
        format!("group {gid}: support from {s} resumes to deposed leader {r}"),
    ))
}

/// Group `gid`'s leader `R` hands it to a follower and wins it back at once, with every epoch
/// unchanged: in its new term it must count only the fortifications made for that term (each
/// follower's replica made one for the term between).
pub fn transfer_round_trip(
    sim: &mut MultiSim,
    gid: GroupId,
    rng: &mut ChaCha8Rng,
) -> Option<(u64, String)> {
    quiet(sim, gid);
    let r = sim.leader(gid)?;
    let voters = voters_of(sim, r, gid)?;
    let others: Vec<u64> = voters.voters.iter().copied().filter(|&v| v != r).collect();
    let x = *others.get(rng.gen_range(0..others.len().max(1)))?;
    let p_ms = sim.config().lease.promise_ms;
    sim.transfer_leader(gid, r, x);
    if !sim.run_until(10 * p_ms, |sim| sim.leader(gid) == Some(x)) {
        return None;
    }
    sim.run_for_ms(rng.gen_range(0..=5 * p_ms));
    sim.transfer_leader(gid, x, r);
    sim.run_until(10 * p_ms, |sim| sim.leader(gid) == Some(r));
    sim.run_for_ms(rng.gen_range(p_ms..=3 * p_ms));
    Some((
        r,
        format!("group {gid}: {r} hands leadership to {x} and wins it back"),
    ))
}

/// Followers that fall ahead: group `gid`'s leader `R`, asleep (quiescent, its lease on the
/// node stream), is cut off, and its followers campaign: the followers `S` (one fewer than a
/// quorum) and the others `X`. The `X`s' pre-votes win (the `S`s grant them), but their votes
/// are lost on the way to the `S`s, so they stand again and again, each time in a later term;
/// their answers to the `S`s are lost meanwhile, so the `S`s' own pre-votes never win. Once an
/// `X` is two terms ahead, the `X`s' answers to the `S`s are held for `2P`–`6P` instead, and a
/// little later (the `S`s campaign again meanwhile, the `X`s reject them) `R` and the `S`s are
/// connected again: the `S`s, still in `R`'s term, follow `R` and fortify, and the held answers
/// arrive, rejections of the `S`s' pre-votes among them, each with a later term than the one
/// the `S`s are fortified at. They must keep refusing while their nodes support `R` (MULTI.md,
/// the first hazard): `R`'s lease rests on them, and the `X`s are cut from `R`, not from them.
///
/// Needs pre-vote on the `S`s (a campaign must not move their term). Returns the leader and
/// what it did, or `None` when the group is not in shape for it. Leaves the cuts and the rules
/// on: the caller heals.
pub fn answer_from_a_later_term(
    sim: &mut MultiSim,
    gid: GroupId,
    rng: &mut ChaCha8Rng,
) -> Option<(u64, String)> {
    let (r, s, x) = split_for_a_later_term(sim, gid)?;
    let p_ms = sim.max_promise_ms();
    if !sim.run_until(5 * p_ms, |sim| {
        sim.node(r).is_some_and(|m| m.is_quiescent(gid))
    }) {
        return None; // awake, check-quorum would step it down while cut off
    }
    let until_ns = sim.now_ns() + 30 * p_ms * 1_000_000;
    let rules = |kind, action| {
        let pairs = x
            .iter()
            .flat_map(|&from| s.iter().map(move |&to| (from, to)));
        pairs
            .map(|(from, to)| MsgRule {
                from: Some(from),
                to: Some(to),
                kind: MsgKind::Raft(kind),
                action,
                until_ns,
            })
            .collect::<Vec<_>>()
    };
    let answers = [
        MessageType::MsgRequestPreVoteResponse,
        MessageType::MsgRequestVoteResponse,
    ];
    let set = |sim: &mut MultiSim, answered: MsgAction| {
        sim.net_mut().clear_rules();
        let votes = rules(MessageType::MsgRequestVote, MsgAction::Drop);
        let held = answers.iter().flat_map(|&a| rules(a, answered));
        votes
            .into_iter()
            .chain(held)
            .for_each(|rule| sim.net_mut().add_rule(rule));
    };
    set(sim, MsgAction::Drop);
    let others: Vec<u64> = (1..=sim.config().nodes).filter(|&n| n != r).collect();
    sim.partition(&[r], &others);
    let term = |sim: &MultiSim, n: u64| {
        sim.node(n)
            .and_then(|m| m.group(gid))
            .map(|g| g.raw().raft.term)
    };
    let t = term(sim, r)?;
    let ahead = |sim: &MultiSim| {
        x.iter().any(|&n| term(sim, n) > Some(t + 1)) && s.iter().all(|&n| term(sim, n) == Some(t))
    };
    if !sim.run_until(6 * p_ms, ahead) {
        return None;
    }
    let held = MsgAction::Hold {
        min_extra_us: 2 * p_ms * 1_000,
        max_extra_us: 6 * p_ms * 1_000,
    };
    set(sim, held);
    sim.run_for_ms(rng.gen_range(p_ms..=2 * p_ms)); // the Ss campaign again: the Xs reject them
    s.iter().for_each(|&n| sim.reconnect(r, n));
    let fortified = |sim: &MultiSim| s.iter().all(|&n| fortified_to(sim, n, gid) == Some(r));
    sim.run_until(3 * p_ms, fortified);
    sim.run_for_ms(6 * p_ms);
    let what = format!(
        "group {gid}: {x:?} fall ahead while {r} is cut off; {s:?}, fortified again, get \
         their held answers"
    );
    Some((r, what))
}

/// Replicas moved away and back: every follower of group `gid`'s leader `R`, fortified to it,
/// has the group removed and hosted again from its storage (at once, or up to `P` later),
/// while `R`, quiescent, keeps its lease on the node stream; then the group's raft messages at
/// `R` stop for `2P`–`6P`. The followers' nodes still support `R` at the same epoch, so `R`
/// counts the fortifications their removed replicas made: the replicas hosted again must refuse
/// each other's votes until that support ends, or `R`'s lease overlaps the next leader's.
///
/// Returns the leader and what it did, or `None` when the group is not in shape for it (no
/// leader, joint, a follower down or unfortified, `R` awake). Leaves the mute on: the caller
/// unmutes.
pub fn moved_away_and_back(
    sim: &mut MultiSim,
    gid: GroupId,
    rng: &mut ChaCha8Rng,
) -> Option<(u64, String)> {
    quiet(sim, gid);
    let r = sim.leader(gid)?;
    let cs = voters_of(sim, r, gid)?;
    let followers: Vec<u64> = cs.voters.iter().copied().filter(|&v| v != r).collect();
    let fortified = followers
        .iter()
        .all(|&f| fortified_to(sim, f, gid) == Some(r));
    if !cs.voters_outgoing.is_empty() || followers.is_empty() || !fortified {
        return None;
    }
    let p_ms = sim.max_promise_ms();
    if !sim.run_until(5 * p_ms, |sim| {
        sim.node(r).is_some_and(|m| m.is_quiescent(gid))
    }) {
        return None;
    }
    for &f in &followers {
        assert!(sim.remove_group(f, gid), "{f} hosts group {gid}");
    }
    let away_ms = rng.gen_range(0..=p_ms);
    sim.run_for_ms(away_ms);
    for &f in &followers {
        sim.add_group(f, gid);
    }
    sim.mute_group(gid, r);
    sim.run_for_ms(rng.gen_range(2 * p_ms..=6 * p_ms));
    let what = format!(
        "group {gid}: {followers:?} moved away for {away_ms}ms and back while {r} leads; \
         then {r}'s raft messages stop"
    );
    Some((r, what))
}

/// After [`quiet`]: group `gid`'s leader `R`, the `S`s (a quorum with `R`, the first of its
/// followers) and the `X`s (the rest), when the configuration is not joint, every voter is up,
/// there is an `X`, and every `S` runs with pre-vote; else `None`.
fn split_for_a_later_term(sim: &mut MultiSim, gid: GroupId) -> Option<(u64, Vec<u64>, Vec<u64>)> {
    quiet(sim, gid);
    let r = sim.leader(gid)?;
    let cs = voters_of(sim, r, gid)?;
    let others: Vec<u64> = cs.voters.iter().copied().filter(|&v| v != r).collect();
    let quorum = cs.voters.len() / 2 + 1;
    let (s, x) = others.split_at(quorum - 1);
    let c = sim.config();
    let pre_votes = |n: &u64| c.pre_vote && !c.no_pre_vote_nodes.contains(n);
    let up = others.iter().all(|&n| sim.is_up(n));
    if !cs.voters_outgoing.is_empty() || x.is_empty() || !up || !s.iter().all(pre_votes) {
        return None;
    }
    Some((r, s.to_vec(), x.to_vec()))
}

/// After [`quiet`]: group `gid`'s leader `R` and its two followers `(S, X)`, when the group has
/// exactly three voters (not joint), all up, and `S` fortified to `R`; else `None`.
fn three_in_shape(sim: &mut MultiSim, gid: GroupId) -> Option<(u64, u64, u64)> {
    quiet(sim, gid);
    let r = sim.leader(gid)?;
    let voters = voters_of(sim, r, gid)?;
    if voters.voters.len() != 3 || !voters.voters_outgoing.is_empty() {
        return None;
    }
    let others: Vec<u64> = voters.voters.iter().copied().filter(|&v| v != r).collect();
    let (s, x) = (others[0], others[1]);
    if !sim.is_up(s) || !sim.is_up(x) || fortified_to(sim, s, gid) != Some(r) {
        return None;
    }
    Some((r, s, x))
}

/// Group `gid`'s configuration as node `n` sees it.
fn voters_of(sim: &MultiSim, n: u64, gid: GroupId) -> Option<raft::eraftpb::ConfState> {
    Some(
        sim.node(n)?
            .group(gid)?
            .raw()
            .raft
            .prs()
            .conf()
            .to_conf_state(),
    )
}
