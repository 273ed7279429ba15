//! Calendar periods (`Policy::calendar`): fixed windows whose edges are the
//! calendar's, on both stores.
//!
//! - The Lua period arithmetic against Rust's, on many random times from
//!   1970 to beyond 2112, every period, offsets from -23:59:59 to +23:59:59,
//!   and the microseconds on either side of each edge (one `EVAL` each).
//! - Timelines across month ends (Jan 31 -> Feb 1, Feb 28 -> Feb 29 ->
//!   Mar 1 in a leap year, Feb 28 -> Mar 1 in another, Dec 31 -> Jan 1),
//!   ISO week edges (one across a new year) and fixed offsets, replayed on
//!   a manual clock through a `MemoryStore` and a `RedisStore` side by side
//!   (single node by functions, single node by scripts, cluster): the same
//!   decisions, each as the calendar says, and every Redis key living at
//!   least until its period's real end.
//! - Admin operations and several limits at once, a calendar policy beside
//!   a plain fixed window of the same numbers (no shared key).
//! - The server's own `TIME`: the reset and the TTL reach the real end of
//!   today, this week, this month.
//! - The configuration (`period`, `utc_offset`), its refusals, and the
//!   headers a layer writes.
//!
//! Expected dates are computed here by counting days from 1970, not by the
//! library's arithmetic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelimit_core::algorithm::FixedWindow;
use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::{RedisStore, RedisStoreBuilder, window_bounds_script_for_tests};
use ratelimit_core::{
    AdminStore, Algorithm, Check, Decision, MemoryStore, Period, Policy, PolicyError, Store,
};
use ratelimit_tests::fixtures::{Rng, answer, by_client, ok_service, request_from};
use ratelimit_tests::{
    CALL_TIMEOUT, Observed, RedisCluster, RedisServer, build, cluster_slot, observable, twin_stores,
};
use ratelimit_tower::RateLimitLayer;
use ratelimit_tower::config::{Config, ConfigErrorKind};
use tower::Layer;

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;
const DAY: u64 = 24 * HOUR;

