//! etcd's KV service: `Range`, `Put`, `DeleteRange`, `Txn` and `Compact`. Every write is one
//! raft entry holding etcd's own `TxnRequest` (a put or a delete is a transaction of one
//! operation); a range is served from this node's state, linearizably unless `serializable`.

use etcd_client::proto::{
    PbCompactionRequest as CompactionRequest, PbCompactionResponse as CompactionResponse,
    PbDeleteRequest as DeleteRangeRequest, PbDeleteResponse as DeleteRangeResponse, PbKvService,
    PbPutRequest as PutRequest, PbPutResponse as PutResponse, PbRangeRequest as RangeRequest,
    PbRangeResponse as RangeResponse, PbRangeStreamResponse as RangeStreamResponse,
    PbTxnOpRequest as Op, PbTxnOpResponse as OpResponse, PbTxnRequest as TxnRequest,
    PbTxnRequestOp, PbTxnResponse as TxnResponse,
};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::etcd::api::{EtcdApi, Route};
use crate::etcd::errors;
use crate::state::command::{Command, Outcome};
use crate::state::mvcc::{range, txn, txn::TxnDone, MvccError, Pinned, Reader};

type Reply<T> = Result<Response<T>, Status>;

impl EtcdApi {
    /// Serve a range here (`None`: forward it).
    async fn range_here(&self, r: &RangeRequest) -> Result<Option<RangeResponse>, Status> {
        range::check(r).map_err(errors::mvcc)?;
        let read = {
            let r = r.clone();
            move |p: &Pinned| p.read(|m| m.range(&r, m.rev()).map(|got| (got, m.rev())))
        };
        let long = !r.range_end.is_empty();
        let got = match r.serializable {
            true => Some(self.read_here(long, read).await?),
            false => self.read(long, read).await?,
        };
        let Some(got) = got else { return Ok(None) };
        let (got, rev) = got.map_err(errors::mvcc)?;
        Ok(Some(RangeResponse {
            header: self.header(rev),
            kvs: got.kvs,
            more: got.more,
            count: got.count,
        }))
    }

