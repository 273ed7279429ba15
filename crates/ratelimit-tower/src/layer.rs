//! [`RateLimitLayer`]: the configuration.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::{Policy, StoreError};
use tower_layer::Layer;

use crate::headers::RateLimitHeaders;
use crate::reject::{ErrorRejections, HttpRejections, Rejection, RejectionBody};
use crate::rule::{And, Rule};
use crate::service::RateLimit;

/// What to do when the store cannot decide because of an outage: it is
/// unreachable or timed out ([`StoreError::is_outage`]).
///
/// Only outages reach a failure policy. Any other error is a configuration
/// mistake, a bug or a refusal (a policy conflict, a reply that does not
/// decode, a permission the Redis user lacks, a full in-memory store, whose
/// bound exists to keep new keys out): the request is refused (`500`, or
/// `503` for a full store), logged at `error` and counted (metrics outcome
/// `invalid`, [`Stats::refused_on_error`]), whatever this says.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through (the default): availability first.
    #[default]
    Open,
    /// Refuse the request: `503 Service Unavailable` (gRPC `UNAVAILABLE`).
    Closed,
    /// Ask a function: `true` lets the request through.
    Custom(Arc<dyn Fn(&StoreError) -> bool + Send + Sync>),
}

impl FailurePolicy {
    /// A failure policy that asks `f` (`true` lets the request through).
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&StoreError) -> bool + Send + Sync + 'static,
    {
        FailurePolicy::Custom(Arc::new(f))
    }

    /// Whether this policy lets a request through when the store failed
    /// with `error`: never for an error that is not an outage
    /// ([`StoreError::is_outage`]).
    ///
    /// ```
    /// use ratelimit_core::StoreError;
    /// use ratelimit_tower::FailurePolicy;
    /// use std::time::Duration;
    ///
    /// let timeout = StoreError::Timeout(Duration::from_millis(100));
    /// assert!(FailurePolicy::Open.allows(&timeout));
    /// assert!(!FailurePolicy::Closed.allows(&timeout));
    /// let bug = StoreError::Backend("unexpected reply".into());
    /// assert!(!FailurePolicy::Open.allows(&bug));
    /// assert!(!FailurePolicy::custom(|_| true).allows(&bug));
    /// ```
    pub fn allows(&self, error: &StoreError) -> bool {
        if !error.is_outage() {
            return false;
        }
        match self {
            FailurePolicy::Open => true,
            FailurePolicy::Closed => false,
            FailurePolicy::Custom(f) => f(error),
        }
    }
}

impl fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailurePolicy::Open => f.write_str("Open"),
            FailurePolicy::Closed => f.write_str("Closed"),
            FailurePolicy::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// Counts of what a layer did outside a store decision: when its store could
/// not decide, and when a rule found no key. Each store failure is also logged
/// with `tracing`: an outage at `warn`, any other error at `error`; missing
/// keys are logged as described on [`MissingKey`].
#[derive(Debug, Default)]
pub struct Stats {
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    refused_on_error: AtomicU64,
    missing_key_allowed: AtomicU64,
    missing_key_rejected: AtomicU64,
    no_peer_address: AtomicU64,
    logged_no_peer: AtomicBool,
    logged_missing_allowed: AtomicBool,
}

impl Stats {
    /// Requests let through because the store failed and the policy allowed it.
    pub fn failed_open(&self) -> u64 {
        self.failed_open.load(Ordering::Relaxed)
    }

    /// Requests refused because the store failed and the policy refused them.
    pub fn failed_closed(&self) -> u64 {
        self.failed_closed.load(Ordering::Relaxed)
    }

    /// Requests that passed a rule without a key ([`MissingKey::Allow`]):
    /// that rule did not limit them.
    pub fn missing_key_allowed(&self) -> u64 {
        self.missing_key_allowed.load(Ordering::Relaxed)
    }

    /// Requests refused because a rule found no key ([`MissingKey::Reject`],
    /// or a rule provider's [`Limits::reject`](crate::Limits::reject)).
    pub fn missing_key_rejected(&self) -> u64 {
        self.missing_key_rejected.load(Ordering::Relaxed)
    }

    /// Requests answered `500` because the server gave no peer address
    /// (see [`NoKey::NoPeerAddress`](crate::NoKey::NoPeerAddress)).
    pub fn no_peer_address(&self) -> u64 {
        self.no_peer_address.load(Ordering::Relaxed)
    }

    /// Requests refused because the store answered with an error that is not
    /// an outage (a configuration mistake, a bug, a full in-memory store),
    /// whatever the failure policy.
    pub fn refused_on_error(&self) -> u64 {
        self.refused_on_error.load(Ordering::Relaxed)
    }

