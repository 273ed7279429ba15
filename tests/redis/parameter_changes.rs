//! Changed numbers under one policy name (a reload, a deploy that changes a
//! limit, two versions of a service on one Redis): every algorithm, on
//! `MemoryStore` and on `RedisStore` against a real server, replaying one
//! timeline on one manual clock, reads a state written under other
//! parameters as a valid state of its own, decides within its new limit,
//! and never panics, wraps or reports values out of range. Both stores give
//! the same decision, field by field. Numbers no looser than the old ones
//! never admit more than they allow from the change on, counting what the
//! old numbers admitted (`tightened_guarantee` states the bound for each
//! algorithm; RELIABILITY.md, "Parameter changes under one name").

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use ratelimit_core::clock::{Clock, ManualClock};
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{AdminStore, Decision, MemoryStore, Policy, Rate, Store};
use ratelimit_tests::{RedisServer, observable, twins_at};

const SECOND: u64 = 1_000_000;

/// A whole Unix second in µs that is a multiple of 180 s, so windows of 45 s
/// and of 60 s both start on it.
const B: u64 = 1_762_999_920 * SECOND;

fn named(policy: Policy) -> Policy {
    policy.with_name("changing").expect("valid name")
}

/// A windowed algorithm's constructor: `Policy::fixed_window` and the like.
type Windowed<E> = fn(u64, Duration) -> Result<Policy, E>;

/// Both stores at `start`, `used` units of `algorithm`'s 10 per minute
/// allowed on "k", then both at `then`; that minute policy and the same
/// limit per 45 s under the same name.
async fn a_minute_used<E: std::fmt::Debug>(
    algorithm: Windowed<E>,
    start: u64,
    used: u64,
    then: u64,
) -> (Pair, Policy, Policy) {
    let per = |window_s| named(algorithm(10, Duration::from_secs(window_s)).unwrap());
    let (minute, shorter) = (per(60), per(45));
    let stores = Pair::start(start).await;
    assert!(stores.check("k", &minute, used).await.is_allowed());
    stores.at(then);
    (stores, minute, shorter)
}

/// Both stores on one clock.
struct Pair {
    server: RedisServer,
    memory: MemoryStore<ManualClock>,
    redis: RedisStore,
    clock: ManualClock,
}

