//! What the layer records: metrics through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), and `tracing` events. A limit checked outside
//! a layer through a [`Recorder`] (`ratelimit-axum`'s `Limiter`, such as
//! a login guard in a handler) is recorded the same way, under the same names.
//!
//! # Metrics
//!
//! With the `metrics` feature, the layer records these into whatever recorder
//! the application installed (`metrics-exporter-prometheus`, for one). The
//! names and labels are a contract:
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `ratelimit_decisions_total` | counter | `policy`, `outcome` | one per policy per decision (below) |
//! | `ratelimit_near_limit_total` | counter | `policy` | allowed decisions leaving less than a fraction of the limit ([`RateLimitLayer::near_limit`](crate::RateLimitLayer::near_limit), default 0.1) |
//! | `ratelimit_store_call_duration_seconds` | histogram | `outcome` (`ok`, `error`) | each call the layer (or a [`Recorder`]) makes to its store, timeout included |
//! | `ratelimit_circuit_breaker_state` | gauge | `breaker` | 0 closed, 1 half-open, 2 open (recorded by `ratelimit-core`'s `CircuitBreaker`) |
//! | `ratelimit_circuit_breaker_transitions_total` | counter | `breaker`, `from`, `to` | breaker transitions (`closed`, `half_open`, `open`) |
//! | `ratelimit_settlements_total` | counter | `policy`, `outcome` | one per limit of each request reserved under a rule that settles after the response ([`Settlement`](crate::Settlement)), once settled (below) |
//! | `ratelimit_config_reloads_total` | counter | `outcome` (`loaded`, `failed`) | each reload of a `config::ReloadableRules` (feature `config`), the file watcher's included; `failed` counts every refused one: unreadable, invalid, changing while read, an algorithm changed under one name, rules dropped |
//!
//! The `outcome` of a decision is one of:
//!
//! | outcome | meaning |
//! |---|---|
//! | `allowed` | the store allowed it, and every other limit of the request too: it was counted |
//! | `not_consumed` | the store would have allowed it, but another limit of the same request denied, and limits are all or nothing: nothing was counted against this policy |
//! | `denied` | the store denied it (an enforced policy) |
//! | `shadow_denied` | a [shadow](ratelimit_core::Policy::with_shadow) policy denied it; the request was not refused for it |
//! | `error` | an outage: the store could not be reached or did not answer in time ([`StoreError::is_outage`](ratelimit_core::StoreError::is_outage)); the failure policy applied (for a shadow policy: nothing happened to the request) |
//! | `invalid` | the store answered with an error that is not an outage (a policy conflict, a full in-memory store, a reply that does not decode, a permission the Redis user lacks): a configuration mistake or a bug. The request was refused (`500`, or `503` for a full store) whatever the failure policy says; a shadow policy's error leaves the request alone |
//! | `fallback` | a `FallbackStore` decided in its local store while the primary was down (allowed or denied) |
//! | `cached_denied` | a `DeniedCache` denied it without asking the store (a shadow policy's cached denial counts as `shadow_denied`) |
//! | `missing_key_allowed` | the rule found no key and let the request pass it ([`MissingKey::Allow`](crate::MissingKey::Allow)) |
//! | `missing_key_rejected` | the rule found no key and refused the request ([`MissingKey::Reject`](crate::MissingKey::Reject)) |
//! | `no_peer_address` | the rule needs the peer address and the server gives none: `500` ([`NoKey::NoPeerAddress`](crate::NoKey::NoPeerAddress)) |
//!
//! The `outcome` of a settlement is one of:
//!
//! | outcome | meaning |
//! |---|---|
//! | `settled` | charged the cost the response named |
//! | `clamped` | the response named more than twice the policy's limit: charged twice the limit |
//! | `refunded` | the response was a failure (`5xx` by default): the reservation was given back |
//! | `cancelled` | the request ended without a response head (dropped, or its service failed): the reservation was given back |
//! | `cancelled_kept` | the same, under a rule that keeps the estimate then |
//! | `missing_cost` | the response named no cost: the estimate stays (1 for an estimate of 0) |
//! | `invalid_cost` | the response named a cost that is not a whole number: the estimate stays (1 for an estimate of 0) |
//! | `error` | an outage: the store could not settle; the reservation stays as it was taken |
//! | `invalid` | the store answered the settlement with an error that is not an outage; the reservation stays |
//!
//! `policy` is the policy's name ([`Policy::with_name`](ratelimit_core::Policy::with_name)).
//! Keys never appear in labels: a label per client would grow without bound
//! and leak who the clients are.
//!
//! Every store decision counts. In [`Mode::Wait`](crate::Mode::Wait) a request
//! that was denied, waited and then passed counts once `denied` and once
//! `allowed`. A rule that found no key counts once under its policy with one
//! of the `missing_key_*`/`no_peer_address` outcomes. A request refused before
//! any decision for a cost above what a policy can ever admit, or by a rule
//! provider's own `Limits::reject()`, is not counted here.
//!
//! Call `describe()` (feature `metrics`) once after installing the recorder,
//! to give each metric its help text and unit.
//!
//! # Tracing
//!
//! - Every decision is a `debug` event with the `policy`, the `outcome`,
//!   `remaining` and `limit`, and `key_hash`: the first 16 hex digits of a
//!   keyed hash of the key (the hash key is random, drawn once per layer or
//!   [`Recorder`] when it is built and shared by its clones, so the same
//!   client has the same `key_hash` throughout one layer's logs, and the
//!   raw key cannot be recovered from them, not even by trying every IP
//!   address).
//! - An outage is a `warn` event with the error and what the failure policy
//!   did; any other store error is an `error` event (the request is refused).
//! - With a `FallbackStore`, its `CircuitBreaker` logs each transition
//!   (opening at `warn`, probing and closing at `info`).

