//! The sliding log's state in Redis: one string per key, the tag
//! `l` then fixed-width entries (a time and the units logged through it, 14
//! bytes), the entries that left the window dropped on the next write. On a
//! real server, against `MemoryStore` on one manual clock: entries that
//! leave window after window and counts renumbered past 2^48, the largest
//! costs and limits, a limit that changes between calls, and a key written
//! in the previous layout (a sorted set), which is converted, never lifted.

use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{AdminStore, Check, Decision, MemoryStore, Policy, Store, StoreError};
use ratelimit_tests::fixtures::Rng;
use ratelimit_tests::{
    LOG_SLOTS, MAX_LIMIT, NOW_MICROS, RedisServer, assert_string_state, named, observable,
    twins_at, write_sorted_set,
};

/// The bytes of one entry of a log's string.
const ENTRY_BYTES: u64 = 14;

/// The entries of the log at `key`, its base aside (0 when there is none).
fn entries(server: &RedisServer, key: &str) -> u64 {
    let len: u64 = server.query(&["STRLEN", key]);
    if len == 0 {
        return 0;
    }
    assert_eq!((len - 1) % ENTRY_BYTES, 0, "{key}: {len} bytes");
    (len - 1) / ENTRY_BYTES - 1
}

/// The base of the log at `key`: the units counted before its first entry.
fn base(server: &RedisServer, key: &str) -> u64 {
    let script = "local _, b = struct.unpack('>I7I7', redis.call('GET', KEYS[1]), 2) \
                  return string.format('%d', b)";
    server.query(&["EVAL", script, "1", key])
}

/// Adds `lift` to every count of the log at `key` (its base and every
/// entry's): the same log, as it reads after that many more units have come
/// and gone.
fn lift_counts(server: &RedisServer, key: &str, lift: u64) {
    let script = "local s = redis.call('GET', KEYS[1]) local out = {string.sub(s, 1, 1)} \
                  for i = 2, #s, 14 do local t, c = struct.unpack('>I7I7', s, i) \
                  out[#out + 1] = struct.pack('>I7I7', t, c + tonumber(ARGV[1])) end \
                  return redis.call('SET', KEYS[1], table.concat(out), 'KEEPTTL')";
    let reply = server.cli(&["EVAL", script, "1", key, &lift.to_string()]);
    assert_eq!(reply, "OK");
}

/// Both stores on one manual clock, and the server under the Redis one.
struct Twins {
    server: RedisServer,
    clock: ManualClock,
    memory: MemoryStore<ManualClock>,
    redis: RedisStore,
}

/// One operation on a key.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    Penalize(u64),
    Reward(u64),
}

impl Op {
    /// Mostly checks of costs up to `max_cost`, sometimes a penalty or a
    /// reward of up to `max_amount`.
    fn random(rng: &mut Rng, max_cost: u64, max_amount: u64) -> Op {
        match rng.below(25) {
            0 => Op::Penalize(rng.below(max_amount) + 1),
            1 => Op::Reward(rng.below(max_amount) + 1),
            _ => Op::Check(rng.below(max_cost + 1)),
        }
    }
}

impl Twins {
    async fn start() -> Twins {
        let (server, clock, memory, redis) = twins_at(NOW_MICROS).await;
        Twins {
            server,
            clock,
            memory,
            redis,
        }
    }

    /// Runs `op` on both stores, which must answer alike.
    async fn run(&self, key: &[u8], policy: &Policy, op: Op, what: &str) -> Decision {
        let (m, r) = match op {
            Op::Check(cost) => (
                self.memory.check(key, policy, cost).await,
                self.redis.check(key, policy, cost).await,
            ),
            Op::Penalize(amount) => (
                self.memory.penalize(key, policy, amount).await,
                self.redis.penalize(key, policy, amount).await,
            ),
            Op::Reward(amount) => (
                self.memory.reward(key, policy, amount).await,
                self.redis.reward(key, policy, amount).await,
            ),
        };
        let (m, r) = (m.unwrap(), r.unwrap());
        assert_eq!(observable(&m), observable(&r), "{what}: {op:?}");
        m
    }

    async fn check(&self, key: &[u8], policy: &Policy, cost: u64, what: &str) -> Decision {
        self.run(key, policy, Op::Check(cost), what).await
    }

