//! `LeaseNode` driven by hand on one node, in simulated time.

use raft::eraftpb::{Message, MessageType};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};
use raft_lease::handle::HANDLE_FLUSH_EVERY;
use raft_lease::{
    CampaignError, Clock, Collect, ConfigError, LeaseConfig, LeaseNode, LeaseState, NodeError,
    ReadError, ReadKind, ReadMode, SimClock,
};
use slog::Logger;

const MS: u64 = 1_000_000;

fn logger() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

fn raft_config() -> raft::Config {
    raft::Config {
        id: 1,
        election_tick: 10,
        heartbeat_tick: 2,
        ..raft::Config::default()
    }
}

fn lease_config() -> LeaseConfig {
    LeaseConfig {
        promise_ms: 100,
        drift_ppm: 10_000,
        margin_ms: 2,
        ..LeaseConfig::default()
    }
}

fn single_node(clock: &SimClock) -> LeaseNode<MemStorage, SimClock> {
    let storage = MemStorage::new_with_conf_state((vec![1], vec![]));
    LeaseNode::new(
        &raft_config(),
        storage,
        lease_config(),
        10,
        clock.clone(),
        &logger(),
    )
    .unwrap()
}

/// Persist, advance and apply until raft has nothing more to do.
fn drive(node: &mut LeaseNode<MemStorage, SimClock>) {
    let mut io = Collect::default();
    node.handle_ready(&mut io).unwrap();
    assert!(io.messages.is_empty(), "a single node sends nothing");
}

fn leader(clock: &SimClock) -> LeaseNode<MemStorage, SimClock> {
    let mut node = single_node(clock);
    clock.advance(100 * MS); // past the boot promise
    node.campaign().unwrap();
    assert!(node.is_leader());
    drive(&mut node);
    node
}

#[test]
fn campaign_is_refused_while_the_boot_promise_holds() {
    let clock = SimClock::new(0, 0);
    let mut node = single_node(&clock);
    match node.campaign() {
        Err(CampaignError::PromiseHolds { remaining_ns }) => assert_eq!(remaining_ns, 100 * MS),
        other => panic!("expected the boot promise to hold, got {other:?}"),
    }
    clock.advance(100 * MS);
    node.campaign().unwrap();
    assert!(node.is_leader());
}

#[test]
fn read_issued_before_the_first_commit_is_served_not_dropped() {
    let clock = SimClock::new(0, 0);
    let mut node = single_node(&clock);
    clock.advance(100 * MS);
    node.campaign().unwrap();
    // Leader, but its empty entry of this term is not committed yet.
    let id = node.read(ReadMode::ReadIndex).unwrap();
    assert_eq!(node.pending_reads(), 1);
    drive(&mut node);
    let served = node.serve_reads(|_| "state");
    assert_eq!(served.len(), 1, "the read must come back");
    assert_eq!(served[0].id, id);
    assert_eq!(served[0].result, Ok(("state", ReadKind::Index)));
    assert_eq!(node.pending_reads(), 0);
}

#[test]
fn control_raft_drops_a_read_index_issued_before_the_first_commit() {
    let storage = MemStorage::new_with_conf_state((vec![1], vec![]));
    let mut raw = RawNode::new(&raft_config(), storage, &logger()).unwrap();
    raw.campaign().unwrap();
    assert_eq!(raw.raft.state, StateRole::Leader);
    raw.read_index(b"early".to_vec());
    let mut seen = Vec::new();
    for _ in 0..10 {
        if !raw.has_ready() {
            raw.tick();
            continue;
        }
        let mut rd = raw.ready();
        seen.extend(rd.take_read_states());
        raw.mut_store().wl().append(rd.entries()).unwrap();
        if let Some(hs) = rd.hs() {
            raw.mut_store().wl().set_hardstate(hs.clone());
        }
        raw.advance(rd);
        raw.advance_apply();
    }
    assert!(
        raw.raft.raft_log.committed > 0,
        "the term's entry committed"
    );
    assert!(
        seen.is_empty(),
        "raft-rs answered a read_index it is known to drop: {seen:?}"
    );
}

