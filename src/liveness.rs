//! Shared liveness: one support session per ordered pair of nodes carries the leases of every
//! raft group the pair shares. A pure state machine: time comes in as arguments, messages and
//! decisions go out.
//!
//! # The argument (MULTI.md, one level above the single-group lease)
//! - **Support.** A requester `R` sends each peer `S` a heartbeat `(epoch, seq)` every `P/3`,
//!   reading `t0` before sending. `S`, on receipt, if it never withdrew that epoch, supports it
//!   until `receipt + P` on its own clock (never earlier than before) and answers with its
//!   incarnation. `R` then counts on `S` until `t0 + L`, `L = P·(1−ρ)/(1+ρ) − ε`, valid only
//!   for that `(epoch, incarnation)`. In real time `R`'s belief ends before `S`'s support does.
//! - **Withdrawal is for good.** When its clock passes the end, `S` withdraws the epoch and never
//!   supports it again; `R` learns of it from the answer and moves to the next epoch. Support
//!   never comes back at an epoch, so a fortification made under it can never be counted again
//!   after the replica that made it was let go.
//! - **Restart.** A node persists one counter, its incarnation, and bumps it at every boot. Its
//!   epochs as a requester start from the new incarnation (the high 32 bits of an [`Epoch`]): a
//!   later epoch ends the earlier one as a withdrawal, and the fortifications that name it are
//!   released once the promise made at it has run out. As a supporter it forgets what it withdrew,
//!   so it refuses every vote and campaign for `P` after boot (the boot promise), and its
//!   answers carry the new incarnation, so no requester counts a fortification made before.
//! - **Fortification** (per group, [`Fortification`]): the replica on `S` of a group led by `R`
//!   at term `T` records `(R, T, epoch, S's incarnation)`. While `S` supports `R` at that epoch,
//!   that replica neither votes for another candidate nor campaigns. The leader's lease is the
//!   latest instant a quorum of fortified voters (itself included) is supported until.

use std::collections::BTreeMap;

use crate::config::Derived;

/// A node's id (the same in every group it hosts).
pub type NodeId = u64;

/// An epoch of support asked by one node of another. The high 32 bits are the requester's
/// incarnation, so a restarted requester's epochs are above all it used before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The first epoch of incarnation `incarnation`.
    pub fn first(incarnation: u32) -> Epoch {
        Epoch(u64::from(incarnation) << 32)
    }

    /// The next epoch (after a withdrawal).
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }

    /// The requester incarnation this epoch belongs to.
    pub fn incarnation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// One support message between two nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupportMsg {
    /// The requester asks for support at `epoch`; `seq` names this copy.
    Heartbeat {
        /// The epoch asked for.
        epoch: Epoch,
        /// Numbers the requester's heartbeats to this peer, from 1.
        seq: u64,
    },
    /// The supporter supports `epoch` from its receipt of heartbeat `seq`, for `promise_ns` on
    /// its own clock.
    Ack {
        /// The epoch supported.
        epoch: Epoch,
        /// The heartbeat acknowledged.
        seq: u64,
        /// The supporter's incarnation.
        incarnation: u32,
        /// How long from its receipt of the heartbeat the supporter supports the epoch (its `P`).
        /// The requester counts this, never its own setting.
        promise_ns: u64,
        /// The rate error the supporter assumes of clocks (its `ρ`), in ppm.
        drift_ppm: u32,
    },
    /// The supporter withdrew `epoch` for good: the requester moves to the next one.
    Withdrawn {
        /// The epoch withdrawn.
        epoch: Epoch,
    },
}

/// Support a requester may count on: from one peer, at one `(epoch, incarnation)`, until a local
/// instant of the requester's clock (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// The epoch supported.
    pub epoch: Epoch,
    /// The supporter's incarnation when it answered.
    pub incarnation: u32,
    /// The support may be counted on before this local instant.
    pub until_ns: u64,
}

