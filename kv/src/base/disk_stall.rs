//! Faults of the disk, set over `/admin` with `--fault-injection`: the node's raft log writes
//! stall (a disk that stops answering), set by `/admin/stall-disk`; and the process is killed
//! (`SIGKILL`, as `kill -9`) right after its next cut of a raft log, set by
//! `/admin/crash-after-cut`, the moment a cut that passed what the state made durable loses
//! acknowledged state. The raft thread waits at its next sync of the log
//! until the stall is lifted, as it would in an `fsync` that does not return; everything else
//! (HTTP, the peer listener, lease reads) runs on.
//!
//! What ends a stalled leader's leases is that the thread that makes the log durable is the one
//! that sends the node's heartbeats: stuck in the sync, it renews nothing, so its support (or its
//! groups' raft acknowledgements) runs out within one promise, its leases within one lease, and
//! its groups elect leaders elsewhere.

use parking_lot::{Condvar, Mutex};

/// Whether the log's writes are stalled, and a wait for them to resume.
#[derive(Debug, Default)]
pub struct DiskStall {
    stalled: Mutex<bool>,
    resumed: Condvar,
    /// Kill the process right after the next cut of a raft log.
    crash_after_cut: std::sync::atomic::AtomicBool,
}

impl DiskStall {
    /// Stall (`true`) or resume (`false`) the log's writes.
    pub fn set(&self, stalled: bool) {
        *self.stalled.lock() = stalled;
        if !stalled {
            self.resumed.notify_all();
        }
    }

    /// Kill the process right after the next cut of a raft log.
    pub fn arm_crash_after_cut(&self) {
        self.crash_after_cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// A raft log was just cut: kill the process (`SIGKILL`: nothing after it runs, nothing
    /// buffered in it is written) if that was asked for.
    pub fn cut_done(&self) {
        if self
            .crash_after_cut
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // SAFETY: kill(2) on this process's own pid, with a signal that cannot be caught.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    /// Whether the writes are stalled now.
    pub fn is_stalled(&self) -> bool {
        *self.stalled.lock()
    }

    /// Return once the writes are not stalled (at once if they are not).
    pub fn wait(&self) {
        let mut stalled = self.stalled.lock();
        while *stalled {
            self.resumed.wait(&mut stalled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_stalled_wait_returns_only_once_resumed() {
        let s = Arc::new(DiskStall::default());
        s.wait(); // not stalled: at once
        s.set(true);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                s.wait();
                tx.send(()).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(50))
                .is_err(),
            "ran through a stall"
        );
        s.set(false);
        rx.recv().expect("resumed");
        waiter.join().unwrap();
    }
}
