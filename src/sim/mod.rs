//! A deterministic fault simulator (cargo feature `sim`): an in-process cluster of
//! [`LeaseNode`](crate::LeaseNode)s with per-node simulated clocks, a simulated network, node
//! pauses, crashes and restarts, a history recorder and a linearizability checker.
//!
//! Everything is seeded: the same [`SimConfig`] and the same calls give the same history, so a
//! failing seed reproduces. Use it to test your own store's use of the lease.
//!
//! ```
//! use raft_lease::sim::{Load, SimCluster, SimConfig};
//!
//! let mut sim = SimCluster::new(SimConfig { seed: 7, ..SimConfig::default() });
//! assert!(sim.run_until(2_000, |s| s.leader().is_some()));
//! let leader = sim.leader().unwrap();
//! sim.run_with_load(300, &Load::default());
//! let others: Vec<u64> = sim.ids().into_iter().filter(|&id| id != leader).collect();
//! sim.partition(&[leader], &others); // the old leader keeps being read from
//! sim.run_with_load(1_000, &Load::default());
//! let report = sim.check();
//! assert!(report.violations.is_empty(), "{:?}", report.violations);
//! assert!(report.lease_reads_checked > 0);
//! ```

mod cluster;
pub mod history;
pub mod kv;
pub mod monitor;
pub mod multi;
pub mod net;
pub mod random;
pub mod scenarios;
pub mod storage;

pub use cluster::{Load, SimCluster, SimConfig, SimTotals};
pub use history::{CheckReport, History, Op, OpId, OpKind, OpResult, Violation};
pub use monitor::{ElectionStats, LeaseMonitor, NodeView};
pub use net::{DelayRule, NetConfig, SimNet};
