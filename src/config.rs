//! Lease configuration: the promise `P`, the drift bound `ρ`, the margin `ε`, and what follows from them.

use thiserror::Error;

/// Largest drift bound accepted: ρ = 0.1 (100,000 ppm).
pub const MAX_DRIFT_PPM: u64 = 100_000;

const NS_PER_MS: u64 = 1_000_000;
const PPM: u64 = 1_000_000;

/// Which of the lease's safeties are on. The default, every one of them, is the only setting
/// for real use.
///
/// Users see one switch, [`Safeties::raft_lease_based`], for side-by-side comparisons with
/// raft-rs. The negative controls that prove the crate's own tests can fail live in a hidden
/// field (as CockroachDB's `TestingKnobs` do) and are not part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Safeties {
    /// Serve lease reads the way raft-rs `ReadOnlyOption::LeaseBased` does: from tick-based
    /// check-quorum, with no clock. **Unsafe**: it serves stale reads after a partition, a pause
    /// or a stalled ticker. For comparisons only.
    pub raft_lease_based: bool,
    /// Negative controls for this crate's tests. Not part of the API: leave at the default.
    #[doc(hidden)]
    pub testing: TestingKnobs,
}

/// Each knob switches one safety off, to show that a test catches its absence.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TestingKnobs {
    /// Followers keep no real-time promise: votes are left to raft-rs's tick-based check. The
    /// boot promise and the campaign hold are part of the promise, so they go too.
    pub no_promise: bool,
    /// A restarted node votes at once instead of refusing votes for `P` after boot.
    pub no_boot_promise: bool,
    /// Votes for others are refused under the promise, but the node may campaign meanwhile.
    pub no_campaign_hold: bool,
    /// The leader keeps serving lease reads after `MsgTimeoutNow` left in its term.
    pub no_transfer_fence: bool,
    /// A transfer raft gave up lifts the fence even after `MsgTimeoutNow` left in the term,
    /// instead of stepping down.
    pub lift_fence_after_timeout_now: bool,
    /// A ReadIndex context whose round is gone gets a new round with a later `t0`.
    pub remap_retired_ctx: bool,
    /// A ReadIndex round retried because it went unanswered keeps the first attempt's context,
    /// with the reads started since (etcd-io/etcd#21399). raft-rs ignores a context that is
    /// already pending, so acknowledgements of the first attempt's heartbeats answer reads that
    /// started later, with the read index of the first attempt.
    pub reuse_read_ctx_on_retry: bool,
    /// A leader renews from its own clock whenever the configuration has one voter, itself or not.
    pub renew_any_singleton: bool,
    /// raft-rs 0.7's own handling of a leader's removal: the leader may propose it, and keeps
    /// leading after applying it (instead of being refused, and stepping down).
    pub keep_removed_leader: bool,
    /// Followers whose promises end together campaign together (no jitter).
    pub no_campaign_jitter: bool,
    /// Shared liveness: a supporter forgets the epochs it withdrew, so support can come back at
    /// one of them.
    pub forget_withdrawals: bool,
    /// Shared liveness: a leader that steps down does not release its followers' fortification,
    /// so a group stuck on a live node stays fortified to a leader that cannot serve.
    pub no_give_up: bool,
    /// Shared liveness with follower read leases: a node that stops leading a group releases
    /// the voters fortified to it at once, while a read lease it granted in the group may still
    /// be served (FOLLOWER.md rule 13 switched off).
    pub release_at_once: bool,
    /// Shared liveness: a supporter that sees a later epoch ends the earlier one at once,
    /// releasing its replicas before the promise made under it has run out.
    pub end_epoch_at_once: bool,
    /// Shared liveness: a leader of a new term keeps counting the fortifications its followers
    /// made for an earlier term.
    pub count_earlier_terms: bool,
    /// Shared liveness: a fortified replica lets go of its fortification as soon as its raft term
    /// moves (a rejected pre-vote response of a later term is enough), and lets such messages
    /// move it, while its node still supports the leader the lease counts it for.
    pub release_on_term_move: bool,
    /// A leader counts every acknowledgement on its own promise `P` (and a requester every
    /// support on its own support duration), not on the one the acknowledging node says it made,
    /// and a node boots with a promise of its own `P` only: nodes with different settings (a
    /// rolling change) then overlap leases.
    pub count_own_promise: bool,
    /// Shared liveness: a group removed from a node forgets the fortification its replica made,
    /// so a replica of the group hosted there again votes at once although the leader may still
    /// count the old one.
    pub forget_removed_fortifications: bool,
    /// Follower read leases: every replica applies up to raft's commit index, not the exposed
    /// index `E`.
    pub apply_to_commit: bool,
    /// Follower read leases: the leader exposes up to its commit index whatever its holders
    /// have matched.
    pub expose_commit: bool,
    /// Follower read leases: a transfer's `MsgTimeoutNow` leaves at once, while read leases the
    /// leader granted may still be served.
    pub no_transfer_wait: bool,
    /// Follower read leases: a grant is `G` whatever is left of the leader's own lease, so a
    /// read lease may outlive the leader lease that granted it.
    pub uncapped_grant: bool,
    /// Follower read leases: a voter whose matched index is below the exposed index is granted
    /// a read lease all the same.
    pub grant_lagging: bool,
    /// Follower read leases: a holder counts its read lease from the grant's receipt instead of
    /// from its acknowledgement's send time.
    pub lease_from_receipt: bool,
    /// Follower read leases: a holder's tag counter never moves, so one tag names every
    /// acknowledgement of a term, and a grant is counted from the latest one's send time.
    pub reuse_tags: bool,
    /// Follower read leases: a follower read ignores the entries pending above applied, even
    /// those that write its keys.
    pub ignore_pending_keys: bool,
    /// Follower read leases: a membership change is proposed, and granting goes on, while
    /// read leases live, so it may be committed at a replica that cannot apply it.
    pub conf_with_grants: bool,
    /// Follower read leases: a holder takes a grant its give-up voided (one that was on its
    /// way when it gave its lease up), so its lease lives on after the leader stopped counting
    /// it.
    pub accept_voided_grants: bool,
    /// Follower read leases, not a safety: the leader never asks its holders to give their
    /// read leases up, so a transfer or a membership change waits for every grant to run out
    /// (the behaviour measured beside give-ups).
    pub no_read_lease_give_ups: bool,
    /// Follower read leases, liveness: the leader goes on asking its holders to give their
    /// read leases up once nothing waits any more, until every grant has ended (each new grant
    /// is then given up as it arrives, for the rest of the term).
    pub asks_after_waits: bool,
    /// Follower read leases, liveness: a leader whose transfer raft gave up before any
    /// `MsgTimeoutNow` left never grants again in that term.
    pub no_resume_after_abandoned_transfer: bool,
    /// Follower read leases: a replica ignores that its leader runs without them, and waits for
    /// an exposed index that leader never sends.
    pub ignore_plain_leaders: bool,
    /// Many groups: a node's one sync of a round comes after every group's `advance`, so a
    /// leader counts entries towards a commit, and applies them, before they are durable.
    pub sync_after_advance: bool,
}