/// What one requester asks of one peer.
#[derive(Debug, Clone)]
struct Asking {
    /// The epoch asked for now. Only moves up.
    epoch: Epoch,
    /// The last heartbeat sequence number used.
    last_seq: u64,
    /// Send time of each heartbeat still worth an answer, by sequence number.
    sent_ns: BTreeMap<u64, u64>,
    /// The support counted on, at `epoch`.
    support: Option<Support>,
    /// The next heartbeat is due at this local instant.
    next_ns: u64,
}

/// The requester half: the support this node asks of each peer.
#[derive(Debug, Clone)]
pub struct Requester {
    incarnation: u32,
    /// This node's `L`, `ρ` and `ε`: an answer is counted on for the support duration it carries,
    /// reckoned with them ([`Derived::lease_for_promise_ns`]).
    derived: Derived,
    /// `L`: no answer is counted on for longer past its heartbeat's send time.
    lease_ns: u64,
    /// Negative control (tests only): every answer counted on for this node's own `L`.
    count_own_promise: bool,
    /// Heartbeat interval: `P/3`.
    interval_ns: u64,
    peers: BTreeMap<NodeId, Asking>,
}

impl Requester {
    /// A requester of incarnation `incarnation`, asking `peers` for support.
    pub fn new(
        incarnation: u32,
        derived: &Derived,
        peers: impl IntoIterator<Item = NodeId>,
    ) -> Self {
        assert!(incarnation > 0, "incarnations start at 1");
        let mut r = Requester {
            incarnation,
            derived: *derived,
            lease_ns: derived.lease_ns,
            count_own_promise: false,
            interval_ns: (derived.promise_ns / 3).max(1),
            peers: BTreeMap::new(),
        };
        peers.into_iter().for_each(|p| r.add_peer(p));
        r
    }

    /// Negative control: count every answer for this node's own `L`, whatever the supporter
    /// promised.
    #[doc(hidden)]
    pub fn control_count_own_promise(mut self) -> Self {
        self.count_own_promise = true;
        self
    }

    /// Ask `peer` for support too (it joined a group this node hosts).
    pub fn add_peer(&mut self, peer: NodeId) {
        let epoch = Epoch::first(self.incarnation);
        self.peers.entry(peer).or_insert(Asking {
            epoch,
            last_seq: 0,
            sent_ns: BTreeMap::new(),
            support: None,
            next_ns: 0,
        });
    }

    /// Heartbeats due at `now_ns`, one per peer at most. Each send time is `now_ns`, read before
    /// the caller sends them.
    ///
    /// When one peer is due, every peer due within half an interval goes too (a heartbeat sent
    /// early only renews sooner): the peers' answers then come together, and a node of many
    /// groups extends the leases resting on them once per round rather than once per peer.
    pub fn due(&mut self, now_ns: u64) -> Vec<(NodeId, SupportMsg)> {
        let (interval_ns, lease_ns) = (self.interval_ns, self.lease_ns);
        let mut out = Vec::new();
        if self.peers.values().all(|a| a.next_ns > now_ns) {
            return out;
        }
        let horizon_ns = now_ns.saturating_add(interval_ns / 2);
        for (&peer, a) in self
            .peers
            .iter_mut()
            .filter(|(_, a)| a.next_ns <= horizon_ns)
        {
            a.last_seq += 1;
            a.sent_ns.insert(a.last_seq, now_ns);
            // A heartbeat sent more than L ago can extend nothing.
            a.sent_ns
                .retain(|_, sent| sent.saturating_add(lease_ns) > now_ns);
            a.next_ns = now_ns.saturating_add(interval_ns);
            let msg = SupportMsg::Heartbeat {
                epoch: a.epoch,
                seq: a.last_seq,
            };
            out.push((peer, msg));
        }
        out
    }

