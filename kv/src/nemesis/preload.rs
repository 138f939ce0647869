//! `--preload-keys N`: before the faults start, the cluster is loaded with `N` keys of 256-byte
//! values through etcd's API (transactions of 100 puts from 16 writers), under a prefix of
//! their own, so that the nemesis runs against a store of realistic size: every snapshot a
//! fault makes a node need streams the whole keyspace. After the run, every preloaded key must
//! still be there (a count of the prefix).

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnOp};

/// The preloaded keys' prefix (the nemesis clients use others).
pub const PRELOAD_PREFIX: &str = "preload/";
/// Bytes per preloaded value.
const VALUE_BYTES: usize = 256;
/// Puts per transaction.
const TXN_PUTS: u64 = 100;
/// Writers at once.
const WRITERS: u64 = 16;

/// The `i`th preloaded key.
fn key(i: u64) -> String {
    format!("{PRELOAD_PREFIX}{i:010}")
}

async fn connect(endpoints: &[String]) -> Result<Client, String> {
    let opts = ConnectOptions::new()
        .with_timeout(Duration::from_secs(30))
        .with_connect_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| format!("connect to {endpoints:?}: {e}"))
}

/// One writer: the transactions `w`, `w + WRITERS`, … of the load, each retried until it
/// succeeds (a put is idempotent here: the same key and value).
async fn writer(endpoints: Vec<String>, keys: u64, w: u64) -> Result<(), String> {
    let mut c = connect(&endpoints).await?;
    let value = vec![b'p'; VALUE_BYTES];
    let txns = keys.div_ceil(TXN_PUTS);
    let mut t = w;
    while t < txns {
        let ops: Vec<TxnOp> = (t * TXN_PUTS..((t + 1) * TXN_PUTS).min(keys))
            .map(|i| TxnOp::put(key(i), value.clone(), None))
            .collect();
        match c.txn(Txn::new().and_then(ops)).await {
            Ok(_) => t += WRITERS,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                c = connect(&endpoints).await?;
            }
        }
    }
    Ok(())
}

/// Load `keys` keys through `endpoints`; the keys per second it took.
pub fn load(endpoints: &[String], keys: u64) -> Result<f64, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(writer(endpoints.to_vec(), keys, w)))
            .collect();
        for t in tasks {
            t.await
                .map_err(|e| format!("a preload writer panicked: {e}"))??;
        }
        Ok::<_, String>(())
    })?;
    Ok(keys as f64 / t0.elapsed().as_secs_f64())
}

/// How many preloaded keys the cluster holds (a linearizable count of the prefix).
pub fn count(endpoints: &[String]) -> Result<u64, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut last = String::new();
        for _ in 0..30 {
            let mut c = connect(endpoints).await?;
            let opts = GetOptions::new().with_prefix().with_count_only();
            match c.get(PRELOAD_PREFIX, Some(opts)).await {
                Ok(r) => return Ok(r.count() as u64),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Err(format!(
            "no count of the preloaded keys in 30 tries: {last}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preloaded_keys_are_under_their_prefix_in_order() {
        assert_eq!(key(7), "preload/0000000007");
        assert!(key(9) < key(10));
        assert!(!key(0).starts_with(crate::nemesis::etcd_clients::PREFIX));
    }
}
