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
    /// HTTP ports are this + id (`None`: `base_port` + 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_base_port: Option<u16>,
    /// etcd API ports are this + id (`None`: `base_port` + 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_base_port: Option<u16>,
}

impl Layout {
    /// A layout of `nodes` nodes on the default ports from `base_port`.
    pub fn new(nodes: u64, base_port: u16) -> Layout {
        Layout {
            nodes,
            base_port,
            http_base_port: None,
            etcd_base_port: None,
        }
    }

    /// The three bases (peer, HTTP, etcd API) as u64 (checked later), each with the flag that
    /// set it, as an error names it.
    fn bases(&self) -> [(String, u64); 3] {
        let base = self.base_port as u64;
        let named = |flag: &str, set: Option<u16>, offset: u64| match set {
            Some(p) => (format!("{flag} {p}"), u64::from(p)),
            None => (format!("--base-port {base} (+{offset})"), base + offset),
        };
        [
            (format!("--base-port {base}"), base),
            named("--http-base-port", self.http_base_port, 1000),
            named("--etcd-base-port", self.etcd_base_port, 2000),
        ]
    }

    /// Node `id`'s peer port.
    pub fn peer_port(&self, id: u64) -> u16 {
        self.base_port + id as u16
    }

    /// Node `id`'s HTTP port.
    pub fn http_port(&self, id: u64) -> u16 {
        let base = self.http_base_port.unwrap_or_else(|| self.base_port + 1000);
        base + id as u16
    }

    /// Node `id`'s etcd API port.
    pub fn etcd_port(&self, id: u64) -> u16 {
        let base = self.etcd_base_port.unwrap_or_else(|| self.base_port + 2000);
        base + id as u16
    }

    /// Refuse a layout whose ports would overflow, use port 0, or overlap.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=9).contains(&self.nodes) {
            return Err("--nodes must be 1 to 9".into());
        }
        let bases = self.bases();
        for (flag, base) in &bases {
            let top = base + self.nodes;
            if top > u16::MAX as u64 || *base == 0 {
                return Err(format!(
                    "{flag}: ports would run to {top}, past 65535 (or start at 0): {} nodes need \
                     a base of at most {}",
                    self.nodes,
                    u16::MAX as u64 - self.nodes
                ));
            }
        }
        for (i, (a, x)) in bases.iter().enumerate() {
            for (b, y) in &bases[i + 1..] {
                // Ports x+1..=x+n and y+1..=y+n share one exactly when |x − y| < n.
                if x.abs_diff(*y) < self.nodes {
                    return Err(format!(
                        "{a} and {b}: the ports of {} nodes would overlap",
                        self.nodes
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The layout recorded in `dir`, or the one the options ask for (recorded now).
pub fn layout(args: &ClusterArgs, dir: &Path) -> Result<Layout, String> {
    let path = dir.join("cluster.json");
    let asked = Layout {
        http_base_port: args.http_base_port,
        etcd_base_port: args.etcd_base_port,
        ..Layout::new(args.nodes.unwrap_or(3), args.base_port.unwrap_or(7000))
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
        || args.base_port.is_some_and(|p| p != kept.base_port)
        || args
            .http_base_port
            .is_some_and(|p| Some(p) != kept.http_base_port)
        || args
            .etcd_base_port
            .is_some_and(|p| Some(p) != kept.etcd_base_port);
    if differs {
        return Err(format!(
            "{} holds a cluster of {} nodes on peer ports from {}, HTTP ports from {}; run \
             without --nodes and the port flags to restart it, or use another --data-dir (or \
             --temp) for a new one",
            dir.display(),
            kept.nodes,
            kept.peer_port(1),
            kept.http_port(1),
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
        let ok = Layout::new(3, 7000);
        assert_eq!(ok.check(), Ok(()));
        assert_eq!((ok.peer_port(1), ok.http_port(3)), (7001, 8003));
        let top = Layout::new(3, 65535 - 2003);
        assert_eq!(top.check(), Ok(()), "the last etcd API port is 65535");
        assert_eq!(top.etcd_port(3), 65535);
        for base in [65000, 65535 - 2002, 0] {
            let e = Layout::new(3, base).check().unwrap_err();
            assert!(
                e.contains("--etcd-base-port") || e.contains("--base-port"),
                "{base}: {e}"
            );
        }
        assert!(Layout::new(10, 7000).check().is_err());
    }

    #[test]
    fn http_and_etcd_ports_can_be_set_apart_from_the_peer_ports_but_never_overlap() {
        let apart = Layout {
            http_base_port: Some(40800),
            etcd_base_port: Some(2378),
            ..Layout::new(3, 40700)
        };
        assert_eq!(apart.check(), Ok(()));
        assert_eq!(
            (apart.peer_port(1), apart.http_port(2), apart.etcd_port(3)),
            (40701, 40802, 2381)
        );
        let clash = Layout {
            http_base_port: Some(7002),
            ..Layout::new(3, 7000)
        };
        let e = clash.check().unwrap_err();
        assert!(
            e.contains("--base-port 7000 and --http-base-port 7002"),
            "{e}"
        );
        let touching = Layout {
            http_base_port: Some(7003),
            ..Layout::new(3, 7000)
        };
        assert_eq!(
            touching.check(),
            Ok(()),
            "7001-7003 and 7004-7006 share no port"
        );
        let over = Layout {
            http_base_port: Some(65534),
            ..Layout::new(3, 7000)
        };
        assert!(over.check().unwrap_err().contains("--http-base-port"));
    }
}
