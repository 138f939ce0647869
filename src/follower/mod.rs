//! Follower read leases: linearizable reads at every voter with no message (the pure state
//! machines; FOLLOWER.md's rules, adapted from Paxos Quorum Leases to raft).
//!
//! - **Expose, do not just commit.** The leader computes `E = min(commit, matched index of every
//!   holder whose read lease may still be valid)` once an entry of its term is committed, and
//!   `E` never goes down ([`GrantTable::expose`]). Every replica applies only up to the largest
//!   `E` it has received, and reads wait for `E`, never for raft's commit index.
//! - **A grant answers one acknowledgement of the holder's own.** The holder tags each
//!   acknowledgement with a tag never used before and reads its clock `a` before sending it
//!   ([`ReadLease::tag`]). The leader, receiving it at `x`, grants `g = min(G, λ − x)` only to a
//!   current voter caught up to `E`, for an acknowledgement of its term, while its own lease `λ`
//!   holds, and counts the holder until `x + g` ([`GrantTable::grant`]). The holder's lease ends
//!   at `a + g·(1−ρ̂)/(1+ρ̂) − ε̂` on its clock: at most `g/(1+ρ)` of real time from `a ≤ x`,
//!   while the leader counts at least `g/(1+ρ)` from `x`. So it ends first, and before `λ`.
//! - **A read lease never outlives the leader lease that granted it**, and the granting node
//!   keeps counting its grants across a step-down and a re-election ([`GrantTable`] is kept per
//!   node, not per term).
//! - **Transfers and membership changes wait for the read leases** ([`GrantTable::stop_granting`],
//!   [`GrantTable::all_ended`]), one round trip when the holders give them up: asked by the
//!   leader, a holder ends its lease and voids every grant answering a tag it sent so far
//!   ([`ReadLease::give_up`]); the leader stops counting it only if that covers every grant it
//!   made it ([`GrantTable::on_give_up`]), so a grant overtaken by the give-up revives nothing.
//!   A lost give-up leaves the wait as it was: every grant runs out.
//! - **A holder reads only what no pending entry touches** ([`PendingKeys`],
//!   [`ReadLease::check_local`]).
//! - **A lagging node may be left out** ([`LagPolicy`], optional): a voter behind the commit
//!   index for longer than a bound gets no grant, so one slow holder slows writes for at most
//!   one grant.
//! - **Settings travel in the grant**: the holder uses the larger of its own and the grant's
//!   `ρ` and `ε`.

pub mod grants;
pub mod holder;
pub mod lag;
pub mod pending;
pub mod wire;

pub use grants::{AckTag, Grant, GrantRequest, GrantTable, Refusal};
pub use holder::{LocalRefusal, ReadLease};
pub use lag::LagPolicy;
pub use pending::{Keys, PendingKeys};
pub use wire::{HolderNote, LeaderNote, WireError};

#[cfg(test)]
mod give_up_props;
#[cfg(test)]
mod props;
