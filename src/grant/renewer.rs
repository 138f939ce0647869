//! A renewer thread: keeps a [`LeaseHolder`]'s lease alive through a transport you supply, and
//! tells the owner when the lease is lost, `d/12` before the holder's view ends, whatever the
//! transport does.
//!
//! Two threads: the renewer thread runs the [`Renewal`] core and its loss timer; an I/O thread
//! calls the transport, one attempt at a time, with a deadline. The renewer thread never waits on
//! the transport beyond the loss timer, so a transport that blocks or never returns cannot delay
//! [`LeaseEvent::Lost`].
//!
//! **What the timing claim means.** In simulated time ([`SimSleeper`]) `Lost` comes exactly at
//! `valid_until − d/12`. With real threads it comes when the renewer thread next runs after that
//! instant: usually within a millisecond, but a loaded machine, a paused process or a suspended
//! host can delay it past the end of the view (a run on a loaded 2-core machine, 120 ms
//! term: `Lost` came 1.8 ms and 40.7 ms after the view had ended in 2 of 6 runs). The event
//! channel is a prompt, not a guarantee. So an owner:
//! - checks [`Renewer::token`]`(now)` **right before each protected action** (it reads the clock,
//!   with no thread in between) and acts only if it returns the token;
//! - fences every write to shared storage with that token ([`FencedStore`](crate::grant::FencedStore)),
//!   so that an action that starts in time but lands late is refused;
//! - picks a term whose `d/12` is well above the scheduling delays it expects;
//! - reads its clock from one that counts through suspend ([`BootClock`](crate::BootClock)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::grant::event::{LeaseEvent, TransportError};
use crate::grant::holder::LeaseHolder;
use crate::grant::renewal::{RenewStep, Renewal, RenewalError};
use crate::grant::server::Grant;

pub use crate::grant::sim_time::{SimSleeper, SimTransportTime};

/// One renewal attempt, as the [`Transport`] receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewRequest {
    /// The fencing token of the holding to renew: send it, the grantor renews only that holding.
    pub token: u64,
    /// The term to ask for, in ms.
    pub term_ms: u64,
    /// Give up by this instant on the renewer's clock.
    pub deadline_ns: u64,
    /// The same deadline as a duration: the time left until it when the call starts, measured on
    /// the renewer's clock just before the call. Use it for socket timeouts.
    pub timeout: Duration,
}

/// How the renewer thread waits. Production uses [`ClockSleeper`]; tests use [`SimSleeper`].
pub trait Sleeper: Send {
    /// Return once the clock reads at least `until_ns` (or earlier, to let the renewer check stop).
    fn sleep_until(&mut self, until_ns: u64);

    /// Wait for the answer of the attempt in flight on `answers`, until the clock reads `until_ns`.
    /// `None` if it has not come (returning early is allowed: the renewer polls again).
    ///
    /// The default checks, sleeps, and checks again; override it to wake as the answer arrives.
    fn recv_until<T>(&mut self, answers: &Receiver<T>, until_ns: u64) -> Option<T> {
        if let Ok(a) = answers.try_recv() {
            return Some(a);
        }
        self.sleep_until(until_ns);
        answers.try_recv().ok()
    }
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

    fn wait_for(&self, until_ns: u64) -> Duration {
        let wait_ns = until_ns
            .saturating_sub(self.clock.now_ns())
            .min(self.max_sleep_ns);
        Duration::from_nanos(wait_ns)
    }
}

impl<C: Clock> Sleeper for ClockSleeper<C> {
    fn sleep_until(&mut self, until_ns: u64) {
        std::thread::sleep(self.wait_for(until_ns));
    }

    fn recv_until<T>(&mut self, answers: &Receiver<T>, until_ns: u64) -> Option<T> {
        match answers.recv_timeout(self.wait_for(until_ns)) {
            Ok(a) => Some(a),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                self.sleep_until(until_ns); // the I/O thread is gone: only the timer is left
                None
            }
        }
    }
}

/// A renewal transport: asks the grantor to renew the holding `request.token` for
/// `request.term_ms` and returns its answer or a typed error.
///
/// Give up within `request.timeout` (an answer after the deadline may be ignored). Ignoring it
/// is safe, since the renewer declares the loss on its own timer, but it keeps the I/O thread, and
/// so the next attempt, waiting. Return a grantor's refusal as [`TransportError::Refused`]: the
/// owner is told at once that the lease is lost.
pub trait Transport: Send {
    /// Ask for one renewal.
    fn renew(&mut self, request: RenewRequest) -> Result<Grant, TransportError>;
}

impl<T: FnMut(RenewRequest) -> Result<Grant, TransportError> + Send> Transport for T {
    fn renew(&mut self, request: RenewRequest) -> Result<Grant, TransportError> {
        self(request)
    }
}

