//! The renewer's pure core: when to send a renewal, and when the lease is lost.
//!
//! The loss signal comes from a timer tied to the holder's view, never from the transport: with
//! the view ending at `valid_until = sent_at + d·(1−ρ) − ε`, the lease is declared lost at
//! `valid_until − d/12` on the holder's clock unless a renewal has moved the view on by then,
//! whatever the transport is doing. A transport that blocks, ignores its deadline or never
//! returns delays nothing. [`Renewer`](crate::grant::Renewer) drives it on threads; a simulator or
//! an event loop can drive it directly.
//!
//! ```
//! use raft_lease::grant::{GrantConfig, Grant, LeaseEvent, LeaseHolder, Renewal, RenewStep};
//!
//! let mut holder = LeaseHolder::new(GrantConfig::default());
//! holder.on_grant(0, Grant { token: 1, term_ms: 3_000 });
//! let mut renewal = Renewal::new(holder, 3_000).expect("long enough to renew");
//! // Nothing to do until a third of the view is left (ρ = 500 ppm, ε = 10 ms: view 2988.5 ms).
//! assert_eq!(renewal.poll(0), RenewStep::Wait { until_ns: 1_988_500_000 });
//! let RenewStep::Send { token, deadline_ns, .. } = renewal.poll(1_988_500_000) else { panic!() };
//! assert_eq!(token, 1, "the renewal names the holding it renews");
//! assert_eq!(deadline_ns, 1_988_500_000 + 250_000_000);
//! // The transport never answers: the loss timer fires 250 ms before the view ends.
//! assert!(matches!(renewal.poll(2_238_500_000), RenewStep::Event(LeaseEvent::RenewFailed { .. })));
//! assert_eq!(renewal.poll(2_238_500_000), RenewStep::Wait { until_ns: 2_738_500_000 });
//! assert!(matches!(renewal.poll(2_738_500_000), RenewStep::Event(LeaseEvent::Lost { .. })));
//! assert_eq!(renewal.token(2_738_500_000), None);
//! ```

use thiserror::Error;

use crate::grant::event::{LeaseEvent, LossReason, TransportError};
use crate::grant::holder::LeaseHolder;
use crate::grant::server::Grant;

/// The retry interval and the loss timer's lead are both `term / 12`: at `d/3` left there is room
/// for about three attempts before the loss timer fires `d/12` before the view ends.
pub const RETRY_DIVISOR: u64 = 12;

/// Why a renewal cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenewalError {
    /// The term is too short to schedule retries (`d/12` would be under 1 ms).
    #[error("lease term {term_ms} ms is too short to renew: at least {min_ms} ms")]
    TermTooShort {
        /// The term asked for.
        term_ms: u64,
        /// The shortest term a renewal accepts.
        min_ms: u64,
    },
}

/// What the driver should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewStep {
    /// Send a renewal of the holding `token` for `term_ms` now (`sent_at` is the instant passed
    /// to [`Renewal::poll`]). The transport should give up by `deadline_ns`, on the holder's clock.
    Send {
        /// The fencing token of the holding to renew (the grantor renews only that holding).
        token: u64,
        /// The term to ask for, in ms.
        term_ms: u64,
        /// When the transport should give up on this attempt (holder's clock, ns).
        deadline_ns: u64,
    },
    /// Tell the owner, then poll again. After a [`LeaseEvent::Lost`] the renewal is over.
    Event(LeaseEvent),
    /// Nothing to do before `until_ns` (holder's clock), unless an answer arrives first.
    Wait {
        /// When to poll again, in ns; `u64::MAX` once the renewal is over.
        until_ns: u64,
    },
}

/// One renewal attempt in flight.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    /// Read before the request left: the holder's view of its answer runs from here.
    sent_at_ns: u64,
    /// The transport was asked to give up by this instant.
    deadline_ns: u64,
    /// Whether the missed deadline was already counted as a failure.
    missed: bool,
}

/// The renewal state machine of one held lease. Pure: time is an argument.
#[derive(Debug, Clone)]
pub struct Renewal {
    holder: LeaseHolder,
    term_ms: u64,
    /// `term / 12`, in ns: the retry interval and the loss timer's lead.
    retry_ns: u64,
    /// Failed attempts in a row.
    failures: u32,
    in_flight: Option<Attempt>,
    /// After a failure: the earliest next attempt.
    retry_at_ns: Option<u64>,
    /// A [`LeaseEvent::Lost`] went out; nothing more happens.
    finished: bool,
    /// NEGATIVE CONTROL: the loss is decided only when the transport returns (the old renewer).
    loss_from_transport_only: bool,
}

impl Renewal {
    /// Renew `holder` (which should hold the lease) for `term_ms` at a time. Refused if `term_ms`
    /// is below 12 ms, too short to schedule retries.
    pub fn new(holder: LeaseHolder, term_ms: u64) -> Result<Self, RenewalError> {
        if term_ms < RETRY_DIVISOR {
            return Err(RenewalError::TermTooShort {
                term_ms,
                min_ms: RETRY_DIVISOR,
            });
        }
        Ok(Renewal {
            holder,
            term_ms,
            retry_ns: term_ms.saturating_mul(1_000_000) / RETRY_DIVISOR,
            failures: 0,
            in_flight: None,
            retry_at_ns: None,
            finished: false,
            loss_from_transport_only: false,
        })
    }

