//! The layer's options: what to do on a store outage ([`FailurePolicy`]),
//! without a key ([`MissingKey`]), with a denied request ([`Mode`]), and
//! the counts of what it did outside a decision ([`Stats`]). A leaf module:
//! the rules, the decision and the layer import it, it imports none of them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::StoreError;

/// What to do when the store cannot decide because of an outage: it is
/// unreachable or timed out ([`StoreError::is_outage`]).
///
/// Only outages reach a failure policy. Any other error is a configuration
/// mistake, a bug or a refusal (a policy conflict, a reply that does not
/// decode, a permission the Redis user lacks, a full in-memory store, whose
/// bound exists to keep new keys out): the request is refused (`500`, or
/// `503` for a full store), logged at `error` and counted (metrics outcome
/// `invalid`, [`Stats::refused_on_error`]), whatever this says.
///
/// # The default: [`Open`](FailurePolicy::Open)
///
/// [`RateLimitLayer`](crate::RateLimitLayer) and `ratelimit-axum`'s `Limiter`
/// both default to `Open`, for one reason: a rate limiter in front of a
/// service protects it from its clients, and an outage of the limiter's
/// store (Redis restarting, a network partition) should not become an outage
/// of the service. A store that cannot answer says nothing about the client
/// (an in-process limiter such as governor has no store to lose, and never
/// refuses for one). Since only outages reach this policy, failing open
/// never lifts a limit for a mistake or a hostile input, and every request it
/// lets through is logged at `warn` and counted (the metrics outcome
/// `error`; on the layer, [`Stats::failed_open`]). Where an outage must not lift the
/// limit (logins, a paid downstream API), say so: [`Closed`](FailurePolicy::Closed),
/// or keep deciding in memory while the store is down with
/// `ratelimit_core::FallbackStore`.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through (the default): the service stays available
    /// while its limiter's store is down.
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
/// not decide, when a rule found no key, and how settlements after the
/// response went ([`Settlement`](crate::Settlement)). Each store failure is
/// also logged with `tracing`: an outage at `warn`, any other error at
/// `error`; missing keys are logged as described on [`MissingKey`], and
/// costs missing, invalid or clamped as described on
/// [`Settlement`](crate::Settlement).
#[derive(Default)]
pub struct Stats {
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    refused_on_error: AtomicU64,
    missing_key_allowed: LoggedOnce,
    missing_key_rejected: AtomicU64,
    no_peer_address: LoggedOnce,
    settle_failed: AtomicU64,
    costs_missing: LoggedOnce,
    costs_invalid: LoggedOnce,
    costs_clamped: LoggedOnce,
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

    /// Requests refused because the store answered with an error that is not
    /// an outage (a configuration mistake, a bug, a full in-memory store),
    /// whatever the failure policy.
    pub fn refused_on_error(&self) -> u64 {
        self.refused_on_error.load(Ordering::Relaxed)
    }

    /// Requests that passed a rule without a key ([`MissingKey::Allow`]):
    /// that rule did not limit them.
    pub fn missing_key_allowed(&self) -> u64 {
        self.missing_key_allowed.count()
    }

    /// Requests refused because a rule found no key ([`MissingKey::Reject`],
    /// or a rule provider's [`Limits::reject`](crate::Limits::reject)).
    pub fn missing_key_rejected(&self) -> u64 {
        self.missing_key_rejected.load(Ordering::Relaxed)
    }

    /// Requests answered `500` because the server gave no peer address
    /// (see [`NoKey::NoPeerAddress`](crate::NoKey::NoPeerAddress)).
    pub fn no_peer_address(&self) -> u64 {
        self.no_peer_address.count()
    }

    /// Settlements the store could not make (an outage, or an error that is
    /// not one): the request had run, and its reservations stayed as they
    /// were taken.
    pub fn settle_failed(&self) -> u64 {
        self.settle_failed.load(Ordering::Relaxed)
    }

    /// Limits whose response named no cost (no header, no extension): they
    /// kept their estimate.
    pub fn costs_missing(&self) -> u64 {
        self.costs_missing.count()
    }

    /// Limits whose response named a cost that is not a whole number (or
    /// sent its header twice): they kept their estimate.
    pub fn costs_invalid(&self) -> u64 {
        self.costs_invalid.count()
    }

    /// Limits whose response named more than twice the policy's limit: they
    /// were charged twice the limit.
    pub fn costs_clamped(&self) -> u64 {
        self.costs_clamped.count()
    }

