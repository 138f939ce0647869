//! The holder's side of a follower read lease: the tags on its acknowledgements with their send
//! times, the read lease a grant gives it, the exposed index it knows, and whether a read may be
//! served locally. Pure: time comes in as arguments.

use std::collections::BTreeMap;

use crate::config::MAX_DRIFT_PPM;
use crate::follower::grants::{AckTag, Grant};

/// Send times kept at most; the oldest is forgotten first (a grant for it then gives nothing).
pub const MAX_TAGS: usize = 1_024;

const PPM: u128 = 1_000_000;

/// Why a read cannot be served locally now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalRefusal {
    /// No read lease is held (never granted, ended, given up, or another term).
    NoReadLease,
    /// Applied is below the exposed index known: wait for it to apply.
    Behind {
        /// The applied index.
        applied: u64,
        /// The exposed index known.
        exposed: u64,
    },
    /// An entry persisted above applied writes a key the read needs: wait for `E` to move.
    PendingWrite,
}

/// One replica's read lease.
#[derive(Debug, Clone)]
pub struct ReadLease {
    /// This replica's boot: tags of another boot are never its own.
    boot: u64,
    /// The last tag counter used in this boot.
    last_seq: u64,
    /// The local send time `a` of each tag still worth a grant, read before the transport had it.
    sent_ns: BTreeMap<AckTag, u64>,
    /// Reads may be served before this local instant (exclusive), in `lease_term`.
    until_ns: u64,
    lease_term: u64,
    /// What this replica gave up last: every grant of `gave_up.term` answering a tag of this
    /// boot up to `gave_up.seq`, and every grant of an earlier term, is ignored (a grant that
    /// was on its way when the give-up left must not revive the lease). Grants answering later
    /// tags count: the leader sees the give-up before, or counts them after.
    gave_up: AckTag,
    /// The largest exposed index received from any leader (each is a committed index).
    exposed: u64,
    drift_ppm: u64,
    margin_ns: u64,
    /// Negative control (tests only): the lease counted from the grant's receipt, not from `a`.
    from_receipt: bool,
    /// Negative control (tests only): the tag counter never moves.
    reuse_tags: bool,
    /// Negative control (tests only): a grant a give-up voided is taken all the same.
    accept_voided: bool,
}

impl ReadLease {
    /// The read lease of a replica in boot `boot` (bumped at every start), assuming `ρ` and `ε`.
    pub fn new(boot: u64, drift_ppm: u64, margin_ns: u64) -> Self {
        assert!(drift_ppm <= MAX_DRIFT_PPM, "ρ {drift_ppm} ppm out of range");
        ReadLease {
            boot,
            last_seq: 0,
            sent_ns: BTreeMap::new(),
            until_ns: 0,
            lease_term: 0,
            gave_up: AckTag {
                term: 0,
                boot,
                seq: 0,
            },
            exposed: 0,
            drift_ppm,
            margin_ns,
            from_receipt: false,
            reuse_tags: false,
            accept_voided: false,
        }
    }

    /// Negative control: a grant that arrives after the give-up it was overtaken by is taken.
    #[doc(hidden)]
    pub fn control_accept_voided(mut self) -> Self {
        self.accept_voided = true;
        self
    }

    /// Negative control: count the lease from the grant's receipt.
    #[doc(hidden)]
    pub fn control_from_receipt(mut self) -> Self {
        self.from_receipt = true;
        self
    }

    /// Negative control: every acknowledgement of a term carries the same tag, so a grant for
    /// an early one is counted from the latest one's send time.
    #[doc(hidden)]
    pub fn control_reuse_tags(mut self) -> Self {
        self.reuse_tags = true;
        self
    }

    /// A fresh tag for an acknowledgement of `term` about to be handed to the transport; its
    /// send time `now_ns` is read now, before sending.
    pub fn tag(&mut self, term: u64, now_ns: u64) -> AckTag {
        if !self.reuse_tags || self.last_seq == 0 {
            self.last_seq += 1;
        }
        let tag = AckTag {
            term,
            boot: self.boot,
            seq: self.last_seq,
        };
        debug_assert!(
            self.reuse_tags || !self.sent_ns.contains_key(&tag),
            "a tag used twice: {tag:?}"
        );
        self.sent_ns.insert(tag, now_ns);
        while self.sent_ns.len() > MAX_TAGS {
            self.sent_ns.pop_first();
        }
        tag
    }

