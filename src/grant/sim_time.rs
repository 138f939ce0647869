//! Simulated time for the [`Renewer`](crate::grant::Renewer)'s two threads, deterministic.
//!
//! The renewer thread waits through a [`SimSleeper`], which jumps the simulated clock instead of
//! sleeping. A simulated transport takes simulated time through its [`SimTransportTime`]: it
//! *parks* until an instant, and the renewer thread moves the clock there only when it has nothing
//! earlier to do. So a transport that "blocks for 1.5 s" really lets the renewer's timers run first.
//!
//! The rule that makes it deterministic: while an attempt is in flight and the transport has not
//! parked, the renewer thread waits (in real time) for it to answer or park. A transport therefore
//! either answers in zero simulated time or parks; it must not step the clock itself.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::{Condvar, Mutex};

use crate::clock::{Clock, SimClock};
use crate::grant::renewer::Sleeper;

#[derive(Debug, Default)]
struct ParkState {
    /// The transport is parked until this instant (`u64::MAX`: forever); `None`: it is not parked.
    parked_until_ns: Option<u64>,
    /// The renewer thread is gone: parked transports return.
    closed: bool,
}

#[derive(Debug, Default)]
struct Park {
    state: Mutex<ParkState>,
    resumed: Condvar,
}

/// "Sleeps" by jumping a simulated clock forward. Give its [`SimSleeper::transport_time`] to a
/// simulated transport before handing the sleeper to [`Renewer::spawn`](crate::grant::Renewer::spawn).
#[derive(Debug)]
pub struct SimSleeper {
    clock: SimClock,
    park: Arc<Park>,
}

/// A simulated transport's view of time: it parks until the renewer thread reaches an instant.
#[derive(Debug, Clone)]
pub struct SimTransportTime {
    clock: SimClock,
    park: Arc<Park>,
}

/// How often the renewer thread looks again while a transport runs (real time; no result depends on it).
const POLL: Duration = Duration::from_millis(1);

impl SimSleeper {
    /// A sleeper that jumps `clock`.
    pub fn new(clock: SimClock) -> Self {
        SimSleeper {
            clock,
            park: Arc::default(),
        }
    }

    /// The handle a simulated transport takes time through.
    pub fn transport_time(&self) -> SimTransportTime {
        SimTransportTime {
            clock: self.clock.clone(),
            park: self.park.clone(),
        }
    }

    fn jump(&self, until_ns: u64) {
        let now_ns = self.clock.now_ns();
        if now_ns < until_ns {
            self.clock.step(until_ns - now_ns);
        }
    }
}

impl Sleeper for SimSleeper {
    fn sleep_until(&mut self, until_ns: u64) {
        self.jump(until_ns);
    }

    fn recv_until<T>(&mut self, answers: &Receiver<T>, until_ns: u64) -> Option<T> {
        loop {
            if let Ok(a) = answers.try_recv() {
                return Some(a);
            }
            let mut st = self.park.state.lock();
            match st.parked_until_ns {
                Some(t) if t <= until_ns && t < u64::MAX => {
                    self.jump(t); // the transport's time comes first: resume it
                    st.parked_until_ns = None;
                    self.park.resumed.notify_all();
                }
                Some(_) if until_ns < u64::MAX => {
                    self.jump(until_ns); // our timer comes first; the transport stays parked
                    return None;
                }
                Some(_) => {
                    // Both wait forever: let the renewer check its stop flag.
                    drop(st);
                    std::thread::sleep(POLL);
                    return None;
                }
                None => {
                    drop(st);
                    match answers.recv_timeout(POLL) {
                        Ok(a) => return Some(a),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => {
                            if until_ns < u64::MAX {
                                self.jump(until_ns);
                            }
                            return None;
                        }
                    }
                }
            }
        }
    }
}

impl Drop for SimSleeper {
    fn drop(&mut self) {
        self.park.state.lock().closed = true;
        self.park.resumed.notify_all();
    }
}

impl SimTransportTime {
    /// Let `delay_ns` of simulated time pass inside the transport call. Returns `false` if the
    /// renewer exited meanwhile (the answer will be dropped).
    pub fn sleep(&self, delay_ns: u64) -> bool {
        self.park_until(
            self.clock
                .now_ns()
                .saturating_add(delay_ns)
                .min(u64::MAX - 1),
        )
    }

    /// Never return while the renewer runs: a transport that hangs. Returns once the renewer exits.
    pub fn block_forever(&self) {
        self.park_until(u64::MAX);
    }

    /// The transport's clock reading (the renewer's clock).
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn park_until(&self, until_ns: u64) -> bool {
        let mut st = self.park.state.lock();
        st.parked_until_ns = Some(until_ns);
        while st.parked_until_ns.is_some() && !st.closed {
            self.park.resumed.wait(&mut st);
        }
        !st.closed
    }
}