    pub(crate) fn record_settle_failed(&self) {
        self.settle_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a response without a cost; `true` the first time, to log it
    /// once per layer.
    pub(crate) fn record_cost_missing(&self) -> bool {
        self.costs_missing.record()
    }

    /// Counts a response with an invalid cost; `true` the first time.
    pub(crate) fn record_cost_invalid(&self) -> bool {
        self.costs_invalid.record()
    }

    /// Counts a response with a cost clamped; `true` the first time.
    pub(crate) fn record_cost_clamped(&self) -> bool {
        self.costs_clamped.record()
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
        self.no_peer_address.record()
    }

    /// Counts a request refused for a missing key.
    pub(crate) fn record_missing_rejected(&self) {
        self.missing_key_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that passed a rule without a key; `true` the first
    /// time, to log it once per layer.
    pub(crate) fn record_missing_allowed(&self) -> bool {
        self.missing_key_allowed.record()
    }
}

// Written out so that each count, and whether its first time was logged,
// is a field of its own, named as its getter: `LoggedOnce` is internal.
impl fmt::Debug for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stats")
            .field("failed_open", &self.failed_open)
            .field("failed_closed", &self.failed_closed)
            .field("refused_on_error", &self.refused_on_error)
            .field("missing_key_allowed", &self.missing_key_allowed.count)
            .field("missing_key_rejected", &self.missing_key_rejected)
            .field("no_peer_address", &self.no_peer_address.count)
            .field("logged_no_peer", &self.no_peer_address.logged)
            .field("logged_missing_allowed", &self.missing_key_allowed.logged)
            .field("settle_failed", &self.settle_failed)
            .field("costs_missing", &self.costs_missing.count)
            .field("costs_invalid", &self.costs_invalid.count)
            .field("costs_clamped", &self.costs_clamped.count)
            .field("logged_cost_missing", &self.costs_missing.logged)
            .field("logged_cost_invalid", &self.costs_invalid.logged)
            .field("logged_cost_clamped", &self.costs_clamped.logged)
            .finish()
    }
}

/// A count of what a layer logs only the first time it happens: the count,
/// and whether that first time was logged.
#[derive(Default)]
struct LoggedOnce {
    count: AtomicU64,
    logged: AtomicBool,
}

impl LoggedOnce {
    /// Counts one; `true` the first time, to log it.
    fn record(&self) -> bool {
        self.count.fetch_add(1, Ordering::Relaxed);
        !self.logged.swap(true, Ordering::Relaxed)
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// What to do with a request for which a rule's key extractor finds no key.
///
/// A rule without [`on_missing_key`](crate::RateLimitLayer::on_missing_key) acts on
/// why there is no key ([`NoKey`](crate::NoKey)), safe by default:
///
/// | extractor | no key when | default |
/// |---|---|---|
/// | [`PeerIp`](struct@crate::PeerIp), [`ClientIp`](crate::ClientIp) | the server gives no peer address (axum without `into_make_service_with_connect_info`) | `500`, always: a wiring mistake, never a pass |
/// | [`HeaderKey`](crate::HeaderKey) | the header is absent or empty | [`Reject`](MissingKey::Reject) |
/// | a closure | it returns `None`: the rule does not apply (to fall back to the peer address, use [`Fallback::new(closure, PeerIp)`](crate::Fallback::new), which refuses a missing one as `PeerIp` does) | [`Allow`](MissingKey::Allow) |
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
    /// Refuse the request ([`Rejection::MissingKey`](crate::Rejection::MissingKey): `429`, gRPC
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
    /// A request denied by a concurrency limit waits for a release, not only
    /// for a lease's end: no store announces a release (across instances it
    /// would take a notification channel), so it asks again after 10 ms, then
    /// twice as long each time up to 250 ms (never later than the soonest
    /// lease's end), until it passes or `max_delay` would be exceeded. It
    /// passes at most 250 ms, plus jitter, after a slot frees.
    ///
    /// A leaky-bucket policy delays each admitted request to its slot, which
    /// spaces calls evenly. The slot, and every other limit of the request,
    /// is taken when the request is admitted: a slot further away than
    /// `max_delay` is refused, and the refused request, or one dropped while
    /// it waits for its slot, gives back everything it took
    /// ([`Store::refund`](ratelimit_core::Store::refund), best effort; a
    /// store without refunds keeps the consumption). Size the bucket so that
    /// `capacity / rate <= max_delay` to avoid refusals.
    Wait {
        /// The longest a request may wait in total.
        max_delay: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every count and every first-time flag shows in `Stats`' `Debug`, one
    /// field each, in the order of the counts the getters give.
    #[test]
    fn stats_debug_shows_each_count_and_whether_it_was_logged() {
        let stats = Stats::default();
        stats.record(true);
        stats.record(false);
        stats.record(false);
        stats.record_refused_on_error();
        assert!(stats.record_missing_allowed());
        assert!(!stats.record_missing_allowed());
        stats.record_missing_rejected();
        assert!(stats.record_no_peer());
        stats.record_settle_failed();
        assert!(stats.record_cost_missing());
        assert!(!stats.record_cost_missing());
        assert!(!stats.record_cost_missing());
        assert!(stats.record_cost_clamped());
        assert_eq!(
            format!("{stats:?}"),
            "Stats { failed_open: 1, failed_closed: 2, refused_on_error: 1, \
             missing_key_allowed: 2, missing_key_rejected: 1, no_peer_address: 1, \
             logged_no_peer: true, logged_missing_allowed: true, settle_failed: 1, \
             costs_missing: 3, costs_invalid: 0, costs_clamped: 1, \
             logged_cost_missing: true, logged_cost_invalid: false, \
             logged_cost_clamped: true }"
        );
    }
}
