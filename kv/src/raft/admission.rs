//! Which peer messages raft may see: two kinds no correct peer sends are dropped before raft-rs,
//! which trusts them.

use raft::eraftpb::{Message, MessageType};

use crate::raft::machine::Node;

/// Whether raft may see `m`. Two kinds of message no correct peer sends are dropped, because
/// raft-rs trusts them: a heartbeat whose commit index is past this node's log (raft-rs panics
/// on it), and an append, heartbeat or snapshot in this node's current term from a node that
/// is not the leader it knows for that term.
pub fn admissible(node: &Node, m: &Message) -> Result<(), &'static str> {
    let r = &node.raw().raft;
    let from_leader = matches!(
        m.get_msg_type(),
        MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
    );
    if m.get_msg_type() == MessageType::MsgHeartbeat && m.commit > r.raft_log.last_index() {
        return Err("a heartbeat's commit index is past the local log");
    }
    if from_leader && m.term == r.term && r.leader_id != 0 && m.from != r.leader_id {
        return Err("a leader's message from a node that does not lead this term");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use raft_lease::{LeaseConfig, LeaseNode};
    use slog::Logger;

    use crate::base::clock::ScaledClock;
    use crate::disk::storage::DiskStorage;
    use crate::peer::ack_contexts::ack_contexts;

    /// A follower (node 1 of voters 1, 2, 3) on a fresh data dir, as the KV makes one.
    fn follower() -> (tempfile::TempDir, Node) {
        let dir = tempfile::tempdir().unwrap();
        let mut boot = raft::eraftpb::Snapshot::default();
        (boot.mut_metadata().index, boot.mut_metadata().term) = (1, 1);
        boot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        let storage = DiskStorage::create(
            dir.path(),
            Some(&boot),
            1,
            crate::disk::storage::LogEngine::RaftEngine,
        )
        .unwrap();
        let rc = raft::Config {
            id: 1,
            election_tick: 10,
            heartbeat_tick: 1,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        };
        let lease = LeaseConfig {
            promise_ms: 100,
            ..LeaseConfig::default()
        };
        let clock = Arc::new(ScaledClock::new());
        let log = Logger::root(slog::Discard, slog::o!());
        let node = LeaseNode::new(&rc, storage, lease, 10, clock, &log).unwrap();
        (dir, node)
    }

    #[test]
    fn heartbeat_acknowledgements_with_a_promise_or_garbage_pass_the_filter_harmlessly() {
        let (_dir, mut node) = follower();
        for ctx in ack_contexts() {
            let mut m = Message {
                from: 2,
                to: 1,
                term: node.raw().raft.term,
                ..Default::default()
            };
            m.set_msg_type(MessageType::MsgHeartbeatResponse);
            m.context = ctx.clone().into();
            assert_eq!(admissible(&node, &m), Ok(()), "{} bytes", ctx.len());
            let _ = node.step(m); // an error is fine; a panic or a change of role is not
            assert_eq!(node.raw().raft.state, raft::StateRole::Follower);
        }
    }
}
