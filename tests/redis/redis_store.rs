//! `RedisStore` against real Redis servers started by the tests: the same
//! decisions as `MemoryStore` on replayed timelines, exactness under
//! concurrency on one node and on a 3-master cluster, script reloads, TTLs,
//! the semaphore, reconnection and connection settings.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    AdminStore, Check, Decision, MemoryStore, PermitId, Policy, Rate, Store, StoreError,
};
use ratelimit_tests::fixtures::ok_service;
use ratelimit_tests::fixtures::{Rng, fixed_window};
use ratelimit_tests::{
    CALL_TIMEOUT, Certificates, NO_EDGE, NOW_MICROS, RedisCluster, RedisServer,
    admit_exactly_the_limit, admits, assert_within_slack, build, cluster_store,
    decide_through_a_restart, long_policies, named, observable, pooled, redis_store,
    redis_store_on_clock, small_policies, twin_stores, twins_at,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A Redis of its own and a store on it, built with the builder's defaults.
async fn started() -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    let store = build(RedisStore::builder(server.url())).await;
    (server, store)
}

fn same_outcome(
    what: &str,
    memory: &Result<Decision, StoreError>,
    redis: &Result<Decision, StoreError>,
) {
    match (memory, redis) {
        (Ok(m), Ok(r)) => assert_eq!(observable(m), observable(r), "{what}"),
        (Err(StoreError::CostExceedsLimit { .. }), Err(StoreError::CostExceedsLimit { .. })) => {}
        _ => panic!("{what}: memory {memory:?} vs redis {redis:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_on_random_timelines() {
    // Around the current Unix time in µs, so the scripts see realistic magnitudes.
    let (_server, clock, memory, redis) = twins_at(1_763_000_000_123_457).await;
    agree_on_random_timelines(&clock, &memory, &redis).await;
}

/// The same, and several limits at once, by scripts (`EVALSHA`) on a Redis
/// where `FCALL` cannot be used (renamed away, as on Redis 6): each script
/// holds only the helpers it calls (pruned), and still decides every branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_by_script_where_functions_cannot_be_used() {
    let server = RedisServer::start_with_args(&["--rename-command", "FCALL", ""]);
    let clock = ManualClock::new(1_763_000_000_123_457);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    agree_on_random_timelines(&clock, &memory, &redis).await;
    agree_on_several_limits(&clock, &memory, &redis).await;
    for policy in small_policies() {
        redis
            .block(b"blocked", &policy, Duration::from_secs(60))
            .await
            .unwrap();
        let denied = redis.check(b"blocked", &policy, 1).await.unwrap();
        assert!(!denied.is_allowed(), "{}", policy.name());
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
    assert!(!stats.contains("cmdstat_fcall:"), "{stats}");
}

async fn agree_on_random_timelines(
    clock: &ManualClock,
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut compared = 0;
    for policy in small_policies() {
        for timeline in 0..25 {
            let key = format!("{}-{timeline}", policy.name());
            let mut held = Vec::new();
            let mut last_retry = 0;
            for step in 0..40 {
                let advance = match rng.below(10) {
                    0..=3 => 0,
                    4..=6 => 1 + rng.below(30_000),
                    7 => last_retry,
                    8 => last_retry.saturating_sub(1),
                    _ => 50_000 + rng.below(200_000),
                };
                clock.advance(Duration::from_micros(advance));
                if !held.is_empty() && rng.below(4) == 0 {
                    let (m, r) = held.swap_remove(rng.index(held.len()));
                    memory.release(key.as_bytes(), &policy, m).await.unwrap();
                    redis.release(key.as_bytes(), &policy, r).await.unwrap();
                }
                let cost = if rng.below(20) == 0 {
                    policy.max_cost() + 1
                } else {
                    rng.below(policy.max_cost() + 1)
                };
                let m = memory.check(key.as_bytes(), &policy, cost).await;
                let r = redis.check(key.as_bytes(), &policy, cost).await;
                same_outcome(
                    &format!("{key} step {step} cost {cost} at +{advance}µs"),
                    &m,
                    &r,
                );
                if let (Ok(m), Ok(r)) = (&m, &r) {
                    if let (Some(a), Some(b)) = (m.permit(), r.permit()) {
                        held.push((a, b));
                    }
                    last_retry = m.retry_after_micros();
                }
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 7 * 25 * 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_on_several_limits_at_once() {
    let (_server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    agree_on_several_limits(&clock, &memory, &redis).await;
}

async fn agree_on_several_limits(
    clock: &ManualClock,
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
) {
    let policies: Vec<Policy> = small_policies()
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.with_name(format!("multi-{i}")).unwrap())
        .collect();
    let mut rng = Rng(42);
    for round in 0..300 {
        clock.advance(Duration::from_micros(rng.below(20_000)));
        let a = &policies[rng.index(7)];
        let b = &policies[rng.index(7)];
        let user = format!("u{}", rng.below(3));
        let checks = [
            Check::new(user.as_bytes(), a, rng.below(a.max_cost() + 1)),
            Check::new(b"global", b, rng.below(3)),
        ];
        let m = memory.check_all(&checks).await.unwrap();
        let r = redis.check_all(&checks).await.unwrap();
        let m: Vec<_> = m.iter().map(observable).collect();
        let r: Vec<_> = r.iter().map(observable).collect();
        assert_eq!(m, r, "round {round}");
    }
}

/// 64 tasks over 8 pooled connections hammer one key: exactly the limit passes,
/// for every algorithm, with the server's own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let store = pooled(RedisStore::builder(server.url()), 8).await;
    admit_exactly_the_limit(&store, "hot").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_admits_exactly_the_limit_and_keeps_multi_limits_in_one_slot() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    admit_exactly_the_limit(&store, "hot-on-cluster").await;

    // Per second and per day of one user share the user's hash tag: all or nothing.
    let per_second = fixed_window("per-second", 3, NO_EDGE);
    let per_day = fixed_window("per-day", 4, NO_EDGE);
    let both = [
        Check::new(b"carol", &per_second, 1),
        Check::new(b"carol", &per_day, 1),
    ];
    for i in 0..3 {
        let d = store.check_all(&both).await.unwrap();
        assert!(d.iter().all(Decision::is_allowed), "request {i}");
    }
    let d = store.check_all(&both).await.unwrap();
    assert!(!d[0].is_allowed());
    assert_eq!(d[1].remaining(), 1, "the day's budget was not consumed");

    // Keys in different slots: decided slot by slot, refunded when a later slot denies.
    cross_slot_limits_refund_on_denial(&store).await;

    // A name that changed algorithm is a conflict on a cluster too; across
    // slots, what the earlier slot consumed is refunded.
    let window = fixed_window("shared", 3, NO_EDGE);
    let bucket = named("shared", Policy::token_bucket(3, Rate::per_hour(1)));
    store.check(b"dave", &window, 1).await.unwrap();
    assert_conflict("cluster", store.check(b"dave", &bucket, 1).await);
    let slot =
        |k: &str| ratelimit_tests::cluster_slot(store.state_key(k.as_bytes(), &window).as_bytes());
    let earlier = (0..1000)
        .map(|i| format!("earlier-{i}"))
        .find(|k| slot(k) < slot("dave"))
        .unwrap();
    let checks = [
        Check::new(earlier.as_bytes(), &per_day, 1),
        Check::new(b"dave", &bucket, 1),
    ];
    assert_conflict("cluster, across slots", store.check_all(&checks).await);
    let peek = store.check(earlier.as_bytes(), &per_day, 0).await.unwrap();
    assert_eq!(peek.remaining(), 4, "refunded");

    // Keys really spread over the three masters.
    let keys: Vec<String> = (0..30).map(|i| format!("spread-{i}")).collect();
    let policy = Policy::gcra(5, Rate::per_second(1)).unwrap();
    for k in &keys {
        store.check(k.as_bytes(), &policy, 1).await.unwrap();
    }
    let per_node: Vec<u64> = (0..3)
        .map(|n| cluster.cli(n, &["DBSIZE"]).parse().unwrap())
        .collect();
    assert!(
        per_node.iter().all(|&n| n > 0),
        "keys per node: {per_node:?}"
    );
}

/// Under every algorithm: checks `key`, runs `flush` on `server`, checks it
/// again; the second check decides on the state the first left (`what`
/// names the run when it does not).
async fn flush_between_checks(
    server: &RedisServer,
    store: &RedisStore,
    key: &[u8],
    flush: &[&str],
    what: &str,
) {
    for policy in long_policies(10) {
        let first = store.check(key, &policy, 1).await.unwrap();
        assert_eq!(server.cli(flush), "OK");
        let second = store.check(key, &policy, 1).await.unwrap();
        assert_eq!(
            second.remaining() + 1,
            first.remaining(),
            "{what}: {}",
            policy.name()
        );
    }
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded_transparently() {
    let (server, store) = started().await;
    flush_between_checks(&server, &store, b"k", &["SCRIPT", "FLUSH"], "").await;
    let a = Policy::sliding_window_log(3, Duration::from_secs(60)).unwrap();
    server.cli(&["SCRIPT", "FLUSH"]);
    let both = store
        .check_all(&[Check::new(b"x", &a, 1), Check::new(b"y", &a, 1)])
        .await
        .unwrap();
    assert!(both.iter().all(Decision::is_allowed));
}

/// On Redis 7, single decisions run as Redis Functions (`FCALL`): the store
/// loads its library the first time, and again after `FUNCTION FLUSH`,
/// without a failed request; every algorithm decides as it did by script.
#[tokio::test]
async fn single_decisions_run_as_functions_reloaded_after_a_flush() {
    let (server, store) = started().await;
    let calls = |command: &str| -> u64 {
        let stats = server.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    for round in 0..2 {
        let what = format!("round {round}");
        flush_between_checks(&server, &store, b"f", &["FUNCTION", "FLUSH"], &what).await;
    }
    let libraries = server.cli(&["FUNCTION", "LIST"]);
    assert!(libraries.contains("ratelimit_"), "{libraries}");
    let checks = 2 * 2 * long_policies(10).len() as u64;
    // Every check was an FCALL that succeeded or met a flushed library once.
    assert!(
        calls("fcall") >= checks,
        "{}",
        server.cli(&["INFO", "commandstats"])
    );
    // No decision fell back to a script: the only scripts are the ACL
    // probes, one per pooled connection (DEFAULT_POOL_SIZE).
    assert!(
        calls("evalsha") <= 4 && calls("eval") <= 4,
        "{}",
        server.cli(&["INFO", "commandstats"])
    );
}

/// A single decision sends Redis its two keys and three arguments (cost and
/// the two parameters): the fixed time and the permit id go only where they
/// say something (a concurrency check), since every argument costs Redis
/// work on every call. The decisions stay those of the policy.
#[tokio::test]
async fn a_single_decision_sends_three_arguments_but_for_concurrency() {
    let server = RedisServer::start_with_args(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "1000",
    ]);
    let store = build(RedisStore::builder(server.url()).max_batch(1)).await;
    let gcra = Policy::gcra(2, Rate::per_second(1)).unwrap();
    let window = fixed_window("w", 1, NO_EDGE);
    let permits = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    server.cli(&["SLOWLOG", "RESET"]);
    assert!(store.check(b"g", &gcra, 1).await.unwrap().is_allowed());
    assert!(store.check(b"w", &window, 1).await.unwrap().is_allowed());
    let denied = store.check(b"w", &window, 1).await.unwrap();
    assert!(!denied.is_allowed() && denied.limit() == 1, "{denied:?}");
    let held = store.check(b"c", &permits, 1).await.unwrap();
    assert!(held.permit().is_some(), "{held:?}");
    let log: serde_json::Value =
        serde_json::from_str(&server.cli(&["--json", "SLOWLOG", "GET", "1000"])).unwrap();
    let calls: Vec<Vec<String>> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            entry[3]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
                .collect()
        })
        .filter(|args: &Vec<String>| args[0].eq_ignore_ascii_case("fcall"))
        .collect();
    // Four checks; the first may have met no library yet and been sent again.
    assert!(calls.len() >= 4, "{calls:?}");
    for args in &calls {
        // FCALL <function> 1 <state key> <arguments...>: an admin block
        // lives in the state key.
        assert_eq!(args[2], "1", "{args:?}");
        let expected = if args[1].ends_with("_concurrency") {
            5
        } else {
            3
        };
        assert_eq!(args.len() - 4, expected, "{args:?}");
    }
}

/// The library remembers the numbers it parses (`number` in prelude.lua, at
/// most 256 at a time): more distinct limits, costs and counts than that,
/// interleaved, still decide exactly, single and batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_distinct_numbers_than_the_library_remembers_decide_exactly() {
    let server = RedisServer::start();
    for max_batch in [1, 64] {
        let store = build(
            RedisStore::builder(server.url())
                .prefix(format!("n{max_batch}"))
                .max_batch(max_batch)
                // 300 calls at once on a machine busy with other tests: the
                // default 100 ms per call is not what this test is about.
                .call_timeout(CALL_TIMEOUT),
        )
        .await;
        let policies: Vec<Policy> = (1..=300)
            .map(|limit| fixed_window(&format!("w{limit}"), 1000 + limit, NO_EDGE))
            .collect();
        for round in 0..2u64 {
            let mut checks = tokio::task::JoinSet::new();
            for (i, policy) in policies.iter().enumerate() {
                let (store, policy) = (store.clone(), policy.clone());
                checks.spawn(async move {
                    let cost = 1 + i as u64 % 7;
                    let d = store.check(b"k", &policy, cost).await.unwrap();
                    (policy.limit(), cost, d)
                });
            }
            while let Some(result) = checks.join_next().await {
                let (limit, cost, d) = result.unwrap();
                assert!(d.is_allowed(), "{d:?}");
                assert_eq!(
                    d.remaining(),
                    limit - (round + 1) * cost,
                    "max_batch {max_batch}, {d:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_restarted_redis_is_used_again_without_failed_requests() {
    let mut server = RedisServer::start();
    let store = build(
        RedisStore::builder(server.url())
            .pool_size(2)
            .call_timeout(Duration::from_secs(2)),
    )
    .await;
    decide_through_a_restart(&store, &mut server).await;
}

#[tokio::test]
async fn a_dead_redis_is_an_error_within_the_timeout() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let store = build(
        RedisStore::builder(url)
            .connect_timeout(ms(200))
            .call_timeout(ms(300)),
    )
    .await;
    let policy = Policy::gcra(10, Rate::per_second(1)).unwrap();
    let started = std::time::Instant::now();
    let err = store.check(b"k", &policy, 1).await.unwrap_err();
    assert!(err.is_outage(), "{err}");
    // A real socket: the 300 ms call timeout plus a loaded machine's slack.
    assert_within_slack(started, ms(300));
}

/// After a mixed workload with the server's clock, every key has a TTL, and
/// none outlives its policy's state by more than a small margin.
/// A fresh GCRA state matters for `cost × interval`: its key's TTL is that,
/// in whole milliseconds, for more distinct TTLs than the library remembers
/// the text of (256), alone and in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_stay_exact_past_what_the_library_remembers() {
    let server = RedisServer::start();
    let mut audit = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let policy = Policy::gcra(400, Rate::per_second(1)).unwrap();
    for max_batch in [1, 64] {
        let prefix = format!("ttl{max_batch}");
        let store = build(
            RedisStore::builder(server.url())
                .prefix(prefix.clone())
                .max_batch(max_batch)
                .call_timeout(CALL_TIMEOUT),
        )
        .await;
        for round in 0..2 {
            let mut checks = tokio::task::JoinSet::new();
            for cost in 1..=300u64 {
                let (store, policy) = (store.clone(), policy.clone());
                checks.spawn(async move {
                    let key = format!("r{round}-c{cost}");
                    let d = store.check(key.as_bytes(), &policy, cost).await.unwrap();
                    assert!(d.is_allowed(), "{d:?}");
                    (key, cost)
                });
            }
            while let Some(result) = checks.join_next().await {
                let (key, cost) = result.unwrap();
                let redis_key = store.state_key(key.as_bytes(), &policy);
                // The layout every store shares: `<prefix>:<policy>:{<key>}`.
                assert_eq!(redis_key, format!("{prefix}:{}:{{{key}}}", policy.name()));
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&redis_key)
                    .query_async(&mut audit)
                    .await
                    .unwrap();
                let expected = cost as i64 * 1000;
                assert!(
                    ttl <= expected && ttl > expected - 1000,
                    "{redis_key}: PTTL {ttl} ms, expected {expected}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_has_a_ttl_no_longer_than_its_state() {
    let server = RedisServer::start();
    let store = build(RedisStore::builder(server.url()).prefix("audit")).await;
    let second = Duration::from_secs(1);
    let policies = [
        Policy::fixed_window(5, 3 * second).unwrap(),
        Policy::sliding_window_log(5, 3 * second).unwrap(),
        Policy::sliding_window_counter(5, 3 * second).unwrap(),
        Policy::token_bucket(5, Rate::new(5, 3 * second)).unwrap(),
        Policy::gcra(5, Rate::new(5, 3 * second)).unwrap(),
        Policy::leaky_bucket(5, Rate::new(5, 3 * second)).unwrap(),
        Policy::concurrency(5, 3 * second).unwrap(),
    ];
    let mut rng = Rng(7);
    for round in 0..400 {
        let policy = &policies[rng.index(7)];
        let key = format!("user-{}", rng.below(20));
        let cost = rng.below(4);
        let d = store.check(key.as_bytes(), policy, cost).await.unwrap();
        if let Some(permit) = d.permit()
            && round % 2 == 0
        {
            store.release(key.as_bytes(), policy, permit).await.unwrap();
        }
    }
    // One connection for the audit: a redis-cli process per key made the
    // audit itself slow enough under load for keys to expire during it.
    let mut audit = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut audit)
        .await
        .unwrap();
    assert!(keys.len() > 50, "workload left {} keys", keys.len());
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut audit)
            .await
            .unwrap_or_else(|e| panic!("PTTL {key}: {e}"));
        if ttl == -2 || ttl == 0 {
            // Expired between SCAN and PTTL, or expiring in this very
            // millisecond (PTTL reports 0 until the key is gone): no key
            // without a TTL (-1) either way.
            continue;
        }
        let policy = policies
            .iter()
            .find(|p| key.starts_with(&format!("audit:{}:", p.name())))
            .unwrap_or_else(|| panic!("unexpected key {key}"));
        // The longest a state matters: two windows for the sliding counter,
        // the window (refill time, lease) for the others.
        let longest = match policy.algorithm().kind() {
            "sliding-window" => 2 * policy.window(),
            _ => policy.window(),
        };
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        assert!(
            ttl as u128 <= longest.as_millis() + 2,
            "{key}: TTL {ttl} ms outlives its state ({longest:?})"
        );
    }
}

#[tokio::test]
async fn semaphore_reclaims_dead_holders_and_releases() {
    let (_server, store) = started().await;
    let policy = Policy::concurrency(2, ms(300)).unwrap();
    let a = store.check(b"job", &policy, 1).await.unwrap();
    let b = store.check(b"job", &policy, 1).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed());
    assert_ne!(a.permit(), b.permit());
    let denied = store.check(b"job", &policy, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.retry_after().unwrap() <= ms(300));
    // Releasing frees a slot at once.
    store
        .release(b"job", &policy, a.permit().unwrap())
        .await
        .unwrap();
    let c = store.check(b"job", &policy, 1).await.unwrap();
    assert!(c.is_allowed());
    // The holders of b and c "crash": their leases expire and the slots return.
    tokio::time::sleep(ms(350)).await;
    let peek = store.check(b"job", &policy, 0).await.unwrap();
    assert_eq!(peek.remaining(), 2);
}

/// Three store instances (as three service instances would) share one
/// semaphore: at no instant are more than `max` permits held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_never_exceeds_max_across_instances() {
    const MAX: u64 = 3;
    let server = RedisServer::start();
    let policy = Policy::concurrency(MAX, Duration::from_secs(30)).unwrap();
    let in_flight = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let store = redis_store(server.url()).await;
        for _ in 0..8 {
            let (store, policy) = (store.clone(), policy.clone());
            let (in_flight, peak, completed) = (in_flight.clone(), peak.clone(), completed.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let permit = loop {
                        let d = store.check(b"shared", &policy, 1).await.unwrap();
                        if let Some(p) = d.permit() {
                            break p;
                        }
                        tokio::time::sleep(ms(2)).await;
                    };
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(ms(5)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    store.release(b"shared", &policy, permit).await.unwrap();
                    completed.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the semaphore workload finished in time");
    assert_eq!(completed.load(Ordering::SeqCst), 3 * 8 * 3);
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= MAX, "peak {peak} holders");
    assert!(peak >= 2, "the test never overlapped holders (peak {peak})");
}

#[tokio::test]
async fn acl_users_and_database_numbers_come_from_the_url() {
    let server = RedisServer::start_with_args(&[
        "--user", "default", "off", "--user", "limiter", "on", ">s3cret", "~*", "+@all",
    ]);
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}/3", server.port());
    let store = build(RedisStore::builder(url).prefix("acl")).await;
    let policy = Policy::sliding_window_log(2, Duration::from_secs(60)).unwrap();
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    let auth = [
        "--user",
        "limiter",
        "--pass",
        "s3cret",
        "--no-auth-warning",
        "-n",
        "3",
    ];
    let keys = server.cli(&[&auth[..], &["--scan"]].concat());
    assert_eq!(keys, "acl:sliding-log-2-per-1m:{k}");

    let wrong = format!("redis://limiter:nope@127.0.0.1:{}/3", server.port());
    let refused = RedisStore::builder(wrong).build().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("credentials")),
        "{:?}",
        refused.err()
    );
}

#[tokio::test]
async fn keys_are_bounded_and_never_echo_secrets() {
    let (server, store) = started().await;
    let policy = Policy::sliding_window_log(1, Duration::from_secs(60)).unwrap();
    let secret = format!("sk_live_{}", "x".repeat(1 << 20));
    assert!(admits(&store, secret.as_bytes(), &policy).await);
    assert!(!admits(&store, secret.as_bytes(), &policy).await);
    let key = server.cli(&["--scan"]);
    assert!(key.len() < 100, "{key}");
    assert!(!key.contains("sk_live"), "{key}");
    assert!(
        store
            .check(&[0xff, 0x00, b'{'], &policy, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(matches!(
        store.check(b"k", &policy, u64::MAX).await,
        Err(StoreError::CostExceedsLimit { .. })
    ));
    assert!(
        RedisStore::builder(server.url())
            .prefix("bad prefix {x}")
            .build()
            .await
            .is_err()
    );
}

/// Two users whose keys live in different cluster slots, each checked with a
/// per-user limit and a small shared limit: when the later slot denies, what
/// the earlier slot consumed is given back; nothing is ever over-admitted.
async fn cross_slot_limits_refund_on_denial(store: &RedisStore) {
    let slot = |k: &str, p: &Policy| {
        ratelimit_tests::cluster_slot(store.state_key(k.as_bytes(), p).as_bytes())
    };
    for (round, algorithm) in long_policies(3).into_iter().enumerate() {
        let per_user = algorithm.with_name(format!("cross-user-{round}")).unwrap();
        let shared = named(
            format!("cross-shared-{round}"),
            Policy::fixed_window(1, NO_EDGE),
        );
        // Both orders: the per-user key in the earlier slot, then in the later one.
        for earlier_first in [true, false] {
            let shared_key = format!("s{round}-{earlier_first}");
            let shared_slot = slot(&shared_key, &shared);
            let user = (0..1000)
                .map(|i| format!("u{round}-{earlier_first}-{i}"))
                .find(|u| {
                    let user_slot = slot(u, &per_user);
                    if earlier_first {
                        user_slot < shared_slot
                    } else {
                        user_slot > shared_slot
                    }
                })
                .unwrap();
            let checks = [
                Check::new(user.as_bytes(), &per_user, 1),
                Check::new(shared_key.as_bytes(), &shared, 1),
            ];
            let first = store.check_all(&checks).await.unwrap();
            assert!(first.iter().all(Decision::is_allowed), "{first:?}");
            // The shared limit of 1 is spent: denied, and the user's unit refunded.
            let second = store.check_all(&checks).await.unwrap();
            assert!(!second[1].is_allowed(), "{second:?}");
            let peek = store.check(user.as_bytes(), &per_user, 0).await.unwrap();
            assert_eq!(
                peek.remaining(),
                2,
                "{} ({earlier_first}): the denied request consumed nothing",
                per_user.name()
            );
            assert!(second[0].permit().is_none());
        }
    }
}

/// Which state an algorithm keeps, as `MemoryStore`'s `State` has it: GCRA
/// and the leaky bucket share one.
fn state_family(policy: &Policy) -> &'static str {
    match policy.algorithm().kind() {
        "leaky-bucket" => "gcra",
        kind => kind,
    }
}

/// What a Redis key holds, to tell whether a script wrote to it.
fn raw_state(server: &RedisServer, key: &str) -> String {
    match server.cli(&["TYPE", key]).as_str() {
        "string" => format!("string {}", server.cli(&["GET", key])),
        "zset" => format!(
            "zset {}",
            server.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
        ),
        other => other.to_owned(),
    }
}

fn assert_conflict<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::PolicyConflict { policy }) => assert_eq!(policy, "shared", "{what}"),
        other => panic!("{what}: expected PolicyConflict, got {other:?}"),
    }
}

