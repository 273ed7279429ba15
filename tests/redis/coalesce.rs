//! Coalescing in `RedisStore`: concurrent decisions gathered into one call
//! of the batch function, on a real Redis (and a real Redis Cluster). Each
//! decision keeps its own outcome, exactly as if decided alone in the order
//! Redis applied them; failures are each decision's own.

use std::time::{Duration, Instant};

use crate::shared::SlotMove;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::{CoalescingStats, RedisStore, function_library};
use ratelimit_core::{Check, Decision, Policy, Rate, Store, StoreError};
use ratelimit_tests::cluster_slot;
use ratelimit_tests::fault_proxy::{FaultProxy, Mode};
use ratelimit_tests::fixtures::{Rng, fixed_window};
use ratelimit_tests::{
    Boxed, NO_EDGE, NOW_MICROS, RedisCluster, RedisServer, SLACK, assert_within_slack, build,
    cluster_store, join_in_order, named, observable, permits_left, pooled, small_store,
    twin_stores, twins_at, warm_up,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The shared small policies of every algorithm, each under its own name.
fn batch_policies() -> Vec<Policy> {
    ratelimit_tests::small_policies()
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.with_name(format!("batch-{i}")).unwrap())
        .collect()
}

/// One request of a timeline: a single check, or two limits at once.
enum Op {
    One(String, usize, u64),
    Two(String, usize, u64, String, usize, u64),
}

fn ops(rng: &mut Rng, n: usize, policies: &[Policy]) -> Vec<Op> {
    (0..n)
        .map(|_| {
            let user = format!("u{}", rng.below(3));
            let a = rng.index(policies.len());
            let cost = rng.below(policies[a].max_cost() + 1);
            if rng.below(4) == 0 {
                let b = (a + 1 + rng.index(policies.len() - 1)) % policies.len();
                Op::Two(user, a, cost, "global".to_owned(), b, rng.below(3))
            } else {
                Op::One(user, a, cost)
            }
        })
        .collect()
}

fn run<S: Store>(
    store: &S,
    op: &Op,
    policies: &[Policy],
) -> Boxed<Result<Vec<Decision>, StoreError>>
where
    S::CheckFuture: Send + 'static,
    S::CheckAllFuture: Send + 'static,
{
    match op {
        Op::One(user, a, cost) => {
            let call = store.check(user.as_bytes(), &policies[*a], *cost);
            Box::pin(async move { call.await.map(|d| vec![d]) })
        }
        Op::Two(user, a, ca, other, b, cb) => {
            let checks = [
                Check::new(user.as_bytes(), &policies[*a], *ca),
                Check::new(other.as_bytes(), &policies[*b], *cb),
            ];
            Box::pin(store.check_all(&checks))
        }
    }
}

/// Sixty requests at once, every algorithm, single and multi-limit checks
/// mixed, on one connection: the first goes out alone, the others wait for
/// it and go as one batch, in their order of arrival (more than a batch
/// waiting would start a second call, whose order against the first is
/// Redis's). Each gets exactly what the in-memory reference gives it
/// deciding the same requests one by one in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_decide_as_the_reference_one_by_one_in_order() {
    let server = RedisServer::start();
    replay_in_order(&server, 30).await;
}

/// The same through the batch script (`EVALSHA`), on a Redis where `FCALL`
/// cannot be used (renamed away, as on Redis 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_as_a_script_where_functions_cannot_be_used() {
    let server = RedisServer::start_with_args(&["--rename-command", "FCALL", ""]);
    replay_in_order(&server, 10).await;
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
    assert!(!stats.contains("cmdstat_fcall:"), "{stats}");
}

/// `rounds` rounds of sixty requests on `server` (see above), checked
/// against the reference.
async fn replay_in_order(server: &RedisServer, rounds: u64) {
    // 10 ms more per round trip: the others surely queue behind the first.
    let proxy = FaultProxy::start(server.addr());
    proxy.set_latency(ms(10));
    let clock = ManualClock::new(1_763_000_000_000_001);
    // Room for all sixty in one batch whatever their weights (a sliding log
    // weighs 8, a semaphore of 3 weighs 4): a second call would start
    // otherwise, and its order against the first is Redis's.
    let builder = RedisStore::builder(proxy.redis_url())
        .pool_size(1)
        .max_batch(1000);
    let (memory, redis) = twin_stores(builder, &clock).await;
    let policies = batch_policies();
    let mut rng = Rng(7);
    for round in 0..rounds {
        clock.advance(Duration::from_micros(rng.below(40_000)));
        let ops = ops(&mut rng, 60, &policies);
        let calls = ops.iter().map(|op| run(&redis, op, &policies)).collect();
        let got = join_in_order(calls).await;
        for (i, (op, got)) in ops.iter().zip(got).enumerate() {
            let want = run(&memory, op, &policies).await;
            let want: Vec<_> = want.unwrap().iter().map(observable).collect();
            let got: Vec<_> = got.unwrap().iter().map(observable).collect();
            assert_eq!(want, got, "round {round}, request {i}");
        }
    }
    let stats = redis.coalescing();
    assert_eq!(stats.requests, rounds * 60, "{stats:?}");
    assert!(stats.mean_batch() > 20.0, "{stats:?}");
}

