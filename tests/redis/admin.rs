//! The admin API (`AdminStore`): peek, reset, penalize, reward, block and
//! unblock, on `MemoryStore` with a manual clock and on `RedisStore` against
//! real servers (with the same manual clock given to the scripts, so both
//! stores replay one timeline and must agree decision for decision), through
//! `DeniedCache` and `FallbackStore`, on a Redis Cluster, under the
//! documented ACL, and with every Redis key's TTL audited.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    AdminStore, Check, CircuitBreaker, Decision, DeniedCache, FallbackStore, MemoryStore, Policy,
    Rate, Store, StoreError,
};
use ratelimit_tests::cluster_slot;
use ratelimit_tests::fixtures::{bounded_memory, fixed_window};
use ratelimit_tests::{
    CALL_TIMEOUT, NO_EDGE, RedisCluster, RedisServer, build, cluster_store, every_algorithm, named,
    observable, redis_store, redis_store_on_clock,
};

/// A whole second of Unix time in µs: fixed windows start at it.
const T0: u64 = 1_763_000_000_000_000;

const SECOND: u64 = 1_000_000;

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// A limit of 4 per second under every algorithm that has penalties.
fn policies() -> Vec<Policy> {
    with_penalties(4, Duration::from_secs(1), Rate::per_second(4))
}

/// [`every_algorithm`] but the ones without penalties (concurrency).
fn with_penalties(limit: u64, window: Duration, rate: Rate) -> Vec<Policy> {
    every_algorithm(limit, window, rate)
        .into_iter()
        .filter(|p| p.algorithm().supports_adjustments())
        .collect()
}

/// How long a request of cost 1 waits after a maximal penalty at a window
/// start: the window's end (fixed window), the penalty leaving the log, the
/// penalty weighing 3/8 into the next window (sliding counter: 1 s + 625 ms),
/// a bucket of debt plus one interval (token bucket, GCRA, leaky bucket).
fn retry_after_full_penalty(policy: &Policy) -> u64 {
    match policy.algorithm().kind() {
        "fixed-window" | "sliding-log" => SECOND,
        "sliding-window" => 1_625_000,
        _ => 1_250_000,
    }
}

/// A store and the clock its decisions follow.
struct Timeline<S> {
    store: S,
    clock: ManualClock,
    /// Every decision seen, to compare the two stores.
    log: Vec<(String, Decision)>,
}

impl<S: AdminStore> Timeline<S> {
    async fn check(&mut self, what: &str, key: &str, policy: &Policy, cost: u64) -> Decision {
        let d = self.store.check(key.as_bytes(), policy, cost).await;
        self.noted(what, policy, d)
    }

    /// Whether a check (logged) is allowed.
    async fn admits(&mut self, what: &str, key: &str, policy: &Policy, cost: u64) -> bool {
        self.check(what, key, policy, cost).await.is_allowed()
    }

    async fn peek(&mut self, what: &str, key: &str, policy: &Policy) -> Decision {
        let d = self.store.peek(key.as_bytes(), policy).await;
        self.noted(what, policy, d)
    }

    async fn penalize(&mut self, what: &str, key: &str, policy: &Policy, n: u64) -> Decision {
        let d = self.store.penalize(key.as_bytes(), policy, n).await;
        self.noted(what, policy, d)
    }

    async fn reward(&mut self, what: &str, key: &str, policy: &Policy, n: u64) -> Decision {
        let d = self.store.reward(key.as_bytes(), policy, n).await;
        self.noted(what, policy, d)
    }

    async fn block(&self, key: &str, policy: &Policy, duration: Duration) {
        self.store
            .block(key.as_bytes(), policy, duration)
            .await
            .unwrap();
    }

    /// The decision of an operation that must succeed, logged.
    fn noted(&mut self, what: &str, policy: &Policy, d: Result<Decision, StoreError>) -> Decision {
        let d = d.unwrap();
        self.note(what, policy, &d);
        d
    }

    fn note(&mut self, what: &str, policy: &Policy, d: &Decision) {
        self.log
            .push((format!("{} {what}", policy.name()), d.clone()));
    }

    fn advance(&self, micros: u64) {
        self.clock.advance(us(micros));
    }
}