use std::fmt;
use std::hash::{BuildHasher, RandomState};

use ratelimit_core::{Decision, DecisionSource, Policy, Store, StoreError};

use crate::keys::Key;

/// Counter: decisions, labelled `policy` and `outcome`.
pub(crate) const DECISIONS: &str = "ratelimit_decisions_total";

/// Counter: allowed decisions close to the limit, labelled `policy`.
#[cfg(feature = "metrics")]
pub(crate) const NEAR_LIMIT: &str = "ratelimit_near_limit_total";

/// Histogram: the duration of each store call in seconds, labelled `outcome`
/// (`ok` or `error`): the name to set its buckets by, such as
/// `metrics-exporter-prometheus`'s `set_buckets_for_metric`.
pub const STORE_CALL_DURATION: &str = "ratelimit_store_call_duration_seconds";

/// Counter: settlements after the response, one per limit, labelled
/// `policy` and `outcome`.
pub(crate) const SETTLEMENTS: &str = "ratelimit_settlements_total";

/// Counter: reloads of a `config::ReloadableRules` (feature `config`),
/// labelled `outcome` (`loaded` or `failed`).
#[cfg(feature = "metrics")]
pub(crate) const CONFIG_RELOADS: &str = "ratelimit_config_reloads_total";

/// The default fraction of the limit under which an allowed decision counts
/// as near the limit.
pub(crate) const DEFAULT_NEAR_LIMIT: f64 = 0.1;

/// Describes every metric of the layer and of `ratelimit-core` (help text
/// and unit) to the installed recorder. Call it once, after installing it.
///
/// ```
/// // After installing a recorder, e.g. metrics_exporter_prometheus's.
/// ratelimit_tower::metrics::describe();
/// ```
#[cfg(feature = "metrics")]
pub fn describe() {
    ::metrics::describe_counter!(
        DECISIONS,
        "Rate-limit decisions, one per policy per decision, by policy and outcome \
         (allowed, not_consumed, denied, shadow_denied, error, fallback, cached_denied, \
         missing_key_allowed, missing_key_rejected, no_peer_address)."
    );
    ::metrics::describe_counter!(
        NEAR_LIMIT,
        "Allowed rate-limit decisions that left less than the near-limit fraction of the limit."
    );
    ::metrics::describe_histogram!(
        STORE_CALL_DURATION,
        ::metrics::Unit::Seconds,
        "Duration of each call from a rate limiter to its store, by outcome (ok, error)."
    );
    ::metrics::describe_counter!(
        SETTLEMENTS,
        "Settlements of costs known after the response, one per limit, by policy and outcome \
         (settled, clamped, refunded, cancelled, cancelled_kept, missing_cost, invalid_cost, \
         error, invalid)."
    );
    ::metrics::describe_counter!(
        CONFIG_RELOADS,
        "Reloads of the rate-limit configuration, by outcome (loaded, failed)."
    );
    ratelimit_core::metrics::describe();
}