    pub(crate) fn record_refused_on_error(&self) {
        self.refused_on_error.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record(&self, allowed: bool) {
        let counter = if allowed {
            &self.failed_open
        } else {
            &self.failed_closed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request without a peer address; `true` the first time, to
    /// log it once per layer.
    pub(crate) fn record_no_peer(&self) -> bool {
        self.no_peer_address.fetch_add(1, Ordering::Relaxed);
        !self.logged_no_peer.swap(true, Ordering::Relaxed)
    }

    /// Counts a request refused for a missing key.
    pub(crate) fn record_missing_rejected(&self) {
        self.missing_key_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that passed a rule without a key; `true` the first
    /// time, to log it once per layer.
    pub(crate) fn record_missing_allowed(&self) -> bool {
        self.missing_key_allowed.fetch_add(1, Ordering::Relaxed);
        !self.logged_missing_allowed.swap(true, Ordering::Relaxed)
    }
}

/// What to do with a request for which a rule's key extractor finds no key.
///
/// A rule without [`on_missing_key`](RateLimitLayer::on_missing_key) acts on
/// why there is no key ([`NoKey`](crate::NoKey)), safe by default:
///
/// | extractor | no key when | default |
/// |---|---|---|
/// | [`PeerIp`](crate::PeerIp), [`ClientIp`](crate::ClientIp) | the server gives no peer address (axum without `into_make_service_with_connect_info`) | `500`, always: a wiring mistake, never a pass |
/// | [`HeaderKey`](crate::HeaderKey) | the header is absent or empty | [`Reject`](MissingKey::Reject) |
/// | a closure | it returns `None`: the rule does not apply | [`Allow`](MissingKey::Allow) |
/// | [`Composite`](crate::Composite) | a part has none | that part's default |
/// | [`GlobalKey`](crate::GlobalKey), [`RouteKey`](crate::RouteKey) | never | |
///
/// Nothing is silent: every such request is counted in [`Stats`]
/// (`missing_key_allowed`, `missing_key_rejected`, `no_peer_address`) and in
/// `ratelimit_decisions_total` under the rule's policy (outcomes
/// `missing_key_allowed`, `missing_key_rejected`, `no_peer_address`; see
/// [`metrics`](crate::metrics)), and logged at `debug`; the first request a
/// layer lets through without a key is logged at `warn`, and the first
/// without a peer address at `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// This rule does not apply: the request passes it (other rules still
    /// apply). The default for closures.
    #[default]
    Allow,
    /// Refuse the request ([`Rejection::MissingKey`]: `429`, gRPC
    /// `RESOURCE_EXHAUSTED`). The default for [`HeaderKey`](crate::HeaderKey).
    Reject,
}

/// Reject denied requests at once, or make them wait for their turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Refuse a denied request at once (the default; servers).
    #[default]
    Reject,
    /// Wait until the request may pass, if that is within `max_delay`
    /// (clients calling a strict downstream API). A denied request sleeps
    /// until its `retry_after`, plus a little jitter so waiting workers do not
    /// retry in lockstep, then asks again; dropping the future during that
    /// wait consumes nothing.
    ///
    /// A leaky-bucket policy delays each admitted request to its slot, which
    /// spaces calls evenly. The slot is reserved when the request is
    /// admitted: a slot further away than `max_delay` is refused, and a
    /// request dropped while it waits for its slot still uses it up (a store
    /// cannot give a slot back). Size the bucket so that
    /// `capacity / rate <= max_delay` to avoid both.
    Wait {
        /// The longest a request may wait in total.
        max_delay: Duration,
    },
}

/// Rate-limits requests with one or more rules, in a store.
///
/// ```
/// use ratelimit_core::{MemoryStore, Policy, Rate};
/// use ratelimit_tower::{GlobalKey, PeerIp, RateLimitLayer, Rule};
/// use std::time::Duration;
///
/// // 5 requests per 10 seconds per client IP...
/// let layer = RateLimitLayer::new(
///     MemoryStore::new(),
///     Policy::sliding_window_log(5, Duration::from_secs(10))?,
///     PeerIp,
/// )
/// // ...and 1,000 per second for everyone together, all or nothing.
/// .and(Rule::new(Policy::gcra(1_000, Rate::per_second(1_000))?, GlobalKey::default()));
/// # Ok::<(), ratelimit_core::PolicyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer<St, P, J = HttpRejections> {
    pub(crate) stats: Arc<Stats>,
    pub(crate) store: St,
    pub(crate) rules: P,
    pub(crate) reject: J,
    pub(crate) mode: Mode,
    pub(crate) failure: FailurePolicy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) near_limit: f64,
}

impl<St, K> RateLimitLayer<St, Rule<K>> {
    /// Limits requests by `key` under `policy`, in `store`, at cost 1.
    pub fn new(store: St, policy: Policy, key: K) -> Self {
        RateLimitLayer::with_rules(store, Rule::new(policy, key))
    }
}

