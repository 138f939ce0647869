//! The leader's side of follower read leases: which voters hold a read lease and until when on
//! the leader's clock, and the exposed index `E`. Pure: time and indexes come in as arguments.
//!
//! Invariant (asserted in [`GrantTable::expose`]): every holder whose read lease may still be
//! valid has matched at least `E`. A grant needs the holder's matched index at `E` or above, and
//! `E` rises only to the smallest matched index of the holders that may still be valid.

use std::collections::BTreeMap;

use crate::config::MAX_DRIFT_PPM;

/// The tag a holder puts on one of its acknowledgements: never used before by that holder
/// (term, boot and a counter), so a grant answers exactly one acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AckTag {
    /// The term of the acknowledgement.
    pub term: u64,
    /// The holder's boot: a restarted holder's tags never repeat one from before.
    pub boot: u64,
    /// Counts the holder's tags within one boot, from 1.
    pub seq: u64,
}

/// A read lease granted to one holder, answering one of its acknowledgements. It carries the
/// leader's settings, so the holder never relies on its own view of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The leader's term.
    pub term: u64,
    /// The acknowledgement answered.
    pub tag: AckTag,
    /// `g`: the leader counts the holder for this long from the acknowledgement's receipt.
    pub grant_ns: u64,
    /// The drift bound `ρ` the leader assumes, in ppm.
    pub drift_ppm: u64,
    /// The leader's margin `ε`.
    pub margin_ns: u64,
}

/// An acknowledgement a voter tagged, as the leader received it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRequest {
    /// The acknowledging node.
    pub holder: u64,
    /// Its tag.
    pub tag: AckTag,
    /// When the leader received it, on the leader's clock (`x`).
    pub received_ns: u64,
    /// Whether the node is a voter of the leader's current configuration.
    pub is_voter: bool,
    /// raft's matched index for the node, after stepping the acknowledgement.
    pub matched: u64,
}

/// Why no read lease was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Only a current voter holds a read lease.
    NotVoter,
    /// The acknowledgement is of another term than the one led.
    OtherTerm,
    /// The leader holds no lease of its own now: a grant may never outlive it.
    NoLeaderLease,
    /// The holder lags: its matched index is below the exposed index.
    Lagging {
        /// Its matched index.
        matched: u64,
        /// The exposed index.
        exposed: u64,
    },
    /// A leadership transfer is under way, or `MsgTimeoutNow` left in this term.
    Transferring,
}

/// What the leader counts of one holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holding {
    /// The holder's read lease may be valid before this instant of the leader's clock
    /// (exclusive). Only moves later.
    until_ns: u64,
    /// The term of the latest grant to it.
    term: u64,
    /// The highest index the holder is known to have persisted. Only moves up: kept here,
    /// not in raft, so a holder removed and added back (raft gives it a fresh progress at 0)
    /// is still counted with what it had.
    matched: u64,
    /// The boot of the tags last granted, and the highest sequence granted in it: a give-up of
    /// that boot through this sequence or later voids every grant to that boot.
    boot: u64,
    max_seq: u64,
    /// The end of the grants made to other boots of the holder (0: none). A give-up speaks for
    /// its own boot only: until then the holder stays counted (a restarted holder never takes
    /// a grant of its earlier boot, nor gives one up).
    other_boots_until_ns: u64,
}

/// The grants a node made, counted across step-downs and terms until each has ended (a node
/// re-elected at once must not expose past a holder it still counts), and the exposed index.
#[derive(Debug, Clone)]
pub struct GrantTable {
    /// `G`: the longest grant, on the leader's clock.
    max_grant_ns: u64,
    drift_ppm: u64,
    margin_ns: u64,
    holders: BTreeMap<u64, Holding>,
    /// `E`: never goes down.
    exposed: u64,
    /// No grant in this term (a transfer is under way, or `MsgTimeoutNow` left in it).
    stopped_term: Option<u64>,
    /// Negative control (tests only): the exposed index follows the commit index alone.
    expose_commit: bool,
    /// Negative control (tests only): grants are not capped by the leader's own lease.
    uncapped: bool,
    /// Negative control (tests only): a holder lagging behind `E` is granted all the same.
    grant_lagging: bool,
}

