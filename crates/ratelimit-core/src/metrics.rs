//! The metrics `ratelimit-core` records, through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`): the state of each [`CircuitBreaker`](crate::CircuitBreaker).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `ratelimit_circuit_breaker_state` | gauge | `breaker` | 0 closed, 1 half-open, 2 open; set on every transition |
//! | `ratelimit_circuit_breaker_transitions_total` | counter | `breaker`, `from`, `to` | transitions; `from` and `to` are `closed`, `half_open` or `open` |
//! | `ratelimit_region_peer_staleness_seconds` | gauge | `region`, `peer` | seconds since `region`'s Redis last heard from `peer` (`+Inf` before the first time), set every sync interval |
//! | `ratelimit_region_peer_stale_total` | counter | `region`, `peer` | times `peer` became stale for `region` (then counted at its conservative share) |
//! | `ratelimit_region_push_failures_total` | counter | `region`, `peer` | pushes of `region`'s counts to `peer` that failed (retried at the next sync) |
//!
//! `breaker` is the breaker's name ([`CircuitBreaker::with_name`](crate::CircuitBreaker::with_name),
//! `default` unless given). The gauge appears with the first transition: a
//! breaker that never opened has no series yet, and is closed.
//!
//! Without a recorder installed (`metrics::set_global_recorder`, or an
//! exporter such as `metrics-exporter-prometheus`), recording costs next to
//! nothing. The names are constants here so dashboards and tests can share
//! them; `ratelimit-tower`'s `metrics` module lists the layer's metrics.

/// Gauge: the state of a circuit breaker, 0 closed, 1 half-open, 2 open.
pub const CIRCUIT_BREAKER_STATE: &str = "ratelimit_circuit_breaker_state";

/// Counter: transitions of a circuit breaker, labelled `from` and `to`.
pub const CIRCUIT_BREAKER_TRANSITIONS: &str = "ratelimit_circuit_breaker_transitions_total";

/// The value of [`CIRCUIT_BREAKER_STATE`] for a state name.
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
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
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
        REGION_PEER_STALENESS,
        ::metrics::Unit::Seconds,
        "Seconds since a region last heard from a peer region (multi-region store)."
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

/// Gauge: seconds since this region's Redis last heard from a peer region
/// (`+Inf` before the first time), labelled `region` and `peer`; set every
/// sync interval by a [`MultiRegionStore`](crate::multi_region::MultiRegionStore).
pub const REGION_PEER_STALENESS: &str = "ratelimit_region_peer_staleness_seconds";

/// Counter: times a peer region became stale (counted at its conservative
/// share), labelled `region` and `peer`.
pub const REGION_STALE_TRANSITIONS: &str = "ratelimit_region_peer_stale_total";

/// Counter: pushes to a peer region that failed, labelled `region` and `peer`.
pub const REGION_PUSH_FAILURES: &str = "ratelimit_region_push_failures_total";
