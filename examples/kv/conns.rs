//! The HTTP connection table: at most `max` connections; when it is full, the oldest idle one
//! (no request in progress) is closed to admit the newcomer, so a flood of idle connections
//! cannot lock other clients out. Busy connections are bounded by the body timeout instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metrics::Metrics;

/// One open connection's handles.
#[derive(Clone)]
struct Entry {
    /// Requests in progress on it.
    busy: Arc<AtomicUsize>,
    /// Told when the connection must close.
    close: Arc<Notify>,
}

/// Open connections, keyed by admission order (oldest first).
pub struct ConnTable {
    max: usize,
    metrics: Arc<Metrics>,
    inner: Mutex<(u64, BTreeMap<u64, Entry>)>,
}

/// A connection's place in the table; dropping it frees the place.
pub struct ConnGuard {
    table: Arc<ConnTable>,
    id: u64,
    busy: Arc<AtomicUsize>,
    /// Notified when the table evicts this connection.
    pub close: Arc<Notify>,
}

/// Marks a request in progress while it lives.
pub struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnTable {
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        assert!(max > 0, "a connection table needs room for one");
        Arc::new(ConnTable {
            max,
            metrics,
            inner: Mutex::new((0, BTreeMap::new())),
        })
    }

    /// Admit a new connection, evicting the oldest idle one if full. `None`: full of busy ones.
    pub fn admit(self: &Arc<Self>) -> Option<ConnGuard> {
        let mut inner = self.inner.lock();
        let (next, open) = &mut *inner;
        if open.len() >= self.max {
            let victim = open
                .iter()
                .find(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
                .map(|(id, _)| *id);
            match victim.and_then(|id| open.remove(&id)) {
                Some(e) => {
                    e.close.notify_one();
                    self.metrics.http_evicted.inc();
                }
                None => {
                    self.metrics.http_refused.inc();
                    return None;
                }
            }
        }
        *next += 1;
        let entry = Entry {
            busy: Arc::new(AtomicUsize::new(0)),
            close: Arc::new(Notify::new()),
        };
        open.insert(*next, entry.clone());
        debug_assert!(open.len() <= self.max);
        self.metrics.http_open.set(open.len() as u64);
        Some(ConnGuard {
            table: self.clone(),
            id: *next,
            busy: entry.busy,
            close: entry.close,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().1.len()
    }
}

impl ConnGuard {
    /// Mark a request in progress until the returned value is dropped.
    pub fn busy(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.busy.clone())
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut inner = self.table.inner.lock();
        inner.1.remove(&self.id);
        self.table.metrics.http_open.set(inner.1.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_evicts_the_oldest_idle_connection_and_refuses_when_all_are_busy() {
        let t = ConnTable::new(2, Arc::new(Metrics::default()));
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let _busy_b = b.busy();
        let c = t.admit().expect("a is idle: evicted");
        assert_eq!(t.len(), 2);
        assert_eq!(t.metrics.http_evicted.get(), 1);
        let _busy_c = c.busy();
        assert!(t.admit().is_none(), "b and c are busy");
        assert_eq!(t.metrics.http_refused.get(), 1);
        drop(a); // evicted already: freeing it changes nothing
        assert_eq!(t.len(), 2);
        drop(c);
        assert_eq!(t.len(), 1);
        assert!(t.admit().is_some());
    }
}