/// Many tasks on a multi-threaded runtime hammer a few keys over four
/// connections. Admitted per key never exceeds the limit, and the decisions
/// replay exactly through the reference model in the order Redis applied
/// them: at one fixed time a state only goes down, and each decision shows
/// the state it met (remaining before = remaining, plus the cost if
/// admitted), which orders them; denials at one state change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_on_a_few_keys_never_pass_the_limit_and_replay_exactly() {
    let (_server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    let policies = [
        named("hot-tb", Policy::token_bucket(40, Rate::new(10, ms(100)))),
        fixed_window("hot-fw", 30, ms(100)),
    ];
    let keys = ["a", "b", "c"];
    let mut rng = Rng(11);
    for round in 0..6 {
        clock.advance(ms(25 + rng.below(100)));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let plan: Vec<(usize, usize, u64)> = (0..8)
                .map(|_| (rng.index(keys.len()), rng.index(2), 1 + rng.below(3)))
                .collect();
            let redis = redis.clone();
            let policies = policies.clone();
            tasks.spawn(async move {
                let mut seen = Vec::new();
                for (k, p, cost) in plan {
                    let d = redis
                        .check(keys[k].as_bytes(), &policies[p], cost)
                        .await
                        .unwrap();
                    seen.push((k, p, cost, d));
                }
                seen
            });
        }
        let mut seen = Vec::new();
        while let Some(task) = tasks.join_next().await {
            seen.extend(task.unwrap());
        }
        for (k, key) in keys.iter().enumerate() {
            for (p, policy) in policies.iter().enumerate() {
                let mut mine: Vec<&(usize, usize, u64, Decision)> =
                    seen.iter().filter(|s| s.0 == k && s.1 == p).collect();
                let admitted: u64 = mine.iter().filter(|s| s.3.is_allowed()).map(|s| s.2).sum();
                if round == 0 {
                    // A fresh key: nothing refilled yet.
                    assert!(admitted <= policy.limit(), "{key} {policy:?}: {admitted}");
                }
                let before = |s: &(usize, usize, u64, Decision)| {
                    s.3.remaining() + if s.3.is_allowed() { s.2 } else { 0 }
                };
                // At one state, denials (which change nothing) before the admission.
                mine.sort_by_key(|s| (std::cmp::Reverse(before(s)), s.3.is_allowed()));
                for s in mine {
                    let want = memory.check(key.as_bytes(), policy, s.2).await.unwrap();
                    assert_eq!(
                        observable(&want),
                        observable(&s.3),
                        "round {round}, key {key}, policy {}",
                        policy.name()
                    );
                }
            }
        }
    }
    let stats = redis.coalescing();
    assert!(stats.mean_batch() > 1.5, "{stats:?}");
}

/// One request of a batch that meets another algorithm's state fails with a
/// policy conflict; the others in the same batch are decided as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_fails_its_own_request_only() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    // A window's state lasts until its edge, and windows are aligned on the
    // clock: a minute's edge may fall between the first check and the
    // batch, which then meets no state to conflict with. A thousand days'
    // edge is years away.
    let window = fixed_window("shared", 10, Duration::from_secs(1_000 * 24 * 3_600));
    let bucket = named("shared", Policy::token_bucket(10, Rate::per_second(1)));
    store.check(b"k", &window, 1).await.unwrap();
    let before = store.coalescing();
    // The lead call holds the connection: the four behind it go as one
    // batch (half a second, so a loaded machine polls them all meanwhile).
    proxy.set_latency(ms(500));
    let (lead, _) = behind_a_call(&store, &window, 0, ms(50)).await;
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = vec![
        Box::pin(store.check(b"x", &window, 1)),
        Box::pin(store.check(b"k", &bucket, 1)),
        Box::pin(store.check(b"y", &window, 1)),
        Box::pin(store.check(b"k", &window, 1)),
    ];
    let got = join_in_order(calls).await;
    lead.await.unwrap().unwrap();
    assert!(
        matches!(&got[1], Err(StoreError::PolicyConflict { policy }) if policy == "shared"),
        "{:?}",
        got[1]
    );
    for i in [0, 2] {
        let d = got[i].as_ref().unwrap();
        assert!(d.is_allowed() && d.remaining() == 9, "{i}: {d:?}");
    }
    let d = got[3].as_ref().unwrap();
    assert!(d.is_allowed() && d.remaining() == 8, "{d:?}");
    calls_since(&store, before, 2, 5);
}

/// `max_batch(1)`: no coalescing, every request its own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_batch_one_turns_coalescing_off() {
    let server = RedisServer::start();
    let store = pooled(RedisStore::builder(server.url()).max_batch(1), 1).await;
    let policy = Policy::fixed_window(100, NO_EDGE).unwrap();
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..20)
        .map(|_| Box::pin(store.check(b"k", &policy, 1)) as Boxed<_>)
        .collect();
    let got = join_in_order(calls).await;
    assert!(got.iter().all(|d| d.as_ref().unwrap().is_allowed()));
    assert_eq!(store.coalescing().calls, 0);
    let d = store.check(b"k", &policy, 0).await.unwrap();
    assert_eq!(d.remaining(), 80, "{d:?}");
}

/// A store on one connection through `proxy`, its library loaded.
async fn through(proxy: &FaultProxy, call_timeout: Duration) -> RedisStore {
    through_with(proxy, call_timeout, ratelimit_tests::DEFAULT_MAX_BATCH).await
}

/// [`through`] with batches of up to `max_batch` units.
async fn through_with(proxy: &FaultProxy, call_timeout: Duration, max_batch: usize) -> RedisStore {
    let store = small_store(proxy.redis_url(), 1, max_batch, call_timeout).await;
    let warm = fixed_window("warm", 1000, NO_EDGE);
    // One call alone, then a batch: both functions are loaded.
    warm_up("warming up", || {
        let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..4)
            .map(|_| Box::pin(store.check(b"warm", &warm, 1)) as Boxed<_>)
            .collect();
        async {
            join_in_order(calls)
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        }
    })
    .await;
    store
}

/// `n` checks of distinct keys under `policy`, queued while `lead` is in
/// flight (started `after` before them), so they go as one batch.
async fn behind_a_call(
    store: &RedisStore,
    policy: &Policy,
    n: usize,
    after: Duration,
) -> (
    tokio::task::JoinHandle<Result<Decision, StoreError>>,
    Vec<Boxed<Result<Decision, StoreError>>>,
) {
    let lead = {
        let store = store.clone();
        let policy = policy.clone();
        tokio::spawn(async move { store.check(b"lead", &policy, 1).await })
    };
    tokio::time::sleep(after).await;
    let calls = (0..n)
        .map(|i| Box::pin(store.check(format!("k{i}").as_bytes(), policy, 1)) as Boxed<_>)
        .collect();
    (lead, calls)
}

