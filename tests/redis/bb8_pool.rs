//! `RedisStore` on an application's own bb8 pool (feature `bb8`), against
//! real Redis servers: exact decisions with and without coalescing,
//! `check_all` all or nothing, permits released (by the caller, and by the
//! store when its reply timed out), and a stopped Redis as an outage that
//! the layer's failure policy answers. The ACL probe on the pool's
//! connections is in `redis_acl.rs`.

use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use ratelimit_core::redis::bb8_redis::RedisConnectionManager;
use ratelimit_core::redis::{RedisStore, bb8};
use ratelimit_core::{Check, Policy, Rate, Store, StoreError};
use ratelimit_tests::fault_proxy::FaultProxy;
use ratelimit_tests::fixtures::{answer, fixed_window, ok_service};
use ratelimit_tests::{
    CALL_TIMEOUT, DEFAULT_MAX_BATCH, NO_EDGE, RedisServer, admit_exactly_the_limit,
    assert_within_slack, decide_through_a_restart, named, permits_left,
};
use ratelimit_tower::{FailurePolicy, GlobalKey, RateLimitLayer};
use tower::Layer;

type Pool = bb8::Pool<RedisConnectionManager>;

/// A pool of at most `max_size` connections to `url`, opened lazily.
fn pool(url: &str, max_size: u32) -> Pool {
    let manager = RedisConnectionManager::new(url).expect("a valid Redis URL");
    bb8::Pool::builder()
        .max_size(max_size)
        .connection_timeout(CALL_TIMEOUT)
        .build_unchecked(manager)
}

async fn store_on(pool: &Pool, call_timeout: Duration, max_batch: usize) -> RedisStore {
    RedisStore::bb8_builder(pool.clone())
        .call_timeout(call_timeout)
        .max_batch(max_batch)
        .build()
        .await
        .expect("a store on a bb8 pool")
}

/// A Redis server and a pool of two connections to it, both open when it
/// returns: a call that then finds none idle is one that queued inside bb8.
async fn a_server_and_two_open_connections() -> (RedisServer, Pool) {
    let server = RedisServer::start();
    let manager = RedisConnectionManager::new(server.url()).expect("a valid Redis URL");
    let pool = bb8::Pool::builder()
        .max_size(2)
        .min_idle(Some(2))
        .connection_timeout(CALL_TIMEOUT)
        .build(manager)
        .await
        .expect("a pool of two connections");
    (server, pool)
}