impl GrantTable {
    /// A table granting at most `max_grant_ns`, with the leader's `ρ` and `ε`.
    pub fn new(max_grant_ns: u64, drift_ppm: u64, margin_ns: u64) -> Self {
        assert!(max_grant_ns > 0, "a grant must be positive");
        assert!(drift_ppm <= MAX_DRIFT_PPM, "ρ {drift_ppm} ppm out of range");
        GrantTable {
            max_grant_ns,
            drift_ppm,
            margin_ns,
            holders: BTreeMap::new(),
            exposed: 0,
            stopped_term: None,
            expose_commit: false,
            uncapped: false,
            grant_lagging: false,
        }
    }

    /// Negative control: expose up to the commit index whatever the holders have.
    #[doc(hidden)]
    pub fn control_expose_commit(mut self) -> Self {
        self.expose_commit = true;
        self
    }

    /// Negative control: grant `G` whatever the leader's own lease has left.
    #[doc(hidden)]
    pub fn control_uncapped(mut self) -> Self {
        self.uncapped = true;
        self
    }

    /// Negative control: grant a holder whose matched index is below `E`.
    #[doc(hidden)]
    pub fn control_grant_lagging(mut self) -> Self {
        self.grant_lagging = true;
        self
    }

    /// Answer an acknowledgement of `term` (the term led) with a grant, if every rule allows:
    /// a current voter, an acknowledgement of this term, the leader's own lease valid until
    /// `leader_until_ns` past its receipt, the holder caught up to `E`, no transfer under way.
    /// The grant is `min(G, λ − x)`, and the holder is counted until `x + g`.
    pub fn grant(
        &mut self,
        req: GrantRequest,
        term: u64,
        leader_until_ns: Option<u64>,
    ) -> Result<Grant, Refusal> {
        if !req.is_voter {
            return Err(Refusal::NotVoter);
        }
        if req.tag.term != term {
            return Err(Refusal::OtherTerm);
        }
        if self.stopped_term == Some(term) {
            return Err(Refusal::Transferring);
        }
        let x = req.received_ns;
        let Some(lambda) = leader_until_ns.filter(|&l| l > x) else {
            return Err(Refusal::NoLeaderLease);
        };
        let matched = self.matched_of(req.holder).max(req.matched);
        if matched < self.exposed && !self.grant_lagging {
            return Err(Refusal::Lagging {
                matched,
                exposed: self.exposed,
            });
        }
        let left_ns = if self.uncapped { u64::MAX } else { lambda - x };
        let grant_ns = self.max_grant_ns.min(left_ns);
        let until_ns = x + grant_ns;
        assert!(
            until_ns <= lambda || self.uncapped,
            "a grant past the leader's own lease"
        );
        let h = self.holders.entry(req.holder).or_insert(Holding {
            until_ns,
            term,
            matched,
            boot: req.tag.boot,
            max_seq: req.tag.seq,
            other_boots_until_ns: 0,
        });
        if h.boot != req.tag.boot {
            h.other_boots_until_ns = h.other_boots_until_ns.max(h.until_ns);
            (h.boot, h.max_seq) = (req.tag.boot, req.tag.seq);
        }
        h.max_seq = h.max_seq.max(req.tag.seq);
        (h.until_ns, h.term, h.matched) = (h.until_ns.max(until_ns), term, matched);
        Ok(Grant {
            term,
            tag: req.tag,
            grant_ns,
            drift_ppm: self.drift_ppm,
            margin_ns: self.margin_ns,
        })
    }

    fn matched_of(&self, holder: u64) -> u64 {
        self.holders.get(&holder).map_or(0, |h| h.matched)
    }

    /// raft's matched index for `holder` moved to `matched` (the table keeps the highest).
    pub fn on_matched(&mut self, holder: u64, matched: u64) {
        if let Some(h) = self.holders.get_mut(&holder) {
            h.matched = h.matched.max(matched);
        }
    }

    /// `holder` gave up, at `now_ns`, every grant of `given.term` (and earlier) answering its
    /// tags of `given.boot` up to `given.seq`. It is no longer counted if that covers every
    /// grant made to it that may live: a grant to a later tag (the give-up overtaken on its
    /// way), or to another boot, keeps it counted until that grant ends. Returns whether it is
    /// no longer counted.
    pub fn on_give_up(&mut self, holder: u64, given: AckTag, now_ns: u64) -> bool {
        let Some(h) = self.holders.get(&holder) else {
            return true;
        };
        let covered = h.term <= given.term
            && h.boot == given.boot
            && h.max_seq <= given.seq
            && h.other_boots_until_ns <= now_ns;
        if covered {
            self.holders.remove(&holder);
        }
        debug_assert!(covered != self.holders.contains_key(&holder));
        covered
    }

