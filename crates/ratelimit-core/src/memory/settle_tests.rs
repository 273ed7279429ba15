//! Settlements on the memory store, on a manual clock: debt and its
//! recovery under each algorithm, give-backs bounded by a full budget,
//! all or nothing across limits, and a settlement sent twice counted once.

use std::time::Duration;

use crate::clock::ManualClock;
use crate::{
    AdminStore, Decision, MemoryStore, Policy, Rate, Settle, SettlementId, Store, StoreError,
};

/// A whole second of Unix time in µs: windows start at it.
const T0: u64 = 1_763_000_000_000_000;
const SECOND: u64 = 1_000_000;

fn store() -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(T0);
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn named(policy: Result<Policy, crate::PolicyError>, name: &str) -> Policy {
    policy.expect("valid").with_name(name).expect("valid name")
}

/// A policy of each algorithm that settles, named after it: `limit` per
/// `window` for the windows, `limit` refilled at `rate` for the buckets.
fn every_settling(limit: u64, window: Duration, rate: Rate) -> [Policy; 6] {
    [
        named(Policy::fixed_window(limit, window), "fixed"),
        named(Policy::sliding_window_log(limit, window), "log"),
        named(Policy::sliding_window_counter(limit, window), "counter"),
        named(Policy::token_bucket(limit, rate), "tb"),
        named(Policy::gcra(limit, rate), "gcra"),
        named(Policy::leaky_bucket(limit, rate), "leaky"),
    ]
}

/// Reserves `estimate` of `key` under `policy` (allowed), then settles it
/// to `actual` under a fresh id; returns the settlement's decision.
fn reserve_and_settle(
    store: &MemoryStore<ManualClock>,
    key: &[u8],
    policy: &Policy,
    estimate: u64,
    actual: u64,
) -> Decision {
    let reservation = store.check_now(key, policy, estimate).expect("decided");
    assert!(
        reservation.is_allowed(),
        "{}: {reservation:?}",
        policy.name()
    );
    let settles = [Settle::new(key, policy, estimate, actual, &reservation)];
    let mut decisions = store
        .settle_now(SettlementId::random(), &settles)
        .expect("settled");
    decisions.pop().expect("one decision")
}

