//! # raft-lease: a real-time leader lease for raft-rs
//!
//! While a majority of the group has recently acknowledged the leader, the other nodes promise not
//! to vote for anyone else, so the leader can serve linearizable reads from local state with **no
//! network round**. When the lease is not held, reads fall back to ReadIndex (one heartbeat round).
//!
//! ## Embedding it
//! [`LeaseNode`] wraps raft-rs's `RawNode`, and you drive it the same way: each node's thread
//! ticks it on a timer, steps the messages the network delivers, and processes its `Ready`s with
//! [`LeaseNode::handle_ready`], which sends (through your [`ReadyIo`]), persists and applies in
//! the order raft-rs requires. Reads go through [`LeaseNode::read`] and come back from
//! [`LeaseNode::serve_reads`], or, on any other thread, through a [`ReadHandle`].
//!
//! Three nodes in one loop, on a simulated clock so that the example can skip time (use
//! [`BootClock`] in production). `examples/embed.rs` is the same store on real threads, with
//! reader threads and a leader that fails: start there to embed the crate.
//!
//! ```
//! use std::collections::HashMap;
//!
//! use raft::eraftpb::{Entry, EntryType, Message};
//! use raft::storage::MemStorage;
//! use raft_lease::{LeaseConfig, LeaseNode, MemApp, ReadKind, ReadMode, SimClock};
//!
//! type Node = LeaseNode<MemStorage, SimClock>;
//!
//! /// One node's application: its transport (an outbox here) and its state machine.
//! #[derive(Default)]
//! struct App {
//!     outbox: Vec<Message>,
//!     kv: HashMap<String, String>,
//! }
//!
//! // `MemApp` is the application half of a `ReadyIo` over raft-rs's `MemStorage`.
//! impl MemApp<SimClock> for App {
//!     fn send(&mut self, msgs: Vec<Message>) {
//!         self.outbox.extend(msgs); // your transport sends each to `m.to`
//!     }
//!
//!     fn apply(&mut self, _: &mut Node, entries: Vec<Entry>) {
//!         // Membership changes are already applied; an empty entry is raft's own.
//!         let puts = entries.iter().filter(|e| e.get_entry_type() == EntryType::EntryNormal);
//!         for put in puts.filter_map(|e| std::str::from_utf8(&e.data).ok()?.split_once('=')) {
//!             self.kv.insert(put.0.to_string(), put.1.to_string());
//!         }
//!     }
//! }
//!
//! /// What each node's thread does, for `ms` of time: tick every `tick_ms`, step what the
//! /// network delivers, and process `Ready`s after each.
//! fn run(nodes: &mut [(Node, App)], clock: &SimClock, ms: u64) -> Result<(), raft::Error> {
//!     let tick_ms = 10;
//!     for _ in 0..ms / tick_ms {
//!         clock.advance(tick_ms * 1_000_000);
//!         for (node, app) in nodes.iter_mut() {
//!             node.tick();
//!             node.handle_ready(app)?;
//!         }
//!         loop {
//!             let sent: Vec<Message> =
//!                 nodes.iter_mut().flat_map(|(_, app)| app.outbox.drain(..)).collect();
//!             if sent.is_empty() {
//!                 break;
//!             }
//!             for m in sent {
//!                 let (node, app) = &mut nodes[m.to as usize - 1];
//!                 node.step(m)?;
//!                 node.handle_ready(app)?;
//!             }
//!         }
//!     }
//!     Ok(())
//! }
//!
//! let clock = SimClock::new(0, 0);
//! let logger = slog::Logger::root(slog::Discard, slog::o!());
//! let mut nodes = Vec::new();
//! for id in 1..=3 {
//!     let raft_config = raft::Config {
//!         id,
//!         election_tick: 10,
//!         heartbeat_tick: 2,
//!         check_quorum: true,
//!         pre_vote: true,
//!         ..Default::default()
//!     };
//!     // P is the election timeout, 10 ticks of 10 ms: see "Choosing the numbers" below.
//!     let lease_config =
//!         LeaseConfig { promise_ms: 100, drift_ppm: 500, margin_ms: 2, ..Default::default() };
//!     let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
//!     let node = LeaseNode::new(&raft_config, storage, lease_config, 10, clock.clone(), &logger)?;
//!     nodes.push((node, App::default()));
//! }
//!
//! // Nodes refuse to vote for P after boot; then one is elected and gets its lease.
//! run(&mut nodes, &clock, 1_000)?;
//! let leader = nodes.iter().position(|(node, _)| node.is_leader()).expect("a leader");
//! assert!(nodes[leader].0.lease_status().state.is_held());
//!
//! // A write: propose at the leader; every node applies it.
//! nodes[leader].0.propose(vec![], b"greeting=hello".to_vec())?;
//! run(&mut nodes, &clock, 50)?;
//! assert!(nodes.iter().all(|(_, app)| app.kv["greeting"] == "hello"));
//!
//! // A read: served from the leader's own state under the lease, with no network round.
//! let (node, app) = &mut nodes[leader];
//! let id = node.read(ReadMode::Auto)?;
//! let served = node.serve_reads(|_id| app.kv.get("greeting").cloned());
//! assert_eq!(served[0].id, id);
//! assert_eq!(served[0].result, Ok((Some("hello".to_string()), ReadKind::Lease)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
//! - **What another node promised travels with its acknowledgement.** Each acknowledgement
//!   carries the `P'` its sender promised and the `ρ'` it assumes; the leader credits it with
//!   `P'·(1−ρ̂)/(1+ρ̂) − ε` (`ρ̂` the larger of the two bounds, `ε` its own margin, capped at its
//!   own `L`), and the lease runs as far as a quorum's credits reach. A lease never rests on
//!   another node's settings, so nodes in the middle of a rolling change of `P` stay safe. A
//!   booting node refuses votes for the longer of its `P` and the longest promise its previous
//!   run made ([`LeaseConfig::prior_promise_ms`]).
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
//! | a node that boots | refuses votes for `P`, or for its previous run's longer promise | `restarted_follower_refuses_votes_for_p_after_boot` (control: `control_no_boot_promise_lets_a_restarted_follower_vote_at_once`), `followers_restarted_with_a_shorter_promise_keep_the_longer_one_at_boot` (control: `control_followers_restarted_with_a_shorter_promise_forget_it_and_serve_stale_reads`) |
//! | what a follower promised | carried in its acknowledgement (`P`, `ρ`), never taken from the leader's own settings; an acknowledgement that says nothing backs nothing | `a_leader_counts_the_shorter_promise_its_followers_made` (control: `control_a_leader_counting_its_own_promise_serves_stale_reads`), `the_lease_is_the_longest_a_quorum_of_acknowledged_promises_backs`, `an_acknowledgement_carries_the_promise_and_garbage_carries_none` |
//! | the clock rate | within `1 ± ρ`; at the bound it is safe, beyond it not | `drift_at_the_bound_is_safe` (control: `control_drift_beyond_the_bound_serves_stale_reads`) |
//! | the state a lease read returns | read first, validated second | `read_first_validate_second_catches_a_pause_during_the_read`, `paused_leader_resumes_after_lease_expiry_without_stale_reads` |
//! | a new leader's commit index | no lease before an entry of its term commits | `no_lease_before_first_commit_in_term`, `read_issued_before_the_first_commit_is_served_not_dropped` |
//! | a membership change | drops the lease and retires every round; a leader may not remove itself, and steps down if it applies its own removal | `membership_change_reestablishes_the_lease_under_both_quorums`, `a_leader_cannot_remove_itself_and_steps_down_if_its_removal_is_applied` |
//! | a leadership transfer | fenced for the term once raft acts on it (sets its transferee, or sends `MsgTimeoutNow`); forced-election votes then pass the promise; a transfer raft gives up lifts the fence if `MsgTimeoutNow` never left, else the leader steps down | `delayed_timeout_now_never_gives_two_holders` (controls: `control_no_transfer_fence_gives_two_holders`, `control_lifting_the_fence_after_timeout_now_left_gives_two_holders`), `a_transfer_raft_ignores_costs_no_lease_and_a_real_one_fences`, `a_transfer_given_up_before_timeout_now_left_lifts_the_fence`, `a_transfer_given_up_after_timeout_now_left_ends_the_term` |
//! | the lease configuration | `L > 0`, `L` above one heartbeat interval, `P` at most the election timeout, typed errors | `bad_configs_get_typed_errors`, `bad_configs_are_typed_errors` |
//! | the peer that sent a message | raft messages are only as trustworthy as the transport: the example KV authenticates peers with mutual TLS | `kv/tests/kv/attack_peer.rs` |
//!
//! **`P` under two heartbeat intervals** is accepted: it is safe, because a context whose round
//! was pruned between two of its copies is retired, and the randomized simulation gives a quarter
//! of its seeds such a `P`. Only a lease no longer than one heartbeat interval is refused
//! ([`ConfigError::LeaseNotAboveHeartbeat`]): it would lapse before every renewal.
//!
//! ## Choosing the numbers
//! Four numbers decide how long the lease is and how often reads fall back to ReadIndex: the
//! promise `P`, the drift bound `ρ` and the margin `ε` of the [`LeaseConfig`], and raft's
//! heartbeat interval `H`. [`LeaseConfig::validate`] (which [`LeaseNode::new`] calls) checks them
//! against raft's configuration and derives `L = P·(1−ρ)/(1+ρ) − ε`; the example on
//! [`LeaseConfig`] shows every error.
//!
//! - **`P` against the election timeout.** `P` may not exceed raft's minimum election timeout,
//!   `min_election_tick × tick_ms` ([`ConfigError::PromiseExceedsElectionTimeout`]). A node that
//!   heard from the leader neither votes for another candidate nor campaigns for `P`, and raft
//!   itself waits at least that long before campaigning, so a promise up to the election timeout
//!   does not slow failover. Take `P` equal to the election timeout: a shorter `P` only shortens
//!   the lease. The difference that matters is that raft counts its timeout in ticks, which a
//!   stalled ticker stretches, while the promise is counted on the clock.
//! - **`ρ` for common clocks.** `ρ` bounds how far any node's clock *rate* may stray from real
//!   time while a lease lasts. On a synchronised host the time daemon bounds it, not the crystal:
//!   - An undisciplined oscillator: "a typical computer clock has a drift smaller than 100 parts
//!     per million (ppm), but much larger drifts are possible (e.g. in some virtual machines)"
//!     ([chrony FAQ](https://github.com/mlichvar/chrony/blob/master/doc/faq.adoc)).
//!   - Linux: `CLOCK_MONOTONIC` ([`MonotonicClock`]) and `CLOCK_BOOTTIME` ([`BootClock`]) follow
//!     the time daemon's incremental adjustments, `CLOCK_MONOTONIC_RAW` does not
//!     ([clock_gettime(2)](https://man7.org/linux/man-pages/man2/clock_gettime.2.html)).
//!     The kernel caps the NTP frequency correction at ±500 ppm (`MAXFREQ`,
//!     [`include/linux/timex.h`](https://github.com/torvalds/linux/blob/master/include/linux/timex.h))
//!     and an `adjtime(3)` slew at 500 µs per second (`MAX_TICKADJ`,
//!     [`kernel/time/ntp.c`](https://github.com/torvalds/linux/blob/master/kernel/time/ntp.c));
//!     ntpd's documentation gives the same limit ("the slew rate of typical Unix kernels is
//!     limited to 0.5 ms/s", ntpd(8), option `-x`). **500 ppm is not the whole story, though.**
//!     The kernel PLL's phase correction adds `offset / 2^(2 + time constant)` per second on top,
//!     for an offset of up to 0.5 s (`ntp_offset_chunk`, `MAXPHASE`), and `adjtimex(ADJ_TICK)` may
//!     change the tick length by up to 10% (`ntp_validate_timex`). chrony slews through the tick:
//!     its `maxslewrate` defaults to 83,333 ppm, and Linux lets it reach 100,000 ppm
//!     ([chrony.conf(5)](https://github.com/mlichvar/chrony/blob/master/doc/chrony.conf.adoc),
//!     `maxslewrate`).
//!   - So the default `ρ` is 100,000 ppm, the largest accepted, safe with chrony's defaults or a
//!     daemon you do not control: `L` shrinks to about 0.82·`P` − `ε` (the table), which costs
//!     nothing in steady state, since heartbeats renew the lease long before it runs out. On hosts
//!     whose daemon is configured not to slew faster than 500 ppm (for chrony, `maxslewrate 500`),
//!     `ρ` = 1,000 ppm (500 plus the oscillator's residual error) is enough.
//!     A clock no daemon adjusts, such as `CLOCK_MONOTONIC_RAW` behind your own [`Clock`], runs at
//!     the oscillator's own error, but like `CLOCK_MONOTONIC` it stops during suspend.
//!   - Suspend: `CLOCK_MONOTONIC` does not count time suspended; [`BootClock`] does.
//!   - Virtual machines: a paused guest's clock may stop ("kvm guests CLOCK_MONOTONIC not count
//!     when guest is paused", [autotest/virt-test#1229](https://github.com/autotest/virt-test/pull/1229)),
//!     or be moved forward on resume when the hypervisor restores kvmclock with the time elapsed
//!     ([cloud-hypervisor#8256](https://github.com/cloud-hypervisor/cloud-hypervisor/pull/8256)).
//!     A migrated VM's clock may also change frequency (chrony FAQ).
//!     A clock that catches up is harmless. One that stopped for longer than about `ε` is outside
//!     every `ρ`: a leader paused that way resumes with its lease apparently still valid after the
//!     promises behind it have ended. Transfer leadership away ([`LeaseNode::transfer_leader`] fences the lease at once)
//!     before pausing, snapshotting or migrating a node's VM, or make sure its clock counts the pause.
//! - **`ε` and scheduling jitter.** In real time a lease ends at least `ε/(1−ρ)` before the
//!   earliest promise behind it does; that gap is all `ε` buys. Scheduling delays do not eat into
//!   it, because every clock reading the lease depends on errs on the safe side if the thread is
//!   delayed: the leader reads `t0` *before* the round is handed to the transport, a follower reads
//!   its receipt time *after* raft processed the leader's message, and a read is validated *after*
//!   the state was read. A late thread makes the lease shorter, never longer. So `ε` is for what
//!   the `1 ± ρ` model leaves out: clock reads of coarse granularity, and a clock that stalls or
//!   steps briefly (a VM's clock frozen for a moment, a clock source switch). A few milliseconds
//!   (the default is 10 ms) cost little: `L` shrinks by exactly `ε`. Jitter matters for
//!   availability instead, below.
//! - **The heartbeat interval against `L`.** The lease renews on raft's own heartbeats, with no
//!   extra messages: a round sent at `t0` and acknowledged by a quorum after a round trip `r`
//!   extends it to `t0 + L`. It stays held without a gap while `H + r < L`, where `r` includes
//!   how late the ticker fires, and it survives `m` heartbeat rounds lost in a row while
//!   `(m + 1)·H + r < L`. [`ConfigError::LeaseNotAboveHeartbeat`] refuses `L ≤ H`, which would lapse
//!   between every two rounds; between `H` and `H + r` it is accepted but lapses for
//!   `H + r − L` of every `H`, and reads fall back to ReadIndex then. With `H` a tenth of the
//!   election timeout and `P` equal to it, the lease survives seven or eight lost rounds.
//!
//! The table is computed by `tests/numbers.rs` from [`LeaseConfig::validate`], which fails when
//! it differs from this one. Its availability columns assume a round trip `r` of 2 ms.
//!
//! <!-- numbers-table:start -->
//! | setting | election timeout / heartbeat `H` | `P` | `ρ` | `ε` | lease `L` | `L ÷ P` | heartbeat rounds lost in a row with no lapse | lease held, steady state |
//! |---|---|---|---|---|---|---|---|---|
//! | the simulator's default (`SimConfig`) | 100 ms / 20 ms | 100 ms | 10,000 ppm | 2 ms | **96 ms** | 96% | 3 | 100% |
//! | `examples/embed.rs` | 200 ms / 30 ms | 200 ms | 500 ppm | 5 ms | **194.8 ms** | 97% | 5 | 100% |
//! | the `kv` crate's default (ρ safe under any daemon's slewing) | 1,000 ms / 100 ms | 1,000 ms | 100,000 ppm | 10 ms | **808.1 ms** | 80% | 7 | 100% |
//! | the same, a daemon capped at 500 ppm | 1,000 ms / 100 ms | 1,000 ms | 1,000 ppm | 10 ms | **988 ms** | 98% | 8 | 100% |
//! | 1 s ticks, 10 s election timeout | 10,000 ms / 2,000 ms | 10,000 ms | 500 ppm | 10 ms | **9,980 ms** | 99% | 3 | 100% |
//! | 1 ms ticks, 50 ms election timeout | 50 ms / 5 ms | 50 ms | 500 ppm | 1 ms | **48.9 ms** | 97% | 8 | 100% |
//! | `P` just above `H` (accepted, but the lease lapses) | 100 ms / 50 ms | 53 ms | 10,000 ppm | 1 ms | **50.9 ms** | 96% | none | 97.9% |
//! <!-- numbers-table:end -->
//!
//! ## Many groups per node: shared liveness
//! A store with thousands of groups per node cannot renew every group's lease with that group's
//! own heartbeats: at 10,000 groups that is hundreds of thousands of messages a second at idle.
//! [`multi::MultiNode`] hosts many groups on one node and, in [`multi::LivenessMode::Shared`],
//! carries every lease on one support session per ordered pair of nodes ([`liveness`]), the idea of
//! CockroachDB's store liveness:
//! - **Support.** Node `R` sends each peer `S` a heartbeat `(epoch, seq)` every `P/3`, reading
//!   `t0` before sending. `S` supports that epoch until `receipt + P_S` on its own clock and
//!   answers with `P_S` and its `ρ`; `R` counts on `S` for what that answer backs, the same
//!   real-time argument as above, one level up, and never its own `P`.
//! - **Fortification.** A group's leader at term `T` asks each voter's node to fortify the group
//!   under the support it gives. A fortified replica refuses every other candidate, and does not
//!   campaign, while its node supports the leader at that epoch, **whatever raft's term does**: it
//!   ends only when that support ends, when its leader releases `T` or campaigns for a later
//!   term, or when raft follows a leader of a later term (which could only have been elected
//!   once the leader stopped counting this replica). Meanwhile it ignores later-term messages
//!   that name no leader, so a stale response cannot move its term. The leader's lease is the latest
//!   instant a quorum of fortified voters (itself included, joint configurations in both halves)
//!   is supported until; it is served only after an entry of `T` commits, as before.
//! - **Withdrawal is for good.** Support that runs out ends its epoch for ever: fortifications
//!   made under it are released (their replicas campaign after seeded jitter), and the requester
//!   asks at the next epoch. A restarted node bumps its persisted incarnation, so its old epochs
//!   and old answers count for nothing, and it keeps the boot promise.
//! - **Giving up.** A leader that steps down (a group stuck on a live node steps down by
//!   check-quorum) releases its followers over the node stream, after its lease has ended.
//! - **Quiescence.** An idle group with a lease stops ticking and heartbeating on every replica;
//!   any raft message, proposal or non-lease read wakes it. Lease reads and [`ReadHandle`]s work
//!   as for one group. [`multi::LivenessMode::PerGroup`] is the per-group baseline.
//!
//! The multi-group simulator (`sim::multi`, feature `sim`) checks every group's lease and history
//! under node-level faults, with a negative control for each hazard (`tests/multi.rs`).
//!
//! **Every way a fortified replica could stop backing its leader while its node still supports
//! the leader's epoch**, and what holds it:
//!
//! | how | the rule | covered by |
//! |---|---|---|
//! | a later-term response of any type (a held, rejected pre-vote response; a stale vote, append or heartbeat response) | ignored while fortified: raft's term does not move; were it moved, the fortification would not end with it | `a_held_rejected_pre_vote_response_never_ends_a_fortification` (control: `control_releasing_on_a_term_move_gives_two_lease_holders`) |
//! | a vote or pre-vote from another candidate, any term | refused while fortified | the same, and the randomized simulation |
//! | its own campaign (election timer) | held while fortified | the same |
//! | an append, heartbeat or snapshot from another node | only a leader of a later term sends one, and it could only be elected after the old leader stopped counting this replica: the fortification ends then | `drop_stale_fortification`'s assertions, the randomized simulation |
//! | `MsgTimeoutNow` | only the leader of the replica's term sends it, after fencing its lease; its forced vote passes | `delayed_timeout_now_never_gives_two_holders` |
//! | a delayed copy of the vote that won the term | releases nothing | `delayed_copy_of_the_winning_vote_request_never_releases_a_fortification` |
//! | the leader's own campaign for a later term, or its release | ends the fortification: that leader no longer leads the term | the same (its second half), `group_stuck_on_a_live_node_is_led_elsewhere` |
//! | a conf change that removes the replica | nothing is released: the leader stops counting it when it applies the change, and the replica keeps refusing until its support ends | `membership_change_reestablishes_the_lease_under_both_quorums`, the randomized simulation |
//! | the replica's restart | the node's boot promise (at least its previous run's `P`) and a new incarnation, which the leader's count does not match | `control_restart_without_a_new_incarnation_is_caught`, `control_no_boot_promise_is_caught` |
//! | the group's removal from the node, and its return | the fortification stays on the node until its support ends or its leader releases it, and a replica hosted again starts fortified | `a_group_hosted_again_keeps_the_fortification_its_removed_replica_made` (control: `control_a_group_hosted_again_forgetting_its_fortification_gives_two_lease_holders`), `a_removed_group_revokes_its_handles_and_a_readded_one_revives_nothing` |
//! | support that ends | the epoch is withdrawn for good and its fortifications released, only once the promise under it has run out | `control_support_resumed_at_a_withdrawn_epoch_is_caught`, `control_ending_an_epoch_at_once_is_caught` |
//!
//! ```
//! use raft::storage::MemStorage;
//! use raft_lease::multi::{LivenessMode, MultiConfig, MultiMemApp, MultiNode};
//! use raft_lease::{LeaseConfig, LeaseNode, SimClock};
//!
//! type Node = LeaseNode<MemStorage, SimClock>;
//!
//! /// Each group's state machine (here: it only counts entries).
//! #[derive(Default)]
//! struct Groups {
//!     applied: u64,
//! }
//!
//! impl MultiMemApp<SimClock> for Groups {
//!     fn apply(&mut self, _group: u64, _: &mut Node, entries: Vec<raft::eraftpb::Entry>) {
//!         self.applied += entries.len() as u64; // and the membership changes are applied
//!     }
//! }
//!
//! let (clock, tick_ms, groups) = (SimClock::new(0, 0), 10, 1..=20);
//! let logger = slog::Logger::root(slog::Discard, slog::o!());
//! let mut nodes = Vec::new();
//! for node_id in 1..=3 {
//!     let config = MultiConfig {
//!         node_id,
//!         incarnation: 1, // persist it and bump it at every boot
//!         mode: LivenessMode::Shared,
//!         raft: raft::Config {
//!             election_tick: 10,
//!             heartbeat_tick: 2,
//!             check_quorum: true,
//!             pre_vote: true,
//!             ..Default::default()
//!         },
//!         lease: LeaseConfig { promise_ms: 100, drift_ppm: 1_000, ..Default::default() },
//!         tick_ms,
//!         quiesce_after_ticks: 20,
//!         seed: 7,
//!     };
//!     let storage = || MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
//!     let node = MultiNode::new(config, groups.clone().map(|g| (g, storage())), clock.clone(), &logger)?;
//!     nodes.push((node, Groups::default()));
//! }
//! // Each node's thread: tick every tick_ms, step the batches that arrive, handle Readys, send.
//! for _ in 0..300 {
//!     clock.advance(tick_ms * 1_000_000);
//!     nodes.iter_mut().for_each(|(node, _)| node.tick());
//!     loop {
//!         let mut batches = Vec::new();
//!         for (node, app) in nodes.iter_mut() {
//!             node.handle_ready(app)?;
//!             batches.extend(node.take_outbox());
//!         }
//!         if batches.is_empty() {
//!             break;
//!         }
//!         for b in batches {
//!             nodes[b.to as usize - 1].0.step(b); // your transport: one batch per node pair
//!         }
//!     }
//! }
//! // Every group has a leader holding a lease, and every replica of every group is asleep.
//! for g in groups {
//!     let leader = nodes.iter().find(|(n, _)| n.group(g).unwrap().is_leader()).expect("led");
//!     assert!(leader.0.group(g).unwrap().read_handle().lease_held());
//!     assert!(nodes.iter().all(|(n, _)| n.is_quiescent(g)));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Follower read leases (experimental, off by default)
//! With [`LeaseConfig::follower_leases`] set, every voter serves linearizable reads from its own
//! state with no message, while it holds a read lease from the leader ([`follower`]; the design
//! is Paxos Quorum Leases adapted to raft and to this crate's clock model). The argument:
//! - **Expose, do not just commit.** The leader computes an exposed index `E`: its commit index,
//!   capped by the matched index of every node whose read lease may still be valid. Every
//!   replica, the leader included, applies only up to the `E` it knows, so a write is answered
//!   only once every live holder has persisted it.
//! - **A read lease is counted from the holder's own clock.** A voter tags each acknowledgement
//!   with a fresh tag and reads its clock `a` before sending it; the leader, receiving it at `x`,
//!   grants `g ≤ min(G, λ − x)` (`λ`: its own lease's end) and counts the holder until `x + g`.
//!   The holder's lease ends at `a + g·(1−ρ)/(1+ρ) − ε`: before the leader stops counting it,
//!   and before any other leader can be elected.
//! - **A read waits for what it might miss.** A holder serves a read of `k` when its lease is
//!   valid, it has applied up to `E`, and no entry it has persisted above applied writes `k`
//!   ([`LeaseNode::set_entry_keys`] says which keys an entry writes). Any write answered before
//!   the read began is then either applied or pending there.
//! - **Nothing lets another leader expose under a live read lease**: a node with live grants
//!   does not campaign, a transfer's `MsgTimeoutNow` waits until every grant has ended, and a
//!   membership change is proposed only while none lives.
//!
//! Reads: on a follower, through its [`ReadHandle`] (which then serves under the read lease) or
//! by reading the state and then calling [`LeaseNode::check_local_read_key`]; an `Err` means
//! "ask the leader". Writes pay for it: a write waits for every live holder's acknowledgement,
//! not only a majority's, and a killed holder stalls writes for at most one grant. An optional
//! lagging-node policy ([`FollowerLeases::with_max_lag_ms`]) stops granting to a slow node.
//! `docs/follower.md` has the rules, the measurements and what is not built yet.
//!
//! What follower reads trust, beyond what the leader lease trusts (table above):
//!
//! | what is trusted | the rule | covered by |
//! |---|---|---|
//! | a voter's acknowledgement tag | names one acknowledgement: a fresh (term, boot, counter); a grant for an unknown, forgotten or given-up tag or another term renews nothing | `unknown_tags_other_terms_and_given_up_terms_grant_nothing`, `old_tags_are_forgotten_and_then_grant_nothing` |
//! | the holder's send time `a` | read before the transport has the acknowledgement; the lease runs from it, never from the grant's receipt | `the_lease_runs_from_the_acknowledgements_send_time` (control: `control_a_lease_counted_from_the_grants_receipt_outlives_the_count`) |
//! | a grant's length | at most `G` and what is left of the leader's own lease; `ρ` and `ε` travel in it and the holder takes the larger of its own and the grant's | `a_grant_is_capped_by_the_leaders_own_lease_and_counted_from_receipt` (control: `control_a_grant_not_capped_by_the_leader_lease_outlives_it`; the randomized simulation catches the same switch on its own) |
//! | who is granted | a current voter, for an acknowledgement of the leader's term, caught up to `E`, while the leader holds its lease and no transfer or membership change is under way | `grants_only_to_caught_up_voters_of_the_term_and_none_while_transferring` |
//! | the exposed index `E` | the smallest matched index of every holder that may be valid, capped at commit; never goes down; carried with every append and heartbeat; never raised from a snapshot | `the_exposed_index_waits_for_every_live_holder_and_never_goes_down`, `a_holder_that_receives_writes_late_never_serves_a_stale_read` (control: `control_exposing_past_a_holder_serves_stale_follower_reads`) |
//! | what a replica applies | only up to the `E` it knows, whatever raft's commit index says | `replicas_apply_only_up_to_the_exposed_index_and_catch_up_when_load_stops` (control: `control_replicas_applying_up_to_raft_commit_are_caught`) |
//! | the keys an entry writes | as the application's pure function says; unknown keys are every key; entries found in the log at start block every read until applied | `pending_entries_block_reads_of_their_keys_until_applied`, `entries_found_in_the_log_at_start_block_every_read_until_applied`, `a_followers_read_handle_serves_under_its_read_lease_and_never_a_stale_read` (control: `control_a_follower_ignoring_its_pending_entries_serves_stale_reads`) |
//! | a leadership transfer | no grant once raft transfers; every `MsgTimeoutNow` held until every grant has ended | `a_transfer_waits_out_the_read_leases_and_no_holder_serves_a_stale_read` (control: `control_a_transfer_that_does_not_wait_serves_stale_follower_reads`) |
//! | a membership change | proposed only while no grant lives (refused with the wait otherwise); no grant while one is pending above `E` | `a_membership_change_committed_as_the_leader_goes_leaves_a_group_that_elects` (control: `control_a_change_committed_under_read_leases_leaves_the_group_without_a_leader`) |
//! | the follower-lease note on a peer message | split off whole or refused with a typed error (the message is dropped); never panics | `notes_round_trip_after_any_context_and_leave_it_as_it_was`, `a_zero_tag_or_grant_is_refused_not_taken`, `garbage_never_panics_and_what_parses_re_encodes` |
//!
//! ## Layering
//! Pure state machines ([`lease`], [`promise`], [`round`], [`read`]) take time as an argument and
//! return decisions. [`LeaseNode`] is the thin driver around `RawNode`. The `sim` feature adds a
//! deterministic fault simulator with a linearizability checker.
#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]

pub mod clock;
pub mod config;
pub mod ctx;
pub mod drive;
pub mod follower;
pub mod grant;
pub mod handle;
pub mod lease;
pub mod liveness;
pub mod multi;
pub mod node;
pub mod promise;
pub mod read;
pub mod round;
#[cfg(feature = "sim")]
pub mod sim;
pub mod status;

pub use clock::{BootClock, Clock, MonotonicClock, SimClock};
pub use config::{ConfigError, Derived, FollowerLeases, LeaseConfig, Safeties};
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
