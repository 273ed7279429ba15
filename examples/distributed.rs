//! One rate limit shared by several instances of a service, through Redis.
//!
//! Start Redis and three instances, then spread requests across them: the
//! limit holds for all of them together, because every decision is one atomic
//! script in the same Redis.
//!
//! ```text
//! redis-server --port 6379 --save ''
//! cargo run --release --example distributed -- --listen 127.0.0.1:8081 \
//!     --redis redis://127.0.0.1:6379 --algorithm gcra --limit 10 --window 1m
//! # ... and the same with --listen 127.0.0.1:8082 and 127.0.0.1:8083
//! for i in $(seq 1 15); do
//!     curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: demo' http://127.0.0.1:808$((i % 3 + 1))/
//! done
//! ```
//!
//! Flags (a contract other tools rely on):
//!
//! - `--listen ADDR`: the address to serve on, such as `127.0.0.1:8081`;
//! - `--redis URL`: the Redis to share, `redis://[user:password@]host[:port][/db]`;
//!   with `--cluster`, any nodes of a Redis Cluster (repeat the flag or give a
//!   comma-separated list);
//! - `--algorithm NAME`: one of `ratelimit_core::AlgorithmKind`'s names
//!   (`gcra`, `token-bucket`, ...; `--help` lists them);
//! - `--limit N`: the limit per window; for `token-bucket`, `gcra` and
//!   `leaky-bucket` the burst capacity, refilled at `N` per window; for
//!   `concurrency` the most requests in flight;
//! - `--window DURATION` (`500ms`, `10s`, `1m`, `1h`): the window, refill
//!   period, or for `concurrency` the lease of a permit;
//! - `--failure MODE` (default `closed`): what happens when Redis cannot
//!   decide. `closed` refuses the request with `503` (`FailurePolicy::Closed`),
//!   so the shared limit is never exceeded; `open` lets it through
//!   (`FailurePolicy::Open`), so an outage lifts the limit; `fallback` decides
//!   it in memory with the limit divided among `--instances` (a
//!   `FallbackStore` behind a `CircuitBreaker`: after 3 consecutive failures
//!   Redis is left alone for 500 ms, then probed, and used again once it
//!   answers);
//! - `--timeout DURATION` (default `500ms`): how long Redis has to decide one
//!   request before it counts as a failure;
//! - `--instances N` (default 3, used with `--failure fallback`): how many
//!   instances share the limit, so each enforces `limit / N` (at least 1) on
//!   its own while Redis is unreachable, and their sum stays within the limit;
//! - `--shadow`: the policy in shadow mode (`Policy::with_shadow`): every
//!   request is decided and counted, and gets its rate-limit headers, but none
//!   is refused for it (dark launch);
//! - `--metrics ADDR`: serve `GET /metrics` on `ADDR` (another address than
//!   `--listen`), in the Prometheus text format: the layer's metrics
//!   (`ratelimit_decisions_total{policy,outcome}` and others, see
//!   `ratelimit_tower::metrics`) and, with `--failure fallback`, the breaker's
//!   (`ratelimit_circuit_breaker_state{breaker="redis"}`);
//! - `--region NAME`, `--peer NAME=URL` (once per other region), `--sync
//!   DURATION` (default `100ms`), `--staleness DURATION` (default `2s`),
//!   `--max-skew DURATION` (default `1s`): serve region `NAME`, deciding in
//!   its own `--redis` against the counts of every region
//!   (`MultiRegionStore`, see the README's multi-region demo);
//!   `fixed-window` or `sliding-window` only;
//! - `--admin ADDR`: serve the admin API (below) on `ADDR`, its own listener
//!   (never `--listen`'s address, nor `--metrics`'). It has no
//!   authentication: bind it to loopback (`127.0.0.1:9091`) or an internal
//!   network only, never where clients can reach it.
//!
//! Requests are keyed by the `x-api-key` header (hashed before it reaches
//! Redis), or by the client IP without one. `GET /` costs 1, `GET /expensive`
//! costs 10 from the same budget, and `GET /slow` costs 1 and answers after a
//! second (to watch the concurrency policy). Denied requests are answered
//! `429 Too Many Requests` with `Retry-After`. `GET /health` is not rate
//! limited: it answers the breaker's state (`closed`, `open` or `half-open`)
//! with `--failure fallback`, and `ok` otherwise.
//!
//! ## The admin API
//!
//! With `--admin ADDR`, an operator can look at and act on one client's
//! budget while the instances run, through the same Redis, so every instance
//! sees the change at once (`ratelimit_examples::admin_router`; answers are
//! JSON, see its docs):
//!
//! - `GET /admin/keys/{key}`: the key's decision now, consuming nothing:
//!   `{"policy":..,"key":..,"allowed":..,"limit":..,"remaining":..,"reset_after_ms":..,"retry_after_ms":..}`;
//! - `POST /admin/keys/{key}/reset`: a full budget again, any block lifted
//!   (`204`);
//! - `POST /admin/keys/{key}/penalize?amount=N` and `.../reward?amount=N`:
//!   consume `N` units (even into debt) or give `N` back; answers the
//!   decision after;
//! - `POST /admin/keys/{key}/block?for=DURATION` (`30s`, `10m`, `1h`, ...):
//!   every request of the key is refused until then (`204`);
//!   `POST /admin/keys/{key}/unblock` ends it (`204`).
//!
//! `{key}` is exactly the key the limiter uses. Without an `x-api-key`
//! header (or with an empty one), that is the client's IPv4 address as Rust
//! prints it, `127.0.0.1`, `203.0.113.7` (an IPv4-mapped IPv6 peer,
//! `::ffff:203.0.113.7`, as `203.0.113.7`), or an IPv6 client's /64,
//! `2001:db8::/64` (written `2001:db8::%2F64` in a URL). With one, it is `#` followed by
//! the first 32 hex digits of the SHA-256 of the header's value, written
//! `%23` in a URL. Errors are `{"error":"..."}`: `400` for a bad amount,
//! duration or query, `409` for penalties and rewards of `concurrency`
//! (whose units are permits), `503` when Redis cannot answer (whatever
//! `--failure` says: admin operations always go to Redis), and `403` for
//! requests a browser sends on behalf of a web page (with `Origin`).
//!
//! ```text
//! cargo run --example distributed -- --listen 127.0.0.1:8081 --admin 127.0.0.1:9091 \
//!     --redis redis://127.0.0.1:6379 --algorithm gcra --limit 10 --window 1m
//! curl -s http://127.0.0.1:9091/admin/keys/127.0.0.1
//! curl -s -X POST 'http://127.0.0.1:9091/admin/keys/127.0.0.1/block?for=30s'
//! key=$(printf %s alice | sha256sum | cut -c1-32)   # x-api-key: alice
//! curl -s -X POST "http://127.0.0.1:9091/admin/keys/%23$key/reset"
//! ```
//!
//! Once bound, the server prints one line, `listening on http://ADDR`, on
//! stdout (with `--metrics` or `--admin`, once every address is bound; the
//! metrics and admin addresses go to stderr). The flags are parsed with
//! `clap`: bad, missing or repeated flags exit with status 2 and a message
//! naming the flag; `--help` prints the usage line and a summary of the flags.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use ratelimit_axum::RateLimitInfo;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{BreakerState, CircuitBreaker, FallbackStore, MemoryStore, Policy, Store};
use ratelimit_examples::{
    PolicyArgs, admin_router, api_key_or_peer_ip, bind_listener, exit_with_flag_error,
    install_prometheus, nonzero_duration, redis_url, serve_metrics, spawn_serve,
};
use ratelimit_tower::{FailurePolicy, RateLimitLayer};