/// Every scenario, for every policy, on one store. Each scenario asserts
/// what it is about; the decisions are logged for the comparison of stores.
async fn every_scenario<S: AdminStore>(t: &mut Timeline<S>) {
    // Each scenario starts at the next whole second, and the clock moves
    // 10 s on after it.
    macro_rules! in_turn {
        ($policy:expr => $($scenario:ident),+ $(,)?) => {$(
            next_second(t);
            $scenario(t, $policy).await;
            t.advance(10 * SECOND);
        )+};
    }
    for policy in policies() {
        in_turn!(&policy =>
            peek_consumes_nothing,
            reset_restores_the_budget,
            penalize_denies_for_the_documented_time,
            reward_gives_back_up_to_a_full_budget,
            block_denies_until_it_ends,
            unblock_ends_a_block_and_nothing_was_consumed,
            a_block_shorter_than_a_debt_waits_for_the_debt,
            a_blocked_key_denies_a_whole_check_all,
        );
    }
    concurrency_has_blocks_but_no_penalties(t).await;
}

/// Moves the clock to the next whole second, so fixed windows start there.
fn next_second<S>(t: &Timeline<S>) {
    let now = ratelimit_core::clock::Clock::now(&t.clock);
    t.clock.set(now.div_ceil(SECOND) * SECOND);
}

async fn peek_consumes_nothing<S: AdminStore>(t: &mut Timeline<S>, policy: &Policy) {
    let name = policy.name();
    let first = t.check("first", "peeked", policy, 1).await;
    assert_eq!((first.is_allowed(), first.remaining()), (true, 3), "{name}");
    for i in 0..3 {
        let peek = t.peek("peek", "peeked", policy).await;
        assert!(peek.is_allowed(), "{name}: peek {i}");
        assert_eq!(peek.remaining(), 3, "{name}: peek {i} consumed");
    }
    let second = t.check("second", "peeked", policy, 1).await;
    assert_eq!(second.remaining(), 2, "{name}: the peeks consumed");
}

async fn reset_restores_the_budget<S: AdminStore>(t: &mut Timeline<S>, policy: &Policy) {
    let name = policy.name();
    assert!(t.admits("all", "reset", policy, 4).await, "{name}");
    assert!(!t.admits("over", "reset", policy, 1).await, "{name}");
    t.store.reset(b"reset", policy).await.unwrap();
    let peek = t.peek("after reset", "reset", policy).await;
    assert_eq!(
        (
            peek.is_allowed(),
            peek.remaining(),
            peek.reset_after_micros()
        ),
        (true, 4, 0),
        "{name}"
    );
    assert!(t.admits("all again", "reset", policy, 4).await, "{name}");
}

async fn penalize_denies_for_the_documented_time<S: AdminStore>(
    t: &mut Timeline<S>,
    policy: &Policy,
) {
    let name = policy.name();
    let small = t.penalize("small", "penalized", policy, 1).await;
    assert_eq!((small.is_allowed(), small.remaining()), (true, 3), "{name}");
    // Far more than the cap: a debt of one more full budget at most.
    let penalty = t.penalize("huge", "penalized", policy, 1_000_000).await;
    assert!(
        !penalty.is_allowed(),
        "{name}: a key in debt peeks as denied"
    );
    assert_eq!(penalty.remaining(), 0, "{name}");
    let expected = retry_after_full_penalty(policy);
    let denied = t.check("after", "penalized", policy, 1).await;
    assert!(!denied.is_allowed(), "{name}");
    assert_eq!(denied.retry_after_micros(), expected, "{name}");
    // Denials consume nothing: the retry time holds to the microsecond.
    t.advance(expected - 1);
    let almost = t.check("almost", "penalized", policy, 1).await;
    assert_eq!(almost.retry_after_micros(), 1, "{name}: {almost:?}");
    t.advance(1);
    assert!(t.admits("paid", "penalized", policy, 1).await, "{name}");
}

async fn reward_gives_back_up_to_a_full_budget<S: AdminStore>(
    t: &mut Timeline<S>,
    policy: &Policy,
) {
    let name = policy.name();
    assert!(t.admits("all", "rewarded", policy, 4).await, "{name}");
    assert!(!t.admits("over", "rewarded", policy, 1).await, "{name}");
    let reward = t.reward("one", "rewarded", policy, 1).await;
    assert_eq!(
        (reward.is_allowed(), reward.remaining()),
        (true, 1),
        "{name}"
    );
    let after = t.check("after", "rewarded", policy, 1).await;
    assert!(after.is_allowed(), "{name}: {after:?}");
    let full = t.reward("plenty", "rewarded", policy, 1_000).await;
    assert_eq!(
        (full.remaining(), full.reset_after_micros()),
        (4, 0),
        "{name}: never beyond a full budget"
    );
    assert!(t.admits("all 4", "rewarded", policy, 4).await, "{name}");
    // Undoing a penalty with a reward of the same amount.
    t.advance(10 * SECOND);
    next_second(t);
    t.check("one", "undone", policy, 1).await;
    let before = t.peek("before", "undone", policy).await;
    t.penalize("three", "undone", policy, 3).await;
    let undone = t.reward("three", "undone", policy, 3).await;
    assert_eq!(observable(&undone), observable(&before), "{name}");
}

