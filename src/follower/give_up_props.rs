//! The property of give-ups, with its negative control: whatever the order in which a holder's
//! acknowledgements, the leader's grants, its asks and the holder's give-ups arrive, the
//! holder's read lease is never valid while its leader no longer counts it. A give-up overtaken
//! by a grant made before it is the hazard (`control_accept_voided`).

use proptest::prelude::*;

use super::{AckTag, Grant, GrantRequest, GrantTable, ReadLease};

/// The holder's id at the leader.
const HOLDER: u64 = 2;
const TERM: u64 = 1;
/// `G` and the leader's own lease, in ns of one shared clock (no drift, no margin).
const G_NS: u64 = 1_000;

/// One step: time passes, or the holder acknowledges, or the leader asks, or the holder
/// restarts (a new boot, its lease gone with the process; messages in flight stay in flight),
/// or a message in flight arrives (picked by index among those in flight, so any order can come
/// up).
#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Ack,
    Ask,
    Restart,
    DeliverUp(usize),
    DeliverDown(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..400u64).prop_map(Step::Wait),
        Just(Step::Ack),
        Just(Step::Ask),
        Just(Step::Restart),
        any::<usize>().prop_map(Step::DeliverUp),
        any::<usize>().prop_map(Step::DeliverDown),
    ]
}

/// A message from the holder to the leader.
#[derive(Debug, Clone, Copy)]
enum Up {
    Ack(AckTag),
    GaveUp(AckTag),
}

/// A message from the leader to the holder.
#[derive(Debug, Clone, Copy)]
enum Down {
    Grant(Grant),
    Ask,
}

/// Runs `steps`; `Err` when the holder's lease is valid while the leader does not count it.
fn check(steps: &[Step], accept_voided: bool) -> Result<(), String> {
    let boot_holder = |boot| match accept_voided {
        true => ReadLease::new(boot, 0, 0).control_accept_voided(),
        false => ReadLease::new(boot, 0, 0),
    };
    let (mut boot, mut holder) = (1, boot_holder(1));
    let mut leader = GrantTable::new(G_NS, 0, 0);
    let (mut now, mut up, mut down) = (0u64, Vec::<Up>::new(), Vec::<Down>::new());
    for s in steps {
        match *s {
            Step::Wait(dt) => now += dt,
            Step::Ack => up.push(Up::Ack(holder.tag(TERM, now))),
            Step::Ask => down.push(Down::Ask),
            Step::Restart => {
                boot += 1;
                holder = boot_holder(boot);
            }
            Step::DeliverUp(i) if !up.is_empty() => match up.remove(i % up.len()) {
                Up::Ack(tag) => {
                    let req = GrantRequest {
                        holder: HOLDER,
                        tag,
                        received_ns: now,
                        is_voter: true,
                        matched: 0,
                    };
                    if let Ok(g) = leader.grant(req, TERM, Some(now + G_NS)) {
                        down.push(Down::Grant(g));
                    }
                }
                Up::GaveUp(given) => {
                    leader.on_give_up(HOLDER, given, now);
                }
            },
            Step::DeliverDown(i) if !down.is_empty() => match down.remove(i % down.len()) {
                Down::Grant(g) => {
                    holder.on_grant(&g, TERM, now);
                }
                Down::Ask => {
                    if let Some(given) = holder.give_up(TERM) {
                        up.push(Up::GaveUp(given));
                    }
                }
            },
            Step::DeliverUp(_) | Step::DeliverDown(_) => {}
        }
        if holder.is_valid(now) && !leader.counts(HOLDER, now) {
            return Err(format!(
                "at {now}: the holder's lease runs to {}, the leader counts it no more",
                holder.until_ns()
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]
    #[test]
    fn a_holders_lease_is_never_valid_once_its_leader_stopped_counting_it(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        prop_assert_eq!(check(&steps, false), Ok(()));
    }
}

#[test]
fn control_a_holder_taking_a_voided_grant_is_found_by_the_property() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(step(), 1..40);
    let found = (0..2_000).any(|_| {
        let steps = strategy.new_tree(&mut runner).unwrap().current();
        check(&steps, true).is_err()
    });
    assert!(found, "random orders never found the bug");
}
