//! The published encoding (a 16-byte slot: the lease, and a stamp of the epoch and whether apply
//! is behind; the indexes beside it) must give every read the verdict the four published values
//! it summarizes give: the differential test below drives the raft thread's side at random,
//! also in the middle of a read, and checks each attempt against that rule and the safety
//! property itself. Each negative control publishes with one piece of the encoding broken, and
//! must be caught.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::clock::SimClock;

/// What the raft thread last published, in full (the values the slot and stamp summarize).
#[derive(Debug, Clone, Copy, Default)]
struct Model {
    commit: u64,
    applied: u64,
    lease_until_ns: u64,
    /// Revocations so far.
    epoch: u64,
}

/// How the raft thread's side publishes and revokes: [`Shared`]'s own, or a broken one.
#[derive(Clone, Copy)]
struct Publisher {
    publish: fn(&Shared<SimClock>, u64, u64, u64),
    revoke: fn(&Shared<SimClock>),
}

const CORRECT: Publisher = Publisher {
    publish: Shared::publish,
    revoke: Shared::revoke,
};

/// One group's shared state, the clock, a handle, and the model of what was published.
struct Rig {
    shared: Arc<Shared<SimClock>>,
    clock: SimClock,
    handle: ReadHandle<SimClock>,
    model: Model,
    publisher: Publisher,
    rng: ChaCha8Rng,
    /// The last lease published, reused after a revocation (a new term's lease at the same
    /// instant is what an epoch must catch).
    last_until_ns: u64,
}

impl Rig {
    fn new(publisher: Publisher, seed: u64) -> Rig {
        let clock = SimClock::new(1_000, 0);
        let shared = Arc::new(Shared::new(Slot::alone(Arc::new(clock.clone()))));
        let handle = ReadHandle::new(shared.clone());
        Rig {
            shared,
            clock,
            handle,
            model: Model::default(),
            publisher,
            rng: ChaCha8Rng::seed_from_u64(seed),
            last_until_ns: 0,
        }
    }

    fn publish(&mut self, commit: u64, applied: u64, lease_until_ns: u64) {
        assert!(applied <= commit && commit >= self.model.commit);
        (self.publisher.publish)(&self.shared, commit, applied, lease_until_ns);
        self.model.commit = commit;
        self.model.applied = applied;
        self.model.lease_until_ns = lease_until_ns;
        if lease_until_ns != 0 {
            self.last_until_ns = lease_until_ns;
        }
    }

    fn revoke(&mut self) {
        (self.publisher.revoke)(&self.shared);
        self.model.lease_until_ns = 0;
        self.model.epoch += 1;
    }

    /// One random move of the raft thread (or of time).
    fn step(&mut self) {
        let now_ns = self.clock.now_ns();
        match self.rng.gen_range(0..10) {
            0..=5 => {
                let commit = self.model.commit + self.rng.gen_range(0..3);
                let applied = self.rng.gen_range(self.model.applied..=commit);
                let until_ns = match self.rng.gen_range(0..4) {
                    0 => 0,
                    1 if self.last_until_ns > now_ns => self.last_until_ns,
                    _ => now_ns + self.rng.gen_range(1..100),
                };
                self.publish(commit, applied, until_ns);
            }
            6 => self.revoke(),
            _ => self.clock.advance(self.rng.gen_range(0..60)),
        }
    }

    /// One attempt, with raft-thread moves before the state is read and after it (during the
    /// read), checked against the rule. `wait_for` is the commit index the read captured.
    fn attempt(&mut self, wait_for: &mut Option<u64>) -> Result<Result<u64, Attempt>, String> {
        let start = self.model;
        let start_now_ns = self.clock.now_ns();
        let (before, after) = (self.rng.gen_range(0..3), self.rng.gen_range(0..3));
        let handle = ReadHandle::new(self.shared.clone());
        let captured = *wait_for;
        let mut seen = None;
        let got = handle.attempt(wait_for, || {
            (0..before).for_each(|_| self.step());
            let state = self.model.applied; // what the caller's state reflects
            (0..after).for_each(|_| self.step());
            seen = Some((state, self.model, self.clock.now_ns()));
            state
        });
        let expected = match (refused(start, start_now_ns, captured), seen) {
            (Some(refusal), _) => Err(refusal),
            (None, Some((state, end, now_ns))) => validated(start, state, end, now_ns),
            (None, None) => return Err(format!("{got:?} without reading the state at {start:?}")),
        };
        if got != expected {
            return Err(format!(
                "verdict {got:?}, the rule gives {expected:?}: at the start {start:?} at \
                 {start_now_ns} ns, waiting for {captured:?}; state read, after, now: {seen:?}"
            ));
        }
        if let (Ok(state), Some((_, end, now_ns))) = (got, seen) {
            let needed = captured.unwrap_or(start.commit);
            let held = end.epoch == start.epoch && now_ns < end.lease_until_ns;
            if state < needed || !held {
                return Err(format!(
                    "unsafe read: state {state} (needs {needed}), lease {end:?} at {now_ns} ns \
                     since {start:?}"
                ));
            }
        }
        Ok(got)
    }
}