    /// Run `t` through raft on the leader (forwarded from elsewhere), with its leases checked
    /// live in the leader's memory.
    async fn txn_here(&self, t: TxnRequest) -> Result<TxnDone, Status> {
        txn::check(&t).map_err(errors::mvcc)?;
        self.check_size(t.encoded_len())?;
        // A transaction that deletes nothing grows the state by its puts alone: no view needed.
        let (puts, dels) = match Reader::deletes(&t) {
            true => self.keyspace().read(|m| m.growth_bytes(&t)),
            false => Reader::put_growth_bytes(&t).map(|p| (p, 0)),
        }
        .map_err(errors::mvcc)?;
        self.check_space(puts, dels).await?;
        match self.propose(Command::EtcdTxn {}, t.encode_to_vec()).await? {
            Outcome::Etcd(done) => done.map_err(errors::mvcc),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// A transaction that only reads, served here as a linearizable read (under the lease, a
    /// follower read lease, or after a ReadIndex round): no raft entry. `None`: forward it.
    async fn txn_read_here(&self, t: &TxnRequest) -> Result<Option<TxnResponse>, Status> {
        txn::check(t).map_err(errors::mvcc)?;
        let t = t.clone();
        let read = move |p: &Pinned| p.read(|m| m.txn_read(&t));
        let Some(done) = self.read(true, read).await? else {
            return Ok(None);
        };
        let done = done.map_err(errors::mvcc)?;
        Ok(Some(TxnResponse {
            header: self.header(done.revision),
            succeeded: done.succeeded,
            responses: done.responses,
        }))
    }

    async fn txn_routed(&self, req: Request<TxnRequest>) -> Result<TxnResponse, Status> {
        if Reader::read_only(req.get_ref()) {
            if let Some(resp) = self.txn_read_here(req.get_ref()).await? {
                return Ok(resp);
            }
        }
        match self.route(&req)? {
            Route::Leader(addr) => {
                let mut resp: TxnResponse = self
                    .0
                    .fwd
                    .unary(&addr, "/etcdserverpb.KV/Txn", req.into_inner())
                    .await?;
                resp.header = self.answered_here(resp.header).await;
                Ok(resp)
            }
            Route::Here => {
                let done = self.txn_here(req.into_inner()).await?;
                Ok(TxnResponse {
                    header: self.header(done.revision),
                    succeeded: done.succeeded,
                    responses: done.responses,
                })
            }
        }
    }

    /// A single operation as a transaction, through [`EtcdApi::txn_routed`]; its answer.
    async fn one_op(&self, req: &Request<impl Clone>, op: Op) -> Result<(OpResponse, i64), Status> {
        let t = TxnRequest {
            success: vec![PbTxnRequestOp { request: Some(op) }],
            ..Default::default()
        };
        let mut fwd = Request::new(t);
        *fwd.metadata_mut() = req.metadata().clone();
        let done = self.txn_routed(fwd).await?;
        let rev = done.header.as_ref().map_or(0, |h| h.revision);
        let resp = done.responses.into_iter().next().and_then(|r| r.response);
        let resp =
            resp.ok_or_else(|| Status::internal("a transaction of one operation answered none"))?;
        Ok((resp, rev))
    }
}

#[tonic::async_trait]
impl PbKvService for EtcdApi {
    async fn range(&self, req: Request<RangeRequest>) -> Reply<RangeResponse> {
        let r = req.get_ref();
        self.check_size(r.encoded_len())?;
        if let Some(resp) = self.range_here(r).await? {
            return Ok(Response::new(resp));
        }
        match self.route(&req)? {
            Route::Leader(addr) => {
                let resp = self
                    .0
                    .fwd
                    .unary(&addr, "/etcdserverpb.KV/Range", req.into_inner())
                    .await?;
                Ok(Response::new(resp))
            }
            // Leadership came here meanwhile: try once more, then give up.
            Route::Here => match self.range_here(req.get_ref()).await? {
                Some(resp) => Ok(Response::new(resp)),
                None => Err(errors::leader_changed()),
            },
        }
    }

    type RangeStreamStream = tokio_stream::Once<Result<RangeStreamResponse, Status>>;

    async fn range_stream(&self, req: Request<RangeRequest>) -> Reply<Self::RangeStreamStream> {
        // One chunk holding the whole answer (a merge of one response is itself).
        let resp = self.range(req).await?.into_inner();
        let chunk = RangeStreamResponse {
            range_response: Some(resp),
        };
        Ok(Response::new(tokio_stream::once(Ok(chunk))))
    }

    async fn put(&self, req: Request<PutRequest>) -> Reply<PutResponse> {
        txn::check_put(req.get_ref()).map_err(errors::mvcc)?;
        let op = Op::RequestPut(req.get_ref().clone());
        match self.one_op(&req, op).await? {
            (OpResponse::ResponsePut(mut p), rev) => {
                p.header = self.header(rev);
                Ok(Response::new(p))
            }
            (other, _) => Err(Status::internal(format!("a put answered {other:?}"))),
        }
    }

    async fn delete_range(&self, req: Request<DeleteRangeRequest>) -> Reply<DeleteRangeResponse> {
        if req.get_ref().key.is_empty() {
            return Err(errors::mvcc(MvccError::EmptyKey));
        }
        let op = Op::RequestDeleteRange(req.get_ref().clone());
        match self.one_op(&req, op).await? {
            (OpResponse::ResponseDeleteRange(mut d), rev) => {
                d.header = self.header(rev);
                Ok(Response::new(d))
            }
            (other, _) => Err(Status::internal(format!("a delete answered {other:?}"))),
        }
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Reply<TxnResponse> {
        txn::check(req.get_ref()).map_err(errors::mvcc)?;
        Ok(Response::new(self.txn_routed(req).await?))
    }

    async fn compact(&self, req: Request<CompactionRequest>) -> Reply<CompactionResponse> {
        match self.route(&req)? {
            Route::Leader(addr) => {
                let mut resp: CompactionResponse = self
                    .0
                    .fwd
                    .unary(&addr, "/etcdserverpb.KV/Compact", req.into_inner())
                    .await?;
                resp.header = self.answered_here(resp.header).await;
                Ok(Response::new(resp))
            }
            Route::Here => {
                let revision = req.get_ref().revision;
                match self
                    .propose(Command::EtcdCompact { revision }, Vec::new())
                    .await?
                {
                    Outcome::EtcdCompacted(Ok(rev)) => Ok(Response::new(CompactionResponse {
                        header: self.header(rev),
                    })),
                    Outcome::EtcdCompacted(Err(e)) => Err(errors::mvcc(e)),
                    other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
                }
            }
        }
    }
}
