//! The node's lease clock: `CLOCK_BOOTTIME`, with a rate that fault injection can change to
//! emulate drift (`POST /admin/clock {"rate": 1.0005}`).

use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;
use raft_lease::{BootClock, Clock};

/// A boot-time clock scaled by an adjustable rate. Monotonic at any positive rate.
pub struct ScaledClock {
    base: BootClock,
    /// (base reading at the last rate change, our reading then, rate).
    anchor: Mutex<(u64, u64, f64)>,
}

impl ScaledClock {
    /// A clock at the rate of real time.
    pub fn new() -> Self {
        let base = BootClock::new();
        let now = base.now_ns();
        ScaledClock {
            base,
            anchor: Mutex::new((now, now, 1.0)),
        }
    }

    /// Run at `rate` × real time from now on. Refuses a rate that is not in (0, 10].
    pub fn set_rate(&self, rate: f64) -> Result<(), String> {
        if !(rate > 0.0 && rate <= 10.0) {
            return Err(format!("rate must be in (0, 10], got {rate}"));
        }
        let mut a = self.anchor.lock();
        let base_now = self.base.now_ns();
        let local_now = a.1 + ((base_now - a.0) as f64 * a.2) as u64;
        *a = (base_now, local_now, rate);
        Ok(())
    }
}

impl Clock for ScaledClock {
    fn now_ns(&self) -> u64 {
        let a = *self.anchor.lock();
        a.1 + ((self.base.now_ns().saturating_sub(a.0)) as f64 * a.2) as u64
    }
}

/// Milliseconds of real time on a monotonic clock since this process first asked: for "how long
/// ago" questions that must not follow the lease clock's injected drift.
pub fn monotonic_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}
