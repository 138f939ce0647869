//! Calls to the leader's etcd API, for a node that does not lead: one gRPC channel per address
//! (made lazily, kept), the request marked as forwarded (see [`FORWARDED`]).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Status;
use tonic_prost::ProstCodec;

use crate::etcd::errors;

/// The metadata a forwarded request carries: the leader it reaches answers it or refuses it,
/// and never forwards it again (leadership may have moved on; two hops could loop).
pub const FORWARDED: &str = "x-raft-lease-forwarded";

/// The largest answer a forwarded call takes from the leader: etcd's clients take answers up to
/// 2 GiB (a range of a whole large keyspace), so a follower relays what the leader would answer
/// itself. Requests keep their own limits, on the server that receives them.
pub const MAX_ANSWER_BYTES: usize = i32::MAX as usize;

/// How long a forwarded call may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(6);

/// gRPC channels to other nodes' etcd APIs: per address, one for single calls and one for
/// relayed streams, so that long-lived keep-alive streams (a connection carries at most
/// `serve::MAX_STREAMS_PER_CONNECTION`) never hold up a forwarded write or read.
pub struct Forwarder {
    /// `Some`: the nodes serve TLS, with certificates the CA signs.
    tls: Option<ClientTlsConfig>,
    /// By (address, for streams).
    channels: Mutex<HashMap<(String, bool), Channel>>,
}

impl Forwarder {
    /// A forwarder to plaintext APIs (`ca: None`) or to TLS ones whose certificates `ca` signs.
    pub fn new(ca_pem: Option<Vec<u8>>) -> Self {
        Forwarder {
            tls: ca_pem
                .map(|pem| ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))),
            channels: Mutex::new(HashMap::new()),
        }
    }

    fn channel(&self, addr: &str, streams: bool) -> Result<Channel, Status> {
        let key = (addr.to_string(), streams);
        if let Some(c) = self.channels.lock().get(&key) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let bad = |e: tonic::transport::Error| {
            Status::unavailable(format!("etcdserver: leader address {addr}: {e}"))
        };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(bad)?
            .timeout(FORWARD_TIMEOUT)
            .connect_timeout(Duration::from_secs(2));
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.clone()).map_err(bad)?;
        }
        let c = ep.connect_lazy();
        self.channels.lock().insert(key, c.clone());
        Ok(c)
    }

    fn request<T>(msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.metadata_mut()
            .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        req
    }

    /// A client of `addr` ready for a call to `path`, with its codec.
    async fn ready<Q, A>(
        &self,
        addr: &str,
        streams: bool,
        path: &'static str,
    ) -> Result<(Grpc<Channel>, ProstCodec<Q, A>, PathAndQuery), Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = Grpc::new(self.channel(addr, streams)?)
            .max_decoding_message_size(MAX_ANSWER_BYTES)
            .max_encoding_message_size(MAX_ANSWER_BYTES);
        grpc.ready().await.map_err(|_| errors::no_leader())?;
        Ok((grpc, ProstCodec::default(), PathAndQuery::from_static(path)))
    }

    /// Call `path` (`/etcdserverpb.KV/Put`, say) on `addr` with `msg`.
    pub async fn unary<Q, A>(&self, addr: &str, path: &'static str, msg: Q) -> Result<A, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let (mut grpc, codec, path) = self.ready::<Q, A>(addr, false, path).await?;
        grpc.unary(Self::request(msg), path, codec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(unreachable_leader)
    }

    /// Open the bidirectional stream `path` on `addr`, sending `out`'s messages.
    pub async fn streaming<Q, A, S>(
        &self,
        addr: &str,
        path: &'static str,
        out: S,
    ) -> Result<tonic::Streaming<A>, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
        S: tokio_stream::Stream<Item = Q> + Send + 'static,
    {
        let (mut grpc, codec, path) = self.ready::<Q, A>(addr, true, path).await?;
        grpc.streaming(Self::request(out), path, codec)
            .await
            .map(tonic::Response::into_inner)
            .map_err(unreachable_leader)
    }
}

/// The leader's own answers pass through. A failure of the transport (a reset, a timeout)
/// may come after the request reached the leader, so a write may have applied: it is etcd's
/// "request timed out", never "no leader" (which says nothing was proposed). Clients retry
/// reads on either.
fn unreachable_leader(s: Status) -> Status {
    let ours = s.message().starts_with("etcdserver:") || s.message().starts_with("mvcc:");
    match s.code() {
        tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Cancelled if !ours => {
            errors::timed_out()
        }
        tonic::Code::DeadlineExceeded => errors::timed_out(),
        _ => s,
    }
}