    fn advance(&self, micros: u64) {
        self.clock.advance(Duration::from_micros(micros));
    }
}

/// Window after window of entries leaving (all of them, some, none), with
/// penalties and rewards: both stores decide alike, the string keeps at most
/// `2 × limit` entries, and every write drops those that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_leave_window_after_window_and_the_string_stays_bounded() {
    let twins = Twins::start().await;
    let window = 1_000u64;
    let policy = Policy::sliding_window_log(5, Duration::from_micros(window)).unwrap();
    let key = twins.redis.state_key(b"k", &policy);
    let mut rng = Rng(13);
    for step in 0..1_000 {
        twins.advance(match rng.below(20) {
            0 => window + rng.below(3 * window),
            1 => 0,
            _ => rng.below(window / 3),
        });
        let what = format!("step {step}");
        let op = Op::random(&mut rng, 5, 8);
        let d = twins.run(b"k", &policy, op, &what).await;
        if matches!(op, Op::Check(_)) && d.is_allowed() {
            // A write keeps only what is in the window: at most one entry
            // per unit, 2 × limit with penalties.
            assert!(entries(&twins.server, &key) <= 10, "{what}");
        }
        if step % 5 == 0 {
            assert_string_state(&twins.server, &key, window, &what);
        }
    }
}

/// A log that never empties counts on past 2^48 units: the next call that
/// drops an entry renumbers its counts from 0, and nothing it decides
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_2_48_are_renumbered_on_the_next_write() {
    let twins = Twins::start().await;
    let server = &twins.server;
    let window = 1_000_000u64;
    let policy = Policy::sliding_window_log(10, Duration::from_micros(window)).unwrap();
    let key = twins.redis.state_key(b"k", &policy);
    for step in 0..4 {
        twins.advance(100_000);
        twins
            .check(b"k", &policy, 2, &format!("before, {step}"))
            .await;
    }
    lift_counts(server, &key, (1 << 48) + 7);
    assert_eq!(base(server, &key), (1 << 48) + 7);
    // The oldest entries leave one by one; the first call that drops one
    // (a peek) renumbers.
    for step in 0..6 {
        twins.advance(150_000);
        let what = format!("after, {step}");
        for cost in [0, 3, 9] {
            twins.check(b"k", &policy, cost, &what).await;
        }
        if step == 0 {
            // Nothing left the window, nothing was admitted: not written.
            assert_eq!(base(server, &key), (1 << 48) + 7, "{what}");
        }
    }
    assert!(base(server, &key) < 1 << 48);
    assert_string_state(server, &key, window, "renumbered");
}

/// The largest limit and cost, and a log of `LOG_SLOTS` taken by single
/// units then one cost of all of them: both stores agree, penalties and
/// rewards included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_costs_and_limits_decide_as_in_memory() {
    let twins = Twins::start().await;
    let minute = Duration::from_secs(60);
    let max = Policy::sliding_window_log(MAX_LIMIT, minute).unwrap();
    assert!(
        twins
            .check(b"m", &max, MAX_LIMIT, "2^40")
            .await
            .is_allowed()
    );
    twins.advance(30_000_000);
    let denied = twins.check(b"m", &max, 1, "2^40, one more").await;
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(30)));
    twins.advance(30_000_000);
    let ops = [
        Op::Check(MAX_LIMIT - 1),
        Op::Penalize(4 * MAX_LIMIT),
        Op::Check(MAX_LIMIT),
        Op::Reward(MAX_LIMIT + 3),
        Op::Check(3),
    ];
    for op in ops {
        twins.run(b"m", &max, op, "2^40").await;
        twins.advance(1_000_000);
    }

    let full = Policy::sliding_window_log(LOG_SLOTS, minute).unwrap();
    let key = twins.redis.state_key(b"f", &full);
    for i in 0..LOG_SLOTS {
        twins.advance(7);
        let what = format!("unit {i}");
        assert!(twins.check(b"f", &full, 1, &what).await.is_allowed());
    }
    assert_eq!(entries(&twins.server, &key), LOG_SLOTS);
    for cost in [LOG_SLOTS, 1, 0] {
        twins.check(b"f", &full, cost, "full").await;
    }
    twins.advance(60_000_000);
    let all = twins.check(b"f", &full, LOG_SLOTS, "all at once").await;
    assert!(all.is_allowed());
    assert_eq!(entries(&twins.server, &key), 1);
}

