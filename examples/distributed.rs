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
//! - `--sentinel HOST:PORT` with `--master-name NAME`, in place of `--redis`:
//!   the master that Redis Sentinel names `NAME`, through the sentinels at
//!   `HOST:PORT` (repeat the flag or give a comma-separated list;
//!   `RedisStore::sentinel_builder`, which follows a failover);
//! - `--algorithm NAME`: one of `ratelimit_core::AlgorithmKind`'s names
//!   (`gcra`, `token-bucket`, ...; `--help` lists them);
//! - `--limit N`: the limit per window of each client (its API key, or its
//!   IP without one); for `token-bucket`, `gcra` and `leaky-bucket` the burst
//!   capacity, refilled at `N` per window; for `concurrency` the most
//!   requests in flight;
//! - `--ip-limit N` (default: `--limit`): the same for each client IP,
//!   whatever API keys its requests carry (see below);
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
//!   (never `--listen`'s address, nor `--metrics`');
//! - `--admin-token TOKEN`, or the environment variable
//!   `RATELIMIT_ADMIN_TOKEN` (better: a command line is visible to every
//!   user of the machine): the bearer token the admin API asks for, at
//!   least 16 characters (`openssl rand -hex 32`). Required when `--admin`
//!   is not a loopback address (`0.0.0.0` is not): the example refuses to
//!   start without it. On loopback it may be left out, as Redis's protected
//!   mode allows; the API then has no authentication, any process on the
//!   machine can use it, and the example says so on stderr.
//!
//! Every request counts against two budgets, all or nothing: its client's
//! (`--limit`), keyed by the `x-api-key` header (hashed before it reaches
//! Redis) or by the client IP without one, and its client IP's
//! (`--ip-limit`), whatever key it carries. The API key is the client's to
//! choose, and this example does not check it: without the budget per IP, a
//! client sending a new key with every request would never be limited, and
//! would fill Redis with keys. A service that knows its keys refuses unknown
//! ones instead (the `tiers` example). Raise `--ip-limit` when many clients
//! with keys of their own share an address (behind one NAT). The client IP
//! is the TCP peer's (`PeerIp`): behind a reverse proxy or a load balancer,
//! key by `ClientIp::trusting` its addresses instead, or every client shares
//! the proxy's budget.
//!
//! `GET /` costs 1, `GET /expensive` costs 10 from the same budgets, and
//! `GET /slow` costs 1 and answers after a second (to watch the concurrency
//! policy). Denied requests are answered `429 Too Many Requests` with
//! `Retry-After`. `GET /health` is not rate limited: it answers the
//! breaker's state (`closed`, `open` or `half-open`) with `--failure
//! fallback`, and `ok` otherwise.
//!
//! ## The admin API
//!
//! With `--admin ADDR`, an operator can look at and act on one client's
//! budget while the instances run, through the same Redis, so every instance
//! sees the change at once (`ratelimit_examples::AdminApi`; answers are
//! JSON, see its docs). With a token, every request carries
//! `Authorization: Bearer TOKEN`; without it, it is answered `401`.
//! Operations act on the key under both policies (per client and per IP);
//! a decision is the tighter of the two:
//!
//! - `GET /admin/keys/{key}`: the key's decision now, consuming nothing:
//!   `{"policy":..,"key":..,"allowed":..,"limit":..,"remaining":..,"reset_after_ms":..,"retry_after_ms":..}`;
//! - `POST /admin/keys/{key}/reset`: a full budget again, any block lifted
//!   (`204`);
//! - `POST /admin/keys/{key}/penalize?amount=N` and `.../reward?amount=N`:
//!   consume `N` units (even into debt) or give `N` back; answers the
//!   decision after;
//! - `POST /admin/keys/{key}/block?for=DURATION` (`30s`, `10m`, `1h`, ...):
//!   every request of the key is refused until then (`204`); blocking a
//!   client IP refuses all its requests, whatever their API keys;
//!   `POST /admin/keys/{key}/unblock` ends it (`204`).
//!
//! `{key}` is exactly the key the limiter uses. A client IP is its IPv4
//! address as Rust prints it, `127.0.0.1`, `203.0.113.7` (an IPv4-mapped
//! IPv6 peer, `::ffff:203.0.113.7`, as `203.0.113.7`), or an IPv6 client's
//! /64, `2001:db8::/64` (written `2001:db8::%2F64` in a URL). An API key is
//! `#` followed by the first 32 hex digits of the SHA-256 of the header's
//! value (`HeaderKey::key_for`, `Key::from`), written `%23` in a URL.
//! Errors are `{"error":"..."}`: `400` for a bad amount, duration or query,
//! `401` without the token, `409` for penalties and rewards of
//! `concurrency` (whose units are permits), `503` when Redis cannot answer
//! (whatever `--failure` says: admin operations always go to Redis), and
//! `403` for requests a browser sends on behalf of a web page (with
//! `Origin`).
//!
//! ```text
//! export RATELIMIT_ADMIN_TOKEN=$(openssl rand -hex 32)
//! cargo run --example distributed -- --listen 127.0.0.1:8081 --admin 127.0.0.1:9091 \
//!     --redis redis://127.0.0.1:6379 --algorithm gcra --limit 10 --window 1m
//! auth="Authorization: Bearer $RATELIMIT_ADMIN_TOKEN"
//! curl -s -H "$auth" http://127.0.0.1:9091/admin/keys/127.0.0.1
//! curl -s -H "$auth" -X POST 'http://127.0.0.1:9091/admin/keys/127.0.0.1/block?for=30s'
//! key=$(printf '%s' alice | sha256sum | cut -c1-32)   # x-api-key: alice
//! curl -s -H "$auth" -X POST "http://127.0.0.1:9091/admin/keys/%23$key/reset"
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
use ratelimit_core::{
    AdminStore, BreakerState, CircuitBreaker, FallbackStore, MemoryStore, Policy, Store,
};
use ratelimit_examples::{
    AdminApi, AdminToken, PolicyArgs, api_key_or_peer_ip, bind_listener, exit_with_flag_error,
    install_prometheus, nonzero_duration, policy_for, redis_url, serve_metrics, spawn_serve,
};
use ratelimit_tower::{FailurePolicy, PeerIp, RateLimitLayer, Rule};

