//! The sessions rule of the KV (keep-alives answered from the leader's memory, only while its
//! leader lease is valid) against the crate's general leases ([`Sessions`]), in simulated time.
//!
//! Leader A grants client 1 a session and lock `L`, then answers its keep-alives from memory. At
//! a random moment A is cut off from the other voters (the client still reaches it) and paused
//! for a while; it believes it leads until some time after it resumes. B's copy of the sessions
//! is the replicated one (no keep-alive is replicated). B can win an election only once its own
//! promise and C's have run out on their clocks, then takes over ([`Sessions::takeover`]),
//! expires client 1's session on its clock and gives `L` to client 2. Every clock drifts within
//! `1 ± ρ`; delays are random. The check, at every millisecond: no instant at which client 1
//! believes it holds `L` (its view: send time of its last answered keep-alive + `TTL·(1−ρ) − ε`)
//! while B has given `L` to client 2.
//!
//! The control answers keep-alives without the lease check; the same check must catch it.

use raft_lease::grant::{GrantConfig, SessionId, Sessions};
use raft_lease::{Clock, LeaseConfig, SimClock};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MS: u64 = 1_000_000;
const RHO_PPM: u64 = 500;

fn grant_config() -> GrantConfig {
    GrantConfig {
        drift_ppm: RHO_PPM,
        margin_ms: 10,
        max_term_ms: 60_000,
    }
}

fn drifting(rng: &mut ChaCha8Rng) -> SimClock {
    let drift = rng.gen_range(-(RHO_PPM as i64)..=RHO_PPM as i64);
    SimClock::new(rng.gen_range(0..1_000_000) * MS, drift)
}

/// A keep-alive on its way: (real time it reaches A, client 1's clock when it sent it).
type InFlight = (u64, u64);

struct World {
    rng: ChaCha8Rng,
    lease_check: bool,
    /// A, B, C, client 1.
    a: SimClock,
    b: SimClock,
    c: SimClock,
    c1: SimClock,
    a_sessions: Sessions,
    b_sessions: Option<Sessions>,
    replicated: Sessions,
    s1: SessionId,
    ttl_ms: u64,
    /// A's lease, on A's clock.
    a_lease_until: u64,
    /// B's and C's promises, each on its own clock.
    promise_until: [u64; 2],
    /// Real times: the cut, the end of A's pause, when A stops believing it leads.
    cut: u64,
    resume: u64,
    steps_down: u64,
    keepalives: Vec<InFlight>,
    /// Answers on their way back: (real arrival, client-1 send time).
    answers: Vec<InFlight>,
    view_until: u64,
    next_keepalive: u64,
    election_at: Option<u64>,
    l_given_to_2: bool,
}

