//! The semaphore's state in Redis: one string per key, the tag
//! `c`, a base count, then one fixed-width entry per held permit (its id,
//! its lease's expiry, the units held through it), in expiry order. On a
//! real server, against `MemoryStore` on one manual clock: leases that
//! expire some at a time under a max and a lease that change between calls,
//! counts renumbered past 2^48, releases of unknown and expired ids, and a
//! key written in the previous layout (a sorted set), which is converted
//! with its permits, never lifted.

use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::redis::RedisStore;
use ratelimit_core::{Check, Decision, MemoryStore, PermitId, Policy, Store, StoreError};
use ratelimit_tests::fixtures::Rng;
use ratelimit_tests::{
    NOW_MICROS, RedisServer, assert_string_state, named, observable, take_permit, twins_at,
    write_sorted_set,
};

/// The tag and the base of a semaphore's string.
const HEAD_BYTES: u64 = 8;
/// One permit's entry: a 32-digit id, then two 7-byte integers.
const ENTRY_BYTES: u64 = 46;

/// The entries of the semaphore at `key` (0 when there is none).
fn entries(server: &RedisServer, key: &str) -> u64 {
    let len: u64 = server.query(&["STRLEN", key]);
    if len == 0 {
        return 0;
    }
    assert_eq!((len - HEAD_BYTES) % ENTRY_BYTES, 0, "{key}: {len} bytes");
    (len - HEAD_BYTES) / ENTRY_BYTES
}

/// The base of the semaphore at `key`: the units counted before its first
/// entry.
fn base(server: &RedisServer, key: &str) -> u64 {
    let script =
        "return string.format('%d', (struct.unpack('>I7', redis.call('GET', KEYS[1]), 2)))";
    server.query(&["EVAL", script, "1", key])
}

/// A digest of the value at `key`, to tell whether it changed.
fn digest(server: &RedisServer, key: &str) -> String {
    let script = "return redis.sha1hex(redis.call('GET', KEYS[1]))";
    server.query(&["EVAL", script, "1", key])
}

/// Adds `lift` to the base and to every entry's count of the semaphore at
/// `key`: the same permits, as they read after that many more units have
/// come and gone.
fn lift_counts(server: &RedisServer, key: &str, lift: u64) {
    let script = "local s = redis.call('GET', KEYS[1]) local d = tonumber(ARGV[1]) \
                  local out = {'c', struct.pack('>I7', struct.unpack('>I7', s, 2) + d)} \
                  for i = 9, #s, 46 do local e, t = struct.unpack('>I7I7', s, i + 32) \
                  out[#out + 1] = string.sub(s, i, i + 31) .. struct.pack('>I7I7', e, t + d) end \
                  return redis.call('SET', KEYS[1], table.concat(out), 'KEEPTTL')";
    let reply = server.cli(&["EVAL", script, "1", key, &lift.to_string()]);
    assert_eq!(reply, "OK");
}

/// A `MemoryStore` and a `RedisStore` on one manual clock, which must
/// decide alike on `k`.
#[derive(Clone, Copy)]
struct Twins<'a> {
    memory: &'a MemoryStore<ManualClock>,
    redis: &'a RedisStore,
}

impl<'a> Twins<'a> {
    fn new(memory: &'a MemoryStore<ManualClock>, redis: &'a RedisStore) -> Self {
        Twins { memory, redis }
    }

    /// A check of `cost` on both stores, which must answer alike; the
    /// permits taken, if any (memory's, then Redis's).
    async fn check(
        self,
        policy: &Policy,
        cost: u64,
        what: &str,
    ) -> (Decision, Option<(PermitId, PermitId)>) {
        let m = self.memory.check(b"k", policy, cost).await.unwrap();
        let r = self.redis.check(b"k", policy, cost).await.unwrap();
        assert_eq!(observable(&m), observable(&r), "{what}: cost {cost}");
        let permits = m.permit().zip(r.permit());
        (m, permits)
    }

    /// A check of a random cost (0 to the max) on both stores, which must
    /// answer alike; the permits taken, if any.
    async fn check_random(
        self,
        policy: &Policy,
        rng: &mut Rng,
        what: &str,
    ) -> Option<(PermitId, PermitId)> {
        let cost = rng.below(policy.limit() + 1);
        self.check(policy, cost, what).await.1
    }

