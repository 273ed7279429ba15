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
use clap::{Parser, ValueEnum};
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{MemoryStore, Policy, Rate};
use ratelimit_tower::{PeerIp, RateLimitLayer};

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "http_bench", about = "An axum hello-world for load tests.")]
struct Args {
    /// The limiter in front of the handler.
    #[arg(long, value_enum)]
    variant: Variant,
    /// The address to serve on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// The Redis of `--variant redis`.
    #[arg(long, value_name = "URL", default_value = "redis://127.0.0.1:6379", value_parser = ratelimit_examples::redis_url)]
    redis: String,
}

/// The limiters `--variant` names.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Variant {
    /// No limiter.
    None,
    /// `RateLimitLayer` on a `MemoryStore`.
    Memory,
    /// `tower_governor`'s layer.
    Governor,
    /// `RateLimitLayer` on a `RedisStore`.
    Redis,
}

/// The rate every limiter allows per IP, and its burst.
const PER_SECOND: u64 = 1_000_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        variant,
        listen,
        redis,
    } = Args::parse();
    let policy = Policy::gcra(PER_SECOND, Rate::per_second(PER_SECOND))?.with_name("bench")?;
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    let app = match variant {
        Variant::None => app,
        Variant::Memory => app.layer(RateLimitLayer::new(MemoryStore::new(), policy, PeerIp)),
        Variant::Redis => {
            let store = RedisStore::builder(redis)
                .prefix("http-bench")
                .call_timeout(Duration::from_secs(1))
                .build()
                .await?;
            app.layer(RateLimitLayer::new(store, policy, PeerIp))
        }
        Variant::Governor => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1_000_000_000 / PER_SECOND)
                .burst_size(u32::try_from(PER_SECOND)?)
                .finish()
                .ok_or("invalid governor configuration")?;
            app.layer(tower_governor::GovernorLayer::new(Arc::new(config)))
        }
    };
    ratelimit_examples::serve_on(listen, app).await?;
    Ok(())
}
