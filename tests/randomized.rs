//! The seeded randomized simulation (`raft_lease::sim::random`): random cluster configurations,
//! random overlapping faults under load (safety phase), then every fault healed (liveness
//! phase). The history checker and the lease monitor must find nothing; the cluster must serve
//! again. Each negative control (one safety off, or drift beyond the bound) must be caught
//! within the same CI seeds, by the same checks, on its own.
//!
//! - `RAFT_LEASE_SEED=N` runs one seed (the failure message prints it).
//! - `RAFT_LEASE_SEEDS=N` runs seeds `0..N` (default 128, the CI seeds).
//! - `RAFT_LEASE_LONG=1` runs 1,000 seeds with a 10 s safety phase.
//!
//! Half the seeds run with follower read leases (`G` drawn in its valid range), every follower
//! read checked with the rest; for them, half the membership changes give way to slow appends to
//! one follower, and a split with the leader in a minority is drawn too (the faults that put a
//! holder behind). In half of those splits the writing clients are cut off with the majority and
//! one of it campaigns as soon as its promise and raft allow; half the follower-lease seeds have
//! `P` in the top quarter of its range, so that such an election can follow the old leader's
//! lease within `G`. A membership change is then refused while read leases live, as the node
//! does, and its holders are asked to give them up: the change is proposed again (a new random
//! one) a moment later. Half the slow appends are a give-up race instead: under writes every
//! 0.5 ms, the leader's appends to one holder come late with the grants they carry, and a
//! membership change that changes nothing asks for give-ups, with no other fault until the
//! grants have ended. A follower-lease control runs every seed with them on.
//!
//! A control runs the CI seeds until one catches it, and prints that seed. The removed-leader
//! control reinstates raft-rs 0.7's own handling of a leader's removal, under which raft-rs itself
//! panics on some seeds (`maybe_commit` unwraps the removed leader's progress); those seeds are
//! counted and skipped.

use raft_lease::sim::random::{self, RandomRun, RunOutcome};
use raft_lease::sim::scenarios::{knob, Control};
use raft_lease::Safeties;

fn long() -> bool {
    std::env::var("RAFT_LEASE_LONG").is_ok()
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("RAFT_LEASE_SEED") {
        return vec![seed.parse().expect("RAFT_LEASE_SEED must be a number")];
    }
    let n = std::env::var("RAFT_LEASE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok());
    (0..n.unwrap_or(if long() { 1_000 } else { 128 })).collect()
}

fn run(seed: u64, control: Option<Control>) -> RunOutcome {
    random::run(RandomRun {
        seed,
        control,
        safety_ms: if long() { 10_000 } else { 2_500 },
    })
}

/// Prints how to replay a seed whose run panicked (a check inside the simulation).
struct SeedOnPanic(u64);

impl Drop for SeedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let seed = self.0;
            eprintln!("seed {seed} panicked; reproduce: RAFT_LEASE_SEED={seed} cargo test --all-features --test randomized");
        }
    }
}

#[test]
fn randomized_faults_never_break_the_lease() {
    let mut totals = [0u64; 10];
    let (mut read_lease_checks, mut worst_read_lease) = (0, (0, 0));
    for seed in seeds() {
        let guard = SeedOnPanic(seed);
        let out = run(seed, None);
        drop(guard);
        let r = &out.report;
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {} violations, first {:?}\nreproduce: RAFT_LEASE_SEED={seed} cargo test --all-features --test randomized\nconfig: {:?}\nfaults: {:#?}",
            r.violations.len(),
            r.violations[0],
            out.config,
            out.faults
        );
        if let Err(e) = &out.liveness {
            panic!(
                "seed {seed}: liveness failed: {e}\nconfig: {:?}\nfaults: {:#?}",
                out.config, out.faults
            );
        }
        let counts = [
            out.ops as u64,
            r.lease_reads_checked as u64,
            r.lease_checks,
            out.faults
                .iter()
                .filter(|f| f.contains("membership"))
                .count() as u64,
            out.snapshots_installed,
            out.lease_reads_after_install,
            out.rounds_evicted,
            out.liveness_split_votes,
            r.follower_reads_checked as u64,
            u64::from(out.config.lease.follower_leases.is_some()),
        ];
        for (t, c) in totals.iter_mut().zip(counts) {
            *t += c;
        }
        if let Some((ms, bound_ms)) = out.read_leases_after_ms {
            read_lease_checks += 1;
            if ms * worst_read_lease.1.max(1) >= worst_read_lease.0 * bound_ms {
                worst_read_lease = (ms, bound_ms); // the largest share of its bound
            }
        }
    }
    let [ops, lease_reads, checks, changes, installs, after_install, evicted, splits, follower_reads, follower_seeds] =
        totals;
    eprintln!(
        "randomized ({} seeds): {ops} operations, {lease_reads} lease reads and {checks} lease-monitor \
         instants checked, 0 violations; {changes} membership changes, {installs} snapshots installed, \
         {after_install} lease reads after an install, {evicted} rounds evicted at the table's limit, \
         {splits} split votes in the liveness phases; follower leases on {follower_seeds} seeds, \
         {follower_reads} follower reads checked; every live voter held a read lease again \
         within its bound on {read_lease_checks} seeds (after the leader, where one could be, was \
         lost for good as its membership change committed), the slowest {} ms against a bound of {} ms",
        seeds().len(),
        worst_read_lease.0,
        worst_read_lease.1
    );
    assert!(lease_reads > 0 && checks > 0, "nothing was checked");
    if follower_seeds > 0 {
        assert!(follower_reads > 0, "no follower read was checked");
    }
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(
            read_lease_checks > 0,
            "no seed checked that read leases come back"
        );
    }
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(
            changes > 0 && installs > 0 && after_install > 0,
            "the fault space shrank"
        );
    }
}

