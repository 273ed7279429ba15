//! `LeasedStore`: the documented overshoot bound (`limit + instances × batch`
//! per window) holds, leasing saves round trips, and what cannot be leased
//! passes through unchanged.

use std::collections::BTreeMap;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{
    AdminStore, Check, Decision, LeasedStore, MemoryStore, PermitId, Policy, Rate, Store,
    StoreError,
};
use ratelimit_tests::redis_server::RedisServer;
use ratelimit_tests::{NO_EDGE, named};
use tokio::sync::{Notify, Semaphore};

const INSTANCES: u64 = 4;
const BATCH: u64 = 25;

/// `INSTANCES` leasing instances over one shared store, driven by one manual
/// clock in 1 ms steps for `millis`. The last instance sends one request every
/// 10 ms all along; the others hammer (one request per ms each) in odd seconds
/// only. So the quiet instance leases late in even seconds, when there is
/// budget left, and carries its lease into the next busy second: the worst
/// case of the bound. Returns the times (µs) of the allowed requests.
async fn drive(policy: &Policy, leasing: bool, millis: u64) -> Vec<u64> {
    let clock = ManualClock::new(1_000_000);
    let shared = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let instances: Vec<_> = (0..INSTANCES)
        .map(|_| {
            LeasedStore::builder(Arc::clone(&shared))
                .batch(if leasing { BATCH } else { 1 })
                .hot_after(if leasing { 3 } else { u64::MAX })
                .clock(clock.clone())
                .build()
        })
        .collect();
    let mut allowed = Vec::new();
    for step in 0..millis {
        let busy = (step / 1_000) % 2 == 1;
        for (i, instance) in instances.iter().enumerate() {
            let quiet = i as u64 == INSTANCES - 1;
            if (quiet && step % 10 == 0) || (!quiet && busy) {
                let decision = instance.check(b"hot", policy, 1).await.expect("decided");
                if decision.is_allowed() {
                    allowed.push(clock.now());
                }
            }
        }
        clock.advance(Duration::from_millis(1));
    }
    allowed
}

/// The most allowed in any interval `[t, t + window)`, `t` on the allowed times.
fn max_in_any_window(times: &[u64], window: u64) -> usize {
    let mut end = 0;
    let mut best = 0;
    for (start, &t) in times.iter().enumerate() {
        while end < times.len() && times[end] < t + window {
            end += 1;
        }
        best = best.max(end - start);
    }
    best
}

#[tokio::test]
async fn fixed_window_overshoot_is_at_most_instances_times_batch_per_window() {
    let limit = 1_000;
    let policy = Policy::fixed_window(limit, Duration::from_secs(1)).unwrap();
    // Busy seconds offer 3 times the limit; quiet ones a tenth of it.
    let allowed = drive(&policy, true, 8_000).await;
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    for t in &allowed {
        *per_window.entry(t / 1_000_000).or_default() += 1;
    }
    assert_eq!(per_window.len(), 8, "{per_window:?}");
    for (window, &count) in &per_window {
        assert!(
            count <= limit + INSTANCES * BATCH,
            "window {window}: {count} allowed, bound {}",
            limit + INSTANCES * BATCH
        );
        // In busy windows, units leased and left unspent are lost, at most
        // a batch per instance.
        if window % 2 == 0 {
            assert!(
                count + INSTANCES * BATCH >= limit,
                "window {window}: only {count} allowed"
            );
        }
    }
    // The bound is reached in practice: leases cross window boundaries.
    let overshoot = per_window.values().filter(|&&c| c > limit).count();
    assert!(overshoot > 0, "no window overshot: {per_window:?}");
}

#[tokio::test]
async fn rate_based_overshoot_is_bounded_against_the_exact_store() {
    for policy in [
        Policy::gcra(200, Rate::per_second(200)).unwrap(),
        Policy::token_bucket(200, Rate::per_second(200)).unwrap(),
        Policy::sliding_window_log(200, Duration::from_millis(500)).unwrap(),
        Policy::sliding_window_counter(200, Duration::from_millis(500)).unwrap(),
    ] {
        let window = policy.algorithm().window_micros();
        let exact = drive(&policy, false, 6_000).await;
        let leased = drive(&policy, true, 6_000).await;
        let exact_max = max_in_any_window(&exact, window);
        let leased_max = max_in_any_window(&leased, window);
        assert!(
            leased_max as u64 <= exact_max as u64 + INSTANCES * BATCH,
            "{}: {leased_max} in one window with leases, {exact_max} without",
            policy.name()
        );
        // Over the whole run, leasing admits about as much as the exact store.
        let (e, l) = (exact.len() as u64, leased.len() as u64);
        assert!(
            l <= e + INSTANCES * BATCH && l + 8 * INSTANCES * BATCH >= e,
            "{}: {l} allowed with leases, {e} without",
            policy.name()
        );
    }
}