/// Asserts that `store` sent `calls` calls deciding `requests` requests
/// since its counters were `before`; returns its counters now.
fn calls_since(
    store: &RedisStore,
    before: CoalescingStats,
    calls: u64,
    requests: u64,
) -> CoalescingStats {
    let after = store.coalescing();
    assert_eq!(after.calls - before.calls, calls, "{after:?}");
    assert_eq!(after.requests - before.requests, requests, "{after:?}");
    after
}

fn window() -> Policy {
    fixed_window("fw", 100, NO_EDGE)
}

/// A batch whose reply comes after the call timeout: a timeout, an outage,
/// for each of its decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_is_an_outage_for_each_decision() {
    let (_server, proxy, store) = one_connection(ms(300)).await;
    let before = store.coalescing();
    proxy.set_latency(ms(450));
    let (lead, calls) = behind_a_call(&store, &window(), 10, ms(150)).await;
    let got = join_in_order(calls).await;
    assert!(matches!(lead.await.unwrap(), Err(StoreError::Timeout(_))));
    for d in &got {
        assert!(matches!(d, Err(StoreError::Timeout(_))), "{d:?}");
    }
    calls_since(&store, before, 2, 11);
}

/// Requests that queue behind a call to a Redis that hangs: each is an
/// outage within its own call timeout, counted from when its caller asked,
/// never the call ahead's timeout and then its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_behind_a_hung_call_ends_within_its_call_timeout() {
    // Long enough that the call ahead's timeout and then its own (about
    // twice this) stands far above this and a loaded machine's slack.
    let call_timeout = ms(1000);
    let (_server, proxy, store) = one_connection(call_timeout).await;
    proxy.set_latency(Duration::from_secs(10));
    let (lead, calls) = behind_a_call(&store, &window(), 10, ms(50)).await;
    let timed: Vec<Boxed<(Result<Decision, StoreError>, Duration)>> = calls
        .into_iter()
        .map(|call| {
            let started = Instant::now();
            Box::pin(async move { (call.await, started.elapsed()) }) as Boxed<_>
        })
        .collect();
    for (d, took) in join_in_order(timed).await {
        assert!(matches!(d, Err(StoreError::Timeout(_))), "{d:?}");
        assert!(
            took <= call_timeout + SLACK / 2,
            "an outage after {took:?}, call timeout {call_timeout:?}"
        );
    }
    assert!(matches!(lead.await.unwrap(), Err(StoreError::Timeout(_))));
}

/// A batch whose connection drops (and every new one with it): each of its
/// decisions is an outage, `Unavailable`, for its failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_connection_drops_is_an_outage_for_each_decision() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(2)).await;
    proxy.set_latency(ms(300));
    let (lead, calls) = behind_a_call(&store, &window(), 10, ms(20)).await;
    let dropping = async {
        tokio::time::sleep(ms(100)).await;
        proxy.set_mode(Mode::Drop);
    };
    let (got, ()) = tokio::join!(join_in_order(calls), dropping);
    let lead = lead.await.unwrap();
    assert!(matches!(lead, Err(StoreError::Unavailable(_))), "{lead:?}");
    for d in &got {
        assert!(matches!(d, Err(StoreError::Unavailable(_))), "{d:?}");
    }
    // Redis comes back: the next batch is decided.
    proxy.set_mode(Mode::Forward);
    proxy.set_latency(Duration::ZERO);
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..5)
        .map(|_| Box::pin(store.check(b"again", &window(), 1)) as Boxed<_>)
        .collect();
    for d in join_in_order(calls).await {
        assert!(d.unwrap().is_allowed());
    }
}

/// `FUNCTION FLUSH` while a call is in flight: the batch behind it meets a
/// missing function, loads the library again and is retried once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_loaded_again_and_the_batch_retried() {
    let (server, proxy, store) = one_connection(Duration::from_secs(2)).await;
    let loads = |stats: &str| {
        stats
            .lines()
            .find(|l| l.starts_with("cmdstat_function|load:"))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let loaded = loads(&server.cli(&["INFO", "commandstats"]));
    assert!(loaded >= 1, "{loaded}");
    proxy.set_latency(ms(300));
    let (lead, calls) = behind_a_call(&store, &window(), 10, ms(20)).await;
    let flush = async {
        tokio::time::sleep(ms(100)).await;
        // Straight to Redis: the lead call already ran, its reply is held.
        assert_eq!(server.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
        proxy.set_latency(Duration::ZERO);
    };
    let (got, ()) = tokio::join!(join_in_order(calls), flush);
    assert!(lead.await.unwrap().unwrap().is_allowed());
    for d in &got {
        let d = d.as_ref().unwrap();
        assert!(d.is_allowed() && d.remaining() == 99, "{d:?}");
    }
    assert_eq!(loads(&server.cli(&["INFO", "commandstats"])), loaded + 1);
    assert!(server.cli(&["FUNCTION", "LIST"]).contains("ratelimit_"));
}

/// Callers that go away: before their batch is sent, they are left out of
/// it; after, their results are dropped and the permits they received are
/// released, so the semaphore never leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_gone_leave_their_batch_or_release_its_permits() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    // Room for ten semaphores of 20 (21 units each) in one batch.
    let store = through_with(&proxy, Duration::from_secs(5), 1000).await;
    let semaphore = named("sem", Policy::concurrency(20, Duration::from_secs(3600)));
    let lead_policy = window();
    let keys: Vec<String> = (0..10)
        .map(|i| store.state_key(format!("k{i}").as_bytes(), &semaphore))
        .collect();

    // Gone before the send: the lead call holds the connection for 400 ms.
    proxy.set_latency(ms(400));
    let before = store.coalescing();
    let lead = {
        let store = store.clone();
        tokio::spawn(async move { store.check(b"lead", &lead_policy, 1).await })
    };
    tokio::time::sleep(ms(20)).await;
    let calls: Vec<Boxed<_>> = (0..10)
        .map(|i| Box::pin(store.check(format!("k{i}").as_bytes(), &semaphore, 1)) as Boxed<_>)
        .collect();
    let gone = tokio::time::timeout(ms(100), join_in_order(calls)).await;
    assert!(gone.is_err());
    lead.await.unwrap().unwrap();
    let after = store.coalescing();
    assert_eq!(after.requests - before.requests, 1, "{after:?}");
    for key in &keys {
        assert_eq!(server.cli(&["ZCARD", key]).trim(), "0", "{key}");
    }

    // Gone after the send: the batch goes at 400 ms, its reply at 800 ms.
    let before = store.coalescing();
    let (lead, calls) = behind_a_call(&store, &window(), 0, Duration::ZERO).await;
    tokio::time::sleep(ms(20)).await;
    let calls: Vec<Boxed<_>> =
        calls
            .into_iter()
            .chain((0..10).map(|i| {
                Box::pin(store.check(format!("k{i}").as_bytes(), &semaphore, 1)) as Boxed<_>
            }))
            .collect();
    let gone = tokio::time::timeout(ms(600), join_in_order(calls)).await;
    assert!(gone.is_err());
    lead.await.unwrap().unwrap();
    calls_since(&store, before, 2, 11);
    proxy.set_latency(Duration::ZERO);
    for key in &keys {
        assert_eq!(
            permits_left(&server, key, Duration::from_secs(3)).await,
            "0",
            "{key}"
        );
    }
}

