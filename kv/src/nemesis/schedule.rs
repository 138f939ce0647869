//! The nemesis's fault schedule: a seeded sequence of faults, some started to overlap the next.
//! The seed fixes the faults, their order, targets, durations and rates; the processes' own
//! timing is not deterministic, so a seed reproduces the schedule, not the interleaving.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Whom a fault hits, resolved when it starts: the leader, or the `n`-th of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    /// The node that leads when the fault starts.
    Leader,
    /// A node that does not lead (`n` modulo their number).
    Follower(usize),
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGSTOP, then SIGCONT after `ms` (past the election timeout).
    Pause { who: Who, ms: u64 },
    /// `kill -9`, restart from the data dir after `down_ms`.
    Kill { who: Who, down_ms: u64 },
    /// The leader cut off from every other node both ways, for `ms`.
    IsolateLeader { ms: u64 },
    /// The leader cut off and paused (the known hazard of tick-based leases), for `ms`.
    IsolatePauseLeader { ms: u64 },
    /// A majority/minority split, the leader in the minority or not.
    Split { ms: u64, leader_in_minority: bool },
    /// One-way: the leader's messages to the others dropped (`out`), or theirs to it.
    OneWay { ms: u64, out: bool },
    /// Node's clock at `rate` × real time for `ms`; with `isolate`, the node is also cut off.
    Clock {
        who: Who,
        rate: f64,
        ms: u64,
        isolate: bool,
    },
    /// Leadership transfer to a follower; then, with `pause_ms`, the old leader paused at once.
    Transfer { pause_ms: Option<u64> },
    /// Remove a node (the leader after a transfer) and add it back, with its data dir.
    RemoveAddBack { who: Who },
    /// Replace a follower by a node that has not been a member, in one joint change.
    Replace { who: Who },
    /// A follower left behind until the log is compacted past it, then killed and restarted
    /// `restarts` times while it catches up by snapshot.
    Lagging { behind_ms: u64, restarts: u32 },
    /// The node's raft log syncs held for `ms` (a disk that stops answering).
    StallDisk { who: Who, ms: u64 },
    /// For `ms`, every peer message into one follower delayed by `delay_ms`, on and off (one
    /// flapping slow link): each time the delay starts, a holder of a follower read lease still
    /// holds it while the leader's next writes reach it late. Drawn only with follower read
    /// leases.
    SlowFollower { ms: u64, delay_ms: u64 },
    /// The leader rejected by every other node for `ms`: its TCP packets to and from them are
    /// answered with a reset (a firewall that rejects). Drawn only with `--netns`.
    RejectLeader { ms: u64 },
    /// The leader and one follower cut from each other only (dropped both ways), every other
    /// link up, for `ms`. Drawn only with `--netns`.
    PairCut { who: Who, ms: u64 },
    /// `percent` of the packets between one node and its peers dropped at random, for `ms`.
    /// Drawn only with `--netns`.
    Loss { who: Who, ms: u64, percent: u32 },
}

impl Fault {
    /// Its kind, for counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Pause { .. } => "pause",
            Fault::Kill { .. } => "kill",
            Fault::IsolateLeader { .. } => "isolate_leader",
            Fault::IsolatePauseLeader { .. } => "isolate_pause_leader",
            Fault::Split { .. } => "split",
            Fault::OneWay { .. } => "one_way",
            Fault::Clock { .. } => "clock",
            Fault::Transfer { .. } => "transfer",
            Fault::RemoveAddBack { .. } => "remove_add_back",
            Fault::Replace { .. } => "replace",
            Fault::Lagging { .. } => "lagging_snapshot",
            Fault::StallDisk { .. } => "stall_disk",
            Fault::SlowFollower { .. } => "slow_follower",
            Fault::RejectLeader { .. } => "reject_leader",
            Fault::PairCut { .. } => "pair_cut",
            Fault::Loss { .. } => "loss",
        }
    }

    /// Whether it may run in the background, overlapping the next fault (it touches one node's
    /// process or clock, never the partitions or the membership).
    pub fn may_overlap(&self) -> bool {
        matches!(
            self,
            Fault::Pause {
                who: Who::Follower(_),
                ..
            } | Fault::Kill {
                who: Who::Follower(_),
                ..
            } | Fault::Clock { isolate: false, .. }
        )
    }
}

