//! The holder's view of a lease: shorter than the grantor's, measured from before the request.

use crate::grant::server::Grant;
use crate::grant::GrantConfig;

/// What the holder believes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    token: u64,
    /// Local instant the holder's view ends (exclusive): `sent_at + d·(1−ρ) − ε`.
    valid_until_ns: u64,
    /// `d`, in nanoseconds.
    term_ns: u64,
}

/// A client's lease. Pure: time is an argument.
///
/// The request's `sent_at` is read **before** the request goes out; measuring from the response's
/// arrival would let network delay stretch the lease past the grantor's expiry.
///
/// **Clock.** Feed it readings of a clock that keeps counting while the machine is suspended
/// ([`BootClock`](crate::BootClock), `CLOCK_BOOTTIME`). `CLOCK_MONOTONIC` ([`MonotonicClock`](crate::MonotonicClock))
/// stops during suspend, so a holder that was suspended for longer than its lease wakes up still
/// believing in it while the grantor has given it to another. Check [`LeaseHolder::token`]
/// right before each protected action, and fence the action with it.
#[derive(Debug, Clone)]
pub struct LeaseHolder {
    config: GrantConfig,
    held: Option<Held>,
}

impl LeaseHolder {
    /// A holder with no lease.
    ///
    /// Panics if `config` is invalid ([`GrantConfig::validate`]): a programmer error.
    pub fn new(config: GrantConfig) -> Self {
        config.assert_valid();
        LeaseHolder { config, held: None }
    }

    /// The grantor granted `grant` in answer to a request sent at local instant `sent_at_ns`.
    ///
    /// A term above the configuration's `max_term_ms` (no grantor of this configuration gives
    /// one: a garbled or forged answer) is believed only for `max_term_ms`.
    ///
    /// Returns `false` (and drops the lease) if the token changed: someone else held it between.
    pub fn on_grant(&mut self, sent_at_ns: u64, grant: Grant) -> bool {
        let term_ms = grant.term_ms.min(self.config.max_term_ms);
        let valid_until_ns = sent_at_ns.saturating_add(self.config.holder_valid_ns(term_ms));
        let same_owner = self.held.is_none_or(|h| h.token == grant.token);
        let valid_until_ns = match self.held {
            // A late answer to an older request never moves the view backwards.
            Some(h) if h.token == grant.token => valid_until_ns.max(h.valid_until_ns),
            _ => valid_until_ns,
        };
        self.held = Some(Held {
            token: grant.token,
            valid_until_ns,
            term_ns: term_ms.saturating_mul(1_000_000),
        });
        same_owner
    }

    /// Whether the lease holds at `now_ns`.
    pub fn is_valid(&self, now_ns: u64) -> bool {
        self.held.is_some_and(|h| now_ns < h.valid_until_ns)
    }

    /// Whether to renew now: at most a third of the term is left (or the lease is gone).
    pub fn should_renew(&self, now_ns: u64) -> bool {
        match self.held {
            Some(h) => h.valid_until_ns.saturating_sub(now_ns) <= h.term_ns / 3,
            None => true,
        }
    }

    /// When renewal becomes due.
    pub fn renew_at_ns(&self) -> Option<u64> {
        self.held
            .map(|h| h.valid_until_ns.saturating_sub(h.term_ns / 3))
    }

    /// When the holder's view ends (exclusive), if it holds anything.
    pub fn valid_until_ns(&self) -> Option<u64> {
        self.held.map(|h| h.valid_until_ns)
    }

    /// The token of the lease held, whether or not the view still runs (to name it in a renewal
    /// or a release); `None` once dropped. Act on the lease only under [`LeaseHolder::token`].
    pub fn held_token(&self) -> Option<u64> {
        self.held.map(|h| h.token)
    }

    /// The fencing token, while the lease holds at `now_ns`.
    pub fn token(&self, now_ns: u64) -> Option<u64> {
        self.held
            .filter(|h| now_ns < h.valid_until_ns)
            .map(|h| h.token)
    }

    /// Forget the lease (released, or known lost).
    pub fn drop_lease(&mut self) {
        self.held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder() -> LeaseHolder {
        LeaseHolder::new(GrantConfig {
            drift_ppm: 10_000,
            margin_ms: 5,
            max_term_ms: 60_000,
        })
    }

    #[test]
    fn the_view_runs_from_sent_at_and_saturates() {
        let mut h = holder();
        assert!(h.on_grant(
            100,
            Grant {
                token: 1,
                term_ms: 1_000
            }
        ));
        // 1000·0.99 − 5 = 985 ms after sent_at.
        assert!(h.is_valid(100 + 984_999_999));
        assert!(!h.is_valid(100 + 985_000_000));
        assert!(!h.should_renew(100 + 985_000_000 - 333_333_334));
        assert!(h.should_renew(100 + 985_000_000 - 333_333_333));
        let mut tiny = holder();
        tiny.on_grant(
            100,
            Grant {
                token: 1,
                term_ms: 5,
            },
        ); // 4.95 − 5 ms saturates to 0
        assert!(!tiny.is_valid(100));
    }

    #[test]
    fn a_token_change_is_reported_and_late_answers_never_shorten() {
        let mut h = holder();
        h.on_grant(
            1_000_000_000,
            Grant {
                token: 1,
                term_ms: 1_000,
            },
        );
        assert!(
            h.on_grant(
                0,
                Grant {
                    token: 1,
                    term_ms: 1_000
                }
            ),
            "late answer, same owner"
        );
        assert_eq!(h.valid_until_ns(), Some(1_985_000_000));
        assert!(!h.on_grant(
            2_000_000_000,
            Grant {
                token: 3,
                term_ms: 1_000
            }
        ));
        assert_eq!(h.token(2_000_000_000), Some(3));
    }
}