/// A store on a manual clock at 0, and leases on it in batches of 10 for
/// keys hot after `hot_after` requests.
fn leasing(
    hot_after: u64,
) -> (
    ManualClock,
    MemoryStore<ManualClock>,
    LeasedStore<MemoryStore<ManualClock>, ManualClock>,
) {
    let clock = ManualClock::new(0);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let store = LeasedStore::builder(shared.clone())
        .batch(10)
        .hot_after(hot_after)
        .clock(clock.clone())
        .build();
    (clock, shared, store)
}

#[tokio::test]
async fn hot_keys_are_leased_and_cold_keys_are_not() {
    let (clock, shared, store) = leasing(5);
    let policy = Policy::fixed_window(1_000, Duration::from_secs(1)).unwrap();
    // Five requests for a key are decided by the store, one each.
    for _ in 0..5 {
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(store.batches(), 0);
    assert_eq!(
        shared.check(b"k", &policy, 0).await.unwrap().remaining(),
        995
    );
    // The sixth leases 10 units; the next nine are spent locally.
    for _ in 0..10 {
        assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    }
    assert_eq!(store.batches(), 1);
    assert_eq!(store.leased_decisions(), 9);
    assert_eq!(
        shared.check(b"k", &policy, 0).await.unwrap().remaining(),
        985
    );
    // Locally spent decisions report what the store had left plus the lease.
    let d = store.check(b"k", &policy, 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(store.batches(), 2);
    assert_eq!(d.remaining(), 975 + 9);
    // Another key starts cold.
    store.check(b"other", &policy, 1).await.unwrap();
    assert_eq!(store.batches(), 2);
    // Leases expire with the window: nothing carries further.
    clock.advance(Duration::from_millis(1_000));
    let before = store.leased_decisions();
    store.check(b"k", &policy, 1).await.unwrap();
    assert_eq!(
        store.leased_decisions(),
        before,
        "an expired lease was spent"
    );
}

#[tokio::test]
async fn refused_batches_fall_back_to_single_requests_without_overadmitting() {
    let (_clock, shared, store) = leasing(1);
    let policy = Policy::fixed_window(15, Duration::from_secs(1)).unwrap();
    let mut allowed = 0;
    for _ in 0..40 {
        if store.check(b"k", &policy, 1).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    // 1 single + one batch of 10 + 4 singles once a batch no longer fits.
    assert_eq!(allowed, 15);
    assert_eq!(shared.check(b"k", &policy, 0).await.unwrap().remaining(), 0);
}

#[tokio::test]
async fn peeks_big_costs_and_concurrency_pass_through() {
    let (_clock, shared, store) = leasing(1);
    let window = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    for _ in 0..3 {
        store.check(b"k", &window, 0).await.unwrap();
        store.check(b"k", &window, 20).await.unwrap();
    }
    assert_eq!(store.batches(), 0);
    assert_eq!(
        shared.check(b"k", &window, 0).await.unwrap().remaining(),
        40
    );
    let permits = Policy::concurrency(2, Duration::from_secs(5)).unwrap();
    let a = store.check(b"c", &permits, 1).await.unwrap();
    let b = store.check(b"c", &permits, 1).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed());
    assert!(!store.check(b"c", &permits, 1).await.unwrap().is_allowed());
    store
        .release(b"c", &permits, a.permit().unwrap())
        .await
        .unwrap();
    assert!(store.check(b"c", &permits, 1).await.unwrap().is_allowed());
    assert_eq!(store.batches(), 0);
}

/// How many of `n` requests for `key` are allowed.
async fn admitted<S: Store>(store: &S, key: &[u8], policy: &Policy, n: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..n {
        if store.check(key, policy, 1).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    allowed
}

/// An operator's block or penalty through the leased store takes effect at
/// once: the local lease of the key goes with it; an unblock or a reset lets
/// the key lease again.
#[tokio::test]
async fn a_block_or_penalty_through_the_leased_store_takes_effect_at_once() {
    let (_clock, shared, store) = leasing(1);
    let policy = Policy::fixed_window(1_000, Duration::from_secs(3_600)).unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 5).await, 5);
    assert_eq!(store.batches(), 1, "leasing");
    store
        .block(b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 100).await, 0);
    store.unblock(b"k", &policy).await.unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 20).await, 20);
    assert!(store.batches() >= 2, "leasing again");
    // A penalty into debt denies at once too.
    let after = store.penalize(b"k", &policy, 2_000).await.unwrap();
    assert!(!after.is_allowed());
    assert_eq!(admitted(&store, b"k", &policy, 100).await, 0);
    store.reset(b"k", &policy).await.unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 20).await, 20);
    // What the store counted covers what passed: 45 and the lease's rest.
    let used = 1_000 - shared.peek(b"k", &policy).await.unwrap().remaining();
    assert!((20..=30).contains(&used), "{used}");
    // Peeks and rewards go to the store.
    assert_eq!(
        store.peek(b"k", &policy).await.unwrap().remaining(),
        1_000 - used
    );
    let rewarded = store.reward(b"k", &policy, 5).await.unwrap();
    assert_eq!(rewarded.remaining(), 1_000 - used + 5);
}

