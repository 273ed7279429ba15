//! Changed numbers under one policy name (a reload, a deploy that changes a
//! limit, two versions of a service on one Redis): every algorithm, on
//! `MemoryStore` and on `RedisStore` against a real server, replaying one
//! timeline on one manual clock, reads a state written under other
//! parameters as a valid state of its own, decides within its new limit,
//! and never panics, wraps or reports values out of range. Both stores give
//! the same decision, field by field.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Decision, MemoryStore, Policy, Rate, Store};
use ratelimit_tests::RedisServer;

const SECOND: u64 = 1_000_000;

/// A whole Unix second in µs that is a multiple of 180 s, so windows of 45 s
/// and of 60 s both start on it.
const B: u64 = 1_762_999_920 * SECOND;

fn named(policy: Policy) -> Policy {
    policy.with_name("changing").expect("valid name")
}

/// Everything observable of a decision but its permit (the ids differ).
fn observable(d: &Decision) -> (bool, u64, u64, u64, u64, u64) {
    (
        d.is_allowed(),
        d.limit(),
        d.remaining(),
        d.reset_after_micros(),
        d.retry_after_micros(),
        d.delay_micros(),
    )
}

/// Both stores on one clock.
struct Pair {
    memory: MemoryStore<ManualClock>,
    redis: RedisStore,
    clock: ManualClock,
}

impl Pair {
    async fn new(server: &RedisServer, now: u64) -> Pair {
        let clock = ManualClock::new(now);
        Pair {
            memory: MemoryStore::builder().clock(clock.clone()).build(),
            redis: RedisStore::builder(server.url())
                .script_clock_for_tests(clock.clone())
                .call_timeout(Duration::from_secs(5))
                .build()
                .await
                .expect("redis store"),
            clock,
        }
    }

    fn at(&self, now: u64) {
        self.clock.set(now);
    }

    /// One check on both stores, which must agree; memory's decision.
    async fn check(&self, key: &str, policy: &Policy, cost: u64) -> Decision {
        let memory = self.memory.check(key.as_bytes(), policy, cost).await;
        let redis = self.redis.check(key.as_bytes(), policy, cost).await;
        let (memory, redis) = match (memory, redis) {
            (Ok(m), Ok(r)) => (m, r),
            (m, r) => panic!("{key} cost {cost}: memory {m:?}, redis {r:?}"),
        };
        assert_eq!(
            observable(&memory),
            observable(&redis),
            "{key} cost {cost} under {:?}",
            policy.algorithm()
        );
        memory
    }
}

/// Issue 12, item 4: a concurrency max lowered under the same name. Redis
/// answered remaining -1 (a reply that did not decode, so the failure
/// policy decided); memory computed `max - held` (a panic in debug).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_concurrency_max_denies_with_nothing_remaining() {
    let server = RedisServer::start();
    let stores = Pair::new(&server, B).await;
    let wide = named(Policy::concurrency(5, Duration::from_secs(1)).unwrap());
    let narrow = named(Policy::concurrency(2, Duration::from_millis(500)).unwrap());
    for i in 0..4 {
        stores.at(B + i * 100_000);
        assert!(stores.check("k", &wide, 1).await.is_allowed());
    }
    // Four held (their leases end at 1.0 s .. 1.3 s) under a max of 2.
    stores.at(B + 400_000);
    let d = stores.check("k", &narrow, 1).await;
    assert_eq!((d.is_allowed(), d.limit(), d.remaining()), (false, 2, 0));
    assert_eq!(d.retry_after_micros(), 800_000, "three must end first");
    assert_eq!(d.reset_after_micros(), 900_000);
    let peek = stores.check("k", &narrow, 0).await;
    assert_eq!((peek.is_allowed(), peek.remaining()), (false, 0));
    stores.at(B + 1_200_000 - 1);
    assert!(!stores.check("k", &narrow, 1).await.is_allowed());
    stores.at(B + 1_200_000);
    let d = stores.check("k", &narrow, 1).await;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
    assert!(d.permit().is_some());
}

/// Issue 12, item 5: a sliding window counter's window changed from 60 s to
/// 45 s under one name, with the state "w<60 s> 8 2" (10 per window).
/// Memory underflowed (`previous * (w - elapsed)`); Redis weighed the
/// previous window negatively and admitted past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_counter_window_change_never_over_admits() {
    let server = RedisServer::start();
    let stores = Pair::new(&server, B + 10 * SECOND).await;
    let minute = named(Policy::sliding_window_counter(10, Duration::from_secs(60)).unwrap());
    let shorter = named(Policy::sliding_window_counter(10, Duration::from_secs(45)).unwrap());
    assert!(stores.check("k", &minute, 8).await.is_allowed());
    stores.at(B + 61 * SECOND);
    assert!(stores.check("k", &minute, 2).await.is_allowed());
    // The 2 units of the minute that began at 60 s belong to the 45 s window
    // that holds its start, [45 s, 90 s), and weigh into [90 s, 135 s) as
    // its previous window: 9 more pass there, one at a time.
    let mut admitted = 0;
    for s in 106..135 {
        stores.at(B + s * SECOND);
        loop {
            let d = stores.check("k", &shorter, 1).await;
            assert!(d.remaining() <= 10, "{d:?}");
            assert!(d.reset_after_micros() <= 90 * SECOND, "{d:?}");
            assert!(d.retry_after_micros() <= 90 * SECOND, "{d:?}");
            if !d.is_allowed() {
                break;
            }
            admitted += 1;
            assert!(admitted <= 10, "over the limit within one 45 s window");
        }
    }
    assert_eq!(admitted, 9);
}

/// A fixed window's count from a 60 s window counts in the 45 s window that
/// holds its start, until that window ends, and the retry time says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_start_of_another_length_counts_until_its_new_window_ends() {
    let server = RedisServer::start();
    let stores = Pair::new(&server, B + 61 * SECOND).await;
    let minute = named(Policy::fixed_window(10, Duration::from_secs(60)).unwrap());
    let shorter = named(Policy::fixed_window(10, Duration::from_secs(45)).unwrap());
    assert!(stores.check("k", &minute, 10).await.is_allowed());
    stores.at(B + 70 * SECOND);
    let d = stores.check("k", &shorter, 1).await;
    assert_eq!((d.is_allowed(), d.remaining()), (false, 0));
    assert_eq!(d.retry_after_micros(), 20 * SECOND);
    stores.at(B + 90 * SECOND);
    assert!(stores.check("k", &shorter, 10).await.is_allowed());
}

/// A token bucket whose capacity was lowered: the tokens above the new
/// capacity are a full bucket, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_above_a_lowered_capacity_is_a_full_bucket() {
    let server = RedisServer::start();
    let stores = Pair::new(&server, B).await;
    let large = named(Policy::token_bucket(100, Rate::per_second(100)).unwrap());
    let small = named(Policy::token_bucket(4, Rate::per_second(4)).unwrap());
    let d = stores.check("k", &large, 1).await;
    assert_eq!(d.remaining(), 99);
    stores.at(B + 5_000);
    let d = stores.check("k", &small, 1).await;
    assert_eq!((d.is_allowed(), d.limit(), d.remaining()), (true, 4, 3));
    let d = stores.check("k", &small, 4).await;
    assert_eq!((d.is_allowed(), d.remaining()), (false, 3));
    assert_eq!(d.retry_after_micros(), 250_000);
}