impl TestingKnobs {
    /// The names of the knobs that are set.
    pub fn set(&self) -> Vec<&'static str> {
        let knobs = [
            (self.no_promise, "no_promise"),
            (self.no_boot_promise, "no_boot_promise"),
            (self.no_campaign_hold, "no_campaign_hold"),
            (self.no_transfer_fence, "no_transfer_fence"),
            (
                self.lift_fence_after_timeout_now,
                "lift_fence_after_timeout_now",
            ),
            (self.remap_retired_ctx, "remap_retired_ctx"),
            (self.reuse_read_ctx_on_retry, "reuse_read_ctx_on_retry"),
            (self.renew_any_singleton, "renew_any_singleton"),
            (self.keep_removed_leader, "keep_removed_leader"),
            (self.no_campaign_jitter, "no_campaign_jitter"),
            (self.forget_withdrawals, "forget_withdrawals"),
            (self.no_give_up, "no_give_up"),
            (self.release_at_once, "release_at_once"),
            (self.end_epoch_at_once, "end_epoch_at_once"),
            (self.count_earlier_terms, "count_earlier_terms"),
            (self.release_on_term_move, "release_on_term_move"),
            (self.apply_to_commit, "apply_to_commit"),
            (self.expose_commit, "expose_commit"),
            (self.no_transfer_wait, "no_transfer_wait"),
            (self.uncapped_grant, "uncapped_grant"),
            (self.grant_lagging, "grant_lagging"),
            (self.lease_from_receipt, "lease_from_receipt"),
            (self.reuse_tags, "reuse_tags"),
            (self.ignore_pending_keys, "ignore_pending_keys"),
            (self.conf_with_grants, "conf_with_grants"),
            (self.accept_voided_grants, "accept_voided_grants"),
            (self.no_read_lease_give_ups, "no_read_lease_give_ups"),
            (self.asks_after_waits, "asks_after_waits"),
            (
                self.no_resume_after_abandoned_transfer,
                "no_resume_after_abandoned_transfer",
            ),
            (self.ignore_plain_leaders, "ignore_plain_leaders"),
            (self.sync_after_advance, "sync_after_advance"),
            (self.count_own_promise, "count_own_promise"),
            (
                self.forget_removed_fortifications,
                "forget_removed_fortifications",
            ),
        ];
        knobs
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| name)
            .collect()
    }
}

