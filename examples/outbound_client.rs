//! The client side: several workers call a strict downstream API through a
//! Tower stack that waits for its turn instead of failing, so the API never
//! sees more than its limit.
//!
//! ```text
//! cargo run --example outbound_client
//! cargo run --example outbound_client -- --workers 6 --requests 3 --limit 6 --window 500ms
//! # the same budget shared by several processes:
//! redis-server --port 6379 --save ''
//! cargo run --example outbound_client -- --redis redis://127.0.0.1:6379
//! ```
//!
//! Flags, all optional:
//!
//! - `--workers N`: concurrent workers (default 8);
//! - `--requests M`: calls per worker (default 5);
//! - `--limit L`: the most calls the downstream API accepts in any window (default 5);
//! - `--window DURATION` (`500ms`, `1s`, `1m`): that window (default `1s`);
//! - `--margin DURATION`: slack for the time between the limiter's decision
//!   and the call's arrival (default: a twentieth of the window, at most 25 ms);
//! - `--max-delay DURATION`: the longest one call may wait for its turn
//!   (default `30s`); a call that would wait longer fails;
//! - `--redis URL`: keep the limiter's state in Redis, so every process using
//!   the same Redis shares one budget (each process still checks the calls
//!   that reach its own mock).
//!
//! The program starts a mock of the downstream API on 127.0.0.1 (a free
//! port). It keeps the arrival time of every call, answers `429 Too Many
//! Requests` to a call that would make more than `--limit` calls in the last
//! `--window`, and records the most calls it ever saw in any window of that
//! length. The workers call it with `reqwest` through
//!
//! ```text
//! ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(store, Policy::leaky_bucket(..), GlobalKey::new(..))
//!         .wait(max_delay)
//!         .for_errors())
//!     .service(service_fn(call_the_api))
//! ```
//!
//! # Why a leaky bucket, and why the calls stay within the limit
//!
//! A leaky bucket draining `L` units per `W + margin` hands out slots one
//! emission interval `I = ceil((W + margin) / L)` (in µs) apart: each admitted
//! call gets the slot `max(tat, now)` and moves `tat` one interval later, and
//! the wait mode sleeps until that slot. So consecutive calls leave at least
//! `I` apart, and any `L + 1` consecutive calls span at least
//! `L * I >= W + margin`. A call arrives at the API a little after its slot
//! (timer wake-up, the HTTP round trip on loopback); as long as that lateness
//! varies by less than `margin`, any `L + 1` consecutive arrivals are more than
//! `W` apart, so no window of length `W` ever holds more than `L` calls. With
//! `margin = 0` the slots alone are exact (`L * I >= W`), but one call that
//! arrives late and the next on time could already share a window with
//! `L` others. The margin costs `margin / (W + margin)` of the throughput.
//!
//! The bucket's capacity is how many calls may be queued at once (slots
//! handed out ahead); it never lets calls leave closer than `I`. It is
//! `max_delay / I`: every call that can get a slot within `max_delay` gets it
//! at once and sleeps until it, first come first served, so the workers of
//! several processes sharing the Redis budget take turns (with a smaller
//! queue, a denied worker polls, and loses the slot to workers that queue
//! again the moment their call returns). A call that finds the queue full is
//! denied, retries when it has room, and fails after `max_delay`.
//!
//! At the end the program prints one line, such as
//! `sent=40 received=40 failed=0 max_in_any_window=5 limit=5 window=1s span_ms=7995 elapsed_ms=8002 ok`
//! (`span_ms`: from the first call's arrival at the mock to the last's), and
//! exits with status 1 when any call failed or the API ever saw more than its
//! limit (the line then ends in `FAILED`), 2 on bad flags.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{MemoryStore, Policy, Rate, Store};
use ratelimit_examples::{
    exit_with_flag_error, nonzero_duration, parse_duration, redis_url, spawn_serve,
};
use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

/// The key every call is limited under: one budget for the downstream API.
const BUDGET_KEY: &str = "downstream-api";

/// The name of the policy (part of the Redis key).
const POLICY_NAME: &str = "outbound";

