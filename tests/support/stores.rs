//! Stores on the test servers: a `RedisStore` on one server or on a cluster,
//! built with the tests' call timeout, and what the tests read back of one.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::redis::{RedisStore, RedisStoreBuilder};
use ratelimit_core::{MemoryStore, PermitId, Policy, Store, StoreError};

use crate::{RedisCluster, RedisServer};

/// The call timeout of the stores built here: long enough that a loaded
/// test machine never times a call out, short enough that a hung test ends.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a warm-up call may keep failing: the first call connects and
/// loads the scripts, which on a loaded machine can take longer than a
/// short call timeout under test.
pub const WARM_UP_LIMIT: Duration = Duration::from_secs(10);

/// Runs `call` until it answers (a connection open, the scripts loaded),
/// outside what a test measures: an outage is tried again for at most
/// [`WARM_UP_LIMIT`], any other error fails the test at once.
pub async fn warm_up<T, F>(what: &str, mut call: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + WARM_UP_LIMIT;
    loop {
        match call().await {
            Ok(value) => return value,
            Err(e) if e.is_outage() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Builds `builder`'s store (no connection is made yet).
pub async fn build(builder: RedisStoreBuilder) -> RedisStore {
    builder.build().await.expect("a Redis store")
}

/// A store on the single Redis at `url`, calls timing out after
/// [`CALL_TIMEOUT`].
pub async fn redis_store(url: impl Into<String>) -> RedisStore {
    build(RedisStore::builder(url).call_timeout(CALL_TIMEOUT)).await
}

/// A store on the single Redis at `url` whose scripts take their time from
/// `clock`, calls timing out after [`CALL_TIMEOUT`].
pub async fn redis_store_on_clock(url: impl Into<String>, clock: &ManualClock) -> RedisStore {
    build(
        RedisStore::builder(url)
            .script_clock_for_tests(clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await
}

/// `builder`'s store on a pool of `connections`, calls timing out after
/// [`CALL_TIMEOUT`].
pub async fn pooled(builder: RedisStoreBuilder, connections: u32) -> RedisStore {
    build(builder.pool_size(connections).call_timeout(CALL_TIMEOUT)).await
}

/// A store on the single Redis at `url` (often a proxy's) with
/// `connections` connections, batches of at most `max_batch` decisions (1:
/// no coalescing) and calls timing out after `call_timeout`: the set-up of
/// the tests that break, stall or kill its connections.
pub async fn small_store(
    url: impl Into<String>,
    connections: u32,
    max_batch: usize,
    call_timeout: Duration,
) -> RedisStore {
    build(
        RedisStore::builder(url)
            .pool_size(connections)
            .max_batch(max_batch)
            .call_timeout(call_timeout),
    )
    .await
}

/// A store on `cluster`, calls timing out after [`CALL_TIMEOUT`].
pub async fn cluster_store(cluster: &RedisCluster) -> RedisStore {
    build(RedisStore::cluster_builder(cluster.urls()).call_timeout(CALL_TIMEOUT)).await
}

/// Asserts that `builder()` is refused on a Redis that may evict keys (a
/// mistake that names the policy, never an outage), and builds once it
/// allows eviction.
pub async fn assert_refused_while_evicting(builder: impl Fn() -> RedisStoreBuilder) {
    let refused = builder().build().await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("volatile-lru") && !e.is_outage()),
        "{:?}",
        refused.err()
    );
    assert!(builder().allow_eviction().build().await.is_ok());
}

/// Polls the number of permits held in the semaphore at `key` (a string:
/// a tag and a 7-byte base, then 46 bytes per permit) until it is 0, for at
/// most `limit`; returns the last count, or what Redis answered when the key
/// holds no semaphore.
pub async fn permits_left(server: &RedisServer, key: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let len = server.cli(&["STRLEN", key]);
        let count = match len.trim().parse::<u64>() {
            Ok(0) => "0".to_owned(),
            Ok(n) if n >= 8 && (n - 8) % 46 == 0 => ((n - 8) / 46).to_string(),
            _ => len.trim().to_owned(),
        };
        if count == "0" || start.elapsed() > limit {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The key holds a string state (a sliding log, a semaphore) with a TTL no
/// longer than `longest` µs (plus the hour of slack the scripts add on a
/// test clock, see prelude.lua), or is gone.
pub fn assert_string_state(server: &RedisServer, key: &str, longest: u64, what: &str) {
    match server.query::<String>(&["TYPE", key]).as_str() {
        "none" => {}
        "string" => {
            let ttl: i64 = server.query(&["PTTL", key]);
            assert!(ttl > 0, "{what}: {key} has no TTL ({ttl})");
            assert!(
                ttl.unsigned_abs() <= longest.div_ceil(1000) + 3_600_000,
                "{what}: TTL {ttl}"
            );
        }
        other => panic!("{what}: {key} is a {other}"),
    }
}

/// Writes a sorted set of `(score, member)` at `key`, with an hour's TTL: a
/// state in the previous layout (a sliding log, a semaphore), as the
/// previous version of the store left it.
pub fn write_sorted_set(server: &RedisServer, key: &str, members: &[(String, String)]) {
    let mut args = vec!["ZADD", key];
    for (score, member) in members {
        args.push(score);
        args.push(member);
    }
    server.cli(&args);
    server.cli(&["PEXPIRE", key, "3600000"]);
    assert_eq!(server.cli(&["TYPE", key]), "zset");
}

/// Whether `store` admits a request of cost 1 from `key` under `policy`.
pub async fn admits<S: Store>(store: &S, key: &[u8], policy: &Policy) -> bool {
    let decision = store.check(key, policy, 1).await;
    decision.expect("the store decides").is_allowed()
}

/// Whether `store` admits a request of `cost` from `key` under `policy`
/// now; the store must decide.
pub fn admits_now<C: Clock>(
    store: &MemoryStore<C>,
    key: &[u8],
    policy: &Policy,
    cost: u64,
) -> bool {
    let decision = store.check_now(key, policy, cost);
    decision.expect("the store decides").is_allowed()
}

/// The permit that `store` takes for a request of cost 1 from `key` under
/// the concurrency `policy`, which must admit it.
pub async fn take_permit<S: Store>(store: &S, key: &[u8], policy: &Policy) -> PermitId {
    let decision = store.check(key, policy, 1).await;
    let permit = decision.expect("the store decides").permit();
    permit.expect("an admitted request holds a permit")
}

/// A boxed future, to hold several of different kinds in one vector.
pub type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Awaits every future, polling them in order on every pass: the first poll
/// of each, which queues its request, happens in the vector's order, so the
/// coalescer sends them in that order.
pub async fn join_in_order<T>(mut futures: Vec<Boxed<T>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (future, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *slot = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(out.iter_mut().map(|v| v.take().expect("ready")).collect())
        }
    })
    .await
}
