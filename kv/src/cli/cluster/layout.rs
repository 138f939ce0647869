//! A cluster's layout (how many nodes, which ports), recorded in its dir's `cluster.json` and kept
//! on later runs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cli::cluster::args::ClusterArgs;

/// What a cluster's dir records: how many nodes and on which ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Nodes 1..=nodes.
    pub nodes: u64,
    /// The base port.
    pub base_port: u16,
}

impl Layout {
    /// Node `id`'s peer port.
    pub fn peer_port(&self, id: u64) -> u16 {
        self.base_port + id as u16
    }

    /// Node `id`'s HTTP port.
    pub fn http_port(&self, id: u64) -> u16 {
        self.base_port + 1000 + id as u16
    }

    /// Node `id`'s etcd API port.
    pub fn etcd_port(&self, id: u64) -> u16 {
        self.base_port + 2000 + id as u16
    }

    /// Refuse a layout whose ports would overflow (or use port 0).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=9).contains(&self.nodes) {
            return Err("--nodes must be 1 to 9".into());
        }
        let top = self.base_port as u64 + 2000 + self.nodes;
        if top > u16::MAX as u64 || self.base_port == 0 {
            return Err(format!(
                "--base-port {}: the etcd API ports would run to {top}, past 65535; use a base port of at most {}",
                self.base_port,
                u16::MAX as u64 - 2000 - self.nodes
            ));
        }
        Ok(())
    }

    /// `1=127.0.0.1:PORT,...`, the port of each node from `port`.
    pub fn list(&self, port: impl Fn(u64) -> u16) -> String {
        (1..=self.nodes)
            .map(|i| format!("{i}=127.0.0.1:{}", port(i)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The layout recorded in `dir`, or the one the options ask for (recorded now).
pub fn layout(args: &ClusterArgs, dir: &Path) -> Result<Layout, String> {
    let path = dir.join("cluster.json");
    let asked = Layout {
        nodes: args.nodes.unwrap_or(3),
        base_port: args.base_port.unwrap_or(7000),
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        asked.check()?;
        let json = serde_json::to_string(&asked).expect("a layout serializes");
        std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(asked);
    };
    let kept: Layout =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let differs = args.nodes.is_some_and(|n| n != kept.nodes)
        || args.base_port.is_some_and(|p| p != kept.base_port);
    if differs {
        return Err(format!(
            "{} holds a cluster of {} nodes on base port {}; run without --nodes/--base-port to \
             restart it, or use another --data-dir (or --temp) for a new one",
            dir.display(),
            kept.nodes,
            kept.base_port
        ));
    }
    kept.check()?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_that_would_overflow_are_refused() {
        let ok = Layout {
            nodes: 3,
            base_port: 7000,
        };
        assert_eq!(ok.check(), Ok(()));
        assert_eq!((ok.peer_port(1), ok.http_port(3)), (7001, 8003));
        let top = Layout {
            nodes: 3,
            base_port: 65535 - 2003,
        };
        assert_eq!(top.check(), Ok(()), "the last etcd API port is 65535");
        assert_eq!(top.etcd_port(3), 65535);
        for base in [65000, 65535 - 2002, 0] {
            let e = Layout {
                nodes: 3,
                base_port: base,
            }
            .check()
            .unwrap_err();
            assert!(e.contains("--base-port"), "{base}: {e}");
        }
        assert!(Layout {
            nodes: 10,
            base_port: 7000
        }
        .check()
        .is_err());
    }
}
