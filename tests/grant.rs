//! The general lease primitives, in simulated time.

use std::sync::Arc;

use raft_lease::grant::sim::{
    self, GrantSimConfig, GrantSimControls, GrantSimReport, ViolationKind,
};
use raft_lease::grant::{
    AcquireError, ClientId, FencedStore, Grant, GrantConfig, GrantorRecord, LeaseEvent,
    LeaseHolder, LeaseServer, LossReason, RenewRequest, Renewal, Renewer, SessionId, Sessions,
    SimSleeper, SimTransportTime, StaleToken, TransportError,
};
use raft_lease::{Clock, SimClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MS: u64 = 1_000_000;
const PPM: u128 = 1_000_000;

/// A grantor's first start: nothing was ever granted.
fn fresh(clock: SimClock, config: GrantConfig) -> LeaseServer<SimClock> {
    LeaseServer::restore(clock, config, GrantorRecord::default())
}

/// The first real instant (ns from the start) at which a clock that read `start_ns` at real 0 and
/// runs at `1 + ppm/1e6` reads at least `local_ns`.
fn real_when(local_ns: u64, start_ns: u64, ppm: i64) -> u128 {
    let elapsed = local_ns.saturating_sub(start_ns) as u128;
    (elapsed * PPM).div_ceil((PPM as i128 + ppm as i128) as u128)
}

struct Case {
    config: GrantConfig,
    term_ms: u64,
    holder_ppm: i64,
    grantor_ppm: i64,
    request_delay_ns: u64,
    response_delay_ns: u64,
}

fn random_case(rng: &mut ChaCha8Rng) -> Case {
    let rho = rng.gen_range(0..=20_000u64);
    let config = GrantConfig {
        drift_ppm: rho,
        margin_ms: rng.gen_range(1..=20),
        max_term_ms: 60_000,
    };
    let rho = rho as i64;
    Case {
        config,
        term_ms: rng.gen_range(50..=20_000),
        holder_ppm: rng.gen_range(-rho..=rho),
        grantor_ppm: rng.gen_range(-rho..=rho),
        request_delay_ns: rng.gen_range(0..=500 * MS),
        response_delay_ns: rng.gen_range(0..=500 * MS),
    }
}

/// Real end instants of (holder's view, grantor's hold). `from_response` is the bug: the holder
/// starts its timer when the answer arrives instead of before the request.
fn ends(case: &Case, from_response: bool) -> (u128, u128) {
    let holder_clock = SimClock::new(5 * MS, case.holder_ppm);
    let grantor_clock = SimClock::new(9 * MS, case.grantor_ppm);
    let (h0, g0) = (holder_clock.now_ns(), grantor_clock.now_ns());
    let mut server = fresh(grantor_clock.clone(), case.config);
    let mut holder = LeaseHolder::new(case.config);
    let sent_at_ns = holder_clock.now_ns();
    for c in [&holder_clock, &grantor_clock] {
        c.advance(case.request_delay_ns);
    }
    let grant = server.acquire_now(1, case.term_ms).expect("free");
    let (_, grantor_expiry_ns) = server.holder(grantor_clock.now_ns()).expect("held");
    for c in [&holder_clock, &grantor_clock] {
        c.advance(case.response_delay_ns);
    }
    let start_ns = if from_response {
        holder_clock.now_ns()
    } else {
        sent_at_ns
    };
    holder.on_grant(start_ns, grant);
    let holder_until_ns = holder.valid_until_ns().expect("held");
    (
        real_when(holder_until_ns, h0, case.holder_ppm),
        real_when(grantor_expiry_ns, g0, case.grantor_ppm),
    )
}

fn violations(from_response: bool) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(0x6a27);
    (0..5_000)
        .filter(|_| {
            let case = random_case(&mut rng);
            let (holder_end, grantor_end) = ends(&case, from_response);
            holder_end > grantor_end
        })
        .count()
}

#[test]
fn property_the_holders_view_always_ends_before_the_grantors() {
    assert_eq!(
        violations(false),
        0,
        "the holder outlived the grantor's hold"
    );
}

#[test]
fn control_a_holder_timing_from_the_response_outlives_the_grantor() {
    let bad = violations(true);
    assert!(
        bad > 0,
        "the property test cannot tell a response-timed holder apart"
    );
    eprintln!("response-timed holder outlived the grantor in {bad} of 5000 cases");
}

#[test]
fn a_paused_ex_holders_late_write_is_fenced() {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let mut storage = FencedStore::new("initial");
    let mut a = LeaseHolder::new(config);
    a.on_grant(clock.now_ns(), server.acquire_now(1, 1_000).unwrap());
    let token_a = a.token(clock.now_ns()).expect("held");
    storage.write(token_a, "from a").unwrap();
    // `a` checked its lease, then paused (GC) for 5 s before writing again.
    clock.advance(5_000 * MS);
    let grant_b = server
        .acquire_now(2, 1_000)
        .expect("a's lease expired at the grantor");
    assert!(grant_b.token > token_a);
    storage.write(grant_b.token, "from b").unwrap();
    assert_eq!(
        storage.write(token_a, "late from a"),
        Err(StaleToken {
            token: token_a,
            highest: grant_b.token
        })
    );
    assert_eq!(*storage.read(), "from b");
}

/// A renewer on a simulated clock, fed by `answer(call_number, server)`. Returns its events.
fn run_renewer(answer: impl Fn(u32) -> Option<u64> + Send + 'static) -> (Vec<LeaseEvent>, u64) {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let mut holder = LeaseHolder::new(config);
    holder.on_grant(clock.now_ns(), server.acquire_now(1, 3_000).unwrap());
    let first_until = holder.valid_until_ns().unwrap();
    let mut calls = 0u32;
    let transport = move |r: RenewRequest| {
        calls += 1;
        match answer(calls) {
            Some(0) => Ok(server.renew_now(1, r.token, r.term_ms)?),
            Some(token) => Ok(Grant {
                token,
                term_ms: r.term_ms,
            }),
            None => Err(TransportError::Io {
                kind: std::io::ErrorKind::TimedOut,
                message: format!("renewal {calls} lost"),
            }),
        }
    };
    let renewer = Renewer::spawn(
        Arc::new(clock.clone()),
        holder,
        3_000,
        transport,
        SimSleeper::new(clock),
    )
    .expect("a 3 s term");
    let mut events = Vec::new();
    loop {
        let e = renewer
            .events()
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("renewer hung");
        let lost = matches!(e, LeaseEvent::Lost { .. });
        events.push(e);
        if lost {
            break;
        }
    }
    renewer.stop();
    (events, first_until)
}

