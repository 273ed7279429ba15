//! Calendar periods and admin operations on `RedisStore` beside
//! `MemoryStore`: penalty and reward TTLs no longer than the period, a
//! block on a calendar key that consumes nothing and keeps a TTL, rewards
//! never past a full budget.
//!
//! Times are replayed on a manual clock (`script_clock_for_tests`, so every
//! Redis TTL carries an hour of slack, see prelude.lua).

use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{AdminStore, MemoryStore, Period, Policy, Store};
use ratelimit_tests::{RedisServer, observable, twin_stores};

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;
const DAY: u64 = 24 * HOUR;
/// The hour a test clock adds to every TTL (prelude.lua), in ms.
const SLACK_MS: i64 = 3_600_000;

/// 2024-01-01 00:00 UTC (19,723 days after 1970-01-01).
const JAN_1_2024: u64 = 19_723 * DAY;
/// 2024-12-31 00:00 UTC (2024 is a leap year: 366 days).
const DEC_31_2024: u64 = JAN_1_2024 + 365 * DAY;
/// 2024-01-31 00:00 UTC.
const JAN_31_2024: u64 = JAN_1_2024 + 30 * DAY;

/// Asks `memory` and `redis` the same admin call or check: both answer
/// alike (`observable`); the memory store's answer.
macro_rules! both {
    ($memory:ident, $redis:ident, $op:ident($($arg:expr),*)) => {{
        let m = $memory.$op($($arg),*).await.expect("memory");
        let r = $redis.$op($($arg),*).await.expect("redis");
        assert_eq!(observable(&m), observable(&r), "{}", stringify!($op($($arg),*)));
        m
    }};
}

/// A Redis server, and a memory store and a Redis store on one manual
/// clock at `now`, with a calendar policy `name` of `limit` per `period`.
async fn calendar_twins(
    now: u64,
    limit: u64,
    period: impl Into<ratelimit_core::algorithm::Calendar>,
    name: &str,
) -> (RedisServer, MemoryStore<ManualClock>, RedisStore, Policy) {
    let server = RedisServer::start();
    let clock = ManualClock::new(now);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let policy = Policy::calendar(limit, period)
        .expect("valid")
        .with_name(name)
        .expect("a name");
    (server, memory, redis, policy)
}

/// Asserts that `key` has a TTL, of at most `needed` µs (and the test
/// clock's hour of slack).
fn ttl_within(server: &RedisServer, key: &str, needed: u64) {
    let ttl = pttl(server, key);
    let needed = i64::try_from(needed.div_ceil(1_000)).expect("small");
    assert!(
        ttl > 0 && ttl <= needed + SLACK_MS,
        "{key}: TTL {ttl} ms for a count that matters {needed} ms"
    );
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).trim().parse().expect("a TTL")
}

/// A penalty under a yearly calendar on Dec 31 at noon: the count only
/// matters until the year ends (12 h), since a fixed window's penalty never
/// carries over. The key's TTL should outlast the period, and no more than
/// needed: at most 12 h (+ the test clock's hour of slack), although
/// adjust.lua passes `2 × (stop - start)` to `rewrite`. (Held.)
#[tokio::test]
async fn penalty_ttl_under_a_calendar_year_is_no_longer_than_the_year() {
    let (server, memory, redis, yearly) =
        calendar_twins(DEC_31_2024 + 12 * HOUR, 10, Period::Year, "yearly").await;
    let key = b"tenant";
    let m = both!(memory, redis, penalize(key, &yearly, 3));
    assert_eq!(m.reset_after_micros(), 12 * HOUR);
    ttl_within(&server, &redis.state_key(key, &yearly), 12 * HOUR);
}

/// The same under a monthly calendar, after a reward that leaves a count.
/// (Held.)
#[tokio::test]
async fn reward_ttl_under_a_calendar_month_is_no_longer_than_the_month() {
    let (server, _memory, redis, monthly) =
        calendar_twins(JAN_31_2024 + 12 * HOUR, 10, Period::Month, "monthly").await;
    let key = b"tenant";
    assert!(
        redis
            .check(key, &monthly, 5)
            .await
            .expect("redis")
            .is_allowed()
    );
    let d = redis.reward(key, &monthly, 1).await.expect("redis");
    assert_eq!(d.remaining(), 6);
    ttl_within(&server, &redis.state_key(key, &monthly), 12 * HOUR);
}

/// A block on a calendar key (the longest duration, capped) denies every
/// check and consumes nothing on both stores; the key keeps a TTL; an
/// unblock gives back exactly the budget before, and the key's TTL shrinks
/// back to the period's end.
#[tokio::test]
async fn a_block_on_a_calendar_key_consumes_nothing_and_keeps_a_ttl() {
    let (server, memory, redis, daily) = calendar_twins(
        JAN_31_2024 + 12 * HOUR,
        5,
        Period::Day.utc_offset(-86_399),
        "daily",
    )
    .await;
    let key = b"blocked";
    both!(memory, redis, check(key, &daily, 2));
    for duration in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(1),
    ] {
        memory.block(key, &daily, duration).await.expect("memory");
        redis.block(key, &daily, duration).await.expect("redis");
        for cost in [0, 1, 3, 5] {
            let m = memory.check(key, &daily, cost).await.expect("memory");
            let r = redis.check(key, &daily, cost).await.expect("redis");
            assert!(
                !m.is_allowed() && !r.is_allowed(),
                "{duration:?} {cost}: {m:?} {r:?}"
            );
            assert_eq!(observable(&m), observable(&r), "{duration:?} {cost}");
        }
        let ttl = pttl(&server, &redis.state_key(key, &daily));
        assert!(ttl > 0, "{duration:?}: TTL {ttl}");
        memory.unblock(key, &daily).await.expect("memory");
        redis.unblock(key, &daily).await.expect("redis");
        let m = both!(memory, redis, peek(key, &daily));
        assert_eq!(
            m.remaining(),
            3,
            "{duration:?}: the block consumed something"
        );
        // After the unblock, down to the day's end.
        ttl_within(
            &server,
            &redis.state_key(key, &daily),
            m.reset_after_micros(),
        );
    }
}

/// Rewards never give more than a full budget, whatever the amount, on a
/// fresh key, a spent one and a penalised one, on both stores.
#[tokio::test]
async fn rewards_never_exceed_a_full_calendar_budget() {
    let (_server, memory, redis, weekly) = calendar_twins(
        DEC_31_2024 + 23 * HOUR,
        4,
        Period::Week.utc_offset(86_399),
        "weekly",
    )
    .await;
    let key = b"rewarded";
    for amount in [1, 4, 5, u64::MAX / 2, u64::MAX] {
        let m = both!(memory, redis, reward(key, &weekly, amount));
        assert!(m.remaining() <= 4);
        both!(memory, redis, penalize(key, &weekly, amount));
        let m = both!(memory, redis, reward(key, &weekly, amount));
        assert!(m.remaining() <= 4);
        let admitted = {
            let mut n = 0;
            for _ in 0..6 {
                let m = both!(memory, redis, check(key, &weekly, 1));
                n += u64::from(m.is_allowed());
            }
            n
        };
        assert!(admitted <= 4, "{amount}: admitted {admitted}");
        memory.reset(key, &weekly).await.expect("memory");
        redis.reset(key, &weekly).await.expect("redis");
    }
}