/// An admin call through the leased store drops the local lease of the key
/// as soon as it is made, before it answers, for a key the store keeps
/// hashed too: a store that applied the block at once is not undercut by
/// the units on lease while the answer is on its way.
#[tokio::test]
async fn an_admin_call_drops_the_lease_before_it_answers() {
    let (_clock, _shared, store) = leasing(1);
    let policy = Policy::fixed_window(1_000, Duration::from_secs(3_600)).unwrap();
    for key in [&b"k"[..], b"user 7", &[b'x'; 1_000][..]] {
        assert_eq!(admitted(&store, key, &policy, 3).await, 3);
        let batches = store.batches();
        assert!(batches >= 1, "leasing");
        // The memory store blocks when asked; its answer is not awaited.
        let pending = store.block(key, &policy, Duration::from_secs(60));
        let leased = store.leased_decisions();
        assert_eq!(admitted(&store, key, &policy, 20).await, 0);
        assert_eq!(store.leased_decisions(), leased, "nothing spent on lease");
        pending.await.unwrap();
        assert_eq!(admitted(&store, key, &policy, 20).await, 0);
        store.unblock(key, &policy).await.unwrap();
        assert_eq!(admitted(&store, key, &policy, 5).await, 5);
        assert!(store.batches() > batches, "leasing again");
    }
}

/// What `LeasedStore` and its builder show of themselves, and that the
/// store can be shared between tasks and threads as the layers do.
#[tokio::test]
async fn leased_store_debug_shows_its_settings_and_counts_and_it_is_send_and_sync() {
    fn shared<T: Clone + Send + Sync + 'static>(_: &T) {}
    let builder = LeasedStore::builder(MemoryStore::new())
        .batch(10)
        .hot_after(1)
        .lease_for(Duration::from_secs(2))
        .max_keys(64);
    assert_eq!(
        format!("{builder:?}"),
        "LeasedStoreBuilder { batch: 10, hot_after: 1, lease_for: Some(2s), entries: 64, .. }"
    );
    let store = builder.build();
    shared(&store);
    let policy = Policy::fixed_window(1_000, NO_EDGE).unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 5).await, 5);
    assert_eq!(
        format!("{store:?}"),
        format!(
            "LeasedStore {{ batch: 10, hot_after: 1, leased_decisions: {}, batches: {}, .. }}",
            store.leased_decisions(),
            store.batches()
        )
    );
    // 1 cold request, 1 that asked for the batch, 3 spent from it.
    assert_eq!((store.leased_decisions(), store.batches()), (3, 1));
}