/// What `--help` prints after the flags: the admin API.
const ADMIN_HELP: &str = "\
The admin API (--admin ADDR) has no authentication: bind it to loopback or an
internal network only.
    GET  /admin/keys/KEY                      the key's decision, consuming nothing
    POST /admin/keys/KEY/reset                a full budget again, any block lifted
    POST /admin/keys/KEY/penalize?amount=N    consume N units (even into debt)
    POST /admin/keys/KEY/reward?amount=N      give N units back
    POST /admin/keys/KEY/block?for=DURATION   refuse every request of KEY until then
    POST /admin/keys/KEY/unblock              end a block
KEY is the limiter's key: the client IP (127.0.0.1) or IPv6 /64 (2001:db8::%2F64) or, for
requests with x-api-key, %23 and the first 32 hex digits of the SHA-256 of
the header's value (printf %s \"$API_KEY\" | sha256sum | cut -c1-32).";

/// The command line (`clap` refuses a flag that takes one value given twice).
#[derive(Debug, Parser)]
#[command(
    name = "distributed",
    about = "Serves GET / (cost 1), GET /expensive (cost 10) and GET /slow (cost 1, answers\n\
             after a second), rate limited through a Redis shared with the other instances,\n\
             and GET /health. Requests are keyed by x-api-key (hashed), else the client IP.",
    after_help = ADMIN_HELP
)]
struct Args {
    /// The public address, such as 127.0.0.1:8081.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// redis://[user:password@]host[:port][/db]; with --cluster, any nodes of
    /// a Redis Cluster (repeated or comma-separated).
    #[arg(long, value_name = "URL", required = true, value_delimiter = ',', value_parser = redis_url)]
    redis: Vec<String>,
    /// The Redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    #[command(flatten)]
    policy: PolicyArgs,
    /// When Redis cannot decide.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = Failure::Closed)]
    failure: Failure,
    /// How long Redis has to decide a request.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = nonzero_duration)]
    timeout: Duration,
    /// Instances sharing the limit, for --failure fallback.
    #[arg(long, value_name = "N", default_value_t = 3, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..))]
    instances: u32,
    /// Decide and count every request, refuse none.
    #[arg(long)]
    shadow: bool,
    /// Serve GET /metrics (Prometheus text format) on ADDR.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Serve the admin API on ADDR, another address than --listen (see below).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    #[command(flatten)]
    regions: ratelimit_examples::region::RegionFlags,
}

