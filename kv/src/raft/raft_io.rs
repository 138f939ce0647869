//! One group's I/O for the node's `Ready`s: its durable log, its state machine, the address book,
//! and the requests waiting for their entries to apply. (Messages go out in the node's batches.)
//!
//! Snapshot data is an envelope (see `snapshot`): the address book, then the state machine's own
//! snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use protobuf::Message as _;
use raft::eraftpb::{ConfChangeV2, ConfState, Entry, EntryType, HardState, Snapshot};
use raft_lease::drive::apply_conf_change_entry;
use slog::{info, Logger};
use tokio::sync::oneshot;

use crate::base::budget::Ticket;
use crate::disk::storage::{DiskError, DiskStorage};
use crate::peer::follow::{admits, version_of, Followed};
use crate::peer::snapshot_send::SnapshotViews;
use crate::peer::snapshot_wire::{descriptor, descriptor_id};
use crate::raft::conf_meta::ConfMeta;
use crate::raft::machine::{Node, StateMachine};
use crate::raft::requests::{MembersReply, WriteReply};
use crate::raft::shared::Shared;
use crate::raft::snapshot::{envelope, split};
use crate::raft::status::Status;

/// Applied bytes after which a snapshot is taken whatever the entry count (or after as many as
/// the last snapshot held, if more): the log on disk stays near the state's size, or this, even
/// when entries are large.
pub const SNAPSHOT_AFTER_BYTES: u64 = 64 << 20;

/// Entries kept behind a snapshot at most (ten times this after a node was added).
pub const KEEP_ENTRIES: u64 = 1_000;

/// Bytes of entries kept behind a snapshot for no follower in particular, reckoned at the mean
/// size of the entries applied since the last one (an estimate: the log stays bounded by
/// [`KEEP_ENTRIES`] entries in any case).
pub const KEEP_BYTES: u64 = 16 << 20;

/// A request waiting for its entry to apply.
pub enum Waiter<O> {
    /// A write, and its bytes in the in-flight budget (released once leadership is lost).
    Write(oneshot::Sender<WriteReply<O>>, Option<Ticket>),
    /// A membership change.
    Members(oneshot::Sender<MembersReply>),
}

/// One group's I/O and waiters.
pub struct LoopIo<M: StateMachine> {
    storage: DiskStorage,
    shared: Arc<Shared<M>>,
    /// Requests waiting on the entry at an index: (the term it was proposed in, the waiter, when
    /// it was proposed).
    waiting: BTreeMap<u64, (u64, Waiter<M::Outcome>, Instant)>,
    /// The index of the latest snapshot taken or installed.
    snapshot_index: u64,
    /// Bytes of entries applied since that snapshot: a log of big entries is cut sooner.
    applied_bytes: u64,
    /// Take a snapshot at the next chance (a node was added: it should catch up from a recent one).
    snapshot_due: bool,
    /// The version of group 0's configuration this group last followed (group 0: unused), as of
    /// the applied index; kept in snapshots (see `peer::follow`).
    follows: u64,
    /// A membership change applied since the status was last published.
    conf_changed: bool,
    /// A configuration written since the node's last sync (see [`LoopIo::take_unsynced`]).
    unsynced: bool,
    /// The index of the membership entry that left the stored configuration: entries at or
    /// below it are applied again only after a restart, and skipped (see `conf_meta`).
    conf_index: u64,
    /// A store written before the configuration's bookkeeping was kept: no snapshot is taken
    /// until the entries it held at start are applied (its stored configuration may be newer
    /// than the entries replayed, and a snapshot would carry it at an older index).
    replay_until: u64,
    was_leader: (bool, u64),
    /// Negative control (tests only): the log is cut up to the applied index, past what the
    /// state machine has made durable.
    pub unsafe_cut_past_durable: bool,
    progress: BTreeMap<u64, crate::raft::status::PeerProgress>,
    metrics: Arc<crate::base::metrics::Metrics>,
    logger: Logger,
}