/// `tasks` tasks at once each decide `per_task` keys of their own
/// (`{prefix}-{task}-{i}`) under `policy`, a limit none of them reaches:
/// every call is decided, none fails.
async fn every_call_decided(
    store: &RedisStore,
    policy: &Policy,
    prefix: &'static str,
    tasks: u64,
    per_task: u64,
) {
    let tasks: Vec<_> = (0..tasks)
        .map(|task| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..per_task {
                    let key = format!("{prefix}-{task}-{i}");
                    match store.check(key.as_bytes(), &policy, 1).await {
                        Ok(decision) => assert!(decision.is_allowed(), "{decision:?}"),
                        Err(error) => failed.push(error),
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for task in tasks {
        failed.extend(task.await.expect("a task that did not panic"));
    }
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// A pool of at most two connections that log in to `addr` with a wrong
/// password, opened lazily.
fn pool_with_a_wrong_password(addr: impl std::fmt::Display) -> Pool {
    let manager =
        RedisConnectionManager::new(format!("redis://:wrong@{addr}")).expect("a valid Redis URL");
    bb8::Pool::builder().max_size(2).build_unchecked(manager)
}

/// `error` refuses a call because the pool cannot log in: the mistake
/// itself, never an outage that a fail-open layer would let through.
fn assert_refused_for_the_password(error: &StoreError) {
    assert!(
        matches!(error, StoreError::Backend(_)) && !error.is_outage(),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("authentication failed"),
        "{error}"
    );
}

/// A fresh server, and a store on a pool of 2 of its connections.
async fn on_a_fresh_server() -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    let pool = pool(&server.url(), 2);
    let store = store_on(&pool, CALL_TIMEOUT, DEFAULT_MAX_BATCH).await;
    (server, store)
}

/// 64 tasks over a pool of 8 hammer one key: exactly the limit passes for
/// every algorithm, coalesced (the default) and one call per decision, and
/// every call went through the application's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_admit_exactly_the_limit_through_the_pool() {
    let server = RedisServer::start();
    let pool = pool(&server.url(), 8);
    let coalesced = store_on(&pool, CALL_TIMEOUT, DEFAULT_MAX_BATCH).await;
    admit_exactly_the_limit(&coalesced, "coalesced").await;
    let taken = pool.state().statistics.get_started;
    assert!(taken > 0, "the store took no connection from the pool");

    let single = store_on(&pool, CALL_TIMEOUT, 1).await;
    admit_exactly_the_limit(&single, "single").await;
    assert_eq!(single.coalescing().requests, 0);
    // One decision at least per admitted request (7 policies x 100).
    let after = pool.state().statistics.get_started;
    assert!(after - taken >= 700, "{} checkouts", after - taken);
    assert!(pool.state().connections <= 8);
}

/// More calls than the pool has connections, one call per decision: the
/// store's calls take turns in a fair queue of its own, so none waits
/// inside bb8 (whose `get` hands a returned connection to whichever caller
/// polls first, which left a few calls waiting past the call timeout while
/// the rest went through), and every one is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_pools_size_take_turns_and_none_waits_inside_bb8() {
    const TASKS: u64 = 64;
    const PER_TASK: u64 = 40;
    let (_server, pool) = a_server_and_two_open_connections().await;
    let store = store_on(&pool, CALL_TIMEOUT, 1).await;
    let policy = fixed_window("turns", 1_000_000, NO_EDGE);
    let before = pool.state().statistics;
    every_call_decided(&store, &policy, "turns", TASKS, PER_TASK).await;
    let after = pool.state().statistics;
    assert!(
        after.get_started - before.get_started >= TASKS * PER_TASK,
        "{} checkouts",
        after.get_started - before.get_started
    );
    assert_eq!(
        after.get_waited - before.get_waited,
        0,
        "calls queued inside bb8 ({} of {})",
        after.get_waited - before.get_waited,
        after.get_started - before.get_started
    );
}

/// A pool of one connection: callers dropped while they wait for their
/// turn, and the one dropped while its command is in flight, give their
/// turns back. The calls after are all decided (a turn lost would leave
/// none, and every call would time out), and none waits inside bb8 (a turn
/// given back twice would let two calls at the one connection at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_at_a_pool_of_one_give_their_turns_back() {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 10;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let pool = pool(&proxy.redis_url(), 1);
    let store = store_on(&pool, CALL_TIMEOUT, 1).await;
    let policy = fixed_window("dropped", 1_000_000, NO_EDGE);
    // Connects and probes, so the calls below only take turns.
    store.check(b"warm", &policy, 1).await.unwrap();

    proxy.set_latency(Duration::from_millis(400));
    let call = |key: String| {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.check(key.as_bytes(), &policy, 1).await })
    };
    let holder = call("holder".into());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiters: Vec<_> = (0..8).map(|i| call(format!("waiter-{i}"))).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for waiter in &waiters {
        waiter.abort();
    }
    holder.abort();
    for task in waiters.into_iter().chain([holder]) {
        let ended = task.await;
        assert!(ended.as_ref().is_err_and(|e| e.is_cancelled()), "{ended:?}");
    }
    proxy.set_latency(Duration::ZERO);

    let before = pool.state().statistics;
    every_call_decided(&store, &policy, "after", TASKS, PER_TASK).await;
    let after = pool.state().statistics;
    assert!(after.get_started - before.get_started >= TASKS * PER_TASK);
    assert_eq!(
        after.get_waited - before.get_waited,
        0,
        "calls queued inside bb8"
    );
}

#[tokio::test]
async fn several_limits_through_the_pool_are_all_or_nothing() {
    let (_server, store) = on_a_fresh_server().await;
    let per_key = fixed_window("per-key", 3, NO_EDGE);
    let global = named("global", Policy::gcra(2, Rate::per_hour(1)));
    let checks = [Check::new(b"a", &per_key, 1), Check::new(b"g", &global, 1)];
    for (round, allowed, per_key_left) in [(0, true, 2), (1, true, 1), (2, false, 1)] {
        let decisions = store.check_all(&checks).await.unwrap();
        assert_eq!(
            decisions.iter().all(|d| d.is_allowed()),
            allowed,
            "round {round}: {decisions:?}"
        );
        assert_eq!(decisions[0].remaining(), per_key_left, "round {round}");
    }
}