    /// Recompute `E` at `now_ns` from raft's `commit`: the smallest matched index of every
    /// holder that may still be valid, capped at `commit`; only once an entry of the leader's
    /// term is committed (`committed_in_term`). `E` never goes down. Returns it.
    pub fn expose(&mut self, commit: u64, committed_in_term: bool, now_ns: u64) -> u64 {
        self.holders.retain(|_, h| h.until_ns > now_ns);
        if !committed_in_term {
            return self.exposed;
        }
        let lowest = self.holders.values().map(|h| h.matched).min();
        let computed = match lowest {
            Some(m) if !self.expose_commit => commit.min(m),
            _ => commit,
        };
        self.exposed = self.exposed.max(computed);
        debug_assert!(
            self.expose_commit
                || self.grant_lagging
                || self.holders.values().all(|h| h.matched >= self.exposed),
            "E {} past a live holder's matched index",
            self.exposed
        );
        self.exposed
    }

    /// `E` as last published.
    pub fn exposed(&self) -> u64 {
        self.exposed
    }

    /// A transfer is under way in `term`, or `MsgTimeoutNow` left in it: no grant in `term`.
    pub fn stop_granting(&mut self, term: u64) {
        self.stopped_term = Some(term);
    }

    /// raft gave the transfer up before `MsgTimeoutNow` left: granting may resume.
    pub fn resume_granting(&mut self) {
        self.stopped_term = None;
    }

    /// Whether every grant has ended by `now_ns` on the leader's clock (a held `MsgTimeoutNow`
    /// may leave, and the node may campaign).
    pub fn all_ended(&self, now_ns: u64) -> bool {
        self.holders.values().all(|h| h.until_ns <= now_ns)
    }

    /// The instant the last grant ends (0: none).
    pub fn last_end_ns(&self) -> u64 {
        self.holders.values().map(|h| h.until_ns).max().unwrap_or(0)
    }

    /// The first instant (`now_ns` at the earliest) at which a grant to a holder whose matched
    /// index is below `commit` ends: `E` may move then with no message (`None`: no holder holds
    /// it back).
    pub fn next_unblock_ns(&self, commit: u64, now_ns: u64) -> Option<u64> {
        let blocking = self.holders.values().filter(|h| h.matched < commit);
        blocking.map(|h| h.until_ns.max(now_ns)).min() // one ended but not yet pruned: now
    }