impl<M: StateMachine> LoopIo<M> {
    /// The I/O of a group whose state machine is in `shared`, restored from a snapshot that
    /// followed version `follows` (the configuration's bookkeeping stored since, if newer, wins:
    /// see `conf_meta`).
    pub fn new(
        storage: DiskStorage,
        mut follows: u64,
        shared: Arc<Shared<M>>,
        views: Arc<SnapshotViews>,
        metrics: Arc<crate::base::metrics::Metrics>,
        logger: Logger,
    ) -> Result<Self, DiskError> {
        let snapshot_index = raft::Storage::first_index(&storage)?.saturating_sub(1);
        let (mut conf_index, mut replay_until) = (0, 0);
        match ConfMeta::decode(&storage.conf_meta())? {
            None => replay_until = raft::Storage::last_index(&storage)?,
            Some(kept) if kept.index > snapshot_index => {
                (conf_index, follows) = (kept.index, kept.follows);
                if let (Some(book), 0) = (kept.book, shared.group) {
                    *shared.members.write() = book;
                }
            }
            Some(_) => {} // the snapshot is newer: it holds all of it
        }
        shared
            .follows
            .store(follows, std::sync::atomic::Ordering::Relaxed);
        let source = (shared.clone(), storage.clone(), views);
        storage.set_snapshot_source(Arc::new(move |at| {
            snapshot_for_follower(&source.0, &source.1, &source.2, at)
        }));
        Ok(LoopIo {
            storage,
            shared,
            waiting: BTreeMap::new(),
            snapshot_index,
            applied_bytes: 0,
            snapshot_due: false,
            follows,
            conf_changed: false,
            unsynced: false,
            conf_index,
            replay_until,
            was_leader: (false, 0),
            unsafe_cut_past_durable: false,
            progress: BTreeMap::new(),
            metrics,
            logger,
        })
    }

    /// Answer `w` when the entry at `index` (proposed in `term`) applies.
    ///
    /// A request already waiting there was proposed by this node in an earlier term, which it
    /// lost; its entry was then overwritten (a leader never overwrites its own log), so it will
    /// never commit: it is answered "not applied" now (found by `kv nemesis`, seed 3).
    pub fn wait(&mut self, index: u64, term: u64, w: Waiter<M::Outcome>) {
        let entry = (term, w, Instant::now());
        if let Some((old_term, old, _)) = self.waiting.insert(index, entry) {
            assert!(
                old_term < term,
                "two requests wait on index {index} in term {term}"
            );
            not_applied(old, "another leader's entry took its place: not applied");
        }
    }

    /// Leadership changed: a write's bytes are on disk or gone, so its budget is released; the
    /// waiter stays, to be answered exactly when its index applies.
    pub fn on_role(&mut self, is_leader: bool, term: u64) {
        if self.was_leader.0 && (!is_leader || self.was_leader.1 != term) {
            for (_, w, _) in self.waiting.values_mut() {
                if let Waiter::Write(_, ticket) = w {
                    ticket.take();
                }
            }
            self.waiting.retain(|_, (_, w, _)| match w {
                Waiter::Write(reply, _) => !reply.is_closed(),
                Waiter::Members(reply) => !reply.is_closed(),
            });
        }
        self.was_leader = (is_leader, term);
    }

    /// Answer every waiter: the node stops.
    pub fn fail_all(&mut self, why: &str) {
        for (_, (_, w, _)) in std::mem::take(&mut self.waiting) {
            match w {
                Waiter::Write(reply, _) => {
                    let _ = reply.send(WriteReply::Unknown(why.into()));
                }
                Waiter::Members(reply) => {
                    let _ = reply.send(MembersReply::Unknown(why.into()));
                }
            }
        }
    }

    /// Publish the node's status for the HTTP threads.
    pub fn publish(&self, node: &Node) {
        let mut s = Status::of(node, self.storage.log_len());
        s.progress = self.progress.clone();
        *self.shared.status.write() = s;
    }

    /// Refresh the peers' progress (every tick: it is for people and tests, not for requests).
    pub fn publish_progress(&mut self, node: &Node) {
        self.progress = Status::progress_of(node);
    }

    /// Cut the log when `every` entries applied since the last cut, or entries of
    /// [`SNAPSHOT_AFTER_BYTES`], or when a node was added: the state machine first makes what
    /// it applied durable (one fsync of its store, no copy of the state), and the log is cut
    /// only up to what is durable there, so that a restart always finds the entries after the
    /// state it opens.
    pub fn maybe_compact(&mut self, every: u64) -> Result<bool, DiskError> {
        let applied = self.shared.machine.read().applied();
        let due = applied >= self.snapshot_index.saturating_add(every)
            || self.applied_bytes >= SNAPSHOT_AFTER_BYTES
            || self.snapshot_due;
        let replaying = applied < self.conf_index.max(self.replay_until);
        if applied <= self.snapshot_index || !due || replaying {
            return Ok(false); // (below the stored configuration's index: a restart's replay)
        }
        let durable = {
            let mut machine = self.shared.machine.write();
            if !self.unsafe_cut_past_durable {
                machine.make_durable()?;
            }
            machine.durable()
        };
        let cut_at = match self.unsafe_cut_past_durable {
            true => applied, // the control: a cut past what the state made durable
            false => durable,
        };
        assert!(
            cut_at <= durable || self.unsafe_cut_past_durable,
            "the log cut past the state's durable index {durable}"
        );
        if cut_at <= self.snapshot_index {
            return Ok(false);
        }
        let data = envelope(&self.shared.members.read(), self.follows, &[]);
        let keep = self.keep_entries(cut_at, every);
        self.storage.compact(cut_at, data, keep)?;
        self.snapshot_index = cut_at;
        self.applied_bytes = 0;
        self.snapshot_due = false;
        info!(self.logger, "log compacted behind the durable state"; "index" => cut_at,
              "log_entries" => self.storage.log_len());
        Ok(true)
    }