impl Safeties {
    /// Every safety on except raft-rs `LeaseBased` reads, for comparisons.
    pub fn raft_lease_based() -> Self {
        Safeties {
            raft_lease_based: true,
            ..Safeties::default()
        }
    }

    /// Whether every safety is on.
    pub fn all_on(&self) -> bool {
        *self == Safeties::default()
    }

    /// Votes for others are refused while the promise holds.
    pub(crate) fn promise(&self) -> bool {
        !self.raft_lease_based && !self.testing.no_promise
    }

    /// A booting node refuses votes for `P`.
    pub(crate) fn boot_promise(&self) -> bool {
        self.promise() && !self.testing.no_boot_promise
    }

    /// A node does not campaign while its promise holds.
    pub(crate) fn campaign_hold(&self) -> bool {
        self.promise() && !self.testing.no_campaign_hold
    }

    /// The lease is fenced for the rest of the term once a transfer is under way.
    pub(crate) fn transfer_fence(&self) -> bool {
        !self.testing.no_transfer_fence
    }

    /// A leader whose transfer raft gave up after `MsgTimeoutNow` left steps down rather than
    /// lift the fence: the late message could still start a forced election in this term.
    pub(crate) fn abandoned_transfer_steps_down(&self) -> bool {
        !self.testing.lift_fence_after_timeout_now
    }

    /// Only this node being the one voter (in every half) lets it renew from its own clock.
    pub(crate) fn self_renewal_needs_sole_voter(&self) -> bool {
        !self.testing.renew_any_singleton
    }

    /// A leader may not propose its own removal, and steps down if it applies one anyway.
    pub(crate) fn guard_leader_removal(&self) -> bool {
        !self.testing.keep_removed_leader
    }

    /// Campaigns held back by the promise start after seeded jitter.
    pub(crate) fn campaign_jitter(&self) -> bool {
        !self.testing.no_campaign_jitter
    }

    /// A fortification lasts as long as the support it rests on, whatever raft's term does.
    pub(crate) fn fortification_outlives_term_moves(&self) -> bool {
        !self.testing.release_on_term_move
    }

    /// Acknowledgements are counted on the promise they carry, and a node boots with the
    /// promise of its previous run.
    pub(crate) fn count_carried_promise(&self) -> bool {
        !self.testing.count_own_promise
    }
}

