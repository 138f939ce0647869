//! Peers: the replicated address book, frames on the wire, the sending transport and the
//! listener that admits peer messages.

#[cfg(test)]
pub mod ack_contexts;
pub mod frame;
pub mod listen;
pub mod members;
pub mod transport;
