//! A seeded, deterministic simulator of the general leases (feature `sim`).
//!
//! One grantor (a [`LeaseServer`](crate::grant::LeaseServer) for one lease and
//! [`Sessions`](crate::grant::Sessions) for lock `L`), several clients, every clock drifting within
//! `1 ± ρ` and starting anywhere in 60 days (clocks far apart), and these faults:
//! - grantor restarts on a new clock: the lease by boot holdback or restore, at random, from a
//!   record written only as its contract requires (so often stale: a release not written); the
//!   sessions from their image, the last checkpoint (every 500 ms) and a takeover;
//! - client links that block for up to 8 s (some clients' transports keep their deadlines,
//!   others wait for the answer), client crashes (a new [`ClientId`](crate::grant::ClientId) per
//!   incarnation) and drift changes;
//! - messages lost (1%), slow (5%, up to 1.5 s: later ones overtake them), and duplicated
//!   ([`GrantSimConfig::duplicate_ppm`], copies up to [`GrantSimConfig::duplicate_late_ms`] late).
//!
//! Clients acquire, renew and release the lease, and start sessions, keep them alive and lock
//! and unlock `L` under them, some in short bursts and some for long; they renew through the
//! [`Renewal`](crate::grant::Renewal) core and believe in a lease, lock or session until it says
//! lost. The checker ([`ViolationKind`]) runs at every millisecond of real time.
//!
//! ```
//! use raft_lease::grant::sim::{run, GrantSimConfig};
//!
//! let report = run(&GrantSimConfig::new(7));
//! assert_eq!(report.violations, 0, "seed 7: {:?}", report.first_violation);
//! assert!(report.checks > 0 && report.operations > 0);
//! ```

mod check;
mod client;
mod grantor;
mod net;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use check::{Violation, ViolationKind};

use check::Checker;
use client::Client;
use grantor::{random_clock, Grantor};
use net::{Net, NetFaults, Packet, Req, Resp};

use crate::clock::SimClock;
use crate::grant::GrantConfig;

const MS: u64 = 1_000_000;

/// The longest a crashed grantor stays down, in real ns.
pub(super) const MAX_OUTAGE_NS: u64 = 1_000 * MS;

/// One run's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantSimConfig {
    /// Everything random follows from it.
    pub seed: u64,
    /// How many clients contend.
    pub clients: usize,
    /// Real simulated time to run, in ms.
    pub duration_ms: u64,
    /// Chance that a message is delivered twice, in parts per million.
    pub duplicate_ppm: u32,
    /// How late a duplicate may arrive, in ms after it was sent (uniform from 0).
    pub duplicate_late_ms: u64,
    /// Print every delivery and fault to stderr (to study a failing seed).
    pub trace: bool,
    /// Negative controls (tests only).
    #[doc(hidden)]
    pub controls: GrantSimControls,
}

impl GrantSimConfig {
    /// Five clients for 20 s of simulated time, 10% of messages duplicated up to 2 s late, no
    /// control switched on.
    pub fn new(seed: u64) -> Self {
        GrantSimConfig {
            seed,
            clients: 5,
            duration_ms: 20_000,
            duplicate_ppm: 100_000,
            duplicate_late_ms: 2_000,
            trace: false,
            controls: GrantSimControls::default(),
        }
    }
}

/// NEGATIVE CONTROLS, for tests only: each brings back one known bug.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrantSimControls {
    /// A restarted grantor forgets its holder and grants at once.
    pub restart_forgets_holder: bool,
    /// Renewals decide the loss only when the transport returns.
    pub loss_only_when_the_transport_returns: bool,
    /// A takeover keeps the later of the old grantor's expiry and a full TTL.
    pub takeover_keeps_old_expiry: bool,
    /// A release names only the client, not the holding's token.
    pub release_naming_only_the_client: bool,
    /// An unlock names only the session, not the lock's token.
    pub unlock_naming_only_the_session: bool,
    /// A lock request from the session that holds the lock is answered with its token, as a grant.
    pub lock_granting_the_holder_again: bool,
    /// A renewal adds the term to the old expiry instead of to now.
    pub renewal_adds_to_the_old_expiry: bool,
    /// A takeover gives every session a full TTL, whatever the last checkpoint recorded.
    pub takeover_ignoring_checkpoints: bool,
    /// A keep-alive leaves the last checkpoint in place (a takeover then gives too little).
    pub keepalive_keeping_the_checkpoint: bool,
}