#[tokio::test]
async fn a_permit_is_released_through_the_pool() {
    let (_server, store) = on_a_fresh_server().await;
    let policy = Policy::concurrency(2, Duration::from_secs(3600)).unwrap();
    let held = [(); 3].map(|()| store.check(b"job", &policy, 1));
    let mut decisions = Vec::new();
    for check in held {
        decisions.push(check.await.unwrap());
    }
    let allowed: Vec<bool> = decisions.iter().map(|d| d.is_allowed()).collect();
    assert_eq!(allowed, [true, true, false]);
    let permit = decisions[0]
        .permit()
        .expect("an admitted check holds a permit");
    store.release(b"job", &policy, permit).await.unwrap();
    let again = store.check(b"job", &policy, 1).await.unwrap();
    assert!(
        again.is_allowed() && again.permit() != Some(permit),
        "{again:?}"
    );
}

/// A check whose reply comes after its timeout took its permit in Redis:
/// the store releases it, on the pooled connection the check was sent on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_reply_timed_out_is_released_through_the_pool() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = store_on(
        &pool(&proxy.redis_url(), 1),
        Duration::from_millis(100),
        DEFAULT_MAX_BATCH,
    )
    .await;
    let policy = Policy::concurrency(5, Duration::from_secs(3600)).unwrap();
    let key = store.state_key(b"slow", &policy);
    // Connects, probes and loads the function, so the check below is one
    // call. Each step has the 100 ms of a call, which a loaded machine can
    // miss: again, a few times (a check of cost 0 takes no permit).
    let mut warm = store.check(b"slow", &policy, 0).await;
    for _ in 0..10 {
        if warm.is_ok() {
            break;
        }
        warm = store.check(b"slow", &policy, 0).await;
    }
    warm.unwrap();
    proxy.set_latency(Duration::from_millis(400));
    let sent = Instant::now();
    let result = store.check(b"slow", &policy, 1).await;
    assert!(matches!(result, Err(StoreError::Timeout(_))), "{result:?}");
    proxy.set_latency(Duration::ZERO);
    // The lease is an hour: only a release frees the permit this soon.
    assert_eq!(
        permits_left(&server, &key, Duration::from_secs(3)).await,
        "0"
    );
    // The proxy delivers what it held (the fresh connection that replaced
    // the stalled one may have answered meanwhile, 400 ms late).
    tokio::time::sleep_until((sent + Duration::from_millis(500)).into()).await;
    let peek = store.check(b"slow", &policy, 0).await.unwrap();
    assert_eq!(peek.remaining(), 5, "{peek:?}");
}

/// Redis restarts: the pooled connection dies with it, and is replaced in the
/// pool by the store, even with bb8's test on checkout off (with which bb8
/// itself would hand out the dead connection for ever).
#[tokio::test]
async fn a_dead_pooled_connection_is_replaced_without_failed_requests() {
    let mut server = RedisServer::start();
    let manager = RedisConnectionManager::new(server.url()).unwrap();
    let pool = bb8::Pool::builder()
        .max_size(1)
        .test_on_check_out(false)
        .build_unchecked(manager);
    let store = store_on(&pool, Duration::from_secs(2), DEFAULT_MAX_BATCH).await;
    decide_through_a_restart(&store, &mut server).await;
}