/// A Redis Cluster: batches form on one slot (a hot key; one user's limits
/// under one hash tag), and stay exact there: 64 tasks over one hot key
/// admit exactly the limit, and one user's two limits stay all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_batches_form_on_one_slot_and_stay_exact() {
    let cluster = RedisCluster::start();
    let store = pooled(RedisStore::cluster_builder(cluster.urls()), 1).await;
    let policy = fixed_window("hot", 100, NO_EDGE);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, policy) = (store.clone(), policy.clone());
        tasks.spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..5 {
                if store.check(b"hot", &policy, 1).await.unwrap().is_allowed() {
                    admitted += 1;
                }
            }
            admitted
        });
    }
    let mut admitted = 0;
    while let Some(task) = tasks.join_next().await {
        admitted += task.unwrap();
    }
    assert_eq!(admitted, 100);
    let stats = store.coalescing();
    assert_eq!(stats.requests, 320, "{stats:?}");
    assert!(stats.mean_batch() > 1.5, "{stats:?}");

    // Per minute and per hour of one user: one slot, all or nothing, in
    // batches with other users' requests.
    let minute = fixed_window("per-minute", 3, NO_EDGE);
    let hour = fixed_window("per-hour", 5, NO_EDGE);
    let calls: Vec<Boxed<Result<Vec<Decision>, StoreError>>> = (0..8)
        .map(|i| {
            let user = if i % 2 == 0 { "alice" } else { "bob" };
            let checks = [
                Check::new(user.as_bytes(), &minute, 1),
                Check::new(user.as_bytes(), &hour, 1),
            ];
            Box::pin(store.check_all(&checks)) as Boxed<_>
        })
        .collect();
    let got = join_in_order(calls).await;
    for (i, d) in got.iter().enumerate() {
        let d = d.as_ref().unwrap();
        // The first three of each user pass both limits; the fourth is
        // denied by the minute and consumes nothing from the hour (whose
        // entry is a peek).
        let passed = all_allowed(d);
        assert_eq!(passed, i < 6, "{i}: {d:?}");
        assert_eq!(
            d[1].remaining(),
            if i < 6 { 4 - (i as u64 / 2) } else { 2 },
            "{i}: {d:?}"
        );
    }
    let hour_left = store.check(b"alice", &hour, 0).await.unwrap();
    assert_eq!(hour_left.remaining(), 2, "{hour_left:?}");
}

/// Requests on many keys, in many slots, from 64 tasks at once: each key
/// admits exactly its limit. A call declares every key it touches, and
/// Redis refuses keys of several slots in one call, so a batch is a
/// pipeline to one master, a call per slot: batches form however few
/// requests each slot has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_requests_of_many_slots_go_in_pipelines_and_stay_exact() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    // 1,600 requests, 8 per key.
    each_of_200_keys_admits_5(&store, "spread").await;
    let stats = store.coalescing();
    assert_eq!(stats.requests, 1600, "{stats:?}");
    assert!(stats.mean_batch() > 1.5, "{stats:?}");
}

/// The same on a cluster whose user may not run `FCALL`: every call by
/// script; each key admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_without_functions_pipelines_go_by_script_and_stay_exact() {
    let cluster = RedisCluster::start();
    for node in 0..3 {
        let reply = cluster.cli(node, &["ACL", "SETUSER", "default", "-fcall"]);
        assert_eq!(reply.trim(), "OK");
    }
    let store = cluster_store(&cluster).await;
    each_of_200_keys_admits_5(&store, "scripted").await;
    let evalsha: u64 = (0..3)
        .map(|node| {
            let stats = cluster.cli(node, &["INFO", "commandstats"]);
            stats
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|l| l.split(',').next())
                .map_or(0, |n| n.parse().unwrap())
        })
        .sum();
    assert!(evalsha >= 1000, "{evalsha} calls by script");
}

