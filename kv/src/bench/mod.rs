//! `kv bench`: HTTP load on a local cluster (writes, lease reads, index reads, sessions) on each
//! log engine, the CPU each operation costs, and the disk's own fsync latency.

pub mod cpu;
pub mod datascale;
pub mod etcd;
pub mod fsync;
pub mod groups;
pub mod load;
pub mod report;
pub mod sessions;
pub mod stages;