/// Wait for the renewer's `Lost` and return its local time.
fn lost_at(renewer: &Renewer) -> (u64, LossReason) {
    loop {
        let e = renewer
            .events()
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("renewer hung");
        if let LeaseEvent::Lost { at_ns, reason } = e {
            return (at_ns, reason);
        }
    }
}

/// A 3 s lease granted at 0 (ρ = 500 ppm, ε = 10 ms, one clock with no drift, so local is real
/// time). Its renewal at 1988.5 ms goes to `transport`, which never reaches the grantor. Returns
/// (Lost, end of the holder's view, grantor's expiry = when client 2 is granted), in ns.
fn blocked_renewal<T>(
    control: bool,
    transport: impl FnOnce(SimTransportTime) -> T,
) -> (u64, u64, u64)
where
    T: raft_lease::grant::Transport + 'static,
{
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let mut holder = LeaseHolder::new(config);
    holder.on_grant(0, server.acquire_now(1, 3_000).unwrap());
    let view_end_ns = holder.valid_until_ns().unwrap();
    let (_, expiry_ns) = server.holder(0).unwrap();
    let mut core = Renewal::new(holder, 3_000).expect("a 3 s term");
    if control {
        core = core.control_loss_only_when_the_transport_returns();
    }
    let sleeper = SimSleeper::new(clock.clone());
    let transport = transport(sleeper.transport_time());
    let renewer = Renewer::spawn_core(Arc::new(clock.clone()), core, transport, sleeper);
    let (lost_ns, reason) = lost_at(&renewer);
    assert_eq!(
        reason,
        LossReason::RenewalsFailed {
            valid_until_ns: view_end_ns
        }
    );
    renewer.stop();
    let c2 = server
        .acquire(2, 3_000, expiry_ns)
        .expect("free at the grantor's expiry");
    assert_eq!(c2.token, 2);
    eprintln!(
        "{}: view ends {} ms, grantor expiry (client 2 granted) {} ms, Lost at {} ms: overlap {} ms",
        if control { "control" } else { "fixed" },
        view_end_ns as f64 / 1e6,
        expiry_ns as f64 / 1e6,
        lost_ns as f64 / 1e6,
        lost_ns.saturating_sub(expiry_ns) as f64 / 1e6
    );
    (lost_ns, view_end_ns, expiry_ns)
}

/// A transport that ignores its deadline and blocks 1.5 s of simulated time, then fails.
fn blocks_1500_ms(time: SimTransportTime) -> impl raft_lease::grant::Transport {
    move |_: RenewRequest| {
        time.sleep(1_500 * MS);
        Err(TransportError::from(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )))
    }
}

#[test]
fn a_blocked_renewal_tells_the_owner_before_the_grantor_gives_the_lease_away() {
    let (lost_ns, view_end_ns, expiry_ns) = blocked_renewal(false, blocks_1500_ms);
    // The loss timer: the view's end (2988.5 ms) less d/12 (250 ms).
    assert_eq!(lost_ns, 2_738_500_000);
    assert!(lost_ns < view_end_ns && view_end_ns < expiry_ns);
}

#[test]
fn control_a_renewer_that_waits_for_its_transport_tells_the_owner_too_late() {
    let (lost_ns, view_end_ns, expiry_ns) = blocked_renewal(true, blocks_1500_ms);
    assert_eq!(
        lost_ns, 3_488_500_000,
        "Lost only when the transport returned"
    );
    assert!(lost_ns > expiry_ns && lost_ns > view_end_ns);
}

#[test]
fn a_transport_that_never_returns_still_loses_the_lease_in_time() {
    let (lost_ns, view_end_ns, _) = blocked_renewal(false, |time| {
        move |_: RenewRequest| {
            time.block_forever();
            Err(TransportError::Gone)
        }
    });
    assert_eq!(lost_ns, view_end_ns - 250 * MS);
}

#[test]
fn a_transport_that_keeps_its_deadline_is_retried() {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let mut holder = LeaseHolder::new(config);
    holder.on_grant(0, server.acquire_now(1, 3_000).unwrap());
    let sleeper = SimSleeper::new(clock.clone());
    let time = sleeper.transport_time();
    let mut calls = 0;
    // The first attempt times out at its deadline; the second reaches the grantor.
    let (timeouts_tx, timeouts) = crossbeam_channel::unbounded();
    let transport = move |r: RenewRequest| {
        calls += 1;
        timeouts_tx.send((r.deadline_ns, r.timeout)).unwrap();
        if calls == 1 {
            time.sleep(r.timeout.as_nanos() as u64);
            return Err(TransportError::DeadlineMissed);
        }
        Ok(server.renew(1, r.token, r.term_ms, time.now_ns())?)
    };
    let renewer = Renewer::spawn(Arc::new(clock.clone()), holder, 3_000, transport, sleeper)
        .expect("a 3 s term");
    let events: Vec<LeaseEvent> = (0..2).map(|_| renewer.events().recv().unwrap()).collect();
    renewer.stop();
    assert!(
        matches!(&events[0], LeaseEvent::RenewFailed { attempt: 1, at_ns, error: TransportError::DeadlineMissed } if *at_ns == 2_238_500_000),
        "{events:?}"
    );
    // Each call got its deadline as a duration too: d/12 = 250 ms from the call.
    let d12 = std::time::Duration::from_millis(250);
    let got: Vec<_> = timeouts.try_iter().take(2).collect();
    assert_eq!(
        got,
        vec![(2_238_500_000, d12), (2_488_500_000 + 250 * MS, d12)]
    );
    // Retried d/12 after the failure; the view runs from that attempt's sent_at.
    assert!(
        matches!(&events[1], LeaseEvent::Renewed { token: 1, valid_until_ns, .. } if *valid_until_ns == 2_488_500_000 + 2_988_500_000),
        "{events:?}"
    );
}

