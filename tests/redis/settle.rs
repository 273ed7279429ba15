//! Settlements (`Store::settle`): a request reserves an estimate with
//! `check_all`, then settles every limit to its actual cost. `MemoryStore`,
//! a single Redis and a Redis Cluster replay one timeline on one manual
//! clock and must agree decision for decision; a settlement sent twice is
//! applied once; all or nothing across limits; every Redis key keeps a TTL;
//! many tasks reserving and settling shared keys at once admit nothing
//! beyond the documented debt; and the store combinators settle where the
//! reservation was decided.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::response::IntoResponse;
use http::StatusCode;
use ratelimit_axum::Limiter;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    AdminStore, Check, Decision, DeniedCache, LeasedStore, MemoryStore, Policy, Rate, Settle,
    SettlementId, Store, StoreError,
};
use ratelimit_tests::{
    Boxed, NO_EDGE, NOW_MICROS, Observed, RedisCluster, RedisServer, build, cluster_slot, named,
    observable, redis_store_on_clock, small_policies,
};

use crate::shared::cluster_store_on_clock;

/// Whatever a store answered, as the stores are compared.
type Answer = Result<Vec<Observed>, String>;

fn answer(result: Result<Vec<Decision>, StoreError>) -> Answer {
    result
        .map(|ds| ds.iter().map(observable).collect())
        .map_err(|e| e.kind().to_owned())
}

/// The three stores of one timeline, on one clock.
struct Stores {
    clock: ManualClock,
    memory: MemoryStore<ManualClock>,
    single: RedisStore,
    cluster: RedisStore,
}

impl Stores {
    async fn new(server: &RedisServer, cluster: &RedisCluster) -> Stores {
        let clock = ManualClock::new(NOW_MICROS);
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let single = redis_store_on_clock(server.url(), &clock).await;
        let cluster = cluster_store_on_clock(cluster, &clock).await;
        Stores {
            clock,
            memory,
            single,
            cluster,
        }
    }

    /// `check_all` on every store: the memory store's decisions, once the
    /// others agreed with them. (A request the cluster denies across slots
    /// reports a peek for the limits of the slots it did not reach, where
    /// the other stores report each limit's own decision: there, only the
    /// denial is compared.)
    async fn check_all(&self, what: &str, checks: &[Check<'_>]) -> Vec<Decision> {
        let memory = self.memory.check_all(checks).await.expect(what);
        let single = self.single.check_all(checks).await.expect(what);
        let cluster = self.cluster.check_all(checks).await.expect(what);
        let expected: Vec<Observed> = memory.iter().map(observable).collect();
        let observed = |ds: &[Decision]| ds.iter().map(observable).collect::<Vec<_>>();
        assert_eq!(observed(&single), expected, "single node, {what}");
        if memory.iter().all(Decision::is_allowed) {
            assert_eq!(observed(&cluster), expected, "cluster, {what}");
        } else {
            assert!(!cluster.iter().all(Decision::is_allowed), "cluster, {what}");
        }
        memory
    }

    /// `settle` on every store under `id`; they must agree.
    async fn settle(&self, what: &str, id: SettlementId, settles: &[Settle<'_>]) -> Answer {
        let memory = answer(self.memory.settle(id, settles).await);
        let single = answer(self.single.settle(id, settles).await);
        let cluster = answer(self.cluster.settle(id, settles).await);
        assert_eq!(single, memory, "single node, {what}");
        assert_eq!(cluster, memory, "cluster, {what}");
        memory
    }

    fn advance(&self, micros: u64) {
        self.clock.advance(Duration::from_micros(micros));
    }
}

/// A small deterministic generator (xorshift), so a failing timeline can be
/// replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let n = u64::try_from(items.len()).expect("a short list");
        &items[usize::try_from(self.below(n)).expect("an index")]
    }
}

/// The policies with settlements among the small ones (every algorithm but
/// concurrency, windows of 100 ms).
fn settling_policies() -> Vec<Policy> {
    small_policies()
        .into_iter()
        .filter(Policy::supports_settlement)
        .collect()
}