/// A fault and the pause before it; `overlap`: do not wait for it to end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// Quiet time before it starts.
    pub gap_ms: u64,
    /// The fault.
    pub fault: Fault,
    /// Run it in the background.
    pub overlap: bool,
}

/// How faults are drawn.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// The raft election timeout (pauses and cuts outlast it).
    pub election_ms: u64,
    /// The clock rate bound ρ.
    pub rho: f64,
    /// With `Some(r)`, every clock fault runs the leader at `r` and cuts it off (the control).
    pub control_rate: Option<f64>,
    /// Whether membership changes are drawn.
    pub membership: bool,
    /// Whether slow followers are drawn (with follower read leases).
    pub slow_follower: bool,
    /// Whether the faults only the kernel's packet filter makes are drawn (with `--netns`).
    pub kernel_faults: bool,
}

fn draw(kind: usize, rng: &mut ChaCha8Rng, p: &Params) -> Fault {
    let e = p.election_ms;
    let hold = |rng: &mut ChaCha8Rng| rng.gen_range(e * 3 / 2..=e * 3);
    let who = |rng: &mut ChaCha8Rng| match rng.gen_bool(0.5) {
        true => Who::Leader,
        false => Who::Follower(rng.gen_range(0..8)),
    };
    match kind {
        0 => Fault::Pause {
            who: who(rng),
            ms: hold(rng),
        },
        1 => Fault::Kill {
            who: who(rng),
            down_ms: rng.gen_range(200..=e * 2),
        },
        2 => Fault::IsolateLeader { ms: hold(rng) },
        3 => Fault::IsolatePauseLeader { ms: hold(rng) },
        4 => Fault::Split {
            ms: hold(rng),
            leader_in_minority: rng.gen_bool(0.5),
        },
        5 => Fault::OneWay {
            ms: hold(rng),
            out: rng.gen_bool(0.5),
        },
        6 => match p.control_rate {
            Some(rate) => Fault::Clock {
                who: Who::Leader,
                rate,
                ms: hold(rng) * 2,
                isolate: true,
            },
            None => {
                let rate = 1.0 + rng.gen_range(-0.9..=0.9) * p.rho;
                Fault::Clock {
                    who: who(rng),
                    rate,
                    ms: hold(rng) * 2,
                    isolate: rng.gen_bool(0.5),
                }
            }
        },
        7 => Fault::Transfer {
            pause_ms: rng.gen_bool(0.5).then(|| hold(rng)),
        },
        8 => Fault::RemoveAddBack { who: who(rng) },
        9 => Fault::Replace {
            who: Who::Follower(rng.gen_range(0..8)),
        },
        10 => Fault::StallDisk {
            who: who(rng),
            ms: hold(rng),
        },
        11 => Fault::Lagging {
            behind_ms: rng.gen_range(e * 2..=e * 4),
            restarts: rng.gen_range(1..=3),
        },
        12 => Fault::SlowFollower {
            ms: hold(rng) * 2,
            delay_ms: rng.gen_range(e / 20..=e / 10),
        },
        13 => Fault::RejectLeader { ms: hold(rng) },
        14 => Fault::PairCut {
            who: Who::Follower(rng.gen_range(0..8)),
            ms: hold(rng),
        },
        _ => Fault::Loss {
            who: who(rng),
            ms: hold(rng) * 2,
            percent: rng.gen_range(2..=10),
        },
    }
}

/// How many kinds there are.
pub const KINDS: usize = 16;

/// The name of every kind, as reports name them.
pub fn kind_names() -> Vec<&'static str> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let p = Params {
        election_ms: 1000,
        rho: 0.1,
        control_rate: None,
        membership: true,
        slow_follower: true,
        kernel_faults: true,
    };
    (0..KINDS).map(|k| draw(k, &mut rng, &p).kind()).collect()
}

/// The kinds only the kernel's packet filter makes (drawn only with `Params::kernel_faults`, so
/// that other runs keep their schedules).
const KERNEL: [usize; 3] = [13, 14, 15];

/// The slow follower's kind (drawn only with `Params::slow_follower`, so that other runs keep
/// their schedules).
const SLOW_FOLLOWER: usize = 12;

/// The membership kinds (remove and add back, replace).
const MEMBERSHIP: [usize; 2] = [8, 9];

