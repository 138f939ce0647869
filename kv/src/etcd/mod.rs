//! etcd's v3 gRPC API on a node (`--etcd-listen`): `etcdctl`, etcd's client libraries and the
//! recipes built on them (locks, elections) run against the store unchanged. See docs/etcd.md.
//!
//! Every service works over the same state machine as the HTTP API: etcd's keyspace is
//! `state::mvcc` (apart from the HTTP keys), its leases are the store's sessions, and every
//! write is a raft entry proposed by the leader. etcd's clients send any request to any member
//! and do not follow redirects, so a node that does not lead forwards writes and linearizable
//! reads to the leader (`forward`), serves `serializable` reads and watches from its own state,
//! and answers etcd's "no leader" during an election. A linearizable range on the leader is a
//! lease read, falling back to ReadIndex.

pub mod api;
pub mod authority;
pub mod cluster;
pub mod conns;
pub mod errors;
pub mod forward;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod probes;
pub mod serve;
pub mod watch;