#[test]
fn a_single_voter_holds_the_lease_from_its_own_ticks() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    assert_eq!(
        node.lease_status().state,
        LeaseState::Expired,
        "no tick yet"
    );
    node.tick();
    assert_eq!(node.lease_status().state, LeaseState::Valid);
    let id = node.read(ReadMode::Lease).unwrap();
    let served = node.serve_reads(|_| 7);
    assert_eq!(
        (served[0].id, served[0].result.clone()),
        (id, Ok((7, ReadKind::Lease)))
    );
    assert_eq!(node.counters().lease_reads, 1);
}

#[test]
fn read_first_validate_second_catches_a_pause_during_the_read() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    node.tick();
    let handle = node.read_handle();
    assert_eq!(handle.try_read(|| 1), Ok(1));
    // The lease is held when the read starts: a check-then-read design would serve this read.
    assert!(handle.lease_held());
    let paused = handle.try_read(|| {
        clock.advance(200 * MS); // the thread is paused while reading the state
        2
    });
    assert_eq!(paused, Err(ReadError::LeaseNotHeld));

    // The same through the raft thread: a strict read fails, an Auto read goes to ReadIndex.
    node.tick();
    let strict = node.read(ReadMode::Lease).unwrap();
    let auto = node.read(ReadMode::Auto).unwrap();
    let served = node.serve_reads(|_| clock.advance(200 * MS));
    assert_eq!(served.len(), 1);
    assert_eq!(
        (served[0].id, served[0].result.clone()),
        (strict, Err(ReadError::LeaseNotHeld))
    );
    drive(&mut node);
    let served = node.serve_reads(|_| ());
    assert_eq!(
        (served[0].id, served[0].result.clone()),
        (auto, Ok(((), ReadKind::Index)))
    );
    assert!(node.counters().fallbacks >= 1);
}

#[test]
fn a_follower_refuses_reads_with_a_typed_error() {
    let clock = SimClock::new(0, 0);
    let mut node = single_node(&clock);
    assert_eq!(
        node.read(ReadMode::Auto),
        Err(ReadError::NotLeader { leader_hint: None })
    );
    assert_eq!(
        node.read_handle().try_read(|| ()),
        Err(ReadError::LeaseNotHeld)
    );
}

#[test]
fn bad_configs_are_typed_errors() {
    let clock = SimClock::new(0, 0);
    let storage = MemStorage::new_with_conf_state((vec![1], vec![]));
    let too_long = LeaseConfig {
        promise_ms: 101,
        ..lease_config()
    };
    match LeaseNode::new(
        &raft_config(),
        storage.clone(),
        too_long,
        10,
        clock.clone(),
        &logger(),
    ) {
        Err(NodeError::Config(ConfigError::PromiseExceedsElectionTimeout {
            promise_ms: 101,
            election_ms: 100,
        })) => {}
        other => panic!(
            "expected PromiseExceedsElectionTimeout, got {:?}",
            other.err()
        ),
    }
    let lease_based = raft::Config {
        read_only_option: raft::ReadOnlyOption::LeaseBased,
        ..raft_config()
    };
    assert!(matches!(
        LeaseNode::new(
            &lease_based,
            storage.clone(),
            lease_config(),
            10,
            clock.clone(),
            &logger()
        ),
        Err(NodeError::UnsafeReadOption)
    ));
    let bad_raft = raft::Config {
        heartbeat_tick: 0,
        ..raft_config()
    };
    assert!(matches!(
        LeaseNode::new(&bad_raft, storage, lease_config(), 10, clock, &logger()),
        Err(NodeError::Raft(_))
    ));
}

#[test]
fn garbage_from_peers_is_refused_without_panic() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    node.tick();
    let mut bogus = Vec::new();
    for (ty, ctx) in [
        (MessageType::MsgHeartbeatResponse, &b"rl-round:garbage"[..]),
        (
            MessageType::MsgHeartbeatResponse,
            &b"rl-round:\0\0\0\0\0\0\0\x09"[..],
        ),
        (MessageType::MsgHeartbeatResponse, &b"rl-read:unknown"[..]),
        (MessageType::MsgRequestVote, &b""[..]),
        (MessageType::MsgAppendResponse, &b""[..]),
        (MessageType::MsgHup, &b""[..]),
    ] {
        let mut m = Message::default();
        m.set_msg_type(ty);
        m.from = 99;
        m.to = 1;
        m.term = node.raw().raft.term;
        m.context = ctx.to_vec().into();
        bogus.push(m);
    }
    for m in bogus {
        let _ = node.step(m); // errors are fine; a panic or a lost lease is not
    }
    assert!(node.is_leader());
    assert!(node.lease_status().state.is_held());
}

