//! Monotonic clocks, injected everywhere the lease needs time.
//!
//! The lease argument needs clocks that never go backwards and that run at a rate
//! within `1 ± ρ` of real time. Wall clocks are never used.
//!
//! - [`MonotonicClock`]: `std::time::Instant` (`CLOCK_MONOTONIC` on Linux). It stops during
//!   system suspend, so a suspended lease holder undercounts elapsed time.
//! - [`BootClock`]: `CLOCK_BOOTTIME` on Linux, which keeps counting through suspend.
//!   Prefer it in production on Linux.
//! - [`SimClock`]: simulated, advanced by hand, with a drift rate, steps and pauses.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

/// A source of monotonic time in nanoseconds since an arbitrary origin.
///
/// Implementations must never go backwards. The production clocks assert it.
///
/// Every reading is an instant of **this machine's** clock, meaningful only against other
/// readings of the same clock: never compare it with an instant read on another node or before a
/// reboot (send durations instead, as the lease rounds, the support session and the session
/// checkpoints do). A clock that is `Clone` must give its clones the same readings: a
/// [`crate::multi::MultiNode`] hands clones to its groups and compares their instants.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin. Never decreases between calls.
    fn now_ns(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// Which production clock a reading came from: readings of different kinds are not comparable.
#[derive(Debug, Clone, Copy)]
enum ClockKind {
    Monotonic = 0,
    Boot = 1,
}

thread_local! {
    /// This thread's last reading of each production clock kind, in nanoseconds.
    static LAST_NS: Cell<[u64; 2]> = const { Cell::new([0; 2]) };
}

/// Asserts that a production clock never goes backwards, as each thread sees it.
///
/// Each thread keeps its own last reading, so reading the clock writes no memory another thread
/// reads: lease reads on many threads do not contend on it. The kernel keeps `CLOCK_MONOTONIC`
/// and `CLOCK_BOOTTIME` monotonic across CPUs; this catches a clock, or a platform, that breaks
/// that promise on some thread.
fn checked(kind: ClockKind, now_ns: u64) -> u64 {
    LAST_NS.with(|last| {
        let mut seen = last.get();
        let prev_ns = seen[kind as usize];
        assert!(
            now_ns >= prev_ns,
            "clock went backwards: {now_ns} ns after {prev_ns} ns"
        );
        seen[kind as usize] = now_ns;
        last.set(seen);
    });
    now_ns
}

/// The origin of every [`MonotonicClock`] in this process, so that their readings compare.
static MONOTONIC_ORIGIN: OnceLock<Instant> = OnceLock::new();

/// `std::time::Instant`-based clock (`CLOCK_MONOTONIC` on Linux). Stops during suspend.
///
/// Every instance counts from the same origin: the first one made in the process.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A monotonic clock.
    pub fn new() -> Self {
        MonotonicClock {
            origin: *MONOTONIC_ORIGIN.get_or_init(Instant::now),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        checked(
            ClockKind::Monotonic,
            self.origin.elapsed().as_nanos() as u64,
        )
    }
}

/// `CLOCK_BOOTTIME` clock: like [`MonotonicClock`] but keeps counting through system suspend.
///
/// On targets other than Linux and Android it falls back to `CLOCK_MONOTONIC`.
#[derive(Debug, Default, Clone, Copy)]
pub struct BootClock {}

impl BootClock {
    /// A boot-time clock. Its origin is the system boot.
    pub fn new() -> Self {
        BootClock::default()
    }

    fn read_ns() -> u64 {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let clock_id = libc::CLOCK_BOOTTIME;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let clock_id = libc::CLOCK_MONOTONIC;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec and `clock_id` is a clock this target supports.
        let rc = unsafe { libc::clock_gettime(clock_id, &mut ts) };
        assert_eq!(
            rc,
            0,
            "clock_gettime failed: {}",
            std::io::Error::last_os_error()
        );
        assert!(
            ts.tv_sec >= 0 && ts.tv_nsec >= 0,
            "negative boot time {ts:?}"
        );
        (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
    }
}

impl Clock for BootClock {
    fn now_ns(&self) -> u64 {
        checked(ClockKind::Boot, Self::read_ns())
    }
}

/// The state behind a [`SimClock`].
#[derive(Debug)]
struct SimClockState {
    /// This clock's reading, in nanoseconds.
    local_ns: u64,
    /// Rate error in parts per million: the clock advances `1 + drift_ppm/1e6` per real nanosecond.
    drift_ppm: i64,
    /// Sub-nanosecond remainder carried between advances, in units of 1e-6 ns.
    carry: i128,
    /// While paused, the clock does not advance (like `CLOCK_MONOTONIC` in suspend).
    paused: bool,
}

/// A simulated clock, advanced by hand. Clones share one clock.
///
/// A simulator advances every node's clock by the same real duration; each clock turns it into
/// local time at its own drift rate. [`SimClock::step`] jumps forward, [`SimClock::pause`] stops it.
#[derive(Debug, Clone)]
pub struct SimClock {
    state: Arc<Mutex<SimClockState>>,
}

impl SimClock {
    /// A clock reading `start_ns`, running at `1 + drift_ppm/1e6` of real time.
    ///
    /// Panics if the rate would not be positive (`drift_ppm <= -1_000_000`).
    pub fn new(start_ns: u64, drift_ppm: i64) -> Self {
        assert!(
            drift_ppm > -1_000_000,
            "clock rate must be positive, got {drift_ppm} ppm"
        );
        SimClock {
            state: Arc::new(Mutex::new(SimClockState {
                local_ns: start_ns,
                drift_ppm,
                carry: 0,
                paused: false,
            })),
        }
    }

    /// Advance by `real_ns` of real time, scaled by this clock's rate. No-op while paused.
    pub fn advance(&self, real_ns: u64) {
        let mut s = self.state.lock();
        if s.paused {
            return;
        }
        let scaled = real_ns as i128 * (1_000_000 + s.drift_ppm as i128) + s.carry;
        let whole_ns = scaled.div_euclid(1_000_000);
        s.carry = scaled.rem_euclid(1_000_000);
        debug_assert!(whole_ns >= 0, "a positive rate never moves the clock back");
        s.local_ns += whole_ns as u64;
    }

    /// Jump forward by `delta_ns` (a clock step). Monotonic clocks never step backwards.
    pub fn step(&self, delta_ns: u64) {
        self.state.lock().local_ns += delta_ns;
    }

    /// Change the drift rate from now on.
    pub fn set_drift_ppm(&self, drift_ppm: i64) {
        assert!(
            drift_ppm > -1_000_000,
            "clock rate must be positive, got {drift_ppm} ppm"
        );
        self.state.lock().drift_ppm = drift_ppm;
    }

    /// Stop the clock until [`SimClock::resume`] (a suspended machine's `CLOCK_MONOTONIC`).
    pub fn pause(&self) {
        self.state.lock().paused = true;
    }

    /// Let a paused clock run again. It does not catch up on the time it missed.
    pub fn resume(&self) {
        self.state.lock().paused = false;
    }
}

impl Clock for SimClock {
    fn now_ns(&self) -> u64 {
        self.state.lock().local_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_clocks_are_monotonic() {
        let m = MonotonicClock::new();
        let b = BootClock::new();
        let (m1, b1) = (m.now_ns(), b.now_ns());
        let (m2, b2) = (m.now_ns(), b.now_ns());
        assert!(m2 >= m1 && b2 >= b1);
        assert!(b1 > 0, "boot time counts from boot");
    }

    #[test]
    #[should_panic(expected = "clock went backwards")]
    fn guard_catches_a_backwards_clock() {
        checked(ClockKind::Boot, 10);
        checked(ClockKind::Monotonic, 5); // another kind: not compared
        checked(ClockKind::Boot, 9);
    }

    #[test]
    fn monotonic_clocks_share_one_origin() {
        let first = MonotonicClock::new();
        let later = MonotonicClock::new();
        let (a, b) = (first.now_ns(), later.now_ns());
        assert!(b >= a, "a later instance reads no earlier: {a} then {b}");
    }

    #[test]
    fn sim_clock_drifts_exactly() {
        let fast = SimClock::new(0, 1_000); // +0.1%
        let slow = SimClock::new(0, -1_000);
        for _ in 0..1_000 {
            fast.advance(1_000_000);
            slow.advance(1_000_000);
        }
        assert_eq!(fast.now_ns(), 1_001_000_000);
        assert_eq!(slow.now_ns(), 999_000_000);
    }

    #[test]
    fn sim_clock_pause_step_and_shared_clones() {
        let c = SimClock::new(5, 0);
        let view = c.clone();
        c.pause();
        c.advance(100);
        assert_eq!(view.now_ns(), 5, "a paused clock does not advance");
        c.resume();
        c.advance(100);
        c.step(1_000);
        assert_eq!(view.now_ns(), 1_105);
    }
}
