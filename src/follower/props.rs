//! Property tests of the follower-lease state machines, each with its negative control.

use proptest::prelude::*;

use super::{AckTag, GrantRequest, GrantTable, ReadLease};

const PPM: u128 = 1_000_000;

/// One acknowledgement, grant and receipt, on two clocks of rates within `1 ± ρ`.
#[derive(Debug, Clone)]
struct Exchange {
    drift_ppm: u64,
    /// Clock rates in ppm of real time, holder and leader.
    rate_h: u64,
    rate_l: u64,
    /// Clock offsets at real time 0.
    off_h: u64,
    off_l: u64,
    /// Real times: the acknowledgement leaves, reaches the leader, and its grant arrives.
    t_ack: u64,
    delay_up: u64,
    delay_down: u64,
    max_grant_ns: u64,
    /// The leader's own lease left at `x`.
    lambda_left: u64,
    margin_ns: u64,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (0..=100_000u64, any::<u64>(), any::<u64>()).prop_flat_map(|(drift, sh, sl)| {
        let rate = move |s: u64| 1_000_000 - drift + s % (2 * drift + 1);
        (
            Just((drift, rate(sh), rate(sl))),
            0..1_000_000_000u64,
            0..1_000_000_000u64,
            0..1_000_000_000u64,
            0..50_000_000u64,
            0..50_000_000u64,
            1..2_000_000_000u64,
            1..2_000_000_000u64,
            4..1_000u64, // ε covers the nanosecond roundings of four clock readings
        )
            .prop_map(
                |((drift_ppm, rate_h, rate_l), off_h, off_l, t_ack, up, down, g, lam, eps)| {
                    Exchange {
                        drift_ppm,
                        rate_h,
                        rate_l,
                        off_h,
                        off_l,
                        t_ack,
                        delay_up: up,
                        delay_down: down,
                        max_grant_ns: g,
                        lambda_left: lam,
                        margin_ns: eps,
                    }
                },
            )
    })
}

/// A clock reading at real time `t`: rounded down.
fn read(offset: u64, rate: u64, t: u64) -> u64 {
    offset + (t as u128 * rate as u128 / PPM) as u64
}

/// A safety switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    /// The holder counts its lease from the grant's receipt.
    FromReceipt,
    /// The leader's grants are not capped by its own lease.
    Uncapped,
}

/// Runs one exchange; `Err` when the holder's lease outlives the leader's count of it (in real
/// time), or the leader's own lease.
fn check(e: &Exchange, control: Option<Control>) -> Result<(), String> {
    let mut holder = ReadLease::new(1, e.drift_ppm, e.margin_ns);
    if control == Some(Control::FromReceipt) {
        holder = holder.control_from_receipt();
    }
    let mut table = GrantTable::new(e.max_grant_ns, e.drift_ppm, e.margin_ns);
    if control == Some(Control::Uncapped) {
        table = table.control_uncapped();
    }
    let a = read(e.off_h, e.rate_h, e.t_ack);
    let tag = holder.tag(1, a);
    let t_recv = e.t_ack + e.delay_up;
    let x = read(e.off_l, e.rate_l, t_recv);
    let req = GrantRequest {
        holder: 2,
        tag,
        received_ns: x,
        is_voter: true,
        matched: 0,
    };
    let lambda = x + e.lambda_left;
    let grant = table
        .grant(req, 1, Some(lambda))
        .map_err(|r| format!("{r:?}"))?;
    let t_grant = t_recv + e.delay_down;
    holder.on_grant(&grant, 1, read(e.off_h, e.rate_h, t_grant));
    let until_h = holder.until_ns();
    if until_h <= a {
        return Ok(()); // no lease at all
    }
    // Real instants (scaled by the product of the rates, to compare exactly): the holder's
    // lease ends when its clock reaches until_h; the leader stops counting at x + g.
    let real = |reading: u64, off: u64, rate: u64| {
        (reading.saturating_sub(off)) as u128 * PPM / rate as u128
    };
    let holder_end = real(until_h, e.off_h, e.rate_h);
    let count_end = real(x + grant.grant_ns, e.off_l, e.rate_l);
    let lambda_end = real(lambda, e.off_l, e.rate_l);
    if holder_end > count_end || holder_end > lambda_end {
        return Err(format!(
            "holder lease ends at real {holder_end}, leader counts to {count_end}, its lease to {lambda_end}"
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]
    #[test]
    fn a_holders_lease_never_ends_after_the_leader_stops_counting_it(e in exchange()) {
        prop_assert_eq!(check(&e, None), Ok(()));
    }
}

fn control_found(control: Control) -> bool {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..4_000).any(|_| {
        let e = exchange().new_tree(&mut runner).unwrap().current();
        check(&e, Some(control)).is_err()
    })
}

#[test]
fn control_a_lease_counted_from_the_grants_receipt_outlives_the_count() {
    assert!(
        control_found(Control::FromReceipt),
        "random exchanges never found the bug"
    );
}

#[test]
fn control_a_grant_not_capped_by_the_leader_lease_outlives_it() {
    assert!(
        control_found(Control::Uncapped),
        "random exchanges never found the bug"
    );
}

/// One step of the exposed-index property.
#[derive(Debug, Clone)]
enum Op {
    Wait(u64),
    /// Holder `h` acknowledges, with matched index `m`.
    Ack(u64, u64),
    /// Holder `h` persisted up to `m`.
    Matched(u64, u64),
    /// The commit index moves to `c`.
    Commit(u64),
    Expose,
    GiveUp(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1..300u64).prop_map(Op::Wait),
        (2..=4u64, 0..40u64).prop_map(|(h, m)| Op::Ack(h, m)),
        (2..=4u64, 0..40u64).prop_map(|(h, m)| Op::Matched(h, m)),
        (0..40u64).prop_map(Op::Commit),
        Just(Op::Expose),
        (2..=4u64).prop_map(Op::GiveUp),
    ]
}

