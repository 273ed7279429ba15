//! [`RateLimitLayer`]: the configuration.

use ratelimit_core::Policy;
use tower_layer::Layer;

use crate::cost::Constant;
use crate::service::RateLimit;

/// What to do when the store cannot decide (it is unreachable, timed out or
/// failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through (the default): availability first.
    #[default]
    Open,
    /// Reject the request with `503 Service Unavailable`.
    Closed,
}

/// What to do with a request for which the key extractor finds no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// The rule does not apply: let the request through (the default).
    #[default]
    Allow,
    /// Reject the request as if it were over its limit.
    Reject,
}

/// Applies a rate-limit [`Policy`] to every request, keyed by a
/// [`KeyExtractor`](crate::KeyExtractor), at a [`Cost`](crate::Cost).
///
/// ```
/// use ratelimit_core::{MemoryStore, Policy};
/// use ratelimit_tower::{PeerIp, RateLimitLayer};
/// use std::time::Duration;
///
/// let layer = RateLimitLayer::new(
///     MemoryStore::new(),
///     Policy::fixed_window(5, Duration::from_secs(10))?,
///     PeerIp,
/// );
/// # Ok::<(), ratelimit_core::PolicyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer<St, K, C = Constant> {
    pub(crate) store: St,
    pub(crate) policy: Policy,
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) failure: FailurePolicy,
    pub(crate) missing_key: MissingKey,
}

impl<St, K> RateLimitLayer<St, K> {
    /// Limits requests by `key` under `policy`, in `store`, at cost 1.
    pub fn new(store: St, policy: Policy, key: K) -> Self {
        RateLimitLayer {
            store,
            policy,
            key,
            cost: Constant(1),
            failure: FailurePolicy::default(),
            missing_key: MissingKey::default(),
        }
    }
}

impl<St, K, C> RateLimitLayer<St, K, C> {
    /// Prices requests with `cost` (a [`Constant`] or a closure over the request).
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<St, K, C2> {
        RateLimitLayer {
            store: self.store,
            policy: self.policy,
            key: self.key,
            cost,
            failure: self.failure,
            missing_key: self.missing_key,
        }
    }

    /// What to do when the store cannot decide (default: [`FailurePolicy::Open`]).
    #[must_use]
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// What to do with requests without a key (default: [`MissingKey::Allow`]).
    #[must_use]
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// The policy applied.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl<S, St, K, C> Layer<S> for RateLimitLayer<St, K, C>
where
    St: Clone,
    K: Clone,
    C: Clone,
{
    type Service = RateLimit<S, St, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.clone())
    }
}