/// A policy that keeps its name but changes algorithm (a restart against a
/// shared Redis, a policy removed and brought back) meets the old
/// algorithm's state. For every ordered pair of algorithms whose states
/// differ, both stores answer `PolicyConflict` to checks, peeks, `check_all`,
/// penalties and rewards, consume nothing and leave the old state as it was;
/// a release finds no permit. (Untagged, a token bucket or a sliding window
/// counter read a fixed window's state as its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_algorithm_under_the_same_name_is_a_policy_conflict() {
    let (server, _clock, memory, redis) = twins_at(NOW_MICROS).await;
    let policies: Vec<Policy> = long_policies(5)
        .into_iter()
        .map(|p| p.with_name("shared").unwrap())
        .collect();
    let other = fixed_window("other", 5, Duration::from_secs(3600));
    let mut pairs = 0;
    for old in &policies {
        for new in &policies {
            if state_family(old) == state_family(new) {
                continue;
            }
            let (old_kind, new_kind) = (old.algorithm().kind(), new.algorithm().kind());
            let what = format!("{old_kind} then {new_kind}");
            let key = format!("{old_kind}-then-{new_kind}");
            let key = key.as_bytes();
            let m = memory.check(key, old, 2).await.unwrap();
            let r = redis.check(key, old, 2).await.unwrap();
            assert!(m.is_allowed() && r.is_allowed(), "{what}");
            let state_key = redis.state_key(key, new);
            let written = raw_state(&server, &state_key);

            for cost in [0, 1] {
                let at = format!("{what}, cost {cost}");
                assert_conflict(&format!("memory: {at}"), memory.check(key, new, cost).await);
                assert_conflict(&format!("redis: {at}"), redis.check(key, new, cost).await);
            }
            // With another limit, the other consumes nothing either.
            let checks = [Check::new(b"bystander", &other, 1), Check::new(key, new, 1)];
            assert_conflict(
                &format!("memory: {what}, check_all"),
                memory.check_all(&checks).await,
            );
            assert_conflict(
                &format!("redis: {what}, check_all"),
                redis.check_all(&checks).await,
            );
            if new_kind == "concurrency" {
                let permit = PermitId(1);
                memory.release(key, new, permit).await.unwrap();
                redis.release(key, new, permit).await.unwrap();
            } else {
                let penalized = (
                    memory.penalize(key, new, 1).await,
                    redis.penalize(key, new, 1).await,
                );
                let rewarded = (
                    memory.reward(key, new, 1).await,
                    redis.reward(key, new, 1).await,
                );
                for (op, (m, r)) in [("penalize", penalized), ("reward", rewarded)] {
                    assert_conflict(&format!("memory: {what}, {op}"), m);
                    assert_conflict(&format!("redis: {what}, {op}"), r);
                }
            }

            assert_eq!(
                raw_state(&server, &state_key),
                written,
                "{what}: written to"
            );
            let m = memory.check(key, old, 0).await.unwrap();
            let r = redis.check(key, old, 0).await.unwrap();
            assert_eq!(observable(&m), observable(&r), "{what}");
            assert_eq!(m.remaining(), 3, "{what}: the old state counts on");
            pairs += 1;
        }
    }
    // 7 algorithms in 6 families: every ordered pair but GCRA/leaky bucket.
    assert_eq!(pairs, 7 * 6 - 2);
    for store_peek in [
        memory.check(b"bystander", &other, 0).await,
        redis.check(b"bystander", &other, 0).await,
    ] {
        assert_eq!(store_peek.unwrap().remaining(), 5, "check_all consumed");
    }
}

