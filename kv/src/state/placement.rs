//! Which raft group a key belongs to: FNV-1a (64-bit) of the key's bytes, modulo the number of
//! groups. The hash is fixed by its definition, so every node and every version places a key
//! alike; the number of groups is fixed when the cluster is made (the data dir records it), since
//! changing it would move keys between groups.
//!
//! Sessions and locks live in group 0: a write bound to a session or fenced by a lock must be
//! checked where they are, so in a store of many groups such writes are refused (see the KV
//! routes) unless the key is in group 0.

use std::hash::Hasher;

use raft_lease::multi::GroupId;

/// The group that holds `key`, of `groups` (at least 1).
pub fn group_of(key: &str, groups: u32) -> GroupId {
    assert!(groups >= 1, "a store has at least one group");
    if groups == 1 {
        return 0;
    }
    let mut h = fnv::FnvHasher::default();
    h.write(key.as_bytes());
    h.finish() % u64::from(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_fixed_and_spreads_keys() {
        // Fixed by FNV-1a's definition: a change here moves stored keys between groups.
        assert_eq!(group_of("a", 16), 0xaf63_dc4c_8601_ec8c % 16);
        assert_eq!(group_of("", 7), 0xcbf2_9ce4_8422_2325 % 7);
        assert_eq!(group_of("anything", 1), 0);
        let mut counts = [0u32; 8];
        for i in 0..8_000 {
            counts[group_of(&format!("key-{i}"), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1_200).contains(&c)),
            "{counts:?}"
        );
    }
}
