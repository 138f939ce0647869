//! The raft loop to copy: one thread drives a `LeaseNode` over the disk store, the peer transport
//! and a [`StateMachine`](machine::StateMachine) of your own, and answers requests from other
//! threads. Nothing here knows the KV's keys, sessions or locks.

pub mod admission;
pub mod balance;
pub mod conf_meta;
pub mod following;
pub mod machine;
pub mod raft_io;
pub mod raft_loop;
pub mod requests;
pub mod shared;
pub mod snapshot;
pub mod status;