/// GCRA and the leaky bucket keep one state, a theoretical arrival time, on
/// both stores: a name moved from one to the other counts on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_and_leaky_bucket_share_their_state_on_both_stores() {
    let (_server, _clock, memory, redis) = twins_at(NOW_MICROS).await;
    let gcra = named("shared", Policy::gcra(5, Rate::per_hour(1)));
    let leaky = named("shared", Policy::leaky_bucket(5, Rate::per_hour(1)));
    for (first, then) in [(&gcra, &leaky), (&leaky, &gcra)] {
        let key = format!(
            "{}-then-{}",
            first.algorithm().kind(),
            then.algorithm().kind()
        );
        let key = key.as_bytes();
        for store_decision in [
            memory.check(key, first, 2).await,
            redis.check(key, first, 2).await,
        ] {
            assert!(store_decision.unwrap().is_allowed());
        }
        let m = memory.check(key, then, 1).await.unwrap();
        let r = redis.check(key, then, 1).await.unwrap();
        assert_eq!(observable(&m), observable(&r), "{key:?}");
        assert!(m.is_allowed());
        assert_eq!(m.remaining(), 2, "{key:?}: counted on");
    }
}

/// A state written before states were tagged with their algorithm (no
/// leading letter) is read as it always was, and written back tagged.
#[tokio::test]
async fn untagged_states_from_before_tags_count_on() {
    const HOUR: u64 = 3_600_000_000;
    let server = RedisServer::start();
    let now = 1_763_000_000_000_001;
    let redis = redis_store_on_clock(server.url(), &ManualClock::new(now)).await;
    let window = Policy::fixed_window(5, Duration::from_secs(3600)).unwrap();
    let gcra = Policy::gcra(5, Rate::per_hour(1)).unwrap();
    let untagged = [
        (&window, format!("{} 2", now / HOUR * HOUR), 'f'),
        (&gcra, format!("{}", now + 2 * HOUR), 'g'),
    ];
    for (policy, value, tag) in untagged {
        let key = redis.state_key(b"old", policy);
        server.cli(&["SET", &key, &value, "PX", "60000"]);
        let decision = redis.check(b"old", policy, 1).await.unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), 2, "{}", policy.name());
        let stored = server.cli(&["GET", &key]);
        assert!(stored.starts_with(tag), "{}: {stored}", policy.name());
    }
}