/// What to do when Redis cannot decide (`--failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Failure {
    /// Let the request through.
    Open,
    /// Refuse it with 503.
    Closed,
    /// Decide it in memory, with the limit divided among --instances.
    Fallback,
}

/// What `GET /expensive` costs.
const EXPENSIVE_COST: u64 = 10;

/// How long `GET /slow` takes to answer.
const SLOW_DELAY: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(message) = check_addresses(&args) {
        exit_with_flag_error::<Args>(message);
    }
    let policy = match args.policy.policy() {
        Ok(policy) => policy.with_shadow(args.shadow),
        Err(message) => exit_with_flag_error::<Args>(message),
    };
    match serve(args, policy).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What only the flags together can tell: several Redis URLs without
/// `--cluster`, and an admin API on another listener's address.
fn check_addresses(args: &Args) -> Result<(), String> {
    args.regions.check(args.cluster)?;
    if args.regions.region.is_some() && (args.admin.is_some() || args.failure == Failure::Fallback)
    {
        return Err(String::from("--region: no --admin, nor --failure fallback"));
    }
    if args.redis.len() > 1 && !args.cluster {
        return Err(format!(
            "--redis: {} URLs given; several URLs are the nodes of a Redis Cluster and need --cluster",
            args.redis.len()
        ));
    }
    let Some(admin) = args.admin else {
        return Ok(());
    };
    // The admin API has no authentication: never on the public listener.
    if collide(admin, args.listen) {
        return Err(format!(
            "--admin {admin}: the admin API needs its own address, not --listen's ({})",
            args.listen
        ));
    }
    if let Some(metrics) = args.metrics.filter(|&metrics| collide(admin, metrics)) {
        return Err(format!(
            "--admin {admin}: the admin API needs its own address, not --metrics' ({metrics})"
        ));
    }
    Ok(())
}