    /// An answer from `peer` arrived at `now_ns`. Returns whether the support counted on changed.
    pub fn on_answer(&mut self, peer: NodeId, msg: SupportMsg, now_ns: u64) -> bool {
        let Some(a) = self.peers.get_mut(&peer) else {
            return false;
        };
        match msg {
            SupportMsg::Ack {
                epoch,
                seq,
                incarnation,
                promise_ns,
                drift_ppm,
            } if epoch == a.epoch => {
                let Some(&t0) = a.sent_ns.get(&seq) else {
                    return false; // too old to count, or never sent
                };
                assert!(
                    t0 <= now_ns,
                    "an answer before its heartbeat: {t0} > {now_ns}"
                );
                let lease_ns = if self.count_own_promise {
                    self.lease_ns
                } else {
                    self.derived
                        .lease_for_promise_ns(promise_ns, u64::from(drift_ppm))
                };
                debug_assert!(
                    lease_ns <= self.lease_ns && (lease_ns <= promise_ns || self.count_own_promise)
                );
                if lease_ns == 0 {
                    return false; // a support too short to count on
                }
                let until_ns = t0.saturating_add(lease_ns);
                Self::count(a, epoch, incarnation, until_ns)
            }
            SupportMsg::Withdrawn { epoch } if epoch == a.epoch => {
                a.epoch = epoch.next();
                a.support = None;
                a.sent_ns.clear();
                a.next_ns = now_ns; // ask again at once, at the new epoch
                true
            }
            _ => false, // an answer about an epoch already left behind
        }
    }

    fn count(a: &mut Asking, epoch: Epoch, incarnation: u32, until_ns: u64) -> bool {
        match &mut a.support {
            // A late answer from the supporter's earlier incarnation: the newer one is counted.
            Some(s) if s.epoch == epoch && incarnation < s.incarnation => false,
            Some(s) if s.epoch == epoch && s.incarnation == incarnation => {
                let later = until_ns > s.until_ns;
                s.until_ns = s.until_ns.max(until_ns); // never regresses for one (epoch, incarnation)
                later
            }
            _ => {
                a.support = Some(Support {
                    epoch,
                    incarnation,
                    until_ns,
                });
                true
            }
        }
    }

    /// The support `peer` gives now, if any is still in force.
    pub fn support_from(&self, peer: NodeId, now_ns: u64) -> Option<Support> {
        let s = self.peers.get(&peer)?.support?;
        (now_ns < s.until_ns).then_some(s)
    }

    /// The epoch this node asks `peer` for now.
    pub fn epoch_for(&self, peer: NodeId) -> Option<Epoch> {
        self.peers.get(&peer).map(|a| a.epoch)
    }

    /// This node's incarnation.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }
}

/// What one supporter gives one requester.
#[derive(Debug, Clone, Copy, Default)]
struct Giving {
    /// The epoch supported now, if any.
    epoch: Option<Epoch>,
    /// Supported until this local instant (exclusive). Only moves later for one epoch.
    until_ns: u64,
    /// Every epoch at or below this one was withdrawn, for good (`None`: none yet).
    withdrawn_through: Option<Epoch>,
}

/// The supporter half: the support this node gives each requester.
#[derive(Debug, Clone)]
pub struct Supporter {
    incarnation: u32,
    /// `P`: how long from a heartbeat's receipt it supports the epoch. Said in every answer.
    promise_ns: u64,
    /// `ρ` in ppm, said in every answer.
    drift_ppm: u32,
    requesters: BTreeMap<NodeId, Giving>,
    /// Epochs no longer supported (a later epoch arrived, or a heartbeat found one run out),
    /// with the local instant their last promise runs to: each is returned by
    /// [`Supporter::withdraw_expired`] once that instant has passed, never before. A promise
    /// made is kept to its end, whatever arrives meanwhile.
    ended: Vec<(NodeId, Epoch, u64)>,
    /// Negative control (tests only): withdrawals are not remembered.
    forget_withdrawals: bool,
    /// Negative control (tests only): an epoch a later one ends is released at once, before
    /// the promise made under it runs out.
    end_at_once: bool,
}

impl Supporter {
    /// A supporter of incarnation `incarnation`. Its boot promise (no vote, no campaign for
    /// `P` after boot) is each hosted group's [`crate::LeaseNode`]'s.
    pub fn new(incarnation: u32, derived: &Derived) -> Self {
        assert!(incarnation > 0, "incarnations start at 1");
        Supporter {
            incarnation,
            promise_ns: derived.promise_ns,
            drift_ppm: u32::try_from(derived.drift_ppm).expect("ρ validated ≤ 10%"),
            requesters: BTreeMap::new(),
            ended: Vec::new(),
            forget_withdrawals: false,
            end_at_once: false,
        }
    }

