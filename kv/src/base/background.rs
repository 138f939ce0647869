//! Background work that must not take the CPU from the raft threads: a snapshot streamed to a
//! peer, or one received and written into the state engine. On a machine with few cores,
//! such a thread competing at the same priority slows the writes the raft threads carry.

/// The nice value background threads run at (Linux: 0 is the default, 19 the lowest).
pub const BACKGROUND_NICE: i32 = 10;

/// Lower the calling thread's CPU priority to [`BACKGROUND_NICE`]: it then runs on the cores
/// the node's other threads leave idle. `false` where the system refuses (the thread then runs
/// at the default priority, which is correct, only slower for the others).
pub fn lower_this_thread() -> bool {
    // SAFETY: gettid has no preconditions; setpriority on this thread's own id changes only
    // its scheduling priority.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_runs_at_the_lower_priority_and_others_do_not() {
        let nice_of_this_thread = || {
            // SAFETY: as above, reading this thread's own priority.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        };
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(move || (lower_this_thread(), nice_of_this_thread()))
            .join()
            .unwrap();
        if before < BACKGROUND_NICE {
            assert_eq!(lowered, (true, BACKGROUND_NICE));
        }
        assert_eq!(
            nice_of_this_thread(),
            before,
            "only the background thread is lowered"
        );
    }
}