async fn block_denies_until_it_ends<S: AdminStore>(t: &mut Timeline<S>, policy: &Policy) {
    let name = policy.name();
    assert!(t.admits("before", "blocked", policy, 1).await, "{name}");
    t.block("blocked", policy, Duration::from_secs(10)).await;
    let denied = t.check("blocked", "blocked", policy, 1).await;
    assert_eq!(
        (denied.is_allowed(), denied.remaining()),
        (false, 0),
        "{name}"
    );
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_secs(10)),
        "{name}"
    );
    let peek = t.peek("peek", "blocked", policy).await;
    assert_eq!(peek.retry_after(), Some(Duration::from_secs(10)), "{name}");
    // Other keys under the policy, and the key under other policies, are free.
    assert!(t.admits("other key", "free", policy, 1).await, "{name}");
    t.advance(10 * SECOND - 1);
    let last = t.check("last µs", "blocked", policy, 1).await;
    assert_eq!(last.retry_after_micros(), 1, "{name}");
    t.advance(1);
    let after = t.check("after", "blocked", policy, 1).await;
    assert_eq!((after.is_allowed(), after.remaining()), (true, 3), "{name}");
}

async fn unblock_ends_a_block_and_nothing_was_consumed<S: AdminStore>(
    t: &mut Timeline<S>,
    policy: &Policy,
) {
    let name = policy.name();
    t.check("before", "unblocked", policy, 1).await;
    t.block("unblocked", policy, Duration::from_secs(3600))
        .await;
    for _ in 0..5 {
        assert!(!t.admits("blocked", "unblocked", policy, 1).await);
    }
    t.store.unblock(b"unblocked", policy).await.unwrap();
    let peek = t.peek("unblocked", "unblocked", policy).await;
    assert_eq!(
        (peek.is_allowed(), peek.remaining()),
        (true, 3),
        "{name}: blocked checks consumed"
    );
    assert!(t.admits("after", "unblocked", policy, 3).await, "{name}");
    // A zero duration unblocks too.
    t.block("unblocked-2", policy, Duration::from_secs(60))
        .await;
    t.block("unblocked-2", policy, Duration::ZERO).await;
    assert!(t.admits("zero", "unblocked-2", policy, 1).await, "{name}");
}

async fn a_block_shorter_than_a_debt_waits_for_the_debt<S: AdminStore>(
    t: &mut Timeline<S>,
    policy: &Policy,
) {
    let name = policy.name();
    t.penalize("debt", "both", policy, 100).await;
    t.block("both", policy, Duration::from_millis(100)).await;
    let denied = t.check("blocked in debt", "both", policy, 1).await;
    assert_eq!(
        denied.retry_after_micros(),
        retry_after_full_penalty(policy),
        "{name}: the longer of the block and the debt"
    );
}

async fn a_blocked_key_denies_a_whole_check_all<S: AdminStore>(
    t: &mut Timeline<S>,
    policy: &Policy,
) {
    let name = policy.name();
    // Same user key (one cluster slot): another policy under another name.
    let other = policy
        .clone()
        .with_name(format!("other-{}", policy.algorithm().kind()))
        .unwrap();
    t.block("group", policy, Duration::from_secs(5)).await;
    let checks = [
        Check::new(b"group", &other, 2),
        Check::new(b"group", policy, 1),
    ];
    let decisions = t.store.check_all(&checks).await.unwrap();
    assert!(decisions[0].is_allowed(), "{name}: reported as a peek");
    assert_eq!(decisions[0].remaining(), 4, "{name}");
    assert_eq!(
        (decisions[1].is_allowed(), decisions[1].retry_after_micros()),
        (false, 5 * SECOND),
        "{name}"
    );
    t.note("check_all other", &other, &decisions[0]);
    t.note("check_all blocked", policy, &decisions[1]);
    let peek = t.peek("other after", "group", &other).await;
    assert_eq!(peek.remaining(), 4, "{name}: the group consumed");
    t.store.reset(b"group", policy).await.unwrap();
    let decisions = t.store.check_all(&checks).await.unwrap();
    assert!(
        decisions.iter().all(Decision::is_allowed),
        "{name}: reset unblocks"
    );
}

