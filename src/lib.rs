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
//!   One context has one `t0`, its first send time, for ever: raft-rs re-sends a pending ReadIndex
//!   context on every heartbeat, and once that context's round is gone it renews nothing.
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
//! ## The trust boundary
//! Every place the lease trusts an acknowledgement, a clock reading or a configuration, and the
//! test that covers it (with its negative control, where one exists). The randomized simulation
//! (`tests/randomized.rs`, [`sim::random`](crate::sim) with feature `sim`) checks all of them at
//! once under random faults, and catches every control within its CI seeds.
//!
//! | what is trusted | the rule | covered by |
//! |---|---|---|
//! | a heartbeat response carrying a round tag | credits the round's first send time, once; only in the leader's current term | `round::tests`, the property test `an_ack_never_credits_a_later_t0_and_the_lease_never_regresses` (control: `control_the_property_test_finds_the_remapped_context`) |
//! | a heartbeat response carrying a ReadIndex context | the same; a context whose round is gone (pruned, cleared, evicted, completed) is retired for the term | `a_resent_read_context_never_credits_a_later_t0` (control: `control_a_retired_context_remapped_to_a_new_round_outlives_the_promise`), `cleared_completed_and_evicted_contexts_are_retired` |
//! | who acknowledged | only voters count, through `ProgressTracker::has_quorum` (joint: both halves) | `minority_ack_proves_nothing_quorum_returns_t0`, `membership_change_reestablishes_the_lease_under_both_quorums` |
//! | the leader's own acknowledgement | counts only if it is a voter; it renews alone only if it is the one voter of every half | `a_removed_leader_left_leading_still_never_renews_its_own_lease` (control: `control_a_removed_leader_renewing_from_its_own_clock_serves_stale_reads`) |
//! | a context from a caller | `raw_read_index` refuses the layer's reserved prefix | `caller_read_contexts_cannot_collide_with_the_layers` |
//! | a round's send time `t0` | read before the transport gets the message; never later than now; rounds start in clock order | the `sent_at_ns <= now` assertion, `a_round_older_than_the_newest_is_a_bug`, `stalled_leader_ticker_does_not_stretch_the_lease` |
//! | a follower's receipt time | read after raft processed the leader's message | `follower_tick_burst_never_shortens_the_promise` (control: `control_no_promise_is_broken_by_a_tick_burst`) |
//! | a vote request | checked against the clock, not ticks; the node's own campaign too, then seeded jitter | `control_no_campaign_hold_lets_a_promising_node_vote_for_itself`, `a_held_back_campaign_starts_after_seeded_jitter` |
//! | a node that boots | refuses votes for `P` | `restarted_follower_refuses_votes_for_p_after_boot` (control: `control_no_boot_promise_lets_a_restarted_follower_vote_at_once`) |
//! | the clock rate | within `1 ± ρ`; at the bound it is safe, beyond it not | `drift_at_the_bound_is_safe` (control: `control_drift_beyond_the_bound_serves_stale_reads`) |
//! | the state a lease read returns | read first, validated second | `read_first_validate_second_catches_a_pause_during_the_read`, `paused_leader_resumes_after_lease_expiry_without_stale_reads` |
//! | a new leader's commit index | no lease before an entry of its term commits | `no_lease_before_first_commit_in_term`, `read_issued_before_the_first_commit_is_served_not_dropped` |
//! | a membership change | drops the lease and retires every round; a leader may not remove itself, and steps down if it applies its own removal | `membership_change_reestablishes_the_lease_under_both_quorums`, `a_leader_cannot_remove_itself_and_steps_down_if_its_removal_is_applied` |
//! | a leadership transfer | fenced for the term once raft acts on it (sets its transferee, or sends `MsgTimeoutNow`); forced-election votes then pass the promise | `delayed_timeout_now_never_gives_two_holders` (control: `control_no_transfer_fence_gives_two_holders`), `a_transfer_raft_ignores_costs_no_lease_and_a_real_one_fences` |
//! | the lease configuration | `L > 0`, `L` above one heartbeat interval, `P` at most the election timeout, typed errors | `bad_configs_get_typed_errors`, `bad_configs_are_typed_errors` |
//! | the peer that sent a message | raft messages are only as trustworthy as the transport: the example KV authenticates peers with mutual TLS | `tests/kv/attack_peer.rs` |
//!
//! **`P` under two heartbeat intervals** is accepted: it is safe, because a context whose round
//! was pruned between two of its copies is retired, and the randomized simulation gives a quarter
//! of its seeds such a `P`. Only a lease no longer than one heartbeat interval is refused
//! ([`ConfigError::LeaseNotAboveHeartbeat`]): it would lapse before every renewal.
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
