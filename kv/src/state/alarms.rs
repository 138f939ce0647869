//! etcd's alarms, replicated: which member raised which alarm. The set lives in the state of
//! the group that serves etcd's API (group 0), in a meta row written with the batch that changes
//! it, so every replica has the same set at the same index and a snapshot carries it.
//!
//! `NOSPACE` is raised (by the leader, as a proposal) when a write would pass the quota
//! (`--quota-backend-bytes`). While it is raised, every replica refuses, when it applies them,
//! what adds to the keyspace: puts, transactions with a put in either branch, and lease grants
//! (etcd's "database space exceeded"); deletes, revokes, reads and compactions pass. It stays
//! raised until an operator disarms it (`etcdctl alarm disarm`), as in etcd: freeing space alone
//! does not lower it.

use std::collections::BTreeSet;

/// etcd's `AlarmType::Nospace`.
pub const NOSPACE: i32 = 1;
/// etcd's `AlarmType::Corrupt`.
pub const CORRUPT: i32 = 2;

/// The meta row holding the set.
pub const ALARMS_ROW: &str = "alarms";

/// The raised alarms: (member id, alarm type). Ordered, so that every replica lists them alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alarms {
    /// Invariant: no entry has type 0 (etcd's `NONE` names no alarm).
    raised: BTreeSet<(u64, i32)>,
}

/// Why a row of alarms could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the alarms row is damaged: {0}")]
pub struct AlarmsRowError(&'static str);

impl Alarms {
    /// Raise `alarm` for `member`; whether it was not raised yet.
    pub fn raise(&mut self, member: u64, alarm: i32) -> bool {
        assert!(alarm != 0, "NONE is not an alarm");
        self.raised.insert((member, alarm))
    }

    /// Lower `alarm` of `member`; whether it was raised.
    pub fn lower(&mut self, member: u64, alarm: i32) -> bool {
        self.raised.remove(&(member, alarm))
    }

    /// Whether any member raised `alarm`.
    pub fn any(&self, alarm: i32) -> bool {
        self.raised.iter().any(|&(_, a)| a == alarm)
    }

    /// The raised alarms matching `member` and `alarm` (0 matches any, as etcd's `GET` with
    /// no member and `NONE`).
    pub fn list(&self, member: u64, alarm: i32) -> Vec<(u64, i32)> {
        let matches =
            |&&(m, a): &&(u64, i32)| (member == 0 || m == member) && (alarm == 0 || a == alarm);
        self.raised.iter().filter(matches).copied().collect()
    }

    /// The row: 12 bytes per alarm, member then type, big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.raised.len() * 12);
        for &(m, a) in &self.raised {
            out.extend_from_slice(&m.to_be_bytes());
            out.extend_from_slice(&a.to_be_bytes());
        }
        out
    }

    /// The set a row holds.
    pub fn decode(row: &[u8]) -> Result<Self, AlarmsRowError> {
        if !row.len().is_multiple_of(12) {
            return Err(AlarmsRowError("not a whole number of alarms"));
        }
        let mut raised = BTreeSet::new();
        for rec in row.chunks_exact(12) {
            let m = u64::from_be_bytes(rec[..8].try_into().expect("8 bytes"));
            let a = i32::from_be_bytes(rec[8..].try_into().expect("4 bytes"));
            if a == 0 {
                return Err(AlarmsRowError("an alarm of type NONE"));
            }
            raised.insert((m, a));
        }
        Ok(Alarms { raised })
    }
}

/// The name etcd prints for an alarm type.
pub fn alarm_name(alarm: i32) -> &'static str {
    match alarm {
        NOSPACE => "NOSPACE",
        CORRUPT => "CORRUPT",
        _ => "NONE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_round_trips_and_a_damaged_one_is_refused() {
        let mut a = Alarms::default();
        assert!(a.raise(7, NOSPACE));
        assert!(!a.raise(7, NOSPACE));
        assert!(a.raise(3, CORRUPT));
        assert_eq!(Alarms::decode(&a.encode()), Ok(a.clone()));
        assert_eq!(a.list(0, 0), vec![(3, CORRUPT), (7, NOSPACE)]);
        assert_eq!(a.list(7, 0), vec![(7, NOSPACE)]);
        assert_eq!(a.list(0, CORRUPT), vec![(3, CORRUPT)]);
        assert!(a.any(NOSPACE) && a.lower(7, NOSPACE) && !a.any(NOSPACE));
        assert!(!a.lower(7, NOSPACE));
        assert!(Alarms::decode(&[0; 11]).is_err());
        assert!(Alarms::decode(&[0; 12]).is_err(), "type NONE");
        assert_eq!(Alarms::decode(&[]), Ok(Alarms::default()));
    }
}