/// Configuration of the lease layer. Durations are in the units their names say.
///
/// See "Choosing the numbers" in the [crate docs](crate) for how to pick `P`, `ρ` and `ε`.
///
/// # Example
/// Choose `P`, `ρ` and `ε` from raft's election timeout, check them, and see each error.
///
/// ```
/// use raft_lease::{ConfigError, LeaseConfig};
///
/// // raft: 10 ms ticks, an election timeout of 100 ticks (1 s), a heartbeat every 10 ticks.
/// let tick_ms = 10;
/// let raft = raft::Config { election_tick: 100, heartbeat_tick: 10, ..Default::default() };
/// let election_ms = raft.min_election_tick() as u64 * tick_ms;
///
/// // P: the election timeout. ρ: 500 ppm, for clocks whose time daemon slews at most 500 ppm.
/// // ε: 10 ms.
/// let config = LeaseConfig {
///     promise_ms: election_ms,
///     drift_ppm: 500,
///     margin_ms: 10,
///     ..LeaseConfig::default()
/// };
/// let derived = config.validate(&raft, tick_ms)?;
/// // L = P·(1−ρ)/(1+ρ) − ε = 1000 ms × 0.9995 / 1.0005 − 10 ms ≈ 989.0 ms.
/// assert_eq!(derived.lease_ns, 989_000_499);
/// assert_eq!(derived.promise_ns, 1_000_000_000);
/// // Renewal is due once a third of the lease is left (`renew_below_pct: 33`).
/// assert_eq!(derived.renew_before_ns, 989_000_499 / 100 * 33);
///
/// // A promise longer than the election timeout could outlast the leader it backs.
/// let long = LeaseConfig { promise_ms: 1_001, ..config.clone() };
/// assert_eq!(
///     long.validate(&raft, tick_ms),
///     Err(ConfigError::PromiseExceedsElectionTimeout { promise_ms: 1_001, election_ms: 1_000 })
/// );
/// // A lease no longer than one heartbeat interval would lapse between every two renewals:
/// // P = 100 ms gives L = 89.9 ms, under the 100 ms heartbeat.
/// let short = LeaseConfig { promise_ms: 100, ..config.clone() };
/// let err = short.validate(&raft, tick_ms).unwrap_err();
/// assert_eq!(
///     err,
///     ConfigError::LeaseNotAboveHeartbeat { lease_ns: 89_900_049, heartbeat_ms: 100 }
/// );
/// assert_eq!(
///     err.to_string(),
///     "lease would be 89900049 ns, not above the heartbeat interval of 100 ms: \
///      raise promise_ms or lower heartbeat_tick"
/// );
/// // Drift and margin can eat the whole promise.
/// let none_left = LeaseConfig { promise_ms: 10, margin_ms: 10, ..config.clone() };
/// assert_eq!(
///     none_left.validate(&raft, tick_ms),
///     Err(ConfigError::LeaseNotPositive { promise_ms: 10, lease_ns: 0 })
/// );
/// // ρ is at most 10% (100,000 ppm); the renew point is 1..=90% of the lease; ticks are not 0.
/// let wild = LeaseConfig { drift_ppm: 200_000, ..config.clone() };
/// assert_eq!(
///     wild.validate(&raft, tick_ms),
///     Err(ConfigError::DriftOutOfRange { drift_ppm: 200_000 })
/// );
/// let late = LeaseConfig { renew_below_pct: 95, ..config.clone() };
/// assert_eq!(
///     late.validate(&raft, tick_ms),
///     Err(ConfigError::RenewPointOutOfRange { renew_below_pct: 95 })
/// );
/// assert_eq!(config.validate(&raft, 0), Err(ConfigError::ZeroTick));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// `P`: how long a follower refuses other candidates' votes after accepting a leader message,
    /// measured on its own clock. Must not exceed raft's minimum election timeout.
    pub promise_ms: u64,
    /// `ρ`: the bound on every clock's rate error, in parts per million. At most [`MAX_DRIFT_PPM`].
    pub drift_ppm: u64,
    /// `ε`: a safety margin subtracted from the lease, in milliseconds.
    pub margin_ms: u64,
    /// Renew when at most this percentage of the lease is left (default 33: a third). In `1..=90`.
    pub renew_below_pct: u64,
    /// Which safeties are on. Leave at the default (all) outside comparisons.
    pub safeties: Safeties,
    /// Mixed with the raft id and the boot time to seed the campaign jitter. Simulations set it
    /// so that a run reproduces; any value is safe.
    pub seed: u64,
    /// The longest promise this node's previous run may have made, in milliseconds (0: none
    /// known). A booting node refuses every vote for the longer of this and `promise_ms`: a
    /// node restarted with a shorter `promise_ms` (a rolling change of the setting) must keep
    /// the promise its previous run made. An application that lets `promise_ms` change persists
    /// the largest value it ran with and passes it here (the example KV does).
    pub prior_promise_ms: u64,
    /// Read leases for followers: every voter serves linearizable reads locally while it holds
    /// one (see [`crate::follower`] and `docs/follower.md`). Off (`None`) by default.
    /// Experimental: a write waits for every live holder, and a transfer or a membership change
    /// waits up to `G` for the read leases to end (holders do not give theirs up early yet).
    pub follower_leases: Option<FollowerLeases>,
}

