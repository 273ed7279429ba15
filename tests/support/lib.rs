//! Test support for the workspace's integration tests: free loopback ports,
//! child processes that are stopped on drop, the `tracing` events a test
//! logged ([`events`]), the example binaries ([`examples`]), requests to them over loopback ([`loopback`]), in-process
//! fixtures for the layer ([`fixtures`]), real Redis servers and clusters
//! ([`redis_server`]), a Redis Sentinel set-up ([`sentinels`]) and stores on
//! them ([`stores`]).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod events;
pub mod examples;
pub mod fault_proxy;
pub mod faulty;
pub mod fixtures;
pub mod loopback;
pub mod metrics;
pub mod redis_server;
pub mod sentinels;
pub mod stores;

pub use examples::{
    CLAP_FOOTER, Listening, assert_refuses_flags, example_binary, flags, spawn_example,
    spawn_example_lines, spawn_listening, spawn_listening_with_env, spawn_on_env_port,
};
pub use redis_server::{Certificates, RedisCluster, RedisServer, cluster_slot};
pub use sentinels::RedisSentinels;
pub use stores::{
    Boxed, CALL_TIMEOUT, admits, admits_now, assert_string_state, build, cluster_store,
    join_in_order, permits_left, pooled, redis_store, redis_store_on_clock, small_store,
    take_permit, warm_up, write_sorted_set,
};

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::{RedisStore, RedisStoreBuilder};
use ratelimit_core::{Decision, MemoryStore, Policy, PolicyError, Rate, Store};

/// A `MemoryStore` and the `RedisStore` `redis` builds, both on `clock` (the
/// scripts take their time from it), to replay one timeline through both.
pub async fn twin_stores(
    redis: RedisStoreBuilder,
    clock: &ManualClock,
) -> (MemoryStore<ManualClock>, RedisStore) {
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let redis = redis
        .script_clock_for_tests(clock.clone())
        .call_timeout(CALL_TIMEOUT);
    (memory, build(redis).await)
}

/// A whole second of Unix time plus 1 µs, in µs: around the current time, so
/// the scripts see realistic magnitudes.
pub const NOW_MICROS: u64 = 1_763_000_000_000_001;

/// The largest limit, capacity or maximum a policy takes, as its
/// constructors document it (2^40).
pub const MAX_LIMIT: u64 = 1 << 40;

/// The slots a sliding log's window is cut into above a limit of as many:
/// a key's log never holds more than twice as many entries (the bound
/// `ratelimit_core::algorithm::sliding_window_log` documents).
pub const LOG_SLOTS: u64 = 1024;

/// The work a `RedisStore` sends as one call unless told otherwise, as
/// `RedisStoreBuilder::max_batch` documents it.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// A new Redis server, a clock at `t0` µs and [`twin_stores`] on both.
pub async fn twins_at(
    t0: u64,
) -> (
    RedisServer,
    ManualClock,
    MemoryStore<ManualClock>,
    RedisStore,
) {
    let server = RedisServer::start();
    let clock = ManualClock::new(t0);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    (server, clock, memory, redis)
}

/// Small policies of every algorithm (100 ms windows, limits of 3 to 7), so
/// random timelines reach every branch of every algorithm.
pub fn small_policies() -> Vec<Policy> {
    let ms = Duration::from_millis;
    vec![
        Policy::fixed_window(5, ms(100)).unwrap(),
        Policy::sliding_window_log(5, ms(100)).unwrap(),
        Policy::sliding_window_counter(7, ms(100)).unwrap(),
        Policy::token_bucket(4, Rate::new(3, ms(100))).unwrap(),
        Policy::gcra(4, Rate::new(3, ms(100))).unwrap(),
        Policy::leaky_bucket(3, Rate::new(10, ms(100))).unwrap(),
        Policy::concurrency(3, ms(100)).unwrap(),
    ]
}

/// `policy`, which must be valid, named `name`.
pub fn named<E: std::fmt::Debug>(name: impl Into<String>, policy: Result<Policy, E>) -> Policy {
    policy
        .expect("a valid policy")
        .with_name(name)
        .expect("a valid policy name")
}

/// A window of 1,000 days: no window edge of the real clock falls between
/// the checks of a test (windows are aligned on the clock, so a short one
/// may end between two checks and restart its count).
pub const NO_EDGE: Duration = Duration::from_secs(86_400_000);

/// Every algorithm with long windows: nothing refills while a test runs,
/// and no window edge falls in it. Half of [`NO_EDGE`], 500 days: a sliding
/// window counter takes at most 2^52 µs of limit times window, so limits up
/// to 104 fit.
pub fn long_policies(limit: u64) -> Vec<Policy> {
    every_algorithm(limit, NO_EDGE / 2, Rate::per_hour(1))
}