    /// Entries kept behind a snapshot at `applied`, for followers that lag a little: a tenth of
    /// `every` (all of it for a new node), at most [`KEEP_ENTRIES`] (ten times that for a new
    /// node), and about [`KEEP_BYTES`] at the mean size of the entries since the last snapshot;
    /// at least one.
    fn keep_entries(&self, applied: u64, every: u64) -> u64 {
        let (wanted, cap) = match self.snapshot_due {
            true => (every, 10 * KEEP_ENTRIES),
            false => (every / 10, KEEP_ENTRIES),
        };
        let mean_bytes = self.applied_bytes / (applied - self.snapshot_index).max(1);
        wanted.min(KEEP_BYTES / mean_bytes.max(1)).clamp(1, cap)
    }

    /// Answer the request waiting on `e`, if any, with `outcome` (computed from `e`).
    fn answer_write(&mut self, e: &Entry, outcome: Option<M::Outcome>, applying_at: Instant) {
        let Some((term, w, proposed_at)) = self.waiting.remove(&e.index) else {
            return;
        };
        self.metrics.write_commit_seconds.observe(
            applying_at
                .saturating_duration_since(proposed_at)
                .as_secs_f64(),
        );
        // Timed before the answer is sent: once it is, the waiting worker may run first, and an
        // apply stage read after that would overlap the answer's hand-off.
        let apply = applying_at.elapsed().as_secs_f64();
        self.metrics.write_apply_seconds.observe(apply);
        match (w, outcome) {
            (Waiter::Write(reply, _), Some(o)) if term == e.term => {
                let _ = reply.send(WriteReply::Done(o));
            }
            (Waiter::Write(reply, _), _) => {
                let why = "another leader's entry took its place: not applied";
                let _ = reply.send(WriteReply::NotApplied(why.into()));
            }
            (w, _) => not_applied(
                w,
                "raft replaced the change with an empty entry: not applied",
            ),
        }
    }

    /// Apply a membership entry (another group's change that follows an older configuration of
    /// group 0 than this group last followed is skipped: see `peer::follow`), and answer the
    /// request waiting on it.
    fn apply_conf_change(&mut self, node: &mut Node, e: &Entry) -> Result<(), DiskError> {
        let cc = match e.get_entry_type() {
            EntryType::EntryConfChangeV2 => Some(ConfChangeV2::parse_from_bytes(&e.data)?),
            _ => None,
        };
        let replayed = e.index <= self.conf_index; // already in the stored configuration
        let stale =
            self.shared.group != 0 && cc.as_ref().is_some_and(|cc| !admits(self.follows, cc));
        if replayed || stale {
            if stale && !replayed {
                info!(self.logger, "an older configuration of group 0 skipped"; "index" => e.index,
                      "follows" => self.follows, "version" => cc.as_ref().and_then(version_of));
            }
            self.skip(e.index)?;
            self.answer_members(e, None);
            return Ok(());
        }
        let conf = |node: &Node| node.raw().raft.prs().conf().to_conf_state();
        let before = conf(node);
        let applied = apply_conf_change_entry(node, e)?;
        // A change raft refused leaves the configuration as it was. It is recorded all the same
        // (every replica refuses it alike), so that a follow change is not proposed again.
        let cs = applied.clone().unwrap_or_else(|| conf(node));
        let all = |c: &ConfState| -> Vec<u64> {
            let ids = c.voters.iter().chain(&c.voters_outgoing).chain(&c.learners);
            ids.chain(&c.learners_next).copied().collect()
        };
        let added = all(&cs).into_iter().any(|id| !all(&before).contains(&id));
        let cc = cc
            .as_ref()
            .filter(|_| applied.is_some() || self.shared.group != 0);
        self.record_conf(e.index, cc, &cs, added, applied.is_none())?;
        self.skip(e.index)?;
        self.answer_members(e, applied);
        Ok(())
    }