/// The longest one HTTP call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "outbound_client",
    about = "Workers call a strict mock API through a limiter that waits for its turn."
)]
struct Args {
    /// Concurrent workers.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    workers: usize,
    /// Calls per worker.
    #[arg(long, value_name = "M", default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    requests: usize,
    /// The most calls the downstream API accepts in any window.
    #[arg(long, value_name = "L", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// That window (500ms, 1s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = nonzero_duration)]
    window: Duration,
    /// Slack for the time between the limiter's decision and the call's
    /// arrival [default: a twentieth of the window, at most 25ms].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    margin: Option<Duration>,
    /// The longest one call may wait for its turn; a call that would wait
    /// longer fails.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    max_delay: Duration,
    /// Keep the limiter's state in Redis, shared by every process using it.
    #[arg(long, value_name = "URL", value_parser = redis_url)]
    redis: Option<String>,
}

impl Args {
    /// `--margin`, or its default.
    fn margin(&self) -> Duration {
        self.margin
            .unwrap_or_else(|| (self.window / 20).min(Duration::from_millis(25)))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let policy = match spacing_policy(&args) {
        Ok(policy) => policy,
        Err(message) => exit_with_flag_error::<Args>(message),
    };
    match run(args, policy).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The leaky bucket that spaces calls `(window + margin) / limit` apart (see
/// the crate docs for why), queueing as many calls as can leave within
/// `max_delay`.
fn spacing_policy(args: &Args) -> Result<Policy, String> {
    let period = args.window + args.margin();
    let rate = Rate::new(args.limit, period);
    // The store rounds the interval up to a whole microsecond; so do we.
    let interval_us = period.as_micros().div_ceil(u128::from(args.limit));
    // An admitted call waits at most (capacity - 1) intervals for its slot.
    let fits = args.max_delay.as_micros() / interval_us.max(1);
    let capacity = u64::try_from(fits).unwrap_or(u64::MAX).max(1);
    Policy::leaky_bucket(capacity, rate)
        .and_then(|p| p.with_name(POLICY_NAME))
        .map_err(|e| {
            format!(
                "--limit {} --window {:?} --max-delay {:?}: {e}",
                args.limit, args.window, args.max_delay
            )
        })
}

/// Starts the mock, runs the workers through the limiter, and prints the
/// summary. `Ok(false)` when a call failed or the mock saw too many calls.
async fn run(args: Args, policy: Policy) -> Result<bool, String> {
    let downstream = Downstream::start(args.limit, args.window).await?;
    eprintln!(
        "downstream mock on {}: at most {} calls per {:?}; leaky bucket of {} draining {} per {:?}{}",
        downstream.url,
        args.limit,
        args.window,
        policy.limit(),
        args.limit,
        args.window + args.margin(),
        if args.redis.is_some() {
            ", in Redis"
        } else {
            ""
        },
    );

    let started = Instant::now();
    let calls = match &args.redis {
        None => run_workers(MemoryStore::new(), policy, &args, &downstream.url).await,
        Some(url) => {
            let store = RedisStore::builder(url.clone())
                .build()
                .await
                .map_err(|e| format!("cannot use Redis at {url}: {e}"))?;
            run_workers(store, policy, &args, &downstream.url).await
        }
    };
    let elapsed = started.elapsed();

    let seen = downstream.seen();
    let sent = args.workers * args.requests;
    let ok = calls.failed == 0
        && seen.refused == 0
        && seen.received == sent
        && seen.max_in_any_window <= usize::try_from(args.limit).unwrap_or(usize::MAX);
    println!(
        "sent={sent} received={} failed={} max_in_any_window={} limit={} window={:?} span_ms={} elapsed_ms={} {}",
        seen.received,
        calls.failed,
        seen.max_in_any_window,
        args.limit,
        args.window,
        seen.span().as_millis(),
        elapsed.as_millis(),
        if ok { "ok" } else { "FAILED" },
    );
    if let Some(error) = calls.first_error {
        eprintln!("first failed call: {error}");
    }
    if seen.refused > 0 {
        eprintln!("the downstream API refused {} calls with 429", seen.refused);
    }
    Ok(ok)
}

/// One call to the downstream API.
#[derive(Debug, Clone, Copy)]
struct Call {
    worker: usize,
    n: usize,
}

/// Why a call to the downstream API failed.
///
/// A concrete type rather than `BoxError`: with a boxed inner error, the
/// layer's `E: Into<BoxError>` bound trips rustc's higher-ranked `Send`
/// check when the call's future is spawned ("implementation of `From` is not
/// general enough").
#[derive(Debug)]
struct CallError(String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallError {}

/// What the workers saw.
#[derive(Debug, Default)]
struct Calls {
    failed: usize,
    first_error: Option<String>,
}

/// Runs the workers, each making its calls one after the other through the
/// rate-limited client stack.
async fn run_workers<St>(store: St, policy: Policy, args: &Args, base: &str) -> Calls
where
    St: Store + Clone,
{
    let http = match reqwest::Client::builder()
        .no_proxy()
        .timeout(CALL_TIMEOUT)
        .build()
    {
        Ok(http) => http,
        Err(e) => {
            return Calls {
                failed: args.workers * args.requests,
                first_error: Some(format!("cannot build the HTTP client: {e}")),
            };
        }
    };
    let base = base.to_owned();
    let client = tower::service_fn(move |call: Call| {
        let request = http.get(format!("{base}/call?worker={}&n={}", call.worker, call.n));
        async move {
            let response = request
                .send()
                .await
                .map_err(|e| CallError(format!("the call failed: {e}")))?;
            let status = response.status();
            if !status.is_success() {
                return Err(CallError(format!("the downstream API answered {status}")));
            }
            Ok(status)
        }
    });
    let service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(store, policy, GlobalKey::new(BUDGET_KEY))
                .wait(args.max_delay)
                .for_errors()
                // A client guarding a strict API: without the store, do not call.
                .on_failure(FailurePolicy::Closed),
        )
        .service(client);

    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..args.workers {
        let mut service = service.clone();
        let requests = args.requests;
        workers.spawn(async move {
            let mut calls = Calls::default();
            for n in 0..requests {
                let result = match service.ready().await {
                    Ok(ready) => ready.call(Call { worker, n }).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    calls.failed += 1;
                    calls
                        .first_error
                        .get_or_insert_with(|| format!("worker {worker}, call {n}: {e}"));
                }
            }
            calls
        });
    }
    let mut all = Calls::default();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(calls) => {
                all.failed += calls.failed;
                if all.first_error.is_none() {
                    all.first_error = calls.first_error;
                }
            }
            Err(e) => {
                all.failed += args.requests;
                all.first_error
                    .get_or_insert_with(|| format!("worker failed: {e}"));
            }
        }
    }
    all
}

/// What the mock of the downstream API saw.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    received: usize,
    refused: usize,
    max_in_any_window: usize,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Seen {
    /// From the first arrival to the last.
    fn span(&self) -> Duration {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        }
    }
}

