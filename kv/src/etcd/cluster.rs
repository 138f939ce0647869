//! etcd's Cluster service: `MemberList` from the configuration this node applied and its
//! address book. Membership changes stay on the admin API (they need its bearer token): the
//! gRPC calls answer etcd's permission-denied with where to go.

use etcd_client::proto::{
    PbClusterService, PbMember as Member, PbMemberAddRequest, PbMemberAddResponse,
    PbMemberListRequest, PbMemberListResponse, PbMemberPromoteRequest, PbMemberPromoteResponse,
    PbMemberRemoveRequest, PbMemberRemoveResponse, PbMemberUpdateRequest, PbMemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::etcd::api::EtcdApi;
use crate::etcd::errors::permission_denied;

type Reply<T> = Result<Response<T>, Status>;

const USE_ADMIN: &str = "membership changes go through the store's admin API: POST /admin/members \
                         with the admin token, or `kv node --join` (see docs/kv.md)";

impl EtcdApi {
    /// Every voter and learner of the applied configuration.
    pub fn members(&self) -> Vec<Member> {
        let conf = self.app().status().conf;
        let book = self.group().members.read();
        let scheme = if self.app().scheme == "https" {
            "https"
        } else {
            "http"
        };
        let member = |id: u64, is_learner: bool| Member {
            id,
            name: format!("node-{id}"),
            peer_ur_ls: book
                .addrs
                .get(&id)
                .map(|a| vec![format!("https://{}", a.peer)])
                .unwrap_or_default(),
            client_ur_ls: book
                .addrs
                .get(&id)
                .and_then(|a| a.etcd.clone())
                .or_else(|| self.app().opts.etcd_of(id))
                .map(|a| vec![format!("{scheme}://{a}")])
                .unwrap_or_default(),
            is_learner,
        };
        let voters = conf.voters.iter().map(|&id| member(id, false));
        voters
            .chain(conf.learners.iter().map(|&id| member(id, true)))
            .collect()
    }
}

#[tonic::async_trait]
impl PbClusterService for EtcdApi {
    async fn member_add(&self, _: Request<PbMemberAddRequest>) -> Reply<PbMemberAddResponse> {
        Err(permission_denied(USE_ADMIN))
    }

    async fn member_remove(
        &self,
        _: Request<PbMemberRemoveRequest>,
    ) -> Reply<PbMemberRemoveResponse> {
        Err(permission_denied(USE_ADMIN))
    }

    async fn member_update(
        &self,
        _: Request<PbMemberUpdateRequest>,
    ) -> Reply<PbMemberUpdateResponse> {
        Err(permission_denied(USE_ADMIN))
    }

    async fn member_list(&self, _: Request<PbMemberListRequest>) -> Reply<PbMemberListResponse> {
        Ok(Response::new(PbMemberListResponse {
            header: self.header_now(),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        _: Request<PbMemberPromoteRequest>,
    ) -> Reply<PbMemberPromoteResponse> {
        Err(permission_denied(USE_ADMIN))
    }
}