/// A pipeline's call on a master that no longer serves its slot (the slot
/// was given to another master after the cluster client read the slot
/// map): Redis answers that call `MOVED` before running anything, and runs
/// the pipeline's other calls; the store sends each request of the
/// redirected call again on its own, to the master Redis names. Every
/// request is answered, and each key,
/// wherever it lives, admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_meets_a_moved_slot_sends_its_requests_again() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let policy = fixed_window("moved", 10, NO_EDGE);
    let slot_of = |key: &str| cluster_slot(store.state_key(key.as_bytes(), &policy).as_bytes());
    // Twelve keys of one master; the first one's slot moves.
    let source = cluster.master_of(slot_of("user-0"));
    let of_source: Vec<String> = (0..400)
        .map(|i| format!("user-{i}"))
        .filter(|k| cluster.master_of(slot_of(k)) == source)
        .take(12)
        .collect();
    assert_eq!(of_source.len(), 12);
    let moved = slot_of(&of_source[0]);
    // The slot holds no key yet: it moves at once, unknown to the store,
    // whose slot map still places it on the source.
    let slot_move = SlotMove::of(&cluster, moved);
    let target = slot_move.target;
    slot_move.give_empty();
    assert_eq!(cluster.master_of(moved), target);

    // 64 tasks at once, every other request on the moved key: its calls in
    // the source's pipelines meet `MOVED` (until the cluster client has read
    // the slot map again), the others' do not.
    let admitted = admitted_per_key(&store, &policy, &of_source, 6, |task, j| {
        if (task + j) % 2 == 0 {
            0
        } else {
            1 + (task * 6 + j) % 11
        }
    })
    .await;
    // 192 requests on the moved key, 192 over the 11 others (17 or 18 each).
    assert!(admitted.iter().all(|&n| n == 10), "{admitted:?}");
    let state = store.state_key(of_source[0].as_bytes(), &policy);
    assert_eq!(cluster.cli(target, &["EXISTS", &state]).trim(), "1");
    assert!(
        store.coalescing().mean_batch() > 1.5,
        "{:?}",
        store.coalescing()
    );
}

/// 64 tasks at once, each making `per_task` checks of cost 1, its `j`th on
/// `keys[pick(task, j)]`, each expecting a decision: how many each key
/// admitted.
/// 200 keys under a fixed window of 5 an hour (named `name`), each checked
/// 8 times from 64 tasks at once: each admits exactly 5.
async fn each_of_200_keys_admits_5(store: &RedisStore, name: &str) {
    let policy = fixed_window(name, 5, NO_EDGE);
    let keys: Vec<String> = (0..200).map(|k| format!("user-{k}")).collect();
    let admitted =
        admitted_per_key(store, &policy, &keys, 25, |task, j| (task * 25 + j) % 200).await;
    assert!(admitted.iter().all(|&n| n == 5), "{name}: {admitted:?}");
}

async fn admitted_per_key(
    store: &RedisStore,
    policy: &Policy,
    keys: &[String],
    per_task: usize,
    pick: fn(usize, usize) -> usize,
) -> Vec<u64> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..64 {
        let (store, policy, keys) = (store.clone(), policy.clone(), keys.to_vec());
        tasks.spawn(async move {
            let mut admitted = vec![0u64; keys.len()];
            for j in 0..per_task {
                let k = pick(task, j);
                let decision = store
                    .check(keys[k].as_bytes(), &policy, 1)
                    .await
                    .expect("a decision");
                admitted[k] += u64::from(decision.is_allowed());
            }
            admitted
        });
    }
    let mut admitted = vec![0u64; keys.len()];
    while let Some(task) = tasks.join_next().await {
        for (sum, n) in admitted.iter_mut().zip(task.unwrap()) {
            *sum += n;
        }
    }
    admitted
}

fn all_allowed(decisions: &[Decision]) -> bool {
    decisions.iter().all(Decision::is_allowed)
}

/// A caller that sends its request alone (the lane was idle) and goes away
/// while it is in flight hands the requests queued behind it to a task:
/// they are decided, not stranded until their timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_caller_gone_in_flight_strands_nobody() {
    // Stranded requests would end at this timeout, far past the bound below.
    let (_server, proxy, store) = one_connection(Duration::from_secs(10)).await;
    proxy.set_latency(ms(300));
    let lead = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::timeout(ms(100), store.check(b"lead", &window(), 1)).await
        })
    };
    tokio::time::sleep(ms(20)).await;
    let started = Instant::now();
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..5)
        .map(|i| Box::pin(store.check(format!("k{i}").as_bytes(), &window(), 1)) as Boxed<_>)
        .collect();
    let got = join_in_order(calls).await;
    assert!(lead.await.unwrap().is_err(), "the lead caller went away");
    for d in &got {
        assert!(d.as_ref().unwrap().is_allowed(), "{d:?}");
    }
    // Sent when the lead caller left (100 ms), answered 300 ms later; real
    // sockets, so a loaded machine's slack on top.
    assert_within_slack(started, ms(400));
}