    /// Keep the configuration `cs` that the change `cc` (at `index`) left: on disk, in group 0's
    /// address book, or as the version this group now follows; take a snapshot soon if it
    /// `added` a node new to the group. A change raft `refused` changes nothing in group 0's book
    /// (but in other groups, its version is followed all the same).
    fn record_conf(
        &mut self,
        index: u64,
        cc: Option<&ConfChangeV2>,
        cs: &ConfState,
        added: bool,
        refused: bool,
    ) -> Result<(), DiskError> {
        self.conf_changed = true;
        match (self.shared.group, cc) {
            (0, _) if refused => {} // group 0's book and version stay as they were
            (0, Some(cc)) => self.shared.members.write().apply(index, cc, cs), // the book is group 0's
            (0, None) => self.shared.members.write().conf = Some(Followed::of(index, cs)),
            (_, cc) => {
                if let Some(v) = cc.and_then(version_of) {
                    debug_assert!(v > self.follows, "only a newer configuration is followed");
                    self.follows = v;
                    self.shared
                        .follows
                        .store(v, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let kept = ConfMeta {
            index,
            follows: self.follows,
            book: (self.shared.group == 0).then(|| self.shared.members.read().clone()),
        };
        self.storage.set_conf_state(cs, &kept.encode())?;
        self.unsynced = true;
        assert!(
            index > self.conf_index,
            "membership entries apply in log order"
        );
        self.conf_index = index;
        self.snapshot_due |= added; // a node new to the group catches up from a recent one
        info!(self.logger, "membership applied"; "index" => index, "voters" => ?cs.voters,
              "learners" => ?cs.learners, "voters_outgoing" => ?cs.voters_outgoing,
              "follows" => self.follows);
        Ok(())
    }

    /// Answer the membership request waiting on `e`, if any, with the configuration it left.
    fn answer_members(&mut self, e: &Entry, cs: Option<ConfState>) {
        let Some((term, w, _)) = self.waiting.remove(&e.index) else {
            return;
        };
        let reply = match w {
            Waiter::Members(reply) => reply,
            Waiter::Write(reply, _) => {
                let why = "replaced by a membership change";
                let _ = reply.send(WriteReply::NotApplied(why.into()));
                return;
            }
        };
        let answer = match cs {
            Some(conf) if term == e.term => MembersReply::Done {
                conf,
                index: e.index,
            },
            _ => MembersReply::Refused("raft refused to apply the change".into()),
        };
        let _ = reply.send(answer);
    }

    /// The version of group 0's configuration this group last followed.
    pub fn follows(&self) -> u64 {
        self.follows
    }

    /// Whether a configuration was written (not synced) since the last call: the node's sync of
    /// this round must run.
    pub fn take_unsynced(&mut self) -> bool {
        std::mem::take(&mut self.unsynced)
    }

    /// Whether a membership change applied since the last call.
    pub fn take_conf_changed(&mut self) -> bool {
        std::mem::take(&mut self.conf_changed)
    }

    /// Apply a run of normal entries in one batch of the state machine (under one write lock).
    /// Each write's answer is timed: from its proposal to this run (commit), and from this run to
    /// the moment its answer is sent (apply).
    fn apply_normal(&mut self, run: &[Entry]) -> Result<(), DiskError> {
        let applying_at = Instant::now();
        let data: Vec<(u64, &[u8])> = run.iter().map(|e| (e.index, &e.data[..])).collect();
        let outcomes = self.shared.machine.write().apply(&data)?;
        for (e, outcome) in run.iter().zip(outcomes) {
            self.applied_bytes += e.data.len() as u64;
            self.answer_write(e, outcome, applying_at);
        }
        Ok(())
    }

    /// Record `index` as applied with nothing for the state machine (a membership change).
    fn skip(&mut self, index: u64) -> Result<(), DiskError> {
        self.shared.machine.write().apply(&[(index, &[])])?;
        Ok(())
    }
}

/// The snapshot raft sends a follower: the envelope of the address book and the configuration
/// followed, and a descriptor of the group's state as applied now, a view of the state engine
/// registered in `views` that the transport streams to the follower before the message.
fn snapshot_for_follower<M: StateMachine>(
    shared: &Shared<M>,
    storage: &DiskStorage,
    views: &SnapshotViews,
    request_index: u64,
) -> raft::Result<Snapshot> {
    let unavailable = || raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable);
    let machine = shared.machine.read();
    let index = machine.applied();
    if index < request_index {
        return Err(unavailable());
    }
    let term = raft::Storage::term(storage, index)?;
    let conf = raft::Storage::initial_state(storage)?.conf_state;
    let view = machine
        .snapshot_view()
        .map_err(|e| raft::Error::Store(raft::StorageError::Other(Box::new(e))))?;
    drop(machine);
    let id = views.register(view);
    let follows = shared.follows.load(std::sync::atomic::Ordering::Relaxed);
    let data = envelope(&shared.members.read(), follows, &descriptor(id));
    let mut s = Snapshot {
        data: data.into(),
        ..Default::default()
    };
    let m = s.mut_metadata();
    (m.index, m.term) = (index, term);
    m.set_conf_state(conf);
    Ok(s)
}

/// What the node's `Ready`s ask of the group.
impl<M: StateMachine> LoopIo<M> {
    /// Install a snapshot from the leader: the state stream is written beside the state and
    /// sealed; then the log store takes the snapshot (its envelope only: the state is not kept
    /// in the log); then the sealed state becomes the group's. A crash between any two of these
    /// is settled at the next start (`KvState::settle`).
    pub fn install_snapshot(&mut self, _: &mut Node, snap: Snapshot) -> Result<(), DiskError> {
        let (env, machine_part) = split(&snap.data)?;
        let index = snap.get_metadata().index;
        let id = match descriptor_id(machine_part) {
            // Streamed: its state was sealed before raft saw the message (`snapshot_recv`).
            Some(id) => match self.shared.machine.read().staged_index(id)? {
                Some(sealed) if sealed == index => id,
                other => {
                    return Err(format!(
                        "snapshot {id} at {index} reached raft, but its state is sealed at \
                         {other:?}"
                    )
                    .into())
                }
            },
            None => self.shared.machine.write().stage(machine_part, index)?,
        };
        let mut kept = snap.clone();
        kept.data = envelope(&env.book, env.follows, &[]).into();
        self.storage.apply_snapshot(&kept)?;
        self.shared.machine.write().install_staged(id)?;
        self.snapshot_index = index;
        self.applied_bytes = 0;
        if self.shared.group == 0 {
            *self.shared.members.write() = env.book; // the book is group 0's
        }
        self.follows = env.follows;
        self.shared
            .follows
            .store(env.follows, std::sync::atomic::Ordering::Relaxed);
        self.conf_changed = true;
        self.conf_index = self.conf_index.min(index); // entries after the snapshot are all new
                                                      // Entries up to the snapshot applied inside it: whether a waiter's did is not known.
        let later = self.waiting.split_off(&(index + 1));
        let covered = std::mem::replace(&mut self.waiting, later);
        for (_, (_, w, _)) in covered {
            match w {
                Waiter::Write(reply, _) => {
                    let _ = reply.send(WriteReply::Unknown("a snapshot replaced the log".into()));
                }
                Waiter::Members(reply) => {
                    let _ = reply.send(MembersReply::Unknown("a snapshot replaced the log".into()));
                }
            }
        }
        self.shared.publish_applied();
        info!(self.logger, "installed snapshot"; "index" => index, "bytes" => snap.data.len());
        Ok(())
    }

    /// Apply committed entries, answering the requests waiting on them.
    pub fn apply(&mut self, node: &mut Node, entries: Vec<Entry>) -> Result<(), DiskError> {
        let normal = |e: &Entry| e.get_entry_type() == EntryType::EntryNormal;
        for run in entries.chunk_by(|a, b| normal(a) == normal(b)) {
            if normal(&run[0]) {
                self.apply_normal(run)?;
            } else {
                for e in run {
                    self.apply_conf_change(node, e)?;
                }
            }
        }
        self.shared.publish_applied();
        Ok(())
    }

    /// Write new entries and the hard state, durable at the node's next sync; whether anything
    /// was written.
    pub fn persist(
        &mut self,
        entries: &[Entry],
        hs: Option<&HardState>,
    ) -> Result<bool, DiskError> {
        self.storage.persist(entries, hs)
    }

    /// Record a newer commit index.
    pub fn set_commit(&mut self, commit: u64) -> Result<(), DiskError> {
        self.storage.set_commit(commit)
    }
}

/// Answer a request whose entry will never apply.
fn not_applied<O>(w: Waiter<O>, why: &str) {
    match w {
        Waiter::Write(reply, _) => {
            let _ = reply.send(WriteReply::NotApplied(why.into()));
        }
        Waiter::Members(reply) => {
            let _ = reply.send(MembersReply::Refused(why.into()));
        }
    }
}