/// Follower read leases' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerLeases {
    /// `G`: the longest read lease the leader grants, on its own clock. A grant is also capped
    /// by what is left of the leader's own lease. A transfer waits for every read lease to end,
    /// so `G` must stay well below raft's election timeout (raft gives a transfer up after one):
    /// at most half of it. A holder renews with every acknowledgement, so `G` must exceed one
    /// heartbeat interval. That is checked, but it is not enough for an idle follower to hold
    /// a read lease: with no writes a grant rides the leader's next heartbeat, one interval
    /// after the acknowledgement it answers, and the holder's lease runs from that
    /// acknowledgement, so choose `G` above two heartbeat intervals and a round trip, plus `ε`.
    pub max_grant_ms: u64,
    /// The lagging-node policy: the leader grants no read lease to a voter that lacks an entry
    /// committed longer ago than this, so one slow follower stops slowing writes once its last
    /// grant has run out (it reads through the leader meanwhile).
    /// `None`: every caught-up voter is granted, however late its acknowledgements come.
    pub max_lag_ms: Option<u64>,
}

impl FollowerLeases {
    /// Read leases of at most `max_grant_ms`, granted to every caught-up voter (no lagging-node
    /// policy).
    pub fn new(max_grant_ms: u64) -> Self {
        FollowerLeases {
            max_grant_ms,
            max_lag_ms: None,
        }
    }

    /// The same, with the lagging-node policy: no grant to a voter that lacks an entry
    /// committed more than `max_lag_ms` ago (a follower one batch behind under pipelined
    /// writes lacks only entries committed a moment ago, and keeps its grant).
    pub fn with_max_lag_ms(self, max_lag_ms: u64) -> Self {
        FollowerLeases {
            max_lag_ms: Some(max_lag_ms),
            ..self
        }
    }
}

impl Default for LeaseConfig {
    /// `P` = 1 s, ρ = 100,000 ppm, ε = 10 ms, renew at a third left.
    ///
    /// ρ = 10% is safe under any time daemon's slewing, chrony's default (83,333 ppm)
    /// included, at the price of a lease of about 0.82·`P`, which costs nothing in steady state
    /// (heartbeats renew it long before it runs out). Lower it only on hosts whose daemon is
    /// capped: see "Choosing the numbers" in the crate docs.
    fn default() -> Self {
        LeaseConfig {
            promise_ms: 1_000,
            drift_ppm: MAX_DRIFT_PPM,
            margin_ms: 10,
            renew_below_pct: 33,
            safeties: Safeties::default(),
            seed: 0,
            prior_promise_ms: 0,
            follower_leases: None,
        }
    }
}

/// Why a [`LeaseConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The drift bound is outside `[0, MAX_DRIFT_PPM]`.
    #[error("drift_ppm {drift_ppm} is outside [0, {MAX_DRIFT_PPM}] (ρ must be in [0, 0.1])")]
    DriftOutOfRange {
        /// The rejected value.
        drift_ppm: u64,
    },
    /// `L = P·(1−ρ)/(1+ρ) − ε` would not be positive.
    #[error(
        "lease would be {lease_ns} ns: promise_ms {promise_ms} is too short for drift and margin"
    )]
    LeaseNotPositive {
        /// The configured promise.
        promise_ms: u64,
        /// The lease that would result (0 when it would be negative).
        lease_ns: u64,
    },
    /// `P` exceeds raft's minimum election timeout in real time.
    #[error("promise_ms {promise_ms} exceeds raft's minimum election timeout of {election_ms} ms")]
    PromiseExceedsElectionTimeout {
        /// The configured promise.
        promise_ms: u64,
        /// `min_election_tick × tick_ms`.
        election_ms: u64,
    },
    /// The renew point is outside `1..=90` percent.
    #[error("renew_below_pct {renew_below_pct} is outside 1..=90")]
    RenewPointOutOfRange {
        /// The rejected value.
        renew_below_pct: u64,
    },
    /// The lease would not outlast one heartbeat interval, so it would lapse between every two
    /// renewals. Not unsafe, but reads would fall back to ReadIndex most of the time.
    #[error(
        "lease would be {lease_ns} ns, not above the heartbeat interval of {heartbeat_ms} ms: \
         raise promise_ms or lower heartbeat_tick"
    )]
    LeaseNotAboveHeartbeat {
        /// The lease that would result.
        lease_ns: u64,
        /// `heartbeat_tick × tick_ms`.
        heartbeat_ms: u64,
    },
    /// The tick interval is zero.
    #[error("tick_ms must be positive")]
    ZeroTick,
    /// `G` is not below half of raft's minimum election timeout: a transfer, which waits every
    /// read lease out, would be given up by raft.
    #[error(
        "follower max_grant_ms {max_grant_ms} is not below half the election timeout of \
         {election_ms} ms: transfers would be given up"
    )]
    GrantTooLong {
        /// The configured `G`.
        max_grant_ms: u64,
        /// `min_election_tick × tick_ms`.
        election_ms: u64,
    },
    /// `G` does not exceed one heartbeat interval: read leases would lapse between renewals.
    #[error(
        "follower max_grant_ms {max_grant_ms} is not above the heartbeat interval of \
         {heartbeat_ms} ms"
    )]
    GrantNotAboveHeartbeat {
        /// The configured `G`.
        max_grant_ms: u64,
        /// `heartbeat_tick × tick_ms`.
        heartbeat_ms: u64,
    },
}