thread_local! {
    /// Where the last panic on this thread happened (file), for telling raft-rs's panics apart.
    static PANIC_FILE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Record every panic's file, then report it as usual.
fn record_panic_locations() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let file = info
                .location()
                .map_or(String::new(), |l| l.file().to_string());
            PANIC_FILE.with(|f| *f.borrow_mut() = file);
            default(info);
        }));
    });
}

/// What caught a control: the seed, its stale reads and its violations of any kind.
struct Caught {
    seed: u64,
    stale_reads: usize,
    violations: usize,
}

/// Runs the control on the CI seeds until one catches it (a violation of any kind: a stale
/// read, another linearizability violation, a lease overlap, a rule broken); returns what caught
/// it, and the seeds on which raft-rs itself panicked. A panic anywhere else fails the test.
fn caught_by(control: Control) -> (Option<Caught>, Vec<u64>) {
    record_panic_locations();
    let mut raft_panics = Vec::new();
    for seed in seeds() {
        match std::panic::catch_unwind(|| run(seed, Some(control))) {
            Ok(out) if !out.report.violations.is_empty() => {
                let caught = Caught {
                    seed,
                    stale_reads: out.report.stale_reads(),
                    violations: out.report.violations.len(),
                };
                return (Some(caught), raft_panics);
            }
            Ok(_) => {}
            Err(payload) => {
                let file = PANIC_FILE.with(|f| f.borrow().clone());
                if !file.contains("raft-0.7.0") {
                    eprintln!("seed {seed}: a panic outside raft-rs, at {file}");
                    std::panic::resume_unwind(payload);
                }
                raft_panics.push(seed);
            }
        }
    }
    (None, raft_panics)
}

fn assert_caught(name: &str, control: Control) {
    let (caught, raft_panics) = caught_by(control);
    let found = caught.as_ref().map(|c| {
        format!(
            "seed {} ({} stale reads, {} violations)",
            c.seed, c.stale_reads, c.violations
        )
    });
    eprintln!(
        "randomized control {name} ({}): caught by {found:?}; raft-rs panicked on seeds {raft_panics:?}",
        random::describe(Some(control))
    );
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(
            caught.is_some(),
            "random faults never caught the control {name}: the fault space is too small"
        );
    }
}

#[test]
fn control_raft_lease_based_is_caught() {
    assert_caught(
        "raft-rs LeaseBased",
        Control::Safeties(Safeties::raft_lease_based()),
    );
}

#[test]
fn control_no_promise_is_caught() {
    assert_caught(
        "no promise",
        Control::Safeties(knob(|k| k.no_promise = true)),
    );
}

#[test]
fn control_no_boot_promise_is_caught() {
    assert_caught(
        "no boot promise",
        Control::Safeties(knob(|k| k.no_boot_promise = true)),
    );
}

#[test]
fn control_no_campaign_hold_is_caught() {
    assert_caught(
        "no campaign hold",
        Control::Safeties(knob(|k| k.no_campaign_hold = true)),
    );
}

#[test]
fn control_no_transfer_fence_is_caught() {
    assert_caught(
        "no transfer fence",
        Control::Safeties(knob(|k| k.no_transfer_fence = true)),
    );
}

#[test]
fn control_fence_lifted_after_timeout_now_left_is_caught() {
    assert_caught(
        "fence lifted after MsgTimeoutNow left",
        Control::Safeties(knob(|k| k.lift_fence_after_timeout_now = true)),
    );
}

#[test]
fn control_resent_context_credited_later_is_caught() {
    assert_caught(
        "re-sent context remapped",
        Control::Safeties(knob(|k| k.remap_retired_ctx = true)),
    );
}

/// Found by a flaky-leader episode whose slow follower is slow, from the cut, in everything it
/// sends the leader: the new leader it helps elect is heard late, after the follower's held
/// acknowledgement of a round's first attempt has answered reads started after that new leader
/// wrote. Caught on seed 60 (172 stale reads).
#[test]
fn control_read_ctx_reused_on_retry_is_caught() {
    assert_caught(
        "a retried read round under its first context",
        Control::Safeties(knob(|k| k.reuse_read_ctx_on_retry = true)),
    );
}