impl Pair {
    /// A new Redis server and both stores, their clock at `now`.
    async fn start(now: u64) -> Pair {
        let (server, clock, memory, redis) = twins_at(now).await;
        Pair {
            server,
            memory,
            redis,
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

/// A concurrency max lowered under the same name. Redis
/// answered remaining -1 (a reply that did not decode, so the failure
/// policy decided); memory computed `max - held` (a panic in debug).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_concurrency_max_denies_with_nothing_remaining() {
    let stores = Pair::start(B).await;
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

/// A sliding window counter's window changed from 60 s to
/// 45 s under one name, with the state "w<60 s> 8 2" (10 per window).
/// Memory underflowed (`previous * (w - elapsed)`); Redis weighed the
/// previous window negatively and admitted past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_counter_window_change_never_over_admits() {
    let (stores, minute, shorter) = a_minute_used(
        Policy::sliding_window_counter,
        B + 10 * SECOND,
        8,
        B + 61 * SECOND,
    )
    .await;
    assert!(stores.check("k", &minute, 2).await.is_allowed());
    // The 2 units of the minute that began at 60 s belong to the 45 s window
    // that holds its last µs, [90 s, 135 s), and the 8 of the minute before
    // weigh into it as its previous window's: 7 more pass there, one at a
    // time.
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
    assert_eq!(admitted, 7);
}

/// A fixed window's count from a 60 s window counts under 45 s until the
/// minute would have ended: the retry time points at the end of the 45 s
/// window that holds the minute's last µs, [90 s, 135 s), and the state
/// lives as long as the minute's decision said (to 120 s), after which that
/// window starts anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_count_of_another_length_counts_until_its_window_would_have_ended() {
    let (stores, _, shorter) =
        a_minute_used(Policy::fixed_window, B + 61 * SECOND, 10, B + 70 * SECOND).await;
    let d = stores.check("k", &shorter, 1).await;
    assert_eq!((d.is_allowed(), d.remaining()), (false, 0));
    assert_eq!(d.retry_after_micros(), 65 * SECOND);
    stores.at(B + 120 * SECOND - 1);
    let d = stores.check("k", &shorter, 1).await;
    assert_eq!((d.is_allowed(), d.remaining()), (false, 0));
    // The key's lifetime ends with the minute; Redis keeps TTLs on its own
    // clock, so the test ends it there.
    stores.at(B + 120 * SECOND);
    stores
        .server
        .cli(&["DEL", &stores.redis.state_key(b"k", &shorter)]);
    assert!(stores.check("k", &shorter, 10).await.is_allowed());
}

/// A whole Unix hour in µs.
const HOUR: u64 = 1_763_002_800 * SECOND;

/// 5 per hour all used at xx:59:30, then the policy reloaded as 5 per minute
/// under the same name: the hour's 5 count until the hour ends (in the
/// minute that ends with it), so none pass in that minute, on both stores,
/// for the fixed window and the sliding window counter. Then the fixed
/// window's next minute admits 5; the counter's weighs the hour's 5 as its
/// previous minute's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_used_up_then_reloaded_per_minute_admits_nothing_more_that_minute() {
    let stores = Pair::start(HOUR + 3_570 * SECOND).await;
    let per = |algorithm: Windowed<_>, window_s| {
        named(algorithm(5, Duration::from_secs(window_s)).expect("valid"))
    };
    for (key, algorithm) in [
        ("fixed", Policy::fixed_window as Windowed<_>),
        ("counter", Policy::sliding_window_counter),
    ] {
        let (hour, minute) = (per(algorithm, 3_600), per(algorithm, 60));
        stores.at(HOUR + 3_570 * SECOND);
        assert!(stores.check(key, &hour, 5).await.is_allowed(), "{key}");
        // The same second, and every second to the end of the hour.
        for s in 3_570..3_600 {
            stores.at(HOUR + s * SECOND);
            let d = stores.check(key, &minute, 1).await;
            assert_eq!(
                (d.is_allowed(), d.remaining()),
                (false, 0),
                "{key} at {s} s"
            );
            assert!(
                d.retry_after_micros() >= (3_600 - s) * SECOND,
                "{key}: {d:?}"
            );
        }
        stores.at(HOUR + 3_600 * SECOND - 1);
        assert!(!stores.check(key, &minute, 1).await.is_allowed(), "{key}");
    }
    stores.at(HOUR + 3_600 * SECOND);
    let minute = per(Policy::fixed_window, 60);
    let d = stores.check("fixed", &minute, 5).await;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
    // The hour's 5 weigh 5 × (60 s - e) / 60 s: one unit passes at e = 12 s.
    let minute = per(Policy::sliding_window_counter, 60);
    let d = stores.check("counter", &minute, 1).await;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after_micros(), 12 * SECOND);
    stores.at(HOUR + 3_612 * SECOND);
    assert!(stores.check("counter", &minute, 1).await.is_allowed());
}

/// A token bucket whose capacity was lowered: the tokens above the new
/// capacity are a full bucket, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_above_a_lowered_capacity_is_a_full_bucket() {
    let stores = Pair::start(B).await;
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

// ---------------------------------------------------------------------------
// Random parameter changes on one timeline
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    TokenBucket,
    Gcra,
    LeakyBucket,
    Concurrency,
}

const FAMILIES: [Family; 7] = [
    Family::FixedWindow,
    Family::SlidingLog,
    Family::SlidingCounter,
    Family::TokenBucket,
    Family::Gcra,
    Family::LeakyBucket,
    Family::Concurrency,
];

/// One set of numbers: the limit (capacity, burst, max) and a time in µs
/// (the window, the emission interval, or the lease).
#[derive(Debug, Clone, Copy)]
struct Numbers {
    limit: u64,
    span: u64,
}

impl Numbers {
    fn policy(self, family: Family) -> Policy {
        let (limit, time) = (self.limit, Duration::from_micros(self.span));
        let rate = Rate::new(1, time);
        named(
            match family {
                Family::FixedWindow => Policy::fixed_window(limit, time),
                Family::SlidingLog => Policy::sliding_window_log(limit, time),
                Family::SlidingCounter => Policy::sliding_window_counter(limit, time),
                Family::TokenBucket => Policy::token_bucket(limit, rate),
                Family::Gcra => Policy::gcra(limit, rate),
                Family::LeakyBucket => Policy::leaky_bucket(limit, rate),
                Family::Concurrency => Policy::concurrency(limit, time),
            }
            .expect("valid numbers"),
        )
    }