#[tokio::test]
async fn rediss_urls_use_tls_with_a_private_ca() {
    let certs = Certificates::make();
    let args = certs.server_args();
    let server = RedisServer::start_with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let store = build(
        RedisStore::builder(url.clone())
            .tls_root_cert(certs.ca_pem())
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let policy = Policy::sliding_window_log(2, Duration::from_secs(60)).unwrap();
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"k", &policy, 1).await.unwrap().is_allowed());

    // Without the CA the server's certificate is not trusted: a mistake to
    // fix, not an outage, so no failure policy lets requests through.
    let untrusting = redis_store(url).await;
    let refused = untrusting.check(b"k", &policy, 1).await.unwrap_err();
    assert!(!refused.is_outage(), "{refused:?}");
    // A plain-text client cannot talk to the TLS port.
    let plain = build(
        RedisStore::builder(format!("redis://127.0.0.1:{}", server.port()))
            .call_timeout(Duration::from_millis(500)),
    )
    .await;
    assert!(plain.check(b"k", &policy, 1).await.is_err());
}

/// A cross-slot refund that gives back part of the only
/// entry of a sliding log keeps the key's TTL (it used to remove the entry,
/// which deleted the key, and recreate it without a TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_refund_keeps_the_sliding_log_ttl() {
    let cluster = RedisCluster::start();
    // A fixed clock: both requests land in the same microsecond, so the
    // refunded request shares the log's only entry.
    let clock = ManualClock::new(1_763_000_000_000_001);
    let store = crate::shared::cluster_store_on_clock(&cluster, &clock).await;
    let per_user = named(
        "refund-log",
        Policy::sliding_window_log(5, Duration::from_secs(60)),
    );
    let shared = fixed_window("refund-shared", 1, Duration::from_secs(60));
    let slot = |k: &str, p: &Policy| {
        ratelimit_tests::cluster_slot(store.state_key(k.as_bytes(), p).as_bytes())
    };
    let shared_slot = slot("everyone", &shared);
    let user = (0..1000)
        .map(|i| format!("refund-user-{i}"))
        .find(|u| slot(u, &per_user) < shared_slot)
        .unwrap();
    assert!(admits(&store, user.as_bytes(), &per_user).await);
    assert!(admits(&store, b"everyone", &shared).await);
    let checks = [
        Check::new(user.as_bytes(), &per_user, 2),
        Check::new(b"everyone", &shared, 1),
    ];
    let denied = store.check_all(&checks).await.unwrap();
    assert!(!denied[1].is_allowed(), "{denied:?}");
    let peek = store.check(user.as_bytes(), &per_user, 0).await.unwrap();
    assert_eq!(peek.remaining(), 4, "the refund gave back the 2 units");
    let key = store.state_key(user.as_bytes(), &per_user);
    let ttl: i64 = cluster.cli(0, &["-c", "PTTL", &key]).parse().unwrap();
    assert!(ttl > 0, "{key} has no TTL after the refund ({ttl})");
}