    /// Releases on both stores, then a peek on both, which must answer
    /// alike.
    async fn release(self, policy: &Policy, (m, r): (PermitId, PermitId), what: &str) {
        self.memory.release(b"k", policy, m).await.unwrap();
        self.redis.release(b"k", policy, r).await.unwrap();
        self.check(policy, 0, &format!("{what}, released")).await;
    }

    /// Renews on both stores, which must answer alike, then a peek on both,
    /// which must answer alike; whether the permit was still held.
    async fn renew(self, policy: &Policy, (m, r): (PermitId, PermitId), what: &str) -> bool {
        let held = self.memory.renew(b"k", policy, m).await.unwrap();
        let renewed = self.redis.renew(b"k", policy, r).await.unwrap();
        assert_eq!(renewed, held, "{what}");
        self.check(policy, 0, &format!("{what}, renewed")).await;
        held
    }
}

/// After each random step: the key never holds more than 8 entries, and
/// every fifth step its state and TTL are checked whole.
fn audit(server: &RedisServer, key: &str, step: u64, what: &str) {
    assert!(entries(server, key) <= 8, "{what}");
    if step.is_multiple_of(5) {
        assert_string_state(server, key, 2_500, what);
    }
}

/// One name under four maxes and leases, switched between calls by the
/// random tests.
fn changing_policies() -> [Policy; 4] {
    [(3, 1_000), (5, 400), (2, 2_500), (8, 1_000)].map(|(max, lease)| {
        named(
            "sem",
            Policy::concurrency(max, Duration::from_micros(lease)),
        )
    })
}

/// A random id no store issued, as both stores' permit.
fn unknown(rng: &mut Rng) -> (PermitId, PermitId) {
    let id = PermitId(u128::from(rng.next_u64()) << 64 | 1);
    (id, id)
}

/// Step `step` of a random test: moves `clock` on by a random amount (past
/// every lease one time in 20, not at all one time in 20, else by less than
/// 300 µs), then picks one of `policies`; returns it and the step's name.
fn random_step<'a>(
    clock: &ManualClock,
    rng: &mut Rng,
    policies: &'a [Policy],
    step: u64,
) -> (&'a Policy, String) {
    clock.advance(Duration::from_micros(match rng.below(20) {
        0 => 2_500 + rng.below(3_000),
        1 => 0,
        _ => rng.below(300),
    }));
    let policy = &policies[rng.index(policies.len())];
    (policy, format!("step {step}, max {}", policy.limit()))
}

