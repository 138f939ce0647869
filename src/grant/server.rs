//! The grantor: grants, renews and releases one lease, and counts fencing tokens.
//!
//! Every holding has its own token. [`LeaseServer::acquire`] starts a holding under the next
//! token; [`LeaseServer::renew`] and [`LeaseServer::release`] name the holding by `(client,
//! token)`, so a late, retried or duplicated copy of either can never act on a later holding.
//! A [`ClientId`] is unique per client incarnation (see there).
//!
//! A grantor that restarts must not forget a lease it granted. Start it one of two ways:
//! - [`LeaseServer::boot`] (the default): it refuses every grant until the longest term it may have
//!   granted has run out on its own clock, `max_term·(1+ρ) + ε` after boot
//!   ([`AcquireError::BootHoldback`] says how long is left). It needs the last token persisted:
//!   **write [`LeaseServer::last_token`] durably before the answer of every grant that raised it
//!   leaves** (renewals never raise it). A stale last token makes the restarted grantor hand out
//!   a token again, and [`FencedStore`](crate::grant::FencedStore) accepts equal tokens.
//! - [`LeaseServer::restore`]: the caller persisted a [`GrantorRecord`] (see there for what and
//!   when). The restored holder keeps the lease for a full term from the restart, measured on the
//!   new clock; everyone else may be granted at once if nobody held it.
//!
//! No instant is ever persisted or sent: a monotonic clock's readings mean nothing to another
//! process or machine, so a restart re-bases every expiry on the grantor's new clock. Run the
//! grantor, like the holders, on a clock that counts through suspend
//! ([`BootClock`](crate::BootClock)).

use thiserror::Error;

use crate::clock::Clock;
use crate::grant::GrantConfig;

/// Who asks for a lease.
///
/// **Unique per client incarnation.** A process that restarts, or a second copy started by a
/// supervisor while the first is paused or partitioned, must use a fresh id (for example a
/// random 64-bit number drawn at start, or a persisted counter bumped at every start), never
/// a "stable" name of the client. The grantor cannot tell two incarnations of one id apart.
/// It never hands a live holding's token out again ([`AcquireError::AlreadyHolder`]), so a
/// reused id costs the new incarnation a wait, never two holders with one token.
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
    /// The grantor has just booted and may have granted a lease before it restarted.
    #[error("grantor booted recently: no grants for {remaining_ns} ns more")]
    BootHoldback {
        /// Time left on the grantor's clock until it grants again.
        remaining_ns: u64,
    },
    /// [`LeaseServer::acquire`] by a client that already holds the lease. A holder renews with
    /// its token ([`LeaseServer::renew`]); anyone else using this id (a retry whose first answer
    /// was lost, or a new incarnation reusing the id) waits for the holding to run out.
    #[error("this client id already holds the lease for {remaining_ns} ns more: renew it with its token")]
    AlreadyHolder {
        /// Time left on the grantor's clock.
        remaining_ns: u64,
    },
    /// [`LeaseServer::renew`] of a holding that is not live: released, run out, taken over, or
    /// not this client's under this token. Stop using the lease; acquire it again if needed.
    #[error("client {client} holds no live lease under token {token}")]
    NotHolder {
        /// The client that asked.
        client: ClientId,
        /// The token it named.
        token: u64,
    },
}

/// What a grantor persists so that a restart needs no holdback ([`LeaseServer::restore`]).
///
/// It holds no instant, only who holds the lease and for how long a term. **When:** write
/// [`LeaseServer::record`] durably after every successful [`LeaseServer::acquire`] or
/// [`LeaseServer::renew`] whose record differs from the one last written (a new holder and token,
/// a longer term) and **before the answer leaves the grantor**. A renewal with the same or a
/// shorter term does not change it, so it costs no write. A release need not be written: the stale
/// record only makes the restarted grantor hold the lease for the released holder a while longer.
/// The record of a grantor that booted with a holdback and has granted nothing since says so
/// (`holding_back`), and restoring it holds back again: that grantor never knew the holder it was
/// waiting out. A record from any moment is therefore safe to write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrantorRecord {
    /// The last fencing token handed out.
    pub last_token: u64,
    /// The grantor booted with a holdback and has granted nothing since: a lease it forgot may run.
    pub holding_back: bool,
    /// The last holder not released (even if its lease has since run out), and the longest term
    /// granted to it since it became the holder, in ms.
    pub holder: Option<(ClientId, u64)>,
}

