//! An axum hello-world for load tests, with one of four limiters:
//!
//! ```text
//! cargo run --release --example http_bench -- --variant <none|memory|governor|redis> \
//!     [--listen 127.0.0.1:3000] [--redis redis://127.0.0.1:6379]
//! ```
//!
//! - `none`: no limiter;
//! - `memory`: [`RateLimitLayer`] on a [`MemoryStore`], GCRA per peer IP;
//! - `governor`: `tower_governor`'s per-peer-IP layer (governor's GCRA);
//! - `redis`: [`RateLimitLayer`] on a [`RedisStore`], GCRA per peer IP.
//!
//! Every limiter allows 1,000,000 requests per second per IP with a burst of
//! as many, so a load test measures what the limiter costs, not refusals.
//! `scripts/bench-http` runs `wrk` against each in one run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{MemoryStore, Policy, Rate};
use ratelimit_tower::{PeerIp, RateLimitLayer};

const USAGE: &str =
    "usage: http_bench --variant <none|memory|governor|redis> [--listen ADDR] [--redis URL]";

const PER_SECOND: u64 = 1_000_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut variant = String::new();
    let mut listen: SocketAddr = ([127, 0, 0, 1], 3000).into();
    let mut redis = String::from("redis://127.0.0.1:6379");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--variant" => variant = value()?,
            "--listen" => listen = value()?.parse()?,
            "--redis" => redis = value()?,
            other => return Err(format!("unknown flag {other:?}\n{USAGE}").into()),
        }
    }
    let policy = Policy::gcra(PER_SECOND, Rate::per_second(PER_SECOND))?.with_name("bench")?;
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let app = match variant.as_str() {
        "none" => app,
        "memory" => app.layer(RateLimitLayer::new(MemoryStore::new(), policy, PeerIp)),
        "redis" => {
            let store = RedisStore::builder(redis)
                .prefix("http-bench")
                .call_timeout(Duration::from_secs(1))
                .build()
                .await?;
            app.layer(RateLimitLayer::new(store, policy, PeerIp))
        }
        "governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1_000_000_000 / PER_SECOND)
                .burst_size(u32::try_from(PER_SECOND)?)
                .finish()
                .ok_or("invalid governor configuration")?;
            app.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
        other => return Err(format!("unknown variant {other:?}\n{USAGE}").into()),
    };
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