    /// Negative control: an epoch ended by a later one is released at once.
    #[doc(hidden)]
    pub fn control_end_at_once(mut self) -> Self {
        self.end_at_once = true;
        self
    }

    /// Negative control: support may come back at a withdrawn epoch.
    #[doc(hidden)]
    pub fn control_forget_withdrawals(mut self) -> Self {
        self.forget_withdrawals = true;
        self
    }

    /// A heartbeat from `from` arrived; `receipt_ns` is read at or after its receipt. Returns the
    /// answer, or `None` for a stale copy (an epoch below the one supported now).
    pub fn on_heartbeat(
        &mut self,
        from: NodeId,
        epoch: Epoch,
        seq: u64,
        receipt_ns: u64,
    ) -> Option<SupportMsg> {
        let g = self.requesters.entry(from).or_default();
        let run_out = g.epoch.filter(|_| receipt_ns >= g.until_ns);
        if let Some(current) = run_out.filter(|_| !self.forget_withdrawals) {
            // Support that ran out is withdrawn here if no tick did yet: never renewed.
            g.epoch = None;
            g.withdrawn_through = g.withdrawn_through.max(Some(current));
            self.ended.push((from, current, g.until_ns));
        }
        if g.withdrawn_through.is_some_and(|w| epoch <= w) && !self.forget_withdrawals {
            return Some(SupportMsg::Withdrawn { epoch });
        }
        match g.epoch {
            Some(current) if epoch < current => return None,
            // A later epoch while one is supported: the requester restarted, or moved on after
            // a withdrawal it heard of (perhaps from this node's previous incarnation, late).
            // The earlier epoch is never renewed again, but the promise made under it is kept to
            // its end: a lease may still rest on it. Its replicas are released then.
            Some(current) if epoch > current => {
                g.withdrawn_through = g.withdrawn_through.max(Some(current));
                let kept_until_ns = if self.end_at_once { 0 } else { g.until_ns };
                self.ended.push((from, current, kept_until_ns));
                g.until_ns = 0;
            }
            _ => {}
        }
        assert!(
            self.forget_withdrawals || g.withdrawn_through.is_none_or(|w| epoch > w),
            "support for {epoch:?} of node {from}, withdrawn through {:?}",
            g.withdrawn_through
        );
        g.epoch = Some(epoch);
        g.until_ns = g.until_ns.max(receipt_ns.saturating_add(self.promise_ns));
        Some(SupportMsg::Ack {
            epoch,
            seq,
            incarnation: self.incarnation,
            promise_ns: self.promise_ns,
            drift_ppm: self.drift_ppm,
        })
    }

    /// Withdraw, for good, every epoch whose support ran out by `now_ns`; returns them.
    /// Epochs ended otherwise (see `ended`) are returned once their promise has run out.
    pub fn withdraw_expired(&mut self, now_ns: u64) -> Vec<(NodeId, Epoch)> {
        let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ended)
            .into_iter()
            .partition(|&(_, _, until_ns)| now_ns >= until_ns);
        self.ended = kept;
        let mut out: Vec<(NodeId, Epoch)> = due.into_iter().map(|(r, e, _)| (r, e)).collect();
        for (&r, g) in self.requesters.iter_mut() {
            let Some(epoch) = g.epoch.filter(|_| now_ns >= g.until_ns) else {
                continue;
            };
            g.epoch = None;
            g.withdrawn_through = g.withdrawn_through.max(Some(epoch));
            out.push((r, epoch));
        }
        out
    }

    /// Whether this node supports `requester` at `epoch` at `now_ns`.
    pub fn supports(&self, requester: NodeId, epoch: Epoch, now_ns: u64) -> bool {
        let g = self.requesters.get(&requester);
        g.is_some_and(|g| g.epoch == Some(epoch) && now_ns < g.until_ns)
    }

    /// This node's incarnation.
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }
}

/// A follower replica's promise to its group's leader, made under node support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fortification {
    /// The leader's node.
    pub leader: NodeId,
    /// The term it leads.
    pub term: u64,
    /// The epoch of support this node gives the leader's node.
    pub epoch: Epoch,
}