#[test]
fn renewing_at_a_third_left_survives_one_lost_renewal() {
    // Renewals 1–3 succeed, 4 is lost, 5–8 succeed, then the grantor is gone for good.
    let (events, first_until) = run_renewer(|n| if n == 4 || n > 8 { None } else { Some(0) });
    let mut valid_until = first_until;
    let (mut renewed, mut failed) = (0, 0);
    for e in &events {
        match e {
            LeaseEvent::Renewed {
                valid_until_ns,
                at_ns,
                token,
            } => {
                assert_eq!(*token, 1, "a renewal keeps the token");
                assert!(
                    *at_ns < valid_until,
                    "renewed only after the lease had lapsed: {events:#?}"
                );
                valid_until = *valid_until_ns;
                renewed += 1;
            }
            LeaseEvent::RenewFailed { .. } => failed += 1,
            LeaseEvent::Lost { .. } => {}
        }
    }
    assert_eq!(renewed, 7, "{events:#?}");
    assert!(
        failed >= 2,
        "the final outage fails at least twice before giving up: {events:#?}"
    );
}

#[test]
fn losing_the_lease_signals_the_owner_before_the_holders_expiry() {
    let (events, first_until) = run_renewer(|_| None);
    let Some(LeaseEvent::Lost { reason, at_ns }) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!(
        *reason,
        LossReason::RenewalsFailed {
            valid_until_ns: first_until
        }
    );
    assert!(
        *at_ns < first_until,
        "signalled at {at_ns}, after the view ended at {first_until}"
    );
    let failures = events
        .iter()
        .filter(|e| matches!(e, LeaseEvent::RenewFailed { .. }))
        .count();
    assert!(failures >= 3, "it retried: {events:#?}");
}

#[test]
fn a_changed_token_is_a_lost_lease() {
    let (events, _) = run_renewer(|n| if n == 1 { Some(0) } else { Some(99) });
    let last = events.last().unwrap();
    assert!(
        matches!(
            last,
            LeaseEvent::Lost {
                reason: LossReason::TokenChanged {
                    old: Some(1),
                    new: 99
                },
                ..
            }
        ),
        "{events:#?}"
    );
}

#[test]
fn a_batched_keepalive_of_10000_sessions_refreshes_them_all() {
    let mut sessions = Sessions::new(GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 60_000,
    });
    let ids: Vec<SessionId> = (0..10_000)
        .map(|_| sessions.grant(12_000, 0).unwrap())
        .collect();
    for (i, id) in ids.iter().enumerate() {
        sessions
            .attach_key(*id, format!("key{i}").as_bytes(), 0)
            .unwrap();
        sessions.lock(&format!("lock{i}"), *id, 0).unwrap();
    }
    // At 8 s, keep the even half alive in one call; at 14 s the odd half has expired.
    let even: Vec<SessionId> = ids.iter().copied().step_by(2).collect();
    let ka = sessions.keepalive(&even, 8_000 * MS);
    assert_eq!((ka.refreshed, ka.unknown.len()), (5_000, 0));
    let expired = sessions.expire(14_000 * MS);
    assert_eq!(expired.len(), 5_000);
    for (id, revoked) in &expired {
        let i = ids.iter().position(|x| x == id).unwrap();
        assert_eq!(i % 2, 1, "a refreshed session expired");
        assert_eq!(revoked.keys, vec![format!("key{i}").into_bytes()]);
        assert_eq!(revoked.locks, vec![format!("lock{i}")]);
        assert_eq!(sessions.lock_holder(&format!("lock{i}")), None);
    }
    assert!(even.iter().all(|id| sessions.is_live(*id, 14_000 * MS)));
    let ka = sessions.keepalive(&ids, 14_000 * MS);
    assert_eq!((ka.refreshed, ka.unknown.len()), (5_000, 5_000));
}

/// Client 1 is granted 3 s at 0; the grantor restarts at 100 ms (`restart` builds the new one from
/// the old); client 2 asks every millisecond from 101 ms. Returns (client 2's grant, end of
/// client 1's view), in ns on the shared clock (drift 0, so also real time).
fn restart_scenario(
    restart: impl FnOnce(SimClock, GrantConfig, &LeaseServer<SimClock>) -> LeaseServer<SimClock>,
) -> (u64, u64) {
    let config = GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 3_000,
    };
    let clock = SimClock::new(0, 0);
    let mut grantor = fresh(clock.clone(), config);
    let mut c1 = LeaseHolder::new(config);
    c1.on_grant(clock.now_ns(), grantor.acquire_now(1, 3_000).unwrap());
    clock.advance(100 * MS);
    let mut grantor = restart(clock.clone(), config, &grantor);
    clock.advance(MS);
    let granted_at = loop {
        match grantor.acquire_now(2, 3_000) {
            Ok(_) => break clock.now_ns(),
            Err(AcquireError::BootHoldback { .. } | AcquireError::Held { .. }) => clock.advance(MS),
            Err(e) => panic!("{e}"),
        }
    };
    (granted_at, c1.valid_until_ns().unwrap())
}

fn report_overlap(what: &str, (granted_at, c1_until): (u64, u64)) -> u64 {
    let overlap = c1_until.saturating_sub(granted_at);
    eprintln!(
        "{what}: client 2 granted at {} ms, client 1 believes until {} ms: overlap {} ms",
        granted_at as f64 / 1e6,
        c1_until as f64 / 1e6,
        overlap as f64 / 1e6
    );
    overlap
}

