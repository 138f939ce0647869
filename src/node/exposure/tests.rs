//! The exposed index and held entries, and the node's transfer hold, on their own.

use super::*;

fn derived() -> Derived {
    let cfg = LeaseConfig {
        follower_leases: Some(crate::config::FollowerLeases::new(300)),
        ..LeaseConfig::default()
    };
    let rc = raft::Config {
        election_tick: 10,
        heartbeat_tick: 1,
        ..Default::default()
    };
    cfg.validate(&rc, 100).unwrap()
}

fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
    range
        .map(|index| Entry {
            index,
            term: 1,
            ..Default::default()
        })
        .collect()
}

fn indexes(es: &[Entry]) -> Vec<u64> {
    es.iter().map(|e| e.index).collect()
}

#[test]
fn entries_past_the_exposed_index_wait_for_it() {
    let mut x = Exposure::new(&derived(), 1, 2, (2, 2));
    assert!(x.release(entries(3..=5)).is_empty(), "E is 0: nothing");
    x.on_note(
        &LeaderNote {
            exposed: 4,
            grant: None,
            give_up: None,
        },
        1,
        0,
    );
    assert_eq!(indexes(&x.release(Vec::new())), [3, 4]);
    assert_eq!(x.applied(), 4);
    assert_eq!(indexes(&x.release(entries(6..=6))), Vec::<u64>::new());
    x.on_note(
        &LeaderNote {
            exposed: 3,
            grant: None,
            give_up: None,
        },
        1,
        0,
    );
    assert_eq!(x.exposed(), 4, "E never goes down");
    x.expose(9, true, 0);
    assert_eq!(indexes(&x.release(Vec::new())), [5, 6]);
}

#[test]
fn a_leader_exposes_only_once_its_term_has_a_committed_entry() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    x.expose(7, false, 0);
    assert_eq!(x.exposed(), 0);
    x.expose(7, true, 0);
    assert_eq!(x.exposed(), 7);
}

/// A new leader's first commit of its term and a voter's acknowledgement stepped in one
/// batch, before any `E` was recomputed: the grant is checked against the `E` of the commit,
/// so a voter lagging behind it gets none.
#[test]
fn a_grant_is_checked_against_the_exposed_index_of_the_current_commit() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    let tag = crate::follower::AckTag {
        term: 2,
        boot: 9,
        seq: 1,
    };
    let req = |matched| GrantRequest {
        holder: 3,
        tag,
        received_ns: 1_000,
        is_voter: true,
        matched,
    };
    assert_eq!(x.exposed(), 0, "no E computed in this term yet");
    x.on_ack(req(5), 2, Some(1_000_000_000), (10, true, 0));
    assert!(x.pending.is_empty(), "matched 5 is below E 10: no grant");
    assert_eq!(x.exposed(), 10);
    x.on_ack(req(10), 2, Some(1_000_000_000), (10, true, 0));
    assert!(x.pending.contains_key(&3), "caught up: granted");
}

#[test]
fn reads_rely_only_on_what_the_application_finished_applying() {
    let mut x = Exposure::new(&derived(), 1, 2, (2, 2));
    x.on_note(
        &LeaderNote {
            exposed: 5,
            grant: None,
            give_up: None,
        },
        1,
        0,
    );
    let puts: Vec<Entry> = (entries(3..=5).into_iter())
        .map(|e| Entry {
            data: b"k=v".to_vec().into(),
            ..e
        })
        .collect();
    x.on_persisting(&puts);
    assert_eq!(indexes(&x.release(puts)), [3, 4, 5]);
    assert_eq!(
        (x.applied(), x.shown()),
        (5, 2),
        "handed over, not yet applied"
    );
    assert!(
        x.pending_keys.touches(b"k"),
        "still pending while being applied"
    );
    x.mark_shown();
    assert_eq!(x.shown(), 5);
    assert!(!x.pending_keys.touches(b"k"));
}

