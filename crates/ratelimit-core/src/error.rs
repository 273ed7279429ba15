//! Errors: [`PolicyError`] when a policy is built, [`StoreError`] when a decision is asked for.

use std::error::Error as StdError;
use std::time::Duration;

use crate::Policy;

/// A policy that cannot be built.
///
/// Every policy is validated when it is constructed, so a bad configuration
/// fails at start-up rather than panicking or misbehaving under load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The limit (or capacity, or maximum) is zero: nothing could ever pass.
    #[error("the {what} of a policy must be at least 1")]
    ZeroLimit {
        /// Which parameter was zero (`limit`, `capacity`, `max`, ...).
        what: &'static str,
    },
    /// The window (or period, or lease) is zero or shorter than one microsecond.
    #[error("the {what} of a policy must be at least one microsecond")]
    ZeroWindow {
        /// Which parameter was zero (`window`, `period`, `lease`).
        what: &'static str,
    },
    /// The rate is more than one token per microsecond per key.
    #[error(
        "rate of {amount} per {period:?} is above one per microsecond, the finest rate a store represents"
    )]
    RateTooHigh {
        /// Tokens per period.
        amount: u64,
        /// The period.
        period: Duration,
    },
    /// A parameter or a product of parameters is too large for the stores to
    /// represent exactly (Redis scripts compute in doubles, exact up to 2^53).
    #[error("{what} is too large to represent exactly (at most {max})")]
    Unrepresentable {
        /// What overflowed.
        what: &'static str,
        /// The largest value allowed.
        max: u64,
    },
    /// A parameter is above what a store decides in bounded work per call
    /// (a concurrency `max` above 1,024, see
    /// [`Concurrency::new`](crate::algorithm::Concurrency::new)).
    #[error("{what} is above {max}, the most a store decides in bounded work per call")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// The largest value allowed.
        max: u64,
    },
    /// The offset from UTC of a calendar period is 24 hours or more either way.
    #[error(
        "a UTC offset of {seconds} s is out of range: it must be less than 24 hours (86400 s) either way"
    )]
    UtcOffsetOutOfRange {
        /// The offset given, in seconds east of UTC.
        seconds: i32,
    },
    /// The policy name is empty, too long, or has characters outside `[A-Za-z0-9._-]`.
    #[error("invalid policy name {name:?}: use 1 to 64 characters from [A-Za-z0-9._-]")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
}

/// A decision that could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The cost is larger than the policy could ever admit, so waiting would not help.
    #[error("cost {cost} exceeds what policy `{policy}` can ever admit ({max})")]
    CostExceedsLimit {
        /// The policy's name.
        policy: String,
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy admits.
        max: u64,
    },
    /// The in-memory store holds its maximum number of keys and none has expired.
    #[error("the in-memory store is full ({max_keys} keys, none expired)")]
    Full {
        /// The configured bound.
        max_keys: usize,
    },
    /// One policy name was used with two different algorithms on the same store.
    #[error("policy `{policy}` is stored with another algorithm; give each policy its own name")]
    PolicyConflict {
        /// The policy's name.
        policy: String,
    },
    /// The operation does not apply to the policy's algorithm: an admin
    /// penalty or reward on a concurrency limit (whose units are permits, to
    /// be released, not consumed).
    #[error("`{operation}` does not apply to policy `{policy}` ({algorithm})")]
    Unsupported {
        /// The policy's name.
        policy: String,
        /// The algorithm's kind ([`Algorithm::kind`](crate::Algorithm::kind)).
        algorithm: &'static str,
        /// The operation asked for (`penalize`, `reward`).
        operation: &'static str,
    },
    /// The store did not answer within its timeout: an outage
    /// ([`is_outage`](StoreError::is_outage)).
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached: a refused, reset or closed
    /// connection, an I/O error, a cluster without a node for the key, a
    /// server that is loading its data, busy with a script, or read-only
    /// during a failover. An outage ([`is_outage`](StoreError::is_outage)).
    #[error("store unavailable: {0}")]
    Unavailable(#[source] Box<dyn StdError + Send + Sync + 'static>),
    /// The store answered, but not with a decision: a reply that does not
    /// decode, a script error, a command the store's user may not run, a
    /// failed authentication, an invalid configuration. A bug or a
    /// configuration mistake, never an outage: the failure policy does not
    /// apply, and the request is refused.
    #[error("store backend failed: {0}")]
    Backend(#[source] Box<dyn StdError + Send + Sync + 'static>),
}

impl StoreError {
    /// Whether this error is an outage: the store could not be reached or did
    /// not answer in time ([`Timeout`](StoreError::Timeout),
    /// [`Unavailable`](StoreError::Unavailable)).
    ///
    /// Only outages reach a failure policy (fail open, fail closed, fall back
    /// to a local store) or count as failures for a
    /// [`CircuitBreaker`](crate::CircuitBreaker). Every other error (a policy
    /// conflict, a full store, a cost no policy admits, a reply that does not
    /// decode) is a configuration mistake, a bug or a refusal: it never lifts
    /// a limit.
    ///
    /// ```
    /// use ratelimit_core::StoreError;
    /// use std::time::Duration;
    ///
    /// assert!(StoreError::Timeout(Duration::from_millis(100)).is_outage());
    /// assert!(!StoreError::Full { max_keys: 10 }.is_outage());
    /// assert!(!StoreError::Backend("unexpected reply".into()).is_outage());
    /// ```
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }

    /// A short name of this error's kind, for logs and metric labels:
    /// `cost_exceeds_limit`, `full`, `policy_conflict`, `unsupported`,
    /// `timeout`, `unavailable` or `backend`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::CostExceedsLimit { .. } => "cost_exceeds_limit",
            StoreError::Full { .. } => "full",
            StoreError::PolicyConflict { .. } => "policy_conflict",
            StoreError::Unsupported { .. } => "unsupported",
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Backend(_) => "backend",
        }
    }

    /// [`Unsupported`](StoreError::Unsupported): `operation` does not apply
    /// to `policy`'s algorithm.
    pub(crate) fn unsupported(policy: &Policy, operation: &'static str) -> StoreError {
        StoreError::Unsupported {
            policy: policy.name().to_owned(),
            algorithm: policy.algorithm().kind(),
            operation,
        }
    }
}