/// A cross-slot refund (`refund.lua`, one per slot) sent again after its
/// reply was lost changes nothing, even when another request consumed in
/// between: the fixed window's compare-and-set would find the state the
/// refunded request left (its count again) and give the other request's
/// unit away, and the sliding log would take it from the entry both share.
/// On one node, through the scripts themselves, on one fixed microsecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_refund_sent_again_gives_back_once() {
    let server = RedisServer::start();
    let clock = ManualClock::new(NOW_MICROS);
    let store = redis_store_on_clock(server.url(), &clock).await;
    let hour = Duration::from_secs(3600);
    let window = named("aba-window", Policy::fixed_window(2, hour));
    let log = named("aba-log", Policy::sliding_window_log(2, hour));
    let keys = [store.state_key(b"u", &window), store.state_key(b"u", &log)];
    let (multi, refund) = ratelimit_core::redis::cross_slot_sources_for_tests();
    let (multi, refund) = (redis::Script::new(multi), redis::Script::new(refund));
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let no_permit = format!("{:032x}", 0);
    let hour_micros = hour.as_micros().to_string();
    // One request of both limits, cost 1 each: its states after and before.
    let mut consume = async || -> Vec<(String, String)> {
        let mut call = multi.prepare_invoke();
        call.key(&keys[0]).key(&keys[1]).arg(NOW_MICROS);
        for algorithm in ["fixed-window", "sliding-log"] {
            call.arg(algorithm)
                .arg(1)
                .arg(2)
                .arg(&hour_micros)
                .arg(&no_permit);
        }
        let reply: Vec<Vec<redis::Value>> = call.invoke_async(&mut connection).await.unwrap();
        reply
            .iter()
            .map(|entry| {
                let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).unwrap();
                assert_eq!(redis::from_redis_value_ref::<i64>(&entry[0]).unwrap(), 1);
                (text(&entry[6]), text(&entry[7]))
            })
            .collect()
    };
    let _first = consume().await;
    let refunded = consume().await;
    let id = format!("{:032x}", 0x5eed_u128);
    let mut refund_call = refund.prepare_invoke();
    refund_call
        .key(&keys[0])
        .key(&keys[1])
        .key(format!("{}:applied", keys[0]))
        .arg(NOW_MICROS)
        .arg(&id);
    for ((after, before), algorithm) in refunded.iter().zip(["fixed-window", "sliding-log"]) {
        refund_call
            .arg(algorithm)
            .arg(1)
            .arg(&no_permit)
            .arg(after)
            .arg(before);
    }
    let mut control = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = refund_call.invoke_async(&mut control).await.unwrap();
    for policy in [&window, &log] {
        let left = store.check(b"u", policy, 0).await.unwrap();
        assert_eq!(left.remaining(), 1, "refunded once: {left:?}");
    }
    // Another request takes the unit given back, leaving the very states
    // the refunded one left; then the refund comes again.
    let again = consume().await;
    assert_eq!(again[0], refunded[0], "the same fixed-window state");
    let _: i64 = refund_call.invoke_async(&mut control).await.unwrap();
    for policy in [&window, &log] {
        let left = store.check(b"u", policy, 0).await.unwrap();
        assert_eq!(
            left.remaining(),
            0,
            "{}: the resend gave back another's unit: {left:?}",
            policy.name()
        );
    }
    let applied = format!("{}:applied", keys[0]);
    let ttl: i64 = server.cli(&["PTTL", &applied]).parse().unwrap();
    assert!(ttl > 0, "{applied}: PTTL {ttl}");
}