impl World {
    fn new(seed: u64, lease_check: bool) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (a, b, c, c1) = (
            drifting(&mut rng),
            drifting(&mut rng),
            drifting(&mut rng),
            drifting(&mut rng),
        );
        let ttl_ms = rng.gen_range(500..4_000);
        let mut a_sessions = Sessions::new(grant_config());
        let s1 = a_sessions.grant(ttl_ms, a.now_ns()).unwrap();
        a_sessions.lock("L", s1, a.now_ns()).unwrap();
        let replicated = a_sessions.clone(); // grant and lock are raft entries; keep-alives not
        let cut = rng.gen_range(500..6_000) * MS;
        let resume = cut + rng.gen_range(0..4_000) * MS;
        let steps_down = resume + rng.gen_range(50..1_500) * MS;
        let view_until = c1.now_ns() + grant_config().holder_valid_ns(ttl_ms);
        World {
            rng,
            lease_check,
            a,
            b,
            c,
            c1,
            a_sessions,
            b_sessions: None,
            replicated,
            s1,
            ttl_ms,
            a_lease_until: 0,
            promise_until: [0, 0],
            cut,
            resume,
            steps_down,
            keepalives: Vec::new(),
            answers: Vec::new(),
            view_until,
            next_keepalive: 0,
            election_at: None,
            l_given_to_2: false,
        }
    }

    /// One heartbeat round from A while it is connected: `t0` before sending, promises from
    /// receipt, the lease from the first ack (A and one follower are a majority of three).
    fn heartbeat(&mut self, now: u64, lease_ns: u64, promise_ns: u64) {
        if now >= self.cut || now % (50 * MS) != 0 {
            return;
        }
        let t0 = self.a.now_ns();
        // Delivery is instantaneous at this grain; a delay only shortens the lease.
        self.promise_until[0] = self.promise_until[0].max(self.b.now_ns() + promise_ns);
        self.promise_until[1] = self.promise_until[1].max(self.c.now_ns() + promise_ns);
        self.a_lease_until = self.a_lease_until.max(t0 + lease_ns);
    }

    fn client_sends(&mut self, now: u64) {
        if self.c1.now_ns() < self.next_keepalive || self.c1.now_ns() >= self.view_until {
            return; // not due, or the client has given up its session (its view ended)
        }
        let delay = self.rng.gen_range(0..30) * MS;
        self.keepalives.push((now + delay, self.c1.now_ns()));
        self.next_keepalive = self.c1.now_ns() + self.ttl_ms * MS / 3;
    }

    /// A answers what reached it, unless paused (then at resume), while it believes it leads.
    fn a_serves(&mut self, now: u64) {
        let paused = (self.cut..self.resume).contains(&now);
        if paused || now >= self.steps_down {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = self.keepalives.drain(..).partition(|k| k.0 <= now);
        self.keepalives = later;
        for (_, sent_at) in due {
            let a_now = self.a.now_ns();
            let refreshed = self.a_sessions.keepalive(&[self.s1], a_now).refreshed == 1;
            let lease_valid = self.a.now_ns() < self.a_lease_until; // validate after the update
            if refreshed && (lease_valid || !self.lease_check) {
                let delay = self.rng.gen_range(0..30) * MS;
                self.answers.push((now + delay, sent_at));
            }
        }
    }

    fn client_hears(&mut self, now: u64) {
        let valid_ns = grant_config().holder_valid_ns(self.ttl_ms);
        for &(at, sent_at) in self.answers.iter().filter(|x| x.0 <= now) {
            debug_assert!(at <= now);
            self.view_until = self.view_until.max(sent_at + valid_ns);
        }
        self.answers.retain(|x| x.0 > now);
    }

    /// B campaigns once its promise and C's ran out (plus jitter), takes over, expires client
    /// 1's session on its own clock and gives `L` to client 2.
    fn b_grants(&mut self, now: u64) {
        let promises_over =
            self.b.now_ns() >= self.promise_until[0] && self.c.now_ns() >= self.promise_until[1];
        if now >= self.cut && promises_over && self.election_at.is_none() {
            self.election_at = Some(now + self.rng.gen_range(1..300) * MS);
        }
        if self.election_at.is_some_and(|t| now >= t) && self.b_sessions.is_none() {
            let mut s = self.replicated.clone();
            s.takeover(self.b.now_ns());
            self.b_sessions = Some(s);
        }
        if let Some(s) = self.b_sessions.as_mut() {
            let b_now = self.b.now_ns();
            s.expire(b_now);
            if !self.l_given_to_2 && s.lock_holder("L").is_none() {
                let s2 = s.grant(self.ttl_ms, b_now).unwrap();
                s.lock("L", s2, b_now).unwrap();
                self.l_given_to_2 = true;
            }
        }
    }
}

/// Run one seed: the first real ms at which client 1 believes in `L` while client 2 holds it.
fn violation(seed: u64, lease_check: bool) -> Option<u64> {
    let lease = LeaseConfig {
        promise_ms: 1_000,
        drift_ppm: RHO_PPM,
        margin_ms: 10,
        ..Default::default()
    };
    let (lease_ns, promise_ns) = (lease.lease_ns(), lease.promise_ms * MS);
    let mut w = World::new(seed, lease_check);
    let end = w.steps_down + 3 * w.ttl_ms * MS + 3_000 * MS;
    let mut now = 0;
    while now < end {
        w.heartbeat(now, lease_ns, promise_ns);
        w.client_sends(now);
        w.a_serves(now);
        w.client_hears(now);
        w.b_grants(now);
        if w.l_given_to_2 && w.c1.now_ns() < w.view_until {
            return Some(now);
        }
        now += MS;
        for clock in [&w.a, &w.b, &w.c, &w.c1] {
            clock.advance(MS);
        }
    }
    assert!(
        w.l_given_to_2,
        "seed {seed}: B never gave L to client 2 (liveness)"
    );
    None
}

#[test]
fn keepalives_answered_only_under_the_lease_never_outlive_the_new_grantors_expiry() {
    for seed in 0..150 {
        if let Some(t) = violation(seed, true) {
            panic!(
                "seed {seed}: at {} ms client 1 believed in L while B had given it to client 2",
                t / MS
            );
        }
    }
}

#[test]
fn control_keepalives_without_the_lease_check_outlive_the_new_grantors_expiry() {
    let caught = (0..150)
        .filter(|&seed| violation(seed, false).is_some())
        .count();
    eprintln!("control: {caught} of 150 seeds caught");
    assert!(
        caught > 0,
        "the check never caught keep-alives answered without the lease"
    );
}
