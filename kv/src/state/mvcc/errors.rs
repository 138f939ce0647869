//! Why a request to the keyspace is refused: each is one of etcd's errors, with etcd's gRPC code
//! and its exact text as etcd 3.4 sends it (clients match errors by their text:
//! `api/v3rpc/rpctypes/error.go`; the reference runs of the compatibility tests check each).

/// A refusal of the keyspace, deterministic on every replica (or found before proposing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MvccError {
    /// A request without a key.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// `ignore_value` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// A value given with `ignore_value`.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// A lease given with `ignore_lease`.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// More operations in a transaction than the limit.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// A transaction that writes a key twice.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// A lease that does not exist.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A revision below the compacted one.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// A revision above the current one.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    /// The keyspace would pass its share of `--quota-backend-bytes`.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// A request too large (a key or value over the limits).
    #[error("etcdserver: request is too large")]
    TooLarge,
    /// A malformed request (only a forged or buggy proposal gets this far).
    #[error("etcdserver: {0}")]
    Invalid(String),
    /// The state engine failed. Never a refusal of the request: where the state is written it
    /// stops the node (a replica that cannot keep its state must not answer), and a read that
    /// meets it answers `Unavailable` (the client tries another member).
    #[error("etcdserver: storage failure: {0}")]
    Storage(String),
}

impl MvccError {
    /// etcd's gRPC status code for it.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            MvccError::EmptyKey
            | MvccError::ValueProvided
            | MvccError::LeaseProvided
            | MvccError::TooManyOps
            | MvccError::DuplicateKey
            | MvccError::KeyNotFound
            | MvccError::Invalid(_)
            | MvccError::TooLarge => Code::InvalidArgument,
            MvccError::LeaseNotFound => Code::NotFound,
            MvccError::Compacted | MvccError::FutureRev => Code::OutOfRange,
            MvccError::NoSpace => Code::ResourceExhausted,
            MvccError::Storage(_) => Code::Unavailable,
        }
    }
}