/// A follower of leader 2 in voters {1, 2, 3}, with pre-vote off and the given jitter seed.
fn follower(
    clock: &SimClock,
    knobs: raft_lease::Safeties,
    seed: u64,
) -> LeaseNode<MemStorage, SimClock> {
    let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
    let cfg = LeaseConfig {
        seed,
        safeties: knobs,
        ..lease_config()
    };
    let mut node =
        LeaseNode::new(&raft_config(), storage, cfg, 10, clock.clone(), &logger()).unwrap();
    clock.advance(100 * MS); // past the boot promise
    let mut hb = Message::default();
    hb.set_msg_type(MessageType::MsgHeartbeat);
    (hb.from, hb.to, hb.term) = (2, 1, 1);
    node.step(hb).unwrap();
    assert_eq!(node.leader_id(), Some(2));
    node
}

/// Ticks arrive faster than the clock (a burst): the election timer is due while the promise
/// holds. Returns how long after the promise ended the node campaigned, in ms.
fn campaign_delay_after_promise_ms(knobs: raft_lease::Safeties, seed: u64) -> u64 {
    let clock = SimClock::new(0, 0);
    let mut node = follower(&clock, knobs, seed);
    let promise_end_ns = clock.now_ns() + 100 * MS;
    for _ in 0..40 {
        node.tick();
    }
    assert_eq!(
        node.raw().raft.state,
        StateRole::Follower,
        "campaigned under the promise"
    );
    while node.raw().raft.state == StateRole::Follower {
        clock.advance(MS);
        node.tick();
        assert!(
            clock.now_ns() < promise_end_ns + 200 * MS,
            "never campaigned"
        );
    }
    assert!(
        clock.now_ns() >= promise_end_ns,
        "campaigned before the promise ended"
    );
    (clock.now_ns() - promise_end_ns) / MS
}

#[test]
fn a_held_back_campaign_starts_after_seeded_jitter() {
    let delays: Vec<u64> = (0..8)
        .map(|seed| campaign_delay_after_promise_ms(Default::default(), seed))
        .collect();
    // The jitter is at most raft's election timeout spread: (20 − 10) ticks × 10 ms.
    assert!(delays.iter().all(|&d| d <= 100), "{delays:?}");
    let mut distinct = delays.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 2,
        "the jitter must spread campaigns: {delays:?}"
    );
    assert_eq!(
        campaign_delay_after_promise_ms(Default::default(), 3),
        delays[3],
        "seeded: the same seed, the same delay"
    );
    let mut lined_up = raft_lease::Safeties::default();
    lined_up.testing.no_campaign_jitter = true;
    let control: Vec<u64> = (0..8)
        .map(|seed| campaign_delay_after_promise_ms(lined_up, seed))
        .collect();
    assert!(
        control.iter().all(|&d| d == 0),
        "control: without jitter every node campaigns the moment its promise ends: {control:?}"
    );
}

#[test]
fn a_leader_cannot_remove_itself_and_steps_down_if_its_removal_is_applied() {
    use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    let mut cc = ConfChangeV2::default();
    let mut remove = ConfChangeSingle::default();
    remove.set_change_type(ConfChangeType::RemoveNode);
    remove.node_id = 1;
    cc.set_changes(vec![remove].into());
    match node.propose_conf_change(vec![], cc.clone()) {
        Err(raft::Error::ConfChangeError(e)) => {
            assert!(e.contains("transfer leadership first"), "{e}")
        }
        other => panic!("a leader proposing its own removal must be refused, got {other:?}"),
    }
    // A removal proposed by an earlier leader and applied by this one.
    let mut add = ConfChangeSingle::default();
    add.set_change_type(ConfChangeType::AddNode);
    add.node_id = 2;
    let mut grow = ConfChangeV2::default();
    grow.set_changes(vec![add].into());
    node.apply_conf_change(&grow).unwrap();
    assert!(node.is_leader());
    node.apply_conf_change(&cc).unwrap();
    assert!(!node.is_leader(), "a removed leader must step down");
    assert!(!node.lease_status().state.is_held());
}