/// Runs 1,000 steps of a random test from `seed` on twin stores: each is
/// [`random_step`], then `step` on the policy it picked, then an [`audit`]
/// of the string.
async fn random_steps(seed: u64, mut step: impl AsyncFnMut(Twins<'_>, &Policy, &mut Rng, &str)) {
    let (server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    let twins = Twins::new(&memory, &redis);
    let policies = changing_policies();
    let key = redis.state_key(b"k", &policies[0]);
    let mut rng = Rng(seed);
    for n in 0..1_000 {
        let (policy, what) = random_step(&clock, &mut rng, &policies, n);
        step(twins, policy, &mut rng, &what).await;
        audit(&server, &key, n, &what);
    }
}

/// Leases that expire none, some or all at a time, releases of held,
/// expired, released and unknown ids, under a max and a lease that change
/// between calls (one name): both stores decide alike, every call drops the
/// expired leases, so the string never holds more entries than the largest
/// max, and it keeps the TTL of its longest lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_some_at_a_time_under_a_changing_max_and_lease() {
    let mut held: Vec<(PermitId, PermitId)> = Vec::new();
    random_steps(1313, async |twins, policy, rng, what| {
        match rng.below(20) {
            0..=4 if !held.is_empty() => {
                // Held, expired, or released already.
                let permits = held[rng.index(held.len())];
                twins.release(policy, permits, what).await;
            }
            5 => twins.release(policy, unknown(rng), what).await,
            _ => held.extend(twins.check_random(policy, rng, what).await),
        }
    })
    .await;
}

/// A semaphore that never empties counts on past 2^48 units: the next call
/// that drops a lease renumbers its counts from 0, and nothing it decides
/// changes; a held permit is still released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_2_48_are_renumbered_on_the_next_write() {
    let (server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    let twins = Twins::new(&memory, &redis);
    let lease = 1_000_000u64;
    let policy = Policy::concurrency(6, Duration::from_micros(lease)).unwrap();
    let key = redis.state_key(b"k", &policy);
    let mut held = Vec::new();
    for step in 0..4 {
        clock.advance(Duration::from_micros(100_000));
        let what = format!("before, {step}");
        let (_, permits) = twins.check(&policy, 1, &what).await;
        held.extend(permits);
    }
    lift_counts(&server, &key, (1 << 48) + 7);
    assert_eq!(base(&server, &key), (1 << 48) + 7);
    twins.check(&policy, 0, "lifted, a peek").await;
    twins.check(&policy, 3, "lifted, denied").await;
    // Nothing expired, nothing admitted: not written.
    assert_eq!(base(&server, &key), (1 << 48) + 7);
    // The first lease ends: the next admission renumbers.
    clock.advance(Duration::from_micros(750_000));
    let (d, _) = twins.check(&policy, 3, "after the first lease").await;
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert!(base(&server, &key) < 1 << 48);
    twins.release(&policy, held[2], "a held permit").await;
    let (d, _) = twins.check(&policy, 1, "its unit again").await;
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert_eq!(entries(&server, &key), 4);
    assert_string_state(&server, &key, lease, "renumbered");
}

/// Releasing an id the key does not hold changes nothing, byte for byte;
/// releasing an expired one drops the expired leases only; releasing the
/// last held permit deletes the key, and releasing it again, or on a key
/// that holds nothing or another algorithm's state, writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_an_unknown_or_expired_id_takes_nothing_else() {
    let (server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    let twins = Twins::new(&memory, &redis);
    let policy = named("sem", Policy::concurrency(4, Duration::from_secs(1)));
    let key = redis.state_key(b"k", &policy);
    let (_, first) = twins.check(&policy, 1, "first").await;
    clock.advance(Duration::from_millis(300));
    let (_, second) = twins.check(&policy, 2, "second").await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(server.cli(&["TYPE", &key]), "string");
    assert_eq!(entries(&server, &key), 2);

    let before = digest(&server, &key);
    let unknown = PermitId(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
    twins.release(&policy, (unknown, unknown), "unknown").await;
    assert_eq!(digest(&server, &key), before, "an unknown id");

    // The first lease has ended: its release finds nothing, and drops it.
    clock.advance(Duration::from_millis(800));
    twins.release(&policy, first, "expired").await;
    assert_eq!(entries(&server, &key), 1);
    assert_string_state(&server, &key, 1_000_000, "expired");

    twins.release(&policy, second, "held").await;
    assert_eq!(server.cli(&["TYPE", &key]), "none");
    twins.release(&policy, second, "again").await;
    assert_eq!(server.cli(&["TYPE", &key]), "none");

    // Another algorithm's state under the name: untouched.
    let window = named("sem", Policy::fixed_window(4, Duration::from_secs(60)));
    assert!(redis.check(b"k", &window, 1).await.unwrap().is_allowed());
    let before = digest(&server, &key);
    redis.release(b"k", &policy, second.1).await.unwrap();
    assert_eq!(digest(&server, &key), before, "a fixed window");
}

/// The permit `id` in the previous layout's sorted set: its member.
fn old_member(id: u128, units: u64) -> String {
    format!("{id:032x}:{units}")
}

/// Writes a semaphore in the previous layout (a sorted set: one member
/// "<permit id>:<units>" per permit, scored by its lease's expiry) at `key`,
/// with a TTL.
fn write_old_semaphore(server: &RedisServer, key: &str, permits: &[(u128, u64, u64)]) {
    let members: Vec<(String, String)> = permits
        .iter()
        .map(|&(id, units, expires)| (expires.to_string(), old_member(id, units)))
        .collect();
    write_sorted_set(server, key, &members);
}

/// A key holding a semaphore in the previous layout, written by the
/// previous version of the store, is never a silent lift: every lease still
/// running counts, by checks, peeks and `check_all` alike, with its expiry
/// (the retry of a denial), and its holder can still release it; it is
/// rewritten as a string with its TTL. Leases all ended: the key is gone. A
/// sorted set of another family (an old sliding log) stays a policy
/// conflict, and a release leaves it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_in_the_previous_layout_is_converted_never_lifted() {
    let (server, _clock, _memory, redis) = twins_at(NOW_MICROS).await;
    let second = 1_000_000u64;
    let policy = named(
        "old",
        Policy::concurrency(5, Duration::from_micros(60 * second)),
    );
    let other = named("other", Policy::fixed_window(5, Duration::from_secs(60)));
    let now = NOW_MICROS;
    // 3 units held: 2 until now + 30 s, 1 until now + 50 s; one lease ended.
    let permits = [
        (11, 2, now + 30 * second),
        (12, 1, now - 1),
        (13, 1, now + 50 * second),
    ];
    for case in ["peek", "check", "check_all", "release"] {
        let key = redis.state_key(case.as_bytes(), &policy);
        write_old_semaphore(&server, &key, &permits);
        let k = case.as_bytes();
        match case {
            "peek" => {
                let d = redis.check(k, &policy, 0).await.unwrap();
                assert!(d.is_allowed() && d.remaining() == 2, "{d:?}");
                assert_eq!(d.reset_after_micros(), 50 * second);
            }
            "check" => {
                let d = redis.check(k, &policy, 3).await.unwrap();
                assert!(!d.is_allowed(), "{d:?}");
                assert_eq!(d.retry_after_micros(), 30 * second, "{d:?}");
                let d = redis.check(k, &policy, 2).await.unwrap();
                assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
            }
            "check_all" => {
                let checks = [Check::new(b"o", &other, 1), Check::new(k, &policy, 3)];
                let d = redis.check_all(&checks).await.unwrap();
                assert!(!d[1].is_allowed(), "{d:?}");
                let checks = [Check::new(b"o", &other, 1), Check::new(k, &policy, 2)];
                let d = redis.check_all(&checks).await.unwrap();
                assert!(d[1].is_allowed() && d[1].remaining() == 0, "{d:?}");
            }
            _ => {
                // The holder of permit 11 releases it after the upgrade.
                redis.release(k, &policy, PermitId(11)).await.unwrap();
                let d = redis.check(k, &policy, 0).await.unwrap();
                assert_eq!(d.remaining(), 4, "{d:?}");
                redis.release(k, &policy, PermitId(13)).await.unwrap();
                assert_eq!(server.cli(&["TYPE", &key]), "none");
                continue;
            }
        }
        assert_eq!(server.cli(&["TYPE", &key]), "string", "{case}");
        assert_string_state(&server, &key, 60 * second, case);
    }

    // Every lease ended: nothing counts, and the key is gone.
    let key = redis.state_key(b"gone", &policy);
    write_old_semaphore(&server, &key, &[(21, 5, now - 10), (22, 1, now)]);
    let d = redis.check(b"gone", &policy, 0).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 5, "{d:?}");
    assert_eq!(server.cli(&["TYPE", &key]), "none");
    let d = redis.check(b"gone", &policy, 5).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");

    // An old sliding log under the semaphore's name: a conflict, untouched.
    let key = redis.state_key(b"log", &policy);
    let log = format!("{now}:2:0");
    server.cli(&["ZADD", &key, &now.to_string(), &log]);
    server.cli(&["PEXPIRE", &key, "3600000"]);
    for result in [
        redis.check(b"log", &policy, 1).await,
        redis.check(b"log", &policy, 0).await,
    ] {
        assert!(
            matches!(result, Err(StoreError::PolicyConflict { ref policy }) if policy == "old"),
            "{result:?}"
        );
    }
    redis.release(b"log", &policy, PermitId(11)).await.unwrap();
    assert_eq!(server.cli(&["ZRANGE", &key, "0", "-1"]), log);
}

