//! The metrics `ratelimit-core` records, through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`): the state of each [`CircuitBreaker`](crate::CircuitBreaker).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_circuit_breaker_state` | gauge | `breaker` | 0 closed, 1 half-open, 2 open; set on every transition |
//! | `ratelimit_circuit_breaker_transitions_total` | counter | `breaker`, `from`, `to` | transitions; `from` and `to` are `closed`, `half_open` or `open` |
//! | `ratelimit_region_peer_lag_seconds` | gauge | `region`, `peer` | the observed lag `D`: everything `peer` admitted more than this long ago has landed in `region`'s Redis (`+Inf` before the first time), set every sync interval |
//! | `ratelimit_region_peer_clock_skew_seconds` | gauge | `region`, `peer` | `peer`'s clock minus `region`'s, estimated at `peer`'s last push |
//! | `ratelimit_region_overshoot_estimate` | gauge | `region`, `policy` | units of `policy` the other regions admitted that `region` had not heard of yet: each peer's recent rate times its lag, summed over peers and keys (the bound's extra term) |
//! | `ratelimit_region_peer_stale_total` | counter | `region`, `peer` | times `peer` became stale, or its clock too far off, for `region` (then counted at its conservative share) |
//! | `ratelimit_region_push_failures_total` | counter | `region`, `peer` | pushes of `region`'s counts to `peer` that failed (retried at the next sync) |
//!
//! `breaker` is the breaker's name ([`CircuitBreaker::with_name`](crate::CircuitBreaker::with_name),
//! `default` unless given). The gauge appears with the first transition: a
//! breaker that never opened has no series yet, and is closed.
//!
//! Without a recorder installed (`metrics::set_global_recorder`, or an
//! exporter such as `metrics-exporter-prometheus`), recording costs next to
//! nothing. The names and labels are a contract; `ratelimit-tower`'s
//! `metrics` module lists the layer's metrics.

/// Gauge: the state of a circuit breaker, 0 closed, 1 half-open, 2 open.
#[cfg(feature = "metrics")]
pub(crate) const CIRCUIT_BREAKER_STATE: &str = "ratelimit_circuit_breaker_state";

/// Counter: transitions of a circuit breaker, labelled `from` and `to`.
#[cfg(feature = "metrics")]
pub(crate) const CIRCUIT_BREAKER_TRANSITIONS: &str = "ratelimit_circuit_breaker_transitions_total";

/// The value of the gauge `ratelimit_circuit_breaker_state` for a state name.
#[cfg(feature = "metrics")]
fn gauge_value(state: &str) -> f64 {
    match state {
        "closed" => 0.0,
        "half_open" => 1.0,
        _ => 2.0,
    }
}

/// Describes this crate's metrics (their help text and unit) to the
/// installed recorder. Call it once, after installing the recorder;
/// `ratelimit_tower::metrics::describe` calls it too.
#[cfg(feature = "metrics")]
pub fn describe() {
    ::metrics::describe_gauge!(
        CIRCUIT_BREAKER_STATE,
        "State of a rate-limit store's circuit breaker: 0 closed, 1 half-open, 2 open."
    );
    ::metrics::describe_counter!(
        CIRCUIT_BREAKER_TRANSITIONS,
        "Transitions of a rate-limit store's circuit breaker, by from and to state."
    );
    ::metrics::describe_gauge!(
        REGION_PEER_LAG,
        ::metrics::Unit::Seconds,
        "Age of a region's freshest complete view of a peer region: the lag D (multi-region store)."
    );
    ::metrics::describe_gauge!(
        REGION_PEER_SKEW,
        ::metrics::Unit::Seconds,
        "A peer region's clock minus this region's, estimated at its last push (multi-region store)."
    );
    ::metrics::describe_gauge!(
        REGION_OVERSHOOT,
        "Units of a policy other regions admitted that this region had not heard of yet (multi-region store)."
    );
    ::metrics::describe_counter!(
        REGION_STALE_TRANSITIONS,
        "Times a peer region became stale and was counted at its conservative share."
    );
    ::metrics::describe_counter!(
        REGION_PUSH_FAILURES,
        "Failed pushes of a region's counts to a peer region."
    );
}

/// Records one transition of the breaker `name`.
#[cfg(feature = "metrics")]
pub(crate) fn record_transition(name: &str, from: &'static str, to: &'static str) {
    let name = name.to_owned();
    ::metrics::gauge!(CIRCUIT_BREAKER_STATE, "breaker" => name.clone()).set(gauge_value(to));
    ::metrics::counter!(
        CIRCUIT_BREAKER_TRANSITIONS,
        "breaker" => name,
        "from" => from,
        "to" => to
    )
    .increment(1);
}

/// Gauge: the observed lag `D` of a peer region, in seconds: everything it
/// admitted more than this long ago has landed in this region's Redis
/// (`+Inf` before the first time); labelled `region` and `peer`, set every
/// sync interval by a [`MultiRegionStore`](crate::multi_region::MultiRegionStore).
#[cfg(feature = "metrics")]
pub(crate) const REGION_PEER_LAG: &str = "ratelimit_region_peer_lag_seconds";

/// Gauge: a peer region's clock minus this region's, in seconds, estimated
/// at the peer's last push; labelled `region` and `peer`.
#[cfg(feature = "metrics")]
pub(crate) const REGION_PEER_SKEW: &str = "ratelimit_region_peer_clock_skew_seconds";

/// Gauge: units of a policy that the other regions admitted and this region
/// had not heard of yet, estimated as each peer's recent rate under the
/// policy times its lag, summed over peers and keys (the extra term of the
/// bound); labelled `region` and `policy`, never a key.
#[cfg(feature = "metrics")]
pub(crate) const REGION_OVERSHOOT: &str = "ratelimit_region_overshoot_estimate";

/// Counter: times a peer region became stale, or its clock too far off
/// (then counted at its conservative share), labelled `region` and `peer`.
#[cfg(feature = "metrics")]
pub(crate) const REGION_STALE_TRANSITIONS: &str = "ratelimit_region_peer_stale_total";

/// Counter: pushes to a peer region that failed, labelled `region` and `peer`.
#[cfg(feature = "metrics")]
pub(crate) const REGION_PUSH_FAILURES: &str = "ratelimit_region_push_failures_total";