/// A batch reply that does not decode is a bug, never an outage: each of its
/// requests fails with an error no failure policy turns into an admission.
/// (The library is loaded again with its batch function answering garbage,
/// under its own name, so the store finds it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reply_that_does_not_decode_is_not_an_outage() {
    let (server, proxy, store) = one_connection(Duration::from_secs(2)).await;
    let broken = function_library().replace(
        "return run_batch(keys, args)",
        "return {'not', 'decisions'}",
    );
    assert_ne!(broken, function_library());
    let mut load = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &server.port().to_string(),
            "-x",
            "FUNCTION",
            "LOAD",
            "REPLACE",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        load.stdin
            .take()
            .unwrap()
            .write_all(broken.as_bytes())
            .unwrap();
    }
    let loaded = load.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&loaded.stdout).starts_with("ratelimit_"),
        "{loaded:?}"
    );
    proxy.set_latency(ms(200));
    let (lead, calls) = behind_a_call(&store, &window(), 5, ms(20)).await;
    let got = join_in_order(calls).await;
    assert!(lead.await.unwrap().unwrap().is_allowed());
    for d in &got {
        match d {
            Err(e @ StoreError::Backend(_)) => assert!(!e.is_outage(), "{e:?}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A batch of many checks (its reply an array of 4,400 integers): 1,100
/// requests on seven keys in one call, each key's decisions in order, its
/// last ones denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_more_than_a_thousand_checks_reads_in_order() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = through_with(&proxy, Duration::from_secs(10), 5000).await;
    let policy = fixed_window("big", 150, NO_EDGE);
    proxy.set_latency(ms(200));
    let before = store.coalescing();
    let lead = {
        let store = store.clone();
        tokio::spawn(async move { store.check(b"lead", &window(), 1).await })
    };
    tokio::time::sleep(ms(20)).await;
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..1100)
        .map(|i| Box::pin(store.check(format!("k{}", i % 7).as_bytes(), &policy, 1)) as Boxed<_>)
        .collect();
    let got = join_in_order(calls).await;
    lead.await.unwrap().unwrap();
    calls_since(&store, before, 2, 1101);
    // Seven keys of 157 or 158 requests: 150 pass, remaining 149 down to 0.
    for key in 0..7 {
        let decisions: Vec<&Decision> = got
            .iter()
            .skip(key)
            .step_by(7)
            .map(|d| d.as_ref().unwrap())
            .collect();
        for (n, d) in decisions.iter().enumerate() {
            if n < 150 {
                assert!(d.is_allowed(), "key {key}, request {n}: {d:?}");
                assert_eq!(d.remaining(), 149 - n as u64, "key {key}, request {n}");
            } else {
                assert!(!d.is_allowed(), "key {key}, request {n}: {d:?}");
                assert!(d.retry_after().unwrap() > Duration::ZERO, "{d:?}");
            }
        }
    }
}

/// A batch holds at most `max_batch` units of work: a concurrency check
/// weighs one unit per permit it may read, so semaphores of 100 never
/// share a call (a batch of 64 full 1,024-permit semaphores held Redis for
/// a quarter of a second), while simple decisions still batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costly_checks_do_not_share_a_call() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    let semaphore = named("sem", Policy::concurrency(100, Duration::from_secs(3600)));
    proxy.set_latency(ms(100));
    let before = store.coalescing();
    let (lead, calls) = behind_a_call(&store, &semaphore, 6, ms(20)).await;
    for d in join_in_order(calls).await {
        assert!(d.unwrap().is_allowed());
    }
    lead.await.unwrap().unwrap();
    let after = calls_since(&store, before, 7, 7);

    // Sixty simple checks behind one: one batch (the limit is 64 units).
    let (lead, calls) = behind_a_call(&store, &window(), 60, ms(20)).await;
    for d in join_in_order(calls).await {
        assert!(d.unwrap().is_allowed());
    }
    lead.await.unwrap().unwrap();
    calls_since(&store, after, 2, 61);
}

/// Two calls in flight per lane, whatever the pool size: the requests that
/// arrive behind them wait and go as one batch when a call returns, rather
/// than two more going alone and smaller batches behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_calls_in_flight_then_one_batch_whatever_the_pool_size() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = build(
        RedisStore::builder(proxy.redis_url())
            .pool_size(4)
            .call_timeout(Duration::from_secs(5)),
    )
    .await;
    // Calls alone, then a batch: both functions are loaded.
    let warm = window();
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..8)
        .map(|_| Box::pin(store.check(b"warm", &warm, 1)) as Boxed<_>)
        .collect();
    for d in join_in_order(calls).await {
        d.unwrap();
    }
    proxy.set_latency(ms(200));
    let before = store.coalescing();
    let leads: Vec<_> = (0..2)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .check(format!("lead{i}").as_bytes(), &window(), 1)
                    .await
            })
        })
        .collect();
    tokio::time::sleep(ms(20)).await;
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..10)
        .map(|i| Box::pin(store.check(format!("k{i}").as_bytes(), &window(), 1)) as Boxed<_>)
        .collect();
    for d in join_in_order(calls).await {
        assert!(d.unwrap().is_allowed());
    }
    for lead in leads {
        assert!(lead.await.unwrap().unwrap().is_allowed());
    }
    calls_since(&store, before, 3, 12);
}

/// A check of cost 1 as a request of a batch.
fn one(
    store: &RedisStore,
    key: &[u8],
    policy: &Policy,
) -> Boxed<Result<Vec<Decision>, StoreError>> {
    let call = store.check(key, policy, 1);
    Box::pin(async move { call.await.map(|d| vec![d]) })
}

/// `calls`, queued behind a lead call on `store` (one connection through
/// `proxy`), so that they go as one batch; checks that they did.
async fn as_one_batch<T>(store: &RedisStore, proxy: &FaultProxy, calls: Vec<Boxed<T>>) -> Vec<T> {
    let before = store.coalescing();
    proxy.set_latency(ms(200));
    let (lead, _) = behind_a_call(store, &window(), 0, ms(20)).await;
    let n = calls.len() as u64;
    let got = join_in_order(calls).await;
    lead.await.unwrap().unwrap();
    proxy.set_latency(Duration::ZERO);
    calls_since(store, before, 2, n + 1);
    got
}

/// A Redis, a proxy in front of it, and a store on one connection through
/// the proxy, calls timing out after `call_timeout`.
async fn one_connection(call_timeout: Duration) -> (RedisServer, FaultProxy, RedisStore) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = through(&proxy, call_timeout).await;
    (server, proxy, store)
}