    /// The longest reset or retry time a state of these numbers can imply,
    /// penalties included: a window (two for the sliding counter, whose
    /// count weighs into the next one) plus one more, since a count written
    /// in a longer window counts until that window would have ended (and
    /// then until the window of the reading numbers that holds that end
    /// ends), a lease, and for the buckets a debt of one more bucket, the
    /// bucket itself, and one more bucket under the new numbers (a retry
    /// behind a TAT written under these).
    fn bound(self, family: Family) -> u64 {
        match family {
            Family::SlidingLog | Family::Concurrency => self.span,
            Family::FixedWindow => 2 * self.span,
            Family::SlidingCounter => 3 * self.span,
            Family::TokenBucket | Family::Gcra | Family::LeakyBucket => 3 * self.limit * self.span,
        }
    }

    /// The longest a leaky bucket's request waits for its slot.
    fn delay_bound(self) -> u64 {
        self.limit * self.span
    }
}

/// A timeline: parameter sets, and segments of (advance µs, cost, what)
/// decided under one of them. `what` is a check, but 10 is a penalty and 11
/// a reward of `cost` (admin operations, only before the final numbers came
/// in, and not for concurrency).
#[derive(Debug, Clone)]
struct Case {
    numbers: Vec<Numbers>,
    segments: Vec<(usize, Vec<Op>)>,
}

/// One step: advance µs, cost, what.
type Op = (u64, u64, u8);

const PENALIZE: u8 = 10;
const REWARD: u8 = 11;

fn case() -> impl Strategy<Value = Case> {
    let numbers = prop::collection::vec(
        (1..=6u64, 500..=10_000u64).prop_map(|(limit, span)| Numbers { limit, span }),
        2..=3,
    );
    let op = (prop_oneof![Just(0u64), 1..=8_000u64], 0..=6u64, 0..=11u8);
    let segments = prop::collection::vec((0..3usize, prop::collection::vec(op, 2..=10)), 1..=4);
    (numbers, segments).prop_map(|(numbers, segments)| {
        let n = numbers.len();
        Case {
            segments: segments.into_iter().map(|(i, ops)| (i % n, ops)).collect(),
            numbers,
        }
    })
}

/// One admitted request: its place in the timeline, when, how much, and its
/// lease end (concurrency).
#[derive(Debug, Clone, Copy)]
struct Admission {
    seq: usize,
    at: u64,
    cost: u64,
    until: u64,
}

/// What a replayed timeline admitted, and where its last change of numbers
/// came in (its place in the timeline and its time).
struct Replayed {
    admitted: Vec<Admission>,
    change: (usize, u64),
}

