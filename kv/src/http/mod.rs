//! The HTTP front end: the server, routing, the routes (keys, status, sessions and locks,
//! `/admin`), and a small blocking client for the node's own tools.

pub mod admin;
pub mod ask;
pub mod body;
pub mod client;
pub mod ctx;
pub mod errors;
pub mod info;
pub mod kv;
pub mod outcome;
pub mod reply;
pub mod routes;
pub mod server;
pub mod sessions;
pub mod spin_io;
