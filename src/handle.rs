//! A read handle: lease reads on application threads, with no round through the raft thread
//! (the idea of TiKV's LocalReader).
//!
//! The raft thread publishes the lease expiry and a stamp (an epoch, and whether the applied
//! index is behind the commit index) in a 16-byte slot, and the indexes themselves beside it. A
//! read captures the commit index when it finds apply behind, waits locally until `applied ≥` it,
//! runs the caller's state read, and then validates: the lease is still held at a clock reading
//! taken *after* the state read, and no revocation or term change happened in between (read
//! first, validate second).

// Under `--cfg raft_lease_loom` the atomics are loom's, so that its model checker explores every
// interleaving and every weak-memory outcome of the publish/revoke/read protocol (`loom_tests`).
#[cfg(raft_lease_loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(raft_lease_loom))]
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::clock::Clock;
use crate::read::ReadError;
use crate::status::{CounterSnapshot, Counters};

/// The low bit of a [`Published::stamp`]: set when the last publication had `applied < commit`.
const BEHIND: u64 = 1;
/// One epoch in a [`Published::stamp`] (the epoch is the stamp's upper 63 bits).
const EPOCH_UNIT: u64 = 2;

/// The epoch of a stamp.
fn epoch(stamp: u64) -> u64 {
    stamp >> 1
}

/// What the raft thread publishes for one group's read handles, in 16 bytes: a node hosting
/// 10,000 groups publishes them all in 160 KB, and a handle to each takes 240 KB more (a
/// [`ReadHandle`] is 24 bytes), so a reader of random groups finds both in a 1 MB L2 cache.
/// Readers only load it, and the raft thread stores a field only when its value changes, so a
/// lease read misses the cache only when something it depends on moved.
///
/// A read needs from the indexes only whether `applied ≥ commit` (the common case, and then
/// nothing else); when the stamp says apply is behind, it loads the indexes from [`Shared`].
#[repr(C, align(16))]
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// The usable lease ends at this local instant (exclusive); 0 when no lease is held.
    lease_until_ns: AtomicU64,
    /// The epoch times [`EPOCH_UNIT`], plus [`BEHIND`] when the last publication had
    /// `applied < commit`. The epoch is bumped after every revocation and at every new term (a
    /// read that spans a bump fails); it has 63 bits, so it never wraps. Published, with the
    /// indexes it summarizes, before the lease that relies on them.
    stamp: AtomicU64,
}

/// Slots per chunk of a lease table (a power of two: an index masked by `CHUNK_SLOTS - 1` needs
/// no bounds check).
#[cfg(not(raft_lease_loom))]
const CHUNK_SLOTS: usize = 128;
/// Under loom every atomic is a tracked object: a chunk of two keeps the models small.
#[cfg(raft_lease_loom)]
const CHUNK_SLOTS: usize = 2;

/// A block of slots, and the clock of the node whose groups publish in them. Aligned to 128
/// bytes, so the `Arc` counts (written when a handle is cloned or dropped) sit on lines of their
/// own before the clock and the slots.
#[repr(align(128))]
#[derive(Debug)]
pub(crate) struct Chunk<C> {
    /// The clock every group publishing here reads: a handle reaches it through the chunk it
    /// holds anyway, so it keeps no pointer of its own (and is 24 bytes, not 32).
    clock: Arc<C>,
    slots: [Published; CHUNK_SLOTS],
}

impl<C> Chunk<C> {
    fn new(clock: Arc<C>) -> Arc<Chunk<C>> {
        Arc::new(Chunk {
            clock,
            slots: std::array::from_fn(|_| Published::default()),
        })
    }

    /// Slot `index` (taken modulo [`CHUNK_SLOTS`], so the compiler needs no bounds check; every
    /// caller's index is below it).
    fn slot(&self, index: u32) -> &Published {
        debug_assert!((index as usize) < CHUNK_SLOTS, "slot {index} out of range");
        &self.slots[index as usize % CHUNK_SLOTS]
    }
}

/// Where one group publishes: a slot in a chunk that the group and each of its handles keep
/// alive, so a handle never dangles and a read reaches the slot in one pointer hop.
#[derive(Debug)]
pub(crate) struct Slot<C> {
    chunk: Arc<Chunk<C>>,
    /// Invariant: `index < CHUNK_SLOTS`, and no other group publishes in this slot.
    index: u32,
}