    /// A grant arrived at `now_ns` while this replica is in `term`. It counts only for a tag of
    /// this boot still known, in `term`, not given up. Returns whether the lease moved later.
    pub fn on_grant(&mut self, grant: &Grant, term: u64, now_ns: u64) -> bool {
        let ours = grant.tag.boot == self.boot && grant.tag.term == grant.term;
        if !ours || grant.term != term || (self.voids(grant) && !self.accept_voided) {
            return false;
        }
        let Some(&sent_ns) = self.sent_ns.get(&grant.tag) else {
            return false; // forgotten, or never sent: renews nothing
        };
        assert!(sent_ns <= now_ns, "a grant before its acknowledgement left");
        let from_ns = if self.from_receipt { now_ns } else { sent_ns };
        let until_ns = from_ns.saturating_add(self.lease_ns(grant));
        if self.lease_term != grant.term {
            (self.lease_term, self.until_ns) = (grant.term, 0);
        }
        let later = until_ns > self.until_ns;
        self.until_ns = self.until_ns.max(until_ns);
        later
    }

    /// `g·(1−ρ̂)/(1+ρ̂) − ε̂`, with `ρ̂` and `ε̂` the larger of this replica's and the grant's:
    /// at most `g/(1+ρ)` of real time, while the leader counts at least that long.
    fn lease_ns(&self, grant: &Grant) -> u64 {
        if grant.drift_ppm > MAX_DRIFT_PPM {
            return 0;
        }
        let rho = self.drift_ppm.max(grant.drift_ppm) as u128;
        let scaled = grant.grant_ns as u128 * (PPM - rho) / (PPM + rho);
        let lease_ns = (scaled as u64).saturating_sub(self.margin_ns.max(grant.margin_ns));
        debug_assert!(lease_ns <= grant.grant_ns);
        lease_ns
    }

    /// Whether a give-up voided `grant` (of this boot): a grant of an earlier term than the
    /// give-up's, or of its term for a tag sent before it.
    fn voids(&self, grant: &Grant) -> bool {
        debug_assert_eq!(grant.tag.boot, self.boot);
        let g = &self.gave_up;
        grant.term < g.term || (grant.term == g.term && grant.tag.seq <= g.seq)
    }

    /// Give up every grant of `term` and of earlier terms the leader asked for (a transfer or a
    /// membership change waits for it): the lease ends now, and every grant answering a tag
    /// sent so far, delayed or duplicated, is ignored. Returns what to tell the leader: the last
    /// tag voided (`None`: this boot sent no tag, so it holds no grant). The leader stops
    /// counting this holder only once every grant it made it answers a tag up to that one.
    pub fn give_up(&mut self, term: u64) -> Option<AckTag> {
        let given = AckTag {
            term,
            boot: self.boot,
            seq: self.last_seq,
        };
        if (given.term, given.seq) > (self.gave_up.term, self.gave_up.seq) {
            self.gave_up = given;
        }
        if self.lease_term <= term {
            self.until_ns = 0;
        }
        debug_assert!(self.until_ns == 0 || self.lease_term > term);
        (self.last_seq > 0).then_some(self.gave_up)
    }

    /// The term of the last grant taken (0: none yet).
    pub fn term(&self) -> u64 {
        self.lease_term
    }

    /// A leader's exposed index arrived (kept if larger).
    pub fn on_exposed(&mut self, exposed: u64) {
        self.exposed = self.exposed.max(exposed);
    }

    /// The exposed index known: apply no further.
    pub fn exposed(&self) -> u64 {
        self.exposed
    }

    /// Whether the read lease is valid at `now_ns`.
    pub fn is_valid(&self, now_ns: u64) -> bool {
        now_ns < self.until_ns
    }

    /// The lease's end (exclusive; 0: none).
    pub fn until_ns(&self) -> u64 {
        self.until_ns
    }

