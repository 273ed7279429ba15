//! `MemoryStore` under concurrency and at its memory bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::{Check, MemoryStore, Policy, Rate, Store, StoreError};
use ratelimit_tests::admits_now;
use ratelimit_tests::fixtures::bounded_memory;

fn every_algorithm(limit: u64) -> Vec<Policy> {
    let window = Duration::from_secs(60);
    vec![
        Policy::fixed_window(limit, window).unwrap(),
        Policy::sliding_window_log(limit, window).unwrap(),
        Policy::sliding_window_counter(limit, window).unwrap(),
        Policy::token_bucket(limit, Rate::per_hour(1)).unwrap(),
        Policy::gcra(limit, Rate::per_hour(1)).unwrap(),
        Policy::leaky_bucket(limit, Rate::per_hour(1)).unwrap(),
        Policy::concurrency(limit, window).unwrap(),
    ]
}

/// How many of `threads` × `per_thread` checks of the key `hot` at cost 1
/// pass, thread `t` checking under `policies[t % policies.len()]`, while
/// `beside` runs on a thread of its own.
fn hot_key_admissions(
    store: &MemoryStore<ManualClock>,
    policies: &[&Policy],
    threads: usize,
    per_thread: usize,
    beside: impl FnOnce() + Send,
) -> u64 {
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..threads {
            let (policy, admitted) = (policies[t % policies.len()], &admitted);
            s.spawn(move || {
                for _ in 0..per_thread {
                    if store.check_now(b"hot", policy, 1).unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(beside);
    });
    admitted.into_inner()
}

/// 8 threads hammer one key; with the clock frozen, exactly `limit` pass.
#[test]
fn eight_threads_on_one_key_admit_exactly_the_limit() {
    const LIMIT: u64 = 1_000;
    const THREADS: usize = 8;
    const PER_THREAD: usize = 400; // 3,200 attempts for 1,000 slots
    for policy in every_algorithm(LIMIT) {
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1_000_000_007))
            .build();
        assert_eq!(
            hot_key_admissions(&store, &[&policy], THREADS, PER_THREAD, || {}),
            LIMIT,
            "{}: admitted count",
            policy.name()
        );
        let peek = store.check_now(b"hot", &policy, 0).unwrap();
        assert_eq!(peek.remaining(), 0, "{}", policy.name());
    }
}

/// A store of one shard, so that every key shares its lock, on a manual
/// clock.
fn one_shard() -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new(1_000_000_007);
    let store = MemoryStore::builder()
        .shards(1)
        .clock(clock.clone())
        .build();
    (clock, store)
}

/// A denied GCRA key becomes its shard's hot key, whose denials are decided
/// without the shard's lock (see `MemoryStore`). Here every check of the hot
/// key shares one shard with a thread that adds a key every 2 ms of the
/// clock: each such write takes the lock exclusively, which hands the hot
/// key's state back to its entry, and the next denial makes it hot again.
/// Exactly `limit` pass all the same (the rate, one an hour, adds none in
/// the seconds the clock moves).
#[test]
fn a_hot_key_read_without_the_lock_admits_exactly_the_limit_while_its_shard_is_written() {
    const LIMIT: u64 = 1_000;
    const WRITES: usize = 2_000;
    let (clock, store) = one_shard();
    let policy = Policy::gcra(LIMIT, Rate::per_hour(1)).unwrap();
    // The key exists, and the clock is past the span a write leaves the
    // lock unbiased: the first read turns the bias on.
    let first = u64::from(store.check_now(b"hot", &policy, 1).unwrap().is_allowed());
    clock.advance(Duration::from_secs(1));
    // 4 readers of 2,000 checks each.
    let read = hot_key_admissions(&store, &[&policy], 4, 2_000, || {
        for i in 0..WRITES {
            clock.advance(Duration::from_millis(2));
            let key = format!("new-{i}");
            assert!(admits_now(&store, key.as_bytes(), &policy, 1));
        }
    });
    assert_eq!(first + read, LIMIT);
    assert_eq!(store.check_now(b"hot", &policy, 0).unwrap().remaining(), 0);
    assert_eq!(store.len(), 1 + WRITES);
}