/// A blocked key in a batch is denied, beside unblocked keys that pass; a
/// multi-limit request with a blocked limit takes nothing from its others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_in_a_batch_is_denied_beside_free_ones() {
    use ratelimit_core::AdminStore;
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    let policy = window();
    let other = named("other", Policy::token_bucket(10, Rate::per_second(1)));
    store
        .block(b"blocked", &policy, Duration::from_secs(3600))
        .await
        .unwrap();
    let checks = [
        Check::new(b"free-2", &other, 1),
        Check::new(b"blocked", &policy, 1),
    ];
    let calls: Vec<Boxed<Result<Vec<Decision>, StoreError>>> = vec![
        one(&store, b"free", &policy),
        one(&store, b"blocked", &policy),
        Box::pin(store.check_all(&checks)),
        one(&store, b"free", &policy),
    ];
    let got: Vec<Vec<Decision>> = as_one_batch(&store, &proxy, calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let blocked = |d: &Decision| {
        !d.is_allowed()
            && d.remaining() == 0
            && d.retry_after()
                .is_some_and(|r| r > Duration::from_secs(3500))
    };
    assert!(
        got[0][0].is_allowed() && got[0][0].remaining() == 99,
        "{got:?}"
    );
    assert!(blocked(&got[1][0]), "{got:?}");
    // The multi-limit request: its free limit reports a peek, the blocked one
    // denies, and nothing is taken.
    assert!(
        got[2][0].is_allowed() && got[2][0].remaining() == 10,
        "{got:?}"
    );
    assert!(blocked(&got[2][1]), "{got:?}");
    assert!(
        got[3][0].is_allowed() && got[3][0].remaining() == 98,
        "{got:?}"
    );
    assert_eq!(
        store.check(b"free-2", &other, 0).await.unwrap().remaining(),
        10
    );
}

/// Requests on one key in one batch are decided one after the other, each
/// seeing what the previous took: a limit of 2 admits two of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_one_key_in_a_batch_see_each_others_writes() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    let gcra = Policy::gcra(2, Rate::per_second(1)).unwrap();
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..3)
        .map(|_| Box::pin(store.check(b"same", &gcra, 1)) as Boxed<_>)
        .collect();
    let got: Vec<Decision> = as_one_batch(&store, &proxy, calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let seen: Vec<(bool, u64)> = got
        .iter()
        .map(|d| (d.is_allowed(), d.remaining()))
        .collect();
    assert_eq!(seen, [(true, 1), (true, 0), (false, 0)], "{got:?}");
    assert!(got[2].retry_after().is_some(), "{got:?}");
}

/// A request of one check meeting another family's state of another Redis
/// type (Redis's own WRONGTYPE, not caught in the script) fails as a policy
/// conflict of its policy, alone; a multi-limit request meeting it too; the
/// requests around them are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_in_a_batch_is_a_conflict_of_its_own_request() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    // Two algorithms under one name, "shared".
    let shared = |p: Result<Policy, _>| p.unwrap().with_name("shared").unwrap();
    let log = shared(Policy::sliding_window_log(10, Duration::from_secs(60)));
    let counter = shared(Policy::fixed_window(10, Duration::from_secs(60)));
    let policy = window();
    // A sorted set under "shared", where the fixed window keeps a string.
    assert!(store.check(b"k", &log, 1).await.unwrap().is_allowed());
    let checks = [Check::new(b"x", &policy, 1), Check::new(b"k", &counter, 1)];
    let calls: Vec<Boxed<Result<Vec<Decision>, StoreError>>> = vec![
        one(&store, b"x", &policy),
        one(&store, b"k", &counter),
        Box::pin(store.check_all(&checks)),
        one(&store, b"k", &log),
        one(&store, b"x", &policy),
    ];
    let got = as_one_batch(&store, &proxy, calls).await;
    for i in [1, 2] {
        assert!(
            matches!(&got[i], Err(StoreError::PolicyConflict { policy }) if policy == "shared"),
            "{i}: {:?}",
            got[i]
        );
    }
    let remaining = |i: usize| {
        let d = &got[i].as_ref().unwrap()[0];
        assert!(d.is_allowed(), "{i}: {d:?}");
        d.remaining()
    };
    // The failed multi-limit request took nothing from "x".
    assert_eq!((remaining(0), remaining(3), remaining(4)), (99, 8, 98));
}

/// A block lives in front of its key's state: the state under it is kept (a
/// check after the unblock goes on from it), a batch denies the key without
/// writing, and what writes a state while the block runs (a penalty, the
/// release of a permit, the drop of expired leases) keeps the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_keeps_its_state_and_what_writes_under_it_keeps_the_block() {
    use ratelimit_core::AdminStore;
    let (server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    let policy = window();
    let d = store.check(b"kept", &policy, 1).await.unwrap();
    assert_eq!(d.remaining(), 99, "{d:?}");
    let hour = Duration::from_secs(3600);
    // Longer than the window, so the TTL below is the block's.
    store.block(b"kept", &policy, 2 * NO_EDGE).await.unwrap();
    let state_key = store.state_key(b"kept", &policy);
    let blocked = |what: &str| {
        let value = server.cli(&["GET", &state_key]);
        assert!(value.starts_with('b'), "{what}: {value:?}");
        let ttl: i64 = server.cli(&["PTTL", &state_key]).parse().unwrap();
        let window = i64::try_from(NO_EDGE.as_millis()).expect("a window in ms");
        assert!(ttl > window, "{what}: the key outlives its block: {ttl}");
    };
    blocked("blocked");
    let d = store.penalize(b"kept", &policy, 2).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    blocked("after a penalty");
    let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..2)
        .map(|_| Box::pin(store.check(b"kept", &policy, 1)) as Boxed<_>)
        .collect();
    for d in as_one_batch(&store, &proxy, calls).await {
        let d = d.unwrap();
        assert!(!d.is_allowed() && d.remaining() == 0, "{d:?}");
    }
    blocked("after a batch");
    store.unblock(b"kept", &policy).await.unwrap();
    // One admitted, then a penalty of 2: 97 left, and this check takes one.
    let d = store.check(b"kept", &policy, 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 96, "{d:?}");
    assert!(server.cli(&["GET", &state_key]).starts_with('f'));

    // A semaphore: a permit released while its key is blocked.
    let permits = Policy::concurrency(2, Duration::from_secs(60)).unwrap();
    let a = store.check(b"sem", &permits, 1).await.unwrap();
    let b = store.check(b"sem", &permits, 1).await.unwrap();
    store.block(b"sem", &permits, hour).await.unwrap();
    let sem_key = store.state_key(b"sem", &permits);
    store
        .release(b"sem", &permits, a.permit().unwrap())
        .await
        .unwrap();
    assert!(server.cli(&["GET", &sem_key]).starts_with('b'));
    let d = store.check(b"sem", &permits, 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    // The last one: no state left, the block alone.
    store
        .release(b"sem", &permits, b.permit().unwrap())
        .await
        .unwrap();
    let held = server.cli(&["GET", &sem_key]);
    assert!(held.starts_with('b') && held.ends_with(';'), "{held:?}");
    assert!(!store.check(b"sem", &permits, 1).await.unwrap().is_allowed());
    store.unblock(b"sem", &permits).await.unwrap();
    assert_eq!(server.cli(&["EXISTS", &sem_key]), "0");
    let d = store.check(b"sem", &permits, 2).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
}

