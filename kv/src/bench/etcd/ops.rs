//! The operations of `kv bench --vs-etcd`, each one client's loop through etcd's gRPC API (the
//! `etcd-client` crate), the same for the store and for etcd: a client owns one connection and
//! has one request in flight at a time.

use std::time::Instant;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseKeepAliveStream, LeaseKeeper, Txn, TxnOp,
    WatchStream,
};

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `Put` of a value on one of 1,000 keys of the client's own.
    Put,
    /// Linearizable `Range` of one of 100 keys.
    RangeLinearizable,
    /// Serializable `Range` of one of 100 keys.
    RangeSerializable,
    /// `Txn`: if the client's key holds the value it last wrote, write the next one.
    TxnCas,
    /// One keep-alive round on the client's lease's stream.
    KeepAlive,
    /// From a `Put` sent to its event arriving on the client's watch of that key.
    Watch,
}

impl Op {
    /// Every operation, in the order of the cells.
    pub const ALL: [Op; 6] = [
        Op::Put,
        Op::RangeLinearizable,
        Op::RangeSerializable,
        Op::TxnCas,
        Op::KeepAlive,
        Op::Watch,
    ];

    /// The operations named in `names` (every one if none is).
    pub fn parse(names: &[String]) -> Result<Vec<Op>, String> {
        if names.is_empty() {
            return Ok(Op::ALL.to_vec());
        }
        let find = |n: &String| {
            Op::ALL
                .into_iter()
                .find(|op| op.name() == n)
                .ok_or_else(|| {
                    let all: Vec<_> = Op::ALL.iter().map(|op| op.name()).collect();
                    format!("--ops: no operation {n:?}; there are {}", all.join(", "))
                })
        };
        names.iter().map(find).collect()
    }

    /// The name in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::RangeLinearizable => "range_linearizable",
            Op::RangeSerializable => "range_serializable",
            Op::TxnCas => "txn_cas",
            Op::KeepAlive => "lease_keepalive",
            Op::Watch => "watch_latency",
        }
    }
}

/// The keys every range reads, written before the cells.
pub const RANGE_KEYS: usize = 100;

/// A client's state made before its cell's clock starts.
pub enum Prepared {
    /// Nothing to make.
    Nothing,
    /// The client's CAS key holds `"0"`.
    Cas,
    /// The client's lease, and its keep-alive stream.
    Lease(i64, LeaseKeeper, LeaseKeepAliveStream),
    /// A watch on the client's own key.
    Watch(WatchStream),
}

fn err(e: etcd_client::Error) -> String {
    e.to_string()
}

/// Make client `i`'s state for `op`.
pub async fn prepare(op: Op, c: &mut Client, i: usize) -> Result<Prepared, String> {
    Ok(match op {
        Op::TxnCas => {
            c.put(format!("cas{i}"), "0", None).await.map_err(err)?;
            Prepared::Cas
        }
        Op::KeepAlive => {
            let id = c.lease_grant(60, None).await.map_err(err)?.id();
            let (keeper, stream) = c.lease_keep_alive(id).await.map_err(err)?;
            Prepared::Lease(id, keeper, stream)
        }
        Op::Watch => Prepared::Watch(watch_created(c, i).await?),
        _ => Prepared::Nothing,
    })
}

/// What one client measured: the latency (ns) of each operation that succeeded, and how many
/// failed.
#[derive(Default)]
pub struct Measured {
    /// Latencies of the operations that succeeded, ns.
    pub lat_ns: Vec<u64>,
    /// Operations that failed (an error answer, a CAS that did not succeed).
    pub errors: u64,
}

/// Errors after which a client stops: a cell that only fails measures nothing.
const MAX_ERRORS: u64 = 1000;

/// Client `i` doing `op` until `end`.
pub async fn run(
    op: Op,
    mut c: Client,
    mut prepared: Prepared,
    i: usize,
    value: Vec<u8>,
    end: Instant,
) -> Result<Measured, String> {
    let mut m = Measured::default();
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let t = Instant::now();
        let ok = match one(op, &mut c, &mut prepared, i, n, &value).await {
            Ok(ok) => ok,
            Err(e) if m.errors >= MAX_ERRORS => return Err(format!("{}: {e}", op.name())),
            Err(_) => false,
        };
        match ok {
            true => m.lat_ns.push(t.elapsed().as_nanos() as u64),
            false => m.errors += 1,
        }
    }
    if let Prepared::Lease(id, ..) = prepared {
        let _ = c.lease_revoke(id).await;
    }
    Ok(m)
}

