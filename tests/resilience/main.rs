//! Faults between the rate limiter and Redis, with real processes on
//! loopback: Redis killed under load and restarted, a slow, stalled or
//! connection-dropping network (a [`FaultProxy`]), a replica promoted to
//! primary, a store behind Redis Sentinel following a failover (`sentinel`),
//! and the `distributed` example falling back to memory.
//!
//! Every test prints the figures it saw (`--nocapture` shows them);
//! RELIABILITY.md summarises one run. The tests take turns (a shared lock):
//! they measure latencies, which other tests running at once would blur.
//! Everything is bounded in time: calls have timeouts, loads have deadlines,
//! servers and processes are stopped when dropped.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response};
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    BreakerState, CircuitBreaker, Decision, FallbackStore, MemoryStore, Policy, Rate, Store,
    StoreError,
};
use ratelimit_tests::fault_proxy::{FaultProxy, Mode};
use ratelimit_tests::loopback::{Answer, client, get, get_by_ip};
use ratelimit_tests::{Listening, RedisServer, build, named, spawn_listening, warm_up};
use ratelimit_tower::headers::{RateLimitHeaders, ResetFormat};
use ratelimit_tower::{FailurePolicy, Key, RateLimitLayer};
use tower::{Layer, ServiceExt};

mod attack_failover;
mod sentinel;

/// The Redis call timeout of the stores under test.
const CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// The consecutive failures that open a default `CircuitBreaker`, as its
/// docs give them.
const FAILURE_THRESHOLD: usize = 3;
/// A default `CircuitBreaker`'s cool-down before a probe.
const COOL_DOWN: Duration = Duration::from_millis(500);

/// What a call may take beyond [`CALL_TIMEOUT`]: the fallback, and
/// scheduling on a loaded machine (a real server and 20 clients on two
/// cores: a slowest call of 260 ms was seen). Still well below a call that
/// waited for a connection timeout (1 s by default) or never timed out.
const MARGIN: Duration = Duration::from_millis(400);

/// The shared limit in these tests, and how many instances share it.
const LIMIT: u64 = 30;
const INSTANCES: u32 = 3;

/// What each instance may admit on its own while Redis is unreachable.
const LOCAL_SHARE: u64 = LIMIT / INSTANCES as u64;

/// Concurrent clients of the load under which Redis is killed.
const TASKS: usize = 20;

/// Pause between two requests of one client of the load.
const PACE: Duration = Duration::from_millis(10);

/// Load before Redis is killed, how long it stays down, load after it is back.
const BEFORE: Duration = Duration::from_millis(700);
const DOWN: Duration = Duration::from_secs(1);
const AFTER: Duration = Duration::from_millis(1_500);

/// Longest a whole test may run before it fails.
const TEST_LIMIT: Duration = Duration::from_secs(40);

/// The fault tests take turns, two at a time: they measure latencies, and
/// two of them leave the cores mostly idle (they wait on servers, sentinels
/// and timers), so each keeps its margins while the binary takes half the
/// time. A test that brings a load of its own runs alone.
static SERIAL: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(TOGETHER as usize);

/// How many fault tests run at once.
const TOGETHER: u32 = 2;

/// A fault test's turn (see [`SERIAL`]), held until it is dropped.
type Turn = tokio::sync::SemaphorePermit<'static>;

/// Waits for a fault test's turn.
async fn turn() -> Turn {
    SERIAL
        .acquire()
        .await
        .expect("the semaphore is never closed")
}

/// Waits until no other fault test runs, for one that measures latencies
/// under a load of its own, and holds off any set started ahead of its turn
/// meanwhile (see [`ahead_of_turn`]). That permit is taken first, so a test
/// already setting up ahead gets its turn before this one.
async fn turn_alone() -> (Turn, tokio::sync::SemaphorePermit<'static>) {
    let no_early_start = ahead_of_turn().await;
    let turn = SERIAL
        .acquire_many(TOGETHER)
        .await
        .expect("the semaphore is never closed");
    (turn, no_early_start)
}

/// Servers started ahead of a test's turn (see `sentinel::started_in_turn`)
/// load the machine beside the tests that hold turns: one test at a time may
/// set up ahead, and none while a test runs alone.
static EARLY: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Waits until this test may set up ahead of its turn (see [`EARLY`]).
async fn ahead_of_turn() -> tokio::sync::SemaphorePermit<'static> {
    EARLY
        .acquire()
        .await
        .expect("the semaphore is never closed")
}

/// 30 per 10 s, a window longer than any test, as a sliding log: exact, so
/// "at most N in any window" is "at most N during the test".
fn policy(name: &str) -> Policy {
    named(
        name,
        Policy::sliding_window_log(LIMIT, Duration::from_secs(10)),
    )
}

async fn redis_store(url: String) -> RedisStore {
    build(RedisStore::builder(url).call_timeout(CALL_TIMEOUT)).await
}

/// A `FallbackStore` over `redis` with a local share (limit / `INSTANCES`)
/// in memory and a default `CircuitBreaker`, reachable through `breaker()`.
fn with_fallback(redis: RedisStore) -> FallbackStore<RedisStore> {
    let breaker = Arc::new(CircuitBreaker::default());
    FallbackStore::new(redis, MemoryStore::new(), INSTANCES, breaker)
}