/// What a run did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantSimReport {
    /// The seed.
    pub seed: u64,
    /// Steps of 1 ms real time.
    pub steps: u64,
    /// Requests the grantor served.
    pub operations: u64,
    /// Leases granted or renewed, and locks granted.
    pub grants: u64,
    /// Grantor restarts.
    pub restarts: u64,
    /// Restarts from a lease record older than the grantor's state at the crash (a release not
    /// written, or a record written only on change).
    pub stale_records: u64,
    /// Client links blocked.
    pub blocks: u64,
    /// Times a client's owner was told its lease or session was lost.
    pub losses: u64,
    /// Checks evaluated.
    pub checks: u64,
    /// Checks that failed.
    pub violations: u64,
    /// The first failure.
    pub first_violation: Option<Violation>,
    /// The first failure of each kind, in the order they happened.
    pub first_of_each_kind: Vec<Violation>,
}

struct World {
    rng: ChaCha8Rng,
    now_ns: u64,
    config: GrantConfig,
    grantor: Grantor,
    clients: Vec<Client>,
    net: Net,
    checker: Checker,
    /// A crashed grantor restarts at this real instant.
    restart_at_ns: u64,
    report: GrantSimReport,
    trace: bool,
}

/// Run one simulation.
pub fn run(sim: &GrantSimConfig) -> GrantSimReport {
    let mut w = World::new(sim);
    while w.now_ns < sim.duration_ms * MS {
        w.step();
    }
    let mut report = w.report;
    report.losses = w.clients.iter().map(|c| c.losses).sum();
    report.checks = w.checker.checks;
    report.violations = w.checker.violations;
    report.first_violation = w.checker.firsts.first().cloned();
    report.first_of_each_kind = w.checker.firsts;
    report
}

impl World {
    fn new(sim: &GrantSimConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(sim.seed);
        let config = GrantConfig {
            drift_ppm: rng.gen_range(0..=10_000),
            margin_ms: rng.gen_range(1..=20),
            max_term_ms: 3_000,
        };
        let grantor = Grantor::new(&mut rng, config, sim.controls);
        let clients = (0..sim.clients)
            .map(|i| {
                let clock = random_clock(&mut rng, config.drift_ppm);
                let honors =
                    rng.gen_bool(0.5) && !sim.controls.loss_only_when_the_transport_returns;
                let control = sim.controls.loss_only_when_the_transport_returns;
                let release_one_in = if rng.gen_bool(0.5) { 300 } else { 5_000 };
                Client::new(i as u64, clock, honors, release_one_in, config, control)
            })
            .collect();
        let faults = NetFaults {
            max_delay_ns: 20 * MS,
            loss_ppm: 10_000,
            dup_ppm: sim.duplicate_ppm,
            dup_late_ns: sim.duplicate_late_ms * MS,
            slow_ppm: 50_000,
            slow_late_ns: 1_500 * MS,
        };
        let net = Net::new(sim.clients, faults);
        World {
            rng,
            now_ns: 0,
            config,
            grantor,
            clients,
            net,
            checker: Checker::default(),
            restart_at_ns: 0,
            trace: sim.trace,
            report: GrantSimReport {
                seed: sim.seed,
                ..Default::default()
            },
        }
    }

    fn clocks(&self) -> impl Iterator<Item = &SimClock> {
        std::iter::once(&self.grantor.clock).chain(self.clients.iter().map(|c| &c.clock))
    }