/// The durations a valid [`LeaseConfig`] implies, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// `P`.
    pub promise_ns: u64,
    /// How long a booting node refuses every vote: the longer of `P` and the prior promise.
    pub boot_promise_ns: u64,
    /// `L = P·(1−ρ)/(1+ρ) − ε`, rounded down. Always above one heartbeat interval and below `P`.
    pub lease_ns: u64,
    /// `ρ`, in parts per million: what this node assumes of every clock's rate error.
    pub drift_ppm: u64,
    /// `ε`, in nanoseconds.
    pub margin_ns: u64,
    /// Renew once at most this much of the lease is left.
    pub renew_before_ns: u64,
    /// A campaign held back by the promise starts up to this much after the promise ends
    /// (uniform, seeded): the spread of raft's randomized election timeout, which the hold
    /// would otherwise collapse, and at least one tick.
    pub campaign_jitter_ns: u64,
    /// `G`, when follower read leases are on.
    pub max_grant_ns: Option<u64>,
    /// The lagging-node policy's bound, when follower read leases are on and it is set.
    pub max_lag_ns: Option<u64>,
}

impl LeaseConfig {
    /// Checks the config against raft's (minimum election timeout and heartbeat interval, each
    /// in ticks of `tick_ms`) and returns the derived durations.
    ///
    /// `P` may be anywhere above one heartbeat interval (plus drift and margin) up to the
    /// election timeout. Below two heartbeat intervals it is accepted: safety never depends on
    /// how `P` compares with the heartbeat interval (see [`crate::round`]), only availability.
    pub fn validate(&self, raft: &raft::Config, tick_ms: u64) -> Result<Derived, ConfigError> {
        if tick_ms == 0 {
            return Err(ConfigError::ZeroTick);
        }
        if self.drift_ppm > MAX_DRIFT_PPM {
            return Err(ConfigError::DriftOutOfRange {
                drift_ppm: self.drift_ppm,
            });
        }
        if !(1..=90).contains(&self.renew_below_pct) {
            return Err(ConfigError::RenewPointOutOfRange {
                renew_below_pct: self.renew_below_pct,
            });
        }
        let election_ms = (raft.min_election_tick() as u64).saturating_mul(tick_ms);
        if self.promise_ms > election_ms {
            return Err(ConfigError::PromiseExceedsElectionTimeout {
                promise_ms: self.promise_ms,
                election_ms,
            });
        }
        let lease_ns = self.lease_ns();
        if lease_ns == 0 {
            return Err(ConfigError::LeaseNotPositive {
                promise_ms: self.promise_ms,
                lease_ns,
            });
        }
        let heartbeat_ms = (raft.heartbeat_tick as u64).saturating_mul(tick_ms);
        if lease_ns <= heartbeat_ms.saturating_mul(NS_PER_MS) {
            return Err(ConfigError::LeaseNotAboveHeartbeat {
                lease_ns,
                heartbeat_ms,
            });
        }
        let max_grant_ns = self.check_follower_leases(election_ms, heartbeat_ms)?;
        let promise_ns = self.promise_ms * NS_PER_MS;
        let derived = Derived {
            promise_ns,
            boot_promise_ns: promise_ns.max(self.prior_promise_ms.saturating_mul(NS_PER_MS)),
            lease_ns,
            drift_ppm: self.drift_ppm,
            margin_ns: self.margin_ms * NS_PER_MS,
            renew_before_ns: lease_ns / 100 * self.renew_below_pct,
            campaign_jitter_ns: self.campaign_jitter_ms(raft, tick_ms) * NS_PER_MS,
            max_grant_ns,
            max_lag_ns: self
                .follower_leases
                .and_then(|f| f.max_lag_ms)
                .map(|ms| ms.saturating_mul(NS_PER_MS)),
        };
        assert!(
            derived.lease_ns < derived.promise_ns || self.drift_ppm == 0 && self.margin_ms == 0
        );
        assert!(
            derived.lease_ns > heartbeat_ms * NS_PER_MS && derived.lease_ns <= derived.promise_ns
        );
        Ok(derived)
    }