type Answer<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A `MemoryStore` that decides at once, and answers a batch (a cost above
/// 1) only once its gate opens, saying when one arrived.
#[derive(Clone)]
struct Gated {
    store: MemoryStore,
    gate: Arc<Semaphore>,
    arrived: Arc<Notify>,
}

impl Gated {
    fn closed() -> Self {
        Gated {
            store: MemoryStore::new(),
            gate: Arc::new(Semaphore::new(0)),
            arrived: Arc::new(Notify::new()),
        }
    }
}

impl Store for Gated {
    type CheckFuture = Answer<Decision>;
    type CheckAllFuture = Ready<Result<Vec<Decision>, StoreError>>;
    type ReleaseFuture = Ready<Result<(), StoreError>>;
    type RenewFuture = Ready<Result<bool, StoreError>>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        let decided = self.store.check_now(key, policy, cost);
        if cost <= 1 {
            return Box::pin(ready(decided));
        }
        let (gate, arrived) = (Arc::clone(&self.gate), Arc::clone(&self.arrived));
        Box::pin(async move {
            arrived.notify_one();
            let _open = gate.acquire().await;
            decided
        })
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        ready(self.store.check_all_now(checks))
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.store.release(key, policy, permit)
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.store.renew(key, policy, permit)
    }
}

impl AdminStore for Gated {
    type DecisionFuture = <MemoryStore as AdminStore>::DecisionFuture;
    type UpdateFuture = <MemoryStore as AdminStore>::UpdateFuture;

    fn peek(&self, key: &[u8], policy: &Policy) -> Self::DecisionFuture {
        self.store.peek(key, policy)
    }

    fn reset(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.store.reset(key, policy)
    }

    fn penalize(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.store.penalize(key, policy, amount)
    }

    fn reward(&self, key: &[u8], policy: &Policy, amount: u64) -> Self::DecisionFuture {
        self.store.reward(key, policy, amount)
    }

    fn block(&self, key: &[u8], policy: &Policy, duration: Duration) -> Self::UpdateFuture {
        self.store.block(key, policy, duration)
    }

    fn unblock(&self, key: &[u8], policy: &Policy) -> Self::UpdateFuture {
        self.store.unblock(key, policy)
    }
}

/// A batch the store granted before a block through the leased store, and
/// whose answer lands after it, admits the request that asked for it (the
/// store consumed it) but leaves no lease to spend past the block.
#[tokio::test]
async fn a_batch_landing_after_a_block_leaves_nothing_to_spend() {
    let inner = Gated::closed();
    let store = LeasedStore::builder(inner.clone())
        .batch(10)
        .hot_after(1)
        .build();
    let policy = Policy::fixed_window(1_000, NO_EDGE).unwrap();
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    let asking = tokio::spawn({
        let (store, policy) = (store.clone(), policy.clone());
        async move { store.check(b"k", &policy, 1).await }
    });
    inner.arrived.notified().await;
    store
        .block(b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    inner.gate.add_permits(1);
    assert!(asking.await.unwrap().unwrap().is_allowed());
    assert_eq!(admitted(&store, b"k", &policy, 100).await, 0);
    assert_eq!(store.leased_decisions(), 0);
}

/// A lease is of a policy's numbers: units leased under a limit of 1,000
/// are not spent once the limit is 5 under the same name, which the store
/// already counts as used up.
#[tokio::test]
async fn a_lease_taken_under_other_numbers_is_not_spent_under_new_ones() {
    let (_clock, _shared, store) = leasing(1);
    let hourly = |limit| {
        named(
            "api",
            Policy::fixed_window(limit, Duration::from_secs(3_600)),
        )
    };
    // 1 cold request, a batch of 10: 11 counted, 8 left on lease.
    assert_eq!(admitted(&store, b"k", &hourly(1_000), 3).await, 3);
    assert_eq!(admitted(&store, b"k", &hourly(5), 20).await, 0);
}

/// A block made elsewhere (straight on the shared store, or through another
/// instance) reaches an instance when its lease of the key ends: at most the
/// units it had leased pass after the block, and none once `lease_for` has
/// passed.
#[tokio::test]
async fn a_block_made_elsewhere_takes_effect_within_the_lease() {
    let clock = ManualClock::new(0);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let instance = |lease_for| {
        LeasedStore::builder(shared.clone())
            .batch(10)
            .hot_after(1)
            .lease_for(lease_for)
            .clock(clock.clone())
            .build()
    };
    let (store, other) = (
        instance(Duration::from_secs(2)),
        instance(Duration::from_secs(2)),
    );
    let policy = Policy::fixed_window(1_000, Duration::from_secs(3_600)).unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 3).await, 3);
    assert_eq!(store.batches(), 1);
    // 1 cold request, a batch of 10: 8 units still leased.
    other
        .block(b"k", &policy, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(admitted(&store, b"k", &policy, 100).await <= 8);
    clock.advance(Duration::from_secs(2));
    assert_eq!(admitted(&store, b"k", &policy, 100).await, 0);
    // A penalty elsewhere, the same.
    shared.unblock(b"k", &policy).await.unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 5).await, 5);
    shared.penalize(b"k", &policy, 2_000).await.unwrap();
    assert!(admitted(&store, b"k", &policy, 100).await <= 10);
    clock.advance(Duration::from_secs(2));
    assert_eq!(admitted(&store, b"k", &policy, 100).await, 0);
}