/// The arrivals the mock keeps.
#[derive(Debug, Default)]
struct Log {
    /// The arrivals within the last window, oldest first.
    recent: VecDeque<Instant>,
    seen: Seen,
}

/// A strict downstream API: at most `limit` calls in any `window` (a sliding
/// log of arrival times), else `429`.
#[derive(Debug)]
struct Limits {
    limit: usize,
    window: Duration,
    log: Mutex<Log>,
}

/// The running mock.
#[derive(Debug)]
struct Downstream {
    url: String,
    limits: Arc<Limits>,
}

impl Downstream {
    /// Serves the mock on a free port of 127.0.0.1.
    async fn start(limit: u64, window: Duration) -> Result<Self, String> {
        let limits = Arc::new(Limits {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            window,
            log: Mutex::new(Log::default()),
        });
        let app = Router::new()
            .route("/call", get(arrive))
            .with_state(limits.clone());
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let addr = spawn_serve(loopback, app, "the downstream mock")
            .await
            .map_err(|e| format!("cannot start the downstream mock: {e}"))?;
        Ok(Downstream {
            url: format!("http://{addr}"),
            limits,
        })
    }

    /// What the mock saw so far.
    fn seen(&self) -> Seen {
        self.limits
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .seen
    }
}

/// One call reaches the mock: count it in the window `(now - window, now]`.
///
/// The largest such count over every arrival is the most calls any window
/// of that length ever held (a window holds no more than the one ending at
/// its last arrival).
async fn arrive(State(limits): State<Arc<Limits>>) -> StatusCode {
    let mut log = limits.log.lock().unwrap_or_else(PoisonError::into_inner);
    // Read the time under the lock, so arrivals are logged in order.
    let now = Instant::now();
    while log
        .recent
        .front()
        .is_some_and(|&first| now.duration_since(first) >= limits.window)
    {
        log.recent.pop_front();
    }
    log.recent.push_back(now);
    let in_window = log.recent.len();
    log.seen.received += 1;
    log.seen.first.get_or_insert(now);
    log.seen.last = Some(now);
    log.seen.max_in_any_window = log.seen.max_in_any_window.max(in_window);
    if in_window > limits.limit {
        log.seen.refused += 1;
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    }
}