/// The `outcome` label of a decision; `all_allowed`: whether every limit
/// decided with it (all or nothing) allowed, so that it consumed.
pub(crate) fn outcome(policy: &Policy, decision: &Decision, all_allowed: bool) -> &'static str {
    let source = decision.source();
    if source == DecisionSource::Fallback {
        "fallback"
    } else if decision.is_allowed() && all_allowed {
        "allowed"
    } else if decision.is_allowed() {
        "not_consumed"
    } else if policy.is_shadow() {
        "shadow_denied"
    } else if source == DecisionSource::DeniedCache {
        "cached_denied"
    } else {
        "denied"
    }
}

/// Records limits checked outside a layer as a layer records its own, with
/// a key hash seed of its own, drawn when it is made and shared by its
/// clones (see [`check`](Recorder::check)).
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// The seed of the `key_hash` in events: random, so a logged hash cannot
    /// be turned back into its key, and one per recorder rather than per
    /// process, so no state is shared between layers.
    keys: RandomState,
}

impl Recorder {
    /// Asks `store` to check `key` against `policy` at `cost`, as the layer
    /// asks for one limit, and records the answer as the layer records its
    /// own: the store call's duration, the decision counted by policy and
    /// outcome (and near the limit under the default fraction, 0.1), a
    /// `debug` event with the key's hash, never the key. A cost the policy
    /// can never admit ([`StoreError::CostExceedsLimit`]) is not counted, as
    /// on the layer.
    ///
    /// For limits checked outside a layer, so that they show where the
    /// layer's do: `ratelimit-axum`'s `Limiter` (a login guard in a handler)
    /// checks through one. The key is a [`Key`], so a value is hashed here
    /// as the layer hashes it and both share its budget.
    ///
    /// ```
    /// use ratelimit_tower::metrics::Recorder;
    /// use ratelimit_tower::{Key, MemoryStore, Policy};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let exports = Policy::fixed_window(10, Duration::from_secs(3600))?.with_name("exports")?;
    /// let recorder = Recorder::default();
    /// let user = Key::from("user-7");
    /// let decision = recorder.check(&store, &user, &exports, 1).await?;
    /// assert!(decision.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check<St: Store>(
        &self,
        store: &St,
        key: &Key,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let key = key.as_bytes();
        let timer = StoreCall::start();
        let answer = store.check(key, policy, cost).await;
        timer.finish(answer.is_ok());
        match &answer {
            Ok(decision) => record_decision(
                self,
                policy,
                key,
                decision,
                decision.is_allowed(),
                DEFAULT_NEAR_LIMIT,
            ),
            Err(StoreError::CostExceedsLimit { .. }) => {}
            Err(error) => record_error(self, policy, key, error),
        }
        answer
    }
}

