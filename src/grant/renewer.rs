//! A renewer thread: keeps a [`LeaseHolder`]'s lease alive through a transport you supply, and
//! tells the owner at once when the lease is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;

use crate::clock::{Clock, SimClock};
use crate::grant::holder::LeaseHolder;
use crate::grant::server::Grant;

/// What the renewer tells the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// Renewed: the holder's view now ends at `valid_until_ns`.
    Renewed {
        /// The fencing token.
        token: u64,
        /// The new end of the holder's view.
        valid_until_ns: u64,
        /// Local time of the renewal's answer.
        at_ns: u64,
    },
    /// One renewal failed; the renewer retries while the lease lasts.
    RenewFailed {
        /// The transport's error.
        error: String,
        /// Failures in a row.
        attempt: u32,
        /// Local time of the failure.
        at_ns: u64,
    },
    /// The lease is lost or about to be: **stop using it now**. The renewer has exited.
    Lost {
        /// Why.
        reason: LossReason,
        /// Local time of the signal; before the holder's view ends when renewals failed.
        at_ns: u64,
    },
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// Renewals kept failing and no retry could finish before the lease ends.
    RenewalsFailed {
        /// Where the holder's view would have ended.
        valid_until_ns: u64,
    },
    /// The grantor answered with another token: the lease changed hands in between.
    TokenChanged {
        /// The token held before.
        old: Option<u64>,
        /// The token granted now.
        new: u64,
    },
    /// The lease was never held when the renewer started.
    NotHeld,
}

/// How the renewer waits. Production uses [`ClockSleeper`]; tests use [`SimSleeper`].
pub trait Sleeper: Send {
    /// Return once the clock reads at least `until_ns` (or earlier, to let the renewer check stop).
    fn sleep_until(&mut self, until_ns: u64);
}

/// Sleeps the thread on a real clock.
pub struct ClockSleeper<C: Clock> {
    clock: Arc<C>,
    /// Longest single sleep, so that a stop request is noticed.
    max_sleep_ns: u64,
}

impl<C: Clock> ClockSleeper<C> {
    /// Sleep on `clock`, waking at least every 50 ms.
    pub fn new(clock: Arc<C>) -> Self {
        ClockSleeper {
            clock,
            max_sleep_ns: 50_000_000,
        }
    }
}

impl<C: Clock> Sleeper for ClockSleeper<C> {
    fn sleep_until(&mut self, until_ns: u64) {
        let wait_ns = until_ns
            .saturating_sub(self.clock.now_ns())
            .min(self.max_sleep_ns);
        std::thread::sleep(std::time::Duration::from_nanos(wait_ns));
    }
}

/// "Sleeps" by jumping a simulated clock forward: the renewer runs deterministically in sim time.
pub struct SimSleeper(pub SimClock);

impl Sleeper for SimSleeper {
    fn sleep_until(&mut self, until_ns: u64) {
        let now_ns = self.0.now_ns();
        self.0.step(until_ns.saturating_sub(now_ns));
    }
}

/// A renewal transport: asks the grantor for `term_ms` and returns its answer or an error.
/// It must bound its own time (a request timeout): the renewer cannot interrupt it.
pub trait Transport: FnMut(u64) -> Result<Grant, String> + Send {}
impl<T: FnMut(u64) -> Result<Grant, String> + Send> Transport for T {}

/// A running renewer. Dropping it stops the thread.
pub struct Renewer {
    holder: Arc<Mutex<LeaseHolder>>,
    events: Receiver<LeaseEvent>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// When the renewer retries a failed renewal: every `term/12`, so two failures still leave time.
const RETRY_DIVISOR: u64 = 12;

struct Loop<C: Clock, S: Sleeper, T: Transport> {
    clock: Arc<C>,
    sleeper: S,
    transport: T,
    holder: Arc<Mutex<LeaseHolder>>,
    events: Sender<LeaseEvent>,
    stop: Arc<AtomicBool>,
    term_ms: u64,
}

impl<C: Clock, S: Sleeper, T: Transport> Loop<C, S, T> {
    fn run(mut self) {
        let retry_ns = self.term_ms * 1_000_000 / RETRY_DIVISOR;
        let mut failures = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let now_ns = self.clock.now_ns();
            let (renew_at_ns, valid_until_ns) = {
                let h = self.holder.lock();
                (h.renew_at_ns(), h.valid_until_ns())
            };
            let (Some(renew_at_ns), Some(valid_until_ns)) = (renew_at_ns, valid_until_ns) else {
                return self.lost(LossReason::NotHeld);
            };
            if now_ns < renew_at_ns && failures == 0 {
                self.sleeper.sleep_until(renew_at_ns);
                continue;
            }
            let sent_at_ns = self.clock.now_ns(); // before the request goes out
            match (self.transport)(self.term_ms) {
                Ok(grant) => {
                    failures = 0;
                    let old = self.holder.lock().token(sent_at_ns);
                    if !self.holder.lock().on_grant(sent_at_ns, grant) {
                        return self.lost(LossReason::TokenChanged {
                            old,
                            new: grant.token,
                        });
                    }
                    let valid_until_ns = self.holder.lock().valid_until_ns().expect("just granted");
                    let at_ns = self.clock.now_ns();
                    let _ = self.events.send(LeaseEvent::Renewed {
                        token: grant.token,
                        valid_until_ns,
                        at_ns,
                    });
                }
                Err(error) => {
                    failures += 1;
                    let at_ns = self.clock.now_ns();
                    let _ = self.events.send(LeaseEvent::RenewFailed {
                        error,
                        attempt: failures,
                        at_ns,
                    });
                    if at_ns + retry_ns >= valid_until_ns {
                        return self.lost(LossReason::RenewalsFailed { valid_until_ns });
                    }
                    self.sleeper.sleep_until(at_ns + retry_ns);
                }
            }
        }
    }

    fn lost(&mut self, reason: LossReason) {
        self.holder.lock().drop_lease();
        let at_ns = self.clock.now_ns();
        let _ = self.events.send(LeaseEvent::Lost { reason, at_ns });
    }
}

impl Renewer {
    /// Start renewing `holder` (which should already hold the lease) for `term_ms` at a time,
    /// through `transport`, on a dedicated thread.
    pub fn spawn<C, S, T>(
        clock: Arc<C>,
        holder: LeaseHolder,
        term_ms: u64,
        transport: T,
        sleeper: S,
    ) -> Renewer
    where
        C: Clock + 'static,
        S: Sleeper + 'static,
        T: Transport + 'static,
    {
        assert!(
            term_ms >= RETRY_DIVISOR,
            "lease term {term_ms} ms is too short to renew"
        );
        let holder = Arc::new(Mutex::new(holder));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = unbounded();
        let lp = Loop {
            clock,
            sleeper,
            transport,
            holder: holder.clone(),
            events: tx,
            stop: stop.clone(),
            term_ms,
        };
        let thread = std::thread::Builder::new()
            .name("lease-renewer".into())
            .spawn(move || lp.run())
            .expect("spawn the renewer thread");
        Renewer {
            holder,
            events: rx,
            stop,
            thread: Some(thread),
        }
    }

    /// Events for the owner. A [`LeaseEvent::Lost`] means stop using the lease at once.
    pub fn events(&self) -> &Receiver<LeaseEvent> {
        &self.events
    }

    /// The fencing token, while the lease holds at `now_ns`.
    pub fn token(&self, now_ns: u64) -> Option<u64> {
        self.holder.lock().token(now_ns)
    }

    /// Stop renewing and wait for the thread (it finishes any renewal in progress).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
