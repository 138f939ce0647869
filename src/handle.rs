//! A read handle: lease reads on application threads, with no round through the raft thread
//! (the idea of TiKV's LocalReader).
//!
//! The raft thread publishes the lease expiry, the commit index and the applied index in atomics.
//! A read captures the commit index, waits locally until `applied ≥` it, runs the caller's state
//! read, and then validates: the lease is still held at a clock reading taken *after* the state read,
//! and no revocation or term change happened in between (read first, validate second).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::read::ReadError;
use crate::status::{CounterSnapshot, Counters};

/// What the raft thread publishes for read handles, on cache lines of its own: readers only load
/// it, and the raft thread stores a field only when its value changes, so a lease read misses the
/// cache only when something it depends on moved.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// The usable lease ends at this local instant (exclusive); 0 when no lease is held.
    pub lease_until_ns: AtomicU64,
    /// Bumped after every revocation and at every new term: a read that spans a bump fails.
    pub epoch: AtomicU64,
    /// The leader's commit index, published before the lease that relies on it.
    pub commit: AtomicU64,
    /// The applied index: the caller's state reflects at least this much.
    pub applied: AtomicU64,
}

/// The counters one read handle bumps, on a cache line of its own: readers on different threads
/// never write the same line.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct HandleCounters {
    lease_reads: AtomicU64,
    lease_refusals: AtomicU64,
}

/// State the raft thread shares with read handles.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The lease and the indexes, for readers.
    pub published: Published,
    /// The raft thread's counters, plus those of handles already dropped.
    pub counters: Counters,
    /// The counters of every live handle, summed into a snapshot.
    handles: Mutex<Vec<Arc<HandleCounters>>>,
}

/// Store `value` unless the atomic already holds it (a store would invalidate readers' caches).
fn store_if_changed(atomic: &AtomicU64, value: u64) {
    if atomic.load(Ordering::Relaxed) != value {
        atomic.store(value, Ordering::Release);
    }
}

impl Shared {
    /// Publish the indexes first, then the lease that relies on them.
    pub fn publish(&self, commit: u64, applied: u64, lease_until_ns: u64) {
        let p = &self.published;
        store_if_changed(&p.commit, commit);
        store_if_changed(&p.applied, applied);
        store_if_changed(&p.lease_until_ns, lease_until_ns);
    }

