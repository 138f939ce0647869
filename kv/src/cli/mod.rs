//! The commands: `kv node` (its command line, the wiring of a node, joining a cluster), `kv
//! cluster` (a local cluster and its console) and `kv certs`.

pub mod args;
pub mod certs;
pub mod cluster;
pub mod join;
pub mod node;