/// The `n`th operation of client `i`; whether it succeeded.
async fn one(
    op: Op,
    c: &mut Client,
    prepared: &mut Prepared,
    i: usize,
    n: u64,
    value: &[u8],
) -> Result<bool, etcd_client::Error> {
    let read_key = || format!("k{}", (i as u64 + 7 * n) % RANGE_KEYS as u64);
    match (op, prepared) {
        (Op::Put, _) => {
            c.put(format!("p{i}-{}", n % 1000), value, None).await?;
            Ok(true)
        }
        (Op::RangeLinearizable, _) => Ok(c.get(read_key(), None).await?.kvs().len() == 1),
        (Op::RangeSerializable, _) => {
            let opts = GetOptions::new().with_serializable();
            Ok(c.get(read_key(), Some(opts)).await?.kvs().len() == 1)
        }
        (Op::TxnCas, _) => {
            let key = format!("cas{i}");
            let txn = Txn::new()
                .when([Compare::value(
                    key.as_str(),
                    CompareOp::Equal,
                    (n - 1).to_string(),
                )])
                .and_then([TxnOp::put(key.as_str(), n.to_string(), None)]);
            Ok(c.txn(txn).await?.succeeded())
        }
        (Op::KeepAlive, Prepared::Lease(_, keeper, stream)) => {
            keeper.keep_alive().await?;
            Ok(stream.message().await?.is_some_and(|r| r.ttl() > 0))
        }
        (Op::Watch, Prepared::Watch(stream)) => watch_one(c, stream, i, value).await,
        (op, _) => panic!("{op:?} without its prepared state"),
    }
}

/// A watch on client `i`'s key, once the server has created it: `Client::watch` returns when
/// the stream opens, before the server has taken the request, and a put sent before then may
/// land at a revision the watch (which starts after the revision current when it is created)
/// never shows.
async fn watch_created(c: &mut Client, i: usize) -> Result<WatchStream, String> {
    let mut stream = c.watch(format!("watched{i}"), None).await.map_err(err)?;
    loop {
        match stream.message().await.map_err(err)? {
            Some(r) if r.created() && !r.canceled() => return Ok(stream),
            Some(r) if r.canceled() => return Err(format!("watch refused: {}", r.cancel_reason())),
            Some(_) => continue,
            None => return Err("the watch stream ended before the watch was created".into()),
        }
    }
}

/// How long a put's event may take before the operation counts as failed.
const EVENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A put on client `i`'s watched key, and its event: done when the event arrives. A watch the
/// server cancels, or an event that does not come within [`EVENT_TIMEOUT`], is an error (said
/// on standard error), and the watch is made again.
async fn watch_one(
    c: &mut Client,
    stream: &mut WatchStream,
    i: usize,
    value: &[u8],
) -> Result<bool, etcd_client::Error> {
    let key = format!("watched{i}");
    let put = c.put(key.as_str(), value, None);
    let event = async {
        loop {
            match stream.message().await {
                Err(e) => break Err(format!("the watch failed: {e}")),
                Ok(Some(r)) if r.canceled() => {
                    let why = r.cancel_reason().to_string();
                    break Err(format!(
                        "the watch was canceled at {}: {why}",
                        r.compact_revision()
                    ));
                }
                Ok(Some(r)) if !r.events().is_empty() => {
                    break Ok(r.events()[0].kv().map_or(0, |kv| kv.mod_revision()))
                }
                Ok(Some(_)) => continue,
                Ok(None) => break Err("the watch stream ended".to_string()),
            }
        }
    };
    let event = async {
        match tokio::time::timeout(EVENT_TIMEOUT, event).await {
            Ok(got) => got,
            Err(_) => Err(format!("no event within {EVENT_TIMEOUT:?}")),
        }
    };
    let put = async {
        match tokio::time::timeout(EVENT_TIMEOUT, put).await {
            Ok(answer) => answer.map(Some),
            Err(_) => Ok(None),
        }
    };
    let (put, event) = tokio::join!(put, event);
    let Some(put) = put? else {
        eprintln!("watch_latency, client {i}: the put was not answered within {EVENT_TIMEOUT:?}");
        return Ok(false);
    };
    let put_rev = put.header().map_or(-1, |h| h.revision());
    match event {
        Ok(rev) => Ok(rev == put_rev),
        Err(why) => {
            eprintln!("watch_latency, client {i}: {why} (the put was at revision {put_rev})");
            if let Ok(again) = watch_created(c, i).await {
                *stream = again;
            }
            Ok(false)
        }
    }
}