/// Redis stops: the pool gives no connection, each call fails as an outage
/// within the call timeout, and the layer answers by its failure policy.
#[tokio::test]
async fn a_stopped_redis_is_an_outage_that_the_failure_policy_answers() {
    let mut server = RedisServer::start();
    let call_timeout = Duration::from_millis(300);
    let store = store_on(&pool(&server.url(), 2), call_timeout, DEFAULT_MAX_BATCH).await;
    let policy = Policy::gcra(10, Rate::per_second(1)).unwrap();
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    server.stop();

    let started = Instant::now();
    let error = store.check(b"k", &policy, 1).await.unwrap_err();
    assert!(error.is_outage(), "{error:?}");
    // Within the call timeout (a real socket: plus a loaded machine's
    // slack), not bb8's 30 s wait for a connection.
    assert_within_slack(started, call_timeout);

    for (failure, status, counted) in [
        (FailurePolicy::Open, StatusCode::OK, (1, 0)),
        (
            FailurePolicy::Closed,
            StatusCode::SERVICE_UNAVAILABLE,
            (0, 1),
        ),
    ] {
        let layer = RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
            .on_failure(failure.clone());
        let response = answer(layer.layer(ok_service()), Request::new(String::new())).await;
        assert_eq!(response.status, status, "{failure:?}: {}", response.body);
        let stats = layer.stats();
        assert_eq!(
            (stats.failed_open(), stats.failed_closed()),
            counted,
            "{failure:?}"
        );
    }
}

/// Redis freezes (it keeps its sockets, answers nothing) under more calls
/// than the pool has connections: every call fails as an outage within
/// the call timeout, also those that waited for a turn behind calls whose
/// stalled connections are being replaced. Thawed, calls are decided
/// again, and every turn came back: calls at once all succeed, none waits
/// inside bb8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_an_outage_and_every_turn_comes_back_after() {
    const CALLS: usize = 8;
    let server = RedisServer::start();
    let call_timeout = Duration::from_millis(300);
    let pool = pool(&server.url(), 2);
    let store = store_on(&pool, call_timeout, 1).await;
    let policy = fixed_window("frozen", 1_000_000, NO_EDGE);
    let at_once = |round: &'static str| {
        (0..CALLS)
            .map(|i| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(async move {
                    let key = format!("{round}-{i}");
                    store.check(key.as_bytes(), &policy, 1).await
                })
            })
            .collect::<Vec<_>>()
    };
    // Both connections open and probed.
    for call in at_once("warm") {
        assert!(call.await.unwrap().unwrap().is_allowed());
    }

    server.freeze();
    let started = Instant::now();
    for call in at_once("frozen") {
        let error = call
            .await
            .expect("a call that did not panic")
            .expect_err("Redis answers nothing");
        assert!(error.is_outage(), "{error:?}");
    }
    assert_within_slack(started, call_timeout);
    server.thaw();

    let started = Instant::now();
    while let Err(e) = store.check(b"thawed", &policy, 1).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still failing 10 s after the thaw: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connections being replaced come back within bb8's
    // connection_timeout at most.
    let started = Instant::now();
    while pool.state().idle_connections < 2 {
        assert!(
            started.elapsed() < CALL_TIMEOUT + Duration::from_secs(5),
            "{:?}",
            pool.state()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = pool.state().statistics;
    for call in at_once("after") {
        assert!(call.await.unwrap().unwrap().is_allowed());
    }
    let after = pool.state().statistics;
    assert_eq!(
        after.get_waited - before.get_waited,
        0,
        "calls queued inside bb8"
    );
}

/// A pool whose manager logs in with a wrong password gives no error, only
/// no connection, until bb8's `connection_timeout` (30 s by default): the
/// store learns why by opening one itself, and refuses every call with
/// that mistake, never an outage a fail-open layer would let through. Once
/// the password is right, calls are decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_cannot_log_in_is_refused_never_failed_open() {
    let server = RedisServer::start_with_args(&["--requirepass", "secret"]);
    let pool = pool_with_a_wrong_password(server.addr());
    // Refused well before it: a refusal is not a wait for the timeout, on
    // however loaded a machine.
    let call_timeout = Duration::from_secs(5);
    let store = store_on(&pool, call_timeout, DEFAULT_MAX_BATCH).await;
    let policy = Policy::gcra(10, Rate::per_second(1)).unwrap();

    for _ in 0..5 {
        let started = Instant::now();
        let error = store.check(b"k", &policy, 1).await.unwrap_err();
        assert_refused_for_the_password(&error);
        assert!(
            started.elapsed() < call_timeout,
            "took {:?}",
            started.elapsed()
        );
    }
    let layer = RateLimitLayer::new(store.clone(), policy.clone(), GlobalKey::default())
        .on_failure(FailurePolicy::Open);
    let response = answer(layer.layer(ok_service()), Request::new(String::new())).await;
    assert_eq!(
        response.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        response.body
    );
    assert_eq!(layer.stats().failed_open(), 0);

    let fixed = server.cli(&["--pass", "secret", "CONFIG", "SET", "requirepass", "wrong"]);
    assert_eq!(fixed, "OK");
    let started = Instant::now();
    loop {
        match store.check(b"k", &policy, 1).await {
            Ok(decision) => break assert!(decision.is_allowed()),
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "still refused 10 s after the password was fixed: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls that come at once to a pool whose manager cannot log in, one
/// call per decision and coalesced: every one is refused with the mistake,
/// none waits for the connection that never comes and fails as an outage
/// (which a fail-open layer would let through), also those that came while
/// the store was still learning why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_at_once_to_a_pool_that_cannot_log_in_are_all_refused() {
    const CALLS: usize = 8;
    for max_batch in [1, DEFAULT_MAX_BATCH] {
        // A fresh server and pool each: the store keeps the mistake it
        // learned for a few seconds, and would not learn it again.
        let server = RedisServer::start_with_args(&["--requirepass", "secret"]);
        let pool = pool_with_a_wrong_password(server.addr());
        let store = store_on(&pool, Duration::from_secs(5), max_batch).await;
        let policy = Policy::gcra(10, Rate::per_second(1)).unwrap();
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(
                    async move { store.check(format!("k{i}").as_bytes(), &policy, 1).await },
                )
            })
            .collect();
        let mut outages = Vec::new();
        for call in calls {
            let error = call
                .await
                .expect("a call that did not panic")
                .expect_err("no connection can log in");
            if error.is_outage() {
                outages.push(error);
            } else {
                assert_refused_for_the_password(&error);
            }
        }
        assert!(
            outages.is_empty(),
            "max_batch {max_batch}: {} of {CALLS} calls failed as outages: {:?}",
            outages.len(),
            outages.first()
        );
    }
}

