//! etcd's Maintenance service: `Status` (what `etcdctl endpoint status` prints), `Alarm` (list,
//! raise and disarm etcd's alarms, replicated: see `state::alarms`), and `Defragment` (rewrites
//! this member's state engine tables so that the space compactions freed goes back to the file
//! system). Snapshots, hashes and downgrades are not served; moving the leader stays on the
//! admin API.

use std::pin::Pin;

use etcd_client::proto::{
    PbAlarmMember, PbAlarmRequest, PbAlarmResponse, PbDefragmentRequest, PbDefragmentResponse,
    PbDowngradeRequest, PbDowngradeResponse, PbHashKvRequest, PbHashKvResponse, PbHashRequest,
    PbHashResponse, PbMaintenanceService, PbMoveLeaderRequest, PbMoveLeaderResponse,
    PbSnapshotRequest, PbSnapshotResponse, PbStatusRequest, PbStatusResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::etcd::api::{EtcdApi, Route};
use crate::etcd::errors::{self, unimplemented};
use crate::state::alarms::{alarm_name, Alarms, ALARMS_ROW, CORRUPT};
use crate::state::command::{Command, Outcome};

type Reply<T> = Result<Response<T>, Status>;

/// etcd's `AlarmAction`s.
const GET: i32 = 0;
const ACTIVATE: i32 = 1;
const DEACTIVATE: i32 = 2;
const ALARM_PATH: &str = "/etcdserverpb.Maintenance/Alarm";

/// Alarms as etcd's answer lists them.
fn members(alarms: Vec<(u64, i32)>) -> Vec<PbAlarmMember> {
    let member = |(member_id, alarm)| PbAlarmMember { member_id, alarm };
    alarms.into_iter().map(member).collect()
}

impl EtcdApi {
    /// The raised alarms matching the request's member and type, read linearizably here, or
    /// on the leader when this node cannot.
    async fn alarm_get(&self, req: Request<PbAlarmRequest>) -> Reply<PbAlarmResponse> {
        let read = |p: &crate::state::mvcc::Pinned| p.read(|r| r.meta(ALARMS_ROW));
        let row = match self.read(false, read).await? {
            Some(row) => row.map_err(errors::mvcc)?,
            None => match self.route(&req)? {
                Route::Leader(addr) => {
                    let fwd = self.0.fwd.unary(&addr, ALARM_PATH, req.into_inner());
                    return Ok(Response::new(fwd.await?));
                }
                Route::Here => return Err(errors::no_leader()),
            },
        };
        let alarms = match row {
            Some(row) => Alarms::decode(&row).map_err(|e| Status::internal(e.to_string()))?,
            None => Alarms::default(),
        };
        let r = req.get_ref();
        Ok(Response::new(PbAlarmResponse {
            header: self.header_now(),
            alarms: members(alarms.list(r.member_id, r.alarm)),
        }))
    }
}

/// The version `Status` reports: the etcd API version this store speaks, as plain `X.Y.Z`
/// (tools gate features on it, and some parse every part as an integer).
pub const VERSION: &str = crate::etcd::probes::ETCD_SERVER_VERSION;

impl EtcdApi {
    /// The keyspace's hash at `rev` (0: now), the revision hashed and the compacted revision.
    async fn hash_at(&self, rev: i64) -> Result<(u32, i64, i64), Status> {
        let hashed = self
            .read_here(true, move |p| {
                p.read(|m| Ok((m.hash_at(rev)?, m.compacted())))
            })
            .await?;
        let ((hash, rev), compacted) = hashed.map_err(errors::mvcc)?;
        Ok((hash, rev, compacted))
    }
}

/// How long `MoveLeader` waits for the transferee to lead.
const MOVE_LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[tonic::async_trait]
impl PbMaintenanceService for EtcdApi {
    /// `GET` lists the raised alarms (a linearizable read); `ACTIVATE` and `DEACTIVATE` go
    /// through raft on the leader and answer the alarm they changed (none when it was already
    /// so), as etcd's.
    async fn alarm(&self, req: Request<PbAlarmRequest>) -> Reply<PbAlarmResponse> {
        let r = *req.get_ref();
        let activate = match r.action {
            GET => return self.alarm_get(req).await,
            ACTIVATE => true,
            DEACTIVATE => false,
            other => {
                return Err(Status::invalid_argument(format!(
                    "etcdserver: unknown alarm action {other}"
                )))
            }
        };
        if !(0..=CORRUPT).contains(&r.alarm) {
            return Err(Status::invalid_argument(format!(
                "etcdserver: unknown alarm type {}",
                r.alarm
            )));
        }
        if let Route::Leader(addr) = self.route(&req)? {
            let fwd = self.0.fwd.unary(&addr, ALARM_PATH, req.into_inner());
            return Ok(Response::new(fwd.await?));
        }
        let cmd = Command::EtcdAlarm {
            activate,
            member: r.member_id,
            alarm: r.alarm,
        };
        match self.propose(cmd, Vec::new()).await? {
            Outcome::Alarms(changed) => Ok(Response::new(PbAlarmResponse {
                header: self.header_now(),
                alarms: members(changed),
            })),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn status(&self, _: Request<PbStatusRequest>) -> Reply<PbStatusResponse> {
        let status = self.app().status();
        let errors = self
            .alarms()?
            .list(0, 0)
            .into_iter()
            .map(|(m, a)| format!("memberID:{m} alarm:{} ", alarm_name(a)))
            .collect();
        let db_size = self.keyspace().engine().file_bytes() as i64;
        let id = self.app().opts.id;
        Ok(Response::new(PbStatusResponse {
            header: self.header_now(),
            version: VERSION.into(),
            db_size,
            leader: status.leader_id.unwrap_or(0),
            raft_index: status.commit,
            raft_term: status.term,
            raft_applied_index: status.applied,
            db_size_in_use: db_size,
            is_learner: status.conf.learners.contains(&id),
            storage_version: "3.4.0".into(),
            db_size_quota: self.app().opts.quota_backend_bytes as i64,
            errors,
            ..Default::default()
        }))
    }

    /// Rewrites the state engine's tables so that space compactions freed goes back to the
    /// file system (this member only, as etcd's), on a thread of its own: batches go on.
    async fn defragment(&self, _: Request<PbDefragmentRequest>) -> Reply<PbDefragmentResponse> {
        let engine = self.keyspace().engine().clone();
        let done = tokio::task::spawn_blocking(move || engine.compact_file()).await;
        match done {
            Ok(Ok(_bytes)) => Ok(Response::new(PbDefragmentResponse {
                header: self.header_now(),
            })),
            Ok(Err(e)) => Err(Status::unavailable(format!("etcdserver: defragment: {e}"))),
            Err(e) => Err(Status::internal(format!("defragment: {e}"))),
        }
    }

    /// The hash of the keyspace now (etcd hashes its whole backend file; the store hashes
    /// the keyspace as `HashKV` does).
    async fn hash(&self, _: Request<PbHashRequest>) -> Reply<PbHashResponse> {
        let (hash, rev, _) = self.hash_at(0).await?;
        Ok(Response::new(PbHashResponse {
            header: self.header(rev),
            hash,
        }))
    }

    /// The hash of this member's keyspace at a revision (0: now), read on a thread of its own
    /// from one view of the state: every member that applied as far gives the same hash.
    async fn hash_kv(&self, req: Request<PbHashKvRequest>) -> Reply<PbHashKvResponse> {
        let (hash, rev, compact_revision) = self.hash_at(req.get_ref().revision).await?;
        Ok(Response::new(PbHashKvResponse {
            header: self.header(rev),
            hash,
            compact_revision,
            hash_revision: rev,
        }))
    }

    type SnapshotStream = Pin<Box<dyn Stream<Item = Result<PbSnapshotResponse, Status>> + Send>>;

    async fn snapshot(&self, _: Request<PbSnapshotRequest>) -> Reply<Self::SnapshotStream> {
        Err(unimplemented(
            "Snapshot is not served: back up a node's data dir (see docs/kv.md)",
        ))
    }

    /// Moves the leadership to a voter, as etcd 3.4: asked of the leader (elsewhere: "not
    /// leader", and `etcdctl move-leader` finds the leader itself), answered once this node
    /// knows the transferee leads, or "leader transfer took too long" after 5 s.
    async fn move_leader(&self, req: Request<PbMoveLeaderRequest>) -> Reply<PbMoveLeaderResponse> {
        let to = req.get_ref().target_id;
        let app = self.app();
        if !self.group().leadership.get().0 {
            return Err(Status::failed_precondition("etcdserver: not leader"));
        }
        if to == app.opts.id {
            return Ok(Response::new(PbMoveLeaderResponse {
                header: self.header_now(),
            }));
        }
        if !app.status().conf.voters.contains(&to) {
            return Err(Status::failed_precondition(
                "etcdserver: bad leader transferee",
            ));
        }
        app.first()
            .send(crate::raft::requests::Request::Transfer { to })
            .map_err(|_| errors::too_many_requests())?;
        let deadline = std::time::Instant::now() + MOVE_LEADER_WAIT;
        loop {
            let (leads, leader) = self.group().leadership.get();
            if !leads && leader == Some(to) {
                return Ok(Response::new(PbMoveLeaderResponse {
                    header: self.header_now(),
                }));
            }
            if std::time::Instant::now() >= deadline {
                return Err(Status::deadline_exceeded(
                    "etcdserver: request timed out, leader transfer took too long",
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    async fn downgrade(&self, _: Request<PbDowngradeRequest>) -> Reply<PbDowngradeResponse> {
        Err(unimplemented("Downgrade is not served by this store"))
    }
}
