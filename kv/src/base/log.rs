//! The node's logger: terminal lines on stderr, written by a background thread.
//!
//! The level filter runs *before* the asynchronous drain, on the thread that logs. raft-rs logs
//! every message it sends at debug level with the message as a key-value; `slog_async` serializes
//! every record's key-values on the logging thread before handing it over, so a filter behind it
//! would still format whole snapshots on the raft thread (seconds per snapshot in a debug build)
//! only to drop them.
//!
//! The returned guard flushes and joins the logging thread when dropped: drop it last, before the
//! process exits, and nothing logged is lost (no sleep stands in for a flush).

use slog::{o, Drain, Level, Logger};
use slog_async::AsyncGuard;

/// Records queued for the logging thread before new ones are dropped (and counted).
const QUEUE_LEN: usize = 4096;

/// The logger for a node process, with its flush guard.
pub fn stderr_logger() -> (Logger, AsyncGuard) {
    let decorator = slog_term::TermDecorator::new().stderr().build();
    let drain = slog_term::FullFormat::new(decorator).build().fuse();
    filtered_async(drain, Level::Info)
}

/// `drain` behind a level filter that runs on the caller's thread, then a logging thread.
fn filtered_async<D>(drain: D, level: Level) -> (Logger, AsyncGuard)
where
    D: Drain<Ok = (), Err = slog::Never> + Send + 'static,
{
    let (drain, guard) = slog_async::Async::new(drain)
        .chan_size(QUEUE_LEN)
        .build_with_guard();
    let drain = slog::LevelFilter::new(drain.fuse(), level).fuse();
    (Logger::root(drain, o!()), guard)
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    // Records at info, a filter at warning: slog compiles debug records out of release builds
    // (its default `release_max_level_info`), which would make the control pass for nothing.
    use slog::{info, warn};

    use super::*;

    /// A value that counts how often it is formatted.
    struct Costly(Arc<AtomicUsize>);

    impl fmt::Debug for Costly {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fetch_add(1, Ordering::SeqCst);
            f.write_str("costly")
        }
    }

    #[test]
    fn records_below_the_level_are_never_formatted() {
        let formatted = Arc::new(AtomicUsize::new(0));
        let (log, guard) = filtered_async(slog::Discard, Level::Warning);
        for _ in 0..100 {
            info!(log, "sending"; "msg" => ?Costly(formatted.clone()));
        }
        assert_eq!(
            formatted.load(Ordering::SeqCst),
            0,
            "records below the level were formatted"
        );
        warn!(log, "kept"; "msg" => ?Costly(formatted.clone()));
        drop(log);
        drop(guard); // flushes: the warning record has been handled
        assert_eq!(
            formatted.load(Ordering::SeqCst),
            1,
            "the warning record was not logged"
        );
    }

    /// The negative control: the same filter behind the asynchronous drain (the order an
    /// earlier design had) formats every debug record on the logging thread before dropping it.
    #[test]
    fn control_a_filter_behind_the_async_drain_formats_every_record() {
        let formatted = Arc::new(AtomicUsize::new(0));
        let (drain, guard) = slog_async::Async::new(
            slog::LevelFilter::new(slog::Discard, Level::Warning).ignore_res(),
        )
        .build_with_guard();
        let log = Logger::root(drain.fuse(), o!());
        for _ in 0..100 {
            info!(log, "sending"; "msg" => ?Costly(formatted.clone()));
        }
        drop(log);
        drop(guard);
        assert_eq!(
            formatted.load(Ordering::SeqCst),
            100,
            "the control formatted nothing"
        );
    }
}
