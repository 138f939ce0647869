//! Read-your-writes at a member that does not lead: etcd answers a write only once the member
//! the client talked to has applied it, so a `serializable` read on that member right after
//! sees it (clients rely on it: the Node `etcd3` STM, python-etcd3's serializable gets,
//! `etcdctl get --consistency=s`). Each answer's header names that member.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

use crate::target::{leader_index, Target};

/// Puts then serializable gets through one member that does not lead, `rounds` times: how
/// many gets missed the put just answered. Every put's header must name that member.
pub async fn misses_at_a_follower(t: &Target, rounds: usize) -> usize {
    let eps = t.endpoints();
    let deadline = Instant::now() + Duration::from_secs(20);
    let leader = loop {
        if let Some(i) = leader_index(&eps).await {
            break i;
        }
        assert!(Instant::now() < deadline, "{}: no leader", t.name());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let follower = &eps[(leader + 1) % eps.len()];
    let mut c = Client::connect([follower.as_str()], None).await.unwrap();
    let me = c.status().await.unwrap().header().unwrap().member_id();
    let mut missed = 0;
    for i in 0..rounds {
        let key = format!("ryw/{i}");
        let put = c.put(key.as_str(), "v", None).await.unwrap();
        let member = put.header().unwrap().member_id();
        assert_eq!(
            member,
            me,
            "{}: a put's header names {member}, not {me}",
            t.name()
        );
        let opts = GetOptions::new().with_serializable();
        let got = c.get(key.as_str(), Some(opts)).await.unwrap();
        if got.kvs().is_empty() {
            missed += 1;
        }
    }
    missed
}

/// 1,000 rounds at a follower: no get misses its put.
pub async fn a_follower_reads_its_own_writes(t: &Target) {
    let missed = misses_at_a_follower(t, 1000).await;
    assert_eq!(
        missed,
        0,
        "{}: {missed} of 1000 serializable gets missed",
        t.name()
    );
}
