//! What a lease's owner hears from its renewal ([`LeaseEvent`]), why a lease is lost
//! ([`LossReason`]), and why one renewal attempt failed ([`TransportError`]): the vocabulary the
//! pure renewal core ([`super::renewal`]) and the renewer thread ([`super::renewer`]) share.

use thiserror::Error;

use crate::grant::server::AcquireError;

/// What the renewer tells the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// Renewed: the holder's view now ends at `valid_until_ns`.
    Renewed {
        /// The fencing token.
        token: u64,
        /// The new end of the holder's view.
        valid_until_ns: u64,
        /// Local time of the renewal's answer.
        at_ns: u64,
    },
    /// One renewal failed (an error, or no answer by its deadline); the renewer retries while the
    /// lease lasts.
    RenewFailed {
        /// The transport's error.
        error: TransportError,
        /// Failed attempts in a row.
        attempt: u32,
        /// Local time of the failure.
        at_ns: u64,
    },
    /// The lease is lost or about to be: **stop using it now**. The renewer has exited.
    Lost {
        /// Why.
        reason: LossReason,
        /// Local time of the signal: `d/12` or more before the holder's view ends when renewals
        /// failed or the transport did not answer.
        at_ns: u64,
    },
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// No renewal succeeded before the loss timer (`d/12` before the view ends): the attempts
    /// failed, or the transport did not answer in time.
    RenewalsFailed {
        /// Where the holder's view would have ended.
        valid_until_ns: u64,
    },
    /// The grantor answered with another token: the lease changed hands in between.
    TokenChanged {
        /// The token held before.
        old: Option<u64>,
        /// The token granted now.
        new: u64,
    },
    /// The grantor refused the renewal: the holding is gone (released, run out, taken over) or
    /// cannot be renewed (a grantor that restarted with a holdback forgot it).
    Refused(AcquireError),
    /// The lease was never held when the renewer started.
    NotHeld,
}

/// Why one renewal attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransportError {
    /// No answer by the attempt's deadline.
    #[error("no answer by the deadline")]
    DeadlineMissed,
    /// The grantor answered with a refusal. The renewal core treats it as a loss: the holding
    /// cannot be renewed.
    #[error("the grantor refused: {0}")]
    Refused(#[from] AcquireError),
    /// The request could not be sent or its answer not read.
    #[error("transport I/O failed ({kind:?}): {message}")]
    Io {
        /// The kind of the I/O error.
        kind: std::io::ErrorKind,
        /// Its message.
        message: String,
    },
    /// The answer could not be understood (a garbled or foreign reply).
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The transport's thread is gone (it panicked); only the loss timer is left.
    #[error("the transport thread is gone")]
    Gone,
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        TransportError::Io {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}
