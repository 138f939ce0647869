//! What the raft thread publishes for the HTTP threads: role, term, indexes, lease, the
//! configuration, and (on the leader) each peer's replication progress.

use std::collections::BTreeMap;

use raft::eraftpb::ConfState;
use raft_lease::{CounterSnapshot, LeaseState};
use serde_json::{json, Value};

/// One peer's replication progress, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerProgress {
    /// The highest index known to be in its log.
    pub matched: u64,
    /// `probe`, `replicate` or `snapshot` (raft-rs's progress state).
    pub state: &'static str,
    /// The snapshot index being sent to it, while `state` is `snapshot`.
    pub pending_snapshot: u64,
}

/// The node's status after the raft thread's last pass.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// `leader`, `follower`, `candidate` or `precandidate`.
    pub role: &'static str,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader_id: Option<u64>,
    /// The commit index.
    pub commit: u64,
    /// The applied index.
    pub applied: u64,
    /// The last index in the raft log.
    pub last_index: u64,
    /// The lease's state and the time left on it.
    pub lease: Option<(LeaseState, u64)>,
    /// The lease layer's counters.
    pub counters: CounterSnapshot,
    /// Entries in the on-disk log.
    pub log_entries: u64,
    /// The applied configuration.
    pub conf: ConfState,
    /// Each peer's progress (on the leader only; refreshed every tick).
    pub progress: BTreeMap<u64, PeerProgress>,
}

fn role_name(r: raft::StateRole) -> &'static str {
    match r {
        raft::StateRole::Leader => "leader",
        raft::StateRole::Follower => "follower",
        raft::StateRole::Candidate => "candidate",
        raft::StateRole::PreCandidate => "precandidate",
    }
}

impl Status {
    /// The status of `node` now (progress left empty: see [`Status::progress_of`]).
    pub fn of<S: raft::Storage, C: raft_lease::Clock>(
        node: &raft_lease::LeaseNode<S, C>,
        log_entries: u64,
    ) -> Status {
        let r = &node.raw().raft;
        let ls = node.lease_status();
        Status {
            role: role_name(r.state),
            term: r.term,
            leader_id: node.leader_id(),
            commit: r.raft_log.committed,
            applied: r.raft_log.applied,
            last_index: r.raft_log.last_index(),
            lease: Some((ls.state, ls.remaining_ns)),
            counters: node.counters(),
            log_entries,
            conf: r.prs().conf().to_conf_state(),
            progress: BTreeMap::new(),
        }
    }

    /// Each peer's progress, if `node` leads.
    pub fn progress_of<S: raft::Storage, C: raft_lease::Clock>(
        node: &raft_lease::LeaseNode<S, C>,
    ) -> BTreeMap<u64, PeerProgress> {
        if !node.is_leader() {
            return BTreeMap::new();
        }
        let prs = node.raw().raft.prs();
        prs.iter()
            .map(|(&id, pr)| {
                let state = match pr.state {
                    raft::ProgressState::Probe => "probe",
                    raft::ProgressState::Replicate => "replicate",
                    raft::ProgressState::Snapshot => "snapshot",
                };
                let p = PeerProgress {
                    matched: pr.matched,
                    state,
                    pending_snapshot: pr.pending_snapshot,
                };
                (id, p)
            })
            .collect()
    }

    /// The configuration as JSON: voters, learners, and the outgoing voters of a joint one.
    pub fn conf_json(&self) -> Value {
        let sorted = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v
        };
        json!({
            "voters": sorted(&self.conf.voters),
            "learners": sorted(&self.conf.learners),
            "voters_outgoing": sorted(&self.conf.voters_outgoing),
            "joint": !self.conf.voters_outgoing.is_empty(),
        })
    }
}
