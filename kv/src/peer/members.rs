//! Membership: who is in the cluster and where to reach them, changed only through raft.
//!
//! The address book (each member's peer and HTTP address) is part of the replicated state: it
//! travels in a membership change's context and in every snapshot, so a node that joins or
//! catches up by snapshot knows every member, including those added after it was started.
//! Operators change membership with [`Change`]s, which become one `ConfChangeV2` (joint
//! consensus when more than one voter changes; raft leaves the joint configuration by itself).

use std::collections::{BTreeMap, BTreeSet};

use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::peer::follow::Followed;

/// Where a member listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addrs {
    /// Its peer (raft) address, `host:port`.
    pub peer: String,
    /// Its HTTP address, `host:port`, if known (for redirects).
    pub http: Option<String>,
    /// Its etcd API address, `host:port`, if it serves one (for forwarding to the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
}

/// The address book, replicated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    /// Every node added and not removed since, by raft id.
    pub addrs: BTreeMap<u64, Addrs>,
    /// Nodes removed from the cluster: their peer connections are refused.
    pub removed: BTreeSet<u64>,
    /// Group 0's configuration and its version, which every other group follows (`None` in a
    /// book written before groups followed group 0, until its next membership change).
    #[serde(default)]
    pub conf: Option<Followed>,
}

/// What an operator asks for one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Add a voter, or promote a learner.
    AddVoter,
    /// Add a learner, or demote a voter.
    AddLearner,
    /// Remove a node.
    Remove,
}

/// One node's change, as `POST /admin/members` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// What to do.
    pub op: Op,
    /// The node's raft id.
    pub id: u64,
    /// Its peer address (needed to add a node the cluster does not know yet).
    #[serde(default)]
    pub peer: Option<String>,
    /// Its HTTP address.
    #[serde(default)]
    pub http: Option<String>,
    /// Its etcd API address.
    #[serde(default)]
    pub etcd: Option<String>,
}

/// Why a membership request was refused before it reached raft.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChangeError {
    /// Nothing to change.
    #[error("no changes given")]
    Empty,
    /// Raft id 0 is reserved.
    #[error("raft id 0 is reserved")]
    ZeroId,
    /// The same node twice in one request.
    #[error("node {0} appears twice")]
    Duplicate(u64),
    /// A node the cluster does not know, added without a peer address.
    #[error("node {0} is new: give its \"peer\" address (and \"http\")")]
    NoAddress(u64),
    /// Removing a node that is not a member.
    #[error("node {0} is not a member")]
    NotMember(u64),
    /// A bad address.
    #[error("node {id}: bad address {addr:?} (expected host:port)")]
    BadAddress {
        /// The node.
        id: u64,
        /// What was given.
        addr: String,
    },
}

/// The context a membership entry carries: the addresses of the nodes it adds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Context {
    addrs: BTreeMap<u64, Addrs>,
}