#[test]
fn restarted_grantor_never_gives_two_holders() {
    let boot =
        restart_scenario(|clock, config, old| LeaseServer::boot(clock, config, old.last_token()));
    assert_eq!(report_overlap("boot holdback", boot), 0);
    // Holdback: 3 s·1.0005 + 10 ms = 3011.5 ms after the restart at 100 ms.
    assert_eq!(boot.0, 3_112 * MS);
    let restore =
        restart_scenario(|clock, config, old| LeaseServer::restore(clock, config, old.record()));
    assert_eq!(report_overlap("restore", restore), 0);
    assert_eq!(
        restore.0,
        3_112 * MS,
        "client 1 keeps a full term from the restart"
    );
}

#[test]
fn control_a_restart_that_forgets_its_holder_gives_two_holders() {
    let forgot = restart_scenario(|clock, config, old| {
        LeaseServer::control_restart_forgetting_holder(clock, config, old.last_token())
    });
    let overlap = report_overlap("control (forgets holder)", forgot);
    assert_eq!(forgot.0, 101 * MS);
    assert!(overlap > 2_800 * MS, "the control did not give two holders");
}

const HOUR: u64 = 3_600_000 * MS;
const DAY: u64 = 24 * HOUR;

/// A client's session (10 s TTL) takes lock `L` on the old grantor's clock at `old_now_ns`; a new
/// grantor takes over at `new_now_ns` on its own clock and the client is dead (no keep-alive).
/// Checks the lock is not freed before a full TTL from the takeover, and returns how much longer
/// than that it stays held, in ns on the new clock.
fn dead_lock_overstay_ns(
    old_now_ns: u64,
    new_now_ns: u64,
    takeover: fn(&mut Sessions, u64),
) -> u64 {
    let config = GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 600_000,
    };
    let full_ttl_end_ns = new_now_ns + config.grantor_hold_ns(10_000);
    let mut s = Sessions::new(config);
    let id = s.grant(10_000, old_now_ns).unwrap();
    assert_eq!(s.lock("L", id, old_now_ns), Ok(1));
    takeover(&mut s, new_now_ns);
    assert!(
        s.expire(full_ttl_end_ns - 1).is_empty(),
        "freed before a full TTL"
    );
    assert_eq!(s.lock_holder("L"), Some((id, 1)));
    let (_, _, expiry_ns) = s.expiries().next().unwrap();
    assert_eq!(s.expire(expiry_ns).len(), 1);
    let next = s.grant(10_000, expiry_ns).unwrap();
    assert_eq!(s.lock("L", next, expiry_ns), Ok(2), "the lock moves on");
    let overstay_ns = expiry_ns - full_ttl_end_ns;
    eprintln!(
        "old clock {} h, new clock {} h: the dead client's lock outlives its TTL by {:.1} h",
        old_now_ns / HOUR,
        new_now_ns / HOUR,
        overstay_ns as f64 / HOUR as f64
    );
    overstay_ns
}

#[test]
fn takeover_with_clocks_far_apart_sets_every_expiry_from_the_new_clock() {
    assert_eq!(dead_lock_overstay_ns(30 * DAY, HOUR, Sessions::takeover), 0);
    assert_eq!(dead_lock_overstay_ns(HOUR, 30 * DAY, Sessions::takeover), 0);
}

#[test]
fn control_a_takeover_comparing_the_old_clock_holds_a_dead_lock_for_weeks() {
    let control = Sessions::control_takeover_keeping_old_expiry;
    let overstay_ns = dead_lock_overstay_ns(30 * DAY, HOUR, control);
    assert_eq!(
        overstay_ns,
        30 * DAY - HOUR,
        "old clock ahead: 719 h too long"
    );
    // With the old clock behind, the old rule happened to be right: max picks the new clock.
    assert_eq!(dead_lock_overstay_ns(HOUR, 30 * DAY, control), 0);
}