/// A safety of the exposed index switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExposeControl {
    /// `E` is the commit index, whatever the holders have matched.
    ExposeCommit,
    /// A voter whose matched index is below `E` is granted all the same.
    GrantLagging,
}

/// Runs `ops` against a model of what each holder has really persisted; `Err` when `E` passes
/// a holder whose lease may still be valid, or goes down.
fn check_exposed(ops: &[Op], control: Option<ExposeControl>) -> Result<(), String> {
    let mut t = GrantTable::new(500, 0, 0);
    match control {
        Some(ExposeControl::ExposeCommit) => t = t.control_expose_commit(),
        Some(ExposeControl::GrantLagging) => t = t.control_grant_lagging(),
        None => {}
    }
    let (mut now, mut commit, mut seq) = (0u64, 0u64, 0u64);
    let mut persisted = [0u64; 5];
    let mut until = [0u64; 5];
    for op in ops {
        match *op {
            Op::Wait(dt) => now += dt,
            Op::Ack(h, m) => {
                let m = persisted[h as usize].max(m);
                persisted[h as usize] = m;
                seq += 1;
                let tag = AckTag {
                    term: 1,
                    boot: h,
                    seq,
                };
                let req = GrantRequest {
                    holder: h,
                    tag,
                    received_ns: now,
                    is_voter: true,
                    matched: m,
                };
                if let Ok(g) = t.grant(req, 1, Some(now + 400)) {
                    until[h as usize] = until[h as usize].max(now + g.grant_ns);
                }
            }
            Op::Matched(h, m) => {
                persisted[h as usize] = persisted[h as usize].max(m);
                t.on_matched(h, persisted[h as usize]);
            }
            Op::Commit(c) => commit = commit.max(c),
            Op::GiveUp(h) => {
                let given = AckTag {
                    term: 1,
                    boot: h,
                    seq,
                };
                if t.on_give_up(h, given, now) {
                    until[h as usize] = 0;
                }
            }
            Op::Expose => {
                let before = t.exposed();
                let e = t.expose(commit, true, now);
                if e < before {
                    return Err(format!("E went down: {before} -> {e}"));
                }
                if let Some(h) = (2..=4).find(|&h| until[h] > now && persisted[h] < e) {
                    return Err(format!("E {e} past holder {h}'s {}", persisted[h]));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]
    #[test]
    fn the_exposed_index_never_passes_a_holder_whose_lease_may_be_valid(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        prop_assert_eq!(check_exposed(&ops, None), Ok(()));
    }
}

fn expose_control_found(control: ExposeControl) -> bool {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = proptest::collection::vec(op(), 1..60);
    (0..2_000).any(|_| {
        let ops = strategy.new_tree(&mut runner).unwrap().current();
        check_exposed(&ops, Some(control)).is_err()
    })
}

#[test]
fn control_exposing_the_commit_index_is_found_by_the_property() {
    assert!(
        expose_control_found(ExposeControl::ExposeCommit),
        "random sequences never found the bug"
    );
}

#[test]
fn control_granting_a_lagging_voter_is_found_by_the_property() {
    assert!(
        expose_control_found(ExposeControl::GrantLagging),
        "random sequences never found the bug"
    );
}