/// Why the full published values at an attempt's `start` (at `start_now_ns`) refuse to read the
/// state, if they do; `captured` is the commit index an earlier attempt of the read captured.
fn refused(start: Model, start_now_ns: u64, captured: Option<u64>) -> Option<Attempt> {
    if start.lease_until_ns == 0 {
        return Some(Attempt::NotHeld);
    }
    let behind = start.applied < start.commit;
    if behind && start.applied < captured.unwrap_or(start.commit) {
        return Some(match start_now_ns >= start.lease_until_ns {
            true => Attempt::NotHeld,
            false => Attempt::ApplyBehind,
        });
    }
    None
}

/// The verdict on a read that saw `state`, validated at `now_ns` against the values `end`: the
/// lease it began under and the one published at the end must both still hold.
fn validated(start: Model, state: u64, end: Model, now_ns: u64) -> Result<u64, Attempt> {
    let until_ns = start.lease_until_ns.min(end.lease_until_ns);
    match end.epoch == start.epoch && now_ns < until_ns {
        true => Ok(state),
        false => Err(Attempt::NotHeld),
    }
}

/// `reads` random reads (each up to three attempts) with `publisher`: the first disagreement.
fn differential(publisher: Publisher, seed: u64, reads: u32) -> Result<(), String> {
    let mut rig = Rig::new(publisher, seed);
    for read in 0..reads {
        (0..rig.rng.gen_range(0..4)).for_each(|_| rig.step());
        let mut wait_for = None;
        for _ in 0..3 {
            let at = format!("seed {seed}, read {read}");
            match rig
                .attempt(&mut wait_for)
                .map_err(|e| format!("{at}: {e}"))?
            {
                Err(Attempt::ApplyBehind) => (0..rig.rng.gen_range(1..3)).for_each(|_| rig.step()),
                _ => break,
            }
        }
    }
    Ok(())
}

const SEEDS: u64 = 8;
const READS: u32 = 2_000;

#[test]
fn every_read_gets_the_verdict_of_the_full_published_values() {
    for seed in 0..SEEDS {
        if let Err(e) = differential(CORRECT, seed, READS) {
            panic!("{e}");
        }
    }
}

/// Seeds (of the CI ones) on which the broken publisher is caught.
fn caught(publisher: Publisher) -> Vec<u64> {
    (0..SEEDS)
        .filter(|&seed| differential(publisher, seed, READS).is_err())
        .collect()
}

/// Publish with the stamp's "behind" computed from `flag_applied` instead of `applied` (the
/// indexes themselves are published right).
fn publish_flag_from(
    s: &Shared<SimClock>,
    commit: u64,
    applied: u64,
    flag_applied: u64,
    until_ns: u64,
) {
    Shared::publish(s, commit, flag_applied, until_ns);
    s.applied.store(applied, Ordering::Release);
}

/// Asserts that `broken` is caught on some CI seed (`what` says what went unnoticed).
fn assert_caught(broken: Publisher, what: &str) {
    let seeds = caught(broken);
    assert!(!seeds.is_empty(), "{what}: caught on no seed of 0..{SEEDS}");
}

#[test]
fn control_a_stamp_that_never_says_behind_is_caught() {
    fn publish(s: &Shared<SimClock>, commit: u64, applied: u64, until_ns: u64) {
        publish_flag_from(s, commit, applied, commit, until_ns);
    }
    assert_caught(Publisher { publish, ..CORRECT }, "a lost 'behind'");
}

#[test]
fn control_a_behind_flag_off_by_one_is_caught() {
    fn publish(s: &Shared<SimClock>, commit: u64, applied: u64, until_ns: u64) {
        let flag_applied = applied.saturating_add(1).min(commit);
        publish_flag_from(s, commit, applied, flag_applied, until_ns);
    }
    assert_caught(
        Publisher { publish, ..CORRECT },
        "applied = commit - 1 as caught up",
    );
}

#[test]
fn control_a_revocation_without_an_epoch_bump_is_caught() {
    fn revoke(s: &Shared<SimClock>) {
        s.published.get().lease_until_ns.store(0, Ordering::Release);
    }
    assert_caught(
        Publisher { revoke, ..CORRECT },
        "a revocation during a read",
    );
}

