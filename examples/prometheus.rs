//! Rate-limit metrics for Prometheus: an axum app behind `RateLimitLayer`,
//! with the `metrics` feature of `ratelimit-tower` recording into
//! `metrics-exporter-prometheus`, scraped at `GET /metrics`.
//!
//! ```text
//! cargo run --example prometheus -- --listen 127.0.0.1:3000 --limit 5 --window 10s \
//!     --shadow-limit 2
//! for i in $(seq 1 8); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics | grep ratelimit_
//! ```
//!
//! shows, among others:
//!
//! ```text
//! ratelimit_decisions_total{policy="per-client",outcome="allowed"} 5
//! ratelimit_decisions_total{policy="per-client",outcome="denied"} 3
//! ratelimit_decisions_total{policy="per-client-trial",outcome="allowed"} 2
//! ratelimit_decisions_total{policy="per-client-trial",outcome="shadow_denied"} 6
//! ```
//!
//! Flags:
//!
//! - `--listen ADDR` (default `127.0.0.1:3000`): the address of the app;
//! - `--metrics ADDR`: serve `GET /metrics` on this address instead. Without
//!   it, `GET /metrics` is served on the `--listen` address, outside the rate
//!   limit (a scraper must never be limited, nor count against a client);
//!   a separate address keeps metrics off the public listener;
//! - `--limit N` (default 5) per `--window DURATION` (default `10s`): the
//!   enforced fixed-window policy `per-client`;
//! - `--shadow-limit N`: also a policy `per-client-trial` of `N` per window in
//!   shadow mode: decided and counted (`shadow_denied`), never enforced;
//! - `--denied-cache`: answer known denials locally (`DeniedCache`), counted
//!   as `cached_denied` instead of `denied`.
//!
//! Requests are keyed by the client IP (an IPv6 client by its /64): a key the
//! client cannot choose, so no client escapes its limit by sending a new
//! header value each time. Metrics never show keys, only policy names and
//! outcomes. Once bound, the example
//! prints two lines on stdout: `listening on http://ADDR` and
//! `metrics on http://ADDR/metrics`. Bad flags exit with status 2 and a
//! message naming the flag (`clap`).
//!
//! Set `RUST_LOG`-style filtering up with a `tracing` subscriber of your own
//! to see one `debug` event per decision (this example installs none).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use clap::Parser;
use ratelimit_axum::RateLimitInfo;
use ratelimit_core::{DeniedCache, MemoryStore, Policy, Store};
use ratelimit_examples::{
    bind_listener, install_prometheus, metrics_router, nonzero_duration, serve_metrics,
    serve_with_peers,
};
use ratelimit_tower::{PeerIp, RateLimitLayer, Rule};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "prometheus",
    about = "An axum app behind the rate limiter, its metrics at GET /metrics."
)]
struct Args {
    /// The address of the app.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Serve GET /metrics on this address instead of --listen's.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// The limit of the enforced fixed-window policy per-client.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Its window (500ms, 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = nonzero_duration)]
    window: Duration,
    /// Also a policy per-client-trial of N per window, in shadow mode.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    shadow_limit: Option<u64>,
    /// Answer known denials locally (DeniedCache).
    #[arg(long)]
    denied_cache: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match serve(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Installs the recorder, binds the listeners and serves until killed.
async fn serve(args: Args) -> Result<(), String> {
    let handle = install_prometheus().map_err(|e| format!("installing the recorder: {e}"))?;

    let policy = Policy::fixed_window(args.limit, args.window)
        .and_then(|p| p.with_name("per-client"))
        .map_err(|e| format!("--limit {} --window {:?}: {e}", args.limit, args.window))?;
    let trial = match args.shadow_limit {
        Some(limit) => Some(
            Policy::fixed_window(limit, args.window)
                .and_then(|p| p.with_name("per-client-trial"))
                .map_err(|e| format!("--shadow-limit {limit}: {e}"))?
                .with_shadow(true),
        ),
        None => None,
    };
    let limited = if args.denied_cache {
        limited_routes(DeniedCache::new(MemoryStore::new()), policy, trial)
    } else {
        limited_routes(MemoryStore::new(), policy, trial)
    };

    let (listener, addr) = bind_listener("--listen", args.listen).await?;
    // `/metrics` is merged after the layer was applied: never rate limited.
    let (app, metrics_addr) = match args.metrics {
        Some(metrics) => {
            let bound = serve_metrics(metrics, handle)
                .await
                .map_err(|e| format!("--metrics {metrics}: {e}"))?;
            (limited, bound)
        }
        None => (metrics_router(handle).merge(limited), addr),
    };

    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")
        .and_then(|()| writeln!(stdout, "metrics on http://{metrics_addr}/metrics"))
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing to stdout: {e}"))?;
    drop(stdout);

    serve_with_peers(listener, app)
        .await
        .map_err(|e| format!("serving on {addr}: {e}"))
}

/// `GET /`, limited by `policy` (and `trial`, in shadow mode) in `store`.
fn limited_routes<St>(store: St, policy: Policy, trial: Option<Policy>) -> Router
where
    St: Store + Clone,
{
    let key = PeerIp;
    let router = Router::new().route("/", get(root));
    let layer = RateLimitLayer::new(store, policy, key);
    match trial {
        Some(trial) => router.route_layer(layer.and(Rule::new(trial, key))),
        None => router.route_layer(layer),
    }
}

/// `GET /`: what is left of each policy.
async fn root(info: RateLimitInfo) -> String {
    let mut out = String::from("ok");
    for entry in info.iter() {
        let shadow = if entry.is_shadow() { ", shadow" } else { "" };
        out.push_str(&format!(
            "; {}: {} of {} left{shadow}",
            entry.policy().name(),
            entry.decision().remaining(),
            entry.decision().limit()
        ));
    }
    out.push('\n');
    out
}