impl<St, P> RateLimitLayer<St, P> {
    /// Limits requests with `rules`: a [`Rule`], rules joined with
    /// [`Rule::and`], or a closure returning the [`Limits`](crate::Limits)
    /// for each request, possibly after an asynchronous lookup.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    /// use ratelimit_core::{MemoryStore, Policy, Rate};
    /// use ratelimit_tower::{Limit, Limits, RateLimitLayer};
    ///
    /// let free = Policy::gcra(10, Rate::per_minute(10))?.with_name("free")?;
    /// let pro = Policy::gcra(100, Rate::per_minute(100))?.with_name("pro")?;
    /// let tiers: Arc<HashMap<&'static str, Policy>> = Arc::new(HashMap::from([("key-pro", pro)]));
    ///
    /// let layer = RateLimitLayer::with_rules(MemoryStore::new(), move |req: &http::Request<()>| {
    ///     let api_key = req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec());
    ///     let (tiers, free) = (tiers.clone(), free.clone());
    ///     async move {
    ///         let Some(api_key) = api_key else { return Limits::reject() };
    ///         let policy = std::str::from_utf8(&api_key)
    ///             .ok()
    ///             .and_then(|k| tiers.get(k).cloned())
    ///             .unwrap_or(free);
    ///         Limits::one(Limit::new(policy, api_key, 1))
    ///     }
    /// });
    /// # let _ = layer;
    /// # Ok::<(), ratelimit_core::PolicyError>(())
    /// ```
    pub fn with_rules(store: St, rules: P) -> Self {
        RateLimitLayer {
            stats: Arc::default(),
            store,
            rules,
            reject: HttpRejections::default(),
            mode: Mode::default(),
            failure: FailurePolicy::default(),
            timeout: None,
            near_limit: crate::metrics::DEFAULT_NEAR_LIMIT,
        }
    }
}

impl<St, P> RateLimitLayer<St, P, HttpRejections> {
    /// Builds every refusal with `f` (HTTP requests only; see [`HttpRejections::custom`]).
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejection) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
    {
        self.reject = self.reject.with_custom(f);
        self
    }

    /// Which rate-limit headers to send on allowed and denied responses
    /// (default: the IETF `RateLimit-Policy` and `RateLimit` fields).
    pub fn headers(mut self, headers: RateLimitHeaders) -> Self {
        self.reject = self.reject.headers(headers);
        self
    }

    /// The body of HTTP refusals (default: problem+json).
    pub fn rejection_body(mut self, body: RejectionBody) -> Self {
        self.reject = self.reject.body(body);
        self
    }
}

impl<St, K, C, J> RateLimitLayer<St, Rule<K, C>, J> {
    /// Prices requests with `cost` (a [`Constant`](crate::Constant) or a closure over the request).
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<St, Rule<K, C2>, J> {
        RateLimitLayer {
            stats: self.stats,
            store: self.store,
            rules: self.rules.cost(cost),
            reject: self.reject,
            mode: self.mode,
            failure: self.failure,
            timeout: self.timeout,
            near_limit: self.near_limit,
        }
    }

    /// What to do with requests without a key (default: by extractor, see
    /// [`MissingKey`]).
    #[must_use]
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.rules = self.rules.on_missing_key(missing_key);
        self
    }

    /// The policy of the rule.
    pub fn policy(&self) -> &Policy {
        self.rules.policy()
    }
}

impl<St, P, J> RateLimitLayer<St, P, J> {
    /// Checks `rule` too, all or nothing with the rules already there.
    pub fn and<R>(self, rule: R) -> RateLimitLayer<St, And<P, R>, J> {
        RateLimitLayer {
            stats: self.stats,
            store: self.store,
            rules: And(self.rules, rule),
            reject: self.reject,
            mode: self.mode,
            failure: self.failure,
            timeout: self.timeout,
            near_limit: self.near_limit,
        }
    }

    /// Refusals become errors (a [`Rejection`] in a [`BoxError`](crate::BoxError)),
    /// for request types that are not HTTP.
    pub fn for_errors(self) -> RateLimitLayer<St, P, ErrorRejections> {
        RateLimitLayer {
            stats: self.stats,
            store: self.store,
            rules: self.rules,
            reject: ErrorRejections,
            mode: self.mode,
            failure: self.failure,
            timeout: self.timeout,
            near_limit: self.near_limit,
        }
    }

    /// Reject or wait (default: [`Mode::Reject`]).
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Wait up to `max_delay` for denied requests instead of refusing them
    /// (see [`Mode::Wait`]).
    #[must_use]
    pub fn wait(self, max_delay: Duration) -> Self {
        self.mode(Mode::Wait { max_delay })
    }

    /// What to do when the store cannot decide (default: [`FailurePolicy::Open`]).
    #[must_use]
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// What the layer has done when the store could not decide, shared by
    /// every service this layer built.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Allowed decisions that leave less than `fraction` of their policy's
    /// limit count in `ratelimit_near_limit_total` (default 0.1: under a
    /// tenth left). Clamped to `0.0..=1.0`; 0 (or NaN) counts none. Only
    /// recorded with the `metrics` feature (see [`metrics`](crate::metrics)).
    #[must_use]
    pub fn near_limit(mut self, fraction: f64) -> Self {
        self.near_limit = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The longest one store call may take before it counts as a failure
    /// (default: none here; stores such as `RedisStore` have their own).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl<S, St, P, J> Layer<S> for RateLimitLayer<St, P, J>
where
    St: Clone,
    P: Clone,
    J: Clone,
{
    type Service = RateLimit<S, St, P, J>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.clone())
    }
}
