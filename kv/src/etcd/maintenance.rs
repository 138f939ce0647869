//! etcd's Maintenance service: `Status` (what `etcdctl endpoint status` prints), `Alarm` (none
//! is ever raised: a full store refuses writes with etcd's "database space exceeded" instead),
//! and `Defragment` (nothing to do). Snapshots, hashes and downgrades are not served; moving
//! the leader stays on the admin API.

use std::pin::Pin;

use etcd_client::proto::{
    PbAlarmRequest, PbAlarmResponse, PbDefragmentRequest, PbDefragmentResponse, PbDowngradeRequest,
    PbDowngradeResponse, PbHashKvRequest, PbHashKvResponse, PbHashRequest, PbHashResponse,
    PbMaintenanceService, PbMoveLeaderRequest, PbMoveLeaderResponse, PbSnapshotRequest,
    PbSnapshotResponse, PbStatusRequest, PbStatusResponse,
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::etcd::api::EtcdApi;
use crate::etcd::errors::{permission_denied, unimplemented};

type Reply<T> = Result<Response<T>, Status>;

/// The version `Status` reports: the etcd API version this store speaks, and what it is (tools
/// gate features on the etcd version; the build metadata names the server).
pub const VERSION: &str = concat!("3.4.0+raft-lease-kv.", env!("CARGO_PKG_VERSION"));

#[tonic::async_trait]
impl PbMaintenanceService for EtcdApi {
    async fn alarm(&self, _: Request<PbAlarmRequest>) -> Reply<PbAlarmResponse> {
        Ok(Response::new(PbAlarmResponse {
            header: self.header_now(),
            alarms: Vec::new(),
        }))
    }

    async fn status(&self, _: Request<PbStatusRequest>) -> Reply<PbStatusResponse> {
        let status = self.app().status();
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
            db_size_quota: self.app().opts.max_state_bytes as i64,
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

    async fn hash(&self, _: Request<PbHashRequest>) -> Reply<PbHashResponse> {
        Err(unimplemented("Hash is not served by this store"))
    }

    async fn hash_kv(&self, _: Request<PbHashKvRequest>) -> Reply<PbHashKvResponse> {
        Err(unimplemented("HashKV is not served by this store"))
    }

    type SnapshotStream = Pin<Box<dyn Stream<Item = Result<PbSnapshotResponse, Status>> + Send>>;

    async fn snapshot(&self, _: Request<PbSnapshotRequest>) -> Reply<Self::SnapshotStream> {
        Err(unimplemented(
            "Snapshot is not served: back up a node's data dir (see docs/kv.md)",
        ))
    }

    async fn move_leader(&self, _: Request<PbMoveLeaderRequest>) -> Reply<PbMoveLeaderResponse> {
        Err(permission_denied(
            "leadership moves through the store's admin API: POST /admin/transfer with the admin token",
        ))
    }

    async fn downgrade(&self, _: Request<PbDowngradeRequest>) -> Reply<PbDowngradeResponse> {
        Err(unimplemented("Downgrade is not served by this store"))
    }
}