    /// Whether `holder` may hold a read lease at `now_ns`.
    pub fn counts(&self, holder: u64, now_ns: u64) -> bool {
        self.holders
            .get(&holder)
            .is_some_and(|h| h.until_ns > now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000;

    fn req(holder: u64, x: u64, matched: u64) -> GrantRequest {
        GrantRequest {
            holder,
            tag: AckTag {
                term: 3,
                boot: 1,
                seq: x,
            },
            received_ns: x,
            is_voter: true,
            matched,
        }
    }

    #[test]
    fn a_grant_is_capped_by_the_leaders_own_lease_and_counted_from_receipt() {
        let mut t = GrantTable::new(G, 10_000, 5);
        let g = t.grant(req(2, 100, 7), 3, Some(5_000)).unwrap();
        assert_eq!((g.grant_ns, g.drift_ppm, g.margin_ns), (G, 10_000, 5));
        let g = t.grant(req(3, 4_600, 7), 3, Some(5_000)).unwrap();
        assert_eq!(g.grant_ns, 400, "λ − x");
        assert!(t.counts(3, 4_999) && !t.counts(3, 5_000));
        assert_eq!(
            t.grant(req(3, 5_000, 7), 3, Some(5_000)),
            Err(Refusal::NoLeaderLease)
        );
        assert_eq!(t.grant(req(3, 10, 7), 3, None), Err(Refusal::NoLeaderLease));
    }

    #[test]
    fn grants_only_to_caught_up_voters_of_the_term_and_none_while_transferring() {
        let mut t = GrantTable::new(G, 0, 0);
        t.expose(9, true, 0);
        assert_eq!(
            t.grant(req(2, 1, 8), 3, Some(G)),
            Err(Refusal::Lagging {
                matched: 8,
                exposed: 9
            })
        );
        let not_voter = GrantRequest {
            is_voter: false,
            ..req(2, 1, 9)
        };
        assert_eq!(t.grant(not_voter, 3, Some(G)), Err(Refusal::NotVoter));
        assert_eq!(t.grant(req(2, 1, 9), 4, Some(G)), Err(Refusal::OtherTerm));
        t.stop_granting(3);
        assert_eq!(
            t.grant(req(2, 1, 9), 3, Some(G)),
            Err(Refusal::Transferring)
        );
        t.resume_granting();
        assert!(t.grant(req(2, 1, 9), 3, Some(G)).is_ok());
    }

    #[test]
    fn the_exposed_index_waits_for_every_live_holder_and_never_goes_down() {
        let mut t = GrantTable::new(G, 0, 0);
        t.grant(req(2, 0, 5), 3, Some(G)).unwrap();
        assert_eq!(
            t.expose(9, false, 10),
            0,
            "nothing before a commit in the term"
        );
        assert_eq!(t.expose(9, true, 10), 5, "holder 2 has only 5");
        t.on_matched(2, 8);
        assert_eq!(t.expose(9, true, 20), 8);
        t.on_matched(2, 3);
        assert_eq!(
            t.expose(9, true, 30),
            8,
            "a lower matched index never lowers E"
        );
        assert_eq!(t.expose(12, true, G), 12, "the grant ended at G");
        assert!(t.all_ended(G));
    }

    fn given(term: u64, boot: u64, seq: u64) -> AckTag {
        AckTag { term, boot, seq }
    }

    #[test]
    fn a_give_up_ends_only_the_grants_it_covers() {
        let mut t = GrantTable::new(G, 0, 0);
        t.grant(req(2, 0, 5), 3, Some(G)).unwrap();
        t.grant(req(2, 7, 5), 3, Some(G)).unwrap();
        assert!(!t.on_give_up(2, given(2, 1, 9), 10), "of an earlier term");
        assert!(!t.on_give_up(2, given(3, 2, 9), 10), "of another boot");
        assert!(
            !t.on_give_up(2, given(3, 1, 6), 10),
            "tag 7 was granted after the give-up left: still counted"
        );
        assert!(t.counts(2, 10));
        assert!(t.on_give_up(2, given(3, 1, 7), 10));
        assert!(!t.counts(2, 10));
        assert_eq!(t.last_end_ns(), 0);
        assert!(
            t.on_give_up(2, given(3, 1, 7), 10),
            "a duplicate: nothing left"
        );
    }

    /// A holder restarted (boot 2) while a grant to its earlier boot lives: a give-up speaks for
    /// its own boot only. Boot 1's give-up, delayed, must not end boot 2's grant; boot 2's ends
    /// the holder only once boot 1's grant has ended too.
    #[test]
    fn a_give_up_speaks_for_its_own_boot_only() {
        let mut t = GrantTable::new(G, 0, 0);
        t.grant(req(2, 5, 5), 3, Some(G)).unwrap();
        let restarted = GrantRequest {
            tag: given(3, 2, 1),
            ..req(2, 6, 5)
        };
        t.grant(restarted, 3, Some(2 * G)).unwrap();
        assert!(!t.on_give_up(2, given(3, 1, 9), 7), "the earlier boot's");
        assert!(!t.on_give_up(2, given(3, 2, 1), 7), "boot 1's grant lives");
        assert!(t.counts(2, 7));
        assert!(
            !t.on_give_up(2, given(3, 1, 9), G),
            "boot 1's, once its grant has ended: boot 2's lives"
        );
        assert!(
            t.on_give_up(2, given(3, 2, 1), G),
            "boot 1's grant has ended"
        );
        assert!(!t.counts(2, G));
    }

    #[test]
    fn control_a_lagging_holder_is_granted_and_holds_the_exposed_index_where_it_is() {
        let mut t = GrantTable::new(G, 0, 0).control_grant_lagging();
        t.expose(9, true, 0);
        assert!(
            t.grant(req(2, 1, 8), 3, Some(G)).is_ok(),
            "the bug: 8 < E 9"
        );
        assert_eq!(
            t.expose(12, true, 2),
            9,
            "E never goes down, nor past the holder"
        );
    }

    #[test]
    fn control_exposing_the_commit_index_passes_a_live_holder() {
        let mut t = GrantTable::new(G, 0, 0).control_expose_commit();
        t.grant(req(2, 0, 5), 3, Some(G)).unwrap();
        assert_eq!(t.expose(9, true, 10), 9, "the bug: past holder 2's 5");
    }
}