/// One policy of every algorithm, in the order of [`small_policies`]: the
/// windows and the concurrency lease `window`, the buckets refilling at `rate`.
pub fn every_algorithm(limit: u64, window: Duration, rate: Rate) -> Vec<Policy> {
    try_every_algorithm(limit, window, rate)
        .into_iter()
        .map(|policy| policy.expect("valid"))
        .collect()
}

/// What building each policy of [`every_algorithm`] answers, for numbers
/// that some algorithms may refuse; concurrency last.
pub fn try_every_algorithm(
    limit: u64,
    window: Duration,
    rate: Rate,
) -> [Result<Policy, PolicyError>; 7] {
    [
        Policy::fixed_window(limit, window),
        Policy::sliding_window_log(limit, window),
        Policy::sliding_window_counter(limit, window),
        Policy::token_bucket(limit, rate),
        Policy::gcra(limit, rate),
        Policy::leaky_bucket(limit, rate),
        Policy::concurrency(limit, window),
    ]
}

/// 64 tasks check `key` 4 times each under every policy of
/// [`long_policies`] with a limit of 100: exactly 100 pass under each.
pub async fn admit_exactly_the_limit(store: &RedisStore, key: &'static str) {
    const LIMIT: u64 = 100;
    for policy in long_policies(LIMIT) {
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (store, policy, admitted) = (store.clone(), policy.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    if store
                        .check(key.as_bytes(), &policy, 1)
                        .await
                        .unwrap()
                        .is_allowed()
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), LIMIT, "{}", policy.name());
    }
}

/// Decides on `store` through a restart of `server`: the connections die
/// with it and its script cache and data are lost, yet no call fails.
pub async fn decide_through_a_restart(store: &RedisStore, server: &mut RedisServer) {
    let policy = Policy::gcra(10, Rate::per_hour(1)).expect("valid");
    for _ in 0..4 {
        store.check(b"k", &policy, 1).await.unwrap();
    }
    server.restart();
    assert_counts_down(store, b"k", &policy, 4, 9, "state kept through the restart").await;
}

/// Checks `key` under `policy` `calls` times on `store`: each call is
/// decided and admitted, the first leaving `first` units, each next one
/// fewer.
pub async fn assert_counts_down(
    store: &RedisStore,
    key: &[u8],
    policy: &Policy,
    calls: u64,
    first: u64,
    what: &str,
) {
    for i in 0..calls {
        let d = store
            .check(key, policy, 1)
            .await
            .unwrap_or_else(|e| panic!("{what}, call {i}: {e}"));
        assert!(d.is_allowed(), "{what}, call {i}: {d:?}");
        assert_eq!(d.remaining(), first - i, "{what}, call {i}: {d:?}");
    }
}

/// What [`observable`] keeps of a decision.
pub type Observed = (bool, u64, u64, u64, u64, u64, bool);

/// Everything observable of a decision, to compare two stores: allowed,
/// limit, remaining, reset, retry, delay, and whether it holds a permit (the
/// ids differ between stores by design).
pub fn observable(d: &Decision) -> Observed {
    (
        d.is_allowed(),
        d.limit(),
        d.remaining(),
        d.reset_after_micros(),
        d.retry_after_micros(),
        d.delay_micros(),
        d.permit().is_some(),
    )
}

/// What a loaded test machine may add to a time bound that a real server or
/// process makes unavoidable (a timeout firing on a real socket): scheduling
/// on two busy cores, never a timeout's worth of waiting. Bounds that use
/// it stay well below what they guard against (a second timeout, a pool's
/// 30 s wait, a call that hangs).
pub const SLACK: Duration = Duration::from_secs(1);

/// Asserts that less than `bound` plus [`SLACK`] has passed since `started`.
#[track_caller]
pub fn assert_within_slack(started: Instant, bound: Duration) {
    let took = started.elapsed();
    assert!(
        took < bound + SLACK,
        "took {took:?}, bound {bound:?} + {SLACK:?}"
    );
}

/// A free TCP port on 127.0.0.1 (bound, then released, so a child can take
/// it). Taken below Linux's ephemeral ports (32768 on), which the tests'
/// own client connections take: a port the system handed out could be a
/// client's source port by the time the child binds it. Each call of a
/// process tries the next port, from a start of its own, so two calls
/// never hand out the same one.
pub fn free_port() -> u16 {
    const FIRST: u16 = 10_000;
    const SPAN: u16 = 20_000;
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let start = u16::try_from(std::process::id() % u32::from(SPAN)).unwrap_or(0);
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = FIRST + start.wrapping_add(n) % SPAN;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port from {FIRST} to {}", FIRST + SPAN - 1);
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    /// Spawns `command`.
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        Ok(ChildGuard {
            child: command.spawn()?,
        })
    }

    /// The process.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until something accepts TCP connections on `addr`, for at most `limit`.
pub fn wait_for_port(addr: SocketAddr, limit: Duration) {
    let start = Instant::now();
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            start.elapsed() < limit,
            "nothing listened on {addr} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
