//! Helpers shared by the examples (see the `[[example]]` targets of this package).

pub use admin::{AdminApi, AdminToken};
pub use flags::{
    PolicyArgs, algorithm_parser, exit_with_flag_error, nonzero_duration, parse_duration,
    policy_for, redis_url,
};

pub use serve::{
    API_KEY_HEADER, api_key_or_peer_ip, bind_listener, listen_addr_from_env, problem, serve,
    serve_on, serve_with_peers, spawn_serve,
};

pub mod http_apps;
pub mod region;

mod admin;
mod flags;
mod serve;

/// A short answer with the quota left under the tightest limit:
/// `"{what}: 4 of 5 left (per-ip)"`, or `what` alone when no limit decided.
pub fn answer(what: &str, info: &ratelimit_axum::RateLimitInfo) -> String {
    match info.tightest() {
        Some(entry) => format!(
            "{what}: {} of {} left ({})\n",
            entry.decision().remaining(),
            entry.decision().limit(),
            entry.policy().name(),
        ),
        None => format!("{what}\n"),
    }
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
#[cfg(feature = "metrics")]
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
        let mut interval = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            interval.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The media type of the Prometheus text format.
#[cfg(feature = "metrics")]
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A router answering `GET /metrics` with what `handle` holds, in the
/// Prometheus text format.
#[cfg(feature = "metrics")]
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
#[cfg(feature = "metrics")]
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> std::io::Result<std::net::SocketAddr> {
    spawn_serve(addr, metrics_router(handle), "metrics").await
}