/// Runs `future`, failing the test if it takes longer than [`TEST_LIMIT`].
async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("the test did not finish within {TEST_LIMIT:?}"))
}

/// Starts `clients` tasks, each running `call` on its own clone of `with`
/// until `done` and gathering what the calls return (`None`: nothing to
/// keep).
fn start_clients<W, T, F, Fut>(
    clients: usize,
    done: &Arc<AtomicBool>,
    with: &W,
    call: F,
) -> Vec<tokio::task::JoinHandle<Vec<T>>>
where
    W: Clone + Send + 'static,
    T: Send + 'static,
    F: Fn(W) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<T>> + Send,
{
    (0..clients)
        .map(|_| {
            let (with, call, done) = (with.clone(), call.clone(), Arc::clone(done));
            tokio::spawn(async move {
                let mut calls = Vec::new();
                while !done.load(Ordering::Acquire) {
                    calls.extend(call(with.clone()).await);
                }
                calls
            })
        })
        .collect()
}

/// Runs `future` and times it.
async fn timed<T>(future: impl Future<Output = T>) -> (Duration, T) {
    let start = Instant::now();
    let value = future.await;
    (start.elapsed(), value)
}

/// Runs `change` on `server` on a blocking thread, returning it.
async fn on_a_blocking_thread(
    mut server: RedisServer,
    change: fn(&mut RedisServer),
) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        change(&mut server);
        server
    })
    .await
    .expect("changing redis")
}

/// Stops (kills) `server` on a blocking thread, returning it.
async fn stop(server: RedisServer) -> RedisServer {
    on_a_blocking_thread(server, RedisServer::stop).await
}

/// Restarts `server` on a blocking thread (it waits until Redis answers).
async fn restart(server: RedisServer) -> RedisServer {
    on_a_blocking_thread(server, RedisServer::restart).await
}

fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}

/// The `percent`-th percentile of `values`, which must not be empty.
fn percentile(values: &[Duration], percent: usize) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let at = ((sorted.len() - 1) * percent.min(100) + 50) / 100;
    sorted[at]
}

fn latency_summary(values: &[Duration]) -> String {
    if values.is_empty() {
        return String::from("no calls");
    }
    format!(
        "p50 {} p99 {} max {}",
        ms(percentile(values, 50)),
        ms(percentile(values, 99)),
        ms(percentile(values, 100))
    )
}

// ---------------------------------------------------------------------------
// Redis killed under load, and restarted.

/// How the layer under load is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// `RedisStore`, `FailurePolicy::Closed`.
    Closed,
    /// `RedisStore`, `FailurePolicy::Open`.
    Open,
    /// `FallbackStore` (limit / 3 in memory, default breaker), `Closed`.
    Fallback,
}

/// One request of the load.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// When it was sent, from the start of the load.
    start: Duration,
    took: Duration,
    status: u16,
    /// `X-RateLimit-Limit`: 30 when Redis decided, 10 when the fallback did,
    /// absent when the request failed open or was refused with 503.
    limit: Option<u64>,
}

impl Sample {
    fn end(&self) -> Duration {
        self.start + self.took
    }
}

/// When Redis went down and came back, from the start of the load.
#[derive(Debug, Default, Clone, Copy)]
struct Timeline {
    /// `stop` returned: Redis is dead.
    down: Duration,
    /// `restart` was called: nothing answers before this.
    restarting: Duration,
    /// `restart` returned: Redis answers.
    up: Duration,
    end: Duration,
}

/// Runs [`TASKS`] clients against `service` for the whole timeline, every
/// request timed, while Redis is killed after [`BEFORE`] and restarted
/// [`DOWN`] later. Returns the samples and the timeline.
async fn load_through_outage<S>(service: S, server: RedisServer) -> (Vec<Sample>, Timeline)
where
    S: tower::Service<
            Request<()>,
            Response = Response<ratelimit_tower::body::ResponseBody<String>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let t0 = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let clients = start_clients(TASKS, &done, &service, move |service: S| async move {
        let start = t0.elapsed();
        let (took, response) = timed(service.oneshot(Request::new(()))).await;
        let response = response.expect("the service is infallible");
        let limit = response
            .headers()
            .get("x-ratelimit-limit")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let sample = Sample {
            start,
            took,
            status: response.status().as_u16(),
            limit,
        };
        tokio::time::sleep(PACE).await;
        Some(sample)
    });

    tokio::time::sleep(BEFORE).await;
    let server = stop(server).await;
    let down = t0.elapsed();
    tokio::time::sleep(DOWN).await;
    let restarting = t0.elapsed();
    let server = restart(server).await;
    let up = t0.elapsed();
    tokio::time::sleep(AFTER).await;
    done.store(true, Ordering::Release);

    let mut samples = Vec::new();
    for client in clients {
        samples.extend(client.await.expect("a load client panicked"));
    }
    let end = t0.elapsed();
    drop(server);
    samples.sort_by_key(|s| s.start);
    (
        samples,
        Timeline {
            down,
            restarting,
            up,
            end,
        },
    )
}

fn statuses(samples: &[&Sample]) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for s in samples {
        *counts.entry(s.status).or_insert(0) += 1;
    }
    counts
}