/// Threads on one GCRA key, the clock frozen within a round and moved by a
/// few intervals between rounds: its denials are decided without the lock
/// (the key is hot after its first denial), its admissions under it, half
/// the threads with another handle of the same policy (not the hot key's
/// own, so they always take the lock), while a thread adds keys to the same
/// shard (each hands the hot key's state back to its entry). Exactly the
/// burst passes in the first round, then exactly what each step refilled.
#[test]
fn threads_on_a_hot_key_admit_exactly_what_each_step_refills() {
    const BURST: u64 = 100;
    const ROUNDS: u64 = 40;
    const STEP: u64 = 7; // units refilled between rounds
    let (clock, store) = one_shard();
    let policy = Policy::gcra(BURST, Rate::per_second(1_000)).unwrap();
    let same_name = Policy::gcra(BURST, Rate::per_second(1_000)).unwrap();
    assert!(!policy.ptr_eq(&same_name));
    assert_eq!(policy.name(), same_name.name());
    for round in 0..ROUNDS {
        // 4 threads of 300 checks each, every other one under `same_name`.
        let admitted = hot_key_admissions(&store, &[&policy, &same_name], 4, 300, || {
            for i in 0..20 {
                let key = format!("round-{round}-key-{i}");
                assert!(admits_now(&store, key.as_bytes(), &policy, 1));
                thread::yield_now();
            }
        });
        let expected = if round == 0 { BURST } else { STEP };
        assert_eq!(admitted, expected, "round {round}");
        assert_eq!(store.check_now(b"hot", &policy, 0).unwrap().remaining(), 0);
        clock.advance(Duration::from_micros(STEP * 1_000));
    }
}

