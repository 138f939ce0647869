//! etcd's Lease service. A lease is one of the store's sessions (`state::sessions_local`): its
//! grant and revocation are raft entries, and a keep-alive is answered by the leader from its
//! memory under its leader lease, with no raft entry (read first, validate second), exactly as
//! the HTTP API's keep-alives. The lease's id is the session's, a positive int64, and the
//! fencing token a recipe needs (`ETCD_LOCK_REV` is the key's create revision, as in etcd).

use std::pin::Pin;

use etcd_client::proto::{
    PbLeaseGrantRequest as GrantRequest, PbLeaseGrantResponse as GrantResponse,
    PbLeaseKeepAliveRequest as KeepAliveRequest, PbLeaseKeepAliveResponse as KeepAliveResponse,
    PbLeaseLeasesRequest as LeasesRequest, PbLeaseLeasesResponse as LeasesResponse,
    PbLeaseRevokeRequest as RevokeRequest, PbLeaseRevokeResponse as RevokeResponse, PbLeaseService,
    PbLeaseStatus as LeaseStatus, PbLeaseTimeToLiveRequest as TtlRequest,
    PbLeaseTimeToLiveResponse as TtlResponse,
};
use raft_lease::Clock;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::etcd::api::{EtcdApi, Route};
use crate::etcd::errors;
use crate::state::command::{Command, Outcome, Refusal};
use crate::state::kv_state::session_config;
use crate::state::mvcc::MvccError;

type Reply<T> = Result<Response<T>, Status>;

/// The longest TTL a lease may have, in seconds (the sessions' bound).
pub fn max_ttl_s() -> i64 {
    (session_config().max_term_ms / 1000) as i64
}

impl EtcdApi {
    /// The shortest TTL granted, in seconds: etcd's rule, one and a half election timeouts,
    /// so that a lease outlives a leader's failover.
    fn min_ttl_s(&self) -> i64 {
        (self.app().opts.election_ms * 3).div_ceil(2000).max(1) as i64
    }

    /// Refresh lease `id` on this node, the leader: its TTL in seconds (0: it is gone), or
    /// `None` when no answer can be given now (no valid lease: the client sends again).
    async fn keepalive_one(&self, id: i64) -> Result<Option<i64>, Status> {
        let g = self.group().clone();
        if !g.leadership.get().0 {
            return Err(errors::leader_changed());
        }
        let term = g.leadership.term();
        let ids = [id.max(0) as u64];
        // The read handle also serves follower read leases: the role and term are checked
        // inside, so a node that stepped down meanwhile refreshes nothing.
        let refresh = || {
            if g.leadership.get().0 && g.leadership.term() == term {
                let now_ns = g.clock.now_ns();
                g.machine.write().keepalive_local(&ids, term, now_ns)
            } else {
                Err(Refusal::NotReady)
            }
        };
        let handle = g.handle.clone();
        let local = match self.app().opts.unsafe_keepalive_without_lease {
            true => refresh(),
            false => match handle.try_read(refresh) {
                Ok(l) => l,
                // Applies to wait for: spin off the runtime's worker.
                Err(_) if handle.lease_held() => {
                    match tokio::task::block_in_place(|| handle.read(refresh)) {
                        Ok(l) => l,
                        Err(_) => return Ok(None),
                    }
                }
                Err(_) => return Ok(None),
            },
        };
        let Ok(ka) = local else { return Ok(None) };
        if !ka.unknown.is_empty() || id <= 0 {
            return Ok(Some(0));
        }
        if !ka.via_raft.is_empty() {
            let cmd = Command::SessionKeepalive {
                ids: ka.via_raft,
                now_ns: 0,
            };
            match self.propose(cmd, Vec::new()).await? {
                Outcome::KeepAlive { .. } => {}
                _ => return Ok(None),
            }
        }
        Ok(Some(self.granted_ttl_s(id).unwrap_or(0)))
    }

    /// The TTL lease `id` was granted, in seconds.
    fn granted_ttl_s(&self, id: i64) -> Option<i64> {
        let m = self.group().machine.read();
        let found = m.sessions.expiries().find(|(s, _, _)| s.0 as i64 == id);
        found.map(|(_, ttl_ms, _)| (ttl_ms / 1000) as i64)
    }

    fn time_to_live(&self, r: &TtlRequest) -> TtlResponse {
        let g = self.group();
        let now_ns = g.clock.now_ns();
        let m = g.machine.read();
        let found = m.sessions.expiries().find(|(s, _, _)| s.0 as i64 == r.id);
        let header = self.header(self.keyspace().rev());
        let Some((_, ttl_ms, expiry_ns)) = found else {
            return TtlResponse {
                header,
                id: r.id,
                ttl: -1,
                ..Default::default()
            };
        };
        let granted = (ttl_ms / 1000) as i64;
        let left = (expiry_ns.saturating_sub(now_ns) / 1_000_000_000) as i64;
        TtlResponse {
            header,
            id: r.id,
            ttl: left.min(granted),
            granted_ttl: granted,
            keys: match r.keys {
                true => self
                    .keyspace()
                    .read(|k| k.lease_keys(r.id))
                    .unwrap_or_default(),
                false => Vec::new(),
            },
        }
    }
}

