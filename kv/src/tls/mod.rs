//! TLS: node certificates (made by `kv certs` and `kv cluster`) and the rustls set-ups for
//! peers (mutual, with the cluster CA) and for HTTPS clients.

pub mod certs;
pub mod config;
pub mod names;
