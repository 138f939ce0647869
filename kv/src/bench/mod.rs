//! `kv bench`: HTTP load on a local cluster (writes, lease reads, index reads, sessions), and the
//! CPU each operation costs.

pub mod cpu;
pub mod load;
pub mod sessions;