async fn concurrency_has_blocks_but_no_penalties<S: AdminStore>(t: &mut Timeline<S>) {
    let policy = Policy::concurrency(2, Duration::from_secs(10)).unwrap();
    for result in [
        t.store.penalize(b"c", &policy, 1).await,
        t.store.reward(b"c", &policy, 1).await,
    ] {
        match result {
            Err(StoreError::Unsupported {
                operation,
                algorithm: "concurrency",
                ..
            }) => assert!(["penalize", "reward"].contains(&operation)),
            other => panic!("{other:?}"),
        }
    }
    let held = t.check("acquire", "c", &policy, 2).await;
    assert!(held.is_allowed());
    t.store.reset(b"c", &policy).await.unwrap();
    assert!(t.admits("after reset", "c", &policy, 2).await);
    t.block("c2", &policy, Duration::from_secs(1)).await;
    let denied = t.check("blocked", "c2", &policy, 1).await;
    assert_eq!(denied.retry_after_micros(), SECOND);
    assert!(denied.permit().is_none());
    t.advance(SECOND);
    assert!(
        t.check("unblocked", "c2", &policy, 1)
            .await
            .permit()
            .is_some()
    );
    t.advance(20 * SECOND);
}

fn memory_timeline() -> Timeline<MemoryStore<ManualClock>> {
    let clock = ManualClock::new(T0);
    Timeline {
        store: MemoryStore::builder().clock(clock.clone()).build(),
        clock,
        log: Vec::new(),
    }
}

async fn redis_timeline(server: &RedisServer) -> Timeline<RedisStore> {
    let clock = ManualClock::new(T0);
    Timeline {
        store: redis_store_on_clock(server.url(), &clock).await,
        clock,
        log: Vec::new(),
    }
}