/// Whether two listeners would share a socket: the same port (not 0, which
/// picks a free one) on the same IP, or on any IP when one is unspecified.
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Connects to Redis, binds `--listen` and serves until killed.
async fn serve(args: Args, policy: Policy) -> Result<(), String> {
    // Installed first, so the breaker's and the store's metrics land in it.
    let metrics = match args.metrics {
        Some(addr) => {
            let handle = install_prometheus().map_err(|e| format!("--metrics {addr}: {e}"))?;
            Some((addr, handle))
        }
        None => None,
    };
    let builder = if args.cluster {
        RedisStore::cluster_builder(args.redis.iter().cloned())
    } else {
        RedisStore::builder(args.redis[0].clone())
    };
    let redis = args.redis.join(",");
    let store = builder
        .call_timeout(args.timeout)
        .build()
        .await
        .map_err(|e| format!("--redis {redis}: {e}"))?;
    // Connect now: a typo in the URL shows at once, not as failures later.
    if let Err(e) = store.ping().await {
        let then = match args.failure {
            Failure::Closed => "requests get 503 until it does",
            Failure::Open => "requests are let through unlimited until it does",
            Failure::Fallback => "requests are limited in memory until it does",
        };
        eprintln!("warning: Redis at {redis} does not answer ({e}); {then}");
    }

    // With --region, decisions go to this region's own Redis, against every
    // region's counts.
    let failure = match args.failure {
        Failure::Open => FailurePolicy::Open,
        _ => FailurePolicy::Closed,
    };
    let region = args
        .regions
        .store(&args.redis[0], args.timeout, &policy)
        .await?
        .map(|store| limited_routes(store, policy.clone(), failure));
    // The admin API acts on the store the layer decides with, under the
    // same policy, so its keys are the layer's keys.
    let (limited, admin, breaker) = match args.failure {
        Failure::Closed => (
            limited_routes(store.clone(), policy.clone(), FailurePolicy::Closed),
            admin_router(store, policy),
            None,
        ),
        Failure::Open => (
            limited_routes(store.clone(), policy.clone(), FailurePolicy::Open),
            admin_router(store, policy),
            None,
        ),
        Failure::Fallback => {
            let breaker = Arc::new(CircuitBreaker::default().with_name("redis"));
            let store = FallbackStore::new(
                store,
                MemoryStore::new(),
                args.instances,
                Arc::clone(&breaker),
            );
            // The fallback decides whenever Redis cannot, so the layer only
            // sees an error when memory cannot decide either: refuse then.
            let routes = limited_routes(store.clone(), policy.clone(), FailurePolicy::Closed);
            // `FallbackStore` sends admin operations to Redis, whatever the
            // breaker says: the local shares are never touched.
            (routes, admin_router(store, policy), Some(breaker))
        }
    };
    let limited = region.unwrap_or(limited);
    // Not rate limited: merged after the layer was applied to the others.
    let app = Router::new()
        .route("/health", get(move || health(breaker.clone())))
        .merge(limited);

    let (listener, addr) = bind_listener("--listen", args.listen).await?;
    if let Some((addr, handle)) = metrics {
        let bound = serve_metrics(addr, handle)
            .await
            .map_err(|e| format!("--metrics {addr}: {e}"))?;
        eprintln!("metrics on http://{bound}/metrics");
    }
    if let Some(addr) = args.admin {
        let bound = spawn_serve(addr, admin, "the admin API")
            .await
            .map_err(|e| format!("--admin {addr}: {e}"))?;
        eprintln!("admin API on http://{bound}/admin/keys/{{key}}");
        if !bound.ip().is_loopback() {
            eprintln!(
                "warning: --admin {bound} is not a loopback address; the admin API has no \
                 authentication, so keep {bound} on an internal network only"
            );
        }
    }
    ratelimit_examples::serve(listener, app)
        .await
        .map_err(|e| format!("serving on {addr}: {e}"))
}

/// `GET /`, `GET /expensive` and `GET /slow`, rate limited in `store`.
fn limited_routes<St>(store: St, policy: Policy, failure: FailurePolicy) -> Router
where
    St: Store + Clone,
{
    let cost = |req: &Request| -> u64 {
        if req.uri().path() == "/expensive" {
            EXPENSIVE_COST
        } else {
            1
        }
    };
    let limit = RateLimitLayer::new(store, policy, api_key_or_peer_ip)
        .cost(cost)
        .on_failure(failure);

    Router::new()
        .route("/", get(root))
        .route("/expensive", get(expensive))
        .route("/slow", get(slow))
        .route_layer(limit)
}

/// `GET /health`: the breaker's state with `--failure fallback`, else `ok`.
async fn health(breaker: Option<Arc<CircuitBreaker>>) -> &'static str {
    match breaker.map(|b| b.state()) {
        None => "ok\n",
        Some(BreakerState::Closed) => "closed\n",
        Some(BreakerState::Open) => "open\n",
        Some(BreakerState::HalfOpen) => "half-open\n",
        // `BreakerState` is non-exhaustive.
        Some(_) => "unknown\n",
    }
}

/// `GET /`: cost 1.
async fn root(info: RateLimitInfo) -> String {
    answer("ok", &info)
}

/// `GET /expensive`: cost 10.
async fn expensive(info: RateLimitInfo) -> String {
    answer("expensive ok", &info)
}

/// `GET /slow`: cost 1, answers after a second.
async fn slow(info: RateLimitInfo) -> String {
    tokio::time::sleep(SLOW_DELAY).await;
    answer("slow ok", &info)
}

/// A short answer with the quota left.
fn answer(what: &str, info: &RateLimitInfo) -> String {
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