impl<C> Slot<C> {
    /// A slot with a chunk of its own (a single group: nothing else is published beside it),
    /// for a group that reads `clock`.
    pub fn alone(clock: Arc<C>) -> Slot<C> {
        Slot {
            chunk: Chunk::new(clock),
            index: 0,
        }
    }

    /// The clock of the group publishing here.
    pub fn clock(&self) -> &Arc<C> {
        &self.chunk.clock
    }

    fn get(&self) -> &Published {
        self.chunk.slot(self.index)
    }
}

impl<C> Clone for Slot<C> {
    fn clone(&self) -> Self {
        Slot {
            chunk: self.chunk.clone(),
            index: self.index,
        }
    }
}

/// Hands out slots densely, for a node that hosts many groups. Slots are never reused: a
/// removed group's handles may still read its slot (and find no lease there).
#[derive(Debug)]
pub(crate) struct LeaseTable<C> {
    /// The clock of the node (every group of the table reads it).
    clock: Arc<C>,
    /// The chunk being filled, and its next free slot.
    filling: Option<(Arc<Chunk<C>>, u32)>,
}

impl<C> LeaseTable<C> {
    /// A table for the groups of a node whose clock is `clock`.
    pub fn new(clock: Arc<C>) -> LeaseTable<C> {
        LeaseTable {
            clock,
            filling: None,
        }
    }

    /// A slot no other group of this table publishes in.
    pub fn slot(&mut self) -> Slot<C> {
        let (chunk, next) = match self.filling.take() {
            Some((chunk, next)) if (next as usize) < CHUNK_SLOTS => (chunk, next),
            _ => (Chunk::new(self.clock.clone()), 0),
        };
        self.filling = Some((chunk.clone(), next + 1));
        Slot { chunk, index: next }
    }
}

/// State the raft thread shares with read handles.
#[derive(Debug)]
pub(crate) struct Shared<C> {
    /// The lease and the stamp, for readers (and the clock they read).
    published: Slot<C>,
    /// The commit index, stored before the stamp that summarizes it. Read only by a read that
    /// found apply behind.
    commit: AtomicU64,
    /// The applied index (the caller's state reflects at least this much), stored before the
    /// stamp that summarizes it.
    applied: AtomicU64,
    /// The raft thread's counters, plus the counts handles have flushed.
    pub counters: Counters,
}

/// Store `value` unless the atomic already holds it (a store would invalidate readers' caches).
fn store_if_changed(atomic: &AtomicU64, value: u64) {
    if atomic.load(Ordering::Relaxed) != value {
        atomic.store(value, Ordering::Release);
    }
}