/// The simulation's CI seeds: `0..GRANT_SIM_SEEDS` (default 24; set it higher for a long run).
fn sim_seeds() -> u64 {
    std::env::var("GRANT_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

#[test]
fn simulation_no_client_believes_in_a_lease_or_lock_the_grantor_gave_to_another() {
    let mut total = GrantSimReport::default();
    for seed in 0..sim_seeds() {
        let r = sim::run(&GrantSimConfig::new(seed));
        assert_eq!(
            r.violations,
            0,
            "seed {seed} (rerun: GrantSimConfig::new({seed})): {}",
            r.first_violation.expect("counted")
        );
        assert!(
            r.operations > 0 && r.grants > 0,
            "seed {seed} did nothing: {r:?}"
        );
        total.steps += r.steps;
        total.operations += r.operations;
        total.grants += r.grants;
        total.restarts += r.restarts;
        total.stale_records += r.stale_records;
        total.blocks += r.blocks;
        total.losses += r.losses;
        total.checks += r.checks;
    }
    assert!(
        total.restarts > 0 && total.stale_records > 0 && total.blocks > 0 && total.losses > 0,
        "{total:?}"
    );
    eprintln!(
        "grant simulation, seeds 0..{}: {} steps of 1 ms, {} operations ({} grants), {} grantor restarts \
         ({} from a stale record), {} blocked links, {} losses told, {} checks, 0 violations",
        sim_seeds(),
        total.steps,
        total.operations,
        total.grants,
        total.restarts,
        total.stale_records,
        total.blocks,
        total.losses,
        total.checks
    );
}

/// The first CI seed at which the check `kind` catches `controls`; prints the seed and what it saw.
fn first_catch(name: &str, controls: GrantSimControls, kind: ViolationKind) -> u64 {
    for seed in 0..sim_seeds() {
        let r = sim::run(&GrantSimConfig {
            controls,
            ..GrantSimConfig::new(seed)
        });
        if let Some(v) = r.first_of_each_kind.iter().find(|v| v.kind == kind) {
            eprintln!(
                "control {name}: caught by {kind:?} at seed {seed} (rerun: GrantSimConfig::new({seed}) \
                 with the control; {} violating checks in all): {v}",
                r.violations
            );
            return seed;
        }
    }
    panic!(
        "control {name}: not caught by {kind:?} in seeds 0..{}",
        sim_seeds()
    );
}

#[test]
fn control_the_simulation_catches_a_restart_that_forgets_its_holder() {
    let controls = GrantSimControls {
        restart_forgets_holder: true,
        ..Default::default()
    };
    first_catch(
        "restart forgets holder",
        controls,
        ViolationKind::LeaseExclusion,
    );
}

#[test]
fn control_the_simulation_catches_a_loss_told_only_when_the_transport_returns() {
    let controls = GrantSimControls {
        loss_only_when_the_transport_returns: true,
        ..Default::default()
    };
    first_catch(
        "loss only when the transport returns",
        controls,
        ViolationKind::LeaseExclusion,
    );
}

#[test]
fn control_the_simulation_catches_a_takeover_that_compares_the_old_clock() {
    let controls = GrantSimControls {
        takeover_keeps_old_expiry: true,
        ..Default::default()
    };
    first_catch(
        "takeover keeps old expiry",
        controls,
        ViolationKind::SessionBound,
    );
}

/// Every instant and duration near `u64::MAX`: nothing panics (debug builds check overflow),
/// nothing wraps, and the grantor still holds at least as long as the holder believes.
#[test]
fn arithmetic_near_u64_max_saturates_and_never_panics() {
    let config = GrantConfig::default();
    let late = SimClock::new(u64::MAX - 1_000 * MS, 0);
    let record = GrantorRecord {
        last_token: 1,
        holding_back: false,
        holder: Some((1, 3_000)),
    };
    let restored = LeaseServer::restore(late.clone(), config, record);
    let (_, expiry_ns) = restored.holder(late.now_ns()).expect("restored holder");
    assert_eq!(
        expiry_ns,
        u64::MAX,
        "held for as long as the clock can count"
    );
    let mut server = fresh(late.clone(), config);
    let sent_at_ns = late.now_ns();
    let grant = server.acquire_now(1, 3_000).expect("free");
    let mut holder = LeaseHolder::new(config);
    holder.on_grant(sent_at_ns, grant);
    assert_eq!(holder.valid_until_ns(), Some(u64::MAX));
    assert_eq!(server.holder(u64::MAX - 1), Some((1, u64::MAX)));
    // A garbage answer naming an absurd term is believed for no longer than the longest term.
    let mut h = LeaseHolder::new(config);
    h.on_grant(
        0,
        Grant {
            token: 1,
            term_ms: u64::MAX,
        },
    );
    assert_eq!(
        h.valid_until_ns(),
        Some(config.holder_valid_ns(config.max_term_ms))
    );
    let mut sessions = Sessions::new(config);
    let id = sessions.grant(3_000, u64::MAX - MS).unwrap();
    assert_eq!(sessions.keepalive(&[id], u64::MAX - 1).refreshed, 1);
    sessions.takeover(u64::MAX - 1);
    assert!(sessions.is_live(id, u64::MAX - 1));
    // The view saturated at u64::MAX: renew a third before it, lose it d/12 before it.
    let mut renewal = Renewal::new(holder, 3_000).expect("a 3 s term");
    assert!(matches!(
        renewal.poll(u64::MAX - 500 * MS),
        raft_lease::grant::RenewStep::Send { deadline_ns, .. } if deadline_ns == u64::MAX - 250 * MS
    ));
    assert!(matches!(
        renewal.poll(u64::MAX - 1),
        raft_lease::grant::RenewStep::Event(LeaseEvent::Lost { .. })
    ));
}

#[test]
fn control_the_simulation_catches_a_release_naming_only_the_client() {
    let controls = GrantSimControls {
        release_naming_only_the_client: true,
        ..Default::default()
    };
    first_catch(
        "release naming only the client",
        controls,
        ViolationKind::LeaseExclusion,
    );
}

#[test]
fn control_the_simulation_catches_an_unlock_naming_only_the_session() {
    let controls = GrantSimControls {
        unlock_naming_only_the_session: true,
        ..Default::default()
    };
    first_catch(
        "unlock naming only the session",
        controls,
        ViolationKind::LockExclusion,
    );
}

#[test]
fn control_the_simulation_catches_a_lock_answering_its_holder_with_its_token() {
    let controls = GrantSimControls {
        lock_granting_the_holder_again: true,
        ..Default::default()
    };
    first_catch(
        "lock granting the holder again",
        controls,
        ViolationKind::LockExclusion,
    );
}

/// Client 1 acquires (token 1) and releases it. Copy A of the release is delayed; the retried copy
/// B frees the lease and is answered; client 1 acquires again (token 2); then copy A arrives, and
/// client 2 asks. Returns what clients 1 and 2 believe at that instant (one clock, drift 0).
fn late_release_copy(
    release: fn(&mut LeaseServer<SimClock>, ClientId, u64) -> bool,
) -> (Option<u64>, Option<u64>) {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let first = server.acquire_now(1, 3_000).unwrap();
    clock.advance(500 * MS);
    assert!(release(&mut server, 1, first.token), "copy B frees it");
    clock.advance(10 * MS);
    let mut c1 = LeaseHolder::new(config);
    c1.on_grant(clock.now_ns(), server.acquire_now(1, 3_000).unwrap());
    clock.advance(5 * MS);
    release(&mut server, 1, first.token); // copy A, late
    let mut c2 = LeaseHolder::new(config);
    if let Ok(grant) = server.acquire_now(2, 3_000) {
        c2.on_grant(clock.now_ns(), grant);
    }
    let now_ns = clock.now_ns();
    (c1.token(now_ns), c2.token(now_ns))
}

#[test]
fn a_late_copy_of_a_release_never_frees_the_clients_next_holding() {
    let release = |s: &mut LeaseServer<SimClock>, c, token| s.release(c, token);
    assert_eq!(late_release_copy(release), (Some(2), None));
}

#[test]
fn control_a_release_naming_only_the_client_gives_two_holders() {
    let release = |s: &mut LeaseServer<SimClock>, c, _| s.control_release_naming_only_the_client(c);
    assert_eq!(
        late_release_copy(release),
        (Some(2), Some(3)),
        "two holders"
    );
}

/// Session `a` locks `L` (token 1) and unlocks it; copy A of the unlock is delayed, copy B frees
/// it, `a` locks again (token 2), copy A arrives, and session `b` asks. Returns (the holder and
/// token the grantor has, the token `a` was granted last).
fn late_unlock_copy(
    unlock: fn(&mut Sessions, SessionId, u64) -> bool,
) -> (Option<(SessionId, u64)>, u64, SessionId) {
    let mut s = Sessions::new(GrantConfig::default());
    let (a, b) = (s.grant(10_000, 0).unwrap(), s.grant(10_000, 0).unwrap());
    let first = s.lock("L", a, 0).unwrap();
    assert!(unlock(&mut s, a, first), "copy B frees it");
    let second = s.lock("L", a, 10 * MS).unwrap();
    unlock(&mut s, a, first); // copy A, late
    let _ = s.lock("L", b, 11 * MS);
    (s.lock_holder("L"), second, a)
}

#[test]
fn a_late_copy_of_an_unlock_never_frees_the_sessions_next_lock() {
    let (holder, second, a) = late_unlock_copy(|s, id, token| s.unlock("L", id, token));
    assert_eq!(holder, Some((a, second)), "a keeps the lock it was granted");
}

#[test]
fn control_an_unlock_naming_only_the_session_gives_the_lock_to_two_sessions() {
    let (holder, second, a) =
        late_unlock_copy(|s, id, _| s.control_unlock_naming_only_the_session("L", id));
    assert_eq!(second, 2);
    assert!(
        matches!(holder, Some((b, 3)) if b != a),
        "a believes token 2 while another session holds token 3: {holder:?}"
    );
}

/// Session `a` holds `L` (token 1) and sends an unlock that is slow; it locks again, and that
/// request overtakes the unlock. Returns what the second lock answered and who holds `L` once
/// the slow unlock has arrived.
fn lock_overtaking_its_unlock(
    lock: fn(&mut Sessions, SessionId) -> Result<u64, raft_lease::grant::SessionError>,
) -> (
    Result<u64, raft_lease::grant::SessionError>,
    Option<(SessionId, u64)>,
) {
    let mut s = Sessions::new(GrantConfig::default());
    let a = s.grant(10_000, 0).unwrap();
    assert_eq!(s.lock("L", a, 0), Ok(1));
    let answer = lock(&mut s, a); // overtakes the unlock of token 1
    s.unlock("L", a, 1); // the slow unlock
    (answer, s.lock_holder("L"))
}

#[test]
fn a_lock_request_overtaking_its_own_unlock_is_not_granted() {
    let (answer, holder) = lock_overtaking_its_unlock(|s, a| s.lock("L", a, MS));
    let a = SessionId(1);
    assert_eq!(
        answer,
        Err(raft_lease::grant::SessionError::LockHeld {
            name: "L".into(),
            holder: a,
            token: Some(1)
        }),
        "told its own token to unlock, not granted it"
    );
    assert_eq!(holder, None);
}

#[test]
fn control_a_lock_answering_its_holder_with_its_token_grants_a_freed_lock() {
    let (answer, holder) =
        lock_overtaking_its_unlock(|s, a| s.control_lock_granting_the_holder_again("L", a, MS));
    assert_eq!(answer, Ok(1), "believed");
    assert_eq!(holder, None, "but freed by the unlock it overtook");
}

/// Client 7's first incarnation holds the lease (token 1) and is paused; a supervisor starts a
/// second incarnation that reuses id 7 and asks. Returns (what the second is answered, whether
/// the FencedStore accepts a write from each while both believe).
fn reused_client_id(
    acquire: fn(&mut LeaseServer<SimClock>, u64) -> Result<Grant, AcquireError>,
) -> (Result<Grant, AcquireError>, bool) {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut server = fresh(clock.clone(), config);
    let mut old = LeaseHolder::new(config);
    old.on_grant(0, server.acquire_now(7, 3_000).unwrap());
    clock.advance(100 * MS);
    let answer = acquire(&mut server, clock.now_ns());
    let mut store = FencedStore::new("");
    let now_ns = clock.now_ns();
    let both = match (&answer, old.token(now_ns)) {
        (Ok(grant), Some(old_token)) => {
            store.write(grant.token, "from the new incarnation").is_ok()
                && store.write(old_token, "from the paused one").is_ok()
        }
        _ => false,
    };
    (answer, both)
}

#[test]
fn a_restarted_client_reusing_its_id_never_gets_the_holders_token() {
    let (answer, both) = reused_client_id(|s, now_ns| s.acquire(7, 3_000, now_ns));
    assert!(
        matches!(answer, Err(AcquireError::AlreadyHolder { .. })),
        "{answer:?}"
    );
    assert!(!both);
}

#[test]
fn control_an_acquire_that_renews_by_client_id_gives_two_holders_one_token() {
    let (answer, both) =
        reused_client_id(|s, now_ns| s.control_acquire_renewing_by_client_id(7, 3_000, now_ns));
    assert_eq!(answer.map(|g| g.token), Ok(1), "the holder's own token");
    assert!(both, "fencing cannot tell the two apart");
}

/// A session whose TTL ran out on the old grantor, and whose keep-alive was answered "unknown",
/// but which was not yet reaped when a new grantor took over. Returns whether it is live after the
/// takeover, and what a keep-alive then answers.
fn expired_session_after_takeover() -> (bool, usize) {
    let mut s = Sessions::new(GrantConfig::default());
    let a = s.grant(1_000, 0).unwrap();
    s.lock("L", a, 0).unwrap();
    assert_eq!(s.keepalive(&[a], 5_000 * MS).unknown, vec![a]);
    // The old grantor crashes before its housekeeping `expire`; a new one takes over.
    s.takeover(0);
    (s.is_live(a, 10 * MS), s.keepalive(&[a], 10 * MS).refreshed)
}

#[test]
fn a_session_answered_as_gone_is_never_revived_by_a_takeover() {
    assert_eq!(expired_session_after_takeover(), (false, 0));
}

const CHECKPOINT_EVERY_NS: u64 = 1_000 * MS;

/// A dead client's session (10 s TTL, holding lock `L`) under grantors that fail over every 5 s of
/// real time, each on a clock that starts somewhere else (drift 0: local time runs with real time).
/// Each grantor reaps every 100 ms and, if `checkpoints`, checkpoints every second; a takeover
/// is `takeover`. Returns the real time the lock was freed, if it was within 60 minutes, and
/// whether every takeover gave the session no more than its last checkpoint recorded.
fn dead_lock_freed_at_ns(
    takeover: fn(&mut Sessions, u64),
    checkpoints: bool,
) -> (Option<u64>, bool) {
    let config = GrantConfig {
        drift_ppm: 500,
        margin_ms: 10,
        max_term_ms: 600_000,
    };
    let mut s = Sessions::new(config);
    let dead = s.grant(10_000, 7 * DAY).unwrap();
    assert_eq!(s.lock("L", dead, 7 * DAY), Ok(1));
    let mut clock_at_real0 = 7 * DAY; // the current grantor's reading at real time 0
    let mut within_checkpoint = true;
    for real_ns in (100 * MS..=60 * 60_000 * MS).step_by(100 * MS as usize) {
        if real_ns % (5_000 * MS) == 0 {
            clock_at_real0 = (real_ns / MS) * 7_919 * MS % (30 * DAY) + HOUR; // another machine
            let recorded = s.last_checkpoint().remaining;
            takeover(&mut s, clock_at_real0 + real_ns);
            if let (Some((_, _, expiry_ns)), [(_, left_ns)]) =
                (s.expiries().next(), recorded.as_slice())
            {
                within_checkpoint &= expiry_ns - (clock_at_real0 + real_ns) <= *left_ns;
            }
        }
        let now_ns = clock_at_real0 + real_ns;
        if checkpoints && real_ns % CHECKPOINT_EVERY_NS == 0 {
            s.checkpoint(now_ns);
        }
        s.expire(now_ns);
        if s.lock_holder("L").is_none() {
            return (Some(real_ns), within_checkpoint);
        }
    }
    (None, within_checkpoint)
}

#[test]
fn frequent_takeovers_with_checkpoints_free_a_dead_clients_lock_in_time() {
    let (freed_ns, within_checkpoint) = dead_lock_freed_at_ns(Sessions::takeover, true);
    let freed_ns = freed_ns.expect("freed");
    assert!(
        within_checkpoint,
        "a takeover gave more than the checkpoint recorded"
    );
    // 10 s·(1+ρ) + ε = 10.015 s after the grant, plus at most one checkpoint interval per
    // takeover (two of them fell inside it), plus the 100 ms housekeeping step.
    let bound_ns = 10_015 * MS + 2 * CHECKPOINT_EVERY_NS + 100 * MS;
    eprintln!(
        "takeover every 5 s, checkpoint every 1 s: the dead client's lock freed at {:.3} s (bound {:.3} s)",
        freed_ns as f64 / 1e9,
        bound_ns as f64 / 1e9
    );
    assert!(freed_ns <= bound_ns, "{freed_ns} > {bound_ns}");
    assert!(freed_ns >= 10_000 * MS, "never before its TTL");
}

#[test]
fn control_frequent_takeovers_without_checkpoints_keep_a_dead_clients_lock_for_ever() {
    let ignoring = Sessions::control_takeover_ignoring_checkpoints;
    assert_eq!(
        dead_lock_freed_at_ns(ignoring, true),
        (None, false),
        "held after 60 min"
    );
    assert_eq!(
        dead_lock_freed_at_ns(Sessions::takeover, false).0,
        None,
        "a grantor that never checkpoints is no better: checkpointing is required"
    );
}

/// Drift rates of (client, old grantor, new grantor), each within ±ρ, and the gaps between steps.
struct TakeoverCase {
    config: GrantConfig,
    ttl_ms: u64,
    ppm: [i64; 3],
    /// Request delay, response delay, checkpoint after the answer, second keep-alive after the
    /// checkpoint (`None`: none), takeover after the last step; ns.
    gaps_ns: [u64; 4],
    second_keepalive_ns: Option<u64>,
}

fn random_takeover_case(rng: &mut ChaCha8Rng, skew: Option<[i64; 3]>) -> TakeoverCase {
    let rho = rng.gen_range(0..=20_000u64);
    let config = GrantConfig {
        drift_ppm: rho,
        margin_ms: rng.gen_range(1..=20),
        max_term_ms: 60_000,
    };
    let r = rho as i64;
    let ppm = skew.map_or_else(
        || [0; 3].map(|_| rng.gen_range(-r..=r)),
        |signs| signs.map(|s| s * r),
    );
    let ttl_ms = rng.gen_range(50..=20_000);
    let ttl_ns = ttl_ms * MS;
    TakeoverCase {
        config,
        ttl_ms,
        ppm,
        gaps_ns: [
            rng.gen_range(0..=500 * MS),
            rng.gen_range(0..=500 * MS),
            rng.gen_range(0..=ttl_ns),
            rng.gen_range(0..=2 * ttl_ns),
        ],
        second_keepalive_ns: rng.gen_bool(0.5).then(|| rng.gen_range(0..=ttl_ns / 2)),
    }
}

type KeepaliveFn = fn(&mut Sessions, &[SessionId], u64) -> raft_lease::grant::KeepAlive;

/// Plays one case; returns the real end of the client's view and the real expiry of its session
/// after the takeover, in ns from the start.
fn takeover_case_ends(case: &TakeoverCase, keepalive: KeepaliveFn) -> (u128, u128) {
    let starts = [3 * HOUR, 30 * DAY, HOUR / 7];
    let [client, old, new] = [0, 1, 2].map(|i| SimClock::new(starts[i], case.ppm[i]));
    let advance = |ns: u64| [&client, &old, &new].iter().for_each(|c| c.advance(ns));
    let [request_ns, response_ns, checkpoint_ns, takeover_ns] = case.gaps_ns;
    let mut s = Sessions::new(case.config);
    let mut view = LeaseHolder::new(case.config);
    let sent_at_ns = client.now_ns();
    advance(request_ns);
    let id = s.grant(case.ttl_ms, old.now_ns()).unwrap();
    advance(response_ns);
    let grant = Grant {
        token: id.0,
        term_ms: case.ttl_ms,
    };
    view.on_grant(sent_at_ns, grant);
    advance(checkpoint_ns);
    s.checkpoint(old.now_ns());
    if let Some(after_ns) = case.second_keepalive_ns {
        advance(after_ns);
        let sent_at_ns = client.now_ns();
        advance(request_ns);
        let refreshed = keepalive(&mut s, &[id], old.now_ns()).refreshed == 1;
        advance(response_ns);
        if refreshed {
            view.on_grant(sent_at_ns, grant);
        }
    }
    advance(takeover_ns);
    // Another machine: rebuilt from the image and the checkpoint of the same moment.
    let mut t = Sessions::from_image(case.config, s.image());
    t.restore_checkpoint(&s.last_checkpoint());
    t.takeover(new.now_ns());
    let (_, _, expiry_ns) = t.expiries().next().expect("one session");
    (
        real_when(view.valid_until_ns().unwrap(), starts[0], case.ppm[0]),
        real_when(expiry_ns, starts[2], case.ppm[2]),
    )
}

/// How many of 4,000 cases end a session, after a takeover, before its client's view ends.
fn takeovers_before_the_view(skew: Option<[i64; 3]>, keepalive: KeepaliveFn) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(0x7a4e);
    (0..4_000)
        .filter(|_| {
            let (view_end, expiry) =
                takeover_case_ends(&random_takeover_case(&mut rng, skew), keepalive);
            view_end > expiry
        })
        .count()
}

#[test]
fn property_a_takeover_after_a_checkpoint_never_ends_a_session_before_its_clients_view() {
    // Random rates, then every corner: client, old and new grantor each at +ρ or −ρ.
    let mut skews = vec![None];
    for bits in 0..8 {
        skews.push(Some(
            [0, 1, 2].map(|i| if bits >> i & 1 == 1 { 1 } else { -1 }),
        ));
    }
    for skew in skews {
        let bad = takeovers_before_the_view(skew, Sessions::keepalive);
        assert_eq!(bad, 0, "skew (client, old, new) = {skew:?}");
    }
}

#[test]
fn control_a_keepalive_that_keeps_the_checkpoint_ends_sessions_before_their_views() {
    let bad = takeovers_before_the_view(None, Sessions::control_keepalive_keeping_the_checkpoint);
    eprintln!("keep-alive keeping the checkpoint: the session ended before the view in {bad} of 4000 cases");
    assert!(bad > 0, "the property cannot tell the control apart");
}

#[test]
fn control_the_simulation_catches_a_renewal_added_to_the_old_expiry() {
    let controls = GrantSimControls {
        renewal_adds_to_the_old_expiry: true,
        ..Default::default()
    };
    first_catch(
        "renewal adds to the old expiry",
        controls,
        ViolationKind::LeaseBound,
    );
}

#[test]
fn control_the_simulation_catches_takeovers_ignoring_checkpoints() {
    let controls = GrantSimControls {
        takeover_ignoring_checkpoints: true,
        ..Default::default()
    };
    first_catch(
        "takeover ignoring checkpoints",
        controls,
        ViolationKind::SessionLiveness,
    );
}

#[test]
fn control_the_simulation_catches_a_keepalive_keeping_the_checkpoint() {
    let controls = GrantSimControls {
        keepalive_keeping_the_checkpoint: true,
        ..Default::default()
    };
    first_catch(
        "keep-alive keeping the checkpoint",
        controls,
        ViolationKind::SessionView,
    );
}

#[test]
fn a_term_too_short_to_renew_is_a_typed_error_not_a_panic() {
    let config = GrantConfig::default();
    let clock = SimClock::new(0, 0);
    let mut holder = LeaseHolder::new(config);
    holder.on_grant(
        0,
        Grant {
            token: 1,
            term_ms: 11,
        },
    );
    let transport = |_: RenewRequest| -> Result<Grant, TransportError> { unreachable!() };
    let spawned = Renewer::spawn(
        Arc::new(clock.clone()),
        holder,
        11,
        transport,
        SimSleeper::new(clock),
    );
    assert_eq!(
        spawned.err(),
        Some(raft_lease::grant::RenewalError::TermTooShort {
            term_ms: 11,
            min_ms: 12
        })
    );
}

/// Why `boot` needs the last token persisted before each grant's answer leaves: a grantor that
/// restarts from an older token hands the same token to a second holder, and fencing accepts
/// both writers. (The holdback keeps them apart in time, but not a paused ex-holder's late write.)
#[test]
fn boot_from_a_stale_last_token_repeats_a_token_that_fencing_accepts() {
    let config = GrantConfig {
        max_term_ms: 3_000,
        ..GrantConfig::default()
    };
    let clock = SimClock::new(0, 0);
    let mut first = fresh(clock.clone(), config);
    let persisted = first.last_token(); // 0, written before the grant below
    let paused = first.acquire_now(1, 3_000).unwrap(); // token 1, its write not persisted
    clock.advance(config.boot_holdback_ns() + 10 * MS);
    let mut stale = LeaseServer::boot(clock.clone(), config, persisted);
    let mut current = LeaseServer::boot(clock.clone(), config, first.last_token());
    clock.advance(config.boot_holdback_ns());
    let (again, next) = (
        stale.acquire_now(2, 3_000).unwrap(),
        current.acquire_now(2, 3_000).unwrap(),
    );
    assert_eq!((again.token, next.token), (1, 2));
    let mut store = FencedStore::new("");
    store.write(again.token, "new holder").unwrap();
    assert!(
        store
            .write(paused.token, "the paused ex-holder, late")
            .is_ok(),
        "a repeated token is not fenced"
    );
    store
        .write(next.token, "new holder, from the persisted token")
        .unwrap();
    assert!(store.write(paused.token, "late").is_err(), "fenced");
}
