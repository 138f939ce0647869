//! Lease configuration: the promise `P`, the drift bound `ρ`, the margin `ε`, and what follows from them.

use thiserror::Error;

/// Largest drift bound accepted: ρ = 0.1 (100,000 ppm).
pub const MAX_DRIFT_PPM: u64 = 100_000;

const NS_PER_MS: u64 = 1_000_000;
const PPM: u64 = 1_000_000;

/// Safety switches that exist only to prove the tests can fail (negative controls).
///
/// Anything other than [`UnsafeMode::Safe`] can serve stale reads. Never use it in production.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnsafeMode {
    /// The lease as designed. The only mode for real use.
    #[default]
    Safe,
    /// Followers keep no real-time promise: votes are left to raft-rs's tick-based check.
    NoPromise,
    /// A restarted node votes at once instead of refusing votes for `P` after boot.
    NoBootPromise,
    /// Votes for others are refused under the promise, but the node may still campaign (and so
    /// vote for itself) while it holds.
    NoCampaignHold,
    /// The leader keeps serving lease reads after sending `MsgTimeoutNow` in its term.
    NoTransferFence,
    /// Lease reads use raft-rs `ReadOnlyOption::LeaseBased` (tick-based, no clock) instead of our lease.
    RaftLeaseBased,
}

/// Configuration of the lease layer. Durations are in the units their names say.
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
    /// Negative-control switch. Leave at [`UnsafeMode::Safe`].
    pub unsafe_mode: UnsafeMode,
}

impl Default for LeaseConfig {
    /// `P` = 1 s, ρ = 500 ppm, ε = 10 ms, renew at a third left.
    fn default() -> Self {
        LeaseConfig {
            promise_ms: 1_000,
            drift_ppm: 500,
            margin_ms: 10,
            renew_below_pct: 33,
            unsafe_mode: UnsafeMode::Safe,
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
    /// The tick interval is zero.
    #[error("tick_ms must be positive")]
    ZeroTick,
}

/// The durations a valid [`LeaseConfig`] implies, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// `P`.
    pub promise_ns: u64,
    /// `L = P·(1−ρ)/(1+ρ) − ε`, rounded down. Always positive and below `P`.
    pub lease_ns: u64,
    /// Renew once at most this much of the lease is left.
    pub renew_before_ns: u64,
}

impl LeaseConfig {
    /// Checks the config against raft's minimum election timeout (`min_election_tick × tick_ms`)
    /// and returns the derived durations.
    pub fn validate(&self, min_election_tick: u64, tick_ms: u64) -> Result<Derived, ConfigError> {
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
        let election_ms = min_election_tick.saturating_mul(tick_ms);
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
        let derived = Derived {
            promise_ns: self.promise_ms * NS_PER_MS,
            lease_ns,
            renew_before_ns: lease_ns / 100 * self.renew_below_pct,
        };
        assert!(
            derived.lease_ns < derived.promise_ns || self.drift_ppm == 0 && self.margin_ms == 0
        );
        Ok(derived)
    }

    /// `L = P·(1−ρ)/(1+ρ) − ε` in nanoseconds, rounded down, 0 if not positive.
    pub fn lease_ns(&self) -> u64 {
        let promise_ns = self.promise_ms as u128 * NS_PER_MS as u128;
        let rho = self.drift_ppm.min(MAX_DRIFT_PPM) as u128;
        let scaled = promise_ns * (PPM as u128 - rho) / (PPM as u128 + rho);
        (scaled as u64).saturating_sub(self.margin_ms * NS_PER_MS)
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

    #[test]
    fn lease_formula_matches_the_argument() {
        // P = 1000 ms, ρ = 0.01, ε = 10 ms: 1000·0.99/1.01 − 10 = 970.198… ms.
        let d = cfg(1_000, 10_000, 10).validate(10, 100).unwrap();
        assert_eq!(d.lease_ns, 970_198_019);
        assert_eq!(d.promise_ns, 1_000_000_000);
        assert_eq!(d.renew_before_ns, 970_198_019 / 100 * 33);
        // The real-time proof: L/(1−ρ) < P/(1+ρ).
        let lease_real_max = d.lease_ns as f64 / 0.99;
        let promise_real_min = d.promise_ns as f64 / 1.01;
        assert!(lease_real_max < promise_real_min);
    }

    #[test]
    fn bad_configs_get_typed_errors() {
        assert_eq!(
            cfg(1_000, 100_001, 0).validate(10, 100),
            Err(ConfigError::DriftOutOfRange { drift_ppm: 100_001 })
        );
        assert_eq!(
            cfg(10, 0, 10).validate(10, 100),
            Err(ConfigError::LeaseNotPositive {
                promise_ms: 10,
                lease_ns: 0
            })
        );
        assert_eq!(
            cfg(1_001, 0, 0).validate(10, 100),
            Err(ConfigError::PromiseExceedsElectionTimeout {
                promise_ms: 1_001,
                election_ms: 1_000
            })
        );
        let mut c = cfg(100, 0, 0);
        c.renew_below_pct = 0;
        assert!(matches!(
            c.validate(10, 100),
            Err(ConfigError::RenewPointOutOfRange { .. })
        ));
        assert_eq!(cfg(100, 0, 0).validate(10, 0), Err(ConfigError::ZeroTick));
        assert!(
            cfg(1_000, 0, 0).validate(10, 100).is_ok(),
            "P equal to the timeout is allowed"
        );
    }
}
