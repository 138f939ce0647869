//! The lowest layer: the clock, the logger, byte budgets, limits, connection tables, metrics,
//! the choice of log engine, and the node's checked options. It imports nothing from the rest of the crate.

pub mod admin_token;
pub mod budget;
pub mod clock;
pub mod conns;
pub mod disk_stall;
pub mod limits;
pub mod log;
pub mod log_engine;
pub mod metrics;
pub mod options;