/// A permit id of the wrong length, sent to the scripts themselves, is an
/// error and changes nothing: a shorter id would match every permit it
/// begins, so a check would pass as one of theirs, and a release (here in a
/// cross-slot refund) would free them all.
#[tokio::test]
async fn a_permit_id_of_the_wrong_length_matches_no_permit() {
    let server = RedisServer::start();
    let store = redis_store(server.url()).await;
    let policy = named(
        "short-ids",
        Policy::concurrency(3, Duration::from_secs(3600)),
    );
    let held = [
        store.check(b"u", &policy, 1).await.unwrap(),
        store.check(b"u", &policy, 1).await.unwrap(),
    ];
    assert!(held.iter().all(Decision::is_allowed), "{held:?}");
    let key = store.state_key(b"u", &policy);
    let state = server.cli(&["GET", &key]);
    let prefix = held[0].permit().unwrap().to_string()[..8].to_owned();
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let check = redis::Script::new(ratelimit_core::redis::script_source(policy.algorithm()));
    let lease = 3_600_000_000u64;
    let checked: redis::RedisResult<redis::Value> = check
        .key(&key)
        .arg(1)
        .arg(3)
        .arg(lease)
        .arg(0)
        .arg(&prefix)
        .invoke_async(&mut connection)
        .await;
    assert!(checked.is_err(), "{checked:?}");
    let (_, refund) = ratelimit_core::redis::cross_slot_sources_for_tests();
    let refunded: redis::RedisResult<i64> = redis::Script::new(refund)
        .key(&key)
        .key(format!("{key}:applied"))
        .arg(0)
        .arg(format!("{:032x}", 1))
        .arg("concurrency")
        .arg(1)
        .arg(&prefix)
        .arg("")
        .arg("")
        .invoke_async(&mut connection)
        .await;
    assert!(refunded.is_err(), "{refunded:?}");
    assert_eq!(server.cli(&["GET", &key]), state, "nothing changed");
    assert_eq!(store.check(b"u", &policy, 0).await.unwrap().remaining(), 1);
}

