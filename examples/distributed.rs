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
//! - `--algorithm NAME`: `fixed-window`, `sliding-log`, `sliding-window`,
//!   `token-bucket`, `gcra`, `leaky-bucket` or `concurrency`;
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
//!   DURATION` (default `100ms`): serve region `NAME`, deciding in its own
//!   `--redis` against the counts of every region (`MultiRegionStore`, see
//!   the README's multi-region demo); `fixed-window` or `sliding-window` only;
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
//! header (or with an empty one), that is the client's IP as Rust prints it:
//! `127.0.0.1`, `203.0.113.7`, `2001:db8::7` (an IPv4-mapped IPv6 peer,
//! `::ffff:203.0.113.7`, as `203.0.113.7`). With one, it is `#` followed by
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
//! metrics and admin addresses go to stderr). Bad or missing flags exit with
//! status 2 and a usage line; `--help` prints the usage line and a summary of
//! the flags.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::get;
use ratelimit_axum::RateLimitInfo;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    BreakerState, CircuitBreaker, FallbackStore, MemoryStore, Policy, Rate, Store,
};
use ratelimit_examples::{admin_router, install_prometheus, parse_duration, serve_metrics};
use ratelimit_tower::{FailurePolicy, Key, PeerIp, RateLimitLayer};

/// The usage line printed with every flag error.
const USAGE: &str = "usage: distributed --listen ADDR --redis URL [--redis URL ...] [--cluster] \
     --algorithm <fixed-window|sliding-log|sliding-window|token-bucket|gcra|leaky-bucket|concurrency> \
     --limit N --window DURATION [--failure <open|closed|fallback>] [--timeout DURATION] \
     [--instances N] [--shadow] [--metrics ADDR] [--admin ADDR] \
     [--region NAME --peer NAME=URL ... [--sync DURATION]]";

/// What `--help` prints after the usage line.
const HELP: &str = "\
Serves GET / (cost 1), GET /expensive (cost 10) and GET /slow (cost 1, answers
after a second), rate limited through a Redis shared with the other instances,
and GET /health. Requests are keyed by x-api-key (hashed), else the client IP.

  --listen ADDR        the public address, such as 127.0.0.1:8081
  --redis URL          redis://[user:password@]host[:port][/db]; with --cluster,
                       any nodes of a Redis Cluster (repeated or comma-separated)
  --cluster            the Redis URLs are nodes of a Redis Cluster
  --algorithm NAME     fixed-window, sliding-log, sliding-window, token-bucket,
                       gcra, leaky-bucket or concurrency
  --limit N            the limit per window; the burst for token-bucket, gcra and
                       leaky-bucket; the most in flight for concurrency
  --window DURATION    500ms, 10s, 1m, 1h: the window, refill period or lease
  --failure MODE       when Redis cannot decide: closed (503, the default), open
                       (let through) or fallback (in memory, limit / --instances)
  --timeout DURATION   how long Redis has to decide a request (default 500ms)
  --instances N        instances sharing the limit, for --failure fallback (default 3)
  --shadow             decide and count every request, refuse none
  --region NAME        serve region NAME: decide in its own --redis against all
  --peer NAME=URL      regions' counts; one --peer per other region's Redis
  --sync DURATION      how often counts go to the peers (default 100ms)
  --metrics ADDR       serve GET /metrics (Prometheus text format) on ADDR
  --admin ADDR         serve the admin API on ADDR, another address than --listen.
                       It has no authentication: bind it to loopback or an
                       internal network only.
      GET  /admin/keys/KEY                      the key's decision, consuming nothing
      POST /admin/keys/KEY/reset                a full budget again, any block lifted
      POST /admin/keys/KEY/penalize?amount=N    consume N units (even into debt)
      POST /admin/keys/KEY/reward?amount=N      give N units back
      POST /admin/keys/KEY/block?for=DURATION   refuse every request of KEY until then
      POST /admin/keys/KEY/unblock              end a block
    KEY is the limiter's key: the client IP (127.0.0.1, 2001:db8::7) or, for
    requests with x-api-key, %23 and the first 32 hex digits of the SHA-256 of
    the header's value (printf %s \"$API_KEY\" | sha256sum | cut -c1-32).";

/// The algorithms `--algorithm` accepts.
const ALGORITHMS: [&str; 7] = [
    "fixed-window",
    "sliding-log",
    "sliding-window",
    "token-bucket",
    "gcra",
    "leaky-bucket",
    "concurrency",
];

/// The header requests are keyed by.
const API_KEY_HEADER: &str = "x-api-key";

/// The time Redis has to decide one request (`--timeout`'s default).
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// How many instances share the limit (`--instances`'s default).
const DEFAULT_INSTANCES: u32 = 3;

/// What `GET /expensive` costs.
const EXPENSIVE_COST: u64 = 10;

/// How long `GET /slow` takes to answer.
const SLOW_DELAY: Duration = Duration::from_secs(1);

