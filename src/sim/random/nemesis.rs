//! The nemesis of the randomized simulation: the faults it draws, and when each ends.

use raft::eraftpb::{ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState, MessageType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sim::scenarios::conf_change;
use crate::sim::{DelayRule, NetConfig, SimCluster, SimConfig};

/// A fault that ends by itself later.
#[derive(Debug, Clone, Copy)]
enum Later {
    Resume(u64),
    Restart(u64),
    Stall(u64),
    Unstall(u64),
    Block(u64, u64),
    /// Every message from the first node to the second is held up this many ms more.
    Hold(u64, u64, u64),
    Isolate(u64),
    /// A membership change refused while follower read leases lived, proposed again (a new
    /// random one): the holders were asked to give theirs up, so it usually goes.
    Membership,
    /// A membership change that changes nothing, proposed at the node if it leads: refused
    /// while read leases live, it asks their holders to give them up.
    AskGiveUps(u64),
}

/// Chooses and applies faults. All its choices come from its seeded generator.
pub(super) struct Nemesis {
    pub(super) rng: ChaCha8Rng,
    /// The draws of the faults that exercise give-ups, from a generator of their own, so that
    /// every other draw of the seed stays as it was before them.
    give_up_rng: ChaCha8Rng,
    /// Whether a flaky leader's slow followers are slow in everything they send it after the
    /// cut, from a generator of its own for the same reason.
    hold_rng: ChaCha8Rng,
    /// Faults to undo, with the simulated millisecond at which to undo them.
    later: Vec<(u64, Later)>,
    /// The promise `P` and election timeout, in ms, to scale pauses and delays.
    promise_ms: u64,
    election_ms: u64,
    /// An episode (a composite fault) runs undisturbed until this simulated millisecond: no
    /// other fault starts, and clients read through ReadIndex rounds.
    pub(super) episode_until_ms: u64,
    /// Clients do not write during the episode (a node leaving takes no new work).
    pub(super) episode_without_writes: bool,
    /// The nodes the writing clients reach during the episode (`None`: every node).
    pub(super) episode_writes_at: Option<Vec<u64>>,
    /// The longest follower read lease a grant may give (`G`), in ms; 0 when they are off.
    grant_ms: u64,
    /// Clients write every 0.5 ms until this simulated millisecond (a fault that needs appends
    /// in flight at every instant).
    pub(super) busy_until_ms: u64,
    /// No other fault starts until this simulated millisecond, but reads go on in every mode
    /// (unlike an episode's): a fault whose hazard is a stale local read, left undisturbed.
    pub(super) calm_until_ms: u64,
}

impl Nemesis {
    /// The nemesis of `seed`, drawing from `rng`, for a cluster of `config`.
    pub(super) fn new(seed: u64, rng: ChaCha8Rng, config: &SimConfig) -> Self {
        Nemesis {
            rng,
            give_up_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x61_7e_0f),
            hold_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x401d),
            later: Vec::new(),
            promise_ms: config.lease.promise_ms,
            election_ms: config.election_tick as u64 * config.tick_ms,
            episode_until_ms: 0,
            episode_without_writes: false,
            episode_writes_at: None,
            busy_until_ms: 0,
            calm_until_ms: 0,
            grant_ms: config.lease.follower_leases.map_or(0, |f| f.max_grant_ms),
        }
    }

    /// Follower read leases are on: half the membership changes give way to slow appends (see
    /// [`Nemesis::slow_appends`]), and a split with the leader in a minority is drawn too.
    fn follower_leases(&self) -> bool {
        self.grant_ms > 0
    }

    /// Undo the faults due, and make the changes due; returns what the changes were.
    pub(super) fn undo_due(&mut self, sim: &mut SimCluster) -> Vec<String> {
        let now_ms = sim.now_ns() / 1_000_000;
        let (due, rest): (Vec<_>, Vec<_>) = self.later.drain(..).partition(|(at, _)| *at <= now_ms);
        self.later = rest;
        let mut made = Vec::new();
        for (_, undo) in due {
            match undo {
                Later::Membership if now_ms < self.episode_until_ms => {
                    self.later.push((self.episode_until_ms, Later::Membership));
                    // undisturbed
                }
                Later::Membership => {
                    made.push(format!("{now_ms}ms again: {}", self.membership(sim)));
                }
                Later::AskGiveUps(leader) if sim.leader() == Some(leader) => {
                    let voter = conf_change(ConfChangeType::AddNode, leader); // already one
                    let r = sim
                        .propose_conf_change(leader, voter)
                        .map_err(|e| e.to_string());
                    made.push(format!("{now_ms}ms no-op membership at {leader}: {r:?}"));
                }
                Later::Resume(n) if sim.is_paused(n) => sim.resume(n),
                Later::Restart(n) if !sim.is_up(n) => sim.restart(n),
                Later::Stall(n) => sim.stall_ticks(n, true),
                Later::Unstall(n) => sim.stall_ticks(n, false),
                Later::Block(from, to) => sim.block(from, to),
                Later::Hold(from, to, extra_ms) => sim.net_mut().delay(DelayRule {
                    from: Some(from),
                    to: Some(to),
                    msg_type: None,
                    extra_ns: extra_ms * 1_000_000,
                }),
                Later::Isolate(n) => {
                    let rest = crate::sim::scenarios::others(sim, n);
                    sim.partition(&[n], &rest);
                }
                _ => {}
            }
        }
        made
    }

    fn pick(&mut self, ids: &[u64]) -> u64 {
        ids[self.rng.gen_range(0..ids.len())]
    }

    /// Later than now by `lo..=hi` ms.
    fn after(&mut self, sim: &SimCluster, lo: u64, hi: u64) -> u64 {
        sim.now_ns() / 1_000_000 + self.rng.gen_range(lo..=hi.max(lo))
    }

    /// [`Nemesis::after`], drawn from the give-up faults' generator.
    fn give_up_after(&mut self, sim: &SimCluster, lo: u64, hi: u64) -> u64 {
        sim.now_ns() / 1_000_000 + self.give_up_rng.gen_range(lo..=hi.max(lo))
    }

    /// Inject one random fault; returns its description (empty when none applied).
    pub(super) fn inject(&mut self, sim: &mut SimCluster) -> String {
        let ids = sim.ids();
        let node = self.pick(&ids);
        let (p, e) = (self.promise_ms, self.election_ms);
        match self.rng.gen_range(0..15) {
            0 => {
                let rest: Vec<u64> = ids.iter().copied().filter(|&i| i != node).collect();
                sim.partition(&[node], &rest);
                format!("isolate {node}")
            }
            1 => {
                let to = self.pick(&ids);
                sim.block(node, to);
                format!("block {node}->{to}")
            }
            2 => {
                sim.heal();
                "heal".into()
            }
            3 => self.pause(sim, node, p / 2, 4 * e),
            4 => self.crash(sim, node),
            5 => {
                let stalled = self.rng.gen_bool(0.5);
                sim.stall_ticks(node, stalled);
                format!("stall ticks {node}: {stalled}")
            }
            6 => self.net(sim),
            7 => self.transfer(sim, node),
            8 => {
                let rho = sim.config().lease.drift_ppm as i64;
                let ppm = match sim.config().drift_ppm.iter().map(|d| d.abs()).max() {
                    Some(d) if d > rho => self.rng.gen_range(-d..=d), // the drift control
                    _ => self.rng.gen_range(-rho..=rho),
                };
                sim.clock(node).set_drift_ppm(ppm);
                format!("drift {node} {ppm}ppm")
            }
            9 => self.delay(sim, &ids),
            10 if self.follower_leases() && self.rng.gen_bool(0.5) => self.slow_appends(sim),
            11 | 13 if self.follower_leases() => self.split_leader_minority(sim),
            10 | 11 => self.membership(sim),
            12 | 13 => self.flaky_leader(sim),
            _ => {
                sim.net_mut().clear_delays();
                "clear delays".into()
            }
        }
    }

    fn pause(&mut self, sim: &mut SimCluster, node: u64, lo_ms: u64, hi_ms: u64) -> String {
        if !sim.is_up(node) || sim.is_paused(node) {
            return String::new();
        }
        sim.pause(node);
        let until = self.after(sim, lo_ms.max(1), hi_ms);
        self.later.push((until, Later::Resume(node)));
        format!("pause {node} until {until}ms")
    }

    fn crash(&mut self, sim: &mut SimCluster, node: u64) -> String {
        if !sim.is_up(node) {
            return String::new();
        }
        sim.crash(node);
        if self.rng.gen_bool(0.5) {
            sim.restart(node);
            return format!("crash+restart {node}");
        }
        let at = self.after(sim, self.promise_ms / 2, 3 * self.promise_ms);
        self.later.push((at, Later::Restart(node)));
        format!("crash {node}, restart at {at}ms")
    }

    fn net(&mut self, sim: &mut SimCluster) -> String {
        let hi =
            (sim.config().heartbeat_tick as u64 * sim.config().tick_ms * 1_000).clamp(200, 5_000);
        let max_delay_us = self.rng.gen_range(100..=hi);
        let net = NetConfig {
            min_delay_us: self.rng.gen_range(50..=max_delay_us),
            max_delay_us,
            loss: self.rng.gen_range(0.0..0.1),
            duplicate: self.rng.gen_range(0.0..0.05),
        };
        let desc = format!("net {net:?}");
        sim.net_mut().config = net;
        desc
    }

    /// A leadership transfer; sometimes the old leader is paused right after it.
    fn transfer(&mut self, sim: &mut SimCluster, to: u64) -> String {
        let Some(leader) = sim.leader().filter(|&l| l != to) else {
            return String::new();
        };
        let mut slowed = String::new();
        if self.follower_leases() && self.rng.gen_bool(0.5) {
            slowed = self.slow_holder_before_transfer(sim, leader, to);
        }
        sim.transfer_leader(leader, to);
        if !slowed.is_empty() {
            return format!("transfer {leader}->{to} with {slowed}");
        }
        if self.rng.gen_bool(0.3) {
            let (p, e) = (self.promise_ms, self.election_ms);
            return format!(
                "transfer {leader}->{to}, then {}",
                self.pause(sim, leader, p, 2 * e)
            );
        }
        format!("transfer {leader}->{to}")
    }

    /// Before a transfer from `leader` to `to`, the link from `to` to another follower becomes
    /// slow (every message, by up to `P`): that follower holds a read lease the transfer must
    /// wait out, and hears of the new leader's writes, and of its exposed index, late.
    fn slow_holder_before_transfer(
        &mut self,
        sim: &mut SimCluster,
        leader: u64,
        to: u64,
    ) -> String {
        let others: Vec<u64> = sim
            .ids()
            .into_iter()
            .filter(|&i| i != leader && i != to)
            .collect();
        if others.is_empty() {
            return String::new();
        }
        let slow = self.pick(&others);
        let extra_ms = self.rng.gen_range(1..=self.promise_ms.max(1));
        sim.net_mut().delay(DelayRule {
            from: Some(to),
            to: Some(slow),
            msg_type: None,
            extra_ns: extra_ms * 1_000_000,
        });
        format!("link {to}->{slow} +{extra_ms}ms")
    }

    /// An extra delay, up to twice `P`, on one link, one message type, or one type on one link.
    fn delay(&mut self, sim: &mut SimCluster, ids: &[u64]) -> String {
        const TYPES: [MessageType; 5] = [
            MessageType::MsgHeartbeat,
            MessageType::MsgHeartbeatResponse,
            MessageType::MsgAppend,
            MessageType::MsgAppendResponse,
            MessageType::MsgTimeoutNow,
        ];
        let (from, to) = (self.pick(ids), self.pick(ids));
        let msg_type = TYPES[self.rng.gen_range(0..TYPES.len())];
        let rule = match self.rng.gen_range(0..3) {
            0 => DelayRule {
                from: Some(from),
                to: Some(to),
                msg_type: None,
                extra_ns: 0,
            },
            1 => DelayRule {
                from: None,
                to: None,
                msg_type: Some(msg_type),
                extra_ns: 0,
            },
            _ => DelayRule {
                from: Some(from),
                to: Some(to),
                msg_type: Some(msg_type),
                extra_ns: 0,
            },
        };
        let extra_ms = self.rng.gen_range(0..=2 * self.promise_ms);
        sim.net_mut().delay(DelayRule {
            extra_ns: extra_ms * 1_000_000,
            ..rule
        });
        format!("delay {rule:?} by {extra_ms}ms")
    }

    /// Appends to one follower take longer, by up to `P`, whoever sends them: it acknowledges
    /// heartbeats at once but receives each write late (a slow read-lease holder). With
    /// [`Nemesis::split_leader_minority`], it replaces membership changes when follower read
    /// leases are on: raft-rs refuses to
    /// campaign while a committed configuration change is not applied, and applies wait for the
    /// exposed index, which a node that restarted knows only once a leader tells it: no node
    /// may then be able to win an election (docs/follower.md, "A liveness hole").
    fn slow_appends(&mut self, sim: &mut SimCluster) -> String {
        let Some(leader) = sim.leader() else {
            return String::new();
        };
        let followers: Vec<u64> = sim.ids().into_iter().filter(|&i| i != leader).collect();
        let slow = self.pick(&followers);
        if self.give_up_rng.gen_bool(0.5) {
            return self.give_up_race(sim, leader, slow);
        }
        let extra_ms = self.rng.gen_range(1..=self.promise_ms.max(1));
        slow_appends_to(sim, slow, extra_ms);
        format!("slow appends to {slow} +{extra_ms}ms")
    }

    /// Under writes every 0.5 ms, the leader's appends to `slow` come late (by up to half a
    /// grant), with the grants they carry; then the leader is asked for a membership change
    /// and asks its holders to give their read leases up. The heartbeat that asks overtakes the
    /// grants on their way, and the leader, once the holders have given up, exposes writes that
    /// `slow` receives only later: a holder that took such a grant (`accept_voided_grants`)
    /// serves them stale. Undisturbed by other faults, reads in every mode.
    fn give_up_race(&mut self, sim: &mut SimCluster, leader: u64, slow: u64) -> String {
        let g = self.grant_ms.max(1);
        let extra_ms = self.give_up_rng.gen_range((g / 8).max(2)..=(g / 2).max(3));
        sim.net_mut().delay(DelayRule {
            from: Some(leader),
            to: Some(slow),
            msg_type: Some(MessageType::MsgAppend),
            extra_ns: extra_ms * 1_000_000,
        });
        let ask_at = self.give_up_after(sim, extra_ms, extra_ms + g);
        self.later.push((ask_at, Later::AskGiveUps(leader)));
        self.busy_until_ms = ask_at + 2 * g;
        self.calm_until_ms = ask_at + 2 * g;
        format!("appends {leader}->{slow} +{extra_ms}ms under writes, give-ups asked at {ask_at}ms")
    }

    /// The leader and fewer than half the other nodes on one side (one at least, when there are
    /// three others or more), the rest on the other, as an undisturbed episode: the leader's side
    /// keeps talking (its followers keep acknowledging it, and it keeps granting them read leases
    /// while its own lease runs out) while the other side elects a leader of its own. Either
    /// appends to the followers on the leader's side are slow (`P` to `2P`), so that what the old
    /// leader takes after the split reaches them late; or the writing clients are cut off with the
    /// other side, so that the old leader takes nothing and its followers have nothing pending
    /// when the new leader's writes are exposed (a read lease that outlives the old leader's own
    /// lease is then read from).
    fn split_leader_minority(&mut self, sim: &mut SimCluster) -> String {
        let Some(leader) = sim.leader() else {
            return String::new();
        };
        let voters = sim.conf_state(leader).map_or_else(Vec::new, |c| c.voters);
        let mut rest: Vec<u64> = sim.ids().into_iter().filter(|&i| i != leader).collect();
        // The leader's side takes voters (only a voter holds a read lease): fewer than half.
        let mut others: Vec<u64> = voters.iter().copied().filter(|&v| v != leader).collect();
        let most = others.len().saturating_sub(1) / 2;
        let with_leader = self.rng.gen_range(most.min(1)..=most);
        let mut side = vec![leader];
        for _ in 0..with_leader {
            let v = others.remove(self.rng.gen_range(0..others.len()));
            rest.retain(|&id| id != v);
            side.push(v);
        }
        let slow_ms = self
            .rng
            .gen_range(self.promise_ms.max(1)..=2 * self.promise_ms.max(1));
        let clients_with_rest = side.len() > 1 && self.rng.gen_bool(0.5);
        if !clients_with_rest {
            for &f in &side[1..] {
                slow_appends_to(sim, f, slow_ms);
            }
        } else {
            self.campaign_once_free(sim, &voters, &rest);
        }
        sim.partition(&side, &rest);
        self.episode_until_ms = self.after(sim, 2 * self.election_ms, 3 * self.election_ms);
        self.episode_without_writes = false;
        self.episode_writes_at = clients_with_rest.then(|| rest.clone());
        match clients_with_rest {
            true => format!("split {side:?} | {rest:?}, clients with {rest:?}"),
            false => {
                format!("split {side:?} | {rest:?}, appends to the leader's side +{slow_ms}ms")
            }
        }
    }

    /// A voter of `rest` tries to campaign every 5 ms from `P` to `G` past the election timeout
    /// from now (an election timer that fires as early as the promise and raft's own check
    /// allow): the other side of a split elects as soon as it may, while a read lease the old
    /// leader granted past its own lease would still be live.
    fn campaign_once_free(&mut self, sim: &mut SimCluster, voters: &[u64], rest: &[u64]) {
        let rest: Vec<u64> = rest
            .iter()
            .copied()
            .filter(|id| voters.contains(id))
            .collect();
        if rest.is_empty() {
            return;
        }
        let node = self.pick(&rest);
        let now_ns = sim.now_ns();
        let last_ms = self.promise_ms.max(self.election_ms) + self.grant_ms;
        // A try restarts a pre-vote under way: leave it a round trip (4 ms at most) first.
        for at_ms in (self.promise_ms..=last_ms).step_by(5) {
            sim.campaign_at(node, now_ns + at_ms * 1_000_000);
        }
    }

    /// A flaky leader, as an undisturbed episode: the heartbeat responses of just enough
    /// followers for a quorum are slow (sometimes duplicated), the leader is cut off from every
    /// other node, its ticker may stall, and a moment later those followers may stop hearing it
    /// (and may then be heard late: [`Nemesis::hold_after_cut`]).
    fn flaky_leader(&mut self, sim: &mut SimCluster) -> String {
        let Some(leader) = sim.leader() else {
            return String::new();
        };
        let Some(conf) = sim.conf_state(leader) else {
            return String::new();
        };
        let (p, e) = (self.promise_ms, self.election_ms);
        let heartbeat_ms = sim.config().heartbeat_tick as u64 * sim.config().tick_ms;
        let mut followers: Vec<u64> = conf
            .voters
            .iter()
            .copied()
            .filter(|&v| v != leader)
            .collect();
        let keep = (conf.voters.len() / 2).min(followers.len());
        let slow: Vec<u64> = (0..keep)
            .map(|_| followers.remove(self.rng.gen_range(0..followers.len())))
            .collect();
        let extra_ms = self.rng.gen_range(heartbeat_ms..=2 * p);
        for &f in &slow {
            sim.net_mut().delay(DelayRule {
                from: Some(f),
                to: Some(leader),
                msg_type: Some(MessageType::MsgHeartbeatResponse),
                extra_ns: extra_ms * 1_000_000,
            });
        }
        if self.rng.gen_bool(0.5) {
            sim.net_mut().config.duplicate = self.rng.gen_range(0.0..0.2);
        }
        let rest: Vec<u64> = sim
            .ids()
            .into_iter()
            .filter(|id| *id != leader && !slow.contains(id))
            .collect();
        sim.partition(&[leader], &rest);
        // Slow acks in flight before anything else happens.
        let mut cut_at = self.after(sim, extra_ms, extra_ms + 4 * heartbeat_ms);
        let mut desc = format!("flaky leader {leader}: acks {slow:?}->{leader} +{extra_ms}ms");
        if self.rng.gen_bool(0.5) {
            let stall_at = self.after(sim, extra_ms, extra_ms + 4 * heartbeat_ms);
            let until = stall_at + self.rng.gen_range(p / 2..=e.max(p / 2));
            self.later.push((stall_at, Later::Stall(leader)));
            self.later.push((until, Later::Unstall(leader)));
            cut_at = self.rng.gen_range(stall_at..=until);
            desc += &format!(", ticks stalled {stall_at}..{until}ms");
        }
        for &f in &slow {
            self.later.push((cut_at, Later::Block(leader, f)));
        }
        desc += &self.hold_after_cut(&slow, leader, extra_ms, cut_at);
        self.episode_until_ms = cut_at + extra_ms + 3 * p;
        self.episode_without_writes = false;
        self.episode_writes_at = None;
        desc + &format!(", cut from them at {cut_at}ms")
    }

    /// Half the time, from the cut on, everything the slow followers send the leader is as slow
    /// as their acknowledgements were: a leader they elect is heard only after their held
    /// acknowledgements of the old leader's last rounds have arrived.
    fn hold_after_cut(&mut self, slow: &[u64], leader: u64, extra_ms: u64, cut_at: u64) -> String {
        if !self.hold_rng.gen_bool(0.5) {
            return String::new();
        }
        for &f in slow {
            self.later.push((cut_at, Later::Hold(f, leader, extra_ms)));
        }
        format!(", all they send it +{extra_ms}ms from the cut")
    }

    /// A membership change proposed at the leader: add or promote, remove (the leader too),
    /// a joint change, or leaving a joint configuration.
    fn membership(&mut self, sim: &mut SimCluster) -> String {
        let Some(leader) = sim.leader() else {
            return String::new();
        };
        let Some(conf) = sim.conf_state(leader) else {
            return String::new();
        };
        let cc = self.random_change(&conf, &sim.ids(), leader);
        let leaves = cc
            .get_changes()
            .iter()
            .any(|c| c.node_id == leader && c.get_change_type() == ConfChangeType::RemoveNode);
        let desc = format!("membership at {leader}: {:?}", cc.get_changes());
        if let Err(e) = sim.propose_conf_change(leader, cc) {
            if e.to_string().contains("read leases are live") {
                let again_at = self.give_up_after(sim, 1, self.election_ms / 4);
                self.later.push((again_at, Later::Membership));
                return format!("{desc} refused: {e}; again at {again_at}ms");
            }
            return format!("{desc} refused: {e}");
        }
        if !leaves {
            return desc;
        }
        let desc = format!("{desc} (voters {:?})", conf.voters);
        // A node leaving the cluster often loses its network soon after.
        let cut_at = self.after(sim, self.promise_ms / 4, 2 * self.promise_ms);
        self.later.push((cut_at, Later::Isolate(leader)));
        self.episode_until_ms = cut_at + 2 * self.election_ms;
        self.episode_without_writes = true;
        self.episode_writes_at = None;
        format!("{desc}, then isolated at {cut_at}ms")
    }

    /// A change that keeps one voter or more: a joint configuration is left; with two voters,
    /// the leader tries to remove itself half the time.
    fn random_change(&mut self, conf: &ConfState, ids: &[u64], leader: u64) -> ConfChangeV2 {
        if !conf.voters_outgoing.is_empty() {
            return ConfChangeV2::default(); // leave the joint configuration
        }
        let outside: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !conf.voters.contains(id) && !conf.learners.contains(id))
            .collect();
        let others: Vec<u64> = conf
            .voters
            .iter()
            .copied()
            .filter(|&v| v != leader)
            .collect();
        let mut pick = |v: &[u64]| (!v.is_empty()).then(|| v[self.rng.gen_range(0..v.len())]);
        let (add, promote, remove) = (pick(&outside), pick(&conf.learners), pick(&others));
        // Removals outweigh additions, so that configurations of two voters come up.
        let choice = match conf.voters.len() {
            2 if self.rng.gen_bool(0.5) => 3,
            _ => [0, 1, 2, 3, 4, 4, 4, 5][self.rng.gen_range(0..8)],
        };
        let single = |ty, node: Option<u64>| conf_change(ty, node.unwrap_or(leader));
        match choice {
            0 => single(ConfChangeType::AddLearnerNode, add),
            1 => single(ConfChangeType::AddNode, promote),
            2 => single(ConfChangeType::AddNode, add),
            3 => single(ConfChangeType::RemoveNode, Some(leader)),
            4 => single(ConfChangeType::RemoveNode, remove),
            _ => {
                let mut cc = single(ConfChangeType::AddNode, add);
                let out = single(ConfChangeType::RemoveNode, remove).take_changes();
                cc.mut_changes().extend(out.into_iter());
                if self.rng.gen_bool(0.5) {
                    cc.set_transition(ConfChangeTransition::Explicit);
                }
                cc
            }
        }
    }
}

/// Appends to `node` take `extra_ms` longer, whoever sends them.
fn slow_appends_to(sim: &mut SimCluster, node: u64, extra_ms: u64) {
    sim.net_mut().delay(DelayRule {
        from: None,
        to: Some(node),
        msg_type: Some(MessageType::MsgAppend),
        extra_ns: extra_ms * 1_000_000,
    });
}
