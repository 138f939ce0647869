//! Peers: the replicated address book, the configuration every group follows, frames on the wire, the sending transport, the
//! listener that admits peer messages, snapshots streamed beside the raft messages, and when
//! each peer was last heard from.

#[cfg(test)]
pub mod ack_contexts;
pub mod dial;
pub mod express;
pub mod follow;
pub mod frame;
pub mod heard;
pub mod listen;
pub mod members;
pub mod outgoing;
pub mod peer_config;
pub mod send_loop;
pub mod slots;
pub mod snapshot_recv;
pub mod snapshot_send;
pub mod snapshot_wire;
pub mod stream_out;
pub mod transport;