/// The command line, parsed.
#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    redis: Vec<String>,
    cluster: bool,
    algorithm: &'static str,
    limit: u64,
    window: Duration,
    failure: Failure,
    timeout: Duration,
    instances: u32,
    shadow: bool,
    metrics: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    regions: Box<ratelimit_examples::region::RegionFlags>,
}

/// What to do when Redis cannot decide (`--failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Let the request through.
    Open,
    /// Refuse it with 503.
    Closed,
    /// Decide it in memory, with the limit divided among the instances.
    Fallback,
}

impl Failure {
    /// The values `--failure` accepts.
    const NAMES: [&'static str; 3] = ["open", "closed", "fallback"];

    fn parse(text: &str) -> Option<Failure> {
        match text {
            "open" => Some(Failure::Open),
            "closed" => Some(Failure::Closed),
            "fallback" => Some(Failure::Fallback),
            _ => None,
        }
    }
}

/// What the command line asks for.
enum Command {
    Run(Args),
    Help,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(args)) => args,
        Ok(Command::Help) => {
            println!("{USAGE}\n\n{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("error: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let policy = match build_policy(args.algorithm, args.limit, args.window) {
        Ok(policy) => policy.with_shadow(args.shadow),
        Err(message) => {
            eprintln!("error: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match serve(args, policy).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the flags (without the program name).
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut listen = None;
    let mut redis = Vec::new();
    let mut cluster = false;
    let mut algorithm = None;
    let mut limit = None;
    let mut window = None;
    let mut failure = None;
    let mut timeout = None;
    let mut instances = None;
    let mut shadow = false;
    let mut metrics = None;
    let mut admin = None;
    let mut regions = ratelimit_examples::region::RegionFlags::default();

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--cluster" => {
                if inline.is_some() {
                    return Err(String::from("--cluster takes no value"));
                }
                cluster = true;
            }
            "--shadow" => {
                if inline.is_some() {
                    return Err(String::from("--shadow takes no value"));
                }
                shadow = true;
            }
            "--metrics" => {
                let text = value()?;
                let addr = text.parse().map_err(|_| {
                    format!("--metrics: {text:?} is not a socket address such as 127.0.0.1:9090")
                })?;
                set_once(&mut metrics, addr, "--metrics")?;
            }
            "--admin" => {
                let text = value()?;
                let addr = text.parse().map_err(|_| {
                    format!("--admin: {text:?} is not a socket address such as 127.0.0.1:9091")
                })?;
                set_once(&mut admin, addr, "--admin")?;
            }
            "--listen" => {
                let text = value()?;
                let addr = text.parse().map_err(|_| {
                    format!("--listen: {text:?} is not a socket address such as 127.0.0.1:8081")
                })?;
                set_once(&mut listen, addr, "--listen")?;
            }
            "--redis" => {
                let text = value()?;
                for url in text.split(',').map(str::trim) {
                    if url.is_empty() {
                        return Err(format!("--redis: empty URL in {text:?}"));
                    }
                    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
                        return Err(format!(
                            "--redis: {url:?} is not a Redis URL such as redis://127.0.0.1:6379"
                        ));
                    }
                    redis.push(url.to_owned());
                }
            }
            "--algorithm" => {
                let text = value()?;
                let name = ALGORITHMS
                    .iter()
                    .copied()
                    .find(|name| *name == text)
                    .ok_or_else(|| {
                        format!(
                            "--algorithm: unknown algorithm {text:?} (use one of {})",
                            ALGORITHMS.join(", ")
                        )
                    })?;
                set_once(&mut algorithm, name, "--algorithm")?;
            }
            "--limit" => {
                let text = value()?;
                let n =
                    text.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("--limit: {text:?} is not a whole number above 0")
                    })?;
                set_once(&mut limit, n, "--limit")?;
            }
            "--window" => {
                let text = value()?;
                let duration = parse_duration(&text).map_err(|e| format!("--window: {e}"))?;
                if duration.is_zero() {
                    return Err(format!("--window: {text:?} is zero"));
                }
                set_once(&mut window, duration, "--window")?;
            }
            "--failure" => {
                let text = value()?;
                let mode = Failure::parse(&text).ok_or_else(|| {
                    format!(
                        "--failure: unknown mode {text:?} (use one of {})",
                        Failure::NAMES.join(", ")
                    )
                })?;
                set_once(&mut failure, mode, "--failure")?;
            }
            "--timeout" => {
                let text = value()?;
                let duration = parse_duration(&text).map_err(|e| format!("--timeout: {e}"))?;
                if duration.is_zero() {
                    return Err(format!("--timeout: {text:?} is zero"));
                }
                set_once(&mut timeout, duration, "--timeout")?;
            }
            "--instances" => {
                let text = value()?;
                let n = text.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!(
                        "--instances: {text:?} is not a whole number from 1 to {}",
                        u32::MAX
                    )
                })?;
                set_once(&mut instances, n, "--instances")?;
            }
            "--region" => set_once(&mut regions.region, value()?, "--region")?,
            "--peer" => regions
                .peers
                .push(ratelimit_examples::region::parse_peer(&value()?)?),
            "--sync" => {
                let sync = parse_duration(&value()?).map_err(|e| format!("--sync: {e}"))?;
                set_once(&mut regions.sync, sync, "--sync")?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }

    if redis.len() > 1 && !cluster {
        return Err(format!(
            "--redis: {} URLs given; several URLs are the nodes of a Redis Cluster and need --cluster",
            redis.len()
        ));
    }
    if redis.is_empty() {
        return Err(String::from("missing --redis"));
    }
    let listen = listen.ok_or("missing --listen")?;
    regions.check(cluster)?;
    if regions.region.is_some() && (admin.is_some() || failure == Some(Failure::Fallback)) {
        return Err(String::from("--region: no --admin, nor --failure fallback"));
    }
    if let Some(admin) = admin {
        // The admin API has no authentication: never on the public listener.
        if collide(admin, listen) {
            return Err(format!(
                "--admin {admin}: the admin API needs its own address, not --listen's ({listen})"
            ));
        }
        if let Some(metrics) = metrics.filter(|&metrics| collide(admin, metrics)) {
            return Err(format!(
                "--admin {admin}: the admin API needs its own address, not --metrics' ({metrics})"
            ));
        }
    }
    Ok(Command::Run(Args {
        listen,
        redis,
        cluster,
        algorithm: algorithm.ok_or("missing --algorithm")?,
        limit: limit.ok_or("missing --limit")?,
        window: window.ok_or("missing --window")?,
        failure: failure.unwrap_or(Failure::Closed),
        timeout: timeout.unwrap_or(DEFAULT_CALL_TIMEOUT),
        instances: instances.unwrap_or(DEFAULT_INSTANCES),
        shadow,
        metrics,
        admin,
        regions: Box::new(regions),
    }))
}