/// `host:port` with a non-empty host and a port.
pub fn check_addr(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

impl Members {
    /// Turn `changes` into one raft membership change and its context, checked against the
    /// configuration `cs` and this book.
    pub fn conf_change(
        &self,
        cs: &ConfState,
        changes: &[Change],
    ) -> Result<(ConfChangeV2, Vec<u8>), ChangeError> {
        if changes.is_empty() {
            return Err(ChangeError::Empty);
        }
        let mut seen = BTreeSet::new();
        let mut ctx = Context::default();
        let mut cc = ConfChangeV2::default();
        cc.set_transition(ConfChangeTransition::Auto);
        for c in changes {
            self.check(cs, c, &mut seen, &mut ctx)?;
            let mut single = ConfChangeSingle {
                node_id: c.id,
                ..Default::default()
            };
            single.set_change_type(match c.op {
                Op::AddVoter => ConfChangeType::AddNode,
                Op::AddLearner => ConfChangeType::AddLearnerNode,
                Op::Remove => ConfChangeType::RemoveNode,
            });
            cc.mut_changes().push(single);
        }
        let context = serde_json::to_vec(&ctx).expect("a context serializes");
        Ok((cc, context))
    }

    fn check(
        &self,
        cs: &ConfState,
        c: &Change,
        seen: &mut BTreeSet<u64>,
        ctx: &mut Context,
    ) -> Result<(), ChangeError> {
        if c.id == 0 {
            return Err(ChangeError::ZeroId);
        }
        if !seen.insert(c.id) {
            return Err(ChangeError::Duplicate(c.id));
        }
        let member = is_member(cs, c.id);
        if c.op == Op::Remove {
            return if member {
                Ok(())
            } else {
                Err(ChangeError::NotMember(c.id))
            };
        }
        for addr in [c.peer.as_ref(), c.http.as_ref(), c.etcd.as_ref()]
            .into_iter()
            .flatten()
        {
            if !check_addr(addr) {
                return Err(ChangeError::BadAddress {
                    id: c.id,
                    addr: addr.clone(),
                });
            }
        }
        let known = self.addrs.get(&c.id);
        let peer = c.peer.clone().or_else(|| known.map(|a| a.peer.clone()));
        let peer = peer.ok_or(ChangeError::NoAddress(c.id))?;
        let http = c
            .http
            .clone()
            .or_else(|| known.and_then(|a| a.http.clone()));
        let etcd = c
            .etcd
            .clone()
            .or_else(|| known.and_then(|a| a.etcd.clone()));
        ctx.addrs.insert(c.id, Addrs { peer, http, etcd });
        Ok(())
    }

    /// Record an applied membership change at `index` whose result is `cs`: the addresses it
    /// carries, the nodes that are in no configuration any more, and the configuration other
    /// groups follow. A node removed while entering a joint configuration is still an outgoing
    /// voter: it counts until raft leaves the joint one.
    pub fn apply(&mut self, index: u64, cc: &ConfChangeV2, cs: &ConfState) {
        self.conf = Some(Followed::of(index, cs));
        let ctx: Context = serde_json::from_slice(cc.get_context()).unwrap_or_default();
        for c in cc.get_changes() {
            if c.get_change_type() != ConfChangeType::RemoveNode {
                self.removed.remove(&c.node_id);
                if let Some(a) = ctx.addrs.get(&c.node_id) {
                    self.addrs.insert(c.node_id, a.clone());
                }
            }
        }
        let gone: Vec<u64> = self
            .addrs
            .keys()
            .copied()
            .filter(|&id| !is_member(cs, id))
            .collect();
        for id in gone {
            self.addrs.remove(&id);
            self.removed.insert(id);
        }
    }

    /// Add `id`'s addresses as a member told a joining node, unless the book knows `id` already
    /// or it was removed; whether it was added. A node started with only some members (`--join`
    /// with a partial `--peers`) learns the others this way before it asks to be added, so that
    /// it can reach, and accept, whichever member leads. The book raft sends it (in its first
    /// snapshot) replaces what it learned.
    pub fn learn(&mut self, id: u64, addrs: Addrs) -> bool {
        if self.removed.contains(&id) || self.addrs.contains_key(&id) {
            return false;
        }
        self.addrs.insert(id, addrs);
        true
    }

    /// Whether connections from node `id` are accepted: it is in the book, or (before this node
    /// has learned the book) among the addresses it was started with, and it was not removed.
    pub fn accepts(&self, id: u64, started_with: &BTreeMap<u64, String>) -> bool {
        !self.removed.contains(&id)
            && (self.addrs.contains_key(&id) || started_with.contains_key(&id))
    }
}

/// Whether `id` is a voter (incoming or outgoing) or a learner of `cs`.
pub fn is_member(cs: &ConfState, id: u64) -> bool {
    cs.voters.contains(&id)
        || cs.voters_outgoing.contains(&id)
        || cs.learners.contains(&id)
        || cs.learners_next.contains(&id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book() -> Members {
        let mut m = Members::default();
        for id in 1..=3 {
            m.addrs.insert(
                id,
                Addrs {
                    peer: format!("h:{}", 7000 + id),
                    http: Some(format!("h:{}", 8000 + id)),
                    etcd: None,
                },
            );
        }
        m
    }

    fn cs() -> ConfState {
        ConfState {
            voters: vec![1, 2, 3],
            ..Default::default()
        }
    }

    fn change(op: Op, id: u64, peer: Option<&str>) -> Change {
        Change {
            op,
            id,
            peer: peer.map(str::to_string),
            http: None,
            etcd: None,
        }
    }

    #[test]
    fn changes_are_checked_and_carry_the_new_nodes_addresses() {
        let m = book();
        let add = change(Op::AddLearner, 4, Some("h:7004"));
        let (cc, ctx) = m.conf_change(&cs(), std::slice::from_ref(&add)).unwrap();
        assert_eq!(cc.enter_joint(), None, "one change: simple");
        let replace = [
            change(Op::AddVoter, 4, Some("h:7004")),
            change(Op::Remove, 2, None),
        ];
        let (joint, _) = m.conf_change(&cs(), &replace).unwrap();
        assert_eq!(
            joint.enter_joint(),
            Some(true),
            "two voters change: joint, auto-leave"
        );
        let mut applied = m.clone();
        let mut with_ctx = cc.clone();
        with_ctx.set_context(ctx.into());
        let mut grown = cs();
        grown.learners = vec![4];
        applied.apply(5, &with_ctx, &grown);
        assert_eq!(applied.addrs[&4].peer, "h:7004");
        let errors = [
            (vec![], ChangeError::Empty),
            (
                vec![change(Op::AddVoter, 0, Some("h:1"))],
                ChangeError::ZeroId,
            ),
            (
                vec![change(Op::AddVoter, 5, None)],
                ChangeError::NoAddress(5),
            ),
            (vec![change(Op::Remove, 5, None)], ChangeError::NotMember(5)),
            (vec![add.clone(), add.clone()], ChangeError::Duplicate(4)),
            (
                vec![change(Op::AddVoter, 5, Some("nohost"))],
                ChangeError::BadAddress {
                    id: 5,
                    addr: "nohost".into(),
                },
            ),
        ];
        for (changes, want) in errors {
            assert_eq!(m.conf_change(&cs(), &changes).unwrap_err(), want);
        }
        // A known node needs no address to be promoted; a removed one is refused as a peer.
        assert!(m
            .conf_change(&cs(), &[change(Op::AddVoter, 3, None)])
            .is_ok());
        // Removed while entering a joint configuration: still an outgoing voter, still accepted.
        let both = [change(Op::Remove, 3, None), change(Op::Remove, 2, None)];
        let (rm, _) = m.conf_change(&cs(), &both).unwrap();
        let joint = ConfState {
            voters: vec![1],
            voters_outgoing: vec![1, 2, 3],
            learners: vec![4],
            ..Default::default()
        };
        applied.apply(6, &rm, &joint);
        assert!(applied
            .conf
            .as_ref()
            .is_some_and(|c| c.joint && c.version == 6));
        assert!(applied.accepts(3, &BTreeMap::new()), "an outgoing voter");
        let left = ConfState {
            voters: vec![1],
            learners: vec![4],
            ..Default::default()
        };
        applied.apply(7, &ConfChangeV2::default(), &left);
        let followed = applied.conf.clone().expect("recorded");
        assert_eq!((followed.version, followed.joint), (7, false));
        assert!(followed.matches(&left));
        assert!(!applied.accepts(3, &BTreeMap::new()));
        assert!(applied.accepts(1, &BTreeMap::new()));
        assert!(!applied.accepts(9, &BTreeMap::new()));
        assert!(applied.accepts(9, &[(9, "h:1".to_string())].into()));
    }

    #[test]
    fn a_joiner_learns_members_it_was_not_started_with_but_never_a_removed_one() {
        let mut m = book();
        m.removed.insert(5);
        let a = |p: &str| Addrs {
            peer: p.into(),
            http: None,
            etcd: None,
        };
        assert!(!m.accepts(4, &BTreeMap::new()));
        assert!(m.learn(4, a("h:7004")));
        assert!(m.accepts(4, &BTreeMap::new()));
        assert!(
            !m.learn(1, a("elsewhere:1")),
            "a known member keeps its address"
        );
        assert_eq!(m.addrs[&1].peer, "h:7001");
        assert!(!m.learn(5, a("h:7005")), "a removed node stays out");
        assert!(!m.accepts(5, &BTreeMap::new()));
    }
}