/// What a lease grant is charged against the quota.
const LEASE_COST_BYTES: u64 = 64;

/// A stream of keep-alive answers.
pub type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<KeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PbLeaseService for EtcdApi {
    async fn lease_grant(&self, req: Request<GrantRequest>) -> Reply<GrantResponse> {
        let r = req.get_ref();
        if r.id != 0 {
            return Err(Status::invalid_argument(
                "etcdserver: this store picks lease IDs: grant with ID 0",
            ));
        }
        if r.ttl > max_ttl_s() {
            return Err(Status::out_of_range("etcdserver: too large lease TTL"));
        }
        let ttl = r.ttl.max(self.min_ttl_s());
        if let Route::Leader(addr) = self.route(&req)? {
            let resp = self
                .0
                .fwd
                .unary(&addr, "/etcdserverpb.Lease/LeaseGrant", req.into_inner());
            return Ok(Response::new(resp.await?));
        }
        // A lease is held in the state too (etcd charges a grant against its quota).
        self.check_space(LEASE_COST_BYTES, 0).await?;
        let cmd = Command::SessionGrant {
            ttl_ms: ttl as u64 * 1000,
            now_ns: 0,
        };
        match self.propose(cmd, Vec::new()).await? {
            Outcome::Session(id) => Ok(Response::new(GrantResponse {
                header: self.header_now(),
                id: id as i64,
                ttl,
                error: String::new(),
            })),
            Outcome::Refused(Refusal::BadTtl { .. }) => {
                Err(Status::out_of_range("etcdserver: too large lease TTL"))
            }
            Outcome::Refused(Refusal::NoSpace) => Err(errors::mvcc(MvccError::NoSpace)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn lease_revoke(&self, req: Request<RevokeRequest>) -> Reply<RevokeResponse> {
        let id = req.get_ref().id;
        if id <= 0 {
            return Err(errors::lease_not_found());
        }
        if let Route::Leader(addr) = self.route(&req)? {
            let mut resp: RevokeResponse = self
                .0
                .fwd
                .unary(&addr, "/etcdserverpb.Lease/LeaseRevoke", req.into_inner())
                .await?;
            resp.header = self.answered_here(resp.header).await;
            return Ok(Response::new(resp));
        }
        match self
            .propose(Command::SessionRevoke { id: id as u64 }, Vec::new())
            .await?
        {
            Outcome::Revoked => Ok(Response::new(RevokeResponse {
                header: self.header_now(),
            })),
            Outcome::Refused(Refusal::UnknownSession(_)) => Err(errors::lease_not_found()),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<KeepAliveRequest>>,
    ) -> Reply<Self::LeaseKeepAliveStream> {
        if let Route::Leader(addr) = self.route(&req)? {
            // Relay the stream to the leader; it ends when either side does.
            let inbound = req.into_inner().map_while(Result::ok);
            let path = "/etcdserverpb.Lease/LeaseKeepAlive";
            let answers = self.0.fwd.streaming(&addr, path, inbound).await?;
            return Ok(Response::new(Box::pin(answers)));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let api = self.clone();
        let mut inbound = req.into_inner();
        tokio::spawn(async move {
            while let Some(Ok(r)) = inbound.next().await {
                let answer = match api.keepalive_one(r.id).await {
                    Ok(None) => continue,
                    Ok(Some(ttl)) => Ok(KeepAliveResponse {
                        header: api.header_now(),
                        id: r.id,
                        ttl,
                    }),
                    Err(e) => Err(e),
                };
                let end = answer.is_err();
                if tx.send(answer).await.is_err() || end {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn lease_time_to_live(&self, req: Request<TtlRequest>) -> Reply<TtlResponse> {
        match self.route(&req)? {
            Route::Leader(addr) => {
                let path = "/etcdserverpb.Lease/LeaseTimeToLive";
                Ok(Response::new(
                    self.0.fwd.unary(&addr, path, req.into_inner()).await?,
                ))
            }
            Route::Here => Ok(Response::new(self.time_to_live(req.get_ref()))),
        }
    }

    async fn lease_leases(&self, _req: Request<LeasesRequest>) -> Reply<LeasesResponse> {
        let m = self.group().machine.read();
        let leases = m
            .sessions
            .expiries()
            .map(|(id, _, _)| LeaseStatus { id: id.0 as i64 })
            .collect();
        Ok(Response::new(LeasesResponse {
            header: self.header(self.keyspace().rev()),
            leases,
        }))
    }
}
