//! Review of calendar periods and admin operations on `RedisStore` beside
//! `MemoryStore` (no-context adversarial review): penalty and reward TTLs,
//! blocks and rewards.
//!
//! Times are replayed on a manual clock (`script_clock_for_tests`, so every
//! Redis TTL carries an hour of slack, see prelude.lua).

use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{AdminStore, Period, Policy, Store};
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

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).trim().parse().expect("a TTL")
}

/// A penalty under a yearly calendar on Dec 31 at noon: the count only
/// matters until the year ends (12 h), since a fixed window's penalty never
/// carries over. The key's TTL should outlast the period, and no more than
/// needed: at most 12 h (+ the test clock's hour of slack), although
/// adjust.lua passes `2 × (stop - start)` to `rewrite`. (Held.)
#[tokio::test]
async fn review_penalty_ttl_under_a_calendar_year_is_no_longer_than_the_year() {
    let server = RedisServer::start();
    let clock = ManualClock::new(DEC_31_2024 + 12 * HOUR);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let yearly = Policy::calendar(10, Period::Year)
        .expect("valid")
        .with_name("yearly")
        .expect("a name");
    let key = b"tenant";
    let m = memory.penalize(key, &yearly, 3).await.expect("memory");
    let r = redis.penalize(key, &yearly, 3).await.expect("redis");
    assert_eq!(observable(&m), observable(&r), "{m:?} {r:?}");
    assert_eq!(m.reset_after_micros(), 12 * HOUR);
    let ttl = pttl(&server, &redis.state_key(key, &yearly));
    let needed = i64::try_from(12 * HOUR / 1_000).unwrap();
    assert!(
        ttl > 0 && ttl <= needed + SLACK_MS,
        "TTL {ttl} ms, {:.1} days, for a count that matters {needed} ms",
        ttl as f64 / 86_400_000.0
    );
}

/// The same under a monthly calendar, after a reward that leaves a count.
/// (Held.)
#[tokio::test]
async fn review_reward_ttl_under_a_calendar_month_is_no_longer_than_the_month() {
    let server = RedisServer::start();
    let clock = ManualClock::new(JAN_31_2024 + 12 * HOUR);
    let (_memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let monthly = Policy::calendar(10, Period::Month)
        .expect("valid")
        .with_name("monthly")
        .expect("a name");
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
    let ttl = pttl(&server, &redis.state_key(key, &monthly));
    let needed = i64::try_from(12 * HOUR / 1_000).unwrap();
    assert!(
        ttl > 0 && ttl <= needed + SLACK_MS,
        "TTL {ttl} ms for a count that matters {needed} ms"
    );
}

/// A block on a calendar key (the longest duration, capped) denies every
/// check and consumes nothing on both stores; the key keeps a TTL; an
/// unblock gives back exactly the budget before, and the key's TTL shrinks
/// back to the period's end.
#[tokio::test]
async fn review_a_block_on_a_calendar_key_consumes_nothing_and_keeps_a_ttl() {
    let server = RedisServer::start();
    let clock = ManualClock::new(JAN_31_2024 + 12 * HOUR);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let daily = Policy::calendar(5, Period::Day.utc_offset(-86_399))
        .expect("valid")
        .with_name("daily")
        .expect("a name");
    let key = b"blocked";
    let m = memory.check(key, &daily, 2).await.expect("memory");
    let r = redis.check(key, &daily, 2).await.expect("redis");
    assert_eq!(observable(&m), observable(&r));
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
        let m = memory.peek(key, &daily).await.expect("memory");
        let r = redis.peek(key, &daily).await.expect("redis");
        assert_eq!(observable(&m), observable(&r));
        assert_eq!(
            m.remaining(),
            3,
            "{duration:?}: the block consumed something"
        );
        let ttl = pttl(&server, &redis.state_key(key, &daily));
        let until_end = i64::try_from(m.reset_after_micros().div_ceil(1_000)).unwrap();
        assert!(
            ttl > 0 && ttl <= until_end + SLACK_MS,
            "{duration:?}: TTL {ttl} after the unblock, {until_end} to the day's end"
        );
    }
}

/// Rewards never give more than a full budget, whatever the amount, on a
/// fresh key, a spent one and a penalised one, on both stores.
#[tokio::test]
async fn review_rewards_never_exceed_a_full_calendar_budget() {
    let server = RedisServer::start();
    let clock = ManualClock::new(DEC_31_2024 + 23 * HOUR);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let weekly = Policy::calendar(4, Period::Week.utc_offset(86_399))
        .expect("valid")
        .with_name("weekly")
        .expect("a name");
    let key = b"rewarded";
    for amount in [1, 4, 5, u64::MAX / 2, u64::MAX] {
        let m = memory.reward(key, &weekly, amount).await.expect("memory");
        let r = redis.reward(key, &weekly, amount).await.expect("redis");
        assert_eq!(observable(&m), observable(&r), "{amount}");
        assert!(m.remaining() <= 4);
        let m = memory.penalize(key, &weekly, amount).await.expect("memory");
        let r = redis.penalize(key, &weekly, amount).await.expect("redis");
        assert_eq!(observable(&m), observable(&r), "{amount}");
        let m = memory.reward(key, &weekly, amount).await.expect("memory");
        let r = redis.reward(key, &weekly, amount).await.expect("redis");
        assert_eq!(observable(&m), observable(&r), "{amount}");
        assert!(m.remaining() <= 4);
        let admitted = {
            let mut n = 0;
            for _ in 0..6 {
                let m = memory.check(key, &weekly, 1).await.expect("memory");
                let r = redis.check(key, &weekly, 1).await.expect("redis");
                assert_eq!(observable(&m), observable(&r), "{amount}");
                n += u64::from(m.is_allowed());
            }
            n
        };
        assert!(admitted <= 4, "{amount}: admitted {admitted}");
        memory.reset(key, &weekly).await.expect("memory");
        redis.reset(key, &weekly).await.expect("redis");
    }
}