    /// `G` in nanoseconds if follower read leases are on and `G` fits between one heartbeat
    /// interval and half the election timeout.
    fn check_follower_leases(
        &self,
        election_ms: u64,
        heartbeat_ms: u64,
    ) -> Result<Option<u64>, ConfigError> {
        let Some(f) = self.follower_leases else {
            return Ok(None);
        };
        if f.max_grant_ms.saturating_mul(2) >= election_ms {
            return Err(ConfigError::GrantTooLong {
                max_grant_ms: f.max_grant_ms,
                election_ms,
            });
        }
        if f.max_grant_ms <= heartbeat_ms {
            return Err(ConfigError::GrantNotAboveHeartbeat {
                max_grant_ms: f.max_grant_ms,
                heartbeat_ms,
            });
        }
        Ok(Some(f.max_grant_ms * NS_PER_MS))
    }

    fn campaign_jitter_ms(&self, raft: &raft::Config, tick_ms: u64) -> u64 {
        let spread_ticks = raft
            .max_election_tick()
            .saturating_sub(raft.min_election_tick());
        (spread_ticks as u64).max(1).saturating_mul(tick_ms)
    }

    /// `L = P·(1−ρ)/(1+ρ) − ε` in nanoseconds, rounded down, 0 if not positive.
    pub fn lease_ns(&self) -> u64 {
        lease_for_promise_ns(
            self.promise_ms.saturating_mul(NS_PER_MS),
            self.drift_ppm,
            self.margin_ms.saturating_mul(NS_PER_MS),
        )
    }
}

/// `P·(1−ρ)/(1+ρ) − ε` in nanoseconds, rounded down, 0 if not positive.
fn lease_for_promise_ns(promise_ns: u64, drift_ppm: u64, margin_ns: u64) -> u64 {
    let rho = drift_ppm.min(MAX_DRIFT_PPM) as u128;
    let scaled = promise_ns as u128 * (PPM as u128 - rho) / (PPM as u128 + rho);
    (scaled.min(u64::MAX as u128) as u64).saturating_sub(margin_ns)
}

