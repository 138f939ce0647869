//! # raft-lease: a real-time leader lease for raft-rs
//!
//! While a majority of the group has recently acknowledged the leader, the other nodes promise not
//! to vote for anyone else, so the leader can serve linearizable reads from local state with **no
//! network round**. When the lease is not held, reads fall back to ReadIndex (one heartbeat round).
//!
//! ## Why raft-rs needs this
//! raft-rs 0.7's `ReadOnlyOption::LeaseBased` consults no clock: it trusts tick-based check-quorum,
//! which is late by up to an election timeout, and which a stalled tick thread stretches. It serves
//! stale reads after a partition alone. This crate measures the lease from acknowledged *send times*
//! on a monotonic clock instead.
//!
//! ## The lease argument
//! Every clock is monotonic and runs at a rate within `1 ± ρ` of real time.
//! - **Promise.** A node that accepts a message from the leader of its term refuses
//!   `MsgRequestVote`/`MsgRequestPreVote` from every other candidate until its own clock has advanced
//!   `P` from the moment of receipt (read after processing), and does not campaign itself meanwhile:
//!   a vote for itself is a vote too. A booting node refuses (and waits) for `P`. A forced election
//!   after `MsgTimeoutNow` passes, because the old leader fenced its lease before sending it.
//! - **Rounds.** A round is a batch of heartbeats, tagged in their `context`, which followers echo.
//!   Appends do not renew the lease: the response to a stale append carries the follower's commit
//!   index, so it cannot be tied to one send time (see [`round`]).
//! - **Lease.** The leader reads `t0` *before* sending a round. Once a quorum, itself included, has
//!   acknowledged messages sent at or after `t0`, the lease runs to `t0 + L`, with
//!   `L = P·(1−ρ)/(1+ρ) − ε`. It never moves backwards.
//! - **Proof.** If the round left at real time `T0`, each acknowledging node's promise ends no earlier
//!   than `T0 + P/(1+ρ)`; the lease ends no later than `T0 + L/(1−ρ)`, which is earlier. A new leader
//!   needs a vote from some node of that quorum, which will not vote before the lease is over.
//! - **Reads.** Capture the commit index when the read starts, wait locally until it is applied, read
//!   the state, *then* check the lease is still held. A pause anywhere shows up as an expired lease.
//! - **Where it stops.** Lost on a term change or step-down; revoked before a leadership transfer
//!   (a late `MsgTimeoutNow` never leaves two holders); dropped on a membership change and
//!   re-established by the new configuration's quorum; granted to a new leader only after it has
//!   committed an entry of its term.
//! - **Fencing.** Expiry means the old holder *should* have stopped. Writes to outside storage
//!   should carry the term as a fencing token.
//! - **Clocks.** Use [`BootClock`] on Linux: `CLOCK_MONOTONIC` stops during suspend.
//!
//! ## Layering
//! Pure state machines ([`lease`], [`promise`], [`round`], [`read`]) take time as an argument and
//! return decisions. [`LeaseNode`] is the thin driver around `RawNode`. The `sim` feature adds a
//! deterministic fault simulator with a linearizability checker.
#![deny(missing_docs)]

pub mod clock;
pub mod config;
pub mod ctx;
pub mod drive;
pub mod grant;
pub mod handle;
pub mod lease;
pub mod node;
pub mod promise;
pub mod read;
pub mod round;
#[cfg(feature = "sim")]
pub mod sim;
pub mod status;

pub use clock::{BootClock, Clock, MonotonicClock, SimClock};
pub use config::{ConfigError, Derived, LeaseConfig, Safeties};
pub use ctx::ReservedContext;
pub use drive::{Collect, MemApp, ReadyIo};
pub use handle::ReadHandle;
pub use lease::{LeaderLease, LeaseState};
pub use node::{CampaignError, LeaseNode, NodeError};
pub use promise::{FollowerPromise, VoteDecision};
pub use read::{ReadError, ReadId, ReadKind, ReadMode, ServedRead};
pub use status::{CounterSnapshot, Counters, LeaseStatus};

/// The README's embedding example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