#[test]
fn a_waiting_read_waits_for_the_commit_it_captured_not_a_later_one() {
    // A later commit would be a stricter wait (not unsafe), but the rule is the commit at the
    // read's start: a read must not chase a commit index that keeps moving.
    let mut rig = Rig::new(CORRECT, 0);
    rig.publish(5, 3, 10_000);
    let mut wait_for = None;
    assert_eq!(
        rig.handle.attempt(&mut wait_for, || 0),
        Err(Attempt::ApplyBehind)
    );
    rig.publish(7, 5, 10_000); // applied reached the captured 5; commit moved on to 7
    assert_eq!(rig.handle.attempt(&mut wait_for, || 1), Ok(1));
    assert_eq!(
        rig.handle.attempt(&mut None, || 2),
        Err(Attempt::ApplyBehind),
        "recaptured, the commit would be 7 and the read would still wait"
    );
}

#[test]
fn a_read_that_captured_a_commit_waits_for_it_whatever_stamp_it_sees_next() {
    // Publication a (5, 4: behind), publication b (5, 5: not behind), then publication c stores
    // commit 6 but its stamp (behind) is not yet visible to the reader (store order is only
    // guaranteed for loads that synchronize). An attempt that captured 6 from c must not serve
    // state at 5 because b's stamp says "not behind" (a case of the 16-byte slots).
    let rig = Rig::new(CORRECT, 0);
    rig.shared.publish(5, 4, 10_000);
    rig.shared.publish(5, 5, 10_000);
    rig.shared.commit.store(6, Ordering::Release); // c's first store; its stamp lags
    let mut wait_for = Some(6);
    assert_eq!(
        rig.handle.attempt(&mut wait_for, || 5),
        Err(Attempt::ApplyBehind)
    );
    rig.shared.publish(6, 6, 10_000);
    assert_eq!(rig.handle.attempt(&mut wait_for, || 6), Ok(6));
}

#[test]
fn a_read_never_serves_state_behind_the_commit_at_its_start() {
    let rig = Rig::new(CORRECT, 0);
    rig.shared.publish(5, 4, 10_000);
    assert_eq!(rig.handle.try_read(|| ()), Err(ReadError::LeaseNotHeld));
    rig.shared.publish(5, 5, 10_000);
    assert_eq!(rig.handle.try_read(|| 5), Ok(5));
}

#[test]
fn a_revocation_and_a_new_lease_to_the_same_instant_during_the_read_fail_it() {
    let rig = Rig::new(CORRECT, 0);
    rig.shared.publish(5, 5, 10_000);
    let read = rig.handle.try_read(|| {
        rig.shared.revoke(); // a new term ...
        rig.shared.publish(6, 6, 10_000); // ... whose lease happens to end at the same instant
    });
    assert_eq!(read, Err(ReadError::LeaseNotHeld));
    assert_eq!(
        rig.handle.try_read(|| 6),
        Ok(6),
        "the next read is under the new lease"
    );
}

#[test]
fn a_handle_is_24_bytes_and_a_slot_16() {
    assert_eq!(std::mem::size_of::<ReadHandle<SimClock>>(), 24);
    assert_eq!(std::mem::size_of::<Published>(), 16);
    let mut table = LeaseTable::new(Arc::new(SimClock::new(0, 0)));
    let slots: Vec<Slot<SimClock>> = (0..CHUNK_SLOTS + 1).map(|_| table.slot()).collect();
    let (a, b) = (slots[0].get() as *const _, slots[1].get() as *const _);
    assert_eq!(b as usize - a as usize, 16, "slots of one table are dense");
    assert!(
        !Arc::ptr_eq(&slots[0].chunk, &slots[CHUNK_SLOTS].chunk),
        "a full chunk is followed by a new one"
    );
}

/// A follower's read lease that lapses and is renewed while a read runs, in one epoch: the read
/// began under the lapsed lease, and a write may have been exposed without this holder in the
/// lapse, so the renewal does not cover it. Without the check against the lease the read began
/// under, it would be served.
#[test]
fn a_read_begun_under_a_lapsed_lease_is_not_covered_by_its_renewal() {
    let clock = SimClock::new(0, 0);
    let shared = Arc::new(Shared::new(Slot::alone(Arc::new(clock.clone()))));
    shared.publish(5, 5, 1_000);
    let handle = ReadHandle::new(shared.clone());
    let read = handle.read(|| {
        clock.advance(1_500); // the lease lapses while the state is read...
        shared.publish(6, 6, 5_000); // ...and is renewed before it is validated
        "old"
    });
    assert_eq!(read, Err(ReadError::LeaseNotHeld));
    assert_eq!(
        handle.read(|| "new"),
        Ok("new"),
        "a read begun under the renewal"
    );
}
