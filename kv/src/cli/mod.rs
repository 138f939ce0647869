//! The commands: `kv node` (its command line, the wiring of a node, joining a cluster), `kv
//! cluster` (a local cluster and its console), `kv certs`, and `kv hosts` (test hosts in network
//! namespaces).

pub mod args;
pub mod certs;
pub mod cluster;
pub mod hosts;
pub mod join;
pub mod netns;
pub mod node;