    /// Revoke the lease: clear it, then bump the epoch.
    pub fn revoke(&self) {
        self.published.lease_until_ns.store(0, Ordering::Release);
        self.published.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn register_handle(&self) -> Arc<HandleCounters> {
        let counters = Arc::new(HandleCounters::default());
        self.handles.lock().push(counters.clone());
        counters
    }

    /// A dropped handle's counts move into the node's counters.
    fn retire_handle(&self, counters: &Arc<HandleCounters>) {
        self.handles.lock().retain(|c| !Arc::ptr_eq(c, counters));
        let moved = |from: &AtomicU64, to: &AtomicU64| {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        };
        moved(&counters.lease_reads, &self.counters.lease_reads);
        moved(&counters.lease_refusals, &self.counters.lease_refusals);
    }

    /// Every counter, the live handles' included.
    pub fn counter_snapshot(&self) -> CounterSnapshot {
        let mut total = self.counters.snapshot();
        for c in self.handles.lock().iter() {
            total.lease_reads += c.lease_reads.load(Ordering::Relaxed);
            total.lease_refusals += c.lease_refusals.load(Ordering::Relaxed);
        }
        total
    }
}

/// A cloneable, `Send + Sync` handle for lease reads from any thread.
///
/// It serves only lease reads. When it returns [`ReadError::LeaseNotHeld`], send the read through
/// the raft thread ([`crate::LeaseNode::read`]), which can fall back to ReadIndex.
///
/// A read writes no memory that another thread reads: give each reader thread its own clone
/// (each clone has its own counters), and reads on many threads do not contend.
///
/// # Example
/// A reader thread serves itself while the lease is held. Once the lease has lapsed (here the
/// clock jumps past it while the raft thread does not tick), the handle refuses, and the reader
/// hands the read to the raft thread, which serves it with a ReadIndex round
/// ([`ReadMode::Auto`](crate::ReadMode::Auto)), or fails it with
/// [`ReadError::NotLeader`] and the leader's id when this node no longer leads.
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::RwLock;
///
/// use crossbeam_channel::{bounded, unbounded, Sender};
/// use raft_lease::{ReadError, ReadHandle, ReadKind, ReadMode, SimClock};
/// # use std::sync::Arc;
/// # use raft::eraftpb::{Entry, EntryType, Message};
/// # use raft::storage::MemStorage;
/// # use raft_lease::{LeaseConfig, LeaseNode, MemApp};
/// # struct App { kv: Arc<RwLock<HashMap<String, String>>> }
/// # impl MemApp<SimClock> for App {
/// #     fn send(&mut self, _: Vec<Message>) {}
/// #     fn apply(&mut self, _: &mut LeaseNode<MemStorage, SimClock>, entries: Vec<Entry>) {
/// #         let puts = entries.iter().filter(|e| e.get_entry_type() == EntryType::EntryNormal);
/// #         for put in puts.filter_map(|e| std::str::from_utf8(&e.data).ok()?.split_once('=')) {
/// #             self.kv.write().unwrap().insert(put.0.to_string(), put.1.to_string());
/// #         }
/// #     }
/// # }
///
/// type Kv = RwLock<HashMap<String, String>>;
/// /// A read the raft thread serves for a reader thread: the key, and where to answer.
/// type Handoff = (String, Sender<Result<Option<String>, ReadError>>);
///
/// /// On a reader thread: a lease read through the handle, else through the raft thread.
/// fn get(
///     handle: &ReadHandle<SimClock>,
///     kv: &Kv,
///     raft_thread: &Sender<Handoff>,
///     key: &str,
/// ) -> Result<(Option<String>, &'static str), ReadError> {
///     // The state read runs first; the lease is validated after it.
///     match handle.read(|| kv.read().unwrap().get(key).cloned()) {
///         Ok(value) => Ok((value, "lease, on the reader thread")),
///         Err(ReadError::LeaseNotHeld) => {
///             let (reply, answer) = bounded(1);
///             raft_thread.send((key.to_string(), reply)).expect("raft thread is up");
///             Ok((answer.recv().expect("an answer")?, "through the raft thread"))
///         }
///         Err(other) => Err(other),
///     }
/// }
///
/// # let clock = SimClock::new(0, 0);
/// # let rc = raft::Config { id: 1, election_tick: 10, heartbeat_tick: 2, ..Default::default() };
/// # let lc = LeaseConfig { promise_ms: 100, drift_ppm: 500, margin_ms: 2, ..Default::default() };
/// # let storage = MemStorage::new_with_conf_state((vec![1], vec![]));
/// # let logger = slog::Logger::root(slog::Discard, slog::o!());
/// # let mut node = LeaseNode::new(&rc, storage, lc, 10, clock.clone(), &logger)?;
/// # let kv: Arc<Kv> = Arc::default();
/// # let mut app = App { kv: kv.clone() };
/// # clock.advance(100_000_000);
/// # node.campaign()?;
/// # node.handle_ready(&mut app)?;
/// # node.propose(vec![], b"greeting=hello".to_vec())?;
/// # node.handle_ready(&mut app)?;
/// # node.tick();
/// // `node` leads a one-node cluster with a lease, and has applied "greeting=hello" to `kv`.
/// let handle = node.read_handle();
/// let (to_raft_thread, handoffs) = unbounded::<Handoff>();
/// std::thread::scope(|s| {
///     let read = || get(&handle, &kv, &to_raft_thread, "greeting");
///     let lease_read = s.spawn(read).join().unwrap();
///     assert_eq!(lease_read, Ok((Some("hello".into()), "lease, on the reader thread")));
///
///     clock.advance(200_000_000); // past the lease, with no tick to renew it
///     let reader = s.spawn(read);
///
///     // The raft thread's side: start each handed-off read, process, serve, answer.
///     let mut waiting = HashMap::new();
///     let (key, reply) = handoffs.recv().unwrap();
///     match node.read(ReadMode::Auto) {
///         Ok(id) => drop(waiting.insert(id, (key, reply))),
///         Err(e) => reply.send(Err(e)).unwrap(), // not the leader: says who is
///     }
///     node.handle_ready(&mut app).unwrap();
///     let served = node.serve_reads(|id| kv.read().unwrap().get(&waiting[&id].0).cloned());
///     for read in served {
///         assert_eq!(read.result, Ok((Some("hello".into()), ReadKind::Index)));
///         let (_key, reply) = waiting.remove(&read.id).unwrap();
///         reply.send(read.result.map(|(value, _kind)| value)).unwrap();
///     }
///     let fallback = reader.join().unwrap();
///     assert_eq!(fallback, Ok((Some("hello".into()), "through the raft thread")));
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ReadHandle<C: Clock> {
    shared: Arc<Shared>,
    clock: Arc<C>,
    /// This handle's own counters.
    counters: Arc<HandleCounters>,
}

impl<C: Clock> Clone for ReadHandle<C> {
    fn clone(&self) -> Self {
        ReadHandle::new(self.shared.clone(), self.clock.clone())
    }
}

impl<C: Clock> Drop for ReadHandle<C> {
    fn drop(&mut self) {
        self.shared.retire_handle(&self.counters);
    }
}

/// Why a handle read did not run or was not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    NotHeld,
    ApplyBehind,
}