/// The current holder as the grantor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holding {
    client: ClientId,
    /// The fencing token of this holding: the grantor's last token when it began.
    token: u64,
    /// On the grantor's clock, exclusive: the latest `granted_at + d·(1+ρ) + ε` of this holding.
    /// A renewal never moves it earlier.
    expiry_ns: u64,
    /// The longest term granted in this holding, in ms (for the [`GrantorRecord`]).
    term_ms: u64,
}

/// The grantor of one lease. Pure: time is an argument; [`LeaseServer::acquire_now`] reads the clock.
#[derive(Debug)]
pub struct LeaseServer<C: Clock> {
    clock: C,
    config: GrantConfig,
    holding: Option<Holding>,
    /// The last token handed out. Never decreases.
    token: u64,
    /// No grant before this instant on the grantor's clock (0: none held back).
    holdback_until_ns: u64,
    /// Booted with a holdback and granted nothing since (see [`GrantorRecord::holding_back`]).
    holding_back: bool,
}

impl<C: Clock> LeaseServer<C> {
    /// A grantor starting (or restarting) with nothing persisted but its last token: it refuses every
    /// grant for the boot holdback, `max_term·(1+ρ) + ε` ([`GrantConfig::boot_holdback_ns`]) on its
    /// own clock from now, so that any lease it granted before the restart has run out first.
    ///
    /// Tokens continue above `last_token`: pass [`LeaseServer::last_token`] as the previous run
    /// persisted it **before the answer of each grant that raised it left**. 0 only if nothing was
    /// ever granted: with an older value, the restarted grantor hands out a token a paused
    /// ex-holder still writes with, and fencing accepts both. The holdback must cover the longest
    /// term the *previous* run could grant: do not lower `max_term_ms` across a restart.
    ///
    /// Panics if `config` is invalid ([`GrantConfig::validate`]): a programmer error.
    pub fn boot(clock: C, config: GrantConfig, last_token: u64) -> Self {
        config.assert_valid();
        let holdback_until_ns = clock.now_ns().saturating_add(config.boot_holdback_ns());
        LeaseServer {
            clock,
            config,
            holding: None,
            token: last_token,
            holdback_until_ns,
            holding_back: true,
        }
    }

    /// A grantor restarting from a [`GrantorRecord`] it persisted, with no holdback. The recorded
    /// holder holds the lease for a full `term·(1+ρ) + ε` from now on this clock (it was granted
    /// before the restart, so that outlasts the holder's view); without a holder, grants start at once.
    ///
    /// A first start, with nothing ever granted, is `restore(clock, config, GrantorRecord::default())`.
    /// A record written while holding back ([`GrantorRecord::holding_back`]) boots with a holdback.
    /// Restoring a record older than the last grant answered can give the lease to two clients.
    ///
    /// Panics if `config` is invalid ([`GrantConfig::validate`]): a programmer error.
    pub fn restore(clock: C, config: GrantConfig, record: GrantorRecord) -> Self {
        config.assert_valid();
        if record.holding_back {
            return Self::boot(clock, config, record.last_token);
        }
        let now_ns = clock.now_ns();
        let holding = record.holder.map(|(client, term_ms)| Holding {
            client,
            token: record.last_token,
            expiry_ns: now_ns.saturating_add(config.grantor_hold_ns(term_ms)),
            term_ms,
        });
        LeaseServer {
            clock,
            config,
            holding,
            token: record.last_token,
            holdback_until_ns: 0,
            holding_back: false,
        }
    }