#[test]
fn caller_read_contexts_cannot_collide_with_the_layers() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    let ours = raft_lease::ctx::LayerCtx::Read(1).encode();
    assert_eq!(node.raw_read_index(ours), Err(raft_lease::ReservedContext));
    assert_eq!(
        node.raw_read_index(b"rl\0anything".to_vec()),
        Err(raft_lease::ReservedContext)
    );
    assert_eq!(
        node.raw_read_index(b"rl-round:\0\0\0\0\0\0\0\x01".to_vec()),
        Ok(())
    );
    drive(&mut node);
    let answered = node.take_raw_read_states();
    assert_eq!(
        answered.len(),
        1,
        "the caller's own context is answered as its own"
    );
}

#[test]
fn handle_counts_reach_the_node_in_batches_at_drop_and_on_flush() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    node.tick();
    let a = node.read_handle();
    let b = a.clone();
    assert_eq!(a.try_read(|| 1), Ok(1));
    assert_eq!(b.try_read(|| 2), Ok(2));
    assert_eq!(
        node.counters().lease_reads,
        0,
        "a live handle's counts wait for a flush"
    );
    drop(b);
    assert_eq!(
        node.counters().lease_reads,
        1,
        "a dropped handle's reads are counted"
    );
    for _ in 2..HANDLE_FLUSH_EVERY {
        assert_eq!(a.try_read(|| 3), Ok(3));
    }
    assert_eq!(node.counters().lease_reads, 1, "one read short of a batch");
    assert_eq!(a.try_read(|| 4), Ok(4));
    assert_eq!(
        node.counters().lease_reads,
        1 + u64::from(HANDLE_FLUSH_EVERY),
        "a full batch is flushed"
    );
    clock.advance(1_000 * MS); // the lease runs out
    assert_eq!(a.try_read(|| 5), Err(ReadError::LeaseNotHeld));
    assert_eq!(node.counters().lease_refusals, 0);
    a.flush_counts();
    let counters = node.counters();
    assert_eq!(counters.lease_refusals, 1, "flushed on demand");
    assert_eq!(counters.lease_reads, 1 + u64::from(HANDLE_FLUSH_EVERY));
}

#[test]
fn a_dropped_node_takes_its_lease_from_its_read_handles() {
    let clock = SimClock::new(0, 0);
    let mut node = leader(&clock);
    node.tick();
    let handle = node.read_handle();
    assert_eq!(handle.try_read(|| 1), Ok(1), "served while the node lives");
    drop(node);
    // The lease published last has not run out (no time passed), so only the drop refuses.
    assert_eq!(handle.try_read(|| 2), Err(ReadError::LeaseNotHeld));
    assert!(!handle.lease_held());
}

/// What follower 2 of {1, 2, 3} says it promised in its answer to a heartbeat of leader 1.
fn promised_in_ack(safeties: raft_lease::Safeties) -> raft_lease::ctx::Promised {
    use raft_lease::ctx::LayerCtx;
    let clock = SimClock::new(0, 0);
    let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
    let cfg = raft::Config {
        id: 2,
        ..raft_config()
    };
    let lease = LeaseConfig {
        safeties,
        ..lease_config()
    };
    let mut node = LeaseNode::new(&cfg, storage, lease, 10, clock.clone(), &logger()).unwrap();
    let mut hb = Message::default();
    hb.set_msg_type(MessageType::MsgHeartbeat);
    (hb.from, hb.to, hb.term) = (1, 2, 1);
    hb.context = LayerCtx::Round(1).encode().into();
    node.step(hb).unwrap();
    let mut io = Collect::default();
    node.handle_ready(&mut io).unwrap();
    let ack = io
        .messages
        .iter()
        .find(|m| m.get_msg_type() == MessageType::MsgHeartbeatResponse)
        .expect("the heartbeat is answered");
    let (_, promised) = LayerCtx::parse_ack(ack.get_context()).expect("an acknowledgement tag");
    promised.expect("every acknowledgement says what its node promised")
}

/// A leader counts the promise each acknowledgement carries; a node that keeps none (raft-rs
/// `LeaseBased` reads, set on one node only) must carry none, or the leader would count a promise
/// that node never made (it votes for anyone at once).
#[test]
fn a_node_that_keeps_no_promise_says_it_promised_nothing() {
    let kept = promised_in_ack(raft_lease::Safeties::default());
    assert_eq!(kept.promise_ns, 100 * MS, "P as configured");
    let none = promised_in_ack(raft_lease::Safeties::raft_lease_based());
    assert_eq!(
        none.promise_ns, 0,
        "LeaseBased keeps no promise, so it claims none"
    );
}
