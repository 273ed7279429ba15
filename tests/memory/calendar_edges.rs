//! Calendar periods and admin operations on `MemoryStore` at their edges:
//! clocks at the ends of `u64`, offsets at their bounds, hostile offsets
//! and limits refused, blocks and rewards with hostile amounts: never a
//! panic, never more than the limit, a block never lifted early.

use std::time::Duration;

use ratelimit_core::clock::ManualClock;
use ratelimit_core::{AdminStore, MemoryStore, Period, Policy, Store};

const DAY: u64 = 86_400_000_000;

fn store_at(now: u64) -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new(now);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (clock, store)
}

/// Every period at the extreme offsets, on clocks at 0, around the year
/// 9999 and 10000 and near the end of `u64`: never a panic, never more than
/// the limit, and admin operations with hostile amounts and durations
/// neither panic nor admit more.
#[tokio::test]
async fn calendar_periods_at_the_ends_of_time_never_panic_nor_over_admit() {
    // 9999-12-31 00:00 UTC: 2,932,896 days after 1970-01-01.
    let y9999_dec_31 = 2_932_896 * DAY;
    let times = [
        0,
        1,
        y9999_dec_31 + DAY - 1,
        y9999_dec_31 + DAY,
        (1 << 53) - 1,
        u64::MAX / 4 - 1,
        u64::MAX / 4,
        u64::MAX / 2,
        u64::MAX - DAY,
        u64::MAX - 1,
        u64::MAX,
    ];
    for period in Period::ALL {
        for offset in [-86_399, -1, 0, 1, 86_399] {
            let policy = Policy::calendar(3, period.utc_offset(offset)).expect("valid");
            for &now in &times {
                let (_clock, store) = store_at(now);
                let key = b"k";
                let mut admitted = 0;
                for _ in 0..5 {
                    let d = store.check(key, &policy, 1).await.expect("memory");
                    admitted += u64::from(d.is_allowed());
                }
                assert!(
                    admitted <= 3,
                    "{} at {now}: admitted {admitted}",
                    policy.name()
                );
                let _ = store
                    .penalize(key, &policy, u64::MAX)
                    .await
                    .expect("penalize");
                let d = store.reward(key, &policy, u64::MAX).await.expect("reward");
                assert!(d.remaining() <= 3, "{} at {now}: {d:?}", policy.name());
                store
                    .block(key, &policy, Duration::MAX)
                    .await
                    .expect("block");
                let d = store.check(key, &policy, 1).await.expect("check");
                assert!(
                    !d.is_allowed(),
                    "{} at {now}: blocked yet {d:?}",
                    policy.name()
                );
                store.unblock(key, &policy).await.expect("unblock");
                let d = store.check(key, &policy, 0).await.expect("peek");
                assert!(d.remaining() <= 3);
            }
        }
    }
}

/// A period edge with a positive and a negative offset: the budget spent
/// just before local midnight is denied up to its last microsecond, and a
/// fresh budget comes exactly at the local edge (not earlier).
#[tokio::test]
async fn offsets_move_the_edge_exactly_and_never_early() {
    // 2024-03-01 00:00 UTC.
    let mar_1 = 19_783 * DAY;
    for offset in [-86_399i32, -19_800, -1, 1, 20_700, 86_399] {
        let policy = Policy::calendar(2, Period::Month.utc_offset(offset)).expect("valid");
        let edge = mar_1
            .checked_add_signed(-i64::from(offset) * 1_000_000)
            .unwrap();
        let (clock, store) = store_at(edge - DAY);
        assert!(store.check(b"k", &policy, 2).await.unwrap().is_allowed());
        clock.set(edge - 1);
        let d = store.check(b"k", &policy, 1).await.unwrap();
        assert!(!d.is_allowed(), "{offset}: {d:?}");
        assert_eq!(d.retry_after_micros(), 1, "{offset}");
        clock.set(edge);
        let d = store.check(b"k", &policy, 2).await.unwrap();
        assert!(d.is_allowed(), "{offset}: {d:?}");
        assert_eq!(d.reset_after_micros(), 31 * DAY, "{offset}: March");
    }
}

/// Hostile parameters are refused when the policy is built.
#[test]
fn hostile_calendar_parameters_are_refused() {
    for offset in [86_400, -86_400, i32::MAX, i32::MIN, i32::MIN + 1] {
        for period in Period::ALL {
            assert!(
                Policy::calendar(1, period.utc_offset(offset)).is_err(),
                "{offset}"
            );
        }
    }
    assert!(Policy::calendar(0, Period::Day).is_err());
    assert!(Policy::calendar(u64::MAX, Period::Day).is_err());
    assert!(Policy::calendar(u64::MAX / 2, Period::Year).is_err());
}

/// A block denies every check, whatever the cost (0 included), and consumes
/// nothing; blocking again with a shorter duration shortens it; a block
/// lifted by `reset` leaves a full budget.
#[tokio::test]
async fn a_block_is_never_lifted_early_nor_consumes() {
    let jan_31 = 19_753 * DAY;
    let (clock, store) = store_at(jan_31);
    let policy = Policy::calendar(4, Period::Day).expect("valid");
    assert!(store.check(b"k", &policy, 1).await.unwrap().is_allowed());
    // 25 hours: until Feb 1 01:00, across the day's edge.
    store
        .block(b"k", &policy, Duration::from_secs(90_000))
        .await
        .unwrap();
    for step in 0..8u64 {
        let now = jan_31 + DAY - 3_600_000_000 + step * 600_000_000;
        clock.set(now);
        for cost in [0, 1, 4] {
            let d = store.check(b"k", &policy, cost).await.unwrap();
            assert!(!d.is_allowed(), "step {step} cost {cost}: {d:?}");
        }
    }
    // A shorter block replaces it, but never reaches back past now.
    store
        .block(b"k", &policy, Duration::from_secs(60))
        .await
        .unwrap();
    let d = store.check(b"k", &policy, 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    // After the block, Feb 1's budget is whole: the checks made while
    // blocked consumed nothing.
    clock.set(jan_31 + DAY + 3_600_000_000);
    let d = store.check(b"k", &policy, 0).await.unwrap();
    assert_eq!(d.remaining(), 4, "{d:?}");
}
