//! The drift bound, margin and longest term shared by a grantor and its holders, and the two
//! durations the lease argument derives from them.
//!
//! All arithmetic here is exact (`u128`) and the results saturate at `u64::MAX` ns instead of
//! wrapping: a term too long to count is held for as long as the clock can count, never for a
//! wrapped-around sliver. [`GrantConfig::validate`] keeps user input far from those limits.

use thiserror::Error;

pub(crate) const PPM: u128 = 1_000_000;
pub(crate) const NS_PER_MS: u128 = 1_000_000;

/// Drift bound, margin and largest term, shared by grantor and holder.
///
/// Check a configuration that comes from outside with [`GrantConfig::validate`]; the grantor,
/// holder and sessions constructors panic on an invalid one (a programmer error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantConfig {
    /// `ρ`, the bound on each clock's rate error, in parts per million. Below 1,000,000.
    pub drift_ppm: u64,
    /// `ε`, the safety margin, in milliseconds. Below the holder's view of the longest term.
    pub margin_ms: u64,
    /// The largest lease term or session TTL granted, in milliseconds. 1 to
    /// [`GrantConfig::MAX_TERM_MS`].
    pub max_term_ms: u64,
}

/// Why a [`GrantConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GrantConfigError {
    /// `ρ` must be below 100%: at `ρ ≥ 1` a clock may stand still and no holder may believe anything.
    #[error("drift_ppm {drift_ppm} must be below 1,000,000 (a rate error of 100%)")]
    DriftTooLarge {
        /// The configured drift bound.
        drift_ppm: u64,
    },
    /// A grantor that may grant nothing.
    #[error("max_term_ms must be at least 1 ms")]
    ZeroMaxTerm,
    /// Longer than [`GrantConfig::MAX_TERM_MS`].
    #[error("max_term_ms {max_term_ms} is above the cap of {cap_ms} ms (30 days)")]
    MaxTermTooLong {
        /// The configured longest term.
        max_term_ms: u64,
        /// [`GrantConfig::MAX_TERM_MS`].
        cap_ms: u64,
    },
    /// The margin eats the holder's whole view of the longest term: `d·(1−ρ) − ε ≤ 0`.
    #[error("margin_ms {margin_ms} leaves no holder view of even the longest term ({max_term_ms} ms at {drift_ppm} ppm)")]
    MarginTooLarge {
        /// The configured margin.
        margin_ms: u64,
        /// The configured longest term.
        max_term_ms: u64,
        /// The configured drift bound.
        drift_ppm: u64,
    },
}

impl Default for GrantConfig {
    /// ρ = 500 ppm, ε = 10 ms, terms up to 60 s.
    fn default() -> Self {
        GrantConfig {
            drift_ppm: 500,
            margin_ms: 10,
            max_term_ms: 60_000,
        }
    }
}

/// `x` in ns, or `u64::MAX` if it does not fit.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

impl GrantConfig {
    /// The longest `max_term_ms` accepted: 30 days. Far below the 292 years at which
    /// `2·max_term` in nanoseconds would stop fitting in a `u64`.
    pub const MAX_TERM_MS: u64 = 30 * 24 * 3_600_000;

    /// Whether this configuration can be used: `drift_ppm < 1,000,000`,
    /// `1 ≤ max_term_ms ≤ MAX_TERM_MS`, and a margin that leaves the holder a view of the longest
    /// term (`max_term·(1−ρ) − ε > 0`).
    pub fn validate(&self) -> Result<(), GrantConfigError> {
        let GrantConfig {
            drift_ppm,
            margin_ms,
            max_term_ms,
        } = *self;
        if drift_ppm >= PPM as u64 {
            return Err(GrantConfigError::DriftTooLarge { drift_ppm });
        }
        if max_term_ms == 0 {
            return Err(GrantConfigError::ZeroMaxTerm);
        }
        if max_term_ms > Self::MAX_TERM_MS {
            let cap_ms = Self::MAX_TERM_MS;
            return Err(GrantConfigError::MaxTermTooLong {
                max_term_ms,
                cap_ms,
            });
        }
        if self.holder_valid_ns(max_term_ms) == 0 {
            return Err(GrantConfigError::MarginTooLarge {
                margin_ms,
                max_term_ms,
                drift_ppm,
            });
        }
        Ok(())
    }