#[test]
fn control_removed_leader_self_renewal_is_caught() {
    let control = knob(|k| {
        k.keep_removed_leader = true;
        k.renew_any_singleton = true;
    });
    assert_caught("removed leader renews itself", Control::Safeties(control));
}

#[test]
fn control_apply_to_commit_is_caught() {
    assert_caught(
        "apply to commit",
        Control::Safeties(knob(|k| k.apply_to_commit = true)),
    );
}

#[test]
fn control_expose_commit_is_caught() {
    assert_caught(
        "expose commit",
        Control::Safeties(knob(|k| k.expose_commit = true)),
    );
}

#[test]
fn control_no_transfer_wait_is_caught() {
    assert_caught(
        "no transfer wait",
        Control::Safeties(knob(|k| k.no_transfer_wait = true)),
    );
}

/// The cap matters only when the old leader still hears a holder but no quorum (five voters, the
/// leader and the holder in a minority) and the other side exposes a write before `λ + G`: a
/// split with the clients on the majority side, an election there as early as allowed, and `P`
/// close to the election timeout (raft refuses votes for an election timeout after the leader was
/// last heard). Caught on seed 79 (196 stale reads).
#[test]
fn control_uncapped_grant_is_caught() {
    assert_caught(
        "uncapped grant",
        Control::Safeties(knob(|k| k.uncapped_grant = true)),
    );
}

/// Not caught within the CI seeds (run with `--ignored`), and not expected to be: every grant
/// travels in the same note as the leader's exposed index, so a lagging holder learns an `E`
/// above what it applied with the grant itself, and refuses reads until it has applied it. The
/// property of the exposed index finds it (`follower::props`).
#[test]
#[ignore]
fn control_grant_lagging_is_caught() {
    assert_caught(
        "grant to a lagging holder",
        Control::Safeties(knob(|k| k.grant_lagging = true)),
    );
}

#[test]
fn control_lease_from_receipt_is_caught() {
    assert_caught(
        "lease from the grant's receipt",
        Control::Safeties(knob(|k| k.lease_from_receipt = true)),
    );
}

#[test]
fn control_reuse_tags_is_caught() {
    assert_caught(
        "one tag for every acknowledgement",
        Control::Safeties(knob(|k| k.reuse_tags = true)),
    );
}

/// The liveness check catches the membership-change deadlock on its own: after every fault
/// has healed, the leader proposes a change under live read leases and is lost for good as
/// soon as another voter knows the change is committed; with the change committed while a
/// read lease lives, no one of the rest can win an election (docs/follower.md, "Liveness:
/// membership changes").
#[test]
fn control_conf_with_grants_is_caught_by_the_liveness_check() {
    let caught = seeds().into_iter().find(|&seed| {
        let out = run(
            seed,
            Some(Control::Safeties(knob(|k| k.conf_with_grants = true))),
        );
        let no_leader = out
            .liveness
            .as_ref()
            .is_err_and(|e| e.contains("not serving"));
        let lost = (out.faults.iter()).any(|f| f.contains("committed at another voter: true"));
        no_leader && lost
    });
    eprintln!("randomized control conf_with_grants: the cluster stayed without a leader on seed {caught:?}");
    if std::env::var("RAFT_LEASE_SEED").is_err() {
        assert!(
            caught.is_some(),
            "the liveness check never caught conf_with_grants"
        );
    }
}

/// Found by the give-up race (under writes every 0.5 ms, the leader's appends to one holder
/// come late with the grants they carry, then a membership change asks for give-ups): a grant
/// the give-up voided arrives after the last ask and revives the lease while the leader
/// exposes writes the holder has not received. Caught on seed 22 (2 stale reads).
#[test]
fn control_accept_voided_grants_is_caught() {
    assert_caught(
        "a holder taking a grant its give-up voided",
        Control::Safeties(knob(|k| k.accept_voided_grants = true)),
    );
}

#[test]
fn control_ignore_pending_keys_is_caught() {
    assert_caught(
        "a follower read ignoring the writes pending to its key",
        Control::Safeties(knob(|k| k.ignore_pending_keys = true)),
    );
}

#[test]
fn control_drift_beyond_the_bound_is_caught() {
    assert_caught("drift beyond the bound", Control::DriftBeyondBound);
}

/// A measurement, not a check (run with `--ignored`): split votes in the liveness phases over
/// the seeds, with and without the campaign jitter. The jitter's mechanism is checked in
/// `tests/node.rs`.
#[test]
#[ignore]
fn measure_split_votes_with_and_without_jitter() {
    let split_votes = |control: Option<Control>| -> u64 {
        seeds()
            .into_iter()
            .map(|seed| {
                let out = run(seed, control);
                assert!(out.liveness.is_ok(), "seed {seed}: {:?}", out.liveness);
                out.liveness_split_votes
            })
            .sum()
    };
    let with_jitter = split_votes(None);
    let without = split_votes(Some(Control::Safeties(knob(|k| {
        k.no_campaign_jitter = true
    }))));
    eprintln!(
        "split votes in the liveness phases: {with_jitter} with the jitter, {without} without"
    );
}