/// The error that settling `settles` under a fresh id ends in.
fn refused(store: &MemoryStore<ManualClock>, settles: &[Settle<'_>]) -> StoreError {
    store
        .settle_now(SettlementId::random(), settles)
        .expect_err("refused")
}

/// Asserts that a request of 1 on `key` under `policy` is denied until
/// `wait` has passed (1 µs before it) and allowed once it has; returns the
/// decision that allowed it.
fn denied_for(
    store: &MemoryStore<ManualClock>,
    clock: &ManualClock,
    policy: &Policy,
    wait: Duration,
) -> Decision {
    clock.advance(wait - us(1));
    let early = store.check_now(b"k", policy, 1).expect("decided");
    assert!(!early.is_allowed(), "{}: {early:?}", policy.name());
    clock.advance(us(1));
    let paid = store.check_now(b"k", policy, 1).expect("decided");
    assert!(paid.is_allowed(), "{}: {paid:?}", policy.name());
    paid
}

/// Token bucket of 1,000 per minute (one token every 60 ms): a request that
/// reserved 1 and cost 1,200 leaves the bucket 200 tokens in debt; the next
/// request waits until the refill paid the debt and earned its token.
#[test]
fn a_token_bucket_in_debt_denies_until_the_refill_pays_it() {
    let (store, clock) = store();
    let policy = named(Policy::token_bucket(1_000, Rate::per_minute(1_000)), "tb");
    let settled = reserve_and_settle(&store, b"k", &policy, 1, 1_200);
    // A debt denies even a peek, until it is paid (200 tokens of 60 ms).
    assert!(!settled.is_allowed());
    assert_eq!(settled.remaining(), 0);
    assert_eq!(settled.retry_after(), Some(Duration::from_secs(12)));
    assert_eq!(settled.reset_after(), Duration::from_secs(72));
    let next = store.check_now(b"k", &policy, 1).expect("decided");
    assert_eq!(next.retry_after(), Some(Duration::from_millis(12_060)));
    let paid = denied_for(&store, &clock, &policy, Duration::from_millis(12_060));
    assert_eq!(paid.remaining(), 0);
}

/// GCRA and the leaky bucket: the next free slot moves later by the
/// difference, so the next request waits exactly as long as the bucket's.
#[test]
fn a_gcra_or_leaky_bucket_in_debt_waits_for_its_next_free_slot() {
    let [.., gcra, leaky] = every_settling(1_000, Duration::from_secs(60), Rate::per_minute(1_000));
    for policy in [gcra, leaky] {
        let (store, clock) = store();
        let settled = reserve_and_settle(&store, b"k", &policy, 1, 1_200);
        assert!(!settled.is_allowed(), "{}", policy.name());
        let next = store.check_now(b"k", &policy, 1).expect("decided");
        assert_eq!(
            next.retry_after(),
            Some(Duration::from_millis(12_060)),
            "{}",
            policy.name()
        );
        denied_for(&store, &clock, &policy, Duration::from_millis(12_060));
    }
}

/// Windows count over their limit: denied until the units leave the window
/// (the fixed window's end, one window after the log's entries), then a
/// full budget again; the sliding counter weighs the excess into the next
/// window as its previous count.
#[test]
fn windows_count_over_the_limit_until_the_window_ends() {
    let [fixed, log, counter, ..] = every_settling(10, Duration::from_secs(1), Rate::per_hour(10));
    for policy in [fixed, log] {
        let (store, clock) = store();
        clock.advance(us(SECOND / 4));
        let settled = reserve_and_settle(&store, b"k", &policy, 1, 15);
        assert!(!settled.is_allowed(), "{}", policy.name());
        let next = store.check_now(b"k", &policy, 1).expect("decided");
        let until = match policy.algorithm().kind() {
            "fixed-window" => 3 * SECOND / 4,
            _ => SECOND,
        };
        assert_eq!(next.retry_after_micros(), until, "{}", policy.name());
        let after = denied_for(&store, &clock, &policy, us(until));
        assert_eq!(after.remaining(), 9, "{}", policy.name());
    }

    let (store, clock) = store();
    let settled = reserve_and_settle(&store, b"k", &counter, 1, 15);
    assert!(!settled.is_allowed());
    // Next window: 15 weighted by what is left of the previous one; 10 fit
    // once less than 10/15 of it remains.
    clock.advance(us(SECOND));
    assert!(
        !store
            .check_now(b"k", &counter, 1)
            .expect("decided")
            .is_allowed()
    );
    clock.advance(us(SECOND / 2));
    assert!(
        store
            .check_now(b"k", &counter, 1)
            .expect("decided")
            .is_allowed()
    );
}

/// A cost below the estimate gives the difference back, a cost equal to it
/// changes nothing, and nothing is ever given back beyond a full budget.
#[test]
fn a_lower_cost_gives_back_never_beyond_a_full_budget() {
    for policy in every_settling(10, Duration::from_secs(60), Rate::per_hour(10)) {
        let name = policy.name().to_owned();
        let (store, _clock) = store();
        let lower = reserve_and_settle(&store, b"a", &policy, 8, 3);
        assert_eq!(lower.remaining(), 7, "{name}");
        let same = reserve_and_settle(&store, b"b", &policy, 4, 4);
        assert_eq!(same.remaining(), 6, "{name}");
        assert_eq!(
            store
                .peek(b"b", &policy)
                .into_inner()
                .expect("peek")
                .remaining(),
            6
        );
        // A reservation that claims more than the key ever consumed gives
        // back at most what it holds: a full budget, no more.
        let reservation = store.check_now(b"c", &policy, 2).expect("decided");
        let lie = [Settle::new(b"c", &policy, 1_000, 0, &reservation)];
        let full = store
            .settle_now(SettlementId::random(), &lie)
            .expect("settled");
        assert_eq!(full[0].remaining(), 10, "{name}");
        let eleven: u64 = (0..11)
            .map(|_| u64::from(store.check_now(b"c", &policy, 1).expect("d").is_allowed()))
            .sum();
        assert_eq!(eleven, 10, "{name}");
    }
}

/// Several limits settle together: every one changes, or, when one cannot
/// be settled (another algorithm under the same name, a concurrency
/// policy), none does.
#[test]
fn several_limits_settle_all_or_nothing() {
    let (store, _clock) = store();
    let per_user = named(Policy::token_bucket(100, Rate::per_hour(100)), "per-user");
    let global = named(
        Policy::fixed_window(1_000, Duration::from_secs(60)),
        "global",
    );
    let checks = [
        crate::Check::new(b"alice", &per_user, 10),
        crate::Check::new(b"all", &global, 10),
    ];
    let reserved = store.check_all_now(&checks).expect("decided");
    let settles = [
        Settle::new(b"alice", &per_user, 10, 30, &reserved[0]),
        Settle::new(b"all", &global, 10, 30, &reserved[1]),
    ];
    let settled = store
        .settle_now(SettlementId::random(), &settles)
        .expect("settled");
    assert_eq!(settled[0].remaining(), 70);
    assert_eq!(settled[1].remaining(), 970);

    // `global` was a fixed window: a token bucket under its name conflicts.
    let renamed = named(Policy::token_bucket(1_000, Rate::per_hour(1)), "global");
    let allowed = Decision::allow(100, 0, 0);
    let conflicting = [
        Settle::new(b"alice", &per_user, 0, 50, &allowed),
        Settle::new(b"all", &renamed, 0, 50, &allowed),
    ];
    assert!(matches!(
        refused(&store, &conflicting),
        StoreError::PolicyConflict { .. }
    ));
    let semaphore = named(Policy::concurrency(5, Duration::from_secs(1)), "sem");
    let with_semaphore = [
        Settle::new(b"alice", &per_user, 0, 50, &allowed),
        Settle::new(b"alice", &semaphore, 0, 50, &allowed),
    ];
    assert!(matches!(
        refused(&store, &with_semaphore),
        StoreError::Unsupported {
            operation: "settle",
            ..
        }
    ));
    assert_eq!(
        store
            .peek(b"alice", &per_user)
            .into_inner()
            .expect("peek")
            .remaining(),
        70
    );
    assert_eq!(
        store
            .peek(b"all", &global)
            .into_inner()
            .expect("peek")
            .remaining(),
        970
    );
}

/// The same settlement sent twice (the same id) is applied once; another
/// settlement of the same key is applied again.
#[test]
fn a_settlement_sent_twice_is_applied_once() {
    let (store, _clock) = store();
    let policy = named(Policy::fixed_window(100, Duration::from_secs(60)), "fw");
    let reservation = store.check_now(b"k", &policy, 10).expect("decided");
    let settles = [Settle::new(b"k", &policy, 10, 30, &reservation)];
    let id = SettlementId::random();
    let first = store.settle_now(id, &settles).expect("settled");
    let again = store.settle_now(id, &settles).expect("settled");
    assert_eq!(first[0].remaining(), 70);
    assert_eq!(again, first);
    let other = store
        .settle_now(SettlementId::random(), &settles)
        .expect("settled");
    assert_eq!(other[0].remaining(), 50);
}

/// A settlement applies to a blocked key (its debt stays once the block is
/// lifted) and reports the block; a new key in a full store is refused
/// before anything is settled.
#[test]
fn blocks_and_a_full_store() {
    let (store, _clock) = store();
    let policy = named(Policy::gcra(10, Rate::per_hour(10)), "gcra");
    let reservation = store.check_now(b"k", &policy, 1).expect("decided");
    store
        .block(b"k", &policy, Duration::from_secs(1))
        .into_inner()
        .expect("blocked");
    let settles = [Settle::new(b"k", &policy, 1, 4, &reservation)];
    let settled = store
        .settle_now(SettlementId::random(), &settles)
        .expect("settled");
    assert!(!settled[0].is_allowed());
    assert_eq!(settled[0].retry_after_micros(), SECOND);
    store.unblock(b"k", &policy).into_inner().expect("unblock");
    assert_eq!(
        store
            .peek(b"k", &policy)
            .into_inner()
            .expect("peek")
            .remaining(),
        6
    );

    let clock = ManualClock::new(T0);
    let full = MemoryStore::builder()
        .max_keys(1)
        .shards(1)
        .clock(clock)
        .build();
    let held = full.check_now(b"held", &policy, 1).expect("decided");
    let allowed = Decision::allow(10, 10, 0);
    let settles = [
        Settle::new(b"held", &policy, 1, 3, &held),
        Settle::new(b"new", &policy, 0, 3, &allowed),
    ];
    assert!(matches!(refused(&full, &settles), StoreError::Full { .. }));
    assert_eq!(
        full.peek(b"held", &policy)
            .into_inner()
            .expect("peek")
            .remaining(),
        9
    );
}

/// Through the trait: the same answers, and an empty settlement is none.
#[tokio::test]
async fn the_store_trait_settles_as_settle_now_does() {
    let (store, _clock) = store();
    let policy = named(Policy::token_bucket(10, Rate::per_hour(10)), "tb");
    assert!(
        store
            .settle(SettlementId::random(), &[])
            .await
            .expect("nothing to settle")
            .is_empty()
    );
    let reservation = store.check(b"k", &policy, 2).await.expect("decided");
    let settles = [
        Settle::new(b"k", &policy, 2, 5, &reservation),
        // The same key twice: one settlement of the sums, both answered.
        Settle::new(b"k", &policy, 0, 1, &reservation),
    ];
    let settled = store
        .settle(SettlementId::random(), &settles)
        .await
        .expect("settled");
    assert_eq!(settled.len(), 2);
    assert_eq!(settled[0], settled[1]);
    assert_eq!(settled[0].remaining(), 4);
    assert_eq!(
        store.peek(b"k", &policy).await.expect("peek").remaining(),
        4
    );
}

/// How many requests of 1 `store` admits on `key` at the clock's time,
/// until the first denial (at most `cap`).
fn fill(store: &MemoryStore<ManualClock>, key: &[u8], policy: &Policy, cap: u64) -> u64 {
    let mut n = 0;
    while n < cap
        && store
            .check_now(key, policy, 1)
            .expect("decided")
            .is_allowed()
    {
        n += 1;
    }
    n
}

/// A sliding window counter's reservation made late in one window and
/// refunded early in the next gives nothing back: its units are in the
/// previous window's count, and a refund taken from the current one (the
/// units of the requests admitted since) would leave that count short when
/// it becomes the previous one at full weight, so the key would admit more
/// than a key that never reserved.
///
/// Limit 10 a second. `A` reserves 5 at 0.9 s; both `A` and `B` (which never
/// reserved) admit 5 more requests at 1.000001 s; `A` settles its
/// reservation to 0 (held 0.100002 s). At 2 s `A` admits as many as `B`,
/// 5, not 9 (14 requests in one window of limit 10).
#[test]
fn a_counter_refund_never_frees_later_requests_units_in_the_next_window() {
    let policy = named(
        Policy::sliding_window_counter(10, Duration::from_secs(1)),
        "counter",
    );
    let times = [900_000, SECOND + 1, SECOND + 2, 2 * SECOND];
    let (with_refund, never_reserved) = after_a_refund(&policy, times, 5);
    assert!(
        with_refund <= never_reserved,
        "the refunded key admits {with_refund} at 2 s, one that never reserved {never_reserved}: \
         {} requests in one window of limit 10",
        5 + with_refund
    );
}

/// Two stores on clocks set together: `A` reserves 5 at `reserved`, both
/// admit `checks` requests of 1 at `checked`, `A` settles its reservation
/// to 0 at `settled` (held since `reserved`), and both admit what they can
/// at `filled` (µs after `T0`): how many `A` then admits, and `B`.
fn after_a_refund(
    policy: &Policy,
    [reserved, checked, settled, filled]: [u64; 4],
    checks: usize,
) -> (u64, u64) {
    let (a, a_clock) = store();
    let (b, b_clock) = store();
    let at = |t: u64| {
        a_clock.set(T0 + t);
        b_clock.set(T0 + t);
    };
    at(reserved);
    let reservation = a.check_now(b"k", policy, 5).expect("decided");
    assert!(reservation.is_allowed());
    at(checked);
    for _ in 0..checks {
        assert!(a.check_now(b"k", policy, 1).expect("decided").is_allowed());
        assert!(b.check_now(b"k", policy, 1).expect("decided").is_allowed());
    }
    at(settled);
    let held = us(settled - reserved);
    let settles = [Settle::new(b"k", policy, 5, 0, &reservation).held_for(held)];
    a.settle_now(SettlementId::random(), &settles)
        .expect("settled");
    at(filled);
    (fill(&a, b"k", policy, 100), fill(&b, b"k", policy, 100))
}