/// The same through the async `Store` trait from tokio tasks on several workers,
/// with costs above 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_with_costs_never_exceed_the_limit() {
    const LIMIT: u64 = 500;
    for policy in every_algorithm(LIMIT) {
        let store = MemoryStore::builder().clock(ManualClock::new(5)).build();
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..64u64 {
            let (store, policy, admitted) = (store.clone(), policy.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..40u64 {
                    let cost = 1 + (t + i) % 3;
                    let d = store.check(b"hot", &policy, cost).await.unwrap();
                    if d.is_allowed() {
                        admitted.fetch_add(cost, Ordering::Relaxed);
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(admitted <= LIMIT, "{}: admitted {admitted}", policy.name());
        // 64 × 40 attempts of cost ≥ 1 against 500: the store fills up to within one cost.
        assert!(
            admitted > LIMIT - 3,
            "{}: admitted {admitted}",
            policy.name()
        );
    }
}

/// Two limits per request (per user and global) are all or nothing, under
/// concurrency: the global limit is never exceeded, and a user's denied request
/// consumes nothing from the global budget.
#[test]
fn check_all_is_all_or_nothing_under_concurrency() {
    let store = MemoryStore::builder().clock(ManualClock::new(0)).build();
    let per_user = fixed_window("per-user", 10, Duration::from_secs(60));
    let global = fixed_window("global", 50, Duration::from_secs(60));
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..8u64 {
            let (store, per_user, global, admitted) = (&store, &per_user, &global, &admitted);
            s.spawn(move || {
                // 8 users (one per thread), 30 attempts each: each user can take 10,
                // and together they are capped at 50 by the global limit.
                let user = format!("user-{t}");
                for _ in 0..30 {
                    let decisions = store
                        .check_all_now(&[
                            Check::new(user.as_bytes(), per_user, 1),
                            Check::new(b"all", global, 1),
                        ])
                        .unwrap();
                    if decisions.iter().all(|d| d.is_allowed()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 50);
    let global_left = store.check_now(b"all", &global, 0).unwrap();
    assert_eq!(global_left.remaining(), 0);
    // What each user consumed adds up to exactly what the global limit consumed.
    let used: u64 = (0..8)
        .map(|t| {
            10 - store
                .check_now(format!("user-{t}").as_bytes(), &per_user, 0)
                .unwrap()
                .remaining()
        })
        .sum();
    assert_eq!(used, 50);
}

#[test]
fn check_all_denied_consumes_nothing() {
    let store = MemoryStore::builder().clock(ManualClock::new(0)).build();
    let small = fixed_window("small", 1, Duration::from_secs(60));
    let big = named("big", Policy::gcra(10, Rate::per_second(1)));
    let first = store
        .check_all_now(&[Check::new(b"k", &small, 1), Check::new(b"k", &big, 1)])
        .unwrap();
    assert!(first.iter().all(|d| d.is_allowed()));
    let second = store
        .check_all_now(&[Check::new(b"k", &small, 1), Check::new(b"k", &big, 1)])
        .unwrap();
    assert!(!second[0].is_allowed());
    // The big limit allowed on its own but was not consumed: it reports a peek.
    assert!(second[1].is_allowed());
    assert_eq!(second[1].remaining(), 9);
    assert_eq!(store.check_now(b"k", &big, 0).unwrap().remaining(), 9);
    // A cost that can never pass is an error for the whole request.
    let err = store
        .check_all_now(&[Check::new(b"k", &small, 2), Check::new(b"k", &big, 1)])
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::CostExceedsLimit {
            cost: 2,
            max: 1,
            ..
        }
    ));
}

/// The key bound holds while an attacker rotates keys; existing keys keep
/// working; expired keys make room again.
#[test]
fn bounded_keys_refuse_new_keys_and_reclaim_expired() {
    let clock = ManualClock::new(0);
    let store = bounded_memory(256, 16, &clock);
    let policy = Policy::fixed_window(3, Duration::from_secs(10)).unwrap();
    // A legitimate user arrives first.
    assert!(admits_now(&store, b"alice", &policy, 1));

    let mut full = 0;
    for i in 0..100_000u32 {
        match store.check_now(format!("attacker-{i}").as_bytes(), &policy, 1) {
            Ok(d) => assert!(d.is_allowed()),
            Err(StoreError::Full { max_keys }) => {
                assert_eq!(max_keys, 256);
                full += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(store.len() <= 256);
    }
    assert!(full > 99_000, "full errors: {full}");
    // Alice's state survived the attack exactly: 2 left, then 1, then denied.
    assert_eq!(
        store.check_now(b"alice", &policy, 1).unwrap().remaining(),
        1
    );
    assert_eq!(
        store.check_now(b"alice", &policy, 1).unwrap().remaining(),
        0
    );
    assert!(!admits_now(&store, b"alice", &policy, 1));
    // Peeks at new keys need no room.
    assert!(admits_now(&store, b"newcomer", &policy, 0));

    // Once the window has passed, the attackers' state is worth nothing and is swept.
    clock.advance(Duration::from_secs(10));
    assert!(admits_now(&store, b"newcomer", &policy, 1));
    assert!(store.len() <= 256);
}

/// `max_keys(n)` bounds the store's keys, not each shard's: any `n`
/// distinct keys are held, whichever shards they hash to, and the next new
/// key (a check or a block) is `StoreError::Full`, for every algorithm, with
/// the default shards and with many. Once they expire, `n` other keys (in
/// other shards) are held again.
#[test]
fn max_keys_admits_exactly_that_many_distinct_keys() {
    for n in [1usize, 2, 7, 64, 1000] {
        for shards in [64, 1 << 10] {
            for policy in every_algorithm(3) {
                let name = policy.name();
                let clock = ManualClock::new(1_000_000_007);
                let store = bounded_memory(n, shards, &clock);
                for round in 0..2 {
                    for i in 0..n {
                        let key = format!("key-{round}-{i}");
                        let d = store.check_now(key.as_bytes(), &policy, 1);
                        assert!(
                            d.as_ref().is_ok_and(|d| d.is_allowed()),
                            "{name}, max_keys {n}, {shards} shards: key {i} of round {round}: {d:?}"
                        );
                    }
                    assert_eq!(store.len(), n, "{name}, max_keys {n}");
                    let extra = format!("extra-{round}");
                    assert!(
                        matches!(
                            store.check_now(extra.as_bytes(), &policy, 1),
                            Err(StoreError::Full { max_keys }) if max_keys == n
                        ),
                        "{name}, max_keys {n}, {shards} shards"
                    );
                    assert!(matches!(
                        store
                            .block(extra.as_bytes(), &policy, Duration::from_secs(1))
                            .into_inner(),
                        Err(StoreError::Full { .. })
                    ));
                    let checks = [Check::new(extra.as_bytes(), &policy, 1)];
                    assert!(matches!(
                        store.check_all_now(&checks),
                        Err(StoreError::Full { .. })
                    ));
                    // Held keys are still decided.
                    let held = format!("key-{round}-{}", n - 1);
                    assert!(store.check_now(held.as_bytes(), &policy, 1).is_ok());
                    assert_eq!(store.len(), n, "{name}, max_keys {n}");
                    // Every state above is fresh again after two hours.
                    clock.advance(Duration::from_secs(7200));
                }
            }
        }
    }
}

/// Threads racing for the last room never take more than `max_keys` keys
/// between them, and take all of it.
#[test]
fn threads_racing_for_room_take_exactly_max_keys() {
    const MAX_KEYS: usize = 64;
    let store = bounded_memory(MAX_KEYS, 64, &ManualClock::new(1_000_000_007));
    let policy = Policy::fixed_window(5, Duration::from_secs(60)).unwrap();
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..8 {
            let (store, policy, admitted) = (&store, &policy, &admitted);
            s.spawn(move || {
                for i in 0..100 {
                    let key = format!("thread-{t}-key-{i}");
                    match store.check_now(key.as_bytes(), policy, 1) {
                        Ok(d) => {
                            assert!(d.is_allowed());
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(StoreError::Full { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), MAX_KEYS as u64);
    assert_eq!(store.len(), MAX_KEYS);
}

/// State that is back to fresh is dropped as soon as it is seen.
#[test]
fn fresh_state_is_not_kept() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    for policy in every_algorithm(5) {
        assert!(admits_now(&store, b"k", &policy, 0));
    }
    assert_eq!(store.len(), 0, "peeks leave no state");
    let policy = Policy::gcra(5, Rate::per_second(5)).unwrap();
    store.check_now(b"k", &policy, 2).unwrap();
    assert_eq!(store.len(), 1);
    clock.advance(Duration::from_secs(1));
    // The bucket is full again: this peek finds nothing worth keeping.
    assert_eq!(store.check_now(b"k", &policy, 0).unwrap().remaining(), 5);
    assert_eq!(store.len(), 0);
}

#[test]
fn one_name_two_algorithms_is_an_error() {
    let store = MemoryStore::new();
    let a = fixed_window("same", 5, NO_EDGE);
    let b = named("same", Policy::gcra(5, Rate::per_second(1)));
    store.check_now(b"k", &a, 1).unwrap();
    assert!(matches!(
        store.check_now(b"k", &b, 1),
        Err(StoreError::PolicyConflict { .. })
    ));
}

#[test]
fn concurrency_permits_release_and_expire() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy = Policy::concurrency(2, Duration::from_secs(30)).unwrap();
    let a = store.check_now(b"k", &policy, 1).unwrap();
    let b = store.check_now(b"k", &policy, 1).unwrap();
    assert_ne!(a.permit(), b.permit());
    let denied = store.check_now(b"k", &policy, 1).unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(30)));
    store.release_now(b"k", &policy, a.permit().unwrap());
    assert!(admits_now(&store, b"k", &policy, 1));
    // A holder that never releases loses its permit when the lease expires.
    clock.advance(Duration::from_secs(30));
    assert_eq!(store.check_now(b"k", &policy, 0).unwrap().remaining(), 2);
}

#[test]
fn huge_keys_are_bounded() {
    let store = MemoryStore::builder().clock(ManualClock::new(0)).build();
    let policy = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
    let huge = vec![b'x'; 1 << 20];
    assert!(admits_now(&store, &huge, &policy, 1));
    assert!(!admits_now(&store, &huge, &policy, 1));
    let mut other = huge.clone();
    other[12345] = b'y';
    assert!(admits_now(&store, &other, &policy, 1));
}

// ---- DeniedCache: known denials answered locally ----

use ratelimit_core::{AdminStore, DeniedCache};
use ratelimit_tests::admits;
use ratelimit_tests::faulty::Faulty;
use ratelimit_tests::fixtures::fixed_window;
use ratelimit_tests::{NO_EDGE, named};

/// A `MemoryStore` that counts the checks (`check`, `check_all`) that
/// reach it.
fn counting() -> (Faulty<MemoryStore>, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let store = Faulty::new(MemoryStore::new(), move |call| {
        if call.decides() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
        None
    });
    (store, calls)
}

#[tokio::test]
async fn denied_cache_answers_known_denials_without_the_store() {
    let (store, calls) = counting();
    let cache = DeniedCache::new(store);
    let policy = Policy::token_bucket(3, Rate::per_hour(1)).unwrap();
    for _ in 0..3 {
        assert!(admits(&cache, b"abuser", &policy).await);
    }
    let denied = cache.check(b"abuser", &policy, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    for _ in 0..1_000 {
        let d = cache.check(b"abuser", &policy, 1).await.unwrap();
        assert!(!d.is_allowed());
        assert!(d.retry_after().unwrap() <= denied.retry_after().unwrap());
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        4,
        "no store call for cached denials"
    );
    assert_eq!(cache.hits(), 1_000);
    // Peeks and other keys still go to the store.
    cache.check(b"abuser", &policy, 0).await.unwrap();
    assert!(admits(&cache, b"someone-else", &policy).await);
    assert_eq!(calls.load(Ordering::Relaxed), 6);
}

/// A cost above the policy's maximum is `CostExceedsLimit`, a mistake to
/// fix, even for a key whose denial is cached: never a cached 429.
#[tokio::test]
async fn denied_cache_refuses_a_cost_above_the_limit_before_its_cache() {
    let (store, calls) = counting();
    let cache = DeniedCache::new(store);
    let policy = Policy::token_bucket(3, Rate::per_hour(1)).unwrap();
    assert!(cache.check(b"k", &policy, 3).await.unwrap().is_allowed());
    assert!(!cache.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    let err = cache.check(b"k", &policy, 4).await.unwrap_err();
    assert!(
        matches!(err, StoreError::CostExceedsLimit { .. }),
        "{err:?}"
    );
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn denied_cache_asks_again_for_cheaper_requests_and_after_expiry() {
    let (store, calls) = counting();
    let cache = DeniedCache::new(store);
    let policy = Policy::gcra(3, Rate::new(1, Duration::from_millis(100))).unwrap();
    assert!(cache.check(b"k", &policy, 2).await.unwrap().is_allowed());
    // One unit left: a cost of 3 is denied and cached...
    assert!(!cache.check(b"k", &policy, 3).await.unwrap().is_allowed());
    assert!(!cache.check(b"k", &policy, 3).await.unwrap().is_allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // ...but a cost of 1 may pass: it is asked, and allowed.
    assert!(cache.check(b"k", &policy, 1).await.unwrap().is_allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // Once the retry time has passed, the store decides again.
    tokio::time::sleep(Duration::from_millis(320)).await;
    assert!(cache.check(b"k", &policy, 3).await.unwrap().is_allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
}

#[tokio::test]
async fn denied_cache_skips_concurrency_and_stays_bounded() {
    let (store, calls) = counting();
    let cache = DeniedCache::with_capacity(store, 32);
    let semaphore = Policy::concurrency(1, Duration::from_secs(60)).unwrap();
    let held = cache.check(b"k", &semaphore, 1).await.unwrap();
    assert!(!cache.check(b"k", &semaphore, 1).await.unwrap().is_allowed());
    cache
        .release(b"k", &semaphore, held.permit().unwrap())
        .await
        .unwrap();
    assert!(
        cache.check(b"k", &semaphore, 1).await.unwrap().is_allowed(),
        "not cached"
    );
    assert_eq!(calls.load(Ordering::Relaxed), 3);

    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    for i in 0..2_000 {
        let key = format!("attacker-{i}");
        cache.check(key.as_bytes(), &policy, 1).await.unwrap();
        cache.check(key.as_bytes(), &policy, 1).await.unwrap();
    }
    assert!(cache.len() <= 32 + 16, "cache holds {}", cache.len());
}

/// A limit changed under the same name is another policy to the cache: a
/// denial under the old numbers never denies under the new ones, and a
/// lowered limit's denials come from the store (the cache only denies).
#[tokio::test]
async fn denied_cache_follows_a_limit_changed_under_the_same_name() {
    let (store, calls) = counting();
    let cache = DeniedCache::new(store);
    let hourly = |limit| named("api", Policy::fixed_window(limit, NO_EDGE));
    let one = hourly(1);
    assert!(cache.check(b"k", &one, 1).await.unwrap().is_allowed());
    for _ in 0..2 {
        assert!(!cache.check(b"k", &one, 1).await.unwrap().is_allowed());
    }
    assert_eq!((cache.hits(), calls.load(Ordering::Relaxed)), (1, 2));
    // Raised: the store admits with 998 left after this one, and so does
    // the cache.
    let thousand = hourly(1_000);
    let d = cache.check(b"k", &thousand, 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 998, "{d:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    // Lowered again: the old denial is not the answer, the store's is.
    let two = hourly(2);
    let d = cache.check(b"k", &two, 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    // Back to the first numbers: the store denies as it would.
    assert!(!cache.check(b"k", &one, 1).await.unwrap().is_allowed());
    // Another algorithm under the name is a conflict the store reports,
    // never a cached denial.
    let bucket = named("api", Policy::token_bucket(1_000, Rate::per_hour(1_000)));
    let err = cache.check(b"k", &bucket, 1).await.unwrap_err();
    assert!(matches!(err, StoreError::PolicyConflict { .. }), "{err:?}");
}

/// An admin operation under one set of numbers ends the key's state under
/// the name, so it drops the cached denials of every policy of the name.
#[tokio::test]
async fn denied_cache_forgets_a_reset_key_under_every_policy_of_its_name() {
    let cache = DeniedCache::new(MemoryStore::new());
    let hourly = |limit| named("api", Policy::fixed_window(limit, NO_EDGE));
    assert!(cache.check(b"k", &hourly(1), 1).await.unwrap().is_allowed());
    assert!(!cache.check(b"k", &hourly(1), 1).await.unwrap().is_allowed());
    assert!(!cache.check(b"k", &hourly(1), 1).await.unwrap().is_allowed());
    assert_eq!(cache.hits(), 1);
    cache.reset(b"k", &hourly(5)).await.unwrap();
    assert!(cache.check(b"k", &hourly(1), 1).await.unwrap().is_allowed());
}

/// A key the stores keep hashed (not printable, or too long) is forgotten
/// under the same normalized form it was cached under: a reset, a reward,
/// an unblock or a refund through the cache ends its cached denial.
#[tokio::test]
async fn denied_cache_forgets_a_hashed_key_on_every_call_that_can_end_its_denial() {
    let cache = DeniedCache::new(MemoryStore::new());
    let policy = Policy::gcra(2, Rate::per_hour(2)).unwrap();
    let long = vec![b'x'; 4_096];
    for (round, operation) in ["reset", "reward", "unblock", "refund"]
        .into_iter()
        .enumerate()
    {
        let spaced = format!("user {round}");
        let key = if round % 2 == 0 {
            spaced.as_bytes()
        } else {
            &long[round..]
        };
        let granted = if operation == "unblock" {
            cache
                .block(key, &policy, Duration::from_secs(60))
                .await
                .unwrap();
            None
        } else {
            let d = cache.check(key, &policy, 2).await.unwrap();
            assert!(d.is_allowed(), "{operation}: {d:?}");
            Some(d)
        };
        assert!(!cache.check(key, &policy, 1).await.unwrap().is_allowed());
        let hits = cache.hits();
        assert!(!cache.check(key, &policy, 1).await.unwrap().is_allowed());
        assert_eq!(cache.hits(), hits + 1, "{operation}: the denial is cached");
        match operation {
            "reset" => cache.reset(key, &policy).await.unwrap(),
            "reward" => {
                cache.reward(key, &policy, 10).await.unwrap();
            }
            "unblock" => cache.unblock(key, &policy).await.unwrap(),
            _ => cache
                .refund(key, &policy, 2, &granted.unwrap())
                .await
                .unwrap(),
        }
        let hits = cache.hits();
        let after = cache.check(key, &policy, 1).await.unwrap();
        assert!(after.is_allowed(), "{operation}: still denied {after:?}");
        assert_eq!(cache.hits(), hits, "{operation}: asked the store");
    }
}

/// The bound is split over the cache's 16 shards, each holding its share
/// rounded up: however many keys are denied, a cache of one entry holds at
/// most 16 denials (one a shard), and one of 32 at most 32.
#[tokio::test]
async fn denied_cache_holds_at_most_its_shards_shares_of_the_bound() {
    let policy = Policy::fixed_window(1, NO_EDGE).unwrap();
    for (entries, most) in [(1, 16), (32, 32)] {
        let cache = DeniedCache::with_capacity(MemoryStore::new(), entries);
        for i in 0..500 {
            let key = format!("k-{i}");
            assert!(admits(&cache, key.as_bytes(), &policy).await);
            assert!(!admits(&cache, key.as_bytes(), &policy).await);
            assert!(cache.len() <= most, "{entries}: holds {}", cache.len());
        }
        assert!(!cache.is_empty());
    }
}

/// What `DeniedCache` shows of itself, and that it can be shared between
/// tasks and threads as the layers do.
#[tokio::test]
async fn denied_cache_debug_shows_its_hits_and_it_is_send_and_sync() {
    fn shared<T: Clone + Send + Sync + 'static>(_: &T) {}
    let cache = DeniedCache::new(MemoryStore::new());
    shared(&cache);
    let policy = Policy::fixed_window(1, NO_EDGE).unwrap();
    assert_eq!(format!("{cache:?}"), "DeniedCache { hits: 0, .. }");
    assert!(admits(&cache, b"k", &policy).await);
    for _ in 0..3 {
        assert!(!admits(&cache, b"k", &policy).await);
    }
    assert_eq!(format!("{cache:?}"), "DeniedCache { hits: 2, .. }");
}

#[test]
fn denied_cache_is_exact_under_threads() {
    let cache = DeniedCache::new(MemoryStore::new());
    let policy = Policy::gcra(500, Rate::per_hour(1)).unwrap();
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..200 {
                    let d = futures_lite_block_on(cache.check(b"hot", &policy, 1)).unwrap();
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 500);
    assert!(cache.hits() > 0);
}

/// Polls a future to completion on this thread (the stores here never wait).
fn futures_lite_block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

#[test]
fn keys_are_kept_apart_from_other_keys_hashes_and_from_each_other() {
    // Short keys are kept as they are in memory, printable or not; long keys
    // by their hash. No key reaches another's state through its hash.
    let store = MemoryStore::builder().clock(ManualClock::new(0)).build();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).expect("valid policy");
    let long = vec![b'k'; 200];
    let hashed_form = ratelimit_core::key::hashed(&long);
    let binary: &[u8] = &[0x00, 0xff];
    for key in [&long[..], &hashed_form, binary, b"\x00\xfe", b"", b"{tag}"] {
        let first = store.check_now(key, &policy, 1).expect("decided");
        assert!(first.is_allowed(), "{key:?} had its own budget");
    }
    for key in [&long[..], &hashed_form, binary, b"\x00\xfe", b"", b"{tag}"] {
        let second = store.check_now(key, &policy, 1).expect("decided");
        assert!(!second.is_allowed(), "{key:?} spent its own budget");
    }
    assert_eq!(store.len(), 6);
}

/// A clock that returns the given times in order (then the last one again):
/// it plays a thread that read the clock, was overtaken at the shard lock by
/// another, and reached the lock with an older time than the last decision.
struct ScriptedClock(std::sync::Mutex<std::collections::VecDeque<u64>>);

impl ratelimit_core::clock::Clock for ScriptedClock {
    fn now(&self) -> u64 {
        let mut times = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if times.len() > 1 {
            times.pop_front().unwrap_or(0)
        } else {
            times.front().copied().unwrap_or(0)
        }
    }
}

/// A leaky bucket's delay is counted from the time of its decision, which
/// the caller sleeps from: a check that read the clock before another
/// thread's later decision must not be decided at that older time, or its
/// delay runs past its slot and the next request comes too soon after it.
#[test]
fn a_leaky_bucket_delay_is_never_counted_from_a_time_older_than_a_decision() {
    // One unit per ms. The first check reads 2.0 s and takes the slot at
    // 2.0 s; the second read 1.999 s before the first took the lock: its
    // slot starts at 2.001 s, 1 ms after 2.0 s, and its delay is 1 ms.
    let clock = ScriptedClock(std::sync::Mutex::new(
        [2_000_000, 1_999_000, 2_000_000].into_iter().collect(),
    ));
    let store = MemoryStore::builder().clock(clock).build();
    let policy = Policy::leaky_bucket(5, Rate::new(1, Duration::from_millis(1))).unwrap();
    let first = store.check_now(b"k", &policy, 1).unwrap();
    assert_eq!(first.delay_micros(), 0, "{first:?}");
    let second = store.check_now(b"k", &policy, 1).unwrap();
    assert!(second.is_allowed(), "{second:?}");
    assert_eq!(second.delay_micros(), 1_000, "decided at 2.0 s: {second:?}");
}

#[test]
fn a_time_read_before_the_lock_never_goes_back_past_a_decision() {
    // One per aligned second. The first check reads 2.0 s; the second's
    // first read is 1.999999 s (read before the first took the lock): the
    // second must be decided at 2.0 s, on the shard's non-decreasing
    // timeline, so its window ends exactly 1 s later.
    let clock = ScriptedClock(std::sync::Mutex::new(
        [2_000_000, 1_999_999, 2_000_000].into_iter().collect(),
    ));
    let store = MemoryStore::builder().clock(clock).build();
    let policy = Policy::fixed_window(1, Duration::from_secs(1)).expect("valid policy");
    assert!(admits_now(&store, b"k", &policy, 1));
    let second = store.check_now(b"k", &policy, 1).expect("decided");
    assert!(!second.is_allowed(), "{second:?}");
    assert_eq!(
        second.reset_after_micros(),
        1_000_000,
        "decided at 2.0 s: {second:?}"
    );
    assert_eq!(
        second.retry_after_micros(),
        1_000_000,
        "decided at 2.0 s: {second:?}"
    );
}

/// GCRA checks of a known key decide under the shard's shared lock (one
/// compare-and-swap), leaky-bucket checks under the exclusive one; threads
/// racing on one key while the clock moves admit at most what the policy
/// allows over the time that passed: `burst + elapsed / interval`, exactly.
#[test]
fn one_word_states_admit_at_most_the_rate_under_threads_and_a_moving_clock() {
    const BURST: u64 = 50;
    const THREADS: usize = 4;
    const STEPS: u64 = 200;
    const STEP_MICROS: u64 = 1_000; // one unit per 1,000 µs: one per step
    let policies = [
        Policy::gcra(BURST, Rate::per_second(1_000)).unwrap(),
        Policy::leaky_bucket(BURST, Rate::per_second(1_000)).unwrap(),
    ];
    for policy in policies {
        let clock = ManualClock::new(1_000_000_007);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        // The key exists before the race, so every check below can take
        // the shared path.
        assert!(admits_now(&store, b"hot", &policy, 1));
        let admitted = AtomicU64::new(1);
        let done = std::sync::atomic::AtomicBool::new(false);
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    // Bounded: at most 200,000 checks per thread.
                    for _ in 0..200_000 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        let cost =
                            1 + u64::from(admitted.load(Ordering::Relaxed).is_multiple_of(3));
                        let start = clock.now();
                        let d = store.check_now(b"hot", &policy, cost).unwrap();
                        // A check may be decided at a time read before
                        // other threads' later decisions: its reset and
                        // retry times are then longer by at most the time
                        // that passed during the call (conservative).
                        let late = clock.now() - start;
                        assert!(
                            d.reset_after_micros() <= BURST * STEP_MICROS + late,
                            "{d:?}"
                        );
                        if d.is_allowed() {
                            admitted.fetch_add(cost, Ordering::Relaxed);
                            assert!(d.remaining() < BURST, "{d:?}");
                        } else {
                            assert!(d.retry_after_micros() > 0, "{d:?}");
                            assert!(d.retry_after_micros() <= cost * STEP_MICROS + late, "{d:?}");
                        }
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..STEPS {
                    clock.advance(Duration::from_micros(STEP_MICROS));
                    thread::yield_now();
                }
                done.store(true, Ordering::Relaxed);
            });
        });
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(
            admitted <= BURST + STEPS,
            "{}: {admitted} admitted, at most {} allowed",
            policy.name(),
            BURST + STEPS
        );
        // The threads kept the key drained: the first burst at least passed.
        assert!(admitted >= BURST, "{}: {admitted}", policy.name());
    }
}

/// Checks on the shared path racing with an operator's blocks, penalties,
/// rewards and resets on the same key: a check that starts after a block
/// was set and ends before it is lifted is denied, and with the clock
/// frozen no more passes than full budgets given (the first and one per
/// reset) plus what rewards gave back.
#[test]
fn shared_path_races_with_blocks_penalties_and_resets() {
    const BURST: u64 = 100;
    const ROUNDS: u64 = 300;
    let policy = Policy::gcra(BURST, Rate::per_hour(1)).unwrap();
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_000_000_007))
        .build();
    // Odd while the operator holds a block, even otherwise.
    let generation = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mut resets, mut rewarded) = (0, 0);
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..2_000_000 {
                    if done.load(Ordering::SeqCst) {
                        break;
                    }
                    let before = generation.load(Ordering::SeqCst);
                    let d = store.check_now(b"hot", &policy, 1).unwrap();
                    let after = generation.load(Ordering::SeqCst);
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        assert!(
                            !(before == after && before % 2 == 1),
                            "allowed while blocked: {d:?}"
                        );
                    }
                }
            });
        }
        // The operator starts once the checkers have drained the first
        // burst: on a loaded machine they may start after all its rounds.
        let start = std::time::Instant::now();
        while admitted.load(Ordering::SeqCst) < BURST && start.elapsed() < Duration::from_secs(30) {
            thread::yield_now();
        }
        for round in 0..ROUNDS {
            match round % 5 {
                0 => {
                    store
                        .block(b"hot", &policy, Duration::from_secs(60))
                        .into_inner()
                        .unwrap();
                    generation.fetch_add(1, Ordering::SeqCst);
                    // Budget back while blocked: only the block denies now.
                    store
                        .reward(b"hot", &policy, BURST / 2)
                        .into_inner()
                        .unwrap();
                    rewarded += BURST / 2;
                    for _ in 0..20 {
                        thread::yield_now();
                    }
                    generation.fetch_add(1, Ordering::SeqCst);
                    store
                        .unblock(b"hot", &policy)
                        .into_inner()
                        .expect("unblock");
                }
                1 => {
                    store.penalize(b"hot", &policy, 7).into_inner().unwrap();
                }
                2 => {
                    store.reward(b"hot", &policy, 3).into_inner().unwrap();
                    rewarded += 3;
                }
                3 => {
                    store.reset(b"hot", &policy).into_inner().expect("reset");
                    resets += 1;
                }
                _ => thread::yield_now(),
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    let admitted = admitted.load(Ordering::SeqCst);
    let bound = BURST * (1 + resets) + rewarded;
    assert!(admitted <= bound, "{admitted} admitted, at most {bound}");
    assert!(admitted >= BURST, "{admitted}");
}

/// Many GCRA keys of every length (0 to 40 bytes, printable and binary)
/// through the tables' growth: every key keeps its own state (a denial
/// after its one unit), none is lost or shared when its table is rebuilt.
#[test]
fn one_word_states_survive_their_tables_growth() {
    let policy = Policy::gcra(1, Rate::per_hour(1)).unwrap();
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_000_000_007))
        .build();
    let keys: Vec<Vec<u8>> = (0u32..6_000)
        .map(|i| {
            let len = (i % 41) as usize;
            let mut key: Vec<u8> = i.to_le_bytes().iter().copied().cycle().take(len).collect();
            if i % 2 == 0 {
                key.iter_mut().for_each(|b| *b = b'a' + *b % 26);
            }
            if let Some(first) = key.first_mut() {
                // Distinct keys of one length: the index in the first bytes.
                *first = (i / 41).to_le_bytes()[0];
            }
            key
        })
        .collect();
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    let mut admitted = 0;
    for key in &keys {
        admitted += u64::from(store.check_now(key, &policy, 1).unwrap().is_allowed());
    }
    assert_eq!(admitted, distinct.len() as u64, "one unit per distinct key");
    assert_eq!(store.len(), distinct.len());
    for key in &distinct {
        let again = store.check_now(key, &policy, 1).unwrap();
        assert!(!again.is_allowed(), "{key:?} lost its state: {again:?}");
    }
}