    /// NEGATIVE CONTROL, for tests only: no loss timer and no deadline; the loss is decided only
    /// after the transport returns, as the first renewer did. A blocked transport then tells the
    /// owner after the grantor may have given the lease to someone else.
    #[doc(hidden)]
    pub fn control_loss_only_when_the_transport_returns(mut self) -> Self {
        self.loss_from_transport_only = true;
        self
    }

    /// What to do at `now_ns` (holder's clock). Call it again after every step, every answer and
    /// every wake-up; a [`RenewStep::Send`] records `now_ns` as the attempt's `sent_at`.
    pub fn poll(&mut self, now_ns: u64) -> RenewStep {
        if self.finished {
            return RenewStep::Wait { until_ns: u64::MAX };
        }
        let (Some(valid_until_ns), Some(token)) =
            (self.holder.valid_until_ns(), self.holder.held_token())
        else {
            return self.lose(LossReason::NotHeld, now_ns);
        };
        let control = self.loss_from_transport_only;
        let lost_at_ns = self.lost_at_ns().expect("held");
        if !control && now_ns >= lost_at_ns {
            return self.lose(LossReason::RenewalsFailed { valid_until_ns }, now_ns);
        }
        if let Some(attempt) = self.in_flight.as_mut() {
            if control {
                return RenewStep::Wait { until_ns: u64::MAX };
            }
            if now_ns < attempt.deadline_ns {
                let until_ns = attempt.deadline_ns;
                return RenewStep::Wait { until_ns };
            }
            if !attempt.missed {
                attempt.missed = true;
                self.failures += 1;
                return RenewStep::Event(LeaseEvent::RenewFailed {
                    error: TransportError::DeadlineMissed,
                    attempt: self.failures,
                    at_ns: now_ns,
                });
            }
            return RenewStep::Wait {
                until_ns: lost_at_ns,
            };
        }
        let next_ns = match self.retry_at_ns {
            Some(t) => t,
            None => self.holder.renew_at_ns().expect("held"),
        };
        let limit_ns = if control { valid_until_ns } else { lost_at_ns };
        if self.failures > 0 && next_ns >= limit_ns {
            // No further attempt could finish before the loss timer: fail fast.
            return self.lose(LossReason::RenewalsFailed { valid_until_ns }, now_ns);
        }
        if now_ns < next_ns {
            return RenewStep::Wait { until_ns: next_ns };
        }
        let deadline_ns = if control {
            u64::MAX
        } else {
            now_ns.saturating_add(self.retry_ns).min(lost_at_ns)
        };
        self.in_flight = Some(Attempt {
            sent_at_ns: now_ns,
            deadline_ns,
            missed: false,
        });
        RenewStep::Send {
            token,
            term_ms: self.term_ms,
            deadline_ns,
        }
    }

    /// The transport answered the attempt in flight, at `now_ns`. Returns what to tell the owner.
    ///
    /// A refusal from the grantor ([`TransportError::Refused`]: the holding is gone, or cannot
    /// be renewed) loses the lease at once; any other error is retried while time is left.
    ///
    /// Panics if no attempt is in flight or the renewal is over: the driver must drop answers
    /// once it has seen [`LeaseEvent::Lost`].
    pub fn on_answer(&mut self, answer: Result<Grant, TransportError>, now_ns: u64) -> LeaseEvent {
        assert!(!self.finished, "an answer after the lease was lost");
        let attempt = self
            .in_flight
            .take()
            .expect("an answer with no attempt in flight");
        match answer {
            Ok(grant) => {
                let old = self.holder.token(attempt.sent_at_ns);
                if !self.holder.on_grant(attempt.sent_at_ns, grant) {
                    let new = grant.token;
                    return self.lost(LossReason::TokenChanged { old, new }, now_ns);
                }
                self.failures = 0;
                self.retry_at_ns = None;
                LeaseEvent::Renewed {
                    token: grant.token,
                    valid_until_ns: self.holder.valid_until_ns().expect("just granted"),
                    at_ns: now_ns,
                }
            }
            Err(TransportError::Refused(why)) => self.lost(LossReason::Refused(why), now_ns),
            Err(error) => {
                if !attempt.missed {
                    self.failures += 1;
                }
                self.retry_at_ns = Some(now_ns.saturating_add(self.retry_ns));
                LeaseEvent::RenewFailed {
                    error,
                    attempt: self.failures,
                    at_ns: now_ns,
                }
            }
        }
    }

    fn lost(&mut self, reason: LossReason, now_ns: u64) -> LeaseEvent {
        let RenewStep::Event(lost) = self.lose(reason, now_ns) else {
            unreachable!("lose returns an event")
        };
        lost
    }

