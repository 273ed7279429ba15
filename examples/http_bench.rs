//! An axum hello-world for load tests, with one of the limiters of
//! [`ratelimit_examples::http_apps::Variant`]:
//!
//! ```text
//! cargo run --release -p ratelimit-examples --no-default-features \
//!     --example http_bench -- --variant <VARIANT> \
//!     [--listen 127.0.0.1:3000] [--redis redis://127.0.0.1:6379]
//! ```
//!
//! - `none`: no limiter; `none-fields`: no limiter, and the handler sends
//!   the two fields `memory` sends, as constants (what sending them costs);
//! - `memory`: `RateLimitLayer` on a `MemoryStore`, GCRA per peer IP, with
//!   its default headers (`RateLimit-Policy` and `RateLimit` on every
//!   response); `memory-no-headers`: the same without them;
//! - `governor`: `tower_governor`'s per-peer-IP layer (governor's GCRA), by
//!   default (no header on an allowed response); `governor-headers`: the
//!   same with `.use_headers()`;
//! - `redis`: `RateLimitLayer` on a `RedisStore`, GCRA per peer IP.
//!
//! Every limiter allows 1,000,000 requests per second per IP with a burst of
//! as many, so a load test measures what the limiter costs, not refusals.
//! `scripts/bench-http` runs `wrk` against each in one run.

use std::net::SocketAddr;

use clap::Parser;
use ratelimit_examples::http_apps::{Variant, app};

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Args {
        variant,
        listen,
        redis,
    } = Args::parse();
    // A store's errors and outages are logged (a load test that meets
    // them shows why); nothing is logged per request otherwise.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .init();
    ratelimit_examples::serve_on(listen, app(variant, &redis).await?).await?;
    Ok(())
}
