//! General lease primitives, independent of raft: a grantor, a holder with a renewer thread,
//! fencing tokens, and sessions with batched keep-alive. They use the same [`Clock`](crate::Clock);
//! in production, one that counts through suspend ([`BootClock`](crate::BootClock)).
//!
//! The argument is the raft lease's, for any resource: the grantor holds the lease for
//! `d·(1+ρ) + ε` from when it granted it, on its own clock; the holder believes in it only for
//! `d·(1−ρ) − ε` from *before it sent the request*, on its own clock. With both clocks within
//! `1 ± ρ` of real time, the holder's belief always ends first. Expiry means only that the old
//! holder *should* have stopped, so writes carry the fencing token and storage rejects lower ones.
//! Check outside configuration with [`GrantConfig::validate`].
//!
//! Five rules keep that true through restarts, stuck and duplicating networks, and other
//! machines' clocks:
//! - **Every holding is named by its token.** A new holding (a lease, or a lock) gets a larger
//!   token, even the same client's next one. Renewals, releases and unlocks name it
//!   ([`LeaseServer::renew`], [`LeaseServer::release`], [`Sessions::unlock`]), so a late, retried or
//!   duplicated copy never acts on a later holding, and a grant is never handed out twice: an
//!   acquire (or lock) by the current holder is refused, not answered with its token. A
//!   [`ClientId`] is **unique per client incarnation**.
//! - **A restarted grantor never forgets a holder.** [`LeaseServer::boot`] (the default) refuses
//!   every grant for `max_term·(1+ρ) + ε` on its own clock after boot, with
//!   [`AcquireError::BootHoldback`] telling how long is left; it needs the last token persisted
//!   before each grant's answer leaves. A caller that persists a [`GrantorRecord`] (durably,
//!   before each answer that changed it leaves; see there) restarts with no holdback through
//!   [`LeaseServer::restore`]: the recorded holder keeps a full term from the restart.
//! - **The owner learns of a loss from a timer, not from the network.** The [`Renewal`] core declares
//!   the lease lost at `valid_until − d/12` on the holder's clock (the view being
//!   `sent_at + d·(1−ρ) − ε`) unless a renewal moved it on; the [`Renewer`] runs it on its own thread
//!   and calls the [`Transport`] on another, with a deadline. A transport that blocks, ignores its
//!   deadline or never returns cannot delay [`LeaseEvent::Lost`] (with real threads it still
//!   waits for the scheduler: act only under [`Renewer::token`], and fence).
//! - **No instant crosses machines.** Grants carry a term, records a term, never a clock reading.
//!   [`Sessions::takeover`] sets every expiry from the new grantor's clock alone: the old grantor's
//!   readings (30 days on one machine, 1 hour on the next) are never compared with it.
//! - **A takeover is bounded by checkpoints.** [`Sessions::checkpoint`] records the time each
//!   session has left, a duration; a takeover gives that (a full TTL without one), which is never
//!   less than any client's view and, with checkpoints every `I`, frees a dead client's session
//!   at most `I` plus the failover time later than the old grantor would have (etcd's lease
//!   checkpoints, etcd-io/etcd#9924). A keep-alive that finds a session expired answers that it is
//!   gone, and no takeover revives it. The KV's replicated grantor (`kv/`) restores from the
//!   raft log and takes over this way rather than holding back for 10 minutes after each failover.
//!
//! The `sim` module (feature `sim`) checks all of it at every simulated millisecond: several
//! clients, a grantor that restarts on a new clock from records as stale as their contract allows,
//! drifting clocks far apart, links that block for seconds, and messages lost, overtaken, or
//! duplicated seconds late. Each of its checks has a negative control that it catches.
//!
//! ```
//! use raft_lease::grant::{FencedStore, GrantConfig, GrantorRecord, LeaseHolder, LeaseServer};
//! use raft_lease::{Clock, SimClock};
//!
//! let config = GrantConfig { drift_ppm: 1_000, margin_ms: 10, max_term_ms: 60_000 };
//! let (client_clock, server_clock) = (SimClock::new(0, 0), SimClock::new(0, 0));
//! // A first start: nothing was ever granted. (After a restart: `boot` or `restore`.)
//! let mut server = LeaseServer::restore(server_clock.clone(), config, GrantorRecord::default());
//! let mut holder = LeaseHolder::new(config);
//! let mut storage = FencedStore::new(String::new());
//!
//! // Acquire: read sent_at before the request leaves.
//! let sent_at = client_clock.now_ns();
//! let grant = server.acquire_now(7, 3_000).expect("free");
//! holder.on_grant(sent_at, grant);
//! let token = holder.token(client_clock.now_ns()).expect("held");
//! storage.write(token, "written under the lease".into()).expect("current token");
//!
//! // Renew when a third is left, naming the holding's token; the token stays the same.
//! client_clock.advance(2_100_000_000);
//! server_clock.advance(2_100_000_000);
//! assert!(holder.should_renew(client_clock.now_ns()));
//! let sent_at = client_clock.now_ns();
//! holder.on_grant(sent_at, server.renew_now(7, token, 3_000).expect("renewal"));
//! assert_eq!(holder.token(client_clock.now_ns()), Some(token));
//!
//! // Someone else later gets a larger token; our late write is then rejected.
//! server_clock.advance(10_000_000_000);
//! let other = server.acquire_now(8, 3_000).expect("expired, so free");
//! storage.write(other.token, "new owner".into()).unwrap();
//! assert!(storage.write(token, "late write from a paused ex-holder".into()).is_err());
//! ```

pub mod config;
pub mod event;
pub mod fence;
pub mod holder;
pub mod renewal;
pub mod renewer;
pub mod server;
pub mod session;
#[cfg(feature = "sim")]
pub mod sim;
pub mod sim_time;

pub use config::{GrantConfig, GrantConfigError};
pub use event::{LeaseEvent, LossReason, TransportError};
pub use fence::{FencedStore, StaleToken};
pub use holder::LeaseHolder;
pub use renewal::{RenewStep, Renewal, RenewalError};
pub use renewer::{ClockSleeper, RenewRequest, Renewer, Sleeper, Transport};
pub use server::{AcquireError, ClientId, Grant, GrantorRecord, LeaseServer};
pub use session::{
    KeepAlive, Revoked, SessionError, SessionId, SessionImage, Sessions, SessionsCheckpoint,
    SessionsImage,
};
pub use sim_time::{SimSleeper, SimTransportTime};