    fn lose(&mut self, reason: LossReason, now_ns: u64) -> RenewStep {
        self.finished = true;
        self.in_flight = None;
        self.holder.drop_lease();
        RenewStep::Event(LeaseEvent::Lost {
            reason,
            at_ns: now_ns,
        })
    }

    /// Whether an attempt awaits its answer.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether the lease was declared lost (the renewal is over).
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// When the loss timer fires unless a renewal moves the view on: `valid_until − d/12`.
    pub fn lost_at_ns(&self) -> Option<u64> {
        let until_ns = self.holder.valid_until_ns()?;
        Some(until_ns.saturating_sub(self.retry_ns))
    }

    /// The fencing token, while the holder's view holds at `now_ns`.
    pub fn token(&self, now_ns: u64) -> Option<u64> {
        self.holder.token(now_ns)
    }

    /// The holder's view.
    pub fn holder(&self) -> &LeaseHolder {
        &self.holder
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::{AcquireError, GrantConfig};

    const MS: u64 = 1_000_000;

    fn renewal() -> Renewal {
        let mut holder = LeaseHolder::new(GrantConfig::default());
        holder.on_grant(
            0,
            Grant {
                token: 1,
                term_ms: 3_000,
            },
        );
        Renewal::new(holder, 3_000).expect("a 3 s term")
    }

    fn grant() -> Result<Grant, TransportError> {
        Ok(Grant {
            token: 1,
            term_ms: 3_000,
        })
    }

    #[test]
    fn a_renewal_moves_the_view_from_its_sent_at() {
        let mut r = renewal();
        let renew_at = 1_988_500_000;
        assert_eq!(r.poll(renew_at - 1), RenewStep::Wait { until_ns: renew_at });
        assert!(matches!(r.poll(renew_at), RenewStep::Send { .. }));
        assert!(r.in_flight());
        let e = r.on_answer(grant(), renew_at + 40 * MS);
        assert_eq!(
            e,
            LeaseEvent::Renewed {
                token: 1,
                valid_until_ns: renew_at + 2_988_500_000,
                at_ns: renew_at + 40 * MS
            }
        );
        assert!(!r.in_flight());
    }

    #[test]
    fn errors_retry_every_twelfth_and_give_up_before_the_loss_timer() {
        let mut r = renewal();
        let mut t = 1_988_500_000;
        let mut failures = 0;
        loop {
            match r.poll(t) {
                RenewStep::Send { .. } => {
                    failures += 1;
                    let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                    r.on_answer(Err(io.into()), t);
                }
                RenewStep::Wait { until_ns } => t = until_ns,
                RenewStep::Event(LeaseEvent::Lost { at_ns, .. }) => {
                    assert!(
                        at_ns < r.holder().valid_until_ns().unwrap_or(0) || at_ns < 2_738_500_000
                    );
                    break;
                }
                RenewStep::Event(e) => panic!("{e:?}"),
            }
        }
        // Attempts at 1988.5, 2238.5 and 2488.5 ms; a fourth could not start before 2738.5 ms.
        assert_eq!((failures, t), (3, 2_488_500_000));
        assert_eq!(r.poll(t), RenewStep::Wait { until_ns: u64::MAX });
    }

    #[test]
    fn a_changed_token_is_lost_at_once() {
        let mut r = renewal();
        r.poll(1_988_500_000);
        let e = r.on_answer(
            Ok(Grant {
                token: 9,
                term_ms: 3_000,
            }),
            1_989_000_000,
        );
        assert!(matches!(
            e,
            LeaseEvent::Lost {
                reason: LossReason::TokenChanged {
                    old: Some(1),
                    new: 9
                },
                ..
            }
        ));
        assert!(r.is_finished() && r.token(1_989_000_000).is_none());
    }

    #[test]
    fn a_refusal_is_lost_at_once_and_a_short_term_is_a_typed_error() {
        let mut r = renewal();
        r.poll(1_988_500_000);
        let refused = AcquireError::NotHolder {
            client: 7,
            token: 1,
        };
        let e = r.on_answer(Err(refused.clone().into()), 1_989_000_000);
        assert_eq!(
            e,
            LeaseEvent::Lost {
                reason: LossReason::Refused(refused),
                at_ns: 1_989_000_000
            }
        );
        let holder = LeaseHolder::new(GrantConfig::default());
        assert_eq!(
            Renewal::new(holder.clone(), 11).err(),
            Some(RenewalError::TermTooShort {
                term_ms: 11,
                min_ms: 12
            })
        );
        assert!(Renewal::new(holder, 12).is_ok());
    }

    #[test]
    fn the_control_waits_for_the_transport_forever() {
        let mut r = renewal().control_loss_only_when_the_transport_returns();
        assert_eq!(
            r.poll(1_988_500_000),
            RenewStep::Send {
                token: 1,
                term_ms: 3_000,
                deadline_ns: u64::MAX
            }
        );
        assert_eq!(r.poll(10_000 * MS), RenewStep::Wait { until_ns: u64::MAX });
        assert!(
            !r.is_finished(),
            "no timer: still not lost, long after the view ended"
        );
    }
}