/// Replays `case` on both stores under `key` and checks every decision
/// (both stores alike, values in range); the final numbers' guarantee is
/// the caller's to check.
async fn run_case(
    stores: &Pair,
    server: &RedisServer,
    family: Family,
    case: &Case,
    key: &str,
) -> Result<Replayed, TestCaseError> {
    // The scripts' TTLs follow the Redis server's own clock, with an hour of
    // slack on a replayed timeline; the key is dropped here at the time its
    // TTL would end on this timeline (the lifetime its last write gave it,
    // MemoryStore's too).
    let mut expires: Option<u64> = None;
    let mut admitted: Vec<Admission> = Vec::new();
    let mut bound = 0;
    let mut previous = None;
    let mut change = (0, stores.clock.now());
    let mut seq = 0;
    // The segment where the final numbers came in: admin operations only
    // before it (a reward after it gives back what the guarantee counts).
    let settled = (1..case.segments.len())
        .rev()
        .find(|&s| case.segments[s].0 != case.segments[s - 1].0)
        .unwrap_or(0);
    for (s, (index, ops)) in case.segments.iter().enumerate() {
        let numbers = case.numbers[*index];
        let policy = numbers.policy(family);
        bound = bound.max(numbers.bound(family));
        // The sliding counter keeps its window's end: read under other
        // numbers, that end moves to the end of their window that holds it,
        // so each change of numbers may carry it one window further.
        if family == Family::SlidingCounter && previous.is_some_and(|p| p != *index) {
            bound += case.numbers.iter().map(|n| n.span).max().unwrap_or(0);
        }
        for (n, &(advance, cost, what)) in ops.iter().enumerate() {
            stores.clock.advance(Duration::from_micros(advance));
            let now = stores.clock.now();
            seq += 1;
            if expires.is_some_and(|e| now >= e) {
                server.cli(&["DEL", &stores.redis.state_key(key.as_bytes(), &policy)]);
                expires = None;
            }
            if n == 0 && previous != Some(*index) {
                change = (seq, now);
            }
            let cost = cost.min(numbers.limit);
            let admin = family != Family::Concurrency && s < settled;
            let k = key.as_bytes();
            let (memory, redis) = match what {
                PENALIZE if admin => (
                    stores.memory.penalize(k, &policy, cost).await,
                    stores.redis.penalize(k, &policy, cost).await,
                ),
                REWARD if admin => (
                    stores.memory.reward(k, &policy, cost).await,
                    stores.redis.reward(k, &policy, cost).await,
                ),
                _ => (
                    stores.memory.check(k, &policy, cost).await,
                    stores.redis.check(k, &policy, cost).await,
                ),
            };
            // What the stores did: a check (admissions count), or an
            // adjustment (they do not).
            let adjusted = admin && what >= PENALIZE;
            let cost = if adjusted { 0 } else { cost };
            let (d, r) = match (memory, redis) {
                (Ok(d), Ok(r)) => (d, r),
                (m, r) => {
                    return Err(TestCaseError::fail(format!(
                        "at {now} cost {cost}: memory {m:?}, redis {r:?}"
                    )));
                }
            };
            prop_assert_eq!(observable(&d), observable(&r), "at {} cost {}", now, cost);
            prop_assert_eq!(d.limit(), numbers.limit);
            prop_assert!(d.remaining() <= numbers.limit, "{:?}", d);
            prop_assert!(d.reset_after_micros() <= bound, "{:?} > {}", d, bound);
            prop_assert!(d.retry_after_micros() <= bound, "{:?} > {}", d, bound);
            prop_assert!(d.delay_micros() <= numbers.delay_bound(), "{:?}", d);
            if adjusted || (d.is_allowed() && cost > 0) {
                let reset = d.reset_after_micros();
                expires = (reset > 0).then_some(now + reset);
            }
            if d.is_allowed() && cost > 0 {
                admitted.push(Admission {
                    seq,
                    at: now,
                    cost,
                    until: now + numbers.span,
                });
            }
        }
        previous = Some(*index);
    }
    Ok(Replayed { admitted, change })
}

/// The final numbers' guarantee over the admissions since the last change
/// (its place in the timeline and its time).
fn guarantee(
    family: Family,
    numbers: Numbers,
    admitted: &[Admission],
    (change, since): (usize, u64),
) -> Result<(), TestCaseError> {
    let (limit, span) = (numbers.limit, numbers.span);
    let after: Vec<Admission> = admitted
        .iter()
        .copied()
        .filter(|a| a.seq >= change)
        .collect();
    let sum = |from: u64, to: u64| -> u64 {
        after
            .iter()
            .filter(|a| a.at >= from && a.at < to)
            .map(|a| a.cost)
            .sum()
    };
    for a in &after {
        match family {
            // Each aligned window that starts after the change.
            Family::FixedWindow | Family::SlidingCounter => {
                let start = a.at - a.at % span;
                if start >= since {
                    prop_assert!(sum(start, start + span) <= limit, "window at {}", start);
                }
            }
            // Every interval of one window after the change.
            Family::SlidingLog => {
                prop_assert!(sum(a.at, a.at + span) <= limit, "interval at {}", a.at);
            }
            // A burst, then one unit per interval.
            Family::TokenBucket | Family::Gcra | Family::LeakyBucket => {
                for b in after.iter().filter(|b| b.at >= a.at) {
                    let most = limit + (b.at - a.at) / span;
                    prop_assert!(sum(a.at, b.at + 1) <= most, "from {} to {}", a.at, b.at);
                }
            }
            // In flight when it was admitted, permits from before the
            // change included.
            Family::Concurrency => {
                let held = held_at(admitted, a.at);
                prop_assert!(held <= limit, "{} held at {}", held, a.at);
            }
        }
    }
    Ok(())
}

/// The units of `admitted` in flight at `at` (admitted by then, their
/// lease not yet over).
fn held_at(admitted: &[Admission], at: u64) -> u64 {
    admitted
        .iter()
        .filter(|p| p.at <= at && at < p.until)
        .map(|p| p.cost)
        .sum()
}

