//! The grantor: grants and renews one lease, and counts fencing tokens.

use thiserror::Error;

use crate::clock::Clock;
use crate::grant::GrantConfig;

/// Who asks for a lease. Any stable identifier of the client.
pub type ClientId = u64;

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: the same across renewals by one holder, larger for every new holder.
    pub token: u64,
    /// The lease term `d` granted, in milliseconds.
    pub term_ms: u64,
}

/// Why the grantor refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AcquireError {
    /// Another client holds the lease.
    #[error("lease held by client {holder} for {remaining_ns} ns more")]
    Held {
        /// The current holder.
        holder: ClientId,
        /// Time left on the grantor's clock.
        remaining_ns: u64,
    },
    /// The requested term is zero or above the grantor's maximum.
    #[error("lease term {term_ms} ms is outside 1..={max_term_ms} ms")]
    BadTerm {
        /// The requested term.
        term_ms: u64,
        /// The largest term this grantor gives.
        max_term_ms: u64,
    },
}

/// The current holder as the grantor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holding {
    client: ClientId,
    /// On the grantor's clock, exclusive: `granted_at + d·(1+ρ) + ε`.
    expiry_ns: u64,
}

/// The grantor of one lease. Pure: time is an argument; [`LeaseServer::acquire_now`] reads the clock.
#[derive(Debug)]
pub struct LeaseServer<C: Clock> {
    clock: C,
    config: GrantConfig,
    holding: Option<Holding>,
    /// The last token handed out. Never decreases.
    token: u64,
}

impl<C: Clock> LeaseServer<C> {
    /// A grantor with no holder. Tokens start above `first_token` (restore it after a restart).
    pub fn new(clock: C, config: GrantConfig, first_token: u64) -> Self {
        LeaseServer {
            clock,
            config,
            holding: None,
            token: first_token,
        }
    }

    /// Grant or renew for `term_ms` at grantor time `now_ns`. A renewal by the current holder
    /// keeps its token; a new holder gets the next token.
    pub fn acquire(
        &mut self,
        client: ClientId,
        term_ms: u64,
        now_ns: u64,
    ) -> Result<Grant, AcquireError> {
        let max_term_ms = self.config.max_term_ms;
        if term_ms == 0 || term_ms > max_term_ms {
            return Err(AcquireError::BadTerm {
                term_ms,
                max_term_ms,
            });
        }
        match self.holding {
            Some(h) if h.client != client && now_ns < h.expiry_ns => {
                return Err(AcquireError::Held {
                    holder: h.client,
                    remaining_ns: h.expiry_ns - now_ns,
                });
            }
            Some(h) if h.client == client && now_ns < h.expiry_ns => {}
            _ => self.token += 1, // a new owner (or the same one after its lease expired)
        }
        let expiry_ns = now_ns + self.config.grantor_hold_ns(term_ms);
        let renewed_later = self
            .holding
            .is_none_or(|h| h.client != client || expiry_ns >= h.expiry_ns);
        debug_assert!(
            renewed_later,
            "a renewal never shortens the grantor's expiry"
        );
        self.holding = Some(Holding { client, expiry_ns });
        Ok(Grant {
            token: self.token,
            term_ms,
        })
    }

    /// [`LeaseServer::acquire`] at the grantor's clock.
    pub fn acquire_now(&mut self, client: ClientId, term_ms: u64) -> Result<Grant, AcquireError> {
        let now_ns = self.clock.now_ns();
        self.acquire(client, term_ms, now_ns)
    }

    /// Free the lease if `client` holds it. Returns whether it did.
    pub fn release(&mut self, client: ClientId) -> bool {
        match self.holding {
            Some(h) if h.client == client => {
                self.holding = None;
                true
            }
            _ => false,
        }
    }

    /// The holder at `now_ns`, with its expiry on the grantor's clock.
    pub fn holder(&self, now_ns: u64) -> Option<(ClientId, u64)> {
        self.holding
            .filter(|h| now_ns < h.expiry_ns)
            .map(|h| (h.client, h.expiry_ns))
    }

    /// The last token handed out (persist it to restore a restarted grantor).
    pub fn last_token(&self) -> u64 {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SimClock;

    fn server() -> LeaseServer<SimClock> {
        let config = GrantConfig {
            drift_ppm: 10_000,
            margin_ms: 5,
            max_term_ms: 60_000,
        };
        LeaseServer::new(SimClock::new(0, 0), config, 0)
    }

    #[test]
    fn renewal_keeps_the_token_and_a_new_owner_gets_the_next() {
        let mut s = server();
        let g = s.acquire(1, 1_000, 0).unwrap();
        assert_eq!(
            g,
            Grant {
                token: 1,
                term_ms: 1_000
            }
        );
        assert_eq!(s.acquire(1, 1_000, 500_000_000).unwrap().token, 1);
        // Expiry: 500 ms + 1000·1.01 ms + 5 ms = 1515 ms.
        let err = s.acquire(2, 1_000, 1_514_999_999).unwrap_err();
        assert_eq!(
            err,
            AcquireError::Held {
                holder: 1,
                remaining_ns: 1
            }
        );
        assert_eq!(s.acquire(2, 1_000, 1_515_000_000).unwrap().token, 2);
        assert!(s.release(2));
        assert!(!s.release(2));
        assert_eq!(s.acquire(1, 1_000, 1_600_000_000).unwrap().token, 3);
    }

    #[test]
    fn bad_terms_are_refused() {
        let mut s = server();
        assert!(matches!(
            s.acquire(1, 0, 0),
            Err(AcquireError::BadTerm { .. })
        ));
        assert!(matches!(
            s.acquire(1, 60_001, 0),
            Err(AcquireError::BadTerm { .. })
        ));
        assert_eq!(s.acquire_now(1, 60_000).unwrap().token, 1);
    }
}