/// The callers a batch answers make their next requests before the lane
/// takes its next batch: ten callers of two checks each, behind a lead
/// call, go in two batches of ten (three calls in all). Taking the queue at
/// once, before they ran, sent the first of them alone and the nine others
/// behind it: four calls.
#[tokio::test(flavor = "current_thread")]
async fn callers_a_batch_answers_go_together_in_the_next() {
    let (_server, proxy, store) = one_connection(Duration::from_secs(5)).await;
    // The lead's reply comes 200 ms after it is sent: long enough for the
    // callers to queue behind it on a loaded machine.
    proxy.set_latency(ms(200));
    let before = store.coalescing();
    let (lead, _) = behind_a_call(&store, &window(), 0, ms(10)).await;
    let callers: Vec<_> = (0..10)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut allowed = 0;
                for round in 0..2 {
                    let key = format!("caller{i}-{round}");
                    if store
                        .check(key.as_bytes(), &window(), 1)
                        .await?
                        .is_allowed()
                    {
                        allowed += 1;
                    }
                }
                Ok::<_, StoreError>(allowed)
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap(), 2);
    }
    lead.await.unwrap().unwrap();
    calls_since(&store, before, 3, 21);
}

/// One runtime's call holds a lane's one place (a pool of one) while
/// another runtime's calls queue behind it; then the first runtime shuts
/// down. No call is left on the lane to send what waits there, and no new
/// request comes: the queued calls' callers send them again on their own,
/// at once. With a call timeout longer than the test, a call left waiting
/// for a batch that never comes would fail it, not slow it.
#[test]
fn calls_queued_behind_a_runtime_that_shuts_down_are_decided() {
    let serving = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let store = serving.block_on(through(&proxy, Duration::from_secs(60)));
    let policy = fixed_window("queued-behind", 1_000_000, NO_EDGE);
    proxy.set_latency(ms(300));
    let doomed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    doomed.spawn({
        let (store, policy) = (store.clone(), policy.clone());
        async move {
            let _ = store.check(b"doomed", &policy, 1).await;
        }
    });
    // Its call goes out alone, and holds the lane for 300 ms.
    doomed.block_on(async { tokio::time::sleep(ms(50)).await });
    let queued: Vec<_> = (0..8)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            serving.spawn(async move {
                let key = format!("queued-{i}");
                store.check(key.as_bytes(), &policy, 1).await
            })
        })
        .collect();
    std::thread::sleep(ms(50));
    drop(doomed);
    proxy.set_latency(Duration::ZERO);
    serving.block_on(async {
        for (i, call) in queued.into_iter().enumerate() {
            let d = call.await.expect("a caller");
            let d = d.unwrap_or_else(|e| panic!("queued call {i}: {e}"));
            assert!(d.is_allowed(), "queued call {i}: {d:?}");
        }
    });
}

/// Two runtimes share one store, and one of them shuts down while its calls
/// are in flight (sent alone, in batches, queued behind them): whatever it
/// dropped counts nothing in flight, and every call the other runtime makes
/// afterwards is decided, none waiting for a batch that will never come.
#[test]
fn a_runtime_shut_down_mid_flight_leaves_the_others_calls_decided() {
    let runtime = |threads: usize| {
        if threads == 1 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
        .enable_all()
        .build()
        .expect("a runtime")
    };
    let serving = runtime(2);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let call_timeout = ms(500);
    let store = serving.block_on(through(&proxy, call_timeout));
    let policy = fixed_window("two-runtimes", 1_000_000, NO_EDGE);
    // Every reply 30 ms late: the doomed runtime's calls are surely in
    // flight, and its lane full, when it goes.
    proxy.set_latency(ms(30));
    let doomed = runtime(1);
    doomed.block_on(async {
        for task in 0..64 {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                for i in 0..100 {
                    let key = format!("doomed-{task}-{i}");
                    let _ = store.check(key.as_bytes(), &policy, 1).await;
                }
            });
        }
        tokio::time::sleep(ms(100)).await;
    });
    drop(doomed);
    proxy.set_latency(Duration::ZERO);
    serving.block_on(async {
        for round in 0..5 {
            let calls: Vec<Boxed<Result<Decision, StoreError>>> = (0..64)
                .map(|i| {
                    let key = format!("after-{round}-{i}");
                    Box::pin(store.check(key.as_bytes(), &policy, 1)) as Boxed<_>
                })
                .collect();
            for (i, d) in join_in_order(calls).await.into_iter().enumerate() {
                let d = d.unwrap_or_else(|e| panic!("round {round}, call {i}: {e}"));
                assert!(d.is_allowed(), "round {round}, call {i}: {d:?}");
            }
        }
    });
}