impl<C> Shared<C> {
    /// Shared state publishing in `published`.
    pub fn new(published: Slot<C>) -> Shared<C> {
        Shared {
            published,
            commit: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    /// Publish the indexes first, then the stamp that summarizes them, then the lease that
    /// relies on them. Called only by the thread that owns the group (so the stamp's epoch,
    /// which only this thread changes, is read and written back unchanged).
    pub fn publish(&self, commit: u64, applied: u64, lease_until_ns: u64) {
        let p = self.published.get();
        store_if_changed(&self.commit, commit);
        store_if_changed(&self.applied, applied);
        let stamp = p.stamp.load(Ordering::Relaxed) & !BEHIND;
        store_if_changed(&p.stamp, stamp | u64::from(applied < commit));
        store_if_changed(&p.lease_until_ns, lease_until_ns);
    }

    /// Revoke the lease: clear it, then bump the epoch.
    pub fn revoke(&self) {
        let p = self.published.get();
        p.lease_until_ns.store(0, Ordering::Release);
        p.stamp.fetch_add(EPOCH_UNIT, Ordering::AcqRel);
    }

    /// Every counter, with the counts handles have flushed so far.
    pub fn counter_snapshot(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
}

/// A handle flushes its counts into the node's counters after this many reads (and when it is
/// dropped, or on [`ReadHandle::flush_counts`]).
pub const HANDLE_FLUSH_EVERY: u32 = 256;

/// One refusal in a handle's unflushed counts: lease reads count in the low 16 bits, refusals
/// in the high 16. The reader whose count brings the sum to [`HANDLE_FLUSH_EVERY`] flushes, so
/// neither half comes near 2^16.
const REFUSAL_UNIT: u32 = 1 << 16;
const _: () = assert!(HANDLE_FLUSH_EVERY < REFUSAL_UNIT / 2);

/// A cloneable, `Send + Sync` handle for lease reads from any thread.
///
/// It serves only lease reads. When it returns [`ReadError::LeaseNotHeld`], send the read through
/// the raft thread ([`crate::LeaseNode::read`]), which can fall back to ReadIndex.
///
/// A read writes no memory that another thread reads: give each reader thread its own clone
/// (each clone counts its own reads, inline), and reads on many threads do not contend.
///
/// # Counters
/// A handle counts its lease reads and refusals in itself, and adds them to the node's
/// [`crate::CounterSnapshot`] every [`HANDLE_FLUSH_EVERY`] reads, when it is dropped, and on
/// [`ReadHandle::flush_counts`]. So the node's `lease_reads` and `lease_refusals` lag each live
/// handle by fewer than [`HANDLE_FLUSH_EVERY`] reads: a read writes only the handle's own memory,
/// never a line of its own elsewhere (at 10,000 groups that line was one more cache miss a read).
/// Counts are exact when each thread reads through its own clone. Threads reading through one
/// shared handle at the same instant may lose or repeat a few counts (only counts: never a
/// read's validity).
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
    /// The chunk holding the group's published lease and stamp (the one line a read needs
    /// besides the clock's), and the clock.
    chunk: Arc<Chunk<C>>,
    /// The group's slot in `chunk`. Invariant: below [`CHUNK_SLOTS`].
    index: u32,
    /// Counts since the last flush (see [`REFUSAL_UNIT`]). Beside `index`, so that the handle
    /// is 24 bytes.
    unflushed: AtomicU32,
    /// Where counts are flushed to, and the indexes a read loads when apply is behind (not
    /// touched by a read otherwise).
    shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for ReadHandle<C> {
    fn clone(&self) -> Self {
        ReadHandle::new(self.shared.clone())
    }
}

impl<C: Clock> Drop for ReadHandle<C> {
    fn drop(&mut self) {
        self.flush_counts();
    }
}

/// Why a handle read did not run or was not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    NotHeld,
    ApplyBehind,
}

impl<C: Clock> ReadHandle<C> {
    pub(crate) fn new(shared: Arc<Shared<C>>) -> Self {
        ReadHandle {
            chunk: shared.published.chunk.clone(),
            index: shared.published.index,
            unflushed: AtomicU32::new(0),
            shared,
        }
    }

    fn now_ns(&self) -> u64 {
        self.chunk.clock.now_ns()
    }

    /// Add this handle's counts so far to the node's counters now, rather than at the next
    /// [`HANDLE_FLUSH_EVERY`] reads or at drop.
    pub fn flush_counts(&self) {
        let counts = self.unflushed.swap(0, Ordering::Relaxed);
        if counts != 0 {
            let c = &self.shared.counters;
            let reads = counts & (REFUSAL_UNIT - 1);
            c.lease_reads.fetch_add(u64::from(reads), Ordering::Relaxed);
            c.lease_refusals
                .fetch_add(u64::from(counts / REFUSAL_UNIT), Ordering::Relaxed);
        }
    }

    /// Count one read (`unit` 1) or refusal ([`REFUSAL_UNIT`]); flush every
    /// [`HANDLE_FLUSH_EVERY`].
    ///
    /// A plain load and store, not a locked add: measured in `multi_bench` at one group, a
    /// locked add on the handle's own line took the lease-read p50 from 50 to 60 ns. The cost:
    /// threads that read through one shared handle at the same instant may lose or repeat a
    /// few counts (see the type's docs); a clone per thread counts exactly.
    fn count(&self, unit: u32) {
        let now = self.unflushed.load(Ordering::Relaxed) + unit;
        self.unflushed.store(now, Ordering::Relaxed);
        let total = (now & (REFUSAL_UNIT - 1)) + now / REFUSAL_UNIT;
        if total >= HANDLE_FLUSH_EVERY {
            self.flush_counts();
        }
    }

    fn published(&self) -> &Published {
        self.chunk.slot(self.index)
    }

    /// Serve a lease read: `read_state` runs against local state, then the lease is validated.
    ///
    /// When apply is behind, captures the commit index once, and waits (spinning, then yielding)
    /// until the applied index reaches it, for as long as the lease is held.
    pub fn read<T>(&self, mut read_state: impl FnMut() -> T) -> Result<T, ReadError> {
        let mut spins = 0u32;
        let mut wait_for = None;
        loop {
            match self.attempt(&mut wait_for, &mut read_state) {
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
        self.attempt(&mut None, read_state)
            .map_err(|_| ReadError::LeaseNotHeld)
    }

    /// One clock reading on the common path: the one after the state read, which is the one the
    /// lease argument needs. The clock is read before the state only when the read would wait
    /// for apply (so that it never waits on an expired lease).
    ///
    /// `wait_for` is the commit index this read waits to see applied: captured by the first
    /// attempt that finds apply behind, and kept by the attempts after it.
    fn attempt<T>(
        &self,
        wait_for: &mut Option<u64>,
        read_state: impl FnOnce() -> T,
    ) -> Result<T, Attempt> {
        let p = self.published();
        // The epoch before the lease: a revocation after this load shows in the validation.
        let epoch_before = epoch(p.stamp.load(Ordering::Acquire));
        let until_ns = p.lease_until_ns.load(Ordering::Acquire);
        if until_ns == 0 {
            self.count(REFUSAL_UNIT);
            return Err(Attempt::NotHeld); // revoked, or never held
        }
        // The stamp after the lease: it summarizes indexes at least as new as the lease's.
        let behind = p.stamp.load(Ordering::Acquire) & BEHIND != 0;
        // A read that already captured a commit index keeps waiting for it, even if a stamp it
        // sees now is older than the commit it captured (stores may land out of order for it).
        if (behind || wait_for.is_some()) && !self.applied_reached(wait_for) {
            if self.now_ns() >= until_ns {
                self.count(REFUSAL_UNIT);
                return Err(Attempt::NotHeld);
            }
            return Err(Attempt::ApplyBehind);
        }
        let value = read_state();
        // Validate after the read: a pause before this point shows up as an expired lease.
        // Against the lease the read began under, not only the one published now: a follower's
        // read lease may lapse and be renewed in one epoch, and writes may be exposed without it
        // in between, so a read that began under the lapsed one is not covered by the renewal.
        let now_ns = self.now_ns();
        let still_until_ns = p.lease_until_ns.load(Ordering::Acquire);
        let covered_until_ns = until_ns.min(still_until_ns);
        if epoch(p.stamp.load(Ordering::Acquire)) != epoch_before || now_ns >= covered_until_ns {
            self.count(REFUSAL_UNIT);
            return Err(Attempt::NotHeld);
        }
        self.count(1);
        Ok(value)
    }

    /// Whether the applied index has reached the commit index this read waits for (captured
    /// now if this is the first time the read found apply behind). Out of line: the common
    /// read never calls it.
    #[cold]
    #[inline(never)]
    fn applied_reached(&self, wait_for: &mut Option<u64>) -> bool {
        let commit = *wait_for.get_or_insert_with(|| self.shared.commit.load(Ordering::Acquire));
        self.shared.applied.load(Ordering::Acquire) >= commit
    }

    /// Whether a lease is held right now (a hint: the read itself validates again).
    pub fn lease_held(&self) -> bool {
        self.now_ns() < self.published().lease_until_ns.load(Ordering::Acquire)
    }
}

// The sizes the layout is for: a slot is 16 bytes (four to a cache line), a handle 24.
#[cfg(not(raft_lease_loom))]
const _: () = assert!(std::mem::size_of::<Published>() == 16);
#[cfg(not(raft_lease_loom))]
const _: () = assert!(std::mem::size_of::<ReadHandle<crate::clock::MonotonicClock>>() == 24);

#[cfg(all(test, not(raft_lease_loom)))]
mod tests;

#[cfg(all(test, raft_lease_loom))]
mod loom_tests;
