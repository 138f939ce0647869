//! What a compatibility test runs against: this store (three `kv` processes serving etcd's API)
//! or the reference etcd. The test sees endpoints only, and may kill the leader.

use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::reference::Etcd;

/// A cluster speaking etcd's v3 API.
pub enum Target {
    /// This store.
    Store(Cluster),
    /// etcd 3.4.
    Etcd(Etcd),
}

impl Target {
    /// Three nodes of this store, a leader elected.
    pub fn store() -> Target {
        let c = Cluster::start(3, &[]);
        c.leader(&[1, 2, 3], 15);
        Target::Store(c)
    }

    /// Three nodes of this store started with `args`, a leader elected.
    pub fn store_with(args: &[&str]) -> Target {
        let c = Cluster::start(3, args);
        c.leader(&[1, 2, 3], 15);
        Target::Store(c)
    }

    /// Three members of etcd 3.4.
    pub fn etcd() -> Target {
        Target::Etcd(Etcd::start())
    }

    /// Which this is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Target::Store(_) => "raft-lease-kv",
            Target::Etcd(_) => "etcd 3.4",
        }
    }

    /// Every member's client endpoint, `127.0.0.1:PORT`, member 0 first.
    pub fn endpoints(&self) -> Vec<String> {
        let ports: Vec<u16> = match self {
            Target::Store(c) => c.etcd_ports.clone(),
            Target::Etcd(e) => e.client_ports.clone(),
        };
        ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    /// The endpoints still running.
    pub fn live_endpoints(&mut self) -> Vec<String> {
        let all = self.endpoints();
        let running: Vec<bool> = match self {
            Target::Store(c) => (1..=3).map(|i| c.running(i)).collect(),
            Target::Etcd(e) => e.members.iter().map(Option::is_some).collect(),
        };
        all.into_iter()
            .zip(running)
            .filter(|(_, r)| *r)
            .map(|(e, _)| e)
            .collect()
    }

    /// Kill the member that leads now (found through `Status` on each endpoint); its index.
    pub fn kill_leader(&mut self, rt: &tokio::runtime::Runtime) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        let leader = loop {
            if let Some(i) = rt.block_on(leader_index(&self.endpoints())) {
                break i;
            }
            assert!(Instant::now() < deadline, "{}: no leader", self.name());
            std::thread::sleep(Duration::from_millis(50));
        };
        match self {
            Target::Store(c) => c.kill9(leader as u64 + 1),
            Target::Etcd(e) => e.kill9(leader),
        }
        leader
    }
}

/// The index of the endpoint whose member leads, if one says it does.
pub async fn leader_index(endpoints: &[String]) -> Option<usize> {
    for (i, ep) in endpoints.iter().enumerate() {
        let Ok(mut c) = etcd_client::Client::connect([ep.as_str()], None).await else {
            continue;
        };
        if let Ok(s) = c.status().await {
            let me = s.header().map(|h| h.member_id());
            if me.is_some() && me == Some(s.leader()) {
                return Some(i);
            }
        }
    }
    None
}