impl<C: Clock> ReadHandle<C> {
    pub(crate) fn new(shared: Arc<Shared>, clock: Arc<C>) -> Self {
        let counters = shared.register_handle();
        ReadHandle {
            shared,
            clock,
            counters,
        }
    }

    /// Serve a lease read: `read_state` runs against local state, then the lease is validated.
    ///
    /// Waits (spinning, then yielding) while the applied index is behind the commit index captured
    /// at the start, for as long as the lease is held.
    pub fn read<T>(&self, mut read_state: impl FnMut() -> T) -> Result<T, ReadError> {
        let mut spins = 0u32;
        loop {
            match self.attempt(&mut read_state) {
                Ok(v) => return Ok(v),
                Err(Attempt::NotHeld) => return Err(ReadError::LeaseNotHeld),
                Err(Attempt::ApplyBehind) => {
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Like [`ReadHandle::read`], but fails with [`ReadError::LeaseNotHeld`] instead of waiting
    /// when the applied index is behind (for single-threaded drivers such as the simulator).
    pub fn try_read<T>(&self, read_state: impl FnOnce() -> T) -> Result<T, ReadError> {
        self.attempt(read_state)
            .map_err(|_| ReadError::LeaseNotHeld)
    }

    /// One clock reading on the common path: the one after the state read, which is the one the
    /// lease argument needs. The clock is read before the state only when the read would wait
    /// for apply (so that it never waits on an expired lease).
    fn attempt<T>(&self, read_state: impl FnOnce() -> T) -> Result<T, Attempt> {
        let p = &self.shared.published;
        let epoch = p.epoch.load(Ordering::Acquire);
        let until_ns = p.lease_until_ns.load(Ordering::Acquire);
        if until_ns == 0 {
            Counters::bump(&self.counters.lease_refusals);
            return Err(Attempt::NotHeld); // revoked, or never held
        }
        let commit = p.commit.load(Ordering::Acquire);
        if p.applied.load(Ordering::Acquire) < commit {
            if self.clock.now_ns() >= until_ns {
                Counters::bump(&self.counters.lease_refusals);
                return Err(Attempt::NotHeld);
            }
            return Err(Attempt::ApplyBehind);
        }
        let value = read_state();
        // Validate after the read: a pause before this point shows up as an expired lease.
        let now_ns = self.clock.now_ns();
        let still_until_ns = p.lease_until_ns.load(Ordering::Acquire);
        if p.epoch.load(Ordering::Acquire) != epoch || now_ns >= still_until_ns {
            Counters::bump(&self.counters.lease_refusals);
            return Err(Attempt::NotHeld);
        }
        Counters::bump(&self.counters.lease_reads);
        Ok(value)
    }

    /// Whether a lease is held right now (a hint: the read itself validates again).
    pub fn lease_held(&self) -> bool {
        self.clock.now_ns() < self.shared.published.lease_until_ns.load(Ordering::Acquire)
    }
}
