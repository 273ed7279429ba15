//! The axum hello-world of the HTTP benchmarks with each limiter in front of
//! it, shared by `http_bench` (served, loaded by `wrk`) and the
//! `layer_count` bench (called in process, counted by cachegrind).
//!
//! Every limiter allows 1,000,000 requests per second per IP with a burst of
//! as many, so a load test measures what the limiter costs, not refusals.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use clap::ValueEnum;
use http::{HeaderName, HeaderValue};
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{MemoryStore, Policy, Rate};
use ratelimit_tower::headers::RateLimitHeaders;
use ratelimit_tower::{PeerIp, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;

/// The limiters in front of the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    /// No limiter.
    None,
    /// No limiter, and the handler sends the `RateLimit-Policy` and
    /// `RateLimit` fields that `Memory` sends, as constants: what sending
    /// the two fields costs the server and the client, apart from any
    /// limiter.
    NoneFields,
    /// `RateLimitLayer` on a `MemoryStore`, GCRA per peer IP, with its
    /// default headers (`RateLimit-Policy` and `RateLimit` on every response).
    Memory,
    /// The same without rate-limit headers.
    MemoryNoHeaders,
    /// `tower_governor`'s per-peer-IP layer (governor's GCRA) by default: no
    /// header on an allowed response.
    Governor,
    /// The same with `.use_headers()` (`x-ratelimit-limit` and
    /// `x-ratelimit-remaining` on every response).
    GovernorHeaders,
    /// `RateLimitLayer` on a `RedisStore`, GCRA per peer IP.
    Redis,
}

/// The rate every limiter allows per IP, and its burst.
pub const PER_SECOND: u64 = 1_000_000;

/// The hello-world app behind `variant`; `redis` is the URL of
/// [`Variant::Redis`]'s server.
pub async fn app(variant: Variant, redis: &str) -> Result<Router, Box<dyn std::error::Error>> {
    let policy = Policy::gcra(PER_SECOND, Rate::per_second(PER_SECOND))?.with_name("bench")?;
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let fields = [
        (
            HeaderName::from_static("ratelimit-policy"),
            HeaderValue::from_static(r#""bench";q=1000000;w=1"#),
        ),
        (
            HeaderName::from_static("ratelimit"),
            HeaderValue::from_static(r#""bench";r=999999;t=1"#),
        ),
    ];
    let governor = |headers: bool| {
        let mut config = GovernorConfigBuilder::default();
        config
            .per_nanosecond(1_000_000_000 / PER_SECOND)
            .burst_size(u32::try_from(PER_SECOND).unwrap_or(u32::MAX));
        if headers {
            let config = config
                .use_headers()
                .finish()
                .ok_or("invalid governor configuration")?;
            Ok::<_, &str>(
                app.clone()
                    .layer(tower_governor::GovernorLayer::new(Arc::new(config))),
            )
        } else {
            let config = config.finish().ok_or("invalid governor configuration")?;
            Ok(app
                .clone()
                .layer(tower_governor::GovernorLayer::new(Arc::new(config))))
        }
    };
    Ok(match variant {
        Variant::None => app,
        Variant::NoneFields => Router::new().route(
            "/",
            get(move || std::future::ready((fields.clone(), "Hello, World!"))),
        ),
        Variant::Memory => app.layer(RateLimitLayer::new(MemoryStore::new(), policy, PeerIp)),
        Variant::MemoryNoHeaders => app.layer(
            RateLimitLayer::new(MemoryStore::new(), policy, PeerIp)
                .headers(RateLimitHeaders::none()),
        ),
        Variant::Governor => governor(false)?,
        Variant::GovernorHeaders => governor(true)?,
        Variant::Redis => {
            let store = RedisStore::builder(redis)
                .prefix("http-bench")
                .call_timeout(Duration::from_secs(1))
                .build()
                .await?;
            app.layer(RateLimitLayer::new(store, policy, PeerIp))
        }
    })
}