/// A running renewer. Dropping it stops the renewer thread.
///
/// The I/O thread ends once its current transport call returns; a call that never returns keeps
/// that thread (only) blocked.
pub struct Renewer {
    core: Arc<Mutex<Renewal>>,
    events: Receiver<LeaseEvent>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// One attempt for the I/O thread: (token, term_ms, deadline_ns).
type Request = (u64, u64, u64);
type Answer = Result<Grant, TransportError>;

struct Loop<C: Clock, S: Sleeper> {
    clock: Arc<C>,
    sleeper: S,
    core: Arc<Mutex<Renewal>>,
    requests: Sender<Request>,
    answers: Receiver<Answer>,
    events: Sender<LeaseEvent>,
    stop: Arc<AtomicBool>,
}

impl<C: Clock, S: Sleeper> Loop<C, S> {
    fn run(mut self) {
        while !self.stop.load(Ordering::Acquire) {
            let now_ns = self.clock.now_ns();
            let step = self.core.lock().poll(now_ns);
            match step {
                RenewStep::Send {
                    token,
                    term_ms,
                    deadline_ns,
                } => {
                    if self.requests.send((token, term_ms, deadline_ns)).is_err() {
                        self.answer(Err(TransportError::Gone));
                    }
                }
                RenewStep::Event(e) => {
                    if !self.emit(e) {
                        return;
                    }
                }
                RenewStep::Wait { until_ns } => {
                    if !self.core.lock().in_flight() {
                        self.sleeper.sleep_until(until_ns);
                    } else if let Some(answer) = self.sleeper.recv_until(&self.answers, until_ns) {
                        if !self.answer(answer) {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Feed an answer to the core; false once the lease is lost.
    fn answer(&mut self, answer: Answer) -> bool {
        let now_ns = self.clock.now_ns();
        let event = self.core.lock().on_answer(answer, now_ns);
        self.emit(event)
    }

    /// Tell the owner; false once the lease is lost.
    fn emit(&self, event: LeaseEvent) -> bool {
        let lost = matches!(event, LeaseEvent::Lost { .. });
        let _ = self.events.send(event);
        !lost
    }
}

/// The I/O thread: one transport call per request, until the renewer thread hangs up.
fn serve<C: Clock, T: Transport>(
    clock: Arc<C>,
    mut transport: T,
    requests: Receiver<Request>,
    answers: Sender<Answer>,
) {
    for (token, term_ms, deadline_ns) in requests {
        let timeout = Duration::from_nanos(deadline_ns.saturating_sub(clock.now_ns()));
        let request = RenewRequest {
            token,
            term_ms,
            deadline_ns,
            timeout,
        };
        if answers.send(transport.renew(request)).is_err() {
            return;
        }
    }
}

impl Renewer {
    /// Start renewing `holder` (which should already hold the lease) for `term_ms` at a time,
    /// through `transport`, on a renewer thread and an I/O thread. Refused (no thread started) if
    /// `term_ms` is below 12 ms.
    pub fn spawn<C, S, T>(
        clock: Arc<C>,
        holder: LeaseHolder,
        term_ms: u64,
        transport: T,
        sleeper: S,
    ) -> Result<Renewer, RenewalError>
    where
        C: Clock + 'static,
        S: Sleeper + 'static,
        T: Transport + 'static,
    {
        let core = Renewal::new(holder, term_ms)?;
        Ok(Self::spawn_core(clock, core, transport, sleeper))
    }

    /// [`Renewer::spawn`] around a [`Renewal`] you built (for tests: its negative control).
    #[doc(hidden)]
    pub fn spawn_core<C, S, T>(clock: Arc<C>, core: Renewal, transport: T, sleeper: S) -> Renewer
    where
        C: Clock + 'static,
        S: Sleeper + 'static,
        T: Transport + 'static,
    {
        let core = Arc::new(Mutex::new(core));
        let stop = Arc::new(AtomicBool::new(false));
        let (events_tx, events) = unbounded();
        let (requests_tx, requests_rx) = bounded(1);
        let (answers_tx, answers_rx) = bounded(1);
        let io_clock = clock.clone();
        std::thread::Builder::new()
            .name("lease-renewer-io".into())
            .spawn(move || serve(io_clock, transport, requests_rx, answers_tx))
            .expect("spawn the renewer's I/O thread");
        let lp = Loop {
            clock,
            sleeper,
            core: core.clone(),
            requests: requests_tx,
            answers: answers_rx,
            events: events_tx,
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("lease-renewer".into())
            .spawn(move || lp.run())
            .expect("spawn the renewer thread");
        Renewer {
            core,
            events,
            stop,
            thread: Some(thread),
        }
    }

    /// Events for the owner. A [`LeaseEvent::Lost`] means stop using the lease at once; it is due
    /// `d/12` before the holder's view ends, whatever the transport does, but real threads deliver
    /// it when they are scheduled (see the module docs): act only under [`Renewer::token`].
    pub fn events(&self) -> &Receiver<LeaseEvent> {
        &self.events
    }

    /// The fencing token, while the holder's view holds at `now_ns`. Read the renewer's clock and
    /// call this **right before each protected action**, and fence the action with the token: it
    /// depends on no thread being scheduled in time.
    pub fn token(&self, now_ns: u64) -> Option<u64> {
        self.core.lock().token(now_ns)
    }

    /// Stop renewing and wait for the renewer thread (not for a transport call in progress).
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