/// The same name with other limits between calls (across `LOG_SLOTS`, so
/// slots of another width too): every call reads the log as a state of its
/// own policy, as `MemoryStore` does. (Windows change in
/// `parameter_changes.rs`; mixed at random they would also compare how the
/// stores expire a whole key, which a replayed timeline cannot: its Redis
/// keys get an hour of slack.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_changed_between_calls_decides_as_in_memory() {
    let twins = Twins::start().await;
    let ms = Duration::from_millis;
    let policies =
        [3, 8, 3_000, 1].map(|limit| named("changing", Policy::sliding_window_log(limit, ms(100))));
    let key = twins.redis.state_key(b"k", &policies[0]);
    let mut rng = Rng(1313);
    for step in 0..1_200 {
        twins.advance(rng.below(30_000));
        let policy = &policies[rng.index(policies.len())];
        let what = format!("step {step}, limit {}", policy.limit());
        let op = Op::random(&mut rng, policy.limit().min(12), policy.limit());
        twins.run(b"k", policy, op, &what).await;
        assert!(entries(&twins.server, &key) <= 2 * LOG_SLOTS, "{what}");
    }
}

/// Members of the previous layout: "<t>:<cost>:<before>", and
/// "<t>:<cost>" from before running sums.
fn old_members(entries: &[(u64, u64)], with_sums: bool) -> Vec<(String, String)> {
    let mut before = 0;
    entries
        .iter()
        .map(|&(t, cost)| {
            let member = if with_sums {
                format!("{t}:{cost}:{before}")
            } else {
                format!("{t}:{cost}")
            };
            before += cost;
            (t.to_string(), member)
        })
        .collect()
}

/// The sliding log of 10 a minute, named `name`, that the tests of the
/// previous layout write, and its window in µs.
fn old_layout_log(name: &str) -> (Policy, u64) {
    let window = 60_000_000u64;
    let policy = named(
        name,
        Policy::sliding_window_log(10, Duration::from_micros(window)),
    );
    (policy, window)
}

/// A key holding a log in the previous layout, written by the previous
/// version of the store, is never a silent lift: every entry of it still in
/// the window counts, by checks, peeks, `check_all` and rewards alike, and
/// it is rewritten in the new layout with its TTL. A sorted set of another
/// family (a semaphore's permits) stays a policy conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_in_the_previous_layout_is_converted_never_lifted() {
    let twins = Twins::start().await;
    let Twins {
        server,
        clock,
        memory,
        redis,
    } = &twins;
    let (policy, window) = old_layout_log("old");
    let other = named("other", Policy::fixed_window(5, Duration::from_secs(60)));
    let start = NOW_MICROS;
    // The first entry leaves the window before the checks below.
    let timeline = [(start, 2u64), (start + 1_000, 3), (start + 2_000, 4)];
    let cases: [(&[u8], bool, &str); 4] = [
        (b"sums", true, "peek"),
        (b"plain", false, "check"),
        (b"multi", true, "check_all"),
        (b"admin", false, "reward"),
    ];
    for &(key, with_sums, _) in &cases {
        for &(t, cost) in &timeline {
            clock.set(t);
            assert!(memory.check(key, &policy, cost).await.unwrap().is_allowed());
        }
        let state_key = redis.state_key(key, &policy);
        write_sorted_set(server, &state_key, &old_members(&timeline, with_sums));
    }
    clock.set(start + window + 500);
    for &(key, _, op) in &cases {
        let what = format!("{op} of an old log");
        let state_key = redis.state_key(key, &policy);
        match op {
            "peek" => {
                let d = twins.check(key, &policy, 0, &what).await;
                assert_eq!(d.remaining(), 3, "{what}");
            }
            "check" => {
                assert!(!twins.check(key, &policy, 4, &what).await.is_allowed());
                assert!(twins.check(key, &policy, 3, &what).await.is_allowed());
            }
            "check_all" => {
                let checks = [Check::new(b"o", &other, 1), Check::new(key, &policy, 4)];
                let m = memory.check_all(&checks).await.unwrap();
                let r = redis.check_all(&checks).await.unwrap();
                assert_eq!(m.len(), r.len());
                for (m, r) in m.iter().zip(&r) {
                    assert_eq!(observable(m), observable(r), "{what}");
                }
                assert!(!r[1].is_allowed(), "{what}");
            }
            _ => {
                let d = twins.run(key, &policy, Op::Reward(2), &what).await;
                assert_eq!(d.remaining(), 5, "{what}");
            }
        }
        assert_eq!(server.cli(&["TYPE", &state_key]), "string", "{what}");
        assert_string_state(server, &state_key, window, &what);
        twins
            .check(key, &policy, 0, &format!("{what}, then a peek"))
            .await;
    }

    // A log whose every entry has left: nothing counts, and the first
    // admission replaces it.
    let key = redis.state_key(b"gone", &policy);
    write_sorted_set(server, &key, &old_members(&timeline, true));
    clock.set(start + 3 * window);
    for (cost, remaining) in [(0, 10), (10, 0)] {
        let d = redis.check(b"gone", &policy, cost).await.unwrap();
        assert!(d.is_allowed() && d.remaining() == remaining, "{d:?}");
    }
    assert_eq!(entries(server, &key), 1);

    // A semaphore's permits under the log's name: a conflict, untouched.
    let key = redis.state_key(b"permits", &policy);
    let permit = format!("{:032x}:1", 7);
    server.cli(&["ZADD", &key, &(start + 10 * window).to_string(), &permit]);
    server.cli(&["PEXPIRE", &key, "3600000"]);
    for result in [
        redis.check(b"permits", &policy, 1).await,
        redis.check(b"permits", &policy, 0).await,
        redis.reward(b"permits", &policy, 1).await,
    ] {
        assert!(
            matches!(result, Err(StoreError::PolicyConflict { ref policy }) if policy == "old"),
            "{result:?}"
        );
    }
    assert_eq!(server.cli(&["ZRANGE", &key, "0", "-1"]), permit);
}

