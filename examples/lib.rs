//! Helpers shared by the examples (see the `[[example]]` targets of this package).

use std::time::Duration;

/// Parses a duration such as `500ms`, `10s`, `2m`, `1h` or `1d`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(ratelimit_examples::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert!(ratelimit_examples::parse_duration("10 parsecs").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: missing unit (use us, ms, s, m, h or d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number before the unit"))?;
    let micros_per_unit: u64 = match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use us, ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(micros_per_unit)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("{text:?}: too long"))
}

/// The policy named on the command line: `--algorithm` with `--limit` per
/// `--window`. For token bucket, GCRA and leaky bucket, `limit` is the burst
/// capacity and the rate is `limit / window`; for concurrency, `limit` is the
/// maximum in flight and `window` the lease.
///
/// ```
/// use std::time::Duration;
/// let p = ratelimit_examples::policy_from_flags("gcra", 10, Duration::from_secs(1)).unwrap();
/// assert_eq!(p.limit(), 10);
/// assert!(ratelimit_examples::policy_from_flags("nope", 10, Duration::from_secs(1)).is_err());
/// ```
pub fn policy_from_flags(
    algorithm: &str,
    limit: u64,
    window: Duration,
) -> Result<ratelimit_core::Policy, String> {
    use ratelimit_core::{Policy, Rate};
    let rate = Rate::new(limit, window);
    match algorithm {
        "fixed-window" => Policy::fixed_window(limit, window),
        "sliding-log" => Policy::sliding_window_log(limit, window),
        "sliding-window" => Policy::sliding_window_counter(limit, window),
        "token-bucket" => Policy::token_bucket(limit, rate),
        "gcra" => Policy::gcra(limit, rate),
        "leaky-bucket" => Policy::leaky_bucket(limit, rate),
        "concurrency" => Policy::concurrency(limit, window),
        other => {
            return Err(format!(
                "unknown algorithm {other:?} (fixed-window, sliding-log, sliding-window, token-bucket, gcra, leaky-bucket, concurrency)"
            ));
        }
    }
    .map_err(|e| e.to_string())
}

/// A Prometheus recorder for the examples' metrics: installs it as the
/// global `metrics` recorder, describes the rate limiter's metrics, renders
/// `ratelimit_store_call_duration_seconds` as a histogram with buckets from
/// 100 µs to 1 s (instead of the exporter's default summary), and runs the
/// exporter's upkeep every 5 seconds on the current tokio runtime.
///
/// # Errors
///
/// When a global recorder is already installed.
pub fn install_prometheus()
-> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    const STORE_CALL_BUCKETS: [f64; 11] = [
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(ratelimit_tower::metrics::STORE_CALL_DURATION.to_owned()),
            &STORE_CALL_BUCKETS,
        )?
        .install_recorder()?;
    ratelimit_tower::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_secs(5));
        loop {
            interval.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The media type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A router answering `GET /metrics` with what `handle` holds, in the
/// Prometheus text format.
pub fn metrics_router(handle: metrics_exporter_prometheus::PrometheusHandle) -> axum::Router {
    use axum::http::header;
    use axum::routing::get;
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], handle.render()) }
        }),
    )
}

/// Binds `addr` and serves [`metrics_router`] there in the background;
/// returns the address bound.
///
/// # Errors
///
/// When `addr` cannot be bound.
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, metrics_router(handle)).await {
            eprintln!("error: serving metrics on {bound}: {e}");
        }
    });
    Ok(bound)
}