/// A renewal extends the lease of a held permit, and of it alone: it
/// outlives the lease it was taken with, moves behind a later lease in
/// expiry order (which then ends first), and keeps its units. A permit
/// released, or expired and its units taken by another, is gone: its
/// renewal answers `false` and takes nothing (never over the max); an
/// unknown id changes nothing, byte for byte; another algorithm's state
/// under the name is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_extends_a_held_permit_and_never_brings_one_back() {
    let (server, clock, memory, redis) = twins_at(NOW_MICROS).await;
    let twins = Twins::new(&memory, &redis);
    let ms = Duration::from_millis;
    let policy = named("sem", Policy::concurrency(3, Duration::from_secs(1)));
    let key = redis.state_key(b"k", &policy);
    let (_, a) = twins.check(&policy, 1, "a").await;
    clock.advance(ms(300));
    let (_, b) = twins.check(&policy, 2, "b").await;
    let (a, b) = (a.unwrap(), b.unwrap());

    // At 900 ms, a's lease runs to 1,900 ms, after b's (1,300 ms).
    clock.advance(ms(600));
    assert!(twins.renew(&policy, a, "a, held").await);
    assert_string_state(&server, &key, 1_000_000, "a renewed");
    clock.advance(ms(300));
    let (d, _) = twins.check(&policy, 1, "past a's first lease").await;
    assert!(!d.is_allowed() && d.remaining() == 0, "{d:?}");
    // b's lease ends first: its 2 units free, a's unit still held.
    clock.advance(ms(200));
    let (d, _) = twins.check(&policy, 0, "b ended").await;
    assert_eq!(d.remaining(), 2, "{d:?}");
    assert!(!twins.renew(&policy, b, "b, expired").await);
    let (_, c) = twins.check(&policy, 2, "c takes b's units").await;
    assert!(c.is_some());
    assert!(!twins.renew(&policy, b, "b, its units taken").await);
    let (d, _) = twins.check(&policy, 1, "full").await;
    assert!(!d.is_allowed() && d.remaining() == 0, "{d:?}");

    // a released: its renewal takes nothing back.
    twins.release(&policy, a, "a").await;
    assert!(!twins.renew(&policy, a, "a, released").await);
    let (d, _) = twins.check(&policy, 0, "a stays released").await;
    assert_eq!(d.remaining(), 1, "{d:?}");
    assert_eq!(entries(&server, &key), 1);

    let before = digest(&server, &key);
    let unknown = PermitId(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
    assert!(!twins.renew(&policy, (unknown, unknown), "unknown").await);
    assert_eq!(digest(&server, &key), before, "an unknown id");

    // Every lease ended: nothing to renew, and the key is gone.
    clock.advance(ms(1_500));
    let c = c.unwrap();
    assert!(!twins.renew(&policy, c, "c, expired").await);
    assert_eq!(server.cli(&["TYPE", &key]), "none");

    // Another algorithm's state under the name: untouched.
    let window = named("sem", Policy::fixed_window(4, Duration::from_secs(60)));
    assert!(redis.check(b"k", &window, 1).await.unwrap().is_allowed());
    let before = digest(&server, &key);
    assert!(!redis.renew(b"k", &policy, c.1).await.unwrap());
    assert_eq!(digest(&server, &key), before, "a fixed window");
    // A policy that holds no permits renews none.
    assert!(!redis.renew(b"k", &window, c.1).await.unwrap());
    assert!(!memory.renew(b"k", &window, c.0).await.unwrap());
}

