//! Model checking of the publish/read protocol with loom: every interleaving, and the weak-memory
//! outcomes loom models, of the handle's atomics. `.ci/run` runs it:
//! `tools/loom.sh` (which gives `--cfg raft_lease_loom` to this crate alone).
//!
//! The state a read returns is a relaxed atomic here, so that only the handle's own orderings can
//! make the raft thread's apply visible to the reader: a read that validates must see the state
//! its stamp vouches for. The controls publish with relaxed stores, or revoke nothing, and loom
//! must find the violating execution. What this does not check: relaxing the reader's own stamp
//! loads to `Relaxed` is not caught (tried: the models still pass), so the reader side's orderings
//! rest on the argument written at each load, as before.

use std::sync::Arc;

use loom::sync::atomic::AtomicU64 as State;
use loom::thread;

use super::*;
use crate::clock::SimClock;

type Publish = fn(&Shared<SimClock>, u64, u64, u64);

/// One group's shared state and a handle, with a lease to 10 µs and the clock at 1 µs.
fn rig() -> (Arc<Shared<SimClock>>, ReadHandle<SimClock>) {
    let clock = SimClock::new(1_000, 0);
    let shared = Arc::new(Shared::new(Slot::alone(Arc::new(clock))));
    let handle = ReadHandle::new(shared.clone());
    (shared, handle)
}

/// The raft thread applies entry 5 to the state, then publishes applied = commit = 5; a reader
/// reads at the same time. A read that validates returns the state at 5.
fn apply_then_publish(publish: Publish) {
    loom::model(move || {
        let (shared, handle) = rig();
        Shared::publish(&shared, 5, 4, 10_000); // leading, lease held, entry 5 not applied yet
        let state = Arc::new(State::new(4));
        let (raft_shared, raft_state) = (shared.clone(), state.clone());
        let raft = thread::spawn(move || {
            raft_state.store(5, Ordering::Relaxed); // apply entry 5
            publish(&raft_shared, 5, 5, 10_000);
        });
        if let Ok(value) = handle.try_read(|| state.load(Ordering::Relaxed)) {
            assert_eq!(
                value, 5,
                "a validated read returned state behind the commit index"
            );
        }
        raft.join().unwrap();
    });
}

/// The raft thread revokes the lease (a transfer: this node stops leading), then lets a new
/// leader write elsewhere (MsgTimeoutNow leaves, a release as any channel or socket send is). A
/// read whose state read happened after that must not validate. (A new lease on this node after
/// the revocation is a new term it leads itself: reads then may see its writes; the epoch check
/// for a read spanning both is in the unit tests.)
fn revoke_then_new_leader(revoke: fn(&Shared<SimClock>)) {
    loom::model(move || {
        let (shared, handle) = rig();
        Shared::publish(&shared, 5, 5, 10_000);
        let new_leader_may_write = Arc::new(State::new(0));
        let (raft_shared, flag) = (shared.clone(), new_leader_may_write.clone());
        let raft = thread::spawn(move || {
            revoke(&raft_shared);
            flag.store(1, Ordering::Release);
        });
        if let Ok(seen) = handle.try_read(|| new_leader_may_write.load(Ordering::Acquire)) {
            assert_eq!(
                seen, 0,
                "a read that overlapped the new leader's time validated"
            );
        }
        raft.join().unwrap();
    });
}

/// Publish with every store relaxed: the stamp no longer carries the apply to the reader.
fn relaxed_publish(s: &Shared<SimClock>, commit: u64, applied: u64, until_ns: u64) {
    let p = s.published.get();
    s.commit.store(commit, Ordering::Relaxed);
    s.applied.store(applied, Ordering::Relaxed);
    let stamp = p.stamp.load(Ordering::Relaxed) & !BEHIND;
    p.stamp
        .store(stamp | u64::from(applied < commit), Ordering::Relaxed);
    p.lease_until_ns.store(until_ns, Ordering::Relaxed);
}

/// The model failed on its own assertion (`what`), not on anything else.
fn assert_found(found: std::thread::Result<()>, what: &str) {
    let payload = found.expect_err("loom found no violating execution");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains(what),
        "the model failed otherwise: {message}"
    );
}

#[test]
fn a_validated_read_sees_the_state_its_stamp_vouches_for() {
    apply_then_publish(Shared::publish);
}

#[test]
fn a_read_overlapping_a_revocation_never_validates() {
    revoke_then_new_leader(Shared::revoke);
}

#[test]
fn control_a_revocation_that_changes_nothing_lets_a_read_overlap_the_new_leader() {
    let found = std::panic::catch_unwind(|| revoke_then_new_leader(|_| {}));
    assert_found(found, "overlapped the new leader");
}

#[test]
fn control_a_relaxed_publish_lets_a_read_return_state_behind_the_commit() {
    let found = std::panic::catch_unwind(|| apply_then_publish(relaxed_publish));
    assert_found(found, "behind the commit index");
}