#[tokio::test]
async fn every_operation_on_memory() {
    let mut t = memory_timeline();
    every_scenario(&mut t).await;
    assert!(t.log.len() > 200, "{} decisions", t.log.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_on_redis_and_the_same_decisions_as_memory() {
    let server = RedisServer::start();
    let mut redis = redis_timeline(&server).await;
    every_scenario(&mut redis).await;
    let mut memory = memory_timeline();
    every_scenario(&mut memory).await;
    assert_eq!(memory.log.len(), redis.log.len());
    for ((what, m), (_, r)) in memory.log.iter().zip(&redis.log) {
        assert_eq!(observable(m), observable(r), "{what}: memory vs redis");
    }
}

/// `DeniedCache` forgets a key's cached denial when a reset, a reward or an
/// unblock could have ended it, and keeps it otherwise.
async fn denied_cache_forgets<S: AdminStore>(store: S) {
    let cache = DeniedCache::new(store);
    let policy = Policy::gcra(2, Rate::per_hour(2)).unwrap();
    let denied_locally = |hits_before: u64, cache: &DeniedCache<S>| cache.hits() == hits_before + 1;

    for (round, operation) in ["reset", "reward", "unblock"].into_iter().enumerate() {
        let key = format!("cached-{round}");
        let key = key.as_bytes();
        if operation == "unblock" {
            cache
                .block(key, &policy, Duration::from_secs(60))
                .await
                .unwrap();
        } else {
            assert!(cache.check(key, &policy, 2).await.unwrap().is_allowed());
        }
        assert!(!cache.check(key, &policy, 1).await.unwrap().is_allowed());
        let hits = cache.hits();
        assert!(!cache.check(key, &policy, 1).await.unwrap().is_allowed());
        assert!(
            denied_locally(hits, &cache),
            "{operation}: the denial is cached"
        );
        // A penalty only lengthens the denial: still answered locally.
        cache.penalize(key, &policy, 1).await.unwrap();
        let hits = cache.hits();
        assert!(!cache.check(key, &policy, 1).await.unwrap().is_allowed());
        assert!(
            denied_locally(hits, &cache),
            "{operation}: kept after a penalty"
        );
        match operation {
            "reset" => cache.reset(key, &policy).await.unwrap(),
            "reward" => {
                cache.reward(key, &policy, 10).await.unwrap();
            }
            _ => cache.unblock(key, &policy).await.unwrap(),
        }
        let hits = cache.hits();
        let after = cache.check(key, &policy, 1).await.unwrap();
        assert!(after.is_allowed(), "{operation}: still denied {after:?}");
        assert_eq!(cache.hits(), hits, "{operation}");
    }
    // Peeks go to the store, and see blocks.
    cache
        .block(b"peeked", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!cache.peek(b"peeked", &policy).await.unwrap().is_allowed());
}

#[tokio::test]
async fn denied_cache_on_memory_and_redis_forgets_on_reset_reward_and_unblock() {
    denied_cache_forgets(MemoryStore::new()).await;
    let server = RedisServer::start();
    denied_cache_forgets(redis_store(server.url()).await).await;
}

/// A block goes in front of its key's state: a key that holds no string (a
/// sorted set left by an earlier layout, or anything else under the prefix)
/// is replaced by the block alone, which denies; unblocking then leaves no
/// key, and the next check starts fresh. A block of a fresh key holds the
/// block alone, with the block's TTL.
#[tokio::test]
async fn redis_a_block_replaces_a_key_that_holds_no_string() {
    let server = RedisServer::start();
    let store = redis_store(server.url()).await;
    let policy = Policy::gcra(3, Rate::per_hour(3)).unwrap();
    let state_key = store.state_key(b"odd", &policy);
    server.cli(&["RPUSH", &state_key, "not a state"]);
    store
        .block(b"odd", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(server.cli(&["TYPE", &state_key]), "string");
    let ttl: i64 = server.cli(&["PTTL", &state_key]).parse().unwrap();
    assert!((59_000..=60_000).contains(&ttl), "{ttl}");
    let d = store.check(b"odd", &policy, 1).await.unwrap();
    assert!(!d.is_allowed() && d.remaining() == 0, "{d:?}");
    store.unblock(b"odd", &policy).await.unwrap();
    assert_eq!(server.cli(&["EXISTS", &state_key]), "0");
    let d = store.check(b"odd", &policy, 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 2, "{d:?}");
    // Unblocking a key that is not blocked changes nothing.
    let before = server.cli(&["GET", &state_key]);
    store.unblock(b"odd", &policy).await.unwrap();
    assert_eq!(server.cli(&["GET", &state_key]), before);
}

#[tokio::test]
async fn arc_forwards() {
    let store = Arc::new(MemoryStore::new());
    let policy = Policy::gcra(2, Rate::per_hour(2)).unwrap();
    AdminStore::block(&store, b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(
        AdminStore::penalize(&store, b"j", &policy, 1)
            .await
            .unwrap()
            .remaining(),
        1
    );
}

#[tokio::test]
async fn fallback_store_forwards_to_the_primary_and_fails_when_it_is_down() {
    let primary = MemoryStore::new();
    let local = MemoryStore::new();
    let store = FallbackStore::new(
        primary.clone(),
        local.clone(),
        2,
        Arc::new(CircuitBreaker::default()),
    );
    let policy = Policy::gcra(4, Rate::per_hour(4)).unwrap();
    store
        .block(b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!primary.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(
        store.penalize(b"p", &policy, 3).await.unwrap().remaining(),
        1
    );
    assert_eq!(primary.peek(b"p", &policy).await.unwrap().remaining(), 1);
    assert_eq!(store.reward(b"p", &policy, 1).await.unwrap().remaining(), 2);
    store.unblock(b"k", &policy).await.unwrap();
    assert!(store.peek(b"k", &policy).await.unwrap().is_allowed());
    store.reset(b"p", &policy).await.unwrap();
    assert_eq!(primary.peek(b"p", &policy).await.unwrap().remaining(), 4);
    assert!(local.is_empty(), "the fallback was not involved");

    // A primary that is down: the operation fails, nothing falls back.
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let dead = build(
        RedisStore::builder(url)
            .connect_timeout(Duration::from_millis(200))
            .call_timeout(Duration::from_millis(300)),
    )
    .await;
    let store = FallbackStore::new(dead, local.clone(), 2, Arc::new(CircuitBreaker::default()));
    let error = store
        .block(b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(error.is_outage(), "{error}");
    assert!(store.peek(b"k", &policy).await.unwrap_err().is_outage());
    assert!(store.reset(b"k", &policy).await.unwrap_err().is_outage());
    assert!(local.is_empty());
}

#[tokio::test]
async fn memory_blocks_count_towards_max_keys_and_expire() {
    let clock = ManualClock::new(T0);
    let store = bounded_memory(3, 1, &clock);
    let policy = Policy::gcra(2, Rate::per_second(2)).unwrap();
    store.check(b"state", &policy, 1).await.unwrap();
    store
        .block(b"a", &policy, Duration::from_secs(1))
        .await
        .unwrap();
    store
        .block(b"b", &policy, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(store.len(), 3);
    // Blocking again an existing block takes no room; a new one does not fit.
    store
        .block(b"a", &policy, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(
        store.block(b"c", &policy, Duration::from_secs(1)).await,
        Err(StoreError::Full { max_keys: 3 })
    ));
    assert!(matches!(
        store.check(b"new", &policy, 1).await,
        Err(StoreError::Full { .. })
    ));
    // Once `a` (and the state) expired, there is room again.
    clock.advance(Duration::from_secs(1));
    store
        .block(b"c", &policy, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(store.len() <= 3);
    assert!(store.check(b"a", &policy, 1).await.unwrap().is_allowed());
    assert!(!store.check(b"b", &policy, 1).await.unwrap().is_allowed());
    // Unblock and reset drop blocks at once.
    store.unblock(b"b", &policy).await.unwrap();
    store.reset(b"c", &policy).await.unwrap();
    assert!(store.check(b"c", &policy, 1).await.unwrap().is_allowed());
    clock.advance(Duration::from_secs(10));
    store.check(b"a", &policy, 0).await.unwrap();
    assert!(store.len() <= 2, "{}", store.len());
}

/// With the server's own clock: a short real block, its key's TTL, and a TTL
/// on every key any operation left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_blocks_in_real_time_and_every_key_has_a_ttl() {
    let server = RedisServer::start();
    let store = build(
        RedisStore::builder(server.url())
            .prefix("admin")
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let gcra = Policy::gcra(4, Rate::per_second(4)).unwrap();
    store
        .block(b"real", &gcra, Duration::from_millis(400))
        .await
        .unwrap();
    let denied = store.check(b"real", &gcra, 1).await.unwrap();
    let retry = denied.retry_after().unwrap();
    // The server's clock runs between the calls: at most the block's length
    // (exact retry times are checked on the manual clock above).
    assert!(
        retry <= Duration::from_millis(400) && retry > Duration::ZERO,
        "{retry:?}"
    );
    // The block lives in the state key, which lives as long as the block.
    let state_key = store.state_key(b"real", &gcra);
    assert!(server.cli(&["GET", &state_key]).starts_with('b'));
    let block_ttl: i64 = server.cli(&["PTTL", &state_key]).parse().unwrap();
    assert!((0..=400).contains(&block_ttl), "{block_ttl}");
    tokio::time::sleep(retry + Duration::from_millis(20)).await;
    assert!(store.check(b"real", &gcra, 1).await.unwrap().is_allowed());
    let state = server.cli(&["GET", &state_key]);
    assert!(
        state.starts_with('g'),
        "the admission wrote its state without the ended block: {state:?}"
    );

    // A workload of every operation.
    let window = Duration::from_secs(3);
    let mut policies = with_penalties(5, window, Rate::new(5, window));
    let block = Duration::from_secs(2);
    for (i, policy) in (0u64..).zip(&policies) {
        for k in 0..6u64 {
            let key = format!("user-{k}");
            let key = key.as_bytes();
            store.check(key, policy, 1 + k % 3).await.unwrap();
            match (k + i) % 6 {
                0 => {
                    store.penalize(key, policy, 3).await.unwrap();
                }
                1 => {
                    store.penalize(key, policy, 1_000).await.unwrap();
                }
                2 => {
                    store.reward(key, policy, 2).await.unwrap();
                }
                3 => store.block(key, policy, block).await.unwrap(),
                4 => {
                    store.block(key, policy, block).await.unwrap();
                    store.penalize(key, policy, 2).await.unwrap();
                }
                _ => {
                    store.penalize(key, policy, 7).await.unwrap();
                    store.reward(key, policy, 1).await.unwrap();
                }
            }
            store.check(key, policy, 1).await.unwrap();
        }
    }
    let concurrency = Policy::concurrency(2, window).unwrap();
    store.check(b"user-0", &concurrency, 1).await.unwrap();
    store.block(b"user-0", &concurrency, block).await.unwrap();
    policies.push(concurrency);
    policies.push(gcra);

    let keys = server.cli(&["--scan", "--pattern", "*"]);
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    let blocks = keys
        .iter()
        .filter(|k| server.cli(&["GET", k]).starts_with('b'))
        .count();
    assert!(blocks >= 10, "{blocks} blocked keys in {keys:?}");
    assert!(keys.len() > 30, "{} keys", keys.len());
    for key in keys {
        let ttl: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        if ttl == -2 || ttl == 0 {
            continue; // expired between SCAN and PTTL, or expiring this millisecond
        }
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        // A state in debt matters for up to two windows; a block (shorter
        // here) keeps its key at least as long as it runs.
        let bound = 2 * window;
        assert!(
            ttl as u128 <= bound.as_millis() + 2,
            "{key}: TTL {ttl} ms, more than {bound:?}"
        );
        assert!(
            policies
                .iter()
                .any(|p| key.starts_with(&format!("admin:{}:{{", p.name()))),
            "unexpected key {key}"
        );
    }
}

/// A block keeps its key at least until it ends, and no longer than the
/// state needs once it does: an unblock, or a shorter block in its place,
/// gives the state back its own lifetime (a state back to fresh goes),
/// however long the block was, `Duration::MAX` included.
#[tokio::test]
async fn redis_an_unblock_gives_the_state_back_its_own_ttl() {
    let server = RedisServer::start();
    let store = redis_store(server.url()).await;
    let window = Duration::from_secs(60);
    let year = Duration::from_secs(365 * 86_400);
    let pttl = |key: &str| -> i64 { server.cli(&["PTTL", key]).parse().unwrap() };
    for policy in every_algorithm(5, window, Rate::new(5, window)) {
        let name = policy.name().to_owned();
        for block in [year, Duration::MAX] {
            let state_key = store.state_key(b"user", &policy);
            store.reset(b"user", &policy).await.unwrap();
            assert!(store.check(b"user", &policy, 2).await.unwrap().is_allowed());
            store.block(b"user", &policy, block).await.unwrap();
            assert!(pttl(&state_key) > 300 * 86_400 * 1_000, "{name}: {block:?}");
            store.unblock(b"user", &policy).await.unwrap();
            // The state's own lifetime: until the budget is full again, at
            // most two windows (the sliding window counter's previous
            // window weighs in the next). The peek first: the TTL read
            // after it has only run down since.
            let full_in = store.peek(b"user", &policy).await.unwrap().reset_after();
            let ttl = pttl(&state_key);
            assert!(ttl > 0, "{name}: {block:?}: TTL {ttl}");
            assert!(
                ttl as u128 <= full_in.as_millis() + 1 && full_in <= 2 * window,
                "{name}: {block:?}: TTL {ttl} ms after the unblock, full in {full_in:?}"
            );
            // The state decides as before the block.
            let d = store.check(b"user", &policy, 1).await.unwrap();
            assert!(d.is_allowed() && d.remaining() == 2, "{name}: {d:?}");

            // A short block in place of a long one: the key lives until
            // the later of its end and the state's.
            store.block(b"user", &policy, block).await.unwrap();
            store
                .block(b"user", &policy, Duration::from_secs(1))
                .await
                .unwrap();
            let ttl = pttl(&state_key);
            assert!(
                ttl > 0 && ttl as u128 <= 2 * window.as_millis() + 1,
                "{name}: {block:?}: TTL {ttl} ms under a 1 s block"
            );
            assert!(!store.check(b"user", &policy, 1).await.unwrap().is_allowed());
        }
        // A fresh key blocked for a year and unblocked leaves no key.
        store.block(b"fresh", &policy, year).await.unwrap();
        store.unblock(b"fresh", &policy).await.unwrap();
        let fresh_key = store.state_key(b"fresh", &policy);
        assert_eq!(server.cli(&["EXISTS", &fresh_key]), "0", "{name}");
    }
    // Another algorithm's state under the name, which the policy cannot
    // read: it stays, with at most the policy's longest lifetime (two
    // windows) once unblocked.
    let window_policy = named(
        "shared",
        Policy::fixed_window(5, Duration::from_secs(3_600)),
    );
    let bucket = named("shared", Policy::token_bucket(5, Rate::new(5, window)));
    assert!(
        store
            .check(b"user", &window_policy, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    store.block(b"user", &bucket, year).await.unwrap();
    store.unblock(b"user", &bucket).await.unwrap();
    let state_key = store.state_key(b"user", &bucket);
    assert!(server.cli(&["GET", &state_key]).starts_with('f'));
    let ttl = pttl(&state_key);
    assert!(ttl > 0 && ttl as u128 <= 2 * window.as_millis(), "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_blocks_keys_in_their_own_slot() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster).await;
    let hourly = fixed_window("hourly", 3, NO_EDGE);
    let per_day = named("per-day", Policy::gcra(5, Rate::per_hour(1)));
    let users: Vec<String> = (0..12).map(|i| format!("tenant-{i}")).collect();
    let mut slots = std::collections::HashSet::new();
    for user in &users {
        let key = user.as_bytes();
        let state = store.state_key(key, &hourly);
        slots.insert(cluster_slot(state.as_bytes()));

        store.check(key, &per_day, 1).await.unwrap();
        store
            .block(key, &hourly, Duration::from_secs(60))
            .await
            .unwrap();
        let denied = store.check(key, &hourly, 1).await.unwrap();
        assert!(!denied.is_allowed(), "{user}");
        assert!(denied.retry_after().unwrap() > Duration::from_secs(59));
        // One slot, one script: the blocked limit denies the other too.
        let both = store
            .check_all(&[Check::new(key, &per_day, 1), Check::new(key, &hourly, 1)])
            .await
            .unwrap();
        assert!(both[0].is_allowed() && !both[1].is_allowed(), "{user}");
        assert_eq!(both[0].remaining(), 4, "{user}: per-day consumed");
        assert_eq!(
            store.penalize(key, &per_day, 2).await.unwrap().remaining(),
            2
        );
        assert_eq!(store.reward(key, &per_day, 1).await.unwrap().remaining(), 3);
    }
    assert!(slots.len() > 1, "keys on one slot only");

    // Across slots: a blocked key in one slot denies the group, and the
    // other slot's consumption is refunded.
    let slot = |user: &String| cluster_slot(store.state_key(user.as_bytes(), &hourly).as_bytes());
    let a = users[0].as_bytes();
    let b = users
        .iter()
        .find(|u| slot(u) != slot(&users[0]))
        .expect("two slots")
        .as_bytes();
    store.reset(b, &hourly).await.unwrap();
    let group = store
        .check_all(&[Check::new(a, &hourly, 1), Check::new(b, &hourly, 1)])
        .await
        .unwrap();
    assert!(!group[0].is_allowed());
    assert_eq!(
        store.peek(b, &hourly).await.unwrap().remaining(),
        3,
        "refunded"
    );

    for user in &users {
        let key = user.as_bytes();
        store.unblock(key, &hourly).await.unwrap();
        assert!(store.check(key, &hourly, 1).await.unwrap().is_allowed());
        store.reset(key, &per_day).await.unwrap();
        assert_eq!(store.peek(key, &per_day).await.unwrap().remaining(), 5);
    }
    // Every key left has a TTL.
    for node in 0..3 {
        for key in cluster
            .cli(node, &["--scan"])
            .lines()
            .filter(|l| !l.is_empty())
        {
            let ttl: i64 = cluster.cli(node, &["PTTL", key]).parse().unwrap();
            // -1 is a key without a TTL; 0 expires this millisecond, -2 is gone.
            assert!(ttl >= 0 || ttl == -2, "{key}: {ttl}");
        }
    }
}

/// The least-privileged user of SECURITY.md runs every admin operation.
#[tokio::test]
async fn the_documented_acl_runs_every_admin_operation() {
    let server = RedisServer::start_with_args(&[
        "--user",
        "limiter",
        "on",
        ">limiter-pw",
        "~ratelimit:*",
        "resetchannels",
        "-@all",
        "+evalsha",
        "+eval",
        "+time",
        "+get",
        "+pttl",
        "+set",
        "+pexpire",
        "+del",
        "+zrange",
        "+ping",
    ]);
    let url = format!("redis://limiter:limiter-pw@127.0.0.1:{}", server.port());
    let store = redis_store(url).await;
    for policy in policies() {
        let name = policy.name();
        store.check(b"k", &policy, 1).await.unwrap();
        store.peek(b"k", &policy).await.unwrap();
        assert!(
            !store.penalize(b"k", &policy, 9).await.unwrap().is_allowed(),
            "{name}"
        );
        assert!(
            store.reward(b"k", &policy, 9).await.unwrap().is_allowed(),
            "{name}"
        );
        store
            .block(b"k", &policy, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            !store.check(b"k", &policy, 1).await.unwrap().is_allowed(),
            "{name}"
        );
        store.unblock(b"k", &policy).await.unwrap();
        store
            .block(b"k", &policy, Duration::from_secs(5))
            .await
            .unwrap();
        store.reset(b"k", &policy).await.unwrap();
        assert!(
            store.check(b"k", &policy, 1).await.unwrap().is_allowed(),
            "{name}"
        );
    }
}