/// Random checks, releases and renewals of held, expired, released and
/// unknown ids, under a max and a lease that change between calls (one
/// name): both stores decide alike at every step (so Redis keeps its
/// entries in expiry order with the right counts), and the string never
/// holds more entries than the largest max.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_among_random_checks_and_releases_decide_as_memory() {
    let mut held: Vec<(PermitId, PermitId)> = Vec::new();
    let mut renewed = 0;
    random_steps(2626, async |twins, policy, rng, what| {
        match rng.below(20) {
            0..=2 if !held.is_empty() => {
                let permits = held[rng.index(held.len())];
                twins.release(policy, permits, what).await;
            }
            3..=9 if !held.is_empty() => {
                // The newest permits most often: those still held.
                let newest = held.len().saturating_sub(4);
                let permits = held[newest + rng.index(held.len() - newest)];
                if twins.renew(policy, permits, what).await {
                    renewed += 1;
                }
            }
            10 => {
                twins.renew(policy, unknown(rng), what).await;
            }
            _ => held.extend(twins.check_random(policy, rng, what).await),
        }
    })
    .await;
    assert!(renewed > 50, "only {renewed} renewals found their permit");
}

/// On the server's own clock, a renewal moves the key's TTL to the end of
/// the renewed lease: a renewed permit is not dropped with a key that
/// expired under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_keeps_the_key_alive_as_long_as_its_lease() {
    let server = RedisServer::start();
    let redis = ratelimit_tests::redis_store(server.url()).await;
    let policy = named("ttl", Policy::concurrency(1, Duration::from_secs(2)));
    let key = redis.state_key(b"k", &policy);
    let permit = take_permit(&redis, b"k", &policy).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let before: u64 = server.cli(&["PTTL", &key]).parse().unwrap();
    assert!(before <= 800, "PTTL {before} before the renewal");
    assert!(redis.renew(b"k", &policy, permit).await.unwrap());
    let after: u64 = server.cli(&["PTTL", &key]).parse().unwrap();
    assert!((1_200..=2_000).contains(&after), "PTTL {after} after it");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let d = redis.check(b"k", &policy, 1).await.unwrap();
    assert!(!d.is_allowed(), "past its first lease: {d:?}");
}