/// A refused batch holds leasing back for one lease at most: a key blocked
/// elsewhere for a year, and unblocked there, leases again on this instance
/// once its lease period has passed, not a year later.
#[tokio::test]
async fn a_key_unblocked_elsewhere_leases_again_within_a_lease() {
    let clock = ManualClock::new(0);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let store = LeasedStore::builder(shared.clone())
        .batch(10)
        .hot_after(1)
        .lease_for(Duration::from_secs(2))
        .clock(clock.clone())
        .build();
    let policy = Policy::fixed_window(1_000, Duration::from_secs(3_600)).unwrap();
    let year = Duration::from_secs(365 * 86_400);
    shared.block(b"k", &policy, year).await.unwrap();
    assert_eq!(admitted(&store, b"k", &policy, 5).await, 0);
    shared.unblock(b"k", &policy).await.unwrap();
    clock.advance(Duration::from_secs(2));
    assert_eq!(admitted(&store, b"k", &policy, 20).await, 20);
    assert!(store.batches() >= 1, "leasing again");
}

/// Keys seen once take no tracking slot from a key that proved hot: under a
/// flood of one-off keys far beyond `max_keys`, a hot key keeps leasing, and
/// a key that turns hot during the flood leases too.
#[tokio::test]
async fn a_flood_of_one_off_keys_leaves_hot_keys_leasing() {
    let clock = ManualClock::new(0);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let store = LeasedStore::builder(shared)
        .batch(10)
        .hot_after(3)
        .max_keys(64)
        .clock(clock.clone())
        .build();
    let policy = Policy::fixed_window(1_000_000, Duration::from_secs(3_600)).unwrap();
    assert_eq!(admitted(&store, b"hot", &policy, 20).await, 20);
    let before = store.leased_decisions();
    assert!(before > 0);
    for i in 0..20_000u32 {
        let key = format!("one-off-{i}");
        assert!(
            store
                .check(key.as_bytes(), &policy, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        if i % 20 == 0 {
            store.check(b"hot", &policy, 1).await.unwrap();
        }
        // Once the flood has filled every slot.
        if i % 20 == 0 && i >= 2_000 {
            store.check(b"turns-hot", &policy, 1).await.unwrap();
        }
    }
    // 1,000 and 900 requests: at most a tenth of them asked for a batch.
    assert!(
        store.leased_decisions() >= before + 1_900 * 8 / 10,
        "{} leased decisions",
        store.leased_decisions() - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_one_hot_redis_key_share_batches_and_never_exceed_what_redis_granted() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url()).build().await.unwrap();
    let store = LeasedStore::builder(redis.clone())
        .batch(50)
        .hot_after(1)
        .build();
    // A limit that is not reached within the test: every request passes,
    // and Redis sees one batch per 50 decisions at most, plus the cold one.
    // A window of 1,000 days: Redis's count below is of the current window,
    // and a minute's window was crossed by a slow run about one time in ten.
    let policy = Policy::fixed_window(1_000_000, NO_EDGE).unwrap();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..200 {
                    if store.check(b"hot", &policy, 1).await.unwrap().is_allowed() {
                        allowed += 1;
                    }
                }
                allowed
            })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.unwrap();
    }
    assert_eq!(allowed, 32 * 200);
    let batches = store.batches();
    assert!(
        batches <= 6_400 / 50 + 2 && store.leased_decisions() >= 6_400 * 3 / 4,
        "{batches} batches, {} leased decisions",
        store.leased_decisions()
    );
    // Redis consumed every batch: what it reports used covers what passed.
    let used = 1_000_000 - redis.check(b"hot", &policy, 0).await.unwrap().remaining();
    assert!(used >= allowed, "Redis counted {used}, {allowed} passed");
    assert!(
        used <= allowed + 50,
        "Redis counted {used}, {allowed} passed"
    );
}