#[test]
fn a_snapshot_drops_what_it_covers_and_never_raises_the_exposed_index() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    assert!(x.release(entries(1..=4)).is_empty());
    x.on_snapshot(3);
    assert_eq!((x.applied(), x.exposed()), (3, 0));
    x.on_note(
        &LeaderNote {
            exposed: 4,
            grant: None,
            give_up: None,
        },
        1,
        0,
    );
    assert_eq!(indexes(&x.release(Vec::new())), [4]);
}

#[test]
fn every_timeout_now_waits_for_the_grants_and_only_the_current_transferee_gets_one() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    let tag = crate::follower::AckTag {
        term: 2,
        boot: 9,
        seq: 1,
    };
    let req = GrantRequest {
        holder: 3,
        tag,
        received_ns: 1_000,
        is_voter: true,
        matched: 0,
    };
    x.on_ack(req, 2, Some(1_000_000_000), (0, true, 0));
    let timeout_now = |to| Message {
        msg_type: MessageType::MsgTimeoutNow,
        to,
        term: 2,
        ..Default::default()
    };
    let mut msgs = vec![timeout_now(4), Message::default(), timeout_now(5)];
    assert!(x.hold_timeout_now(&mut msgs, 2, 2_000), "a new ask");
    assert_eq!(msgs.len(), 1, "both held, the rest sent");
    assert!(
        x.release_timeout_now(2, Some(5), 2_000).is_empty(),
        "a grant lives"
    );
    let out = x.release_timeout_now(2, Some(5), u64::MAX);
    assert_eq!(
        out.iter().map(|m| m.to).collect::<Vec<_>>(),
        [5],
        "only to the transferee"
    );
    assert!(
        x.release_timeout_now(2, Some(5), u64::MAX).is_empty(),
        "sent once"
    );
}

/// A transfer waits one round trip, not `G`: the holder, asked on the next heartbeat, gives its
/// read lease up, and the held `MsgTimeoutNow` leaves at once. A give-up that does not cover the
/// last grant (one made after it left) ends nothing.
#[test]
fn a_give_up_releases_a_held_transfer_before_its_grant_ends() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    let tag = |seq| crate::follower::AckTag {
        term: 2,
        boot: 9,
        seq,
    };
    let req = |seq| GrantRequest {
        holder: 3,
        tag: tag(seq),
        received_ns: 1_000,
        is_voter: true,
        matched: 0,
    };
    x.on_ack(req(1), 2, Some(1_000_000_000), (0, true, 0));
    x.on_ack(req(2), 2, Some(1_000_000_000), (0, true, 0));
    let heartbeat = Message {
        msg_type: MessageType::MsgHeartbeat,
        to: 3,
        term: 2,
        ..Default::default()
    };
    let mut msgs = vec![
        Message {
            msg_type: MessageType::MsgTimeoutNow,
            to: 3,
            term: 2,
            ..Default::default()
        },
        heartbeat.clone(),
    ];
    assert!(x.hold_timeout_now(&mut msgs, 2, 2_000));
    let mut again = vec![heartbeat];
    assert!(
        !x.hold_timeout_now(&mut again, 2, 2_000),
        "no timeout-now: no ask"
    );
    x.annotate(&mut msgs, 2_000);
    let (_, note) = LeaderNote::split(msgs[0].get_context()).unwrap();
    assert_eq!(note.unwrap().give_up, Some(2), "the heartbeat asks");
    assert!(
        !x.on_gave_up(3, tag(1), 2_000),
        "tag 2 was granted after: still counted"
    );
    assert!(x.release_timeout_now(2, Some(3), 2_000).is_empty());
    assert!(x.on_gave_up(3, tag(2), 2_000));
    let out = x.release_timeout_now(2, Some(3), 2_000);
    assert_eq!(out.len(), 1, "leaves well before the grant's end");
    x.annotate(&mut again, 2_000);
    let (_, note) = LeaderNote::split(again[0].get_context()).unwrap();
    assert_eq!(note.unwrap().give_up, None, "nothing left to ask for");
}

#[test]
#[should_panic(expected = "out of order")]
fn a_gap_in_committed_entries_is_a_bug() {
    let mut x = Exposure::new(&derived(), 1, 0, (0, 0));
    x.release(entries(1..=2));
    x.release(entries(4..=4));
}