/// Wait mode on Redis: a leaky bucket (one a second) with an hourly fixed
/// window of 5, waiting at most 100 ms. The four refused requests give back
/// what they took (an admin reward, one script each): the hourly window
/// still has 4 of 5, and the leaky bucket only the admitted request's slot.
#[tokio::test]
async fn wait_mode_refusals_give_back_every_limit_they_took_on_redis() {
    use http::{Request, StatusCode};
    use ratelimit_tests::fixtures::smooth_and_hourly;
    use ratelimit_tower::{GlobalKey, KeyExtractor};
    use tower::{Layer, ServiceExt};

    let server = RedisServer::start();
    let store = redis_store(server.url()).await;
    let (layer, smooth, hourly) = smooth_and_hourly(store.clone(), ms(100));
    let service = layer.layer(ok_service());
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let r = service.clone().oneshot(Request::new("")).await.unwrap();
        statuses.push(r.status());
    }
    assert_eq!(statuses[0], StatusCode::OK);
    assert!(
        statuses[1..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let global = GlobalKey::default().extract(&Request::new("")).unwrap();
    let hourly_left = store.peek(global.as_bytes(), &hourly).await.unwrap();
    assert_eq!(
        hourly_left.remaining(),
        4,
        "only the admitted request counts"
    );
    let smooth_left = store.peek(global.as_bytes(), &smooth).await.unwrap();
    assert_eq!(smooth_left.remaining(), 4, "{smooth_left:?}");
}

/// A refund whose reply is lost with its connection (the script ran) is
/// sent again by the store, with the id it carries: Redis remembers the
/// id, so the resend gives nothing more back. Three of four units taken,
/// one refunded: two remain under every algorithm that refunds (a refund
/// applied twice would leave three, and the sliding log would give away a
/// later request's unit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_sent_again_after_its_reply_was_lost_gives_back_once() {
    let (_server, proxy) = ratelimit_tests::fault_proxy::FaultProxy::with_new_server();
    let store = build(
        RedisStore::builder(proxy.redis_url())
            .pool_size(1)
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let refundable = long_policies(4)
        .into_iter()
        .filter(|p| p.algorithm().supports_adjustments());
    for policy in refundable {
        let what = policy.algorithm().kind();
        let mut taken = Vec::new();
        for _ in 0..3 {
            let d = store.check(b"refunded", &policy, 1).await.unwrap();
            assert!(d.is_allowed(), "{what}: {d:?}");
            taken.push(d);
        }
        // Loads the refund's script, so the refund below is one command.
        store.reward(b"other", &policy, 1).await.unwrap();
        proxy.cut_replies(1);
        store
            .refund(b"refunded", &policy, 1, &taken[0])
            .await
            .unwrap();
        assert_eq!(proxy.cuts_left(), 0, "{what}: the refund's reply was cut");
        let left = store.peek(b"refunded", &policy).await.unwrap();
        assert_eq!(left.remaining(), 2, "{what}: {left:?}");
    }
}

/// A host name that never resolves is a configuration mistake, reported by
/// `build` with the host's name (single node and cluster seeds), unless the
/// deployment allows it: then it is an outage, as a server that is down.
#[tokio::test]
async fn a_host_that_never_resolves_fails_the_build_unless_allowed() {
    let mistyped = "redis://no-such-host.invalid:6379";
    let Err(error) = RedisStore::builder(mistyped).build().await else {
        panic!("a store on a host that does not resolve was built");
    };
    assert!(!error.is_outage(), "{error}");
    assert!(
        error.to_string().contains("no-such-host.invalid"),
        "{error}"
    );
    assert!(
        error.to_string().contains("allow_unresolved_hosts"),
        "{error}"
    );

    let Err(error) = RedisStore::cluster_builder(["redis://127.0.0.1:1", mistyped])
        .build()
        .await
    else {
        panic!("a cluster store with a seed that does not resolve was built");
    };
    assert!(
        error.to_string().contains("no-such-host.invalid"),
        "{error}"
    );

    let policy = fixed_window("p", 5, Duration::from_secs(60));
    let allowed = build(
        RedisStore::builder(mistyped)
            .allow_unresolved_hosts()
            .call_timeout(ms(500)),
    )
    .await;
    let answer = allowed.check(b"k", &policy, 1).await;
    assert!(
        answer.as_ref().is_err_and(StoreError::is_outage),
        "{answer:?}"
    );

    // A server that resolves but is down at start-up builds: an outage later.
    let down = format!("redis://127.0.0.1:{}", ratelimit_tests::free_port());
    let store = build(RedisStore::builder(down).call_timeout(ms(500))).await;
    let answer = store.check(b"k", &policy, 1).await;
    assert!(
        answer.as_ref().is_err_and(StoreError::is_outage),
        "{answer:?}"
    );
}

/// Refused credentials fail the build, naming them, for a wrong password and
/// for none where the server wants one; the right password builds and
/// decides. (A server that is down at start-up still builds: above.)
#[tokio::test]
async fn refused_credentials_fail_the_build() {
    let server = RedisServer::start_with_args(&["--requirepass", "right"]);
    let port = server.port();
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let built = RedisStore::builder(url.clone())
            .call_timeout(ms(2_000))
            .build()
            .await;
        let Err(error) = built else {
            panic!("{url}: refused credentials built a store");
        };
        assert!(!error.is_outage(), "{url}: {error}");
        assert!(error.to_string().contains("credentials"), "{url}: {error}");
    }
    let store = build(
        RedisStore::builder(format!("redis://:right@127.0.0.1:{port}")).call_timeout(ms(2_000)),
    )
    .await;
    let policy = fixed_window("p", 5, Duration::from_secs(60));
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
}