/// With follower read leases, a slow follower after every third kind of the first pass as well:
/// it is the fault that leaves a holder behind the quorum, where a follower read can go wrong,
/// and a quick run's first pass is most of it.
fn every_third_slow(kinds: Vec<usize>) -> Vec<usize> {
    let mut out = Vec::with_capacity(kinds.len() * 4 / 3 + 1);
    for (i, k) in kinds.into_iter().enumerate() {
        out.push(k);
        if i % 3 == 2 && k != SLOW_FOLLOWER {
            out.push(SLOW_FOLLOWER);
        }
    }
    out
}

/// The schedule for `seed`: every kind once in a seeded order, then kinds at random, `count`
/// faults in all (without membership changes unless `p.membership`). About one fault in four
/// that may overlap is run in the background.
pub fn schedule(seed: u64, count: usize, p: &Params) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let allowed: Vec<usize> = (0..KINDS)
        .filter(|k| p.membership || !MEMBERSHIP.contains(k))
        .filter(|&k| p.slow_follower || k != SLOW_FOLLOWER)
        .filter(|k| p.kernel_faults || !KERNEL.contains(k))
        .collect();
    let mut kinds = allowed.clone();
    kinds.shuffle(&mut rng);
    if p.slow_follower {
        kinds = every_third_slow(kinds);
    }
    while kinds.len() < count {
        kinds.push(*allowed.choose(&mut rng).expect("kinds"));
    }
    kinds.truncate(count);
    kinds
        .into_iter()
        .map(|k| {
            let fault = draw(k, &mut rng, p);
            let overlap = fault.may_overlap() && rng.gen_bool(0.25);
            Step {
                gap_ms: rng.gen_range(200..=p.election_ms),
                fault,
                overlap,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_schedule_and_covers_every_kind() {
        let p = Params {
            election_ms: 1000,
            rho: 0.1,
            control_rate: None,
            membership: true,
            slow_follower: false,
            kernel_faults: false,
        };
        // Every kind but the slow follower and the kernel's.
        let plain = KINDS - 1 - KERNEL.len();
        let a = schedule(7, 30, &p);
        assert_eq!(a, schedule(7, 30, &p));
        assert_ne!(a, schedule(8, 30, &p));
        let mut kinds: Vec<&str> = a[..plain].iter().map(|s| s.fault.kind()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        assert_eq!(
            kinds.len(),
            plain,
            "the first faults are one of each kind but the slow follower and the kernel's"
        );
        let kernel = ["reject_leader", "pair_cut", "loss"];
        assert!(a.iter().all(|s| !kernel.contains(&s.fault.kind())));
        let netns = Params {
            kernel_faults: true,
            ..p
        };
        let first: Vec<&str> = schedule(7, 30, &netns)[..plain + KERNEL.len()]
            .iter()
            .map(|s| s.fault.kind())
            .collect();
        assert!(kernel.iter().all(|k| first.contains(k)), "{first:?}");
        assert!(a.iter().all(|s| s.fault.kind() != "slow_follower"));
        let slow = Params {
            slow_follower: true,
            membership: false,
            ..p
        };
        let first: Vec<&str> = schedule(7, 30, &slow)[..plain - 1]
            .iter()
            .map(|s| s.fault.kind())
            .collect();
        let slows = first.iter().filter(|&&k| k == "slow_follower").count();
        assert!(
            slows >= 2,
            "a slow follower after every third kind: {first:?}"
        );
        for s in &a {
            if let Fault::Clock { rate, .. } = s.fault {
                assert!((rate - 1.0).abs() <= 0.1, "within rho: {rate}");
            }
            if let Fault::Pause { ms, .. } = s.fault {
                assert!(ms > p.election_ms, "a pause outlasts the election timeout");
            }
        }
        let c = Params {
            control_rate: Some(0.05),
            ..p
        };
        assert!(schedule(7, 30, &c)
            .iter()
            .any(|s| matches!(s.fault, Fault::Clock { rate, isolate: true, .. } if rate == 0.05)));
        let groups = Params {
            membership: false,
            ..p
        };
        let g = schedule(7, 40, &groups);
        assert!(g
            .iter()
            .all(|s| !matches!(s.fault.kind(), "remove_add_back" | "replace")));
        assert!(g.iter().any(|s| s.fault.kind() == "stall_disk"));
    }
}