/// One timeline through the three stores: requests of one to three limits
/// (a user key's, the same user key under another policy, a key shared by
/// every user: one slot or several on the cluster) reserve an estimate and
/// settle to an actual cost below, equal to or far above it, some
/// settlements sent again under the same id; plain checks and peeks in
/// between; the clock moving by up to half a window. Every answer of every
/// store is compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_single_node_and_cluster_agree_on_one_timeline() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let stores = Stores::new(&server, &cluster).await;
    let policies = settling_policies();
    let users: [&[u8]; 3] = [b"alice", b"bob", b"carol"];
    let shared: &[u8] = b"everyone";
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut settled, mut in_debt, mut resent, mut cross_slot) = (0, 0, 0, 0);
    for step in 0..400 {
        match rng.below(10) {
            0..=5 => {
                let user = *rng.pick(&users);
                let mine = rng.pick(&policies);
                let other = rng.pick(&policies);
                let everyone = rng.pick(&policies);
                let mut limits: Vec<(&[u8], &Policy)> = vec![(user, mine)];
                if rng.below(2) == 0 {
                    limits.push((shared, everyone));
                }
                if other.name() != mine.name() && rng.below(2) == 0 {
                    limits.push((user, other));
                }
                let most = limits.iter().map(|(_, p)| p.max_cost()).min().unwrap_or(1);
                let estimate = 1 + rng.below(most);
                let checks: Vec<Check<'_>> = limits
                    .iter()
                    .map(|(k, p)| Check::new(k, p, estimate))
                    .collect();
                let what = format!("step {step}: reserve {estimate} of {limits:?}");
                let reserved = stores.check_all(&what, &checks).await;
                if !reserved.iter().all(Decision::is_allowed) {
                    continue;
                }
                let actual = match rng.below(4) {
                    0 => estimate,
                    1 => rng.below(estimate),
                    _ => estimate + rng.below(3 * most),
                };
                let settles: Vec<Settle<'_>> = limits
                    .iter()
                    .zip(&reserved)
                    .map(|((k, p), d)| Settle::new(k, p, estimate, actual, d))
                    .collect();
                let id = SettlementId::random();
                let what = format!("step {step}: settle {estimate} -> {actual} of {limits:?}");
                let after = stores.settle(&what, id, &settles).await.expect(&what);
                settled += 1;
                in_debt += usize::from(after.iter().any(|d| !d.0));
                let slots: std::collections::HashSet<u16> = limits
                    .iter()
                    .map(|(k, p)| cluster_slot(stores.cluster.state_key(k, p).as_bytes()))
                    .collect();
                cross_slot += usize::from(slots.len() > 1);
                if rng.below(4) == 0 {
                    // Sent again: nothing changes, in any store.
                    let again = stores.settle(&format!("{what}, again"), id, &settles).await;
                    assert_eq!(again, Ok(after), "{what}: sent again");
                    resent += 1;
                }
            }
            6 | 7 => stores.advance(1 + rng.below(50_000)),
            8 => {
                let user = *rng.pick(&users);
                let policy = rng.pick(&policies);
                let what = format!("step {step}: check {user:?} {}", policy.name());
                stores
                    .check_all(&what, &[Check::new(user, policy, 1)])
                    .await;
            }
            _ => {
                let policy = rng.pick(&policies);
                let what = format!("step {step}: peek {}", policy.name());
                stores
                    .check_all(&what, &[Check::new(shared, policy, 0)])
                    .await;
            }
        }
    }
    // The timeline went where it should.
    assert!(settled > 100, "{settled} settlements");
    assert!(in_debt > 20, "{in_debt} settlements into debt");
    assert!(resent > 20, "{resent} resent");
    assert!(cross_slot > 50, "{cross_slot} across slots");

    // Every key written has a TTL, on the single node and every master.
    let mut audited = 0;
    let mut audit = |cli: &dyn Fn(&[&str]) -> String| {
        let keys = cli(&["--scan", "--pattern", "*"]);
        for key in keys.lines().filter(|l| !l.is_empty()) {
            let ttl: i64 = cli(&["PTTL", key]).trim().parse().unwrap_or(-3);
            assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
            audited += 1;
        }
    };
    audit(&|args| server.cli(args));
    for node in 0..cluster.nodes().len() {
        audit(&|args| cluster.cli(node, args));
    }
    assert!(audited > 20, "{audited} keys audited");
}