impl Derived {
    /// How long past a send time `t0` an acknowledgement may be counted on, when the
    /// acknowledging node says it promised `promise_ns` from its receipt, on a clock it takes to
    /// drift at most `drift_ppm`: `P'·(1−ρ)/(1+ρ) − ε` with `ρ` the larger of the two nodes'
    /// bounds and `ε` this node's own margin, and never more than this node's own `L`.
    ///
    /// What the argument needs from the other node travels in its message: the promise it made
    /// and the drift it assumes of clocks. `ε` is this node's margin on its own reckoning and
    /// needs nothing from the other node.
    /// A drift bound above [`MAX_DRIFT_PPM`] is no node's valid setting: it backs nothing.
    pub fn lease_for_promise_ns(&self, promise_ns: u64, drift_ppm: u64) -> u64 {
        if drift_ppm > MAX_DRIFT_PPM {
            return 0;
        }
        let rho = self.drift_ppm.max(drift_ppm);
        let lease_ns = lease_for_promise_ns(promise_ns, rho, self.margin_ns);
        let counted_ns = lease_ns.min(self.lease_ns);
        debug_assert!(counted_ns <= promise_ns && counted_ns <= self.lease_ns);
        counted_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(promise_ms: u64, drift_ppm: u64, margin_ms: u64) -> LeaseConfig {
        LeaseConfig {
            promise_ms,
            drift_ppm,
            margin_ms,
            ..LeaseConfig::default()
        }
    }

    /// raft's config with `election_tick` and `heartbeat_tick`.
    fn raft(election_tick: usize, heartbeat_tick: usize) -> raft::Config {
        raft::Config {
            election_tick,
            heartbeat_tick,
            ..raft::Config::default()
        }
    }

    #[test]
    fn lease_formula_matches_the_argument() {
        // P = 1000 ms, ρ = 0.01, ε = 10 ms: 1000·0.99/1.01 − 10 = 970.198… ms.
        let d = cfg(1_000, 10_000, 10).validate(&raft(10, 1), 100).unwrap();
        assert_eq!(d.lease_ns, 970_198_019);
        assert_eq!(d.promise_ns, 1_000_000_000);
        assert_eq!(d.renew_before_ns, 970_198_019 / 100 * 33);
        // The real-time proof: L/(1−ρ) < P/(1+ρ).
        let lease_real_max = d.lease_ns as f64 / 0.99;
        let promise_real_min = d.promise_ns as f64 / 1.01;
        assert!(lease_real_max < promise_real_min);
    }

    #[test]
    fn an_acknowledgement_is_credited_with_the_promise_it_carries() {
        let d = cfg(1_000, 10_000, 10).validate(&raft(10, 1), 100).unwrap();
        assert_eq!(
            d.lease_for_promise_ns(d.promise_ns, 10_000),
            d.lease_ns,
            "its own P"
        );
        let short = d.lease_for_promise_ns(300_000_000, 10_000);
        assert_eq!(
            short,
            300_000_000 * 99 / 101 - 10_000_000,
            "a shorter promise, less"
        );
        assert_eq!(
            d.lease_for_promise_ns(5_000_000_000, 0),
            d.lease_ns,
            "never past its own L"
        );
        assert!(
            d.lease_for_promise_ns(d.promise_ns, 50_000) < d.lease_ns,
            "the larger ρ"
        );
        assert_eq!(
            d.lease_for_promise_ns(d.promise_ns, MAX_DRIFT_PPM + 1),
            0,
            "no valid ρ"
        );
        assert_eq!(d.lease_for_promise_ns(5_000_000, 10_000), 0, "eaten by ε");
    }

    #[test]
    fn follower_grants_fit_between_a_heartbeat_and_half_an_election_timeout() {
        let with = |max_grant_ms| LeaseConfig {
            follower_leases: Some(FollowerLeases::new(max_grant_ms)),
            ..cfg(1_000, 10_000, 10)
        };
        // election 1,000 ms, heartbeat 100 ms.
        let d = with(300).validate(&raft(10, 1), 100).unwrap();
        assert_eq!(d.max_grant_ns, Some(300_000_000));
        assert_eq!(
            cfg(1_000, 10_000, 10)
                .validate(&raft(10, 1), 100)
                .unwrap()
                .max_grant_ns,
            None
        );
        assert_eq!(
            with(500).validate(&raft(10, 1), 100),
            Err(ConfigError::GrantTooLong {
                max_grant_ms: 500,
                election_ms: 1_000
            })
        );
        assert!(with(499).validate(&raft(10, 1), 100).is_ok());
        assert_eq!(
            with(100).validate(&raft(10, 1), 100),
            Err(ConfigError::GrantNotAboveHeartbeat {
                max_grant_ms: 100,
                heartbeat_ms: 100
            })
        );
        assert!(with(101).validate(&raft(10, 1), 100).is_ok());
    }

    #[test]
    fn bad_configs_get_typed_errors() {
        assert_eq!(
            cfg(1_000, 100_001, 0).validate(&raft(10, 1), 100),
            Err(ConfigError::DriftOutOfRange { drift_ppm: 100_001 })
        );
        assert_eq!(
            cfg(10, 0, 10).validate(&raft(10, 1), 100),
            Err(ConfigError::LeaseNotPositive {
                promise_ms: 10,
                lease_ns: 0
            })
        );
        assert_eq!(
            cfg(1_001, 0, 0).validate(&raft(10, 1), 100),
            Err(ConfigError::PromiseExceedsElectionTimeout {
                promise_ms: 1_001,
                election_ms: 1_000
            })
        );
        let mut c = cfg(100, 0, 0);
        c.renew_below_pct = 0;
        assert!(matches!(
            c.validate(&raft(10, 1), 100),
            Err(ConfigError::RenewPointOutOfRange { .. })
        ));
        assert_eq!(
            cfg(100, 0, 0).validate(&raft(10, 1), 0),
            Err(ConfigError::ZeroTick)
        );
        assert_eq!(
            cfg(200, 0, 0).validate(&raft(10, 2), 100),
            Err(ConfigError::LeaseNotAboveHeartbeat {
                lease_ns: 200_000_000,
                heartbeat_ms: 200
            }),
            "a lease of one heartbeat interval lapses before every renewal"
        );
        assert!(
            cfg(201, 0, 0).validate(&raft(10, 2), 100).is_ok(),
            "P under two heartbeat intervals is accepted: it is safe"
        );
        assert!(
            cfg(1_000, 0, 0).validate(&raft(10, 1), 100).is_ok(),
            "P equal to the timeout is allowed"
        );
    }
}