/// Records one decision: counters and a `debug` event; `all_allowed`:
/// whether every limit decided with it allowed (see [`outcome`]).
// Inlined: without metrics, what remains is a test of the `debug` level,
// cheaper than the call with its six arguments.
#[inline(always)]
pub(crate) fn record_decision(
    recorder: &Recorder,
    policy: &Policy,
    key: &[u8],
    decision: &Decision,
    all_allowed: bool,
    near_limit: f64,
) {
    // Worked out inside the event, which evaluates its fields only when it
    // is enabled: without metrics, most decisions need no outcome at all.
    tracing::debug!(
        policy = policy.name(),
        outcome = outcome(policy, decision, all_allowed),
        remaining = decision.remaining(),
        limit = decision.limit(),
        key_hash = %KeyHash(&recorder.keys, key),
        "rate-limit decision"
    );
    #[cfg(feature = "metrics")]
    {
        let outcome = outcome(policy, decision, all_allowed);
        let name = policy.name().to_owned();
        if outcome == "allowed" && is_near_limit(decision, near_limit) {
            ::metrics::counter!(NEAR_LIMIT, "policy" => name.clone()).increment(1);
        }
        ::metrics::counter!(DECISIONS, "policy" => name, "outcome" => outcome).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = near_limit;
}

/// Records a policy the store could not decide: outcome `error` for an
/// outage, `invalid` for any other error.
pub(crate) fn record_error(recorder: &Recorder, policy: &Policy, key: &[u8], error: &StoreError) {
    let outcome = if error.is_outage() {
        "error"
    } else {
        "invalid"
    };
    let (message, counter) = ("rate-limit decision", DECISIONS);
    record_outcome(recorder, policy, key, outcome, message, counter);
}

/// Records the settlement of one limit: a `debug` event and a counter
/// labelled with its `outcome` (see the module docs).
pub(crate) fn record_settlement(
    recorder: &Recorder,
    policy: &Policy,
    key: &[u8],
    outcome: &'static str,
) {
    let (message, counter) = ("rate-limit settlement", SETTLEMENTS);
    record_outcome(recorder, policy, key, outcome, message, counter);
}

/// Records an `outcome` of `policy` for `key` that carries no decision: the
/// `debug` event `message` and a count under `counter`.
fn record_outcome(
    recorder: &Recorder,
    policy: &Policy,
    key: &[u8],
    outcome: &'static str,
    message: &'static str,
    counter: &'static str,
) {
    tracing::debug!(
        policy = policy.name(),
        outcome,
        key_hash = %KeyHash(&recorder.keys, key),
        "{message}"
    );
    #[cfg(feature = "metrics")]
    ::metrics::counter!(counter, "policy" => policy.name().to_owned(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = counter;
}

/// Records the rules that found no key for a request: a `debug` event and a
/// decision counted under the rule's policy.
pub(crate) fn record_missed(missed: &[crate::rules::rule::Missed]) {
    for rule in missed {
        let outcome = match (rule.cause, rule.action) {
            (crate::NoKey::NoPeerAddress, _) => "no_peer_address",
            (_, crate::MissingKey::Reject) => "missing_key_rejected",
            (_, crate::MissingKey::Allow) => "missing_key_allowed",
        };
        tracing::debug!(
            policy = rule.policy.name(),
            outcome,
            cause = ?rule.cause,
            "rate-limit rule found no key"
        );
        #[cfg(feature = "metrics")]
        ::metrics::counter!(DECISIONS, "policy" => rule.policy.name().to_owned(), "outcome" => outcome)
            .increment(1);
    }
}

/// Whether an allowed decision leaves less than `fraction` of its limit.
#[cfg(feature = "metrics")]
fn is_near_limit(decision: &Decision, fraction: f64) -> bool {
    (decision.remaining() as f64) < fraction * decision.limit() as f64
}

/// Times one store call.
pub(crate) struct StoreCall {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl StoreCall {
    pub(crate) fn start() -> Self {
        StoreCall {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    pub(crate) fn finish(self, ok: bool) {
        // Each label a literal, so the macro's key is a static one: no
        // allocation and no hashing per call.
        #[cfg(feature = "metrics")]
        if ok {
            ::metrics::histogram!(STORE_CALL_DURATION, "outcome" => "ok")
                .record(self.started.elapsed());
        } else {
            ::metrics::histogram!(STORE_CALL_DURATION, "outcome" => "error")
                .record(self.started.elapsed());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = ok;
    }
}

/// A key as it appears in logs: 16 hex digits of a keyed hash, never the key.
struct KeyHash<'a>(&'a RandomState, &'a [u8]);

impl fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hash = self.0.hash_one(self.1);
        write!(f, "{hash:016x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hashes_are_stable_for_a_recorder_and_its_clones_and_hide_the_key() {
        let recorder = Recorder::default();
        let clone = recorder.clone();
        let other = Recorder::default();
        let key = b"203.0.113.7";
        let shown = KeyHash(&recorder.keys, key).to_string();
        assert_eq!(shown.len(), 16);
        assert!(shown.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(shown, KeyHash(&recorder.keys, b"203.0.113.7").to_string());
        assert_eq!(shown, KeyHash(&clone.keys, b"203.0.113.7").to_string());
        assert_ne!(shown, KeyHash(&recorder.keys, b"203.0.113.8").to_string());
        // Another recorder draws another seed (equal by chance 1 in 2^64).
        assert_ne!(shown, KeyHash(&other.keys, key).to_string());
        assert!(!shown.contains("203"));
    }

    /// `describe` describes each metric once, with its kind, unit and help
    /// text, in a fixed order: the layer's (the store call histogram
    /// between the counts of decisions and those of settlements), then
    /// `ratelimit-core`'s.
    #[cfg(feature = "metrics")]
    #[test]
    fn describe_describes_every_metric_once_in_order() {
        use ::metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
        use std::sync::Mutex;

        type Described = (&'static str, String, Option<Unit>, String);
        #[derive(Default)]
        struct Descriptions(Mutex<Vec<Described>>);
        impl Descriptions {
            fn push(&self, kind: &'static str, name: &KeyName, unit: Option<Unit>, help: &str) {
                let entry = (kind, name.as_str().to_owned(), unit, help.to_owned());
                self.0.lock().unwrap().push(entry);
            }
        }
        impl ::metrics::Recorder for Descriptions {
            fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
                self.push("counter", &name, unit, &help);
            }
            fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
                self.push("gauge", &name, unit, &help);
            }
            fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
                self.push("histogram", &name, unit, &help);
            }
            fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
                Counter::noop()
            }
            fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
                Gauge::noop()
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
                Histogram::noop()
            }
        }

        let recorder = Descriptions::default();
        ::metrics::with_local_recorder(&recorder, describe);
        let described = recorder.0.into_inner().unwrap();
        for (_, name, _, help) in &described {
            assert!(help.ends_with('.'), "{name}: {help:?}");
        }
        let order: Vec<_> = described
            .iter()
            .map(|(kind, name, unit, _)| (*kind, name.as_str(), *unit))
            .collect();
        let seconds = Some(Unit::Seconds);
        assert_eq!(
            order,
            [
                ("counter", DECISIONS, None),
                ("counter", NEAR_LIMIT, None),
                ("histogram", STORE_CALL_DURATION, seconds),
                ("counter", SETTLEMENTS, None),
                ("counter", CONFIG_RELOADS, None),
                ("gauge", "ratelimit_circuit_breaker_state", None),
                (
                    "counter",
                    "ratelimit_circuit_breaker_transitions_total",
                    None
                ),
                ("gauge", "ratelimit_region_peer_lag_seconds", seconds),
                ("gauge", "ratelimit_region_peer_clock_skew_seconds", seconds),
                ("gauge", "ratelimit_region_overshoot_estimate", None),
                ("counter", "ratelimit_region_peer_stale_total", None),
                ("counter", "ratelimit_region_push_failures_total", None),
            ]
        );
    }

    #[test]
    fn outcomes() {
        let policy = Policy::gcra(10, ratelimit_core::Rate::per_second(1)).unwrap();
        let shadow = policy.clone().with_shadow(true);
        let allowed = Decision::allow(10, 9, 1);
        let denied = Decision::deny(10, 0, 1, 1);
        assert_eq!(outcome(&policy, &allowed, true), "allowed");
        assert_eq!(outcome(&policy, &allowed, false), "not_consumed");
        assert_eq!(outcome(&policy, &denied, false), "denied");
        assert_eq!(outcome(&policy, &denied, true), "denied");
        assert_eq!(outcome(&shadow, &denied, true), "shadow_denied");
        assert_eq!(outcome(&shadow, &allowed, true), "allowed");
        let cached = denied.clone().with_source(DecisionSource::DeniedCache);
        assert_eq!(outcome(&policy, &cached, true), "cached_denied");
        assert_eq!(outcome(&shadow, &cached, true), "shadow_denied");
        let fallback = denied.with_source(DecisionSource::Fallback);
        assert_eq!(outcome(&policy, &fallback, true), "fallback");
        assert_eq!(outcome(&shadow, &fallback, true), "fallback");
    }
}
