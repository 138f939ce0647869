//! What `kv bench --data-scale` asks one member at a time through etcd's gRPC API: its status
//! (who leads, the raft term), whether it serves a linearizable read yet, how many keys it
//! holds; the same calls for the store and for etcd.

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, KvClient};

/// How long one status or probing read may take before it counts as failed.
const ASK_TIMEOUT_MS: u64 = 2_000;

/// How long to wait between two attempts of a read that is waited for.
const RETRY_MS: u64 = 20;

/// The largest answer the bench's clients decode, bytes (etcd's own clients allow 2 GiB).
pub const MAX_ANSWER_BYTES: usize = i32::MAX as usize;

/// The key every wait for a linearizable read asks for (the load writes it first).
pub const FIRST_KEY: &str = "key/0000000000";

/// A client of the members `endpoints` (requests spread over them; a follower forwards what
/// it cannot serve to the leader).
pub async fn connect(endpoints: &[String]) -> Result<Client, String> {
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_millis(ASK_TIMEOUT_MS));
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| format!("connect to {endpoints:?}: {e}"))
}

/// `client`'s KV service, decoding answers of up to [`MAX_ANSWER_BYTES`].
pub fn kv(client: &Client) -> KvClient {
    client
        .kv_client()
        .max_decoding_message_size(MAX_ANSWER_BYTES)
}

/// Whether `e` says the request was never sent: the member's port refused the connection
/// (tonic's "tcp connect error", status `Unavailable`).
pub fn refused(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        _ => false,
    }
}

/// Whether `e` says the connection to the member broke while the request was in flight (the
/// client's own status for a reset or closed connection, not an answer from a server): the
/// member died under it, as when the bench kills it. Such a put's outcome is unknown, and a
/// client sends it again elsewhere (a put of the same key and value).
pub fn connection_lost(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            tonic::Code::Unknown => s.message() == "transport error",
            tonic::Code::Cancelled => s.message().contains("operation was canceled"),
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// `fut` within `ms` milliseconds, its error and the timeout's as text.
pub async fn within<T, E: std::fmt::Display>(
    ms: u64,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_millis(ms), fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {ms} ms")),
    }
}

/// One member's `Status`.
#[derive(Debug, Clone, Copy)]
pub struct MemberStatus {
    /// The member's own id.
    pub member_id: u64,
    /// The id of the member it takes for the leader (0: none).
    pub leader_id: u64,
    /// Its raft term.
    pub term: u64,
}

/// The `Status` of the member at `endpoint` alone.
pub async fn status_of(endpoint: &str) -> Result<MemberStatus, String> {
    let mut c = connect(&[endpoint.to_string()]).await?;
    let s = within(ASK_TIMEOUT_MS, c.status()).await?;
    Ok(MemberStatus {
        member_id: s.header().map_or(0, |h| h.member_id()),
        leader_id: s.leader(),
        term: s.raft_term(),
    })
}

/// Who leads, as the leader says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The leader's place among the endpoints.
    pub leader_slot: usize,
    /// The leader's member id.
    pub leader_id: u64,
    /// The leader's raft term.
    pub term: u64,
}

impl View {
    /// The first member that does not lead.
    pub fn follower(&self, members: usize) -> usize {
        (0..members).find(|&s| s != self.leader_slot).unwrap_or(0)
    }
}

/// The member among `endpoints` that says it leads, within `wait`.
pub async fn view(endpoints: &[String], wait: Duration) -> Result<View, String> {
    let deadline = Instant::now() + wait;
    let mut last = String::from("no member answered");
    while Instant::now() < deadline {
        for (slot, ep) in endpoints.iter().enumerate() {
            match status_of(ep).await {
                Ok(s) if s.leader_id != 0 && s.member_id == s.leader_id => {
                    return Ok(View {
                        leader_slot: slot,
                        leader_id: s.leader_id,
                        term: s.term,
                    })
                }
                Ok(s) => last = format!("{ep}: {s:?}"),
                Err(e) => last = format!("{ep}: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "no member of {endpoints:?} led within {} s (last: {last})",
        wait.as_secs()
    ))
}

/// Wait (within `wait`) until every member answers `Status` naming one leader, which says it
/// leads; that view.
pub async fn settled(endpoints: &[String], wait: Duration) -> Result<View, String> {
    let deadline = Instant::now() + wait;
    loop {
        let v = view(
            endpoints,
            deadline.saturating_duration_since(Instant::now()),
        )
        .await?;
        let mut all = true;
        for ep in endpoints {
            all &= matches!(status_of(ep).await, Ok(s) if s.leader_id == v.leader_id);
        }
        if all {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the members of {endpoints:?} never agreed on a leader within {} s",
                wait.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One linearizable read of [`FIRST_KEY`] (its count only) from the member at `endpoint` alone.
pub async fn serves_linearizable(endpoint: &str) -> Result<(), String> {
    let c = connect(&[endpoint.to_string()]).await?;
    let mut kv = kv(&c);
    let read = kv.get(FIRST_KEY, Some(GetOptions::new().with_count_only()));
    within(ASK_TIMEOUT_MS, read).await.map(|_| ())
}

/// The instant the member at `endpoint` first serves a linearizable read, trying every
/// [`RETRY_MS`] until `deadline`.
pub async fn first_served(endpoint: &str, deadline: Instant) -> Result<Instant, String> {
    loop {
        let tried = serves_linearizable(endpoint).await;
        if tried.is_ok() {
            return Ok(Instant::now());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{endpoint} served no linearizable read in time (last: {})",
                tried.err().unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(RETRY_MS)).await;
    }
}

/// The number of keys under `prefix` that the member at `endpoint` holds, read there alone
/// (serializable).
pub async fn count_here(endpoint: &str, prefix: &str) -> Result<i64, String> {
    let c = connect(&[endpoint.to_string()]).await?;
    let options = GetOptions::new()
        .with_prefix()
        .with_count_only()
        .with_serializable();
    let mut kv = kv(&c);
    let got = within(ASK_TIMEOUT_MS * 5, kv.get(prefix, Some(options))).await?;
    Ok(got.count())
}

/// The instant the member at `endpoint` first holds `keys` keys under `prefix`, asking every
/// 50 ms until `deadline`.
pub async fn holds_all(
    endpoint: &str,
    prefix: &str,
    keys: u64,
    deadline: Instant,
) -> Result<Instant, String> {
    loop {
        let last = match count_here(endpoint, prefix).await {
            Ok(n) if n >= 0 && n as u64 >= keys => return Ok(Instant::now()),
            Ok(n) => format!("{n} keys"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{endpoint} never held the {keys} keys under {prefix:?} in time (last: {last})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