/// The runtime the property tests drive both stores on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A runner of `cases` cases: modest by default (the suite's time budget);
/// `PROPTEST_CASES` searches longer.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..Config::default()
    })
}

/// For every algorithm, random timelines with random changes of numbers
/// under one name, on both stores: no panic, no error, the same decisions,
/// values in range, and the final numbers' guarantee after the last change.
#[test]
fn random_parameter_changes_on_both_stores() {
    let runtime = runtime();
    let stores = runtime.block_on(Pair::start(B + 123_457));
    let cases = std::cell::Cell::new(0u64);
    for family in FAMILIES {
        let mut runner = runner(32);
        runner
            .run(&case(), |case| {
                cases.set(cases.get() + 1);
                // A fresh key per case, a second apart.
                stores.clock.advance(Duration::from_secs(1));
                let key = format!("{family:?}-{}", cases.get());
                let replayed =
                    runtime.block_on(run_case(&stores, &stores.server, family, &case, &key))?;
                let last = case.numbers[case.segments.last().map_or(0, |s| s.0)];
                guarantee(family, last, &replayed.admitted, replayed.change)
            })
            .unwrap_or_else(|e| panic!("{family:?}: {e}"));
    }
    assert!(cases.get() >= 7);
}

// ---------------------------------------------------------------------------
// Tightened numbers: nothing more than the new numbers allow
// ---------------------------------------------------------------------------

/// Old numbers and tighter new ones for `family`: a limit (capacity, burst,
/// max) no higher; for the windows a window no longer (for the fixed window
/// and the sliding counter, half the time one that divides the old one, so
/// that each new window lies within one old window, as a minute within an
/// hour); for the buckets a rate no faster (an interval no shorter); any
/// lease.
fn tightened(family: Family) -> impl Strategy<Value = (Numbers, Numbers)> {
    (1..=6u64, 1..=6u64, 500..=4_000u64, 500..=4_000u64, 1..=4u64).prop_map(
        move |(old_limit, new_limit, a, b, times)| {
            let new_limit = new_limit.min(old_limit);
            let (old_span, new_span) = match family {
                Family::FixedWindow | Family::SlidingCounter if b % 2 == 0 => (a * times, a),
                Family::FixedWindow | Family::SlidingCounter | Family::SlidingLog => {
                    (a.max(b), a.min(b))
                }
                Family::TokenBucket | Family::Gcra | Family::LeakyBucket => (a.min(b), a.max(b)),
                Family::Concurrency => (a, b),
            };
            (
                Numbers {
                    limit: old_limit,
                    span: old_span,
                },
                Numbers {
                    limit: new_limit,
                    span: new_span,
                },
            )
        },
    )
}

/// Random use under the old numbers, then the new ones from the change on:
/// a timeline of checks (no admin operations) in two segments. Steps are
/// short against the windows (500 µs and more), so that what the old
/// numbers admitted often shares a new window with what comes after.
fn tightened_case(family: Family) -> impl Strategy<Value = Case> {
    let op = || {
        (
            prop_oneof![2 => Just(0u64), 3 => 1..=1_500u64, 1 => 1_500..=8_000u64],
            0..=6u64,
            Just(0u8),
        )
    };
    (
        tightened(family),
        prop::collection::vec(op(), 1..=12),
        prop::collection::vec(op(), 1..=16),
    )
        .prop_map(|((old, new), before, after)| Case {
            numbers: vec![old, new],
            segments: vec![(0, before), (1, after)],
        })
}