fn leap(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

/// `year`-`month`-`day` at 00:00 UTC in µs of Unix time, by counting the
/// days of every year and month since 1970.
fn utc(year: u64, month: u64, day: u64) -> u64 {
    let years: u64 = (1970..year).map(|y| if leap(y) { 366 } else { 365 }).sum();
    let february = if leap(year) { 29 } else { 28 };
    let lengths = [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let months: u64 = lengths[..usize::try_from(month - 1).unwrap()].iter().sum();
    (years + months + day - 1) * DAY
}

fn calendar(limit: u64, period: impl Into<ratelimit_core::algorithm::Calendar>) -> Policy {
    Policy::calendar(limit, period).expect("a valid calendar policy")
}

fn window_of(policy: &Policy) -> FixedWindow {
    match policy.algorithm() {
        Algorithm::FixedWindow(window) => *window,
        other => panic!("not a fixed window: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// The Lua arithmetic against Rust's
// ---------------------------------------------------------------------------

/// Every period at offsets across the whole range, and plain windows (the
/// other branch of the same Lua function): for random times from the epoch
/// to 2^53 µs, and the microseconds around each period's edges, the window
/// Lua computes is the one Rust computes.
#[tokio::test]
async fn lua_and_rust_agree_on_the_window_of_every_time() {
    let server = RedisServer::start();
    let mut connection = redis::Client::open(server.url())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let mut policies: Vec<Policy> = Vec::new();
    for period in Period::ALL {
        for offset in [
            -86_399, -43_200, -34_200, -1, 0, 1, 3_600, 19_800, 50_400, 86_399,
        ] {
            policies.push(calendar(1, period.utc_offset(offset)));
        }
    }
    for window in [1, 999_983, DAY, 7 * DAY, 30 * DAY] {
        policies.push(Policy::fixed_window(1, Duration::from_micros(window)).expect("valid"));
    }
    let mut rng = Rng(0x5eed_ca1e_da75_0001);
    let mut compared = 0;
    for policy in &policies {
        let window = window_of(policy);
        let mut times: Vec<u64> = Vec::new();
        // Random times: anywhere below 2^52 µs (2112), near the epoch
        // (periods clamped at 0), now, and up to 2^53 µs (2255).
        for _ in 0..600 {
            times.push(rng.below(1 << 52));
        }
        for _ in 0..100 {
            times.push(rng.below(3 * 366 * DAY));
            times.push(utc(2020, 1, 1) + rng.below(20 * 366 * DAY));
            times.push((1 << 52) + rng.below((1 << 53) - (1 << 52) - (1 << 40)));
        }
        times.extend([0, 1, (1 << 52) - 1, (1 << 53) - (1 << 40)]);
        // The microseconds on either side of the edges of random periods.
        for _ in 0..100 {
            let (start, end) = window.bounds(rng.below(1 << 52));
            times.extend([start.saturating_sub(1), start, end - 1, end]);
        }
        let script = window_bounds_script_for_tests(policy);
        let reply: Vec<u64> = redis::cmd("EVAL")
            .arg(&script)
            .arg(0)
            .arg(&times)
            .query_async(&mut connection)
            .await
            .expect("the script runs");
        assert_eq!(reply.len(), 2 * times.len());
        for (i, &t) in times.iter().enumerate() {
            let lua = (reply[2 * i], reply[2 * i + 1]);
            let rust = window.bounds(t);
            assert_eq!(lua, rust, "{} at {t}", policy.name());
            assert!(
                rust.0 <= t && t < rust.1,
                "{} at {t}: {rust:?}",
                policy.name()
            );
            compared += 1;
        }
    }
    assert!(compared > 50_000, "{compared}");
}

// ---------------------------------------------------------------------------
// Both stores on one timeline
// ---------------------------------------------------------------------------

/// What one step expects of both stores.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Allowed, with this remaining and this reset (µs).
    Allowed(u64, u64),
    /// Denied, with this retry (µs).
    Denied(u64),
}
use Expect::{Allowed, Denied};

/// A key's timeline under one policy: (time, cost, expected) steps.
struct Timeline {
    key: &'static str,
    policy: Policy,
    steps: Vec<(u64, u64, Expect)>,
}

/// Month ends, leap days, year ends, ISO weeks and fixed offsets, each with a
/// limit of 3: the budget spent before an edge is denied up to its last µs
/// and whole again at the edge, and each reset counts to the real end.
fn timelines() -> Vec<Timeline> {
    let month = calendar(3, Period::Month);
    vec![
        Timeline {
            key: "feb-28-to-mar-1-2023",
            policy: month.clone(),
            steps: vec![
                (utc(2023, 1, 15), 0, Allowed(3, 0)),
                (utc(2023, 2, 1), 1, Allowed(2, 28 * DAY)),
                (utc(2023, 2, 28) + 12 * HOUR, 2, Allowed(0, 12 * HOUR)),
                (utc(2023, 3, 1) - 1, 1, Denied(1)),
                (utc(2023, 3, 1), 1, Allowed(2, 31 * DAY)),
            ],
        },
        Timeline {
            key: "jan-31-to-mar-1-2024",
            policy: month.clone(),
            steps: vec![
                (utc(2024, 1, 31) + 12 * HOUR, 3, Allowed(0, 12 * HOUR)),
                (utc(2024, 2, 1) - 1, 1, Denied(1)),
                (utc(2024, 2, 1), 1, Allowed(2, 29 * DAY)),
                (utc(2024, 2, 28) + 12 * HOUR, 2, Allowed(0, 36 * HOUR)),
                (utc(2024, 2, 29) + 12 * HOUR, 1, Denied(12 * HOUR)),
                (utc(2024, 3, 1), 1, Allowed(2, 31 * DAY)),
            ],
        },
        Timeline {
            key: "dec-31-to-jan-1-month",
            policy: month,
            steps: vec![
                (utc(2024, 12, 31) + 12 * HOUR, 3, Allowed(0, 12 * HOUR)),
                (utc(2025, 1, 1) - 1, 1, Denied(1)),
                (utc(2025, 1, 1), 1, Allowed(2, 31 * DAY)),
            ],
        },
        Timeline {
            key: "leap-day",
            policy: calendar(3, Period::Day),
            steps: vec![
                (utc(2024, 2, 28) + 23 * HOUR, 3, Allowed(0, HOUR)),
                (utc(2024, 2, 29), 3, Allowed(0, DAY)),
                (utc(2024, 3, 1) - 1, 1, Denied(1)),
                (utc(2024, 3, 1), 1, Allowed(2, DAY)),
            ],
        },
        Timeline {
            key: "dec-31-to-jan-1-year",
            policy: calendar(3, Period::Year),
            steps: vec![
                (utc(2024, 6, 1), 1, Allowed(2, 214 * DAY)),
                (utc(2024, 12, 31) + 12 * HOUR, 2, Allowed(0, 12 * HOUR)),
                (utc(2025, 1, 1) - 1, 1, Denied(1)),
                (utc(2025, 1, 1), 1, Allowed(2, 365 * DAY)),
            ],
        },
        // 2024-02-01 was a Thursday, 2024-02-05 a Monday.
        Timeline {
            key: "week-to-monday",
            policy: calendar(3, Period::Week),
            steps: vec![
                (utc(2024, 2, 1), 3, Allowed(0, 4 * DAY)),
                (utc(2024, 2, 5) - 1, 1, Denied(1)),
                (utc(2024, 2, 5), 1, Allowed(2, 7 * DAY)),
            ],
        },
        // The ISO week from Monday 2024-12-30 to Monday 2025-01-06: one
        // window across the new year.
        Timeline {
            key: "week-across-new-year",
            policy: calendar(3, Period::Week),
            steps: vec![
                (utc(2024, 12, 30), 2, Allowed(1, 7 * DAY)),
                (utc(2025, 1, 1), 1, Allowed(0, 5 * DAY)),
                (utc(2025, 1, 5) + 23 * HOUR, 1, Denied(HOUR)),
                (utc(2025, 1, 6), 1, Allowed(2, 7 * DAY)),
            ],
        },
        // UTC+02:00: the day starts at 22:00 UTC the day before.
        Timeline {
            key: "day-at-utc-plus-2",
            policy: calendar(3, Period::Day.utc_offset(2 * 3_600)),
            steps: vec![
                (utc(2024, 2, 29) + 21 * HOUR, 3, Allowed(0, HOUR)),
                (utc(2024, 2, 29) + 22 * HOUR - 1, 1, Denied(1)),
                (utc(2024, 2, 29) + 22 * HOUR, 1, Allowed(2, DAY)),
            ],
        },
        // UTC-05:00: February 2024 runs from Feb 1 05:00 to Mar 1 05:00 UTC.
        Timeline {
            key: "month-at-utc-minus-5",
            policy: calendar(3, Period::Month.utc_offset(-5 * 3_600)),
            steps: vec![
                (utc(2024, 2, 1) + 5 * HOUR, 1, Allowed(2, 29 * DAY)),
                (utc(2024, 3, 1) + 4 * HOUR, 2, Allowed(0, HOUR)),
                (utc(2024, 3, 1) + 5 * HOUR - 1, 1, Denied(1)),
                (utc(2024, 3, 1) + 5 * HOUR, 1, Allowed(2, 31 * DAY)),
            ],
        },
        // UTC+14:00: 2025 begins on 2024-12-31 at 10:00 UTC.
        Timeline {
            key: "year-at-utc-plus-14",
            policy: calendar(3, Period::Year.utc_offset(14 * 3_600)),
            steps: vec![
                (utc(2024, 12, 31) + 9 * HOUR, 3, Allowed(0, HOUR)),
                (utc(2024, 12, 31) + 10 * HOUR, 1, Allowed(2, 365 * DAY)),
            ],
        },
    ]
}

/// Checks `d` against `expect`.
fn assert_expected(d: &Decision, expect: Expect, what: &str) {
    match expect {
        Allowed(remaining, reset) => {
            assert!(d.is_allowed(), "{what}: {d:?}");
            assert_eq!(
                (d.remaining(), d.reset_after_micros()),
                (remaining, reset),
                "{what}"
            );
        }
        Denied(retry) => {
            assert!(!d.is_allowed(), "{what}: {d:?}");
            assert_eq!(d.retry_after_micros(), retry, "{what}");
        }
    }
}

/// Replays every timeline through a `MemoryStore` and the `RedisStore`
/// `builder` makes, on one manual clock per timeline: the same decisions,
/// the expected ones; after each admission the Redis key lives at least
/// until its period ends (`pttl` reads a key's TTL in ms; a test clock adds
/// an hour, see prelude.lua), and not much longer.
async fn replay_timelines(builder: impl Fn() -> RedisStoreBuilder, pttl: impl Fn(&str) -> i64) {
    for timeline in timelines() {
        let clock = ManualClock::new(timeline.steps[0].0);
        let (memory, redis) = twin_stores(builder(), &clock).await;
        let key = timeline.key.as_bytes();
        for (i, &(at, cost, expect)) in timeline.steps.iter().enumerate() {
            clock.set(at);
            let what = format!("{} step {i}", timeline.key);
            let m = memory
                .check(key, &timeline.policy, cost)
                .await
                .expect("memory");
            let r = redis
                .check(key, &timeline.policy, cost)
                .await
                .expect("redis");
            assert_eq!(observable(&m), observable(&r), "{what}: {m:?} {r:?}");
            assert_expected(&m, expect, &what);
            if m.is_allowed() && cost > 0 {
                let ttl = pttl(&redis.state_key(key, &timeline.policy));
                let until_end = i64::try_from(m.reset_after_micros().div_ceil(1_000)).unwrap();
                let slack = 3_600_000;
                assert!(
                    ttl > until_end + slack - 60_000 && ttl <= until_end + slack,
                    "{what}: TTL {ttl} ms for {until_end} ms to the period's end"
                );
            }
        }
    }
}

fn pttl_on(server: &RedisServer) -> impl Fn(&str) -> i64 + '_ {
    |key| server.cli(&["PTTL", key]).trim().parse().expect("a TTL")
}

#[tokio::test]
async fn both_stores_decide_alike_across_calendar_edges_by_functions() {
    let server = RedisServer::start();
    replay_timelines(|| RedisStore::builder(server.url()), pttl_on(&server)).await;
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_fcall:"), "{stats}");
}

/// The same by scripts (`EVALSHA`), on a Redis where `FCALL` cannot be used.
#[tokio::test]
async fn both_stores_decide_alike_across_calendar_edges_by_scripts() {
    let server = RedisServer::start_with_args(&["--rename-command", "FCALL", ""]);
    replay_timelines(|| RedisStore::builder(server.url()), pttl_on(&server)).await;
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(!stats.contains("cmdstat_fcall:"), "{stats}");
    assert!(stats.contains("cmdstat_evalsha:"), "{stats}");
}

/// The same on a Redis Cluster, each timeline's key in its own slot.
#[tokio::test]
async fn both_stores_decide_alike_across_calendar_edges_on_a_cluster() {
    let cluster = RedisCluster::start();
    replay_timelines(
        || RedisStore::cluster_builder(cluster.urls()),
        |key| {
            let node = cluster.master_of(cluster_slot(key.as_bytes()));
            cluster
                .cli(node, &["PTTL", key])
                .trim()
                .parse()
                .expect("a TTL")
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// Admin operations and several limits
// ---------------------------------------------------------------------------

/// A penalty, a reward and a block under a monthly policy decide alike on
/// both stores, and a penalty ends with the month.
#[tokio::test]
async fn admin_operations_stay_in_the_calendar_period_on_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new(utc(2024, 1, 31) + 12 * HOUR);
    let (memory, redis) = twin_stores(RedisStore::builder(server.url()), &clock).await;
    let monthly = calendar(3, Period::Month)
        .with_name("monthly")
        .expect("a name");
    let key = b"admin";
    let same = |m: Decision, r: Decision, what: &str| {
        assert_eq!(observable(&m), observable(&r), "{what}: {m:?} {r:?}");
        m
    };
    let d = same(
        memory.penalize(key, &monthly, 5).await.expect("memory"),
        redis.penalize(key, &monthly, 5).await.expect("redis"),
        "penalty",
    );
    assert_expected(&d, Denied(12 * HOUR), "penalty");
    let d = same(
        memory.reward(key, &monthly, 3).await.expect("memory"),
        redis.reward(key, &monthly, 3).await.expect("redis"),
        "reward",
    );
    assert_expected(&d, Allowed(1, 12 * HOUR), "reward");
    clock.set(utc(2024, 2, 1));
    let d = same(
        memory.peek(key, &monthly).await.expect("memory"),
        redis.peek(key, &monthly).await.expect("redis"),
        "the next month",
    );
    assert_expected(&d, Allowed(3, 0), "the next month");
    memory
        .block(key, &monthly, Duration::from_secs(3_600))
        .await
        .expect("memory");
    redis
        .block(key, &monthly, Duration::from_secs(3_600))
        .await
        .expect("redis");
    clock.set(utc(2024, 2, 1) + HOUR / 2);
    let d = same(
        memory.check(key, &monthly, 1).await.expect("memory"),
        redis.check(key, &monthly, 1).await.expect("redis"),
        "blocked",
    );
    assert_expected(&d, Denied(HOUR / 2), "blocked");
    clock.set(utc(2024, 2, 1) + HOUR);
    let d = same(
        memory.check(key, &monthly, 1).await.expect("memory"),
        redis.check(key, &monthly, 1).await.expect("redis"),
        "after the block",
    );
    assert_expected(&d, Allowed(2, 29 * DAY - HOUR), "after the block");
}

/// A user under a daily calendar policy (at UTC-01:00) and a plain fixed
/// window of one day, with the same limit: spending one leaves the other
/// whole, and both at once are all or nothing. Returns what `store` (on
/// `clock`) answered, to compare the stores.
async fn keep_apart<S: Store>(store: &S, clock: &ManualClock) -> Vec<Observed> {
    let daily = calendar(3, Period::Day.utc_offset(-3_600));
    let plain = Policy::fixed_window(3, Duration::from_secs(86_400)).expect("valid");
    let key = b"user-1";
    let both = [Check::new(key, &daily, 1), Check::new(key, &plain, 1)];
    let mut seen = Vec::new();
    clock.set(utc(2024, 2, 29) + 12 * HOUR);
    let d = store.check(key, &daily, 3).await.expect("a decision");
    assert_expected(&d, Allowed(0, 13 * HOUR), "daily");
    let all = store.check_all(&both).await.expect("decisions");
    assert!(!all[0].is_allowed() && all[1].is_allowed(), "{all:?}");
    seen.extend(all.iter().map(observable));
    let d = store.check(key, &plain, 3).await.expect("a decision");
    assert_expected(&d, Allowed(0, 12 * HOUR), "plain");
    // The plain window ends at midnight UTC, the calendar day an hour later.
    clock.set(utc(2024, 3, 1));
    let all = store.check_all(&both).await.expect("decisions");
    assert_expected(&all[0], Denied(HOUR), "daily at midnight UTC");
    seen.extend(all.iter().map(observable));
    clock.set(utc(2024, 3, 1) + HOUR);
    let all = store.check_all(&both).await.expect("decisions");
    assert_expected(&all[0], Allowed(2, DAY), "daily");
    assert_expected(&all[1], Allowed(2, 23 * HOUR), "plain");
    seen.extend(all.iter().map(observable));
    seen
}

/// [`keep_apart`] on both stores: the same answers, and two keys in Redis.
async fn calendar_and_plain_windows_keep_apart(builder: RedisStoreBuilder) {
    let (memory_clock, redis_clock) = (ManualClock::new(0), ManualClock::new(0));
    let memory = MemoryStore::builder().clock(memory_clock.clone()).build();
    let redis = build(
        builder
            .script_clock_for_tests(redis_clock.clone())
            .call_timeout(CALL_TIMEOUT),
    )
    .await;
    let daily = calendar(3, Period::Day.utc_offset(-3_600));
    let plain = Policy::fixed_window(3, Duration::from_secs(86_400)).expect("valid");
    assert_ne!(
        redis.state_key(b"user-1", &daily),
        redis.state_key(b"user-1", &plain)
    );
    assert_eq!(
        keep_apart(&memory, &memory_clock).await,
        keep_apart(&redis, &redis_clock).await
    );
}

#[tokio::test]
async fn calendar_and_plain_windows_keep_apart_on_a_node() {
    let server = RedisServer::start();
    calendar_and_plain_windows_keep_apart(RedisStore::builder(server.url())).await;
}

#[tokio::test]
async fn calendar_and_plain_windows_keep_apart_on_a_cluster() {
    let cluster = RedisCluster::start();
    calendar_and_plain_windows_keep_apart(RedisStore::cluster_builder(cluster.urls())).await;
}

// ---------------------------------------------------------------------------
// The server's own time
// ---------------------------------------------------------------------------

fn unix_micros() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_micros(),
    )
    .expect("a time in µs")
}

/// With the server's `TIME` (no test clock), the reset is the time to the
/// real end of today, this week, this month and this year (at an offset
/// too), and each key lives until then: as long as its period, no longer.
#[tokio::test]
async fn the_server_time_decides_and_keys_live_until_the_period_ends() {
    let server = RedisServer::start();
    let redis = build(RedisStore::builder(server.url()).call_timeout(CALL_TIMEOUT)).await;
    let policies = [
        calendar(5, Period::Day),
        calendar(5, Period::Week.utc_offset(-9 * 3_600 - 1_800)),
        calendar(5, Period::Month),
        calendar(5, Period::Year.utc_offset(13 * 3_600)),
    ];
    for policy in &policies {
        let window = window_of(policy);
        let before = unix_micros();
        let d = redis.check(b"now", policy, 2).await.expect("a decision");
        let after = unix_micros();
        assert!(d.is_allowed() && d.remaining() == 3, "{d:?}");
        // The server read its clock between `before` and `after` (one
        // machine, one clock); a period that ended meanwhile leaves two ends.
        let ends = [window.bounds(before).1, window.bounds(after).1];
        let reset = d.reset_after_micros();
        assert!(
            ends.iter()
                .any(|&end| end - after <= reset && reset <= end - before),
            "{}: reset {reset} µs, ends {ends:?}, between {before} and {after}",
            policy.name()
        );
        let ttl: u64 = server
            .cli(&["PTTL", &redis.state_key(b"now", policy)])
            .trim()
            .parse()
            .expect("a TTL");
        let read = unix_micros();
        assert!(
            ends.iter().any(|&end| {
                read + ttl * 1_000 + 1_000 >= end && ttl * 1_000 <= end - before + 1_000
            }),
            "{}: TTL {ttl} ms, ends {ends:?} at {read}",
            policy.name()
        );
    }
}

// ---------------------------------------------------------------------------
// Configuration and headers
// ---------------------------------------------------------------------------

fn toml_policy(fields: &str) -> String {
    format!("[policies.plan]\n{fields}\n\n[[rules]]\npolicy = \"plan\"\nkey = \"global\"\n")
}

#[test]
fn the_configuration_reads_calendar_periods() {
    let cases = [
        ("period = \"day\"", Period::Day.utc_offset(0)),
        ("period = \"week\"", Period::Week.utc_offset(0)),
        (
            "period = \"month\"\nutc_offset = \"+02:00\"",
            Period::Month.utc_offset(7_200),
        ),
        (
            "period = \"year\"\nutc_offset = \"-05:30\"",
            Period::Year.utc_offset(-19_800),
        ),
        (
            "period = \"day\"\nutc_offset = \"+23:59:59\"",
            Period::Day.utc_offset(86_399),
        ),
    ];
    for (fields, expected) in cases {
        let text = toml_policy(&format!(
            "algorithm = \"fixed-window\"\nlimit = 100\n{fields}"
        ));
        let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{fields}: {e}"));
        let policy = config.policy("plan").expect("the policy");
        let want = calendar(100, expected).with_name("plan").expect("a name");
        assert_eq!(policy, &want, "{fields}");
    }
}

/// A mistake in a calendar period is refused, naming its field: never a
/// policy that counts otherwise than written, or not at all.
#[test]
fn the_configuration_refuses_bad_calendar_periods() {
    let fixed = "algorithm = \"fixed-window\"\nlimit = 100";
    let cases = [
        (
            format!("{fixed}\nperiod = \"fortnight\""),
            "policies.plan.period",
            "\"fortnight\"",
        ),
        (
            format!("{fixed}\nperiod = \"Month\""),
            "policies.plan.period",
            "day, week, month, year",
        ),
        (
            format!("{fixed}\nperiod = 30"),
            "policies.plan.period",
            "calendar period",
        ),
        (
            format!("{fixed}\nperiod = \"day\"\nutc_offset = \"+24:00\""),
            "policies.plan.utc_offset",
            "less than 24 hours",
        ),
        (
            format!("{fixed}\nperiod = \"day\"\nutc_offset = \"02:00\""),
            "policies.plan.utc_offset",
            "'+' or '-'",
        ),
        (
            format!("{fixed}\nperiod = \"day\"\nutc_offset = \"+2h\""),
            "policies.plan.utc_offset",
            "HH:MM",
        ),
        (
            format!("{fixed}\nperiod = \"day\"\nutc_offset = 7200"),
            "policies.plan.utc_offset",
            "\"+02:00\"",
        ),
        (
            format!("{fixed}\nwindow = \"30d\"\nperiod = \"month\""),
            "policies.plan.period",
            "not both",
        ),
        (
            format!("{fixed}\nwindow = \"1d\"\nutc_offset = \"+01:00\""),
            "policies.plan.utc_offset",
            "applies to calendar periods",
        ),
        (
            "algorithm = \"gcra\"\nlimit = 100\nrate = \"1/s\"\nperiod = \"day\"".to_owned(),
            "policies.plan.period",
            "gcra takes no period",
        ),
        (
            "algorithm = \"sliding-window\"\nlimit = 100\nperiod = \"month\"".to_owned(),
            "policies.plan.period",
            "sliding-window takes no period",
        ),
        (
            fixed.to_owned(),
            "policies.plan.window",
            "period = \"month\"",
        ),
        (
            format!("{fixed}\nperiod = \"day\"\nlimit_typo = 1"),
            "policies.plan",
            "limit_typo",
        ),
    ];
    for (fields, path, message) in cases {
        let error = Config::from_toml(&toml_policy(&fields)).expect_err(&fields);
        assert!(
            matches!(
                error.kind(),
                ConfigErrorKind::Parse | ConfigErrorKind::Policy
            ),
            "{fields}: {error}"
        );
        assert!(error.path().starts_with(path), "{fields}: {error}");
        assert!(error.to_string().contains(message), "{fields}: {error}");
    }
    // The core refuses the same offset when built in code.
    assert_eq!(
        Policy::calendar(1, Period::Day.utc_offset(-86_400)).unwrap_err(),
        PolicyError::UtcOffsetOutOfRange { seconds: -86_400 }
    );
}

/// Through a layer: `RateLimit-Policy` gives the length of the month in
/// progress by this machine's clock, `RateLimit`'s `t` and `Retry-After`
/// count to the real end of the month on the store's clock.
#[tokio::test]
async fn headers_count_to_the_real_end_of_the_period() {
    let clock = ManualClock::new(utc(2024, 2, 29) + 18 * HOUR);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let monthly = calendar(2, Period::Month)
        .with_name("monthly")
        .expect("a name");
    let service = RateLimitLayer::new(store, monthly.clone(), by_client).layer(ok_service());
    let month_now = |now: u64| {
        let (start, end) = window_of(&monthly).bounds(now);
        (end - start) / SECOND
    };
    let before = month_now(unix_micros());
    let first = answer(service.clone(), request_from("a")).await;
    let after = month_now(unix_micros());
    assert_eq!(first.status, 200);
    let policy = first.header("ratelimit-policy");
    assert!(
        [before, after]
            .iter()
            .any(|w| policy == format!("\"monthly\";q=2;w={w}")),
        "{policy}"
    );
    // Six hours to March 1st.
    assert_eq!(first.header("ratelimit"), "\"monthly\";r=1;t=21600");
    answer(service.clone(), request_from("a")).await;
    clock.set(utc(2024, 3, 1) - SECOND / 2);
    let denied = answer(service.clone(), request_from("a")).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), "1");
    assert_eq!(denied.header("ratelimit"), "\"monthly\";r=0;t=1");
    clock.set(utc(2024, 3, 1));
    let march = answer(service, request_from("a")).await;
    assert_eq!(march.status, 200);
    assert_eq!(
        march.header("ratelimit"),
        format!("\"monthly\";r=1;t={}", 31 * 86_400)
    );
}
