//! etcd's errors as gRPC statuses, with etcd's codes and exact texts (clients match them by
//! text: etcd's `api/v3rpc/rpctypes/error.go`).

use tonic::{Code, Status};

use crate::state::mvcc::MvccError;

/// No leader is known (an election is under way): clients retry reads on it.
pub fn no_leader() -> Status {
    Status::new(Code::Unavailable, "etcdserver: no leader")
}

/// Leadership moved while the request was in flight.
pub fn leader_changed() -> Status {
    Status::new(Code::Unavailable, "etcdserver: leader changed")
}

/// No answer in time: a write may or may not have applied.
pub fn timed_out() -> Status {
    Status::new(Code::Unavailable, "etcdserver: request timed out")
}

/// The node is stopping.
pub fn stopping() -> Status {
    Status::new(Code::Unavailable, "etcdserver: server stopped")
}

/// Too much in flight: retry later.
pub fn too_many_requests() -> Status {
    Status::new(Code::ResourceExhausted, "etcdserver: too many requests")
}

/// A keyspace refusal.
pub fn mvcc(e: MvccError) -> Status {
    Status::new(e.code(), e.to_string())
}

/// etcd's permission-denied, with where to go instead.
pub fn permission_denied(instead: &str) -> Status {
    Status::new(
        Code::PermissionDenied,
        format!("etcdserver: permission denied: {instead}"),
    )
}

/// A call this store does not serve, saying why.
pub fn unimplemented(why: &str) -> Status {
    Status::new(Code::Unimplemented, format!("etcdserver: {why}"))
}

/// The requested lease does not exist.
pub fn lease_not_found() -> Status {
    mvcc(MvccError::LeaseNotFound)
}