async fn redis_killed_under_load(setup: Setup) {
    let _turn = turn_alone().await;
    let server = RedisServer::start();
    let redis = redis_store(server.url()).await;
    let policy = policy("outage");
    let key = |_: &Request<()>| Some(Key::from("hot"));
    let headers = RateLimitHeaders::none().with_legacy(ResetFormat::DelaySeconds);
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let fallback = with_fallback(redis.clone());
    let breaker = Arc::clone(fallback.breaker());
    // Warm up: a connection and the script, outside the measured load.
    warm_up("Redis answers", || redis.check(b"warm-up", &policy, 1)).await;

    let (samples, t) = bounded(async {
        match setup {
            Setup::Closed | Setup::Open => {
                let failure = if setup == Setup::Closed {
                    FailurePolicy::Closed
                } else {
                    FailurePolicy::Open
                };
                let layer = RateLimitLayer::new(redis.clone(), policy.clone(), key)
                    .on_failure(failure)
                    .headers(headers);
                load_through_outage(layer.layer(inner), server).await
            }
            Setup::Fallback => {
                let layer = RateLimitLayer::new(fallback.clone(), policy.clone(), key)
                    .on_failure(FailurePolicy::Closed)
                    .headers(headers);
                load_through_outage(layer.layer(inner), server).await
            }
        }
    })
    .await;

    let label = format!("{setup:?}").to_lowercase();
    let all: Vec<&Sample> = samples.iter().collect();
    let before: Vec<&Sample> = samples.iter().filter(|s| s.end() < t.down).collect();
    // Sent once Redis was dead, answered before it was restarted: nothing
    // but the failure policy (or the fallback) can answer these. (A call
    // sent a little earlier may wait for a connection until the restart.)
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.start >= t.down && s.end() <= t.restarting)
        .collect();
    // Answered after the restart began: Redis may have answered these.
    let after: Vec<&Sample> = samples.iter().filter(|s| s.end() > t.restarting).collect();
    let took = |set: &[&Sample]| set.iter().map(|s| s.took).collect::<Vec<_>>();
    let by_redis = |s: &Sample| s.limit == Some(LIMIT);
    let by_fallback = |s: &Sample| s.limit == Some(LOCAL_SHARE);
    // The first decision Redis made after the restart.
    let recovered = after.iter().filter(|s| by_redis(s)).map(|s| s.end()).min();
    let recovery = recovered.map(|r| r.saturating_sub(t.up));
    let since_restart = recovered.map(|r| r.saturating_sub(t.restarting));

    println!(
        "[resilience] redis killed under load, {label}: {} requests from {TASKS} clients over {}; \
         Redis down at {}, restarted at {} (answering at {})",
        samples.len(),
        ms(t.end),
        ms(t.down),
        ms(t.restarting),
        ms(t.up),
    );
    println!(
        "[resilience]   latency: all {}; while down {}",
        latency_summary(&took(&all)),
        latency_summary(&took(&during))
    );
    println!(
        "[resilience]   statuses before {:?}, while down {:?}, after {:?}",
        statuses(&before),
        statuses(&during),
        statuses(&after)
    );
    let admitted_down = during.iter().filter(|s| s.status == 200).count();
    println!(
        "[resilience]   admitted while down: {admitted_down} (decided by the fallback: {}); \
         Redis decided again {} after the restart began, {} after it answered",
        during.iter().filter(|s| by_fallback(s)).count(),
        since_restart.map_or_else(|| String::from("never"), ms),
        recovery.map_or_else(|| String::from("never"), ms),
    );

    // Every call answered within the call timeout, plus a margin.
    let slowest = percentile(&took(&all), 100);
    assert!(
        slowest <= CALL_TIMEOUT + MARGIN,
        "{label}: the slowest call took {}",
        ms(slowest)
    );
    assert!(
        during.len() >= TASKS * 5,
        "{label}: only {} requests while Redis was down",
        during.len()
    );
    assert!(
        before
            .iter()
            .filter(|s| by_redis(s) && s.status == 200)
            .count() as u64
            == LIMIT,
        "{label}: before the outage, Redis admitted exactly the limit: {:?}",
        statuses(&before)
    );
    match setup {
        Setup::Closed => assert!(
            during.iter().all(|s| s.status == 503),
            "{label}: while Redis was down every request is refused: {:?}",
            statuses(&during)
        ),
        Setup::Open => assert!(
            during.iter().all(|s| s.status == 200 && s.limit.is_none()),
            "{label}: while Redis was down every request is let through: {:?}",
            statuses(&during)
        ),
        Setup::Fallback => {
            assert!(
                during.iter().all(|s| by_fallback(s)),
                "{label}: while Redis was down the fallback decides every request: {:?}",
                during.iter().find(|s| !by_fallback(s))
            );
            // The fallback decided the calls in flight when Redis died too,
            // before `down`: count everything it admitted during the test.
            let admitted_by_fallback = samples
                .iter()
                .filter(|s| by_fallback(s) && s.status == 200)
                .count() as u64;
            println!(
                "[resilience]   admitted by the fallback in all: {admitted_by_fallback} \
                 (local share {LOCAL_SHARE} of {LIMIT})"
            );
            assert!(
                (1..=LOCAL_SHARE).contains(&admitted_by_fallback),
                "{label}: the fallback admits at most the local share ({LOCAL_SHARE}), admitted {admitted_by_fallback}"
            );
            println!(
                "[resilience]   breaker: {:?} at the end, {} trip(s), {} fallback decisions",
                breaker.state(),
                breaker.trips(),
                fallback.fallback_decisions()
            );
            assert_eq!(breaker.state(), BreakerState::Closed, "{label}");
            assert_eq!(
                fallback.fallback_decisions(),
                samples.iter().filter(|s| by_fallback(s)).count() as u64,
                "{label}: every fallback decision is a sample with the local limit"
            );
            let recovered = recovered.expect("Redis decided again");
            let late: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.start > recovered && !by_redis(s))
                .collect();
            assert!(
                late.is_empty(),
                "{label}: once Redis decided again, it decided everything: {late:?}"
            );
        }
    }
    let recovery = recovery.unwrap_or_else(|| panic!("{label}: Redis never decided again"));
    // A fallback's breaker asks Redis again at most a cool-down after its
    // last failed probe, made before Redis answered, then takes one call;
    // without one, the next call reconnects, sooner.
    assert!(
        recovery <= COOL_DOWN + CALL_TIMEOUT + MARGIN,
        "{label}: Redis decided again {} after it answered",
        ms(recovery)
    );
    // At most the limit: a call that timed out after Redis ran its script
    // consumed without being admitted (which errs towards denying).
    let readmitted = after
        .iter()
        .filter(|s| by_redis(s) && s.status == 200)
        .count() as u64;
    println!("[resilience]   admitted by the restarted (empty) Redis: {readmitted} of {LIMIT}");
    assert!(
        (1..=LIMIT).contains(&readmitted),
        "{label}: the restarted (empty) Redis admits again, at most the limit: {readmitted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fail_closed_refuses_everything_while_down() {
    redis_killed_under_load(Setup::Closed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fail_open_admits_everything_while_down() {
    redis_killed_under_load(Setup::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fallback_holds_the_local_share_and_recovers() {
    redis_killed_under_load(Setup::Fallback).await;
}

/// How a call to a Redis that is down fails, with no load: within the call
/// timeout, as an error the failure policies apply to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_fails_within_the_call_timeout() {
    let _turn = turn().await;
    let server = RedisServer::start();
    let redis = redis_store(server.url()).await;
    let policy = policy("dead");
    warm_up("Redis answers", || redis.check(b"k", &policy, 1)).await;
    let server = stop(server).await;
    bounded(async {
        let mut took = Vec::new();
        let mut errors: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..5 {
            let (t, result) = timed(redis.check(b"k", &policy, 1)).await;
            let e = result.expect_err("Redis is down");
            assert!(e.is_outage(), "{e:?}");
            assert!(t <= CALL_TIMEOUT + MARGIN, "{e} after {}", ms(t));
            *errors.entry(e.to_string()).or_default() += 1;
            took.push(t);
        }
        println!(
            "[resilience] Redis down (connection refused), call timeout {}: calls failed in {} \
             with {errors:?}",
            ms(CALL_TIMEOUT),
            latency_summary(&took)
        );
    })
    .await;
    drop(server);
}

// ---------------------------------------------------------------------------
// A slow, stalled, or connection-dropping network: the fault proxy.

/// Whether `e` says Redis did not answer within [`CALL_TIMEOUT`].
///
/// `RedisStore` documents `StoreError::Timeout`, but the Redis client's own
/// response timeout (set to the same duration) usually fires first, and is
/// reported as `StoreError::Unavailable(timed out)`: both count here, and the
/// tests print which one they saw (see RELIABILITY.md).
fn is_timeout(e: &StoreError) -> bool {
    match e {
        StoreError::Timeout(t) => *t == CALL_TIMEOUT,
        StoreError::Unavailable(e) => e.to_string().contains("timed out"),
        _ => false,
    }
}

/// Calls `store` directly `n` times: each must fail within the timeout
/// (plus the margin) and satisfy `expected`. Returns the latencies, and how
/// many times each error was seen.
async fn failing_calls(
    store: &RedisStore,
    policy: &Policy,
    n: usize,
    what: &str,
    expected: impl Fn(&StoreError) -> bool,
) -> (Vec<Duration>, BTreeMap<String, usize>) {
    let mut took = Vec::with_capacity(n);
    let mut errors = BTreeMap::new();
    for i in 0..n {
        let (t, result) = timed(store.check(b"proxied", policy, 1)).await;
        match result {
            Err(e) if expected(&e) => *errors.entry(e.to_string()).or_insert(0) += 1,
            other => panic!("{what}: call {i} gave {other:?} after {}", ms(t)),
        }
        assert!(
            t <= CALL_TIMEOUT + MARGIN,
            "{what}: call {i} took {}",
            ms(t)
        );
        took.push(t);
    }
    (took, errors)
}

/// Calls `store` (a fallback store) until its breaker opens. Every call must
/// be decided by the fallback within the timeout plus the margin. Returns the
/// latencies of the calls it took, then of ten calls while it is open.
async fn trip(
    store: &FallbackStore<RedisStore>,
    policy: &Policy,
    what: &str,
) -> (Vec<Duration>, Vec<Duration>) {
    let breaker = store.breaker();
    let mut tripping = Vec::new();
    while breaker.state() != BreakerState::Open {
        assert!(
            tripping.len() < 10,
            "{what}: the breaker did not open after {} failures",
            tripping.len()
        );
        let t = by_the_fallback(store, policy, what).await;
        assert!(t <= CALL_TIMEOUT + MARGIN, "{what}: a call took {}", ms(t));
        tripping.push(t);
    }
    let mut open = Vec::new();
    for _ in 0..10 {
        open.push(by_the_fallback(store, policy, what).await);
    }
    (tripping, open)
}

/// One check on `store` that must be decided by its fallback (the local
/// share); returns how long it took.
async fn by_the_fallback(
    store: &FallbackStore<RedisStore>,
    policy: &Policy,
    what: &str,
) -> Duration {
    let (t, decision) = timed(store.check(b"proxied", policy, 1)).await;
    let decision = decision.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        decision.limit(),
        LOCAL_SHARE,
        "{what}: decided by the fallback"
    );
    t
}

/// Calls `store` every 10 ms until its breaker is closed and a call was
/// decided by Redis; returns how long that took.
async fn until_closed(store: &FallbackStore<RedisStore>, policy: &Policy, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let decision: Decision = store
            .check(b"proxied", policy, 0)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if store.breaker().state() == BreakerState::Closed && decision.limit() == LIMIT {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: the breaker stayed {:?}",
            store.breaker().state()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_stalled_or_dropping_network_fails_fast_and_the_breaker_recovers() {
    let _turn = turn().await;
    let (_server, proxy) = FaultProxy::with_new_server();
    let redis = redis_store(proxy.redis_url()).await;
    let store = with_fallback(redis.clone());
    let breaker = Arc::clone(store.breaker());
    let policy = policy("proxied");
    let recovery_bound = COOL_DOWN + CALL_TIMEOUT + MARGIN;

    bounded(async {
        let (t, decision) = timed(store.check(b"proxied", &policy, 1)).await;
        let decision = decision.expect("Redis through the proxy");
        assert_eq!(decision.limit(), LIMIT, "decided by Redis");
        println!(
            "[resilience] fault proxy, forwarding: first call (connect + script load) {}",
            ms(t)
        );

        // (fault, how the proxy makes it, the errors a direct call gets, whether
        // those come only at the call timeout). Dropped connections fail
        // within the call timeout, never hang (they too come at the timeout,
        // as `Timeout`: see `a_refused_connection_fails_at_once`).
        type Fault = (
            &'static str,
            Box<dyn Fn(&FaultProxy)>,
            fn(&StoreError) -> bool,
            bool,
        );
        let faults: [Fault; 3] = [
            (
                "300 ms latency",
                Box::new(|p| p.set_latency(Duration::from_millis(300))),
                is_timeout,
                true,
            ),
            (
                "stall",
                Box::new(|p| p.set_mode(Mode::Stall)),
                is_timeout,
                true,
            ),
            (
                "drop",
                Box::new(|p| p.set_mode(Mode::Drop)),
                StoreError::is_outage,
                false,
            ),
        ];
        for (fault, set, expected, at_the_timeout) in faults {
            set(&proxy);
            let (direct, errors) = failing_calls(&redis, &policy, 5, fault, expected).await;
            if at_the_timeout {
                assert!(
                    direct
                        .iter()
                        .all(|t| *t >= CALL_TIMEOUT - Duration::from_millis(2)),
                    "{fault}: a call gave up before the timeout: {direct:?}"
                );
            }
            let trips = breaker.trips();
            let (tripping, open) = trip(&store, &policy, fault).await;
            assert_eq!(
                tripping.len(),
                FAILURE_THRESHOLD,
                "{fault}: the breaker opens after its threshold of consecutive failures"
            );
            assert_eq!(breaker.trips(), trips + 1, "{fault}");
            proxy.set_latency(Duration::ZERO);
            proxy.set_mode(Mode::Forward);
            let recovery = until_closed(&store, &policy, fault).await;
            println!(
                "[resilience] fault proxy, {fault}: RedisStore (call timeout {}) failed in {} \
                 with {errors:?}; FallbackStore: {} failing calls to open the breaker ({}), \
                 then {} while open; back to forwarding, breaker closed in {}",
                ms(CALL_TIMEOUT),
                latency_summary(&direct),
                tripping.len(),
                latency_summary(&tripping),
                latency_summary(&open),
                ms(recovery),
            );
            assert!(
                recovery <= recovery_bound,
                "{fault}: the breaker closed {} after the fault ended (cool-down {} + a probe)",
                ms(recovery),
                ms(COOL_DOWN)
            );
        }

        assert_eq!(breaker.trips(), 3);
        println!(
            "[resilience] fault proxy: {} connections accepted in all",
            proxy.accepted()
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// A replica promoted to primary.

/// Polls `INFO replication` of `replica` until its link to the primary is up.
fn wait_for_link(replica: &RedisServer) -> Duration {
    let start = Instant::now();
    loop {
        let info = replica.cli(&["INFO", "replication"]);
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the replica did not sync within 10 s:\n{info}\n{}",
            replica.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The status a request gets from `service`.
async fn status_of<S, B>(service: &S) -> http::StatusCode
where
    S: tower::Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    service
        .clone()
        .oneshot(Request::new(()))
        .await
        .unwrap()
        .status()
}

/// A master demoted under a running store (a failover behind one name, or
/// `REPLICAOF` by hand): its connections are of no more use, and the new
/// one's probe finds a read-only replica, which is a mistake, refused
/// (never an outage that a fail-open layer would let through). Once the
/// node is a master again, the store decides on it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_refused_never_failed_open_then_used_again() {
    let _turn = turn().await;
    let other = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let node = RedisServer::start();
    let policy = named("demoted", Policy::gcra(10, Rate::per_hour(10)));

    bounded(async {
        let store = redis_store(node.url()).await;
        let key = |_: &Request<()>| Some(Key::from("k"));
        let layer =
            RateLimitLayer::new(store.clone(), policy.clone(), key).on_failure(FailurePolicy::Open);
        let service = layer.layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
        assert_eq!(status_of(&service).await, http::StatusCode::OK);

        let other_port = other.port().to_string();
        assert_eq!(node.cli(&["REPLICAOF", "127.0.0.1", &other_port]), "OK");
        wait_for_link(&node);
        for _ in 0..3 {
            let refused = store.check(b"k", &policy, 1).await;
            assert!(
                matches!(&refused, Err(e)
                    if !e.is_outage() && e.to_string().contains("read-only replica")),
                "a check on a demoted master: {refused:?}"
            );
            let status = status_of(&service).await;
            assert!(
                status.is_server_error() && status != http::StatusCode::SERVICE_UNAVAILABLE,
                "a fail-open layer on a demoted master answered {status}"
            );
        }

        assert_eq!(node.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
        let d = store.check(b"k", &policy, 1).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(status_of(&service).await, http::StatusCode::OK);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_keeps_the_replicated_state_and_decides() {
    let _turn = turn().await;
    let mut primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let primary_port = primary.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &primary_port]);
    let synced = wait_for_link(&replica);
    let policy = named("failover", Policy::gcra(10, Rate::per_hour(10)));

    bounded(async {
        let on_primary = redis_store(primary.url()).await;
        for expected in (6..10).rev() {
            let d = on_primary.check(b"tenant", &policy, 1).await.unwrap();
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), expected);
        }
        let caught_up = primary.wait_replicated(&replica);

        // A replica refuses writes until it is promoted: the store refuses
        // it as a mistake, never an outage a failure policy would let by.
        let on_replica = redis_store(replica.url()).await;
        let cached = replica
            .cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("number_of_cached_scripts:")
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        assert_eq!(cached, "0", "scripts cached on the replica");
        let refused = on_replica.check(b"tenant", &policy, 1).await;
        assert!(
            matches!(&refused, Err(e @ StoreError::Backend(_))
                if !e.is_outage() && e.to_string().contains("read-only replica")),
            "a check on a replica: {refused:?}"
        );

        let promoting = Instant::now();
        assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
        primary.stop();
        let (t, dead) = timed(on_primary.check(b"tenant", &policy, 1)).await;
        assert!(dead.is_err(), "the old primary is gone: {dead:?}");
        assert!(
            t <= CALL_TIMEOUT + MARGIN,
            "the old primary's error took {}",
            ms(t)
        );
        // Replication sends the scripts' effects, not the scripts: the
        // replica had none cached. (The refused check above loaded one;
        // flushing drops it, as a fresh replica would have none.)
        assert_eq!(replica.cli(&["SCRIPT", "FLUSH"]), "OK");

        // Clients pointed at the promoted replica continue where the primary
        // stopped: the state was replicated.
        let promoted = redis_store(replica.url()).await;
        let mut remaining = Vec::new();
        for expected in (0..6).rev() {
            let d = promoted.check(b"tenant", &policy, 1).await.unwrap();
            assert!(d.is_allowed(), "{d:?}");
            assert_eq!(d.remaining(), expected, "the replicated state continues");
            remaining.push(d.remaining());
        }
        let denied = promoted.check(b"tenant", &policy, 1).await.unwrap();
        assert!(!denied.is_allowed(), "the 11th request of 10: {denied:?}");
        // The old store instance, once its Redis is gone, keeps failing; the
        // refused store on the replica works once it is promoted.
        let d = on_replica.check(b"other", &policy, 1).await.unwrap();
        assert_eq!(d.remaining(), 9);
        println!(
            "[resilience] replica promoted: synced in {}, caught up with the writes in {}; before promotion a check on the \
             replica failed (read only); the old primary's error came after {}; scripts cached \
             on the replica: {cached}; after REPLICAOF NO ONE and SCRIPT FLUSH, decisions continued \
             from the replicated state (remaining {remaining:?}, then denied), all within {} of \
             the promotion",
            ms(synced),
            ms(caught_up),
            ms(t),
            ms(promoting.elapsed()),
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// The `distributed` example with `--failure fallback`.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_distributed_example_falls_back_to_its_share_and_recovers() {
    let _turn = turn().await;
    let server = RedisServer::start();
    let url = server.url();
    let instances: Vec<Listening> = (0..INSTANCES)
        .map(|_| {
            spawn_listening(
                "distributed",
                &[
                    "--redis",
                    &url,
                    "--algorithm",
                    "sliding-log",
                    "--limit",
                    "30",
                    "--window",
                    "1m",
                    "--failure",
                    "fallback",
                    "--instances",
                    "3",
                    "--timeout",
                    "200ms",
                    // The keys' requests all come from one address: a
                    // budget per IP far from theirs leaves them theirs.
                    "--ip-limit",
                    "3000",
                ],
                Duration::from_secs(30),
            )
        })
        .collect();
    let client = client();

    bounded(async {
        for (i, instance) in instances.iter().enumerate() {
            let health = get_by_ip(&client, &format!("{}/health", instance.base)).await;
            assert_eq!(
                (health.status, health.body.as_str()),
                (200, "closed\n"),
                "instance {i}"
            );
            let Answer { status, body, .. } =
                get(&client, &format!("{}/", instance.base), "alice").await;
            assert_eq!(status, 200, "{body}");
            assert!(body.contains(&format!("{} of 30 left", 29 - i)), "{body}");
        }

        let server = stop(server).await;
        let mut tasks = Vec::new();
        for instance in &instances {
            for _ in 0..30 {
                let (client, url) = (client.clone(), format!("{}/", instance.base));
                tasks.push(tokio::spawn(async move {
                    let (took, Answer { status, body, .. }) =
                        timed(get(&client, &url, "alice")).await;
                    (url, took, status, body)
                }));
            }
        }
        let mut admitted: BTreeMap<String, usize> = BTreeMap::new();
        let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
        let mut took = Vec::new();
        for task in tasks {
            let (url, t, status, body) = task.await.unwrap();
            *counts.entry(status).or_default() += 1;
            took.push(t);
            if status == 200 {
                assert!(
                    body.contains(" of 10 left"),
                    "decided by the fallback: {body}"
                );
                *admitted.entry(url).or_default() += 1;
            }
        }
        let mut states = Vec::new();
        for instance in &instances {
            states.push(
                get_by_ip(&client, &format!("{}/health", instance.base))
                    .await
                    .body,
            );
        }
        println!(
            "[resilience] distributed example, Redis killed: 90 requests for one key across 3 \
             instances: statuses {counts:?}, admitted per instance {:?} (share {LOCAL_SHARE}), \
             latency {}; /health {states:?}",
            admitted.values().collect::<Vec<_>>(),
            latency_summary(&took),
        );
        assert!(
            admitted.values().all(|&n| n as u64 <= LOCAL_SHARE),
            "at most the share per instance: {admitted:?}"
        );
        assert!(
            admitted.values().sum::<usize>() as u64 <= LIMIT,
            "at most the shared limit in all"
        );
        assert!(
            !admitted.is_empty(),
            "the fallback admits while Redis is down"
        );
        assert_eq!(counts.get(&503), None, "nothing refused for want of Redis");
        assert!(states.iter().all(|s| s == "open\n"), "{states:?}");

        let server = restart(server).await;
        let up = Instant::now();
        let mut recovered = Vec::new();
        for instance in &instances {
            loop {
                let _ = get(&client, &format!("{}/", instance.base), "bob").await;
                let state = get_by_ip(&client, &format!("{}/health", instance.base))
                    .await
                    .body;
                if state == "closed\n" {
                    recovered.push(up.elapsed());
                    break;
                }
                assert!(
                    up.elapsed() < Duration::from_secs(2),
                    "{}: /health still {state:?} 2 s after Redis came back",
                    instance.base
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let Answer { status, body, .. } =
            get(&client, &format!("{}/", instances[0].base), "carol").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("29 of 30 left"),
            "decided by Redis again: {body}"
        );
        println!(
            "[resilience] distributed example, Redis restarted: /health closed again after {:?}",
            recovered.iter().map(|d| ms(*d)).collect::<Vec<_>>()
        );
        drop(server);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Regressions: four faults found by these tests and fixed in `ratelimit-core`
// (see RELIABILITY.md).

/// `RedisStore` retries a call once "on a fresh connection" when its pooled
/// connection died with a Redis restart. But the retry takes the next idle
/// connection, dead too when several were pooled: after a restart with no
/// traffic in between, the first calls fail (`broken pipe`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_fails_no_call_whatever_the_pool_held() {
    let _turn = turn().await;
    let server = RedisServer::start();
    let redis =
        build(RedisStore::builder(server.url()).call_timeout(Duration::from_millis(500))).await;
    let policy = policy("restart");
    // Concurrent calls fill the pool with several connections.
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let (redis, policy) = (redis.clone(), policy.clone());
            tokio::spawn(async move { redis.check(format!("k{i}").as_bytes(), &policy, 1).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let _server = restart(server).await;
    for i in 0..4 {
        let result = redis.check(b"after", &policy, 1).await;
        assert!(result.is_ok(), "call {i} after the restart: {result:?}");
    }
}

/// A refused connection (nothing listens) fails at once, as a backend
/// error, rather than after the whole call timeout as `Timeout`: bb8's
/// `Pool::get` never returns connection errors (it hands them to its error
/// sink and waits for its connection timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_at_once() {
    let _turn = turn().await;
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let redis = redis_store(url).await;
    let (t, result) = timed(redis.check(b"k", &policy("refused"), 1)).await;
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))) && t < CALL_TIMEOUT / 2,
        "{result:?} after {}",
        ms(t)
    );
}

/// A connection slower to open than a call may take (replies held 100 ms:
/// the log-in and the ACL probe take two round trips or more, a call timeout
/// of 150 ms) opens in the background: the first calls time out, the opening
/// goes on without them, and a later call finds it open. Opened inside each
/// call, it was dropped with every call that timed out and started again by
/// the next: every call timed out (so failed open), for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_slower_to_open_than_a_call_opens_in_the_background() {
    let _turn = turn().await;
    let (_server, proxy) = FaultProxy::with_new_server();
    proxy.set_latency(Duration::from_millis(100));
    let redis = build(
        RedisStore::builder(proxy.redis_url())
            .pool_size(1)
            .call_timeout(Duration::from_millis(150))
            .connect_timeout(Duration::from_secs(5)),
    )
    .await;
    let policy = policy("slow-open");
    let first = redis.check(b"k", &policy, 1).await;
    assert!(matches!(first, Err(StoreError::Timeout(_))), "{first:?}");
    let started = Instant::now();
    let mut calls = 1;
    let answered = loop {
        calls += 1;
        match redis.check(b"k", &policy, 1).await {
            Ok(_) => break true,
            Err(StoreError::Timeout(_)) if started.elapsed() < Duration::from_secs(5) => {}
            Err(StoreError::Timeout(_)) => break false,
            Err(e) => panic!("call {calls}: {e:?}"),
        }
    };
    let opened = proxy.accepted();
    println!(
        "{calls} calls in {}, the last answered: {answered}; {opened} connections opened",
        ms(started.elapsed())
    );
    assert!(answered, "no call answered in 5 s");
    assert!(opened < calls, "{opened} connections for {calls} calls");
}

/// A store shared by two runtimes: an opening started by a call on one of
/// them, which is then no longer driven (or is shut down), is replaced by
/// the calls of the other once its connect timeout has passed (at once when
/// its runtime is shut down), instead of keeping them waiting for good.
#[test]
fn an_opening_left_on_an_idle_or_shut_down_runtime_is_replaced() {
    let _turn = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(turn());
    let connect_timeout = Duration::from_secs(2);
    for shut_down in [false, true] {
        let (_server, proxy) = FaultProxy::with_new_server();
        // Two round trips or more to open, one per call: see
        // `a_connection_slower_to_open_than_a_call_opens_in_the_background`.
        proxy.set_latency(Duration::from_millis(100));
        let other = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        // Its tasks run only while it blocks on a future.
        let idle = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let redis = other.block_on(build(
            RedisStore::builder(proxy.redis_url())
                .pool_size(1)
                .call_timeout(Duration::from_millis(150))
                .connect_timeout(connect_timeout),
        ));
        let policy = policy("runtimes");
        let first = idle.block_on(redis.check(b"k", &policy, 1));
        assert!(matches!(first, Err(StoreError::Timeout(_))), "{first:?}");
        // Its opening, a task of `idle`, is under way, and goes no further.
        let idle = (!shut_down).then_some(idle);
        let started = Instant::now();
        let answered = other.block_on(async {
            loop {
                match redis.check(b"k", &policy, 1).await {
                    Ok(_) => return Some(started.elapsed()),
                    Err(StoreError::Timeout(_) | StoreError::Unavailable(_))
                        if started.elapsed() < 2 * connect_timeout + Duration::from_secs(1) => {}
                    Err(e) => {
                        println!("{e:?}");
                        return None;
                    }
                }
            }
        });
        drop(idle);
        println!("runtime shut down: {shut_down}, answered after {answered:?}");
        let answered = answered.expect("a call answered on the other runtime");
        if shut_down {
            assert!(answered < connect_timeout, "{answered:?}");
        }
    }
}

/// A Redis slower than the call timeout fails with `StoreError::Timeout`, as
/// `RedisStoreBuilder::call_timeout` documents, not `Backend(timed out)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_fails_with_store_error_timeout() {
    let _turn = turn().await;
    let (_server, proxy) = FaultProxy::with_new_server();
    let redis = redis_store(proxy.redis_url()).await;
    let policy = policy("slow");
    warm_up("Redis answers", || redis.check(b"k", &policy, 1)).await;
    proxy.set_latency(Duration::from_millis(300));
    for i in 0..10 {
        let result = redis.check(b"k", &policy, 1).await;
        assert!(
            matches!(result, Err(StoreError::Timeout(_))),
            "call {i}: {result:?}"
        );
    }
}

/// With a `FallbackStore`, a layer timeout shorter than the store's call
/// timeout drops the primary call before it fails: the breaker never counts
/// the failure, never opens, and the fallback never decides; every request
/// gets the layer's failure policy (here 503) instead of the local share.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_timeout_below_the_store_timeout_still_falls_back() {
    let _turn = turn().await;
    let (_server, proxy) = FaultProxy::with_new_server();
    let redis = redis_store(proxy.redis_url()).await;
    let store = with_fallback(redis);
    let breaker = Arc::clone(store.breaker());
    let policy = policy("layer-timeout");
    store.check(b"k", &policy, 1).await.unwrap();
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let service = RateLimitLayer::new(store.clone(), policy, |_: &Request<()>| {
        Some(Key::from("k"))
    })
    .on_failure(FailurePolicy::Closed)
    .timeout(CALL_TIMEOUT / 2)
    .layer(inner);
    proxy.set_mode(Mode::Stall);
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = service.clone().oneshot(Request::new(())).await.unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(breaker.state(), BreakerState::Open, "statuses {statuses:?}");
    assert!(store.fallback_decisions() > 0, "statuses {statuses:?}");
}