/// What the new numbers allow after a change to tighter ones, counting
/// what the old numbers admitted before the change where it overlaps:
///
/// - sliding window counter: in every aligned window of the new length that
///   holds an admission after the change, everything admitted (before the
///   change and after it) is at most the new limit, or what was admitted
///   there before the change if that alone is more (nothing is admitted
///   after the change then);
/// - fixed window: the same where the new window lies within the old window
///   of the last admission before the change (always, when the new length
///   divides the old one). Where it reaches past that old window's end (its
///   state's lifetime), the same up to that end, counting the admissions of
///   that old window only (the state forgot earlier ones), and at most the
///   new limit admitted after the change in the whole new window;
/// - sliding log: the same in every interval of the new window's length
///   that starts at an admission;
/// - token bucket, GCRA, leaky bucket: from any admission after the change
///   `a` to any later one `b`, at most the new capacity plus one unit per
///   new interval in between, `limit + (b - a) / interval`, admitted after
///   the change;
/// - concurrency: at every admission after the change, at most the new max
///   in flight, permits taken before the change included.
fn tightened_guarantee(
    family: Family,
    (old, new): (Numbers, Numbers),
    admitted: &[Admission],
    (change, since): (usize, u64),
) -> Result<(), TestCaseError> {
    let (limit, span) = (new.limit, new.span);
    let is_after = |a: &Admission| a.seq >= change;
    // The old window of the last admission before the change (the fixed
    // window's state), and the span since the change that it still covers.
    let old_window = admitted
        .iter()
        .filter(|a| !is_after(a))
        .map(|a| a.at - a.at % old.span)
        .next_back()
        .map_or((0, 0), |start| (start, start + old.span));
    let in_span = |from: u64, to: u64, after: bool| -> u64 {
        admitted
            .iter()
            .filter(|a| is_after(a) == after && a.at >= from && a.at < to)
            .map(|a| a.cost)
            .sum()
    };
    let within = |from: u64, to: u64| -> Result<(), TestCaseError> {
        let before = if family == Family::FixedWindow {
            in_span(from.max(old_window.0), to.min(old_window.1), false)
        } else {
            in_span(from, to, false)
        };
        let after = in_span(from, to, true);
        prop_assert!(
            after == 0 || before + after <= limit.max(before),
            "[{}, {}) since {}: {} before the change, {} after",
            from,
            to,
            since,
            before,
            after
        );
        Ok(())
    };
    match family {
        Family::SlidingCounter => {
            for a in admitted.iter().filter(|a| is_after(a)) {
                let start = a.at - a.at % span;
                within(start, start + span)?;
            }
        }
        Family::FixedWindow => {
            for a in admitted.iter().filter(|a| is_after(a)) {
                let start = a.at - a.at % span;
                let end = start + span;
                within(start, end.min(old_window.1.max(start)))?;
                let after = in_span(start, end, true);
                prop_assert!(after <= limit, "{} after the change at {}", after, start);
            }
        }
        Family::SlidingLog => {
            for a in admitted {
                within(a.at, a.at + span)?;
            }
        }
        Family::TokenBucket | Family::Gcra | Family::LeakyBucket => {
            for a in admitted.iter().filter(|a| is_after(a)) {
                for b in admitted.iter().filter(|b| is_after(b) && b.at >= a.at) {
                    let most = limit + (b.at - a.at) / span;
                    let sum = in_span(a.at, b.at + 1, true);
                    prop_assert!(sum <= most, "{} from {} to {} > {}", sum, a.at, b.at, most);
                }
            }
        }
        Family::Concurrency => {
            for a in admitted.iter().filter(|a| is_after(a)) {
                let held = held_at(admitted, a.at);
                prop_assert!(held <= limit, "{} held at {}", held, a.at);
            }
        }
    }
    Ok(())
}

/// For every algorithm, random old numbers, tighter new ones under the same
/// name (see [`tightened`]), random use before the change and a random
/// timeline after it, on both stores side by side: the same decisions, and
/// nothing more admitted than the new numbers allow from the change on
/// ([`tightened_guarantee`] states the bound for each algorithm).
#[test]
fn tightened_parameters_never_over_admit_on_both_stores() {
    let runtime = runtime();
    let stores = runtime.block_on(Pair::start(B + 654_321));
    let cases = std::cell::Cell::new(0u64);
    let changes = std::cell::Cell::new(0u64);
    for family in FAMILIES {
        let mut runner = runner(48);
        runner
            .run(&tightened_case(family), |case| {
                cases.set(cases.get() + 1);
                stores.clock.advance(Duration::from_secs(1));
                let key = format!("tightened-{family:?}-{}", cases.get());
                let replayed =
                    runtime.block_on(run_case(&stores, &stores.server, family, &case, &key))?;
                let (change, _) = replayed.change;
                if replayed.admitted.iter().any(|a| a.seq < change) {
                    changes.set(changes.get() + 1);
                }
                let numbers = (case.numbers[0], case.numbers[1]);
                tightened_guarantee(family, numbers, &replayed.admitted, replayed.change)
            })
            .unwrap_or_else(|e| panic!("{family:?}: {e}"));
    }
    assert!(cases.get() >= 7);
    // Most cases admitted something before their change.
    assert!(
        changes.get() * 2 > cases.get(),
        "{} of {}",
        changes.get(),
        cases.get()
    );
}
