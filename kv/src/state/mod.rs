//! The replicated state machine: keys, sessions and locks, the commands that change them, and
//! the leader's side of sessions (keep-alives under the lease, housekeeping).

pub mod alarms;
pub mod command;
pub mod keys;
pub mod kv_install;
pub mod kv_machine;
pub mod kv_state;
pub mod mvcc;
pub mod placement;
pub mod sessions_local;
pub mod sessions_row;
pub mod stream;
