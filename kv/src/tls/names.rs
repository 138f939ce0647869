//! Node names: the DNS name `node-<id>.raft-lease` that identifies a node in its certificate
//! (decimal, no sign or leading zero, a nonzero u64).

const NAME_PREFIX: &str = "node-";
const NAME_SUFFIX: &str = ".raft-lease";

/// The DNS name that identifies node `id` in its certificate.
pub fn node_name(id: u64) -> String {
    assert!(id != 0, "raft id 0 is reserved");
    format!("{NAME_PREFIX}{id}{NAME_SUFFIX}")
}

/// The node id in a `node-<id>.raft-lease` name, strictly.
pub fn parse_node_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(NAME_PREFIX)?.strip_suffix(NAME_SUFFIX)?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0');
    canonical.then(|| digits.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_parse_strictly() {
        assert_eq!(parse_node_name(&node_name(7)), Some(7));
        assert_eq!(
            parse_node_name("node-18446744073709551615.raft-lease"),
            Some(u64::MAX)
        );
        for bad in [
            "node-0.raft-lease",
            "node-07.raft-lease",
            "node-+7.raft-lease",
            "node-.raft-lease",
            "node-7.raft-lease.evil",
            "xnode-7.raft-lease",
            "node-18446744073709551616.raft-lease",
            "NODE-7.raft-lease",
        ] {
            assert_eq!(parse_node_name(bad), None, "{bad}");
        }
    }
}
