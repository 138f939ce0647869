//! What a node's front ends share, below both: the raft loop's shared state of every group, the
//! options, limits, budgets and counters (`app`). The HTTP API (`http`) and etcd's API (`etcd`)
//! stand side by side over it and over the state (`state`).

pub mod app;