    /// Panics, naming the error, unless [`GrantConfig::validate`] accepts this configuration.
    pub(crate) fn assert_valid(&self) {
        if let Err(e) = self.validate() {
            panic!("invalid GrantConfig {self:?} (check input with GrantConfig::validate): {e}");
        }
    }

    /// How long the grantor holds a lease of `term_ms`: `d·(1+ρ) + ε`, rounded up, in ns
    /// (saturating at `u64::MAX`).
    pub fn grantor_hold_ns(&self, term_ms: u64) -> u64 {
        let d = term_ms as u128 * NS_PER_MS;
        let scaled = d.saturating_mul(PPM + self.drift_ppm as u128).div_ceil(PPM);
        saturate(scaled + self.margin_ms as u128 * NS_PER_MS)
    }

    /// How long a restarted grantor refuses every grant ([`LeaseServer::boot`](crate::grant::LeaseServer::boot)):
    /// the grantor's hold of the longest term, `max_term·(1+ρ) + ε`, in ns.
    pub fn boot_holdback_ns(&self) -> u64 {
        self.grantor_hold_ns(self.max_term_ms)
    }

    /// How long the holder believes a lease of `term_ms`: `d·(1−ρ) − ε`, rounded down, at least 0
    /// (saturating at `u64::MAX`, which only a term the grantor holds for ever can reach).
    pub fn holder_valid_ns(&self, term_ms: u64) -> u64 {
        let d = term_ms as u128 * NS_PER_MS;
        let scaled = d * PPM.saturating_sub(self.drift_ppm as u128) / PPM;
        saturate(scaled.saturating_sub(self.margin_ms as u128 * NS_PER_MS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(drift_ppm: u64, margin_ms: u64, max_term_ms: u64) -> GrantConfig {
        GrantConfig {
            drift_ppm,
            margin_ms,
            max_term_ms,
        }
    }

    #[test]
    fn validate_accepts_sane_configs_and_names_each_bad_field() {
        assert_eq!(GrantConfig::default().validate(), Ok(()));
        let cap = GrantConfig::MAX_TERM_MS;
        assert_eq!(config(999_999, 0, cap).validate(), Ok(()));
        assert_eq!(
            config(1_000_000, 10, 1_000).validate(),
            Err(GrantConfigError::DriftTooLarge {
                drift_ppm: 1_000_000
            })
        );
        assert_eq!(
            config(0, 0, 0).validate(),
            Err(GrantConfigError::ZeroMaxTerm)
        );
        assert_eq!(
            config(500, 10, cap + 1).validate(),
            Err(GrantConfigError::MaxTermTooLong {
                max_term_ms: cap + 1,
                cap_ms: cap
            })
        );
        // 100 ms at 10%: a view of 90 ms, so a 90 ms margin leaves nothing and 89 ms leaves 1 ms.
        assert!(matches!(
            config(100_000, 90, 100).validate(),
            Err(GrantConfigError::MarginTooLarge { margin_ms: 90, .. })
        ));
        assert_eq!(config(100_000, 89, 100).validate(), Ok(()));
    }

    #[test]
    #[should_panic(expected = "invalid GrantConfig")]
    fn an_invalid_config_is_a_programmer_error_at_construction() {
        config(1_000_000, 0, 1).assert_valid();
    }

    #[test]
    fn the_holds_saturate_instead_of_wrapping() {
        // The overflow case: 1.5e13 ms at 50% held for 2.25e19 ns, above u64::MAX; the old
        // `as u64` wrapped it to about 4.1e18 ns, below the holder's 7.5e18 ns view.
        let huge = config(500_000, 0, 15_000_000_000_000);
        assert!(huge.validate().is_err());
        assert_eq!(huge.grantor_hold_ns(15_000_000_000_000), u64::MAX);
        assert!(huge.holder_valid_ns(15_000_000_000_000) < u64::MAX);
        assert_eq!(config(0, 0, 1).grantor_hold_ns(u64::MAX), u64::MAX);
        assert_eq!(config(0, 0, 1).holder_valid_ns(u64::MAX), u64::MAX);
        assert_eq!(config(999_999, u64::MAX, 1).holder_valid_ns(u64::MAX), 0);
        // The longest valid term at the largest drift still fits with room to spare.
        let cap = GrantConfig::MAX_TERM_MS;
        assert!(config(999_999, 1_000, cap).grantor_hold_ns(cap) < u64::MAX / 2);
    }
}