/// A log in the previous layout whose every entry has left the window, and
/// which has no TTL (as a version without one left it): the first decision
/// that meets it, even one that writes nothing of its own (a peek, a
/// request that another limit denies), leaves no key without a TTL, and
/// nothing of the old log counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_log_without_a_ttl_leaves_no_key_without_one() {
    let Twins {
        server,
        clock,
        redis,
        ..
    } = &Twins::start().await;
    let (policy, window) = old_layout_log("old-no-ttl");
    let denier = named("denier", Policy::fixed_window(1, Duration::from_secs(60)));
    let start = NOW_MICROS;
    let timeline = [(start, 2u64), (start + 1_000, 3)];
    let keys: [&[u8]; 2] = [b"peeked", b"denied"];
    for key in keys {
        let state_key = redis.state_key(key, &policy);
        write_sorted_set(server, &state_key, &old_members(&timeline, true));
        server.cli(&["PERSIST", &state_key]);
        assert_eq!(server.cli(&["PTTL", &state_key]), "-1");
    }
    clock.set(start + 2 * window);
    assert!(redis.check(b"d", &denier, 1).await.unwrap().is_allowed());
    let peek = redis.check(b"peeked", &policy, 0).await.unwrap();
    assert_eq!(peek.remaining(), 10, "{peek:?}");
    let checks = [
        Check::new(b"denied", &policy, 1),
        Check::new(b"d", &denier, 1),
    ];
    let denied = redis.check_all(&checks).await.unwrap();
    assert!(!denied[1].is_allowed(), "{denied:?}");
    assert_eq!(denied[0].remaining(), 10, "{denied:?}");
    for key in keys {
        let state_key = redis.state_key(key, &policy);
        let ttl: i64 = server.cli(&["PTTL", &state_key]).parse().unwrap();
        // -2: no key at all; -1: a key without a TTL.
        assert!(ttl == -2 || ttl > 0, "{state_key}: PTTL {ttl}");
        let d = redis.check(key, &policy, 10).await.unwrap();
        assert!(d.is_allowed(), "nothing of the old log counts: {d:?}");
        let ttl: i64 = server.cli(&["PTTL", &state_key]).parse().unwrap();
        assert!(ttl > 0, "{state_key}: PTTL {ttl} after an admission");
    }
}