/// What `--help` prints after the flags: the admin API.
const ADMIN_HELP: &str = "\
Every request counts against its client (x-api-key, else IP; --limit) and its client IP
(--ip-limit), so a client that sends a new API key each time is still limited.

The admin API (--admin ADDR) asks for Authorization: Bearer TOKEN, the token given by
--admin-token or RATELIMIT_ADMIN_TOKEN (at least 16 characters: openssl rand -hex 32).
It needs one unless ADDR is a loopback address; without one, any local process can use it.
    GET  /admin/keys/KEY                      the key's decision, consuming nothing
    POST /admin/keys/KEY/reset                a full budget again, any block lifted
    POST /admin/keys/KEY/penalize?amount=N    consume N units (even into debt)
    POST /admin/keys/KEY/reward?amount=N      give N units back
    POST /admin/keys/KEY/block?for=DURATION   refuse every request of KEY until then
    POST /admin/keys/KEY/unblock              end a block
KEY is the limiter's key: the client IP (127.0.0.1) or IPv6 /64 (2001:db8::%2F64) or, for
requests with x-api-key, %23 and the first 32 hex digits of the SHA-256 of the
header's value (printf '%s' \"$API_KEY\" | sha256sum | cut -c1-32).";

/// The command line (`clap` refuses a flag that takes one value given twice).
#[derive(Debug, Parser)]
#[command(
    name = "distributed",
    about = "Serves GET / (cost 1), GET /expensive (cost 10) and GET /slow (cost 1, answers\n\
             after a second), rate limited through a Redis shared with the other instances,\n\
             and GET /health. Requests are limited per client (x-api-key, hashed, else the\n\
             client IP) and per client IP.",
    after_help = ADMIN_HELP
)]
struct Args {
    /// The public address, such as 127.0.0.1:8081.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// redis://[user:password@]host[:port][/db]; with --cluster, any nodes of
    /// a Redis Cluster (repeated or comma-separated).
    #[arg(long, value_name = "URL", required_unless_present = "sentinel", value_delimiter = ',', value_parser = redis_url)]
    redis: Vec<String>,
    /// The Redis URLs are nodes of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// Redis Sentinel, in place of --redis: a sentinel's HOST:PORT
    /// (repeated or comma-separated), which names the master --master-name.
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',', conflicts_with_all = ["redis", "cluster"], requires = "master_name")]
    sentinel: Vec<String>,
    /// With --sentinel: the name the sentinels monitor the master under.
    #[arg(long, value_name = "NAME", requires = "sentinel")]
    master_name: Option<String>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// The limit per window of each client IP, whatever its API keys [default: --limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    ip_limit: Option<u64>,
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
    /// The admin API's bearer token (better from the environment).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RATELIMIT_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
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