/// Which fortifications a leader may count: per voter, the `(epoch, incarnation)` it was made
/// under. It counts while the voter's node supports the leader at exactly that pair.
pub type Fortified = BTreeMap<NodeId, (Epoch, u32)>;

/// The latest instant a quorum of `voters` (both halves when joint) supports `leader`: `leader`
/// counts for ever; another voter counts until its node's support ends, if it fortified under
/// the support counted now. `support(v)` is the requester's [`Requester::support_from`].
pub fn lease_until_ns(
    leader: NodeId,
    voters: (&[NodeId], &[NodeId]),
    fortified: &Fortified,
    support: impl Fn(NodeId) -> Option<Support>,
) -> u64 {
    let until = |v: NodeId| -> u64 {
        if v == leader {
            return u64::MAX;
        }
        match (fortified.get(&v), support(v)) {
            (Some(&(e, i)), Some(s)) if s.epoch == e && s.incarnation == i => s.until_ns,
            _ => 0,
        }
    };
    let half = |set: &[NodeId]| -> u64 {
        if set.is_empty() {
            return u64::MAX;
        }
        // On the stack for the usual sizes: this runs for every group at every support round.
        let mut small = [0u64; 9];
        let mut large = Vec::new();
        let untils: &mut [u64] = match set.len() <= small.len() {
            true => &mut small[..set.len()],
            false => {
                large.resize(set.len(), 0);
                &mut large
            }
        };
        for (slot, &v) in untils.iter_mut().zip(set) {
            *slot = until(v);
        }
        untils.sort_unstable_by(|a, b| b.cmp(a));
        untils[set.len() / 2] // the quorum-th largest: a majority is supported until then
    };
    let lease_ns = half(voters.0).min(half(voters.1));
    // The lease never exceeds the support it rests on: some other voter's, unless the leader
    // is the one voter of every half.
    let alone = voters.0.iter().chain(voters.1).all(|&v| v == leader);
    debug_assert!(
        alone
            || lease_ns == 0
            || voters
                .0
                .iter()
                .chain(voters.1)
                .any(|&v| v != leader && until(v) >= lease_ns),
        "a lease to {lease_ns} that no voter's support reaches"
    );
    debug_assert!(!alone || voters.0.is_empty() && voters.1.is_empty() || lease_ns == u64::MAX);
    lease_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 300;
    const L: u64 = 280;

    fn derived() -> Derived {
        Derived {
            promise_ns: P,
            boot_promise_ns: P,
            lease_ns: L,
            drift_ppm: 0,
            margin_ns: 0,
            renew_before_ns: 90,
            campaign_jitter_ns: 0,
            max_grant_ns: None,
            max_lag_ns: None,
        }
    }

    fn heartbeat(r: &mut Requester, now: u64) -> (Epoch, u64) {
        match r.due(now).as_slice() {
            [(2, SupportMsg::Heartbeat { epoch, seq })] => (*epoch, *seq),
            other => panic!("expected one heartbeat to 2, got {other:?}"),
        }
    }

    #[test]
    fn support_runs_to_exactly_t0_plus_l_and_never_regresses() {
        let (mut r, mut s) = (
            Requester::new(1, &derived(), [2]),
            Supporter::new(7, &derived()),
        );
        let (epoch, seq) = heartbeat(&mut r, 1_000);
        let ack = s.on_heartbeat(1, epoch, seq, 1_010).unwrap();
        assert!(r.on_answer(2, ack, 1_020));
        assert_eq!(
            r.support_from(2, 1_000 + L - 1).map(|s| s.until_ns),
            Some(1_000 + L)
        );
        assert_eq!(
            r.support_from(2, 1_000 + L),
            None,
            "t0 + L is not in the support"
        );
        assert!(s.supports(1, epoch, 1_010 + P - 1) && !s.supports(1, epoch, 1_010 + P));
        // A late answer to an earlier heartbeat does not pull the support back.
        let (_, seq2) = heartbeat(&mut r, 1_100);
        let ack2 = s.on_heartbeat(1, epoch, seq2, 1_110).unwrap();
        r.on_answer(2, ack2, 1_120);
        assert!(
            !r.on_answer(2, ack, 1_130),
            "an answer from an older seq changes nothing"
        );
        assert_eq!(r.support_from(2, 1_200).unwrap().until_ns, 1_100 + L);
    }

    /// A supporter configured with a shorter support duration than the requester (a rolling
    /// change): the requester counts what the supporter says it gave, never its own `P`.
    fn counted_past_the_supporters_end(r: Requester) -> bool {
        let short = Derived {
            promise_ns: P / 3,
            boot_promise_ns: P / 3,
            ..derived()
        };
        let (mut r, mut s) = (r, Supporter::new(7, &short));
        let (epoch, seq) = heartbeat(&mut r, 1_000);
        let ack = s.on_heartbeat(1, epoch, seq, 1_000).unwrap();
        assert!(matches!(ack, SupportMsg::Ack { promise_ns, .. } if promise_ns == P / 3));
        r.on_answer(2, ack, 1_001);
        let supporter_end = 1_000 + P / 3;
        assert!(!s.supports(1, epoch, supporter_end));
        r.support_from(2, supporter_end).is_some()
    }

    #[test]
    fn support_is_counted_for_the_duration_the_supporter_gave() {
        let r = Requester::new(1, &derived(), [2]);
        assert!(!counted_past_the_supporters_end(r));
    }

    #[test]
    fn control_counting_the_requesters_own_duration_outlives_the_support() {
        let r = Requester::new(1, &derived(), [2]).control_count_own_promise();
        assert!(
            counted_past_the_supporters_end(r),
            "the bug: counted past the supporter's end"
        );
    }

    #[test]
    fn a_withdrawn_epoch_offered_again_is_refused_for_good() {
        let (mut r, mut s) = (
            Requester::new(1, &derived(), [2]),
            Supporter::new(7, &derived()),
        );
        let (epoch, seq) = heartbeat(&mut r, 0);
        let ack = s.on_heartbeat(1, epoch, seq, 0).unwrap();
        r.on_answer(2, ack, 1);
        assert_eq!(s.withdraw_expired(P - 1), vec![], "still in force");
        assert_eq!(s.withdraw_expired(P), vec![(1, epoch)]);
        assert!(!s.supports(1, epoch, P));
        // A delayed heartbeat of the withdrawn epoch: refused, whatever its time.
        let refused = s.on_heartbeat(1, epoch, seq + 1, P + 1).unwrap();
        assert_eq!(refused, SupportMsg::Withdrawn { epoch });
        assert!(r.on_answer(2, refused, P + 2));
        assert_eq!(r.epoch_for(2), Some(epoch.next()), "the requester moves on");
        let (next, seq) = heartbeat(&mut r, P + 2);
        assert!(matches!(
            s.on_heartbeat(1, next, seq, P + 3),
            Some(SupportMsg::Ack { .. })
        ));
        assert_eq!(
            s.on_heartbeat(1, epoch, 99, P + 4),
            Some(SupportMsg::Withdrawn { epoch })
        );
    }

    #[test]
    fn a_later_epoch_ends_the_earlier_one_but_its_promise_is_kept_to_the_end() {
        let mut s = Supporter::new(7, &derived());
        let (old, new) = (Epoch::first(1), Epoch::first(2));
        s.on_heartbeat(1, old, 1, 0);
        assert!(s.supports(1, old, 1));
        assert!(matches!(
            s.on_heartbeat(1, new, 1, 2),
            Some(SupportMsg::Ack { .. })
        ));
        assert!(!s.supports(1, old, 2), "the earlier epoch is not renewed");
        assert!(s.supports(1, new, 2));
        assert_eq!(
            s.withdraw_expired(P - 1),
            vec![],
            "its replicas stay fortified while the promise made at 0 runs"
        );
        assert_eq!(
            s.withdraw_expired(P),
            vec![(1, old)],
            "then reported, so that they are released"
        );
        assert_eq!(s.withdraw_expired(P + 1), vec![], "reported once");
        assert_eq!(
            s.on_heartbeat(1, old, 2, P + 2),
            Some(SupportMsg::Withdrawn { epoch: old }),
            "and never supported again"
        );
    }

    /// A withdrawal sent by the supporter's previous incarnation arrives after its new
    /// incarnation supported the same epoch again: the requester moves on, and its next
    /// heartbeat must not end support a lease still rests on.
    fn late_withdrawal_from_an_earlier_incarnation(s2: Supporter) -> Vec<(NodeId, Epoch)> {
        let mut r = Requester::new(1, &derived(), [2]);
        let mut s1 = Supporter::new(1, &derived());
        let (e, seq) = heartbeat(&mut r, 0);
        r.on_answer(2, s1.on_heartbeat(1, e, seq, 0).unwrap(), 0);
        assert_eq!(s1.withdraw_expired(P), vec![(1, e)]);
        let (_, seq) = heartbeat(&mut r, P + 10);
        let late = s1.on_heartbeat(1, e, seq, P + 10).unwrap();
        assert_eq!(
            late,
            SupportMsg::Withdrawn { epoch: e },
            "in flight, slowly"
        );
        // The supporter restarts as incarnation 2, which supports e again.
        let mut s2 = s2;
        let t0 = 2 * P + 20;
        let (_, seq) = heartbeat(&mut r, t0);
        assert!(r.on_answer(2, s2.on_heartbeat(1, e, seq, t0).unwrap(), t0));
        let counted = r.support_from(2, t0).expect("counted");
        assert_eq!(
            (counted.epoch, counted.incarnation, counted.until_ns),
            (e, 2, t0 + L)
        );
        // The old answer lands: the requester moves on; its next heartbeat reaches S2.
        assert!(r.on_answer(2, late, t0 + 1));
        assert_eq!(r.epoch_for(2), Some(e.next()));
        let (next, seq) = heartbeat(&mut r, t0 + 1);
        s2.on_heartbeat(1, next, seq, t0 + 2);
        // Until t0 + L the requester may count on e from S2: nothing made under it is released.
        let mut released = s2.withdraw_expired(t0 + 3);
        released.extend(s2.withdraw_expired(t0 + L - 1));
        released
    }

    #[test]
    fn a_late_withdrawal_from_an_earlier_incarnation_never_cuts_a_promise_short() {
        let released = late_withdrawal_from_an_earlier_incarnation(Supporter::new(2, &derived()));
        assert_eq!(released, vec![], "support counted until t0 + L ended early");
    }

    #[test]
    fn control_ending_an_epoch_at_once_cuts_a_promise_short() {
        let s2 = Supporter::new(2, &derived()).control_end_at_once();
        let released = late_withdrawal_from_an_earlier_incarnation(s2);
        assert_eq!(
            released,
            vec![(1, Epoch::first(1))],
            "the bug: released early"
        );
    }

    #[test]
    fn a_late_ack_from_an_earlier_incarnation_does_not_replace_the_newer_support() {
        let mut r = Requester::new(1, &derived(), [2]);
        let (e, seq_old) = heartbeat(&mut r, 0);
        let (_, seq_new) = heartbeat(&mut r, 100);
        let ack = |seq, incarnation| SupportMsg::Ack {
            epoch: e,
            seq,
            incarnation,
            promise_ns: P,
            drift_ppm: 0,
        };
        assert!(r.on_answer(2, ack(seq_new, 2), 110));
        assert!(
            !r.on_answer(2, ack(seq_old, 1), 120),
            "a copy from before the restart"
        );
        assert_eq!(r.support_from(2, 120).map(|s| s.incarnation), Some(2));
    }

    #[test]
    fn an_epoch_that_ran_out_is_never_renewed_even_before_the_tick_withdraws_it() {
        let mut s = Supporter::new(1, &derived());
        let e = Epoch::first(1);
        s.on_heartbeat(1, e, 1, 0);
        assert!(!s.supports(1, e, P), "ran out at P");
        assert_eq!(
            s.on_heartbeat(1, e, 2, P + 50),
            Some(SupportMsg::Withdrawn { epoch: e }),
            "a heartbeat after the end is answered with the withdrawal"
        );
        assert!(!s.supports(1, e, P + 50));
        assert_eq!(
            s.withdraw_expired(P + 60),
            vec![(1, e)],
            "and its replicas released"
        );
    }

    #[test]
    fn control_forgetting_withdrawals_supports_a_withdrawn_epoch_again() {
        let mut s = Supporter::new(7, &derived()).control_forget_withdrawals();
        let epoch = Epoch::first(1);
        s.on_heartbeat(1, epoch, 1, 0);
        s.withdraw_expired(P);
        assert!(matches!(
            s.on_heartbeat(1, epoch, 2, P + 1),
            Some(SupportMsg::Ack { .. })
        ));
        assert!(
            s.supports(1, epoch, P + 1),
            "the bug: support came back at a withdrawn epoch"
        );
    }

    #[test]
    fn a_stale_incarnation_is_not_the_support_counted() {
        let mut r = Requester::new(1, &derived(), [2]);
        let (epoch, seq) = heartbeat(&mut r, 0);
        let ack = |incarnation| SupportMsg::Ack {
            epoch,
            seq,
            incarnation,
            promise_ns: P,
            drift_ppm: 0,
        };
        r.on_answer(2, ack(7), 1);
        assert_eq!(r.support_from(2, 1).unwrap().incarnation, 7);
        // The supporter restarted: support at the same epoch, new incarnation.
        r.on_answer(2, ack(8), 2);
        let support = r.support_from(2, 2).unwrap();
        assert_eq!(support.incarnation, 8);
        let fortified_before: Fortified = [(2, (epoch, 7))].into();
        let counted = lease_until_ns(1, (&[1, 2, 3], &[]), &fortified_before, |_| Some(support));
        assert_eq!(
            counted, 0,
            "a fortification made under incarnation 7 is not counted under 8"
        );
    }

    #[test]
    fn a_restarted_requester_starts_above_every_earlier_epoch() {
        let mut s = Supporter::new(7, &derived());
        let old = Epoch::first(1);
        s.on_heartbeat(1, old, 5, 0);
        let new = Epoch::first(2);
        assert!(new > old.next().next());
        assert!(matches!(
            s.on_heartbeat(1, new, 1, 10),
            Some(SupportMsg::Ack { .. })
        ));
        assert!(
            !s.supports(1, old, 11),
            "the old incarnation's epoch is not renewed"
        );
        assert_eq!(
            s.on_heartbeat(1, old, 6, 12),
            Some(SupportMsg::Withdrawn { epoch: old })
        );
        assert_eq!(new.incarnation(), 2);
    }

    #[test]
    fn the_lease_is_the_quorum_th_latest_support_of_fortified_voters() {
        let e = Epoch::first(1);
        let support = |until_ns| {
            move |_v| {
                Some(Support {
                    epoch: e,
                    incarnation: 9,
                    until_ns,
                })
            }
        };
        let all: Fortified = [(2, (e, 9)), (3, (e, 9))].into();
        assert_eq!(
            lease_until_ns(1, (&[1, 2, 3], &[]), &all, support(500)),
            500
        );
        let one: Fortified = [(2, (e, 9))].into();
        assert_eq!(
            lease_until_ns(1, (&[1, 2, 3], &[]), &one, support(500)),
            500,
            "1 and 2 are a quorum"
        );
        assert_eq!(
            lease_until_ns(1, (&[1, 2, 3, 4, 5], &[]), &one, support(500)),
            0
        );
        let per_voter = |v| {
            Some(Support {
                epoch: e,
                incarnation: 9,
                until_ns: v * 100,
            })
        };
        let five: Fortified = (2..=5).map(|v| (v, (e, 9))).collect();
        assert_eq!(
            lease_until_ns(1, (&[1, 2, 3, 4, 5], &[]), &five, per_voter),
            400
        );
        // Joint: both halves; the outgoing one {1, 4, 5} with 4 and 5 unfortified has no quorum.
        assert_eq!(
            lease_until_ns(1, (&[1, 2, 3], &[1, 4, 5]), &all, support(500)),
            0
        );
        // The leader alone in a one-voter configuration: for ever.
        assert_eq!(
            lease_until_ns(1, (&[1], &[]), &Fortified::new(), |_| None),
            u64::MAX
        );
    }
}