    /// Deprecated: the same as [`LeaseServer::boot`] (it used to forget the holder on a restart).
    #[deprecated(
        note = "use LeaseServer::boot (boot holdback) or LeaseServer::restore (persisted record)"
    )]
    pub fn new(clock: C, config: GrantConfig, first_token: u64) -> Self {
        Self::boot(clock, config, first_token)
    }

    /// NEGATIVE CONTROL, for tests only: a restart that keeps the token but forgets the holder and
    /// grants at once. It can give the lease to a second client while the first still holds it.
    #[doc(hidden)]
    pub fn control_restart_forgetting_holder(
        clock: C,
        config: GrantConfig,
        last_token: u64,
    ) -> Self {
        let forgot = GrantorRecord {
            last_token,
            ..GrantorRecord::default()
        };
        Self::restore(clock, config, forgot)
    }

    /// Grant the lease for `term_ms` at grantor time `now_ns` to a client that does not hold it:
    /// the grant carries the next fencing token. Renew a holding with [`LeaseServer::renew`].
    ///
    /// Refused with [`AcquireError::AlreadyHolder`] while `client` itself holds the lease: the
    /// grantor cannot tell a retry from a second incarnation reusing the id, so it never hands the
    /// holding's token out again. A client whose acquisition went unanswered therefore waits for
    /// that holding to run out (or asks under a new [`ClientId`]).
    pub fn acquire(
        &mut self,
        client: ClientId,
        term_ms: u64,
        now_ns: u64,
    ) -> Result<Grant, AcquireError> {
        self.check_request(term_ms, now_ns)?;
        match self.live_holding(now_ns) {
            Some(h) if h.client == client => Err(AcquireError::AlreadyHolder {
                remaining_ns: h.expiry_ns - now_ns,
            }),
            Some(h) => Err(AcquireError::Held {
                holder: h.client,
                remaining_ns: h.expiry_ns - now_ns,
            }),
            None => Ok(self.grant_new(client, term_ms, now_ns)),
        }
    }

    /// Renew the holding that `client` holds under `token` for `term_ms` at grantor time `now_ns`.
    /// The token stays the same, and the grantor's hold never gets shorter.
    ///
    /// Refused with [`AcquireError::NotHolder`] unless that holding is live: released, run out,
    /// taken by another client, or another holding of the same client (a later token). A renewal
    /// never turns into a new grant; the client acquires again.
    pub fn renew(
        &mut self,
        client: ClientId,
        token: u64,
        term_ms: u64,
        now_ns: u64,
    ) -> Result<Grant, AcquireError> {
        // The holder's view of the earlier grant may still run, so keep the later end.
        self.renew_to(client, token, term_ms, now_ns, |old_ns, hold_ns| {
            old_ns.max(now_ns.saturating_add(hold_ns))
        })
    }

    /// NEGATIVE CONTROL, for tests only: a renewal that adds the term to the old expiry instead
    /// of to now. Frequent renewals then stretch the grantor's hold far past a full term.
    #[doc(hidden)]
    pub fn control_renew_adding_to_the_old_expiry(
        &mut self,
        client: ClientId,
        token: u64,
        term_ms: u64,
        now_ns: u64,
    ) -> Result<Grant, AcquireError> {
        self.renew_to(client, token, term_ms, now_ns, |old_ns, hold_ns| {
            old_ns.saturating_add(hold_ns)
        })
    }

    /// Renew the live holding `(client, token)`, its expiry set by `expiry(old_expiry, hold)`.
    fn renew_to(
        &mut self,
        client: ClientId,
        token: u64,
        term_ms: u64,
        now_ns: u64,
        expiry: impl Fn(u64, u64) -> u64,
    ) -> Result<Grant, AcquireError> {
        self.check_request(term_ms, now_ns)?;
        let Some(h) = self
            .live_holding(now_ns)
            .filter(|h| h.client == client && h.token == token)
        else {
            return Err(AcquireError::NotHolder { client, token });
        };
        let renewed = Holding {
            expiry_ns: expiry(h.expiry_ns, self.config.grantor_hold_ns(term_ms)),
            term_ms: term_ms.max(h.term_ms),
            ..h
        };
        debug_assert!(renewed.expiry_ns > now_ns && renewed.expiry_ns >= h.expiry_ns);
        self.holding = Some(renewed);
        Ok(Grant { token, term_ms })
    }

    /// Refuse a bad term or a request during the boot holdback.
    fn check_request(&self, term_ms: u64, now_ns: u64) -> Result<(), AcquireError> {
        let max_term_ms = self.config.max_term_ms;
        if term_ms == 0 || term_ms > max_term_ms {
            return Err(AcquireError::BadTerm {
                term_ms,
                max_term_ms,
            });
        }
        if now_ns < self.holdback_until_ns {
            return Err(AcquireError::BootHoldback {
                remaining_ns: self.holdback_until_ns - now_ns,
            });
        }
        Ok(())
    }

    fn live_holding(&self, now_ns: u64) -> Option<Holding> {
        self.holding.filter(|h| now_ns < h.expiry_ns)
    }

    /// A new holding for `client` under the next token.
    fn grant_new(&mut self, client: ClientId, term_ms: u64, now_ns: u64) -> Grant {
        debug_assert!(self.live_holding(now_ns).is_none(), "the lease is free");
        self.token += 1;
        let expiry_ns = now_ns.saturating_add(self.config.grantor_hold_ns(term_ms));
        debug_assert!(expiry_ns > now_ns);
        self.holding = Some(Holding {
            client,
            token: self.token,
            expiry_ns,
            term_ms,
        });
        self.holding_back = false; // the holdback is over: whoever it waited out is gone
        Grant {
            token: self.token,
            term_ms,
        }
    }

    /// [`LeaseServer::acquire`] at the grantor's clock.
    pub fn acquire_now(&mut self, client: ClientId, term_ms: u64) -> Result<Grant, AcquireError> {
        let now_ns = self.clock.now_ns();
        self.acquire(client, term_ms, now_ns)
    }

    /// [`LeaseServer::renew`] at the grantor's clock.
    pub fn renew_now(
        &mut self,
        client: ClientId,
        token: u64,
        term_ms: u64,
    ) -> Result<Grant, AcquireError> {
        let now_ns = self.clock.now_ns();
        self.renew(client, token, term_ms, now_ns)
    }

    /// NEGATIVE CONTROL, for tests only: the first `acquire`, which renewed whenever the same
    /// [`ClientId`] asked. A second incarnation reusing the id gets the first one's token.
    #[doc(hidden)]
    pub fn control_acquire_renewing_by_client_id(
        &mut self,
        client: ClientId,
        term_ms: u64,
        now_ns: u64,
    ) -> Result<Grant, AcquireError> {
        match self.live_holding(now_ns) {
            Some(h) if h.client == client => self.renew(client, h.token, term_ms, now_ns),
            _ => self.acquire(client, term_ms, now_ns),
        }
    }

    /// Free the holding that `client` holds under `token`. Returns whether it did. The client
    /// must stop using the lease *before* it asks.
    ///
    /// Naming the token makes a release safe to retry and to deliver late or twice: every new
    /// holding, even the same client's next one, has a larger token, so an old release matches
    /// nothing.
    pub fn release(&mut self, client: ClientId, token: u64) -> bool {
        match self.holding {
            Some(h) if h.client == client && h.token == token => {
                self.holding = None;
                true
            }
            _ => false,
        }
    }

    /// NEGATIVE CONTROL, for tests only: the first `release`, which named only the client. A late
    /// or duplicated copy frees the same client's next holding while it believes in it.
    #[doc(hidden)]
    pub fn control_release_naming_only_the_client(&mut self, client: ClientId) -> bool {
        match self.holding {
            Some(h) if h.client == client => self.release(client, h.token),
            _ => false,
        }
    }

    /// The holder at `now_ns`, with its expiry on the grantor's clock.
    pub fn holder(&self, now_ns: u64) -> Option<(ClientId, u64)> {
        self.holding
            .filter(|h| now_ns < h.expiry_ns)
            .map(|h| (h.client, h.expiry_ns))
    }

    /// How long the boot holdback still refuses grants at `now_ns` (0 once it is over).
    pub fn holdback_remaining_ns(&self, now_ns: u64) -> u64 {
        self.holdback_until_ns.saturating_sub(now_ns)
    }

    /// The last token handed out. To restart with [`LeaseServer::boot`], persist it durably
    /// before the answer of each grant that raised it leaves (renewals never raise it).
    pub fn last_token(&self) -> u64 {
        self.token
    }

    /// What to persist to restart with [`LeaseServer::restore`]; see [`GrantorRecord`] for when.
    pub fn record(&self) -> GrantorRecord {
        GrantorRecord {
            last_token: self.token,
            holding_back: self.holding_back,
            holder: self.holding.map(|h| (h.client, h.term_ms)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SimClock;

    const MS: u64 = 1_000_000;

    fn config() -> GrantConfig {
        GrantConfig {
            drift_ppm: 10_000,
            margin_ms: 5,
            max_term_ms: 60_000,
        }
    }

    fn server() -> LeaseServer<SimClock> {
        LeaseServer::restore(SimClock::new(0, 0), config(), GrantorRecord::default())
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
        assert_eq!(s.renew(1, 1, 1_000, 500 * MS).unwrap().token, 1);
        // Expiry: 500 ms + 1000·1.01 ms + 5 ms = 1515 ms.
        let err = s.acquire(2, 1_000, 1_515 * MS - 1).unwrap_err();
        assert_eq!(
            err,
            AcquireError::Held {
                holder: 1,
                remaining_ns: 1
            }
        );
        assert_eq!(s.acquire(2, 1_000, 1_515 * MS).unwrap().token, 2);
        assert!(!s.release(2, 1), "not its token");
        assert!(s.release(2, 2));
        assert!(!s.release(2, 2));
        assert_eq!(s.acquire(1, 1_000, 1_600 * MS).unwrap().token, 3);
    }

    #[test]
    fn a_renewal_names_its_holding_and_an_acquire_never_renews() {
        let mut s = server();
        assert_eq!(s.acquire(1, 1_000, 0).unwrap().token, 1);
        // The same id asking again (a retry, or another incarnation) is not handed token 1.
        assert_eq!(
            s.acquire(1, 1_000, 10 * MS),
            Err(AcquireError::AlreadyHolder {
                remaining_ns: 1_005 * MS
            })
        );
        let not = |client, token| Err(AcquireError::NotHolder { client, token });
        assert_eq!(s.renew(1, 2, 1_000, 10 * MS), not(1, 2), "a wrong token");
        assert_eq!(s.renew(2, 1, 1_000, 10 * MS), not(2, 1), "another client");
        assert_eq!(s.renew(1, 1, 1_000, 1_015 * MS), not(1, 1), "run out");
        assert_eq!(s.acquire(1, 1_000, 1_015 * MS).unwrap().token, 2);
        assert_eq!(
            s.renew(1, 1, 1_000, 1_020 * MS),
            not(1, 1),
            "an earlier holding"
        );
        assert!(!s.release(1, 1), "an earlier holding");
        assert_eq!(s.holder(1_020 * MS).map(|h| h.0), Some(1));
        assert!(matches!(
            s.renew(1, 2, 0, 1_020 * MS),
            Err(AcquireError::BadTerm { .. })
        ));
        // The controls: the first acquire renewed by id, the first release ignored the token.
        assert_eq!(
            s.control_acquire_renewing_by_client_id(1, 1_000, 1_030 * MS),
            Ok(Grant {
                token: 2,
                term_ms: 1_000
            })
        );
        assert!(s.control_release_naming_only_the_client(1));
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

    #[test]
    fn a_shorter_renewal_never_shortens_the_grantors_hold() {
        let mut s = server();
        s.acquire(1, 3_000, 0).unwrap(); // held to 3035 ms
        s.renew(1, 1, 100, 10 * MS).unwrap(); // alone this would end at 116 ms
        assert_eq!(s.holder(116 * MS), Some((1, 3_035 * MS)));
        assert!(matches!(
            s.acquire(2, 100, 3_035 * MS - 1),
            Err(AcquireError::Held { holder: 1, .. })
        ));
        assert_eq!(s.record().holder, Some((1, 3_000)), "the longest term");
    }

    #[test]
    fn boot_refuses_every_grant_until_the_holdback_has_passed() {
        let clock = SimClock::new(7 * MS, 0);
        let mut s = LeaseServer::boot(clock.clone(), config(), 41);
        let holdback_ns = config().boot_holdback_ns(); // 60 s·1.01 + 5 ms
        assert_eq!(holdback_ns, 60_605 * MS);
        let end_ns = 7 * MS + holdback_ns;
        assert_eq!(
            s.acquire(1, 1_000, end_ns - 1),
            Err(AcquireError::BootHoldback { remaining_ns: 1 })
        );
        assert_eq!(s.holdback_remaining_ns(7 * MS), holdback_ns);
        assert!(matches!(
            s.acquire(1, 0, 0),
            Err(AcquireError::BadTerm { .. })
        ));
        assert_eq!(s.acquire(1, 1_000, end_ns).unwrap().token, 42);
        assert_eq!(s.holdback_remaining_ns(end_ns), 0);
    }

    #[test]
    #[allow(deprecated)]
    fn new_is_now_boot() {
        let mut s = LeaseServer::new(SimClock::new(0, 0), config(), 3);
        assert_eq!(
            s.acquire_now(1, 1_000),
            Err(AcquireError::BootHoldback {
                remaining_ns: config().boot_holdback_ns()
            })
        );
    }

    #[test]
    fn restore_keeps_the_holder_for_a_full_term_from_the_restart() {
        let mut before = server();
        before.acquire(1, 2_000, 0).unwrap();
        let record = before.record();
        assert_eq!(
            record,
            GrantorRecord {
                last_token: 1,
                holding_back: false,
                holder: Some((1, 2_000))
            }
        );
        // The new process's clock reads something unrelated: 5 ms.
        let clock = SimClock::new(5 * MS, 0);
        let mut s = LeaseServer::restore(clock, config(), record);
        let end_ns = 5 * MS + config().grantor_hold_ns(2_000);
        assert!(matches!(
            s.acquire(2, 1_000, end_ns - 1),
            Err(AcquireError::Held { holder: 1, .. })
        ));
        assert_eq!(s.renew(1, 1, 1_000, 6 * MS).unwrap().token, 1, "renews");
        assert_eq!(s.acquire(2, 1_000, end_ns).unwrap().token, 2);
        let empty = LeaseServer::restore(SimClock::new(0, 0), config(), GrantorRecord::default());
        assert_eq!(empty.holder(0), None);
        assert_eq!(empty.holdback_remaining_ns(0), 0);
    }

    #[test]
    fn a_grantor_holding_back_records_it_and_a_restore_holds_back_again() {
        // Found by the grant simulator (seed 67 of 1000): a booted grantor crashed during its
        // holdback; restoring its record, which named no holder, granted at once.
        let booted = LeaseServer::boot(SimClock::new(0, 0), config(), 5);
        let record = booted.record();
        assert!(record.holding_back && record.holder.is_none());
        let clock = SimClock::new(9 * MS, 0);
        let mut s = LeaseServer::restore(clock, config(), record);
        let end_ns = 9 * MS + config().boot_holdback_ns();
        assert_eq!(
            s.acquire(1, 1_000, end_ns - 1),
            Err(AcquireError::BootHoldback { remaining_ns: 1 })
        );
        assert_eq!(s.acquire(1, 1_000, end_ns).unwrap().token, 6);
        assert!(!s.record().holding_back, "a grant ends it");
    }

    #[test]
    fn the_record_changes_only_for_a_new_holder_a_longer_term_or_a_release() {
        let mut s = server();
        s.acquire(1, 1_000, 0).unwrap();
        let r = s.record();
        s.renew(1, 1, 1_000, 100 * MS).unwrap();
        s.renew(1, 1, 500, 200 * MS).unwrap();
        assert_eq!(s.record(), r, "renewals with no longer term cost no write");
        s.renew(1, 1, 2_000, 300 * MS).unwrap();
        assert_eq!(s.record().holder, Some((1, 2_000)));
        assert!(s.release(1, 1));
        assert_eq!(s.record().holder, None);
    }
}