/// The documented example: a token bucket of 1,000 per minute, a request
/// that reserved 1 and cost 1,200. The next request is denied until the
/// debt of 200 tokens (60 ms each) is paid and its own token earned, on
/// both stores.
#[tokio::test]
async fn a_debt_is_waited_out_on_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new(NOW_MICROS);
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let redis = redis_store_on_clock(server.url(), &clock).await;
    let policy = named(
        "tokens",
        Policy::token_bucket(1_000, Rate::per_minute(1_000)),
    );
    for store in [&memory as &dyn SettleStore, &redis] {
        let reserved = store.reserve(&[Check::new(b"k", &policy, 1)]).await;
        let settles = [Settle::new(b"k", &policy, 1, 1_200, &reserved[0])];
        let after = store.settle_once(&settles).await;
        assert!(!after[0].is_allowed());
        let next = store.reserve(&[Check::new(b"k", &policy, 1)]).await;
        assert_eq!(next[0].retry_after(), Some(Duration::from_millis(12_060)));
    }
    clock.advance(Duration::from_millis(12_060));
    for store in [&memory as &dyn SettleStore, &redis] {
        let paid = store.reserve(&[Check::new(b"k", &policy, 1)]).await;
        assert!(paid[0].is_allowed());
    }
}

/// The stores as one object, to run one scenario on each.
trait SettleStore: Sync {
    fn reserve(&self, checks: &[Check<'_>]) -> Boxed<Vec<Decision>>;
    fn settle_once(&self, settles: &[Settle<'_>]) -> Boxed<Vec<Decision>>;
}

impl<S: Store> SettleStore for S {
    fn reserve(&self, checks: &[Check<'_>]) -> Boxed<Vec<Decision>> {
        let call = self.check_all(checks);
        Box::pin(async move { call.await.expect("decided") })
    }

    fn settle_once(&self, settles: &[Settle<'_>]) -> Boxed<Vec<Decision>> {
        let call = self.settle(SettlementId::random(), settles);
        Box::pin(async move { call.await.expect("settled") })
    }
}

/// On Redis: the same settlement sent twice is applied once, its id kept
/// beside the state with the state's lifetime; a conflict on one limit
/// settles none; a concurrency policy is refused.
#[tokio::test]
async fn redis_settles_once_all_or_nothing() {
    let server = RedisServer::start();
    let store = ratelimit_tests::redis_store(server.url()).await;
    let hourly = named("hourly", Policy::fixed_window(100, NO_EDGE));
    let bucket = named("bucket", Policy::gcra(100, Rate::per_hour(100)));
    let checks = [
        Check::new(b"user", &hourly, 10),
        Check::new(b"user", &bucket, 10),
    ];
    let reserved = store.check_all(&checks).await.unwrap();
    let settles = [
        Settle::new(b"user", &hourly, 10, 40, &reserved[0]),
        Settle::new(b"user", &bucket, 10, 2, &reserved[1]),
    ];
    let id = SettlementId::random();
    let first = store.settle(id, &settles).await.unwrap();
    assert_eq!(first[0].remaining(), 60);
    assert_eq!(first[1].remaining(), 98);
    let again = store.settle(id, &settles).await.unwrap();
    assert_eq!(again[0].remaining(), 60, "applied twice");
    assert_eq!(again[1].remaining(), 98, "applied twice");
    // The id lives as long as the state: the window, or the bucket's hour.
    let hour = Duration::from_secs(3600);
    for (policy, longest) in [(&hourly, NO_EDGE), (&bucket, hour)] {
        let applied = format!("{}:applied", store.state_key(b"user", policy));
        assert!(
            server.cli(&["GET", &applied]).contains(&id.to_string()),
            "{applied}"
        );
        let ttl: i64 = server.cli(&["PTTL", &applied]).parse().unwrap();
        assert!(
            ttl > 0 && ttl as u128 <= longest.as_millis(),
            "{applied}: PTTL {ttl}"
        );
    }

    // Another algorithm's state under `bucket`'s name: nothing settles.
    server.cli(&[
        "SET",
        &store.state_key(b"other", &bucket),
        "f1 1",
        "PX",
        "60000",
    ]);
    let allowed = Decision::allow(100, 100, 0);
    let conflicting = [
        Settle::new(b"user", &hourly, 0, 30, &allowed),
        Settle::new(b"other", &bucket, 0, 30, &allowed),
    ];
    assert!(matches!(
        store.settle(SettlementId::random(), &conflicting).await,
        Err(StoreError::PolicyConflict { policy }) if policy == "bucket"
    ));
    let semaphore = named("sem", Policy::concurrency(3, Duration::from_secs(1)));
    let refused = [
        Settle::new(b"user", &hourly, 0, 30, &allowed),
        Settle::new(b"user", &semaphore, 0, 1, &allowed),
    ];
    assert!(matches!(
        store.settle(SettlementId::random(), &refused).await,
        Err(StoreError::Unsupported {
            operation: "settle",
            ..
        })
    ));
    let peek = store.check(b"user", &hourly, 0).await.unwrap();
    assert_eq!(peek.remaining(), 60, "a failed settlement changed a limit");
}

/// On a Redis Cluster, a settlement across slots that reached one slot
/// only (here: its part in that slot sent alone first) is completed by
/// sending it again under its id: the slot that had it changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_settlement_sent_again_completes_the_slots_it_missed() {
    let cluster = RedisCluster::start();
    let store = ratelimit_tests::cluster_store(&cluster).await;
    let per_user = named("per-user", Policy::token_bucket(50, Rate::per_hour(50)));
    let global = named("global", Policy::fixed_window(500, NO_EDGE));
    let slot = |key: &[u8], policy: &Policy| cluster_slot(store.state_key(key, policy).as_bytes());
    assert_ne!(slot(b"alice", &per_user), slot(b"all", &global));
    let reserved = store
        .check_all(&[
            Check::new(b"alice", &per_user, 5),
            Check::new(b"all", &global, 5),
        ])
        .await
        .unwrap();
    let settles = [
        Settle::new(b"alice", &per_user, 5, 20, &reserved[0]),
        Settle::new(b"all", &global, 5, 20, &reserved[1]),
    ];
    let id = SettlementId::random();
    let partial = store.settle(id, &settles[..1]).await.unwrap();
    assert_eq!(partial[0].remaining(), 30);
    let whole = store.settle(id, &settles).await.unwrap();
    assert_eq!(
        whole[0].remaining(),
        30,
        "the slot that had it settled again"
    );
    assert_eq!(whole[1].remaining(), 480);
}

/// Many tasks reserve an estimate of 2 under two limits (their user's and
/// one shared by all) and settle to costs of 0 to 4, at once, on a clock
/// that does not move. Nothing refills, so:
///
/// - every store counts exactly what the admitted requests really cost
///   (no settlement lost or applied twice under contention; the cluster's
///   cross-slot reservations, refunded when a later slot denies, may count
///   more, never less);
/// - what they really cost stays within the documented debt: the limit,
///   plus what the requests in flight when the last one was admitted (one
///   per task) cost above their estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_admit_nothing_beyond_the_documented_debt() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(NOW_MICROS);
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let single = redis_store_on_clock(server.url(), &clock).await;
    let on_cluster = cluster_store_on_clock(&cluster, &clock).await;
    contend(Arc::new(memory), true).await;
    contend(Arc::new(single), true).await;
    contend(Arc::new(on_cluster), false).await;
}

const TASKS: u64 = 16;
const ROUNDS: u64 = 25;
const ESTIMATE: u64 = 2;
const MOST_ABOVE: u64 = 2;

async fn contend<S: Store>(store: Arc<S>, exact: bool) {
    // Per user: GCRA, burst 60; shared: a token bucket of 200. One unit an
    // hour: nothing refills while the test runs, whatever the clock.
    let per_user = named("contended-user", Policy::gcra(60, Rate::per_hour(1)));
    let shared = named(
        "contended-all",
        Policy::token_bucket(200, Rate::per_hour(1)),
    );
    let users = 4;
    let spent: Arc<Vec<AtomicU64>> = Arc::new((0..=users).map(|_| AtomicU64::new(0)).collect());
    let denied = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (store, spent, denied) = (Arc::clone(&store), Arc::clone(&spent), Arc::clone(&denied));
        let (per_user, shared) = (per_user.clone(), shared.clone());
        tasks.push(tokio::spawn(async move {
            let user = task % users;
            let key = format!("user-{user}");
            let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (task + 1));
            for _ in 0..ROUNDS {
                let checks = [
                    Check::new(key.as_bytes(), &per_user, ESTIMATE),
                    Check::new(b"all", &shared, ESTIMATE),
                ];
                let reserved = store.check_all(&checks).await.expect("decided");
                if !reserved.iter().all(Decision::is_allowed) {
                    denied.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                    continue;
                }
                let actual = rng.below(ESTIMATE + MOST_ABOVE + 1);
                let settles = [
                    Settle::new(key.as_bytes(), &per_user, ESTIMATE, actual, &reserved[0]),
                    Settle::new(b"all", &shared, ESTIMATE, actual, &reserved[1]),
                ];
                store
                    .settle(SettlementId::random(), &settles)
                    .await
                    .expect("settled");
                spent[usize::try_from(user).unwrap()].fetch_add(actual, Ordering::Relaxed);
                spent[usize::try_from(users).unwrap()].fetch_add(actual, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let counted = |key: &[u8], policy: &Policy| {
        let store = Arc::clone(&store);
        let (key, policy) = (key.to_vec(), policy.clone());
        async move {
            let peek = store.check(&key, &policy, 0).await.expect("peek");
            consumed(&policy, &peek)
        }
    };
    let total: u64 = spent[usize::try_from(users).unwrap()].load(Ordering::Relaxed);
    let shared_counted = counted(b"all", &shared).await;
    let mut per_user_total = 0;
    for user in 0..users {
        let key = format!("user-{user}");
        let spent_by = spent[usize::try_from(user).unwrap()].load(Ordering::Relaxed);
        per_user_total += spent_by;
        let counted_for = counted(key.as_bytes(), &per_user).await;
        if exact {
            assert_eq!(counted_for, spent_by, "{key}");
        } else {
            assert!(counted_for >= spent_by, "{key}: {counted_for} < {spent_by}");
        }
        // Four tasks per user.
        let bound = per_user.limit() + (TASKS / users) * MOST_ABOVE;
        assert!(spent_by <= bound, "{key}: {spent_by} spent, over {bound}");
    }
    assert_eq!(per_user_total, total);
    if exact {
        assert_eq!(shared_counted, total, "shared");
    } else {
        assert!(
            shared_counted >= total,
            "shared: {shared_counted} < {total}"
        );
    }
    let bound = shared.limit() + TASKS * MOST_ABOVE;
    assert!(total <= bound, "{total} spent, over {bound}");
    // Limits were reached (nothing refills, so a denial means one was):
    // the test is about the bound, not below it.
    assert!(
        denied.load(Ordering::Relaxed) > 0,
        "nothing denied, {total} spent"
    );
}

/// What a key has consumed, read from a peek on a clock that has not
/// moved since (nothing refilled): the budget less what remains, or, in
/// debt, the whole budget plus the debt that `retry_after` waits out.
fn consumed(policy: &Policy, peek: &Decision) -> u64 {
    let interval = match policy.algorithm() {
        ratelimit_core::Algorithm::TokenBucket(a) => a.interval_micros(),
        ratelimit_core::Algorithm::Gcra(a) => a.interval_micros(),
        other => panic!("no reading of {other:?}"),
    };
    if let ratelimit_core::Algorithm::Gcra(_) = policy.algorithm() {
        // The TAT is `reset_after` ahead: that many units.
        return peek.reset_after_micros() / interval;
    }
    if peek.is_allowed() {
        policy.limit() - peek.remaining()
    } else {
        policy.limit() + peek.retry_after_micros() / interval
    }
}

/// Through a `LeasedStore`: a reservation spent from a lease is settled in
/// the store (where its batch was consumed), and the lease goes on; a
/// settlement that leaves the key in debt drops the lease, so the debt
/// takes effect on this instance at once.
#[tokio::test]
async fn through_a_leased_store_a_debt_takes_effect_at_once() {
    let clock = ManualClock::new(NOW_MICROS);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let store = LeasedStore::builder(shared.clone())
        .batch(10)
        .hot_after(1)
        .clock(clock.clone())
        .build();
    let policy = named(
        "hourly",
        Policy::fixed_window(100, Duration::from_secs(3600)),
    );
    let used = || 100 - shared.peek(b"k", &policy).into_inner().unwrap().remaining();
    for _ in 0..2 {
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(
        (store.batches(), used()),
        (1, 11),
        "one cold request, a batch"
    );
    let reserved = store.check(b"k", &policy, 2).await.unwrap();
    assert_eq!(store.leased_decisions(), 1, "spent from the lease");
    let settles = [Settle::new(b"k", &policy, 2, 5, &reserved)];
    store
        .settle(SettlementId::random(), &settles)
        .await
        .unwrap();
    assert_eq!(used(), 14, "the difference, in the store");
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(store.leased_decisions(), 2, "still leasing");

    let reserved = store.check(b"k", &policy, 1).await.unwrap();
    let settles = [Settle::new(b"k", &policy, 1, 500, &reserved)];
    let settled = store
        .settle(SettlementId::random(), &settles)
        .await
        .unwrap();
    assert!(!settled[0].is_allowed());
    for _ in 0..5 {
        assert!(!store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(
        store.leased_decisions(),
        3,
        "no unit spent from the lease after the debt"
    );
}

/// Through a `DeniedCache`: a settlement below its reservation gives units
/// back, so the cached denial of the key goes with it.
#[tokio::test]
async fn through_a_denied_cache_a_give_back_drops_the_cached_denial() {
    let shared = MemoryStore::new();
    let cache = DeniedCache::new(shared);
    let policy = named("hourly", Policy::fixed_window(10, NO_EDGE));
    let reserved = cache.check(b"k", &policy, 10).await.unwrap();
    assert!(reserved.is_allowed());
    for _ in 0..2 {
        assert!(!cache.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(cache.hits(), 1, "the denial is cached");
    let settles = [Settle::new(b"k", &policy, 10, 4, &reserved)];
    let settled = cache
        .settle(SettlementId::random(), &settles)
        .await
        .unwrap();
    assert_eq!(settled[0].remaining(), 6);
    let after = cache.check(b"k", &policy, 1).await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(cache.hits(), 1);
}

/// `Limiter::reserve` in a handler: refused like a check when the estimate
/// does not fit; settled into debt, which the next reservation waits out;
/// refunded; dropped at the estimate; a concurrency policy refused; and
/// `peek`, which consumes nothing.
#[tokio::test]
async fn a_limiter_reserves_settles_and_refunds() {
    let clock = ManualClock::new(NOW_MICROS);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy = named(
        "tokens",
        Policy::token_bucket(1_000, Rate::per_minute(1_000)),
    );
    let limiter = Limiter::new(store.clone(), policy.clone());

    let too_much = limiter.reserve(b"k", 1_001).await.unwrap_err();
    assert_eq!(
        too_much.into_response().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Dropped: the estimate stays, nothing else happens.
    drop(limiter.reserve(b"k", 100).await.unwrap());
    assert_eq!(limiter.peek(b"k").await.unwrap().remaining(), 900);
    assert_eq!(
        limiter.peek(b"k").await.unwrap().remaining(),
        900,
        "a peek consumed"
    );

    // Refunded: the estimate comes back.
    limiter
        .reserve(b"k", 300)
        .await
        .unwrap()
        .refund()
        .await
        .unwrap();
    assert_eq!(limiter.peek(b"k").await.unwrap().remaining(), 900);

    // Settled below, then far above: the headers tell what is left.
    let granted = limiter
        .reserve(b"k", 300)
        .await
        .unwrap()
        .settle(100)
        .await
        .unwrap();
    let (parts, _) = (granted, ()).into_response().into_parts();
    assert!(
        parts.headers["ratelimit"]
            .to_str()
            .unwrap()
            .contains("r=800"),
        "{:?}",
        parts.headers
    );
    let reservation = limiter.reserve(b"k", 1).await.unwrap();
    let granted = reservation.settle(1_000).await.unwrap();
    let settled = granted
        .decisions()
        .and_then(|d| d.tightest())
        .unwrap()
        .decision();
    assert!(
        !settled.is_allowed() && settled.remaining() == 0,
        "{settled:?}"
    );
    // 200 tokens of debt at 60 ms each, then the token asked for.
    let refused = limiter.reserve(b"k", 1).await.unwrap_err();
    let response = refused.into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "13");
    clock.advance(Duration::from_millis(12_060));
    assert!(limiter.reserve(b"k", 1).await.is_ok());

    let permits = Limiter::new(
        store,
        named("slots", Policy::concurrency(4, Duration::from_secs(1))),
    );
    let refused = permits.reserve(b"k", 1).await.unwrap_err();
    assert_eq!(
        refused.into_response().status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(permits.peek(b"k").await.unwrap().remaining(), 4);
}

/// A settlement that timed out comes back with its reservation. Redis ran
/// it once it woke up; sent again, it changes nothing more. `peek` works
/// on Redis as on the memory store.
#[tokio::test]
async fn a_limiter_settles_again_after_a_timeout_and_counts_once() {
    let server = RedisServer::start();
    let store =
        build(RedisStore::builder(server.url()).call_timeout(Duration::from_millis(300))).await;
    let policy = named("hourly", Policy::fixed_window(1_000, NO_EDGE));
    let limiter = Limiter::new(store.clone(), policy.clone());
    // The script in Redis's cache, so the call sent while it is frozen
    // needs no second round trip to run.
    let warm = limiter.reserve(b"warm", 1).await.unwrap();
    warm.settle(2).await.unwrap();
    let reservation = limiter.reserve(b"k", 10).await.unwrap();
    server.freeze();
    let failed = reservation.settle(110).await.unwrap_err();
    server.thaw();
    assert!(failed.error().is_outage(), "{:?}", failed.error());
    let reservation = failed.into_reservation();
    // The command sent before the freeze runs once the server wakes.
    // The limiter keys its state by the value's hash, as every path does.
    let applied = format!(
        "{}:applied",
        store.state_key(&ratelimit_core::key::hashed(b"k"), &policy)
    );
    let id = reservation.id().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !server.cli(&["GET", &applied]).contains(&id) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first settlement never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settled = reservation.settle(110).await.unwrap();
    let remaining = settled
        .decisions()
        .and_then(|d| d.tightest())
        .unwrap()
        .decision()
        .remaining();
    assert_eq!(remaining, 890);
    assert_eq!(limiter.peek(b"k").await.unwrap().remaining(), 890);
}