/// The two policies every limited request counts against.
#[derive(Debug, Clone)]
struct Policies {
    /// Per client IP, whatever the API key (`--ip-limit`).
    per_ip: Policy,
    /// Per client: its API key, else its IP (`--limit`).
    per_client: Policy,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(message) = check_addresses(&args) {
        exit_with_flag_error::<Args>(message);
    }
    let token = match args.admin_token.as_deref().map(AdminToken::new).transpose() {
        Ok(token) => token,
        // The message never holds the token.
        Err(message) => exit_with_flag_error::<Args>(format_args!("--admin-token: {message}")),
    };
    let policies = match policies(&args) {
        Ok(policies) => policies,
        Err(message) => exit_with_flag_error::<Args>(message),
    };
    match serve(args, policies, token).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The policies the flags name: `--limit` per client, `--ip-limit` per IP
/// (named `per-ip-` and its parameters), both in shadow mode with `--shadow`.
fn policies(args: &Args) -> Result<Policies, String> {
    let per_client = args.policy.policy()?.with_shadow(args.shadow);
    let ip_limit = args.ip_limit.unwrap_or(args.policy.limit);
    let flags = || {
        format!(
            "--algorithm {} --ip-limit {ip_limit} --window {}",
            args.policy.algorithm,
            humantime::format_duration(args.policy.window)
        )
    };
    let per_ip = policy_for(args.policy.algorithm, ip_limit, args.policy.window)
        .and_then(|p| {
            let name = format!("per-ip-{}", p.name());
            p.with_name(name)
        })
        .map_err(|e| format!("{}: {e}", flags()))?
        .with_shadow(args.shadow);
    Ok(Policies { per_ip, per_client })
}

/// What only the flags together can tell: several Redis URLs without
/// `--cluster`, and an admin API on another listener's address.
fn check_addresses(args: &Args) -> Result<(), String> {
    args.regions.check(args.cluster)?;
    // clap lets a `requires` go when the required flag conflicts with a
    // flag given (--redis), so this one is checked here.
    if args.master_name.is_some() && args.sentinel.is_empty() {
        return Err(String::from(
            "--master-name: give the sentinels that name the master with --sentinel HOST:PORT, in place of --redis",
        ));
    }
    if args.regions.region.is_some() && !args.sentinel.is_empty() {
        return Err(String::from(
            "--region: each region's Redis is one node given with --redis, not --sentinel",
        ));
    }
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
    // The admin API never shares the public listener.
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
    // Beyond loopback, anyone who reaches the address could reset, unblock
    // or block any client: not without a token.
    if !admin.ip().is_loopback() && args.admin_token.is_none() {
        return Err(format!(
            "--admin {admin}: not a loopback address, so the admin API needs a token: \
             --admin-token TOKEN or RATELIMIT_ADMIN_TOKEN (openssl rand -hex 32)"
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
async fn serve(args: Args, policies: Policies, token: Option<AdminToken>) -> Result<(), String> {
    // Installed first, so the breaker's and the store's metrics land in it.
    let metrics = match args.metrics {
        Some(addr) => {
            let handle = install_prometheus().map_err(|e| format!("--metrics {addr}: {e}"))?;
            Some((addr, handle))
        }
        None => None,
    };
    let (builder, redis) = match &args.master_name {
        Some(name) if !args.sentinel.is_empty() => (
            RedisStore::sentinel_builder(args.sentinel.iter().cloned(), name.clone()),
            format!(
                "the master {name} of the sentinels at {}",
                args.sentinel.join(",")
            ),
        ),
        _ if args.cluster => (
            RedisStore::cluster_builder(args.redis.iter().cloned()),
            args.redis.join(","),
        ),
        _ => (
            RedisStore::builder(args.redis.first().cloned().unwrap_or_default()),
            args.redis.join(","),
        ),
    };
    let store = builder
        .call_timeout(args.timeout)
        .build()
        .await
        .map_err(|e| {
            if args.sentinel.is_empty() {
                format!("--redis {redis}: {e}")
            } else {
                format!("--sentinel: {e}")
            }
        })?;
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
        .store(
            args.redis.first().map_or("", String::as_str),
            args.timeout,
            &policies.per_client,
        )
        .await?
        .map(|store| limited_routes(store, &policies, failure));
    // The admin API acts on the store the layer decides with, under the
    // same policies, so its keys are the layer's keys.
    let admin = |store| admin_router(store, &policies, token.clone());
    let (limited, admin, breaker) = match args.failure {
        Failure::Closed => (
            limited_routes(store.clone(), &policies, FailurePolicy::Closed),
            admin(store),
            None,
        ),
        Failure::Open => (
            limited_routes(store.clone(), &policies, FailurePolicy::Open),
            admin(store),
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
            let routes = limited_routes(store.clone(), &policies, FailurePolicy::Closed);
            // `FallbackStore` sends admin operations to Redis, whatever the
            // breaker says: the local shares are never touched.
            (
                routes,
                admin_router(store, &policies, token.clone()),
                Some(breaker),
            )
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
        if token.is_none() {
            // Only on loopback (checked with the flags), and said out loud.
            eprintln!(
                "warning: the admin API on {bound} has no token: any process on this machine \
                 can reset, penalize or block any client; set RATELIMIT_ADMIN_TOKEN"
            );
        }
    }
    ratelimit_examples::serve(listener, app)
        .await
        .map_err(|e| format!("serving on {addr}: {e}"))
}

/// `GET /`, `GET /expensive` and `GET /slow`, rate limited in `store`.
fn limited_routes<St>(store: St, policies: &Policies, failure: FailurePolicy) -> Router
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
    // Per client IP, whatever key the request sends, and per client: its
    // API key, else its IP. All or nothing: a request one refuses takes
    // nothing from the other. The API key is the client's to choose: without
    // the first rule, a new key per request would escape the limit.
    let per_client = Rule::new(policies.per_client.clone(), api_key_or_peer_ip()).cost(cost);
    let limit = RateLimitLayer::new(store, policies.per_ip.clone(), PeerIp)
        .cost(cost)
        .and(per_client)
        .on_failure(failure);

    Router::new()
        .route("/", get(root))
        .route("/expensive", get(expensive))
        .route("/slow", get(slow))
        .route_layer(limit)
}

/// The admin API over `store`, under both policies, asking for `token`
/// when there is one.
fn admin_router<S>(store: S, policies: &Policies, token: Option<AdminToken>) -> Router
where
    S: AdminStore + Clone,
{
    let api = AdminApi::new(store, policies.per_ip.clone()).and(policies.per_client.clone());
    match token {
        Some(token) => api.bearer_token(token).router(),
        None => api.router(),
    }
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
    ratelimit_examples::answer("ok", &info)
}

/// `GET /expensive`: cost 10.
async fn expensive(info: RateLimitInfo) -> String {
    ratelimit_examples::answer("expensive ok", &info)
}

/// `GET /slow`: cost 1, answers after a second.
async fn slow(info: RateLimitInfo) -> String {
    tokio::time::sleep(SLOW_DELAY).await;
    ratelimit_examples::answer("slow ok", &info)
}