/// Whether two listeners would share a socket: the same port (not 0, which
/// picks a free one) on the same IP, or on any IP when one is unspecified.
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Stores `value` in `slot`, refusing a flag given twice.
fn set_once<T>(slot: &mut Option<T>, value: T, flag: &str) -> Result<(), String> {
    if slot.replace(value).is_some() {
        return Err(format!("{flag} given twice"));
    }
    Ok(())
}

/// The policy for `--algorithm`, `--limit` and `--window`.
fn build_policy(algorithm: &str, limit: u64, window: Duration) -> Result<Policy, String> {
    let rate = Rate::new(limit, window);
    let policy = match algorithm {
        "fixed-window" => Policy::fixed_window(limit, window),
        "sliding-log" => Policy::sliding_window_log(limit, window),
        "sliding-window" => Policy::sliding_window_counter(limit, window),
        "token-bucket" => Policy::token_bucket(limit, rate),
        "gcra" => Policy::gcra(limit, rate),
        "leaky-bucket" => Policy::leaky_bucket(limit, rate),
        "concurrency" => Policy::concurrency(limit, window),
        other => return Err(format!("--algorithm: unknown algorithm {other:?}")),
    };
    policy.map_err(|e| format!("--algorithm {algorithm} --limit {limit} --window {window:?}: {e}"))
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

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    if let Some((addr, handle)) = metrics {
        let bound = serve_metrics(addr, handle)
            .await
            .map_err(|e| format!("--metrics {addr}: {e}"))?;
        eprintln!("metrics on http://{bound}/metrics");
    }
    if let Some(addr) = args.admin {
        let bound = serve_admin(addr, admin)
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
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("writing to stdout: {e}"))?;
    drop(stdout);

    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|e| format!("serving on {addr}: {e}"))
}

/// Binds `addr` and serves the admin API there in the background; returns
/// the address bound.
async fn serve_admin(addr: SocketAddr, admin: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, admin).await {
            eprintln!("error: serving the admin API on {bound}: {e}");
        }
    });
    Ok(bound)
}

/// `GET /`, `GET /expensive` and `GET /slow`, rate limited in `store`.
fn limited_routes<St>(store: St, policy: Policy, failure: FailurePolicy) -> Router
where
    St: Store + Clone,
{
    let key = |req: &Request| -> Option<Key> {
        match req.headers().get(API_KEY_HEADER) {
            Some(value) if !value.is_empty() => {
                Some(Key::from(ratelimit_core::key::hashed(value.as_bytes())))
            }
            _ => PeerIp::peer_ip(req).map(Key::from),
        }
    };
    let cost = |req: &Request| -> u64 {
        if req.uri().path() == "/expensive" {
            EXPENSIVE_COST
        } else {
            1
        }
    };
    let limit = RateLimitLayer::new(store, policy, key)
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