    fn step(&mut self) {
        self.now_ns += MS;
        self.report.steps += 1;
        for c in self.clocks() {
            c.advance(MS);
        }
        self.faults();
        for p in self.net.due(self.now_ns) {
            self.deliver(p);
        }
        if !self.grantor.down {
            self.grantor.tick(&mut self.rng);
        }
        for i in 0..self.clients.len() {
            let requests = self.clients[i].step(&mut self.rng);
            let from = self.clients[i].id();
            for (req_id, req) in requests {
                let p = Packet::ToGrantor {
                    client: i,
                    from,
                    req_id,
                    req,
                };
                self.net.send(p, self.now_ns, &mut self.rng);
            }
        }
        let (now_ns, config) = (self.now_ns, self.config);
        self.checker
            .check(now_ns, &self.clients, &self.grantor, &config);
    }

    fn deliver(&mut self, p: Packet) {
        let down = self.grantor.down;
        log(self.trace, self.now_ns, || {
            format!("{p:?} (grantor down: {down})")
        });
        match p {
            Packet::ToGrantor { .. } if self.grantor.down => {}
            Packet::ToGrantor {
                client,
                from,
                req_id,
                req,
            } => {
                let keepalive = match req {
                    Req::KeepAlive { sid, .. } => Some(sid),
                    _ => None,
                };
                let resp = self.grantor.handle(from, req);
                self.report.operations += 1;
                if matches!(resp, Resp::Grant(Ok(_)) | Resp::Lock(Ok(_))) {
                    self.report.grants += 1;
                }
                match (&resp, keepalive) {
                    (Resp::Session(Ok(sid)), _) => self.checker.refreshed(*sid, self.now_ns),
                    (Resp::Grant(Ok(_)), Some(sid)) => self.checker.refreshed(sid, self.now_ns),
                    _ => {}
                }
                let p = Packet::ToClient {
                    client,
                    req_id,
                    resp,
                };
                self.net.send(p, self.now_ns, &mut self.rng);
            }
            Packet::ToClient {
                client,
                req_id,
                resp,
            } => {
                self.clients[client].on_resp(req_id, resp, &mut self.rng);
            }
        }
    }

    /// Random faults, each at a rate per 1 ms step.
    fn faults(&mut self) {
        let (trace, now_ns) = (self.trace, self.now_ns);
        let rng = &mut self.rng;
        if self.grantor.down && self.now_ns >= self.restart_at_ns {
            let how = self.grantor.restart(rng);
            self.checker.took_over();
            self.report.restarts += 1;
            log(trace, now_ns, || format!("grantor restarts: {how}"));
        } else if !self.grantor.down && rng.gen_ratio(1, 4_000) {
            if self.grantor.crash() {
                self.report.stale_records += 1;
            }
            self.restart_at_ns = self.now_ns + rng.gen_range(0..=MAX_OUTAGE_NS);
            log(trace, now_ns, || "grantor crashes".into());
        }
        for i in 0..self.clients.len() {
            if rng.gen_ratio(1, 5_000) {
                let until_ns = self.now_ns + rng.gen_range(200..=8_000) * MS;
                self.net.block(i, until_ns);
                self.report.blocks += 1;
                log(trace, now_ns, || {
                    format!("client {i}'s link blocks until {} ms", until_ns / MS)
                });
            }
            if rng.gen_ratio(1, 20_000) {
                self.clients[i].crash(rng.gen_range(0..=3_000) * MS);
                log(trace, now_ns, || format!("client {i} crashes"));
            }
        }
        if rng.gen_ratio(1, 2_000) {
            let rho = self.config.drift_ppm as i64;
            let ppm = rng.gen_range(-rho..=rho);
            let which = rng.gen_range(0..=self.clients.len());
            self.clocks()
                .nth(which)
                .expect("in range")
                .set_drift_ppm(ppm);
        }
    }
}

fn log(trace: bool, now_ns: u64, what: impl FnOnce() -> String) {
    if trace {
        eprintln!("{:>6} ms: {}", now_ns / MS, what());
    }
}