    /// Whether a read may be served locally at `now_ns`, with `applied` applied and
    /// `pending_touches` telling whether an entry persisted above applied writes its keys.
    /// Read the state, then ask again: read first, validate second.
    pub fn check_local(
        &self,
        now_ns: u64,
        applied: u64,
        pending_touches: bool,
    ) -> Result<(), LocalRefusal> {
        if !self.is_valid(now_ns) {
            return Err(LocalRefusal::NoReadLease);
        }
        if applied < self.exposed {
            return Err(LocalRefusal::Behind {
                applied,
                exposed: self.exposed,
            });
        }
        if pending_touches {
            return Err(LocalRefusal::PendingWrite);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(tag: AckTag, grant_ns: u64) -> Grant {
        Grant {
            term: tag.term,
            tag,
            grant_ns,
            drift_ppm: 10_000,
            margin_ns: 2,
        }
    }

    #[test]
    fn the_lease_runs_from_the_acknowledgements_send_time() {
        let mut h = ReadLease::new(1, 0, 0);
        let tag = h.tag(5, 100);
        assert!(h.on_grant(&grant(tag, 1_010), 5, 400));
        // 1010 × 0.99/1.01 − 2 = 988 (rounded down), from a = 100.
        assert_eq!(h.until_ns(), 100 + 988);
        assert!(h.is_valid(1_087) && !h.is_valid(1_088));
    }

    #[test]
    fn unknown_tags_other_terms_and_given_up_terms_grant_nothing() {
        let mut h = ReadLease::new(1, 0, 0);
        let tag = h.tag(5, 100);
        let other_boot = AckTag { boot: 2, ..tag };
        assert!(
            !h.on_grant(&grant(other_boot, 1_000), 5, 200),
            "another boot's tag"
        );
        assert!(
            !h.on_grant(&grant(tag, 1_000), 6, 200),
            "the replica moved to term 6"
        );
        assert_eq!(h.give_up(5), Some(tag), "gives up through its last tag");
        assert!(
            !h.on_grant(&grant(tag, 1_000), 5, 200),
            "a grant after the give-up"
        );
        assert!(!h.is_valid(200));
        let later = h.tag(6, 300);
        assert!(
            h.on_grant(&grant(later, 1_000), 6, 310),
            "the next term grants again"
        );
    }

    /// The hazard: a grant on its way when the holder gave up arrives after it. The leader
    /// stops counting the holder on the give-up, so the grant must revive nothing; a grant for
    /// a tag sent after the give-up counts (the leader counts it too).
    #[test]
    fn a_give_up_overtaken_by_a_delayed_grant_of_its_term_is_not_undone() {
        let mut h = ReadLease::new(1, 0, 0);
        let before = h.tag(5, 100);
        assert!(h.on_grant(&grant(before, 1_000), 5, 150));
        let in_flight = h.tag(5, 200);
        let given = h.give_up(5).expect("tags were sent");
        assert_eq!(given, in_flight);
        assert!(!h.is_valid(250), "ended at once");
        assert!(!h.on_grant(&grant(in_flight, 1_000), 5, 300), "voided");
        assert!(!h.is_valid(300));
        let after = h.tag(5, 400);
        assert!(
            h.on_grant(&grant(after, 1_000), 5, 450),
            "a later tag counts"
        );
        assert_eq!(h.give_up(4), Some(given), "an older ask moves nothing back");
        assert!(
            h.is_valid(500),
            "a give-up of an earlier term leaves term 5's lease"
        );
    }

    #[test]
    fn control_accepting_a_voided_grant_revives_the_lease() {
        let mut h = ReadLease::new(1, 0, 0).control_accept_voided();
        let in_flight = h.tag(5, 200);
        h.give_up(5);
        assert!(h.on_grant(&grant(in_flight, 1_000), 5, 300), "the bug");
        assert!(h.is_valid(300));
    }

    #[test]
    fn a_holder_that_never_tagged_has_nothing_to_give_up() {
        let mut h = ReadLease::new(1, 0, 0);
        assert_eq!(h.give_up(3), None);
    }

    #[test]
    fn a_read_waits_for_the_exposed_index_and_for_pending_writes_of_its_keys() {
        let mut h = ReadLease::new(1, 0, 0);
        let tag = h.tag(5, 0);
        h.on_grant(&grant(tag, 1_000), 5, 1);
        h.on_exposed(7);
        h.on_exposed(4);
        assert_eq!(h.exposed(), 7, "never goes down");
        assert_eq!(
            h.check_local(10, 6, false),
            Err(LocalRefusal::Behind {
                applied: 6,
                exposed: 7
            })
        );
        assert_eq!(h.check_local(10, 7, true), Err(LocalRefusal::PendingWrite));
        assert_eq!(h.check_local(10, 7, false), Ok(()));
        assert_eq!(
            h.check_local(5_000, 7, false),
            Err(LocalRefusal::NoReadLease)
        );
    }

    #[test]
    fn control_one_tag_for_every_acknowledgement_counts_from_the_latest() {
        let mut h = ReadLease::new(1, 0, 0).control_reuse_tags();
        let first = h.tag(5, 100);
        let second = h.tag(5, 300);
        assert_eq!(first, second, "the bug: the counter never moves");
        assert!(h.on_grant(&grant(first, 1_010), 5, 400));
        assert_eq!(h.until_ns(), 300 + 988, "counted from the second send time");
    }

    #[test]
    fn old_tags_are_forgotten_and_then_grant_nothing() {
        let mut h = ReadLease::new(1, 0, 0);
        let first = h.tag(5, 0);
        for i in 0..MAX_TAGS as u64 {
            h.tag(5, i + 1);
        }
        assert!(!h.on_grant(&grant(first, 1_000), 5, 2_000));
    }
}