/// The call that opens a connection to learn why the pool opens none is
/// dropped before it learns (its client went away): a call that was
/// waiting for what it would find learns it itself, and is refused with
/// the mistake, not left waiting for a connection that never comes until
/// its call timeout (an outage a fail-open layer would let through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_on_a_learner_that_is_dropped_learns_itself() {
    let server = RedisServer::start_with_args(&["--requirepass", "secret"]);
    // Slow replies, so the first call is still learning when it is dropped.
    let proxy = FaultProxy::start(server.addr());
    proxy.set_latency(Duration::from_millis(300));
    let pool = pool_with_a_wrong_password(proxy.addr());
    let call_timeout = Duration::from_secs(5);
    let store = store_on(&pool, call_timeout, 1).await;
    let policy = Policy::gcra(10, Rate::per_second(1)).unwrap();
    let call = |key: &'static str| {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.check(key.as_bytes(), &policy, 1).await })
    };
    let learner = call("learner");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiter = call("waiter");
    tokio::time::sleep(Duration::from_millis(50)).await;
    learner.abort();
    let started = Instant::now();
    let error = waiter
        .await
        .expect("a call that did not panic")
        .expect_err("no connection can log in");
    assert_refused_for_the_password(&error);
    assert!(
        started.elapsed() < call_timeout,
        "took {:?}",
        started.elapsed()
    );
}

/// The application holds one of the pool's two connections the whole
/// time (its turns count on the pool's `max_size`, so the store's calls
/// may wait inside bb8 for the other): every call of the store is still
/// decided, and the application's connection stays its own and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_holding_a_pooled_connection_leaves_every_call_decided() {
    const TASKS: u64 = 16;
    const PER_TASK: u64 = 100;
    let (_server, pool) = a_server_and_two_open_connections().await;
    let mut held = pool
        .get_owned()
        .await
        .expect("the application's connection");
    let store = store_on(&pool, CALL_TIMEOUT, 1).await;
    let policy = fixed_window("shared", 1_000_000, NO_EDGE);
    let before = pool.state().statistics;
    every_call_decided(&store, &policy, "shared", TASKS, PER_TASK).await;
    let after = pool.state().statistics;
    assert!(after.get_started - before.get_started >= TASKS * PER_TASK);
    let pong: String = redis::cmd("PING")
        .query_async(&mut *held)
        .await
        .expect("the application's connection works");
    assert_eq!(pong, "PONG");
    assert_eq!(pool.state().connections, 2);
}
